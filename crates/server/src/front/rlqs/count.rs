//! Quotas per window through Envoy's quota filter: what Envoy may admit, counted ahead.
//!
//! Envoy admits on its own, from the token bucket it was last assigned, and says what it
//! admitted only at its next report. So for a group with quotas, a stream takes allotments
//! from the controller as a client does ([`tollgate_model::engine::Allotment`]), and gives
//! each of the group's buckets an assignment whose most Envoy could admit under it, the
//! burst it starts with and its refill until its time to live runs out, is covered by the
//! allotment before it is sent:
//!
//! - An assignment is a token bucket **paced** at about the bucket's demand, with a burst of
//!   a second of that pace: it costs its burst plus its pace over its time to live (and a
//!   second of slack, for the moment Envoy takes to apply it). Renewing it before it runs out
//!   costs its pace over the time it adds.
//! - What a bucket may still admit is the smaller of what it was given less what it reported
//!   since, and what its burst and pace allow until its assignment ends: units a quiet bucket
//!   could not use come back by themselves.
//! - An assignment replaced may have admitted a little before Envoy took its replacement:
//!   what it had left stays counted until two reports have come since.
//! - When the allotment covers no more, the bucket is told to deny all; when the window
//!   ends, every bucket gets a new assignment from the new window's allotment.
//!
//! So what Envoy admits never passes what the controller allotted, as long as the stream
//! holds: Envoy's own fallbacks (`no_assignment_behavior` before the first assignment,
//! `expired_assignment_behavior` when Tollgate is gone) admit what they are configured to,
//! and it is counted when reported.

use std::collections::HashMap;
use std::time::Duration;

use tollgate_model::time::Nanos;
use tollgate_proto::v1;

use super::{Assignment, Bucket, Demands, Key, Session};

/// How long past its time to live an assignment may still be in force: Envoy counts the time
/// to live from when it takes the assignment, a moment after it was sent.
pub(super) const SLACK: Duration = Duration::from_secs(1);

/// How far (a fraction) the pace a quota bucket would be given must move before its
/// assignment is replaced: a replacement costs its burst again.
pub(super) const PACE_HYSTERESIS: f64 = 0.25;

/// The slowest pace a bucket is given: one request per this many seconds.
pub(super) const SLOWEST_EVERY_S: u32 = 3600;

/// A bucket's pace over its demand: room for it to grow between reports.
pub(super) const PACE_OVER_DEMAND: f64 = 1.25;

/// The pace of a bucket that asked for nothing yet, units/s: its first requests are admitted
/// at once, and cost little while it stays quiet.
pub(super) const IDLE_PACE: f64 = 0.1;

/// A token bucket paced for a quota: `per_fill` tokens every `every_s` seconds, at most `max`
/// banked (and at first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    pub(super) per_fill: u32,
    pub(super) every_s: u32,
    pub(super) max: u32,
}

impl Pace {
    /// Units/s.
    pub(super) fn rate(self) -> f64 {
        f64::from(self.per_fill) / f64::from(self.every_s)
    }

    /// The most Envoy may admit under it over `life`: its burst and its refill.
    pub(super) fn cost(self, life: Duration) -> f64 {
        f64::from(self.max) + self.rate() * life.as_secs_f64()
    }

    /// Whether `self` is close enough to `other` to keep `other` in force.
    pub(super) fn near(self, other: Pace) -> bool {
        let (a, b) = (self.rate(), other.rate());
        (a - b).abs() <= PACE_HYSTERESIS * a.max(b)
    }

    /// The pace nearest `rate` units/s with a burst of `burst` whose cost over `life` is at
    /// most `budget`: slower, and with a burst of one, when the budget is short. `None` when
    /// it does not cover one request and its refill.
    pub(super) fn within(rate: f64, burst: f64, budget: f64, life: Duration) -> Option<Pace> {
        let life_s = life.as_secs_f64().max(1.0);
        let mut max = burst.floor().clamp(1.0, f64::from(u32::MAX));
        let mut rate = rate.max(1.0 / f64::from(SLOWEST_EVERY_S));
        if max + rate * life_s > budget {
            max = 1.0;
            rate = rate.min((budget - max) / life_s);
        }
        if rate * f64::from(SLOWEST_EVERY_S) < 1.0 {
            return None;
        }
        let pace = if rate >= 1.0 {
            Pace { per_fill: rate.floor().min(f64::from(u32::MAX)) as u32, every_s: 1, max: max as u32 }
        } else {
            // Rounded up, so the pace is never above the rate.
            Pace { per_fill: 1, every_s: (1.0 / rate).ceil() as u32, max: max as u32 }
        };
        (pace.cost(life) <= budget + 1e-9).then_some(pace)
    }
}

/// What one bucket of a group with quotas may still admit, as its stream counts it, in units
/// (each of its requests costs `per_request`; its paces are in requests, as Envoy counts).
#[derive(Debug, Clone, Copy)]
pub(super) struct Count {
    /// Units one of the bucket's requests costs.
    per_request: f64,
    /// Under the assignment in force: units still covered (what it cost, and what renewals
    /// added, less what was reported since), its pace (none: it denies all) and when it
    /// ends.
    left: f64,
    pace: Option<Pace>,
    until: Nanos,
    /// Of assignments replaced, units they may have admitted before Envoy took the
    /// replacement: this window's, and earlier windows' (which no longer count in it), kept
    /// until `settle` more reports have come.
    replaced: f64,
    earlier: f64,
    settle: u8,
}

impl Default for Count {
    fn default() -> Count {
        Count::of(1.0)
    }
}

impl Count {
    /// Nothing counted yet, for a bucket whose requests cost `per_request` units each.
    pub(super) fn of(per_request: f64) -> Count {
        Count { per_request, left: 0.0, pace: None, until: Nanos(0), replaced: 0.0, earlier: 0.0, settle: 0 }
    }

    /// What `requests` of the bucket's cost.
    fn units(&self, requests: f64) -> f64 {
        requests * self.per_request
    }

    /// Takes a report of `allowed` units: returns those that count in the window under way
    /// (those of an earlier window's assignment do not).
    pub(super) fn take(&mut self, allowed: f64) -> f64 {
        let earlier = allowed.min(self.earlier);
        self.earlier -= earlier;
        let rest = allowed - earlier;
        let replaced = rest.min(self.replaced);
        self.replaced -= replaced;
        self.left = (self.left - (rest - replaced)).max(0.0);
        if self.settle > 0 {
            self.settle -= 1;
            if self.settle == 0 {
                (self.replaced, self.earlier) = (0.0, 0.0);
            }
        }
        rest
    }

    /// Units Envoy may still admit under the assignments sent, or admitted without reporting
    /// yet, counted in the window under way: at most what is covered, and at most its burst
    /// twice (the one it may hold now, and one spent since `last_report`) and its refill until
    /// its assignment ends.
    pub(super) fn committed(&self, last_report: Nanos) -> f64 {
        let could = self
            .pace
            .map_or(0.0, |p| 2.0 * f64::from(p.max) + p.rate() * self.until.since(last_report).as_secs_f64());
        self.left.min(self.units(could)) + self.replaced
    }

    /// Replaces the assignment in force with `pace` (none: deny all) until `until`, covering
    /// `cost`, at `now`. What the last one may have admitted and not yet reported (at most
    /// its burst twice and its refill since the last report, and until Envoy takes the
    /// replacement) stays counted for two reports; the rest of it goes with it.
    pub(super) fn replace(
        &mut self,
        pace: Option<Pace>,
        until: Nanos,
        cost: f64,
        (now, last_report): (Nanos, Nanos),
    ) {
        let unreported = self.pace.map_or(0.0, |p| {
            2.0 * f64::from(p.max) + p.rate() * (now.since(last_report) + SLACK).as_secs_f64()
        });
        self.replaced += self.left.min(self.units(unreported));
        (self.left, self.pace, self.until, self.settle) = (cost, pace, until, 2);
    }

    /// Extends the assignment in force to `until`: returns what that costs.
    pub(super) fn renewal_cost(&self, until: Nanos) -> f64 {
        self.pace.map_or(0.0, |p| self.units(p.rate() * until.since(self.until).as_secs_f64()))
    }

    /// Extends the assignment in force to `until`, covering `cost` more.
    pub(super) fn renew(&mut self, until: Nanos, cost: f64) {
        self.left += cost;
        self.until = self.until.max(until);
    }

    /// A new window: what the assignments sent may still admit belongs to the last one.
    pub(super) fn new_window(&mut self, last_report: Nanos) {
        self.earlier += self.committed(last_report);
        (self.left, self.replaced, self.settle) = (0.0, 0.0, 2);
    }
}

/// A group's allotment on one stream, in the window under way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Book {
    /// The window (its start, Unix ms), as the controller names it.
    pub(super) window: u64,
    /// Units the controller allotted in it, less what was given back.
    pub(super) given: f64,
    /// Units Envoy reported it admitted under this window's assignments.
    pub(super) used: f64,
}

impl Book {
    /// What the stream holds and has not yet assigned, after `committed` units assigned.
    pub(super) fn free(&self, committed: f64) -> f64 {
        (self.given - self.used - committed).max(0.0)
    }

    /// What to report it holds: what is assigned, and at most `keep` units more; the rest
    /// goes back to the controller.
    pub(super) fn report(&mut self, committed: f64, keep: f64) -> (f64, f64) {
        let held = self.used + committed + self.free(committed).min(keep.max(0.0));
        self.given = self.given.min(held).max(self.used);
        (self.given, self.used)
    }
}

/// The pace (units/s, and a burst) that bucket `b`'s demand asks for, within its `part` of a
/// limited group's `grant`.
fn asked_pace(b: &Bucket, grant: &v1::Grant, part: f64) -> (f64, f64) {
    let rate = (b.demand * PACE_OVER_DEMAND).max(IDLE_PACE * b.cost);
    let burst = b.cost.max(rate);
    if grant.unlimited { (rate, burst) } else { (rate.min(grant.rate * part), burst.min(grant.burst * part)) }
}

/// The buckets of `group` in key order (each counting afresh when a window is `fresh`), the
/// units they committed, and their demand.
fn group_buckets(buckets: &mut HashMap<Key, Bucket>, group: &str, fresh: bool) -> (Vec<Key>, f64, Demands) {
    let mut keys: Vec<Key> = buckets
        .iter()
        .filter(|(_, b)| b.group.as_ref().is_ok_and(|g| g.as_str() == group))
        .map(|(k, _)| k.clone())
        .collect();
    keys.sort();
    let mut committed = 0.0;
    let mut demand = Demands::default();
    for k in &keys {
        let b = buckets.get_mut(k).expect("listed above");
        if fresh {
            b.count.new_window(b.last_report);
        }
        committed += b.count.committed(b.last_report);
        demand.add(b);
    }
    (keys, committed, demand)
}

impl Book {
    /// The book of `group` in `books` after its allotment `q` (begun afresh when `q` is of a
    /// new window), and whether it was begun afresh.
    fn of<'b>(
        books: &'b mut HashMap<String, Book>,
        group: &str,
        q: &v1::QuotaAllotment,
    ) -> (&'b mut Book, bool) {
        let book = books.entry(group.to_string()).or_insert(Book { window: q.window, given: 0.0, used: 0.0 });
        let fresh = book.window != q.window;
        if fresh {
            *book = Book { window: q.window, given: 0.0, used: 0.0 };
        }
        if q.add.is_finite() && q.add > 0.0 {
            book.given += q.add;
        }
        (book, fresh)
    }
}

impl Session {
    /// The assignments of `grant`'s group, which has quotas, after its allotment `q`: each
    /// bucket's pace renewed while its allotment covers it, replaced when its demand moved
    /// past [`PACE_HYSTERESIS`] (and the allotment covers the new one), slowed to what is
    /// left, or deny-all; every bucket anew when a window starts. Each with its time to live,
    /// and whether it renews the one in force.
    pub(super) fn assign_counted(
        &mut self,
        now: Nanos,
        grant: &v1::Grant,
        q: &v1::QuotaAllotment,
    ) -> Vec<(Key, Assignment, Duration, bool)> {
        // Envoy reads whole seconds: rounded down, never below two.
        let ttl = Duration::from_secs((u64::from(grant.lease_ms) / 1000).max(2));
        let life = ttl + SLACK;
        let until = now.after(life);
        let (book, fresh) = Book::of(&mut self.books, &grant.group, q);
        let (keys, committed, demand) = group_buckets(&mut self.buckets, &grant.group, fresh);
        let mut free = book.free(committed);
        let mut out = Vec::new();
        for k in keys {
            let b = self.buckets.get_mut(&k).expect("listed above");
            let part = if demand.total() > 0.0 { demand.part(b, grant.rate) } else { 1.0 };
            let (rate, burst) = asked_pace(b, grant, part);
            let due = b.assigned.is_none_or(|(_, at, sent_ttl)| now.since(at) >= sent_ttl / 2);
            let held = b.assigned.map(|(a, _, _)| a).filter(|_| !fresh);
            // Envoy's tokens are requests: the pace in requests, what it covers in units.
            let per = b.cost;
            let wanted = Pace::within(rate / per, burst / per, f64::INFINITY, life);
            // What the allotment covers now, as a new assignment.
            let covered = Pace::within(rate / per, burst / per, free / per, life);
            let grows = |p: Pace| covered.is_some_and(|c| c.rate() >= p.rate() * (1.0 + PACE_HYSTERESIS));
            if let Some(Assignment::Paced(p)) = held {
                // Kept until it is due, unless the demand and the allotment let it grow.
                if !due && !grows(p) {
                    continue;
                }
                // Renewed while the demand has not fallen away from it (a slower one would
                // cost its burst again).
                let cost = b.count.renewal_cost(until);
                let fell = wanted.is_some_and(|w| !w.near(p) && w.rate() < p.rate());
                if due && !fell && !grows(p) && cost <= free {
                    free -= cost;
                    b.count.renew(until, cost);
                    out.push((k, Assignment::Paced(p), ttl, true));
                    continue;
                }
            }
            match covered {
                Some(p) => {
                    let cost = p.cost(life) * per;
                    free -= cost;
                    b.count.replace(Some(p), until, cost, (now, b.last_report));
                    out.push((k, Assignment::Paced(p), ttl, false));
                }
                // Nothing covered: deny all (again, when due).
                None if held == Some(Assignment::DenyAll) => {
                    if due {
                        out.push((k, Assignment::DenyAll, ttl, true));
                    }
                }
                None => {
                    b.count.replace(None, until, 0.0, (now, b.last_report));
                    out.push((k, Assignment::DenyAll, ttl, false));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Controller;
    use crate::front::rlqs::{Strategy, bucket_action};
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;
    use tollgate_model::engine::EngineSettings;
    use tollgate_model::rls::{RlsRule, RuleSet};
    use tollgate_model::settings::{BudgetPeriod, GroupName, GroupSettings};

    const S: u64 = 1_000_000_000;

    /// One Envoy bucket as Envoy 1.40 keeps it: the assignment in force (a token bucket
    /// started full when it changes, allow-all, or deny-all) until its time to live runs out,
    /// then deny-all (the fallback a quota needs), and what it admitted since its last report.
    /// A token bucket in Envoy: tokens, max, units/s, and the strategy's identity (what
    /// Envoy compares to tell a change).
    type Held = (f64, f64, f64, (u32, u32, i32));

    #[derive(Debug, Default)]
    struct EnvoyBucket {
        bucket: Option<Held>,
        allow_all: bool,
        expires: u64,
        allowed: u64,
        denied: u64,
        /// Start from what the old bucket held (in proportion) rather than full, as later
        /// Envoys do.
        keeps_ratio: bool,
    }

    impl EnvoyBucket {
        fn apply(&mut self, now: u64, strategy: Strategy, ttl_s: i64) {
            self.expires = now + u64::try_from(ttl_s).unwrap() * S;
            self.allow_all = false;
            match strategy {
                Strategy::TokenBucket(t) => {
                    let interval = t.fill_interval.unwrap();
                    let id = (t.max_tokens, t.tokens_per_fill.unwrap().value, interval.nanos);
                    let rate = f64::from(id.1) / interval.seconds as f64;
                    let max = f64::from(t.max_tokens);
                    self.bucket = match self.bucket {
                        Some(b) if b.3 == id => Some(b),
                        Some((tokens, old_max, _, _)) if self.keeps_ratio => {
                            Some((max * tokens / old_max, max, rate, id))
                        }
                        _ => Some((max, max, rate, id)),
                    };
                }
                Strategy::BlanketRule(r) => {
                    self.bucket = None;
                    self.allow_all = r == BlanketRule::AllowAll as i32;
                }
                _ => unreachable!(),
            }
        }

        /// A request at `now`, `dt` seconds after the last step.
        fn ask(&mut self, now: u64) -> bool {
            let ok = now < self.expires
                && (self.allow_all
                    || match &mut self.bucket {
                        Some((tokens, _, _, _)) if *tokens >= 1.0 => {
                            *tokens -= 1.0;
                            true
                        }
                        _ => false,
                    });
            if ok {
                self.allowed += 1;
            } else {
                self.denied += 1;
            }
            ok
        }

        fn refill(&mut self, dt: f64) {
            if let Some((tokens, max, rate, _)) = &mut self.bucket {
                *tokens = (*tokens + *rate * dt).min(*max);
            }
        }
    }

    /// A usage of a bucket whose requests cost `cost` units each.
    fn costing(tenant: &str, cost: u64, allowed: u64, denied: u64) -> BucketQuotaUsage {
        let mut bucket: std::collections::HashMap<String, String> =
            [("tenant".to_string(), tenant.to_string())].into();
        if cost != 1 {
            bucket.insert("tollgate_cost".into(), cost.to_string());
        }
        BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }
    }

    /// Envoys with one bucket each of group `acme`, whose quota is `settings`, asked
    /// `demand(envoy, second)` requests a second for `secs` seconds: each reports every 5 s
    /// (and at its first request), and takes each assignment at once. Returns what each
    /// admitted in each second.
    fn run(
        settings: GroupSettings,
        envoys: usize,
        keeps_ratio: bool,
        secs: u64,
        demand: impl Fn(usize, u64) -> f64,
    ) -> Vec<Vec<u64>> {
        run_costing(settings, envoys, keeps_ratio, secs, 1, demand)
    }

    /// A controller holding the group `acme` with `settings`.
    fn controller_with(settings: GroupSettings) -> Controller {
        let store = Box::new(crate::store::MemoryStore::default());
        let c = Controller::new(store, EngineSettings::default(), Nanos(0), 0).unwrap();
        let acme = GroupName::new("acme").unwrap();
        c.admin().set_group(acme, settings, "test", crate::clock::wall_ms()).unwrap();
        c
    }

    /// One Envoy's exchange at `now`: its session's exchanges with the controller, and the
    /// assignments they make applied to its bucket.
    fn exchange_and_assign(c: &Controller, session: &mut Session, bucket: &mut EnvoyBucket, now: u64) {
        let mut grants = Vec::new();
        for req in session.exchanges(false) {
            grants.extend(c.exchange(Nanos(now), &req).unwrap().grants);
        }
        for a in session.assign(Nanos(now), &grants).actions {
            let Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) = a.bucket_action else {
                continue;
            };
            let ttl = q.assignment_time_to_live.unwrap().seconds;
            bucket.apply(now, q.rate_limit_strategy.unwrap().strategy.unwrap(), ttl);
        }
    }

    /// As [`run`], each request costing `cost` units: requests admitted per Envoy and second.
    fn run_costing(
        settings: GroupSettings,
        envoys: usize,
        keeps_ratio: bool,
        secs: u64,
        cost: u64,
        demand: impl Fn(usize, u64) -> f64,
    ) -> Vec<Vec<u64>> {
        let c = controller_with(settings);
        let rules = RuleSet::of_rules(vec![RlsRule {
            key: "tenant".into(),
            group: "{value}".into(),
            ..Default::default()
        }]);
        let mut sessions: Vec<Session> =
            (0..envoys).map(|i| Session::new(format!("envoy-rlqs-{i}"))).collect();
        let mut buckets: Vec<EnvoyBucket> =
            (0..envoys).map(|_| EnvoyBucket { keeps_ratio, ..Default::default() }).collect();
        let mut seen = vec![false; envoys];
        let mut admitted = vec![vec![0u64; secs as usize]; envoys];
        let mut carried = vec![0.0; envoys];
        const STEP: u64 = S / 20;
        for step in 0..secs * 20 {
            let now = step * STEP;
            let mut exchange = now.is_multiple_of(S);
            for i in 0..envoys {
                buckets[i].refill(0.05);
                carried[i] += demand(i, now / S) / 20.0;
                while carried[i] >= 1.0 {
                    carried[i] -= 1.0;
                    if buckets[i].ask(now) {
                        admitted[i][(now / S) as usize] += 1;
                    }
                    // A new bucket is reported at its first request.
                    if !seen[i] {
                        seen[i] = true;
                        let r = RateLimitQuotaUsageReports {
                            domain: "edge".into(),
                            bucket_quota_usages: vec![costing("acme", cost, 0, 1)],
                        };
                        sessions[i].report(Nanos(now), &rules, None, &r).unwrap();
                        buckets[i].denied = 0;
                        exchange = true;
                    }
                }
                if seen[i] && now % (5 * S) == (i as u64 * S) % (5 * S) {
                    let (allowed, denied) =
                        (std::mem::take(&mut buckets[i].allowed), std::mem::take(&mut buckets[i].denied));
                    let r = RateLimitQuotaUsageReports {
                        domain: "edge".into(),
                        bucket_quota_usages: vec![costing("acme", cost, allowed, denied)],
                    };
                    sessions[i].report(Nanos(now), &rules, None, &r).unwrap();
                }
            }
            if now.is_multiple_of(S) {
                c.pacer().tick(Nanos(now));
            }
            if !exchange {
                continue;
            }
            for (session, bucket) in sessions.iter_mut().zip(&mut buckets) {
                exchange_and_assign(&c, session, bucket, now);
            }
        }
        admitted
    }

    /// Random-ish demand from a seed: each Envoy's rate changes every few seconds, from
    /// nothing to many times the quota's pace.
    fn demand(seed: u64) -> impl Fn(usize, u64) -> f64 {
        move |i, sec| {
            let mut x = seed
                ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (sec / 3).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 29;
            [0.0, 0.5, 3.0, 20.0, 200.0][(x % 5) as usize]
        }
    }

    #[test]
    fn dear_requests_never_pass_a_quota_in_units() {
        for seed in 0..12 {
            let keeps_ratio = seed % 2 == 1;
            // 300 units over the group's life, requests of 7: at most 42 of them.
            let budget = GroupSettings::builder().budget(300.0).build().unwrap();
            let got = run_costing(budget, 3, keeps_ratio, 90, 7, demand(seed));
            let total: u64 = got.iter().flatten().sum();
            assert!(total * 7 <= 300, "seed {seed}: {total} requests of 7 admitted of a budget of 300");
            assert!(total >= 30, "seed {seed}: only {total} requests of 7 admitted of a budget of 300");
            // 100 units a minute: at most 14 requests of 7.
            let minute =
                GroupSettings::builder().limit(50.0).quota(BudgetPeriod::Minute, 100.0).build().unwrap();
            let got = run_costing(minute, 3, keeps_ratio, 180, 7, demand(seed));
            for m in 0..3 {
                let in_minute: u64 = got.iter().map(|e| e[m * 60..(m + 1) * 60].iter().sum::<u64>()).sum();
                assert!(in_minute * 7 <= 100, "seed {seed}: minute {m} admitted {in_minute} requests of 7");
            }
        }
    }

    #[test]
    fn envoys_never_admit_more_than_a_quota_whatever_the_demand() {
        for seed in 0..24 {
            let keeps_ratio = seed % 2 == 1;
            // A budget over the group's life: 300 in all, whenever asked.
            let budget = GroupSettings::builder().budget(300.0).build().unwrap();
            let got = run(budget, 3, keeps_ratio, 90, demand(seed));
            let total: u64 = got.iter().flatten().sum();
            assert!(total <= 300, "seed {seed}: {total} admitted of a budget of 300");
            // 100 a minute, with a rate limit too.
            let minute =
                GroupSettings::builder().limit(50.0).quota(BudgetPeriod::Minute, 100.0).build().unwrap();
            let got = run(minute, 3, keeps_ratio, 180, demand(seed));
            for m in 0..3 {
                let in_minute: u64 = got.iter().map(|e| e[m * 60..(m + 1) * 60].iter().sum::<u64>()).sum();
                assert!(in_minute <= 100, "seed {seed}: minute {m} admitted {in_minute} of 100");
            }
        }
    }

    #[test]
    fn a_steady_demand_is_served_its_quota() {
        // Two Envoys asking 10/s and 30/s of a budget of 600: it goes in well under a minute,
        // and most of it to the busier one.
        let budget = GroupSettings::builder().budget(600.0).build().unwrap();
        let got = run(budget, 2, false, 120, |i, _| if i == 0 { 10.0 } else { 30.0 });
        let total: Vec<u64> = got.iter().map(|e| e.iter().sum()).collect();
        assert!(total.iter().sum::<u64>() <= 600, "{total:?}");
        assert!(total.iter().sum::<u64>() >= 540, "most of the budget is served: {total:?}");
        assert!(total[1] > total[0], "{total:?}");
    }

    #[test]
    fn a_pace_costs_its_burst_and_its_refill_and_slows_to_fit_its_budget() {
        let life = Duration::from_secs(11);
        // 20/s with a burst of 20: 20 + 220.
        let p = Pace::within(20.0, 20.0, 1000.0, life).unwrap();
        assert_eq!(p, Pace { per_fill: 20, every_s: 1, max: 20 });
        assert_eq!(p.cost(life), 240.0);
        // 100 units: a burst of one and 9 a second (1 + 99).
        assert_eq!(Pace::within(20.0, 20.0, 100.0, life), Some(Pace { per_fill: 9, every_s: 1, max: 1 }));
        // 3 units: one now, and one every 6 s (1 + 11/6).
        assert_eq!(Pace::within(20.0, 20.0, 3.0, life), Some(Pace { per_fill: 1, every_s: 6, max: 1 }));
        // Not one request and its refill: none.
        assert_eq!(Pace::within(20.0, 20.0, 1.0, life), None);
        for budget in [1.5, 2.0, 7.3, 50.0, 1e6] {
            if let Some(p) = Pace::within(5.0, 5.0, budget, life) {
                assert!(p.cost(life) <= budget, "{p:?} over {budget}");
            }
        }
    }

    #[test]
    fn a_count_covers_what_envoy_may_admit_and_frees_what_time_took() {
        let mut c = Count::default();
        let pace = Pace { per_fill: 10, every_s: 1, max: 10 };
        let until = Nanos(11 * S);
        c.replace(Some(pace), until, pace.cost(Duration::from_secs(11)), (Nanos(0), Nanos(0)));
        assert_eq!(c.committed(Nanos(0)), 120.0);
        // 30 admitted by the report at 3 s: 90 left, and no more than 2 × 10 + 10 × 8 could
        // still come.
        assert_eq!(c.take(30.0), 30.0);
        assert_eq!(c.committed(Nanos(3 * S)), 90.0);
        // Nothing reported by 9 s: a bucket idle that long can still admit 2 × 10 + 20.
        c.take(0.0);
        assert_eq!(c.committed(Nanos(9 * S)), 40.0);
        // Replaced: what the old one could still admit stays counted for two reports.
        let slow = Pace { per_fill: 1, every_s: 1, max: 1 };
        c.replace(
            Some(slow),
            Nanos(20 * S),
            slow.cost(Duration::from_secs(11)),
            (Nanos(9 * S), Nanos(9 * S)),
        );
        // What it may have admitted since the report, and until Envoy takes the new one.
        assert_eq!(c.committed(Nanos(9 * S)), 12.0 + 30.0);
        assert_eq!(c.take(5.0), 5.0);
        assert_eq!(c.take(0.0), 0.0);
        assert_eq!(c.committed(Nanos(10 * S)), 12.0);
        // A new window: what is left belongs to the last one, and what Envoy reports of it
        // does not count in the new one.
        c.new_window(Nanos(10 * S));
        assert_eq!(c.committed(Nanos(10 * S)), 0.0);
        assert_eq!(c.take(4.0), 0.0);
    }

    #[test]
    fn a_book_gives_back_what_it_does_not_keep() {
        let mut b = Book { window: 1, given: 100.0, used: 30.0 };
        assert_eq!(b.free(50.0), 20.0);
        assert_eq!(b.report(50.0, 5.0), (85.0, 30.0));
        assert_eq!(b.free(50.0), 5.0);
    }
}
