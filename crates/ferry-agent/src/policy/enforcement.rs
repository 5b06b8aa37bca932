//! What of the policies is not enforced as their objects say, for `ferry status`, the
//! metrics and `ferry policy list`: ferry never fails open silently.
//!
//! A policy is reported, as long as it lasts, when
//!
//! - its datastore refused its latest version (a bad selector, CIDR, port or port name):
//!   the Kubernetes datastore keeps the refusal with the state
//!   ([`Cluster::refused`]) until a good version comes or the object goes; the file
//!   datastore refuses its whole directory, and the policies its problems name are told
//!   until the directory reads well again. What is in force of it is then an older
//!   version, or nothing;
//! - the datastore's latest state is not in force (it did not compile, the worker did
//!   not take it): the policies it changes are in force in their older version, or not
//!   at all, or, deleted, still in force;
//! - it is in force but compiled otherwise than it says in part: a ClusterNetworkPolicy
//!   peer with no field ferry knows (fails closed: a Deny or Pass rule matches every
//!   peer, an Accept rule ignores it). (A pod of this node is reached by its port's
//!   addresses, also while its Pod object says none: see
//!   [`crate::compile::policy::Held::with_ports`].)
//!
//! What is the defined meaning of a policy is not reported: a named port no pod has, a
//! selector that selects nothing, a host-network pod (not subject to policy).

use std::collections::{BTreeMap, BTreeSet};

use ferry_api::{Enforcement, PolicyEnforcement, UnenforcedPolicy};

use super::{Action, ClusterNetworkPolicyFields};
use crate::cluster::{Cluster, Kind, ObjectKey};
use crate::datastore::Problem;

/// What the report is made from besides the state in force.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sources<'a> {
    /// The datastore's latest state (its refusals included); None: the state in force.
    pub latest: Option<&'a Cluster>,
    /// Why the latest state is not in force, when it is not.
    pub not_applied: Option<&'a str>,
    /// The problems of the file datastore's refusal of its latest directory, while it
    /// stands.
    pub file_refused: Option<&'a [Problem]>,
}

/// The policies of `in_force` (the state whose tables are in force, for this node's
/// pods `local`) and those not enforced as written, by kind and name.
pub fn report(in_force: &Cluster, sources: Sources<'_>) -> PolicyEnforcement {
    let latest = sources.latest.unwrap_or(in_force);
    let mut out: BTreeMap<(Kind, ObjectKey), UnenforcedPolicy> = BTreeMap::new();
    let mut put = |kind: Kind, key: &ObjectKey, u: UnenforcedPolicy| {
        out.entry((kind, key.clone()))
            .and_modify(|e| e.reasons.extend(u.reasons.iter().cloned()))
            .or_insert(u);
    };
    // Refused by the Kubernetes datastore.
    for ((kind, key), r) in latest.refused() {
        let reasons = r.errors.iter().map(|e| format!("refused: {e}")).collect();
        let u = UnenforcedPolicy {
            latest_version: version(&r.resource_version, r.generation),
            ..entry(in_force, *kind, key, reasons)
        };
        put(*kind, key, u);
    }
    // Refused by the file datastore, with its whole directory.
    for p in sources.file_refused.into_iter().flatten() {
        let Some((kind, key)) = p.object.as_deref().and_then(policy_named) else {
            continue;
        };
        let reason = format!("refused: {}", without_object(p));
        put(kind, &key, entry(in_force, kind, &key, vec![reason]));
    }
    // Changed in the datastore's latest state, which is not in force.
    if !std::ptr::eq(latest, in_force) {
        let why = sources.not_applied.unwrap_or("not put in force yet");
        for (kind, key) in policy_changes(in_force, latest) {
            let reason = format!("the datastore's latest state is not in force: {why}");
            let mut u = entry(in_force, kind, &key, vec![reason]);
            if !latest.contains(kind, &key) {
                u.state = Enforcement::StillEnforced;
            }
            u.latest_version = object_version(latest, kind, &key);
            put(kind, &key, u);
        }
    }
    // In force, with what they say in part not enforced.
    let (mut network_policies, mut cluster_network_policies) = (0, 0);
    for (key, f) in in_force.all_network_policy_fields() {
        match f {
            Ok(_) => network_policies += 1,
            Err(errors) => {
                let reasons = errors
                    .iter()
                    .map(|e| format!("not compiled: {e}"))
                    .collect();
                put(
                    Kind::NetworkPolicy,
                    key,
                    entry(in_force, Kind::NetworkPolicy, key, reasons),
                );
            }
        }
    }
    for (key, f) in in_force.all_cluster_network_policy_fields() {
        let kind = Kind::ClusterNetworkPolicy;
        match f {
            Ok(f) => {
                cluster_network_policies += 1;
                let reasons = unknown_peers(f);
                if !reasons.is_empty() {
                    put(kind, key, deviation(in_force, kind, key, reasons));
                }
            }
            Err(errors) => {
                let reasons = errors
                    .iter()
                    .map(|e| format!("not compiled: {e}"))
                    .collect();
                put(kind, key, entry(in_force, kind, key, reasons));
            }
        }
    }
    let stale = match (sources.file_refused, sources.not_applied) {
        (Some(_), _) => Some(
            "the file datastore refuses its directory's latest state: the policies in force are those of its last good state".to_string(),
        ),
        (None, Some(e)) => Some(format!(
            "the datastore's latest state is not in force, nor its changes of policies, pods and namespaces: {e}"
        )),
        (None, None) => None,
    };
    PolicyEnforcement {
        network_policies,
        cluster_network_policies,
        unenforced: out.into_values().collect(),
        stale,
    }
}

/// A policy whose latest version is not in force, with `reasons`: an older version is,
/// when `in_force` has one with good fields, else nothing.
fn entry(
    in_force: &Cluster,
    kind: Kind,
    key: &ObjectKey,
    reasons: Vec<String>,
) -> UnenforcedPolicy {
    let good = match kind {
        Kind::NetworkPolicy => in_force
            .network_policy_fields(key)
            .is_some_and(|f| f.is_ok()),
        _ => (in_force.cluster_network_policy_fields(&key.name)).is_some_and(|f| f.is_ok()),
    };
    UnenforcedPolicy {
        kind: kind.name().to_string(),
        policy: key.to_string(),
        state: if good {
            Enforcement::OlderVersion
        } else {
            Enforcement::NotEnforced
        },
        enforced_version: good.then(|| object_version(in_force, kind, key)).flatten(),
        latest_version: None,
        reasons,
    }
}

/// A policy in force that is enforced otherwise than it says, for `reasons`.
fn deviation(
    in_force: &Cluster,
    kind: Kind,
    key: &ObjectKey,
    reasons: Vec<String>,
) -> UnenforcedPolicy {
    UnenforcedPolicy {
        state: Enforcement::Deviation,
        ..entry(in_force, kind, key, reasons)
    }
}

/// `resourceVersion R, generation G`, of what is known.
fn version(resource_version: &Option<String>, generation: Option<i64>) -> Option<String> {
    match (resource_version, generation) {
        (None, None) => None,
        (Some(r), None) => Some(format!("resourceVersion {r}")),
        (None, Some(g)) => Some(format!("generation {g}")),
        (Some(r), Some(g)) => Some(format!("resourceVersion {r}, generation {g}")),
    }
}

/// The version of the policy of `kind` at `key` in `c`.
fn object_version(c: &Cluster, kind: Kind, key: &ObjectKey) -> Option<String> {
    let meta = match kind {
        Kind::NetworkPolicy => &c.network_policies.get(key)?.metadata,
        _ => &c.cluster_network_policies.get(key)?.metadata,
    };
    version(&meta.resource_version, meta.generation)
}

/// The policies that differ between `a` and `b`: added, changed or removed.
fn policy_changes(a: &Cluster, b: &Cluster) -> Vec<(Kind, ObjectKey)> {
    fn walk<T: PartialEq>(
        kind: Kind,
        a: &BTreeMap<ObjectKey, T>,
        b: &BTreeMap<ObjectKey, T>,
    ) -> Vec<(Kind, ObjectKey)> {
        let keys: BTreeSet<&ObjectKey> = a.keys().chain(b.keys()).collect();
        keys.into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| (kind, k.clone()))
            .collect()
    }
    let mut out = walk(
        Kind::NetworkPolicy,
        &a.network_policies,
        &b.network_policies,
    );
    out.extend(walk(
        Kind::ClusterNetworkPolicy,
        &a.cluster_network_policies,
        &b.cluster_network_policies,
    ));
    out
}

/// The policy a problem's object names (`NetworkPolicy NS/NAME`,
/// `ClusterNetworkPolicy NAME`), if it is one.
fn policy_named(object: &str) -> Option<(Kind, ObjectKey)> {
    let (kind, name) = object.split_once(' ')?;
    match kind {
        "NetworkPolicy" => {
            let (ns, name) = name.split_once('/')?;
            Some((Kind::NetworkPolicy, ObjectKey::new(ns, name)))
        }
        "ClusterNetworkPolicy" => {
            Some((Kind::ClusterNetworkPolicy, ObjectKey::cluster_scoped(name)))
        }
        _ => None,
    }
}

/// `file[:line]: [field: ]message`: a problem without the object it names.
fn without_object(p: &Problem) -> String {
    let mut s = p.file.clone();
    if let Some(l) = p.line {
        s.push_str(&format!(":{l}"));
    }
    if let Some(f) = &p.field {
        s.push_str(&format!(": {f}"));
    }
    format!("{s}: {}", p.message)
}

/// The rules of `f` with a peer ferry does not know, and what ferry does with it.
fn unknown_peers(f: &ClusterNetworkPolicyFields) -> Vec<String> {
    let mut out = Vec::new();
    for (dir, rules) in [("ingress", &f.ingress), ("egress", &f.egress)] {
        for r in rules {
            let base = format!("spec.{dir}[{}].", r.index);
            for w in f.warnings.iter().filter(|w| w.field.starts_with(&base)) {
                let (action, what) = match r.action {
                    Action::Accept => ("an Accept", "ignored"),
                    Action::Deny => ("a Deny", "matches every peer: fails closed"),
                    Action::Pass => ("a Pass", "matches every peer: fails closed"),
                };
                out.push(format!(
                    "{}: a peer with no field ferry knows, in {action} rule: {what}",
                    w.field
                ));
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "enforcement_tests.rs"]
mod tests;
