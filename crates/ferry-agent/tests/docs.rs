//! docs/agent.md documents every annotation and ferry-config key the agent reads: the
//! documentation cannot fall behind the code.

use ferry_agent::config::{KEY_ENCAPSULATION, KEY_EXTERNAL_SNAT, KEY_VXLAN_PORT, KEY_VXLAN_VNI};
use ferry_agent::fields::{
    ANNOTATION_EXTERNAL_SNAT, ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV4_GATEWAY,
    ANNOTATION_IPV6_ADDRESS, ANNOTATION_IPV6_GATEWAY,
};

#[test]
fn agent_doc_names_every_annotation_and_config_key() {
    let doc = include_str!("../../../docs/agent.md");
    for name in [
        ANNOTATION_IPV4_ADDRESS,
        ANNOTATION_IPV6_ADDRESS,
        ANNOTATION_IPV4_GATEWAY,
        ANNOTATION_IPV6_GATEWAY,
        ANNOTATION_EXTERNAL_SNAT,
        KEY_VXLAN_VNI,
        KEY_VXLAN_PORT,
        KEY_ENCAPSULATION,
        KEY_EXTERNAL_SNAT,
    ] {
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/agent.md lacks `{name}`"
        );
    }
}
