//! `ferry tables` and `ferry replay --cluster` as a user runs them: the binary on the
//! example cluster in `examples/cluster`, and on broken copies of it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferry_datapath::{PortKind, TablesSpec};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `ferry tables` that must succeed: its stdout, parsed.
fn tables(args: &[&str]) -> (TablesSpec, String) {
    let out = ferry(&[&["tables"], args].concat());
    assert!(
        out.status.success(),
        "ferry tables {args:?} failed:\n{}",
        text(&out.stderr)
    );
    let spec: TablesSpec = serde_saphyr::from_str(&text(&out.stdout))
        .unwrap_or_else(|e| panic!("stdout is a tables file: {e}\n{}", text(&out.stdout)));
    (spec, text(&out.stderr))
}

/// A copy of the example cluster to break.
fn example_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for e in fs::read_dir(example()).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit(path: &Path, from: &str, to: &str) {
    let s = fs::read_to_string(path).unwrap();
    assert!(s.contains(from), "{} has {from:?}", path.display());
    fs::write(path, s.replacen(from, to, 1)).unwrap();
}

#[test]
fn tables_of_each_example_node_load_and_compile() {
    let dir = example();
    for (node, peer, pods) in [("node-a", "node-b", 3), ("node-b", "node-a", 2)] {
        let (t, stderr) = tables(&["--cluster", dir.to_str().unwrap(), "--node", node]);
        assert!(stderr.is_empty(), "no warnings expected: {stderr}");
        let compiled = t.compile().expect("the printed tables compile");
        assert_eq!(t.node.name, node);
        assert_eq!(t.ports[0].kind, PortKind::Uplink);
        let pod_ports = t.ports.iter().filter(|p| p.kind == PortKind::Pod).count();
        assert_eq!(pod_ports, pods, "{node}: running pods with an address");
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.nodes[0].name, peer);
        assert!(compiled.overlay.is_some());
        let names: Vec<&str> = t.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "default/kubernetes:https",
                "default/sticky:http",
                "default/web:http",
                "default/web-lb:http",
                "default/web-lb:http-alt",
                "default/web-nodeport:http",
            ]
        );
    }
}

#[test]
fn tables_with_pod_attaches_only_the_pods_named() {
    let (t, _) = tables(&[
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-a",
        "--pod",
        "default/sticky-0",
    ]);
    let pods: Vec<&str> = t
        .ports
        .iter()
        .filter(|p| p.kind == PortKind::Pod)
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(pods, ["pod.default.sticky-0"]);
}

#[test]
fn tables_on_a_base_file_keep_its_ports_and_routes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.yaml");
    fs::write(
        &base,
        "ports:\n  - { name: eth1, kind: uplink, mac: \"02:fe:00:00:00:01\", mtu: 9000, addresses: [192.168.10.2/24] }\n  - { name: host, kind: host, mac: \"02:fe:00:00:00:fe\", addresses: [169.254.1.1] }\nroutes:\n  - { prefix: 0.0.0.0/0, port: eth1, via: 192.168.10.1 }\n",
    )
    .unwrap();
    let (t, _) = tables(&[
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-a",
        "--base",
        base.to_str().unwrap(),
    ]);
    let names: Vec<&str> = t.ports.iter().take(2).map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["eth1", "host"]);
    assert_eq!(t.overlay.as_ref().unwrap().uplink, "eth1");
    let compiled = t.compile().unwrap();
    let pod = compiled
        .ports
        .iter()
        .find(|p| p.kind == PortKind::Pod)
        .unwrap();
    assert_eq!(pod.mtu, 8950, "the pod MTU follows the base's uplink");
}

#[test]
fn tables_that_do_not_compile_on_a_base_file_name_it() {
    // The base's limits are wrong: the base is where the fault is.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.yaml");
    fs::write(
        &base,
        "ports:\n  - { name: eth1, kind: uplink, mac: \"02:fe:00:00:00:01\", addresses: [192.168.10.2/24] }\nroutes:\n  - { prefix: 0.0.0.0/0, port: eth1, via: 192.168.10.1 }\nct: { max_entries: 0 }\n",
    )
    .unwrap();
    let out = ferry(&[
        "tables",
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-a",
        "--base",
        base.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let want = format!(
        "the tables of node node-a on the base tables {} do not compile: ct: max_entries",
        base.display()
    );
    assert!(err.contains(&want), "{err}");
}

#[test]
fn a_peer_a_base_file_has_no_route_to_is_left_out_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.yaml");
    fs::write(
        &base,
        "ports:\n  - { name: eth1, kind: uplink, mac: \"02:fe:00:00:00:01\", addresses: [192.168.10.2/24] }\n",
    )
    .unwrap();
    let (t, stderr) = tables(&[
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-a",
        "--base",
        base.to_str().unwrap(),
    ]);
    assert!(t.nodes.is_empty());
    assert!(
        stderr.contains("warning: Node node-b: no route to its InternalIP 192.168.20.2 through the uplink \"eth1\""),
        "{stderr}"
    );
}

#[test]
fn a_bad_manifest_fails_naming_file_object_and_field() {
    let dir = example_copy();
    edit(
        &dir.path().join("services.yaml"),
        "    nodePort: 30082",
        "    nodePort: 70000",
    );
    edit(
        &dir.path().join("pods.yaml"),
        "    - ip: 10.244.2.5",
        "    - ip: 10.244.2.500",
    );
    let out = ferry(&[
        "tables",
        "--cluster",
        dir.path().to_str().unwrap(),
        "--node",
        "node-a",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no tables on a refused cluster");
    let err = text(&out.stderr);
    let d = dir.path().display();
    assert!(
        err.contains(&format!("{d}/pods.yaml:4: Pod default/web-7c9d8f6b5-m8q3n: status.podIPs[0].ip: \"10.244.2.500\" is not an IP address")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{d}/services.yaml:"))
            && err.contains(
                ": Service default/web-lb: spec.ports[1].nodePort: 70000 is outside 1-65535"
            ),
        "{err}"
    );
}

#[test]
fn warnings_and_notes_go_to_stderr_and_the_tables_to_stdout() {
    let dir = example_copy();
    fs::write(
        dir.path().join("extra.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec: {}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: sig, namespace: default}\nspec:\n  clusterIP: 10.96.0.40\n  ports:\n  - {name: diameter, port: 3868, protocol: SCTP}\n",
    )
    .unwrap();
    let (t, stderr) = tables(&[
        "--cluster",
        dir.path().to_str().unwrap(),
        "--node",
        "node-a",
    ]);
    assert!(!t.services.iter().any(|s| s.name.starts_with("default/sig")));
    assert!(
        stderr.contains("note: ")
            && stderr.contains("extra.yaml:1: apps/v1 Deployment web: ignored"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: Service default/sig: spec.ports[0] (diameter): SCTP is not supported yet; port skipped"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_node_fails() {
    let out = ferry(&[
        "tables",
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-z",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no Node named \"node-z\""));
}

/// A pcap file with one Ethernet frame.
fn pcap_of(path: &Path, frame: &[u8]) {
    use pcap_file::pcap::{PcapPacket, PcapWriter};
    let mut w = PcapWriter::new(fs::File::create(path).unwrap()).unwrap();
    w.write_packet(&PcapPacket::new(
        std::time::Duration::from_secs(1),
        frame.len() as u32,
        frame,
    ))
    .unwrap();
}

/// Replays `inputs` (each received on web-7c9d8f6b5-4xk2p's port) through node-a of the
/// example cluster; the verdicts.
fn replay_node_a(dir: &Path, inputs: &[&Path]) -> Vec<serde_json::Value> {
    let out_dir = dir.join("out");
    let pod = "pod.default.web-7c9d8f6b5-4xk2p";
    let mut args = vec![
        "replay".to_string(),
        "--cluster".into(),
        example().display().to_string(),
        "--node".into(),
        "node-a".into(),
    ];
    for i in inputs {
        args.push("--in".into());
        args.push(format!("{pod}={}", i.display()));
    }
    args.push("--out".into());
    args.push(out_dir.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ferry(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    fs::read_to_string(out_dir.join("verdicts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn replay_with_cluster_uses_the_compiled_tables() {
    let dir = tempfile::tempdir().unwrap();
    // web-7c9d8f6b5-4xk2p (10.244.1.5, eth0 0a:58:0a:f4:01:05) pings sticky-0 on the
    // same node and web-7c9d8f6b5-m8q3n on node-b.
    let mut frames = Vec::new();
    for dst in [[10, 244, 1, 7], [10, 244, 2, 5]] {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05], [0xee; 6])
            .ipv4([10, 244, 1, 5], dst, 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut f, b"ping")
            .unwrap();
        frames.push(f);
    }
    let (a, b) = (dir.path().join("a.pcap"), dir.path().join("b.pcap"));
    pcap_of(&a, &frames[0]);
    pcap_of(&b, &frames[1]);
    let verdicts = replay_node_a(dir.path(), &[&a, &b]);
    assert_eq!(verdicts[0]["outputs"][0]["port"], "pod.default.sticky-0");
    // To node-b through the tunnel (then held up asking for the gateway's MAC, as nothing
    // answers in a replay).
    let trace: Vec<&str> = verdicts[1]["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["detail"].as_str())
        .collect();
    assert!(
        trace.contains(&"10.244.2.5 -> node node-b through the overlay"),
        "{trace:?}"
    );
}

#[test]
fn replay_with_cluster_balances_services_to_their_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    // web-7c9d8f6b5-4xk2p (10.244.1.5) opens a connection to the sticky Service's
    // cluster IP: its only ready endpoint is sticky-0 (10.244.1.7:9376) on this node.
    let mut syn = Vec::new();
    etherparse::PacketBuilder::ethernet2([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05], [0xee; 6])
        .ipv4([10, 244, 1, 5], [10, 96, 0, 13], 64)
        .tcp(40000, 80, 1, 65535)
        .syn()
        .write(&mut syn, &[])
        .unwrap();
    let input = dir.path().join("syn.pcap");
    pcap_of(&input, &syn);
    let v = replay_node_a(dir.path(), &[&input]).remove(0);
    assert_eq!(v["outputs"][0]["port"], "pod.default.sticky-0", "{v}");
    assert_eq!(v["ct"], "new");
    let service = v["trace"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["stage"] == "service")
        .and_then(|e| e["detail"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        service.contains("default/sticky:http") && service.contains("10.244.1.7:9376"),
        "{v}"
    );
}

#[test]
fn replay_names_the_cluster_when_a_port_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferry(&[
        "replay",
        "--cluster",
        example().to_str().unwrap(),
        "--node",
        "node-b",
        "--in",
        "pod-a=/nonexistent.pcap",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no port \"pod-a\" in node node-b of ")
            && err.contains("pod.default.sticky-1"),
        "{err}"
    );
}

#[test]
fn replay_needs_tables_or_a_cluster_and_node() {
    let out = ferry(&["replay", "--in", "a=b", "--out", "/tmp/x"]);
    assert!(!out.status.success());
    let out = ferry(&[
        "replay",
        "--cluster",
        "examples/cluster",
        "--in",
        "a=b",
        "--out",
        "/tmp/x",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--node"));
}
