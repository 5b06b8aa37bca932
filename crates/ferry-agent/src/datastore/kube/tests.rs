use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ::kube::core::{ObjectList, WatchEvent};
use serde_json::{Value, json};

use super::mock::MockApi;
use super::*;
use crate::config::FerryConfig;
use crate::datastore::file;

// The example cluster (`examples/cluster`) as the API server sends it: list answers,
// items without kind and apiVersion, every object with its managedFields.
const NODES: &str = include_str!("testdata/nodes.json");
const PODS: &str = include_str!("testdata/pods.json");
const SERVICES: &str = include_str!("testdata/services.json");
const SLICES: &str = include_str!("testdata/endpointslices.json");
const CONFIG_MAPS: &str = include_str!("testdata/configmaps.json");

const NODE: &str = "node-a";

/// What node-a's datastore should make of the example: the file datastore's reading of
/// `examples/cluster` (every node's pods), without managedFields.
fn expected() -> Cluster {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster");
    let (mut c, _) = file::load(&dir).unwrap();
    let metas = (c.nodes.values_mut().map(|o| &mut Arc::make_mut(o).metadata))
        .chain(c.pods.values_mut().map(|o| &mut Arc::make_mut(o).metadata))
        .chain(
            c.services
                .values_mut()
                .map(|o| &mut Arc::make_mut(o).metadata),
        )
        .chain(
            c.endpoint_slices
                .values_mut()
                .map(|o| &mut Arc::make_mut(o).metadata),
        )
        .chain(
            c.config_maps
                .values_mut()
                .map(|o| &mut Arc::make_mut(o).metadata),
        );
    for m in metas {
        m.managed_fields = None;
    }
    // The example's ferry-config is written as a user applies it; the server adds these.
    let served = items::<ConfigMap>(CONFIG_MAPS)
        .into_iter()
        .find(|o| o.metadata().name.as_deref() == Some(CONFIG_NAME))
        .unwrap();
    let cm = Arc::make_mut(
        c.config_maps
            .get_mut(&ObjectKey::new(CONFIG_NAMESPACE, CONFIG_NAME))
            .unwrap(),
    );
    cm.metadata.uid = served.metadata().uid.clone();
    cm.metadata.resource_version = served.metadata().resource_version.clone();
    cm.metadata.creation_timestamp = served.metadata().creation_timestamp.clone();
    c
}

/// Asserts two clusters are equal, naming the objects that differ.
fn assert_same(got: &Cluster, want: &Cluster) {
    fn objects(c: &Cluster) -> BTreeMap<(Kind, ObjectKey), String> {
        let mut m = BTreeMap::new();
        let mut add = |kind, k: &ObjectKey, o: &dyn Debug| {
            m.insert((kind, k.clone()), format!("{o:?}"));
        };
        c.nodes.iter().for_each(|(k, o)| add(Kind::Node, k, o));
        c.pods.iter().for_each(|(k, o)| add(Kind::Pod, k, o));
        c.services
            .iter()
            .for_each(|(k, o)| add(Kind::Service, k, o));
        (c.endpoint_slices.iter()).for_each(|(k, o)| add(Kind::EndpointSlice, k, o));
        c.config_maps
            .iter()
            .for_each(|(k, o)| add(Kind::ConfigMap, k, o));
        m
    }
    let (got, want) = (objects(got), objects(want));
    let keys: BTreeSet<_> = got.keys().chain(want.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter_map(|k| match (got.get(k), want.get(k)) {
            (Some(g), Some(w)) if g == w => None,
            (Some(g), Some(w)) => Some(format!("{} {}:\n got  {g}\n want {w}", k.0, k.1)),
            (Some(_), None) => Some(format!("{} {}: not expected", k.0, k.1)),
            _ => Some(format!("{} {}: missing", k.0, k.1)),
        })
        .collect();
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// The items of a list answer, decoded as the client decodes them.
fn items<K: Clone + DeserializeOwned + Into<Object>>(list: &str) -> Vec<Object> {
    let list: ObjectList<K> = serde_json::from_str(list).unwrap();
    list.items.into_iter().map(Into::into).collect()
}

/// What the API server lists for node-a: every pod (node-b's too), and no ConfigMap
/// but ferry-config (its field selector); no Namespace, NetworkPolicy or
/// ClusterNetworkPolicy.
fn served() -> Vec<(Kind, Vec<Object>)> {
    let pods = items::<Pod>(PODS);
    let mut cms = items::<ConfigMap>(CONFIG_MAPS);
    cms.retain(|o| o.metadata().name.as_deref() == Some(CONFIG_NAME));
    vec![
        (Kind::Node, items::<Node>(NODES)),
        (Kind::Pod, pods),
        (Kind::Service, items::<Service>(SERVICES)),
        (Kind::EndpointSlice, items::<EndpointSlice>(SLICES)),
        (Kind::ConfigMap, cms),
        (Kind::Namespace, vec![]),
        (Kind::NetworkPolicy, vec![]),
        (Kind::ClusterNetworkPolicy, vec![]),
    ]
}

/// Feeds a complete list of `kind`, as the watcher reports one.
fn list(ds: &mut KubeDatastore, kind: Kind, objects: Vec<Object>) {
    ds.event(kind, Event::Init);
    for o in objects {
        ds.event(kind, Event::InitApply(o));
    }
    ds.event(kind, Event::InitDone);
}

/// A datastore that has listed the example.
fn listed() -> KubeDatastore {
    let mut ds = KubeDatastore::new();
    for (kind, objects) in served() {
        list(&mut ds, kind, objects);
    }
    let u = ds.take_updates();
    assert!(matches!(&u[..], [Update::Applied { .. }]), "{u:?}");
    ds
}

/// A watch event line as the API server writes it, decoded as the client does.
fn watch_event<K: DeserializeOwned + Into<Object>>(type_: &str, item: &Value) -> Event<Object> {
    let line = json!({"type": type_, "object": item}).to_string();
    match serde_json::from_str::<WatchEvent<K>>(&line).unwrap() {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => Event::Apply(o.into()),
        WatchEvent::Deleted(o) => Event::Delete(o.into()),
        e => panic!("unexpected {e:?}"),
    }
}

/// An item of a test data list, by name.
fn item(list: &str, name: &str) -> Value {
    let list: Value = serde_json::from_str(list).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .clone()
}

fn typed<K: DeserializeOwned + Into<Object>>(v: Value) -> Object {
    serde_json::from_value::<K>(v).unwrap().into()
}

/// How many endpoints the slice `default/name` has.
fn endpoints(c: &Cluster, name: &str) -> usize {
    let slice = &c.endpoint_slices[&ObjectKey::new("default", name)];
    slice.endpoints.as_ref().map_or(0, Vec::len)
}

fn problems(u: &[Update]) -> Vec<String> {
    u.iter()
        .filter_map(|u| match u {
            Update::Refused(r) => Some(r.problems.iter().map(ToString::to_string)),
            Update::Applied { .. } => None,
        })
        .flatten()
        .collect()
}

#[test]
fn api_lists_make_the_cluster_the_file_datastore_reads_from_the_example() {
    let mut ds = KubeDatastore::new();
    for (kind, objects) in served() {
        list(&mut ds, kind, objects);
    }
    let u = ds.take_updates();
    let [Update::Applied { cluster, notes, .. }] = &u[..] else {
        panic!("expected one state, got {u:?}");
    };
    assert!(notes.is_empty());
    assert_same(cluster, &expected());
    assert_eq!(cluster.pods.len(), 7, "every node's pods");
    assert!(
        cluster
            .nodes
            .values()
            .all(|n| n.metadata.managed_fields.is_none())
    );
}

#[test]
fn api_watch_events_make_the_cluster_the_file_datastore_reads_from_the_example() {
    let mut ds = KubeDatastore::new();
    for kind in Kind::ALL {
        list(&mut ds, kind, Vec::new());
    }
    ds.take_updates();
    let lists = [
        (NODES, "Node", "v1"),
        (PODS, "Pod", "v1"),
        (SERVICES, "Service", "v1"),
        (SLICES, "EndpointSlice", "discovery.k8s.io/v1"),
        (CONFIG_MAPS, "ConfigMap", "v1"),
    ];
    for (list, kind, api_version) in lists {
        let list: Value = serde_json::from_str(list).unwrap();
        for item in list["items"].as_array().unwrap() {
            // Watch events carry the type of their object.
            let mut obj = item.clone();
            obj["kind"] = kind.into();
            obj["apiVersion"] = api_version.into();
            // What the selectors let through, as the server would.
            if kind == "ConfigMap" && obj["metadata"]["name"] != CONFIG_NAME {
                continue;
            }
            let e = match kind {
                "Node" => watch_event::<Node>("ADDED", &obj),
                "Pod" => watch_event::<Pod>("ADDED", &obj),
                "Service" => watch_event::<Service>("ADDED", &obj),
                "EndpointSlice" => watch_event::<EndpointSlice>("ADDED", &obj),
                _ => watch_event::<ConfigMap>("ADDED", &obj),
            };
            ds.event(Kind::from_type(api_version, kind).unwrap(), e);
        }
    }
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{:?}", problems(&u));
    assert_same(&ds.current(), &expected());
}

#[test]
fn nothing_is_sent_until_every_kind_is_listed() {
    let mut ds = KubeDatastore::new();
    let mut lists = served();
    let (last_kind, last) = lists.pop().unwrap();
    for (kind, objects) in lists {
        list(&mut ds, kind, objects);
        assert!(ds.take_updates().is_empty());
    }
    assert!(!ds.is_listed());
    list(&mut ds, last_kind, last);
    assert!(ds.is_listed());
    assert!(matches!(&ds.take_updates()[..], [Update::Applied { .. }]));
}

#[test]
fn a_bad_object_is_refused_alone_and_its_last_good_version_stays() {
    let mut ds = listed();
    let before = ds.current();
    let mut web = item(SERVICES, "web");
    web["spec"]["ports"][0]["port"] = 0.into();
    ds.event(Kind::Service, Event::Apply(typed::<Service>(web)));
    // A good change in the same batch still applies.
    let mut slice = item(SLICES, "web-x7h2k");
    slice["endpoints"].as_array_mut().unwrap().pop();
    ds.event(
        Kind::EndpointSlice,
        Event::Apply(typed::<EndpointSlice>(slice)),
    );
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        ["kubernetes: Service default/web: spec.ports[0].port: 0 is outside 1-65535"]
    );
    let Update::Applied { cluster, .. } = &u[0] else {
        panic!("expected the good change first: {u:?}");
    };
    let key = ObjectKey::new("default", "web");
    assert_eq!(cluster.services[&key], before.services[&key]);
    assert_eq!(endpoints(cluster, "web-x7h2k"), 2);

    // A bad object never seen before is not there at all.
    let mut other = item(SERVICES, "sticky");
    other["metadata"]["name"] = "other".into();
    other["spec"]["sessionAffinity"] = "Sometimes".into();
    ds.event(Kind::Service, Event::Apply(typed::<Service>(other)));
    let u = ds.take_updates();
    assert_eq!(u.len(), 1, "only the problem: {u:?}");
    assert_eq!(
        problems(&u)[0],
        "kubernetes: Service default/other: spec.sessionAffinity: \"Sometimes\": expected None or ClientIP"
    );
    assert!(
        !ds.current()
            .contains(Kind::Service, &ObjectKey::new("default", "other"))
    );
}

#[test]
fn a_slice_port_the_api_took_but_ferry_cannot_use_does_not_refuse_the_slice() {
    let mut ds = listed();
    let mut slice = item(SLICES, "web-x7h2k");
    slice["ports"][0]["port"] = 0.into();
    slice["endpoints"].as_array_mut().unwrap().pop();
    ds.event(
        Kind::EndpointSlice,
        Event::Apply(typed::<EndpointSlice>(slice)),
    );
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{u:?}");
    assert_eq!(endpoints(&applied_cluster(&u), "web-x7h2k"), 2);
}

/// The Service `name` of the example with the external IP `ip`; renamed `as_name`
/// (with a cluster IP of its own) when that differs.
fn service_with_external_ip(name: &str, as_name: &str, ip: &str) -> Object {
    let mut v = item(SERVICES, name);
    if as_name != name {
        v["metadata"]["name"] = as_name.into();
        v["spec"]["clusterIP"] = "10.96.0.99".into();
        v["spec"]["clusterIPs"] = json!(["10.96.0.99"]);
    }
    v["spec"]["externalIPs"] = json!([ip]);
    typed::<Service>(v)
}

fn applied_cluster(u: &[Update]) -> Arc<Cluster> {
    match u.first() {
        Some(Update::Applied { cluster, .. }) => Arc::clone(cluster),
        _ => panic!("expected a state first: {u:?}"),
    }
}

fn notes(u: &[Update]) -> Vec<String> {
    u.iter()
        .filter_map(|u| match u {
            Update::Applied { notes, .. } => Some(notes.iter().map(ToString::to_string)),
            Update::Refused(_) => None,
        })
        .flatten()
        .collect()
}

/// The frontends `cluster` compiles to for the Service `namespace/name`: each tables
/// entry's name with its cluster, external and load balancer IPs.
fn frontends(cluster: &Cluster, namespace: &str, name: &str) -> Vec<String> {
    let keys = BTreeSet::from([ObjectKey::new(namespace, name)]);
    let opts = crate::compile::CompileOptions::default();
    let st = crate::compile::service_tables(cluster, NODE, &keys, &opts).unwrap();
    st.specs
        .iter()
        .map(|s| {
            format!(
                "{} {:?} {:?} {:?}",
                s.name, s.cluster_ips, s.external_ips, s.load_balancer_ips
            )
        })
        .collect()
}

#[test]
fn an_external_ip_on_another_services_cluster_ip_is_left_out_of_it_alone() {
    // a/evil, older than everything, lists before default/web and names web's cluster
    // IP as an external IP on web's port, and on a port of its own.
    let mut evil = item(SERVICES, "sticky");
    evil["metadata"]["namespace"] = "a".into();
    evil["metadata"]["name"] = "evil".into();
    evil["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z".into();
    evil["spec"]["clusterIP"] = "10.96.0.99".into();
    evil["spec"]["clusterIPs"] = json!(["10.96.0.99"]);
    evil["spec"]["externalIPs"] = json!(["10.96.0.10"]);
    let mut other = evil["spec"]["ports"][0].clone();
    other["name"] = "other".into();
    other["port"] = 81.into();
    evil["spec"]["ports"][0]["name"] = "http".into();
    evil["spec"]["ports"].as_array_mut().unwrap().push(other);
    let mut services = items::<Service>(SERVICES);
    services.insert(0, typed::<Service>(evil));
    let mut ds = KubeDatastore::new();
    for (kind, objects) in served() {
        let objects = if kind == Kind::Service {
            services.clone()
        } else {
            objects
        };
        list(&mut ds, kind, objects);
    }
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{u:?}");
    assert_eq!(
        notes(&u),
        [
            "kubernetes: Service a/evil: spec.externalIPs[0]: TCP 10.96.0.10:80 is a frontend of Service default/web (its spec.clusterIPs[0]); left out"
        ]
    );
    let cluster = applied_cluster(&u);
    assert_eq!(
        frontends(&cluster, "default", "web"),
        ["default/web:http [10.96.0.10, fd00:10:96::10] [] []"]
    );
    assert_eq!(
        frontends(&cluster, "a", "evil"),
        [
            "a/evil:http [10.96.0.99] [] []",
            "a/evil:other [10.96.0.99] [10.96.0.10] []",
        ]
    );
    // The whole node compiles: no frontend is in the tables twice.
    let opts = crate::compile::CompileOptions::default();
    crate::compile::node_tables(&cluster, NODE, None, &[], &opts).unwrap();

    // Listed again, nothing changed and nothing is told again.
    list(&mut ds, Kind::Service, services);
    assert!(ds.take_updates().is_empty());

    // web goes: evil has its frontend back.
    ds.event(
        Kind::Service,
        watch_event::<Service>("DELETED", &item(SERVICES, "web")),
    );
    let u = ds.take_updates();
    assert!(problems(&u).is_empty() && notes(&u).is_empty(), "{u:?}");
    let cluster = applied_cluster(&u);
    assert_eq!(
        frontends(&cluster, "a", "evil"),
        [
            "a/evil:http [10.96.0.99] [10.96.0.10] []",
            "a/evil:other [10.96.0.99] [10.96.0.10] []",
        ]
    );
    crate::compile::node_tables(&cluster, NODE, None, &[], &opts).unwrap();
}

#[test]
fn of_two_external_or_load_balancer_ips_the_older_service_wins_in_any_order() {
    // sticky (created after web-lb) takes web-lb's load balancer IP on port 80.
    let sticky = service_with_external_ip("sticky", "sticky", "203.0.113.10");
    let taken = "kubernetes: Service default/sticky: spec.externalIPs[0]: TCP 203.0.113.10:80 is a frontend of Service default/web-lb (its status.loadBalancer.ingress[0].ip); left out";
    // As an event after web-lb, and listed before it (after a restart).
    let mut by_event = listed();
    by_event.event(Kind::Service, Event::Apply(sticky.clone()));
    let mut services = items::<Service>(SERVICES);
    services.retain(|o| o.key().unwrap().name != "sticky");
    services.insert(0, sticky);
    let mut by_list = KubeDatastore::new();
    for (kind, objects) in served() {
        let objects = if kind == Kind::Service {
            services.clone()
        } else {
            objects
        };
        list(&mut by_list, kind, objects);
    }
    for ds in [&mut by_event, &mut by_list] {
        let u = ds.take_updates();
        assert!(problems(&u).is_empty(), "{u:?}");
        assert_eq!(notes(&u), [taken]);
        let c = applied_cluster(&u);
        assert_eq!(
            frontends(&c, "default", "sticky"),
            ["default/sticky:http [10.96.0.13] [] []"]
        );
        assert_eq!(
            frontends(&c, "default", "web-lb"),
            [
                "default/web-lb:http [10.96.0.12] [] [203.0.113.10]",
                "default/web-lb:http-alt [10.96.0.12] [] [203.0.113.10]",
            ]
        );
    }

    // web-lb changes without freeing the address: sticky still leaves it out, and
    // nothing is told again.
    let mut lb = item(SERVICES, "web-lb");
    lb["metadata"]["labels"] = json!({"tier": "edge"});
    by_event.event(Kind::Service, Event::Apply(typed::<Service>(lb.clone())));
    let u = by_event.take_updates();
    assert!(problems(&u).is_empty() && notes(&u).is_empty(), "{u:?}");
    assert_eq!(
        frontends(&applied_cluster(&u), "default", "sticky"),
        ["default/sticky:http [10.96.0.13] [] []"]
    );

    // web-lb gets another address: sticky has the frontend.
    lb["status"]["loadBalancer"]["ingress"][0]["ip"] = "203.0.113.11".into();
    by_event.event(Kind::Service, Event::Apply(typed::<Service>(lb)));
    let u = by_event.take_updates();
    assert!(problems(&u).is_empty() && notes(&u).is_empty(), "{u:?}");
    assert_eq!(
        frontends(&applied_cluster(&u), "default", "sticky"),
        ["default/sticky:http [10.96.0.13] [203.0.113.10] []"]
    );
}

#[test]
fn services_sharing_a_node_port_or_cluster_ip_are_refused_alone() {
    let mut ds = listed();
    let mut np = item(SERVICES, "web-nodeport");
    np["metadata"]["name"] = "np2".into();
    np["spec"]["clusterIP"] = "10.96.0.20".into();
    np["spec"]["clusterIPs"] = json!(["10.96.0.20"]);
    ds.event(Kind::Service, Event::Apply(typed::<Service>(np)));
    let mut twin = item(SERVICES, "sticky");
    twin["metadata"]["name"] = "twin".into();
    twin["spec"]["ports"][0]["port"] = 8443.into();
    twin["spec"]["clusterIP"] = "10.96.0.1".into();
    twin["spec"]["clusterIPs"] = json!(["10.96.0.1"]);
    ds.event(Kind::Service, Event::Apply(typed::<Service>(twin)));
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        [
            "kubernetes: Service default/np2: spec.ports[0].nodePort: TCP 30080 is also a node port of Service default/web-nodeport",
            "kubernetes: Service default/twin: spec.clusterIPs[0]: 10.96.0.1 is also the cluster IP of Service default/kubernetes",
        ]
    );
    assert_eq!(u.len(), 1, "{u:?}");
}

#[test]
fn a_node_with_another_nodes_internal_ip_waits_until_that_one_is_deleted() {
    let mut ds = listed();
    // A replacement VM registers before the old Node is deleted.
    let mut new = item(NODES, "node-b");
    new["metadata"]["name"] = "node-b2".into();
    ds.event(Kind::Node, Event::Apply(typed::<Node>(new)));
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        [
            "kubernetes: Node node-b2: status.addresses[0].address: 192.168.20.2 is also an InternalIP of Node node-b"
        ]
    );
    assert!(ds.current().node("node-b2").is_none());
    // The old one is deleted while no watch sees it: the relist lets the new one in.
    let mut nodes = items::<Node>(NODES);
    nodes.retain(|n| n.key().unwrap().name != "node-b");
    let mut new = item(NODES, "node-b");
    new["metadata"]["name"] = "node-b2".into();
    nodes.push(typed::<Node>(new));
    list(&mut ds, Kind::Node, nodes);
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{u:?}");
    let c = applied_cluster(&u);
    assert!(c.node("node-b").is_none());
    assert!(c.node("node-b2").is_some());
}

#[test]
fn a_relist_that_moves_an_address_between_services_reports_nothing() {
    let mut ds = listed();
    // web gives up its cluster IP's port 80 to sticky's external IP in one list; sticky
    // comes first in the list.
    let mut web = item(SERVICES, "web");
    web["spec"]["ports"][0]["port"] = 8080.into();
    let mut services: Vec<Object> = items::<Service>(SERVICES)
        .into_iter()
        .filter(|o| !matches!(o.key(), Some(k) if k.name == "web" || k.name == "sticky"))
        .collect();
    services.insert(
        0,
        service_with_external_ip("sticky", "sticky", "10.96.0.10"),
    );
    services.push(typed::<Service>(web));
    list(&mut ds, Kind::Service, services);
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{u:?}");
    let c = applied_cluster(&u);
    let sticky = &c.services[&ObjectKey::new("default", "sticky")];
    assert_eq!(
        sticky.spec.as_ref().unwrap().external_ips,
        Some(vec!["10.96.0.10".to_string()])
    );
}

#[test]
fn a_relist_replaces_the_kind_at_once_and_drops_what_it_no_longer_lists() {
    let mut ds = listed();
    let sticky = ObjectKey::new("default", "sticky");
    ds.event(Kind::Service, Event::Init);
    for o in items::<Service>(SERVICES) {
        if o.key() != Some(sticky.clone()) {
            ds.event(Kind::Service, Event::InitApply(o));
        }
    }
    // Half a list changes nothing yet.
    assert!(ds.take_updates().is_empty());
    assert!(ds.current().services.contains_key(&sticky));
    ds.event(Kind::Service, Event::InitDone);
    let u = ds.take_updates();
    let [Update::Applied { cluster, .. }] = &u[..] else {
        panic!("{u:?}");
    };
    assert!(!cluster.services.contains_key(&sticky));
    assert_eq!(cluster.services.len(), 4);
}

#[test]
fn a_relist_or_event_that_changes_nothing_sends_nothing() {
    let mut ds = listed();
    let before = ds.current();
    for (kind, objects) in served() {
        list(&mut ds, kind, objects);
    }
    let web = item(SERVICES, "web");
    ds.event(Kind::Service, watch_event::<Service>("MODIFIED", &web));
    assert!(ds.take_updates().is_empty());
    assert!(Arc::ptr_eq(&before, &ds.current()));
}

#[test]
fn a_deleted_object_is_removed() {
    let mut ds = listed();
    let slice = item(SLICES, "web-nodeport-5fz8c");
    ds.event(
        Kind::EndpointSlice,
        watch_event::<EndpointSlice>("DELETED", &slice),
    );
    let u = ds.take_updates();
    let [Update::Applied { cluster, .. }] = &u[..] else {
        panic!("{u:?}");
    };
    assert!(
        !cluster
            .endpoint_slices
            .contains_key(&ObjectKey::new("default", "web-nodeport-5fz8c"))
    );
    // Deleting what is not there is no change.
    ds.event(
        Kind::EndpointSlice,
        watch_event::<EndpointSlice>("DELETED", &slice),
    );
    assert!(ds.take_updates().is_empty());
}

#[test]
fn a_watch_error_is_refused_and_the_state_stays() {
    let mut ds = listed();
    let before = ds.current();
    ds.watch_error(Kind::Pod, &"connection refused");
    ds.watch_error(Kind::ConfigMap, &"connection refused");
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        [
            "kubernetes: watching Pods: connection refused; retrying",
            "kubernetes: watching ConfigMap kube-system/ferry-config: connection refused; retrying",
        ]
    );
    assert_eq!(u.len(), 1);
    assert!(Arc::ptr_eq(&before, &ds.current()));
}

#[test]
fn a_relist_after_a_watch_error_says_the_state_is_whole_again() {
    let mut ds = listed();
    let before = ds.current();
    ds.watch_error(Kind::Pod, &"connection refused");
    assert_eq!(ds.take_updates().len(), 1);
    let pods = served()
        .into_iter()
        .find(|(k, _)| *k == Kind::Pod)
        .unwrap()
        .1;
    list(&mut ds, Kind::Pod, pods.clone());
    let u = ds.take_updates();
    let [Update::Applied { cluster, .. }] = &u[..] else {
        panic!("the same state again, as news that it is whole: {u:?}");
    };
    assert!(Arc::ptr_eq(&before, cluster), "nothing changed");
    // Once only: the next relist without an error is no news.
    list(&mut ds, Kind::Pod, pods);
    assert!(ds.take_updates().is_empty());
}

#[test]
fn a_watch_that_resumes_after_an_error_says_the_state_is_whole_again() {
    let mut ds = listed();
    let before = ds.current();
    ds.watch_error(Kind::EndpointSlice, &"connection reset");
    assert_eq!(ds.take_updates().len(), 1);
    // The watcher resumes where it was, without a list; nothing changed meanwhile.
    ds.watch_started(Kind::EndpointSlice);
    let u = ds.take_updates();
    let [Update::Applied { cluster, .. }] = &u[..] else {
        panic!("the same state again, as news that it is whole: {u:?}");
    };
    assert!(Arc::ptr_eq(&before, cluster), "nothing changed");
    // Once only.
    ds.watch_started(Kind::EndpointSlice);
    assert!(ds.take_updates().is_empty());

    // An event of the kind after the error says the same, even one that changes nothing.
    ds.watch_error(Kind::Service, &"connection reset");
    ds.take_updates();
    let web = item(SERVICES, "web");
    ds.event(Kind::Service, watch_event::<Service>("MODIFIED", &web));
    assert!(matches!(&ds.take_updates()[..], [Update::Applied { .. }]));

    // A watch answered in the batch of an error proves nothing: it may be the one that
    // failed at once (410 Gone in its first line).
    ds.watch_error(Kind::Pod, &"too old resource version");
    ds.watch_started(Kind::Pod);
    let u = ds.take_updates();
    assert!(matches!(&u[..], [Update::Refused(_)]), "{u:?}");
}

#[test]
fn a_bad_ferry_config_keeps_the_last_good_one() {
    let mut ds = listed();
    let mut cm = item(CONFIG_MAPS, CONFIG_NAME);
    cm["data"]["encapsulation"] = "sometimes".into();
    ds.event(Kind::ConfigMap, Event::Apply(typed::<ConfigMap>(cm)));
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        [
            "kubernetes: ConfigMap kube-system/ferry-config: data.encapsulation: \"sometimes\": expected always, cross-subnet or never"
        ]
    );
    let cm = ds.current();
    let cm = cm.config_map(CONFIG_NAMESPACE, CONFIG_NAME).unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["encapsulation"], "cross-subnet");
}

/// The example's ferry-config with its `data` edited.
fn ferry_config(edit: impl FnOnce(&mut Value)) -> Value {
    let mut cm = item(CONFIG_MAPS, CONFIG_NAME);
    edit(&mut cm["data"]);
    cm
}

const HELD: &str = "kubernetes: state held back until ConfigMap kube-system/ferry-config is fixed or deleted: no good version of it is in force, and the defaults of its keys may not be what the other nodes use";

#[test]
fn a_bad_ferry_config_with_none_good_in_force_holds_the_state_back() {
    let mut ds = KubeDatastore::new();
    let bad = ferry_config(|d| d["vxlan-port"] = "8472x".into());
    for (kind, objects) in served() {
        let objects = match kind {
            Kind::ConfigMap => vec![typed::<ConfigMap>(bad.clone())],
            _ => objects,
        };
        list(&mut ds, kind, objects);
    }
    let u = ds.take_updates();
    assert_eq!(
        problems(&u),
        [
            "kubernetes: ConfigMap kube-system/ferry-config: data.vxlan-port: \"8472x\": expected a port 1-65535",
            HELD
        ]
    );
    assert_eq!(u.len(), 1, "no state with the defaults: {u:?}");
    // Other changes wait too, and the hold is not told again.
    let mut slice = item(SLICES, "web-x7h2k");
    slice["endpoints"].as_array_mut().unwrap().pop();
    ds.event(
        Kind::EndpointSlice,
        Event::Apply(typed::<EndpointSlice>(slice)),
    );
    assert!(ds.take_updates().is_empty());
    // A good version lets the state go, with what changed meanwhile.
    let good = ferry_config(|d| d["vxlan-port"] = "8472".into());
    ds.event(Kind::ConfigMap, Event::Apply(typed::<ConfigMap>(good)));
    let u = ds.take_updates();
    assert!(problems(&u).is_empty(), "{u:?}");
    let c = applied_cluster(&u);
    assert_eq!(FerryConfig::of(&c).unwrap().vxlan_port, 8472);
    assert_eq!(endpoints(&c, "web-x7h2k"), 2);
}

#[test]
fn a_held_back_state_goes_with_the_defaults_once_the_bad_ferry_config_is_deleted() {
    let mut ds = listed();
    let cm = item(CONFIG_MAPS, CONFIG_NAME);
    ds.event(Kind::ConfigMap, watch_event::<ConfigMap>("DELETED", &cm));
    let c = applied_cluster(&ds.take_updates());
    assert!(c.config_map(CONFIG_NAMESPACE, CONFIG_NAME).is_none());
    // None in force: a bad one now is not a change of settings but unknown settings.
    let bad = ferry_config(|d| d["encapsulation"] = "sometimes".into());
    ds.event(Kind::ConfigMap, watch_event::<ConfigMap>("ADDED", &bad));
    let u = ds.take_updates();
    assert_eq!(problems(&u).len(), 2, "{u:?}");
    assert_eq!(problems(&u)[1], HELD);
    ds.event(Kind::ConfigMap, watch_event::<ConfigMap>("DELETED", &bad));
    let u = ds.take_updates();
    let [Update::Applied { cluster, .. }] = &u[..] else {
        panic!("the state again, as news that it is whole: {u:?}");
    };
    assert!(Arc::ptr_eq(&c, cluster), "nothing changed");

    // A relist that no longer has the bad one does the same.
    ds.event(Kind::ConfigMap, watch_event::<ConfigMap>("ADDED", &bad));
    assert_eq!(problems(&ds.take_updates()).len(), 2);
    list(&mut ds, Kind::ConfigMap, Vec::new());
    assert!(matches!(&ds.take_updates()[..], [Update::Applied { .. }]));
}

#[test]
fn an_unknown_ferry_config_key_is_a_note_and_the_rest_applies() {
    let mut ds = listed();
    let cm = ferry_config(|d| {
        d["vxlan-port"] = "8472".into();
        d["vxlan-mtu"] = "1400".into();
    });
    ds.event(Kind::ConfigMap, Event::Apply(typed::<ConfigMap>(cm)));
    let u = ds.take_updates();
    let [Update::Applied { cluster, notes, .. }] = &u[..] else {
        panic!("{u:?}");
    };
    let notes: Vec<String> = notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "kubernetes: ConfigMap kube-system/ferry-config: data.vxlan-mtu: unknown key, ignored (known: vxlan-vni, vxlan-port, encapsulation, external-snat, policy-host-to-pods, policy-on-change, uplink)"
        ]
    );
    assert_eq!(FerryConfig::of(cluster).unwrap().vxlan_port, 8472);
}

#[test]
fn scopes_watch_the_whole_cluster_but_config_maps_narrowed_to_ferry_config() {
    let s = scopes();
    assert_eq!(s.clone().map(|s| s.kind), Kind::ALL);
    let rows: Vec<_> = s
        .iter()
        .map(|s| {
            (
                s.group,
                s.resource,
                s.namespace,
                s.field_selector.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("", "nodes", None, None),
            ("", "pods", None, None),
            ("", "services", None, None),
            ("discovery.k8s.io", "endpointslices", None, None),
            (
                "",
                "configmaps",
                Some("kube-system"),
                Some("metadata.name=ferry-config")
            ),
            ("", "namespaces", None, None),
            ("networking.k8s.io", "networkpolicies", None, None),
            (
                "policy.networking.k8s.io",
                "clusternetworkpolicies",
                None,
                None
            ),
        ]
    );
}

// The live path: the real client and watchers against the mock API server.

const WAIT: Duration = Duration::from_secs(10);

fn example_api() -> MockApi {
    let api = MockApi::new();
    api.load("nodes", NODES);
    api.load("pods", PODS);
    api.load("services", SERVICES);
    api.load("endpointslices", SLICES);
    api.load("configmaps", CONFIG_MAPS);
    api
}

fn start(api: &MockApi) -> Watch {
    let service = api.service();
    watch_with(NODE.into(), move || async move {
        Ok(Client::new(service, "default"))
    })
    .unwrap()
}

fn next(w: &Watch) -> Update {
    w.next_update(WAIT).expect("an update in time")
}

fn applied(u: Update) -> Arc<Cluster> {
    match u {
        Update::Applied { cluster, notes, .. } => {
            assert!(notes.is_empty(), "{notes:?}");
            cluster
        }
        Update::Refused(r) => panic!("expected a state, got:\n{r}"),
    }
}

fn refused(u: Update) -> Vec<String> {
    match u {
        Update::Refused(r) => r.problems.iter().map(ToString::to_string).collect(),
        Update::Applied { .. } => panic!("expected problems, got a state"),
    }
}

fn percent_decoded(s: &str) -> String {
    s.replace("%3D", "=").replace("%2C", ",")
}

#[test]
fn live_watches_list_then_follow_changes_refusals_and_deletions() {
    let api = example_api();
    let w = start(&api);
    let c = applied(next(&w));
    assert_same(&c, &expected());
    assert!(Arc::ptr_eq(&c, &w.current()));

    // One list per scope, narrowed by its field selector.
    let lists: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .map(|r| percent_decoded(r))
        .collect();
    let wanted = [
        ("/api/v1/nodes", None),
        ("/api/v1/pods", None),
        ("/api/v1/services", None),
        ("/apis/discovery.k8s.io/v1/endpointslices", None),
        (
            "/api/v1/namespaces/kube-system/configmaps",
            Some("metadata.name=ferry-config"),
        ),
        ("/api/v1/namespaces", None),
        ("/apis/networking.k8s.io/v1/networkpolicies", None),
        (
            "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies",
            None,
        ),
    ];
    assert_eq!(lists.len(), wanted.len(), "{lists:?}");
    for (path, selector) in wanted {
        let r = lists
            .iter()
            .find(|r| r.split_once('?').unwrap().0 == path)
            .unwrap_or_else(|| panic!("no list of {path}: {lists:?}"));
        let field = r
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix("fieldSelector="));
        assert_eq!(field, selector, "{r}");
    }

    // An endpoint leaves a slice.
    let mut slice = item(SLICES, "web-x7h2k");
    slice["endpoints"].as_array_mut().unwrap().pop();
    api.put("endpointslices", slice);
    let c = applied(next(&w));
    assert_eq!(endpoints(&c, "web-x7h2k"), 2);

    // A Service the API accepted but ferry cannot use: refused, the last good one stays.
    let mut web = item(SERVICES, "web");
    web["spec"]["ports"][0]["port"] = 0.into();
    api.put("services", web);
    assert_eq!(
        refused(next(&w)),
        ["kubernetes: Service default/web: spec.ports[0].port: 0 is outside 1-65535"]
    );
    let web = ObjectKey::new("default", "web");
    assert_eq!(w.current().services[&web], c.services[&web]);

    // Deleted.
    api.delete("endpointslices", "default", "web-nodeport-5fz8c");
    let c = applied(next(&w));
    let key = ObjectKey::new("default", "web-nodeport-5fz8c");
    assert!(!c.endpoint_slices.contains_key(&key));

    // Another node's pods reach this node as well as its own (policies select peers
    // on every node).
    let mut theirs = item(PODS, "sticky-1");
    theirs["metadata"]["labels"]["changed"] = "yes".into();
    api.put("pods", theirs);
    let mut ours = item(PODS, "sticky-0");
    ours["metadata"]["labels"]["changed"] = "yes".into();
    api.put("pods", ours);
    let c = applied(next(&w));
    let labels = |name: &str| {
        c.pods
            .get(&ObjectKey::new("default", name))
            .map(|p| p.metadata.labels.clone().unwrap_or_default())
    };
    assert_eq!(labels("sticky-0").unwrap()["changed"], "yes");
    assert_eq!(labels("sticky-1").unwrap()["changed"], "yes");
}

#[test]
fn a_burst_of_events_makes_one_update() {
    let api = example_api();
    let w = start(&api);
    applied(next(&w));
    let mut burst = Vec::new();
    for name in ["web-x7h2k", "web-q9m4t", "web-lb-b2n6d"] {
        let mut slice = item(SLICES, name);
        slice["endpoints"].as_array_mut().unwrap().pop();
        burst.push(("endpointslices", slice));
    }
    let mut sticky = item(SERVICES, "sticky");
    sticky["spec"]["sessionAffinity"] = "None".into();
    burst.push(("services", sticky));
    api.put_all(burst);
    let c = applied(next(&w));
    for name in ["web-x7h2k", "web-q9m4t", "web-lb-b2n6d"] {
        assert_eq!(endpoints(&c, name), 2, "{name}");
    }
    let sticky = &c.services[&ObjectKey::new("default", "sticky")];
    assert_eq!(
        sticky.spec.as_ref().unwrap().session_affinity.as_deref(),
        Some("None")
    );
    assert!(w.next_update(BATCH_MAX * 4).is_none());
}

#[test]
fn an_expired_watch_lists_again_and_drops_what_was_deleted_meanwhile() {
    let api = example_api();
    let w = start(&api);
    applied(next(&w));
    api.delete_quietly("services", "default", "sticky");
    api.expire("services");
    let p = refused(next(&w));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("kubernetes: watching Services: "), "{p:?}");
    assert!(p[0].contains("too old resource version"), "{p:?}");
    // The watcher backs off, then lists again.
    let c = applied(next(&w));
    assert!(
        !c.services
            .contains_key(&ObjectKey::new("default", "sticky"))
    );
    assert_eq!(c.services.len(), 4);
}

#[test]
fn an_unreachable_api_server_is_reported_and_the_state_in_force_stays() {
    let api = example_api();
    api.fail("services", 1);
    let w = start(&api);
    // The Services list failed: said at once, and nothing else until it is retried.
    let p = refused(next(&w));
    assert!(
        p.iter()
            .all(|p| p.starts_with("kubernetes: watching Services: ")),
        "{p:?}"
    );
    assert!(w.current().is_empty());
    let c = applied(next(&w));
    assert_same(&c, &expected());

    // The EndpointSlice watch drops and cannot come back at once.
    api.fail("endpointslices", 2);
    api.close("endpointslices");
    let mut slice = item(SLICES, "web-x7h2k");
    slice["endpoints"].as_array_mut().unwrap().pop();
    api.put("endpointslices", slice);
    let mut errors = 0;
    let c = loop {
        match next(&w) {
            Update::Refused(r) => {
                errors += r.problems.len();
                for p in &r.problems {
                    assert!(
                        p.to_string()
                            .starts_with("kubernetes: watching EndpointSlices: "),
                        "{p}"
                    );
                }
                assert!(Arc::ptr_eq(&c, &w.current()));
            }
            Update::Applied { cluster, .. } => break cluster,
        }
    };
    assert_eq!(errors, 2);
    // The change made while it was away arrives when it resumes.
    assert_eq!(endpoints(&c, "web-x7h2k"), 2);
}

#[test]
fn a_watch_back_after_errors_without_a_change_says_the_state_is_whole_again() {
    let api = example_api();
    let w = start(&api);
    let c = applied(next(&w));
    // The EndpointSlice watch drops and cannot come back at once; nothing changes.
    api.fail("endpointslices", 2);
    api.close("endpointslices");
    let mut errors = 0;
    let again = loop {
        match next(&w) {
            Update::Refused(r) => errors += r.problems.len(),
            Update::Applied { cluster, .. } => break cluster,
        }
    };
    assert_eq!(errors, 2);
    assert!(Arc::ptr_eq(&c, &again), "nothing changed");
    // The watcher resumed: it did not list again.
    let lists = api
        .requests()
        .iter()
        .filter(|r| r.contains("endpointslices") && !r.contains("watch=true"))
        .count();
    assert_eq!(lists, 1);
}

#[test]
fn a_cluster_without_the_cluster_network_policy_crd_runs_and_picks_it_up_once_installed() {
    let api = example_api();
    api.set_absent("clusternetworkpolicies", true);
    let w = start(&api);
    // The rest of the state goes out, with one note naming the missing CRD.
    let (c, notes) = match next(&w) {
        Update::Applied { cluster, notes, .. } => (cluster, notes),
        Update::Refused(r) => panic!("expected a state, got:\n{r}"),
    };
    assert_same(&c, &expected());
    assert_eq!(notes.len(), 1, "{notes:?}");
    let note = notes[0].to_string();
    assert!(
        note.contains("ClusterNetworkPolicy: the API server does not serve this kind")
            && note.contains("is its CRD installed?"),
        "{note}"
    );
    // Installed, with one policy: it is listed at the next try.
    api.set_absent("clusternetworkpolicies", false);
    api.put(
        "clusternetworkpolicies",
        json!({
            "metadata": {"name": "deny-x"},
            "spec": {
                "tier": "Admin", "priority": 5,
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]
            }
        }),
    );
    let c = applied(next(&w));
    assert_eq!(
        c.cluster_network_policies
            .keys()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
        ["deny-x"]
    );
    assert_eq!(c.len(), expected().len() + 1);
}

#[test]
fn an_agent_starting_on_a_bad_ferry_config_waits_for_a_good_one() {
    let api = example_api();
    api.put(
        "configmaps",
        ferry_config(|d| d["vxlan-vni"] = "77777777".into()),
    );
    let w = start(&api);
    let mut seen = Vec::new();
    while !seen.iter().any(|p| p == HELD) {
        seen.extend(refused(next(&w)));
    }
    assert_eq!(
        seen[0],
        "kubernetes: ConfigMap kube-system/ferry-config: data.vxlan-vni: \"77777777\": expected a number 0-16777215"
    );
    assert!(w.current().is_empty());
    api.put("configmaps", ferry_config(|d| d["vxlan-vni"] = "77".into()));
    let c = applied(next(&w));
    assert_eq!(FerryConfig::of(&c).unwrap().vxlan_vni, 77);
}

#[test]
fn a_kubeconfig_is_read_and_a_server_that_does_not_answer_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    // Nothing listens on port 1 of the loopback address.
    std::fs::write(
        &path,
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
",
    )
    .unwrap();
    let w = KubeDatastore::watch(KubeOptions {
        node: NODE.into(),
        kubeconfig: Some(path),
    })
    .unwrap();
    let p = refused(next(&w));
    assert!(
        p.iter().all(|p| p.starts_with("kubernetes: watching ")),
        "{p:?}"
    );
    assert!(w.current().is_empty());
}

#[test]
fn a_server_that_takes_requests_and_never_answers_is_reported() {
    // Connections complete in the listen queue; nothing reads or answers them.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: 'http://{}'}}
users:
- name: u
  user: {{token: abc}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
",
            hung.local_addr().unwrap()
        ),
    )
    .unwrap();
    // READ_TIMEOUT, shortened to fit a test.
    let timeout = Duration::from_millis(500);
    let w = watch_with(NODE.into(), move || async move {
        connect(Some(path), timeout).await.map(|(c, _)| c)
    })
    .unwrap();
    let p = refused(next(&w));
    assert!(
        p.iter().all(|p| p.starts_with("kubernetes: watching ")),
        "{p:?}"
    );
    assert!(p.iter().all(|p| p.contains("timed out")), "{p:?}");
    assert!(w.current().is_empty());
    drop(hung);
}

#[test]
fn a_missing_kubeconfig_or_node_name_is_an_error_at_start() {
    let missing = PathBuf::from("/nonexistent/kubeconfig");
    let e = KubeDatastore::watch(KubeOptions {
        node: NODE.into(),
        kubeconfig: Some(missing),
    })
    .unwrap_err();
    assert!(matches!(e, KubeError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    let e = KubeDatastore::watch(KubeOptions {
        node: String::new(),
        kubeconfig: None,
    })
    .unwrap_err();
    assert!(matches!(e, KubeError::NoNode), "{e:?}");
}

#[test]
fn the_nodes_annotations_are_written_by_a_merge_patch_and_tried_again_until_they_are() {
    let api = example_api();
    let w = start(&api);
    applied(next(&w));
    // The first write finds the server unreachable, the second goes through.
    api.fail("nodes", 1);
    let wanted = crate::datastore::Annotations::from([
        (
            "ferry.io/ipv4-address".to_string(),
            "192.168.10.2/24".to_string(),
        ),
        (
            "ferry.io/ipv4-gateway".to_string(),
            "192.168.10.1".to_string(),
        ),
    ]);
    assert!(w.annotate_node(wanted));
    let deadline = std::time::Instant::now() + WAIT + ANNOTATE_RETRY;
    let node = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the annotations were not written"
        );
        if let Some(Update::Applied { cluster, .. }) = w.next_update(Duration::from_millis(200)) {
            let n = cluster.node(NODE).unwrap();
            if n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("ferry.io/ipv4-gateway"))
            {
                break n.clone();
            }
        }
    };
    let a = node.metadata.annotations.unwrap();
    assert_eq!(a["ferry.io/ipv4-address"], "192.168.10.2/24");
    assert_eq!(a["ferry.io/ipv4-gateway"], "192.168.10.1");
    let patches: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH"))
        .collect();
    let p = format!("PATCH /api/v1/nodes/{NODE}");
    assert_eq!(patches, [p.clone(), p], "one failed, one written");
}
