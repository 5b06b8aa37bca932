//! Putting a cluster state in force: compiled whole, or only the Services that changed
//! patched into the tables in force; the new tables and ports handed to the worker.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use ferry_api::{ERR_INTERFACE, ERR_TABLES};
use ferry_datapath::Tables;
use ferry_linux::link;
use ferry_linux::worker::Update;

use crate::cluster::{Cluster, Kind, ObjectKey};
use crate::compile::policy::{self, PolicyOptions};
use crate::compile::{Compiled, HealthCheck, service_tables};
use crate::config::FerryConfig;
use crate::status::ErrorKind;

use super::{APPLY_TIMEOUT, Agent, Applied};

/// The state in force.
pub(super) struct Last {
    pub(super) cluster: Arc<Cluster>,
    pub(super) tables: Arc<Tables>,
    /// The tables entries of each Service.
    service_ports: BTreeMap<ObjectKey, Vec<String>>,
    /// Health check node ports by Service (`namespace/name`).
    health: BTreeMap<String, HealthCheck>,
    /// The port of each attached pod.
    pub(super) pod_ports: BTreeMap<ObjectKey, String>,
    /// The addresses of each attached pod's port.
    pub(super) pod_addresses: BTreeMap<ObjectKey, Vec<std::net::IpAddr>>,
    /// The policy section's compilation of `cluster`, for the next change.
    policy_cache: policy::PolicyCache,
}

impl Last {
    /// The state `cluster` in force with `tables`, compiled whole into `compiled`.
    pub(super) fn new(cluster: Arc<Cluster>, tables: Arc<Tables>, compiled: Compiled) -> Last {
        let mut service_ports: BTreeMap<ObjectKey, Vec<String>> = BTreeMap::new();
        for s in &compiled.tables.services {
            if let Some(key) = service_key(&s.name) {
                service_ports.entry(key).or_default().push(s.name.clone());
            }
        }
        Last {
            cluster,
            tables,
            service_ports,
            health: compiled
                .health_checks
                .iter()
                .map(|h| (h.service.clone(), h.clone()))
                .collect(),
            pod_ports: compiled.pod_ports,
            pod_addresses: compiled.pod_addresses,
            policy_cache: compiled.policy_cache,
        }
    }
}

/// Why a state was not put in force: the step that failed, and the error.
#[derive(Clone, Debug)]
pub(super) struct NotApplied {
    pub(super) step: Step,
    pub(super) error: String,
}

/// A step of putting a state in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Compiling the tables: they stay refused until the cluster changes.
    Compile,
    /// Opening a port: a TAP not made, not moved into its pod's namespace.
    Port,
    /// Handing the tables to the worker: it is slow or stopped.
    Worker,
}

impl Step {
    /// The error code of a CNI request (`add`, `del`, `gc`) that failed at this step
    /// (docs/cni.md): only a busy worker is worth trying again later (a stopped one goes
    /// with the agent, which its DaemonSet starts again).
    pub(super) fn cni_code(self) -> u32 {
        match self {
            Step::Compile => ERR_TABLES,
            Step::Port => ERR_INTERFACE,
            Step::Worker => 11,
        }
    }
}

/// `r`'s error as a [`NotApplied`] at `step`.
pub(super) fn at<T>(step: Step, r: Result<T, String>) -> Result<T, NotApplied> {
    r.map_err(|error| NotApplied { step, error })
}

/// The Service of a tables entry named `namespace/name:port`.
pub(super) fn service_key(entry: &str) -> Option<ObjectKey> {
    let (svc, _) = entry.rsplit_once(':')?;
    let (ns, name) = svc.split_once('/')?;
    Some(ObjectKey::new(ns, name))
}

impl Agent {
    /// Switches the node to the tables of `cluster`, of which `changed` lists the
    /// objects that differ from the state in force ([`Cluster::diff`]). When only
    /// Services and EndpointSlices changed, only the Services concerned are compiled and
    /// patched into the tables in force; otherwise the whole node is compiled again. On
    /// an error nothing changed, and the change stays pending for the agent's health
    /// ([`crate::proxy_health`]) until a state is put in force.
    pub fn apply_changes(
        &mut self,
        cluster: Arc<Cluster>,
        changed: &[(Kind, ObjectKey)],
    ) -> Result<Applied, String> {
        self.health.proxy.queued();
        // The node's eligibility follows the newest state, in force or not.
        self.health.proxy.set_node(cluster.node(&self.opts.node));
        let r = self.apply_changed(cluster, changed);
        if r.is_ok() {
            self.health.proxy.updated();
        }
        r
    }

    /// Puts in force, alone, the Service and EndpointSlice changes among `changed` (the
    /// objects of `cluster` that differ from the state in force), after `cluster` as a
    /// whole could not be ([`Agent::apply_changes`] failed): the state in force with those
    /// objects as `cluster` has them, patched into the tables in force as a change of
    /// Services only is. So a change the agent cannot put in force (a pod whose namespace
    /// is not there yet, a Node that does not compile) does not hold back every later
    /// endpoint change. The rest stays pending ([`crate::proxy_health`]).
    ///
    /// Returns that state (now the one in force) and what was done; None when `changed`
    /// holds no such change, or nothing else.
    pub fn apply_services_alone(
        &mut self,
        cluster: &Cluster,
        changed: &[(Kind, ObjectKey)],
    ) -> Option<Result<(Arc<Cluster>, Applied), String>> {
        let services: Vec<(Kind, ObjectKey)> = changed
            .iter()
            .filter(|(k, _)| matches!(k, Kind::Service | Kind::EndpointSlice))
            .cloned()
            .collect();
        if services.is_empty() || services.len() == changed.len() {
            return None;
        }
        let part = Arc::new(
            self.last
                .as_ref()?
                .cluster
                .with_changes_of(cluster, &services),
        );
        Some(
            self.apply_changed(Arc::clone(&part), &services)
                .map(|a| (part, a)),
        )
    }

    /// The datastore's last state is the one in force (it changed nothing, or its
    /// changes were undone): no change is pending.
    pub fn up_to_date(&self) {
        self.health.proxy.updated();
    }

    /// Puts `cluster` in force: only the Services concerned when only Services and
    /// EndpointSlices changed (`changed`), only the policy section when only what
    /// policy reads changed, else compiled whole.
    pub(super) fn apply_changed(
        &mut self,
        cluster: Arc<Cluster>,
        changed: &[(Kind, ObjectKey)],
    ) -> Result<Applied, String> {
        let services_only = changed
            .iter()
            .all(|(k, _)| matches!(k, Kind::Service | Kind::EndpointSlice));
        match &self.last {
            Some(last) if services_only => {
                let mut keys = BTreeSet::new();
                for (kind, key) in changed {
                    match kind {
                        Kind::Service => {
                            keys.insert(key.clone());
                        }
                        _ => keys.extend(
                            [&last.cluster, &cluster]
                                .into_iter()
                                .filter_map(|c| c.service_of_slice(key)),
                        ),
                    }
                }
                self.apply_services(cluster, &keys)
            }
            Some(last) if policy_only(&self.opts.node, &last.cluster, &cluster, changed) => {
                self.apply_policy(cluster, changed)
            }
            _ => self.apply(cluster),
        }
    }

    /// Compiles the Services `keys` of `cluster` and patches them into the tables in
    /// force.
    pub(super) fn apply_services(
        &mut self,
        cluster: Arc<Cluster>,
        keys: &BTreeSet<ObjectKey>,
    ) -> Result<Applied, String> {
        if let Some(e) = self.worker_error() {
            return Err(format!("the worker stopped: {e}"));
        }
        let t0 = Instant::now();
        let last = self.last.as_ref().ok_or("nothing in force yet")?;
        let st = service_tables(&cluster, &self.opts.node, keys, &self.opts.compile)
            .inspect_err(|_| self.status.count(ErrorKind::Compile))?;
        let removed: Vec<&str> = keys
            .iter()
            .filter_map(|k| last.service_ports.get(k))
            .flatten()
            .map(String::as_str)
            .collect();
        let tables = Arc::new(
            last.tables
                .with_services(&removed, &st.specs)
                .inspect_err(|_| self.status.count(ErrorKind::Compile))?,
        );
        let compile = t0.elapsed();
        let (applied, swap) = self.hand_patch(&tables)?;
        let closed: Vec<String> = applied.closed.iter().map(|(n, _)| n.clone()).collect();
        drop(applied.closed);
        let Some(last) = self.last.as_mut() else {
            return Err("nothing in force yet".into());
        };
        for k in keys {
            last.service_ports.remove(k);
            last.health.remove(&k.to_string());
        }
        for s in &st.specs {
            if let Some(key) = service_key(&s.name) {
                last.service_ports
                    .entry(key)
                    .or_default()
                    .push(s.name.clone());
            }
        }
        for h in st.health_checks {
            last.health.insert(h.service.clone(), h);
        }
        last.cluster = cluster;
        last.tables = Arc::clone(&tables);
        let checks: Vec<HealthCheck> = last.health.values().cloned().collect();
        self.generation += 1;
        self.health.set(&checks, &mut self.status);
        self.host.set_nat(self.opts.host_tap.as_deref(), &tables);
        Ok(Applied {
            generation: self.generation,
            compile,
            swap,
            opened: Vec::new(),
            closed,
            ct_removed: applied.report.ct_removed,
            policy_cut: applied.report.policy_cut,
            incremental: true,
            warnings: st.warnings,
        })
    }

    /// Hands patched `tables` (no port opened or closed by the patch itself) to the
    /// worker: what it answered, and how long it took.
    fn hand_patch(
        &mut self,
        tables: &Arc<Tables>,
    ) -> Result<(ferry_linux::worker::Applied, std::time::Duration), String> {
        let t1 = Instant::now();
        let update = Update {
            tables: Arc::clone(tables),
            new_ports: Vec::new(),
        };
        let applied = self.control.send(update, APPLY_TIMEOUT).map_err(|e| {
            self.status.count(ErrorKind::Apply);
            format!("the worker did not take the new tables: {e}")
        })?;
        Ok((applied, t1.elapsed()))
    }

    /// Compiles the policy section of `cluster` for the pods in force and patches it
    /// into the tables in force: only what `changed` (the objects that differ from the
    /// state in force) touched is compiled again.
    pub(super) fn apply_policy(
        &mut self,
        cluster: Arc<Cluster>,
        changed: &[(Kind, ObjectKey)],
    ) -> Result<Applied, String> {
        if let Some(e) = self.worker_error() {
            return Err(format!("the worker stopped: {e}"));
        }
        let t0 = Instant::now();
        let last = self.last.as_mut().ok_or("nothing in force yet")?;
        let config =
            FerryConfig::of(&cluster).inspect_err(|_| self.status.count(ErrorKind::Compile))?;
        let held = policy::Held::of(&cluster).with_ports(last.pod_addresses.clone());
        let spec = last.policy_cache.compile(
            &policy::inputs(&cluster, &held),
            &last.pod_ports,
            PolicyOptions::of(&config),
            policy::Changes::Only(changed),
        );
        tracing::debug!(
            resolved = last.policy_cache.resolved(),
            rules = spec.rules.len(),
            "policy section compiled again"
        );
        // The cache follows `cluster` now; until it is in force, a next change would be
        // told relative to the state in force, so a failure from here on starts over.
        let tables = match last.tables.with_policy(&spec) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                last.policy_cache = policy::PolicyCache::new();
                self.status.count(ErrorKind::Compile);
                return Err(e);
            }
        };
        let compile = t0.elapsed();
        let (applied, swap) = match self.hand_patch(&tables) {
            Ok(r) => r,
            Err(e) => {
                if let Some(last) = self.last.as_mut() {
                    last.policy_cache = policy::PolicyCache::new();
                }
                return Err(e);
            }
        };
        let Some(last) = self.last.as_mut() else {
            return Err("nothing in force yet".into());
        };
        last.cluster = cluster;
        last.tables = tables;
        self.generation += 1;
        Ok(Applied {
            generation: self.generation,
            compile,
            swap,
            opened: Vec::new(),
            closed: Vec::new(),
            ct_removed: applied.report.ct_removed,
            policy_cut: applied.report.policy_cut,
            incremental: true,
            warnings: Vec::new(),
        })
    }

    /// Switches the node to the tables of `cluster`, compiled whole. On an error nothing
    /// changed.
    pub fn apply(&mut self, cluster: Arc<Cluster>) -> Result<Applied, String> {
        self.apply_steps(cluster).map_err(|e| e.error)
    }

    /// [`Agent::apply`], saying which step failed.
    pub(super) fn apply_steps(&mut self, cluster: Arc<Cluster>) -> Result<Applied, NotApplied> {
        self.cni.made.clear();
        let r = self.apply_whole(cluster);
        let made = std::mem::take(&mut self.cni.made);
        if r.is_err() {
            // The ports were dropped, but persistent TAPs stay unless deleted.
            for (netns, ifname) in made {
                if let Err(e) = link::delete_in_netns(&netns, &ifname) {
                    tracing::warn!(%netns, %ifname, error = %e, "pod interface not deleted");
                }
            }
        }
        r
    }

    /// [`Agent::apply_steps`] without the clean-up of the TAPs made on a failure.
    pub(super) fn apply_whole(&mut self, cluster: Arc<Cluster>) -> Result<Applied, NotApplied> {
        if let Some(e) = self.worker_error() {
            return at(Step::Worker, Err(format!("the worker stopped: {e}")));
        }
        let t0 = Instant::now();
        let mut compiled = at(
            Step::Compile,
            self.compile(&cluster)
                .inspect_err(|_| self.status.count(ErrorKind::Compile)),
        )?;
        let tables = Arc::clone(&compiled.compiled);
        let compile = t0.elapsed();
        let mut new_ports = Vec::new();
        for p in &tables.ports {
            if self.open.contains(&p.name) {
                continue;
            }
            let port = at(
                Step::Port,
                self.open_port(&p.name, &tables, &compiled)
                    .inspect_err(|_| self.status.count(ErrorKind::Apply)),
            )?;
            new_ports.push((p.name.clone(), port));
        }
        let opened: Vec<String> = new_ports.iter().map(|(n, _)| n.clone()).collect();
        let update = Update {
            tables: Arc::clone(&tables),
            new_ports,
        };
        let t1 = Instant::now();
        let applied = self.control.send(update, APPLY_TIMEOUT).map_err(|e| {
            self.status.count(ErrorKind::Apply);
            NotApplied {
                step: Step::Worker,
                error: format!("the worker did not take the new tables: {e}"),
            }
        })?;
        let swap = t1.elapsed();
        let closed: Vec<String> = applied.closed.iter().map(|(n, _)| n.clone()).collect();
        // Closing a pod's TAP removes its eth0; done here, off the worker's thread.
        drop(applied.closed);
        self.open = tables.ports.iter().map(|p| p.name.clone()).collect();
        self.generation += 1;
        self.health.set(&compiled.health_checks, &mut self.status);
        self.host.set_nat(self.opts.host_tap.as_deref(), &tables);
        let warnings = std::mem::take(&mut compiled.warnings);
        self.last = Some(Last::new(cluster, tables, compiled));
        Ok(Applied {
            generation: self.generation,
            compile,
            swap,
            opened,
            closed,
            ct_removed: applied.report.ct_removed,
            policy_cut: applied.report.policy_cut,
            incremental: false,
            warnings,
        })
    }
}

/// True when every change of `changed` (from `before` to `after`) is one only policy
/// reads: a NetworkPolicy, a ClusterNetworkPolicy, a Namespace, or a Pod of another
/// node (in both states: a pod that comes to this node or leaves it changes ports).
fn policy_only(
    node: &str,
    before: &Cluster,
    after: &Cluster,
    changed: &[(Kind, ObjectKey)],
) -> bool {
    let elsewhere = |c: &Cluster, key: &ObjectKey| match c.pods.get(key) {
        None => true,
        Some(p) => p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node),
    };
    !changed.is_empty()
        && changed.iter().all(|(kind, key)| match kind {
            Kind::NetworkPolicy | Kind::ClusterNetworkPolicy | Kind::Namespace => true,
            Kind::Pod => elsewhere(before, key) && elsewhere(after, key),
            Kind::Node | Kind::Service | Kind::EndpointSlice | Kind::ConfigMap => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_busy_worker_makes_a_cni_request_worth_trying_again_later() {
        assert_eq!(Step::Worker.cni_code(), 11);
        // An address of the pod that belongs to another pod stays so until the cluster
        // changes.
        assert_eq!(Step::Compile.cni_code(), ERR_TABLES);
        assert_eq!(Step::Port.cni_code(), ERR_INTERFACE);
    }

    #[test]
    fn service_keys_come_from_tables_entry_names() {
        assert_eq!(
            service_key("default/web:http"),
            Some(ObjectKey::new("default", "web"))
        );
        assert_eq!(
            service_key("kube-system/dns:53"),
            Some(ObjectKey::new("kube-system", "dns"))
        );
        assert_eq!(service_key("nonsense"), None);
    }
}
