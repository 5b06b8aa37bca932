//! IPv6 extension headers (RFC 8200 section 4): the numbers ferry knows, the one walk over
//! a chain of them, and the fragment header.
//!
//! [`Walker`] is the only code that steps from one extension header to the next: the
//! parser walks a packet's chain with it once and records in [`super::Parsed`] what later
//! stages need (the fragment header, where the unfragmentable part ends, the routing
//! header), and the ICMP error code walks a quoted packet's chain with it.

/// Hop-by-hop options; only ever the first header after the fixed one.
pub const HOP_BY_HOP: u8 = 0;
/// Routing header.
pub const ROUTING: u8 = 43;
/// Fragment header.
pub const FRAGMENT: u8 = 44;
/// Authentication header (RFC 4302); its length counts 4-byte units.
pub const AUTH: u8 = 51;
/// No next header.
pub const NO_NEXT: u8 = 59;
/// Destination options.
pub const DEST_OPTS: u8 = 60;

/// Length of the fixed IPv6 header, where the chain starts.
const FIXED_LEN: usize = 40;
/// Offset of the next-header field in the fixed IPv6 header.
pub const FIXED_NEXT_HEADER: usize = 6;
/// Length of a fragment header.
pub const FRAGMENT_LEN: usize = 8;

/// Routing types whose final destination ferry reads.
pub mod routing_type {
    /// Mobile IPv6 type 2 routing header (RFC 6275): one address, the final destination.
    pub const TYPE_2: u8 = 2;
    /// Segment Routing Header (RFC 8754): the final destination is Segment List\[0\].
    pub const SRH: u8 = 4;
}

/// True for the extension headers ferry walks through; any other next header ends the
/// chain (the upper-layer header, or one ferry does not look into).
#[inline]
pub fn is_walked(next_header: u8) -> bool {
    matches!(
        next_header,
        HOP_BY_HOP | ROUTING | FRAGMENT | AUTH | DEST_OPTS
    )
}

/// Length of the extension header of type `kind` (one that [`is_walked`]) at the start
/// of `h`, read from its length field; `None` when it does not fit in `h`, or when an
/// authentication header gives a length shorter than its own fixed fields.
#[inline]
pub fn header_len(kind: u8, h: &[u8]) -> Option<usize> {
    let len = match kind {
        FRAGMENT => FRAGMENT_LEN,
        AUTH => match *h.get(1)? {
            0 => return None,
            units => (usize::from(units) + 2) * 4,
        },
        _ => (usize::from(*h.get(1)?) + 1) * 8,
    };
    (len <= h.len()).then_some(len)
}

/// One extension header of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Its type: the next-header value that named it.
    pub kind: u8,
    /// Offset of its first byte (its own next-header field) from the fixed header.
    pub off: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// Why a walk stopped before the end of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The next header does not fit in the bytes walked (or gives an impossible length).
    Truncated,
    /// A hop-by-hop header that is not the first after the fixed header (RFC 8200
    /// section 4.3).
    MisplacedHopByHop,
}

/// A walk over the extension headers of an IPv6 packet, in order, up to the first header
/// that is not one ([`is_walked`]). It knows nothing of fragments: the caller stops at a
/// fragment header whose offset is not zero, as what follows it is data.
#[derive(Clone, Debug)]
pub struct Walker<'a> {
    ip: &'a [u8],
    next: u8,
    off: usize,
}

impl<'a> Walker<'a> {
    /// A walk over the chain of `ip`, an IPv6 packet from its fixed header on. A slice
    /// shorter than the fixed header has no chain.
    #[inline]
    pub fn new(ip: &'a [u8]) -> Walker<'a> {
        match ip.get(FIXED_NEXT_HEADER) {
            Some(&next) if ip.len() >= FIXED_LEN => Walker {
                ip,
                next,
                off: FIXED_LEN,
            },
            _ => Walker {
                ip,
                next: NO_NEXT,
                off: ip.len(),
            },
        }
    }

    /// The next header named so far: after the walk, the upper-layer protocol.
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.next
    }

    /// Offset (from the fixed header) of the header [`Self::next_header`] names: after
    /// the walk, where the upper-layer header starts.
    #[inline]
    pub fn offset(&self) -> usize {
        self.off
    }

    /// Steps over the next extension header: `Ok(None)` at the end of the chain. After an
    /// error the walk stays where it was.
    #[inline]
    pub fn step(&mut self) -> Result<Option<Header>, Error> {
        let kind = self.next;
        if !is_walked(kind) {
            return Ok(None);
        }
        if kind == HOP_BY_HOP && self.off != FIXED_LEN {
            return Err(Error::MisplacedHopByHop);
        }
        let h = &self.ip[self.off..];
        let len = header_len(kind, h).ok_or(Error::Truncated)?;
        let header = Header {
            kind,
            off: self.off,
            len,
        };
        self.next = h[0];
        self.off += len;
        Ok(Some(header))
    }
}

/// A fragment header (RFC 8200 section 4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// The header after it (in a first fragment; the first header of the fragmentable
    /// part).
    pub next_header: u8,
    /// Offset of the fragment's data in the datagram, in bytes (a multiple of 8).
    pub offset: u16,
    /// More fragments follow (the M flag).
    pub more: bool,
    /// Identification.
    pub id: u32,
}

impl Fragment {
    /// Reads the fragment header at the start of `h`; `None` when it is shorter.
    #[inline]
    pub fn parse(h: &[u8]) -> Option<Fragment> {
        let h = h.get(..FRAGMENT_LEN)?;
        let word = u16::from_be_bytes([h[2], h[3]]);
        Some(Fragment {
            next_header: h[0],
            offset: word & !7,
            more: word & 1 != 0,
            id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        })
    }

    /// Appends the 8-byte header to `v` (reserved fields zero).
    pub fn emit(&self, v: &mut Vec<u8>) {
        let word = (self.offset & !7) | u16::from(self.more);
        v.extend_from_slice(&[self.next_header, 0]);
        v.extend_from_slice(&word.to_be_bytes());
        v.extend_from_slice(&self.id.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed header naming hop-by-hop, then hop-by-hop (8), destination options (16),
    /// authentication (12) and a fragment header before UDP.
    fn chain() -> Vec<u8> {
        let mut ip = vec![0u8; FIXED_LEN];
        ip[0] = 0x60;
        ip[FIXED_NEXT_HEADER] = HOP_BY_HOP;
        ip.extend_from_slice(&[DEST_OPTS, 0, 1, 4, 0, 0, 0, 0]);
        ip.extend_from_slice(&[AUTH, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip.extend_from_slice(&[FRAGMENT, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip.extend_from_slice(&[17, 0, 0x00, 0x09, 0, 0, 0, 42]);
        ip
    }

    #[test]
    fn test_walk() {
        let ip = chain();
        let mut w = Walker::new(&ip);
        let mut seen = Vec::new();
        while let Some(h) = w.step().unwrap() {
            seen.push((h.kind, h.off, h.len));
        }
        assert_eq!(
            seen,
            [
                (HOP_BY_HOP, 40, 8),
                (DEST_OPTS, 48, 16),
                (AUTH, 64, 12),
                (FRAGMENT, 76, 8)
            ]
        );
        assert_eq!((w.next_header(), w.offset()), (17, 84));
    }

    #[test]
    fn test_walk_errors() {
        let ip = chain();
        // Cut inside the authentication header.
        let mut w = Walker::new(&ip[..70]);
        assert!(w.step().unwrap().is_some() && w.step().unwrap().is_some());
        assert_eq!(w.step(), Err(Error::Truncated));
        assert_eq!((w.next_header(), w.offset()), (AUTH, 64));
        // Hop-by-hop after another header.
        let mut late = ip.clone();
        late[40] = HOP_BY_HOP;
        let mut w = Walker::new(&late);
        assert!(w.step().unwrap().is_some());
        assert_eq!(w.step(), Err(Error::MisplacedHopByHop));
        // An authentication header of length 0 is shorter than its fixed fields.
        assert_eq!(header_len(AUTH, &[0; 12]), None);
        assert_eq!(
            header_len(AUTH, &[0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Some(12)
        );
        assert_eq!(Walker::new(&ip[..10]).step(), Ok(None));
    }

    #[test]
    fn test_fragment_parse_and_emit() {
        let bytes = [17, 0, 0x00, 0x09, 0, 0, 0, 42];
        let f = Fragment::parse(&bytes).unwrap();
        assert_eq!(
            f,
            Fragment {
                next_header: 17,
                offset: 8,
                more: true,
                id: 42
            }
        );
        let mut v = Vec::new();
        f.emit(&mut v);
        assert_eq!(v, bytes);
        assert_eq!(Fragment::parse(&bytes[..7]), None);
    }
}
