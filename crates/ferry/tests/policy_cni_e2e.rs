//! A pod the CNI plugin attached before its Pod object says its address (kubelet's
//! status update not in yet) meets its NetworkPolicy from its first packet: the agent
//! knows this node's pods by the addresses of their ports. Real pings from the pod to
//! an external host: denied while a policy isolates the pod's egress, whether or not
//! the Pod says its address, and answered once the policy goes. Needs root, iproute2
//! and ping.

mod common;

use std::fs;

use common::one_node::{Node, ok};
use ferry_agent::api::call;
use ferry_api::{PodRef, Request};

/// The pod `default/web` on node1, labelled `app: web`, with `ips` in its status.
fn pod(ips: &str) -> String {
    format!(
        "
apiVersion: v1
kind: Pod
metadata: {{ name: web, namespace: default, labels: {{ app: web }} }}
spec:
  nodeName: node1
  containers: [{{ name: main, image: registry.k8s.io/e2e-test-images/agnhost:2.52 }}]
status:
  phase: Pending
{ips}"
    )
}

/// Isolates every pod of `default` for egress, allowing nothing.
const DENY_EGRESS: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-egress, namespace: default }
spec:
  podSelector: {}
  policyTypes: [Egress]
";

fn pings(lab: &common::Lab) -> bool {
    lab.exec("p1", 5, &["ping", "-c", "1", "-W", "1", "192.168.77.100"])
        .status
        .success()
}

#[test]
fn a_pod_attached_before_its_pod_object_has_an_address_meets_its_policy() {
    let mut node = Node::new("pcni");
    let manifests = node.dir.path().join("cluster");
    fs::write(manifests.join("pod.yaml"), pod("")).unwrap();
    fs::write(manifests.join("policy.yaml"), DENY_EGRESS).unwrap();
    node.start("ferry agent", &[]);
    let add = Request::Add {
        container_id: "c0ffee".into(),
        netns: format!("/var/run/netns/{}", node.lab.ns("p1")),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.5/24".into()],
    };
    ok(call(&node.sock, &add).unwrap());
    assert!(
        !pings(&node.lab),
        "no address in the Pod object: still isolated"
    );

    // kubelet's status update comes: the same pod, the same policy.
    fs::write(
        manifests.join("pod.yaml"),
        pod("  podIP: 10.244.1.5\n  podIPs: [{ ip: 10.244.1.5 }]\n"),
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(!pings(&node.lab), "the Pod says its address: isolated");

    // The policy goes: the path itself works.
    fs::remove_file(manifests.join("policy.yaml")).unwrap();
    node.lab
        .wait_for(10, "pings answered without the policy", pings);
}
