//! Ports passed from one agent process to the next: what each descriptor is, and the
//! port made again from it.
//!
//! A port's queues are handed over one descriptor each, in order (queue 0 first), each
//! with a [`Handed`] that says what it is. The next process makes the same port from
//! them with [`adopt`]: the devices, sockets, bindings, fanout group and options are the
//! kernel's and stay as they were; only the process's own buffers are made anew. Ports
//! that cannot be handed over ([`crate::Port::handover`] says None: an AF_PACKET ring,
//! mapped into the process with its reading position) are opened anew by the next
//! process instead.

use std::io;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use crate::af_packet::AfPacketPort;
use crate::port::Port;
use crate::tap::TapPort;

/// What one handed-over descriptor is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Handed {
    /// A queue of a TAP opened with a virtio-net header.
    Tap {
        /// The device's name as the port knows it.
        dev: String,
    },
    /// An AF_PACKET socket bound to a device, receiving by copy.
    AfPacket {
        /// The device.
        dev: String,
        /// An ingress drop filter keeps the host's stack off the device (only the first
        /// socket of a port says so).
        ingress_drop: bool,
    },
}

/// Makes a port again from the descriptors of its queues, in order, as
/// [`crate::Port::handover`] described them. All must be of one kind and device.
pub fn adopt(queues: Vec<(Handed, OwnedFd)>) -> io::Result<Box<dyn Port>> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let mut it = queues.into_iter();
    let (first, fd) = it
        .next()
        .ok_or_else(|| invalid("a port with no descriptor".into()))?;
    let rest: Vec<(Handed, OwnedFd)> = it.collect();
    let same = |h: &Handed| match (h, &first) {
        (Handed::Tap { dev: a }, Handed::Tap { dev: b }) => a == b,
        (Handed::AfPacket { dev: a, .. }, Handed::AfPacket { dev: b, .. }) => a == b,
        _ => false,
    };
    if let Some((h, _)) = rest.iter().find(|(h, _)| !same(h)) {
        return Err(invalid(format!(
            "queues of one port are not alike: {first:?} and {h:?}"
        )));
    }
    match &first {
        Handed::Tap { dev } => {
            let mut port = TapPort::adopt(fd, dev)?;
            for (_, q) in rest {
                port.push_queue(TapPort::adopt(q, dev)?);
            }
            Ok(Box::new(port))
        }
        Handed::AfPacket { dev, ingress_drop } => Ok(Box::new(AfPacketPort::adopt(
            fd,
            dev,
            *ingress_drop,
            rest.into_iter().map(|(_, q)| q).collect(),
        )?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::Frame;
    use std::os::fd::AsFd;

    /// Needs CAP_NET_ADMIN (it makes a TAP), as the tap module's tests do.
    #[test]
    fn a_tap_handed_over_keeps_its_device_and_its_traffic() {
        let name = format!("fyho{}", std::process::id() % 100_000);
        let port = TapPort::create_queues(&name, 2).unwrap();
        let mut port: Box<dyn Port> = Box::new(port);
        let mut queues = port.take_queues();
        assert_eq!(queues.len(), 1);
        let mut handed = Vec::new();
        for p in std::iter::once(&port).chain(queues.iter()) {
            let (h, fd) = p.handover().expect("a TAP is handed over");
            assert_eq!(h, Handed::Tap { dev: name.clone() });
            handed.push((h, fd.try_clone_to_owned().unwrap()));
        }
        // The first process lets go: the device lives on in the descriptors handed over.
        drop(port);
        queues.clear();
        let mut adopted = adopt(handed).unwrap();
        assert_eq!(adopted.take_queues().len(), 1);
        assert!(adopted.offloads());
        assert!(
            std::path::Path::new(&format!("/sys/class/net/{name}")).exists(),
            "the device went away with the first process's descriptors"
        );
        // Its descriptor is a live TAP queue: nothing queued, no error.
        let mut got: Vec<Frame> = Vec::new();
        assert_eq!(adopted.recv_batch(&mut got, 8).unwrap(), 0);
        drop(adopted);
        // The kernel unregisters the device after its last descriptor closes, not
        // always before close returns (on a loaded machine, some milliseconds later).
        let gone = (0..200).any(|_| {
            let gone = !std::path::Path::new(&format!("/sys/class/net/{name}")).exists();
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            gone
        });
        assert!(gone, "the device outlived its last descriptor by 2 s");
    }

    #[test]
    fn unlike_queues_are_refused() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = adopt(vec![
            (
                Handed::Tap { dev: "x".into() },
                a.as_fd().try_clone_to_owned().unwrap(),
            ),
            (
                Handed::Tap { dev: "y".into() },
                b.as_fd().try_clone_to_owned().unwrap(),
            ),
        ])
        .err()
        .unwrap();
        assert!(e.to_string().contains("not alike"), "{e}");
        assert!(adopt(Vec::new()).is_err());
    }
}
