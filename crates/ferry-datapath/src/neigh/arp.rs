//! ARP for Ethernet/IPv4 (RFC 826): the 28-byte body after the Ethernet header.

use std::net::Ipv4Addr;

use crate::drop::DropReason;
use crate::wire::ethernet::{self, Tag, ethertype};

/// Length of an Ethernet/IPv4 ARP body.
pub const LEN: usize = 28;
/// Operation: request.
pub const REQUEST: u16 = 1;
/// Operation: reply.
pub const REPLY: u16 = 2;

/// An Ethernet/IPv4 ARP message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// [`REQUEST`] or [`REPLY`] (others are parsed and ignored by callers).
    pub op: u16,
    /// Sender hardware address.
    pub sender_mac: [u8; 6],
    /// Sender protocol address (0.0.0.0 in a probe).
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub target_mac: [u8; 6],
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl Repr {
    /// Parses the ARP body at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<Repr, DropReason> {
        if b.len() < LEN
            || b[0..2] != [0, 1]
            || u16::from_be_bytes([b[2], b[3]]) != ethertype::IPV4
            || b[4] != 6
            || b[5] != 4
        {
            return Err(DropReason::ArpMalformed);
        }
        let mac = |o: usize| -> [u8; 6] { b[o..o + 6].try_into().expect("6 bytes") };
        let ip = |o: usize| Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]);
        Ok(Repr {
            op: u16::from_be_bytes([b[6], b[7]]),
            sender_mac: mac(8),
            sender_ip: ip(14),
            target_mac: mac(18),
            target_ip: ip(24),
        })
    }

    /// Appends the 28-byte body to `v`.
    pub fn emit(&self, v: &mut Vec<u8>) {
        v.extend_from_slice(&[0, 1]);
        v.extend_from_slice(&ethertype::IPV4.to_be_bytes());
        v.extend_from_slice(&[6, 4]);
        v.extend_from_slice(&self.op.to_be_bytes());
        v.extend_from_slice(&self.sender_mac);
        v.extend_from_slice(&self.sender_ip.octets());
        v.extend_from_slice(&self.target_mac);
        v.extend_from_slice(&self.target_ip.octets());
    }

    /// The whole Ethernet frame carrying this message.
    pub fn frame(&self, dst_mac: [u8; 6], src_mac: [u8; 6], vlan: Option<u16>) -> Vec<u8> {
        let eth = ethernet::Repr {
            dst: dst_mac,
            src: src_mac,
            tag: vlan.map(Tag::dot1q),
            ethertype: ethertype::ARP,
        };
        let mut v = Vec::with_capacity(eth.header_len() + LEN);
        eth.emit(&mut v);
        self.emit(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 28] = [
        0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ];

    fn repr() -> Repr {
        Repr {
            op: REQUEST,
            sender_mac: [2, 0, 0, 0, 0, 1],
            sender_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_mac: [0; 6],
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    #[test]
    fn test_parse() {
        assert_eq!(Repr::parse(&BYTES), Ok(repr()));
        assert_eq!(Repr::parse(&BYTES[..27]), Err(DropReason::ArpMalformed));
        let mut ipx = BYTES;
        ipx[2] = 0x81;
        assert_eq!(Repr::parse(&ipx), Err(DropReason::ArpMalformed));
    }

    #[test]
    fn test_emit() {
        let mut v = Vec::new();
        repr().emit(&mut v);
        assert_eq!(v, BYTES);
    }
}
