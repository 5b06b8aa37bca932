//! Interface set-up through the `ip` command (iproute2): moving a pod's TAP into its
//! namespace as `eth0`, addresses, MTU, reading MACs.
//!
//! Shelling out keeps these rarely-run steps short and readable, and their errors carry
//! `ip`'s own message. They are for tests, the lab and the agent until the CNI plugin
//! does the same over netlink; nothing on the packet path calls them.

use std::io;

use ipnet::IpNet;

use crate::cmd;

/// Runs `ip args...` and returns its standard output. The error names the command, its
/// exit status and its standard error (or says to install iproute2 when `ip` is missing).
pub fn ip(args: &[&str]) -> io::Result<String> {
    Ok(cmd::run("ip", args)?)
}

/// How a pod's interface is set up inside its namespace.
#[derive(Clone, Debug)]
pub struct PodInterface<'a> {
    /// The pod's network namespace (`ip netns` name).
    pub netns: &'a str,
    /// The interface's name there (`eth0`).
    pub name: &'a str,
    /// Its MTU.
    pub mtu: u16,
    /// Its addresses with prefix lengths; IPv6 ones skip duplicate address detection.
    pub addresses: &'a [IpNet],
}

/// Moves interface `dev` (in the caller's namespace) into `pod.netns`, renames it, sets
/// its MTU and addresses and brings it (and the namespace's loopback) up.
pub fn move_to_netns(dev: &str, pod: &PodInterface<'_>) -> io::Result<()> {
    let ns = pod.netns;
    let mtu = pod.mtu.to_string();
    ip(&["link", "set", "dev", dev, "netns", ns])?;
    ip(&[
        "-n", ns, "link", "set", "dev", dev, "name", pod.name, "mtu", &mtu,
    ])?;
    for a in pod.addresses {
        let a = a.to_string();
        let mut args = vec!["-n", ns, "addr", "add", &a, "dev", pod.name];
        if a.contains(':') {
            args.push("nodad");
        }
        ip(&args)?;
    }
    ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
    ip(&["-n", ns, "link", "set", "dev", pod.name, "up"])?;
    Ok(())
}

/// A pod's interface as a kubelet's CNI plugin would set it up: in the pod's namespace,
/// with the pod's MAC, MTU and addresses, and default routes through the link-local
/// gateway (169.254.1.1 for IPv4, fe80::1 for IPv6) that ferry answers for, whose MAC
/// the pod knows from the start ([`pin_gateway`]).
#[derive(Clone, Debug)]
pub struct Pod<'a> {
    /// The interface, its namespace, MTU and addresses.
    pub interface: PodInterface<'a>,
    /// The MAC the pod's interface gets.
    pub mac: [u8; 6],
    /// The gateway's MAC: that of ferry's end of the interface.
    pub gateway_mac: [u8; 6],
}

/// The IPv4 gateway pods route through.
pub const GATEWAY_V4: &str = "169.254.1.1";
/// The IPv6 gateway pods route through.
pub const GATEWAY_V6: &str = "fe80::1";

/// Moves `dev` into the pod's namespace and sets it up as [`Pod`] describes.
pub fn attach_pod(dev: &str, pod: &Pod<'_>) -> io::Result<()> {
    let i = &pod.interface;
    let mac = format_mac(pod.mac);
    ip(&["link", "set", "dev", dev, "address", &mac])?;
    move_to_netns(dev, i)?;
    let ns = i.netns;
    let v4 = i.addresses.iter().any(|a| a.addr().is_ipv4());
    let v6 = i.addresses.iter().any(|a| a.addr().is_ipv6());
    if v4 {
        ip(&[
            "-n", ns, "route", "add", GATEWAY_V4, "dev", i.name, "scope", "link",
        ])?;
        ip(&[
            "-n", ns, "route", "add", "default", "via", GATEWAY_V4, "dev", i.name,
        ])?;
    }
    if v6 {
        ip(&[
            "-n", ns, "-6", "route", "add", "default", "via", GATEWAY_V6, "dev", i.name,
        ])?;
    }
    pin_gateway(ns, i.name, pod.gateway_mac, v4, v6)
}

/// Gives the pod's interface `ifname` in namespace `netns` permanent neighbour entries
/// for the gateways (IPv4 when `v4`, IPv6 when `v6`) at `mac`; again on an interface
/// that has them, it changes nothing.
///
/// A TAP loses its carrier while no process holds it, as between an agent that died and
/// the next one, and the pod's kernel then forgets the neighbours it learnt on it. Its
/// next packet would ask for the gateway again, and if that first request went out
/// before the new agent read the TAP, the kernel asks again only a second later (its
/// `retrans_time`) while every packet waits. A permanent entry is kept across carrier
/// changes, so the pod's traffic goes on the moment the TAP is read again. The gateway's
/// MAC never changes: it is the port's, fixed by the agent.
pub fn pin_gateway(netns: &str, ifname: &str, mac: [u8; 6], v4: bool, v6: bool) -> io::Result<()> {
    let mac = format_mac(mac);
    let families = [
        (v4, "-4", GATEWAY_V4, None),
        (v6, "-6", GATEWAY_V6, Some("router")),
    ];
    for (_, family, gateway, flag) in families.into_iter().filter(|f| f.0) {
        let mut args = vec![
            "-n",
            netns,
            family,
            "neigh",
            "replace",
            gateway,
            "lladdr",
            &mac,
            "dev",
            ifname,
            "nud",
            "permanent",
        ];
        args.extend(flag);
        ip(&args)?;
    }
    Ok(())
}

/// The MAC address of `dev` in namespace `netns` (the caller's when None).
pub fn mac_address(netns: Option<&str>, dev: &str) -> io::Result<[u8; 6]> {
    let mut args = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["-j", "link", "show", "dev", dev]);
    let out = ip(&args)?;
    let bad = |why: &str| io::Error::other(format!("`ip {}`: {why}", args.join(" ")));
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| bad(&e.to_string()))?;
    let s = v
        .get(0)
        .and_then(|l| l.get("address"))
        .and_then(|a| a.as_str())
        .ok_or_else(|| bad("no address in the output"))?;
    parse_mac(s).ok_or_else(|| bad(&format!("bad MAC address {s:?}")))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// The TAP of the tables' pod port `port`: created as `dev` (with virtio-net headers and
/// offloads), then moved into network namespace `netns` as `ifname` with the port's pod
/// addresses, MAC (`peer_mac`) and MTU and the default routes ([`attach_pod`]).
pub fn pod_tap(
    dev: &str,
    netns: &str,
    ifname: &str,
    port: &ferry_datapath::Port,
    queues: u16,
) -> io::Result<crate::TapPort> {
    let mac = port.peer_mac.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("port {:?}: a pod port needs peer_mac", port.name),
        )
    })?;
    let addresses: Vec<IpNet> = port.addresses.iter().map(|a| IpNet::from(*a)).collect();
    let tap = crate::TapPort::create_queues(dev, queues)?;
    let pod = Pod {
        interface: PodInterface {
            netns,
            name: ifname,
            mtu: port.mtu,
            addresses: &addresses,
        },
        mac,
        gateway_mac: port.mac,
    };
    attach_pod(dev, &pod)?;
    Ok(tap)
}

/// Opens again the persistent pod TAP `ifname` that [`pod_tap`] made and moved into
/// network namespace `netns` (after the process that held it stopped), with `queues`
/// queues. The interface must be there with MAC `mac` (ours, not another's); it is
/// opened from a thread that enters `netns` ([`crate::netns::spawn_in`]), with the flags
/// and offloads it was made with, which the kernel refuses for anything but a TAP of
/// that kind (a single-queue TAP also only when it is free). A TAP made with one queue
/// is opened with one, and a multi-queue TAP with at least one, whatever `queues` says:
/// whether a device is multi-queue is fixed when it is made.
pub fn reopen_pod_tap(
    netns: &str,
    ifname: &str,
    mac: [u8; 6],
    queues: u16,
) -> io::Result<crate::TapPort> {
    let found = mac_address(Some(netns), ifname)?;
    if found != mac {
        return Err(io::Error::other(format!(
            "{ifname} in {netns} has MAC {} where ours has {}: not our interface",
            format_mac(found),
            format_mac(mac)
        )));
    }
    let name = ifname.to_string();
    let opened = crate::netns::spawn_in(netns, move || {
        // The kind `queues` asks for first; the kernel answers EINVAL when the device
        // is of the other kind.
        let r = crate::TapPort::create_queues(&name, queues);
        match r {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && queues > 1 => {
                crate::TapPort::create(&name)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => crate::TapPort::create_queue(&name),
            r => r,
        }
    })?
    .join()
    .map_err(|_| io::Error::other("the thread opening the TAP panicked"))?;
    opened?.map_err(|e| io::Error::new(e.kind(), format!("opening TAP {ifname} in {netns}: {e}")))
}

/// Deletes interface `ifname` of network namespace `netns` (a persistent pod TAP that
/// must go with its pod). An interface already gone is not an error.
pub fn delete_in_netns(netns: &str, ifname: &str) -> io::Result<()> {
    if mac_address(Some(netns), ifname).is_err() {
        return Ok(());
    }
    ip(&["-n", netns, "link", "del", "dev", ifname]).map(|_| ())
}

fn format_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_mac() {
        assert_eq!(
            parse_mac("02:00:0a:ff:00:01"),
            Some([2, 0, 0x0a, 0xff, 0, 1])
        );
        assert_eq!(parse_mac("02:00:0a:ff:00"), None);
        assert_eq!(parse_mac("02:00:0a:ff:00:01:02"), None);
        assert_eq!(parse_mac("zz:00:0a:ff:00:01"), None);
    }

    #[test]
    fn test_missing_device_error_names_the_command() {
        let e = mac_address(None, "ferrynosuchdev").unwrap_err();
        assert!(
            e.to_string().contains("ip -j link show dev ferrynosuchdev"),
            "{e}"
        );
    }
}
