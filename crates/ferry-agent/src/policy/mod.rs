//! The policy objects of the cluster model: Kubernetes NetworkPolicy
//! (networking.k8s.io/v1, k8s-openapi's type), sig-network's ClusterNetworkPolicy
//! ([`crd`], hand-written types) and Namespaces' labels, with their fields checked and
//! typed ([`fields`], [`selector`]) for the compilation of policy tables, what
//! `ferry policy` shows of them ([`explain`]), what of them is not enforced as written
//! ([`enforcement`]), and the audit log of the connections they deny ([`audit`]).

pub mod audit;
pub mod crd;
pub mod enforcement;
pub mod explain;
pub mod fields;
pub mod selector;

pub use crd::ClusterNetworkPolicy;
pub use fields::{
    Action, ClusterNetworkPolicyFields, ClusterPeer, ClusterRule, IpBlock, NAMESPACE_NAME_LABEL,
    NamespaceFields, Namespaces, NetworkPolicyFields, NetworkPolicyRule, Peer, PodSet, PolicyPort,
    Tier,
};
pub use selector::{Operator, Requirement, Selector};
