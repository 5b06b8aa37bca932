//! The specification's Result: what ADD prints, and what CHECK reads back from
//! `prevResult`.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::config::Dns;
use crate::error::{Error, code};
use crate::version::Version;

/// The interface one ADD made, as the result describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// Its MAC, from the agent.
    pub mac: Option<String>,
    /// Its MTU, from the agent (written for 1.1.0 and later).
    pub mtu: Option<u16>,
    /// `CNI_NETNS`.
    pub sandbox: String,
    /// Its addresses, with their subnets' prefix lengths.
    pub addresses: Vec<IpNet>,
    /// The gateways the agent gave, at most one per family.
    pub gateways: Vec<IpAddr>,
}

/// ADD's result in `version`'s format.
///
/// A `prevResult` (when ferry-cni runs after another plugin in a chain) is passed on
/// with this interface, its addresses and default routes appended, and whatever else it
/// holds untouched; `dns` from the configuration, if set, replaces its DNS.
pub fn add_result(
    version: Version,
    prev: Option<&Map<String, Value>>,
    attached: &Attached,
    dns: &Dns,
) -> Value {
    let mut out = prev.cloned().unwrap_or_default();
    out.insert("cniVersion".into(), json!(version.as_str()));

    let interfaces = array(&mut out, "interfaces");
    let index = interfaces.len();
    let mut interface = json!({ "name": attached.ifname });
    if let Some(mac) = &attached.mac {
        interface["mac"] = json!(mac);
    }
    if let (Some(mtu), true) = (attached.mtu, version >= Version::V1_1_0) {
        interface["mtu"] = json!(mtu);
    }
    interface["sandbox"] = json!(attached.sandbox);
    interfaces.push(interface);

    let gateway_for = |ip: IpAddr| {
        attached
            .gateways
            .iter()
            .copied()
            .find(|g| g.is_ipv4() == ip.is_ipv4())
    };
    let ips = array(&mut out, "ips");
    for address in &attached.addresses {
        let mut ip = Map::new();
        if version < Version::V1_0_0 {
            let family = if address.addr().is_ipv4() { "4" } else { "6" };
            ip.insert("version".into(), json!(family));
        }
        ip.insert("address".into(), json!(address.to_string()));
        if let Some(gw) = gateway_for(address.addr()) {
            ip.insert("gateway".into(), json!(gw.to_string()));
        }
        ip.insert("interface".into(), json!(index));
        ips.push(Value::Object(ip));
    }

    let routes = array(&mut out, "routes");
    for address in &attached.addresses {
        if let Some(gw) = gateway_for(address.addr()) {
            let dst = if gw.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
            routes.push(json!({ "dst": dst, "gw": gw.to_string() }));
        }
    }
    if routes.is_empty() {
        out.remove("routes");
    }

    if *dns != Dns::default() || !out.contains_key("dns") {
        out.insert(
            "dns".into(),
            serde_json::to_value(dns).expect("DNS serializes"),
        );
    }
    Value::Object(out)
}

/// The array under `key`, made if missing (or replaced if not an array: a previous
/// result that broken would not have passed the runtime).
fn array<'a>(obj: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let slot = obj.entry(key).or_insert_with(|| json!([]));
    if !slot.is_array() {
        *slot = json!([]);
    }
    slot.as_array_mut().expect("made an array above")
}

/// What a `prevResult` says one attachment should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The interface's MAC, if the result gives one.
    pub mac: Option<String>,
    /// The interface's addresses.
    pub addresses: Vec<IpAddr>,
}

#[derive(Deserialize)]
struct PrevResult {
    #[serde(default)]
    interfaces: Vec<PrevInterface>,
    #[serde(default)]
    ips: Vec<PrevIp>,
}

#[derive(Deserialize)]
struct PrevInterface {
    name: String,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct PrevIp {
    address: String,
    #[serde(default)]
    interface: Option<usize>,
}

/// The interface `ifname` in `netns` and its addresses, as `prev` lists them.
pub fn expected(prev: &Map<String, Value>, ifname: &str, netns: &str) -> Result<Expected, Error> {
    let prev: PrevResult =
        serde_path_to_error::deserialize(Value::Object(prev.clone())).map_err(|e| {
            Error::new(
                code::DECODING_FAILURE,
                format!("prevResult's {} does not decode", e.path()),
                e.inner().to_string(),
            )
        })?;
    let index = prev
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox.as_deref() == Some(netns))
        .ok_or_else(|| {
            Error::new(
                code::CHECK_FAILED,
                format!("prevResult has no interface {ifname} in {netns}"),
                "",
            )
        })?;
    let mut addresses = Vec::new();
    for ip in prev.ips.iter().filter(|ip| ip.interface == Some(index)) {
        let net: IpNet = ip.address.parse().map_err(|e| {
            Error::new(
                code::DECODING_FAILURE,
                format!("prevResult's address {:?} is not ADDR/LEN", ip.address),
                format!("{e}"),
            )
        })?;
        addresses.push(net.addr());
    }
    Ok(Expected {
        mac: prev.interfaces[index].mac.clone(),
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attached() -> Attached {
        Attached {
            ifname: "eth0".into(),
            mac: Some("0a:58:0a:f4:01:02".into()),
            mtu: Some(1450),
            sandbox: "/var/run/netns/pod".into(),
            addresses: vec![
                "10.244.1.2/24".parse().unwrap(),
                "fd00:10:244:1::2/64".parse().unwrap(),
            ],
            gateways: vec!["fe80::1".parse().unwrap(), "169.254.1.1".parse().unwrap()],
        }
    }

    #[test]
    fn test_add_result_1_1_0_has_interface_mtu_and_routes_per_family() {
        let r = add_result(Version::V1_1_0, None, &attached(), &Dns::default());
        assert_eq!(
            r,
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{
                    "name": "eth0",
                    "mac": "0a:58:0a:f4:01:02",
                    "mtu": 1450,
                    "sandbox": "/var/run/netns/pod"
                }],
                "ips": [
                    {"address": "10.244.1.2/24", "gateway": "169.254.1.1", "interface": 0},
                    {"address": "fd00:10:244:1::2/64", "gateway": "fe80::1", "interface": 0}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "169.254.1.1"},
                    {"dst": "::/0", "gw": "fe80::1"}
                ],
                "dns": {}
            })
        );
    }

    #[test]
    fn test_add_result_1_0_0_has_no_mtu_and_0_4_0_has_ip_versions() {
        let r = add_result(Version::V1_0_0, None, &attached(), &Dns::default());
        assert_eq!(r["cniVersion"], "1.0.0");
        assert!(r["interfaces"][0].get("mtu").is_none());
        assert!(r["ips"][0].get("version").is_none());
        let r = add_result(Version::V0_4_0, None, &attached(), &Dns::default());
        assert_eq!(r["cniVersion"], "0.4.0");
        assert!(r["interfaces"][0].get("mtu").is_none());
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["ips"][1]["version"], "6");
    }

    #[test]
    fn test_add_result_without_gateways_has_no_routes() {
        let mut a = attached();
        a.gateways.clear();
        a.mac = None;
        let r = add_result(Version::V1_1_0, None, &a, &Dns::default());
        assert!(r.get("routes").is_none());
        assert!(r["ips"][0].get("gateway").is_none());
        assert!(r["interfaces"][0].get("mac").is_none());
    }

    #[test]
    fn test_add_result_appends_to_a_previous_result_and_keeps_its_fields() {
        let prev = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "lo-thing", "socketPath": "/x"}],
            "ips": [{"address": "192.0.2.1/24", "interface": 0}],
            "routes": [{"dst": "192.0.2.0/24", "table": 7}],
            "dns": {"nameservers": ["192.0.2.53"]},
            "custom": true
        });
        let r = add_result(
            Version::V1_1_0,
            prev.as_object(),
            &attached(),
            &Dns::default(),
        );
        assert_eq!(r["interfaces"].as_array().unwrap().len(), 2);
        assert_eq!(r["interfaces"][0]["socketPath"], "/x");
        assert_eq!(r["ips"][1]["interface"], 1);
        assert_eq!(r["ips"][2]["interface"], 1);
        assert_eq!(r["routes"][0]["table"], 7);
        assert_eq!(r["routes"].as_array().unwrap().len(), 3);
        assert_eq!(r["dns"]["nameservers"][0], "192.0.2.53");
        assert_eq!(r["custom"], true);
        // The configuration's DNS wins.
        let dns = Dns {
            nameservers: vec!["10.96.0.10".into()],
            ..Dns::default()
        };
        let r = add_result(Version::V1_1_0, prev.as_object(), &attached(), &dns);
        assert_eq!(r["dns"], json!({"nameservers": ["10.96.0.10"]}));
    }

    #[test]
    fn test_expected_reads_the_interface_and_its_addresses_back() {
        let r = add_result(Version::V0_4_0, None, &attached(), &Dns::default());
        let e = expected(r.as_object().unwrap(), "eth0", "/var/run/netns/pod").unwrap();
        assert_eq!(
            e,
            Expected {
                mac: Some("0a:58:0a:f4:01:02".into()),
                addresses: vec![
                    "10.244.1.2".parse().unwrap(),
                    "fd00:10:244:1::2".parse().unwrap()
                ],
            }
        );
    }

    #[test]
    fn test_expected_without_the_interface_is_a_check_failure() {
        let r = add_result(Version::V1_1_0, None, &attached(), &Dns::default());
        let obj = r.as_object().unwrap();
        for (ifname, netns) in [("eth1", "/var/run/netns/pod"), ("eth0", "/var/run/netns/x")] {
            let e = expected(obj, ifname, netns).unwrap_err();
            assert_eq!(e.code, code::CHECK_FAILED);
        }
    }

    #[test]
    fn test_undecodable_prev_result_is_code_6() {
        for prev in [
            json!({"interfaces": [{"mac": "x"}]}),
            json!({"interfaces": [{"name": "eth0", "sandbox": "/n"}],
                   "ips": [{"address": "10.0.0.1", "interface": 0}]}),
            json!({"ips": "none"}),
        ] {
            let e = expected(prev.as_object().unwrap(), "eth0", "/n").unwrap_err();
            assert_eq!(e.code, code::DECODING_FAILURE, "{prev}");
        }
    }
}
