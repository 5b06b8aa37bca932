//! Running commands: in the root namespace or in one of the lab's, with time limits,
//! and starting the lab's long-running processes detached from the caller.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_linux::cmd::Cmd;

/// Runs a command; an error carries its output.
pub fn run(args: &[&str]) -> Result<String> {
    let (program, args) = args.split_first().context("no command to run")?;
    Ok(Cmd::new(*program).args(args).run()?)
}

/// `cmd` to run in namespace `ns` (full name) under `timeout SECS`.
fn timed_in(ns: &str, secs: u32, cmd: &[&str]) -> Cmd {
    Cmd::new("timeout")
        .arg(secs.to_string())
        .args(cmd)
        .netns(ns)
}

/// Runs `cmd` in namespace `ns` (full name) under `timeout SECS`, whatever its exit.
pub fn exec_in(ns: &str, secs: u32, cmd: &[&str]) -> Result<Output> {
    Ok(timed_in(ns, secs, cmd).output()?)
}

/// Like [`exec_in`], an error unless it succeeds; returns standard output.
pub fn run_in(ns: &str, secs: u32, cmd: &[&str]) -> Result<String> {
    Ok(timed_in(ns, secs, cmd).run()?)
}

/// Runs `ip -n NS args...`.
pub fn ip(ns: &str, args: &[&str]) -> Result<String> {
    Ok(Cmd::new("ip").args(["-n", ns]).args(args).run()?)
}

/// Starts `cmd` in namespace `ns`, in a process group of its own (a terminal's ^C for
/// `ferry lab up` must not reach it), output to `log`. Returns its pid: `ip netns exec`
/// execs the command, so the pid is the command's.
pub fn start_in(ns: &str, log: &Path, cmd: &[&str]) -> Result<u32> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    start_logged(ns, out, cmd)
}

/// Like [`start_in`], its output appended to `log` after what is there.
pub fn start_in_appending(ns: &str, log: &Path, cmd: &[&str]) -> Result<u32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    start_logged(ns, out, cmd)
}

fn start_logged(ns: &str, out: File, cmd: &[&str]) -> Result<u32> {
    let err = out.try_clone()?;
    let (program, args) = cmd.split_first().context("no command to start")?;
    let child = Cmd::new(*program)
        .args(args)
        .netns(ns)
        .command()
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {cmd:?} in {ns}"))?;
    Ok(child.id())
}

/// Whether process `pid` exists (and is not a zombie of ours).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Whether process `pid` has exited with all its threads, so that what it held (its
/// descriptors: an agent's TAPs) is let go. A killed process's first thread shows as a
/// zombie while its other threads are still exiting, with the descriptors they share.
pub fn exited(pid: u32) -> bool {
    if !alive(pid) {
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
        return threads <= 1;
    }
    false
}

/// Sends `signal` (`TERM`, `KILL`) to `pid`, ignoring a process already gone.
pub fn signal(pid: u32, signal: &str) {
    let _ = Cmd::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .output();
}

/// Stops processes: TERM, up to 3 s to exit, then KILL.
pub fn stop(pids: &[u32]) {
    for &p in pids {
        signal(p, "TERM");
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        sleep(Duration::from_millis(50));
    }
    for &p in pids {
        if alive(p) {
            signal(p, "KILL");
        }
    }
}

/// Waits up to `secs` for `f`; the error names `what` did not happen.
pub fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {secs} s");
        }
        sleep(Duration::from_millis(50));
    }
}

/// Writes `text` to `path` through a dot-file renamed into place: the agents watch the
/// manifest directory and must never read a file half-written (they skip dot-files).
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The lab's namespaces still present: those named `PREFIX-...`.
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let list = run(&["ip", "netns", "list"]).unwrap_or_default();
    let start = format!("{prefix}-");
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&start))
        .map(str::to_string)
        .collect()
}

/// Processes in namespace `ns`.
pub fn pids_in(ns: &str) -> Vec<u32> {
    run(&["ip", "netns", "pids", ns])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}
