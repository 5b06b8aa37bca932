//! The CNI plugin's requests (`add`, `del`, `check`, `gc`) and the attachments they
//! make: persistent pod TAPs, recorded in the state directory ([`crate::state`]) and
//! adopted again by the next agent, and the DELs the plugin queued while no agent ran
//! ([`crate::del_queue`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ferry_api::{Answer, ApiError, ERR_AGENT, ERR_BAD_REQUEST, PodRef, Request, Response};
use ferry_linux::link;
use ferry_linux::{Port, TapPort};
use ipnet::IpNet;

use crate::cluster::{Cluster, ObjectKey};
use crate::compile::POD_GATEWAY_MAC;
use crate::del_queue;
use crate::state;
use crate::status::ErrorKind;

use super::Agent;

/// The pod interfaces the CNI plugin asked for, and what goes with them.
#[derive(Default)]
pub(super) struct Attachments {
    /// By container ID and interface name.
    pub(super) pods: BTreeMap<(String, String), CniPod>,
    /// TAPs of recorded attachments opened again at start, until their ports open.
    pub(super) adopted: BTreeMap<ObjectKey, Box<dyn Port>>,
    /// Persistent pod TAPs made by the [`Agent::apply`] under way, deleted again when it
    /// fails.
    pub(super) made: Vec<(String, String)>,
    /// The DEL queue could not be read last time (reported once until it can).
    del_queue_failing: bool,
}

/// A pod interface the CNI plugin asked for.
#[derive(Clone, Debug)]
pub(super) struct CniPod {
    pub(super) pod: ObjectKey,
    /// The `ip netns` name of its namespace.
    pub(super) netns: String,
    /// The name was made by the agent (`ip netns attach`) and goes with the pod.
    pub(super) named_here: bool,
    pub(super) ifname: String,
    pub(super) addresses: Vec<IpNet>,
}

impl Agent {
    /// Answers an `add`: checks it, names the namespace when given as a process's, and
    /// puts the tables with the pod's port in force; the attachment is recorded once
    /// they are.
    pub(super) fn cni_add(
        &mut self,
        cluster: Arc<Cluster>,
        container_id: String,
        netns: &str,
        ifname: String,
        pod: PodRef,
        addresses: &[String],
    ) -> Response {
        let id = (container_id.clone(), ifname.clone());
        if let Some(c) = self.cni.pods.get(&id) {
            // The same ADD again: the same answer.
            return self.add_answer(&c.addresses.clone());
        }
        let (addrs, netns) = match check_add(&container_id, &ifname, netns, addresses) {
            Ok(checked) => checked,
            Err(e) => return Response::Error(e),
        };
        let key = ObjectKey::new(&pod.namespace, &pod.name);
        if self.cni.pods.values().any(|c| c.pod == key) {
            return Response::error(
                ERR_AGENT,
                "the pod already has an interface from another container",
                key.to_string(),
            );
        }
        let (netns, named_here) = match netns {
            Netns::Named(n) => (n, false),
            Netns::OfProcess(pid) => {
                let name = format!("ferry-{}", &container_id[..container_id.len().min(24)]);
                if let Err(e) = link::ip(&["netns", "attach", &name, &pid.to_string()]) {
                    return Response::error(
                        4,
                        "CNI_NETNS: the network namespace cannot be used",
                        format!("/proc/{pid}/ns/net: {e}"),
                    );
                }
                (name, true)
            }
        };
        self.cni.pods.insert(
            id.clone(),
            CniPod {
                pod: key,
                netns,
                named_here,
                ifname,
                addresses: addrs.clone(),
            },
        );
        match self.apply_steps(cluster) {
            Ok(a) => {
                tracing::info!(container = %container_id, opened = ?a.opened, "pod attached");
                self.save_state();
                self.add_answer(&addrs)
            }
            Err(e) => {
                if let Some(c) = self.cni.pods.remove(&id)
                    && c.named_here
                {
                    let _ = link::ip(&["netns", "delete", &c.netns]);
                }
                Response::error(
                    e.step.cni_code(),
                    "the pod's interface could not be made",
                    e.error,
                )
            }
        }
    }

    /// The answer to an `add` of a pod with addresses `addrs`.
    pub(super) fn add_answer(&self, addrs: &[IpNet]) -> Response {
        let mut gateways = Vec::new();
        if addrs.iter().any(|a| a.addr().is_ipv4()) {
            gateways.push(ferry_datapath::GATEWAY_V4);
        }
        if addrs.iter().any(|a| a.addr().is_ipv6()) {
            gateways.push(ferry_datapath::GATEWAY_V6);
        }
        Response::Ok(Answer {
            mtu: Some(self.pod_mtu()),
            mac: addrs
                .first()
                .map(|a| crate::compile::pod_mac(a.addr()).to_string()),
            gateways,
            ..Answer::default()
        })
    }

    /// Answers a `del`: the attachment goes, with its port and interface.
    pub(super) fn cni_del(
        &mut self,
        cluster: Arc<Cluster>,
        container_id: String,
        ifname: String,
    ) -> Response {
        let Some(gone) = self.cni.pods.remove(&(container_id, ifname)) else {
            return Response::Ok(Answer::default());
        };
        self.cni_release(cluster, vec![gone])
    }

    /// Answers a `check`: the attachment is there, in the namespace `netns` names, and
    /// its pod's port is open and in service.
    pub(super) fn cni_check(&self, container_id: &str, ifname: &str, netns: String) -> Response {
        let Some(c) = self
            .cni
            .pods
            .get(&(container_id.to_string(), ifname.to_string()))
        else {
            return Response::error(3, "no such attachment", format!("{container_id} {ifname}"));
        };
        if matches!(netns_name(&netns), Ok(Netns::Named(n)) if n != c.netns) && !c.named_here {
            return Response::error(
                4,
                "CNI_NETNS: the attachment is in another network namespace",
                netns,
            );
        }
        match self.last.as_ref().and_then(|l| {
            let port =
                l.tables.ports.iter().find(|p| {
                    p.addresses.first() == c.addresses.first().map(IpNet::addr).as_ref()
                })?;
            Some(port.name.clone())
        }) {
            Some(port) if self.port_gone(&port) => Response::error(
                ERR_AGENT,
                "the pod's port is out of service: its device is gone",
                c.pod.to_string(),
            ),
            Some(port) if self.open.contains(&port) => Response::Ok(Answer::default()),
            _ => Response::error(
                ERR_AGENT,
                "the pod has no port in the tables in force",
                c.pod.to_string(),
            ),
        }
    }

    /// Answers a `gc`: the attachments not in `valid` go.
    pub(super) fn cni_gc(
        &mut self,
        cluster: Arc<Cluster>,
        valid: Vec<ferry_api::Attachment>,
    ) -> Response {
        let keep: BTreeSet<(String, String)> = valid
            .into_iter()
            .map(|a| (a.container_id, a.ifname))
            .collect();
        let gone: Vec<(String, String)> = self
            .cni
            .pods
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        if gone.is_empty() {
            return Response::Ok(Answer::default());
        }
        let gone = gone
            .iter()
            .filter_map(|k| self.cni.pods.remove(k))
            .collect();
        self.cni_release(cluster, gone)
    }

    /// Compiles again without the pods `gone` (their ports close, their persistent
    /// interfaces are deleted) and records the attachments left.
    pub(super) fn cni_release(&mut self, cluster: Arc<Cluster>, gone: Vec<CniPod>) -> Response {
        let r = match self.apply_steps(cluster) {
            Ok(a) => {
                tracing::info!(closed = ?a.closed, "pods detached");
                Response::Ok(Answer::default())
            }
            Err(e) => Response::error(
                e.step.cni_code(),
                "the tables without the pod could not be applied",
                e.error,
            ),
        };
        for c in &gone {
            remove_interface(&c.netns, &c.ifname, c.named_here);
        }
        self.save_state();
        r
    }

    /// Carries out the DELs the CNI plugin queued while the agent was not running (or
    /// while it started, before its socket was there), each as the `del` request it
    /// stands for, and removes them from the queue once done; a queue file that is not
    /// a DEL is removed with a warning and counted ([`ErrorKind::Api`]). `cluster` is
    /// the state in force. Cheap when the queue is empty (one directory read): the
    /// agent's loop calls it every second.
    pub fn carry_out_queued_dels(&mut self, cluster: &Arc<Cluster>) {
        for entry in self.queued_dels() {
            let request = Request::Del {
                container_id: entry.container_id.clone(),
                ifname: entry.ifname.clone(),
            };
            match self.handle(Arc::clone(cluster), request) {
                Response::Ok(_) => tracing::info!(container = %entry.container_id,
                    ifname = %entry.ifname, "queued CNI DEL carried out"),
                // The attachment is gone all the same (as for a `del` the plugin sends):
                // the tables without it follow with the next change.
                Response::Error(e) => tracing::warn!(container = %entry.container_id,
                    ifname = %entry.ifname, code = e.code,
                    "queued CNI DEL carried out, but {}: {}", e.msg, e.details),
            }
            self.dequeue(&entry);
        }
    }

    /// The DELs queued now; the files that are not queued DELs are removed, logged and
    /// counted.
    pub(super) fn queued_dels(&mut self) -> Vec<del_queue::Entry> {
        let Some(dir) = self.opts.del_queue.clone() else {
            return Vec::new();
        };
        let scan = match del_queue::scan(&dir) {
            Ok(scan) => scan,
            Err(e) => {
                // Reported once until it can be read again.
                if !self.cni.del_queue_failing {
                    tracing::error!(dir = %dir.display(), error = %e,
                        "the CNI plugin's queued DELs cannot be read");
                    self.status.count(ErrorKind::Api);
                }
                self.cni.del_queue_failing = true;
                return Vec::new();
            }
        };
        self.cni.del_queue_failing = false;
        for d in &scan.dropped {
            tracing::warn!(file = %d.path.display(), reason = %d.reason,
                not_removed = ?d.not_removed, "queued CNI DEL dropped: not a DEL");
            self.status.count(ErrorKind::Api);
        }
        scan.entries
    }

    /// Removes the queue file of a DEL carried out.
    pub(super) fn dequeue(&self, entry: &del_queue::Entry) {
        if let Err(e) = del_queue::done(entry) {
            tracing::error!(file = %entry.path.display(), error = %e,
                "the queued CNI DEL carried out was not removed from the queue");
        }
    }

    /// Reads the attachments recorded in the state directory and opens their TAPs again.
    /// One whose namespace or interface is gone (or is not ours) is dropped from the
    /// record, with a warning, and counted ([`ErrorKind::Apply`]: a port that did not
    /// open). A state file that does not parse is moved aside; the agent starts without
    /// attachments then.
    ///
    /// The DELs the CNI plugin queued while no agent ran go first: the attachment each
    /// names (by container ID and interface name, as a `del` finds it) is not adopted,
    /// its interface and the namespace name the agent made for it are deleted (what a
    /// `del` undoes), and it is dropped from the record before the queue file goes.
    pub(super) fn adopt_recorded(&mut self) {
        if let Some(queue) = &self.opts.del_queue
            && let Err(e) = del_queue::create(queue)
        {
            tracing::error!(dir = %queue.display(), error = %e,
                "the queue of the CNI plugin's DELs cannot be made");
            self.status.count(ErrorKind::Api);
        }
        let queued = self.queued_dels();
        self.adopt_recorded_but(&queued);
        for entry in &queued {
            self.dequeue(entry);
        }
    }

    /// [`Agent::adopt_recorded`], with the DELs `queued`.
    pub(super) fn adopt_recorded_but(&mut self, queued: &[del_queue::Entry]) {
        let Some(dir) = self.opts.state_dir.clone() else {
            return;
        };
        let mut recorded = match state::load(&dir) {
            Ok(state::Loaded::Missing) => return,
            Ok(state::Loaded::Attachments(a)) => a,
            Ok(state::Loaded::Corrupt { error, moved_to }) => {
                tracing::error!(
                    file = %state::path(&dir).display(),
                    moved_to = ?moved_to,
                    "the state file is corrupt ({error}): starting with no pod attachments"
                );
                self.status.count(ErrorKind::Apply);
                return;
            }
            Err(e) => {
                tracing::error!(
                    file = %state::path(&dir).display(),
                    "the state file cannot be read ({e}): starting with no pod attachments"
                );
                self.status.count(ErrorKind::Apply);
                return;
            }
        };
        let n = recorded.len();
        recorded.retain(|a| {
            let deleted = queued
                .iter()
                .any(|q| q.container_id == a.container_id && q.ifname == a.ifname);
            if deleted {
                tracing::info!(container = %a.container_id, pod = %format!("{}/{}",
                    a.pod_namespace, a.pod_name), netns = %a.netns, ifname = %a.ifname,
                    "recorded pod attachment deleted: the CNI plugin queued its DEL");
                remove_interface(&a.netns, &a.ifname, a.named_here);
            }
            !deleted
        });
        for a in recorded {
            let pod = ObjectKey::new(&a.pod_namespace, &a.pod_name);
            // A port the previous agent handed over is that interface already.
            let t0 = std::time::Instant::now();
            let opened = if self.cni.adopted.contains_key(&pod) {
                Ok(None)
            } else {
                adopt(&a, self.queues()).map(Some)
            };
            match opened {
                Ok(tap) => {
                    tracing::info!(container = %a.container_id, %pod, netns = %a.netns,
                        ifname = %a.ifname, handed_over = tap.is_none(),
                        took_ms = t0.elapsed().as_secs_f64() * 1e3, "pod interface adopted");
                    // An interface made before the gateway's neighbours were pinned
                    // ([`link::pin_gateway`]) gets them now.
                    let v4 = a.addresses.iter().any(|n| n.addr().is_ipv4());
                    let v6 = a.addresses.iter().any(|n| n.addr().is_ipv6());
                    if let Err(e) =
                        link::pin_gateway(&a.netns, &a.ifname, POD_GATEWAY_MAC.0, v4, v6)
                    {
                        tracing::warn!(%pod, netns = %a.netns, ifname = %a.ifname, error = %e,
                            "the pod's neighbour entries for its gateway were not set: its \
                             traffic may wait for the gateway's MAC after a restart");
                    }
                    if let Some(tap) = tap {
                        self.cni.adopted.insert(pod.clone(), Box::new(tap));
                    }
                    self.cni.pods.insert(
                        (a.container_id, a.ifname.clone()),
                        CniPod {
                            pod,
                            netns: a.netns,
                            named_here: a.named_here,
                            ifname: a.ifname,
                            addresses: a.addresses,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(container = %a.container_id, %pod, netns = %a.netns,
                        ifname = %a.ifname, "recorded pod attachment dropped: {e}");
                    self.status.count(ErrorKind::Apply);
                }
            }
        }
        if self.cni.pods.len() != n {
            self.save_state();
        }
    }

    /// Records the attachments in force in the state directory; a failure is logged
    /// (the attachments work on, but a restart would not find them).
    pub(super) fn save_state(&self) {
        let Some(dir) = &self.opts.state_dir else {
            return;
        };
        let all: Vec<state::Attachment> = self
            .cni
            .pods
            .iter()
            .map(|((container_id, _), c)| state::Attachment {
                container_id: container_id.clone(),
                ifname: c.ifname.clone(),
                pod_namespace: c.pod.namespace.clone(),
                pod_name: c.pod.name.clone(),
                netns: c.netns.clone(),
                named_here: c.named_here,
                addresses: c.addresses.clone(),
            })
            .collect();
        if let Err(e) = state::save(dir, &all) {
            tracing::error!(
                "the pod attachments were not recorded in {}: {e}",
                dir.display()
            );
        }
    }
}

/// Deletes a CNI attachment's persistent interface `ifname` in namespace `netns`, and
/// the namespace's `ip netns` name when the agent made it (`named_here`): what a `del`
/// undoes besides the tables. A failure is logged (a namespace deleted already took
/// the interface with it).
fn remove_interface(netns: &str, ifname: &str, named_here: bool) {
    if let Err(e) = link::delete_in_netns(netns, ifname) {
        tracing::warn!(%netns, %ifname, error = %e, "pod interface not deleted");
    }
    if named_here {
        let _ = link::ip(&["netns", "delete", netns]);
    }
}

/// Opens the TAP of recorded attachment `a` again, after checking its namespace is
/// still there.
fn adopt(a: &state::Attachment, queues: u16) -> Result<TapPort, String> {
    let ns = ferry_linux::netns::path(&a.netns).map_err(|e| e.to_string())?;
    if !ns.exists() {
        return Err(format!("network namespace {} is gone", a.netns));
    }
    let first = a.addresses.first().ok_or("no address recorded")?;
    let mac = crate::compile::pod_mac(first.addr());
    // A single-queue TAP is busy while another process holds it: the previous agent,
    // killed a moment ago, whose last threads are still going. It lets go soon.
    let deadline = std::time::Instant::now() + ADOPT_BUSY_WAIT;
    loop {
        match link::reopen_pod_tap(&a.netns, &a.ifname, mac.0, queues) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.map_err(|e| e.to_string()),
        }
    }
}

/// How long adoption waits for a TAP another process still holds.
const ADOPT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A pod's network namespace as an `add` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Netns {
    /// `/var/run/netns/NAME` or `/run/netns/NAME`: its `ip netns` name.
    Named(String),
    /// `/proc/PID/ns/net`: the process's, which the agent names to use it.
    OfProcess(u32),
}

/// The `ip netns` name of a CNI_NETNS path: `/var/run/netns/NAME` or `/run/netns/NAME`
/// give NAME; `/proc/PID/ns/net` gives no name yet but the PID to attach one to.
fn netns_name(path: &str) -> Result<Netns, String> {
    for dir in ["/var/run/netns/", "/run/netns/"] {
        if let Some(n) = path.strip_prefix(dir)
            && !n.is_empty()
            && !n.contains('/')
        {
            return Ok(Netns::Named(n.to_string()));
        }
    }
    if let Some(pid) = path
        .strip_prefix("/proc/")
        .and_then(|r| r.strip_suffix("/ns/net"))
        .and_then(|p| p.parse::<u32>().ok())
    {
        return Ok(Netns::OfProcess(pid));
    }
    Err(format!(
        "{path:?}: expected /var/run/netns/NAME, /run/netns/NAME or /proc/PID/ns/net"
    ))
}

/// Checks what an `add` asks for before anything is made: the container ID and
/// interface name, the addresses (ADDR/LEN, at least one) and the namespace (a path
/// the agent can use, there now). An error is the answer's, with the code docs/cni.md
/// gives: 4 for what comes from the runtime's `CNI_*` variables, [`ERR_BAD_REQUEST`]
/// for the plugin's addresses.
fn check_add(
    container_id: &str,
    ifname: &str,
    netns: &str,
    addresses: &[String],
) -> Result<(Vec<IpNet>, Netns), ApiError> {
    if container_id.is_empty() || ifname.is_empty() || ifname.len() > 15 {
        return Err(ApiError::new(
            4,
            "CNI_CONTAINERID and CNI_IFNAME (at most 15 bytes) are required",
            format!("{container_id:?} {ifname:?}"),
        ));
    }
    let mut addrs = Vec::new();
    for a in addresses {
        match a.parse::<IpNet>() {
            Ok(n) => addrs.push(n),
            Err(_) => {
                return Err(ApiError::new(
                    ERR_BAD_REQUEST,
                    "a pod address is not ADDR/LEN",
                    a.clone(),
                ));
            }
        }
    }
    if addrs.is_empty() {
        return Err(ApiError::new(
            ERR_BAD_REQUEST,
            "the pod has no address",
            container_id.to_string(),
        ));
    }
    let ns = netns_name(netns)
        .map_err(|e| ApiError::new(4, "CNI_NETNS: the network namespace cannot be used", e))?;
    if !std::path::Path::new(netns).exists() {
        return Err(ApiError::new(
            4,
            "CNI_NETNS: the network namespace does not exist",
            netns.to_string(),
        ));
    }
    Ok((addrs, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_paths_give_a_name_or_a_pid() {
        assert_eq!(
            netns_name("/var/run/netns/cni-1").unwrap(),
            Netns::Named("cni-1".into())
        );
        assert_eq!(
            netns_name("/run/netns/x").unwrap(),
            Netns::Named("x".into())
        );
        assert_eq!(netns_name("/proc/42/ns/net").unwrap(), Netns::OfProcess(42));
        for bad in [
            "",
            "/var/run/netns/",
            "/tmp/ns",
            "/proc/x/ns/net",
            "/var/run/netns/a/b",
        ] {
            assert!(netns_name(bad).is_err(), "{bad}");
        }
    }

    fn code(r: Result<(Vec<IpNet>, Netns), ApiError>) -> u32 {
        match r {
            Err(e) => e.code,
            r => panic!("expected an error answer, got {r:?}"),
        }
    }

    #[test]
    fn add_requests_are_checked_with_the_cni_codes_of_their_faults() {
        let addrs = ["10.244.1.5/24".to_string()];
        // This process's namespace: a path that is there.
        let here = format!("/proc/{}/ns/net", std::process::id());
        let (a, ns) = check_add("c1", "eth0", &here, &addrs).unwrap();
        assert_eq!(a, ["10.244.1.5/24".parse::<IpNet>().unwrap()]);
        assert_eq!(ns, Netns::OfProcess(std::process::id()));
        // What the runtime gives (CNI_NETNS, CNI_CONTAINERID, CNI_IFNAME): 4.
        assert_eq!(code(check_add("c1", "eth0", "/tmp/elsewhere", &addrs)), 4);
        let gone = "/var/run/netns/ferry-test-no-such-namespace";
        assert_eq!(code(check_add("c1", "eth0", gone, &addrs)), 4);
        assert_eq!(code(check_add("c1", "eth0", "/proc/0/ns/net", &addrs)), 4);
        assert_eq!(code(check_add("", "eth0", &here, &addrs)), 4);
        assert_eq!(
            code(check_add("c1", "eth0-is-far-too-long", &here, &addrs)),
            4
        );
        // What the plugin gives: a bad request.
        let bad = ["10.244.1.5".to_string()];
        assert_eq!(code(check_add("c1", "eth0", &here, &bad)), ERR_BAD_REQUEST);
        assert_eq!(code(check_add("c1", "eth0", &here, &[])), ERR_BAD_REQUEST);
    }
}
