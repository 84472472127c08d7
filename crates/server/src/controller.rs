//! The controller: the engine behind the contract, with durable settings.
//!
//! Exchanges and backend reports are checked against the contract's bounds, then fed to the
//! [`Engine`] under one short lock; the answer is each client's grant by the engine's grant
//! policy. Admin changes are written to the store, durably, before the engine sees them; one
//! admin change runs at a time. Consumption and resumable ramps are written to the store by
//! [`Controller::flush`]. Views for status pages and metrics are built once per tick, in time
//! linear in the groups, and sorted outside the lock, so a scrape never holds exchanges up.
//! A tick holds the lock for one slice of groups at a time ([`Controller::tick`]), so an
//! exchange never waits for a whole tick either.
//!
//! Nothing here does I/O but the store, and nothing reads a clock to decide: time comes in as
//! [`Nanos`] and Unix milliseconds, so the simulator drives this same code in virtual time.
//! (How long a tick's slice held the lock is timed, to size the next slice; no grant depends
//! on it.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::allocate::AllocationMode;
use tollgate_model::engine::{
    BackendReport, Diagnostics, Engine, EngineSettings, GroupView, Relearn, TICK_SLICE_GROUPS, TraceEvent,
    next_slice,
};
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::Nanos;
use tollgate_proto::check::{self, FieldError, REPORT_VALUE_MAX};
use tollgate_proto::v1;
use tollgate_proto::wire::{ExchangeView, GrantFields, ReportView};
use tonic::Status;

use crate::convert;
use crate::error::AdminError;
use crate::observe::trace::Tracer;
use crate::store::{
    AuditRecord, NodeChange, SettingsStore, Shared, StoreError, Stored, StoredNode, StoredRamp, audited,
};

fn check_capacity(capacity: Option<f64>) -> Result<(), AdminError> {
    match capacity {
        Some(c) if !(c.is_finite() && c > 0.0 && c <= REPORT_VALUE_MAX) => Err(AdminError::invalid(
            "capacity",
            format!("must be a finite number above 0 and at most {REPORT_VALUE_MAX:e}, got {c}"),
        )),
        _ => Ok(()),
    }
}

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

/// A group's settings as the audit log shows them.
fn group_json(s: &GroupSettings) -> String {
    crate::front::json::group_settings(&convert::settings_to_proto(s)).to_string()
}

/// Gives the engine the node settings.
fn apply_node(engine: &mut Engine, node: StoredNode) {
    engine.set_capacity(node.capacity);
    engine.set_mode(node.mode);
    engine.set_slow_start(node.slow_start);
    engine.set_shadow(node.shadow);
    engine.set_throttling(node.throttling);
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

/// The node settings as the audit log shows them.
fn node_json(n: &StoredNode) -> String {
    serde_json::json!({
        "capacity": n.capacity,
        "mode": if n.mode == AllocationMode::Fcfs { "fcfs" } else { "share" },
        "slow_start": n.slow_start,
        "shadow": n.shadow,
        "throttling": if n.throttling { "on" } else { "off" },
    })
    .to_string()
}

/// The controller: the engine behind the contract, with durable settings.
///
/// Exchanges and backend reports are checked against the contract's bounds, then fed to the
/// [`Engine`] under one short lock; the answer is each client's grant by the engine's grant
/// policy. Admin changes are written to the store, durably, before the engine sees them; one
/// admin change runs at a time. Consumption and resumable ramps are written to the store by
/// [`flush`](Self::flush). Views for status pages and metrics are built once per tick, in time
/// linear in the groups, and sorted outside the lock, so a scrape never holds exchanges up.
/// A tick holds the lock for one slice of groups at a time ([`tick`](Self::tick)), so an
/// exchange never waits for a whole tick either.
///
/// Nothing here does I/O but the store, and nothing reads a clock to decide: time comes in as
/// [`Nanos`] and Unix milliseconds, so the simulator drives this same code in virtual time.
/// (How long a tick's slice held the lock is timed, to size the next slice; no grant depends
/// on it.)
pub struct Controller {
    engine: parking_lot::Mutex<Engine>,
    store: Shared,
    exchanges: AtomicU64,
    /// Writes to the gRPC connections' sockets, counted by the listener.
    grpc_writes: Arc<AtomicU64>,
    /// How long the last tick took from its start to its last slice, in nanoseconds (paced,
    /// the server's spans a good part of a second at many groups).
    tick_span_ns: AtomicU64,
    /// Woken when a backend's report shows it newly saturated
    /// ([`Engine::saturation_onset`](tollgate_model::engine::Engine::saturation_onset)).
    onset: tokio::sync::Notify,
    /// In a region: a client named a group the global tier has granted nothing yet.
    share_wanted: tokio::sync::Notify,
    /// Ticks run before their turn for such a report.
    early_ticks: AtomicU64,
    /// Flushes of consumption to the store that failed (the consumption is kept for the next).
    flush_failures: AtomicU64,
    /// A tick was run before its turn since the last regular one.
    early_used: AtomicBool,
    /// A share from the global tier moved since the last tick began (a regional controller):
    /// the next tick is run at once, so the region's grants follow it without waiting a tick.
    upstream_moved: AtomicBool,
    /// The settings' warnings last logged: a change logs only the new ones.
    warned: Mutex<Vec<String>>,
    /// The cost model clients price with, as the operator says it: what a unit counts.
    cost_model: std::sync::OnceLock<tollgate_model::cost::CostModel>,
    /// When the last tick at its turn began (nanoseconds; `u64::MAX`: none yet): exchanges
    /// tell refused clients when the next one is done.
    turn_ns: AtomicU64,
    /// The sorted view of the last tick, and the tick it was built at.
    view: Mutex<Option<(u64, Arc<Vec<GroupView>>)>>,
    /// Backends and clients as of a tick, made at most once per tick like the view.
    diagnostics: Mutex<Option<(u64, Arc<Diagnostics>)>>,
    /// Who follows the trace, and whether events are kept.
    tracer: Arc<Tracer>,
    /// The settings' version: bumped by every change, watched by backends.
    settings_version: tokio::sync::watch::Sender<u64>,
    /// With groups sharded over controllers: the configured capacity while a part of it is in
    /// force, and how many owners share it.
    capacity_share: Mutex<CapacityShare>,
}

/// How this controller's part of the node's capacity stands, with the groups sharded over
/// controllers ([`Controller::set_capacity_part`], [`Controller::share_capacity_among`]).
#[derive(Debug, Clone, Copy, Default)]
struct CapacityShare {
    /// While a part is in force (the engine shares the part): the configured capacity.
    configured: Option<Option<f64>>,
    /// While the groups are sharded: how many owners share the capacity.
    owners: Option<usize>,
}

impl CapacityShare {
    /// The capacity the engine shares when `capacity` is configured, with `part` the one it
    /// shares now: a part in force is scaled with the configured capacity, and a capacity new
    /// to sharded groups starts at an even share, so that the owners' parts never add up to
    /// more than the capacity while they wait for their next split.
    fn in_force(&mut self, capacity: Option<f64>, part: Option<f64>) -> Option<f64> {
        let Some(new) = capacity else {
            self.configured = None;
            return None;
        };
        let owners = self.owners.unwrap_or(1).max(1) as f64;
        let scaled = match (self.configured, part) {
            (Some(Some(old)), Some(part)) if old > 0.0 => (part * new / old).min(new),
            _ if self.owners.is_some() => new / owners,
            _ => return Some(new),
        };
        self.configured = Some(Some(new));
        Some(scaled)
    }
}

/// The most groups a regional controller leases from the global tier.
pub const UPSTREAM_GROUPS_MAX: usize = 100_000;

/// The most backends and the most clients that status pages, the dashboard and metric labels
/// name one by one; the rest are counted (clients: lapsed ones first, then the largest
/// grants; backends: the most utilised).
pub const DIAGNOSTICS_SHOWN_MAX: usize = 100;

/// The most backends watching the group settings at once.
pub const SETTINGS_WATCHERS_MAX: usize = 1024;

/// The time now, to size a tick's slices by ([`next_slice`]; decisions never read it).
fn slice_clock() -> std::time::Instant {
    #[allow(clippy::disallowed_methods)] // how long a slice held the lock, not what it decided
    std::time::Instant::now()
}

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
            exchanges: AtomicU64::new(0),
            grpc_writes: Arc::default(),
            tick_span_ns: AtomicU64::new(0),
            onset: tokio::sync::Notify::new(),
            share_wanted: tokio::sync::Notify::new(),
            early_ticks: AtomicU64::new(0),
            flush_failures: AtomicU64::new(0),
            early_used: AtomicBool::new(false),
            upstream_moved: AtomicBool::new(false),
            warned: Mutex::new(Vec::new()),
            cost_model: std::sync::OnceLock::new(),
            turn_ns: AtomicU64::new(u64::MAX),
            view: Mutex::new(None),
            diagnostics: Mutex::new(None),
            tracer,
            // Unique across restarts: the start's wall time, then one more per change. Backends
            // only compare versions for equality.
            settings_version: tokio::sync::watch::channel(wall_ms.max(1).saturating_mul(1_000_000)).0,
            capacity_share: Mutex::new(CapacityShare::default()),
        };
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
        self.roll_short_windows(wall_ms);
        let due = self.engine().budget_periods_due(wall_ms);
        for (group, window, start) in due {
            let records = self.store().usage(Some(&group), start, 1)?;
            let baseline =
                records.first().filter(|r| r.minute_unix_ms < start).map_or(0.0, |r| r.meter.consumed);
            self.engine().set_budget_baseline(group, window, start, baseline);
        }
        Ok(())
    }

    /// Starts the minute and hour windows due at `wall_ms` from the engine's metering: after
    /// every tick, so that a minute's quota starts afresh within a tick of the minute.
    pub fn roll_short_windows(&self, wall_ms: u64) {
        let mut engine = self.engine();
        if engine.has_quotas() {
            engine.roll_windows(wall_ms, tollgate_model::settings::BudgetPeriod::Day);
        }
    }

    fn engine(&self) -> parking_lot::MutexGuard<'_, Engine> {
        // The engine is plain data, consistent at every step that can panic (and this lock
        // is not poisoned by a panic).
        self.engine.lock()
    }

    fn store(&self) -> crate::store::StoreGuard<'_> {
        self.store.lock()
    }

    /// Runs `f` on the engine (for the simulator's and tests' reading).
    pub fn with_engine<R>(&self, f: impl FnOnce(&Engine) -> R) -> R {
        f(&self.engine())
    }

    /// The tick period: how often [`tick`](Self::tick) should run.
    pub fn tick_period(&self) -> Duration {
        self.engine().settings().tick
    }

    /// Runs one engine tick at `now`. The view of the previous tick is dropped with it, so
    /// that it holds no memory for groups that have since expired.
    ///
    /// The tick walks the groups in slices of about
    /// [`TICK_SLICE_TARGET`](tollgate_model::engine::TICK_SLICE_TARGET) each, and between
    /// two slices hands the engine to any exchange waiting for it (answered with the grants
    /// made so far): at 100,000 groups a whole tick holds the engine for tens of
    /// milliseconds, a slice for a twentieth of one. This blocks: call it where blocking is
    /// allowed.
    ///
    /// While someone follows the trace, each group's rate computation (and every backend's
    /// busy groups) goes to them as JSON lines.
    pub fn tick(&self, now: Nanos) {
        self.tick_paced(now, || {});
    }

    /// Records how long the last tick took from its start to its end, for the exchanges'
    /// answers: a client refused now is told to come back once the next tick is done, not
    /// as soon as it starts.
    pub fn set_tick_span(&self, span: Duration) {
        self.tick_span_ns.store(u64::try_from(span.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// [`tick`](Self::tick), calling `pause` between two slices with the engine unlocked.
    /// The server sleeps there (its tick pacer), so that a tick of
    /// many groups takes a share of a core for a while rather than a whole core at once, and
    /// the exchanges answered meanwhile do not queue behind it for a core. Pausing changes
    /// when the tick completes, not what it decides.
    pub fn tick_paced(&self, now: Nanos, pause: impl FnMut()) {
        self.run_tick(now, false, pause);
    }

    /// [`tick_paced`](Self::tick_paced) before the tick's turn, for a backend newly saturated
    /// ([`take_early_tick`](Self::take_early_tick)): counted, and the regular ticks keep
    /// their times, so clients refused meanwhile are still told to come back after the next
    /// regular one.
    pub fn tick_early_paced(&self, now: Nanos, pause: impl FnMut()) {
        self.run_tick(now, true, pause);
        // Counted once done: whoever sees the count sees the tick's results.
        self.early_ticks.fetch_add(1, Ordering::Release);
    }

    fn run_tick(&self, now: Nanos, early: bool, mut pause: impl FnMut()) {
        let wanted = self.tracer.wanted();
        let mut engine = self.engine();
        engine.set_tracing(wanted.any());
        engine.begin_tick(now);
        if !early {
            self.turn_ns.store(now.0, Ordering::Relaxed);
            self.early_used.store(false, Ordering::Release);
        }
        let mut size = TICK_SLICE_GROUPS;
        loop {
            let started = slice_clock();
            if engine.tick_slice(size) {
                break;
            }
            size = next_slice(size, started.elapsed());
            // The capacity's sharing reads every group at once (milliseconds at 100,000):
            // computed with the engine unlocked, so that exchanges go on meanwhile.
            if let Some(work) = engine.shares_work() {
                let shares = parking_lot::MutexGuard::unlocked_fair(&mut engine, || work.compute());
                engine.put_shares(shares);
                continue;
            }
            // Unlocked to the thread waiting longest, if any (the lock is not fair otherwise:
            // this thread would take it straight back).
            parking_lot::MutexGuard::unlocked_fair(&mut engine, &mut pause);
        }
        let taken = wanted.sent().then(|| engine.take_trace());
        drop(engine);
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if let Some((events, dropped)) = taken {
            self.tracer.publish(&events, dropped);
        }
    }

    /// Keeps every tick's trace events for [`take_trace`](Self::take_trace) (or stops).
    pub fn set_tracing(&self, on: bool) {
        self.tracer.keep(on);
        self.engine().set_tracing(on);
    }

    /// The trace events kept since the last take, and how many were dropped for want of room.
    pub fn take_trace(&self) -> (Vec<TraceEvent>, u64) {
        self.engine().take_trace()
    }

    /// Makes this a regional controller's engine: each group's rate comes from the global
    /// tier ([`Engine::set_upstream_mode`]).
    pub fn set_regional(&self) {
        self.engine().set_upstream_mode(true);
    }

    /// Every group this regional controller's clients use, as the global tier is told it
    /// ([`Engine::upstream_usage`]).
    pub fn upstream_usage(&self) -> Vec<tollgate_model::engine::UpstreamUsage> {
        self.engine().upstream_usage(UPSTREAM_GROUPS_MAX)
    }

    /// Takes shares granted by the global tier ([`Engine::set_upstream`]); when one moved, the
    /// next tick runs at once ([`take_early_tick`](Self::take_early_tick)).
    pub fn set_upstream(
        &self,
        grants: impl IntoIterator<Item = (GroupName, tollgate_model::engine::UpstreamGrant)>,
    ) {
        let mut engine = self.engine();
        let mut moved = false;
        for (name, grant) in grants {
            moved |= engine.set_upstream(name, grant);
        }
        drop(engine);
        if moved {
            self.upstream_moved.store(true, Ordering::Release);
            self.onset.notify_one();
        }
    }

    /// Resolves once a client of this regional controller names a group the global tier has
    /// granted nothing yet: the region's lease asks for its share at once.
    pub async fn share_wanted(&self) {
        self.share_wanted.notified().await;
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
        let span = Duration::from_nanos(self.tick_span_ns.load(Ordering::Relaxed));
        let turn = Some(self.turn_ns.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX);
        let mut next_tick = match turn {
            Some(t) if !engine.ticking() => Nanos(t).after(tick.saturating_add(span)).since(now),
            _ => Duration::ZERO,
        };
        if awaiting.contains(&true) {
            next_tick = next_tick.min(AWAITING_SHARE);
            self.share_wanted.notify_one();
        }
        drop(engine);
        self.exchanges.fetch_add(1, Ordering::Relaxed);
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
        let check::CheckedReport { health, loads, rejected } = check::backend_report(r).map_err(invalid)?;
        if let Some(first) = rejected.first() {
            tracing::warn!(backend = %r.backend_id, rejected = rejected.len(), %first, "backend report: loads left out");
        }
        // Made ready before the engine is locked, and what it replaces dropped after: a report
        // of 10,000 loads would hold up every exchange meanwhile.
        let report = BackendReport::new(r.zone, health, loads);
        let (replaced, onset) = {
            let mut engine = self.engine();
            let replaced = engine
                .put_backend_report(now, r.backend_id, report)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            (replaced, engine.saturation_onset())
        };
        drop(replaced);
        if onset {
            self.onset.notify_one();
        }
        Ok(v1::ReportAck { rejected })
    }

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
        let (meters, usage_only, ramps, scope) = {
            let mut engine = self.engine();
            engine.set_wall_clock(now, wall_ms);
            // A region's consumption reaches the global tier in its exchanges, and is written
            // there: nothing to write here.
            if engine.is_regional() {
                drop(engine.take_dirty_meters());
                return Ok(());
            }
            // Every group in traffic is metered; the running totals of configured groups alone
            // are kept (restored at start, budgeted on), the others' only as usage records.
            let (meters, usage_only): (Vec<_>, Vec<_>) =
                engine.take_dirty_meters().into_iter().partition(|(n, _)| engine.group(n).is_some());
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
            (meters, usage_only, ramps, scope)
        };
        let minute = crate::store::minute_of(wall_ms);
        let result = {
            let mut store = self.store();
            match &scope {
                None => store.put_meters(&meters, &ramps, minute),
                Some(scope) => store.put_meters_of(&meters, &ramps, minute, scope),
            }
            .and_then(|()| store.put_usage(&usage_only, minute))
        };
        if result.is_err() {
            self.flush_failures.fetch_add(1, Ordering::Relaxed);
            // Not written: keep them to write next time.
            self.engine().mark_dirty(meters.iter().chain(&usage_only).map(|(n, _)| n));
        }
        result?;
        self.refresh_budget_periods(wall_ms)
    }

    fn changed(&self) {
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.settings_version.send_modify(|v| *v = v.wrapping_add(1).max(1));
        self.log_warnings();
    }

    /// The settings that are allowed but probably not meant (reservations past the capacity,
    /// a limit above it, a priority or weight in `fcfs` mode), in words for people.
    pub fn warnings(&self) -> Vec<String> {
        self.engine().warnings()
    }

    /// Logs each warning the settings hold that was not logged since it last held: once at
    /// start, then as changes bring new ones.
    pub fn log_warnings(&self) {
        let now = self.warnings();
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        for w in now.iter().filter(|w| !warned.contains(w)) {
            tracing::warn!("{w}");
        }
        *warned = now;
    }

    /// Says which cost model the clients price requests with (`--cost-model`, or the
    /// `[cost]` of `--config`): status shows what a unit counts. Set once; later calls are
    /// ignored.
    pub fn set_cost_model(&self, model: tollgate_model::cost::CostModel) {
        let _ = self.cost_model.set(model);
    }

    /// The cost model the clients price with (the `count` model unless said otherwise).
    pub fn cost_model(&self) -> &tollgate_model::cost::CostModel {
        self.cost_model.get().unwrap_or(&tollgate_model::cost::CostModel::Count)
    }

    /// The group settings backends schedule by: the version, then every group (or nothing
    /// but the version, `unchanged`, when the backend's `known` version is current).
    pub fn backend_settings(&self, known: u64) -> v1::BackendSettings {
        // The version first: groups read after it are at least as new, so a backend never
        // holds older settings under a current version.
        let version = *self.settings_version.borrow();
        if known == version {
            return v1::BackendSettings { version, unchanged: true, groups: Vec::new() };
        }
        let groups = self
            .engine()
            .groups()
            .into_iter()
            .map(|(n, s)| v1::GroupInfo {
                name: n.to_string(),
                settings: Some(convert::settings_to_proto(s)),
            })
            .collect();
        v1::BackendSettings { version, unchanged: false, groups }
    }

    /// Follows the settings' version (for backends watching them); `None` when
    /// [`SETTINGS_WATCHERS_MAX`] already do.
    pub fn watch_settings(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        (self.settings_version.receiver_count() < SETTINGS_WATCHERS_MAX)
            .then(|| self.settings_version.subscribe())
    }

    /// Creates or alters a group at Unix time `wall_ms` (where its quota windows start); only
    /// the fields the patch sets change. Durable before it returns.
    pub fn put_group(
        &self,
        name: GroupName,
        patch: &v1::GroupPatch,
        mode: PutMode,
        who: &str,
        wall_ms: u64,
    ) -> Result<GroupSettings, AdminError> {
        let mut store = self.store();
        let current = self.engine().group(&name).cloned();
        match (mode, &current) {
            (PutMode::Create, Some(_)) => return Err(AdminError::AlreadyExists(name.to_string())),
            (PutMode::Alter, None) => return Err(AdminError::NotFound(name.to_string())),
            _ => {}
        }
        let settings =
            convert::apply_patch(current.clone().unwrap_or_default(), patch).map_err(AdminError::Invalid)?;
        self.check_pattern(&name, &settings)?;
        self.check_nesting(&name, Some(&settings))?;
        audited(
            &mut store,
            who,
            format!("group.put {name}"),
            current.as_ref().map(group_json),
            Some(group_json(&settings)),
        )
        .put_group(&name, &settings)?;
        self.engine().set_group(name.clone(), settings.clone());
        drop(store);
        self.changed();
        refresh_after_change(self, wall_ms);
        Ok(settings)
    }

    /// Sets a group's whole settings at Unix time `wall_ms`. Durable before it returns.
    pub fn set_group(
        &self,
        name: GroupName,
        settings: GroupSettings,
        who: &str,
        wall_ms: u64,
    ) -> Result<(), AdminError> {
        self.check_pattern(&name, &settings)?;
        self.check_nesting(&name, Some(&settings))?;
        let mut store = self.store();
        let before = self.engine().group(&name).map(group_json);
        audited(&mut store, who, format!("group.put {name}"), before, Some(group_json(&settings)))
            .put_group(&name, &settings)?;
        self.engine().set_group(name.clone(), settings.clone());
        drop(store);
        self.changed();
        refresh_after_change(self, wall_ms);
        Ok(())
    }

    /// A pattern's rules: no reservation, and at most
    /// [`PATTERNS_MAX`](tollgate_model::settings::PATTERNS_MAX) of them.
    fn check_pattern(&self, name: &GroupName, settings: &GroupSettings) -> Result<(), AdminError> {
        use tollgate_model::settings::{PATTERNS_MAX, check_pattern, is_pattern};
        check_pattern(name.as_str(), settings).map_err(|e| AdminError::invalid(&e.field, e.rule))?;
        let engine = self.engine();
        if is_pattern(name.as_str())
            && engine.group(name).is_none()
            && engine.groups().iter().filter(|(n, _)| is_pattern(n.as_str())).count() >= PATTERNS_MAX
        {
            return Err(AdminError::invalid(
                "name",
                format!("at most {PATTERNS_MAX} patterns (names with *)"),
            ));
        }
        Ok(())
    }

    /// The nesting rules ([`tollgate_model::hierarchy::check`]) with `name` set to `settings`
    /// (`None`: dropped): only what the change breaks is refused, by the field that breaks it.
    fn check_nesting(&self, name: &GroupName, settings: Option<&GroupSettings>) -> Result<(), AdminError> {
        let engine = self.engine();
        let groups = engine.groups();
        let child = groups.iter().find(|(_, s)| s.parent() == Some(name)).map(|(n, _)| *n);
        let Some(settings) = settings else {
            return match child {
                Some(child) => Err(AdminError::invalid(
                    "name",
                    format!(
                        "{name} is the parent of {child}: give its children another parent, or none, first"
                    ),
                )),
                None => Ok(()),
            };
        };
        if settings.parent().is_none() && child.is_none() {
            return Ok(());
        }
        let all = groups.iter().filter(|(n, _)| *n != name).copied().chain(std::iter::once((name, settings)));
        let errors = tollgate_model::hierarchy::check(all);
        let touched = |g: &GroupName| g == name || settings.parent() == Some(g);
        match errors.iter().find(|e| touched(&e.group)) {
            Some(e) if &e.group == name => Err(AdminError::invalid(&e.error.field, e.error.rule.clone())),
            Some(e) => Err(AdminError::invalid("reserved", format!("parent {}: {}", e.group, e.error.rule))),
            None => Ok(()),
        }
    }

    /// Drops a group; says whether it existed. Durable before it returns.
    pub fn drop_group(&self, name: &GroupName, who: &str) -> Result<bool, AdminError> {
        self.check_nesting(name, None)?;
        let mut store = self.store();
        let before = self.engine().group(name).map(group_json);
        // Recorded only if the group was there: a drop of nothing writes nothing.
        let existed =
            audited(&mut store, who, format!("group.drop {name}"), before, None).drop_group(name)?;
        self.engine().remove_group(name);
        drop(store);
        self.changed();
        Ok(existed)
    }

    /// Usage records: per group, its consumption minute by minute from `since_unix_ms` (and
    /// the last record before, to measure from). What is not flushed yet is not in them.
    pub fn usage(
        &self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<crate::store::UsageRecord>, StoreError> {
        self.store().usage(group, since_unix_ms, limit)
    }

    /// The audit log: changes made at or after `since_unix_ms`, oldest first, at most `limit`.
    pub fn audit_log(&self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        self.store().audit(since_unix_ms, limit)
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

    /// Takes a group's settings as another controller stored them (seen through the shared
    /// store's watch): the engine follows, nothing is written back. `None`: the group was
    /// dropped. Says whether anything changed.
    pub fn sync_group(&self, name: GroupName, settings: Option<GroupSettings>, wall_ms: u64) -> bool {
        let mut engine = self.engine();
        if engine.group(&name) == settings.as_ref() {
            return false;
        }
        match settings {
            Some(s) => engine.set_group(name, s),
            None => drop(engine.remove_group(&name)),
        }
        drop(engine);
        self.changed();
        refresh_after_change(self, wall_ms);
        true
    }

    /// Puts the node settings in force: a capacity that changes while groups are sharded
    /// scales the part in force, or starts at an even share ([`CapacityShare::in_force`]),
    /// until the next part is set.
    fn apply_node(&self, mut node: StoredNode) {
        let mut share = self.capacity_share.lock().unwrap_or_else(PoisonError::into_inner);
        let mut engine = self.engine();
        node.capacity = share.in_force(node.capacity, engine.settings().capacity);
        apply_node(&mut engine, node);
    }

    /// With groups sharded over controllers: shares `part` of the node's capacity among this
    /// controller's groups instead of all of it ([`tollgate_model::shard::split_capacity`]);
    /// `None` shares the configured capacity again, as a controller whose groups are not
    /// sharded does. [`node`](Self::node) still says the configured capacity. Ignored while no
    /// capacity is configured.
    pub fn set_capacity_part(&self, part: Option<f64>) {
        let mut share = self.capacity_share.lock().unwrap_or_else(PoisonError::into_inner);
        let mut engine = self.engine();
        let whole = *share.configured.get_or_insert(engine.settings().capacity);
        match (whole, part) {
            (Some(_), Some(p)) => engine.set_capacity(Some(p)),
            _ => {
                engine.set_capacity(whole);
                share.configured = None;
                share.owners = None;
            }
        }
    }

    /// With groups sharded over `owners` controllers: a capacity configured where none was,
    /// before the next split, starts at an even share of it, not the whole.
    pub fn share_capacity_among(&self, owners: usize) {
        let mut share = self.capacity_share.lock().unwrap_or_else(PoisonError::into_inner);
        share.owners = Some(owners.max(1));
    }

    /// What this controller's groups claim of the node's capacity, per priority
    /// ([`Engine::capacity_claims`]), for the split among owners.
    pub fn capacity_claims(&self) -> Vec<tollgate_model::allocate::Claim> {
        self.engine().capacity_claims()
    }

    /// Forgets the groups that `gone`, given a group and its tree's root, says are no longer
    /// this controller's (their shard moved away); see [`Engine::forget_groups`]. Returns how
    /// many.
    pub fn forget_groups(&self, now: Nanos, gone: impl Fn(&GroupName, &GroupName) -> bool) -> usize {
        self.engine().forget_groups(now, gone)
    }

    /// Takes the stored consumption of each of `meters` whose tree's root `mine` says this
    /// controller has just been given (as at start: configured groups' and those a pattern's
    /// or the default's quotas count), so that it counts on from what their last owner wrote.
    /// Meters only grow: each count is the larger of the stored one and this controller's own
    /// (which is the newer when the group never left it). Returns how many were taken.
    pub fn restore_meters(
        &self,
        meters: Vec<(GroupName, tollgate_model::engine::Meter)>,
        mine: impl Fn(&GroupName) -> bool,
    ) -> usize {
        let mut engine = self.engine();
        let mut taken = 0;
        for (name, stored) in meters {
            if !mine(engine.root_of(&name)) || !(engine.group(&name).is_some() || engine.counts_quotas(&name))
            {
                continue;
            }
            let own = engine.meter(&name).unwrap_or_default();
            let merged = tollgate_model::engine::Meter {
                consumed: own.consumed.max(stored.consumed),
                admitted: own.admitted.max(stored.admitted),
                throttled: own.throttled.max(stored.throttled),
                waited: own.waited.max(stored.waited),
                would_refuse: own.would_refuse.max(stored.would_refuse),
            };
            engine.restore_meter(name, merged);
            taken += 1;
        }
        taken
    }

    /// Lets each of the stored `ramps` whose tree's root `mine` says this controller has just
    /// been given resume where its last owner left it, at `now` (`wall_ms` the Unix time in
    /// milliseconds), as at start: a group's next report picks its ramp up there instead of at
    /// its minimum. A ramp past its resume TTL is left out, and so is a group this controller
    /// computes now (its own ramp is the newer). Returns how many were taken.
    pub fn resume_ramps(
        &self,
        now: Nanos,
        wall_ms: u64,
        ramps: Vec<(GroupName, StoredRamp)>,
        mine: impl Fn(&GroupName) -> bool,
    ) -> usize {
        let mut engine = self.engine();
        let mut taken = 0;
        for (name, ramp) in ramps {
            if mine(engine.root_of(&name)) && !engine.tracks(&name) {
                taken += usize::from(resume_stored_ramp(&mut engine, now, wall_ms, name, ramp));
            }
        }
        taken
    }

    /// The shard of each of `groups` among `shards`, by the root of its tree
    /// ([`Engine::root_of`]), all under one lock; `None` for a name that is not a group's.
    pub fn shards_of<'a>(&self, groups: impl Iterator<Item = &'a str>, shards: u16) -> Vec<Option<u16>> {
        let engine = self.engine();
        groups
            .map(|g| {
                let name = GroupName::new(g).ok()?;
                Some(tollgate_model::shard::shard_of(engine.root_of(&name).as_str(), shards))
            })
            .collect()
    }

    /// Takes the node settings as another controller stored them; nothing is written back.
    pub fn sync_node(&self, node: StoredNode) -> bool {
        if self.node() == node {
            return false;
        }
        self.apply_node(node);
        self.changed();
        true
    }

    /// Sets the node capacity (`None`: no capacity). Durable before it returns.
    pub fn set_capacity(&self, capacity: Option<f64>, who: &str) -> Result<StoredNode, AdminError> {
        check_capacity(capacity)?;
        self.set_node(who, |n| n.capacity = capacity)
    }

    /// Turns slow start on or off. Durable before it returns.
    pub fn set_slow_start(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.slow_start = on)
    }

    /// Puts every group in shadow mode, or takes the node out of it. Durable and audited
    /// before it returns; clients take it up at their next exchange.
    pub fn set_shadow(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.shadow = on)
    }

    /// The one switch: throttling on or off for the whole node, every setting kept. Durable
    /// and audited before it returns; clients take it up at their next exchange.
    pub fn set_throttling(&self, on: bool, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.throttling = on)
    }

    /// Applies a node properties document's change in one durable write.
    pub fn change_node(&self, change: NodeChange, who: &str) -> Result<StoredNode, AdminError> {
        if let Some(c) = change.capacity {
            check_capacity(c)?;
        }
        self.set_node(who, |n| {
            if let Some(c) = change.capacity {
                n.capacity = c;
            }
            if let Some(m) = change.mode {
                n.mode = m;
            }
            if let Some(on) = change.slow_start {
                n.slow_start = on;
            }
            if let Some(on) = change.shadow {
                n.shadow = on;
            }
            if let Some(on) = change.throttling {
                n.throttling = on;
            }
        })
    }

    /// Sets how free capacity is shared. Durable before it returns.
    pub fn set_mode(&self, mode: AllocationMode, who: &str) -> Result<StoredNode, AdminError> {
        self.set_node(who, |n| n.mode = mode)
    }

    fn set_node(&self, who: &str, change: impl FnOnce(&mut StoredNode)) -> Result<StoredNode, AdminError> {
        let mut store = self.store();
        let before = self.node();
        let mut node = before;
        change(&mut node);
        audited(&mut store, who, "node.set".into(), Some(node_json(&before)), Some(node_json(&node)))
            .set_node(node)?;
        self.apply_node(node);
        drop(store);
        self.changed();
        Ok(node)
    }

    /// The node settings (the configured capacity, whatever part of it this controller
    /// shares out while groups are sharded).
    pub fn node(&self) -> StoredNode {
        let configured = self.capacity_share.lock().unwrap_or_else(PoisonError::into_inner).configured;
        let engine = self.engine();
        let s = engine.settings();
        StoredNode {
            capacity: configured.unwrap_or(s.capacity),
            mode: s.mode,
            slow_start: s.slow_start,
            shadow: s.shadow,
            throttling: s.throttling,
        }
    }

    /// A group's settings.
    pub fn group(&self, name: &GroupName) -> Option<GroupSettings> {
        self.engine().group(name).cloned()
    }

    /// The settings that apply to a group: its own, a pattern's that matches it, or the
    /// `default` group's.
    pub fn settings_for(&self, name: &GroupName) -> Option<GroupSettings> {
        self.engine().settings_for(name).cloned()
    }

    /// Every configured group, by name.
    pub fn groups(&self) -> Vec<(GroupName, GroupSettings)> {
        self.engine().groups().into_iter().map(|(n, s)| (n.clone(), s.clone())).collect()
    }

    /// Completes once a backend's report has shown it newly saturated since the last tick
    /// began (at once if one did since the last call): the server then ticks without waiting
    /// for the tick's turn, at most once between two regular ticks.
    pub async fn saturation_onset(&self) {
        self.onset.notified().await;
    }

    /// Whether to tick now, before the tick's turn: a backend's report has shown it newly
    /// saturated since the last tick began, and no tick has been run early since the last
    /// regular one (so a backend flapping in and out of saturation, or many reporting one
    /// after another, at most doubles the ticks). Says yes once; the caller then runs
    /// [`tick_early_paced`](Self::tick_early_paced).
    pub fn take_early_tick(&self) -> bool {
        let moved = self.upstream_moved.swap(false, Ordering::AcqRel);
        (moved || self.engine().saturation_onset()) && !self.early_used.swap(true, Ordering::AcqRel)
    }

    /// Engine ticks completed since this controller started, early ones included.
    pub fn ticks(&self) -> u64 {
        self.engine().ticks()
    }

    /// Ticks run before their turn, for backends newly saturated.
    pub fn early_ticks(&self) -> u64 {
        self.early_ticks.load(Ordering::Acquire)
    }

    /// Clients seen to restart so far (an exchange numbered below its client's last).
    pub fn client_restarts(&self) -> u64 {
        self.engine().client_restarts()
    }

    /// Exchanges answered so far.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(Ordering::Relaxed)
    }

    /// Writes to the gRPC connections' sockets so far: about one per answer (see
    /// `listen::SliceAnswers`), fewer when answers go out together.
    pub fn grpc_writes(&self) -> u64 {
        self.grpc_writes.load(Ordering::Relaxed)
    }

    /// The counter behind [`grpc_writes`](Self::grpc_writes), for the listener.
    pub(crate) fn grpc_write_counter(&self) -> Arc<AtomicU64> {
        self.grpc_writes.clone()
    }

    /// Every group configured or seen in traffic, by name, as of the last tick. Built at most
    /// once per tick (and after each admin change), in time linear in the groups, and sorted
    /// outside the engine's lock.
    pub fn view(&self) -> Arc<Vec<GroupView>> {
        /// Groups viewed in one hold of the engine.
        const VIEW_PART: usize = 1024;
        let ticks = self.engine().ticks();
        let mut cache = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, view)) = cache.as_ref()
            && *at == ticks
        {
            return view.clone();
        }
        // A part at a time: at 100,000 groups the whole view held the engine (and every
        // exchange waiting on it) for tens of milliseconds.
        let mut view = Vec::new();
        let mut at = Some(0);
        while let Some(start) = at {
            let (part, next) = self.engine().view_part(start, VIEW_PART);
            view.extend(part);
            at = next;
        }
        view.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let view = Arc::new(view);
        *cache = Some((ticks, view.clone()));
        view
    }

    /// Backends and clients, at most [`DIAGNOSTICS_SHOWN_MAX`] of each named, as of the last
    /// tick (made at most once per tick).
    pub fn diagnostics(&self, now: Nanos) -> Arc<Diagnostics> {
        let ticks = self.engine().ticks();
        let mut cache = self.diagnostics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, d)) = cache.as_ref()
            && *at == ticks
        {
            return d.clone();
        }
        let (d, ticks) = {
            let engine = self.engine();
            (engine.diagnostics(now, DIAGNOSTICS_SHOWN_MAX), engine.ticks())
        };
        let d = Arc::new(d);
        *cache = Some((ticks, d.clone()));
        d
    }

    /// What is wrong with the store, while it cannot take writes.
    pub fn store_health(&self) -> Option<String> {
        self.store.health()
    }

    /// Flushes of consumption to the store that failed ([`flush`](Self::flush)).
    pub fn flush_failures(&self) -> u64 {
        self.flush_failures.load(Ordering::Relaxed)
    }

    /// How long the engine's learning lease has left ([`Engine::learning_left`]).
    pub fn learning_left(&self, now: Nanos) -> Option<Duration> {
        self.engine().learning_left(now)
    }

    /// What the engine tracks now: (clients, backends, learning).
    pub fn tracking(&self, now: Nanos) -> (usize, usize, bool) {
        let engine = self.engine();
        (engine.clients(), engine.backends(), engine.learning(now))
    }
}

/// Starts the quota windows a settings change at `wall_ms` made due; one that cannot is
/// logged and left to the next flush.
fn refresh_after_change(c: &Controller, wall_ms: u64) {
    if let Err(e) = c.refresh_budget_periods(wall_ms) {
        tracing::warn!(error = %e, "budget periods not refreshed; the next flush tries again");
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
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn controller() -> Controller {
        Controller::new(Box::new(MemoryStore::default()), EngineSettings::default(), Nanos::ZERO, 0).unwrap()
    }

    /// A client reports the group, and a tick sees it.
    fn track(c: &Controller, g: &GroupName) {
        let usage = v1::GroupUsage { group: g.to_string(), demand: 10.0, ..v1::GroupUsage::default() };
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![usage],
            ..Default::default()
        };
        c.exchange(Nanos::ZERO, &req).unwrap();
        c.tick(Nanos::ZERO.after(Duration::from_secs(1)));
    }

    #[test]
    fn a_capacity_changed_while_sharded_never_puts_more_than_a_part_in_force() {
        let c = controller();
        let in_force = |c: &Controller| c.engine().settings().capacity;
        // Sharded over two owners, with no capacity: a capacity configured starts at half.
        c.share_capacity_among(2);
        c.set_capacity(Some(300.0), "test").unwrap();
        assert_eq!(in_force(&c), Some(150.0));
        assert_eq!(c.node().capacity, Some(300.0), "the node says what is configured");
        // A part in force scales with the configured capacity until the next split.
        c.set_capacity_part(Some(100.0));
        c.set_capacity(Some(600.0), "test").unwrap();
        assert_eq!(in_force(&c), Some(200.0));
        c.set_mode(AllocationMode::Fcfs, "test").unwrap();
        assert_eq!(in_force(&c), Some(200.0), "another node setting leaves the part as it is");
        // No capacity, then one again: an even share once more.
        c.set_capacity(None, "test").unwrap();
        assert_eq!((in_force(&c), c.node().capacity), (None, None));
        c.set_capacity(Some(90.0), "test").unwrap();
        assert_eq!(in_force(&c), Some(45.0));
        // Not sharded: the whole of it.
        c.set_capacity_part(None);
        assert_eq!(in_force(&c), Some(90.0));
        c.set_capacity(Some(120.0), "test").unwrap();
        assert_eq!((in_force(&c), c.node().capacity), (Some(120.0), Some(120.0)));
    }

    #[test]
    fn a_budget_per_period_counts_from_the_metering_at_the_periods_start() {
        use tollgate_model::engine::Meter;
        use tollgate_model::settings::BudgetPeriod;
        let day = 86_400_000u64;
        let now = 20_000 * day + 3_600_000; // an hour into a day
        let g = GroupName::new("metered").unwrap();
        let settings = GroupSettings::builder()
            .reserved(1.0)
            .limit(100.0)
            .budget(100.0)
            .budget_period(BudgetPeriod::Day)
            .build()
            .unwrap();
        let meter = |consumed: f64| Meter { consumed, ..Meter::default() };
        let exhausted = |consumed_now: f64| {
            let mut store = MemoryStore::default();
            store.put_group(&g, &settings).unwrap();
            // Yesterday's last record: 500 consumed by then; then today's consumption.
            store.put_meters(&[(g.clone(), meter(500.0))], &[], 20_000 * day - 60_000).unwrap();
            store.put_meters(&[(g.clone(), meter(consumed_now))], &[], 20_000 * day + 60_000).unwrap();
            let c = Controller::new(Box::new(store), EngineSettings::default(), Nanos::ZERO, now).unwrap();
            track(&c, &g);
            let view = c.view();
            view.iter().find(|v| v.name == g).map(|v| v.budget_exhausted).unwrap()
        };
        assert!(!exhausted(550.0), "50 of today's 100 spent");
        assert!(exhausted(650.0), "150 spent today");
        // Over the group's life, the same meter has long spent it.
        let mut store = MemoryStore::default();
        let total = GroupSettings::builder().reserved(1.0).limit(100.0).budget(100.0).build().unwrap();
        store.put_group(&g, &total).unwrap();
        store.put_meters(&[(g.clone(), meter(550.0))], &[], 20_000 * day).unwrap();
        let c = Controller::new(Box::new(store), EngineSettings::default(), Nanos::ZERO, now).unwrap();
        track(&c, &g);
        assert!(c.view().iter().find(|v| v.name == g).unwrap().budget_exhausted);
        // A period without a budget is refused by name.
        let e = GroupSettings::builder().budget_period(BudgetPeriod::Month).build().unwrap_err();
        assert!(e.to_string().contains("budget_period: needs a budget"), "{e}");
    }

    fn load(group: &str, units_per_s: f64) -> v1::GroupLoad {
        v1::GroupLoad { group: group.into(), units_per_s }
    }

    /// Regression: one invalid group name in a backend report made the server reject the whole
    /// report, and said so only at debug level.
    #[test]
    fn a_bad_load_is_left_out_and_named_and_the_rest_are_taken() {
        let c = controller();
        let report = v1::BackendReport {
            backend_id: "b1".into(),
            zone: "z".into(),
            health: Some(v1::backend_report::Health::Utilisation(0.5)),
            loads: vec![load("good", 10.0), load("", 5.0), load("bad\nname", 5.0), load("nan", f64::NAN)],
        };
        let ack = c.backend_report(Nanos::ZERO, &ReportView::of(&report)).unwrap();
        assert_eq!(ack.rejected.len(), 3, "{ack:?}");
        assert!(ack.rejected[0].starts_with("loads[1].group: must not be empty"), "{ack:?}");
        assert!(ack.rejected[2].starts_with("loads[3].units_per_s: must be a finite number"), "{ack:?}");
        assert_eq!(c.tracking(Nanos::ZERO).1, 1, "the backend and its good load were taken");
        // A report without health is refused whole, naming the field.
        let e = c
            .backend_report(Nanos::ZERO, &ReportView::of(&v1::BackendReport { health: None, ..report }))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("health:"), "{e:?}");
    }

    #[test]
    fn exchanges_are_checked_against_the_contract() {
        let c = controller();
        let usage =
            |group: &str, demand: f64| v1::GroupUsage { group: group.into(), demand, ..Default::default() };
        let req =
            |groups| v1::ExchangeRequest { client_id: "c".into(), sequence: 1, groups, ..Default::default() };
        let e = c.exchange(Nanos::ZERO, &req(vec![usage("g", f64::INFINITY)])).unwrap_err();
        assert!(e.message().starts_with("groups[0].demand: must be a finite number"), "{e:?}");
        let e = c.exchange(Nanos::ZERO, &req(vec![usage("g", 1e16)])).unwrap_err();
        assert!(e.message().contains("from 0 to 1e15"), "{e:?}");
        let e = c
            .exchange(Nanos::ZERO, &v1::ExchangeRequest { client_id: String::new(), ..req(vec![]) })
            .unwrap_err();
        assert!(e.message().starts_with("client_id:"), "{e:?}");
        let ok = c.exchange(Nanos::ZERO, &req(vec![usage("g", 1.0)])).unwrap();
        assert!(ok.grants[0].unlimited);
        assert_eq!(c.exchanges(), 1, "refused exchanges are not counted");
    }

    /// A backend newly saturated gets one tick before the tick's turn between two regular
    /// ones, however many report so; refused clients are still told when the next regular
    /// tick is done, not a period after the early one.
    #[test]
    fn a_backend_newly_saturated_gets_one_early_tick_between_two_regular_ones() {
        let c = controller();
        let saturated = |backend: &str, u: f64| v1::BackendReport {
            backend_id: backend.into(),
            zone: "z".into(),
            health: Some(v1::backend_report::Health::Utilisation(u)),
            loads: vec![load("g", 500_000.0)],
        };
        let ms = |n: u64| Nanos(n * 1_000_000);
        c.tick(ms(0));
        assert!(!c.take_early_tick(), "nothing saturated");
        c.backend_report(ms(100), &ReportView::of(&saturated("a", 0.5))).unwrap();
        assert!(!c.take_early_tick(), "not saturated");
        c.backend_report(ms(200), &ReportView::of(&saturated("a", 1.2))).unwrap();
        assert!(c.take_early_tick());
        assert!(!c.take_early_tick(), "said once");
        c.tick_early_paced(ms(200), || {});
        assert_eq!(c.early_ticks(), 1);
        // Another backend newly saturated before the next regular tick waits for it.
        c.backend_report(ms(300), &ReportView::of(&saturated("b", 1.2))).unwrap();
        assert!(!c.take_early_tick(), "one early tick between two regular ones");
        let req = v1::ExchangeRequest { client_id: "c".into(), sequence: 1, ..Default::default() };
        assert_eq!(c.exchange(ms(400), &req).unwrap().next_tick_ms, 600, "the regular tick's time");
        c.tick(ms(1000));
        c.backend_report(ms(1100), &ReportView::of(&saturated("a", 0.5))).unwrap();
        c.backend_report(ms(1200), &ReportView::of(&saturated("a", 1.3))).unwrap();
        assert!(c.take_early_tick(), "a new period, a new onset");
    }

    /// A refused client is told to come back once the next tick is done: its start (a tick
    /// period after the last one started) and as long as the last tick took.
    #[test]
    fn the_next_tick_is_said_to_be_done_as_long_after_its_start_as_the_last_took() {
        let c = controller();
        let req = v1::ExchangeRequest { client_id: "c".into(), sequence: 1, ..Default::default() };
        c.tick(Nanos::ZERO);
        let at = Nanos(300_000_000);
        assert_eq!(c.exchange(at, &req).unwrap().next_tick_ms, 700);
        c.set_tick_span(Duration::from_millis(120));
        assert_eq!(c.exchange(at, &req).unwrap().next_tick_ms, 820);
    }

    /// An exchange answered between a tick's walks holds the grants that tick is replacing:
    /// it is told that the tick is under way (no time to it), not that the next is a period
    /// away, so that its client comes back for the new grants.
    #[test]
    fn an_exchange_answered_while_a_tick_is_under_way_is_told_so() {
        let c = controller();
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![v1::GroupUsage { group: "g".into(), demand: 1.0, ..Default::default() }],
            ..Default::default()
        };
        c.tick(Nanos::ZERO);
        const S: u64 = 1_000_000_000;
        let mut during = Vec::new();
        c.tick_paced(Nanos(S), || during.push(c.exchange(Nanos(S), &req).unwrap().next_tick_ms));
        assert!(!during.is_empty(), "the tick paused at least once");
        assert!(during.iter().all(|&ms| ms == 0), "{during:?}");
        // Once it is done: the next a period after its start.
        assert_eq!(c.exchange(Nanos(S), &req).unwrap().next_tick_ms, 1000);
    }

    /// A paced tick pauses between its slices with the engine free: an exchange made in a
    /// pause is answered, and the tick still completes.
    #[test]
    fn a_paced_tick_pauses_between_slices_with_the_engine_free() {
        let c = controller();
        let groups: Vec<v1::GroupUsage> = (0..2 * TICK_SLICE_GROUPS + 1)
            .map(|i| v1::GroupUsage { group: format!("g{i}"), demand: 1.0, ..Default::default() })
            .collect();
        // Three clients of at most 1000 groups each (an exchange's most).
        for (client, part) in groups.chunks(1000).enumerate() {
            let req = v1::ExchangeRequest {
                client_id: format!("c{client}"),
                sequence: 1,
                groups: part.to_vec(),
                ..Default::default()
            };
            c.exchange(Nanos::ZERO, &req).unwrap();
        }
        let ticks = c.with_engine(Engine::ticks);
        let mut pauses = 0;
        const S: u64 = 1_000_000_000;
        c.tick_paced(Nanos(S), || {
            pauses += 1;
            let req = v1::ExchangeRequest {
                client_id: "f".into(),
                sequence: pauses,
                groups: groups[..1].to_vec(),
                ..Default::default()
            };
            assert_eq!(c.exchange(Nanos(S), &req).unwrap().grants.len(), 1);
        });
        // At least two slices of groups (the first of 256, the next grown by a quarter at
        // most) and a walk that applies them: at least two pauses, however fast the machine.
        assert!(pauses >= 2, "{pauses} pauses");
        assert_eq!(c.with_engine(Engine::ticks), ticks + 1);
    }

    /// TiDB's `target_request_period_ms`: the period a client asks for, kept between the tick
    /// (1 s) and half the lease (10 s).
    #[test]
    fn a_client_gets_the_period_it_asks_for_within_the_tick_and_half_the_lease() {
        let c = controller();
        let period = |asked: u32| {
            let req = v1::ExchangeRequest {
                client_id: "c".into(),
                target_request_period_ms: asked,
                ..Default::default()
            };
            c.exchange(Nanos::ZERO, &req).map(|r| r.next_exchange_ms)
        };
        assert_eq!(period(0).unwrap(), 1000);
        assert_eq!(period(3000).unwrap(), 3000);
        assert_eq!(period(10).unwrap(), 1000);
        assert_eq!(period(60_000).unwrap(), 5000);
        let e = period(3_600_001).unwrap_err();
        assert_eq!(e.message(), "target_request_period_ms: must be at most 3600000, got 3600001");
        // How long an allotment should last is bounded too, and named.
        let lasting = |ms: u32| {
            let quota = v1::QuotaHeld { lasts_ms: ms, ..Default::default() };
            let usage = v1::GroupUsage { group: "g".into(), quota: Some(quota), ..Default::default() };
            let req = v1::ExchangeRequest {
                client_id: "c".into(),
                groups: vec![usage],
                takes_allotments: true,
                ..Default::default()
            };
            c.exchange(Nanos::ZERO, &req).map(|_| ())
        };
        assert!(lasting(3_600_000).is_ok());
        let e = lasting(3_600_001).unwrap_err();
        assert_eq!(e.message(), "groups[0].quota.lasts_ms: must be at most 3600000, got 3600001");
    }
}
