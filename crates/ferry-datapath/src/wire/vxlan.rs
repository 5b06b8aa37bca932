//! VXLAN header (RFC 7348): 8 bytes after the outer UDP header.

use crate::drop::DropReason;

/// The IANA UDP port for VXLAN.
pub const PORT: u16 = 4789;
/// Header length.
pub const LEN: usize = 8;
/// The "I" flag: the VNI is valid.
const FLAG_VNI: u8 = 0x08;

/// A parsed VXLAN header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// The 24-bit VXLAN network identifier.
    pub vni: u32,
}

impl Repr {
    /// Parses the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<Repr, DropReason> {
        if b.len() < LEN || b[0] & FLAG_VNI == 0 {
            return Err(DropReason::VxlanMalformed);
        }
        Ok(Repr {
            vni: u32::from_be_bytes([0, b[4], b[5], b[6]]),
        })
    }

    /// Writes the header into the first 8 bytes of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[..LEN].copy_from_slice(&[FLAG_VNI, 0, 0, 0, 0, 0, 0, 0]);
        b[4..7].copy_from_slice(&self.vni.to_be_bytes()[1..]);
    }
}

/// The frame a VXLAN datagram carries and its VNI, when `parsed` (of `frame`) is the
/// outer UDP datagram; None when its payload is no VXLAN header and frame.
pub fn inner<'a>(frame: &'a [u8], parsed: &crate::wire::Parsed) -> Option<(&'a [u8], u32)> {
    let payload = frame.get(parsed.l4_off + 8..parsed.ip_end)?;
    let vx = Repr::parse(payload).ok()?;
    Some((payload.get(LEN..)?, vx.vni))
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8] = [0x08, 0, 0, 0, 0xca, 0x11, 0xc0, 0];

    #[test]
    fn test_parse() {
        assert_eq!(Repr::parse(&BYTES), Ok(Repr { vni: 0xca11c0 }));
        assert_eq!(Repr::parse(&BYTES[..7]), Err(DropReason::VxlanMalformed));
        let mut no_flag = BYTES;
        no_flag[0] = 0;
        assert_eq!(Repr::parse(&no_flag), Err(DropReason::VxlanMalformed));
    }

    #[test]
    fn test_emit() {
        let mut b = [0xffu8; 8];
        Repr { vni: 0xca11c0 }.emit(&mut b);
        assert_eq!(b, BYTES);
    }
}
