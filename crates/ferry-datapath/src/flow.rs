//! The flow key: what identifies a connection, extracted once per packet.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    /// SCTP.
    pub const SCTP: u8 = 132;
}

/// An IP address of either family in one fixed layout: 16 bytes aligned to 16, an IPv4
/// address in its IPv4-mapped IPv6 form (`::ffff:a.b.c.d`).
///
/// A flow key and a NAT hold their addresses in this form rather than as [`IpAddr`],
/// whose 16 bytes sit one byte into it behind the family: copies of structures holding
/// an `IpAddr` are moves at odd offsets, and reading back an address just copied then
/// needs bytes from two earlier stores, which the processor cannot forward from its
/// store buffer (it waits for them to reach the cache). An `Addr` sits at a 16-byte
/// boundary of whatever holds it, so that a copy of the whole moves it in one piece.
///
/// The IPv4-mapped form is unambiguous because IPv6 packets do not carry such addresses
/// (a form for IPv4 addresses inside a host): the parser drops those that do
/// (`ipv6_v4_mapped_address`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C, align(16))]
pub struct Addr([u8; 16]);

impl Addr {
    /// The IPv4 unspecified address, 0.0.0.0.
    pub const V4_UNSPECIFIED: Addr = Addr::v4(Ipv4Addr::UNSPECIFIED);

    /// An IPv4 address.
    #[inline]
    pub const fn v4(a: Ipv4Addr) -> Addr {
        let [a, b, c, d] = a.octets();
        Addr([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d])
    }

    /// An IPv6 address. An IPv4-mapped one (`::ffff:a.b.c.d`) is the IPv4 address.
    #[inline]
    pub const fn v6(a: Ipv6Addr) -> Addr {
        Addr(a.octets())
    }

    /// True for an IPv4 address.
    #[inline]
    pub fn is_ipv4(&self) -> bool {
        let b = &self.0;
        u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) == 0
            && u32::from_be_bytes([b[8], b[9], b[10], b[11]]) == 0xffff
    }

    /// True for an IPv6 address.
    #[inline]
    pub fn is_ipv6(&self) -> bool {
        !self.is_ipv4()
    }

    /// The IPv4 address, if it is one.
    #[inline]
    pub fn to_v4(&self) -> Option<Ipv4Addr> {
        self.is_ipv4().then(|| self.v4_bits().into())
    }

    /// The last 4 bytes as a number: the IPv4 address, for an IPv4 address.
    #[inline]
    pub fn v4_bits(&self) -> u32 {
        let b = &self.0;
        u32::from_be_bytes([b[12], b[13], b[14], b[15]])
    }

    /// The 16 bytes (the IPv4-mapped form for IPv4).
    #[inline]
    pub fn octets(&self) -> &[u8; 16] {
        &self.0
    }

    /// The standard library's form.
    #[inline]
    pub fn ip(&self) -> IpAddr {
        match self.to_v4() {
            Some(a) => IpAddr::V4(a),
            None => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }
}

impl From<IpAddr> for Addr {
    #[inline]
    fn from(a: IpAddr) -> Addr {
        match a {
            IpAddr::V4(a) => Addr::v4(a),
            IpAddr::V6(a) => Addr::v6(a),
        }
    }
}

impl From<Ipv4Addr> for Addr {
    #[inline]
    fn from(a: Ipv4Addr) -> Addr {
        Addr::v4(a)
    }
}

impl From<Ipv6Addr> for Addr {
    #[inline]
    fn from(a: Ipv6Addr) -> Addr {
        Addr::v6(a)
    }
}

impl From<Addr> for IpAddr {
    #[inline]
    fn from(a: Addr) -> IpAddr {
        a.ip()
    }
}

impl PartialEq<IpAddr> for Addr {
    #[inline]
    fn eq(&self, other: &IpAddr) -> bool {
        *self == Addr::from(*other)
    }
}

impl PartialEq<Addr> for IpAddr {
    #[inline]
    fn eq(&self, other: &Addr) -> bool {
        Addr::from(*self) == *other
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.ip(), f)
    }
}

impl std::str::FromStr for Addr {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Addr, Self::Err> {
        s.parse::<IpAddr>().map(Addr::from)
    }
}

impl serde::Serialize for Addr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ip().serialize(s)
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.ip(), f)
    }
}

/// A connection's identity: zone, addresses, protocol, and ports.
///
/// For TCP and UDP the ports are the transport ports. For ICMP and ICMPv6,
/// `src_port` is the echo identifier (zero for non-echo messages) and `dst_port` is
/// `type << 8 | code`. For a fragment that is not the first, or a first fragment too
/// short to carry them, both ports are zero: the real key exists only after reassembly.
///
/// Laid out in 48 bytes (`repr(C)`, aligned to 16 by its [`Addr`]esses): the source
/// address, the destination address, then the rest in 8 bytes. A copy is three 16-byte
/// moves at those places, and reading any field of a key just copied reads what one
/// store wrote, which the processor forwards from its store buffer; a new connection
/// copies its key (the packet's, the translated one, the reply tuple) several times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct FlowKey {
    /// Source address.
    pub src: Addr,
    /// Destination address.
    pub dst: Addr,
    /// Conntrack / fragment zone.
    pub zone: u16,
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
        proto::SCTP => "sctp",
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
            proto::TCP | proto::UDP | proto::SCTP => {
                let (s, d) = (self.src.ip(), self.dst.ip());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addr_keeps_the_family_and_the_address() {
        for s in [
            "10.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "fd00::1",
            "::",
            "::10.0.0.1",
        ] {
            let a = Addr::from(ip(s));
            assert_eq!(a.ip(), ip(s), "{s}");
            assert_eq!(a.is_ipv4(), ip(s).is_ipv4(), "{s}");
            assert_eq!(a.is_ipv6(), ip(s).is_ipv6(), "{s}");
            assert_eq!(a.to_string(), ip(s).to_string());
            assert_eq!(format!("{a:?}"), format!("{:?}", ip(s)));
            assert_eq!(s.parse::<Addr>(), Ok(a));
            assert_eq!(a, ip(s));
            assert_eq!(ip(s), a);
        }
        assert_eq!(
            Addr::from(ip("10.1.2.3")).to_v4(),
            Some(Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(Addr::from(ip("10.1.2.3")).v4_bits(), 0x0a01_0203);
        assert_eq!(Addr::from(ip("::10.1.2.3")).to_v4(), None);
        assert_eq!(Addr::V4_UNSPECIFIED, ip("0.0.0.0"));
    }

    /// The IPv4-mapped form is how an IPv4 address is held: the IPv6 address of that
    /// form reads back as IPv4, which is why the parser keeps such addresses out.
    #[test]
    fn an_ipv4_mapped_ipv6_address_is_the_ipv4_address() {
        assert_eq!(
            Addr::from(ip("::ffff:10.0.0.1")),
            Addr::from(ip("10.0.0.1"))
        );
        assert_eq!(Addr::from(ip("::ffff:10.0.0.1")).ip(), ip("10.0.0.1"));
    }

    #[test]
    fn addresses_sit_at_fixed_places_in_a_key() {
        assert_eq!(size_of::<Addr>(), 16);
        assert_eq!(align_of::<Addr>(), 16);
        assert_eq!(size_of::<FlowKey>(), 48);
        assert_eq!(std::mem::offset_of!(FlowKey, src), 0);
        assert_eq!(std::mem::offset_of!(FlowKey, dst), 16);
    }
}
