//! The simulated world around Tollgate: clients offering work and mock backends serving it.
//!
//! Each client attempts `rate` requests per second for each of its groups, each costing
//! `cost` units, and admits them through a real [`Tollgate`] handle (whatever feeds it). A
//! client's work for a group acts only at the steps where a request arrives or waits (kept
//! by step in a wheel); its arrivals in between are counted when it next acts. Refused
//! requests wait in the client's queue, which it reports to its handle as queued work, and are
//! retried every step: nothing is dropped. Each admitted request's cost is spread evenly over the
//! client's backends, as FoundationDB's mock clients do. A backend of capacity `C` reports
//! queue bytes = its load (smoothed with a 10 s folding time, or its `folding_s`) ÷ C ×
//! 800e6, and the load each group puts on it.
//!
//! A backend with `workers` is a queueing backend instead: each request admitted is a job of
//! its cost (times a uniform draw from 0.5 to 1.5, so service times vary); `workers` jobs are served at
//! once at `capacity ÷ workers` units/s each, and more jobs share the workers (processor
//! sharing), so latency grows with the work in flight. The backend admits jobs up to a limit
//! it learns from their latency ([`LatencyLimit`]); the rest wait, and a job waiting past
//! [`QUEUE_WAIT_MAX`] is shed. It reports its utilisation as Little's law gives it: jobs
//! arriving a second × their latency ÷ the learned limit, so that at 1 it runs at its limit,
//! serving what arrives. Its capacity is never reported.
//!
//! The world holds no model of Tollgate: the simulator and the tests that run a real server
//! over a simulated network drive the same world, so their runs can be compared.

use std::collections::VecDeque;
use std::time::Duration;

use tollgate_limiter::{GroupHandle, RequestClass, Tollgate};
use tollgate_model::adaptive::{LatencyLimit, LearnSettings};
use tollgate_model::settings::GroupName;
use tollgate_model::smooth::Smoother;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;

use crate::rng::SplitMix64;
use crate::scenario::Scenario;

/// Steps ahead the world keeps its work by step (2.56 s at 10 ms steps).
const WHEEL: u64 = 256;

/// Queue bytes of a mock backend at utilisation 1.
pub const QUEUE_AT_CAPACITY: f64 = 800e6;

/// One client's work for one of its groups.
struct Client {
    /// The scenario's client it is part of.
    client: usize,
    group: usize,
    rate: f64,
    cost: f64,
    /// What each request asks for up front (settled at `cost`).
    asks: f64,
    backends: std::sync::Arc<[usize]>,
    handle: GroupHandle,
    /// Refused requests wait to be tried again (else they are gone).
    queue: bool,
    /// The share of its requests in each class, and each class's arrivals and queue.
    mix: [f64; 3],
    arrivals: [f64; 3],
    backlog: [u64; 3],
    // Since the last sample.
    sec_units: f64,
    sec_requests: f64,
    sec_by_class: [f64; 3],
    /// The step its arrivals were counted up to, and the step it is next looked at (a request
    /// due to arrive, or one waiting to be tried again): only then does it act.
    at: u64,
    due: u64,
}

impl Client {
    /// Counts its arrivals up to step `step` (no request arrives before its due step).
    fn catch_up(&mut self, step: u64, dt_s: f64) {
        let steps = step.saturating_sub(self.at) as f64;
        for (a, share) in self.arrivals.iter_mut().zip(self.mix) {
            *a += self.rate * share * dt_s * steps;
        }
        self.at = step;
    }

    /// The step after `step` at which it next acts: the next one while requests wait, else
    /// the first at which a class's arrivals reach a whole request (`u64::MAX`: never, at a
    /// rate of nothing).
    fn next_due(&self, step: u64, dt_s: f64) -> u64 {
        if self.queue && self.backlog.iter().any(|&b| b > 0) {
            return step + 1;
        }
        let mut due = u64::MAX;
        for (a, share) in self.arrivals.iter().zip(self.mix) {
            let per_step = self.rate * share * dt_s;
            if per_step <= 0.0 {
                continue;
            }
            // Counted as catch_up counts them, so the request arrives at exactly this step.
            let mut n = ((1.0 - a) / per_step).ceil().max(1.0) as u64;
            while n > 1 && a + per_step * (n - 1) as f64 >= 1.0 {
                n -= 1;
            }
            while a + per_step * (n as f64) < 1.0 {
                n += 1;
            }
            due = due.min(step + n);
        }
        due
    }
}

struct Backend {
    name: String,
    capacity: f64,
    zone: String,
    load: Smoother,
    per_group: Vec<Smoother>,
    step_units: Vec<f64>,
    /// The groups with units in `step_units` this step: only they are added up.
    stepped: Vec<usize>,
    queueing: Option<Queueing>,
}

/// How long a job waits for a queueing backend's limit before it is shed.
pub const QUEUE_WAIT_MAX: Duration = Duration::from_secs(1);
/// The most jobs a queueing backend holds, running and waiting.
pub const JOBS_MAX: usize = 100_000;

/// One request's work on a queueing backend.
struct Job {
    /// Units left to serve.
    left: f64,
    units: f64,
    arrived: Nanos,
    started: Nanos,
    in_flight: usize,
}

/// A queueing backend's state. See the [module documentation](self).
struct Queueing {
    workers: f64,
    limit: LatencyLimit,
    running: Vec<Job>,
    waiting: VecDeque<Job>,
    /// Jobs arriving, smoothed as the load is.
    arriving: Smoother,
    /// Since the last sample: units served, and the latencies of finished jobs.
    sec_served: f64,
    sec_latency: (f64, u64),
    /// Jobs shed so far.
    shed: u64,
}

/// A queueing backend's figures over the last second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Served {
    /// Its learned limit (work in flight).
    pub limit: f64,
    /// The requests a second that limit sustains, by Little's law: the limit over the latency
    /// of the last window (NaN before one).
    pub capacity: f64,
    /// Units served in the second.
    pub goodput: f64,
    /// The mean latency of the jobs finished in the second, ms (NaN when none finished).
    pub latency_ms: f64,
}

impl Queueing {
    fn new(workers: u32, folding_s: f64) -> Queueing {
        Queueing {
            workers: f64::from(workers),
            limit: LatencyLimit::new(LearnSettings::default(), Nanos::ZERO),
            running: Vec::new(),
            waiting: VecDeque::new(),
            arriving: Smoother::new(folding_s),
            sec_served: 0.0,
            sec_latency: (0.0, 0),
            shed: 0,
        }
    }

    /// One step of `dt_s` ending at `now` on a backend of `capacity` units/s.
    fn step(&mut self, now: Nanos, dt_s: f64, capacity: f64) {
        let n = self.running.len() as f64;
        let each = capacity / self.workers * (self.workers / n.max(1.0)).min(1.0) * dt_s;
        let mut served = 0.0;
        let limit = &mut self.limit;
        let latency = &mut self.sec_latency;
        self.running.retain_mut(|job| {
            job.left -= each;
            if job.left > 0.0 {
                return true;
            }
            let took = now.since(job.started);
            limit.sample(now, took, job.in_flight);
            latency.0 += took.as_secs_f64();
            latency.1 += 1;
            served += job.units;
            false
        });
        self.sec_served += served;
        // Jobs that waited too long are shed; the rest start as the limit allows.
        while self.waiting.front().is_some_and(|j| now.since(j.arrived) > QUEUE_WAIT_MAX) {
            self.waiting.pop_front();
            self.shed += 1;
        }
        while self.running.len() < self.limit.limit() {
            let Some(mut job) = self.waiting.pop_front() else { break };
            job.started = now;
            job.in_flight = self.running.len() + 1;
            self.running.push(job);
        }
    }

    fn arrive(&mut self, now: Nanos, units: f64, work: f64) {
        self.arriving.add_delta(now, 1.0);
        if self.running.len() + self.waiting.len() >= JOBS_MAX {
            self.shed += 1;
            return;
        }
        self.waiting.push_back(Job { left: work, units, arrived: now, started: now, in_flight: 0 });
    }

    /// Utilisation by Little's law, from the smoothed `arriving` units/s.
    fn utilisation(&self, now: Nanos) -> f64 {
        self.limit.utilisation(self.arriving.clone().smooth_rate(now).max(0.0))
    }
}

/// What each group was admitted in the last second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Admitted {
    /// Requests.
    pub requests: f64,
    /// Units.
    pub units: f64,
    /// Requests by class: critical, normal, sheddable.
    pub by_class: [f64; 3],
}

/// Clients and backends. See the [module documentation](self).
pub struct World {
    groups: Vec<GroupName>,
    /// Each client's work for each of its groups, the scenario's clients in order.
    clients: Vec<Client>,
    backends: Vec<Backend>,
    /// Service time draws for queueing backends.
    rng: SplitMix64,
    /// Steps taken so far, and how long the last was (seconds; 0 before the first).
    steps: u64,
    dt_s: f64,
    /// The work due to act in each of the next [`WHEEL`] steps (at `step % WHEEL`, a bit for
    /// each entry: taken in the order of the work), and later (`far`, brought into the wheel
    /// as its turn comes). An entry whose `due` moved since it was put there is passed over.
    wheel: Vec<Vec<u64>>,
    far: Vec<u32>,
}

impl World {
    /// The world of `scenario`, with client `i` admitting through `gates[i]` (unthrottled
    /// clients through an unthrottled handle). Arrival phases come from `seed`.
    pub fn new(scenario: &Scenario, groups: &[GroupName], gates: &[Tollgate], seed: u64) -> World {
        assert_eq!(gates.len(), scenario.clients.len(), "one handle per client");
        let mut rng = SplitMix64::new(seed);
        let at: std::collections::HashMap<&GroupName, usize> =
            groups.iter().enumerate().map(|(i, g)| (g, i)).collect();
        let index = |name: &GroupName| *at.get(name).expect("every client's group is listed");
        let mut clients = Vec::new();
        for (i, (spec, gate)) in scenario.clients.iter().zip(gates).enumerate() {
            let cost = scenario.cost_model.cost(&spec.usage).expect("scenario costs are validated");
            let gate = if spec.unthrottled { gate.unthrottled() } else { gate.clone() };
            let backends: std::sync::Arc<[usize]> = spec.backends.clone().into();
            for group in spec.groups() {
                clients.push(Client {
                    client: i,
                    group: index(group),
                    rate: spec.rate,
                    cost,
                    asks: spec.asks.unwrap_or(cost),
                    backends: backends.clone(),
                    queue: spec.queue,
                    handle: gate.group(group.as_str()).expect("scenario group names are valid"),
                    mix: spec.mix,
                    arrivals: std::array::from_fn(|_| rng.next_f64()),
                    backlog: [0; 3],
                    sec_units: 0.0,
                    sec_requests: 0.0,
                    sec_by_class: [0.0; 3],
                    at: 0,
                    due: 0,
                });
            }
        }
        assert!(u32::try_from(clients.len()).is_ok(), "the scenario's bounds keep the work countable");
        let backends = scenario
            .backends
            .iter()
            .map(|b| Backend {
                name: b.name.clone(),
                capacity: b.capacity,
                zone: b.zone.clone(),
                load: Smoother::new(b.folding_s),
                per_group: groups.iter().map(|_| Smoother::new(b.folding_s)).collect(),
                step_units: vec![0.0; groups.len()],
                stepped: Vec::new(),
                queueing: b.workers.map(|w| Queueing::new(w, b.folding_s)),
            })
            .collect();
        let clients_n = clients.len();
        let mut world = World {
            groups: groups.to_vec(),
            clients,
            backends,
            rng: SplitMix64::new(seed ^ 0x005E_ED0F_10B5),
            steps: 0,
            dt_s: 0.0,
            wheel: vec![vec![0; clients_n.div_ceil(64)]; WHEEL as usize],
            far: Vec::new(),
        };
        // Each acts first at the first step (its queued work is told to its handle), and then
        // when its requests arrive.
        for e in 0..world.clients.len() {
            world.schedule(e, 1);
        }
        world
    }

    /// Work `e` acts next at step `due`.
    fn schedule(&mut self, e: usize, due: u64) {
        self.clients[e].due = due;
        if due == u64::MAX {
            return;
        }
        if due - self.steps < WHEEL {
            self.wheel[(due % WHEEL) as usize][e / 64] |= 1 << (e % 64);
        } else {
            self.far.push(e as u32);
        }
    }

    /// Client `i` restarted: it admits through `gate` from now on (unthrottled as its spec
    /// says), with nothing waiting.
    pub fn restart_client(&mut self, i: usize, gate: &Tollgate, unthrottled: bool) {
        let gate = if unthrottled { gate.unthrottled() } else { gate.clone() };
        let step = self.steps;
        for e in self.work_of(|c| c.client == i) {
            let c = &mut self.clients[e];
            c.handle = gate.group(self.groups[c.group].as_str()).expect("scenario group names are valid");
            c.backlog = [0; 3];
            self.schedule(e, step + 1);
        }
    }

    /// The work entries `which` picks, in order.
    fn work_of(&self, which: impl Fn(&Client) -> bool) -> Vec<usize> {
        (0..self.clients.len()).filter(|&e| which(&self.clients[e])).collect()
    }

    /// One step of `dt_s` seconds ending at `now`: arrivals, admissions, and the load they put
    /// on the backends. Only the work with a request arriving or waiting acts: the rest is
    /// counted up when it next does, as if it had stepped.
    pub fn step(&mut self, now: Nanos, dt_s: f64) {
        self.steps += 1;
        self.dt_s = dt_s;
        let step = self.steps;
        if step.is_multiple_of(WHEEL) {
            for e in std::mem::take(&mut self.far) {
                let due = self.clients[e as usize].due;
                if due != u64::MAX && due >= step {
                    self.schedule(e as usize, due);
                }
            }
        }
        // In the order of the work, as the scenario lists its clients.
        let slot = (step % WHEEL) as usize;
        for w in 0..self.wheel[slot].len() {
            let mut bits = std::mem::take(&mut self.wheel[slot][w]);
            while bits != 0 {
                let e = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.clients[e].due == step {
                    self.act_due(e, now, step, dt_s);
                }
            }
        }
        for b in &mut self.backends {
            if let Some(q) = &mut b.queueing {
                q.step(now, dt_s, b.capacity);
            }
            let mut total = 0.0;
            for g in b.stepped.drain(..) {
                let units = std::mem::take(&mut b.step_units[g]);
                b.per_group[g].add_delta(now, units);
                total += units;
            }
            b.load.add_delta(now, total);
        }
    }

    /// Work `e`, due at `step` (ending at `now`), acts and is put where it acts next.
    fn act_due(&mut self, e: usize, now: Nanos, step: u64, dt_s: f64) {
        self.act(e, now, step, dt_s);
        let next = self.clients[e].next_due(step, dt_s);
        self.schedule(e, next);
    }

    /// Work `e` acts at `step` (ending at `now`): its arrivals, then what its handle admits.
    fn act(&mut self, e: usize, now: Nanos, step: u64, dt_s: f64) {
        let c = &mut self.clients[e];
        c.catch_up(step, dt_s);
        // Sheddable work first, critical last: the classes, not the order, decide.
        for class in RequestClass::ALL.into_iter().rev() {
            let k = class as usize;
            let new = c.arrivals[k].floor();
            c.arrivals[k] -= new;
            c.backlog[k] += new as u64;
            while c.backlog[k] > 0 {
                let Ok(permit) = c.handle.try_acquire_class(c.asks, class) else {
                    if c.queue {
                        break;
                    }
                    // Refused and gone: the next request is tried, and counted, on its own.
                    c.backlog[k] -= 1;
                    continue;
                };
                if c.asks != c.cost {
                    let _ = permit.settle(c.cost);
                }
                c.backlog[k] -= 1;
                c.sec_units += c.cost;
                c.sec_requests += 1.0;
                c.sec_by_class[k] += 1.0;
                // Each request's cost is spread evenly over the client's backends.
                let share = c.cost / c.backends.len().max(1) as f64;
                for &b in c.backends.iter() {
                    let backend = &mut self.backends[b];
                    if backend.step_units[c.group] == 0.0 {
                        backend.stepped.push(c.group);
                    }
                    backend.step_units[c.group] += share;
                    if let Some(q) = &mut backend.queueing {
                        // A service time of mean `share`, half to one and a half of it.
                        let work = share * (0.5 + self.rng.next_f64());
                        q.arrive(now, share, work);
                    }
                }
            }
        }
        // What is still waiting is demand, as an application with its own queue says.
        c.handle.set_queued(c.backlog.iter().sum::<u64>() as f64 * c.asks);
    }

    /// Every backend's report at `now`, in the contract's form.
    pub fn backend_reports(&mut self, now: Nanos) -> Vec<v1::BackendReport> {
        let groups = &self.groups;
        self.backends
            .iter_mut()
            .map(|b| {
                let load = b.load.smooth_rate(now).max(0.0);
                let mut loads: Vec<(&GroupName, f64)> = groups
                    .iter()
                    .enumerate()
                    .map(|(g, name)| (name, b.per_group[g].smooth_rate(now).max(0.0)))
                    .filter(|(_, l)| *l > 0.0)
                    .collect();
                // The busiest groups, as many as a report holds, as the backend reporter sends.
                if loads.len() > tollgate_proto::REPORT_GROUPS_MAX {
                    loads.sort_by(|a, b| b.1.total_cmp(&a.1));
                    loads.truncate(tollgate_proto::REPORT_GROUPS_MAX);
                }
                let loads = loads
                    .into_iter()
                    .map(|(name, l)| v1::GroupLoad { group: name.to_string(), units_per_s: l })
                    .collect();
                let health = match &b.queueing {
                    Some(q) => v1::backend_report::Health::Utilisation(q.utilisation(now)),
                    None => v1::backend_report::Health::QueueBytes(load / b.capacity * QUEUE_AT_CAPACITY),
                };
                v1::BackendReport {
                    backend_id: b.name.clone(),
                    zone: b.zone.clone(),
                    health: Some(health),
                    loads,
                    // Mock backends say no capacity: they report their queue, or what their
                    // learned limit makes of it.
                    capacity: None,
                }
            })
            .collect()
    }

    /// What each group was admitted since the last call (one simulated second).
    pub fn take_second(&mut self) -> Vec<Admitted> {
        let mut out = vec![Admitted::default(); self.groups.len()];
        for c in &mut self.clients {
            out[c.group].requests += c.sec_requests;
            out[c.group].units += c.sec_units;
            for (total, n) in out[c.group].by_class.iter_mut().zip(std::mem::take(&mut c.sec_by_class)) {
                *total += n;
            }
            c.sec_requests = 0.0;
            c.sec_units = 0.0;
        }
        out
    }

    /// Each backend's utilisation at `now`: its load over its capacity, or for a queueing
    /// backend what it reports.
    pub fn utilisation(&self, now: Nanos) -> Vec<f64> {
        self.backends
            .iter()
            .map(|b| {
                let load = b.load.clone().smooth_rate(now).max(0.0);
                match &b.queueing {
                    Some(q) => q.utilisation(now),
                    None => load / b.capacity,
                }
            })
            .collect()
    }

    /// What each queueing backend served since the last call (one simulated second); `None`
    /// for the others.
    pub fn take_served(&mut self) -> Vec<Option<Served>> {
        self.backends
            .iter_mut()
            .map(|b| {
                let q = b.queueing.as_mut()?;
                let (sum, n) = std::mem::take(&mut q.sec_latency);
                let latency = q.limit.latency().map_or(f64::NAN, |l| l.as_secs_f64());
                Some(Served {
                    limit: q.limit.estimate(),
                    capacity: q.limit.estimate() / latency,
                    goodput: std::mem::take(&mut q.sec_served),
                    latency_ms: if n == 0 { f64::NAN } else { sum / n as f64 * 1e3 },
                })
            })
            .collect()
    }

    /// Jobs each queueing backend has shed (0 for the others).
    pub fn shed(&self) -> Vec<u64> {
        self.backends.iter().map(|b| b.queueing.as_ref().map_or(0, |q| q.shed)).collect()
    }

    /// Changes a backend's capacity.
    pub fn set_backend_capacity(&mut self, backend: usize, capacity: f64) {
        self.backends[backend].capacity = capacity;
    }

    /// Every client of `group` settles one request `units` dearer than admitted (a free
    /// request, settled at `units`): the client's own debt rule applies.
    pub fn settle(&mut self, group: &GroupName, units: f64) {
        let Some(g) = self.groups.iter().position(|n| n == group) else { return };
        for c in self.clients.iter().filter(|c| c.group == g) {
            if let Ok(permit) = c.handle.try_acquire(0.0) {
                let _ = permit.settle(units);
            }
        }
    }

    /// Every client of `group` attempts `rate` requests per second from now on.
    pub fn set_client_rate(&mut self, group: &GroupName, rate: f64) {
        let Some(g) = self.groups.iter().position(|n| n == group) else { return };
        for e in self.work_of(|c| c.group == g) {
            self.set_rate(e, rate);
        }
    }

    /// Work `e` attempts `rate` requests per second from now on: what arrived at the old rate
    /// is counted first, and it acts at the next step.
    fn set_rate(&mut self, e: usize, rate: f64) {
        let (step, dt_s) = (self.steps, self.dt_s);
        let c = &mut self.clients[e];
        c.catch_up(step, dt_s);
        c.rate = rate;
        self.schedule(e, step + 1);
    }

    /// Client `index` (in the scenario's order) attempts `rate` requests per second from now on.
    pub fn set_one_client_rate(&mut self, index: usize, rate: f64) {
        for e in self.work_of(|c| c.client == index) {
            self.set_rate(e, rate);
        }
    }
}
