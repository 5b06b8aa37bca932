//! NetworkPolicy and ClusterNetworkPolicy in the datapath: whether a new connection may
//! start.
//!
//! The agent resolves what needs the cluster (selectors, namespaces, named ports) and
//! hands over a [`PolicySpec`]: peer sets, rules, and for each pod port of this node the
//! rules of each direction in the order they are evaluated:
//!
//! 1. the ClusterNetworkPolicy Admin tier, in priority order: the first rule that
//!    matches decides (`accept`, `deny`) or hands the decision on (`pass`);
//! 2. NetworkPolicy: when any policy selects the pod for the direction, the pod is
//!    isolated, and allowed is what any of those policies' rules allows (the union);
//!    the rest is denied;
//! 3. the Baseline tier, in priority order: the first rule that matches decides (its
//!    `pass` leaves it to the default);
//! 4. else the connection is allowed.
//!
//! Ingress is decided for the destination pod (after DNAT, on the peer the pod will see:
//! after SNAT), egress for the source pod on the destination after DNAT. Only packets
//! that start a connection are decided (the pipeline's policy stage); the verdict lives
//! on as the connection itself (a denied connection is never tracked), so packets of
//! established connections and their replies pay nothing.
//!
//! Each list of rules (a tier's, in priority order, or a direction's NetworkPolicy rules)
//! is compiled into one index (`Index`): single ports and whole protocols are hash
//! lookups, peers a longest-prefix match over the union of the rules' blocks in which
//! every prefix holds the first rule matching it, so that a decision costs a few
//! lookups however many rules there are, and still finds the first rule in order.

mod spec;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::fib::Fib;
use crate::flow::proto;
use crate::packet::PortId;

pub use spec::{
    ActionSpec, BlockSpec, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec, PortRangeSpec,
    RuleSpec, SetSpec,
};

/// The mark of a connection the node's own stack started to one of its pods (from the
/// host port), which [`PolicySpec::host_to_pods`] lets through: a re-evaluation of the
/// tracked connections needs to know where one came from.
pub const MARK_FROM_HOST: u32 = 1 << 2;

/// A direction of a connection, seen from the pod it is decided for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// To the pod.
    Ingress,
    /// From the pod.
    Egress,
}

impl Direction {
    /// `ingress` or `egress`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    fn index(self) -> usize {
        match self {
            Direction::Ingress => 0,
            Direction::Egress => 1,
        }
    }
}

/// Which tier decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// ClusterNetworkPolicy, Admin tier.
    Admin,
    /// NetworkPolicy.
    NetworkPolicy,
    /// ClusterNetworkPolicy, Baseline tier.
    Baseline,
}

/// What decided a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// A rule (index in the policy's rules) of a tier.
    Rule(Tier, u32),
    /// NetworkPolicies isolate the pod and none of their rules matched.
    Isolated,
    /// No rule of any tier matched and no NetworkPolicy isolates the pod: allowed.
    Default,
    /// From the node's own stack to one of its pods, allowed whatever the ingress policy
    /// ([`PolicySpec::host_to_pods`]).
    Host,
}

/// A decision on one direction of a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The connection may start.
    pub allowed: bool,
    /// Why.
    pub by: DecidedBy,
}

impl Decision {
    const DEFAULT: Decision = Decision {
        allowed: true,
        by: DecidedBy::Default,
    };
}

/// What is asked of a direction: the peer (the source for ingress, the destination for
/// egress), the protocol and the destination port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// The other end.
    pub peer: IpAddr,
    /// IP protocol.
    pub proto: u8,
    /// Destination port (TCP, UDP, SCTP; ignored by port rules for other protocols,
    /// which match none of them).
    pub port: u16,
}

/// A protocol and an inclusive range of destination ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PortRange {
    proto: u8,
    lo: u16,
    hi: u16,
}

impl PortRange {
    fn contains(&self, q: &Query) -> bool {
        self.proto == q.proto && (self.lo..=self.hi).contains(&q.port)
    }
}

/// A compiled rule.
#[derive(Clone, Debug)]
struct Rule {
    name: Arc<str>,
    policy: u32,
    action: ActionSpec,
    matches: Vec<Match>,
}

#[derive(Clone, Debug)]
struct Match {
    /// Set indexes; None: every peer.
    peers: Option<Vec<u32>>,
    /// Empty: every protocol and port.
    ports: Vec<PortRange>,
}

/// The addresses of a peer set, as disjoint prefixes.
#[derive(Clone, Debug, Default)]
struct Set {
    prefixes: Vec<IpNet>,
    lookup: Fib<()>,
}

/// The peers of one bucket of an [`Index`], each with the first position (in the
/// list the index was built from) of a rule that matches them.
#[derive(Clone, Debug, Default)]
struct Peers {
    /// The first position whose rule matches every peer.
    any: Option<u32>,
    /// Prefixes, each with the first position matching some prefix that contains it
    /// (pushed down when built), so that the longest prefix holding an address gives
    /// the first position for that address.
    prefixes: Fib<u32>,
}

impl Peers {
    #[inline]
    fn lookup(&self, a: IpAddr) -> Option<u32> {
        let p = if self.prefixes.is_empty() {
            None
        } else {
            self.prefixes.lookup(a).copied()
        };
        min(self.any, p)
    }

    /// From (prefix or every peer, position) pairs.
    fn build(mut entries: Vec<(Option<IpNet>, u32)>) -> Peers {
        let any = entries
            .iter()
            .filter(|(n, _)| n.is_none())
            .map(|(_, p)| *p)
            .min();
        // Shorter prefixes first, so that each finds the positions of those holding it
        // already in place; none later than `any` matters.
        entries.retain(|(n, p)| n.is_some() && any.is_none_or(|a| *p < a));
        entries.sort_by_key(|(n, p)| (n.map(|n| n.prefix_len()), *p));
        let mut prefixes = Fib::new();
        for (n, pos) in entries {
            let n = n.expect("kept prefixes only");
            let held = prefixes.lookup(n.addr()).copied();
            let v = min(Some(pos), held).expect("pos is some");
            match prefixes.get_exact(n) {
                Some(old) if *old <= v => {}
                _ => {
                    prefixes.insert(n, v);
                }
            }
        }
        Peers { any, prefixes }
    }
}

fn min(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// A list of rules (a tier in priority order, or a direction's NetworkPolicy rules),
/// indexed by port: a query is looked up in the buckets its protocol and port fall in,
/// and the smallest position found is the first rule of the list that matches.
#[derive(Clone, Debug, Default)]
struct Index {
    /// Rules with no ports.
    all_ports: Peers,
    /// Rules naming a whole protocol, by protocol.
    protos: Vec<(u8, Peers)>,
    /// Rules naming one port, by protocol and port.
    ports: HashMap<(u8, u16), Peers, ahash::RandomState>,
    /// Rules naming a range of ports.
    ranges: Vec<(PortRange, Peers)>,
}

type Entries = Vec<(Option<IpNet>, u32)>;

impl Index {
    /// The position of the first rule of the list that matches `q`.
    #[inline]
    fn lookup(&self, q: &Query) -> Option<u32> {
        let mut first = self.all_ports.lookup(q.peer);
        if !matches!(q.proto, proto::TCP | proto::UDP | proto::SCTP) {
            return first;
        }
        if let Some((_, p)) = self.protos.iter().find(|(p, _)| *p == q.proto) {
            first = min(first, p.lookup(q.peer));
        }
        if let Some(p) = self.ports.get(&(q.proto, q.port)) {
            first = min(first, p.lookup(q.peer));
        }
        for (range, p) in &self.ranges {
            if range.contains(q) {
                first = min(first, p.lookup(q.peer));
            }
        }
        first
    }

    fn build(list: &[u32], rules: &[Rule], sets: &[Arc<Set>]) -> Index {
        let mut all: Entries = Vec::new();
        let mut protos: Vec<(u8, Entries)> = Vec::new();
        let mut ports: HashMap<(u8, u16), Entries> = HashMap::new();
        let mut ranges: Vec<(PortRange, Entries)> = Vec::new();
        for (pos, &r) in list.iter().enumerate() {
            let pos = pos as u32;
            for m in &rules[r as usize].matches {
                let peers: Vec<Option<IpNet>> = match &m.peers {
                    None => vec![None],
                    Some(ids) => ids
                        .iter()
                        .flat_map(|&s| sets[s as usize].prefixes.iter().map(|n| Some(*n)))
                        .collect(),
                };
                let put = |bucket: &mut Entries| bucket.extend(peers.iter().map(|n| (*n, pos)));
                if m.ports.is_empty() {
                    put(&mut all);
                }
                for p in &m.ports {
                    if p.lo == 0 && p.hi == u16::MAX {
                        match protos.iter_mut().find(|(q, _)| *q == p.proto) {
                            Some((_, b)) => put(b),
                            None => {
                                let mut b = Vec::new();
                                put(&mut b);
                                protos.push((p.proto, b));
                            }
                        }
                    } else if p.lo == p.hi {
                        put(ports.entry((p.proto, p.lo)).or_default());
                    } else {
                        match ranges.iter_mut().find(|(q, _)| q == p) {
                            Some((_, b)) => put(b),
                            None => {
                                let mut b = Vec::new();
                                put(&mut b);
                                ranges.push((*p, b));
                            }
                        }
                    }
                }
            }
        }
        Index {
            all_ports: Peers::build(all),
            protos: protos
                .into_iter()
                .map(|(p, b)| (p, Peers::build(b)))
                .collect(),
            ports: ports
                .into_iter()
                .map(|(k, b)| (k, Peers::build(b)))
                .collect(),
            ranges: ranges
                .into_iter()
                .map(|(k, b)| (k, Peers::build(b)))
                .collect(),
        }
    }
}

/// A list of rules and its index.
#[derive(Clone, Debug, Default)]
struct Rules {
    list: Vec<u32>,
    index: Arc<Index>,
}

impl Rules {
    /// The first rule of the list that matches `q`.
    #[inline]
    fn first(&self, q: &Query) -> Option<u32> {
        if self.list.is_empty() {
            return None;
        }
        self.index.lookup(q).map(|pos| self.list[pos as usize])
    }
}

/// One direction of a pod, compiled.
#[derive(Clone, Debug, Default)]
struct Dir {
    admin: Rules,
    isolated_by: Vec<u32>,
    allow: Rules,
    baseline: Rules,
}

impl Dir {
    fn is_open(&self) -> bool {
        self.admin.list.is_empty() && self.isolated_by.is_empty() && self.baseline.list.is_empty()
    }
}

/// The policy of one pod port: its two directions.
#[derive(Clone, Debug, Default)]
struct PodPolicy {
    dirs: [Arc<Dir>; 2],
}

/// What an index is built from, flat: for each rule of its list, in order, its number
/// of matches, then for each match its peer sets (their count, or `u64::MAX` for every
/// peer, then each by the address of the compiled set: a compilation takes over the
/// sets of the one before it that have the same prefixes) and its ports (their count, then each as protocol, first and last port).
type IndexKey = Vec<u64>;

type Fast<K, V> = HashMap<K, V, ahash::RandomState>;

/// Compiled policy for this node's pods (see the [module](self)).
#[derive(Clone, Debug)]
pub struct Policy {
    policies: Vec<Arc<str>>,
    rules: Vec<Rule>,
    sets: Vec<Arc<Set>>,
    /// By port id; None for a port no policy applies to.
    pods: Vec<Option<PodPolicy>>,
    host_to_pods: bool,
    reevaluate: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            policies: Vec::new(),
            rules: Vec::new(),
            sets: Vec::new(),
            pods: Vec::new(),
            host_to_pods: true,
            reevaluate: false,
        }
    }
}

fn parse_proto(s: &str) -> Option<u8> {
    match s {
        "tcp" => Some(proto::TCP),
        "udp" => Some(proto::UDP),
        "sctp" => Some(proto::SCTP),
        _ => None,
    }
}

/// `cidr` less `except`, as disjoint prefixes: halves of the block are taken apart
/// until each half is either clear of every exception or inside one.
fn subtract(cidr: IpNet, except: &[IpNet], out: &mut Vec<IpNet>) {
    let cidr = cidr.trunc();
    if except.iter().any(|e| e.contains(&cidr)) {
        return;
    }
    if !except.iter().any(|e| cidr.contains(e)) {
        out.push(cidr);
        return;
    }
    let halves = cidr
        .subnets(cidr.prefix_len() + 1)
        .expect("an exception strictly inside makes the block splittable");
    for h in halves {
        subtract(h, except, out);
    }
}

impl PolicySpec {
    /// Checks the spec and compiles it for the ports (by name) of the tables it is part
    /// of. The error names the entry and the problem.
    pub fn compile(&self, port_names: &[(&str, bool)]) -> Result<Policy, String> {
        self.compile_after(port_names, None)
    }

    /// [`PolicySpec::compile`], taking from `before` (the policy in force) the sets and
    /// indexes that mean the same in this spec instead of building them again: what a
    /// policy change leaves alone costs a lookup.
    pub fn compile_after(
        &self,
        port_names: &[(&str, bool)],
        before: Option<&Policy>,
    ) -> Result<Policy, String> {
        // What the policy before has, by what it was built from: its sets by their
        // prefixes (equal prefixes, equal sets), its indexes by their rules.
        let old_sets: Fast<&[IpNet], &Arc<Set>> = (before.into_iter())
            .flat_map(|b| b.sets.iter())
            .map(|s| (s.prefixes.as_slice(), s))
            .collect();
        let mut sets = Vec::with_capacity(self.sets.len());
        for (i, s) in self.sets.iter().enumerate() {
            let prefixes = set_prefixes(s).map_err(|e| format!("policy.sets[{i}]: {e}"))?;
            let set = match old_sets.get(prefixes.as_slice()) {
                Some(set) => Arc::clone(set),
                None => Arc::new(Set::of(prefixes)),
            };
            sets.push(set);
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            rules.push(
                self.compile_rule(r, sets.len())
                    .map_err(|e| format!("policy.rules[{i}] ({}): {e}", r.name))?,
            );
        }
        let mut policy = Policy {
            policies: self
                .policies
                .iter()
                .map(|p| Arc::from(p.as_str()))
                .collect(),
            rules,
            sets,
            pods: vec![None; port_names.len()],
            host_to_pods: self.host_to_pods,
            reevaluate: self.reevaluate,
        };
        let mut build = Build {
            lists: Fast::default(),
            dirs: Fast::default(),
            before: before.map(Policy::indexes),
        };
        for (i, p) in self.pods.iter().enumerate() {
            let what = || format!("policy.pods[{i}] ({})", p.port);
            let id = port_names
                .iter()
                .position(|(n, _)| *n == p.port)
                .ok_or_else(|| format!("{}: no port of that name", what()))?;
            if !port_names[id].1 {
                return Err(format!("{}: not a pod port", what()));
            }
            if policy.pods[id].is_some() {
                return Err(format!("{}: the port is listed twice", what()));
            }
            let mut pod = PodPolicy::default();
            for (d, spec) in [
                (Direction::Ingress, &p.ingress),
                (Direction::Egress, &p.egress),
            ] {
                let dir = policy
                    .compile_dir(spec, &mut build)
                    .map_err(|e| format!("{}: {}: {e}", what(), d.name()))?;
                pod.dirs[d.index()] = dir;
            }
            policy.pods[id] = Some(pod);
        }
        Ok(policy)
    }

    fn compile_rule(&self, r: &RuleSpec, sets: usize) -> Result<Rule, String> {
        let policy = self
            .policies
            .get(r.policy as usize)
            .ok_or_else(|| format!("policy: no policy {}", r.policy))?;
        let mut matches = Vec::with_capacity(r.matches.len());
        for (j, m) in r.matches.iter().enumerate() {
            if let Some(s) = m.peers.iter().flatten().find(|s| **s as usize >= sets) {
                return Err(format!("matches[{j}].peers: no set {s}"));
            }
            let mut ports = Vec::with_capacity(m.ports.len());
            for (k, p) in m.ports.iter().enumerate() {
                let at = || format!("matches[{j}].ports[{k}]");
                let proto = parse_proto(&p.proto).ok_or_else(|| {
                    format!("{}: proto {:?}: expected tcp, udp or sctp", at(), p.proto)
                })?;
                let (lo, hi) = match (p.port, p.end) {
                    (None, None) => (0, u16::MAX),
                    (None, Some(_)) => return Err(format!("{}: end needs port", at())),
                    (Some(lo), end) => {
                        let hi = end.unwrap_or(lo);
                        if hi < lo {
                            return Err(format!("{}: end {hi} is below port {lo}", at()));
                        }
                        (lo, hi)
                    }
                };
                ports.push(PortRange { proto, lo, hi });
            }
            matches.push(Match {
                peers: m.peers.clone(),
                ports,
            });
        }
        Ok(Rule {
            name: Arc::from(format!("{policy} {}", r.name)),
            policy: r.policy,
            action: r.action,
            matches,
        })
    }
}

/// The addresses of `s` as sorted disjoint prefixes; an error names the block whose
/// exception is not inside it.
fn set_prefixes(s: &SetSpec) -> Result<Vec<IpNet>, String> {
    let mut prefixes = Vec::new();
    for (j, b) in s.blocks.iter().enumerate() {
        for e in &b.except {
            if !b.cidr.trunc().contains(e) || e.addr().is_ipv4() != b.cidr.addr().is_ipv4() {
                return Err(format!("blocks[{j}]: except {e} is not inside {}", b.cidr));
            }
        }
        subtract(b.cidr, &b.except, &mut prefixes);
    }
    prefixes.sort();
    prefixes.dedup();
    Ok(prefixes)
}

#[cfg(test)]
fn compile_set(s: &SetSpec) -> Result<Set, String> {
    set_prefixes(s).map(Set::of)
}

impl Set {
    fn of(prefixes: Vec<IpNet>) -> Set {
        let mut lookup = Fib::new();
        for n in &prefixes {
            lookup.insert(*n, ());
        }
        Set { prefixes, lookup }
    }
}

/// What one compilation shares among its pods' directions, and takes from the policy
/// before it.
struct Build<'b> {
    /// Indexes by list of rules (ids of this compilation).
    lists: Fast<Vec<u32>, Arc<Index>>,
    dirs: Fast<DirectionSpec, Arc<Dir>>,
    /// The indexes of the policy before, by what they were built from.
    before: Option<Fast<IndexKey, &'b Arc<Index>>>,
}

impl Policy {
    /// Its indexes, by what they were built from.
    fn indexes(&self) -> Fast<IndexKey, &Arc<Index>> {
        let mut out = Fast::default();
        for d in self.pods.iter().flatten().flat_map(|p| p.dirs.iter()) {
            for rules in [&d.admin, &d.allow, &d.baseline] {
                if !rules.list.is_empty() {
                    out.entry(self.index_key(&rules.list))
                        .or_insert(&rules.index);
                }
            }
        }
        out
    }

    /// What the index of `list` is built from.
    fn index_key(&self, list: &[u32]) -> IndexKey {
        let mut key = Vec::with_capacity(list.len() * 6);
        for &r in list {
            let matches = &self.rules[r as usize].matches;
            key.push(matches.len() as u64);
            for m in matches {
                match &m.peers {
                    None => key.push(u64::MAX),
                    Some(ids) => {
                        key.push(ids.len() as u64);
                        key.extend(
                            (ids.iter()).map(|&s| Arc::as_ptr(&self.sets[s as usize]) as u64),
                        );
                    }
                }
                key.push(m.ports.len() as u64);
                key.extend(
                    m.ports.iter().map(|p| {
                        u64::from(p.proto) << 32 | u64::from(p.lo) << 16 | u64::from(p.hi)
                    }),
                );
            }
        }
        key
    }

    /// The index of `list`: one built already by this compilation, or by the policy
    /// before from the same rules and sets, or built now.
    fn index(&self, list: &[u32], build: &mut Build<'_>) -> Arc<Index> {
        if let Some(i) = build.lists.get(list) {
            return Arc::clone(i);
        }
        let old = (build.before.as_ref()).and_then(|b| b.get(&self.index_key(list)).copied());
        let index = match old {
            Some(i) => Arc::clone(i),
            None => Arc::new(Index::build(list, &self.rules, &self.sets)),
        };
        build.lists.insert(list.to_vec(), Arc::clone(&index));
        index
    }

    fn compile_dir(&self, spec: &DirectionSpec, build: &mut Build<'_>) -> Result<Arc<Dir>, String> {
        if let Some(d) = build.dirs.get(spec) {
            return Ok(d.clone());
        }
        let rule = |list: &str, i: usize, r: u32, pass: bool, only_accept: bool| {
            let Some(rule) = self.rules.get(r as usize) else {
                return Err(format!("{list}[{i}]: no rule {r}"));
            };
            if (rule.action == ActionSpec::Pass && !pass)
                || (only_accept && rule.action != ActionSpec::Accept)
            {
                return Err(format!(
                    "{list}[{i}]: rule {r} ({}) cannot be {:?} here",
                    rule.name, rule.action
                ));
            }
            Ok(())
        };
        for (i, r) in spec.admin.iter().enumerate() {
            rule("admin", i, *r, true, false)?;
        }
        for (i, r) in spec.allow.iter().enumerate() {
            rule("allow", i, *r, false, true)?;
        }
        for (i, r) in spec.baseline.iter().enumerate() {
            rule("baseline", i, *r, true, false)?;
        }
        if let Some(p) = spec
            .isolated_by
            .iter()
            .find(|p| **p as usize >= self.policies.len())
        {
            return Err(format!("isolated_by: no policy {p}"));
        }
        if spec.isolated_by.is_empty() && !spec.allow.is_empty() {
            return Err("allow: rules without a policy isolating the pod".into());
        }
        let mut rules = |list: &[u32]| Rules {
            list: list.to_vec(),
            index: self.index(list, build),
        };
        let d = Arc::new(Dir {
            admin: rules(&spec.admin),
            isolated_by: spec.isolated_by.clone(),
            allow: rules(&spec.allow),
            baseline: rules(&spec.baseline),
        });
        build.dirs.insert(spec.clone(), d.clone());
        Ok(d)
    }

    /// True when no policy applies to any pod.
    pub fn is_empty(&self) -> bool {
        self.pods.iter().all(Option::is_none)
    }

    /// True when the node's own stack reaches its pods whatever their ingress policy.
    pub fn host_to_pods(&self) -> bool {
        self.host_to_pods
    }

    /// True when a change of tables ends the tracked connections the new policy would
    /// not allow ([`PolicySpec::reevaluate`]).
    pub fn reevaluate(&self) -> bool {
        self.reevaluate
    }

    /// True when some tier or NetworkPolicy applies to `port` in direction `d`.
    pub fn applies(&self, port: PortId, d: Direction) -> bool {
        self.dir(port, d).is_some_and(|d| !d.is_open())
    }

    fn dir(&self, port: PortId, d: Direction) -> Option<&Dir> {
        self.pods
            .get(usize::from(port))?
            .as_ref()
            .map(|p| &*p.dirs[d.index()])
    }

    fn matches(&self, r: u32, q: &Query) -> bool {
        self.rules[r as usize].matches.iter().any(|m| {
            (m.ports.is_empty() || m.ports.iter().any(|p| p.contains(q)))
                && m.peers.as_ref().is_none_or(|s| {
                    s.iter()
                        .any(|s| self.sets[*s as usize].lookup.lookup(q.peer).is_some())
                })
        })
    }

    /// The first rule of `rules` that matches, with its action.
    #[inline]
    fn first(&self, rules: &Rules, q: &Query) -> Option<(u32, ActionSpec)> {
        rules.first(q).map(|r| (r, self.rules[r as usize].action))
    }

    /// Decides direction `d` of a new connection for the pod of `port`.
    #[inline]
    pub fn decide(&self, port: PortId, d: Direction, q: &Query) -> Decision {
        let Some(dir) = self.dir(port, d) else {
            return Decision::DEFAULT;
        };
        let decided = |tier, r: u32, action| Decision {
            allowed: action == ActionSpec::Accept,
            by: DecidedBy::Rule(tier, r),
        };
        match self.first(&dir.admin, q) {
            Some((_, ActionSpec::Pass)) | None => {}
            Some((r, a)) => return decided(Tier::Admin, r, a),
        }
        if !dir.isolated_by.is_empty() {
            return match dir.allow.first(q) {
                Some(r) => decided(Tier::NetworkPolicy, r, ActionSpec::Accept),
                None => Decision {
                    allowed: false,
                    by: DecidedBy::Isolated,
                },
            };
        }
        match self.first(&dir.baseline, q) {
            // Pass leaves the decision to the next tier, which is the default: allowed.
            Some((r, ActionSpec::Pass)) => decided(Tier::Baseline, r, ActionSpec::Accept),
            Some((r, a)) => decided(Tier::Baseline, r, a),
            None => Decision::DEFAULT,
        }
    }

    /// The NetworkPolicy rules of `port` in direction `d` that match `q`, in order (the
    /// index gives the first only; an explanation lists them all).
    pub fn allowing(&self, port: PortId, d: Direction, q: &Query) -> Vec<u32> {
        self.dir(port, d)
            .map(|dir| {
                dir.allow
                    .list
                    .iter()
                    .copied()
                    .filter(|r| self.matches(*r, q))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names of the NetworkPolicies isolating `port` in direction `d`.
    pub fn isolating(&self, port: PortId, d: Direction) -> Vec<&str> {
        self.dir(port, d)
            .map(|dir| {
                dir.isolated_by
                    .iter()
                    .map(|p| &*self.policies[*p as usize])
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The indexes of the NetworkPolicies isolating `port` in direction `d`.
    pub fn isolating_ids(&self, port: PortId, d: Direction) -> &[u32] {
        self.dir(port, d).map_or(&[], |dir| &dir.isolated_by)
    }

    /// A rule's full name: its policy's, then its own (`NetworkPolicy x/a ingress[0]`).
    pub fn rule_name(&self, r: u32) -> &str {
        &self.rules[r as usize].name
    }

    /// The policy a rule belongs to (index in [`Policy::policies`]).
    pub fn rule_policy(&self, r: u32) -> u32 {
        self.rules[r as usize].policy
    }

    /// The policies' names, by index.
    pub fn policies(&self) -> &[Arc<str>] {
        &self.policies
    }
}
