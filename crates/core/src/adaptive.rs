//! Limits learned from what a backend measures, with nothing to configure.
//!
//! - [`LatencyLimit`]: a backend's sustainable concurrency from the latency of the work it
//!   admits. A gradient on latency, after Netflix's concurrency-limits (Gradient2) and TCP
//!   Vegas: each window, the limit moves toward `limit × target ÷ latency`, where the target
//!   is `tolerance ×` the backend's no-load latency. Below the knee (latency flat) the limit
//!   grows; past it, where more work in flight only queues, latency grows with the work in
//!   flight and the limit settles where latency is `tolerance ×` the no-load one.
//! - [`AdaptiveThrottle`]: Google's client-side adaptive throttling (the SRE book, "Handling
//!   Overload"): a client whose backend refuses work refuses locally with probability
//!   `max(0, (requests − K·accepts) ÷ (requests + 1))`.
//!
//! Both are functions of the samples and the `now` passed in.
//!
//! ## Why the no-load latency is probed
//!
//! The gradient needs the latency of the backend unloaded. Tracking a minimum only ever lowers
//! it, and a backend that slows down for good (a larger working set, a slower disk) would be
//! held far below its knee. Tracking a recent average lets the target creep up with the load
//! itself, Gradient2's known drift. So the limit is halved for two windows every
//! `probe_every` (the first drains the work in flight, the second measures): the latency of
//! that window, below the knee, is the no-load latency. A fall in the limit of a quarter or
//! more brings the probe forward to the next window, and only such a probe may raise the
//! no-load latency at once: a scheduled probe that reads slow moves it a quarter of the way
//! and is checked at once by a second probe, which takes the rise if it reads slow too (one
//! slow reading on a busy machine is more likely a busy moment than a slower backend).

use std::time::Duration;

use crate::time::Nanos;

/// The settings of a [`LatencyLimit`]. Every one has a default that needs no tuning.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnSettings {
    /// How long one window of samples lasts (default 250 ms).
    pub window: Duration,
    /// Samples a window needs before it counts (default 40); a quieter window is extended.
    pub window_samples: u32,
    /// Latency allowed over the no-load latency, as a ratio (default 1.5).
    pub tolerance: f64,
    /// How far the limit moves toward each window's figure (default 0.15).
    pub smoothing: f64,
    /// The limit starts here (default 4).
    pub initial: f64,
    /// The limit never falls below this (default 1).
    pub min: f64,
    /// Nor rises above this (default 10,000).
    pub max: f64,
    /// How often the no-load latency is measured again (default 10 s).
    pub probe_every: Duration,
}

impl Default for LearnSettings {
    fn default() -> Self {
        Self {
            window: Duration::from_millis(250),
            window_samples: 40,
            tolerance: 1.5,
            smoothing: 0.15,
            initial: 4.0,
            min: 1.0,
            max: 10_000.0,
            probe_every: Duration::from_secs(10),
        }
    }
}

/// How far a measured no-load latency may differ from the known one before it replaces it
/// outright, as a fraction.
const NOLOAD_SHIFT: f64 = 0.25;

/// A limit that falls below this fraction of its value at the last probe brings the next
/// probe forward.
const PROBE_ON_FALL: f64 = 0.75;

/// How far the latency behind [`LatencyLimit::utilisation`] moves toward each window's mean.
const LATENCY_SMOOTHING: f64 = 0.3;

/// The highest utilisation [`LatencyLimit::utilisation`] gives.
pub const UTILISATION_MAX: f64 = 10.0;

/// The largest limit [`LearnSettings`] may name.
pub const LIMIT_MAX: f64 = 1e6;

impl LearnSettings {
    /// Checks every setting's range: the field that breaks one, and the rule.
    pub fn check(&self) -> Result<(), String> {
        let window = self.window.as_secs_f64();
        if !(0.001..=60.0).contains(&window) {
            return Err("window: 1 ms to 60 s".into());
        }
        if !(1..=100_000).contains(&self.window_samples) {
            return Err("window_samples: 1 to 100000".into());
        }
        if !(self.tolerance.is_finite() && self.tolerance > 1.0 && self.tolerance <= 10.0) {
            return Err("tolerance: above 1, at most 10".into());
        }
        if !(self.smoothing.is_finite() && self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err("smoothing: above 0, at most 1".into());
        }
        if !(self.min.is_finite() && self.min >= 1.0 && self.min <= LIMIT_MAX) {
            return Err(format!("min: 1 to {LIMIT_MAX}"));
        }
        if !(self.max.is_finite() && self.max >= self.min && self.max <= LIMIT_MAX) {
            return Err(format!("max: at least min, at most {LIMIT_MAX}"));
        }
        if !(self.initial.is_finite() && self.initial >= self.min && self.initial <= self.max) {
            return Err("initial: between min and max".into());
        }
        let probe = self.probe_every.as_secs_f64();
        if !(probe >= 4.0 * window && probe <= 3600.0) {
            return Err("probe_every: at least 4 windows, at most 1 hour".into());
        }
        Ok(())
    }
}

/// Where the limit is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Following the gradient; the next probe is due at the time given.
    Steady(Nanos),
    /// Probing: the first window drains, the second measures.
    Draining,
    Measuring,
}

/// A backend's concurrency limit learned from latency. See the [module documentation](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate_model::adaptive::{LatencyLimit, LearnSettings};
/// use tollgate_model::time::Nanos;
///
/// // A backend with 8 workers, 10 ms a request: past 8 in flight, work queues.
/// let latency = |in_flight: f64| 0.010 * (in_flight / 8.0).max(1.0);
/// let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
/// let mut now = Nanos(0);
/// for _ in 0..20_000 {
///     now = now.after(Duration::from_millis(1));
///     let in_flight = limit.limit() as f64;
///     limit.sample(now, Duration::from_secs_f64(latency(in_flight)), limit.limit());
/// }
/// // Settled where latency is 1.5 times the unloaded 10 ms: 12 in flight.
/// assert!((limit.estimate() - 12.0).abs() < 1.0, "{}", limit.estimate());
/// ```
#[derive(Debug, Clone)]
pub struct LatencyLimit {
    settings: LearnSettings,
    limit: f64,
    /// The latency unloaded, seconds; none until measured.
    noload: Option<f64>,
    phase: Phase,
    window_start: Nanos,
    sum: f64,
    count: u32,
    /// The most work in flight any sample of the window saw.
    peak: usize,
    /// The limit at the last probe, to notice a fall.
    at_probe: f64,
    /// Before the first probe ends: one in flight at a time (`min`), to measure the no-load
    /// latency before anything is known.
    cold: bool,
    /// The mean latency of the windows outside a probe, seconds, smoothed over a few of them.
    latency: Option<f64>,
    /// The probe under way was brought forward by a fall in the limit, or checks one that
    /// read slow: a rise it reads is taken at once.
    forced: bool,
}

impl LatencyLimit {
    /// A limit at `settings.initial`, measuring from `now`. The settings must pass
    /// [`LearnSettings::check`]; out-of-range ones are clamped.
    pub fn new(settings: LearnSettings, now: Nanos) -> Self {
        let min = settings.min.clamp(1.0, LIMIT_MAX);
        let max = settings.max.clamp(min, LIMIT_MAX);
        let limit = settings.initial.clamp(min, max);
        let settings = LearnSettings { min, max, ..settings };
        LatencyLimit {
            phase: Phase::Draining,
            settings,
            limit,
            noload: None,
            window_start: now,
            sum: 0.0,
            count: 0,
            peak: 0,
            at_probe: limit,
            cold: true,
            latency: None,
            forced: false,
        }
    }

    /// Work allowed in flight now: the learned limit, or half of it while probing.
    pub fn limit(&self) -> usize {
        let l = match self.phase {
            Phase::Steady(_) => self.limit,
            _ if self.cold => self.settings.min,
            Phase::Draining | Phase::Measuring => (self.limit / 2.0).max(self.settings.min),
        };
        l.round().max(1.0) as usize
    }

    /// The learned limit, unrounded, whatever the phase.
    pub fn estimate(&self) -> f64 {
        self.limit
    }

    /// The latency of the backend unloaded, once measured.
    pub fn noload(&self) -> Option<Duration> {
        self.noload.map(Duration::from_secs_f64)
    }

    /// The mean latency of the windows outside a probe, smoothed over a few of them (each
    /// window moves it 30 % of the way).
    pub fn latency(&self) -> Option<Duration> {
        self.latency.map(Duration::from_secs_f64)
    }

    /// The backend's utilisation for `arriving` requests a second, by Little's law: the work
    /// in flight they need (`arriving × latency`) over the learned limit. At 1 the backend runs
    /// at its limit serving what arrives; past 1 work queues. Until a window outside a probe
    /// has ended, the latency is the no-load one, and before that is measured the utilisation
    /// is 0: nothing says the backend is busy, and a figure of 1 would hold the load where it
    /// is. A probe leaves it as it was: its shorter latency is the probe's doing, not a change
    /// in load.
    pub fn utilisation(&self, arriving: f64) -> f64 {
        let arriving = if arriving.is_finite() { arriving.max(0.0) } else { 0.0 };
        match self.latency.or(self.noload) {
            Some(latency) => (arriving * latency / self.limit).min(UTILISATION_MAX),
            None => 0.0,
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &LearnSettings {
        &self.settings
    }

    /// Whether the no-load latency is being measured (the limit halved).
    pub fn probing(&self) -> bool {
        !matches!(self.phase, Phase::Steady(_))
    }

    /// One piece of admitted work finished at `now` after `latency`, with `in_flight` running
    /// (itself included) when it started.
    pub fn sample(&mut self, now: Nanos, latency: Duration, in_flight: usize) {
        let l = latency.as_secs_f64();
        if l.is_finite() && l > 0.0 {
            self.sum += l;
            self.count += 1;
            self.peak = self.peak.max(in_flight);
        }
        // Draining needs time only: what it measures is not used.
        let enough = self.count >= self.settings.window_samples || self.phase == Phase::Draining;
        if now.since(self.window_start) >= self.settings.window && enough {
            let mean = self.sum / f64::from(self.count);
            let peak = self.peak;
            self.window_start = now;
            self.sum = 0.0;
            self.count = 0;
            self.peak = 0;
            self.close_window(now, mean, peak);
        }
    }

    fn close_window(&mut self, now: Nanos, mean: f64, peak: usize) {
        match self.phase {
            Phase::Draining => self.phase = Phase::Measuring,
            Phase::Measuring => {
                // A shift of more than a quarter is taken at once (the backend changed); a
                // smaller difference moves what was known a quarter of the way, so one noisy
                // probe moves the target little. A rise is taken at once only from a probe the
                // limit's fall brought forward, or from a second probe confirming a first: on a
                // busy machine one slow reading is more likely a busy moment.
                let shift = self.noload.map_or(0.0, |known| mean / known - 1.0);
                let rise = shift > NOLOAD_SHIFT;
                self.noload = Some(match self.noload {
                    Some(known) if shift.abs() <= NOLOAD_SHIFT || (rise && !self.forced) => {
                        known + (mean - known) / 4.0
                    }
                    _ => mean,
                });
                self.cold = false;
                if rise && !self.forced {
                    // A scheduled probe that reads slow is checked at once by another.
                    self.forced = true;
                    self.phase = Phase::Draining;
                    return;
                }
                self.forced = false;
                self.at_probe = self.limit;
                self.phase = Phase::Steady(now.after(self.settings.probe_every));
            }
            Phase::Steady(due) => {
                // One window of a busy backend is noisy; the utilisation wants its trend.
                self.latency = Some(self.latency.map_or(mean, |l| l + (mean - l) * LATENCY_SMOOTHING));
                let noload = *self.noload.get_or_insert(mean);
                self.follow(mean, noload, peak);
                let fell = self.limit < self.at_probe * PROBE_ON_FALL;
                if now >= due || fell {
                    self.forced = fell;
                    self.phase = Phase::Draining;
                }
            }
        }
    }

    /// Moves the limit toward `limit × target ÷ latency`, by at most a factor of two.
    fn follow(&mut self, mean: f64, noload: f64, peak: usize) {
        // A window much faster than the no-load latency known is a better measure of it.
        let noload = if mean < noload * (1.0 - NOLOAD_SHIFT) {
            self.noload = Some(mean);
            mean
        } else {
            noload
        };
        let target = noload * self.settings.tolerance;
        let gradient = (target / mean).clamp(0.5, 2.0);
        // Work that never filled the limit says nothing about a higher one.
        if gradient > 1.0 && peak < self.limit.round() as usize {
            return;
        }
        // The window ran at the whole number allowed in flight, not the estimate: scaling that
        // number leaves no dead band where any estimate rounding to it would do.
        let next = self.limit.round().max(1.0) * gradient;
        self.limit += (next - self.limit) * self.settings.smoothing;
        self.limit = self.limit.clamp(self.settings.min, self.settings.max);
    }
}

/// Google's client-side adaptive throttling over a sliding window of `window` (two minutes by
/// default): with `requests` tried and `accepts` the backend took, a new request is refused
/// locally with probability `max(0, (requests − K·accepts) ÷ (requests + 1))`. With `K = 2`,
/// a backend that accepts half of what it is sent sees no local refusals; one that accepts
/// nothing sees nearly every request refused before it is sent, while a trickle still gets
/// through to notice it has recovered.
///
/// ```
/// use tollgate_model::adaptive::AdaptiveThrottle;
/// use tollgate_model::time::Nanos;
///
/// let mut t = AdaptiveThrottle::new(2.0, std::time::Duration::from_secs(120));
/// for i in 0..100 {
///     t.record(Nanos(i), i % 4 == 0); // a backend accepting a quarter
/// }
/// // (100 − 2 × 25) ÷ 101
/// assert!((t.reject_probability(Nanos(100)) - 50.0 / 101.0).abs() < 1e-9);
/// ```
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    k: f64,
    /// Requests and accepts per slot of the window, oldest first.
    slots: std::collections::VecDeque<(u64, u64, u64)>,
    slot_len: u64,
    slots_max: usize,
}

/// Slots the throttle's window is kept in.
const THROTTLE_SLOTS: u64 = 60;

impl AdaptiveThrottle {
    /// A throttle with multiplier `k` (at least 1; the SRE book suggests 2) over `window`.
    pub fn new(k: f64, window: Duration) -> Self {
        let window = window.as_nanos().clamp(u128::from(THROTTLE_SLOTS), u128::from(u64::MAX)) as u64;
        AdaptiveThrottle {
            k: if k.is_finite() { k.max(1.0) } else { 2.0 },
            slots: std::collections::VecDeque::new(),
            slot_len: window / THROTTLE_SLOTS,
            slots_max: THROTTLE_SLOTS as usize,
        }
    }

    fn advance(&mut self, now: Nanos) {
        let slot = now.0 / self.slot_len;
        let oldest = slot.saturating_sub(self.slots_max as u64 - 1);
        while self.slots.front().is_some_and(|s| s.0 < oldest) {
            self.slots.pop_front();
        }
        if self.slots.back().is_none_or(|s| s.0 < slot) {
            self.slots.push_back((slot, 0, 0));
        }
    }

    /// Counts a request sent at `now`, and whether the backend accepted it.
    pub fn record(&mut self, now: Nanos, accepted: bool) {
        self.advance(now);
        let last = self.slots.back_mut().expect("advance leaves a slot");
        last.1 += 1;
        last.2 += u64::from(accepted);
    }

    /// Requests and accepts within the window at `now`.
    pub fn counts(&mut self, now: Nanos) -> (u64, u64) {
        self.advance(now);
        self.slots.iter().fold((0, 0), |(r, a), s| (r + s.1, a + s.2))
    }

    /// The probability a request sent at `now` is refused locally.
    pub fn reject_probability(&mut self, now: Nanos) -> f64 {
        let (requests, accepts) = self.counts(now);
        let (requests, accepts) = (requests as f64, accepts as f64);
        ((requests - self.k * accepts) / (requests + 1.0)).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A backend with `workers` serving `service_s` each: latency at `in_flight`.
    fn latency(workers: f64, service_s: f64, in_flight: f64) -> Duration {
        Duration::from_secs_f64(service_s * (in_flight / workers).max(1.0))
    }

    /// Runs `limit` against a backend for `ms` milliseconds from `start`, a sample a
    /// millisecond: the limit after each window.
    fn run(limit: &mut LatencyLimit, start: u64, ms: u64, workers: f64, service_s: f64) -> Vec<f64> {
        let mut out = Vec::new();
        for t in start..start + ms {
            let in_flight = limit.limit();
            limit.sample(Nanos(t * 1_000_000), latency(workers, service_s, in_flight as f64), in_flight);
            if t % 250 == 0 {
                out.push(limit.estimate());
            }
        }
        out
    }

    #[test]
    fn the_limit_settles_at_the_tolerated_latency_without_oscillating() {
        for workers in [4.0, 16.0, 200.0] {
            let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
            let trace = run(&mut limit, 0, 60_000, workers, 0.02);
            let settled = &trace[trace.len() / 2..];
            let (lo, hi) = settled.iter().fold((f64::MAX, 0.0f64), |(lo, hi), l| (lo.min(*l), hi.max(*l)));
            let want = workers * 1.5;
            assert!((hi - want).abs() / want < 0.05, "{workers} workers: peak {hi}, want {want}");
            // Probes halve what is allowed in flight, never the estimate's trend.
            assert!((hi - lo) / hi < 0.1, "{workers} workers: {lo}..{hi}");
        }
    }

    #[test]
    fn a_single_worker_is_held_between_one_and_two() {
        let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
        let trace = run(&mut limit, 0, 60_000, 1.0, 0.02);
        assert!(trace[trace.len() / 2..].iter().all(|l| (1.0..=2.0).contains(l)), "{trace:?}");
    }

    #[test]
    fn a_backend_that_slows_for_good_is_followed_at_the_next_probe() {
        let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
        run(&mut limit, 0, 30_000, 8.0, 0.01);
        assert!((limit.estimate() - 12.0).abs() < 0.6, "{}", limit.estimate());
        // Each request now costs twice as much: the right limit is unchanged, and after a dip
        // the probe finds the new no-load latency.
        let trace = run(&mut limit, 30_000, 30_000, 8.0, 0.02);
        let after_5s = &trace[20..];
        assert!(after_5s.iter().all(|l| (l - 12.0).abs() < 1.2), "{trace:?}");
        assert!((limit.noload().unwrap().as_secs_f64() - 0.02).abs() < 1e-3);
    }

    #[test]
    fn a_backend_that_loses_workers_is_followed_within_seconds() {
        let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
        run(&mut limit, 0, 30_000, 16.0, 0.01);
        let trace = run(&mut limit, 30_000, 30_000, 8.0, 0.01);
        // 20 windows is 5 s.
        assert!(trace[20..].iter().all(|l| (l - 12.0).abs() < 1.2), "{trace:?}");
    }

    #[test]
    fn an_idle_backend_does_not_grow_its_limit() {
        let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
        for t in 0..20_000u64 {
            limit.sample(Nanos(t * 1_000_000), Duration::from_millis(10), 1);
        }
        assert_eq!(limit.estimate(), 4.0);
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = |f: fn(&mut LearnSettings)| {
            let mut s = LearnSettings::default();
            f(&mut s);
            s.check().unwrap_err()
        };
        assert!(LearnSettings::default().check().is_ok());
        assert!(bad(|s| s.tolerance = 1.0).starts_with("tolerance"));
        assert!(bad(|s| s.smoothing = 0.0).starts_with("smoothing"));
        assert!(bad(|s| s.min = 0.5).starts_with("min"));
        assert!(bad(|s| s.max = 0.5).starts_with("max"));
        assert!(bad(|s| s.initial = 1e7).starts_with("initial"));
        assert!(bad(|s| s.window = Duration::ZERO).starts_with("window"));
        assert!(bad(|s| s.window_samples = 0).starts_with("window_samples"));
        assert!(bad(|s| s.probe_every = Duration::from_millis(500)).starts_with("probe_every"));
    }

    #[test]
    fn the_throttle_follows_the_book() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(120));
        assert_eq!(t.reject_probability(Nanos(0)), 0.0);
        for i in 0..1000 {
            t.record(Nanos(i), false);
        }
        assert!((t.reject_probability(Nanos(1000)) - 1000.0 / 1001.0).abs() < 1e-12);
        // Two minutes on, the refusals have left the window.
        assert_eq!(t.counts(Nanos(121_000_000_000)), (0, 0));
    }

    proptest! {
        /// Whatever the latencies, the limit stays within its bounds and what is allowed in
        /// flight is at least one.
        #[test]
        fn the_limit_stays_within_its_bounds(samples in proptest::collection::vec((0u64..50, 0u64..5_000_000_000, 0usize..100), 1..500)) {
            let mut limit = LatencyLimit::new(LearnSettings::default(), Nanos(0));
            let mut now = 0u64;
            for (step_ms, latency_ns, in_flight) in samples {
                now += step_ms * 1_000_000;
                limit.sample(Nanos(now), Duration::from_nanos(latency_ns), in_flight);
                prop_assert!(limit.estimate() >= 1.0 && limit.estimate() <= 10_000.0);
                prop_assert!(limit.limit() >= 1);
            }
        }

        /// The local refusal probability is in [0, 1) and zero while the backend accepts at
        /// least one in K.
        #[test]
        fn the_throttle_probability_is_a_probability(outcomes in proptest::collection::vec(any::<bool>(), 0..300)) {
            let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(120));
            for (i, ok) in outcomes.iter().enumerate() {
                t.record(Nanos(i as u64), *ok);
            }
            let p = t.reject_probability(Nanos(outcomes.len() as u64));
            prop_assert!((0.0..1.0).contains(&p));
            let accepts = outcomes.iter().filter(|o| **o).count();
            if 2 * accepts >= outcomes.len() {
                prop_assert_eq!(p, 0.0);
            }
        }
    }
}
