//! The contract's rules for what a client or a backend sends, next to the limits they
//! enforce: every id, group name and number of an exchange or a backend report is checked
//! here before the engine sees it, and a field that breaks a rule is named with its path
//! (`groups[3].demand`) and the rule.

use tollgate_model::cost::Consumption;
use tollgate_model::engine::{ClientReport, Health};
use tollgate_model::settings::GroupName;

use crate::v1;
use crate::wire::{ExchangeView, ReportView};

/// The most groups one exchange may carry.
pub const EXCHANGE_GROUPS_MAX: usize = 1000;
/// The most groups one backend report may carry.
pub const REPORT_GROUPS_MAX: usize = 10_000;
/// The longest client id, in bytes.
pub const CLIENT_ID_MAX_BYTES: usize = 128;
/// The longest backend id or zone, in bytes.
pub const BACKEND_ID_MAX_BYTES: usize = 255;
/// The largest number one report may carry for a rate or a count of units: far above any real
/// rate, low enough that a hostile client cannot push a counter to infinity.
pub const REPORT_VALUE_MAX: f64 = 1e15;

/// The longest exchange period a client may ask for, in milliseconds (an hour).
pub const TARGET_REQUEST_PERIOD_MAX_MS: u32 = 3_600_000;

/// A field that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path in the message (`client_id`, `groups[3].demand`).
    pub field: String,
    /// The rule it breaks, with the offending value where that helps.
    pub rule: String,
}

impl FieldError {
    fn new(field: impl Into<String>, rule: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), rule: rule.into() }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for FieldError {}

/// An id (client, backend, zone): 1 to `max` bytes of printable text.
pub fn id(field: &str, v: &str, max: usize) -> Result<(), FieldError> {
    if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
        return Err(FieldError::new(field, format!("must be 1 to {max} bytes of printable text")));
    }
    Ok(())
}

/// A group name, or the rule it breaks under the field `field()` names (built only then: a
/// valid message formats nothing).
fn group_name(field: impl Fn() -> String, name: &str) -> Result<GroupName, FieldError> {
    GroupName::new(name).map_err(|e| FieldError::new(field(), e.rule))
}

/// A reported number: finite, from 0 to [`REPORT_VALUE_MAX`].
pub fn quantity(field: impl Fn() -> String, v: f64) -> Result<f64, FieldError> {
    if v.is_finite() && (0.0..=REPORT_VALUE_MAX).contains(&v) {
        Ok(v)
    } else {
        Err(FieldError::new(
            field(),
            format!("must be a finite number from 0 to {REPORT_VALUE_MAX:e}, got {v}"),
        ))
    }
}

/// An exchange's client id, asked period and each group's usage, checked: each group's name
/// and report for the engine, in order. The first field that breaks a rule refuses it whole.
pub fn exchange(req: &ExchangeView<'_>) -> Result<Vec<(GroupName, ClientReport)>, FieldError> {
    id("client_id", req.client_id, CLIENT_ID_MAX_BYTES)?;
    if req.target_request_period_ms > TARGET_REQUEST_PERIOD_MAX_MS {
        return Err(FieldError::new(
            "target_request_period_ms",
            format!("must be at most {TARGET_REQUEST_PERIOD_MAX_MS}, got {}", req.target_request_period_ms),
        ));
    }
    if req.groups.len() > EXCHANGE_GROUPS_MAX {
        return Err(FieldError::new(
            "groups",
            format!("at most {EXCHANGE_GROUPS_MAX} per exchange, got {}", req.groups.len()),
        ));
    }
    let mut reports = Vec::with_capacity(req.groups.len());
    for (i, g) in req.groups.iter().enumerate() {
        let name = group_name(|| format!("groups[{i}].group"), g.group)?;
        let field = |f: &str, v: f64| quantity(|| format!("groups[{i}].{f}"), v);
        // Kept apart, for the high-water marks (`largest` is not the engine's).
        field("largest", g.largest)?;
        let report = ClientReport {
            demand: field("demand", g.demand)?,
            unthrottled: field("unthrottled", g.unthrottled)?,
            waiting: field("waiting", g.waiting)?,
            consumed: field("consumed", g.consumed)?,
            requests: field("admitted", g.admitted as f64)?,
            throttled: field("throttled", g.throttled as f64)?,
            held: field("held", g.held)?,
            waited: field("waited", g.waited as f64)?,
            would_refuse: field("would_refuse", g.would_refuse as f64)?,
            in_flight: slots(i, "in_flight", g.in_flight)?,
            in_flight_asked: slots(i, "in_flight_asked", g.in_flight_asked)?,
            classes: classes(i, g)?,
            // A client that takes allotments holds none where it sends none; one that does not
            // is given none (what it might send is not read).
            quota: quota_held(i, g.quota, req.takes_allotments)?,
            detail: detail(i, g.detail.as_ref())?,
        };
        reports.push((name, report));
    }
    Ok(reports)
}

/// The allotment a report says it holds: none for a client that does not take allotments
/// (what it might send is not read), an empty one where one that does sends none.
fn quota_held(
    i: usize,
    quota: Option<tollgate_model::engine::QuotaHeld>,
    takes_allotments: bool,
) -> Result<Option<tollgate_model::engine::QuotaHeld>, FieldError> {
    use tollgate_model::engine::{LASTS_MAX, QuotaHeld};
    let field = |f: &str, v: f64| quantity(|| format!("groups[{i}].{f}"), v);
    let Some(q) = quota.filter(|_| takes_allotments) else {
        return Ok(takes_allotments.then(QuotaHeld::default));
    };
    if let Some(d) = q.lasts.filter(|d| *d > LASTS_MAX) {
        return Err(FieldError::new(
            format!("groups[{i}].quota.lasts_ms"),
            format!("must be at most {}, got {}", LASTS_MAX.as_millis(), d.as_millis()),
        ));
    }
    Ok(Some(QuotaHeld {
        window: q.window,
        given: field("quota.given", q.given)?,
        used: field("quota.used", q.used)?,
        lasts: q.lasts,
    }))
}

/// The detailed consumption of a report, each figure checked; none when none is sent.
fn detail(i: usize, given: Option<&[f64; 7]>) -> Result<Consumption, FieldError> {
    let Some(given) = given else { return Ok(Consumption::default()) };
    let mut checked = [0.0; 7];
    for ((out, &v), name) in checked.iter_mut().zip(given).zip(Consumption::NAMES) {
        *out = quantity(|| format!("groups[{i}].detail.{name}"), v)?;
    }
    Ok(Consumption::from_values(checked))
}

/// The critical and sheddable counts of a report: each class within the report's admitted
/// and throttled requests, the two classes together too.
fn classes(i: usize, g: &crate::wire::UsageView<'_>) -> Result<[[u64; 2]; 2], FieldError> {
    let [critical, sheddable] = g.classes;
    for (k, (total, name)) in [(g.admitted, "admitted"), (g.throttled, "throttled")].into_iter().enumerate() {
        if critical[k].saturating_add(sheddable[k]) > total {
            return Err(FieldError::new(
                format!("groups[{i}].critical_{name}"),
                format!("critical_{name} and sheddable_{name} must add up to at most {name} ({total})"),
            ));
        }
    }
    Ok(g.classes)
}

/// A count of in-flight slots in a report: at most a quota's largest.
fn slots(i: usize, field: &str, n: u32) -> Result<u32, FieldError> {
    let max = tollgate_model::settings::MAX_IN_FLIGHT;
    if n > max {
        return Err(FieldError::new(
            format!("groups[{i}].{field}"),
            format!("must be at most {max}, got {n}"),
        ));
    }
    Ok(n)
}

/// A backend report, checked: its health and the loads that keep the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedReport {
    /// The backend's health.
    pub health: Health,
    /// Each load's group and units/s, for the loads that keep the rules.
    pub loads: Vec<(GroupName, f64)>,
    /// Each load left out, as `loads[i].field: rule`.
    pub rejected: Vec<String>,
    /// The backend's capacity, units/s, if it gave one.
    pub capacity: Option<f64>,
}

/// A backend report's ids, health and loads, checked. A bad id, health or count refuses it
/// whole; a load naming an invalid group or carrying a bad number is left out and listed.
pub fn backend_report(r: &ReportView<'_>) -> Result<CheckedReport, FieldError> {
    id("backend_id", r.backend_id, BACKEND_ID_MAX_BYTES)?;
    id("zone", r.zone, BACKEND_ID_MAX_BYTES)?;
    let health = match r.health {
        Some(v1::backend_report::Health::QueueBytes(q)) => {
            Health::QueueBytes(quantity(|| "queue_bytes".into(), q)?)
        }
        Some(v1::backend_report::Health::Utilisation(u)) => {
            Health::Utilisation(quantity(|| "utilisation".into(), u)?)
        }
        None => return Err(FieldError::new("health", "give queue_bytes or utilisation")),
    };
    let capacity = match r.capacity {
        Some(c) if c.is_nan() || c <= 0.0 => {
            return Err(FieldError::new("capacity", format!("must be a finite number above 0, got {c}")));
        }
        c => c.map(|c| quantity(|| "capacity".into(), c)).transpose()?,
    };
    if r.loads.len() > REPORT_GROUPS_MAX {
        return Err(FieldError::new(
            "loads",
            format!("at most {REPORT_GROUPS_MAX} groups, got {}", r.loads.len()),
        ));
    }
    let mut loads = Vec::with_capacity(r.loads.len());
    let mut rejected = Vec::new();
    for (i, l) in r.loads.iter().enumerate() {
        let checked = group_name(|| format!("loads[{i}].group"), l.group)
            .and_then(|n| quantity(|| format!("loads[{i}].units_per_s"), l.units_per_s).map(|u| (n, u)));
        match checked {
            Ok(load) => loads.push(load),
            Err(e) => rejected.push(e.to_string()),
        }
    }
    Ok(CheckedReport { health, loads, rejected, capacity })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::UsageView;

    fn usage(group: &str, demand: f64) -> UsageView<'_> {
        UsageView { group, demand, ..UsageView::default() }
    }

    #[test]
    fn an_exchange_names_the_first_field_that_breaks_a_rule() {
        let req = |groups| ExchangeView { client_id: "c", sequence: 1, groups, ..Default::default() };
        let e = exchange(&req(vec![usage("g", f64::INFINITY)])).unwrap_err();
        assert_eq!(e.field, "groups[0].demand");
        assert!(e.rule.starts_with("must be a finite number from 0 to 1e15"), "{e}");
        let e = exchange(&req(vec![usage("g", 1.0), usage("", 1.0)])).unwrap_err();
        assert_eq!(e.field, "groups[1].group");
        let e = exchange(&ExchangeView { client_id: "", ..req(vec![]) }).unwrap_err();
        assert_eq!(e.to_string(), "client_id: must be 1 to 128 bytes of printable text");
        let e = exchange(&ExchangeView { target_request_period_ms: 3_600_001, ..req(vec![]) }).unwrap_err();
        assert_eq!(e.to_string(), "target_request_period_ms: must be at most 3600000, got 3600001");
        let many: Vec<_> = (0..=EXCHANGE_GROUPS_MAX).map(|_| usage("g", 1.0)).collect();
        assert_eq!(exchange(&req(many)).unwrap_err().field, "groups");
        let ok = exchange(&req(vec![usage("g", 2.0)])).unwrap();
        assert_eq!(ok[0].1.demand, 2.0);
    }

    #[test]
    fn a_backend_report_leaves_out_bad_loads_and_refuses_a_bad_head() {
        let loads = vec![
            crate::wire::LoadView { group: "good", units_per_s: 1.0 },
            crate::wire::LoadView { group: "bad\nname", units_per_s: 1.0 },
            crate::wire::LoadView { group: "nan", units_per_s: f64::NAN },
        ];
        let r = ReportView {
            backend_id: "b",
            zone: "z",
            health: Some(v1::backend_report::Health::Utilisation(0.5)),
            loads,
            capacity: None,
        };
        let checked = backend_report(&r).unwrap();
        assert_eq!(checked.loads.len(), 1);
        assert_eq!(checked.rejected.len(), 2);
        assert!(checked.rejected[1].starts_with("loads[2].units_per_s:"), "{checked:?}");
        let e = backend_report(&ReportView { health: None, ..r }).unwrap_err();
        assert_eq!(e.field, "health");
    }
}
