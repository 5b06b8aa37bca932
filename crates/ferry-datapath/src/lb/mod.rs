//! Service load balancing: the kube-proxy replacement's frontends and backend choice.
//!
//! A packet that starts a connection to a frontend (a cluster IP, an external or load
//! balancer IP with the Service port, or any of this node's addresses with the node port)
//! gets a backend here; conntrack then applies the DNAT (and any SNAT) and every later
//! packet of the connection follows the entry, not this module. Which endpoints are
//! eligible follows kube-proxy:
//!
//! - ready endpoints serve; when none is ready, endpoints that are serving and
//!   terminating do (per set below, as kube-proxy's `CategorizeEndpoints`);
//! - cluster IP traffic uses every node's endpoints, or only this node's with
//!   `internal_policy: local`; node port, external and load balancer traffic likewise
//!   with `external_policy`, except that traffic from this node's pods always uses every
//!   node's endpoints (kube-proxy's short-circuit);
//! - a Service port without any usable endpoint rejects at once (TCP RST, ICMP port
//!   unreachable); one whose policy leaves no local endpoint drops silently;
//! - `affinity_timeout_s` pins a client address to its endpoint until that many seconds
//!   pass without a new connection from it ([`Affinity`]).
//!
//! Among the eligible endpoints, a new connection's is chosen as [`BalanceSpec`] says:
//! by consistent hashing of the flow, the same on every node and in every agent while
//! the endpoints are the same (`consistent`, the default: [`rendezvous`] hashing for a
//! set of at most [`rendezvous::MAX_ENDPOINTS`], a [`maglev`] table for a larger one;
//! `maglev`: a Maglev table for every set), or by a hash of the flow keyed anew in every
//! process (`random`). A Service port's choosers (one per family and traffic policy) are
//! made by the first connection that needs each, and kept while the Service port is.

mod balance;
pub mod maglev;
mod recover;
pub mod reject;
pub mod rendezvous;
mod spec;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, Weak};

use ahash::RandomState;
use ipnet::IpNet;
use smallvec::SmallVec;

use crate::flow::{FlowKey, proto};

pub use balance::{Balanced, Cluster, Source, balance};
pub(crate) use recover::{Candidate, MAX_RECOVERY_CANDIDATES};
pub use spec::{BackendSpec, BalanceMode, BalanceSpec, HintsSpec, Policy, ServiceSpec};

/// Conntrack mark bit: the connection was load balanced to a Service endpoint by this
/// node (its DNAT points at a backend; removing that backend removes the connection).
pub const MARK_SERVICE: u32 = 1 << 0;
/// Conntrack mark bit: external traffic sent to an endpoint on another node with the
/// client address kept; it must travel through the tunnel, so that the other node
/// returns the replies through this one.
pub const MARK_TUNNEL: u32 = 1 << 1;

/// Where a frontend is reached from, which decides the traffic policy that applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A cluster IP: `internal_policy`.
    Internal,
    /// A node port, external IP or load balancer IP: `external_policy`.
    External,
}

/// A compiled endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Its address.
    pub addr: IpAddr,
    /// Its port.
    pub port: u16,
    /// On this node.
    pub local: bool,
    /// Its node's name, when known.
    pub node: Option<String>,
    /// conditions.ready.
    pub ready: bool,
    /// conditions.serving.
    pub serving: bool,
    /// conditions.terminating.
    pub terminating: bool,
    /// Its topology hints, when it has any: one value per distinct set of hints of the
    /// node's Services (a zone's endpoints share theirs).
    pub hints: Option<Arc<HintsSpec>>,
}

/// A compiled Service port.
#[derive(Clone, Debug)]
pub struct Service {
    /// `namespace/name:port`.
    pub name: String,
    /// IP protocol.
    pub proto: u8,
    /// The spec it came from, without its name and endpoints (see
    /// [`Service::to_spec`]).
    pub spec: ServiceSpec,
    /// Every endpoint.
    pub backends: Vec<Backend>,
    /// Indices of the endpoints usable for cluster-wide traffic, per family (0: IPv4,
    /// 1: IPv6): with topology hints in use, those meant for this node or its zone.
    cluster: [Vec<u16>; 2],
    /// Indices of the usable local endpoints, per family.
    local: [Vec<u16>; 2],
    /// Affinity timeout in nanoseconds.
    affinity_ns: Option<u64>,
    /// The source ranges of load balancer IP traffic, per family, as (network,
    /// mask) with the host bits cleared (IPv4 in the low 32 bits).
    ranges: [Vec<(u128, u128)>; 2],
    /// Stable across table swaps: keys affinity records.
    id: u64,
    /// The choosers of the eligible sets, by family and policy (0 cluster, 1 local),
    /// each made when a connection first needs it (under a consistent balance).
    choosers: [[OnceLock<Chooser>; 2]; 2],
}

impl Service {
    /// The spec this Service port was compiled from.
    pub fn to_spec(&self) -> ServiceSpec {
        ServiceSpec {
            name: self.name.clone(),
            backends: self
                .backends
                .iter()
                .map(|b| BackendSpec {
                    addr: b.addr,
                    port: b.port,
                    node: b.node.clone(),
                    no_node: b.node.is_none() && !b.local,
                    ready: b.ready,
                    serving: (b.serving != b.ready).then_some(b.serving),
                    terminating: b.terminating,
                    hints: b.hints.as_deref().cloned().unwrap_or_default(),
                })
                .collect(),
            ..self.spec.clone()
        }
    }

    /// An emptied slot.
    fn vacant() -> Service {
        Service {
            name: String::new(),
            proto: 0,
            spec: ServiceSpec::default(),
            backends: Vec::new(),
            cluster: [Vec::new(), Vec::new()],
            local: [Vec::new(), Vec::new()],
            affinity_ns: None,
            ranges: [Vec::new(), Vec::new()],
            id: 0,
            choosers: Default::default(),
        }
    }

    /// True when a new connection from `src` may reach this Service port's load
    /// balancer IPs: its family has no source range, or one holds it.
    #[inline]
    pub fn source_allowed(&self, src: IpAddr) -> bool {
        let (fam, a) = bits(src);
        let r = &self.ranges[fam];
        r.is_empty() || r.iter().any(|&(net, mask)| a & mask == net)
    }

    /// The endpoints a packet of `family` (0 IPv4, 1 IPv6) may go to under `policy`.
    pub fn eligible(&self, family: usize, policy: Policy) -> &[u16] {
        match policy {
            Policy::Cluster => &self.cluster[family],
            Policy::Local => &self.local[family],
        }
    }

    /// The consistent chooser of the endpoints eligible for `family` under `policy`
    /// (its picks are indices into [`Service::eligible`]) for the balance `mode` (not
    /// `random`), made with `seed` on first use.
    pub fn chooser(&self, family: usize, policy: Policy, mode: BalanceMode, seed: u64) -> &Chooser {
        let p = match policy {
            Policy::Cluster => 0,
            Policy::Local => 1,
        };
        self.choosers[family][p].get_or_init(|| {
            let set: Vec<(IpAddr, u16)> = self
                .eligible(family, policy)
                .iter()
                .map(|&i| {
                    let b = &self.backends[usize::from(i)];
                    (b.addr, b.port)
                })
                .collect();
            if mode == BalanceMode::Consistent && set.len() <= rendezvous::MAX_ENDPOINTS {
                Chooser::Rendezvous(rendezvous::Weights::new(&set, seed))
            } else {
                Chooser::Maglev(maglev::Table::new(&set, seed))
            }
        })
    }
}

/// How a consistent balance chooses among one eligible set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chooser {
    /// Rendezvous hashing: the set is small.
    Rendezvous(rendezvous::Weights),
    /// A Maglev table.
    Maglev(maglev::Table),
}

impl Chooser {
    /// The endpoint (an index into the set) of the flow `key`, hashed with `seed`.
    #[inline]
    pub fn pick(&self, key: &FlowKey, seed: u64) -> usize {
        match self {
            Chooser::Rendezvous(w) => w.pick(maglev::flow_hash(key, seed)),
            Chooser::Maglev(t) => t.pick(key, seed),
        }
    }
}

/// A frontend hit: the Service and how it was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// Index into [`Services::services`].
    pub service: u32,
    /// Cluster IP or external.
    pub scope: Scope,
    /// A load balancer IP whose Service port has source ranges of its family: a new
    /// connection's source must be in one ([`Service::source_allowed`]).
    pub source_checked: bool,
}

/// The compiled Services of a node.
#[derive(Clone, Debug, Default)]
pub struct Services {
    /// The Service ports, by the index frontends name; an emptied slot (a Service port
    /// taken out by [`Services::update`]) has an empty name and nothing reaches it.
    pub services: Vec<Arc<Service>>,
    /// (protocol, address, port) of cluster, external and load balancer IPs.
    frontends: HashMap<(u8, IpAddr, u16), Frontend, RandomState>,
    /// (protocol, node port).
    node_ports: HashMap<(u8, u16), u32, RandomState>,
    /// This node's addresses, where node ports are reached.
    local_addrs: HashSet<IpAddr, RandomState>,
    /// (protocol, address, port) of every endpoint, with the Service ports that have it
    /// (indices into `services`, in the order they came in).
    backends: HashMap<(u8, IpAddr, u16), SmallVec<[u32; 2]>, RandomState>,
    /// The same for the Service ports where the endpoint serves (ready or serving).
    serving: HashMap<(u8, IpAddr, u16), u32, RandomState>,
    /// How new connections are spread over the eligible endpoints.
    balance: BalanceSpec,
    /// This node's name: endpoints on it are local.
    node: String,
    /// This node's zone (`topology.kubernetes.io/zone`), for topology hints.
    zone: Option<String>,
    /// The distinct sets of topology hints the endpoints have, shared by them.
    hint_sets: HashSet<Arc<HintsSpec>, RandomState>,
    /// Service ports in force (not emptied slots).
    live: usize,
    /// Identifies this value and its clones (none for the default); see
    /// [`Services::endpoints_gone_since`].
    id: Option<Arc<Lineage>>,
    /// The value [`Services::update`] made this one from.
    parent: Weak<Lineage>,
    /// Endpoints that update took away (no Service port has them any more) or that
    /// stopped serving (no Service port has them serving any more).
    gone: Vec<(u8, IpAddr, u16)>,
    /// Update put in a UDP frontend (address and port, or node port) that the value it
    /// was made from did not have.
    udp_frontends_added: bool,
}

/// The identity of one compiled or updated [`Services`], shared by its clones: the
/// allocation itself, which a [`Weak`] to it keeps from being reused, so that a value
/// knows the one it was made from without a process-wide counter.
#[derive(Debug)]
struct Lineage;

impl Lineage {
    /// A new identity, unlike that of any value alive or any a value alive was made from.
    fn fresh() -> Option<Arc<Lineage>> {
        Some(Arc::new(Lineage))
    }
}

/// Why a Service gives no backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No usable endpoint at all: reject (TCP RST, ICMP port unreachable).
    NoEndpoints,
    /// Endpoints exist but the traffic policy leaves none on this node: drop.
    NoLocalEndpoints,
}

fn family(a: &IpAddr) -> usize {
    usize::from(a.is_ipv6())
}

/// An address's family and its bits (IPv4 in the low 32).
#[inline]
fn bits(a: IpAddr) -> (usize, u128) {
    match a {
        IpAddr::V4(a) => (0, u128::from(u32::from(a))),
        IpAddr::V6(a) => (1, u128::from(a)),
    }
}

/// A source range as [`Service::source_allowed`] matches it.
fn range(n: &IpNet) -> (usize, (u128, u128)) {
    let (fam, net) = bits(n.network());
    let (_, mask) = bits(n.netmask());
    (fam, (net & mask, mask))
}

fn stable_id(name: &str) -> u64 {
    // FNV-1a: the same on every run, unlike a keyed hasher; only keys the affinity table.
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The endpoints kube-proxy would use out of `all`: the ready ones, or when none is
/// ready the serving and terminating ones.
fn usable(backends: &[Backend], all: impl Iterator<Item = u16> + Clone) -> Vec<u16> {
    let ready: Vec<u16> = all
        .clone()
        .filter(|&i| backends[usize::from(i)].ready)
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    all.filter(|&i| {
        let b = &backends[usize::from(i)];
        b.serving && b.terminating
    })
    .collect()
}

/// Which topology hints a Service port's cluster-wide endpoints of one family follow on
/// this node (kube-proxy's `topologyModeFromHints`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    /// Hints are not used: every endpoint.
    Any,
    /// The endpoints whose node hints name this node.
    SameNode,
    /// The endpoints whose zone hints name this node's zone.
    SameZone,
}

/// The topology `all` follow on node `node` in zone `zone`: node hints when every
/// ready endpoint has some and one names this node, else zone hints when every ready
/// endpoint has some and one names this node's zone, else none. An endpoint that is
/// not ready has no say (kube-proxy's rule).
fn topology(
    backends: &[Backend],
    all: impl Iterator<Item = u16>,
    node: &str,
    zone: Option<&str>,
) -> Topology {
    let (mut node_hints, mut for_node) = (true, false);
    let (mut zone_hints, mut for_zone) = (true, false);
    for i in all {
        let b = &backends[usize::from(i)];
        if !b.ready {
            continue;
        }
        let h = b.hints.as_deref();
        match h.map(|h| &h.nodes).filter(|n| !n.is_empty()) {
            None => node_hints = false,
            Some(n) => for_node |= n.iter().any(|n| n == node),
        }
        match h.map(|h| &h.zones).filter(|z| !z.is_empty()) {
            None => zone_hints = false,
            Some(z) => for_zone |= zone.is_some_and(|zone| z.iter().any(|z| z == zone)),
        }
    }
    if node_hints && for_node {
        Topology::SameNode
    } else if zone_hints && for_zone {
        Topology::SameZone
    } else {
        Topology::Any
    }
}

/// True when endpoint `b` serves this node's cluster-wide traffic under `t`.
fn meant_for(b: &Backend, t: Topology, node: &str, zone: Option<&str>) -> bool {
    match (t, b.hints.as_deref()) {
        (Topology::Any, _) => true,
        (_, None) => false,
        (Topology::SameNode, Some(h)) => h.nodes.iter().any(|n| n == node),
        (Topology::SameZone, Some(h)) => zone.is_some_and(|z| h.zones.iter().any(|h| h == z)),
    }
}

impl Services {
    /// Compiles `specs` for the node named `node` whose addresses are `local_addrs`. The
    /// error names the entry and the problem.
    pub fn compile(
        specs: &[ServiceSpec],
        node: &str,
        local_addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Result<Services, String> {
        Services::compile_balanced(specs, node, local_addrs, BalanceSpec::default())
    }

    /// [`Services::compile`], new connections spread as `balance` says (kept by every
    /// [`Services::update`] of the result).
    pub fn compile_balanced(
        specs: &[ServiceSpec],
        node: &str,
        local_addrs: impl IntoIterator<Item = IpAddr>,
        balance: BalanceSpec,
    ) -> Result<Services, String> {
        Services::compile_on(specs, node, None, local_addrs, balance)
    }

    /// [`Services::compile_balanced`] for a node in zone `zone`, whose endpoints'
    /// topology hints name it.
    pub fn compile_on(
        specs: &[ServiceSpec],
        node: &str,
        zone: Option<&str>,
        local_addrs: impl IntoIterator<Item = IpAddr>,
        balance: BalanceSpec,
    ) -> Result<Services, String> {
        let mut s = Services {
            local_addrs: local_addrs.into_iter().collect(),
            node: node.to_string(),
            zone: zone.map(str::to_string),
            id: Lineage::fresh(),
            balance,
            ..Services::default()
        };
        let mut names = HashSet::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let what = format!("services[{i}] ({:?})", spec.name);
            if !names.insert(spec.name.as_str()) {
                return Err(format!("{what}: duplicate service name"));
            }
            s.add(spec, &what)?;
        }
        Ok(s)
    }

    /// These Services with the Service ports named in `removed` taken out and `added`
    /// put in (one of an existing name replaces it), without compiling the others again:
    /// the cost is a copy of the lookup tables, not a compilation of every Service, so
    /// that an endpoint change reaches the workers in a few milliseconds however many
    /// Services there are. Unknown names in `removed` are ignored.
    pub fn update(&self, removed: &[&str], added: &[ServiceSpec]) -> Result<Services, String> {
        let mut s = self.clone();
        s.id = Lineage::fresh();
        s.parent = self.lineage();
        s.gone.clear();
        s.udp_frontends_added = added
            .iter()
            .any(|spec| spec.proto == "udp" && self.lacks_frontend_of(spec, proto::UDP));
        for name in removed
            .iter()
            .copied()
            .chain(added.iter().map(|a| a.name.as_str()))
        {
            if let Some(i) = s.position(name) {
                s.remove(i);
            }
        }
        let mut names = HashSet::with_capacity(added.len());
        for spec in added {
            let what = format!("services ({:?})", spec.name);
            if !names.insert(spec.name.as_str()) {
                return Err(format!("{what}: duplicate service name"));
            }
            s.add(spec, &what)?;
        }
        // Removed Service ports leave empty slots behind (frontends hold indices); once
        // they outnumber the live ones, compile afresh.
        if s.services.len() > 2 * s.live + 64 {
            let live: Vec<ServiceSpec> = s
                .services
                .iter()
                .filter(|v| !v.name.is_empty())
                .map(|v| v.to_spec())
                .collect();
            let node = std::mem::take(&mut s.node);
            let mut c =
                Services::compile_balanced(&live, &node, s.local_addrs.iter().copied(), s.balance)?;
            c.parent = self.lineage();
            c.gone = s.gone;
            c.udp_frontends_added = s.udp_frontends_added;
            return Ok(c);
        }
        // Endpoints taken out and put back serving by the same update did not go.
        let serving = &s.serving;
        s.gone.retain(|k| !serving.contains_key(k));
        Ok(s)
    }

    /// The endpoints no Service port has, or has serving, any more since `older`, when
    /// these Services were made from it by [`Services::update`]; None when they were not
    /// (then any endpoint may have gone). A table swap uses it to visit the connection
    /// table only when an endpoint went away or stopped serving.
    pub fn endpoints_gone_since(&self, older: &Services) -> Option<&[(u8, IpAddr, u16)]> {
        self.made_from(older).then_some(self.gone.as_slice())
    }

    /// Whether a UDP frontend (an address and port, or a node port) came in since
    /// `older`, when these Services were made from it by [`Services::update`]; None when
    /// they were not (then any may have). A table swap uses it to visit the connection
    /// table only when a UDP flow may have started to an address that is a frontend now.
    pub fn udp_frontends_added_since(&self, older: &Services) -> Option<bool> {
        self.made_from(older).then_some(self.udp_frontends_added)
    }

    /// A reference to this value's identity, for the values made from it.
    fn lineage(&self) -> Weak<Lineage> {
        self.id.as_ref().map(Arc::downgrade).unwrap_or_default()
    }

    /// True when [`Services::update`] made these Services from `older` (or a clone of it).
    fn made_from(&self, older: &Services) -> bool {
        older
            .id
            .as_ref()
            .is_some_and(|id| Weak::ptr_eq(&self.parent, &Arc::downgrade(id)))
    }

    /// True when `spec`, over protocol `proto`, has a frontend these Services do not.
    fn lacks_frontend_of(&self, spec: &ServiceSpec, proto: u8) -> bool {
        spec.cluster_ips
            .iter()
            .chain(&spec.external_ips)
            .chain(&spec.load_balancer_ips)
            .any(|a| !self.frontends.contains_key(&(proto, *a, spec.port)))
            || spec
                .node_port
                .is_some_and(|np| !self.node_ports.contains_key(&(proto, np)))
    }

    /// True when a connection with the original tuple `key` is addressed to a frontend:
    /// a cluster, external or load balancer IP with its port, a node port at one of this
    /// node's addresses, or a cluster IP with its Service's node port (the host's node
    /// port connections, see [`Services::host_node_port`]).
    pub fn is_frontend_of(&self, key: &FlowKey) -> bool {
        self.frontend(key).is_some() || self.host_node_port(key).is_some()
    }

    /// Service ports in force.
    pub fn len(&self) -> usize {
        self.live
    }

    /// How new connections are spread over the eligible endpoints.
    pub fn balance(&self) -> BalanceSpec {
        self.balance
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The Service port named `name`.
    pub fn get(&self, name: &str) -> Option<&Service> {
        self.position(name).map(|i| &*self.services[i])
    }

    fn position(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return None;
        }
        self.services.iter().position(|v| v.name == name)
    }

    /// Takes Service port `i` out: its frontends and endpoints go, its slot stays empty.
    fn remove(&mut self, i: usize) {
        let old = std::mem::replace(&mut self.services[i], Arc::new(Service::vacant()));
        let proto = old.proto;
        let idx = i as u32;
        let spec = &old.spec;
        for a in spec
            .cluster_ips
            .iter()
            .chain(&spec.external_ips)
            .chain(&spec.load_balancer_ips)
        {
            let k = (proto, *a, spec.port);
            if self.frontends.get(&k).is_some_and(|f| f.service == idx) {
                self.frontends.remove(&k);
            }
        }
        if let Some(np) = spec.node_port
            && self.node_ports.get(&(proto, np)) == Some(&idx)
        {
            self.node_ports.remove(&(proto, np));
        }
        for b in &old.backends {
            let k = (proto, b.addr, b.port);
            let mut last = false;
            if let Some(held) = self.backends.get_mut(&k) {
                held.retain(|s| *s != idx);
                if held.is_empty() {
                    self.backends.remove(&k);
                    last = true;
                }
            }
            // Only what `add` counted: an endpoint this Service port has neither ready
            // nor serving was not counted in `serving`, and another Service port's count
            // of it must stay.
            if (b.ready || b.serving)
                && let Some(n) = self.serving.get_mut(&k)
            {
                *n -= 1;
                if *n == 0 {
                    self.serving.remove(&k);
                    last = true;
                }
            }
            if last {
                self.gone.push(k);
            }
        }
        self.live -= 1;
    }

    /// The shared value of the hints `h`.
    fn hint_set(&mut self, h: &HintsSpec) -> Arc<HintsSpec> {
        if let Some(a) = self.hint_sets.get(h) {
            return Arc::clone(a);
        }
        let a = Arc::new(h.clone());
        self.hint_sets.insert(Arc::clone(&a));
        a
    }

    /// Checks and adds one Service port; `what` names it in errors. On an error the
    /// tables may hold part of it: callers work on a copy they drop then.
    fn add(&mut self, spec: &ServiceSpec, what: &str) -> Result<(), String> {
        if spec.name.is_empty() {
            return Err(format!("{what}: name must not be empty"));
        }
        let proto = match spec.proto.as_str() {
            "tcp" => proto::TCP,
            "udp" => proto::UDP,
            "sctp" => {
                return Err(format!(
                    "{what}: proto sctp: SCTP Services are not supported yet"
                ));
            }
            p => return Err(format!("{what}: proto {p:?}: expected tcp or udp")),
        };
        if spec.port == 0 {
            return Err(format!("{what}: port must be 1-65535"));
        }
        if spec.node_port == Some(0) {
            return Err(format!("{what}: node_port must be 1-65535"));
        }
        if spec.backends.len() > usize::from(u16::MAX) {
            return Err(format!("{what}: at most {} backends", u16::MAX));
        }
        let idx = self.services.len() as u32;
        let mut backends = Vec::with_capacity(spec.backends.len());
        // Few endpoints per Service port: comparing with the earlier ones beats hashing.
        let mut seen = (spec.backends.len() > 32)
            .then(|| HashSet::with_capacity_and_hasher(spec.backends.len(), RandomState::new()));
        for (j, b) in spec.backends.iter().enumerate() {
            if b.port == 0 {
                return Err(format!("{what}: backends[{j}]: port must be 1-65535"));
            }
            let dup = match seen.as_mut() {
                Some(seen) => !seen.insert((b.addr, b.port)),
                None => spec.backends[..j]
                    .iter()
                    .any(|o| o.addr == b.addr && o.port == b.port),
            };
            if dup {
                return Err(format!(
                    "{what}: backends[{j}]: duplicate endpoint {}:{}",
                    b.addr, b.port
                ));
            }
            if b.no_node && b.node.is_some() {
                return Err(format!(
                    "{what}: backends[{j}]: no_node and node are exclusive"
                ));
            }
            backends.push(Backend {
                addr: b.addr,
                port: b.port,
                // A tables file for one node may leave `node` out; the agent says
                // `no_node` for Kubernetes' absent nodeName.
                local: !b.no_node && b.node.as_deref().is_none_or(|n| n == self.node),
                node: b.node.clone(),
                ready: b.ready,
                serving: b.serving.unwrap_or(b.ready),
                terminating: b.terminating,
                hints: (!b.hints.is_empty()).then(|| self.hint_set(&b.hints)),
            });
            let k = (proto, b.addr, b.port);
            self.backends.entry(k).or_default().push(idx);
            if b.ready || b.serving.unwrap_or(b.ready) {
                *self.serving.entry(k).or_default() += 1;
            }
        }
        let of = |fam: usize, local: bool| {
            let bs = &backends;
            let all =
                (0..bs.len() as u16).filter(move |&k| family(&bs[usize::from(k)].addr) == fam);
            if local {
                // This node's endpoints: topology hints have no say.
                return usable(bs, all.filter(|&k| bs[usize::from(k)].local));
            }
            let (node, zone) = (self.node.as_str(), self.zone.as_deref());
            let t = topology(bs, all.clone(), node, zone);
            usable(
                bs,
                all.filter(|&k| meant_for(&bs[usize::from(k)], t, node, zone)),
            )
        };
        let cluster = [of(0, false), of(1, false)];
        let local = [of(0, true), of(1, true)];
        let mut ranges = [Vec::new(), Vec::new()];
        for n in &spec.source_ranges {
            let (fam, r) = range(n);
            if !ranges[fam].contains(&r) {
                ranges[fam].push(r);
            }
        }
        let frontends = spec
            .cluster_ips
            .iter()
            .map(|a| (*a, Scope::Internal, false))
            .chain(
                spec.external_ips
                    .iter()
                    .map(|a| (*a, Scope::External, false)),
            )
            .chain(
                spec.load_balancer_ips
                    .iter()
                    .map(|a| (*a, Scope::External, !ranges[family(a)].is_empty())),
            );
        for (addr, scope, source_checked) in frontends {
            let f = Frontend {
                service: idx,
                scope,
                source_checked,
            };
            if let Some(prev) = self.frontends.insert((proto, addr, spec.port), f) {
                if prev.service == idx {
                    // This Service names the address twice (an external IP that is also
                    // its load balancer's, say): the first naming, and its scope, stand;
                    // as a load balancer IP it is checked all the same (kube-proxy checks
                    // the sources of whatever is addressed to a load balancer IP).
                    let f = Frontend {
                        source_checked: prev.source_checked || source_checked,
                        ..prev
                    };
                    self.frontends.insert((proto, addr, spec.port), f);
                    continue;
                }
                return Err(format!(
                    "{what}: frontend {} {addr}:{} is also {:?}'s",
                    spec.proto, spec.port, self.services[prev.service as usize].name
                ));
            }
        }
        if let Some(np) = spec.node_port
            && let Some(prev) = self.node_ports.insert((proto, np), idx)
        {
            return Err(format!(
                "{what}: node port {} {np} is also {:?}'s",
                spec.proto, self.services[prev as usize].name
            ));
        }
        self.services.push(Arc::new(Service {
            name: spec.name.clone(),
            proto,
            // The endpoints live in `backends`; the spec keeps the rest.
            spec: ServiceSpec {
                name: String::new(),
                proto: spec.proto.clone(),
                port: spec.port,
                cluster_ips: spec.cluster_ips.clone(),
                node_port: spec.node_port,
                external_ips: spec.external_ips.clone(),
                load_balancer_ips: spec.load_balancer_ips.clone(),
                source_ranges: spec.source_ranges.clone(),
                external_policy: spec.external_policy,
                internal_policy: spec.internal_policy,
                affinity_timeout_s: spec.affinity_timeout_s,
                external_snat: spec.external_snat,
                backends: Vec::new(),
            },
            backends,
            cluster,
            local,
            affinity_ns: spec
                .affinity_timeout_s
                .map(|t| u64::from(t) * 1_000_000_000),
            ranges,
            id: stable_id(&spec.name),
            choosers: Default::default(),
        }));
        self.live += 1;
        Ok(())
    }

    /// The frontend a packet with `key` is addressed to, if any.
    #[inline]
    pub fn frontend(&self, key: &FlowKey) -> Option<Frontend> {
        if self.live == 0 || !matches!(key.proto, proto::TCP | proto::UDP) {
            return None;
        }
        if let Some(f) = self.frontends.get(&(key.proto, key.dst.ip(), key.dst_port)) {
            return Some(*f);
        }
        if self.node_ports.is_empty() || !self.local_addrs.contains(&key.dst.ip()) {
            return None;
        }
        self.node_ports
            .get(&(key.proto, key.dst_port))
            .map(|&service| Frontend {
                service,
                scope: Scope::External,
                source_checked: false,
            })
    }

    /// The node port frontend of a connection from this node's own stack addressed to a
    /// Service's cluster IP with its node port. The agent rewrites the node's own
    /// connections to a node port this way (the kernel would deliver them locally
    /// otherwise), so that they keep the node port's scope: kube-proxy sends them to
    /// every node's endpoints whatever either traffic policy says. None when that
    /// address and port is a frontend itself (see [`Services::is_frontend`]).
    pub fn host_node_port(&self, key: &FlowKey) -> Option<Frontend> {
        let &service = self.node_ports.get(&(key.proto, key.dst_port))?;
        let svc = self.services.get(service as usize)?;
        (svc.spec.cluster_ips.contains(&key.dst.ip())
            && !self.is_frontend(key.proto, key.dst.ip(), key.dst_port))
        .then_some(Frontend {
            service,
            scope: Scope::External,
            source_checked: false,
        })
    }

    /// True when (protocol, address, port) is a cluster, external or load balancer IP
    /// frontend.
    pub fn is_frontend(&self, proto: u8, addr: IpAddr, port: u16) -> bool {
        self.frontends.contains_key(&(proto, addr, port))
    }

    /// True when some Service has the endpoint (protocol, address, port).
    pub fn has_backend(&self, proto: u8, addr: IpAddr, port: u16) -> bool {
        self.backends.contains_key(&(proto, addr, port))
    }

    /// The Service ports that have the endpoint (protocol, address, port), as indices
    /// into [`Services::services`] in the order they came in.
    pub fn holders(&self, proto: u8, addr: IpAddr, port: u16) -> &[u32] {
        self.backends
            .get(&(proto, addr, port))
            .map_or(&[], |h| h.as_slice())
    }

    /// True when some Service has the endpoint (protocol, address, port) ready or
    /// serving.
    pub fn has_serving_backend(&self, proto: u8, addr: IpAddr, port: u16) -> bool {
        self.serving.contains_key(&(proto, addr, port))
    }

    /// True when this node's addresses include `a` (where node ports are reached).
    pub fn is_local_addr(&self, a: &IpAddr) -> bool {
        self.local_addrs.contains(a)
    }

    /// Chooses the endpoint for a new connection with `key` to frontend `f`: an index
    /// into the Service's [`Service::backends`]. `from_node`: the packet came from
    /// this node, one of its pods or its own stack (the host port); external traffic
    /// from the node then uses every node's endpoints, as kube-proxy's short-circuit of
    /// pod and local sources does. `affinity` holds the session affinity records, read
    /// here (a new record is written by [`Services::remember`] once the connection is
    /// tracked), and spreads connections over the eligible endpoints.
    pub(crate) fn choose(
        &self,
        f: Frontend,
        key: &FlowKey,
        from_node: bool,
        affinity: &Affinity,
        now_ns: u64,
    ) -> Result<usize, Miss> {
        let svc = &self.services[f.service as usize];
        let fam = family(&key.dst.ip());
        let policy = match f.scope {
            Scope::Internal => svc.spec.internal_policy,
            Scope::External if from_node => Policy::Cluster,
            Scope::External => svc.spec.external_policy,
        };
        let set = svc.eligible(fam, policy);
        if set.is_empty() {
            let any = !svc.cluster[fam].is_empty() || !svc.local[fam].is_empty();
            return Err(if any {
                Miss::NoLocalEndpoints
            } else {
                Miss::NoEndpoints
            });
        }
        let kept = svc
            .affinity_ns
            .and_then(|_| affinity.get(svc.id, key.src.ip(), now_ns))
            .and_then(|(addr, port)| {
                set.iter().copied().find(|&i| {
                    let b = &svc.backends[usize::from(i)];
                    b.addr == addr && b.port == port
                })
            });
        Ok(usize::from(kept.unwrap_or_else(|| {
            set[match self.balance.mode {
                BalanceMode::Random => affinity.pick(key, set.len()),
                mode => svc
                    .chooser(fam, policy, mode, self.balance.seed)
                    .pick(key, self.balance.seed),
            }]
        })))
    }

    /// Records that the client of a new connection with `key` to frontend `f` got
    /// endpoint `backend` (from [`Services::choose`]), when the Service has session
    /// affinity: its later connections keep that endpoint until the timeout passes
    /// without another. Called once conntrack has a pending connection for it, so that a
    /// packet that starts none leaves no record.
    pub(crate) fn remember(
        &self,
        f: Frontend,
        key: &FlowKey,
        backend: usize,
        affinity: &mut Affinity,
        now_ns: u64,
    ) {
        let svc = &self.services[f.service as usize];
        if let (Some(timeout), Some(b)) = (svc.affinity_ns, svc.backends.get(backend)) {
            affinity.put(svc.id, key.src.ip(), (b.addr, b.port), now_ns, timeout);
        }
    }
}

/// Session affinity records: (Service, client address) -> endpoint, each valid until
/// its timeout passes without a new connection. Bounded: when full, expired records are
/// swept; if none is, the new record is not kept (the connection is still balanced, and
/// counted in [`Affinity::refused`]). A sweep visits every record, so a full table is
/// swept only once a record may have expired, and at most once per
/// [`Affinity::SWEEP_INTERVAL_NS`]: a new client of a table full of live records costs
/// a lookup, not a pass over the table (the pipeline also sweeps once a second). A clone
/// keeps the hash key, so it picks endpoints as the original does.
#[derive(Clone, Debug)]
pub struct Affinity {
    map: HashMap<(u64, IpAddr), Record, RandomState>,
    max: usize,
    hasher: RandomState,
    /// No record expires before this (u64::MAX: none held since it was known).
    earliest_ns: u64,
    /// A full table is not swept for a new record before this.
    next_sweep_ns: u64,
    refused: u64,
    sweeps: u64,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    backend: (IpAddr, u16),
    deadline_ns: u64,
}

impl Default for Affinity {
    fn default() -> Affinity {
        Affinity::new(Affinity::DEFAULT_MAX)
    }
}

impl Affinity {
    /// Default bound on records.
    pub const DEFAULT_MAX: usize = 65536;
    /// A full table is swept for a new record at most once in this long (1 s).
    pub const SWEEP_INTERVAL_NS: u64 = 1_000_000_000;

    /// An empty table of at most `max` records.
    pub fn new(max: usize) -> Affinity {
        Affinity {
            map: HashMap::default(),
            max,
            hasher: RandomState::new(),
            earliest_ns: u64::MAX,
            next_sweep_ns: 0,
            refused: 0,
            sweeps: 0,
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records not kept because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Passes over every record made to find room for a new one in a full table.
    pub fn sweeps(&self) -> u64 {
        self.sweeps
    }

    fn get(&self, service: u64, client: IpAddr, now_ns: u64) -> Option<(IpAddr, u16)> {
        self.map
            .get(&(service, client))
            .filter(|r| r.deadline_ns > now_ns)
            .map(|r| r.backend)
    }

    fn put(
        &mut self,
        service: u64,
        client: IpAddr,
        backend: (IpAddr, u16),
        now_ns: u64,
        timeout_ns: u64,
    ) {
        let rec = Record {
            backend,
            deadline_ns: now_ns.saturating_add(timeout_ns),
        };
        if self.map.len() >= self.max && !self.map.contains_key(&(service, client)) {
            if now_ns < self.earliest_ns.max(self.next_sweep_ns) {
                self.refused += 1;
                return;
            }
            self.sweeps += 1;
            self.next_sweep_ns = now_ns.saturating_add(Self::SWEEP_INTERVAL_NS);
            self.expire(now_ns, usize::MAX);
            if self.map.len() >= self.max {
                self.refused += 1;
                return;
            }
        }
        // `earliest_ns` stays at or below every deadline; a refresh that moves the
        // earliest one later leaves it low, which costs one sweep that finds nothing.
        self.earliest_ns = self.earliest_ns.min(rec.deadline_ns);
        self.map.insert((service, client), rec);
    }

    /// Removes expired records, at most `budget` of them.
    pub fn expire(&mut self, now_ns: u64, budget: usize) -> usize {
        let mut n = 0;
        let mut earliest = u64::MAX;
        self.map.retain(|_, r| {
            if n < budget && r.deadline_ns <= now_ns {
                n += 1;
                false
            } else {
                earliest = earliest.min(r.deadline_ns);
                true
            }
        });
        self.earliest_ns = earliest;
        n
    }

    /// An index below `n` from the connection's key, hashed with this table's key (one
    /// per process): the `random` balance.
    fn pick(&self, key: &FlowKey, n: usize) -> usize {
        (self.hasher.hash_one(key) % n as u64) as usize
    }
}

#[cfg(test)]
mod tests;

/// Affinity records in a handed-over state (`handover`): by the Service port's name
/// (its id is derived from it), with the time each has left.
impl Affinity {
    /// The records live at `now_ns` whose Service port `services` has, for a saved
    /// state: one pass over the records.
    pub(crate) fn saved(&self, services: &Services, now_ns: u64) -> Vec<crate::handover::Affinity> {
        let names: HashMap<u64, &str> = services
            .services
            .iter()
            .filter(|s| !s.name.is_empty())
            .map(|s| (s.id, s.name.as_str()))
            .collect();
        self.map
            .iter()
            .filter(|(_, r)| r.deadline_ns > now_ns)
            .filter_map(|((id, client), r)| {
                Some(crate::handover::Affinity {
                    service: names.get(id)?.to_string(),
                    client: *client,
                    endpoint: r.backend.0,
                    endpoint_port: r.backend.1,
                    remaining_ns: r.deadline_ns - now_ns,
                })
            })
            .collect()
    }

    /// Puts saved records back at `now_ns`, each with the time it had left. Returns how
    /// many were put back, left out because `services` has no Service port of their
    /// name, and left out because the table was full.
    pub(crate) fn restore(
        &mut self,
        services: &Services,
        records: &[crate::handover::Affinity],
        now_ns: u64,
    ) -> (usize, usize, usize) {
        let names: HashSet<&str> = services
            .services
            .iter()
            .filter(|s| !s.name.is_empty())
            .map(|s| s.name.as_str())
            .collect();
        let (mut kept, mut gone, mut full) = (0, 0, 0);
        for a in records {
            if !names.contains(a.service.as_str()) {
                gone += 1;
                continue;
            }
            let key = (stable_id(&a.service), a.client);
            if self.map.len() >= self.max && !self.map.contains_key(&key) {
                full += 1;
                continue;
            }
            let deadline_ns = now_ns.saturating_add(a.remaining_ns);
            self.earliest_ns = self.earliest_ns.min(deadline_ns);
            let rec = Record {
                backend: (a.endpoint, a.endpoint_port),
                deadline_ns,
            };
            if self.map.insert(key, rec).is_none() {
                kept += 1;
            }
        }
        (kept, gone, full)
    }
}
