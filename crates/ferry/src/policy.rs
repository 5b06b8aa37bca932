//! `ferry policy`: the NetworkPolicies and ClusterNetworkPolicies the running agent
//! enforces (`list`), and the rules that apply to one pod once selectors, namespaces and
//! named ports are resolved (`explain`), asked over its local API socket.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use ferry_api::{
    Enforcement, PodPolicyInfo, PolicyEnforcement, PolicyInfo, PolicyPreview, Request, Response,
};

use crate::status::{render_enforcement, unenforced_state};

/// Arguments of `ferry policy`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
    /// The agent's local API socket.
    #[arg(long, global = true, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    #[command(flatten)]
    pub output: crate::output::Output,
}

/// What to show.
#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// The policies in force, with the pods of this node each applies to.
    List,
    /// The rules that apply to a pod, in the order they are evaluated, per direction.
    Explain {
        /// The pod, `NAMESPACE/NAME` (on any node).
        pod: String,
    },
    /// The tracked connections of this node that the NetworkPolicies,
    /// ClusterNetworkPolicies and Namespaces of a file would not allow, before the file
    /// is applied (with `policy-on-change: reevaluate` the change ends them; with
    /// `keep` they stay). Nothing changes.
    Preview {
        /// The manifests (YAML, as for `kubectl apply -f`); `-` reads standard input.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        /// Preview deleting these objects instead.
        #[arg(long)]
        delete: bool,
    },
}

/// Asks the agent and prints the answer.
pub fn run(args: &Args) -> Result<()> {
    if let What::Preview { file, delete } = &args.what {
        return preview(args, file, *delete);
    }
    let pod = match &args.what {
        What::List | What::Preview { .. } => None,
        What::Explain { pod } => {
            if pod
                .split_once('/')
                .is_none_or(|(ns, n)| ns.is_empty() || n.is_empty())
            {
                bail!("{pod:?}: expected NAMESPACE/NAME");
            }
            Some(pod.clone())
        }
    };
    let r = crate::ask::ask(&args.api_socket, &Request::Policy { pod })?;
    let answer = match r {
        Response::Ok(a) => a
            .policy
            .ok_or_else(|| anyhow!("the agent's answer has no policy"))?,
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    };
    let text = match &args.what {
        What::List | What::Preview { .. } => {
            render_list(&answer.policies, answer.enforcement.as_ref())
        }
        What::Explain { .. } => render_pod(
            answer
                .pod
                .as_ref()
                .ok_or_else(|| anyhow!("the agent's answer has no pod"))?,
        ),
    };
    args.output.print(&answer, || text)
}

fn preview(args: &Args, file: &std::path::Path, delete: bool) -> Result<()> {
    let manifests = if file == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let r = crate::ask::ask(
        &args.api_socket,
        &Request::PolicyPreview { manifests, delete },
    )?;
    let p = match r {
        Response::Ok(a) => a
            .policy
            .and_then(|p| p.preview)
            .ok_or_else(|| anyhow!("the agent's answer has no preview"))?,
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    };
    args.output.print(&p, || render_preview(&p, delete))
}

fn render_preview(p: &PolicyPreview, delete: bool) -> String {
    let mut s = String::new();
    let what = if delete { "deleting" } else { "applying" };
    let _ = writeln!(s, "{what} {}:", p.objects.join(", "));
    if p.cut.is_empty() {
        let _ = writeln!(s, "no tracked connection of this node would be denied");
        return s;
    }
    let fate = if p.reevaluate {
        "the change ends them (policy-on-change: reevaluate)"
    } else {
        "they stay until they end (policy-on-change: keep); new ones are denied"
    };
    let _ = writeln!(
        s,
        "{} tracked connections would be denied; {fate}:",
        p.cut.len()
    );
    for c in &p.cut {
        let _ = writeln!(s, "  {}\n    {}", c.original, c.denial);
    }
    s
}

/// The policies in force, each marked when it is not enforced as written; then, when
/// any is not, what `ferry status` says of them.
fn render_list(policies: &[PolicyInfo], enforcement: Option<&PolicyEnforcement>) -> String {
    let mut s = String::new();
    let unenforced = enforcement.map(|e| &e.unenforced[..]).unwrap_or_default();
    if policies.is_empty() {
        s.push_str("no policies: every pod is open in both directions\n");
    }
    for p in policies {
        let not_as_written: Vec<_> = unenforced
            .iter()
            .filter(|u| p.name == format!("{} {}", u.kind, u.policy))
            .collect();
        let _ = write!(s, "{}", p.name);
        if let (Some(t), Some(pr)) = (&p.tier, p.priority) {
            let _ = write!(s, " ({t} tier, priority {pr})");
        }
        if !p.isolates.is_empty() {
            let _ = write!(s, " (isolates {})", p.isolates.join(" and "));
        }
        let _ = writeln!(s, ": {} rules", p.rules);
        let pods = if p.local_pods.is_empty() {
            "none".to_string()
        } else {
            p.local_pods.join(", ")
        };
        let _ = writeln!(s, "  pods of this node: {pods}");
        // A deviation's reasons say what the warnings say, and what ferry does.
        let deviation = not_as_written
            .iter()
            .any(|u| u.state == Enforcement::Deviation);
        for w in p.warnings.iter().filter(|_| !deviation) {
            let _ = writeln!(s, "  warning: {w}");
        }
        for u in not_as_written {
            let _ = writeln!(s, "  NOT AS WRITTEN: {}", unenforced_state(u));
            for r in &u.reasons {
                let _ = writeln!(s, "    {r}");
            }
        }
    }
    if let Some(e) = enforcement.filter(|e| !e.unenforced.is_empty() || e.stale.is_some()) {
        let _ = write!(s, "\n{}", render_enforcement(e));
    }
    s
}

fn render_pod(pod: &PodPolicyInfo) -> String {
    let mut s = String::new();
    let _ = write!(s, "pod {}", pod.pod);
    if let Some(n) = &pod.node {
        let _ = write!(s, " on node {n}");
    }
    let addrs: Vec<String> = pod.addresses.iter().map(ToString::to_string).collect();
    let _ = writeln!(s, " ({})", addrs.join(", "));
    for n in &pod.notes {
        let _ = writeln!(s, "note: {n}");
    }
    for d in &pod.directions {
        let _ = writeln!(s, "{}:", d.direction);
        let toward = if d.direction == "ingress" {
            "from"
        } else {
            "to"
        };
        if d.rules.is_empty() && d.isolated_by.is_empty() {
            let _ = writeln!(s, "  no policy applies: everything is allowed");
            continue;
        }
        let mut tier = "";
        for (i, r) in d.rules.iter().enumerate() {
            if r.tier != tier {
                tier = &r.tier;
                let title = match tier {
                    "admin" => "Admin tier, in order (the first match decides):",
                    "network_policy" => "NetworkPolicy (allowed: what any rule allows):",
                    _ if !d.isolated_by.is_empty() => {
                        "Baseline tier (not asked: NetworkPolicy isolates the pod):"
                    }
                    _ => "Baseline tier, in order (the first match decides):",
                };
                let _ = writeln!(s, "  {title}");
            }
            let _ = writeln!(s, "    {}. {} {}: {}", i + 1, r.policy, r.rule, r.action);
            if r.matches.is_empty() {
                let _ = writeln!(s, "       matches nothing");
            }
            for m in &r.matches {
                let peers = m.peers.as_ref().map_or_else(
                    || "every peer".to_string(),
                    |p| {
                        if p.is_empty() {
                            "no peer".to_string()
                        } else {
                            p.join(", ")
                        }
                    },
                );
                let ports = if m.ports.is_empty() {
                    "every port".to_string()
                } else {
                    m.ports.join(", ")
                };
                let _ = writeln!(s, "       {toward} {peers} on {ports}");
            }
        }
        if !d.isolated_by.is_empty() {
            let _ = writeln!(
                s,
                "  isolated by {}: what no NetworkPolicy rule allows is denied",
                d.isolated_by.join(", ")
            );
        } else {
            let _ = writeln!(s, "  not isolated: what no rule decides is allowed");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use ferry_api::{DirectionInfo, MatchInfo, RuleInfo};

    use super::*;

    #[test]
    fn a_preview_says_what_would_be_denied_and_what_then_happens() {
        let mut p = PolicyPreview {
            objects: vec!["NetworkPolicy x/deny".into()],
            reevaluate: false,
            cut: vec![],
        };
        assert_eq!(
            render_preview(&p, false),
            "applying NetworkPolicy x/deny:\nno tracked connection of this node would be denied\n"
        );
        p.cut.push(ferry_api::PolicyCutInfo {
            original: "tcp 10.0.0.1:4000 -> 10.0.0.2:80".into(),
            reply: "tcp 10.0.0.2:80 -> 10.0.0.1:4000".into(),
            denial: "ingress to pod-b: denied".into(),
        });
        let s = render_preview(&p, true);
        assert!(
            s.starts_with(
                "deleting NetworkPolicy x/deny:\n1 tracked connections would be denied; they stay"
            ),
            "{s}"
        );
        assert!(
            s.ends_with("  tcp 10.0.0.1:4000 -> 10.0.0.2:80\n    ingress to pod-b: denied\n"),
            "{s}"
        );
        p.reevaluate = true;
        assert!(render_preview(&p, false).contains("the change ends them"));
    }

    #[test]
    fn a_list_names_tiers_isolation_and_local_pods() {
        let s = render_list(
            &[
                PolicyInfo {
                    name: "ClusterNetworkPolicy deny-all".into(),
                    tier: Some("admin".into()),
                    priority: Some(5),
                    rules: 2,
                    ..PolicyInfo::default()
                },
                PolicyInfo {
                    name: "NetworkPolicy x/b".into(),
                    isolates: vec!["ingress".into(), "egress".into()],
                    rules: 1,
                    local_pods: vec!["x/b".into()],
                    ..PolicyInfo::default()
                },
            ],
            None,
        );
        assert_eq!(
            s,
            "ClusterNetworkPolicy deny-all (admin tier, priority 5): 2 rules\n  pods of this node: none\n\
             NetworkPolicy x/b (isolates ingress and egress): 1 rules\n  pods of this node: x/b\n"
        );
        assert!(render_list(&[], None).starts_with("no policies"));
    }

    #[test]
    fn a_list_marks_the_policies_not_enforced_as_written_and_names_those_not_in_force() {
        let entry = |policy: &str, state| ferry_api::UnenforcedPolicy {
            kind: "NetworkPolicy".into(),
            policy: policy.into(),
            state,
            enforced_version: None,
            latest_version: None,
            reasons: vec![format!("refused: {policy}")],
        };
        let e = PolicyEnforcement {
            network_policies: 1,
            unenforced: vec![
                entry("x/b", Enforcement::OlderVersion),
                entry("x/new", Enforcement::NotEnforced),
            ],
            ..PolicyEnforcement::default()
        };
        let s = render_list(
            &[PolicyInfo {
                name: "NetworkPolicy x/b".into(),
                rules: 1,
                ..PolicyInfo::default()
            }],
            Some(&e),
        );
        assert!(
            s.starts_with(
                "NetworkPolicy x/b: 1 rules\n  pods of this node: none\n  NOT AS WRITTEN: an older version enforced\n    refused: x/b\n\n"
            ),
            "{s}"
        );
        assert!(
            s.contains("  NetworkPolicy x/new: NOT enforced\n    refused: x/new\n"),
            "{s}"
        );
        // All as written: the list alone.
        let fine = PolicyEnforcement::default();
        assert_eq!(render_list(&[], Some(&fine)), render_list(&[], None));
    }

    #[test]
    fn a_pod_reads_its_rules_by_tier_with_peers_and_ports() {
        let rule = |tier: &str, action: &str, peers: Option<Vec<String>>| RuleInfo {
            tier: tier.into(),
            policy: "P".into(),
            rule: "ingress[0]".into(),
            action: action.into(),
            matches: vec![MatchInfo {
                peers,
                ports: vec!["tcp/80".into()],
            }],
        };
        let s = render_pod(&PodPolicyInfo {
            pod: "x/b".into(),
            node: Some("n1".into()),
            addresses: vec!["10.0.0.2".parse().unwrap()],
            directions: vec![
                DirectionInfo {
                    direction: "ingress".into(),
                    isolated_by: vec!["NetworkPolicy x/b".into()],
                    rules: vec![
                        rule("admin", "deny", Some(vec!["10.9.0.0/16".into()])),
                        rule("network_policy", "accept", None),
                        rule("baseline", "accept", Some(vec![])),
                    ],
                },
                DirectionInfo {
                    direction: "egress".into(),
                    ..DirectionInfo::default()
                },
            ],
            notes: vec!["a note".into()],
        });
        assert!(
            s.starts_with("pod x/b on node n1 (10.0.0.2)\nnote: a note\ningress:\n"),
            "{s}"
        );
        assert!(s.contains("  Admin tier, in order (the first match decides):\n    1. P ingress[0]: deny\n       from 10.9.0.0/16 on tcp/80\n"), "{s}");
        assert!(s.contains("from every peer on tcp/80"), "{s}");
        assert!(
            s.contains("Baseline tier (not asked: NetworkPolicy isolates the pod):"),
            "{s}"
        );
        assert!(s.contains("from no peer on tcp/80"), "{s}");
        assert!(s.contains("isolated by NetworkPolicy x/b"), "{s}");
        assert!(
            s.ends_with("egress:\n  no policy applies: everything is allowed\n"),
            "{s}"
        );
    }
}
