//! How a rate-limit request from Envoy (its domain and each descriptor's entries) names a
//! group.
//!
//! Rules are tried in order; for each rule, a descriptor's entries in order. A rule matches an
//! entry when its `domain` is empty or equal to the request's, its `key` equals the entry's
//! key, and its `value` is empty or equal to the entry's value; a rule with `then` entries
//! (envoy/ratelimit's nested descriptors: tenant, then path) also needs the entries right after
//! that one to match them, in order. The group is the rule's `group` with `{value}` replaced
//! by the first matched entry's value and `{KEY}` by the value of the matched entry with that
//! key. In a domain no rule names (a rule with an empty domain names every domain), an entry
//! with key `tenant` names the group by its value. A descriptor nothing matches uses
//! `default`. A domain imported from an envoy/ratelimit file is answered by its descriptor
//! tree instead, exactly as envoy/ratelimit answers ([`tree`], [`RuleSet`]).
//!
//! ```
//! use tollgate_model::rls::{RlsRule, RuleEntry, group_for};
//! let rules = vec![
//!     RlsRule { domain: "edge".into(), key: "path".into(), value: "/api".into(), group: "api".into(), ..RlsRule::default() },
//!     RlsRule {
//!         key: "tenant".into(),
//!         then: vec![RuleEntry { key: "plan".into(), value: String::new() }],
//!         group: "{tenant}.{plan}".into(),
//!         ..RlsRule::default()
//!     },
//! ];
//! assert_eq!(group_for(&rules, "edge", &[("path", "/api")]), "api");
//! assert_eq!(group_for(&rules, "any", &[("tenant", "acme"), ("plan", "gold")]), "acme.gold");
//! assert_eq!(group_for(&rules, "any", &[("tenant", "acme")]), "default");
//! assert_eq!(group_for(&[], "any", &[("tenant", "acme")]), "acme");
//! ```

pub mod limits;
pub mod tree;

use serde::{Deserialize, Serialize};

use crate::settings::{DEFAULT_GROUP, check_group_name};
pub use limits::LimitSet;
pub use tree::{Found, Node, Tree, TreeLimit};

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
    /// The group: a name, where `{value}` stands for the first matched entry's value and
    /// `{KEY}` for the value of the matched entry with key `KEY`.
    pub group: String,
    /// The entries that must follow the matched one, in order (nested descriptors).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<RuleEntry>,
    /// Match only a whole descriptor: the rule's entries are all of its entries, from the
    /// first (envoy/ratelimit's matching), rather than a run of them anywhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
    /// A name that other rules' `replaces` refer to (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The rules (by `name`) this one lifts: in a request where one descriptor matches this
    /// rule, the descriptors that match a rule named here are not limited (envoy/ratelimit's
    /// `replaces`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

/// An entry a rule matches after its first: a key, and a value (empty: any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's value (empty: any).
    #[serde(default)]
    pub value: String,
}

/// The most rules.
pub const RULES_MAX: usize = 1000;
/// The longest domain, key, value or group template, in bytes.
pub const FIELD_MAX_BYTES: usize = 255;
/// The most entries a rule's `then` holds.
pub const THEN_MAX: usize = 16;

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
        if self.name.len() > FIELD_MAX_BYTES || self.name.chars().any(char::is_control) {
            return Err(format!("{at}.name: at most {FIELD_MAX_BYTES} bytes of printable text"));
        }
        if self.replaces.len() > THEN_MAX {
            return Err(format!("{at}.replaces: at most {THEN_MAX} names, got {}", self.replaces.len()));
        }
        for (i, r) in self.replaces.iter().enumerate() {
            if r.is_empty() || r.len() > FIELD_MAX_BYTES || r.chars().any(char::is_control) {
                return Err(format!("{at}.replaces[{i}]: 1 to {FIELD_MAX_BYTES} bytes of printable text"));
            }
            if *r == self.name {
                return Err(format!("{at}.replaces[{i}]: a rule cannot replace itself ({r:?})"));
            }
        }
        if self.then.len() > THEN_MAX {
            return Err(format!("{at}.then: at most {THEN_MAX} entries, got {}", self.then.len()));
        }
        for (i, e) in self.then.iter().enumerate() {
            for (name, v) in [("key", &e.key), ("value", &e.value)] {
                if v.len() > FIELD_MAX_BYTES || v.chars().any(char::is_control) {
                    return Err(format!(
                        "{at}.then[{i}].{name}: at most {FIELD_MAX_BYTES} bytes of printable text"
                    ));
                }
            }
            if e.key.is_empty() {
                return Err(format!("{at}.then[{i}].key: must not be empty"));
            }
        }
        let sample = self.fill(|_| "v");
        check_group_name(&sample).map_err(|e| format!("{at}.group: {}", e.rule))?;
        Ok(())
    }

    /// The group template with every `{…}` filled by `value_of` (given `value` or a key).
    fn fill<'v>(&self, value_of: impl Fn(&str) -> &'v str) -> String {
        let mut out = String::with_capacity(self.group.len());
        let mut rest = self.group.as_str();
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else { break };
            out.push_str(&rest[..open]);
            out.push_str(value_of(&rest[open + 1..open + close]));
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The group this rule names for `entries` from position `at` on, if they match it.
    fn name_at(&self, entries: &[(&str, &str)], at: usize) -> Option<String> {
        if self.whole && (at != 0 || entries.len() != 1 + self.then.len()) {
            return None;
        }
        let (k, v) = entries[at];
        if k != self.key || !(self.value.is_empty() || self.value == v) {
            return None;
        }
        let rest = entries.get(at + 1..at + 1 + self.then.len())?;
        if rest.len() != self.then.len()
            || !rest
                .iter()
                .zip(&self.then)
                .all(|((k, v), e)| *k == e.key && (e.value.is_empty() || e.value == *v))
        {
            return None;
        }
        let matched = &entries[at..at + 1 + self.then.len()];
        Some(self.fill(|name| {
            if name == "value" {
                return v;
            }
            matched.iter().find(|(k, _)| *k == name).map_or("", |(_, v)| v)
        }))
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
    match_rule(rules, domain, entries).1
}

/// The rule (its index) a descriptor's `entries` match under `rules` in `domain`, if any, and
/// the group they name.
pub fn match_rule(rules: &[RlsRule], domain: &str, entries: &[(&str, &str)]) -> (Option<usize>, String) {
    if rules.is_empty() {
        let name = entries
            .iter()
            .find(|(k, v)| *k == "tenant" && !v.is_empty())
            .map_or_else(|| DEFAULT_GROUP.to_string(), |(_, v)| (*v).to_string());
        return (None, name);
    }
    for (i, r) in rules.iter().enumerate() {
        if !r.domain.is_empty() && r.domain != domain {
            continue;
        }
        if let Some(name) = (0..entries.len()).find_map(|at| r.name_at(entries, at)) {
            return (Some(i), name);
        }
    }
    (None, DEFAULT_GROUP.to_string())
}

/// The largest rules document taken, in bytes.
pub const RULES_MAX_BYTES: usize = 1 << 20;

/// Every way Envoy's descriptors name groups: the mapping rules, tried in order; the
/// descriptor trees of the domains imported from envoy/ratelimit files (see [`tree`]); and the
/// limits of the namespaces imported from Limitador files (see [`limits`]). A domain with a
/// tree or limits is answered by them alone.
///
/// As JSON, a set of rules alone is the array of its rules (as rules were always written), and
/// one with more an object `{"rules": […], "trees": […], "limits": […]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSet {
    /// The mapping rules, tried in order.
    #[serde(default)]
    pub rules: Vec<RlsRule>,
    /// One tree per domain.
    #[serde(default)]
    pub trees: Vec<Tree>,
    /// One set of limits per domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitSet>,
}

/// How a descriptor is limited, as a rule set decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'r> {
    /// Counted against `group`.
    Group {
        /// The group.
        group: String,
        /// Whether a rule or a tree's limit matched (else the group is the default group's, or
        /// the implicit tenant rule's).
        matched: bool,
        /// The limit's name (empty: none).
        name: &'r str,
        /// The names this one lifts.
        replaces: &'r [String],
        /// envoy/ratelimit's `quota_mode`.
        quota_mode: bool,
    },
    /// envoy/ratelimit's `unlimited: true`: answered OK, counted nowhere.
    Unlimited {
        /// The limit's name (empty: none).
        name: &'r str,
        /// The names this one lifts.
        replaces: &'r [String],
    },
    /// A tree's domain has no limit for it: answered OK, counted nowhere.
    NoLimit,
}

impl Decision<'_> {
    fn naming(&self) -> (&str, &[String]) {
        match self {
            Decision::Group { name, replaces, .. } | Decision::Unlimited { name, replaces } => {
                (name, replaces)
            }
            Decision::NoLimit => ("", &[]),
        }
    }
}

impl RuleSet {
    /// A set of mapping rules alone.
    pub fn of_rules(rules: Vec<RlsRule>) -> RuleSet {
        RuleSet { rules, ..RuleSet::default() }
    }

    /// Whether it holds nothing at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.trees.is_empty() && self.limits.is_empty()
    }

    /// The limits of `domain`, if a Limitador file was imported for it.
    pub fn limit_set(&self, domain: &str) -> Option<&LimitSet> {
        self.limits.iter().find(|l| l.domain == domain)
    }

    /// The tree of `domain`, if one was imported.
    pub fn tree(&self, domain: &str) -> Option<&Tree> {
        self.trees.iter().find(|t| t.domain == domain)
    }

    /// Whether any rule or tree applies in `domain`: where none does, an entry with key
    /// `tenant` names the group by its value (the implicit tenant rule).
    pub fn names_domain(&self, domain: &str) -> bool {
        self.tree(domain).is_some()
            || self.limit_set(domain).is_some()
            || self.rules.iter().any(|r| r.domain.is_empty() || r.domain == domain)
    }

    /// How a descriptor's `entries` (key, value, in order) are limited in `domain`: by the
    /// domain's tree if it has one; else by the first rule that matches (the `default` group
    /// when none does), or, in a domain no rule names, by the implicit tenant rule.
    pub fn decide(&self, domain: &str, entries: &[(&str, &str)]) -> Decision<'_> {
        if let Some(tree) = self.tree(domain) {
            return match tree.find(entries) {
                Found::Nothing => Decision::NoLimit,
                Found::Limit(None, l) => Decision::Unlimited { name: &l.name, replaces: &l.replaces },
                Found::Limit(Some(group), l) => Decision::Group {
                    group,
                    matched: true,
                    name: &l.name,
                    replaces: &l.replaces,
                    quota_mode: l.quota_mode,
                },
            };
        }
        let (rule, group) = self.by_rules(domain, entries);
        let (name, replaces) =
            rule.map_or(("", &[][..]), |i| (self.rules[i].name.as_str(), &self.rules[i].replaces[..]));
        Decision::Group { group, matched: rule.is_some(), name, replaces, quota_mode: false }
    }

    /// The rule (its index) a descriptor's `entries` match in `domain`, if any, and the group
    /// they name, by the rules alone (trees aside): the first rule that matches, else the
    /// `default` group; in a domain no rule names, the implicit tenant rule.
    pub fn by_rules(&self, domain: &str, entries: &[(&str, &str)]) -> (Option<usize>, String) {
        if self.rules.iter().any(|r| r.domain.is_empty() || r.domain == domain) {
            match_rule(&self.rules, domain, entries)
        } else {
            match_rule(&[], domain, entries)
        }
    }

    /// Checks the whole set: every rule and tree, one tree per domain, and the bounds.
    pub fn check(&self) -> Result<(), String> {
        check_rules(&self.rules)?;
        let mut nodes = 0;
        for (i, t) in self.trees.iter().enumerate() {
            t.check(&format!("trees[{i}]"), &mut nodes)?;
            if self.trees[..i].iter().any(|o| o.domain == t.domain) {
                return Err(format!("trees[{i}].domain: {:?} has a tree already", t.domain));
            }
        }
        for (i, l) in self.limits.iter().enumerate() {
            l.check(&format!("limits[{i}]"))?;
            if self.limits[..i].iter().any(|o| o.domain == l.domain) || self.tree(&l.domain).is_some() {
                return Err(format!("limits[{i}].domain: {:?} has a tree or limits already", l.domain));
            }
        }
        if self.trees.len() + self.limits.len() > RULES_MAX {
            return Err(format!("trees and limits: at most {RULES_MAX} domains"));
        }
        Ok(())
    }

    /// The set as JSON: the array of its rules when it has no tree.
    pub fn to_json(&self) -> String {
        let json = if self.trees.is_empty() && self.limits.is_empty() {
            serde_json::to_string(&self.rules)
        } else {
            serde_json::to_string(self)
        };
        json.unwrap_or_else(|_| "[]".into())
    }

    /// A set from JSON (an array of rules, or `{"rules": […], "trees": […], "limits": […]}`),
    /// checked.
    pub fn from_json(text: &str) -> Result<RuleSet, String> {
        if text.len() > RULES_MAX_BYTES {
            return Err(format!("rules: larger than {RULES_MAX_BYTES} bytes"));
        }
        let set = if text.trim_start().starts_with('{') {
            serde_json::from_str::<RuleSet>(text).map_err(|e| {
                format!("rules: expected an object with fields rules (an array of rules), trees (domains' descriptor trees) and limits (namespaces' limits): {e}")
            })?
        } else {
            let rules: Vec<RlsRule> = serde_json::from_str(text).map_err(|e| {
                format!("rules: expected a JSON array of objects with fields domain, key, value, group, then, whole, name, replaces: {e}")
            })?;
            RuleSet::of_rules(rules)
        };
        set.check()?;
        Ok(set)
    }
}

/// Of one request's descriptors as `decisions` decided them, which are lifted by another's
/// `replaces` (envoy/ratelimit's): those are answered without a limit.
pub fn lifted(decisions: &[Decision<'_>]) -> Vec<bool> {
    let replaced: Vec<&str> =
        decisions.iter().flat_map(|d| d.naming().1.iter().map(String::as_str)).collect();
    decisions
        .iter()
        .map(|d| {
            let (name, _) = d.naming();
            !name.is_empty() && replaced.contains(&name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_rules_match_only_a_whole_descriptor_and_replaces_lifts_by_name() {
        let rule = |key: &str, then: &[&str], group: &str| RlsRule {
            key: key.into(),
            then: then.iter().map(|k| RuleEntry { key: (*k).into(), value: String::new() }).collect(),
            group: group.into(),
            whole: true,
            ..RlsRule::default()
        };
        let rules = vec![rule("user", &["path"], "u/{user}/p/{path}"), rule("user", &[], "u/{user}")];
        assert_eq!(group_for(&rules, "d", &[("user", "ann"), ("path", "/a")]), "u/ann/p//a");
        assert_eq!(group_for(&rules, "d", &[("user", "ann")]), "u/ann");
        // Neither a longer descriptor nor one that starts elsewhere matches a whole rule.
        assert_eq!(group_for(&rules, "d", &[("user", "ann"), ("zone", "z")]), "default");
        assert_eq!(group_for(&rules, "d", &[("zone", "z"), ("user", "ann")]), "default");
        let mut named = RuleSet::of_rules(rules.clone());
        named.rules[1].name = "per-user".into();
        named.rules[0].replaces = vec!["per-user".into()];
        let both = [&[("user", "ann"), ("path", "/a")][..], &[("user", "ann")], &[("zone", "z")]];
        let decided: Vec<Decision<'_>> = both.iter().map(|e| named.decide("d", e)).collect();
        assert_eq!(lifted(&decided), [false, true, false]);
        assert_eq!(lifted(&decided[1..2]), [false], "nothing lifts it alone");
        let mut selfish = named.rules[1].clone();
        selfish.replaces = vec!["per-user".into()];
        assert!(
            selfish
                .check("rules[0]")
                .unwrap_err()
                .contains("rules[0].replaces[0]: a rule cannot replace itself")
        );
    }

    #[test]
    fn rules_round_trip_through_json_and_are_checked() {
        let rules = vec![
            RlsRule {
                domain: "edge".into(),
                key: "tenant".into(),
                value: String::new(),
                group: "t-{value}".into(),
                ..RlsRule::default()
            },
            RlsRule {
                domain: String::new(),
                key: "path".into(),
                value: "/a\"b".into(),
                group: "api".into(),
                ..RlsRule::default()
            },
        ];
        let set = RuleSet::of_rules(rules);
        let json = set.to_json();
        assert!(json.starts_with('['), "a set of rules alone is their array: {json}");
        assert_eq!(RuleSet::from_json(&json).unwrap(), set);
        assert_eq!(RuleSet::from_json("[]").unwrap(), RuleSet::default());
        let long = format!(r#"[{{"key":"k","group":"{}"}}]"#, "g".repeat(300));
        let cases: [(&str, &str); 7] = [
            ("{\"colour\":1}", "unknown field `colour`"),
            ("[[]]", "expected a JSON array of objects"),
            (r#"[{"key":"","group":"g"}]"#, "rules[0].key: must not be empty"),
            (&long, "rules[0].group: at most 255 bytes"),
            (r#"[{"key":"k"}]"#, "missing field `group`"),
            (r#"[{"key":"k","group":"g","colour":"red"}]"#, "unknown field `colour`"),
            (r#"[{"key":1,"group":"g"}]"#, "rules"),
        ];
        for (bad, expect) in cases {
            let e = RuleSet::from_json(bad).unwrap_err();
            assert!(e.contains(expect), "{bad}: {e}");
        }
    }

    #[test]
    fn nested_rules_match_entries_in_order_and_fill_the_group_from_each() {
        let rules = vec![
            RlsRule {
                key: "tenant".into(),
                then: vec![RuleEntry { key: "path".into(), value: "/search".into() }],
                group: "{tenant}-search".into(),
                ..RlsRule::default()
            },
            RlsRule {
                key: "tenant".into(),
                then: vec![RuleEntry { key: "plan".into(), value: String::new() }],
                group: "{value}.{plan}".into(),
                ..RlsRule::default()
            },
        ];
        assert_eq!(group_for(&rules, "e", &[("tenant", "acme"), ("path", "/search")]), "acme-search");
        // Entries in another order, or not next to each other, do not match.
        assert_eq!(group_for(&rules, "e", &[("path", "/search"), ("tenant", "acme")]), "default");
        assert_eq!(group_for(&rules, "e", &[("tenant", "a"), ("x", "1"), ("plan", "gold")]), "default");
        assert_eq!(group_for(&rules, "e", &[("ip", "1.2.3.4"), ("tenant", "a"), ("plan", "gold")]), "a.gold");
        let set = RuleSet::of_rules(rules);
        assert_eq!(RuleSet::from_json(&set.to_json()).unwrap(), set);
        let plain =
            RuleSet::of_rules(vec![RlsRule { key: "k".into(), group: "g".into(), ..RlsRule::default() }]);
        assert!(!plain.to_json().contains("then"));
        let bad = r#"[{"key":"k","group":"g","then":[{"key":""}]}]"#;
        assert_eq!(RuleSet::from_json(bad).unwrap_err(), "rules[0].then[0].key: must not be empty");
        let many =
            format!(r#"[{{"key":"k","group":"g","then":[{}]}}]"#, vec![r#"{"key":"x"}"#; 17].join(","));
        assert!(RuleSet::from_json(&many).unwrap_err().starts_with("rules[0].then: at most 16 entries"));
    }

    #[test]
    fn the_first_rule_that_matches_an_entry_names_the_group() {
        let rules = vec![
            RlsRule {
                domain: "edge".into(),
                key: "path".into(),
                value: "/api".into(),
                group: "api".into(),
                ..RlsRule::default()
            },
            RlsRule {
                domain: String::new(),
                key: "tenant".into(),
                value: String::new(),
                group: "t-{value}".into(),
                ..RlsRule::default()
            },
        ];
        assert_eq!(group_for(&rules, "edge", &[("tenant", "a"), ("path", "/api")]), "api");
        assert_eq!(group_for(&rules, "other", &[("tenant", "a"), ("path", "/api")]), "t-a");
        assert_eq!(group_for(&rules, "edge", &[("user", "x")]), "default");
        assert_eq!(group_for(&[], "edge", &[("user", "x")]), "default");
        assert_eq!(group_for(&[], "edge", &[("user", "x"), ("tenant", "b")]), "b");
    }

    #[test]
    fn the_implicit_tenant_rule_holds_in_every_domain_no_rule_or_tree_names() {
        let tree = Tree {
            domain: "shop".into(),
            descriptors: vec![Node {
                key: "api_key".into(),
                limit: Some(TreeLimit { group: "shop/api_key={api_key}".into(), ..TreeLimit::default() }),
                ..Node::default()
            }],
        };
        let mut set = RuleSet { trees: vec![tree], ..RuleSet::default() };
        let group = |set: &RuleSet, domain: &str, e: &[(&str, &str)]| match set.decide(domain, e) {
            Decision::Group { group, .. } => Some(group),
            _ => None,
        };
        // The imported domain answers by its tree: a descriptor it does not limit is not limited.
        assert_eq!(group(&set, "shop", &[("api_key", "k1")]), Some("shop/api_key=k1".into()));
        assert_eq!(set.decide("shop", &[("tenant", "acme")]), Decision::NoLimit);
        // Every other domain keeps the implicit tenant rule.
        assert_eq!(group(&set, "edge", &[("tenant", "acme")]), Some("acme".into()));
        // A rule of one domain leaves the others theirs; a rule of every domain takes them all.
        set.rules.push(RlsRule {
            domain: "edge".into(),
            key: "user".into(),
            group: "u-{value}".into(),
            ..RlsRule::default()
        });
        assert_eq!(group(&set, "edge", &[("tenant", "acme")]), Some("default".into()));
        assert_eq!(group(&set, "api", &[("tenant", "acme")]), Some("acme".into()));
        set.rules.push(RlsRule { key: "zone".into(), group: "z".into(), ..RlsRule::default() });
        assert_eq!(group(&set, "api", &[("tenant", "acme")]), Some("default".into()));
        // Round trip: with a tree, the set is an object.
        let json = set.to_json();
        assert!(json.starts_with('{'), "{json}");
        assert_eq!(RuleSet::from_json(&json).unwrap(), set);
        let twice = format!(
            r#"{{"trees":[{},{}]}}"#,
            serde_json::to_string(&set.trees[0]).unwrap(),
            serde_json::to_string(&set.trees[0]).unwrap()
        );
        assert_eq!(RuleSet::from_json(&twice).unwrap_err(), "trees[1].domain: \"shop\" has a tree already");
    }
}
