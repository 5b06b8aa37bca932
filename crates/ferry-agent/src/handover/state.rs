//! The connection state a giver saves and a taker loads: the bytes of the datapath's
//! versioned format.

use ferry_datapath::Pipeline;

/// The state of `pipeline` at `now_ns` (its clock), as bytes to hand over.
pub(crate) fn save(_pipeline: &Pipeline, _now_ns: u64) -> Vec<u8> {
    Vec::new()
}

/// Loads handed-over `bytes` into `pipeline` (which tracks nothing yet), all or
/// nothing; what was loaded, for the logs, or why nothing was.
pub(crate) fn load(_pipeline: &mut Pipeline, bytes: &[u8], _now_ns: u64) -> Result<String, String> {
    if bytes.is_empty() {
        Ok("no connection state".into())
    } else {
        Err(format!(
            "{} bytes of a state this agent does not read",
            bytes.len()
        ))
    }
}
