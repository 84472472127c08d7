//! What the controller shows: the status in the contract's form and as JSON, and the exchange
//! latency histogram. `Admin.Status`, `GET /status`, `tollgate status` and `/metrics` all read
//! from here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::time::Nanos;
use tollgate_proto::v1;

use crate::controller::Controller;
use crate::convert;

/// Upper bounds of the exchange-latency histogram buckets, in seconds.
pub const BUCKETS_S: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0];

/// A latency histogram, updated lock-free by the exchange handler.
#[derive(Debug, Default)]
pub struct Latency {
    pub(crate) buckets: [AtomicU64; BUCKETS_S.len()],
    pub(crate) count: AtomicU64,
    pub(crate) sum_ns: AtomicU64,
}

impl Latency {
    /// Records one exchange's handling time.
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, bound) in BUCKETS_S.iter().enumerate() {
            if s <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// The controller's status in the contract's form.
pub fn status_response(controller: &Controller, now: Nanos) -> v1::StatusResponse {
    let groups = controller
        .view()
        .iter()
        .map(|g| v1::GroupStatus {
            name: g.name.to_string(),
            settings: g.settings.as_ref().map(convert::settings_to_proto),
            target: g.target,
            admitted: g.admitted,
            demand: g.demand,
            busy: g.busy,
            clients: g.clients,
            throttled: g.throttled,
            unthrottled: g.unthrottled,
            consumed_total: g.meter.consumed,
            admitted_total: g.meter.admitted,
            throttled_total: g.meter.throttled,
            budget_exhausted: g.budget_exhausted,
            ramp_pool: g.ramp_pool,
        })
        .collect();
    let node = controller.node();
    let (clients, backends, learning) = controller.tracking(now);
    v1::StatusResponse {
        capacity: node.capacity,
        groups,
        exchanges: controller.exchanges(),
        mode: convert::mode_to_proto(node.mode) as i32,
        learning,
        clients: clients as u64,
        backends: backends as u64,
    }
}

fn settings_json(s: &v1::GroupSettings) -> serde_json::Value {
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
        "ramp": ramp,
    })
}

/// The status as JSON, for `GET /status` and `tollgate status --json` alike.
pub fn status_json(s: &v1::StatusResponse) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = s
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "name": g.name,
                "settings": g.settings.as_ref().map(settings_json),
                "target": g.target,
                "admitted": g.admitted,
                "throttled": g.throttled,
                "demand": g.demand,
                "unthrottled": g.unthrottled,
                "busy": g.busy,
                "clients": g.clients,
                "consumed_total": g.consumed_total,
                "admitted_total": g.admitted_total,
                "throttled_total": g.throttled_total,
                "budget_exhausted": g.budget_exhausted,
                "ramp_pool": g.ramp_pool,
            })
        })
        .collect();
    let mode = if s.mode() == v1::AllocationMode::Fcfs { "fcfs" } else { "share" };
    serde_json::json!({
        "capacity": s.capacity,
        "mode": mode,
        "exchanges": s.exchanges,
        "learning": s.learning,
        "clients": s.clients,
        "backends": s.backends,
        "groups": groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue: the status JSON showed priorities as 16 and 8 instead of `high` and `medium`.
    #[test]
    fn priorities_read_as_people_say_them() {
        let settings = |priority| Some(v1::GroupSettings { priority, weight: 1.0, ..Default::default() });
        let status = v1::StatusResponse {
            groups: vec![
                v1::GroupStatus { name: "a".into(), settings: settings(16), ..Default::default() },
                v1::GroupStatus { name: "b".into(), settings: settings(8), ..Default::default() },
                v1::GroupStatus { name: "c".into(), settings: settings(3), ..Default::default() },
            ],
            ..Default::default()
        };
        let json = status_json(&status);
        let priorities: Vec<&str> = json["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["settings"]["priority"].as_str().unwrap())
            .collect();
        assert_eq!(priorities, ["high", "medium", "3"]);
        assert_eq!(json["mode"], "share");
    }
}
