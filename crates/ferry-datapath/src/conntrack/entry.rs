//! One tracked connection: its two tuples, protocol state, NAT status, accounting and the
//! fields other stages set (mark, labels, tunnel peer).

use std::fmt;
use std::net::IpAddr;

use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use super::Timeouts;
use super::tcp::{TcpConn, TcpState};
use crate::flow::{FlowKey, proto, proto_name};

/// Index of a direction in per-direction arrays: the original direction.
pub const ORIGINAL: usize = 0;
/// Index of a direction in per-direction arrays: the reply direction.
pub const REPLY: usize = 1;

/// Status bits of an entry, in the spirit of nf_conntrack's `IPS_*` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status(pub u8);

impl Status {
    /// A packet was seen in the reply direction.
    pub const SEEN_REPLY: u8 = 1;
    /// The connection is established enough to be worth keeping (TCP handshake done,
    /// UDP seen both ways more than once); it is never evicted to make room.
    pub const ASSURED: u8 = 2;
    /// The destination of the original direction is translated.
    pub const DNAT: u8 = 4;
    /// The source of the original direction is translated.
    pub const SNAT: u8 = 8;

    /// True when every bit of `bits` is set.
    #[inline]
    pub fn has(self, bits: u8) -> bool {
        self.0 & bits == bits
    }

    /// Sets `bits`.
    #[inline]
    pub fn set(&mut self, bits: u8) {
        self.0 |= bits;
    }

    /// True when the entry translates packets (DNAT or SNAT).
    #[inline]
    pub fn nat(self) -> bool {
        self.0 & (Self::DNAT | Self::SNAT) != 0
    }

    fn names(self) -> impl Iterator<Item = &'static str> {
        [
            (Self::SEEN_REPLY, "seen_reply"),
            (Self::ASSURED, "assured"),
            (Self::DNAT, "dnat"),
            (Self::SNAT, "snat"),
        ]
        .into_iter()
        .filter(move |(b, _)| self.has(*b))
        .map(|(_, n)| n)
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for n in self.names() {
            seq.serialize_element(n)?;
        }
        seq.end()
    }
}

/// Protocol state of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtoState {
    /// TCP: state machine and sequence windows.
    Tcp(TcpConn),
    /// UDP: unreplied / replied / assured follow from the status bits.
    Udp,
    /// ICMP or ICMPv6 echo, by identifier.
    Icmp,
    /// Any other protocol, tracked by addresses only.
    Other,
}

/// A tracked connection.
///
/// The original tuple is the key of the first packet; the reply tuple is the key that a
/// reply carries on arrival, that is, the reverse of the original tuple after NAT.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Key of the packets in the original direction, as they arrive.
    #[serde(serialize_with = "ser_key")]
    pub original: FlowKey,
    /// Key of the packets in the reply direction, as they arrive.
    #[serde(serialize_with = "ser_key")]
    pub reply: FlowKey,
    /// Protocol state.
    pub proto_state: ProtoState,
    /// Status bits.
    pub status: Status,
    /// A mark for other stages (e.g. the policy verdict).
    pub mark: u32,
    /// Labels for other stages (e.g. the service, "forwarded from node X").
    pub labels: u128,
    /// The node the original direction arrived from through the overlay, so that replies
    /// return through it (NodePort with externalTrafficPolicy=Cluster).
    pub tunnel_peer: Option<IpAddr>,
    /// Packets seen per direction ([`ORIGINAL`], [`REPLY`]).
    pub packets: [u64; 2],
    /// Bytes (whole IP packets) seen per direction.
    pub bytes: [u64; 2],
    /// Time of the first packet.
    pub first_seen_ns: u64,
    /// Time of the last packet that refreshed the entry.
    pub last_seen_ns: u64,
}

fn ser_key<S: Serializer>(k: &FlowKey, s: S) -> Result<S::Ok, S::Error> {
    let mut st = s.serialize_struct("Tuple", 6)?;
    st.serialize_field("zone", &k.zone)?;
    st.serialize_field("proto", &k.proto)?;
    st.serialize_field("src", &k.src)?;
    st.serialize_field("dst", &k.dst)?;
    st.serialize_field("sport", &k.src_port)?;
    st.serialize_field("dport", &k.dst_port)?;
    st.end()
}

impl Entry {
    /// A fresh entry for a connection whose first packet has key `original`.
    pub(crate) fn new(original: FlowKey, reply: FlowKey, ps: ProtoState, now_ns: u64) -> Entry {
        Entry {
            original,
            reply,
            proto_state: ps,
            status: Status::default(),
            mark: 0,
            labels: 0,
            tunnel_peer: None,
            packets: [0; 2],
            bytes: [0; 2],
            first_seen_ns: now_ns,
            last_seen_ns: now_ns,
        }
    }

    /// The tuple of direction `dir` ([`ORIGINAL`] or [`REPLY`]).
    #[inline]
    pub fn tuple(&self, dir: usize) -> &FlowKey {
        if dir == ORIGINAL {
            &self.original
        } else {
            &self.reply
        }
    }

    /// The zone of the connection.
    #[inline]
    pub fn zone(&self) -> u16 {
        self.original.zone
    }

    /// How long the entry lives after its last packet, given its state.
    pub fn timeout_ns(&self, t: &Timeouts) -> u64 {
        match &self.proto_state {
            ProtoState::Tcp(c) => {
                let full = t.tcp(c.state);
                // A connection never confirmed by a handshake (a picked-up stray segment,
                // a SYN nobody answered) does not get the long established timeout.
                if self.status.has(Status::ASSURED) {
                    full
                } else {
                    full.min(t.tcp_unassured_ns)
                }
            }
            ProtoState::Udp => {
                if self.status.has(Status::ASSURED) {
                    t.udp_assured_ns
                } else if self.status.has(Status::SEEN_REPLY) {
                    t.udp_replied_ns
                } else {
                    t.udp_unreplied_ns
                }
            }
            ProtoState::Icmp => t.icmp_ns,
            ProtoState::Other => t.other_ns,
        }
    }

    /// The time at which the entry expires unless refreshed.
    #[inline]
    pub fn deadline_ns(&self, t: &Timeouts) -> u64 {
        self.last_seen_ns.saturating_add(self.timeout_ns(t))
    }

    /// The TCP state, for TCP entries.
    pub fn tcp_state(&self) -> Option<TcpState> {
        match &self.proto_state {
            ProtoState::Tcp(c) => Some(c.state),
            _ => None,
        }
    }

    /// One `conntrack -L` style line, with the seconds left at `now_ns`.
    pub fn line<'a>(&'a self, t: &'a Timeouts, now_ns: u64) -> Line<'a> {
        Line {
            entry: self,
            secs_left: self.deadline_ns(t).saturating_sub(now_ns) / 1_000_000_000,
        }
    }
}

/// A `conntrack -L` style line for an entry (see [`Entry::line`]).
pub struct Line<'a> {
    entry: &'a Entry,
    secs_left: u64,
}

fn write_tuple(f: &mut fmt::Formatter<'_>, k: &FlowKey) -> fmt::Result {
    write!(f, "src={} dst={}", k.src, k.dst)?;
    match k.proto {
        proto::TCP | proto::UDP => write!(f, " sport={} dport={}", k.src_port, k.dst_port),
        proto::ICMP | proto::ICMPV6 => write!(
            f,
            " type={} code={} id={}",
            k.dst_port >> 8,
            k.dst_port & 0xff,
            k.src_port
        ),
        _ => Ok(()),
    }
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.entry;
        write!(
            f,
            "{} {} {} ",
            proto_name(e.original.proto),
            e.original.proto,
            self.secs_left
        )?;
        if let Some(s) = e.tcp_state() {
            write!(f, "{} ", s.name())?;
        }
        write_tuple(f, &e.original)?;
        if !e.status.has(Status::SEEN_REPLY) {
            f.write_str(" [UNREPLIED]")?;
        }
        f.write_str(" ")?;
        write_tuple(f, &e.reply)?;
        if e.status.has(Status::ASSURED) {
            f.write_str(" [ASSURED]")?;
        }
        write!(f, " zone={} mark={}", e.zone(), e.mark)?;
        if e.labels != 0 {
            write!(f, " labels={:#x}", e.labels)?;
        }
        if let Some(p) = e.tunnel_peer {
            write!(f, " tunnel_peer={p}")?;
        }
        Ok(())
    }
}

/// Without a clock, an entry displays with its full timeout under the default timeouts;
/// use [`Entry::line`] for the seconds actually left.
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = Timeouts::default();
        self.line(&t, self.last_seen_ns).fmt(f)
    }
}
