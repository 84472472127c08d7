//! Admission: admit now, book a moment within `max_wait`, or refuse with a retry-after.
//!
//! **The paths a call takes**, fastest first, and why each exists:
//!
//! | path | taken when | why it exists |
//! | --- | --- | --- |
//! | stash hit ([`Inner::try_admit_bucket`]) | a bucket group at a high rate, this thread holding enough units from its last batch, and a clock read not due | at millions of admissions a second the shared bucket's compare-and-swap and the clock read are the cost: a thread takes a small batch at once and spends it with no shared write and no clock (see "Stashes" in docs/concepts.md) |
//! | stash refused (same) | the stash is empty and the bucket cannot hold the cost | a throttled thread is refused with one clock read and one look at the bucket, with no call out of line |
//! | low-rate bucket (same) | a rate too low for batches to be worth it | one price, one clock read, one compare-and-swap on the shared bucket |
//! | `admit_bucket` / `admit_bucket_empty` | the stash was taken at another rate, or is due a clock read, or is empty and the bucket holds the cost | out of line, so the hot path stays small enough to inline: refills the stash, giving back units taken at an old rate |
//! | `admit_shared` | the thread's cache of groups passed this group by (it takes turns among more groups than it keeps) | counting in the shared tally rather than making and retiring a cache entry at every call |
//! | [`Inner::admit`] | anything else: a cost near or above the burst ceiling, an epoch group (store mode), unthrottled work, a booking within `max_wait` | the general case, exact for every limiter |
//! | [`Inner::acquire`] | `acquire().await` | books within `max_wait` and sleeps, or waits for a new group's first grant, retrying `admit` |
//!
//! Every refusal goes through `refuse` (or `refuse_wait`, for the common wait within the
//! burst), which counts it, tells the mode (a remote client asks for an exchange), checks the
//! group's debt, and says why: a wait, or the controller's rejection of the client.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_model::bucket::{Bucket, Priced, Refusal};
use tollgate_model::class::RequestClass;
use tollgate_model::cost::check_cost;
use tollgate_model::time::{Clock, Nanos};

use crate::error::AcquireError;
use crate::group::{Allotted, Group, Limiter, Slot, micros};
use crate::inner::Inner;
use crate::permit::{GroupRef, Permit};
use crate::tally::{MICROS_PER_UNIT, Stash, Tally};

/// The retry-after of a request refused for want of an in-flight slot: a slot comes back
/// when a request finishes, which no clock foretells (`acquire` waits for one instead).
const IN_FLIGHT_RETRY: Duration = Duration::from_millis(5);

impl Inner {
    /// Admits `cost` for `group` now, or books it within `max_wait`: returns the permit and
    /// how long to wait before going ahead.
    #[inline]
    pub(crate) fn admit<'g>(
        &self,
        group: GroupRef<'g>,
        cost: f64,
        max_wait: Duration,
        unthrottled: bool,
        class: RequestClass,
    ) -> Result<(Permit<'g>, Duration), AcquireError> {
        if !(cost >= 0.0 && cost.is_finite()) {
            return Err(AcquireError::InvalidCost(check_cost("cost", cost).expect_err("cost is invalid")));
        }
        let g = &*group;
        // In shadow mode nothing waits: work is admitted now, or counted as a would-be
        // refusal and admitted all the same.
        let shadow = g.is_shadow();
        // The share of the bucket this class leaves: a request with a floor is admitted now
        // or refused (its retry comes back here), never booked ahead.
        let floor = g.floor(class);
        let max_wait = if shadow || floor > 0.0 { Duration::ZERO } else { max_wait };
        // Price before reading the clock: the two are independent and overlap in the CPU.
        let priced = match g.limiter() {
            Limiter::Bucket(bucket) if max_wait.is_zero() => {
                Some(bucket.price(cost).keeping(floor * bucket.burst()))
            }
            _ => None,
        };
        let now = self.clock.now();
        self.tick(now);
        if unthrottled && self.mode.unthrottled_allowed() {
            g.count_class(class, true);
            return Ok((self.admit_unthrottled(group, cost, now), Duration::ZERO));
        }
        if g.is_open() {
            g.count_class(class, true);
            return Ok((self.admit_open(group, cost, now), Duration::ZERO));
        }
        if cost > g.burst_ceiling && shadow {
            g.count_class(class, true);
            return Ok((self.admit_shadow(group, cost, now, false), Duration::ZERO));
        }
        if cost > g.burst_ceiling {
            g.count_class(class, false);
            return Err(AcquireError::NeverAdmissible {
                group: g.name.clone(),
                cost,
                burst: g.burst_ceiling,
            });
        }
        // An in-flight slot first: cheap to give back if the limiter then refuses.
        let slot = match g.take_slot() {
            Slot::Full if shadow => {
                g.count_class(class, true);
                return Ok((self.admit_shadow(group, cost, now, false), Duration::ZERO));
            }
            Slot::Full => {
                g.count_class(class, false);
                return Err(self.refuse(g, cost, IN_FLIGHT_RETRY, None, now));
            }
            slot => slot == Slot::Taken,
        };
        // Then the allotment of the group's quotas (a count per window, never overrun).
        let mut taken = g.take_allotment(cost, now);
        if !shadow && matches!(taken, Allotted::Short { ask: true, .. }) && self.allotment_short(g, now) {
            // Taken already (replicas mode): a second try, once.
            taken = g.take_allotment(cost, now);
        }
        let allotted = match taken {
            Allotted::Unlimited => false,
            Allotted::Taken => true,
            Allotted::Short { .. } if shadow => {
                g.count_class(class, true);
                return Ok((self.admit_shadow(group, cost, now, slot), Duration::ZERO));
            }
            Allotted::Short { retry, ask } => {
                if slot {
                    g.give_slot();
                }
                // Asked for at once (above): worth trying again once the mode has answered.
                let retry = if ask { self.retry_after(Refusal::Closed) } else { retry };
                g.count_class(class, false);
                return Err(self.refuse(g, cost, retry, None, now));
            }
        };
        let outcome = match g.limiter() {
            Limiter::Bucket(bucket) if let Some(priced) = priced => bucket
                .commit(priced, now)
                .map(|()| Duration::ZERO)
                .map_err(|r| (self.retry_after(r), Some(r))),
            Limiter::Bucket(bucket) => {
                bucket.reserve(cost, now, max_wait).map_err(|r| (self.retry_after(r), Some(r)))
            }
            Limiter::Epoch(share) => {
                share.try_take_keeping(cost, floor, now).map(|()| Duration::ZERO).map_err(|d| (d, None))
            }
        };
        g.count_class(class, outcome.is_ok() || shadow);
        match outcome {
            Ok(wait) => {
                count_admitted(g, cost, !wait.is_zero());
                Ok((Permit { group, cost, at: now, slot }, wait))
            }
            Err(_) if shadow => Ok((self.admit_shadow(group, cost, now, slot), Duration::ZERO)),
            Err((retry_after, refusal)) => {
                if slot {
                    g.give_slot();
                }
                if allotted {
                    g.give_back_allotment(cost);
                }
                Err(self.refuse(g, cost, retry_after, refusal, now))
            }
        }
    }

    /// Admits work the group's limiter refused, in shadow mode: counted as admitted (and
    /// consumed), and as a would-be refusal. Its cost is not taken from the limiter, which
    /// goes on deciding as if it had been refused, so `would_refuse` counts what the limit
    /// would have refused.
    /// A request refused an in-flight slot is admitted without one.
    #[cold]
    fn admit_shadow<'g>(&self, group: GroupRef<'g>, cost: f64, now: Nanos, slot: bool) -> Permit<'g> {
        group.would_refuse.fetch_add(1, Ordering::Relaxed);
        count_admitted(&group, cost, false);
        Permit { group, cost, at: now, slot }
    }

    /// Admits work with throttling off (the process's settings): counted as admitted, and
    /// taken from a store-mode share so its pool sees the use.
    #[cold]
    fn admit_open<'g>(&self, group: GroupRef<'g>, cost: f64, now: Nanos) -> Permit<'g> {
        if let Limiter::Epoch(share) = group.limiter() {
            share.take(cost, now);
        }
        count_admitted(&group, cost, false);
        Permit { group, cost, at: now, slot: false }
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
    pub(crate) fn try_admit_bucket<'g>(
        &self,
        g: &'g Group,
        cost: f64,
    ) -> Option<Result<Permit<'g>, AcquireError>> {
        let bucket = g.quick_bucket()?;
        // Two comparisons (NaN fails both): the ceiling is finite, so an infinite cost too.
        // A cost just above the rounded ceiling is checked exactly by `admit`.
        if !(cost >= 0.0 && cost <= f64::from(g.quick_ceiling)) {
            return None;
        }
        let priced = bucket.price(cost);
        if !stash_worthwhile(&priced) {
            // A rate too low for stashes: the shared bucket, as `admit` does.
            let now = self.now_for(&priced);
            self.tick(now);
            return Some(match bucket.commit(priced, now) {
                Ok(()) => {
                    count_admitted(g, cost, false);
                    Ok(Permit { group: GroupRef::Borrowed(g), cost, at: now, slot: false })
                }
                Err(Refusal::Wait(wait)) => Err(self.refuse_wait(g, cost, wait, now)),
                Err(refusal) => Err(self.refuse(g, cost, self.retry_after(refusal), Some(refusal), now)),
            });
        }
        let generation = bucket.generation();
        let step = g.with_local(|tally, stash| {
            if stash.generation != generation {
                return StashStep::Other;
            }
            if stash.units >= cost {
                if stash.hits_left > 0 {
                    stash.units -= cost;
                    stash.hits_left -= 1;
                    count_in(tally, cost, false);
                    return StashStep::Hit;
                }
                return StashStep::Other;
            }
            // Empty: while the bucket cannot hold the cost, refused here, one clock read and
            // one look at the bucket, the same look (and the same answer) as the refill's,
            // without the call out of line that refills. When the engine's tick is due, out
            // of line: the tick runs before the bucket is asked, as everywhere else.
            let now = self.now_for(&priced);
            if !self.tick_due(now)
                && let Some(wait) = bucket.wait_within_burst(&priced, now)
            {
                count_refusal(tally, cost);
                return StashStep::Refused(now, wait);
            }
            StashStep::Empty(if stash.batch >= cost { stash.batch_ns } else { 0 })
        });
        // Past the stash, the cost alone is priced again out of line: a price passed on would
        // be stored to memory on every call, refusals at low rates included, for this call's
        // sake.
        Some(match step {
            Some(StashStep::Hit) => {
                Ok(Permit { group: GroupRef::Borrowed(g), cost, at: Nanos(0), slot: false })
            }
            Some(StashStep::Refused(now, wait)) => Err(self.refuse_wait_counted(g, cost, wait, now)),
            // Taken at another rate, or due for a clock read: the rest.
            Some(StashStep::Other) => self.admit_bucket(g, bucket, cost, generation),
            Some(StashStep::Empty(extra_ns)) => self.admit_bucket_empty(bucket, g, cost, extra_ns),
            // The thread's cache passed the group by (it takes turns among more groups than
            // it keeps), or it is exiting.
            None => self.admit_shared(g, bucket, cost),
        })
    }

    /// The cost priced at the bucket's rate, and the time to admit it by (the engine's tick
    /// run first if it is due): past a thread's stash, which admits without either.
    #[inline(always)]
    fn clock_for(&self, bucket: &Bucket, cost: f64) -> (Priced, Nanos) {
        let priced = bucket.price(cost);
        let now = self.now_for(&priced);
        self.tick(now);
        (priced, now)
    }

    /// [`try_admit_bucket`](Self::try_admit_bucket) with the thread's stash empty: the cost
    /// and a batch (`extra_ns` of refill, 0 for none) from the bucket at once when it holds
    /// both, and when it holds neither (a throttled thread's usual case) a refusal as lean as
    /// at low rates, one look at the bucket.
    #[inline(never)]
    fn admit_bucket_empty<'g>(
        &self,
        bucket: &Bucket,
        g: &'g Group,
        cost: f64,
        extra_ns: u64,
    ) -> Result<Permit<'g>, AcquireError> {
        let (priced, now) = self.clock_for(bucket, cost);
        match bucket.commit_with_extra(priced, extra_ns, now) {
            Ok(took) => {
                stash_refilled(g, bucket, cost, took);
                Ok(Permit { group: GroupRef::Borrowed(g), cost, at: now, slot: false })
            }
            Err(Refusal::Wait(wait)) => Err(self.refuse_wait(g, cost, wait, now)),
            Err(refusal) => Err(self.refuse(g, cost, self.retry_after(refusal), Some(refusal), now)),
        }
    }

    /// [`try_admit_bucket`](Self::try_admit_bucket) for a group this thread's cache passed
    /// by: the shared bucket, counted in the shared tally. Looking in the cache again, to
    /// count there, would take the group in at this second look (see `tally::record`), and
    /// a thread taking turns among more groups than it keeps would make and retire an
    /// entry at every call.
    #[inline(never)]
    fn admit_shared<'g>(&self, g: &'g Group, bucket: &Bucket, cost: f64) -> Result<Permit<'g>, AcquireError> {
        let (priced, now) = self.clock_for(bucket, cost);
        match bucket.commit(priced, now) {
            Ok(()) => {
                g.record_shared(|t| count_in(t, cost, false));
                Ok(Permit { group: GroupRef::Borrowed(g), cost, at: now, slot: false })
            }
            Err(refusal) => {
                g.record_shared(|t| count_refusal(t, cost));
                self.refused(g, cost, Some(refusal));
                g.check_debt(now);
                if refusal == Refusal::Closed
                    && let Some(rejected) = self.rejection(g)
                {
                    return Err(rejected);
                }
                Err(AcquireError::Throttled { group: g.name.clone(), retry_after: self.retry_after(refusal) })
            }
        }
    }

    /// The rest of [`try_admit_bucket`](Self::try_admit_bucket) for a stash taken at another
    /// rate or due for a clock read: reads the clock, then admits from the stash or the
    /// bucket, topping the stash up when the rate allows.
    #[inline(never)]
    fn admit_bucket<'g>(
        &self,
        g: &'g Group,
        bucket: &Bucket,
        cost: f64,
        generation: u64,
    ) -> Result<Permit<'g>, AcquireError> {
        let (priced, now) = self.clock_for(bucket, cost);
        let outcome = g.with_local(|tally, stash| {
            if stash.generation != generation {
                // Taken at another rate: give the units back rather than lose them.
                if stash.units > 0.0 {
                    bucket.refund(stash.units);
                }
                let batch = stash_batch(&priced);
                let batch_ns = priced.nanos_for(batch);
                *stash = Stash { generation, batch, batch_ns, ..Stash::default() };
            }
            stash.hits_left = STASH_HITS;
            let outcome = if stash.units >= cost {
                stash.units -= cost;
                Ok(())
            } else {
                // The cost, and a batch for the next ones if the bucket holds that too, in
                // one step: a throttled thread's refusal costs one look at the bucket.
                let extra_ns = if stash.batch >= cost { stash.batch_ns } else { 0 };
                bucket.commit_with_extra(priced, extra_ns, now).map(|took| {
                    if took {
                        stash.units += stash.batch;
                    }
                })
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
            Ok(()) => Ok(Permit { group: GroupRef::Borrowed(g), cost, at: now, slot: false }),
            Err(Refusal::Wait(wait)) => Err(self.refuse_wait(g, cost, wait, now)),
            Err(refusal) => Err(self.refuse(g, cost, self.retry_after(refusal), Some(refusal), now)),
        }
    }

    /// [`refuse`](Self::refuse) for the common refusal, a wait within the burst: the retry
    /// is the wait, and only a remote client's mode hears of it.
    #[inline(always)]
    fn refuse_wait(&self, g: &Group, cost: f64, wait: Duration, now: Nanos) -> AcquireError {
        g.record(move |t| count_refusal(t, cost));
        self.refuse_wait_counted(g, cost, wait, now)
    }

    /// [`refuse_wait`](Self::refuse_wait) for a refusal already counted.
    #[inline(always)]
    fn refuse_wait_counted(&self, g: &Group, cost: f64, wait: Duration, now: Nanos) -> AcquireError {
        if matches!(self.mode, crate::inner::Mode::Remote(_)) {
            self.refused(g, cost, Some(Refusal::Wait(wait)));
        }
        g.check_debt(now);
        AcquireError::Throttled { group: g.name.clone(), retry_after: wait }
    }

    /// Counts a refusal at `now` (the time the decision was made: no second clock read) and
    /// makes its error. Lean, as a throttled tenant's calls are mostly refusals: the mode
    /// hears of it only when it acts on it. Inlined: the error is built where it is returned,
    /// not built in a callee and copied (a copy the processor stalls on).
    #[inline(always)]
    fn refuse(
        &self,
        g: &Group,
        cost: f64,
        retry_after: Duration,
        refusal: Option<Refusal>,
        now: Nanos,
    ) -> AcquireError {
        self.refused(g, cost, refusal);
        g.check_debt(now);
        g.record(move |t| count_refusal(t, cost));
        if refusal == Some(Refusal::Closed)
            && let Some(rejected) = self.rejection(g)
        {
            return rejected;
        }
        AcquireError::Throttled { group: g.name.clone(), retry_after }
    }

    /// For a closed bucket: the controller's rejection of this client, while it holds (its
    /// buckets are closed then). Out of line: the common refusal never comes here.
    #[cold]
    #[inline(never)]
    fn rejection(&self, g: &Group) -> Option<AcquireError> {
        let crate::inner::Mode::Remote(link) = &self.mode else { return None };
        link.rejection().map(|_| AcquireError::Rejected { group: g.name.clone() })
    }

    #[cold]
    pub(crate) fn admit_unthrottled<'g>(&self, group: GroupRef<'g>, cost: f64, now: Nanos) -> Permit<'g> {
        match group.limiter() {
            Limiter::Bucket(bucket) => bucket.charge(cost, now),
            Limiter::Epoch(share) => share.take(cost, now),
        }
        group.record(|t| {
            count_in(t, cost, false);
            Tally::bump(&t.unthrottled_micro, micros(cost));
        });
        Permit { group, cost, at: now, slot: false }
    }

    /// Books the earliest moment the cost fits and waits for it; when there is no such
    /// moment yet (an epoch's share is spent, a bucket is closed awaiting a grant), retries
    /// when told to. Gives up once `max_wait` would be exceeded. What waits counts as the
    /// group's waiting work, which the engine adds to its demand.
    pub(crate) async fn acquire<'g>(
        &self,
        group: GroupRef<'g>,
        cost: f64,
        unthrottled: bool,
        class: RequestClass,
    ) -> Result<Permit<'g>, AcquireError> {
        let max_wait = self.node.max_wait;
        let group = match group {
            GroupRef::Borrowed(g) => g.self_arc(),
            GroupRef::Owned(g) => g,
        };
        let _waiting = Waiting::new(&group, cost);
        let mut waited = Duration::ZERO;
        loop {
            let booking_window = if matches!(group.limiter(), Limiter::Bucket(_)) {
                max_wait - waited
            } else {
                Duration::ZERO
            };
            match self.admit(GroupRef::Owned(group.clone()), cost, booking_window, unthrottled, class) {
                Ok((permit, wait)) => {
                    if !wait.is_zero() {
                        // If the caller gives up while waiting, the booked tokens go back.
                        let booking = Booking(Some(permit));
                        tokio::time::sleep(wait).await;
                        return Ok(booking.into_permit());
                    }
                    return Ok(permit);
                }
                Err(AcquireError::Throttled { retry_after, group: name }) if group.slots_full() => {
                    // Every slot of the share is held: on as soon as one comes back (or the
                    // share grows), within what is left of `max_wait`.
                    let left = max_wait.saturating_sub(waited);
                    let freed = group.slot_freed();
                    if left.is_zero() {
                        return Err(AcquireError::Throttled { group: name, retry_after });
                    }
                    if !group.slots_full() {
                        continue;
                    }
                    let start = self.clock.now();
                    if tokio::time::timeout(left, freed).await.is_err() {
                        return Err(AcquireError::Throttled { group: name, retry_after });
                    }
                    waited += self.clock.now().since(start);
                }
                Err(AcquireError::Throttled { retry_after, group: name }) => {
                    if waited + retry_after > max_wait {
                        return Err(AcquireError::Throttled { group: name, retry_after });
                    }
                    self.wait_to_retry(&group, cost, retry_after).await;
                    waited += retry_after;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits up to `retry_after` for `group` to be worth asking again for `cost`: a new group
    /// until its first grant comes, an allotment run out (more asked for) until the next
    /// answer, anything else the whole time.
    async fn wait_to_retry(&self, group: &Group, cost: f64, retry_after: Duration) {
        match &self.mode {
            crate::inner::Mode::Remote(link) if group.allowance().is_nan() => {
                let _ = tokio::time::timeout(retry_after, link.until_granted(group)).await;
            }
            crate::inner::Mode::Remote(link)
                if group
                    .allotment(self.clock.now())
                    .is_some_and(|(mine, left, _)| mine < cost && left > 0.0) =>
            {
                let _ = tokio::time::timeout(retry_after, link.answered()).await;
            }
            _ => tokio::time::sleep(retry_after).await,
        }
    }
}

/// Counts a group's units waiting in `acquire` while it lives.
struct Waiting {
    group: Arc<Group>,
    micros: u64,
}

impl Waiting {
    fn new(group: &Arc<Group>, cost: f64) -> Self {
        let micros = micros(cost);
        group.waiting_micro.fetch_add(micros, Ordering::Relaxed);
        Waiting { group: group.clone(), micros }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.group.waiting_micro.fetch_sub(self.micros, Ordering::Relaxed);
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

/// What the stash's check in [`Inner::try_admit_bucket`] answers.
enum StashStep {
    /// Admitted from the stash.
    Hit,
    /// Refused (and counted) at this time, for this long: the bucket cannot hold the cost
    /// yet.
    Refused(Nanos, Duration),
    /// Empty: the bucket is asked for the cost, with this many nanoseconds of refill (the
    /// batch's, or 0 when the batch does not cover the cost).
    Empty(u64),
    /// Taken at another rate, or due for a clock read.
    Other,
}

/// Counts an admission whose cost came from the bucket, and puts the batch taken with it
/// (`took`) in the thread's stash. Out of line: once a batch at most.
#[inline(never)]
fn stash_refilled(g: &Group, bucket: &Bucket, cost: f64, took: bool) {
    let counted = g.with_local(|tally, stash| {
        if took {
            stash.units += stash.batch;
        }
        stash.hits_left = STASH_HITS;
        count_in(tally, cost, false);
    });
    if counted.is_none() {
        // The thread's stash is gone (it is exiting): the batch goes back to the bucket.
        if took {
            bucket.refund(stash_batch(&bucket.price(cost)));
        }
        count_admitted(g, cost, false);
    }
}

/// Counts an admission in the group's per-thread tally.
#[inline(always)]
fn count_admitted(g: &Group, cost: f64, waited: bool) {
    g.record(move |t| count_in(t, cost, waited));
}

/// Counts a refusal of `cost` in a tally: the request, and its millionths beyond one unit (see
/// [`Tally`]), so that a cost of one is a single add.
#[inline(always)]
fn count_refusal(tally: &Tally, cost: f64) {
    Tally::bump(&tally.throttled, 1);
    if cost != 1.0 {
        Tally::bump(&tally.throttled_micro, micros(cost).wrapping_sub(MICROS_PER_UNIT));
    }
}

/// Counts an admission in `tally`.
#[inline(always)]
fn count_in(tally: &Tally, cost: f64, waited: bool) {
    // Both adds, unconditionally: a branch on the cost here made a stash's admission 2 ns
    // slower (AMD EPYC), where a refusal gains from it.
    let micros = micros(cost);
    Tally::bump(&tally.admitted, 1);
    Tally::bump(&tally.admitted_micro, micros);
    // A high-water mark: written only by a request larger than any since the last exchange.
    if micros > tally.largest_micro.load(Ordering::Relaxed) {
        tally.largest_micro.store(micros, Ordering::Relaxed);
    }
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
    // The rate test first, one comparison (`ns × 16 ≤ 50,000` exactly, 16 being a power of
    // two): below 320,000 units/s, a closed bucket (infinite) or NaN, it alone decides.
    let fast_enough = ns_per_unit <= STASH_SPAN_S * 1e9 / STASH_MIN_UNITS;
    if !fast_enough {
        return false;
    }
    ns_per_unit > 0.0 && priced.tolerance_ns() as f64 >= 16.0 * STASH_MIN_UNITS * ns_per_unit
}

/// Units a thread takes ahead of use from a bucket, at the rate and burst a cost was priced
/// at: 50 µs at its rate, at most a sixteenth of its burst, and none when that is under
/// [`STASH_MIN_UNITS`] or the rate is unlimited. So a stash only exists where the rate is at
/// least 320,000 units/s, and all the threads' stashes together shift at most a few tens of
/// microseconds of the rate in time.
fn stash_batch(priced: &Priced) -> f64 {
    let ns_per_unit = priced.ns_per_unit();
    if !(ns_per_unit > 0.0 && ns_per_unit.is_finite()) {
        return 0.0;
    }
    let span_ns = (STASH_SPAN_S * 1e9).min(priced.tolerance_ns() as f64 / 16.0);
    let batch = span_ns / ns_per_unit;
    if batch >= STASH_MIN_UNITS { batch } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use tollgate_model::time::ManualClock;

    use crate::Tollgate;
    use crate::tally::LOCAL_GROUPS_MAX;

    #[test]
    fn a_thread_taking_turns_among_many_fast_groups_by_name_keeps_its_cache_as_it_was() {
        // 1,000 groups fast enough for stashes, by name in turn on one thread: its cache
        // fills with the first 32, then passes the others by (counting them in their shared
        // tallies; the doorkeeper takes in only a group missed again before another group
        // took its slot, rare among so many). A second look at a group passed by, within
        // the same admission, would take it in at every call, retiring another: the cached
        // groups would be the last ones called.
        let groups = 1000;
        let toml: String = (0..groups).map(|i| format!("[groups.g{i:04}]\nlimit = 1000000\n")).collect();
        let gate = Tollgate::builder()
            .config(tollgate_model::config::Config::parse(&toml).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let names: Vec<String> = (0..groups).map(|i| format!("g{i:04}")).collect();
        let live = |n: &String| gate.inner.groups.known(n).unwrap().counters.live_tallies();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..3 {
                    for n in &names {
                        gate.try_acquire(n, 1.0).unwrap();
                    }
                }
                let last = &names[groups - LOCAL_GROUPS_MAX..];
                let cached_last = last.iter().filter(|n| live(n) > 0).count();
                assert!(
                    cached_last <= LOCAL_GROUPS_MAX / 4,
                    "{cached_last} of the last {LOCAL_GROUPS_MAX} called are cached"
                );
                assert!(
                    names[..LOCAL_GROUPS_MAX].iter().filter(|n| live(n) > 0).count() >= LOCAL_GROUPS_MAX / 2
                );
            });
        });
        for n in &names {
            assert_eq!(gate.stats(n).unwrap().admitted, 3, "{n}");
        }
    }
}
