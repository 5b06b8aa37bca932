//! Ethernet II headers with at most one 802.1Q (or 802.1ad) tag: the EtherTypes ferry
//! knows, and the header every frame ferry builds starts with.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An Ethernet address, written `02:00:00:00:00:01`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<MacAddr, String> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for b in m.iter_mut() {
            let p = parts
                .next()
                .ok_or_else(|| format!("MAC address {s:?} has fewer than 6 octets"))?;
            if p.is_empty() || p.len() > 2 {
                return Err(format!("MAC address {s:?}: bad octet {p:?}"));
            }
            *b = u8::from_str_radix(p, 16)
                .map_err(|_| format!("MAC address {s:?}: bad octet {p:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("MAC address {s:?} has more than 6 octets"));
        }
        Ok(MacAddr(m))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Length of an Ethernet header without a tag.
pub const HEADER_LEN: usize = 14;
/// Length of one VLAN tag.
pub const TAG_LEN: usize = 4;

/// EtherTypes ferry understands.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service tag.
    pub const QINQ: u16 = 0x88a8;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
}

/// A VLAN tag: its tag protocol identifier and tag control information.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// [`ethertype::VLAN`] or [`ethertype::QINQ`].
    pub tpid: u16,
    /// Priority, drop eligibility and VLAN id.
    pub tci: u16,
}

impl Tag {
    /// An 802.1Q tag with this control information.
    pub fn dot1q(tci: u16) -> Tag {
        Tag {
            tpid: ethertype::VLAN,
            tci,
        }
    }
}

/// An Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// The VLAN tag, when tagged.
    pub tag: Option<Tag>,
    /// EtherType of the payload.
    pub ethertype: u16,
}

impl Repr {
    /// The header of a reply to `frame`: to its source MAC, from `src`, with its VLAN
    /// tag (one, as the parser takes it) as it was received. Bytes `frame` lacks read as
    /// zero.
    pub fn reply(frame: &[u8], src: [u8; 6], ethertype: u16) -> Repr {
        let at = |i: usize| frame.get(i).copied().unwrap_or(0);
        let be = |i: usize| u16::from_be_bytes([at(i), at(i + 1)]);
        let tpid = be(12);
        Repr {
            dst: std::array::from_fn(|i| at(6 + i)),
            src,
            tag: matches!(tpid, ethertype::VLAN | ethertype::QINQ)
                .then(|| Tag { tpid, tci: be(14) }),
            ethertype,
        }
    }

    /// Bytes of the header: 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + if self.tag.is_some() { TAG_LEN } else { 0 }
    }

    /// Appends the header to `v`.
    pub fn emit(&self, v: &mut Vec<u8>) {
        v.extend_from_slice(&self.dst);
        v.extend_from_slice(&self.src);
        if let Some(t) = self.tag {
            v.extend_from_slice(&t.tpid.to_be_bytes());
            v.extend_from_slice(&t.tci.to_be_bytes());
        }
        v.extend_from_slice(&self.ethertype.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TAGGED: [u8; 18] = [
        2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0x00, 0x64, 0x86, 0xdd,
    ];

    fn repr() -> Repr {
        Repr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            tag: Some(Tag::dot1q(100)),
            ethertype: ethertype::IPV6,
        }
    }

    #[test]
    fn test_emit() {
        let mut v = Vec::new();
        repr().emit(&mut v);
        assert_eq!(v, TAGGED);
        assert_eq!(repr().header_len(), 18);
        let mut v = Vec::new();
        Repr {
            tag: None,
            ..repr()
        }
        .emit(&mut v);
        assert_eq!(v, [&TAGGED[..12], &TAGGED[16..]].concat());
    }

    #[test]
    fn test_reply_keeps_the_tag_as_received() {
        let mut frame = TAGGED.to_vec();
        frame[12..14].copy_from_slice(&ethertype::QINQ.to_be_bytes());
        let r = Repr::reply(&frame, [9; 6], ethertype::IPV4);
        assert_eq!(r.dst, [2, 0, 0, 0, 0, 1]);
        assert_eq!(r.src, [9; 6]);
        assert_eq!(
            r.tag,
            Some(Tag {
                tpid: ethertype::QINQ,
                tci: 100
            })
        );
        let untagged = [&TAGGED[..12], &TAGGED[16..]].concat();
        assert_eq!(Repr::reply(&untagged, [9; 6], 0).tag, None);
    }
}
