//! Arbitrary bytes as a handed-over state: decoding never panics; a state that decodes
//! encodes to bytes that decode to it again, and restores into a new pipeline of its
//! node without panicking, all or nothing, as a handover's state and as a checkpoint
//! of any age.
#![no_main]
#![forbid(unsafe_code)]

use std::sync::Arc;

use ferry_datapath::handover::{RestoreOptions, decode, encode};
use ferry_datapath::{MacAddr, NodeSpec, Pipeline, PortKind, PortSpec, TablesSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(state) = decode(data) else { return };
    let mut again = decode(&encode(&state)).expect("what decoded encodes");
    // Written in the current version whatever it was read from.
    again.format = state.format;
    assert_eq!(again, state);
    let spec = TablesSpec {
        ports: vec![PortSpec {
            name: "eth0".into(),
            kind: PortKind::Uplink,
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            addresses: vec!["192.168.50.10/24".parse().unwrap()],
            ..PortSpec::default()
        }],
        node: NodeSpec {
            name: state.meta.node.clone(),
            ..NodeSpec::default()
        },
        ..TablesSpec::default()
    };
    let Ok(tables) = spec.compile() else { return };
    let tables = Arc::new(tables);
    // As a handover gives it, and as a checkpoint of an age the bytes choose (any, up
    // to u64::MAX) restored on a young clock.
    let age = data.iter().fold(0u64, |a, b| a.rotate_left(8) ^ u64::from(*b));
    for options in [RestoreOptions::default(), RestoreOptions::checkpoint(age)] {
        let mut p = Pipeline::new(Arc::clone(&tables));
        let now = if options.stale { 1 << 28 } else { 1 << 40 };
        match p.restore_state_with(&state, now, options) {
            Ok(r) => {
                assert_eq!(r.connections, p.conntrack().len());
                assert!(r.connections + r.dropped.total() >= state.connections.len());
                if options.stale {
                    assert_eq!(p.reassembler().held_datagrams(), 0);
                }
            }
            Err(_) => {
                assert!(p.conntrack().is_empty() && p.neighbours().is_empty());
                assert_eq!(p.reassembler().held_datagrams(), 0);
            }
        }
    }
});
