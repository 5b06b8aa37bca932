//! NetworkPolicy on two nodes, from a directory of manifests, with real TCP clients:
//! a policy isolating the web pod (node 2) denies the client (node 1) directly and
//! through the Service, its rule naming the client's label lets it in again, a label
//! taken off the client shuts it out, a bad edit of the policy is refused and reported
//! with the older version in force, and ClusterNetworkPolicy's Admin tier denies what
//! the NetworkPolicy allows. `ferry policy explain` and `preview` are asked over
//! the local API; the denials are counted.
//!
//! The lab and the cluster are in `common/two_nodes.rs`.
//! Needs root, iproute2, curl and python3.

mod common;

use std::fs;

use common::two_nodes::{ADMIN_DENY, TwoNodes, WEB_FROM_FRIENDS, pod};
use ferry_agent::api::call;
use ferry_api::{Answer, Request, Response};

fn ask(c: &TwoNodes, n: u8, req: &Request) -> Answer {
    match call(&c.socket(n), req).unwrap() {
        Response::Ok(a) => a,
        r => panic!("{req:?}: {r:?}"),
    }
}

/// Node `n`'s counters of `policy`, once `ready` holds of them: the agent's counters are
/// a snapshot at most 100 ms old, so a connection just made may not be in them yet.
fn policy_counters(
    c: &TwoNodes,
    n: u8,
    policy: &str,
    ready: impl Fn(&ferry_api::PolicyCounters) -> bool,
) -> ferry_api::PolicyCounters {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let counters = ask(c, n, &Request::Counters).counters.unwrap();
        let p = counters.policies.get(policy).copied().unwrap_or_default();
        if ready(&p) || std::time::Instant::now() > deadline {
            return p;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// What node `n` says of its policies, once `ready` holds of it (within 10 s).
fn enforcement(
    c: &TwoNodes,
    n: u8,
    ready: impl Fn(&ferry_api::PolicyEnforcement) -> bool,
) -> ferry_api::PolicyEnforcement {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let e = ask(c, n, &Request::Counters).counters.unwrap().enforcement;
        if ready(&e) {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node{n} did not report the policies awaited within 10 s: {e:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The pods manifest with the client labelled `extra` (a YAML mapping's entries).
fn pods(client_labels: &str) -> String {
    let client = pod("client", 1, "10.244.1.5").replace(
        "labels: { app: client }",
        &format!("labels: {{ app: client{client_labels} }}"),
    );
    format!("{client}---{}", pod("web", 2, "10.244.2.5"))
}

#[test]
fn network_policy_is_enforced_explained_and_previewed() {
    let mut c = TwoNodes::with_file_datastore("np", &[]);
    let dir = c.manifest_dir();
    let direct = "http://10.244.2.5:8080/hostname";
    let service = "http://10.96.0.10/hostname";
    assert_eq!(c.curl("p1a", direct), "web", "no policy yet");
    assert_eq!(c.curl("p1a", service), "web");

    // The preview on node 2 (the web pod's) names the connections just made, which
    // the policy would not allow, and changes nothing.
    let preview = ask(
        &c,
        2,
        &Request::PolicyPreview {
            manifests: WEB_FROM_FRIENDS.into(),
            delete: false,
        },
    )
    .policy
    .unwrap()
    .preview
    .unwrap();
    assert_eq!(preview.objects, ["NetworkPolicy default/web-from-friends"]);
    assert!(!preview.reevaluate);
    assert!(
        preview
            .cut
            .iter()
            .any(|x| x.original.contains("10.244.1.5") && x.denial.contains("denied")),
        "{preview:?}"
    );
    assert_eq!(c.curl("p1a", direct), "web", "a preview changes nothing");

    // In force: the client is denied, directly and through the Service (decided on the
    // endpoint after DNAT), at node 2, the destination's node.
    fs::write(dir.join("policy.yaml"), WEB_FROM_FRIENDS).unwrap();
    c.wait_curl(10, "p1a", direct, 28, "the policy in force");
    assert_eq!(c.try_curl("p1a", service).0, 28, "through the Service too");
    let np = policy_counters(&c, 2, "NetworkPolicy default/web-from-friends", |p| {
        p.ingress_denied >= 2
    });
    assert!(np.ingress_denied >= 2, "{np:?}");
    let counters = ask(&c, 2, &Request::Counters).counters.unwrap();
    assert!(counters.policy_denied >= 2, "{}", counters.policy_denied);

    let explained = ask(
        &c,
        1,
        &Request::Policy {
            pod: Some("default/web".into()),
        },
    )
    .policy
    .unwrap();
    let web = explained.pod.unwrap();
    assert_eq!(web.node.as_deref(), Some("node2"));
    assert_eq!(
        web.directions[0].isolated_by,
        ["NetworkPolicy default/web-from-friends"]
    );
    // No pod is a friend yet: the rule's peers are none.
    assert_eq!(web.directions[0].rules[0].matches[0].peers, Some(vec![]));
    let listed = &explained.policies[0];
    assert_eq!(listed.name, "NetworkPolicy default/web-from-friends");
    assert!(listed.local_pods.is_empty(), "node 1 has no web pod");

    // The client becomes a friend: let in, on node 2, though the client runs on node 1.
    fs::write(dir.join("pods.yaml"), pods(", role: friend")).unwrap();
    c.wait_curl(10, "p1a", direct, 0, "the client's label in force");
    assert_eq!(
        c.curl("p1a", "http://10.244.2.5:8080/clientip"),
        "10.244.1.5"
    );
    let np = policy_counters(&c, 2, "NetworkPolicy default/web-from-friends", |p| {
        p.ingress_allowed >= 1
    });
    assert!(np.ingress_allowed >= 1, "{np:?}");

    // A bad edit of the policy: the directory is refused, the policy in force stays,
    // and node 2 says which one is enforced in an older version, and why.
    let bad = WEB_FROM_FRIENDS.replace(
        "podSelector: { matchLabels: { app: web } }",
        "podSelector: { matchExpressions: [{ key: app, operator: Equals, values: [web] }] }",
    );
    fs::write(dir.join("policy.yaml"), bad).unwrap();
    let e = enforcement(&c, 2, |e| !e.unenforced.is_empty());
    let u = &e.unenforced[0];
    assert_eq!(
        (u.policy.as_str(), u.state),
        (
            "default/web-from-friends",
            ferry_api::Enforcement::OlderVersion
        ),
        "{e:?}"
    );
    assert!(
        u.reasons[0].starts_with(
            "refused: policy.yaml:2: spec.podSelector.matchExpressions[0].operator: \"Equals\""
        ),
        "{u:?}"
    );
    assert!(
        e.stale
            .as_deref()
            .is_some_and(|s| s.contains("last good state")),
        "{e:?}"
    );
    assert_eq!(
        c.curl("p1a", direct),
        "web",
        "the older version still lets friends in"
    );
    let status = ask(&c, 2, &Request::Counters).counters.unwrap();
    assert!(!status.datastore.synced, "{:?}", status.datastore);
    fs::write(dir.join("policy.yaml"), WEB_FROM_FRIENDS).unwrap();
    let e = enforcement(&c, 2, |e| e.unenforced.is_empty() && e.stale.is_none());
    assert_eq!(e.network_policies, 1, "{e:?}");

    // The Admin tier denies what the NetworkPolicy allows.
    fs::write(dir.join("admin.yaml"), ADMIN_DENY).unwrap();
    c.wait_curl(10, "p1a", direct, 28, "the Admin tier deny in force");
    let cnp = policy_counters(&c, 2, "ClusterNetworkPolicy deny-to-web", |p| {
        p.ingress_denied >= 1
    });
    assert!(cnp.ingress_denied >= 1, "{cnp:?}");
    fs::remove_file(dir.join("admin.yaml")).unwrap();
    c.wait_curl(10, "p1a", direct, 0, "the Admin tier deny gone");

    // The label goes: shut out again; the policy goes: open to all.
    fs::write(dir.join("pods.yaml"), pods("")).unwrap();
    c.wait_curl(10, "p1a", direct, 28, "the label gone");
    fs::remove_file(dir.join("policy.yaml")).unwrap();
    c.wait_curl(10, "p1a", direct, 0, "the policy gone");
}
