//! `ferry agent` on two nodes, from a directory of Kubernetes manifests: Services with
//! real TCP clients, the NodePort path across nodes with the client address kept,
//! live edits (an endpoint removed, a bad manifest), and health check node ports.
//!
//! The nodes' uplinks and an external client share one L2 segment (a bridge in a
//! "fabric" namespace), so the nodes are on one subnet and cross-subnet mode would route
//! between them directly: the case of `calico-ebpf-nlb-nodeport.txt`, where a reply that
//! skips the ingress node never reaches the client. Each node's kernel gets its address
//! through the host port, where the agent serves health check node ports.
//! Needs root, iproute2, curl and python3.

mod common;

use std::fs;
use std::path::Path;

use common::Lab;

fn node(n: u8) -> String {
    format!(
        r#"
apiVersion: v1
kind: Node
metadata:
  name: node{n}
  annotations:
    ferry.io/ipv4-address: 192.168.77.{n}/24
  labels:
    topology.kubernetes.io/zone: zone-a
spec:
  podCIDR: 10.244.{n}.0/24
  podCIDRs: [10.244.{n}.0/24]
status:
  addresses:
  - {{ type: InternalIP, address: 192.168.77.{n} }}
  - {{ type: Hostname, address: node{n} }}
"#
    )
}

fn pod(name: &str, node: u8, ip: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: default, labels: {{ app: {name} }} }}
spec:
  nodeName: node{node}
  containers: [{{ name: main, image: registry.k8s.io/e2e-test-images/agnhost:2.52 }}]
status:
  phase: Running
  podIP: {ip}
  podIPs: [{{ ip: {ip} }}]
"#
    )
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: web, namespace: default }
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  selector: { app: web }
  ports: [{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080 }]
---
apiVersion: v1
kind: Service
metadata: { name: web-local, namespace: default }
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  clusterIPs: [10.96.0.11]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  selector: { app: web }
  ports: [{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30081 }]
---
apiVersion: v1
kind: ConfigMap
metadata: { name: ferry-config, namespace: kube-system }
data: { encapsulation: cross-subnet }
"#;

fn slice(service: &str, endpoints: &str) -> String {
    format!(
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-abcde
  namespace: default
  labels: {{ kubernetes.io/service-name: {service} }}
addressType: IPv4
ports: [{{ name: http, protocol: TCP, port: 8080 }}]
endpoints: {endpoints}
"#
    )
}

const WEB_ON_NODE2: &str =
    "[{ addresses: [10.244.2.5], conditions: { ready: true }, nodeName: node2 }]";

/// Writes the cluster: two nodes, a client pod on node 1, the web pod on node 2, two
/// Services selecting it.
fn write_cluster(dir: &Path) {
    fs::write(dir.join("nodes.yaml"), format!("{}---{}", node(1), node(2))).unwrap();
    fs::write(
        dir.join("pods.yaml"),
        format!(
            "{}---{}",
            pod("client", 1, "10.244.1.5"),
            pod("web", 2, "10.244.2.5")
        ),
    )
    .unwrap();
    fs::write(dir.join("services.yaml"), SERVICES).unwrap();
    fs::write(
        dir.join("slices.yaml"),
        format!(
            "{}---{}",
            slice("web", WEB_ON_NODE2),
            slice("web-local", WEB_ON_NODE2)
        ),
    )
    .unwrap();
}

/// Node `n`'s base tables: the uplink, and the host port that gives the node's kernel
/// its address (docs/node.md).
fn base(n: u8) -> String {
    format!(
        r#"
ports:
  - {{ name: uplink, kind: uplink, mac: "02:fe:00:00:00:0{n}", addresses: [192.168.77.{n}/24] }}
  - {{ name: host, kind: host, mac: "02:fe:00:00:01:0{n}", addresses: [169.254.1.1] }}
routes:
  - {{ prefix: 192.168.77.{n}/32, port: host, next_hop_mac: "02:aa:00:00:00:0{n}" }}
"#
    )
}

/// The web pod's server, like agnhost netexec: GET /clientip answers the client's
/// address, /hostname the pod's name.
const SERVER: &str = r#"
import http.server, socket, sys
name = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.client_address[0] if self.path == "/clientip" else name).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET
S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"#;

struct Cluster {
    lab: Lab,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn manifests(&self) -> std::path::PathBuf {
        self.dir.path().join("cluster")
    }

    fn curl(&self, from: &str, url: &str) -> String {
        self.lab
            .run(from, 10, &["curl", "-sS", "--max-time", "3", url])
    }

    /// curl's exit status and what it printed, without failing.
    fn try_curl(&self, from: &str, url: &str) -> (i32, String) {
        let out = self
            .lab
            .exec(from, 10, &["curl", "-sS", "--max-time", "3", url]);
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

fn start(tag: &str) -> Cluster {
    common::require(&[("ip", "iproute2"), ("curl", "curl"), ("python3", "python3")]);
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("cluster");
    fs::create_dir(&manifests).unwrap();
    write_cluster(&manifests);
    let mut lab = Lab::new(tag);
    for ns in ["fab", "n1", "n2", "p1a", "p2a", "ext"] {
        lab.add_ns(ns);
    }
    lab.ip(
        "fab",
        &[
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "nf_call_iptables",
            "0",
        ],
    );
    lab.ip("fab", &["link", "set", "br0", "up"]);
    lab.veth("n1", "up1", "fab", "f1");
    lab.veth("n2", "up2", "fab", "f2");
    lab.veth("ext", "eth0", "fab", "fe");
    for dev in ["f1", "f2", "fe"] {
        lab.ip("fab", &["link", "set", dev, "master", "br0"]);
    }
    lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
    let server = dir.path().join("server.py");
    fs::write(&server, SERVER).unwrap();

    for n in [1u8, 2] {
        let ns = format!("n{n}");
        lab.ip(
            &ns,
            &[
                "link",
                "set",
                &format!("up{n}"),
                "address",
                &format!("02:fe:00:00:00:0{n}"),
            ],
        );
        let base_file = dir.path().join(format!("base{n}.yaml"));
        fs::write(&base_file, base(n)).unwrap();
        let tap = format!("{}h{n}", lab.prefix);
        let (pod, pod_ns) = if n == 1 {
            ("default/client", lab.ns("p1a"))
        } else {
            ("default/web", lab.ns("p2a"))
        };
        let args = [
            env!("CARGO_BIN_EXE_ferry").to_string(),
            "agent".into(),
            "--node".into(),
            format!("node{n}"),
            "--datastore".into(),
            format!("file:{}", manifests.display()),
            "--base".into(),
            base_file.display().to_string(),
            "--uplink".into(),
            format!("up{n}"),
            "--host-tap".into(),
            tap.clone(),
            "--pod".into(),
            format!("{pod}={pod_ns}"),
            "--api-socket".into(),
            dir.path().join(format!("n{n}.sock")).display().to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.daemon(&ns, &format!("ferry agent on node{n}"), &args);
        let t = tap.clone();
        let nsc = ns.clone();
        lab.wait_for(10, &format!("host TAP {tap}"), |l| {
            l.exec(&nsc, 2, &["ip", "link", "show", &t])
                .status
                .success()
        });
        // The node's kernel: its address on the host TAP, everything else through ferry.
        let mac = format!("02:aa:00:00:00:0{n}");
        lab.ip(&ns, &["link", "set", &tap, "address", &mac, "up"]);
        lab.ip(
            &ns,
            &["addr", "add", &format!("192.168.77.{n}/32"), "dev", &tap],
        );
        lab.ip(
            &ns,
            &["route", "add", "169.254.1.1", "dev", &tap, "scope", "link"],
        );
        lab.ip(&ns, &["route", "add", "default", "via", "169.254.1.1"]);
    }
    lab.wait_pod("p1a");
    lab.wait_pod("p2a");
    let s = server.display().to_string();
    lab.daemon("p2a", "web server", &["python3", &s, "8080", "web"]);
    let mut c = Cluster { lab, dir };
    c.lab.wait_for(10, "the web server", |l| {
        l.exec("p2a", 2, &["curl", "-s", "http://127.0.0.1:8080/hostname"])
            .status
            .success()
    });
    let _ = c.manifests();
    c
}

#[test]
fn services_and_the_node_port_path_across_nodes() {
    let mut c = start("ag");

    // Cluster IP from a pod on node 1 to the endpoint on node 2.
    assert_eq!(c.curl("p1a", "http://10.96.0.10/hostname"), "web");
    assert_eq!(c.curl("p1a", "http://10.96.0.10/clientip"), "10.244.1.5");

    // The node port on node 1, whose endpoint is on node 2: the pod sees the client's
    // address, and the reply returns through node 1 (the client would refuse one from
    // node 2's pod address).
    for _ in 0..5 {
        assert_eq!(
            c.curl("ext", "http://192.168.77.1:30080/clientip"),
            "192.168.77.100"
        );
    }
    // And on node 2 itself.
    assert_eq!(
        c.curl("ext", "http://192.168.77.2:30080/clientip"),
        "192.168.77.100"
    );

    // externalTrafficPolicy Local: node 2 serves it, node 1 has no local endpoint and
    // drops; the health check node port says which is which, from each node's kernel
    // through the host port.
    assert_eq!(
        c.curl("ext", "http://192.168.77.2:30081/clientip"),
        "192.168.77.100"
    );
    let (code, _) = c.try_curl("ext", "http://192.168.77.1:30081/clientip");
    assert_eq!(
        code, 28,
        "node 1 has no local endpoint: the connection times out"
    );
    let hc = |c: &Cluster, n: u8| {
        c.lab.run(
            "ext",
            10,
            &[
                "curl",
                "-s",
                "--max-time",
                "3",
                "-w",
                " %{http_code}",
                &format!("http://192.168.77.{n}:32000/healthz"),
            ],
        )
    };
    let h2 = hc(&c, 2);
    assert!(
        h2.ends_with(" 200") && h2.contains("\"localEndpoints\": 1"),
        "{h2}"
    );
    let h1 = hc(&c, 1);
    assert!(
        h1.ends_with(" 503") && h1.contains("\"localEndpoints\": 0"),
        "{h1}"
    );

    // A bad manifest changes nothing: the error names the file, and traffic goes on.
    let bad = c.manifests().join("zz-bad.yaml");
    fs::write(
        &bad,
        "apiVersion: v1\nkind: Service\nmetadata: { name: broken, namespace: default }\nspec:\n  ports: [{ port: 70000 }]\n",
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(c.curl("p1a", "http://10.96.0.10/hostname"), "web");
    fs::remove_file(&bad).unwrap();

    // The endpoint goes away: new connections are refused at once (TCP reset), not
    // left to time out.
    let slices = c.manifests().join("slices.yaml");
    fs::write(
        &slices,
        format!(
            "{}---{}",
            slice("web", "[]"),
            slice("web-local", WEB_ON_NODE2)
        ),
    )
    .unwrap();
    c.lab.wait_for(10, "the endpoint removal applied", |l| {
        let out = l.exec(
            "p1a",
            5,
            &[
                "curl",
                "-sS",
                "--max-time",
                "3",
                "http://10.96.0.10/hostname",
            ],
        );
        // curl: 7 = "Couldn't connect" (refused), 28 = timed out.
        out.status.code() == Some(7)
    });
    // And it comes back.
    fs::write(
        &slices,
        format!(
            "{}---{}",
            slice("web", WEB_ON_NODE2),
            slice("web-local", WEB_ON_NODE2)
        ),
    )
    .unwrap();
    c.lab.wait_for(10, "the endpoint back", |l| {
        l.exec(
            "p1a",
            5,
            &[
                "curl",
                "-sS",
                "--max-time",
                "3",
                "http://10.96.0.10/hostname",
            ],
        )
        .status
        .success()
    });
    let log = c.lab.stop("ferry agent on node1");
    assert!(
        log.contains("zz-bad.yaml") && log.contains("spec.ports[0].port"),
        "the refusal names the file and field: {log}"
    );
}
