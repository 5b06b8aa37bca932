//! One accept loop for the agent's small servers (the API socket, health check node
//! ports, metrics): a thread that polls a non-blocking listener and hands each
//! connection on, until the [`Acceptor`] is dropped.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long the loop waits when no connection is pending (bounds the time a drop
/// waits for the thread).
const IDLE: Duration = Duration::from_millis(20);

/// A running accept loop; dropping it stops the thread and waits for it.
pub(crate) struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Runs `accept` (a non-blocking listener's accept) on a thread named `name`; each
    /// connection goes to `handle`, on the same thread (a handler that may be slow
    /// spawns its own).
    pub(crate) fn spawn<C>(
        name: String,
        mut accept: impl FnMut() -> io::Result<C> + Send + 'static,
        mut handle: impl FnMut(C) + Send + 'static,
    ) -> io::Result<Acceptor> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new().name(name).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match accept() {
                    Ok(conn) => handle(conn),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(IDLE),
                    Err(_) => thread::sleep(5 * IDLE),
                }
            }
        })?;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
