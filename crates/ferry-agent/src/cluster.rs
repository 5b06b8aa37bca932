//! The cluster model: the Kubernetes objects ferry reads, keyed by namespace and name.
//!
//! A datastore drives it with [`Cluster::apply`] and [`Cluster::delete`] (the file
//! datastore rebuilds it from the manifests; a watch on an API server applies each
//! event). Maps are ordered, so everything compiled from a cluster comes out in the same
//! order every time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::fields::{FieldError, PodFields, Protocol, SERVICE_NAME_LABEL, ServiceFields};
use crate::policy::crd::{self, ClusterNetworkPolicy};
use crate::policy::{ClusterNetworkPolicyFields, NamespaceFields, NetworkPolicyFields};

/// The namespace of a namespaced object whose manifest gives none (as `kubectl apply`
/// does with the default context).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Where an object lives: its namespace (empty for cluster-scoped kinds such as Node)
/// and its name. Ordered by namespace, then name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// The key of a namespaced object.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a cluster-scoped object.
    pub fn cluster_scoped(name: impl Into<String>) -> ObjectKey {
        ObjectKey::new("", name)
    }
}

impl fmt::Display for ObjectKey {
    /// `namespace/name`, or `name` for cluster-scoped objects (as kubectl writes them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The kinds of object the model holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 Node (cluster-scoped).
    Node,
    /// core/v1 Pod.
    Pod,
    /// core/v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// core/v1 ConfigMap.
    ConfigMap,
    /// core/v1 Namespace (cluster-scoped).
    Namespace,
    /// networking.k8s.io/v1 NetworkPolicy.
    NetworkPolicy,
    /// policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy (cluster-scoped).
    ClusterNetworkPolicy,
}

impl Kind {
    /// Every kind, in the order the model lists them.
    pub const ALL: [Kind; 8] = [
        Kind::Node,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::ConfigMap,
        Kind::Namespace,
        Kind::NetworkPolicy,
        Kind::ClusterNetworkPolicy,
    ];

    /// The `kind` field of a manifest.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::ConfigMap => "ConfigMap",
            Kind::Namespace => "Namespace",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ClusterNetworkPolicy => crd::KIND,
        }
    }

    /// The `apiVersion` field of a manifest.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::ClusterNetworkPolicy => crd::API_VERSION,
            Kind::Node | Kind::Pod | Kind::Service | Kind::ConfigMap | Kind::Namespace => "v1",
        }
    }

    /// False for cluster-scoped kinds.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Node | Kind::Namespace | Kind::ClusterNetworkPolicy
        )
    }

    /// The kind a manifest's `apiVersion` and `kind` name, when the model holds it.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.name() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One object of a kind the model holds.
// A Pod is much larger than the rest; an object passes through once per change, so
// boxing it would buy nothing but an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A Node.
    Node(Node),
    /// A Pod.
    Pod(Pod),
    /// A Service.
    Service(Service),
    /// An EndpointSlice.
    EndpointSlice(EndpointSlice),
    /// A ConfigMap.
    ConfigMap(ConfigMap),
    /// A Namespace.
    Namespace(Namespace),
    /// A NetworkPolicy.
    NetworkPolicy(NetworkPolicy),
    /// A ClusterNetworkPolicy.
    ClusterNetworkPolicy(ClusterNetworkPolicy),
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::ConfigMap(_) => Kind::ConfigMap,
            Object::Namespace(_) => Kind::Namespace,
            Object::NetworkPolicy(_) => Kind::NetworkPolicy,
            Object::ClusterNetworkPolicy(_) => Kind::ClusterNetworkPolicy,
        }
    }

    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Node(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::NetworkPolicy(o) => &o.metadata,
            Object::ClusterNetworkPolicy(o) => &o.metadata,
        }
    }

    /// Its metadata, to change before the object is applied.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Node(o) => &mut o.metadata,
            Object::Pod(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::EndpointSlice(o) => &mut o.metadata,
            Object::ConfigMap(o) => &mut o.metadata,
            Object::Namespace(o) => &mut o.metadata,
            Object::NetworkPolicy(o) => &mut o.metadata,
            Object::ClusterNetworkPolicy(o) => &mut o.metadata,
        }
    }

    /// Its key: the namespace ([`DEFAULT_NAMESPACE`] when a namespaced object gives
    /// none; empty for a cluster-scoped kind) and the name. `None` without a name.
    pub fn key(&self) -> Option<ObjectKey> {
        let m = self.metadata();
        let name = m.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = if self.kind().namespaced() {
            m.namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(DEFAULT_NAMESPACE)
        } else {
            ""
        };
        Some(ObjectKey::new(namespace, name))
    }
}

impl fmt::Display for Object {
    /// `Kind namespace/name`, the way problems and warnings name an object.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key() {
            Some(k) => write!(f, "{} {k}", self.kind()),
            None => write!(f, "{} without a name", self.kind()),
        }
    }
}

macro_rules! object_from {
    ($($t:ident),*) => {$(
        impl From<$t> for Object {
            fn from(o: $t) -> Object {
                Object::$t(o)
            }
        }
    )*};
}
object_from!(
    Node,
    Pod,
    Service,
    EndpointSlice,
    ConfigMap,
    Namespace,
    NetworkPolicy,
    ClusterNetworkPolicy
);

/// A Service frontend: the protocol, address and port it answers on.
pub type Frontend = (Protocol, IpAddr, u16);

/// The objects ferry reads, by kind, each map keyed by namespace and name.
///
/// Each object is kept behind an [`Arc`]: a clone shares them, and two states that
/// share an object are equal there without a look inside ([`Cluster::diff`], `==`).
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Nodes (namespace empty).
    pub nodes: BTreeMap<ObjectKey, Arc<Node>>,
    /// Pods.
    pub pods: BTreeMap<ObjectKey, Arc<Pod>>,
    /// Services. Change them through [`Cluster::apply`] and [`Cluster::delete`], which
    /// keep their fields ([`Cluster::service_fields`]) with them.
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// ConfigMaps.
    pub config_maps: BTreeMap<ObjectKey, Arc<ConfigMap>>,
    /// Namespaces (namespace empty). Change them, the Pods and the policies through
    /// [`Cluster::apply`] and [`Cluster::delete`] too: their fields are kept with them.
    pub namespaces: BTreeMap<ObjectKey, Arc<Namespace>>,
    /// NetworkPolicies.
    pub network_policies: BTreeMap<ObjectKey, Arc<NetworkPolicy>>,
    /// ClusterNetworkPolicies (namespace empty).
    pub cluster_network_policies: BTreeMap<ObjectKey, Arc<ClusterNetworkPolicy>>,
    /// The frontends of Services that another Service wins (an external IP on another
    /// Service's cluster IP and port, say), by Service: they are left out of its tables.
    /// The Kubernetes datastore decides them ([`Cluster::set_left_out`]).
    left_out: BTreeMap<ObjectKey, BTreeSet<Frontend>>,
    /// The versions of policies that the Kubernetes datastore refused, by kind and key:
    /// what is here of them is an older version, or nothing
    /// ([`Cluster::set_refused`]). Not an object: [`Cluster::diff`] leaves it out.
    refused: BTreeMap<(Kind, ObjectKey), Refusal>,
    /// What ferry reads of each Service, parsed once as it came in: the datastores'
    /// claims and the tables read them here.
    service_fields: BTreeMap<ObjectKey, Parsed<ServiceFields>>,
    /// What policy reads of each Pod (labels aside): its named ports.
    pod_fields: BTreeMap<ObjectKey, Parsed<PodFields>>,
    /// What policy reads of each Namespace: its labels.
    namespace_fields: BTreeMap<ObjectKey, Parsed<NamespaceFields>>,
    /// Each NetworkPolicy, typed.
    network_policy_fields: BTreeMap<ObjectKey, Parsed<NetworkPolicyFields>>,
    /// Each ClusterNetworkPolicy, typed.
    cluster_network_policy_fields: BTreeMap<ObjectKey, Parsed<ClusterNetworkPolicyFields>>,
}

/// A version of an object that its datastore refused, kept while what is in force of
/// the object is an older version or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The refused version's `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// Its `metadata.generation`.
    pub generation: Option<i64>,
    /// What is wrong with it.
    pub errors: Vec<FieldError>,
}

/// An object's fields as parsed when it came in, or what is wrong with them.
type Parsed<T> = Result<Arc<T>, Vec<FieldError>>;

fn view<T>(p: &Parsed<T>) -> Result<&T, &[FieldError]> {
    match p {
        Ok(f) => Ok(&**f),
        Err(e) => Err(e.as_slice()),
    }
}

/// The fields of an object, parsed by the datastore's checks
/// ([`crate::datastore::check`]), to be kept with it.
#[derive(Clone, Debug, Default)]
pub(crate) enum Checked {
    /// Nothing is kept for its kind.
    #[default]
    Nothing,
    /// A Service's.
    Service(Arc<ServiceFields>),
    /// A Pod's.
    Pod(Arc<PodFields>),
    /// A Namespace's.
    Namespace(Arc<NamespaceFields>),
    /// A NetworkPolicy's.
    NetworkPolicy(Arc<NetworkPolicyFields>),
    /// A ClusterNetworkPolicy's.
    ClusterNetworkPolicy(Arc<ClusterNetworkPolicyFields>),
}

macro_rules! checked_as {
    ($($fn:ident: $variant:ident($t:ty)),*) => {
        impl Checked {
            $(
                fn $fn(self) -> Option<Arc<$t>> {
                    match self {
                        Checked::$variant(f) => Some(f),
                        _ => None,
                    }
                }
            )*

            /// A Service's fields, if these are.
            pub(crate) fn service(&self) -> Option<&ServiceFields> {
                match self {
                    Checked::Service(f) => Some(f),
                    _ => None,
                }
            }
        }
    };
}
checked_as!(
    into_service: Service(ServiceFields),
    pod: Pod(PodFields),
    namespace: Namespace(NamespaceFields),
    network_policy: NetworkPolicy(NetworkPolicyFields),
    cluster_network_policy: ClusterNetworkPolicy(ClusterNetworkPolicyFields)
);

/// `given` when the datastore checked the object, else the object parsed now.
fn kept<T>(given: Option<Arc<T>>, parse: impl FnOnce() -> Result<T, Vec<FieldError>>) -> Parsed<T> {
    match given {
        Some(f) => Ok(f),
        None => parse().map(Arc::new),
    }
}

/// Why [`Cluster::apply`] refused an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoName(pub Kind);

impl fmt::Display for NoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: metadata.name is required", self.0)
    }
}

impl std::error::Error for NoName {}

/// Pushes to `out` the keys of `a` and `b` whose values differ (`same` says they do
/// not): those of `a` that `b` lacks or has otherwise, in key order, then those that
/// only `b` has, in key order. Both maps are walked once, side by side.
fn side_by_side<T>(
    kind: Kind,
    a: &BTreeMap<ObjectKey, T>,
    b: &BTreeMap<ObjectKey, T>,
    same: impl Fn(&T, &T) -> bool,
    out: &mut Vec<(Kind, ObjectKey)>,
) {
    use std::cmp::Ordering;
    let mut added = Vec::new();
    let (mut a, mut b) = (a.iter(), b.iter());
    let (mut x, mut y) = (a.next(), b.next());
    loop {
        match (x, y) {
            (None, None) => break,
            (Some((k, _)), None) => {
                out.push((kind, k.clone()));
                x = a.next();
            }
            (None, Some((k, _))) => {
                added.push((kind, k.clone()));
                y = b.next();
            }
            (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                Ordering::Less => {
                    out.push((kind, ka.clone()));
                    x = a.next();
                }
                Ordering::Greater => {
                    added.push((kind, kb.clone()));
                    y = b.next();
                }
                Ordering::Equal => {
                    if !same(va, vb) {
                        out.push((kind, ka.clone()));
                    }
                    x = a.next();
                    y = b.next();
                }
            },
        }
    }
    out.append(&mut added);
}

/// `a` and `b` hold the same keys with the same objects; an object both share is not
/// compared.
fn same_objects<T: PartialEq>(
    a: &BTreeMap<ObjectKey, Arc<T>>,
    b: &BTreeMap<ObjectKey, Arc<T>>,
) -> bool {
    a.len() == b.len()
        && (a.iter().zip(b)).all(|((ka, x), (kb, y))| ka == kb && (Arc::ptr_eq(x, y) || x == y))
}

/// `a` and `b` hold the same keys with the same fields; fields both share are not
/// compared.
fn same_fields<T: PartialEq>(
    a: &BTreeMap<ObjectKey, Parsed<T>>,
    b: &BTreeMap<ObjectKey, Parsed<T>>,
) -> bool {
    a.len() == b.len()
        && (a.iter().zip(b)).all(|((ka, x), (kb, y))| {
            ka == kb
                && match (x, y) {
                    (Ok(x), Ok(y)) => Arc::ptr_eq(x, y) || x == y,
                    (x, y) => x == y,
                }
        })
}

impl PartialEq for Cluster {
    fn eq(&self, other: &Cluster) -> bool {
        // Every field named, so that a new one cannot be left out.
        let Cluster {
            nodes,
            pods,
            services,
            endpoint_slices,
            config_maps,
            namespaces,
            network_policies,
            cluster_network_policies,
            left_out,
            refused,
            service_fields,
            pod_fields,
            namespace_fields,
            network_policy_fields,
            cluster_network_policy_fields,
        } = self;
        same_objects(nodes, &other.nodes)
            && same_objects(pods, &other.pods)
            && same_objects(services, &other.services)
            && same_objects(endpoint_slices, &other.endpoint_slices)
            && same_objects(config_maps, &other.config_maps)
            && same_objects(namespaces, &other.namespaces)
            && same_objects(network_policies, &other.network_policies)
            && same_objects(cluster_network_policies, &other.cluster_network_policies)
            && *left_out == other.left_out
            && *refused == other.refused
            && same_fields(service_fields, &other.service_fields)
            && same_fields(pod_fields, &other.pod_fields)
            && same_fields(namespace_fields, &other.namespace_fields)
            && same_fields(network_policy_fields, &other.network_policy_fields)
            && same_fields(
                cluster_network_policy_fields,
                &other.cluster_network_policy_fields,
            )
    }
}

/// Replaces each value of `to` that `from` has equal under its key (`same`) by
/// `from`'s. Both maps are walked once, side by side.
fn take_equal<T: Clone>(
    to: &mut BTreeMap<ObjectKey, T>,
    from: &BTreeMap<ObjectKey, T>,
    same: impl Fn(&T, &T) -> bool,
) {
    let mut from = from.iter().peekable();
    for (k, v) in to.iter_mut() {
        while from.next_if(|(f, _)| *f < k).is_some() {}
        if let Some((_, o)) = from.next_if(|(f, _)| *f == k)
            && same(v, o)
        {
            *v = o.clone();
        }
    }
}

impl Cluster {
    /// Adds `obj`, or replaces the object of the same kind and key; true when it
    /// replaced one. A namespaced object without a namespace goes to
    /// [`DEFAULT_NAMESPACE`] (and says so in its metadata, so every reader sees the same
    /// key). The object is kept behind an [`Arc`]: a clone of the cluster shares it.
    /// The fields of a Service, a Pod, a Namespace and the policies are parsed here
    /// ([`ServiceFields`], [`PodFields`], [`NamespaceFields`], [`NetworkPolicyFields`],
    /// [`ClusterNetworkPolicyFields`]), once.
    pub fn apply(&mut self, obj: impl Into<Object>) -> Result<bool, NoName> {
        self.apply_checked(obj.into(), Checked::Nothing)
    }

    /// [`Cluster::apply`] of an object whose fields the datastore checked already: they
    /// come with it (`fields`) and are kept instead of parsed again.
    pub(crate) fn apply_checked(
        &mut self,
        mut obj: Object,
        fields: Checked,
    ) -> Result<bool, NoName> {
        let key = obj.key().ok_or(NoName(obj.kind()))?;
        if obj.kind().namespaced() {
            obj.metadata_mut().namespace = Some(key.namespace.clone());
        }
        // The replaced object is not handed back: another state may share it, and
        // taking it out of its Arc would copy it.
        let replaced = match (obj, fields) {
            (Object::Node(o), _) => self.nodes.insert(key, Arc::new(o)).is_some(),
            (Object::Pod(o), f) => {
                let f = kept(f.pod(), || PodFields::parse(&o));
                self.pod_fields.insert(key.clone(), f);
                self.pods.insert(key, Arc::new(o)).is_some()
            }
            (Object::Service(o), f) => {
                let f = kept(f.into_service(), || ServiceFields::parse(&o));
                self.service_fields.insert(key.clone(), f);
                self.services.insert(key, Arc::new(o)).is_some()
            }
            (Object::EndpointSlice(o), _) => {
                self.endpoint_slices.insert(key, Arc::new(o)).is_some()
            }
            (Object::ConfigMap(o), _) => self.config_maps.insert(key, Arc::new(o)).is_some(),
            (Object::Namespace(o), f) => {
                let f = kept(f.namespace(), || NamespaceFields::parse(&o));
                self.namespace_fields.insert(key.clone(), f);
                self.namespaces.insert(key, Arc::new(o)).is_some()
            }
            (Object::NetworkPolicy(o), f) => {
                let f = kept(f.network_policy(), || NetworkPolicyFields::parse(&o));
                self.network_policy_fields.insert(key.clone(), f);
                self.network_policies.insert(key, Arc::new(o)).is_some()
            }
            (Object::ClusterNetworkPolicy(o), f) => {
                let f = kept(f.cluster_network_policy(), || {
                    ClusterNetworkPolicyFields::parse(&o)
                });
                self.cluster_network_policy_fields.insert(key.clone(), f);
                (self.cluster_network_policies)
                    .insert(key, Arc::new(o))
                    .is_some()
            }
        };
        Ok(replaced)
    }

    /// Removes the object of `kind` at `namespace`/`name` (the namespace is ignored for
    /// cluster-scoped kinds); true when there was one.
    pub fn delete(&mut self, kind: Kind, namespace: &str, name: &str) -> bool {
        let key = ObjectKey::new(if kind.namespaced() { namespace } else { "" }, name);
        match kind {
            Kind::Node => self.nodes.remove(&key).is_some(),
            Kind::Pod => {
                self.pod_fields.remove(&key);
                self.pods.remove(&key).is_some()
            }
            Kind::Service => {
                self.left_out.remove(&key);
                self.service_fields.remove(&key);
                self.services.remove(&key).is_some()
            }
            Kind::EndpointSlice => self.endpoint_slices.remove(&key).is_some(),
            Kind::ConfigMap => self.config_maps.remove(&key).is_some(),
            Kind::Namespace => {
                self.namespace_fields.remove(&key);
                self.namespaces.remove(&key).is_some()
            }
            Kind::NetworkPolicy => {
                self.network_policy_fields.remove(&key);
                self.network_policies.remove(&key).is_some()
            }
            Kind::ClusterNetworkPolicy => {
                self.cluster_network_policy_fields.remove(&key);
                self.cluster_network_policies.remove(&key).is_some()
            }
        }
    }

    /// The refused versions of objects, by kind and key ([`Cluster::set_refused`]).
    pub fn refused(&self) -> impl Iterator<Item = (&(Kind, ObjectKey), &Refusal)> {
        self.refused.iter()
    }

    /// Records that the datastore refused a version of the object of `kind` at `key`
    /// (`Some`), or that none is refused any more (`None`: a good version came, or the
    /// object went). Returns true when that changed what was recorded.
    pub fn set_refused(&mut self, kind: Kind, key: &ObjectKey, r: Option<Refusal>) -> bool {
        let k = (kind, key.clone());
        match r {
            Some(r) if self.refused.get(&k) == Some(&r) => false,
            Some(r) => {
                self.refused.insert(k, r);
                true
            }
            None => self.refused.remove(&k).is_some(),
        }
    }

    /// The frontends of the Service `key` left out of its tables: another Service wins
    /// them.
    pub fn left_out(&self, key: &ObjectKey) -> Option<&BTreeSet<Frontend>> {
        self.left_out.get(key)
    }

    /// Says which frontends of the Service `key` are left out of its tables (none:
    /// empty); true when that changed. The Service may come later: deleting it forgets
    /// them.
    pub fn set_left_out(&mut self, key: &ObjectKey, frontends: BTreeSet<Frontend>) -> bool {
        if self
            .left_out
            .get(key)
            .map_or(frontends.is_empty(), |f| *f == frontends)
        {
            return false;
        }
        if frontends.is_empty() {
            self.left_out.remove(key);
        } else {
            self.left_out.insert(key.clone(), frontends);
        }
        true
    }

    /// What ferry reads of the Service `key`, parsed when it came in, or what is wrong
    /// with its fields; None without that Service.
    pub fn service_fields(&self, key: &ObjectKey) -> Option<Result<&ServiceFields, &[FieldError]>> {
        self.service_fields.get(key).map(view)
    }

    /// What ferry reads of the Pod `key` (its addresses, node and named ports), parsed
    /// when it came in, or what is wrong with it; None without that Pod.
    pub fn pod_fields(&self, key: &ObjectKey) -> Option<Result<&PodFields, &[FieldError]>> {
        self.pod_fields.get(key).map(view)
    }

    /// The labels of the Namespace `name` (with `kubernetes.io/metadata.name`); None
    /// without that Namespace. A namespace whose object is not (yet) in the model has
    /// no labels a selector could match but that one: see
    /// [`crate::policy::NAMESPACE_NAME_LABEL`].
    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        match self.namespace_fields.get(&ObjectKey::cluster_scoped(name)) {
            Some(Ok(f)) => Some(&f.labels),
            _ => None,
        }
    }

    /// What ferry reads of the Namespace `name`, or what is wrong with it.
    pub fn namespace_fields(&self, name: &str) -> Option<Result<&NamespaceFields, &[FieldError]>> {
        self.namespace_fields
            .get(&ObjectKey::cluster_scoped(name))
            .map(view)
    }

    /// The NetworkPolicy `key`, typed, or what is wrong with it; None without it.
    pub fn network_policy_fields(
        &self,
        key: &ObjectKey,
    ) -> Option<Result<&NetworkPolicyFields, &[FieldError]>> {
        self.network_policy_fields.get(key).map(view)
    }

    /// Every NetworkPolicy, typed or what is wrong with it, by namespace and name. Only
    /// [`Cluster::apply`] (tests, tools) lets a bad one in: the datastores refuse them.
    pub fn all_network_policy_fields(
        &self,
    ) -> impl Iterator<Item = (&ObjectKey, Result<&NetworkPolicyFields, &[FieldError]>)> {
        self.network_policy_fields.iter().map(|(k, f)| (k, view(f)))
    }

    /// The ClusterNetworkPolicy `name`, typed, or what is wrong with it.
    pub fn cluster_network_policy_fields(
        &self,
        name: &str,
    ) -> Option<Result<&ClusterNetworkPolicyFields, &[FieldError]>> {
        self.cluster_network_policy_fields
            .get(&ObjectKey::cluster_scoped(name))
            .map(view)
    }

    /// Every ClusterNetworkPolicy, typed or what is wrong with it, by name.
    pub fn all_cluster_network_policy_fields(
        &self,
    ) -> impl Iterator<
        Item = (
            &ObjectKey,
            Result<&ClusterNetworkPolicyFields, &[FieldError]>,
        ),
    > {
        (self.cluster_network_policy_fields.iter()).map(|(k, f)| (k, view(f)))
    }

    /// Every Pod's fields, by namespace and name (pods of every node: select by
    /// [`PodFields::node`] where it matters).
    pub fn all_pod_fields(
        &self,
    ) -> impl Iterator<Item = (&ObjectKey, Result<&PodFields, &[FieldError]>)> {
        self.pod_fields.iter().map(|(k, f)| (k, view(f)))
    }

    /// Every Pod with its fields, by namespace and name: one walk of both maps side by
    /// side, no lookup per Pod (they hold the same keys: [`Cluster::apply`] and
    /// [`Cluster::delete`] keep them so).
    pub fn pods_with_fields(
        &self,
    ) -> impl Iterator<Item = (&ObjectKey, &Pod, Result<&PodFields, &[FieldError]>)> {
        let mut pods = self.pods.iter().peekable();
        self.pod_fields.iter().filter_map(move |(k, f)| {
            // Skips a Pod put in without its fields (past `apply`), should one be.
            while pods.next_if(|(p, _)| *p < k).is_some() {}
            let (_, pod) = pods.next_if(|(p, _)| *p == k)?;
            Some((k, &**pod, view(f)))
        })
    }

    /// True when an object of `kind` has `key`.
    pub fn contains(&self, kind: Kind, key: &ObjectKey) -> bool {
        match kind {
            Kind::Node => self.nodes.contains_key(key),
            Kind::Pod => self.pods.contains_key(key),
            Kind::Service => self.services.contains_key(key),
            Kind::EndpointSlice => self.endpoint_slices.contains_key(key),
            Kind::ConfigMap => self.config_maps.contains_key(key),
            Kind::Namespace => self.namespaces.contains_key(key),
            Kind::NetworkPolicy => self.network_policies.contains_key(key),
            Kind::ClusterNetworkPolicy => self.cluster_network_policies.contains_key(key),
        }
    }

    /// The Node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .get(&ObjectKey::cluster_scoped(name))
            .map(|n| &**n)
    }

    /// The ConfigMap `namespace/name`.
    pub fn config_map(&self, namespace: &str, name: &str) -> Option<&ConfigMap> {
        self.config_maps
            .get(&ObjectKey::new(namespace, name))
            .map(|m| &**m)
    }

    /// The EndpointSlices of the Service `namespace/service`: those of its namespace
    /// labelled `kubernetes.io/service-name: service`, ordered by name.
    pub fn endpoint_slices_of<'a>(
        &'a self,
        namespace: &'a str,
        service: &'a str,
    ) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.endpoint_slices
            .range(ObjectKey::new(namespace, "")..)
            .take_while(move |(k, _)| k.namespace == namespace)
            .map(|(_, s)| &**s)
            .filter(move |s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| n == service)
            })
    }

    /// Makes `self` share with `older` each object (and its fields) that the two hold
    /// equal under the same kind and key: a state read again whole (the file datastore
    /// reads every manifest at each change) then costs [`Cluster::diff`], `==` and
    /// memory only for what changed. Each object not shared yet is compared once.
    pub fn share_with(&mut self, older: &Cluster) {
        fn objects<T: PartialEq>(
            to: &mut BTreeMap<ObjectKey, Arc<T>>,
            from: &BTreeMap<ObjectKey, Arc<T>>,
        ) {
            take_equal(to, from, |x, y| Arc::ptr_eq(x, y) || x == y);
        }
        fn fields<T: PartialEq>(
            to: &mut BTreeMap<ObjectKey, Parsed<T>>,
            from: &BTreeMap<ObjectKey, Parsed<T>>,
        ) {
            take_equal(to, from, |x, y| x == y);
        }
        objects(&mut self.nodes, &older.nodes);
        objects(&mut self.pods, &older.pods);
        objects(&mut self.services, &older.services);
        objects(&mut self.endpoint_slices, &older.endpoint_slices);
        objects(&mut self.config_maps, &older.config_maps);
        objects(&mut self.namespaces, &older.namespaces);
        objects(&mut self.network_policies, &older.network_policies);
        objects(
            &mut self.cluster_network_policies,
            &older.cluster_network_policies,
        );
        fields(&mut self.service_fields, &older.service_fields);
        fields(&mut self.pod_fields, &older.pod_fields);
        fields(&mut self.namespace_fields, &older.namespace_fields);
        fields(
            &mut self.network_policy_fields,
            &older.network_policy_fields,
        );
        fields(
            &mut self.cluster_network_policy_fields,
            &older.cluster_network_policy_fields,
        );
    }

    /// The objects that differ between `self` and `newer`: added, changed or removed,
    /// by kind and key. Kind by kind in [`Kind::ALL`] order: first the changed and the
    /// removed in key order, then the added in key order.
    ///
    /// Each pair of maps is walked side by side, and an object both share (one [`Arc`])
    /// is the same without a look inside: a change costs a walk of the keys, and a
    /// compare of only the objects that are not shared.
    pub fn diff(&self, newer: &Cluster) -> Vec<(Kind, ObjectKey)> {
        fn walk<T: PartialEq>(
            kind: Kind,
            a: &BTreeMap<ObjectKey, Arc<T>>,
            b: &BTreeMap<ObjectKey, Arc<T>>,
            out: &mut Vec<(Kind, ObjectKey)>,
        ) {
            side_by_side(kind, a, b, |x, y| Arc::ptr_eq(x, y) || **x == **y, out);
        }
        let mut out = Vec::new();
        walk(Kind::Node, &self.nodes, &newer.nodes, &mut out);
        walk(Kind::Pod, &self.pods, &newer.pods, &mut out);
        walk(Kind::Service, &self.services, &newer.services, &mut out);
        walk(
            Kind::EndpointSlice,
            &self.endpoint_slices,
            &newer.endpoint_slices,
            &mut out,
        );
        walk(
            Kind::ConfigMap,
            &self.config_maps,
            &newer.config_maps,
            &mut out,
        );
        walk(
            Kind::Namespace,
            &self.namespaces,
            &newer.namespaces,
            &mut out,
        );
        walk(
            Kind::NetworkPolicy,
            &self.network_policies,
            &newer.network_policies,
            &mut out,
        );
        walk(
            Kind::ClusterNetworkPolicy,
            &self.cluster_network_policies,
            &newer.cluster_network_policies,
            &mut out,
        );
        // A Service that wins or loses a frontend changed too.
        let mut frontends = Vec::new();
        side_by_side(
            Kind::Service,
            &self.left_out,
            &newer.left_out,
            |x, y| x == y,
            &mut frontends,
        );
        for f in frontends {
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    /// `self` with the objects `changed` as `newer` has them: added, replaced, or
    /// removed where `newer` has none (a Service with its frontends left out); the rest
    /// as in `self`.
    pub fn with_changes_of(&self, newer: &Cluster, changed: &[(Kind, ObjectKey)]) -> Cluster {
        fn take<T: Clone>(
            to: &mut BTreeMap<ObjectKey, T>,
            from: &BTreeMap<ObjectKey, T>,
            key: &ObjectKey,
        ) {
            match from.get(key) {
                Some(o) => to.insert(key.clone(), o.clone()),
                None => to.remove(key),
            };
        }
        let mut c = self.clone();
        for (kind, key) in changed {
            match kind {
                Kind::Node => take(&mut c.nodes, &newer.nodes, key),
                Kind::Pod => {
                    take(&mut c.pods, &newer.pods, key);
                    take(&mut c.pod_fields, &newer.pod_fields, key);
                }
                Kind::Service => {
                    take(&mut c.services, &newer.services, key);
                    take(&mut c.service_fields, &newer.service_fields, key);
                    take(&mut c.left_out, &newer.left_out, key);
                }
                Kind::EndpointSlice => take(&mut c.endpoint_slices, &newer.endpoint_slices, key),
                Kind::ConfigMap => take(&mut c.config_maps, &newer.config_maps, key),
                Kind::Namespace => {
                    take(&mut c.namespaces, &newer.namespaces, key);
                    take(&mut c.namespace_fields, &newer.namespace_fields, key);
                }
                Kind::NetworkPolicy => {
                    take(&mut c.network_policies, &newer.network_policies, key);
                    take(
                        &mut c.network_policy_fields,
                        &newer.network_policy_fields,
                        key,
                    );
                }
                Kind::ClusterNetworkPolicy => {
                    take(
                        &mut c.cluster_network_policies,
                        &newer.cluster_network_policies,
                        key,
                    );
                    take(
                        &mut c.cluster_network_policy_fields,
                        &newer.cluster_network_policy_fields,
                        key,
                    );
                }
            }
        }
        c
    }

    /// The Service an EndpointSlice belongs to (its namespace and
    /// `kubernetes.io/service-name` label), if it is in the model and labelled.
    pub fn service_of_slice(&self, slice: &ObjectKey) -> Option<ObjectKey> {
        let s = self.endpoint_slices.get(slice)?;
        let name = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
        Some(ObjectKey::new(slice.namespace.clone(), name.clone()))
    }

    /// How many objects the model holds, all kinds together.
    pub fn len(&self) -> usize {
        self.nodes.len()
            + self.pods.len()
            + self.services.len()
            + self.endpoint_slices.len()
            + self.config_maps.len()
            + self.namespaces.len()
            + self.network_policies.len()
            + self.cluster_network_policies.len()
    }

    /// True when it holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ns: Option<&str>, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: ns.map(str::to_string),
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn apply_replaces_by_kind_and_key_and_delete_removes() {
        let mut c = Cluster::default();
        let svc = Service {
            metadata: meta(Some("prod"), "web"),
            ..Service::default()
        };
        assert!(!c.apply(svc.clone()).unwrap());
        let labelled = Service {
            metadata: ObjectMeta {
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..svc.metadata.clone()
            },
            ..svc.clone()
        };
        assert!(c.apply(labelled.clone()).unwrap(), "replaced");
        assert_eq!(*c.services[&ObjectKey::new("prod", "web")], labelled);
        // Same name, other kind: a separate object.
        c.apply(Pod {
            metadata: meta(Some("prod"), "web"),
            ..Pod::default()
        })
        .unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.delete(Kind::Service, "prod", "web"));
        assert!(!c.delete(Kind::Service, "prod", "web"));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_services_fields_are_kept_with_it_until_it_goes() {
        let mut c = Cluster::default();
        let key = ObjectKey::new("prod", "web");
        let svc = |port: i32| Service {
            metadata: meta(Some("prod"), "web"),
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some("10.96.0.10".into()),
                ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                    port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Service::default()
        };
        c.apply(svc(80)).unwrap();
        let f = c.service_fields(&key).unwrap().unwrap();
        assert_eq!(f.cluster_ips, ["10.96.0.10".parse::<IpAddr>().unwrap()]);
        assert_eq!(f.ports[0].port, 80);
        // A state with the Service's change takes its fields along.
        let mut newer = c.clone();
        newer.apply(svc(0)).unwrap();
        let errors = newer.service_fields(&key).unwrap().unwrap_err();
        assert_eq!(errors[0].field, "spec.ports[0].port");
        let both = c.with_changes_of(&newer, &[(Kind::Service, key.clone())]);
        assert!(both.service_fields(&key).unwrap().is_err());
        assert!(
            c.service_fields(&key).unwrap().is_ok(),
            "the older state keeps its own"
        );
        c.delete(Kind::Service, "prod", "web");
        assert!(c.service_fields(&key).is_none());
        assert_eq!(c, Cluster::default());
    }

    #[test]
    fn missing_namespace_is_default_and_nodes_have_none() {
        let mut c = Cluster::default();
        c.apply(Pod {
            metadata: meta(None, "p"),
            ..Pod::default()
        })
        .unwrap();
        let p = &c.pods[&ObjectKey::new("default", "p")];
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        c.apply(Node {
            metadata: meta(Some("ignored"), "n1"),
            ..Node::default()
        })
        .unwrap();
        assert!(c.node("n1").is_some());
        assert!(c.delete(Kind::Node, "whatever", "n1"));
    }

    #[test]
    fn apply_refuses_an_object_without_a_name() {
        let mut c = Cluster::default();
        assert_eq!(c.apply(Pod::default()), Err(NoName(Kind::Pod)));
    }

    #[test]
    fn endpoint_slices_of_selects_by_namespace_and_label() {
        let mut c = Cluster::default();
        let slice = |ns: &str, name: &str, svc: &str| EndpointSlice {
            metadata: ObjectMeta {
                labels: Some([(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into()),
                ..meta(Some(ns), name)
            },
            address_type: "IPv4".into(),
            ..EndpointSlice::default()
        };
        c.apply(slice("a", "web-2", "web")).unwrap();
        c.apply(slice("a", "web-1", "web")).unwrap();
        c.apply(slice("a", "db-1", "db")).unwrap();
        c.apply(slice("b", "web-3", "web")).unwrap();
        c.apply(slice("aa", "web-4", "web")).unwrap();
        let names: Vec<_> = c
            .endpoint_slices_of("a", "web")
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["web-1", "web-2"]);
    }

    #[test]
    fn with_changes_of_takes_only_the_changes_named() {
        let svc = |name: &str, ip: &str| Service {
            metadata: meta(Some("a"), name),
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Service::default()
        };
        let mut old = Cluster::default();
        old.apply(svc("web", "10.96.0.1")).unwrap();
        old.apply(svc("gone", "10.96.0.2")).unwrap();
        let mut new = old.clone();
        new.apply(svc("web", "10.96.0.3")).unwrap();
        new.delete(Kind::Service, "a", "gone");
        new.apply(svc("added", "10.96.0.4")).unwrap();
        new.apply(Pod {
            metadata: meta(Some("a"), "p"),
            ..Pod::default()
        })
        .unwrap();
        let changed = old.diff(&new);
        assert_eq!(changed.len(), 4);
        let services: Vec<_> = changed
            .iter()
            .filter(|(k, _)| *k == Kind::Service)
            .cloned()
            .collect();
        let part = old.with_changes_of(&new, &services);
        assert_eq!(part.services, new.services);
        assert!(part.pods.is_empty());
        // What is left to change is what was not taken.
        assert_eq!(part.diff(&new), [(Kind::Pod, ObjectKey::new("a", "p"))]);
        assert_eq!(old.with_changes_of(&new, &changed), new);
    }

    #[test]
    fn diff_finds_the_changes_among_shared_objects() {
        let pod = |name: &str, app: &str| Pod {
            metadata: ObjectMeta {
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..meta(Some("a"), name)
            },
            ..Pod::default()
        };
        let mut old = Cluster::default();
        for name in ["same", "copied", "changed", "gone"] {
            old.apply(pod(name, "web")).unwrap();
        }
        let mut new = old.clone();
        let key = |name: &str| ObjectKey::new("a", name);
        assert!(
            Arc::ptr_eq(&old.pods[&key("same")], &new.pods[&key("same")]),
            "a clone shares the objects"
        );
        // An equal copy in an Arc of its own is no change.
        new.apply((*old.pods[&key("copied")]).clone()).unwrap();
        assert!(!Arc::ptr_eq(
            &old.pods[&key("copied")],
            &new.pods[&key("copied")]
        ));
        new.apply(pod("changed", "db")).unwrap();
        new.delete(Kind::Pod, "a", "gone");
        // Sorts before the changed and the removed; still comes last, as added.
        new.apply(pod("added", "web")).unwrap();
        let changed = [
            (Kind::Pod, key("changed")),
            (Kind::Pod, key("gone")),
            (Kind::Pod, key("added")),
        ];
        assert_eq!(old.diff(&new), changed);
        assert_eq!(
            new.diff(&old),
            [
                (Kind::Pod, key("added")),
                (Kind::Pod, key("changed")),
                (Kind::Pod, key("gone")),
            ]
        );
        assert_eq!(old.diff(&old.clone()), []);
        let part = old.with_changes_of(&new, &changed);
        assert_eq!(part, new);
        assert!(Arc::ptr_eq(
            &part.pods[&key("changed")],
            &new.pods[&key("changed")]
        ));
        assert_eq!(part.pods_with_fields().count(), 4);
    }

    #[test]
    fn share_with_takes_the_equal_objects_of_an_older_state() {
        let pod = |name: &str, app: &str| Pod {
            metadata: ObjectMeta {
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..meta(Some("a"), name)
            },
            ..Pod::default()
        };
        let read = |apps: &[(&str, &str)]| {
            let mut c = Cluster::default();
            for (name, app) in apps {
                c.apply(pod(name, app)).unwrap();
            }
            c
        };
        let old = read(&[("kept", "web"), ("changed", "web"), ("gone", "web")]);
        let mut new = read(&[("kept", "web"), ("changed", "db"), ("added", "web")]);
        let key = |name: &str| ObjectKey::new("a", name);
        let before = new.clone();
        new.share_with(&old);
        assert_eq!(new, before, "the same state");
        assert!(Arc::ptr_eq(
            &new.pods[&key("kept")],
            &old.pods[&key("kept")]
        ));
        assert!(!Arc::ptr_eq(
            &new.pods[&key("changed")],
            &old.pods[&key("changed")]
        ));
        assert_eq!(
            old.diff(&new),
            [
                (Kind::Pod, key("changed")),
                (Kind::Pod, key("gone")),
                (Kind::Pod, key("added")),
            ]
        );
        assert_ne!(old, new);
    }

    #[test]
    fn a_service_that_loses_or_wins_back_a_frontend_is_a_change() {
        let mut old = Cluster::default();
        old.apply(Service {
            metadata: meta(Some("a"), "evil"),
            ..Service::default()
        })
        .unwrap();
        let mut new = old.clone();
        let evil = ObjectKey::new("a", "evil");
        let frontend = (Protocol::Tcp, "10.96.0.10".parse().unwrap(), 80);
        assert!(new.set_left_out(&evil, BTreeSet::from([frontend])));
        assert!(!new.set_left_out(&evil, BTreeSet::from([frontend])));
        assert_eq!(old.diff(&new), [(Kind::Service, evil.clone())]);
        let part = old.with_changes_of(&new, &old.diff(&new));
        assert_eq!(part, new);
        assert_eq!(new.diff(&old), [(Kind::Service, evil.clone())]);
        // Deleting the Service forgets them.
        new.delete(Kind::Service, "a", "evil");
        assert_eq!(new.left_out(&evil), None);
    }

    #[test]
    fn kind_from_type_needs_the_right_api_version() {
        assert_eq!(
            Kind::from_type("discovery.k8s.io/v1", "EndpointSlice"),
            Some(Kind::EndpointSlice)
        );
        assert_eq!(
            Kind::from_type("discovery.k8s.io/v1beta1", "EndpointSlice"),
            None
        );
        assert_eq!(Kind::from_type("v1", "Node"), Some(Kind::Node));
        assert_eq!(Kind::from_type("apps/v1", "Deployment"), None);
    }
}
