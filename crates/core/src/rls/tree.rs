//! envoy/ratelimit's descriptor trees, matched as envoy/ratelimit matches them.
//!
//! An imported envoy/ratelimit file keeps its shape: one tree per domain, each node a
//! descriptor's `key` and `value` (any value when empty, a wildcard pattern when it holds
//! `*`), the limit a request whose descriptor ends there is counted against, and its nested
//! descriptors. A request's descriptor is walked down the tree one entry at a time:
//!
//! - at each level the node with the entry's key and exactly its value is taken, else the first
//!   wildcard node (in the file's order) whose pattern matches the value, else the node with the
//!   key and no value; a value listed at a level is never passed over for the any-value node
//!   beside it, even when it has no limit of its own (that is how a file leaves one value
//!   unlimited);
//! - a limit counts only when the descriptor's last entry lands on its node (a longer or a
//!   shorter descriptor is not limited by it);
//! - the walk stops at a node with no nested descriptors, or at an entry nothing matches: then
//!   nothing limits the descriptor.
//!
//! A limited node names its group with a template (`{KEY}` for the value of the request's entry
//! with that key): each value an any-value or wildcard level matches is a group of its own, as
//! each is a counter of its own in envoy/ratelimit; with `share_threshold` the wildcard's values
//! share one group, named by the pattern itself.

use serde::{Deserialize, Serialize};

use super::{FIELD_MAX_BYTES, THEN_MAX};
use crate::settings::check_group_name;

/// One domain's descriptors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    /// The domain the tree answers for.
    pub domain: String,
    /// The top level's descriptors, in the file's order.
    #[serde(default)]
    pub descriptors: Vec<Node>,
}

/// One descriptor of a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// The entry's key.
    pub key: String,
    /// The entry's value: empty for any value; with `*` a pattern (each `*` matches any run
    /// of characters, none included).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// What a descriptor ending here is limited by (absent: nothing here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<TreeLimit>,
    /// The descriptors nested under this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<Node>,
}

/// A node's limit: a group (its settings hold the rate or quota), or none at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeLimit {
    /// The group's name template; `{KEY}` stands for the value of the request's entry with key
    /// `KEY`. Empty when `unlimited`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// envoy/ratelimit's `unlimited: true`: answered OK, counted nowhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
    /// envoy/ratelimit's `quota_mode`: over its limit, this descriptor refuses the request
    /// only when every descriptor in quota mode is over its own (and none other is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quota_mode: bool,
    /// A name other limits' `replaces` refer to (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The limits (by `name`) this one lifts when both match one request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

/// The most nodes in all of a rule set's trees.
pub const NODES_MAX: usize = 10_000;
/// The deepest a tree nests.
pub const DEPTH_MAX: usize = THEN_MAX;

/// What a descriptor's walk down a tree found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found<'t> {
    /// Nothing limits it.
    Nothing,
    /// A limit: its group's name for this descriptor (`None` when unlimited), and the limit.
    Limit(Option<String>, &'t TreeLimit),
}

/// Whether `value` matches `pattern`, each `*` in it matching any run of characters.
///
/// ```
/// use tollgate_model::rls::tree::wildcard;
/// assert!(wildcard("files/*", "files/a.pdf"));
/// assert!(wildcard("a*c*e", "abcde") && wildcard("a*", "a") && !wildcard("a*c", "ab"));
/// ```
pub fn wildcard(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl Tree {
    /// What a descriptor's `entries` (key, value, in order) are limited by.
    pub fn find(&self, entries: &[(&str, &str)]) -> Found<'_> {
        let mut level = &self.descriptors;
        for (i, &(k, v)) in entries.iter().enumerate() {
            let Some(node) = pick(level, k, v) else { return Found::Nothing };
            if i + 1 == entries.len() {
                return match &node.limit {
                    Some(l) if l.unlimited => Found::Limit(None, l),
                    Some(l) => Found::Limit(Some(fill(&l.group, entries)), l),
                    None => Found::Nothing,
                };
            }
            if node.descriptors.is_empty() {
                break;
            }
            level = &node.descriptors;
        }
        Found::Nothing
    }

    /// What is wrong with the tree, prefixed by `at` (such as `trees[0]`); counts its nodes
    /// into `nodes`.
    pub fn check(&self, at: &str, nodes: &mut usize) -> Result<(), String> {
        text(&format!("{at}.domain"), &self.domain, false)?;
        check_level(&self.descriptors, &format!("{at}.descriptors"), 1, nodes)
    }

    /// Every limit in the tree, each with its node's path of (key, value).
    pub fn limits(&self) -> Vec<(Vec<(&str, &str)>, &TreeLimit)> {
        let mut out = Vec::new();
        collect(&self.descriptors, &mut Vec::new(), &mut out);
        out
    }
}

fn collect<'t>(
    level: &'t [Node],
    path: &mut Vec<(&'t str, &'t str)>,
    out: &mut Vec<(Vec<(&'t str, &'t str)>, &'t TreeLimit)>,
) {
    for n in level {
        path.push((&n.key, &n.value));
        if let Some(l) = &n.limit {
            out.push((path.clone(), l));
        }
        collect(&n.descriptors, path, out);
        path.pop();
    }
}

/// The node of `level` an entry `(k, v)` lands on: its exact value, else the first wildcard
/// that matches, else any value.
fn pick<'t>(level: &'t [Node], k: &str, v: &str) -> Option<&'t Node> {
    let keyed = || level.iter().filter(move |n| n.key == k);
    keyed()
        .find(|n| !n.value.is_empty() && n.value == v)
        .or_else(|| keyed().find(|n| n.value.contains('*') && wildcard(&n.value, v)))
        .or_else(|| keyed().find(|n| n.value.is_empty()))
}

/// `template` with each `{KEY}` replaced by the value of the first of `entries` with that key.
fn fill(template: &str, entries: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        out.push_str(&rest[..open]);
        let key = &rest[open + 1..open + close];
        out.push_str(entries.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| v));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

fn text(at: &str, v: &str, may_be_empty: bool) -> Result<(), String> {
    if (!may_be_empty && v.is_empty()) || v.len() > FIELD_MAX_BYTES || v.chars().any(char::is_control) {
        let least = if may_be_empty { 0 } else { 1 };
        return Err(format!("{at}: {least} to {FIELD_MAX_BYTES} bytes of printable text"));
    }
    Ok(())
}

fn check_level(level: &[Node], at: &str, depth: usize, nodes: &mut usize) -> Result<(), String> {
    if depth > DEPTH_MAX {
        return Err(format!("{at}: descriptors nest at most {DEPTH_MAX} deep"));
    }
    for (i, n) in level.iter().enumerate() {
        let at = format!("{at}[{i}]");
        *nodes += 1;
        if *nodes > NODES_MAX {
            return Err(format!("{at}: at most {NODES_MAX} descriptors in all"));
        }
        text(&format!("{at}.key"), &n.key, false)?;
        text(&format!("{at}.value"), &n.value, true)?;
        if level[..i].iter().any(|o| o.key == n.key && o.value == n.value) {
            return Err(format!("{at}: key {:?} with this value is given twice at this level", n.key));
        }
        if let Some(l) = &n.limit {
            check_limit(l, &format!("{at}.limit"))?;
        }
        check_level(&n.descriptors, &format!("{at}.descriptors"), depth + 1, nodes)?;
    }
    Ok(())
}

fn check_limit(l: &TreeLimit, at: &str) -> Result<(), String> {
    match (l.unlimited, l.group.is_empty()) {
        (true, false) => return Err(format!("{at}.group: an unlimited descriptor names no group")),
        (false, true) => return Err(format!("{at}.group: must not be empty (or give unlimited: true)")),
        _ => {}
    }
    if !l.unlimited {
        text(&format!("{at}.group"), &l.group, false)?;
        let sample = fill(&l.group, &[]);
        let sample = if sample.is_empty() { "v".to_string() } else { sample };
        check_group_name(&sample).map_err(|e| format!("{at}.group: {}", e.rule))?;
    }
    text(&format!("{at}.name"), &l.name, true)?;
    if l.replaces.len() > THEN_MAX {
        return Err(format!("{at}.replaces: at most {THEN_MAX} names, got {}", l.replaces.len()));
    }
    for (i, r) in l.replaces.iter().enumerate() {
        text(&format!("{at}.replaces[{i}]"), r, false)?;
        if *r == l.name {
            return Err(format!("{at}.replaces[{i}]: a limit cannot replace itself ({r:?})"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(key: &str, value: &str, group: Option<&str>, nested: Vec<Node>) -> Node {
        Node {
            key: key.into(),
            value: value.into(),
            limit: group.map(|g| TreeLimit {
                group: g.into(),
                unlimited: g.is_empty(),
                ..TreeLimit::default()
            }),
            descriptors: nested,
        }
    }

    fn group(found: Found<'_>) -> Option<String> {
        match found {
            Found::Nothing => None,
            Found::Limit(g, _) => Some(g.unwrap_or_else(|| "(unlimited)".into())),
        }
    }

    /// The shapes envoy/ratelimit's documentation and behaviour describe, each as its users
    /// expect it answered.
    #[test]
    fn a_descriptor_is_walked_down_as_envoy_ratelimit_walks_it() {
        let tree = Tree {
            domain: "shop".into(),
            descriptors: vec![
                // A listed value with no limit of its own, beside an any-value limit: unlimited.
                node("tenant", "internal", None, vec![]),
                node(
                    "tenant",
                    "",
                    Some("t/{tenant}"),
                    vec![node("path", "", Some("t/{tenant}/p/{path}"), vec![])],
                ),
                // A listed value with nested limits only: the value alone has none.
                node("plan", "gold", None, vec![node("user", "", Some("gold/{user}"), vec![])]),
                node("plan", "", Some("plan/{plan}"), vec![]),
                // Wildcards in the file's order, before any value.
                node("path", "/files/*", Some("files/{path}"), vec![]),
                node("path", "/files/shared/*", Some("never: the first wildcard wins"), vec![]),
                node("path", "", Some("path/{path}"), vec![]),
                node("banned", "", Some(""), vec![]),
            ],
        };
        let find = |entries: &[(&str, &str)]| group(tree.find(entries));
        assert_eq!(find(&[("tenant", "internal")]), None, "listed without a limit: not limited");
        assert_eq!(find(&[("tenant", "acme")]), Some("t/acme".into()));
        assert_eq!(find(&[("tenant", "acme"), ("path", "/x")]), Some("t/acme/p//x".into()));
        // Listed: its own (empty) level is walked, never the any-value sibling's.
        assert_eq!(find(&[("tenant", "internal"), ("path", "/x")]), None);
        assert_eq!(find(&[("plan", "gold")]), None);
        assert_eq!(find(&[("plan", "gold"), ("user", "ann")]), Some("gold/ann".into()));
        assert_eq!(find(&[("plan", "free")]), Some("plan/free".into()));
        // A limit counts only where the descriptor ends.
        assert_eq!(find(&[("plan", "free"), ("user", "ann")]), None);
        assert_eq!(find(&[("tenant", "acme"), ("path", "/x"), ("more", "1")]), None);
        assert_eq!(find(&[("path", "/files/shared/a")]), Some("files//files/shared/a".into()));
        assert_eq!(find(&[("path", "/home")]), Some("path//home".into()));
        assert_eq!(find(&[("banned", "x")]), Some("(unlimited)".into()));
        assert_eq!(find(&[("nobody", "x")]), None);
    }

    #[test]
    fn wildcards_match_any_run_and_trees_are_checked() {
        for (p, v, ok) in [
            ("a*", "abc", true),
            ("a*", "a", true),
            ("*c", "abc", true),
            ("a*c", "ac", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("x*", "y", false),
        ] {
            assert_eq!(wildcard(p, v), ok, "{p} ~ {v}");
        }
        let mut n = 0;
        let twice = Tree {
            domain: "d".into(),
            descriptors: vec![node("k", "v", None, vec![]), node("k", "v", None, vec![])],
        };
        assert_eq!(
            twice.check("trees[0]", &mut n).unwrap_err(),
            "trees[0].descriptors[1]: key \"k\" with this value is given twice at this level"
        );
        let mut deep = node("k", "", Some("g"), vec![]);
        for _ in 0..DEPTH_MAX {
            deep = node("k", "", None, vec![deep]);
        }
        let deep = Tree { domain: "d".into(), descriptors: vec![deep] };
        assert!(deep.check("trees[0]", &mut 0).unwrap_err().contains("nest at most 16 deep"));
        let nameless = Tree { domain: String::new(), descriptors: vec![] };
        assert!(nameless.check("trees[0]", &mut 0).unwrap_err().starts_with("trees[0].domain: 1 to 255"));
    }
}
