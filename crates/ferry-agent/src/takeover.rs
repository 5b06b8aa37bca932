//! Taking the uplink: the node's own stack (its addresses, routes and permanent
//! neighbours on the uplink) moved onto the host TAP, where ferry carries it, and given
//! back to the uplink as it was.
//!
//! ferry reads the uplink through AF_PACKET and keeps the kernel off it
//! ([`ferry_linux::tc::IngressDrop`]), so the node's kubelet, its SSH and every
//! host-network process would lose the network with the uplink. `--take-uplink` moves
//! what the kernel has on the uplink to the host TAP instead, the way OVS users move a
//! NIC's address onto the bridge's internal port:
//!
//! 1. [`read`] records the uplink's global addresses (with their prefixes), its unicast
//!    routes of every table but `local`, and its permanent neighbours, in the state
//!    directory ([`save`]) before anything changes, so that the node can be given back
//!    whatever happens next (a crash, a handover, the next agent).
//! 2. The tables ([`crate::compile::TakenStack`]) give ferry those addresses on its
//!    uplink port, the routes and neighbours, and a host port answering as the
//!    link-local gateway 169.254.1.1 (fe80::1), with a route of each node address to the
//!    kernel's side of the TAP.
//! 3. Once ferry forwards, [`take_script`] puts each address on the TAP (with its prefix,
//!    `noprefixroute`), replaces each route by one through ferry's gateway on the TAP
//!    (same destination, table and metric, so the kernel swaps them in place), and only
//!    then removes the addresses from the uplink. Sockets are bound to addresses, not to
//!    interfaces: established connections (kubelet to the API server, an SSH session)
//!    carry on, losing at most what was in flight during those few milliseconds.
//! 4. [`give_back_script`] undoes it in the reverse order: the addresses and routes back
//!    on the uplink, then off the TAP. The agent does it when it stops without handing
//!    the node to another agent; an agent that hands over leaves the stack on the TAP for
//!    the next, and one that crashed leaves the record for the next to take up.
//!
//! The steps run through the `ip` command (`ip -json` to read, `ip -batch -` to write),
//! as the agent's other rare set-up steps do ([`ferry_linux::link`]): a few dozen
//! lines at start and stop, whose errors are `ip`'s own messages.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use ferry_datapath::{GATEWAY_V4, GATEWAY_V6, MacAddr};
use ferry_linux::cmd::Cmd;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The record of a taken uplink in the state directory.
pub const RECORD_FILE: &str = "uplink.json";

/// The record's format version.
pub const RECORD_VERSION: u32 = 1;

/// The default `--host-tap` of a taken uplink.
pub const DEFAULT_HOST_TAP: &str = "ferry0";

/// The MAC of the kernel's side of the host TAP: any address does on that two-ended
/// link; this one is locally administered and says whose it is.
pub const HOST_TAP_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x00, 0x00, 0x00, 0x01]);

/// What was on the uplink before ferry took it, and where it went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taken {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The uplink's interface.
    pub uplink: String,
    /// The host TAP the stack went to.
    pub tap: String,
    /// The kernel's MAC on the TAP.
    pub tap_mac: MacAddr,
    /// The uplink's MTU, given to the TAP.
    pub mtu: u16,
    /// Its global addresses.
    pub addresses: Vec<Address>,
    /// Its unicast routes, of every table but `local`.
    pub routes: Vec<Route>,
    /// Its permanent neighbour entries (which stay on the uplink in the kernel: ferry
    /// is given them as routes).
    pub neighbours: Vec<Neighbour>,
}

/// An address of the uplink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Address {
    /// The address and its prefix length.
    pub addr: IpNet,
    /// Its broadcast address (IPv4), when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broadcast: Option<Ipv4Addr>,
    /// It had no prefix route of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub noprefixroute: bool,
}

/// A route through the uplink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Its destination.
    pub dst: IpNet,
    /// Its next hop, when it has one (else the destination is on-link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Its table, when not `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Its metric, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// Who made it (`kernel`: the prefix route of an address, which comes back with the
    /// address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Its scope, when not global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Its preferred source address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefsrc: Option<IpAddr>,
    /// Its next hop was declared on-link.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub onlink: bool,
}

impl Route {
    /// The prefix route of an address: made again by the kernel when the address comes
    /// back.
    pub fn connected(&self) -> bool {
        self.protocol.as_deref() == Some("kernel")
    }

    /// In the main table.
    pub fn main(&self) -> bool {
        self.table.is_none()
    }
}

/// A permanent neighbour entry of the uplink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Neighbour {
    /// Its address.
    pub addr: IpAddr,
    /// Its MAC.
    pub mac: MacAddr,
}

/// The `ip -json address` view of an interface.
#[derive(Deserialize)]
struct IpLink {
    ifname: String,
    #[serde(default)]
    mtu: u32,
    #[serde(default)]
    link_type: Option<String>,
    #[serde(default)]
    addr_info: Vec<IpAddrInfo>,
}

#[derive(Deserialize)]
struct IpAddrInfo {
    local: Option<IpAddr>,
    prefixlen: Option<u8>,
    #[serde(default)]
    broadcast: Option<Ipv4Addr>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    noprefixroute: bool,
}

/// The `ip -json route` view of a route (read here and by [`crate::leftovers`]).
#[derive(Debug, Deserialize)]
pub(crate) struct IpRoute {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    pub(crate) dst: String,
    #[serde(default)]
    pub(crate) gateway: Option<IpAddr>,
    #[serde(default)]
    pub(crate) dev: Option<String>,
    #[serde(default)]
    pub(crate) table: Option<String>,
    #[serde(default)]
    pub(crate) metric: Option<u32>,
    #[serde(default)]
    pub(crate) protocol: Option<String>,
    #[serde(default)]
    pub(crate) scope: Option<String>,
    #[serde(default)]
    pub(crate) prefsrc: Option<IpAddr>,
    #[serde(default)]
    pub(crate) flags: Vec<String>,
}

/// The `ip -json neigh` view of an entry.
#[derive(Deserialize)]
struct IpNeigh {
    dst: IpAddr,
    #[serde(default)]
    lladdr: Option<String>,
}

fn ip_json<T: serde::de::DeserializeOwned>(args: &[&str]) -> Result<T, String> {
    let out = Cmd::new("ip")
        .arg("-json")
        .args(args)
        .run()
        .map_err(|e| e.to_string())?;
    // `ip -json` prints nothing at all (not `[]`) for some empty answers.
    let out = if out.trim().is_empty() { "[]" } else { &out };
    serde_json::from_str(out).map_err(|e| format!("`ip -json {}`: {e}", args.join(" ")))
}

/// `dst` of `ip -json route` in family `v6`: `default`, `ADDR/LEN` or `ADDR`.
pub(crate) fn parse_dst(dst: &str, v6: bool) -> Option<IpNet> {
    if dst == "default" {
        let any = if v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        return IpNet::new(any, 0).ok();
    }
    dst.parse::<IpNet>()
        .ok()
        .or_else(|| dst.parse::<IpAddr>().ok().map(IpNet::from))
}

/// The routes of `ip -json route show` output `json` (one family, `v6`) that move with
/// the uplink: unicast ones outside the `local` table, but not IPv6's link-local
/// prefix, which every interface has of its own.
fn routes_of(json: Vec<IpRoute>, v6: bool) -> Result<Vec<Route>, String> {
    let mut routes = Vec::new();
    for r in json {
        if r.kind.as_deref().is_some_and(|k| k != "unicast") || r.table.as_deref() == Some("local")
        {
            continue;
        }
        let dst = parse_dst(&r.dst, v6).ok_or_else(|| format!("a route to {:?}", r.dst))?;
        if let IpNet::V6(n) = dst
            && n.addr().segments()[0] & 0xffc0 == 0xfe80
        {
            continue;
        }
        routes.push(Route {
            dst,
            gateway: r.gateway,
            table: r.table.filter(|t| t != "main"),
            metric: r.metric,
            protocol: r.protocol,
            scope: r.scope.filter(|s| s != "global" && s != "universe"),
            prefsrc: r.prefsrc,
            onlink: r.flags.iter().any(|f| f == "onlink"),
        });
    }
    Ok(routes)
}

/// What the kernel has on `uplink` now, to move to `tap`.
pub fn read(uplink: &str, tap: &str) -> Result<Taken, String> {
    let links: Vec<IpLink> = ip_json(&["address", "show", "dev", uplink])?;
    let link = links
        .into_iter()
        .next()
        .ok_or_else(|| format!("no interface {uplink}"))?;
    let mut addresses = Vec::new();
    for a in &link.addr_info {
        let (Some(addr), Some(len)) = (a.local, a.prefixlen) else {
            continue;
        };
        if a.scope.as_deref().is_some_and(|s| s != "global") {
            continue;
        }
        let addr = IpNet::new(addr, len).map_err(|e| format!("address {addr}/{len}: {e}"))?;
        addresses.push(Address {
            addr,
            broadcast: a.broadcast,
            noprefixroute: a.noprefixroute,
        });
    }
    let mut routes = Vec::new();
    for (flag, v6) in [("-4", false), ("-6", true)] {
        let json: Vec<IpRoute> = ip_json(&[flag, "route", "show", "table", "all", "dev", uplink])?;
        routes.extend(routes_of(json, v6)?);
    }
    let mut neighbours = Vec::new();
    let json: Vec<IpNeigh> = ip_json(&["neigh", "show", "dev", uplink, "nud", "permanent"])?;
    for n in json {
        if let Some(mac) = n.lladdr.as_deref().and_then(|m| m.parse().ok()) {
            neighbours.push(Neighbour { addr: n.dst, mac });
        }
    }
    let mtu = u16::try_from(link.mtu)
        .ok()
        .filter(|m| *m >= ferry_datapath::MIN_MTU)
        .ok_or_else(|| format!("{uplink}: MTU {} is not one ferry's ports take", link.mtu))?;
    Ok(Taken {
        version: RECORD_VERSION,
        uplink: uplink.to_string(),
        tap: tap.to_string(),
        tap_mac: HOST_TAP_MAC,
        mtu,
        addresses,
        routes,
        neighbours,
    })
}

/// How an uplink was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// It holds one of the Node's InternalIPs.
    HoldsNodeAddress(IpAddr),
    /// The default route of that family goes through it.
    DefaultRoute(&'static str),
    /// The first of the `uplink` names of the ferry-config ConfigMap that exists.
    Configured,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::HoldsNodeAddress(a) => write!(f, "it holds the Node's InternalIP {a}"),
            Found::DefaultRoute(family) => write!(f, "the {family} default route goes through it"),
            Found::Configured => write!(f, "the ferry-config ConfigMap names it"),
        }
    }
}

/// The uplink of a node whose addresses are `node_ips`: the first of `configured`
/// (ConfigMap names, in order) that exists; else the interface that holds one of
/// `node_ips`; else the one of the default route (IPv4's, then IPv6's). Interfaces
/// named in `skip` (ferry's own host TAP) and loopback are never chosen.
pub fn detect(
    configured: &[String],
    node_ips: &[IpAddr],
    skip: &[&str],
) -> Result<(String, Found), String> {
    let links: Vec<IpLink> = ip_json(&["address", "show"])?;
    let usable = |l: &IpLink| {
        l.link_type.as_deref() != Some("loopback") && !skip.contains(&l.ifname.as_str())
    };
    if !configured.is_empty() {
        return configured
            .iter()
            .find(|name| links.iter().any(|l| &l.ifname == *name && usable(l)))
            .map(|name| (name.clone(), Found::Configured))
            .ok_or_else(|| {
                format!(
                    "none of the interfaces the ferry-config ConfigMap names as the uplink ({}) is on this node",
                    configured.join(", ")
                )
            });
    }
    for ip in node_ips {
        if let Some(l) = links
            .iter()
            .filter(|l| usable(l))
            .find(|l| l.addr_info.iter().any(|a| a.local == Some(*ip)))
        {
            return Ok((l.ifname.clone(), Found::HoldsNodeAddress(*ip)));
        }
    }
    for (flag, family) in [("-4", "IPv4"), ("-6", "IPv6")] {
        let json: Vec<IpRoute> = ip_json(&[flag, "route", "show", "default"])?;
        if let Some(dev) = json
            .into_iter()
            .filter_map(|r| r.dev)
            .find(|d| !skip.contains(&d.as_str()))
        {
            return Ok((dev, Found::DefaultRoute(family)));
        }
    }
    let ips: Vec<String> = node_ips.iter().map(ToString::to_string).collect();
    Err(format!(
        "no interface holds the Node's InternalIPs ({}) and there is no default route: give --uplink IFNAME",
        if ips.is_empty() {
            "none".into()
        } else {
            ips.join(", ")
        }
    ))
}

/// ferry's gateway on the TAP for a destination of this family.
fn gateway_for(dst: &IpNet) -> IpAddr {
    match dst {
        IpNet::V4(_) => GATEWAY_V4,
        IpNet::V6(_) => GATEWAY_V6,
    }
}

/// ` table T metric M` of a route, the part that with the destination tells it apart.
fn key_of(r: &Route) -> String {
    let mut s = String::new();
    if let Some(t) = &r.table {
        let _ = write!(s, " table {t}");
    }
    if let Some(m) = r.metric {
        let _ = write!(s, " metric {m}");
    }
    s
}

/// An address's options: its broadcast, no prefix route, no duplicate address detection
/// (IPv6: the address is the node's already, and must not go tentative).
fn address_options(a: &Address, noprefixroute: bool) -> String {
    let mut s = String::new();
    if let Some(b) = a.broadcast {
        let _ = write!(s, " broadcast {b}");
    }
    if noprefixroute {
        s.push_str(" noprefixroute");
    }
    if a.addr.addr().is_ipv6() {
        s.push_str(" nodad");
    }
    s
}

/// The `ip -batch` lines that move the stack of `t` onto its TAP, in two parts: what
/// must succeed (the TAP's link, its gateway routes, the addresses and routes on it),
/// and the removals from the uplink, which may find some of it gone already (an agent
/// taking up the record of one that crashed).
pub fn take_script(t: &Taken) -> (String, String) {
    let tap = &t.tap;
    let mut must = String::new();
    let _ = writeln!(
        must,
        "link set dev {tap} address {} mtu {} up",
        t.tap_mac, t.mtu
    );
    if t.addresses.iter().any(|a| a.addr.addr().is_ipv4())
        || t.routes.iter().any(|r| r.dst.addr().is_ipv4())
    {
        let _ = writeln!(must, "route replace {GATEWAY_V4}/32 dev {tap} scope link");
    }
    for a in &t.addresses {
        let _ = writeln!(
            must,
            "address replace {} dev {tap}{}",
            a.addr,
            address_options(a, true)
        );
    }
    for r in &t.routes {
        let mut line = format!(
            "route replace {} via {} dev {tap}{}",
            r.dst,
            gateway_for(&r.dst),
            key_of(r)
        );
        if let Some(p) = r.protocol.as_deref().filter(|p| *p != "kernel") {
            let _ = write!(line, " proto {p}");
        }
        if let Some(src) = r.prefsrc {
            let _ = write!(line, " src {src}");
        }
        let _ = writeln!(must, "{line}");
    }
    let mut off = String::new();
    for a in &t.addresses {
        let _ = writeln!(off, "address del {} dev {}", a.addr, t.uplink);
    }
    (must, off)
}

/// The `ip -batch` lines that give the stack of `t` back to its uplink: the connected
/// routes' stand-ins off the TAP (the kernel adds an address's prefix route beside one
/// already there, which would then win), the addresses and routes back on the uplink as
/// they were, then the addresses off the TAP (`tap_exists`: it is still there).
pub fn give_back_script(t: &Taken, tap_exists: bool) -> String {
    let (tap, up) = (&t.tap, &t.uplink);
    let mut s = String::new();
    if tap_exists {
        for r in t.routes.iter().filter(|r| r.connected()) {
            let _ = writeln!(s, "route del {} dev {tap}{}", r.dst, key_of(r));
        }
    }
    for a in &t.addresses {
        let _ = writeln!(
            s,
            "address replace {} dev {up}{}",
            a.addr,
            address_options(a, a.noprefixroute)
        );
    }
    for r in t.routes.iter().filter(|r| !r.connected()) {
        let mut line = format!("route replace {}", r.dst);
        if let Some(g) = r.gateway {
            let _ = write!(line, " via {g}");
        }
        let _ = write!(line, " dev {up}{}", key_of(r));
        if let Some(p) = &r.protocol {
            let _ = write!(line, " proto {p}");
        }
        if let Some(sc) = &r.scope {
            let _ = write!(line, " scope {sc}");
        }
        if let Some(src) = r.prefsrc {
            let _ = write!(line, " src {src}");
        }
        if r.onlink {
            line.push_str(" onlink");
        }
        let _ = writeln!(s, "{line}");
    }
    if tap_exists {
        for a in &t.addresses {
            let _ = writeln!(s, "address del {} dev {tap}", a.addr);
        }
    }
    s
}

/// Runs `ip -batch -` on `script`; `force`: on past lines that fail.
fn batch(script: &str, force: bool) -> Result<(), String> {
    if script.is_empty() {
        return Ok(());
    }
    let mut c = Cmd::new("ip");
    if force {
        c = c.arg("-force");
    }
    c.args(["-batch", "-"])
        .stdin(script.as_bytes().to_vec())
        .run()
        .map(drop)
        .map_err(|e| e.to_string())
}

/// True when interface `dev` exists.
pub fn exists(dev: &str) -> bool {
    Path::new("/sys/class/net").join(dev).exists()
}

/// Moves the stack of `t` onto its TAP, which must exist. On failure, whatever was done
/// is undone as far as it can be (the stack back on the uplink) and the error says
/// which step failed.
pub fn take(t: &Taken) -> Result<(), String> {
    let (must, off) = take_script(t);
    if let Err(e) = batch(&must, false) {
        let _ = batch(&give_back_script(t, exists(&t.tap)), true);
        return Err(format!(
            "moving the node's stack from {} to {}: {e}",
            t.uplink, t.tap
        ));
    }
    // What is gone already (taken up after a crash) is not an error.
    let _ = batch(&off, true);
    Ok(())
}

/// Gives the stack of `t` back to its uplink. Every line is tried, and the first error
/// returned.
pub fn give_back(t: &Taken) -> Result<(), String> {
    let script = give_back_script(t, exists(&t.tap));
    // Line by line, so that one that fails (a route the uplink cannot take now) leaves
    // the others done, and says which it was.
    let mut first = None;
    for line in script.lines() {
        if let Err(e) = batch(&format!("{line}\n"), false)
            && first.is_none()
        {
            first = Some(format!("giving the node's stack back to {}: {e}", t.uplink));
        }
    }
    first.map_or(Ok(()), Err)
}

/// The record's path in state directory `dir`.
pub fn record_path(dir: &Path) -> PathBuf {
    dir.join(RECORD_FILE)
}

/// Writes the record of `t` into `dir` (whole: a temporary file renamed).
pub fn save(dir: &Path, t: &Taken) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{RECORD_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(t).map_err(io::Error::other)?;
    fs::write(&tmp, json)?;
    fs::rename(&tmp, record_path(dir))
}

/// The record in `dir`, if there is one. A record that cannot be read (another version,
/// a damaged file) is an error that names the file: the node's stack may be on the TAP,
/// and only the record says where it was.
pub fn load(dir: &Path) -> Result<Option<Taken>, String> {
    let path = record_path(dir);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let t: Taken = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if t.version != RECORD_VERSION {
        return Err(format!(
            "{}: version {} (this agent reads version {RECORD_VERSION})",
            path.display(),
            t.version
        ));
    }
    Ok(Some(t))
}

/// Removes the record from `dir` (the stack is back on the uplink).
pub fn forget(dir: &Path) -> io::Result<()> {
    match fs::remove_file(record_path(dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The annotations of the Node that say what its uplink held, for the agent to write:
/// `ferry.io/ipv4-address` and `ferry.io/ipv6-address`, an address of each family with
/// its prefix (the one that is an InternalIP, else the first), and
/// `ferry.io/ipv4-gateway` and `ferry.io/ipv6-gateway`, the gateway of the main table's
/// default route of least metric. A family the uplink lacks gets none.
pub fn annotations(t: &Taken, internal_ips: &[IpAddr]) -> crate::datastore::Annotations {
    use crate::fields::{
        ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV4_GATEWAY, ANNOTATION_IPV6_ADDRESS,
        ANNOTATION_IPV6_GATEWAY,
    };
    let mut out = crate::datastore::Annotations::new();
    for (v6, addr_key, gw_key) in [
        (false, ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV4_GATEWAY),
        (true, ANNOTATION_IPV6_ADDRESS, ANNOTATION_IPV6_GATEWAY),
    ] {
        let family: Vec<&Address> = t
            .addresses
            .iter()
            .filter(|a| a.addr.addr().is_ipv6() == v6)
            .collect();
        if let Some(a) = family
            .iter()
            .find(|a| internal_ips.contains(&a.addr.addr()))
            .or(family.first())
        {
            out.insert(addr_key.to_string(), a.addr.to_string());
        }
        if let Some(gw) = t
            .routes
            .iter()
            .filter(|r| r.main() && r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == v6)
            .min_by_key(|r| r.metric.unwrap_or(0))
            .and_then(|r| r.gateway)
        {
            out.insert(gw_key.to_string(), gw.to_string());
        }
    }
    out
}

/// The node addresses of `t`, each once.
pub fn addresses(t: &Taken) -> BTreeSet<IpAddr> {
    t.addresses.iter().map(|a| a.addr.addr()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> Taken {
        Taken {
            version: RECORD_VERSION,
            uplink: "eth0".into(),
            tap: "ferry0".into(),
            tap_mac: HOST_TAP_MAC,
            mtu: 1500,
            addresses: vec![
                Address {
                    addr: "10.0.0.5/24".parse().unwrap(),
                    broadcast: Some("10.0.0.255".parse().unwrap()),
                    noprefixroute: false,
                },
                Address {
                    addr: "2001:db8::5/64".parse().unwrap(),
                    broadcast: None,
                    noprefixroute: false,
                },
            ],
            routes: vec![
                Route {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gateway: Some("10.0.0.1".parse().unwrap()),
                    table: None,
                    metric: Some(100),
                    protocol: Some("dhcp".into()),
                    scope: None,
                    prefsrc: Some("10.0.0.5".parse().unwrap()),
                    onlink: false,
                },
                Route {
                    dst: "10.0.0.0/24".parse().unwrap(),
                    gateway: None,
                    table: None,
                    metric: None,
                    protocol: Some("kernel".into()),
                    scope: Some("link".into()),
                    prefsrc: Some("10.0.0.5".parse().unwrap()),
                    onlink: false,
                },
                Route {
                    dst: "172.16.0.0/12".parse().unwrap(),
                    gateway: Some("10.0.0.254".parse().unwrap()),
                    table: Some("100".into()),
                    metric: None,
                    protocol: Some("static".into()),
                    scope: None,
                    prefsrc: None,
                    onlink: true,
                },
            ],
            neighbours: vec![],
        }
    }

    #[test]
    fn the_routes_that_move_are_the_uplinks_unicast_ones_outside_the_local_table() {
        let v4 = r#"[
            {"dst":"default","gateway":"10.0.0.1","protocol":"dhcp","prefsrc":"10.0.0.5","metric":100,"flags":[]},
            {"dst":"10.0.0.0/24","protocol":"kernel","scope":"link","prefsrc":"10.0.0.5","flags":[]},
            {"dst":"10.9.9.9","gateway":"10.0.0.2","table":"100","flags":["onlink"]},
            {"type":"local","dst":"10.0.0.5","table":"local","protocol":"kernel","scope":"host","prefsrc":"10.0.0.5","flags":[]},
            {"type":"broadcast","dst":"10.0.0.255","table":"local","protocol":"kernel","scope":"link","prefsrc":"10.0.0.5","flags":[]}
        ]"#;
        let r = routes_of(serde_json::from_str(v4).unwrap(), false).unwrap();
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(r[0].dst, "0.0.0.0/0".parse::<IpNet>().unwrap());
        assert_eq!(
            (r[0].metric, r[0].protocol.as_deref()),
            (Some(100), Some("dhcp"))
        );
        assert!(r[1].connected() && r[1].main());
        assert_eq!(r[1].scope.as_deref(), Some("link"));
        assert_eq!(r[2].dst, "10.9.9.9/32".parse::<IpNet>().unwrap());
        assert!(r[2].onlink && !r[2].main());
        let v6 = r#"[
            {"dst":"2001:db8::/64","protocol":"kernel","metric":256,"pref":"medium","flags":[]},
            {"dst":"fe80::/64","protocol":"kernel","metric":256,"pref":"medium","flags":[]},
            {"dst":"default","gateway":"2001:db8::1","protocol":"static","metric":1024,"flags":[]},
            {"type":"multicast","dst":"ff00::/8","table":"local","protocol":"kernel","metric":256,"flags":[]}
        ]"#;
        let r = routes_of(serde_json::from_str(v6).unwrap(), true).unwrap();
        let dsts: Vec<String> = r.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["2001:db8::/64", "::/0"]);
    }

    #[test]
    fn taking_puts_everything_on_the_tap_before_it_leaves_the_uplink() {
        let (must, off) = take_script(&taken());
        assert_eq!(
            must,
            "link set dev ferry0 address 02:fe:00:00:00:01 mtu 1500 up\n\
             route replace 169.254.1.1/32 dev ferry0 scope link\n\
             address replace 10.0.0.5/24 dev ferry0 broadcast 10.0.0.255 noprefixroute\n\
             address replace 2001:db8::5/64 dev ferry0 noprefixroute nodad\n\
             route replace 0.0.0.0/0 via 169.254.1.1 dev ferry0 metric 100 proto dhcp src 10.0.0.5\n\
             route replace 10.0.0.0/24 via 169.254.1.1 dev ferry0 src 10.0.0.5\n\
             route replace 172.16.0.0/12 via 169.254.1.1 dev ferry0 table 100 proto static\n"
        );
        assert_eq!(
            off,
            "address del 10.0.0.5/24 dev eth0\naddress del 2001:db8::5/64 dev eth0\n"
        );
    }

    #[test]
    fn giving_back_restores_each_route_as_it_was() {
        let s = give_back_script(&taken(), true);
        assert_eq!(
            s,
            "route del 10.0.0.0/24 dev ferry0\n\
             address replace 10.0.0.5/24 dev eth0 broadcast 10.0.0.255\n\
             address replace 2001:db8::5/64 dev eth0 nodad\n\
             route replace 0.0.0.0/0 via 10.0.0.1 dev eth0 metric 100 proto dhcp src 10.0.0.5\n\
             route replace 172.16.0.0/12 via 10.0.0.254 dev eth0 table 100 proto static onlink\n\
             address del 10.0.0.5/24 dev ferry0\n\
             address del 2001:db8::5/64 dev ferry0\n"
        );
        let s = give_back_script(&taken(), false);
        assert!(!s.contains("ferry0"), "{s}");
    }

    #[test]
    fn the_node_annotations_say_the_uplinks_addresses_and_gateways() {
        let a = annotations(&taken(), &["10.0.0.5".parse().unwrap()]);
        let a: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            a,
            [
                ("ferry.io/ipv4-address", "10.0.0.5/24"),
                ("ferry.io/ipv4-gateway", "10.0.0.1"),
                ("ferry.io/ipv6-address", "2001:db8::5/64"),
            ]
        );
    }

    #[test]
    fn the_record_round_trips_and_a_bad_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        save(dir.path(), &taken()).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(taken()));
        let mut newer = serde_json::to_value(taken()).unwrap();
        newer["version"] = 2.into();
        fs::write(record_path(dir.path()), newer.to_string()).unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(e.contains("uplink.json") && e.contains("version 2"), "{e}");
        fs::write(record_path(dir.path()), "{").unwrap();
        assert!(load(dir.path()).unwrap_err().contains("uplink.json"));
        forget(dir.path()).unwrap();
        forget(dir.path()).unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
    }

    #[test]
    fn destinations_parse_in_every_form_ip_prints() {
        assert_eq!(parse_dst("default", false), "0.0.0.0/0".parse().ok());
        assert_eq!(parse_dst("default", true), "::/0".parse().ok());
        assert_eq!(parse_dst("10.1.0.0/16", false), "10.1.0.0/16".parse().ok());
        assert_eq!(parse_dst("10.1.2.3", false), "10.1.2.3/32".parse().ok());
        assert_eq!(
            parse_dst("2001:db8::1", true),
            "2001:db8::1/128".parse().ok()
        );
        assert_eq!(parse_dst("nonsense", false), None);
    }
}
