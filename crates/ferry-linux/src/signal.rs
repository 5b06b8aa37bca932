//! Stopping a long-running command cleanly on SIGINT, SIGTERM, SIGHUP and SIGQUIT.
//!
//! SIGHUP (the terminal or session went away) and SIGQUIT stop ferry the same way as
//! SIGTERM instead of killing it outright, so they too leave no filter or device behind
//! (SIGQUIT therefore writes no core dump).
//!
//! The handler only stores to an atomic flag (async-signal-safe); the worker loop sees the
//! flag within one poll timeout and returns, and dropping the ports then removes every
//! device, socket and filter they made.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// The signals that stop a long-running command cleanly.
pub const STOP_SIGNALS: [libc::c_int; 4] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Installs handlers for [`STOP_SIGNALS`] that set the returned flag.
pub fn stop_on_signals() -> io::Result<&'static AtomicBool> {
    for sig in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
        // is an extern "C" fn that only performs an atomic store, which is
        // async-signal-safe; `sigaction` reads the struct and we pass no old-action pointer.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(&STOP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_stop_signal_sets_the_flag() {
        let stop = stop_on_signals().unwrap();
        for sig in STOP_SIGNALS {
            assert!(!stop.load(Ordering::SeqCst));
            // SAFETY: raising a signal whose handler was just installed in this process.
            unsafe { libc::raise(sig) };
            assert!(stop.load(Ordering::SeqCst), "signal {sig}");
            STOP.store(false, Ordering::SeqCst);
        }
    }
}
