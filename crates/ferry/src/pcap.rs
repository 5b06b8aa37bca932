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
