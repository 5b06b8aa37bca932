//! ferry's control plane: the cluster model (Kubernetes objects), the datastores that
//! fill it, and the compilation of one node's tables from it.
//!
//! - [`cluster`]: [`Cluster`], the Nodes, Namespaces, Pods, Services, EndpointSlices,
//!   ConfigMaps, NetworkPolicies and ClusterNetworkPolicies ferry reads, with `apply` /
//!   `delete` for a datastore to drive it; [`policy`]: the policy objects' types and
//!   checked fields;
//! - [`datastore`]: where the cluster comes from; [`datastore::file`] reads a directory
//!   of YAML manifests and watches it, [`datastore::kube`] watches a Kubernetes API
//!   server;
//! - [`compile`]: [`node_tables`], a node's tables (ports, overlay peers, Services) from
//!   the cluster;
//! - [`control_loop`]: the agent's loop, from the datastore's states to the tables in
//!   force, with retries; [`run`]: the running agent, [`run::Agent`]: ports opened,
//!   tables swapped into the worker as the cluster changes; [`health`]: health check node ports;
//!   [`proxy_health`]: the agent's own health, kube-proxy's `/healthz` and `/livez`;
//! - [`fields`] and [`config`]: what ferry reads of each object and of the
//!   `kube-system/ferry-config` ConfigMap, checked in one place;
//! - [`conntrack`], [`services`] and [`status`]: what the local API ([`api`]) and the
//!   metrics ([`metrics`]) show of the running node.
//!
//! `docs/agent.md` documents the mapping from Kubernetes fields to tables fields.
#![forbid(unsafe_code)]

mod accept;
pub mod api;
pub mod build;
pub mod checkpoint;
pub mod cleanup;
pub mod cluster;
pub mod compile;
pub mod config;
pub mod conntrack;
pub mod control_loop;
pub mod datastore;
pub mod del_queue;
pub mod fields;
pub mod handover;
pub mod health;
pub mod host_nat;
pub mod leftovers;
pub mod metrics;
pub mod observe;
pub mod policy;
pub mod proxy_health;
pub mod run;
pub mod services;
pub mod state;
pub mod status;
pub mod takeover;
#[cfg(test)]
mod testing;

pub use cluster::{Cluster, Kind, Object, ObjectKey};
pub use compile::{AttachedPod, CompileOptions, Compiled, HealthCheck, node_tables};
pub use datastore::file::{FileDatastore, Update, Watch};
pub use datastore::kube::{KubeDatastore, KubeError, KubeOptions};
pub use datastore::{Problem, Refused};
