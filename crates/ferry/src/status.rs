//! `ferry status`: the running agent's health (datastore, table sync latency, errors)
//! and dataplane counters, asked over its local API socket.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Result, bail};
use ferry_api::{Counters, Enforcement, PolicyEnforcement, Request, Response, UnenforcedPolicy};

/// Arguments of `ferry status`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    #[command(flatten)]
    pub output: crate::output::Output,
}

/// Asks the agent and prints its counters.
pub fn run(args: &Args) -> Result<()> {
    let r = crate::ask::ask(&args.api_socket, &Request::Counters)?;
    let c = match r {
        Response::Ok(a) => a.counters.unwrap_or_default(),
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    };
    args.output.print(&c, || render(&c))
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

/// The counters as a few human-readable tables.
fn render(c: &Counters) -> String {
    let mut s = String::new();
    if let Some(b) = &c.build {
        let _ = writeln!(s, "agent {}", b.line());
        let own = ferry_agent::build::info();
        if own.version != b.version || own.commit != b.commit {
            let _ = writeln!(s, "  this command is another build: {}", own.line());
        }
    }
    let d = &c.datastore;
    let _ = writeln!(
        s,
        "datastore {} {}: {}, {} errors{}",
        if d.kind.is_empty() { "?" } else { &d.kind },
        d.source,
        if d.synced { "synced" } else { "NOT synced" },
        d.errors_total,
        d.last_sync_unix_ms.map_or_else(
            || ", never synced".to_string(),
            |t| format!(", last sync at {:.3} (Unix time)", t as f64 / 1e3)
        ),
    );
    if let Some(e) = &d.last_error {
        let first = e.lines().next().unwrap_or_default();
        let more = e.lines().count().saturating_sub(1);
        let _ = write!(s, "  last error: {first}");
        if more > 0 {
            let _ = write!(s, " (and {more} more lines; see -o json)");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "tables generation {}; sync latency last {}, max {}, {} syncs",
        c.generation,
        ms(c.sync.last_us),
        ms(c.sync.max_us),
        c.sync.count
    );
    let e = &c.errors;
    let _ = writeln!(
        s,
        "agent errors: datastore {}, compile {}, apply {}, api {}",
        e.datastore, e.compile, e.apply, e.api
    );
    let _ = writeln!(
        s,
        "conntrack: {} connections, {} inserted, {} refused (table full)",
        c.ct_entries, c.ct_inserted, c.ct_insert_failed
    );
    let _ = writeln!(
        s,
        "services: {} connections balanced, {} refused without endpoints; {} datagrams reassembled",
        c.service_balanced, c.service_rejected, c.reassembled
    );
    for (service, n) in &c.service_source_denied {
        let _ = writeln!(
            s,
            "services: {service}: {n} new connections refused by loadBalancerSourceRanges"
        );
    }
    if c.ct_recovered > 0 || c.ct_recovery_refuted > 0 {
        let _ = writeln!(
            s,
            "recovered: {} segments of lost Service connections translated back, {} frontends refuted",
            c.ct_recovered, c.ct_recovery_refuted
        );
    }
    s.push_str(&render_enforcement(&c.enforcement));
    let _ = writeln!(
        s,
        "policy: {} connection directions allowed by a rule, {} denied",
        c.policy_allowed, c.policy_denied
    );
    for (name, p) in &c.policies {
        let _ = writeln!(
            s,
            "  {name}: ingress {} allowed {} denied, egress {} allowed {} denied",
            p.ingress_allowed, p.ingress_denied, p.egress_allowed, p.egress_denied
        );
    }
    if let Some(a) = &c.policy_audit {
        let _ = writeln!(
            s,
            "policy audit log: {} lines, {} repeats not logged, not logged: {} rate limit, {} buffer full; {} write errors",
            a.logged, a.repeated, a.suppressed_rate, a.suppressed_overflow, a.write_errors
        );
    }
    let _ = writeln!(
        s,
        "neighbours: {} packets waiting for a next hop's MAC now, {} waited since start",
        c.neigh_waiting, c.neigh_queued
    );
    let refused: u64 = c.fragments_refused.values().sum();
    let _ = write!(
        s,
        "fragments: {} datagrams ({} bytes) held, {} expired, {} refused",
        c.fragments_held, c.fragment_bytes_held, c.fragments_expired, refused
    );
    let reasons: Vec<String> = c
        .fragments_refused
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    if !reasons.is_empty() {
        let _ = write!(s, " ({})", reasons.join(", "));
    }
    let _ = writeln!(s, "; NAT ports in use {}", c.nat_ports_in_use);
    let workers: Vec<String> = c
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let busy = if w.busy_rounds > 0 {
                format!(", {} rounds busy polling", w.busy_rounds)
            } else {
                String::new()
            };
            let dropped = if w.tx_dropped > 0 {
                format!(", {} dropped out", w.tx_dropped)
            } else {
                String::new()
            };
            let gone = if w.ports_gone > 0 {
                format!(", {} pod ports gone", w.ports_gone)
            } else {
                String::new()
            };
            format!(
                "{i}: {} in, {} out{busy}{dropped}{gone}",
                w.rx_frames, w.tx_frames
            )
        })
        .collect();
    if !workers.is_empty() {
        let _ = writeln!(s, "workers (frames): {}", workers.join("; "));
    }
    let w = c
        .ports
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "\n{:<w$}  {:>12} {:>14} {:>12} {:>14} {:>10}",
        "port", "rx packets", "rx bytes", "tx packets", "tx bytes", "dropped"
    );
    for p in &c.ports {
        let _ = writeln!(
            s,
            "{:<w$}  {:>12} {:>14} {:>12} {:>14} {:>10}",
            p.name,
            p.rx_packets,
            p.rx_bytes,
            p.tx_packets,
            p.tx_bytes,
            p.drops.values().sum::<u64>()
        );
    }
    let _ = writeln!(s, "\ndrops");
    if c.drops.is_empty() {
        let _ = writeln!(s, "  none");
    }
    for (reason, n) in &c.drops {
        let _ = writeln!(s, "  {reason:<28} {n}");
    }
    for p in c.ports.iter().filter(|p| !p.drops.is_empty()) {
        let _ = writeln!(s, "\ndrops on {}", p.name);
        for (reason, n) in &p.drops {
            let _ = writeln!(s, "  {reason:<28} {n}");
        }
    }
    s
}

/// The policies in force and each one not enforced as written, with why.
pub(crate) fn render_enforcement(e: &PolicyEnforcement) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "policies: {} NetworkPolicies and {} ClusterNetworkPolicies in force",
        e.network_policies, e.cluster_network_policies
    );
    if e.unenforced.is_empty() {
        let _ = writeln!(s, ", all enforced as written");
    } else {
        let _ = writeln!(s, "; {} NOT enforced as written:", e.unenforced.len());
    }
    for u in &e.unenforced {
        let _ = writeln!(s, "  {} {}: {}", u.kind, u.policy, unenforced_state(u));
        for r in &u.reasons {
            let _ = writeln!(s, "    {r}");
        }
    }
    if let Some(w) = &e.stale {
        let _ = writeln!(s, "  note: {w}");
    }
    s
}

/// What is enforced of `u`, and which versions: `an older version enforced (in force:
/// resourceVersion 10; latest: resourceVersion 11)`.
pub(crate) fn unenforced_state(u: &UnenforcedPolicy) -> String {
    let versions: Vec<String> = [
        ("in force", &u.enforced_version),
        ("latest", &u.latest_version),
    ]
    .into_iter()
    .filter_map(|(what, v)| Some(format!("{what}: {}", v.as_ref()?)))
    .collect();
    if versions.is_empty() || u.state == Enforcement::Deviation {
        return u.state.to_string();
    }
    format!("{} ({})", u.state, versions.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_port_and_drop_reason() {
        let c = Counters {
            generation: 3,
            ports: vec![ferry_api::PortCounters {
                name: "uplink".into(),
                rx_packets: 10,
                drops: [("source_spoofed".to_string(), 4)].into(),
                ..Default::default()
            }],
            drops: [("ct_invalid".to_string(), 2)].into(),
            service_source_denied: [("default/lb:http".to_string(), 5)].into(),
            ..Counters::default()
        };
        let t = render(&c);
        assert!(t.contains("tables generation 3"), "{t}");
        assert!(
            t.contains(
                "services: default/lb:http: 5 new connections refused by loadBalancerSourceRanges\n"
            ),
            "{t}"
        );
        assert!(t.contains("datastore ?") && t.contains("NOT synced"), "{t}");
        assert!(t.contains("uplink") && t.contains("10"), "{t}");
        assert!(t.contains("ct_invalid") && t.contains(" 2"), "{t}");
        assert!(
            t.contains("drops on uplink\n  source_spoofed               4"),
            "{t}"
        );
    }

    #[test]
    fn the_policies_not_enforced_as_written_are_named_with_their_state_and_why() {
        let c = Counters {
            enforcement: PolicyEnforcement {
                network_policies: 2,
                cluster_network_policies: 1,
                unenforced: vec![
                    UnenforcedPolicy {
                        kind: "NetworkPolicy".into(),
                        policy: "default/deny".into(),
                        state: Enforcement::NotEnforced,
                        enforced_version: None,
                        latest_version: Some("resourceVersion 12".into()),
                        reasons: vec!["refused: spec.podSelector: bad".into()],
                    },
                    UnenforcedPolicy {
                        kind: "NetworkPolicy".into(),
                        policy: "default/db".into(),
                        state: Enforcement::OlderVersion,
                        enforced_version: Some("resourceVersion 10".into()),
                        latest_version: Some("resourceVersion 11".into()),
                        reasons: vec!["refused: spec.ingress[0].ports[0].port: 0".into()],
                    },
                ],
                stale: None,
            },
            ..Counters::default()
        };
        let t = render(&c);
        assert!(
            t.contains(
                "policies: 2 NetworkPolicies and 1 ClusterNetworkPolicies in force; 2 NOT enforced as written:\n\
                 \x20 NetworkPolicy default/deny: NOT enforced (latest: resourceVersion 12)\n\
                 \x20   refused: spec.podSelector: bad\n\
                 \x20 NetworkPolicy default/db: an older version enforced (in force: resourceVersion 10; latest: resourceVersion 11)\n"
            ),
            "{t}"
        );
        let t = render(&Counters::default());
        assert!(
            t.contains("policies: 0 NetworkPolicies and 0 ClusterNetworkPolicies in force, all enforced as written\n"),
            "{t}"
        );
    }

    #[test]
    fn the_datastore_sync_and_errors_are_shown() {
        let c = Counters {
            datastore: ferry_api::DatastoreHealth {
                kind: "file".into(),
                source: "/etc/ferry/cluster".into(),
                synced: true,
                last_sync_unix_ms: Some(1_700_000_000_000),
                last_read_unix_ms: Some(1_699_999_999_900),
                last_error: Some("a.yaml: Service x: bad\nb.yaml: bad".into()),
                errors_total: 2,
            },
            sync: ferry_api::SyncLatency {
                count: 4,
                last_us: 1_500,
                max_us: 12_000,
                ..Default::default()
            },
            errors: ferry_api::AgentErrors {
                compile: 1,
                ..Default::default()
            },
            fragments_held: 3,
            fragments_refused: [("overlapped".to_string(), 2)].into(),
            ..Counters::default()
        };
        let t = render(&c);
        assert!(
            t.contains("datastore file /etc/ferry/cluster: synced, 2 errors"),
            "{t}"
        );
        assert!(
            t.contains("last error: a.yaml: Service x: bad (and 1 more"),
            "{t}"
        );
        assert!(
            t.contains("sync latency last 1.5 ms, max 12.0 ms, 4 syncs"),
            "{t}"
        );
        assert!(t.contains("compile 1"), "{t}");
        assert!(
            t.contains("3 datagrams") && t.contains("(overlapped 2)"),
            "{t}"
        );
        assert!(!t.contains("agent ferry"), "no build reported: {t}");
    }

    #[test]
    fn the_agents_build_is_shown_and_another_than_this_commands_is_said() {
        let own = ferry_agent::build::info();
        let same = Counters {
            build: Some(own.clone()),
            ..Counters::default()
        };
        let t = render(&same);
        assert!(t.starts_with(&format!("agent {}\n", own.line())), "{t}");
        assert!(!t.contains("another build"), "{t}");
        let older = Counters {
            build: Some(ferry_api::BuildInfo {
                version: "0.0.1".into(),
                commit: "0".repeat(40),
                ..own.clone()
            }),
            ..Counters::default()
        };
        let t = render(&older);
        assert!(t.starts_with("agent ferry 0.0.1 (commit 0000"), "{t}");
        assert!(
            t.contains(&format!("  this command is another build: {}", own.line())),
            "{t}"
        );
    }
}
