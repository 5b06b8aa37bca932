//! The manifests in `deploy/` are objects the API server takes (each document decodes into
//! its API type, with no field the type lacks), and their RBAC rules grant exactly what
//! the Kubernetes datastore watches.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use ferry_agent::config::{
    CONFIG_NAME, CONFIG_NAMESPACE, FerryConfig, KEY_ENCAPSULATION, KEY_EXTERNAL_SNAT,
    KEY_VXLAN_PORT, KEY_VXLAN_VNI,
};
use ferry_agent::datastore::kube::scopes;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Every object of `deploy/*.yaml`, decoded.
#[derive(Default)]
struct Manifests {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Decodes a document into its API type; a field the type does not have (a typo, a
/// field at the wrong level) fails, as `kubectl apply` refuses it.
fn decode<T: DeserializeOwned + Serialize>(what: &str, doc: &Value) -> T {
    let obj: T = serde_path_to_error::deserialize(doc)
        .unwrap_or_else(|e| panic!("{what}: {}: {}", e.path(), e.inner()));
    let mut unknown = Vec::new();
    ferry_agent::datastore::file::dropped_fields(
        doc,
        &serde_json::to_value(&obj).unwrap(),
        String::new(),
        &mut unknown,
    );
    assert!(unknown.is_empty(), "{what}: unknown fields {unknown:?}");
    obj
}

fn load() -> Manifests {
    let mut m = Manifests::default();
    let mut files: Vec<PathBuf> = fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (i, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            let what = format!("{} document {}", file.display(), i + 1);
            let kind = (doc["apiVersion"].as_str(), doc["kind"].as_str());
            match kind {
                (Some("v1"), Some("ServiceAccount")) => {
                    m.service_accounts.push(decode(&what, &doc));
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRole")) => {
                    m.cluster_roles.push(decode(&what, &doc));
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRoleBinding")) => {
                    m.cluster_role_bindings.push(decode(&what, &doc));
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("Role")) => {
                    m.roles.push(decode(&what, &doc));
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("RoleBinding")) => {
                    m.role_bindings.push(decode(&what, &doc));
                }
                (Some("v1"), Some("ConfigMap")) => m.config_maps.push(decode(&what, &doc)),
                (Some("apps/v1"), Some("DaemonSet")) => m.daemon_sets.push(decode(&what, &doc)),
                other => panic!("{what}: a test for {other:?} is missing here"),
            }
        }
    }
    m
}

impl Manifests {
    fn daemon_set(&self) -> &DaemonSet {
        assert_eq!(self.daemon_sets.len(), 1);
        &self.daemon_sets[0]
    }

    fn config_map(&self, name: &str) -> &ConfigMap {
        self.config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no ConfigMap {name}"))
    }

    /// The agent's service account: `(namespace, name)`.
    fn service_account(&self) -> (String, String) {
        let pod = pod(self.daemon_set());
        let name = pod.service_account_name.clone().unwrap();
        let ns = self.daemon_set().metadata.namespace.clone().unwrap();
        assert!(
            self.service_accounts.iter().any(|s| {
                s.metadata.name.as_deref() == Some(&name)
                    && s.metadata.namespace.as_deref() == Some(&ns)
            }),
            "the DaemonSet's service account {ns}/{name} is not in deploy/"
        );
        (ns, name)
    }
}

/// One thing RBAC allows: API group, resource, namespace (`None`: every namespace),
/// object name (`None`: any), verb.
type Grant = (String, String, Option<String>, Option<String>, String);

fn grants(rules: &[PolicyRule], namespace: Option<&str>, out: &mut BTreeSet<Grant>) {
    for r in rules {
        assert!(r.non_resource_urls.is_none(), "{r:?}");
        let names: Vec<Option<String>> = match &r.resource_names {
            Some(n) if !n.is_empty() => n.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for n in &names {
                    for v in &r.verbs {
                        out.insert((
                            g.clone(),
                            res.clone(),
                            namespace.map(str::to_string),
                            n.clone(),
                            v.clone(),
                        ));
                    }
                }
            }
        }
    }
}

#[test]
fn rbac_grants_exactly_what_the_kubernetes_datastore_watches_and_writes() {
    let m = load();
    let (sa_ns, sa) = m.service_account();
    let is_agent = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(&sa_ns)
        })
    };
    let mut granted = BTreeSet::new();
    for b in &m.cluster_role_bindings {
        assert!(
            is_agent(&b.subjects),
            "{:?} binds someone else",
            b.metadata.name
        );
        assert_eq!(b.role_ref.kind, "ClusterRole");
        let role = m
            .cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(&b.role_ref.name))
            .expect("the bound ClusterRole is in deploy/");
        grants(
            role.rules.as_deref().unwrap_or_default(),
            None,
            &mut granted,
        );
    }
    for b in &m.role_bindings {
        assert!(
            is_agent(&b.subjects),
            "{:?} binds someone else",
            b.metadata.name
        );
        assert_eq!(b.role_ref.kind, "Role");
        let ns = b.metadata.namespace.as_deref();
        let role = m
            .roles
            .iter()
            .find(|r| {
                r.metadata.name.as_deref() == Some(&b.role_ref.name)
                    && r.metadata.namespace.as_deref() == ns
            })
            .expect("the bound Role is in deploy/ in the binding's namespace");
        grants(role.rules.as_deref().unwrap_or_default(), ns, &mut granted);
    }

    let mut wanted = BTreeSet::new();
    for s in scopes() {
        // A metadata.name selector is a request for one object, which RBAC can name.
        let name = s
            .field_selector
            .as_deref()
            .and_then(|f| f.strip_prefix("metadata.name="))
            .map(str::to_string);
        for verb in ["get", "list", "watch"] {
            wanted.insert((
                s.group.to_string(),
                s.resource.to_string(),
                s.namespace.map(str::to_string),
                name.clone(),
                verb.to_string(),
            ));
        }
    }
    // And the one write: this node's annotations.
    for (group, resource, verb) in ferry_agent::datastore::kube::WRITES {
        wanted.insert((
            group.to_string(),
            resource.to_string(),
            None,
            None,
            verb.to_string(),
        ));
    }
    assert_eq!(granted, wanted);
}

#[test]
fn ferry_config_has_every_key_with_a_value_the_agent_takes() {
    let m = load();
    let cm = m.config_map(CONFIG_NAME);
    assert_eq!(cm.metadata.namespace.as_deref(), Some(CONFIG_NAMESPACE));
    let config = FerryConfig::from_config_map(cm).expect("a good ferry-config");
    // The manifest states the defaults (external-snat aside, which has none).
    assert_eq!(
        FerryConfig {
            external_snat: None,
            ..config
        },
        FerryConfig::default()
    );
    let keys: BTreeSet<&str> = cm.data.iter().flatten().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            KEY_VXLAN_VNI,
            KEY_VXLAN_PORT,
            KEY_ENCAPSULATION,
            KEY_EXTERNAL_SNAT
        ])
    );
}

fn pod(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().expect("a pod spec")
}

fn agent(ds: &DaemonSet) -> &Container {
    let pod = pod(ds);
    assert_eq!(pod.containers.len(), 1);
    &pod.containers[0]
}

#[test]
fn daemon_set_runs_the_agent_on_every_node_in_the_host_network() {
    let m = load();
    let ds = m.daemon_set();
    let pod = pod(ds);
    assert_eq!(pod.host_network, Some(true));
    // A toleration with neither key nor effect tolerates every taint.
    assert!(pod.tolerations.iter().flatten().any(|t| {
        t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
    }));

    let c = agent(ds);
    let args: Vec<&str> = c.args.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        args,
        [
            "agent",
            "--node",
            "$(NODE_NAME)",
            "--datastore",
            "kubernetes",
            "--take-uplink",
            "--after-handover",
            "wait",
            "--healthz-addr",
            "[::]:10256",
            "--metrics-addr",
            "[::]:9250",
        ]
    );
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("kubernetes.io/os"))
            .map(String::as_str),
        Some("linux")
    );
    // The scrape annotations name the port of --metrics-addr.
    let annotations = ds
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .expect("the pod template's annotations");
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9250");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    // Every image is this version's.
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        assert_eq!(
            c.image.as_deref(),
            Some(concat!("ferry:", env!("CARGO_PKG_VERSION"))),
            "{}",
            c.name
        );
        // A port declared in the host network is a host port, which would keep the
        // update's second pod off the node.
        assert!(c.ports.is_none(), "{} declares ports", c.name);
    }
    // An update starts the new pod beside the old one, which hands the node over to it
    // (docs/agent.md, "Restarts and upgrades") and then waits to be stopped.
    let strategy = ds.spec.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().unwrap();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    let node = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME in the environment");
    let field = node
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");

    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(true));
    let caps: BTreeSet<&str> = sc
        .capabilities
        .iter()
        .flat_map(|c| c.add.iter().flatten())
        .map(String::as_str)
        .collect();
    assert_eq!(caps, BTreeSet::from(["NET_ADMIN", "NET_RAW", "SYS_ADMIN"]));

    // The probes ask the agent's health address, kube-proxy's paths.
    use k8s_openapi::api::core::v1::Probe;
    let http = |p: &Option<Probe>| {
        let g = p
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        (g.path.clone().unwrap_or_default(), g.port.clone())
    };
    let healthz = IntOrString::Int(10256);
    assert_eq!(http(&c.startup_probe), ("/livez".into(), healthz.clone()));
    assert_eq!(http(&c.liveness_probe), ("/livez".into(), healthz.clone()));
    assert_eq!(http(&c.readiness_probe), ("/healthz".into(), healthz));
    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
}

/// `(container mount path, host path, propagation)` of a container's hostPath mounts.
fn host_mounts(ds: &DaemonSet, c: &Container) -> BTreeSet<(String, String, Option<String>)> {
    let pod = pod(ds);
    c.volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let v = pod.volumes.iter().flatten().find(|v| v.name == m.name)?;
            let host = v.host_path.as_ref()?;
            Some((
                m.mount_path.clone(),
                host.path.clone(),
                m.mount_propagation.clone(),
            ))
        })
        .collect()
}

#[test]
fn daemon_set_mounts_what_the_agent_and_the_cni_install_use() {
    let m = load();
    let ds = m.daemon_set();
    let bidirectional = Some("Bidirectional".to_string());
    assert_eq!(
        host_mounts(ds, agent(ds)),
        BTreeSet::from([
            ("/dev/net/tun".into(), "/dev/net/tun".into(), None),
            (
                "/var/run/netns".into(),
                "/var/run/netns".into(),
                bidirectional
            ),
            ("/run/ferry".into(), "/run/ferry".into(), None),
        ])
    );
    let pod = pod(ds);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        host_mounts(ds, init),
        BTreeSet::from([
            ("/host/opt/cni/bin".into(), "/opt/cni/bin".into(), None),
            ("/host/etc/cni/net.d".into(), "/etc/cni/net.d".into(), None),
        ])
    );
    // ferry-cni installs itself and writes its conflist into the host's directories.
    let command = command_line(init);
    assert_eq!(&command[..2], ["ferry-cni", "install"]);
    assert_eq!(flag(&command, "--bin-dir"), "/host/opt/cni/bin");
    assert_eq!(flag(&command, "--conf-dir"), "/host/etc/cni/net.d");
}

/// A container's command and arguments, as one list.
fn command_line(c: &Container) -> Vec<&str> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .collect()
}

/// The value following `name` in `command`.
fn flag<'a>(command: &[&'a str], name: &str) -> &'a str {
    let at = command
        .iter()
        .position(|a| *a == name)
        .unwrap_or_else(|| panic!("no {name} in {command:?}"));
    command[at + 1]
}

#[test]
fn cni_install_points_the_plugin_at_the_agent_socket() {
    let m = load();
    let ds = m.daemon_set();
    let init = &pod(ds).init_containers.as_ref().unwrap()[0];
    // The conflist ferry-cni writes names this socket: it must be in the directory the
    // agent shares with the host, at the same path.
    let command = command_line(init);
    let socket = flag(&command, "--socket");
    assert_eq!(Path::new(socket).parent(), Some(Path::new("/run/ferry")));
    assert!(
        host_mounts(ds, agent(ds))
            .iter()
            .any(|(inside, host, _)| inside == "/run/ferry" && host == "/run/ferry")
    );
}
