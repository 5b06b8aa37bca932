//! Live tracing and capture of the packets a worker forwards.
//!
//! Both are off unless a control-plane job turns them on ([`super::Control::run`]); off,
//! they cost the worker one branch per received batch.

/// The worker's live taps.
#[derive(Debug, Default)]
pub struct Taps {}

impl Taps {
    /// True when any tap is on: the worker then takes the slow path for its packets.
    #[inline]
    pub fn active(&self) -> bool {
        false
    }
}
