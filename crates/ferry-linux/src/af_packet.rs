//! The uplink as an AF_PACKET socket: a receive ring (or plain `recvmmsg`) and batched
//! `sendmmsg`.
//!
//! Set-up, in the order the kernel requires (see packet(7) and the kernel's
//! `Documentation/networking/packet_mmap.rst`):
//!
//! - `PACKET_VNET_HDR` before the ring: every received frame is preceded by a classic
//!   10-byte virtio-net header ([`vnet::LEN`], host byte order), so GSO super-packets and
//!   partial checksums arrive as such; every sent frame starts with one too, so ferry can
//!   send super-packets and let the device (or the kernel) segment them.
//! - the receive path, one of three ([`RxMode`]; `docs/benchmarks.md` has the figures):
//!   - [`RxMode::Copy`] (the default): no ring; `recvmmsg` copies each frame (with its
//!     virtio-net header, and its VLAN tag through `PACKET_AUXDATA`) into ferry's buffers,
//!     up to 64 frames per system call. The socket is readable as soon as one frame is
//!     queued, so a lone packet waits for nothing, and frames of any size up to a 64 KiB
//!     super-packet arrive whole. The queue is bounded in bytes (the socket's receive
//!     buffer, sized like a ring with `SO_RCVBUFFORCE`), so a burst of small frames fits.
//!   - [`RxMode::FrameRing`]: `PACKET_VERSION` = TPACKET_V2 and `PACKET_RX_RING`, a ring
//!     of fixed-size slots, one frame each, each with its own status word: the kernel
//!     hands a frame over as soon as it has written it, with no system call to read it.
//!     But a slot must hold the largest frame, a 64 KiB GSO super-packet plus the slot's
//!     header and the virtio-net header ([`DEFAULT_SLOT_SIZE`]), so 16 MiB of ring is 240
//!     slots, which a burst of 1500-byte frames overflows (the kernel drops; TCP through
//!     the two-node benchmark retransmitted tens of thousands of segments). A frame that
//!     does not fit its slot arrives cut short (`tp_snaplen < tp_len`) and is counted
//!     ([`PortCounters::rx_truncated`]), not forwarded.
//!   - [`RxMode::BlockRing`]: TPACKET_V3, blocks of variable-length frames handed over a
//!     whole block at a time, when it is full or when its retire timeout expires: dense
//!     (many small frames per block) but a lone packet waits up to the timeout (at least
//!     1 ms) at every node it enters. The block being filled is never read: nothing says
//!     which of its frames are complete.
//! - `PACKET_QDISC_BYPASS`: sent frames go to the driver directly, skipping the qdisc
//!   (and any tc egress filter), as a NIC's own queue would.
//! - `PACKET_IGNORE_OUTGOING`: frames leaving the device (ferry's own or the host's)
//!   are not looped back into the ring.
//! - bound to the interface for all protocols, with `PACKET_MR_PROMISC` membership, and
//!   optionally in a `PACKET_FANOUT` group (hash mode) so that several workers share one
//!   uplink by flow.
//!
//! The ring paths copy a frame once more, out of the ring into the [`Frame`] handed to
//! the worker, so a ring slot is given back at once. [`RxMode::Copy`] receives each
//! frame into a buffer of its own (the virtio-net header into another, through a second
//! iovec): a large frame (a super-packet) is handed to the worker in that buffer, and a
//! fresh one takes its place; a small one is copied out, so that it does not hold 64
//! KiB (see `port::HANDOVER_MIN`).
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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::port::{Frame, Port, PortCounters, take_received, vnet};
use crate::tc::IngressDrop;

/// How an [`AfPacketPort`] receives (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RxMode {
    /// TPACKET_V2: a ring of [`AfPacketConfig::slot_size`] slots, handed over frame by
    /// frame; few slots for the memory, so bursts overflow it.
    FrameRing,
    /// TPACKET_V3: a ring of blocks handed over when full or after
    /// [`AfPacketConfig::retire_timeout_ms`].
    BlockRing,
    /// `recvmmsg` into ferry's buffers, no ring: frame by frame, whole, and bounded in
    /// bytes rather than frames.
    #[default]
    Copy,
}

/// Default [`AfPacketConfig::slot_size`]: 15 slots per 1 MiB block, each with room for the
/// slot header, the virtio-net header and a 64 KiB super-packet with its Ethernet header.
pub const DEFAULT_SLOT_SIZE: u32 = 69_904;

/// Ring and socket settings of an [`AfPacketPort`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfPacketConfig {
    /// How frames are received. Default [`RxMode::Copy`].
    pub rx_mode: RxMode,
    /// Bytes per ring block: a power-of-two multiple of the page size, larger than the
    /// largest frame (a 64 KiB super-packet plus headers). Default 1 MiB. With
    /// [`RxMode::Copy`], `block_size * block_count` is the socket's receive buffer.
    pub block_size: u32,
    /// Blocks in the ring. Default 16 (16 MiB of ring).
    pub block_count: u32,
    /// Nominal frame size of [`RxMode::BlockRing`]: TPACKET_V3 stores frames back to back
    /// whatever their size, but the kernel still checks this divides the block.
    /// Default 2048.
    pub frame_size: u32,
    /// Bytes per slot of [`RxMode::FrameRing`] (a multiple of 16, at most `block_size`;
    /// `block_size / slot_size` slots per block): a frame longer than the slot minus its
    /// headers is cut short by the kernel and dropped (counted). Default
    /// [`DEFAULT_SLOT_SIZE`] (240 slots with the default blocks).
    pub slot_size: u32,
    /// [`RxMode::BlockRing`]: a block that is not full is handed over after this many
    /// milliseconds. Default 1.
    pub retire_timeout_ms: u32,
    /// Receive frames for any destination MAC (`PACKET_MR_PROMISC`). Default true.
    pub promiscuous: bool,
    /// Install an [`IngressDrop`] on the interface, removed when the port is dropped.
    /// Default false. With fanout, set it on one of the group's sockets only.
    pub drop_kernel_ingress: bool,
    /// Join `PACKET_FANOUT` group with this id in hash mode: every socket of the group
    /// gets whole flows. Default None.
    pub fanout: Option<u16>,
    /// Sockets to open, all in one fanout group (the `fanout` id, or one made from the
    /// process id when it is None): one per worker. The first is the port; the others
    /// are its further queues ([`crate::Port::take_queues`]), opened with it so that
    /// they are in the same network namespace. Only the first gets the ingress drop
    /// filter. Default 1 (one socket, no group unless `fanout` says so).
    pub queues: u16,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        AfPacketConfig {
            rx_mode: RxMode::default(),
            block_size: 1 << 20,
            block_count: 16,
            frame_size: 2048,
            slot_size: DEFAULT_SLOT_SIZE,
            retire_timeout_ms: 1,
            promiscuous: true,
            drop_kernel_ingress: false,
            fanout: None,
            queues: 1,
        }
    }
}

/// Frames per `sendmmsg` call.
const TX_BATCH: usize = 64;
/// Frames per `recvmmsg` call of [`RxMode::Copy`].
const COPY_BATCH: usize = 64;
/// Bytes per receive buffer of [`RxMode::Copy`] (the virtio-net header goes to a buffer
/// of its own): a 64 KiB super-packet, its Ethernet header and a VLAN tag, with room
/// to spare.
const COPY_BUF_LEN: usize = 65_536 + 64;
/// Control buffer per message of [`RxMode::Copy`], for one `tpacket_auxdata`
/// (`CMSG_SPACE(20)` is 40 bytes on 64-bit hosts); u64 words keep it aligned.
const COPY_CTRL_WORDS: usize = 8;

/// A mapped receive ring. Owned exclusively by its port.
struct Ring {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and only touched through `&mut` of
// the port that owns it, so moving it to another thread moves all access with it.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps the ring the kernel set up for `fd` (`len` bytes).
    fn map(fd: &OwnedFd, len: usize) -> io::Result<Ring> {
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
        Ok(Ring {
            base: NonNull::new(base.cast()).expect("mmap never returns NULL on success"),
            len,
        })
    }

    /// The byte at `off`; callers keep `off < len`.
    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.len);
        // SAFETY: `off < len` (callers' invariant), so the pointer stays in the mapping.
        unsafe { self.base.as_ptr().add(off) }
    }

    /// The status word at `off`, shared with the kernel; callers pass a 4-byte aligned
    /// offset with 4 bytes of ring behind it.
    fn status(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: blocks and slots start 16-byte aligned and status words sit at aligned
        // offsets in them, inside the mapping (callers' invariant); the mapping lives as
        // long as `self`, and the kernel only writes the word with single aligned stores
        // (with barriers), as the ring protocol specifies.
        unsafe { AtomicU32::from_ptr(self.at(off).cast()) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are exactly what mmap returned; nothing borrows the
        // mapping any more (frames were copied out).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Where reading stopped inside the TPACKET_V3 block being read.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    block: usize,
    open: bool,
    left: u32,
    off: usize,
}

/// The receive side, per [`RxMode`].
enum Rx {
    Blocks {
        ring: Ring,
        block_size: usize,
        block_count: usize,
        cursor: Cursor,
    },
    Frames {
        ring: Ring,
        slots: Slots,
        next: usize,
    },
    Copy {
        /// Per message: the virtio-net header, and the frame's buffer (handed over
        /// with a large frame, see [`take_received`]).
        hdrs: Vec<[u8; vnet::LEN]>,
        bufs: Vec<Vec<u8>>,
        ctrl: Vec<[u64; COPY_CTRL_WORDS]>,
    },
}

/// An interface opened through an AF_PACKET socket, as a [`Port`].
pub struct AfPacketPort {
    ingress_drop: Option<IngressDrop>,
    /// The other sockets of the fanout group, until the worker takes them.
    queues: Vec<AfPacketPort>,
    rx: Rx,
    fd: OwnedFd,
    name: String,
    hdrs: Vec<[u8; vnet::LEN]>,
    counters: PortCounters,
    /// The device was deleted: every receive and send says so ([`AfPacketPort::gone_error`]).
    gone: bool,
}

impl std::fmt::Debug for AfPacketPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacketPort")
            .field("name", &self.name)
            .field("fd", &self.fd)
            .field("rx_mode", &self.rx_mode())
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

fn setsockopt_at<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: &T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: `val` points at a live value of exactly the length passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(rc, what)
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, val: &T, what: &str) -> io::Result<()> {
    setsockopt_at(fd, libc::SOL_PACKET, opt, val, what)
}

/// A VLAN tag the device took off into metadata: TPID and TCI.
type Vlan = Option<(u16, u16)>;

/// The tag described by a frame's status word and tag fields (ring header or auxdata).
fn vlan_of(status: u32, tci: u16, tpid: u16) -> Vlan {
    if status & libc::TP_STATUS_VLAN_VALID == 0 {
        return None;
    }
    let tpid = if status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
        tpid
    } else {
        0x8100
    };
    Some((tpid, tci))
}

/// Copies a received frame (`hdr` its virtio-net header, `bytes` from the destination MAC
/// on) into `out`, with its VLAN tag put back; false (counted) when the header is bad.
fn deliver(
    counters: &mut PortCounters,
    hdr: &[u8],
    bytes: &[u8],
    vlan: Vlan,
    out: &mut Vec<Frame>,
) -> bool {
    let Some(mut v) = vnet::decode(hdr, vnet::Endian::Native) else {
        counters.rx_errors += 1;
        return false;
    };
    let mut data = Vec::with_capacity(bytes.len() + 4);
    match vlan {
        Some((tpid, tci)) if bytes.len() >= 12 => {
            // The device took the 802.1Q tag off into metadata: put it back, so the
            // frame is what was on the wire, and shift the offsets behind it.
            data.extend_from_slice(&bytes[..12]);
            data.extend_from_slice(&tpid.to_be_bytes());
            data.extend_from_slice(&tci.to_be_bytes());
            data.extend_from_slice(&bytes[12..]);
            if v.needs_csum() {
                v.csum_start += 4;
            }
            if v.hdr_len != 0 {
                v.hdr_len += 4;
            }
        }
        _ => data.extend_from_slice(bytes),
    }
    counters.rx_frames += 1;
    counters.rx_bytes += data.len() as u64;
    out.push(Frame { data, vnet: v });
    true
}

impl AfPacketPort {
    /// Opens interface `dev` in the calling thread's network namespace (enter it with
    /// [`crate::netns::spawn_in`] first; the port then works from any thread).
    pub fn open(dev: &str, cfg: &AfPacketConfig) -> io::Result<AfPacketPort> {
        if cfg.queues == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queues must be at least 1",
            ));
        }
        if cfg.queues == 1 {
            return AfPacketPort::open_one(dev, cfg);
        }
        let cfg = AfPacketConfig {
            fanout: Some(cfg.fanout.unwrap_or(std::process::id() as u16)),
            ..cfg.clone()
        };
        let mut port = AfPacketPort::open_one(dev, &cfg)?;
        let sibling = AfPacketConfig {
            drop_kernel_ingress: false,
            ..cfg.clone()
        };
        for _ in 1..cfg.queues {
            port.queues.push(AfPacketPort::open_one(dev, &sibling)?);
        }
        Ok(port)
    }

    fn open_one(dev: &str, cfg: &AfPacketConfig) -> io::Result<AfPacketPort> {
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
        if cfg.slot_size < 128
            || cfg.slot_size > cfg.block_size
            || !(cfg.slot_size as usize).is_multiple_of(libc::TPACKET_ALIGNMENT)
        {
            return Err(invalid(format!(
                "slot_size {} must be a multiple of 16 between 128 and block_size",
                cfg.slot_size
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
        let rx = Self::set_up_rx(&fd, cfg)?;
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
            queues: Vec::new(),
            rx,
            fd,
            name: dev.to_string(),
            hdrs: vec![[0; vnet::LEN]; TX_BATCH],
            counters: PortCounters::default(),
            gone: false,
        })
    }

    /// Takes over an AF_PACKET socket bound to `dev` that another process set up for
    /// [`RxMode::Copy`] and passed on ([`crate::handover`]), with the further sockets of
    /// its fanout group in `queues`: their options and bindings stay as they were, only
    /// this process's buffers are made. With `drop_kernel_ingress`, the ingress drop
    /// filter on `dev` (the other process's, left in place) is taken over.
    pub fn adopt(
        fd: OwnedFd,
        dev: &str,
        drop_kernel_ingress: bool,
        queues: Vec<OwnedFd>,
    ) -> io::Result<AfPacketPort> {
        let one = |fd: OwnedFd, ingress_drop: Option<IngressDrop>| AfPacketPort {
            ingress_drop,
            queues: Vec::new(),
            rx: Rx::Copy {
                hdrs: vec![[0; vnet::LEN]; COPY_BATCH],
                bufs: (0..COPY_BATCH)
                    .map(|_| Vec::with_capacity(COPY_BUF_LEN))
                    .collect(),
                ctrl: vec![[0; COPY_CTRL_WORDS]; COPY_BATCH],
            },
            fd,
            name: dev.to_string(),
            hdrs: vec![[0; vnet::LEN]; TX_BATCH],
            counters: PortCounters::default(),
            gone: false,
        };
        let ingress_drop = if drop_kernel_ingress {
            Some(IngressDrop::install(dev)?)
        } else {
            None
        };
        let mut port = one(fd, ingress_drop);
        port.queues = queues.into_iter().map(|q| one(q, None)).collect();
        Ok(port)
    }

    /// The error for a port whose device was deleted: of kind `NotFound`, which tells
    /// the worker that the port is gone for good (see `worker`'s "Leaving").
    fn gone_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: the device is gone", self.name),
        )
    }

    /// Called with an error of the socket: if the device it is bound to was deleted (the
    /// kernel then sets the socket's interface index to -1, and nothing ever arrives or
    /// leaves again), marks the port gone and says so; otherwise returns `e`.
    fn check_gone(&mut self, e: io::Error) -> io::Error {
        if self.gone {
            return self.gone_error();
        }
        let fd = self.fd.as_raw_fd();
        // A deletion takes the device down first (the ENETDOWN that woke the port) and
        // unregisters it after: wait for that before looking, as nothing wakes the port
        // again once it is done.
        let gone = bound_device_gone(fd)
            || (e.raw_os_error() == Some(libc::ENETDOWN) && {
                wait_for_device_changes(fd, &self.name);
                bound_device_gone(fd)
            });
        if !gone {
            return e;
        }
        self.gone = true;
        self.gone_error()
    }

    /// Sets up the receive side of `cfg.rx_mode` (after `PACKET_VNET_HDR`, before bind).
    fn set_up_rx(fd: &OwnedFd, cfg: &AfPacketConfig) -> io::Result<Rx> {
        let block_size = cfg.block_size as usize;
        let block_count = cfg.block_count as usize;
        match cfg.rx_mode {
            RxMode::BlockRing => {
                let v3 = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
                setsockopt(fd, libc::PACKET_VERSION, &v3, "PACKET_VERSION")?;
                let req = libc::tpacket_req3 {
                    tp_block_size: cfg.block_size,
                    tp_block_nr: cfg.block_count,
                    tp_frame_size: cfg.frame_size,
                    tp_frame_nr: cfg.block_size / cfg.frame_size * cfg.block_count,
                    tp_retire_blk_tov: cfg.retire_timeout_ms,
                    tp_sizeof_priv: 0,
                    tp_feature_req_word: 0,
                };
                setsockopt(fd, libc::PACKET_RX_RING, &req, "PACKET_RX_RING")?;
                Ok(Rx::Blocks {
                    ring: Ring::map(fd, block_size * block_count)?,
                    block_size,
                    block_count,
                    cursor: Cursor::default(),
                })
            }
            RxMode::FrameRing => {
                let v2 = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
                setsockopt(fd, libc::PACKET_VERSION, &v2, "PACKET_VERSION")?;
                let per_block = cfg.block_size / cfg.slot_size;
                let req = libc::tpacket_req {
                    tp_block_size: cfg.block_size,
                    tp_block_nr: cfg.block_count,
                    tp_frame_size: cfg.slot_size,
                    tp_frame_nr: per_block * cfg.block_count,
                };
                setsockopt(fd, libc::PACKET_RX_RING, &req, "PACKET_RX_RING")?;
                Ok(Rx::Frames {
                    ring: Ring::map(fd, block_size * block_count)?,
                    slots: Slots {
                        block_size,
                        per_block: per_block as usize,
                        slot_size: cfg.slot_size as usize,
                        slots: per_block as usize * block_count,
                    },
                    next: 0,
                })
            }
            RxMode::Copy => {
                let one: libc::c_int = 1;
                setsockopt(fd, libc::PACKET_AUXDATA, &one, "PACKET_AUXDATA")?;
                // As much queued as a ring would hold; without CAP_NET_ADMIN, what the
                // sysctl net.core.rmem_max allows.
                let bytes = (block_size * block_count).min(i32::MAX as usize / 2) as libc::c_int;
                let what = "SO_RCVBUF";
                setsockopt_at(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &bytes, what).or_else(
                    |_| setsockopt_at(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &bytes, what),
                )?;
                Ok(Rx::Copy {
                    hdrs: vec![[0; vnet::LEN]; COPY_BATCH],
                    bufs: (0..COPY_BATCH)
                        .map(|_| Vec::with_capacity(COPY_BUF_LEN))
                        .collect(),
                    ctrl: vec![[0; COPY_CTRL_WORDS]; COPY_BATCH],
                })
            }
        }
    }

    /// True when an ingress drop filter keeps the host's stack off this interface.
    pub fn drops_kernel_ingress(&self) -> bool {
        self.ingress_drop.is_some()
    }

    /// How this port receives.
    pub fn rx_mode(&self) -> RxMode {
        match self.rx {
            Rx::Blocks { .. } => RxMode::BlockRing,
            Rx::Frames { .. } => RxMode::FrameRing,
            Rx::Copy { .. } => RxMode::Copy,
        }
    }
}

/// Copies the frame whose `tpacket3_hdr` is at `off` in the block at `blk` (of
/// `block_size` bytes) into `out`; false (counted) when it is truncated or malformed.
fn take_v3(
    counters: &mut PortCounters,
    blk: *const u8,
    block_size: usize,
    off: usize,
    out: &mut Vec<Frame>,
) -> bool {
    if off + size_of::<libc::tpacket3_hdr>() > block_size {
        counters.rx_errors += 1;
        return false;
    }
    // SAFETY: the header lies inside the block (checked above), which the kernel
    // handed to us (TP_STATUS_USER) and does not write until we return it.
    let h: libc::tpacket3_hdr = unsafe { ptr::read_unaligned(blk.add(off).cast()) };
    let mac = off + usize::from(h.tp_mac);
    let snap = h.tp_snaplen as usize;
    if h.tp_snaplen < h.tp_len {
        // Larger than a block: not a frame to forward.
        counters.rx_errors += 1;
        counters.rx_truncated += 1;
        return false;
    }
    if mac < off + vnet::LEN || mac + snap > block_size {
        counters.rx_errors += 1;
        return false;
    }
    // SAFETY: [mac - LEN, mac + snap) lies inside the block (checked above).
    let (hdr, bytes) = unsafe {
        (
            std::slice::from_raw_parts(blk.add(mac - vnet::LEN), vnet::LEN),
            std::slice::from_raw_parts(blk.add(mac), snap),
        )
    };
    let vlan = vlan_of(h.tp_status, h.hv1.tp_vlan_tci as u16, h.hv1.tp_vlan_tpid);
    deliver(counters, hdr, bytes, vlan, out)
}

/// Copies the frame in the TPACKET_V2 slot at `slot` (of `slot_size` bytes, ours) into
/// `out`; false (counted) when it is truncated or malformed.
fn take_v2(
    counters: &mut PortCounters,
    slot: *const u8,
    slot_size: usize,
    out: &mut Vec<Frame>,
) -> bool {
    // SAFETY: the slot is at least 128 bytes (checked at open), more than the header, and
    // the kernel handed it to us (TP_STATUS_USER) and does not write it until we return it.
    let h: libc::tpacket2_hdr = unsafe { ptr::read_unaligned(slot.cast()) };
    let mac = usize::from(h.tp_mac);
    let snap = h.tp_snaplen as usize;
    if h.tp_snaplen < h.tp_len {
        // Longer than a slot holds: cut short by the kernel, not a frame to forward.
        counters.rx_errors += 1;
        counters.rx_truncated += 1;
        return false;
    }
    if mac < size_of::<libc::tpacket2_hdr>() + vnet::LEN || mac + snap > slot_size {
        counters.rx_errors += 1;
        return false;
    }
    // SAFETY: [mac - LEN, mac + snap) lies inside the slot (checked above).
    let (hdr, bytes) = unsafe {
        (
            std::slice::from_raw_parts(slot.add(mac - vnet::LEN), vnet::LEN),
            std::slice::from_raw_parts(slot.add(mac), snap),
        )
    };
    let vlan = vlan_of(h.tp_status, h.tp_vlan_tci, h.tp_vlan_tpid);
    deliver(counters, hdr, bytes, vlan, out)
}

/// Reads TPACKET_V3 blocks the kernel has handed over, from where `cursor` stopped.
fn recv_blocks(
    ring: &Ring,
    block_size: usize,
    block_count: usize,
    cursor: &mut Cursor,
    counters: &mut PortCounters,
    out: &mut Vec<Frame>,
    max: usize,
) -> usize {
    let mut got = 0;
    while got < max {
        let b = cursor.block;
        let status_off = b * block_size
            + offset_of!(libc::tpacket_block_desc, hdr)
            + offset_of!(libc::tpacket_hdr_v1, block_status);
        let blk = ring.at(b * block_size);
        if !cursor.open {
            if ring.status(status_off).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the block is ours (TP_STATUS_USER, read with Acquire, so the
            // kernel's writes before it are visible); the descriptor is at its start.
            let d: libc::tpacket_hdr_v1 = unsafe {
                ptr::read_unaligned(blk.add(offset_of!(libc::tpacket_block_desc, hdr)).cast())
            };
            *cursor = Cursor {
                block: b,
                open: true,
                left: d.num_pkts,
                off: d.offset_to_first_pkt as usize,
            };
        }
        while cursor.left > 0 && got < max {
            let off = cursor.off;
            if take_v3(counters, blk, block_size, off, out) {
                got += 1;
            }
            cursor.left -= 1;
            if off + size_of::<libc::tpacket3_hdr>() > block_size {
                cursor.left = 0;
                break;
            }
            // SAFETY: the header is inside the block (checked just above).
            let next = unsafe {
                ptr::read_unaligned(
                    blk.add(off + offset_of!(libc::tpacket3_hdr, tp_next_offset))
                        .cast::<u32>(),
                )
            };
            cursor.off = off + next as usize;
        }
        if cursor.left == 0 {
            // Give the block back; its frames were copied out.
            ring.status(status_off)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            *cursor = Cursor {
                block: (b + 1) % block_count,
                ..Cursor::default()
            };
        }
    }
    got
}

/// The geometry of a TPACKET_V2 ring: where slot `i` starts.
#[derive(Clone, Copy)]
struct Slots {
    block_size: usize,
    per_block: usize,
    slot_size: usize,
    slots: usize,
}

impl Slots {
    fn offset(&self, i: usize) -> usize {
        (i / self.per_block) * self.block_size + (i % self.per_block) * self.slot_size
    }
}

/// Reads the TPACKET_V2 slots the kernel has handed over, from slot `next` on, giving
/// each back once copied.
fn recv_frames(
    ring: &Ring,
    geometry: Slots,
    next: &mut usize,
    counters: &mut PortCounters,
    out: &mut Vec<Frame>,
    max: usize,
) -> usize {
    let mut got = 0;
    // At most one lap: the kernel can refill slots while we read.
    for _ in 0..geometry.slots {
        if got == max {
            break;
        }
        let off = geometry.offset(*next);
        // tp_status is the slot header's first word.
        let status = ring.status(off);
        if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            break;
        }
        if take_v2(counters, ring.at(off), geometry.slot_size, out) {
            got += 1;
        }
        status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
        *next = (*next + 1) % geometry.slots;
    }
    got
}

/// The VLAN tag in a received message's `PACKET_AUXDATA`, if any.
fn aux_vlan(m: &libc::msghdr) -> Vlan {
    // SAFETY: `m` is a message the kernel filled in: `msg_control` points at our control
    // buffer and `msg_controllen` says how much of it holds control messages; the CMSG
    // macros stay within that length.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return a header inside the buffer, or null.
        let cm = unsafe { ptr::read_unaligned(c) };
        // SAFETY: CMSG_LEN takes no pointers.
        let want = unsafe { libc::CMSG_LEN(size_of::<libc::tpacket_auxdata>() as u32) };
        if cm.cmsg_level == libc::SOL_PACKET
            && cm.cmsg_type == libc::PACKET_AUXDATA
            && cm.cmsg_len >= want as usize
        {
            // SAFETY: the message's length covers a whole tpacket_auxdata (checked above).
            let a: libc::tpacket_auxdata =
                unsafe { ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
            return vlan_of(a.tp_status, a.tp_vlan_tci, a.tp_vlan_tpid);
        }
        // SAFETY: as for CMSG_FIRSTHDR; `c` is a header of this message.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
    None
}

/// Receives with `recvmmsg`, each message's virtio-net header into `hdrs` and its frame
/// into `bufs` (each with room for [`COPY_BUF_LEN`] bytes); a large frame is handed over
/// in its buffer ([`take_received`]).
fn recv_copy(
    fd: RawFd,
    hdrs: &mut [[u8; vnet::LEN]],
    bufs: &mut [Vec<u8>],
    ctrl: &mut [[u64; COPY_CTRL_WORDS]],
    counters: &mut PortCounters,
    out: &mut Vec<Frame>,
    max: usize,
) -> io::Result<usize> {
    let mut got = 0;
    // Frames the kernel drops in recvmsg itself (an offload state a virtio-net header
    // cannot describe: EINVAL) are skipped, a bounded number per call.
    let mut skips = COPY_BATCH;
    // SAFETY: all-zero iovec and mmsghdr values are valid (null pointers, lengths 0).
    let mut iov: [[libc::iovec; 2]; COPY_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; COPY_BATCH] = unsafe { zeroed() };
    while got < max {
        let n = (max - got).min(COPY_BATCH);
        for i in 0..n {
            bufs[i].clear();
            let spare = bufs[i].spare_capacity_mut();
            iov[i] = [
                libc::iovec {
                    iov_base: hdrs[i].as_mut_ptr().cast(),
                    iov_len: vnet::LEN,
                },
                libc::iovec {
                    iov_base: spare.as_mut_ptr().cast(),
                    iov_len: spare.len().min(COPY_BUF_LEN),
                },
            ];
            msgs[i] = libc::mmsghdr {
                // SAFETY: an all-zero msghdr is valid (no name, no buffers).
                msg_hdr: unsafe { zeroed() },
                msg_len: 0,
            };
            msgs[i].msg_hdr.msg_iov = iov[i].as_mut_ptr();
            msgs[i].msg_hdr.msg_iovlen = 2;
            msgs[i].msg_hdr.msg_control = ctrl[i].as_mut_ptr().cast();
            msgs[i].msg_hdr.msg_controllen = size_of::<[u64; COPY_CTRL_WORDS]>();
        }
        // SAFETY: `msgs[..n]` each point at their two iovecs of `iov`: their header of
        // `hdrs` and at most COPY_BUF_LEN bytes of spare capacity of their buffer of
        // `bufs` (none of which moves or is touched before the call returns), and at
        // their own control buffer of `ctrl`, with their lengths; all outlive the call.
        // No timeout (MSG_DONTWAIT).
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => break,
                io::ErrorKind::Interrupted => continue,
                _ if e.raw_os_error() == Some(libc::EINVAL) && skips > 0 => {
                    counters.rx_errors += 1;
                    skips -= 1;
                    continue;
                }
                _ => {
                    counters.rx_errors += 1;
                    if got == 0 {
                        return Err(e);
                    }
                    break;
                }
            }
        }
        let rc = rc as usize;
        for (i, m) in msgs[..rc].iter().enumerate() {
            let len = m.msg_len as usize;
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                counters.rx_errors += 1;
                counters.rx_truncated += 1;
                continue;
            }
            if !(vnet::LEN..=vnet::LEN + COPY_BUF_LEN).contains(&len) {
                counters.rx_errors += 1;
                continue;
            }
            // SAFETY: the kernel wrote `len` bytes across the two iovecs: the header's
            // vnet::LEN, then `len - vnet::LEN` (at most the iovec's length, checked
            // above against COPY_BUF_LEN and the spare capacity it was given) into the
            // buffer's spare capacity.
            unsafe { bufs[i].set_len(len - vnet::LEN) };
            let vlan = aux_vlan(&m.msg_hdr);
            let delivered = if vlan.is_some() {
                // The tag goes back in: a copy (see deliver).
                deliver(counters, &hdrs[i], &bufs[i], vlan, out)
            } else {
                deliver_owned(counters, &hdrs[i], &mut bufs[i], out)
            };
            if delivered {
                got += 1;
            }
        }
        if rc < n {
            break;
        }
    }
    Ok(got)
}

/// What a ring receive of `got` frames reports. A ring never reads the socket, so an
/// error the kernel set on it (ENETDOWN when the device went down) would stay and make
/// poll report POLLERR at once forever; with nothing in the ring it is taken (which
/// clears it) and reported once, as the copy mode's `recvmmsg` does.
fn ring_result(fd: RawFd, got: usize, counters: &mut PortCounters) -> io::Result<usize> {
    if got > 0 {
        return Ok(got);
    }
    match take_socket_error(fd) {
        Ok(None) => Ok(0),
        Ok(Some(e)) | Err(e) => {
            counters.rx_errors += 1;
            Err(e)
        }
    }
}

/// Whether the device the packet socket `fd` was bound to was deleted: the kernel then
/// sets the socket's interface index, which getsockname reports, to -1.
fn bound_device_gone(fd: RawFd) -> bool {
    // SAFETY: an all-zero sockaddr_ll is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `sll` and `len` are valid for writes and outlive the call; `len` holds the
    // size of `sll`, the most the kernel writes.
    let rc = unsafe { libc::getsockname(fd, (&raw mut sll).cast(), &mut len) };
    rc == 0 && sll.sll_ifindex <= 0
}

/// Waits until the device change the kernel is making (if any) is done: an ethtool
/// request on the socket takes the RTNL lock, which a device deletion holds from taking
/// the device down until it is unregistered. The request's result does not matter.
fn wait_for_device_changes(fd: RawFd, dev: &str) {
    const ETHTOOL_GLINK: u32 = 0xa;
    // SAFETY: an all-zero ifreq is a valid value (empty name, null pointers).
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    for (d, b) in ifr
        .ifr_name
        .iter_mut()
        .zip(dev.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = b as libc::c_char;
    }
    let mut req = [ETHTOOL_GLINK, 0u32];
    ifr.ifr_ifru.ifru_data = req.as_mut_ptr().cast();
    // SAFETY: `ifr` holds a NUL-terminated name and points at `req`, an ethtool_value
    // (command and result word) the kernel may write; both outlive the call.
    unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) };
}

/// Reads and clears the socket's pending error (`SO_ERROR`).
fn take_socket_error(fd: RawFd) -> io::Result<Option<io::Error>> {
    let mut err: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are valid for writes and outlive the call; `len` holds the
    // size of `err`, the most the kernel writes for SO_ERROR.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((err != 0).then(|| io::Error::from_raw_os_error(err)))
}

/// Like [`deliver`] for a frame without a VLAN tag to put back, taking it out of its
/// receive buffer `buf` ([`take_received`]).
fn deliver_owned(
    counters: &mut PortCounters,
    hdr: &[u8],
    buf: &mut Vec<u8>,
    out: &mut Vec<Frame>,
) -> bool {
    let Some(v) = vnet::decode(hdr, vnet::Endian::Native) else {
        counters.rx_errors += 1;
        return false;
    };
    let data = take_received(buf, COPY_BUF_LEN);
    counters.rx_frames += 1;
    counters.rx_bytes += data.len() as u64;
    out.push(Frame { data, vnet: v });
    true
}

impl AfPacketPort {
    /// [`Port::recv_batch`] from the socket.
    fn recv_socket(&mut self, out: &mut Vec<Frame>, max: usize) -> io::Result<usize> {
        let counters = &mut self.counters;
        match &mut self.rx {
            Rx::Blocks {
                ring,
                block_size,
                block_count,
                cursor,
            } => {
                let got = recv_blocks(ring, *block_size, *block_count, cursor, counters, out, max);
                ring_result(self.fd.as_raw_fd(), got, counters)
            }
            Rx::Frames { ring, slots, next } => {
                let got = recv_frames(ring, *slots, next, counters, out, max);
                ring_result(self.fd.as_raw_fd(), got, counters)
            }
            Rx::Copy { hdrs, bufs, ctrl } => {
                recv_copy(self.fd.as_raw_fd(), hdrs, bufs, ctrl, counters, out, max)
            }
        }
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
        if self.gone {
            return Err(self.gone_error());
        }
        self.recv_socket(out, max).map_err(|e| self.check_gone(e))
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>) -> io::Result<usize> {
        if self.gone {
            return Err(self.gone_error());
        }
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
                // The device's queue is full (a bypassed qdisc: the driver said busy):
                // the frames after this one would be refused the same way, one system
                // call each. They are left to the caller, which counts them dropped.
                _ if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.counters.tx_errors += 1;
                    break;
                }
                // No device behind the socket: none of the frames can go.
                _ if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV)) => {
                    self.counters.tx_errors += 1;
                    frames.drain(..taken);
                    return Err(self.check_gone(e));
                }
                // The first frame was refused (bad offload header, too long, device
                // down): counted, and the rest goes on.
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

    fn take_queues(&mut self) -> Vec<Box<dyn Port>> {
        self.queues
            .drain(..)
            .map(|q| Box::new(q) as Box<dyn Port>)
            .collect()
    }

    fn handover(&self) -> Option<(crate::handover::Handed, BorrowedFd<'_>)> {
        // A ring is mapped into this process with its reading position: only the copy
        // mode's socket can be read by another process as it is.
        if !matches!(self.rx, Rx::Copy { .. }) || self.gone {
            return None;
        }
        let h = crate::handover::Handed::AfPacket {
            dev: self.name.clone(),
            ingress_drop: self.ingress_drop.is_some(),
        };
        Some((h, self.fd.as_fd()))
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
