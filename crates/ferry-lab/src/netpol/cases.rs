//! The cases of the NetworkPolicy suite, transcribed from the Kubernetes e2e tests
//! (`test/e2e/network/netpol/network_policy.go`): each case's policies as the upstream
//! test builds them (YAML), and its expected matrices as the upstream test's
//! `Reachability` calls set them, written out for the nine pods x/a .. z/c (rows: from,
//! columns: to; `.` reached, `X` blocked). The upstream calls are kept above each grid.
//! Nothing here is computed: a grid is data, checked against the datapath, never
//! derived from ferry's own policy engine.
//!
//! The upstream tests now make only the pods a case needs (`initializeResources(...,
//! "x/a", "x/b", "y/a")`); their expectations are written on peers (`ExpectPeer`,
//! `ExpectAllIngress`), so they say the same of all nine pods, which is how the older
//! upstream versions ran every case. Left out: the three SCTP cases ("NetworkPolicy
//! between server and client using SCTP"), which need SCTP servers and probes; the two
//! TCP cases about SCTP policies are here.

use super::{Case, Change, Check, Step};

/// Every pod reaches every pod on every port: the state each upstream case starts from
/// (`NewReachability(k8s.AllPodStrings(), true)`), with no policy at all.
pub const BASELINE: Case = Case {
    name: "no policy: everything allowed",
    steps: &[Step {
        change: Change::Policies(""),
        checks: &[
            Check {
                port: "tcp/80",
                grid: ALL_ALLOWED,
            },
            Check {
                port: "tcp/81",
                grid: ALL_ALLOWED,
            },
            Check {
                port: "udp/80",
                grid: ALL_ALLOWED,
            },
            Check {
                port: "udp/81",
                grid: ALL_ALLOWED,
            },
        ],
    }],
};

const ALL_ALLOWED: [&str; 9] = [
    "... ... ...", // from x/a
    "... ... ...", // from x/b
    "... ... ...", // from x/c
    "... ... ...", // from y/a
    "... ... ...", // from y/b
    "... ... ...", // from y/c
    "... ... ...", // from z/a
    "... ... ...", // from z/b
    "... ... ...", // from z/c
];

/// The upstream cases, TCP then UDP, in the upstream file's order.
pub const CASES: &[Case] = &[
    // Upstream: "NetworkPolicy between server and client should support a 'default-deny-ingress' policy".
    Case {
        name: "TCP: should support a 'default-deny-ingress' policy",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-ingress, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: []
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should support a 'default-deny-all' policy".
    Case {
        name: "TCP: should support a 'default-deny-all' policy",
        steps: &[Step {
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
                // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsX}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow traffic from pods within server namespace based on PodSelector".
    Case {
        name: "TCP: should enforce policy to allow traffic from pods within server namespace based on PodSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: x-a-allows-x-b, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: { pod: b } } }]
"#,
            ),
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow ingress traffic for a target".
    Case {
        name: "TCP: should enforce policy to allow ingress traffic for a target",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-all, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: []
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all-to-a, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: {}, namespaceSelector: {} }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllIngress(NewPodString(nsX, "a"), true)
                // reachability.ExpectAllIngress(NewPodString(nsX, "b"), false)
                // reachability.ExpectAllIngress(NewPodString(nsX, "c"), false)
                grid: [
                    ".XX ... ...", // from x/a
                    ".XX ... ...", // from x/b
                    ".XX ... ...", // from x/c
                    ".XX ... ...", // from y/a
                    ".XX ... ...", // from y/b
                    ".XX ... ...", // from y/c
                    ".XX ... ...", // from z/a
                    ".XX ... ...", // from z/b
                    ".XX ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow ingress traffic from pods in all namespaces".
    Case {
        name: "TCP: should enforce policy to allow ingress traffic from pods in all namespaces",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-from-another-ns, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: {} } }]
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector".
    Case {
        name: "TCP: should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on PodSelector with MatchExpressions".
    Case {
        name: "TCP: should enforce policy based on PodSelector with MatchExpressions",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: x-a-allows-x-b, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchExpressions: [{ key: pod, operator: In, values: [b] }] } }]
"#,
            ),
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on NamespaceSelector with MatchExpressions".
    Case {
        name: "TCP: should enforce policy based on NamespaceSelector with MatchExpressions",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-match-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchExpressions: [{ key: kubernetes.io/metadata.name, operator: In, values: ["y"] }] } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on PodSelector or NamespaceSelector".
    Case {
        name: "TCP: should enforce policy based on PodSelector or NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-match-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchExpressions: [{ key: kubernetes.io/metadata.name, operator: NotIn, values: ["x"] }] }
    - podSelector: { matchLabels: { pod: b } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsX, "c"), NewPodString(nsX, "a"), false)
                grid: [
                    "X.. ... ...", // from x/a
                    "... ... ...", // from x/b
                    "X.. ... ...", // from x/c
                    "... ... ...", // from y/a
                    "... ... ...", // from y/b
                    "... ... ...", // from y/c
                    "... ... ...", // from z/a
                    "... ... ...", // from z/b
                    "... ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on PodSelector and NamespaceSelector".
    Case {
        name: "TCP: should enforce policy based on PodSelector and NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-podselector-and-nsselector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchExpressions: [{ key: kubernetes.io/metadata.name, operator: NotIn, values: ["x"] }] }
      podSelector: { matchLabels: { pod: b } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsY, "b"), NewPodString(nsX, "a"), true)
                // reachability.Expect(NewPodString(nsZ, "b"), NewPodString(nsX, "a"), true)
                grid: [
                    "X.. ... ...", // from x/a
                    "X.. ... ...", // from x/b
                    "X.. ... ...", // from x/c
                    "X.. ... ...", // from y/a
                    "... ... ...", // from y/b
                    "X.. ... ...", // from y/c
                    "X.. ... ...", // from z/a
                    "... ... ...", // from z/b
                    "X.. ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on Multiple PodSelectors and NamespaceSelectors".
    Case {
        name: "TCP: should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-z-pod-b-c, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchExpressions: [{ key: kubernetes.io/metadata.name, operator: NotIn, values: ["x"] }] }
      podSelector: { matchExpressions: [{ key: pod, operator: In, values: [b, c] }] }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.Expect(NewPodString(nsY, "a"), NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsZ, "a"), NewPodString(nsX, "a"), false)
                grid: [
                    "X.. ... ...", // from x/a
                    "X.. ... ...", // from x/b
                    "X.. ... ...", // from x/c
                    "X.. ... ...", // from y/a
                    "... ... ...", // from y/b
                    "... ... ...", // from y/c
                    "X.. ... ...", // from z/a
                    "... ... ...", // from z/b
                    "... ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on any PodSelectors".
    Case {
        name: "TCP: should enforce policy based on any PodSelectors",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-x-pod-b-c, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: { matchLabels: { pod: b } }
    - podSelector: { matchLabels: { pod: c } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsX, "b"), NewPodString(nsX, "a"), true)
                // reachability.Expect(NewPodString(nsX, "c"), NewPodString(nsX, "a"), true)
                grid: [
                    "X.. ... ...", // from x/a
                    "... ... ...", // from x/b
                    "... ... ...", // from x/c
                    "X.. ... ...", // from y/a
                    "X.. ... ...", // from y/b
                    "X.. ... ...", // from y/c
                    "X.. ... ...", // from z/a
                    "X.. ... ...", // from z/b
                    "X.. ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector".
    Case {
        name: "TCP: should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-pod-a-via-namespace-pod-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } }
      podSelector: { matchLabels: { pod: a } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsY, "a"), NewPodString(nsX, "a"), true)
                grid: [
                    "X.. ... ...", // from x/a
                    "X.. ... ...", // from x/b
                    "X.. ... ...", // from x/c
                    "... ... ...", // from y/a
                    "X.. ... ...", // from y/b
                    "X.. ... ...", // from y/c
                    "X.. ... ...", // from z/a
                    "X.. ... ...", // from z/b
                    "X.. ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on Ports".
    Case {
        name: "TCP: should enforce policy based on Ports",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: 81, protocol: TCP }]
"#,
            ),
            checks: &[Check {
                port: "tcp/81",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsY}, &Peer{Namespace: nsX, Pod: "a"}, true)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce multiple, stacked policies with overlapping podSelectors".
    Case {
        name: "TCP: should enforce multiple, stacked policies with overlapping podSelectors",
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
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: 81, protocol: TCP }]
"#,
                ),
                checks: &[
                    Check {
                        port: "tcp/81",
                        // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                        // reachability.ExpectPeer(&Peer{Namespace: nsY}, &Peer{Namespace: nsX, Pod: "a"}, true)
                        // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
                    },
                    Check {
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
                    },
                ],
            },
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
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: 81, protocol: TCP }]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector-80, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: 80, protocol: TCP }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                    // reachability.ExpectPeer(&Peer{Namespace: nsY}, &Peer{Namespace: nsX, Pod: "a"}, true)
                    // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
    // Upstream: "NetworkPolicy between server and client should support allow-all policy".
    Case {
        name: "TCP: should support allow-all policy",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress: [{}]
"#,
            ),
            checks: &[
                Check {
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
                },
                Check {
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
                },
            ],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should allow ingress access on one named port".
    Case {
        name: "TCP: should allow ingress access on one named port",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-all, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: serve-81-tcp }]
"#,
            ),
            checks: &[
                Check {
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
                },
                Check {
                    port: "tcp/80",
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
                },
            ],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should allow ingress access from namespace on one named port".
    Case {
        name: "TCP: should allow ingress access from namespace on one named port",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector-80, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: serve-80-tcp, protocol: TCP }]
"#,
            ),
            checks: &[
                Check {
                    port: "tcp/80",
                    // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                    // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
                },
                Check {
                    port: "tcp/81",
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
                },
            ],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should allow egress access on one named port".
    Case {
        name: "TCP: should allow egress access on one named port",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-egress, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Egress]
  egress:
  - ports: [{ port: serve-80-tcp }]
"#,
            ),
            checks: &[
                Check {
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
                },
                Check {
                    port: "tcp/81",
                    // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{}, false)
                    grid: [
                        "XXX XXX XXX", // from x/a
                        "XXX XXX XXX", // from x/b
                        "XXX XXX XXX", // from x/c
                        "... ... ...", // from y/a
                        "... ... ...", // from y/b
                        "... ... ...", // from y/c
                        "... ... ...", // from z/a
                        "... ... ...", // from z/b
                        "... ... ...", // from z/c
                    ],
                },
            ],
        }],
    },
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
    // Upstream: "NetworkPolicy between server and client should deny ingress from pods on other namespaces".
    Case {
        name: "TCP: should deny ingress from pods on other namespaces",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-empty-policy, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: {} } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsY}, &Peer{Namespace: nsX}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX}, false)
                grid: [
                    "... ... ...", // from x/a
                    "... ... ...", // from x/b
                    "... ... ...", // from x/c
                    "XXX ... ...", // from y/a
                    "XXX ... ...", // from y/b
                    "XXX ... ...", // from y/c
                    "XXX ... ...", // from z/a
                    "XXX ... ...", // from z/b
                    "XXX ... ...", // from z/c
                ],
            }],
        }],
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
    // Upstream: "NetworkPolicy between server and client should deny egress from pods based on PodSelector".
    Case {
        name: "TCP: should deny egress from pods based on PodSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-egress-pod-a, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress: []
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllEgress(NewPodString(nsX, "a"), false)
                grid: [
                    "XXX XXX XXX", // from x/a
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should deny egress from all pods in a namespace".
    Case {
        name: "TCP: should deny egress from all pods in a namespace",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-egress-ns-x, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: []
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{}, false)
                grid: [
                    "XXX XXX XXX", // from x/a
                    "XXX XXX XXX", // from x/b
                    "XXX XXX XXX", // from x/c
                    "... ... ...", // from y/a
                    "... ... ...", // from y/b
                    "... ... ...", // from y/c
                    "... ... ...", // from z/a
                    "... ... ...", // from z/b
                    "... ... ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should work with Ingress, Egress specified together".
    Case {
        name: "TCP: should work with Ingress, Egress specified together",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-pod-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress, Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: { pod: b } } }]
  egress:
  - ports: [{ port: 80 }]
"#,
            ),
            checks: &[
                Check {
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
                },
                Check {
                    port: "tcp/81",
                    // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                    // reachability.ExpectAllEgress(NewPodString(nsX, "a"), false)
                    // reachability.Expect(NewPodString(nsX, "b"), NewPodString(nsX, "a"), true)
                    grid: [
                        "XXX XXX XXX", // from x/a
                        "... ... ...", // from x/b
                        "X.. ... ...", // from x/c
                        "X.. ... ...", // from y/a
                        "X.. ... ...", // from y/b
                        "X.. ... ...", // from y/c
                        "X.. ... ...", // from z/a
                        "X.. ... ...", // from z/b
                        "X.. ... ...", // from z/c
                    ],
                },
            ],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)".
    Case {
        name: "TCP: should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-to-ns-y-pod-a, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } }
      podSelector: { matchLabels: { pod: a } }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-from-xa-on-ya-match-selector, namespace: "y" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "x" } }
      podSelector: { matchLabels: { pod: a } }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-from-xa-on-yb-match-selector, namespace: "y" }
spec:
  podSelector: { matchLabels: { pod: b } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "x" } }
      podSelector: { matchLabels: { pod: a } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX, Pod: "a"}, &Peer{}, false)
                // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsY, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsX, Pod: "a"}, &Peer{Namespace: nsY, Pod: "a"}, true)
                // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsY, Pod: "b"}, false)
                grid: [
                    "XXX .XX XXX", // from x/a
                    "... XX. ...", // from x/b
                    "... XX. ...", // from x/c
                    "... XX. ...", // from y/a
                    "... XX. ...", // from y/b
                    "... XX. ...", // from y/c
                    "... XX. ...", // from z/a
                    "... XX. ...", // from z/b
                    "... XX. ...", // from z/c
                ],
            }],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector".
    Case {
        name: "TCP: should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-to-ns-y-pod-a, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } }
      podSelector: { matchLabels: { pod: a } }
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllEgress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsY, "a"), true)
                grid: [
                    "XXX .XX XXX", // from x/a
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce ingress policy allowing any port traffic to a server on a specific protocol".
    Case {
        name: "TCP: should enforce ingress policy allowing any port traffic to a server on a specific protocol",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ingress-by-proto, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ protocol: TCP }]
"#,
            ),
            checks: &[
                Check {
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
                },
                Check {
                    port: "udp/80",
                    // reachability.ExpectPeer(&Peer{}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
                },
            ],
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce multiple ingress policies with ingress allow-all policy taking precedence".
    Case {
        name: "TCP: should enforce multiple ingress policies with ingress allow-all policy taking precedence",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ingress-port-80, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: 80 }]
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
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ingress-port-80, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: 80 }]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ingress, namespace: "x" }
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
        ],
    },
    // Upstream: "NetworkPolicy between server and client should enforce multiple egress policies with egress allow-all policy taking precedence".
    Case {
        name: "TCP: should enforce multiple egress policies with egress allow-all policy taking precedence",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-egress-port-80, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Egress]
  egress:
  - ports: [{ port: 80 }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/81",
                    // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{}, false)
                    grid: [
                        "XXX XXX XXX", // from x/a
                        "XXX XXX XXX", // from x/b
                        "XXX XXX XXX", // from x/c
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
metadata: { name: allow-egress-port-80, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Egress]
  egress:
  - ports: [{ port: 80 }]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-egress, namespace: "x" }
spec:
  podSelector: { matchLabels: {} }
  policyTypes: [Egress]
  egress: [{}]
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
    // Upstream: "NetworkPolicy between server and client should allow egress access to server in CIDR block".
    Case {
        name: "TCP: should allow egress access to server in CIDR block",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-cidr-egress-rule, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to: [{ ipBlock: { cidr: "{ip:y/b}/32" } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectAllEgress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsY, "b"), true)
                grid: [
                    "XXX X.X XXX", // from x/a
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce except clause while egress access to server in CIDR block".
    Case {
        name: "TCP: should enforce except clause while egress access to server in CIDR block",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-cidr-egress-rule, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to: [{ ipBlock: { cidr: "{cidr4:x/b}", except: ["{ip:x/b}/32"] } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsX, "b"), false)
                grid: [
                    ".X. ... ...", // from x/a
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed".
    Case {
        name: "TCP: should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-cidr-egress-rule, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to: [{ ipBlock: { cidr: "{cidr4:x/b}", except: ["{ip:x/b}/32"] } }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsX, "b"), false)
                    grid: [
                        ".X. ... ...", // from x/a
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
metadata: { name: allow-client-a-via-cidr-egress-rule, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to: [{ ipBlock: { cidr: "{ip:x/b}/32" } }]
"#,
                ),
                checks: &[Check {
                    port: "tcp/80",
                    // reachability.ExpectAllEgress(NewPodString(nsX, "a"), false)
                    // reachability.Expect(NewPodString(nsX, "a"), NewPodString(nsX, "b"), true)
                    grid: [
                        "X.X XXX XXX", // from x/a
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
    // Upstream: "NetworkPolicy between server and client should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector".
    Case {
        name: "TCP: should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
        steps: &[
            Step {
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-egress-for-target, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress: [{}]
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
                change: Change::Policies(
                    r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-egress-for-target, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress: [{}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-ingress-via-label-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress: []
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
        ],
    },
    // Upstream: "NetworkPolicy between server and client should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP".
    Case {
        name: "TCP: should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-ingress, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: []
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-only-sctp-ingress-on-port-81, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: 81, protocol: SCTP }]
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP".
    Case {
        name: "TCP: should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-only-sctp-ingress-on-port-80, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: 80, protocol: SCTP }]
"#,
            ),
            checks: &[Check {
                port: "tcp/81",
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should not allow access by TCP when a policy specifies only UDP".
    Case {
        name: "TCP: should not allow access by TCP when a policy specifies only UDP",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-only-udp-ingress-on-port-81, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - ports: [{ port: 81, protocol: UDP }]
"#,
            ),
            checks: &[Check {
                port: "tcp/81",
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label".
    Case {
        name: "TCP: should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-client-a-via-ns-selector-for-immutable-ns-label, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client should enforce policy based on NamespaceSelector with MatchExpressions using default ns label".
    Case {
        name: "TCP: should enforce policy based on NamespaceSelector with MatchExpressions using default ns label",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-match-selector-for-immutable-ns-label, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress:
  - to: [{ namespaceSelector: { matchExpressions: [{ key: kubernetes.io/metadata.name, operator: NotIn, values: ["y"] }] } }]
"#,
            ),
            checks: &[Check {
                port: "tcp/80",
                // reachability.ExpectPeer(&Peer{Namespace: nsX, Pod: "a"}, &Peer{Namespace: nsY}, false)
                grid: [
                    "... XXX ...", // from x/a
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client using UDP should support a 'default-deny-ingress' policy".
    Case {
        name: "UDP: should support a 'default-deny-ingress' policy",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-all, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: []
"#,
            ),
            checks: &[Check {
                port: "udp/80",
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client using UDP should enforce policy based on Ports".
    Case {
        name: "UDP: should enforce policy based on Ports",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ingress-on-port-81-ns-x, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } } }]
    ports: [{ port: 81, protocol: UDP }]
"#,
            ),
            checks: &[Check {
                port: "udp/81",
                // reachability.ExpectPeer(&Peer{Namespace: nsX}, &Peer{Namespace: nsX, Pod: "a"}, false)
                // reachability.ExpectPeer(&Peer{Namespace: nsZ}, &Peer{Namespace: nsX, Pod: "a"}, false)
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
        }],
    },
    // Upstream: "NetworkPolicy between server and client using UDP should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector".
    Case {
        name: "UDP: should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-ns-y-pod-a-via-namespace-pod-selector, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: { matchLabels: { kubernetes.io/metadata.name: "y" } }
      podSelector: { matchLabels: { pod: a } }
"#,
            ),
            checks: &[Check {
                port: "udp/80",
                // reachability.ExpectAllIngress(NewPodString(nsX, "a"), false)
                // reachability.Expect(NewPodString(nsY, "a"), NewPodString(nsX, "a"), true)
                grid: [
                    "X.. ... ...", // from x/a
                    "X.. ... ...", // from x/b
                    "X.. ... ...", // from x/c
                    "... ... ...", // from y/a
                    "X.. ... ...", // from y/b
                    "X.. ... ...", // from y/c
                    "X.. ... ...", // from z/a
                    "X.. ... ...", // from z/b
                    "X.. ... ...", // from z/c
                ],
            }],
        }],
    },
];
