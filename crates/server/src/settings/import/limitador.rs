//! Limitador's limits file: a list of limits, each a `namespace` (Envoy's domain), a
//! `max_value` per `seconds`, `conditions` on a request's descriptors and `variables` (entries
//! whose every value is counted apart).
//!
//! Each namespace becomes its domain's set of limits, applied as Limitador applies them (see
//! `tollgate_model::rls::limits`): every limit whose conditions hold applies, whatever the
//! order of the entries, on whichever descriptor they are; its group is
//! `NAMESPACE/key=value/…/key!=value/…/var={var}` (the whole namespace: `NAMESPACE/all`),
//! its settings on the pattern with `*` for each variable, and its window `seconds` long from
//! the first request after the last ended, as Limitador counts. Limits with the same
//! conditions and variables are one group with each window. Conditions are equalities or
//! inequalities on an entry, in Limitador's current form (`descriptors[0]['k'] == 'v'`,
//! `descriptors[1].k != 'v'`) or its older one (`k == 'v'`, the first descriptor); anything
//! else CEL can say is refused, naming its line.

use super::yaml::{Node, Value};
use super::{Imported, Plan, Shape, part};
use tollgate_model::rls::LimitSet;
use tollgate_model::rls::limits::{Condition, Entry, Limit as SetLimit};

/// One limit's fields.
#[derive(Default)]
struct Limit {
    namespace: Option<String>,
    max_value: Option<u64>,
    seconds: Option<u64>,
    conditions: Vec<Condition>,
    variables: Vec<Entry>,
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
                    match entry_of(text.trim()) {
                        Some(e) => l.variables.push(e),
                        None => plan.refuse(at, format!("variables: {text:?} is not descriptors[N]['key'], descriptors[N].key or key")),
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
    if let Some(v) =
        l.variables.iter().enumerate().find(|(i, v)| l.variables[..*i].contains(v)).map(|(_, v)| v)
    {
        plan.refuse(item.line, format!("variable {:?} is named twice in one limit", v.key));
    }
    let reserved = |v: &str| v.contains(['{', '}', '*']);
    if let Some(c) = l.conditions.iter().find(|c| reserved(&c.entry.key) || reserved(&c.value)) {
        plan.refuse(
            item.line,
            format!(
                "conditions: {} {:?}: braces and * are reserved for the names of groups",
                c.entry.key, c.value
            ),
        );
    }
    if l.variables.iter().any(|v| reserved(&v.key)) {
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

/// `descriptors[N]['k']`, `descriptors[N]["k"]`, `descriptors[N].k` or a bare `k` (the
/// first descriptor's): the entry.
fn entry_of(text: &str) -> Option<Entry> {
    let plain =
        |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "_.-:/".contains(c));
    if let Some(rest) = text.strip_prefix("descriptors[") {
        let (index, rest) = rest.split_once(']')?;
        let descriptor: u32 = index.parse().ok().filter(|i| *i < 64)?;
        let key = if let Some(k) = rest.strip_prefix('.') {
            plain(k).then(|| k.to_string())?
        } else {
            let inner = rest.strip_prefix('[')?.strip_suffix(']')?;
            quoted(inner).filter(|k| !k.is_empty())?
        };
        return Some(Entry { descriptor, key });
    }
    (plain(text) && !text.starts_with("descriptors")).then(|| Entry { descriptor: 0, key: text.to_string() })
}

/// A string in single or double quotes, with no escapes (Limitador's literals have none).
fn quoted(text: &str) -> Option<String> {
    let q = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = text.strip_prefix(q)?.strip_suffix(q)?;
    (!inner.contains(q)).then(|| inner.to_string())
}

/// `ENTRY == 'VALUE'` or `ENTRY != 'VALUE'` in any of the forms above.
fn condition(text: &str) -> Result<Condition, String> {
    if ["&&", "||", "(", " in ", "startsWith", "endsWith", "matches", "size"]
        .iter()
        .any(|op| text.contains(op))
    {
        return Err("only one comparison (entry == 'value', or !=) per condition is taken; give several conditions, which must all hold".into());
    }
    let (left, right, not) = match (text.split_once("!="), text.split_once("==")) {
        (Some((l, r)), _) => (l, r, true),
        (None, Some((l, r))) => (l, r, false),
        (None, None) => return Err("not a comparison (entry == 'value', or !=)".into()),
    };
    let entry = entry_of(left.trim())
        .ok_or("the left side is not descriptors[N]['key'], descriptors[N].key or key")?;
    let right = right.trim();
    // The older form took a bare value.
    let value = quoted(right)
        .or_else(|| (!right.is_empty() && !right.contains(['\'', '"'])).then(|| right.to_string()));
    let value = value.ok_or("the right side is not a quoted value")?;
    Ok(Condition { entry, not, value })
}

/// The part of a group's name an entry takes: `key`, or `dN.key` past the first descriptor.
fn entry_name(e: &Entry) -> String {
    if e.descriptor == 0 { e.key.clone() } else { format!("d{}.{}", e.descriptor, e.key) }
}

/// A checked limit: a group or pattern, and the namespace's limit (unless one with the same
/// conditions and variables is there: then its windows join that group).
fn add(plan: &mut Plan, line: usize, l: Limit) {
    let (Some(ns), Some(max), Some(seconds)) = (l.namespace, l.max_value, l.seconds) else { return };
    let max = max as f64;
    // Limitador's window starts at a counter's first hit and lasts `seconds`.
    let shape = match u32::try_from(seconds) {
        _ if max == 0.0 => Shape { limit: Some(0.0), ..Shape::default() },
        Ok(s) if (1..=tollgate_model::settings::WINDOW_SECONDS_MAX).contains(&s) => Shape {
            quotas: [(tollgate_model::settings::BudgetPeriod::FromFirst(s), max)].into(),
            ..Shape::default()
        },
        _ => {
            let most = tollgate_model::settings::WINDOW_SECONDS_MAX;
            plan.refuse(line, format!("seconds: {seconds} is longer than the longest window, {most} s"));
            return;
        }
    };
    let mut parts: Vec<String> = l
        .conditions
        .iter()
        .map(|c| {
            if c.not {
                format!("{}!={}", entry_name(&c.entry), c.value)
            } else {
                part(&entry_name(&c.entry), &c.value)
            }
        })
        .collect();
    let mut pattern = parts.clone();
    for v in &l.variables {
        parts.push(part(&entry_name(v), &format!("{{{}.{}}}", v.descriptor, v.key)));
        pattern.push(part(&entry_name(v), "*"));
    }
    if parts.is_empty() {
        // Every request of the namespace, one counter.
        parts.push("all".into());
        pattern.push("all".into());
    }
    let group = format!("{ns}/{}", parts.join("/"));
    plan.add(Imported { name: format!("{ns}/{}", pattern.join("/")), line, shape });
    if !plan.domains.contains(&ns) {
        plan.domains.push(ns.clone());
    }
    let set = match plan.limits.iter_mut().position(|s| s.domain == ns) {
        Some(at) => &mut plan.limits[at],
        None => {
            plan.limits.push(LimitSet { domain: ns, limits: Vec::new() });
            plan.limits.last_mut().expect("pushed")
        }
    };
    if !set.limits.iter().any(|o| o.group == group) {
        set.limits.push(SetLimit { conditions: l.conditions, variables: l.variables, group });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_and_variables_in_each_form_limitador_has_had() {
        let first = |key: &str| Entry { descriptor: 0, key: key.into() };
        for text in [
            "descriptors[0]['req.method'] == 'GET'",
            "descriptors[0][\"req.method\"] == \"GET\"",
            "descriptors[0].req.method == 'GET'",
            "req.method == 'GET'",
            "req.method == GET",
        ] {
            let c = condition(text).unwrap();
            assert_eq!((c.entry, c.not, c.value.as_str()), (first("req.method"), false, "GET"), "{text}");
        }
        let c = condition("descriptors[1]['a'] != 'b'").unwrap();
        assert_eq!((c.entry, c.not), (Entry { descriptor: 1, key: "a".into() }, true));
        assert!(
            condition("descriptors[0]['a'] == 'b' && descriptors[0]['c'] == 'd'")
                .unwrap_err()
                .contains("several conditions")
        );
        assert!(condition("descriptors[0]['a'].startsWith('x')").is_err());
        assert_eq!(entry_of("descriptors[0]['user_id']"), Some(first("user_id")));
        assert_eq!(entry_of("descriptors[2].user_id"), Some(Entry { descriptor: 2, key: "user_id".into() }));
        assert_eq!(entry_of("user_id"), Some(first("user_id")));
        assert_eq!(entry_of("descriptors[0]['']"), None);
    }
}
