//! The one-line text of each trace event: what `ferry trace` prints and
//! `verdicts.jsonl` records as `detail`.

use std::fmt;
use std::net::IpAddr;

use super::*;

/// The text of a policy decision.
fn fmt_policy(
    f: &mut fmt::Formatter<'_>,
    direction: Direction,
    port: &str,
    peer: IpAddr,
    allowed: bool,
    by: &PolicyBy,
) -> fmt::Result {
    let to = match direction {
        Direction::Ingress => "to",
        Direction::Egress => "from",
    };
    let verdict = if allowed { "allowed" } else { "denied" };
    write!(
        f,
        "{} {to} {port} (peer {peer}): {verdict}",
        direction.name()
    )?;
    match by {
        PolicyBy::Rule { tier, rule } => {
            write!(f, " by {rule}")?;
            match tier {
                Tier::Admin => f.write_str(" (admin tier)"),
                Tier::Baseline => f.write_str(" (baseline tier)"),
                Tier::NetworkPolicy => Ok(()),
            }
        }
        PolicyBy::Isolated { policies } => write!(
            f,
            ": isolated by {}, and no rule of theirs matched",
            policies.join(", ")
        ),
        PolicyBy::Default => f.write_str(": no policy applies"),
        PolicyBy::Host => f.write_str(" from the node's own stack"),
    }
}

fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Internal => "cluster IP",
        Scope::External => "external",
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TraceEvent::*;
        match self {
            Parse { key, bytes, frag } => {
                write!(f, "{key}, {bytes} bytes")?;
                if let Some(g) = frag {
                    write!(
                        f,
                        " fragment id {} offset {} more {}",
                        g.id, g.offset, g.more
                    )?;
                }
                Ok(())
            }
            GroMarked { segment } => {
                write!(f, "coalesced TCP super-packet, segment size {segment}")
            }
            GroCoalesced { segments, packets } => {
                write!(
                    f,
                    "{segments} TCP segments coalesced into {packets} packets"
                )
            }
            IpfHeld { datagrams, bytes } => write!(
                f,
                "held for reassembly ({datagrams} datagrams, {bytes} bytes in flight)"
            ),
            IpfReassembled { bytes, mru, key } => {
                write!(
                    f,
                    "reassembled {bytes} bytes, mru {mru}, key rebuilt: {key}"
                )
            }
            IpfRefused { reason } => write!(f, "refused: {reason}"),
            Decap { vni, peer, inner } => write!(f, "VXLAN vni {vni} from node {peer}: {inner}"),
            DecapGso {
                peer,
                datagrams,
                size,
            } => write!(
                f,
                "UDP GSO super-frame from node {peer}: {datagrams} datagrams of {size} bytes"
            ),
            SourceOk => f.write_str("pod's own MAC and address"),
            ServiceReset => f.write_str("refused with a TCP reset"),
            ServiceResetNoPath { reason, peer } => {
                write!(f, "no TCP reset sent: {reason} towards node {peer}")
            }
            ServiceNoEndpoint {
                service,
                scope,
                key,
            } => write!(f, "{service} ({scope:?}): no endpoint to send {key} to"),
            ServiceNoNodeAddress {
                service,
                scope,
                key,
            } => write!(
                f,
                "{service} ({scope:?}): {key} must leave from this node's address, and it has none of the family"
            ),
            ServiceSourceDenied { service, key } => write!(
                f,
                "{service}: {key}: its source is in none of the Service's loadBalancerSourceRanges"
            ),
            ServiceBalanced {
                service,
                scope,
                frontend,
                frontend_port,
                endpoint,
                endpoint_port,
                node,
                path,
            } => {
                write!(
                    f,
                    "{service} ({} frontend {}) -> endpoint {}",
                    scope_name(*scope),
                    SockAddr(*frontend, *frontend_port),
                    SockAddr(*endpoint, *endpoint_port)
                )?;
                if let Some(n) = node {
                    write!(f, " on node {n}")?;
                }
                match path {
                    ServicePath::Snat { addr, hairpin: true } => {
                        write!(f, ", hairpin: source NAT to {addr}")
                    }
                    ServicePath::Snat { addr, .. } => write!(f, ", source NAT to {addr}"),
                    ServicePath::Tunnel => f.write_str(
                        ", client address kept, through the tunnel so that replies return through this node",
                    ),
                    ServicePath::Direct => Ok(()),
                }
            }
            ServiceRecovered {
                service,
                scope,
                frontend,
                frontend_port,
                endpoint,
                endpoint_port,
                through,
                candidate,
                candidates,
            } => {
                write!(
                    f,
                    "endpoint {} of {service}, no connection: taken as a reply through its {} frontend {} (candidate {candidate} of {candidates}), until the client answers",
                    SockAddr(*endpoint, *endpoint_port),
                    scope_name(*scope),
                    SockAddr(*frontend, *frontend_port),
                )?;
                match through {
                    Some(n) => write!(f, "; back through node {n}, which translates it"),
                    None => Ok(()),
                }
            }
            StaticNat {
                dnat,
                dnat_port,
                snat,
                snat_ports,
            } => {
                f.write_str("static rule: ")?;
                if let Some(a) = dnat {
                    match dnat_port {
                        Some(p) => write!(f, "destination to {}", SockAddr(*a, *p))?,
                        None => write!(f, "destination to {a}")?,
                    }
                }
                if let Some(a) = snat {
                    if dnat.is_some() {
                        f.write_str(", ")?;
                    }
                    match snat_ports {
                        Some((lo, hi)) => write!(f, "source to {a} ports {lo}-{hi}")?,
                        None => write!(f, "source to {a}")?,
                    }
                }
                if dnat.is_none() && snat.is_none() {
                    f.write_str("no translation")?;
                }
                Ok(())
            }
            Ct {
                state,
                reply,
                key,
                translated,
            } => {
                f.write_str(state.name())?;
                if *reply {
                    f.write_str(" reply")?;
                }
                if *translated {
                    write!(f, ", translated to {key}")?;
                }
                Ok(())
            }
            Policy {
                direction,
                port,
                peer,
                allowed,
                by,
            } => fmt_policy(f, *direction, port, *peer, *allowed, by),
            Committed => f.write_str("connection committed"),
            RouteNoPod { dst } => write!(
                f,
                "{dst} -> nowhere: in this node's pod CIDRs, and no pod has it"
            ),
            RouteTunnel { dst, node } => write!(f, "{dst} -> node {node} through the overlay"),
            RoutePort { dst, port } => write!(f, "{dst} -> port {port}"),
            _ => self.fmt_egress(f),
        }
    }
}

impl TraceEvent {
    /// The text of the events from the MTU check on (`fmt` writes the others).
    fn fmt_egress(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TraceEvent::*;
        match self {
            Mtu {
                mtu,
                tunnel,
                port,
                length,
                fit,
            } => {
                let inner = if *tunnel { " (inside the tunnel)" } else { "" };
                write!(f, "mtu {mtu}{inner} on {port}: ")?;
                match length {
                    MtuLength::Gso { segment } => write!(f, "GSO packet, segment size {segment}")?,
                    MtuLength::Reassembled { bytes, mru } => {
                        write!(f, "{bytes} bytes reassembled, mru {mru}")?
                    }
                    MtuLength::Plain { bytes } => write!(f, "{bytes} bytes")?,
                }
                f.write_str(match fit {
                    MtuFit::TooBig => ", too big, and may not be fragmented",
                    MtuFit::Fits => ", fits",
                    MtuFit::Cut => ", to be cut to fit",
                })
            }
            L2 {
                hop,
                dst_mac,
                src_mac,
                port,
            } => {
                match hop {
                    L2Hop::RouteMac => f.write_str("route's next hop MAC")?,
                    L2Hop::Gateway { addr } => write!(f, "gateway {addr}")?,
                    L2Hop::OnLink { addr } => write!(f, "{addr} on-link")?,
                }
                write!(
                    f,
                    ": to {} from {} on {port}",
                    MacAddr(*dst_mac),
                    MacAddr(*src_mac)
                )
            }
            L2Tunnel {
                inner_src,
                inner_dst,
                outer_dst,
                peer,
                outer_src,
                port,
            } => write!(
                f,
                "inner {} -> {}; outer to {} ({peer}) from {} on {port}",
                MacAddr(*inner_src),
                MacAddr(*inner_dst),
                MacAddr(*outer_dst),
                MacAddr(*outer_src)
            ),
            NeighProbe { ip, port, mac } => write!(
                f,
                "{ip} not confirmed on {port}: probe sent to {}",
                MacAddr(*mac)
            ),
            NeighQueued {
                ip,
                port,
                asked,
                waiting,
                pushed_out,
            } => {
                let asked = match (asked, ip) {
                    (Asked::Probed { dry_run: true }, IpAddr::V4(_)) => {
                        "an ARP request would be sent"
                    }
                    (Asked::Probed { dry_run: true }, IpAddr::V6(_)) => {
                        "a neighbour solicitation would be sent"
                    }
                    (Asked::Probed { .. }, IpAddr::V4(_)) => "ARP request sent",
                    (Asked::Probed { .. }, IpAddr::V6(_)) => "neighbour solicitation sent",
                    (Asked::Already, _) => "asked already",
                };
                write!(
                    f,
                    "queued: next hop {ip} unresolved on {port} ({asked}); {waiting} waiting for it"
                )?;
                if *pushed_out > 0 {
                    write!(f, ", {pushed_out} older pushed out")?;
                }
                Ok(())
            }
            NeighReleased { ip, mac, key } => write!(
                f,
                "{ip} is at {}: sending {key} that waited for it",
                MacAddr(*mac)
            ),
            Encap {
                vni,
                node,
                src,
                dst,
                udp_src_port,
                mtu,
            } => {
                write!(f, "VXLAN vni {vni}")?;
                if let Some(n) = node {
                    write!(f, " to node {n}")?;
                }
                write!(
                    f,
                    ": {src} -> {dst}, udp source port {udp_src_port}, inner mtu {mtu}"
                )
            }
            EncapSuperFrames {
                datagrams,
                frames,
                super_frames,
                port,
            } => write!(
                f,
                "{datagrams} datagrams in {frames} frames, {super_frames} of them UDP GSO super-frames for {port} to cut"
            ),
            _ => self.fmt_sent(f),
        }
    }

    /// The text of the events from sending on (`fmt` and `fmt_egress` write the
    /// others).
    fn fmt_sent(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TraceEvent::*;
        match self {
            SentGso { port, segment } => {
                write!(f, "GSO packet sent whole to {port}, segment size {segment}")
            }
            Segmented { packets, mtu, port } => {
                write!(
                    f,
                    "segmented into {packets} packets for mtu {mtu} on {port}"
                )
            }
            Sent { port } => write!(f, "sent to {port}"),
            Fragmented {
                mru,
                mtu,
                limit,
                fragments,
                port,
            } => {
                match mru {
                    Some(mru) => write!(f, "refragmented to min(mru {mru}, mtu {mtu}) = {limit}")?,
                    None => write!(f, "fragmented to mtu {mtu}")?,
                }
                write!(f, ": {fragments} fragments to {port}")
            }
            IcmpNoAddress { error, port } => write!(
                f,
                "no {error:?} sent: port {port} has no address of this family"
            ),
            IcmpNotAllowed { error } => write!(f, "no {error:?} sent: not allowed for this packet"),
            IcmpRateLimited { error } => write!(f, "no {error:?} sent: rate limited"),
            IcmpUnrelated { error } => {
                write!(f, "no {error:?} sent: conntrack could not relate it")
            }
            IcmpNoPath {
                error,
                reason,
                peer,
            } => write!(f, "no {error:?} sent: {reason} towards node {peer}"),
            IcmpSent {
                error,
                src,
                dst,
                port,
            } => write!(f, "{error:?} sent from {src} to {dst} via {port}"),
            ArpIgnored { op } => write!(f, "op {op}: not acted on"),
            ArpNotAnswered { op, sender, target } => {
                write!(f, "op {op} {sender} -> {target}: not answered")
            }
            ArpAnswered {
                target,
                mac,
                sender,
            } => write!(f, "{target} is at {} (answered to {sender})", MacAddr(*mac)),
            NdNotAnswered { target } => write!(f, "solicitation for {target}: not answered"),
            NdAdvert { target } => write!(f, "advertisement of {target}"),
            NdIgnored { icmp_type } => write!(f, "ICMPv6 type {icmp_type}: not acted on"),
            NdAnswered { target, mac, dst } => {
                write!(f, "{target} is at {} (answered to {dst})", MacAddr(*mac))
            }
            Drop { reason } => f.write_str(reason.name()),
            // Written by `fmt` and `fmt_egress`.
            _ => Ok(()),
        }
    }
}

/// `addr:port`, with brackets for IPv6.
pub(in crate::pipeline) struct SockAddr(
    pub(in crate::pipeline) IpAddr,
    pub(in crate::pipeline) u16,
);

impl fmt::Display for SockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.1),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.1),
        }
    }
}
