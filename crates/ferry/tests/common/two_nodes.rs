//! The two-node cluster of the `ferry agent` end-to-end tests, whatever datastore the
//! agents read it from: its manifests, and a lab where each node runs an agent.
//!
//! The nodes' uplinks and an external client share one L2 segment (a bridge in a
//! "fabric" namespace), so the nodes are on one subnet and cross-subnet mode would route
//! between them directly: the case of `calico-ebpf-nlb-nodeport.txt`, where a reply that
//! skips the ingress node never reaches the client. Each node's kernel gets its address
//! through the host port, where the agent serves health check node ports. Node 1 runs
//! the pod `client` (10.244.1.5), node 2 the pod `web` (10.244.2.5) with an HTTP server on
//! 8080; the Service `web` (10.96.0.10, node port 30080) and `web-local` (10.96.0.11,
//! externalTrafficPolicy Local, node port 30081, health check node port 32000) select it.

use std::fs;

use super::Lab;

/// Node `n`: its pod CIDR and address on the fabric (192.168.77.n).
pub fn node(n: u8) -> String {
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

/// A running pod on node `node`, labelled `app: NAME`.
pub fn pod(name: &str, node: u8, ip: &str) -> String {
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

/// Isolates the web pod for ingress: only pods labelled `role: friend` reach it, on
/// TCP 8080.
pub const WEB_FROM_FRIENDS: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-friends, namespace: default }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: { role: friend } } }]
    ports: [{ protocol: TCP, port: 8080 }]
";

/// Admin tier: denies everything from the default namespace to the web pod.
pub const ADMIN_DENY: &str = "
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: deny-to-web }
spec:
  tier: Admin
  priority: 10
  subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: web } } } }
  ingress:
  - { name: from-default, action: Deny, from: [{ namespaces: { matchLabels: { kubernetes.io/metadata.name: default } } }] }
";

/// The two Services selecting the web pod, and ferry-config.
pub const SERVICES: &str = r#"
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

/// The EndpointSlice of `service` with `endpoints` (a YAML flow sequence).
pub fn slice(service: &str, endpoints: &str) -> String {
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

/// The endpoints of both Services: the web pod on node 2.
pub const WEB_ON_NODE2: &str =
    "[{ addresses: [10.244.2.5], conditions: { ready: true }, nodeName: node2 }]";

/// A Service the API server would refuse (port 70000), as a datastore may still see one.
pub const BAD_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: { name: broken, namespace: default }\nspec:\n  ports: [{ port: 70000 }]\n";

/// The cluster, by manifest file name: two nodes, the client and web pods, the Services
/// and their EndpointSlices.
pub fn manifests() -> Vec<(&'static str, String)> {
    vec![
        ("nodes.yaml", format!("{}---{}", node(1), node(2))),
        (
            "pods.yaml",
            format!(
                "{}---{}",
                pod("client", 1, "10.244.1.5"),
                pod("web", 2, "10.244.2.5")
            ),
        ),
        ("services.yaml", SERVICES.to_string()),
        (
            "slices.yaml",
            format!(
                "{}---{}",
                slice("web", WEB_ON_NODE2),
                slice("web-local", WEB_ON_NODE2)
            ),
        ),
    ]
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

/// The lab: namespaces `fab` (the bridge), `n1` and `n2` (the nodes), `p1a` and `p2a`
/// (their pods), `ext` (the external client at 192.168.77.100); files in `dir`.
pub struct TwoNodes {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
}

impl TwoNodes {
    /// The namespaces and links, without agents.
    pub fn new(tag: &str) -> TwoNodes {
        super::require(&[("ip", "iproute2"), ("curl", "curl"), ("python3", "python3")]);
        let dir = tempfile::tempdir().unwrap();
        let mut lab = Lab::new(tag);
        for ns in ["fab", "n1", "n2", "p1a", "p2a", "ext"] {
            lab.add_ns(ns);
        }
        lab.fabric(
            "fab",
            &[
                ("n1", "up1", "f1"),
                ("n2", "up2", "f2"),
                ("ext", "eth0", "fe"),
            ],
        );
        lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
        for n in [1u8, 2] {
            lab.ip(
                &format!("n{n}"),
                &[
                    "link",
                    "set",
                    &format!("up{n}"),
                    "address",
                    &format!("02:fe:00:00:00:0{n}"),
                ],
            );
        }
        TwoNodes { lab, dir }
    }

    /// Starts `ferry agent --datastore DATASTORE` on node `n` (labelled "ferry agent on
    /// nodeN"), and once it has made the host TAP, gives the node's kernel its address
    /// there with everything else routed through ferry.
    pub fn start_agent(&mut self, n: u8, datastore: &str) {
        self.start_agent_with(n, datastore, &[]);
    }

    /// The manifest directory of [`TwoNodes::with_file_datastore`].
    pub fn manifest_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("cluster")
    }

    /// The lab with the cluster's manifests in [`TwoNodes::manifest_dir`], an agent on
    /// each node watching it (node 1's with `extra` arguments), and the web server.
    pub fn with_file_datastore(tag: &str, extra: &[&str]) -> TwoNodes {
        TwoNodes::with_file_datastore_args(tag, extra, &[])
    }

    /// [`TwoNodes::with_file_datastore`] with `extra1` and `extra2` arguments for the
    /// agents of node 1 and node 2.
    pub fn with_file_datastore_args(tag: &str, extra1: &[&str], extra2: &[&str]) -> TwoNodes {
        TwoNodes::with_file_datastore_config(tag, extra1, extra2, &[])
    }

    /// [`TwoNodes::with_file_datastore_args`] with the `kube-system/ferry-config`
    /// ConfigMap (in `services.yaml`) holding `config` (key, value pairs) instead of
    /// `encapsulation: cross-subnet`, when `config` is not empty.
    pub fn with_file_datastore_config(
        tag: &str,
        extra1: &[&str],
        extra2: &[&str],
        config: &[(&str, &str)],
    ) -> TwoNodes {
        let mut c = TwoNodes::new(tag);
        c.start_file_datastore(extra1, extra2, config);
        c
    }

    /// On a lab made with [`TwoNodes::new`]: what [`TwoNodes::with_file_datastore_config`]
    /// does after making it (the manifests, both agents, the web server).
    pub fn start_file_datastore(
        &mut self,
        extra1: &[&str],
        extra2: &[&str],
        config: &[(&str, &str)],
    ) {
        let c = self;
        let dir = c.manifest_dir();
        fs::create_dir(&dir).unwrap();
        for (file, mut yaml) in manifests() {
            if file == "services.yaml" && !config.is_empty() {
                let data: Vec<String> = config.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                let default = "data: { encapsulation: cross-subnet }";
                assert!(yaml.contains(default), "the ConfigMap in services.yaml");
                yaml = yaml.replace(default, &format!("data: {{ {} }}", data.join(", ")));
            }
            fs::write(dir.join(file), yaml).unwrap();
        }
        let datastore = format!("file:{}", dir.display());
        c.start_agent_with(1, &datastore, extra1);
        c.start_agent_with(2, &datastore, extra2);
        c.start_web();
    }

    /// The local API socket of node `n`'s agent.
    pub fn socket(&self, n: u8) -> std::path::PathBuf {
        self.dir.path().join(format!("node{n}.sock"))
    }

    /// Like [`TwoNodes::start_agent`], with `extra` arguments for `ferry agent`
    /// (`--metrics-addr`, say).
    pub fn start_agent_with(&mut self, n: u8, datastore: &str, extra: &[&str]) {
        let ns = format!("n{n}");
        let args = self.agent_args(n, datastore, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let tap = format!("{}h{n}", self.lab.prefix);
        let lab = &mut self.lab;
        lab.daemon(&ns, &format!("ferry agent on node{n}"), &args);
        let (t, nsc) = (tap.clone(), ns.clone());
        lab.wait_for(10, &format!("host TAP {tap}"), |l| {
            l.exec(&nsc, 2, &["ip", "link", "show", &t])
                .status
                .success()
        });
        // The same host TAP set-up as the lab's nodes.
        let mac = format!("02:aa:00:00:00:0{n}");
        ferry_lab::topology::node_kernel_on_host_tap(
            &lab.ns(&ns),
            &tap,
            &mac,
            &format!("192.168.77.{n}"),
        )
        .unwrap();
    }

    /// The command line (run in node `n`'s namespace) of node `n`'s agent with
    /// `datastore` and `extra` arguments, its base tables written.
    pub fn agent_args(&self, n: u8, datastore: &str, extra: &[&str]) -> Vec<String> {
        let base_file = self.dir.path().join(format!("base{n}.yaml"));
        fs::write(&base_file, base(n)).unwrap();
        let tap = format!("{}h{n}", self.lab.prefix);
        let (pod, pod_ns) = if n == 1 {
            ("default/client", self.lab.ns("p1a"))
        } else {
            ("default/web", self.lab.ns("p2a"))
        };
        let args = [
            // A proxy from the test's environment would take the Kubernetes datastore's
            // requests away from the lab.
            "env".to_string(),
            "-u".into(),
            "HTTPS_PROXY".into(),
            "-u".into(),
            "https_proxy".into(),
            env!("CARGO_BIN_EXE_ferry").to_string(),
            "agent".into(),
            "--node".into(),
            format!("node{n}"),
            "--datastore".into(),
            datastore.into(),
            "--base".into(),
            base_file.display().to_string(),
            "--uplink".into(),
            format!("up{n}"),
            "--host-tap".into(),
            tap.clone(),
            "--pod".into(),
            format!("{pod}={pod_ns}"),
            // Each node its own socket: the nodes share one filesystem here.
            "--api-socket".into(),
            self.socket(n).display().to_string(),
            // And its own record of attachments.
            "--state-dir".into(),
            self.dir
                .path()
                .join(format!("state{n}"))
                .display()
                .to_string(),
        ];
        let mut args = args.to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// Waits for both pods' interfaces, then starts the web pod's server and waits for it.
    pub fn start_web(&mut self) {
        self.lab.wait_pod("p1a");
        self.lab.wait_pod("p2a");
        let server = self.dir.path().join("server.py");
        fs::write(&server, SERVER).unwrap();
        let s = server.display().to_string();
        self.lab
            .daemon("p2a", "web server", &["python3", &s, "8080", "web"]);
        self.lab.wait_for(10, "the web server", |l| {
            l.exec("p2a", 2, &["curl", "-s", "http://127.0.0.1:8080/hostname"])
                .status
                .success()
        });
    }

    /// What curl prints for `url` from namespace `from`; fails the test if curl fails.
    pub fn curl(&self, from: &str, url: &str) -> String {
        self.lab
            .run(from, 10, &["curl", "-sS", "--max-time", "3", url])
    }

    /// curl's exit status and what it printed, without failing.
    pub fn try_curl(&self, from: &str, url: &str) -> (i32, String) {
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

    /// Waits up to `secs` until curl of `url` from `from` exits with `code` (0: answered,
    /// 7: refused, 28: timed out); `what` names the change awaited.
    pub fn wait_curl(&mut self, secs: u64, from: &str, url: &str, code: i32, what: &str) {
        let (f, u) = (from.to_string(), url.to_string());
        self.lab
            .wait_for(secs, &format!("{what} (curl {url} exit {code})"), |l| {
                l.exec(&f, 5, &["curl", "-sS", "--max-time", "3", &u])
                    .status
                    .code()
                    == Some(code)
            });
    }
}
