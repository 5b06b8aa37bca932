//! The uplink as an AF_PACKET socket: a TPACKET_V3 receive ring and batched `sendmmsg`.
//!
//! Set-up, in the order the kernel requires (see packet(7) and the kernel's
//! `Documentation/networking/packet_mmap.rst`):
//!
//! - `PACKET_VNET_HDR` before the ring: every received frame is preceded by a classic
//!   10-byte virtio-net header ([`vnet::LEN`], host byte order), so GSO super-packets and
//!   partial checksums arrive as such; every sent frame starts with one too, so ferry can
//!   send super-packets and let the device (or the kernel) segment them.
//! - `PACKET_VERSION` = TPACKET_V3 and `PACKET_RX_RING`: blocks of variable-length frames,
//!   handed to ferry a whole block at a time, when it is full or when the retire timeout
//!   expires (which bounds the latency a quiet link adds).
//! - `PACKET_QDISC_BYPASS`: sent frames go to the driver directly, skipping the qdisc
//!   (and any tc egress filter), as a NIC's own queue would.
//! - `PACKET_IGNORE_OUTGOING`: frames leaving the device (ferry's own or the host's)
//!   are not looped back into the ring.
//! - bound to the interface for all protocols, with `PACKET_MR_PROMISC` membership, and
//!   optionally in a `PACKET_FANOUT` group (hash mode) so that several workers share one
//!   uplink by flow.
//!
//! Transmit uses `sendmmsg`, not a TX ring: TPACKET_V3 has no TX ring of its own in many
//! kernels (V3 TX was added in 4.11 and is V2's ring with V3 headers), and a copy per
//! frame into the socket is what a TX ring would cost as well for frames ferry builds in
//! its own buffers.
//!
//! With [`AfPacketConfig::drop_kernel_ingress`], the host's stack is kept from also
//! processing the frames ferry takes: see [`crate::tc::IngressDrop`].

use std::ffi::CString;
use std::io;
use std::mem::{offset_of, size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::port::{Frame, Port, PortCounters, vnet};
use crate::tc::IngressDrop;

/// Ring and socket settings of an [`AfPacketPort`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfPacketConfig {
    /// Bytes per ring block: a power-of-two multiple of the page size, larger than the
    /// largest frame (a 64 KiB super-packet plus headers). Default 1 MiB.
    pub block_size: u32,
    /// Blocks in the ring. Default 16 (16 MiB of ring).
    pub block_count: u32,
    /// Nominal frame size: TPACKET_V3 stores frames back to back whatever their size,
    /// but the kernel still checks this divides the block. Default 2048.
    pub frame_size: u32,
    /// A block that is not full is handed over after this many milliseconds. Default 1.
    pub retire_timeout_ms: u32,
    /// Receive frames for any destination MAC (`PACKET_MR_PROMISC`). Default true.
    pub promiscuous: bool,
    /// Install an [`IngressDrop`] on the interface, removed when the port is dropped.
    /// Default false. With fanout, set it on one of the group's sockets only.
    pub drop_kernel_ingress: bool,
    /// Join `PACKET_FANOUT` group with this id in hash mode: every socket of the group
    /// gets whole flows. Default None.
    pub fanout: Option<u16>,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        AfPacketConfig {
            block_size: 1 << 20,
            block_count: 16,
            frame_size: 2048,
            retire_timeout_ms: 1,
            promiscuous: true,
            drop_kernel_ingress: false,
            fanout: None,
        }
    }
}

/// Frames per `sendmmsg` call.
const TX_BATCH: usize = 64;

/// The mapped receive ring. Owned exclusively by its port.
struct Ring {
    base: NonNull<u8>,
    block_size: usize,
    block_count: usize,
}

// SAFETY: the mapping is owned by this value alone and only touched through `&mut` of
// the port that owns it, so moving it to another thread moves all access with it.
unsafe impl Send for Ring {}

impl Ring {
    fn len(&self) -> usize {
        self.block_size * self.block_count
    }

    fn block(&self, i: usize) -> *mut u8 {
        // SAFETY: `i < block_count`, so the offset stays inside the mapping.
        unsafe { self.base.as_ptr().add(i * self.block_size) }
    }

    /// The block's status word, shared with the kernel.
    fn status(&self, i: usize) -> &AtomicU32 {
        let off = offset_of!(libc::tpacket_block_desc, hdr)
            + offset_of!(libc::tpacket_hdr_v1, block_status);
        // SAFETY: the block starts page-aligned, so the u32 at this offset is aligned; the
        // mapping lives as long as `self`, and the kernel only accesses the word
        // atomically-in-effect (single aligned stores), as the ring protocol specifies.
        unsafe { AtomicU32::from_ptr(self.block(i).add(off).cast()) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are exactly what mmap returned; nothing borrows the
        // mapping any more (frames were copied out).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len()) };
    }
}

/// Where reading stopped inside the block being read.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    block: usize,
    open: bool,
    left: u32,
    off: usize,
}

/// An interface opened through an AF_PACKET socket, as a [`Port`].
pub struct AfPacketPort {
    ingress_drop: Option<IngressDrop>,
    ring: Ring,
    fd: OwnedFd,
    name: String,
    cursor: Cursor,
    hdrs: Vec<[u8; vnet::LEN]>,
    counters: PortCounters,
}

impl std::fmt::Debug for AfPacketPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacketPort")
            .field("name", &self.name)
            .field("fd", &self.fd)
            .field("ingress_drop", &self.ingress_drop)
            .finish()
    }
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, val: &T, what: &str) -> io::Result<()> {
    // SAFETY: `val` points at a live value of exactly the length passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            opt,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(rc, what)
}

impl AfPacketPort {
    /// Opens interface `dev` in the calling thread's network namespace (enter it with
    /// [`crate::netns::spawn_in`] first; the port then works from any thread).
    pub fn open(dev: &str, cfg: &AfPacketConfig) -> io::Result<AfPacketPort> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        // A power of two of at least 128 KiB is also a whole number of pages.
        if cfg.block_size < 2 * 65536 || !cfg.block_size.is_power_of_two() {
            return Err(invalid(format!(
                "block_size {} must be a power of two of at least 128 KiB",
                cfg.block_size
            )));
        }
        if cfg.block_count == 0
            || cfg.frame_size < 128
            || !cfg.block_size.is_multiple_of(cfg.frame_size)
        {
            return Err(invalid(format!(
                "block_count {} must be positive and frame_size {} at least 128 and divide block_size",
                cfg.block_count, cfg.frame_size
            )));
        }
        let cname = CString::new(dev).map_err(|_| invalid(format!("interface {dev:?}")))?;
        // SAFETY: `cname` is a NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("interface {dev}: {e}")));
        }
        // Protocol 0: nothing is queued until the socket is bound to the interface.
        // SAFETY: socket() takes no pointers.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        check(raw, "AF_PACKET socket")?;
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        setsockopt(&fd, libc::PACKET_VNET_HDR, &one, "PACKET_VNET_HDR")?;
        let v3 = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(&fd, libc::PACKET_VERSION, &v3, "PACKET_VERSION")?;
        let req = libc::tpacket_req3 {
            tp_block_size: cfg.block_size,
            tp_block_nr: cfg.block_count,
            tp_frame_size: cfg.frame_size,
            tp_frame_nr: cfg.block_size / cfg.frame_size * cfg.block_count,
            tp_retire_blk_tov: cfg.retire_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(&fd, libc::PACKET_RX_RING, &req, "PACKET_RX_RING")?;
        let len = cfg.block_size as usize * cfg.block_count as usize;
        // SAFETY: a fresh shared mapping of the socket's ring; the kernel checks `len`
        // against the ring it set up; the result is checked before use.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mmap of the rx ring: {e}"),
            ));
        }
        let ring = Ring {
            base: NonNull::new(base.cast()).expect("mmap never returns NULL on success"),
            block_size: cfg.block_size as usize,
            block_count: cfg.block_count as usize,
        };
        setsockopt(&fd, libc::PACKET_QDISC_BYPASS, &one, "PACKET_QDISC_BYPASS")?;
        setsockopt(
            &fd,
            libc::PACKET_IGNORE_OUTGOING,
            &one,
            "PACKET_IGNORE_OUTGOING",
        )?;
        // SAFETY: an all-zero sockaddr_ll is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sll` is live for the call and the length is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        check(rc, &format!("bind to {dev}"))?;
        if cfg.promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: ifindex as libc::c_int,
                mr_type: libc::PACKET_MR_PROMISC as u16,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            setsockopt(
                &fd,
                libc::PACKET_ADD_MEMBERSHIP,
                &mreq,
                "PACKET_ADD_MEMBERSHIP",
            )?;
        }
        if let Some(id) = cfg.fanout {
            let arg: libc::c_int = (u32::from(id) | (libc::PACKET_FANOUT_HASH << 16)) as i32;
            setsockopt(&fd, libc::PACKET_FANOUT, &arg, "PACKET_FANOUT")?;
        }
        let ingress_drop = if cfg.drop_kernel_ingress {
            Some(IngressDrop::install(dev)?)
        } else {
            None
        };
        Ok(AfPacketPort {
            ingress_drop,
            ring,
            fd,
            name: dev.to_string(),
            cursor: Cursor::default(),
            hdrs: vec![[0; vnet::LEN]; TX_BATCH],
            counters: PortCounters::default(),
        })
    }

    /// True when an ingress drop filter keeps the host's stack off this interface.
    pub fn drops_kernel_ingress(&self) -> bool {
        self.ingress_drop.is_some()
    }

    /// Copies the frame whose `tpacket3_hdr` is at `off` in block `blk` into `out`;
    /// false (counted) when it is truncated or malformed.
    fn take(&mut self, blk: *const u8, off: usize, out: &mut Vec<Frame>) -> bool {
        let bs = self.ring.block_size;
        if off + size_of::<libc::tpacket3_hdr>() > bs {
            self.counters.rx_errors += 1;
            return false;
        }
        // SAFETY: the header lies inside the block (checked above), which the kernel
        // handed to us (TP_STATUS_USER) and does not write until we return it.
        let h: libc::tpacket3_hdr = unsafe { ptr::read_unaligned(blk.add(off).cast()) };
        let mac = off + usize::from(h.tp_mac);
        let snap = h.tp_snaplen as usize;
        if h.tp_snaplen < h.tp_len || mac < off + vnet::LEN || mac + snap > bs {
            // Truncated (larger than a block) or inconsistent: not a frame to forward.
            self.counters.rx_errors += 1;
            return false;
        }
        // SAFETY: [mac - LEN, mac + snap) lies inside the block (checked above).
        let (hdr, bytes) = unsafe {
            (
                std::slice::from_raw_parts(blk.add(mac - vnet::LEN), vnet::LEN),
                std::slice::from_raw_parts(blk.add(mac), snap),
            )
        };
        let Some(mut v) = vnet::decode(hdr, vnet::Endian::Native) else {
            self.counters.rx_errors += 1;
            return false;
        };
        let mut data = Vec::with_capacity(snap + 4);
        if h.tp_status & libc::TP_STATUS_VLAN_VALID != 0 && snap >= 12 {
            // The device took the 802.1Q tag off into metadata: put it back, so the
            // frame is what was on the wire, and shift the offsets behind it.
            let tpid = if h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                h.hv1.tp_vlan_tpid
            } else {
                0x8100
            };
            data.extend_from_slice(&bytes[..12]);
            data.extend_from_slice(&tpid.to_be_bytes());
            data.extend_from_slice(&(h.hv1.tp_vlan_tci as u16).to_be_bytes());
            data.extend_from_slice(&bytes[12..]);
            if v.needs_csum() {
                v.csum_start += 4;
            }
            if v.hdr_len != 0 {
                v.hdr_len += 4;
            }
        } else {
            data.extend_from_slice(bytes);
        }
        self.counters.rx_frames += 1;
        self.counters.rx_bytes += data.len() as u64;
        out.push(Frame { data, vnet: v });
        true
    }
}

impl Port for AfPacketPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn recv_batch(&mut self, out: &mut Vec<Frame>, max: usize) -> io::Result<usize> {
        let mut got = 0;
        while got < max {
            let b = self.cursor.block;
            let blk = self.ring.block(b);
            if !self.cursor.open {
                if self.ring.status(b).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                    break;
                }
                // SAFETY: the block is ours (TP_STATUS_USER, read with Acquire, so the
                // kernel's writes before it are visible); the descriptor is at its start.
                let d: libc::tpacket_hdr_v1 = unsafe {
                    ptr::read_unaligned(blk.add(offset_of!(libc::tpacket_block_desc, hdr)).cast())
                };
                self.cursor = Cursor {
                    block: b,
                    open: true,
                    left: d.num_pkts,
                    off: d.offset_to_first_pkt as usize,
                };
            }
            while self.cursor.left > 0 && got < max {
                let off = self.cursor.off;
                if self.take(blk, off, out) {
                    got += 1;
                }
                self.cursor.left -= 1;
                if off + size_of::<libc::tpacket3_hdr>() > self.ring.block_size {
                    self.cursor.left = 0;
                    break;
                }
                // SAFETY: the header is inside the block (checked just above).
                let next = unsafe {
                    ptr::read_unaligned(
                        blk.add(off + offset_of!(libc::tpacket3_hdr, tp_next_offset))
                            .cast::<u32>(),
                    )
                };
                self.cursor.off = off + next as usize;
            }
            if self.cursor.left == 0 {
                // Give the block back; its frames were copied out.
                self.ring
                    .status(b)
                    .store(libc::TP_STATUS_KERNEL, Ordering::Release);
                self.cursor = Cursor {
                    block: (b + 1) % self.ring.block_count,
                    ..Cursor::default()
                };
            }
        }
        Ok(got)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>) -> io::Result<usize> {
        let mut taken = 0;
        // SAFETY: all-zero iovec and mmsghdr values are valid (null pointers, lengths 0).
        let mut iov: [libc::iovec; 2 * TX_BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; TX_BATCH] = unsafe { zeroed() };
        while taken < frames.len() {
            let chunk = &frames[taken..frames.len().min(taken + TX_BATCH)];
            for (i, f) in chunk.iter().enumerate() {
                vnet::encode(&f.vnet, vnet::Endian::Native, &mut self.hdrs[i]);
                iov[2 * i] = libc::iovec {
                    iov_base: self.hdrs[i].as_mut_ptr().cast(),
                    iov_len: vnet::LEN,
                };
                iov[2 * i + 1] = libc::iovec {
                    iov_base: f.data.as_ptr() as *mut libc::c_void,
                    iov_len: f.data.len(),
                };
                msgs[i].msg_hdr.msg_iov = &mut iov[2 * i];
                msgs[i].msg_hdr.msg_iovlen = 2;
                msgs[i].msg_len = 0;
            }
            // SAFETY: `msgs[..chunk.len()]` each point at two iovecs in `iov`, which point
            // at `self.hdrs` and the frames' bytes; all outlive the call, and the kernel
            // only reads them (it writes msg_len alone). No address: the bound interface.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    chunk.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc > 0 {
                for f in &chunk[..rc as usize] {
                    self.counters.tx_frames += 1;
                    self.counters.tx_bytes += f.data.len() as u64;
                }
                taken += rc as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => break,
                // The first frame was refused (bad offload header, too long, device
                // down or its queue full): counted, and the rest goes on.
                _ => {
                    self.counters.tx_errors += 1;
                    taken += 1;
                }
            }
        }
        frames.drain(..taken);
        Ok(taken)
    }

    fn offloads(&self) -> bool {
        true
    }

    fn counters(&self) -> PortCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_config_checks() {
        let bad = [
            AfPacketConfig {
                block_size: 65536,
                ..AfPacketConfig::default()
            },
            AfPacketConfig {
                block_size: 3 << 17,
                ..AfPacketConfig::default()
            },
            AfPacketConfig {
                block_count: 0,
                ..AfPacketConfig::default()
            },
            AfPacketConfig {
                frame_size: 3000,
                ..AfPacketConfig::default()
            },
        ];
        for c in bad {
            let e = AfPacketPort::open("lo", &c).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{c:?}");
        }
        let e = AfPacketPort::open("ferrynosuchdev", &AfPacketConfig::default()).unwrap_err();
        assert!(e.to_string().contains("ferrynosuchdev"), "{e}");
    }
}
