//! Changes while traffic flows: a policy, a namespace's or a pod's labels updated,
//! policies deleted. Transcribed from the Kubernetes e2e tests as the [parent
//! module](super) says.

use super::super::{Case, Change, Check, Step};

/// The cases, in the upstream file's order.
pub const CASES: &[Case] = &[
    // Upstream: "NetworkPolicy between server and client should enforce updated policy".
    Case {
        name: "TCP: should enforce updated policy",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all-mutate-to-deny-all, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress: [{}]
"#,
                ),
                checks: &[Check {
                    port: "tcp/81",
                    // NewReachability(k8s.AllPodStrings(), true): all allowed
                    grid: [
                        "... ... ...", // from x/a
                        "... ... ...", // from x/b
                        "... ... ...", // from x/c
                        "... ... ...", // from y/a
                        "... ... ...", // from y/b
                        "... ... ...", // from y/c
                        "... ... ...", // from z/a
                        "... ... ...", // from z/b
                        "... ... ...", // from z/c
                    ],
                }],
            },
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all-mutate-to-deny-all, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress: []
"#,
                ),
                checks: &[Check {
                    port: "tcp/81",
                    // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsX}, false)
                    grid: [
                        "XXX ... ...", // from x/a
                        "XXX ... ...", // from x/b
                        "XXX ... ...", // from x/c
                        "XXX ... ...", // from y/a
                        "XXX ... ...", // from y/b
                        "XXX ... ...", // from y/c
                        "XXX ... ...", // from z/a
                        "XXX ... ...", // from z/b
                        "XXX ... ...", // from z/c
                    ],
                }],
            },
        ],
    },
    // Upstream: "NetworkPolicy between server and client should allow ingress access from updated namespace".
    Case {
        name: "TCP: should allow ingress access from updated namespace",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { ns2: updated } } }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    grid: [
                        "X.. ... ...", // from x/a
                        "X.. ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "X.. ... ...", // from y/a
                        "X.. ... ...", // from y/b
                        "X.. ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                }],
            },
            Step {
                change: Change::NamespaceLabel("y", "ns2", "updated"),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    // reachability.ExpectPeer(&Peer{Namespace: nsY}, &Peer{}, true)
                    grid: [
                        "X.. ... ...", // from x/a
                        "X.. ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "... ... ...", // from y/a
                        "... ... ...", // from y/b
                        "... ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                }],
            },
        ],
    },
    // Upstream: "NetworkPolicy between server and client should allow ingress access from updated pod".
    Case {
        name: "TCP: should allow ingress access from updated pod",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-pod-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: { pod: b, pod2: updated } } }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    grid: [
                        "X.. ... ...", // from x/a
                        "X.. ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "X.. ... ...", // from y/a
                        "X.. ... ...", // from y/b
                        "X.. ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                }],
            },
            Step {
                change: Change::PodLabel("x/b", "pod2", "updated"),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    // reachability.Expect(NewPodString(nsX, "b"), NewPodString(nsX, "a"), true)
                    grid: [
                        "X.. ... ...", // from x/a
                        "... ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "X.. ... ...", // from y/a
                        "X.. ... ...", // from y/b
                        "X.. ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                }],
            },
        ],
    },
    // Upstream: "NetworkPolicy between server and client should deny ingress access to updated pod".
    Case {
        name: "TCP: should deny ingress access to updated pod",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-ingress-via-label-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { target: isolated } }
  policyTypes: [Ingress]
  ingress: []
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // NewReachability(k8s.AllPodStrings(), true): all allowed
                    grid: [
                        "... ... ...", // from x/a
                        "... ... ...", // from x/b
                        "... ... ...", // from x/c
                        "... ... ...", // from y/a
                        "... ... ...", // from y/b
                        "... ... ...", // from y/c
                        "... ... ...", // from z/a
                        "... ... ...", // from z/b
                        "... ... ...", // from z/c
                    ],
                }],
            },
            Step {
                change: Change::PodLabel("x/a", "target", "isolated"),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    grid: [
                        "X.. ... ...", // from x/a
                        "X.. ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "X.. ... ...", // from y/a
                        "X.. ... ...", // from y/b
                        "X.. ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                }],
            },
        ],
    },
    // Upstream: "NetworkPolicy between server and client should stop enforcing policies after they are deleted".
    Case {
        name: "TCP: should stop enforcing policies after they are deleted",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-all, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress: []
  egress: []
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{}, false)
                    // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsX}, false)
                    grid: [
                        "XXX XXX XXX", // from x/a
                        "XXX XXX XXX", // from x/b
                        "XXX XXX XXX", // from x/c
                        "XXX ... ...", // from y/a
                        "XXX ... ...", // from y/b
                        "XXX ... ...", // from y/c
                        "XXX ... ...", // from z/a
                        "XXX ... ...", // from z/b
                        "XXX ... ...", // from z/c
                    ],
                }],
            },
            Step {
                change: Change::Policies(""),
                checks: &[Check {
                    port: "tcp/80",
                    // NewReachability(k8s.AllPodStrings(), true): all allowed
                    grid: [
                        "... ... ...", // from x/a
                        "... ... ...", // from x/b
                        "... ... ...", // from x/c
                        "... ... ...", // from y/a
                        "... ... ...", // from y/b
                        "... ... ...", // from y/c
                        "... ... ...", // from z/a
                        "... ... ...", // from z/b
                        "... ... ...", // from z/c
                    ],
                }],
            },
        ],
    },
];
