//! Remote mode: the buckets are fed by a controller's grants.
//!
//! A [`Driver`] holds the client's side of the exchange, free of any transport: it builds each
//! `ExchangeRequest` (every group's demand through the same meter the embedded mode uses, what
//! it consumed and refused, the units waiting, the grant it holds) and applies each answer
//! (every group's grant becomes its bucket's rate and burst). [`Tollgate::remote`] runs a
//! driver over gRPC in a background task; `tollgate sim` runs the same driver in virtual time,
//! calling the controller in process. Nothing about an exchange is written twice.
//!
//! **When.** An exchange goes at the period the controller asks for; at once (at most every
//! 50 ms) when a group is new or was revived after being idle, carrying only the groups that
//! hold no grant and leaving the period where it was; after a refusal, no sooner
//! than the controller's next tick, since until then it would give the same answer; and 50 ms
//! after an answer given while the controller's tick was due or under way, which held the
//! grants that tick was about to replace (once: a second such answer waits for the period).
//!
//! **Many groups.** One exchange carries at most
//! [`EXCHANGE_GROUPS_MAX`](tollgate_proto::EXCHANGE_GROUPS_MAX) groups. A client with more
//! reports them over a round of exchanges, one page after the other, the busiest groups
//! first; a page refused or lost ends the round, and what it and the pages after it reported
//! is reported again.
//!
//! **Safe mode.** When no exchange succeeds for longer than the lease, the client applies its
//! [`SafeModePolicy`] to every group, new ones included: decay each group from its last grant
//! toward `reserved ÷ clients` (the default), let everything through, or refuse everything.
//! Safe mode shows in [`RemoteStatus`] and in a log line, and ends with the next successful
//! exchange. Failed exchanges are retried with backoff (100 ms doubling to 2 s); what a
//! failed exchange reported is reported again, so nothing is lost.
//!
//! **Idle groups.** A group with nothing to report for the idle expiry is no longer reported
//! (so the controller forgets it in turn) and its bucket closes until a fresh grant.
//!
//! [`Tollgate::remote`]: crate::Tollgate::remote

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tollgate_model::cost::CostModel;
use tollgate_model::demand::DemandMeter;
use tollgate_model::settings::{DroppedWork, GroupName};
use tollgate_model::time::{Clock, Nanos};
use tollgate_proto::v1;

use crate::clock::ClockSource;
use crate::error::ExchangeError;
use crate::group::{Group, Groups, Limiter};

/// What a client does when the controller stays unreachable past its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SafeModePolicy {
    /// Keep the last grant, decaying (half-life 5 s) toward `reserved ÷ clients`.
    #[default]
    Decay,
    /// Admit everything: availability over protection.
    FailOpen,
    /// Admit nothing: protection over availability.
    FailClosed,
}

/// How a remote client behaves.
#[derive(Clone)]
pub struct RemoteOptions {
    /// This client's id at the controller (default: `tollgate-PID-N`).
    pub client_id: Option<String>,
    /// Safe-mode policy.
    pub safe_mode: SafeModePolicy,
    /// How long `acquire` waits at most.
    pub max_wait: Duration,
    /// How long one exchange may take before it counts as failed.
    pub exchange_timeout: Duration,
    /// How `try_acquire_usage` prices a request: the same model as the controller's
    /// settings should use.
    pub cost_model: CostModel,
    /// A group with nothing to report for this long is no longer reported (the controller's
    /// own idle expiry is 240 s).
    pub group_idle_expiry: Duration,
    /// The most groups tracked separately; past it, new names share `default`'s state.
    pub max_tracked_groups: usize,
    /// The clock (default: the CPU's time-stamp counter, [`MonotonicClock`]). A test on
    /// tokio's paused or simulated time gives a [`TokioClock`](crate::clock::TokioClock).
    ///
    /// [`MonotonicClock`]: crate::clock::MonotonicClock
    pub clock: Option<Arc<dyn Clock>>,
    /// The exchange period this client asks for (TiDB's `target_request_period_ms`); the
    /// controller keeps it between its tick and half its lease. `None`: the controller's tick.
    /// Between exchanges, a group whose tokens run low (under a fifth of its burst) exchanges
    /// early, after the controller's next tick.
    pub exchange_period: Option<Duration>,
    /// The token and TLS files for a controller that asks for them (see
    /// [`Access`](crate::access::Access)); by default none.
    pub access: crate::access::Access,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            client_id: None,
            safe_mode: SafeModePolicy::Decay,
            max_wait: Duration::from_secs(1),
            exchange_timeout: Duration::from_secs(2),
            cost_model: CostModel::Count,
            group_idle_expiry: Duration::from_secs(240),
            max_tracked_groups: 10_000,
            clock: None,
            exchange_period: None,
            access: crate::access::Access::default(),
        }
    }
}

impl std::fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("client_id", &self.client_id)
            .field("safe_mode", &self.safe_mode)
            .field("max_wait", &self.max_wait)
            .field("exchange_timeout", &self.exchange_timeout)
            .field("cost_model", &self.cost_model)
            .field("group_idle_expiry", &self.group_idle_expiry)
            .field("max_tracked_groups", &self.max_tracked_groups)
            .finish_non_exhaustive()
    }
}

impl RemoteOptions {
    /// The same options on another clock (the default reads the CPU's time-stamp counter; a
    /// test on tokio's paused or simulated time passes a
    /// [`TokioClock`](crate::clock::TokioClock)).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }
}

/// The link's state, as the application can read it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteStatus {
    /// The last exchange succeeded.
    pub connected: bool,
    /// The lease ran out without renewal: the safe-mode policy applies.
    pub safe_mode: bool,
    /// Successful exchanges so far.
    pub exchanges: u64,
    /// The last failure, if the last exchange failed.
    pub last_error: Option<String>,
    /// The controller lets this client admit unthrottled work as such (see
    /// [`Tollgate::unthrottled`](crate::Tollgate::unthrottled)); when not, that work takes
    /// the buckets like any other.
    pub unthrottled_allowed: bool,
    /// The controller refuses this client for good (see [`ExchangeError::is_transient`]):
    /// nothing is admitted until it accepts the client again.
    pub rejected: Option<ExchangeError>,
    /// Failed exchanges so far, by kind: the transport, a timeout, a rejection.
    pub failures: ExchangeFailures,
}

/// Failed exchanges, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExchangeFailures {
    /// The controller could not be reached, or the connection broke.
    pub transport: u64,
    /// No answer in time.
    pub timeout: u64,
    /// The controller answered with an error (transient or not).
    pub rejected: u64,
}

/// The most new groups waiting for their first grant that are exchanged alone.
pub const FRESH_MAX: usize = tollgate_proto::EXCHANGE_GROUPS_MAX;
/// Half-life of the decay policy.
const DECAY_HALF_LIFE_S: f64 = 5.0;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Early exchanges are at least this far apart.
const EARLY_SPACING: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq)]
struct LastGrant {
    unlimited: bool,
    rate: f64,
    burst: f64,
    floor: f64,
}

/// Shared between the limiter's admissions and the exchange task.
pub(crate) struct Link {
    pub(crate) client_id: String,
    policy: SafeModePolicy,
    pub(crate) notify: tokio::sync::Notify,
    /// How many times `notify` was woken: what a caller stepping the driver itself reads
    /// instead ([`Driver::take_wake`]).
    wakes: AtomicU64,
    /// Woken whenever groups were given grants (an answer, or the safe-mode policy): what a
    /// request waiting for a new group's first grant waits on.
    pub(crate) granted: tokio::sync::Notify,
    /// A group was refused for want of burst, or the application asked to report now: exchange
    /// every group as soon as spacing allows.
    urgent: AtomicBool,
    /// Groups new or revived after going idle, waiting for their first grant: exchanged alone
    /// as soon as spacing allows. At most [`FRESH_MAX`]; past it, every group is exchanged.
    fresh: Mutex<Vec<GroupName>>,
    has_fresh: AtomicBool,
    /// A request was refused: exchange after the controller's next tick.
    refused: AtomicBool,
    connected: AtomicBool,
    safe_mode: AtomicBool,
    exchanges: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// A rejection that is not transient, while it holds.
    rejected: Mutex<Option<ExchangeError>>,
    /// Failed exchanges: the transport, timeouts, rejections.
    failures: [AtomicU64; 3],
    /// The controller lets this client admit work as unthrottled (its credential carries
    /// the privilege, or the controller asks for none). Until the first answer says so,
    /// unthrottled work takes the buckets like any other.
    pub(crate) unthrottled_allowed: AtomicBool,
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

impl Link {
    pub(crate) fn new(opts: &RemoteOptions) -> Link {
        let client_id = opts.client_id.clone().unwrap_or_else(|| {
            format!("tollgate-{}-{}", std::process::id(), NEXT_CLIENT.fetch_add(1, Ordering::Relaxed))
        });
        Link {
            client_id,
            policy: opts.safe_mode,
            notify: tokio::sync::Notify::new(),
            wakes: AtomicU64::new(0),
            granted: tokio::sync::Notify::new(),
            urgent: AtomicBool::new(false),
            fresh: Mutex::new(Vec::new()),
            has_fresh: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            safe_mode: AtomicBool::new(false),
            exchanges: AtomicU64::new(0),
            unthrottled_allowed: AtomicBool::new(false),
            last_error: Mutex::new(None),
            rejected: Mutex::new(None),
            failures: Default::default(),
        }
    }

    /// Asks for an exchange of every group as soon as spacing allows.
    pub(crate) fn urgent(&self) {
        self.urgent.store(true, Ordering::Relaxed);
        self.wake();
    }

    /// Wakes the exchange task to look at what is due.
    fn wake(&self) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Asks for `group`'s first grant (new, or revived after going idle) as soon as spacing
    /// allows.
    pub(crate) fn fresh(&self, group: &Group) {
        let mut fresh = self.fresh.lock().unwrap_or_else(PoisonError::into_inner);
        if fresh.len() < FRESH_MAX {
            fresh.push(group.name.clone());
            self.has_fresh.store(true, Ordering::Relaxed);
            self.wake();
        } else {
            drop(fresh);
            self.urgent();
        }
    }

    fn take_fresh(&self) -> Vec<GroupName> {
        let mut fresh = self.fresh.lock().unwrap_or_else(PoisonError::into_inner);
        self.has_fresh.store(false, Ordering::Relaxed);
        std::mem::take(&mut *fresh)
    }

    /// Asks for an exchange after the controller's next tick (a refusal).
    pub(crate) fn refused(&self) {
        // Refusals come in runs: after the first, the flag is already up.
        if !self.refused.load(Ordering::Relaxed) && !self.refused.swap(true, Ordering::Relaxed) {
            self.wake();
        }
    }

    /// A group just made: in safe mode it gets the policy at once, rather than waiting for an
    /// exchange that cannot succeed.
    pub(crate) fn new_group(&self, group: &Group, now: Nanos) {
        if self.safe_mode.load(Ordering::Relaxed) {
            let fresh = LastGrant { unlimited: false, rate: 0.0, burst: 0.0, floor: 0.0 };
            apply(group, safe(self.policy, None, fresh, Duration::ZERO), now);
            self.granted.notify_waiters();
        }
        self.fresh(group);
    }

    /// Waits for the next answer from the controller.
    pub(crate) async fn answered(&self) {
        self.granted.notified().await;
    }

    /// Waits until `group` holds a grant (at once when it does): woken by each answer.
    pub(crate) async fn until_granted(&self, group: &Group) {
        loop {
            let granted = self.granted.notified();
            tokio::pin!(granted);
            // Registered before the look, so an answer between the two is not missed.
            granted.as_mut().enable();
            if !group.allowance().is_nan() {
                return;
            }
            granted.await;
        }
    }

    pub(crate) fn status(&self) -> RemoteStatus {
        RemoteStatus {
            connected: self.connected.load(Ordering::Relaxed),
            safe_mode: self.safe_mode.load(Ordering::Relaxed),
            exchanges: self.exchanges.load(Ordering::Relaxed),
            last_error: self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            unthrottled_allowed: self.unthrottled_allowed.load(Ordering::Relaxed),
            rejected: self.rejection(),
            failures: ExchangeFailures {
                transport: self.failures[0].load(Ordering::Relaxed),
                timeout: self.failures[1].load(Ordering::Relaxed),
                rejected: self.failures[2].load(Ordering::Relaxed),
            },
        }
    }

    /// The controller's rejection of this client, while it holds (read when a request is
    /// refused, never on the way to an admission).
    pub(crate) fn rejection(&self) -> Option<ExchangeError> {
        self.rejected.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The client's side of the exchange, without a transport. See the [module
/// documentation](self).
pub struct Driver {
    groups: Weak<Groups>,
    link: Arc<Link>,
    clock: Arc<ClockSource>,
    idle_expiry: Duration,
    sequence: u64,
    meters: crate::names::ByName<DemandMeter>,
    /// The pages of this round not sent yet, most active groups first.
    round: std::collections::VecDeque<Page>,
    /// The meters the page in flight moved, as they were before: put back if it fails.
    sent: Option<Vec<(GroupName, Option<DemandMeter>)>>,
    /// The round under way reports only groups holding no grant yet.
    only_new: bool,
    grants: crate::names::ByName<LastGrant>,
    last_ok: Option<Nanos>,
    lease: Duration,
    safe_since: Option<Nanos>,
    backoff: Duration,
    last_exchange: Option<Nanos>,
    /// When the next periodic exchange is due.
    next_due: Nanos,
    /// When the controller next recomputes its grants.
    next_tick: Nanos,
    /// The last answer was given while the controller's tick was due or under way.
    stale: bool,
    /// The exchange period asked for, in milliseconds (0: the controller's tick).
    period_ms: u32,
    /// Grants being taken up over a trickle: (from, start, span) by group.
    trickles: crate::names::ByName<(f64, Nanos, Duration)>,
    /// How far apart early exchanges (for a new group, or once tokens run low) are at least.
    spacing: Duration,
    /// Groups the last answer left out that hold no grant (a region still leasing their share,
    /// a shard moving): asked for again, as new ones are, once the controller's next tick is due.
    ungranted: Vec<GroupName>,
    /// When the request in flight was sent: an allotment in its answer runs from then.
    sent_at: Option<Nanos>,
    /// Busy groups whose requests stopped: reported at once, asking nothing.
    quiet: crate::quiet::QuietWatch,
    /// The link's wakes seen so far ([`take_wake`](Self::take_wake)).
    wakes_seen: u64,
}

/// A group whose tokens fall under this share of its burst exchanges early.
pub const LOW_TOKENS: f64 = 0.2;
/// How often the exchange task looks for groups low on tokens between exchanges.
pub const LOW_TOKENS_CHECK: Duration = Duration::from_millis(100);

impl Driver {
    pub(crate) fn new(
        groups: Weak<Groups>,
        link: Arc<Link>,
        clock: Arc<ClockSource>,
        idle_expiry: Duration,
    ) -> Self {
        Self {
            groups,
            link,
            clock,
            idle_expiry,
            sequence: 0,
            meters: crate::names::ByName::default(),
            round: std::collections::VecDeque::new(),
            sent: None,
            only_new: false,
            grants: crate::names::ByName::default(),
            last_ok: None,
            lease: Duration::from_secs(10),
            safe_since: None,
            backoff: BACKOFF_MIN,
            last_exchange: None,
            next_due: Nanos::ZERO,
            next_tick: Nanos::ZERO,
            stale: false,
            period_ms: 0,
            trickles: crate::names::ByName::default(),
            spacing: EARLY_SPACING,
            ungranted: Vec::new(),
            sent_at: None,
            quiet: crate::quiet::QuietWatch::default(),
            wakes_seen: 0,
        }
    }

    /// Early exchanges at least `spacing` apart rather than 50 ms: a client in the
    /// controller's own process, whose exchanges cost no round trip, asks for a new group's
    /// first grant the moment the group appears (`Duration::ZERO`).
    pub fn with_early_spacing(mut self, spacing: Duration) -> Self {
        self.spacing = spacing;
        self
    }

    /// Asks the controller for this exchange period.
    pub(crate) fn with_period(mut self, period: Option<Duration>) -> Self {
        self.period_ms = period.map_or(0, |p| u32::try_from(p.as_millis()).unwrap_or(u32::MAX).max(1));
        self
    }

    /// Whether a group in use holds a finite grant and has less than [`LOW_TOKENS`] of its
    /// burst left: it should exchange before it runs out. Looked at off the hot path.
    fn low_on_tokens(&self, now: Nanos) -> bool {
        let Some(groups) = self.groups.upgrade() else { return false };
        self.grants.iter().any(|(name, g)| {
            !g.unlimited
                && g.rate > 0.0
                && groups.get(name.as_str()).is_some_and(|group| match group.limiter() {
                    Limiter::Bucket(b) => {
                        let burst = b.burst();
                        burst > 0.0 && b.available(now) < LOW_TOKENS * burst
                    }
                    Limiter::Epoch(_) => false,
                })
        })
    }

    /// The clock the limiter runs on.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// This client's id.
    pub fn client_id(&self) -> &str {
        &self.link.client_id
    }

    /// When the next exchange is due: the periodic one, or sooner when a group is new or a
    /// request was refused.
    pub fn due_at(&self) -> Nanos {
        let spaced = self.last_exchange.map_or(Nanos::ZERO, |t| t.after(self.spacing));
        let mut due = self.next_due;
        if self.link.urgent.load(Ordering::Relaxed) || self.link.has_fresh.load(Ordering::Relaxed) {
            due = due.min(spaced);
        }
        if self.link.refused.load(Ordering::Relaxed) || !self.ungranted.is_empty() {
            due = due.min(spaced.max(self.next_tick));
        }
        // Tokens running low: a new grant before they run out, once the controller has one.
        let early = spaced.max(self.next_tick);
        if early < due && self.low_on_tokens(self.clock.now().max(early)) {
            due = early;
        }
        due
    }

    /// Whether the limiter asked for an earlier exchange (a new group, a refusal, a report
    /// asked for now) since the last call: the exchange task wakes for it at once, so a caller
    /// stepping the driver itself polls and reads [`due_at`](Self::due_at) again then, and
    /// otherwise every [`LOW_TOKENS_CHECK`] or when the exchange it read is due.
    pub fn take_wake(&mut self) -> bool {
        let wakes = self.link.wakes.load(Ordering::Relaxed);
        std::mem::replace(&mut self.wakes_seen, wakes) != wakes
    }

    /// Whether an exchange is due at `now`.
    pub fn is_due(&self, now: Nanos) -> bool {
        now >= self.due_at()
    }

    /// Moves grants being taken up over a trickle along to `now`, and looks for busy groups
    /// that stopped asking ([`quiet`](crate::quiet): an exchange is then due at once). The
    /// exchange task calls it at least every [`LOW_TOKENS_CHECK`]; a caller driving the
    /// exchanges itself calls it as often.
    pub fn poll(&mut self, now: Nanos) {
        if self.quiet.watching()
            && let Some(groups) = self.groups.upgrade()
            && self.quiet.look(now, |name| groups.get(name.as_str()).map(|g| g.asked()))
        {
            // A busy group stopped asking: its share goes to the others at the next tick.
            self.link.urgent();
        }
        if self.trickles.is_empty() {
            return;
        }
        let Some(groups) = self.groups.upgrade() else { return };
        let grants = &self.grants;
        self.trickles.retain(|name, &mut (from, start, span)| {
            let (Some(group), Some(last)) = (groups.get(name.as_str()), grants.get(name)) else {
                return false;
            };
            let rate = climbing(from, last.rate, start, span, now);
            // Conservation where the grant is applied: a grant taken up over a trickle never
            // runs past the rate granted.
            debug_assert!(rate <= last.rate.max(from), "a trickle past its grant");
            apply(&group, LastGrant { rate, burst: last.burst * rate / last.rate.max(1e-12), ..*last }, now);
            rate < last.rate
        });
    }

    /// The next exchange's request; `None` once every handle on the limiter is gone.
    ///
    /// A client with more groups than one exchange may carry
    /// ([`EXCHANGE_GROUPS_MAX`](tollgate_proto::EXCHANGE_GROUPS_MAX)) reports them over a round
    /// of exchanges, one page after the other, the most active groups first (new ones, those
    /// with requests waiting or refused, then by demand): each page is due as soon as the last
    /// is answered, and the period starts after the last page.
    pub fn request(&mut self, now: Nanos) -> Option<v1::ExchangeRequest> {
        let groups = self.groups.upgrade()?;
        if !self.ungranted.is_empty() && now >= self.next_tick {
            for name in std::mem::take(&mut self.ungranted) {
                if let Some(g) = groups.get(name.as_str())
                    && !self.grants.contains_key(&g.name)
                {
                    self.link.fresh(&g);
                }
            }
        }
        if self.round.is_empty() {
            // Early for new groups alone: only they are reported, and the period keeps its
            // time. Tenants arriving one after another then cost an exchange of a few
            // groups each, not one of every group, and never put off the periodic round.
            self.only_new = now < self.next_due
                && !self.link.urgent.load(Ordering::Relaxed)
                && !self.link.refused.load(Ordering::Relaxed)
                && self.link.has_fresh.load(Ordering::Relaxed);
            self.round = if self.only_new {
                let fresh = self.fresh_groups(&groups);
                self.plan(now, fresh.iter().map(|g| &**g), true)
            } else {
                // Every group goes in this round, the new ones among them.
                self.link.take_fresh();
                self.link.urgent.store(false, Ordering::Relaxed);
                self.link.refused.store(false, Ordering::Relaxed);
                // Groups the application never asked for (the shared `default` state, until a
                // name falls back to it) are not reported.
                self.plan(now, groups.listed().used(), false)
            };
        } else if self.link.has_fresh.load(Ordering::Relaxed) {
            // In a round of many pages, new groups go in the next page, not after the round.
            let fresh = self.fresh_groups(&groups);
            for page in self.plan(now, fresh.iter().map(|g| &**g), true).into_iter().rev() {
                if !page.usage.is_empty() {
                    self.round.push_front(page);
                }
            }
        }
        let page = self.round.pop_front().unwrap_or_default();
        self.last_exchange = Some(now);
        self.sent_at = Some(now);
        self.sent = Some(page.before);
        self.sequence += 1;
        Some(v1::ExchangeRequest {
            client_id: self.link.client_id.clone(),
            sequence: self.sequence,
            groups: page.usage,
            target_request_period_ms: self.period_ms,
            shard_map_epoch: None,
            takes_allotments: true,
        })
    }

    /// The groups waiting for their first grant, once each.
    fn fresh_groups(&self, groups: &Groups) -> Vec<Arc<Group>> {
        let mut fresh: Vec<Arc<Group>> =
            self.link.take_fresh().iter().filter_map(|n| groups.get(n.as_str())).collect();
        fresh.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        fresh.dedup_by(|a, b| Arc::ptr_eq(a, b));
        fresh
    }

    /// Meters `groups` (those holding no grant alone, with `new_only`) and splits the reports
    /// into pages, most active first.
    fn plan<'a>(
        &mut self,
        now: Nanos,
        groups: impl Iterator<Item = &'a Group>,
        new_only: bool,
    ) -> std::collections::VecDeque<Page> {
        let mut reports: Vec<(u8, v1::GroupUsage, GroupName, Option<DemandMeter>)> = Vec::new();
        for g in groups {
            // A group whose allotment ran out is reported at once, as a new one is.
            let wants_allotment = g.take_allot_wanted();
            if new_only && self.grants.contains_key(&g.name) && !wants_allotment {
                continue;
            }
            let counts = g.counts();
            let before = self.meters.get(&g.name).cloned();
            let meter = self.meters.entry(g.name.clone()).or_insert_with(|| DemandMeter::new(now));
            // A group holding in-flight slots is not idle: its share stays leased.
            let slots = g.take_slot_report();
            if meter.idle(now, &counts, self.idle_expiry) && slots.is_none_or(|(held, _)| held == 0) {
                if self.grants.remove(&g.name).is_some()
                    && let Limiter::Bucket(bucket) = g.limiter()
                {
                    // Its lease has long run out: a fresh grant before it admits again.
                    bucket.close_until_rated(now);
                    g.allowance.store(f64::NAN.to_bits(), Ordering::Relaxed);
                }
                continue;
            }
            // What it admits at now: the live grant, or in safe mode what the policy left of
            // it (a controller learning after a failover renews no more than that).
            let held = self.grants.get(&g.name).filter(|l| !l.unlimited).map(|l| match self.safe_since {
                Some(since) => {
                    let gone = LastGrant { unlimited: false, rate: 0.0, burst: 0.0, floor: 0.0 };
                    safe(self.link.policy, Some(*l), gone, now.since(since)).rate
                }
                None => l.rate,
            });
            let interval = now.since(meter.last_report()).as_secs_f64().max(0.1);
            let mut r = meter.report(now, counts, g.waiting(), held);
            self.quiet.report(now, &g.name, (counts.asked, interval), &mut r);
            let rank = if !self.grants.contains_key(&g.name) || r.throttled > 0.0 || r.waiting > 0.0 {
                0
            } else if r.requests > 0.0 {
                1
            } else {
                2
            };
            let usage = usage_of(g, &r, slots);
            reports.push((rank, usage, g.name.clone(), before));
        }
        if reports.len() > tollgate_proto::EXCHANGE_GROUPS_MAX {
            // Only a round of several pages needs an order; within one page the order is the
            // table's, which the controller's look-ups are fastest on.
            reports.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.demand.total_cmp(&a.1.demand)));
        }
        let mut pages = std::collections::VecDeque::new();
        let mut page = Page::default();
        for (_, usage, name, before) in reports {
            if page.usage.len() == tollgate_proto::EXCHANGE_GROUPS_MAX {
                pages.push_back(std::mem::take(&mut page));
            }
            page.usage.push(usage);
            page.before.push((name, before));
        }
        // An exchange with no group still renews the client's standing (and says it is alive).
        pages.push_back(page);
        pages
    }

    /// Puts back the meters of the page in flight and of the pages not sent: what they
    /// reported is reported again.
    fn restore_round(&mut self) {
        let unsent = std::mem::take(&mut self.round);
        for (name, before) in
            self.sent.take().into_iter().flatten().chain(unsent.into_iter().flat_map(|p| p.before))
        {
            match before {
                Some(m) => {
                    self.meters.insert(name, m);
                }
                None => {
                    self.meters.remove(&name);
                }
            }
        }
    }

    /// Applies grant `g` to `group` at `now` (its policy, and its rate, taken up over the
    /// trickle when it rises); returns it as last granted.
    fn take_grant(&mut self, group: &Arc<Group>, g: &v1::Grant, now: Nanos) -> LastGrant {
        let dropped = if g.count_dropped { DroppedWork::Count } else { DroppedWork::Return };
        group.set_policy(crate::group::Policy {
            dropped,
            debt_repay: Duration::from_millis(u64::from(g.debt_repay_ms)),
            shadow: g.shadow,
            critical_reserve: g.critical_reserve,
            in_flight: g.in_flight_limited.then_some(g.in_flight),
        });
        let last = LastGrant {
            unlimited: g.unlimited,
            rate: g.rate,
            burst: g.burst,
            floor: g.reserved / f64::from(g.clients.max(1)),
        };
        if g.clients > 1
            && let Limiter::Bucket(bucket) = group.limiter()
        {
            // Shared with other processes: a bucket not started yet starts with what one
            // request needs, not a full burst (the group's burst is banked by the processes
            // that have been using it). Alone, it starts full.
            bucket.start_at(group.first_request());
        }
        // A rising grant with a trickle is taken up over it, from the rate the group had.
        let had = self.grants.get(&group.name).filter(|l| !l.unlimited).map_or(0.0, |l| l.rate);
        let trickle = Duration::from_millis(u64::from(g.trickle_ms));
        let climbing_now =
            self.trickles.get(&group.name).map(|&(f, start, span)| climbing(f, had, start, span, now));
        let current = climbing_now.unwrap_or(had);
        if !trickle.is_zero() && !last.unlimited && last.rate > current {
            // A trickle under way goes on toward the new grant; a new one starts here.
            if climbing_now.is_none() {
                self.trickles.insert(group.name.clone(), (had, now, trickle));
            }
            debug_assert!(current < last.rate, "a trickle starts below its grant");
            apply(group, LastGrant { rate: current, burst: last.burst * current / last.rate, ..last }, now);
        } else {
            self.trickles.remove(&group.name);
            apply(group, last, now);
        }
        last
    }

    /// Applies the controller's answer to the last request.
    pub fn answer(&mut self, now: Nanos, response: &v1::ExchangeResponse) {
        let Some(groups) = self.groups.upgrade() else { return };
        let sent = self.sent.take();
        self.link.unthrottled_allowed.store(response.unthrottled_allowed, Ordering::Relaxed);
        for g in &response.grants {
            let Some(group) = groups.get(&g.group) else { continue };
            let allotment = g.quota.as_ref().map(tollgate_proto::wire::allotment_in);
            group.set_allotment(allotment.as_ref(), self.sent_at.unwrap_or(now), now);
            let last = self.take_grant(&group, g, now);
            self.lease = Duration::from_millis(u64::from(g.lease_ms));
            self.grants.insert(group.name.clone(), last);
        }
        self.last_ok = Some(now);
        *self.link.rejected.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.link.connected.store(true, Ordering::Relaxed);
        self.link.exchanges.fetch_add(1, Ordering::Relaxed);
        *self.link.last_error.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if self.link.safe_mode.swap(false, Ordering::Relaxed) {
            tracing::info!(client = %self.link.client_id, "tollgate: controller reachable again, leaving safe mode");
        }
        self.safe_since = None;
        self.backoff = BACKOFF_MIN;
        let period = Duration::from_millis(u64::from(response.next_exchange_ms.max(10)));
        // No time to the next tick: the controller's tick was due or under way, so these are
        // the grants it is replacing. A client whose exchanges fall at the tick would hold them
        // a whole period (a group just marked busy left unlimited for another second); it asks
        // again shortly instead, once, so that a controller that is not ticking at all (not
        // yet, say) is not asked at every spacing.
        let stale = response.next_tick_ms == 0;
        let wait = if stale && !self.stale { period.min(EARLY_SPACING) } else { period };
        if !self.only_new {
            self.stale = stale;
        }
        // The round's next page goes at once; the period starts after the last (an exchange
        // for new groups alone leaves it where it was).
        if !self.round.is_empty() {
            self.next_due = now;
        } else if !self.only_new {
            self.next_due = now.after(wait);
        }
        // A tick due or under way (no time to it): what waits for the next tick (a refusal, a
        // group left out) asks again after the early spacing, not at once. A client spacing
        // its early exchanges by nothing (one in process) would otherwise ask again and again
        // for as long as the tick runs.
        let to_tick = match response.next_tick_ms {
            0 => period.min(EARLY_SPACING),
            ms => Duration::from_millis(u64::from(ms)),
        };
        self.next_tick = now.after(to_tick);
        // Groups sent and left out of the answer, holding no grant: asked for again after the
        // controller's next tick, rather than a period later.
        let left_out =
            sent.into_iter().flatten().map(|(name, _)| name).filter(|n| !self.grants.contains_key(n));
        self.ungranted.extend(left_out);
        self.ungranted.sort_unstable();
        self.ungranted.dedup();
        self.ungranted.truncate(FRESH_MAX);
        self.link.granted.notify_waiters();
    }

    /// Records a failed exchange: what it reported will be reported again; past the lease,
    /// the safe-mode policy applies.
    ///
    /// A rejection that is not transient ([`ExchangeError::is_transient`]: an unknown or
    /// revoked token, a permission refused) is no outage: every group is closed at once and
    /// each refused request says so ([`AcquireError::Rejected`](crate::AcquireError)), until
    /// an exchange succeeds again.
    pub fn failed(&mut self, now: Nanos, error: &ExchangeError) {
        let Some(groups) = self.groups.upgrade() else { return };
        self.restore_round();
        self.link.connected.store(false, Ordering::Relaxed);
        let kind = match error {
            ExchangeError::Transport(_) => 0,
            ExchangeError::Timeout(_) => 1,
            _ => 2,
        };
        self.link.failures[kind].fetch_add(1, Ordering::Relaxed);
        let reason = error.to_string();
        *self.link.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.clone());
        if !error.is_transient() {
            self.rejected(now, &groups, error);
        } else if self.last_ok.is_none_or(|t| now.since(t) > self.lease) {
            let since = *self.safe_since.get_or_insert(now);
            if !self.link.safe_mode.swap(true, Ordering::Relaxed) {
                tracing::warn!(client = %self.link.client_id, policy = ?self.link.policy, %reason, "tollgate: controller unreachable past the lease, entering safe mode");
            }
            let fresh = LastGrant { unlimited: false, rate: 0.0, burst: 0.0, floor: 0.0 };
            // Safe mode decides the rates now: no trickle climbs past it.
            self.trickles.clear();
            for g in groups.listed().all() {
                let last = self.grants.get(&g.name).copied();
                apply(g, safe(self.link.policy, last, fresh, now.since(since)), now);
            }
            self.link.granted.notify_waiters();
        }
        self.next_due = now.after(self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    /// The controller refuses this client for good: every group closed, unthrottled work
    /// taken from the buckets like any other, and the rejection kept for refused requests to
    /// report.
    fn rejected(&mut self, now: Nanos, groups: &Groups, error: &ExchangeError) {
        let mut held = self.link.rejected.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_none() {
            tracing::error!(client = %self.link.client_id, %error, "tollgate: the controller refuses this client; nothing is admitted until it accepts it");
        }
        *held = Some(error.clone());
        drop(held);
        self.link.unthrottled_allowed.store(false, Ordering::Relaxed);
        self.trickles.clear();
        let closed = LastGrant { unlimited: false, rate: 0.0, burst: 0.0, floor: 0.0 };
        for g in groups.listed().all() {
            apply(g, closed, now);
        }
        self.link.granted.notify_waiters();
    }

    /// Makes the next exchange due at once (another controller is tried after a failure).
    pub(crate) fn retry_now(&mut self, now: Nanos) {
        self.next_due = now;
    }
}

/// One exchange's share of a round: the reports, and the meters they moved as they were.
#[derive(Default)]
struct Page {
    usage: Vec<v1::GroupUsage>,
    before: Vec<(GroupName, Option<DemandMeter>)>,
}

/// The controllers a remote client knows: the addresses it was given (at most
/// [`CONTROLLERS_MAX`]; any controller answers, passing exchanges on to the leader), with the
/// one it talks to now.
pub(crate) struct Controllers {
    known: Vec<(String, v1::admission_client::AdmissionClient<crate::access::Rpc>)>,
    current: usize,
    /// With the groups sharded over the controllers, where each group's part goes
    /// ([`crate::shards`]); `None` for a client over a channel of the caller's.
    routes: Option<Arc<crate::shards::Routes>>,
}

/// The most controllers a remote client keeps addresses for.
pub const CONTROLLERS_MAX: usize = 16;

impl Controllers {
    /// Over `urls` (already checked).
    pub(crate) fn new(
        urls: Vec<(String, crate::access::Rpc)>,
        routes: Option<Arc<crate::shards::Routes>>,
    ) -> Controllers {
        let known =
            urls.into_iter().map(|(u, c)| (u, v1::admission_client::AdmissionClient::new(c))).collect();
        Controllers { known, current: 0, routes }
    }

    /// One exchange: by the shard map when the client follows one, else to the controller
    /// talked to now. Also says whether that controller failed.
    async fn exchange(
        &self,
        request: v1::ExchangeRequest,
        timeout: Duration,
    ) -> (Result<v1::ExchangeResponse, ExchangeError>, bool) {
        let home = &self.known[self.current].1;
        if let Some(routes) = &self.routes {
            let routed = crate::shards::exchange(routes, home, request, timeout).await;
            return (routed.answer, routed.home_failed);
        }
        let answer = crate::shards::call(home.clone(), request, timeout).await;
        let failed = answer.is_err();
        (answer, failed)
    }

    /// Moves to the next address.
    fn rotate(&mut self) {
        self.current = (self.current + 1) % self.known.len();
    }
}

/// What a grant becomes under `policy` after `elapsed` in safe mode; `last` is `None` for a
/// group that never had a grant (`fresh` then stands for it).
fn safe(policy: SafeModePolicy, last: Option<LastGrant>, fresh: LastGrant, elapsed: Duration) -> LastGrant {
    let last = last.unwrap_or(fresh);
    match policy {
        SafeModePolicy::FailOpen => LastGrant { unlimited: true, ..last },
        SafeModePolicy::FailClosed => LastGrant { unlimited: false, rate: 0.0, burst: 0.0, ..last },
        SafeModePolicy::Decay if last.unlimited => last,
        SafeModePolicy::Decay => {
            let keep = 0.5f64.powf(elapsed.as_secs_f64() / DECAY_HALF_LIFE_S);
            let rate = last.floor + (last.rate - last.floor).max(0.0) * keep;
            LastGrant { rate, burst: rate.max(last.floor), ..last }
        }
    }
}

/// The rate a trickle from `from` to `to` over `span`, begun at `start`, has reached at `now`.
fn climbing(from: f64, to: f64, start: Nanos, span: Duration, now: Nanos) -> f64 {
    let done = (now.since(start).as_secs_f64() / span.as_secs_f64().max(1e-9)).min(1.0);
    from + (to - from) * done
}

fn apply(group: &Group, g: LastGrant, now: Nanos) {
    if g.unlimited {
        group.set_rate(f64::INFINITY, 0.0, now);
    } else {
        group.set_rate(g.rate.max(0.0), g.burst.max(0.0), now);
    }
}

/// Runs `driver` over gRPC until the limiter is dropped: against the controller it talks to
/// now; a failure moves it to the next address (at once while some address is still untried
/// since the last answer).
impl Driver {
    /// Waits until an exchange is due, moving trickles along and waking at least every
    /// [`LOW_TOKENS_CHECK`] to look for groups running low (or at once when told of a new group
    /// or a refusal); returns the time it became due.
    async fn until_due(&mut self) -> Nanos {
        loop {
            let now = self.now();
            self.poll(now);
            let due = self.due_at();
            if now >= due {
                return now;
            }
            tokio::select! {
                () = tokio::time::sleep(due.since(now).min(LOW_TOKENS_CHECK)) => {}
                () = self.link.notify.notified() => {}
            }
        }
    }

    /// Runs the exchange loop over `channel`, a connection the caller may share among many
    /// clients of one process (a load generator playing thousands of clients, each with its
    /// own id and grants, over a few connections), each exchange given `timeout`. Ends when
    /// the last handle is dropped. Must run inside a tokio runtime.
    pub async fn run_on(mut self, channel: tonic::transport::Channel, timeout: Duration) {
        let mut client = v1::admission_client::AdmissionClient::new(channel);
        loop {
            let now = self.until_due().await;
            let Some(request) = self.request(now) else { return };
            match tokio::time::timeout(timeout, client.exchange(request)).await {
                Ok(Ok(response)) => self.answer(self.now(), response.get_ref()),
                Ok(Err(status)) => self.failed(self.now(), &ExchangeError::of(&status)),
                Err(_) => self.failed(self.now(), &ExchangeError::Timeout(timeout)),
            }
        }
    }

    /// Runs the exchange loop with `exchange` answering each request in process, as a
    /// controller's own front ends do (its Envoy rate-limit service is a client of its own
    /// grants): the same loop as a remote client's, with no network. Ends when the last
    /// handle is dropped. Must run inside a tokio runtime.
    pub async fn run_in_process(
        self,
        mut exchange: impl FnMut(&mut v1::ExchangeRequest) -> Result<v1::ExchangeResponse, tonic::Status> + Send,
    ) {
        self.run_with(move |mut request| std::future::ready(exchange(&mut request))).await
    }

    /// Runs the exchange loop with `exchange` answering each request however it likes: in
    /// process, or passed on to whichever controller grants now (a follower's front ends
    /// lease from the leader this way). Ends when the last handle is dropped. Must run inside
    /// a tokio runtime.
    pub async fn run_with<F>(mut self, mut exchange: impl FnMut(v1::ExchangeRequest) -> F + Send)
    where
        F: std::future::Future<Output = Result<v1::ExchangeResponse, tonic::Status>> + Send,
    {
        loop {
            let now = self.until_due().await;
            let Some(request) = self.request(now) else { return };
            match exchange(request).await {
                Ok(response) => self.answer(self.now(), &response),
                Err(status) => self.failed(self.now(), &ExchangeError::of(&status)),
            }
            if self.groups.strong_count() == 0 {
                return;
            }
        }
    }
}

pub(crate) async fn run(mut driver: Driver, mut controllers: Controllers, timeout: Duration) {
    let mut tried = 0usize;
    loop {
        let now = driver.until_due().await;
        let Some(request) = driver.request(now) else { return };
        let (answer, home_failed) = controllers.exchange(request, timeout).await;
        let now = driver.now();
        match answer {
            Ok(response) => driver.answer(now, &response),
            Err(error) => driver.failed(now, &error),
        }
        if home_failed {
            controllers.rotate();
            tried += 1;
            if tried < controllers.known.len() {
                driver.retry_now(now);
            }
        } else {
            tried = 0;
        }
        if driver.groups.strong_count() == 0 {
            return;
        }
    }
}

/// What a group's report `r` says to the controller, with its in-flight `slots` (held,
/// asked) and, where it has quotas, its allotment.
fn usage_of(
    g: &Group,
    r: &tollgate_model::engine::ClientReport,
    slots: Option<(u32, u32)>,
) -> v1::GroupUsage {
    // An allotment holds about two exchanges of demand (at a second each); more is
    // given back.
    let quota = g.allotment_report(r.demand * 4.0).map(|q| v1::QuotaHeld {
        window: q.window,
        given: q.given,
        used: q.used,
        lasts_ms: 0,
    });
    v1::GroupUsage {
        group: g.name.to_string(),
        quota,
        demand: r.demand,
        consumed: r.consumed,
        admitted: r.requests as u64,
        throttled: r.throttled as u64,
        waiting: r.waiting,
        unthrottled: r.unthrottled,
        held: r.held,
        waited: r.waited as u64,
        would_refuse: r.would_refuse as u64,
        largest: g.counters.take_largest() as f64 / crate::tally::MICROS_PER_UNIT as f64,
        in_flight: slots.map_or(0, |(held, _)| held),
        in_flight_asked: slots.map_or(0, |(_, asked)| asked),
        critical_admitted: r.classes[0][0],
        critical_throttled: r.classes[0][1],
        sheddable_admitted: r.classes[1][0],
        sheddable_throttled: r.classes[1][1],
        detail: (!r.detail.is_zero()).then(|| {
            let [rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs] = r.detail.values();
            v1::Consumption { rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_given_at_the_tick_is_asked_again_shortly_once_then_at_the_period() {
        let clock = tollgate_model::time::ManualClock::new();
        let opts = RemoteOptions { clock: Some(Arc::new(clock.clone())), ..RemoteOptions::default() };
        let (_gate, mut driver) = crate::Tollgate::remote_driven(opts).unwrap();
        let answer = |next_tick_ms| v1::ExchangeResponse {
            next_exchange_ms: 1000,
            next_tick_ms,
            ..v1::ExchangeResponse::default()
        };
        let ms = |n: u64| Duration::from_millis(n);
        clock.advance(ms(5000));
        // After the tick: the period.
        driver.answer(driver.now(), &answer(998));
        assert_eq!(driver.due_at(), driver.now().after(ms(1000)));
        // During it: again in 50 ms, to take the grants it makes.
        driver.answer(driver.now(), &answer(0));
        assert_eq!(driver.due_at(), driver.now().after(EARLY_SPACING));
        // Still not ticked (a controller that has not ticked yet): the period, not 50 ms again.
        clock.advance(EARLY_SPACING);
        driver.answer(driver.now(), &answer(0));
        assert_eq!(driver.due_at(), driver.now().after(ms(1000)));
        // And shortly again after the next fresh answer is followed by a stale one.
        clock.advance(ms(1000));
        driver.answer(driver.now(), &answer(950));
        driver.answer(driver.now(), &answer(0));
        assert_eq!(driver.due_at(), driver.now().after(EARLY_SPACING));
    }

    #[test]
    fn a_group_left_out_of_an_answer_is_asked_for_again_after_the_next_tick() {
        let clock = tollgate_model::time::ManualClock::new();
        let opts = RemoteOptions { clock: Some(Arc::new(clock.clone())), ..RemoteOptions::default() };
        let (gate, mut driver) = crate::Tollgate::remote_driven(opts).unwrap();
        let ms = |n: u64| Duration::from_millis(n);
        clock.advance(ms(5000));
        let _ = gate.try_acquire("waiting", 1.0);
        let _ = gate.try_acquire("granted", 1.0);
        let request = driver.request(driver.now()).unwrap();
        assert_eq!(request.groups.len(), 2);
        // One group's grant, and when the controller ticks next.
        let answer = |group: &str, next_tick_ms| v1::ExchangeResponse {
            grants: vec![v1::Grant {
                group: group.into(),
                rate: 10.0,
                burst: 10.0,
                lease_ms: 10_000,
                ..Default::default()
            }],
            next_exchange_ms: 1000,
            next_tick_ms,
            ..Default::default()
        };
        // A region still leasing `waiting`'s share leaves it out, and asks back in 20 ms.
        driver.answer(driver.now(), &answer("granted", 20));
        assert_eq!(driver.due_at(), driver.now().after(EARLY_SPACING), "after the tick, spaced");
        clock.advance(EARLY_SPACING);
        let again = driver.request(driver.now()).unwrap();
        let names: Vec<&str> = again.groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, ["waiting"], "only the group left out, as a new one");
        // Granted now: nothing is asked before the period.
        driver.answer(driver.now(), &answer("waiting", 900));
        assert_eq!(driver.due_at(), driver.now().after(ms(950)), "the period, from the last full round");
    }

    /// The load goes elsewhere just before an exchange: that report's demand still holds the
    /// busy second (its moving average), and 300 ms into the silence a report of nothing
    /// follows at once, so the share goes to the others at the next tick.
    #[test]
    fn a_busy_group_reported_in_its_silence_is_reported_quiet_at_once() {
        let clock = tollgate_model::time::ManualClock::new();
        let opts = RemoteOptions { clock: Some(Arc::new(clock.clone())), ..RemoteOptions::default() };
        let (gate, mut driver) = crate::Tollgate::remote_driven(opts).unwrap();
        let ms = |n: u64| Duration::from_millis(n);
        let answer = v1::ExchangeResponse {
            grants: vec![v1::Grant {
                group: "g".into(),
                rate: 1000.0,
                burst: 1000.0,
                lease_ms: 10_000,
                ..Default::default()
            }],
            next_exchange_ms: 1000,
            next_tick_ms: 1000,
            ..Default::default()
        };
        clock.advance(ms(5000));
        let _ = gate.try_acquire("g", 10.0);
        driver.request(driver.now()).unwrap();
        driver.answer(driver.now(), &answer);
        let demand = |r: &v1::ExchangeRequest| r.groups.iter().find(|u| u.group == "g").map(|u| u.demand);
        // A second of 60 requests of 10 units, then silence.
        for _ in 0..60 {
            clock.advance(Duration::from_micros(16_667));
            assert!(gate.try_acquire("g", 10.0).is_ok());
        }
        let busy = driver.request(driver.now()).unwrap();
        assert!(demand(&busy).unwrap() > 500.0, "{busy:?}");
        driver.answer(driver.now(), &answer);
        clock.advance(ms(100));
        driver.poll(driver.now());
        let early = driver.request(driver.now()).unwrap();
        assert!(demand(&early).unwrap() > 100.0, "the average still holds the busy second: {early:?}");
        driver.answer(driver.now(), &answer);
        clock.advance(ms(150));
        driver.poll(driver.now());
        assert!(driver.due_at() > driver.now(), "250 ms of silence: not quiet yet");
        clock.advance(ms(100));
        driver.poll(driver.now());
        assert!(driver.due_at() <= driver.now(), "quiet: an exchange is due at once");
        let quiet = driver.request(driver.now()).unwrap();
        assert_eq!(demand(&quiet), Some(0.0), "{quiet:?}");
    }

    #[test]
    fn a_new_group_and_the_first_refusal_wake_a_driver_stepped_by_hand() {
        let clock = tollgate_model::time::ManualClock::new();
        let opts = RemoteOptions { clock: Some(Arc::new(clock.clone())), ..RemoteOptions::default() };
        let (gate, mut driver) = crate::Tollgate::remote_driven(opts).unwrap();
        assert!(!driver.take_wake(), "nothing asked yet");
        // A new group: woken once, and not again until something else asks.
        let _ = gate.try_acquire("g", 1.0);
        assert!(driver.take_wake());
        assert!(!driver.take_wake());
        let answer = v1::ExchangeResponse {
            grants: vec![v1::Grant {
                group: "g".into(),
                rate: 1.0,
                burst: 1.0,
                lease_ms: 10_000,
                ..Default::default()
            }],
            next_exchange_ms: 1000,
            next_tick_ms: 1000,
            ..Default::default()
        };
        driver.request(driver.now()).unwrap();
        driver.answer(driver.now(), &answer);
        assert!(!driver.take_wake(), "an answer is not a wake");
        // Refusals come in runs: the first wakes, the rest of the run does not.
        assert!(gate.try_acquire("g", 1.0).is_ok());
        assert!(gate.try_acquire("g", 1.0).is_err());
        assert!(gate.try_acquire("g", 1.0).is_err());
        assert!(driver.take_wake());
        assert!(!driver.take_wake());
    }

    #[test]
    fn decay_halves_toward_the_floor_every_five_seconds() {
        let last = LastGrant { unlimited: false, rate: 100.0, burst: 100.0, floor: 20.0 };
        let fresh = LastGrant { unlimited: false, rate: 0.0, burst: 0.0, floor: 0.0 };
        let at = |s: u64| safe(SafeModePolicy::Decay, Some(last), fresh, Duration::from_secs(s)).rate;
        assert_eq!(at(0), 100.0);
        assert!((at(5) - 60.0).abs() < 1e-9);
        assert!((at(10) - 40.0).abs() < 1e-9);
        assert!(at(120) - 20.0 < 1e-3);
        assert!(safe(SafeModePolicy::FailOpen, Some(last), fresh, Duration::ZERO).unlimited);
        assert_eq!(safe(SafeModePolicy::FailClosed, Some(last), fresh, Duration::ZERO).rate, 0.0);
        // A group that never had a grant: open under FailOpen, closed otherwise.
        assert!(safe(SafeModePolicy::FailOpen, None, fresh, Duration::ZERO).unlimited);
        assert_eq!(safe(SafeModePolicy::Decay, None, fresh, Duration::ZERO).rate, 0.0);
    }
}
