//! The flow key: what identifies a connection, extracted once per packet.

use std::fmt;
use std::net::IpAddr;

/// IP protocol numbers ferry looks at.
pub mod proto {
    /// ICMP for IPv4.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
}

/// A connection's identity: zone, addresses, protocol, and ports.
///
/// For TCP and UDP the ports are the transport ports. For ICMP and ICMPv6,
/// `src_port` is the echo identifier (zero for non-echo messages) and `dst_port` is
/// `type << 8 | code`. For a fragment that is not the first, or a first fragment too
/// short to carry them, both ports are zero: the real key exists only after reassembly.
///
/// Aligned to 8 bytes, which makes it 48 bytes long: a copy is then three 16-byte moves
/// at fixed places, and a copy of a copy reads exactly what the first copy wrote, which
/// the processor forwards from its store buffer. At its natural 42 bytes a copy is made
/// of overlapping moves, and reading back a key just written waited for the stores to
/// reach the cache, several times on the path of every new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(align(8))]
pub struct FlowKey {
    /// Conntrack / fragment zone.
    pub zone: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol / IPv6 upper-layer next header.
    pub proto: u8,
    /// Source port, or ICMP echo identifier.
    pub src_port: u16,
    /// Destination port, or ICMP `type << 8 | code`.
    pub dst_port: u16,
}

impl FlowKey {
    /// The ICMP type, for ICMP and ICMPv6 keys.
    pub fn icmp_type(&self) -> Option<u8> {
        matches!(self.proto, proto::ICMP | proto::ICMPV6).then_some((self.dst_port >> 8) as u8)
    }
}

/// Short protocol name for display.
pub fn proto_name(p: u8) -> &'static str {
    match p {
        proto::ICMP => "icmp",
        proto::TCP => "tcp",
        proto::UDP => "udp",
        proto::ICMPV6 => "icmpv6",
        _ => "ip",
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = proto_name(self.proto);
        match self.proto {
            proto::ICMP | proto::ICMPV6 => write!(
                f,
                "zone {} {} {} -> {} type {} code {} id {}",
                self.zone,
                p,
                self.src,
                self.dst,
                self.dst_port >> 8,
                self.dst_port & 0xff,
                self.src_port
            ),
            proto::TCP | proto::UDP => {
                let (s, d) = (self.src, self.dst);
                let fmt_ep = |a: IpAddr, port: u16| match a {
                    IpAddr::V4(v) => format!("{v}:{port}"),
                    IpAddr::V6(v) => format!("[{v}]:{port}"),
                };
                write!(
                    f,
                    "zone {} {} {} -> {}",
                    self.zone,
                    p,
                    fmt_ep(s, self.src_port),
                    fmt_ep(d, self.dst_port)
                )
            }
            other => write!(
                f,
                "zone {} proto {} {} -> {}",
                self.zone, other, self.src, self.dst
            ),
        }
    }
}
