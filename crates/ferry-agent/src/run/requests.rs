//! Answers to the local API's requests ([`ferry_api`]): the node, its counters,
//! connections, Services, traces and captures; the CNI plugin's requests are `cni`'s.

use std::sync::Arc;

use ferry_api::{Answer, ERR_AGENT, Request, Response};

use crate::cluster::Cluster;
use crate::compile::policy::{self, PolicyOptions};
use crate::fields::{NodeFields, describe};
use crate::observe;
use crate::policy::explain;
use crate::status::ErrorKind;

use super::{Agent, HELD_TIMEOUT};

impl Agent {
    /// Answers a request of the local API ([`ferry_api`]); `cluster` is the state in
    /// force, compiled again when pods come or go. Error answers are counted
    /// ([`ErrorKind::Api`]).
    pub fn handle(&mut self, cluster: Arc<Cluster>, req: Request) -> Response {
        let r = self.answer(cluster, req);
        if matches!(r, Response::Error(_)) {
            self.status.count(ErrorKind::Api);
        }
        r
    }

    /// The answer to `req`, before [`Agent::handle`] counts it.
    pub(super) fn answer(&mut self, cluster: Arc<Cluster>, req: Request) -> Response {
        match req {
            // 51, as CNI's STATUS means it: no ADD, and the pods already here have no
            // forwarding either.
            Request::Status => match self.worker_error() {
                None if self.is_running() => Response::Ok(Answer::default()),
                e => Response::error(
                    51,
                    "the agent's dataplane is not running",
                    e.unwrap_or_default(),
                ),
            },
            Request::Node => self.node_info(&cluster),
            // The API server hands a handover's connection to the loop, which carries it
            // out itself (`crate::handover`); one that got here had none.
            Request::Handover { .. } => Response::error(
                ferry_api::ERR_BAD_REQUEST,
                "a handover is carried out on a connection of its own",
                "",
            ),
            Request::Counters => Response::Ok(Answer {
                counters: Some(Box::new(self.counters())),
                ..Answer::default()
            }),
            Request::Conntrack {
                filter,
                delete,
                limit,
            } => crate::conntrack::request(&self.control, &filter, delete, limit),
            Request::Services => {
                let Some(last) = self.last.as_ref() else {
                    return Response::error(11, "no tables in force yet", "");
                };
                let conns = crate::services::count(&self.control);
                Response::Ok(Answer {
                    services: Some(crate::services::list(&last.tables, conns.as_ref())),
                    ..Answer::default()
                })
            }
            Request::Policy { pod } => self.policy_answer(&cluster, pod.as_deref()),
            Request::PolicyPreview { manifests, delete } => {
                self.policy_preview(&cluster, &manifests, delete)
            }
            Request::Trace {
                in_port,
                packet,
                frames,
                reply,
            } => {
                let input = observe::TraceInput {
                    in_port,
                    packet,
                    frames: frames.unwrap_or_default(),
                    reply,
                };
                match observe::trace(&self.control, input) {
                    Ok(report) => Response::Ok(Answer {
                        trace: serde_json::to_value(report).ok(),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "trace refused", e),
                }
            }
            Request::TraceStart { filter, count } => {
                match self.sessions.trace_start(&self.control, &filter, count) {
                    Ok(id) => Response::Ok(Answer {
                        session: Some(id),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "live trace refused", e),
                }
            }
            Request::TraceRead { session } => {
                match self.sessions.trace_read(&self.control, session) {
                    Ok((traced, remaining)) => Response::Ok(Answer {
                        traced: Some(traced_json(traced)),
                        remaining: Some(remaining),
                        ..Answer::default()
                    }),
                    Err(e) => refused("live trace", &e),
                }
            }
            Request::TraceStop { session } => {
                match self.sessions.trace_stop(&self.control, session) {
                    Ok(traced) => Response::Ok(Answer {
                        traced: Some(traced_json(traced)),
                        ..Answer::default()
                    }),
                    Err(e) => refused("live trace", &e),
                }
            }
            Request::CaptureStart { port, filter } => {
                match self.sessions.capture_start(&self.control, &port, &filter) {
                    Ok(id) => Response::Ok(Answer {
                        session: Some(id),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "capture refused", e),
                }
            }
            Request::CaptureRead { session } => {
                match self.sessions.capture_read(&self.control, session) {
                    Ok((frames, lost)) => captured_answer(frames, lost),
                    Err(e) => refused("capture", &e),
                }
            }
            Request::CaptureStop { session } => {
                match self.sessions.capture_stop(&self.control, session) {
                    Ok((frames, lost)) => captured_answer(frames, lost),
                    Err(e) => refused("capture", &e),
                }
            }
            Request::Add {
                container_id,
                netns,
                ifname,
                pod,
                addresses,
            } => self.cni_add(cluster, container_id, &netns, ifname, pod, &addresses),
            Request::Del {
                container_id,
                ifname,
            } => self.cni_del(cluster, container_id, ifname),
            Request::Check {
                container_id,
                ifname,
                netns,
            } => self.cni_check(&container_id, &ifname, netns),
            Request::Gc { valid } => self.cni_gc(cluster, valid),
        }
    }

    /// The dataplane's counters, from the worker's latest snapshot, with the agent's own
    /// health figures. What the snapshot lacks (fragments held now, NAT ports in use) is
    /// asked of the worker; when it does not answer within [`HELD_TIMEOUT`] those figures
    /// are 0 (docs/observability.md says so).
    pub fn counters(&self) -> ferry_api::Counters {
        let snap = self.snapshot();
        let held = self
            .control
            .run(HELD_TIMEOUT, |w| {
                let r = w.pipeline.reassembler();
                (
                    r.held_datagrams() as u64,
                    r.held_bytes() as u64,
                    w.pipeline.conntrack().nat_in_use() as u64,
                )
            })
            .unwrap_or_default();
        let (v4, v6) = (&snap.reassembly.v4, &snap.reassembly.v6);
        let refused = [
            ("too_small", v4.too_small + v6.too_small),
            ("overlapped", v4.overlapped + v6.overlapped),
            ("table_full", v4.table_full + v6.table_full),
            ("too_many", v4.too_many + v6.too_many),
            ("invalid", v4.invalid + v6.invalid),
        ];
        let enforcement = match &self.last {
            Some(last) => self.status.enforcement(&last.cluster),
            None => ferry_api::PolicyEnforcement::default(),
        };
        ferry_api::Counters {
            build: Some(crate::build::info()),
            enforcement,
            generation: self.generation,
            ports: snap
                .ports
                .iter()
                .map(|p| ferry_api::PortCounters {
                    name: p.name.clone(),
                    rx_packets: p.pipeline.rx_packets,
                    rx_bytes: p.pipeline.rx_bytes,
                    tx_packets: p.pipeline.tx_packets,
                    tx_bytes: p.pipeline.tx_bytes,
                    drops: p
                        .drops
                        .nonzero()
                        .map(|(r, n)| (r.name().to_string(), n))
                        .collect(),
                })
                .collect(),
            drops: snap
                .drops
                .nonzero()
                .map(|(r, n)| (r.name().to_string(), n))
                .collect(),
            ct_entries: snap.ct_entries,
            ct_inserted: snap.conntrack.inserted,
            ct_insert_failed: snap.conntrack.insert_failed,
            reassembled: snap.pipeline.reassembled,
            service_balanced: snap.pipeline.service_balanced,
            service_rejected: snap.pipeline.service_rejected,
            service_source_denied: snap.source_denied.iter().cloned().collect(),
            ct_recovered: snap.pipeline.ct_recovered,
            ct_recovery_refuted: snap.pipeline.ct_recovery_refuted,
            policy_allowed: snap.pipeline.policy_allowed,
            policy_denied: snap.pipeline.policy_denied,
            policies: snap
                .policies
                .iter()
                .map(|(n, c)| {
                    let c = ferry_api::PolicyCounters {
                        ingress_allowed: c.ingress_allowed,
                        ingress_denied: c.ingress_denied,
                        egress_allowed: c.egress_allowed,
                        egress_denied: c.egress_denied,
                    };
                    (n.clone(), c)
                })
                .collect(),
            policy_audit: self.audit.as_ref().map(|a| {
                let c = a.counts();
                ferry_api::PolicyAuditCounters {
                    logged: c.logged,
                    repeated: c.repeated,
                    suppressed_rate: c.suppressed_rate,
                    suppressed_overflow: c.suppressed_overflow,
                    write_errors: c.write_errors,
                }
            }),
            neigh_waiting: snap.pipeline.neigh_waiting,
            neigh_queued: snap.pipeline.neigh_queued,
            fragments_held: held.0,
            fragment_bytes_held: held.1,
            fragments_expired: v4.expired + v6.expired,
            fragments_refused: refused
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            nat_ports_in_use: held.2,
            workers: snap
                .workers
                .iter()
                .map(|w| ferry_api::WorkerCounters {
                    rx_frames: w.rx_frames,
                    tx_frames: w.tx_frames,
                    rounds: w.rounds,
                    busy_rounds: w.busy_rounds,
                    tx_dropped: w.tx_dropped,
                    ports_gone: w.ports_gone,
                })
                .collect(),
            datastore: self.status.datastore(),
            sync: self.status.sync(),
            programming: self.status.programming(),
            errors: self.status.errors(),
        }
    }

    /// The answer to a `policy` request: the policies in force with this node's pods
    /// each applies to, or (`pod`) one pod's rules, from the state in force.
    pub(super) fn policy_answer(&self, cluster: &Cluster, pod: Option<&str>) -> Response {
        let Some(last) = self.last.as_ref() else {
            return Response::error(11, "no tables in force yet", "");
        };
        let opts = match crate::config::FerryConfig::of(cluster) {
            Ok(c) => PolicyOptions::of(&c),
            Err(e) => return Response::error(11, "the ferry-config in force does not read", e),
        };
        let mut answer = explain::list(cluster, &last.pod_ports, &last.pod_addresses, opts);
        answer.enforcement = Some(self.status.enforcement(&last.cluster));
        if let Some(pod) = pod {
            match explain::explain(cluster, pod, opts) {
                Ok(p) => answer.pod = Some(p),
                Err(e) => return Response::error(ferry_api::ERR_BAD_REQUEST, "no such pod", e),
            }
        }
        Response::Ok(Answer {
            policy: Some(answer),
            ..Answer::default()
        })
    }

    /// The answer to a `policy_preview` request: the tracked connections the policy of
    /// `cluster` changed by `manifests` would not allow. Nothing changes.
    pub(super) fn policy_preview(
        &self,
        cluster: &Cluster,
        manifests: &str,
        delete: bool,
    ) -> Response {
        let Some(last) = self.last.as_ref() else {
            return Response::error(11, "no tables in force yet", "");
        };
        let (changed, objects) = match explain::candidate(cluster, manifests, delete) {
            Ok(c) => c,
            Err(e) => return Response::error(ferry_api::ERR_BAD_REQUEST, "manifests refused", e),
        };
        let opts = match crate::config::FerryConfig::of(&changed) {
            Ok(c) => PolicyOptions::of(&c),
            Err(e) => return Response::error(11, "the ferry-config in force does not read", e),
        };
        let held = policy::Held::of(&changed).with_ports(last.pod_addresses.clone());
        let spec = policy::compile(&policy::inputs(&changed, &held), &last.pod_ports, opts);
        let tables = match last.tables.with_policy(&spec) {
            Ok(t) => Arc::new(t),
            Err(e) => return Response::error(ERR_AGENT, "the policy does not compile", e),
        };
        let cuts = self.control.run(crate::observe::JOB_TIMEOUT, move |w| {
            w.pipeline.policy_cuts(&tables)
        });
        match cuts {
            Ok(cuts) => Response::Ok(Answer {
                policy: Some(ferry_api::PolicyAnswer {
                    preview: Some(ferry_api::PolicyPreview {
                        objects,
                        reevaluate: opts.reevaluate,
                        cut: cuts
                            .iter()
                            .map(|c| ferry_api::PolicyCutInfo {
                                original: c.original.to_string(),
                                reply: c.reply.to_string(),
                                denial: c.denial.to_string(),
                            })
                            .collect(),
                    }),
                    ..ferry_api::PolicyAnswer::default()
                }),
                ..Answer::default()
            }),
            Err(e) => Response::error(
                ferry_api::ERR_WORKER,
                "the dataplane's worker did not answer",
                e.to_string(),
            ),
        }
    }

    /// The answer to a `node` request: the node's name, pod CIDRs and pod MTU.
    pub(super) fn node_info(&self, cluster: &Cluster) -> Response {
        let Some(node) = cluster.node(&self.opts.node) else {
            return Response::error(
                11,
                "this node is not in the cluster state yet",
                self.opts.node.clone(),
            );
        };
        let fields = match NodeFields::parse(node) {
            Ok(f) => f,
            Err(e) => {
                return Response::error(
                    ERR_AGENT,
                    "the Node object is bad",
                    describe(&format_args!("Node {}", self.opts.node), &e),
                );
            }
        };
        Response::Ok(Answer {
            node: Some(self.opts.node.clone()),
            pod_cidrs: fields.pod_cidrs.iter().map(ToString::to_string).collect(),
            mtu: Some(self.pod_mtu()),
            ..Answer::default()
        })
    }

    /// The MTU pod ports get: the overlay's, from the uplink's.
    pub(super) fn pod_mtu(&self) -> u16 {
        self.last
            .as_ref()
            .map_or(ferry_datapath::DEFAULT_MTU, |l| l.tables.pod_mtu)
    }
}

/// Live-traced packets as the API carries them.
pub(super) fn traced_json(
    traced: Vec<ferry_linux::worker::TracedPacket>,
) -> Vec<serde_json::Value> {
    traced
        .into_iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect()
}

/// The error answer to a refused live trace or capture read or stop (`what`): a replaced
/// session has a code of its own, so that its client can tell it from a failure.
pub(super) fn refused(what: &str, e: &observe::Refusal) -> Response {
    let code = match e {
        observe::Refusal::Replaced(_) => ferry_api::ERR_REPLACED,
        observe::Refusal::NotRunning(_) => ferry_api::ERR_BAD_REQUEST,
        observe::Refusal::Worker(_) => ferry_api::ERR_WORKER,
    };
    Response::error(code, what, e.to_string())
}

/// Captured frames as the API carries them.
pub(super) fn captured_answer(frames: Vec<observe::Frame>, lost: u64) -> Response {
    Response::Ok(Answer {
        captured: Some(
            frames
                .into_iter()
                .map(|f| ferry_api::CapturedFrame {
                    time_unix_ns: f.time_unix_ns,
                    dir: if f.inbound { "in" } else { "out" }.to_string(),
                    port: f.port,
                    note: f.note,
                    data: hex::encode(&f.data),
                })
                .collect(),
        ),
        lost: Some(lost),
        ..Answer::default()
    })
}
