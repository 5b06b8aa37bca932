//! Worker tests with in-memory ports: frames come in through one end of a Unix datagram
//! socket pair (a real descriptor for poll) whose other end the test holds, and go out
//! through a channel (unbounded, so that a slow test thread never makes the worker drop).

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use super::*;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::parse;
use ferry_datapath::{MacAddr, PortSpec, RouteSpec, TablesSpec};

pub(super) const WAIT: Duration = Duration::from_secs(5);
pub(super) const SHORT: Duration = Duration::from_millis(100);

/// A port whose frames come from and go to its [`Wire`].
struct FakePort {
    name: String,
    sock: UnixDatagram,
    out: mpsc::Sender<Vec<u8>>,
    closed: Arc<AtomicBool>,
    counters: PortCounters,
    /// Further queues, handed over by `take_queues`.
    queues: Vec<Box<dyn Port>>,
    /// While set, every receive fails.
    broken: Arc<AtomicBool>,
    /// While set, every receive fails as a TAP's whose namespace was deleted.
    vanished: Arc<AtomicBool>,
    /// While set, every receive fails as an AF_PACKET port's whose device was deleted.
    deleted: Arc<AtomicBool>,
}

impl Drop for FakePort {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Port for FakePort {
    fn name(&self) -> &str {
        &self.name
    }

    fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn recv_batch(&mut self, out: &mut Vec<Frame>, max: usize) -> io::Result<usize> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(io::Error::other("broken on purpose"));
        }
        if self.vanished.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EBADFD));
        }
        if self.deleted.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: the device is gone", self.name),
            ));
        }
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while got < max {
            match self.sock.recv(&mut buf) {
                Ok(n) => {
                    out.push(Frame {
                        data: buf[..n].to_vec(),
                        vnet: VnetHdr::default(),
                    });
                    self.counters.rx_frames += 1;
                    got += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>) -> io::Result<usize> {
        let n = frames.len();
        for f in frames.drain(..) {
            match self.out.send(f.data) {
                Ok(()) => self.counters.tx_frames += 1,
                Err(_) => self.counters.tx_errors += 1,
            }
        }
        Ok(n)
    }

    fn offloads(&self) -> bool {
        false
    }

    fn counters(&self) -> PortCounters {
        self.counters
    }

    fn take_queues(&mut self) -> Vec<Box<dyn Port>> {
        std::mem::take(&mut self.queues)
    }

    fn handover(&self) -> Option<(crate::handover::Handed, std::os::fd::BorrowedFd<'_>)> {
        use std::os::fd::AsFd;
        let dev = self.name.clone();
        Some((crate::handover::Handed::Tap { dev }, self.sock.as_fd()))
    }
}

/// The test's end of a [`FakePort`].
pub(super) struct Wire {
    name: &'static str,
    sock: UnixDatagram,
    pub(super) out: mpsc::Receiver<Vec<u8>>,
    closed: Arc<AtomicBool>,
    broken: Arc<AtomicBool>,
    vanished: Arc<AtomicBool>,
    deleted: Arc<AtomicBool>,
}

impl Wire {
    /// Sends a UDP frame from 10.9.0.1:`sport` to `dst` into the port.
    pub(super) fn send(&self, dst: &str, sport: u16) {
        let f = build::udp(
            IpAddr::from([10, 9, 0, 1]),
            dst.parse().unwrap(),
            sport,
            7,
            b"x",
            &IpOpts::default(),
        );
        self.send_frame(&f);
    }

    /// Sends `frame` into the port as it is.
    pub(super) fn send_frame(&self, frame: &[u8]) {
        self.sock.send(frame).expect("frame into the fake port");
    }

    /// The source port of the next frame the port sent, if one comes within `wait`.
    pub(super) fn recv(&self, wait: Duration) -> Option<u16> {
        let f = self.out.recv_timeout(wait).ok()?;
        Some(parse(&f, 0).expect("a frame").key.src_port)
    }

    pub(super) fn expect(&self, sport: u16) {
        assert_eq!(
            self.recv(WAIT),
            Some(sport),
            "frame {sport} did not come out of port {} within {WAIT:?}",
            self.name
        );
    }

    pub(super) fn expect_nothing(&self) {
        assert_eq!(self.recv(SHORT), None, "port {} sent something", self.name);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Makes every receive of the port fail from now on.
    pub(super) fn break_port(&self) {
        self.broken.store(true, Ordering::SeqCst);
    }

    /// Makes the port's device go away as a TAP's does when its namespace is deleted:
    /// always readable, every receive failing with `EBADFD`.
    pub(super) fn vanish(&self) {
        self.vanished.store(true, Ordering::SeqCst);
        self.send_frame(b"wake");
    }

    /// Makes the port's device go away as an AF_PACKET port's does when its device is
    /// deleted: the next receive says so (`NotFound`).
    pub(super) fn delete_device(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        self.send_frame(b"wake");
    }
}

pub(super) fn fake(name: &'static str) -> (NamedPort, Wire) {
    let (port, wire) = fake_queue(name);
    ((name.to_string(), Box::new(port)), wire)
}

/// A port of `n` queues, each with its own wire (queue 0's first).
pub(super) fn fake_queues(name: &'static str, n: usize) -> (NamedPort, Vec<Wire>) {
    let (mut port, wire) = fake_queue(name);
    let mut wires = vec![wire];
    for _ in 1..n {
        let (q, w) = fake_queue(name);
        port.queues.push(Box::new(q));
        wires.push(w);
    }
    ((name.to_string(), Box::new(port)), wires)
}

fn fake_queue(name: &'static str) -> (FakePort, Wire) {
    let (a, b) = UnixDatagram::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let broken = Arc::new(AtomicBool::new(false));
    let vanished = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let port = FakePort {
        name: format!("fake-{name}"),
        sock: a,
        out: tx,
        closed: Arc::clone(&closed),
        counters: PortCounters::default(),
        queues: Vec::new(),
        broken: Arc::clone(&broken),
        vanished: Arc::clone(&vanished),
        deleted: Arc::clone(&deleted),
    };
    (
        port,
        Wire {
            name,
            sock: b,
            out: rx,
            closed,
            broken,
            vanished,
            deleted,
        },
    )
}

/// Plain ports in this order; port NAME gets 10.0.N.0/24, N its position in "abcdxyz".
pub(super) fn tables(names: &[&str]) -> Arc<Tables> {
    Arc::new(spec(names).compile().unwrap())
}

/// The spec of [`tables`].
pub(super) fn spec(names: &[&str]) -> TablesSpec {
    let net = |n: &str| "abcdxyz".find(n).unwrap() + 1;
    TablesSpec {
        ports: names
            .iter()
            .map(|n| PortSpec {
                name: n.to_string(),
                mac: MacAddr([2, 0xfe, 0, 0, 0, net(n) as u8]),
                ..PortSpec::default()
            })
            .collect(),
        routes: names
            .iter()
            .map(|n| RouteSpec {
                prefix: format!("10.0.{}.0/24", net(n)).parse().unwrap(),
                port: n.to_string(),
                next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 0xfe])),
                via: None,
            })
            .collect(),
        ..TablesSpec::default()
    }
}

type Finished = (Vec<NamedPort>, Pipeline, io::Result<WorkerStats>);

/// A worker on its own thread, stopped on drop so that a failing test never hangs.
pub(super) struct Running {
    pub(super) control: Arc<Control>,
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<Finished>>,
}

impl Running {
    pub(super) fn start(tables: Arc<Tables>, ports: Vec<NamedPort>) -> Running {
        Running::start_workers(1, tables, ports)
    }

    /// With `workers` worker threads.
    pub(super) fn start_workers(
        workers: impl Into<Workers>,
        tables: Arc<Tables>,
        ports: Vec<NamedPort>,
    ) -> Running {
        Running::start_audited(workers, tables, ports, 0)
    }

    /// With `workers` worker threads and a pipeline auditing denials into a buffer of
    /// `audit` records (0: off).
    pub(super) fn start_audited(
        workers: impl Into<Workers>,
        tables: Arc<Tables>,
        mut ports: Vec<NamedPort>,
        audit: usize,
    ) -> Running {
        let workers = workers.into();
        let control = Arc::new(Control::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&control), Arc::clone(&stop));
        let handle = thread::spawn(move || {
            let mut pipeline = Pipeline::new(tables);
            pipeline.audit_denials(audit);
            let t0 = Instant::now();
            let r = run_workers(
                workers,
                &mut ports,
                &mut pipeline,
                &s,
                || t0.elapsed().as_nanos() as u64,
                &c,
            );
            (ports, pipeline, r)
        });
        let deadline = Instant::now() + WAIT;
        while !control.is_running() && !handle.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        Running {
            control,
            stop,
            handle: Some(handle),
        }
    }

    pub(super) fn update(&self, tables: Arc<Tables>, new_ports: Vec<NamedPort>) -> Applied {
        self.control
            .send(Update { tables, new_ports }, WAIT)
            .expect("update applied")
    }

    pub(super) fn finish(mut self) -> Finished {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("worker panicked")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

pub(super) fn names(ports: &[NamedPort]) -> Vec<&str> {
    ports.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn test_port_count_must_match_the_tables() {
    let spec = TablesSpec {
        ports: vec![PortSpec {
            name: "pod".into(),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            gso: true,
            ..PortSpec::default()
        }],
        ..TablesSpec::default()
    };
    let mut pipeline = Pipeline::new(Arc::new(spec.compile().unwrap()));
    let stop = AtomicBool::new(false);
    let e = run_worker(&mut [], &mut pipeline, &stop, || 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("0 ports"), "{e}");
}

#[test]
fn test_start_puts_named_ports_in_table_order_and_refuses_mismatches() {
    let (pa, _wa) = fake("a");
    let (pb, wb) = fake("b");
    let mut pipeline = Pipeline::new(tables(&["a", "b"]));
    let stop = AtomicBool::new(true);
    let mut ports = vec![pb, pa];
    run_worker_with(&mut ports, &mut pipeline, &stop, || 0, &Control::new()).unwrap();
    assert_eq!(names(&ports), ["a", "b"]);

    let mut gso = TablesSpec {
        ports: vec![PortSpec {
            name: "b".into(),
            gso: true,
            ..PortSpec::default()
        }],
        ..TablesSpec::default()
    };
    let mut pipeline = Pipeline::new(Arc::new(gso.compile().unwrap()));
    let mut only_b = vec![ports.pop().unwrap()];
    let e = run_worker_with(&mut only_b, &mut pipeline, &stop, || 0, &Control::new()).unwrap_err();
    assert!(e.to_string().contains("gso: true"), "{e}");
    gso.ports[0].name = "c".into();
    let mut pipeline = Pipeline::new(Arc::new(gso.compile().unwrap()));
    let e = run_worker_with(&mut only_b, &mut pipeline, &stop, || 0, &Control::new()).unwrap_err();
    assert!(e.to_string().contains("\"b\" is not in the tables"), "{e}");
    assert!(
        !wb.is_closed(),
        "a refused start leaves the ports to the caller"
    );
}

#[test]
fn test_update_adds_removes_and_reorders_ports() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    wa.send("10.0.2.5", 1);
    wb.expect(1);

    // b moves from 1 to 0, c comes at 1, a goes.
    let (pc, wc) = fake("c");
    let applied = w.update(tables(&["b", "c"]), vec![pc]);
    assert_eq!(applied.report.ports_added, ["c"]);
    assert_eq!(applied.report.ports_removed, ["a"]);
    assert_eq!(applied.report.ports_moved, ["b"]);
    assert_eq!(names(&applied.closed), ["a"]);
    assert!(applied.waited >= applied.paused);
    assert!(!wa.is_closed(), "closing is left to the sender");
    drop(applied);
    assert!(wa.is_closed());

    wb.send("10.0.3.5", 2);
    wc.expect(2);
    wc.send("10.0.2.5", 3);
    wb.expect(3);

    let snap = w.control.snapshot();
    assert_eq!(snap.worker.updates, 1);
    let ports: Vec<&str> = snap.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(ports, ["b", "c"], "published after the update");
    assert_eq!(
        snap.ports[0].pipeline.tx_packets, 1,
        "b kept the counters of before the update"
    );

    let (ports, pipeline, r) = w.finish();
    let stats = r.unwrap();
    assert_eq!(names(&ports), ["b", "c"]);
    assert_eq!(pipeline.tables().ports.len(), 2);
    assert_eq!((stats.updates, stats.tx_dropped), (1, 0));
    assert!(ports.iter().all(|(_, p)| p.counters().tx_errors == 0));
}

#[test]
fn test_update_naming_a_port_without_a_linux_port_is_refused_and_changes_nothing() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    let refused = |u: Update, want: &str| {
        let e = w.control.send(u, WAIT).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
        e.into_update().expect("the update comes back")
    };
    let u = refused(
        Update {
            tables: tables(&["a", "b", "c", "d"]),
            new_ports: vec![],
        },
        "the tables name ports that have no Linux port: \"c\", \"d\"",
    );
    assert_eq!(u.tables.ports.len(), 4);
    let (px, wx) = fake("x");
    let u = refused(
        Update {
            tables: tables(&["a", "b"]),
            new_ports: vec![px],
        },
        "port \"x\" is not in the tables",
    );
    assert!(!wx.is_closed(), "the refused port is handed back open");
    let (pc1, _wc1) = fake("c");
    let (pc2, _wc2) = fake("c");
    refused(
        Update {
            tables: tables(&["a", "b", "c"]),
            new_ports: vec![pc1, pc2],
        },
        "port \"c\" is given twice",
    );
    drop(u);

    // Still the old tables and ports.
    wa.send("10.0.2.5", 1);
    wb.expect(1);
    wa.send("10.0.3.5", 2);
    wa.expect_nothing();
    let (ports, pipeline, r) = w.finish();
    let stats = r.unwrap();
    assert_eq!((stats.updates, stats.updates_refused), (0, 3));
    assert_eq!(names(&ports), ["a", "b"]);
    assert_eq!(pipeline.tables().ports.len(), 2);
    assert!(!wa.is_closed() && !wb.is_closed());
}

#[test]
fn test_new_port_with_an_existing_name_replaces_it() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    let (pb2, wb2) = fake("b");
    let applied = w.update(tables(&["a", "b"]), vec![pb2]);
    assert_eq!(names(&applied.closed), ["b"]);
    assert_eq!(applied.report.ports_added, Vec::<String>::new());
    drop(applied);
    assert!(wb.is_closed() && !wb2.is_closed());
    wa.send("10.0.2.5", 1);
    wb2.expect(1);
}

#[test]
fn test_frames_keep_flowing_across_swaps() {
    frames_keep_flowing_across_swaps(1);
}

/// A flow of frames from a to b arrives whole and in order while updates move the
/// ports around (with several workers, from one worker to another).
pub(super) fn frames_keep_flowing_across_swaps(workers: usize) {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start_workers(workers, tables(&["a", "b"]), vec![pa, pb]);
    const N: u16 = 3000;
    let sender = thread::spawn(move || {
        for i in 0..N {
            wa.send("10.0.2.5", i);
            if i % 16 == 0 {
                thread::sleep(Duration::from_micros(200));
            }
        }
        wa
    });
    let receiver = thread::spawn(move || {
        let mut got = Vec::new();
        while let Some(sport) = wb.recv(Duration::from_secs(2)) {
            got.push(sport);
            if got.len() == usize::from(N) {
                break;
            }
        }
        got
    });
    // Meanwhile: a port comes and goes, and a and b trade places.
    let layouts: [&[&str]; 4] = [&["a", "b", "x"], &["b", "x", "a"], &["b", "a"], &["a", "b"]];
    let mut updates = 0;
    let mut x_wires = Vec::new();
    while !sender.is_finished() {
        for names in layouts {
            let new_ports = if updates % 4 == 0 {
                let (px, wx) = fake("x");
                x_wires.push(wx);
                vec![px]
            } else {
                vec![]
            };
            drop(w.update(tables(names), new_ports));
            updates += 1;
        }
    }
    let _wa = sender.join().unwrap();
    let got = receiver.join().unwrap();
    assert!(updates >= 4);
    assert_eq!(
        got,
        (0..N).collect::<Vec<_>>(),
        "every frame arrived, in order, across {updates} updates"
    );
    let (_, _, r) = w.finish();
    let stats = r.unwrap();
    assert_eq!(stats.updates, updates);
    assert_eq!(stats.tx_dropped, 0);
}

#[test]
fn test_send_to_no_running_worker_gives_the_update_back() {
    let control = Control::new();
    let u = Update {
        tables: tables(&["a"]),
        new_ports: vec![fake("a").0],
    };
    let e = control.send(u, SHORT).unwrap_err();
    assert!(matches!(e, UpdateError::TimedOut(_)), "{e}");
    let u = e.into_update().unwrap();
    assert_eq!(u.new_ports.len(), 1);

    // After a worker ran and stopped: at once.
    let (pa, _wa) = fake("a");
    let mut pipeline = Pipeline::new(tables(&["a"]));
    let mut ports = vec![pa];
    run_worker_with(
        &mut ports,
        &mut pipeline,
        &AtomicBool::new(true),
        || 0,
        &control,
    )
    .unwrap();
    assert!(!control.is_running());
    let begun = Instant::now();
    let e = control.send(u, WAIT).unwrap_err();
    assert!(matches!(e, UpdateError::Stopped(_)), "{e}");
    assert!(begun.elapsed() < WAIT);
}

#[test]
fn test_snapshot_follows_the_running_worker() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    for i in 0..5 {
        wa.send("10.0.2.5", i);
        wb.expect(i);
    }
    let deadline = Instant::now() + WAIT;
    let snap = loop {
        let s = w.control.snapshot();
        if s.worker.rx_frames >= 5 || Instant::now() > deadline {
            break s;
        }
        thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(snap.worker.rx_frames, 5, "published within {WAIT:?}");
    assert_eq!(snap.ports[0].pipeline.rx_packets, 5);
    assert_eq!(snap.ports[1].linux.tx_frames, 5);
    assert_eq!(snap.drops.total(), 0);
    let control = Arc::clone(&w.control);
    let (_, _, r) = w.finish();
    assert_eq!(
        control.snapshot().worker,
        r.unwrap(),
        "the final counts are published"
    );
}

#[test]
fn test_job_runs_on_the_worker_state_and_answers() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let w = Running::start(tables(&["a", "b"]), vec![pa, pb]);
    for i in 0..3 {
        wa.send("10.0.2.5", i);
        wb.expect(i);
    }
    let (rx, names) = w
        .control
        .run(WAIT, |v| {
            let rx = v.pipeline.port_stats()[0].rx_packets;
            let names: Vec<String> = v.ports.iter().map(|n| n.to_string()).collect();
            (rx, names)
        })
        .expect("the job ran");
    assert_eq!(rx, 3, "the job saw the pipeline that forwarded the frames");
    assert_eq!(names, ["a", "b"]);
    // Forwarding goes on after a job.
    wa.send("10.0.2.5", 3);
    wb.expect(3);
    let control = Arc::clone(&w.control);
    let _ = w.finish();
    assert_eq!(
        control.run(WAIT, |_| ()).unwrap_err(),
        JobError::Stopped,
        "a stopped worker runs no job"
    );
}

#[test]
fn test_job_without_a_worker_is_refused_at_once() {
    let control = Control::new();
    let begun = Instant::now();
    assert_eq!(control.run(WAIT, |_| 1).unwrap_err(), JobError::Stopped);
    assert!(begun.elapsed() < WAIT);
}

/// [`spec`] with port `b` a pod's (`kind: pod`), the pod at 10.0.2.5.
pub(super) fn spec_with_pod_b(names: &[&str]) -> Arc<Tables> {
    Arc::new(pod_b_spec(names).compile().unwrap())
}

/// The spec of [`spec_with_pod_b`].
fn pod_b_spec(names: &[&str]) -> TablesSpec {
    let mut spec = spec(names);
    for p in &mut spec.ports {
        if p.name == "b" {
            p.kind = ferry_datapath::PortKind::Pod;
            p.peer_mac = Some(MacAddr([2, 0, 0, 0, 0, 0xfe]));
            p.addresses = vec!["10.0.2.5".parse().unwrap()];
        }
    }
    spec
}

/// Waits until the worker's snapshot says port `name` is out of service; returns why.
pub(super) fn wait_gone(w: &Running, name: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let snap = w.control.snapshot();
        if let Some(why) = snap
            .ports
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.gone.clone())
        {
            return why;
        }
        assert!(
            Instant::now() < deadline && w.control.is_running(),
            "port {name} not taken out of service: {:?}",
            snap.worker
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn test_a_pod_port_whose_device_is_gone_is_taken_out_of_service() {
    let (pa, wa) = fake("a");
    let (pb, wb) = fake("b");
    let (pc, wc) = fake("c");
    let w = Running::start(spec_with_pod_b(&["a", "b", "c"]), vec![pa, pb, pc]);
    wa.send("10.0.2.5", 1);
    wb.expect(1);

    wb.vanish();
    let why = wait_gone(&w, "b");
    assert!(why.contains("bad state"), "{why}");
    assert!(wb.is_closed(), "b's descriptor is closed");
    // Far more rounds than MAX_FAILING_ROUNDS could take.
    thread::sleep(Duration::from_millis(300));
    assert!(w.control.is_running(), "the worker stopped");
    wa.send("10.0.3.5", 2);
    wc.expect(2);
    wa.send("10.0.2.5", 3);
    wa.send("10.0.3.5", 4);
    wc.expect(4);
    wb.expect_nothing();
    // The counters are published every STATS_INTERVAL_NS.
    let deadline = Instant::now() + WAIT;
    let mut snap = w.control.snapshot();
    while snap.worker.tx_frames < 3 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
        snap = w.control.snapshot();
    }
    assert_eq!(
        (
            snap.worker.ports_gone,
            snap.worker.tx_dropped,
            snap.worker.tx_frames
        ),
        (1, 1, 3),
        "{:?}",
        snap.worker
    );

    // An update that keeps b keeps it out of service, at its new index.
    w.update(spec_with_pod_b(&["c", "b", "a"]), vec![]);
    wa.send("10.0.2.5", 5);
    wa.send("10.0.3.5", 6);
    wc.expect(6);
    wb.expect_nothing();
    let gone: Vec<String> = w
        .control
        .snapshot()
        .ports
        .iter()
        .filter(|p| p.gone.is_some())
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(gone, ["b"]);

    // A new port of that name puts b back in service.
    let (pb2, wb2) = fake("b");
    let applied = w.update(spec_with_pod_b(&["c", "b", "a"]), vec![pb2]);
    assert_eq!(names(&applied.closed), ["b"]);
    wa.send("10.0.2.5", 7);
    wb2.expect(7);
    assert!(w.control.snapshot().ports.iter().all(|p| p.gone.is_none()));

    // b gone again, then dropped from the tables: let go as any removed port.
    wb2.vanish();
    wait_gone(&w, "b");
    let applied = w.update(tables(&["a", "c"]), vec![]);
    assert_eq!(names(&applied.closed), ["b"]);
    wa.send("10.0.3.5", 8);
    wc.expect(8);
    let (ports, _, r) = w.finish();
    let stats = r.expect("the worker kept running");
    assert_eq!(stats.ports_gone, 2, "{stats:?}");
    assert_eq!(names(&ports), ["a", "c"]);
}

#[test]
fn test_a_port_other_than_a_pods_whose_device_is_gone_stops_the_worker() {
    let (pa, _wa) = fake("a");
    let (pb, _wb) = fake("b");
    let (pc, wc) = fake("c");
    let w = Running::start(spec_with_pod_b(&["a", "b", "c"]), vec![pa, pb, pc]);
    wc.vanish();
    let deadline = Instant::now() + WAIT;
    while w.control.is_running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let (_, _, r) = w.finish();
    let e = r.unwrap_err();
    assert!(
        e.to_string()
            .contains("port fake-c: 1000 receive errors in a row"),
        "{e}"
    );
}

#[test]
fn test_a_port_that_says_its_device_was_deleted_stops_the_worker_at_once() {
    let (pa, _wa) = fake("a");
    let (pb, _wb) = fake("b");
    let (pc, wc) = fake("c");
    let w = Running::start(spec_with_pod_b(&["a", "b", "c"]), vec![pa, pb, pc]);
    wc.delete_device();
    let deadline = Instant::now() + WAIT;
    while w.control.is_running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let (_, _, r) = w.finish();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert_eq!(e.to_string(), "fake-c: the device is gone");
}

/// [`spec_with_pod_b`] with the pod isolated for ingress by NetworkPolicy `x/b`, which
/// allows nothing.
fn isolated_pod_b(names: &[&str]) -> Arc<Tables> {
    use ferry_datapath::policy::{DirectionSpec, PodPolicySpec, PolicySpec};
    let mut spec = pod_b_spec(names);
    spec.policy = PolicySpec {
        policies: vec!["NetworkPolicy x/b".into()],
        pods: vec![PodPolicySpec {
            port: "b".into(),
            ingress: DirectionSpec {
                isolated_by: vec![0],
                ..DirectionSpec::default()
            },
            egress: DirectionSpec::default(),
        }],
        ..PolicySpec::default()
    };
    Arc::new(spec.compile().unwrap())
}

#[test]
fn test_denials_are_handed_over_with_the_counters_when_the_pipeline_audits() {
    for audit in [0, 16] {
        let (pa, wa) = fake("a");
        let (pb, wb) = fake("b");
        let w = Running::start_audited(1, isolated_pod_b(&["a", "b"]), vec![pa, pb], audit);
        for sport in [1, 2, 3] {
            wa.send("10.0.2.5", sport);
        }
        wb.expect_nothing();
        let deadline = Instant::now() + WAIT;
        let mut denials = Vec::new();
        loop {
            w.control.take_denials(&mut denials);
            let denied = w.control.snapshot().pipeline.policy_denied;
            if (denials.len() >= 3 || audit == 0 && denied >= 3) || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        if audit == 0 {
            assert!(denials.is_empty(), "no audit: {denials:?}");
            continue;
        }
        let sports: Vec<u16> = denials.iter().map(|d| d.key.src_port).collect();
        assert_eq!(sports, [1, 2, 3], "handed over within {WAIT:?}");
        assert_eq!(denials[0].port_name(), "b");
        assert_eq!(
            denials[0].denied_by(),
            ferry_datapath::DeniedBy::Isolated(vec!["NetworkPolicy x/b"])
        );
        w.control.take_denials(&mut denials);
        assert_eq!(denials.len(), 3, "taken once");
    }
}
