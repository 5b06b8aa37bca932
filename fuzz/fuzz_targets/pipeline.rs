//! Arbitrary frames, ports, offload state and times through a whole node pipeline with a
//! VXLAN overlay (its uplink taking GSO, so UDP GSO super-frames are made and taken
//! apart): it never panics, nothing plain it sends exceeds the egress MTU, and every
//! segment a GSO packet it sends would be cut into fits it.
#![no_main]
#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};

use ferry_datapath::Packet;
use ferry_datapath::{Pipeline, Tables, TablesSpec, Trace};
use ferry_datapath::wire::parse;
use libfuzzer_sys::fuzz_target;

mod repair;

const TABLES: &str = r#"{
  "ports": [
    {"name": "uplink", "kind": "uplink", "mac": "02:00:00:00:00:01", "mtu": 1500, "gro": true, "gso": true, "addresses": ["192.168.0.1/24", "fd00::1/64"]},
    {"name": "pod", "mac": "02:00:00:00:00:02", "mtu": 1400, "addresses": ["169.254.1.1", "fe80::1"]},
    {"name": "tap", "mac": "02:00:00:00:00:03", "mtu": 9000, "gso": true}
  ],
  "routes": [
    {"prefix": "10.0.0.0/24", "port": "pod", "next_hop_mac": "02:00:00:00:00:10"},
    {"prefix": "10.0.1.0/24", "port": "tap", "next_hop_mac": "02:00:00:00:00:11"},
    {"prefix": "fd10::/64", "port": "pod", "next_hop_mac": "02:00:00:00:00:10"},
    {"prefix": "0.0.0.0/0", "port": "uplink", "next_hop_mac": "02:00:00:00:00:fe"},
    {"prefix": "::/0", "port": "uplink", "next_hop_mac": "02:00:00:00:00:fe"}
  ],
  "ipf": {"max_datagrams": 16, "min_fragment_v4": 68, "min_fragment_v6": 100},
  "node": {"name": "n1", "addresses": ["192.168.0.1", "fd00::1"]},
  "overlay": {"vni": 4096, "uplink": "uplink", "mode": "always"},
  "nodes": [{"name": "n2", "address": "192.168.0.2", "pod_cidrs": ["10.0.2.0/24", "fd20::/64"], "mac": "02:00:00:00:00:20"}]
}"#;

fn tables() -> Arc<Tables> {
    static T: OnceLock<Arc<Tables>> = OnceLock::new();
    T.get_or_init(|| {
        let spec: TablesSpec = serde_saphyr::from_str(TABLES).expect("fuzz tables parse");
        Arc::new(spec.compile().expect("fuzz tables compile"))
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let t = tables();
    let mut p = Pipeline::new(t.clone());
    let mut out = Vec::new();
    let mut now = 0u64;
    let mut rest = data;
    // Each packet: port, gso type, gso size (2), flags, time step, length (2), frame.
    while rest.len() >= 8 {
        let (h, tail) = rest.split_at(8);
        let len = usize::from(u16::from_le_bytes([h[6], h[7]])) % 9000;
        let frame = &tail[..len.min(tail.len())];
        rest = &tail[frame.len()..];
        now += u64::from(h[5]) * 100_000_000;
        let mut frame = frame.to_vec();
        repair::repair(&mut frame, h[0] >> 4);
        let mut pkt = Packet::new(frame, u16::from(h[0] % 4), now);
        pkt.meta.vnet.gso_type = h[1];
        pkt.meta.vnet.gso_size = u16::from_le_bytes([h[2], h[3]]);
        pkt.meta.vnet.flags = h[4];
        out.clear();
        p.tick(now, &mut out);
        p.process(pkt, &mut out, &mut Trace::disabled());
        for (port, o) in &out {
            let port = &t.ports[usize::from(*port)];
            let mtu = usize::from(port.mtu);
            let v = o.meta.vnet;
            if !port.gso || !v.is_gso() {
                assert!(o.data.len() <= mtu + 18, "{} bytes out of {}", o.data.len(), port.name);
                continue;
            }
            // Only GSO requests that match their packet leave.
            let op = parse(&o.data, 0).expect("a GSO packet ferry sends parses");
            let l4_hdr = match (op.proto, o.data.get(op.l4_off + 12)) {
                (17, _) => 8,
                (6, Some(off)) => usize::from(off >> 4) * 4,
                _ => panic!("a GSO packet of protocol {} out of {}", op.proto, port.name),
            };
            let segment = op.l4_off - op.l3_off + l4_hdr + usize::from(v.gso_size);
            assert!(segment <= mtu, "segments of {segment} bytes out of {}", port.name);
        }
    }
});
