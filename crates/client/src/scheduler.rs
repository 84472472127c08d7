//! The scheduling half, for a server's request path: at most `concurrency` requests run at
//! once; the others wait in a [`FairQueue`], and each freed slot goes to the next request in
//! (priority, virtual time) order, as TiKV schedules its read pool.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_limiter::scheduler::{Scheduler, SchedulerOptions};
//! use tollgate_limiter::core::config::Config;
//!
//! let settings = Config::parse("[groups.oltp]\npriority = \"high\"\nreserved = 5000\n")?;
//! let scheduler = Scheduler::new(&settings, SchedulerOptions { concurrency: 4, ..Default::default() });
//! let slot = scheduler.acquire("oltp", 3.0).await?; // runs now, or waits its turn
//! // ... serve the request ...
//! drop(slot); // the next waiter in fair order goes
//! # Ok(())
//! # }
//! ```
//!
//! Two limiters act before the queue, TiKV's soft quotas:
//!
//! - a group with a `backend_limit` gets at most that many units/s on this backend, whether or
//!   not the backend is busy: a request past it waits for the group's bucket (one second of
//!   the limit) to refill, up to `max_wait`, and is refused beyond;
//! - with a `capacity`, `background` groups (the backend's own compaction, replication) share
//!   a limiter that gives them what the front-end groups leave of the capacity, never less than
//!   a tenth of it, retuned every second from the front end's smoothed load.
//!
//! With [`SchedulerOptions::learn`], how many run at once is learned rather than set: each
//! slot's time in use is a latency sample for a [`LatencyLimit`], whose limit (never above
//! `concurrency`) is what runs at once, a request (unless critical) waits for a slot at most
//! the no-load latency, and [`Scheduler::health`] is the utilisation that limit
//! gives, for the [`BackendReporter`](crate::reporter::BackendReporter) to send the controller.
//! The backend then needs no capacity configured: the controller's saturation law shares what
//! it learned among the groups.
//!
//! The settings come from the settings given to [`Scheduler::new`] until
//! [`Scheduler::follow`] has fetched the controller's; from then on the controller pushes each
//! change, and the scheduler checks every `check_interval` that it holds the current version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::oneshot;
use tollgate_model::adaptive::{LatencyLimit, LearnSettings};
use tollgate_model::bucket::Bucket;
use tollgate_model::config::Config;
use tollgate_model::schedule::{CrossCharge, FairQueue, QueueFull};
use tollgate_model::settings::{GroupName, GroupSettings, check_group_name};
use tollgate_model::smooth::Smoother;
use tollgate_model::time::{Clock, Nanos};
use tollgate_proto::v1::{self, backend_client::BackendClient};

use crate::clock::TokioClock;
use crate::node_share::{Booked, NodeShare, NodeShares, book};

/// How the scheduler behaves.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Requests running at once; with `learn`, the most that ever run at once (the service's
    /// worker pool, say).
    pub concurrency: usize,
    /// How long a request waits for a slot at most; with `learn`, a request that is not
    /// critical never waits longer than the backend's no-load latency, once measured.
    pub max_wait: Duration,
    /// How many requests of one group may wait.
    pub queue_len_max: usize,
    /// The backend's capacity in units/s. When set, `background` groups share what the
    /// front-end groups leave of it (at least [`BACKGROUND_FLOOR`] of it); without it they are
    /// held only by their own `backend_limit` and their priority.
    pub capacity: Option<f64>,
    /// Learn how many requests run at once from their latency (see the [module
    /// documentation](self)), up to `concurrency`; `None` (the default) runs `concurrency`.
    /// The settings must pass [`LearnSettings::check`].
    pub learn: Option<LearnSettings>,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            concurrency: 16,
            max_wait: Duration::from_secs(5),
            queue_len_max: 10_000,
            capacity: None,
            learn: None,
        }
    }
}

/// Folding time of the arrival rate behind [`Scheduler::health`].
const ARRIVAL_SMOOTHING_S: f64 = 1.0;

/// What a scheduler has learned of its backend ([`Scheduler::learned`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// Requests allowed to run at once now (halved while probing).
    pub limit: usize,
    /// The learned limit, unrounded.
    pub estimate: f64,
    /// The latency of a request with the backend unloaded, once measured.
    pub noload: Option<Duration>,
    /// The mean latency of the windows outside a probe, smoothed over a few of them.
    pub latency: Option<Duration>,
    /// The rate the backend sustains at its limit, requests/s: the limit ÷ the latency.
    pub rate: Option<f64>,
    /// Requests arriving per second, smoothed over about a second.
    pub arriving: f64,
    /// Whether the no-load latency is being measured.
    pub probing: bool,
}

/// The share of the capacity background groups get however busy the front end is.
pub const BACKGROUND_FLOOR: f64 = 0.1;
/// How often the background limiter's rate follows the front end's load.
pub const BACKGROUND_RETUNE: Duration = Duration::from_secs(1);
/// Folding time of the front end's load, as the background limiter sees it.
const FOREGROUND_SMOOTHING_S: f64 = 2.0;

/// Why a request got no slot.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// Its group's queue is full.
    #[error(transparent)]
    QueueFull(#[from] QueueFull),
    /// It waited `max_wait` without a slot.
    #[error("group {group:?} waited {waited:?} for a slot without getting one")]
    TimedOut {
        /// The group.
        group: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The group name breaks the naming rules.
    #[error("invalid group name: {0}")]
    InvalidGroup(String),
    /// The group is past its soft quota on this backend (`backend_limit`), or background work
    /// past what the front end leaves, for longer than `max_wait`.
    #[error("group {group:?} is over its {limit} units/s on this backend; retry after {retry_after:?}")]
    OverBackendLimit {
        /// The group.
        group: String,
        /// The limit it is over, units/s.
        limit: f64,
        /// How long until the request would fit.
        retry_after: Duration,
    },
}

/// What the scheduler knows of a group it has seen.
struct Known {
    settings: GroupSettings,
    /// Its soft quota's bucket, when it has a `backend_limit`.
    limiter: Option<Bucket>,
}

struct State {
    queue: FairQueue<oneshot::Sender<()>>,
    /// Critical requests waiting: each freed slot goes to the first of them before the
    /// fair queue (request classes, see [`Scheduler::acquire_class`]).
    critical: std::collections::VecDeque<oneshot::Sender<()>>,
    /// Requests that gave their slot to critical work part way through
    /// ([`Slot::yield_to_critical`]): they take the next slots after the critical ones,
    /// ahead of the fair queue.
    resumed: std::collections::VecDeque<oneshot::Sender<()>>,
    running: usize,
    last_renewal: Nanos,
    known: HashMap<GroupName, Known>,
    settings: Config,
    /// The controller's version of `settings`; 0 while they are the local ones.
    version: u64,
    /// Units/s of front-end work, smoothed, for the background limiter.
    foreground: Smoother,
    last_retune: Nanos,
    /// The limit learned from latency, with `SchedulerOptions::learn`.
    learner: Option<LatencyLimit>,
    /// Requests arriving, smoothed.
    arrivals: Smoother,
    /// What other backends serve of each group, charged to the queue as time passes
    /// ([`Scheduler::charge_elsewhere`]).
    cross: CrossCharge,
    /// Each group's share of its limit on this backend ([`Scheduler::take_shares`]).
    shares: NodeShares,
}

impl State {
    /// How many may run at once now.
    fn allowed(&self, concurrency: usize) -> usize {
        self.learner.as_ref().map_or(concurrency, |l| l.limit().min(concurrency))
    }
}

struct Shared {
    state: Mutex<State>,
    opts: SchedulerOptions,
    clock: TokioClock,
    /// Shared by every background group, when the capacity is known.
    background: Option<Bucket>,
}

/// The soft quota's bucket: one second of the limit.
fn soft_bucket(limit: f64, now: Nanos) -> Bucket {
    Bucket::new(limit, limit, now)
}

/// The rate a group is weighed by in the fair queue: its share of its limit here, where the
/// controller gave it one; else, as TiKV weighs, its reservation, else its limit (0: none).
fn weighed_rate(s: &State, group: &GroupName, settings: &GroupSettings) -> f64 {
    let rate = match s.shares.rate(group.as_str()) {
        Some(share) => share,
        None if settings.reserved() > 0.0 => settings.reserved(),
        None => settings.limit().as_f64(),
    };
    if rate.is_finite() { rate } else { 0.0 }
}

/// The scheduler: cheap to clone. Must be created inside a tokio runtime.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (running, waiting) = self.load();
        f.debug_struct("Scheduler")
            .field("running", &running)
            .field("waiting", &waiting)
            .finish_non_exhaustive()
    }
}

/// A running request's slot; dropping it gives the slot to the next waiter.
#[must_use = "the slot is released when dropped"]
pub struct Slot {
    shared: Arc<Shared>,
    /// Taken by a critical request: it never yields.
    critical: bool,
    /// Set while the slot, yielded to critical work, waits to come back.
    resuming: Option<oneshot::Receiver<()>>,
    /// When the request started, how many ran then (itself included), and how long it has
    /// spent yielded: its latency sample when the limit is learned.
    started: Nanos,
    in_flight: usize,
    paused: Duration,
}

impl Slot {
    /// A slot taken with `in_flight` running, itself included.
    fn new(shared: &Arc<Shared>, critical: bool, in_flight: usize) -> Slot {
        let started = shared.clock.now();
        Slot { shared: shared.clone(), critical, resuming: None, started, in_flight, paused: Duration::ZERO }
    }

    /// A step boundary in a long request's work. When critical requests wait and this slot is
    /// not a critical one, the slot goes to the first of them and this request waits for the
    /// next free slot, after the critical ones and ahead of the fair queue; otherwise it
    /// returns at once. A request that does its work in steps and calls this between them
    /// keeps a critical request's wait to one step, not one whole request (the way a database
    /// admits each storage operation rather than each statement).
    ///
    /// Cancelled while it waits, the request holds no slot, and the one it is handed later goes
    /// straight to the next waiter.
    pub async fn yield_to_critical(&mut self) {
        if self.critical {
            return;
        }
        let receiver = {
            let mut s = self.shared.lock();
            let mut handed = false;
            while let Some(waiter) = s.critical.pop_front() {
                // The slot passes as it is: `running` counts it either way.
                if waiter.send(()).is_ok() {
                    handed = true;
                    break;
                }
            }
            if !handed {
                return;
            }
            let (tx, rx) = oneshot::channel();
            s.resumed.push_back(tx);
            rx
        };
        let receiver = self.resuming.insert(receiver);
        let from = self.shared.clock.now();
        // The sender is only dropped with the scheduler, which this slot keeps alive.
        let _ = receiver.await;
        self.resuming = None;
        self.paused += self.shared.clock.now().since(from);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        if let Some(mut receiver) = self.resuming.take() {
            // Dropped while waiting to resume: a slot handed over at the last moment is
            // passed on; otherwise there is nothing to give back.
            receiver.close();
            if receiver.try_recv().is_err() {
                s.resumed.retain(|tx| !tx.is_closed());
                return;
            }
        }
        s.running -= 1;
        if let Some(learner) = s.learner.as_mut() {
            let now = self.shared.clock.now();
            learner.sample(now, now.since(self.started).saturating_sub(self.paused), self.in_flight);
        }
        self.shared.dispatch(&mut s);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long a request may wait for a slot: `max_wait`, or with a learned limit at most the
    /// backend's no-load latency once known. The limit runs the backend at its knee, where
    /// the latency is `tolerance` times the no-load one; a queue longer than one more
    /// request's work in front of that only adds latency, and the work it would have held is
    /// better refused at once, for the client to retry or the controller to hold back.
    fn wait_bound(&self) -> Duration {
        let s = self.lock();
        let Some(l) = s.learner.as_ref() else { return self.opts.max_wait };
        let bound = l.noload();
        bound.map_or(self.opts.max_wait, |b| b.min(self.opts.max_wait))
    }

    /// Hands free slots to waiters in fair order, skipping any that gave up.
    fn dispatch(&self, s: &mut State) {
        let now = self.clock.now();
        if now.since(s.last_renewal) >= Duration::from_secs(1) {
            s.queue.renew();
            s.last_renewal = now;
        }
        s.cross.apply(now, &mut s.queue);
        while s.running < s.allowed(self.opts.concurrency) {
            let waiter = match s.critical.pop_front().or_else(|| s.resumed.pop_front()) {
                Some(waiter) => waiter,
                None => match s.queue.pop() {
                    Some((_, waiter)) => waiter,
                    None => break,
                },
            };
            if waiter.send(()).is_ok() {
                s.running += 1;
            }
        }
    }

    /// Takes a group's settings: its lane in the queue, its soft quota.
    fn learn(&self, s: &mut State, group: &GroupName, now: Nanos) {
        let settings = s.settings.settings_for(group.as_str());
        if s.known.get(group).is_some_and(|l| l.settings == settings) {
            return;
        }
        s.queue.set_group(group, settings.priority(), weighed_rate(s, group, &settings));
        let old = s.known.remove(group).and_then(|l| l.limiter);
        let limiter = match (settings.backend_limit(), old) {
            (None, _) => None,
            (Some(limit), Some(bucket)) => {
                // What the group holds (or owes) carries over.
                bucket.set_rate(limit, limit, now);
                Some(bucket)
            }
            (Some(limit), None) => Some(soft_bucket(limit, now)),
        };
        s.known.insert(group.clone(), Known { settings, limiter });
    }

    /// Follows the front end's load with the background limiter, once per
    /// [`BACKGROUND_RETUNE`].
    fn retune(&self, s: &mut State, now: Nanos) {
        let (Some(bucket), Some(capacity)) = (&self.background, self.opts.capacity) else { return };
        if now.since(s.last_retune) < BACKGROUND_RETUNE {
            return;
        }
        s.last_retune = now;
        let rate = (capacity - s.foreground.smooth_rate(now)).max(capacity * BACKGROUND_FLOOR);
        bucket.set_rate(rate, rate, now);
    }

    /// Books the soft quotas of a request: how long it must wait first.
    fn soft_quotas(
        &self,
        s: &mut State,
        group: &GroupName,
        cost: f64,
        now: Nanos,
    ) -> Result<Duration, ScheduleError> {
        self.retune(s, now);
        let learned = s.known.get(group).expect("learnt before");
        let max_wait = self.opts.max_wait;
        let over = |limit: f64, retry_after: Duration| ScheduleError::OverBackendLimit {
            group: group.to_string(),
            limit,
            retry_after,
        };
        let mut wait = Duration::ZERO;
        if let Some(bucket) = &learned.limiter {
            wait = book(bucket, cost, now, max_wait).map_err(|d| over(bucket.rate(), d))?;
        }
        // Its share here; past it, capacity lent while nothing waits and a slot is free.
        let idle = s.queue.is_empty()
            && s.critical.is_empty()
            && s.resumed.is_empty()
            && s.running < s.allowed(self.opts.concurrency);
        match s.shares.book(group.as_str(), cost, now, idle, max_wait) {
            Booked::Go(w) => wait = wait.max(w),
            Booked::Over(rate, d) => {
                if let Some(bucket) = &learned.limiter {
                    bucket.refund(cost);
                }
                return Err(over(rate, d));
            }
        }
        if learned.settings.background() {
            if let Some(shared) = &self.background {
                match book(shared, cost, now, max_wait) {
                    Ok(w) => wait = wait.max(w),
                    Err(d) => {
                        if let Some(bucket) = &learned.limiter {
                            bucket.refund(cost);
                        }
                        return Err(over(shared.rate(), d));
                    }
                }
            }
        } else {
            s.foreground.add_delta(now, cost.max(0.0));
        }
        Ok(wait)
    }
}

impl Scheduler {
    /// A scheduler for the groups in `settings` (priority and rate; others get the `default`
    /// group's).
    pub fn new(settings: &Config, opts: SchedulerOptions) -> Scheduler {
        let clock = TokioClock::new();
        let now = clock.now();
        let state = State {
            queue: FairQueue::new(opts.queue_len_max),
            critical: std::collections::VecDeque::new(),
            resumed: std::collections::VecDeque::new(),
            running: 0,
            last_renewal: now,
            known: HashMap::new(),
            settings: settings.clone(),
            version: 0,
            foreground: Smoother::new(FOREGROUND_SMOOTHING_S),
            last_retune: now,
            learner: opts.learn.clone().map(|l| LatencyLimit::new(l, now)),
            arrivals: Smoother::new(ARRIVAL_SMOOTHING_S),
            cross: CrossCharge::new(),
            shares: NodeShares::default(),
        };
        let background = opts.capacity.filter(|c| c.is_finite() && *c > 0.0).map(|c| soft_bucket(c, now));
        Scheduler { shared: Arc::new(Shared { state: Mutex::new(state), opts, clock, background }) }
    }

    /// Replaces the group settings (the controller's, at `version`): groups already seen take
    /// their new priority, rate and soft quota at once; queued work keeps its place.
    pub fn set_settings(&self, settings: Config, version: u64) {
        let now = self.shared.clock.now();
        let mut s = self.shared.lock();
        s.settings = settings;
        s.version = version;
        let groups: Vec<GroupName> = s.known.keys().cloned().collect();
        for g in &groups {
            self.shared.learn(&mut s, g, now);
        }
    }

    /// The version of the controller's settings in use; 0 while the local ones are.
    pub fn settings_version(&self) -> u64 {
        self.shared.lock().version
    }

    /// The settings a group is scheduled by now.
    pub fn settings_for(&self, group: &str) -> GroupSettings {
        self.shared.lock().settings.settings_for(group)
    }

    /// The background limiter's rate now, units/s (`None` without a capacity).
    pub fn background_rate(&self) -> Option<f64> {
        self.shared.background.as_ref().map(Bucket::rate)
    }

    /// A slot for a request of `cost` units of `group` in request class `class`: a critical
    /// request waits only for the critical ones before it, taking the next slot freed ahead
    /// of the fair queue; other classes queue as [`acquire`](Self::acquire) does.
    pub async fn acquire_class(
        &self,
        group: &str,
        cost: f64,
        class: tollgate_model::class::RequestClass,
    ) -> Result<Slot, ScheduleError> {
        if class != tollgate_model::class::RequestClass::Critical {
            return self.acquire(group, cost).await;
        }
        let (_, soft_wait) = self.admit_soft(group, cost).await?;
        let receiver = {
            let mut s = self.shared.lock();
            if s.running < s.allowed(self.shared.opts.concurrency) && s.critical.is_empty() {
                s.running += 1;
                return Ok(Slot::new(&self.shared, true, s.running));
            }
            if s.critical.len() >= self.shared.opts.queue_len_max {
                let limit = self.shared.opts.queue_len_max;
                return Err(ScheduleError::QueueFull(QueueFull { group: group.to_string(), limit }));
            }
            let (tx, rx) = oneshot::channel();
            s.critical.push_back(tx);
            rx
        };
        self.wait_for_slot(group, receiver, soft_wait, true).await
    }

    /// A slot for a request of `cost` units of `group`: at once if one is free and nobody
    /// waits, otherwise in fair order, waiting up to `max_wait`.
    pub async fn acquire(&self, group: &str, cost: f64) -> Result<Slot, ScheduleError> {
        let (name, soft_wait) = self.admit_soft(group, cost).await?;
        let receiver = {
            let mut s = self.shared.lock();
            let idle = s.queue.is_empty() && s.critical.is_empty() && s.resumed.is_empty();
            if s.running < s.allowed(self.shared.opts.concurrency) && idle {
                s.running += 1;
                // The cost still counts toward the group's virtual time.
                let (tx, rx) = oneshot::channel();
                s.queue.push(&name, tx, cost)?;
                let (_, tx) = s.queue.pop().expect("just pushed");
                drop(tx);
                drop(rx);
                return Ok(Slot::new(&self.shared, false, s.running));
            }
            let (tx, rx) = oneshot::channel();
            s.queue.push(&name, tx, cost)?;
            rx
        };
        self.wait_for_slot(group, receiver, soft_wait, false).await
    }

    /// Checks `group`'s name and passes its soft quotas, waiting for them if need be: its
    /// name, and how long it waited.
    async fn admit_soft(&self, group: &str, cost: f64) -> Result<(GroupName, Duration), ScheduleError> {
        check_group_name(group).map_err(|e| ScheduleError::InvalidGroup(e.rule))?;
        let name = GroupName::new(group).map_err(|e| ScheduleError::InvalidGroup(e.rule))?;
        let now = self.shared.clock.now();
        let soft_wait = {
            let mut s = self.shared.lock();
            s.arrivals.add_delta(now, 1.0);
            self.shared.learn(&mut s, &name, now);
            self.shared.soft_quotas(&mut s, &name, cost, now)?
        };
        if !soft_wait.is_zero() {
            tokio::time::sleep(soft_wait).await;
        }
        Ok((name, soft_wait))
    }

    /// Waits for a queued request's slot, within what `max_wait` leaves after `waited`.
    async fn wait_for_slot(
        &self,
        group: &str,
        mut receiver: oneshot::Receiver<()>,
        waited: Duration,
        critical: bool,
    ) -> Result<Slot, ScheduleError> {
        // Critical work goes first in line: it waits for the next slot freed, however long the
        // queue behind it.
        let bound = if critical { self.shared.opts.max_wait } else { self.shared.wait_bound() };
        let max_wait = bound.saturating_sub(waited);
        if let Ok(Ok(())) = tokio::time::timeout(max_wait, &mut receiver).await {
            return Ok(Slot::new(&self.shared, critical, self.shared.lock().running));
        }
        // Gave up. A slot may have been handed over at the last moment: close first, then
        // look, so it is either ours or never sent.
        receiver.close();
        if receiver.try_recv().is_ok() {
            return Ok(Slot::new(&self.shared, critical, self.shared.lock().running));
        }
        let mut s = self.shared.lock();
        s.queue.retain(|tx| !tx.is_closed());
        s.critical.retain(|tx| !tx.is_closed());
        self.shared.dispatch(&mut s);
        Err(ScheduleError::TimedOut { group: group.to_string(), waited: max_wait + waited })
    }

    /// Keeps the group settings in step with the controller at `url` (TiDB's metadata sync):
    /// fetches them at once (pull), then takes each change the controller pushes, and checks
    /// every `check_interval` that the version it holds is the controller's, fetching them
    /// again when not (a push lost while the stream was down). Until the first fetch, the local
    /// settings stand; when the controller cannot be reached, the last ones fetched do. Stops
    /// when the returned handle is dropped. Must be called inside a tokio runtime.
    ///
    /// Several controllers sharing one etcd are given comma-separated: any of them answers,
    /// and one that fails is left for the next.
    pub fn follow(&self, url: &str, opts: FollowOptions) -> Result<Following, crate::error::BuildError> {
        let mut clients = Vec::new();
        for u in url.split(',').map(str::trim) {
            let channel = opts
                .access
                .channel(u, Duration::from_secs(5))
                .map_err(|reason| crate::error::BuildError::Remote { url: u.to_string(), reason })?;
            clients.push(BackendClient::new(channel).max_decoding_message_size(SETTINGS_MAX_BYTES));
        }
        if clients.len() > crate::remote::CONTROLLERS_MAX {
            return Err(crate::error::BuildError::Remote {
                url: url.to_string(),
                reason: format!("give 1 to {} controller URLs", crate::remote::CONTROLLERS_MAX),
            });
        }
        let (stop, stopped) = tokio::sync::watch::channel(());
        tokio::spawn(follow(self.clone(), clients, opts, stopped));
        Ok(Following { _stop: stop })
    }

    /// Takes a set of settings from the controller.
    fn take(&self, set: v1::BackendSettings) {
        if set.unchanged {
            return;
        }
        let mut config = Config::default();
        for info in set.groups {
            let checked = GroupName::new(&info.name).map_err(|e| e.rule).and_then(|name| {
                tollgate_proto::convert::settings_from_proto(&info.settings.unwrap_or_default())
                    .map(|s| (name, s))
                    .map_err(|e| e.to_string())
            });
            match checked {
                Ok((name, settings)) => {
                    config.groups.insert(name, settings);
                }
                Err(e) => tracing::warn!(group = %info.name, error = %e, "tollgate: group settings left out"),
            }
        }
        self.set_settings(config, set.version);
    }

    /// What the scheduler has learned of its backend, with [`SchedulerOptions::learn`].
    pub fn learned(&self) -> Option<Learned> {
        let now = self.shared.clock.now();
        let mut s = self.shared.lock();
        let arriving = s.arrivals.smooth_rate(now).max(0.0);
        let l = s.learner.as_ref()?;
        let latency = l.latency();
        Some(Learned {
            limit: l.limit().min(self.shared.opts.concurrency),
            estimate: l.estimate(),
            noload: l.noload(),
            latency,
            rate: latency.filter(|d| !d.is_zero()).map(|d| l.estimate() / d.as_secs_f64()),
            arriving,
            probing: l.probing(),
        })
    }

    /// The backend's health as the limit learned gives it: the utilisation of the requests
    /// arriving ([`LatencyLimit::utilisation`]), for a
    /// [`BackendReporter`](crate::reporter::BackendReporter)'s health function. `None` unless
    /// the limit is learned.
    pub fn health(&self) -> Option<crate::reporter::BackendHealth> {
        let now = self.shared.clock.now();
        let mut s = self.shared.lock();
        let arriving = s.arrivals.smooth_rate(now).max(0.0);
        let l = s.learner.as_ref()?;
        Some(crate::reporter::BackendHealth::Utilisation(l.utilisation(arriving)))
    }

    /// Takes the units/s each group is served at on the other backends (dmClock's
    /// cross-backend term, which the controller answers each backend report with), in place
    /// of the last: from now on each group's virtual time here is charged for that work as if
    /// this backend had done it, so that a group spread over several backends gets its share
    /// of all of them together, not a share of each. A
    /// [`BackendReporter`](crate::reporter::BackendReporter) given this scheduler
    /// ([`ReporterOptions::scheduler`](crate::reporter::ReporterOptions::scheduler)) calls this
    /// with each answer. Names that are not group names, and rates that are not a finite
    /// positive number, are left out.
    pub fn charge_elsewhere<'a>(&self, rates: impl IntoIterator<Item = (&'a str, f64)>) {
        let rates: Vec<(GroupName, f64)> =
            rates.into_iter().filter_map(|(g, r)| Some((GroupName::new(g).ok()?, r))).collect();
        let now = self.shared.clock.now();
        let mut s = self.shared.lock();
        let s = &mut *s;
        s.cross.set_rates(now, &mut s.queue, rates);
    }

    /// Takes each group's share of its limit on this backend, as the controller answers a
    /// report, in place of the last ([`node_share`](crate::node_share)): a request of a group
    /// past its share waits for it (as for a `backend_limit`), unless the backend has nothing
    /// waiting and a slot free, when it lends the group capacity up to its ceiling; and the
    /// group's weight in the fair queue follows its share. A group left out holds none.
    pub fn take_shares(&self, shares: &[v1::NodeShare]) {
        let now = self.shared.clock.now();
        let mut s = self.shared.lock();
        // Only the groups whose share came or went, or may have moved, are weighed again:
        // each weighing looks at every group's rate.
        for g in s.shares.take(now, shares) {
            let Some(settings) = s.known.get(&g).map(|k| k.settings.clone()) else { continue };
            let rate = weighed_rate(&s, &g, &settings);
            s.queue.set_group(&g, settings.priority(), rate);
        }
    }

    /// Each group's share on this backend now, by group.
    pub fn shares(&self) -> HashMap<String, NodeShare> {
        self.shared.lock().shares.view()
    }

    /// The units/s charged now for each group's work on other backends.
    pub fn elsewhere(&self) -> HashMap<String, f64> {
        let s = self.shared.lock();
        s.cross.rates().iter().map(|(g, r)| (g.to_string(), *r)).collect()
    }

    /// Requests running now, and waiting.
    pub fn load(&self) -> (usize, usize) {
        let s = self.shared.lock();
        (s.running, s.queue.len() + s.critical.len() + s.resumed.len())
    }
}

impl crate::reporter::TakesAnswers for Scheduler {
    fn take_answer(&self, ack: &v1::ReportAck) {
        self.charge_elsewhere(ack.elsewhere.iter().map(|l| (l.group.as_str(), l.units_per_s)));
        self.take_shares(&ack.shares);
    }
}

/// The largest settings message a backend takes from the controller.
pub const SETTINGS_MAX_BYTES: usize = 64 * 1024 * 1024;

/// How a scheduler follows the controller's settings.
#[derive(Debug, Clone)]
pub struct FollowOptions {
    /// How often the version held is checked against the controller's (and the push stream
    /// reopened if it broke).
    pub check_interval: Duration,
    /// Take pushed changes as they happen (`false`: only the periodic check).
    pub push: bool,
    /// The token (a backend token) and TLS files for a controller that asks for them.
    pub access: crate::access::Access,
}

impl Default for FollowOptions {
    fn default() -> Self {
        Self { check_interval: Duration::from_secs(10), push: true, access: crate::access::Access::default() }
    }
}

/// Keeps a scheduler following the controller; dropping it stops.
#[must_use = "following stops when this is dropped"]
pub struct Following {
    _stop: tokio::sync::watch::Sender<()>,
}

async fn follow(
    scheduler: Scheduler,
    mut clients: Vec<BackendClient<crate::access::Rpc>>,
    opts: FollowOptions,
    mut stopped: tokio::sync::watch::Receiver<()>,
) {
    let mut current = 0usize;
    let mut ticker = tokio::time::interval(opts.check_interval.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pushes: Option<tonic::Streaming<v1::BackendSettings>> = None;
    loop {
        let next_push = async {
            match pushes.as_mut() {
                Some(stream) => stream.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stopped.changed() => return,
            _ = ticker.tick() => {
                // Pull: none yet, or perhaps stale.
                let known = scheduler.settings_version();
                let asked = clients[current].get_settings(v1::GetSettingsRequest { known_version: known });
                let fetched = tokio::time::timeout(opts.check_interval.max(Duration::from_secs(1)), asked).await;
                let ok = match fetched {
                    Ok(Ok(set)) => {
                        scheduler.take(set.into_inner());
                        true
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e.message(), "tollgate: settings not fetched");
                        false
                    }
                    Err(_) => {
                        tracing::debug!("tollgate: settings not fetched: timed out");
                        false
                    }
                };
                if !ok {
                    // The next controller, from the next check on.
                    current = (current + 1) % clients.len();
                    pushes = None;
                    continue;
                }
                if opts.push && pushes.is_none() {
                    let asked = clients[current].watch_settings(v1::WatchSettingsRequest {});
                    match tokio::time::timeout(opts.check_interval.max(Duration::from_secs(1)), asked).await {
                        Ok(Ok(stream)) => pushes = Some(stream.into_inner()),
                        Ok(Err(e)) => tracing::debug!(error = %e.message(), "tollgate: settings not watched"),
                        Err(_) => tracing::debug!("tollgate: settings not watched: timed out"),
                    }
                }
            }
            pushed = next_push => match pushed {
                Ok(Some(set)) => scheduler.take(set),
                Ok(None) | Err(_) => pushes = None,
            },
        }
    }
}
