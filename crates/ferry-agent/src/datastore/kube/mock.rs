//! A small Kubernetes API server for tests: list and watch requests of the resources
//! the datastore watches, answered from JSON objects by a `tower` service that a
//! `kube::Client` uses in place of HTTP. Enough of the real protocol for the real
//! watcher: lists carry a resourceVersion; a watch replays the events after the version
//! it asks for and then streams new ones, one JSON object per line; a watch from a
//! version older than the last expiry gets 410 Gone.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::stream::{self, BoxStream, StreamExt};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::{Value, json};
use tower::BoxError;

/// The body of every answer: a list is a stream of one chunk.
pub type Body = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// The kind and apiVersion of a resource's objects.
fn type_of(resource: &str) -> (&'static str, &'static str) {
    match resource {
        "nodes" => ("Node", "v1"),
        "pods" => ("Pod", "v1"),
        "services" => ("Service", "v1"),
        "endpointslices" => ("EndpointSlice", "discovery.k8s.io/v1"),
        "configmaps" => ("ConfigMap", "v1"),
        "namespaces" => ("Namespace", "v1"),
        "networkpolicies" => ("NetworkPolicy", "networking.k8s.io/v1"),
        "clusternetworkpolicies" => ("ClusterNetworkPolicy", "policy.networking.k8s.io/v1alpha2"),
        other => panic!("the mock API serves no {other}"),
    }
}

/// Which objects a request selects.
#[derive(Clone, Debug)]
struct Filter {
    namespace: Option<String>,
    /// A field selector `path=value`.
    field: Option<(String, String)>,
}

impl Filter {
    fn selects(&self, obj: &Value) -> bool {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        if self.namespace.is_some() && ns != self.namespace.as_deref() {
            return false;
        }
        match &self.field {
            None => true,
            Some((path, value)) => {
                let pointer = format!("/{}", path.replace('.', "/"));
                obj.pointer(&pointer).and_then(Value::as_str) == Some(value)
            }
        }
    }
}

struct OpenWatch {
    resource: String,
    filter: Filter,
    tx: UnboundedSender<Bytes>,
}

#[derive(Default)]
struct State {
    /// The last resourceVersion given out.
    version: u64,
    /// Watches from a version before this one are too old.
    compacted: u64,
    /// Objects by resource, then namespace and name; stored without kind and apiVersion
    /// (list items have none).
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    /// Watch events by resource since the last expiry: version, type, object.
    events: BTreeMap<String, Vec<(u64, &'static str, Value)>>,
    watches: Vec<OpenWatch>,
    /// Requests seen, as `path?query`.
    requests: Vec<String>,
    /// Requests of a resource still to fail, as if the server were unreachable.
    failures: BTreeMap<String, usize>,
    /// Resources the server does not serve (404), as a CRD not installed.
    absent: std::collections::BTreeSet<String>,
}

/// The mock server; clones share it.
#[derive(Clone, Default)]
pub struct MockApi {
    state: Arc<Mutex<State>>,
}

fn key_of(obj: &Value) -> (String, String) {
    let text = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (text("/metadata/namespace"), text("/metadata/name"))
}

/// One line of a watch stream.
fn event_line(resource: &str, type_: &str, obj: &Value) -> Bytes {
    let (kind, api_version) = type_of(resource);
    let mut obj = obj.clone();
    let m = obj.as_object_mut().expect("an object");
    m.insert("kind".into(), kind.into());
    m.insert("apiVersion".into(), api_version.into());
    let mut line = serde_json::to_vec(&json!({"type": type_, "object": obj})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

fn gone_line() -> Bytes {
    let status = json!({
        "type": "ERROR",
        "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410
        }
    });
    let mut line = serde_json::to_vec(&status).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

fn body_of(chunks: BoxStream<'static, Bytes>) -> Body {
    StreamBody::new(chunks.map(|b| Ok(Frame::data(b))).boxed())
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

impl MockApi {
    /// An empty server; versions start above those of the test data.
    pub fn new() -> MockApi {
        let api = MockApi::default();
        api.lock().version = 100_000;
        api
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the items of a list (as a list request returns them) to `resource`, as they
    /// are, without events.
    pub fn load(&self, resource: &str, list: &str) {
        let list: Value = serde_json::from_str(list).unwrap();
        let mut s = self.lock();
        let objects = s.objects.entry(resource.into()).or_default();
        for item in list["items"].as_array().unwrap() {
            objects.insert(key_of(item), item.clone());
        }
    }

    /// Creates or replaces an object, with a new resourceVersion, and tells the watches.
    pub fn put(&self, resource: &str, obj: Value) {
        self.put_all([(resource, obj)]);
    }

    /// Puts several objects at once: their events leave together, as in a burst.
    pub fn put_all<'a>(&self, objects: impl IntoIterator<Item = (&'a str, Value)>) {
        let mut s = self.lock();
        for (resource, obj) in objects {
            s.put(resource, obj);
        }
    }

    /// Deletes an object and tells the watches.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) {
        let mut s = self.lock();
        let key = (namespace.to_string(), name.to_string());
        let mut obj = s.objects.get_mut(resource).unwrap().remove(&key).unwrap();
        s.version += 1;
        let version = s.version;
        obj["metadata"]["resourceVersion"] = version.to_string().into();
        s.tell(resource, version, "DELETED", obj);
    }

    /// Deletes an object without an event, as if its event had been lost.
    pub fn delete_quietly(&self, resource: &str, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.lock().objects.get_mut(resource).unwrap().remove(&key);
    }

    /// Ends the open watches of `resource` with 410 Gone and forgets past events, so
    /// that the watcher has to list again.
    pub fn expire(&self, resource: &str) {
        let mut s = self.lock();
        s.compacted = s.version + 1;
        s.events.clear();
        s.watches.retain(|w| {
            if w.resource == resource {
                let _ = w.tx.unbounded_send(gone_line());
                false
            } else {
                true
            }
        });
    }

    /// Ends the open watches of `resource`, as a server closing its connections does.
    pub fn close(&self, resource: &str) {
        self.lock().watches.retain(|w| w.resource != resource);
    }

    /// Makes `resource` answer 404 (`true`), as a CRD not installed does, or be served
    /// again (`false`).
    pub fn set_absent(&self, resource: &str, absent: bool) {
        let mut s = self.lock();
        if absent {
            s.absent.insert(resource.into());
        } else {
            s.absent.remove(resource);
        }
    }

    /// Makes the next `n` requests of `resource` fail as if the server were down.
    pub fn fail(&self, resource: &str, n: usize) {
        self.lock().failures.insert(resource.into(), n);
    }

    /// The requests seen, as `path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// The service a `kube::Client` sends its requests to.
    pub fn service(
        &self,
    ) -> impl tower::Service<
        Request<::kube::client::Body>,
        Response = Response<Body>,
        Error = BoxError,
        Future = impl Send + 'static,
    > + Send
    + 'static {
        let api = self.clone();
        tower::service_fn(move |req: Request<::kube::client::Body>| {
            let api = api.clone();
            async move {
                if req.method() != http::Method::PATCH {
                    return api.answer(&req);
                }
                use http_body_util::BodyExt;
                let (parts, body) = req.into_parts();
                let body = body.collect().await?.to_bytes();
                api.patch(&parts, &body)
            }
        })
    }

    /// A JSON merge patch (RFC 7386) of a Node, the one write the agent makes: the
    /// patched object is stored with a new version (the watches are told) and sent back.
    fn patch(&self, req: &http::request::Parts, body: &[u8]) -> Result<Response<Body>, BoxError> {
        let path = req.uri.path();
        let mut s = self.lock();
        s.requests.push(format!("PATCH {path}"));
        if let Some(n) = s.failures.get_mut("nodes").filter(|n| **n > 0) {
            *n -= 1;
            return Err("connection refused (mock)".into());
        }
        let name = path
            .strip_prefix("/api/v1/nodes/")
            .unwrap_or_else(|| panic!("the mock patches only Nodes: {path}"));
        let content_type = req.headers.get(http::header::CONTENT_TYPE);
        assert_eq!(
            content_type.and_then(|c| c.to_str().ok()),
            Some("application/merge-patch+json")
        );
        let key = (String::new(), name.to_string());
        let mut obj = s
            .objects
            .get("nodes")
            .and_then(|o| o.get(&key))
            .cloned()
            .expect("a Node to patch");
        merge(&mut obj, &serde_json::from_slice(body)?);
        s.put("nodes", obj.clone());
        let obj = &s.objects["nodes"][&key];
        let mut typed = obj.clone();
        typed["kind"] = "Node".into();
        typed["apiVersion"] = "v1".into();
        Ok(Response::new(body_of(
            stream::iter([Bytes::from(serde_json::to_vec(&typed).unwrap())]).boxed(),
        )))
    }

    fn answer<B>(&self, req: &Request<B>) -> Result<Response<Body>, BoxError> {
        let uri = req.uri();
        let mut s = self.lock();
        s.requests.push(format!(
            "{}?{}",
            uri.path(),
            uri.query().unwrap_or_default()
        ));
        // /api/v1/[namespaces/NS/]RESOURCE or /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE
        let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
        let rest = match parts.first() {
            Some(&"api") => &parts[2..],
            Some(&"apis") => &parts[3..],
            _ => panic!("unexpected request {uri}"),
        };
        let (namespace, resource) = match rest {
            ["namespaces", ns, resource] => (Some(ns.to_string()), resource.to_string()),
            [resource] => (None, resource.to_string()),
            _ => panic!("unexpected request {uri}"),
        };
        if s.absent.contains(&resource) {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "the server could not find the requested resource",
                "reason": "NotFound", "code": 404
            });
            let body = stream::iter([Bytes::from(serde_json::to_vec(&status).unwrap())]).boxed();
            let mut r = Response::new(body_of(body));
            *r.status_mut() = http::StatusCode::NOT_FOUND;
            return Ok(r);
        }
        if let Some(n) = s.failures.get_mut(&resource).filter(|n| **n > 0) {
            *n -= 1;
            return Err("connection refused (mock)".into());
        }
        let query: BTreeMap<String, String> = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        let filter = Filter {
            namespace,
            field: query.get("fieldSelector").map(|f| {
                let (p, v) = f.split_once('=').expect("path=value");
                (p.to_string(), v.to_string())
            }),
        };
        let body = if query.get("watch").map(String::as_str) == Some("true") {
            let from: u64 = query["resourceVersion"].parse().unwrap();
            let (tx, rx) = unbounded();
            if from < s.compacted {
                tx.unbounded_send(gone_line()).unwrap();
            } else {
                for (v, type_, obj) in s.events.get(&resource).into_iter().flatten() {
                    if *v > from && filter.selects(obj) {
                        tx.unbounded_send(event_line(&resource, type_, obj))
                            .unwrap();
                    }
                }
                s.watches.push(OpenWatch {
                    resource,
                    filter,
                    tx,
                });
            }
            body_of(rx.boxed())
        } else {
            let (kind, api_version) = type_of(&resource);
            let items: Vec<&Value> = s
                .objects
                .get(&resource)
                .into_iter()
                .flat_map(|o| o.values())
                .filter(|o| filter.selects(o))
                .collect();
            let list = json!({
                "kind": format!("{kind}List"),
                "apiVersion": api_version,
                "metadata": {"resourceVersion": s.version.to_string()},
                "items": items,
            });
            body_of(stream::iter([Bytes::from(serde_json::to_vec(&list).unwrap())]).boxed())
        };
        Ok(Response::new(body))
    }
}

/// RFC 7386: `patch` merged into `target` (null removes a member).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl State {
    fn put(&mut self, resource: &str, mut obj: Value) {
        self.version += 1;
        let version = self.version;
        let m = obj.as_object_mut().expect("an object");
        m.remove("kind");
        m.remove("apiVersion");
        obj["metadata"]["resourceVersion"] = version.to_string().into();
        let objects = self.objects.entry(resource.into()).or_default();
        let type_ = match objects.insert(key_of(&obj), obj.clone()) {
            None => "ADDED",
            Some(_) => "MODIFIED",
        };
        self.tell(resource, version, type_, obj);
    }

    fn tell(&mut self, resource: &str, version: u64, type_: &'static str, obj: Value) {
        for w in &self.watches {
            if w.resource == resource && w.filter.selects(&obj) {
                let _ = w.tx.unbounded_send(event_line(resource, type_, &obj));
            }
        }
        self.events
            .entry(resource.into())
            .or_default()
            .push((version, type_, obj));
    }
}
