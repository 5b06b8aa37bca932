//! End-to-end: an AF_PACKET uplink on one end of a veth pair between two namespaces.
//!
//! "node" holds ferry's uplink `up0` (10.202.0.1); "peer" holds the other end `pe0`
//! (10.202.0.2) and the kernel sockets that send and check traffic. Needs root and `ip`.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::RawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Netns, mac_str, ping, require_root_and_ip};
use ferry_datapath::VnetHdr;
use ferry_datapath::proto;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::parse;
use ferry_linux::af_packet::RxMode;
use ferry_linux::link;
use ferry_linux::{AfPacketConfig, AfPacketPort, Frame, Port};

const NODE: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 2);
const WAIT: Duration = Duration::from_secs(5);

struct Lab {
    node: Netns,
    peer: Netns,
    node_mac: [u8; 6],
    peer_mac: [u8; 6],
}

fn lab(tag: &str) -> Lab {
    require_root_and_ip();
    let node = Netns::new(&format!("{tag}-n"));
    let peer = Netns::new(&format!("{tag}-p"));
    node.ip(&[
        "link", "add", "up0", "type", "veth", "peer", "name", "pe0", "netns", &peer.name,
    ]);
    node.ip(&["addr", "add", &format!("{NODE}/24"), "dev", "up0"]);
    peer.ip(&["addr", "add", &format!("{PEER}/24"), "dev", "pe0"]);
    node.ip(&["link", "set", "dev", "up0", "up"]);
    peer.ip(&["link", "set", "dev", "pe0", "up"]);
    let node_mac = link::mac_address(Some(&node.name), "up0").unwrap();
    let peer_mac = link::mac_address(Some(&peer.name), "pe0").unwrap();
    Lab {
        node,
        peer,
        node_mac,
        peer_mac,
    }
}

fn open(lab: &Lab, cfg: AfPacketConfig) -> AfPacketPort {
    lab.node
        .run(move || AfPacketPort::open("up0", &cfg))
        .expect("open the AF_PACKET port")
}

fn wait_readable(fd: RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// Receives frames until `want` is true of one (returned) or `timeout` passes (None).
fn recv_until(
    port: &mut AfPacketPort,
    timeout: Duration,
    mut want: impl FnMut(&Frame) -> bool,
    seen: &mut Vec<Frame>,
) -> Option<Frame> {
    let deadline = Instant::now() + timeout;
    let mut batch = Vec::new();
    while Instant::now() < deadline {
        wait_readable(port.raw_fd(), 20);
        batch.clear();
        port.recv_batch(&mut batch, 64).expect("recv_batch");
        for f in batch.drain(..) {
            if want(&f) {
                return Some(f);
            }
            seen.push(f);
        }
    }
    None
}

fn udp_to(f: &Frame, dst: Ipv4Addr, port: u16) -> Option<Vec<u8>> {
    let p = parse(&f.data, 0).ok()?;
    (p.proto == proto::UDP && p.key.dst == IpAddr::V4(dst) && p.key.dst_port == port)
        .then(|| f.data[p.l4_off + 8..p.ip_end].to_vec())
}

/// Sends a TCP stream of `len` bytes from the peer's kernel to the node's (a listener on
/// the node's address); returns what the node's server read, once it is done.
fn tcp_stream_to_node(
    lab: &Lab,
    port: u16,
    len: usize,
) -> mpsc::Receiver<(Result<(), String>, Vec<u8>)> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let _server = ferry_linux::netns::spawn_in(&lab.node.name, move || {
        let l = TcpListener::bind((NODE, port)).unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut v = Vec::new();
        let r = s.read_to_end(&mut v);
        done_tx
            .send((r.map(drop).map_err(|e| e.to_string()), v))
            .unwrap();
    })
    .unwrap();
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let sent = build::pattern(len, 9);
    let _client = ferry_linux::netns::spawn_in(&lab.peer.name, move || {
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(NODE.into(), port), WAIT)?;
        s.set_write_timeout(Some(WAIT))?;
        s.write_all(&sent)
    })
    .unwrap();
    done_rx
}

/// A datagram from the peer arrives with its virtio-net header (a partial checksum), and a
/// TCP stream's GSO super-packets arrive whole, with their offload state.
fn receives_frames_and_gso_super_packets(tag: &str, rx_mode: RxMode) {
    let lab = lab(tag);
    let cfg = AfPacketConfig {
        rx_mode,
        ..AfPacketConfig::default()
    };
    let mut port = open(&lab, cfg);
    assert_eq!(port.rx_mode(), rx_mode);
    assert!(!port.drops_kernel_ingress());

    // A UDP datagram from the peer's kernel.
    lab.peer.run(|| {
        let s = UdpSocket::bind((PEER, 0)).unwrap();
        s.send_to(b"hello ferry", (NODE, 7000)).unwrap();
    });
    let mut seen = Vec::new();
    let f = recv_until(
        &mut port,
        WAIT,
        |f| udp_to(f, NODE, 7000).is_some(),
        &mut seen,
    )
    .unwrap_or_else(|| {
        panic!(
            "{rx_mode:?}: no UDP frame within {WAIT:?}; {} others",
            seen.len()
        )
    });
    assert_eq!(udp_to(&f, NODE, 7000).unwrap(), b"hello ferry");
    assert_eq!(&f.data[6..12], &lab.peer_mac, "sent by the peer");
    // The veth leaves the UDP checksum to be finished: the header says where it is.
    let partial = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        csum_start: 14 + 20,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    assert_eq!(
        f.vnet, partial,
        "{rx_mode:?}: the datagram's virtio-net header"
    );

    // A TCP stream to the node's kernel: the veth carries it as super-packets.
    const LEN: usize = 256 * 1024;
    let done = tcp_stream_to_node(&lab, 9100, LEN);
    let gso = recv_until(
        &mut port,
        WAIT,
        |f| f.vnet.is_gso() && f.data.len() > 1514,
        &mut seen,
    )
    .unwrap_or_else(|| panic!("{rx_mode:?}: no GSO super-packet received"));
    assert_eq!(gso.vnet.gso_type & !VnetHdr::GSO_ECN, VnetHdr::GSO_TCPV4);
    assert!(
        gso.vnet.gso_size > 0 && gso.vnet.needs_csum(),
        "{:?}",
        gso.vnet
    );
    // Whole: the IP header's length covers exactly the bytes received.
    let p = parse(&gso.data, 0).expect("the super-packet parses");
    assert_eq!(
        p.ip_end,
        gso.data.len(),
        "{rx_mode:?}: super-packet cut short"
    );
    let (r, got) = done.recv_timeout(WAIT * 2).expect("server finished");
    assert_eq!(r, Ok(()));
    assert!(
        got == build::pattern(LEN, 9),
        "the node's kernel got {} of {LEN} bytes",
        got.len()
    );
    let c = port.counters();
    assert_eq!((c.rx_errors, c.rx_truncated), (0, 0), "{rx_mode:?}: {c:?}");
}

#[test]
fn af_packet_receives_frames_and_gso_super_packets_from_the_peer() {
    assert_eq!(AfPacketConfig::default().rx_mode, RxMode::Copy);
    receives_frames_and_gso_super_packets("afr", RxMode::Copy);
}

#[test]
fn af_packet_frame_ring_receives_frames_and_gso_super_packets() {
    receives_frames_and_gso_super_packets("afv", RxMode::FrameRing);
}

#[test]
fn af_packet_block_ring_receives_frames_and_gso_super_packets() {
    receives_frames_and_gso_super_packets("afb", RxMode::BlockRing);
}

/// Slots too small for a super-packet: the kernel cuts it short, the port counts it and
/// hands over only frames that fit.
#[test]
fn af_packet_frame_ring_counts_super_packets_its_slots_cut_short() {
    let lab = lab("aft");
    let cfg = AfPacketConfig {
        rx_mode: RxMode::FrameRing,
        slot_size: 2048,
        ..AfPacketConfig::default()
    };
    let mut port = open(&lab, cfg);
    let done = tcp_stream_to_node(&lab, 9101, 256 * 1024);
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    while Instant::now() < deadline && port.counters().rx_truncated == 0 {
        recv_until(&mut port, Duration::from_millis(50), |_| false, &mut seen);
    }
    let c = port.counters();
    assert!(c.rx_truncated > 0, "no frame counted as cut short: {c:?}");
    assert!(c.rx_errors >= c.rx_truncated, "{c:?}");
    assert!(
        seen.iter().all(|f| f.data.len() <= 2048),
        "a frame longer than its slot was handed over"
    );
    // The node's own kernel still gets the stream (the ring only watches).
    let (r, _) = done.recv_timeout(WAIT * 2).expect("server finished");
    assert_eq!(r, Ok(()));
}

#[test]
fn af_packet_sends_frames_the_peer_kernel_receives() {
    let lab = lab("afs");
    let mut port = open(&lab, AfPacketConfig::default());
    let sock = lab
        .peer
        .run(|| UdpSocket::bind((PEER, 7001)))
        .expect("peer socket");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let o = IpOpts {
        src_mac: lab.node_mac,
        dst_mac: lab.peer_mac,
        ..IpOpts::default()
    };
    let payload = build::pattern(1200, 1);
    let mut frames: Vec<Frame> = (0..3)
        .map(|_| Frame {
            data: build::udp(NODE.into(), PEER.into(), 5555, 7001, &payload, &o),
            vnet: VnetHdr::default(),
        })
        .collect();
    assert_eq!(port.send_batch(&mut frames).unwrap(), 3);
    assert!(frames.is_empty());
    let c = port.counters();
    assert_eq!((c.tx_frames, c.tx_errors), (3, 0));
    let mut buf = [0u8; 2048];
    for i in 0..3 {
        let (n, from) = sock
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {i} not received by the peer: {e}"));
        assert_eq!(&buf[..n], &payload[..]);
        assert_eq!(from, SocketAddr::new(NODE.into(), 5555));
    }
    // PACKET_IGNORE_OUTGOING: ferry does not read back what it sent.
    let mut seen = Vec::new();
    let own = recv_until(
        &mut port,
        Duration::from_millis(100),
        |f| udp_to(f, PEER, 7001).is_some(),
        &mut seen,
    );
    assert!(own.is_none(), "ferry read its own transmission");
}

fn ingress_filters(lab: &Lab) -> String {
    let out = std::process::Command::new("tc")
        .args([
            "-n",
            &lab.node.name,
            "filter",
            "show",
            "dev",
            "up0",
            "ingress",
        ])
        .output()
        .expect("cannot run tc (install package iproute2)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn af_packet_ingress_drop_keeps_the_node_kernel_out() {
    let lab = lab("afd");
    // Without ARP (the filter drops it too), the peer needs the node's MAC statically.
    lab.peer.ip(&[
        "neigh",
        "replace",
        &NODE.to_string(),
        "lladdr",
        &mac_str(lab.node_mac),
        "dev",
        "pe0",
        "nud",
        "permanent",
    ]);
    let ping_node = |id: u16| {
        lab.peer
            .run(move || ping(NODE, id, b"ferry-ping", Duration::from_millis(700)))
    };
    assert_eq!(
        ping_node(1).expect("the node's kernel answers before the filter"),
        b"ferry-ping"
    );

    let cfg = AfPacketConfig {
        drop_kernel_ingress: true,
        ..AfPacketConfig::default()
    };
    let mut port = open(&lab, cfg);
    assert!(port.drops_kernel_ingress());
    assert!(
        !ingress_filters(&lab).is_empty(),
        "no filter on up0's ingress"
    );
    let e = ping_node(2).expect_err("the node's kernel answered despite the drop filter");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    let mut seen = Vec::new();
    let echo = recv_until(
        &mut port,
        WAIT,
        |f| {
            parse(&f.data, 0).is_ok_and(|p| {
                p.proto == proto::ICMP
                    && p.key.dst == IpAddr::V4(NODE)
                    && f.data[p.l4_off] == 8
                    && f.data[p.l4_off + 4..p.l4_off + 6] == 2u16.to_be_bytes()
            })
        },
        &mut seen,
    );
    assert!(echo.is_some(), "ferry did not see the echo request");

    // Dropping the port removes the filter: the kernel answers again.
    drop(port);
    let tc = std::process::Command::new("tc")
        .args([
            "-n",
            &lab.node.name,
            "filter",
            "show",
            "dev",
            "up0",
            "ingress",
        ])
        .output()
        .expect("tc (package iproute2)");
    assert!(
        String::from_utf8_lossy(&tc.stdout).trim().is_empty(),
        "filter left behind: {}",
        String::from_utf8_lossy(&tc.stdout)
    );
    assert_eq!(
        ping_node(3).expect("the node's kernel answers after the port is gone"),
        b"ferry-ping"
    );
}

/// How many UDP datagrams to the node's port `dport` each of `ports` receives, until
/// `want` came in all or `wait` is over.
fn udp_per_port(
    ports: &mut [&mut dyn Port],
    dport: u16,
    want: usize,
    wait: Duration,
) -> Vec<usize> {
    let mut counts = vec![0; ports.len()];
    let deadline = Instant::now() + wait;
    let mut batch = Vec::new();
    while Instant::now() < deadline && counts.iter().sum::<usize>() < want {
        for (i, p) in ports.iter_mut().enumerate() {
            wait_readable(p.raw_fd(), 5);
            batch.clear();
            p.recv_batch(&mut batch, 64).unwrap();
            counts[i] += batch
                .iter()
                .filter(|f| udp_to(f, NODE, dport).is_some())
                .count();
        }
    }
    counts
}

#[test]
fn af_packet_fanout_group_delivers_a_flow_to_one_member() {
    let lab = lab("aff");
    let cfg = AfPacketConfig {
        fanout: Some((std::process::id() & 0xffff) as u16),
        ..AfPacketConfig::default()
    };
    let mut ports = [open(&lab, cfg.clone()), open(&lab, cfg)];
    lab.peer.run(|| {
        let s = UdpSocket::bind((PEER, 6000)).unwrap();
        for _ in 0..8 {
            s.send_to(b"one flow", (NODE, 7002)).unwrap();
        }
    });
    let [a, b] = &mut ports;
    let mut counts = udp_per_port(&mut [a, b], 7002, 8, Duration::from_millis(500));
    counts.sort();
    assert_eq!(
        counts,
        [0, 8],
        "the flow went to exactly one member of the group"
    );
}

#[test]
fn af_packet_queues_open_one_fanout_group_and_spread_flows_over_it() {
    let lab = lab("afq");
    let zero = AfPacketConfig {
        queues: 0,
        ..AfPacketConfig::default()
    };
    let e = lab
        .node
        .run(move || AfPacketPort::open("up0", &zero))
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    let mut first = open(
        &lab,
        AfPacketConfig {
            queues: 2,
            ..AfPacketConfig::default()
        },
    );
    let mut more = first.take_queues();
    assert_eq!(more.len(), 1, "one further socket");
    assert!(first.take_queues().is_empty(), "handed over once");
    let second = more.pop().unwrap();
    const FLOWS: u16 = 32;
    lab.peer.run(|| {
        for i in 0..FLOWS {
            let s = UdpSocket::bind((PEER, 6100 + i)).unwrap();
            s.send_to(b"many flows", (NODE, 7003)).unwrap();
        }
    });
    let mut second = second;
    let counts = udp_per_port(
        &mut [&mut first, second.as_mut()],
        7003,
        FLOWS.into(),
        Duration::from_secs(2),
    );
    assert_eq!(
        counts.iter().sum::<usize>(),
        usize::from(FLOWS),
        "each datagram once: {counts:?}"
    );
    assert!(
        counts[0] > 0 && counts[1] > 0,
        "the flows spread over both sockets: {counts:?}"
    );
}

/// The uplink goes down and up again: the port reports the error once, then poll goes
/// quiet (instead of reporting POLLERR at once forever and the worker spinning).
fn a_link_flap_is_reported_once(tag: &str, rx_mode: RxMode) {
    let lab = lab(tag);
    let cfg = AfPacketConfig {
        rx_mode,
        ..AfPacketConfig::default()
    };
    let mut port = open(&lab, cfg);
    lab.node.ip(&["link", "set", "dev", "up0", "down"]);
    lab.node.ip(&["link", "set", "dev", "up0", "up"]);
    let deadline = Instant::now() + WAIT;
    let (mut errors, mut wakeups) = (0, 0);
    let mut batch = Vec::new();
    // Until poll stays quiet for a while (frames the peer sends are fine).
    while wait_readable(port.raw_fd(), 300) {
        assert!(
            Instant::now() < deadline,
            "{rx_mode:?}: poll still reports the socket ready after {WAIT:?}: {wakeups} \
             wakeups, {errors} errors"
        );
        wakeups += 1;
        batch.clear();
        if port.recv_batch(&mut batch, 64).is_err() {
            errors += 1;
        }
    }
    assert_eq!(errors, 1, "{rx_mode:?}: the link going down, reported once");
}

#[test]
fn af_packet_link_flap_copy() {
    a_link_flap_is_reported_once("aff", RxMode::Copy);
}

#[test]
fn af_packet_link_flap_frame_ring() {
    a_link_flap_is_reported_once("afg", RxMode::FrameRing);
}

#[test]
fn af_packet_link_flap_block_ring() {
    a_link_flap_is_reported_once("afh", RxMode::BlockRing);
}

fn revents(fd: RawFd, ms: i32) -> i16 {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1.
    unsafe { libc::poll(&mut pfd, 1, ms) };
    pfd.revents
}

/// The uplink is deleted while the port is open: the port wakes (the device goes down
/// first), and its receive says the device is gone (`NotFound`, which stops the worker),
/// rather than the port going silent. Sending says so too from then on.
fn a_deleted_device_is_reported_gone(tag: &str, rx_mode: RxMode) {
    let lab = lab(tag);
    let cfg = AfPacketConfig {
        rx_mode,
        ..AfPacketConfig::default()
    };
    let mut port = open(&lab, cfg);
    // Deleted while the port waits in poll, as a worker does: the port wakes when the
    // device goes down, before the kernel has unregistered it.
    let node = lab.node.name.clone();
    let deleter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        link::ip(&["-n", &node, "link", "del", "dev", "up0"])
    });
    let deadline = Instant::now() + WAIT;
    let mut batch = Vec::new();
    let e = loop {
        assert!(
            Instant::now() < deadline,
            "{rx_mode:?}: the port did not find its device gone within {WAIT:?}"
        );
        if revents(port.raw_fd(), 100) != 0 {
            batch.clear();
            match port.recv_batch(&mut batch, 64) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break e,
                _ => {}
            }
        }
    };
    deleter.join().unwrap().unwrap();
    assert!(
        e.to_string().contains("the device is gone"),
        "{rx_mode:?}: {e}"
    );
    let mut frames = vec![Frame {
        data: vec![0; 60],
        vnet: VnetHdr::default(),
    }];
    let e = port.send_batch(&mut frames).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{rx_mode:?}: {e}");
}

#[test]
fn af_packet_deleted_device_copy() {
    a_deleted_device_is_reported_gone("afx", RxMode::Copy);
}

#[test]
fn af_packet_deleted_device_frame_ring() {
    a_deleted_device_is_reported_gone("afy", RxMode::FrameRing);
}

#[test]
fn af_packet_deleted_device_block_ring() {
    a_deleted_device_is_reported_gone("afz", RxMode::BlockRing);
}

/// Sending is what finds the device gone when nothing was received.
#[test]
fn af_packet_deleted_device_found_by_sending() {
    let lab = lab("afs");
    let mut port = open(&lab, AfPacketConfig::default());
    lab.node.ip(&["link", "del", "dev", "up0"]);
    let mut frames = vec![
        Frame {
            data: vec![0; 60],
            vnet: VnetHdr::default(),
        };
        3
    ];
    let e = port.send_batch(&mut frames).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    let e = port.recv_batch(&mut Vec::new(), 64).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
}
