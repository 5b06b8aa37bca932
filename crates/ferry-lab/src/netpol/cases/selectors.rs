//! Whom a policy selects and whom its peers select: default denies, pod and namespace
//! selectors alone and together, matchExpressions, the namespace name label, allow-all.
//! Transcribed from the Kubernetes e2e tests as the [parent module](super) says.

use super::super::{Case, Change, Check, Step};

/// The cases, in the upstream file's order.
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
];
