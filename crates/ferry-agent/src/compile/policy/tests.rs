//! From policies and pods to the policy section, checked by what the datapath then
//! decides for packets between the pods.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferry_datapath::policy::{DecidedBy, Direction, PolicySpec, Query, Tier as DpTier};
use ferry_datapath::proto;

use super::*;
use crate::policy::{
    Action, ClusterPeer, ClusterRule, IpBlock, Namespaces, NetworkPolicyRule, Operator, Peer,
    PodSet, PolicyPort, Requirement, Selector, Tier,
};

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(kv: &[(&str, &str)]) -> Selector {
    Selector {
        match_labels: labels(kv),
        match_expressions: vec![],
    }
}

/// A cluster's pods: namespace, name, labels, address, named ports.
struct Pods {
    keys: Vec<ObjectKey>,
    labels: Vec<BTreeMap<String, String>>,
    ips: Vec<Vec<IpAddr>>,
    named: Vec<BTreeMap<String, (Protocol, u16)>>,
}

/// A pod given as namespace, name, labels, address and named ports.
type PodRow<'a> = (
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a str,
    &'a [(&'a str, Protocol, u16)],
);

impl Pods {
    fn new(pods: &[PodRow<'_>]) -> Pods {
        Pods {
            keys: pods.iter().map(|p| ObjectKey::new(p.0, p.1)).collect(),
            labels: pods.iter().map(|p| labels(p.2)).collect(),
            ips: pods.iter().map(|p| vec![p.3.parse().unwrap()]).collect(),
            named: pods
                .iter()
                .map(|p| {
                    p.4.iter()
                        .map(|(n, pr, x)| (n.to_string(), (*pr, *x)))
                        .collect()
                })
                .collect(),
        }
    }

    fn views(&self) -> Vec<PodView<'_>> {
        (0..self.keys.len())
            .map(|i| PodView {
                key: &self.keys[i],
                labels: &self.labels[i],
                ips: &self.ips[i],
                named: &self.named[i],
            })
            .collect()
    }
}

/// Pods x/a (10.0.1.1), x/b (10.0.1.2, `http` = 8080), y/a (10.0.2.1, `http` = 9090),
/// y/c (10.0.2.3); namespace y has a Namespace object labelled `team=blue`.
fn cluster() -> Pods {
    Pods::new(&[
        ("x", "a", &[("pod", "a")], "10.0.1.1", &[]),
        (
            "x",
            "b",
            &[("pod", "b")],
            "10.0.1.2",
            &[("http", Protocol::Tcp, 8080)],
        ),
        (
            "y",
            "a",
            &[("pod", "a")],
            "10.0.2.1",
            &[("http", Protocol::Tcp, 9090)],
        ),
        ("y", "c", &[("pod", "c")], "10.0.2.3", &[]),
    ])
}

/// Every pod of the cluster is local, its port named after it.
fn local(p: &Pods) -> BTreeMap<ObjectKey, String> {
    p.keys
        .iter()
        .map(|k| (k.clone(), format!("{}.{}", k.namespace, k.name)))
        .collect()
}

/// The datapath's decision on `spec` for the pod whose port is `port`.
fn decide(
    spec: &PolicySpec,
    port: &str,
    d: Direction,
    peer: &str,
    proto: u8,
    dport: u16,
) -> (bool, DecidedBy) {
    let p = cluster();
    let names: Vec<String> = local(&p).into_values().collect();
    let ports: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), true)).collect();
    let policy = spec.compile(&ports).unwrap();
    let id = names.iter().position(|n| n == port).unwrap() as u16;
    let q = Query {
        peer: peer.parse().unwrap(),
        proto,
        port: dport,
    };
    let d = policy.decide(id, d, &q);
    (d.allowed, d.by)
}

fn np(
    ns: &str,
    pods: Selector,
    ingress: Option<Vec<NetworkPolicyRule>>,
    egress: Option<Vec<NetworkPolicyRule>>,
) -> NetworkPolicyFields {
    NetworkPolicyFields {
        namespace: ns.into(),
        pod_selector: pods,
        ingress,
        egress,
    }
}

fn tcp(n: u16) -> PolicyPort {
    PolicyPort::Range {
        protocol: Protocol::Tcp,
        first: n,
        last: n,
    }
}

fn compile_with(
    p: &Pods,
    nps: &[(ObjectKey, NetworkPolicyFields)],
    cnps: &[(&str, ClusterNetworkPolicyFields)],
) -> PolicySpec {
    let blue = labels(&[("team", "blue"), (NAMESPACE_NAME_LABEL, "y")]);
    let mut inputs = Inputs {
        pods: p.views(),
        namespaces: BTreeMap::from([("y", &blue)]),
        network_policies: nps.iter().map(|(k, f)| (k, f)).collect(),
        cluster_policies: cnps.iter().map(|(n, f)| (*n, f)).collect(),
        nodes: vec![],
    };
    // In key order, as the cluster gives them.
    inputs.network_policies.sort_by_key(|(k, _)| *k);
    inputs.cluster_policies.sort_by_key(|(n, _)| *n);
    compile(&inputs, &local(p), PolicyOptions::default())
}

#[test]
fn pod_and_namespace_selectors_resolve_to_the_addresses_of_the_pods_they_select() {
    let p = cluster();
    // x/b takes TCP 80 from pods `a` of namespaces labelled team=blue (y/a), and from
    // pod x/a by name (the policy's own namespace), nothing else.
    let rule = NetworkPolicyRule {
        peers: Some(vec![
            Peer::Pods {
                namespaces: Namespaces::Selected(sel(&[("team", "blue")])),
                pods: sel(&[("pod", "a")]),
            },
            Peer::Pods {
                namespaces: Namespaces::Own("x".into()),
                pods: sel(&[("pod", "a")]),
            },
        ]),
        ports: Some(vec![tcp(80)]),
    };
    let nps = [(
        ObjectKey::new("x", "web"),
        np("x", sel(&[("pod", "b")]), Some(vec![rule]), None),
    )];
    let spec = compile_with(&p, &nps, &[]);
    assert_eq!(spec.pods.len(), 1, "only x/b is selected");
    assert_eq!(spec.pods[0].port, "x.b");
    let allowed = |peer| decide(&spec, "x.b", Direction::Ingress, peer, proto::TCP, 80).0;
    assert!(allowed("10.0.2.1") && allowed("10.0.1.1"));
    assert!(!allowed("10.0.2.3"), "y/c is not pod a");
    assert!(!decide(&spec, "x.b", Direction::Ingress, "10.0.2.1", proto::TCP, 81).0);
    // x/b's egress is not isolated; the other pods are open.
    assert_eq!(
        decide(&spec, "x.b", Direction::Egress, "1.1.1.1", proto::UDP, 53).1,
        DecidedBy::Default
    );
    assert_eq!(
        decide(&spec, "y.a", Direction::Ingress, "1.1.1.1", proto::TCP, 80).1,
        DecidedBy::Default
    );
}

#[test]
fn a_namespace_without_an_object_is_known_by_its_name_label() {
    let p = cluster();
    let by_name = Selector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![Requirement {
            key: NAMESPACE_NAME_LABEL.into(),
            operator: Operator::In,
            values: ["x".to_string()].into(),
        }],
    };
    let rule = NetworkPolicyRule {
        peers: Some(vec![Peer::Pods {
            namespaces: Namespaces::Selected(by_name),
            pods: Selector::default(),
        }]),
        ports: None,
    };
    let nps = [(
        ObjectKey::new("y", "from-x"),
        np("y", Selector::default(), Some(vec![rule]), None),
    )];
    let spec = compile_with(&p, &nps, &[]);
    assert!(decide(&spec, "y.c", Direction::Ingress, "10.0.1.1", proto::UDP, 5).0);
    assert!(!decide(&spec, "y.c", Direction::Ingress, "10.0.2.1", proto::UDP, 5).0);
}

#[test]
fn a_named_port_means_each_pods_own_number() {
    let p = cluster();
    let http = PolicyPort::Named {
        protocol: Some(Protocol::Tcp),
        name: "http".into(),
    };
    // Ingress to every pod of every namespace on `http`: 8080 on x/b, 9090 on y/a,
    // nothing on pods without it.
    let ing = NetworkPolicyRule {
        peers: None,
        ports: Some(vec![http.clone()]),
    };
    // Egress from x/a to `http` of any pod.
    let eg = NetworkPolicyRule {
        peers: None,
        ports: Some(vec![http]),
    };
    let nps = [
        (
            ObjectKey::new("x", "in"),
            np("x", Selector::default(), Some(vec![ing.clone()]), None),
        ),
        (
            ObjectKey::new("y", "in"),
            np("y", Selector::default(), Some(vec![ing]), None),
        ),
        (
            ObjectKey::new("x", "out"),
            np("x", sel(&[("pod", "a")]), None, Some(vec![eg])),
        ),
    ];
    let spec = compile_with(&p, &nps, &[]);
    let ing = |port, dport| {
        decide(
            &spec,
            port,
            Direction::Ingress,
            "10.9.9.9",
            proto::TCP,
            dport,
        )
        .0
    };
    assert!(ing("x.b", 8080) && !ing("x.b", 9090));
    assert!(ing("y.a", 9090) && !ing("y.a", 8080));
    assert!(
        !ing("x.a", 8080) && !ing("y.c", 9090),
        "no port of that name: nothing"
    );
    let eg = |peer, dport| decide(&spec, "x.a", Direction::Egress, peer, proto::TCP, dport).0;
    assert!(eg("10.0.1.2", 8080) && eg("10.0.2.1", 9090));
    assert!(!eg("10.0.1.2", 9090) && !eg("10.0.2.1", 8080) && !eg("10.0.2.3", 8080));
    assert!(!eg("8.8.8.8", 8080), "only pods have named ports");
}

#[test]
fn ip_blocks_keep_their_exceptions_and_match_pod_addresses() {
    let p = cluster();
    let rule = NetworkPolicyRule {
        peers: Some(vec![Peer::IpBlock(IpBlock {
            cidr: "10.0.0.0/16".parse().unwrap(),
            except: vec!["10.0.2.0/24".parse().unwrap()],
        })]),
        ports: None,
    };
    let nps = [(
        ObjectKey::new("x", "out"),
        np("x", sel(&[("pod", "a")]), None, Some(vec![rule])),
    )];
    let spec = compile_with(&p, &nps, &[]);
    let eg = |peer| decide(&spec, "x.a", Direction::Egress, peer, proto::ICMP, 8 << 8).0;
    assert!(eg("10.0.1.2"), "a pod address in the block");
    assert!(!eg("10.0.2.1") && !eg("192.0.2.1"));
    // An Egress-only policy leaves ingress open.
    assert_eq!(
        decide(&spec, "x.a", Direction::Ingress, "192.0.2.1", proto::TCP, 1).1,
        DecidedBy::Default
    );
}

fn cnp(
    tier: Tier,
    priority: u16,
    subject: PodSet,
    ingress: Vec<ClusterRule>,
) -> ClusterNetworkPolicyFields {
    ClusterNetworkPolicyFields {
        tier,
        priority,
        subject,
        ingress,
        egress: vec![],
        warnings: vec![],
    }
}

fn crule(index: usize, name: &str, action: Action, peers: Vec<ClusterPeer>) -> ClusterRule {
    ClusterRule {
        index,
        name: name.into(),
        action,
        peers,
        ports: None,
    }
}

#[test]
fn tiers_go_by_priority_then_name_and_rules_in_order() {
    let p = cluster();
    let all = PodSet {
        namespaces: Selector::default(),
        pods: Selector::default(),
    };
    let from_y = ClusterPeer::Pods(PodSet {
        namespaces: sel(&[("team", "blue")]),
        pods: Selector::default(),
    });
    let cnps = [
        // Priority 20: deny from y. Priority 10 (first): pass y/a, then accept 10/8.
        (
            "b-deny-y",
            cnp(
                Tier::Admin,
                20,
                all.clone(),
                vec![crule(0, "deny-y", Action::Deny, vec![from_y.clone()])],
            ),
        ),
        (
            "a-pass",
            cnp(
                Tier::Admin,
                10,
                all.clone(),
                vec![
                    crule(
                        0,
                        "pass-y-a",
                        Action::Pass,
                        vec![ClusterPeer::Pods(PodSet {
                            namespaces: sel(&[("team", "blue")]),
                            pods: sel(&[("pod", "a")]),
                        })],
                    ),
                    crule(
                        1,
                        "",
                        Action::Accept,
                        vec![ClusterPeer::Networks(vec!["10.0.1.0/24".parse().unwrap()])],
                    ),
                ],
            ),
        ),
        // Baseline: deny everything the others leave undecided.
        (
            "z-baseline",
            cnp(
                Tier::Baseline,
                0,
                all,
                vec![crule(
                    0,
                    "deny-all",
                    Action::Deny,
                    vec![ClusterPeer::Networks(vec!["0.0.0.0/0".parse().unwrap()])],
                )],
            ),
        ),
    ];
    let spec = compile_with(&p, &[], &cnps);
    let ing = |peer| decide(&spec, "x.a", Direction::Ingress, peer, proto::TCP, 80);
    assert_eq!(
        ing("10.0.1.2").1,
        DecidedBy::Rule(DpTier::Admin, 1),
        "the accept of a-pass"
    );
    assert!(ing("10.0.1.2").0);
    let (allowed, by) = ing("10.0.2.3");
    assert!(
        !allowed && by == DecidedBy::Rule(DpTier::Admin, 2),
        "y/c: b-deny-y, the third rule compiled: {by:?}"
    );
    // y/a is passed over the Admin tier; no NetworkPolicy; the baseline denies it.
    let (allowed, by) = ing("10.0.2.1");
    assert!(!allowed);
    assert!(matches!(by, DecidedBy::Rule(DpTier::Baseline, _)), "{by:?}");
    assert_eq!(
        spec.policies[..3],
        [
            "ClusterNetworkPolicy a-pass",
            "ClusterNetworkPolicy b-deny-y",
            "ClusterNetworkPolicy z-baseline"
        ]
    );
    let names: Vec<&str> = spec.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names[..3],
        ["ingress rule pass-y-a", "ingress[1]", "ingress rule deny-y"]
    );
}

#[test]
fn an_unrecognized_peer_fails_closed() {
    let p = cluster();
    let all = PodSet {
        namespaces: Selector::default(),
        pods: Selector::default(),
    };
    let cnps = [
        (
            "accept",
            cnp(
                Tier::Admin,
                1,
                all.clone(),
                vec![crule(
                    0,
                    "",
                    Action::Accept,
                    vec![ClusterPeer::Unrecognized],
                )],
            ),
        ),
        (
            "deny",
            cnp(
                Tier::Admin,
                2,
                all,
                vec![crule(0, "", Action::Deny, vec![ClusterPeer::Unrecognized])],
            ),
        ),
    ];
    let spec = compile_with(&p, &[], &cnps);
    // The Accept rule matches nothing; the Deny rule matches every peer.
    let (allowed, by) = decide(&spec, "y.c", Direction::Ingress, "10.0.1.1", proto::TCP, 80);
    assert!(!allowed);
    assert_eq!(by, DecidedBy::Rule(DpTier::Admin, 1));
}

#[test]
fn rules_and_sets_that_mean_the_same_are_compiled_once() {
    let p = cluster();
    let rule = NetworkPolicyRule {
        peers: Some(vec![Peer::Pods {
            namespaces: Namespaces::Own("x".into()),
            pods: sel(&[("pod", "a")]),
        }]),
        ports: Some(vec![tcp(80)]),
    };
    // One policy selecting both pods of x: one rule, one set, two pods.
    let nps = [(
        ObjectKey::new("x", "p"),
        np("x", Selector::default(), Some(vec![rule]), None),
    )];
    let spec = compile_with(&p, &nps, &[]);
    assert_eq!(
        (spec.pods.len(), spec.rules.len(), spec.sets.len()),
        (2, 1, 1)
    );
}
