//! IPv6 fixed headers (RFC 8200 section 3), as ferry builds them for the packets it
//! originates (ICMPv6 errors, TCP resets, neighbour discovery, the overlay's outer
//! header). Extension headers are in [`super::ipv6_ext`].

use std::net::Ipv6Addr;

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// An IPv6 fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// The header after it.
    pub next_header: u8,
    /// Bytes after the fixed header.
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class: DSCP and ECN.
    pub traffic_class: u8,
    /// Flow label (20 bits; higher bits are ignored).
    pub flow_label: u32,
}

impl Repr {
    /// Appends the 40-byte header to `v`.
    pub fn emit(&self, v: &mut Vec<u8>) {
        let word = 6 << 28 | u32::from(self.traffic_class) << 20 | (self.flow_label & 0x000f_ffff);
        v.extend_from_slice(&word.to_be_bytes());
        v.extend_from_slice(&(self.payload_len as u16).to_be_bytes());
        v.extend_from_slice(&[self.next_header, self.hop_limit]);
        v.extend_from_slice(&self.src.octets());
        v.extend_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_emit() {
        let mut v = Vec::new();
        Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            next_header: 58,
            payload_len: 32,
            hop_limit: 255,
            traffic_class: 0x2e,
            flow_label: 0xfff1_2345,
        }
        .emit(&mut v);
        assert_eq!(v[..8], [0x62, 0xe1, 0x23, 0x45, 0, 32, 58, 255]);
        assert_eq!(v[8..24], "fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(v[24..], "fd00::2".parse::<Ipv6Addr>().unwrap().octets());
    }
}
