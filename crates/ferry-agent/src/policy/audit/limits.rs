//! What keeps the audit log small: a token bucket for its lines, and the connections
//! logged lately, so that a retransmitted first packet is not logged again.

use std::collections::HashMap;

use ferry_datapath::FlowKey;

/// A token bucket: `rate` tokens a second, at most `burst` saved up; full at the start.
/// Time is the pipeline's, in nanoseconds.
#[derive(Clone, Debug)]
pub(super) struct TokenBucket {
    rate: u32,
    /// Tokens in billionths, so that refills of a few nanoseconds add up exactly.
    nano_tokens: u128,
    max: u128,
    last_ns: Option<u64>,
}

const NANO: u128 = 1_000_000_000;

impl TokenBucket {
    /// `rate` tokens a second (at least 1), `burst` at most (at least 1).
    pub(super) fn new(rate: u32, burst: u32) -> TokenBucket {
        let max = u128::from(burst.max(1)) * NANO;
        TokenBucket {
            rate: rate.max(1),
            nano_tokens: max,
            max,
            last_ns: None,
        }
    }

    /// Takes a token at `now_ns`, if there is one. A clock that goes back refills
    /// nothing.
    pub(super) fn take(&mut self, now_ns: u64) -> bool {
        if let Some(last) = self.last_ns {
            let elapsed = u128::from(now_ns.saturating_sub(last));
            self.nano_tokens = (self.nano_tokens + elapsed * u128::from(self.rate)).min(self.max);
        }
        self.last_ns = Some(self.last_ns.map_or(now_ns, |l| l.max(now_ns)));
        if self.nano_tokens >= NANO {
            self.nano_tokens -= NANO;
            true
        } else {
            false
        }
    }
}

/// The connections logged lately, by their key as their first packet came (before
/// NAT), each with when it was last seen: a denial of one of them within `window_ns` of
/// the last is a repeat (a retransmission of the same first packet), and is seen again.
/// At most `capacity` are remembered; when full, those past the window go, then the
/// older half.
#[derive(Clone, Debug)]
pub(super) struct Repeats {
    seen: HashMap<FlowKey, u64>,
    window_ns: u64,
    capacity: usize,
}

impl Repeats {
    pub(super) fn new(window_ns: u64, capacity: usize) -> Repeats {
        Repeats {
            seen: HashMap::new(),
            window_ns,
            capacity: capacity.max(1),
        }
    }

    /// True when `key` was logged, or seen as a repeat, within the window before
    /// `now_ns`; then it is seen now.
    pub(super) fn is_repeat(&mut self, key: &FlowKey, now_ns: u64) -> bool {
        match self.seen.get_mut(key) {
            Some(t) if now_ns.saturating_sub(*t) < self.window_ns => {
                *t = (*t).max(now_ns);
                true
            }
            _ => false,
        }
    }

    /// Remembers `key`, logged at `now_ns`.
    pub(super) fn logged(&mut self, key: FlowKey, now_ns: u64) {
        if self.seen.len() >= self.capacity && !self.seen.contains_key(&key) {
            let window = self.window_ns;
            self.seen.retain(|_, t| now_ns.saturating_sub(*t) < window);
            if self.seen.len() >= self.capacity {
                // Still full: the older half goes (amortized over the inserts to come).
                let mut times: Vec<u64> = self.seen.values().copied().collect();
                let mid = times.len() / 2;
                let (_, median, _) = times.select_nth_unstable(mid);
                let median = *median;
                self.seen.retain(|_, t| *t > median);
            }
        }
        self.seen.insert(key, now_ns);
    }

    /// Connections remembered now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.seen.len()
    }
}
