//! The audit log's lines: one JSON object each (see docs/policy.md, "Audit log").

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::SystemTime;

use ferry_datapath::policy::{Direction, Tier};
use ferry_datapath::{Addr, Denial, DeniedBy, FlowKey, proto, proto_name};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// What the log says of pods: this node's pods by the name of their port, and every pod
/// of the cluster by address (`namespace/name`).
#[derive(Clone, Debug, Default)]
pub struct Names {
    /// Pod ports of this node (`pod.NS.NAME`) -> `NS/NAME`.
    pub by_port: HashMap<String, String>,
    /// Pod addresses of the cluster -> `NS/NAME` (host-network and finished pods left
    /// out: their addresses are not theirs alone).
    pub by_address: HashMap<IpAddr, String>,
}

/// `t` in RFC 3339, UTC, with milliseconds (`2025-11-29T20:33:00.512Z`).
pub(super) fn rfc3339_ms(t: SystemTime) -> String {
    match Timestamp::try_from(t) {
        Ok(ts) => format!("{ts:.3}"),
        // Out of the range of years 1 to 9999: not a time a log line can have.
        Err(_) => "1970-01-01T00:00:00.000Z".into(),
    }
}

#[derive(Serialize)]
struct Endpoint<'a> {
    address: IpAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod: Option<&'a str>,
}

#[derive(Serialize)]
struct DeniedLine<'a> {
    time: String,
    node: &'a str,
    event: &'static str,
    direction: &'static str,
    protocol: Cow<'static, str>,
    src: Endpoint<'a>,
    dst: Endpoint<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    original_src: Option<Endpoint<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    original_dst: Option<Endpoint<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    icmp_type: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    icmp_code: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tier: Option<Tier>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    isolated_by: Vec<&'a str>,
}

#[derive(Serialize)]
struct NotLoggedLine<'a> {
    time: String,
    node: &'a str,
    event: &'static str,
    reason: &'static str,
    count: u64,
    message: String,
}

/// Why denials went unlogged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suppressed {
    /// More than the rate limit allows.
    Rate,
    /// The datapath's buffer was full when they came.
    Overflow,
}

impl Suppressed {
    /// `rate` or `overflow`: the `reason` of the line and of the metric.
    pub fn name(self) -> &'static str {
        match self {
            Suppressed::Rate => "rate",
            Suppressed::Overflow => "overflow",
        }
    }

    fn says(self) -> &'static str {
        match self {
            Suppressed::Rate => "rate limit",
            Suppressed::Overflow => "the dataplane's buffer of denials was full",
        }
    }
}

/// True for protocols with ports (those policy rules name ports of).
fn has_ports(p: u8) -> bool {
    matches!(p, proto::TCP | proto::UDP | proto::SCTP)
}

fn endpoint<'a>(
    names: &'a Names,
    addr: Addr,
    port: u16,
    p: u8,
    pod: Option<&'a str>,
) -> Endpoint<'a> {
    let address = IpAddr::from(addr);
    Endpoint {
        address,
        port: has_ports(p).then_some(port),
        pod: pod.or_else(|| names.by_address.get(&address).map(String::as_str)),
    }
}

/// The line of denial `d`, which happened at `time`, on `node`, without its newline.
pub(super) fn denied(d: &Denial, time: SystemTime, node: &str, names: &Names) -> String {
    let (k, o): (&FlowKey, &FlowKey) = (&d.key, &d.original);
    let p = k.proto;
    // The pod decided for is known by its port, whatever its address.
    let own = names.by_port.get(d.port_name()).map(String::as_str);
    let (src_pod, dst_pod) = match d.direction {
        Direction::Egress => (own, None),
        Direction::Ingress => (None, own),
    };
    let icmp = matches!(p, proto::ICMP | proto::ICMPV6);
    let by = d.denied_by();
    let (tier, policy, rule, isolated_by) = match &by {
        DeniedBy::Rule { tier, policy, rule } => (Some(*tier), Some(*policy), Some(*rule), vec![]),
        DeniedBy::Isolated(p) => (None, None, None, p.clone()),
    };
    let line = DeniedLine {
        time: rfc3339_ms(time),
        node,
        event: "connection_denied",
        direction: d.direction.name(),
        protocol: match proto_name(p) {
            "ip" => Cow::Owned(p.to_string()),
            name => Cow::Borrowed(name),
        },
        src: endpoint(names, k.src, k.src_port, p, src_pod),
        dst: endpoint(names, k.dst, k.dst_port, p, dst_pod),
        original_src: (o.src != k.src || o.src_port != k.src_port)
            .then(|| endpoint(names, o.src, o.src_port, p, None)),
        original_dst: (o.dst != k.dst || o.dst_port != k.dst_port)
            .then(|| endpoint(names, o.dst, o.dst_port, p, None)),
        icmp_type: k.icmp_type(),
        icmp_code: icmp.then_some(k.dst_port as u8),
        tier,
        policy,
        rule,
        isolated_by,
    };
    serde_json::to_string(&line).unwrap_or_default()
}

/// The line saying that `count` denials went unlogged for `why`.
pub(super) fn not_logged(time: SystemTime, node: &str, why: Suppressed, count: u64) -> String {
    let line = NotLoggedLine {
        time: rfc3339_ms(time),
        node,
        event: "denials_not_logged",
        reason: why.name(),
        count,
        message: format!("{count} denials not logged: {}", why.says()),
    };
    serde_json::to_string(&line).unwrap_or_default()
}
