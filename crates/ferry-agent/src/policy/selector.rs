//! Label selectors (`metav1.LabelSelector`) and the syntax of labels, names and port
//! names, as the API server checks them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::fields::{Errors, FieldError};

/// How a requirement compares a label with its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    /// The label is set to one of the values.
    In,
    /// The label is not set, or set to none of the values.
    NotIn,
    /// The label is set (no values).
    Exists,
    /// The label is not set (no values).
    DoesNotExist,
}

/// One of a selector's `matchExpressions`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The comparison.
    pub operator: Operator,
    /// The values: non-empty for In and NotIn, empty for Exists and DoesNotExist.
    pub values: BTreeSet<String>,
}

impl Requirement {
    /// True when `labels` meet it.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A label selector, checked: `matchLabels` and `matchExpressions`, all of which must
/// hold. The empty selector selects everything (as Kubernetes reads `{}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    /// Labels that must be set to these values.
    pub match_labels: BTreeMap<String, String>,
    /// Requirements that must hold.
    pub match_expressions: Vec<Requirement>,
}

impl Selector {
    /// The selector that selects everything.
    pub fn everything() -> Selector {
        Selector::default()
    }

    /// True when it selects everything: no labels, no requirements.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// True when an object with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// Reads and checks the selector at `field` (`spec.podSelector`): label keys and
    /// values must be valid, operators known, In and NotIn need values, Exists and
    /// DoesNotExist take none.
    pub fn parse(s: &LabelSelector, field: &str) -> Result<Selector, Vec<FieldError>> {
        let mut e = Errors::default();
        let sel = Selector::parse_into(s, field, &mut e);
        e.finish(sel)
    }

    pub(crate) fn parse_into(s: &LabelSelector, field: &str, e: &mut Errors) -> Selector {
        let mut sel = Selector::default();
        for (k, v) in s.match_labels.iter().flatten() {
            let f = format!("{field}.matchLabels[{k}]");
            let ok_key = check_label_key(k, &f, e);
            let ok_value = check_label_value(v, &f, e);
            if ok_key && ok_value {
                sel.match_labels.insert(k.clone(), v.clone());
            }
        }
        for (i, r) in s.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            let ok_key = check_label_key(&r.key, &format!("{f}.key"), e);
            let values = r.values.as_deref().unwrap_or_default();
            let operator = match r.operator.as_str() {
                "In" => Some(Operator::In),
                "NotIn" => Some(Operator::NotIn),
                "Exists" => Some(Operator::Exists),
                "DoesNotExist" => Some(Operator::DoesNotExist),
                o => {
                    e.push(
                        format!("{f}.operator"),
                        format!("{o:?}: expected In, NotIn, Exists or DoesNotExist"),
                    );
                    None
                }
            };
            let mut ok = ok_key && operator.is_some();
            match operator {
                Some(Operator::In | Operator::NotIn) if values.is_empty() => {
                    e.push(format!("{f}.values"), "must be non-empty for In and NotIn");
                    ok = false;
                }
                Some(Operator::Exists | Operator::DoesNotExist) if !values.is_empty() => {
                    e.push(
                        format!("{f}.values"),
                        "must be empty for Exists and DoesNotExist",
                    );
                    ok = false;
                }
                _ => {}
            }
            for (j, v) in values.iter().enumerate() {
                ok &= check_label_value(v, &format!("{f}.values[{j}]"), e);
            }
            if let (true, Some(operator)) = (ok, operator) {
                sel.match_expressions.push(Requirement {
                    key: r.key.clone(),
                    operator,
                    values: values.iter().cloned().collect(),
                });
            }
        }
        sel
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most `max` long: the name part of a
/// label key, and a label value when not empty.
fn is_qualified_part(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// A DNS-1123 subdomain: dot-separated lowercase labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// at most 253 long.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns_label)
}

/// A DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 long (the syntax of
/// namespace names).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63.
pub fn is_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_part(name, 63),
        None => is_qualified_part(k, 63),
    }
}

/// A label value: empty, or like the name part of a key.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_qualified_part(v, 63)
}

/// An IANA service name, as a named port must be: 1-15 of lowercase letters, digits
/// and `-`, at least one letter, no `-` first, last or twice in a row.
pub fn is_port_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

fn check_label_key(k: &str, field: &str, e: &mut Errors) -> bool {
    let ok = is_label_key(k);
    if !ok {
        e.push(
            field,
            format!(
                "{k:?} is not a label key (an optional DNS subdomain and '/', then at most 63 of alphanumerics, '-', '_' or '.', alphanumeric first and last)"
            ),
        );
    }
    ok
}

fn check_label_value(v: &str, field: &str, e: &mut Errors) -> bool {
    let ok = is_label_value(v);
    if !ok {
        e.push(
            field,
            format!(
                "{v:?} is not a label value (at most 63 of alphanumerics, '-', '_' or '.', alphanumeric first and last)"
            ),
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(yaml: &str) -> LabelSelector {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn fields_of(r: Result<Selector, Vec<FieldError>>) -> Vec<String> {
        r.unwrap_err().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn the_empty_selector_selects_everything() {
        let s = Selector::parse(&selector("{}"), "spec.podSelector").unwrap();
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("app", "web")])));
        assert_eq!(s, Selector::everything());
    }

    #[test]
    fn match_labels_and_every_operator_as_kubernetes_reads_them() {
        let s = Selector::parse(
            &selector(
                r#"
matchLabels: {app: web}
matchExpressions:
- {key: tier, operator: In, values: [front, back]}
- {key: env, operator: NotIn, values: [prod]}
- {key: team, operator: Exists}
- {key: legacy, operator: DoesNotExist}
"#,
            ),
            "s",
        )
        .unwrap();
        let base = [("app", "web"), ("tier", "front"), ("team", "x")];
        assert!(s.matches(&labels(&base)));
        // NotIn holds when the label is absent, and fails on a listed value.
        assert!(s.matches(&labels(&[base[0], base[1], base[2], ("env", "dev")])));
        assert!(!s.matches(&labels(&[base[0], base[1], base[2], ("env", "prod")])));
        assert!(!s.matches(&labels(&[base[0], base[1], base[2], ("legacy", "")])));
        assert!(!s.matches(&labels(&[base[0], base[1]])), "team must exist");
        assert!(!s.matches(&labels(&[base[0], ("tier", "db"), base[2]])));
        assert!(!s.matches(&labels(&[("app", "db"), base[1], base[2]])));
    }

    #[test]
    fn bad_operators_values_keys_and_label_values_are_named() {
        let errs = fields_of(Selector::parse(
            &selector(
                r#"
matchLabels: {"bad key!": x, ok: "-no"}
matchExpressions:
- {key: a, operator: Has}
- {key: b, operator: In}
- {key: c, operator: NotIn, values: []}
- {key: d, operator: Exists, values: [x]}
- {key: e, operator: DoesNotExist, values: [x]}
- {key: "/f", operator: Exists}
- {key: g, operator: In, values: [ok, "bad value"]}
"#,
            ),
            "spec.ingress[0].from[1].podSelector",
        ));
        let p = "spec.ingress[0].from[1].podSelector";
        assert_eq!(
            errs,
            [
                format!("{p}.matchLabels[bad key!]"),
                format!("{p}.matchLabels[ok]"),
                format!("{p}.matchExpressions[0].operator"),
                format!("{p}.matchExpressions[1].values"),
                format!("{p}.matchExpressions[2].values"),
                format!("{p}.matchExpressions[3].values"),
                format!("{p}.matchExpressions[4].values"),
                format!("{p}.matchExpressions[5].key"),
                format!("{p}.matchExpressions[6].values[1]"),
            ]
        );
    }

    #[test]
    fn label_keys_values_and_port_names_follow_the_api() {
        assert!(is_label_key("app"));
        assert!(is_label_key("kubernetes.io/metadata.name"));
        assert!(is_label_key("a.b-c_d"));
        assert!(!is_label_key("Example.COM/app"), "the prefix is lowercase");
        assert!(!is_label_key(""));
        assert!(!is_label_key("a/"));
        assert!(!is_label_key(&"a".repeat(64)));
        assert!(is_label_value(""));
        assert!(is_label_value("v1.2_3-x"));
        assert!(!is_label_value("_x"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(is_port_name("http"));
        assert!(is_port_name("serve-80"));
        assert!(!is_port_name("80"), "at least one letter");
        assert!(!is_port_name("Http"));
        assert!(!is_port_name("-http"));
        assert!(!is_port_name("ht--tp"));
        assert!(!is_port_name("a-very-long-name"), "16 characters");
        assert!(!is_port_name(""));
    }
}
