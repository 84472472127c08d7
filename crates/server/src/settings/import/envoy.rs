//! envoy/ratelimit's configuration: one `domain` per document, a tree of `descriptors` (a
//! `key`, an optional `value`, a `rate_limit`, nested `descriptors`).
//!
//! Each document becomes its domain's descriptor tree, kept in the file's shape and order, so
//! that Tollgate matches a request as envoy/ratelimit does (see `tollgate_model::rls::tree`):
//! a listed value is never passed over for the any-value descriptor beside it, a limit counts
//! only where a request's descriptor ends, wildcards are tried in order before any value.
//! Each limit names its group `DOMAIN/key=value/…`: a level without a value, or with a
//! wildcard, names each value apart (its part of the name is the request's value), and its
//! settings go on a pattern with the level's pattern there (`*` for any value); with
//! `share_threshold` the wildcard's values share one group named by the pattern.

use super::yaml::{Node, Value};
use super::{Imported, Plan, Shape, part};
use tollgate_model::rls::{Tree, TreeLimit};
use tollgate_model::settings::BudgetPeriod;

/// A descriptor's entry: its key and value (`None`: any value; with `*`, a pattern).
type Entry = (String, Option<String>);

/// A descriptor's path: each level's entry, and whether its values share one group.
type Path = Vec<(Entry, bool)>;

/// A descriptor read: its entry, its `rate_limit`, its nested `descriptors`, and its flags.
struct Read<'n> {
    entry: Entry,
    rate: Option<&'n Node>,
    nested: Option<&'n Node>,
    shadow: bool,
    quota_mode: bool,
    share_threshold: bool,
}

/// Reads every document into `plan`.
pub fn read(docs: &[Node], plan: &mut Plan) {
    for doc in docs {
        if doc.is_null() {
            continue;
        }
        let Value::Map(entries) = &doc.value else {
            plan.refuse(doc.line, "a document must be a map with domain and descriptors");
            continue;
        };
        let mut domain = None;
        let mut descriptors = None;
        for (key, line, node) in entries {
            match key.as_str() {
                "domain" => domain = text(plan, "domain", node),
                "descriptors" => descriptors = Some(node),
                _ => plan.refuse(*line, format!("{key}: unknown key; expected domain, descriptors")),
            }
        }
        let Some(domain) = domain.filter(|d| !d.is_empty()) else {
            plan.refuse(doc.line, "domain: missing or empty");
            continue;
        };
        if plan.domains.contains(&domain) {
            plan.refuse(doc.line, format!("domain: {domain:?} given twice"));
            continue;
        }
        if let Some(bad) = domain.chars().find(|c| "{}*".contains(*c)) {
            plan.refuse(doc.line, format!("domain: {domain:?} holds {bad:?}, which names of groups reserve"));
            continue;
        }
        plan.domains.push(domain.clone());
        let mut tree = Tree { domain: domain.clone(), descriptors: Vec::new() };
        if let Some(d) = descriptors {
            tree.descriptors = level(plan, &domain, &Vec::new(), d);
        }
        plan.trees.push(tree);
    }
}

fn text(plan: &mut Plan, field: &str, node: &Node) -> Option<String> {
    match &node.value {
        Value::Scalar(s, _) if !node.is_null() => Some(s.clone()),
        _ => {
            plan.refuse(node.line, format!("{field}: must be text"));
            None
        }
    }
}

fn flag(plan: &mut Plan, field: &str, node: &Node) -> bool {
    match &node.value {
        Value::Scalar(s, false) if s == "true" => true,
        Value::Scalar(s, false) if s == "false" => false,
        _ => {
            plan.refuse(node.line, format!("{field}: must be true or false"));
            false
        }
    }
}

/// One list of descriptors under `path`, as the tree's nodes.
fn level(plan: &mut Plan, domain: &str, path: &Path, node: &Node) -> Vec<tollgate_model::rls::Node> {
    let Value::Seq(items) = &node.value else {
        if !node.is_null() {
            plan.refuse(node.line, "descriptors: must be a list");
        }
        return Vec::new();
    };
    let mut nodes: Vec<tollgate_model::rls::Node> = Vec::new();
    for item in items {
        let Some(read) = descriptor(plan, item) else { continue };
        let (key, value) = &read.entry;
        if nodes.iter().any(|n| n.key == *key && n.value == value.clone().unwrap_or_default()) {
            plan.refuse(item.line, format!("key {key:?} with this value is given twice at this level"));
            continue;
        }
        let mut here = path.clone();
        here.push((read.entry.clone(), read.share_threshold));
        let limit = match read.rate {
            Some(rate) => limit(plan, domain, &here, rate, (item.line, read.shadow, read.quota_mode)),
            None => {
                for (flag, set) in [("shadow_mode", read.shadow), ("quota_mode", read.quota_mode)] {
                    if set {
                        plan.refuse(
                            item.line,
                            format!("{flag}: applies to a descriptor's rate_limit, and this one has none"),
                        );
                    }
                }
                None
            }
        };
        let descriptors = read.nested.map(|n| level(plan, domain, &here, n)).unwrap_or_default();
        nodes.push(tollgate_model::rls::Node {
            key: key.clone(),
            value: value.clone().unwrap_or_default(),
            limit,
            descriptors,
        });
    }
    nodes
}

/// A descriptor's entry, its `rate_limit`, its nested `descriptors` and its flags.
fn descriptor<'n>(plan: &mut Plan, item: &'n Node) -> Option<Read<'n>> {
    let Value::Map(fields) = &item.value else {
        plan.refuse(item.line, "a descriptor must be a map with key, value, rate_limit, descriptors");
        return None;
    };
    let (mut key, mut value, mut share_line) = (None, None, item.line);
    let mut read = Read {
        entry: (String::new(), None),
        rate: None,
        nested: None,
        shadow: false,
        quota_mode: false,
        share_threshold: false,
    };
    for (name, line, node) in fields {
        match name.as_str() {
            "key" => key = text(plan, "key", node),
            "value" => value = text(plan, "value", node),
            "rate_limit" => read.rate = Some(node),
            "descriptors" => read.nested = Some(node),
            "shadow_mode" => read.shadow = flag(plan, name, node),
            "quota_mode" => read.quota_mode = flag(plan, name, node),
            "share_threshold" => {
                read.share_threshold = flag(plan, name, node);
                share_line = *line;
            }
            "detailed_metric" | "value_to_metric" | "metadata" => plan.notes.push((
                *line,
                format!("{name} is read and has no effect: Tollgate's metrics name every group, and a descriptor's group names its values"),
            )),
            _ => plan.refuse(
                *line,
                format!("{name}: unknown key; expected key, value, rate_limit, descriptors, shadow_mode, quota_mode, share_threshold, detailed_metric, value_to_metric, metadata"),
            ),
        }
    }
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        plan.refuse(item.line, "key: missing or empty");
        return None;
    };
    for (field, v) in [("key", Some(&key)), ("value", value.as_ref())] {
        if let Some(bad) = v.and_then(|v| v.chars().find(|c| "{}".contains(*c))) {
            let why = "braces are reserved for the names of groups";
            plan.refuse(item.line, format!("{field}: {:?} holds {bad:?}: {why}", v.unwrap_or(&key)));
            return None;
        }
    }
    if key.contains('*') {
        plan.refuse(item.line, format!("key: {key:?} holds '*': a wildcard goes in a value"));
        return None;
    }
    let value = value.filter(|v| !v.is_empty());
    if read.share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
        plan.refuse(share_line, "share_threshold: applies to a wildcard value (one holding '*') only");
        return None;
    }
    read.entry = (key, value);
    Some(read)
}

/// A `rate_limit` at the end of `path` (its descriptor at `line`, in shadow mode and quota
/// mode or not): a group or pattern, and the node's limit.
fn limit(
    plan: &mut Plan,
    domain: &str,
    path: &Path,
    node: &Node,
    (line, shadow, quota_mode): (usize, bool, bool),
) -> Option<TreeLimit> {
    let Value::Map(fields) = &node.value else {
        plan.refuse(node.line, "rate_limit: must be a map with unit and requests_per_unit, or unlimited");
        return None;
    };
    let (mut unit, mut per_unit, mut unlimited, mut name, mut replaces) =
        (None, None, false, String::new(), Vec::new());
    for (field, at, v) in fields {
        match field.as_str() {
            "unit" => unit = text(plan, "rate_limit.unit", v).map(|u| (u, *at)),
            "requests_per_unit" => match &v.value {
                Value::Scalar(s, false) => match s.parse::<u32>() {
                    Ok(n) => per_unit = Some(n),
                    Err(_) => plan.refuse(*at, format!("rate_limit.requests_per_unit: a whole number from 0 to {}, got {s:?}", u32::MAX)),
                },
                _ => plan.refuse(*at, "rate_limit.requests_per_unit: must be a number"),
            },
            "unlimited" => unlimited = flag(plan, "rate_limit.unlimited", v),
            "name" => name = text(plan, "rate_limit.name", v).unwrap_or_default(),
            "replaces" => replaces = replaced(plan, v),
            _ => plan.refuse(*at, format!("rate_limit.{field}: unknown key; expected unit, requests_per_unit, unlimited, name, replaces")),
        }
    }
    let shape = match (unlimited, unit, per_unit) {
        (true, None, None) => None,
        (true, _, _) => {
            plan.refuse(node.line, "rate_limit: unlimited takes no unit or requests_per_unit");
            return None;
        }
        (false, Some((unit, at)), Some(n)) => Some(shape(plan, &unit, at, f64::from(n))?),
        (false, _, _) => {
            plan.refuse(node.line, "rate_limit: give unit and requests_per_unit, or unlimited: true");
            return None;
        }
    };
    let Some(shape) = shape else {
        return Some(TreeLimit { unlimited: true, quota_mode, name, replaces, ..TreeLimit::default() });
    };
    if let Some(k) = named_twice(path) {
        plan.refuse(
            line,
            format!("key {k:?} takes many values at two levels of one path; its group could not name both"),
        );
        return None;
    }
    let name_of = |any: &dyn Fn(&str, &Option<String>, bool) -> String| {
        let parts: Vec<String> = path.iter().map(|((k, v), shared)| part(k, &any(k, v, *shared))).collect();
        format!("{domain}/{}", parts.join("/"))
    };
    // The group: a listed value as it is, a shared wildcard as its pattern, else the request's value.
    let group = name_of(&|k, v, shared| match v {
        Some(v) if shared || !v.contains('*') => v.clone(),
        _ => format!("{{{k}}}"),
    });
    // Its settings: the same with each value-apart level's pattern (any value: `*`).
    let settings_on = name_of(&|_, v, _| v.clone().unwrap_or_else(|| "*".to_string()));
    plan.add(Imported { name: settings_on, line, shape: Shape { shadow, ..shape } });
    Some(TreeLimit { group, unlimited: false, quota_mode, name, replaces })
}

/// A key of `path` that names its values apart at two levels: each such level has its key in
/// the group's name, so one path could not name both.
fn named_twice(path: &Path) -> Option<&String> {
    let apart: Vec<&String> = path
        .iter()
        .filter(|((_, v), shared)| !shared && v.as_ref().is_none_or(|v| v.contains('*')))
        .map(|((k, _), _)| k)
        .collect();
    apart.iter().enumerate().find(|(i, k)| apart[..*i].contains(k)).map(|(_, k)| *k)
}

/// `unit` and a count as a shape: a quota of the count per window, as envoy/ratelimit counts
/// it (windows one after another from the Unix epoch: a second, a minute, an hour and a day as
/// the clock's, a week of 7 days, a month of 30 and a year of 365); closed at 0.
fn shape(plan: &mut Plan, unit: &str, at: usize, n: f64) -> Option<Shape> {
    let window = match unit.to_ascii_lowercase().as_str() {
        "second" => BudgetPeriod::Every(1),
        "minute" => BudgetPeriod::Minute,
        "hour" => BudgetPeriod::Hour,
        "day" => BudgetPeriod::Day,
        "week" => BudgetPeriod::Every(7 * 86_400),
        "month" => BudgetPeriod::Every(30 * 86_400),
        "year" => BudgetPeriod::Every(365 * 86_400),
        other => {
            plan.refuse(
                at,
                format!("rate_limit.unit: {other:?} is none of second, minute, hour, day, week, month, year"),
            );
            return None;
        }
    };
    Some(if n == 0.0 {
        // Nothing admitted: a closed group, whatever the window.
        Shape { limit: Some(0.0), ..Shape::default() }
    } else {
        Shape { quotas: [(window, n)].into(), ..Shape::default() }
    })
}

/// `replaces: [{ name: … }]`.
fn replaced(plan: &mut Plan, node: &Node) -> Vec<String> {
    let Value::Seq(items) = &node.value else {
        plan.refuse(node.line, "rate_limit.replaces: must be a list of { name: … }");
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items {
        let name = match &item.value {
            Value::Map(f) if f.len() == 1 && f[0].0 == "name" => {
                text(plan, "rate_limit.replaces[].name", &f[0].2)
            }
            _ => {
                plan.refuse(item.line, "rate_limit.replaces: each entry is { name: … } and nothing else");
                None
            }
        };
        match name {
            Some(n) if !n.is_empty() => out.push(n),
            Some(_) => plan.refuse(item.line, "rate_limit.replaces[].name: must not be empty"),
            None => {}
        }
    }
    out
}
