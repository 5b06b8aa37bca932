//! The connection state a giver saves and a taker loads: the bytes of the datapath's
//! versioned format ([`ferry_datapath::handover`]).

use ferry_datapath::Pipeline;
use ferry_datapath::handover::{self, RestoreOptions};

/// The state of `pipeline` at `now_ns` (its clock), as bytes to hand over.
pub(crate) fn save(pipeline: &Pipeline, now_ns: u64) -> Vec<u8> {
    handover::encode(&pipeline.save_state(now_ns))
}

/// Loads handed-over `bytes` into `pipeline` (which holds nothing yet), all or
/// nothing: what was loaded, as a log line, or why nothing was.
pub(crate) fn load(pipeline: &mut Pipeline, bytes: &[u8], now_ns: u64) -> Result<String, String> {
    let state = handover::decode(bytes).map_err(|e| e.to_string())?;
    let format = state.format;
    let producer = state.producer.clone();
    let restored = pipeline
        .restore_state(&state, now_ns)
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "{restored} (format {format}, written by ferry {producer})"
    ))
}

/// Loads a pre-copy's base `bytes` into `pipeline` (which holds nothing yet), its
/// records `age_ns` old, all or nothing: what was loaded, as a log line, or why nothing
/// was.
pub(crate) fn load_base(
    pipeline: &mut Pipeline,
    bytes: &[u8],
    now_ns: u64,
    age_ns: u64,
) -> Result<String, String> {
    let state = handover::decode(bytes).map_err(|e| e.to_string())?;
    if state.removed.is_some()
        || !state.affinity.is_empty()
        || !state.neighbours.is_empty()
        || !state.datagrams.is_empty()
    {
        return Err("the pre-copy's base holds more than connections".into());
    }
    let options = RestoreOptions {
        stale: false,
        age_ns,
    };
    let restored = pipeline
        .restore_state_with(&state, now_ns, options)
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "{restored} (format {}, written by ferry {})",
        state.format, state.producer
    ))
}

/// Applies the changes since a pre-copy's base, `bytes`, over the base loaded into
/// `pipeline`: what was loaded, as a log line, or why nothing was (the pipeline must
/// then not forward).
pub(crate) fn load_changes(
    pipeline: &mut Pipeline,
    bytes: &[u8],
    now_ns: u64,
) -> Result<String, String> {
    let state = handover::decode(bytes).map_err(|e| e.to_string())?;
    let removed = state.removed.as_ref().map(Vec::len);
    let restored = pipeline
        .apply_changes(&state, now_ns)
        .map_err(|e| e.to_string())?;
    Ok(match removed {
        Some(n) => format!("changes since the base: {restored}, {n} connections removed"),
        None => format!("a whole state in the base's place: {restored}"),
    })
}
