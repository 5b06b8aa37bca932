//! The agent's checkpoints of its connection state ([`crate::checkpoint`]): written
//! while it runs and when it stops, read when it starts without a handover.

use std::time::{Duration, Instant};

use ferry_datapath::handover;

use super::{Agent, Starting};
use crate::checkpoint;

/// How long a checkpoint waits for the worker to save its state.
const SAVE_TIMEOUT: Duration = Duration::from_secs(2);

impl Agent {
    /// Writes the pipeline's state to the state directory now, if checkpoints are on.
    /// The worker holds forwarding only while it saves; the bytes are made and written
    /// here. A failure is logged once until a checkpoint succeeds again.
    pub fn checkpoint(&mut self) {
        let (Some(dir), Some(_)) = (self.opts.state_dir.clone(), self.opts.checkpoint_every) else {
            return;
        };
        let begun = Instant::now();
        // The state of the last checkpoint is saved into again: its memory is reused,
        // which halves the time the worker holds forwarding at a full table.
        let mut state = *self.checkpoint_state.take().unwrap_or_default();
        let r = self
            .control
            .run(SAVE_TIMEOUT, move |v| {
                v.pipeline.save_state_into(v.now_ns, &mut state);
                state
            })
            .map_err(|e| e.to_string())
            .and_then(|s| {
                let n = s.connections.len();
                let written = checkpoint::write(&dir, &handover::encode(&s));
                self.checkpoint_state = Some(Box::new(s));
                written.map(|()| n).map_err(|e| e.to_string())
            });
        match r {
            Ok(n) => {
                if std::mem::take(&mut self.checkpoint.1) {
                    tracing::info!(connections = n, "checkpoints are written again");
                }
                tracing::trace!(
                    connections = n,
                    ms = begun.elapsed().as_secs_f64() * 1e3,
                    "checkpoint written"
                );
            }
            Err(e) if !self.checkpoint.1 => {
                self.checkpoint.1 = true;
                tracing::warn!(
                    file = %checkpoint::path(&dir).display(),
                    "the connection state is not written ({e}): a crash now loses it"
                );
            }
            Err(_) => {}
        }
    }
}

impl Starting {
    /// Restores the checkpoint the previous agent left in the state directory, aged by
    /// the time since it was written; one that cannot be read or restored is moved
    /// aside and the agent starts cold. Nothing when checkpoints are off.
    pub fn load_checkpoint(&mut self) {
        let opts = &self.agent.opts;
        let (Some(dir), Some(_)) = (opts.state_dir.clone(), opts.checkpoint_every) else {
            return;
        };
        let file = checkpoint::path(&dir);
        let read = match checkpoint::read(&dir) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(file = %file.display(), "the checkpoint cannot be read ({e}): starting without it");
                return;
            }
        };
        let now = self.now_ns();
        let age = u64::try_from(read.age.as_nanos()).unwrap_or(u64::MAX);
        let restored = handover::decode(&read.bytes)
            .map_err(|e| e.to_string())
            .and_then(|s| {
                self.pipeline
                    .restore_state_with(&s, now, handover::RestoreOptions::checkpoint(age))
                    .map_err(|e| e.to_string())
            });
        match restored {
            Ok(r) => tracing::info!(
                file = %file.display(),
                age_ms = read.age.as_millis() as u64,
                "the previous agent's checkpoint: {r}"
            ),
            Err(e) => {
                let aside = checkpoint::move_aside(&dir);
                tracing::error!(
                    file = %file.display(),
                    moved_to = ?aside.ok(),
                    "the checkpoint is refused ({e}): starting cold, tracked connections \
                     are picked up as they come"
                );
            }
        }
    }
}
