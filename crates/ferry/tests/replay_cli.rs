//! `ferry replay` and `ferry demo` as a user runs them: the binary, real files, and
//! tshark reading what came out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

fn tshark(file: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tshark is needed for this test (apt-get install tshark): {e}"));
    assert!(
        out.status.success(),
        "tshark failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark output is text")
}

fn demo_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = ferry(&["demo", "--dir", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "ferry demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = dir.path().join("out");
    (dir, p)
}

fn verdicts(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("verdicts.jsonl"))
        .expect("verdicts.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each verdict line is JSON"))
        .collect()
}

#[test]
fn demo_refragments_to_mru_and_segments_coalesced_tcp() {
    let (_dir, out) = demo_dir();
    let pod = out.join("pod-a.pcap");
    // Every IP packet that reached the pod fits its MTU of 1450.
    let lens = tshark(&pod, &["-T", "fields", "-e", "ip.len", "-e", "ipv6.plen"]);
    for l in lens.lines() {
        let n: usize = l
            .split('\t')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>().unwrap())
            .sum();
        assert!(
            n > 0 && n <= 1450,
            "packet of {n} bytes on pod-a (line {l:?})"
        );
    }
    // tshark reassembles the refragmented IPv4 UDP datagram to its 4000 + 8 bytes, with the real ports.
    let udp = tshark(
        &pod,
        &[
            "-Y",
            "udp.dstport == 8080 && udp.srcport == 40000",
            "-T",
            "fields",
            "-e",
            "udp.length",
        ],
    );
    assert_eq!(
        udp.trim(),
        "4008",
        "reassembled UDP datagram seen by tshark: {udp:?}"
    );
    let frags = tshark(
        &pod,
        &[
            "-Y",
            "ip.id == 0x4242 && (ip.flags.mf == 1 || ip.frag_offset > 0)",
            "-T",
            "fields",
            "-e",
            "ip.id",
        ],
    );
    let ids: Vec<&str> = frags.lines().collect();
    assert_eq!(
        ids.len(),
        3,
        "the 4000-byte datagram leaves as 3 fragments: {ids:?}"
    );
    assert!(
        ids.iter().all(|i| *i == "0x4242"),
        "identification kept: {ids:?}"
    );
    // The IPv6 datagram is refragmented with its identification kept.
    let v6 = tshark(
        &pod,
        &[
            "-Y",
            "ipv6.fraghdr",
            "-T",
            "fields",
            "-e",
            "ipv6.fraghdr.ident",
        ],
    );
    assert!(
        !v6.trim().is_empty() && v6.lines().all(|i| i == "0x00006006"),
        "IPv6 fragments: {v6:?}"
    );
    // The coalesced TCP left as segments, none of them an IP fragment, carrying all 8000 bytes.
    let tcp = tshark(
        &pod,
        &[
            "-Y",
            "tcp.srcport == 443",
            "-T",
            "fields",
            "-e",
            "tcp.len",
            "-e",
            "ip.flags.mf",
        ],
    );
    let seg: Vec<(usize, &str)> = tcp
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            (f.next().unwrap().parse().unwrap(), f.next().unwrap_or(""))
        })
        .collect();
    assert!(
        seg.len() >= 6,
        "8000 bytes at MTU 1450 need at least 6 segments: {seg:?}"
    );
    assert_eq!(seg.iter().map(|s| s.0).sum::<usize>(), 8000);
    assert!(
        seg.iter().all(|s| s.1 == "0" || s.1 == "False"),
        "no segment is an IP fragment: {seg:?}"
    );
    // Nothing tshark considers malformed or a bad checksum.
    let bad = tshark(
        &pod,
        &[
            // The demo's payloads are patterns, not mDNS: only the IP/UDP/TCP layers matter.
            "--disable-protocol",
            "mdns",
            "-o",
            "tcp.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
            "-o",
            "ip.check_checksum:TRUE",
            "-Y",
            "_ws.malformed || _ws.expert.severity == error",
        ],
    );
    assert!(
        bad.trim().is_empty(),
        "tshark finds errors in pod-a.pcap:\n{bad}"
    );
}

#[test]
fn demo_answers_df_with_fragmentation_needed() {
    let (_dir, out) = demo_dir();
    let up = out.join("uplink.pcap");
    let icmp = tshark(
        &up,
        &[
            "-Y",
            "icmp.type == 3 && icmp.code == 4",
            "-T",
            "fields",
            "-E",
            "occurrence=f",
            "-e",
            "icmp.mtu",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
        ],
    );
    assert_eq!(
        icmp.trim(),
        "1450\t192.168.50.10\t192.168.50.1",
        "fragmentation needed: {icmp:?}"
    );
}

#[test]
fn demo_verdicts_name_every_outcome() {
    let (_dir, out) = demo_dir();
    let v = verdicts(&out);
    let reasons: Vec<&str> = v.iter().filter_map(|l| l["drop_reason"].as_str()).collect();
    for want in [
        "too_big",
        "frag_overlap",
        "frag_first_too_short",
        "ipv4_bad_checksum",
    ] {
        assert!(
            reasons.contains(&want),
            "no packet dropped as {want}: {reasons:?}"
        );
    }
    // The last fragment came first and was held; the key was rebuilt with the ports when
    // the datagram completed.
    assert_eq!(v[0]["verdict"], "held");
    assert_eq!(v[1]["verdict"], "held");
    assert_eq!(v[2]["verdict"], "forwarded");
    let ipf = v[2]["trace"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["stage"] == "ipf")
        .expect("ipf event");
    assert!(
        ipf["detail"]
            .as_str()
            .unwrap()
            .contains("192.168.50.1:40000 -> 10.244.1.5:8080"),
        "rebuilt key: {ipf}"
    );
    // The same event as fields.
    assert_eq!(ipf["event"]["kind"], "ipf_reassembled", "{ipf}");
    assert_eq!(ipf["event"]["key"]["src_port"], 40000, "{ipf}");
    assert_eq!(ipf["event"]["key"]["dst"], "10.244.1.5", "{ipf}");
}

#[test]
fn demo_service_dnat_survives_fragments_both_ways() {
    let (_dir, out) = demo_dir();
    // To the pod: the datagram sent to the Service address arrives for port 5353, whole.
    let pod = tshark(
        &out.join("pod-a.pcap"),
        &[
            "-Y",
            "udp.srcport == 40010",
            "-T",
            "fields",
            "-e",
            "ip.dst",
            "-e",
            "udp.dstport",
            "-e",
            "udp.length",
        ],
    );
    assert_eq!(
        pod.trim(),
        "10.244.1.5\t5353\t4008",
        "DNATed datagram at the pod: {pod:?}"
    );
    // Back to the client: from the Service address, refragmented, whole when reassembled.
    let up = tshark(
        &out.join("uplink.pcap"),
        &[
            "-Y",
            "udp.dstport == 40010",
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "udp.srcport",
            "-e",
            "udp.length",
        ],
    );
    assert_eq!(
        up.trim(),
        "10.96.0.10\t53\t3008",
        "answer at the client: {up:?}"
    );
    let frags = tshark(
        &out.join("uplink.pcap"),
        &["-Y", "ip.id == 0x6363", "-T", "fields", "-e", "ip.len"],
    );
    let lens: Vec<usize> = frags.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(lens.len(), 3, "the answer leaves as 3 fragments: {lens:?}");
    assert!(
        lens.iter().all(|l| *l <= 1444),
        "refragmented to the MRU 1444: {lens:?}"
    );
    let v = verdicts(&out);
    let cts: Vec<(&str, &str)> = v
        .iter()
        .filter_map(|l| Some((l["port"].as_str()?, l["ct"].as_str()?)))
        .collect();
    assert!(
        cts.contains(&("pod-a", "reply")),
        "the answer is in the reply direction: {cts:?}"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn replay_errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = write(
        d,
        "t.yaml",
        "ports:\n  - { name: a, mac: \"02:00:00:00:00:01\" }\n",
    );
    let out = d.join("out");
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--tables".into(),
                d.join("none.yaml").display().to_string(),
                "--in".into(),
                "a=x.pcap".into(),
            ],
            "none.yaml: cannot read",
        ),
        (
            vec![
                "--tables".into(),
                write(d, "bad.yaml", "ports:\n  - { name: a, mac: \"02:00\" }\n")
                    .display()
                    .to_string(),
                "--in".into(),
                "a=x.pcap".into(),
            ],
            "bad.yaml",
        ),
        (
            vec![
                "--tables".into(),
                write(
                    d,
                    "typo.yaml",
                    "ports:\n  - { name: a, mac: \"02:00:00:00:00:01\", mtuu: 9000 }\n",
                )
                .display()
                .to_string(),
                "--in".into(),
                "a=x.pcap".into(),
            ],
            "mtuu",
        ),
        (
            vec![
                "--tables".into(),
                good.display().to_string(),
                "--in".into(),
                "b=x.pcap".into(),
            ],
            "no port \"b\"",
        ),
        (
            vec![
                "--tables".into(),
                good.display().to_string(),
                "--in".into(),
                "a".into(),
            ],
            "expected PORT=FILE",
        ),
        (
            vec![
                "--tables".into(),
                good.display().to_string(),
                "--in".into(),
                format!("a={}", d.join("missing.pcap").display()),
            ],
            "missing.pcap: cannot open",
        ),
        (
            vec![
                "--tables".into(),
                good.display().to_string(),
                "--in".into(),
                format!("a={}", good.display()),
            ],
            "not a pcap",
        ),
    ];
    for (args, want) in cases {
        let mut full = vec!["replay".to_string()];
        full.extend(args);
        full.extend(["--out".to_string(), o.to_string()]);
        let r = ferry(&full.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "ferry {full:?} should fail");
        assert!(
            err.contains(want),
            "ferry {full:?}: error {err:?} does not mention {want:?}"
        );
    }
}
