//! Embedded mode: the engine runs in process, with this process as its one client.
//!
//! Every `realloc_interval` the first admission to notice that the interval has passed reports
//! each group's counts to the [`Engine`] (through the same demand meter a remote client uses),
//! ticks it, and sets each group's bucket to the grant. There is no background task, so a
//! [`ManualClock`](tollgate_core::time::ManualClock) drives everything in tests. A group with
//! nothing to report for the engine's idle expiry is no longer reported, and the engine forgets
//! it (a resumable ramp keeps its value for its TTL).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::config::Config;
use tollgate_core::demand::DemandMeter;
use tollgate_core::engine::{ClientId, Engine, EngineSettings};
use tollgate_core::settings::GroupName;
use tollgate_core::time::{Clock, Nanos};

use crate::group::{Groups, Limiter};

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
pub(crate) const COST_FACTOR: u32 = 4;

struct State {
    engine: Engine,
    /// One per group asked for: bounded as the table is (a table never lets a group go, so
    /// neither does this).
    meters: HashMap<GroupName, DemandMeter, foldhash::fast::RandomState>,
    /// When the last reallocation ran.
    last: Option<Nanos>,
}

/// The engine and this process's demand meters.
pub(crate) struct Embedded {
    state: Mutex<State>,
    interval: Duration,
    /// Groups reported by the last reallocation.
    in_use: AtomicUsize,
    /// With many groups, no reallocation for new groups before this time (nanoseconds).
    intake_after: AtomicU64,
}

impl Embedded {
    /// The engine for `config`: its groups, capacity and allocation mode, ticking every
    /// `realloc_interval`.
    pub(crate) fn new(config: &Config) -> Embedded {
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
            state: Mutex::new(State { engine, meters: HashMap::default(), last: None }),
            interval: node.realloc_interval,
            in_use: AtomicUsize::new(0),
            intake_after: AtomicU64::new(0),
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
    /// taken in by is returned: the caller makes sure a reallocation runs then.
    pub(crate) fn take_in(&self, now: Nanos, groups: &Groups, clock: &dyn Clock) -> Option<Nanos> {
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
        let cost = done.since(now) * COST_FACTOR;
        let many = self.in_use.load(Ordering::Relaxed) >= INTAKE_PASS_MAX;
        let spacing = if many { INTAKE_SPACING.max(cost) } else { cost };
        self.intake_after.store(done.after(spacing).0, Ordering::Relaxed);
        None
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

impl State {
    fn pass(&mut self, now: Nanos, groups: &Groups) {
        self.last = Some(now);
        let State { engine, meters, .. } = self;
        let idle = engine.settings().group_idle_expiry;
        // A group nobody has asked for has no client yet (what slow start holds back for).
        let list = groups.used();
        let mut quiet: HashSet<GroupName, foldhash::fast::RandomState> = HashSet::default();
        for g in &list {
            let counts = g.counts();
            let meter = meters.entry(g.name.clone()).or_insert_with(|| DemandMeter::new(now));
            if meter.idle(now, &counts, idle) {
                quiet.insert(g.name.clone());
                continue;
            }
            let granted = Some(g.allowance()).filter(|a| a.is_finite() && *a > 0.0);
            let report = meter.report(now, counts, g.waiting(), granted);
            engine.report(now, LOCAL, &g.name, report);
        }
        engine.tick(now);
        for g in &list {
            match engine.outcome(&g.name).and_then(|o| o.grant_of(LOCAL).map(|grant| (o, grant))) {
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
