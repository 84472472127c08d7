//! The embedded limiter: allocation and admission in process.
//!
//! A [`Tollgate`] holds, per group, a token bucket (or, in `fcfs` mode, Couchbase's
//! one-second gauges) and the group's counters. Admission touches only the group's own
//! atomics. Every `realloc_interval`, the first request to notice that the interval has
//! passed recomputes each group's allowance from its measured demand with
//! [`tollgate_core::allocate::allocate`] and sets the buckets' rates: no background task,
//! so a [`ManualClock`](tollgate_core::time::ManualClock) drives everything in tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::allocate::{Claim, allocate};
use tollgate_core::bucket::{Bucket, Priced, Refusal};
use tollgate_core::config::{AllocationMode, Config, NodeSettings};
use tollgate_core::cost::{CostModel, Usage, check_cost};
use tollgate_core::epoch::{EpochShare, Forced, PoolSpec};
use tollgate_core::fcfs::{FcfsGroup, FreePool};
use tollgate_core::ramp::Ramp;
use tollgate_core::settings::{DEFAULT_GROUP, GroupName, GroupSettings, Limit, check_group_name};
use tollgate_core::smooth::Smoother;
use tollgate_core::time::{Clock, Nanos};

use crate::clock::{ClockSource, MonotonicClock};
use crate::error::{AcquireError, BuildError};
use crate::permit::{GroupRef, Permit};
use crate::remote::{Cumulative, Fed, Link, RemoteOptions, RemoteStatus};
use crate::store::{SharesOf, StoreLink};
use crate::tally::{self, Counters, HasCounters, Stash, Tally, Totals};

/// How soon a remote client retries a request refused for want of a grant.
const REMOTE_RETRY: Duration = Duration::from_millis(20);

/// Folding time of the demand smoother, in seconds.
const DEMAND_FOLDING_S: f64 = 1.0;

/// Units are counted in millionths, so fractional costs (0.475 RU) add up exactly enough.
#[inline]
pub(crate) fn micros(units: f64) -> u64 {
    // Adding a half and truncating rounds without a libm call (costs are never negative).
    (units * 1e6 + 0.5) as u64
}

fn units(micros: u64) -> f64 {
    micros as f64 / 1e6
}

/// Where a new group's allowance comes from.
enum Feed {
    /// The embedded allocation.
    Local,
    /// A controller's grants.
    Remote,
    /// A pool shared through a store, and the size agreed at start.
    Share(PoolSpec, u64),
}

/// How a group is limited.
#[derive(Debug)]
pub(crate) enum Limiter {
    Bucket(Bucket),
    Fcfs {
        group: FcfsGroup,
        pool: Arc<FreePool>,
    },
    /// Store mode: a share of a pool agreed with other clients through Redis.
    Epoch(EpochShare),
}

/// One group's state.
pub(crate) struct Group {
    pub(crate) name: GroupName,
    pub(crate) settings: GroupSettings,
    pub(crate) limiter: Limiter,
    pub(crate) counters: Counters,
    /// Settlements: units added to (debt) or taken from (returned) admitted costs.
    pub(crate) settled_up_micro: AtomicU64,
    pub(crate) settled_down_micro: AtomicU64,
    pub(crate) clock: Arc<ClockSource>,
    /// The largest cost the group's bucket can ever hold.
    burst_ceiling: f64,
    /// Current allowance (units/s) and measured demand, as f64 bits.
    allowance: AtomicU64,
    demand: AtomicU64,
    me: Weak<Group>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Group {
    pub(crate) fn self_arc(&self) -> Arc<Group> {
        self.me.upgrade().expect("a group is alive while borrowed")
    }

    fn consumed(&self, totals: &Totals) -> f64 {
        let up = totals.admitted_micro + self.settled_up_micro.load(Ordering::Relaxed);
        units(up.saturating_sub(self.settled_down_micro.load(Ordering::Relaxed)))
    }

    /// Counts on this thread's tally for the group.
    #[inline]
    fn record(&self, f: impl FnOnce(&Tally)) {
        tally::record(self, &self.me, f);
    }

    /// Runs `f` on this thread's tally and stash for the group (`None` while the thread
    /// exits).
    #[inline]
    fn with_local<R>(&self, f: impl FnOnce(&Tally, &mut Stash) -> R) -> Option<R> {
        tally::with_local(self, &self.me, f)
    }
}

impl HasCounters for Group {
    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn return_stash(&self, stash: Stash) {
        if let Limiter::Bucket(bucket) = &self.limiter {
            bucket.refund(stash.units);
        }
    }
}

/// A group's counters and current rates, as read from the handle.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupStats {
    /// Requests admitted (unthrottled ones included).
    pub admitted: u64,
    /// Requests refused.
    pub throttled: u64,
    /// Units admitted, at the cost asked.
    pub admitted_units: f64,
    /// Units refused.
    pub throttled_units: f64,
    /// Units consumed: admitted, corrected by settlements. What a group is billed on.
    pub consumed_units: f64,
    /// Measured demand, units/s asked (admitted or not), as of the last reallocation.
    pub demand: f64,
    /// Current allowance, units/s (infinite when unlimited).
    pub allowance: f64,
}

struct Track {
    smoother: Smoother,
    last_asked: f64,
    last_unmet: u64,
    last_consumed: f64,
    ramp: Option<Ramp>,
}

struct Realloc {
    last: Nanos,
    tracks: HashMap<GroupName, Track>,
}

pub(crate) struct Inner {
    clock: Arc<ClockSource>,
    node: NodeSettings,
    cost_model: CostModel,
    configured: HashMap<Box<str>, GroupSettings>,
    groups: ArcSwap<HashMap<Box<str>, Arc<Group>>>,
    /// The `default` group's state: shared by groups beyond the tracking limit.
    overflow: Arc<Group>,
    insert: Mutex<()>,
    next_realloc_ns: AtomicU64,
    realloc: Mutex<Realloc>,
    pool: Option<Arc<FreePool>>,
    /// Remote mode: grants come from a controller through this link.
    remote: Option<Arc<Link>>,
    /// Store mode: sizes come from Redis through this link.
    store: std::sync::OnceLock<Arc<StoreLink>>,
}

/// The admission handle: cheap to clone, shared by every task of a process.
///
/// ```
/// use tollgate_client::Tollgate;
///
/// let gate = Tollgate::from_toml(r#"
///     [node]
///     capacity = 1000
///     [groups.checkout]
///     reserved = 600
///     [groups.reports]
///     limit = 200
/// "#)?;
/// match gate.try_acquire("checkout", 3.0) {
///     Ok(_permit) => { /* run the request */ }
///     Err(e) => eprintln!("not now: {e}"),
/// }
/// # Ok::<(), tollgate_client::BuildError>(())
/// ```
#[derive(Clone)]
pub struct Tollgate {
    inner: Arc<Inner>,
    unthrottled: bool,
}

impl std::fmt::Debug for Tollgate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tollgate")
            .field("node", &self.inner.node)
            .field("groups", &self.inner.groups.load().len())
            .field("unthrottled", &self.unthrottled)
            .finish()
    }
}

/// Builds a [`Tollgate`] from settings described in code or read from a file.
#[derive(Clone, Default)]
pub struct Builder {
    config: Config,
    clock: Option<ClockSource>,
    remote: Option<Arc<Link>>,
    /// Store mode: each coordinated group's pool and the size agreed at start.
    pub(crate) shares: Option<Arc<HashMap<GroupName, (PoolSpec, u64)>>>,
}

impl Builder {
    /// Starts from a whole configuration (replacing anything set so far).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The node's capacity in units/s.
    pub fn capacity(mut self, units_per_s: f64) -> Self {
        self.config.node.capacity = Some(units_per_s);
        self
    }

    /// How the capacity is shared.
    pub fn mode(mut self, mode: AllocationMode) -> Self {
        self.config.node.mode = mode;
        self
    }

    /// How long `acquire` waits at most.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.node.max_wait = max_wait;
        self
    }

    /// How often allowances are recomputed from demand.
    pub fn realloc_interval(mut self, interval: Duration) -> Self {
        self.config.node.realloc_interval = interval;
        self
    }

    /// The cost model used by [`Tollgate::try_acquire_usage`].
    pub fn cost_model(mut self, model: CostModel) -> Self {
        self.config.cost_model = model;
        self
    }

    /// Adds or replaces a group.
    pub fn group(mut self, name: GroupName, settings: GroupSettings) -> Self {
        self.config.groups.insert(name, settings);
        self
    }

    /// The clock (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(ClockSource::of(clock));
        self
    }

    /// Store mode: the coordinated groups' pools and starting sizes.
    pub(crate) fn shares(mut self, shares: Arc<HashMap<GroupName, (PoolSpec, u64)>>) -> Self {
        self.shares = Some(shares);
        self
    }

    /// Checks what this limiter cannot carry out and builds it.
    pub fn build(self) -> Result<Tollgate, BuildError> {
        let Builder { config, clock, remote, shares } = self;
        config.cost_model.validate()?;
        check_node(&config.node)?;
        for (name, settings) in &config.groups {
            if config.node.mode == AllocationMode::Fcfs && settings.budget().is_some() {
                return Err(BuildError::Unsupported {
                    group: name.to_string(),
                    field: "budget (in fcfs mode)",
                });
            }
        }
        let clock = Arc::new(clock.unwrap_or_else(|| ClockSource::of(MonotonicClock::new())));
        let now = clock.now();
        let pool = (config.node.mode == AllocationMode::Fcfs)
            .then(|| Arc::new(FreePool::new(config.node.capacity.unwrap_or(f64::INFINITY))));
        let configured: HashMap<Box<str>, GroupSettings> =
            config.groups.iter().map(|(n, s)| (n.as_str().into(), s.clone())).collect();
        let default_settings = config.settings_for(DEFAULT_GROUP);
        let is_remote = remote.is_some();
        let make = |name: GroupName, settings: GroupSettings| {
            let feed = match shares.as_ref().and_then(|s| s.get(&name).cloned()) {
                Some((spec, size)) => Feed::Share(spec, size),
                None if is_remote => Feed::Remote,
                None => Feed::Local,
            };
            new_group(name, settings, &config.node, &clock, pool.as_ref(), now, feed)
        };
        let overflow = make(GroupName::default_group(), default_settings);
        let mut groups: HashMap<Box<str>, Arc<Group>> = HashMap::new();
        groups.insert(DEFAULT_GROUP.into(), overflow.clone());
        for (name, settings) in &config.groups {
            if name.as_str() != DEFAULT_GROUP {
                groups.insert(name.as_str().into(), make(name.clone(), settings.clone()));
            }
        }
        let inner = Inner {
            clock,
            node: config.node.clone(),
            cost_model: config.cost_model,
            configured,
            groups: ArcSwap::from_pointee(groups),
            overflow,
            insert: Mutex::new(()),
            // In remote mode the controller allocates: no local reallocation, ever.
            next_realloc_ns: AtomicU64::new(if is_remote { u64::MAX } else { 0 }),
            realloc: Mutex::new(Realloc { last: now, tracks: HashMap::new() }),
            pool,
            remote,
            store: std::sync::OnceLock::new(),
        };
        inner.update_pool();
        if !is_remote {
            inner.reallocate(now);
        }
        Ok(Tollgate { inner: Arc::new(inner), unthrottled: false })
    }
}

fn check_node(node: &NodeSettings) -> Result<(), BuildError> {
    let mut errors = Vec::new();
    if let Some(c) = node.capacity
        && !(c.is_finite() && c > 0.0)
    {
        errors.push(("capacity", format!("must be a finite number above 0, got {c}")));
    }
    if node.realloc_interval.is_zero() {
        errors.push(("realloc_ms", "must be above 0".to_string()));
    }
    if node.max_tracked_groups == 0 {
        errors.push(("max_tracked_groups", "must be at least 1".to_string()));
    }
    if errors.is_empty() {
        return Ok(());
    }
    let errors = errors
        .into_iter()
        .map(|(field, rule)| tollgate_core::config::ConfigError {
            line: 0,
            field: format!("node.{field}"),
            rule,
        })
        .collect();
    Err(BuildError::Config(tollgate_core::config::ConfigErrors(errors)))
}

fn new_group(
    name: GroupName,
    settings: GroupSettings,
    node: &NodeSettings,
    clock: &Arc<ClockSource>,
    pool: Option<&Arc<FreePool>>,
    now: Nanos,
    feed: Feed,
) -> Arc<Group> {
    let remote = matches!(feed, Feed::Remote);
    let ceiling = max_rate(&settings, node);
    // Remotely, the controller decides what a group may hold.
    let burst_ceiling = if remote { f64::INFINITY } else { settings.burst().unwrap_or(ceiling) };
    let limiter = match (pool, feed) {
        (_, Feed::Share(spec, size)) => Limiter::Epoch(EpochShare::new(spec, size)),
        (Some(pool), _) => {
            let limit = match settings.limit() {
                Limit::Units(u) => Some(u),
                Limit::Unlimited => None,
            };
            Limiter::Fcfs { group: FcfsGroup::new(settings.reserved(), limit), pool: pool.clone() }
        }
        // Remotely, closed until the controller's first grant (asked for at once).
        (None, Feed::Remote) => Limiter::Bucket(Bucket::closed_until_rated(now)),
        // Start full at the highest rate the group could have; the reallocation that follows
        // at once sets its real allowance, keeping it full at the new burst.
        (None, Feed::Local) => Limiter::Bucket(Bucket::new(ceiling, settings.burst_for(ceiling), now)),
    };
    Arc::new_cyclic(|me| Group {
        name,
        settings,
        limiter,
        counters: Counters::new(),
        settled_up_micro: AtomicU64::new(0),
        settled_down_micro: AtomicU64::new(0),
        clock: clock.clone(),
        burst_ceiling,
        allowance: AtomicU64::new(0f64.to_bits()),
        demand: AtomicU64::new(0f64.to_bits()),
        me: me.clone(),
    })
}

/// The most a group can ever be allowed: its reservation, or its limit within the capacity.
fn max_rate(settings: &GroupSettings, node: &NodeSettings) -> f64 {
    let capped = settings.limit().as_f64().min(node.capacity.unwrap_or(f64::INFINITY));
    capped.max(settings.reserved())
}

impl Inner {
    /// Recomputes allowances if the interval has passed; cheap when it has not.
    #[inline(always)]
    fn tick(&self, now: Nanos) {
        let due = self.next_realloc_ns.load(Ordering::Relaxed);
        if now.0 >= due {
            self.tick_slow(now, due);
        }
    }

    #[cold]
    fn tick_slow(&self, now: Nanos, due: u64) {
        let next = now.after(self.node.realloc_interval).0;
        if self.next_realloc_ns.compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.reallocate(now);
        }
    }

    fn reallocate(&self, now: Nanos) {
        let Ok(mut state) = self.realloc.try_lock() else { return };
        let groups = self.groups.load();
        let elapsed_s = now.since(state.last).as_secs_f64();
        state.last = now;
        let mut list: Vec<&Arc<Group>> = groups.values().collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list.dedup_by(|a, b| Arc::ptr_eq(a, b));
        let mut claims = Vec::with_capacity(list.len());
        for g in &list {
            let totals = g.counters.totals();
            let asked = units(totals.admitted_micro + totals.throttled_micro);
            let unmet = totals.throttled + totals.waited;
            let consumed = g.consumed(&totals);
            let track = state.tracks.entry(g.name.clone()).or_insert_with(|| Track {
                smoother: Smoother::new(DEMAND_FOLDING_S),
                last_asked: asked,
                last_unmet: unmet,
                last_consumed: consumed,
                ramp: g.settings.ramp().map(|r| Ramp::new(*r, None)),
            });
            // The ramp moves at each epoch with a call; what was consumed since the last
            // reallocation counts as use (of the epoch it mostly belongs to: the one before a
            // new epoch starts).
            let called = asked > track.last_asked;
            if let Some(ramp) = &mut track.ramp {
                ramp.use_units(consumed - track.last_consumed);
                if called {
                    ramp.at_epoch(now.0 / 1_000_000_000);
                }
            }
            track.last_consumed = consumed;
            let ramp_pool = track.ramp.as_ref().map(|r| r.pool() as f64);
            track.smoother.set_total(now, asked);
            let instant = if elapsed_s > 0.0 { (asked - track.last_asked) / elapsed_s } else { 0.0 };
            let measured = instant.max(track.smoother.smooth_rate(now)).max(0.0);
            // A group that waited or was refused wants more than it got: for max-min
            // fairness its demand is unbounded, and it shares what others leave.
            let hungry = unmet > track.last_unmet;
            track.last_asked = asked;
            track.last_unmet = unmet;
            g.demand.store(measured.to_bits(), Ordering::Relaxed);
            let s = &g.settings;
            let exhausted = s.budget().is_some_and(|b| g.consumed(&totals) >= b);
            let ceiling = if exhausted { s.reserved() } else { s.limit().as_f64() };
            let ceiling = ramp_pool.map_or(ceiling, |pool| ceiling.min(pool));
            claims.push(Claim {
                reserved: s.reserved(),
                ceiling,
                priority: s.priority(),
                weight: s.weight(),
                demand: if hungry { f64::INFINITY } else { measured },
            });
        }
        let shares = self.node.capacity.map(|capacity| allocate(capacity, &claims));
        for (i, g) in list.iter().enumerate() {
            let claim = &claims[i];
            let target = match &shares {
                Some(shares) => claim.reserved.max(claim.ceiling.min(shares[i])),
                None => claim.reserved.max(claim.ceiling),
            };
            g.allowance.store(target.to_bits(), Ordering::Relaxed);
            if let Limiter::Bucket(bucket) = &g.limiter {
                bucket.set_rate(target, g.settings.burst_for(target), now);
            }
        }
    }

    fn lookup(&self, name: &str) -> Result<Arc<Group>, AcquireError> {
        if let Some(g) = self.groups.load().get(name) {
            return Ok(g.clone());
        }
        self.insert_group(name)
    }

    #[cold]
    fn insert_group(&self, name: &str) -> Result<Arc<Group>, AcquireError> {
        check_group_name(name).map_err(AcquireError::InvalidGroup)?;
        let _guard = self.insert.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.groups.load_full();
        if let Some(g) = current.get(name) {
            return Ok(g.clone());
        }
        if current.len() >= self.node.max_tracked_groups {
            return Ok(self.overflow.clone());
        }
        let settings = self
            .configured
            .get(name)
            .or_else(|| self.configured.get(DEFAULT_GROUP))
            .cloned()
            .unwrap_or_default();
        let now = self.clock.now();
        let group = new_group(
            GroupName::new(name).map_err(AcquireError::InvalidGroup)?,
            settings,
            &self.node,
            &self.clock,
            self.pool.as_ref(),
            now,
            if self.remote.is_some() { Feed::Remote } else { Feed::Local },
        );
        let mut next = HashMap::clone(&current);
        next.insert(name.into(), group.clone());
        self.groups.store(Arc::new(next));
        drop(_guard);
        self.update_pool();
        match &self.remote {
            Some(link) => link.nudge(),
            None => self.reallocate(now),
        }
        Ok(group)
    }

    /// Couchbase counts every reservation against the free pool, active or not.
    fn update_pool(&self) {
        if let Some(pool) = &self.pool {
            let groups = self.groups.load();
            let mut seen: Vec<&Arc<Group>> = groups.values().collect();
            seen.sort_by(|a, b| a.name.cmp(&b.name));
            seen.dedup_by(|a, b| Arc::ptr_eq(a, b));
            pool.set_reserved_total(seen.iter().map(|g| g.settings.reserved()).sum());
        }
    }

    /// Admits `cost` for `group` now, or books it within `max_wait`: returns the permit and
    /// how long to wait before going ahead.
    #[inline]
    fn admit<'g>(
        &self,
        group: GroupRef<'g>,
        cost: f64,
        max_wait: Duration,
        unthrottled: bool,
    ) -> Result<(Permit<'g>, Duration), AcquireError> {
        if !(cost >= 0.0 && cost.is_finite()) {
            return Err(AcquireError::InvalidCost(check_cost("cost", cost).expect_err("cost is invalid")));
        }
        let g = &*group;
        // Price before reading the clock: the two are independent and overlap in the CPU.
        let priced = match &g.limiter {
            Limiter::Bucket(bucket) if max_wait.is_zero() => Some(bucket.price(cost)),
            _ => None,
        };
        let now = self.clock.now();
        self.tick(now);
        if unthrottled {
            return Ok((self.admit_unthrottled(group, cost, now), Duration::ZERO));
        }
        if cost > g.burst_ceiling {
            return Err(AcquireError::NeverAdmissible {
                group: g.name.clone(),
                cost,
                burst: g.burst_ceiling,
            });
        }
        let outcome = match &g.limiter {
            Limiter::Bucket(bucket) if let Some(priced) = priced => {
                bucket.commit(priced, now).map(|()| (Duration::ZERO, None)).map_err(|r| self.retry_after(r))
            }
            Limiter::Bucket(bucket) => {
                bucket.reserve(cost, now, max_wait).map(|wait| (wait, None)).map_err(|r| self.retry_after(r))
            }
            Limiter::Fcfs { group: gauge, pool } => {
                gauge.try_acquire(pool, cost, now).map(|domain| (Duration::ZERO, Some(domain)))
            }
            Limiter::Epoch(share) => share.try_take(cost, now).map(|()| (Duration::ZERO, None)),
        };
        match outcome {
            Ok((wait, domain)) => {
                count_admitted(g, cost, !wait.is_zero());
                Ok((Permit { group, cost, domain, at: now }, wait))
            }
            Err(retry_after) => Err(self.refuse(g, cost, retry_after)),
        }
    }

    /// [`admit`](Self::admit) for its most common case, small enough to inline into the
    /// caller: a bucket group, a valid cost within the burst, no waiting. `None` when the
    /// case is another (the caller then calls `admit`).
    ///
    /// When the group's rate is high, a thread takes a small batch of units from the bucket
    /// at once (its stash, see [`stash_batch`]) and admits its next requests from it, with
    /// no clock read and no write to the shared bucket; it reads the clock again at least
    /// every [`STASH_HITS`] admissions, so reallocation keeps its pace.
    #[inline(always)]
    fn try_admit_bucket<'g>(&self, g: &'g Group, cost: f64) -> Option<Result<Permit<'g>, AcquireError>> {
        let Limiter::Bucket(bucket) = &g.limiter else { return None };
        if !(cost >= 0.0 && cost.is_finite() && cost <= g.burst_ceiling) {
            return None;
        }
        let priced = bucket.price(cost);
        if !stash_worthwhile(&priced) {
            // A rate too low for stashes: the shared bucket, as `admit` does.
            let now = self.clock.now();
            self.tick(now);
            return Some(match bucket.commit(priced, now) {
                Ok(()) => {
                    count_admitted(g, cost, false);
                    Ok(Permit { group: GroupRef::Borrowed(g), cost, domain: None, at: now })
                }
                Err(refusal) => Err(self.refuse(g, cost, self.retry_after(refusal))),
            });
        }
        let generation = bucket.generation();
        let hit = g.with_local(|tally, stash| {
            let hit = stash.hits_left > 0 && stash.generation == generation && stash.units >= cost;
            if hit {
                stash.units -= cost;
                stash.hits_left -= 1;
                count_in(tally, cost, false);
            }
            hit
        });
        if hit == Some(true) {
            return Some(Ok(Permit { group: GroupRef::Borrowed(g), cost, domain: None, at: Nanos(0) }));
        }
        Some(self.admit_bucket(g, bucket, cost, generation))
    }

    /// The rest of [`try_admit_bucket`](Self::try_admit_bucket): reads the clock, then admits
    /// from the stash or the bucket, topping the stash up when the rate allows.
    fn admit_bucket<'g>(
        &self,
        g: &'g Group,
        bucket: &Bucket,
        cost: f64,
        generation: u64,
    ) -> Result<Permit<'g>, AcquireError> {
        let now = self.clock.now();
        self.tick(now);
        let batch = stash_batch(bucket);
        let outcome = g.with_local(|tally, stash| {
            if stash.generation != generation {
                // Taken at another rate: give the units back rather than lose them.
                if stash.units > 0.0 {
                    bucket.refund(stash.units);
                }
                *stash = Stash { generation, ..Stash::default() };
            }
            stash.hits_left = STASH_HITS;
            let outcome = if stash.units >= cost {
                stash.units -= cost;
                Ok(())
            } else if batch >= cost && bucket.try_acquire(cost + batch, now).is_ok() {
                stash.units += batch;
                Ok(())
            } else {
                bucket.try_acquire(cost, now)
            };
            if outcome.is_ok() {
                count_in(tally, cost, false);
            }
            outcome
        });
        // A thread that is exiting has no stash: the bucket alone.
        let outcome = outcome.unwrap_or_else(|| {
            let outcome = bucket.try_acquire(cost, now);
            if outcome.is_ok() {
                count_admitted(g, cost, false);
            }
            outcome
        });
        match outcome {
            Ok(()) => Ok(Permit { group: GroupRef::Borrowed(g), cost, domain: None, at: now }),
            Err(refusal) => Err(self.refuse(g, cost, self.retry_after(refusal))),
        }
    }

    /// When a refused request is worth trying again.
    fn retry_after(&self, refusal: Refusal) -> Duration {
        match refusal {
            Refusal::Wait(d) => d,
            // No allowance now, or a burst too small for now: the next grant or reallocation
            // may change that.
            Refusal::Closed | Refusal::ExceedsBurst { .. } if self.remote.is_some() => REMOTE_RETRY,
            Refusal::Closed | Refusal::ExceedsBurst { .. } => self.node.realloc_interval,
        }
    }

    #[cold]
    fn refuse(&self, g: &Group, cost: f64, retry_after: Duration) -> AcquireError {
        if let Some(link) = &self.remote {
            link.nudge();
        }
        g.record(|t| {
            Tally::bump(&t.throttled, 1);
            Tally::bump(&t.throttled_micro, micros(cost));
        });
        AcquireError::Throttled { group: g.name.clone(), retry_after }
    }

    #[cold]
    fn admit_unthrottled<'g>(&self, group: GroupRef<'g>, cost: f64, now: Nanos) -> Permit<'g> {
        let domain = match &group.limiter {
            Limiter::Bucket(bucket) => {
                bucket.charge(cost, now);
                None
            }
            Limiter::Fcfs { group: gauge, pool } => Some(gauge.charge(pool, cost, now)),
            Limiter::Epoch(share) => {
                share.take(cost, now);
                None
            }
        };
        group.record(|t| {
            Tally::bump(&t.admitted, 1);
            Tally::bump(&t.admitted_micro, micros(cost));
        });
        Permit { group, cost, domain, at: now }
    }

    /// Books the earliest moment the cost fits and waits for it; when there is no such
    /// moment yet (an fcfs slot is full, a bucket is closed awaiting a grant), retries when
    /// told to. Gives up once `max_wait` would be exceeded.
    async fn acquire<'g>(
        &self,
        group: GroupRef<'g>,
        cost: f64,
        unthrottled: bool,
    ) -> Result<Permit<'g>, AcquireError> {
        let max_wait = self.node.max_wait;
        let group = match group {
            GroupRef::Borrowed(g) => g.self_arc(),
            GroupRef::Owned(g) => g,
        };
        let mut waited = Duration::ZERO;
        loop {
            let booking_window =
                if matches!(group.limiter, Limiter::Bucket(_)) { max_wait - waited } else { Duration::ZERO };
            match self.admit(GroupRef::Owned(group.clone()), cost, booking_window, unthrottled) {
                Ok((permit, wait)) => {
                    if !wait.is_zero() {
                        // If the caller gives up while waiting, the booked tokens go back.
                        let booking = Booking(Some(permit));
                        tokio::time::sleep(wait).await;
                        return Ok(booking.into_permit());
                    }
                    return Ok(permit);
                }
                Err(AcquireError::Throttled { retry_after, group: name }) => {
                    if waited + retry_after > max_wait {
                        return Err(AcquireError::Throttled { group: name, retry_after });
                    }
                    tokio::time::sleep(retry_after).await;
                    waited += retry_after;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A booked admission that is given back if the waiting caller is dropped.
struct Booking<'g>(Option<Permit<'g>>);

impl<'g> Booking<'g> {
    fn into_permit(mut self) -> Permit<'g> {
        self.0.take().expect("a booking holds its permit until taken")
    }
}

impl Drop for Booking<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.0.take() {
            // A cancelled wait consumed nothing.
            let _ = permit.settle(0.0);
        }
    }
}

impl Tollgate {
    /// A builder, to describe groups in code.
    ///
    /// ```
    /// use tollgate_client::Tollgate;
    /// use tollgate_core::settings::{GroupName, GroupSettings};
    ///
    /// let gate = Tollgate::builder()
    ///     .capacity(10_000.0)
    ///     .group(GroupName::new("search")?, GroupSettings::builder().reserved(2000.0).build()?)
    ///     .build()?;
    /// assert!(gate.try_acquire("search", 1.0).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// An embedded limiter for a parsed configuration, on the default clock.
    pub fn embedded(config: Config) -> Result<Tollgate, BuildError> {
        Builder::default().config(config).build()
    }

    /// An embedded limiter from the text of a settings file.
    pub fn from_toml(src: &str) -> Result<Tollgate, BuildError> {
        Self::embedded(Config::parse(src)?)
    }

    /// An embedded limiter from a settings file (see `docs/configuration.md`).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Tollgate, BuildError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| BuildError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        Self::from_toml(&src)
    }

    /// A client of `tollgate server` at `url` (such as `http://127.0.0.1:7460`): the same
    /// API, fed by the controller's grants. Must be called inside a tokio runtime, where the
    /// exchange task runs; it stops when the last handle is dropped. See [`crate::remote`].
    pub fn remote(url: &str, opts: RemoteOptions) -> Result<Tollgate, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let endpoint = tonic::transport::Channel::from_shared(url.to_string())
            .map_err(|e| BuildError::Remote { url: url.to_string(), reason: e.to_string() })?;
        let channel = endpoint.connect_timeout(opts.exchange_timeout).connect_lazy();
        let link = Arc::new(Link::new(&opts));
        let mut config = Config::default();
        config.node.max_wait = opts.max_wait;
        let gate = Builder { config, clock: None, remote: Some(link.clone()), shares: None }.build()?;
        let client = tollgate_proto::v1::admission_client::AdmissionClient::new(channel);
        runtime.spawn(crate::remote::run(Arc::downgrade(&gate.inner), link, client, opts.exchange_timeout));
        Ok(gate)
    }

    pub(crate) fn inner_arc(&self) -> &Arc<Inner> {
        &self.inner
    }

    pub(crate) fn set_store(&self, link: Arc<StoreLink>) {
        let _ = self.inner.store.set(link);
    }

    pub(crate) fn store_link(&self) -> Option<&Arc<StoreLink>> {
        self.inner.store.get()
    }

    /// A store-mode group's ramp value.
    pub(crate) fn ramp_value(&self, group: &GroupName) -> Option<f64> {
        match &self.inner.groups.load().get(group.as_str())?.limiter {
            Limiter::Epoch(share) => share.ramp_value(),
            _ => None,
        }
    }

    /// The link to the controller, in remote mode.
    pub fn remote_status(&self) -> Option<RemoteStatus> {
        self.inner.remote.as_ref().map(|l| l.status())
    }

    /// The same settings, started afresh on another clock (for tests and simulations).
    pub fn with_clock(&self, clock: impl Clock) -> Result<Tollgate, BuildError> {
        let inner = &self.inner;
        let mut config =
            Config { node: inner.node.clone(), cost_model: inner.cost_model, ..Config::default() };
        for (name, settings) in &inner.configured {
            config.groups.insert(GroupName::new(name).expect("configured names are valid"), settings.clone());
        }
        Builder::default().config(config).clock(clock).build()
    }

    /// A handle whose requests are always admitted, still counted against their group and
    /// the capacity: Couchbase's Unthrottled privilege, for operators and internal work.
    pub fn unthrottled(&self) -> Tollgate {
        Tollgate { inner: self.inner.clone(), unthrottled: true }
    }

    /// Whether this handle carries the unthrottled privilege.
    pub fn is_unthrottled(&self) -> bool {
        self.unthrottled
    }

    /// The cost model from the settings.
    pub fn cost_model(&self) -> &CostModel {
        &self.inner.cost_model
    }

    /// The node settings.
    pub fn node(&self) -> &NodeSettings {
        &self.inner.node
    }

    /// A handle on one group, resolved once: the fastest way to admit requests for it.
    /// Unknown groups get the `default` group's settings.
    pub fn group(&self, name: &str) -> Result<GroupHandle, AcquireError> {
        Ok(GroupHandle {
            inner: self.inner.clone(),
            group: self.inner.lookup(name)?,
            unthrottled: self.unthrottled,
        })
    }

    /// Admits `cost` units for `group` now, or refuses with the time to wait.
    pub fn try_acquire(&self, group: &str, cost: f64) -> Result<Permit<'static>, AcquireError> {
        let g = self.inner.lookup(group)?;
        self.inner.admit(GroupRef::Owned(g), cost, Duration::ZERO, self.unthrottled).map(|(p, _)| p)
    }

    /// Admits what `usage` is known to cost up front (see
    /// [`CostModel::upfront`](tollgate_core::cost::CostModel::upfront)); settle the permit
    /// with the full usage afterwards.
    pub fn try_acquire_usage(&self, group: &str, usage: &Usage) -> Result<Permit<'static>, AcquireError> {
        let cost = self.inner.cost_model.upfront(usage)?;
        self.try_acquire(group, cost)
    }

    /// Admits `cost` units for `group`, waiting up to the configured `max_wait`; then fails
    /// with [`AcquireError::Throttled`], carrying the group and the retry-after.
    pub async fn acquire(&self, group: &str, cost: f64) -> Result<Permit<'static>, AcquireError> {
        let g = self.inner.lookup(group)?;
        self.inner.acquire(GroupRef::Owned(g), cost, self.unthrottled).await
    }

    /// The counters of `group`, if it has been configured or used.
    pub fn stats(&self, group: &str) -> Option<GroupStats> {
        self.inner.groups.load().get(group).map(|g| stats_of(g))
    }

    /// Every tracked group's counters, by name.
    pub fn all_stats(&self) -> Vec<(String, GroupStats)> {
        let mut all: Vec<(String, GroupStats)> =
            self.inner.groups.load().iter().map(|(n, g)| (n.to_string(), stats_of(g))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

impl SharesOf for Inner {
    fn set_size(&self, group: &GroupName, size: u64) {
        if let Some(g) = self.groups.load().get(group.as_str())
            && let Limiter::Epoch(share) = &g.limiter
        {
            share.set_size(size);
        }
    }

    fn force(&self, group: &GroupName, forced: Option<Forced>) {
        if let Some(g) = self.groups.load().get(group.as_str())
            && let Limiter::Epoch(share) = &g.limiter
        {
            share.force(forced);
        }
    }
}

impl Fed for Inner {
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn usage(&self) -> Vec<(GroupName, Cumulative)> {
        let groups = self.groups.load();
        let mut list: Vec<&Arc<Group>> = groups.values().collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list.dedup_by(|a, b| Arc::ptr_eq(a, b));
        list.into_iter()
            .map(|g| {
                let t = g.counters.totals();
                let cum = Cumulative {
                    asked: units(t.admitted_micro + t.throttled_micro),
                    consumed: g.consumed(&t),
                    admitted: t.admitted,
                    throttled: t.throttled,
                    unmet: t.throttled + t.waited,
                };
                (g.name.clone(), cum)
            })
            .collect()
    }

    fn set_rate(&self, group: &GroupName, rate: f64, burst: f64, now: Nanos) {
        if let Some(g) = self.groups.load().get(group.as_str())
            && let Limiter::Bucket(bucket) = &g.limiter
        {
            bucket.set_rate(rate, burst, now);
            g.allowance.store(rate.to_bits(), Ordering::Relaxed);
        }
    }
}

fn stats_of(g: &Group) -> GroupStats {
    let t = g.counters.totals();
    GroupStats {
        admitted: t.admitted,
        throttled: t.throttled,
        admitted_units: units(t.admitted_micro),
        throttled_units: units(t.throttled_micro),
        consumed_units: g.consumed(&t),
        demand: f64::from_bits(g.demand.load(Ordering::Relaxed)),
        allowance: f64::from_bits(g.allowance.load(Ordering::Relaxed)),
    }
}

/// One group, resolved: admission without a name lookup. Cheap to clone.
///
/// ```
/// # use tollgate_client::Tollgate;
/// let gate = Tollgate::from_toml("[groups.api]\nlimit = 1000\n")?;
/// let api = gate.group("api")?;
/// let permit = api.try_acquire(1.0)?;
/// drop(permit);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct GroupHandle {
    inner: Arc<Inner>,
    group: Arc<Group>,
    unthrottled: bool,
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupHandle").field("group", &self.group.name).finish()
    }
}

impl GroupHandle {
    /// The group's name (`default` when this name fell back to the shared default state).
    pub fn name(&self) -> &str {
        self.group.name.as_str()
    }

    /// Admits `cost` units now, or refuses with the time to wait.
    ///
    /// The fastest way in: at rates of 320,000 units/s and more, most calls are served from
    /// a small batch this thread took from the group's bucket earlier (its stash), with no
    /// clock read and no shared write. The limit holds all the same; see "Stashes" in
    /// `docs/concepts.md`.
    #[inline(always)]
    pub fn try_acquire(&self, cost: f64) -> Result<Permit<'_>, AcquireError> {
        if !self.unthrottled
            && let Some(outcome) = self.inner.try_admit_bucket(&self.group, cost)
        {
            return outcome;
        }
        self.inner
            .admit(GroupRef::Borrowed(&self.group), cost, Duration::ZERO, self.unthrottled)
            .map(|(p, _)| p)
    }

    /// Admits `cost` units, waiting up to the configured `max_wait`.
    pub async fn acquire(&self, cost: f64) -> Result<Permit<'_>, AcquireError> {
        self.inner.acquire(GroupRef::Borrowed(&self.group), cost, self.unthrottled).await
    }

    /// The group's counters.
    pub fn stats(&self) -> GroupStats {
        stats_of(&self.group)
    }
}

/// Counts an admission in the group's per-thread tally.
#[inline(always)]
fn count_admitted(g: &Group, cost: f64, waited: bool) {
    g.record(|t| count_in(t, cost, waited));
}

/// Counts an admission in `tally`.
#[inline(always)]
fn count_in(tally: &Tally, cost: f64, waited: bool) {
    Tally::bump(&tally.admitted, 1);
    Tally::bump(&tally.admitted_micro, micros(cost));
    if waited {
        Tally::bump(&tally.waited, 1);
    }
}

/// How long a thread's stash lasts at the bucket's rate: 50 µs.
const STASH_SPAN_S: f64 = 50e-6;

/// The smallest stash worth taking, in units; below it every admission goes to the bucket.
const STASH_MIN_UNITS: f64 = 16.0;

/// Admissions from a stash between two clock reads.
const STASH_HITS: u32 = 64;

/// Whether [`stash_batch`] is at least [`STASH_MIN_UNITS`] at the rate and burst a cost was
/// priced at: the same test in multiplications only, cheap enough for every admission.
#[inline(always)]
fn stash_worthwhile(priced: &Priced) -> bool {
    let ns_per_unit = priced.ns_per_unit();
    ns_per_unit > 0.0
        && ns_per_unit * STASH_MIN_UNITS <= STASH_SPAN_S * 1e9
        && priced.tolerance_ns() as f64 >= 16.0 * STASH_MIN_UNITS * ns_per_unit
}

/// Units a thread takes ahead of use from `bucket`: 50 µs at its rate, at most a sixteenth
/// of its burst, and none when that is under [`STASH_MIN_UNITS`] or the rate is unlimited.
/// So a stash only exists where the rate is at least 320,000 units/s, and all the threads'
/// stashes together shift at most a few tens of microseconds of the rate in time.
fn stash_batch(bucket: &Bucket) -> f64 {
    let rate = bucket.rate();
    if !rate.is_finite() {
        return 0.0;
    }
    let batch = (rate * STASH_SPAN_S).min(bucket.burst() / 16.0);
    if batch >= STASH_MIN_UNITS { batch } else { 0.0 }
}
