//! The TCP reset a Service without endpoints answers a connection attempt with (UDP gets
//! an ICMP port unreachable from [`crate::icmp`]).

use std::net::IpAddr;

use crate::flow::proto;
use crate::wire::build::tcp_flags;
use crate::wire::ethernet::ethertype;
use crate::wire::{Parsed, checksum, ethernet, ipv4, ipv6};

const TCP_HDR: usize = 20;
const HOP_LIMIT: u8 = 64;

/// The reset answering the TCP segment `orig` (parsed as `parsed`), from its destination
/// back to its source, with `src_mac` as the frame's source (RFC 9293 section 3.10.7.1:
/// a segment with ACK gets `seq = its ack`; one without gets `ack = its seq + length`).
/// None for a reset (never answered) or a segment too short to read.
pub fn tcp_reset(orig: &[u8], parsed: &Parsed, src_mac: [u8; 6]) -> Option<Vec<u8>> {
    if parsed.proto != proto::TCP || !parsed.l4_complete || parsed.frag.is_some() {
        return None;
    }
    let t = orig.get(parsed.l4_off..parsed.ip_end)?;
    if t.len() < TCP_HDR {
        return None;
    }
    let flags = t[13];
    if flags & tcp_flags::RST != 0 {
        return None;
    }
    let data_off = usize::from(t[12] >> 4) * 4;
    let payload = t.len().saturating_sub(data_off) as u32;
    let seg_seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
    let seg_ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
    let (seq, ack, out_flags) = if flags & tcp_flags::ACK != 0 {
        (seg_ack, 0, tcp_flags::RST)
    } else {
        let len = payload
            + u32::from(flags & tcp_flags::SYN != 0)
            + u32::from(flags & tcp_flags::FIN != 0);
        (
            0,
            seg_seq.wrapping_add(len),
            tcp_flags::RST | tcp_flags::ACK,
        )
    };
    let k = parsed.key;
    let mut tcp = [0u8; TCP_HDR];
    tcp[0..2].copy_from_slice(&k.dst_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&k.src_port.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&ack.to_be_bytes());
    tcp[12] = (TCP_HDR as u8 / 4) << 4;
    tcp[13] = out_flags;

    let mut f = Vec::with_capacity(parsed.l3_off + ipv6::HEADER_LEN + TCP_HDR);
    let (from, to) = (k.dst.ip(), k.src.ip());
    match (from, to) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            ethernet::Repr::reply(orig, src_mac, ethertype::IPV4).emit(&mut f);
            ipv4::Repr {
                src: from,
                dst: to,
                protocol: proto::TCP,
                payload_len: TCP_HDR,
                ttl: HOP_LIMIT,
                tos: 0,
                id: 0,
                dont_fragment: true,
            }
            .emit(&mut f);
        }
        (IpAddr::V6(from), IpAddr::V6(to)) => {
            ethernet::Repr::reply(orig, src_mac, ethertype::IPV6).emit(&mut f);
            ipv6::Repr {
                src: from,
                dst: to,
                next_header: proto::TCP,
                payload_len: TCP_HDR,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
                flow_label: 0,
            }
            .emit(&mut f);
        }
        _ => return None,
    }
    let pseudo = checksum::pseudo(from, to, proto::TCP, TCP_HDR);
    let c = checksum::finish(checksum::add(&tcp, pseudo));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&tcp);
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::build::{self, IpOpts};
    use crate::wire::parse;

    fn reset_of(frame: &[u8]) -> Option<(Parsed, Vec<u8>)> {
        let p = parse(frame, 0).unwrap();
        let r = tcp_reset(frame, &p, [2, 0, 0, 0, 0, 9])?;
        Some((parse(&r, 0).unwrap(), r))
    }

    #[test]
    fn test_a_segment_with_ack_is_reset_at_its_acknowledgement() {
        let f = build::tcp(
            "fd00::1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
            1000,
            80,
            5,
            777,
            tcp_flags::ACK | tcp_flags::PSH,
            b"hello",
            &IpOpts::default(),
        );
        let (p, r) = reset_of(&f).unwrap();
        assert_eq!(
            (p.key.src_port, p.key.dst_port),
            (80, 1000),
            "from the destination back to the source"
        );
        let t = &r[p.l4_off..p.ip_end];
        assert_eq!(t[13], tcp_flags::RST);
        assert_eq!(&t[4..8], &777u32.to_be_bytes());
        assert_eq!(&r[0..6], &IpOpts::default().src_mac);
        let (IpAddr::V6(s), IpAddr::V6(d)) = (p.key.src.ip(), p.key.dst.ip()) else {
            panic!()
        };
        let sum = checksum::add(
            t,
            checksum::pseudo_v6(&s.octets(), &d.octets(), proto::TCP, t.len() as u32),
        );
        assert_eq!(checksum::fold(sum), 0xffff);
    }

    #[test]
    fn test_a_reset_is_never_answered() {
        let f = build::tcp(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            1000,
            80,
            5,
            0,
            tcp_flags::RST,
            &[],
            &IpOpts::default(),
        );
        assert!(reset_of(&f).is_none());
    }
}
