//! Ports and protocols: numbered, named (ingress and egress), any port of one protocol,
//! SCTP policies on TCP traffic, UDP-only policies, and the UDP cases. Transcribed from
//! the Kubernetes e2e tests as the [parent module](super) says.

use super::super::{Case, Change, Check, Step};

/// The cases, in the upstream file's order.
pub const CASES: &[Case] = &[
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
