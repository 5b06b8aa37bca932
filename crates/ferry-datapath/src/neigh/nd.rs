//! IPv6 neighbour discovery messages (RFC 4861): parsing the ones a node acts on and
//! building neighbour solicitations and advertisements.

use std::net::{IpAddr, Ipv6Addr};

use crate::drop::DropReason;
use crate::flow::proto;
use crate::wire::ethernet::ethertype;
use crate::wire::ethernet::{self, Tag};
use crate::wire::parse::{L3, Parsed};
use crate::wire::{checksum, ipv6};

/// ICMPv6 types of neighbour discovery.
pub mod nd_type {
    /// Router solicitation.
    pub const RS: u8 = 133;
    /// Neighbour solicitation.
    pub const NS: u8 = 135;
    /// Neighbour advertisement.
    pub const NA: u8 = 136;
    /// Redirect.
    pub const REDIRECT: u8 = 137;
}

/// Neighbour advertisement flag: the sender is a router.
pub const FLAG_ROUTER: u8 = 0x80;
/// Neighbour advertisement flag: sent in answer to a solicitation.
pub const FLAG_SOLICITED: u8 = 0x40;
/// Neighbour advertisement flag: override a cached link-layer address.
pub const FLAG_OVERRIDE: u8 = 0x20;

/// The all-nodes multicast address.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// Option type: source link-layer address.
const OPT_SLLA: u8 = 1;
/// Option type: target link-layer address.
const OPT_TLLA: u8 = 2;
/// Every ND message is sent with this hop limit; anything else came through a router.
const HOP_LIMIT: u8 = 255;
/// Length of an NS or NA body without options: type, code, checksum, 4 bytes, target.
const NS_NA_LEN: usize = 24;

/// A neighbour discovery message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Neighbour solicitation for `target`, with the sender's link-layer address.
    Solicit {
        /// The address being resolved.
        target: Ipv6Addr,
        /// Source link-layer address option.
        slla: Option<[u8; 6]>,
    },
    /// Neighbour advertisement of `target`.
    Advert {
        /// The advertised address.
        target: Ipv6Addr,
        /// R, S, O flags ([`FLAG_ROUTER`], ...).
        flags: u8,
        /// Target link-layer address option.
        tlla: Option<[u8; 6]>,
    },
    /// Router solicitation, router advertisement or redirect: recognised, not acted on.
    Other(u8),
}

/// Parses `frame` as a neighbour discovery message. `Ok(None)` when it is not one
/// (not ICMPv6, or another ICMPv6 type); a malformed one (hop limit not 255, code not 0,
/// bad checksum, truncated, bad options; a solicitation from the unspecified address not
/// to a solicited-node group or with a source link-layer address; a solicited
/// advertisement to a multicast address) is `nd_malformed`.
pub fn parse(frame: &[u8], parsed: &Parsed) -> Result<Option<Message>, DropReason> {
    if parsed.l3 != L3::Ipv6 || parsed.proto != proto::ICMPV6 || parsed.frag.is_some() {
        return Ok(None);
    }
    let body = &frame[parsed.l4_off..parsed.ip_end];
    let ty = body[0];
    if !(nd_type::RS..=nd_type::REDIRECT).contains(&ty) {
        return Ok(None);
    }
    let src = crate::wire::parse::v6_octets(parsed.key.src);
    let dst = crate::wire::parse::v6_octets(parsed.key.dst);
    let sum = checksum::add(
        body,
        checksum::pseudo_v6(&src, &dst, proto::ICMPV6, body.len() as u32),
    );
    if parsed.ttl != HOP_LIMIT || body[1] != 0 || checksum::fold(sum) != 0xffff {
        return Err(DropReason::NdMalformed);
    }
    if ty != nd_type::NS && ty != nd_type::NA {
        return Ok(Some(Message::Other(ty)));
    }
    if body.len() < NS_NA_LEN {
        return Err(DropReason::NdMalformed);
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&body[8..24]).expect("16 bytes"));
    if target.is_multicast() {
        return Err(DropReason::NdMalformed);
    }
    let want = if ty == nd_type::NS {
        OPT_SLLA
    } else {
        OPT_TLLA
    };
    let lla = link_layer_option(&body[NS_NA_LEN..], want)?;
    // Duplicate address detection: to the target's group, without the sender's MAC
    // (RFC 4861 section 7.1.1).
    if ty == nd_type::NS
        && src == [0; 16]
        && (!is_solicited_node(&Ipv6Addr::from(dst)) || lla.is_some())
    {
        return Err(DropReason::NdMalformed);
    }
    let flags = body[4] & (FLAG_ROUTER | FLAG_SOLICITED | FLAG_OVERRIDE);
    // An answer goes to whoever asked, never to a group (RFC 4861 section 7.1.2).
    if ty == nd_type::NA && flags & FLAG_SOLICITED != 0 && dst[0] == 0xff {
        return Err(DropReason::NdMalformed);
    }
    Ok(Some(if ty == nd_type::NS {
        Message::Solicit { target, slla: lla }
    } else {
        Message::Advert {
            target,
            flags,
            tlla: lla,
        }
    }))
}

/// Walks the options; returns the Ethernet address of the option of type `want`.
fn link_layer_option(mut opts: &[u8], want: u8) -> Result<Option<[u8; 6]>, DropReason> {
    let mut found = None;
    while !opts.is_empty() {
        if opts.len() < 8 {
            return Err(DropReason::NdMalformed);
        }
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            return Err(DropReason::NdMalformed);
        }
        if opts[0] == want && len == 8 {
            found = Some(opts[2..8].try_into().expect("6 bytes"));
        }
        opts = &opts[len..];
    }
    Ok(found)
}

/// The solicited-node multicast address of `a` (RFC 4291 section 2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet address of an IPv6 multicast group (RFC 2464 section 7).
pub fn multicast_mac(a: Ipv6Addr) -> [u8; 6] {
    let o = a.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// The link-local address of an interface with this MAC (modified EUI-64, RFC 4291).
pub fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o[0] = 0xfe;
    o[1] = 0x80;
    o[8] = mac[0] ^ 0x02;
    o[9] = mac[1];
    o[10] = mac[2];
    o[11] = 0xff;
    o[12] = 0xfe;
    o[13] = mac[3];
    o[14] = mac[4];
    o[15] = mac[5];
    Ipv6Addr::from(o)
}

/// True for fe80::/10.
pub fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// A neighbour advertisement frame: `target` is at `mac` (None: without the target
/// link-layer address option).
#[allow(clippy::too_many_arguments)]
pub fn advert(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    vlan: Option<u16>,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    target: Ipv6Addr,
    flags: u8,
    mac: Option<[u8; 6]>,
) -> Vec<u8> {
    let mut body = [0u8; NS_NA_LEN + 8];
    body[0] = nd_type::NA;
    body[4] = flags;
    body[8..24].copy_from_slice(&target.octets());
    let len = match mac {
        Some(m) => {
            body[24] = OPT_TLLA;
            body[25] = 1;
            body[26..32].copy_from_slice(&m);
            NS_NA_LEN + 8
        }
        None => NS_NA_LEN,
    };
    frame(dst_mac, src_mac, vlan, src, dst, &mut body[..len])
}

/// A multicast neighbour solicitation for `target` from `src` (link-layer `src_mac`).
/// From the unspecified address (duplicate address detection) it has no source
/// link-layer address option (RFC 4861 section 4.3).
pub fn solicit(src_mac: [u8; 6], vlan: Option<u16>, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let group = solicited_node(target);
    let mut body = [0u8; NS_NA_LEN + 8];
    body[0] = nd_type::NS;
    body[8..24].copy_from_slice(&target.octets());
    body[24] = OPT_SLLA;
    body[25] = 1;
    body[26..32].copy_from_slice(&src_mac);
    let len = if src.is_unspecified() {
        NS_NA_LEN
    } else {
        NS_NA_LEN + 8
    };
    frame(
        multicast_mac(group),
        src_mac,
        vlan,
        src,
        group,
        &mut body[..len],
    )
}

/// A neighbour solicitation for `target` sent to it, at `dst_mac`, from `src`
/// (link-layer `src_mac`): a probe of a neighbour whose MAC is cached (RFC 4861 section
/// 7.3.3).
pub fn solicit_unicast(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    vlan: Option<u16>,
    src: Ipv6Addr,
    target: Ipv6Addr,
) -> Vec<u8> {
    let mut body = [0u8; NS_NA_LEN + 8];
    body[0] = nd_type::NS;
    body[8..24].copy_from_slice(&target.octets());
    body[24] = OPT_SLLA;
    body[25] = 1;
    body[26..32].copy_from_slice(&src_mac);
    frame(dst_mac, src_mac, vlan, src, target, &mut body)
}

/// True for a solicited-node multicast address (ff02::1:ff00:0/104).
pub fn is_solicited_node(a: &Ipv6Addr) -> bool {
    let o = a.octets();
    o[..13] == solicited_node(Ipv6Addr::UNSPECIFIED).octets()[..13]
}

/// Ethernet + IPv6 (hop limit 255) + the ICMPv6 `body`, whose checksum is filled in.
fn frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    vlan: Option<u16>,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    body: &mut [u8],
) -> Vec<u8> {
    let sum = checksum::add(
        body,
        checksum::pseudo_v6(
            &src.octets(),
            &dst.octets(),
            proto::ICMPV6,
            body.len() as u32,
        ),
    );
    body[2..4].copy_from_slice(&checksum::finish(sum).to_be_bytes());
    let eth = ethernet::Repr {
        dst: dst_mac,
        src: src_mac,
        tag: vlan.map(Tag::dot1q),
        ethertype: ethertype::IPV6,
    };
    let mut v = Vec::with_capacity(eth.header_len() + ipv6::HEADER_LEN + body.len());
    eth.emit(&mut v);
    ipv6::Repr {
        src,
        dst,
        next_header: proto::ICMPV6,
        payload_len: body.len(),
        hop_limit: HOP_LIMIT,
        traffic_class: 0,
        flow_label: 0,
    }
    .emit(&mut v);
    v.extend_from_slice(body);
    v
}

/// The IPv6 address of `a`, if it is one.
pub fn v6(a: IpAddr) -> Option<Ipv6Addr> {
    match a {
        IpAddr::V6(v) => Some(v),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse;

    #[test]
    fn test_solicit_parses_back() {
        let src = "fd00::1".parse().unwrap();
        let target = "fd00::2".parse().unwrap();
        let f = solicit([2, 0, 0, 0, 0, 1], None, src, target);
        let p = parse(&f, 0).unwrap();
        assert_eq!(p.key.dst, IpAddr::V6("ff02::1:ff00:2".parse().unwrap()));
        assert_eq!(&f[0..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
        assert_eq!(
            super::parse(&f, &p),
            Ok(Some(Message::Solicit {
                target,
                slla: Some([2, 0, 0, 0, 0, 1])
            }))
        );
    }

    #[test]
    fn test_unicast_solicit_goes_to_the_target() {
        let src = "fd00::1".parse().unwrap();
        let target = "fd00::2".parse().unwrap();
        let f = solicit_unicast([2; 6], [4; 6], None, src, target);
        let p = parse(&f, 0).unwrap();
        assert_eq!(&f[0..6], &[2; 6]);
        assert_eq!(p.key.dst, IpAddr::V6(target));
        assert_eq!(
            super::parse(&f, &p),
            Ok(Some(Message::Solicit {
                target,
                slla: Some([4; 6])
            }))
        );
    }

    #[test]
    fn test_duplicate_address_probe_parses_back_and_must_go_to_the_group() {
        let target: Ipv6Addr = "fd00::2".parse().unwrap();
        let f = solicit([2, 0, 0, 0, 0, 1], None, Ipv6Addr::UNSPECIFIED, target);
        let p = parse(&f, 0).unwrap();
        assert_eq!(
            super::parse(&f, &p),
            Ok(Some(Message::Solicit { target, slla: None }))
        );
        assert!(is_solicited_node(&solicited_node(target)));
        assert!(!is_solicited_node(&"ff02::1".parse().unwrap()));
        // To the target itself: not how a duplicate address probe is sent.
        let mut body = [0u8; NS_NA_LEN];
        body[0] = nd_type::NS;
        body[8..24].copy_from_slice(&target.octets());
        let f = frame(
            [2; 6],
            [4; 6],
            None,
            Ipv6Addr::UNSPECIFIED,
            target,
            &mut body,
        );
        let p = parse(&f, 0).unwrap();
        assert_eq!(super::parse(&f, &p), Err(DropReason::NdMalformed));
    }

    #[test]
    fn test_advert_parses_back_and_bad_checksum_is_refused() {
        let a: Ipv6Addr = "fe80::1".parse().unwrap();
        let b: Ipv6Addr = "fe80::2".parse().unwrap();
        let mut f = advert([2; 6], [4; 6], None, a, b, a, FLAG_ROUTER, Some([4; 6]));
        let p = parse(&f, 0).unwrap();
        assert_eq!(
            super::parse(&f, &p),
            Ok(Some(Message::Advert {
                target: a,
                flags: FLAG_ROUTER,
                tlla: Some([4; 6])
            }))
        );
        let last = f.len() - 1;
        f[last] ^= 1;
        assert_eq!(super::parse(&f, &p), Err(DropReason::NdMalformed));
        let f = advert([2; 6], [4; 6], None, a, b, a, FLAG_SOLICITED, None);
        let p = parse(&f, 0).unwrap();
        assert_eq!(
            super::parse(&f, &p),
            Ok(Some(Message::Advert {
                target: a,
                flags: FLAG_SOLICITED,
                tlla: None
            }))
        );
        // A solicited advertisement to a group answers nobody.
        let f = advert([2; 6], [4; 6], None, a, ALL_NODES, a, FLAG_SOLICITED, None);
        let p = parse(&f, 0).unwrap();
        assert_eq!(super::parse(&f, &p), Err(DropReason::NdMalformed));
    }

    #[test]
    fn test_link_local_from_mac() {
        assert_eq!(
            link_local([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05]),
            "fe80::858:aff:fef4:105".parse::<Ipv6Addr>().unwrap()
        );
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local(&"fd00::1".parse().unwrap()));
    }
}
