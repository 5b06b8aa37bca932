//! Handing the node over from a running agent to a new one without breaking a
//! connection: the new agent (the taker, started with the same `--api-socket` while the
//! old one runs) asks the running one (the giver) for its ports, its listeners and its
//! connection state, and starts forwarding where the giver stopped.
//!
//! The conversation, on one connection of the API socket (messages and descriptors as
//! [`ferry_linux::fdpass`] sends them; every message a JSON object but the state):
//!
//! 1. taker: the request line `{"op": "handover", ...}` ([`ferry_api::Request::Handover`]).
//!    The giver stops accepting other API connections (they wait in the backlog for
//!    whoever serves next).
//! 2. giver: an [`Offer`]: each port it can hand over (its name in the tables, its pod,
//!    what each queue's descriptor is), the TCP listeners (health check node ports,
//!    `/healthz`, metrics) and the API socket's own listener; then the descriptors, in
//!    that order. The giver goes on forwarding.
//! 3. taker: compiles its tables from its own datastore, makes its ports from the
//!    descriptors (opening those it was not given), and says [`TakerSays::Ready`] (or
//!    [`TakerSays::Abort`]).
//! 4. giver, when the taker asked for a pre-copy (an older taker does not, and an
//!    older giver's offer does not say it gives one): begins recording what changes
//!    and saves the base of its state, [`PRECOPY_PART`] connection table slots per
//!    hold of its workers (about 0.4 ms a hold), forwarding between the holds; sends
//!    [`GiverSays::Base`] with the base's age, then the base, in the versioned format of
//!    `ferry_datapath::handover` (see its "Pre-copy"). The taker restores it while the
//!    giver forwards and says [`TakerSays::BaseLoaded`] (or [`TakerSays::Refused`]).
//! 5. giver: holds every worker between two rounds (nothing is read from a port from
//!    then on; what arrives waits in the kernel's queues), saves the pipeline's state
//!    (after a pre-copy, only what changed since its base) and sends it as one message.
//! 6. taker: loads the state into its pipeline (applies the changes over the base),
//!    all or nothing, and says [`TakerSays::Loaded`], or [`TakerSays::Refused`] with
//!    the reason.
//! 7. giver: says [`GiverSays::Go`] and is done: it forwards no more, whatever comes
//!    ([`AfterHandover`]: it exits at once, or closes every descriptor and waits to be
//!    stopped). The taker starts its workers, which read what waited in the queues.
//!
//! Forwarding stops at step 5 and starts again at step 7: the gap is the time to save,
//! send and load the state (after a pre-copy, its changes: about a millisecond when a
//! hundredth of a full table had packets during the pre-copy), and no packet is lost on
//! the way (the queues hold them). Anything that goes wrong before step 7 (the taker
//! dies, says so, is too slow, or refuses the state) leaves the giver forwarding as
//! before, with its state as it was (a pre-copy's recording stopped), and the taker
//! exits with an error that says why; a taker that did not get its [`GiverSays::Go`]
//! never forwards.
//!
//! A port that cannot be handed over (an AF_PACKET ring) is opened anew by the taker,
//! and the giver's closes when it goes. The host's NAT rules and the uplink's ingress
//! filter are taken over as they are: the giver leaves without undoing anything.

mod give;
mod state;
mod take;

use std::net::SocketAddr;
use std::time::Duration;

use ferry_linux::handover::Handed;
use serde::{Deserialize, Serialize};

pub use give::{AfterHandover, Given, HANDED_OVER_ENV, leave, wait_handed_over};
pub use take::{Taking, ask};

/// How long the giver waits for the taker to be ready: its first compilation of the
/// cluster and its ports.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the giver holds its workers for the taker to load the state and say so;
/// after that it forwards again and the handover has failed.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the taker waits for each of the giver's messages.
pub const GIVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Slots of the connection table the giver saves of a pre-copy's base in one hold of
/// its workers: about a millisecond's worth (a full table of 262 143 entries takes 16
/// holds).
pub const PRECOPY_PART: usize = 16_384;

/// What the giver hands over (step 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The giver's version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// The ports, each with a descriptor per queue.
    pub ports: Vec<OfferedPort>,
    /// The TCP listeners, one descriptor each, by the address they were asked for.
    pub listeners: Vec<SocketAddr>,
    /// The API socket's listener comes last.
    pub api: bool,
    /// The state comes as a pre-copy (the taker asked for one): a base, then the
    /// changes since. Absent from an older giver's offer: one state.
    #[serde(default)]
    pub precopy: bool,
}

impl Offer {
    /// How many descriptors follow the offer.
    pub fn descriptors(&self) -> usize {
        self.ports.iter().map(|p| p.queues.len()).sum::<usize>()
            + self.listeners.len()
            + usize::from(self.api)
    }
}

/// A port the giver hands over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedPort {
    /// Its name in the giver's tables.
    pub name: String,
    /// The pod it is the interface of (`namespace/name`), for a pod's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Each queue's descriptor, in order.
    pub queues: Vec<Handed>,
}

/// What the taker says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "says")]
pub enum TakerSays {
    /// Its tables and ports are ready: the state may come (step 3).
    Ready,
    /// It gives up before the state (its tables do not compile, a port does not open).
    Abort {
        /// Why.
        reason: String,
    },
    /// The state is loaded (step 6).
    Loaded {
        /// What was loaded, for the giver's log.
        summary: String,
    },
    /// The pre-copy's base is loaded: the changes may come.
    BaseLoaded {
        /// What was loaded, for the giver's log.
        summary: String,
    },
    /// The state was not loaded: the giver goes on.
    Refused {
        /// Why.
        reason: String,
    },
}

/// What the giver says besides its offer and the state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "says")]
pub enum GiverSays {
    /// The offer (step 2).
    Offer(Offer),
    /// The pre-copy's base follows, its records as they were `age_ns` ago.
    Base {
        /// Nanoseconds since the base's records were taken, when it is sent.
        age_ns: u64,
    },
    /// The taker may forward: the giver has stopped for good (step 7).
    Go,
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn from_json<'a, T: Deserialize<'a>>(b: &'a [u8], what: &str) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| format!("{what} cannot be read: {e}"))
}
