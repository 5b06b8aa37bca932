//! The Kubernetes datastore (`kubernetes`): the cluster as watches on an API server
//! tell it.
//!
//! Eight watches, each a `kube` watcher that lists, then watches, and lists again
//! whenever the watch cannot resume (see [`scopes`]):
//!
//! - Nodes, all of them (overlay peers);
//! - Pods, of every node: a policy's selectors pick peers anywhere in the cluster.
//!   Only this node's pods become ports (compilation looks at `spec.nodeName`); other
//!   nodes' endpoints come from EndpointSlices;
//! - Services and EndpointSlices in every namespace;
//! - the ConfigMap `kube-system/ferry-config`, by a `metadata.name` field selector;
//! - Namespaces (their labels, for policy), NetworkPolicies in every namespace, and
//!   ClusterNetworkPolicies. The last is a CRD that a cluster may not have installed:
//!   while the API server answers 404 for it, the kind counts as listed and empty, the
//!   rest of the state goes out, the absence is reported once, and the list is tried
//!   again every [`ABSENT_RETRY`].
//!
//! Events drive one [`Cluster`] ([`KubeDatastore::event`]). Nothing is sent before every
//! watch has completed its first list; then the whole state goes out as
//! [`Update::Applied`], and afterwards one update per batch of events (events that
//! arrive within [`BATCH_QUIET`] of each other make one batch, at most [`BATCH_MAX`]
//! long), so a burst (a rollout touching many EndpointSlices) costs one compilation.
//!
//! Unlike the file datastore, a bad object does not refuse the whole state: the API
//! server has already accepted it and other objects keep changing around it. The object
//! is left out (its last good version, if any, stays in force) and reported in an
//! [`Update::Refused`] naming the object and field. The same goes for a Service or Node
//! that claims what another object in force holds (a cluster IP, a node port, an
//! InternalIP: see [`super::claims`]): the object in force keeps it, the newcomer is
//! held back and tried again whenever an object it clashed with changes or goes, so
//! that deleting the one lets the other in. A frontend two Services claim is not held
//! back: it goes to the cluster IP, else the older Service, whatever the order, and
//! the other Service leaves that frontend out (with a note) and keeps the rest. Only a bad ferry-config ConfigMap with no
//! good version in force holds the whole state back ([`KubeDatastore::held`]): its
//! defaults may not be what the other nodes use. Watch errors (the API server
//! unreachable, a watch expired with 410 Gone) are retried with the watcher's default
//! backoff and reported the same way; the state in force stays. When a kind whose watch
//! failed is followed again (listed again, or its watch resumed: an event of it came, or
//! a watch request of it was answered, see [`KubeDatastore::watch_started`]), the state
//! goes out again even if nothing changed, so that the agent knows it is whole again
//! (`ferry status` shows the datastore synced).
//!
//! The agent is synchronous: the watches run on a thread of their own, on a
//! current-thread tokio runtime, and hand updates over a std channel in a [`Watch`],
//! like the file datastore.

use std::collections::{BTreeSet, HashMap};
use std::fmt::{self, Debug};
use std::future::Future;
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use futures::channel::mpsc::{self as mpsc_async, UnboundedSender};
use futures::future::{self, Either};
use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::NamespaceResourceScope;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::claims::{self, Claims, Clash, Owner};
use super::{Problem, Refused, Update, Watch, check, is_ferry_config, notes};
use crate::cluster::{Checked, Cluster, Frontend, Kind, Object, ObjectKey, Refusal};
use crate::config::{CONFIG_NAME, CONFIG_NAMESPACE};
use crate::fields::FieldError;
use crate::policy::ClusterNetworkPolicy;

/// The `file` of every [`Problem`] this datastore reports.
pub const ORIGIN: &str = "kubernetes";

/// A batch of events closes when no event has come for this long.
pub const BATCH_QUIET: Duration = Duration::from_millis(5);

/// A batch of events closes this long after its first event at the latest, so that a
/// steady stream of events still makes updates.
pub const BATCH_MAX: Duration = Duration::from_millis(50);

/// How long a request may wait for the API server to send anything: a list, the start
/// of a watch, or a watch between events. The watcher asks the server to end each watch
/// after 290 s, so past this the server is hung or the connection is gone (half-open
/// after a network change, say): the request fails, and the watcher reports it and
/// tries again. kube-client once had it as its default; without one, such a request
/// waits forever and its kind is never followed again.
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);

/// How long the datastore waits before it asks again for a resource the API server
/// does not serve (404: a CRD not installed, such as ClusterNetworkPolicy's): the
/// answer will not change soon, and it is not an error worth the usual backoff.
pub const ABSENT_RETRY: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(60)
};

/// How the datastore reaches the API server, and for which node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeOptions {
    /// This node's name.
    pub node: String,
    /// A kubeconfig file; `None` infers the configuration as kubectl does (`$KUBECONFIG`,
    /// `~/.kube/config`), then from the pod's service account in a cluster.
    pub kubeconfig: Option<PathBuf>,
}

/// What the datastore watches of one kind: the API resource and how the watch is
/// narrowed. [`scopes`] lists them; the RBAC rules in `deploy/ferry.yaml` grant exactly
/// these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The kind.
    pub kind: Kind,
    /// The API group (empty for the core group).
    pub group: &'static str,
    /// The resource, as RBAC rules and URLs name it (`endpointslices`).
    pub resource: &'static str,
    /// The one namespace watched; `None` for all of them (or a cluster-scoped kind).
    pub namespace: Option<&'static str>,
    /// The field selector, when there is one.
    pub field_selector: Option<String>,
}

/// The eight watches of the datastore, in [`Kind::ALL`] order. Every one is of the whole
/// cluster (Pods too: a policy on this node selects pods on others) but the ConfigMap's.
pub fn scopes() -> [Scope; 8] {
    fn scope<K: k8s_openapi::Resource>(
        kind: Kind,
        namespace: Option<&'static str>,
        field_selector: Option<String>,
    ) -> Scope {
        Scope {
            kind,
            group: K::GROUP,
            resource: K::URL_PATH_SEGMENT,
            namespace,
            field_selector,
        }
    }
    [
        scope::<Node>(Kind::Node, None, None),
        scope::<Pod>(Kind::Pod, None, None),
        scope::<Service>(Kind::Service, None, None),
        scope::<EndpointSlice>(Kind::EndpointSlice, None, None),
        scope::<ConfigMap>(
            Kind::ConfigMap,
            Some(CONFIG_NAMESPACE),
            Some(format!("metadata.name={CONFIG_NAME}")),
        ),
        scope::<Namespace>(Kind::Namespace, None, None),
        scope::<NetworkPolicy>(Kind::NetworkPolicy, None, None),
        scope::<ClusterNetworkPolicy>(Kind::ClusterNetworkPolicy, None, None),
    ]
}

/// Why the datastore could not start.
#[derive(Debug)]
pub enum KubeError {
    /// The node name is empty.
    NoNode,
    /// The async runtime could not start.
    Runtime(std::io::Error),
    /// No client configuration: the kubeconfig cannot be read, or neither a kubeconfig
    /// nor a service account is there.
    Config(String),
    /// The client cannot be built from the configuration (bad certificates, say).
    Client(kube::Error),
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::NoNode => f.write_str("the Kubernetes datastore needs this node's name"),
            KubeError::Runtime(e) => write!(f, "cannot start the Kubernetes datastore: {e}"),
            KubeError::Config(e) => write!(f, "no Kubernetes client configuration: {e}"),
            KubeError::Client(e) => write!(f, "cannot build the Kubernetes client: {e}"),
        }
    }
}

impl std::error::Error for KubeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KubeError::Runtime(e) => Some(e),
            KubeError::Client(e) => Some(e),
            KubeError::NoNode | KubeError::Config(_) => None,
        }
    }
}

/// The cluster as the watch events tell it, and what to report. The live watches feed
/// it ([`KubeDatastore::watch`] does); it is public so that anything holding events
/// (a test, a replay of recorded events) drives the same code.
#[derive(Debug)]
pub struct KubeDatastore {
    cluster: Arc<Cluster>,
    /// Kinds whose first list is complete.
    listed: BTreeSet<Kind>,
    /// The objects of a list in progress, by kind: they replace the kind's objects
    /// together when the list is complete, so a relist never shows half a kind.
    listing: HashMap<Kind, Vec<Object>>,
    /// The state changed since the last update (true until the first one).
    changed: bool,
    /// Problems since the last update.
    problems: Vec<Problem>,
    /// Notes since the last state sent: what was left out of objects that entered.
    notes: Vec<Problem>,
    /// The last version of the ferry-config ConfigMap seen was refused. With no good
    /// version in force the state is held back ([`KubeDatastore::held`]).
    config_refused: bool,
    /// The state being held back was reported.
    held_told: bool,
    /// Kinds whose watch reported an error and has not been seen working since: no list
    /// completed, no event, no watch started.
    erred: BTreeSet<Kind>,
    /// Kinds whose watch reported an error in this batch.
    erred_now: BTreeSet<Kind>,
    /// Kinds the API server does not serve (404), reported once: listed as empty.
    absent: BTreeSet<Kind>,
    /// Kinds whose watch started in this batch.
    started: BTreeSet<Kind>,
    /// Who holds which frontend, node port and InternalIP, among the objects in force.
    claims: Claims,
    /// Objects held back because what they claim is held by others, by object.
    waiting: HashMap<Owner, Waiting>,
    /// The objects held back, by an object that holds what they claim.
    blocking: HashMap<Owner, BTreeSet<Owner>>,
    /// Objects held back to try again: one they clashed with changed or went.
    woken: BTreeSet<Owner>,
    /// Services whose frontends may have changed hands in this batch.
    contested: BTreeSet<ObjectKey>,
    /// The frontends of each Service left out in the last state sent: what was told.
    told_left_out: HashMap<ObjectKey, BTreeSet<Frontend>>,
}

/// An object held back by a clash, until the objects it clashed with change or go.
#[derive(Debug)]
struct Waiting {
    obj: Object,
    clashes: Vec<Clash>,
    /// Its clashes went out in an update: an unchanged object is not reported again
    /// each time it is tried.
    reported: bool,
}

impl Default for KubeDatastore {
    fn default() -> KubeDatastore {
        KubeDatastore::new()
    }
}

impl KubeDatastore {
    /// No objects, no list complete yet.
    pub fn new() -> KubeDatastore {
        KubeDatastore {
            cluster: Arc::default(),
            listed: BTreeSet::new(),
            listing: HashMap::new(),
            changed: true,
            problems: Vec::new(),
            notes: Vec::new(),
            config_refused: false,
            held_told: false,
            erred: BTreeSet::new(),
            erred_now: BTreeSet::new(),
            absent: BTreeSet::new(),
            started: BTreeSet::new(),
            claims: Claims::default(),
            waiting: HashMap::new(),
            blocking: HashMap::new(),
            woken: BTreeSet::new(),
            contested: BTreeSet::new(),
            told_left_out: HashMap::new(),
        }
    }

    /// The state as the events so far make it.
    pub fn current(&self) -> Arc<Cluster> {
        Arc::clone(&self.cluster)
    }

    /// True once every kind has been listed: the state is whole.
    pub fn is_listed(&self) -> bool {
        self.listed.len() == Kind::ALL.len()
    }

    /// True while the state is held back: the ferry-config ConfigMap's last version was
    /// refused and no good version is in force. Its defaults would apply instead, and
    /// they may not be what the other nodes run with (another VXLAN port or VNI cuts
    /// this node off), so nothing goes out until it is fixed or deleted.
    pub fn held(&self) -> bool {
        self.config_refused
            && self
                .cluster
                .config_map(CONFIG_NAMESPACE, CONFIG_NAME)
                .is_none()
    }

    /// Applies one event of the watch of `kind`. An object that fails its field checks
    /// is left out and reported, and so is one that claims what another holds (until
    /// that one changes or goes); `metadata.managedFields` is dropped on the way in
    /// (ferry never reads it, and it is often the larger part of an object).
    pub fn event(&mut self, kind: Kind, event: Event<Object>) {
        self.event_only(kind, event);
        self.retry();
    }

    fn event_only(&mut self, kind: Kind, event: Event<Object>) {
        match event {
            Event::Init => {
                self.listing.insert(kind, Vec::new());
            }
            Event::InitApply(obj) => match self.listing.get_mut(&kind) {
                Some(list) => list.push(strip(obj)),
                // Not announced by Init: nothing to replace, take it as it comes.
                None => self.apply(strip(obj)),
            },
            Event::InitDone => {
                self.absent.remove(&kind);
                let list = self.listing.remove(&kind).unwrap_or_default();
                self.replace(kind, list);
                self.listed.insert(kind);
                // A list after an error brings the state up to date again: say so
                // with an update even when nothing changed (the state was in doubt).
                if self.erred.remove(&kind) {
                    self.changed = true;
                }
            }
            Event::Apply(obj) => {
                self.working(kind);
                self.apply(strip(obj));
            }
            Event::Delete(obj) => {
                self.working(kind);
                self.delete(&obj);
            }
        }
    }

    /// The watch of `kind` delivered an event: after an error it follows the kind again
    /// (the watcher resumed where it was), so the state goes out even if nothing changed.
    fn working(&mut self, kind: Kind) {
        if self.erred.remove(&kind) {
            self.changed = true;
        }
    }

    /// Says that a watch request of `kind` was answered: the watch (re)started. After
    /// an error the watcher resumes from the last version it saw without a list, and
    /// reports nothing when nothing changed; this is how the datastore learns that the
    /// kind is followed again (the state then goes out, even unchanged). A start in the
    /// batch of an error of the kind counts for nothing: that watch may have failed at
    /// once.
    pub fn watch_started(&mut self, kind: Kind) {
        self.started.insert(kind);
    }

    /// Reports an error of the watch of `kind`; the watch retries by itself.
    pub fn watch_error(&mut self, kind: Kind, error: &dyn fmt::Display) {
        self.erred.insert(kind);
        self.erred_now.insert(kind);
        let what = match kind {
            Kind::ConfigMap => format!("ConfigMap {CONFIG_NAMESPACE}/{CONFIG_NAME}"),
            k => format!("{k}s"),
        };
        self.problems.push(Problem {
            file: ORIGIN.into(),
            line: None,
            object: None,
            field: None,
            message: format!("watching {what}: {error}; retrying"),
        });
    }

    /// Says that the API server does not serve `kind` (it answered 404: a CRD that is
    /// not installed). The kind counts as listed, with no objects, so that the rest of
    /// the state is not held back; this is a note (not an error: such a cluster is
    /// normal), told once until the kind is listed again. The watch asks again every [`ABSENT_RETRY`].
    pub fn watch_absent(&mut self, kind: Kind, error: &dyn fmt::Display) {
        self.listing.remove(&kind);
        self.replace(kind, Vec::new());
        self.listed.insert(kind);
        if self.erred.remove(&kind) {
            self.changed = true;
        }
        if self.absent.insert(kind) {
            self.notes.push(Problem {
                file: ORIGIN.into(),
                line: None,
                object: None,
                field: None,
                message: format!(
                    "{kind}: the API server does not serve this kind ({error}); is its CRD installed? None is in force; asked again every {} s",
                    ABSENT_RETRY.as_secs()
                ),
            });
        }
    }

    /// Ends a batch of events: the updates it makes, in order. The state goes out when
    /// it changed and every kind has been listed (the first time, whole); problems go
    /// out as they come, before the first state too (an unreachable API server is news
    /// while the agent waits).
    pub fn take_updates(&mut self) -> Vec<Update> {
        let mut out = Vec::new();
        // Clashes are told once the batch is over: one that a later event of the same
        // batch resolved (a relist that moves an address from one Service to another)
        // is no news.
        let mut held_back: Vec<_> = self.waiting.values_mut().filter(|w| !w.reported).collect();
        held_back.sort_by_key(|w| (w.obj.kind(), w.obj.key()));
        for w in held_back {
            w.reported = true;
            let what = w.obj.to_string();
            self.problems.extend(w.clashes.iter().map(|c| Problem {
                file: ORIGIN.into(),
                line: None,
                object: Some(what.clone()),
                field: Some(c.field.clone()),
                message: c.message.clone(),
            }));
        }
        for kind in std::mem::take(&mut self.started) {
            if !self.erred_now.contains(&kind) {
                self.working(kind);
            }
        }
        self.erred_now.clear();
        let held = self.held();
        if held && self.is_listed() && !self.held_told {
            self.held_told = true;
            self.problems.push(Problem {
                file: ORIGIN.into(),
                line: None,
                object: None,
                field: None,
                message: format!(
                    "state held back until ConfigMap {CONFIG_NAMESPACE}/{CONFIG_NAME} is fixed or deleted: no good version of it is in force, and the defaults of its keys may not be what the other nodes use"
                ),
            });
        } else if !held && self.held_told {
            // The state goes out again even if nothing changed: it is whole again.
            self.held_told = false;
            self.changed = true;
        }
        if self.changed && self.is_listed() && !held {
            self.changed = false;
            self.tell_left_out();
            out.push(Update::Applied {
                cluster: self.current(),
                notes: std::mem::take(&mut self.notes),
                read_unix_ms: super::unix_ms(),
            });
        }
        if !self.problems.is_empty() {
            out.push(Update::Refused(Refused {
                problems: std::mem::take(&mut self.problems),
            }));
        }
        out
    }

    fn apply(&mut self, obj: Object) {
        let (mut errors, fields) = match check(&obj) {
            Ok(fields) => (Vec::new(), fields),
            Err(errors) => (errors, Checked::Nothing),
        };
        let owner = obj.key().map(|k| (obj.kind(), k));
        // This version replaces any that was held back.
        let earlier = owner.as_ref().and_then(|o| self.unwait(o));
        let Some(owner) = owner else {
            errors.push(FieldError::new("metadata.name", "required"));
            self.refuse(&obj, errors);
            return;
        };
        let ferry_config = is_ferry_config(&obj);
        if !errors.is_empty() {
            self.config_refused |= ferry_config;
            self.note_refusal(&owner, Some(refusal(&obj, &errors)));
            self.refuse(&obj, errors);
            return;
        }
        self.config_refused &= !ferry_config;
        self.note_refusal(&owner, None);
        if self.holds(&obj) {
            return;
        }
        let what = obj.to_string();
        self.notes
            .extend(notes(&obj, &fields).into_iter().map(|n| Problem {
                file: ORIGIN.into(),
                line: None,
                object: Some(what.clone()),
                field: Some(n.field),
                message: n.message,
            }));
        let mine = claims::of(&obj, fields.service());
        let clashes = self.claims.clashes(&owner, &mine);
        if !clashes.is_empty() {
            self.wait(owner, obj, clashes, earlier);
            return;
        }
        let mut rivals = self.claims.rivals(&owner);
        if self.claims.set(owner.clone(), mine) {
            self.wake(&owner);
            rivals.extend(self.claims.rivals(&owner));
        }
        // Copies the cluster only when an update still shares it: once per batch.
        Arc::make_mut(&mut self.cluster)
            .apply_checked(obj, fields)
            .expect("named: checked above");
        self.changed = true;
        rivals.insert(owner);
        self.contest(rivals);
    }

    /// Decides again which frontends of the Services `owners` are left out: those
    /// another Service wins ([`Claims::left_out`]).
    fn contest(&mut self, owners: BTreeSet<Owner>) {
        for (kind, key) in owners {
            if kind != Kind::Service || !self.cluster.contains(kind, &key) {
                continue;
            }
            let owner = (kind, key);
            let left_out: BTreeSet<Frontend> = (self.claims.left_out(&owner).into_iter())
                .map(|l| l.frontend)
                .collect();
            let key = owner.1;
            let same =
                (self.cluster.left_out(&key)).map_or(left_out.is_empty(), |l| *l == left_out);
            if !same {
                Arc::make_mut(&mut self.cluster).set_left_out(&key, left_out);
                self.changed = true;
            }
            self.contested.insert(key);
        }
    }

    /// Notes the frontends left out since the last state sent, once the batch is over:
    /// one that a later event of the same batch gave back (a list that moves an address
    /// from one Service to another) is no news.
    fn tell_left_out(&mut self) {
        for key in std::mem::take(&mut self.contested) {
            let now = self.cluster.left_out(&key).cloned().unwrap_or_default();
            let told = self.told_left_out.remove(&key).unwrap_or_default();
            let owner = (Kind::Service, key);
            for l in self.claims.left_out(&owner) {
                if now.contains(&l.frontend) && !told.contains(&l.frontend) {
                    self.notes.push(Problem {
                        file: ORIGIN.into(),
                        line: None,
                        object: Some(format!("Service {}", owner.1)),
                        field: Some(l.field),
                        message: l.message,
                    });
                }
            }
            if !now.is_empty() {
                self.told_left_out.insert(owner.1, now);
            }
        }
    }

    /// Keeps with the state that a version of the policy `owner` is refused (`Some`), or
    /// that none is (`None`), so that what is not enforced of it is told as long as it
    /// lasts, not once: the state goes out again when that changes. Other kinds are
    /// told only as their problems come.
    fn note_refusal(&mut self, owner: &Owner, r: Option<Refusal>) {
        let (kind, key) = owner;
        if !matches!(kind, Kind::NetworkPolicy | Kind::ClusterNetworkPolicy) {
            return;
        }
        let unchanged = match &r {
            None => self.cluster.refused().all(|(k, _)| k != owner),
            Some(r) => self.cluster.refused().any(|(k, v)| k == owner && v == r),
        };
        if !unchanged {
            Arc::make_mut(&mut self.cluster).set_refused(*kind, key, r);
            self.changed = true;
        }
    }

    /// Reports the field errors of `obj`, which is left out.
    fn refuse(&mut self, obj: &Object, errors: Vec<FieldError>) {
        let what = obj.to_string();
        self.problems.extend(errors.into_iter().map(|e| Problem {
            file: ORIGIN.into(),
            line: None,
            object: Some(what.clone()),
            field: Some(e.field).filter(|f| !f.is_empty()),
            message: e.message,
        }));
    }

    /// Holds `obj` back: what it claims is held by others. `earlier` is the version
    /// held back before it, if any: the same clashes again are not news.
    fn wait(&mut self, owner: Owner, obj: Object, clashes: Vec<Clash>, earlier: Option<Waiting>) {
        for c in &clashes {
            self.blocking
                .entry(c.holder.clone())
                .or_default()
                .insert(owner.clone());
        }
        let reported = earlier.is_some_and(|e| e.reported && e.clashes == clashes);
        self.waiting.insert(
            owner,
            Waiting {
                obj,
                clashes,
                reported,
            },
        );
    }

    /// Takes `owner` out of the objects held back; returns what was held.
    fn unwait(&mut self, owner: &Owner) -> Option<Waiting> {
        let w = self.waiting.remove(owner)?;
        for c in &w.clashes {
            if let Some(set) = self.blocking.get_mut(&c.holder) {
                set.remove(owner);
                if set.is_empty() {
                    self.blocking.remove(&c.holder);
                }
            }
        }
        Some(w)
    }

    /// What `owner` held changed: the objects it held back get another try.
    fn wake(&mut self, owner: &Owner) {
        if let Some(set) = self.blocking.remove(owner) {
            self.woken.extend(set);
        }
    }

    /// Tries the objects woken again, until none is left (an object let in may free
    /// what it held before, and wake more).
    fn retry(&mut self) {
        while let Some(owner) = self.woken.pop_first() {
            let Some(w) = self.waiting.get(&owner) else {
                continue;
            };
            let obj = w.obj.clone();
            self.apply(obj);
        }
    }

    fn delete(&mut self, obj: &Object) {
        let Some(key) = obj.key() else { return };
        self.remove(obj.kind(), key);
    }

    /// Removes the object of `kind` at `key`: from the cluster, from the claims (waking
    /// what it held back), and from the objects held back.
    fn remove(&mut self, kind: Kind, key: ObjectKey) {
        if kind == Kind::ConfigMap && key == ObjectKey::new(CONFIG_NAMESPACE, CONFIG_NAME) {
            // Whatever was refused of it is gone too: its defaults are what it says now.
            self.config_refused = false;
        }
        let owner = (kind, key);
        self.unwait(&owner);
        self.note_refusal(&owner, None);
        let rivals = self.claims.rivals(&owner);
        if self.claims.remove(&owner) {
            self.wake(&owner);
        }
        let (kind, key) = owner;
        if self.cluster.contains(kind, &key) {
            Arc::make_mut(&mut self.cluster).delete(kind, &key.namespace, &key.name);
            self.changed = true;
        }
        if kind == Kind::Service {
            self.contested.insert(key);
        }
        self.contest(rivals);
    }

    /// A complete list of `kind`: its objects replace the kind's, and objects it lacks
    /// were deleted while no watch saw it. An object listed but refused keeps its last
    /// good version.
    fn replace(&mut self, kind: Kind, list: Vec<Object>) {
        let listed: BTreeSet<ObjectKey> = list.iter().filter_map(Object::key).collect();
        let config = ObjectKey::new(CONFIG_NAMESPACE, CONFIG_NAME);
        if kind == Kind::ConfigMap && !listed.contains(&config) {
            // Deleted while no watch saw it, maybe after a version that was refused.
            self.remove(kind, config);
        }
        for obj in list {
            self.apply(obj);
        }
        let held_back = self
            .waiting
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, k)| k);
        let gone: BTreeSet<ObjectKey> = keys(&self.cluster, kind)
            .chain(held_back)
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        for k in gone {
            self.remove(kind, k);
        }
    }

    /// True when `obj` is in force as it is.
    fn holds(&self, obj: &Object) -> bool {
        let Some(key) = obj.key() else { return false };
        let c = &self.cluster;
        fn same<T: PartialEq>(held: Option<&Arc<T>>, o: &T) -> bool {
            held.is_some_and(|h| **h == *o)
        }
        match obj {
            Object::Node(o) => same(c.nodes.get(&key), o),
            Object::Pod(o) => same(c.pods.get(&key), o),
            Object::Service(o) => same(c.services.get(&key), o),
            Object::EndpointSlice(o) => same(c.endpoint_slices.get(&key), o),
            Object::ConfigMap(o) => same(c.config_maps.get(&key), o),
            Object::Namespace(o) => same(c.namespaces.get(&key), o),
            Object::NetworkPolicy(o) => same(c.network_policies.get(&key), o),
            Object::ClusterNetworkPolicy(o) => same(c.cluster_network_policies.get(&key), o),
        }
    }

    /// Connects to the API server (see [`KubeOptions::kubeconfig`]) and watches it on a
    /// thread of its own until the returned [`Watch`] is dropped.
    ///
    /// Returns once the client is configured, without waiting for the API server: the
    /// first [`Update::Applied`] is the whole initial state, and until it comes
    /// [`Watch::current`] is empty. An unreachable server shows as
    /// [`Update::Refused`] updates while the watches retry.
    pub fn watch(opts: KubeOptions) -> Result<Watch, KubeError> {
        let kubeconfig = opts.kubeconfig;
        let url = Arc::new(Mutex::new(None));
        let found = Arc::clone(&url);
        let mut w = watch_with(opts.node, move || async move {
            let (client, u) = connect(kubeconfig, READ_TIMEOUT).await?;
            *found.lock().unwrap_or_else(PoisonError::into_inner) = Some(u);
            Ok(client)
        })?;
        w.source = url.lock().unwrap_or_else(PoisonError::into_inner).take();
        Ok(w)
    }
}

/// The keys of the objects of `kind`.
fn keys(c: &Cluster, kind: Kind) -> Box<dyn Iterator<Item = &ObjectKey> + '_> {
    match kind {
        Kind::Node => Box::new(c.nodes.keys()),
        Kind::Pod => Box::new(c.pods.keys()),
        Kind::Service => Box::new(c.services.keys()),
        Kind::EndpointSlice => Box::new(c.endpoint_slices.keys()),
        Kind::ConfigMap => Box::new(c.config_maps.keys()),
        Kind::Namespace => Box::new(c.namespaces.keys()),
        Kind::NetworkPolicy => Box::new(c.network_policies.keys()),
        Kind::ClusterNetworkPolicy => Box::new(c.cluster_network_policies.keys()),
    }
}

/// What is kept of the refused version `obj`: its versions and `errors`.
fn refusal(obj: &Object, errors: &[FieldError]) -> Refusal {
    let meta = obj.metadata();
    Refusal {
        resource_version: meta.resource_version.clone(),
        generation: meta.generation,
        errors: errors.to_vec(),
    }
}

/// The object without `metadata.managedFields`.
fn strip(mut obj: Object) -> Object {
    obj.metadata_mut().managed_fields = None;
    obj
}

/// The client for a kubeconfig file, or the inferred configuration, and the API
/// server's URL. A request fails when the server sends nothing for `read_timeout`
/// ([`READ_TIMEOUT`]).
async fn connect(
    kubeconfig: Option<PathBuf>,
    read_timeout: Duration,
) -> Result<(Client, String), KubeError> {
    let mut config = match kubeconfig {
        None => Config::infer()
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
        Some(path) => {
            let failed =
                |e: &dyn fmt::Display| KubeError::Config(format!("{}: {e}", path.display()));
            let kc = Kubeconfig::read_from(&path).map_err(|e| failed(&e))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| failed(&e))?
        }
    };
    config.read_timeout = Some(read_timeout);
    // Counted from the request, not from when its pooled connection last had news.
    config.reset_reader_on_write = true;
    let url = config.cluster_url.to_string();
    Client::try_from(config)
        .map(|c| (c, url))
        .map_err(KubeError::Client)
}

/// Starts the watches for `node` with the client `connect` makes (it runs on the
/// datastore's runtime: a client spawns its connection tasks where it is made).
pub(crate) fn watch_with<F, Fut>(node: String, connect: F) -> Result<Watch, KubeError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Client, KubeError>>,
{
    if node.is_empty() {
        return Err(KubeError::NoNode);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeError::Runtime)?;
    let scopes = scopes();
    let (started, starts) = mpsc_async::unbounded();
    let client = rt.block_on(async {
        let client = connect().await?;
        Ok::<_, KubeError>(telling_watch_starts(client, &scopes, started))
    })?;
    let (annotate, annotations) = mpsc_async::unbounded();
    rt.spawn(annotate_node(client.clone(), node.clone(), annotations));
    let mut events = stream::select_all(scopes.iter().map(|s| watch_scope(&client, s)));
    events.push(starts.map(|kind| (kind, Told::Started)).boxed());
    let current = Arc::new(Mutex::new(Arc::new(Cluster::default())));
    let (tx, updates) = mpsc::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let shared = Arc::clone(&current);
    let thread = thread::Builder::new()
        .name("kube-datastore".into())
        .spawn(move || {
            rt.block_on(run(events, KubeDatastore::new(), tx, shared, stopped));
            // A name lookup may still be running on the blocking pool; do not wait
            // for it.
            rt.shutdown_timeout(Duration::from_millis(100));
        })
        .map_err(KubeError::Runtime)?;
    let mut w = Watch::new(updates, current, stop, thread);
    w.annotate = Some(annotate);
    Ok(w)
}

/// What the datastore writes, as RBAC names it (API group, resource, verb): its own
/// Node's annotations, by merge patch ([`Watch::annotate_node`]).
pub const WRITES: [(&str, &str, &str); 1] = [("", "nodes", "patch")];

/// How long the writer of the Node's annotations waits before it tries again.
pub const ANNOTATE_RETRY: Duration = Duration::from_secs(5);

/// Writes the annotations `wanted` brings on Node `node`, each as a JSON merge patch of
/// `metadata.annotations` (the `patch` verb on nodes; no other field is touched), the
/// latest first: a failed write is tried again after [`ANNOTATE_RETRY`], or at once
/// with a newer set, and its error is logged when it is not the one logged last (an
/// RBAC refusal is said once, not every 5 s). Ends with the datastore.
async fn annotate_node(
    client: Client,
    node: String,
    mut wanted: mpsc_async::UnboundedReceiver<super::Annotations>,
) {
    use kube::api::{Patch, PatchParams};
    let nodes: Api<Node> = Api::all(client);
    let mut pending = None;
    // The last failure's message: a failure that repeats itself is logged once.
    let mut failing: Option<String> = None;
    loop {
        if pending.is_none() {
            match wanted.next().await {
                Some(a) => pending = Some(a),
                None => return,
            }
        }
        while let Ok(a) = wanted.try_recv() {
            pending = Some(a);
        }
        let Some(a) = pending.clone() else { continue };
        let patch = serde_json::json!({ "metadata": { "annotations": a } });
        match nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = %node, annotations = ?a, "the Node's annotations are written");
                pending = None;
                failing = None;
            }
            Err(e) => {
                let why = with_causes(&e);
                if failing.as_deref() != Some(why.as_str()) {
                    tracing::warn!(node = %node, error = %why,
                        "the Node's annotations were not written; trying again every {ANNOTATE_RETRY:?} (said once while the error stays the same)");
                    failing = Some(why);
                }
                match tokio::time::timeout(ANNOTATE_RETRY, wanted.next()).await {
                    Ok(Some(a)) => pending = Some(a),
                    Ok(None) => return,
                    Err(_) => {}
                }
            }
        }
    }
}

/// What the watches tell the datastore, each tagged with its kind.
type Tagged = (Kind, Told);

/// What a watch tells.
// Moved once, from the watcher to the datastore: not worth an allocation per event.
#[allow(clippy::large_enum_variant)]
enum Told {
    /// An event of its watcher.
    Event(Event<Object>),
    /// An error of its watcher, which retries by itself.
    Error(watcher::Error),
    /// A 404 of its watcher: the API server does not serve the resource.
    Absent(watcher::Error),
    /// A watch request was answered: the watch (re)started.
    Started,
}

/// `client`, telling `started` the kind of each watch request of `scopes` that the API
/// server answers with success. The watcher says nothing when it resumes a watch after
/// an error (it lists only when it must), and nothing may change for a long time after:
/// an answered watch request is how the datastore learns that the kind is followed
/// again.
fn telling_watch_starts(
    client: Client,
    scopes: &[Scope],
    started: UnboundedSender<Kind>,
) -> Client {
    let resources: Vec<(&'static str, Kind)> =
        scopes.iter().map(|s| (s.resource, s.kind)).collect();
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let kind = watch_of(req.uri(), &resources);
        let client = client.clone();
        let started = started.clone();
        async move {
            let r = client.send(req).await;
            if let (Some(kind), Ok(answer)) = (kind, &r)
                && answer.status().is_success()
            {
                let _ = started.unbounded_send(kind);
            }
            // Unwrapped, so that the client this one is wrapped in does not say
            // "ServiceError" twice.
            r.map_err(|e| match e {
                kube::Error::Service(e) => e,
                e => tower::BoxError::from(e),
            })
        }
    });
    Client::new(service, namespace)
}

/// The kind whose watch `uri` asks for, if it is a watch request of one of `resources`.
fn watch_of(uri: &http::Uri, resources: &[(&'static str, Kind)]) -> Option<Kind> {
    let watch = uri
        .query()?
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let resource = uri.path().rsplit('/').next()?;
    resources
        .iter()
        .find(|(r, _)| watch && *r == resource)
        .map(|(_, k)| *k)
}

/// The watcher of one scope, with the default backoff after errors.
fn watch_scope(client: &Client, scope: &Scope) -> BoxStream<'static, Tagged> {
    fn namespaced<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let c = client;
    let ns = scope.namespace;
    match scope.kind {
        Kind::Node => watch_api(Api::<Node>::all(c.clone()), scope),
        Kind::Pod => watch_api(namespaced::<Pod>(c, ns), scope),
        Kind::Service => watch_api(namespaced::<Service>(c, ns), scope),
        Kind::EndpointSlice => watch_api(namespaced::<EndpointSlice>(c, ns), scope),
        Kind::ConfigMap => watch_api(namespaced::<ConfigMap>(c, ns), scope),
        Kind::Namespace => watch_api(Api::<Namespace>::all(c.clone()), scope),
        Kind::NetworkPolicy => watch_api(namespaced::<NetworkPolicy>(c, ns), scope),
        Kind::ClusterNetworkPolicy => watch_api(Api::<ClusterNetworkPolicy>::all(c.clone()), scope),
    }
}

fn watch_api<K>(api: Api<K>, scope: &Scope) -> BoxStream<'static, Tagged>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static + Into<Object>,
{
    let mut config = watcher::Config::default();
    if let Some(f) = &scope.field_selector {
        config = config.fields(f);
    }
    let kind = scope.kind;
    let told = watcher::watcher(api, config)
        .default_backoff()
        .map(move |r| {
            let told = match r {
                Ok(e) => Told::Event(into_object(e)),
                Err(e) if not_served(&e) => Told::Absent(e),
                Err(e) => Told::Error(e),
            };
            (kind, told)
        })
        .boxed();
    // After a 404 the next request waits ABSENT_RETRY, past the usual backoff.
    stream::unfold((told, false), |(mut told, absent)| async move {
        if absent {
            tokio::time::sleep(ABSENT_RETRY).await;
        }
        let item = told.next().await?;
        let absent = matches!(item.1, Told::Absent(_));
        Some((item, (told, absent)))
    })
    .boxed()
}

/// True for an error that says the API server does not serve the resource: 404 on its
/// list or watch (a CRD that is not installed).
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.is_not_found(),
        _ => false,
    }
}

fn into_object<K: Into<Object>>(e: Event<K>) -> Event<Object> {
    match e {
        Event::Apply(o) => Event::Apply(o.into()),
        Event::Delete(o) => Event::Delete(o.into()),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(o.into()),
        Event::InitDone => Event::InitDone,
    }
}

/// `e` and what caused it, each once: the client's errors say little by themselves
/// ("client error (SendRequest)"), their causes say what happened ("timed out",
/// "connection refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s = format!("{s}: {text}");
        }
        cause = c.source();
    }
    s
}

/// Feeds the events to `ds` in batches and sends the updates, until `stop` fires or
/// the receiver of the updates is gone.
async fn run(
    mut events: stream::SelectAll<BoxStream<'static, Tagged>>,
    mut ds: KubeDatastore,
    tx: Sender<Update>,
    current: Arc<Mutex<Arc<Cluster>>>,
    mut stop: oneshot::Receiver<()>,
) {
    let feed = |ds: &mut KubeDatastore, (kind, told): Tagged| match told {
        Told::Event(e) => ds.event(kind, e),
        Told::Error(e) => ds.watch_error(kind, &with_causes(&e)),
        Told::Absent(e) => ds.watch_absent(kind, &with_causes(&e)),
        Told::Started => ds.watch_started(kind),
    };
    loop {
        let first = match future::select(&mut stop, events.next()).await {
            Either::Right((Some(item), _)) => item,
            // Stopped; or the watches ended, which they do not: nothing more to say.
            Either::Left(_) | Either::Right((None, _)) => return,
        };
        feed(&mut ds, first);
        let close = Instant::now() + BATCH_MAX;
        loop {
            let now = Instant::now();
            if now >= close {
                break;
            }
            let quiet = BATCH_QUIET.min(close - now);
            match tokio::time::timeout(quiet, events.next()).await {
                Ok(Some(item)) => feed(&mut ds, item),
                Ok(None) | Err(_) => break,
            }
        }
        for u in ds.take_updates() {
            if let Update::Applied { cluster, .. } = &u {
                *current.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(cluster);
            }
            if tx.send(u).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod mock;
#[cfg(test)]
mod tests;
