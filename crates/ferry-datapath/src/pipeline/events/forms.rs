//! The serde forms of the datapath's own types in trace events, kept here so that those
//! types stay free of the trace's needs.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::conntrack::CtState;
use crate::drop::DropReason;
use crate::flow::{Addr, FlowKey};
use crate::icmp::ErrorKind;
use crate::lb::Scope;
use crate::wire::ethernet::MacAddr;

/// A flow key: addresses, ports, protocol number and zone.
#[derive(Serialize, Deserialize)]
#[serde(remote = "FlowKey")]
pub(super) struct FlowKeyDef {
    #[serde(with = "addr")]
    src: Addr,
    src_port: u16,
    #[serde(with = "addr")]
    dst: Addr,
    dst_port: u16,
    proto: u8,
    zone: u16,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "Scope", rename_all = "snake_case")]
pub(super) enum ScopeDef {
    Internal,
    External,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "CtState", rename_all = "snake_case")]
pub(super) enum CtStateDef {
    New,
    Established,
    Related,
    Invalid,
    Untracked,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "ErrorKind", tag = "type", rename_all = "snake_case")]
pub(super) enum ErrorKindDef {
    TooBig { mtu: u32 },
    TimeExceeded,
    Unreachable { code: u8 },
}

pub(super) mod addr {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(a: &Addr, s: S) -> Result<S::Ok, S::Error> {
        a.ip().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Addr, D::Error> {
        IpAddr::deserialize(d).map(Addr::from)
    }
}

/// A MAC as `02:00:00:00:00:01`.
pub(super) mod mac {
    use super::*;
    use serde::{Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(m: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&MacAddr(*m))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 6], D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<MacAddr>().map(|m| m.0).map_err(D::Error::custom)
    }
}

/// A drop reason by its stable name.
pub(super) mod reason {
    use super::*;
    use serde::{Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(r: &DropReason, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(r.name())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DropReason, D::Error> {
        let s = String::deserialize(d)?;
        DropReason::from_name(&s).ok_or_else(|| D::Error::custom(format!("no drop reason {s}")))
    }
}
