//! The simulation: virtual time in fixed steps, the real controller and the real clients.
//!
//! Every 10 ms of virtual time the world's clients with a request arriving or waiting admit
//! what their handles allow and the mock backends take the load (see [`crate::world`]). The controller is `tollgate server`'s
//! own [`Controller`], over a store in memory; each client is a real remote handle whose
//! exchanges are made by its [`Driver`] when due, delivered to the controller in process as
//! the same `ExchangeRequest` and `ExchangeResponse` the network carries. At each tick the
//! backends report and the controller ticks. Metrics are sampled every simulated second and
//! checked against the phase's expectations. The same scenario and seed always give the same
//! timeline.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_controller::cluster::regions::{LOOK_EVERY, RegionLease};
use tollgate_controller::cluster::role::{Role, RoleView};
use tollgate_controller::store::{MemoryStore, Stored, StoredNode};
use tollgate_controller::{Controller, Node};
use tollgate_limiter::remote::LOW_TOKENS_CHECK;
use tollgate_limiter::{Driver, ExchangeError, RemoteOptions, Tollgate};
use tollgate_model::engine::{EngineSettings, SaturationSettings, TraceEvent};
use tollgate_model::settings::GroupName;
use tollgate_model::time::{ManualClock, Nanos, duration_nanos};
use tollgate_proto::v1;

use crate::faults::{self, FaultKind};
use crate::invariants::{Breach, Checker, HEAL_S, Second, WINDOW_S};

use crate::scenario::{Action, Expect, Scenario, Subject};
use crate::shards::Shards;
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
    /// Requests admitted in the last second by class: critical, normal, sheddable.
    pub by_class: [f64; 3],
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
    /// Per queueing backend, what it served; `None` for the others.
    pub served: Vec<Option<crate::world::Served>>,
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
    /// The invariant that broke, which stopped the run (runs with faults only).
    pub breach: Option<Breach>,
    /// The exchanges each tier answered over the run.
    pub exchanges: Exchanges,
}

/// The exchanges of a run, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exchanges {
    /// Clients' exchanges sent to a controller (a region's, with regions).
    pub clients: u64,
    /// Regions' exchanges (pages of their rounds) the global tier answered.
    pub regions: u64,
}

impl Outcome {
    /// Whether every phase passed.
    pub fn passed(&self) -> bool {
        self.breach.is_none() && self.phases.iter().all(|p| p.passed)
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
        max_tracked_groups: c.max_groups,
        ..EngineSettings::default()
    }
}

/// What a scenario's controller has stored at the start: its groups, capacity and mode.
pub fn stored(scenario: &Scenario) -> Stored {
    let c = &scenario.controller;
    Stored {
        groups: scenario.groups.iter().cloned().collect(),
        node: StoredNode {
            capacity: c.capacity,
            mode: c.mode,
            slow_start: c.slow_start,
            ..StoredNode::default()
        },
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
    let mut groups: std::collections::BTreeSet<GroupName> =
        scenario.groups.iter().map(|(n, _)| n.clone()).collect();
    let named = scenario.clients.iter().flat_map(|c| c.groups().cloned());
    let acted =
        scenario.actions.iter().chain(scenario.phases.iter().flat_map(|p| p.actions.iter())).filter_map(
            |a| match a {
                Action::SetGroup { name, .. } => Some(name.clone()),
                _ => None,
            },
        );
    groups.extend(named.chain(acted));
    groups.into_iter().collect()
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
fn apply(action: &Action, controller: &Controller, world: &mut World, now: Nanos) {
    let result = match action {
        Action::SetBackend { backend, capacity } => {
            world.set_backend_capacity(*backend, *capacity);
            Ok(())
        }
        Action::SetGroup { name, settings } => {
            controller.admin().set_group(name.clone(), (**settings).clone(), "scenario", wall_ms(now))
        }
        Action::RemoveGroup(name) => controller.admin().drop_group(name, "scenario").map(|_| ()),
        Action::Settle { group, units } => {
            world.settle(group, *units);
            Ok(())
        }
        Action::SetClients { group, rate } => {
            world.set_client_rate(group, *rate);
            Ok(())
        }
        Action::SetClient { index, rate } => {
            world.set_one_client_rate(*index, *rate);
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
pub fn run_traced(scenario: &Scenario, seed: u64, trace: Option<&mut dyn FnMut(TraceEvent)>) -> Outcome {
    run_with(scenario, seed, RunHooks { trace, ..RunHooks::default() })
}

/// What a run hands out or lets tests change.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Receives every trace event of the controller.
    pub trace: Option<&'a mut dyn FnMut(TraceEvent)>,
    /// Changes every answer the controller gives before a client reads it: a broken
    /// controller, for the tests that prove the invariants catch one (the canary).
    pub tamper: Option<&'a dyn Fn(&mut v1::ExchangeResponse)>,
    /// Keeps no timeline ([`Outcome::timeline`] stays empty), only the verdicts: a run holds a
    /// sample of every group each simulated second otherwise, 130 MB a second at 1,000,000
    /// groups.
    pub verdicts_only: bool,
}

/// A client's clock under drift: from `anchor_real` on it runs at `1 + rate`.
#[derive(Debug, Clone, Copy)]
struct Drift {
    anchor_real: Nanos,
    anchor_client: Nanos,
    rate: f64,
}

impl Drift {
    fn at(&self, now: Nanos) -> Nanos {
        let run = now.0.saturating_sub(self.anchor_real.0) as f64 * (1.0 + self.rate);
        Nanos(self.anchor_client.0.saturating_add(run.max(0.0) as u64))
    }
}

/// The simulated clients: each one's clock, exchange driver and handle, in the order they were
/// started.
struct Clients {
    clocks: Vec<ManualClock>,
    drivers: Vec<Driver>,
    gates: Vec<Tollgate>,
    /// When each driver is next polled (its clock's time), as the exchange task wakes: at
    /// least every [`LOW_TOKENS_CHECK`], when asked to, and when an exchange is due.
    polls: Vec<Nanos>,
    /// Exchanges sent to a controller (the global tier's, a region's or a shard's owner).
    exchanges: u64,
}

impl Clients {
    fn new(scenario: &Scenario) -> Clients {
        let n = scenario.clients.len();
        let clocks: Vec<ManualClock> = (0..n).map(|_| ManualClock::new()).collect();
        let (gates, drivers) = (0..n).map(|i| start_client(scenario, i, &clocks[i])).unzip();
        Clients { clocks, drivers, gates, polls: vec![Nanos::ZERO; n], exchanges: 0 }
    }
}

fn start_client(scenario: &Scenario, i: usize, clock: &ManualClock) -> (Tollgate, Driver) {
    Tollgate::remote_driven(client_options(scenario, i).with_clock(clock.clone()))
        .expect("scenario cost models are validated")
}

/// The faults in force: the controller down until (and whether a failover brings the next
/// one), clients cut off until, losses and delays until, answers in flight, new tenants under
/// way, the store gone, clocks drifting.
struct FaultState {
    down: Option<(Nanos, bool)>,
    cut_until: Vec<Nanos>,
    loss: (Nanos, f64),
    delay: (Nanos, Duration),
    in_flight: Vec<Option<(Nanos, v1::ExchangeResponse)>>,
    last_cut_off: Option<Nanos>,
    healed_at: Nanos,
    max_drift: f64,
    /// New tenants under way: (from, until, names), each fault's names its own.
    churns: Vec<(Nanos, Nanos, u32, usize)>,
    /// The store gone: the leader leads until the first time, none until the second.
    store_lost: Option<(Nanos, Nanos)>,
    drifts: Vec<Drift>,
    /// Each region cut off from the global tier until.
    region_cut_until: Vec<Nanos>,
}

impl FaultState {
    fn new(n: usize, regions: usize) -> FaultState {
        FaultState {
            region_cut_until: vec![Nanos::ZERO; regions],
            down: None,
            cut_until: vec![Nanos::ZERO; n],
            loss: (Nanos::ZERO, 0.0),
            delay: (Nanos::ZERO, Duration::ZERO),
            in_flight: vec![None; n],
            last_cut_off: None,
            healed_at: Nanos::ZERO,
            max_drift: 0.0,
            churns: Vec::new(),
            store_lost: None,
            drifts: vec![Drift { anchor_real: Nanos::ZERO, anchor_client: Nanos::ZERO, rate: 0.0 }; n],
        }
    }

    /// Fault `f` (the `number`th) starts at `now`.
    fn begin(
        &mut self,
        f: &faults::Fault,
        number: usize,
        now: Nanos,
        scenario: &Scenario,
        clients: &mut Clients,
        world: &mut World,
    ) {
        let end = f.end().map(|e| Nanos(duration_nanos(e)));
        // New tenants must not disturb the groups in traffic at all: the reservations are
        // checked right through a churn.
        if let Some(e) = end.filter(|_| !matches!(f.kind, FaultKind::Churn { .. })) {
            self.healed_at = self.healed_at.max(e);
        }
        match &f.kind {
            FaultKind::Crash { down: d } | FaultKind::Failover { down: d } => {
                let until = now.after(*d);
                let failover = matches!(f.kind, FaultKind::Failover { .. });
                self.down =
                    Some(self.down.map_or((until, failover), |(u, fo)| (u.max(until), fo || failover)));
            }
            FaultKind::Partition { clients, .. } => {
                for &c in clients {
                    self.cut_until[c] = self.cut_until[c].max(end.unwrap_or(now));
                }
            }
            FaultKind::Loss { p, .. } => {
                self.loss = (end.unwrap_or(now).max(self.loss.0), p.max(self.loss.1))
            }
            FaultKind::Delay { delay: d, .. } => self.delay = (end.unwrap_or(now).max(self.delay.0), *d),
            FaultKind::Restart { clients: restarted } => {
                self.last_cut_off = Some(now);
                for &c in restarted {
                    let (gate, driver) = start_client(scenario, c, &clients.clocks[c]);
                    world.restart_client(c, &gate, scenario.clients[c].unthrottled);
                    clients.gates[c] = gate;
                    clients.drivers[c] = driver;
                    clients.polls[c] = Nanos::ZERO;
                    self.in_flight[c] = None;
                }
            }
            FaultKind::Churn { names, .. } => self.churns.push((now, end.unwrap_or(now), *names, number)),
            FaultKind::StoreLoss { .. } => {
                let gone = now.after(faults::ELECTION_LEASE);
                let back = end.unwrap_or(now).max(gone);
                self.store_lost =
                    Some(self.store_lost.map_or((gone, back), |(g, b)| (g.min(gone), b.max(back))));
            }
            FaultKind::RegionCut { regions, .. } => {
                for &r in regions {
                    self.region_cut_until[r] = self.region_cut_until[r].max(end.unwrap_or(now));
                }
            }
            // The regions step their leaders themselves (`Regions::fail`).
            FaultKind::RegionFailover { .. } => {}
            FaultKind::Drift { clients, rate } => {
                self.max_drift = self.max_drift.max(rate.abs());
                for &c in clients {
                    let client_now = self.drifts[c].at(now);
                    self.drifts[c] = Drift { anchor_real: now, anchor_client: client_now, rate: *rate };
                }
            }
        }
    }

    /// A controller comes back at `now`: a new one over the same store (made by `start`),
    /// relearning what clients hold (a failover's is elected leader at once); or, the store
    /// back, the controller that held on leads again, relearning.
    fn recover(&mut self, now: Nanos, node: &mut Node, start: &impl Fn(Nanos) -> Node) {
        let lead = |node: &Node| {
            node.cluster.set_role(now, RoleView { role: Role::Leader, leader: Some("sim".into()) })
        };
        if let Some((until, failover)) = self.down
            && until <= now
        {
            *node = start(now);
            if failover {
                lead(node);
            }
            self.down = None;
        }
        if let Some((_, back)) = self.store_lost
            && back <= now
        {
            // It stepped down while the store was gone: what its clients hold is learnt again.
            node.controller.relearn(now, tollgate_model::engine::Relearn::All);
            lead(node);
            self.store_lost = None;
        }
    }

    /// New tenants, once a second: every name arrived so far is asked for once, through the
    /// first client (which then carries more groups than one exchange).
    fn churn(&mut self, now: Nanos, gates: &[Tollgate]) {
        self.churns.retain(|&(from, until, names, id)| {
            let span = until.since(from).as_secs_f64().max(1e-9);
            let due = ((now.since(from).as_secs_f64() / span).min(1.0) * f64::from(names)).ceil() as usize;
            for k in 0..due {
                drop(gates[0].try_acquire(&format!("churn-{id}-{k}"), 1.0));
            }
            now < until
        });
    }
}

/// Whether driver `d`'s exchange is due at `now`, looked at as the exchange task looks: when
/// the limiter wakes it, at `next` (every LOW_TOKENS_CHECK at least, and when the exchange it
/// read is due), which this moves on.
fn wakes_due(d: &mut Driver, now: Nanos, next: &mut Nanos) -> bool {
    if !d.take_wake() && now < *next {
        return false;
    }
    d.poll(now);
    let due = d.due_at();
    if now < due {
        *next = due.min(now.after(LOW_TOKENS_CHECK));
        return false;
    }
    // Looked at again at the next step: the next page of a round is due once this one is
    // answered.
    *next = Nanos::ZERO;
    true
}

/// Every client whose exchange is due makes it, in the order they were started, through the
/// faults in force, to the controller (or, with regions, to its own region); answers delayed
/// by a fault arrive when due.
fn exchange_all(
    (node, regions, shards): (&Node, Option<&Regions>, Option<&Shards>),
    clients: &mut Clients,
    state: &mut FaultState,
    now: Nanos,
    up: bool,
    rng: &mut crate::rng::SplitMix64,
    tamper: Option<&dyn Fn(&mut v1::ExchangeResponse)>,
) {
    for (i, d) in clients.drivers.iter_mut().enumerate() {
        let client_now = state.drifts[i].at(now);
        if let Some((at, _)) = &state.in_flight[i] {
            if *at <= now {
                let (_, response) = state.in_flight[i].take().expect("just seen");
                d.answer(client_now, &response);
                clients.polls[i] = Nanos::ZERO;
            }
            continue;
        }
        if !wakes_due(d, client_now, &mut clients.polls[i]) {
            continue;
        }
        let Some(request) = d.request(client_now) else { continue };
        if !up {
            d.failed(client_now, &ExchangeError::Transport("no controller answers".into()));
            continue;
        }
        if state.cut_until[i] > now {
            d.failed(client_now, &ExchangeError::Transport("partitioned from the controller".into()));
            continue;
        }
        if state.loss.1 > 0.0 && rng.next_f64() < state.loss.1 {
            d.failed(client_now, &ExchangeError::Transport("exchange lost".into()));
            continue;
        }
        if regions.is_some_and(|r| r.is_down(i % r.nodes.len(), now)) {
            d.failed(client_now, &ExchangeError::Transport("the region's leader is gone".into()));
            continue;
        }
        clients.exchanges += 1;
        // With regions, each client's own region answers it; with shards, each group's owner.
        let to = regions.map_or(node, |r| &r.nodes[i % r.nodes.len()]);
        let answer = match shards {
            Some(s) => s.exchange(now, &request),
            None => to.controller.exchange(now, &request).map_err(|status| ExchangeError::of(&status)),
        };
        match answer {
            Ok(mut response) => {
                if let Some(t) = tamper {
                    t(&mut response);
                }
                if state.delay.0 > now {
                    state.in_flight[i] = Some((now.after(state.delay.1), response));
                } else {
                    d.answer(client_now, &response);
                }
            }
            Err(e) => d.failed(client_now, &e),
        }
    }
}

/// The regions under the controller (`controller.regions`): each a regional controller over
/// the same settings, and its lease on the global tier, stepped as `tollgate server --region`
/// steps them (the same [`RegionLease`]).
struct Regions {
    nodes: Vec<Node>,
    leases: Vec<RegionLease>,
    /// Each region's leader dead until (a [`FaultKind::RegionFailover`]), when another of its
    /// controllers leads.
    down_until: Vec<Option<Nanos>>,
    /// What a region's new leader opens: the settings' store and the engine's settings.
    store: MemoryStore,
    settings: EngineSettings,
    /// Pages of regions' rounds the global tier answered.
    exchanges: u64,
    /// Each region's wants of a share seen, and when it next looks for unheld groups.
    looks: Vec<(u64, Nanos)>,
}

impl Regions {
    fn new(scenario: &Scenario, store: &MemoryStore) -> Option<Regions> {
        let n = scenario.controller.regions;
        if n == 0 {
            return None;
        }
        let settings = engine_settings(scenario);
        let nodes: Vec<Node> = (0..n).map(|_| regional(store, &settings, Nanos::ZERO)).collect();
        let leases = (0..n).map(|r| RegionLease::new(&format!("r{r}"))).collect();
        Some(Regions {
            nodes,
            leases,
            down_until: vec![None; n],
            store: store.clone(),
            settings,
            exchanges: 0,
            looks: vec![(0, Nanos::ZERO); n],
        })
    }

    /// The leaders of `regions` die at `now`; others lead at `until`.
    fn fail(&mut self, regions: &[usize], until: Nanos) {
        for &r in regions {
            self.down_until[r] = Some(self.down_until[r].map_or(until, |u| u.max(until)));
        }
    }

    /// Whether region `r` has no leader at `now`.
    fn is_down(&self, r: usize, now: Nanos) -> bool {
        self.down_until[r].is_some_and(|u| now < u)
    }

    /// A region whose new leader is due at `now` gets it: a controller opened over the
    /// region's store, relearning what its clients hold, with a lease numbered from 1.
    fn elect(&mut self, now: Nanos) {
        for r in 0..self.nodes.len() {
            if self.down_until[r].is_some_and(|u| u <= now) {
                self.nodes[r] = regional(&self.store, &self.settings, now);
                self.leases[r] = RegionLease::new(&format!("r{r}"));
                self.looks[r] = (0, Nanos::ZERO);
                self.down_until[r] = None;
            }
        }
    }

    /// One step at `now`: each region ticks at `tick`, leases from `global` when due (unless
    /// the global tier is down or the region cut off), and decays shares not renewed.
    fn step(&mut self, now: Nanos, global: &Node, global_up: bool, cut_until: &[Nanos], tick: bool) {
        self.elect(now);
        for (r, (node, lease)) in self.nodes.iter().zip(&mut self.leases).enumerate() {
            if self.down_until[r].is_some() {
                continue;
            }
            // As the server's lease task does: it looks for unheld groups when a client wants a
            // share and every LOOK_EVERY, not at every step.
            let wanted = node.controller.ownership().shares_wanted();
            let look = wanted != self.looks[r].0 || now >= self.looks[r].1;
            if look {
                self.looks[r] = (wanted, now.after(LOOK_EVERY));
            }
            if lease.is_due(now, || look && node.controller.ownership().upstream_unheld()) {
                let usage = node.controller.ownership().upstream_usage();
                let mut answered = global_up && cut_until[r] <= now;
                if answered {
                    for page in lease.pages(&usage) {
                        match global.controller.exchange(now, &page.request) {
                            Ok(a) => {
                                self.exchanges += 1;
                                lease.answered(now, page, &a, &node.controller);
                            }
                            Err(_) => {
                                answered = false;
                                break;
                            }
                        }
                    }
                }
                if answered {
                    lease.round_answered(now, &usage);
                } else {
                    lease.round_failed(now);
                }
            }
            lease.decay(now, &node.controller);
            // At its turn, or at once when a share moved, as the server ticks a region.
            if tick || node.controller.pacer().take_early_tick() {
                node.controller.pacer().tick(now);
            }
        }
    }
}

/// A regional controller opened at `now` over `store`.
fn regional(store: &MemoryStore, settings: &EngineSettings, now: Nanos) -> Node {
    let node = Node::open(Box::new(store.clone()), settings.clone(), now, wall_ms(now))
        .expect("a store in memory loads");
    node.controller.ownership().set_regional();
    node
}

/// Settings changed by `action` reach the regions and the controllers the groups are sharded
/// over, as etcd's watch carries them.
fn sync_regions(action: &Action, regions: Option<&Regions>, shards: Option<&Shards>, now: Nanos) {
    let nodes =
        regions.into_iter().flat_map(|r| r.nodes.iter()).chain(shards.into_iter().flat_map(Shards::nodes));
    for node in nodes {
        match action {
            Action::SetGroup { name, settings } => {
                node.controller.admin().sync_group(name.clone(), Some((**settings).clone()), wall_ms(now));
            }
            Action::RemoveGroup(name) => {
                node.controller.admin().sync_group(name.clone(), None, wall_ms(now));
            }
            _ => {}
        }
    }
}

/// Where a run stands: the phase under way and how long its expectations have held, the
/// results and samples so far, and the invariants' checker.
struct Progress {
    phases: Vec<PhaseResult>,
    timeline: Vec<Sample>,
    /// Whether samples are kept in the timeline.
    keep: bool,
    phase: usize,
    phase_start: Nanos,
    held: u32,
    checker: Checker,
    breach: Option<Breach>,
}

impl Progress {
    /// No phase begun yet, over `groups` groups, keeping the samples or not.
    fn new(groups: usize, keep: bool) -> Self {
        Progress {
            phases: Vec::new(),
            timeline: Vec::new(),
            keep,
            phase: 0,
            phase_start: Nanos::ZERO,
            held: 0,
            checker: Checker::new(groups),
            breach: None,
        }
    }

    /// The run's outcome: the phases not reached count as failed.
    fn outcome(
        self,
        scenario: &Scenario,
        seed: u64,
        groups: Vec<GroupName>,
        exchanges: Exchanges,
    ) -> Outcome {
        let Progress { mut phases, timeline, breach, .. } = self;
        while phases.len() < scenario.phases.len() {
            phases.push(PhaseResult { passed: false, converged_s: None });
        }
        Outcome {
            seed,
            groups,
            backends: scenario.backends.iter().map(|b| b.name.clone()).collect(),
            phases,
            timeline,
            breach,
            exchanges,
        }
    }

    /// The figures of the second ending at `now`: checked against the invariants (with faults)
    /// and the phase's expectations. Says whether the run is over.
    #[allow(clippy::too_many_arguments)]
    fn second(
        &mut self,
        now: Nanos,
        scenario: &Scenario,
        node: &Node,
        (regions, shards): (Option<&Regions>, Option<&Shards>),
        world: &mut World,
        groups: &[GroupName],
        state: &FaultState,
        up: bool,
        checking: bool,
        run_until: Nanos,
    ) -> bool {
        // With shards, each group is read at its owner.
        let controllers: Vec<&Controller> = match shards {
            Some(s) => s.running(now).map(|n| &*n.controller).collect(),
            None => vec![&node.controller],
        };
        let sample = sample(now, &controllers, world, groups);
        if let Some(detail) = shards.and_then(|s| s.breach.clone())
            && self.breach.is_none()
        {
            let group = GroupName::default_group();
            self.breach = Some(Breach { t: now.as_secs_f64(), invariant: "one owner", group, detail });
        }
        if checking && self.breach.is_none() {
            let seconds = second_figures(scenario, &controllers, up, &sample, groups);
            self.check_second(now, groups, seconds, state, up);
        }
        let current = &scenario.phases[self.phase];
        if up && current.expects.iter().all(|e| holds(e, &sample, groups)) {
            self.held += 1;
        } else {
            self.held = 0;
        }
        if self.keep {
            self.timeline.push(sample);
        }
        if self.breach.is_some() {
            self.phases.push(PhaseResult { passed: false, converged_s: None });
            return true;
        }
        let elapsed = now.since(self.phase_start);
        let last = self.phase + 1 == scenario.phases.len();
        if self.held >= current.hold_checks && (!last || now >= run_until) {
            self.phases.push(PhaseResult { passed: true, converged_s: Some(elapsed.as_secs_f64()) });
            self.phase += 1;
            self.phase_start = now;
            self.held = 0;
            let Some(p) = scenario.phases.get(self.phase) else { return true };
            for a in &p.actions {
                apply(a, &node.controller, world, now);
                sync_regions(a, regions, shards, now);
            }
            false
        } else if elapsed >= current.timeout {
            self.phases.push(PhaseResult { passed: false, converged_s: None });
            true
        } else {
            false
        }
    }

    /// Holds one second's figures to the invariants, forgiving what a cut-off or a heal under
    /// way explains; the first breach is kept.
    fn check_second(
        &mut self,
        now: Nanos,
        groups: &[GroupName],
        seconds: Vec<Second>,
        state: &FaultState,
        up: bool,
    ) {
        let heal = Duration::from_secs_f64(HEAL_S);
        let cut_recent =
            state.last_cut_off.is_some_and(|t| now.since(t) < heal + Duration::from_secs(WINDOW_S as u64));
        let cut = state.cut_until.iter().any(|&c| c > now) || state.loss.1 > 0.0;
        let healed = up && !cut && now.since(state.healed_at) >= heal && state.healed_at <= now;
        if let Err(b) =
            self.checker.check(now.as_secs_f64(), groups, seconds, cut_recent, healed, state.max_drift)
        {
            self.breach = Some(b);
        }
    }
}

/// Runs `scenario` with `seed` and `hooks`: faults and invariants included.
pub fn run_with(scenario: &Scenario, seed: u64, mut hooks: RunHooks<'_>) -> Outcome {
    let groups = group_names(scenario);
    let store = MemoryStore::with(stored(scenario));
    let tracing = hooks.trace.is_some();
    let start = |now: Nanos| {
        let node = Node::open(Box::new(store.clone()), engine_settings(scenario), now, wall_ms(now))
            .expect("a store in memory loads");
        node.controller.readings().set_tracing(tracing);
        node
    };
    let mut node = start(Nanos::ZERO);
    let (faults, run_until) = faults_of(scenario, seed);
    let checking = !faults.is_empty();
    let mut fault_rng = crate::rng::SplitMix64::new(seed ^ 0x10_55E5);
    let n = scenario.clients.len();
    let mut clients = Clients::new(scenario);
    let mut world = World::new(scenario, &groups, &clients.gates, seed);
    let mut regions = Regions::new(scenario, &store);
    let mut shards = (scenario.controller.controllers > 1).then(|| {
        let c = &scenario.controller;
        Shards::new(c.controllers, c.shards, c.capacity, seed, &start)
    });
    let first = scenario.phases.first().map(|p| &p.actions[..]).unwrap_or_default();
    for a in scenario.actions.iter().chain(first) {
        apply(a, &node.controller, &mut world, Nanos::ZERO);
        sync_regions(a, regions.as_ref(), shards.as_ref(), Nanos::ZERO);
    }
    let mut state = FaultState::new(n, scenario.controller.regions);
    let mut next_fault = 0usize;
    let step_ns = duration_nanos(STEP);
    let tick_ns = duration_nanos(scenario.controller.tick).max(step_ns);
    let report_ns = scenario.controller.report_every.map_or(tick_ns, |d| duration_nanos(d).max(step_ns));
    let second_ns = 1_000_000_000u64;
    let mut progress = Progress::new(groups.len(), !hooks.verdicts_only);
    let mut now = Nanos::ZERO;
    loop {
        while let Some(f) = faults.get(next_fault).filter(|f| duration_nanos(f.at) <= now.0) {
            next_fault += 1;
            state.begin(f, next_fault, now, scenario, &mut clients, &mut world);
            crash_one((&mut shards, &mut regions), f, next_fault, now, &mut state);
        }
        if state.loss.0 <= now {
            state.loss.1 = 0.0;
        }
        state.recover(now, &mut node, &start);
        let up = state.down.is_none() && state.store_lost.is_none_or(|(gone, _)| now < gone);
        if state.cut_until.iter().chain(&state.region_cut_until).any(|&c| c > now) || state.loss.1 > 0.0 {
            state.last_cut_off = Some(now);
        }
        // The backends report (at each tick unless `report_ms` says otherwise), then the
        // controller ticks at its turn, or at once for a backend newly saturated, as the
        // server does; then every client whose exchange is due makes it.
        let due = (now.0.is_multiple_of(report_ns), now.0.is_multiple_of(tick_ns));
        let ticked = match &mut shards {
            Some(s) => {
                s.report_and_step(now, up, due, &mut world, &start);
                false
            }
            None => report_and_tick(now, &node, up, due, &mut world),
        };
        // Consumption is written to the store as the server writes it: what a controller
        // started again over the store learns from.
        if up && shards.is_none() && now.0.is_multiple_of(duration_nanos(FLUSH)) {
            node.flush(now, wall_ms(now)).expect("a store in memory writes");
        }
        if ticked && let Some(sink) = hooks.trace.as_mut() {
            for event in node.controller.readings().take_trace().0 {
                sink(event);
            }
        }
        // The regions tick and lease from the global tier; their clients reach them whatever
        // becomes of the global tier.
        let clients_up = match &mut regions {
            Some(r) => {
                r.step(now, &node, up, &state.region_cut_until, now.0.is_multiple_of(tick_ns));
                true
            }
            None => up,
        };
        exchange_all(
            (&node, regions.as_ref(), shards.as_ref()),
            &mut clients,
            &mut state,
            now,
            clients_up,
            &mut fault_rng,
            hooks.tamper,
        );
        if now.0 > 0
            && now.0.is_multiple_of(second_ns)
            && progress.second(
                now,
                scenario,
                &node,
                (regions.as_ref(), shards.as_ref()),
                &mut world,
                &groups,
                &state,
                up,
                checking,
                run_until,
            )
        {
            break;
        }
        now = Nanos(now.0 + step_ns);
        for (i, c) in clients.clocks.iter().enumerate() {
            c.set(state.drifts[i].at(now));
        }
        world.step(now, STEP.as_secs_f64());
        if now.0.is_multiple_of(second_ns) {
            state.churn(now, &clients.gates);
        }
    }
    let regions = regions.map_or(0, |r| r.exchanges);
    progress.outcome(scenario, seed, groups, Exchanges { clients: clients.exchanges, regions })
}

/// With shards, a crash takes one controller down (the `which`th), not every one: the
/// fault's downtime is that controller's, and the run's controller stays up. With regions, a
/// region's failover takes its leader down.
fn crash_one(
    (shards, regions): (&mut Option<Shards>, &mut Option<Regions>),
    f: &crate::faults::Fault,
    which: usize,
    now: Nanos,
    state: &mut FaultState,
) {
    if let (Some(r), FaultKind::RegionFailover { regions: failed, down }) = (regions, &f.kind) {
        r.fail(failed, now.after(*down));
    }
    if let (Some(s), FaultKind::Crash { down } | FaultKind::Failover { down }) = (shards, &f.kind) {
        s.crash(which, now, *down);
        state.down = None;
    }
}

/// The faults of a run with `seed`, in time order, and how long it goes on: until the last
/// has healed and the invariants have been checked for a while after it, even when its
/// phases pass sooner.
fn faults_of(scenario: &Scenario, seed: u64) -> (Vec<crate::faults::Fault>, Nanos) {
    let mut faults = scenario.faults.clone();
    if let Some(random) = &scenario.random_faults {
        faults.extend(crate::faults::draw(random, seed, scenario.clients.len(), scenario.controller.regions));
    }
    faults.sort_by_key(|f| f.at);
    let run_until = faults.iter().map(|f| f.end().unwrap_or(f.at)).max().map_or(Nanos::ZERO, |e| {
        Nanos(duration_nanos(e + Duration::from_secs_f64(HEAL_S) + Duration::from_secs(2 * WINDOW_S as u64)))
    });
    (faults, run_until)
}

/// How often consumption is written to the store: the server's default.
const FLUSH: Duration = Duration::from_secs(10);

/// The wall clock of a run: Unix time 0 at its start.
fn wall_ms(now: Nanos) -> u64 {
    now.0 / 1_000_000
}

/// At `now`, the backends report to the controller when `due.0`, and it ticks when `due.1`
/// or at once for a backend newly saturated; says whether it ticked.
fn report_and_tick(now: Nanos, node: &Node, up: bool, due: (bool, bool), world: &mut World) -> bool {
    if up && due.0 {
        for report in world.backend_reports(now) {
            node.controller
                .backend_report(now, &tollgate_proto::wire::ReportView::of(&report))
                .expect("scenario backends are valid");
        }
    }
    if up && due.1 {
        node.controller.pacer().tick(now);
        true
    } else if up && node.controller.pacer().take_early_tick() {
        node.controller.pacer().tick_early_paced(now, || {});
        true
    } else {
        false
    }
}

/// Each group's figures for the invariants at one second.
fn second_figures(
    scenario: &Scenario,
    controllers: &[&Controller],
    up: bool,
    sample: &Sample,
    groups: &[GroupName],
) -> Vec<Second> {
    // The scenario's groups' views only (a churn's names are not checked), the last
    // controller's that has one.
    let mut views: Vec<Option<tollgate_model::engine::GroupView>> = vec![None; groups.len()];
    if up {
        for c in controllers {
            c.with_engine(|e| {
                for (view, name) in views.iter_mut().zip(groups) {
                    if let Some(v) = e.group_view(name) {
                        *view = Some(v);
                    }
                }
            });
        }
    }
    let controller = controllers.first().copied().expect("a controller runs");
    let unthrottled: std::collections::BTreeSet<&GroupName> =
        scenario.clients.iter().filter(|c| c.unthrottled).flat_map(|c| c.groups()).collect();
    groups
        .iter()
        .enumerate()
        .map(|(i, name)| {
            // Its own settings, a pattern's that matches it, or the default group's.
            let settings = controller.admin().settings_for(name);
            let view = views[i].as_ref();
            Second {
                admitted: sample.groups[i].admitted_units,
                // A group in shadow mode is never held to its limit: that is what it is for.
                limit: settings
                    .as_ref()
                    .filter(|s| !s.shadow())
                    .map(|s| s.limit().as_f64())
                    .filter(|l| l.is_finite()),
                reserved: settings.as_ref().map_or(0.0, |s| s.reserved()),
                demand: up.then_some(sample.groups[i].demand_units),
                granted: view.and_then(|v| v.target.map(|t| (v.granted, t))),
                unthrottled: unthrottled.contains(name),
            }
        })
        .collect()
}

/// Metrics at `now`: what the world admitted over the last second, what the controller set.
fn sample(now: Nanos, controllers: &[&Controller], world: &mut World, groups: &[GroupName]) -> Sample {
    let mut out = Sample { t: now.as_secs_f64(), ..Sample::default() };
    out.groups = world
        .take_second()
        .into_iter()
        .map(|a| GroupSample {
            admitted_rps: a.requests,
            admitted_units: a.units,
            by_class: a.by_class,
            ..GroupSample::default()
        })
        .collect();
    for controller in controllers {
        controller.with_engine(|engine| read_outcomes(engine, groups, &mut out));
    }
    out.utilisation = world.utilisation(now);
    out.served = world.take_served();
    out
}

/// The outcomes of the groups `engine` computes, into `out`.
fn read_outcomes(engine: &tollgate_model::engine::Engine, groups: &[GroupName], out: &mut Sample) {
    {
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
        out.tracked_groups += engine.tracked_groups() as f64;
    }
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
                "critical_rps" => Some(g.by_class[0]),
                "normal_rps" => Some(g.by_class[1]),
                "sheddable_rps" => Some(g.by_class[2]),
                _ => None,
            }
        }
        Subject::Backend(i) => {
            let served = s.served.get(*i).copied().flatten();
            match e.metric.as_str() {
                "learned_limit" => served.map(|q| q.limit),
                "learned_capacity" => served.map(|q| q.capacity).filter(|c| c.is_finite()),
                "goodput" => served.map(|q| q.goodput),
                "latency_ms" => served.map(|q| q.latency_ms).filter(|l| l.is_finite()),
                _ => s.utilisation.get(*i).copied(),
            }
        }
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

/// Runs `count` seeds from `first` on up to `threads` threads: each seed with the invariant
/// that broke, if one did, in seed order.
pub fn run_seeds(scenario: &Scenario, first: u64, count: u64, threads: usize) -> Vec<(u64, Option<Breach>)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(count as usize));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let seed = first.wrapping_add(i);
                    let hooks = RunHooks { verdicts_only: true, ..RunHooks::default() };
                    let breach = run_with(scenario, seed, hooks).breach;
                    results.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((seed, breach));
                }
            });
        }
    });
    let mut out = results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    out.sort_by_key(|(seed, _)| *seed);
    out
}
