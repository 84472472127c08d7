//! The token bucket: admission at a rate with a burst, debt and refunds, lock-free.
//!
//! A bucket refills at `rate` units/s up to `burst` units. It is kept in the GCRA form (as
//! `governor` does): one atomic *theoretical arrival time* `tat`, the time at which the bucket
//! would be full again. Admitting `cost` moves `tat` forward by `cost / rate`; it is allowed
//! while `tat − now` stays within the tolerance `burst / rate`. So the hot path is one load
//! and one compare-and-swap, with no lock and no allocation.
//!
//! Debt (TiDB, CockroachDB) falls out naturally: [`Bucket::charge`] moves `tat` forward
//! unconditionally, past the tolerance if need be, and later admissions wait until the debt
//! is repaid by the refill. [`Bucket::refund`] moves it back (Numaflow's deposit): returned
//! tokens can never lift the bucket above its burst.
//!
//! The rate and burst are changed by the allocator, rarely, with [`Bucket::set_rate`], which
//! keeps the tokens (or debt) the bucket holds. A rate of zero closes the bucket (nothing is
//! admitted until the rate rises); an infinite rate opens it (everything is admitted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::time::Nanos;

/// Why a bucket did not admit a cost now.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Refusal {
    /// Enough tokens will have been refilled after this long.
    Wait(Duration),
    /// The cost is larger than the burst: it can never be admitted at this rate and burst.
    ExceedsBurst {
        /// The bucket's burst.
        burst: f64,
    },
    /// The rate is zero: nothing is admitted until it changes.
    Closed,
}

/// A token bucket shared by many threads. See the [module documentation](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate_model::bucket::{Bucket, Refusal};
/// use tollgate_model::time::Nanos;
///
/// let bucket = Bucket::new(100.0, 10.0, Nanos(0)); // 100 units/s, 10 banked, starts full
/// assert!(bucket.try_acquire(10.0, Nanos(0)).is_ok());
/// assert_eq!(bucket.try_acquire(5.0, Nanos(0)), Err(Refusal::Wait(Duration::from_millis(50))));
/// assert!(bucket.try_acquire(5.0, Nanos(50_000_000)).is_ok());
/// ```
#[derive(Debug)]
#[repr(C)]
pub struct Bucket {
    /// The burst in units, as f64 bits.
    burst: AtomicU64,
    /// Tokens held while closed (rate zero), as f64 bits; may be negative (debt).
    closed_level: AtomicU64,
    /// Bumped by every change of rate or burst: see [`Bucket::generation`].
    generation: AtomicU64,
    /// Theoretical arrival time in nanoseconds: the bucket is full when `tat <= now`.
    /// From here on, what every admission reads, together at the end ([`Bucket::ADMISSION_OFFSET`]):
    /// with thousands of groups, most out of the core's caches, a state that holds a bucket
    /// can keep these 32 bytes on one line with its own hot fields (a thread that writes
    /// `tat` has read the parameters just before, so keeping them apart saves no transfer
    /// between cores).
    tat: AtomicU64,
    /// Nanoseconds per unit as f64 bits: 0 when the rate is infinite, +∞ when it is zero.
    ns_per_unit: AtomicU64,
    /// `burst × ns_per_unit`, in whole nanoseconds.
    tolerance_ns: AtomicU64,
    /// The increment of a cost of one unit, `ns_per_unit` rounded up (0 when the rate is
    /// infinite, `u64::MAX` when it is zero): the common cost, priced without converting
    /// between floating point and integers.
    unit_inc: AtomicU64,
}

/// A cost priced at a bucket's rate by [`Bucket::price`], ready to [`Bucket::commit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Priced {
    cost: f64,
    inc: u64,
    tolerance_ns: u64,
    ns_per_unit: f64,
}

impl Priced {
    /// Nanoseconds of refill per unit at the rate it was priced at: 0 when the rate is
    /// unlimited, +∞ when the bucket is closed.
    #[inline]
    pub fn ns_per_unit(&self) -> f64 {
        self.ns_per_unit
    }

    /// The cost priced.
    #[inline]
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// The bucket's burst as nanoseconds of refill, at that rate.
    #[inline]
    pub fn tolerance_ns(&self) -> u64 {
        self.tolerance_ns
    }

    /// Nanoseconds of refill that `units` take at the rate this cost was priced at, rounded
    /// up as every price is (0 when the rate is unlimited, `u64::MAX` when the bucket is
    /// closed): the extra of [`Bucket::commit_with_extra`].
    #[inline]
    pub fn nanos_for(&self, units: f64) -> u64 {
        if self.ns_per_unit == 0.0 || units <= 0.0 { 0 } else { ceil_u64(units * self.ns_per_unit) }
    }

    /// The same cost, admitted only if `units` are left in the bucket after it (a request
    /// class's floor, see [`crate::class`]): the burst it may draw on is that much smaller.
    #[inline]
    pub fn keeping(self, units: f64) -> Priced {
        Priced { tolerance_ns: self.tolerance_ns.saturating_sub(self.nanos_for(units)), ..self }
    }
}

/// The rate/burst pair, decoded.
#[derive(Debug, Clone, Copy)]
struct Params {
    ns_per_unit: f64,
    tolerance_ns: u64,
    burst: f64,
}

/// The largest tolerance: about 146 years of refill. Below it, `now + tolerance` cannot
/// overflow for any time this process will see.
const TOLERANCE_MAX_NS: u64 = 1 << 62;

/// The increment of one unit at `ns_per_unit`.
fn unit_inc(ns_per_unit: f64) -> u64 {
    if ns_per_unit == 0.0 { 0 } else { ceil_u64(ns_per_unit) }
}

impl Params {
    fn new(rate: f64, burst: f64) -> Self {
        assert!(rate >= 0.0 && !rate.is_nan(), "bucket rate must be >= 0, got {rate}");
        assert!(burst >= 0.0 && !burst.is_nan(), "bucket burst must be >= 0, got {burst}");
        let ns_per_unit = if rate == 0.0 { f64::INFINITY } else { 1e9 / rate };
        // Rounded up like the increments, so a cost equal to the burst always fits; at most
        // TOLERANCE_MAX_NS, so that the window check holds for any rate: a tolerance that
        // saturated would admit everything. (Only a rate so low that a unit takes decades
        // meets the bound, and then the bucket holds less than its burst, never more.)
        let tolerance_ns =
            if ns_per_unit.is_infinite() { 0 } else { ceil_u64(burst * ns_per_unit).min(TOLERANCE_MAX_NS) };
        Self { ns_per_unit, tolerance_ns, burst }
    }

    /// Nanoseconds of refill that `cost` units take, rounded up so the bucket never
    /// admits more than its rate.
    #[inline]
    fn nanos_for(&self, cost: f64) -> u64 {
        ceil_u64(cost * self.ns_per_unit)
    }
}

impl Bucket {
    /// Where, in a bucket's bytes, the fields an admission reads begin: from here to the end
    /// (32 bytes). The ones before are read only when the rate changes, on a refusal, or by
    /// a thread's stash.
    pub const ADMISSION_OFFSET: usize = 24;

    /// A full bucket refilling at `rate` units/s (may be 0 or infinite) holding up to `burst`.
    ///
    /// Panics if `rate` or `burst` is negative or NaN: callers pass validated settings.
    pub fn new(rate: f64, burst: f64, now: Nanos) -> Self {
        let p = Params::new(rate, burst);
        Self {
            tat: AtomicU64::new(now.0),
            ns_per_unit: AtomicU64::new(p.ns_per_unit.to_bits()),
            tolerance_ns: AtomicU64::new(p.tolerance_ns),
            unit_inc: AtomicU64::new(unit_inc(p.ns_per_unit)),
            burst: AtomicU64::new(p.burst.to_bits()),
            closed_level: AtomicU64::new(p.burst.to_bits()),
            generation: AtomicU64::new(0),
        }
    }

    /// A bucket that admits nothing until its first [`set_rate`](Self::set_rate), and then
    /// starts full at the burst it is given: for a group whose rate is not known yet.
    pub fn closed_until_rated(now: Nanos) -> Self {
        let b = Self::new(0.0, 0.0, now);
        b.closed_level.store(f64::INFINITY.to_bits(), Ordering::Release);
        b
    }

    #[inline]
    fn params(&self) -> Params {
        Params {
            ns_per_unit: f64::from_bits(self.ns_per_unit.load(Ordering::Acquire)),
            tolerance_ns: self.tolerance_ns.load(Ordering::Acquire),
            burst: f64::from_bits(self.burst.load(Ordering::Acquire)),
        }
    }

    /// Admits `cost` at `now` if the bucket holds it, or says why not.
    ///
    /// `cost` must be finite and not negative (the client checks it); a cost of 0 is admitted
    /// and changes nothing.
    #[inline]
    pub fn try_acquire(&self, cost: f64, now: Nanos) -> Result<(), Refusal> {
        self.commit(self.price(cost), now)
    }

    /// Prices `cost` at the current rate: the first half of [`try_acquire`](Self::try_acquire).
    /// It needs no time, so a caller can price before reading its clock and let the CPU do
    /// both at once; [`commit`](Self::commit) then admits at `now`.
    #[inline]
    pub fn price(&self, cost: f64) -> Priced {
        let ns_per_unit = f64::from_bits(self.ns_per_unit.load(Ordering::Acquire));
        let tolerance_ns = self.tolerance_ns.load(Ordering::Acquire);
        let inc = if cost == 1.0 {
            self.unit_inc.load(Ordering::Acquire)
        } else if ns_per_unit == 0.0 || cost == 0.0 {
            0 // open bucket or free request: nothing to take
        } else {
            ceil_u64(cost * ns_per_unit)
        };
        Priced { cost, inc, tolerance_ns, ns_per_unit }
    }

    /// How long a priced cost must wait, when the bucket cannot hold it at `now` but could
    /// within its burst: the wait [`commit`](Self::commit) would refuse it with. `None` when
    /// it fits now, is free, or never fits (a cost above the burst, a closed bucket), which
    /// `commit` tells apart. Reads the bucket and changes nothing.
    #[inline(always)]
    pub fn wait_within_burst(&self, priced: &Priced, now: Nanos) -> Option<Duration> {
        let Priced { inc, tolerance_ns, .. } = *priced;
        if inc == 0 || inc > tolerance_ns {
            return None;
        }
        // `tat + inc - now > tolerance`, as in `commit_with_extra`; with `inc` within the
        // tolerance, a bucket with `tat <= now` holds the cost, so `max(tat, now)` is `tat`.
        let ahead = self.tat.load(Ordering::Acquire).saturating_add(inc).saturating_sub(now.0);
        if ahead > tolerance_ns { Some(wait_of(ahead - tolerance_ns)) } else { None }
    }

    /// Admits a priced cost at `now`, or says why not.
    #[inline]
    pub fn commit(&self, priced: Priced, now: Nanos) -> Result<(), Refusal> {
        // With no extra, the extra's test folds away once inlined.
        self.commit_with_extra(priced, 0, now).map(|_| ())
    }

    /// [`commit`](Self::commit), also taking `extra_ns` nanoseconds of refill beyond the cost
    /// when the bucket holds them too (a batch taken ahead of use, priced with
    /// [`Priced::nanos_for`]), in the same step: one read and one compare-and-swap whether
    /// the extra fits or not. `Ok(true)` when it was taken as well.
    #[inline]
    pub fn commit_with_extra(&self, priced: Priced, extra_ns: u64, now: Nanos) -> Result<bool, Refusal> {
        let Priced { cost, inc, tolerance_ns, .. } = priced;
        if inc == 0 {
            return Ok(false);
        }
        // An infinite increment (closed bucket) or one beyond the tolerance (cost above the
        // burst) fails the window check below; `refusal` tells which.
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let new_tat = tat.max(now.0).saturating_add(inc);
            let ahead = new_tat - now.0;
            if ahead > tolerance_ns {
                // Within the burst, the common refusal: a wait, told from the price alone.
                // Beyond it (a closed bucket's increment is infinite), the slower reading.
                return Err(if inc <= tolerance_ns {
                    Refusal::Wait(wait_of(ahead - tolerance_ns))
                } else {
                    self.refusal(cost, ahead)
                });
            }
            // `ahead ≤ tolerance` here, so the room left cannot underflow.
            let extra = extra_ns > 0 && extra_ns <= tolerance_ns - ahead;
            let to = if extra { new_tat + extra_ns } else { new_tat };
            // What is taken never reaches past the burst: the bucket is never overdrawn by an
            // admission (only a charge runs it into debt).
            debug_assert!(to - now.0 <= tolerance_ns, "an admission past the burst");
            match self.tat.compare_exchange_weak(tat, to, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(extra),
                Err(actual) => tat = actual,
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn refusal(&self, cost: f64, ahead_ns: u64) -> Refusal {
        let p = self.params();
        if p.ns_per_unit.is_infinite() {
            Refusal::Closed
        } else if cost > p.burst {
            Refusal::ExceedsBurst { burst: p.burst }
        } else {
            Refusal::Wait(Duration::from_nanos(ahead_ns.saturating_sub(p.tolerance_ns)))
        }
    }

    /// Admits `cost` now or books it for the earliest moment it fits, if that is no later
    /// than `max_wait`: returns how long the caller must wait before going ahead (zero when
    /// admitted at once). A booking holds its place: later callers queue behind it.
    #[inline]
    pub fn reserve(&self, cost: f64, now: Nanos, max_wait: Duration) -> Result<Duration, Refusal> {
        let p = self.params();
        if p.ns_per_unit == 0.0 || cost == 0.0 {
            return Ok(Duration::ZERO);
        }
        if p.ns_per_unit.is_infinite() {
            return Err(Refusal::Closed);
        }
        if cost > p.burst {
            return Err(Refusal::ExceedsBurst { burst: p.burst });
        }
        let inc = p.nanos_for(cost);
        let max_wait_ns = crate::time::duration_nanos(max_wait);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let new_tat = tat.max(now.0).saturating_add(inc);
            let ahead = new_tat - now.0; // how far past `now` the bucket is committed
            let wait = ahead.saturating_sub(p.tolerance_ns);
            if wait > max_wait_ns {
                return Err(Refusal::Wait(Duration::from_nanos(wait)));
            }
            match self.tat.compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Duration::from_nanos(wait)),
                Err(actual) => tat = actual,
            }
        }
    }

    /// Takes `cost` whether or not the bucket holds it: what goes beyond becomes debt that
    /// later admissions wait for. Used for post-hoc costs and unthrottled work.
    pub fn charge(&self, cost: f64, now: Nanos) {
        if cost <= 0.0 {
            return;
        }
        let p = self.params();
        if p.ns_per_unit == 0.0 {
            return;
        }
        if p.ns_per_unit.is_infinite() {
            add_f64(&self.closed_level, -cost);
            return;
        }
        let inc = p.nanos_for(cost);
        let _ = self.tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            Some(tat.max(now.0).saturating_add(inc))
        });
    }

    /// Gives back `units` taken earlier (a cost that turned out smaller). The bucket never
    /// holds more than its burst.
    pub fn refund(&self, units: f64) {
        if units <= 0.0 {
            return;
        }
        let p = self.params();
        if p.ns_per_unit == 0.0 {
            return;
        }
        if p.ns_per_unit.is_infinite() {
            let burst = p.burst;
            let _ = self.closed_level.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                Some((f64::from_bits(bits) + units).min(burst).to_bits())
            });
            return;
        }
        // Rounded down, the mirror of `nanos_for`, so a charge and a refund of the same
        // cost never leave the bucket richer than before.
        let dec = (units * p.ns_per_unit) as u64; // truncation: rounded down
        let _ =
            self.tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| Some(tat.saturating_sub(dec)));
    }

    /// Tokens in the bucket at `now`: up to the burst, negative when in debt.
    pub fn available(&self, now: Nanos) -> f64 {
        let p = self.params();
        if p.ns_per_unit == 0.0 {
            return f64::INFINITY;
        }
        if p.ns_per_unit.is_infinite() {
            return f64::from_bits(self.closed_level.load(Ordering::Acquire));
        }
        let tat = self.tat.load(Ordering::Acquire);
        let ahead = tat.saturating_sub(now.0) as f64;
        p.burst - ahead / p.ns_per_unit
    }

    /// The refill rate in units/s (0 when closed, infinite when open).
    pub fn rate(&self) -> f64 {
        let npu = self.params().ns_per_unit;
        if npu == 0.0 { f64::INFINITY } else { 1e9 / npu }
    }

    /// The burst in units.
    pub fn burst(&self) -> f64 {
        self.params().burst
    }

    /// Changes the rate and burst at `now`, keeping the tokens or debt the bucket holds
    /// (tokens above the new burst are dropped).
    ///
    /// Meant for one writer (the allocator) at a time; admissions racing with it may be
    /// priced at the old rate for the instant the change takes.
    pub fn set_rate(&self, rate: f64, burst: f64, now: Nanos) {
        let old = self.params();
        let new = Params::new(rate, burst);
        if old.ns_per_unit == new.ns_per_unit && old.burst == new.burst {
            return;
        }
        let level = if old.ns_per_unit == 0.0 { new.burst } else { self.available(now).min(new.burst) };
        // Refilled to at most the new burst, whatever the old one held.
        debug_assert!(level <= new.burst || level.is_nan(), "a level {level} above the burst {}", new.burst);
        // Publish the new parameters before the state they describe.
        self.burst.store(new.burst.to_bits(), Ordering::Release);
        self.tolerance_ns.store(new.tolerance_ns, Ordering::Release);
        self.unit_inc.store(unit_inc(new.ns_per_unit), Ordering::Release);
        self.ns_per_unit.store(new.ns_per_unit.to_bits(), Ordering::Release);
        if new.ns_per_unit.is_infinite() {
            self.closed_level.store(level.to_bits(), Ordering::Release);
        } else if new.ns_per_unit > 0.0 {
            let missing = (new.burst - level).max(0.0);
            let tat = now.0.saturating_add(ceil_u64(missing * new.ns_per_unit));
            self.tat.store(tat, Ordering::Release);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Closes the bucket until the next [`set_rate`](Self::set_rate), which then starts it full
    /// at the burst it is given, as [`closed_until_rated`](Self::closed_until_rated) does.
    pub fn close_until_rated(&self, now: Nanos) {
        self.set_rate(0.0, 0.0, now);
        self.closed_level.store(f64::INFINITY.to_bits(), Ordering::Release);
    }

    /// While the bucket waits for its first rate ([`closed_until_rated`](Self::closed_until_rated)),
    /// sets what it starts holding then: `level` units, at most the burst it is given, rather
    /// than a full bucket. A process joining a group shared with others starts with what one
    /// request needs and fills at its grant, so that joining adds nothing to the burst the
    /// others bank. Does nothing to a bucket that has had a rate, nor to one already set to
    /// start lower.
    ///
    /// ```
    /// use tollgate_model::bucket::Bucket;
    /// use tollgate_model::time::Nanos;
    /// let b = Bucket::closed_until_rated(Nanos::ZERO);
    /// b.start_at(2.0);
    /// b.set_rate(100.0, 100.0, Nanos::ZERO);
    /// assert_eq!(b.available(Nanos::ZERO), 2.0);
    /// assert_eq!(b.available(Nanos(500_000_000)), 52.0);
    /// ```
    pub fn start_at(&self, level: f64) {
        let waiting = f64::from_bits(self.closed_level.load(Ordering::Acquire));
        if level < waiting && self.params().ns_per_unit.is_infinite() && level >= 0.0 {
            self.closed_level.store(level.to_bits(), Ordering::Release);
        }
    }

    /// A number that changes whenever [`set_rate`](Self::set_rate) changes the rate or the
    /// burst. A caller that takes units ahead of use (a thread's stash) records it, and does
    /// not spend those units once it has changed: a closed bucket admits nothing.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// `Duration::from_nanos`, cheaper for the common wait of under a second (no division).
#[inline(always)]
fn wait_of(ns: u64) -> Duration {
    if ns < 1_000_000_000 { Duration::new(0, ns as u32) } else { Duration::from_nanos(ns) }
}

/// `x` (never negative) rounded up to a whole number, saturating. `f64::ceil` is a libm
/// call on baseline x86-64, and converting through `u64` costs a multi-instruction sequence
/// both ways; through `i64` each way is one instruction.
#[inline]
fn ceil_u64(x: f64) -> u64 {
    if x >= 9.2e18 {
        return u64::MAX; // beyond 292 years of nanoseconds, or infinite: never
    }
    let whole = x as i64;
    (whole + i64::from((whole as f64) < x)) as u64
}

fn add_f64(cell: &AtomicU64, delta: f64) {
    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
        Some((f64::from_bits(bits) + delta).to_bits())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn at_ms(ms: u64) -> Nanos {
        Nanos(ms * MS)
    }

    #[test]
    fn a_cost_priced_keeping_units_leaves_them_in_the_bucket() {
        let b = Bucket::new(10.0, 10.0, at_ms(0));
        let keeping =
            |floor: f64| (0..20).filter(|_| b.commit(b.price(1.0).keeping(floor), at_ms(0)).is_ok()).count();
        assert_eq!([keeping(6.0), keeping(2.0), keeping(0.0)], [4, 4, 2]);
        // The wait says when the bucket holds the cost above the floor: 100 ms a unit.
        assert_eq!(
            b.commit(b.price(1.0).keeping(2.0), at_ms(0)),
            Err(Refusal::Wait(Duration::from_millis(300)))
        );
    }

    #[test]
    fn what_an_admission_reads_is_the_buckets_last_32_bytes() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(Bucket, tat), Bucket::ADMISSION_OFFSET);
        for offset in
            [offset_of!(Bucket, ns_per_unit), offset_of!(Bucket, tolerance_ns), offset_of!(Bucket, unit_inc)]
        {
            assert!(offset > Bucket::ADMISSION_OFFSET);
        }
        assert_eq!(size_of::<Bucket>(), Bucket::ADMISSION_OFFSET + 32);
    }

    proptest::proptest! {
        /// The look without a write answers as `commit` does: the same wait where it refuses
        /// for want of tokens, nothing where it admits or refuses for another reason.
        #[test]
        fn a_wait_within_the_burst_is_what_commit_refuses_with(
            rate in proptest::prop_oneof![0.0..10.0f64, 1.0..1e7f64, proptest::strategy::Just(0.0)],
            burst in proptest::prop_oneof![0.0..5.0f64, 1.0..1e6f64],
            taken in proptest::collection::vec((0.0..2e6f64, 0u64..5_000_000_000), 0..8),
            cost in proptest::prop_oneof![proptest::strategy::Just(0.0), proptest::strategy::Just(1.0), 0.0..2e6f64],
            now_ms in 0u64..10_000,
        ) {
            let b = Bucket::new(rate, burst, Nanos(0));
            for (units, at) in taken {
                b.charge(units, Nanos(at));
            }
            let now = at_ms(now_ms);
            let priced = b.price(cost);
            let looked = b.wait_within_burst(&priced, now);
            let before = b.tat.load(Ordering::Relaxed);
            match b.commit(priced, now) {
                Err(Refusal::Wait(wait)) => proptest::prop_assert_eq!(looked, Some(wait)),
                other => {
                    proptest::prop_assert_eq!(looked, None, "commit said {:?}", other);
                    proptest::prop_assert!(other.is_ok() || b.tat.load(Ordering::Relaxed) == before);
                }
            }
        }
    }

    #[test]
    fn a_cost_that_fills_the_bucket_to_its_edge_need_not_wait() {
        let b = Bucket::new(1000.0, 10.0, Nanos(0)); // a unit a millisecond, 10 banked
        assert!(b.try_acquire(10.0, Nanos(0)).is_ok());
        let one = b.price(1.0);
        assert_eq!(b.wait_within_burst(&one, Nanos(MS - 1)), Some(Duration::from_nanos(1)));
        assert_eq!(b.wait_within_burst(&one, at_ms(1)), None, "the unit refilled by now fits");
        assert_eq!(b.wait_within_burst(&b.price(0.0), Nanos(0)), None, "free");
        assert_eq!(b.wait_within_burst(&b.price(11.0), at_ms(100)), None, "above the burst: never");
        assert_eq!(b.commit(b.price(11.0), at_ms(100)), Err(Refusal::ExceedsBurst { burst: 10.0 }));
    }

    #[test]
    fn the_generation_changes_with_the_rate_or_burst_only() {
        let b = Bucket::new(1000.0, 100.0, at_ms(0));
        let g0 = b.generation();
        b.set_rate(1000.0, 100.0, at_ms(1));
        assert!(b.try_acquire(10.0, at_ms(1)).is_ok());
        assert_eq!(b.generation(), g0, "same parameters, same generation");
        b.set_rate(0.0, 100.0, at_ms(2));
        let g1 = b.generation();
        assert_ne!(g1, g0);
        b.set_rate(0.0, 50.0, at_ms(3));
        assert_ne!(b.generation(), g1);
    }

    #[test]
    fn starts_full_then_refills_at_the_rate() {
        let b = Bucket::new(1000.0, 100.0, at_ms(0));
        for _ in 0..100 {
            assert!(b.try_acquire(1.0, at_ms(0)).is_ok());
        }
        assert_eq!(b.try_acquire(1.0, at_ms(0)), Err(Refusal::Wait(Duration::from_millis(1))));
        // 10 ms refill 10 units.
        for _ in 0..10 {
            assert!(b.try_acquire(1.0, at_ms(10)).is_ok());
        }
        assert!(b.try_acquire(1.0, at_ms(10)).is_err());
        // Never more than the burst, however long it idles.
        assert!((b.available(at_ms(60_000)) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn an_extra_is_taken_with_the_cost_only_when_both_fit() {
        // 1,000 units/s, 100 banked: a unit is 1 ms of refill, 10 units 10 ms.
        let b = Bucket::new(1000.0, 100.0, at_ms(0));
        let one = b.price(1.0);
        let ten = one.nanos_for(10.0);
        assert_eq!(ten, 10 * MS);
        // 1 + 10 fit nine times in 100; then the cost alone, the last unit.
        for _ in 0..9 {
            assert_eq!(b.commit_with_extra(one, ten, at_ms(0)), Ok(true));
        }
        assert_eq!(b.commit_with_extra(one, ten, at_ms(0)), Ok(false));
        assert!(b.available(at_ms(0)).abs() < 1e-9);
        // Empty: refused as `commit` refuses, and nothing taken.
        assert_eq!(b.commit_with_extra(one, ten, at_ms(0)), b.commit(one, at_ms(0)).map(|()| false));
        assert_eq!(b.commit_with_extra(one, ten, at_ms(0)), Err(Refusal::Wait(Duration::from_millis(1))));
        assert!(b.available(at_ms(0)).abs() < 1e-9);
        // Exactly the cost and the extra refilled: both taken, to the last nanosecond.
        assert_eq!(b.commit_with_extra(one, ten, at_ms(11)), Ok(true));
        assert!(b.available(at_ms(11)).abs() < 1e-9);
        // No extra asked, or an extra beyond the burst: the cost alone, as `commit`.
        assert_eq!(b.commit_with_extra(one, 0, at_ms(12)), Ok(false));
        assert_eq!(b.commit_with_extra(one, u64::MAX, at_ms(100)), Ok(false));
        assert!((b.available(at_ms(100)) - 87.0).abs() < 1e-9);
        // A cost above the burst, a closed bucket: the same refusals as `commit`.
        assert_eq!(
            b.commit_with_extra(b.price(100.5), ten, at_ms(100)),
            Err(Refusal::ExceedsBurst { burst: 100.0 })
        );
        b.set_rate(0.0, 100.0, at_ms(100));
        assert_eq!(b.commit_with_extra(b.price(1.0), ten, at_ms(100)), Err(Refusal::Closed));
    }

    #[test]
    fn an_extra_is_priced_at_the_rate_its_cost_was() {
        let b = Bucket::new(3.0, 10.0, at_ms(0));
        let p = b.price(1.0);
        // A third of a second a unit, rounded up.
        assert_eq!(p.nanos_for(1.0), 333_333_334);
        assert_eq!(p.nanos_for(0.0), 0);
        assert_eq!(p.nanos_for(-1.0), 0);
        b.set_rate(f64::INFINITY, 10.0, at_ms(0));
        assert_eq!(b.price(1.0).nanos_for(5.0), 0);
        b.set_rate(0.0, 10.0, at_ms(0));
        assert_eq!(b.price(1.0).nanos_for(5.0), u64::MAX);
    }

    #[test]
    fn a_cost_above_the_burst_is_refused_outright() {
        let b = Bucket::new(1000.0, 100.0, at_ms(0));
        assert_eq!(b.try_acquire(100.5, at_ms(0)), Err(Refusal::ExceedsBurst { burst: 100.0 }));
        assert!(b.try_acquire(100.0, at_ms(0)).is_ok());
    }

    #[test]
    fn a_cost_equal_to_a_fractional_nanosecond_burst_fits() {
        // Regression: 3 units at 3/s is 999,999,999.9… ns; a truncated tolerance refused it
        // forever, even from a full bucket.
        let b = Bucket::new(3.0, 3.0, at_ms(0));
        assert!(b.try_acquire(3.0, at_ms(0)).is_ok());
        assert_eq!(b.reserve(3.0, at_ms(1000), Duration::ZERO), Ok(Duration::ZERO));
    }

    #[test]
    fn zero_cost_is_admitted_and_changes_nothing() {
        let b = Bucket::new(10.0, 1.0, at_ms(0));
        assert!(b.try_acquire(1.0, at_ms(0)).is_ok());
        assert!(b.try_acquire(0.0, at_ms(0)).is_ok());
        assert!(b.available(at_ms(0)).abs() < 1e-9);
    }

    #[test]
    fn debt_is_repaid_before_anything_else_is_admitted() {
        let b = Bucket::new(100.0, 10.0, at_ms(0));
        assert!(b.try_acquire(10.0, at_ms(0)).is_ok());
        b.charge(20.0, at_ms(0)); // the request turned out 20 units dearer
        assert!((b.available(at_ms(0)) + 20.0).abs() < 1e-9);
        // 20 units of debt at 100/s: 200 ms before the first new unit, 210 ms to admit 1.
        assert_eq!(b.try_acquire(1.0, at_ms(200)), Err(Refusal::Wait(Duration::from_millis(10))));
        assert!(b.try_acquire(1.0, at_ms(210)).is_ok());
    }

    #[test]
    fn refunds_return_tokens_but_never_beyond_the_burst() {
        let b = Bucket::new(100.0, 10.0, at_ms(0));
        assert!(b.try_acquire(8.0, at_ms(0)).is_ok());
        b.refund(5.0);
        assert!((b.available(at_ms(0)) - 7.0).abs() < 1e-9);
        b.refund(50.0);
        assert!((b.available(at_ms(0)) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn reserve_books_the_earliest_slot_within_the_max_wait() {
        let b = Bucket::new(100.0, 1.0, at_ms(0));
        assert_eq!(b.reserve(1.0, at_ms(0), Duration::from_secs(1)), Ok(Duration::ZERO));
        assert_eq!(b.reserve(1.0, at_ms(0), Duration::from_secs(1)), Ok(Duration::from_millis(10)));
        assert_eq!(b.reserve(1.0, at_ms(0), Duration::from_secs(1)), Ok(Duration::from_millis(20)));
        // Too far out: refused, and nothing booked.
        assert_eq!(
            b.reserve(1.0, at_ms(0), Duration::from_millis(25)),
            Err(Refusal::Wait(Duration::from_millis(30)))
        );
        assert_eq!(b.reserve(1.0, at_ms(0), Duration::from_secs(1)), Ok(Duration::from_millis(30)));
    }

    #[test]
    fn rate_changes_keep_tokens_and_debt() {
        let b = Bucket::new(100.0, 100.0, at_ms(0));
        assert!(b.try_acquire(60.0, at_ms(0)).is_ok()); // 40 left
        b.set_rate(1000.0, 200.0, at_ms(0));
        assert!((b.available(at_ms(0)) - 40.0).abs() < 1e-6);
        assert!((b.available(at_ms(100)) - 140.0).abs() < 1e-6);
        // Shrinking the burst drops what no longer fits.
        b.set_rate(1000.0, 50.0, at_ms(100));
        assert!((b.available(at_ms(100)) - 50.0).abs() < 1e-6);
        // Debt survives a change of rate.
        b.charge(150.0, at_ms(100));
        b.set_rate(10.0, 50.0, at_ms(100));
        assert!((b.available(at_ms(100)) + 100.0).abs() < 1e-6);
    }

    #[test]
    fn a_bucket_awaiting_its_rate_starts_full_at_it() {
        let b = Bucket::closed_until_rated(at_ms(0));
        assert_eq!(b.try_acquire(1.0, at_ms(0)), Err(Refusal::Closed));
        b.set_rate(100.0, 20.0, at_ms(5));
        assert!((b.available(at_ms(5)) - 20.0).abs() < 1e-9);
        assert!(b.try_acquire(20.0, at_ms(5)).is_ok());
    }

    #[test]
    fn a_rate_too_low_for_nanoseconds_still_holds_its_burst() {
        // A unit every 35 years with a burst of 10: 10 units of refill overflow the
        // nanoseconds a tolerance can count. It admits no more than its burst.
        for (rate, burst) in [(1e-9, 10.0), (8.9e-10, 100.0), (1e-15, 1.0)] {
            let b = Bucket::new(rate, burst, Nanos(0));
            let mut admitted = 0;
            while b.try_acquire(1.0, Nanos(1_000)).is_ok() && admitted <= 1_000 {
                admitted += 1;
            }
            assert!(admitted as f64 <= burst, "rate {rate}, burst {burst}: {admitted} admitted");
            let b = Bucket::new(1.0, 1.0, Nanos(0));
            b.set_rate(rate, burst, Nanos(0));
            assert!(b.try_acquire(burst + 1.0, Nanos(5)).is_err());
        }
    }

    #[test]
    fn zero_rate_closes_and_infinite_rate_opens() {
        let b = Bucket::new(100.0, 10.0, at_ms(0));
        assert!(b.try_acquire(4.0, at_ms(0)).is_ok());
        b.set_rate(0.0, 10.0, at_ms(0));
        assert_eq!(b.try_acquire(1.0, at_ms(0)), Err(Refusal::Closed));
        assert!((b.available(at_ms(5000)) - 6.0).abs() < 1e-6); // frozen while closed
        b.set_rate(100.0, 10.0, at_ms(5000));
        assert!((b.available(at_ms(5000)) - 6.0).abs() < 1e-6);
        b.set_rate(f64::INFINITY, 10.0, at_ms(5000));
        for _ in 0..1000 {
            assert!(b.try_acquire(10.0, at_ms(5000)).is_ok());
        }
    }
}
