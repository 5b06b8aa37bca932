//! End-to-end: TCP segments cut by `gso::segment` are accepted by the real Linux TCP stack.
//!
//! The test plays a TCP client on a TAP device whose interface sits in a network namespace
//! of its own, with a kernel listener there. After a hand-made three-way handshake it
//! builds one ~40 kB super-packet with a garbage checksum, segments it for MTU 1500 and
//! writes the segments to the TAP. The kernel silently drops a segment with a wrong
//! checksum, length or sequence number, so the listener receiving exactly the bytes sent,
//! in order, proves all three.
//!
//! Needs root (namespaces, TAP devices) and the `ip` command (iproute2). Without them the
//! test fails and says so; it is never skipped.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::wire::{Parsed, parse};
use ferry_datapath::{Packet, VnetHdr};
use ferry_datapath::{gso, proto};
use ferry_linux::{Tap, netns};

const SERVER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xc7, 0x00, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xc7, 0x00, 0x02];
const SERVER_PORT: u16 = 8080;
const CLIENT_ISN: u32 = 0x1000_0000;
const PAYLOAD_LEN: usize = 40_000;
const GSO_SIZE: u16 = 1448;
const MTU: usize = 1500;
const WAIT: Duration = Duration::from_secs(4);

/// One address family's parameters.
struct Family {
    tag: &'static str,
    server: IpAddr,
    client: IpAddr,
    prefix_len: u8,
    gso_type: u8,
    client_port: u16,
}

fn v4() -> Family {
    Family {
        tag: "v4",
        server: "10.199.0.1".parse().unwrap(),
        client: "10.199.0.2".parse().unwrap(),
        prefix_len: 24,
        gso_type: VnetHdr::GSO_TCPV4,
        client_port: 40004,
    }
}

fn v6() -> Family {
    Family {
        tag: "v6",
        server: "fd00:199::1".parse().unwrap(),
        client: "fd00:199::2".parse().unwrap(),
        prefix_len: 64,
        gso_type: VnetHdr::GSO_TCPV6,
        client_port: 40006,
    }
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Fails the test, saying what is needed, unless running as root with `ip` available.
fn require_root_and_ip() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    assert_eq!(
        euid, "0",
        "gso_kernel must run as root: it creates a network namespace and a TAP device \
         (CAP_SYS_ADMIN, CAP_NET_ADMIN); effective uid is {euid}"
    );
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("`ip -V` failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("gso_kernel needs the `ip` command (install package iproute2): {e}"),
    }
}

/// Runs `ip args...`, failing the test with its stderr when it does not succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip {}`: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Owns the namespace and the TAP; removes both on drop, also when a test panics.
struct Lab {
    ns: String,
    tap: Option<Tap>,
}

impl Lab {
    /// A namespace with the TAP moved into it, addressed, up, and a static neighbour
    /// entry for the client so that no ARP/ND is needed.
    fn new(fam: &Family) -> Lab {
        let pid = std::process::id();
        let ns = format!("ferry-gso-{pid}-{}", fam.tag);
        let tap_name = format!("fgso{pid}{}", fam.tag);
        ip(&["netns", "add", &ns]);
        let mut lab = Lab { ns, tap: None };
        let tap =
            Tap::open(&tap_name).unwrap_or_else(|e| panic!("cannot create TAP {tap_name}: {e}"));
        lab.tap = Some(tap);
        let ns = lab.ns.as_str();
        let dev = tap_name.as_str();
        ip(&["link", "set", "dev", dev, "netns", ns]);
        ip(&["-n", ns, "link", "set", "dev", "lo", "up"]);
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            "dev",
            dev,
            "address",
            &mac_str(SERVER_MAC),
            "mtu",
            &MTU.to_string(),
        ]);
        let addr = format!("{}/{}", fam.server, fam.prefix_len);
        let mut add = vec!["-n", ns, "addr", "add", &addr, "dev", dev];
        if fam.server.is_ipv6() {
            // Usable at once: no duplicate address detection delay.
            add.push("nodad");
        }
        ip(&add);
        ip(&["-n", ns, "link", "set", "dev", dev, "up"]);
        ip(&[
            "-n",
            ns,
            "neigh",
            "replace",
            &fam.client.to_string(),
            "lladdr",
            &mac_str(CLIENT_MAC),
            "dev",
            dev,
            "nud",
            "permanent",
        ]);
        lab
    }

    fn tap(&self) -> &Tap {
        self.tap.as_ref().expect("TAP open")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Closing the descriptor removes the (non-persistent) device; then the namespace.
        self.tap.take();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// What the kernel listener saw.
struct Received {
    bytes: Vec<u8>,
    outcome: String,
}

/// The listener: accepts one connection and reads `want` bytes, each step with a deadline.
fn serve(listener: TcpListener, want: usize) -> Received {
    let deadline = Instant::now() + WAIT;
    let mut bytes = Vec::with_capacity(want);
    let fail = |bytes, outcome: String| Received { bytes, outcome };
    if let Err(e) = listener.set_nonblocking(true) {
        return fail(bytes, format!("set_nonblocking: {e}"));
    }
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return fail(bytes, format!("no connection accepted within {WAIT:?}"));
                }
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return fail(bytes, format!("accept: {e}")),
        }
    };
    let _ = stream.set_nonblocking(false);
    let mut buf = vec![0u8; 65536];
    while bytes.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return fail(bytes, format!("timed out after {WAIT:?}"));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => return fail(bytes, "connection closed early".into()),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return fail(bytes, format!("timed out after {WAIT:?}"));
            }
            Err(e) => return fail(bytes, format!("read: {e}")),
        }
    }
    Received {
        bytes,
        outcome: "complete".into(),
    }
}

/// Reads frames from the TAP until one is a TCP segment from the server to the client;
/// other traffic (IPv6 router solicitations, MLD reports...) is skipped.
fn recv_from_server(tap: &Tap, fam: &Family, what: &str) -> (Vec<u8>, Parsed) {
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 65536];
    let mut skipped = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero() && tap.wait_readable(left).expect("poll TAP"),
            "no {what} from {} on the TAP within {WAIT:?} ({skipped} unrelated frames skipped)",
            SocketAddr::new(fam.server, SERVER_PORT)
        );
        let n = match tap.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("read TAP: {e}"),
        };
        let frame = &buf[..n];
        match parse(frame, 0) {
            Ok(p)
                if p.proto == proto::TCP
                    && p.key.src == fam.server
                    && p.key.dst == fam.client
                    && p.key.src_port == SERVER_PORT
                    && p.key.dst_port == fam.client_port =>
            {
                return (frame.to_vec(), p);
            }
            _ => skipped += 1,
        }
    }
}

fn tcp_seq_ack(frame: &[u8], p: &Parsed) -> (u32, u32) {
    let t = &frame[p.l4_off..];
    (
        u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
        u32::from_be_bytes([t[8], t[9], t[10], t[11]]),
    )
}

fn client_frame(fam: &Family, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let o = IpOpts {
        src_mac: CLIENT_MAC,
        dst_mac: SERVER_MAC,
        dont_fragment: true,
        id: 0x4000,
        ..IpOpts::default()
    };
    build::tcp(
        fam.client,
        fam.server,
        fam.client_port,
        SERVER_PORT,
        seq,
        ack,
        flags,
        payload,
        &o,
    )
}

fn send(tap: &Tap, frame: &[u8], what: &str) {
    let n = tap
        .write(frame)
        .unwrap_or_else(|e| panic!("writing {what} to the TAP: {e}"));
    assert_eq!(n, frame.len(), "short write of {what}");
}

fn kernel_receives_segmented_super_packet(fam: Family) {
    require_root_and_ip();
    let lab = Lab::new(&fam);
    let tap = lab.tap();
    tap.set_nonblocking(true).expect("non-blocking TAP");

    // The kernel listener, on a thread of its own inside the namespace.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let server_addr = SocketAddr::new(fam.server, SERVER_PORT);
    let listener = netns::spawn_in(&lab.ns, move || {
        let l = match TcpListener::bind(server_addr) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready_tx.send(Err(format!("bind {server_addr}: {e}")));
                return;
            }
        };
        let _ = ready_tx.send(Ok(()));
        let _ = done_tx.send(serve(l, PAYLOAD_LEN));
    })
    .expect("listener thread");
    match ready_rx.recv_timeout(WAIT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("listener in {}: {e}", lab.ns),
        Err(_) => panic!(
            "listener in {} not ready within {WAIT:?}: {:?}",
            lab.ns,
            listener.join()
        ),
    }

    // Three-way handshake, by hand.
    send(
        tap,
        &client_frame(&fam, CLIENT_ISN, 0, tcp_flags::SYN, b""),
        "SYN",
    );
    let (synack, p) = recv_from_server(tap, &fam, "SYN-ACK");
    let (server_isn, acked) = tcp_seq_ack(&synack, &p);
    assert_eq!(
        p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK | tcp_flags::RST),
        tcp_flags::SYN | tcp_flags::ACK,
        "expected a SYN-ACK, got flags {:#04x}",
        p.tcp_flags
    );
    assert_eq!(
        acked,
        CLIENT_ISN.wrapping_add(1),
        "SYN-ACK acknowledges our SYN"
    );
    let seq = CLIENT_ISN.wrapping_add(1);
    let ack = server_isn.wrapping_add(1);
    send(
        tap,
        &client_frame(&fam, seq, ack, tcp_flags::ACK, b""),
        "ACK",
    );

    // One super-packet, garbage checksum, as a guest with TSO would hand it over.
    let payload = build::pattern(PAYLOAD_LEN, 0x5a);
    let data = client_frame(&fam, seq, ack, tcp_flags::ACK | tcp_flags::PSH, &payload);
    let parsed = parse(&data, 0).expect("super-packet parses");
    let mut pkt = Packet::new(data, 0, 0);
    pkt.data[parsed.l4_off + 16] = 0xba;
    pkt.data[parsed.l4_off + 17] = 0xd0;
    pkt.meta.vnet = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: fam.gso_type,
        hdr_len: (parsed.l4_off + 20) as u16,
        gso_size: GSO_SIZE,
        csum_start: parsed.l4_off as u16,
        csum_offset: 16,
    };
    let mut segs = Vec::new();
    gso::segment(&pkt, &parsed, MTU, &mut segs).expect("segmentation");
    assert!(segs.len() >= PAYLOAD_LEN / usize::from(GSO_SIZE));
    for (i, s) in segs.iter().enumerate() {
        assert!(
            s.data.len() - parsed.l3_off <= MTU,
            "segment {i} exceeds the MTU"
        );
        send(tap, &s.data, &format!("segment {i}"));
    }

    let got = done_rx
        .recv_timeout(WAIT + Duration::from_secs(2))
        .unwrap_or_else(|_| {
            panic!(
                "the listener in {} reported nothing within {WAIT:?}",
                lab.ns
            )
        });
    let _ = listener.join();
    if got.bytes != payload {
        let first_diff = got
            .bytes
            .iter()
            .zip(&payload)
            .position(|(a, b)| a != b)
            .unwrap_or(got.bytes.len().min(payload.len()));
        panic!(
            "the kernel socket received {} of {} bytes ({}), first difference at byte {}; \
             {} segments were sent to {server_addr} in {}",
            got.bytes.len(),
            payload.len(),
            got.outcome,
            first_diff,
            segs.len(),
            lab.ns
        );
    }
}

#[test]
fn kernel_receives_gso_segments_ipv4() {
    kernel_receives_segmented_super_packet(v4());
}

#[test]
fn kernel_receives_gso_segments_ipv6() {
    kernel_receives_segmented_super_packet(v6());
}
