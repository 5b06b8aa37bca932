//! `ferry trace`: what the running node does with a packet, stage by stage.
//!
//! A described packet (`--in pod default/client tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn`)
//! or the frames of a pcap are run through the node's live tables and a copy of its live
//! connection state, without being sent and without changing anything; the reply the
//! other side would send is traced after it. `--live` records instead what the node does
//! with the next real packets that match a filter.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_api::{Answer, Request};
use ferry_datapath::{TracePass, TraceReport};
use ferry_linux::worker::TracedPacket;

use crate::pcap;

/// Arguments of `ferry trace`.
#[derive(clap::Args, Clone, Debug)]
#[command(
    after_help = "Examples (quote a packet written with ->: a shell takes > as a redirection; `to` needs no quotes):\n  ferry trace --in pod default/client 'tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn'\n  ferry trace --in uplink udp 192.0.2.10:5000 to 192.168.1.10:30053\n  ferry trace --in uplink --pcap frames.pcap\n  ferry trace --live --match 'tcp port 80' --count 5"
)]
pub struct Args {
    /// Where the packet enters: a port name (`ferry status` lists them), or `pod` followed
    /// by the pod as NAMESPACE/NAME.
    #[arg(long = "in", value_name = "PORT", required_unless_present = "live")]
    pub in_port: Option<String>,
    /// Trace the Ethernet frames of this pcap or pcapng file, in order, instead of a
    /// described packet.
    #[arg(long, value_name = "FILE", conflicts_with = "live")]
    pub pcap: Option<PathBuf>,
    /// Do not trace the reply after the packet.
    #[arg(long)]
    pub no_reply: bool,
    /// Record the next real packets that match --match as they go through the node.
    #[arg(long, requires = "filter")]
    pub live: bool,
    /// With --live: which packets (tcpdump-like: `tcp port 80 and host 10.0.1.5`).
    #[arg(long = "match", value_name = "FILTER")]
    pub filter: Option<String>,
    /// With --live: how many packets to record (at most 10000).
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// With --live: give up after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// The packet: PROTO SRC -> DST (or SRC to DST) [flags] [len N] [ttl N] [df], e.g.
    /// `tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn`, `udp [fd00::5]:53 to [fd00::9]:53`,
    /// `icmp 10.0.1.5 to 10.0.2.7`.
    #[arg(
        value_name = "PACKET",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub packet: Vec<String>,
}

/// Asks the agent, answering `what` when it refuses.
fn ask(args: &Args, req: &Request) -> Result<Answer> {
    crate::ask::answer(crate::ask::ask(&args.api_socket, req)?)
}

/// Runs `ferry trace`.
pub fn run(args: &Args) -> Result<()> {
    let args = &flags_after_packet(args)?;
    if args.live {
        return live(args);
    }
    let Some(mut in_port) = args.in_port.clone() else {
        bail!("--in is needed: the port (or `pod NAMESPACE/NAME`) where the packet enters");
    };
    let mut words = args.packet.clone();
    if in_port == "pod" {
        if words.is_empty() {
            bail!("--in pod needs the pod as NAMESPACE/NAME after it");
        }
        in_port = format!("pod {}", words.remove(0));
    }
    let (packet, frames) = match &args.pcap {
        Some(path) => {
            if !words.is_empty() {
                bail!("give either --pcap or a described packet, not both");
            }
            let frames = pcap::read_all(path)?;
            if frames.is_empty() {
                bail!("{}: no packets", path.display());
            }
            (
                None,
                Some(frames.iter().map(|f| hex::encode(&f.data)).collect()),
            )
        }
        None if words.is_empty() => bail!(
            "describe the packet, e.g. `tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn`, or give --pcap"
        ),
        None => (Some(words.join(" ")), None),
    };
    let a = ask(
        args,
        &Request::Trace {
            in_port,
            packet,
            frames,
            reply: !args.no_reply,
        },
    )?;
    let report = a.trace.context("the agent answered without a trace")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let report: TraceReport =
        serde_json::from_value(report).context("the agent's trace is not a trace report")?;
    print!("{}", render_report(&report));
    Ok(())
}

fn render_stages<'a>(s: &mut String, stages: impl Iterator<Item = (&'a str, &'a str)>) {
    for (stage, detail) in stages {
        let _ = writeln!(s, "  {stage:<8} {detail}");
    }
}

fn render_outcome<'a>(
    s: &mut String,
    verdict: &str,
    out: impl Iterator<Item = (&'a str, &'a str)>,
) {
    let mut any = false;
    for (port, summary) in out {
        any = true;
        let _ = writeln!(s, "  => {verdict}: out {port}: {summary}");
    }
    if !any {
        let _ = writeln!(s, "  => {verdict}");
    }
}

fn render_pass(s: &mut String, p: &TracePass) {
    let _ = writeln!(s, "{}: {} in {}", p.label, p.summary, p.in_port);
    render_stages(
        s,
        p.stages
            .iter()
            .map(|t| (t.stage.as_str(), t.detail.as_str())),
    );
    render_outcome(
        s,
        &p.verdict,
        p.out.iter().map(|o| (o.port.as_str(), o.summary.as_str())),
    );
}

/// A trace report as text: each pass with its stages and outcome, then the reverse path.
pub fn render_report(r: &TraceReport) -> String {
    let mut s = String::new();
    for (i, p) in r.passes.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        render_pass(&mut s, p);
    }
    if let Some(rev) = &r.reverse {
        let _ = writeln!(s, "\nreverse path: {rev}");
    }
    s
}

fn render_traced(p: &TracedPacket) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} in {}", p.summary, p.in_port);
    render_stages(
        &mut s,
        p.stages.iter().map(|(a, b)| (a.as_str(), b.as_str())),
    );
    render_outcome(
        &mut s,
        &p.verdict,
        p.out.iter().map(|(a, b)| (a.as_str(), b.as_str())),
    );
    s
}

/// `--live`: starts a live trace, prints what it records as it comes, stops it.
fn live(args: &Args) -> Result<()> {
    if args.in_port.is_some() || args.pcap.is_some() || !args.packet.is_empty() {
        bail!("--live traces real packets: it takes --match and --count, not a packet");
    }
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    if args.count > ferry_linux::worker::MAX_TRACE_COUNT {
        bail!(
            "--count {}: a live trace records at most {} packets",
            args.count,
            ferry_linux::worker::MAX_TRACE_COUNT
        );
    }
    let filter = args.filter.clone().unwrap_or_default();
    let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
    // An agent older than session ids answers none: then reads and stops take whichever
    // live trace runs.
    let session = ask(
        args,
        &Request::TraceStart {
            filter,
            count: args.count,
        },
    )?
    .session;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut seen = 0;
    let mut print = |records: Vec<serde_json::Value>| -> Result<()> {
        for r in records {
            seen += 1;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let p: TracedPacket = serde_json::from_value(r)
                    .context("the agent's record is not a traced packet")?;
                if seen > 1 {
                    println!();
                }
                print!("{}", render_traced(&p));
            }
        }
        Ok(())
    };
    let outcome = loop {
        if stop.load(Ordering::Relaxed) {
            break "interrupted";
        }
        // Replaced by another client's live trace: the error says so; nothing to stop.
        let a = ask(args, &Request::TraceRead { session })?;
        print(a.traced.unwrap_or_default())?;
        if a.remaining == Some(0) {
            break "";
        }
        if Instant::now() >= deadline {
            break "timed out";
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let a = ask(args, &Request::TraceStop { session })?;
    print(a.traced.unwrap_or_default())?;
    if !outcome.is_empty() {
        eprintln!("{outcome}: {seen} of {} packets recorded", args.count);
    }
    Ok(())
}

/// `args` with the flags written after the packet applied. Every word from the packet's
/// first on is taken as part of the packet (a packet may hold `->`, which looks like an
/// option), so `--json`, `--no-reply` and `--api-socket PATH` written after it, as the
/// synopsis allows, are picked out of it here; another word starting with `--` there is
/// an error rather than a word of the packet.
fn flags_after_packet(args: &Args) -> Result<Args> {
    let mut a = args.clone();
    let mut words = Vec::with_capacity(args.packet.len());
    let mut it = args.packet.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--json" => a.json = true,
            "--no-reply" => a.no_reply = true,
            "--api-socket" => {
                let Some(path) = it.next() else {
                    bail!("--api-socket needs a PATH");
                };
                a.api_socket = path.into();
            }
            w if w.starts_with("--api-socket=") => {
                a.api_socket = w["--api-socket=".len()..].into();
            }
            w if w.starts_with("--") => bail!(
                "{w}: after the packet only --json, --no-reply and --api-socket may come; put other options before it"
            ),
            _ => words.push(w.clone()),
        }
    }
    a.packet = words;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        trace: Args,
    }

    fn parse(line: &str) -> Result<Args> {
        let cli = Cli::try_parse_from(std::iter::once("trace").chain(line.split(' ')))?;
        flags_after_packet(&cli.trace)
    }

    #[test]
    fn a_replaced_live_trace_fails_and_stops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, seen) = crate::ask::fake_agent(
            dir.path(),
            &[
                r#"{"session":5}"#,
                r#"{"traced":[],"remaining":1}"#,
                r#"{"code":106,"msg":"live trace","details":"replaced by another client's live trace"}"#,
            ],
        );
        let line = format!("--live --match udp --api-socket {}", socket.display());
        let e = run(&parse(&line).unwrap()).unwrap_err();
        assert!(e.is::<crate::ask::Replaced>(), "{e}");
        assert_eq!(
            *seen.lock().unwrap(),
            [
                r#"{"op":"trace_start","filter":"udp","count":1}"#,
                r#"{"op":"trace_read","session":5}"#,
                r#"{"op":"trace_read","session":5}"#,
            ],
            "no stop: it would be the other client's live trace"
        );
    }

    #[test]
    fn flags_after_the_packet_are_flags_not_packet_words() {
        let a = parse("--in uplink tcp 1.2.3.4:1 to 5.6.7.8:80 syn --json --api-socket /tmp/x.sock --no-reply")
            .unwrap();
        assert_eq!(a.packet.join(" "), "tcp 1.2.3.4:1 to 5.6.7.8:80 syn");
        assert!(a.json && a.no_reply);
        assert_eq!(a.api_socket, PathBuf::from("/tmp/x.sock"));
        let a = parse("--in uplink tcp 1.2.3.4:1 -> 5.6.7.8:80 --api-socket=/tmp/y.sock").unwrap();
        assert_eq!(a.packet.join(" "), "tcp 1.2.3.4:1 -> 5.6.7.8:80");
        assert_eq!(a.api_socket, PathBuf::from("/tmp/y.sock"));
        let e = parse("--in uplink tcp 1.2.3.4:1 to 5.6.7.8:80 --count 3").unwrap_err();
        assert!(e.to_string().contains("--count: after the packet"), "{e}");
        assert!(parse("--in uplink udp 1.2.3.4:1 to 5.6.7.8:53 --api-socket").is_err());
    }
}
