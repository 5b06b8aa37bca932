//! The bytes of a saved state: a header, then sections, then an end section (the layout
//! and the rules are in the module documentation of `handover`).

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{SavedState, check};

/// The first bytes of every saved state.
pub const MAGIC: [u8; 8] = *b"FERRYHOS";
/// The format version this build writes, and the newest it reads.
pub const FORMAT: u16 = 4;
/// The oldest format version this build reads.
pub const OLDEST_FORMAT: u16 = 1;

/// A section's tag: four ASCII bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(pub [u8; 4]);

impl Tag {
    /// What the producing pipeline says of itself ([`super::Meta`]).
    pub const META: Tag = Tag(*b"META");
    /// Tracked connections ([`super::Connection`]).
    pub const CONN: Tag = Tag(*b"CONN");
    /// Session affinity records ([`super::Affinity`]).
    pub const AFFN: Tag = Tag(*b"AFFN");
    /// Neighbours ([`super::Neighbour`]), from version 2.
    pub const NEIG: Tag = Tag(*b"NEIG");
    /// Datagrams in reassembly ([`super::Datagram`]), from version 2.
    pub const FRAG: Tag = Tag(*b"FRAG");
    /// Whether the state is whole or the changes since a pre-copy's base, and then the
    /// connections removed since ([`super::Removed`]), from version 3.
    pub const GONE: Tag = Tag(*b"GONE");
    /// The last section, empty: what comes before it is whole.
    pub const END: Tag = Tag(*b"END.");

    /// What the section holds, for messages.
    pub fn what(self) -> &'static str {
        match self {
            Tag::META => "producer",
            Tag::CONN => "connections",
            Tag::AFFN => "session affinity",
            Tag::NEIG => "neighbours",
            Tag::FRAG => "fragments",
            Tag::GONE => "removed connections",
            Tag::END => "end",
            _ => "unknown",
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in &self.0 {
            if b.is_ascii_graphic() {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({self})")
    }
}

/// The sections of each format version, every one required, in the order written. A
/// version whose records are those of the current one reads as it; one whose records
/// changed since would parse its own structs here and convert them.
fn sections(version: u16) -> &'static [Tag] {
    match version {
        1 => &[Tag::META, Tag::CONN, Tag::AFFN],
        2 => &[Tag::META, Tag::CONN, Tag::AFFN, Tag::NEIG, Tag::FRAG],
        // Version 4 adds SCTP's tracking, a variant of the connection record's.
        3 | 4 => &[
            Tag::META,
            Tag::CONN,
            Tag::AFFN,
            Tag::NEIG,
            Tag::FRAG,
            Tag::GONE,
        ],
        _ => &[],
    }
}

/// The part of a state that was cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The header: magic, version, producer.
    Header,
    /// A section's tag and length (the input ends before the end section).
    SectionHeader,
    /// A section's payload.
    Section(Tag),
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Header => f.write_str("the header"),
            Part::SectionHeader => f.write_str("a section header (no end section)"),
            Part::Section(t) => write!(f, "section {t} ({})", t.what()),
        }
    }
}

/// Why bytes are not a state this build can read. Its message names the problem and
/// where it is; the agent logs it and starts cold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// The bytes do not start with [`MAGIC`].
    NotFerryState,
    /// A format version newer than this build reads.
    NewerVersion {
        /// The state's version.
        found: u16,
        /// The newest this build reads ([`FORMAT`]).
        newest: u16,
    },
    /// A format version that never existed (0).
    UnknownVersion(u16),
    /// The bytes end inside `part`.
    Truncated {
        /// What was cut short.
        part: Part,
        /// Bytes it needs.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// The header's producer string is not UTF-8.
    BadProducer,
    /// A section whose tag this version does not have.
    UnknownSection {
        /// Its tag.
        tag: Tag,
        /// The state's version.
        version: u16,
    },
    /// A section given twice.
    DuplicateSection(Tag),
    /// A section the version requires is missing.
    MissingSection(Tag),
    /// A section's payload does not parse.
    Section {
        /// Its tag.
        tag: Tag,
        /// What the parser said.
        reason: String,
    },
    /// A record no pipeline could have saved.
    Invalid {
        /// The section it is in.
        tag: Tag,
        /// Its index in the section.
        index: usize,
        /// What is impossible about it.
        problem: String,
    },
    /// Bytes after the end section.
    TrailingBytes(usize),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::NotFerryState => write!(
                f,
                "not a ferry handover state (it does not start with {:?})",
                std::str::from_utf8(&MAGIC).unwrap_or_default()
            ),
            StateError::NewerVersion { found, newest } => write!(
                f,
                "handover state format version {found} is newer than this ferry reads \
                 (versions {OLDEST_FORMAT} to {newest})"
            ),
            StateError::UnknownVersion(v) => {
                write!(f, "handover state format version {v} does not exist")
            }
            StateError::Truncated { part, needed, left } => write!(
                f,
                "handover state truncated in {part}: {needed} bytes needed, {left} left"
            ),
            StateError::BadProducer => {
                f.write_str("handover state header: producer version is not UTF-8")
            }
            StateError::UnknownSection { tag, version } => write!(
                f,
                "handover state: section {tag} is not one of format version {version}"
            ),
            StateError::DuplicateSection(t) => {
                write!(f, "handover state: section {t} ({}) given twice", t.what())
            }
            StateError::MissingSection(t) => {
                write!(f, "handover state: section {t} ({}) missing", t.what())
            }
            StateError::Section { tag, reason } => write!(
                f,
                "handover state: section {tag} ({}) does not parse: {reason}",
                tag.what()
            ),
            StateError::Invalid {
                tag,
                index,
                problem,
            } => write!(
                f,
                "handover state: section {tag} ({}) record {index}: {problem}",
                tag.what()
            ),
            StateError::TrailingBytes(n) => {
                write!(f, "handover state: {n} bytes after the end section")
            }
        }
    }
}

impl std::error::Error for StateError {}

/// Postcard written onto the end of a byte vector.
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.0.push(b);
        Ok(())
    }

    fn try_extend(&mut self, b: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends a section: tag, payload length (u32, little-endian), payload.
fn section(out: &mut Vec<u8>, tag: Tag, value: &impl Serialize) {
    out.extend_from_slice(&tag.0);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    // Written in place, its length filled in after: no copy of a large payload.
    postcard::serialize_with_flavor(value, Append(out)).expect("records serialize");
    let len = u32::try_from(out.len() - at - 4).expect("a section under 4 GiB");
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The bytes of `state`, in the current format ([`FORMAT`]).
pub fn encode(state: &SavedState) -> Vec<u8> {
    // About what a record takes, so that the bytes of a full table are not moved.
    let fragments: usize = state.datagrams.iter().map(|d| 64 + d.bytes as usize).sum();
    let mut out = Vec::with_capacity(
        256 + 112 * state.connections.len()
            + 64 * (state.affinity.len() + state.neighbours.len())
            + 48 * state.removed.as_ref().map_or(0, Vec::len)
            + fragments,
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    // At most 255 bytes of producer, cut at a character boundary.
    let mut p = state.producer.as_str();
    while p.len() > 255 {
        let mut end = p.len() - 1;
        while !p.is_char_boundary(end) {
            end -= 1;
        }
        p = &p[..end];
    }
    out.push(p.len() as u8);
    out.extend_from_slice(p.as_bytes());
    for &tag in sections(FORMAT) {
        match tag {
            Tag::META => section(&mut out, tag, &state.meta),
            Tag::CONN => section(&mut out, tag, &state.connections),
            Tag::AFFN => section(&mut out, tag, &state.affinity),
            Tag::NEIG => section(&mut out, tag, &state.neighbours),
            Tag::FRAG => section(&mut out, tag, &state.datagrams),
            Tag::GONE => section(&mut out, tag, &state.removed),
            _ => unreachable!("a section of the current format"),
        }
    }
    out.extend_from_slice(&Tag::END.0);
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

/// Reads bytes in order, naming what is cut short.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, part: Part) -> Result<&'a [u8], StateError> {
        if self.bytes.len() < n {
            return Err(StateError::Truncated {
                part,
                needed: n,
                left: self.bytes.len(),
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
}

/// A section's payload parsed whole: nothing may follow the value.
fn parse<T: DeserializeOwned>(tag: Tag, payload: &[u8]) -> Result<T, StateError> {
    let fail = |reason: String| StateError::Section { tag, reason };
    let (v, rest) = postcard::take_from_bytes(payload).map_err(|e| fail(e.to_string()))?;
    if !rest.is_empty() {
        return Err(fail(format!("{} bytes after its records", rest.len())));
    }
    Ok(v)
}

/// A section's payload of records parsed whole, into a vector of the length it
/// announces (bounded by its bytes, each record at least one): serde's own reading of a
/// sequence grows its vector from a cautious guess, copying a full table's records
/// several times over.
fn parse_records<T: DeserializeOwned>(tag: Tag, payload: &[u8]) -> Result<Vec<T>, StateError> {
    let fail = |reason: String| StateError::Section { tag, reason };
    let (n, mut rest) =
        postcard::take_from_bytes::<u64>(payload).map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(usize::MAX).min(rest.len()));
    for _ in 0..n {
        let (v, r) = postcard::take_from_bytes(rest).map_err(|e| fail(e.to_string()))?;
        out.push(v);
        rest = r;
    }
    if !rest.is_empty() {
        return Err(fail(format!("{} bytes after its records", rest.len())));
    }
    Ok(out)
}

/// Checks every record of a section with `check`.
fn each<T>(
    tag: Tag,
    records: &[T],
    check: impl Fn(&T) -> Result<(), String>,
) -> Result<(), StateError> {
    for (index, r) in records.iter().enumerate() {
        check(r).map_err(|problem| StateError::Invalid {
            tag,
            index,
            problem,
        })?;
    }
    Ok(())
}

/// Checks every record of `state` (see `check`): the first impossible one is the error.
pub(crate) fn check_state(state: &SavedState) -> Result<(), StateError> {
    each(Tag::CONN, &state.connections, check::connection)?;
    each(Tag::AFFN, &state.affinity, check::affinity)?;
    each(Tag::NEIG, &state.neighbours, check::neighbour)?;
    each(Tag::FRAG, &state.datagrams, check::datagram)?;
    each(
        Tag::GONE,
        state.removed.as_deref().unwrap_or_default(),
        check::removed,
    )
}

/// The state in `bytes`, of any format version from [`OLDEST_FORMAT`] to [`FORMAT`],
/// as the current [`SavedState`]; every record checked. Nothing else is returned
/// when anything is wrong.
pub fn decode(bytes: &[u8]) -> Result<SavedState, StateError> {
    let n = MAGIC.len().min(bytes.len());
    if bytes[..n] != MAGIC[..n] {
        return Err(StateError::NotFerryState);
    }
    let mut r = Reader { bytes };
    r.take(MAGIC.len(), Part::Header)?;
    let v = r.take(2, Part::Header)?;
    let version = u16::from_le_bytes([v[0], v[1]]);
    if version > FORMAT {
        return Err(StateError::NewerVersion {
            found: version,
            newest: FORMAT,
        });
    }
    if version < OLDEST_FORMAT {
        return Err(StateError::UnknownVersion(version));
    }
    let len = r.take(1, Part::Header)?[0];
    let producer = std::str::from_utf8(r.take(usize::from(len), Part::Header)?)
        .map_err(|_| StateError::BadProducer)?;
    let mut state = SavedState {
        format: version,
        producer: producer.to_string(),
        ..SavedState::default()
    };
    let known = sections(version);
    let mut seen = Vec::with_capacity(known.len());
    loop {
        let head = r.take(8, Part::SectionHeader)?;
        let tag = Tag([head[0], head[1], head[2], head[3]]);
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let payload = r.take(len, Part::Section(tag))?;
        if tag == Tag::END {
            if len != 0 {
                return Err(StateError::Section {
                    tag,
                    reason: format!("{len} bytes in the end section"),
                });
            }
            break;
        }
        if !known.contains(&tag) {
            return Err(StateError::UnknownSection { tag, version });
        }
        if seen.contains(&tag) {
            return Err(StateError::DuplicateSection(tag));
        }
        seen.push(tag);
        match tag {
            Tag::META => state.meta = parse(tag, payload)?,
            Tag::CONN => state.connections = parse_records(tag, payload)?,
            Tag::AFFN => state.affinity = parse_records(tag, payload)?,
            Tag::NEIG => state.neighbours = parse_records(tag, payload)?,
            Tag::FRAG => state.datagrams = parse_records(tag, payload)?,
            Tag::GONE => state.removed = parse(tag, payload)?,
            _ => unreachable!("a known section"),
        }
    }
    if !r.bytes.is_empty() {
        return Err(StateError::TrailingBytes(r.bytes.len()));
    }
    if let Some(&t) = known.iter().find(|t| !seen.contains(t)) {
        return Err(StateError::MissingSection(t));
    }
    check_state(&state)?;
    Ok(state)
}
