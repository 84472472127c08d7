//! The writes of consumption to the store: every flush's (each group's running total, usage
//! records and resumable ramps), the meters of groups with quotas between flushes, and the
//! quota windows a controller places on what was written when it did not meter their start.

use std::sync::atomic::Ordering;

use tollgate_model::engine::Engine;
use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;

use super::readings::Views;
use crate::store::{Shared, StoreError, StoredRamp};

/// How often the meters of groups with quota allotments under way are written between flushes
/// ([`Writes::quota_meters`]): what a controller killed loses of their longer windows.
pub const QUOTA_WRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The most changed meters a flush takes under one hold of the engine's lock: a tenth of a
/// millisecond's work at most, the lock let go between slices.
const METERS_A_SLICE: usize = 1_024;

/// The controller's writes of consumption ([`super::Controller::writes`]).
pub struct Writes<'a> {
    pub(super) engine: &'a parking_lot::Mutex<Engine>,
    pub(super) store: &'a Shared,
    pub(super) views: &'a Views,
}

impl Writes<'_> {
    /// Writes the consumption of every group in traffic (the configured groups' running totals,
    /// and every group's usage records) and the resumable ramps to the store (nothing in a
    /// regional controller: the global tier writes what the regions consumed). `now` is the
    /// engine's time, `wall_ms` the Unix time in milliseconds. With the groups sharded, `mine`
    /// says by a tree's root which groups are this controller's: the stored ramps of the others
    /// are left as they are.
    pub fn flush(
        &self,
        now: Nanos,
        wall_ms: u64,
        mine: Option<&dyn Fn(&GroupName) -> bool>,
    ) -> Result<(), StoreError> {
        {
            let mut engine = self.engine.lock();
            engine.set_wall_clock(now, wall_ms);
            // A region's consumption reaches the global tier in its exchanges, and is written
            // there: nothing to write here.
            if engine.is_regional() {
                drop(engine.take_dirty_meters(usize::MAX));
                return Ok(());
            }
        }
        // Every group in traffic is metered; the running totals of configured groups alone
        // are kept (restored at start, budgeted on), the others' only as usage records. Taken
        // a slice at a time, the lock let go between slices: exchanges and checks wait for it.
        let (mut meters, mut usage_only) = (Vec::new(), Vec::new());
        let (ramps, scope) = loop {
            let mut engine = self.engine.lock();
            let (taken, more) = engine.take_dirty_meters(METERS_A_SLICE);
            for (name, meter) in taken {
                let kept = if engine.group(&name).is_some() { &mut meters } else { &mut usage_only };
                kept.push((name, meter));
            }
            if more {
                continue;
            }
            let ramps: Vec<(GroupName, StoredRamp)> = engine
                .resumable_ramps(now)
                .into_iter()
                .map(|(name, value, ttl)| {
                    let until = wall_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
                    (name, StoredRamp { value, until_unix_ms: until })
                })
                .collect();
            let scope: Option<std::collections::HashSet<GroupName>> = mine.map(|mine| {
                engine
                    .groups()
                    .into_iter()
                    .filter(|(n, _)| mine(engine.root_of(n)))
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            break (ramps, scope);
        };
        // Written in the order of their names, as each slice came.
        meters.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        usage_only.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let minute = crate::store::minute_of(wall_ms);
        let result = {
            let mut store = self.store.lock();
            match &scope {
                None => store.put_meters(&meters, &ramps, minute),
                Some(scope) => store.put_meters_of(&meters, &ramps, minute, scope),
            }
            .and_then(|()| store.put_usage(&usage_only, minute))
        };
        if result.is_err() {
            self.views.flush_failures.fetch_add(1, Ordering::Relaxed);
            // Not written: keep them to write next time.
            self.engine.lock().mark_dirty(meters.iter().chain(&usage_only).map(|(n, _)| n));
        }
        result?;
        super::refresh_budget_periods(self.engine, self.store, wall_ms)
    }

    /// Writes the meters of the configured groups with quota allotments under way whose
    /// consumption changed since they were last written here, with their usage records, the
    /// ramps left as they are: every [`QUOTA_WRITE_EVERY`] between the flushes, so that a
    /// controller that takes over counts their longer windows (an hour beside a minute) from
    /// at most about a second before the last one stopped. The window their allotments belong
    /// to needs none of it: clients report what they used of it. With the groups sharded,
    /// `mine` says by a tree's root which groups are this controller's. Nothing in a regional
    /// controller. Returns how many meters were written; a failed write is counted with the
    /// flushes' and left to the next flush.
    pub fn quota_meters(
        &self,
        wall_ms: u64,
        mine: Option<&dyn Fn(&GroupName) -> bool>,
    ) -> Result<usize, StoreError> {
        let meters = {
            let mut engine = self.engine.lock();
            if engine.is_regional() {
                return Ok(0);
            }
            let mut meters = engine.take_quota_meters();
            // The running totals of configured groups alone are kept, as at a flush.
            meters.retain(|(n, _)| {
                engine.group(n).is_some() && mine.is_none_or(|mine| mine(engine.root_of(n)))
            });
            meters
        };
        if meters.is_empty() {
            return Ok(0);
        }
        let written = self.store.lock().put_running_meters(&meters, crate::store::minute_of(wall_ms));
        if written.is_err() {
            self.views.flush_failures.fetch_add(1, Ordering::Relaxed);
        }
        written.map(|()| meters.len())
    }

    /// Counts each quota window under way at `wall_ms` of the groups `mine` says by their
    /// tree's root (every group's when `None`) from where it began, for a controller starting
    /// or taking groups over, whose metering did not see those windows begin (a follower's
    /// rolled on its own metering). A window that begins on a minute (minutes, hours, days,
    /// weeks, months) counts from the group's consumption as of its last usage record before
    /// it began (from nothing without one; never above what it has consumed now); a window of
    /// seconds from the consumption now, what clients report of their allotments' window
    /// making up the rest. Nothing in a regional controller (the global tier counts the
    /// windows). Returns how many windows were placed on the records.
    pub fn place_windows(
        &self,
        wall_ms: u64,
        mine: Option<&dyn Fn(&GroupName) -> bool>,
    ) -> Result<usize, StoreError> {
        let (on_minutes, of_seconds): (Vec<_>, Vec<_>) = {
            let mut engine = self.engine.lock();
            if engine.is_regional() {
                return Ok(0);
            }
            let mut windows = engine.quota_windows(wall_ms);
            windows.retain(|(g, _, _)| mine.is_none_or(|mine| mine(engine.root_of(g))));
            windows.into_iter().partition(|(_, w, _)| w.begins_on_minutes())
        };
        let starts: Vec<(GroupName, u64)> =
            on_minutes.iter().map(|(g, _, start)| (g.clone(), *start)).collect();
        let before =
            if starts.is_empty() { Vec::new() } else { self.store.lock().consumed_before(&starts)? };
        let mut engine = self.engine.lock();
        let placed = on_minutes.len();
        let recorded = on_minutes.into_iter().zip(before).map(|(w, c)| (w, c.unwrap_or(0.0)));
        let now = of_seconds.into_iter().map(|w| (w, f64::INFINITY));
        for ((group, window, start), consumed) in recorded.chain(now).collect::<Vec<_>>() {
            let now = engine.meter(&group).map_or(0.0, |m| m.consumed);
            engine.set_budget_baseline(group, window, start, consumed.min(now));
        }
        Ok(placed)
    }
}
