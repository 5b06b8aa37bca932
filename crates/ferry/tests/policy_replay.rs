//! NetworkPolicy verdicts replayed from pcap files through the tables `ferry replay`
//! compiles from the example cluster (examples/cluster) with three policies added: each
//! first packet is allowed or dropped with `policy_denied`, and the trace's policy stage
//! names what decided. SCTP is here, not in the lab's suite: this kernel has no SCTP
//! sockets to probe with. Needs nothing but the binary.

mod common;

/// Ingress to sticky pods from web pods on the named port `http` (9376 on sticky-0).
const STICKY_FROM_WEB: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: sticky-from-web, namespace: default }
spec:
  podSelector: { matchLabels: { app: sticky } }
  ingress:
  - from: [{ podSelector: { matchLabels: { app: web } } }]
    ports: [{ port: http }]
";

/// Egress of web pods to sticky pods only, and to UDP 53 anywhere.
const WEB_EGRESS: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-egress, namespace: default }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [Egress]
  egress:
  - to: [{ podSelector: { matchLabels: { app: sticky } } }]
  - ports: [{ protocol: UDP, port: 53 }]
";

/// Ingress to sticky pods from web pods on SCTP 9999: SCTP is matched by port.
const STICKY_SCTP: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: sticky-sctp, namespace: default }
spec:
  podSelector: { matchLabels: { app: sticky } }
  ingress:
  - from: [{ podSelector: { matchLabels: { app: web } } }]
    ports: [{ protocol: SCTP, port: 9999 }]
";

const WEB: &str = "pod.default.web-7c9d8f6b5-4xk2p";
const WEB_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05];
const WEB_IP: [u8; 4] = [10, 244, 1, 5];

fn tcp_syn(dst: [u8; 4], port: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(WEB_MAC, [0xee; 6])
        .ipv4(WEB_IP, dst, 64)
        .tcp(40000 + port, port, 1, 65535)
        .syn()
        .write(&mut f, &[])
        .unwrap();
    f
}

fn udp(dst: [u8; 4], port: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(WEB_MAC, [0xee; 6])
        .ipv4(WEB_IP, dst, 64)
        .udp(41000, port)
        .write(&mut f, b"q")
        .unwrap();
    f
}

/// An SCTP packet with an INIT chunk, its CRC32c right (conntrack checks it on the
/// chunks that start or change an association).
fn sctp_init(dst: [u8; 4], port: u16) -> Vec<u8> {
    use ferry_datapath::wire::sctp;
    let l4 = sctp::build(
        42000,
        port,
        0,
        &[(sctp::chunk::INIT, 0, &sctp::init_value(7))],
    );
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(WEB_MAC, [0xee; 6])
        .ipv4(WEB_IP, dst, 64)
        .write(&mut f, etherparse::IpNumber(132), &l4)
        .unwrap();
    f
}

/// Replays `frames` (received on the web pod's port, one a second) through node-a with
/// the three policies; the verdicts, in order.
fn replay(frames: &[Vec<u8>]) -> Vec<serde_json::Value> {
    let policies = format!("{STICKY_FROM_WEB}---{WEB_EGRESS}---{STICKY_SCTP}");
    common::replay::replay(&policies, WEB, frames)
}

/// The details of the trace's policy stage.
fn policy(v: &serde_json::Value) -> Vec<String> {
    common::replay::stage(v, "policy")
}

#[test]
fn first_packets_are_allowed_or_denied_as_the_policies_say_and_the_trace_names_why() {
    let sticky0 = [10, 244, 1, 7];
    let other_web = [10, 244, 1, 6];
    let v = replay(&[
        // To sticky-0 on its named port: egress rule 0, ingress rule 0.
        tcp_syn(sticky0, 9376),
        // On another port: the egress allows it, sticky-from-web does not.
        tcp_syn(sticky0, 80),
        // Through the sticky Service's cluster IP: decided on sticky-0:9376.
        tcp_syn([10, 96, 0, 13], 80),
        // To another web pod: web-egress isolates the source and allows it not.
        tcp_syn(other_web, 8080),
        // DNS anywhere: egress rule 1.
        udp([10, 96, 0, 53], 53),
        // SCTP to sticky-0: 9999 is sticky-sctp's; 9376 is named `http` for TCP only.
        sctp_init(sticky0, 9999),
        sctp_init(sticky0, 9376),
    ]);
    assert_eq!(v.len(), 7);

    assert_eq!(v[0]["verdict"], "forwarded", "{}", v[0]);
    assert_eq!(v[0]["outputs"][0]["port"], "pod.default.sticky-0");
    let p = policy(&v[0]);
    assert!(
        p.iter().any(|d| d.starts_with("egress from")
            && d.ends_with("allowed by NetworkPolicy default/web-egress egress[0]")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|d| d.starts_with("ingress to pod.default.sticky-0")
                && d.ends_with("allowed by NetworkPolicy default/sticky-from-web ingress[0]")),
        "{p:?}"
    );

    assert_eq!(v[1]["drop_reason"], "policy_denied", "{}", v[1]);
    assert!(v[1]["outputs"].as_array().unwrap().is_empty());
    assert!(
        policy(&v[1]).iter().any(|d| d.contains(
            "denied: isolated by NetworkPolicy default/sticky-from-web, NetworkPolicy default/sticky-sctp, and no rule of theirs matched"
        )),
        "{:?}",
        policy(&v[1])
    );

    assert_eq!(
        v[2]["outputs"][0]["port"], "pod.default.sticky-0",
        "{}",
        v[2]
    );
    assert!(
        policy(&v[2])
            .iter()
            .any(|d| d.contains("sticky-from-web ingress[0]")),
        "{:?}",
        policy(&v[2])
    );

    assert_eq!(v[3]["drop_reason"], "policy_denied", "{}", v[3]);
    assert!(
        policy(&v[3]).iter().any(|d| d.starts_with("egress from")
            && d.contains(
                "(peer 10.244.1.6): denied: isolated by NetworkPolicy default/web-egress"
            )),
        "{:?}",
        policy(&v[3])
    );

    assert_ne!(v[4]["drop_reason"], "policy_denied", "{}", v[4]);
    assert!(
        policy(&v[4])
            .iter()
            .any(|d| d.ends_with("allowed by NetworkPolicy default/web-egress egress[1]")),
        "{:?}",
        policy(&v[4])
    );

    assert_eq!(
        v[5]["outputs"][0]["port"], "pod.default.sticky-0",
        "{}",
        v[5]
    );
    assert!(
        policy(&v[5])
            .iter()
            .any(|d| d.ends_with("allowed by NetworkPolicy default/sticky-sctp ingress[0]")),
        "{:?}",
        policy(&v[5])
    );
    assert_eq!(v[6]["drop_reason"], "policy_denied", "{}", v[6]);
}
