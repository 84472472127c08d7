//! The simulation: virtual time in fixed steps, the real pipeline and the real buckets.
//!
//! Every 10 ms of virtual time each client's arrivals accumulate (requests it attempts at
//! its `rate`), and it admits what its bucket allows, each request's cost spread evenly over
//! the client's backends (as FoundationDB's mock clients do). Refused requests wait and are retried: nothing is dropped, and waiting work
//! counts as demand. Every controller tick, clients report to the pipeline, backends report
//! their queues and per-group load, the pipeline ticks, and each client's bucket takes its
//! new grant. Metrics are sampled every simulated second and checked against the phase's
//! expectations. The same scenario and seed always give the same timeline.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_core::bucket::Bucket;
use tollgate_core::pipeline::{ClientReport, Health, Pipeline, PipelineSettings};
use tollgate_core::settings::GroupName;
use tollgate_core::smooth::Smoother;
use tollgate_core::time::{Nanos, duration_nanos};

use crate::rng::SplitMix64;
use crate::scenario::{Action, Expect, Scenario, Subject};

/// Length of one simulation step.
pub const STEP: Duration = Duration::from_millis(10);
/// Folding time of the mock backends' load (the definition of a backend).
pub const BACKEND_FOLDING_S: f64 = 10.0;
/// Queue bytes of a mock backend at utilisation 1.
pub const QUEUE_AT_CAPACITY: f64 = 800e6;

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

struct Client {
    group: usize,
    rate: f64,
    cost: f64,
    backends: Vec<usize>,
    unthrottled: bool,
    bucket: Bucket,
    arrivals: f64,
    backlog: u64,
    // Since the last exchange.
    offered_units: f64,
    admitted_units: f64,
    admitted_requests: f64,
    // Since the last sample.
    sec_units: f64,
    sec_requests: f64,
}

struct Backend {
    capacity: f64,
    zone: String,
    load: Smoother,
    per_group: Vec<Smoother>,
    step_units: Vec<f64>,
}

/// Runs `scenario` with `seed`.
pub fn run(scenario: &Scenario, seed: u64) -> Outcome {
    let mut rng = SplitMix64::new(seed);
    let mut groups: Vec<GroupName> = scenario.groups.iter().map(|(n, _)| n.clone()).collect();
    for c in &scenario.clients {
        if !groups.contains(&c.group) {
            groups.push(c.group.clone());
        }
    }
    let actions_groups = scenario.actions.iter().chain(scenario.phases.iter().flat_map(|p| p.actions.iter()));
    for a in actions_groups {
        if let Action::SetGroup { name, .. } = a
            && !groups.contains(name)
        {
            groups.push(name.clone());
        }
    }
    groups.sort();
    let group_index = |name: &GroupName| groups.iter().position(|g| g == name).expect("collected above");

    let c = &scenario.controller;
    let mut pipeline = Pipeline::new(PipelineSettings {
        limiting_threshold: c.limiting_threshold,
        ignore_worst_zones: c.ignore_worst_zones,
        capacity: c.capacity,
        free_pool: c.free_pool,
        ..PipelineSettings::default()
    });
    for (name, settings) in &scenario.groups {
        pipeline.set_group(name.clone(), settings.clone());
    }
    let mut backends: Vec<Backend> = scenario
        .backends
        .iter()
        .map(|b| Backend {
            capacity: b.capacity,
            zone: b.zone.clone(),
            load: Smoother::new(BACKEND_FOLDING_S),
            per_group: groups.iter().map(|_| Smoother::new(BACKEND_FOLDING_S)).collect(),
            step_units: vec![0.0; groups.len()],
        })
        .collect();
    let mut clients: Vec<Client> = scenario
        .clients
        .iter()
        .map(|spec| {
            let cost = scenario.cost_model.cost(&spec.usage).expect("scenario costs are validated");
            Client {
                group: group_index(&spec.group),
                rate: spec.rate,
                cost,
                backends: spec.backends.clone(),
                unthrottled: spec.unthrottled,
                // Closed until the first grant, which comes at time 0.
                bucket: Bucket::new(0.0, cost, Nanos::ZERO),
                arrivals: rng.next_f64(),
                backlog: 0,
                offered_units: 0.0,
                admitted_units: 0.0,
                admitted_requests: 0.0,
                sec_units: 0.0,
                sec_requests: 0.0,
            }
        })
        .collect();

    let apply = |action: &Action, pipeline: &mut Pipeline, backends: &mut Vec<Backend>| match action {
        Action::SetBackend { backend, capacity } => backends[*backend].capacity = *capacity,
        Action::SetGroup { name, settings } => pipeline.set_group(name.clone(), settings.clone()),
        Action::RemoveGroup(name) => pipeline.remove_group(name),
    };
    for a in &scenario.actions {
        apply(a, &mut pipeline, &mut backends);
    }

    let step_ns = duration_nanos(STEP);
    let tick_ns = duration_nanos(c.tick).max(step_ns);
    let second_ns = 1_000_000_000u64;
    let mut phases = Vec::new();
    let mut timeline = Vec::new();
    let mut phase = 0usize;
    let mut phase_start = Nanos::ZERO;
    let mut held = 0u32;
    if let Some(p) = scenario.phases.first() {
        for a in &p.actions {
            apply(a, &mut pipeline, &mut backends);
        }
    }
    let mut now = Nanos::ZERO;
    let mut last_exchange = Nanos::ZERO;
    exchange(now, tick_ns, &mut pipeline, &mut clients, &mut backends, &groups, true);

    while phase < scenario.phases.len() {
        now = Nanos(now.0 + step_ns);
        step(now, step_ns, &mut clients, &mut backends);
        if now.0 % tick_ns == 0 {
            let interval = now.0 - last_exchange.0;
            exchange(now, interval, &mut pipeline, &mut clients, &mut backends, &groups, false);
            last_exchange = now;
        }
        if now.0 % second_ns != 0 {
            continue;
        }
        let sample = sample(now, &pipeline, &mut clients, &backends, &groups);
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
            if let Some(p) = scenario.phases.get(phase) {
                for a in &p.actions {
                    apply(a, &mut pipeline, &mut backends);
                }
            }
        } else if elapsed >= current.timeout {
            phases.push(PhaseResult { passed: false, converged_s: None });
            break;
        }
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

/// One step: arrivals, admissions, and the load they put on backends.
fn step(now: Nanos, step_ns: u64, clients: &mut [Client], backends: &mut [Backend]) {
    let dt = step_ns as f64 / 1e9;
    for c in clients.iter_mut() {
        c.arrivals += c.rate * dt;
        let new = c.arrivals.floor();
        c.arrivals -= new;
        c.backlog += new as u64;
        c.offered_units += new * c.cost;
        while c.backlog > 0 {
            if c.unthrottled {
                c.bucket.charge(c.cost, now);
            } else if c.bucket.try_acquire(c.cost, now).is_err() {
                break;
            }
            c.backlog -= 1;
            c.admitted_units += c.cost;
            c.admitted_requests += 1.0;
            c.sec_units += c.cost;
            c.sec_requests += 1.0;
            // Each request's cost is spread evenly over the client's backends.
            let share = c.cost / c.backends.len().max(1) as f64;
            for &b in &c.backends {
                backends[b].step_units[c.group] += share;
            }
        }
    }
    for b in backends.iter_mut() {
        let total: f64 = b.step_units.iter().sum();
        b.load.add_delta(now, total);
        for (g, units) in b.step_units.iter_mut().enumerate() {
            b.per_group[g].add_delta(now, *units);
            *units = 0.0;
        }
    }
}

/// Clients and backends report, the pipeline ticks, clients take their grants.
fn exchange(
    now: Nanos,
    interval_ns: u64,
    pipeline: &mut Pipeline,
    clients: &mut [Client],
    backends: &mut [Backend],
    groups: &[GroupName],
    first: bool,
) {
    let interval_s = interval_ns as f64 / 1e9;
    for (id, c) in clients.iter_mut().enumerate() {
        // What wanted to run: new work offered plus what is still waiting. At the first
        // exchange nothing has been offered yet: the client announces its nominal rate.
        let demand =
            if first { c.rate * c.cost } else { (c.offered_units + c.backlog as f64 * c.cost) / interval_s };
        let report = ClientReport { demand, consumed: c.admitted_units, requests: c.admitted_requests };
        pipeline.client_report(now, id as u64, &groups[c.group], report);
        c.offered_units = 0.0;
        c.admitted_units = 0.0;
        c.admitted_requests = 0.0;
    }
    for (i, b) in backends.iter_mut().enumerate() {
        let load = b.load.smooth_rate(now).max(0.0);
        let per_group: Vec<(GroupName, f64)> = groups
            .iter()
            .enumerate()
            .map(|(g, name)| (name.clone(), b.per_group[g].smooth_rate(now).max(0.0)))
            .filter(|(_, l)| *l > 0.0)
            .collect();
        let health = Health::QueueBytes(load / b.capacity * QUEUE_AT_CAPACITY);
        pipeline.backend_report(now, &format!("b{i}"), &b.zone, health, &per_group);
    }
    pipeline.tick(now);
    for (id, c) in clients.iter_mut().enumerate() {
        let Some(outcome) = pipeline.outcome(&groups[c.group]) else { continue };
        if let Some(grant) = outcome.grants.get(&(id as u64)) {
            // A bucket must hold at least one request, or the client could never send one.
            c.bucket.set_rate(grant.rate, grant.burst.max(c.cost), now);
        }
    }
}

fn sample(
    now: Nanos,
    pipeline: &Pipeline,
    clients: &mut [Client],
    backends: &[Backend],
    groups: &[GroupName],
) -> Sample {
    let mut out = Sample { t: now.as_secs_f64(), ..Sample::default() };
    out.groups = vec![GroupSample::default(); groups.len()];
    for c in clients.iter_mut() {
        let g = &mut out.groups[c.group];
        g.admitted_rps += c.sec_requests;
        g.admitted_units += c.sec_units;
        c.sec_requests = 0.0;
        c.sec_units = 0.0;
    }
    for (i, name) in groups.iter().enumerate() {
        let g = &mut out.groups[i];
        if let Some(o) = pipeline.outcome(name) {
            let cost = o.avg_cost.max(f64::MIN_POSITIVE);
            g.target_units = o.target;
            g.target_rps = o.target.map(|t| t / cost);
            g.client_rps = o.water_level.map(|l| l / cost);
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
    out.tracked_groups = pipeline.tracked_groups() as f64;
    out.utilisation =
        backends.iter().map(|b| b.load.clone().smooth_rate(now).max(0.0) / b.capacity).collect();
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
