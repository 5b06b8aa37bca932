//! A real container runtime drives the CNI plugin, as kubelet's calls make it do in a
//! cluster: containerd (Debian's 1.6, with its CRI plugin) runs pod sandboxes on node1 of
//! a lab, asked through the CRI API. containerd makes each sandbox's network namespace,
//! calls `ferry-cni` (installed by `ferry-cni install`) with its own `CNI_ARGS` and
//! result version (the conflist's `cniVersion`, 1.0.0: containerd 1.6 cannot read a 1.1.0
//! result), and its DEL when the sandbox stops. Containers started in the sandboxes share its network: they reach each other,
//! pods on the other nodes (IPv4 and IPv6) and a Service's cluster IP, and a pod on
//! another node reaches them. Stopping a sandbox twice is one DEL; containerd killed
//! and started again finds its sandboxes as they were, still reachable; a sandbox
//! removed while node1's agent is down is queued by the plugin and carried out by the
//! next agent, which keeps the sandboxes that still run.
//!
//! The sandbox image is a static busybox imported into podman of the test's own and
//! saved for `ctr images import` (no registry is reachable).
//!
//! Needs root, containerd (with ctr), containernetworking-plugins (its `loopback`, which
//! containerd calls for every sandbox), runc, podman, busybox-static, iproute2 and curl.

mod common;
#[path = "cri/runtime.rs"]
mod runtime;

use std::fs;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::lab::{Lab, cni_plugin, ferry_lab, text};
use common::require;
use ferry_lab::{Plan, State};
use ipnet::IpNet;
use runtime::Runtime;

const POD_NS: &str = "cri";
/// The reference CNI plugins' `loopback` (Debian's containernetworking-plugins).
const LOOPBACK: &str = "/usr/lib/cni/loopback";

/// `ferry-cni install` into `bin` and `conf`, for node1's agent; the conflist it wrote
/// then given the lab's leases (`dataDir` and the network's name of the lab's own pods:
/// leases are kept per network name, one pool for both).
fn install_cni(lab: &Path, bin: &Path, conf: &Path) {
    common::sh(&[
        cni_plugin().to_str().unwrap(),
        "install",
        "--bin-dir",
        bin.to_str().unwrap(),
        "--conf-dir",
        conf.to_str().unwrap(),
        "--socket",
        lab.join("node1.sock").to_str().unwrap(),
    ]);
    let path = conf.join("10-ferry.conflist");
    let mut list: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(list["cniVersion"], "1.0.0", "what containerd 1.6 can read");
    list["name"] = "ferry-lab".into();
    list["plugins"][0]["dataDir"] = lab.join("cni").join("node1").display().to_string().into();
    fs::write(&path, list.to_string()).unwrap();
}

/// Whether some file under `dir` (the plugin's leases) is named `name`.
fn has_file(dir: &Path, name: &str) -> bool {
    fs::read_dir(dir).is_ok_and(|d| {
        d.filter_map(|e| e.ok()).any(|e| {
            let p = e.path();
            e.file_name().to_string_lossy() == name || (p.is_dir() && has_file(&p, name))
        })
    })
}

/// Runs `cmd` in container `id` until it exits 0 (5 s at most); its output.
fn exec_ok(rt: &Runtime, id: &str, cmd: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, out) = rt.exec(id, cmd);
        if code == 0 {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{cmd:?} in container {id} exited {code}: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `curl` in network namespace `netns` until it answers (5 s at most); the answer.
fn curl_from(netns: &str, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", netns, "curl", "-sS", "-m", "2", "-g", url])
            .output()
            .unwrap();
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "curl {url} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The sandbox's addresses: one IPv4 in node1's pod CIDR, one IPv6 in its IPv6 one.
fn check_addresses(ips: &[String]) -> (String, String) {
    let parsed: Vec<IpAddr> = ips.iter().map(|a| a.parse().unwrap()).collect();
    let v4: IpNet = Plan::pod_cidr(1).parse().unwrap();
    let v6: IpNet = Plan::pod_cidr6(1).parse().unwrap();
    let a4 = parsed.iter().find(|a| a.is_ipv4());
    let a6 = parsed.iter().find(|a| a.is_ipv6());
    assert!(
        a4.is_some_and(|a| v4.contains(a)) && a6.is_some_and(|a| v6.contains(a)),
        "the sandbox's addresses {ips:?} are not one of {v4} and one of {v6}"
    );
    (a4.unwrap().to_string(), a6.unwrap().to_string())
}

#[test]
fn containerd_runs_pod_sandboxes_through_the_cni_plugin() {
    require(&[
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("podman", "podman"),
        ("busybox", "busybox-static"),
        ("curl", "curl"),
        (LOOPBACK, "containernetworking-plugins"),
    ]);
    let lab = Lab::up("cri");
    let state = State::load(&lab.dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let image = runtime::build_image(&tmp.path().join("image"));
    let (conf, bin) = (tmp.path().join("net.d"), tmp.path().join("cni-bin"));
    install_cni(&lab.dir, &bin, &conf);
    // containerd brings up each sandbox's loopback interface with the reference plugin.
    std::os::unix::fs::symlink(LOOPBACK, bin.join("loopback")).unwrap();
    let leases = lab.dir.join("cni").join("node1");
    // Dropped before the lab: its sandboxes' DELs need node1's agent.
    let mut rt = Runtime::start(&tmp.path().join("containerd"), &conf, &bin, &image);

    // Two pods on node1, a server and a client, each a sandbox with a container.
    let web = rt
        .run_sandbox(POD_NS, "web")
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", rt.log()));
    let (ready, ips) = rt.sandbox(&web);
    assert!(ready, "the sandbox is not ready");
    let (web4, web6) = check_addresses(&ips);
    rt.run_container(
        &web,
        (POD_NS, "web"),
        "httpd",
        &["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
    );
    let client = rt.run_sandbox(POD_NS, "client").unwrap();
    let (_, client_ips) = rt.sandbox(&client);
    let (client4, _) = check_addresses(&client_ips);
    assert_ne!(client4, web4);
    let sh = rt.run_container(
        &client,
        (POD_NS, "client"),
        "sh",
        &["/bin/busybox", "sleep", "2147483647"],
    );

    // Pod to pod on the node, both families; to pods on the other nodes; to a Service.
    let page = format!("http://{web4}:8080/");
    assert_eq!(
        exec_ok(&rt, &sh, &["timeout", "3", "wget", "-qO-", &page]),
        "ferry-cri\n"
    );
    assert_eq!(
        exec_ok(
            &rt,
            &sh,
            &[
                "timeout",
                "3",
                "wget",
                "-qO-",
                &format!("http://[{web6}]:8080/")
            ]
        ),
        "ferry-cri\n"
    );
    for n in [2, 3] {
        let pod = state
            .pods
            .iter()
            .find(|p| p.node == n)
            .unwrap_or_else(|| panic!("the lab has no pod on node{n}"));
        exec_ok(
            &rt,
            &sh,
            &["ping", "-c", "1", "-W", "2", pod.ip4().unwrap()],
        );
        let ip6 = pod.ips.iter().find(|a| a.contains(':')).unwrap();
        exec_ok(&rt, &sh, &["ping", "-6", "-c", "1", "-W", "2", ip6]);
    }
    let service = format!("http://{}/hostname", ferry_lab::plan::cluster_ip::WEB);
    assert_eq!(
        exec_ok(&rt, &sh, &["timeout", "3", "wget", "-qO-", &service]).trim(),
        "web",
        "the Service's endpoint answers with its name"
    );
    // From a pod on node2 to the sandbox.
    let remote = state.pods.iter().find(|p| p.node == 2).unwrap();
    assert_eq!(curl_from(&remote.netns, &page), "ferry-cri\n");

    // A sandbox stopped twice (kubelet repeats its stops), then removed: its lease goes.
    rt.stop_sandbox(&client).expect("StopPodSandbox");
    rt.stop_sandbox(&client).expect("StopPodSandbox again");
    assert!(!rt.sandbox(&client).0, "a stopped sandbox is not ready");
    rt.remove_sandbox(&client).expect("RemovePodSandbox");
    assert!(
        !has_file(&leases, &client4),
        "the stopped sandbox's lease {client4} is still held"
    );
    assert!(has_file(&leases, &web4), "the running sandbox's lease");

    // containerd killed and started again: it finds its sandbox as it was, reachable,
    // and makes new ones.
    rt.restart();
    assert_eq!(rt.sandbox(&web), (true, ips.clone()));
    assert_eq!(curl_from(&remote.netns, &page), "ferry-cri\n");
    let after = rt.run_sandbox(POD_NS, "after").unwrap();
    let (_, after_ips) = rt.sandbox(&after);
    let (after4, _) = check_addresses(&after_ips);
    let sh2 = rt.run_container(
        &after,
        (POD_NS, "after"),
        "sh",
        &["/bin/busybox", "sleep", "2147483647"],
    );
    assert_eq!(
        exec_ok(&rt, &sh2, &["timeout", "3", "wget", "-qO-", &page]),
        "ferry-cri\n"
    );

    // A sandbox removed while node1's agent is down: the plugin queues its DEL and
    // releases its lease; the next agent carries the DEL out and keeps `web`.
    let pid = state.agent_pid(1).expect("node1's agent");
    common::sh(&["kill", "-KILL", &pid.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.stop_sandbox(&after)
        .unwrap_or_else(|e| panic!("StopPodSandbox with the agent down: {e}\n{}", rt.log()));
    rt.remove_sandbox(&after).expect("RemovePodSandbox");
    assert!(!has_file(&leases, &after4), "the lease of {after4} is held");
    let queue = ferry_api::del_queue_dir(&lab.dir.join("node1.sock"));
    assert_eq!(
        fs::read_dir(&queue).map(|d| d.count()).unwrap_or(0),
        1,
        "the DEL is queued"
    );
    let out = ferry_lab(&lab.dir, &["restart", "node1", "--kill"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read_dir(&queue).map(|d| d.count()).unwrap_or(0),
        0,
        "the next agent carried out the queued DEL"
    );
    assert_eq!(curl_from(&remote.netns, &page), "ferry-cri\n");
    let again = rt.run_sandbox(POD_NS, "after").unwrap();
    assert!(rt.sandbox(&again).0);

    for id in [web, again] {
        rt.stop_sandbox(&id).unwrap();
        rt.remove_sandbox(&id).unwrap();
    }
    assert!(rt.sandboxes().is_empty(), "containerd still has sandboxes");
    drop(rt);
    let mut lab = lab;
    if let Some(left) = lab.down() {
        panic!("the lab left: {left}");
    }
}
