//! docs/cni.md documents every error code the plugin answers with, every configuration
//! key it reads and every version it speaks: the documentation cannot fall behind.

use ferry_cni::Version;
use ferry_cni::error::code;

const DOC: &str = include_str!("../../../docs/cni.md");

#[test]
fn cni_doc_lists_every_error_code() {
    for c in [
        code::INCOMPATIBLE_VERSION,
        code::UNSUPPORTED_FIELD,
        code::UNKNOWN_CONTAINER,
        code::INVALID_ENVIRONMENT,
        code::IO_FAILURE,
        code::DECODING_FAILURE,
        code::INVALID_NETWORK_CONFIG,
        code::TRY_AGAIN_LATER,
        code::PLUGIN_NOT_AVAILABLE,
        code::NO_FREE_ADDRESS,
        code::CHECK_FAILED,
    ] {
        assert!(
            DOC.contains(&format!("\n| {c} |")),
            "docs/cni.md lacks code {c}"
        );
    }
}

#[test]
fn cni_doc_lists_every_code_of_the_agent() {
    let (_, agent) = DOC
        .split_once("### The agent's codes")
        .expect("docs/cni.md has a section on the agent's codes");
    for c in [
        ferry_api::ERR_AGENT,
        ferry_api::ERR_BAD_REQUEST,
        ferry_api::ERR_WORKER,
        ferry_api::ERR_TABLES,
        ferry_api::ERR_INTERFACE,
    ] {
        assert!(
            agent.contains(&format!("\n| {c} |")),
            "docs/cni.md lacks the agent's code {c}"
        );
    }
}

#[test]
fn cni_doc_names_every_configuration_key_and_version() {
    for key in [
        "socket",
        "dataDir",
        "dns",
        "ipam",
        "cni.dev/valid-attachments",
    ] {
        assert!(
            DOC.contains(&format!("`{key}`")),
            "docs/cni.md lacks `{key}`"
        );
    }
    for v in Version::ALL {
        assert!(DOC.contains(v.as_str()), "docs/cni.md lacks {}", v.as_str());
    }
    assert!(DOC.contains(ferry_api::DEFAULT_SOCKET));
    assert!(DOC.contains(ferry_cni::config::DEFAULT_DATA_DIR));
}
