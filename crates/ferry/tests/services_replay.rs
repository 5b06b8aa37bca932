//! Service semantics replayed from pcap files through the tables `ferry replay` compiles
//! from the example cluster (examples/cluster) with Services added: each first packet
//! is balanced or dropped with its reason, and the trace's service stage says why.
//! Needs nothing but the binary.

mod common;

use std::process::Command;

/// A LoadBalancer Service whose load balancer IP 203.0.113.50 only 198.51.100.0/24 may
/// reach (one range written with spaces and host bits, as the API lets it), with the
/// web pod 10.244.1.5 of node-a as its endpoint; its external IP 203.0.113.60 is not
/// restricted.
const LB: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: lb, namespace: default }
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.40
  externalIPs: [203.0.113.60]
  ports: [{ name: http, port: 80, targetPort: 8080, nodePort: 30040 }]
  loadBalancerSourceRanges: [" 198.51.100.7/24 "]
status:
  loadBalancer:
    ingress: [{ ip: 203.0.113.50 }]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: default
  labels: { kubernetes.io/service-name: lb }
addressType: IPv4
ports: [{ name: http, port: 8080, protocol: TCP }]
endpoints:
- addresses: [10.244.1.5]
  conditions: { ready: true }
  nodeName: node-a
"#;

/// node-a's uplink MAC, derived from its address 192.168.10.2.
const UPLINK_MAC: [u8; 6] = [0x02, 0xfe, 192, 168, 10, 2];

/// A SYN from `src` outside the cluster, arriving on the uplink, to `dst`:`port`.
fn syn(src: [u8; 4], dst: [u8; 4], port: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2([0x02, 0, 0, 0, 0, 0x01], UPLINK_MAC)
        .ipv4(src, dst, 64)
        .tcp(40000 + port % 1000, port, 1, 65535)
        .syn()
        .write(&mut f, &[])
        .unwrap();
    f
}

/// Replays `frames` (received on node-a's uplink, one a second) through node-a of the
/// example cluster with `extra`; the verdicts, in order.
fn replay(extra: &str, frames: &[Vec<u8>]) -> Vec<serde_json::Value> {
    common::replay::replay(extra, "uplink", frames)
}

/// The details of the trace's service stage.
fn service(v: &serde_json::Value) -> Vec<String> {
    common::replay::stage(v, "service")
}

#[test]
fn load_balancer_source_ranges_let_in_their_sources_and_drop_the_others() {
    let lb_ip = [203, 0, 113, 50];
    let v = replay(
        LB,
        &[
            // In the range: balanced to the web pod.
            syn([198, 51, 100, 9], lb_ip, 80),
            // Outside: dropped, nothing sent back.
            syn([192, 0, 2, 9], lb_ip, 80),
            // The same source to the external IP and the node port: not restricted.
            syn([192, 0, 2, 9], [203, 0, 113, 60], 80),
            syn([192, 0, 2, 9], [192, 168, 10, 2], 30040),
        ],
    );
    assert_eq!(v.len(), 4);
    assert_eq!(v[0]["verdict"], "forwarded", "{}", v[0]);
    assert_eq!(
        v[0]["outputs"][0]["port"], "pod.default.web-7c9d8f6b5-4xk2p",
        "{}",
        v[0]
    );
    assert_eq!(v[1]["drop_reason"], "service_source_denied", "{}", v[1]);
    assert!(v[1]["outputs"].as_array().unwrap().is_empty(), "{}", v[1]);
    let why = service(&v[1]);
    assert!(
        why.iter().any(|d| d.starts_with("default/lb:http:")
            && d.contains("192.0.2.9")
            && d.ends_with("its source is in none of the Service's loadBalancerSourceRanges")),
        "{why:?}"
    );
    for w in &v[2..] {
        assert_eq!(
            w["outputs"][0]["port"], "pod.default.web-7c9d8f6b5-4xk2p",
            "{w}"
        );
    }
}

#[test]
fn a_bad_source_range_refuses_the_cluster_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let c = common::replay::cluster(dir.path(), &LB.replace("198.51.100.7/24", "198.51.100.7"));
    let run = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["tables", "--cluster"])
        .arg(&c)
        .args(["--node", "node-a"])
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("extra.yaml")
            && err.contains("Service default/lb")
            && err.contains("spec.loadBalancerSourceRanges[0]")
            && err.contains("is not a CIDR"),
        "{err}"
    );
}
