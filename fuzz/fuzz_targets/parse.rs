//! Any bytes as a frame: parsing never panics, and what it accepts is self-consistent.
#![no_main]
#![forbid(unsafe_code)]

use ferry_datapath::wire::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = parse(data, 0) {
        assert!(p.l3_off <= p.ip_end && p.ip_end <= data.len());
        assert!(p.l4_off <= p.ip_end || !p.is_ip());
    }
});
