//! Between the contract's messages and the core's validated types.

use std::time::Duration;

use crate::v1;
use tollgate_model::allocate::AllocationMode;
use tollgate_model::settings::{
    DroppedWork, GroupName, GroupSettings, GroupSettingsBuilder, Limit, Priority, RampMode, RampSettings,
    SettingError, SettingErrors,
};

/// The contract's form of validated settings.
pub fn settings_to_proto(s: &GroupSettings) -> v1::GroupSettings {
    v1::GroupSettings {
        reserved: s.reserved(),
        limit: match s.limit() {
            Limit::Units(u) => Some(u),
            Limit::Unlimited => None,
        },
        burst: s.burst(),
        priority: u32::from(s.priority().level()),
        weight: s.weight(),
        budget: s.budget(),
        ramp: s.ramp().map(ramp_to_proto),
        count_dropped: s.dropped() == DroppedWork::Count,
        debt_repay_s: Some(s.debt_repay().as_secs_f64()),
        reads_writes_apart: s.reads_writes_apart(),
        backend_limit: s.backend_limit(),
        background: s.background(),
        shadow: s.shadow(),
        critical_reserve: s.critical_reserve(),
        max_in_flight: s.max_in_flight(),
        parent: s.parent().map(ToString::to_string),
        budget_period: match s.budget_period() {
            tollgate_model::settings::BudgetPeriod::Total => String::new(),
            p => p.name().to_string(),
        },
        quotas: s.quotas().map(|(w, u)| (w.name().to_string(), u)).collect(),
    }
}

/// Validated settings from the contract's form; every broken rule is reported.
pub fn settings_from_proto(m: &v1::GroupSettings) -> Result<GroupSettings, SettingErrors> {
    apply_patch(
        GroupSettings::default(),
        &v1::GroupPatch {
            reserved: Some(m.reserved),
            limit: m.limit,
            unlimited: m.limit.is_none(),
            burst: m.burst,
            priority: Some(m.priority),
            weight: Some(m.weight),
            budget: m.budget,
            ramp: m.ramp,
            count_dropped: Some(m.count_dropped),
            debt_repay_s: m.debt_repay_s,
            reads_writes_apart: Some(m.reads_writes_apart),
            backend_limit: m.backend_limit,
            background: Some(m.background),
            shadow: Some(m.shadow),
            critical_reserve: Some(m.critical_reserve),
            max_in_flight: m.max_in_flight,
            parent: m.parent.clone(),
            budget_period: Some(m.budget_period.clone()),
            quotas: m.quotas.clone(),
            ..v1::GroupPatch::default()
        },
    )
}

/// A ramp in the contract's form.
pub fn ramp_to_proto(r: &RampSettings) -> v1::RampSettings {
    let mode = match r.mode {
        RampMode::Scheduled => v1::RampMode::Scheduled,
        RampMode::Relaxed => v1::RampMode::Relaxed,
        RampMode::OnlyIfUsed => v1::RampMode::OnlyIfUsed,
        RampMode::GoBackN => v1::RampMode::GoBackN,
    };
    v1::RampSettings {
        min: r.min,
        max: r.max,
        duration_s: r.duration.as_secs_f64(),
        mode: mode as i32,
        threshold_pct: Some(r.threshold_pct),
        ramp_down_pct: Some(r.ramp_down_pct),
        cool_down_s: Some(r.cool_down.as_secs_f64()),
        resume_ttl_s: r.resume_ttl.map(|d| d.as_secs_f64()),
    }
}

/// Seconds as a duration within the settings' bounds, or the rule it breaks.
fn seconds(field: &str, s: f64, errors: &mut Vec<SettingError>) -> Option<Duration> {
    let max = tollgate_model::settings::DURATION_MAX;
    match Duration::try_from_secs_f64(s) {
        Ok(d) if d <= max => Some(d),
        _ => {
            errors.push(SettingError::new(
                field,
                format!("must be a number of seconds from 0 to {}, got {s}", max.as_secs()),
            ));
            None
        }
    }
}

/// A ramp from the contract's form (validated with the group's other settings).
fn ramp_from_proto(m: &v1::RampSettings, errors: &mut Vec<SettingError>) -> RampSettings {
    let mode = match v1::RampMode::try_from(m.mode) {
        Ok(v1::RampMode::Scheduled) => RampMode::Scheduled,
        Ok(v1::RampMode::Relaxed | v1::RampMode::Unspecified) => RampMode::Relaxed,
        Ok(v1::RampMode::OnlyIfUsed) => RampMode::OnlyIfUsed,
        Ok(v1::RampMode::GoBackN) => RampMode::GoBackN,
        Err(_) => {
            errors.push(SettingError::new("ramp.mode", format!("unknown mode {}", m.mode)));
            RampMode::Relaxed
        }
    };
    let mut r = RampSettings::new(m.min, m.max, Duration::ZERO);
    r.mode = mode;
    if let Some(d) = seconds("ramp.duration_s", m.duration_s, errors) {
        r.duration = d;
    }
    if let Some(t) = m.threshold_pct {
        r.threshold_pct = t;
    }
    if let Some(p) = m.ramp_down_pct {
        r.ramp_down_pct = p;
    }
    if let Some(c) = m.cool_down_s.and_then(|c| seconds("ramp.cool_down_s", c, errors)) {
        r.cool_down = c;
    }
    if let Some(t) = m.resume_ttl_s {
        r.resume_ttl = seconds("ramp.resume_ttl_s", t, errors);
    }
    r
}

/// `base` with the fields the patch sets changed, validated.
pub fn apply_patch(base: GroupSettings, p: &v1::GroupPatch) -> Result<GroupSettings, SettingErrors> {
    let mut errors = Vec::new();
    conflicts(p, &mut errors);
    let b = patch_rates(base.to_builder(), p, &mut errors);
    let b = patch_behaviour(b, p, &mut errors);
    let b = patch_quotas(b, p, &mut errors);
    match b.build() {
        Ok(s) if errors.is_empty() => Ok(s),
        Ok(_) => Err(SettingErrors(errors)),
        Err(SettingErrors(more)) => {
            errors.extend(more);
            Err(SettingErrors(errors))
        }
    }
}

/// The fields a patch both sets and clears (or a limit with `unlimited`).
fn conflicts(p: &v1::GroupPatch, errors: &mut Vec<SettingError>) {
    if p.unlimited && p.limit.is_some() {
        errors.push(SettingError::new("limit", "give a limit or unlimited, not both"));
    }
    for (clear, set, field) in [
        (p.clear_ramp, p.ramp.is_some(), "ramp"),
        (p.clear_budget, p.budget.is_some(), "budget"),
        (p.clear_burst, p.burst.is_some(), "burst"),
        (p.clear_backend_limit, p.backend_limit.is_some(), "backend_limit"),
        (p.clear_max_in_flight, p.max_in_flight.is_some(), "max_in_flight"),
        (p.clear_parent, p.parent.is_some(), "parent"),
    ] {
        if clear && set {
            errors.push(SettingError::new(field, format!("give a {field} or clear it, not both")));
        }
    }
}

/// The patch's rates, priority, weight, budget and ramp.
fn patch_rates(
    mut b: GroupSettingsBuilder,
    p: &v1::GroupPatch,
    errors: &mut Vec<SettingError>,
) -> GroupSettingsBuilder {
    if let Some(r) = p.reserved {
        b = b.reserved(r);
    }
    if p.unlimited {
        b = b.limit_of(Limit::Unlimited);
    } else if let Some(l) = p.limit {
        b = b.limit(l);
    }
    if let Some(x) = p.burst {
        b = b.burst(x);
    }
    if let Some(level) = p.priority {
        match u8::try_from(level).ok().map(Priority::new) {
            Some(Ok(priority)) => b = b.priority(priority),
            _ => errors.push(SettingError::new("priority", format!("must be 1 to 16, got {level}"))),
        }
    }
    if let Some(w) = p.weight {
        b = b.weight(w);
    }
    if let Some(x) = p.budget {
        b = b.budget(x);
    }
    if let Some(r) = &p.ramp {
        b = b.ramp(ramp_from_proto(r, errors));
    }
    b
}

/// The patch's settings of how the group is served, and what it clears of them.
fn patch_behaviour(
    mut b: GroupSettingsBuilder,
    p: &v1::GroupPatch,
    errors: &mut Vec<SettingError>,
) -> GroupSettingsBuilder {
    if let Some(apart) = p.reads_writes_apart {
        b = b.reads_writes_apart(apart);
    }
    if let Some(l) = p.backend_limit {
        b = b.backend_limit(Some(l));
    }
    if p.clear_backend_limit {
        b = b.backend_limit(None);
    }
    if let Some(on) = p.background {
        b = b.background(on);
    }
    if let Some(on) = p.shadow {
        b = b.shadow(on);
    }
    if let Some(share) = p.critical_reserve {
        b = b.critical_reserve(share);
    }
    if let Some(n) = p.max_in_flight {
        b = b.max_in_flight(Some(n));
    }
    if p.clear_max_in_flight {
        b = b.max_in_flight(None);
    }
    if let Some(parent) = &p.parent {
        match GroupName::new(parent) {
            Ok(parent) => b = b.parent(Some(parent)),
            Err(e) => errors.push(SettingError::new("parent", e.rule)),
        }
    }
    if p.clear_parent {
        b = b.parent(None);
    }
    if let Some(count) = p.count_dropped {
        b = b.dropped(if count { DroppedWork::Count } else { DroppedWork::Return });
    }
    if let Some(d) = p.debt_repay_s.and_then(|d| seconds("debt_repay_s", d, errors)) {
        b = b.debt_repay(d);
    }
    if p.clear_ramp {
        b = b.no_ramp();
    }
    if let Some(period) = &p.budget_period {
        match tollgate_model::settings::BudgetPeriod::parse(period) {
            Ok(period) => b = b.budget_period(period),
            Err(rule) => errors.push(SettingError::new("budget_period", rule)),
        }
    }
    b
}

/// The patch's quotas per window (set, or removed by a quota of 0), then the budget and
/// burst it clears.
fn patch_quotas(
    mut b: GroupSettingsBuilder,
    p: &v1::GroupPatch,
    errors: &mut Vec<SettingError>,
) -> GroupSettingsBuilder {
    // Windows set and windows removed (a quota of 0) in one patch.
    let most = 2 * tollgate_model::settings::QUOTAS_MAX;
    if p.quotas.len() > most {
        errors.push(SettingError::new(
            "quotas",
            format!("at most {most} windows in one change, got {}", p.quotas.len()),
        ));
    }
    let mut quotas: Vec<(&String, &f64)> = p.quotas.iter().take(most + 1).collect();
    quotas.sort_by(|a, b| a.0.cmp(b.0));
    for (name, &units) in quotas {
        match tollgate_model::settings::BudgetPeriod::parse(name) {
            Ok(window) if units == 0.0 => b = b.no_quota(window),
            Ok(window) => b = b.quota(window, units),
            Err(rule) => errors.push(SettingError::new(format!("quotas.{name}"), rule)),
        }
    }
    if p.clear_budget {
        b = b.no_budget();
    }
    if p.clear_burst {
        b = b.no_burst();
    }
    b
}

/// The allocation mode in the contract's form.
pub fn mode_to_proto(m: AllocationMode) -> v1::AllocationMode {
    match m {
        AllocationMode::Share => v1::AllocationMode::Share,
        AllocationMode::Fcfs => v1::AllocationMode::Fcfs,
    }
}

/// The allocation mode from the contract's form.
pub fn mode_from_proto(m: v1::AllocationMode) -> AllocationMode {
    match m {
        v1::AllocationMode::Share => AllocationMode::Share,
        v1::AllocationMode::Fcfs => AllocationMode::Fcfs,
    }
}

/// A priority as people say it: `low`, `medium`, `high`, or its level.
pub fn priority_name(level: u32) -> String {
    match level {
        1 => "low".into(),
        8 => "medium".into(),
        16 => "high".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_goes_through_the_contract_and_back() {
        let ramp = RampSettings {
            mode: RampMode::GoBackN,
            resume_ttl: Some(Duration::from_secs(60)),
            ..RampSettings::new(10.0, 100.0, Duration::from_secs(30))
        };
        let s = GroupSettings::builder()
            .limit(100.0)
            .ramp(ramp)
            .budget(5.0)
            .backend_limit(Some(50.0))
            .background(true)
            .build()
            .unwrap();
        assert_eq!(settings_from_proto(&settings_to_proto(&s)).unwrap(), s);
        let cleared = apply_patch(
            s,
            &v1::GroupPatch {
                clear_ramp: true,
                clear_budget: true,
                clear_backend_limit: true,
                ..v1::GroupPatch::default()
            },
        )
        .unwrap();
        assert!(cleared.ramp().is_none() && cleared.budget().is_none() && cleared.backend_limit().is_none());
        assert!(cleared.background(), "what the patch does not name stays");
    }

    #[test]
    fn contradictions_and_broken_ramps_name_their_field() {
        let p = v1::GroupPatch {
            limit: Some(5.0),
            unlimited: true,
            ramp: Some(v1::RampSettings { min: 5.0, max: 1.0, duration_s: 1e30, ..Default::default() }),
            backend_limit: Some(-1.0),
            ..v1::GroupPatch::default()
        };
        let e = apply_patch(GroupSettings::default(), &p).unwrap_err().to_string();
        assert!(e.contains("limit: give a limit or unlimited, not both"), "{e}");
        assert!(e.contains("ramp.duration_s"), "{e}");
        assert!(e.contains("ramp.min: must not exceed ramp.max"), "{e}");
        assert!(e.contains("backend_limit: must be a finite number above 0, got -1"), "{e}");
        let both = v1::GroupPatch {
            backend_limit: Some(5.0),
            clear_backend_limit: true,
            ..v1::GroupPatch::default()
        };
        let e = apply_patch(GroupSettings::default(), &both).unwrap_err().to_string();
        assert!(e.contains("backend_limit: give a backend_limit or clear it, not both"), "{e}");
    }
}
