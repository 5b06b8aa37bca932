//! A pre-copy through real packets: the base saved a part at a time while the old
//! pipeline forwards and its connections change, then the changes; the base and the
//! changes restored into a new pipeline make the same state as one whole save, and the
//! connections continue there as in the old one.

use super::handover_tests::*;
use super::test_support::*;
use super::*;
use crate::handover::{RestoreError, SavedState, decode, encode};

/// Saves `old`'s base at `now` a part of `part` slots at a time, calling `between`
/// after each part with its number (the worker forwarding between the parts), then
/// once more for every call left of `calls`.
fn base_in_parts(
    old: &mut Pipeline,
    now: u64,
    part: usize,
    calls: usize,
    mut between: impl FnMut(&mut Pipeline, usize),
) -> SavedState {
    old.track_changes();
    let mut base = SavedState::default();
    let mut from = Some(0);
    let mut called = 0;
    while let Some(f) = from {
        from = old.save_base_into(now, f, part, &mut base);
        between(old, called);
        called += 1;
    }
    for n in called..calls {
        between(old, n);
    }
    assert!(old.is_tracking());
    decode(&encode(&base)).unwrap()
}

#[test]
fn test_a_base_and_its_changes_make_the_state_a_whole_save_makes() {
    for part in [1, 2, 3, 1000] {
        let (mut old, next) = opened();
        let (early, mut rest): (Next, Next) = next.into_iter().partition(|(c, _, _)| *c == "tcp4");
        rest.retain(|(c, _, _)| *c != "echo");
        let mut made = Next::new();
        let base = base_in_parts(&mut old, 5 * SEC, part, 3, |p, n| match n {
            // A connection changes, one is made, one is removed.
            0 => {
                for (_, port, frame) in &early {
                    forward(p, port, frame.clone());
                }
            }
            1 => handshake(
                p,
                "tcp4 again",
                ("pod-a", "10.244.1.5", 40002, from_pod(1, 5)),
                ("pod-b", "10.96.0.10", 80, from_pod(1, 6)),
                ("10.244.1.6", 8080, "10.244.1.5", 40002),
                [same as fn(Vec<u8>) -> Vec<u8>, same],
                &mut made,
            ),
            2 => {
                let n = p
                    .conntrack_mut()
                    .retain(|e| e.original().proto != proto::ICMP);
                assert_eq!(n, 1);
            }
            _ => {}
        });
        assert!(
            base.affinity.is_empty()
                && base.neighbours.is_empty()
                && base.datagrams.is_empty()
                && base.removed.is_none(),
            "a base holds connections only"
        );
        let changes = old.save_changes(5 * SEC);
        assert!(!old.is_tracking(), "saving the changes ends the pre-copy");
        let changes = decode(&encode(&changes)).unwrap();
        let removed = changes
            .removed
            .as_ref()
            .expect("changes, not a whole state");
        if part == 1000 {
            // One part, saved before anything changed: the base holds the echo.
            assert_eq!(base.connections.len(), 6, "part of {part}");
        }
        assert_eq!(removed.len(), 1, "the echo, part of {part}");
        assert_eq!(removed[0].proto, proto::ICMP);
        assert_eq!(
            changes.connections.len(),
            2,
            "only the connection that changed and the new one (part of {part})"
        );
        assert_eq!(
            (
                changes.affinity.len(),
                changes.neighbours.len(),
                changes.datagrams.len()
            ),
            (1, 2, 1),
            "the rest of the state whole"
        );

        let mut new = fresh(services(true), false);
        new.restore_state(&base, 20 * SEC).unwrap();
        let r = new.apply_changes(&changes, 20 * SEC).unwrap();
        assert_eq!((r.connections, r.affinity, r.datagrams), (2, 1, 1));
        assert_eq!(
            ordered(new.save_state(20 * SEC)),
            ordered(old.save_state(5 * SEC)),
            "part of {part}"
        );
        rest.extend(made);
        continues(&mut old, &mut new, rest);
    }
}

/// Node 1 with room for `max` connections; its neighbours learnt when `learnt`.
fn small_node(max: usize, learnt: bool) -> Pipeline {
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.services = services(true);
    spec.ct.max_entries = Some(max);
    let mut p = compiled(&spec);
    if learnt {
        learn(&mut p, 1, "192.168.50.1", GW_MAC);
        learn(&mut p, 1, "192.168.50.20", uplink_mac(2));
    }
    p
}

/// A UDP datagram of flow `port` from pod a to node 2's pod, or its answer.
fn udp_flow(port: u16, answer: bool) -> (&'static str, Vec<u8>) {
    if answer {
        let inner = build::udp(
            ip("10.244.2.6"),
            ip("10.244.1.5"),
            7000,
            port,
            b"a",
            &from_node2(),
        );
        ("eth0", tunnelled(inner))
    } else {
        let f = build::udp(
            ip("10.244.1.5"),
            ip("10.244.2.6"),
            port,
            7000,
            b"q",
            &from_pod(1, 5),
        );
        ("pod-a", f)
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Flows made, answered and removed at random between the parts of a base, slots
/// reused: the base and the changes always make the state of one whole save. With
/// more removals than the table holds, the changes are a whole state, which replaces
/// the base.
#[test]
fn test_random_changes_between_the_parts_always_make_the_whole_state() {
    let mut seen = [false; 2];
    for seed in 1..=40u64 {
        let max = 48;
        let mut removals = 0;
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut old = small_node(max, true);
        for port in 0..32 {
            let (at, f) = udp_flow(10_000 + port, false);
            send(&mut old, at, f, SEC);
        }
        let ops = if seed % 8 == 0 { 400 } else { 40 };
        let mut t = SEC;
        let part = 1 + rng.below(8) as usize;
        let base = base_in_parts(&mut old, 10 * SEC, part, 6, |p, _| {
            for _ in 0..ops / 6 {
                t += 1_000_000;
                let port = 10_000 + rng.below(40) as u16;
                match rng.below(4) {
                    0 | 1 => {
                        let (at, f) = udp_flow(port, rng.below(2) == 1);
                        send(p, at, f, t);
                    }
                    _ => {
                        removals += p.conntrack_mut().retain(|e| {
                            e.original().src_port != port && e.original().dst_port != port
                        });
                    }
                }
            }
        });
        let changes = decode(&encode(&old.save_changes(10 * SEC))).unwrap();
        assert_eq!(
            changes.removed.is_none(),
            removals > max,
            "seed {seed}: a whole state only past a full table's removals"
        );
        seen[usize::from(removals > max)] = true;
        let mut new = small_node(max, false);
        new.restore_state(&base, 30 * SEC).unwrap();
        new.apply_changes(&changes, 30 * SEC).unwrap();
        assert_eq!(
            ordered(new.save_state(30 * SEC)),
            ordered(old.save_state(10 * SEC)),
            "seed {seed}, parts of {part}"
        );
    }
    assert_eq!(seen, [true, true], "both changes and whole states tried");
}

#[test]
fn test_changes_alone_are_no_state_and_are_applied_on_their_node_only() {
    let (mut old, _) = opened();
    let base = base_in_parts(&mut old, 5 * SEC, 4, 0, |_, _| {});
    let changes = old.save_changes(5 * SEC);
    let mut new = fresh(services(true), false);
    assert_eq!(
        new.restore_state(&changes, 20 * SEC),
        Err(RestoreError::OnlyChanges)
    );
    assert!(
        RestoreError::OnlyChanges
            .to_string()
            .contains("only the changes since a pre-copy's base")
    );
    new.restore_state(&base, 20 * SEC).unwrap();
    let mut other = changes.clone();
    other.meta.node = "node2".into();
    assert!(matches!(
        new.apply_changes(&other, 20 * SEC),
        Err(RestoreError::OtherNode { .. })
    ));
    assert_eq!(new.conntrack().len(), 6, "the base as it was");
    new.apply_changes(&changes, 20 * SEC).unwrap();
    // Applied once, the rest of the state is held: twice is refused.
    assert!(matches!(
        new.apply_changes(&changes, 20 * SEC),
        Err(RestoreError::NotEmpty { .. })
    ));
    // A pre-copy given up records nothing more.
    old.track_changes();
    old.stop_tracking();
    assert!(!old.is_tracking());
    let whole = old.save_changes(5 * SEC);
    assert!(whole.removed.is_none(), "no pre-copy: the whole state");
    assert_eq!(ordered(whole), ordered(old.save_state(5 * SEC)));
}
