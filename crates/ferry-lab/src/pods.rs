//! `ferry lab pod add`, `ferry lab pod del` and `ferry lab ns add` on a running lab: pods
//! in any namespace with labels and served ports, namespaces with labels, their
//! manifests written for the agents.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail, ensure};

use crate::cluster::{NAME_LABEL, namespace_labels};
use crate::state::{DEFAULT_NAMESPACE, State};
use crate::topology::{self, NewPod};

/// Checks a namespace's or pod's name: a DNS label (lowercase letters, digits and `-`,
/// 1 to 63, neither starting nor ending with `-`).
pub fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    ensure!(
        ok,
        "{what} {name:?}: 1 to 63 lowercase letters, digits or '-', not at either end"
    );
    Ok(())
}

/// Reads `k=v` labels (a key may have a `prefix/`).
pub fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for l in labels {
        let Some((k, v)) = l.split_once('=') else {
            bail!("label {l:?}: KEY=VALUE");
        };
        let valid = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        };
        ensure!(
            !k.is_empty() && valid(k) && valid(v) && v.len() <= 63,
            "label {l:?}: letters, digits, '-', '_', '.' (and '/' in the key)"
        );
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// `ferry lab ns add NAME --label k=v...`: namespace `name` with `labels` (replacing its
/// labels when it is there; `kubernetes.io/metadata.name` is always its name).
pub fn ns_add(dir: &Path, name: &str, labels: BTreeMap<String, String>) -> Result<()> {
    check_name("namespace", name)?;
    ensure!(
        labels.get(NAME_LABEL).is_none_or(|v| v == name),
        "{NAME_LABEL} is the namespace's name, {name}"
    );
    let mut state = State::load(dir)?;
    state
        .namespaces
        .insert(name.to_string(), namespace_labels(name, &labels));
    state.save(dir)?;
    topology::write_pods(dir, &state)
}

/// `ferry lab pod add`: pod `spec` made through the CNI plugin, its servers answering,
/// its manifest (and its namespace's, when the namespace is new) written.
pub fn pod_add(dir: &Path, spec: &NewPod) -> Result<()> {
    check_name("namespace", &spec.namespace)?;
    check_name("pod", &spec.name)?;
    let mut state = State::load(dir)?;
    if spec.namespace != DEFAULT_NAMESPACE && !state.namespaces.contains_key(&spec.namespace) {
        state.namespaces.insert(
            spec.namespace.clone(),
            namespace_labels(&spec.namespace, &BTreeMap::new()),
        );
    }
    let app = spec.labels.get("app").cloned().unwrap_or_default();
    let made = topology::make_pod(dir, &mut state, spec, &app);
    // Written whatever happened: a pod half made stays in the state for `pod del` and
    // `down`, without addresses it is in no manifest.
    topology::write_pods(dir, &state)?;
    made
}

/// Gives pod `pod` (`NS/NAME`) the labels `labels` (replacing its labels) and rewrites
/// its manifest.
pub fn set_pod_labels(dir: &Path, pod: &str, labels: BTreeMap<String, String>) -> Result<()> {
    let mut state = State::load(dir)?;
    let id = state.pod(pod)?.container_id.clone();
    if let Some(p) = state.pods.iter_mut().find(|p| p.container_id == id) {
        p.labels = labels;
    }
    state.save(dir)?;
    topology::write_pods(dir, &state)
}

/// `ferry lab pod del NS/NAME`: CNI DEL, its servers stopped, its namespace deleted, its
/// manifest gone.
pub fn pod_del(dir: &Path, pod: &str) -> Result<()> {
    let mut state = State::load(dir)?;
    topology::remove_pod(dir, &mut state, pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert!(check_name("pod", "a").is_ok());
        assert!(check_name("pod", "web-2").is_ok());
        for bad in ["", "A", "-a", "a-", "a_b", "a/b", &"a".repeat(64)] {
            assert!(check_name("pod", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn labels_are_key_value_pairs() {
        let l = parse_labels(&["pod=a".into(), "example.com/tier=web".into()]).unwrap();
        assert_eq!(l["pod"], "a");
        assert_eq!(l["example.com/tier"], "web");
        assert!(parse_labels(&["pod".into()]).is_err());
        assert!(parse_labels(&["=a".into()]).is_err());
        assert!(parse_labels(&["a=b c".into()]).is_err());
    }
}
