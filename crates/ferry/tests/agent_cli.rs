//! `ferry agent` refuses bad arguments and a bad cluster state at start with messages
//! that say what is wrong, before touching any interface.

use std::process::Command;

fn agent(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("agent")
        .args(args)
        .output()
        .expect("run ferry");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unknown_datastore_is_refused() {
    let (ok, err) = agent(&["--node", "n1", "--datastore", "etcd:x"]);
    assert!(!ok);
    assert!(
        err.contains("expected file:DIR, kubernetes or kubernetes:KUBECONFIG"),
        "{err}"
    );
}

#[test]
fn a_file_datastore_without_a_directory_says_so() {
    let (ok, err) = agent(&["--node", "n1", "--datastore", "file:"]);
    assert!(!ok);
    assert!(
        err.contains("--datastore \"file:\": the directory is missing: expected file:DIR"),
        "{err}"
    );
}

#[test]
fn a_missing_kubeconfig_is_refused() {
    let (ok, err) = agent(&[
        "--node",
        "n1",
        "--datastore",
        "kubernetes:/nonexistent/kubeconfig",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

#[test]
fn a_bad_pod_attachment_is_refused() {
    let (ok, err) = agent(&["--node", "n1", "--datastore", "file:.", "--pod", "web"]);
    assert!(!ok);
    assert!(err.contains("NAMESPACE/NAME=NETNS"), "{err}");
}

#[test]
fn bad_worker_options_are_refused() {
    for (flag, value, says) in [
        ("--workers", "0", "expected a number from 1 to 64, or auto"),
        (
            "--busy-poll",
            "1000001",
            "expected microseconds from 0 to 1000000",
        ),
        (
            "--busy-poll",
            "5ms",
            "expected microseconds from 0 to 1000000",
        ),
    ] {
        let (ok, err) = agent(&["--node", "n1", "--datastore", "file:.", flag, value]);
        assert!(!ok, "{flag} {value}");
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

#[test]
fn a_bad_cluster_at_start_names_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: { name: s, namespace: default }\nspec:\n  ports: [{ port: 0 }]\n",
    )
    .unwrap();
    let ds = format!("file:{}", dir.path().display());
    let (ok, err) = agent(&["--node", "n1", "--datastore", &ds]);
    assert!(!ok);
    assert!(
        err.contains("svc.yaml") && err.contains("spec.ports[0].port"),
        "{err}"
    );
}

#[test]
fn a_node_missing_from_the_cluster_is_an_error() {
    let ds = concat!(
        "file:",
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/cluster"
    );
    let (ok, err) = agent(&["--node", "no-such-node", "--datastore", ds]);
    assert!(!ok);
    assert!(err.contains("no Node named \"no-such-node\""), "{err}");
}

/// `ferry version` names the commit the binary was built from: in a checkout, the one
/// git says HEAD is (the build script runs again when HEAD moves).
#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("version")
        .output()
        .expect("run ferry");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("ferry {}", env!("CARGO_PKG_VERSION")),
        "{text}"
    );
    assert!(lines[2].starts_with("build "), "{text}");
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    // CI and every test run build from a git checkout.
    assert!(
        head.status.success(),
        "not a checkout: the test cannot check the commit"
    );
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let commit = lines[1].strip_prefix("commit ").unwrap_or_default();
    assert!(commit.starts_with(&head), "{text} against HEAD {head}");
}
