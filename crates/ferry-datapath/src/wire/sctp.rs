//! SCTP packets (RFC 9260): the common header, the chunks conntrack reads, and the
//! CRC32c checksum that covers the whole packet (computed by the `crc32c` crate, with
//! the SSE 4.2 instruction where the CPU has it).

/// The common header's length: source and destination ports, verification tag,
/// checksum.
pub const COMMON_LEN: usize = 12;
/// Where the checksum sits in the common header (little-endian, unlike every other
/// field: RFC 9260 appendix A).
pub const CSUM_AT: usize = 8;

/// Chunk types conntrack reads (RFC 9260 section 3.2).
pub mod chunk {
    pub const DATA: u8 = 0;
    pub const INIT: u8 = 1;
    pub const INIT_ACK: u8 = 2;
    pub const SACK: u8 = 3;
    pub const HEARTBEAT: u8 = 4;
    pub const HEARTBEAT_ACK: u8 = 5;
    pub const ABORT: u8 = 6;
    pub const SHUTDOWN: u8 = 7;
    pub const SHUTDOWN_ACK: u8 = 8;
    pub const ERROR: u8 = 9;
    pub const COOKIE_ECHO: u8 = 10;
    pub const COOKIE_ACK: u8 = 11;
    pub const SHUTDOWN_COMPLETE: u8 = 14;
}

/// The T bit of ABORT and SHUTDOWN COMPLETE: the verification tag is the sender's own,
/// reflected (RFC 9260 section 8.5.1).
pub const FLAG_T: u8 = 0x01;

/// What conntrack needs of one SCTP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The verification tag.
    pub vtag: u32,
    /// The chunk types present, one bit each (bit `t` for type `t` below 32; others are
    /// not recorded).
    pub types: u32,
    /// The flags of the first ABORT or SHUTDOWN COMPLETE.
    pub t_bit: bool,
    /// The Initiate Tag of an INIT or INIT ACK.
    pub initiate_tag: Option<u32>,
    /// How many chunks it has.
    pub chunks: u16,
}

impl Packet {
    /// Whether a chunk of type `t` is present.
    pub fn has(&self, t: u8) -> bool {
        t < 32 && self.types & (1 << t) != 0
    }

    /// Reads the SCTP packet `p` (common header and chunks, nothing after). None when
    /// it is malformed: a common header cut short, no chunk, a chunk shorter than its
    /// header or running past the end, an INIT or INIT ACK shorter than its fixed
    /// fields or bundled with another chunk (RFC 9260 section 6.10).
    pub fn read(p: &[u8]) -> Option<Packet> {
        let vtag = u32::from_be_bytes(p.get(4..8)?.try_into().ok()?);
        let mut at = COMMON_LEN;
        let mut out = Packet {
            vtag,
            types: 0,
            t_bit: false,
            initiate_tag: None,
            chunks: 0,
        };
        while at < p.len() {
            let h = p.get(at..at + 4)?;
            let (ty, flags) = (h[0], h[1]);
            let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if len < 4 || at + len > p.len() {
                return None;
            }
            if ty < 32 {
                out.types |= 1 << ty;
            }
            if matches!(ty, chunk::ABORT | chunk::SHUTDOWN_COMPLETE) && !out.t_bit {
                out.t_bit = flags & FLAG_T != 0;
            }
            if matches!(ty, chunk::INIT | chunk::INIT_ACK) {
                if len < 20 {
                    return None;
                }
                out.initiate_tag = Some(u32::from_be_bytes(p[at + 4..at + 8].try_into().ok()?));
            }
            out.chunks = out.chunks.saturating_add(1);
            // Chunks are padded to four bytes; the last one's padding may be left out.
            at += len.next_multiple_of(4);
        }
        let init = out.has(chunk::INIT) || out.has(chunk::INIT_ACK);
        if out.chunks == 0 || (init && out.chunks > 1) {
            return None;
        }
        Some(out)
    }
}

/// The CRC32c of SCTP packet `p`, its checksum field counted as zero.
pub fn crc(p: &[u8]) -> u32 {
    if p.len() < COMMON_LEN {
        return crc32c::crc32c(p);
    }
    let c = crc32c::crc32c(&p[..CSUM_AT]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &p[COMMON_LEN..])
}

/// Whether `p`'s checksum is right.
pub fn crc_ok(p: &[u8]) -> bool {
    p.len() >= COMMON_LEN && p[CSUM_AT..COMMON_LEN] == crc(p).to_le_bytes()
}

/// Writes `p`'s checksum (after a change of its ports).
pub fn set_crc(p: &mut [u8]) {
    if p.len() >= COMMON_LEN {
        let c = crc(p).to_le_bytes();
        p[CSUM_AT..COMMON_LEN].copy_from_slice(&c);
    }
}

/// An SCTP packet from `sport` to `dport` with tag `vtag` and `chunks` (each a type,
/// flags and value, padded), its checksum set: for tests and replays.
pub fn build(sport: u16, dport: u16, vtag: u32, chunks: &[(u8, u8, &[u8])]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&vtag.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for (ty, flags, value) in chunks {
        p.extend_from_slice(&[*ty, *flags]);
        p.extend_from_slice(&((4 + value.len()) as u16).to_be_bytes());
        p.extend_from_slice(value);
        while p.len() % 4 != 0 {
            p.push(0);
        }
    }
    set_crc(&mut p);
    p
}

/// The fixed fields of an INIT or INIT ACK with Initiate Tag `tag`: a_rwnd, streams and
/// initial TSN after it.
pub fn init_value(tag: u32) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(&tag.to_be_bytes());
    v[4..8].copy_from_slice(&65536u32.to_be_bytes());
    v[8..10].copy_from_slice(&10u16.to_be_bytes());
    v[10..12].copy_from_slice(&10u16.to_be_bytes());
    v[12..16].copy_from_slice(&tag.wrapping_add(1).to_be_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_checksum_is_rfc_9260s_crc32c() {
        // RFC 3720's CRC32c check value: 32 bytes of zeros.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        let mut p = build(5000, 80, 7, &[(chunk::DATA, 3, b"hello")]);
        assert!(crc_ok(&p));
        p[0] ^= 1;
        assert!(!crc_ok(&p), "a port changed");
        set_crc(&mut p);
        assert!(crc_ok(&p));
        assert!(!crc_ok(&p[..8]));
    }

    #[test]
    fn test_chunks_are_read_and_a_malformed_packet_refused() {
        let init = build(1, 2, 0, &[(chunk::INIT, 0, &init_value(0xdead_beef))]);
        let r = Packet::read(&init).unwrap();
        assert_eq!(
            (r.vtag, r.initiate_tag, r.chunks),
            (0, Some(0xdead_beef), 1)
        );
        assert!(r.has(chunk::INIT) && !r.has(chunk::DATA));

        let bundle = build(
            1,
            2,
            9,
            &[
                (chunk::SACK, 0, &[0; 12]),
                (chunk::DATA, 3, b"abc"),
                (chunk::ABORT, 1, &[]),
            ],
        );
        let r = Packet::read(&bundle).unwrap();
        assert!(r.has(chunk::SACK) && r.has(chunk::DATA) && r.has(chunk::ABORT));
        assert!(r.t_bit && r.chunks == 3);

        assert_eq!(Packet::read(&bundle[..11]), None, "common header cut short");
        assert_eq!(Packet::read(&bundle[..12]), None, "no chunk");
        assert_eq!(
            Packet::read(&bundle[..14]),
            None,
            "a chunk header cut short"
        );
        let mut long = bundle.clone();
        long[14..16].copy_from_slice(&200u16.to_be_bytes());
        assert_eq!(Packet::read(&long), None, "a chunk past the end");
        let mut tiny = bundle.clone();
        tiny[14..16].copy_from_slice(&2u16.to_be_bytes());
        assert_eq!(Packet::read(&tiny), None, "a chunk shorter than its header");
        let init_and_data = build(
            1,
            2,
            0,
            &[(chunk::INIT, 0, &init_value(5)), (chunk::DATA, 3, b"x")],
        );
        assert_eq!(Packet::read(&init_and_data), None, "INIT bundled");
        let short_init = build(1, 2, 0, &[(chunk::INIT, 0, &[0; 8])]);
        assert_eq!(Packet::read(&short_init), None, "INIT without its fields");
    }
}
