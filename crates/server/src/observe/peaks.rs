//! High-water marks per group and per client token (TiDB's diagnostics of slow requests and
//! of each user's consumption).
//!
//! Each exchange tells, per group, the cost of the largest single request its client admitted
//! since the last one (`GroupUsage.largest`). The controller that answers an exchange keeps,
//! per group, the largest of these over the last minute and the last hour; and per client
//! token that made the exchange (with `--auth`), the same, with the rate of its consumption
//! (low and high water marks and average), its units consumed and its requests admitted and
//! refused for want of tokens.
//!
//! Samples are taken at most once a second per group or token, when an exchange arrives: the
//! largest request since the last sample, and the units consumed over the time since it (a
//! token's rate). They go into the same minute and hour rings as the engine's rate marks
//! ([`RateNow`]), about 120 bytes each. At most [`PEAK_GROUPS_MAX`] groups and
//! [`PEAK_TOKENS_MAX`] tokens are kept; one not heard of for an hour is forgotten.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tollgate_model::engine::{RateMarks, RateNow, RateWindows};
use tollgate_model::time::Nanos;
use tollgate_proto::wire::UsageView;

/// The most groups whose largest request is kept.
pub const PEAK_GROUPS_MAX: usize = 100_000;
/// The most client tokens whose marks are kept (as many as the store holds).
pub const PEAK_TOKENS_MAX: usize = crate::access::auth::TOKENS_MAX;
/// How often a sample is taken, at most.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A group or token not heard of for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// How often the forgotten ones are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A value sampled at most once a second into minute and hour rings.
#[derive(Debug, Default)]
struct Sampled {
    now: RateNow,
    rings: Option<Box<RateWindows>>,
}

impl Sampled {
    fn add(&mut self, at: Nanos, value: f64) {
        self.now.add(&mut self.rings, at, value);
    }

    fn marks(&self, now: Nanos) -> (Option<RateMarks>, Option<RateMarks>) {
        self.now.marks(self.rings.as_deref(), now)
    }
}

/// The largest request of a group or token, sampled.
#[derive(Debug)]
struct Largest {
    sampled: Sampled,
    /// The largest since the last sample, and when that sample was taken.
    pending: f64,
    since: Nanos,
    seen: Nanos,
}

impl Largest {
    fn new(now: Nanos) -> Self {
        Largest { sampled: Sampled::default(), pending: 0.0, since: now, seen: now }
    }

    /// Whether a sample is due at `now`; if so, takes the pending one.
    fn sample(&mut self, now: Nanos) -> Option<Duration> {
        let elapsed = now.since(self.since);
        if elapsed < SAMPLE_EVERY {
            return None;
        }
        self.sampled.add(now, std::mem::take(&mut self.pending));
        self.since = now;
        Some(elapsed)
    }

    fn note(&mut self, now: Nanos, largest: f64) {
        self.seen = now;
        self.pending = self.pending.max(largest);
    }

    /// The largest over the last minute and hour (0: none).
    fn highs(&self, now: Nanos) -> (f64, f64) {
        let (minute, hour) = self.sampled.marks(now);
        let high = |m: Option<RateMarks>| m.map_or(0.0, |m| m.high).max(self.pending);
        (high(minute), high(hour))
    }
}

/// A client token's marks.
#[derive(Debug)]
struct Token {
    label: String,
    largest: Largest,
    rate: Sampled,
    /// Units consumed since the last sample.
    units: f64,
    consumed_total: f64,
    admitted_total: u64,
    throttled_total: u64,
}

impl Token {
    fn new(now: Nanos, label: String) -> Token {
        Token {
            label,
            largest: Largest::new(now),
            rate: Sampled::default(),
            units: 0.0,
            consumed_total: 0.0,
            admitted_total: 0,
            throttled_total: 0,
        }
    }
}

/// What is shown of one token ([`Peaks::tokens`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenPeaks {
    /// The token's id.
    pub id: String,
    /// How people know it: its label (id, role and name).
    pub label: String,
    /// Units consumed, requests admitted and refused, since this controller first heard of it.
    pub consumed_total: f64,
    /// Requests admitted.
    pub admitted_total: u64,
    /// Requests refused for want of tokens.
    pub throttled_total: u64,
    /// The rate of its consumption, units/s, over the last minute and the last hour.
    pub last_minute: Option<RateMarks>,
    /// The same over the last hour.
    pub last_hour: Option<RateMarks>,
    /// The cost of its largest single request over the last minute and the last hour (0:
    /// none told).
    pub largest: (f64, f64),
}

#[derive(Debug, Default)]
struct Inner {
    groups: HashMap<String, Largest>,
    tokens: HashMap<String, Token>,
    swept: Nanos,
}

/// The high-water marks. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct Peaks {
    inner: Mutex<Inner>,
}

/// Who made an exchange: a client token's id, and its label, made only when the token is
/// first heard of (a token's id, role and name never change).
pub type Maker<'a> = Option<(&'a str, &'a dyn Fn() -> String)>;

impl Peaks {
    /// Takes an exchange answered at `now`, its values checked, made with `token` (its id and
    /// label; `None` without authentication, or for one passed on by another controller).
    /// `answered_here`: this controller granted it, and keeps its groups' marks; else it
    /// passed it on to the controller that does, and keeps the token's alone.
    pub fn exchange(&self, now: Nanos, token: Maker<'_>, groups: &[UsageView<'_>], answered_here: bool) {
        // Most exchanges of a server without tokens tell no largest request (the benchmarks'
        // do not): they take no lock.
        if token.is_none() && !(answered_here && groups.iter().any(|g| g.largest > 0.0)) {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.sweep(now);
        let largest = groups.iter().map(|g| g.largest).fold(0.0, f64::max);
        for g in groups.iter().filter(|g| answered_here && g.largest > 0.0) {
            let full = inner.groups.len() >= PEAK_GROUPS_MAX;
            let mark = match inner.groups.get_mut(g.group) {
                Some(m) => m,
                None if full => continue,
                None => inner.groups.entry(g.group.to_string()).or_insert_with(|| Largest::new(now)),
            };
            mark.sample(now);
            mark.note(now, g.largest);
        }
        let Some((id, label)) = token else { return };
        let full = inner.tokens.len() >= PEAK_TOKENS_MAX;
        let (t, new) = match inner.tokens.get_mut(id) {
            Some(t) => (t, false),
            None if full => return,
            None => (inner.tokens.entry(id.to_string()).or_insert_with(|| Token::new(now, label())), true),
        };
        let consumed: f64 = groups.iter().map(|g| g.consumed).sum();
        t.consumed_total += consumed;
        for g in groups {
            t.admitted_total = t.admitted_total.saturating_add(g.admitted);
            t.throttled_total = t.throttled_total.saturating_add(g.throttled);
        }
        // What a token's first exchange tells was consumed over a time not known: it counts
        // in the totals, not in a rate.
        if !new {
            t.units += consumed;
        }
        if let Some(elapsed) = t.largest.sample(now) {
            t.rate.add(now, std::mem::take(&mut t.units) / elapsed.as_secs_f64());
        }
        t.largest.note(now, largest);
    }

    /// Each group's largest request over the last minute and the last hour, by name.
    pub fn groups(&self, now: Nanos) -> HashMap<String, (f64, f64)> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.groups.iter().map(|(name, m)| (name.clone(), m.highs(now))).collect()
    }

    /// The tokens' marks, the most consumed first, at most `max`.
    pub fn tokens(&self, now: Nanos, max: usize) -> Vec<TokenPeaks> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<TokenPeaks> = inner
            .tokens
            .iter()
            .map(|(id, t)| {
                let (last_minute, last_hour) = t.rate.marks(now);
                TokenPeaks {
                    id: id.clone(),
                    label: t.label.clone(),
                    consumed_total: t.consumed_total,
                    admitted_total: t.admitted_total,
                    throttled_total: t.throttled_total,
                    last_minute,
                    last_hour,
                    largest: t.largest.highs(now),
                }
            })
            .collect();
        out.sort_by(|a, b| b.consumed_total.total_cmp(&a.consumed_total).then_with(|| a.id.cmp(&b.id)));
        out.truncate(max);
        out
    }
}

impl Inner {
    /// Forgets what was not heard of for an hour, once a minute.
    fn sweep(&mut self, now: Nanos) {
        if now.since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        self.groups.retain(|_, m| now.since(m.seen) < FORGET_AFTER);
        self.tokens.retain(|_, t| now.since(t.largest.seen) < FORGET_AFTER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64) -> Nanos {
        Nanos::ZERO.after(Duration::from_secs_f64(s))
    }

    fn usage(group: &str, consumed: f64, throttled: u64, largest: f64) -> UsageView<'_> {
        UsageView { group, consumed, admitted: 1, throttled, largest, ..UsageView::default() }
    }

    /// A group's largest request stays the minute's mark for a minute, the hour's for an
    /// hour, then is forgotten with the group.
    #[test]
    fn a_groups_largest_request_is_kept_for_its_windows() {
        let peaks = Peaks::default();
        peaks.exchange(at(1.0), None, &[usage("a", 10.0, 0, 500.0)], true);
        for s in 2..=5 {
            peaks.exchange(at(f64::from(s)), None, &[usage("a", 10.0, 0, 3.0)], true);
        }
        assert_eq!(peaks.groups(at(5.0))["a"], (500.0, 500.0));
        for s in (10..=200).step_by(5) {
            peaks.exchange(at(f64::from(s)), None, &[usage("a", 10.0, 0, 3.0)], true);
        }
        assert_eq!(peaks.groups(at(200.0))["a"], (3.0, 500.0), "the minute has moved on");
        peaks.exchange(at(4000.0), None, &[usage("b", 1.0, 0, 1.0)], true);
        assert!(!peaks.groups(at(4000.0)).contains_key("a"), "forgotten after an hour unheard");
    }

    /// A token's rate is its units over the time between samples; its totals add up over
    /// its groups; without a token nothing is kept per token.
    #[test]
    fn a_tokens_rate_largest_request_and_refusals_add_up() {
        let peaks = Peaks::default();
        let label = || "token t1 (client, app)".to_string();
        let token = || Some(("t1", &label as &dyn Fn() -> String));
        peaks.exchange(at(0.0), token(), &[], false);
        for s in 1..=10 {
            let groups = [usage("a", 60.0, 1, 4.0), usage("b", 40.0, 0, if s == 5 { 90.0 } else { 2.0 })];
            peaks.exchange(at(f64::from(s)), token(), &groups, false);
        }
        peaks.exchange(at(11.0), None, &[usage("a", 1000.0, 5, 1000.0)], true);
        assert!(!peaks.groups(at(11.0)).contains_key("b"), "passed on: kept by the controller that answers");
        let t = &peaks.tokens(at(11.0), 10)[0];
        assert_eq!(
            (t.id.as_str(), t.consumed_total, t.admitted_total, t.throttled_total),
            ("t1", 1000.0, 20, 10)
        );
        let minute = t.last_minute.unwrap();
        assert_eq!((minute.low, minute.high, minute.average), (100.0, 100.0, 100.0), "{minute:?}");
        assert_eq!(t.largest, (90.0, 90.0));
        assert_eq!(peaks.tokens(at(11.0), 10).len(), 1);
    }
}
