//! The shell completions and manual pages made from the command line's definition:
//! every command is in them, the scripts are ones the shells take, and the pages are
//! roff that man reads.

use std::process::Command;

fn ferry(args: &[&str]) -> (bool, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry");
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn completions_know_every_command_and_bash_takes_them() {
    let (ok, script, err) = ferry(&["completions", "bash"]);
    assert!(ok, "{err}");
    let text = String::from_utf8(script).unwrap();
    for cmd in [
        "agent",
        "cleanup",
        "capture",
        "status",
        "lab",
        "man",
        "completions",
    ] {
        assert!(text.contains(cmd), "{cmd} is not completed");
    }
    assert!(text.contains("--take-uplink") && text.contains("--dry-run"));
    // bash parses it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.bash");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let (ok, script, err) = ferry(&["completions", shell]);
        assert!(ok && !script.is_empty(), "{shell}: {err}");
    }
    let (ok, _, err) = ferry(&["completions", "tcsh"]);
    assert!(!ok && err.contains("invalid value 'tcsh'"), "{err}");
}

#[test]
fn man_pages_are_written_for_every_command() {
    let (ok, page, err) = ferry(&["man"]);
    assert!(ok, "{err}");
    let page = String::from_utf8(page).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH ferry 1"),
        "{page}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let (ok, _, err) = ferry(&["man", "--dir", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    for name in [
        "ferry.1",
        "ferry-agent.1",
        "ferry-cleanup.1",
        "ferry-conntrack-list.1",
    ] {
        let text =
            std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.contains(".TH"), "{name}");
    }
    let agent = std::fs::read_to_string(out.join("ferry-agent.1")).unwrap();
    assert!(
        agent.contains("take\\-uplink"),
        "the agent's page names its options"
    );
}
