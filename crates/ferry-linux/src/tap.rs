//! A TAP device: Ethernet frames in and out of the kernel through `/dev/net/tun`.
//!
//! Frames written to the [`Tap`] are received by the kernel on the interface; frames the
//! kernel sends out of the interface are read from it. The device lives as long as the
//! file descriptor: it is created by [`Tap::open`] (unless it already exists as a
//! persistent device) and disappears when the [`Tap`] is dropped, unless it was made
//! persistent ([`Tap::set_persist`]): then it stays without any descriptor, and opening
//! its name again (in its network namespace) attaches to it. The descriptor keeps
//! working when the interface is moved into another network namespace.
//!
//! The ioctls are in this file only, each with the reason it is sound.

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use crate::port::{Frame, Port, PortCounters, take_received, vnet};

/// Longest interface name, without the terminating NUL (`IFNAMSIZ - 1`).
pub const MAX_NAME_LEN: usize = libc::IFNAMSIZ - 1;

/// Offload flags for [`Tap::set_offload`] (`TUN_F_*`): what the kernel may hand us
/// unfinished (partial checksums, TSO/USO super-packets) once a vnet header is on.
pub mod offload {
    /// Partial checksums (`NEEDS_CSUM`).
    pub const CSUM: u32 = libc::TUN_F_CSUM;
    /// TCP over IPv4 super-packets.
    pub const TSO4: u32 = libc::TUN_F_TSO4;
    /// TCP over IPv6 super-packets.
    pub const TSO6: u32 = libc::TUN_F_TSO6;
    /// TSO with the ECN bit.
    pub const TSO_ECN: u32 = libc::TUN_F_TSO_ECN;
    /// UDP over IPv4 segmentation offload.
    pub const USO4: u32 = libc::TUN_F_USO4;
    /// UDP over IPv6 segmentation offload.
    pub const USO6: u32 = libc::TUN_F_USO6;
}

/// `struct ifreq` as TUNSETIFF reads and writes it: the name and the flags member of the
/// union, padded to (at least) the kernel's size of the structure.
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TAP device. The device's file descriptor is closed on drop.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
    vnet_hdr: bool,
}

impl Tap {
    /// Opens (creating if needed) the TAP device `name`, without packet information or
    /// vnet header: reads and writes are bare Ethernet frames. An empty name lets the
    /// kernel choose one (see [`Tap::name`]).
    pub fn open(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, false)
    }

    /// Opens the TAP device `name` with `IFF_VNET_HDR`: every frame read or written is
    /// preceded by a virtio-net header (see [`Tap::set_vnet_hdr_size`]).
    pub fn open_with_vnet_hdr(name: &str) -> io::Result<Tap> {
        Tap::open_with(name, true)
    }

    /// Opens one queue of the multi-queue TAP `name` (`IFF_MULTI_QUEUE`) with a vnet
    /// header: every call adds a queue with a descriptor of its own, and the kernel spreads
    /// the frames it sends out of the interface over the queues by flow hash, so that each
    /// worker can own one. The device exists while any queue is open.
    pub fn open_queue_with_vnet_hdr(name: &str) -> io::Result<Tap> {
        Tap::open_flags(name, true, libc::IFF_MULTI_QUEUE as libc::c_short)
    }

    fn open_with(name: &str, vnet_hdr: bool) -> io::Result<Tap> {
        Tap::open_flags(name, vnet_hdr, 0)
    }

    fn open_flags(name: &str, vnet_hdr: bool, extra: libc::c_short) -> io::Result<Tap> {
        if name.len() > MAX_NAME_LEN || name.bytes().any(|b| b == 0 || b == b'/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "invalid interface name {name:?} (at most {MAX_NAME_LEN} bytes, no NUL or '/')"
                ),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        let mut req = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short | extra,
            _pad: [0; 22],
        };
        if vnet_hdr {
            req.flags |= libc::IFF_VNET_HDR as libc::c_short;
        }
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq` through the pointer; `req`
        // is a live, exclusively borrowed, #[repr(C)] value at least as large as it, and
        // its name is NUL-terminated (at most IFNAMSIZ - 1 bytes were copied into zeros).
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = req
            .name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        Ok(Tap {
            file,
            name,
            vnet_hdr,
        })
    }

    /// The interface name (as the kernel assigned it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when frames carry a virtio-net header.
    pub fn has_vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    /// Switches non-blocking mode on or off; reads then return `WouldBlock` when empty.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: F_GETFL takes no argument and only reads the descriptor's flags; `fd`
        // is owned by `self.file` and open for the duration of the call.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: F_SETFL takes an int by value; `fd` is open as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until a frame can be read, at most `timeout`. Returns false on timeout.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        loop {
            // SAFETY: `pfd` is one valid, exclusively borrowed pollfd and the count is 1;
            // the descriptor is owned by `self.file` and stays open during the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc >= 0 {
                return Ok(rc > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads one frame into `buf` (truncated if `buf` is too small); returns its length.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Reads one frame split in two: the first `hdr.len()` bytes (the virtio-net header)
    /// into `hdr`, the rest into `buf`, which is cleared first and then holds them (up to
    /// its capacity: a longer frame is cut short). Returns the bytes read in all.
    pub fn read_split(&self, hdr: &mut [u8], buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.clear();
        let spare = buf.spare_capacity_mut();
        let room = spare.len();
        let iov = [
            libc::iovec {
                iov_base: hdr.as_mut_ptr().cast(),
                iov_len: hdr.len(),
            },
            libc::iovec {
                iov_base: spare.as_mut_ptr().cast(),
                iov_len: room,
            },
        ];
        // SAFETY: the two iovecs cover `hdr` and the spare capacity of `buf`, both live
        // and exclusively borrowed for the call; readv writes at most their lengths.
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), 2) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // SAFETY: the kernel wrote the first `n - hdr.len()` bytes of the spare capacity
        // (bytes past the header), which is at most its length.
        unsafe { buf.set_len(n.saturating_sub(hdr.len()).min(room)) };
        Ok(n)
    }

    /// Writes one whole frame; the kernel receives it on the interface.
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }

    /// Writes one whole frame gathered from `parts` (a vnet header and the frame).
    pub fn write_vectored(&self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.file).write_vectored(parts)
    }

    /// Makes the virtio-net header's u16 fields little endian (`TUNSETVNETLE`), whatever
    /// the host's byte order; without it they follow the legacy rule (host order).
    pub fn set_vnet_le(&self, on: bool) -> io::Result<()> {
        let v: c_int = on.into();
        // SAFETY: TUNSETVNETLE reads one int through the pointer, which points at a live
        // local for the duration of the call.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETVNETLE, &v) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Tells the kernel which offloads ferry accepts ([`offload`] flags; 0 for none).
    pub fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned long of
        // TUN_F_* bits); no memory is passed.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes the device persistent (`TUNSETPERSIST`): it outlives this descriptor and
    /// can be opened again by name from its network namespace. Off again, the device
    /// goes when its last descriptor closes.
    pub fn set_persist(&self, on: bool) -> io::Result<()> {
        // SAFETY: TUNSETPERSIST takes its argument by value (0 or 1); no memory is
        // passed.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                libc::c_ulong::from(on),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets the length of the virtio-net header in front of every frame (10, or 12 with
    /// the `num_buffers` field). Only meaningful with [`Tap::open_with_vnet_hdr`].
    pub fn set_vnet_hdr_size(&self, size: u32) -> io::Result<()> {
        let size = c_int::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "vnet header size"))?;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which points at a
        // live local for the duration of the call.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &size) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The offloads a [`TapPort`] asks for: checksums, TSO for both families with ECN, and
/// USO for both families when the kernel has it (Linux 6.2 and later).
pub const TAP_PORT_OFFLOADS: u32 = offload::CSUM
    | offload::TSO4
    | offload::TSO6
    | offload::TSO_ECN
    | offload::USO4
    | offload::USO6;

/// Largest frame a TAP hands over: a 64 KiB IP super-packet behind Ethernet and a VLAN tag.
const MAX_FRAME: usize = 14 + 4 + 65535;

/// A TAP device as a [`Port`]: a pod's interface seen from ferry.
///
/// Every frame carries a 12-byte virtio-net header (`virtio_net_hdr_v1`, [`vnet::LEN_V1`])
/// in little-endian byte order (`TUNSETVNETLE`), in both directions. The kernel may hand
/// over TCP (and, when [`TapPort::uso`], UDP) super-packets of up to 64 KiB with partial
/// checksums, and accepts the same from ferry. The descriptor is non-blocking. A frame
/// is read straight into a buffer of its own (the header into another), which a large
/// frame is handed over in (see `port::HANDOVER_MIN`).
///
/// The device is created in the caller's network namespace and usually moved into a
/// pod's by [`crate::link::move_to_netns`]; the descriptor keeps working, and the device
/// disappears when the port is dropped unless it is persistent ([`Tap::set_persist`]).
/// A persistent one is opened again with [`TapPort::create`] and the same name, from
/// its namespace: the flags and offloads are the same, so the kernel takes it back.
#[derive(Debug)]
pub struct TapPort {
    tap: Tap,
    name: String,
    offloads: u32,
    buf: Vec<u8>,
    counters: PortCounters,
    /// The device's further queues, until the worker takes them.
    queues: Vec<TapPort>,
}

impl TapPort {
    /// Creates the TAP device `name` with a vnet header and [`TAP_PORT_OFFLOADS`];
    /// when the kernel refuses USO, with the same offloads minus USO (see
    /// [`TapPort::uso`]).
    pub fn create(name: &str) -> io::Result<TapPort> {
        TapPort::from_tap(Tap::open_with_vnet_hdr(name)?)
    }

    /// Like [`TapPort::create`], one queue of a multi-queue TAP (see
    /// [`Tap::open_queue_with_vnet_hdr`]): one port per worker, same device.
    pub fn create_queue(name: &str) -> io::Result<TapPort> {
        TapPort::from_tap(Tap::open_queue_with_vnet_hdr(name)?)
    }

    /// Creates (or opens again) the TAP `name` with `queues` queues, one per worker: with
    /// one, a plain TAP ([`TapPort::create`]); with more, a multi-queue TAP whose first
    /// queue is this port and whose others it hands over to the worker loop
    /// ([`Port::take_queues`]). The kernel spreads the frames the device sends (a pod's
    /// packets) over the queues by flow hash. All queues are opened here, in the
    /// caller's network namespace, where the device must be.
    pub fn create_queues(name: &str, queues: u16) -> io::Result<TapPort> {
        if queues <= 1 {
            return TapPort::create(name);
        }
        let mut port = TapPort::create_queue(name)?;
        let name = port.name.clone();
        for _ in 1..queues {
            port.queues.push(TapPort::create_queue(&name)?);
        }
        Ok(port)
    }

    /// Takes over one queue of a TAP another process opened (with a vnet header) and
    /// passed on ([`crate::handover`]): `fd` is its descriptor, `name` the device's name
    /// as that process knew it. The header size, byte order and offloads are set again
    /// (the same values, so the kernel changes nothing).
    pub fn adopt(fd: std::os::fd::OwnedFd, name: &str) -> io::Result<TapPort> {
        TapPort::from_tap(Tap {
            file: File::from(fd),
            name: name.to_string(),
            vnet_hdr: true,
        })
    }

    /// Adds a further queue of the same device, for the worker loop to take.
    pub(crate) fn push_queue(&mut self, q: TapPort) {
        self.queues.push(q);
    }

    fn from_tap(tap: Tap) -> io::Result<TapPort> {
        tap.set_vnet_hdr_size(vnet::LEN_V1 as u32)?;
        tap.set_vnet_le(true)?;
        let offloads = match tap.set_offload(TAP_PORT_OFFLOADS) {
            Ok(()) => TAP_PORT_OFFLOADS,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Kernels before 6.2 know no TUN_F_USO* and refuse the whole set.
                let without = TAP_PORT_OFFLOADS & !(offload::USO4 | offload::USO6);
                tap.set_offload(without)?;
                without
            }
            Err(e) => return Err(e),
        };
        tap.set_nonblocking(true)?;
        Ok(TapPort {
            name: tap.name().to_string(),
            tap,
            offloads,
            buf: Vec::with_capacity(MAX_FRAME),
            counters: PortCounters::default(),
            queues: Vec::new(),
        })
    }

    /// The `TUN_F_*` offloads in force.
    pub fn offload_flags(&self) -> u32 {
        self.offloads
    }

    /// True when the kernel accepted UDP segmentation offload (USO).
    pub fn uso(&self) -> bool {
        self.offloads & offload::USO4 != 0
    }

    /// Makes the device persistent or not ([`Tap::set_persist`]).
    pub fn set_persist(&self, on: bool) -> io::Result<()> {
        self.tap.set_persist(on)
    }

    /// The underlying TAP.
    pub fn tap(&self) -> &Tap {
        &self.tap
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn raw_fd(&self) -> RawFd {
        self.tap.as_raw_fd()
    }

    fn recv_batch(&mut self, out: &mut Vec<Frame>, max: usize) -> io::Result<usize> {
        let mut got = 0;
        let mut hdr = [0u8; vnet::LEN_V1];
        while got < max {
            let n = match self.tap.read_split(&mut hdr, &mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.counters.rx_errors += 1;
                    if got == 0 {
                        return Err(e);
                    }
                    break;
                }
            };
            let v = if n >= vnet::LEN_V1 {
                vnet::decode(&hdr, vnet::Endian::Little)
            } else {
                None
            };
            let Some(v) = v else {
                self.counters.rx_errors += 1;
                continue;
            };
            let data = take_received(&mut self.buf, MAX_FRAME);
            self.counters.rx_frames += 1;
            self.counters.rx_bytes += data.len() as u64;
            out.push(Frame { data, vnet: v });
            got += 1;
        }
        Ok(got)
    }

    fn send_batch(&mut self, frames: &mut Vec<Frame>) -> io::Result<usize> {
        let mut hdr = [0u8; vnet::LEN_V1];
        let mut taken = 0;
        for f in frames.iter() {
            vnet::encode(&f.vnet, vnet::Endian::Little, &mut hdr);
            let parts = [IoSlice::new(&hdr), IoSlice::new(&f.data)];
            let r = loop {
                match self.tap.write_vectored(&parts) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            match r {
                Ok(_) => {
                    self.counters.tx_frames += 1;
                    self.counters.tx_bytes += f.data.len() as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // Refused (bad offload header, interface down): counted, the rest goes on.
                Err(_) => self.counters.tx_errors += 1,
            }
            taken += 1;
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
        let dev = self.name.clone();
        Some((crate::handover::Handed::Tap { dev }, self.tap.as_fd()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// These tests create devices: they need CAP_NET_ADMIN, and fail (not skip) without.
    fn open(name: &str, vnet: bool) -> Tap {
        let r = if vnet {
            Tap::open_with_vnet_hdr(name)
        } else {
            Tap::open(name)
        };
        r.unwrap_or_else(|e| {
            panic!("cannot create TAP {name}: {e}; these tests must run as root (CAP_NET_ADMIN) with /dev/net/tun present")
        })
    }

    fn unique(tag: &str) -> String {
        format!("ftap{}{tag}", std::process::id())
    }

    #[test]
    fn test_open_rejects_invalid_names() {
        for bad in ["a-name-far-too-long", "a/b", "a\0b"] {
            let e = Tap::open(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn test_device_exists_while_open_and_goes_on_drop() {
        let name = unique("a");
        let tap = open(&name, false);
        assert_eq!(tap.name(), name);
        assert!(!tap.has_vnet_hdr());
        let sys = format!("/sys/class/net/{name}");
        assert!(
            Path::new(&sys).exists(),
            "{sys} missing while the TAP is open"
        );
        assert_eq!(
            std::fs::read_to_string(format!("{sys}/type"))
                .unwrap()
                .trim(),
            "1",
            "an Ethernet device"
        );
        drop(tap);
        // Unregistering waits for the device's references: allow it a moment under load.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while Path::new(&sys).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !Path::new(&sys).exists(),
            "{sys} still there 5 s after drop"
        );
    }

    #[test]
    fn test_nonblocking_read_with_nothing_to_read() {
        let tap = open(&unique("b"), false);
        tap.set_nonblocking(true).unwrap();
        // The interface is down, so the kernel sends nothing out of it.
        assert!(!tap.wait_readable(Duration::from_millis(20)).unwrap());
        let mut buf = [0u8; 2048];
        let e = tap.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        tap.set_nonblocking(false).unwrap();
    }

    #[test]
    fn test_persistent_device_outlives_its_descriptor_and_reopens() {
        let name = unique("p");
        let sys = format!("/sys/class/net/{name}");
        let port = TapPort::create(&name).unwrap();
        port.set_persist(true).unwrap();
        drop(port);
        assert!(Path::new(&sys).exists(), "{sys} gone with a persistent TAP");
        let again = TapPort::create(&name).expect("the same flags open it again");
        assert_eq!(again.name(), name);
        // Another descriptor on a single-queue TAP in use is refused.
        assert!(Tap::open_with_vnet_hdr(&name).is_err());
        again.set_persist(false).unwrap();
        drop(again);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while Path::new(&sys).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!Path::new(&sys).exists(), "{sys} stayed without persist");
    }

    #[test]
    fn test_vnet_hdr_and_offloads_are_accepted() {
        let tap = open(&unique("c"), true);
        assert!(tap.has_vnet_hdr());
        tap.set_vnet_hdr_size(12).unwrap();
        tap.set_offload(offload::CSUM | offload::TSO4 | offload::TSO6 | offload::TSO_ECN)
            .unwrap();
        tap.set_offload(0).unwrap();
        let e = tap.set_vnet_hdr_size(4).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EINVAL),
            "too small a header is refused"
        );
    }
}
