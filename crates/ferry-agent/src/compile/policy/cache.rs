//! Compiling the policy section again after a change, redoing only what the change
//! touches (as Calico's label index and Cilium's selector cache do).
//!
//! The cache keeps, from one compilation to the next, each rule as resolved (its peers'
//! blocks and ports) with what of the cluster it read ([`Deps`]), and for each pod of
//! this node the policies whose subjects select it. Given the objects that changed
//! ([`Changes::Only`]), it forgets what they may have changed:
//!
//! - a NetworkPolicy or ClusterNetworkPolicy: its rules, and whether it selects each
//!   pod of this node (asked again of that policy alone);
//! - a Namespace (its labels): the rules that selected namespaces by label, and which
//!   ClusterNetworkPolicies select the pods of this node in that namespace;
//! - a pod of another node: the rules that read the pods of its namespace (its own, or
//!   one their namespace selector selects) or every pod.
//!
//! Anything else (a pod of this node, a Node, options, the node's pods) compiles
//! everything again ([`Changes::All`]). The section is then put together from the
//! rules, kept or resolved again, in the same order as a compilation from nothing, so
//! that both give the same section (the tests check it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ferry_datapath::policy::{
    BlockSpec, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec, RuleSpec, SetSpec,
};

use super::rules::{
    Blocks, Dir, Resolved, Resolver, RuleKey, cnp_rule, cnp_rule_key, name_label, np_rule,
    np_rule_key, ns_matches,
};
use super::{Inputs, PodView, PolicyOptions};
use crate::cluster::{Kind, ObjectKey};
use crate::policy::{ClusterNetworkPolicyFields, NetworkPolicyFields, Tier};

/// What changed since the cache's last compilation.
#[derive(Clone, Copy, Debug)]
pub enum Changes<'c> {
    /// Anything: compile from nothing.
    All,
    /// These objects ([`crate::cluster::Cluster::diff`]), and nothing else.
    Only(&'c [(Kind, ObjectKey)]),
}

/// The policies whose subjects select one pod of this node.
#[derive(Clone, Debug, Default)]
struct Subjects {
    cluster: BTreeSet<String>,
    network: BTreeSet<ObjectKey>,
}

type Fast<K, V> = HashMap<K, V, ahash::RandomState>;

/// What one compilation leaves for the next (see the [module](self)).
#[derive(Clone, Debug, Default)]
pub struct PolicyCache {
    /// The pods and options it was built for.
    built_for: Option<(BTreeMap<ObjectKey, String>, PolicyOptions)>,
    rules: Fast<RuleKey, Arc<Resolved>>,
    sets: HashMap<Vec<BlockSpec>, Blocks>,
    subjects: BTreeMap<ObjectKey, Subjects>,
    /// What each pod of this node put into the last section, in order.
    ops: BTreeMap<ObjectKey, Vec<Op>>,
    /// Pods whose policies changed since: their ops are to be made again.
    dirty: BTreeSet<ObjectKey>,
    /// Rules forgotten since the last compilation (by their resolution's allocation,
    /// which the ops that hold them keep alive): the ops holding one are made again.
    forgotten: Fast<usize, ()>,
    /// Rules the last compilation resolved (the others it kept).
    resolved: usize,
}

/// Which list of a direction a rule goes to.
#[derive(Clone, Copy, Debug)]
enum List {
    Admin,
    Allow,
    Baseline,
}

/// One step of putting a pod's policy into the section, kept so that a pod whose
/// policies did not change is put in again without looking anything up.
#[derive(Clone, Debug)]
enum Op {
    /// The policy the next steps are of.
    Policy(Arc<str>),
    /// The policy isolates the pod in this direction (0: ingress, 1: egress).
    Isolate(usize),
    /// A rule of the policy, in a direction's list.
    Rule(usize, List, Arc<Resolved>),
}

fn np_name(key: &ObjectKey) -> String {
    format!("NetworkPolicy {key}")
}

fn cnp_name(name: &str) -> String {
    format!("ClusterNetworkPolicy {name}")
}

fn cnp_selects(inputs: &Inputs<'_>, c: &ClusterNetworkPolicyFields, pod: &PodView<'_>) -> bool {
    ns_matches(inputs, &pod.key.namespace, &c.subject.namespaces)
        && c.subject.pods.matches(pod.labels)
}

fn find_np<'a>(inputs: &Inputs<'a>, key: &ObjectKey) -> Option<&'a NetworkPolicyFields> {
    let i = (inputs.network_policies)
        .binary_search_by(|(k, _)| (*k).cmp(key))
        .ok()?;
    Some(inputs.network_policies[i].1)
}

fn find_cnp<'a>(inputs: &Inputs<'a>, name: &str) -> Option<&'a ClusterNetworkPolicyFields> {
    let i = (inputs.cluster_policies)
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()?;
    Some(inputs.cluster_policies[i].1)
}

fn pod_of<'i, 'a>(inputs: &'i Inputs<'a>, key: &ObjectKey) -> Option<&'i PodView<'a>> {
    let i = inputs.pods.binary_search_by(|p| p.key.cmp(key)).ok()?;
    Some(&inputs.pods[i])
}

impl PolicyCache {
    /// An empty cache: its first compilation starts from nothing.
    pub fn new() -> PolicyCache {
        PolicyCache::default()
    }

    /// How many rules the last compilation resolved; the rest of its rules it kept.
    pub fn resolved(&self) -> usize {
        self.resolved
    }

    /// The policy section for the pod ports `local` (pod key -> port name) of the
    /// cluster `inputs`, of which `changes` says what changed since the cache's last
    /// compilation.
    pub fn compile(
        &mut self,
        inputs: &Inputs<'_>,
        local: &BTreeMap<ObjectKey, String>,
        opts: PolicyOptions,
        changes: Changes<'_>,
    ) -> PolicySpec {
        debug_assert!(inputs.pods.is_sorted_by_key(|p| p.key), "pods in key order");
        debug_assert!(
            (inputs.network_policies.is_sorted_by_key(|(k, _)| *k))
                && inputs.cluster_policies.is_sorted_by_key(|(n, _)| *n),
            "policies in key order"
        );
        let same_base = (self.built_for.as_ref()).is_some_and(|(l, o)| l == local && *o == opts);
        match changes {
            Changes::Only(changed) if same_base && self.forget(inputs, local, changed) => {}
            _ => self.reset(inputs, local, opts),
        }
        self.assemble(inputs, local, opts)
    }

    /// Starts from nothing: every rule to resolve, every subject to ask.
    fn reset(
        &mut self,
        inputs: &Inputs<'_>,
        local: &BTreeMap<ObjectKey, String>,
        opts: PolicyOptions,
    ) {
        self.built_for = Some((local.clone(), opts));
        self.rules.clear();
        self.subjects.clear();
        self.ops.clear();
        self.dirty.clear();
        self.forgotten.clear();
        let mut by_ns: HashMap<&str, Vec<&ObjectKey>> = HashMap::new();
        for (k, _) in &inputs.network_policies {
            by_ns.entry(k.namespace.as_str()).or_default().push(k);
        }
        for key in local.keys() {
            let Some(pod) = pod_of(inputs, key) else {
                continue;
            };
            let mut s = Subjects::default();
            for (name, c) in &inputs.cluster_policies {
                if cnp_selects(inputs, c, pod) {
                    s.cluster.insert(name.to_string());
                }
            }
            for k in by_ns.get(key.namespace.as_str()).into_iter().flatten() {
                if find_np(inputs, k).is_some_and(|np| np.pod_selector.matches(pod.labels)) {
                    s.network.insert((*k).clone());
                }
            }
            self.subjects.insert(key.clone(), s);
        }
    }

    /// Forgets what `changed` may have changed. False when it cannot tell (a change
    /// the cache does not follow): everything is to be compiled again.
    fn forget(
        &mut self,
        inputs: &Inputs<'_>,
        local: &BTreeMap<ObjectKey, String>,
        changed: &[(Kind, ObjectKey)],
    ) -> bool {
        let mut policies: BTreeSet<String> = BTreeSet::new();
        let mut labels_of: BTreeSet<&str> = BTreeSet::new();
        let mut pods_of: BTreeSet<&str> = BTreeSet::new();
        for (kind, key) in changed {
            match kind {
                Kind::NetworkPolicy => {
                    policies.insert(np_name(key));
                    let np = find_np(inputs, key);
                    for (pk, s) in self.subjects.iter_mut() {
                        if pk.namespace != key.namespace {
                            continue;
                        }
                        let selects = pod_of(inputs, pk).is_some_and(|p| {
                            np.is_some_and(|np| np.pod_selector.matches(p.labels))
                        });
                        if selects || s.network.contains(key) {
                            self.dirty.insert(pk.clone());
                        }
                        if selects {
                            s.network.insert(key.clone());
                        } else {
                            s.network.remove(key);
                        }
                    }
                }
                Kind::ClusterNetworkPolicy => {
                    policies.insert(cnp_name(&key.name));
                    let c = find_cnp(inputs, &key.name);
                    for (pk, s) in self.subjects.iter_mut() {
                        let selects = pod_of(inputs, pk)
                            .is_some_and(|p| c.is_some_and(|c| cnp_selects(inputs, c, p)));
                        if selects || s.cluster.contains(&key.name) {
                            self.dirty.insert(pk.clone());
                        }
                        if selects {
                            s.cluster.insert(key.name.clone());
                        } else {
                            s.cluster.remove(&key.name);
                        }
                    }
                }
                Kind::Namespace => {
                    labels_of.insert(key.name.as_str());
                }
                Kind::Pod if !local.contains_key(key) => {
                    pods_of.insert(key.namespace.as_str());
                }
                Kind::Pod | Kind::Node | Kind::Service | Kind::EndpointSlice | Kind::ConfigMap => {
                    return false;
                }
            }
        }
        // A namespace's labels decide which ClusterNetworkPolicies select its pods.
        for ns in &labels_of {
            for (pk, s) in self.subjects.iter_mut() {
                if pk.namespace != *ns {
                    continue;
                }
                self.dirty.insert(pk.clone());
                s.cluster.clear();
                let Some(pod) = pod_of(inputs, pk) else {
                    continue;
                };
                for (name, c) in &inputs.cluster_policies {
                    if cnp_selects(inputs, c, pod) {
                        s.cluster.insert(name.to_string());
                    }
                }
            }
        }
        let ns_labels: Vec<(&str, BTreeMap<String, String>)> = pods_of
            .iter()
            .map(|ns| {
                let labels = match inputs.namespaces.get(ns) {
                    Some(l) => (*l).clone(),
                    None => name_label(ns),
                };
                (*ns, labels)
            })
            .collect();
        let forgotten = &mut self.forgotten;
        self.rules.retain(|key, r| {
            let stale = policies.contains(&*key.policy)
                || (!labels_of.is_empty() && r.deps.reads_namespace_labels())
                || ns_labels
                    .iter()
                    .any(|(ns, labels)| r.deps.reads_pods_of(ns, labels));
            if stale {
                forgotten.insert(Arc::as_ptr(r).addr(), ());
            }
            !stale
        });
        true
    }

    /// The section, from the subjects and the rules kept or resolved now.
    fn assemble(
        &mut self,
        inputs: &Inputs<'_>,
        local: &BTreeMap<ObjectKey, String>,
        opts: PolicyOptions,
    ) -> PolicySpec {
        let mut out = Section {
            spec: PolicySpec {
                host_to_pods: opts.host_to_pods,
                reevaluate: opts.reevaluate,
                ..PolicySpec::default()
            },
            ..Section::default()
        };
        self.resolved = 0;
        let mut rules = Rules {
            kept: &mut self.rules,
            resolver: Resolver::new(inputs, &mut self.sets),
            resolved: &mut self.resolved,
        };
        for (key, port) in local {
            let (Some(pod), Some(subjects)) = (pod_of(inputs, key), self.subjects.get(key)) else {
                continue;
            };
            let kept = self.ops.get(key).filter(|ops| {
                !self.dirty.contains(key)
                    && (self.forgotten.is_empty()
                        || !ops.iter().any(|op| {
                            matches!(op, Op::Rule(_, _, r)
                                if self.forgotten.contains_key(&Arc::as_ptr(r).addr()))
                        }))
            });
            let ops = match kept {
                Some(ops) => ops,
                None => {
                    let ops = pod_ops(inputs, pod, subjects, &mut rules);
                    self.ops.insert(key.clone(), ops);
                    &self.ops[key]
                }
            };
            let mut dirs = [DirectionSpec::default(), DirectionSpec::default()];
            let mut policy = 0;
            for op in ops {
                match op {
                    Op::Policy(name) => policy = out.policy(name),
                    Op::Isolate(d) => dirs[*d].isolated_by.push(policy),
                    Op::Rule(d, list, r) => {
                        let id = out.rule(policy, r);
                        let list = match list {
                            List::Admin => &mut dirs[*d].admin,
                            List::Allow => &mut dirs[*d].allow,
                            List::Baseline => &mut dirs[*d].baseline,
                        };
                        list.push(id);
                    }
                }
            }
            let [ingress, egress] = dirs;
            if ingress != DirectionSpec::default() || egress != DirectionSpec::default() {
                out.spec.pods.push(PodPolicySpec {
                    port: port.clone(),
                    ingress,
                    egress,
                });
            }
        }
        self.dirty.clear();
        self.forgotten.clear();
        self.ops.retain(|k, _| local.contains_key(k));
        // What no pod uses any more goes.
        self.rules
            .retain(|_, r| out.rule_ids.contains_key(&Arc::as_ptr(r).addr()));
        self.sets.retain(|_, b| Arc::strong_count(b) > 1);
        out.spec
    }
}

/// The rules' resolutions, kept or made now.
struct Rules<'m, 'a, 'c> {
    kept: &'m mut Fast<RuleKey, Arc<Resolved>>,
    resolver: Resolver<'a, 'c>,
    /// How many were made now.
    resolved: &'m mut usize,
}

impl Rules<'_, '_, '_> {
    /// The resolution of the rule `key`: kept, or made now by `resolve`.
    fn get(
        &mut self,
        key: RuleKey,
        resolve: impl FnOnce(&mut Resolver) -> Resolved,
    ) -> Arc<Resolved> {
        if let Some(r) = self.kept.get(&key) {
            return Arc::clone(r);
        }
        *self.resolved += 1;
        let r = Arc::new(resolve(&mut self.resolver));
        self.kept.insert(key, Arc::clone(&r));
        r
    }
}

/// What pod `pod`, selected by `subjects`, puts into the section: its
/// ClusterNetworkPolicies in evaluation order with their rules, then its
/// NetworkPolicies with theirs, each rule's resolution from `rules_of`.
fn pod_ops(
    inputs: &Inputs<'_>,
    pod: &PodView<'_>,
    subjects: &Subjects,
    rules_of: &mut Rules<'_, '_, '_>,
) -> Vec<Op> {
    let mut ops = Vec::new();
    // Tiers in evaluation order: priority, then name (the API leaves ties to the
    // implementation; by name, every node orders them alike).
    let mut tiers: Vec<(bool, u16, &str, &ClusterNetworkPolicyFields)> = (subjects.cluster)
        .iter()
        .filter_map(|n| {
            let c = find_cnp(inputs, n)?;
            Some((c.tier == Tier::Baseline, c.priority, n.as_str(), c))
        })
        .collect();
    tiers.sort_by_key(|(b, p, n, _)| (*b, *p, *n));
    for (baseline, _, name, c) in tiers {
        let full: Arc<str> = Arc::from(cnp_name(name));
        ops.push(Op::Policy(Arc::clone(&full)));
        let list = if baseline {
            List::Baseline
        } else {
            List::Admin
        };
        for (i, (dir, rules)) in [(Dir::Ingress, &c.ingress), (Dir::Egress, &c.egress)]
            .into_iter()
            .enumerate()
        {
            for r in rules {
                let k = cnp_rule_key(&full, dir, r, pod);
                let resolved = rules_of.get(k, |res| cnp_rule(res, name, dir, r, pod));
                ops.push(Op::Rule(i, list, resolved));
            }
        }
    }
    for pkey in &subjects.network {
        let Some(np) = find_np(inputs, pkey) else {
            continue;
        };
        let full: Arc<str> = Arc::from(np_name(pkey));
        ops.push(Op::Policy(Arc::clone(&full)));
        for (i, (dir, rules)) in [(Dir::Ingress, &np.ingress), (Dir::Egress, &np.egress)]
            .into_iter()
            .enumerate()
        {
            let Some(rules) = rules else { continue };
            ops.push(Op::Isolate(i));
            for index in 0..rules.len() {
                let k = np_rule_key(&full, np, dir, index, pod);
                let resolved = rules_of.get(k, |res| np_rule(res, pkey, np, dir, index, pod));
                ops.push(Op::Rule(i, List::Allow, resolved));
            }
        }
    }
    ops
}

/// The section being put together: policies, rules and sets each listed once, in the
/// order first met.
#[derive(Default)]
struct Section {
    spec: PolicySpec,
    policy_ids: Fast<Arc<str>, u32>,
    /// Sets by their blocks' allocation, which the resolver shares among equal blocks.
    set_ids: Fast<usize, u32>,
    /// Rules by their resolution's allocation: one per key.
    rule_ids: Fast<usize, u32>,
}

impl Section {
    fn policy(&mut self, name: &Arc<str>) -> u32 {
        if let Some(id) = self.policy_ids.get(name) {
            return *id;
        }
        let id = self.spec.policies.len() as u32;
        self.spec.policies.push(name.to_string());
        self.policy_ids.insert(Arc::clone(name), id);
        id
    }

    fn rule(&mut self, policy: u32, r: &Arc<Resolved>) -> u32 {
        let key = Arc::as_ptr(r).addr();
        if let Some(id) = self.rule_ids.get(&key) {
            return *id;
        }
        let matches = (r.matches.iter())
            .map(|m| MatchSpec {
                peers: m.peers.as_ref().map(|s| {
                    let ptr = Arc::as_ptr(&s.blocks).addr();
                    let id = match self.set_ids.get(&ptr) {
                        Some(id) => *id,
                        None => {
                            let id = self.spec.sets.len() as u32;
                            self.spec.sets.push(SetSpec {
                                name: s.name.clone(),
                                blocks: (*s.blocks).clone(),
                            });
                            self.set_ids.insert(ptr, id);
                            id
                        }
                    };
                    vec![id]
                }),
                ports: m.ports.clone(),
            })
            .collect();
        let id = self.spec.rules.len() as u32;
        self.spec.rules.push(RuleSpec {
            name: r.name.clone(),
            policy,
            action: r.action,
            matches,
        });
        self.rule_ids.insert(key, id);
        id
    }
}
