//! Reading and writing capture files: pcap (micro- or nanosecond) and pcapng in, pcap out.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};

/// One captured frame.
pub struct Frame {
    /// Capture time since the epoch, in nanoseconds.
    pub time_ns: u64,
    /// The frame, from the Ethernet header on.
    pub data: Vec<u8>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Reads every Ethernet frame of a pcap or pcapng file.
pub fn read_all(path: &Path) -> Result<Vec<Frame>> {
    let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic)
        .with_context(|| format!("{}: too short to be a capture file", path.display()))?;
    let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let r = BufReader::new(f);
    let mut out = Vec::new();
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut rd = PcapNgReader::new(r)
            .with_context(|| format!("{}: not a valid pcapng file", path.display()))?;
        while let Some(b) = rd.next_block() {
            let b = b.with_context(|| {
                format!(
                    "{}: corrupt pcapng block after {} packets",
                    path.display(),
                    out.len()
                )
            })?;
            let (iface, time, orig_len, data) = match b {
                Block::EnhancedPacket(p) => (
                    p.interface_id,
                    p.timestamp,
                    p.original_len,
                    p.data.into_owned(),
                ),
                Block::SimplePacket(p) => (0, Duration::ZERO, p.original_len, p.data.into_owned()),
                _ => continue,
            };
            if data.len() < orig_len as usize {
                bail!(
                    "{}: packet {} was truncated by the capture (snaplen): {} of {} bytes",
                    path.display(),
                    out.len(),
                    data.len(),
                    orig_len
                );
            }
            // Interfaces are known once their description block was read.
            let link = rd
                .interfaces()
                .get(iface as usize)
                .map(|i| i.linktype)
                .with_context(|| {
                    format!(
                        "{}: packet on undescribed interface {iface}",
                        path.display()
                    )
                })?;
            if link != DataLink::ETHERNET {
                bail!(
                    "{}: interface {iface} has link type {link:?}; ferry replays Ethernet only",
                    path.display()
                );
            }
            out.push(Frame {
                time_ns: ns(time),
                data,
            });
        }
    } else {
        let mut rd = PcapReader::new(r)
            .with_context(|| format!("{}: not a pcap or pcapng file", path.display()))?;
        let link = rd.header().datalink;
        if link != DataLink::ETHERNET {
            bail!(
                "{}: link type {link:?}; ferry replays Ethernet only",
                path.display()
            );
        }
        while let Some(p) = rd.next_packet() {
            let p = p.with_context(|| {
                format!(
                    "{}: corrupt packet record after {} packets",
                    path.display(),
                    out.len()
                )
            })?;
            if p.data.len() < p.orig_len as usize {
                bail!(
                    "{}: packet {} was truncated by the capture (snaplen): {} of {} bytes",
                    path.display(),
                    out.len(),
                    p.data.len(),
                    p.orig_len
                );
            }
            out.push(Frame {
                time_ns: ns(p.timestamp),
                data: p.data.into_owned(),
            });
        }
    }
    Ok(out)
}

/// A pcap writer with nanosecond timestamps.
pub struct Writer {
    inner: PcapWriter<BufWriter<File>>,
}

impl Writer {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Writer> {
        let f = File::create(path).with_context(|| format!("{}: cannot create", path.display()))?;
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            snaplen: 262_144,
            ..PcapHeader::default()
        };
        let inner = PcapWriter::with_header(BufWriter::new(f), header)
            .with_context(|| format!("{}: cannot write", path.display()))?;
        Ok(Writer { inner })
    }

    /// Appends a frame.
    pub fn write(&mut self, time_ns: u64, data: &[u8]) -> Result<()> {
        let p = PcapPacket::new(Duration::from_nanos(time_ns), data.len() as u32, data);
        self.inner.write_packet(&p)?;
        Ok(())
    }

    /// Flushes to disk.
    pub fn finish(self) -> Result<()> {
        use std::io::Write;
        self.inner.into_writer().flush()?;
        Ok(())
    }
}

/// Which way a captured frame went through its port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Received by ferry on the port.
    In,
    /// Sent by ferry (on the port named with the frame).
    Out,
}

/// A pcapng writer for `ferry capture`: one interface per port (its name as the
/// interface name), nanosecond timestamps, and per frame the direction in the packet
/// flags (inbound or outbound, as Wireshark shows them) and a comment saying where the
/// frame was seen (before or after ferry rewrote it).
pub struct NgWriter {
    inner: pcap_file::pcapng::PcapNgWriter<BufWriter<Box<dyn std::io::Write>>>,
    interfaces: std::collections::HashMap<String, u32>,
}

impl NgWriter {
    /// Creates (truncates) `path`; `-` is standard output.
    pub fn create(path: &Path) -> Result<NgWriter> {
        let out: Box<dyn std::io::Write> = if path == Path::new("-") {
            Box::new(std::io::stdout())
        } else {
            Box::new(
                File::create(path).with_context(|| format!("{}: cannot create", path.display()))?,
            )
        };
        let inner = pcap_file::pcapng::PcapNgWriter::new(BufWriter::new(out))
            .with_context(|| format!("{}: cannot write", path.display()))?;
        Ok(NgWriter {
            inner,
            interfaces: std::collections::HashMap::new(),
        })
    }

    /// Writes out what is buffered, so that a reader of a pipe sees the frames so far.
    pub fn flush(&mut self) -> Result<()> {
        use std::io::Write;
        self.inner.get_mut().flush()?;
        Ok(())
    }

    /// Appends a frame seen at `port` at `time_ns` since the epoch.
    pub fn write(
        &mut self,
        time_ns: u64,
        port: &str,
        way: Way,
        comment: &str,
        data: &[u8],
    ) -> Result<()> {
        use pcap_file::pcapng::blocks::enhanced_packet::{
            EnhancedPacketBlock, EnhancedPacketOption,
        };
        use pcap_file::pcapng::blocks::interface_description::{
            InterfaceDescriptionBlock, InterfaceDescriptionOption,
        };
        let next = self.interfaces.len() as u32;
        let interface_id = match self.interfaces.get(port) {
            Some(&i) => i,
            None => {
                let idb = InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: 0,
                    options: vec![
                        InterfaceDescriptionOption::IfName(port.into()),
                        // Timestamps are written in nanoseconds.
                        InterfaceDescriptionOption::IfTsResol(9),
                    ],
                };
                self.inner.write_pcapng_block(idb)?;
                self.interfaces.insert(port.to_string(), next);
                next
            }
        };
        // epb_flags bits 0-1: 01 inbound, 10 outbound.
        let flags = match way {
            Way::In => 0b01,
            Way::Out => 0b10,
        };
        let epb = EnhancedPacketBlock {
            interface_id,
            timestamp: Duration::from_nanos(time_ns),
            original_len: data.len() as u32,
            data: data.into(),
            options: vec![
                EnhancedPacketOption::Flags(flags),
                EnhancedPacketOption::Comment(comment.into()),
            ],
        };
        self.inner.write_pcapng_block(epb)?;
        Ok(())
    }

    /// Flushes to disk.
    pub fn finish(self) -> Result<()> {
        use std::io::Write;
        self.inner.into_inner().flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ng_writer_round_trips_ports_directions_and_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.pcapng");
        let mut w = NgWriter::create(&path).unwrap();
        let a = vec![0xaa; 60];
        let b = vec![0xbb; 70];
        w.write(1_000_000_123, "pod-a", Way::In, "received on pod-a", &a)
            .unwrap();
        w.write(1_000_000_456, "uplink", Way::Out, "after ferry", &b)
            .unwrap();
        w.write(1_000_000_789, "pod-a", Way::Out, "sent on pod-a", &a)
            .unwrap();
        w.finish().unwrap();

        let frames = read_all(&path).unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].time_ns, 1_000_000_123, "nanoseconds kept");
        assert_eq!(frames[1].data, b);

        let f = File::open(&path).unwrap();
        let mut rd = PcapNgReader::new(BufReader::new(f)).unwrap();
        let mut seen = Vec::new();
        while let Some(b) = rd.next_block() {
            if let Block::EnhancedPacket(p) = b.unwrap() {
                seen.push((p.interface_id, format!("{:?}", p.options)));
            }
        }
        let names: Vec<_> = rd
            .interfaces()
            .iter()
            .map(|i| format!("{:?}", i.options))
            .collect();
        assert_eq!(names.len(), 2, "one interface per port: {names:?}");
        assert!(names[0].contains("pod-a") && names[1].contains("uplink"));
        assert_eq!(seen[0].0, 0);
        assert_eq!(seen[1].0, 1);
        assert_eq!(seen[2].0, 0, "a port's interface is reused");
        let s = &seen[1].1;
        assert!(s.contains("Flags(2)") && s.contains("after ferry"), "{s}");
    }
}
