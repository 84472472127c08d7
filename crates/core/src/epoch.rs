//! A pool shared by several clients, handed out per one-second epoch (Numaflow's store mode).
//!
//! Each of `size` clients may take `⌊pool / size⌋` units per epoch, never more; what it deposits
//! back within the epoch can be taken again; unused units do not carry over to the next epoch.
//! What was taken beyond the share ([`EpochShare::take`]: unthrottled work, or a cost found
//! larger afterwards) is debt: the next epoch's share is that much smaller, so such work
//! counts against the pool as everything else does. The pool is
//! fixed, or follows a [`Ramp`]. The ramp is stepped lazily at the first call of an epoch, from
//! the last active epoch's use at pool level: this client's use times `size` (every client is
//! assumed to use alike), plus the remainder that integer division could not hand out, which
//! counts as used.
//!
//! One short mutex guards the state: the epoch roll-over has to move the ramp, the share and
//! the counts together.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::ramp::Ramp;
use crate::time::Nanos;

const EPOCH_NS: u64 = 1_000_000_000;

/// The rounding error a class's floor may carry, relative to the share it is a part of.
const FLOOR_SLACK: f64 = 1e-9;

/// What the pool is.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolSpec {
    /// A fixed pool of units per epoch.
    Fixed(f64),
    /// A ramp-up.
    Ramp(Ramp),
}

/// A forced state, for safe mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// Everything is admitted.
    Open,
    /// Nothing is admitted.
    Closed,
}

#[derive(Debug)]
struct State {
    spec: PoolSpec,
    size: u64,
    epoch: Option<u64>,
    pool: f64,
    share: f64,
    left: f64,
    used: f64,
    forced: Option<Forced>,
}

/// The per-epoch share of a pool. See the [module documentation](self).
///
/// ```
/// use tollgate_model::epoch::{EpochShare, PoolSpec};
/// use tollgate_model::time::Nanos;
///
/// let share = EpochShare::new(PoolSpec::Fixed(100.0), 3); // 3 clients: 33 each per epoch
/// for _ in 0..33 {
///     share.try_take(1.0, Nanos(0)).unwrap();
/// }
/// assert!(share.try_take(1.0, Nanos(0)).is_err());
/// assert!(share.try_take(1.0, Nanos(1_000_000_000)).is_ok()); // a new epoch
/// ```
#[derive(Debug)]
pub struct EpochShare {
    state: Mutex<State>,
}

impl EpochShare {
    /// A share of `spec` among `size` clients (at least 1).
    pub fn new(spec: PoolSpec, size: u64) -> Self {
        Self {
            state: Mutex::new(State {
                spec,
                size: size.max(1),
                epoch: None,
                pool: 0.0,
                share: 0.0,
                left: 0.0,
                used: 0.0,
                forced: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets how many clients share the pool; takes effect at the next epoch.
    pub fn set_size(&self, size: u64) {
        self.lock().size = size.max(1);
    }

    /// Forces everything open or closed (safe mode), or lifts it.
    pub fn force(&self, forced: Option<Forced>) {
        self.lock().forced = forced;
    }

    /// The number of clients sharing the pool.
    pub fn size(&self) -> u64 {
        self.lock().size
    }

    /// The ramp's value, to resume from after a restart.
    pub fn ramp_value(&self) -> Option<f64> {
        match &self.lock().spec {
            PoolSpec::Ramp(r) => Some(r.value()),
            PoolSpec::Fixed(_) => None,
        }
    }

    /// The current epoch's pool and this client's share of it.
    pub fn pool_and_share(&self, now: Nanos) -> (f64, f64) {
        let mut s = self.lock();
        roll(&mut s, now);
        (s.pool, s.share)
    }

    /// What is left of this epoch's share now (never below zero).
    pub fn left(&self, now: Nanos) -> f64 {
        let mut s = self.lock();
        roll(&mut s, now);
        s.left.max(0.0)
    }

    /// Takes `cost` from this epoch's share, or says how long until the next epoch.
    pub fn try_take(&self, cost: f64, now: Nanos) -> Result<(), Duration> {
        self.try_take_keeping(cost, 0.0, now)
    }

    /// [`try_take`](Self::try_take), leaving at least `floor` (a share from 0 to 1) of the
    /// epoch's share untaken: a request class's floor (see [`crate::class`]).
    pub fn try_take_keeping(&self, cost: f64, floor: f64, now: Nanos) -> Result<(), Duration> {
        let mut s = self.lock();
        roll(&mut s, now);
        match s.forced {
            Some(Forced::Open) => return Ok(()),
            Some(Forced::Closed) => return Err(until_next_epoch(now)),
            None => {}
        }
        // Within a rounding error of the floor: a sheddable floor of 0.2 + (1 − 0.2) / 2 is
        // 0.6000000000000001, and the units it keeps are still a whole 6 of 10.
        let keep = floor * s.share - FLOOR_SLACK * s.share.max(1.0);
        if cost <= s.left - keep.max(0.0) {
            s.left -= cost;
            s.used += cost;
            Ok(())
        } else {
            Err(until_next_epoch(now))
        }
    }

    /// Takes `cost` whether or not the share holds it (unthrottled work, a cost found larger
    /// afterwards): the share can go below zero, and what is below zero at the end of the
    /// epoch is taken from the next one's.
    pub fn take(&self, cost: f64, now: Nanos) {
        let mut s = self.lock();
        roll(&mut s, now);
        s.left -= cost;
        s.used += cost;
    }

    /// Gives back `units` within the epoch they were taken in (Numaflow's deposit); a deposit
    /// into a later epoch is lost, as the share was refilled anyway.
    pub fn deposit(&self, units: f64, taken_at: Nanos, now: Nanos) {
        let mut s = self.lock();
        roll(&mut s, now);
        if s.epoch == Some(taken_at.0 / EPOCH_NS) {
            s.left += units;
            s.used = (s.used - units).max(0.0);
        }
    }
}

/// At the first call of a new epoch: step the ramp from the last active epoch's use and hand
/// out the new share.
fn roll(s: &mut State, now: Nanos) {
    let epoch = now.0 / EPOCH_NS;
    if s.epoch.is_some_and(|e| e >= epoch) {
        return;
    }
    let size = s.size as f64;
    let remainder = (s.pool - s.share * size).max(0.0);
    let pool_use = s.used * size + remainder;
    let first = s.epoch.is_none();
    s.pool = match &mut s.spec {
        PoolSpec::Fixed(p) => *p,
        PoolSpec::Ramp(r) => {
            if !first {
                r.use_units(pool_use);
            }
            r.at_epoch(epoch) as f64
        }
    };
    s.share = (s.pool / size).floor();
    // Debt carries over; unused units do not.
    s.left = s.share + s.left.min(0.0);
    s.used = 0.0;
    s.epoch = Some(epoch);
}

fn until_next_epoch(now: Nanos) -> Duration {
    Duration::from_nanos(EPOCH_NS - now.0 % EPOCH_NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{RampMode, RampSettings};

    const S: u64 = EPOCH_NS;

    #[test]
    fn each_client_gets_the_floor_of_its_part_per_epoch() {
        let share = EpochShare::new(PoolSpec::Fixed(100.0), 3);
        assert_eq!(share.pool_and_share(Nanos(0)), (100.0, 33.0));
        let mut taken = 0;
        while share.try_take(1.0, Nanos(S / 2)).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 33);
        assert_eq!(share.try_take(1.0, Nanos(S / 2)), Err(Duration::from_millis(500)));
        // Deposits within the epoch can be taken again; nothing carries over.
        share.deposit(3.0, Nanos(S / 2), Nanos(S / 2));
        assert!(share.try_take(3.0, Nanos(S / 2)).is_ok());
        share.set_size(2);
        assert_eq!(share.pool_and_share(Nanos(S)), (100.0, 50.0));
    }

    #[test]
    fn a_floor_leaves_its_part_of_the_share_for_other_classes() {
        let share = EpochShare::new(PoolSpec::Fixed(100.0), 1);
        let taken = |floor: f64| {
            (0..200).filter(|_| share.try_take_keeping(1.0, floor, Nanos(S / 2)).is_ok()).count()
        };
        // Sheddable work stops at 60 left, normal work at 20, critical work at none.
        assert_eq!([taken(0.6), taken(0.2), taken(0.0)], [40, 40, 20]);
    }

    #[test]
    fn a_class_floor_computed_from_a_reserve_leaves_exactly_its_part() {
        // 0.2 + (1 - 0.2) / 2 is 0.6000000000000001: the sixth unit left must still count as 6.
        let share = EpochShare::new(PoolSpec::Fixed(10.0), 1);
        let floor = |class: crate::class::RequestClass| class.floor(0.2);
        let taken =
            |class| (0..20).filter(|_| share.try_take_keeping(1.0, floor(class), Nanos(0)).is_ok()).count();
        use crate::class::RequestClass::{Critical, Normal, Sheddable};
        assert_eq!([taken(Sheddable), taken(Normal), taken(Critical)], [4, 4, 2]);
    }

    #[test]
    fn the_ramp_sees_pool_level_use_including_the_remainder() {
        // only_if_used at 100 %: grows only if the whole pool was used.
        let settings = RampSettings {
            mode: RampMode::OnlyIfUsed,
            threshold_pct: 100.0,
            ..RampSettings::new(10.0, 110.0, Duration::from_secs(10))
        };
        let share = EpochShare::new(PoolSpec::Ramp(Ramp::new(settings, None)), 3);
        // Epoch 0: pool 10, share 3 each; this client uses all 3, and the remainder 1 counts
        // as used: 3 × 3 + 1 = 10 = 100 %.
        for _ in 0..3 {
            share.try_take(1.0, Nanos(0)).unwrap();
        }
        assert_eq!(share.pool_and_share(Nanos(S)), (20.0, 6.0));
        // Epoch 1: uses 5 of 6: 5 × 3 + 2 = 17 of 20 < 100 %: the pool stays.
        for _ in 0..5 {
            share.try_take(1.0, Nanos(S)).unwrap();
        }
        assert_eq!(share.pool_and_share(Nanos(2 * S)), (20.0, 6.0));
    }

    #[test]
    fn safe_mode_forces_open_or_closed() {
        let share = EpochShare::new(PoolSpec::Fixed(1.0), 1);
        share.force(Some(Forced::Open));
        for _ in 0..100 {
            share.try_take(1.0, Nanos(0)).unwrap();
        }
        share.force(Some(Forced::Closed));
        assert!(share.try_take(0.5, Nanos(S)).is_err());
        share.force(None);
        assert!(share.try_take(1.0, Nanos(S)).is_ok());
    }
}
