//! The handles an application holds: [`Tollgate`] for the whole limiter and [`GroupHandle`] for
//! one group, resolved once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_model::class::RequestClass;
use tollgate_model::config::NodeSettings;
use tollgate_model::cost::{CostModel, Usage};
use tollgate_model::time::Clock as _;

use crate::error::AcquireError;
use crate::group::{Group, Limiter, units};
use crate::inner::{Inner, Mode};
use crate::permit::{GroupRef, Permit};
use crate::remote::RemoteStatus;
use crate::store::StoreStatus;

/// The admission handle: cheap to clone, shared by every task of a process.
///
/// ```
/// use tollgate_limiter::Tollgate;
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
/// # Ok::<(), tollgate_limiter::BuildError>(())
/// ```
#[derive(Clone)]
pub struct Tollgate {
    pub(crate) inner: Arc<Inner>,
    pub(crate) unthrottled: bool,
}

impl std::fmt::Debug for Tollgate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tollgate")
            .field("mode", &self.inner.mode.name())
            .field("groups", &self.inner.groups.len())
            .field("unthrottled", &self.unthrottled)
            .finish()
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
    /// Units admitted unthrottled (included in `admitted_units`).
    pub unthrottled_units: f64,
    /// Units consumed: admitted, corrected by settlements. What a group is billed on.
    pub consumed_units: f64,
    /// Demand as the engine last saw it, units/s asked (admitted or not).
    pub demand: f64,
    /// Current allowance, units/s (infinite when unlimited, 0 before a first grant).
    pub allowance: f64,
    /// Units waiting in `acquire` now.
    pub waiting_units: f64,
    /// Requests admitted and then dropped ([`Permit::dropped`](crate::Permit::dropped)).
    pub dropped: u64,
    /// Their units (returned to the group, or counted as consumed, by its `dropped` setting).
    pub dropped_units: f64,
    /// Units of debt still being paid back from the refill (see the `debt_repay_s` setting).
    pub debt_units: f64,
    /// What requests settled with their usage did, in detail (read and write request units,
    /// bytes, CPU, requests).
    pub detail: tollgate_model::cost::Consumption,
    /// Requests admitted in shadow mode that would have been refused (counted in `admitted`
    /// too, never in `throttled`).
    pub would_refuse: u64,
    /// Requests admitted and refused by class, critical, normal and sheddable (see
    /// [`RequestClass::ALL`]); they add up to `admitted` and `throttled`.
    pub by_class: [ClassCounts; 3],
    /// In a group with an in-flight quota (`max_in_flight`): the requests this process
    /// holds in flight now, and its share of the quota. `None` without one.
    pub in_flight: Option<InFlightStats>,
}

/// What a process holds of a group's in-flight quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlightStats {
    /// Requests holding a slot now (permits not yet dropped or settled).
    pub held: u32,
    /// The most this process may hold at once: the whole quota in embedded mode, its share
    /// from the controller in remote mode.
    pub share: u32,
}

/// One request class's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassCounts {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused.
    pub throttled: u64,
}

fn stats_of(g: &Group) -> GroupStats {
    let t = g.counters.totals();
    let allowance = g.allowance();
    GroupStats {
        admitted: t.admitted,
        throttled: t.throttled,
        admitted_units: units(t.admitted_micro),
        throttled_units: units(t.throttled_micro),
        unthrottled_units: units(t.unthrottled_micro),
        consumed_units: g.consumed(&t),
        demand: f64::from_bits(g.demand.load(Ordering::Relaxed)),
        allowance: if allowance.is_nan() { 0.0 } else { allowance },
        waiting_units: g.waiting(),
        dropped: g.dropped.load(Ordering::Relaxed),
        dropped_units: units(g.dropped_micro.load(Ordering::Relaxed)),
        debt_units: g.debt(g.clock.now()),
        detail: g.detail(),
        would_refuse: g.would_refuse.load(Ordering::Relaxed),
        by_class: by_class(g, t.admitted, t.throttled),
        in_flight: g.in_flight().map(|(held, share)| InFlightStats { held, share }),
    }
}

/// A group's counts by class: critical and sheddable as counted, normal the rest.
fn by_class(g: &Group, admitted: u64, throttled: u64) -> [ClassCounts; 3] {
    let read = |row: usize| ClassCounts {
        admitted: g.class_counts[row][0].load(Ordering::Relaxed),
        throttled: g.class_counts[row][1].load(Ordering::Relaxed),
    };
    let (critical, sheddable) = (read(0), read(1));
    let normal = ClassCounts {
        admitted: admitted.saturating_sub(critical.admitted + sheddable.admitted),
        throttled: throttled.saturating_sub(critical.throttled + sheddable.throttled),
    };
    [critical, normal, sheddable]
}

impl Tollgate {
    /// Which mode feeds this limiter: `embedded`, `remote` or `store`.
    pub fn mode(&self) -> &'static str {
        self.inner.mode.name()
    }

    /// The link to the controller, in remote mode.
    pub fn remote_status(&self) -> Option<RemoteStatus> {
        match &self.inner.mode {
            Mode::Remote(link) => Some(link.status()),
            _ => None,
        }
    }

    /// The store link's state, in store mode.
    pub fn store_status(&self) -> Option<StoreStatus> {
        match &self.inner.mode {
            Mode::Store(link) => Some(link.status(&self.inner.groups, self.inner.clock.now())),
            _ => None,
        }
    }

    /// In store mode, leaves the store: stops syncing and deregisters every group, keeping
    /// each resumable ramp's value for its TTL. Waits on Redis for at most a second. Does
    /// nothing in the other modes.
    pub async fn shutdown(&self) {
        if let Mode::Store(link) = &self.inner.mode {
            link.shutdown(&self.inner.groups).await;
        }
    }

    /// In remote mode, exchanges with the controller now and waits for its answer: what this
    /// process counted since its last exchange is reported (before a clean stop, say). Bound
    /// it with `tokio::time::timeout`: an unreachable controller never answers. Does nothing in
    /// the other modes.
    pub async fn report_now(&self) {
        if let Mode::Remote(link) = &self.inner.mode {
            let answered = link.granted.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            link.urgent();
            answered.await;
        }
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

    /// How requests are priced by [`try_acquire_usage`](Self::try_acquire_usage).
    pub fn cost_model(&self) -> &CostModel {
        &self.inner.cost_model
    }

    /// The node settings (an embedded limiter's; in the other modes, `max_wait` and the bound
    /// on tracked groups).
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
    ///
    /// The permit borrows the handle, as a [`GroupHandle`]'s does: a request admitted by name
    /// then touches no reference count (see [`Permit::into_owned`] for one that outlives it).
    pub fn try_acquire(&self, group: &str, cost: f64) -> Result<Permit<'_>, AcquireError> {
        // A group used before, as a handle would admit it.
        if !self.unthrottled
            && let Some(g) = self.inner.groups.known(group)
            && let Some(outcome) = self.inner.try_admit_bucket(g, cost)
        {
            return outcome;
        }
        self.try_acquire_class(group, cost, RequestClass::Normal)
    }

    /// [`try_acquire`](Self::try_acquire) for a request of `class`: critical work may empty
    /// the group's bucket, normal work leaves its `critical_reserve`, sheddable work is
    /// refused first (see [`tollgate_model::class`]).
    pub fn try_acquire_class(
        &self,
        group: &str,
        cost: f64,
        class: RequestClass,
    ) -> Result<Permit<'_>, AcquireError> {
        let g = self.inner.lookup(group)?;
        self.inner.admit(GroupRef::Owned(g), cost, Duration::ZERO, self.unthrottled, class).map(|(p, _)| p)
    }

    /// Admits what `usage` is known to cost up front (see
    /// [`CostModel::upfront`](tollgate_model::cost::CostModel::upfront)); settle the permit
    /// with the full usage afterwards.
    pub fn try_acquire_usage(&self, group: &str, usage: &Usage) -> Result<Permit<'_>, AcquireError> {
        let cost = self.inner.cost_model.upfront(usage)?;
        self.try_acquire(group, cost)
    }

    /// Admits `cost` units for `group`, waiting up to the configured `max_wait`; then fails
    /// with [`AcquireError::Throttled`], carrying the group and the retry-after.
    pub async fn acquire(&self, group: &str, cost: f64) -> Result<Permit<'static>, AcquireError> {
        let g = self.inner.lookup(group)?;
        self.inner.acquire(GroupRef::Owned(g), cost, self.unthrottled, RequestClass::Normal).await
    }

    /// The counters of `group`, if it has been configured or used.
    pub fn stats(&self, group: &str) -> Option<GroupStats> {
        self.inner.groups.get(group).map(|g| stats_of(&g))
    }

    /// Every tracked group's counters, by name.
    pub fn all_stats(&self) -> Vec<(String, GroupStats)> {
        self.inner.groups.named().into_iter().map(|(n, g)| (n, stats_of(&g))).collect()
    }
}

/// What is left of a group's quotas per window ([`GroupHandle::quota`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaLeft {
    /// Units this process may still admit of its allotment.
    pub held: f64,
    /// Units the controller had left beyond every process's allotment, at its last answer:
    /// this process asks for some at once when its own run out.
    pub beyond: f64,
    /// While a quota is spent: how long until its window starts afresh.
    pub reset_in: Option<Duration>,
    /// How long until the allotment's window ends (`None`: a quota over the group's life).
    pub window_ends_in: Option<Duration>,
}

impl QuotaLeft {
    /// The units left of the tightest quota that this process can see: its own allotment and
    /// what the controller had beyond every allotment.
    pub fn remaining(&self) -> f64 {
        self.held + self.beyond
    }

    /// Whether a request of `cost` refused now is worth the controller's next answer: this
    /// process's allotment is short of it while the controller has units left beyond it, or
    /// the allotment's window has ended (a refusal asked for more at once, in either case).
    pub fn asks_more(&self, cost: f64) -> bool {
        self.held < cost && (self.beyond > 0.0 || self.window_ends_in == Some(Duration::ZERO))
    }
}

/// One group, resolved: admission without a name lookup. Cheap to clone.
///
/// ```
/// # use tollgate_limiter::Tollgate;
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
        self.try_acquire_class(cost, RequestClass::Normal)
    }

    /// [`try_acquire`](Self::try_acquire) for a request of `class` (see
    /// [`tollgate_model::class`]).
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// use tollgate_limiter::core::class::RequestClass;
    ///
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 10\nburst = 10\n")?;
    /// let api = gate.group("api")?;
    /// for _ in 0..5 {
    ///     api.try_acquire(1.0)?; // half the bucket gone
    /// }
    /// // Sheddable work leaves half the bucket: refused now. Critical work goes on.
    /// assert!(api.try_acquire_class(1.0, RequestClass::Sheddable).is_err());
    /// assert!(api.try_acquire_class(1.0, RequestClass::Critical).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_class(&self, cost: f64, class: RequestClass) -> Result<Permit<'_>, AcquireError> {
        self.inner
            .admit(GroupRef::Borrowed(&self.group), cost, Duration::ZERO, self.unthrottled, class)
            .map(|(p, _)| p)
    }

    /// Admits `cost` units, waiting up to the configured `max_wait`.
    pub async fn acquire(&self, cost: f64) -> Result<Permit<'_>, AcquireError> {
        self.acquire_class(cost, RequestClass::Normal).await
    }

    /// [`acquire`](Self::acquire) for a request of `class`: it waits until its class may
    /// take from the bucket.
    pub async fn acquire_class(&self, cost: f64, class: RequestClass) -> Result<Permit<'_>, AcquireError> {
        self.inner.acquire(GroupRef::Borrowed(&self.group), cost, self.unthrottled, class).await
    }

    /// The group's counters.
    pub fn stats(&self) -> GroupStats {
        stats_of(&self.group)
    }

    /// The rate this process admits the group at now, units/s: [`stats`](Self::stats)'
    /// `allowance` (0 before the first grant in remote mode, infinite for a group with no
    /// limit), read alone. `stats` gathers every thread's counts under a lock the admitting
    /// threads take too; this is one load, cheap enough to read at each decision.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 100\n")?;
    /// let api = gate.group("api")?;
    /// assert_eq!(api.allowance(), 100.0);
    /// assert_eq!(api.allowance(), api.stats().allowance);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allowance(&self) -> f64 {
        let allowance = self.group.allowance();
        if allowance.is_nan() { 0.0 } else { allowance }
    }

    /// Whether the group has what it admits by: always in the embedded and store modes; in
    /// remote mode once the controller's first grant for it has come (until then it admits
    /// nothing, and the grant is asked for at once).
    pub fn has_grant(&self) -> bool {
        !self.group.allowance().is_nan()
    }

    /// Waits until the group has what it admits by ([`has_grant`](Self::has_grant)): at
    /// once in the embedded and store modes, and in remote mode once one holds; else until
    /// the exchange that brings the controller's first grant for it (asked for as soon as the
    /// group appears), or safe mode's policy, applies. Bound it with `tokio::time::timeout`.
    pub async fn wait_for_grant(&self) {
        if let Mode::Remote(link) = &self.inner.mode {
            link.until_granted(&self.group).await;
        }
    }

    /// Units that could be admitted at once now: the bucket's tokens, or what is left of this
    /// process's share of the epoch (store mode); infinite for a group with no limit.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// # use tollgate_model::time::ManualClock;
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 100\n")?.with_clock(ManualClock::new())?;
    /// let api = gate.group("api")?;
    /// api.try_acquire(30.0)?;
    /// assert_eq!(api.available(), 70.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self) -> f64 {
        if !self.has_grant() {
            return 0.0;
        }
        let now = self.group.clock.now();
        match self.group.limiter() {
            Limiter::Bucket(bucket) => bucket.available(now),
            Limiter::Epoch(share) => share.left(now),
        }
    }

    /// What is left of the group's quotas per window, as this process sees them (`None`: the
    /// group has none, or no allotment came yet). A quota is a count: the controller hands
    /// each process an allotment of the units left in the window, and never more in all than
    /// is left (see docs/concepts.md, "Quotas per window").
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// # use tollgate_model::time::ManualClock;
    /// let gate = Tollgate::from_toml("[groups.api]\nquotas = { minute = 5 }\n")?.with_clock(ManualClock::new())?;
    /// let api = gate.group("api")?;
    /// let admitted = (0..20).filter(|_| api.try_acquire(1.0).is_ok()).count();
    /// assert_eq!(admitted, 5); // never more than the quota, however fast it is asked
    /// let left = api.quota().unwrap();
    /// assert_eq!(left.remaining(), 0.0);
    /// assert!(left.reset_in.is_some()); // the next minute
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quota(&self) -> Option<QuotaLeft> {
        let now = self.group.clock.now();
        let (held, beyond, reset_in) = self.group.allotment(now)?;
        Some(QuotaLeft {
            held,
            beyond,
            reset_in,
            window_ends_in: self.group.allotment_ends().map(|e| e.since(now)),
        })
    }

    /// Waits for the controller's next answer (remote mode), or for the next take from the
    /// store (store mode; asked for at once when the group holds none of its quota and the
    /// store has some left); at once in the others. After a refusal whose
    /// [`quota`](Self::quota) shows units left beyond this process's allotment, the answer
    /// brings more. Bound it with `tokio::time::timeout`.
    pub async fn wait_for_answer(&self) {
        match &self.inner.mode {
            Mode::Remote(link) => link.answered().await,
            Mode::Store(link) if !link.is_replicas() => link.quotas.answered(&self.group).await,
            _ => {}
        }
    }

    /// Charges `units` for work already done, whose cost was known only once it ended (the
    /// tokens an answer used, the bytes a response sent): never refused. What the tokens hold
    /// is taken at once; the rest is debt, paid back from the refill over the group's repay
    /// period, as a dearer [`Permit::settle`] is. The units count as asked and consumed.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// # use tollgate_model::time::ManualClock;
    /// let gate = Tollgate::from_toml("[groups.llm]\nlimit = 100\n")?.with_clock(ManualClock::new())?;
    /// let llm = gate.group("llm")?;
    /// llm.charge(150.0)?; // more than the bucket holds: the rest is debt
    /// assert!(llm.try_acquire(1.0).is_err());
    /// assert_eq!(llm.stats().consumed_units, 150.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, units: f64) -> Result<(), tollgate_model::cost::CostError> {
        let units = tollgate_model::cost::check_cost("units", units)?;
        let g = &*self.group;
        let now = g.clock.now();
        match g.limiter() {
            Limiter::Bucket(bucket) => g.charge(bucket, units, now),
            Limiter::Epoch(share) => share.take(units, now),
        }
        g.record_shared(|t| {
            t.admitted.fetch_add(1, Ordering::Relaxed);
            t.admitted_micro.fetch_add(crate::group::micros(units), Ordering::Relaxed);
        });
        Ok(())
    }

    /// Gives back `units` charged before (a deposit: work refunded, a charge that was too
    /// high): the tokens grow by them, never past the burst, and they no longer count as
    /// consumed.
    pub fn refund(&self, units: f64) -> Result<(), tollgate_model::cost::CostError> {
        let units = tollgate_model::cost::check_cost("units", units)?;
        let g = &*self.group;
        let now = g.clock.now();
        match g.limiter() {
            Limiter::Bucket(bucket) => bucket.refund(units),
            Limiter::Epoch(share) => share.deposit(units, now, now),
        }
        g.settled_down_micro.fetch_add(crate::group::micros(units), Ordering::Relaxed);
        Ok(())
    }

    /// Says how many units of work the application has queued for this group, waiting for
    /// admission (its own queue, outside Tollgate): they count as demand, as work waiting in
    /// [`acquire`](Self::acquire) does. A gauge: each call replaces the last value.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 10\n")?;
    /// let api = gate.group("api")?;
    /// api.set_queued(250.0); // 250 units wait in the application's own queue
    /// assert_eq!(api.stats().waiting_units, 250.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_queued(&self, units: f64) {
        let units = if units.is_finite() { units.max(0.0) } else { 0.0 };
        self.group.queued_micro.store(crate::group::micros(units), Ordering::Relaxed);
    }
}
