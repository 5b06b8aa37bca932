//! Egress, and ingress with egress: denied egress, both directions in one policy or in
//! several, the client side deciding, several policies stacked over one pod.
//! Transcribed from the Kubernetes e2e tests as the [parent module](super) says.

use super::super::{Case, Change, Check, Step};

/// The cases, in the upstream file's order.
pub const CASES: &[Case] = &[
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
];
