//! The simulation: virtual time in fixed steps, the real controller and the real clients.
//!
//! Every 10 ms of virtual time the world's clients admit what their handles allow and the
//! mock backends take the load (see [`crate::world`]). The controller is `tollgate server`'s
//! own [`Controller`], over a store in memory; each client is a real remote handle whose
//! exchanges are made by its [`Driver`] when due, delivered to the controller in process as
//! the same `ExchangeRequest` and `ExchangeResponse` the network carries. At each tick the
//! backends report and the controller ticks. Metrics are sampled every simulated second and
//! checked against the phase's expectations. The same scenario and seed always give the same
//! timeline.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_client::{Driver, RemoteOptions, Tollgate};
use tollgate_core::engine::{EngineSettings, SaturationSettings, TraceEvent};
use tollgate_core::settings::GroupName;
use tollgate_core::time::{ManualClock, Nanos, duration_nanos};
use tollgate_server::Controller;
use tollgate_server::store::{MemoryStore, Stored, StoredNode};

use crate::scenario::{Action, Expect, Scenario, Subject};
use crate::world::World;

/// Length of one simulation step.
pub const STEP: Duration = Duration::from_millis(10);
/// One group's metrics at one second.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupSample {
    /// Target units/s ÷ average cost; `None` when the group is not throttled.
    pub target_rps: Option<f64>,
    /// Target units/s.
    pub target_units: Option<f64>,
    /// The water level in requests/s.
    pub client_rps: Option<f64>,
    /// Requests admitted in the last second.
    pub admitted_rps: f64,
    /// Units admitted in the last second.
    pub admitted_units: f64,
    /// Limiting below the cap.
    pub busy: bool,
    /// Demand reported to the controller, units/s.
    pub demand_units: f64,
}

/// Everything measured at one second.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    /// Simulated seconds since the start.
    pub t: f64,
    /// Per group, in the order of [`Outcome::groups`].
    pub groups: Vec<GroupSample>,
    /// Per backend utilisation, in the order of the scenario's backends.
    pub utilisation: Vec<f64>,
    /// Sum of the throttled groups' target_rps.
    pub total_target_rps: f64,
    /// Groups with limiting below their cap.
    pub busy_groups: f64,
    /// Groups the controller tracks.
    pub tracked_groups: f64,
}

/// How a phase ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseResult {
    /// Every expectation held for the hold time.
    pub passed: bool,
    /// Simulated seconds from the phase's start to the check that completed the hold.
    pub converged_s: Option<f64>,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The seed used.
    pub seed: u64,
    /// Group names, the order of [`Sample::groups`].
    pub groups: Vec<GroupName>,
    /// Backend names, the order of [`Sample::utilisation`].
    pub backends: Vec<String>,
    /// One result per phase of the scenario (phases after a failed one did not run).
    pub phases: Vec<PhaseResult>,
    /// One sample per simulated second.
    pub timeline: Vec<Sample>,
}

impl Outcome {
    /// Whether every phase passed.
    pub fn passed(&self) -> bool {
        self.phases.iter().all(|p| p.passed)
    }
}

/// The engine settings a scenario's controller runs with.
pub fn engine_settings(scenario: &Scenario) -> EngineSettings {
    let c = &scenario.controller;
    EngineSettings {
        tick: c.tick,
        saturation: SaturationSettings {
            limiting_threshold: c.limiting_threshold,
            ignore_worst_zones: c.ignore_worst_zones,
            queue_target_bytes: c.queue_target_bytes,
            queue_spring_bytes: c.queue_spring_bytes,
            law: c.limiting_law,
        },
        cost_folding: c.cost_folding,
        trickle: c.trickle,
        ..EngineSettings::default()
    }
}

/// What a scenario's controller has stored at the start: its groups, capacity and mode.
pub fn stored(scenario: &Scenario) -> Stored {
    let c = &scenario.controller;
    Stored {
        groups: scenario.groups.iter().cloned().collect(),
        node: StoredNode { capacity: c.capacity, mode: c.mode, slow_start: c.slow_start },
        node_stored: true,
        ..Stored::default()
    }
}

/// The controller a scenario describes, over a store in memory holding its groups.
pub fn controller(scenario: &Scenario) -> Controller {
    let store = MemoryStore::with(stored(scenario));
    Controller::new(Box::new(store), engine_settings(scenario), Nanos::ZERO, 0)
        .expect("a store in memory loads")
}

/// Every group a scenario names, sorted: its groups, its clients' and its actions'.
pub fn group_names(scenario: &Scenario) -> Vec<GroupName> {
    let mut groups: Vec<GroupName> = scenario.groups.iter().map(|(n, _)| n.clone()).collect();
    let named = scenario.clients.iter().map(|c| c.group.clone());
    let acted =
        scenario.actions.iter().chain(scenario.phases.iter().flat_map(|p| p.actions.iter())).filter_map(
            |a| match a {
                Action::SetGroup { name, .. } => Some(name.clone()),
                _ => None,
            },
        );
    for name in named.chain(acted) {
        if !groups.contains(&name) {
            groups.push(name);
        }
    }
    groups.sort();
    groups
}

/// The options a scenario's client `i` runs with.
pub fn client_options(scenario: &Scenario, i: usize) -> RemoteOptions {
    RemoteOptions {
        client_id: Some(format!("client-{i}")),
        cost_model: scenario.cost_model,
        ..RemoteOptions::default()
    }
}

/// Applies an action to the controller or the world.
fn apply(action: &Action, controller: &Controller, world: &mut World) {
    let result = match action {
        Action::SetBackend { backend, capacity } => {
            world.set_backend_capacity(*backend, *capacity);
            Ok(())
        }
        Action::SetGroup { name, settings } => controller.set_group(name.clone(), settings.clone()),
        Action::RemoveGroup(name) => controller.drop_group(name).map(|_| ()),
        Action::Settle { group, units } => {
            world.settle(group, *units);
            Ok(())
        }
    };
    result.expect("a store in memory does not fail");
}

/// Runs `scenario` with `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Outcome {
    run_traced(scenario, seed, None)
}

/// Runs `scenario` with `seed`, handing every trace event of the controller (each group's
/// rate computation per tick, each backend's busy groups) to `trace` as it happens.
pub fn run_traced(scenario: &Scenario, seed: u64, mut trace: Option<&mut dyn FnMut(TraceEvent)>) -> Outcome {
    let groups = group_names(scenario);
    let controller = controller(scenario);
    controller.set_tracing(trace.is_some());
    let clock = ManualClock::new();
    let mut drivers: Vec<Driver> = Vec::with_capacity(scenario.clients.len());
    let mut gates = Vec::with_capacity(scenario.clients.len());
    for i in 0..scenario.clients.len() {
        let (gate, driver) = Tollgate::remote_driven(client_options(scenario, i).with_clock(clock.clone()))
            .expect("scenario cost models are validated");
        gates.push(gate);
        drivers.push(driver);
    }
    let mut world = World::new(scenario, &groups, &gates, seed);
    for a in &scenario.actions {
        apply(a, &controller, &mut world);
    }

    let step_ns = duration_nanos(STEP);
    let tick_ns = duration_nanos(scenario.controller.tick).max(step_ns);
    let second_ns = 1_000_000_000u64;
    let mut phases = Vec::new();
    let mut timeline = Vec::new();
    let mut phase = 0usize;
    let mut phase_start = Nanos::ZERO;
    let mut held = 0u32;
    if let Some(p) = scenario.phases.first() {
        for a in &p.actions {
            apply(a, &controller, &mut world);
        }
    }
    let mut now = Nanos::ZERO;
    loop {
        // At a tick the backends report and the controller ticks; then every client whose
        // exchange is due makes it, in the order they were started.
        if now.0 % tick_ns == 0 {
            for report in world.backend_reports(now) {
                controller.backend_report(now, &report).expect("scenario backends are valid");
            }
            controller.tick(now);
            if let Some(sink) = trace.as_mut() {
                for event in controller.take_trace().0 {
                    sink(event);
                }
            }
        }
        for d in &mut drivers {
            d.poll(now);
            if d.is_due(now)
                && let Some(request) = d.request(now)
            {
                match controller.exchange(now, &request) {
                    Ok(response) => d.answer(now, &response),
                    Err(status) => d.failed(now, status.message()),
                }
            }
        }
        if now.0 > 0 && now.0 % second_ns == 0 {
            let sample = sample(now, &controller, &mut world, &groups);
            let current = &scenario.phases[phase];
            if current.expects.iter().all(|e| holds(e, &sample, &groups)) {
                held += 1;
            } else {
                held = 0;
            }
            timeline.push(sample);
            let elapsed = now.since(phase_start);
            if held >= current.hold_checks {
                phases.push(PhaseResult { passed: true, converged_s: Some(elapsed.as_secs_f64()) });
                phase += 1;
                phase_start = now;
                held = 0;
                match scenario.phases.get(phase) {
                    Some(p) => {
                        for a in &p.actions {
                            apply(a, &controller, &mut world);
                        }
                    }
                    None => break,
                }
            } else if elapsed >= current.timeout {
                phases.push(PhaseResult { passed: false, converged_s: None });
                break;
            }
        }
        now = Nanos(now.0 + step_ns);
        clock.set(now);
        world.step(now, STEP.as_secs_f64());
    }
    while phases.len() < scenario.phases.len() {
        phases.push(PhaseResult { passed: false, converged_s: None });
    }
    Outcome {
        seed,
        groups,
        backends: scenario.backends.iter().map(|b| b.name.clone()).collect(),
        phases,
        timeline,
    }
}

/// Metrics at `now`: what the world admitted over the last second, what the controller set.
fn sample(now: Nanos, controller: &Controller, world: &mut World, groups: &[GroupName]) -> Sample {
    let mut out = Sample { t: now.as_secs_f64(), ..Sample::default() };
    out.groups = world
        .take_second()
        .into_iter()
        .map(|a| GroupSample { admitted_rps: a.requests, admitted_units: a.units, ..GroupSample::default() })
        .collect();
    controller.with_engine(|engine| {
        for (i, name) in groups.iter().enumerate() {
            let g = &mut out.groups[i];
            if let Some(o) = engine.outcome(name) {
                let cost = o.avg_cost.max(f64::MIN_POSITIVE);
                g.target_units = o.target();
                g.target_rps = o.target().map(|t| t / cost);
                g.client_rps = o.water_level().map(|l| l / cost);
                g.busy = o.busy;
                g.demand_units = o.demand;
                if let Some(t) = g.target_rps {
                    out.total_target_rps += t;
                }
                if o.busy {
                    out.busy_groups += 1.0;
                }
            }
        }
        out.tracked_groups = engine.tracked_groups() as f64;
    });
    out.utilisation = world.utilisation(now);
    out
}

/// The value of an expectation's metric in `s`; `None` when there is none (an untracked or
/// unthrottled group's target).
pub fn observe(e: &Expect, s: &Sample, groups: &[GroupName]) -> Option<f64> {
    match &e.subject {
        Subject::Group(name) => {
            let g = &s.groups[groups.iter().position(|n| n == name)?];
            match e.metric.as_str() {
                "target_rps" => g.target_rps,
                "target_units" => g.target_units,
                "client_rps" => g.client_rps,
                "admitted_rps" => Some(g.admitted_rps),
                "admitted_units" => Some(g.admitted_units),
                "busy" => Some(if g.busy { 1.0 } else { 0.0 }),
                "demand_units" => Some(g.demand_units),
                _ => None,
            }
        }
        Subject::Backend(i) => s.utilisation.get(*i).copied(),
        Subject::Cluster => match e.metric.as_str() {
            "total_target_rps" => Some(s.total_target_rps),
            "busy_groups" => Some(s.busy_groups),
            "tracked_groups" => Some(s.tracked_groups),
            _ => None,
        },
    }
}

/// Whether `e` holds in `s`: `|observed − expected| < tolerance × observed`.
pub fn holds(e: &Expect, s: &Sample, groups: &[GroupName]) -> bool {
    let observed = observe(e, s, groups);
    if e.absent {
        return observed.is_none();
    }
    match (observed, e.value) {
        (Some(o), Some(v)) => o == v || (o - v).abs() < e.tolerance * o.abs(),
        _ => false,
    }
}

/// The groups' and backends' per-second series, for charts: (name, values).
pub fn series(outcome: &Outcome) -> BTreeMap<String, Vec<f64>> {
    let mut out = BTreeMap::new();
    for (i, g) in outcome.groups.iter().enumerate() {
        out.insert(
            format!("{g} target"),
            outcome.timeline.iter().map(|s| s.groups[i].target_units.unwrap_or(f64::NAN)).collect(),
        );
        out.insert(
            format!("{g} admitted"),
            outcome.timeline.iter().map(|s| s.groups[i].admitted_units).collect(),
        );
    }
    out
}
