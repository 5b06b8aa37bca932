use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::cluster::Object;
use crate::{KubeDatastore, Update};

fn np(name: &str, version: &str, operator: &str) -> Object {
    let v = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": version, "generation": 1},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": "app", "operator": operator, "values": ["web"]}]},
            "policyTypes": ["Ingress"],
        },
    });
    Object::NetworkPolicy(serde_json::from_value(v).unwrap())
}

fn cnp(action: &str) -> Object {
    // A peer of a newer CRD: its one field is unknown to ferry and dropped on the way in.
    let v = json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "guard", "resourceVersion": "7"},
        "spec": {
            "tier": "Admin", "priority": 5, "subject": {"namespaces": {}},
            "egress": [
                {"name": "known", "action": "Accept", "to": [{"networks": ["10.0.0.0/8"]}]},
                {"name": "newer", "action": action, "to": [{"networks": ["192.0.2.0/24"]}, {"fqdnsOfTheFuture": ["x"]}]},
            ],
        },
    });
    Object::ClusterNetworkPolicy(serde_json::from_value(v).unwrap())
}

/// A Kubernetes datastore that has listed every kind, empty.
fn listed() -> KubeDatastore {
    let mut ds = KubeDatastore::new();
    for kind in Kind::ALL {
        ds.event(kind, Event::Init);
        ds.event(kind, Event::InitDone);
    }
    ds.take_updates();
    ds
}

/// The report of the datastore's state, put in force as it is.
fn of(ds: &KubeDatastore) -> PolicyEnforcement {
    report(&ds.current(), Sources::default())
}

/// True when `u` holds a state: the agent hears of the change.
fn sends_state(u: &[Update]) -> bool {
    u.iter().any(|u| matches!(u, Update::Applied { .. }))
}

#[test]
fn a_refused_first_version_is_not_enforced_until_a_good_one_comes() {
    let mut ds = listed();
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "10", "Bogus")));
    assert!(
        sends_state(&ds.take_updates()),
        "the refusal goes out with the state"
    );
    let r = of(&ds);
    assert_eq!(r.network_policies, 0);
    let [u] = &r.unenforced[..] else {
        panic!("{r:?}")
    };
    assert_eq!(
        (u.kind.as_str(), u.policy.as_str(), u.state),
        ("NetworkPolicy", "default/deny", Enforcement::NotEnforced)
    );
    assert_eq!(u.enforced_version, None);
    assert_eq!(
        u.latest_version.as_deref(),
        Some("resourceVersion 10, generation 1")
    );
    assert!(
        u.reasons[0].starts_with("refused: spec.podSelector.matchExpressions[0].operator: "),
        "{u:?}"
    );

    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "11", "In")));
    assert!(sends_state(&ds.take_updates()));
    let r = of(&ds);
    assert_eq!((r.network_policies, r.unenforced.len()), (1, 0), "{r:?}");
}

#[test]
fn a_refused_update_leaves_the_older_version_enforced_and_says_which() {
    let mut ds = listed();
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "10", "In")));
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "11", "Bogus")));
    ds.take_updates();
    let r = of(&ds);
    assert_eq!(r.network_policies, 1, "the good version is in force");
    let [u] = &r.unenforced[..] else {
        panic!("{r:?}")
    };
    assert_eq!(u.state, Enforcement::OlderVersion);
    assert_eq!(
        u.enforced_version.as_deref(),
        Some("resourceVersion 10, generation 1")
    );
    assert_eq!(
        u.latest_version.as_deref(),
        Some("resourceVersion 11, generation 1")
    );
    // The good version again (a rollback) clears it, as a newer good one would.
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "10", "In")));
    assert!(sends_state(&ds.take_updates()), "nothing else changed");
    assert!(of(&ds).unenforced.is_empty());
}

#[test]
fn deleting_a_refused_policy_or_listing_without_it_clears_it() {
    let mut ds = listed();
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "10", "Bogus")));
    ds.take_updates();
    assert_eq!(of(&ds).unenforced.len(), 1);
    ds.event(
        Kind::NetworkPolicy,
        Event::Delete(np("deny", "12", "Bogus")),
    );
    // Nothing of it was in force: only the refusal's end goes out.
    assert!(sends_state(&ds.take_updates()));
    assert!(of(&ds).unenforced.is_empty());

    // An older version in force, then a bad one, then a relist that has neither.
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "20", "In")));
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "21", "Bogus")));
    ds.take_updates();
    assert_eq!(of(&ds).unenforced[0].state, Enforcement::OlderVersion);
    ds.event(Kind::NetworkPolicy, Event::Init);
    ds.event(Kind::NetworkPolicy, Event::InitDone);
    ds.take_updates();
    let r = of(&ds);
    assert_eq!((r.network_policies, r.unenforced.len()), (0, 0), "{r:?}");
    // And the same refusal again is no news.
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "30", "Bogus")));
    ds.take_updates();
    ds.event(Kind::NetworkPolicy, Event::Apply(np("deny", "30", "Bogus")));
    assert!(!sends_state(&ds.take_updates()));
}

#[test]
fn a_peer_ferry_does_not_know_is_a_deviation_saying_what_it_does() {
    for (action, rule, what) in [
        ("Deny", "a Deny", "matches every peer: fails closed"),
        ("Pass", "a Pass", "matches every peer: fails closed"),
        ("Accept", "an Accept", "ignored"),
    ] {
        let mut c = Cluster::default();
        c.apply(cnp(action)).unwrap();
        let r = report(&c, Sources::default());
        assert_eq!(r.cluster_network_policies, 1);
        let [u] = &r.unenforced[..] else {
            panic!("{r:?}")
        };
        assert_eq!(
            (u.kind.as_str(), u.policy.as_str(), u.state),
            ("ClusterNetworkPolicy", "guard", Enforcement::Deviation)
        );
        assert_eq!(u.enforced_version.as_deref(), Some("resourceVersion 7"));
        assert_eq!(
            u.reasons,
            [format!(
                "spec.egress[1].to[1]: a peer with no field ferry knows, in {rule} rule: {what}"
            )]
        );
    }
}

#[test]
fn a_latest_state_not_in_force_leaves_its_policy_changes_out_and_says_so() {
    let mut in_force = Cluster::default();
    in_force.apply(np("changed", "1", "In")).unwrap();
    in_force.apply(np("deleted", "2", "In")).unwrap();
    in_force.apply(np("same", "3", "In")).unwrap();
    let mut latest = in_force.clone();
    latest.apply(np("changed", "4", "NotIn")).unwrap();
    latest.delete(Kind::NetworkPolicy, "default", "deleted");
    latest.apply(np("added", "5", "In")).unwrap();
    let why = "the tables of node node1 do not compile: boom";
    let r = report(
        &in_force,
        Sources {
            latest: Some(&latest),
            not_applied: Some(why),
            file_refused: None,
        },
    );
    assert_eq!(r.network_policies, 3);
    let states: Vec<(&str, Enforcement, Option<&str>)> = (r.unenforced.iter())
        .map(|u| (u.policy.as_str(), u.state, u.latest_version.as_deref()))
        .collect();
    assert_eq!(
        states,
        [
            (
                "default/added",
                Enforcement::NotEnforced,
                Some("resourceVersion 5, generation 1")
            ),
            (
                "default/changed",
                Enforcement::OlderVersion,
                Some("resourceVersion 4, generation 1")
            ),
            ("default/deleted", Enforcement::StillEnforced, None),
        ]
    );
    assert!(r.unenforced.iter().all(|u| u.reasons[0].ends_with(why)));
    assert!(
        r.stale.as_deref().is_some_and(|s| s.ends_with(why)),
        "{r:?}"
    );
    // Once in force, nothing is left to say.
    let r = report(&latest, Sources::default());
    assert_eq!((r.unenforced.len(), r.stale), (0, None));
}

#[test]
fn a_file_datastore_refusal_names_the_policies_it_refuses() {
    let mut in_force = Cluster::default();
    in_force.apply(np("deny", "1", "In")).unwrap();
    let problem = |object: &str| Problem {
        file: "policies.yaml".into(),
        line: Some(3),
        object: Some(object.into()),
        field: Some("spec.podSelector.matchExpressions[0].operator".into()),
        message: "\"Bogus\": expected In, NotIn, Exists or DoesNotExist".into(),
    };
    let problems = [
        problem("NetworkPolicy default/deny"),
        problem("NetworkPolicy default/new"),
        problem("Service default/web"),
    ];
    let r = report(
        &in_force,
        Sources {
            file_refused: Some(&problems),
            ..Sources::default()
        },
    );
    let states: Vec<(&str, Enforcement)> = (r.unenforced.iter())
        .map(|u| (u.policy.as_str(), u.state))
        .collect();
    assert_eq!(
        states,
        [
            ("default/deny", Enforcement::OlderVersion),
            ("default/new", Enforcement::NotEnforced)
        ]
    );
    assert_eq!(
        r.unenforced[0].reasons,
        [
            "refused: policies.yaml:3: spec.podSelector.matchExpressions[0].operator: \"Bogus\": expected In, NotIn, Exists or DoesNotExist"
        ]
    );
    assert!(r.stale.is_some_and(|s| s.contains("last good state")));
}

#[test]
fn a_policy_in_force_whose_fields_do_not_read_is_not_enforced() {
    // Only a tool's Cluster::apply lets one in; the datastores refuse them.
    let mut c = Cluster::default();
    c.apply(np("deny", "1", "Bogus")).unwrap();
    let r = report(&c, Sources::default());
    assert_eq!(r.network_policies, 0);
    assert_eq!(r.unenforced[0].state, Enforcement::NotEnforced);
    assert!(r.unenforced[0].reasons[0].starts_with("not compiled: spec.podSelector"));
}
