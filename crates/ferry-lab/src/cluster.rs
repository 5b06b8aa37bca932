//! The cluster's manifests, as the agents' file datastore reads them: Nodes, the
//! ferry-config ConfigMap, Services, Pods and their EndpointSlices.

use std::fmt::Write;

use crate::plan::{Plan, cluster_ip, node_port};
use crate::state::{Pod, State};

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
        wh = node_port::WEB_HTTP,
        wu = node_port::WEB_UDP,
        lh = node_port::WEB_LOCAL_HTTP,
        hc = node_port::WEB_LOCAL_HEALTH,
    )
}

/// The Pod objects, with the addresses the CNI plugin gave them.
pub fn pods(state: &State) -> String {
    let mut out = String::new();
    for p in &state.pods {
        let ips: Vec<String> = p
            .ips
            .iter()
            .map(|ip| format!("{{ ip: \"{ip}\" }}"))
            .collect();
        let _ = write!(
            out,
            r#"---
apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: default, labels: {{ app: {app} }} }}
spec:
  nodeName: node{node}
  containers: [{{ name: main, image: ferry-serve }}]
status:
  phase: Running
  podIP: "{ip}"
  podIPs: [{ips}]
"#,
            name = p.name,
            app = p.app,
            node = p.node,
            ip = p.ips[0],
            ips = ips.join(", "),
        );
    }
    out
}

/// The EndpointSlice of every Service: the ready pods its selector picks.
pub fn slices(state: &State) -> String {
    let services: [(&str, &str, &str); 6] = [
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
        .filter(|p| p.app == "web" && p.ready)
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
            .filter(|p| p.app == app && p.ready)
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
