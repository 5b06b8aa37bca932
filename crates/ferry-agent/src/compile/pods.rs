//! Pod ports: one per pod of this node that has addresses and an interface here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferry_datapath::{MacAddr, PortAddr, PortKind, PortSpec, TablesSpec};

use crate::cluster::{Cluster, ObjectKey};
use crate::fields::PodFields;

use super::{AttachedPod, read};

/// The MAC of the pods' gateway, as every pod sees it (the same on every pod port, as
/// Calico's `ee:ee:ee:ee:ee:ee`).
pub const POD_GATEWAY_MAC: MacAddr = MacAddr([0xee; 6]);

/// The MAC of a pod's eth0, derived from its first address so that the CNI plugin and
/// the tables agree without asking each other: `0a:58` and the four bytes of an IPv4
/// address (as the Kubernetes CNI plugins do), or of a hash of an IPv6 address. Locally
/// administered and unicast.
pub fn pod_mac(ip: IpAddr) -> MacAddr {
    let tail = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => v6
            .octets()
            .iter()
            .fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
            })
            .to_be_bytes(),
    };
    MacAddr([0x0a, 0x58, tail[0], tail[1], tail[2], tail[3]])
}

/// The name of a pod's port: `pod.NAMESPACE.NAME`, with anything a port name may not
/// hold replaced by `_` (unless a base port took it: see `port_name`).
pub fn pod_port(namespace: &str, name: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("pod.{}.{}", clean(namespace), clean(name))
}

/// [`pod_port`]. Namespaces have no dots, so two pods cannot collide; a base port could,
/// and then a suffix `.2`, `.3`... keeps the name unique.
fn port_name(key: &ObjectKey, taken: impl Fn(&str) -> bool) -> String {
    let name = pod_port(&key.namespace, &key.name);
    if !taken(&name) {
        return name;
    }
    (2..)
        .map(|i| format!("{name}.{i}"))
        .find(|n| !taken(n))
        .expect("some suffix is free")
}

/// Appends a port for each attached pod, ordered by namespace and name, and returns the
/// port names. A pod attached with addresses (by the CNI plugin, which allocated them)
/// gets them, also before its Pod object says them or exists in this node's view; one
/// attached without gets the addresses of its Pod object, which must be on `node`. Either
/// way a pod on the host network or finished gets none.
pub(super) fn add_ports(
    cluster: &Cluster,
    node: &str,
    attached: &[AttachedPod],
    tables: &mut TablesSpec,
) -> Result<BTreeMap<ObjectKey, String>, String> {
    let attached: BTreeMap<ObjectKey, &AttachedPod> = attached
        .iter()
        .map(|p| (ObjectKey::new(&p.namespace, &p.name), p))
        .collect();
    let mut names = BTreeMap::new();
    for (key, att) in attached {
        let fields = match cluster.pods.get(&key) {
            Some(pod) => Some((
                read(PodFields::parse(pod), &format_args!("Pod {key}"))?,
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node),
            )),
            None => None,
        };
        let ips = match (&fields, att.addresses.is_empty()) {
            // A finished pod's object, with the CNI plugin's addresses: a new sandbox of
            // a pod of that name (a StatefulSet's pod come back) before the watch brings
            // the new object. The attachment is the truth: it gets its port.
            (Some((f, _)), true) if f.finished => continue,
            (Some((f, _)), _) if f.host_network => continue,
            (_, false) => att.addresses.clone(),
            (Some((f, true)), true) => f.ips.clone(),
            _ => continue,
        };
        if ips.is_empty() {
            continue;
        }
        let name = port_name(&key, |n| tables.ports.iter().any(|p| p.name == n));
        tables.ports.push(PortSpec {
            name: name.clone(),
            kind: PortKind::Pod,
            mac: POD_GATEWAY_MAC,
            peer_mac: Some(pod_mac(ips[0])),
            addresses: ips.iter().copied().map(PortAddr::from).collect(),
            gso: true,
            ..PortSpec::default()
        });
        names.insert(key, name);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_mac_is_0a58_and_the_ipv4_address() {
        assert_eq!(
            pod_mac("10.244.1.5".parse().unwrap()).to_string(),
            "0a:58:0a:f4:01:05"
        );
    }

    #[test]
    fn pod_mac_of_ipv6_is_stable_locally_administered_unicast() {
        let a = pod_mac("fd00:10:244:1::5".parse().unwrap());
        assert_eq!(a, pod_mac("fd00:10:244:1::5".parse().unwrap()));
        assert_ne!(a, pod_mac("fd00:10:244:1::6".parse().unwrap()));
        assert_eq!(a.0[0] & 0b11, 0b10);
    }

    #[test]
    fn port_name_is_readable_and_unique() {
        let key = ObjectKey::new("default", "web-1");
        assert_eq!(port_name(&key, |_| false), "pod.default.web-1");
        assert_eq!(
            port_name(&key, |n| n == "pod.default.web-1"),
            "pod.default.web-1.2"
        );
        assert_eq!(
            port_name(&ObjectKey::new("a", "b:c"), |_| false),
            "pod.a.b_c"
        );
    }
}
