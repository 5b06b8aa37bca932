use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::fields::PodFields;

fn np(yaml: &str) -> NetworkPolicy {
    serde_saphyr::from_str(yaml).expect("test NetworkPolicy parses")
}

fn cnp(yaml: &str) -> ClusterNetworkPolicy {
    serde_saphyr::from_str(yaml).expect("test ClusterNetworkPolicy parses")
}

fn fields_of(errors: Vec<FieldError>) -> Vec<String> {
    errors.into_iter().map(|e| e.field).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const HEAD: &str =
    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n";

#[test]
fn policy_types_default_to_ingress_and_to_egress_when_it_has_rules() {
    let f =
        NetworkPolicyFields::parse(&np(&format!("{HEAD}spec: {{podSelector: {{}}}}\n"))).unwrap();
    assert_eq!(
        f.ingress,
        Some(vec![]),
        "isolated for ingress, nothing allowed"
    );
    assert_eq!(f.egress, None);
    assert!(f.pod_selector.is_empty());
    assert_eq!(f.namespace, "x");

    let f = NetworkPolicyFields::parse(&np(&format!(
        "{HEAD}spec: {{podSelector: {{}}, egress: [{{}}]}}\n"
    )))
    .unwrap();
    assert_eq!(f.ingress, Some(vec![]));
    assert_eq!(f.egress, Some(vec![NetworkPolicyRule::default()]));

    // An empty egress list is no rule: the default leaves Egress out.
    let f = NetworkPolicyFields::parse(&np(&format!(
        "{HEAD}spec: {{podSelector: {{}}, egress: []}}\n"
    )))
    .unwrap();
    assert_eq!(f.egress, None);

    // Given types win: ingress rules of an Egress-only policy are ignored.
    let f = NetworkPolicyFields::parse(&np(&format!(
        "{HEAD}spec: {{podSelector: {{}}, policyTypes: [Egress], ingress: [{{}}]}}\n"
    )))
    .unwrap();
    assert_eq!(f.ingress, None);
    assert_eq!(f.egress, Some(vec![]));
}

#[test]
fn unknown_policy_types_are_refused() {
    let errs = fields_of(
        NetworkPolicyFields::parse(&np(&format!(
            "{HEAD}spec: {{podSelector: {{}}, policyTypes: [Ingress, ingress]}}\n"
        )))
        .unwrap_err(),
    );
    assert_eq!(errs, ["spec.policyTypes[1]"]);
    let errs = fields_of(
        NetworkPolicyFields::parse(&np(&format!(
            "{HEAD}spec: {{podSelector: {{}}, policyTypes: [Ingress, Egress, Ingress]}}\n"
        )))
        .unwrap_err(),
    );
    assert_eq!(errs, ["spec.policyTypes"]);
}

#[test]
fn peers_pods_in_own_or_selected_namespaces_and_ip_blocks() {
    let f = NetworkPolicyFields::parse(&np(&format!(
        r#"{HEAD}spec:
  podSelector: {{matchLabels: {{app: db}}}}
  ingress:
  - from:
    - podSelector: {{matchLabels: {{app: web}}}}
    - namespaceSelector: {{matchLabels: {{team: a}}}}
    - namespaceSelector: {{}}
      podSelector: {{matchLabels: {{app: web}}}}
    - ipBlock: {{cidr: 10.0.0.1/8, except: [10.1.0.0/16]}}
    - ipBlock: {{cidr: "fd00::/64"}}
    ports:
    - port: 5432
    - {{protocol: UDP, port: 53, endPort: 60}}
    - {{protocol: SCTP}}
    - {{port: db}}
"#
    )))
    .unwrap();
    let rule = &f.ingress.as_ref().unwrap()[0];
    let peers = rule.peers.as_ref().unwrap();
    let web = Selector {
        match_labels: labels(&[("app", "web")]),
        ..Selector::default()
    };
    assert_eq!(
        peers[0],
        Peer::Pods {
            namespaces: Namespaces::Own("x".into()),
            pods: web.clone()
        }
    );
    let Peer::Pods {
        namespaces: Namespaces::Selected(team),
        pods,
    } = &peers[1]
    else {
        panic!("{:?}", peers[1]);
    };
    assert!(pods.is_empty(), "no podSelector: every pod");
    assert!(team.matches(&labels(&[("team", "a")])));
    assert_eq!(
        peers[2],
        Peer::Pods {
            namespaces: Namespaces::Selected(Selector::everything()),
            pods: web
        }
    );
    let Peer::IpBlock(b) = &peers[3] else {
        panic!()
    };
    assert_eq!(b.cidr.to_string(), "10.0.0.0/8", "host bits cleared");
    assert!(b.contains("10.2.0.1".parse().unwrap()));
    assert!(!b.contains("10.1.0.1".parse().unwrap()));
    let Peer::IpBlock(b) = &peers[4] else {
        panic!()
    };
    assert!(b.contains("fd00::5".parse().unwrap()));
    assert_eq!(
        rule.ports.as_ref().unwrap(),
        &[
            PolicyPort::Range {
                protocol: Protocol::Tcp,
                first: 5432,
                last: 5432
            },
            PolicyPort::Range {
                protocol: Protocol::Udp,
                first: 53,
                last: 60
            },
            PolicyPort::All(Protocol::Sctp),
            PolicyPort::Named {
                protocol: Some(Protocol::Tcp),
                name: "db".into()
            },
        ]
    );
}

#[test]
fn empty_from_and_ports_mean_every_peer_and_port() {
    let f = NetworkPolicyFields::parse(&np(&format!(
        "{HEAD}spec: {{podSelector: {{}}, ingress: [{{from: [], ports: []}}]}}\n"
    )))
    .unwrap();
    assert_eq!(f.ingress.unwrap(), [NetworkPolicyRule::default()]);
}

#[test]
fn bad_peers_cidrs_and_ports_are_named() {
    let errs = fields_of(
        NetworkPolicyFields::parse(&np(&format!(
            r#"{HEAD}spec:
  podSelector: {{matchExpressions: [{{key: app, operator: Maybe}}]}}
  ingress:
  - from:
    - {{}}
    - ipBlock: {{cidr: 10.0.0.0/8}}
      podSelector: {{}}
    - ipBlock: {{cidr: 10.0.0.0/33}}
    - ipBlock: {{cidr: 10.0.0.0/8, except: [10.0.0.0/8, 192.168.0.0/16, "fd00::/8", nope]}}
    - podSelector: {{matchExpressions: [{{key: a, operator: In}}]}}
  egress:
  - to:
    - namespaceSelector: {{matchLabels: {{"x y": z}}}}
    ports:
    - {{protocol: ICMP}}
    - {{port: 0}}
    - {{port: 80, endPort: 79}}
    - {{port: http, endPort: 90}}
    - {{endPort: 90}}
    - {{port: HTTP}}
    - {{port: 80, endPort: 70000}}
"#
        )))
        .unwrap_err(),
    );
    assert_eq!(
        errs,
        [
            "spec.podSelector.matchExpressions[0].operator",
            "spec.ingress[0].from[0]",
            "spec.ingress[0].from[1]",
            "spec.ingress[0].from[2].ipBlock.cidr",
            "spec.ingress[0].from[3].ipBlock.except[0]",
            "spec.ingress[0].from[3].ipBlock.except[1]",
            "spec.ingress[0].from[3].ipBlock.except[2]",
            "spec.ingress[0].from[3].ipBlock.except[3]",
            "spec.ingress[0].from[4].podSelector.matchExpressions[0].values",
            "spec.egress[0].to[0].namespaceSelector.matchLabels[x y]",
            "spec.egress[0].ports[0].protocol",
            "spec.egress[0].ports[1].port",
            "spec.egress[0].ports[2].endPort",
            "spec.egress[0].ports[3].endPort",
            "spec.egress[0].ports[4].endPort",
            "spec.egress[0].ports[5].port",
            "spec.egress[0].ports[6].endPort",
        ]
    );
}

#[test]
fn a_policy_without_spec_isolates_its_namespace_for_ingress() {
    let f = NetworkPolicyFields::parse(&np(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\n",
    ))
    .unwrap();
    assert_eq!(f.namespace, "default");
    assert_eq!(f.ingress, Some(vec![]));
    assert_eq!(f.egress, None);
}

#[test]
fn a_namespace_always_has_its_name_label() {
    let ns: Namespace = serde_saphyr::from_str(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {team: a, kubernetes.io/metadata.name: y}}\n",
    )
    .unwrap();
    let f = NamespaceFields::parse(&ns).unwrap();
    assert_eq!(
        f.labels,
        labels(&[("kubernetes.io/metadata.name", "x"), ("team", "a")])
    );
}

#[test]
fn named_ports_mean_the_pods_own_numbers_and_protocols() {
    let pod: Pod = serde_saphyr::from_str(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x}
spec:
  containers:
  - name: c
    ports:
    - {name: serve-80, containerPort: 80}
    - {name: dns, containerPort: 53, protocol: UDP}
    - {containerPort: 9090}
  - name: d
    ports: [{name: serve-80, containerPort: 8080}]
  initContainers:
  - {name: side, restartPolicy: Always, ports: [{name: metrics, containerPort: 9100}]}
  - {name: init, ports: [{name: setup, containerPort: 7000}]}
"#,
    )
    .unwrap();
    let named = PodFields::parse(&pod).unwrap().named_ports;
    assert_eq!(
        named,
        BTreeMap::from([
            ("dns".to_string(), (Protocol::Udp, 53)),
            ("metrics".to_string(), (Protocol::Tcp, 9100)),
            ("serve-80".to_string(), (Protocol::Tcp, 80)),
        ])
    );
    let tcp = |name: &str| PolicyPort::Named {
        protocol: Some(Protocol::Tcp),
        name: name.into(),
    };
    assert!(tcp("serve-80").matches(Protocol::Tcp, 80, &named));
    assert!(!tcp("serve-80").matches(Protocol::Tcp, 8080, &named));
    assert!(!tcp("dns").matches(Protocol::Udp, 53, &named), "a UDP port");
    let any = PolicyPort::Named {
        protocol: None,
        name: "dns".into(),
    };
    assert!(any.matches(Protocol::Udp, 53, &named));
    assert!(!any.matches(Protocol::Udp, 53, &BTreeMap::new()));
}

#[test]
fn bad_container_ports_are_refused() {
    let pod: Pod = serde_saphyr::from_str(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: a}
spec:
  containers:
  - name: c
    ports:
    - {name: Web, containerPort: 80}
    - {name: ok, containerPort: 0}
    - {name: dup, containerPort: 81}
    - {name: dup, containerPort: 82}
    - {containerPort: 83, protocol: ICMP}
"#,
    )
    .unwrap();
    let errs = fields_of(PodFields::parse(&pod).unwrap_err());
    assert_eq!(
        errs,
        [
            "spec.containers[0].ports[0].name",
            "spec.containers[0].ports[1].containerPort",
            "spec.containers[0].ports[3].name",
            "spec.containers[0].ports[4].protocol",
        ]
    );
}

#[test]
fn port_matches_by_protocol_and_range() {
    let none = BTreeMap::new();
    let range = PolicyPort::Range {
        protocol: Protocol::Sctp,
        first: 80,
        last: 90,
    };
    assert!(range.matches(Protocol::Sctp, 85, &none));
    assert!(!range.matches(Protocol::Tcp, 85, &none));
    assert!(!range.matches(Protocol::Sctp, 91, &none));
    assert!(PolicyPort::All(Protocol::Udp).matches(Protocol::Udp, 1, &none));
}

const CNP: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c}
spec:
  tier: Admin
  priority: 15
  subject:
    pods:
      namespaceSelector: {matchLabels: {conformance-house: gryffindor}}
      podSelector: {matchLabels: {conformance-house: gryffindor}}
  ingress:
  - name: from-ravenclaw
    action: Accept
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: ravenclaw}}
    protocols:
    - tcp: {destinationPort: {number: 80}}
    - udp: {destinationPort: {range: {start: 53, end: 60}}}
    - destinationNamedPort: web
  egress:
  - action: Pass
    to:
    - pods: {podSelector: {}}
  - action: Deny
    to:
    - networks: [0.0.0.0/0, "::/0"]
    - nodes: {matchLabels: {kubernetes.io/os: linux}}
    protocols:
    - sctp: {destinationPort: {number: 9003}}
"#;

#[test]
fn a_cluster_policy_reads_as_the_api_defines_it() {
    let f = ClusterNetworkPolicyFields::parse(&cnp(CNP)).unwrap();
    assert_eq!((f.tier, f.priority), (Tier::Admin, 15));
    assert!(
        f.subject
            .namespaces
            .matches(&labels(&[("conformance-house", "gryffindor")]))
    );
    let r = &f.ingress[0];
    assert_eq!(
        (r.index, r.name.as_str(), r.action),
        (0, "from-ravenclaw", Action::Accept)
    );
    let ClusterPeer::Pods(set) = &r.peers[0] else {
        panic!()
    };
    assert!(set.pods.is_empty());
    assert_eq!(
        r.ports.as_ref().unwrap(),
        &[
            PolicyPort::Range {
                protocol: Protocol::Tcp,
                first: 80,
                last: 80
            },
            PolicyPort::Range {
                protocol: Protocol::Udp,
                first: 53,
                last: 60
            },
            PolicyPort::Named {
                protocol: None,
                name: "web".into()
            },
        ]
    );
    assert_eq!(f.egress[0].action, Action::Pass);
    assert_eq!(
        f.egress[0].peers,
        [ClusterPeer::Pods(PodSet {
            namespaces: Selector::everything(),
            pods: Selector::everything()
        })]
    );
    assert_eq!(f.egress[0].ports, None, "every port");
    let d = &f.egress[1];
    assert_eq!(
        d.peers[0],
        ClusterPeer::Networks(vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()])
    );
    assert!(matches!(&d.peers[1], ClusterPeer::Nodes(s) if !s.is_empty()));
    assert!(f.warnings.is_empty());
}

#[test]
fn cluster_policy_schema_rules_are_enforced_with_the_field_named() {
    let bad = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c}
spec:
  tier: Developer
  priority: 1001
  subject: {namespaces: {}, pods: {podSelector: {}}}
  ingress:
  - {action: Allow, from: [{namespaces: {}}]}
  - {action: Deny, from: []}
  - {action: Deny}
  - action: Deny
    from: [{pods: {namespaceSelector: {}}}, {namespaces: {}, pods: {podSelector: {}}}]
  egress:
  - action: Accept
    to: [{domainNames: [example.com]}]
  - action: Deny
    to: [{networks: [10.0.0.0/40]}, {networks: []}]
    protocols:
    - tcp: {destinationPort: {number: 0}}
    - udp: {destinationPort: {range: {start: 90, end: 90}}}
    - sctp: {}
    - {tcp: {destinationPort: {number: 1}}, udp: {destinationPort: {number: 1}}}
    - destinationNamedPort: "-x"
    - tcp: {destinationPort: {number: 1, range: {start: 1, end: 2}}}
  - action: Accept
    to: [{networks: [10.0.0.0/8]}]
    protocols: [{destinationNamedPort: web}]
  - name: NAME
    action: Pass
    to: [{namespaces: {}}]
    protocols: []
"#
    .replace("NAME", &"n".repeat(101));
    let errs = fields_of(ClusterNetworkPolicyFields::parse(&cnp(&bad)).unwrap_err());
    assert_eq!(
        errs,
        [
            "spec.tier",
            "spec.priority",
            "spec.subject",
            "spec.ingress[0].action",
            "spec.ingress[1].from",
            "spec.ingress[2].from",
            "spec.ingress[3].from[0].pods.podSelector",
            "spec.ingress[3].from[1]",
            "spec.egress[0].to[0].domainNames",
            "spec.egress[1].to[0].networks[0]",
            "spec.egress[1].to[1].networks",
            "spec.egress[1].protocols[0].tcp.destinationPort.number",
            "spec.egress[1].protocols[1].udp.destinationPort.range",
            "spec.egress[1].protocols[2].sctp.destinationPort",
            "spec.egress[1].protocols[3]",
            "spec.egress[1].protocols[4].destinationNamedPort",
            "spec.egress[1].protocols[5].tcp.destinationPort",
            "spec.egress[2].protocols[0].destinationNamedPort",
            "spec.egress[3].name",
            "spec.egress[3].protocols",
        ]
    );
}

#[test]
fn required_cluster_policy_fields_and_the_rule_limit() {
    let errs = fields_of(
        ClusterNetworkPolicyFields::parse(&cnp(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\nspec: {}\n",
        ))
        .unwrap_err(),
    );
    assert_eq!(errs, ["spec.tier", "spec.priority", "spec.subject"]);
    let errs = fields_of(
        ClusterNetworkPolicyFields::parse(&cnp(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\n",
        ))
        .unwrap_err(),
    );
    assert_eq!(errs, ["spec"]);
    let rule = "  - {action: Deny, to: [{namespaces: {}}]}\n";
    let many = format!(
        "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {{name: c}}\nspec:\n  tier: Baseline\n  priority: 0\n  subject: {{namespaces: {{}}}}\n  egress:\n{}",
        rule.repeat(26)
    );
    let errs = fields_of(ClusterNetworkPolicyFields::parse(&cnp(&many)).unwrap_err());
    assert_eq!(errs, ["spec.egress"]);
    let f =
        ClusterNetworkPolicyFields::parse(&cnp(&many.replace(&rule.repeat(26), &rule.repeat(25))))
            .unwrap();
    assert_eq!(
        (f.tier, f.priority, f.egress.len()),
        (Tier::Baseline, 0, 25)
    );
}

#[test]
fn a_peer_with_no_known_field_fails_closed_with_a_warning() {
    let p = cnp(&CNP.replace("    - pods: {podSelector: {}}\n", "    - {}\n"));
    let f = ClusterNetworkPolicyFields::parse(&p).unwrap();
    assert_eq!(f.egress[0].peers, [ClusterPeer::Unrecognized]);
    assert_eq!(fields_of(f.warnings), ["spec.egress[0].to[0]"]);
}
