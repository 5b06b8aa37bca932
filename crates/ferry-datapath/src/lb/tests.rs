use super::*;
use crate::flow::Addr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc(name: &str, proto: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        proto: proto.into(),
        port: 80,
        cluster_ips: vec![ip("10.96.0.10")],
        node_port: Some(30080),
        backends: vec![BackendSpec {
            addr: ip("10.244.1.5"),
            port: 8080,
            node: Some("a".into()),
            no_node: false,
            ready: true,
            serving: None,
            terminating: false,
            hints: Default::default(),
        }],
        ..ServiceSpec::default()
    }
}

fn key(dst: &str, dport: u16) -> FlowKey {
    FlowKey {
        zone: 0,
        src: Addr::from(ip("192.168.60.7")),
        dst: ip(dst).into(),
        proto: proto::TCP,
        src_port: 40000,
        dst_port: dport,
    }
}

#[test]
fn test_compile_errors_name_the_service_and_the_problem() {
    let compile = |specs: &[ServiceSpec]| Services::compile(specs, "a", [ip("192.168.50.10")]);
    let e = compile(&[svc("default/s:sctp", "sctp")]).unwrap_err();
    assert!(e.contains("default/s:sctp") && e.contains("SCTP"), "{e}");
    let e = compile(&[svc("x", "icmp")]).unwrap_err();
    assert!(e.contains("expected tcp or udp"), "{e}");
    let e = compile(&[svc("x", "tcp"), svc("x", "udp")]).unwrap_err();
    assert!(e.contains("duplicate service name"), "{e}");
    let mut other = svc("y", "tcp");
    other.node_port = None;
    let e = compile(&[svc("x", "tcp"), other]).unwrap_err();
    assert!(
        e.contains("frontend tcp 10.96.0.10:80") && e.contains("also \"x\"'s"),
        "{e}"
    );
    let mut other = svc("y", "tcp");
    other.cluster_ips.clear();
    let e = compile(&[svc("x", "tcp"), other]).unwrap_err();
    assert!(e.contains("node port tcp 30080"), "{e}");
    // The same port number over another protocol is another frontend.
    compile(&[svc("x", "tcp"), svc("y", "udp")]).unwrap();
    let mut dup = svc("x", "tcp");
    dup.backends.push(dup.backends[0].clone());
    let e = compile(&[dup]).unwrap_err();
    assert!(
        e.contains("backends[1]: duplicate endpoint 10.244.1.5:8080"),
        "{e}"
    );
    let mut zero = svc("x", "tcp");
    zero.port = 0;
    assert!(compile(&[zero]).unwrap_err().contains("port must be"));
}

/// A Service may name one address twice: an external IP that is also its load
/// balancer's, a repeated external IP, its own cluster IP among its external IPs. That is
/// one frontend, with the scope of its first naming (cluster IPs come first), not a clash
/// with itself; removing the Service removes it.
#[test]
fn test_a_service_naming_one_address_twice_has_one_frontend() {
    let mut s = svc("x", "tcp");
    s.external_ips = vec![ip("203.0.113.7"), ip("203.0.113.7"), ip("10.96.0.10")];
    s.load_balancer_ips = vec![ip("203.0.113.7")];
    let compiled = Services::compile(std::slice::from_ref(&s), "a", [ip("192.168.50.10")]).unwrap();
    let f = compiled.frontend(&key("203.0.113.7", 80)).unwrap();
    assert_eq!(f.scope, Scope::External);
    let f = compiled.frontend(&key("10.96.0.10", 80)).unwrap();
    assert_eq!(f.scope, Scope::Internal);
    // Another Service on one of those addresses still clashes, and names the first.
    let mut other = svc("y", "tcp");
    other.cluster_ips = vec![ip("203.0.113.7")];
    other.node_port = None;
    let e = Services::compile(&[s.clone(), other], "a", [ip("192.168.50.10")]).unwrap_err();
    assert!(
        e.contains("frontend tcp 203.0.113.7:80") && e.contains("also \"x\"'s"),
        "{e}"
    );
    // The same through an update, and out again.
    let empty = Services::compile(&[], "a", [ip("192.168.50.10")]).unwrap();
    let added = empty.update(&[], std::slice::from_ref(&s)).unwrap();
    assert!(added.frontend(&key("203.0.113.7", 80)).is_some());
    let removed = added.update(&["x"], &[]).unwrap();
    assert_eq!(removed.frontend(&key("203.0.113.7", 80)), None);
    assert_eq!(removed.frontend(&key("10.96.0.10", 80)), None);
}

#[test]
fn test_node_ports_are_reached_on_this_nodes_addresses_only() {
    let s = Services::compile(&[svc("x", "tcp")], "a", [ip("192.168.50.10")]).unwrap();
    let f = s.frontend(&key("192.168.50.10", 30080)).unwrap();
    assert_eq!(f.scope, Scope::External);
    assert_eq!(s.frontend(&key("192.168.50.11", 30080)), None);
    assert_eq!(s.frontend(&key("10.96.0.10", 30080)), None);
    assert_eq!(
        s.frontend(&key("10.96.0.10", 80)).map(|f| f.scope),
        Some(Scope::Internal)
    );
    let mut udp = key("10.96.0.10", 80);
    udp.proto = proto::UDP;
    assert_eq!(s.frontend(&udp), None, "a TCP Service does not take UDP");
    assert!(s.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert!(!s.has_backend(proto::UDP, ip("10.244.1.5"), 8080));
}

#[test]
fn test_the_node_port_at_the_cluster_ip_is_the_host_node_port_unless_taken() {
    let s = Services::compile(&[svc("x", "tcp")], "a", [ip("192.168.50.10")]).unwrap();
    let f = s.host_node_port(&key("10.96.0.10", 30080)).unwrap();
    assert_eq!(f.scope, Scope::External);
    assert_eq!(s.host_node_port(&key("10.96.0.11", 30080)), None);
    assert_eq!(s.host_node_port(&key("10.96.0.10", 30081)), None);
    // Another Service port of the same cluster IP at the node port's number.
    let mut other = svc("y", "tcp");
    other.port = 30080;
    other.node_port = None;
    let s = Services::compile(&[svc("x", "tcp"), other], "a", []).unwrap();
    assert!(s.is_frontend(proto::TCP, ip("10.96.0.10"), 30080));
    assert_eq!(s.host_node_port(&key("10.96.0.10", 30080)), None);
}

#[test]
fn test_an_endpoint_without_a_node_or_on_this_node_is_local() {
    let mut spec = svc("x", "tcp");
    spec.backends[0].node = None;
    spec.backends.push(BackendSpec {
        addr: ip("10.244.2.5"),
        node: Some("b".into()),
        ..spec.backends[0].clone()
    });
    let s = Services::compile(&[spec], "a", []).unwrap();
    let local: Vec<bool> = s.services[0].backends.iter().map(|b| b.local).collect();
    assert_eq!(local, [true, false]);
    assert_eq!(s.services[0].eligible(0, Policy::Local), &[0]);
    assert_eq!(s.services[0].eligible(0, Policy::Cluster), &[0, 1]);
    assert!(s.services[0].eligible(1, Policy::Cluster).is_empty());
}

#[test]
fn test_an_endpoint_on_no_node_is_local_nowhere_and_stays_so_through_updates() {
    let mut spec = svc("x", "tcp");
    spec.backends[0].node = None;
    spec.backends[0].no_node = true;
    let s = Services::compile(std::slice::from_ref(&spec), "a", []).unwrap();
    assert!(!s.services[0].backends[0].local);
    assert!(s.services[0].eligible(0, Policy::Local).is_empty());
    assert_eq!(s.services[0].eligible(0, Policy::Cluster), &[0]);
    assert_eq!(s.services[0].to_spec().backends, spec.backends);

    spec.backends[0].node = Some("a".into());
    let err = Services::compile(&[spec], "a", []).unwrap_err();
    assert!(err.contains("no_node and node"), "{err}");
}

#[test]
fn test_an_endpoint_that_stops_serving_counts_as_gone_for_the_sweep() {
    let s = Services::compile(&[svc("x", "tcp")], "a", []).unwrap();
    let mut failing = svc("x", "tcp");
    failing.backends[0].ready = false;
    failing.backends[0].serving = Some(false);
    let u = s.update(&[], &[failing]).unwrap();
    assert!(u.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert!(!u.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert_eq!(
        u.endpoints_gone_since(&s),
        Some(&[(proto::TCP, ip("10.244.1.5"), 8080)][..])
    );
    // Terminating but serving still serves; so does a ready endpoint.
    let mut draining = svc("x", "tcp");
    draining.backends[0].ready = false;
    draining.backends[0].serving = Some(true);
    draining.backends[0].terminating = true;
    let d = s.update(&[], &[draining]).unwrap();
    assert!(d.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert_eq!(d.endpoints_gone_since(&s), Some(&[][..]));
}

#[test]
fn test_affinity_is_bounded_and_counts_what_it_could_not_keep() {
    let mut a = Affinity::new(2);
    let b = (ip("10.244.1.5"), 8080);
    a.put(1, ip("10.0.0.1"), b, 0, 10);
    a.put(1, ip("10.0.0.2"), b, 0, 10);
    a.put(1, ip("10.0.0.3"), b, 0, 10);
    assert_eq!((a.len(), a.refused()), (2, 1));
    assert_eq!(a.get(1, ip("10.0.0.3"), 5), None);
    // Once the first records expire, room is made for new ones.
    a.put(1, ip("10.0.0.3"), b, 20, 10);
    assert_eq!(a.len(), 1);
    assert_eq!(a.get(1, ip("10.0.0.3"), 25), Some(b));
    assert_eq!(
        a.get(1, ip("10.0.0.3"), 30),
        None,
        "expired at its deadline"
    );
}

#[test]
fn test_update_replaces_removes_and_adds_service_ports_in_place() {
    let mut b = svc("b", "tcp");
    b.cluster_ips = vec![ip("10.96.0.20")];
    b.node_port = Some(30081);
    let s = Services::compile(&[svc("a", "tcp"), b.clone()], "a", [ip("192.168.50.10")]).unwrap();
    // "a" gets another endpoint, "b" goes, "c" comes with b's cluster IP.
    let mut a2 = svc("a", "tcp");
    a2.backends[0].addr = ip("10.244.1.9");
    let mut c = svc("c", "udp");
    c.cluster_ips = vec![ip("10.96.0.20")];
    c.node_port = None;
    let u = s.update(&["b"], &[a2, c]).unwrap();
    assert_eq!(u.len(), 2);
    assert!(u.get("b").is_none());
    assert!(u.has_backend(proto::TCP, ip("10.244.1.9"), 8080));
    assert!(
        !u.has_backend(proto::TCP, ip("10.244.1.5"), 8080),
        "the replaced endpoint is gone"
    );
    let hit = u.frontend(&key("10.96.0.10", 80)).unwrap();
    assert_eq!(u.services[hit.service as usize].name, "a");
    assert_eq!(
        u.frontend(&key("10.96.0.20", 80)),
        None,
        "b's TCP frontend is gone"
    );
    assert_eq!(u.frontend(&key("192.168.50.10", 30081)), None);
    let mut k = key("10.96.0.20", 80);
    k.proto = proto::UDP;
    assert_eq!(
        u.services[u.frontend(&k).unwrap().service as usize].name,
        "c"
    );
    // The original is untouched.
    assert!(s.get("b").is_some());
    assert!(s.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    // An endpoint two Service ports share stays while either has it.
    let mut d = svc("d", "tcp");
    d.cluster_ips = vec![ip("10.96.0.30")];
    d.node_port = None;
    let both = s.update(&[], &[d]).unwrap();
    let one = both.update(&["a"], &[]).unwrap();
    assert!(one.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    // A clash is refused and names both.
    let mut clash = svc("e", "tcp");
    clash.node_port = None;
    let e = s.update(&[], &[clash]).unwrap_err();
    assert!(e.contains("\"e\"") && e.contains("also \"a\"'s"), "{e}");
}

#[test]
fn test_many_updates_compact_the_emptied_slots() {
    let mut s = Services::compile(&[svc("a", "tcp")], "a", []).unwrap();
    for i in 0..500u32 {
        let mut a = svc("a", "tcp");
        a.backends[0].port = 1 + (i % 1000) as u16;
        s = s.update(&[], &[a]).unwrap();
    }
    assert_eq!(s.len(), 1);
    assert!(s.services.len() <= 2 + 64, "{} slots", s.services.len());
    assert!(s.frontend(&key("10.96.0.10", 80)).is_some());
}

#[test]
fn test_an_update_says_which_endpoints_went() {
    let s = Services::compile(&[svc("a", "tcp")], "a", []).unwrap();
    let mut more = svc("a", "tcp");
    more.backends.push(BackendSpec {
        addr: ip("10.244.1.6"),
        ..more.backends[0].clone()
    });
    let grown = s.update(&[], &[more]).unwrap();
    assert_eq!(grown.endpoints_gone_since(&s), Some(&[][..]), "none went");
    let back = grown.update(&[], &[svc("a", "tcp")]).unwrap();
    assert_eq!(
        back.endpoints_gone_since(&grown),
        Some(&[(proto::TCP, ip("10.244.1.6"), 8080)][..])
    );
    assert_eq!(back.endpoints_gone_since(&s), None, "not made from it");
    let fresh = Services::compile(&[svc("a", "tcp")], "a", []).unwrap();
    assert_eq!(fresh.endpoints_gone_since(&back), None);
}

/// A pod serving in one Service and not ready in another: updating the second must not
/// take the first's serving record of it away.
#[test]
fn test_an_update_takes_away_only_the_serving_counts_of_the_updated_service() {
    let mut b = svc("b", "tcp");
    b.cluster_ips = vec![ip("10.96.0.20")];
    b.node_port = None;
    b.backends[0].ready = false;
    let s = Services::compile(&[svc("a", "tcp"), b.clone()], "a", []).unwrap();
    assert!(s.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080));
    let u = s.update(&[], &[b.clone()]).unwrap();
    assert!(
        u.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080),
        "a still has it serving"
    );
    assert_eq!(u.endpoints_gone_since(&s), Some(&[][..]));
    let gone = u.update(&["b"], &[]).unwrap();
    assert!(gone.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert_eq!(gone.endpoints_gone_since(&u), Some(&[][..]));
    // Once a goes too, the endpoint no longer serves, and then is gone.
    let unserved = u.update(&["a"], &[]).unwrap();
    assert!(unserved.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert!(!unserved.has_serving_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert_eq!(
        unserved.endpoints_gone_since(&u),
        Some(&[(proto::TCP, ip("10.244.1.5"), 8080)][..])
    );
    let none = unserved.update(&["b"], &[]).unwrap();
    assert!(!none.has_backend(proto::TCP, ip("10.244.1.5"), 8080));
    assert_eq!(
        none.endpoints_gone_since(&unserved),
        Some(&[(proto::TCP, ip("10.244.1.5"), 8080)][..])
    );
}

#[test]
fn test_an_update_says_whether_a_udp_frontend_came() {
    let s = Services::compile(&[svc("a", "udp")], "a", []).unwrap();
    let same = s.update(&[], &[svc("a", "udp")]).unwrap();
    assert_eq!(same.udp_frontends_added_since(&s), Some(false));
    let mut tcp = svc("t", "tcp");
    tcp.cluster_ips = vec![ip("10.96.0.30")];
    let with_tcp = s.update(&[], &[tcp]).unwrap();
    assert_eq!(with_tcp.udp_frontends_added_since(&s), Some(false));
    let mut ext = svc("a", "udp");
    ext.external_ips = vec![ip("203.0.113.7")];
    let more = s.update(&[], &[ext]).unwrap();
    assert_eq!(more.udp_frontends_added_since(&s), Some(true));
    let mut np = svc("a", "udp");
    np.node_port = Some(30053);
    let moved = s.update(&[], &[np]).unwrap();
    assert_eq!(moved.udp_frontends_added_since(&s), Some(true));
    assert_eq!(
        moved.udp_frontends_added_since(&more),
        None,
        "not made from it"
    );
    let fresh = Services::compile(&[svc("a", "udp")], "a", []).unwrap();
    assert_eq!(fresh.udp_frontends_added_since(&s), None);
    // The original tuple of a flow to a frontend, whichever kind.
    let s = Services::compile(&[svc("a", "udp")], "a", [ip("192.168.50.10")]).unwrap();
    let udp = |dst, port| FlowKey {
        proto: proto::UDP,
        ..key(dst, port)
    };
    assert!(s.is_frontend_of(&udp("10.96.0.10", 80)));
    assert!(s.is_frontend_of(&udp("192.168.50.10", 30080)));
    assert!(s.is_frontend_of(&udp("10.96.0.10", 30080)));
    assert!(!s.is_frontend_of(&udp("10.96.0.10", 81)));
    assert!(!s.is_frontend_of(&key("10.96.0.10", 80)), "TCP");
}

/// A full table of live records costs a new client no pass over the records: none is
/// made before a record may have expired, and at most one a second of packet time
/// whatever the records do.
#[test]
fn test_a_full_affinity_table_of_live_records_is_swept_at_most_once_a_second() {
    const MS: u64 = 1_000_000;
    let b = (ip("10.244.1.5"), 8080);
    let client = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
    // Records that live 100 s: nothing to sweep for 10 s of new clients.
    let mut a = Affinity::new(4);
    for i in 0..4 {
        a.put(1, client(i), b, 0, 100_000 * MS);
    }
    for t in 0..10_000u32 {
        a.put(1, client(100 + t), b, u64::from(t) * MS, 100_000 * MS);
    }
    assert_eq!((a.len(), a.refused(), a.sweeps()), (4, 10_000, 0));
    // Records refreshed just before they expire, every millisecond: each may have
    // expired by the next new client, and none has.
    let mut a = Affinity::new(4);
    for t in 0..10_000u32 {
        let now = u64::from(t) * MS;
        for i in 0..4 {
            a.put(1, client(i), b, now, 2 * MS);
        }
        a.put(1, client(100 + t), b, now, 2 * MS);
    }
    assert_eq!((a.len(), a.refused()), (4, 10_000));
    assert!(a.sweeps() <= 10, "{} sweeps in 10 s", a.sweeps());
    // Once the records expire, a new client gets one at its next sweep.
    let later = 10_000 * MS + 1_000_000_000;
    a.put(1, client(99), b, later, 2 * MS);
    assert_eq!(a.get(1, client(99), later + 1), Some(b));
}

/// Endpoints `10.244.N.5:8080` for N in `nodes`, endpoint N on node `nN` ("n1" local).
fn spread(name: &str, nodes: std::ops::RangeInclusive<u8>) -> ServiceSpec {
    let mut s = svc(name, "tcp");
    s.backends = nodes
        .map(|n| BackendSpec {
            addr: ip(&format!("10.244.{n}.5")),
            port: 8080,
            node: Some(format!("n{n}")),
            no_node: false,
            ready: true,
            serving: None,
            terminating: false,
            hints: Default::default(),
        })
        .collect();
    s
}

/// `spec` compiled on `node` with the balance `mode` and the default seed.
fn balanced(spec: &ServiceSpec, node: &str, mode: BalanceMode) -> Services {
    let balance = BalanceSpec {
        mode,
        ..BalanceSpec::default()
    };
    Services::compile_balanced(std::slice::from_ref(spec), node, [], balance).unwrap()
}

/// The endpoint address each of `count` flows to the cluster IP gets.
fn chosen(s: &Services, affinity: &Affinity, count: u16, from_node: bool) -> Vec<IpAddr> {
    (0..count)
        .map(|i| {
            let k = FlowKey {
                src_port: 10_000 + i,
                ..key("10.96.0.10", 80)
            };
            let f = s.frontend(&k).unwrap();
            let b = s.choose(f, &k, from_node, affinity, 0).unwrap();
            s.services[f.service as usize].backends[b].addr
        })
        .collect()
}

/// With a consistent balance (`consistent`, the default, or `maglev`), the endpoint of a
/// flow depends on nothing this node or this process holds: two nodes, or an agent and
/// the one after it, with their own tables and affinity keys, choose alike. With
/// `random`, each process keys its own hash.
#[test]
fn test_a_consistent_balance_chooses_alike_on_every_node_and_random_does_not() {
    let spec = spread("x", 1..=4);
    assert_eq!(
        Services::compile(std::slice::from_ref(&spec), "n1", [])
            .unwrap()
            .balance()
            .mode,
        BalanceMode::Consistent
    );
    for mode in [BalanceMode::Consistent, BalanceMode::Maglev] {
        let here = balanced(&spec, "n1", mode);
        let a = chosen(&here, &Affinity::default(), 2000, false);
        assert_eq!(
            a,
            chosen(
                &balanced(&spec, "n3", mode),
                &Affinity::default(),
                2000,
                false
            )
        );
        for n in 1..=4 {
            let got = a
                .iter()
                .filter(|e| **e == ip(&format!("10.244.{n}.5")))
                .count();
            assert!(
                (400..600).contains(&got),
                "{mode:?}: endpoint {n}: {got} of 2000"
            );
        }
        // The order the endpoints come in changes nothing.
        let mut reversed = spec.clone();
        reversed.backends.reverse();
        assert_eq!(
            a,
            chosen(
                &balanced(&reversed, "n1", mode),
                &Affinity::default(),
                2000,
                false
            )
        );
        // Another seed: another choice.
        let seeded = BalanceSpec { mode, seed: 7 };
        let s7 = Services::compile_balanced(std::slice::from_ref(&spec), "n1", [], seeded).unwrap();
        let moved = (a.iter().zip(chosen(&s7, &Affinity::default(), 2000, false)))
            .filter(|(x, y)| **x != *y)
            .count();
        assert!(moved > 1000, "{mode:?} seed 7: {moved} of 2000 flows moved");
    }

    let random = BalanceSpec {
        mode: BalanceMode::Random,
        ..BalanceSpec::default()
    };
    let one = Services::compile_balanced(std::slice::from_ref(&spec), "n1", [], random).unwrap();
    let two = Services::compile_balanced(std::slice::from_ref(&spec), "n1", [], random).unwrap();
    let differ = chosen(&one, &Affinity::default(), 2000, false)
        .iter()
        .zip(chosen(&two, &Affinity::default(), 2000, false))
        .filter(|(x, y)| **x != *y)
        .count();
    assert!(
        differ > 1000,
        "random: {differ} of 2000 flows differ between processes"
    );
}

/// An update that removes one endpoint of four moves its flows and few others (none
/// with rendezvous hashing, a few percent with Maglev); the traffic policies keep their
/// sets (local traffic only to this node's endpoints), and affinity still wins over the
/// hash.
#[test]
fn test_a_consistent_balance_moves_few_flows_when_an_endpoint_goes_and_keeps_policies_and_affinity()
{
    let spec = spread("x", 1..=4);
    for mode in [BalanceMode::Consistent, BalanceMode::Maglev] {
        let s = balanced(&spec, "n1", mode);
        let before = chosen(&s, &Affinity::default(), 4000, false);
        let mut less = spec.clone();
        less.backends.retain(|b| b.addr != ip("10.244.3.5"));
        let u = s.update(&[], &[less]).unwrap();
        assert_eq!(u.balance().mode, mode);
        let after = chosen(&u, &Affinity::default(), 4000, false);
        let gone = ip("10.244.3.5");
        let others_moved = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| **b != gone && b != a)
            .count();
        let kept_others = before.iter().filter(|b| **b != gone).count();
        assert!(after.iter().all(|a| *a != gone));
        let most = match mode {
            BalanceMode::Consistent => 0.0,
            _ => 0.05 * kept_others as f64,
        };
        assert!(
            others_moved as f64 <= most,
            "{mode:?}: {others_moved} of {kept_others} flows of the staying endpoints moved"
        );
    }

    let mut local = spec.clone();
    local.internal_policy = Policy::Local;
    let l = Services::compile(&[local], "n1", []).unwrap();
    assert!(
        chosen(&l, &Affinity::default(), 500, false)
            .iter()
            .all(|e| *e == ip("10.244.1.5")),
        "internalTrafficPolicy Local: this node's endpoint only"
    );

    let mut sticky = spec;
    sticky.affinity_timeout_s = Some(60);
    let st = Services::compile(&[sticky], "n1", []).unwrap();
    let mut affinity = Affinity::default();
    let k = key("10.96.0.10", 80);
    let f = st.frontend(&k).unwrap();
    // A record for the client names endpoint 4; every port of the client follows it.
    let four = st.services[f.service as usize]
        .backends
        .iter()
        .position(|b| b.addr == ip("10.244.4.5"))
        .unwrap();
    st.remember(f, &k, four, &mut affinity, 0);
    assert!(
        chosen(&st, &affinity, 200, false)
            .iter()
            .all(|e| *e == ip("10.244.4.5"))
    );
}

/// `consistent` chooses by rendezvous hashing up to its largest set and by a Maglev
/// table past it; `maglev` by a table at any size. A set's chooser is that of its own
/// size: local traffic's set of one endpoint needs no table.
#[test]
fn test_the_chooser_of_a_set_follows_its_size_and_the_mode() {
    let many = |n: u16| {
        let mut s = svc("x", "tcp");
        s.backends = (0..n)
            .map(|i| BackendSpec {
                addr: ip(&format!("10.244.{}.{}", i / 200, i % 200 + 1)),
                port: 8080,
                node: Some(if i == 0 { "n1".into() } else { "n2".into() }),
                no_node: false,
                ready: true,
                serving: None,
                terminating: false,
                hints: Default::default(),
            })
            .collect();
        s
    };
    let max = rendezvous::MAX_ENDPOINTS as u16;
    let kind = |n: u16, mode: BalanceMode, policy: Policy| {
        let s = balanced(&many(n), "n1", mode);
        let svc = &s.services[0];
        assert_eq!(
            svc.eligible(0, policy).len(),
            if policy == Policy::Local {
                1
            } else {
                usize::from(n)
            }
        );
        match svc.chooser(0, policy, mode, s.balance().seed) {
            Chooser::Rendezvous(w) => ("rendezvous", w.len()),
            Chooser::Maglev(t) => ("maglev", t.len()),
        }
    };
    let c = BalanceMode::Consistent;
    assert_eq!(
        kind(max, c, Policy::Cluster),
        ("rendezvous", usize::from(max))
    );
    let m = maglev::size_for(usize::from(max) + 1) as usize;
    assert_eq!(kind(max + 1, c, Policy::Cluster), ("maglev", m));
    assert_eq!(kind(max + 1, c, Policy::Local), ("rendezvous", 1));
    let m = maglev::size_for(2) as usize;
    assert_eq!(kind(2, BalanceMode::Maglev, Policy::Cluster), ("maglev", m));
    // Past the boundary the choice is the table's: what every node computes alike.
    let s = balanced(&many(max + 1), "n1", c);
    let t = maglev::Table::new(
        &s.services[0]
            .eligible(0, Policy::Cluster)
            .iter()
            .map(|&i| (s.services[0].backends[usize::from(i)].addr, 8080))
            .collect::<Vec<_>>(),
        s.balance().seed,
    );
    for i in 0..200u16 {
        let k = FlowKey {
            src_port: 10_000 + i,
            ..key("10.96.0.10", 80)
        };
        let f = s.frontend(&k).unwrap();
        let b = s.choose(f, &k, false, &Affinity::default(), 0).unwrap();
        let set = s.services[0].eligible(0, Policy::Cluster);
        assert_eq!(usize::from(set[t.pick(&k, s.balance().seed)]), b);
    }
}

/// `spread(1..=4)` with each endpoint's zone hints (`z`: its own zone, z1 for n1 and
/// n2, z2 for n3 and n4) and node hints (its own node) as `hinted` says.
fn hinted(zones: bool, nodes: bool) -> ServiceSpec {
    let mut s = spread("t", 1..=4);
    for (i, b) in s.backends.iter_mut().enumerate() {
        if zones {
            b.hints.zones = vec![format!("z{}", i / 2 + 1)];
        }
        if nodes {
            b.hints.nodes = vec![format!("n{}", i + 1)];
        }
    }
    s
}

/// The nodes of the endpoints `spec` gives cluster-wide IPv4 traffic on node `node` of
/// zone `zone` (and, second, those of local traffic).
fn topology_of(spec: &ServiceSpec, node: &str, zone: Option<&str>) -> (Vec<String>, Vec<String>) {
    let s = Services::compile_on(
        std::slice::from_ref(spec),
        node,
        zone,
        [],
        BalanceSpec::default(),
    )
    .unwrap();
    let svc = &s.services[0];
    let nodes = |p| {
        svc.eligible(0, p)
            .iter()
            .map(|&i| svc.backends[usize::from(i)].node.clone().unwrap())
            .collect()
    };
    (nodes(Policy::Cluster), nodes(Policy::Local))
}

/// kube-proxy's topologyModeFromHints and availableForTopology: zone hints when every
/// ready endpoint has some and one names this node's zone, node hints before them on
/// the same terms; otherwise every endpoint. Local traffic never looks at hints.
#[test]
fn test_topology_hints_narrow_cluster_endpoints_as_kube_proxy_does() {
    let all = ["n1", "n2", "n3", "n4"];
    let zoned = hinted(true, false);
    assert_eq!(topology_of(&zoned, "n3", Some("z2")).0, ["n3", "n4"]);
    assert_eq!(
        topology_of(&zoned, "n1", Some("z1")),
        (vec!["n1".into(), "n2".into()], vec!["n1".into()])
    );
    // A zone no endpoint is meant for, or a node without a zone: every endpoint.
    assert_eq!(topology_of(&zoned, "n9", Some("z9")).0, all);
    assert_eq!(topology_of(&zoned, "n3", None).0, all);
    // One ready endpoint without hints: hints are not used.
    let mut partial = zoned.clone();
    partial.backends[0].hints = HintsSpec::default();
    assert_eq!(topology_of(&partial, "n3", Some("z2")).0, all);
    // ...unless it is not ready: it has no say, and serves no one anyway.
    partial.backends[0].ready = false;
    assert_eq!(topology_of(&partial, "n3", Some("z2")).0, ["n3", "n4"]);
    assert_eq!(topology_of(&partial, "n1", Some("z1")).0, ["n2"]);

    // PreferSameNode: node hints (with the zone hints the controller also writes).
    let both = hinted(true, true);
    assert_eq!(topology_of(&both, "n3", Some("z2")).0, ["n3"]);
    // A node no endpoint is meant for falls back to its zone's.
    assert_eq!(topology_of(&both, "n9", Some("z2")).0, ["n3", "n4"]);
    // Node hints only, on a node without endpoints: every endpoint.
    let nodes = hinted(false, true);
    assert_eq!(topology_of(&nodes, "n2", Some("z1")).0, ["n2"]);
    assert_eq!(topology_of(&nodes, "n9", Some("z1")).0, all);
}

/// Hints go through the tables file and back, and the terminating fallback (no ready
/// endpoint) does not look at them: the mode comes from ready endpoints only.
#[test]
fn test_hints_round_trip_and_terminating_endpoints_ignore_them() {
    let mut s = hinted(true, true);
    for b in &mut s.backends {
        b.ready = false;
        b.serving = Some(true);
        b.terminating = true;
    }
    assert_eq!(
        topology_of(&s, "n3", Some("z2")).0,
        ["n1", "n2", "n3", "n4"],
        "no ready endpoint: every serving terminating one"
    );
    let compiled = Services::compile_on(
        std::slice::from_ref(&s),
        "n3",
        Some("z2"),
        [],
        BalanceSpec::default(),
    )
    .unwrap();
    assert_eq!(compiled.services[0].to_spec().backends, s.backends);
    let json =
        r#"{"addr": "10.244.1.5", "port": 8080, "hints": {"zones": ["z1"], "nodes": ["n1"]}}"#;
    let b: BackendSpec = serde_json::from_str(json).unwrap();
    assert_eq!(b.hints.zones, ["z1"]);
    assert_eq!(b.hints.nodes, ["n1"]);
}
