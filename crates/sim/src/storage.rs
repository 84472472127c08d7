//! The storage side in virtual time: backends that schedule their queued work fairly, as
//! TiKV's stores do, with or without dmClock's cross-backend term.
//!
//! Each backend serves `capacity` units/s from its own [`FairQueue`], in steps of 1 ms. Each
//! group offers work to each backend at its own rate (`f64::INFINITY`: always some waiting),
//! in items of one unit. Every 250 ms each backend reports the units/s each group brought it
//! (smoothed over 1 s, as the backend reporter does) to one [`Spread`], the controller's
//! part, and with `cross` on charges the answer to its queue through a [`CrossCharge`], as a
//! backend's scheduler linked to its reporter does. The queues renew once a second.
//!
//! Nothing is random: a spec always gives the same result.

use std::sync::Arc;
use std::time::Duration;

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
/// Items kept waiting for a group that always has work.
const BACKLOG: usize = 64;

/// One group of a storage simulation.
#[derive(Debug, Clone)]
pub struct StorageGroup {
    /// Its name.
    pub name: GroupName,
    /// Its rate (reservation, else limit), which sets its weight in each fair queue.
    pub rate: f64,
    /// The units/s it offers each backend, by backend; `f64::INFINITY` keeps work waiting.
    pub offers: Vec<f64>,
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
    /// Simulated time before measuring.
    pub warm_up: Duration,
    /// Simulated time measured.
    pub measure: Duration,
}

/// What each group was served, in units/s over the measured time.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageOutcome {
    /// By group (in the spec's order), then by backend.
    pub served: Vec<Vec<f64>>,
}

impl StorageOutcome {
    /// A group's units/s over every backend.
    pub fn total(&self, group: usize) -> f64 {
        self.served[group].iter().sum()
    }
}

/// One backend's state.
struct Backend {
    queue: FairQueue<()>,
    cross: CrossCharge,
    /// Units of service not yet used (a step's capacity left after the last whole item).
    budget: f64,
    /// Units offered and not yet queued, by group.
    offered: Vec<f64>,
    /// Units served since the last report, and smoothed rates, by group.
    window: Vec<f64>,
    rates: Vec<f64>,
}

/// Runs the spec. See the [module documentation](self).
pub fn run(spec: &StorageSpec) -> StorageOutcome {
    let n = spec.groups.len();
    let mut backends: Vec<Backend> = spec
        .capacities
        .iter()
        .map(|_| {
            let mut queue = FairQueue::new(1_000_000);
            for g in &spec.groups {
                queue.set_group(&g.name, Priority::MEDIUM, g.rate);
            }
            Backend {
                queue,
                cross: CrossCharge::new(),
                budget: 0.0,
                offered: vec![0.0; n],
                window: vec![0.0; n],
                rates: vec![0.0; n],
            }
        })
        .collect();
    let mut spread = Spread::new(Duration::from_secs(10));
    let mut served = vec![vec![0.0; spec.capacities.len()]; n];
    let steps = ((spec.warm_up + spec.measure).as_nanos() / STEP.as_nanos()) as u64;
    let warm = (spec.warm_up.as_nanos() / STEP.as_nanos()) as u64;
    let (report_every, renew_every) = (REPORT_EVERY.as_millis() as u64, 1000);
    for step in 1..=steps {
        let now = Nanos::ZERO.after(STEP * step as u32);
        for (b, backend) in backends.iter_mut().enumerate() {
            offer(backend, spec, b);
            if spec.cross {
                backend.cross.apply(now, &mut backend.queue);
            }
            let (dt, capacity) = (STEP.as_secs_f64(), spec.capacities[b]);
            for g in serve(backend, capacity * dt, spec) {
                backend.window[g] += 1.0;
                if step > warm {
                    served[g][b] += 1.0;
                }
            }
            if step % renew_every == 0 {
                backend.queue.renew();
            }
            if step % report_every == 0 {
                report(backend, &mut spread, now, b, spec);
            }
        }
    }
    let seconds = spec.measure.as_secs_f64();
    for row in &mut served {
        for units in row.iter_mut() {
            *units /= seconds;
        }
    }
    StorageOutcome { served }
}

/// Queues each group's offers for one step: what its rate brings, or enough to keep a
/// backlog when it always has work.
fn offer(backend: &mut Backend, spec: &StorageSpec, b: usize) {
    for (g, group) in spec.groups.iter().enumerate() {
        let rate = group.offers.get(b).copied().unwrap_or(0.0);
        let items = if rate.is_infinite() {
            BACKLOG.saturating_sub(backend.queue.queued(group.name.as_ref()))
        } else {
            backend.offered[g] += rate * STEP.as_secs_f64();
            let whole = backend.offered[g].floor();
            backend.offered[g] -= whole;
            whole as usize
        };
        for _ in 0..items {
            if backend.queue.push(&group.name, (), 1.0).is_err() {
                break;
            }
        }
    }
}

/// Serves one step's `units` of capacity; the groups served, one entry per unit.
fn serve(backend: &mut Backend, units: f64, spec: &StorageSpec) -> Vec<usize> {
    backend.budget += units;
    let mut out = Vec::new();
    while backend.budget >= 1.0 {
        let Some((name, ())) = backend.queue.pop() else {
            backend.budget = 0.0;
            break;
        };
        backend.budget -= 1.0;
        out.extend(spec.groups.iter().position(|g| g.name == name));
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
    if spec.cross {
        backend.cross.set_rates(now, &mut backend.queue, elsewhere);
    }
}
