//! One tracked connection: its two tuples, protocol state, NAT status, accounting and the
//! fields other stages set (mark, labels, tunnel peer).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use super::Timeouts;
use super::sctp::SctpConn;
use super::table::Links;
use super::tcp::{TcpConn, TcpState};
use crate::flow::{Addr, FlowKey, proto, proto_name};

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
    /// UDP seen both ways and still active after 2 s); it is never evicted to make room.
    pub const ASSURED: u8 = 2;
    /// The destination of the original direction is translated.
    pub const DNAT: u8 = crate::nat::ports::DNAT;
    /// The source of the original direction is translated.
    pub const SNAT: u8 = crate::nat::ports::SNAT;

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
    /// SCTP: association state and verification tags.
    Sctp(SctpConn),
    /// Any other protocol, tracked by addresses only.
    Other,
}

/// A tracked connection.
///
/// The original tuple is the key of the first packet; the reply tuple is the key that a
/// reply carries on arrival, that is, the reverse of the original tuple after NAT.
///
/// Stored compactly (see the module documentation of `conntrack`): the zone and protocol
/// once, IPv4 addresses in 4 bytes, IPv6 addresses in 16 bytes with a reply address that
/// equals an original one not stored again, so the tuples come out of accessors
/// ([`Entry::original`], [`Entry::reply`]).
///
/// Field order is the layout (`repr(C)`): what a packet of an IPv4 UDP connection reads
/// and writes (times, counters, ports, zone, protocol, status, addresses, the first byte
/// of the protocol state) comes first, in 73 bytes, so that at any of the four places an
/// entry can start relative to a 64-byte cache line (entries are 176 bytes apart) a
/// lookup and an update touch two cache lines; a TCP packet reads the 28 bytes of its
/// state as well. The rest (the other IPv6 addresses, mark, labels, first time, wheel
/// links) follows.
#[derive(Clone)]
#[repr(C)]
pub struct Entry {
    /// Time of the last packet that refreshed the entry.
    pub last_seen_ns: u64,
    /// Packets per direction. While no reply was seen the reply count is zero, and its
    /// place holds the entry's links in the table's list of unreplied entries.
    packets: [u64; 2],
    /// Bytes (whole IP packets) per direction.
    bytes: [u64; 2],
    /// Original source and destination ports, reply source and destination ports.
    ports: [u16; 4],
    zone: u16,
    proto: u8,
    form: Form,
    /// Status bits.
    pub status: Status,
    /// Addresses, first part: see [`Form`]. IPv4: original source, original destination,
    /// reply source, reply destination, 4 bytes each. IPv6: the first 16-byte place (the
    /// original source).
    addrs: [u8; 16],
    /// Protocol state.
    pub proto_state: ProtoState,
    /// A mark for other stages (e.g. the policy verdict).
    pub mark: u32,
    /// Addresses, second part. IPv4: the tunnel peer (16 bytes). IPv6: the second and
    /// third places (original destination, then the reply source, the reply destination
    /// or the tunnel peer, the first of them stored).
    places: [u8; 32],
    /// The fourth and fifth IPv6 places, allocated only when needed.
    more: Option<Box<[u8; 32]>>,
    /// Labels for other stages (e.g. the service, "forwarded from node X").
    pub labels: u128,
    /// Time of the first packet.
    pub first_seen_ns: u64,
    /// Expiry wheel links, owned by the table.
    pub(super) links: Links,
}

/// How an entry's addresses are laid out (bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Form(u8);

impl Form {
    /// The tuples are IPv6.
    const V6: u8 = 1;
    /// IPv6: the reply source differs from the original destination and has a place.
    const REPLY_SRC: u8 = 2;
    /// IPv6: the reply destination differs from the original source and has a place.
    const REPLY_DST: u8 = 4;
    /// A tunnel peer is set.
    const PEER: u8 = 8;
    /// The tunnel peer is IPv6.
    const PEER_V6: u8 = 16;

    #[inline]
    fn has(self, b: u8) -> bool {
        self.0 & b != 0
    }
}

/// Address positions: original source and destination, reply source and destination.
const O_SRC: usize = 0;
const O_DST: usize = 1;
const R_SRC: usize = 2;
const R_DST: usize = 3;

/// IPv6: the 16-byte place of address `i` (`O_SRC`...) in an entry of this form, `None`
/// when it is not stored (a reply address equal to an original one).
#[inline]
fn place_of(f: Form, i: usize) -> Option<usize> {
    match i {
        O_SRC => Some(0),
        O_DST => Some(1),
        R_SRC => f.has(Form::REPLY_SRC).then_some(2),
        R_DST => f
            .has(Form::REPLY_DST)
            .then_some(2 + usize::from(f.has(Form::REPLY_SRC))),
        _ => None,
    }
}

/// Writes place `p` of an entry's addresses (see [`Entry`]).
fn put_place(
    addrs: &mut [u8; 16],
    places: &mut [u8; 32],
    more: &mut Option<Box<[u8; 32]>>,
    p: usize,
    v: [u8; 16],
) {
    if p == 0 {
        *addrs = v;
    } else if p < 3 {
        places[16 * (p - 1)..16 * p].copy_from_slice(&v);
    } else {
        let m = more.get_or_insert_with(|| Box::new([0; 32]));
        m[16 * (p - 3)..16 * (p - 2)].copy_from_slice(&v);
    }
}

impl PartialEq for Entry {
    fn eq(&self, o: &Entry) -> bool {
        self.original() == o.original()
            && self.reply() == o.reply()
            && self.tunnel_peer() == o.tunnel_peer()
            && self.status == o.status
            && self.proto_state == o.proto_state
            && self.mark == o.mark
            && self.labels == o.labels
            && self.packets() == o.packets()
            && self.bytes() == o.bytes()
            && self.first_seen_ns == o.first_seen_ns
            && self.last_seen_ns == o.last_seen_ns
    }
}

impl Eq for Entry {}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("original", &self.original())
            .field("reply", &self.reply())
            .field("proto_state", &self.proto_state)
            .field("status", &self.status)
            .field("mark", &self.mark)
            .field("labels", &self.labels)
            .field("tunnel_peer", &self.tunnel_peer())
            .field("packets", &self.packets())
            .field("bytes", &self.bytes())
            .field("first_seen_ns", &self.first_seen_ns)
            .field("last_seen_ns", &self.last_seen_ns)
            .finish()
    }
}

/// The same fields and order as when the tuples were plain fields.
impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Entry", 11)?;
        st.serialize_field("original", &Tuple(self.original()))?;
        st.serialize_field("reply", &Tuple(self.reply()))?;
        st.serialize_field("proto_state", &self.proto_state)?;
        st.serialize_field("status", &self.status)?;
        st.serialize_field("mark", &self.mark)?;
        st.serialize_field("labels", &self.labels)?;
        st.serialize_field("tunnel_peer", &self.tunnel_peer())?;
        st.serialize_field("packets", &self.packets())?;
        st.serialize_field("bytes", &self.bytes())?;
        st.serialize_field("first_seen_ns", &self.first_seen_ns)?;
        st.serialize_field("last_seen_ns", &self.last_seen_ns)?;
        st.end()
    }
}

struct Tuple(FlowKey);

impl Serialize for Tuple {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let k = &self.0;
        let mut st = s.serialize_struct("Tuple", 6)?;
        st.serialize_field("zone", &k.zone)?;
        st.serialize_field("proto", &k.proto)?;
        st.serialize_field("src", &k.src)?;
        st.serialize_field("dst", &k.dst)?;
        st.serialize_field("sport", &k.src_port)?;
        st.serialize_field("dport", &k.dst_port)?;
        st.end()
    }
}

impl Entry {
    /// A fresh entry for a connection whose first packet has key `original`, nothing
    /// counted yet. Both tuples are of one address family (NAT never changes it).
    #[cfg(test)]
    pub(crate) fn new(original: FlowKey, reply: FlowKey, ps: ProtoState, now_ns: u64) -> Entry {
        let mut e = Entry::first(original, reply, ps, Status::default(), 0, now_ns);
        e.packets = [0; 2];
        e
    }

    /// The entry of a new connection whose first packet, of `len` bytes and key
    /// `original`, is counted in the original direction, with its status bits set. Both
    /// tuples are of one address family (NAT never changes it). Built in one expression,
    /// so that the compiler can write it where it goes rather than copy it there.
    #[inline]
    pub(crate) fn first(
        original: FlowKey,
        reply: FlowKey,
        ps: ProtoState,
        status: Status,
        len: u64,
        now_ns: u64,
    ) -> Entry {
        debug_assert_eq!(original.zone, reply.zone);
        debug_assert_eq!(original.proto, reply.proto);
        let all = [original.src, original.dst, reply.src, reply.dst];
        debug_assert!(all.iter().all(|a| a.is_ipv6() == original.src.is_ipv6()));
        let mut form = Form::default();
        let mut addrs = [0u8; 16];
        let mut places = [0u8; 32];
        let mut more = None;
        if original.src.is_ipv6() {
            form.0 |= Form::V6;
            if reply.src != original.dst {
                form.0 |= Form::REPLY_SRC;
            }
            if reply.dst != original.src {
                form.0 |= Form::REPLY_DST;
            }
            for (i, a) in all.into_iter().enumerate() {
                if let Some(p) = place_of(form, i) {
                    put_place(&mut addrs, &mut places, &mut more, p, *a.octets());
                }
            }
        } else {
            for (i, a) in all.into_iter().enumerate() {
                addrs[4 * i..4 * i + 4].copy_from_slice(&a.octets()[12..]);
            }
        }
        Entry {
            last_seen_ns: now_ns,
            packets: [1, 0],
            bytes: [len, 0],
            ports: [
                original.src_port,
                original.dst_port,
                reply.src_port,
                reply.dst_port,
            ],
            zone: original.zone,
            proto: original.proto,
            form,
            status,
            addrs,
            proto_state: ps,
            mark: 0,
            places,
            more,
            labels: 0,
            first_seen_ns: now_ns,
            links: Links::default(),
        }
    }

    /// An entry as a saved state describes it (`handover`): its tuples (of one family),
    /// protocol state and status, the packets and bytes counted per direction (none in
    /// the reply direction before a reply), and the times of its first and last packets.
    /// Mark, labels and tunnel peer are set on it afterwards.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn restored(
        original: FlowKey,
        reply: FlowKey,
        ps: ProtoState,
        status: Status,
        packets: [u64; 2],
        bytes: [u64; 2],
        first_seen_ns: u64,
        last_seen_ns: u64,
    ) -> Entry {
        let mut e = Entry::first(original, reply, ps, status, 0, first_seen_ns);
        // While no reply was seen, the reply count's place holds the unreplied links,
        // which the table sets on insertion.
        e.packets = [packets[ORIGINAL], e.reply_count(packets[REPLY])];
        e.bytes = bytes;
        e.last_seen_ns = last_seen_ns;
        e
    }

    /// IPv6: the 16-byte place of address `i` (`O_SRC`...), `None` when it is not
    /// stored (a reply address equal to an original one).
    #[inline]
    fn place(&self, i: usize) -> Option<usize> {
        place_of(self.form, i)
    }

    /// IPv6: the place of the tunnel peer.
    #[inline]
    fn peer_place(&self) -> usize {
        2 + usize::from(self.form.has(Form::REPLY_SRC))
            + usize::from(self.form.has(Form::REPLY_DST))
    }

    #[inline]
    fn get_place(&self, p: usize) -> [u8; 16] {
        let b = if p == 0 {
            &self.addrs[..]
        } else if p < 3 {
            &self.places[16 * (p - 1)..16 * p]
        } else {
            match &self.more {
                Some(m) => &m[16 * (p - 3)..16 * (p - 2)],
                None => return [0; 16],
            }
        };
        b.try_into().unwrap_or([0; 16])
    }

    fn set_place(&mut self, p: usize, v: [u8; 16]) {
        put_place(&mut self.addrs, &mut self.places, &mut self.more, p, v);
    }

    /// Address `i` (`O_SRC`...).
    #[inline]
    fn addr(&self, i: usize) -> Addr {
        if self.form.has(Form::V6) {
            let p = self.place(i).unwrap_or(match i {
                R_SRC => 1,
                _ => 0,
            });
            Addr::v6(self.get_place(p).into())
        } else {
            let b = &self.addrs[4 * i..4 * i + 4];
            Addr::v4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        }
    }

    /// True when address `i` is `a`, without building an address.
    #[inline]
    fn addr_is(&self, i: usize, a: &Addr) -> bool {
        if self.form.has(Form::V6) {
            let p = self.place(i).unwrap_or(match i {
                R_SRC => 1,
                _ => 0,
            });
            self.get_place(p) == *a.octets()
        } else {
            a.is_ipv4() && self.addrs[4 * i..4 * i + 4] == a.octets()[12..]
        }
    }

    /// The tuple of direction `dir` ([`ORIGINAL`] or [`REPLY`]).
    #[inline]
    pub fn tuple(&self, dir: usize) -> FlowKey {
        let d = 2 * (dir & 1);
        FlowKey {
            zone: self.zone,
            src: self.addr(d),
            dst: self.addr(d + 1),
            proto: self.proto,
            src_port: self.ports[d],
            dst_port: self.ports[d + 1],
        }
    }

    /// True when the tuple of direction `dir` is `k` (cheaper than comparing
    /// [`Entry::tuple`]).
    #[inline]
    pub fn tuple_is(&self, dir: usize, k: &FlowKey) -> bool {
        let d = 2 * (dir & 1);
        self.proto == k.proto
            && self.ports[d] == k.src_port
            && self.ports[d + 1] == k.dst_port
            && self.zone == k.zone
            && self.addr_is(d, &k.src)
            && self.addr_is(d + 1, &k.dst)
    }

    /// False when the two tuples surely differ (their ports do); true for the rare entry
    /// whose tuples may be equal.
    #[inline]
    pub(super) fn maybe_symmetric(&self) -> bool {
        self.ports[0] == self.ports[2] && self.ports[1] == self.ports[3]
    }

    /// Key of the packets in the original direction, as they arrive.
    #[inline]
    pub fn original(&self) -> FlowKey {
        self.tuple(ORIGINAL)
    }

    /// Key of the packets in the reply direction, as they arrive.
    #[inline]
    pub fn reply(&self) -> FlowKey {
        self.tuple(REPLY)
    }

    /// The node the original direction arrived from through the overlay, so that replies
    /// return through it (NodePort with externalTrafficPolicy=Cluster).
    pub fn tunnel_peer(&self) -> Option<IpAddr> {
        if !self.form.has(Form::PEER) {
            return None;
        }
        let b = if self.form.has(Form::V6) {
            self.get_place(self.peer_place())
        } else {
            self.places[..16].try_into().unwrap_or([0; 16])
        };
        Some(if self.form.has(Form::PEER_V6) {
            IpAddr::from(b)
        } else {
            IpAddr::from([b[0], b[1], b[2], b[3]])
        })
    }

    /// Sets or clears the tunnel peer (either address family).
    pub fn set_tunnel_peer(&mut self, peer: Option<IpAddr>) {
        self.form.0 &= !(Form::PEER | Form::PEER_V6);
        let Some(peer) = peer else {
            if self.form.has(Form::V6) && self.peer_place() == 3 {
                // The peer was all the extra places held.
                self.more = None;
            }
            return;
        };
        self.form.0 |= Form::PEER;
        let b = match peer {
            IpAddr::V4(a) => {
                let mut b = [0; 16];
                b[..4].copy_from_slice(&a.octets());
                b
            }
            IpAddr::V6(a) => {
                self.form.0 |= Form::PEER_V6;
                a.octets()
            }
        };
        if self.form.has(Form::V6) {
            self.set_place(self.peer_place(), b);
        } else {
            self.places[..16].copy_from_slice(&b);
        }
    }

    /// Packets seen per direction ([`ORIGINAL`], [`REPLY`]).
    #[inline]
    pub fn packets(&self) -> [u64; 2] {
        [
            self.packets[ORIGINAL],
            self.reply_count(self.packets[REPLY]),
        ]
    }

    /// Bytes (whole IP packets) seen per direction.
    #[inline]
    pub fn bytes(&self) -> [u64; 2] {
        self.bytes
    }

    #[inline]
    fn reply_count(&self, v: u64) -> u64 {
        if self.status.has(Status::SEEN_REPLY) {
            v
        } else {
            0
        }
    }

    /// Counts a packet of `len` bytes in direction `dir`. A reply must have been marked
    /// (`SEEN_REPLY`) first.
    #[inline]
    pub(crate) fn count(&mut self, dir: usize, len: u64) {
        let dir = dir & 1;
        debug_assert!(dir == ORIGINAL || self.status.has(Status::SEEN_REPLY));
        self.packets[dir] += 1;
        self.bytes[dir] += len;
    }

    /// Links in the unreplied list (previous, next); meaningful only before a reply.
    #[inline]
    pub(super) fn unreplied_links(&self) -> (u32, u32) {
        let v = self.packets[REPLY];
        ((v >> 32) as u32, v as u32)
    }

    #[inline]
    pub(super) fn set_unreplied_links(&mut self, prev: u32, next: u32) {
        self.packets[REPLY] = u64::from(prev) << 32 | u64::from(next);
    }

    /// Marks the entry as replied; its reply packet count starts at zero.
    #[inline]
    pub(super) fn mark_replied(&mut self) {
        self.status.set(Status::SEEN_REPLY);
        self.packets[REPLY] = 0;
    }

    /// True when the entry holds an extra allocation (IPv6 with more than three distinct
    /// addresses, tunnel peer included).
    pub(super) fn has_more(&self) -> bool {
        self.more.is_some()
    }

    /// Reads the first and last bytes of what a lookup and an update of this entry use,
    /// and so every cache line of it (see the layout in [`Entry`] and
    /// `Conntrack::prefetch`): the first 73 bytes, the TCP state, the IPv6 places.
    #[inline]
    pub(super) fn touch(&self) -> u64 {
        let tail = match &self.proto_state {
            ProtoState::Tcp(c) => u64::from(c.maxwin[1]),
            _ => 0,
        };
        let v6 = if self.form.has(Form::V6) {
            u64::from(self.places[31])
        } else {
            0
        };
        self.last_seen_ns ^ tail ^ v6
    }

    /// The zone of the connection.
    #[inline]
    pub fn zone(&self) -> u16 {
        self.zone
    }

    /// How long the entry lives after its last packet, given its state.
    #[inline]
    pub fn timeout_ns(&self, t: &Timeouts) -> u64 {
        match &self.proto_state {
            ProtoState::Tcp(c) => {
                let mut timeout = t.tcp(c.state);
                // Data in flight that its receiver never acknowledged: if the peer
                // vanished, nothing will ever acknowledge it (Linux's
                // `tcp_timeout_unacknowledged`).
                if c.unacknowledged() {
                    timeout = timeout.min(t.tcp_unacknowledged_ns);
                }
                // An RST let through without closing the connection: as Linux times the
                // packet of any RST, until the next segment (a live receiver's challenge
                // ACK) brings back the state's timeout.
                if c.reset_kept() {
                    timeout = timeout.min(t.tcp_close_ns);
                }
                // A connection never confirmed by a handshake (a picked-up stray segment,
                // a SYN nobody answered) does not get the long established timeout.
                if !self.status.has(Status::ASSURED) {
                    timeout = timeout.min(t.tcp_unassured_ns);
                }
                timeout
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
            ProtoState::Sctp(c) => t.sctp(c.state),
            ProtoState::Other => t.other_ns,
        }
    }

    /// The time at which the entry expires unless refreshed.
    #[inline]
    pub fn deadline_ns(&self, t: &Timeouts) -> u64 {
        self.last_seen_ns.saturating_add(self.timeout_ns(t))
    }

    /// The time under which the expiry wheel files the entry at `now_ns`: its deadline,
    /// but for TCP no later than [`Timeouts::tcp_unacknowledged_ns`] from now. Data that
    /// becomes unacknowledged brings a TCP entry's deadline down to that much after its
    /// packet, and never lower: filed so, the entry need not move in the wheel when it
    /// does (a request and its answer would otherwise move it every time). The price is
    /// that an idle TCP entry is visited by expiry once per `tcp_unacknowledged_ns`
    /// rather than once per turn of the wheel.
    #[inline]
    pub(super) fn file_ns(&self, t: &Timeouts, now_ns: u64) -> u64 {
        let d = self.deadline_ns(t);
        match self.proto_state {
            ProtoState::Tcp(_) => d.min(now_ns.saturating_add(t.tcp_unacknowledged_ns)),
            _ => d,
        }
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
        proto::TCP | proto::UDP | proto::SCTP => {
            write!(f, " sport={} dport={}", k.src_port, k.dst_port)
        }
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
        let (o, r) = (e.original(), e.reply());
        write!(f, "{} {} {} ", proto_name(o.proto), o.proto, self.secs_left)?;
        if let Some(s) = e.tcp_state() {
            write!(f, "{} ", s.name())?;
        }
        if let ProtoState::Sctp(c) = &e.proto_state {
            write!(f, "{} ", c.state.name())?;
        }
        write_tuple(f, &o)?;
        if !e.status.has(Status::SEEN_REPLY) {
            f.write_str(" [UNREPLIED]")?;
        }
        f.write_str(" ")?;
        write_tuple(f, &r)?;
        if e.status.has(Status::ASSURED) {
            f.write_str(" [ASSURED]")?;
        }
        write!(f, " zone={} mark={}", e.zone(), e.mark)?;
        if e.labels != 0 {
            write!(f, " labels={:#x}", e.labels)?;
        }
        if let Some(p) = e.tunnel_peer() {
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
