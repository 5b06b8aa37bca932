//! Static NAT rules: as the tables file writes them, compiled, and matched against the
//! first packet of a connection.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::Nat;
use crate::flow::{Addr, FlowKey, proto};
use crate::packet::PortId;

/// What a NAT rule matches; every field optional, all given fields must match.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// The port the packet arrived on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_port: Option<String>,
    /// `tcp`, `udp`, `icmp`, `icmpv6`, or a protocol number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// Source prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src: Option<IpNet>,
    /// Destination prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst: Option<IpNet>,
    /// Source port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_port: Option<u16>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_port: Option<u16>,
}

/// A static NAT rule as the tables file describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NatRuleSpec {
    /// What the first packet of a connection must look like.
    #[serde(rename = "match", default)]
    pub matches: MatchSpec,
    /// Destination NAT: `ADDR`, `ADDR:PORT` or `[V6ADDR]:PORT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dnat: Option<String>,
    /// Source NAT: `ADDR`, `ADDR:LO-HI` or `[V6ADDR]:LO-HI`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snat: Option<String>,
    /// Source NAT to the egress port's address of the packet's family.
    #[serde(default)]
    pub masquerade: bool,
}

/// Source NAT of a compiled rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Snat {
    /// No source NAT.
    None,
    /// To this address, with a source port from the range when given.
    To(IpAddr, Option<(u16, u16)>),
    /// To the egress port's address.
    Masquerade,
}

/// A compiled NAT rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatRule {
    /// Ingress port to match.
    pub in_port: Option<PortId>,
    /// Protocol to match.
    pub proto: Option<u8>,
    /// Source prefix to match.
    pub src: Option<IpNet>,
    /// Destination prefix to match.
    pub dst: Option<IpNet>,
    /// Source port to match.
    pub src_port: Option<u16>,
    /// Destination port to match.
    pub dst_port: Option<u16>,
    /// Destination NAT: address and optional port.
    pub dnat: Option<(IpAddr, Option<u16>)>,
    /// Source NAT.
    pub snat: Snat,
}

impl NatRule {
    /// True when a packet with `key` received on `in_port` matches.
    pub fn matches(&self, in_port: PortId, key: &FlowKey) -> bool {
        self.in_port.is_none_or(|p| p == in_port)
            && self.proto.is_none_or(|p| p == key.proto)
            && self.src.is_none_or(|n| n.contains(&key.src.ip()))
            && self.dst.is_none_or(|n| n.contains(&key.dst.ip()))
            && self.src_port.is_none_or(|p| p == key.src_port)
            && self.dst_port.is_none_or(|p| p == key.dst_port)
    }
}

impl NatRuleSpec {
    /// Checks the rule and compiles it; `port_id` finds a port by name. The error names
    /// the field and the problem.
    pub fn compile(&self, port_id: impl Fn(&str) -> Option<PortId>) -> Result<NatRule, String> {
        let r = self;
        let m = &r.matches;
        let in_port = match &m.in_port {
            None => None,
            Some(n) => {
                Some(port_id(n).ok_or_else(|| format!("match.in_port: no port named {n:?}"))?)
            }
        };
        let proto = m
            .proto
            .as_deref()
            .map(parse_proto)
            .transpose()
            .map_err(|e| format!("match.{e}"))?;
        if (m.src_port.is_some() || m.dst_port.is_some())
            && !matches!(proto, Some(proto::TCP | proto::UDP))
        {
            return Err("match: ports need proto tcp or udp".into());
        }
        let dnat = match &r.dnat {
            None => None,
            Some(s) => {
                let (a, p) = split_addr(s).map_err(|e| format!("dnat {e}"))?;
                let port = p
                    .map(|p| parse_port(p, s))
                    .transpose()
                    .map_err(|e| format!("dnat {e}"))?;
                if port.is_some() && !matches!(proto, Some(proto::TCP | proto::UDP)) {
                    return Err(format!("dnat {s:?}: a port needs match.proto tcp or udp"));
                }
                Some((a, port))
            }
        };
        let snat = match (&r.snat, r.masquerade) {
            (Some(_), true) => return Err("snat and masquerade exclude each other".into()),
            (None, true) => Snat::Masquerade,
            (None, false) => Snat::None,
            (Some(s), false) => {
                let (a, range) = split_addr(s).map_err(|e| format!("snat {e}"))?;
                let range = match range {
                    None => None,
                    Some(t) => {
                        let (lo, hi) = t.split_once('-').unwrap_or((t, t));
                        let (lo, hi) = (parse_port(lo, s), parse_port(hi, s));
                        let (lo, hi) = (
                            lo.map_err(|e| format!("snat {e}"))?,
                            hi.map_err(|e| format!("snat {e}"))?,
                        );
                        if lo > hi {
                            return Err(format!("snat {s:?}: empty port range"));
                        }
                        Some((lo, hi))
                    }
                };
                Snat::To(a, range)
            }
        };
        if dnat.is_none() && snat == Snat::None {
            return Err("a rule needs dnat, snat or masquerade".into());
        }
        // Every address of a rule must be of one family.
        let mut families = [
            m.src.map(|n| n.addr()),
            m.dst.map(|n| n.addr()),
            dnat.map(|d| d.0),
        ]
        .into_iter()
        .flatten()
        .chain(match snat {
            Snat::To(a, _) => Some(a),
            _ => None,
        })
        .map(|a| a.is_ipv4());
        if let Some(first) = families.next()
            && families.any(|f| f != first)
        {
            return Err("addresses of one rule must all be IPv4 or all IPv6".into());
        }
        Ok(NatRule {
            in_port,
            proto,
            src: m.src.map(|n| n.trunc()),
            dst: m.dst.map(|n| n.trunc()),
            src_port: m.src_port,
            dst_port: m.dst_port,
            dnat,
            snat,
        })
    }
}

/// The NAT of the first rule in `rules` matching a packet with `key`, received on
/// `in_port`, that starts a connection. Masquerade takes `egress_addr(dst)`, the address
/// the egress port towards the destination (after DNAT) has for its family: `None` when
/// no route leads there (the rule then gives no NAT at all), `Some(None)` when that port
/// has no address of the family (no source NAT).
pub fn first_match(
    rules: &[NatRule],
    in_port: PortId,
    key: &FlowKey,
    egress_addr: impl FnOnce(Addr) -> Option<Option<IpAddr>>,
) -> Option<Nat> {
    let rule = rules.iter().find(|r| r.matches(in_port, key))?;
    let snat = match rule.snat {
        Snat::None => None,
        Snat::To(addr, range) => Some((addr.into(), range)),
        Snat::Masquerade => {
            let dst = rule.dnat.map_or(key.dst, |d| d.0.into());
            egress_addr(dst)?.map(|a| (a.into(), None))
        }
    };
    Some(Nat {
        dnat: rule.dnat.map(|(a, p)| (a.into(), p)),
        snat,
    })
}

fn parse_proto(s: &str) -> Result<u8, String> {
    match s {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        "icmp" => Ok(proto::ICMP),
        "icmpv6" => Ok(proto::ICMPV6),
        n => n
            .parse()
            .map_err(|_| format!("proto {s:?}: expected tcp, udp, icmp, icmpv6 or a number")),
    }
}

/// Splits `ADDR`, `ADDR:REST` or `[V6]:REST` into the address and what follows the colon.
fn split_addr(s: &str) -> Result<(IpAddr, Option<&str>), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (a, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("{s:?}: missing ']'"))?;
        let a: IpAddr = a.parse().map_err(|_| format!("{s:?}: bad IPv6 address"))?;
        return match tail {
            "" => Ok((a, None)),
            t => Ok((
                a,
                Some(
                    t.strip_prefix(':')
                        .ok_or_else(|| format!("{s:?}: expected ':' after ']'"))?,
                ),
            )),
        };
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok((a, None));
    }
    let (a, p) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: not an address"))?;
    let a: IpAddr = a
        .parse()
        .map_err(|_| format!("{s:?}: bad address (IPv6 with a port is written [ADDR]:PORT)"))?;
    Ok((a, Some(p)))
}

fn parse_port(s: &str, whole: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("{whole:?}: bad port {s:?} (1-65535)")),
    }
}
