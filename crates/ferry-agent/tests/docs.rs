//! docs/agent.md documents every annotation and ferry-config key the agent reads, and
//! docs/observability.md every metric it serves: the documentation cannot fall behind
//! the code.

use ferry_agent::config::{
    KEY_ENCAPSULATION, KEY_EXTERNAL_SNAT, KEY_POLICY_HOST_TO_PODS, KEY_POLICY_ON_CHANGE,
    KEY_UPLINK, KEY_VXLAN_PORT, KEY_VXLAN_VNI,
};
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
        KEY_POLICY_HOST_TO_PODS,
        KEY_POLICY_ON_CHANGE,
        KEY_UPLINK,
    ] {
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/agent.md lacks `{name}`"
        );
    }
}

#[test]
fn observability_doc_lists_every_metric() {
    let doc = include_str!("../../../docs/observability.md");
    let c = ferry_api::Counters {
        ports: vec![ferry_api::PortCounters {
            name: "uplink".into(),
            ..Default::default()
        }],
        drops: [("ct_invalid".to_string(), 1)].into(),
        // Rendered only while the audit log is on.
        policy_audit: Some(ferry_api::PolicyAuditCounters::default()),
        ..Default::default()
    };
    let text = ferry_agent::metrics::render(&c);
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() > 20, "{text}");
    for name in families {
        // Counters are documented with the `_total` their samples carry.
        let documented = [format!("`{name}`"), format!("`{name}_total`")];
        assert!(
            documented.iter().any(|d| doc.contains(d.as_str())),
            "docs/observability.md lacks the metric {name}"
        );
    }
}
