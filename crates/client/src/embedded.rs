//! Embedded mode: the engine runs in process, with this process as its one client.
//!
//! Every `realloc_interval` the first admission to notice that the interval has passed reports
//! each group's counts to the [`Engine`] (through the same demand meter a remote client uses),
//! ticks it, and sets each group's bucket to the grant. With few groups this pass takes
//! microseconds and runs on that admission's thread, so a
//! [`ManualClock`](tollgate_model::time::ManualClock) drives everything in tests. With
//! [`BACKGROUND_GROUPS`] or more in use on a real clock, a pass takes milliseconds (about
//! 90 ms at 100,000 groups), too long for a request to wait: from then on passes run on a
//! thread of their own, the `tollgate-alloc` thread, and no admission waits for one. A group
//! with nothing to report for the engine's idle expiry is no longer reported, and the engine
//! forgets it (a resumable ramp keeps its value for its TTL).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::Thread;
use std::time::Duration;

use tollgate_model::config::Config;
use tollgate_model::demand::DemandMeter;
use tollgate_model::engine::{ClientId, Engine, EngineSettings};
use tollgate_model::settings::GroupName;
use tollgate_model::time::{Clock, Nanos};

use crate::clock::ClockSource;
use crate::group::{Group, Groups, Limiter};

/// This process, as the engine's one client.
const LOCAL: ClientId = 1;

/// Up to this many groups in use, a group used for the first time is taken in by a full
/// reallocation at once, unless one for new groups ran within four times its cost. From it on,
/// see [`Embedded::take_in`].
pub(crate) const INTAKE_PASS_MAX: usize = 256;

/// With many groups, the least time between two reallocations run for new groups.
pub(crate) const INTAKE_SPACING: Duration = Duration::from_millis(10);

/// The time between two reallocations, for new groups or on schedule, is at least this many
/// times what the last one took: however many groups, they take at most a fifth of the time.
const COST_FACTOR: u32 = 4;

/// From this many groups in use on a real clock, reallocations run on a thread of their own
/// rather than on the admission that finds one due: a pass over a thousand groups takes a
/// few hundred microseconds, over 100,000 about 90 ms, and a request should not wait for it.
/// On a clock given for tests ([`ManualClock`](tollgate_model::time::ManualClock)) passes
/// always run on admissions, so tests stay deterministic.
pub const BACKGROUND_GROUPS: usize = 1024;

struct State {
    engine: Engine,
    /// One per group asked for, with where the engine kept its state at the last pass
    /// (`Engine::report_placed`): bounded as the table is (a table never lets a group go, so
    /// neither does this).
    meters: HashMap<GroupName, (DemandMeter, u32), foldhash::fast::RandomState>,
    /// When the last reallocation ran.
    last: Option<Nanos>,
    /// The wall clock (Unix milliseconds) at the first pass, and the clock's reading then: the
    /// quota windows (minute, hour, day…) are counted on it, in memory, since the process
    /// started.
    wall: Option<(Nanos, u64)>,
}

/// The engine and this process's demand meters.
pub(crate) struct Embedded {
    shared: Arc<Shared>,
}

/// What admissions and the reallocation thread share.
pub(crate) struct Shared {
    state: Mutex<State>,
    interval: Duration,
    /// Groups reported by the last reallocation.
    in_use: AtomicUsize,
    /// With many groups, no reallocation for new groups before this time (nanoseconds).
    intake_after: AtomicU64,
    /// The reallocation thread, once passes run on it.
    worker: OnceLock<Thread>,
    /// When the thread runs the next pass on schedule (nanoseconds).
    next_due: AtomicU64,
    /// A group was used for the first time: the thread takes it in as soon as the spacing
    /// of passes for new groups allows.
    intake_wanted: AtomicBool,
    /// The limiter is gone: the thread ends.
    closed: AtomicBool,
    /// Set by the admission that starts the thread.
    starting: AtomicBool,
}

impl std::ops::Deref for Embedded {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
        if let Some(thread) = self.worker.get() {
            thread.unpark();
        }
    }
}

impl Embedded {
    /// The engine for `config`: its groups, capacity and allocation mode, ticking every
    /// `realloc_interval`. Its quota windows are placed on `unix_ms` at the clock's `now` if
    /// the clock keeps Unix time, else on the system's wall clock at the first pass.
    pub(crate) fn new(config: &Config, now: Nanos, unix_ms: Option<u64>) -> Embedded {
        let node = &config.node;
        let mut engine = Engine::new(EngineSettings {
            capacity: node.capacity,
            mode: node.mode,
            slow_start: node.slow_start,
            tick: node.realloc_interval,
            max_tracked_groups: node.max_tracked_groups.saturating_add(1),
            ..EngineSettings::default()
        });
        for (name, settings) in &config.groups {
            engine.set_group(name.clone(), settings.clone());
        }
        Embedded {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    engine,
                    meters: HashMap::default(),
                    last: None,
                    wall: unix_ms.map(|ms| (now, ms)),
                }),
                interval: node.realloc_interval,
                in_use: AtomicUsize::new(0),
                intake_after: AtomicU64::new(0),
                worker: OnceLock::new(),
                next_due: AtomicU64::new(0),
                intake_wanted: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                starting: AtomicBool::new(false),
            }),
        }
    }

    /// Whether reallocations run on their own thread: admissions then never run one.
    pub(crate) fn in_background(&self) -> bool {
        self.worker.get().is_some()
    }

    /// After a pass on an admission's thread that started at `now` and took `cost`: with
    /// [`BACKGROUND_GROUPS`] or more in use on a real clock, starts the reallocation thread
    /// (the next pass on schedule then runs on it). Says whether passes now run there.
    pub(crate) fn hand_over(
        &self,
        now: Nanos,
        cost: Duration,
        groups: &Arc<Groups>,
        clock: &Arc<ClockSource>,
    ) -> bool {
        if self.in_background() {
            return true;
        }
        if self.in_use.load(Ordering::Relaxed) < BACKGROUND_GROUPS || !clock.is_real() {
            return false;
        }
        // One thread, however many admissions get here at once.
        if self.starting.swap(true, Ordering::AcqRel) {
            return self.in_background();
        }
        self.next_due.store(self.next_pass(now, cost).0, Ordering::Relaxed);
        let (shared, groups, clock) = (Arc::downgrade(&self.shared), groups.clone(), clock.clone());
        let spawned = std::thread::Builder::new()
            .name("tollgate-alloc".into())
            .spawn(move || work(&shared, &groups, &clock));
        match spawned {
            Ok(handle) => {
                let _ = self.worker.set(handle.thread().clone());
                true
            }
            Err(e) => {
                // Passes go on running on admissions, as with fewer groups (and a later one
                // may try again).
                self.starting.store(false, Ordering::Release);
                tracing::warn!(error = %e, "tollgate: could not start the reallocation thread");
                false
            }
        }
    }

    /// A group was used for the first time while passes run on their own thread: it is taken
    /// in by the next pass the spacing for new groups allows.
    pub(crate) fn wake_for_intake(&self) {
        if !self.intake_wanted.swap(true, Ordering::AcqRel)
            && let Some(thread) = self.worker.get()
        {
            thread.unpark();
        }
    }

    /// How often allowances are recomputed.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Takes in a group used for the first time, by a full reallocation. One per new group
    /// would make taking in N groups one by one cost N² (a service keyed by 100,000 tenants),
    /// so reallocations for new groups are spaced by four times what the last one took (a
    /// pass over a few groups takes microseconds), and past [`INTAKE_PASS_MAX`] groups in use
    /// by at least [`INTAKE_SPACING`]; a new group admits by the bucket it was made with (its
    /// own limit and burst, as before its first reallocation) until then, and the time it is
    /// taken in by is returned: the caller makes sure a reallocation runs then. While passes
    /// run on their own thread, that thread is told instead.
    pub(crate) fn take_in(
        &self,
        now: Nanos,
        groups: &Arc<Groups>,
        clock: &Arc<ClockSource>,
    ) -> Option<Nanos> {
        if self.in_background() {
            self.wake_for_intake();
            return None;
        }
        let after = self.intake_after.load(Ordering::Relaxed);
        if now.0 < after {
            return Some(Nanos(after));
        }
        self.reallocate(now, groups);
        // Whatever the number of groups in use, a pass costs at least one look at every group
        // the process knows (thousands may be configured and not asked for yet): the next one
        // for new groups waits four times what this one took, and with many groups in use at
        // least `INTAKE_SPACING`.
        let done = clock.now();
        if self.hand_over(now, done.since(now), groups, clock) {
            return None;
        }
        self.space_intake(done, done.since(now));
        None
    }
}

impl Shared {
    /// The next pass on schedule after one that started at `now` and took `cost`: an
    /// interval later, or later still when passes are that slow, so that they take at most
    /// a fifth of the time of the thread that runs them (see [`COST_FACTOR`]).
    pub(crate) fn next_pass(&self, now: Nanos, cost: Duration) -> Nanos {
        now.after(self.interval.max(cost * (1 + COST_FACTOR)))
    }

    /// After a pass that ended at `done` and took `cost`, no pass for new groups before four
    /// times that cost, and with [`INTAKE_PASS_MAX`] groups or more in use, before
    /// [`INTAKE_SPACING`] either.
    fn space_intake(&self, done: Nanos, cost: Duration) {
        let cost = cost * COST_FACTOR;
        let many = self.in_use.load(Ordering::Relaxed) >= INTAKE_PASS_MAX;
        let spacing = if many { INTAKE_SPACING.max(cost) } else { cost };
        self.intake_after.store(done.after(spacing).0, Ordering::Relaxed);
    }

    /// Reports every group's counts, ticks the engine and applies the grants. Skipped if
    /// another thread is at it.
    pub(crate) fn reallocate(&self, now: Nanos, groups: &Groups) {
        let Ok(mut state) = self.state.try_lock() else { return };
        // Reallocations run on calls: after a spell with none, what was counted since the last
        // one happened just after it. Report it then, so a long silence reads as one.
        if let Some(last) = state.last
            && now.since(last) > self.interval * 2
        {
            state.pass(last.after(self.interval), groups);
        }
        state.pass(now, groups);
        self.in_use.store(state.meters.len(), Ordering::Relaxed);
    }
}

/// The reallocation thread: a pass when one is due on schedule, or for new groups when the
/// spacing allows; parked in between. Ends once the limiter is dropped.
fn work(shared: &Weak<Shared>, groups: &Groups, clock: &ClockSource) {
    loop {
        let Some(s) = shared.upgrade().filter(|s| !s.closed.load(Ordering::Acquire)) else { return };
        let now = clock.now();
        let due = s.next_due.load(Ordering::Relaxed);
        let intake_after = s.intake_after.load(Ordering::Relaxed);
        let intake = s.intake_wanted.load(Ordering::Acquire);
        if now.0 >= due || (intake && now.0 >= intake_after) {
            s.intake_wanted.store(false, Ordering::Release);
            s.reallocate(now, groups);
            // Spaced as on an admission's thread.
            let done = clock.now();
            s.next_due.store(s.next_pass(now, done.since(now)).0, Ordering::Relaxed);
            s.space_intake(done, done.since(now));
            continue;
        }
        let wake = if intake { due.min(intake_after) } else { due };
        drop(s);
        // An unpark (a new group, or the limiter dropped) since the look above ends the wait
        // at once.
        std::thread::park_timeout(Duration::from_nanos(wake.saturating_sub(now.0)));
    }
}

impl State {
    fn pass(&mut self, now: Nanos, groups: &Groups) {
        self.last = Some(now);
        let State { engine, meters, wall, .. } = self;
        let idle = engine.settings().group_idle_expiry;
        // The quota windows' place on the wall clock, read once.
        let has_quotas = engine.has_quotas();
        let wall_now = has_quotas.then(|| {
            let (at, wall_ms) = *wall.get_or_insert_with(|| (now, wall_now_ms()));
            let wall = wall_ms.saturating_add(u64::try_from(now.since(at).as_millis()).unwrap_or(u64::MAX));
            engine.set_wall_clock(now, wall);
            wall
        });
        // A group nobody has asked for has no client yet (what slow start holds back for).
        let listed = groups.listed();
        let list: Vec<&Group> = listed.used().collect();
        let mut quiet: HashSet<GroupName, foldhash::fast::RandomState> = HashSet::default();
        // Where each group's state sits in the engine, for the grants after the tick.
        let mut places = Vec::with_capacity(list.len());
        for &g in &list {
            let counts = g.counts();
            let (meter, place) =
                meters.entry(g.name.clone()).or_insert_with(|| (DemandMeter::new(now), u32::MAX));
            places.push(*place);
            if meter.idle(now, &counts, idle) {
                quiet.insert(g.name.clone());
                continue;
            }
            let granted = Some(g.allowance()).filter(|a| a.is_finite() && *a > 0.0);
            let mut report = meter.report(now, counts, g.waiting(), granted);
            // What the process holds of the group's quotas: more than two seconds of demand
            // goes back (embedded, nothing else asks for it, but a window's count stays exact).
            report.quota = Some(g.allotment_report(report.demand * 4.0).unwrap_or_default());
            let grant = engine.report_placed(now, LOCAL, &g.name, report, place);
            g.set_allotment(grant.quota.as_ref(), now, now);
            *places.last_mut().expect("pushed") = *place;
        }
        if let Some(wall) = wall_now {
            engine.roll_windows(wall, tollgate_model::settings::BudgetPeriod::Total);
        }
        engine.tick(now);
        for (&g, &place) in list.iter().zip(&places) {
            let outcome = engine.outcome_placed(&g.name, place);
            match outcome.and_then(|o| o.grant_of(LOCAL).map(|grant| (o, grant))) {
                Some((outcome, grant)) => {
                    g.set_rate(grant.rate, grant.burst, now);
                    g.demand.store(outcome.demand.to_bits(), Ordering::Relaxed);
                }
                // Idle past the expiry, the engine forgot it: its next request waits for the
                // next tick, which takes it in again as new (with its ramp at min, or resumed).
                None if quiet.contains(&g.name) && !g.allowance().is_nan() => {
                    if let Limiter::Bucket(bucket) = g.limiter() {
                        bucket.close_until_rated(now);
                    }
                    g.allowance.store(f64::NAN.to_bits(), Ordering::Relaxed);
                }
                None => {}
            }
        }
    }
}

/// Unix time in milliseconds: read once per limiter, to place the quota windows (from the
/// limiter's clock when it keeps one).
pub(crate) fn wall_ms(clock: &impl Clock) -> u64 {
    clock.unix_ms().unwrap_or_else(wall_now_ms)
}

fn wall_now_ms() -> u64 {
    #[allow(clippy::disallowed_methods)] // the one wall-clock read of the embedded mode
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
