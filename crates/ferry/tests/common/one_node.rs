//! One node for the tests of the agent's local API: a node namespace `n1` whose uplink
//! `up1` reaches an external host (`ext`, 192.168.77.100, routing the pod CIDR through
//! the node), a pod namespace `p1`, and the agent's manifest directory, API socket and
//! state directory. The agent is started by the test, as many times as it needs.

use std::fs;
use std::path::PathBuf;

use ferry_agent::api::call;
use ferry_api::{Answer, Request, Response};

use super::Lab;

pub const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node1
  annotations: { ferry.io/ipv4-address: 192.168.77.1/24 }
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
status:
  addresses: [{ type: InternalIP, address: 192.168.77.1 }]
"#;

/// The answer of a request that must succeed.
pub fn ok(r: Response) -> Answer {
    match r {
        Response::Ok(a) => a,
        Response::Error(e) => panic!("{e:?}"),
    }
}

/// The node's namespaces and the agent's files.
pub struct Node {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub state: PathBuf,
}

impl Node {
    /// The namespaces and links, without an agent.
    pub fn new(tag: &str) -> Node {
        super::require(&[("ip", "iproute2"), ("ping", "iputils-ping")]);
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("cluster");
        fs::create_dir(&manifests).unwrap();
        fs::write(manifests.join("node.yaml"), CLUSTER).unwrap();
        let mut lab = Lab::new(tag);
        for ns in ["n1", "p1", "ext"] {
            lab.add_ns(ns);
        }
        lab.veth("n1", "up1", "ext", "eth0");
        lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
        lab.ip(
            "ext",
            &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
        );
        let sock = dir.path().join("ferry.sock");
        let state = dir.path().join("state");
        Node {
            lab,
            dir,
            sock,
            state,
        }
    }

    /// Starts an agent labelled `label`, with `extra` arguments, and waits for its API.
    pub fn start(&mut self, label: &str, extra: &[&str]) {
        let ds = format!("file:{}", self.dir.path().join("cluster").display());
        let (s, st) = (
            self.sock.display().to_string(),
            self.state.display().to_string(),
        );
        let mut args = vec![
            env!("CARGO_BIN_EXE_ferry"),
            "agent",
            "--node",
            "node1",
            "--datastore",
            &ds,
            "--uplink",
            "up1",
            "--api-socket",
            &s,
            "--state-dir",
            &st,
        ];
        args.extend_from_slice(extra);
        self.lab.daemon("n1", label, &args);
        let sp = self.sock.clone();
        self.lab
            .wait_for(10, &format!("the API socket of {label}"), move |_| {
                call(&sp, &Request::Status).is_ok_and(|r| matches!(r, Response::Ok(_)))
            });
    }

    /// The pod namespace has an eth0.
    pub fn has_eth0(&self) -> bool {
        self.lab
            .exec("p1", 5, &["ip", "link", "show", "eth0"])
            .status
            .success()
    }
}
