"""A fake Kubernetes API server for ferry's end-to-end tests (python3 stdlib only).

Plain HTTP/1.1. Serves what ferry's Kubernetes datastore asks of the five resources it
watches (Nodes, Pods, Services, EndpointSlices, ConfigMaps), the way kube-apiserver
answers the `kube` crate's watcher:

- lists (`GET /api/v1/pods?fieldSelector=...&limit=500`): a `PodList` with
  `metadata.resourceVersion`, items without kind and apiVersion (as the real server sends
  them), paged by `limit` and `continue` from a snapshot;
- watches (`?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=290`):
  a chunked response of JSON lines `{"type": ..., "object": ...}` that stays open: the
  events after version N, then new ones as they come. A version older than the objects
  loaded at start gets an `ERROR` event with a 410 Gone Status (the real server has
  compacted them away); version "0" or none starts with synthetic ADDED events of what
  is there; `sendInitialEvents=true` does that and ends the initial events with a
  BOOKMARK annotated `k8s.io/initial-events-end`, as a streaming list does. Watches that
  allow bookmarks get one every `--bookmark-interval` seconds, and the stream ends after
  `timeoutSeconds`;
- field selectors (`a.b=v`, `==`, `!=`, comma-separated) on the fields the real server
  supports for these kinds; any other field is refused with 400, as the real server
  refuses it, so a misspelled selector fails loudly.

The objects live in memory: `--objects FILE` (a JSON array of objects with kind and
apiVersion) at start, then `POST /_push` with `{"type": "ADDED|MODIFIED|DELETED",
"object": {...}}` or an array of those (`type` may be left out: ADDED or MODIFIED as the
object is new or not). Pushed objects get a new resourceVersion and, when new, a uid and
creationTimestamp; they are not validated, so a test can push what a real server would
refuse. `PATCH /api/v1/nodes/NAME` with a JSON merge patch changes a Node as the
real server does (the agent writes its annotations so). Every request is appended to
`--log FILE` as a JSON line: client address, method, path, and the decoded query.
"""

import argparse
import copy
import datetime
import json
import queue
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# URL prefix and resource -> kind, apiVersion, namespaced.
RESOURCES = {
    ("/api/v1", "nodes"): ("Node", "v1", False),
    ("/api/v1", "pods"): ("Pod", "v1", True),
    ("/api/v1", "services"): ("Service", "v1", True),
    ("/api/v1", "configmaps"): ("ConfigMap", "v1", True),
    ("/api/v1", "namespaces"): ("Namespace", "v1", False),
    ("/apis/networking.k8s.io/v1", "networkpolicies"): (
        "NetworkPolicy",
        "networking.k8s.io/v1",
        True,
    ),
    ("/apis/discovery.k8s.io/v1", "endpointslices"): (
        "EndpointSlice",
        "discovery.k8s.io/v1",
        True,
    ),
}
API_VERSION_OF = {kind: api for (kind, api, _) in RESOURCES.values()}

# Field selectors the real server accepts, by kind (a subset of what it supports).
FIELDS = {
    "Node": {"spec.unschedulable"},
    "Pod": {"spec.nodeName", "status.phase", "status.podIP"},
    "Service": {"spec.clusterIP", "spec.type"},
    "EndpointSlice": {"addressType"},
    "ConfigMap": set(),
    "Namespace": set(),
    "NetworkPolicy": set(),
}
COMMON_FIELDS = {"metadata.name", "metadata.namespace"}


def field(obj, path):
    """The value at a dotted path, as the string a field selector compares to."""
    v = obj
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_selector(kind, text):
    """[(path, op, value)] or raises ValueError naming the bad term."""
    terms = []
    for term in filter(None, text.split(",")):
        for op in ("!=", "==", "="):
            if op in term:
                path, value = term.split(op, 1)
                break
        else:
            raise ValueError(f"invalid field selector term {term!r}")
        if path not in COMMON_FIELDS | FIELDS[kind]:
            raise ValueError(f"field label not supported: {path}")
        terms.append((path, op, value))
    return terms


class Filter:
    def __init__(self, kind, namespace, selector):
        self.kind, self.namespace, self.selector = kind, namespace, selector

    def selects(self, obj):
        if obj.get("kind") != self.kind:
            return False
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return False
        for path, op, value in self.selector:
            if (field(obj, path) == value) != (op != "!="):
                return False
        return True


def list_item(obj):
    """An object as a list carries it: without kind and apiVersion."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def status(code, reason, message):
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class Store:
    def __init__(self, bookmark_interval):
        self.lock = threading.Lock()
        self.version = 1000
        # Watches from a version before this one get 410 Gone.
        self.oldest = self.version
        self.objects = {}  # (kind, namespace, name) -> object
        self.history = []  # (version, type, object)
        self.watches = []  # (Filter, Queue, bookmarks)
        self.continues = {}  # token -> (version, remaining items)
        self.bookmark_interval = bookmark_interval

    def now(self):
        return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def put_locked(self, type_, obj):
        """Stores one event; returns its version. The caller holds the lock."""
        kind = obj.get("kind")
        if kind not in API_VERSION_OF:
            raise ValueError(f"this server serves no kind {kind!r}")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        obj["apiVersion"] = API_VERSION_OF[kind]
        key = (kind, meta.get("namespace", ""), meta["name"])
        old = self.objects.get(key)
        if type_ is None:
            type_ = "MODIFIED" if old else "ADDED"
        if type_ == "DELETED":
            if old is None:
                raise ValueError(f"no {kind} {key[1]}/{key[2]} to delete")
            del self.objects[key]
            # A copy: the stored object stays as its earlier events sent it.
            obj = copy.deepcopy(old)
        elif type_ not in ("ADDED", "MODIFIED"):
            raise ValueError(f"unknown event type {type_!r}")
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if type_ != "DELETED":
            meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp",
                (old or {}).get("metadata", {}).get("creationTimestamp") or self.now(),
            )
            self.objects[key] = obj
        self.history.append((self.version, type_, obj))
        line = {"type": type_, "object": obj}
        for f, q, _ in self.watches:
            if f.selects(obj):
                q.put(line)
        return self.version

    def load(self, objects):
        with self.lock:
            for obj in objects:
                self.put_locked("ADDED", obj)
            self.history.clear()
            self.oldest = self.version

    def bookmarks(self):
        """Sends a bookmark with the current version to every watch that allows them;
        through the watch's queue, so it never overtakes an event it covers."""
        while True:
            time.sleep(self.bookmark_interval)
            with self.lock:
                for f, q, allowed in self.watches:
                    if allowed:
                        q.put(self.bookmark_locked(f.kind, {}))

    def bookmark_locked(self, kind, annotations):
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": kind,
                "apiVersion": API_VERSION_OF[kind],
                "metadata": {"resourceVersion": str(self.version), "annotations": annotations},
            },
        }


def merge(target, patch):
    """RFC 7386: `patch` merged into `target` (None removes a member)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge(target.get(k), v)
    return target


STORE = None
LOG = None
LOG_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    # Keep-alive and chunked responses, as the client's connection pool expects.
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def fail(self, code, reason, message):
        """A Status, as the client expects with any error code."""
        self.send_json(code, status(code, reason, message))

    def record(self, url, query):
        entry = {
            "client": self.client_address[0],
            "method": self.command,
            "path": url.path,
            "query": query,
        }
        with LOG_LOCK:
            LOG.write(json.dumps(entry) + "\n")
            LOG.flush()

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        self.record(url, {})
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if url.path != "/_push":
            return self.fail(404, "NotFound", f"no {url.path}")
        try:
            events = json.loads(body)
            if isinstance(events, dict):
                events = [events]
            with STORE.lock:
                for e in events:
                    version = STORE.put_locked(e.get("type"), e["object"])
        except (ValueError, KeyError) as e:
            return self.fail(400, "BadRequest", str(e))
        self.send_json(200, {"resourceVersion": str(version)})

    def do_PATCH(self):
        """A JSON merge patch (RFC 7386) of a Node, the one write ferry's agent makes:
        stored as a MODIFIED event and the object sent back."""
        url = urllib.parse.urlsplit(self.path)
        self.record(url, {})
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        prefix = "/api/v1/nodes/"
        if not url.path.startswith(prefix) or "/" in url.path[len(prefix) :]:
            return self.fail(405, "MethodNotAllowed", f"this fake patches only Nodes: {url.path}")
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.fail(415, "UnsupportedMediaType", "expected application/merge-patch+json")
        name = url.path[len(prefix) :]
        try:
            patch = json.loads(body)
        except ValueError as e:
            return self.fail(400, "BadRequest", str(e))
        with STORE.lock:
            old = STORE.objects.get(("Node", "", name))
            if old is None:
                return self.fail(404, "NotFound", f'nodes "{name}" not found')
            obj = merge(copy.deepcopy(old), patch)
            STORE.put_locked("MODIFIED", obj)
        self.send_json(200, obj)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        self.record(url, query)
        if url.path == "/version":
            return self.send_json(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake"})
        target = self.resource(url.path)
        if target is None:
            return self.fail(404, "NotFound", f"the server could not find {url.path}")
        kind, namespace = target
        if "labelSelector" in query:
            return self.fail(400, "BadRequest", "this fake serves no label selectors")
        try:
            selector = parse_selector(kind, query.get("fieldSelector", ""))
        except ValueError as e:
            return self.fail(400, "BadRequest", str(e))
        f = Filter(kind, namespace, selector)
        for name in ("limit", "timeoutSeconds", "resourceVersion"):
            if not query.get(name, "0").isdigit():
                return self.fail(400, "BadRequest", f"{name}: not a number")
        if query.get("watch") in ("true", "1"):
            self.watch(f, query)
        else:
            self.list(f, query)

    def resource(self, path):
        """(kind, namespace or None) of a collection path, or None."""
        for (prefix, resource), (kind, _, namespaced) in RESOURCES.items():
            if path == f"{prefix}/{resource}":
                return kind, None
            rest = path[len(prefix) + 1 :].split("/") if path.startswith(prefix + "/") else []
            if namespaced and len(rest) == 3 and rest[0] == "namespaces" and rest[2] == resource:
                return kind, rest[1]
        return None

    def list(self, f, query):
        limit = int(query.get("limit", "0") or "0")
        with STORE.lock:
            token = query.get("continue")
            if token:
                if token not in STORE.continues:
                    return self.fail(410, "Expired", "the continue token has expired")
                version, items = STORE.continues.pop(token)
            else:
                version = STORE.version
                items = [list_item(o) for _, o in sorted(STORE.objects.items()) if f.selects(o)]
            meta = {"resourceVersion": str(version)}
            if limit and len(items) > limit:
                items, rest = items[:limit], items[limit:]
                token = uuid.uuid4().hex
                STORE.continues[token] = (version, rest)
                meta["continue"] = token
                meta["remainingItemCount"] = len(rest)
        self.send_json(200, {
            "kind": f.kind + "List",
            "apiVersion": API_VERSION_OF[f.kind],
            "metadata": meta,
            "items": items,
        })

    def watch(self, f, query):
        q = queue.Queue()
        allowed = query.get("allowWatchBookmarks") == "true"
        timeout = int(query.get("timeoutSeconds", "1800") or "1800")
        since = query.get("resourceVersion", "")
        gone = False
        with STORE.lock:
            if since in ("", "0") or query.get("sendInitialEvents") == "true":
                for _, o in sorted(STORE.objects.items()):
                    if f.selects(o):
                        q.put({"type": "ADDED", "object": o})
                if query.get("sendInitialEvents") == "true":
                    q.put(STORE.bookmark_locked(f.kind, {"k8s.io/initial-events-end": "true"}))
            elif int(since) < STORE.oldest:
                gone = True
                message = f"too old resource version: {since} ({STORE.oldest})"
                expired = status(410, "Expired", message)
                q.put({"type": "ERROR", "object": expired})
            else:
                for version, type_, o in STORE.history:
                    if version > int(since) and f.selects(o):
                        q.put({"type": type_, "object": o})
            if not gone:
                STORE.watches.append((f, q, allowed))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    line = q.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
                data = (json.dumps(line) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                if line["type"] == "ERROR":
                    break
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with STORE.lock:
                STORE.watches = [w for w in STORE.watches if w[1] is not q]


def main():
    global STORE, LOG
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:8080", help="ADDR:PORT")
    p.add_argument("--objects", help="a JSON array of objects to start with")
    p.add_argument("--log", required=True, help="where to append a JSON line per request")
    p.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds")
    args = p.parse_args()
    STORE = Store(args.bookmark_interval)
    if args.objects:
        with open(args.objects) as f:
            STORE.load(json.load(f))
    LOG = open(args.log, "a")
    threading.Thread(target=STORE.bookmarks, daemon=True).start()
    addr, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((addr, int(port)), Handler)
    server.daemon_threads = True
    print(f"fake API server on {args.listen}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
