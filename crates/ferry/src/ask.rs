//! Asking the running agent over its API socket, for the commands that read it.

use std::path::Path;

use anyhow::{Result, anyhow, bail};
use ferry_agent::api::{call, no_agent};
use ferry_api::{Answer, Request, Response};

/// The agent's answer to `req` on `socket`. The error says that no agent answers only
/// when nothing does; a request or an answer too large, or one that cannot be read, is
/// said as such.
pub fn ask(socket: &Path, req: &Request) -> Result<Response> {
    call(socket, req).map_err(|e| {
        if no_agent(&e) {
            anyhow!(
                "no agent answers on {} (is `ferry agent` running? see --api-socket): {e}",
                socket.display()
            )
        } else {
            anyhow!("{}: {e}", socket.display())
        }
    })
}

/// The agent refused a read or stop of the caller's live trace or capture because another
/// client has started one since, which replaced it.
#[derive(Debug)]
pub struct Replaced(pub String);

impl std::fmt::Display for Replaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Replaced {}

/// The answer in `r`, or its error as one; a replaced session is a [`Replaced`].
pub fn answer(r: Response) -> Result<Answer> {
    match r {
        Response::Ok(a) => Ok(a),
        Response::Error(e) if e.code == ferry_api::ERR_REPLACED => {
            Err(Replaced(format!("{}: {}", e.msg, e.details)).into())
        }
        Response::Error(e) if e.details.is_empty() => bail!("{}", e.msg),
        Response::Error(e) => bail!("{}: {}", e.msg, e.details),
    }
}

/// A stand-in agent for the commands' tests: serves `answers` in turn (then `{}`) on a
/// socket in `dir`, and keeps the requests it was sent, one JSON line each.
#[cfg(test)]
pub fn fake_agent(
    dir: &Path,
    answers: &[&str],
) -> (
    std::path::PathBuf,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use std::io::{BufRead, BufReader, Write};
    let path = dir.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    let mut answers: Vec<String> = answers.iter().rev().map(|a| (*a).to_string()).collect();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            if BufReader::new(&conn).read_line(&mut line).is_err() {
                return;
            }
            log.lock().unwrap().push(line.trim_end().to_string());
            let a = answers.pop().unwrap_or_else(|| "{}".into());
            let _ = conn.write_all(format!("{a}\n").as_bytes());
        }
    });
    (path, seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_replaced_session_is_told_apart() {
        let e = answer(Response::error(
            ferry_api::ERR_REPLACED,
            "capture",
            "replaced by another client's capture",
        ))
        .unwrap_err();
        assert!(e.is::<Replaced>());
        assert_eq!(
            e.to_string(),
            "capture: replaced by another client's capture"
        );
        let e = answer(Response::error(ferry_api::ERR_BAD_REQUEST, "capture", "")).unwrap_err();
        assert!(!e.is::<Replaced>());
        assert_eq!(e.to_string(), "capture");
    }
}
