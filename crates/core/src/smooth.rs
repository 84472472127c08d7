//! Smoothers: lagging views of a running total, and estimates of its rate.
//!
//! These follow FoundationDB's definitions exactly (`fdbrpc/Smoother.h`, described in our
//! research note on the global tag throttler), because the controller's convergence
//! behaviour, and the tests that pin it, depend on them. Both start with time 0 and value 0;
//! time is passed in as [`Nanos`], never read.

use crate::time::Nanos;

/// Simple exponential smoothing with folding time `τ`.
///
/// `estimate` chases `total`: at each update it closes the fraction `1 − e^(−Δt/τ)` of the
/// gap. [`smooth_rate`](Self::smooth_rate) = `(total − estimate)/τ` estimates d(total)/dt,
/// and converges to `R` for a steady stream of deltas at rate `R`.
///
/// ```
/// use tollgate_model::smooth::Smoother;
/// use tollgate_model::time::Nanos;
///
/// let mut s = Smoother::new(1.0);
/// for ms in (0..20_000).step_by(10) {
///     s.add_delta(Nanos(ms * 1_000_000), 5.0); // 500 units/s
/// }
/// // Within 1%: discrete deltas bias the estimate by about half a delta.
/// assert!((s.smooth_rate(Nanos(20_000_000_000)) - 500.0).abs() < 5.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Smoother {
    folding_time_s: f64,
    total: f64,
    estimate: f64,
    time_s: f64,
}

impl Smoother {
    /// A smoother with folding time `folding_time_s` seconds. Panics unless it is above 0.
    pub fn new(folding_time_s: f64) -> Self {
        assert!(folding_time_s > 0.0 && folding_time_s.is_finite(), "folding time must be > 0");
        Self { folding_time_s, total: 0.0, estimate: 0.0, time_s: 0.0 }
    }

    fn update(&mut self, now: Nanos) {
        let t = now.as_secs_f64();
        if t != self.time_s {
            let elapsed = t - self.time_s;
            self.estimate += (self.total - self.estimate) * (1.0 - (-elapsed / self.folding_time_s).exp());
            self.time_s = t;
        }
    }

    /// Adds `delta` to the total at `now`.
    pub fn add_delta(&mut self, now: Nanos, delta: f64) {
        self.update(now);
        self.total += delta;
    }

    /// Sets the total to `total` at `now`.
    pub fn set_total(&mut self, now: Nanos, total: f64) {
        let delta = total - self.total;
        self.add_delta(now, delta);
    }

    /// The lagging view of the total at `now`.
    pub fn smooth_total(&mut self, now: Nanos) -> f64 {
        self.update(now);
        self.estimate
    }

    /// The estimated rate of change of the total at `now`, per second.
    pub fn smooth_rate(&mut self, now: Nanos) -> f64 {
        self.update(now);
        (self.total - self.estimate) / self.folding_time_s
    }

    /// The same as [`smooth_rate`](Self::smooth_rate), without folding the state forward.
    pub fn estimate_rate(&self, now: Nanos) -> f64 {
        let elapsed = now.as_secs_f64() - self.time_s;
        let estimate = if elapsed != 0.0 {
            self.estimate + (self.total - self.estimate) * (1.0 - (-elapsed / self.folding_time_s).exp())
        } else {
            self.estimate
        };
        (self.total - estimate) / self.folding_time_s
    }

    /// The raw total.
    pub fn total(&self) -> f64 {
        self.total
    }
}

/// Holt's linear (double exponential) smoothing: a level folded over `τ_data` and a trend
/// folded over `τ_trend`. FoundationDB counts each tag's transactions with one (2 s and 10 s).
///
/// ```
/// use tollgate_model::smooth::HoltLinearSmoother;
/// use tollgate_model::time::Nanos;
///
/// let mut s = HoltLinearSmoother::new(2.0, 10.0);
/// for ms in (0..120_000u64).step_by(100) {
///     s.add_delta(Nanos(ms * 1_000_000), 10.0); // 100 per second
/// }
/// assert!((s.smooth_rate(Nanos(120_000_000_000)) - 100.0).abs() < 2.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HoltLinearSmoother {
    data_folding_s: f64,
    trend_folding_s: f64,
    total: f64,
    last_estimate: f64,
    last_rate: f64,
    last_time_s: f64,
}

impl HoltLinearSmoother {
    /// A smoother with the two folding times in seconds. Panics unless both are above 0.
    pub fn new(data_folding_s: f64, trend_folding_s: f64) -> Self {
        assert!(data_folding_s > 0.0 && trend_folding_s > 0.0, "folding times must be > 0");
        Self {
            data_folding_s,
            trend_folding_s,
            total: 0.0,
            last_estimate: 0.0,
            last_rate: 0.0,
            last_time_s: 0.0,
        }
    }

    /// The smoothed total at `now`: `α·total + (1−α)·(last_estimate + e·last_rate)`.
    pub fn smooth_total(&self, now: Nanos) -> f64 {
        let elapsed = now.as_secs_f64() - self.last_time_s;
        let alpha = 1.0 - (-elapsed / self.data_folding_s).exp();
        alpha * self.total + (1.0 - alpha) * (self.last_estimate + elapsed * self.last_rate)
    }

    /// The smoothed rate at `now`.
    pub fn smooth_rate(&self, now: Nanos) -> f64 {
        let elapsed = now.as_secs_f64() - self.last_time_s;
        if elapsed == 0.0 {
            return self.last_rate;
        }
        let beta = 1.0 - (-elapsed / self.trend_folding_s).exp();
        beta * ((self.smooth_total(now) - self.last_estimate) / elapsed) + (1.0 - beta) * self.last_rate
    }

    /// Adds `delta` at `now`, first folding the state forward with the old total.
    pub fn add_delta(&mut self, now: Nanos, delta: f64) {
        let t = now.as_secs_f64();
        if t != self.last_time_s {
            let rate = self.smooth_rate(now);
            let estimate = self.smooth_total(now);
            self.last_estimate = estimate;
            self.last_rate = rate;
            self.last_time_s = t;
        }
        self.total += delta;
    }

    /// The raw total.
    pub fn total(&self) -> f64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn exponential_matches_hand_computed_steps() {
        let mut s = Smoother::new(2.0);
        // State starts at 0: a delta at t=0 moves the total, not the estimate.
        s.add_delta(Nanos(0), 10.0);
        assert_eq!(s.smooth_total(Nanos(0)), 0.0);
        assert!(close(s.smooth_rate(Nanos(0)), 5.0)); // (10 − 0)/2
        // One second later the estimate closed 1 − e^(−1/2) of the gap.
        let expected = 10.0 * (1.0 - (-0.5f64).exp());
        assert!(close(s.smooth_total(Nanos(S)), expected));
        assert!(close(s.smooth_rate(Nanos(S)), (10.0 - expected) / 2.0));
        // set_total is add_delta of the difference.
        s.set_total(Nanos(2 * S), 4.0);
        let after = expected + (10.0 - expected) * (1.0 - (-0.5f64).exp());
        assert!(close(s.smooth_total(Nanos(2 * S)), after));
        assert_eq!(s.total(), 4.0);
    }

    #[test]
    fn estimate_rate_matches_smooth_rate() {
        let mut s = Smoother::new(2.0);
        s.add_delta(Nanos(S), 10.0);
        let at = Nanos(3 * S);
        let read_only = s.estimate_rate(at);
        assert!(close(read_only, s.smooth_rate(at)));
    }

    #[test]
    fn exponential_starts_from_zero_at_time_zero() {
        // A first sample long after the origin folds from estimate 0 over that whole time.
        let mut s = Smoother::new(10.0);
        s.set_total(Nanos(100 * S), 1000.0);
        assert_eq!(s.smooth_total(Nanos(100 * S)), 0.0);
        assert!(close(s.smooth_total(Nanos(110 * S)), 1000.0 * (1.0 - (-1.0f64).exp())));
    }

    #[test]
    fn holt_matches_hand_computed_steps() {
        let mut s = HoltLinearSmoother::new(2.0, 10.0);
        s.add_delta(Nanos(0), 5.0); // elapsed 0: no fold, total = 5
        assert_eq!(s.smooth_rate(Nanos(0)), 0.0);
        // At t=1: α = 1 − e^(−1/2), β = 1 − e^(−1/10).
        let alpha = 1.0 - (-0.5f64).exp();
        let beta = 1.0 - (-0.1f64).exp();
        let total = alpha * 5.0;
        let rate = beta * total;
        assert!(close(s.smooth_total(Nanos(S)), total));
        assert!(close(s.smooth_rate(Nanos(S)), rate));
        s.add_delta(Nanos(S), 5.0);
        assert!(close(s.smooth_rate(Nanos(S)), rate)); // elapsed 0 after the fold
        // At t=2 the fold starts from (total, rate) at t=1 with the new total 10.
        let total2 = alpha * 10.0 + (1.0 - alpha) * (total + rate);
        let rate2 = beta * (total2 - total) + (1.0 - beta) * rate;
        assert!(close(s.smooth_total(Nanos(2 * S)), total2));
        assert!(close(s.smooth_rate(Nanos(2 * S)), rate2));
    }
}
