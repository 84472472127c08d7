//! Demand: what a client says it wants for one group, the one definition every mode uses.
//!
//! A client counts, per group, running totals ([`Counts`]): units asked for (admitted or not,
//! unthrottled work included), units consumed, requests admitted, refused and made to wait.
//! At each report a [`DemandMeter`] turns the totals into a [`ClientReport`] for the engine:
//!
//! - **demand** = the rate of units asked since the last report, or its moving average
//!   (exponential, folding time [`DEMAND_FOLDING_S`]) when that is higher, so a quiet moment
//!   between reports at a fast tick does not drop a busy client at once, while a whole quiet
//!   exchange period at the default tick (a second) leaves under 1 % of it: the share of a
//!   client whose load went elsewhere goes to the busy clients at the next tick;
//! - refused requests are already in what was asked; a client whose requests **had to wait**
//!   since the last report wants more than it got, but asked each request once: its demand is
//!   at least half again its current grant, so waiting work grows its share geometrically
//!   until it is met;
//! - units **waiting** now are reported as they are; the engine adds them to the demand;
//! - unthrottled units are reported as a rate: they count against the group and the capacity;
//! - demand is counted in **settled** units: a request asks for what it is estimated to cost
//!   and settles for what it really cost, so the asked rate is scaled by the ratio of units
//!   consumed (settled) to units admitted (as asked), a moving average with folding time
//!   [`COST_FACTOR_FOLDING_S`]. Requests estimated at 1 RU that really cost 5 ask for five
//!   times their count, which is what they take of a backend and of the group's grant.
//!
//! The embedded limiter, the remote client and the simulator all report through this meter,
//! so a group's demand means the same thing in every mode.

use std::time::Duration;

use crate::engine::ClientReport;
use crate::time::Nanos;

/// Folding time of the demand smoother, seconds: short beside the default exchange period,
/// so an idle client's demand is e⁻⁵ (0.7 %) of what it was after one quiet second.
pub const DEMAND_FOLDING_S: f64 = 0.2;

/// How much more than its grant a refused or waiting client asks for.
pub const HUNGRY_FACTOR: f64 = 1.5;

/// Folding time of the settled-to-asked cost factor, seconds: settlements come as the work
/// ends, often in the report after its admission, so the factor looks over a few of them.
pub const COST_FACTOR_FOLDING_S: f64 = 2.0;

/// The bounds of the settled-to-asked cost factor: an estimate off by more is taken as off by
/// this much, so one odd report cannot turn demand into nothing or into a flood.
pub const COST_FACTOR_BOUNDS: (f64, f64) = (1.0 / 64.0, 64.0);

/// The shortest interval a rate is measured over: a report right after a group appears does
/// not turn its first request into a huge rate.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A client's running totals for one group.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    /// Units asked for, admitted or not, unthrottled work included.
    pub asked: f64,
    /// Units consumed: admitted, corrected by settlements.
    pub consumed: f64,
    /// Units admitted, as they were asked (before settlements): `consumed` over these is what
    /// requests really cost per unit asked.
    pub admitted_units: f64,
    /// Units consumed by unthrottled work.
    pub unthrottled: f64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused.
    pub throttled: u64,
    /// Requests admitted only after waiting.
    pub waited: u64,
    /// What settled requests did, in detail.
    pub detail: crate::cost::Consumption,
    /// Requests admitted in shadow mode that would have been refused.
    pub would_refuse: u64,
    /// Critical and sheddable requests admitted and refused (normal ones are the rest).
    pub classes: [[u64; 2]; 2],
}

/// Turns a group's running totals into reports. See the [module documentation](self).
///
/// ```
/// use tollgate_model::demand::{Counts, DemandMeter};
/// use tollgate_model::time::Nanos;
///
/// let mut meter = DemandMeter::new(Nanos(0));
/// let sec = |s: u64| Nanos(s * 1_000_000_000);
/// let counts = Counts {
///     asked: 300.0, consumed: 200.0, admitted_units: 200.0, admitted: 200, throttled: 100,
///     ..Counts::default()
/// };
/// let r = meter.report(sec(1), counts, 0.0, Some(200.0));
/// assert_eq!(r.consumed, 200.0);
/// assert_eq!(r.throttled, 100.0);
/// assert_eq!(r.demand, 300.0); // refused work is in what was asked
/// ```
#[derive(Debug, Clone)]
pub struct DemandMeter {
    last: Counts,
    last_at: Nanos,
    /// The moving average of the asked rate, units/s.
    average: f64,
    /// The last report that saw the totals move.
    last_moved: Nanos,
    /// Units consumed (settled) per unit admitted as asked, a moving average; 1 until
    /// anything is admitted.
    cost_factor: f64,
}

impl DemandMeter {
    /// A meter for a group that appeared at `now`.
    pub fn new(now: Nanos) -> Self {
        Self { last: Counts::default(), last_at: now, average: 0.0, last_moved: now, cost_factor: 1.0 }
    }

    /// Units consumed (settled) per unit asked, as demand is scaled by.
    pub fn cost_factor(&self) -> f64 {
        self.cost_factor
    }

    /// The report for what happened since the last one, given the totals now, the units
    /// waiting now, and the rate the client holds (`None` when unlimited or not granted yet).
    pub fn report(&mut self, now: Nanos, counts: Counts, waiting: f64, granted: Option<f64>) -> ClientReport {
        let dt = now.since(self.last_at).max(MIN_INTERVAL).as_secs_f64();
        let last = self.last;
        let rate = ((counts.asked - last.asked) / dt).max(0.0);
        // An average of interval rates, weighted by each interval's length: a steady rate
        // averages to itself however often reports come (a smoother of running totals would
        // read high when reports are far apart).
        let keep = (-dt / DEMAND_FOLDING_S).exp();
        self.average = self.average * keep + rate * (1.0 - keep);
        let admitted = counts.admitted_units - last.admitted_units;
        if admitted > 0.0 {
            let (low, high) = COST_FACTOR_BOUNDS;
            let factor = ((counts.consumed - last.consumed) / admitted).clamp(low, high);
            let keep = (-dt / COST_FACTOR_FOLDING_S).exp();
            self.cost_factor = self.cost_factor * keep + factor * (1.0 - keep);
        }
        let mut demand = rate.max(self.average) * self.cost_factor;
        if counts.waited > last.waited
            && let Some(g) = granted.filter(|g| g.is_finite())
        {
            demand = demand.max(g * HUNGRY_FACTOR);
        }
        let report = ClientReport {
            demand,
            unthrottled: ((counts.unthrottled - last.unthrottled).max(0.0) / dt).max(0.0),
            waiting: waiting.max(0.0),
            consumed: (counts.consumed - last.consumed).max(0.0),
            requests: counts.admitted.saturating_sub(last.admitted) as f64,
            throttled: counts.throttled.saturating_sub(last.throttled) as f64,
            held: granted.unwrap_or(0.0).max(0.0),
            waited: counts.waited.saturating_sub(last.waited) as f64,
            detail: counts.detail.since(&last.detail),
            would_refuse: counts.would_refuse.saturating_sub(last.would_refuse) as f64,
            classes: std::array::from_fn(|c| {
                std::array::from_fn(|k| counts.classes[c][k].saturating_sub(last.classes[c][k]))
            }),
            ..ClientReport::default()
        };
        if self.moved(&counts) {
            self.last_moved = now;
        }
        self.last = counts;
        self.last_at = now;
        report
    }

    /// Whether the totals moved since the last report (a group with none for long is idle).
    pub fn moved(&self, counts: &Counts) -> bool {
        counts.asked != self.last.asked || counts.consumed != self.last.consumed
    }

    /// When the last report was made.
    pub fn last_report(&self) -> Nanos {
        self.last_at
    }

    /// Whether the group has seen nothing (the totals are as they were) for at least `expiry`:
    /// a client stops reporting such a group, so the engine forgets it in turn.
    pub fn idle(&self, now: Nanos, counts: &Counts, expiry: Duration) -> bool {
        !self.moved(counts) && now.since(self.last_moved) >= expiry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn demand_is_the_asked_rate_and_refusals_ask_for_more() {
        let mut m = DemandMeter::new(Nanos(0));
        let c = Counts { asked: 100.0, consumed: 100.0, admitted: 100, ..Counts::default() };
        let r = m.report(Nanos(S), c, 0.0, Some(100.0));
        assert!((r.demand - 100.0).abs() < 1e-9, "{r:?}");
        // A second with 100 asked, all met, at a grant of 100: demand stays 100 (the average,
        // still rising, is below the rate).
        let c = Counts { asked: 200.0, consumed: 200.0, admitted: 200, ..Counts::default() };
        assert!((m.report(Nanos(2 * S), c, 0.0, Some(100.0)).demand - 100.0).abs() < 1e-9);
        // A second where it waited: at least 150 (half again the grant).
        let c = Counts { asked: 300.0, consumed: 300.0, admitted: 300, waited: 5, ..Counts::default() };
        assert!((m.report(Nanos(3 * S), c, 0.0, Some(100.0)).demand - 150.0).abs() < 1e-9);
    }

    #[test]
    fn a_quiet_second_decays_rather_than_drops() {
        let mut m = DemandMeter::new(Nanos(0));
        let busy = Counts { asked: 1000.0, ..Counts::default() };
        m.report(Nanos(S), busy, 0.0, None);
        let r = m.report(Nanos(2 * S), busy, 0.0, None);
        assert!(r.demand > 0.0 && r.demand < 1000.0, "{r:?}");
    }

    #[test]
    fn a_whole_quiet_exchange_period_leaves_under_one_percent() {
        // A front end asking 600/s whose load went elsewhere: one quiet second later (the
        // default exchange period) its demand is under 1 % of what it was, so its share goes
        // to the busy front ends at the next tick.
        let mut m = DemandMeter::new(Nanos(0));
        let mut asked = 0.0;
        for s in 1..=5 {
            asked += 600.0;
            m.report(Nanos(s * S), Counts { asked, ..Counts::default() }, 0.0, Some(333.0));
        }
        let r = m.report(Nanos(6 * S), Counts { asked, ..Counts::default() }, 0.0, Some(333.0));
        assert!(r.demand > 0.0 && r.demand < 6.0, "{r:?}");
        // At a fast tick (reports 100 ms apart) a quiet report keeps most of it.
        let mut m = DemandMeter::new(Nanos(0));
        let ms = |n: u64| Nanos(n * 1_000_000);
        for i in 1..=20 {
            m.report(ms(i * 100), Counts { asked: 60.0 * i as f64, ..Counts::default() }, 0.0, None);
        }
        let r = m.report(ms(2100), Counts { asked: 1200.0, ..Counts::default() }, 0.0, None);
        assert!(r.demand > 0.5 * 600.0, "{r:?}");
    }

    #[test]
    fn unthrottled_work_is_a_rate_and_a_first_report_is_not_a_spike() {
        let mut m = DemandMeter::new(Nanos(0));
        // 1 unit asked 1 ms after the group appeared: measured over at least 100 ms.
        let c = Counts { asked: 1.0, unthrottled: 1.0, consumed: 1.0, admitted: 1, ..Counts::default() };
        let r = m.report(Nanos(1_000_000), c, 2.0, None);
        assert!((r.demand - 10.0).abs() < 1e-9, "{r:?}");
        assert!((r.unthrottled - 10.0).abs() < 1e-9);
        assert_eq!(r.waiting, 2.0);
        assert!(!m.moved(&c));
    }

    #[test]
    fn demand_counts_what_requests_really_cost_once_settled() {
        // 100 requests a second asked at 1 unit each, settling at 5: after a few seconds the
        // demand is about 500 units a second, what they take of the grant.
        let mut m = DemandMeter::new(Nanos(0));
        let mut r = ClientReport::default();
        for s in 1..=10u64 {
            let n = 100.0 * s as f64;
            let c = Counts {
                asked: n,
                admitted_units: n,
                consumed: 5.0 * n,
                admitted: 100 * s,
                ..Counts::default()
            };
            r = m.report(Nanos(s * S), c, 0.0, None);
        }
        assert!((r.demand - 500.0).abs() < 500.0 * 0.02, "{r:?}");
        assert!((m.cost_factor() - 5.0).abs() < 0.1, "{}", m.cost_factor());
        // Without settlements the factor stays 1: demand is the asked rate.
        let mut m = DemandMeter::new(Nanos(0));
        let c = Counts {
            asked: 100.0,
            admitted_units: 100.0,
            consumed: 100.0,
            admitted: 100,
            ..Counts::default()
        };
        assert!((m.report(Nanos(S), c, 0.0, None).demand - 100.0).abs() < 1e-9);
    }
}
