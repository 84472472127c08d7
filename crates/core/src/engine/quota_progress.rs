//! What a successor needs of a group's quota windows to count on where this engine left them:
//! its meter written between flushes, and where each window under way began.
//!
//! A controller killed loses what it metered since its last write. For the window its
//! allotments belong to (the group's shortest) that loss is made good by the clients, who
//! report what they used of it; for the longer windows (an hour beside a minute, a month beside
//! a day) it is not, so the meters of groups with allotments under way are taken to be written
//! about every second ([`Engine::take_quota_meters`]), and a successor places the start of
//! each window under way ([`Engine::quota_windows`]) on the usage records those writes leave.

use super::{Engine, Meter, Tracked, allot, metering};
use crate::settings::{BudgetPeriod, GroupName};

impl Engine {
    /// The meters of the groups with quota allotments under way whose consumption changed
    /// since they were last taken here, sorted by name: for the controller to write between
    /// its flushes, so that a successor loses at most about a second of what they consumed in
    /// windows longer than their allotments'. The meters stay marked for the next flush.
    pub fn take_quota_meters(&mut self) -> Vec<(GroupName, Meter)> {
        let (tracked, idle) = (&self.tracked, &self.metering.idle);
        let mut out = Vec::new();
        for (name, written) in self.quotas.written_marks() {
            let meter = tracked.get(name).map(|g| g.meter).or_else(|| idle.get(name).map(|m| m.meter));
            if let Some(m) = meter
                && m.consumed != *written
            {
                *written = m.consumed;
                out.push((name.clone(), m));
            }
        }
        out
    }

    /// Every quota window under way at `wall_ms` that the clock places (not a group's life,
    /// not one from the first request), with its group and its start: for an engine that did
    /// not meter the group through that start (a controller starting, or taking a group over)
    /// to count each from where it began ([`set_budget_baseline`](Self::set_budget_baseline)).
    pub fn quota_windows(&mut self, wall_ms: u64) -> Vec<(GroupName, BudgetPeriod, u64)> {
        self.windows_under_way(wall_ms, false)
    }
}

/// Meters what `key`'s clients spent before this engine knew them that no metering holds (a
/// killed leader's last, unwritten): it is consumption, counted in every window under way and
/// written with the rest ([`allot::Quotas::take_unmetered`]).
pub(super) fn meter_unmetered(
    quotas: &mut allot::Quotas,
    metering: &mut metering::Metering,
    key: &GroupName,
    g: &mut Tracked,
) {
    let found = quotas.take_unmetered(key);
    if found > 0.0 {
        g.meter.consumed += found;
        if !std::mem::replace(&mut g.dirty, true) && metering.on {
            metering.dirty.push(key.clone());
        }
    }
}
