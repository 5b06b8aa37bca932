//! End-to-end: a pod's TAP port passes GSO super-packets both ways.
//!
//! The pod is a namespace holding the TAP as `eth0`; its kernel TCP stack talks to a
//! peer that this test plays by hand on ferry's side of the TAP. Needs root and `ip`.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Netns, dev_name, mac_str, require_root_and_ip};
use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::wire::checksum;
use ferry_datapath::wire::{Parsed, parse};
use ferry_datapath::{VnetHdr, proto};
use ferry_linux::link::{self, PodInterface};
use ferry_linux::{Frame, Port, TapPort};

const POD: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0xc9, 0, 2];
const MTU: usize = 1500;
const WAIT: Duration = Duration::from_secs(5);

/// The pod: a namespace with the TAP as eth0, and a static neighbour entry for the peer.
struct Pod {
    port: TapPort,
    mac: [u8; 6],
    ns: Netns,
}

fn pod(tag: &str) -> Pod {
    pod_with(tag, 1)
}

/// [`pod`] with a TAP of `queues` queues.
fn pod_with(tag: &str, queues: u16) -> Pod {
    require_root_and_ip();
    let ns = Netns::new(tag);
    let port = TapPort::create_queues(&dev_name(tag), queues).expect("create TAP port");
    link::move_to_netns(
        port.name(),
        &PodInterface {
            netns: &ns.name,
            name: "eth0",
            mtu: MTU as u16,
            addresses: &[format!("{POD}/24").parse().unwrap()],
        },
    )
    .expect("TAP into the pod namespace");
    ns.ip(&[
        "neigh",
        "replace",
        &PEER.to_string(),
        "lladdr",
        &mac_str(PEER_MAC),
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    let mac = link::mac_address(Some(&ns.name), "eth0").expect("pod MAC");
    Pod { port, mac, ns }
}

/// A TCP segment of the conversation between the pod and the peer.
struct Seg {
    seq: u32,
    flags: u8,
    window: u16,
    payload: Vec<u8>,
}

fn tcp_of(f: &Frame, port: u16) -> Option<(Seg, Parsed)> {
    let p = parse(&f.data, 0).ok()?;
    if p.proto != proto::TCP || p.key.dst != IpAddr::V4(PEER) || p.key.dst_port != port {
        return None;
    }
    let t = &f.data[p.l4_off..p.ip_end];
    let be32 = |i: usize| u32::from_be_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]]);
    let off = usize::from(t[12] >> 4) * 4;
    Some((
        Seg {
            seq: be32(4),
            flags: p.tcp_flags,
            window: u16::from_be_bytes([t[14], t[15]]),
            payload: t[off..].to_vec(),
        },
        p,
    ))
}

fn peer_frame(
    pod_mac: [u8; 6],
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let o = IpOpts {
        src_mac: PEER_MAC,
        dst_mac: pod_mac,
        dont_fragment: true,
        ..IpOpts::default()
    };
    build::tcp(
        PEER.into(),
        POD.into(),
        sport,
        dport,
        seq,
        ack,
        flags,
        payload,
        &o,
    )
}

fn send(port: &mut TapPort, data: Vec<u8>, vnet: VnetHdr) {
    let mut v = vec![Frame { data, vnet }];
    assert_eq!(port.send_batch(&mut v).expect("send"), 1);
    assert_eq!(port.counters().tx_errors, 0, "the kernel refused a frame");
}

/// Receives frames until `want` says stop, with the test's deadline.
fn recv_until(port: &mut TapPort, what: &str, mut want: impl FnMut(&mut TapPort, Frame) -> bool) {
    let deadline = Instant::now() + WAIT;
    let mut batch = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        let ready = port
            .tap()
            .wait_readable(Duration::from_millis(50))
            .expect("poll");
        if !ready {
            continue;
        }
        batch.clear();
        port.recv_batch(&mut batch, 64).expect("recv_batch");
        for f in batch.drain(..) {
            if want(port, f) {
                return;
            }
        }
    }
}

#[test]
fn tap_port_reads_gso_super_packets_from_a_pod() {
    let mut pod = pod("tpr");
    assert!(pod.port.offloads());
    const LEN: usize = 64 * 1024;
    const PORT: u16 = 9000;
    let payload = build::pattern(LEN, 7);
    let sent = payload.clone();
    let (done_tx, done_rx) = mpsc::channel();
    let _client = ferry_linux::netns::spawn_in(&pod.ns.name, move || {
        let r = (|| {
            let mut s = TcpStream::connect_timeout(&SocketAddr::new(PEER.into(), PORT), WAIT)?;
            s.set_write_timeout(Some(WAIT))?;
            s.write_all(&sent)?;
            s.shutdown(std::net::Shutdown::Write)
        })();
        let _ = done_tx.send(r.map_err(|e| e.to_string()));
    })
    .expect("client thread");

    let isn = 0x5000_0000u32;
    let mut next = 0u32;
    let mut got = Vec::new();
    let mut gso_seen: Option<(VnetHdr, usize)> = None;
    let mac = pod.mac;
    recv_until(&mut pod.port, "64 KiB from the pod", |port, f| {
        let Some((s, p)) = tcp_of(&f, PORT) else {
            return false;
        };
        let sport = p.key.src_port;
        if s.flags & tcp_flags::SYN != 0 {
            next = s.seq.wrapping_add(1);
            let syn_ack = peer_frame(
                mac,
                PORT,
                sport,
                isn,
                next,
                tcp_flags::SYN | tcp_flags::ACK,
                b"",
            );
            send(port, syn_ack, VnetHdr::default());
            return false;
        }
        if f.vnet.is_gso() && gso_seen.is_none() {
            gso_seen = Some((f.vnet, f.data.len()));
        }
        if s.seq == next && !s.payload.is_empty() {
            got.extend_from_slice(&s.payload);
            next = next.wrapping_add(s.payload.len() as u32);
        }
        let mut flags = tcp_flags::ACK;
        if s.flags & tcp_flags::FIN != 0 && s.seq.wrapping_add(s.payload.len() as u32) == next {
            next = next.wrapping_add(1);
            flags |= tcp_flags::FIN;
        }
        let ack = peer_frame(mac, PORT, sport, isn.wrapping_add(1), next, flags, b"");
        send(port, ack, VnetHdr::default());
        flags & tcp_flags::FIN != 0
    });
    let r = done_rx.recv_timeout(WAIT).expect("client finished");
    assert_eq!(r, Ok(()), "the pod's client");
    assert!(
        got == payload,
        "received {} of {LEN} bytes, or different bytes",
        got.len()
    );
    let (v, len) = gso_seen.expect("no GSO super-packet came out of the TAP");
    assert_eq!(v.gso_type & !VnetHdr::GSO_ECN, VnetHdr::GSO_TCPV4, "{v:?}");
    assert!(v.gso_size > 0, "{v:?}");
    assert!(
        len > 14 + MTU,
        "a super-packet longer than the MTU: {len} bytes, {v:?}"
    );
    assert!(
        v.needs_csum(),
        "super-packets come with partial checksums: {v:?}"
    );
}

#[test]
fn tap_port_writes_a_gso_super_packet_to_a_pod() {
    let mut pod = pod("tpw");
    const PORT: u16 = 9001;
    const SPORT: u16 = 40001;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let _server = ferry_linux::netns::spawn_in(&pod.ns.name, move || {
        let r = (|| {
            let l = TcpListener::bind(SocketAddr::new(POD.into(), PORT))?;
            let _ = ready_tx.send(());
            l.set_nonblocking(true)?;
            let deadline = Instant::now() + WAIT;
            let mut s = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => return Err(e),
                }
            };
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(WAIT))?;
            let mut v = Vec::new();
            let mut buf = [0u8; 65536];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => v.extend_from_slice(&buf[..n]),
                    Err(e) if !v.is_empty() => {
                        // Timed out after data: report what arrived.
                        let _ = e;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(v)
        })();
        let _ = done_tx.send(r.map_err(|e| e.to_string()));
    })
    .expect("server thread");
    ready_rx.recv_timeout(WAIT).expect("server listening");

    let mac = pod.mac;
    let isn = 0x7000_0000u32;
    send(
        &mut pod.port,
        peer_frame(mac, SPORT, PORT, isn, 0, tcp_flags::SYN, b""),
        VnetHdr::default(),
    );
    let mut server = None;
    recv_until(&mut pod.port, "SYN-ACK from the pod", |_, f| {
        if let Some((s, _)) = tcp_of(&f, SPORT)
            && s.flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN | tcp_flags::ACK
        {
            server = Some(s);
            return true;
        }
        false
    });
    let s = server.unwrap();
    let seq = isn.wrapping_add(1);
    let ack = s.seq.wrapping_add(1);
    send(
        &mut pod.port,
        peer_frame(mac, SPORT, PORT, seq, ack, tcp_flags::ACK, b""),
        VnetHdr::default(),
    );

    // One super-packet as large as the pod's window allows, partial checksum.
    let len = usize::from(s.window).min(60_000);
    assert!(
        len > 10 * MTU,
        "the pod's window ({}) is too small for the test",
        s.window
    );
    let payload = build::pattern(len, 3);
    let mut data = peer_frame(
        mac,
        SPORT,
        PORT,
        seq,
        ack,
        tcp_flags::ACK | tcp_flags::PSH,
        &payload,
    );
    let p = parse(&data, 0).unwrap();
    let l4_len = (p.ip_end - p.l4_off) as u16;
    let pseudo = checksum::pseudo_v4(PEER.octets(), POD.octets(), proto::TCP, l4_len);
    data[p.l4_off + 16..p.l4_off + 18].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    let vnet = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: VnetHdr::GSO_TCPV4,
        hdr_len: (p.l4_off + 20) as u16,
        gso_size: 1448,
        csum_start: p.l4_off as u16,
        csum_offset: 16,
    };
    send(&mut pod.port, data, vnet);
    let fin = seq.wrapping_add(len as u32);
    send(
        &mut pod.port,
        peer_frame(
            mac,
            SPORT,
            PORT,
            fin,
            ack,
            tcp_flags::ACK | tcp_flags::FIN,
            b"",
        ),
        VnetHdr::default(),
    );

    let got = done_rx
        .recv_timeout(WAIT + Duration::from_secs(1))
        .expect("server finished")
        .expect("server");
    assert!(
        got == payload,
        "the pod received {} of {len} bytes, or different bytes",
        got.len()
    );
}

#[test]
fn tap_port_device_goes_with_the_port() {
    require_root_and_ip();
    let name = dev_name("tpg");
    let port = TapPort::create(&name).expect("create");
    assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
    // USO is in Linux 6.2 and later; older kernels fall back without it.
    let (uname, _) = (
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap(),
        (),
    );
    let major_minor: Vec<u32> = uname
        .split(['.', '-'])
        .take(2)
        .filter_map(|s| s.parse().ok())
        .collect();
    if major_minor >= vec![6, 2] {
        assert!(
            port.uso(),
            "kernel {uname} has USO but the TAP did not take it"
        );
    }
    drop(port);
    // The kernel unregisters the device when the last descriptor closes; under load that
    // can take a moment (it waits for the device's references to drop).
    let sys = format!("/sys/class/net/{name}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&sys).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !std::path::Path::new(&sys).exists(),
        "{name} still exists 5 s after its port was dropped"
    );
}

#[test]
fn multi_queue_tap_spreads_a_pods_flows_over_its_queues_and_takes_frames_on_any() {
    let mut pod = pod_with("tmq", 2);
    let mut queues = pod.port.take_queues();
    assert_eq!(queues.len(), 1, "one further queue");
    assert!(pod.port.take_queues().is_empty(), "handed over once");
    let mut q1 = queues.pop().unwrap();
    assert!(q1.offloads());

    // 32 flows from the pod's kernel: the device hands each to a queue by its hash.
    const FLOWS: u16 = 32;
    let sent = ferry_linux::netns::spawn_in(&pod.ns.name, || {
        for i in 0..FLOWS {
            let s = std::net::UdpSocket::bind((POD, 20000 + i))?;
            s.send_to(b"spread", (PEER, 7))?;
        }
        std::io::Result::Ok(())
    })
    .expect("sender thread")
    .join()
    .unwrap();
    sent.expect("entered the pod namespace")
        .expect("datagrams sent");
    let is_ours = |f: &Frame| {
        parse(&f.data, 0).is_ok_and(|p| p.key.proto == proto::UDP && p.key.dst_port == 7)
    };
    let mut counts = [0u16; 2];
    let deadline = Instant::now() + WAIT;
    let mut batch = Vec::new();
    while counts[0] + counts[1] < FLOWS && Instant::now() < deadline {
        for (i, q) in [&mut pod.port as &mut dyn Port, q1.as_mut()]
            .into_iter()
            .enumerate()
        {
            batch.clear();
            q.recv_batch(&mut batch, 64).expect("recv_batch");
            counts[i] += batch.iter().filter(|f| is_ours(f)).count() as u16;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        counts[0] + counts[1],
        FLOWS,
        "every datagram came out: {counts:?}"
    );
    assert!(
        counts[0] > 0 && counts[1] > 0,
        "both queues got flows: {counts:?}"
    );

    // Frames written into the second queue reach the pod's kernel like the first's.
    let (tx, rx) = mpsc::channel();
    let _server = ferry_linux::netns::spawn_in(&pod.ns.name, move || {
        let r = (|| {
            let s = std::net::UdpSocket::bind((POD, 9999))?;
            s.set_read_timeout(Some(WAIT))?;
            let mut buf = [0u8; 64];
            let (n, _) = s.recv_from(&mut buf)?;
            Ok::<_, std::io::Error>(buf[..n].to_vec())
        })();
        let _ = tx.send(r.map_err(|e| e.to_string()));
    })
    .expect("server thread");
    std::thread::sleep(Duration::from_millis(200));
    let frame = build::udp(
        IpAddr::V4(PEER),
        IpAddr::V4(POD),
        4000,
        9999,
        b"via queue 1",
        &IpOpts {
            src_mac: PEER_MAC,
            dst_mac: pod.mac,
            ..IpOpts::default()
        },
    );
    let mut v = vec![Frame {
        data: frame,
        vnet: VnetHdr::default(),
    }];
    assert_eq!(q1.send_batch(&mut v).expect("send"), 1);
    let got = rx.recv_timeout(WAIT).expect("the pod answered in time");
    assert_eq!(got.expect("the pod received").as_slice(), b"via queue 1");
}
