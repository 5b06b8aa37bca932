//! Helpers shared by the end-to-end tests: root check, namespace guards, a kernel ping.
//!
//! Names carry the test's tag and the process id, so parallel tests and runs never meet.

#![allow(dead_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ferry_linux::link::ip;
use ferry_linux::netns;

/// Fails the test, saying what is needed, unless running as root with `ip` available.
pub fn require_root_and_ip() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    assert_eq!(
        euid, "0",
        "this test must run as root: it creates network namespaces and devices \
         (CAP_SYS_ADMIN, CAP_NET_ADMIN); effective uid is {euid}"
    );
    if let Err(e) = ip(&["-V"]) {
        panic!("{e}");
    }
}

/// A device name unique to this test run: `f<tag><pid>` (at most 15 bytes).
pub fn dev_name(tag: &str) -> String {
    let n = format!("f{tag}{}", std::process::id());
    assert!(n.len() <= 15, "device name {n} too long");
    n
}

/// A network namespace, deleted (with every device in it) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `ferry-<tag>-<pid>` with its loopback up.
    pub fn new(tag: &str) -> Netns {
        let name = format!("ferry-{tag}-{}", std::process::id());
        ip(&["netns", "add", &name]).unwrap_or_else(|e| panic!("{e}"));
        let ns = Netns { name };
        ns.ip(&["link", "set", "dev", "lo", "up"]);
        ns
    }

    /// Runs `ip -n <ns> args...`, failing the test with ip's message.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `f` on a thread inside the namespace and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        netns::spawn_in(&self.name, f)
            .unwrap_or_else(|e| panic!("cannot enter {}: {e}", self.name))
            .join()
            .expect("namespace thread panicked")
            .unwrap_or_else(|e| panic!("cannot enter {}: {e}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Formats a MAC for `ip`.
pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn icmp_checksum(b: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in b.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sends one ICMP echo request to `dst` from the calling thread's namespace (a raw
/// socket: root) and waits up to `timeout` for the matching reply; returns the reply's
/// payload, or an error saying what did not happen.
pub fn ping(dst: Ipv4Addr, id: u16, payload: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    // SAFETY: socket() takes no pointers; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut msg = vec![8u8, 0, 0, 0];
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&1u16.to_be_bytes());
    msg.extend_from_slice(payload);
    let c = icmp_checksum(&msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    // SAFETY: an all-zero sockaddr_in is a valid value.
    let mut sa: libc::sockaddr_in = unsafe { zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
    // SAFETY: `msg` and `sa` are live for the call and the lengths match them.
    let rc = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no echo reply from {dst} within {timeout:?}"),
            ));
        }
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
        if rc <= 0 {
            continue;
        }
        // SAFETY: `buf` is writable for its whole length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let pkt = &buf[..n as usize];
        let ihl = usize::from(pkt[0] & 0x0f) * 4;
        let icmp = &pkt[ihl..];
        if pkt[12..16] == dst.octets()
            && icmp.len() >= 8
            && icmp[0] == 0
            && icmp[4..6] == id.to_be_bytes()
        {
            return Ok(icmp[8..].to_vec());
        }
    }
}
