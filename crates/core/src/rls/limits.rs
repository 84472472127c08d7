//! Limitador's limits, applied as Limitador applies them.
//!
//! A domain imported from a Limitador limits file (its namespace) keeps the file's limits: each
//! a list of conditions on the request's descriptors (`descriptors[i]['key'] == 'value'` or
//! `!=`, on any descriptor, in any order), a list of variables (`descriptors[i]['key']`), and a
//! group. A request does not name one group per descriptor: every limit whose conditions all
//! hold and whose variables all have a value applies to it, each a counter of its own per
//! value of its variables (a limit with neither conditions nor variables is one counter for
//! the whole namespace), and the request is refused when any of them has nothing left, taking
//! nothing from the others.

use serde::{Deserialize, Serialize};

use super::{FIELD_MAX_BYTES, THEN_MAX};
use crate::settings::check_group_name;

/// One namespace's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSet {
    /// The domain (Limitador's namespace) the limits answer for.
    pub domain: String,
    /// The limits, in the file's order.
    #[serde(default)]
    pub limits: Vec<Limit>,
}

/// One limit: when it applies, and the group it counts against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    /// Every condition must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Every variable must have a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<Entry>,
    /// The group's name template: `{i.KEY}` stands for the value of entry `KEY` of
    /// descriptor `i`.
    pub group: String,
}

/// A descriptor's entry: which descriptor (from 0) and its key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The descriptor, counted from 0.
    #[serde(default)]
    pub descriptor: u32,
    /// The entry's key.
    pub key: String,
}

/// A condition: an entry's value equals (or, with `not`, differs from) `value`. An entry the
/// descriptor lacks (or a descriptor the request lacks) holds no condition, `!=` included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// The entry tested.
    #[serde(flatten)]
    pub entry: Entry,
    /// `!=` rather than `==`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not: bool,
    /// The value compared with.
    pub value: String,
}

/// The most limits in one namespace.
pub const LIMITS_MAX: usize = 1000;

impl Entry {
    /// The entry's value in `descriptors` (each a list of key and value), if it is there.
    fn value_in<'d>(&self, descriptors: &[Vec<(&str, &'d str)>]) -> Option<&'d str> {
        let d = descriptors.get(self.descriptor as usize)?;
        d.iter().find(|(k, _)| *k == self.key).map(|(_, v)| *v)
    }
}

impl LimitSet {
    /// The groups of every limit that applies to a request's `descriptors`, in the file's
    /// order, each once.
    pub fn applying(&self, descriptors: &[Vec<(&str, &str)>]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for l in &self.limits {
            let holds = l
                .conditions
                .iter()
                .all(|c| c.entry.value_in(descriptors).is_some_and(|v| (v == c.value) != c.not));
            if !holds || l.variables.iter().any(|v| v.value_in(descriptors).is_none()) {
                continue;
            }
            let group = fill(&l.group, descriptors);
            if !out.contains(&group) {
                out.push(group);
            }
        }
        out
    }

    /// What is wrong with the set, prefixed by `at` (such as `limits[0]`).
    pub fn check(&self, at: &str) -> Result<(), String> {
        let text = |field: String, v: &str| {
            if v.is_empty() || v.len() > FIELD_MAX_BYTES || v.chars().any(char::is_control) {
                return Err(format!("{field}: 1 to {FIELD_MAX_BYTES} bytes of printable text"));
            }
            Ok(())
        };
        text(format!("{at}.domain"), &self.domain)?;
        if self.limits.len() > LIMITS_MAX {
            return Err(format!("{at}.limits: at most {LIMITS_MAX}, got {}", self.limits.len()));
        }
        for (i, l) in self.limits.iter().enumerate() {
            let at = format!("{at}.limits[{i}]");
            if l.conditions.len() > THEN_MAX || l.variables.len() > THEN_MAX {
                return Err(format!("{at}: at most {THEN_MAX} conditions and {THEN_MAX} variables"));
            }
            for (j, c) in l.conditions.iter().enumerate() {
                text(format!("{at}.conditions[{j}].key"), &c.entry.key)?;
                if c.value.len() > FIELD_MAX_BYTES || c.value.chars().any(char::is_control) {
                    return Err(format!(
                        "{at}.conditions[{j}].value: at most {FIELD_MAX_BYTES} bytes of printable text"
                    ));
                }
            }
            for (j, v) in l.variables.iter().enumerate() {
                text(format!("{at}.variables[{j}].key"), &v.key)?;
            }
            text(format!("{at}.group"), &l.group)?;
            check_group_name(&fill(&l.group, &[])).map_err(|e| format!("{at}.group: {}", e.rule))?;
        }
        Ok(())
    }
}

/// `template` with each `{i.KEY}` replaced by the value of entry `KEY` of descriptor `i`.
fn fill(template: &str, descriptors: &[Vec<(&str, &str)>]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        out.push_str(&rest[..open]);
        let inner = &rest[open + 1..open + close];
        let value = inner.split_once('.').and_then(|(i, key)| {
            let entry = Entry { descriptor: i.parse().ok()?, key: key.to_string() };
            entry.value_in(descriptors)
        });
        out.push_str(value.unwrap_or(""));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(descriptor: u32, key: &str) -> Entry {
        Entry { descriptor, key: key.into() }
    }

    fn cond(descriptor: u32, key: &str, not: bool, value: &str) -> Condition {
        Condition { entry: entry(descriptor, key), not, value: value.into() }
    }

    /// Limitador's documented cases: conditions in any order of entries, on any descriptor,
    /// `!=` on an entry that is there, variables that must all resolve, and a limit on the
    /// whole namespace.
    #[test]
    fn every_limit_whose_conditions_hold_applies_with_a_counter_per_variable_value() {
        let set = LimitSet {
            domain: "media".into(),
            limits: vec![
                Limit {
                    conditions: vec![cond(0, "method", false, "POST")],
                    variables: vec![entry(0, "user")],
                    group: "media/method=POST/user={0.user}".into(),
                },
                Limit {
                    conditions: vec![cond(0, "path", true, "/health"), cond(1, "plan", false, "free")],
                    variables: vec![],
                    group: "media/free-not-health".into(),
                },
                Limit { conditions: vec![], variables: vec![], group: "media/all".into() },
            ],
        };
        let d = |entries: &[&[(&'static str, &'static str)]]| -> Vec<Vec<(&'static str, &'static str)>> {
            entries.iter().map(|e| e.to_vec()).collect()
        };
        // Entries in another order, and one more: the limit still applies.
        let post = d(&[&[("user", "ann"), ("x", "1"), ("method", "POST")]]);
        assert_eq!(set.applying(&post), ["media/method=POST/user=ann", "media/all"]);
        // A variable missing: that limit does not apply.
        assert_eq!(set.applying(&d(&[&[("method", "POST")]])), ["media/all"]);
        // != holds only on an entry that is there; a condition on the second descriptor.
        assert_eq!(
            set.applying(&d(&[&[("path", "/a")], &[("plan", "free")]])),
            ["media/free-not-health", "media/all"]
        );
        assert_eq!(set.applying(&d(&[&[("path", "/health")], &[("plan", "free")]])), ["media/all"]);
        assert_eq!(set.applying(&d(&[&[("x", "1")], &[("plan", "free")]])), ["media/all"]);
        assert!(set.check("limits[0]").is_ok());
        let bad =
            LimitSet { domain: "m".into(), limits: vec![Limit { group: String::new(), ..Limit::default() }] };
        assert!(bad.check("limits[0]").unwrap_err().starts_with("limits[0].limits[0].group"));
    }
}
