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
//!
//! One module per thing the cases exercise: `selectors`, `ports` (and protocols,
//! with the UDP cases), `egress`, `changes` (updates and deletions while the suite
//! runs) and `ip_blocks`.

mod changes;
mod egress;
mod ip_blocks;
mod ports;
mod selectors;

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

/// Every cell reached.
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

/// The upstream cases, TCP then UDP within each group, grouped by what they exercise:
/// selectors, ports and protocols, egress, changes, ipBlocks; within a group in the
/// upstream file's order.
pub fn all() -> impl Iterator<Item = &'static Case> {
    (selectors::CASES.iter())
        .chain(ports::CASES)
        .chain(egress::CASES)
        .chain(changes::CASES)
        .chain(ip_blocks::CASES)
}
