//! Couchbase's first-come-first-served admission, in one-second slots.
//!
//! Couchbase memcached (`001_2fe6aa93fecdbfec.txt`) refills every tenant once a second. A
//! request is admitted against the tenant's own gauge while that is below its reservation;
//! beyond that it draws on the node's free pool (`capacity − Σ reserved`, counting every
//! reservation whether or not its tenant is active), first come first served, with no
//! fairness between tenants within a second; a tenant with a finite limit stops at it. At
//! each new slot the free pool empties, unlimited tenants' gauges reset, and a limited
//! tenant's gauge drops by its limit, so overshoot is paid back in later seconds.
//!
//! Where Couchbase's design note and its code disagree we follow the note: a limited tenant
//! above its reservation still needs room in the free pool, so the node's capacity is never
//! overcommitted (the code lets a limited tenant run to its limit regardless). Unthrottled
//! work is always admitted and counted in the gauges (the note's wording; the code forgets it).
//!
//! A slot's bookkeeping spans a tenant gauge and the node's pool, so each takes a short
//! mutex; this mode is for reproducing Couchbase, the token buckets are the lock-free path.

use std::sync::Mutex;
use std::time::Duration;

use crate::time::Nanos;

/// Length of one slot.
pub const SLOT: Duration = Duration::from_secs(1);
const SLOT_NS: u64 = 1_000_000_000;

/// Where an admitted cost was drawn from; settle it against the same place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// The group's reservation.
    Reserved,
    /// The node's free pool.
    Free,
}

#[derive(Debug)]
struct Gauge {
    slot: u64,
    used: f64,
}

/// The node's free pool.
#[derive(Debug)]
pub struct FreePool {
    gauge: Mutex<Gauge>,
    capacity: f64,
    limit: Mutex<f64>,
}

impl FreePool {
    /// A pool for a node of `capacity` units/s, with nothing reserved yet.
    pub fn new(capacity: f64) -> Self {
        Self { gauge: Mutex::new(Gauge { slot: 0, used: 0.0 }), capacity, limit: Mutex::new(capacity) }
    }

    /// Recomputes the pool's size from the sum of all groups' reservations.
    pub fn set_reserved_total(&self, reserved_total: f64) {
        *lock(&self.limit) = (self.capacity - reserved_total).max(0.0);
    }

    /// The pool's size per slot.
    pub fn limit(&self) -> f64 {
        *lock(&self.limit)
    }

    /// Units drawn from the pool in the current slot.
    pub fn used(&self, now: Nanos) -> f64 {
        let mut g = lock(&self.gauge);
        roll(&mut g, now, None);
        g.used
    }
}

/// One group's gauge.
#[derive(Debug)]
pub struct FcfsGroup {
    gauge: Mutex<Gauge>,
    reserved: f64,
    limit: Option<f64>,
}

impl FcfsGroup {
    /// A group reserving `reserved` units/s, with a limit if finite.
    pub fn new(reserved: f64, limit: Option<f64>) -> Self {
        Self { gauge: Mutex::new(Gauge { slot: 0, used: 0.0 }), reserved, limit }
    }

    /// Admits `cost` at `now` and says where it was drawn from, or how long until the next
    /// slot, when it may be tried again.
    pub fn try_acquire(&self, pool: &FreePool, cost: f64, now: Nanos) -> Result<Domain, Duration> {
        let mut g = lock(&self.gauge);
        roll(&mut g, now, self.limit);
        if g.used + cost <= self.reserved {
            g.used += cost;
            return Ok(Domain::Reserved);
        }
        if self.limit.is_some_and(|limit| g.used + cost > limit) {
            return Err(until_next_slot(now));
        }
        let free_limit = pool.limit();
        let mut p = lock(&pool.gauge);
        roll(&mut p, now, None);
        if p.used + cost <= free_limit {
            p.used += cost;
            g.used += cost;
            Ok(Domain::Free)
        } else {
            Err(until_next_slot(now))
        }
    }

    /// Counts `cost` without asking (unthrottled work), drawing on the reservation while it
    /// lasts and on the pool after that.
    pub fn charge(&self, pool: &FreePool, cost: f64, now: Nanos) -> Domain {
        let mut g = lock(&self.gauge);
        roll(&mut g, now, self.limit);
        let domain = if g.used + cost <= self.reserved { Domain::Reserved } else { Domain::Free };
        g.used += cost;
        if domain == Domain::Free {
            let mut p = lock(&pool.gauge);
            roll(&mut p, now, None);
            p.used += cost;
        }
        domain
    }

    /// Adds `delta` (negative to give back) to the gauges `domain` was drawn from, once the
    /// actual cost is known. Gauges never go below zero.
    pub fn settle(&self, pool: &FreePool, domain: Domain, delta: f64, now: Nanos) {
        let mut g = lock(&self.gauge);
        roll(&mut g, now, self.limit);
        g.used = (g.used + delta).max(0.0);
        if domain == Domain::Free {
            let mut p = lock(&pool.gauge);
            roll(&mut p, now, None);
            p.used = (p.used + delta).max(0.0);
        }
    }

    /// Units counted against the group in the current slot.
    pub fn used(&self, now: Nanos) -> f64 {
        let mut g = lock(&self.gauge);
        roll(&mut g, now, self.limit);
        g.used
    }
}

/// Brings a gauge to the slot containing `now`: each slot passed drops a limited gauge by its
/// limit (Couchbase's carry-over of overshoot) and resets an unlimited one.
fn roll(g: &mut Gauge, now: Nanos, limit: Option<f64>) {
    let slot = now.0 / SLOT_NS;
    if slot <= g.slot {
        return;
    }
    let passed = (slot - g.slot) as f64;
    g.used = match limit {
        Some(limit) if g.used > limit * passed => g.used - limit * passed,
        _ => 0.0,
    };
    g.slot = slot;
}

fn until_next_slot(now: Nanos) -> Duration {
    Duration::from_nanos(SLOT_NS - now.0 % SLOT_NS)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded values are plain numbers, valid whatever a panicking holder left.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn reserved_first_then_the_pool_first_come_first_served() {
        let pool = FreePool::new(100.0);
        pool.set_reserved_total(40.0); // 60 free
        let a = FcfsGroup::new(30.0, None);
        let b = FcfsGroup::new(10.0, None);
        assert_eq!(a.try_acquire(&pool, 30.0, Nanos(0)), Ok(Domain::Reserved));
        assert_eq!(a.try_acquire(&pool, 50.0, Nanos(0)), Ok(Domain::Free));
        // b still has its reservation, but only 10 of the pool is left.
        assert_eq!(b.try_acquire(&pool, 10.0, Nanos(0)), Ok(Domain::Reserved));
        assert_eq!(b.try_acquire(&pool, 10.0, Nanos(0)), Ok(Domain::Free));
        assert_eq!(b.try_acquire(&pool, 1.0, Nanos(S / 4)), Err(Duration::from_millis(750)));
        // Next slot: everything is available again.
        assert_eq!(b.try_acquire(&pool, 10.0, Nanos(S)), Ok(Domain::Reserved));
        assert_eq!(b.try_acquire(&pool, 60.0, Nanos(S)), Ok(Domain::Free));
    }

    #[test]
    fn a_finite_limit_stops_the_group_and_overshoot_carries_over() {
        let pool = FreePool::new(10_000.0);
        pool.set_reserved_total(100.0);
        let g = FcfsGroup::new(100.0, Some(100.0));
        assert_eq!(g.try_acquire(&pool, 100.0, Nanos(0)), Ok(Domain::Reserved));
        assert!(g.try_acquire(&pool, 1.0, Nanos(0)).is_err());
        // Post-hoc the request cost 250 more: paid back over the next slots.
        g.settle(&pool, Domain::Reserved, 250.0, Nanos(0));
        assert_eq!(g.used(Nanos(S)), 250.0);
        assert_eq!(g.used(Nanos(2 * S)), 150.0);
        assert_eq!(g.used(Nanos(3 * S)), 50.0);
        assert_eq!(g.used(Nanos(4 * S)), 0.0); // at or below the limit: reset
    }

    #[test]
    fn unthrottled_work_is_counted_in_the_gauges() {
        let pool = FreePool::new(20.0);
        pool.set_reserved_total(10.0);
        let g = FcfsGroup::new(10.0, None);
        assert_eq!(g.charge(&pool, 25.0, Nanos(0)), Domain::Free);
        assert_eq!(pool.used(Nanos(0)), 25.0);
        assert!(g.try_acquire(&pool, 1.0, Nanos(0)).is_err());
    }
}
