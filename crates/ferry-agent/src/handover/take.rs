//! The new agent's side of a handover (the taker): see the module docs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Instant;

use ferry_api::{Request, Response};
use ferry_linux::{fdpass, handover};

use super::{GIVER_TIMEOUT, GiverSays, Offer, TakerSays, from_json, to_json};
use crate::accept;
use crate::cluster::ObjectKey;
use crate::run::{Agent, Applied, Inherited, Starting};

/// A handover under way, from the taker's side: the giver's offer is in, its ports and
/// listeners are this process's too, and the giver forwards until [`Taking::finish`].
pub struct Taking {
    conn: UnixStream,
    offer: Offer,
    api: Option<UnixListener>,
}

/// Asks the agent answering at `socket` to hand the node over. None when no agent
/// answers there (start as usual); an error when one does but does not hand over (it
/// goes on forwarding): then this agent must not start.
pub fn ask(socket: &Path) -> Result<Option<(Taking, Inherited)>, String> {
    let mut conn = match UnixStream::connect(socket) {
        Ok(c) => c,
        Err(e) if crate::api::no_agent(&e) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", socket.display())),
    };
    let talk = |e: std::io::Error| format!("asking the running agent to hand over: {e}");
    conn.set_read_timeout(Some(GIVER_TIMEOUT)).map_err(talk)?;
    let mut line = serde_json::to_string(&Request::Handover {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        precopy: true,
    })
    .map_err(|e| e.to_string())?;
    line.push('\n');
    conn.write_all(line.as_bytes()).map_err(talk)?;
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).map_err(talk)?;
    if len[0] == b'{' {
        // An answer line: the agent does not hand over (or not now).
        let mut rest = String::new();
        BufReader::new(&conn).read_line(&mut rest).map_err(talk)?;
        let text = format!("{}{rest}", String::from_utf8_lossy(&len));
        let why = match serde_json::from_str::<Response>(text.trim_end()) {
            Ok(Response::Error(e)) => format!("{} ({})", e.msg, e.details),
            _ => text.trim_end().to_string(),
        };
        return Err(format!(
            "the agent running at {} does not hand over: {why}",
            socket.display()
        ));
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > fdpass::MAX_MESSAGE {
        return Err(format!("the running agent's offer announces {n} bytes"));
    }
    let mut b = vec![0; n];
    conn.read_exact(&mut b).map_err(talk)?;
    let GiverSays::Offer(offer) = from_json(&b, "the running agent's offer")? else {
        return Err("the running agent did not begin with its offer".into());
    };
    let fds = fdpass::recv_fds(&conn, offer.descriptors()).map_err(talk)?;
    let (inherited, api) = match inherit(&offer, fds) {
        Ok(x) => x,
        Err(e) => {
            let _ = say(&conn, &TakerSays::Abort { reason: e.clone() });
            return Err(e);
        }
    };
    tracing::info!(
        giver = offer.pid,
        version = %offer.version,
        ports = offer.ports.len(),
        listeners = offer.listeners.len(),
        precopy = offer.precopy,
        "the running agent hands over; it forwards until this one is ready"
    );
    Ok(Some((Taking { conn, offer, api }, inherited)))
}

/// The ports and listeners of `offer`, made from `fds` in its order.
fn inherit(offer: &Offer, fds: Vec<OwnedFd>) -> Result<(Inherited, Option<UnixListener>), String> {
    let mut fds = fds.into_iter();
    let mut inherited = Inherited::default();
    for p in &offer.ports {
        let queues: Vec<(handover::Handed, OwnedFd)> =
            p.queues.iter().cloned().zip(fds.by_ref()).collect();
        let port =
            handover::adopt(queues).map_err(|e| format!("port {} handed over: {e}", p.name))?;
        match p.pod.as_deref().and_then(|k| k.split_once('/')) {
            Some((ns, name)) => {
                inherited.pods.insert(ObjectKey::new(ns, name), port);
            }
            None => {
                inherited.ports.insert(p.name.clone(), port);
            }
        }
    }
    let listeners: Vec<(std::net::SocketAddr, TcpListener)> = offer
        .listeners
        .iter()
        .zip(fds.by_ref())
        .map(|(a, fd)| (*a, TcpListener::from(fd)))
        .collect();
    accept::inherit(listeners);
    let api = offer
        .api
        .then(|| fds.next().map(UnixListener::from))
        .flatten();
    Ok((inherited, api))
}

fn say(conn: &UnixStream, what: &TakerSays) -> Result<(), String> {
    fdpass::send(conn, &to_json(what)).map_err(|e| format!("answering the running agent: {e}"))
}

impl Taking {
    /// The API socket's listener the giver handed over, to serve on.
    pub fn api_listener(&mut self) -> Option<UnixListener> {
        self.api.take()
    }

    /// The giver's process id.
    pub fn giver(&self) -> u32 {
        self.offer.pid
    }

    /// Gives up before the state (the giver forwards on).
    pub fn abort(self, reason: &str) {
        let _ = say(
            &self.conn,
            &TakerSays::Abort {
                reason: reason.to_string(),
            },
        );
    }

    /// Steps 3 to 7: says this agent is ready, loads the giver's state into `starting`'s
    /// pipeline and, told to go, starts forwarding. An error leaves the giver
    /// forwarding (this agent must then stop without forwarding).
    pub fn finish(self, mut starting: Starting) -> Result<(Agent, Applied), String> {
        let begun = Instant::now();
        let talk = |e: std::io::Error| format!("the running agent: {e}");
        say(&self.conn, &TakerSays::Ready)?;
        let refused = |reason: String| {
            tracing::error!("the handed-over state is refused: {reason}");
            let _ = say(
                &self.conn,
                &TakerSays::Refused {
                    reason: reason.clone(),
                },
            );
            format!(
                "the handed-over state is refused ({reason}); the running agent \
                 forwards on: stop it to start this one without its state"
            )
        };
        if self.offer.precopy {
            let said = fdpass::recv(&self.conn).map_err(talk)?;
            let GiverSays::Base { age_ns } = from_json(&said, "the running agent's base")? else {
                return Err("the running agent did not announce its base".into());
            };
            let got = Instant::now();
            let base = fdpass::recv(&self.conn).map_err(talk)?;
            let now = starting.now_ns();
            let age_ns = age_ns.saturating_add(got.elapsed().as_nanos() as u64);
            let summary = super::state::load_base(starting.pipeline_mut(), &base, now, age_ns)
                .map_err(refused)?;
            tracing::info!(
                restore_ms = got.elapsed().as_secs_f64() * 1e3,
                "the pre-copy's base is loaded while the running agent forwards: {summary}"
            );
            say(&self.conn, &TakerSays::BaseLoaded { summary })?;
        }
        let held = Instant::now();
        let state = fdpass::recv(&self.conn).map_err(talk)?;
        let now = starting.now_ns();
        let pipeline = starting.pipeline_mut();
        let loaded = if self.offer.precopy {
            super::state::load_changes(pipeline, &state, now)
        } else {
            super::state::load(pipeline, &state, now)
        };
        let summary = loaded.map_err(refused)?;
        say(
            &self.conn,
            &TakerSays::Loaded {
                summary: summary.clone(),
            },
        )?;
        let go = fdpass::recv(&self.conn).map_err(talk)?;
        match from_json(&go, "the running agent's go")? {
            GiverSays::Go => {}
            other => return Err(format!("the running agent said {other:?} instead of go")),
        }
        let last_ms = held.elapsed().as_secs_f64() * 1e3;
        let r = starting.run()?;
        tracing::info!(
            giver = self.offer.pid,
            took_ms = begun.elapsed().as_secs_f64() * 1e3,
            last_state_to_go_ms = last_ms,
            "took over from the running agent: {summary}"
        );
        Ok(r)
    }
}
