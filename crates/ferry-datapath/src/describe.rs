//! Packets described in one line, as a user types them for `ferry trace`, and the frames
//! they stand for.
//!
//! ```text
//! tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn
//! tcp 10.0.1.5:40000 -> 10.96.0.10:80 psh+ack seq 1001 ack 7001 len 100
//! udp [fd00:10::5]:5353 -> [fd00:96::a]:53
//! icmp 10.0.1.5 -> 10.0.2.7 id 7
//! icmpv6 fd00::1 -> fd00::2 reply
//! ```
//!
//! The protocol, the source, `->` and the destination come first (`ADDR:PORT` or
//! `[V6ADDR]:PORT` for TCP and UDP, a bare address for ICMP), then, in any order:
//!
//! - TCP flags: `syn`, `ack`, `fin`, `rst`, `psh`, one word each or joined with `+` or
//!   `,` (`syn+ack`). Default `syn`, or `ack` when an acknowledgement number is given.
//! - `seq N`: the TCP sequence number (default 1000) or the ICMP echo sequence (default 1).
//! - `ack N`: the TCP acknowledgement number (default 0). `ack` not followed by a number
//!   is the flag.
//! - `id N`: the ICMP echo identifier (default 1); `reply`: an echo reply instead of a
//!   request.
//! - `len N`: payload bytes after the transport header: default 0 for TCP, 8 for UDP, 56
//!   for ICMP (as `ping` sends).
//! - `ttl N`: TTL or hop limit (default 64); `df`: the IPv4 don't-fragment bit.

use std::fmt;
use std::net::IpAddr;

use crate::packet::PortId;
use crate::tables::{PortKind, Tables};
use crate::wire::build::{self, IpOpts, tcp_flags};

/// Source MAC of described frames arriving on uplink, host and plain ports: locally
/// administered, and no port's (the pipeline does not check sources there).
pub const PEER_MAC: [u8; 6] = build::MAC_SRC;
/// Default TTL / hop limit.
pub const DEFAULT_TTL: u8 = 64;
/// Default TCP sequence number.
pub const DEFAULT_SEQ: u32 = 1000;
/// Default payload bytes of a UDP datagram.
pub const DEFAULT_UDP_LEN: usize = 8;
/// Default payload bytes of an ICMP echo.
pub const DEFAULT_ICMP_LEN: usize = 56;

/// The transport part of a described packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP with these flags ([`tcp_flags`]) and numbers.
    Tcp {
        /// Flag bits.
        flags: u8,
        /// Sequence number.
        seq: u32,
        /// Acknowledgement number.
        ack: u32,
    },
    /// UDP.
    Udp,
    /// ICMP (IPv4) or ICMPv6 (IPv6) echo.
    Echo {
        /// Identifier.
        id: u16,
        /// Sequence number.
        seq: u16,
        /// An echo reply rather than a request.
        reply: bool,
    },
}

/// A packet described in one line (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Described {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (same family).
    pub dst: IpAddr,
    /// Source port (0 for ICMP).
    pub src_port: u16,
    /// Destination port (0 for ICMP).
    pub dst_port: u16,
    /// Transport and its fields.
    pub transport: Transport,
    /// Payload bytes after the transport header.
    pub len: usize,
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv4 don't-fragment bit.
    pub dont_fragment: bool,
}

/// TCP flag words, in the order they are written.
const FLAGS: [(&str, u8); 5] = [
    ("syn", tcp_flags::SYN),
    ("fin", tcp_flags::FIN),
    ("rst", tcp_flags::RST),
    ("psh", tcp_flags::PSH),
    ("ack", tcp_flags::ACK),
];

fn number<T: std::str::FromStr>(word: &str, tok: Option<&str>, range: &str) -> Result<T, String> {
    let t = tok.ok_or_else(|| format!("{word}: missing number ({range})"))?;
    t.parse()
        .map_err(|_| format!("{word}: {t:?} is not a number ({range})"))
}

/// `ADDR:PORT` or `[V6ADDR]:PORT`.
fn endpoint(tok: &str) -> Result<(IpAddr, u16), String> {
    let (a, p) = if let Some(rest) = tok.strip_prefix('[') {
        rest.split_once("]:")
            .ok_or_else(|| format!("{tok:?}: expected [IPV6]:PORT"))?
    } else {
        if tok.parse::<IpAddr>().is_ok() {
            return Err(format!(
                "{tok:?}: a port is needed (ADDR:PORT, or [ADDR]:PORT for IPv6)"
            ));
        }
        tok.rsplit_once(':')
            .ok_or_else(|| format!("{tok:?}: expected ADDR:PORT"))?
    };
    let addr = a.parse().map_err(|_| {
        format!("{tok:?}: bad address {a:?} (an IPv6 address with a port is written [ADDR]:PORT)")
    })?;
    let port = match p.parse::<u16>() {
        Ok(n) if n != 0 => n,
        _ => return Err(format!("{tok:?}: bad port {p:?} (1-65535)")),
    };
    Ok((addr, port))
}

/// A bare address, or an IPv6 one in brackets.
fn host(tok: &str) -> Result<IpAddr, String> {
    let a = tok
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(tok);
    a.parse()
        .map_err(|_| format!("{tok:?}: not an IP address (ICMP has no ports)"))
}

/// The flag bits of a flags word (`syn+ack`), or None when it is not one.
fn flags_word(tok: &str) -> Option<u8> {
    let mut bits = 0;
    for w in tok.split(['+', ',']) {
        bits |= FLAGS.iter().find(|(n, _)| *n == w)?.1;
    }
    Some(bits)
}

impl Described {
    /// Parses a one-line description; the error names the word it could not take.
    pub fn parse(s: &str) -> Result<Described, String> {
        let spaced = s.replace("->", " -> ");
        let mut toks = spaced.split_whitespace().peekable();
        let proto = toks
            .next()
            .ok_or("empty description: expected tcp, udp, icmp or icmpv6")?;
        let (ported, icmp_v6) = match proto {
            "tcp" | "udp" => (true, None),
            "icmp" => (false, Some(false)),
            "icmpv6" => (false, Some(true)),
            p => return Err(format!("{p:?}: expected tcp, udp, icmp or icmpv6")),
        };
        let src = toks
            .next()
            .ok_or_else(|| format!("{proto}: missing source"))?;
        // `to` reads the same as `->` and needs no quoting in a shell.
        match toks.next() {
            Some("->" | "to") => {}
            Some(t) => {
                return Err(format!(
                    "expected \"->\" or \"to\" after {src:?}, got {t:?}"
                ));
            }
            None => {
                return Err(format!(
                    "expected \"->\" (or \"to\") and a destination after {src:?} (in a shell, quote the packet: an unquoted > redirects the output)"
                ));
            }
        }
        let dst = toks
            .next()
            .ok_or_else(|| format!("missing destination after \"{src} ->\""))?;
        let ((src_addr, sport), (dst_addr, dport)) = if ported {
            (endpoint(src)?, endpoint(dst)?)
        } else {
            ((host(src)?, 0), (host(dst)?, 0))
        };
        if src_addr.is_ipv6() != dst_addr.is_ipv6() {
            return Err(format!(
                "{src:?} and {dst:?} are of different address families"
            ));
        }
        if let Some(v6) = icmp_v6
            && v6 != src_addr.is_ipv6()
        {
            let other = if v6 { "icmp" } else { "icmpv6" };
            return Err(format!(
                "{proto}: {src:?} is of the other family (use {other})"
            ));
        }
        let mut d = Described {
            src: src_addr,
            dst: dst_addr,
            src_port: sport,
            dst_port: dport,
            transport: match proto {
                "tcp" => Transport::Tcp {
                    flags: 0,
                    seq: DEFAULT_SEQ,
                    ack: 0,
                },
                "udp" => Transport::Udp,
                _ => Transport::Echo {
                    id: 1,
                    seq: 1,
                    reply: false,
                },
            },
            len: match proto {
                "tcp" => 0,
                "udp" => DEFAULT_UDP_LEN,
                _ => DEFAULT_ICMP_LEN,
            },
            ttl: DEFAULT_TTL,
            dont_fragment: false,
        };
        let mut ack_given = false;
        while let Some(tok) = toks.next() {
            let tcp = matches!(d.transport, Transport::Tcp { .. });
            let only = |what: &str| format!("{tok:?}: only for {what} ({proto} packet)");
            match (tok, &mut d.transport) {
                ("seq", Transport::Tcp { seq, .. }) => {
                    *seq = number("seq", toks.next(), "0-4294967295")?;
                }
                ("seq", Transport::Echo { seq, .. }) => {
                    *seq = number("seq", toks.next(), "0-65535")?;
                }
                ("seq", _) => return Err(only("tcp and icmp")),
                ("ack", Transport::Tcp { ack, .. })
                    if toks.peek().is_some_and(|t| t.parse::<u32>().is_ok()) =>
                {
                    *ack = number("ack", toks.next(), "0-4294967295")?;
                    ack_given = true;
                }
                ("id", Transport::Echo { id, .. }) => {
                    *id = number("id", toks.next(), "0-65535")?;
                }
                ("id", _) => return Err(only("icmp")),
                ("reply", Transport::Echo { reply, .. }) => *reply = true,
                ("reply", _) => return Err(only("icmp")),
                ("len", _) => d.len = number("len", toks.next(), "payload bytes")?,
                ("ttl", _) => d.ttl = number("ttl", toks.next(), "0-255")?,
                ("df", _) if d.src.is_ipv6() => {
                    return Err(
                        "\"df\": only for IPv4 (IPv6 is never fragmented on the way)".into(),
                    );
                }
                ("df", _) => d.dont_fragment = true,
                (w, Transport::Tcp { flags, .. }) if flags_word(w).is_some() => {
                    *flags |= flags_word(w).unwrap_or(0);
                }
                (w, _) => {
                    let flags = if tcp { "TCP flags, " } else { "" };
                    return Err(format!(
                        "{w:?}: unknown word (expected {flags}seq, ack, id, reply, len, ttl or df)"
                    ));
                }
            }
        }
        if let Transport::Tcp { flags, .. } = &mut d.transport
            && *flags == 0
        {
            *flags = if ack_given {
                tcp_flags::ACK
            } else {
                tcp_flags::SYN
            };
        }
        let max = d.max_len();
        if d.len > max {
            return Err(format!(
                "len {}: at most {max} payload bytes fit one {proto} packet",
                d.len
            ));
        }
        Ok(d)
    }

    /// The largest payload one packet carries: the IP length field's limit.
    fn max_len(&self) -> usize {
        let ip = if self.src.is_ipv6() { 0 } else { 20 };
        let l4 = match self.transport {
            Transport::Tcp { .. } => 20,
            _ => 8,
        };
        65535 - ip - l4
    }

    /// The frame as it arrives on `in_port`: from a pod port, from the pod's MAC to the
    /// port's own (the gateway MAC the pod's ARP or neighbour discovery got), so that the
    /// source check passes for the pod's own addresses; on any other port, from
    /// `PEER_MAC` to the port's MAC. Checksums are correct. Refused for a port the
    /// tables do not have, and for a pod without an address of the packet's family.
    pub fn frame(&self, tables: &Tables, in_port: PortId) -> Result<Vec<u8>, String> {
        let port = tables
            .ports
            .get(usize::from(in_port))
            .ok_or_else(|| format!("no port {in_port} in the tables"))?;
        let src_mac = match port.kind {
            PortKind::Pod => {
                let v6 = self.src.is_ipv6();
                if !port.addresses.iter().any(|a| a.is_ipv6() == v6) {
                    let fam = if v6 { "IPv6" } else { "IPv4" };
                    return Err(format!("pod port {} has no {fam} address", port.name));
                }
                port.peer_mac
                    .ok_or_else(|| format!("pod port {} has no peer MAC", port.name))?
            }
            _ => PEER_MAC,
        };
        Ok(self.build(src_mac, port.mac))
    }

    /// The frame with these Ethernet addresses.
    pub fn build(&self, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
        let o = IpOpts {
            ttl: self.ttl,
            dont_fragment: self.dont_fragment,
            src_mac,
            dst_mac,
            ..IpOpts::default()
        };
        let payload = build::pattern(self.len, 0);
        let (s, d) = (self.src, self.dst);
        match self.transport {
            Transport::Tcp { flags, seq, ack } => build::tcp(
                s,
                d,
                self.src_port,
                self.dst_port,
                seq,
                ack,
                flags,
                &payload,
                &o,
            ),
            Transport::Udp => build::udp(s, d, self.src_port, self.dst_port, &payload, &o),
            Transport::Echo { id, seq, reply } => {
                if reply {
                    build::echo_reply(s, d, id, seq, &payload, &o)
                } else {
                    build::echo_request(s, d, id, seq, &payload, &o)
                }
            }
        }
    }
}

/// `addr:port`, with brackets for IPv6.
fn write_endpoint(f: &mut fmt::Formatter<'_>, a: IpAddr, port: u16) -> fmt::Result {
    match a {
        IpAddr::V4(a) => write!(f, "{a}:{port}"),
        IpAddr::V6(a) => write!(f, "[{a}]:{port}"),
    }
}

/// Writes TCP flag bits as words joined with `+` (`syn+ack`); `none` for none.
pub fn flag_words(flags: u8) -> String {
    let words: Vec<&str> = FLAGS
        .iter()
        .filter(|(_, b)| flags & b != 0)
        .map(|(n, _)| *n)
        .collect();
    if words.is_empty() {
        "none".into()
    } else {
        words.join("+")
    }
}

/// The description in the form [`Described::parse`] reads back.
impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default_len = match self.transport {
            Transport::Tcp { flags, seq, ack } => {
                f.write_str("tcp ")?;
                write_endpoint(f, self.src, self.src_port)?;
                f.write_str(" -> ")?;
                write_endpoint(f, self.dst, self.dst_port)?;
                write!(f, " {} seq {seq}", flag_words(flags))?;
                if ack != 0 || flags & tcp_flags::ACK != 0 {
                    write!(f, " ack {ack}")?;
                }
                0
            }
            Transport::Udp => {
                f.write_str("udp ")?;
                write_endpoint(f, self.src, self.src_port)?;
                f.write_str(" -> ")?;
                write_endpoint(f, self.dst, self.dst_port)?;
                DEFAULT_UDP_LEN
            }
            Transport::Echo { id, seq, reply } => {
                let p = if self.src.is_ipv6() { "icmpv6" } else { "icmp" };
                write!(f, "{p} {} -> {} id {id} seq {seq}", self.src, self.dst)?;
                if reply {
                    f.write_str(" reply")?;
                }
                DEFAULT_ICMP_LEN
            }
        };
        if self.len != default_len {
            write!(f, " len {}", self.len)?;
        }
        if self.ttl != DEFAULT_TTL {
            write!(f, " ttl {}", self.ttl)?;
        }
        if self.dont_fragment {
            f.write_str(" df")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;
