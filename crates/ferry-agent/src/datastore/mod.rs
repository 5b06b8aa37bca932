//! Datastores: where the cluster model comes from. `file:DIR` reads a directory of
//! YAML manifests ([`file`](mod@file)); [`kube`] drives the same [`crate::Cluster`]
//! from watches on a Kubernetes API server. Both hand their states over as a [`Watch`]:
//! a thread of their own sends an [`Update`] whenever the state in force changes or is
//! refused.

pub mod file;
pub mod kube;

mod claims;

use std::any::Any;
use std::fmt;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cluster::{Checked, Cluster, Object, ObjectKey};
use crate::config::{CONFIG_NAME, CONFIG_NAMESPACE, FerryConfig};
use crate::fields::{FieldError, NodeFields, PodFields, ServiceFields, SliceFields};
use crate::policy::{ClusterNetworkPolicyFields, NamespaceFields, NetworkPolicyFields};

use self::file::FileDatastore;
use self::kube::{KubeDatastore, KubeError, KubeOptions};

/// Where the cluster state comes from, as `ferry agent --datastore` names it:
/// `file:DIR`, `kubernetes` or `kubernetes:KUBECONFIG`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `file:DIR`: a directory of Kubernetes manifests, watched ([`file`](mod@file)).
    File(PathBuf),
    /// `kubernetes[:KUBECONFIG]`: an API server ([`kube`]), of the in-cluster
    /// configuration or the usual kubeconfig when `kubeconfig` is None.
    Kubernetes {
        /// The kubeconfig file given.
        kubeconfig: Option<PathBuf>,
    },
}

impl Source {
    /// The source `spec` names; the error says what was expected.
    pub fn parse(spec: &str) -> Result<Source, String> {
        if let Some(dir) = spec.strip_prefix("file:") {
            if dir.is_empty() {
                return Err("the directory is missing: expected file:DIR".into());
            }
            return Ok(Source::File(PathBuf::from(dir)));
        }
        match spec {
            "kubernetes" => Ok(Source::Kubernetes { kubeconfig: None }),
            _ => match spec.strip_prefix("kubernetes:") {
                Some(path) if !path.is_empty() => Ok(Source::Kubernetes {
                    kubeconfig: Some(PathBuf::from(path)),
                }),
                _ => Err("expected file:DIR, kubernetes or kubernetes:KUBECONFIG".into()),
            },
        }
    }

    /// `file` or `kubernetes`, as the agent's status names the datastore.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::File(_) => "file",
            Source::Kubernetes { .. } => "kubernetes",
        }
    }

    /// Starts watching the source for node `node`; a directory is looked at every
    /// `poll`.
    pub fn open(&self, node: &str, poll: Duration) -> Result<Watch, OpenError> {
        match self {
            Source::File(dir) => {
                FileDatastore::watch(dir, poll).map_err(|r| OpenError::Refused(dir.clone(), r))
            }
            Source::Kubernetes { kubeconfig } => KubeDatastore::watch(KubeOptions {
                node: node.to_string(),
                kubeconfig: kubeconfig.clone(),
            })
            .map_err(OpenError::Kube),
        }
    }
}

impl fmt::Display for Source {
    /// As [`Source::parse`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(dir) => write!(f, "file:{}", dir.display()),
            Source::Kubernetes { kubeconfig: None } => f.write_str("kubernetes"),
            Source::Kubernetes {
                kubeconfig: Some(k),
            } => write!(f, "kubernetes:{}", k.display()),
        }
    }
}

/// Why [`Source::open`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// The directory's state is refused (the file datastore needs a good one to start).
    Refused(PathBuf, Refused),
    /// The Kubernetes client cannot be set up.
    Kube(KubeError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Refused(dir, r) => {
                write!(f, "{}: the cluster state is refused:\n{r}", dir.display())
            }
            OpenError::Kube(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Something wrong with (or left out of) the manifests, naming where: the file, the line
/// of its document, the object and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the datastore's directory (the directory itself when the
    /// problem is with it); `kubernetes` for the Kubernetes datastore.
    pub file: String,
    /// The line the document starts on, when known.
    pub line: Option<u64>,
    /// The object: `Kind namespace/name`, or `document N` (counting from 1) while its
    /// name is unknown.
    pub object: Option<String>,
    /// The field's path in the object (`spec.ports[1].port`), when one is at fault.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    /// `file[:line]: [object: ][field: ]message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(o) = &self.object {
            write!(f, ": {o}")?;
        }
        if let Some(fd) = &self.field {
            write!(f, ": {fd}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a datastore refused the state it read: every problem found, one per line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The problems, in file order (in the order they were seen, for Kubernetes).
    pub problems: Vec<Problem>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// The semantic checks of an object: the fields ferry reads must make sense. Every
/// datastore runs them before an object enters the cluster. The fields of a Service, a
/// Pod, a Namespace and a policy are returned, to be kept with it
/// ([`Cluster::apply_checked`]): claims, tables and policy read them instead of parsing
/// them again.
pub(crate) fn check(obj: &Object) -> Result<Checked, Vec<FieldError>> {
    match obj {
        Object::Node(o) => NodeFields::parse(o).map(|_| Checked::Nothing),
        Object::Pod(o) => PodFields::parse(o).map(|f| Checked::Pod(Arc::new(f))),
        Object::Service(o) => ServiceFields::parse(o).map(|f| Checked::Service(Arc::new(f))),
        Object::EndpointSlice(o) => SliceFields::parse(o).map(|_| Checked::Nothing),
        Object::ConfigMap(o) if is_ferry_config(obj) => {
            FerryConfig::from_config_map(o).map(|_| Checked::Nothing)
        }
        Object::ConfigMap(_) => Ok(Checked::Nothing),
        Object::Namespace(o) => NamespaceFields::parse(o).map(|f| Checked::Namespace(Arc::new(f))),
        Object::NetworkPolicy(o) => {
            NetworkPolicyFields::parse(o).map(|f| Checked::NetworkPolicy(Arc::new(f)))
        }
        Object::ClusterNetworkPolicy(o) => {
            ClusterNetworkPolicyFields::parse(o).map(|f| Checked::ClusterNetworkPolicy(Arc::new(f)))
        }
    }
}

/// What an object that enters the cluster reads in a way to be told, as notes: a
/// ClusterNetworkPolicy's peers with no known field (see
/// [`crate::policy::ClusterPeer::Unrecognized`]).
fn warnings(checked: &Checked) -> Vec<FieldError> {
    match checked {
        Checked::ClusterNetworkPolicy(f) => f.warnings.clone(),
        _ => Vec::new(),
    }
}

/// What is left out of an object that enters the cluster, for a note: the unknown keys
/// of the ferry-config ConfigMap. Every datastore reports them.
/// The warnings of its fields ([`check`]) too.
pub(crate) fn notes(obj: &Object, checked: &Checked) -> Vec<FieldError> {
    let mut n = match obj {
        Object::ConfigMap(o) if is_ferry_config(obj) => FerryConfig::unknown_keys(o),
        _ => Vec::new(),
    };
    n.extend(warnings(checked));
    n
}

/// True for the ConfigMap `kube-system/ferry-config`.
pub(crate) fn is_ferry_config(obj: &Object) -> bool {
    matches!(obj, Object::ConfigMap(_))
        && obj.key() == Some(ObjectKey::new(CONFIG_NAMESPACE, CONFIG_NAME))
}

/// Now as Unix time in milliseconds (0 before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a datastore found when it looked again.
#[derive(Clone, Debug)]
pub enum Update {
    /// The state changed and is good: this state is in force now.
    Applied {
        /// The new state.
        cluster: Arc<Cluster>,
        /// Documents left out.
        notes: Vec<Problem>,
        /// When the datastore read this state (Unix time, ms): every change made
        /// before then is in it. The file datastore's time is that of the directory scan
        /// that found the manifests steady; the Kubernetes datastore's, of the batch of
        /// events it last took in.
        read_unix_ms: u64,
    },
    /// Something is wrong: what it names does not apply, the last good state stays in
    /// force. The file datastore refuses a whole directory this way; the Kubernetes
    /// datastore refuses single objects (keeping their last good version) and reports
    /// watch errors.
    Refused(Refused),
}

/// A watched datastore: updates as they happen, and the state in force.
#[derive(Debug)]
pub struct Watch {
    updates: Receiver<Update>,
    current: Arc<Mutex<Arc<Cluster>>>,
    /// Dropping it tells the thread to stop (it is the sending half of a channel the
    /// thread waits on).
    stop: Option<Box<dyn Any + Send>>,
    thread: Option<JoinHandle<()>>,
    /// Where the state comes from, as the datastore knows it (the Kubernetes
    /// datastore's API server URL).
    pub(crate) source: Option<String>,
    /// Where this node's annotations to write go (the Kubernetes datastore's writer);
    /// None: the datastore is not written.
    pub(crate) annotate: Option<futures::channel::mpsc::UnboundedSender<Annotations>>,
}

/// Annotations of this node's Node object for the datastore to write, by key.
pub type Annotations = std::collections::BTreeMap<String, String>;

impl Watch {
    /// A watch on the thread `thread`, which sends on the other end of `updates`, keeps
    /// `current` at the state in force, and stops when `stop` is dropped.
    pub(crate) fn new(
        updates: Receiver<Update>,
        current: Arc<Mutex<Arc<Cluster>>>,
        stop: impl Any + Send,
        thread: JoinHandle<()>,
    ) -> Watch {
        Watch {
            updates,
            current,
            stop: Some(Box::new(stop)),
            thread: Some(thread),
            source: None,
            annotate: None,
        }
    }

    /// Has the datastore write `annotations` on this node's Node object (a merge patch:
    /// other annotations stay), trying again every few seconds until it succeeds, a
    /// newer call replacing what is not written yet. False when the datastore is not
    /// written (the file datastore: the manifests are the user's).
    pub fn annotate_node(&self, annotations: Annotations) -> bool {
        self.annotate
            .as_ref()
            .is_some_and(|tx| tx.unbounded_send(annotations).is_ok())
    }

    /// Where the state comes from when the datastore knows more than it was given: the
    /// Kubernetes datastore's API server URL.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// The state in force: the last good one.
    pub fn current(&self) -> Arc<Cluster> {
        Arc::clone(&self.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The updates, in order.
    pub fn updates(&self) -> &Receiver<Update> {
        &self.updates
    }

    /// The next update, waiting at most `timeout`.
    pub fn next_update(&self, timeout: Duration) -> Option<Update> {
        self.updates.recv_timeout(timeout).ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
