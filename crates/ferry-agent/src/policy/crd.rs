//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`), as sig-network's
//! network-policy-api ships it (`apis/v1alpha2/clusternetworkpolicy_types.go`, bundle
//! v0.2.0, standard and experimental channels).
//!
//! Written by hand: k8s-openapi only has the API server's own kinds, and a derive from
//! the CRD's schema would pull in a code generator for one kind. The types only carry
//! the fields: every required field is an `Option` here and the checks
//! ([`super::fields::ClusterNetworkPolicyFields::parse`]) refuse what the CRD's schema
//! refuses, naming the field, the same way from a file and from an API server. Unknown
//! fields are not denied by the types, as with k8s-openapi's: the file datastore
//! refuses them (it compares what it read with what the type kept), the Kubernetes
//! datastore drops them (a newer CRD may add some; see
//! [`ClusterNetworkPolicyEgressPeer`] for what an unknown peer means).
//!
//! The experimental channel's peers (`nodes`, `domainNames`) are here too, so that a
//! policy using them is told what ferry does with them rather than "unknown field".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The API group.
pub const GROUP: &str = "policy.networking.k8s.io";
/// The version network-policy-api ships.
pub const VERSION: &str = "v1alpha2";
/// `GROUP/VERSION`.
pub const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
/// The kind.
pub const KIND: &str = "ClusterNetworkPolicy";

/// A cluster-wide network policy (cluster-scoped).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterNetworkPolicy {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// spec: required by the CRD; `None` is refused by the checks.
    pub spec: Option<ClusterNetworkPolicySpec>,
    /// status, written by implementations; ferry does not read it.
    pub status: Option<ClusterNetworkPolicyStatus>,
}

/// spec of a [`ClusterNetworkPolicy`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` or `Baseline` (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// 0-1000, lower first (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The pods the policy applies to (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<ClusterNetworkPolicySubject>,
    /// Ingress rules, at most 25, in precedence order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<ClusterNetworkPolicyIngressRule>>,
    /// Egress rules, at most 25, in precedence order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<ClusterNetworkPolicyEgressRule>>,
}

/// status of a [`ClusterNetworkPolicy`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyStatus {
    /// The implementations' conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// The pods a policy applies to: exactly one field set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySubject {
    /// Every pod of the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// The pods selected in the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// Pods by namespace and pod selectors (both must match).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    /// Optional: absent or empty selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Required; empty selects every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// An ingress rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyIngressRule {
    /// An optional name, at most 100 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass` (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The sources, 1 to 25 (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<ClusterNetworkPolicyIngressPeer>>,
    /// Optional protocol and port matches, 1 to 25; absent matches every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<ClusterNetworkPolicyProtocol>>,
}

/// An egress rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyEgressRule {
    /// An optional name, at most 100 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass` (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The destinations, 1 to 25 (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<ClusterNetworkPolicyEgressPeer>>,
    /// Optional protocol and port matches, 1 to 25; absent matches every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<ClusterNetworkPolicyProtocol>>,
}

/// A source of an ingress rule: exactly one field set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyIngressPeer {
    /// Every pod of the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// The pods selected in the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// A destination of an egress rule: exactly one field set. With none set (as a peer
/// of a newer CRD looks once its unknown field is dropped) the API says to fail
/// closed: an `Accept` rule matches nothing, a `Deny` or `Pass` rule matches
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyEgressPeer {
    /// Every pod of the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// The pods selected in the namespaces selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    /// Nodes by their labels: their addresses (experimental channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<LabelSelector>,
    /// CIDRs, 1 to 25.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    /// Domain names (experimental channel): not enforced by ferry, refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

/// A protocol match: exactly one field set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyProtocol {
    /// TCP, on a destination port when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<ProtocolPort>,
    /// UDP, on a destination port when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<ProtocolPort>,
    /// SCTP, on a destination port when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<ProtocolPort>,
    /// A container port name of the destination pod (its protocol is the port's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
}

/// The attributes of a TCP, UDP or SCTP match (`ClusterNetworkPolicyProtocolTCP` and
/// its two twins, which have the same one field).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolPort {
    /// The destination port; the CRD requires it (MinProperties 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<Port>,
}

/// A port number or a range: exactly one field set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// 1-65535.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i32>,
    /// An inclusive range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PortRange>,
}

/// An inclusive range of ports, `start < end`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    /// The first port, 1-65535 (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    /// The last port, 1-65535 (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i32>,
}

/// The wire form: `apiVersion` and `kind` written out, as k8s-openapi's types do, and
/// checked when given (a list item has none).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire<M, S, T> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(default)]
    metadata: M,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<T>,
}

impl Serialize for ClusterNetworkPolicy {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        Wire {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            metadata: &self.metadata,
            spec: self.spec.as_ref(),
            status: self.status.as_ref(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ClusterNetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w: Wire<ObjectMeta, ClusterNetworkPolicySpec, ClusterNetworkPolicyStatus> =
            Wire::deserialize(d)?;
        if let Some(v) = w.api_version.filter(|v| v != API_VERSION) {
            return Err(D::Error::custom(format!(
                "apiVersion {v:?}: expected {API_VERSION:?}"
            )));
        }
        if let Some(k) = w.kind.filter(|k| k != KIND) {
            return Err(D::Error::custom(format!("kind {k:?}: expected {KIND:?}")));
        }
        Ok(ClusterNetworkPolicy {
            metadata: w.metadata,
            spec: w.spec,
            status: w.status,
        })
    }
}

impl k8s_openapi::Resource for ClusterNetworkPolicy {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = "clusternetworkpolicies";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for ClusterNetworkPolicy {
    const LIST_KIND: &'static str = "ClusterNetworkPolicyList";
}

impl k8s_openapi::Metadata for ClusterNetworkPolicy {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFORMANCE: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: gress-rules
spec:
  tier: Admin
  priority: 15
  subject:
    namespaces:
      matchLabels:
          kubernetes.io/metadata.name: network-policy-conformance-gryffindor
  egress:
  - name: "deny-to-slytherin-at-ports-80-53-9003"
    action: "Deny"
    to:
    - namespaces:
        matchLabels:
          kubernetes.io/metadata.name: network-policy-conformance-slytherin
    protocols:
      - tcp:
          destinationPort:
            number: 80
      - udp:
          destinationPort:
            range: {start: 53, end: 54}
  ingress:
  - action: Accept
    from:
    - pods:
        podSelector: {matchLabels: {app: a}}
    protocols:
    - destinationNamedPort: web
"#;

    #[test]
    fn a_conformance_manifest_reads_and_writes_back_the_same() {
        let v: serde_json::Value = serde_saphyr::from_str(CONFORMANCE).unwrap();
        let p: ClusterNetworkPolicy = serde_json::from_value(v.clone()).unwrap();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.tier.as_deref(), Some("Admin"));
        assert_eq!(spec.priority, Some(15));
        let egress = &spec.egress.as_ref().unwrap()[0];
        let udp = egress.protocols.as_ref().unwrap()[1].udp.as_ref().unwrap();
        assert_eq!(
            udp.destination_port.as_ref().unwrap().range,
            Some(PortRange {
                start: Some(53),
                end: Some(54)
            })
        );
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
    }

    #[test]
    fn another_kind_or_version_is_refused_and_a_list_item_needs_none() {
        let mut v: serde_json::Value = serde_saphyr::from_str(CONFORMANCE).unwrap();
        v["apiVersion"] = "policy.networking.k8s.io/v1alpha1".into();
        assert!(serde_json::from_value::<ClusterNetworkPolicy>(v.clone()).is_err());
        let m = v.as_object_mut().unwrap();
        m.remove("apiVersion");
        m.remove("kind");
        let p: ClusterNetworkPolicy = serde_json::from_value(v).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("gress-rules"));
    }
}
