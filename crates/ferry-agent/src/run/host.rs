//! What the agent keeps in step on the host besides its ports: the node port rewrites
//! for the node's own processes ([`host_nat`]), and the warnings about kernel routes and
//! netfilter rules left by another dataplane ([`leftovers`]). Both only with a host
//! port: without one, the node's processes do not reach ferry.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Instant;

use ferry_datapath::Tables;

use crate::host_nat;
use crate::leftovers;

use super::LEFTOVERS_EVERY;

/// The host's state as the agent last set or found it.
pub(super) struct Host {
    /// The node-port rewrites for the node's own processes in force ([`host_nat`]).
    nat: Option<(Vec<IpAddr>, BTreeSet<host_nat::Rule>)>,
    /// The kernel routes past ferry found last ([`leftovers`]), each warned about once.
    strays: BTreeSet<leftovers::Stray>,
    /// Other dataplanes' netfilter chains found last, by table, each warned about once.
    rule_leftovers: BTreeSet<String>,
    /// When [`Host::check_leftovers`] is due next ([`LEFTOVERS_EVERY`]).
    leftovers_due: Instant,
}

impl Host {
    /// Nothing set, nothing found yet; leftovers are due at once.
    pub(super) fn new() -> Host {
        Host {
            nat: None,
            strays: BTreeSet::new(),
            rule_leftovers: BTreeSet::new(),
            leftovers_due: Instant::now(),
        }
    }

    /// True once it is time to look for leftovers again.
    pub(super) fn leftovers_due(&self, now: Instant) -> bool {
        now >= self.leftovers_due
    }

    /// Keeps the node's own processes' node port rewrites in step with `tables` (only
    /// with a host port, `host_tap`).
    pub(super) fn set_nat(&mut self, host_tap: Option<&str>, tables: &Tables) {
        if host_tap.is_none() {
            return;
        }
        let want = host_nat::rules(tables);
        if self.nat.as_ref() == Some(&want) {
            return;
        }
        match host_nat::apply(&host_nat::script(&want.0, &want.1)) {
            Ok(()) => self.nat = Some(want),
            Err(e) => tracing::warn!(
                error = %e,
                "node ports are not rewritten for the node's own processes"
            ),
        }
    }

    /// Removes the node port rewrites, when some are in force.
    pub(super) fn remove_nat(&mut self) {
        if self.nat.take().is_some()
            && let Err(e) = host_nat::remove()
        {
            tracing::warn!(error = %e, "ferry's nftables tables were not removed");
        }
    }

    /// Warns once about each kernel route that takes the node's own traffic to the
    /// cluster addresses of `tables` past the host port `host_tap`, and about each table
    /// of another dataplane's netfilter chains (only with a host port).
    pub(super) fn check_leftovers(&mut self, host_tap: Option<&str>, tables: &Tables) {
        // Two commands run: at start, then every LEFTOVERS_EVERY, not at every change.
        self.leftovers_due = Instant::now() + LEFTOVERS_EVERY;
        let Some(host) = host_tap else {
            return;
        };
        let prefixes = leftovers::cluster_prefixes(tables);
        let found = leftovers::kernel_routes().and_then(|families| {
            let mut all = BTreeSet::new();
            for json in families {
                all.extend(leftovers::strays(&json, &prefixes, host)?);
            }
            Ok(all)
        });
        match found {
            Ok(found) => {
                for s in found.difference(&self.strays) {
                    tracing::warn!(
                        route = %s.route,
                        covers = %s.covers,
                        "a kernel route takes the node's own traffic to cluster addresses past \
                         ferry (left by a previous network plugin?); remove it with `ip route \
                         del {}`",
                        s.route
                    );
                }
                self.strays = found;
            }
            Err(e) => tracing::warn!(error = %e, "the kernel's routes were not checked"),
        }
        match leftovers::kernel_chains().and_then(|json| leftovers::rule_leftovers(&json)) {
            Ok(found) => {
                let found: BTreeSet<String> = found.into_iter().collect();
                for t in found.difference(&self.rule_leftovers) {
                    tracing::warn!(
                        rules = %t,
                        "another dataplane's netfilter rules are in place: they see the \
                         node's own connections (not what ferry forwards) and may rewrite \
                         or drop them; remove them (kube-proxy's: `kube-proxy --cleanup`)"
                    );
                }
                self.rule_leftovers = found;
            }
            Err(e) => tracing::warn!(error = %e, "the netfilter rules were not checked"),
        }
    }
}
