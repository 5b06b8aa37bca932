//! A stream of arbitrary frames through the reassembler, with a clock that moves: it never
//! panics, memory stays within its limits, and every completed datagram parses.
#![no_main]
#![forbid(unsafe_code)]

use ferry_datapath::DropCounters;
use ferry_datapath::ipf::{Config, Outcome, Reassembler, refragment};
use ferry_datapath::Packet;
use ferry_datapath::wire::parse;
use libfuzzer_sys::fuzz_target;

mod repair;

fuzz_target!(|data: &[u8]| {
    let config = Config {
        max_datagrams: 8,
        max_bytes: 256 * 1024,
        min_fragment_v4: 68,
        min_fragment_v6: 100,
        ..Config::default()
    };
    let mut r = Reassembler::new(config);
    let mut drops = DropCounters::default();
    let mut now = 0u64;
    let mut out = Vec::new();
    // Frames are length-prefixed (2 bytes) pieces of the input; a third byte moves the clock.
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % 4096;
        now += u64::from(rest[2]) * 500_000_000;
        rest = &rest[3..];
        let mut frame = rest[..len.min(rest.len())].to_vec();
        rest = &rest[frame.len()..];
        repair::repair(&mut frame, rest.first().copied().unwrap_or(3));
        r.expire(now, 4, &mut drops);
        let Ok(p) = parse(&frame, 0) else { continue };
        if p.frag.is_none() {
            continue;
        }
        if let Outcome::Complete(pkt, parsed) = r.process(Packet::new(frame, 0, now), &p, &mut drops) {
            assert!(parse(&pkt.data, 0).is_ok());
            out.clear();
            let _ = refragment(&pkt, &parsed, 1280, &mut out);
        }
        assert!(r.held_datagrams() <= 8);
    }
    r.expire(u64::MAX, usize::MAX, &mut drops);
    assert_eq!(r.held_bytes(), 0);
});
