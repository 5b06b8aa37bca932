//! Cluster-wide settings: the `kube-system/ferry-config` ConfigMap.

use ferry_datapath::{DEFAULT_VNI, DEFAULT_VXLAN_PORT, MAX_VNI, ModeSpec};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::cluster::Cluster;
use crate::fields::{FieldError, describe};

/// The namespace of ferry's ConfigMap.
pub const CONFIG_NAMESPACE: &str = "kube-system";
/// The name of ferry's ConfigMap.
pub const CONFIG_NAME: &str = "ferry-config";
/// Key: the overlay's VXLAN network identifier (default 4096).
pub const KEY_VXLAN_VNI: &str = "vxlan-vni";
/// Key: the overlay's UDP port (default 4789).
pub const KEY_VXLAN_PORT: &str = "vxlan-port";
/// Key: when to encapsulate, `always`, `cross-subnet` or `never` (default cross-subnet).
pub const KEY_ENCAPSULATION: &str = "encapsulation";
/// Key: `"true"` or `"false"`, the default of every Service's `external_snat`.
pub const KEY_EXTERNAL_SNAT: &str = "external-snat";
/// Key: `allow` (default) or `policy`: whether the node's own stack (kubelet probes,
/// host-network pods) reaches its pods whatever their ingress policy.
pub const KEY_POLICY_HOST_TO_PODS: &str = "policy-host-to-pods";
/// Key: `keep` (default) or `reevaluate`: what a policy change does to tracked
/// connections it no longer allows.
pub const KEY_POLICY_ON_CHANGE: &str = "policy-on-change";
/// Key: the uplink's interface name, or several separated by commas (the first that
/// exists on a node is its uplink), for agents not given `--uplink`; default: detected.
pub const KEY_UPLINK: &str = "uplink";

const KEYS: [&str; 7] = [
    KEY_VXLAN_VNI,
    KEY_VXLAN_PORT,
    KEY_ENCAPSULATION,
    KEY_EXTERNAL_SNAT,
    KEY_POLICY_HOST_TO_PODS,
    KEY_POLICY_ON_CHANGE,
    KEY_UPLINK,
];

/// The settings `kube-system/ferry-config` gives, with their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FerryConfig {
    /// VXLAN network identifier.
    pub vxlan_vni: u32,
    /// VXLAN UDP port.
    pub vxlan_port: u16,
    /// When to encapsulate.
    pub encapsulation: ModeSpec,
    /// The cluster-wide default of `external_snat`, when the ConfigMap sets one.
    pub external_snat: Option<bool>,
    /// The node's own stack reaches its pods whatever their ingress policy.
    pub policy_host_to_pods: bool,
    /// A policy change ends the tracked connections it no longer allows.
    pub policy_reevaluate: bool,
    /// The uplink's interface names to try, in order; empty: detected.
    pub uplink: Vec<String>,
}

impl Default for FerryConfig {
    fn default() -> FerryConfig {
        FerryConfig {
            vxlan_vni: DEFAULT_VNI,
            vxlan_port: DEFAULT_VXLAN_PORT,
            // Cross-subnet, as Calico's VXLANCrossSubnet: nodes that share a subnet talk
            // directly, without the overhead.
            encapsulation: ModeSpec::CrossSubnet,
            external_snat: None,
            // As Calico and Cilium: kubelet probes must reach isolated pods.
            policy_host_to_pods: true,
            // As Calico and Antrea: a change meets new connections only.
            policy_reevaluate: false,
            uplink: Vec::new(),
        }
    }
}

/// `uplink`: interface names separated by commas, each one Linux takes (1 to 15 bytes,
/// no `/`, `:` or white space, not `.` or `..`).
fn parse_uplink(v: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for name in v.split(',').map(str::trim) {
        let ok = !name.is_empty()
            && name.len() <= 15
            && name != "."
            && name != ".."
            && !name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if !ok {
            return Err(format!(
                "{v:?}: expected interface names separated by commas (each 1 to 15 bytes, no '/', ':' or spaces)"
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

impl FerryConfig {
    /// Reads the ConfigMap's `data`; the errors name every bad value. Unknown keys are
    /// ignored: a key a newer agent reads must not stop an older one during an upgrade
    /// ([`FerryConfig::unknown_keys`] names them, to be warned about).
    pub fn from_config_map(cm: &ConfigMap) -> Result<FerryConfig, Vec<FieldError>> {
        let mut c = FerryConfig::default();
        let mut errors = Vec::new();
        for (k, v) in cm.data.iter().flatten() {
            let field = format!("data.{k}");
            let r = match k.as_str() {
                KEY_VXLAN_VNI => match v.parse::<u32>() {
                    Ok(n) if n <= MAX_VNI => {
                        c.vxlan_vni = n;
                        Ok(())
                    }
                    _ => Err(format!("{v:?}: expected a number 0-{MAX_VNI}")),
                },
                KEY_VXLAN_PORT => match v.parse::<u16>() {
                    Ok(n) if n != 0 => {
                        c.vxlan_port = n;
                        Ok(())
                    }
                    _ => Err(format!("{v:?}: expected a port 1-65535")),
                },
                KEY_ENCAPSULATION => match v.as_str() {
                    "always" => Ok(ModeSpec::Always),
                    "cross-subnet" => Ok(ModeSpec::CrossSubnet),
                    "never" => Ok(ModeSpec::Never),
                    _ => Err(format!("{v:?}: expected always, cross-subnet or never")),
                }
                .map(|m| c.encapsulation = m),
                KEY_EXTERNAL_SNAT => match v.as_str() {
                    "true" => Ok(true),
                    "false" => Ok(false),
                    _ => Err(format!("{v:?}: expected \"true\" or \"false\"")),
                }
                .map(|b| c.external_snat = Some(b)),
                KEY_POLICY_HOST_TO_PODS => match v.as_str() {
                    "allow" => Ok(true),
                    "policy" => Ok(false),
                    _ => Err(format!("{v:?}: expected allow or policy")),
                }
                .map(|b| c.policy_host_to_pods = b),
                KEY_POLICY_ON_CHANGE => match v.as_str() {
                    "keep" => Ok(false),
                    "reevaluate" => Ok(true),
                    _ => Err(format!("{v:?}: expected keep or reevaluate")),
                }
                .map(|b| c.policy_reevaluate = b),
                KEY_UPLINK => parse_uplink(v).map(|names| c.uplink = names),
                _ => Ok(()),
            };
            if let Err(m) = r {
                errors.push(FieldError::new(field, m));
            }
        }
        if errors.is_empty() {
            Ok(c)
        } else {
            Err(errors)
        }
    }

    /// The keys of the ConfigMap's `data` that ferry does not read: a misspelt key, or
    /// one of a newer version. They leave the default in force, so they are worth a
    /// warning.
    pub fn unknown_keys(cm: &ConfigMap) -> Vec<FieldError> {
        cm.data
            .iter()
            .flatten()
            .filter(|(k, _)| !KEYS.contains(&k.as_str()))
            .map(|(k, _)| {
                FieldError::new(
                    format!("data.{k}"),
                    format!("unknown key, ignored (known: {})", KEYS.join(", ")),
                )
            })
            .collect()
    }

    /// The cluster's settings: from `kube-system/ferry-config` when it exists, else the
    /// defaults. The error names the ConfigMap and the key.
    pub fn of(cluster: &Cluster) -> Result<FerryConfig, String> {
        match cluster.config_map(CONFIG_NAMESPACE, CONFIG_NAME) {
            None => Ok(FerryConfig::default()),
            Some(cm) => FerryConfig::from_config_map(cm).map_err(|e| {
                describe(
                    &format_args!("ConfigMap {CONFIG_NAMESPACE}/{CONFIG_NAME}"),
                    &e,
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn defaults_are_calico_like() {
        let c = FerryConfig::from_config_map(&cm(&[])).unwrap();
        assert_eq!(
            c,
            FerryConfig {
                vxlan_vni: 4096,
                vxlan_port: 4789,
                encapsulation: ModeSpec::CrossSubnet,
                external_snat: None,
                policy_host_to_pods: true,
                policy_reevaluate: false,
                uplink: vec![],
            }
        );
    }

    #[test]
    fn every_key_is_read() {
        let c = FerryConfig::from_config_map(&cm(&[
            ("vxlan-vni", "7"),
            ("vxlan-port", "8472"),
            ("encapsulation", "always"),
            ("external-snat", "true"),
            ("policy-host-to-pods", "policy"),
            ("policy-on-change", "reevaluate"),
            ("uplink", "ens5, eth0"),
        ]))
        .unwrap();
        assert_eq!(c.uplink, ["ens5", "eth0"]);
        assert_eq!(
            (c.vxlan_vni, c.vxlan_port, c.encapsulation, c.external_snat),
            (7, 8472, ModeSpec::Always, Some(true))
        );
        assert_eq!((c.policy_host_to_pods, c.policy_reevaluate), (false, true));
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = FerryConfig::from_config_map(&cm(&[
            ("vxlan-vni", "16777216"),
            ("vxlan-port", "0"),
            ("encapsulation", "sometimes"),
            ("vxlan-vnii", "1"),
            ("policy-host-to-pods", "deny"),
            ("policy-on-change", "cut"),
            ("uplink", "eth0,,eth1"),
        ]))
        .unwrap_err();
        let fields: Vec<_> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "data.encapsulation",
                "data.policy-host-to-pods",
                "data.policy-on-change",
                "data.uplink",
                "data.vxlan-port",
                "data.vxlan-vni"
            ]
        );
    }

    #[test]
    fn unknown_keys_are_ignored_and_named() {
        // A key a newer agent reads, in a cluster that still runs this one.
        let m = cm(&[("vxlan-port", "8472"), ("vxlan-mtu", "1400"), ("a", "")]);
        let c = FerryConfig::from_config_map(&m).unwrap();
        assert_eq!(c.vxlan_port, 8472);
        let unknown: Vec<String> = FerryConfig::unknown_keys(&m)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            unknown,
            [
                "data.a: unknown key, ignored (known: vxlan-vni, vxlan-port, encapsulation, external-snat, policy-host-to-pods, policy-on-change, uplink)",
                "data.vxlan-mtu: unknown key, ignored (known: vxlan-vni, vxlan-port, encapsulation, external-snat, policy-host-to-pods, policy-on-change, uplink)",
            ]
        );
    }
}
