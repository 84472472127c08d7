//! The storage side in virtual time: backends that schedule their queued work fairly, as
//! TiKV's stores do, with or without dmClock's cross-backend term, and hold each group to its
//! share of its limit on each backend, with or without lending idle capacity.
//!
//! Each backend serves `capacity` units/s from its own [`FairQueue`], in steps of 1 ms. Each
//! group offers work to each backend at its own rate (`f64::INFINITY`: always some waiting),
//! in requests whose costs follow its `sizes` in turn (one unit each unless set). Every 250 ms each backend reports the units/s each group brought it
//! (smoothed over 1 s, as the backend reporter does) to one [`Spread`], the controller's
//! part, and with `cross` on charges the answer to its queue through a [`CrossCharge`], as a
//! backend's scheduler linked to its reporter does. The queues renew once a second.
//!
//! A group with a `limit` is held on each backend to a share of it ([`Split`]): work past the
//! share waits outside the queue for its bucket (one second of the share), unless the backend
//! is idle and lends its capacity (`lend_idle`). The loads reported are what arrives, so that
//! shares following the load follow where the group's data lives, not what it was let do.
//! With `max_wait`, a request still waiting for its share that long is refused, as a
//! backend's scheduler refuses one past its longest wait.
//!
//! Each simulated second, the controller's high-water marks are sampled per group over all
//! backends, into the same minute and hour windows the server keeps ([`RateNow`]): the units/s
//! served and the largest single request served. [`StorageOutcome::marks`] holds them as of the
//! end of the run, with the requests refused.
//!
//! Nothing is random: a spec always gives the same result.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tollgate_model::bucket::Bucket;
use tollgate_model::engine::{RateMarks, RateNow, RateWindows};
use tollgate_model::schedule::{CrossCharge, FairQueue};
use tollgate_model::settings::{GroupName, Priority};
use tollgate_model::spread::Spread;
use tollgate_model::time::Nanos;

/// One step of the simulation.
const STEP: Duration = Duration::from_millis(1);
/// How often each backend reports.
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// The folding time of the loads reported.
const FOLDING_S: f64 = 1.0;
/// Requests kept waiting for a group that always has work.
const BACKLOG: usize = 64;
/// How often the marks are sampled, in steps.
const SAMPLE_EVERY_STEPS: u64 = 1000;

/// One group of a storage simulation.
#[derive(Debug, Clone)]
pub struct StorageGroup {
    /// Its name.
    pub name: GroupName,
    /// Its rate (reservation, else limit), which sets its weight in each fair queue.
    pub rate: f64,
    /// The units/s it offers each backend, by backend; `f64::INFINITY` keeps work waiting.
    pub offers: Vec<f64>,
    /// The cost of each request, units, taken in turn (`[1.0]`: every request one unit).
    pub sizes: Vec<f64>,
    /// Its limit over all the backends, units/s, which each backend holds it to a share of
    /// ([`StorageSpec::split`]); `None`: no share anywhere.
    pub limit: Option<f64>,
}

/// How a group's limit is split into shares, one per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// No shares: the backends hold no group.
    None,
    /// The same share on each backend: the limit ÷ the backends.
    Even,
    /// In proportion to the load the group brings each backend (where its data lives): the
    /// limit × its load here ÷ its load everywhere, as the controller answers each report.
    FollowLoad,
}

/// A storage simulation: backends, groups, and whether the backends charge work done
/// elsewhere.
#[derive(Debug, Clone)]
pub struct StorageSpec {
    /// Each backend's capacity, units/s.
    pub capacities: Vec<f64>,
    /// The groups.
    pub groups: Vec<StorageGroup>,
    /// Whether each backend charges the work the others did (dmClock); off, each schedules
    /// on its own (mClock's per-server form).
    pub cross: bool,
    /// How the groups' limits are split over the backends.
    pub split: Split,
    /// Whether a backend with nothing queued lets a group past its share there.
    pub lend_idle: bool,
    /// How long a request may wait for its share before it is refused; `None`: for ever.
    pub max_wait: Option<Duration>,
    /// Simulated time before measuring.
    pub warm_up: Duration,
    /// Simulated time measured.
    pub measure: Duration,
}

/// What each group was served, in units/s over the measured time, and its marks.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageOutcome {
    /// By group (in the spec's order), then by backend.
    pub served: Vec<Vec<f64>>,
    /// By group, in the spec's order: its high-water marks at the end of the run.
    pub marks: Vec<GroupMarks>,
}

/// A group's high-water marks over all backends, as the controller shows them at the end of
/// a run (sampled once a simulated second).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupMarks {
    /// The largest single request served over the last minute and the last hour, units.
    pub largest: (f64, f64),
    /// The low and high water marks and the average of the units/s served, over the last
    /// minute and the last hour (`None`: no sample).
    pub rate: (Option<RateMarks>, Option<RateMarks>),
    /// Requests refused, over the whole run, for waiting longer than `max_wait` for a share.
    pub refused: u64,
}

/// One group's marks while the run goes.
#[derive(Debug, Default)]
struct Marking {
    rate: RateNow,
    rate_rings: Option<Box<RateWindows>>,
    largest: RateNow,
    largest_rings: Option<Box<RateWindows>>,
    /// Units served and the largest request since the last sample.
    units: f64,
    biggest: f64,
    refused: u64,
}

impl Marking {
    fn served(&mut self, cost: f64) {
        self.units += cost;
        self.biggest = self.biggest.max(cost);
    }

    fn sample(&mut self, now: Nanos, seconds: f64) {
        self.rate.add(&mut self.rate_rings, now, std::mem::take(&mut self.units) / seconds);
        self.largest.add(&mut self.largest_rings, now, std::mem::take(&mut self.biggest));
    }

    fn marks(&self, now: Nanos) -> GroupMarks {
        let (minute, hour) = self.largest.marks(self.largest_rings.as_deref(), now);
        let high = |m: Option<RateMarks>| m.map_or(0.0, |m| m.high);
        GroupMarks {
            largest: (high(minute), high(hour)),
            rate: self.rate.marks(self.rate_rings.as_deref(), now),
            refused: self.refused,
        }
    }
}

impl StorageOutcome {
    /// A group's units/s over every backend.
    pub fn total(&self, group: usize) -> f64 {
        self.served[group].iter().sum()
    }
}

/// One backend's state.
struct Backend {
    /// Each request queued is its cost.
    queue: FairQueue<f64>,
    cross: CrossCharge,
    /// Units of service not yet used; below 0 while a large request is being served.
    budget: f64,
    /// Units offered and not yet arrived (less than the next request), by group.
    offered: Vec<f64>,
    /// Requests arrived and waiting for the group's share, by group: cost and arrival.
    held: Vec<VecDeque<(f64, Nanos)>>,
    /// The index in the group's `sizes` of its next request, by group.
    next: Vec<usize>,
    /// Each group's share here, once known, and the most it may take here lent idle
    /// capacity: its limit less its load elsewhere.
    shares: Vec<Option<Bucket>>,
    ceilings: Vec<Option<Bucket>>,
    /// Units arrived since the last report, and smoothed rates, by group.
    window: Vec<f64>,
    rates: Vec<f64>,
}

/// Runs the spec. See the [module documentation](self).
pub fn run(spec: &StorageSpec) -> StorageOutcome {
    let n = spec.groups.len();
    let mut backends: Vec<Backend> = spec.capacities.iter().map(|_| Backend::new(spec)).collect();
    let mut spread = Spread::new(Duration::from_secs(10));
    let mut served = vec![vec![0.0; spec.capacities.len()]; n];
    let mut marking: Vec<Marking> = (0..n).map(|_| Marking::default()).collect();
    let steps = ((spec.warm_up + spec.measure).as_nanos() / STEP.as_nanos()) as u64;
    let warm = (spec.warm_up.as_nanos() / STEP.as_nanos()) as u64;
    let (report_every, renew_every) = (REPORT_EVERY.as_millis() as u64, 1000);
    let mut now = Nanos::ZERO;
    for step in 1..=steps {
        now = Nanos::ZERO.after(STEP * step as u32);
        for (b, backend) in backends.iter_mut().enumerate() {
            offer(backend, spec, b, now);
            let (dt, capacity) = (STEP.as_secs_f64(), spec.capacities[b]);
            admit(backend, spec, now, capacity * dt, &mut marking);
            if spec.cross {
                backend.cross.apply(now, &mut backend.queue);
            }
            for (g, cost) in serve(backend, capacity * dt, spec) {
                marking[g].served(cost);
                if step > warm {
                    served[g][b] += cost;
                }
            }
            if step % renew_every == 0 {
                backend.queue.renew();
            }
            if step % report_every == 0 {
                report(backend, &mut spread, now, b, spec);
            }
        }
        if step % SAMPLE_EVERY_STEPS == 0 {
            let seconds = (STEP * SAMPLE_EVERY_STEPS as u32).as_secs_f64();
            marking.iter_mut().for_each(|m| m.sample(now, seconds));
        }
    }
    let seconds = spec.measure.as_secs_f64();
    for row in &mut served {
        for units in row.iter_mut() {
            *units /= seconds;
        }
    }
    StorageOutcome { served, marks: marking.iter().map(|m| m.marks(now)).collect() }
}

impl Backend {
    fn new(spec: &StorageSpec) -> Backend {
        let n = spec.groups.len();
        let mut queue = FairQueue::new(1_000_000);
        for g in &spec.groups {
            queue.set_group(&g.name, Priority::MEDIUM, g.rate);
        }
        Backend {
            queue,
            cross: CrossCharge::new(),
            budget: 0.0,
            offered: vec![0.0; n],
            held: vec![VecDeque::new(); n],
            next: vec![0; n],
            shares: (0..n).map(|_| None).collect(),
            ceilings: (0..n).map(|_| None).collect(),
            window: vec![0.0; n],
            rates: vec![0.0; n],
        }
    }

    /// The cost of group `g`'s next request, which it then moves past.
    fn next_size(&mut self, g: usize, sizes: &[f64]) -> f64 {
        let size = sizes.get(self.next[g] % sizes.len().max(1)).copied().unwrap_or(1.0);
        self.next[g] = (self.next[g] + 1) % sizes.len().max(1);
        size
    }
}

/// One step's arrivals: what each group's rate brings, or enough to keep a backlog when it
/// always has work. They count in the load reported, and wait for their share.
fn offer(backend: &mut Backend, spec: &StorageSpec, b: usize, now: Nanos) {
    for (g, group) in spec.groups.iter().enumerate() {
        let rate = group.offers.get(b).copied().unwrap_or(0.0);
        if rate.is_infinite() {
            while backend.queue.queued(group.name.as_ref()) + backend.held[g].len() < BACKLOG {
                let size = backend.next_size(g, &group.sizes);
                backend.held[g].push_back((size, now));
                backend.window[g] += size;
            }
            continue;
        }
        backend.offered[g] += rate * STEP.as_secs_f64();
        loop {
            let size = group.sizes.get(backend.next[g]).copied().unwrap_or(1.0);
            if backend.offered[g] < size {
                break;
            }
            backend.offered[g] -= backend.next_size(g, &group.sizes);
            backend.held[g].push_back((size, now));
            backend.window[g] += size;
        }
    }
}

/// Refuses what waited past `max_wait`, then queues what each group's share lets in; with
/// `lend_idle`, a backend with nothing queued lets in up to a step's `capacity` more, past
/// the shares.
fn admit(backend: &mut Backend, spec: &StorageSpec, now: Nanos, capacity: f64, marking: &mut [Marking]) {
    for (g, group) in spec.groups.iter().enumerate() {
        if let Some(wait) = spec.max_wait {
            while backend.held[g].front().is_some_and(|(_, at)| now.since(*at) > wait) {
                backend.held[g].pop_front();
                marking[g].refused += 1;
            }
        }
        while let Some(&(cost, _)) = backend.held[g].front() {
            let fits = backend.shares[g].as_ref().is_none_or(|b| b.try_acquire(cost, now).is_ok());
            if !fits || backend.queue.push(&group.name, cost, cost).is_err() {
                break;
            }
            // What its share lets in counts against what it may be lent here.
            if let Some(c) = &backend.ceilings[g] {
                c.charge(cost, now);
            }
            backend.held[g].pop_front();
        }
    }
    if !spec.lend_idle || !backend.queue.is_empty() {
        return;
    }
    let mut lent = capacity.ceil();
    for (g, group) in spec.groups.iter().enumerate() {
        let ceiling = &backend.ceilings[g];
        while let Some(&(cost, _)) = backend.held[g].front() {
            if lent <= 0.0
                || ceiling.as_ref().is_some_and(|c| c.try_acquire(cost, now).is_err())
                || backend.queue.push(&group.name, cost, cost).is_err()
            {
                break;
            }
            backend.held[g].pop_front();
            lent -= cost;
        }
    }
}

/// Sets `bucket` to `rate` (one second of it), making it on first use.
fn set_bucket(bucket: &mut Option<Bucket>, rate: f64, now: Nanos) {
    match bucket {
        Some(b) => b.set_rate(rate, rate, now),
        None => *bucket = Some(Bucket::new(rate, rate, now)),
    }
}

/// Serves one step's `units` of capacity; the groups served and each request's cost. A
/// request costing more than what is left is served and leaves the backend in debt, busy
/// until its capacity pays it back.
fn serve(backend: &mut Backend, units: f64, spec: &StorageSpec) -> Vec<(usize, f64)> {
    backend.budget += units;
    let mut out = Vec::new();
    while backend.budget >= 1.0 {
        let Some((name, cost)) = backend.queue.pop() else {
            backend.budget = 0.0;
            break;
        };
        backend.budget -= cost;
        out.extend(spec.groups.iter().position(|g| g.name == name).map(|g| (g, cost)));
    }
    out
}

/// Folds the window into the smoothed rates and reports them; with `cross`, the answer is
/// charged from now on.
fn report(backend: &mut Backend, spread: &mut Spread, now: Nanos, b: usize, spec: &StorageSpec) {
    let elapsed = REPORT_EVERY.as_secs_f64();
    let keep = 1.0 - (-elapsed / FOLDING_S).exp();
    for (rate, units) in backend.rates.iter_mut().zip(backend.window.iter_mut()) {
        *rate += (*units / elapsed - *rate) * keep;
        *units = 0.0;
    }
    let loads: Arc<[(GroupName, f64)]> = spec
        .groups
        .iter()
        .zip(&backend.rates)
        .filter(|(_, r)| **r > 1e-6)
        .map(|(g, r)| (g.name.clone(), *r))
        .collect();
    let elsewhere = spread.put(now, &format!("backend-{b}"), loads);
    for (g, group) in spec.groups.iter().enumerate() {
        let Some(limit) = group.limit else { continue };
        let here = backend.rates[g];
        let there = elsewhere.iter().find(|(name, _)| *name == group.name).map_or(0.0, |(_, r)| *r);
        let share = match spec.split {
            Split::None => continue,
            Split::Even => limit / spec.capacities.len() as f64,
            Split::FollowLoad => tollgate_model::spread::node_share(limit, here, there),
        };
        set_bucket(&mut backend.shares[g], share, now);
        set_bucket(&mut backend.ceilings[g], (limit - there).max(share), now);
    }
    if spec.cross {
        backend.cross.set_rates(now, &mut backend.queue, elsewhere);
    }
}
