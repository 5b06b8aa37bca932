//! End-to-end: a worker forwards between two pods' TAP ports through the pipeline.
//!
//! Pods A (10.77.1.2) and B (10.77.2.2) are namespaces with TAPs as eth0; each reaches the
//! other through a gateway address whose MAC is ferry's port MAC (a static neighbour
//! entry, so that the ports can stay `plain`). Needs root and `ip`.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Netns, dev_name, mac_str, ping, require_root_and_ip};
use ferry_datapath::wire::build;
use ferry_datapath::{
    MacAddr, PREFETCH_MIN_CONNECTIONS, Pipeline, PortKind, PortSpec, RouteSpec, TablesSpec,
};
use ferry_linux::link::{self, PodInterface};
use ferry_linux::{
    Control, NamedPort, Port, TapPort, Update, WorkerStats, run_worker, run_worker_with,
};

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);
const FERRY_MAC_A: [u8; 6] = [0x02, 0xfe, 0, 0, 0, 0x0a];
const FERRY_MAC_B: [u8; 6] = [0x02, 0xfe, 0, 0, 0, 0x0b];
const WAIT: Duration = Duration::from_secs(5);

struct Pod {
    ns: Netns,
    mac: [u8; 6],
}

fn pod(tag: &str, addr: Ipv4Addr, ferry_mac: [u8; 6]) -> (Pod, TapPort) {
    let ns = Netns::new(tag);
    let port = TapPort::create(&dev_name(tag)).expect("TAP port");
    link::move_to_netns(
        port.name(),
        &PodInterface {
            netns: &ns.name,
            name: "eth0",
            mtu: 1500,
            addresses: &[format!("{addr}/24").parse().unwrap()],
        },
    )
    .expect("TAP into the pod");
    let o = addr.octets();
    let gw = Ipv4Addr::new(o[0], o[1], o[2], 1).to_string();
    ns.ip(&[
        "neigh",
        "replace",
        &gw,
        "lladdr",
        &mac_str(ferry_mac),
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    ns.ip(&["route", "add", "10.77.0.0/16", "via", &gw, "dev", "eth0"]);
    let mac = link::mac_address(Some(&ns.name), "eth0").unwrap();
    (Pod { ns, mac }, port)
}

fn port_spec(name: &str, mac: [u8; 6], addr: &str) -> PortSpec {
    PortSpec {
        name: name.into(),
        mac: MacAddr(mac),
        mtu: Some(1500),
        addresses: vec![addr.parse().unwrap()],
        gso: true,
        ..PortSpec::default()
    }
}

fn route(prefix: &str, port: &str, mac: [u8; 6]) -> RouteSpec {
    RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: port.into(),
        next_hop_mac: Some(MacAddr(mac)),
        via: None,
    }
}

/// What the worker thread gives back: its ports, its pipeline and its counts.
type Finished = (Vec<Box<dyn Port>>, Pipeline, WorkerStats);

/// Stops the worker on drop (also when an assertion fails), so the test never hangs.
/// `T` is what the worker thread gives back.
struct Running<T = Finished> {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<T>>,
}

impl<T> Running<T> {
    fn finish(mut self) -> T {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("worker panicked")
    }
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Pods A and B, each with its TAP port, and a worker forwarding between them.
fn two_pods(tag_a: &str, tag_b: &str) -> (Pod, Pod, Running) {
    let (pod_a, port_a) = pod(tag_a, A, FERRY_MAC_A);
    let (pod_b, port_b) = pod(tag_b, B, FERRY_MAC_B);
    let spec = TablesSpec {
        ports: vec![
            port_spec("pod-a", FERRY_MAC_A, "10.77.1.1"),
            port_spec("pod-b", FERRY_MAC_B, "10.77.2.1"),
        ],
        routes: vec![
            route("10.77.1.2/32", "pod-a", pod_a.mac),
            route("10.77.2.2/32", "pod-b", pod_b.mac),
        ],
        ..TablesSpec::default()
    };
    let mut pipeline = Pipeline::new(Arc::new(spec.compile().unwrap()));
    // ports[i] is the tables' port i.
    let mut ports: Vec<Box<dyn Port>> = vec![Box::new(port_a), Box::new(port_b)];
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handle = thread::spawn(move || {
        let t0 = Instant::now();
        let stats = run_worker(&mut ports, &mut pipeline, &flag, || {
            t0.elapsed().as_nanos() as u64
        })
        .expect("worker");
        (ports, pipeline, stats)
    });
    let running = Running {
        stop,
        handle: Some(handle),
    };
    (pod_a, pod_b, running)
}

#[test]
fn worker_forwards_ping_and_tcp_between_two_pods() {
    require_root_and_ip();
    let (pod_a, pod_b, running) = two_pods("wka", "wkb");

    // Pings both ways, payload compared.
    let payload = build::pattern(1000, 4);
    let p = payload.clone();
    let got = pod_a
        .ns
        .run(move || ping(B, 0x77, &p, WAIT))
        .expect("ping A -> B through ferry");
    assert_eq!(got, payload);
    let p = payload.clone();
    let got = pod_b
        .ns
        .run(move || ping(A, 0x78, &p, WAIT))
        .expect("ping B -> A through ferry");
    assert_eq!(got, payload);

    // TCP: A sends 2 MiB to B, B answers with 512 KiB; both compared byte for byte.
    let up = build::pattern(2 << 20, 11);
    let down = build::pattern(512 << 10, 13);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (down_srv, up_want) = (down.clone(), up.len());
    let server = ferry_linux::netns::spawn_in(&pod_b.ns.name, move || {
        let l = TcpListener::bind((B, 9200))?;
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept()?;
        s.set_read_timeout(Some(WAIT))?;
        s.set_write_timeout(Some(WAIT))?;
        let mut v = Vec::with_capacity(up_want);
        s.read_to_end(&mut v)?;
        s.write_all(&down_srv)?;
        s.shutdown(Shutdown::Write)?;
        Ok::<_, std::io::Error>(v)
    })
    .unwrap();
    ready_rx.recv_timeout(WAIT).expect("server in B listening");
    let up_cli = up.clone();
    let client = ferry_linux::netns::spawn_in(&pod_a.ns.name, move || {
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(B.into(), 9200), WAIT)?;
        s.set_read_timeout(Some(WAIT))?;
        s.set_write_timeout(Some(WAIT))?;
        s.write_all(&up_cli)?;
        s.shutdown(Shutdown::Write)?;
        let mut v = Vec::new();
        s.read_to_end(&mut v)?;
        Ok::<_, std::io::Error>(v)
    })
    .unwrap();
    let got_down = client.join().unwrap().unwrap().expect("client in A");
    let got_up = server.join().unwrap().unwrap().expect("server in B");
    assert!(
        got_up == up,
        "B received {} of {} bytes, or different bytes",
        got_up.len(),
        up.len()
    );
    assert!(
        got_down == down,
        "A received {} of {} bytes, or different bytes",
        got_down.len(),
        down.len()
    );

    let (ports, pipeline, stats) = running.finish();
    assert!(stats.rx_frames > 0 && stats.tx_frames > 0, "{stats:?}");
    assert_eq!(
        (stats.rx_errors, stats.tx_errors, stats.tx_dropped),
        (0, 0, 0),
        "{stats:?}"
    );
    for p in &ports {
        assert_eq!(
            p.counters().tx_errors,
            0,
            "{}: {:?}",
            p.name(),
            p.counters()
        );
    }
    assert!(pipeline.port_stats()[1].tx_packets > 0);

    // Dropping the ports removes the devices.
    drop(ports);
    for pod in [&pod_a, &pod_b] {
        let e = link::mac_address(Some(&pod.ns.name), "eth0");
        assert!(
            e.is_err(),
            "eth0 still in {} after the ports were dropped",
            pod.ns.name
        );
    }
}

#[test]
fn worker_takes_a_pod_port_in_and_lets_it_go_while_running() {
    require_root_and_ip();
    let (pod_a, port_a) = pod("wua", A, FERRY_MAC_A);
    let only_a = |pod_a: &Pod| TablesSpec {
        ports: vec![port_spec("pod-a", FERRY_MAC_A, "10.77.1.1")],
        routes: vec![route("10.77.1.2/32", "pod-a", pod_a.mac)],
        ..TablesSpec::default()
    };
    let tables_a = Arc::new(only_a(&pod_a).compile().unwrap());
    let control = Arc::new(Control::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, c) = (Arc::clone(&stop), Arc::clone(&control));
    let handle = thread::spawn(move || {
        let mut ports: Vec<NamedPort> = vec![("pod-a".into(), Box::new(port_a))];
        let mut pipeline = Pipeline::new(tables_a);
        let t0 = Instant::now();
        let r = run_worker_with(
            &mut ports,
            &mut pipeline,
            &flag,
            || t0.elapsed().as_nanos() as u64,
            &c,
        );
        (ports, pipeline, r)
    });
    let running = Running {
        stop,
        handle: Some(handle),
    };

    // Pod B appears: its port comes first in the new tables, A's moves to second.
    let (pod_b, port_b) = pod("wub", B, FERRY_MAC_B);
    let both = TablesSpec {
        ports: vec![
            port_spec("pod-b", FERRY_MAC_B, "10.77.2.1"),
            port_spec("pod-a", FERRY_MAC_A, "10.77.1.1"),
        ],
        routes: vec![
            route("10.77.1.2/32", "pod-a", pod_a.mac),
            route("10.77.2.2/32", "pod-b", pod_b.mac),
        ],
        ..TablesSpec::default()
    };
    let applied = control
        .send(
            Update {
                tables: Arc::new(both.compile().unwrap()),
                new_ports: vec![("pod-b".into(), Box::new(port_b))],
            },
            WAIT,
        )
        .expect("pod B added");
    assert_eq!(applied.report.ports_added, ["pod-b"]);
    assert!(applied.closed.is_empty());
    let payload = build::pattern(600, 7);
    let p = payload.clone();
    let got = pod_a
        .ns
        .run(move || ping(B, 0x79, &p, WAIT))
        .expect("ping A -> B through ferry after B's port was added");
    assert_eq!(got, payload);

    // Pod B goes: its TAP is handed back, and disappears when dropped.
    let applied = control
        .send(
            Update {
                tables: Arc::new(only_a(&pod_a).compile().unwrap()),
                new_ports: vec![],
            },
            WAIT,
        )
        .expect("pod B removed");
    assert_eq!(applied.report.ports_removed, ["pod-b"]);
    let closed: Vec<&str> = applied.closed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(closed, ["pod-b"]);
    assert!(
        link::mac_address(Some(&pod_b.ns.name), "eth0").is_ok(),
        "B's eth0 stays until the sender drops the port"
    );
    drop(applied);
    let deadline = Instant::now() + WAIT;
    while link::mac_address(Some(&pod_b.ns.name), "eth0").is_ok() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        link::mac_address(Some(&pod_b.ns.name), "eth0").is_err(),
        "eth0 still in {} {WAIT:?} after its port was dropped",
        pod_b.ns.name
    );
    let p = payload.clone();
    let e = pod_a
        .ns
        .run(move || ping(B, 0x7a, &p, Duration::from_millis(300)));
    assert!(e.is_err(), "B answered after its port was removed");

    let snap = control.snapshot();
    assert_eq!(snap.worker.updates, 2);
    let names: Vec<&str> = snap.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["pod-a"]);
    let (ports, pipeline, r) = running.finish();
    let stats = r.expect("worker");
    assert_eq!((stats.rx_errors, stats.tx_errors), (0, 0), "{stats:?}");
    assert_eq!(ports.len(), 1);
    assert!(
        pipeline.port_stats()[0].tx_packets > 0,
        "A's counters followed it to index 1 and back"
    );
}

/// A pod's port as the agent describes it (`kind: pod`): its device going away takes it
/// out of service instead of stopping the worker.
fn pod_port_spec(name: &str, mac: [u8; 6], pod: &Pod, addr: Ipv4Addr) -> PortSpec {
    PortSpec {
        name: name.into(),
        mac: MacAddr(mac),
        kind: PortKind::Pod,
        mtu: Some(1500),
        addresses: vec![addr.to_string().parse().unwrap()],
        peer_mac: Some(MacAddr(pod.mac)),
        gso: true,
        ..PortSpec::default()
    }
}

#[test]
fn worker_takes_a_pod_port_out_of_service_when_its_namespace_is_deleted() {
    require_root_and_ip();
    const C: Ipv4Addr = Ipv4Addr::new(10, 77, 3, 2);
    const FERRY_MAC_C: [u8; 6] = [0x02, 0xfe, 0, 0, 0, 0x0c];
    let (pod_a, port_a) = pod("wga", A, FERRY_MAC_A);
    let (pod_b, port_b) = pod("wgb", B, FERRY_MAC_B);
    let (pod_c, port_c) = pod("wgc", C, FERRY_MAC_C);
    let a_and_b = vec![
        pod_port_spec("pod-a", FERRY_MAC_A, &pod_a, A),
        pod_port_spec("pod-b", FERRY_MAC_B, &pod_b, B),
    ];
    let routes = vec![
        route("10.77.1.2/32", "pod-a", pod_a.mac),
        route("10.77.2.2/32", "pod-b", pod_b.mac),
        route("10.77.3.2/32", "pod-c", pod_c.mac),
    ];
    let mut all = a_and_b.clone();
    all.push(pod_port_spec("pod-c", FERRY_MAC_C, &pod_c, C));
    let spec = TablesSpec {
        ports: all,
        routes: routes.clone(),
        ..TablesSpec::default()
    };
    let tables = Arc::new(spec.compile().unwrap());
    let control = Arc::new(Control::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, c) = (Arc::clone(&stop), Arc::clone(&control));
    let handle = thread::spawn(move || {
        let mut ports: Vec<NamedPort> = vec![
            ("pod-a".into(), Box::new(port_a)),
            ("pod-b".into(), Box::new(port_b)),
            ("pod-c".into(), Box::new(port_c)),
        ];
        let mut pipeline = Pipeline::new(tables);
        let t0 = Instant::now();
        let r = run_worker_with(
            &mut ports,
            &mut pipeline,
            &flag,
            || t0.elapsed().as_nanos() as u64,
            &c,
        );
        (ports, pipeline, r)
    });
    let running = Running {
        stop,
        handle: Some(handle),
    };
    let payload = build::pattern(400, 3);
    let ping_from_a = |dst: Ipv4Addr, id: u16, timeout: Duration| {
        let p = payload.clone();
        pod_a.ns.run(move || ping(dst, id, &p, timeout))
    };
    assert_eq!(ping_from_a(B, 0x81, WAIT).expect("A -> B"), payload);
    assert_eq!(ping_from_a(C, 0x82, WAIT).expect("A -> C"), payload);

    // C's sandbox goes without a word to ferry: its namespace is deleted, the kernel
    // unregisters the TAP, whose descriptor then fails with EBADFD.
    let Pod { ns: ns_c, .. } = pod_c;
    drop(ns_c);
    let deadline = Instant::now() + WAIT;
    let gone = loop {
        let snap = control.snapshot();
        if let Some(why) = snap
            .ports
            .iter()
            .find(|p| p.name == "pod-c")
            .and_then(|p| p.gone.clone())
        {
            break why;
        }
        assert!(
            Instant::now() < deadline && !running.handle.as_ref().unwrap().is_finished(),
            "pod C's port not taken out of service: {:?}",
            snap.worker
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(gone.contains("bad state"), "{gone}");
    // Long enough for a worker spinning on the dead descriptor to have given up.
    thread::sleep(Duration::from_millis(500));
    assert!(
        !running.handle.as_ref().unwrap().is_finished(),
        "the worker stopped"
    );
    assert_eq!(
        ping_from_a(B, 0x83, WAIT).expect("A -> B with C gone"),
        payload
    );
    assert!(
        ping_from_a(C, 0x84, Duration::from_millis(300)).is_err(),
        "C answered after its namespace was deleted"
    );
    let snap = control.snapshot();
    assert_eq!(snap.worker.ports_gone, 1, "{:?}", snap.worker);
    assert!(snap.worker.tx_dropped > 0, "{:?}", snap.worker);
    let gone_ports: Vec<&str> = snap
        .ports
        .iter()
        .filter(|p| p.gone.is_some())
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(gone_ports, ["pod-c"]);

    // The control plane learns that C's pod is gone: the update lets its port go.
    let applied = control
        .send(
            Update {
                tables: Arc::new(
                    TablesSpec {
                        ports: a_and_b,
                        routes: routes[..2].to_vec(),
                        ..TablesSpec::default()
                    }
                    .compile()
                    .unwrap(),
                ),
                new_ports: vec![],
            },
            WAIT,
        )
        .expect("pod C removed");
    let closed: Vec<&str> = applied.closed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(closed, ["pod-c"]);
    drop(applied);
    assert_eq!(
        ping_from_a(B, 0x85, WAIT).expect("A -> B after C's removal"),
        payload
    );
    assert!(control.snapshot().ports.iter().all(|p| p.gone.is_none()));

    let (ports, _, r) = running.finish();
    let stats = r.expect("the worker kept running");
    assert_eq!((stats.ports_gone, stats.updates), (1, 1), "{stats:?}");
    assert_eq!(ports.len(), 2);
}

/// More UDP connections than the pipeline's prefetch threshold, so that from the second
/// round on every receive batch goes the prefetching way (`Pipeline::process_batch`).
const MANY: usize = PREFETCH_MIN_CONNECTIONS + 1000;
/// The first destination port of the `MANY` connections, one port each.
const FIRST_PORT: u16 = 20000;
/// A's source port for them.
const FROM_PORT: u16 = 40000;

/// Counts, in the calling thread's namespace, the UDP datagrams from A's `FROM_PORT`
/// whose payload is `[b'f', round, port]` for the destination port they came to, until
/// both rounds are whole or `stop` is set; `got[round]` is how many distinct ports of
/// that round arrived. A raw socket sees every UDP datagram the namespace receives,
/// whatever its port. Returns the datagrams that were not what was sent.
fn count_rounds(
    ready: mpsc::Sender<()>,
    got: &[AtomicUsize; 2],
    stop: &AtomicBool,
) -> std::io::Result<usize> {
    // SAFETY: socket() takes no pointers; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_UDP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let size: libc::c_int = 8 << 20;
    // SAFETY: the option value is a live c_int and its length is given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let _ = ready.send(());
    let mut seen = vec![[false; 2]; MANY];
    let mut wrong = 0;
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        // SAFETY: `buf` is writable for its whole length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pkt = &buf[..n as usize];
        let ihl = usize::from(pkt[0] & 0x0f) * 4;
        let (ip, udp) = pkt.split_at(ihl);
        if ip[12..16] != A.octets() || udp.len() < 8 || udp[0..2] != FROM_PORT.to_be_bytes() {
            continue;
        }
        let port = u16::from_be_bytes([udp[2], udp[3]]);
        let i = usize::from(port.wrapping_sub(FIRST_PORT));
        match &udp[8..] {
            [b'f', r @ (0 | 1), p @ ..] if i < MANY && p == port.to_be_bytes() => {
                let r = usize::from(*r);
                if !seen[i][r] {
                    seen[i][r] = true;
                    got[r].fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => wrong += 1,
        }
    }
    Ok(wrong)
}

#[test]
fn worker_prefetches_batches_of_a_large_table_and_delivers_every_packet() {
    require_root_and_ip();
    let (pod_a, pod_b, running) = two_pods("wpa", "wpb");

    let got = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let done = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (g, d) = (Arc::clone(&got), Arc::clone(&done));
    let counter =
        ferry_linux::netns::spawn_in(&pod_b.ns.name, move || count_rounds(ready_tx, &g, &d))
            .unwrap();
    ready_rx.recv_timeout(WAIT).expect("counter in B ready");

    // Round 0 makes MANY connections, one destination port each; round 1 sends one more
    // datagram on each, now through prefetched batches. At most WINDOW datagrams are in
    // flight, so that no queue on the way overflows.
    const WINDOW: usize = 256;
    let g = Arc::clone(&got);
    let sender = ferry_linux::netns::spawn_in(&pod_a.ns.name, move || {
        let sock = UdpSocket::bind((A, FROM_PORT))?;
        for round in 0..2u8 {
            let arrived = &g[usize::from(round)];
            for i in 0..MANY {
                let port = FIRST_PORT + i as u16;
                let deadline = Instant::now() + WAIT;
                while i - arrived.load(Ordering::Relaxed) >= WINDOW {
                    if Instant::now() > deadline {
                        return Ok(round);
                    }
                    thread::sleep(Duration::from_micros(200));
                }
                let [hi, lo] = port.to_be_bytes();
                sock.send_to(&[b'f', round, hi, lo], (B, port))?;
            }
            let deadline = Instant::now() + WAIT;
            while arrived.load(Ordering::Relaxed) < MANY && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
        }
        Ok::<_, std::io::Error>(2)
    })
    .unwrap();
    let rounds = sender.join().unwrap().unwrap().expect("sender in A");
    // A ping goes through the prefetching path too.
    let payload = build::pattern(700, 9);
    let p = payload.clone();
    let echoed = pod_a.ns.run(move || ping(B, 0x7b, &p, WAIT));
    done.store(true, Ordering::Relaxed);
    let wrong = counter.join().unwrap().unwrap().expect("counter in B");
    let got = [0, 1].map(|r| got[r].load(Ordering::Relaxed));
    assert_eq!(rounds, 2, "a round stalled: {got:?} of {MANY} arrived");
    assert_eq!(got, [MANY, MANY], "datagrams of each round that arrived");
    assert_eq!(
        wrong, 0,
        "datagrams that arrived different from what was sent"
    );
    assert_eq!(echoed.expect("ping A -> B with a large table"), payload);

    let (_ports, pipeline, stats) = running.finish();
    let ct = pipeline.conntrack();
    assert!(
        ct.len() >= PREFETCH_MIN_CONNECTIONS,
        "{} connections tracked: round 1 did not take the prefetching path",
        ct.len()
    );
    assert!(
        ct.stats().found >= MANY as u64,
        "round 1 found its connections: {:?}",
        ct.stats()
    );
    assert_eq!(
        (stats.rx_errors, stats.tx_errors, stats.tx_dropped),
        (0, 0, 0),
        "{stats:?}"
    );
}
