//! Builders for whole frames, for tests, benchmarks, demos and packet injection.
//! Built on etherparse's packet builder; checksums are always correct.

use std::net::IpAddr;

use etherparse::{IpHeaders, Ipv4Header, Ipv6Header, PacketBuilder, TcpHeader};

use crate::flow::proto;

/// Source MAC used when none is given.
pub const MAC_SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Destination MAC used when none is given.
pub const MAC_DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
    /// ECE.
    pub const ECE: u8 = 0x40;
    /// CWR.
    pub const CWR: u8 = 0x80;
}

/// IP-level options for a built frame.
#[derive(Clone, Copy, Debug)]
pub struct IpOpts {
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv4 identification.
    pub id: u16,
    /// IPv4 DF bit.
    pub dont_fragment: bool,
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// Ethernet destination.
    pub dst_mac: [u8; 6],
}

impl Default for IpOpts {
    fn default() -> Self {
        IpOpts {
            ttl: 64,
            id: 0x1234,
            dont_fragment: false,
            src_mac: MAC_SRC,
            dst_mac: MAC_DST,
        }
    }
}

fn ip_headers(src: IpAddr, dst: IpAddr, next: u8, o: &IpOpts) -> IpHeaders {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = Ipv4Header::new(0, o.ttl, next.into(), s.octets(), d.octets())
                .expect("zero payload");
            h.identification = o.id;
            h.dont_fragment = o.dont_fragment;
            IpHeaders::Ipv4(h, Default::default())
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => IpHeaders::Ipv6(
            Ipv6Header {
                hop_limit: o.ttl,
                next_header: next.into(),
                source: s.octets(),
                destination: d.octets(),
                ..Default::default()
            },
            Default::default(),
        ),
        _ => panic!("source and destination must be the same IP version"),
    }
}

/// An Ethernet frame carrying UDP.
pub fn udp(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    payload: &[u8],
    o: &IpOpts,
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(o.src_mac, o.dst_mac)
        .ip(ip_headers(src, dst, proto::UDP, o))
        .udp(sport, dport);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).expect("UDP frame fits");
    v
}

/// An Ethernet frame carrying the SCTP packet `sctp` (see [`super::sctp::build`]).
pub fn sctp(src: IpAddr, dst: IpAddr, sctp: &[u8], o: &IpOpts) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(o.src_mac, o.dst_mac).ip(ip_headers(src, dst, 132, o));
    let mut v = Vec::with_capacity(b.size(sctp.len()));
    b.write(&mut v, etherparse::IpNumber(132), sctp)
        .expect("SCTP frame fits");
    v
}

/// An Ethernet frame carrying TCP with the given flags (see [`tcp_flags`]).
#[allow(clippy::too_many_arguments)]
pub fn tcp(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
    o: &IpOpts,
) -> Vec<u8> {
    let mut t = TcpHeader::new(sport, dport, seq, 65535);
    t.acknowledgment_number = ack;
    t.fin = flags & tcp_flags::FIN != 0;
    t.syn = flags & tcp_flags::SYN != 0;
    t.rst = flags & tcp_flags::RST != 0;
    t.psh = flags & tcp_flags::PSH != 0;
    t.ack = flags & tcp_flags::ACK != 0;
    t.urg = flags & tcp_flags::URG != 0;
    t.ece = flags & tcp_flags::ECE != 0;
    t.cwr = flags & tcp_flags::CWR != 0;
    let b = PacketBuilder::ethernet2(o.src_mac, o.dst_mac)
        .ip(ip_headers(src, dst, proto::TCP, o))
        .tcp_header(t);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).expect("TCP frame fits");
    v
}

/// An Ethernet frame carrying an ICMP (IPv4) or ICMPv6 (IPv6) echo request.
pub fn echo_request(
    src: IpAddr,
    dst: IpAddr,
    id: u16,
    seq: u16,
    payload: &[u8],
    o: &IpOpts,
) -> Vec<u8> {
    echo(src, dst, id, seq, false, payload, o)
}

/// An Ethernet frame carrying an ICMP (IPv4) or ICMPv6 (IPv6) echo reply.
pub fn echo_reply(
    src: IpAddr,
    dst: IpAddr,
    id: u16,
    seq: u16,
    payload: &[u8],
    o: &IpOpts,
) -> Vec<u8> {
    echo(src, dst, id, seq, true, payload, o)
}

fn echo(
    src: IpAddr,
    dst: IpAddr,
    id: u16,
    seq: u16,
    reply: bool,
    payload: &[u8],
    o: &IpOpts,
) -> Vec<u8> {
    let next = if src.is_ipv4() {
        proto::ICMP
    } else {
        proto::ICMPV6
    };
    let step = PacketBuilder::ethernet2(o.src_mac, o.dst_mac).ip(ip_headers(src, dst, next, o));
    let mut v = Vec::new();
    let written = match (src.is_ipv4(), reply) {
        (true, false) => step.icmpv4_echo_request(id, seq).write(&mut v, payload),
        (true, true) => step.icmpv4_echo_reply(id, seq).write(&mut v, payload),
        (false, false) => step.icmpv6_echo_request(id, seq).write(&mut v, payload),
        (false, true) => step.icmpv6_echo_reply(id, seq).write(&mut v, payload),
    };
    written.expect("ICMP frame fits");
    v
}

/// A payload of `len` bytes with a recognisable, position-dependent pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}
