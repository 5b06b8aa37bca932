//! TCP listeners for the agent's small HTTP servers (health checks, metrics).
//!
//! `std::net::TcpListener::bind` leaves an IPv6 socket's `IPV6_V6ONLY` at the host's
//! default, `net.ipv6.bindv6only`: where a host sets it, a listener on `[::]` takes IPv6
//! connections only. [`listen`] clears the option before binding, so that `[::]` means
//! every address of both families on every host.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Socket, Type};

/// Connections the kernel queues before they are accepted (std's backlog).
const BACKLOG: i32 = 128;

/// Listens on `addr` as `TcpListener::bind` does (`SO_REUSEADDR` set, close-on-exec),
/// except that a listener on an IPv6 address takes IPv4 connections too (as IPv4-mapped
/// addresses): `IPV6_V6ONLY` is cleared whatever the host's default.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    Ok(s.into())
}

/// Whether IPv6 listener `l` takes IPv6 connections only (`IPV6_V6ONLY`).
pub fn v6_only(l: &TcpListener) -> io::Result<bool> {
    socket2::SockRef::from(l).only_v6()
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
