//! The JSON forms of settings that several surfaces print: `/status`, `tollgate status
//! --json` and the audit log.

use tollgate_proto::v1;

use crate::convert;

/// A group's settings as JSON, priorities and modes by name.
pub fn group_settings(s: &v1::GroupSettings) -> serde_json::Value {
    let ramp = s.ramp.as_ref().map(|r| {
        let mode = match v1::RampMode::try_from(r.mode) {
            Ok(v1::RampMode::Scheduled) => "scheduled",
            Ok(v1::RampMode::OnlyIfUsed) => "only_if_used",
            Ok(v1::RampMode::GoBackN) => "go_back_n",
            _ => "relaxed",
        };
        serde_json::json!({
            "min": r.min,
            "max": r.max,
            "duration_s": r.duration_s,
            "mode": mode,
            "threshold_pct": r.threshold_pct,
            "ramp_down_pct": r.ramp_down_pct,
            "cool_down_s": r.cool_down_s,
            "resume_ttl_s": r.resume_ttl_s,
        })
    });
    serde_json::json!({
        "reserved": s.reserved,
        "limit": s.limit,
        "burst": s.burst,
        "priority": convert::priority_name(s.priority),
        "weight": s.weight,
        "budget": s.budget,
        "budget_period": if s.budget_period.is_empty() { "total" } else { s.budget_period.as_str() },
        "ramp": ramp,
        "dropped": if s.count_dropped { "count" } else { "return" },
        "debt_repay_s": s.debt_repay_s.unwrap_or(5.0),
        "reads_writes_apart": s.reads_writes_apart,
        "backend_limit": s.backend_limit,
        "background": s.background,
    })
}
