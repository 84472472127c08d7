//! envoy/ratelimit's configuration: one `domain` per document, a tree of `descriptors` (a
//! `key`, an optional `value`, a `rate_limit`, nested `descriptors`).
//!
//! Each descriptor with a `rate_limit` becomes a rule that matches the whole path of entries
//! to it (envoy/ratelimit counts a limit only when a request's descriptor ends there), naming
//! the group `DOMAIN/key=value/…`. A level without a `value` limits each value apart: its part
//! of the name is the request's value, and the limit goes on a pattern with `*` there, which
//! every such group takes. Exact values come before any-value ones, as envoy/ratelimit tries
//! them.

use super::yaml::{Node, Value};
use super::{Imported, Plan, Shape, part};
use tollgate_model::rls::{RlsRule, RuleEntry};
use tollgate_model::settings::BudgetPeriod;

/// A descriptor's entry: its key and value (`None`: any value).
type Entry = (String, Option<String>);

/// A descriptor's path: each level's entry.
type Path = Vec<Entry>;

/// A descriptor read: its entry, its `rate_limit` and its nested `descriptors`.
type Read<'n> = (Entry, Option<&'n Node>, Option<&'n Node>, bool);

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
        let first = plan.rules.len();
        if let Some(d) = descriptors {
            level(plan, &domain, &Vec::new(), d);
        }
        // Exact values before any value, level by level (rules are tried in order).
        let order = |r: &RlsRule| {
            std::iter::once(r.value.is_empty())
                .chain(r.then.iter().map(|e| e.value.is_empty()))
                .collect::<Vec<_>>()
        };
        plan.rules[first..].sort_by_key(order);
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

/// One list of descriptors under `path`.
fn level(plan: &mut Plan, domain: &str, path: &Path, node: &Node) {
    let Value::Seq(items) = &node.value else {
        if !node.is_null() {
            plan.refuse(node.line, "descriptors: must be a list");
        }
        return;
    };
    let mut seen: Vec<(String, Option<String>)> = Vec::new();
    for item in items {
        let Some((entry, rate, nested, shadow)) = descriptor(plan, item) else { continue };
        if seen.contains(&entry) {
            plan.refuse(item.line, format!("key {:?} with this value is given twice at this level", entry.0));
            continue;
        }
        seen.push(entry.clone());
        let mut here = path.clone();
        here.push(entry);
        if let Some(rate) = rate {
            limit(plan, domain, &here, rate, (item.line, shadow));
        } else if shadow {
            plan.refuse(
                item.line,
                "shadow_mode: applies to a descriptor's rate_limit, and this one has none",
            );
        }
        if let Some(nested) = nested {
            level(plan, domain, &here, nested);
        }
    }
}

/// A descriptor's entry, its `rate_limit`, its nested `descriptors` and its `shadow_mode`.
fn descriptor<'n>(plan: &mut Plan, item: &'n Node) -> Option<Read<'n>> {
    let Value::Map(fields) = &item.value else {
        plan.refuse(item.line, "a descriptor must be a map with key, value, rate_limit, descriptors");
        return None;
    };
    let (mut key, mut value, mut rate, mut nested, mut shadow) = (None, None, None, None, false);
    for (name, line, node) in fields {
        match name.as_str() {
            "key" => key = text(plan, "key", node),
            "value" => value = text(plan, "value", node),
            "rate_limit" => rate = Some(node),
            "descriptors" => nested = Some(node),
            "shadow_mode" => shadow = flag(plan, name, node),
            "quota_mode" | "share_threshold" => {
                if flag(plan, name, node) {
                    let why = match name.as_str() {
                        "quota_mode" => "Tollgate has no quota mode (a limit whose overrun alone does not refuse the request); leave it out",
                        _ => "Tollgate does not share one counter among values matching a wildcard; give each value its own descriptor",
                    };
                    plan.refuse(*line, format!("{name}: {why}"));
                }
            }
            "detailed_metric" | "value_to_metric" | "metadata" => plan.notes.push((
                *line,
                format!("{name} is read and has no effect: Tollgate's metrics name every group, and a descriptor's group names its values"),
            )),
            _ => plan.refuse(
                *line,
                format!("{name}: unknown key; expected key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, metadata"),
            ),
        }
    }
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        plan.refuse(item.line, "key: missing or empty");
        return None;
    };
    for (field, v) in [("key", Some(&key)), ("value", value.as_ref())] {
        if let Some(bad) = v.and_then(|v| v.chars().find(|c| "{}*".contains(*c))) {
            let why = if bad == '*' {
                "wildcard values are not taken: Tollgate's rules match a value exactly, or any value (leave value out)"
            } else {
                "braces are reserved for the names of groups"
            };
            plan.refuse(item.line, format!("{field}: {:?} holds {bad:?}: {why}", v.unwrap_or(&key)));
            return None;
        }
    }
    Some(((key, value.filter(|v| !v.is_empty())), rate, nested, shadow))
}

/// A `rate_limit` at the end of `path` (its descriptor at `line`, in shadow mode or not): a
/// group or pattern, and its rule.
fn limit(plan: &mut Plan, domain: &str, path: &Path, node: &Node, (line, shadow): (usize, bool)) {
    let Value::Map(fields) = &node.value else {
        plan.refuse(node.line, "rate_limit: must be a map with unit and requests_per_unit, or unlimited");
        return;
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
        (true, None, None) => Shape::default(),
        (true, _, _) => {
            return plan.refuse(node.line, "rate_limit: unlimited takes no unit or requests_per_unit");
        }
        (false, Some((unit, at)), Some(n)) => {
            let Some(shape) = shape(plan, &unit, at, f64::from(n)) else { return };
            shape
        }
        (false, _, _) => {
            return plan.refuse(node.line, "rate_limit: give unit and requests_per_unit, or unlimited: true");
        }
    };
    let wild: Vec<&String> = path.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
    if let Some(k) = wild.iter().enumerate().find(|(i, k)| wild[..*i].contains(k)).map(|(_, k)| k) {
        return plan.refuse(
            line,
            format!("key {k:?} takes any value at two levels of one path; its group could not name both"),
        );
    }
    let name_of = |any: &dyn Fn(&str) -> String| {
        let parts: Vec<String> = path
            .iter()
            .map(|(k, v)| part(k, v.as_deref().map_or_else(|| any(k), str::to_string).as_str()))
            .collect();
        format!("{domain}/{}", parts.join("/"))
    };
    let group = name_of(&|k| format!("{{{k}}}"));
    let settings_on = name_of(&|_| "*".to_string());
    plan.add(Imported { name: settings_on, line, shape: Shape { shadow, ..shape } });
    let entry = |(k, v): &(String, Option<String>)| RuleEntry {
        key: k.clone(),
        value: v.clone().unwrap_or_default(),
    };
    plan.rules.push(RlsRule {
        domain: domain.to_string(),
        key: path[0].0.clone(),
        value: path[0].1.clone().unwrap_or_default(),
        group,
        then: path[1..].iter().map(entry).collect(),
        whole: true,
        name,
        replaces,
    });
}

/// `unit` and a count as a shape: a rate per second, a quota per longer window, closed at 0.
fn shape(plan: &mut Plan, unit: &str, at: usize, n: f64) -> Option<Shape> {
    let window = match unit.to_ascii_lowercase().as_str() {
        "second" => None,
        "minute" => Some(BudgetPeriod::Minute),
        "hour" => Some(BudgetPeriod::Hour),
        "day" => Some(BudgetPeriod::Day),
        "week" => Some(BudgetPeriod::Week),
        "month" => Some(BudgetPeriod::Month),
        "year" => {
            plan.refuse(at, "rate_limit.unit: year is not a window Tollgate counts (the longest is a month)");
            return None;
        }
        other => {
            plan.refuse(
                at,
                format!("rate_limit.unit: {other:?} is none of second, minute, hour, day, week, month"),
            );
            return None;
        }
    };
    Some(match window {
        // Nothing admitted: a closed group, whatever the window.
        _ if n == 0.0 => Shape { limit: Some(0.0), ..Shape::default() },
        None => Shape { limit: Some(n), ..Shape::default() },
        Some(w) => Shape { quotas: [(w, n)].into(), ..Shape::default() },
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
