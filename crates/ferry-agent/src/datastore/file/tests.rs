use std::collections::BTreeSet;
use std::time::Instant;

use super::*;
use crate::fields::Protocol;

/// A Service as `kubectl get service -o yaml` prints it, with the fields ferry ignores.
const WEB: &str = r#"apiVersion: v1
kind: Service
metadata:
  creationTimestamp: "2026-11-20T10:01:55Z"
  name: web
  namespace: default
  resourceVersion: "50871"
  uid: 7a3c5e9b-1d2f-4b6a-8c0e-2f4a6b8c0d71
  managedFields:
  - apiVersion: v1
    fieldsType: FieldsV1
    fieldsV1:
      f:spec:
        f:ports:
          .: {}
          k:{"port":80,"protocol":"TCP"}:
            .: {}
            f:name: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2026-11-20T10:01:55Z"
spec:
  clusterIP: 10.96.0.10
  clusterIPs:
  - 10.96.0.10
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: http
  - name: https
    port: 443
    protocol: TCP
    targetPort: 8443
  selector:
    app: web
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {}
"#;

const NODE: &str = r#"apiVersion: v1
kind: Node
metadata:
  name: node-a
  uid: 5d1c9a3e-6f0b-4c52-9a7e-1b0d6c2f8a11
spec:
  podCIDR: 10.244.1.0/24
status:
  addresses:
  - {address: 192.168.10.2, type: InternalIP}
  capacity: {cpu: 4, memory: 8127400Ki, pods: 110}
"#;

fn problems(r: Result<(Cluster, Vec<Problem>), Refused>) -> Vec<String> {
    match r {
        Ok(_) => panic!("expected the manifests to be refused"),
        Err(e) => e.problems.iter().map(ToString::to_string).collect(),
    }
}

fn good(r: Result<(Cluster, Vec<Problem>), Refused>) -> (Cluster, Vec<Problem>) {
    r.unwrap_or_else(|e| panic!("expected good manifests, got:\n{e}"))
}

#[test]
fn example_cluster_loads_without_problems_or_notes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster");
    let (c, notes) = good(load(&dir));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(c.nodes.len(), 2);
    assert_eq!(c.pods.len(), 7);
    assert_eq!(c.services.len(), 5);
    assert_eq!(c.endpoint_slices.len(), 6);
    assert_eq!(c.config_maps.len(), 1);
}

#[test]
fn reads_documents_lists_and_leading_separators() {
    let text = format!(
        "---\n# a comment-only document is skipped\n---\n{WEB}---\napiVersion: v1\nkind: List\nitems:\n- {}\n---\n",
        NODE.replace('\n', "\n  ")
    );
    let (c, notes) = good(parse("all.yaml", &text));
    assert!(notes.is_empty());
    assert!(c.services.contains_key(&ObjectKey::new("default", "web")));
    assert!(c.node("node-a").is_some());
}

#[test]
fn namespace_defaults_to_default() {
    let text = WEB.replace("  namespace: default\n", "");
    let (c, _) = good(parse("s.yaml", &text));
    assert!(c.services.contains_key(&ObjectKey::new("default", "web")));
}

#[test]
fn other_kinds_are_left_out_with_a_note() {
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {}\n---\napiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: old}\naddressType: IPv4\n---\napiVersion: v1\nkind: Endpoints\n";
    let (c, notes) = good(parse("misc.yaml", text));
    assert!(c.is_empty());
    let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
    assert_eq!(notes.len(), 3);
    assert!(notes[0].starts_with("misc.yaml:1: apps/v1 Deployment web: ignored"));
    assert!(notes[1].contains("discovery.k8s.io/v1beta1 EndpointSlice old: ignored"));
    assert!(notes[2].contains("document 3 (v1 Endpoints): ignored"));
}

#[test]
fn a_field_of_the_wrong_type_names_file_object_and_field() {
    let text = WEB.replace("port: 443", "port: https");
    let p = problems(parse("services.yaml", &text));
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("services.yaml:1: Service default/web: spec.ports[1].port: invalid type"),
        "{}",
        p[0]
    );
}

#[test]
fn an_unknown_field_is_refused() {
    let text = WEB.replace("  sessionAffinity: None", "  externalTraficPolicy: Local");
    let p = problems(parse("services.yaml", &text));
    assert_eq!(
        p,
        ["services.yaml:1: Service default/web: spec.externalTraficPolicy: unknown field"]
    );
}

#[test]
fn semantic_checks_name_the_field() {
    let text = WEB
        .replace("port: 443", "port: 70000")
        .replace("  - 10.96.0.10\n", "  - 10.96.0.300\n")
        .replace("clusterIP: 10.96.0.10", "clusterIP: 10.96.0.300")
        .replace("type: ClusterIP", "type: NodePort")
        .replace(
            "    targetPort: http\n",
            "    targetPort: http\n    nodePort: 0\n",
        );
    let p = problems(parse("services.yaml", &text));
    assert_eq!(
        p,
        [
            "services.yaml:1: Service default/web: spec.clusterIPs[0]: \"10.96.0.300\" is not an IP address",
            "services.yaml:1: Service default/web: spec.ports[0].nodePort: 0 is outside 1-65535",
            "services.yaml:1: Service default/web: spec.ports[1].port: 70000 is outside 1-65535",
        ]
    );
}

#[test]
fn a_document_without_a_name_is_named_by_its_index() {
    let text = format!(
        "{NODE}---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: x}}\n---\nkind: Pod\n"
    );
    let p = problems(parse("pods.yaml", &text));
    assert_eq!(
        p,
        [
            "pods.yaml:13: document 2 (Pod): metadata.name: required",
            "pods.yaml:17: document 3: apiVersion: required (a string)",
        ]
    );
}

#[test]
fn list_items_are_named_by_their_index() {
    let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {kind: Pod}\n";
    let p = problems(parse("list.yaml", text));
    assert_eq!(
        p,
        ["list.yaml:1: document 1 items[1]: apiVersion: required (a string)"]
    );
}

#[test]
fn a_yaml_syntax_error_names_the_file_and_position() {
    let p = problems(parse("bad.yaml", "apiVersion: v1\nkind: [Pod\n"));
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("bad.yaml: not valid YAML: line 2"),
        "{}",
        p[0]
    );
}

#[test]
fn the_same_object_in_two_files_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), WEB).unwrap();
    fs::write(dir.path().join("b.yml"), format!("---\n{WEB}")).unwrap();
    let p = problems(load(dir.path()));
    assert_eq!(
        p,
        ["b.yml:2: Service default/web: defined twice: also in a.yaml:1"]
    );
}

#[test]
fn two_services_with_one_cluster_ip_or_node_port_are_refused() {
    let np = WEB.replace("type: ClusterIP", "type: NodePort").replace(
        "    targetPort: 8443\n",
        "    targetPort: 8443\n    nodePort: 30443\n",
    );
    let other = np.replace("name: web\n", "name: web2\n");
    let p = problems(parse("s.yaml", &format!("{np}---\n{other}")));
    assert_eq!(
        p,
        [
            "s.yaml:46: Service default/web2: spec.clusterIPs[0]: 10.96.0.10 is also the cluster IP of Service default/web",
            "s.yaml:46: Service default/web2: spec.ports[1].nodePort: TCP 30443 is also a node port of Service default/web",
        ]
    );
}

#[test]
fn an_external_or_load_balancer_ip_on_another_services_frontend_is_left_out_with_a_note() {
    let by_external_ip = WEB
        .replace("name: web\n", "name: edge\n")
        .replace("10.96.0.10", "10.96.0.20")
        .replace("  selector:", "  externalIPs:\n  - 10.96.0.10\n  selector:");
    let by_lb_ip = WEB
        .replace("name: web\n", "name: lb\n")
        .replace("10.96.0.10", "10.96.0.30")
        .replace("type: ClusterIP", "type: LoadBalancer")
        .replace(
            "  loadBalancer: {}",
            "  loadBalancer:\n    ingress:\n    - ip: 10.96.0.10",
        );
    // web read last still wins its cluster IP's frontend.
    let (c, notes) = good(parse(
        "s.yaml",
        &format!("{by_external_ip}---\n{by_lb_ip}---\n{WEB}"),
    ));
    let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "s.yaml:1: Service default/edge: spec.externalIPs[0]: TCP 10.96.0.10:80 is a frontend of Service default/web (its spec.clusterIPs[0]); left out",
            "s.yaml:1: Service default/edge: spec.externalIPs[0]: TCP 10.96.0.10:443 is a frontend of Service default/web (its spec.clusterIPs[0]); left out",
            "s.yaml:47: Service default/lb: status.loadBalancer.ingress[0].ip: TCP 10.96.0.10:80 is a frontend of Service default/web (its spec.clusterIPs[0]); left out",
            "s.yaml:47: Service default/lb: status.loadBalancer.ingress[0].ip: TCP 10.96.0.10:443 is a frontend of Service default/web (its spec.clusterIPs[0]); left out",
        ]
    );
    let web = ObjectKey::new("default", "web");
    assert_eq!(c.left_out(&web), None);
    let edge = ObjectKey::new("default", "edge");
    let ip = "10.96.0.10".parse().unwrap();
    assert_eq!(
        c.left_out(&edge),
        Some(&BTreeSet::from([
            (Protocol::Tcp, ip, 80),
            (Protocol::Tcp, ip, 443)
        ]))
    );
    // One Service naming an address twice is one Service.
    let twice = by_lb_ip.replace("  selector:", "  externalIPs:\n  - 10.96.0.10\n  selector:");
    good(parse("s.yaml", &twice));
}

#[test]
fn two_nodes_with_one_internal_ip_are_refused() {
    let twin = NODE.replace("name: node-a", "name: node-a2");
    let p = problems(parse("n.yaml", &format!("{NODE}---\n{twin}")));
    assert_eq!(
        p,
        [
            "n.yaml:13: Node node-a2: status.addresses[0].address: 192.168.10.2 is also an InternalIP of Node node-a"
        ]
    );
}

#[test]
fn every_problem_of_every_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("a.yaml"),
        WEB.replace("port: 80", "port: -1"),
    )
    .unwrap();
    fs::write(
        dir.path().join("b.yaml"),
        NODE.replace("10.244.1.0/24", "10.244.1.0/33"),
    )
    .unwrap();
    let p = problems(load(dir.path()));
    assert_eq!(
        p,
        [
            "a.yaml:1: Service default/web: spec.ports[0].port: -1 is outside 1-65535",
            "b.yaml:1: Node node-a: spec.podCIDR: \"10.244.1.0/33\" is not a CIDR (ADDR/LEN)",
        ]
    );
}

#[test]
fn ferry_config_keys_are_checked() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ferry-config, namespace: kube-system}\ndata: {encapsulation: vxlan}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: kube-system}\ndata: {encapsulation: vxlan}\n";
    let p = problems(parse("cm.yaml", text));
    assert_eq!(
        p,
        [
            "cm.yaml:1: ConfigMap kube-system/ferry-config: data.encapsulation: \"vxlan\": expected always, cross-subnet or never"
        ]
    );
}

#[test]
fn an_unknown_ferry_config_key_is_left_out_with_a_note() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ferry-config, namespace: kube-system}\ndata: {vxlan-port: \"8472\", vxlan-mtu: \"1400\"}\n";
    let (c, notes) = good(parse("cm.yaml", text));
    let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "cm.yaml:1: ConfigMap kube-system/ferry-config: data.vxlan-mtu: unknown key, ignored (known: vxlan-vni, vxlan-port, encapsulation, external-snat, policy-host-to-pods, policy-on-change, uplink)"
        ]
    );
    assert_eq!(crate::config::FerryConfig::of(&c).unwrap().vxlan_port, 8472);
}

#[test]
fn numeric_resource_quantities_are_accepted_as_kubectl_does() {
    let (c, _) = good(parse("n.yaml", NODE));
    let cap = c
        .node("node-a")
        .unwrap()
        .status
        .as_ref()
        .unwrap()
        .capacity
        .as_ref()
        .unwrap();
    assert_eq!(cap["cpu"].0, "4");
}

#[test]
fn only_yaml_files_at_the_top_are_read() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    fs::write(dir.path().join("README.md"), "not yaml: [").unwrap();
    fs::write(dir.path().join(".web.yaml.swp"), "junk").unwrap();
    fs::write(dir.path().join(".#web.yaml"), "junk: [").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    fs::write(dir.path().join("sub/node.yaml"), NODE).unwrap();
    let (c, _) = good(load(dir.path()));
    assert_eq!(c.len(), 1);
}

#[test]
fn a_missing_directory_is_refused() {
    let p = problems(load(Path::new("/nonexistent/ferry-cluster")));
    assert!(
        p[0].starts_with("/nonexistent/ferry-cluster: cannot read the manifest directory"),
        "{}",
        p[0]
    );
}

#[test]
fn poll_reads_a_change_once_it_has_settled_and_reports_it_once() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("node.yaml"), NODE).unwrap();
    let (mut ds, _) = FileDatastore::open(dir.path()).unwrap();
    assert_eq!(ds.current().len(), 1);
    assert!(ds.poll().is_none());
    let first = ds.current();
    fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    // First look: the directory just changed; it may still be being written.
    assert!(ds.poll().is_none());
    let written = crate::datastore::unix_ms();
    match ds.poll() {
        Some(Update::Applied {
            cluster,
            read_unix_ms,
            ..
        }) => {
            // Stamped with the scan that read it, which began after the write ended.
            assert!(read_unix_ms >= written, "{read_unix_ms} < {written}");
            assert!(read_unix_ms <= crate::datastore::unix_ms());
            assert_eq!(cluster.len(), 2);
            let (node, was) = (cluster.nodes.values().next(), first.nodes.values().next());
            assert!(
                std::sync::Arc::ptr_eq(node.unwrap(), was.unwrap()),
                "the Node read again is the one in force"
            );
        }
        u => panic!("expected the new state, got {u:?}"),
    }
    assert!(ds.poll().is_none());
    assert_eq!(ds.current().len(), 2);
}

/// Waits for the next update; panics after a few seconds.
fn next(w: &Watch) -> Update {
    w.next_update(Duration::from_secs(5))
        .expect("an update within 5 s")
}

/// Rewrites a file so that its modification time surely differs from the last one seen
/// (coarse file system clocks would hide a quick rewrite of the same size). Each write
/// replaces the file whole (a hidden temporary file renamed over it), so that the
/// watcher never catches a write half-way: writing in place would truncate the file
/// again at each try, and a poll could read it empty.
fn rewrite(path: &Path, text: &str) {
    let before = fs::metadata(path).and_then(|m| m.modified()).ok();
    let name = path.file_name().unwrap().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, path).unwrap();
        let after = fs::metadata(path).and_then(|m| m.modified()).ok();
        if after != before || Instant::now() > deadline {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn watcher_keeps_the_last_good_state_while_a_manifest_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yaml");
    fs::write(dir.path().join("node.yaml"), NODE).unwrap();
    fs::write(&web, WEB).unwrap();
    let w = FileDatastore::watch(dir.path(), Duration::from_millis(20)).unwrap();
    let Update::Applied { cluster: first, .. } = next(&w) else {
        panic!("the first update is the initial state");
    };
    assert_eq!(first.len(), 2);

    // A broken edit: refused, naming file, object and field; the good state stays.
    rewrite(&web, &WEB.replace("port: 443", "port: 99999"));
    match next(&w) {
        Update::Refused(r) => assert_eq!(
            r.to_string(),
            "web.yaml:1: Service default/web: spec.ports[1].port: 99999 is outside 1-65535"
        ),
        u => panic!("expected the broken edit to be refused, got {u:?}"),
    }
    assert_eq!(w.current(), first);

    // Fixed: the new state applies.
    rewrite(&web, &WEB.replace("port: 443", "port: 8443"));
    match next(&w) {
        Update::Applied { cluster, .. } => {
            let svc = &cluster.services[&ObjectKey::new("default", "web")];
            let ports = svc.spec.as_ref().unwrap().ports.as_ref().unwrap();
            assert_eq!(ports[1].port, 8443);
            assert_eq!(w.current(), cluster);
        }
        u => panic!("expected the fixed state, got {u:?}"),
    }

    // A removed file is a change too.
    fs::remove_file(&web).unwrap();
    match next(&w) {
        Update::Applied { cluster, .. } => assert_eq!(cluster.len(), 1),
        u => panic!("expected the smaller state, got {u:?}"),
    }
}

#[test]
fn watch_refuses_to_start_from_a_bad_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), "kind: [").unwrap();
    let e = FileDatastore::watch(dir.path(), Duration::from_millis(20)).unwrap_err();
    assert!(e.to_string().starts_with("web.yaml: not valid YAML"), "{e}");
}

#[test]
fn a_name_that_is_not_a_string_says_so() {
    // YAML 1.1, as kubectl reads it: `on` is a boolean.
    let p = problems(parse(
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: on}\n",
    ));
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("p.yaml:1: document 1 (Pod): metadata.name: invalid type: boolean `true`"),
        "{}",
        p[0]
    );
}
