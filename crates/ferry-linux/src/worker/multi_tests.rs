//! Several workers over one pipeline, with the in-memory ports of the worker tests.

use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use super::tests::{
    Running, WAIT, fake, fake_queues, frames_keep_flowing_across_swaps, names, spec,
    spec_with_pod_b, tables, wait_gone,
};
use super::*;
use ferry_datapath::Addr;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::parse;
use ferry_datapath::{MatchSpec, NatRuleSpec};

/// Waits until the published counters show `rx` frames received.
fn snapshot_with(control: &Control, rx: u64) -> Arc<Snapshot> {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = control.snapshot();
        if s.worker.rx_frames >= rx || Instant::now() > deadline {
            return s;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn test_worker_counts_and_busy_polling_out_of_bounds_are_refused() {
    let busy = |busy_poll| Workers {
        count: 1,
        busy_poll,
        ..Workers::default()
    };
    for workers in [
        Workers::from(0),
        Workers::from(MAX_WORKERS + 1),
        busy(MAX_BUSY_POLL + Duration::from_micros(1)),
    ] {
        let (pa, _wa) = fake("a");
        let mut pipeline = Pipeline::new(tables(&["a"]));
        let mut ports = vec![pa];
        let what = format!("{workers:?}");
        let e = run_workers(
            workers,
            &mut ports,
            &mut pipeline,
            &AtomicBool::new(true),
            || 0,
            &Control::new(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
        assert_eq!(names(&ports), ["a"], "{what}: the port is handed back");
    }
}

#[test]
fn test_three_workers_forward_between_ports_each_of_them_receives() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let (pc, wc) = fake("c");
    // One queue each: a is worker 0's, b worker 1's, c worker 2's.
    let w = Running::start_workers(3, tables(&["a", "b", "c"]), vec![pa, pb, pc]);
    const N: u16 = 300;
    // Each port sends to the next, all at once.
    let senders: Vec<_> = [(wa, "10.0.2.5"), (wb, "10.0.3.5"), (wc, "10.0.1.5")]
        .into_iter()
        .map(|(wire, to)| {
            thread::spawn(move || {
                for i in 0..N {
                    wire.send(to, i);
                }
                wire
            })
        })
        .collect();
    let wires: Vec<_> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    for wire in &wires {
        for i in 0..N {
            wire.expect(i);
        }
        wire.expect_nothing();
    }
    let snap = snapshot_with(&w.control, 3 * u64::from(N));
    assert_eq!(
        snap.worker.rx_frames,
        3 * u64::from(N),
        "summed over the workers"
    );
    for p in &snap.ports {
        assert_eq!(
            (p.pipeline.rx_packets, p.linux.tx_frames),
            (u64::from(N), u64::from(N)),
            "{}",
            p.name
        );
    }
    let (ports, _, r) = w.finish();
    let stats = r.unwrap();
    assert_eq!((stats.rx_frames, stats.tx_frames), (900, 900));
    assert_eq!(names(&ports), ["a", "b", "c"]);
}

#[test]
fn test_queues_of_one_port_are_dealt_out_and_counted_as_one_port() {
    let (pa, wa) = fake_queues("a", 2);
    let (pb, wb) = fake("b");
    // a's queue 0 is worker 0's, its queue 1 worker 1's; b (port 1) is worker 1's.
    let w = Running::start_workers(2, tables(&["a", "b"]), vec![pa, pb]);
    for i in 0..10 {
        wa[0].send("10.0.2.5", i);
        wb.expect(i);
        wa[1].send("10.0.2.5", 100 + i);
        wb.expect(100 + i);
    }
    // b's frames are received by worker 1, which sends through a's queue 1.
    for i in 0..10 {
        wb.send("10.0.1.5", i);
        wa[1].expect(i);
    }
    wa[0].expect_nothing();
    let snap = snapshot_with(&w.control, 30);
    let each: Vec<u64> = snap.workers.iter().map(|s| s.rx_frames).collect();
    assert_eq!(each, [10, 20], "worker 1 received a's queue 1 and b");
    let a = &snap.ports[0];
    assert_eq!((a.linux.rx_frames, a.linux.tx_frames), (20, 10));
    assert_eq!(a.pipeline.rx_packets, 20);
    let (ports, _, r) = w.finish();
    r.unwrap();
    assert_eq!(names(&ports), ["a", "b"]);
    assert!(wa[1].is_closed(), "the further queue is closed on return");
    assert!(!wa[0].is_closed(), "the port is the caller's to close");
}

/// UDP from 10.0.1.5 (port a) to 10.0.2.5 (port b), source NAT to 10.0.2.1.
fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    build::udp(
        IpAddr::from(src),
        IpAddr::from(dst),
        sport,
        dport,
        b"x",
        &IpOpts::default(),
    )
}

#[test]
fn test_a_reply_received_by_another_worker_finds_its_connection() {
    let mut s = spec(&["a", "b"]);
    s.nat.push(NatRuleSpec {
        matches: MatchSpec {
            in_port: Some("a".into()),
            ..MatchSpec::default()
        },
        dnat: None,
        snat: Some("10.0.2.1:40000-40099".into()),
        masquerade: false,
    });
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    // a is received by worker 0, b by worker 1.
    let w = Running::start_workers(2, Arc::new(s.compile().unwrap()), vec![pa, pb]);
    for sport in 1000..1050 {
        wa.send_frame(&udp([10, 0, 1, 5], [10, 0, 2, 5], sport, 53));
        let f = wb.out.recv_timeout(WAIT).expect("the request leaves on b");
        let k = parse(&f, 0).unwrap().key;
        assert_eq!(k.src, IpAddr::from([10, 0, 2, 1]), "source NAT");
        assert!((40000..40100).contains(&k.src_port), "{}", k.src_port);
        // The reply, to the translated address, comes in on b: worker 1.
        wb.send_frame(&udp([10, 0, 2, 5], [10, 0, 2, 1], 53, k.src_port));
        let r = wa.out.recv_timeout(WAIT).expect("the reply leaves on a");
        let r = parse(&r, 0).unwrap().key;
        assert_eq!(
            (r.src, r.dst, r.src_port, r.dst_port),
            (
                Addr::from(IpAddr::from([10, 0, 2, 5])),
                Addr::from(IpAddr::from([10, 0, 1, 5])),
                53,
                sport
            ),
            "translated back by the connection worker 0 made"
        );
    }
    let (_, pipeline, r) = w.finish();
    r.unwrap();
    assert_eq!(pipeline.conntrack().len(), 50);
    assert_eq!(pipeline.drops().total(), 0);
}

#[test]
fn test_frames_keep_flowing_across_swaps_with_two_workers() {
    frames_keep_flowing_across_swaps(2);
}

#[test]
fn test_update_gives_a_new_port_its_queues_and_closes_those_of_a_port_let_go() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake_queues("b", 2);
    let w = Running::start_workers(2, tables(&["a", "b"]), vec![pa, pb]);
    let (pc, wc) = fake_queues("c", 2);
    let applied = w.update(tables(&["a", "c"]), vec![pc]);
    assert_eq!(names(&applied.closed), ["b"]);
    assert!(
        wb[1].is_closed(),
        "b's further queue is closed by the worker"
    );
    drop(applied);
    assert!(wb[0].is_closed());
    // Worker 1 receives c's queue 1.
    wc[1].send("10.0.1.5", 7);
    wa.expect(7);
    wc[0].send("10.0.1.5", 8);
    wa.expect(8);
    let (ports, _, r) = w.finish();
    r.unwrap();
    assert_eq!(names(&ports), ["a", "c"]);
    assert!(wc[1].is_closed());
}

#[test]
fn test_a_failing_worker_stops_them_all() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start_workers(2, tables(&["a", "b"]), vec![pa, pb]);
    wa.send("10.0.2.5", 1);
    wb.expect(1);
    // b is worker 1's: its receive errors end worker 1, and worker 0 follows.
    wb.break_port();
    wb.send("10.0.1.5", 2);
    let deadline = Instant::now() + WAIT;
    while w.control.is_running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(!w.control.is_running(), "all workers left within {WAIT:?}");
    let (ports, _, r) = w.finish();
    let e = r.unwrap_err();
    assert!(
        e.to_string()
            .contains("port fake-b: 1000 receive errors in a row"),
        "{e}"
    );
    assert_eq!(names(&ports), ["a", "b"], "the ports are handed back");
}

#[test]
fn test_a_live_trace_sees_what_every_worker_receives() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    // a is worker 0's, b worker 1's.
    let w = Running::start_workers(2, tables(&["a", "b"]), vec![pa, pb]);
    let udp = ferry_datapath::CaptureFilter::parse("udp").unwrap();
    w.control
        .run(WAIT, move |v| v.taps.start_trace(udp, 4))
        .unwrap();
    for i in 0..2 {
        wa.send("10.0.2.5", i);
        wb.expect(i);
        wb.send("10.0.1.5", 10 + i);
        wa.expect(10 + i);
    }
    let traced = w.control.run(WAIT, |v| v.taps.take_traced()).unwrap();
    let mut ports: Vec<&str> = traced.iter().map(|t| t.in_port.as_str()).collect();
    ports.sort();
    assert_eq!(ports, ["a", "a", "b", "b"], "{traced:?}");
    assert!(traced.iter().all(|t| t.verdict == "forwarded"));
}

#[test]
fn test_pinned_workers_run_on_their_cpus_only() {
    let last = *crate::cpu::allowed().unwrap().last().unwrap();
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let pinned = Workers {
        count: 2,
        cpus: vec![last],
        ..Workers::default()
    };
    let w = Running::start_workers(pinned, tables(&["a", "b"]), vec![pa, pb]);
    // Jobs run on worker 0's thread.
    let on = w
        .control
        .run(WAIT, |_| crate::cpu::allowed().unwrap())
        .unwrap();
    assert_eq!(on, [last]);
    wa.send("10.0.2.5", 1);
    wb.expect(1);
    wb.send("10.0.1.5", 2);
    wa.expect(2);
    w.finish().2.unwrap();
}

#[test]
fn test_a_cpu_a_worker_cannot_be_pinned_to_is_an_error() {
    let (pa, _wa) = fake("a");
    let mut ports = vec![pa];
    let mut pipeline = Pipeline::new(tables(&["a"]));
    let bad = Workers {
        count: 1,
        cpus: vec![1 << 20],
        ..Workers::default()
    };
    let e = thread::spawn(move || {
        let r = run_workers(
            bad,
            &mut ports,
            &mut pipeline,
            &AtomicBool::new(false),
            || 0,
            &Control::new(),
        );
        (r.unwrap_err(), ports.len())
    })
    .join()
    .unwrap();
    assert!(
        e.0.to_string().contains("pinning worker 0 to CPU 1048576"),
        "{}",
        e.0
    );
    assert_eq!(e.1, 1, "the port is handed back");
}

#[test]
fn test_busy_polling_goes_on_for_its_window_after_frames_then_sleeps_again() {
    for busy_poll in [Duration::ZERO, Duration::from_millis(100)] {
        let (pa, wa) = fake("a");
        let (pb, wb) = fake("b");
        let workers = Workers {
            count: 1,
            busy_poll,
            ..Workers::default()
        };
        let w = Running::start_workers(workers, tables(&["a", "b"]), vec![pa, pb]);
        wa.send("10.0.2.5", 1);
        wb.expect(1);
        // The window, and 300 ms after it.
        thread::sleep(Duration::from_millis(400));
        let stats = w.finish().2.unwrap();
        let asleep = stats.rounds - stats.busy_rounds;
        eprintln!(
            "{busy_poll:?}: {} rounds, {} busy",
            stats.rounds, stats.busy_rounds
        );
        if busy_poll.is_zero() {
            assert_eq!(stats.busy_rounds, 0, "{stats:?}");
        } else {
            // Polled over and over without sleeping, for 100 ms (thousands of rounds on
            // an idle machine; yielding to every other thread of a loaded one, fewer).
            assert!(stats.busy_rounds > 10, "{stats:?}");
        }
        // Otherwise asleep in poll: a round per frame and per poll timeout (10 ms).
        assert!(asleep < 80, "{busy_poll:?}: {stats:?}");
    }
}

#[test]
fn test_a_pod_port_of_two_queues_goes_out_of_service_on_both_workers() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake_queues("b", 2);
    let (pc, wc) = fake("c");
    let w = Running::start_workers(2, spec_with_pod_b(&["a", "b", "c"]), vec![pa, pb, pc]);
    // Each worker receives one of b's queues; both go when the device does.
    for q in &wb {
        q.vanish();
    }
    wait_gone(&w, "b");
    let deadline = Instant::now() + WAIT;
    while !wb.iter().all(|q| q.is_closed()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        wb.iter().all(|q| q.is_closed()),
        "both of b's queues closed"
    );
    thread::sleep(Duration::from_millis(200));
    assert!(w.control.is_running(), "the workers stopped");
    wa.send("10.0.3.5", 1);
    wc.expect(1);
    wa.send("10.0.2.5", 2);
    for q in &wb {
        q.expect_nothing();
    }
    let (_, _, r) = w.finish();
    let stats = r.expect("the workers kept running");
    assert_eq!(stats.ports_gone, 1, "counted once: {stats:?}");
}

#[test]
fn test_an_exclusive_job_holds_every_worker_and_hands_the_ports_over() {
    let (pa, wa) = fake_queues("a", 2);
    let (pb, wb) = fake("b");
    let w = Running::start_workers(2, tables(&["a", "b"]), vec![pa, pb]);
    // Both queues of `a` forward (one per worker).
    wa[0].send("10.0.2.5", 1);
    wb.expect(1);
    wa[1].send("10.0.2.5", 2);
    wb.expect(2);
    // A plain job may not take descriptors: another worker could be reading.
    let plain = w.control.run(WAIT, |v| v.handover_ports().map(|p| p.len()));
    assert!(plain.unwrap().is_err());
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (told, ran) = std::sync::mpsc::channel();
    let control = Arc::clone(&w.control);
    let job = thread::spawn(move || {
        control.run_exclusive(WAIT, move |v| {
            let ports = v.handover_ports().expect("descriptors");
            let _ = told.send(
                ports
                    .iter()
                    .map(|p| (p.name.clone(), p.queues.len()))
                    .collect::<Vec<_>>(),
            );
            // Holds the workers until the test lets go.
            let _ = held.recv_timeout(WAIT);
        })
    });
    let ports = ran.recv_timeout(WAIT).expect("the exclusive job ran");
    assert_eq!(ports, [("a".to_string(), 2), ("b".to_string(), 1)]);
    // While it runs, neither worker forwards: frames wait in the ports.
    wa[0].send("10.0.2.5", 3);
    wa[1].send("10.0.2.5", 4);
    wb.expect_nothing();
    release.send(()).unwrap();
    job.join().unwrap().unwrap();
    let mut got = [wb.recv(WAIT), wb.recv(WAIT)];
    got.sort();
    assert_eq!(
        got,
        [Some(3), Some(4)],
        "the held frames are forwarded after it"
    );
}
