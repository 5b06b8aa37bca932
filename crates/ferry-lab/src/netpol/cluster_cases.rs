//! ClusterNetworkPolicy cases (`policy.networking.k8s.io/v1alpha2`), after the
//! conformance tests of sig-network's network-policy-api (`conformance/tests/`). The
//! upstream tests poke one server from a few clients in four namespaces named after
//! houses; here the same policies are put on the suite's namespaces (gryffindor is x,
//! slytherin y, ravenclaw z) and every case checks the whole 9x9 grid, so a rule that
//! reaches too far shows too. Each case's name says what it proves, then the upstream
//! test (`ShortName: subtest`) whose semantics it takes. As in [`super::cases`], the
//! grids are written out by hand, never computed.
//!
//! The tiers, as the API orders them: Admin policies by priority (lower first), their
//! rules in order, `Accept` and `Deny` final, `Pass` skipping to the NetworkPolicies;
//! a pod no NetworkPolicy isolates (in that direction) goes on to the Baseline tier,
//! whose verdict, or the default allow, ends it. A connection needs the source's egress
//! and the destination's ingress to allow it.

use super::{Case, Change, Check, Step};

const ALL: [&str; 9] = [
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

/// y and x may not talk, either way; the rest is open.
const X_Y_APART: [&str; 9] = [
    "... XXX ...", // from x/a
    "... XXX ...", // from x/b
    "... XXX ...", // from x/c
    "XXX ... ...", // from y/a
    "XXX ... ...", // from y/b
    "XXX ... ...", // from y/c
    "... ... ...", // from z/a
    "... ... ...", // from z/b
    "... ... ...", // from z/c
];

/// The two checks of a case whose rules name no port: TCP 80 and UDP 81 alike.
macro_rules! both {
    ($grid:expr) => {
        &[
            Check {
                port: "tcp/80",
                grid: $grid,
            },
            Check {
                port: "udp/81",
                grid: $grid,
            },
        ]
    };
}

/// The NetworkPolicy of the integration test: x's pods talk to y's only, both ways.
macro_rules! np_x_only_with_y {
    () => {
        r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-gress-from-to-y, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { ns: "y" } } }]
  egress:
  - to: [{ namespaceSelector: { matchLabels: { ns: "y" } } }]
"#
    };
}

/// The Baseline policy of the integration test: x and y apart, both ways.
macro_rules! baseline_x_y_apart {
    () => {
        r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: default }
spec:
  tier: Baseline
  priority: 10
  subject: { namespaces: { matchLabels: { ns: "x" } } }
  ingress:
  - { name: deny-all-ingress-from-y, action: Deny, from: [{ namespaces: { matchLabels: { ns: "y" } } }] }
  egress:
  - { name: deny-all-egress-to-y, action: Deny, to: [{ namespaces: { matchLabels: { ns: "y" } } }] }
"#
    };
}

/// The Admin policy of the integration test, with its ingress and egress actions.
macro_rules! admin_x_y {
    ($ingress:literal, $egress:literal) => {
        concat!(
            r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: pass-example }
spec:
  tier: Admin
  priority: 10
  subject: { namespaces: { matchLabels: { ns: "x" } } }
  ingress:
  - { name: ingress-from-y, action: "#,
            $ingress,
            r#", from: [{ namespaces: { matchLabels: { ns: "y" } } }] }
  egress:
  - { name: egress-to-y, action: "#,
            $egress,
            r#", to: [{ namespaces: { matchLabels: { ns: "y" } } }] }
"#
        )
    };
}

/// The priority test's policies: Deny at 50, Pass at `$pass`, Baseline Accept, all
/// between the pods of x and y.
macro_rules! priority_case {
    ($pass:literal) => {
        concat!(
            r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: priority-50-example }
spec:
  tier: Admin
  priority: 50
  subject: { pods: { namespaceSelector: { matchLabels: { ns: "x" } }, podSelector: {} } }
  ingress:
  - { name: deny-all-ingress-from-y, action: Deny, from: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
  egress:
  - { name: deny-all-egress-to-y, action: Deny, to: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: pass-example }
spec:
  tier: Admin
  priority: "#,
            $pass,
            r#"
  subject: { pods: { namespaceSelector: { matchLabels: { ns: "x" } }, podSelector: {} } }
  ingress:
  - { name: pass-all-ingress-from-y, action: Pass, from: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
  egress:
  - { name: pass-all-egress-to-y, action: Pass, to: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: default }
spec:
  tier: Baseline
  priority: 10
  subject: { pods: { namespaceSelector: { matchLabels: { ns: "x" } }, podSelector: {} } }
  ingress:
  - { name: allow-all-ingress-from-y, action: Accept, from: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
  egress:
  - { name: allow-all-egress-to-y, action: Accept, to: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
"#
        )
    };
}

/// The egress CIDR test's Admin policy: x may reach y's pods and, before that, the
/// networks given; every other address is denied.
macro_rules! cidr_case {
    ($first:literal) => {
        concat!(
            r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: inline-cidr-as-peers-example }
spec:
  tier: Admin
  priority: 85
  subject: { pods: { namespaceSelector: { matchLabels: { ns: "x" } }, podSelector: {} } }
  egress:
"#,
            $first,
            r#"  - { name: allow-egress-to-y, action: Accept, to: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
  - { name: deny-egress-to-internet, action: Deny, to: [{ networks: ["0.0.0.0/0", "::/0"] }] }
"#
        )
    };
}

/// The ClusterNetworkPolicy cases, in the order of the properties they prove.
pub const CLUSTER_CASES: &[Case] = &[
    Case {
        name: "CNP: an Admin Deny beats a NetworkPolicy allow (CNPAdminTierIntegration: Should Deny traffic from slytherin to gryffindor respecting admin CNP; Should Deny traffic to slytherin from gryffindor respecting admin CNP)",
        steps: &[Step {
            change: Change::Policies(concat!(
                admin_x_y!("Deny", "Deny"),
                np_x_only_with_y!(),
                baseline_x_y_apart!()
            )),
            // The NetworkPolicy lets x talk to y only; the Admin Deny takes that too.
            checks: both!([
                "XXX XXX XXX", // from x/a
                "XXX XXX XXX", // from x/b
                "XXX XXX XXX", // from x/c
                "XXX ... ...", // from y/a
                "XXX ... ...", // from y/b
                "XXX ... ...", // from y/c
                "XXX ... ...", // from z/a
                "XXX ... ...", // from z/b
                "XXX ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: an Admin Pass on ingress defers to the NetworkPolicy, its Deny on egress still holds (CNPAdminTierIntegration: Should support a 'pass-ingress' policy for admin CNP and respect the match for network policy)",
        steps: &[Step {
            change: Change::Policies(concat!(
                admin_x_y!("Pass", "Deny"),
                np_x_only_with_y!(),
                baseline_x_y_apart!()
            )),
            // y -> x is passed to the NetworkPolicy, which allows it (the Baseline Deny
            // is not reached: x's pods are isolated); x -> y is still denied.
            checks: both!([
                "XXX XXX XXX", // from x/a
                "XXX XXX XXX", // from x/b
                "XXX XXX XXX", // from x/c
                "... ... ...", // from y/a
                "... ... ...", // from y/b
                "... ... ...", // from y/c
                "XXX ... ...", // from z/a
                "XXX ... ...", // from z/b
                "XXX ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: an Admin Pass both ways defers to the NetworkPolicy both ways (CNPAdminTierIntegration: Should support a 'pass-egress' policy for admin CNP and respect the match for network policy)",
        steps: &[Step {
            change: Change::Policies(concat!(
                admin_x_y!("Pass", "Pass"),
                np_x_only_with_y!(),
                baseline_x_y_apart!()
            )),
            checks: both!([
                "XXX ... XXX", // from x/a
                "XXX ... XXX", // from x/b
                "XXX ... XXX", // from x/c
                "... ... ...", // from y/a
                "... ... ...", // from y/b
                "... ... ...", // from y/c
                "XXX ... ...", // from z/a
                "XXX ... ...", // from z/b
                "XXX ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: an Admin Pass with no NetworkPolicy leaves the decision to the Baseline Deny (CNPAdminTierIntegration: Should support a 'pass-ingress' policy for admin CNP and respect the match for baseline cluster network policy; the same for 'pass-egress')",
        steps: &[Step {
            change: Change::Policies(concat!(admin_x_y!("Pass", "Pass"), baseline_x_y_apart!())),
            checks: both!(X_Y_APART),
        }],
    },
    Case {
        name: "CNP: an Admin Accept beats a NetworkPolicy deny, and the first matching rule decides (CNPAdminTierIngressTCP: Should support an 'allow-ingress' policy for TCP protocol; ensure rule ordering is respected)",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: ingress-tcp }
spec:
  tier: Admin
  priority: 3
  subject: { namespaces: { matchLabels: { kubernetes.io/metadata.name: "x" } } }
  ingress:
  - { name: allow-from-z-everything, action: Accept, from: [{ namespaces: { matchLabels: { kubernetes.io/metadata.name: "z" } } }] }
  - { name: deny-from-z-everything, action: Deny, from: [{ namespaces: { matchLabels: { kubernetes.io/metadata.name: "z" } } }] }
  - { name: pass-from-z-everything, action: Pass, from: [{ namespaces: { matchLabels: { kubernetes.io/metadata.name: "z" } } }] }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: default-deny-ingress, namespace: "x" }
spec:
  podSelector: {}
  policyTypes: [Ingress]
"#,
            ),
            // Only z, accepted by the Admin tier, reaches x; the NetworkPolicy denies
            // the rest.
            checks: both!([
                "XXX ... ...", // from x/a
                "XXX ... ...", // from x/b
                "XXX ... ...", // from x/c
                "XXX ... ...", // from y/a
                "XXX ... ...", // from y/b
                "XXX ... ...", // from y/c
                "... ... ...", // from z/a
                "... ... ...", // from z/b
                "... ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: among Admin policies the lower priority decides; a Pass moved ahead of a Deny leaves it to the Baseline Accept (CNPAdminTierPriorityField: Should Deny traffic from slytherin to gryffindor respecting admin CNP; Should respect admin CNP priority field; thus passing both ingress and egress traffic over to baseline CNP)",
        steps: &[
            Step {
                change: Change::Policies(priority_case!("60")),
                checks: both!(X_Y_APART),
            },
            Step {
                change: Change::Policies(priority_case!("40")),
                checks: both!(ALL),
            },
        ],
    },
    Case {
        name: "CNP: a Baseline Deny applies only to pods no NetworkPolicy isolates (CNPAdminTierIntegration: Should support a 'pass-ingress' policy for admin CNP and respect the match for network policy, without the Admin tier)",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: default }
spec:
  tier: Baseline
  priority: 10
  subject: { namespaces: { matchLabels: { ns: "x" } } }
  ingress:
  - { name: deny-all-ingress-from-y, action: Deny, from: [{ namespaces: { matchLabels: { ns: "y" } } }] }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-y-to-a, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ namespaceSelector: { matchLabels: { ns: "y" } } }]
"#,
            ),
            // x/a is isolated and allows y only; x/b and x/c are not, so the Baseline
            // Deny keeps y out of them.
            checks: both!([
                "X.. ... ...", // from x/a
                "X.. ... ...", // from x/b
                "X.. ... ...", // from x/c
                ".XX ... ...", // from y/a
                ".XX ... ...", // from y/b
                ".XX ... ...", // from y/c
                "X.. ... ...", // from z/a
                "X.. ... ...", // from z/b
                "X.. ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: egress to networks: an Accept to pods ahead of a Deny of 0.0.0.0/0 and ::/0, then an Accept of two /32s put first (CNPAdminTierEgressInlineCIDRPeers: Should support a 'deny-egress' rule policy for egress-cidr-peer; Should support an 'allow-egress' rule policy for egress-cidr-peer)",
        steps: &[
            Step {
                change: Change::Policies(cidr_case!("")),
                checks: both!([
                    "XXX ... XXX", // from x/a
                    "XXX ... XXX", // from x/b
                    "XXX ... XXX", // from x/c
                    "... ... ...", // from y/a
                    "... ... ...", // from y/b
                    "... ... ...", // from y/c
                    "... ... ...", // from z/a
                    "... ... ...", // from z/b
                    "... ... ...", // from z/c
                ]),
            },
            Step {
                change: Change::Policies(cidr_case!(
                    "  - { name: allow-egress-to-two-pods, action: Accept, to: [{ networks: [\"{ip:x/b}/32\", \"{ip:z/a}/32\"] }] }\n"
                )),
                checks: both!([
                    "X.X ... .XX", // from x/a
                    "X.X ... .XX", // from x/b
                    "X.X ... .XX", // from x/c
                    "... ... ...", // from y/a
                    "... ... ...", // from y/b
                    "... ... ...", // from y/c
                    "... ... ...", // from z/a
                    "... ... ...", // from z/b
                    "... ... ...", // from z/c
                ]),
            },
        ],
    },
    Case {
        name: "CNP: a Baseline egress Deny of 0.0.0.0/0 holds for pods no NetworkPolicy isolates, not for x/a that one allows (CNPBaselineTierEgressInlineCIDRPeers: Should support a 'deny-egress' rule policy for egress-cidr-peer, with a NetworkPolicy on x/a)",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: default }
spec:
  tier: Baseline
  priority: 10
  subject: { namespaces: { matchLabels: { kubernetes.io/metadata.name: "x" } } }
  egress:
  - { name: allow-egress-to-y, action: Accept, to: [{ pods: { namespaceSelector: { matchLabels: { ns: "y" } }, podSelector: {} } }] }
  - { name: deny-egress-to-internet, action: Deny, to: [{ networks: ["0.0.0.0/0", "::/0"] }] }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: a-may-send-anywhere, namespace: "x" }
spec:
  podSelector: { matchLabels: { pod: a } }
  policyTypes: [Egress]
  egress: [{}]
"#,
            ),
            checks: both!([
                "... ... ...", // from x/a
                "XXX ... XXX", // from x/b
                "XXX ... XXX", // from x/c
                "... ... ...", // from y/a
                "... ... ...", // from y/b
                "... ... ...", // from y/c
                "... ... ...", // from z/a
                "... ... ...", // from z/b
                "... ... ...", // from z/c
            ]),
        }],
    },
    Case {
        name: "CNP: an Admin Accept on a destination named port, a Deny for the rest (CNPAdminTierIngressNamedPort: Should support an 'allow-ingress' policy for named port)",
        steps: &[Step {
            change: Change::Policies(
                r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: ingress-named-port }
spec:
  tier: Admin
  priority: 16
  subject: { namespaces: { matchLabels: { ns: "x" } } }
  ingress:
  - { name: allow-y-on-serve-80-tcp, action: Accept, from: [{ namespaces: { matchLabels: { ns: "y" } } }], protocols: [{ destinationNamedPort: serve-80-tcp }] }
  - { name: deny-y-everything-else, action: Deny, from: [{ namespaces: { matchLabels: { ns: "y" } } }] }
"#,
            ),
            // serve-80-tcp is TCP 80: UDP 80 and TCP 81 from y are denied.
            checks: &[
                Check {
                    port: "tcp/80",
                    grid: ALL,
                },
                Check {
                    port: "tcp/81",
                    grid: Y_NOT_TO_X,
                },
                Check {
                    port: "udp/80",
                    grid: Y_NOT_TO_X,
                },
            ],
        }],
    },
];

/// y may not reach x; the rest is open.
const Y_NOT_TO_X: [&str; 9] = [
    "... ... ...", // from x/a
    "... ... ...", // from x/b
    "... ... ...", // from x/c
    "XXX ... ...", // from y/a
    "XXX ... ...", // from y/b
    "XXX ... ...", // from y/c
    "... ... ...", // from z/a
    "... ... ...", // from z/b
    "... ... ...", // from z/c
];
