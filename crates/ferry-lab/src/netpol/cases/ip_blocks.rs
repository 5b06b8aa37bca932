//! ipBlock peers: a CIDR, its except clause, an address in both. Transcribed from the
//! Kubernetes e2e tests as the [parent module](super) says.

use super::super::{Case, Change, Check, Step};

/// The cases, in the upstream file's order.
pub const CASES: &[Case] = &[
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
];
