//! `ferry lab apply FILE` and `ferry lab delete FILE`: a file of manifests copied into
//! the lab's manifest directory (as `applied-NAME.yaml`, so that applying a file of the
//! same name again replaces it), or removed from it. A file is checked first: YAML
//! documents, each a Kubernetes object (or a `kind: List` of them) with `apiVersion`,
//! `kind` and `metadata.name`, none of them an object another file of the directory
//! holds; what the agents make of the objects is theirs to say (`ferry status`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::sys;
use crate::topology::manifests;

/// An object of a manifest: kind, namespace (empty when none is given) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectId {
    /// `apiVersion`'s group (the part before `/`; empty for the core group) and `kind`.
    pub kind: String,
    /// `metadata.namespace`, or empty.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The objects of a manifest file's text, or what is wrong with it (without the file's
/// name: the caller adds it).
pub fn objects(text: &str) -> Result<Vec<ObjectId>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or_default().to_string();
        anyhow::anyhow!("not valid YAML: {}", first.trim_start_matches("error: "))
    })?;
    let mut out = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let label = format!("document {}", i + 1);
        match doc {
            Value::Null => {}
            doc => object(doc, &label, &mut out)?,
        }
    }
    if out.is_empty() {
        bail!("no Kubernetes object in it");
    }
    Ok(out)
}

fn object(doc: &Value, label: &str, out: &mut Vec<ObjectId>) -> Result<()> {
    let Some(map) = doc.as_object() else {
        bail!("{label}: not a Kubernetes object (a mapping with apiVersion and kind)");
    };
    let text = |k: &str| map.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
        bail!("{label}: no apiVersion or kind");
    };
    if kind == "List" {
        let items = map
            .get("items")
            .and_then(Value::as_array)
            .with_context(|| format!("{label}: a List without items"))?;
        for (j, item) in items.iter().enumerate() {
            object(item, &format!("{label}, item {}", j + 1), out)?;
        }
        return Ok(());
    }
    let meta = |k: &str| {
        doc.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let name = meta("name");
    if name.is_empty() {
        bail!("{label} ({api_version} {kind}): no metadata.name");
    }
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    out.push(ObjectId {
        kind: if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        },
        namespace: meta("namespace"),
        name,
    });
    Ok(())
}

/// Where `file` goes in the manifest directory of the lab in `dir`.
pub fn applied_path(dir: &Path, file: &Path) -> Result<PathBuf> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a file name", file.display()))?;
    let stem = name
        .strip_suffix(".yaml")
        .or_else(|| name.strip_suffix(".yml"))
        .unwrap_or(name);
    Ok(manifests(dir).join(format!("applied-{stem}.yaml")))
}

/// The same object in two places: the agents would refuse the whole state.
fn same(a: &ObjectId, b: &ObjectId) -> bool {
    let ns = |o: &ObjectId| {
        if o.namespace.is_empty() {
            "default".to_string()
        } else {
            o.namespace.clone()
        }
    };
    a.kind == b.kind && a.name == b.name && ns(a) == ns(b)
}

/// `ferry lab apply FILE`: checks it and copies it into the manifest directory; returns
/// the objects it holds.
pub fn apply(dir: &Path, file: &Path) -> Result<Vec<ObjectId>> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let objs = objects(&text).with_context(|| format!("{}", file.display()))?;
    let target = applied_path(dir, file)?;
    anyhow::ensure!(
        manifests(dir).is_dir(),
        "no lab in {} (ferry lab up makes one)",
        dir.display()
    );
    let mut held: BTreeMap<String, Vec<ObjectId>> = BTreeMap::new();
    for entry in fs::read_dir(manifests(dir))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let manifest = name.ends_with(".yaml") || name.ends_with(".yml");
        if path == target || name.starts_with('.') || !manifest {
            continue;
        }
        let other = fs::read_to_string(&path).unwrap_or_default();
        held.insert(name.to_string(), objects(&other).unwrap_or_default());
    }
    for o in &objs {
        for (name, others) in &held {
            if others.iter().any(|x| same(x, o)) {
                bail!(
                    "{}: {o} is in the lab's {name} already (the agents would refuse both)",
                    file.display()
                );
            }
        }
    }
    sys::write_atomic(&target, &text)?;
    Ok(objs)
}

/// `ferry lab delete FILE`: removes what `apply` copied of it.
pub fn delete(dir: &Path, file: &Path) -> Result<()> {
    let target = applied_path(dir, file)?;
    if !target.exists() {
        bail!(
            "{} was not applied to the lab in {} (no {})",
            file.display(),
            dir.display(),
            target.display()
        );
    }
    fs::remove_file(&target).with_context(|| format!("removing {}", target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_named_by_kind_group_namespace_and_name() {
        let text = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: deny, namespace: x }\nspec: {}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- { apiVersion: v1, kind: Namespace, metadata: { name: x } }\n";
        let o = objects(text).unwrap();
        assert_eq!(o.len(), 2);
        assert_eq!(o[0].to_string(), "NetworkPolicy.networking.k8s.io x/deny");
        assert_eq!(o[1].to_string(), "Namespace x");
    }

    #[test]
    fn what_is_not_manifests_is_refused_with_the_problem() {
        let e = |t: &str| format!("{:#}", objects(t).unwrap_err());
        assert!(e("a: [b").starts_with("not valid YAML"), "{}", e("a: [b"));
        assert!(e("- 1\n- 2\n").contains("document 1: not a Kubernetes object"));
        assert!(e("kind: Pod\nmetadata: { name: a }\n").contains("no apiVersion or kind"));
        assert!(e("apiVersion: v1\nkind: Pod\n").contains("(v1 Pod): no metadata.name"));
        assert!(e("apiVersion: v1\nkind: List\n").contains("a List without items"));
        assert!(e("").contains("no Kubernetes object"));
        assert!(e("---\n# nothing\n").contains("no Kubernetes object"));
    }

    #[test]
    fn an_applied_file_is_named_after_the_file() {
        let d = Path::new("/run/lab");
        let p = |f: &str| applied_path(d, Path::new(f)).unwrap();
        assert_eq!(p("/tmp/deny.yaml"), d.join("cluster/applied-deny.yaml"));
        assert_eq!(p("deny.yml"), d.join("cluster/applied-deny.yaml"));
        assert_eq!(p("policy"), d.join("cluster/applied-policy.yaml"));
    }

    #[test]
    fn apply_copies_and_refuses_an_object_held_elsewhere() {
        let tmp = std::env::temp_dir().join(format!("ferry-lab-apply-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(manifests(&tmp)).unwrap();
        fs::write(
            manifests(&tmp).join("pods.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: { name: a }\n",
        )
        .unwrap();
        let f = tmp.join("np.yaml");
        fs::write(
            &f,
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: p, namespace: x }\n",
        )
        .unwrap();
        apply(&tmp, &f).unwrap();
        assert!(manifests(&tmp).join("applied-np.yaml").exists());
        // Applied again: replaced, not a conflict with itself.
        apply(&tmp, &f).unwrap();
        let g = tmp.join("pod.yaml");
        fs::write(
            &g,
            "apiVersion: v1\nkind: Pod\nmetadata: { name: a, namespace: default }\n",
        )
        .unwrap();
        let e = format!("{:#}", apply(&tmp, &g).unwrap_err());
        assert!(
            e.contains("Pod default/a is in the lab's pods.yaml already"),
            "{e}"
        );
        let bad = tmp.join("bad.yaml");
        fs::write(&bad, "not: [yaml").unwrap();
        let e = format!("{:#}", apply(&tmp, &bad).unwrap_err());
        assert!(
            e.contains("bad.yaml") && e.contains("not valid YAML"),
            "{e}"
        );
        delete(&tmp, &f).unwrap();
        assert!(!manifests(&tmp).join("applied-np.yaml").exists());
        assert!(format!("{:#}", delete(&tmp, &f).unwrap_err()).contains("was not applied"));
        fs::remove_dir_all(&tmp).unwrap();
    }
}
