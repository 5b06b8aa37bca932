//! The connection state a giver saves and a taker loads: the bytes of the datapath's
//! versioned format ([`ferry_datapath::handover`]).

use ferry_datapath::Pipeline;
use ferry_datapath::handover;

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
