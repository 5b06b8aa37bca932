//! Messages and file descriptors between two processes over a Unix stream socket: what
//! one agent hands over to the next (its ports, its listeners, its state).
//!
//! A message is a 4-byte big-endian length and that many bytes. Descriptors go in a
//! message of their own: one byte (the count, at most [`MAX_FDS`]) carrying them as
//! `SCM_RIGHTS` ancillary data, so that a receiver that expects descriptors reads
//! exactly that byte with `recvmsg`, and no plain read ever swallows (and so closes)
//! descriptors it did not expect. More descriptors than [`MAX_FDS`] go in several such
//! messages.
//!
//! The `sendmsg`/`recvmsg` calls and the control-message buffers come from `rustix`,
//! which owns the received descriptors as `OwnedFd` (close-on-exec) from the start.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// Most descriptors in one message: the kernel takes up to 253 (`SCM_MAX_FD`).
pub const MAX_FDS: usize = 200;

/// Longest message [`recv`] takes, so that a confused peer cannot make it allocate
/// without bound.
pub const MAX_MESSAGE: usize = 1 << 30;

fn invalid(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

/// Sends one message.
pub fn send(sock: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a message of {} bytes is too long", bytes.len()),
        ));
    }
    let mut w = sock;
    w.write_all(&(bytes.len() as u32).to_be_bytes())?;
    w.write_all(bytes)?;
    w.flush()
}

/// Receives one message (see [`send`]).
pub fn recv(sock: &UnixStream) -> io::Result<Vec<u8>> {
    let mut r = sock;
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(invalid(format!(
            "a message of {len} bytes announced, more than the {MAX_MESSAGE} taken"
        )));
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Sends `fds` (in messages of at most [`MAX_FDS`]); the peer takes them with
/// [`recv_fds`] and the same count. The descriptors stay open here too: the peer gets
/// its own, for the same open files.
pub fn send_fds(sock: &UnixStream, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    for chunk in fds.chunks(MAX_FDS) {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(chunk)) {
            return Err(io::Error::other("the control message does not fit"));
        }
        let count = [chunk.len() as u8];
        let sent = sendmsg(
            sock.as_fd(),
            &[IoSlice::new(&count)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if sent != 1 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the descriptors were not sent",
            ));
        }
    }
    Ok(())
}

/// Receives `count` descriptors sent by [`send_fds`], in order. Fewer than announced, a
/// message cut short or the peer gone is an error (the descriptors received so far are
/// closed).
pub fn recv_fds(sock: &UnixStream, count: usize) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let want = (count - fds.len()).min(MAX_FDS);
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let msg = recvmsg(
            sock.as_fd(),
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if msg.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the peer closed the connection after {} of {count} descriptors",
                    fds.len()
                ),
            ));
        }
        let before = fds.len();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(got) = m {
                fds.extend(got);
            }
        }
        if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            return Err(invalid(
                "descriptors were cut off (the process may have too many open)".into(),
            ));
        }
        let got = fds.len() - before;
        if got != want || usize::from(byte[0]) != got {
            return Err(invalid(format!(
                "{got} descriptors in a message announcing {} (expected {want})",
                byte[0]
            )));
        }
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::{AsFd, AsRawFd};

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a live array of two c_ints for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
        unsafe {
            use std::os::fd::FromRawFd;
            (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
        }
    }

    #[test]
    fn messages_and_descriptors_arrive_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        // More pipes than one message carries, so that the count is split.
        let pipes: Vec<(File, File)> = (0..MAX_FDS + 3).map(|_| pipe()).collect();
        let writers: Vec<BorrowedFd<'_>> = pipes.iter().map(|(_, w)| w.as_fd()).collect();
        send(&a, b"ports").unwrap();
        send_fds(&a, &writers).unwrap();
        send(&a, b"").unwrap();
        assert_eq!(recv(&b).unwrap(), b"ports");
        let got = recv_fds(&b, writers.len()).unwrap();
        assert_eq!(recv(&b).unwrap(), b"");
        assert_eq!(got.len(), pipes.len());
        // Each received descriptor writes into its own pipe: same open file, new number.
        for (i, (fd, (r, w))) in got.into_iter().zip(&pipes).enumerate() {
            assert_ne!(fd.as_raw_fd(), w.as_raw_fd());
            let mut f = File::from(fd);
            f.write_all(&[i as u8]).unwrap();
            let mut byte = [0u8];
            (&*r).read_exact(&mut byte).unwrap();
            assert_eq!(byte[0], i as u8);
        }
    }

    #[test]
    fn a_peer_that_goes_away_is_an_error_not_a_hang() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let e = recv_fds(&b, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        assert!(e.to_string().contains("after 0 of 2"), "{e}");
        // Fewer than announced: refused, not waited for.
        let (a, b) = UnixStream::pair().unwrap();
        let (_r, w) = pipe();
        send_fds(&a, &[w.as_fd()]).unwrap();
        let e = recv_fds(&b, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&u32::MAX.to_be_bytes()).unwrap();
        let e = recv(&b).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn a_plain_message_where_descriptors_were_expected_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, b"x").unwrap();
        let e = recv_fds(&b, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
