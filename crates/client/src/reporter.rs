//! The backend reporter: a backend tells the controller, four times a second by default, how
//! loaded it is and which groups load it most, so that the controller's saturation limiting can
//! act.
//!
//! Record work as it arrives with [`BackendReporter::record`]; a background task measures each
//! group's units/s over each report's window and smooths it (an exponential average with the
//! `smoothing` folding time), and sends the `top_k` busiest groups at or above `threshold`, with
//! the backend's health: the smoothed total ÷ `capacity` when a capacity is given (one
//! consistent measurement, as the controller's control law wants), or whatever the
//! application's function returns (queue bytes, say). A controller that cannot be reached is
//! retried at the next interval; the controller itself stops using a backend's report once it
//! is older than its report expiry.
//!
//! How soon the controller sees a saturation is the report interval plus about the folding
//! time: with the defaults (250 ms, 1 s) a surge to 1.6 times a service's capacity is seen
//! before the controller's next tick, which marks it busy one tick (1 s) after it reached the
//! service (`scripts/bench-surge.sh`, BENCHMARKS.md). FoundationDB smooths its
//! storage servers' rates over 10 s; a load measured as a rate and smoothed that long takes
//! about six seconds to show a surge, during which the surge runs unlimited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::time::Clock;
use tollgate_proto::v1::{self, backend_client::BackendClient};

/// A backend's health, as it reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BackendHealth {
    /// Bytes queued (FoundationDB's storage queue; 800e6 is the controller's target).
    QueueBytes(f64),
    /// Load ÷ capacity: 1 means at capacity.
    Utilisation(f64),
}

/// How the reporter behaves.
#[derive(Debug, Clone)]
pub struct ReporterOptions {
    /// This backend's id (1 to 255 bytes).
    pub backend_id: String,
    /// Its failure domain (1 to 255 bytes).
    pub zone: String,
    /// How often to report (default 250 ms).
    pub interval: Duration,
    /// Report at most this many groups (the busiest).
    pub top_k: usize,
    /// Report only groups with at least this many units/s.
    pub threshold: f64,
    /// Folding time of the per-group load averages (default 1 s; longer is steadier and slower
    /// to show a surge). The load reported and the utilisation derived from it use the same
    /// smoothing, so the controller sees one consistent picture (docs/control.md).
    pub smoothing: Duration,
    /// The backend's capacity in units/s: when set, the health reported is the smoothed
    /// load ÷ capacity, and the health function is not used.
    pub capacity: Option<f64>,
    /// The token (a backend token) and TLS files for a controller that asks for them.
    pub access: crate::access::Access,
    /// What takes the controller's answer to each report: for each group reported, what the
    /// other backends serve of it (dmClock's cross-backend term) and its share of its limit
    /// on this backend. Give the backend's [`Scheduler`](crate::scheduler::Scheduler), which
    /// charges the first to its fair queue and holds each group to the second. Only the
    /// groups reported (the `top_k` busiest) are answered for. `None` (the default): the
    /// answers are not used, and the scheduler shares this backend alone.
    pub scheduler: Option<Arc<dyn TakesAnswers>>,
}

/// Takes the controller's answer to each backend report ([`ReporterOptions::scheduler`]).
pub trait TakesAnswers: std::fmt::Debug + Send + Sync {
    /// The latest answer, in place of the last: a group left out of it is served nowhere
    /// else, and holds no share here.
    fn take_answer(&self, ack: &v1::ReportAck);
}

impl Default for ReporterOptions {
    fn default() -> Self {
        Self {
            backend_id: "backend".into(),
            zone: "zone".into(),
            interval: Duration::from_millis(250),
            top_k: 10,
            threshold: 0.0,
            smoothing: Duration::from_secs(1),
            capacity: None,
            access: crate::access::Access::default(),
            scheduler: None,
        }
    }
}

/// Records served work and reports it; cheap to clone. Dropping every clone stops it.
#[derive(Clone)]
pub struct BackendReporter {
    served: Arc<Mutex<HashMap<String, f64>>>,
    _stop: Arc<tokio::sync::watch::Sender<()>>,
}

/// The report of an interval: the groups served at least the threshold's rate, busiest
/// first, and the backend's health (its utilisation when its capacity is given).
fn report(
    rates: &HashMap<String, f64>,
    opts: &ReporterOptions,
    health: &impl Fn() -> BackendHealth,
) -> v1::BackendReport {
    let mut loads: Vec<(String, f64)> = rates.iter().map(|(g, r)| (g.clone(), *r)).collect();
    let total: f64 = loads.iter().map(|l| l.1).sum();
    loads.retain(|(_, r)| *r >= opts.threshold);
    loads.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    loads.truncate(opts.top_k.min(tollgate_proto::REPORT_GROUPS_MAX));
    let health = match opts.capacity {
        Some(c) => BackendHealth::Utilisation(total / c),
        None => health(),
    };
    // The capacity configured; or, with a utilisation from the health function (a learned
    // limit's, say), the one it implies: the load over it.
    let capacity = match (opts.capacity, health) {
        (Some(c), _) => Some(c),
        (None, BackendHealth::Utilisation(u)) if u > 0.0 && total > 0.0 => Some(total / u),
        _ => None,
    }
    .filter(|c| c.is_finite() && *c > 0.0);
    v1::BackendReport {
        backend_id: opts.backend_id.clone(),
        zone: opts.zone.clone(),
        health: Some(match health {
            BackendHealth::QueueBytes(q) => v1::backend_report::Health::QueueBytes(q),
            BackendHealth::Utilisation(u) => v1::backend_report::Health::Utilisation(u),
        }),
        loads: loads.into_iter().map(|(group, units_per_s)| v1::GroupLoad { group, units_per_s }).collect(),
        capacity,
    }
}

impl BackendReporter {
    /// Starts reporting to the controller at `url` (several, comma-separated, for controllers
    /// sharing one etcd: reports go to the leader); `health` is asked once per report.
    /// Must be called inside a tokio runtime.
    pub fn spawn(
        url: &str,
        opts: ReporterOptions,
        health: impl Fn() -> BackendHealth + Send + Sync + 'static,
    ) -> Result<BackendReporter, crate::error::BuildError> {
        let mut controllers = Vec::new();
        for u in url.split(',').map(str::trim) {
            let channel = opts
                .access
                .channel(u, Duration::from_secs(5))
                .map_err(|reason| crate::error::BuildError::Remote { url: u.to_string(), reason })?;
            controllers.push((u.to_string(), BackendClient::new(channel)));
        }
        if controllers.is_empty() || controllers.len() > crate::remote::CONTROLLERS_MAX {
            return Err(crate::error::BuildError::Remote {
                url: url.to_string(),
                reason: format!("give 1 to {} controller URLs", crate::remote::CONTROLLERS_MAX),
            });
        }
        let served: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
        let (stop, mut stopped) = tokio::sync::watch::channel(());
        let taken = served.clone();
        let folding = opts.smoothing.as_secs_f64().max(1e-3);
        tokio::spawn(async move {
            let clock = crate::clock::TokioClock::new();
            let mut last = clock.now();
            let mut rates: HashMap<String, f64> = HashMap::new();
            let mut current = 0usize;
            let mut ticker = tokio::time::interval(opts.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stopped.changed() => return,
                }
                let mut window = std::mem::take(&mut *taken.lock().unwrap_or_else(PoisonError::into_inner));
                let now = clock.now();
                let elapsed = now.since(last).as_secs_f64();
                last = now;
                if elapsed <= 0.0 {
                    continue;
                }
                fold_window(&mut rates, &mut window, elapsed, folding);
                let report = report(&rates, &opts, &health);
                // To any controller (a follower passes it on to the leader); one that fails is
                // left for the next one given.
                match tokio::time::timeout(opts.interval, controllers[current].1.report(report)).await {
                    Ok(Ok(ack)) => {
                        if let Some(taker) = &opts.scheduler {
                            taker.take_answer(ack.get_ref());
                        }
                    }
                    Ok(Err(status)) => {
                        tracing::debug!(error = %status.message(), "tollgate: backend report not delivered");
                        current = (current + 1) % controllers.len();
                    }
                    Err(_) => {
                        tracing::debug!("tollgate: backend report not delivered: timed out");
                        current = (current + 1) % controllers.len();
                    }
                }
            }
        });
        Ok(BackendReporter { served, _stop: Arc::new(stop) })
    }

    /// Counts `units` of work served for `group`.
    pub fn record(&self, group: &str, units: f64) {
        if units > 0.0 && units.is_finite() {
            *self
                .served
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(group.to_string())
                .or_insert(0.0) += units;
        }
    }
}

/// Folds one report window into each group's smoothed load: the window's own rate (its units
/// over its length) moves the smoothed rate by `1 − e^(−Δt/τ)` of the gap. Adding the whole
/// window to a running-total smoother at the moment of the report instead would read the
/// window's units as if they had all just arrived: a rate too high by `(Δt/τ) / (1 − e^(−Δt/τ))`,
/// 1.58 times for a window as long as the folding time. Groups whose load has died away are
/// forgotten.
fn fold_window(
    rates: &mut HashMap<String, f64>,
    window: &mut HashMap<String, f64>,
    elapsed: f64,
    folding: f64,
) {
    let keep = 1.0 - (-elapsed / folding).exp();
    for (group, rate) in rates.iter_mut() {
        let units = window.remove(group).unwrap_or(0.0);
        *rate += (units / elapsed - *rate) * keep;
    }
    for (group, units) in window.drain() {
        rates.insert(group, units / elapsed * keep);
    }
    rates.retain(|_, r| *r > 1e-6);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steady work reported in windows as long as the folding time settles on its true rate.
    #[test]
    fn a_steady_load_is_reported_at_its_rate_whatever_the_window() {
        for (window_s, folding_s) in [(1.0, 1.0), (0.25, 1.0), (1.0, 10.0), (2.0, 0.5)] {
            let mut rates = HashMap::new();
            for _ in 0..(200.0 / window_s) as usize {
                let mut window = HashMap::from([("g".to_string(), 500.0 * window_s)]);
                fold_window(&mut rates, &mut window, window_s, folding_s);
            }
            let r = rates["g"];
            assert!(
                (r - 500.0).abs() < 1e-3,
                "{r} units/s for 500, window {window_s} s, folding {folding_s} s"
            );
        }
    }

    /// A group that stops bringing work fades and is forgotten; a new one starts from its
    /// first window's share.
    #[test]
    fn a_load_that_stops_fades_and_a_new_one_rises() {
        let mut rates = HashMap::new();
        fold_window(&mut rates, &mut HashMap::from([("a".to_string(), 100.0)]), 1.0, 1.0);
        let first = rates["a"];
        assert!((first - 100.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-9, "{first}");
        for _ in 0..40 {
            fold_window(&mut rates, &mut HashMap::new(), 1.0, 1.0);
        }
        assert!(rates.is_empty(), "{rates:?}");
    }
}
