//! The replay of `ferry demo`'s capture gives the same outputs and verdicts as before.
//!
//! The test runs the built `ferry demo --dir DIR` and compares what it wrote with the
//! expected files under `tests/golden/demo/`:
//!
//! - `in-<port>.txt` and `out-<port>.txt`: every packet of the input captures and of
//!   the output capture of each port, one line per packet: index, capture time in
//!   nanoseconds, length, and the frame's bytes in hex. Any extra or missing output
//!   port counts as a difference. The inputs are checked too, so that a difference
//!   tells whether the capture or its replay changed.
//! - `verdicts.jsonl`: one line per verdict, keeping only the fields that say what
//!   happened (arrival port and index, time, verdict, drop reason, conntrack state,
//!   outputs per port, and each trace event's stage and detail). Fields the log may
//!   gain later are ignored; if a kept field moves (say, the trace becomes
//!   structured), `behaviour` is the one place to map the new shape back.
//! - `conntrack.jsonl`: the connection table the replay leaves, compared whole.
//!
//! The demo is deterministic (its frames carry fixed times and the pipeline's clock is
//! the capture time), so everything is compared exactly. A failure names, for each
//! file that differs, its first differing record and the fields that differ.
//!
//! After a deliberate change of behaviour, write the expected files anew and review
//! them with `git diff`:
//!
//! ```text
//! FERRY_BLESS=1 cargo test -p ferry --test demo_golden
//! ```

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/demo")
}

fn bless() -> bool {
    std::env::var_os("FERRY_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Runs `ferry demo --dir DIR` in a fresh directory and returns it.
fn run_demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("demo")
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run ferry demo");
    assert!(
        out.status.success(),
        "ferry demo failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// One packet of a capture.
#[derive(PartialEq)]
struct Packet {
    time_ns: u64,
    data: Vec<u8>,
}

fn read_pcap(path: &Path) -> Vec<Packet> {
    let f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = pcap_file::pcap::PcapReader::new(f)
        .unwrap_or_else(|e| panic!("{}: not a pcap file: {e}", path.display()));
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap_or_else(|e| panic!("{}: corrupt packet: {e}", path.display()));
        out.push(Packet {
            time_ns: u64::try_from(p.timestamp.as_nanos()).expect("time fits"),
            data: p.data.into_owned(),
        });
    }
    out
}

/// The text form of a capture: a header line, then one line per packet.
fn packets_to_text(port: &str, packets: &[Packet]) -> String {
    let mut s = format!("# {port}: index time_ns length bytes(hex)\n");
    for (i, p) in packets.iter().enumerate() {
        writeln!(
            s,
            "{i} {} {} {}",
            p.time_ns,
            p.data.len(),
            hex::encode(&p.data)
        )
        .unwrap();
    }
    s
}

fn packets_from_text(path: &Path, text: &str) -> Vec<Packet> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let bad = || -> ! { panic!("{}: bad line {l:?}", path.display()) };
            if f.len() != 4 {
                bad();
            }
            let data = hex::decode(f[3]).unwrap_or_else(|_| bad());
            if f[2].parse::<usize>().ok() != Some(data.len()) {
                bad();
            }
            Packet {
                time_ns: f[1].parse().unwrap_or_else(|_| bad()),
                data,
            }
        })
        .collect()
}

/// The bytes around `at`, in hex, with the offset of the first one.
fn window(data: &[u8], at: usize) -> String {
    let start = at.saturating_sub(8);
    let end = (at + 8).min(data.len());
    format!(
        "@{start}: {}",
        hex::encode(data.get(start..end).unwrap_or(&[]))
    )
}

/// Where two captures first differ, in words; `None` if they are the same.
fn packets_diff(name: &str, expected: &[Packet], actual: &[Packet]) -> Option<String> {
    let mut s = String::new();
    if expected.len() != actual.len() {
        writeln!(
            s,
            "{name}: {} packets expected, {} written",
            expected.len(),
            actual.len()
        )
        .unwrap();
    }
    let n = expected.len().max(actual.len());
    let i = (0..n).find(|&i| expected.get(i) != actual.get(i))?;
    match (expected.get(i), actual.get(i)) {
        (Some(e), Some(a)) => {
            writeln!(s, "{name}: packet {i} is the first that differs").unwrap();
            writeln!(
                s,
                "  expected {} bytes at {} ns, got {} bytes at {} ns",
                e.data.len(),
                e.time_ns,
                a.data.len(),
                a.time_ns
            )
            .unwrap();
            let common = e.data.len().min(a.data.len());
            if let Some(at) = (0..common)
                .find(|&j| e.data[j] != a.data[j])
                .or((e.data.len() != a.data.len()).then_some(common))
            {
                writeln!(s, "  first differing byte at offset {at}").unwrap();
                writeln!(s, "  expected {}", window(&e.data, at)).unwrap();
                writeln!(s, "  got      {}", window(&a.data, at)).unwrap();
            }
        }
        (Some(e), None) => writeln!(
            s,
            "{name}: packet {i} missing (expected {} bytes at {} ns)",
            e.data.len(),
            e.time_ns
        )
        .unwrap(),
        (None, Some(a)) => writeln!(
            s,
            "{name}: packet {i} is extra ({} bytes at {} ns)",
            a.data.len(),
            a.time_ns
        )
        .unwrap(),
        (None, None) => unreachable!(),
    }
    Some(s)
}

/// The fields of a verdict record that carry behaviour, in a fixed shape.
fn behaviour(v: &Value) -> Value {
    let list = |key: &str, fields: &[&str]| -> Value {
        v[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                fields
                    .iter()
                    .map(|f| (f.to_string(), e[*f].clone()))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            })
            .collect::<Vec<Value>>()
            .into()
    };
    json!({
        "port": v["port"],
        "index": v["index"],
        "time_ns": v["time_ns"],
        "verdict": v["verdict"],
        "drop_reason": v["drop_reason"],
        "ct": v["ct"],
        "outputs": list("outputs", &["port", "packets"]),
        "trace": list("trace", &["stage", "detail"]),
    })
}

fn read_jsonl(path: &Path, text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{} line {}: not JSON: {e}", path.display(), i + 1))
        })
        .collect()
}

fn to_jsonl(records: &[Value]) -> String {
    records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect()
}

/// Every path under which two JSON values differ, with both sides.
fn json_diff(path: &str, e: &Value, a: &Value, out: &mut Vec<String>) {
    match (e, a) {
        (Value::Object(me), Value::Object(ma)) => {
            let mut keys: Vec<&String> = me.keys().chain(ma.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let null = Value::Null;
                let sub = format!("{path}.{k}");
                json_diff(
                    &sub,
                    me.get(k).unwrap_or(&null),
                    ma.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(ve), Value::Array(va)) => {
            for i in 0..ve.len().max(va.len()) {
                let null = Value::Null;
                json_diff(
                    &format!("{path}[{i}]"),
                    ve.get(i).unwrap_or(&null),
                    va.get(i).unwrap_or(&null),
                    out,
                );
            }
        }
        _ if e != a => out.push(format!("  {path}: expected {e}, got {a}")),
        _ => {}
    }
}

/// Where two lists of records first differ, in words; `None` if they are the same.
fn records_diff(name: &str, expected: &[Value], actual: &[Value]) -> Option<String> {
    let mut s = String::new();
    if expected.len() != actual.len() {
        writeln!(
            s,
            "{name}: {} records expected, {} written",
            expected.len(),
            actual.len()
        )
        .unwrap();
    }
    let n = expected.len().max(actual.len());
    let i = (0..n).find(|&i| expected.get(i) != actual.get(i))?;
    let null = Value::Null;
    let (e, a) = (
        expected.get(i).unwrap_or(&null),
        actual.get(i).unwrap_or(&null),
    );
    writeln!(
        s,
        "{name}: record {} (line {}) is the first that differs",
        i,
        i + 1
    )
    .unwrap();
    let mut fields = Vec::new();
    json_diff("", e, a, &mut fields);
    for f in fields {
        writeln!(s, "{f}").unwrap();
    }
    writeln!(s, "  expected {e}").unwrap();
    writeln!(s, "  got      {a}").unwrap();
    Some(s)
}

/// The captures the demo writes, as (expected file name, written capture).
fn captures(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v = Vec::new();
    for (prefix, sub, suffix) in [
        ("in", dir.to_path_buf(), "-in.pcap"),
        ("out", dir.join("out"), ".pcap"),
    ] {
        let mut found: Vec<(String, PathBuf)> = fs::read_dir(&sub)
            .unwrap_or_else(|e| panic!("{}: {e}", sub.display()))
            .map(|e| e.expect("dir entry").path())
            .filter_map(|p| {
                let name = p.file_name()?.to_str()?;
                let port = name.strip_suffix(suffix)?;
                Some((format!("{prefix}-{port}.txt"), p.clone()))
            })
            .collect();
        found.sort();
        v.extend(found);
    }
    v
}

#[test]
fn demo_replay_matches_expected_outputs_and_verdicts() {
    let demo = run_demo();
    let dir = demo.path();
    let golden = golden_dir();

    // What the demo wrote, as the expected files would hold it.
    let mut written: Vec<(String, String)> = Vec::new();
    for (name, path) in captures(dir) {
        let port = name.trim_end_matches(".txt");
        written.push((name.clone(), packets_to_text(port, &read_pcap(&path))));
    }
    let out = dir.join("out");
    for (name, project) in [
        ("verdicts.jsonl", behaviour as fn(&Value) -> Value),
        ("conntrack.jsonl", Value::clone),
    ] {
        let path = out.join(name);
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let records: Vec<Value> = read_jsonl(&path, &text).iter().map(project).collect();
        written.push((name.to_string(), to_jsonl(&records)));
    }

    if bless() {
        fs::create_dir_all(&golden).expect("create the golden dir");
        // A port that no longer has an output must not keep its old expected file.
        for e in fs::read_dir(&golden).expect("golden dir") {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "txt" || x == "jsonl") {
                fs::remove_file(&p).expect("remove an old expected file");
            }
        }
        for (name, text) in &written {
            fs::write(golden.join(name), text).expect("write an expected file");
        }
        eprintln!("wrote the expected files in {}", golden.display());
        return;
    }

    let mut failures = Vec::new();
    let mut expected_names: Vec<String> = fs::read_dir(&golden)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (FERRY_BLESS=1 writes the expected files)",
                golden.display()
            )
        })
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".txt") || n.ends_with(".jsonl"))
        .collect();
    expected_names.sort();
    for (name, text) in &written {
        let path = golden.join(name);
        let Ok(expected) = fs::read_to_string(&path) else {
            failures.push(format!("{name}: written, but no expected file"));
            continue;
        };
        let diff = if name.ends_with(".txt") {
            packets_diff(
                name,
                &packets_from_text(&path, &expected),
                &packets_from_text(Path::new(name), text),
            )
        } else {
            records_diff(
                name,
                &read_jsonl(&path, &expected),
                &read_jsonl(Path::new(name), text),
            )
        };
        failures.extend(diff);
    }
    for name in expected_names {
        if !written.iter().any(|(n, _)| *n == name) {
            failures.push(format!("{name}: expected, but the demo did not write it"));
        }
    }
    assert!(
        failures.is_empty(),
        "ferry demo's replay differs from tests/golden/demo \
         (`ferry demo --dir DIR` writes the same files; after a deliberate change, \
         FERRY_BLESS=1 cargo test -p ferry --test demo_golden writes them anew):\n\n{}",
        failures.join("\n")
    );
}
