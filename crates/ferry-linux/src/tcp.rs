//! TCP listeners for the agent's small HTTP servers (health checks, metrics).
//!
//! `std::net::TcpListener::bind` leaves an IPv6 socket's `IPV6_V6ONLY` at the host's
//! default, `net.ipv6.bindv6only`: where a host sets it, a listener on `[::]` takes IPv6
//! connections only. [`listen`] clears the option before binding, so that `[::]` means
//! every address of both families on every host.

use std::io;
use std::mem::size_of;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Connections the kernel queues before they are accepted (std's backlog).
const BACKLOG: libc::c_int = 128;

/// Listens on `addr` as `TcpListener::bind` does (`SO_REUSEADDR` set, close-on-exec),
/// except that a listener on an IPv6 address takes IPv4 connections too (as IPv4-mapped
/// addresses): `IPV6_V6ONLY` is cleared whatever the host's default.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: socket takes no pointers; the descriptor it returns is owned below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if addr.is_ipv6() {
        set_int(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    bind(&fd, addr)?;
    // SAFETY: listen takes no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(fd))
}

/// Whether IPv6 listener `l` takes IPv6 connections only (`IPV6_V6ONLY`).
pub fn v6_only(l: &TcpListener) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and `len` is the size of `v`.
    let rc = unsafe {
        libc::getsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v != 0)
}

fn set_int(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: `v` is a live c_int and the length passed is its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn bind(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    let rc = match addr {
        SocketAddr::V4(a) => {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sa` is a live sockaddr_in of the length passed.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const sa).cast(),
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        SocketAddr::V6(a) => {
            let sa = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: `sa` is a live sockaddr_in6 of the length passed.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const sa).cast(),
                    size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    #[test]
    fn test_listen_on_the_ipv6_wildcard_takes_both_families() {
        let l = listen("[::]:0".parse().unwrap()).unwrap();
        assert!(!v6_only(&l).unwrap());
        let port = l.local_addr().unwrap().port();
        for addr in ["127.0.0.1", "::1"] {
            let mut c = TcpStream::connect((addr, port)).unwrap();
            let (mut s, peer) = l.accept().unwrap();
            assert_eq!(peer.ip().to_canonical().to_string(), addr);
            c.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"x");
        }
    }

    #[test]
    fn test_listen_on_ipv4_binds_the_address_and_port_given() {
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let a = l.local_addr().unwrap();
        assert_eq!(a.ip().to_string(), "127.0.0.1");
        assert_ne!(a.port(), 0);
        // The port is taken: a second listener on it is refused.
        let e = listen(a).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
