//! Two ferry nodes in network namespaces, joined by a veth "wire", each with pods whose
//! TAPs ferry set up: real kernel stacks and real tools send the traffic, through ferry's
//! pipeline and its VXLAN overlay. Needs root, iproute2, iputils-ping, netcat-openbsd,
//! iperf3, tshark, nftables and python3 (scripts/test.sh installs them).

mod common;

use std::fs;

use common::Lab;

/// The tables of node `n` (1 or 2): an uplink on the wire (taking GSO when
/// `uplink_gso`), two pods, the other node as the overlay peer. Pod b has MTU 1500 on
/// purpose: bigger than the overlay carries.
fn tables_with(n: u8, uplink_gso: bool) -> String {
    let peer = 3 - n;
    format!(
        r#"
node: {{ name: node{n}, addresses: [192.168.77.{n}] }}
ports:
  - {{ name: uplink, kind: uplink, mac: "02:fe:00:00:00:0{n}", mtu: 1500, addresses: [192.168.77.{n}/24], gso: {uplink_gso} }}
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:0{n}:05"
    addresses: [10.244.{n}.5, "fd00:10:244:{n}::5"]
    gso: true
  - name: pod-b
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:0{n}:06"
    addresses: [10.244.{n}.6, "fd00:10:244:{n}::6"]
    mtu: 1500
    gso: true
overlay: {{ vni: 4096, mode: always, uplink: uplink }}
nodes:
  - {{ name: node{peer}, address: 192.168.77.{peer}, pod_cidrs: [10.244.{peer}.0/24, "fd00:10:244:{peer}::/64"] }}
"#
    )
}

/// Builds the two nodes and their pods and starts ferry on both.
fn two_nodes(tag: &str) -> (Lab, tempfile::TempDir) {
    two_nodes_with(tag, false, 1)
}

/// [`two_nodes`], the uplinks taking GSO (`uplink_gso`) or not, with `workers` worker
/// threads per node (pinned to CPUs and busy polling when there are several).
fn two_nodes_with(tag: &str, uplink_gso: bool, workers: u16) -> (Lab, tempfile::TempDir) {
    two_nodes_wired(tag, uplink_gso, workers, false)
}

/// [`two_nodes_with`], the wire a bridge in namespace `fab` (ports f1 and f2) when
/// `bridged`, where the underlay can be given rules of its own.
fn two_nodes_wired(
    tag: &str,
    uplink_gso: bool,
    workers: u16,
    bridged: bool,
) -> (Lab, tempfile::TempDir) {
    common::require(&[
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("nc", "netcat-openbsd"),
        ("iperf3", "iperf3"),
        ("tshark", "tshark"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::new(tag);
    for ns in ["n1", "n2", "p1a", "p1b", "p2a", "p2b"] {
        lab.add_ns(ns);
    }
    if bridged {
        lab.add_ns("fab");
        lab.fabric("fab", &[("n1", "up1", "f1"), ("n2", "up2", "f2")]);
    } else {
        lab.veth("n1", "up1", "n2", "up2");
    }
    for n in [1u8, 2] {
        let node = format!("n{n}");
        lab.ip(
            &node,
            &[
                "link",
                "set",
                &format!("up{n}"),
                "address",
                &format!("02:fe:00:00:00:0{n}"),
            ],
        );
        let (pa, pb) = (lab.ns(&format!("p{n}a")), lab.ns(&format!("p{n}b")));
        let attach = [
            format!("uplink=af-packet:up{n}"),
            format!("pod-a=pod:{pa}"),
            format!("pod-b=pod:{pb}"),
        ];
        let w = workers.to_string();
        let mut more = vec!["--workers", w.as_str()];
        if workers > 1 {
            // Pinned, and busy polling for 50 us after each batch received.
            more.extend(["--pin-workers", "--busy-poll", "50"]);
        }
        lab.ferry_node_with(
            &node,
            dir.path(),
            &tables_with(n, uplink_gso),
            &attach,
            &more,
        );
    }
    for pod in ["p1a", "p1b", "p2a", "p2b"] {
        lab.wait_pod(pod);
    }
    (lab, dir)
}

#[test]
fn pods_talk_within_and_across_nodes() {
    let (mut lab, dir) = two_nodes("na");
    // Same node, other node; IPv4 and IPv6; small and fragmented (3000 bytes at MTU 1450).
    lab.ping("p1a", "10.244.1.6", 56, 3);
    lab.ping("p1a", "10.244.2.5", 56, 3);
    lab.ping("p1a", "10.244.2.5", 3000, 3);
    lab.ping("p1a", "fd00:10:244:2::5", 56, 3);
    lab.ping("p1a", "fd00:10:244:1::6", 3000, 3);
    lab.ping("p2b", "fd00:10:244:1::5", 3000, 3);

    // A TCP transfer across nodes arrives byte-identical.
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = dir.path().join("data");
    fs::write(&file, &data).unwrap();
    let got = dir.path().join("got");
    lab.spawn(
        "p2a",
        "nc server",
        &["sh", "-c", &format!("nc -l 5001 > {}", got.display())],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    lab.run(
        "p1a",
        30,
        &[
            "sh",
            "-c",
            &format!("nc -N -w 5 10.244.2.5 5001 < {}", file.display()),
        ],
    );
    let got_path = got.clone();
    let len = data.len() as u64;
    lab.wait_for(10, "the whole file at the server", |_| {
        fs::metadata(&got_path).is_ok_and(|m| m.len() >= len)
    });
    assert!(fs::read(&got).unwrap() == data, "the file arrived changed");

    // 2000-byte UDP datagrams across nodes (fragmented by the sender at 1450).
    let udp_got = dir.path().join("udp");
    lab.spawn(
        "p2b",
        "udp server",
        &[
            "sh",
            "-c",
            &format!("nc -u -l 5002 > {}", udp_got.display()),
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dgram: String = (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let dfile = dir.path().join("dgram");
    fs::write(&dfile, &dgram).unwrap();
    lab.run(
        "p1b",
        10,
        &[
            "sh",
            "-c",
            &format!("nc -u -w 1 10.244.2.6 5002 < {}", dfile.display()),
        ],
    );
    let up = udp_got.clone();
    lab.wait_for(10, "the 2000-byte datagram", |_| {
        fs::read_to_string(&up).is_ok_and(|s| s.len() >= 2000)
    });
    assert_eq!(fs::read_to_string(&udp_got).unwrap(), dgram);
}

#[test]
fn path_mtu_discovery_works_across_the_overlay() {
    let (mut lab, _dir) = two_nodes("nb");
    lab.ping("p1b", "10.244.2.5", 56, 1);
    // Pod b's MTU is 1500 but the overlay carries 1450: ferry answers DF packets that do
    // not fit with "fragmentation needed", MTU 1450.
    let out = lab.exec(
        "p1b",
        10,
        &[
            "ping",
            "-c",
            "2",
            "-W",
            "2",
            "-M",
            "do",
            "-s",
            "1472",
            "10.244.2.5",
        ],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("mtu = 1450") || text.contains("mtu=1450"),
        "no fragmentation needed with MTU 1450: {text}"
    );
    // After it, the pod's kernel knows the path MTU and a 1422-byte ping with DF passes.
    lab.ping("p1b", "10.244.2.5", 1422, 2);
}

#[test]
fn a_long_tcp_stream_leaves_no_ip_fragment_on_the_wire() {
    let (mut lab, dir) = two_nodes("nc");
    lab.ping("p1a", "10.244.2.5", 56, 1);
    let pcap = dir.path().join("wire.pcap");
    lab.spawn(
        "n2",
        "tshark",
        &[
            "tshark",
            "-q",
            "-i",
            "up2",
            "-s",
            "160",
            "-a",
            "duration:6",
            "-w",
            pcap.to_str().unwrap(),
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    lab.spawn("p2a", "iperf3 server", &["iperf3", "-s", "-1"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let json = lab.run("p1a", 20, &["iperf3", "-c", "10.244.2.5", "-t", "2", "-J"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("iperf3 JSON");
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    let retrans = v["end"]["sum_sent"]["retransmits"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let sent = v["end"]["sum_sent"]["bytes"].as_f64().unwrap_or(0.0);
    assert!(bps > 1e6, "iperf3 across the overlay: {bps} bit/s");
    eprintln!(
        "iperf3 across the overlay: {:.0} Mbit/s, {retrans} retransmits",
        bps / 1e6
    );
    let segments = sent / 1398.0;
    assert!(
        (retrans as f64) < segments * 0.01 + 50.0,
        "retransmission storm: {retrans} retransmits for about {segments} segments"
    );
    lab.wait_for(10, "the capture to finish", |_| pcap.exists());
    let pcap_path = pcap.clone();
    let frames = |filter: &str| -> usize {
        // Headers only (snap length 160) and no TCP analysis: counting stays fast.
        let out = common::sh(&[
            "tshark",
            "-r",
            pcap_path.to_str().unwrap(),
            "--disable-protocol",
            "tcp",
            "-Y",
            filter,
            "-T",
            "fields",
            "-e",
            "frame.number",
        ]);
        out.lines().count()
    };
    // Wait for tshark to stop (duration) so the file is complete.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let vxlan = frames("vxlan && ip.dst == 10.244.2.5");
    assert!(
        vxlan > 1000,
        "the stream crossed the wire in VXLAN: {vxlan} frames"
    );
    let fragments = frames("ip.flags.mf == 1 || ip.frag_offset > 0");
    assert_eq!(fragments, 0, "IP fragments on the wire during a TCP stream");
}

#[test]
fn with_uplink_gso_a_stream_crosses_in_udp_gso_super_frames_and_arrives_intact() {
    let (mut lab, dir) = two_nodes_with("ng", true, 1);
    lab.ping("p1a", "10.244.2.5", 56, 1);
    lab.ping("p1a", "10.244.2.5", 3000, 2);
    lab.ping("p2a", "fd00:10:244:1::5", 3000, 2);
    let pcap = dir.path().join("wire.pcap");
    lab.capture("n2", "tshark on up2", "up2", &pcap);
    // Both ways, IPv4 and IPv6, byte-identical.
    let data = common::pattern(4_000_000, 7);
    lab.tcp_transfer(dir.path(), ("p2a", "10.244.2.5"), "p1a", 5001, &data);
    lab.tcp_transfer(dir.path(), ("p1b", "fd00:10:244:1::6"), "p2b", 5002, &data);
    lab.stop_capture("tshark on up2", &pcap);
    let fields = |filter: &str, field: &str| common::tshark_fields(&pcap, filter, field);
    // The veth wire carries what the sending node's AF_PACKET socket handed it whole:
    // UDP GSO super-frames, larger than the uplink's MTU, each cut into VXLAN datagrams
    // only by whoever segments it (here nobody before the peer's socket).
    let supers = fields("udp.dstport == 4789 && frame.len > 1514", "frame.len");
    assert!(
        supers.len() > 10,
        "super-frames on the wire: {} ({:?})",
        supers.len(),
        &supers[..supers.len().min(5)]
    );
    let fragments = fields("ip.flags.mf == 1 || ip.frag_offset > 0", "frame.number");
    assert!(
        fragments.is_empty(),
        "IP fragments on the wire: {fragments:?}"
    );
    // Both nodes say so when they stop.
    for node in ["n1", "n2"] {
        let (_, line) = lab.stop_ferry(node);
        assert!(
            count_before(&line, "super-frames sent") > 0,
            "{node}: {line}"
        );
        assert!(count_before(&line, "received);") > 0, "{node}: {line}");
    }
}

/// Congestion marks cross the overlay (RFC 6040). The sending pod's TCP uses ECN; the
/// underlay (nftables on the bridge between the nodes, standing in for a router whose
/// queue is filling) marks CE every VXLAN datagram towards node 2 that is ECN-capable,
/// as such a router would. Node 1 must copy the inner packet's ECN field to the outer
/// header for the router to mark it instead of dropping it, and node 2 must carry the
/// mark into the inner packet for the receiving pod to see it.
#[test]
fn congestion_marks_of_the_underlay_reach_the_receiving_pod() {
    common::require(&[("nft", "nftables"), ("python3", "python3")]);
    let (mut lab, dir) = two_nodes_wired("ne", false, 1, true);
    lab.run(
        "fab",
        5,
        &[
            "nft",
            "add table bridge underlay; \
             add chain bridge underlay marks { type filter hook forward priority 0; }; \
             add rule bridge underlay marks ip daddr 192.168.77.2 udp dport 4789 \
                 ip ecn ect0 ip ecn set ce",
        ],
    );
    lab.run("p1a", 5, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
    lab.ping("p1a", "10.244.2.5", 56, 1);
    let (wire, pod) = (dir.path().join("wire.pcap"), dir.path().join("pod.pcap"));
    lab.capture("n2", "tshark on up2", "up2", &wire);
    lab.capture("p2a", "tshark in p2a", "eth0", &pod);
    let (sink, send, log) = (
        dir.path().join("sink.py"),
        dir.path().join("send.py"),
        dir.path().join("sink.log"),
    );
    fs::write(&sink, common::TCP_SINK).unwrap();
    fs::write(&send, common::TCP_SEND).unwrap();
    lab.daemon(
        "p2a",
        "tcp sink",
        &[
            "python3",
            sink.to_str().unwrap(),
            "7200",
            log.to_str().unwrap(),
        ],
    );
    lab.wait_for(5, "the sink listening", |l| {
        String::from_utf8_lossy(&l.exec("p2a", 2, &["ss", "-Hltn"]).stdout).contains(":7200 ")
    });
    let out = lab.run(
        "p1a",
        40,
        &[
            "python3",
            send.to_str().unwrap(),
            "10.244.2.5",
            "7200",
            "2000000",
        ],
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 4, "the sender's output: {out}");
    assert_eq!(
        (words[2], words[3]),
        (words[0], words[1]),
        "the stream arrived intact"
    );
    lab.stop_capture("tshark on up2", &wire);
    lab.stop_capture("tshark in p2a", &pod);
    // On the wire, the outer and inner ECN fields of the stream's datagrams: the router
    // marked the outer header (CE, 3) of datagrams whose inner packet is ECT(0) (2).
    let ecn = common::tshark_fields(
        &wire,
        "vxlan && ip.dst == 10.244.2.5 && tcp.len > 0",
        "ip.dsfield.ecn",
    );
    assert!(
        ecn.iter().filter(|e| e.as_str() == "3,2").count() > 10,
        "outer CE around inner ECT(0) on the wire: {:?}",
        &ecn[..ecn.len().min(10)]
    );
    // In the pod: the stream's segments carry the mark.
    let marked = common::tshark_fields(
        &pod,
        "ip.src == 10.244.1.5 && tcp.len > 0 && ip.dsfield.ecn == 3",
        "frame.number",
    );
    assert!(!marked.is_empty(), "no CE-marked segment reached the pod");
    for node in ["n1", "n2"] {
        let (_, line) = lab.stop_ferry(node);
        assert!(!line.contains("vxlan_ce_not_ect"), "{node}: {line}");
    }
}

/// The CPUs of a `Cpus_allowed_list:` line of a /proc status file (`0-3,6`).
fn cpus_allowed(status: &str) -> Vec<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("a Cpus_allowed_list line")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// The threads (name, allowed CPUs) of the process whose command line names `tables`.
fn threads_of(tables: &std::path::Path) -> Vec<(String, Vec<usize>)> {
    let want = tables.to_str().unwrap();
    let pid = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0).any(|arg| arg == want.as_bytes())
                    && c.starts_with(env!("CARGO_BIN_EXE_ferry").as_bytes())
            })
        })
        .unwrap_or_else(|| panic!("no ferry process with {want}"))
        .path();
    fs::read_dir(pid.join("task"))
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?.path();
            let comm = fs::read_to_string(t.join("comm")).ok()?;
            let status = fs::read_to_string(t.join("status")).ok()?;
            Some((comm.trim().to_string(), cpus_allowed(&status)))
        })
        .collect()
}

/// The number in `line` right before `what`.
fn count_before(line: &str, what: &str) -> u64 {
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("{what:?} in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
        .unwrap_or_else(|| panic!("a count before {what:?} in {line}"))
}

#[test]
fn with_two_workers_per_node_pods_talk_and_both_workers_carry_traffic() {
    let (mut lab, dir) = two_nodes_with("nw", true, 2);
    lab.ping("p1a", "10.244.1.6", 56, 2);
    lab.ping("p1a", "10.244.2.5", 3000, 2);
    lab.ping("p2b", "fd00:10:244:1::5", 3000, 2);
    // Streams both ways from both pods of each node arrive byte-identical.
    let data = common::pattern(3_000_000, 11);
    lab.tcp_transfer(dir.path(), ("p2a", "10.244.2.5"), "p1a", 5001, &data);
    lab.tcp_transfer(dir.path(), ("p1b", "10.244.1.6"), "p2b", 5002, &data);
    lab.tcp_transfer(dir.path(), ("p2b", "fd00:10:244:2::6"), "p1b", 5003, &data);
    lab.tcp_transfer(dir.path(), ("p1a", "fd00:10:244:1::5"), "p2a", 5004, &data);
    // Which worker reads a flow is the kernel's hash of it, on the uplink's fanout group
    // and on a pod's multi-queue TAP alike: a coin flip per flow. 16 parallel streams
    // each way leave both workers of a node without traffic with odds of 2^-31.
    // Each direction has a one-test server of its own on its own port: a second server
    // on the first one's port could start before the first has let go of it.
    for (reverse, port) in [(false, "5201"), (true, "5202")] {
        lab.spawn(
            "p2a",
            &format!("iperf3 server on {port}"),
            &["iperf3", "-s", "-1", "-p", port],
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut cmd = vec![
            "iperf3",
            "-c",
            "10.244.2.5",
            "-p",
            port,
            "-t",
            "1",
            "-P",
            "16",
            "-J",
        ];
        if reverse {
            cmd.push("-R");
        }
        let json = lab.run("p1a", 20, &cmd);
        let v: serde_json::Value = serde_json::from_str(&json).expect("iperf3 JSON");
        let bytes = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
        assert!(
            bytes > 1e6,
            "16 iperf3 streams (reverse {reverse}): {bytes} bytes; iperf3 said: {} {}",
            v["error"],
            v["end"]
        );
    }
    // Pinned: each worker thread of a node may run on one CPU only, worker i on the
    // i-th CPU ferry may run on.
    let ours = cpus_allowed(&fs::read_to_string("/proc/self/status").unwrap());
    for node in ["n1", "n2"] {
        let threads = threads_of(&dir.path().join(format!("{node}.yaml")));
        let cpus = |name: &str| {
            threads
                .iter()
                .find(|(comm, _)| comm == name)
                .map(|(_, cpus)| cpus.clone())
                .unwrap_or_else(|| panic!("no thread {name} in ferry on {node}: {threads:?}"))
        };
        assert_eq!(cpus("ferry"), [ours[0]], "worker 0 on {node}");
        assert_eq!(
            cpus("ferry-worker-1"),
            [ours[1 % ours.len()]],
            "worker 1 on {node}"
        );
    }
    for node in ["n1", "n2"] {
        let (_, line) = lab.stop_ferry(node);
        eprintln!("{node}: {line}");
        let w0 = count_before(&line, "by worker 0");
        let w1 = count_before(&line, "by worker 1");
        assert!(
            w0 > 100 && w1 > 100,
            "{node}: both workers received: {line}"
        );
        // The workers polled on after receiving, without sleeping.
        assert!(
            count_before(&line, "rounds busy polling") > 0,
            "{node}: {line}"
        );
    }
}

#[test]
fn a_pod_whose_namespace_is_deleted_is_taken_out_of_service_and_the_others_go_on() {
    let (mut lab, _dir) = two_nodes("ng");
    lab.ping("p1a", "10.244.1.6", 56, 3);
    lab.ping("p1a", "10.244.2.5", 56, 3);

    // Pod b of node 1 goes without a word to ferry: its namespace is deleted, and with it
    // the TAP ferry holds open.
    lab.del_ns("p1b");
    // Long enough for a worker that spun on the dead descriptor to have given up.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    lab.check_alive();
    lab.ping("p1a", "10.244.2.5", 56, 3);
    lab.ping("p2a", "10.244.1.5", 1000, 3);
    let to_b = lab.exec("p1a", 5, &["ping", "-c", "2", "-W", "1", "10.244.1.6"]);
    assert!(!to_b.status.success(), "the deleted pod answered");
    lab.check_alive();

    let (log, stop) = lab.stop_ferry("n1");
    assert!(
        log.contains("port pod-b") && log.contains("the device is gone"),
        "{log}"
    );
    let stop = stop.as_str();
    assert_eq!(
        count_before(stop, "pod ports taken out of service"),
        1,
        "{stop}"
    );
    assert!(
        count_before(stop, "frames dropped on the way out") > 0,
        "{stop}"
    );
}
