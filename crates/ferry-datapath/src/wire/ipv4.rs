//! IPv4 headers (RFC 791): the fixed header, as ferry builds it for the packets it
//! originates (ICMP errors, TCP resets, the overlay's outer header).

use std::net::Ipv4Addr;

use crate::wire::checksum;

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = 20;

/// An IPv4 header without options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: u8,
    /// Bytes after the header.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Type of service: DSCP and ECN.
    pub tos: u8,
    /// Identification.
    pub id: u16,
    /// The DF bit. The packet is never a fragment.
    pub dont_fragment: bool,
}

impl Repr {
    /// Appends the 20-byte header to `v`, its checksum filled in.
    pub fn emit(&self, v: &mut Vec<u8>) {
        let total = (HEADER_LEN + self.payload_len) as u16;
        let flags = if self.dont_fragment { 0x40 } else { 0 };
        let at = v.len();
        v.extend_from_slice(&[0x45, self.tos]);
        v.extend_from_slice(&total.to_be_bytes());
        v.extend_from_slice(&self.id.to_be_bytes());
        v.extend_from_slice(&[flags, 0, self.ttl, self.protocol, 0, 0]);
        v.extend_from_slice(&self.src.octets());
        v.extend_from_slice(&self.dst.octets());
        checksum::set_ipv4_header(&mut v[at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 20] = [
        0x45, 0xc0, 0x00, 0x24, 0x12, 0x34, 0x40, 0x00, 0x40, 0x01, 0x00, 0x00, 10, 0, 0, 1, 10, 0,
        0, 2,
    ];

    #[test]
    fn test_emit() {
        let mut v = vec![0xee];
        Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            protocol: 1,
            payload_len: 16,
            ttl: 64,
            tos: 0xc0,
            id: 0x1234,
            dont_fragment: true,
        }
        .emit(&mut v);
        let mut want = BYTES;
        let c = checksum::checksum(&want);
        want[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(v[1..], want);
        assert_eq!(checksum::checksum(&v[1..]), 0);
    }
}
