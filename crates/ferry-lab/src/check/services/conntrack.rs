//! The cases of conntrack.go: UDP flows that must follow their Service's endpoints as
//! server pods cycle or get ready, and out-of-window TCP segments that must not reset
//! a connection.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferry_linux::cmd::Cmd;

use super::{Cond, NAMESPACE, Scene, UDP_PORT, cluster_ip, endpoint, node_port, service, slice};
use crate::state::Pod;
use crate::sys;

/// A UDP Service `udp` at cluster IP `n` (with node port `n` when `node_port`) over the
/// servers `eps`.
fn udp_service(n: u8, node_port_too: bool, eps: &[String]) -> String {
    let (kind, np) = match node_port_too {
        true => ("NodePort", format!(", nodePort: {}", node_port(n))),
        false => ("ClusterIP", String::new()),
    };
    let ip = cluster_ip(n);
    service(
        "udp",
        "",
        &format!(
            "  type: {kind}\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports: [{{ name: udp, protocol: UDP, port: 80, targetPort: 8081{np} }}]\n"
        ),
    ) + &slice("udp", "", UDP_PORT, eps)
}

/// The UDP cycling cases: `from` asks `to` over one socket; server-1 on the far node
/// answers; server-2 comes (ready), server-1 goes (deleted: out of the slice, then its
/// pod removed); the answers must end at server-2 (upstream waits for server-2 in the
/// client's log; a connection left pinned to server-1 would go silent instead).
fn udp_cycle(s: &mut Scene, n: u8, node_port_too: bool, from: &str, to: String) -> Result<()> {
    let far = s.far();
    let plan = s.plan().clone();
    let one = s.server("server-1", far)?;
    s.apply(&udp_service(
        n,
        node_port_too,
        &[endpoint(&plan, &one, Cond::Ready, "")],
    ))?;
    let first = s.ask_udp(from, &to)?;
    ensure!(
        first == one.id(),
        "{to} from {from}: answered {first:?}, not {}",
        one.id()
    );
    let (answers, gap) = s.udp_stream_while(from, &to, 8, |s| {
        let two = s.server("server-2", far)?;
        let both = [
            endpoint(&plan, &one, Cond::Ready, ""),
            endpoint(&plan, &two, Cond::Ready, ""),
        ];
        s.apply(&udp_service(n, node_port_too, &both))?;
        std::thread::sleep(Duration::from_secs(1));
        s.apply(&udp_service(
            n,
            node_port_too,
            &[endpoint(&plan, &two, Cond::Ready, "")],
        ))?;
        s.delete("server-1")
    })?;
    let want = format!("{NAMESPACE}/server-2");
    ensure!(
        answers.first().map(String::as_str) == Some(one.id().as_str())
            && answers.last() == Some(&want),
        "answers {answers:?}: wanted {} then {want}",
        one.id()
    );
    s.c.note = Some(format!("answers {answers:?}, longest silence {gap} ms"));
    Ok(())
}

pub(super) fn udp_cycle_node_port(s: &mut Scene) -> Result<()> {
    let to = format!("{}:{}", s.plan().node_ip(s.far()), node_port(1));
    udp_cycle(s, 1, true, "client-1", to)
}

pub(super) fn udp_cycle_cluster_ip(s: &mut Scene) -> Result<()> {
    udp_cycle(s, 2, false, "client-1", format!("{}:80", cluster_ip(2)))
}

pub(super) fn udp_cycle_host_network(s: &mut Scene) -> Result<()> {
    udp_cycle(s, 3, false, "node1", format!("{}:80", cluster_ip(3)))
}

/// UDP Service `udp` at cluster IP `n`, internalTrafficPolicy Local, over `eps`.
fn udp_local_service(n: u8, eps: &[String]) -> String {
    let ip = cluster_ip(n);
    service(
        "udp",
        "",
        &format!(
            "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  internalTrafficPolicy: Local\n  ports: [{{ name: udp, protocol: UDP, port: 80, targetPort: 8081 }}]\n"
        ),
    ) + &slice("udp", "", UDP_PORT, eps)
}

/// Upstream (a regression test of kubernetes#126934): while no local endpoint is left,
/// the client's datagrams must not leave a connection behind that outlives the new
/// local endpoint.
pub(super) fn udp_cycle_local(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", 1)?;
    let two = s.server("server-2", s.far())?;
    let ep = |p: &Pod| endpoint(&plan, p, Cond::Ready, "");
    s.apply(&udp_local_service(22, &[ep(&one), ep(&two)]))?;
    let to = format!("{}:80", cluster_ip(22));
    let (answers, _) = s.udp_stream_while("client-1", &to, 14, |s| {
        std::thread::sleep(Duration::from_secs(1));
        s.apply(&udp_local_service(22, &[ep(&two)]))?;
        s.delete("server-1")?;
        std::thread::sleep(Duration::from_secs(5));
        let three = s.server("server-3", 1)?;
        s.apply(&udp_local_service(22, &[ep(&three), ep(&two)]))
    })?;
    let want = [one.id(), format!("{NAMESPACE}/server-3")];
    ensure!(answers == want, "answers {answers:?}: wanted {want:?}");
    Ok(())
}

/// Upstream: the client sends before its server's readiness passes (the Service has no
/// ready endpoint: a kernel proxy may keep a conntrack entry of the rejection), then the
/// server gets ready; its answers must arrive.
pub(super) fn udp_unready_gets_ready(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", s.far())?;
    s.apply(&udp_service(
        4,
        false,
        &[endpoint(&plan, &one, Cond::Unready, "")],
    ))?;
    let to = format!("{}:80", cluster_ip(4));
    let (answers, _) = s.udp_stream_while("client-1", &to, 5, |s| {
        std::thread::sleep(Duration::from_secs(1));
        s.apply(&udp_service(
            4,
            false,
            &[endpoint(&plan, &one, Cond::Ready, "")],
        ))
    })?;
    ensure!(
        answers == [one.id()],
        "answers {answers:?}: wanted {} once ready",
        one.id()
    );
    Ok(())
}

/// Upstream: the boom server (`ferry lab boom-server`, see [`crate::boom`]) on the
/// server node, a client opening a connection to it through the cluster IP every
/// couple of seconds; a reset from the client fails the case, and so does no
/// connection established.
pub(super) fn invalid_dropped(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("boom-server", s.far())?;
    let ip = cluster_ip(25);
    s.apply(&(service(
        "boom-server",
        "",
        &format!(
            "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports: [{{ name: boom, protocol: TCP, port: 9000, targetPort: 9000 }}]\n"
        ),
    ) + &slice(
        "boom-server",
        "",
        "[{ name: boom, protocol: TCP, port: 9000 }]",
        &[endpoint(&plan, &one, Cond::Ready, "")],
    )))?;
    let ferry = s.c.state.ferry.display().to_string();
    let server = Cmd::new(&ferry)
        .args(["lab", "boom-server", "--port", "9000", "--secs", "8"])
        .netns(s.ns("boom-server")?)
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(500));
    let client = format!(
        "for i in 1 2 3 4 5; do nc -w 3 {ip} 9000 </dev/null >/dev/null 2>&1 & sleep 1; done; wait"
    );
    let clients = sys::exec_in(&s.ns("client-1")?, 15, &["sh", "-c", &client]);
    let out = server.wait_with_output()?;
    clients?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "boom-server: {log}");
    let report: crate::boom::Report = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("boom-server's report: {log}"))?;
    ensure!(
        report.established > 0 && report.injected > 0,
        "boom-server sent no bad segment: {report:?} {log}"
    );
    ensure!(
        report.resets == 0,
        "the client reset its connection: {report:?} {log}"
    );
    s.c.note = Some(format!(
        "{} connections, {} out-of-window segments, no reset",
        report.established, report.injected
    ));
    Ok(())
}
