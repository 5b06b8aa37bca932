//! The cases of traffic_distribution.go: `PreferSameZone` and `PreferSameNode`, with
//! the slices hinted as the EndpointSlice controller hints them.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};

use super::{Cond, HTTP_PORT, Scene, cluster_ip, endpoint, service, slice};
use crate::check::NotApplicable;
use crate::plan::Plan;
use crate::state::Pod;

/// A Service at cluster IP `n` over `eps` (already hinted).
fn hinted(s: &mut Scene, n: u8, distribution: &str, eps: &[String]) -> Result<String> {
    let ip = cluster_ip(n);
    s.apply(&(service(
        "hinted",
        "",
        &format!(
            "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  trafficDistribution: {distribution}\n  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]\n"
        ),
    ) + &slice("hinted", "", HTTP_PORT, eps)))?;
    Ok(format!("http://{ip}/hostname"))
}

/// Each zone's client answered only by that zone's endpoints.
pub(super) fn prefer_same_zone(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let far = s.far();
    if plan.zone_of(far) == plan.zone_of(1) {
        return Err(NotApplicable("node1 and node2 are in one zone").into());
    }
    let mut eps = Vec::new();
    let mut ids = BTreeMap::new();
    for (name, node) in [("server-1", 1), ("server-2", 1), ("server-3", far)] {
        let p = s.server(name, node)?;
        let zone = Plan::zone_name(plan.zone_of(node));
        eps.push(endpoint(
            &plan,
            &p,
            Cond::Ready,
            &format!("{{ forZones: [{{ name: {zone} }}] }}"),
        ));
        ids.entry(node).or_insert_with(Vec::new).push(p.id());
    }
    let url = hinted(s, 18, "PreferSameZone", &eps)?;
    for (client, node) in [("client-1", 1), ("client-2", far)] {
        let got = s.answering(client, &url)?;
        ensure!(
            got == ids[&node],
            "{client}: answered by {got:?}, wanted {:?}",
            ids[&node]
        );
    }
    Ok(())
}

/// Pod `p` as a ready endpoint hinted as the EndpointSlice controller hints it for
/// PreferSameNode: for its node, and for its zone (for proxies that read only zones).
fn node_hinted(plan: &Plan, p: &Pod) -> String {
    let zone = Plan::zone_name(plan.zone_of(p.node));
    let hints = format!(
        "{{ forZones: [{{ name: {zone} }}], forNodes: [{{ name: node{} }}] }}",
        p.node
    );
    endpoint(plan, p, Cond::Ready, &hints)
}

/// Requires `from` to be answered by exactly `want` (sorted).
fn answered_by(s: &Scene, from: &str, url: &str, want: &[String]) -> Result<()> {
    let got = s.answering(from, url)?;
    ensure!(got == want, "{from}: answered by {got:?}, wanted {want:?}");
    Ok(())
}

/// Upstream's first zone: a client and a server on each of two nodes (node1 and node3,
/// node1's zone in the default shape), each client answered only by its own node's
/// server. Its third zone: a zone with a client and no server (node2's), answered by
/// every server. Its second zone (a client on one node, the zone's server on another)
/// needs two nodes in a zone besides node1's, four nodes: checked when the lab has them.
pub(super) fn prefer_same_node(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let zone = |n: u8| plan.zone_of(n);
    let Some(third) = (3..=plan.nodes).find(|&n| zone(n) == zone(1)) else {
        return Err(NotApplicable("no second node in node1's zone").into());
    };
    if zone(2) == zone(1) {
        return Err(NotApplicable("node1 and node2 are in one zone").into());
    }
    let one = s.server("server-1", 1)?;
    let three = s.server("server-3", third)?;
    let client3 = s.server("client-3", third)?;
    let mut eps = vec![node_hinted(&plan, &one), node_hinted(&plan, &three)];
    let mut everyone = vec![one.id(), three.id()];
    let second_zone = (2..=plan.nodes)
        .filter(|&n| zone(n) != zone(1))
        .collect::<Vec<_>>();
    let mut far_zone = None;
    if let [a, b, ..] = second_zone[..] {
        let p = s.server("server-4", b)?;
        eps.push(node_hinted(&plan, &p));
        everyone.push(p.id());
        let c = s.server("client-4", a)?;
        far_zone = Some((c.name.clone(), p.id()));
    }
    everyone.sort();
    let url = hinted(s, 19, "PreferSameNode", &eps)?;
    answered_by(s, "client-1", &url, &[one.id()])?;
    answered_by(s, &client3.name, &url, &[three.id()])?;
    match &far_zone {
        Some((client, server)) => answered_by(s, client, &url, std::slice::from_ref(server))?,
        None => answered_by(s, "client-2", &url, &everyone)?,
    }
    if far_zone.is_none() {
        s.c.note =
            Some("no zone of two nodes besides node1's: upstream's second zone not checked".into());
    }
    Ok(())
}

/// Servers on node1 and node2 hinted for their nodes, a client on each: each answered
/// by its own node's; server-1 deleted: both by server-2; a new server on node1: each
/// by its own again.
pub(super) fn prefer_same_node_fallback(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", 1)?;
    let two = s.server("server-2", s.far())?;
    let url = hinted(
        s,
        21,
        "PreferSameNode",
        &[node_hinted(&plan, &one), node_hinted(&plan, &two)],
    )?;
    answered_by(s, "client-1", &url, &[one.id()])?;
    answered_by(s, "client-2", &url, &[two.id()])?;
    hinted(s, 21, "PreferSameNode", &[node_hinted(&plan, &two)])?;
    s.delete("server-1")?;
    answered_by(s, "client-1", &url, &[two.id()])?;
    answered_by(s, "client-2", &url, &[two.id()])?;
    let new = s.server("server-1-new", 1)?;
    hinted(
        s,
        21,
        "PreferSameNode",
        &[node_hinted(&plan, &new), node_hinted(&plan, &two)],
    )?;
    answered_by(s, "client-1", &url, &[new.id()])?;
    answered_by(s, "client-2", &url, &[two.id()])?;
    Ok(())
}
