//! Traffic from outside the cluster: a client on the same L2 segment as node 1's uplink
//! (a Linux bridge in a "fabric" namespace joins them) routes the pod CIDR through node
//! 1's uplink address, as a router in front of a cluster would. Its kernel fragments big
//! UDP datagrams and pings at the wire MTU 1500; ferry reassembles them, refragments them
//! to the pod's MTU 1450 (the overlay's), and the pod's echoes go back the same way.
//! Needs root, iproute2, iputils-ping, tshark and python3.

mod common;

use std::fs;
use std::path::Path;

use common::Lab;

/// Node 1's tables: an uplink on the wire subnets, routes to them (on-link: ferry
/// resolves the client's MAC), one pod, and an overlay peer (never reached here) that
/// gives the pod the overlay MTU 1450.
const TABLES: &str = r#"
node: { name: node1, addresses: [192.168.77.1, "fd00:77::1"] }
ports:
  - { name: uplink, kind: uplink, mac: "02:fe:00:00:00:01", mtu: 1500, addresses: [192.168.77.1/24, "fd00:77::1/64"] }
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:01:05"
    addresses: [10.244.1.5, "fd00:10:244:1::5"]
    gso: true
# No routes: the uplink's IP/LEN addresses put the wire's subnets on-link.
overlay: { vni: 4096, mode: always, uplink: uplink }
nodes:
  - { name: node2, address: 192.168.77.2, pod_cidrs: [10.244.2.0/24, "fd00:10:244:2::/64"] }
"#;

/// The pod's UDP echo server: logs `SOURCE LENGTH SHA256` for each datagram, then sends
/// it back.
const ECHO_SERVER: &str = r#"
import hashlib, socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind(("::", int(sys.argv[1])))
log = open(sys.argv[2], "a", buffering=1)
while True:
    data, peer = s.recvfrom(65535)
    src = peer[0].removeprefix("::ffff:")
    log.write(f"{src} {len(data)} {hashlib.sha256(data).hexdigest()}\n")
    s.sendto(data, peer)
"#;

/// The external client: sends one datagram of each size, waits for its echo, prints
/// `LENGTH SHA256 ECHO_LENGTH ECHO_SHA256` for each.
const CLIENT: &str = r#"
import hashlib, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect((host, port))
for size in map(int, sys.argv[3:]):
    data = bytes((i * 7 + size + i // 251) % 256 for i in range(size))
    s.send(data)
    try:
        back = s.recv(65535)
    except socket.timeout:
        sys.exit(f"no echo of the {size}-byte datagram from {host}:{port} within 3 s")
    sha = lambda b: hashlib.sha256(b).hexdigest()
    print(size, sha(data), len(back), sha(back))
"#;

/// Builds the fabric (bridge br0), node 1 running ferry with pod p1a, and the external
/// client `ext` (192.168.77.100, fd00:77::100) routing the pod CIDRs through node 1.
fn client_and_node(tag: &str) -> (Lab, tempfile::TempDir) {
    client_and_node_with(tag, 1)
}

/// [`client_and_node`] with `workers` worker threads on node 1.
fn client_and_node_with(tag: &str, workers: u16) -> (Lab, tempfile::TempDir) {
    common::require(&[
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("ping", "iputils-ping"),
        ("tshark", "tshark"),
        ("python3", "python3"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::new(tag);
    for ns in ["fab", "n1", "p1a", "ext"] {
        lab.add_ns(ns);
    }
    lab.fabric("fab", &[("n1", "up1", "f1"), ("ext", "eth0", "fe")]);
    lab.ip(
        "n1",
        &["link", "set", "up1", "address", "02:fe:00:00:00:01"],
    );

    lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
    lab.ip(
        "ext",
        &["addr", "add", "fd00:77::100/64", "dev", "eth0", "nodad"],
    );
    lab.ip(
        "ext",
        &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
    );
    lab.ip(
        "ext",
        &["route", "add", "fd00:10:244:1::/64", "via", "fd00:77::1"],
    );

    let pod = lab.ns("p1a");
    let attach = [
        "uplink=af-packet:up1".to_string(),
        format!("pod-a=pod:{pod}"),
    ];
    let w = workers.to_string();
    lab.ferry_node_with("n1", dir.path(), TABLES, &attach, &["--workers", &w]);
    lab.wait_pod("p1a");
    (lab, dir)
}

/// Starts the echo server in the pod on `port`, logging to `log`.
fn start_echo_server(lab: &mut Lab, dir: &Path, port: u16, log: &Path) {
    let script = dir.join("echo_server.py");
    fs::write(&script, ECHO_SERVER).unwrap();
    let p = port.to_string();
    lab.daemon(
        "p1a",
        "udp echo server",
        &[
            "python3",
            script.to_str().unwrap(),
            &p,
            log.to_str().unwrap(),
        ],
    );
    let want = format!(":{port} ");
    lab.wait_for(5, &format!("the echo server bound to UDP {port}"), |l| {
        String::from_utf8_lossy(&l.exec("p1a", 2, &["ss", "-Hlun"]).stdout).contains(&want)
    });
}

/// Sends datagrams of `sizes` bytes from the client to the pod's echo server at
/// `pod:port` and checks that each arrived whole at the pod, from the client's own
/// address, and that each echo came back whole.
fn datagrams_arrive_whole(lab: &mut Lab, dir: &Path, pod: &str, client: &str, sizes: &[usize]) {
    let port = 7000;
    let log = dir.join("server.log");
    start_echo_server(lab, dir, port, &log);
    let script = dir.join("client.py");
    fs::write(&script, CLIENT).unwrap();
    let p = port.to_string();
    let size_args: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let mut cmd = vec!["python3", script.to_str().unwrap(), pod, &p];
    cmd.extend(size_args.iter().map(String::as_str));
    let out = lab.run("ext", 20, &cmd);

    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), sizes.len(), "client output: {out}");
    let (l, n) = (log.clone(), sizes.len());
    lab.wait_for(5, "the server's log of every datagram", |_| {
        fs::read_to_string(&l).is_ok_and(|s| s.lines().count() >= n)
    });
    let server = fs::read_to_string(&log).unwrap();
    let received: Vec<Vec<&str>> = server.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(
        received.len(),
        sizes.len(),
        "the pod received other datagrams than those sent: {server}"
    );
    for ((size, line), got) in sizes.iter().zip(&lines).zip(&received) {
        let (sent_sha, echo_len, echo_sha) = (line[1], line[2], line[3]);
        assert_eq!(
            got.as_slice(),
            [client, size.to_string().as_str(), sent_sha],
            "the {size}-byte datagram at the pod (source, length, SHA-256)"
        );
        assert_eq!(
            (echo_len, echo_sha),
            (size.to_string().as_str(), sent_sha),
            "the echo of the {size}-byte datagram at the client (length, SHA-256)"
        );
    }
}

/// The external client, by hand: a UDP datagram of SIZE bytes from its port SPORT to
/// HOST:PORT, cut into IPv4 fragments that go out in the order ORDER (indexes of the
/// fragments, e.g. `2,0,1`: the last first) through a raw socket; then waits for the echo
/// on a UDP socket bound to SPORT. Prints `SIZE SHA256 ECHO_LENGTH ECHO_SHA256`.
const FRAGMENTS: &str = r#"
import hashlib, socket, struct, sys
src, host, port, sport, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
order = [int(i) for i in sys.argv[6].split(",")]
def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
data = bytes((i * 7 + size + i // 251) % 256 for i in range(size))
ips = socket.inet_aton(src) + socket.inet_aton(host)
udp = struct.pack("!HHHH", sport, port, 8 + size, 0) + data
c = csum(ips + struct.pack("!BBH", 0, 17, len(udp)) + udp) or 0xFFFF
udp = udp[:6] + struct.pack("!H", c) + udp[8:]
pieces = [udp[i:i + 1480] for i in range(0, len(udp), 1480)]
frags = []
for n, piece in enumerate(pieces):
    more = 0x2000 if n + 1 < len(pieces) else 0
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(piece), 0x4242, more | (n * 1480 // 8), 64, 17, 0, ips[:4], ips[4:])
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    frags.append(h + piece)
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("0.0.0.0", sport))
rx.settimeout(3)
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for i in order:
    raw.sendto(frags[i], (host, 0))
try:
    back = rx.recv(65535)
except socket.timeout:
    sys.exit(f"no echo of the {size}-byte datagram sent in fragment order {order} within 3 s")
sha = lambda b: hashlib.sha256(b).hexdigest()
print(size, sha(data), len(back), sha(back))
"#;

/// Fragments from outside in any order: the last first, the middle first. ferry holds
/// them until the datagram is whole, tracks it with its real ports, and the pod gets it
/// (and the client its echo) byte for byte. The client's kernel sends fragments in
/// order, so the client here cuts the datagram itself and sends the pieces through a raw
/// socket.
#[test]
fn fragments_from_outside_in_any_order_arrive_whole() {
    let (mut lab, dir) = client_and_node("xo");
    let log = dir.path().join("server.log");
    start_echo_server(&mut lab, dir.path(), 7000, &log);
    let script = dir.path().join("fragments.py");
    fs::write(&script, FRAGMENTS).unwrap();
    let orders = ["2,0,1", "1,2,0", "2,1,0"];
    for (n, order) in orders.iter().enumerate() {
        let sport = (41000 + n).to_string();
        let out = lab.run(
            "ext",
            10,
            &[
                "python3",
                script.to_str().unwrap(),
                "192.168.77.100",
                "10.244.1.5",
                "7000",
                &sport,
                "4000",
                order,
            ],
        );
        let w: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(w.len(), 4, "client output for order {order}: {out}");
        assert_eq!(
            (w[2], w[3]),
            ("4000", w[1]),
            "the echo of the datagram sent in fragment order {order}"
        );
        let l = log.clone();
        lab.wait_for(5, "the server's log of the datagram", |_| {
            fs::read_to_string(&l).is_ok_and(|s| s.lines().count() > n)
        });
        let logged = fs::read_to_string(&log).unwrap();
        assert_eq!(
            logged.lines().nth(n),
            Some(format!("192.168.77.100 4000 {}", w[1]).as_str()),
            "at the pod, fragment order {order}"
        );
    }
}

/// tshark's `field` values of the frames of `pcap` matching `filter`.
fn fields(pcap: &Path, filter: &str, field: &str) -> Vec<u64> {
    common::tshark_fields(pcap, filter, field)
        .iter()
        .filter_map(|l| l.split(',').next()?.trim().parse().ok())
        .collect()
}

/// UDP datagrams of 4000 to 16000 bytes from outside the cluster, fragmented by the
/// client's kernel at 1500, arrive whole at the pod (its kernel reassembles what ferry
/// refragmented to 1450) and its echoes arrive whole back at the client; a fragmented
/// 8000-byte ping goes both ways too. A capture of the pod's eth0 shows the fragments
/// ferry delivered, none larger than the pod's MTU; one of the client's shows the echoes
/// refragmented to the size the pod's kernel sent them in, not to the uplink's MTU.
#[test]
fn big_udp_datagrams_from_outside_arrive_whole_ipv4() {
    ipv4_datagrams_arrive_whole("xa", 1);
}

/// The same with two workers: the fragments and the echoes may be read by either, and
/// reassembly and connections are the pipeline's, which both share.
#[test]
fn big_udp_datagrams_from_outside_arrive_whole_with_two_workers() {
    ipv4_datagrams_arrive_whole("xw", 2);
}

fn ipv4_datagrams_arrive_whole(tag: &str, workers: u16) {
    let (mut lab, dir) = client_and_node_with(tag, workers);
    let pcap = dir.path().join("pod.pcap");
    lab.capture("p1a", "tshark on the pod", "eth0", &pcap);
    let wire = dir.path().join("wire.pcap");
    lab.capture("ext", "tshark on the client", "eth0", &wire);
    lab.ping("ext", "10.244.1.5", 8000, 3);
    datagrams_arrive_whole(
        &mut lab,
        dir.path(),
        "10.244.1.5",
        "192.168.77.100",
        &[4000, 8000, 12000, 16000],
    );
    lab.stop_capture("tshark on the pod", &pcap);
    lab.stop_capture("tshark on the client", &wire);
    let frag = "ip.src == 192.168.77.100 && (ip.flags.mf == 1 || ip.frag_offset > 0)";
    // On the wire, the client's fragments are of its MTU 1500...
    let sent = fields(&wire, frag, "ip.len");
    assert_eq!(
        sent.iter().max().copied(),
        Some(1500),
        "the client's fragments on the wire"
    );
    let lens = fields(&pcap, frag, "ip.len");
    // ...and ferry refragmented them for the pod: 8000-byte pings (at least 4: one to
    // resolve, 3 counted) in 6 fragments at 1450,
    // the datagrams in 3 + 6 + 9 + 12.
    assert!(
        lens.len() >= 4 * 6 + 30,
        "fragments from the client delivered to the pod: {}",
        lens.len()
    );
    let max = lens.iter().max().copied().unwrap_or(0);
    assert!(
        max <= 1450,
        "a fragment of {max} bytes delivered to a pod whose MTU is 1450"
    );
    // The echoes, fragmented by the pod's kernel for its MTU 1450, leave through an
    // uplink of MTU 1500: ferry reassembles them and refragments them to the largest
    // fragment received, not to the uplink's MTU.
    let echo = "ip.src == 10.244.1.5 && (ip.flags.mf == 1 || ip.frag_offset > 0)";
    let from_pod = fields(&pcap, echo, "ip.len").into_iter().max();
    let at_client = fields(&wire, echo, "ip.len");
    assert!(
        at_client.len() >= 30,
        "fragments of the echoes at the client: {}",
        at_client.len()
    );
    assert!(
        from_pod.is_some_and(|m| m <= 1450),
        "the pod's fragments: {from_pod:?}"
    );
    assert_eq!(
        at_client.iter().max().copied(),
        from_pod,
        "the echoes' largest fragment at the client, against the pod's"
    );
}

/// The same over IPv6. The client's kernel first fragments at 1500; ferry, a router,
/// does not fragment IPv6 further and answers "packet too big" with MTU 1450 (the
/// client's kernel records that path MTU), so what then arrives is in fragments that
/// fit the pod. Echoes and an 8000-byte ping come back whole.
#[test]
fn big_udp_datagrams_from_outside_arrive_whole_ipv6() {
    let (mut lab, dir) = client_and_node("xb");
    let pcap = dir.path().join("pod.pcap");
    lab.capture("p1a", "tshark on the pod", "eth0", &pcap);
    lab.ping("ext", "fd00:10:244:1::5", 8000, 3);
    datagrams_arrive_whole(
        &mut lab,
        dir.path(),
        "fd00:10:244:1::5",
        "fd00:77::100",
        &[4000, 8000, 12000, 16000],
    );
    lab.stop_capture("tshark on the pod", &pcap);
    let route = lab.run("ext", 5, &["ip", "-6", "route", "get", "fd00:10:244:1::5"]);
    assert!(
        route.contains("mtu 1450"),
        "the client learned no path MTU 1450 towards the pod: {route}"
    );
    let lens = fields(
        &pcap,
        "ipv6.src == fd00:77::100 && ipv6.fraghdr",
        "ipv6.plen",
    );
    assert!(
        lens.len() >= 4 * 6 + 30,
        "fragments from the client delivered to the pod: {}",
        lens.len()
    );
    let max = lens.iter().max().copied().unwrap_or(0);
    assert!(
        max + 40 <= 1450,
        "a fragment of {} bytes delivered to a pod whose MTU is 1450",
        max + 40
    );
}
