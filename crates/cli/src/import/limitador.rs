//! Limitador's limits file: a list of limits, each a `namespace` (Envoy's domain), a
//! `max_value` per `seconds`, `conditions` on a descriptor's entries and `variables` (entries
//! whose every value is counted apart).
//!
//! A limit becomes a rule on its entries, conditions first then variables, in the order
//! written (a descriptor carries them in that order, one after the other), naming the group
//! `NAMESPACE/key=value/…/key={key}`; with variables the settings go on the pattern with `*`
//! for each. Limits on the same entries are one group with several windows. Conditions are
//! equalities on the first descriptor, in Limitador's current form
//! (`descriptors[0]['k'] == 'v'`, `descriptors[0].k == 'v'`) or its older one (`k == 'v'`).

use super::yaml::{Node, Value};
use super::{Imported, Plan, Shape, part, window_of_seconds};
use tollgate_model::rls::{RlsRule, RuleEntry};

/// One limit's fields.
#[derive(Default)]
struct Limit {
    namespace: Option<String>,
    max_value: Option<u64>,
    seconds: Option<u64>,
    conditions: Vec<(String, String)>,
    variables: Vec<String>,
}

/// Reads the file's one document (a list of limits) into `plan`.
pub fn read(docs: &[Node], plan: &mut Plan) {
    let mut found = Vec::new();
    for doc in docs.iter().filter(|d| !d.is_null()) {
        let Value::Seq(items) = &doc.value else {
            plan.refuse(
                doc.line,
                "a limits file is a list of limits (namespace, max_value, seconds, conditions, variables)",
            );
            continue;
        };
        for item in items {
            if let Some(l) = limit(plan, item) {
                found.push((item.line, l));
            }
        }
    }
    // Rules are tried in order and a descriptor names one group: the limits on more entries
    // first, then the file's order.
    found.sort_by_key(|(line, l)| (std::cmp::Reverse(l.conditions.len() + l.variables.len()), *line));
    for (line, l) in found {
        add(plan, line, l);
    }
}

fn limit(plan: &mut Plan, item: &Node) -> Option<Limit> {
    let Value::Map(fields) = &item.value else {
        plan.refuse(
            item.line,
            "a limit must be a map with namespace, max_value, seconds, conditions, variables",
        );
        return None;
    };
    let mut l = Limit::default();
    let before = plan.refused.len();
    for (name, line, node) in fields {
        match name.as_str() {
            "namespace" => l.namespace = scalar(node).filter(|s| !s.is_empty()),
            "max_value" => l.max_value = number(plan, "max_value", node, 0),
            "seconds" => l.seconds = number(plan, "seconds", node, 1),
            "conditions" => {
                for (at, text) in strings(plan, "conditions", node) {
                    match condition(&text) {
                        Ok(c) => l.conditions.push(c),
                        Err(why) => plan.refuse(at, format!("conditions: {text:?}: {why}")),
                    }
                }
            }
            "variables" => {
                for (at, text) in strings(plan, "variables", node) {
                    match entry_key(text.trim()) {
                        Some(k) => l.variables.push(k),
                        None => plan.refuse(at, format!("variables: {text:?} is not descriptors[0]['key'], descriptors[0].key or key")),
                    }
                }
            }
            "name" | "id" => plan.notes.push((*line, format!("{name} is read and has no effect: the group's name says what it limits"))),
            _ => plan.refuse(*line, format!("{name}: unknown key; expected namespace, max_value, seconds, conditions, variables, name, id")),
        }
    }
    let Some(ns) = &l.namespace else {
        plan.refuse(item.line, "namespace: missing or empty");
        return None;
    };
    if let Some(bad) = ns.chars().find(|c| "{}*".contains(*c)) {
        plan.refuse(item.line, format!("namespace: {ns:?} holds {bad:?}, which names of groups reserve"));
    }
    for field in ["max_value", "seconds"] {
        let given = if field == "max_value" { l.max_value.is_some() } else { l.seconds.is_some() };
        if !given && !fields.iter().any(|(n, _, _)| n == field) {
            plan.refuse(item.line, format!("{field}: missing"));
        }
    }
    if l.conditions.is_empty() && l.variables.is_empty() {
        plan.refuse(
            item.line,
            "a limit with neither conditions nor variables counts every request of its namespace together; Tollgate names a group by a descriptor's entries: give it a condition or a variable (Envoy can send a fixed entry with generic_key)",
        );
    }
    let keys: Vec<&String> = l.conditions.iter().map(|(k, _)| k).chain(&l.variables).collect();
    if let Some(k) = keys.iter().enumerate().find(|(i, k)| keys[..*i].contains(k)).map(|(_, k)| k) {
        plan.refuse(item.line, format!("key {k:?} is named twice in one limit"));
    }
    if let Some((k, v)) = l.conditions.iter().find(|(k, v)| format!("{k}{v}").contains(['{', '}', '*'])) {
        plan.refuse(
            item.line,
            format!("conditions: {k} == {v:?}: braces and * are reserved for the names of groups"),
        );
    }
    if l.variables.iter().any(|k| k.contains(['{', '}', '*'])) {
        plan.refuse(item.line, "variables: braces and * are reserved for the names of groups");
    }
    (plan.refused.len() == before).then_some(l)
}

fn scalar(node: &Node) -> Option<String> {
    match &node.value {
        Value::Scalar(s, _) if !node.is_null() => Some(s.clone()),
        _ => None,
    }
}

fn number(plan: &mut Plan, field: &str, node: &Node, min: u64) -> Option<u64> {
    let max = tollgate_model::settings::RATE_MAX as u64;
    match &node.value {
        Value::Scalar(s, false) => match s.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => return Some(n),
            _ => plan.refuse(node.line, format!("{field}: a whole number from {min} to {max}, got {s:?}")),
        },
        _ => plan.refuse(node.line, format!("{field}: must be a number")),
    }
    None
}

fn strings(plan: &mut Plan, field: &str, node: &Node) -> Vec<(usize, String)> {
    if node.is_null() {
        return Vec::new();
    }
    let Value::Seq(items) = &node.value else {
        plan.refuse(node.line, format!("{field}: must be a list of text"));
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items {
        match scalar(item) {
            Some(s) => out.push((item.line, s)),
            None => plan.refuse(item.line, format!("{field}: each entry must be text")),
        }
    }
    out
}

/// `descriptors[0]['k']`, `descriptors[0]["k"]`, `descriptors[0].k` or a bare `k`: the key.
fn entry_key(text: &str) -> Option<String> {
    let plain =
        |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "_.-:/".contains(c));
    if let Some(rest) = text.strip_prefix("descriptors[0]") {
        if let Some(k) = rest.strip_prefix('.') {
            return plain(k).then(|| k.to_string());
        }
        let inner = rest.strip_prefix('[')?.strip_suffix(']')?;
        return quoted(inner).filter(|k| !k.is_empty());
    }
    (plain(text) && !text.starts_with("descriptors")).then(|| text.to_string())
}

/// A string in single or double quotes, with no escapes (Limitador's literals have none).
fn quoted(text: &str) -> Option<String> {
    let q = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = text.strip_prefix(q)?.strip_suffix(q)?;
    (!inner.contains(q)).then(|| inner.to_string())
}

/// `KEY == 'VALUE'` in any of the forms above: the entry it asks for.
fn condition(text: &str) -> Result<(String, String), String> {
    if text.contains("!=") {
        return Err("Tollgate's rules match equal values only; != cannot be expressed".into());
    }
    if ["&&", "||", "(", " in ", "startsWith", "endsWith", "matches"].iter().any(|op| text.contains(op)) {
        return Err("only one equality (key == 'value') per condition is taken".into());
    }
    let Some((left, right)) = text.split_once("==") else {
        return Err("not an equality (key == 'value')".into());
    };
    let key = entry_key(left.trim())
        .ok_or("the left side is not descriptors[0]['key'], descriptors[0].key or key")?;
    let right = right.trim();
    // The older form took a bare value.
    let value = quoted(right)
        .or_else(|| (!right.is_empty() && !right.contains(['\'', '"'])).then(|| right.to_string()));
    let value = value.ok_or("the right side is not a quoted value")?;
    if value.is_empty() {
        return Err("the value is empty; Tollgate's rules read an empty value as any value".into());
    }
    Ok((key, value))
}

/// A checked limit: a group or pattern, and its rule (unless one on the same entries is there).
fn add(plan: &mut Plan, line: usize, l: Limit) {
    let (Some(ns), Some(max), Some(seconds)) = (l.namespace, l.max_value, l.seconds) else { return };
    let max = max as f64;
    let shape = match (max, seconds, window_of_seconds(seconds)) {
        (0.0, _, _) => Shape { limit: Some(0.0), ..Shape::default() },
        (_, 1, _) => Shape { limit: Some(max), ..Shape::default() },
        (_, _, Some(w)) => Shape { quotas: [(w, max)].into(), ..Shape::default() },
        _ => {
            plan.notes.push((
                line,
                format!("{seconds} s is no calendar window: held as a rate of {} per second with a burst of {max}", max / seconds as f64),
            ));
            Shape { limit: Some(max / seconds as f64), burst: Some(max), ..Shape::default() }
        }
    };
    let mut parts: Vec<String> = l.conditions.iter().map(|(k, v)| part(k, v)).collect();
    let mut pattern = parts.clone();
    for k in &l.variables {
        parts.push(part(k, &format!("{{{k}}}")));
        pattern.push(part(k, "*"));
    }
    let group = format!("{ns}/{}", parts.join("/"));
    plan.add(Imported { name: format!("{ns}/{}", pattern.join("/")), line, shape });
    if !plan.domains.contains(&ns) {
        plan.domains.push(ns.clone());
    }
    if plan.rules.iter().any(|r| r.domain == ns && r.group == group) {
        return;
    }
    let mut entries = l
        .conditions
        .iter()
        .map(|(k, v)| RuleEntry { key: k.clone(), value: v.clone() })
        .chain(l.variables.iter().map(|k| RuleEntry { key: k.clone(), value: String::new() }));
    let first = entries.next().expect("a limit has a condition or a variable");
    plan.rules.push(RlsRule {
        domain: ns,
        key: first.key,
        value: first.value,
        group,
        then: entries.collect(),
        ..RlsRule::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_and_variables_in_each_form_limitador_has_had() {
        for text in [
            "descriptors[0]['req.method'] == 'GET'",
            "descriptors[0][\"req.method\"] == \"GET\"",
            "descriptors[0].req.method == 'GET'",
            "req.method == 'GET'",
            "req.method == GET",
        ] {
            assert_eq!(condition(text), Ok(("req.method".into(), "GET".into())), "{text}");
        }
        assert!(condition("descriptors[0]['a'] != 'b'").unwrap_err().contains("!="));
        assert!(condition("descriptors[0]['a'] == 'b' && descriptors[0]['c'] == 'd'").is_err());
        assert!(condition("descriptors[1]['a'] == 'b'").is_err());
        assert_eq!(entry_key("descriptors[0]['user_id']").as_deref(), Some("user_id"));
        assert_eq!(entry_key("user_id").as_deref(), Some("user_id"));
        assert_eq!(entry_key("descriptors[0]['']"), None);
    }
}
