//! `ferry capture`: the frames of one port as ferry sees them, into a pcapng file.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_api::{Answer, CapturedFrame, Request};

use crate::pcap::{NgWriter, Way};

/// Arguments of `ferry capture`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The file is pcapng: one interface per port, each frame marked inbound or outbound with a comment saying whether it is as received or as ferry sent it, and why ferry dropped a received frame it dropped (tshark: -T fields -e frame.comment -e frame.interface_name)."
)]
pub struct Args {
    /// The port: a port name (`ferry status` lists them), or `pod NAMESPACE/NAME`.
    #[arg(long, value_name = "PORT")]
    pub port: String,
    /// Which frames (tcpdump-like: `tcp port 80 and host 10.0.1.5`); all by default.
    #[arg(long = "match", value_name = "FILTER", default_value = "")]
    pub filter: String,
    /// The pcapng file to write; `-`: standard output, flushed after each read, to pipe
    /// into Wireshark (`ferry capture --port uplink -w - | wireshark -k -i -`).
    #[arg(short = 'w', value_name = "FILE|-")]
    pub write: PathBuf,
    /// Stop after this many frames.
    #[arg(short = 'c', long, value_name = "N")]
    pub count: Option<usize>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
}

fn ask(args: &Args, req: &Request) -> Result<Answer> {
    crate::ask::answer(crate::ask::ask(&args.api_socket, req)?)
}

/// Writes frames until `limit` are written; returns how many were.
fn write(
    w: &mut NgWriter,
    frames: Vec<CapturedFrame>,
    written: &mut usize,
    limit: usize,
) -> Result<()> {
    for f in frames {
        if *written >= limit {
            break;
        }
        let data = hex::decode(&f.data).context("the agent sent a frame that is not hex")?;
        let way = if f.dir == "in" { Way::In } else { Way::Out };
        w.write(f.time_unix_ns, &f.port, way, &f.note, &data)?;
        *written += 1;
    }
    Ok(())
}

/// True when `e` is a write to a pipe whose reader is gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<pcap_file::PcapError>().is_some_and(|p| {
                matches!(p, pcap_file::PcapError::IoError(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
            })
    })
}

/// Runs `ferry capture`.
pub fn run(args: &Args) -> Result<()> {
    if args.count == Some(0) {
        bail!("--count must be at least 1");
    }
    if let Some(d) = args.duration
        && !(d.is_finite() && d > 0.0)
    {
        bail!("--duration must be a positive number of seconds");
    }
    let mut w = NgWriter::create(&args.write)?;
    let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
    // An agent older than session ids answers none: then reads and stops take whichever
    // capture runs.
    let session = ask(
        args,
        &Request::CaptureStart {
            port: args.port.clone(),
            filter: args.filter.clone(),
        },
    )?
    .session;
    eprintln!(
        "capturing on {}{} to {}; stop with Ctrl-C",
        args.port,
        if args.filter.is_empty() {
            String::new()
        } else {
            format!(" ({})", args.filter)
        },
        args.write.display()
    );
    let deadline = args
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let limit = args.count.unwrap_or(usize::MAX);
    let (mut written, mut lost) = (0usize, 0u64);
    let r = (|| -> Result<()> {
        while !stop.load(Ordering::Relaxed)
            && written < limit
            && deadline.is_none_or(|d| Instant::now() < d)
        {
            std::thread::sleep(Duration::from_millis(100));
            let a = ask(args, &Request::CaptureRead { session })?;
            lost += a.lost.unwrap_or(0);
            write(&mut w, a.captured.unwrap_or_default(), &mut written, limit)?;
            w.flush()?;
        }
        Ok(())
    })();
    // The reader of the pipe went away (Wireshark closed): the capture ends as if
    // stopped.
    if let Err(e) = &r
        && broken_pipe(e)
    {
        let _ = ask(args, &Request::CaptureStop { session });
        eprintln!("{written} frames written; the reader of standard output closed it");
        return Ok(());
    }
    if let Err(e) = r {
        // Replaced by another client's capture: what was written is this capture's own,
        // so the file is kept, and there is nothing to stop.
        if e.is::<crate::ask::Replaced>() {
            w.finish()?;
            eprintln!("{written} frames written to {}", args.write.display());
        } else {
            let _ = ask(args, &Request::CaptureStop { session });
        }
        return Err(e);
    }
    let a = ask(args, &Request::CaptureStop { session })?;
    lost += a.lost.unwrap_or(0);
    let last = write(&mut w, a.captured.unwrap_or_default(), &mut written, limit)
        .and_then(|()| w.finish());
    match last {
        Err(e) if broken_pipe(&e) => {
            eprintln!("{written} frames written; the reader of standard output closed it");
            return Ok(());
        }
        r => r?,
    }
    eprintln!(
        "{written} frames written to {}{}",
        args.write.display(),
        if lost > 0 {
            format!(" ({lost} lost: the agent's buffer was full between two reads)")
        } else {
            String::new()
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_replaced_capture_keeps_its_file_and_stops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, seen) = crate::ask::fake_agent(
            dir.path(),
            &[
                r#"{"session":5}"#,
                r#"{"code":106,"msg":"capture","details":"replaced by another client's capture"}"#,
            ],
        );
        let args = Args {
            port: "uplink".into(),
            filter: String::new(),
            write: dir.path().join("c.pcapng"),
            count: None,
            duration: Some(10.0),
            api_socket: socket,
        };
        let e = run(&args).unwrap_err();
        assert!(e.is::<crate::ask::Replaced>(), "{e}");
        assert!(e.to_string().contains("replaced by another client"), "{e}");
        assert_eq!(
            *seen.lock().unwrap(),
            [
                r#"{"op":"capture_start","port":"uplink","filter":""}"#,
                r#"{"op":"capture_read","session":5}"#,
            ],
            "no stop: it would be the other client's capture"
        );
        assert!(std::fs::metadata(&args.write).unwrap().len() > 0);
    }
}
