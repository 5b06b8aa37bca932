//! Shared by the targets: lets the fuzzer reach past header checks by optionally fixing
//! IP lengths and the IPv4 header checksum of an arbitrary frame.

use ferry_datapath::wire::checksum;

/// Bit 0 of `how`: set the IP length fields from the frame length; bit 1: recompute the
/// IPv4 header checksum.
pub fn repair(frame: &mut [u8], how: u8) {
    if frame.len() < 14 {
        return;
    }
    let l3 = if frame[12..14] == [0x81, 0x00] { 18 } else { 14 };
    if frame.len() < l3 + 2 {
        return;
    }
    let etype = [frame[l3 - 2], frame[l3 - 1]];
    let rest = frame.len() - l3;
    if etype == [0x08, 0x00] && rest >= 20 {
        let ihl = usize::from(frame[l3] & 0x0f) * 4;
        if how & 1 != 0 && rest <= 65535 {
            frame[l3 + 2..l3 + 4].copy_from_slice(&(rest as u16).to_be_bytes());
        }
        if how & 2 != 0 && ihl >= 20 && rest >= ihl {
            checksum::set_ipv4_header(&mut frame[l3..l3 + ihl]);
        }
    } else if etype == [0x86, 0xdd] && rest >= 40 && how & 1 != 0 && rest - 40 <= 65535 {
        frame[l3 + 4..l3 + 6].copy_from_slice(&((rest - 40) as u16).to_be_bytes());
    }
}
