//! The controller: the engine behind the contract, with durable settings.
//!
//! Exchanges and backend reports are checked against the contract's bounds, then fed to the
//! [`Engine`] under one short lock; the answer is each client's grant by the engine's grant
//! policy. Admin changes are written to the store, durably, before the engine sees them; one
//! admin change runs at a time. Consumption and resumable ramps are written to the store by
//! [`Writes::flush`]. Views for status pages and metrics are built once per tick, in time
//! linear in the groups, and sorted outside the lock, so a scrape never holds exchanges up.
//! A tick holds the lock for one slice of groups at a time ([`Controller::tick`]), so an
//! exchange never waits for a whole tick either.
//!
//! Nothing here does I/O but the store, and nothing reads a clock to decide: time comes in as
//! [`Nanos`] and Unix milliseconds, so the simulator drives this same code in virtual time.
//! (How long a tick's slice held the lock is timed, to size the next slice; no grant depends
//! on it.)

mod admin;
mod ownership;
mod pacing;
mod readings;
mod shares;
mod writes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::engine::{BackendReport, Engine, EngineSettings, Relearn};
use tollgate_model::settings::GroupName;
use tollgate_model::spread::Spread;
use tollgate_model::time::Nanos;
use tollgate_proto::check::{self, FieldError};
use tollgate_proto::v1;
use tollgate_proto::wire::{ExchangeView, GrantFields, ReportView};
use tonic::Status;

use crate::observe::trace::Tracer;
use crate::store::{SettingsStore, Shared, StoreError, Stored, StoredRamp};

pub use admin::Admin;
pub use ownership::Ownership;
pub use pacing::Pacer;
pub use readings::Readings;
pub use writes::{QUOTA_WRITE_EVERY, Writes};

fn invalid(e: FieldError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// How a put treats a group that exists, or does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Create or alter.
    Upsert,
    /// Fails if the group exists.
    Create,
    /// Fails if it does not.
    Alter,
}

/// What an exchange answers besides its grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeAnswer {
    /// When the client is to exchange next, at the latest, in milliseconds.
    pub next_exchange_ms: u32,
    /// When the engine next ticks, in milliseconds.
    pub next_tick_ms: u32,
}

fn ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Lets a stored ramp resume at `now` (`wall_ms` the Unix time in milliseconds) if its
/// resume TTL has not run out; says whether it did.
fn resume_stored_ramp(
    engine: &mut Engine,
    now: Nanos,
    wall_ms: u64,
    name: GroupName,
    ramp: StoredRamp,
) -> bool {
    let Some(left) = ramp.until_unix_ms.checked_sub(wall_ms).filter(|&ms| ms > 0) else { return false };
    engine.resume_ramp(now, name, ramp.value, Duration::from_millis(left));
    true
}

/// The controller: the engine behind the contract, with durable settings.
///
/// Exchanges and backend reports are checked against the contract's bounds, then fed to the
/// [`Engine`] under one short lock; the answer is each client's grant by the engine's grant
/// policy. Admin changes are written to the store, durably, before the engine sees them; one
/// admin change runs at a time. Consumption and resumable ramps are written to the store by
/// [`Writes::flush`]. Views for status pages and metrics are built once per tick, in time
/// linear in the groups, and sorted outside the lock, so a scrape never holds exchanges up.
/// A tick holds the lock for one slice of groups at a time ([`tick`](Pacer::tick)), so an
/// exchange never waits for a whole tick either.
///
/// Nothing here does I/O but the store, and nothing reads a clock to decide: time comes in as
/// [`Nanos`] and Unix milliseconds, so the simulator drives this same code in virtual time.
/// (How long a tick's slice held the lock is timed, to size the next slice; no grant depends
/// on it.)
pub struct Controller {
    engine: parking_lot::Mutex<Engine>,
    store: Shared,
    /// Who follows the trace, and whether events are kept.
    tracer: Arc<Tracer>,
    /// The settings desk's state ([`Admin`]).
    admin: admin::AdminState,
    /// When the ticks run ([`Pacer`]).
    pacing: pacing::Pacing,
    /// With groups sharded over controllers: the configured capacity while a part of it is in
    /// force, and how many owners share it ([`Ownership`]).
    capacity: Mutex<ownership::CapacityShare>,
    /// The views kept between ticks and the counts of work done ([`Readings`]).
    views: readings::Views,
    /// Each backend's latest loads, summed per group: what each report is answered with
    /// (dmClock's cross-backend term, [`Spread`]).
    spread: Mutex<Spread>,
}

/// The most groups a regional controller leases from the global tier: as many as an engine
/// tracks at most ([`MAX_TRACKED_GROUPS_MAX`](tollgate_model::config::MAX_TRACKED_GROUPS_MAX)),
/// so that no group a region's clients use goes without a share (a round of that many is a
/// thousand pages).
pub const UPSTREAM_GROUPS_MAX: usize = 1_000_000;

/// The most backends and the most clients that status pages, the dashboard and metric labels
/// name one by one; the rest are counted (clients: lapsed ones first, then the largest
/// grants; backends: the most utilised).
pub const DIAGNOSTICS_SHOWN_MAX: usize = 100;

/// The most backends watching the group settings at once.
pub const SETTINGS_WATCHERS_MAX: usize = 1024;

/// How soon a client of a region is asked back for a group whose share the region is leasing
/// from the global tier (the region asks for it at once: one round trip to the global leader).
/// A remote client comes back no sooner than its early spacing (50 ms); the region's own
/// front ends, whose exchanges cost no round trip, as soon as this.
pub const AWAITING_SHARE: Duration = Duration::from_millis(5);

impl Controller {
    /// A controller over `store`, with the settings, consumption and ramps it holds, and its
    /// own tracer: the controller alone, for the simulator and tests ([`crate::node::Node::open`]
    /// makes it with the other parts, which take the credentials and RLS rules). `now` is the
    /// engine's time at start; `wall_ms` the Unix time in milliseconds (for ramps that may
    /// resume within their TTL).
    pub fn new(
        mut store: Box<dyn SettingsStore>,
        settings: EngineSettings,
        now: Nanos,
        wall_ms: u64,
    ) -> Result<Controller, StoreError> {
        let stored = store.load()?;
        Controller::with_stored(Shared::new(store), stored, settings, now, wall_ms, Arc::default())
    }

    /// A controller writing through `store`, with what it holds (`stored`, as read from it):
    /// groups, node settings, consumption and ramps.
    pub(crate) fn with_stored(
        store: Shared,
        stored: Stored,
        settings: EngineSettings,
        now: Nanos,
        wall_ms: u64,
        tracer: Arc<Tracer>,
    ) -> Result<Controller, StoreError> {
        let n = stored.node;
        let settings = EngineSettings {
            capacity: n.capacity,
            mode: n.mode,
            slow_start: n.slow_start,
            shadow: n.shadow,
            throttling: n.throttling,
            ..settings
        };
        let expiry = settings.report_expiry;
        let mut engine = Engine::new(settings);
        // Quota windows are placed on the wall clock (again at every flush).
        engine.set_wall_clock(now, wall_ms);
        // Clients of the groups with traffic lately may hold grants from before the start:
        // those groups are learnt for one lease (see `Relearn`).
        let recent = recent_groups(&store, engine.settings(), wall_ms);
        engine.relearn(now, recent);
        // Its metering is written: every group's, from the start.
        engine.take_metering();
        for (name, s) in stored.groups {
            engine.set_group(name, s);
        }
        for (name, meter) in stored.meters {
            // Configured groups', and those a pattern's or the default's quotas count.
            if engine.group(&name).is_some() || engine.counts_quotas(&name) {
                engine.restore_meter(name, meter);
            }
        }
        for (name, ramp) in stored.ramps {
            resume_stored_ramp(&mut engine, now, wall_ms, name, ramp);
        }
        let controller = Controller {
            engine: parking_lot::Mutex::new(engine),
            store,
            tracer,
            admin: admin::AdminState::new(wall_ms),
            pacing: pacing::Pacing::default(),
            capacity: Mutex::new(ownership::CapacityShare::default()),
            views: readings::Views::default(),
            spread: Mutex::new(Spread::new(expiry)),
        };
        // Its metering did not see the windows under way begin: they count from the records.
        controller.writes().place_windows(wall_ms, None)?;
        controller.refresh_budget_periods(wall_ms)?;
        Ok(controller)
    }

    /// Starts each quota window from the metering: when a group's window has begun since its
    /// baseline was taken (or none was), its consumption at the window's start stops counting
    /// against that window's quota. Minutes and hours take the engine's own metering at once
    /// ([`roll_short_windows`](Self::roll_short_windows)); days, weeks and months the last
    /// usage record before the window's start (0 without one), so that they survive a restart.
    /// Runs at start, at every flush and after a change to a group.
    pub fn refresh_budget_periods(&self, wall_ms: u64) -> Result<(), StoreError> {
        refresh_budget_periods(&self.engine, &self.store, wall_ms)
    }

    /// Starts the minute and hour windows due at `wall_ms` from the engine's metering: after
    /// every tick, so that a minute's quota starts afresh within a tick of the minute.
    pub fn roll_short_windows(&self, wall_ms: u64) {
        roll_short_windows(&mut self.engine(), wall_ms);
    }

    fn engine(&self) -> parking_lot::MutexGuard<'_, Engine> {
        // The engine is plain data, consistent at every step that can panic (and this lock
        // is not poisoned by a panic).
        self.engine.lock()
    }

    /// Runs `f` on the engine (for the simulator's and tests' reading).
    pub fn with_engine<R>(&self, f: impl FnOnce(&Engine) -> R) -> R {
        f(&self.engine())
    }

    /// Answers an exchange in the generated types (the simulator's and tests' way in; the
    /// server reads and writes exchanges by hand, through [`exchange_view`](Self::exchange_view)).
    pub fn exchange(&self, now: Nanos, req: &v1::ExchangeRequest) -> Result<v1::ExchangeResponse, Status> {
        let view = ExchangeView::of(req);
        let mut grants = Vec::with_capacity(view.groups.len());
        let answer = self.exchange_view(now, &view, |i, fields| {
            grants.push(fields.grant(view.groups[i].group.to_owned()))
        })?;
        Ok(v1::ExchangeResponse {
            grants,
            next_exchange_ms: answer.next_exchange_ms,
            next_tick_ms: answer.next_tick_ms,
            unthrottled_allowed: true,
            shard_map: None,
        })
    }

    /// Answers an exchange: checks it against the contract's bounds, reports every group to
    /// the engine, and hands each grant to `grant` with the index of its group in `req`, in
    /// order; returns the rest of the answer.
    pub fn exchange_view(
        &self,
        now: Nanos,
        req: &ExchangeView<'_>,
        mut grant: impl FnMut(usize, &GrantFields),
    ) -> Result<ExchangeAnswer, Status> {
        let reports = check::exchange(req).map_err(invalid)?;
        let mut engine = self.engine();
        let client = engine
            .client(now, req.client_id, req.sequence)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        // In a region, a group the global tier has granted nothing yet is left out of the
        // answer (its clients wait for its first grant rather than take a grant of nothing),
        // and the client is asked back once the region's lease has had time to bring its share.
        let awaiting: Vec<bool> = if engine.is_regional() {
            reports.iter().map(|(name, _)| engine.awaits_upstream(name)).collect()
        } else {
            Vec::new()
        };
        let mut i = 0;
        engine.report_all(now, client, &reports, |g| {
            let fields = grant_fields(&g);
            if !awaiting.get(i).copied().unwrap_or(false) {
                grant(i, &fields);
            }
            i += 1;
        });
        let settings = engine.settings();
        let tick = settings.tick;
        let lease = settings.lease;
        // The next tick's grants are all made once it is done: as long after its start as the
        // last one took. While a tick is under way (answered between its walks), none: these
        // grants are the ones it is replacing, and the client is told to come back for its.
        let mut next_tick = self.pacing.next_tick(now, tick, engine.ticking());
        if awaiting.contains(&true) {
            next_tick = next_tick.min(AWAITING_SHARE);
            self.pacing.want_share();
        }
        drop(engine);
        self.views.exchanges.fetch_add(1, Ordering::Relaxed);
        // The period the client asked for, between the tick and half the lease (so that a
        // grant never runs out between two exchanges).
        let period = match req.target_request_period_ms {
            0 => tick,
            asked => Duration::from_millis(u64::from(asked)).clamp(tick, (lease / 2).max(tick)),
        };
        Ok(ExchangeAnswer { next_exchange_ms: ms(period), next_tick_ms: ms(next_tick) })
    }

    /// Records a backend's report. Loads naming an invalid group, or carrying a bad number,
    /// are left out and listed in the answer; the rest are taken.
    pub fn backend_report(&self, now: Nanos, r: &ReportView<'_>) -> Result<v1::ReportAck, Status> {
        let check::CheckedReport { health, loads, rejected, capacity } =
            check::backend_report(r).map_err(invalid)?;
        if let Some(first) = rejected.first() {
            tracing::warn!(backend = %r.backend_id, rejected = rejected.len(), %first, "backend report: loads left out");
        }
        // Made ready before the engine is locked, and what it replaces dropped after: a report
        // of 10,000 loads would hold up every exchange meanwhile.
        let report = BackendReport::new(r.zone, health, loads);
        let loads = report.loads().clone();
        let (replaced, onset) = {
            let mut engine = self.engine();
            let replaced = engine
                .put_backend_report(now, r.backend_id, report)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            (replaced, engine.saturation_onset())
        };
        drop(replaced);
        if onset {
            self.pacing.saturated();
        }
        let elsewhere =
            self.spread.lock().unwrap_or_else(PoisonError::into_inner).put(now, r.backend_id, loads.clone());
        let shares = shares::node_shares(&self.readings().view(), &loads, &elsewhere, capacity);
        let elsewhere = elsewhere
            .into_iter()
            .map(|(g, units_per_s)| v1::GroupLoad { group: g.to_string(), units_per_s })
            .collect();
        Ok(v1::ReportAck { rejected, elsewhere, shares })
    }

    /// How long a grant lives.
    pub fn lease(&self) -> Duration {
        self.engine().settings().lease
    }

    /// Starts a learning lease at `now` over `which` groups, for a controller that has just
    /// become the leader or taken over shards: for one lease, no client of those groups is
    /// granted more than it says it holds from the controller before.
    pub fn relearn(&self, now: Nanos, which: Relearn) {
        self.engine().relearn(now, which);
    }

    /// The counter behind [`Readings::grpc_writes`], for the listener.
    pub(crate) fn grpc_write_counter(&self) -> Arc<AtomicU64> {
        self.views.grpc_writes.clone()
    }

    /// The settings desk: group and node settings, their warnings, usage and the audit log.
    pub fn admin(&self) -> Admin<'_> {
        Admin {
            engine: &self.engine,
            store: &self.store,
            state: &self.admin,
            capacity: &self.capacity,
            views: &self.views,
        }
    }

    /// The writes of consumption to the store: every flush's, the quota groups' between them,
    /// and the quota windows placed on what was written.
    pub fn writes(&self) -> Writes<'_> {
        Writes { engine: &self.engine, store: &self.store, views: &self.views }
    }

    /// The ticking: ticks in slices, early ones, and their counts.
    pub fn pacer(&self) -> Pacer<'_> {
        Pacer { engine: &self.engine, state: &self.pacing, views: &self.views, tracer: &self.tracer }
    }

    /// The groups and the part of the capacity this controller owns, and a region's leased shares.
    pub fn ownership(&self) -> Ownership<'_> {
        Ownership { engine: &self.engine, capacity: &self.capacity, pacing: &self.pacing }
    }

    /// What the controller shows: views, diagnostics, counts and the trace.
    pub fn readings(&self) -> Readings<'_> {
        Readings { engine: &self.engine, store: &self.store, views: &self.views, tracer: &self.tracer }
    }
}

/// A grant made, in the answer's fields: a rate and burst the client can apply as they are.
fn grant_fields(g: &tollgate_model::engine::Grant) -> GrantFields {
    let unlimited = g.is_unlimited();
    let fields = GrantFields {
        unlimited,
        rate: if unlimited { 0.0 } else { g.rate },
        burst: if unlimited { 0.0 } else { g.burst },
        lease_ms: ms(g.lease),
        reserved: g.reserved,
        clients: g.clients,
        count_dropped: g.dropped == tollgate_model::settings::DroppedWork::Count,
        debt_repay_ms: ms(g.debt_repay),
        trickle_ms: ms(g.trickle),
        shadow: g.shadow,
        critical_reserve: g.critical_reserve,
        in_flight: g.in_flight,
        quota: g.quota,
    };
    debug_assert!(
        fields.rate.is_finite() && fields.rate >= 0.0 && fields.burst.is_finite() && fields.burst >= 0.0,
        "a grant of {} units/s, burst {}",
        fields.rate,
        fields.burst
    );
    fields
}

/// Starts each quota window due at `wall_ms` ([`Controller::refresh_budget_periods`]).
fn refresh_budget_periods(
    engine: &parking_lot::Mutex<Engine>,
    store: &Shared,
    wall_ms: u64,
) -> Result<(), StoreError> {
    roll_short_windows(&mut engine.lock(), wall_ms);
    let due = engine.lock().budget_periods_due(wall_ms);
    if due.is_empty() {
        return Ok(());
    }
    let starts: Vec<(GroupName, u64)> = due.iter().map(|(g, _, start)| (g.clone(), *start)).collect();
    let before = store.lock().consumed_before(&starts)?;
    let mut engine = engine.lock();
    for ((group, window, start), consumed) in due.into_iter().zip(before) {
        engine.set_budget_baseline(group, window, start, consumed.unwrap_or(0.0));
    }
    Ok(())
}

/// Starts the minute and hour windows due at `wall_ms` ([`Controller::roll_short_windows`]).
fn roll_short_windows(engine: &mut Engine, wall_ms: u64) {
    if engine.has_quotas() {
        engine.roll_windows(wall_ms, tollgate_model::settings::BudgetPeriod::Day);
    }
}

/// The groups whose clients may hold grants from before a start: those with a usage record
/// of the last lease and a flush interval (at most a minute, rounded to whole minutes). A
/// store that cannot say makes every group learnt.
fn recent_groups(store: &Shared, settings: &EngineSettings, wall_ms: u64) -> Relearn {
    let since = crate::store::recent_since(wall_ms, settings.lease);
    match store.lock().recent_groups(since, settings.max_tracked_groups) {
        Ok(groups) => Relearn::Groups(groups),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read which groups had traffic lately: every group is learnt for a lease");
            Relearn::All
        }
    }
}

#[cfg(test)]
mod tests;
