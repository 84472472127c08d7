//! Couchbase's throttle properties as JSON documents: the node's
//! `{"capacity": 25000}` and a group's `{"reserved": 100, "hard_limit": "unlimited"}`.
//!
//! `tollgate node|group set-properties` and `get-properties`, and `PUT`/`GET` on
//! `/v1/node/properties` and `/v1/groups/NAME/properties`, all read and write these documents
//! through this module, so the two surfaces take and print the same JSON. A document changes
//! only the keys it gives; `get-properties` prints every key, so what it prints can be set back
//! as it is.

use serde_json::{Map, Value};
use tollgate_model::allocate::AllocationMode;
use tollgate_model::settings::RATE_MAX;
use tollgate_proto::v1;

use crate::front::body::kind;
use crate::store::{NodeChange, StoredNode};

/// The largest document taken, in bytes.
pub const PROPERTIES_MAX_BYTES: usize = 64 * 1024;

fn object(text: &str) -> Result<Map<String, Value>, String> {
    if text.len() > PROPERTIES_MAX_BYTES {
        return Err(format!(
            "the document is {} bytes; at most {PROPERTIES_MAX_BYTES} are taken",
            text.len()
        ));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => {
            Err(format!("expected a JSON object such as {{\"capacity\": 25000}}, got {}", kind(&other)))
        }
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// A number of units/s from 0 to 10^15, or `"unlimited"` (`None`) where `unlimited` allows.
fn units(key: &str, v: &Value, unlimited: bool) -> Result<Option<f64>, String> {
    let or = if unlimited { " or \"unlimited\"" } else { "" };
    match v {
        Value::String(s) if unlimited && s == "unlimited" => Ok(None),
        Value::Number(n) => match n.as_f64() {
            Some(x) if (0.0..=RATE_MAX).contains(&x) => Ok(Some(x)),
            _ => Err(format!("{key}: must be from 0 to {RATE_MAX:e} units/s{or}, got {n}")),
        },
        other => Err(format!("{key}: must be a number of units/s{or}, got {}", describe(other))),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        other => kind(other).to_string(),
    }
}

/// Reads a node document: `capacity` (units/s above 0, or `"unlimited"`), `mode`
/// (`"share"` or `"fcfs"`), and `slow_start`, `shadow` and `throttling` (true or false).
pub fn node_change(text: &str) -> Result<NodeChange, String> {
    let mut change = NodeChange::default();
    for (key, v) in object(text)? {
        match key.as_str() {
            "capacity" => {
                let c = units("capacity", &v, true)?;
                if c == Some(0.0) {
                    return Err("capacity: must be above 0, or \"unlimited\"".into());
                }
                change.capacity = Some(c);
            }
            "mode" => {
                change.mode = Some(match v.as_str() {
                    Some("share") => AllocationMode::Share,
                    Some("fcfs") => AllocationMode::Fcfs,
                    _ => return Err(format!("mode: must be \"share\" or \"fcfs\", got {}", describe(&v))),
                })
            }
            "slow_start" | "shadow" | "throttling" => {
                let Value::Bool(b) = v else {
                    return Err(format!("{key}: must be true or false, got {}", describe(&v)));
                };
                let field = match key.as_str() {
                    "slow_start" => &mut change.slow_start,
                    "shadow" => &mut change.shadow,
                    _ => &mut change.throttling,
                };
                *field = Some(b);
            }
            other => {
                return Err(format!(
                    "{other:?}: unknown key; a node document takes capacity, mode, slow_start, shadow \
                     and throttling"
                ));
            }
        }
    }
    Ok(change)
}

/// A rate as JSON: whole numbers without a fraction, `"unlimited"` for none.
fn rate(v: Option<f64>) -> String {
    match v {
        None => "\"unlimited\"".into(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) => Value::from(x).to_string(),
    }
}

/// The node's document, keys in the design's order.
pub fn node_json(node: &StoredNode) -> String {
    let mode = if node.mode == AllocationMode::Fcfs { "fcfs" } else { "share" };
    format!(
        "{{\"capacity\": {}, \"mode\": \"{mode}\", \"slow_start\": {}, \"shadow\": {}, \"throttling\": {}}}",
        rate(node.capacity),
        node.slow_start,
        node.shadow,
        node.throttling
    )
}

/// Reads a group document, `reserved` and `hard_limit` (units/s, or `"unlimited"`), into the
/// patch it makes of `current` (the group as it is, if it exists). The reservation may not
/// exceed the hard limit, counting the one the group keeps when the document does not give it.
pub fn group_patch(text: &str, current: Option<&v1::GroupSettings>) -> Result<v1::GroupPatch, String> {
    let mut patch = v1::GroupPatch::default();
    let mut limit = current.and_then(|c| c.limit);
    let mut reserved = current.map_or(0.0, |c| c.reserved);
    for (key, v) in object(text)? {
        match key.as_str() {
            "reserved" => {
                reserved = units("reserved", &v, false)?.unwrap_or(0.0);
                patch.reserved = Some(reserved);
            }
            "hard_limit" => {
                limit = units("hard_limit", &v, true)?;
                match limit {
                    Some(l) => patch.limit = Some(l),
                    None => patch.unlimited = true,
                }
            }
            other => {
                return Err(format!(
                    "{other:?}: unknown key; a group document takes reserved and hard_limit"
                ));
            }
        }
    }
    if let Some(l) = limit
        && reserved > l
    {
        return Err(format!("reserved: must not exceed hard_limit ({reserved} > {l})"));
    }
    Ok(patch)
}

/// A group's document, keys in the design's order.
pub fn group_json(s: &v1::GroupSettings) -> String {
    format!("{{\"reserved\": {}, \"hard_limit\": {}}}", rate(Some(s.reserved)), rate(s.limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_designs_documents_read_as_written() {
        let c = node_change(r#"{"capacity": 25000}"#).unwrap();
        assert_eq!(c, NodeChange { capacity: Some(Some(25000.0)), ..NodeChange::default() });
        let c = node_change(r#"{"capacity": "unlimited", "mode": "fcfs"}"#).unwrap();
        assert_eq!(
            c,
            NodeChange { capacity: Some(None), mode: Some(AllocationMode::Fcfs), ..NodeChange::default() }
        );
        assert_eq!(node_change(r#"{"slow_start": true}"#).unwrap().slow_start, Some(true));
        assert_eq!(
            node_change(r#"{"slow_start": 1}"#).unwrap_err(),
            "slow_start: must be true or false, got a number"
        );
        let c = node_change(r#"{"shadow": true, "throttling": false}"#).unwrap();
        assert_eq!((c.shadow, c.throttling, c.slow_start), (Some(true), Some(false), None));
        assert_eq!(
            node_change(r#"{"throttling": "off"}"#).unwrap_err(),
            "throttling: must be true or false, got the string \"off\""
        );
        let p = group_patch(r#"{"reserved": 100, "hard_limit": "unlimited"}"#, None).unwrap();
        assert_eq!((p.reserved, p.limit, p.unlimited), (Some(100.0), None, true));
        let p = group_patch(r#"{"hard_limit": 300}"#, None).unwrap();
        assert_eq!((p.reserved, p.limit, p.unlimited), (None, Some(300.0), false));
    }

    #[test]
    fn every_mistake_names_its_key_and_rule() {
        let node = |t: &str| node_change(t).unwrap_err();
        let group = |t: &str| group_patch(t, None).unwrap_err();
        assert_eq!(
            node(r#"{"capacty": 1}"#),
            "\"capacty\": unknown key; a node document takes capacity, mode, slow_start, shadow and \
             throttling"
        );
        assert_eq!(
            node(r#"{"capacity": "25000"}"#),
            "capacity: must be a number of units/s or \"unlimited\", got the string \"25000\""
        );
        assert_eq!(
            node(r#"{"capacity": -1}"#),
            "capacity: must be from 0 to 1e15 units/s or \"unlimited\", got -1"
        );
        assert_eq!(node(r#"{"capacity": 0}"#), "capacity: must be above 0, or \"unlimited\"");
        assert_eq!(node(r#"{"mode": 1}"#), "mode: must be \"share\" or \"fcfs\", got a number");
        assert_eq!(node("[1]"), "expected a JSON object such as {\"capacity\": 25000}, got an array");
        assert!(node("{capacity: 1}").starts_with("not JSON: key must be a string at line 1 column 2"));
        assert_eq!(group(r#"{"reserved": null}"#), "reserved: must be a number of units/s, got null");
        assert_eq!(
            group(r#"{"reserved": "unlimited"}"#),
            "reserved: must be a number of units/s, got the string \"unlimited\""
        );
        assert_eq!(
            group(r#"{"hard_limit": 1e16}"#),
            "hard_limit: must be from 0 to 1e15 units/s or \"unlimited\", got 1e+16"
        );
        assert_eq!(
            group(r#"{"reserved": 200, "hard_limit": 100}"#),
            "reserved: must not exceed hard_limit (200 > 100)"
        );
        assert_eq!(
            group(r#"{"limit": 100}"#),
            "\"limit\": unknown key; a group document takes reserved and hard_limit"
        );
        let big = format!("{{\"reserved\": 1{}}}", " ".repeat(PROPERTIES_MAX_BYTES));
        assert!(group(&big).contains("at most 65536 are taken"));
    }

    #[test]
    fn a_partial_document_is_checked_against_what_the_group_keeps() {
        let current = v1::GroupSettings { reserved: 50.0, limit: Some(100.0), ..Default::default() };
        assert_eq!(
            group_patch(r#"{"reserved": 150}"#, Some(&current)).unwrap_err(),
            "reserved: must not exceed hard_limit (150 > 100)"
        );
        assert_eq!(
            group_patch(r#"{"hard_limit": 40}"#, Some(&current)).unwrap_err(),
            "reserved: must not exceed hard_limit (50 > 40)"
        );
        assert!(group_patch(r#"{"reserved": 150, "hard_limit": "unlimited"}"#, Some(&current)).is_ok());
    }

    #[test]
    fn what_is_printed_reads_back_as_the_same_settings() {
        let s = v1::GroupSettings { reserved: 100.0, limit: None, ..Default::default() };
        let doc = group_json(&s);
        assert_eq!(doc, r#"{"reserved": 100, "hard_limit": "unlimited"}"#);
        let odd = v1::GroupSettings { reserved: 0.5, limit: Some(2.0), ..Default::default() };
        assert_eq!(group_json(&odd), r#"{"reserved": 0.5, "hard_limit": 2}"#);
        let p = group_patch(&doc, None).unwrap();
        assert_eq!((p.reserved, p.unlimited), (Some(100.0), true));
        let node = StoredNode { capacity: Some(25000.0), ..StoredNode::default() };
        let doc = node_json(&node);
        assert_eq!(
            doc,
            r#"{"capacity": 25000, "mode": "share", "slow_start": false, "shadow": false, "throttling": true}"#
        );
        let back = NodeChange {
            capacity: Some(Some(25000.0)),
            mode: Some(AllocationMode::Share),
            slow_start: Some(false),
            shadow: Some(false),
            throttling: Some(true),
        };
        assert_eq!(node_change(&doc).unwrap(), back);
    }
}
