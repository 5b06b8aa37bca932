//! Internet checksums (RFC 1071): full, pseudo-header, incremental (RFC 1624), and the
//! completion of a partial checksum announced by a virtio-net header.
//!
//! This is the only checksum code in ferry. Sums are carried unfolded in a `u64` so that
//! pieces (pseudo-header, header, payload) can be added before one final [`finish`].

use std::net::IpAddr;

use crate::drop::DropReason;

/// Adds `data` to a running sum, as big-endian 16-bit words. Only the last piece added
/// may have an odd length (its final byte is padded with zero, as RFC 1071 says).
///
/// The words are summed in the machine's own byte order, 32 bits at a time into four
/// 64-bit sums that the compiler turns into vector additions, and the folded result is
/// byte-swapped once at the end: a ones' complement sum does not depend on the byte
/// order it is taken in (RFC 1071, section 2(B)). About three times as fast as summing
/// big-endian words, and every packet ferry segments is summed whole. Pieces shorter
/// than `SHORT` (headers) are summed as big-endian words, which is quicker for them.
#[inline]
pub fn add(data: &[u8], sum: u64) -> u64 {
    if data.len() < SHORT {
        add_short(data, sum)
    } else {
        add_long(data, sum)
    }
}

/// [`add`] for a piece of [`SHORT`] bytes or more.
fn add_long(data: &[u8], sum: u64) -> u64 {
    let mut lanes = [0u64; 4];
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let w = [c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]];
            *lane += u64::from(u32::from_le_bytes(w));
        }
    }
    let mut native = lanes.iter().sum::<u64>();
    let mut rest = chunks.remainder();
    while let [a, b, c, d, more @ ..] = rest {
        native += u64::from(u32::from_le_bytes([*a, *b, *c, *d]));
        rest = more;
    }
    if let [a, b, more @ ..] = rest {
        native += u64::from(u16::from_le_bytes([*a, *b]));
        rest = more;
    }
    if let [last] = rest {
        // The high byte of a big-endian word is the low byte of a little-endian one.
        native += u64::from(*last);
    }
    // Folded, `native` is zero only when every word was; swapped, it is the big-endian
    // sum, congruent modulo 0xffff to what summing big-endian words would have given.
    sum + u64::from(fold(native).swap_bytes())
}

/// Pieces shorter than this are summed by [`add_short`].
const SHORT: usize = 48;

/// [`add`] for a short piece: big-endian words, 64 bits at a time.
#[inline(always)]
fn add_short(data: &[u8], mut sum: u64) -> u64 {
    let mut rest = data;
    while let [a, b, c, d, e, f, g, h, more @ ..] = rest {
        let v = u64::from_be_bytes([*a, *b, *c, *d, *e, *f, *g, *h]);
        sum += (v >> 32) + (v & 0xffff_ffff);
        rest = more;
    }
    if let [a, b, c, d, more @ ..] = rest {
        sum += u64::from(u32::from_be_bytes([*a, *b, *c, *d]));
        rest = more;
    }
    if let [a, b, more @ ..] = rest {
        sum += u64::from(u16::from_be_bytes([*a, *b]));
        rest = more;
    }
    if let [last] = rest {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a running sum to 16 bits (ones' complement addition), not complemented.
#[inline]
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The checksum value for a running sum: folded and complemented.
#[inline]
pub fn finish(sum: u64) -> u16 {
    !fold(sum)
}

/// The checksum of `data` alone (e.g. an IPv4 header with its checksum field zeroed).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(add(data, 0))
}

/// The IPv4 pseudo-header sum for a transport checksum.
#[inline]
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4_len: u16) -> u64 {
    add(&src, 0) + add(&dst, 0) + u64::from(proto) + u64::from(l4_len)
}

/// The IPv6 pseudo-header sum for a transport checksum (RFC 8200 section 8.1).
#[inline]
pub fn pseudo_v6(src: &[u8; 16], dst: &[u8; 16], next_header: u8, l4_len: u32) -> u64 {
    add(src, 0)
        + add(dst, 0)
        + u64::from(next_header)
        + u64::from(l4_len >> 16)
        + u64::from(l4_len & 0xffff)
}

/// The pseudo-header sum for a transport segment of `l4_len` bytes and protocol `proto`
/// from `src` to `dst`, for either family: IPv4's when both addresses are IPv4, else
/// IPv6's (RFC 8200 section 8.1), an IPv4 address taken in its IPv4-mapped form.
#[inline]
pub fn pseudo(src: IpAddr, dst: IpAddr, proto: u8, l4_len: usize) -> u64 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => pseudo_v4(s.octets(), d.octets(), proto, l4_len as u16),
        (s, d) => pseudo_v6(&v6_octets(s), &v6_octets(d), proto, l4_len as u32),
    }
}

/// The 16 bytes of `a`, IPv4 in its IPv4-mapped form.
fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The pseudo-header sum for a transport segment of `l4_len` bytes and protocol `proto`,
/// with the addresses of the IP header `ip` (at least its fixed part; IPv6 when `v6`).
/// For IPv6 that is the destination in the fixed header, as Linux's conntrack takes it,
/// even when a routing header with segments left names another final destination (only
/// segmentation, in `gso`, reads that one).
#[inline]
pub fn pseudo_header(ip: &[u8], v6: bool, proto: u8, l4_len: usize) -> u64 {
    if v6 {
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&ip[8..24]);
        dst.copy_from_slice(&ip[24..40]);
        pseudo_v6(&src, &dst, proto, l4_len as u32)
    } else {
        pseudo_v4(
            [ip[12], ip[13], ip[14], ip[15]],
            [ip[16], ip[17], ip[18], ip[19]],
            proto,
            l4_len as u16,
        )
    }
}

/// True when a transport segment's checksum is right: the whole segment, its checksum
/// field included, sums with its pseudo-header sum to zero.
#[inline]
pub fn verify(segment: &[u8], pseudo: u64) -> bool {
    finish(add(segment, pseudo)) == 0
}

/// RFC 1624 eqn. 3: the checksum after one 16-bit word changed from `old` to `new`.
#[inline]
pub fn update16(csum: u16, old: u16, new: u16) -> u16 {
    let sum = u64::from(!csum) + u64::from(!old) + u64::from(new);
    !fold(sum)
}

/// RFC 1624 for a run of bytes (even length, 16-bit aligned in the checksummed data)
/// that changed from `old` to `new`; used for addresses and ports.
#[inline]
pub fn update(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    apply(csum, delta(old, new))
}

/// The change of a run of bytes (even length, 16-bit aligned in the checksummed data)
/// from `old` to `new`, as RFC 1624 eqn. 3 adds it: the sum of `!old + new` over its
/// 16-bit words, unfolded. Changes of several fields add up, and [`apply`] takes their sum
/// into a checksum with one fold: the same result as updating it field by field.
#[inline]
pub fn delta(old: &[u8], new: &[u8]) -> u64 {
    debug_assert_eq!(old.len(), new.len());
    debug_assert!(old.len().is_multiple_of(2));
    let mut sum = 0;
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        sum += u64::from(!u16::from_be_bytes([o[0], o[1]]))
            + u64::from(u16::from_be_bytes([n[0], n[1]]));
    }
    sum
}

/// RFC 1624 eqn. 3: the checksum after the changes summed in `delta` (see [`delta`]). A
/// zero delta leaves it as it is.
#[inline]
pub fn apply(csum: u16, delta: u64) -> u16 {
    !fold(u64::from(!csum) + delta)
}

/// Completes a partial checksum as the kernel announces it with `VIRTIO_NET_HDR_F_NEEDS_CSUM`:
/// the field at `csum_start + csum_offset` already holds the folded pseudo-header sum;
/// everything from `csum_start` to the end is summed and the complement stored there.
pub fn complete_partial(
    frame: &mut [u8],
    csum_start: usize,
    csum_offset: usize,
) -> Result<(), DropReason> {
    let field = csum_start
        .checked_add(csum_offset)
        .ok_or(DropReason::CsumOffloadInvalid)?;
    if field.checked_add(2).is_none_or(|end| end > frame.len()) {
        return Err(DropReason::CsumOffloadInvalid);
    }
    let mut c = finish(add(&frame[csum_start..], 0));
    // A UDP checksum of zero means "none"; every L4 protocol accepts 0xffff for it.
    if c == 0 {
        c = 0xffff;
    }
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Computes and stores the IPv4 header checksum of `header` (IHL*4 bytes).
#[inline]
pub fn set_ipv4_header(header: &mut [u8]) {
    header[10] = 0;
    header[11] = 0;
    let c = checksum(header);
    header[10..12].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference implementation straight from RFC 1071, 16 bits at a time.
    fn naive(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for w in data.chunks(2) {
            let v = if w.len() == 2 {
                u16::from_be_bytes([w[0], w[1]])
            } else {
                u16::from(w[0]) << 8
            };
            sum += u32::from(v);
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn test_rfc1071_example() {
        // RFC 1071 section 3 example: words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add(&data, 0)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn test_ipv4_header() {
        // A real IPv4 header (checksum 0xb861), from a well-known example.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(
            checksum(&h),
            0,
            "a header with a valid checksum sums to zero"
        );
        set_ipv4_header(&mut h);
        assert_eq!(u16::from_be_bytes([h[10], h[11]]), 0xb861);
    }

    proptest::proptest! {
        /// Any data cut into pieces of even length (and a last one of any length) sums
        /// to the reference checksum, whatever the running sum before.
        #[test]
        fn test_pieces_match_reference(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..3000),
            cuts in proptest::collection::vec(0usize..3000, 0..4),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len()) & !1).collect();
            cuts.sort_unstable();
            let mut sum = 0;
            let mut at = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                sum = add(&data[at..c], sum);
                at = c;
            }
            proptest::prop_assert_eq!(finish(sum), naive(&data));
        }

        /// Changes to several fields, summed by `delta` and taken in by one `apply`, give
        /// the checksum of the changed data, as updating field by field does.
        #[test]
        fn test_summed_changes_match_full(
            data in proptest::collection::vec(proptest::num::u8::ANY, 40..200),
            fields in proptest::collection::vec((0usize..80, 1usize..9, proptest::num::u64::ANY), 0..5),
        ) {
            let mut data = data;
            let before = checksum(&data);
            let (mut summed, mut stepwise) = (0, before);
            for (at, words, bits) in fields {
                let at = (at.min(data.len() - 2)) & !1;
                let end = (at + 2 * words).min(data.len() & !1);
                let old = data[at..end].to_vec();
                let new: Vec<u8> = (0..end - at).map(|i| (bits >> (8 * (i % 8))) as u8).collect();
                data[at..end].copy_from_slice(&new);
                summed += delta(&old, &new);
                stepwise = update(stepwise, &old, &new);
            }
            proptest::prop_assert_eq!(apply(before, summed), checksum(&data));
            proptest::prop_assert_eq!(stepwise, checksum(&data));
        }
    }

    #[test]
    fn test_odd_lengths_match_reference() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1001).collect();
        for len in 0..data.len() {
            assert_eq!(checksum(&data[..len]), naive(&data[..len]), "len {len}");
        }
    }

    #[test]
    fn test_incremental_matches_full() {
        let mut data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        let before = checksum(&data);
        let old = [data[12], data[13], data[14], data[15]];
        let new = [10, 244, 1, 5];
        data[12..16].copy_from_slice(&new);
        assert_eq!(update(before, &old, &new), checksum(&data));
        let old16 = u16::from_be_bytes([data[20], data[21]]);
        let before = checksum(&data);
        data[20..22].copy_from_slice(&8080u16.to_be_bytes());
        assert_eq!(update16(before, old16, 8080), checksum(&data));
    }

    #[test]
    fn test_verify_with_header_addresses() {
        use crate::wire::build::{self, IpOpts, tcp_flags::SYN};
        use crate::wire::parse::{L3, parse};
        for (src, dst) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let mut f = build::tcp(
                src.parse().unwrap(),
                dst.parse().unwrap(),
                40000,
                80,
                1000,
                0,
                SYN,
                b"abc",
                &IpOpts::default(),
            );
            let p = parse(&f, 0).unwrap();
            let len = p.ip_end - p.l4_off;
            let pseudo = pseudo_header(&f[p.l3_off..], p.l3 == L3::Ipv6, 6, len);
            assert!(verify(&f[p.l4_off..p.ip_end], pseudo), "{src}");
            let by_address = super::pseudo(p.key.src.ip(), p.key.dst.ip(), 6, len);
            assert_eq!(by_address, pseudo, "{src}");
            f[p.ip_end - 1] ^= 1;
            assert!(!verify(&f[p.l4_off..p.ip_end], pseudo), "{src}");
        }
    }

    #[test]
    fn test_complete_partial() {
        // UDP over IPv4 with NEEDS_CSUM: the field holds the folded pseudo-header sum.
        let src = [10, 0, 0, 1];
        let dst = [10, 0, 0, 2];
        let mut udp = vec![
            0x30, 0x39, 0x00, 0x35, 0x00, 0x0d, 0, 0, b'h', b'e', b'l', b'l', b'o',
        ];
        let pseudo = fold(pseudo_v4(src, dst, 17, udp.len() as u16));
        udp[6..8].copy_from_slice(&pseudo.to_be_bytes());
        let mut frame = vec![0u8; 34];
        frame.extend_from_slice(&udp);
        complete_partial(&mut frame, 34, 6).unwrap();
        let got = u16::from_be_bytes([frame[40], frame[41]]);
        let mut zeroed = udp.clone();
        zeroed[6] = 0;
        zeroed[7] = 0;
        assert_eq!(
            got,
            finish(add(&zeroed, pseudo_v4(src, dst, 17, udp.len() as u16)))
        );
        assert_eq!(
            complete_partial(&mut frame, 40, 10),
            Err(DropReason::CsumOffloadInvalid)
        );
        assert_eq!(
            complete_partial(&mut frame, usize::MAX, 10),
            Err(DropReason::CsumOffloadInvalid)
        );
    }
}
