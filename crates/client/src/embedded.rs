//! Embedded mode: the engine runs in process, with this process as its one client.
//!
//! Every `realloc_interval` the first admission to notice that the interval has passed reports
//! each group's counts to the [`Engine`] (through the same demand meter a remote client uses),
//! ticks it, and sets each group's bucket to the grant. There is no background task, so a
//! [`ManualClock`](tollgate_core::time::ManualClock) drives everything in tests. A group with
//! nothing to report for the engine's idle expiry is no longer reported, and the engine forgets
//! it (a resumable ramp keeps its value for its TTL).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_core::config::Config;
use tollgate_core::demand::DemandMeter;
use tollgate_core::engine::{ClientId, Engine, EngineSettings};
use tollgate_core::settings::GroupName;
use tollgate_core::time::Nanos;

use crate::group::{Groups, Limiter};

/// This process, as the engine's one client.
const LOCAL: ClientId = 1;

struct State {
    engine: Engine,
    meters: HashMap<GroupName, DemandMeter>,
    /// When the last reallocation ran.
    last: Option<Nanos>,
}

/// The engine and this process's demand meters.
pub(crate) struct Embedded {
    state: Mutex<State>,
    interval: Duration,
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
            state: Mutex::new(State { engine, meters: HashMap::new(), last: None }),
            interval: node.realloc_interval,
        }
    }

    /// How often allowances are recomputed.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
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
    }
}

impl State {
    fn pass(&mut self, now: Nanos, groups: &Groups) {
        self.last = Some(now);
        let State { engine, meters, .. } = self;
        let idle = engine.settings().group_idle_expiry;
        // A group nobody has asked for has no client yet (what slow start holds back for).
        let list: Vec<_> = groups.unique().into_iter().filter(|g| g.is_used()).collect();
        let mut quiet = Vec::new();
        for g in &list {
            let counts = g.counts();
            let meter = meters.entry(g.name.clone()).or_insert_with(|| DemandMeter::new(now));
            if meter.idle(now, &counts, idle) {
                quiet.push(g.name.clone());
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
                    if let Limiter::Bucket(bucket) = &g.limiter {
                        bucket.close_until_rated(now);
                    }
                    g.allowance.store(f64::NAN.to_bits(), Ordering::Relaxed);
                }
                None => {}
            }
        }
        meters.retain(|name, _| groups.get(name.as_str()).is_some());
    }
}
