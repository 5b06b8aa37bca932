//! The built `ferry-cni`, run as kubelet's container runtime runs it, against a fake
//! agent: the CNI protocol on one side, the agent's socket protocol on the other, and
//! the leases on disk in between.

mod common;

use std::collections::BTreeSet;

use common::{
    Cni, Env, FakeAgent, Reply, add_env, attach_env, finish, good_agent, run, run_raw, spawn, with,
};
use ferry_api::{Answer, Attachment, PodRef, Request, Response};
use serde_json::{Value, json};

#[test]
fn add_prints_the_spec_result_and_asks_the_agent_for_the_interface() {
    let cni = Cni::new();
    let out = run(&add_env("c1", "web-1"), &cni.conf("1.1.0")).ok();
    assert_eq!(
        out.stdout,
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [{
                "name": "eth0",
                "mac": "0a:58:0a:f4:01:02",
                "mtu": 1450,
                "sandbox": "/var/run/netns/cni-c1"
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
    assert_eq!(
        cni.agent().take_requests(),
        [
            Request::Node,
            Request::Add {
                container_id: "c1".into(),
                netns: "/var/run/netns/cni-c1".into(),
                ifname: "eth0".into(),
                pod: PodRef {
                    namespace: "default".into(),
                    name: "web-1".into()
                },
                addresses: vec!["10.244.1.2/24".into(), "fd00:10:244:1::2/64".into()],
            }
        ]
    );
    // host-local's files: the address names the file, which names the attachment.
    assert_eq!(
        cni.lease_files(),
        [
            ("10.244.1.2".into(), "c1\r\neth0".into()),
            ("fd00:10:244:1::2".into(), "c1\r\neth0".into())
        ]
    );
    let last = |n| std::fs::read_to_string(cni.leases().join(format!("last_reserved_ip.{n}")));
    assert_eq!(last(0).unwrap(), "10.244.1.2");
    assert_eq!(last(1).unwrap(), "fd00:10:244:1::2");
}

#[test]
fn add_answers_in_the_version_of_the_request() {
    let cni = Cni::new();
    let out = run(&add_env("c1", "a"), &cni.conf("0.4.0")).ok();
    assert_eq!(out.stdout["cniVersion"], "0.4.0");
    assert_eq!(out.stdout["ips"][0]["version"], "4");
    assert_eq!(out.stdout["ips"][1]["version"], "6");
    assert!(out.stdout["interfaces"][0].get("mtu").is_none());

    let out = run(&add_env("c2", "b"), &cni.conf("1.0.0")).ok();
    assert_eq!(out.stdout["cniVersion"], "1.0.0");
    assert!(out.stdout["ips"][0].get("version").is_none());
    assert!(out.stdout["interfaces"][0].get("mtu").is_none());
    assert_eq!(out.stdout["ips"][0]["address"], "10.244.1.3/24");
}

#[test]
fn add_on_a_single_stack_node_takes_one_address() {
    let cni = Cni::new();
    cni.agent().script(|r| good_agent(&["10.244.7.0/24"], r));
    let out = run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    assert_eq!(
        out.stdout["ips"],
        json!([{"address": "10.244.7.2/24", "gateway": "169.254.1.1", "interface": 0}])
    );
    assert_eq!(
        out.stdout["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}])
    );
}

#[test]
fn add_copies_the_configured_dns_into_the_result() {
    let cni = Cni::new();
    let mut conf = cni.conf("1.1.0");
    conf["dns"] = json!({"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]});
    let out = run(&add_env("c1", "a"), &conf).ok();
    assert_eq!(
        out.stdout["dns"],
        json!({"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]})
    );
}

#[test]
fn add_refused_by_the_agent_releases_the_leases_and_passes_its_error_on() {
    let cni = Cni::new();
    cni.agent().script(|r| match r {
        Request::Add { .. } => Reply::Answer(Response::error(
            ferry_api::ERR_TABLES,
            "the pod's interface could not be made",
            "ports[3] (\"pod.default.b\"): address 10.244.1.2 belongs to another pod",
        )),
        other => good_agent(&common::POD_CIDRS, other),
    });
    let out = run(&add_env("c1", "a"), &cni.conf("1.0.0"));
    assert_eq!(out.error_code(), 104);
    assert_eq!(
        out.stdout,
        json!({
            "cniVersion": "1.0.0",
            "code": 104,
            "msg": "the pod's interface could not be made",
            "details": "ports[3] (\"pod.default.b\"): address 10.244.1.2 belongs to another pod"
        })
    );
    assert_eq!(cni.lease_files(), []);
    let asked = cni.agent().take_requests();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(matches!(asked[1], Request::Add { .. }));
}

#[test]
fn add_left_unanswered_is_undone_at_the_agent_and_releases_the_leases() {
    let cni = Cni::new();
    cni.agent().script(|r| match r {
        Request::Add { .. } => Reply::HangUp,
        other => good_agent(&common::POD_CIDRS, other),
    });
    let out = run(&add_env("c1", "a"), &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 5);
    assert_eq!(cni.lease_files(), []);
    let asked = cni.agent().take_requests();
    assert_eq!(
        asked.last().unwrap(),
        &Request::Del {
            container_id: "c1".into(),
            ifname: "eth0".into()
        }
    );

    // An answer that is not a ferry-api Response: decoding failure, same clean-up.
    cni.agent().script(|r| match r {
        Request::Add { .. } => Reply::Raw("not json at all".into()),
        other => good_agent(&common::POD_CIDRS, other),
    });
    let out = run(&add_env("c2", "b"), &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 6);
    assert_eq!(cni.lease_files(), []);
}

#[test]
fn add_again_for_the_same_attachment_keeps_its_addresses() {
    let cni = Cni::new();
    let first = run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    let again = run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    assert_eq!(first.stdout, again.stdout);
    assert_eq!(cni.lease_files().len(), 2);

    // Refused the second time: the addresses stay with the attachment that has them.
    cni.agent().script(|r| match r {
        Request::Add { .. } => Reply::Answer(Response::error(11, "busy", "")),
        other => good_agent(&common::POD_CIDRS, other),
    });
    assert_eq!(
        run(&add_env("c1", "a"), &cni.conf("1.1.0")).error_code(),
        11
    );
    assert_eq!(cni.lease_files().len(), 2);
}

#[test]
fn add_on_a_node_without_pod_cidrs_is_try_again_later() {
    let cni = Cni::new();
    cni.agent().script(|r| good_agent(&[], r));
    let out = run(&add_env("c1", "a"), &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 11);
    assert!(!cni.leases().exists());
}

#[test]
fn add_with_the_agent_not_running_is_try_again_later_and_takes_nothing() {
    let cni = Cni::without_agent();
    let out = run(&add_env("c1", "a"), &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 11);
    assert!(
        out.stdout["details"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{out:?}"
    );
    assert!(!cni.leases().exists());
}

#[test]
fn exhausted_pod_cidr_is_a_clear_error_and_asks_the_agent_nothing_more() {
    let cni = Cni::new();
    // A /29 offers .2 to .6.
    cni.agent().script(|r| good_agent(&["10.0.0.0/29"], r));
    for i in 0..5 {
        run(&add_env(&format!("c{i}"), "p"), &cni.conf("1.1.0")).ok();
    }
    cni.agent().take_requests();
    let out = run(&add_env("c5", "p"), &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 200);
    assert_eq!(out.stdout["msg"], "no free address in 10.0.0.0/29");
    assert_eq!(cni.agent().take_requests(), [Request::Node]);
    assert_eq!(cni.lease_files().len(), 5);
}

#[test]
fn concurrent_adds_from_many_processes_never_share_an_address() {
    let cni = Cni::new();
    // 29 addresses in a /27: 24 pods fit, with little room to spare.
    cni.agent()
        .script(|r| good_agent(&["10.0.0.0/27", "fd00::/64"], r));
    let conf = cni.conf("1.1.0").to_string();
    let children: Vec<_> = (0..24)
        .map(|i| spawn(&add_env(&format!("c{i}"), "p"), conf.as_bytes()))
        .collect();
    let mut seen = BTreeSet::new();
    for child in children {
        let out = finish(child).ok();
        for ip in out.stdout["ips"].as_array().unwrap() {
            let address = ip["address"].as_str().unwrap().to_string();
            assert!(seen.insert(address.clone()), "{address} handed out twice");
        }
    }
    assert_eq!(seen.len(), 48);
    assert_eq!(cni.lease_files().len(), 48);
}

#[test]
fn del_twice_succeeds_both_times() {
    let cni = Cni::new();
    run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    run(&add_env("c2", "b"), &cni.conf("1.1.0")).ok();
    cni.agent().take_requests();
    // DEL as a runtime sends it: prevResult included, CNI_NETNS possibly gone.
    let mut conf = cni.conf("1.1.0");
    conf["prevResult"] = json!({"cniVersion": "1.1.0", "ips": []});
    let del = with(attach_env("DEL", "c1", "a"), "CNI_NETNS", None);
    for _ in 0..2 {
        let out = run(&del, &conf).ok();
        assert_eq!(out.stdout, Value::Null);
    }
    let del_request = Request::Del {
        container_id: "c1".into(),
        ifname: "eth0".into(),
    };
    assert_eq!(
        cni.agent().take_requests(),
        [del_request.clone(), del_request]
    );
    // Only c2's leases are left.
    let owners: BTreeSet<String> = cni.lease_files().into_iter().map(|(_, o)| o).collect();
    assert_eq!(owners, BTreeSet::from(["c2\r\neth0".to_string()]));
}

#[test]
fn del_of_a_container_the_agent_does_not_know_succeeds() {
    let cni = Cni::new();
    cni.agent().script(|r| match r {
        Request::Del { .. } => Reply::Answer(Response::error(3, "unknown container", "")),
        other => good_agent(&common::POD_CIDRS, other),
    });
    run(&attach_env("DEL", "never-added", "a"), &cni.conf("1.1.0")).ok();
    // Nor was a lease directory made for it.
    assert!(!cni.leases().exists());
}

#[test]
fn del_failing_at_the_agent_keeps_the_leases_for_the_retry() {
    let cni = Cni::new();
    run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    cni.agent().script(|r| match r {
        Request::Del { .. } => Reply::Answer(Response::error(11, "busy", "try again")),
        other => good_agent(&common::POD_CIDRS, other),
    });
    let del = attach_env("DEL", "c1", "a");
    assert_eq!(run(&del, &cni.conf("1.1.0")).error_code(), 11);
    assert_eq!(cni.lease_files().len(), 2);
    cni.agent().script(|r| good_agent(&common::POD_CIDRS, r));
    run(&del, &cni.conf("1.1.0")).ok();
    assert_eq!(cni.lease_files(), []);
}

#[test]
fn del_with_the_agent_not_running_releases_the_leases_and_says_so() {
    let mut cni = Cni::new();
    run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok();
    cni.agent = None;
    let out = run(&attach_env("DEL", "c1", "a"), &cni.conf("1.1.0")).ok();
    assert!(out.stderr.contains("not running"), "{out:?}");
    assert_eq!(cni.lease_files(), []);
    // The DEL waits in the queue next to the socket for the agent to carry it out, as
    // the request it would have been sent; nothing else is left there.
    let queue = cni.dir.path().join("ferry.sock.del-queue");
    let names: Vec<String> = std::fs::read_dir(&queue)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["c1:eth0.json"]);
    let queued: Request =
        serde_json::from_slice(&std::fs::read(queue.join("c1:eth0.json")).unwrap()).unwrap();
    assert_eq!(
        queued,
        Request::Del {
            container_id: "c1".into(),
            ifname: "eth0".into()
        }
    );
    assert!(out.stderr.contains("queued"), "{out:?}");

    // With the agent back, DEL asks it and queues nothing more.
    cni.agent = Some(FakeAgent::start(&cni.dir.path().join("ferry.sock")));
    std::fs::remove_file(queue.join("c1:eth0.json")).unwrap();
    run(&attach_env("DEL", "c1", "a"), &cni.conf("1.1.0")).ok();
    assert_eq!(std::fs::read_dir(&queue).unwrap().count(), 0);
    assert_eq!(cni.agent().take_requests().len(), 1);
}

#[test]
fn check_passes_on_the_add_result_and_fails_when_they_differ() {
    let cni = Cni::new();
    let added = run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok().stdout;
    cni.agent().take_requests();
    let check = attach_env("CHECK", "c1", "a");
    let mut conf = cni.conf("1.1.0");
    conf["prevResult"] = added.clone();
    let out = run(&check, &conf).ok();
    assert_eq!(out.stdout, Value::Null);
    assert_eq!(
        cni.agent().take_requests(),
        [Request::Check {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/cni-c1".into()
        }]
    );

    // An address the leases do not hold.
    let mut other = added.clone();
    other["ips"][0]["address"] = json!("10.244.1.99/24");
    conf["prevResult"] = other;
    let out = run(&check, &conf);
    assert_eq!(out.error_code(), 201);
    assert!(
        out.stdout["details"]
            .as_str()
            .unwrap()
            .contains("10.244.1.99"),
        "{out:?}"
    );

    // Another MAC than the agent reports.
    let mut other = added.clone();
    other["interfaces"][0]["mac"] = json!("0a:58:00:00:00:01");
    conf["prevResult"] = other;
    cni.agent().script(|r| match r {
        Request::Check { .. } => Reply::Answer(Response::Ok(ferry_api::Answer {
            mac: Some("0a:58:0a:f4:01:02".into()),
            ..Default::default()
        })),
        other => good_agent(&common::POD_CIDRS, other),
    });
    assert_eq!(run(&check, &conf).error_code(), 201);

    // The agent's own verdict passes through.
    conf["prevResult"] = added;
    cni.agent().script(|r| match r {
        Request::Check { .. } => Reply::Answer(Response::error(
            ferry_api::ERR_AGENT,
            "the pod has no port in the tables in force",
            "default/a",
        )),
        other => good_agent(&common::POD_CIDRS, other),
    });
    assert_eq!(run(&check, &conf).error_code(), 100);
}

#[test]
fn check_of_a_container_nobody_knows_is_unknown_container() {
    let cni = Cni::new();
    let added = run(&add_env("c1", "a"), &cni.conf("1.1.0")).ok().stdout;
    run(&attach_env("DEL", "c1", "a"), &cni.conf("1.1.0")).ok();
    cni.agent().script(|r| match r {
        Request::Check { .. } => Reply::Answer(Response::error(3, "unknown container", "")),
        other => good_agent(&common::POD_CIDRS, other),
    });
    let mut conf = cni.conf("1.1.0");
    conf["prevResult"] = added.clone();
    assert_eq!(run(&attach_env("CHECK", "c1", "a"), &conf).error_code(), 3);

    // Leases still held: the container is not unknown, the check failed.
    run(&add_env("c2", "b"), &cni.conf("1.1.0")).ok();
    let out = run(&attach_env("CHECK", "c2", "b"), &conf);
    assert_eq!(out.error_code(), 201);
}

#[test]
fn check_needs_a_prev_result_and_the_agent() {
    let mut cni = Cni::new();
    assert_eq!(
        run(&attach_env("CHECK", "c1", "a"), &cni.conf("1.1.0")).error_code(),
        7
    );
    let added = run(&add_env("c1", "a"), &cni.conf("0.4.0")).ok().stdout;
    let mut conf = cni.conf("0.4.0");
    conf["prevResult"] = added;
    run(&attach_env("CHECK", "c1", "a"), &conf).ok();
    cni.agent = None;
    assert_eq!(run(&attach_env("CHECK", "c1", "a"), &conf).error_code(), 11);
}

#[test]
fn status_asks_the_agent_and_its_node_and_is_51_without_the_agent() {
    let cni = Cni::new();
    let status = vec![("CNI_COMMAND".to_string(), "STATUS".to_string())];
    let out = run(&status, &cni.conf("1.1.0")).ok();
    assert_eq!(out.stdout, Value::Null);
    assert_eq!(
        cni.agent().take_requests(),
        [Request::Status, Request::Node]
    );

    // The agent says it cannot: its code and message.
    cni.agent().script(|_| {
        Reply::Answer(Response::error(
            51,
            "the agent's dataplane is not running",
            "worker: port up1: the device is gone",
        ))
    });
    let out = run(&status, &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 51);
    assert_eq!(out.stdout["msg"], "the agent's dataplane is not running");

    // An ADD would find no pod CIDR for this node: 50.
    cni.agent().script(|r| match r {
        Request::Node => Reply::Answer(Response::Ok(Answer {
            node: Some("node-1".into()),
            ..Answer::default()
        })),
        _ => Reply::Answer(Response::Ok(Answer::default())),
    });
    let out = run(&status, &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 50);
    assert!(
        out.stdout["msg"].as_str().unwrap().contains("no pod CIDR"),
        "{out:?}"
    );
    cni.agent().script(|r| match r {
        Request::Node => Reply::Answer(Response::error(
            11,
            "this node is not in the cluster state yet",
            "node-1",
        )),
        _ => Reply::Answer(Response::Ok(Answer::default())),
    });
    let out = run(&status, &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 50);

    // No agent: its process carries the pods' traffic, so 51.
    let cni = Cni::without_agent();
    let out = run(&status, &cni.conf("1.1.0"));
    assert_eq!(out.error_code(), 51);
    assert_eq!(out.stdout["cniVersion"], "1.1.0");
}

#[test]
fn gc_releases_stale_leases_then_asks_the_agent() {
    let cni = Cni::new();
    for id in ["keep", "stale"] {
        run(&add_env(id, id), &cni.conf("1.1.0")).ok();
    }
    cni.agent().take_requests();
    let mut conf = cni.conf("1.1.0");
    conf["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    // libcni sets the attachment variables empty for GC.
    let gc = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_CONTAINERID".to_string(), String::new()),
        ("CNI_NETNS".to_string(), String::new()),
        ("CNI_IFNAME".to_string(), String::new()),
        ("CNI_ARGS".to_string(), String::new()),
        ("CNI_PATH".to_string(), "/opt/cni/bin".to_string()),
    ];
    let out = run(&gc, &conf).ok();
    assert_eq!(out.stdout, Value::Null);
    let owners: BTreeSet<String> = cni.lease_files().into_iter().map(|(_, o)| o).collect();
    assert_eq!(owners, BTreeSet::from(["keep\r\neth0".to_string()]));
    assert_eq!(
        cni.agent().take_requests(),
        [Request::Gc {
            valid: vec![Attachment {
                container_id: "keep".into(),
                ifname: "eth0".into()
            }]
        }]
    );

    // The agent failing is reported, after the leases were collected all the same.
    run(&add_env("stale2", "s"), &cni.conf("1.1.0")).ok();
    cni.agent()
        .script(|_| Reply::Answer(Response::error(5, "cannot list TAPs", "")));
    assert_eq!(run(&gc, &conf).error_code(), 5);
    assert_eq!(cni.lease_files().len(), 2);

    // GC without CNI_PATH is an invalid environment, as the specification has it.
    assert_eq!(run(&with(gc, "CNI_PATH", None), &conf).error_code(), 4);
}

#[test]
fn version_lists_the_supported_versions() {
    let version = vec![("CNI_COMMAND".to_string(), "VERSION".to_string())];
    let out = run(&version, &json!({"cniVersion": "1.1.0"})).ok();
    assert_eq!(
        out.stdout,
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
    // libcni asks with its own version, whatever it is.
    run(&version, &json!({"cniVersion": "0.2.0"})).ok();
    run_raw(&version, b"").ok();
}

#[test]
fn bad_requests_change_nothing_and_ask_the_agent_nothing() {
    let cni = Cni::new();
    let good = cni.conf("1.1.0");
    let env = add_env("c1", "a");
    let bad_env = [
        ("CNI_COMMAND", None),
        ("CNI_COMMAND", Some("INIT")),
        ("CNI_CONTAINERID", None),
        ("CNI_CONTAINERID", Some("a b")),
        ("CNI_NETNS", None),
        ("CNI_NETNS", Some("relative/netns")),
        ("CNI_IFNAME", Some("eth0:1")),
        ("CNI_ARGS", Some("IgnoreUnknown=1")),
        (
            "CNI_ARGS",
            Some("K8S_POD_NAMESPACE=default;K8S_POD_NAME=a;junk"),
        ),
    ];
    let mut cases: Vec<(String, Env, Vec<u8>, u64)> = bad_env
        .into_iter()
        .map(|(name, value)| {
            let what = format!("{name}={value:?}");
            let stdin = good.to_string().into_bytes();
            (what, with(env.clone(), name, value), stdin, 4)
        })
        .collect();
    let conf_with = |key: &str, v: Value| {
        let mut c = good.clone();
        c[key] = v;
        c.to_string().into_bytes()
    };
    let bad_conf = [
        ("not JSON", b"{\"cniVersion\":".to_vec(), 6),
        ("empty input", Vec::new(), 6),
        ("old version", conf_with("cniVersion", json!("0.3.1")), 1),
        ("no version", br#"{"name": "ferry"}"#.to_vec(), 1),
        ("no name", conf_with("name", json!("")), 7),
        ("bad dataDir", conf_with("dataDir", json!("leases")), 7),
        ("socket not a string", conf_with("socket", json!(1)), 6),
        ("ipam", conf_with("ipam", json!({"type": "host-local"})), 2),
    ];
    for (what, stdin, code) in bad_conf {
        cases.push((what.to_string(), env.clone(), stdin, code));
    }
    for (what, env, stdin, want) in cases {
        let out = run_raw(&env, &stdin);
        assert_eq!(out.error_code(), want, "{what}: {out:?}");
        let msg = out.stdout["msg"].as_str().unwrap_or_default();
        assert!(!msg.is_empty(), "{what}: {out:?}");
        assert_eq!(
            cni.agent().take_requests(),
            [],
            "{what}: the agent was asked"
        );
        assert!(!cni.leases().exists(), "{what}: leases were touched");
    }
}

#[test]
fn run_by_hand_without_environment_says_what_it_is() {
    let out = run_raw(&[], b"");
    assert_eq!(out.error_code(), 4);
    assert!(
        out.stdout["details"]
            .as_str()
            .unwrap()
            .contains("ferry-cni install"),
        "{out:?}"
    );
}

#[test]
fn install_puts_the_plugin_and_conflist_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("opt/cni/bin");
    let conf = dir.path().join("etc/cni/net.d");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry-cni"))
        .arg("install")
        .arg("--bin-dir")
        .arg(&bin)
        .arg("--conf-dir")
        .arg(&conf)
        .args(["--socket", "/run/ferry/ferry.sock"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let installed = bin.join("ferry-cni");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(env!("CARGO_BIN_EXE_ferry-cni")).unwrap()
    );
    let conflist: Value =
        serde_json::from_slice(&std::fs::read(conf.join("10-ferry.conflist")).unwrap()).unwrap();
    assert_eq!(
        conflist,
        json!({
            "cniVersion": "1.0.0",
            "cniVersions": ["1.0.0", "1.1.0"],
            "name": "ferry",
            "plugins": [{"type": "ferry-cni", "socket": "/run/ferry/ferry.sock"}]
        })
    );
    // The installed copy is the plugin: it answers VERSION.
    let version = std::process::Command::new(&installed)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(version.status.success());
    let answer: Value = serde_json::from_slice(&version.stdout).unwrap();
    assert_eq!(answer["cniVersion"], "1.1.0");
}

#[test]
fn the_plugin_configuration_installed_drives_the_plugin() {
    // The conflist's plugin object, as libcni passes it (name and cniVersion injected
    // from the list: its `cniVersion` by a libcni before spec 1.1.0, the highest of its
    // `cniVersions` by a later one), works against an agent at its socket, and the
    // result is of the version asked for.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let agent = FakeAgent::start(&socket);
    let list = ferry_cni::install::conflist(&socket);
    let versions = list["cniVersions"].as_array().unwrap();
    assert!(versions.contains(&list["cniVersion"]), "{list}");
    for (i, version) in versions.iter().enumerate() {
        let mut plugin = list["plugins"][0].clone();
        plugin["name"] = list["name"].clone();
        plugin["cniVersion"] = version.clone();
        plugin["dataDir"] = json!(dir.path().join("leases"));
        let out = run(&add_env(&format!("c{i}"), &format!("p{i}")), &plugin).ok();
        assert_eq!(out.stdout["cniVersion"], *version, "{out:?}");
        assert_eq!(agent.take_requests().len(), 2);
    }
}
