//! `ferry lab check --suite netpol`: the Kubernetes e2e NetworkPolicy cases on the lab.
//!
//! The suite makes namespaces x, y and z (labelled `ns=x`... as upstream) with pods a, b
//! and c each (labelled `pod=a`...), every pod serving TCP and UDP on 80 and 81, spread
//! over the nodes so that cases cross nodes (and zones). It keeps them (a second run
//! reuses them). Per case, step by step: the step's change (the case's policies, or a
//! namespace's or pod's label), a wait until every agent has the manifests in force,
//! the 9x9 matrices of the step's ports probed and compared with the case's
//! ([`cases`]); at the end the policies go and the labels are put back. A pod's traffic
//! to itself is not compared, as upstream. A case is one row; a failed one lists the
//! cells that differ.

pub mod cases;
pub mod cluster_cases;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::matrix::{self, Grid};
use crate::state::{Served, State};
use crate::topology::{NewPod, manifests};
use crate::{agents, pods, sys};

/// The suite's namespaces.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
/// The pods of each namespace.
pub const POD_NAMES: [&str; 3] = ["a", "b", "c"];
/// The ports every pod serves.
pub const SERVES: [&str; 4] = ["tcp/80", "tcp/81", "udp/80", "udp/81"];
/// The file of the manifest directory holding the current case's policies.
pub const CASE_FILE: &str = "applied-netpol-case.yaml";

/// A case: the upstream test's name and its steps.
#[derive(Debug)]
pub struct Case {
    /// `TCP: ` or `UDP: ` and the upstream test's name.
    pub name: &'static str,
    /// What is changed and checked, in order.
    pub steps: &'static [Step],
}

/// A change, then the matrices expected after it.
#[derive(Debug)]
pub struct Step {
    /// What changes.
    pub change: Change,
    /// The matrices then.
    pub checks: &'static [Check],
}

/// What a step changes.
#[derive(Debug)]
pub enum Change {
    /// The case's policies are now these (YAML; none when empty). `{ip:x/b}` stands for
    /// x/b's IPv4 address, `{cidr4:x/b}` for the /4 around it (upstream's
    /// `makeLargeCIDRForIP`).
    Policies(&'static str),
    /// Namespace, label, value: the label added to the namespace.
    NamespaceLabel(&'static str, &'static str, &'static str),
    /// Pod (`x/b`), label, value: the label added to the pod.
    PodLabel(&'static str, &'static str, &'static str),
}

/// An expected matrix on a port.
#[derive(Debug)]
pub struct Check {
    /// `tcp/80`...
    pub port: &'static str,
    /// One row per source pod, x/a .. z/c; `.` reached, `X` blocked.
    pub grid: [&'static str; 9],
}

/// The nine pods, `x/a` .. `z/c`: rows and columns of every grid.
pub fn pod_ids() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|ns| POD_NAMES.iter().map(move |p| format!("{ns}/{p}")))
        .collect()
}

/// The baseline, then the upstream NetworkPolicy cases, then the ClusterNetworkPolicy
/// ones.
pub fn all_cases() -> Vec<&'static Case> {
    std::iter::once(&cases::BASELINE)
        .chain(cases::all())
        .chain(cluster_cases::CLUSTER_CASES.iter())
        .collect()
}

fn ns_labels(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("ns".to_string(), ns.to_string())])
}

fn pod_labels(pod: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("pod".to_string(), pod.to_string())])
}

fn serves() -> Vec<Served> {
    SERVES.iter().filter_map(|s| s.parse().ok()).collect()
}

/// The cases whose name contains `only` (all when None); an error when none does.
pub fn selected(only: Option<&str>) -> Result<Vec<&'static Case>> {
    let cases: Vec<&Case> = all_cases()
        .into_iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if cases.is_empty() {
        bail!(
            "no netpol case has {:?} in its name (ferry lab check --suite netpol --list shows them)",
            only.unwrap_or("")
        );
    }
    Ok(cases)
}

/// What `case` checks, in one line: each step's change (the policies by kind,
/// namespace and name) and the ports probed.
pub fn describe(case: &Case) -> String {
    let steps: Vec<String> = case
        .steps
        .iter()
        .map(|s| {
            let change = match s.change {
                Change::Policies("") => "no policy".to_string(),
                Change::Policies(text) => match crate::manifests::objects(text) {
                    Ok(objs) => {
                        let names: Vec<String> = objs
                            .iter()
                            .map(|o| {
                                let kind = o.kind.split('.').next().unwrap_or_default();
                                if o.namespace.is_empty() {
                                    format!("{kind} {}", o.name)
                                } else {
                                    format!("{kind} {}/{}", o.namespace, o.name)
                                }
                            })
                            .collect();
                        names.join(", ")
                    }
                    Err(e) => format!("policies that do not parse: {e:#}"),
                },
                Change::NamespaceLabel(ns, k, v) => format!("namespace {ns} labelled {k}={v}"),
                Change::PodLabel(pod, k, v) => format!("pod {pod} labelled {k}={v}"),
            };
            let ports: Vec<&str> = s.checks.iter().map(|c| c.port).collect();
            format!("{change}: 9x9 on {}", ports.join(", "))
        })
        .collect();
    steps.join("; then ")
}

/// `ferry lab check --suite netpol --list`: each case selected, and under it what it
/// checks.
pub fn list(only: Option<&str>, out: &mut dyn Write) -> Result<()> {
    let cases = selected(only)?;
    for c in &cases {
        writeln!(out, "{}\n    {}", c.name, describe(c))?;
    }
    writeln!(out, "{} cases", cases.len())?;
    Ok(())
}

/// Runs the cases whose name contains `only` (all when None): a row each, a summary;
/// true when all passed.
pub fn run(dir: &Path, only: Option<&str>, out: &mut dyn Write) -> Result<bool> {
    let cases = selected(only)?;
    let t = Instant::now();
    setup(dir)?;
    writeln!(
        out,
        "namespaces x, y, z with pods a, b, c up in {:.1}s; cells are from -> to, . reached, X blocked",
        t.elapsed().as_secs_f64()
    )?;
    let mut failed = 0;
    for case in &cases {
        let start = Instant::now();
        let r = run_case(dir, case);
        let cleaned = clean(dir);
        let t = format!("{:.2}s", start.elapsed().as_secs_f64());
        match r.and(cleaned) {
            Ok(()) => writeln!(out, "PASS  {:<100}  {t:>6}", case.name)?,
            Err(e) => {
                failed += 1;
                let text = format!("{e:#}");
                let mut lines = text.lines();
                let first = lines.next().unwrap_or_default();
                writeln!(out, "FAIL  {:<100}  {t:>6}  {first}", case.name)?;
                for l in lines {
                    writeln!(out, "        {l}")?;
                }
            }
        }
        out.flush()?;
    }
    writeln!(out, "{} passed, {failed} failed", cases.len() - failed)?;
    Ok(failed == 0)
}

/// The namespaces and pods, made when missing (the pods over the nodes in turn), their
/// labels as the suite starts them, no case's policies.
fn setup(dir: &Path) -> Result<()> {
    let state = State::load(dir)?;
    let nodes = state.plan.nodes;
    let mut changed = false;
    for ns in NAMESPACES {
        let want = crate::cluster::namespace_labels(ns, &ns_labels(ns));
        if state.namespaces.get(ns) != Some(&want) {
            pods::ns_add(dir, ns, ns_labels(ns))?;
            changed = true;
        }
    }
    for (i, id) in pod_ids().iter().enumerate() {
        let (ns, name) = crate::state::pod_ref(id);
        match state.pod(id) {
            Ok(p) => {
                let mut have = p.serves.clone();
                have.sort();
                let mut want = serves();
                want.sort();
                if have != want {
                    bail!(
                        "pod {id} is in the lab serving other ports: ferry lab pod del --namespace {ns} --name {name} first"
                    );
                }
            }
            Err(_) => {
                let pod = NewPod {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    node: (i as u8 % nodes) + 1,
                    labels: pod_labels(name),
                    serves: serves(),
                };
                pods::pod_add(dir, &pod)?;
                changed = true;
            }
        }
    }
    let mark = agents::changed();
    clean(dir)?;
    if changed {
        agents::wait_in_force(dir, &State::load(dir)?, mark, agents::IN_FORCE_TIMEOUT)?;
    }
    Ok(())
}

/// Takes the case's policies away and puts the labels back, waiting for the agents when
/// something changed.
fn clean(dir: &Path) -> Result<()> {
    let mut changed = remove_case_file(dir)?;
    let state = State::load(dir)?;
    for ns in NAMESPACES {
        let want = crate::cluster::namespace_labels(ns, &ns_labels(ns));
        if state.namespaces.get(ns) != Some(&want) {
            pods::ns_add(dir, ns, ns_labels(ns))?;
            changed = true;
        }
    }
    for id in pod_ids() {
        let name = crate::state::pod_ref(&id).1;
        if state.pod(&id)?.labels != pod_labels(name) {
            pods::set_pod_labels(dir, &id, pod_labels(name))?;
            changed = true;
        }
    }
    if changed {
        let mark = agents::changed();
        agents::wait_in_force(dir, &State::load(dir)?, mark, agents::IN_FORCE_TIMEOUT)
            .context("after the case, its policies removed and the labels put back")?;
    }
    Ok(())
}

fn remove_case_file(dir: &Path) -> Result<bool> {
    let file = manifests(dir).join(CASE_FILE);
    if !file.exists() {
        return Ok(false);
    }
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    Ok(true)
}

/// The policies of `text` for the lab in `state`: pod addresses put in.
pub fn policies(text: &str, state: &State) -> Result<String> {
    let mut out = text.to_string();
    for id in pod_ids() {
        let Ok(p) = state.pod(&id) else { continue };
        let Some(ip) = p.ip4() else { continue };
        out = out.replace(&format!("{{ip:{id}}}"), ip);
        if out.contains(&format!("{{cidr4:{id}}}")) {
            let first: u8 = ip
                .split('.')
                .next()
                .and_then(|o| o.parse().ok())
                .unwrap_or(0);
            out = out.replace(
                &format!("{{cidr4:{id}}}"),
                &format!("{}.0.0.0/4", first & 0xf0),
            );
        }
    }
    if let Some(i) = out.find("{ip:").or_else(|| out.find("{cidr4:")) {
        bail!("a pod address in the policies is unknown: {}", &out[i..]);
    }
    Ok(out)
}

fn run_case(dir: &Path, case: &Case) -> Result<()> {
    let ids = pod_ids();
    for (n, step) in case.steps.iter().enumerate() {
        let what = apply(dir, &step.change).with_context(|| format!("step {}", n + 1))?;
        let state = State::load(dir)?;
        let pods: Vec<&crate::state::Pod> =
            ids.iter().map(|id| state.pod(id)).collect::<Result<_>>()?;
        let mut expected = Vec::new();
        for c in step.checks {
            let port: Served = c.port.parse()?;
            expected.push((port, Grid::parse(&ids, &c.grid)?));
        }
        let ports: Vec<Served> = expected.iter().map(|e| e.0).collect();
        let differ = |observed: &BTreeMap<Served, Grid>| -> Vec<String> {
            expected
                .iter()
                .flat_map(|(port, want)| match observed.get(port) {
                    Some(got) => matrix::diff(*port, want, got, true),
                    None => vec![format!("{port}: not probed")],
                })
                .collect()
        };
        let mut cells = differ(&matrix::probe(&state, &pods, &ports)?);
        if !cells.is_empty() {
            // Once more, a moment later: a cell may have met the change half-way.
            std::thread::sleep(Duration::from_millis(500));
            cells = differ(&matrix::probe(&state, &pods, &ports)?);
        }
        if !cells.is_empty() {
            let steps = if case.steps.len() > 1 {
                format!("step {} ({what}): ", n + 1)
            } else {
                String::new()
            };
            bail!("{steps}{} cells differ\n{}", cells.len(), cells.join("\n"));
        }
    }
    Ok(())
}

/// Makes `change` and waits for it to be in force; says what it was.
fn apply(dir: &Path, change: &Change) -> Result<String> {
    let state = State::load(dir)?;
    let (what, changed) = match change {
        Change::Policies("") => ("no policy".to_string(), remove_case_file(dir)?),
        Change::Policies(text) => {
            let text = policies(text, &state)?;
            crate::manifests::objects(&text).context("the case's policies")?;
            sys::write_atomic(&manifests(dir).join(CASE_FILE), &text)?;
            ("policies applied".to_string(), true)
        }
        Change::NamespaceLabel(ns, k, v) => {
            let mut labels = ns_labels(ns);
            labels.insert(k.to_string(), v.to_string());
            pods::ns_add(dir, ns, labels)?;
            (format!("namespace {ns} labelled {k}={v}"), true)
        }
        Change::PodLabel(pod, k, v) => {
            let mut labels = state.pod(pod)?.labels.clone();
            labels.insert(k.to_string(), v.to_string());
            pods::set_pod_labels(dir, pod, labels)?;
            (format!("pod {pod} labelled {k}={v}"), true)
        }
    };
    if changed {
        let mark = agents::changed();
        agents::wait_in_force(dir, &State::load(dir)?, mark, agents::IN_FORCE_TIMEOUT)?;
    }
    Ok(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_named_once_and_every_grid_is_nine_by_nine() {
        let ids = pod_ids();
        assert_eq!(ids.len(), 9);
        assert_eq!(ids[0], "x/a");
        assert_eq!(ids[8], "z/c");
        let cases = all_cases();
        let mut names = std::collections::BTreeSet::new();
        for c in &cases {
            assert!(names.insert(c.name), "{} twice", c.name);
            assert!(
                c.name.starts_with("TCP: ")
                    || c.name.starts_with("UDP: ")
                    || c.name.starts_with("CNP: ")
                    || c.name == cases::BASELINE.name,
                "{}",
                c.name
            );
            assert!(!c.steps.is_empty(), "{}", c.name);
            // A step that writes the same policies again changes nothing the agents
            // read: no sync would come, and the wait for it would fail.
            for w in c.steps.windows(2) {
                if let (Change::Policies(a), Change::Policies(b)) = (&w[0].change, &w[1].change) {
                    assert_ne!(a, b, "{}: a step repeats the policies", c.name);
                }
            }
            for s in c.steps {
                assert!(!s.checks.is_empty(), "{}", c.name);
                for check in s.checks {
                    let port: Served = check.port.parse().unwrap();
                    assert!(serves().contains(&port), "{}: {port}", c.name);
                    let g = Grid::parse(&ids, &check.grid)
                        .unwrap_or_else(|e| panic!("{}: {e:#}", c.name));
                    assert_eq!(g.cells.len(), 9);
                    assert!(g.cells.iter().all(|r| r.len() == 9));
                }
                if let Change::Policies(text) = s.change
                    && !text.is_empty()
                {
                    let objs = crate::manifests::objects(text)
                        .unwrap_or_else(|e| panic!("{}: {e:#}", c.name));
                    assert!(
                        objs.iter()
                            .all(|o| (o.kind == "NetworkPolicy.networking.k8s.io"
                                && NAMESPACES.contains(&o.namespace.as_str()))
                                || (o.kind == "ClusterNetworkPolicy.policy.networking.k8s.io"
                                    && o.namespace.is_empty())),
                        "{}: {objs:?}",
                        c.name
                    );
                }
            }
        }
        // The upstream file's TCP and UDP cases (its three SCTP ones left out), then
        // the ClusterNetworkPolicy ones.
        assert_eq!(cases.len(), 1 + 42 + 3 + 10);
    }

    #[test]
    fn the_baseline_allows_everything_on_every_port() {
        let ids = pod_ids();
        let b = &cases::BASELINE;
        assert_eq!(b.steps.len(), 1);
        let ports: Vec<&str> = b.steps[0].checks.iter().map(|c| c.port).collect();
        assert_eq!(ports, SERVES);
        for c in b.steps[0].checks {
            assert_eq!(Grid::parse(&ids, &c.grid).unwrap(), Grid::all(&ids, true));
        }
    }

    #[test]
    fn a_deny_ingress_case_blocks_the_column_of_its_namespace() {
        // Upstream: ExpectPeer(&Peer{}, &Peer{Namespace: nsX}, false).
        let c = cases::all()
            .find(|c| c.name == "TCP: should support a 'default-deny-ingress' policy")
            .unwrap();
        let g = Grid::parse(&pod_ids(), &c.steps[0].checks[0].grid).unwrap();
        assert_eq!(g.get("y/b", "x/c"), Some(false));
        assert_eq!(g.get("x/a", "y/a"), Some(true));
    }

    fn first_grid(name: &str) -> Grid {
        let c = all_cases().into_iter().find(|c| c.name == name).unwrap();
        Grid::parse(&pod_ids(), &c.steps[0].checks[0].grid).unwrap()
    }

    #[test]
    fn a_pod_no_allow_policy_selects_stays_isolated_by_the_deny_all() {
        // deny-all isolates every pod of x; allow-all-to-a selects only x/a.
        let g = first_grid("TCP: should enforce policy to allow ingress traffic for a target");
        for from in pod_ids() {
            assert_eq!(g.get(&from, "x/a"), Some(true), "{from}");
            assert_eq!(g.get(&from, "x/b"), Some(false), "{from}");
            assert_eq!(g.get(&from, "x/c"), Some(false), "{from}");
        }
    }

    #[test]
    fn pods_named_a_in_other_namespaces_are_not_in_the_b_c_selector() {
        let g = first_grid(
            "TCP: should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
        );
        assert_eq!(g.get("y/a", "x/a"), Some(false));
        assert_eq!(g.get("z/a", "x/a"), Some(false));
        assert_eq!(g.get("z/b", "x/a"), Some(true));
        assert_eq!(g.get("y/c", "x/a"), Some(true));
    }

    #[test]
    fn a_case_is_described_by_its_policies_and_ports() {
        let c = all_cases()
            .into_iter()
            .find(|c| c.name.starts_with("CNP: among Admin policies"))
            .unwrap();
        let d = describe(c);
        assert_eq!(
            d.matches("ClusterNetworkPolicy priority-50-example, ClusterNetworkPolicy pass-example, ClusterNetworkPolicy default: 9x9 on tcp/80, udp/81").count(),
            2,
            "{d}"
        );
        assert!(d.contains("; then "), "{d}");
        let d = describe(&cases::BASELINE);
        assert_eq!(d, "no policy: 9x9 on tcp/80, tcp/81, udp/80, udp/81");
        for c in all_cases() {
            assert!(!describe(c).contains("do not parse"), "{}", c.name);
        }
    }

    #[test]
    fn a_selection_matching_no_case_is_an_error_naming_it() {
        let e = selected(Some("no such case")).unwrap_err().to_string();
        assert!(e.contains("\"no such case\""), "{e}");
        assert_eq!(selected(Some("CNP: ")).unwrap().len(), 10);
        assert_eq!(selected(None).unwrap().len(), all_cases().len());
    }

    #[test]
    fn pod_addresses_are_put_in_the_policies() {
        let mut state: State = serde_json::from_str(
            r#"{"plan":{"prefix":"t","nodes":2,"zones":1},"ferry":"f","cni":"c","processes":[],"pods":[]}"#,
        )
        .unwrap();
        state.pods.push(crate::state::Pod {
            name: "b".into(),
            namespace: "x".into(),
            labels: pod_labels("b"),
            serves: serves(),
            node: 1,
            app: String::new(),
            netns: String::new(),
            container_id: String::new(),
            ips: vec!["10.244.1.7".into(), "fd00:244:1::7".into()],
            ready: true,
        });
        let p = policies("cidr: \"{cidr4:x/b}\", except: [\"{ip:x/b}/32\"]", &state).unwrap();
        assert_eq!(p, "cidr: \"0.0.0.0/4\", except: [\"10.244.1.7/32\"]");
        assert!(policies("{ip:y/b}", &state).is_err());
    }
}
