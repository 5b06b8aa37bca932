//! Arbitrary frames with arbitrary GSO requests: segmentation never panics and every
//! segment it produces parses; TCP segments fit the MTU, UDP ones carry at most gso_size
//! bytes (USO is cut at gso_size whatever the MTU).
#![no_main]
#![forbid(unsafe_code)]

use ferry_datapath::gso::segment;
use ferry_datapath::Packet;
use ferry_datapath::wire::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (ctl, frame) = data.split_at(5);
    let Ok(p) = parse(frame, 0) else { return };
    let mut pkt = Packet::new(frame.to_vec(), 0, 0);
    pkt.meta.vnet.gso_type = ctl[0];
    pkt.meta.vnet.gso_size = u16::from_le_bytes([ctl[1], ctl[2]]);
    let mtu = 68 + usize::from(u16::from_le_bytes([ctl[3], ctl[4]]) % 9000);
    let mut out = Vec::new();
    if segment(&pkt, &p, mtu, &mut out).is_ok() {
        for s in &out {
            let q = parse(&s.data, 0).expect("segments parse");
            if q.proto == 17 {
                let payload = q.ip_end - q.l4_off - 8;
                assert!(payload <= usize::from(pkt.meta.vnet.gso_size));
            } else {
                assert!(q.ip_len() <= mtu);
            }
        }
    }
});
