//! The cluster's manifests, as the agents' file datastore reads them: Nodes, the
//! ferry-config ConfigMap, Services, Namespaces, Pods and their EndpointSlices.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::plan::{Plan, cluster_ip, node_port};
use crate::state::{DEFAULT_NAMESPACE, Pod, State};

/// The Nodes: pod CIDRs, addresses with their prefix, zone labels.
pub fn nodes(plan: &Plan) -> String {
    let mut out = String::new();
    for n in plan.node_numbers() {
        let z = plan.zone_of(n);
        let ip = plan.node_ip(n);
        let _ = write!(
            out,
            r#"---
apiVersion: v1
kind: Node
metadata:
  name: node{n}
  annotations:
    ferry.io/ipv4-address: {ip}/24
    ferry.io/ipv4-gateway: {gw}
    ferry.io/ipv6-address: {ip6}/64
    ferry.io/ipv6-gateway: {gw6}
  labels:
    topology.kubernetes.io/zone: {zone}
spec:
  podCIDR: {cidr}
  podCIDRs: [{cidr}, "{cidr6}"]
status:
  addresses:
  - {{ type: InternalIP, address: {ip} }}
  - {{ type: InternalIP, address: "{ip6}" }}
  - {{ type: Hostname, address: node{n} }}
"#,
            gw = Plan::gateway(z),
            zone = Plan::zone_name(z),
            cidr = Plan::pod_cidr(n),
            ip6 = plan.node_ip6(n),
            gw6 = Plan::gateway6(z),
            cidr6 = Plan::pod_cidr6(n),
        );
    }
    out
}

/// The Services and ferry-config (cross-subnet: VXLAN between zones, routed within one).
pub fn services() -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{ name: ferry-config, namespace: kube-system }}
data: {{ encapsulation: cross-subnet }}
---
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: default }}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: {web}
  clusterIPs: [{web}, "{web6}"]
  selector: {{ app: web }}
  ports:
  - {{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {wh} }}
  - {{ name: udp, protocol: UDP, port: 81, targetPort: 8081, nodePort: {wu} }}
---
apiVersion: v1
kind: Service
metadata: {{ name: web-local, namespace: default }}
spec:
  type: LoadBalancer
  clusterIP: {local}
  clusterIPs: [{local}]
  externalTrafficPolicy: Local
  healthCheckNodePort: {hc}
  selector: {{ app: web }}
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {lh} }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: web-ranged, namespace: default }}
spec:
  type: LoadBalancer
  clusterIP: {ranged}
  clusterIPs: [{ranged}]
  selector: {{ app: web }}
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {rh} }}]
  loadBalancerSourceRanges: ["{client}/32"]
status:
  loadBalancer:
    ingress: [{{ ip: {vip}, ipMode: VIP }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: zonal, namespace: default }}
spec:
  clusterIP: {zonal}
  clusterIPs: [{zonal}]
  trafficDistribution: PreferSameZone
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: nodal, namespace: default }}
spec:
  clusterIP: {nodal}
  clusterIPs: [{nodal}]
  trafficDistribution: PreferSameNode
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: multi-sticky, namespace: default }}
spec:
  clusterIP: {sticky}
  clusterIPs: [{sticky}]
  sessionAffinity: ClientIP
  selector: {{ app: multi }}
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: multi, namespace: default }}
spec:
  clusterIP: {multi}
  clusterIPs: [{multi}]
  selector: {{ app: multi }}
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: empty, namespace: default }}
spec:
  clusterIP: {empty}
  clusterIPs: [{empty}]
  selector: {{ app: nothing }}
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]
---
apiVersion: v1
kind: Service
metadata: {{ name: echo, namespace: default }}
spec:
  clusterIP: {echo}
  clusterIPs: [{echo}]
  selector: {{ app: echo }}
  ports: [{{ name: udp, protocol: UDP, port: 53, targetPort: 8081 }}]
"#,
        web = cluster_ip::WEB,
        web6 = cluster_ip::WEB6,
        local = cluster_ip::WEB_LOCAL,
        sticky = cluster_ip::MULTI_STICKY,
        multi = cluster_ip::MULTI,
        empty = cluster_ip::EMPTY,
        echo = cluster_ip::ECHO,
        ranged = cluster_ip::WEB_RANGED,
        zonal = cluster_ip::ZONAL,
        nodal = cluster_ip::NODAL,
        rh = node_port::WEB_RANGED_HTTP,
        client = crate::plan::CLIENT_IP,
        vip = crate::plan::VIP_ROUTED,
        wh = node_port::WEB_HTTP,
        wu = node_port::WEB_UDP,
        lh = node_port::WEB_LOCAL_HTTP,
        hc = node_port::WEB_LOCAL_HEALTH,
    )
}

/// The Pod objects, with the addresses the CNI plugin gave them: their labels (the lab's
/// own pods: `app`), and a container per served port with the port named as the
/// Kubernetes NetworkPolicy e2e tests name theirs (`serve-80-tcp`).
pub fn pods(state: &State) -> String {
    let mut out = String::new();
    for p in &state.pods {
        let ips: Vec<String> = p
            .ips
            .iter()
            .map(|ip| format!("{{ ip: \"{ip}\" }}"))
            .collect();
        let labels = match p.labels.is_empty() {
            true => BTreeMap::from([("app".to_string(), p.app.clone())]),
            false => p.labels.clone(),
        };
        let containers = if p.serves.is_empty() {
            "\n  - { name: main, image: ferry-serve }".to_string()
        } else {
            p.serves
                .iter()
                .map(|s| {
                    format!(
                        "\n  - name: cont-{port}-{proto}\n    image: ferry-serve\n    ports: [{{ name: {name}, containerPort: {port}, protocol: {kube} }}]",
                        port = s.port,
                        proto = s.proto.as_str(),
                        name = s.port_name(),
                        kube = s.proto.kube(),
                    )
                })
                .collect()
        };
        let _ = write!(
            out,
            r#"---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {labels}
spec:
  nodeName: node{node}
  containers:{containers}
status:
  phase: Running
  podIP: "{ip}"
  podIPs: [{ips}]
"#,
            name = json(&p.name),
            ns = json(&p.namespace),
            labels = json(&labels),
            node = p.node,
            ip = p.ips[0],
            ips = ips.join(", "),
        );
    }
    out
}

/// A value as YAML: JSON is YAML, and quotes whatever needs it.
fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The labels of namespace `name`: `labels`, and `kubernetes.io/metadata.name` set to its
/// name as the API server sets it.
pub fn namespace_labels(name: &str, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut l = labels.clone();
    l.insert(NAME_LABEL.to_string(), name.to_string());
    l
}

/// The label the API server gives every namespace, its name.
pub const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The Namespace objects: `default`, and those of `state` with their labels.
pub fn namespaces(state: &State) -> String {
    let mut all = state.namespaces.clone();
    all.entry(DEFAULT_NAMESPACE.to_string())
        .or_insert_with(|| namespace_labels(DEFAULT_NAMESPACE, &BTreeMap::new()));
    let mut out = String::new();
    for (name, labels) in &all {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels: {}\n",
            json(name),
            json(&namespace_labels(name, labels)),
        );
    }
    out
}

/// The EndpointSlice of every Service: the ready pods its selector picks.
pub fn slices(state: &State) -> String {
    let services: [(&str, &str, &str); 7] = [
        (
            "web",
            "web",
            "[{ name: http, protocol: TCP, port: 8080 }, { name: udp, protocol: UDP, port: 8081 }]",
        ),
        (
            "web-local",
            "web",
            "[{ name: http, protocol: TCP, port: 8080 }]",
        ),
        (
            "web-ranged",
            "web",
            "[{ name: http, protocol: TCP, port: 8080 }]",
        ),
        (
            "multi-sticky",
            "multi",
            "[{ name: http, protocol: TCP, port: 8080 }]",
        ),
        (
            "multi",
            "multi",
            "[{ name: http, protocol: TCP, port: 8080 }]",
        ),
        (
            "empty",
            "nothing",
            "[{ name: http, protocol: TCP, port: 8080 }]",
        ),
        ("echo", "echo", "[{ name: udp, protocol: UDP, port: 8081 }]"),
    ];
    // `web` is dual-stack: its IPv6 endpoints in a slice of their own.
    let web6: Vec<String> = state
        .pods
        .iter()
        .filter(|p| p.app == "web" && p.ready && p.namespace == DEFAULT_NAMESPACE)
        .filter_map(|p| {
            let v6 = p.ips.iter().find(|a| a.contains(':'))?;
            Some(format!(
                "{{ addresses: [\"{v6}\"], conditions: {{ ready: true }}, nodeName: node{} }}",
                p.node
            ))
        })
        .collect();
    let mut out = format!(
        r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-lab-v6
  namespace: default
  labels: {{ kubernetes.io/service-name: web }}
addressType: IPv6
ports: {}
endpoints: [{}]
"#,
        services[0].2,
        web6.join(", ")
    );
    for (service, app, ports) in services {
        let endpoints: Vec<String> = state
            .pods
            .iter()
            .filter(|p| p.app == app && p.ready && p.namespace == DEFAULT_NAMESPACE)
            .map(endpoint)
            .collect();
        let _ = write!(
            out,
            r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-lab
  namespace: default
  labels: {{ kubernetes.io/service-name: {service} }}
addressType: IPv4
ports: {ports}
endpoints: [{endpoints}]
"#,
            endpoints = endpoints.join(", "),
        );
    }
    // `zonal` and `nodal` have no selector: their slice holds web and the multi pods,
    // with the hints the EndpointSlice controller writes for their trafficDistribution
    // (PreferSameZone: each endpoint for its own zone; PreferSameNode: for its own node,
    // and its zone for proxies that read only zone hints).
    for (service, nodes) in [("zonal", false), ("nodal", true)] {
        let endpoints: Vec<String> = state
            .pods
            .iter()
            .filter(|p| {
                matches!(p.app.as_str(), "web" | "multi")
                    && p.ready
                    && p.namespace == DEFAULT_NAMESPACE
            })
            .map(|p| {
                let zone = Plan::zone_name(state.plan.zone_of(p.node));
                let for_nodes = if nodes {
                    format!(", forNodes: [{{ name: node{} }}]", p.node)
                } else {
                    String::new()
                };
                let v4 = p.ips.iter().find(|a| !a.contains(':')).unwrap_or(&p.ips[0]);
                format!(
                    "{{ addresses: [{v4}], conditions: {{ ready: true }}, nodeName: node{}, zone: {zone}, hints: {{ forZones: [{{ name: {zone} }}]{for_nodes} }} }}",
                    p.node
                )
            })
            .collect();
        let _ = write!(
            out,
            r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-lab
  namespace: default
  labels: {{ kubernetes.io/service-name: {service} }}
addressType: IPv4
ports: [{{ name: http, protocol: TCP, port: 8080 }}]
endpoints: [{endpoints}]
"#,
            endpoints = endpoints.join(", "),
        );
    }
    out
}

/// An IPv4 endpoint: the slices are of `addressType: IPv4`.
fn endpoint(p: &Pod) -> String {
    let v4 = p.ips.iter().find(|a| !a.contains(':')).unwrap_or(&p.ips[0]);
    format!(
        "{{ addresses: [{v4}], conditions: {{ ready: true }}, nodeName: node{} }}",
        p.node
    )
}

/// Node `n`'s base tables: the uplink with a default route through its zone's router,
/// and the host port giving the node's kernel its address (docs/node.md).
pub fn base(plan: &Plan, n: u8) -> String {
    let ip = plan.node_ip(n);
    format!(
        r#"ports:
  - {{ name: uplink, kind: uplink, mac: "{up}", addresses: [{ip}/24, "{ip6}/64"] }}
  - {{ name: host, kind: host, mac: "02:fe:00:00:01:{n:02x}", addresses: [169.254.1.1] }}
routes:
  - {{ prefix: {ip}/32, port: host, next_hop_mac: "{host}" }}
  - {{ prefix: 0.0.0.0/0, port: uplink, via: {gw} }}
  - {{ prefix: "::/0", port: uplink, via: "{gw6}" }}
"#,
        ip6 = plan.node_ip6(n),
        gw6 = Plan::gateway6(plan.zone_of(n)),
        up = uplink_mac(n),
        host = host_tap_mac(n),
        gw = Plan::gateway(plan.zone_of(n)),
    )
}

/// Node `n`'s uplink MAC.
pub fn uplink_mac(n: u8) -> String {
    format!("02:fe:00:00:00:{n:02x}")
}

/// The MAC of node `n`'s kernel on the host TAP.
pub fn host_tap_mac(n: u8) -> String {
    format!("02:aa:00:00:00:{n:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Served;

    fn state() -> State {
        let pod = |ns: &str, name: &str, serves: &[&str]| Pod {
            name: name.into(),
            namespace: ns.into(),
            labels: if serves.is_empty() {
                BTreeMap::new()
            } else {
                BTreeMap::from([("pod".to_string(), name.to_string())])
            },
            serves: serves
                .iter()
                .map(|s| s.parse::<Served>().unwrap())
                .collect(),
            node: 1,
            app: if serves.is_empty() { "web" } else { "" }.into(),
            netns: String::new(),
            container_id: String::new(),
            ips: vec!["10.244.1.2".into(), "fd00:244:1::2".into()],
            ready: true,
        };
        State {
            plan: Plan::new("t", 2, 1).unwrap(),
            ferry: "ferry".into(),
            cni: "ferry-cni".into(),
            processes: Vec::new(),
            pods: vec![
                pod(DEFAULT_NAMESPACE, "web", &[]),
                pod("x", "a", &["tcp/80", "udp/81"]),
            ],
            namespaces: BTreeMap::from([(
                "x".to_string(),
                BTreeMap::from([("ns".to_string(), "x".to_string())]),
            )]),
            agents: Vec::new(),
        }
    }

    #[test]
    fn pods_carry_their_namespace_labels_and_named_container_ports() {
        let text = pods(&state());
        assert!(
            text.contains(
                "  name: \"web\"\n  namespace: \"default\"\n  labels: {\"app\":\"web\"}\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  name: \"a\"\n  namespace: \"x\"\n  labels: {\"pod\":\"a\"}\n"),
            "{text}"
        );
        assert!(text.contains("  - name: cont-80-tcp\n    image: ferry-serve\n    ports: [{ name: serve-80-tcp, containerPort: 80, protocol: TCP }]\n"), "{text}");
        assert!(
            text.contains("ports: [{ name: serve-81-udp, containerPort: 81, protocol: UDP }]"),
            "{text}"
        );
        assert!(
            text.contains("  - { name: main, image: ferry-serve }\n"),
            "{text}"
        );
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs[1]["spec"]["containers"][1]["ports"][0]["name"],
            "serve-81-udp"
        );
        assert_eq!(docs[1]["metadata"]["labels"]["pod"], "a");
    }

    #[test]
    fn namespaces_have_their_name_label_and_default_is_always_there() {
        let text = namespaces(&state());
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["metadata"]["name"], "default");
        assert_eq!(
            docs[0]["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "default"
        );
        assert_eq!(docs[1]["kind"], "Namespace");
        assert_eq!(docs[1]["metadata"]["labels"]["ns"], "x");
        assert_eq!(
            docs[1]["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "x"
        );
    }

    #[test]
    fn only_default_pods_are_service_endpoints() {
        let mut s = state();
        s.pods[1].app = "web".into();
        let text = slices(&s);
        // web, web-local and web-ranged select it; zonal and nodal hold it.
        assert_eq!(text.matches("10.244.1.2").count(), 5, "{text}");
    }
}
