//! Live trace and capture in a running worker, with the in-memory ports of
//! [`super::tests`]; control-plane jobs turn them on, take what they recorded and turn
//! them off.

use std::net::IpAddr;
use std::time::Duration;

use super::tests::{Running, SHORT, WAIT, Wire, fake, tables};
use super::*;
use ferry_datapath::CaptureFilter;
use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::wire::parse;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A UDP frame from 10.9.0.1:`sport` to `dst`:7, as [`Wire::send`] sends.
fn udp(dst: &str, sport: u16) -> Vec<u8> {
    build::udp(ip("10.9.0.1"), ip(dst), sport, 7, b"x", &IpOpts::default())
}

fn tcp(dst: &str, sport: u16) -> Vec<u8> {
    build::tcp(
        ip("10.9.0.1"),
        ip(dst),
        sport,
        80,
        1,
        0,
        tcp_flags::SYN,
        b"",
        &IpOpts::default(),
    )
}

fn sport(frame: &[u8]) -> u16 {
    parse(frame, 0).expect("a frame").key.src_port
}

/// The next frame the port sent.
fn next(w: &Wire) -> Vec<u8> {
    w.out.recv_timeout(WAIT).expect("a frame within the wait")
}

fn job<R: Send + 'static>(w: &Running, f: impl FnOnce(&mut Taps) -> R + Send + 'static) -> R {
    w.control
        .run(WAIT, move |v| f(v.taps))
        .expect("the job ran")
}

fn filter(s: &str) -> CaptureFilter {
    CaptureFilter::parse(s).unwrap()
}

#[test]
fn test_live_trace_records_the_matching_packets_then_stops() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    assert!(!job(&w, |t| t.active()), "off by default");
    let f = filter("dst host 10.0.2.5");
    job(&w, move |t| t.start_trace(f, 2));
    assert_eq!(job(&w, |t| t.trace_remaining()), 2);
    for (dst, s) in [
        ("10.0.2.6", 1),
        ("10.0.2.5", 2),
        ("10.0.2.6", 3),
        ("10.0.2.5", 4),
        ("10.0.2.5", 5),
    ] {
        wa.send(dst, s);
    }
    for s in 1..=5 {
        wb.expect(s);
    }
    let (traced, remaining, active) =
        job(&w, |t| (t.take_traced(), t.trace_remaining(), t.active()));
    assert_eq!((remaining, active), (0, false), "the trace stopped itself");
    let sports: Vec<&str> = traced.iter().map(|p| p.summary.as_str()).collect();
    assert_eq!(
        sports,
        [
            "zone 0 udp 10.9.0.1:2 -> 10.0.2.5:7, 29 bytes, ttl 64",
            "zone 0 udp 10.9.0.1:4 -> 10.0.2.5:7, 29 bytes, ttl 64"
        ]
    );
    for p in &traced {
        assert_eq!(p.in_port, "a");
        assert_eq!(p.verdict, "forwarded");
        assert_eq!(p.ct.as_deref(), Some("new"));
        let stages: Vec<&str> = p.stages.iter().map(|(s, _)| s.as_str()).collect();
        assert!(
            stages.contains(&"parse") && stages.contains(&"route"),
            "{stages:?}"
        );
        // The typed events are the same stages, with the same text.
        let typed: Vec<(String, String)> = p
            .events
            .iter()
            .map(|e| (e.stage().name().to_string(), e.to_string()))
            .collect();
        assert_eq!(typed, p.stages);
        let json = serde_json::to_value(p).unwrap();
        assert_eq!(json["events"][0]["kind"], "parse", "{json}");
        assert_eq!(p.out.len(), 1);
        assert_eq!(p.out[0].0, "b");
        assert!(p.out[0].1.starts_with(&p.summary[..20]), "{:?}", p.out);
    }
    assert!(job(&w, |t| t.take_traced()).is_empty(), "taken once");
    // Off again: nothing more is recorded.
    wa.send("10.0.2.5", 6);
    wb.expect(6);
    assert!(job(&w, |t| t.take_traced()).is_empty());
}

#[test]
fn test_live_trace_names_the_drop_reason() {
    let (pa, wa) = fake("a");
    let (pb, _wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    job(&w, |t| t.start_trace(CaptureFilter::all(), 1));
    wa.send("10.0.9.9", 1); // no route
    let deadline = Instant::now() + WAIT;
    let traced = loop {
        let t = job(&w, |t| t.take_traced());
        if !t.is_empty() || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(traced.len(), 1);
    assert_eq!(traced[0].verdict, "dropped: no_route");
    assert!(traced[0].out.is_empty());
    assert_eq!(traced[0].stages.last().unwrap().0, "drop");
}

#[test]
fn test_capture_records_frames_in_and_out_as_they_were() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    let f = filter("udp");
    job(&w, move |t| t.start_capture("a".into(), f, 100, usize::MAX));
    let a_to_b = udp("10.0.2.5", 1);
    wa.send_frame(&a_to_b);
    let out_b = next(&wb);
    let b_to_a = udp("10.0.1.5", 2);
    wb.send_frame(&b_to_a);
    let out_a = next(&wa);
    // Not UDP: neither way.
    wa.send_frame(&tcp("10.0.2.5", 3));
    assert_eq!(sport(&next(&wb)), 3);
    wb.send_frame(&tcp("10.0.1.5", 4));
    assert_eq!(sport(&next(&wa)), 4);
    let (captured, lost) = job(&w, |t| t.take_captured());
    assert_eq!(lost, 0);
    let got: Vec<(Direction, &str, &str)> = captured
        .iter()
        .map(|c| (c.dir, c.port.as_str(), c.note.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Direction::In, "a", "received on a"),
            (Direction::Out, "b", "after ferry: to b (received on a)"),
            (Direction::Out, "a", "sent on a"),
        ]
    );
    assert_eq!(captured[0].data, a_to_b, "as received");
    assert_eq!(captured[1].data, out_b, "as sent");
    assert_eq!(captured[2].data, out_a, "as sent");
    // What the pipeline rewrote: MACs and TTL.
    assert_ne!(out_b, a_to_b);
    assert_eq!(out_b[0..6], [2, 0, 0, 0, 0, 0xfe]);
    assert_eq!(out_b[6..12], [2, 0xfe, 0, 0, 0, 2]);
    assert_eq!((a_to_b[14 + 8], out_b[14 + 8]), (64, 63));
    assert!(captured.iter().all(|c| c.time_ns > 0));
}

#[test]
fn test_capture_buffer_bound_counts_lost_frames_and_stop_records_nothing() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    job(&w, |t| {
        t.start_capture("a".into(), CaptureFilter::all(), 3, usize::MAX)
    });
    for s in 0..5 {
        wa.send("10.0.2.5", s);
        wb.expect(s);
    }
    let (captured, lost) = job(&w, |t| t.take_captured());
    let got: Vec<(Direction, u16)> = captured.iter().map(|c| (c.dir, sport(&c.data))).collect();
    assert_eq!(
        got,
        [(Direction::In, 0), (Direction::Out, 0), (Direction::In, 1)]
    );
    assert_eq!(lost, 7, "5 frames in and 5 out, 3 kept");
    assert_eq!(job(&w, |t| t.take_captured()), (vec![], 0));
    // Room again after the take.
    wa.send("10.0.2.5", 5);
    wb.expect(5);
    assert_eq!(job(&w, |t| t.take_captured()).0.len(), 2);

    job(&w, |t| t.stop_capture());
    assert!(!job(&w, |t| t.active()));
    wa.send("10.0.2.5", 6);
    wb.expect(6);
    wb.send("10.0.1.5", 7);
    wa.expect(7);
    assert_eq!(job(&w, |t| t.take_captured()), (vec![], 0));
}

#[test]
fn test_capture_buffer_is_bounded_in_bytes_too() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    // The size of one frame, then room for the bytes of two and a half.
    job(&w, |t| {
        t.start_capture("a".into(), CaptureFilter::all(), 1, usize::MAX)
    });
    wa.send("10.0.2.5", 1);
    wb.expect(1);
    let frame = job(&w, |t| t.take_captured()).0[0].data.len();
    let budget = 2 * frame + frame / 2;
    job(&w, move |t| {
        t.start_capture("a".into(), CaptureFilter::all(), 100, budget)
    });
    for s in 2..6 {
        wa.send("10.0.2.5", s);
        wb.expect(s);
    }
    let (captured, lost) = job(&w, |t| t.take_captured());
    assert_eq!(captured.len(), 2, "two frames fit the bytes");
    assert_eq!(lost, 6, "4 frames in and 4 out, 2 kept");
    // The budget is free again after the take.
    wa.send("10.0.2.5", 6);
    wb.expect(6);
    assert_eq!(job(&w, |t| t.take_captured()).0.len(), 2);
}

#[test]
fn test_capture_follows_its_port_by_name_across_updates() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    job(&w, |t| {
        t.start_capture("b".into(), CaptureFilter::all(), 100, usize::MAX)
    });
    wa.send("10.0.2.5", 1);
    wb.expect(1);
    // b moves from 1 to 0.
    drop(w.update(tables(&["b", "a"]), vec![]));
    wa.send("10.0.2.5", 2);
    wb.expect(2);
    // b goes: nothing is recorded, not even for the port that took its index.
    let (pc, wc) = fake("c");
    drop(w.update(tables(&["a", "c"]), vec![pc]));
    wa.send("10.0.3.5", 3);
    wc.expect(3);
    wc.send("10.0.1.5", 4);
    wa.expect(4);
    // b comes back.
    let (pb2, wb2) = fake("b");
    drop(w.update(tables(&["a", "b", "c"]), vec![pb2]));
    wa.send("10.0.2.5", 5);
    wb2.expect(5);
    let (captured, lost) = job(&w, |t| t.take_captured());
    assert_eq!(lost, 0);
    let got: Vec<(Direction, &str, &str, u16)> = captured
        .iter()
        .map(|c| (c.dir, c.port.as_str(), c.note.as_str(), sport(&c.data)))
        .collect();
    assert_eq!(
        got,
        [
            (Direction::Out, "b", "sent on b", 1),
            (Direction::Out, "b", "sent on b", 2),
            (Direction::Out, "b", "sent on b", 5),
        ]
    );
}

/// Sends the same frames both ways and returns what came out of each port, up to a
/// last frame (source port 999) sent each way.
fn exchange(wa: &Wire, wb: &Wire) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut ttl1 = udp("10.0.2.5", 20);
    ttl1[14 + 8] = 1;
    ferry_datapath::wire::checksum::set_ipv4_header(&mut ttl1[14..34]);
    for f in [
        udp("10.0.2.5", 10),
        tcp("10.0.2.5", 11),
        udp("10.0.9.9", 12),
        ttl1,
        udp("10.0.2.5", 13),
        udp("10.0.2.5", 999),
    ] {
        wa.send_frame(&f);
    }
    for f in [
        udp("10.0.1.5", 14),
        tcp("10.0.1.5", 15),
        udp("10.0.1.5", 999),
    ] {
        wb.send_frame(&f);
    }
    let until_last = |w: &Wire| {
        let mut got = Vec::new();
        loop {
            let f = next(w);
            let last = sport(&f) == 999;
            got.push(f);
            if last {
                break got;
            }
        }
    };
    let to_b = until_last(wb);
    let to_a = until_last(wa);
    assert!(wa.recv(SHORT).is_none() && wb.recv(SHORT).is_none());
    (to_a, to_b)
}

#[test]
fn test_forwarding_is_the_same_with_taps_on_and_off() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    let off = exchange(&wa, &wb);
    assert_eq!((off.0.len(), off.1.len()), (3, 4));
    job(&w, |t| {
        t.start_trace(CaptureFilter::all(), 1000);
        t.start_capture("a".into(), CaptureFilter::all(), 1000, usize::MAX);
    });
    let on = exchange(&wa, &wb);
    assert_eq!(on, off);
    let (traced, (captured, lost)) = job(&w, |t| (t.take_traced(), t.take_captured()));
    assert_eq!(traced.len(), 9, "every packet received");
    assert_eq!(lost, 0);
    assert_eq!(
        captured.len(),
        6 + 4 + 3,
        "a's 6 in, their 4 out, 3 sent on a"
    );
    let (_, _, r) = w.finish();
    assert_eq!(r.unwrap().tx_dropped, 0);
}

#[test]
fn test_capture_says_why_a_received_frame_was_dropped() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    let f = filter("udp");
    job(&w, move |t| t.start_capture("a".into(), f, 100, usize::MAX));
    // Nowhere to go, then a frame that goes through (processed after the first).
    wa.send_frame(&udp("10.99.0.1", 1));
    wa.send_frame(&udp("10.0.2.5", 2));
    assert_eq!(sport(&next(&wb)), 2);
    let (captured, _) = job(&w, |t| t.take_captured());
    let notes: Vec<&str> = captured.iter().map(|c| c.note.as_str()).collect();
    assert_eq!(
        notes,
        [
            "received on a; dropped: no_route",
            "received on a",
            "after ferry: to b (received on a)"
        ]
    );
}
