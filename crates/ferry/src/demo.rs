//! `ferry demo`: the built-in replay demo. It writes a node's tables and captures of the
//! hard cases, replays them through the pipeline, and tells what happened to each packet.

use std::fs;
use std::io::BufRead;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ferry_datapath::Packet;
use ferry_datapath::ipf;
use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::wire::{checksum, parse};

use crate::{pcap, replay};

/// The demo node: an uplink that coalesces TCP (GRO), a pod behind a smaller MTU, and a
/// DNAT rule standing for a Service.
pub const TABLES: &str = r#"# A node with an uplink (MTU 1500, host GRO on) and one pod (MTU 1450).
ports:
  - name: uplink
    mac: "02:fe:00:00:00:01"
    mtu: 1500
    gro: true
    addresses: [192.168.50.10, "fd00:50::10"]
  - name: pod-a
    mac: "02:fe:00:00:00:02"
    mtu: 1450
    addresses: [169.254.1.1, "fe80::1"]
routes:
  - { prefix: 10.244.1.5/32, port: pod-a, next_hop_mac: "0a:58:0a:f4:01:05" }
  - { prefix: "fd00:10:244:1::5/128", port: pod-a, next_hop_mac: "0a:58:0a:f4:01:05" }
  - { prefix: 0.0.0.0/0, port: uplink, next_hop_mac: "02:00:00:00:00:fe" }
  - { prefix: "::/0", port: uplink, next_hop_mac: "02:00:00:00:00:fe" }
nat:
  # A Service: UDP to 10.96.0.10:53 goes to the pod's port 5353.
  - match: { proto: udp, dst: 10.96.0.10/32, dst_port: 53 }
    dnat: "10.244.1.5:5353"
"#;

const SEC: u64 = 1_000_000_000;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("demo address")
}

/// Cuts a whole frame into fragments of at most `max_ip_len` bytes of IP packet.
fn fragments(frame: Vec<u8>, id: u32, max_ip_len: usize) -> Vec<Vec<u8>> {
    let parsed = parse(&frame, 0).expect("demo frame parses");
    let mut pkt = Packet::new(frame, 0, 0);
    pkt.meta.frag_id = id;
    let mut out = Vec::new();
    ipf::refragment(&pkt, &parsed, max_ip_len, &mut out).expect("demo frame fragments");
    out.into_iter().map(|p| p.data).collect()
}

/// One scenario: a title, what to expect, and its input frames.
struct Scenario {
    /// The port the frames arrive on.
    port: &'static str,
    title: &'static str,
    expect: &'static str,
    frames: Vec<Vec<u8>>,
}

/// The addresses of the demo's client and pod, and the IP options of a datagram with
/// IPv4 identification `id`.
struct Ends {
    client: IpAddr,
    pod: IpAddr,
    client6: IpAddr,
    pod6: IpAddr,
}

impl Ends {
    fn new() -> Ends {
        Ends {
            client: ip("192.168.50.1"),
            pod: ip("10.244.1.5"),
            client6: ip("fd00:50::1"),
            pod6: ip("fd00:10:244:1::5"),
        }
    }

    /// Each datagram its own IPv4 identification (kept through reassembly and
    /// refragmentation); IPv6 carries it in the fragment header instead.
    fn opts(id: u16, dont_fragment: bool) -> IpOpts {
        IpOpts {
            dst_mac: [0x02, 0xfe, 0, 0, 0, 1],
            id,
            dont_fragment,
            ..IpOpts::default()
        }
    }
}

fn scenarios() -> Vec<Scenario> {
    let mut v = reassembly();
    v.extend(refusals());
    v.extend(service());
    v
}

/// Fragments reassembled and refragmented, a coalesced TCP packet segmented, and DF meeting a smaller MTU.
fn reassembly() -> Vec<Scenario> {
    let Ends {
        client,
        pod,
        client6,
        pod6,
    } = Ends::new();
    let o = Ends::opts;
    let mut v = Vec::new();

    let mut f = fragments(
        build::udp(
            client,
            pod,
            40000,
            8080,
            &build::pattern(4000, 1),
            &o(0x4242, false),
        ),
        0x4242,
        1500,
    );
    f.reverse();
    v.push(Scenario {
        port: "uplink",
        title: "IPv4 UDP, 4000 bytes in 3 fragments of 1500, last fragment first",
        expect: "held until complete; the key is rebuilt with the real ports (40000 -> 8080) although the \
                 last fragment carries none; refragmented to min(MRU 1500, pod MTU 1450)",
        frames: f,
    });

    let f = fragments(
        build::udp(
            client6,
            pod6,
            40001,
            8080,
            &build::pattern(3000, 2),
            &o(0, false),
        ),
        0x6006,
        1280,
    );
    v.push(Scenario {
        port: "uplink",
        title: "IPv6 UDP, 3000 bytes in fragments of 1280, middle first",
        expect: "reassembled, then refragmented to the MRU with a fragment header keeping identification \
                 0x6006 (IPv6 is never fragmented further in transit: fragments larger than the egress \
                 MTU would get \"packet too big\")",
        frames: vec![f[1].clone(), f[0].clone(), f[2].clone()],
    });

    let gro = build::tcp(
        client,
        pod,
        443,
        34567,
        1_000_000,
        1,
        tcp_flags::ACK | tcp_flags::PSH,
        &build::pattern(8000, 3),
        &o(0x3000, true),
    );
    v.push(Scenario {
        port: "uplink",
        title: "TCP, 8000 bytes coalesced by the uplink's GRO into one super-packet",
        expect: "segmented into TCP segments that fit the pod's MTU: never IP fragments",
        frames: vec![gro],
    });

    // A plain (not coalesced) 1500-byte IPv4 packet with DF set.
    let df = build::udp(
        client,
        pod,
        40002,
        8080,
        &build::pattern(1472, 5),
        &o(0x4000, true),
    );
    v.push(Scenario {
        port: "uplink",
        title: "IPv4 UDP of 1500 bytes with DF to the pod (MTU 1450)",
        expect: "dropped as too_big; an ICMP \"fragmentation needed\" with MTU 1450 goes back out the uplink",
        frames: vec![df],
    });

    v
}

/// What is refused: overlapping and tiny fragments, a bad checksum, a datagram that never completes.
fn refusals() -> Vec<Scenario> {
    let Ends { client, pod, .. } = Ends::new();
    let o = Ends::opts;
    let mut v = Vec::new();
    let mut f = fragments(
        build::udp(
            client,
            pod,
            40003,
            8080,
            &build::pattern(2000, 6),
            &o(0x0bad, false),
        ),
        0x0bad,
        1500,
    );
    // Move the second fragment 8 bytes back so that it overlaps the first.
    let second = &mut f[1];
    let off = u16::from_be_bytes([second[20], second[21]]);
    second[20..22].copy_from_slice(&(off - 1).to_be_bytes());
    checksum::set_ipv4_header(&mut second[14..34]);
    v.push(Scenario {
        port: "uplink",
        title: "IPv4 fragments that overlap (an evasion attempt)",
        expect: "the whole datagram is dropped: frag_overlap",
        frames: f,
    });

    let tiny = fragments(
        build::tcp(
            client,
            pod,
            1234,
            80,
            1,
            0,
            tcp_flags::SYN,
            &build::pattern(1600, 7),
            &o(0x7777, false),
        ),
        0x7777,
        1500,
    );
    // Cut a first fragment that holds only 8 bytes of the TCP header (RFC 1858).
    let mut first = tiny[0][..14 + 20 + 8].to_vec();
    first[16..18].copy_from_slice(&28u16.to_be_bytes());
    checksum::set_ipv4_header(&mut first[14..34]);
    v.push(Scenario {
        port: "uplink",
        title: "A tiny first TCP fragment that hides the ports and flags",
        expect: "refused: frag_first_too_short",
        frames: vec![first],
    });

    let mut bad = build::udp(client, pod, 40004, 8080, b"hello", &o(0x8000, false));
    bad[24] ^= 0x5a;
    v.push(Scenario {
        port: "uplink",
        title: "A frame with a corrupt IPv4 header checksum",
        expect: "dropped with a reason, never a panic: ipv4_bad_checksum",
        frames: vec![bad],
    });

    let lone = fragments(
        build::udp(
            client,
            pod,
            40005,
            8080,
            &build::pattern(3000, 8),
            &o(0x1010, false),
        ),
        0x1010,
        1500,
    );
    v.push(Scenario {
        port: "uplink",
        title: "A first fragment whose datagram never completes",
        expect: "held, then expired after the 30 s fragment timeout (counted as frag_expired)",
        frames: vec![lone[0].clone()],
    });

    v
}

/// A Service reached by fragments, the fragmented answer translated back, and a ping after the fragment timeout.
fn service() -> Vec<Scenario> {
    let Ends { client, pod, .. } = Ends::new();
    let o = Ends::opts;
    let mut v = Vec::new();
    let vip = ip("10.96.0.10");
    let mut f = fragments(
        build::udp(
            client,
            vip,
            40010,
            53,
            &build::pattern(4000, 10),
            &o(0x5353, false),
        ),
        0x5353,
        1500,
    );
    f.reverse();
    v.push(Scenario {
        port: "uplink",
        title: "IPv4 UDP to a Service address (DNAT), 4000 bytes in 3 fragments, last first",
        expect: "reassembled, key rebuilt (40010 -> 53), a new connection DNATed to the pod's port 5353, \
                 refragmented for the pod",
        frames: f,
    });
    let pod_o = IpOpts {
        dst_mac: [0x02, 0xfe, 0, 0, 0, 2],
        ..o(0x6363, false)
    };
    let answer = fragments(
        build::udp(pod, client, 5353, 40010, &build::pattern(3000, 11), &pod_o),
        0x6363,
        1450,
    );
    v.push(Scenario {
        port: "pod-a",
        title: "The pod's 3000-byte answer, in fragments of 1450 (arriving on pod-a)",
        expect: "reassembled; conntrack finds the reply direction and undoes the DNAT (source 10.96.0.10:53); \
                 refragmented to its MRU (the largest fragment received, 1444 bytes) although the uplink takes 1500",
        frames: answer,
    });

    let ping = build::echo_request(client, pod, 9, 1, &build::pattern(56, 9), &o(0x9000, false));
    v.push(Scenario {
        port: "uplink",
        title: "A ping 40 s later",
        expect: "forwarded; the pipeline clock (pcap time) has passed the fragment timeout",
        frames: vec![ping],
    });
    v
}

/// Runs the demo, in `dir` or a temporary directory.
pub fn run(dir: Option<PathBuf>) -> Result<()> {
    let (dir, keep) = match dir {
        Some(d) => (d, true),
        None => (
            std::env::temp_dir().join(format!("ferry-demo-{}", std::process::id())),
            false,
        ),
    };
    fs::create_dir_all(&dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let r = run_in(&dir);
    if !keep {
        let _ = fs::remove_dir_all(&dir);
    }
    r
}

fn run_in(dir: &Path) -> Result<()> {
    let tables_path = dir.join("tables.yaml");
    fs::write(&tables_path, TABLES)
        .with_context(|| format!("{}: cannot write", tables_path.display()))?;
    let scenarios = scenarios();
    let ports = ["uplink", "pod-a"];
    let mut writers = Vec::new();
    let mut inputs = Vec::new();
    for port in ports {
        let path = dir.join(format!("{port}-in.pcap"));
        writers.push(pcap::Writer::create(&path)?);
        inputs.push(format!("{port}={}", path.display()));
    }
    // Frames get increasing times in scenario order, so the verdicts come in that order.
    let mut owner = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let base = if i + 1 == scenarios.len() {
            48 * SEC
        } else {
            (i as u64 + 1) * SEC
        };
        let w = ports
            .iter()
            .position(|p| *p == s.port)
            .context("demo port")?;
        for (j, f) in s.frames.iter().enumerate() {
            writers[w].write(base + j as u64 * 1_000_000, f)?;
            owner.push(i);
        }
    }
    for w in writers {
        w.finish()?;
    }

    let out = dir.join("out");
    let args = replay::Args {
        tables: Some(tables_path),
        cluster: None,
        node: None,
        inputs,
        out: out.clone(),
    };
    let summary = replay::run(&args)?;

    println!(
        "ferry demo: one node, uplink MTU 1500 (GRO on), pod-a MTU 1450, a Service 10.96.0.10:53 -> pod-a:5353\n"
    );
    let verdicts = fs::File::open(out.join("verdicts.jsonl")).context("verdicts.jsonl")?;
    let mut lines = std::io::BufReader::new(verdicts).lines();
    let mut current = usize::MAX;
    for &i in &owner {
        let line = lines.next().context("verdicts.jsonl ends early")??;
        let v: serde_json::Value = serde_json::from_str(&line)?;
        if i != current {
            current = i;
            println!(
                "== {}\n   expect: {}",
                scenarios[i].title, scenarios[i].expect
            );
        }
        let outputs: Vec<String> = v["outputs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| format!("{} x{}", o["port"].as_str().unwrap_or("?"), o["packets"]))
            .collect();
        let reason = v["drop_reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let outs = if outputs.is_empty() {
            String::new()
        } else {
            format!(" -> {}", outputs.join(", "))
        };
        println!(
            "   {} packet {}: {}{reason}{outs}",
            v["port"].as_str().unwrap_or("?"),
            v["index"],
            v["verdict"].as_str().unwrap_or("?")
        );
        for e in v["trace"].as_array().into_iter().flatten() {
            if e["stage"] != "parse" {
                println!(
                    "      {:<8} {}",
                    e["stage"].as_str().unwrap_or(""),
                    e["detail"].as_str().unwrap_or("")
                );
            }
        }
    }
    println!();
    print!("{}", summary.render());
    println!("\nTo keep the files: ferry demo --dir DIR; then e.g. tshark -r DIR/out/pod-a.pcap");
    Ok(())
}
