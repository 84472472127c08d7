//! What a run leaves behind: one line per phase, `timeline.csv`, `summary.json` and
//! `timeline.png`.

use std::fmt::Write as _;
use std::path::Path;

use crate::run::Outcome;

/// One line per phase: `phase N: passed at T s` or `phase N: failed`.
pub fn phase_lines(outcome: &Outcome) -> Vec<String> {
    outcome
        .phases
        .iter()
        .enumerate()
        .map(|(i, p)| match p.converged_s {
            Some(t) if p.passed => format!("phase {}: passed at {} s", i + 1, fmt_num(t)),
            _ => format!("phase {}: failed", i + 1),
        })
        .collect()
}

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.0}") } else { format!("{v}") }
}

fn cell(v: Option<f64>) -> String {
    v.map(|x| format!("{x}")).unwrap_or_default()
}

/// The timeline as CSV: one row per simulated second.
pub fn timeline_csv(outcome: &Outcome) -> String {
    let mut out = String::from("t");
    for g in &outcome.groups {
        for m in crate::scenario::GROUP_METRICS {
            let _ = write!(out, ",{g}.{m}");
        }
    }
    for m in crate::scenario::CLUSTER_METRICS {
        let _ = write!(out, ",{m}");
    }
    for b in &outcome.backends {
        let _ = write!(out, ",{b}.utilisation");
    }
    // A queueing backend's learned figures, for the backends that have them.
    let queueing: Vec<usize> = outcome
        .timeline
        .first()
        .map(|s| s.served.iter().enumerate().filter(|(_, q)| q.is_some()).map(|(i, _)| i).collect())
        .unwrap_or_default();
    for &i in &queueing {
        let b = &outcome.backends[i];
        let _ = write!(out, ",{b}.learned_limit,{b}.learned_capacity,{b}.goodput,{b}.latency_ms");
    }
    out.push('\n');
    for s in &outcome.timeline {
        let _ = write!(out, "{}", s.t);
        for g in &s.groups {
            let busy = if g.busy { 1.0 } else { 0.0 };
            let row = [
                cell(g.target_rps),
                cell(g.target_units),
                cell(g.client_rps),
                cell(Some(g.admitted_rps)),
                cell(Some(g.admitted_units)),
                cell(Some(busy)),
                cell(Some(g.demand_units)),
                cell(Some(g.by_class[0])),
                cell(Some(g.by_class[1])),
                cell(Some(g.by_class[2])),
            ];
            for c in row {
                let _ = write!(out, ",{c}");
            }
        }
        let _ = write!(out, ",{},{},{}", s.total_target_rps, s.busy_groups, s.tracked_groups);
        for u in &s.utilisation {
            let _ = write!(out, ",{u}");
        }
        for &i in &queueing {
            let q = s.served.get(i).copied().flatten();
            let latency = q.map(|q| q.latency_ms).filter(|l| l.is_finite());
            let capacity = q.map(|q| q.capacity).filter(|c| c.is_finite());
            let (limit, goodput) = (cell(q.map(|q| q.limit)), cell(q.map(|q| q.goodput)));
            let _ = write!(out, ",{limit},{},{goodput},{}", cell(capacity), cell(latency));
        }
        out.push('\n');
    }
    out
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The summary as JSON: `{"scenario":…,"seed":…,"passed":…,"phases":[{"passed":true,"converged_s":12.0}],"seconds":…,"exchanges":{"clients":…,"regions":…}}`.
pub fn summary_json(name: &str, outcome: &Outcome) -> String {
    let phases: Vec<String> = outcome
        .phases
        .iter()
        .map(|p| {
            let converged = p.converged_s.map_or("null".to_string(), |t| format!("{t:.1}"));
            format!("{{\"passed\":{},\"converged_s\":{converged}}}", p.passed)
        })
        .collect();
    let e = outcome.exchanges;
    format!(
        "{{\"scenario\":{},\"seed\":{},\"passed\":{},\"phases\":[{}],\"seconds\":{},\"exchanges\":{{\"clients\":{},\"regions\":{}}}}}\n",
        json_string(name),
        outcome.seed,
        outcome.passed(),
        phases.join(","),
        outcome.timeline.len(),
        e.clients,
        e.regions
    )
}

/// Writes `timeline.csv`, `summary.json` and `timeline.png` into `dir`, creating it.
pub fn write_all(dir: &Path, name: &str, outcome: &Outcome) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("timeline.csv"), timeline_csv(outcome))?;
    std::fs::write(dir.join("summary.json"), summary_json(name, outcome))?;
    std::fs::write(dir.join("timeline.png"), crate::chart::render(name, outcome))?;
    Ok(())
}
