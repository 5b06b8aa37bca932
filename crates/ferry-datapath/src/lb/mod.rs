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

mod spec;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ahash::RandomState;

use crate::flow::{FlowKey, proto};

pub use spec::{BackendSpec, Policy, ServiceSpec};

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
}

/// A compiled Service port.
#[derive(Clone, Debug)]
pub struct Service {
    /// `namespace/name:port`.
    pub name: String,
    /// IP protocol.
    pub proto: u8,
    /// The spec it came from.
    pub spec: ServiceSpec,
    /// Every endpoint.
    pub backends: Vec<Backend>,
    /// Indices of the endpoints usable for cluster-wide traffic, per family (0: IPv4,
    /// 1: IPv6).
    cluster: [Vec<u16>; 2],
    /// Indices of the usable local endpoints, per family.
    local: [Vec<u16>; 2],
    /// Affinity timeout in nanoseconds.
    affinity_ns: Option<u64>,
    /// Stable across table swaps: keys affinity records.
    id: u64,
}

impl Service {
    /// The endpoints a packet of `family` (0 IPv4, 1 IPv6) may go to under `policy`.
    pub fn eligible(&self, family: usize, policy: Policy) -> &[u16] {
        match policy {
            Policy::Cluster => &self.cluster[family],
            Policy::Local => &self.local[family],
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
}

/// The compiled Services of a node.
#[derive(Clone, Debug, Default)]
pub struct Services {
    /// The Service ports.
    pub services: Vec<Service>,
    /// (protocol, address, port) of cluster, external and load balancer IPs.
    frontends: HashMap<(u8, IpAddr, u16), Frontend, RandomState>,
    /// (protocol, node port).
    node_ports: HashMap<(u8, u16), u32, RandomState>,
    /// This node's addresses, where node ports are reached.
    local_addrs: HashSet<IpAddr, RandomState>,
    /// (protocol, address, port) of every endpoint of every Service.
    backends: HashSet<(u8, IpAddr, u16), RandomState>,
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

impl Services {
    /// Compiles `specs` for the node named `node` whose addresses are `local_addrs`. The
    /// error names the entry and the problem.
    pub fn compile(
        specs: &[ServiceSpec],
        node: &str,
        local_addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Result<Services, String> {
        let mut s = Services {
            local_addrs: local_addrs.into_iter().collect(),
            ..Services::default()
        };
        for (i, spec) in specs.iter().enumerate() {
            let what = || format!("services[{i}] ({:?})", spec.name);
            if spec.name.is_empty() {
                return Err(format!("{}: name must not be empty", what()));
            }
            if specs[..i].iter().any(|o| o.name == spec.name) {
                return Err(format!("{}: duplicate service name", what()));
            }
            let proto = match spec.proto.as_str() {
                "tcp" => proto::TCP,
                "udp" => proto::UDP,
                "sctp" => {
                    return Err(format!(
                        "{}: proto sctp: SCTP Services are not supported yet",
                        what()
                    ));
                }
                p => return Err(format!("{}: proto {p:?}: expected tcp or udp", what())),
            };
            if spec.port == 0 {
                return Err(format!("{}: port must be 1-65535", what()));
            }
            if spec.node_port == Some(0) {
                return Err(format!("{}: node_port must be 1-65535", what()));
            }
            if spec.backends.len() > usize::from(u16::MAX) {
                return Err(format!("{}: at most {} backends", what(), u16::MAX));
            }
            let idx = s.services.len() as u32;
            let mut backends = Vec::with_capacity(spec.backends.len());
            for (j, b) in spec.backends.iter().enumerate() {
                if b.port == 0 {
                    return Err(format!("{}: backends[{j}]: port must be 1-65535", what()));
                }
                if spec.backends[..j]
                    .iter()
                    .any(|o| o.addr == b.addr && o.port == b.port)
                {
                    return Err(format!(
                        "{}: backends[{j}]: duplicate endpoint {}:{}",
                        what(),
                        b.addr,
                        b.port
                    ));
                }
                backends.push(Backend {
                    addr: b.addr,
                    port: b.port,
                    local: b.node.as_deref().is_none_or(|n| n == node),
                    node: b.node.clone(),
                    ready: b.ready,
                    serving: b.serving.unwrap_or(b.ready),
                    terminating: b.terminating,
                });
                s.backends.insert((proto, b.addr, b.port));
            }
            let of = |fam: usize, local: bool| {
                let bs = &backends;
                usable(
                    bs,
                    (0..bs.len() as u16).filter(move |&k| {
                        let b = &bs[usize::from(k)];
                        family(&b.addr) == fam && (!local || b.local)
                    }),
                )
            };
            let cluster = [of(0, false), of(1, false)];
            let local = [of(0, true), of(1, true)];
            let mut add = |addr: IpAddr, port: u16, scope: Scope| -> Result<(), String> {
                let f = Frontend {
                    service: idx,
                    scope,
                };
                if let Some(prev) = s.frontends.insert((proto, addr, port), f) {
                    return Err(format!(
                        "{}: frontend {} {addr}:{port} is also services[{}]'s",
                        what(),
                        spec.proto,
                        prev.service
                    ));
                }
                Ok(())
            };
            for a in &spec.cluster_ips {
                add(*a, spec.port, Scope::Internal)?;
            }
            for a in spec.external_ips.iter().chain(&spec.load_balancer_ips) {
                add(*a, spec.port, Scope::External)?;
            }
            if let Some(np) = spec.node_port
                && let Some(prev) = s.node_ports.insert((proto, np), idx)
            {
                return Err(format!(
                    "{}: node port {} {np} is also services[{prev}]'s",
                    what(),
                    spec.proto
                ));
            }
            s.services.push(Service {
                name: spec.name.clone(),
                proto,
                spec: spec.clone(),
                backends,
                cluster,
                local,
                affinity_ns: spec
                    .affinity_timeout_s
                    .map(|t| u64::from(t) * 1_000_000_000),
                id: stable_id(&spec.name),
            });
        }
        Ok(s)
    }

    /// The frontend a packet with `key` is addressed to, if any.
    #[inline]
    pub fn frontend(&self, key: &FlowKey) -> Option<Frontend> {
        if self.services.is_empty() || !matches!(key.proto, proto::TCP | proto::UDP) {
            return None;
        }
        if let Some(f) = self.frontends.get(&(key.proto, key.dst, key.dst_port)) {
            return Some(*f);
        }
        if self.node_ports.is_empty() || !self.local_addrs.contains(&key.dst) {
            return None;
        }
        self.node_ports
            .get(&(key.proto, key.dst_port))
            .map(|&service| Frontend {
                service,
                scope: Scope::External,
            })
    }

    /// True when some Service has the endpoint (protocol, address, port).
    pub fn has_backend(&self, proto: u8, addr: IpAddr, port: u16) -> bool {
        self.backends.contains(&(proto, addr, port))
    }

    /// True when this node's addresses include `a` (where node ports are reached).
    pub fn is_local_addr(&self, a: &IpAddr) -> bool {
        self.local_addrs.contains(a)
    }

    /// Chooses the backend for a new connection with `key` to frontend `f`.
    /// `from_local_pod`: the packet came from one of this node's pods. `affinity` keeps
    /// session affinity records; `hash` spreads connections over the endpoints.
    pub fn choose(
        &self,
        f: Frontend,
        key: &FlowKey,
        from_local_pod: bool,
        affinity: &mut Affinity,
        now_ns: u64,
    ) -> Result<&Backend, Miss> {
        let svc = &self.services[f.service as usize];
        let fam = family(&key.dst);
        let policy = match f.scope {
            Scope::Internal => svc.spec.internal_policy,
            Scope::External if from_local_pod => Policy::Cluster,
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
        if let Some(timeout) = svc.affinity_ns {
            if let Some((addr, port)) = affinity.get(svc.id, key.src, now_ns)
                && let Some(&i) = set.iter().find(|&&i| {
                    let b = &svc.backends[usize::from(i)];
                    b.addr == addr && b.port == port
                })
            {
                let b = &svc.backends[usize::from(i)];
                affinity.put(svc.id, key.src, (b.addr, b.port), now_ns, timeout);
                return Ok(b);
            }
            let b = &svc.backends[usize::from(set[affinity.pick(key, set.len())])];
            affinity.put(svc.id, key.src, (b.addr, b.port), now_ns, timeout);
            return Ok(b);
        }
        Ok(&svc.backends[usize::from(set[affinity.pick(key, set.len())])])
    }
}

/// Session affinity records: (Service, client address) -> endpoint, each valid until
/// its timeout passes without a new connection. Bounded: when full, expired records are
/// swept; if none is, the new record is not kept (the connection is still balanced, and
/// counted in [`Affinity::refused`]).
#[derive(Debug)]
pub struct Affinity {
    map: HashMap<(u64, IpAddr), Record, RandomState>,
    max: usize,
    hasher: RandomState,
    refused: u64,
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

    /// An empty table of at most `max` records.
    pub fn new(max: usize) -> Affinity {
        Affinity {
            map: HashMap::default(),
            max,
            hasher: RandomState::new(),
            refused: 0,
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
            self.map.retain(|_, r| r.deadline_ns > now_ns);
            if self.map.len() >= self.max {
                self.refused += 1;
                return;
            }
        }
        self.map.insert((service, client), rec);
    }

    /// Removes expired records, at most `budget` of them.
    pub fn expire(&mut self, now_ns: u64, budget: usize) -> usize {
        let mut n = 0;
        self.map.retain(|_, r| {
            if n < budget && r.deadline_ns <= now_ns {
                n += 1;
                false
            } else {
                true
            }
        });
        n
    }

    /// An index below `n` from the connection's key.
    fn pick(&self, key: &FlowKey, n: usize) -> usize {
        (self.hasher.hash_one(key) % n as u64) as usize
    }
}

#[cfg(test)]
mod tests;
