//! ferry's control plane: the cluster model (Kubernetes objects), the datastores that
//! fill it, and the compilation of one node's tables from it.
//!
//! - [`cluster`]: [`Cluster`], the Nodes, Pods, Services, EndpointSlices and ConfigMaps
//!   ferry reads, with `apply` / `delete` for a datastore to drive it;
//! - [`datastore`]: where the cluster comes from; [`datastore::file`] reads a directory
//!   of YAML manifests and watches it;
//! - [`fields`] and [`config`]: what ferry reads of each object and of the
//!   `kube-system/ferry-config` ConfigMap, checked in one place.

pub mod cluster;
pub mod config;
pub mod datastore;
pub mod fields;

pub use cluster::{Cluster, Kind, Object, ObjectKey};
pub use datastore::file::{FileDatastore, Update, Watch};
pub use datastore::{Problem, Refused};
