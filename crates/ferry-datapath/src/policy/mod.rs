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
//! 3. the Baseline tier, in priority order: the first rule that matches decides;
//! 4. else the connection is allowed.
//!
//! Ingress is decided for the destination pod (after DNAT, on the peer the pod will see:
//! after SNAT), egress for the source pod on the destination after DNAT. Only packets
//! that start a connection are decided (the pipeline's policy stage); the verdict lives
//! on as the connection itself (a denied connection is never tracked), so packets of
//! established connections and their replies pay nothing.
//!
//! A NetworkPolicy direction is compiled into one index over all its rules ([`Grants`]):
//! single ports and whole protocols are hash lookups, peers a longest-prefix match over
//! the union of the rules' blocks, so the cost of a decision barely grows with the
//! number of rules. Tier rules are ordered and checked one after the other.

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Peers of an index bucket: every peer, or those in the prefixes, each with the first
/// rule that allowed it.
#[derive(Clone, Debug)]
enum Peers {
    Any(u32),
    Some(Fib<u32>),
}

impl Peers {
    fn lookup(&self, a: IpAddr) -> Option<u32> {
        match self {
            Peers::Any(r) => Some(*r),
            Peers::Some(f) => f.lookup(a).copied(),
        }
    }

    fn add(slot: &mut Option<Peers>, rule: u32, prefixes: Option<&[IpNet]>) {
        match (slot.as_mut(), prefixes) {
            (Some(Peers::Any(_)), _) => {}
            (_, None) => *slot = Some(Peers::Any(rule)),
            (None, Some(p)) => {
                let mut f = Fib::new();
                for n in p {
                    f.insert(*n, rule);
                }
                *slot = Some(Peers::Some(f));
            }
            (Some(Peers::Some(f)), Some(p)) => {
                for n in p {
                    if f.get_exact(*n).is_none() {
                        f.insert(*n, rule);
                    }
                }
            }
        }
    }
}

/// The union of a direction's NetworkPolicy rules, indexed by port: a query is looked
/// up in the buckets its protocol and port fall in.
#[derive(Clone, Debug, Default)]
struct Grants {
    /// Rules with no ports.
    all_ports: Option<Peers>,
    /// Rules naming a whole protocol, by protocol.
    protos: Vec<(u8, Peers)>,
    /// Rules naming one port, by protocol and port.
    ports: HashMap<(u8, u16), Peers, ahash::RandomState>,
    /// Rules naming a range of ports.
    ranges: Vec<(PortRange, Peers)>,
}

impl Grants {
    fn lookup(&self, q: &Query) -> Option<u32> {
        if let Some(r) = self.all_ports.as_ref().and_then(|p| p.lookup(q.peer)) {
            return Some(r);
        }
        if !matches!(q.proto, proto::TCP | proto::UDP | proto::SCTP) {
            return None;
        }
        if let Some(r) = self
            .protos
            .iter()
            .find(|(p, _)| *p == q.proto)
            .and_then(|(_, peers)| peers.lookup(q.peer))
        {
            return Some(r);
        }
        if let Some(r) = self
            .ports
            .get(&(q.proto, q.port))
            .and_then(|p| p.lookup(q.peer))
        {
            return Some(r);
        }
        self.ranges
            .iter()
            .filter(|(range, _)| range.contains(q))
            .find_map(|(_, peers)| peers.lookup(q.peer))
    }

    fn build(allow: &[u32], rules: &[Rule], sets: &[Set]) -> Grants {
        let mut g = Grants::default();
        let mut protos: Vec<(u8, Option<Peers>)> = Vec::new();
        let mut ports: HashMap<(u8, u16), Option<Peers>, ahash::RandomState> = HashMap::default();
        let mut ranges: Vec<(PortRange, Option<Peers>)> = Vec::new();
        for &r in allow {
            for m in &rules[r as usize].matches {
                let union: Option<Vec<IpNet>> = m.peers.as_ref().map(|ids| {
                    ids.iter()
                        .flat_map(|&s| sets[s as usize].prefixes.iter().copied())
                        .collect()
                });
                let peers = union.as_deref();
                if m.ports.is_empty() {
                    Peers::add(&mut g.all_ports, r, peers);
                }
                for p in &m.ports {
                    let slot = if p.lo == 0 && p.hi == u16::MAX {
                        match protos.iter().position(|(q, _)| *q == p.proto) {
                            Some(i) => &mut protos[i].1,
                            None => {
                                protos.push((p.proto, None));
                                &mut protos.last_mut().expect("just pushed").1
                            }
                        }
                    } else if p.lo == p.hi {
                        ports.entry((p.proto, p.lo)).or_default()
                    } else {
                        match ranges.iter().position(|(q, _)| q == p) {
                            Some(i) => &mut ranges[i].1,
                            None => {
                                ranges.push((*p, None));
                                &mut ranges.last_mut().expect("just pushed").1
                            }
                        }
                    };
                    Peers::add(slot, r, peers);
                }
            }
        }
        g.protos = protos
            .into_iter()
            .filter_map(|(p, s)| s.map(|s| (p, s)))
            .collect();
        g.ports = ports
            .into_iter()
            .filter_map(|(k, s)| s.map(|s| (k, s)))
            .collect();
        g.ranges = ranges
            .into_iter()
            .filter_map(|(k, s)| s.map(|s| (k, s)))
            .collect();
        g
    }
}

/// One direction of a pod, compiled.
#[derive(Clone, Debug, Default)]
struct Dir {
    admin: Vec<u32>,
    isolated_by: Vec<u32>,
    allow: Arc<Grants>,
    /// The NetworkPolicy rules, for explanations.
    allow_rules: Vec<u32>,
    baseline: Vec<u32>,
}

impl Dir {
    fn is_open(&self) -> bool {
        self.admin.is_empty() && self.isolated_by.is_empty() && self.baseline.is_empty()
    }
}

/// The policy of one pod port: its two directions.
#[derive(Clone, Debug, Default)]
struct PodPolicy {
    dirs: [Arc<Dir>; 2],
}

/// Compiled policy for this node's pods (see the [module](self)).
#[derive(Clone, Debug)]
pub struct Policy {
    policies: Vec<Arc<str>>,
    rules: Vec<Rule>,
    sets: Vec<Set>,
    /// By port id; None for a port no policy applies to.
    pods: Vec<Option<PodPolicy>>,
    host_to_pods: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            policies: Vec::new(),
            rules: Vec::new(),
            sets: Vec::new(),
            pods: Vec::new(),
            host_to_pods: true,
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
        let sets = self
            .sets
            .iter()
            .enumerate()
            .map(|(i, s)| compile_set(s).map_err(|e| format!("policy.sets[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
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
        };
        let mut grants: HashMap<Vec<u32>, Arc<Grants>> = HashMap::new();
        let mut dirs: HashMap<DirectionSpec, Arc<Dir>> = HashMap::new();
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
                    .compile_dir(spec, &mut grants, &mut dirs)
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

fn compile_set(s: &SetSpec) -> Result<Set, String> {
    let mut set = Set::default();
    for (j, b) in s.blocks.iter().enumerate() {
        for e in &b.except {
            if !b.cidr.trunc().contains(e) || e.addr().is_ipv4() != b.cidr.addr().is_ipv4() {
                return Err(format!("blocks[{j}]: except {e} is not inside {}", b.cidr));
            }
        }
        subtract(b.cidr, &b.except, &mut set.prefixes);
    }
    set.prefixes.sort();
    set.prefixes.dedup();
    for n in &set.prefixes {
        set.lookup.insert(*n, ());
    }
    Ok(set)
}

impl Policy {
    fn compile_dir(
        &self,
        spec: &DirectionSpec,
        grants: &mut HashMap<Vec<u32>, Arc<Grants>>,
        dirs: &mut HashMap<DirectionSpec, Arc<Dir>>,
    ) -> Result<Arc<Dir>, String> {
        if let Some(d) = dirs.get(spec) {
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
            rule("baseline", i, *r, false, false)?;
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
        let allow = grants
            .entry(spec.allow.clone())
            .or_insert_with(|| Arc::new(Grants::build(&spec.allow, &self.rules, &self.sets)))
            .clone();
        let d = Arc::new(Dir {
            admin: spec.admin.clone(),
            isolated_by: spec.isolated_by.clone(),
            allow,
            allow_rules: spec.allow.clone(),
            baseline: spec.baseline.clone(),
        });
        dirs.insert(spec.clone(), d.clone());
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

    /// The first rule of `list` that matches, with its action.
    fn first(&self, list: &[u32], q: &Query) -> Option<(u32, ActionSpec)> {
        list.iter()
            .find(|r| self.matches(**r, q))
            .map(|r| (*r, self.rules[*r as usize].action))
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
            return match dir.allow.lookup(q) {
                Some(r) => decided(Tier::NetworkPolicy, r, ActionSpec::Accept),
                None => Decision {
                    allowed: false,
                    by: DecidedBy::Isolated,
                },
            };
        }
        match self.first(&dir.baseline, q) {
            Some((r, a)) => decided(Tier::Baseline, r, a),
            None => Decision::DEFAULT,
        }
    }

    /// The NetworkPolicy rules of `port` in direction `d` that match `q`, in order (the
    /// index gives the first only; an explanation lists them all).
    pub fn allowing(&self, port: PortId, d: Direction, q: &Query) -> Vec<u32> {
        self.dir(port, d)
            .map(|dir| {
                dir.allow_rules
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
