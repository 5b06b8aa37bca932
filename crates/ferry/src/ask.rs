//! Asking the running agent over its API socket, for the commands that read it.

use std::path::Path;

use anyhow::{Result, anyhow};
use ferry_agent::api::{call, no_agent};
use ferry_api::{Request, Response};

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
