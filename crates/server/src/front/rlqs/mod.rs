//! Envoy's Rate Limit Quota Service (RLQS v3, `envoy.service.rate_limit_quota.v3`) on the
//! gRPC port.
//!
//! With Envoy's `envoy.filters.http.rate_limit_quota` filter, Envoy makes no call per request.
//! It sorts requests into buckets, enforces for each bucket the assignment this service pushed,
//! and reports each bucket's admitted and refused requests on one long-lived stream: at once
//! for a new bucket, then once per reporting interval.
//!
//! Each stream is a client of the engine, as a remote process is. A bucket's id names a group
//! by the same mapping rules as RLS descriptors ([`tollgate_model::rls`]; the domain is the
//! report's, the entries the bucket id's in key order; nothing matched: `default`). What a
//! stream reports is the group's demand (admitted and refused requests per second) and
//! consumption (the admitted ones, whatever the assignment said), exchanged with the controller
//! just after every tick. Each grant comes back as its buckets' assignment: a token bucket with
//! the grant's rate and burst (split among the stream's buckets of one group by their demand),
//! allow-all for a group nothing limits, deny-all for a closed group, with the grant's lease as
//! the assignment's time to live.
//!
//! Envoy starts a fresh, full token bucket whenever an assignment changes, so an assignment is
//! replaced only when its rate or burst moves by more than [`HYSTERESIS`]; one unchanged is sent
//! again when half its time to live has passed. A bucket idle for [`IDLE_ABANDON`] is
//! abandoned (Envoy forgets it; its next request starts it again), and a closed stream reports
//! no demand: both give their share back at the next tick.
//!
//! A bucket id's entry [`COST_KEY`] says what each of its requests costs in units (1 when
//! absent), and its entry `tollgate_class` ([`crate::front::rls::CLASS_KEY`]) the class of its
//! requests; neither takes part in naming the group. Envoy's token buckets count requests, so
//! a bucket's demand and consumption are its requests times its cost, and its assignment is
//! its part of the grant divided by its cost. A group's grant goes to its buckets' demand class
//! by class, critical first and sheddable last, and what is left over by demand.
//!
//! A bucket that cannot be served (an id too long or not printable, a cost or class that
//! breaks its rule, a group name the mapping
//! makes invalid, a group the caller's credential does not cover, or past [`BUCKETS_MAX`]) is
//! answered deny-all and logged with its field and the rule; the stream goes on serving the
//! others. A report that is malformed as a whole (its domain, or more than [`BUCKETS_MAX`]
//! usages) ends the stream with `INVALID_ARGUMENT` naming the field; Envoy opens a new one at
//! its next report.

mod count;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tollgate_model::rls::RuleSet;
use tollgate_model::settings::{GroupName, check_group_name};
use tollgate_model::time::Nanos;
use tollgate_proto::v1;
use tonic::{Request, Response, Status, Streaming};

use crate::access::auth::Caller;
use crate::clock::Clock;
use crate::cluster::role::Cluster;
use crate::controller::Controller;
use crate::front::rls::{CLASS_KEY, ENTRIES_MAX, RlsRules, text};
use count::{Book, Count, Pace};
use tollgate_model::class::RequestClass;

/// The bucket id entry whose value is what each of the bucket's requests costs, in units
/// (above 0, at most 10⁹).
pub const COST_KEY: &str = "tollgate_cost";
/// The most one request of a bucket may cost.
pub const COST_MAX: f64 = 1e9;

/// The most quota streams open at once (`RESOURCE_EXHAUSTED` past it).
pub const STREAMS_MAX: u64 = 1024;
/// The most buckets one stream serves, and the most usages in one report.
pub const BUCKETS_MAX: usize = 10_000;
/// The most requests one usage may count.
pub const REQUESTS_MAX: u64 = 1_000_000_000_000;
/// How far (a fraction) a bucket's rate or burst must move for its assignment to be replaced.
pub const HYSTERESIS: f64 = 0.02;
/// How long a bucket may go without a request before it is abandoned.
pub const IDLE_ABANDON: Duration = Duration::from_secs(300);
/// How long a stream wants a group's allotment to last at its demand: an assignment's time to
/// live (the lease, 10 s by default) and its slack, and Envoy's report after (every 5 s).
const QUOTA_LASTS: Duration = Duration::from_secs(20);
/// How much of a group's allotment a stream keeps beyond what its buckets were assigned, at
/// their demand: what renewals take until the next exchanges.
const QUOTA_KEEP: Duration = Duration::from_secs(10);
/// How long after a tick the stream exchanges, so that it carries the tick's grants.
const AFTER_TICK: Duration = Duration::from_millis(20);
/// How soon the stream exchanges again when a tick is due or under way.
const TICK_DUE_RETRY: Duration = Duration::from_millis(50);
/// How soon a stream asks again after the leader, reached through this follower, did not
/// answer.
const UPSTREAM_RETRY: Duration = Duration::from_secs(1);
/// A token bucket's fill interval. Envoy reads it in whole seconds and refills continuously at
/// `tokens_per_fill / fill_interval`; it also starts a fresh bucket only when `max_tokens`,
/// `tokens_per_fill` or the interval's nanoseconds change, so the interval never does.
const FILL_INTERVAL_S: i64 = 1;

/// The quota streams' counters, read by the metrics.
#[derive(Debug, Default)]
pub struct RlqsStats {
    streams: AtomicU64,
    reports: AtomicU64,
    assigned: AtomicU64,
    renewed: AtomicU64,
    abandoned: AtomicU64,
    refused: AtomicU64,
}

impl RlqsStats {
    /// Streams open now.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Usage reports received.
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }

    /// New assignments sent (a bucket's first, or one that replaced another).
    pub fn assigned(&self) -> u64 {
        self.assigned.load(Ordering::Relaxed)
    }

    /// Assignments sent again unchanged, before their time to live ran out.
    pub fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// Idle buckets abandoned.
    pub fn abandoned(&self) -> u64 {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Buckets answered deny-all because they cannot be served.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// What a bucket is told to do.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Assignment {
    /// Admit everything: the group is not limited.
    AllowAll,
    /// Admit nothing: the group is closed, or the bucket cannot be served.
    DenyAll,
    /// A token bucket: `per_second` tokens a second, at most `max` banked.
    Tokens { per_second: u32, max: u32 },
    /// A token bucket paced for a group with quotas ([`count`]).
    Paced(Pace),
}

impl Assignment {
    /// The assignment for a share of a grant: `rate` units/s and `burst` units.
    fn of(unlimited: bool, rate: f64, burst: f64) -> Assignment {
        if unlimited {
            return Assignment::AllowAll;
        }
        if rate.is_nan() || rate <= 0.0 {
            return Assignment::DenyAll;
        }
        let whole = |v: f64| v.round().clamp(1.0, f64::from(u32::MAX)) as u32;
        if rate < 0.5 {
            // Less than a request a second (a dear request's share): one request every so
            // many seconds, never faster than the rate.
            let every_s = (1.0 / rate).ceil().min(f64::from(count::SLOWEST_EVERY_S)) as u32;
            return Assignment::Paced(Pace { per_fill: 1, every_s, max: whole(burst.floor().max(1.0)) });
        }
        Assignment::Tokens { per_second: whole(rate), max: whole(burst) }
    }

    /// Whether `self` is close enough to `other` to keep `other` in force.
    fn near(self, other: Assignment) -> bool {
        let close = |a: u32, b: u32| f64::from(a.abs_diff(b)) <= HYSTERESIS * f64::from(a.max(b));
        match (self, other) {
            (
                Assignment::Tokens { per_second: r1, max: m1 },
                Assignment::Tokens { per_second: r2, max: m2 },
            ) => close(r1, r2) && close(m1, m2),
            (Assignment::Paced(a), Assignment::Paced(b)) => a == b,
            (a, b) => a == b,
        }
    }

    /// The strategy Envoy enforces.
    fn strategy(self) -> RateLimitStrategy {
        let strategy = match self {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::Tokens { per_second, max } => Strategy::TokenBucket(TokenBucket {
                max_tokens: max,
                tokens_per_fill: Some(UInt32Value { value: per_second }),
                fill_interval: Some(PbDuration { seconds: FILL_INTERVAL_S, nanos: 0 }),
            }),
            // Envoy reads the interval in whole seconds, but tells an assignment changed by
            // its nanoseconds: they carry the seconds too.
            Assignment::Paced(p) => Strategy::TokenBucket(TokenBucket {
                max_tokens: p.max,
                tokens_per_fill: Some(UInt32Value { value: p.per_fill }),
                fill_interval: Some(PbDuration {
                    seconds: i64::from(p.every_s),
                    nanos: i32::try_from(p.every_s).unwrap_or(0),
                }),
            }),
        };
        RateLimitStrategy { strategy: Some(strategy) }
    }
}

/// One bucket a stream serves.
struct Bucket {
    id: BucketId,
    /// Its group, or why it cannot be served.
    group: Result<GroupName, String>,
    /// Requests/s asked for over the last report's interval.
    demand: f64,
    last_report: Nanos,
    last_request: Nanos,
    /// Since the last exchange.
    admitted: u64,
    throttled: u64,
    /// In force in Envoy: what, when it was last sent, and the time to live it was sent with.
    assigned: Option<(Assignment, Nanos, Duration)>,
    /// In shadow mode Envoy is told to allow all: the token bucket it would have been given
    /// is kept here, and what it would have denied is counted.
    shadow: Option<ShadowBucket>,
    /// Requests allowed since the last exchange that the shadow bucket would have denied.
    would_refuse: u64,
    /// In a group with quotas: what Envoy may still admit under its assignments.
    count: Count,
    /// Units each request costs, and the requests' class.
    cost: f64,
    class: RequestClass,
    /// Units consumed since the last exchange.
    consumed: f64,
}

impl Bucket {
    /// A bucket new at `now`, for `group`, its requests each of `cost` units and of `class`.
    fn new(
        id: BucketId,
        group: Result<GroupName, String>,
        (cost, class): (f64, RequestClass),
        now: Nanos,
    ) -> Bucket {
        Bucket {
            id,
            group,
            demand: 0.0,
            // A new bucket's first report counts its first request(s): over a second.
            last_report: Nanos(now.0.saturating_sub(1_000_000_000)),
            last_request: now,
            admitted: 0,
            throttled: 0,
            assigned: None,
            shadow: None,
            would_refuse: 0,
            count: Count::of(cost),
            cost,
            class,
            consumed: 0.0,
        }
    }

    /// Its part (`share`) of its group's `grant` by rate, and the time to live to send it with.
    /// In shadow mode Envoy allows all, and the bucket it would have had counts.
    fn by_rate(&mut self, grant: &v1::Grant, share: f64) -> (Assignment, Duration) {
        // Envoy's tokens are requests: the bucket's units over its cost.
        let (rate, burst) = (grant.rate * share / self.cost, grant.burst * share / self.cost);
        let mut want = Assignment::of(grant.unlimited, rate, burst);
        self.shadow = if grant.shadow { ShadowBucket::instead_of(&mut want, self.shadow) } else { None };
        (want, Duration::from_millis(u64::from(grant.lease_ms)))
    }

    /// Counts a report at `now` of `allowed` and `denied` requests: its demand over the
    /// seconds since the last report, which it returns.
    fn count_report(&mut self, now: Nanos, allowed: u64, denied: u64) -> f64 {
        let elapsed = now.since(self.last_report).as_secs_f64().max(0.001);
        self.demand = (allowed + denied) as f64 * self.cost / elapsed;
        self.last_report = now;
        if allowed + denied > 0 {
            self.last_request = now;
        }
        self.admitted += allowed;
        self.throttled += denied;
        self.consumed += allowed as f64 * self.cost;
        elapsed
    }
}

/// A group's demand over a stream's buckets, units/s by request class (critical, normal,
/// sheddable), and how many buckets.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Demands {
    by_class: [f64; 3],
    buckets: usize,
}

impl Demands {
    /// Where `class` is served in a group's grant: critical first, sheddable last.
    fn rank(class: RequestClass) -> usize {
        match class {
            RequestClass::Critical => 0,
            RequestClass::Sheddable => 2,
            _ => 1,
        }
    }

    fn add(&mut self, b: &Bucket) {
        self.by_class[Demands::rank(b.class)] += b.demand;
        self.buckets += 1;
    }

    fn total(&self) -> f64 {
        self.by_class.iter().sum()
    }

    /// The part (0 to 1) of the group's `rate` units/s that goes to `b`: the critical
    /// buckets' demand is met first, then the normal, then the sheddable; when the rate covers
    /// all of it, each bucket's part is its share of the demand. With no demand, an even part.
    fn part(&self, b: &Bucket, rate: f64) -> f64 {
        let all = self.total();
        if all <= 0.0 {
            return 1.0 / self.buckets.max(1) as f64;
        }
        if rate.is_nan() || rate <= 0.0 || rate >= all {
            return b.demand / all;
        }
        let mine = Demands::rank(b.class);
        let mut left = rate;
        for (c, &total) in self.by_class.iter().enumerate() {
            let take = left.min(total);
            if c == mine {
                return if total > 0.0 { take * b.demand / total / rate } else { 0.0 };
            }
            left -= take;
        }
        0.0
    }
}

/// What a bucket id says of its requests: each one's cost in units and their class, or why
/// it cannot be served, naming the entry.
fn terms_of(i: usize, entries: &[(String, String)]) -> Result<(f64, RequestClass), String> {
    let at = |k: &str| format!("bucket_quota_usages[{i}].bucket_id.bucket[{k:?}]");
    let (mut cost, mut class) = (1.0, RequestClass::Normal);
    for (k, v) in entries {
        if k == COST_KEY {
            cost = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|c| c.is_finite() && *c > 0.0 && *c <= COST_MAX)
                .ok_or_else(|| {
                    format!("{}: units a request costs, above 0 and at most {COST_MAX:e}; got {v:?}", at(k))
                })?;
        } else if k == CLASS_KEY {
            class = RequestClass::from_name(v).map_err(|rule| format!("{}: {rule}", at(k)))?;
        }
    }
    Ok((cost, class))
}

/// The token bucket a bucket in shadow mode would enforce: reported requests beyond it are
/// would-be refusals.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ShadowBucket {
    per_second: f64,
    max: f64,
    tokens: f64,
}

impl ShadowBucket {
    /// In shadow mode: the bucket that `want` would enforce (keeping the tokens of `was`),
    /// with Envoy told to allow all instead; `None` when `want` enforces no bucket.
    fn instead_of(want: &mut Assignment, was: Option<ShadowBucket>) -> Option<ShadowBucket> {
        let (per_second, max) = match *want {
            Assignment::Paced(p) => (p.rate(), f64::from(p.max)),
            Assignment::Tokens { per_second, max } => (f64::from(per_second), f64::from(max)),
            _ => return None,
        };
        let tokens = was.map_or(max, |s| s.tokens.min(max));
        *want = Assignment::AllowAll;
        Some(ShadowBucket { per_second, max, tokens })
    }

    /// Refills for `elapsed` seconds, takes `requests`, and returns how many found no token.
    fn take(&mut self, elapsed: f64, requests: u64) -> u64 {
        self.tokens = (self.tokens + self.per_second * elapsed).min(self.max);
        let asked = requests as f64;
        let short = (asked - self.tokens.floor()).max(0.0);
        self.tokens = (self.tokens - asked).max(0.0);
        short as u64
    }
}

/// A bucket's identity: the report's domain and its id's entries in key order.
type Key = (String, Vec<(String, String)>);

/// One stream's buckets, and its identity as a client of the engine.
pub(crate) struct Session {
    client_id: String,
    sequence: u64,
    buckets: HashMap<Key, Bucket>,
    /// Each group with quotas: its allotment in the window under way.
    books: HashMap<String, Book>,
}

/// Why a usage's bucket id cannot be served, naming the field; `None` when it can.
fn check_id(i: usize, entries: &[(String, String)]) -> Option<String> {
    let at = format!("bucket_quota_usages[{i}].bucket_id.bucket");
    if entries.len() > ENTRIES_MAX {
        return Some(format!("{at}: give 1 to {ENTRIES_MAX} entries, got {}", entries.len()));
    }
    for (k, v) in entries {
        if let Err(e) =
            text(|| format!("{at}[{k:?}]"), k, false).and_then(|()| text(|| format!("{at}[{k:?}]"), v, true))
        {
            return Some(e.message().to_string());
        }
    }
    None
}

impl Session {
    pub(crate) fn new(client_id: String) -> Session {
        Session { client_id, sequence: 0, buckets: HashMap::new(), books: HashMap::new() }
    }

    /// Takes a report: each usage's counts go to its bucket (started when new). Returns how
    /// many buckets are new, how many of those are refused, and deny-all answers for usages
    /// that cannot be kept (past [`BUCKETS_MAX`]).
    pub(crate) fn report(
        &mut self,
        now: Nanos,
        rules: &RuleSet,
        caller: Option<&Caller>,
        r: &RateLimitQuotaUsageReports,
    ) -> Result<(usize, usize, Vec<BucketAction>), Status> {
        text(|| "domain".into(), &r.domain, false)?;
        if r.bucket_quota_usages.len() > BUCKETS_MAX {
            return Err(Status::invalid_argument(format!(
                "bucket_quota_usages: at most {BUCKETS_MAX} per report, got {}",
                r.bucket_quota_usages.len()
            )));
        }
        let (mut new, mut refused, mut overflow) = (0, 0, Vec::new());
        for (i, u) in r.bucket_quota_usages.iter().enumerate() {
            let Some(id) = u.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
                tracing::warn!(field = %format!("bucket_quota_usages[{i}].bucket_id"), "RLQS usage without a bucket id: left out");
                continue;
            };
            let mut entries: Vec<(String, String)> =
                id.bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            entries.sort();
            let key = (r.domain.clone(), entries);
            if !self.buckets.contains_key(&key) {
                if self.buckets.len() >= BUCKETS_MAX {
                    overflow.push(action(id.clone(), Assignment::DenyAll, Duration::from_secs(60)));
                    continue;
                }
                let terms = terms_of(i, &key.1);
                let (cost, class) = terms.clone().unwrap_or((1.0, RequestClass::Normal));
                let group = terms.and_then(|_| group_of(rules, caller, i, &key));
                if let Err(why) = &group {
                    refused += 1;
                    tracing::warn!(bucket = ?key.1, reason = %why, "RLQS bucket refused: answered deny-all");
                }
                self.buckets.insert(key.clone(), Bucket::new(id.clone(), group, (cost, class), now));
                new += 1;
            }
            let b = self.buckets.get_mut(&key).expect("kept above");
            let (allowed, denied) = (u.num_requests_allowed, u.num_requests_denied);
            if allowed > REQUESTS_MAX || denied > REQUESTS_MAX {
                if b.group.is_ok() {
                    let why = format!(
                        "bucket_quota_usages[{i}]: at most {REQUESTS_MAX} requests allowed and denied"
                    );
                    tracing::warn!(bucket = ?key.1, reason = %why, "RLQS bucket refused: answered deny-all");
                    b.group = Err(why);
                    refused += 1;
                }
                continue;
            }
            let elapsed = b.count_report(now, allowed, denied);
            if let Ok(g) = &b.group
                && let Some(book) = self.books.get_mut(g.as_str())
            {
                book.used += b.count.take(allowed as f64 * b.cost);
            }
            if let Some(shadow) = &mut b.shadow {
                b.would_refuse += shadow.take(elapsed, allowed);
            }
        }
        Ok((new, refused, overflow))
    }

    /// The stream's usage per group since the last exchange, as exchanges of at most
    /// [`tollgate_proto::EXCHANGE_GROUPS_MAX`] groups each; `closing` reports no demand.
    pub(crate) fn exchanges(&mut self, closing: bool) -> Vec<v1::ExchangeRequest> {
        let mut groups: HashMap<&str, v1::GroupUsage> = HashMap::new();
        // Per group with quotas: what its buckets may still admit, and their demand.
        let mut counted: HashMap<&str, (f64, f64)> = HashMap::new();
        for b in self.buckets.values_mut() {
            let Ok(g) = &b.group else { continue };
            let u = groups
                .entry(g.as_str())
                .or_insert_with(|| v1::GroupUsage { group: g.to_string(), ..Default::default() });
            add_usage(u, b, closing);
            if self.books.contains_key(g.as_str()) {
                let c = counted.entry(g.as_str()).or_default();
                c.0 += b.count.committed(b.last_report);
                c.1 += b.demand;
            }
            b.admitted = 0;
            b.throttled = 0;
            b.would_refuse = 0;
            b.consumed = 0.0;
        }
        for (g, (committed, demand)) in counted {
            let (Some(book), Some(u)) = (self.books.get_mut(g), groups.get_mut(g)) else { continue };
            // Kept for renewals; the rest goes back to the controller.
            let (given, used) = book.report(committed, demand * QUOTA_KEEP.as_secs_f64());
            u.quota = Some(v1::QuotaHeld {
                window: book.window,
                given,
                used,
                lasts_ms: u32::try_from(QUOTA_LASTS.as_millis()).unwrap_or(u32::MAX),
            });
        }
        let mut groups: Vec<v1::GroupUsage> = groups.into_values().collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        groups
            .chunks(tollgate_proto::EXCHANGE_GROUPS_MAX)
            .map(|page| {
                self.sequence += 1;
                v1::ExchangeRequest {
                    client_id: self.client_id.clone(),
                    sequence: self.sequence,
                    groups: page.to_vec(),
                    target_request_period_ms: 0,
                    shard_map_epoch: None,
                    // Groups with quotas are assigned from allotments ([`count`]).
                    takes_allotments: true,
                }
            })
            .collect()
    }

    /// Each group's demand over this stream's buckets, to split its grant by.
    fn demands(&self) -> HashMap<GroupName, Demands> {
        let mut demand: HashMap<GroupName, Demands> = HashMap::new();
        for b in self.buckets.values() {
            if let Ok(g) = &b.group {
                demand.entry(g.clone()).or_default().add(b);
            }
        }
        demand
    }

    /// The actions to send after an exchange answered `grants`: a new assignment where the
    /// grant moved it past [`HYSTERESIS`] (or there was none), the one in force again when
    /// half its time to live is gone, and an abandon for buckets idle past [`IDLE_ABANDON`].
    pub(crate) fn assign(&mut self, now: Nanos, grants: &[v1::Grant]) -> Actions {
        let grants: HashMap<&str, &v1::Grant> = grants.iter().map(|g| (g.group.as_str(), g)).collect();
        let demand = self.demands();
        // Groups with quotas are assigned from their allotments (in shadow mode Envoy allows
        // all, and the rates say what it would have denied); a group whose quotas went is
        // assigned by rates again.
        let mut actions = Vec::new();
        for grant in grants.values() {
            match &grant.quota {
                Some(q) if !grant.shadow => actions.extend(self.assign_counted(now, grant, q)),
                _ => {
                    self.books.remove(&grant.group);
                }
            }
        }
        let mut idle = Vec::new();
        for (key, b) in &mut self.buckets {
            if now.since(b.last_request) >= IDLE_ABANDON {
                idle.push(key.clone());
                continue;
            }
            let (want, ttl) = match &b.group {
                Err(_) => (Assignment::DenyAll, Duration::from_secs(60)),
                Ok(g) => {
                    let Some(grant) =
                        grants.get(g.as_str()).filter(|grant| grant.quota.is_none() || grant.shadow)
                    else {
                        continue;
                    };
                    let share = demand.get(g).map_or(1.0, |d| d.part(b, grant.rate));
                    b.by_rate(grant, share)
                }
            };
            // Envoy reads whole seconds: rounded down, never below two.
            let ttl = Duration::from_secs(ttl.as_secs().max(2));
            let send = match b.assigned {
                // Renewed once half the time to live it went out with has passed.
                Some((held, at, sent_ttl)) if want.near(held) => now.since(at) >= sent_ttl / 2,
                _ => true,
            };
            if send {
                let (keep, renewal) = match b.assigned {
                    Some((held, _, _)) if want.near(held) => (held, true),
                    _ => (want, false),
                };
                actions.push((key.clone(), keep, ttl, renewal));
            }
        }
        let mut out = Actions::default();
        for (key, a, ttl, renewal) in actions {
            let b = self.buckets.get_mut(&key).expect("listed above");
            b.assigned = Some((a, now, ttl));
            out.actions.push(action(b.id.clone(), a, ttl));
            *if renewal { &mut out.renewed } else { &mut out.assigned } += 1;
        }
        for key in idle {
            if let Some(b) = self.buckets.remove(&key) {
                out.abandoned += 1;
                out.actions.push(BucketAction {
                    bucket_id: Some(b.id),
                    bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
                });
            }
        }
        out
    }
}

/// What to send a stream, and how many of each kind.
#[derive(Debug, Default)]
pub(crate) struct Actions {
    actions: Vec<BucketAction>,
    assigned: u64,
    renewed: u64,
    abandoned: u64,
}

/// The group a new bucket names, or why it cannot be served.
fn group_of(rules: &RuleSet, caller: Option<&Caller>, i: usize, key: &Key) -> Result<GroupName, String> {
    if let Some(why) = check_id(i, &key.1) {
        return Err(why);
    }
    let entries: Vec<(&str, &str)> = key
        .1
        .iter()
        .filter(|(k, _)| k != COST_KEY && k != CLASS_KEY)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // Buckets name groups by the rules (a domain's envoy/ratelimit tree answers the RLS).
    let (matched, mut name) = rules.by_rules(&key.0, &entries);
    // A bucket no rule names a group for goes to the token's default group, if it has one.
    if let Some(Caller(c)) = caller
        && matched.is_none()
        && name == tollgate_model::settings::DEFAULT_GROUP
        && !c.default_group.is_empty()
    {
        name.clone_from(&c.default_group);
    }
    let group = check_group_name(&name).and_then(|()| GroupName::new(&name)).map_err(|e| {
        format!("bucket_quota_usages[{i}].bucket_id: names group {name:?}, which breaks a rule: {}", e.rule)
    })?;
    if let Some(Caller(c)) = caller
        && !c.allows_group(group.as_str())
    {
        return Err(format!(
            "bucket_quota_usages[{i}].bucket_id: group {name:?} is not one {} may use",
            c.label()
        ));
    }
    Ok(group)
}

fn action(id: BucketId, a: Assignment, ttl: Duration) -> BucketAction {
    let seconds = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
            // Envoy reads whole seconds.
            assignment_time_to_live: Some(PbDuration { seconds, nanos: 0 }),
            rate_limit_strategy: Some(a.strategy()),
        })),
    }
}

/// The quota service over a controller.
#[derive(Clone)]
pub struct Rlqs {
    controller: Arc<Controller>,
    cluster: Arc<Cluster>,
    rules: Arc<RlsRules>,
    clock: Clock,
    stats: Arc<RlqsStats>,
    next_id: Arc<AtomicU64>,
}

impl Rlqs {
    /// The service over the grants of `cluster`'s leader (`controller`'s own while it grants),
    /// counting into `stats`.
    pub fn new(
        controller: Arc<Controller>,
        cluster: Arc<Cluster>,
        rules: Arc<RlsRules>,
        clock: Clock,
        stats: Arc<RlqsStats>,
    ) -> Rlqs {
        Rlqs { controller, cluster, rules, clock, stats, next_id: Arc::new(AtomicU64::new(1)) }
    }
}

/// Counts a stream open for as long as it lives.
struct Open(Arc<RlqsStats>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

type Outbound = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

impl Rlqs {
    /// One exchange round for `session`; sends what changed. `Err` ends the stream.
    async fn exchange(
        &self,
        session: &mut Session,
        out: &Outbound,
        closing: bool,
    ) -> Result<Duration, Status> {
        let now = self.clock.now();
        let mut grants = Vec::new();
        let mut next = Duration::from_secs(1);
        for req in session.exchanges(closing) {
            let answer = match self.cluster.exchange(now, req).await {
                Ok(answer) => answer,
                // A follower that cannot reach the leader: Envoy keeps what it was assigned
                // (until each assignment's time to live), and the stream asks again shortly.
                Err(e) if e.code() == tonic::Code::Unavailable => {
                    tracing::debug!(error = %e.message(), "RLQS exchange passed to the leader went unanswered");
                    return Ok(UPSTREAM_RETRY);
                }
                Err(e) => return Err(e),
            };
            grants.extend(answer.grants);
            // Just after the next tick; while one is due or under way, a little later.
            let after_tick = match answer.next_tick_ms {
                0 => TICK_DUE_RETRY,
                ms => Duration::from_millis(u64::from(ms)) + AFTER_TICK,
            };
            next = after_tick.min(Duration::from_millis(u64::from(answer.next_exchange_ms).max(1)));
        }
        if !closing {
            let sent = session.assign(now, &grants);
            tracing::trace!(client = %session.client_id, assigned = sent.assigned, renewed = sent.renewed, ?next, "RLQS exchange");
            self.stats.assigned.fetch_add(sent.assigned, Ordering::Relaxed);
            self.stats.renewed.fetch_add(sent.renewed, Ordering::Relaxed);
            self.stats.abandoned.fetch_add(sent.abandoned, Ordering::Relaxed);
            self.send(out, sent.actions).await;
        }
        Ok(next)
    }

    async fn send(&self, out: &Outbound, actions: Vec<BucketAction>) {
        if actions.is_empty() {
            return;
        }
        let _ = out.send(Ok(RateLimitQuotaResponse { bucket_action: actions })).await;
    }

    /// Serves one stream until Envoy closes it or it fails.
    async fn serve(
        self,
        mut inbound: Streaming<RateLimitQuotaUsageReports>,
        out: Outbound,
        caller: Option<Caller>,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut session = Session::new(self.cluster.link().front_client_id(&format!("envoy-rlqs-{id}")));
        let mut settings = self.controller.admin().watch_settings();
        let mut next = self.clock.now().after(Duration::from_secs(1));
        let ended = loop {
            let changed = async {
                match settings.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let due = tokio::select! {
                m = inbound.next() => match m {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(e),
                    Some(Ok(r)) => {
                        self.stats.reports.fetch_add(1, Ordering::Relaxed);
                        let rules = self.rules.get();
                        match session.report(self.clock.now(), &rules, caller.as_ref(), &r) {
                            Err(e) => break Err(e),
                            Ok((new, refused, overflow)) => {
                                let refused = (refused + overflow.len()) as u64;
                                self.stats.refused.fetch_add(refused, Ordering::Relaxed);
                                self.send(&out, overflow).await;
                                new > 0
                            }
                        }
                    }
                },
                alive = changed => {
                    if !alive { settings = None; }
                    true
                }
                () = tokio::time::sleep(next.since(self.clock.now())) => true,
            };
            if due {
                match self.exchange(&mut session, &out, false).await {
                    Ok(wait) => next = self.clock.now().after(wait),
                    Err(e) => break Err(e),
                }
            }
        };
        // Gone: its demand falls to nothing, so its share goes to the others at the next tick.
        let _ = self.exchange(&mut session, &out, true).await;
        if let Err(e) = ended {
            tracing::debug!(error = %e, "RLQS stream ended");
            let _ = out.send(Err(e)).await;
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream =
        tokio_stream::wrappers::ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        req: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        if self.stats.streams.fetch_add(1, Ordering::Relaxed) >= STREAMS_MAX {
            self.stats.streams.fetch_sub(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!("at most {STREAMS_MAX} quota streams at once")));
        }
        let open = Open(self.stats.clone());
        let caller = req.extensions().get::<Caller>().cloned();
        let (tx, rx) = mpsc::channel(16);
        let me = self.clone();
        tokio::spawn(async move {
            let _open = open;
            me.serve(req.into_inner(), tx, caller).await;
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Adds a bucket's usage since the last exchange to its group's (`closing`: no demand).
fn add_usage(u: &mut v1::GroupUsage, b: &Bucket, closing: bool) {
    if !closing {
        u.demand += b.demand;
    }
    u.consumed += b.consumed;
    u.admitted += b.admitted;
    u.throttled += b.throttled;
    u.would_refuse += b.would_refuse;
    match b.class {
        RequestClass::Critical => {
            u.critical_admitted += b.admitted;
            u.critical_throttled += b.throttled;
        }
        RequestClass::Sheddable => {
            u.sheddable_admitted += b.admitted;
            u.sheddable_throttled += b.throttled;
        }
        _ => {}
    }
    match b.assigned {
        Some((Assignment::Tokens { per_second, .. }, _, _)) => u.held += f64::from(per_second) * b.cost,
        Some((Assignment::Paced(p), _, _)) => u.held += p.rate() * b.cost,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

    fn usage(entries: &[(&str, &str)], allowed: u64, denied: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: entries.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect(),
            }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }
    }

    fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports { domain: "edge".into(), bucket_quota_usages: usages }
    }

    fn grant(group: &str, rate: f64, burst: f64) -> v1::Grant {
        v1::Grant { group: group.into(), rate, burst, lease_ms: 10_000, ..v1::Grant::default() }
    }

    fn strategy(a: &BucketAction) -> Option<Strategy> {
        match a.bucket_action.as_ref()? {
            bucket_action::BucketAction::QuotaAssignmentAction(q) => q.rate_limit_strategy.as_ref()?.strategy,
            bucket_action::BucketAction::AbandonAction(_) => None,
        }
    }

    fn tokens(per_second: u32, max: u32) -> Option<Strategy> {
        Some(Assignment::Tokens { per_second, max }.strategy().strategy.unwrap())
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn in_shadow_mode_envoy_allows_all_and_what_the_bucket_would_deny_is_counted() {
        let mut s = Session::new("envoy-rlqs-1".into());
        let rules = RuleSet::of_rules(vec![tollgate_model::rls::RlsRule {
            key: "tenant".into(),
            group: "{value}".into(),
            ..Default::default()
        }]);
        s.report(Nanos(10 * S), &rules, None, &report(vec![usage(&[("tenant", "acme")], 1, 0)])).unwrap();
        let shadow = v1::Grant { shadow: true, ..grant("acme", 10.0, 10.0) };
        let sent = s.assign(Nanos(10 * S), &[shadow]);
        let allow_all = Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
        assert_eq!(sent.actions.iter().map(strategy).collect::<Vec<_>>(), [allow_all]);
        s.exchanges(false);
        // The bucket holds at most 10 tokens: of 35 allowed a second later, 25 would have been
        // denied.
        s.report(Nanos(11 * S), &rules, None, &report(vec![usage(&[("tenant", "acme")], 35, 0)])).unwrap();
        let acme = &s.exchanges(false)[0].groups[0];
        assert_eq!((acme.admitted, acme.throttled, acme.would_refuse), (35, 0, 25));
        // Out of shadow mode the bucket gets its tokens, and nothing more is counted.
        let sent = s.assign(Nanos(11 * S), &[grant("acme", 10.0, 10.0)]);
        assert_eq!(sent.actions.iter().map(strategy).collect::<Vec<_>>(), [tokens(10, 10)]);
        s.report(Nanos(12 * S), &rules, None, &report(vec![usage(&[("tenant", "acme")], 10, 25)])).unwrap();
        assert_eq!(s.exchanges(false)[0].groups[0].would_refuse, 0);
    }

    #[test]
    fn a_grant_is_split_among_a_groups_buckets_by_demand_and_kept_within_the_hysteresis() {
        let mut s = Session::new("envoy-rlqs-1".into());
        let r = report(vec![
            usage(&[("tenant", "acme"), ("path", "/a")], 30, 0),
            usage(&[("tenant", "acme"), ("path", "/b")], 10, 0),
        ]);
        let rules = RuleSet::of_rules(vec![tollgate_model::rls::RlsRule {
            key: "tenant".into(),
            group: "{value}".into(),
            ..Default::default()
        }]);
        assert_eq!(s.report(Nanos(10 * S), &rules, None, &r).unwrap().0, 2);
        let ex = s.exchanges(false);
        assert_eq!(ex.len(), 1);
        let acme = &ex[0].groups[0];
        assert_eq!(
            (acme.group.as_str(), acme.demand, acme.admitted, acme.consumed),
            ("acme", 40.0, 40, 40.0)
        );
        // 100 units/s with a burst of 100, split 3:1.
        let sent = s.assign(Nanos(10 * S), &[grant("acme", 100.0, 100.0)]);
        assert_eq!(sent.assigned, 2);
        let mut got: Vec<_> = sent.actions.iter().map(strategy).collect();
        got.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(got, [tokens(25, 25), tokens(75, 75)]);
        // Counts go once: the next exchange carries none.
        assert_eq!(s.exchanges(false)[0].groups[0].admitted, 0);
        // A grant 1 % off changes nothing Envoy holds (it would start a full bucket).
        let sent = s.assign(Nanos(11 * S), &[grant("acme", 101.0, 101.0)]);
        assert!(sent.actions.is_empty());
        // Half the time to live later, the same assignment goes out again.
        let sent = s.assign(Nanos(15 * S), &[grant("acme", 101.0, 101.0)]);
        assert_eq!((sent.assigned, sent.renewed), (0, 2));
        // A real change goes out at once.
        let sent = s.assign(Nanos(16 * S), &[grant("acme", 50.0, 50.0)]);
        assert_eq!(sent.assigned, 2);
        // An unlimited group is allow-all; a grant of nothing is deny-all.
        let unlimited = v1::Grant { unlimited: true, ..grant("acme", 0.0, 0.0) };
        let sent = s.assign(Nanos(17 * S), &[unlimited]);
        assert!(
            sent.actions
                .iter()
                .all(|a| strategy(a) == Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)))
        );
        let sent = s.assign(Nanos(18 * S), &[grant("acme", 0.0, 0.0)]);
        assert!(
            sent.actions
                .iter()
                .all(|a| strategy(a) == Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)))
        );
    }

    #[test]
    fn a_buckets_cost_and_class_shape_its_demand_consumption_and_assignment() {
        let mut s = Session::new("envoy-rlqs-1".into());
        let rules = RuleSet::default();
        // Three buckets of group acme over a second: critical requests of 10 units, normal
        // ones of 1, sheddable ones of 1; each asking 60 units/s.
        let r = report(vec![
            usage(&[("tenant", "acme"), ("tollgate_cost", "10"), ("tollgate_class", "critical")], 6, 0),
            usage(&[("tenant", "acme"), ("path", "/n")], 50, 10),
            usage(&[("tenant", "acme"), ("path", "/s"), ("tollgate_class", "sheddable")], 40, 20),
        ]);
        assert_eq!(s.report(Nanos(10 * S), &rules, None, &r).unwrap(), (3, 0, Vec::new()));
        let acme = &s.exchanges(false)[0].groups[0];
        assert_eq!(acme.group, "acme", "the cost and class entries name no group");
        assert_eq!((acme.demand, acme.consumed, acme.admitted, acme.throttled), (180.0, 150.0, 96, 30));
        assert_eq!((acme.critical_admitted, acme.sheddable_admitted, acme.sheddable_throttled), (6, 40, 20));
        // 100 units/s: the critical bucket's 60 first (6 requests of 10 a second), then the
        // normal one's 40; the sheddable one gets nothing.
        let sent = s.assign(Nanos(10 * S), &[grant("acme", 100.0, 100.0)]);
        let by: HashMap<String, Option<Strategy>> = sent
            .actions
            .iter()
            .map(|a| {
                (a.bucket_id.as_ref().unwrap().bucket.get("path").cloned().unwrap_or_default(), strategy(a))
            })
            .collect();
        assert_eq!(by[""], tokens(6, 6), "{by:?}");
        assert_eq!(by["/n"], tokens(40, 40), "{by:?}");
        assert_eq!(by["/s"], Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)), "{by:?}");
        // With room for everyone, each bucket has its share of the demand.
        let sent = s.assign(Nanos(11 * S), &[grant("acme", 360.0, 360.0)]);
        let mut got: Vec<_> = sent.actions.iter().map(strategy).collect();
        got.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(got, [tokens(12, 12), tokens(120, 120), tokens(120, 120)]);
        // A dear request's share under one a second is paced, never faster than its units.
        let sent = s.assign(Nanos(12 * S), &[grant("acme", 2.0, 2.0)]);
        let critical =
            sent.actions.iter().find(|a| !a.bucket_id.as_ref().unwrap().bucket.contains_key("path"));
        assert_eq!(
            critical.and_then(strategy),
            Assignment::Paced(Pace { per_fill: 1, every_s: 5, max: 1 }).strategy().strategy
        );
        // A cost or class that breaks its rule is denied, naming the entry.
        for (k, v) in [
            ("tollgate_cost", "0"),
            ("tollgate_cost", "lots"),
            ("tollgate_cost", "2e9"),
            ("tollgate_class", "vip"),
        ] {
            let mut s = Session::new("envoy-rlqs-2".into());
            let r = report(vec![usage(&[("tenant", "b"), (k, v)], 1, 0)]);
            assert_eq!(s.report(Nanos(10 * S), &rules, None, &r).unwrap().1, 1, "{k}={v} is refused");
            let sent = s.assign(Nanos(10 * S), &[]);
            assert_eq!(strategy(&sent.actions[0]), Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)));
        }
    }

    #[test]
    fn a_share_under_a_request_a_second_is_paced_and_the_ttl_is_whole_seconds() {
        // One request every five seconds, not one a second: five times the share.
        assert_eq!(
            Assignment::of(false, 0.2, 0.2),
            Assignment::Paced(Pace { per_fill: 1, every_s: 5, max: 1 })
        );
        assert_eq!(Assignment::of(false, 0.6, 0.6), Assignment::Tokens { per_second: 1, max: 1 });
        assert_eq!(
            Assignment::of(false, 1e12, 1e12),
            Assignment::Tokens { per_second: u32::MAX, max: u32::MAX }
        );
        assert_eq!(Assignment::of(false, f64::NAN, 1.0), Assignment::DenyAll);
        let a = action(BucketId::default(), Assignment::AllowAll, Duration::from_millis(9_999));
        let Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) = a.bucket_action else { panic!() };
        assert_eq!(q.assignment_time_to_live, Some(PbDuration { seconds: 9, nanos: 0 }));
    }

    #[test]
    fn buckets_that_cannot_be_served_are_denied_and_named_and_the_rest_go_on() {
        let mut s = Session::new("envoy-rlqs-1".into());
        let long = "v".repeat(2000);
        let r = report(vec![
            usage(&[("tenant", "ok")], 1, 0),
            usage(&[("tenant", &long)], 1, 0),
            usage(&[("tenant", &"g".repeat(300))], 1, 0),
            usage(&[("tenant", "huge")], REQUESTS_MAX + 1, 0),
            BucketQuotaUsage::default(),
        ]);
        let (new, refused, overflow) = s.report(Nanos(S), &RuleSet::default(), None, &r).unwrap();
        assert_eq!((new, refused, overflow.len()), (4, 3, 0));
        let why: Vec<_> = s.buckets.values().filter_map(|b| b.group.as_ref().err().cloned()).collect();
        assert!(
            why.iter().any(|w| w.starts_with("bucket_quota_usages[1].bucket_id.bucket[\"tenant\"]")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("bucket_quota_usages[2].bucket_id: names group")), "{why:?}");
        assert!(why.iter().any(|w| w.contains("bucket_quota_usages[3]: at most")), "{why:?}");
        // Only the good bucket's group is exchanged; the others are denied.
        let ex = s.exchanges(false);
        assert_eq!(ex[0].groups.iter().map(|g| g.group.as_str()).collect::<Vec<_>>(), ["ok"]);
        let sent = s.assign(Nanos(S), &[grant("ok", 10.0, 10.0)]);
        let denied = sent
            .actions
            .iter()
            .filter(|a| strategy(a) == Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)))
            .count();
        assert_eq!((sent.actions.len(), denied), (4, 3));
        // A report malformed as a whole ends the stream, naming the field.
        let mut bad = report(vec![]);
        bad.domain = String::new();
        let e = s.report(Nanos(S), &RuleSet::default(), None, &bad).unwrap_err();
        assert!(e.message().starts_with("domain: must be 1 to"), "{}", e.message());
        let many = report((0..=BUCKETS_MAX).map(|i| usage(&[("tenant", &i.to_string())], 1, 0)).collect());
        let e = s.report(Nanos(S), &RuleSet::default(), None, &many).unwrap_err();
        assert!(e.message().starts_with("bucket_quota_usages: at most 10000"), "{}", e.message());
    }

    #[test]
    fn idle_buckets_are_abandoned_and_a_closing_stream_asks_for_nothing() {
        let mut s = Session::new("envoy-rlqs-1".into());
        s.report(Nanos(S), &RuleSet::default(), None, &report(vec![usage(&[("tenant", "a")], 5, 5)]))
            .unwrap();
        let closing = s.exchanges(true);
        assert_eq!(closing[0].groups[0].demand, 0.0);
        s.assign(Nanos(S), &[grant("a", 10.0, 10.0)]);
        // Reported with nothing in it from then on.
        s.report(Nanos(2 * S), &RuleSet::default(), None, &report(vec![usage(&[("tenant", "a")], 0, 0)]))
            .unwrap();
        let later = Nanos(S + IDLE_ABANDON.as_nanos() as u64);
        let sent = s.assign(later, &[grant("a", 10.0, 10.0)]);
        assert_eq!(sent.abandoned, 1);
        assert!(matches!(sent.actions[0].bucket_action, Some(bucket_action::BucketAction::AbandonAction(_))));
        assert!(s.buckets.is_empty());
        assert!(s.exchanges(false).is_empty());
    }
}
