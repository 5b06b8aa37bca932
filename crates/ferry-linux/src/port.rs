//! The port abstraction: where frames enter and leave ferry.
//!
//! A [`Port`] moves batches of [`Frame`]s between the kernel and the worker loop without
//! blocking. TAP devices ([`crate::TapPort`]) and AF_PACKET sockets
//! ([`crate::AfPacketPort`]) implement it today; an AF_XDP socket fits the same shape
//! (a readable fd, batched receive into owned buffers, batched send).
//!
//! Offload state travels with every frame as a [`VnetHdr`]. On the wire between ferry and
//! the kernel it is a virtio-net header ([`vnet`]), whose byte order and length depend on
//! the kind of port.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use ferry_datapath::VnetHdr;

/// Received frames at least this long are handed over in the buffer the kernel wrote
/// them into, and a fresh buffer takes its place; shorter ones are copied out, so that
/// a small packet does not hold a buffer sized for 64 KiB.
pub(crate) const HANDOVER_MIN: usize = 8192;

/// The frame in receive buffer `buf` as a buffer of its own (see [`HANDOVER_MIN`]);
/// `buf` is left empty, with room for `capacity` bytes.
pub(crate) fn take_received(buf: &mut Vec<u8>, capacity: usize) -> Vec<u8> {
    if buf.len() >= HANDOVER_MIN {
        std::mem::replace(buf, Vec::with_capacity(capacity))
    } else {
        let frame = buf.as_slice().to_vec();
        buf.clear();
        frame
    }
}

/// One frame in or out of a port, with its offload state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The Ethernet frame, from the destination MAC on.
    pub data: Vec<u8>,
    /// Offload state: GSO request and partial checksum (all zero for a plain frame).
    pub vnet: VnetHdr,
}

/// What a port has counted since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames handed to ferry.
    pub rx_frames: u64,
    /// Bytes of those frames (without virtio-net headers).
    pub rx_bytes: u64,
    /// Frames not handed over: truncated by the kernel, malformed header, read errors.
    pub rx_errors: u64,
    /// Of `rx_errors`, frames the kernel cut short because they did not fit where it
    /// copies them (a ring slot or block, a receive buffer).
    pub rx_truncated: u64,
    /// Frames the kernel took.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames the kernel refused (bad offload header, interface down, no buffer).
    pub tx_errors: u64,
}

impl PortCounters {
    /// Adds `o`'s counts to these (the queues of one port).
    pub fn add(&mut self, o: &PortCounters) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.rx_errors += o.rx_errors;
        self.rx_truncated += o.rx_truncated;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.tx_errors += o.tx_errors;
    }
}

/// A source and sink of frames. One worker polls it for receiving; any worker may send
/// through it (the worker loop serializes them, see [`crate::worker`]).
pub trait Port: Send {
    /// The port's name (the interface it was opened on).
    fn name(&self) -> &str;
    /// The fd to poll for readability.
    fn raw_fd(&self) -> RawFd;
    /// Appends up to `max` received frames to `out` without blocking; returns how many.
    fn recv_batch(&mut self, out: &mut Vec<Frame>, max: usize) -> io::Result<usize>;
    /// Sends frames (in order); returns how many were taken, and removes them from the
    /// front of `frames`. Frames the kernel refuses are counted ([`PortCounters`]) and
    /// taken, not fatal; frames left in `frames` could not be sent without blocking.
    fn send_batch(&mut self, frames: &mut Vec<Frame>) -> io::Result<usize>;
    /// Whether the port passes virtio-net headers (GSO, partial checksums) through.
    fn offloads(&self) -> bool;
    /// What the port has counted.
    fn counters(&self) -> PortCounters;
    /// Hands over the port's further queues, for other workers to receive and send on:
    /// the other sockets of an AF_PACKET fanout group ([`crate::AfPacketConfig::queues`]).
    /// The worker loop takes them once, when it takes the port; later calls return none.
    /// A port of one queue (the default) returns none.
    fn take_queues(&mut self) -> Vec<Box<dyn Port>> {
        Vec::new()
    }
    /// What a next agent needs to take this port (this queue of it) over, and the
    /// descriptor to pass it ([`crate::handover`]); None for a port that cannot be
    /// handed over (the next agent opens its own).
    fn handover(&self) -> Option<(crate::handover::Handed, BorrowedFd<'_>)> {
        None
    }
}

/// The virtio-net header (`struct virtio_net_hdr`, and `virtio_net_hdr_v1` with
/// `num_buffers`) as ports exchange it with the kernel.
///
/// Layout: `flags` u8, `gso_type` u8, then `hdr_len`, `gso_size`, `csum_start`,
/// `csum_offset` as u16 each ([`vnet::LEN`] = 10 bytes), optionally followed by `num_buffers`
/// u16 ([`vnet::LEN_V1`] = 12 bytes), which ferry writes as zero and ignores on read (it only
/// matters to merged receive buffers of a virtio device).
///
/// Byte order of the u16 fields: a TAP uses little endian once `TUNSETVNETLE` is on
/// (ferry always sets it, so the format is the same on every host); an AF_PACKET socket
/// uses the host's order (the kernel's `vio_le()` is the legacy virtio rule: native).
pub mod vnet {
    use super::VnetHdr;

    /// Length of the classic header.
    pub const LEN: usize = 10;
    /// Length of the header with `num_buffers` (virtio 1.0, `virtio_net_hdr_v1`).
    pub const LEN_V1: usize = 12;

    /// Byte order of the header's u16 fields.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Endian {
        /// Little endian (TAP with `TUNSETVNETLE`).
        Little,
        /// The host's order (AF_PACKET).
        Native,
    }

    impl Endian {
        fn get(self, b: [u8; 2]) -> u16 {
            match self {
                Endian::Little => u16::from_le_bytes(b),
                Endian::Native => u16::from_ne_bytes(b),
            }
        }

        fn put(self, v: u16) -> [u8; 2] {
            match self {
                Endian::Little => v.to_le_bytes(),
                Endian::Native => v.to_ne_bytes(),
            }
        }
    }

    /// Reads a header from the first [`LEN`] bytes of `b`; None when `b` is shorter.
    pub fn decode(b: &[u8], endian: Endian) -> Option<VnetHdr> {
        let b = b.get(..LEN)?;
        let u = |i: usize| endian.get([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// Writes `v` into `out` (of [`LEN`] or [`LEN_V1`] bytes; `num_buffers` is zero).
    pub fn encode(v: &VnetHdr, endian: Endian, out: &mut [u8]) {
        out.fill(0);
        out[0] = v.flags;
        out[1] = v.gso_type;
        for (i, f) in [v.hdr_len, v.gso_size, v.csum_start, v.csum_offset]
            .into_iter()
            .enumerate()
        {
            out[2 + 2 * i..4 + 2 * i].copy_from_slice(&endian.put(f));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::vnet::{self, Endian};
    use super::*;

    fn sample() -> VnetHdr {
        VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        }
    }

    #[test]
    fn test_emit_little_endian() {
        let mut b = [0xffu8; vnet::LEN_V1];
        vnet::encode(&sample(), Endian::Little, &mut b);
        assert_eq!(
            b,
            [0x01, 0x81, 66, 0, 0xa8, 0x05, 34, 0, 16, 0, 0, 0],
            "num_buffers is written as zero"
        );
    }

    #[test]
    fn test_parse_round_trip_both_orders_and_lengths() {
        for endian in [Endian::Little, Endian::Native] {
            for len in [vnet::LEN, vnet::LEN_V1] {
                let mut b = vec![0u8; len];
                vnet::encode(&sample(), endian, &mut b);
                assert_eq!(vnet::decode(&b, endian), Some(sample()));
            }
        }
    }

    #[test]
    fn test_large_frames_are_handed_over_small_ones_copied() {
        let mut buf = Vec::with_capacity(70_000);
        buf.extend_from_slice(&[7u8; 100]);
        let small = take_received(&mut buf, 70_000);
        assert_eq!(small, [7u8; 100]);
        assert!(small.capacity() < 1000, "a copy of its own size");
        assert!(
            buf.is_empty() && buf.capacity() >= 70_000,
            "the buffer stays"
        );

        buf.extend_from_slice(&[9u8; HANDOVER_MIN]);
        let at = buf.as_ptr();
        let large = take_received(&mut buf, 70_000);
        assert_eq!(large.len(), HANDOVER_MIN);
        assert_eq!(large.as_ptr(), at, "the receive buffer itself");
        assert!(buf.is_empty() && buf.capacity() >= 70_000, "a fresh buffer");
        assert_ne!(buf.as_ptr(), at);
    }

    #[test]
    fn test_parse_short_header() {
        assert_eq!(vnet::decode(&[0u8; 9], Endian::Little), None);
    }
}
