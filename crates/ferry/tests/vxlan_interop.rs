//! ferry's VXLAN overlay against the Linux kernel's. Node 1 runs ferry with a pod; "node
//! 2" is a plain namespace whose kernel has a vxlan device set up the way flannel and
//! Calico set theirs up (no learning, a static forwarding entry and a static neighbour
//! for ferry's VTEP, routes to node 1's pod CIDRs through it), with node 2's pod
//! addresses on it. Real tools send the traffic both ways; tshark checks the frames
//! ferry put on the wire. Needs root, iproute2, iputils-ping, netcat-openbsd, tshark and
//! ethtool.

mod common;

use std::path::Path;

use common::{Lab, pattern, sh};

/// ferry's VTEP MAC (overlay.mac) and the kernel vxlan device's MAC (nodes[].mac).
const FERRY_VTEP: &str = "0e:fe:c0:a8:4d:01";
const KERNEL_VTEP: &str = "6a:1f:22:33:44:02";

/// Node 1's tables: an uplink on the wire (taking GSO when `uplink_gso`), one pod,
/// node 2 as an overlay peer whose VTEP is the kernel's vx0.
fn tables(uplink_gso: bool) -> String {
    format!(
        r#"
node: {{ name: node1, addresses: [192.168.77.1] }}
ports:
  - {{ name: uplink, kind: uplink, mac: "02:fe:00:00:00:01", mtu: 1500, addresses: [192.168.77.1/24], gso: {uplink_gso} }}
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:01:05"
    addresses: [10.244.1.5, "fd00:10:244:1::5"]
    gso: true
overlay: {{ vni: 4096, port: 4789, mode: always, uplink: uplink, mac: "{FERRY_VTEP}" }}
nodes:
  - name: node2
    address: 192.168.77.2
    pod_cidrs: [10.244.2.0/24, "fd00:10:244:2::/64"]
    mac: "{KERNEL_VTEP}"
"#
    )
}

/// Builds node 1 (ferry, pod p1a) and node 2 (kernel vxlan vx0 holding 10.244.2.5 and
/// fd00:10:244:2::5), joined by a veth wire up1 -- up2.
fn ferry_and_kernel(tag: &str) -> (Lab, tempfile::TempDir) {
    ferry_and_kernel_with(tag, false)
}

/// [`ferry_and_kernel`], ferry's uplink taking GSO (`uplink_gso`) or not.
fn ferry_and_kernel_with(tag: &str, uplink_gso: bool) -> (Lab, tempfile::TempDir) {
    common::require(&[
        ("ip", "iproute2"),
        ("bridge", "iproute2"),
        ("ss", "iproute2"),
        ("ping", "iputils-ping"),
        ("nc", "netcat-openbsd"),
        ("tshark", "tshark"),
        ("ethtool", "ethtool"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::new(tag);
    for ns in ["n1", "n2", "p1a"] {
        lab.add_ns(ns);
    }
    lab.veth("n1", "up1", "n2", "up2");
    lab.ip(
        "n1",
        &["link", "set", "up1", "address", "02:fe:00:00:00:01"],
    );

    // Node 2: the kernel's VXLAN, as a CNI would configure it.
    lab.ip("n2", &["addr", "add", "192.168.77.2/24", "dev", "up2"]);
    // Node 2's NIC segments tunnel packets before the wire, as a physical NIC does: a
    // veth left with tunnel segmentation hands the receiving socket a VXLAN super-packet,
    // which a virtio-net header cannot describe. Checksum offload stays on, so the inner
    // checksums ferry receives are partial and ferry must finish them.
    lab.run(
        "n2",
        5,
        &[
            "ethtool",
            "-K",
            "up2",
            "tx-udp_tnl-segmentation",
            "off",
            "tx-udp_tnl-csum-segmentation",
            "off",
        ],
    );
    lab.ip(
        "n2",
        &[
            "link",
            "add",
            "vx0",
            "address",
            KERNEL_VTEP,
            "type",
            "vxlan",
            "id",
            "4096",
            "dstport",
            "4789",
            "local",
            "192.168.77.2",
            "dev",
            "up2",
            "nolearning",
        ],
    );
    lab.ip("n2", &["addr", "add", "10.244.2.5/24", "dev", "vx0"]);
    lab.ip(
        "n2",
        &["addr", "add", "fd00:10:244:2::5/64", "dev", "vx0", "nodad"],
    );
    lab.ip("n2", &["link", "set", "vx0", "up"]);
    let n2 = lab.ns("n2");
    sh(&[
        "ip",
        "netns",
        "exec",
        &n2,
        "bridge",
        "fdb",
        "add",
        FERRY_VTEP,
        "dev",
        "vx0",
        "dst",
        "192.168.77.1",
        "self",
        "permanent",
    ]);
    // Node 1's pod CIDRs through its VTEP: the network address of each CIDR stands for
    // the VTEP, resolved statically to ferry's VTEP MAC (as flannel does).
    for (cidr, vtep) in [
        ("10.244.1.0/24", "10.244.1.0"),
        ("fd00:10:244:1::/64", "fd00:10:244:1::"),
    ] {
        lab.ip(
            "n2",
            &[
                "neigh",
                "add",
                vtep,
                "lladdr",
                FERRY_VTEP,
                "dev",
                "vx0",
                "nud",
                "permanent",
            ],
        );
        lab.ip(
            "n2",
            &["route", "add", cidr, "via", vtep, "dev", "vx0", "onlink"],
        );
    }

    // Node 1: ferry.
    let pod = lab.ns("p1a");
    let attach = [
        "uplink=af-packet:up1".to_string(),
        format!("pod-a=pod:{pod}"),
    ];
    lab.ferry_node("n1", dir.path(), &tables(uplink_gso), &attach);
    lab.wait_pod("p1a");
    (lab, dir)
}

/// Counts the frames of `pcap` that match a display filter.
fn count(pcap: &Path, filter: &str) -> usize {
    tshark_lines(pcap, filter, &["-e", "frame.number"]).len()
}

/// One line of `fields` per frame of `pcap` matching `filter`.
fn tshark_lines(pcap: &Path, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut args = vec![
        "tshark",
        "-r",
        pcap.to_str().unwrap(),
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-o",
        "tcp.check_checksum:TRUE",
        "-Y",
        filter,
        "-T",
        "fields",
    ];
    args.extend_from_slice(fields);
    sh(&args).lines().map(str::to_string).collect()
}

/// A pod on ferry and a pod address on the kernel's vxlan reach each other both ways:
/// pings of 64, 1600 and 3200 bytes (the last two fragmented at the overlay MTU 1450),
/// a TCP transfer each way arriving byte-identical; and tshark, reading a capture of
/// the wire with IP, UDP and TCP checksums verified, finds no error in any frame.
#[test]
fn ferry_and_kernel_vxlan_carry_ipv4_both_ways() {
    let (mut lab, dir) = ferry_and_kernel("vxa");
    let pcap = dir.path().join("wire.pcap");
    lab.capture("n2", "tshark on up2", "up2", &pcap);

    for size in [64, 1600, 3200] {
        lab.ping("p1a", "10.244.2.5", size, 3);
        lab.ping("n2", "10.244.1.5", size, 3);
    }
    let data = pattern(2_000_000, 1);
    lab.tcp_transfer(dir.path(), ("n2", "10.244.2.5"), "p1a", 5001, &data);
    let data = pattern(2_000_000, 2);
    lab.tcp_transfer(dir.path(), ("p1a", "10.244.1.5"), "n2", 5002, &data);

    lab.stop_capture("tshark on up2", &pcap);
    let from_ferry = "ip.src == 192.168.77.1 && udp.dstport == 4789";
    let ferry_vxlan = count(&pcap, &format!("{from_ferry} && vxlan.vni == 4096"));
    assert!(
        ferry_vxlan > 100,
        "few VXLAN frames (VNI 4096) from ferry on the wire: {ferry_vxlan}"
    );
    // Only ferry's frames: the kernel's leave their checksums to the (virtual) NIC, so the
    // capture shows them unfinished.
    let bad = tshark_lines(
        &pcap,
        "ip.src == 192.168.77.1 && (_ws.malformed || _ws.expert.severity == error)",
        &[
            "-e",
            "frame.number",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
            "-e",
            "_ws.expert.message",
        ],
    );
    assert!(
        bad.is_empty(),
        "tshark finds errors in {} of ferry's frames on the wire, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    // The inner frames ferry sent carry its VTEP MAC to the kernel's.
    let wrong_macs = count(
        &pcap,
        &format!("{from_ferry} && !(eth.src == {FERRY_VTEP} && eth.dst == {KERNEL_VTEP})"),
    );
    assert_eq!(wrong_macs, 0, "inner frames from ferry with other MACs");
    // Fragmented pings crossed as inner fragments, both ways.
    for src in ["192.168.77.1", "192.168.77.2"] {
        let frags = count(
            &pcap,
            &format!("ip.src == {src} && vxlan && ip.flags.mf == 1 && ip.proto == 1"),
        );
        assert!(
            frags >= 6,
            "inner IP fragments in VXLAN from {src}: {frags}"
        );
    }
}

/// The same with IPv6 inside (IPv4 underlay): pings of 64, 1600 and 3200 bytes and a
/// TCP transfer, both ways.
#[test]
fn ferry_and_kernel_vxlan_carry_ipv6_both_ways() {
    let (mut lab, dir) = ferry_and_kernel("vxb");
    for size in [64, 1600, 3200] {
        lab.ping("p1a", "fd00:10:244:2::5", size, 3);
        lab.ping("n2", "fd00:10:244:1::5", size, 3);
    }
    let data = pattern(2_000_000, 3);
    lab.tcp_transfer(dir.path(), ("n2", "fd00:10:244:2::5"), "p1a", 5003, &data);
    let data = pattern(2_000_000, 4);
    lab.tcp_transfer(dir.path(), ("p1a", "fd00:10:244:1::5"), "n2", 5004, &data);
}

/// ferry's uplink taking GSO: the segments of the pod's TCP super-packets reach the
/// kernel's vxlan as UDP GSO super-frames (the veth passes them whole), which the kernel
/// cuts and decapsulates itself; the transfers arrive byte-identical both ways. The
/// super-frames' UDP checksums are partial on the wire (as the kernel's own frames'
/// are), so tshark checks only ferry's other frames.
#[test]
fn kernel_vxlan_takes_ferrys_udp_gso_super_frames() {
    let (mut lab, dir) = ferry_and_kernel_with("vxg", true);
    let pcap = dir.path().join("wire.pcap");
    lab.capture("n2", "tshark on up2", "up2", &pcap);
    for size in [64, 3200] {
        lab.ping("p1a", "10.244.2.5", size, 2);
        lab.ping("n2", "fd00:10:244:1::5", size, 2);
    }
    let data = pattern(3_000_000, 3);
    lab.tcp_transfer(dir.path(), ("n2", "10.244.2.5"), "p1a", 5001, &data);
    lab.tcp_transfer(dir.path(), ("n2", "fd00:10:244:2::5"), "p1a", 5003, &data);
    lab.tcp_transfer(dir.path(), ("p1a", "10.244.1.5"), "n2", 5002, &data);
    lab.stop_capture("tshark on up2", &pcap);
    let supers = count(
        &pcap,
        "ip.src == 192.168.77.1 && udp.dstport == 4789 && frame.len > 1514",
    );
    assert!(
        supers > 10,
        "UDP GSO super-frames from ferry on the wire: {supers}"
    );
    let bad = tshark_lines(
        &pcap,
        "ip.src == 192.168.77.1 && frame.len <= 1514 && (_ws.malformed || _ws.expert.severity == error)",
        &["-e", "frame.number", "-e", "_ws.expert.message"],
    );
    assert!(
        bad.is_empty(),
        "tshark finds errors in ferry's frames: {bad:?}"
    );
}
