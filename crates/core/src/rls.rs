//! How a rate-limit request from Envoy (its domain and each descriptor's entries) names a
//! group.
//!
//! Rules are tried in order; for each rule, a descriptor's entries in order. A rule matches an
//! entry when its `domain` is empty or equal to the request's, its `key` equals the entry's
//! key, and its `value` is empty or equal to the entry's value; the group is the rule's
//! `group` with `{value}` replaced by the entry's value. With no rules at all, an entry with
//! key `tenant` names the group by its value. A descriptor nothing matches uses `default`.
//!
//! ```
//! use tollgate_model::rls::{RlsRule, group_for};
//! let rules = vec![RlsRule { domain: "edge".into(), key: "path".into(), value: "/api".into(), group: "api".into() }];
//! assert_eq!(group_for(&rules, "edge", &[("path", "/api")]), "api");
//! assert_eq!(group_for(&[], "any", &[("tenant", "acme")]), "acme");
//! assert_eq!(group_for(&rules, "other", &[("path", "/api")]), "default");
//! ```

use serde::{Deserialize, Serialize};

use crate::settings::{DEFAULT_GROUP, check_group_name};

/// One mapping rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsRule {
    /// The request's domain this rule applies to (empty: any).
    #[serde(default)]
    pub domain: String,
    /// The descriptor entry's key.
    pub key: String,
    /// The entry's value (empty: any).
    #[serde(default)]
    pub value: String,
    /// The group: a name, where `{value}` stands for the entry's value.
    pub group: String,
}

/// The most rules.
pub const RULES_MAX: usize = 1000;
/// The longest domain, key, value or group template, in bytes.
pub const FIELD_MAX_BYTES: usize = 255;

impl RlsRule {
    /// What is wrong with this rule, prefixed by `at` (such as `rules[3]`).
    pub fn check(&self, at: &str) -> Result<(), String> {
        for (name, v) in
            [("domain", &self.domain), ("key", &self.key), ("value", &self.value), ("group", &self.group)]
        {
            if v.len() > FIELD_MAX_BYTES || v.chars().any(char::is_control) {
                return Err(format!("{at}.{name}: at most {FIELD_MAX_BYTES} bytes of printable text"));
            }
        }
        if self.key.is_empty() {
            return Err(format!("{at}.key: must not be empty"));
        }
        if self.group.is_empty() {
            return Err(format!("{at}.group: must not be empty"));
        }
        let sample = self.group.replace("{value}", "v");
        check_group_name(&sample).map_err(|e| format!("{at}.group: {}", e.rule))?;
        Ok(())
    }
}

/// Checks a whole rule list.
pub fn check_rules(rules: &[RlsRule]) -> Result<(), String> {
    if rules.len() > RULES_MAX {
        return Err(format!("rules: at most {RULES_MAX}, got {}", rules.len()));
    }
    for (i, r) in rules.iter().enumerate() {
        r.check(&format!("rules[{i}]"))?;
    }
    Ok(())
}

/// The group a descriptor's `entries` (key, value) name under `rules` in `domain`.
pub fn group_for(rules: &[RlsRule], domain: &str, entries: &[(&str, &str)]) -> String {
    if rules.is_empty() {
        return entries
            .iter()
            .find(|(k, v)| *k == "tenant" && !v.is_empty())
            .map_or_else(|| DEFAULT_GROUP.to_string(), |(_, v)| (*v).to_string());
    }
    for r in rules {
        if !r.domain.is_empty() && r.domain != domain {
            continue;
        }
        if let Some((_, v)) =
            entries.iter().find(|(k, v)| *k == r.key && (r.value.is_empty() || r.value == *v))
        {
            return r.group.replace("{value}", v);
        }
    }
    DEFAULT_GROUP.to_string()
}

/// The largest rules document taken, in bytes.
pub const RULES_MAX_BYTES: usize = 1 << 20;

/// Rules from JSON (an array of `{domain, key, value, group}`), checked.
pub fn rules_from_json(text: &str) -> Result<Vec<RlsRule>, String> {
    if text.len() > RULES_MAX_BYTES {
        return Err(format!("rules: larger than {RULES_MAX_BYTES} bytes"));
    }
    let rules: Vec<RlsRule> = serde_json::from_str(text).map_err(|e| {
        format!("rules: expected a JSON array of objects with string fields domain, key, value, group: {e}")
    })?;
    check_rules(&rules)?;
    Ok(rules)
}

/// Rules as JSON.
pub fn rules_to_json(rules: &[RlsRule]) -> String {
    serde_json::to_string(rules).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_json_and_are_checked() {
        let rules = vec![
            RlsRule {
                domain: "edge".into(),
                key: "tenant".into(),
                value: String::new(),
                group: "t-{value}".into(),
            },
            RlsRule { domain: String::new(), key: "path".into(), value: "/a\"b".into(), group: "api".into() },
        ];
        let json = rules_to_json(&rules);
        assert_eq!(rules_from_json(&json).unwrap(), rules);
        assert_eq!(rules_from_json("[]").unwrap(), vec![]);
        let long = format!(r#"[{{"key":"k","group":"{}"}}]"#, "g".repeat(300));
        let cases: [(&str, &str); 6] = [
            ("{}", "expected a JSON array"),
            (r#"[{"key":"","group":"g"}]"#, "rules[0].key: must not be empty"),
            (&long, "rules[0].group: at most 255 bytes"),
            (r#"[{"key":"k"}]"#, "missing field `group`"),
            (r#"[{"key":"k","group":"g","colour":"red"}]"#, "unknown field `colour`"),
            (r#"[{"key":1,"group":"g"}]"#, "rules"),
        ];
        for (bad, expect) in cases {
            let e = rules_from_json(bad).unwrap_err();
            assert!(e.contains(expect), "{bad}: {e}");
        }
    }

    #[test]
    fn the_first_rule_that_matches_an_entry_names_the_group() {
        let rules = vec![
            RlsRule { domain: "edge".into(), key: "path".into(), value: "/api".into(), group: "api".into() },
            RlsRule {
                domain: String::new(),
                key: "tenant".into(),
                value: String::new(),
                group: "t-{value}".into(),
            },
        ];
        assert_eq!(group_for(&rules, "edge", &[("tenant", "a"), ("path", "/api")]), "api");
        assert_eq!(group_for(&rules, "other", &[("tenant", "a"), ("path", "/api")]), "t-a");
        assert_eq!(group_for(&rules, "edge", &[("user", "x")]), "default");
        assert_eq!(group_for(&[], "edge", &[("user", "x")]), "default");
        assert_eq!(group_for(&[], "edge", &[("user", "x"), ("tenant", "b")]), "b");
    }
}
