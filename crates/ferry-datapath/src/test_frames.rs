//! Frames the tests send, written from address strings: UDP of either family with the
//! default IP options, TCP segments through a small builder (so that a test names only
//! what it sets), and the inner frame of a VXLAN packet.

use std::net::IpAddr;

use crate::wire::build::{self, IpOpts};
use crate::wire::parse;

/// An address of either family, written as a test writes it.
pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A UDP datagram from `src`:`sport` to `dst`:`dport` with the default IP options.
pub(crate) fn udp(src: &str, dst: &str, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    build::udp(ip(src), ip(dst), sport, dport, payload, &IpOpts::default())
}

/// A TCP segment being built: sequence 1, acknowledgement 0, no flags and the default IP
/// options until set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tcp<'a> {
    src: &'a str,
    dst: &'a str,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    opts: IpOpts,
}

/// A TCP segment from `src`:`sport` to `dst`:`dport`; see [`Tcp`].
pub(crate) fn tcp<'a>(src: &'a str, dst: &'a str, sport: u16, dport: u16) -> Tcp<'a> {
    Tcp {
        src,
        dst,
        sport,
        dport,
        seq: 1,
        ack: 0,
        flags: 0,
        opts: IpOpts::default(),
    }
}

impl Tcp<'_> {
    /// Its sequence and acknowledgement numbers.
    pub(crate) fn seq(self, seq: u32, ack: u32) -> Self {
        Tcp { seq, ack, ..self }
    }

    /// Its flags (`wire::build::tcp_flags`).
    pub(crate) fn flags(self, flags: u8) -> Self {
        Tcp { flags, ..self }
    }

    /// Its IP and Ethernet options.
    pub(crate) fn opts(self, opts: &IpOpts) -> Self {
        Tcp {
            opts: *opts,
            ..self
        }
    }

    /// The frame, carrying `payload`.
    pub(crate) fn frame(&self, payload: &[u8]) -> Vec<u8> {
        build::tcp(
            ip(self.src),
            ip(self.dst),
            self.sport,
            self.dport,
            self.seq,
            self.ack,
            self.flags,
            payload,
            &self.opts,
        )
    }
}
/// The inner frame of a VXLAN packet (over IPv4 or IPv6 UDP to port 4789).
pub(crate) fn vxlan_inner(frame: &[u8]) -> &[u8] {
    let o = parse(frame, 0).unwrap();
    assert_eq!(o.key.dst_port, 4789, "not VXLAN: {:?}", o.key);
    &frame[o.l4_off + 16..]
}
