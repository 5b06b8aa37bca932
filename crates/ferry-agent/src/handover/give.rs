//! The running agent's side of a handover (the giver): see the module docs.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_linux::fdpass;
use ferry_linux::worker::HandedPort;

use ferry_datapath::handover::{self as format, SavedState};
use ferry_linux::worker::Control;

use super::{
    GiverSays, HOLD_TIMEOUT, Offer, OfferedPort, PRECOPY_PART, READY_TIMEOUT, TakerSays, from_json,
};
use crate::accept;
use crate::api::ApiServer;
use crate::run::Agent;

/// What the giver does once the taker forwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AfterHandover {
    /// Exits at once (status 0), undoing nothing: what it made is the taker's now.
    #[default]
    Exit,
    /// Becomes an idle process holding nothing (every descriptor closed) until it is
    /// stopped, then exits with status 0: the DaemonSet's old pod then does not end on
    /// its own, which its restart policy would answer by starting it again.
    Wait,
}

/// How a handover ended for the giver.
#[derive(Debug)]
pub enum Given {
    /// The taker forwards; the giver must go ([`AfterHandover`]).
    Done,
    /// It failed; the giver forwards as before. Why.
    Failed(String),
}

impl Agent {
    /// Hands the node over to the agent at the other end of `conn` (pid `taker`, which
    /// takes a pre-copy when `precopy`), as the module docs describe; `api` stops
    /// accepting meanwhile, and accepts again when the handover fails.
    pub fn give_over(
        &mut self,
        conn: UnixStream,
        api: &mut ApiServer,
        taker: u32,
        precopy: bool,
    ) -> Given {
        let begun = Instant::now();
        api.pause();
        let given = self.give(&conn, api, precopy);
        if given.is_err() && precopy {
            // A pre-copy given up midway records nothing more.
            let _ = self
                .control()
                .run_exclusive(HOLD_TIMEOUT, |v| v.pipeline.stop_tracking());
        }
        match given {
            Ok(gap) => {
                tracing::info!(
                    taker,
                    took_ms = begun.elapsed().as_secs_f64() * 1e3,
                    held_ms = gap.as_secs_f64() * 1e3,
                    "handed over to the new agent: this one forwards no more"
                );
                Given::Done
            }
            Err(e) => {
                tracing::warn!(taker, "handover failed, forwarding goes on here: {e}");
                if let Err(e) = api.accept() {
                    tracing::error!("the API socket does not accept again: {e}");
                }
                Given::Failed(e)
            }
        }
    }

    /// Steps 2 to 7; the time the workers were held last, once the taker has the node.
    fn give(
        &mut self,
        conn: &UnixStream,
        api: &ApiServer,
        precopy: bool,
    ) -> Result<Duration, String> {
        fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
            move |e| format!("{what}: {e}")
        }
        let ports: Vec<HandedPort> = self
            .control()
            .run_exclusive(HOLD_TIMEOUT, |v| v.handover_ports())
            .map_err(|e| format!("the ports' descriptors: {e}"))?
            .map_err(io("the ports' descriptors"))?;
        let listeners = accept::live_listeners();
        let offer = Offer {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            ports: ports
                .iter()
                .map(|p| OfferedPort {
                    name: p.name.clone(),
                    pod: self.pod_of_port(&p.name).map(|k| k.to_string()),
                    queues: p.queues.iter().map(|(h, _)| h.clone()).collect(),
                })
                .collect(),
            listeners: listeners.iter().map(|(a, _)| *a).collect(),
            api: true,
            precopy,
        };
        let mut fds: Vec<BorrowedFd<'_>> = ports
            .iter()
            .flat_map(|p| p.queues.iter().map(|(_, fd)| fd.as_fd()))
            .collect();
        fds.extend(listeners.iter().map(|(_, l)| l.as_fd()));
        fds.push(api.listener().as_fd());
        fdpass::send(conn, &super::to_json(&GiverSays::Offer(offer)))
            .map_err(io("sending the offer"))?;
        fdpass::send_fds(conn, &fds).map_err(io("sending the descriptors"))?;
        drop(fds);
        drop(ports);
        conn.set_read_timeout(Some(READY_TIMEOUT))
            .map_err(io("the connection"))?;
        match recv_taker(conn)? {
            TakerSays::Ready => {}
            TakerSays::Abort { reason } => return Err(format!("the new agent gave up: {reason}")),
            other => return Err(format!("the new agent said {other:?} before it was ready")),
        }
        self.write_audit_now();
        if precopy {
            self.send_base(conn)?;
            match recv_taker(conn)? {
                TakerSays::BaseLoaded { summary } => {
                    tracing::info!("the new agent loaded the pre-copy's base: {summary}");
                }
                TakerSays::Refused { reason } => {
                    return Err(format!("the new agent refused the state: {reason}"));
                }
                other => return Err(format!("the new agent said {other:?} for the base")),
            }
        }
        // Holds the workers from here: the state saved is all the state there is (after
        // a pre-copy, what changed since its base). The job lets them go when `release`
        // is dropped (the handover failed) or after HOLD_TIMEOUT; told that the taker
        // has the node, it never lets them go.
        let (state_tx, state_rx) = mpsc::sync_channel(1);
        let (release, held) = mpsc::channel::<()>();
        let control = std::sync::Arc::clone(self.control());
        let holder = thread::Builder::new()
            .name("ferry-handover".into())
            .spawn(move || {
                control.run_exclusive(HOLD_TIMEOUT, move |v| {
                    let state = if precopy {
                        format::encode(&v.pipeline.save_changes(v.now_ns))
                    } else {
                        super::state::save(v.pipeline, v.now_ns)
                    };
                    let _ = state_tx.send(state);
                    if held.recv_timeout(HOLD_TIMEOUT).is_ok() {
                        // Handed over: this process forwards no more until it goes.
                        loop {
                            thread::park();
                        }
                    }
                })
            })
            .map_err(io("holding the workers"))?;
        let held_at = Instant::now();
        let result = (|| {
            let state = state_rx
                .recv_timeout(HOLD_TIMEOUT)
                .map_err(|_| "the workers did not give their state in time".to_string())?;
            fdpass::send(conn, &state).map_err(io("sending the state"))?;
            // The taker must answer while the workers are still held.
            let left = HOLD_TIMEOUT.saturating_sub(held_at.elapsed() + Duration::from_millis(500));
            conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(io("the connection"))?;
            match recv_taker(conn)? {
                TakerSays::Loaded { summary } => {
                    tracing::info!("the new agent loaded the state: {summary}");
                }
                TakerSays::Refused { reason } => {
                    return Err(format!("the new agent refused the state: {reason}"));
                }
                other => return Err(format!("the new agent said {other:?} for the state")),
            }
            fdpass::send(conn, &super::to_json(&GiverSays::Go)).map_err(io("saying go"))
        })();
        match result {
            Ok(()) => {
                let _ = release.send(());
                drop(holder);
                Ok(held_at.elapsed())
            }
            Err(e) => {
                drop(release);
                let _ = holder.join();
                Err(e)
            }
        }
    }
}

impl Agent {
    /// The pre-copy's base (step 4 of a pre-copy): saved a part at a time while the
    /// workers forward between the parts, then encoded and sent, told how old it is.
    fn send_base(&self, conn: &UnixStream) -> Result<(), String> {
        let begun = Instant::now();
        let (base, parts) = save_base(self.control())?;
        let bytes = format::encode(&base);
        let connections = base.connections.len();
        drop(base);
        let age_ns = u64::try_from(begun.elapsed().as_nanos()).unwrap_or(u64::MAX);
        tracing::info!(
            connections,
            parts,
            bytes = bytes.len(),
            took_ms = begun.elapsed().as_secs_f64() * 1e3,
            "pre-copy: the base is saved while forwarding goes on"
        );
        fdpass::send(conn, &super::to_json(&GiverSays::Base { age_ns }))
            .map_err(|e| format!("sending the base's age: {e}"))?;
        fdpass::send(conn, &bytes).map_err(|e| format!("sending the base: {e}"))
    }
}

/// Begins the pre-copy and saves its base, [`PRECOPY_PART`] slots of the connection
/// table a hold, every record as of the first hold (where the changes begin to be
/// recorded): what changes after it is in the changes, not in the base. The base and
/// how many holds it took.
fn save_base(control: &std::sync::Arc<Control>) -> Result<(SavedState, usize), String> {
    let held = |e| format!("saving the pre-copy's base: {e}");
    let (mut base, mut next, at) = control
        .run_exclusive(HOLD_TIMEOUT, |v| {
            v.pipeline.track_changes();
            let mut base = SavedState::default();
            let next = v
                .pipeline
                .save_base_into(v.now_ns, 0, PRECOPY_PART, &mut base);
            (base, next, v.now_ns)
        })
        .map_err(held)?;
    let mut parts = 1;
    while let Some(from) = next {
        let r = control
            .run_exclusive(HOLD_TIMEOUT, move |v| {
                let next = v.pipeline.save_base_into(at, from, PRECOPY_PART, &mut base);
                (base, next)
            })
            .map_err(held)?;
        (base, next) = r;
        parts += 1;
    }
    Ok((base, parts))
}

fn recv_taker(conn: &UnixStream) -> Result<TakerSays, String> {
    let b = fdpass::recv(conn).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "the new agent did not answer in time".to_string()
        }
        std::io::ErrorKind::UnexpectedEof => "the new agent went away".to_string(),
        _ => format!("reading the new agent: {e}"),
    })?;
    from_json(&b, "the new agent's answer")
}

/// Set in the environment of the idle process that [`AfterHandover::Wait`] makes of the
/// giver (the same `ferry` program and arguments): it waits to be stopped
/// ([`wait_handed_over`]).
pub const HANDED_OVER_ENV: &str = "FERRY_HANDED_OVER";

/// Ends the giver once the taker forwards: exits, or becomes the idle process of
/// [`AfterHandover::Wait`] (executing itself anew closes every descriptor, which are
/// all close-on-exec, in one step, without running anything of this process).
pub fn leave(after: AfterHandover) -> ! {
    if after == AfterHandover::Wait {
        use std::os::unix::process::CommandExt;
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_else(|| "ferry".into());
        let e = std::process::Command::new("/proc/self/exe")
            .arg0(argv0)
            .args(args)
            .env(HANDED_OVER_ENV, "1")
            .exec();
        tracing::error!("becoming an idle process after the handover: {e}; exiting instead");
    }
    std::process::exit(0)
}

/// The idle process of [`AfterHandover::Wait`]: holds nothing, waits until `stop` is set
/// (a stop signal), then exits with status 0.
pub fn wait_handed_over(stop: &std::sync::atomic::AtomicBool) -> ! {
    tracing::info!(
        "this agent handed the node over to a new one: it holds nothing and waits to be stopped"
    );
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(100));
    }
    std::process::exit(0)
}
