//! The file datastore (`file:DIR`): a directory of Kubernetes manifests.
//!
//! Every `*.yaml` / `*.yml` file directly in the directory (not in subdirectories; names
//! starting with `.` are skipped, like editors' swap files and the `..data` of a mounted
//! ConfigMap) holds one or more documents separated by `---`; a document is an object or
//! a `kind: List` of them, as `kubectl get -o yaml` prints. Each document's `apiVersion`
//! and `kind` decide what it is: v1 Node, Namespace, Pod, Service and ConfigMap,
//! discovery.k8s.io/v1 EndpointSlice, networking.k8s.io/v1 NetworkPolicy and
//! policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy are read, anything else is
//! left out with a note.
//!
//! A state is all or nothing: one problem anywhere (YAML syntax, a field of the wrong
//! type, an unknown field, a bad address, port, selector or CIDR, the same object in two places, two
//! objects claiming one address or port: a cluster IP, a node port, a Node's
//! InternalIP; see [`super::claims`]) refuses it whole, with every problem named by
//! file, object and field; the watcher keeps the last good state in force. A Service
//! frontend two Services claim (an external IP on another's cluster IP and port) is
//! not refused: as in the Kubernetes datastore, one of them wins it, the same whatever
//! the order of the files, and the other leaves it out, with a note.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::claims::{self, Claims};
use super::{Problem, Refused, check, notes};
use crate::cluster::{Checked, Cluster, DEFAULT_NAMESPACE, Kind, Object, ObjectKey};
use crate::fields::FieldError;

// Shared with the Kubernetes datastore; re-exported where they were first defined.
pub use super::{Update, Watch};

/// Where an object was read.
#[derive(Clone, Debug)]
struct Origin {
    file: String,
    line: Option<u64>,
}

impl Origin {
    fn problem(&self, object: Option<String>, field: Option<String>, message: String) -> Problem {
        Problem {
            file: self.file.clone(),
            line: self.line,
            object,
            field,
            message,
        }
    }
}

/// What reading the files gathers.
#[derive(Default)]
struct Loader {
    /// The objects that passed their checks, each with the fields kept with it
    /// ([`check`]).
    objects: Vec<(Object, Checked, Origin)>,
    problems: Vec<Problem>,
    notes: Vec<Problem>,
}

/// Reads the manifests of `dir` into a cluster. `Ok` carries notes about documents left
/// out (kinds ferry does not read); `Err` every problem found, when there is any.
pub fn load(dir: &Path) -> Result<(Cluster, Vec<Problem>), Refused> {
    let refuse = |message: String| Refused {
        problems: vec![Problem {
            file: dir.display().to_string(),
            line: None,
            object: None,
            field: None,
            message,
        }],
    };
    let files = manifest_files(dir).map_err(refuse)?;
    let mut l = Loader::default();
    for (name, path) in files {
        match fs::read_to_string(&path) {
            Ok(text) => l.file(&name, &text),
            Err(e) => l.problems.push(Problem {
                file: name,
                line: None,
                object: None,
                field: None,
                message: format!("cannot read: {e}"),
            }),
        }
    }
    l.finish()
}

/// Reads the manifests in `text` as if they were the file `file_name` of a directory
/// (the name is only used in problems).
pub fn parse(file_name: &str, text: &str) -> Result<(Cluster, Vec<Problem>), Refused> {
    let mut l = Loader::default();
    l.file(file_name, text);
    l.finish()
}

fn is_manifest(name: &str) -> bool {
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

/// The manifest files of `dir` (following symbolic links), by name.
fn manifest_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries =
        fs::read_dir(dir).map_err(|e| format!("cannot read the manifest directory: {e}"))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read the manifest directory: {e}"))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let path = entry.path();
        if is_manifest(&name) && path.is_file() {
            files.push((name, path));
        }
    }
    files.sort();
    Ok(files)
}

impl Loader {
    fn file(&mut self, name: &str, text: &str) {
        let docs: Vec<serde_saphyr::Spanned<Value>> = match serde_saphyr::from_multiple(text) {
            Ok(d) => d,
            Err(e) => {
                // The first line says what and where; the rest is a source snippet.
                let msg = e.to_string();
                let first = msg.lines().next().unwrap_or_default();
                self.problems.push(Problem {
                    file: name.to_string(),
                    line: None,
                    object: None,
                    field: None,
                    message: format!(
                        "not valid YAML: {}",
                        first.strip_prefix("error: ").unwrap_or(first)
                    ),
                });
                return;
            }
        };
        for (i, doc) in docs.into_iter().enumerate() {
            let origin = Origin {
                file: name.to_string(),
                line: Some(doc.referenced.line()).filter(|l| *l > 0),
            };
            self.document(&origin, format!("document {}", i + 1), doc.value);
        }
    }

    /// One document (or one item of a List), called `label` until its name is known.
    fn document(&mut self, origin: &Origin, label: String, mut value: Value) {
        let Some(map) = value.as_object() else {
            self.problems.push(origin.problem(
                Some(label),
                None,
                "expected a Kubernetes object (a mapping with apiVersion and kind)".into(),
            ));
            return;
        };
        let text = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
            let missing = if text("apiVersion").is_none() {
                "apiVersion"
            } else {
                "kind"
            };
            self.problems.push(origin.problem(
                Some(label),
                Some(missing.into()),
                "required (a string)".into(),
            ));
            return;
        };
        if api_version == "v1" && kind == "List" {
            let items = match value.get_mut("items").map(Value::take) {
                Some(Value::Array(items)) => items,
                None | Some(Value::Null) => Vec::new(),
                Some(_) => {
                    self.problems.push(origin.problem(
                        Some(label),
                        Some("items".into()),
                        "expected a list of objects".into(),
                    ));
                    return;
                }
            };
            for (j, item) in items.into_iter().enumerate() {
                self.document(origin, format!("{label} items[{j}]"), item);
            }
            return;
        }
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        let namespace = value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(DEFAULT_NAMESPACE)
            .to_string();
        let Some(kind) = Kind::from_type(&api_version, &kind) else {
            let what = match &name {
                Some(n) => format!("{api_version} {kind} {n}"),
                None => format!("{label} ({api_version} {kind})"),
            };
            self.notes.push(origin.problem(
                Some(what),
                None,
                "ignored: ferry reads v1 Node, Namespace, Pod, Service and ConfigMap, discovery.k8s.io/v1 EndpointSlice, networking.k8s.io/v1 NetworkPolicy and policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy"
                    .into(),
            ));
            return;
        };
        let what = match &name {
            Some(n) if kind.namespaced() => format!("{kind} {namespace}/{n}"),
            Some(n) => format!("{kind} {n}"),
            None => format!("{label} ({kind})"),
        };
        quantities_as_strings(&mut value);
        let decoded = match kind {
            Kind::Node => decode(&value).map(Object::Node),
            Kind::Pod => decode(&value).map(Object::Pod),
            Kind::Service => decode(&value).map(Object::Service),
            Kind::EndpointSlice => decode(&value).map(Object::EndpointSlice),
            Kind::ConfigMap => decode(&value).map(Object::ConfigMap),
            Kind::Namespace => decode(&value).map(Object::Namespace),
            Kind::NetworkPolicy => decode(&value).map(Object::NetworkPolicy),
            Kind::ClusterNetworkPolicy => decode(&value).map(Object::ClusterNetworkPolicy),
        };
        let errors = match decoded {
            Ok(_) if name.is_none() => vec![FieldError::new("metadata.name", "required")],
            Ok(obj) => match check(&obj) {
                Ok(fields) => {
                    for n in notes(&obj, &fields) {
                        self.notes.push(origin.problem(
                            Some(what.clone()),
                            Some(n.field),
                            n.message,
                        ));
                    }
                    self.objects.push((obj, fields, origin.clone()));
                    Vec::new()
                }
                Err(errors) => errors,
            },
            Err(errors) => errors,
        };
        for e in errors {
            self.problems.push(origin.problem(
                Some(what.clone()),
                Some(e.field).filter(|f| !f.is_empty()),
                e.message,
            ));
        }
    }

    fn finish(mut self) -> Result<(Cluster, Vec<Problem>), Refused> {
        let cluster = self.assemble();
        if self.problems.is_empty() {
            Ok((cluster, self.notes))
        } else {
            Err(Refused {
                problems: self.problems,
            })
        }
    }

    /// Builds the cluster from the objects read, refusing duplicates and clashes
    /// between objects.
    fn assemble(&mut self) -> Cluster {
        let mut cluster = Cluster::default();
        let mut origins: HashMap<(Kind, ObjectKey), Origin> = HashMap::new();
        let mut claiming = Vec::new();
        for (obj, fields, origin) in std::mem::take(&mut self.objects) {
            let key = obj.key().expect("named: checked when read");
            let what = format!("{} {key}", obj.kind());
            if let Some(first) = origins.get(&(obj.kind(), key.clone())) {
                self.problems.push(origin.problem(
                    Some(what),
                    None,
                    format!("defined twice: also in {}", place(first)),
                ));
                continue;
            }
            if matches!(obj.kind(), Kind::Service | Kind::Node) {
                claiming.push((obj.kind(), key.clone()));
            }
            origins.insert((obj.kind(), key), origin);
            cluster
                .apply_checked(obj, fields)
                .expect("named: checked when read");
        }
        self.clashes(&mut cluster, &origins, claiming);
        cluster
    }

    /// Two objects must not claim one cluster IP, node port or node address
    /// ([`claims`]): one of them would silently lose its traffic, or the tables would
    /// not compile. `claiming` lists the Services and Nodes in the order they were read:
    /// of two that clash, the one read later is named. A frontend two Services claim
    /// goes to one of them, as in the Kubernetes datastore, whatever the order: the
    /// other leaves it out, with a note.
    fn clashes(
        &mut self,
        cluster: &mut Cluster,
        origins: &HashMap<(Kind, ObjectKey), Origin>,
        claiming: Vec<(Kind, ObjectKey)>,
    ) {
        let mut held = Claims::default();
        let mut services = Vec::new();
        for (kind, key) in claiming {
            let mine = match kind {
                Kind::Service => match cluster.service_fields(&key) {
                    Some(Ok(f)) => claims::of_service(&cluster.services[&key], f),
                    // Refused when read: not in the cluster.
                    _ => Vec::new(),
                },
                _ => claims::of_node(&cluster.nodes[&key]),
            };
            let owner = (kind, key.clone());
            let clashes = held.clashes(&owner, &mine);
            if clashes.is_empty() {
                if kind == Kind::Service {
                    services.push(owner.clone());
                }
                held.set(owner, mine);
                continue;
            }
            let origin = &origins[&owner];
            for c in clashes {
                self.problems.push(origin.problem(
                    Some(format!("{kind} {key}")),
                    Some(c.field),
                    c.message,
                ));
            }
        }
        for owner in services {
            let left_out = held.left_out(&owner);
            let origin = &origins[&owner];
            let (kind, key) = &owner;
            for l in &left_out {
                self.notes.push(origin.problem(
                    Some(format!("{kind} {key}")),
                    Some(l.field.clone()),
                    l.message.clone(),
                ));
            }
            cluster.set_left_out(key, left_out.into_iter().map(|l| l.frontend).collect());
        }
    }
}

fn place(o: &Origin) -> String {
    match o.line {
        Some(l) => format!("{}:{l}", o.file),
        None => o.file.clone(),
    }
}

/// Decodes an API object, naming the field at fault. Fields the API type does not have
/// are errors too: a misspelt field must not be silently dropped (as `kubectl apply`
/// refuses unknown fields).
fn decode<T: DeserializeOwned + Serialize>(value: &Value) -> Result<T, Vec<FieldError>> {
    let obj: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        vec![FieldError::new(field, e.into_inner().to_string())]
    })?;
    // What the type keeps, written back out, shows what it dropped.
    let back = serde_json::to_value(&obj)
        .map_err(|e| vec![FieldError::new("", format!("cannot re-encode: {e}"))])?;
    let mut unknown = Vec::new();
    dropped_fields(value, &back, String::new(), &mut unknown);
    if unknown.is_empty() {
        Ok(obj)
    } else {
        Err(unknown
            .into_iter()
            .map(|f| FieldError::new(f, "unknown field"))
            .collect())
    }
}

/// The paths of fields in `given` that `kept` lacks (nulls in `given` say nothing): what
/// a typed decoding of `given` silently left out, once `kept` is the decoded value
/// serialized again.
pub fn dropped_fields(given: &Value, kept: &Value, path: String, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, v) in g {
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    _ if v.is_null() => {}
                    None => out.push(p),
                    Some(kv) => dropped_fields(v, kv, p, out),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                dropped_fields(gv, kv, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Maps of resource quantities (`cpu: 1`, `memory: 1Gi`): kubectl takes a bare number
/// there, the API type wants a string.
const QUANTITY_MAPS: [&str; 6] = [
    "limits",
    "requests",
    "capacity",
    "allocatable",
    "overhead",
    "allocatedResources",
];

/// Writes numbers where the API has resource quantities as strings, so that a
/// manifest kubectl accepts is accepted here too.
fn quantities_as_strings(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if QUANTITY_MAPS.contains(&k.as_str())
                    && let Value::Object(q) = v
                {
                    for n in q.values_mut() {
                        if let Value::Number(num) = n {
                            *n = Value::String(num.to_string());
                        }
                    }
                } else if k == "sizeLimit"
                    && let Value::Number(num) = v
                {
                    *v = Value::String(num.to_string());
                } else {
                    quantities_as_strings(v);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

/// The state of the directory as `stat` sees it: manifest names, sizes and
/// modification times (or why it cannot be read).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint(Result<Vec<(String, u64, Option<SystemTime>)>, String>);

impl Fingerprint {
    fn of(dir: &Path) -> Fingerprint {
        Fingerprint(manifest_files(dir).map(|files| {
            files
                .into_iter()
                .map(|(name, path)| {
                    let m = fs::metadata(&path).ok();
                    (
                        name,
                        m.as_ref().map_or(0, |m| m.len()),
                        m.and_then(|m| m.modified().ok()),
                    )
                })
                .collect()
        }))
    }
}

/// The file datastore: the last good state of a manifest directory, and [`poll`] to
/// look for changes.
///
/// [`poll`]: FileDatastore::poll
#[derive(Debug)]
pub struct FileDatastore {
    dir: PathBuf,
    current: Arc<Cluster>,
    /// What the directory looked like at the last poll.
    seen: Fingerprint,
    /// What it looked like when it was last read (applied or refused).
    read: Fingerprint,
    /// The last read was refused.
    refused: bool,
}

impl FileDatastore {
    /// Reads `dir`; its state must be good to start from. Returns the notes too.
    pub fn open(dir: impl Into<PathBuf>) -> Result<(FileDatastore, Vec<Problem>), Refused> {
        let dir = dir.into();
        let fp = Fingerprint::of(&dir);
        let (cluster, notes) = load(&dir)?;
        Ok((
            FileDatastore {
                dir,
                current: Arc::new(cluster),
                seen: fp.clone(),
                read: fp,
                refused: false,
            },
            notes,
        ))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state in force: the last good one.
    pub fn current(&self) -> Arc<Cluster> {
        Arc::clone(&self.current)
    }

    /// Looks at the directory once. A change is read when the directory looked the same
    /// at the previous poll too, so that a file being written is not read half-way;
    /// a state equal to the one in force is not reported again (unless the previous
    /// read was refused: then it is news that the state in force is good again).
    pub fn poll(&mut self) -> Option<Update> {
        // A write that ends before this scan begins is in what it reads: a write during
        // the previous scan or between the two makes them differ, and nothing is read.
        let scanned = super::unix_ms();
        let fp = Fingerprint::of(&self.dir);
        if fp != self.seen {
            self.seen = fp;
            return None;
        }
        if fp == self.read {
            return None;
        }
        self.read = fp;
        match load(&self.dir) {
            Ok((mut cluster, notes)) => {
                // What did not change stays one object in both states: the compare
                // below and the agent's diff then look only at what did.
                cluster.share_with(&self.current);
                if !self.refused && *self.current == cluster {
                    return None;
                }
                self.refused = false;
                self.current = Arc::new(cluster);
                Some(Update::Applied {
                    cluster: self.current(),
                    notes,
                    read_unix_ms: scanned,
                })
            }
            Err(r) => {
                self.refused = true;
                Some(Update::Refused(r))
            }
        }
    }

    /// Reads `dir` and then polls it every `interval` on a thread of its own, until the
    /// returned [`Watch`] is dropped. The first update is the initial state.
    pub fn watch(dir: impl Into<PathBuf>, interval: Duration) -> Result<Watch, Refused> {
        let read_unix_ms = super::unix_ms();
        let (mut ds, notes) = FileDatastore::open(dir)?;
        let current = Arc::new(Mutex::new(ds.current()));
        let (tx, updates) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        tx.send(Update::Applied {
            cluster: ds.current(),
            notes,
            read_unix_ms,
        })
        .expect("the receiver is still here");
        let shared = Arc::clone(&current);
        let thread = thread::Builder::new()
            .name("file-datastore".into())
            .spawn(move || {
                // Dropping the Watch drops `stop`, which ends the wait at once.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    let Some(u) = ds.poll() else { continue };
                    if let Update::Applied { cluster, .. } = &u {
                        *shared.lock().unwrap_or_else(PoisonError::into_inner) =
                            Arc::clone(cluster);
                    }
                    if tx.send(u).is_err() {
                        return;
                    }
                }
            })
            .expect("spawn the file datastore thread");
        Ok(Watch::new(updates, current, stop, thread))
    }
}

#[cfg(test)]
mod tests;
