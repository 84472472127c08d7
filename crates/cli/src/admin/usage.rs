//! `tollgate usage`: what each group consumed, from the controller's metering.

use std::collections::BTreeMap;

use tollgate_proto::v1;

use crate::admin::{Since, Target, connect, rpc, utc};
use crate::say;

/// How `tollgate usage` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One line per group: the span's totals.
    Text,
    /// A JSON array: one object per group per minute (`[]` for none).
    Json,
    /// `minute,group,consumed,admitted,throttled,would_refuse`, per group per minute.
    Csv,
}

/// One minute of one group: what it consumed in that minute.
struct Minute {
    at: u64,
    consumed: f64,
    admitted: u64,
    throttled: u64,
    /// Admitted in shadow mode, and would have been refused.
    would_refuse: u64,
}

/// Per group, the minutes of the span with what each added (the baseline record before the
/// span only measures from).
fn minutes(records: &[v1::UsageRecord], since: u64) -> BTreeMap<String, Vec<Minute>> {
    let mut out: BTreeMap<String, Vec<Minute>> = BTreeMap::new();
    let mut last: BTreeMap<&str, &v1::UsageRecord> = BTreeMap::new();
    for r in records {
        let before = last.insert(r.group.as_str(), r);
        if r.minute_unix_ms < since {
            continue;
        }
        let (c, a, t, w) = before.map_or((0.0, 0, 0, 0), |b| {
            (b.consumed_total, b.admitted_total, b.throttled_total, b.would_refuse_total)
        });
        // A total below the last one started again from 0 (a group not configured, whose
        // running total is not kept, met again after a restart): all of it is this minute's.
        let added = |now: f64, last: f64| if now < last { now } else { now - last };
        out.entry(r.group.clone()).or_default().push(Minute {
            at: r.minute_unix_ms,
            consumed: added(r.consumed_total, c),
            admitted: added(r.admitted_total as f64, a as f64) as u64,
            throttled: added(r.throttled_total as f64, t as f64) as u64,
            would_refuse: added(r.would_refuse_total as f64, w as f64) as u64,
        });
    }
    out
}

/// Runs `tollgate usage`.
pub async fn run(
    server: &Target,
    group: Option<String>,
    since: Option<Since>,
    format: Format,
) -> anyhow::Result<()> {
    let since_unix_ms = match since {
        None => 0,
        Some(Since::UnixMs(ms)) => ms,
        Some(Since::Ago(d)) => {
            tollgate_controller::wall_ms().saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    };
    let mut client = connect(server).await?;
    let request = v1::UsageRequest { group: group.unwrap_or_default(), since_unix_ms, limit: 100_000 };
    let records = client.usage(request).await.map_err(rpc)?.into_inner().records;
    let by_group = minutes(&records, since_unix_ms);
    say(match format {
        Format::Text => text(&by_group),
        Format::Json => json(&by_group),
        Format::Csv => csv(&by_group),
    });
    Ok(())
}

/// Each group's totals over the span, a line each.
fn text(by_group: &BTreeMap<String, Vec<Minute>>) -> String {
    let mut out = Vec::new();
    for (g, ms) in by_group {
        let (first, last) = (ms.first().map_or(0, |m| m.at), ms.last().map_or(0, |m| m.at + 60_000));
        let would: u64 = ms.iter().map(|m| m.would_refuse).sum();
        // Only groups that ran in shadow mode have would-be refusals to show.
        let shadow = if would > 0 { format!("  would refuse {would}") } else { String::new() };
        out.push(format!(
            "{g}  consumed {}  admitted {}  refused {}{shadow}  ({} to {})",
            crate::admin::fmt_units(ms.iter().map(|m| m.consumed).sum::<f64>()),
            ms.iter().map(|m| m.admitted).sum::<u64>(),
            ms.iter().map(|m| m.throttled).sum::<u64>(),
            utc(first),
            utc(last)
        ));
    }
    if by_group.is_empty() {
        out.push("no consumption recorded in that span".into());
    }
    out.join("\n")
}

/// Every minute of every group, as one JSON array (empty when nothing was recorded: valid
/// JSON either way).
fn json(by_group: &BTreeMap<String, Vec<Minute>>) -> String {
    let rows: Vec<serde_json::Value> = by_group
        .iter()
        .flat_map(|(g, ms)| {
            ms.iter().map(move |m| {
                serde_json::json!({
                    "minute": utc(m.at),
                    "minute_unix_ms": m.at,
                    "group": g,
                    "consumed": m.consumed,
                    "admitted": m.admitted,
                    "throttled": m.throttled,
                    "would_refuse": m.would_refuse,
                })
            })
        })
        .collect();
    serde_json::to_string_pretty(&rows).expect("JSON values print")
}

/// Every minute of every group, a CSV row each under a header.
fn csv(by_group: &BTreeMap<String, Vec<Minute>>) -> String {
    let mut out = vec!["minute,group,consumed,admitted,throttled,would_refuse".to_string()];
    for (g, ms) in by_group {
        let quoted =
            if g.contains([',', '"', '\n']) { format!("\"{}\"", g.replace('"', "\"\"")) } else { g.clone() };
        for m in ms {
            let Minute { at, consumed, admitted, throttled, would_refuse } = m;
            out.push(format!("{},{quoted},{consumed},{admitted},{throttled},{would_refuse}", utc(*at)));
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(group: &str, minute: u64, consumed: f64, admitted: u64) -> v1::UsageRecord {
        v1::UsageRecord {
            group: group.into(),
            minute_unix_ms: minute * 60_000,
            consumed_total: consumed,
            admitted_total: admitted,
            ..v1::UsageRecord::default()
        }
    }

    /// A running total that starts again from 0 (an unconfigured group's, after a restart)
    /// counts whole in its minute, rather than as nothing until it passes the old total.
    #[test]
    fn each_minute_adds_what_its_total_grew_by_and_a_total_started_again_counts_whole() {
        let records = [record("a", 1, 10.0, 5), record("a", 2, 16.0, 8), record("a", 3, 4.0, 2)];
        let got: Vec<(f64, u64)> =
            minutes(&records, 0)["a"].iter().map(|m| (m.consumed, m.admitted)).collect();
        assert_eq!(got, [(10.0, 5), (6.0, 3), (4.0, 2)]);
    }
}
