//! Permits: what an admitted request holds until its actual cost is known.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tollgate_model::cost::{Consumption, CostError, CostModel, Usage, check_cost};
use tollgate_model::time::Clock;

use crate::group::{Group, Limiter, micros};

/// A reference to a group's state: borrowed from a [`GroupHandle`](crate::GroupHandle) on
/// the hot path, owned when the group was looked up by name.
#[derive(Debug)]
pub(crate) enum GroupRef<'a> {
    Borrowed(&'a Group),
    Owned(Arc<Group>),
}

impl std::ops::Deref for GroupRef<'_> {
    type Target = Group;
    fn deref(&self) -> &Group {
        match self {
            GroupRef::Borrowed(g) => g,
            GroupRef::Owned(g) => g,
        }
    }
}

/// An admitted request. Settle it with the actual cost once known: the difference from the
/// cost admitted becomes debt (the group's later requests wait for it) or is returned.
/// Dropping a permit unsettled keeps the admitted cost as the actual one.
///
/// ```
/// # use tollgate_limiter::Tollgate;
/// # use tollgate_model::time::ManualClock;
/// let gate = Tollgate::from_toml("[groups.a]\nlimit = 100\n")?.with_clock(ManualClock::new())?;
/// let permit = gate.try_acquire("a", 10.0)?;
/// permit.settle(25.0)?; // the request turned out dearer: 15 units of debt
/// assert_eq!(gate.stats("a").unwrap().consumed_units, 25.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Permit<'a> {
    pub(crate) group: GroupRef<'a>,
    pub(crate) cost: f64,
    /// When it was admitted, for store mode (deposits count only within that epoch). A
    /// bucket permit from a thread's stash leaves it at zero: nothing reads it there.
    pub(crate) at: tollgate_model::time::Nanos,
    /// It holds one of the group's in-flight slots, given back when it is dropped (settled,
    /// dropped as work, or unwound by a panic or a cancelled task).
    pub(crate) slot: bool,
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.slot {
            self.group.give_slot();
        }
    }
}

impl Permit<'_> {
    /// The cost admitted.
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// The group it was admitted for (the group whose state it draws on).
    pub fn group(&self) -> &str {
        self.group.name.as_str()
    }

    /// Settles the request at `actual` units: more than admitted becomes debt, less is
    /// returned. An invalid `actual` is refused and the admitted cost stands.
    pub fn settle(self, actual: f64) -> Result<(), CostError> {
        check_cost("actual cost", actual)?;
        let delta = actual - self.cost;
        if delta == 0.0 {
            return Ok(());
        }
        let group = &*self.group;
        let now = group.clock.now();
        match group.limiter() {
            Limiter::Bucket(bucket) => {
                if delta > 0.0 {
                    group.charge(bucket, delta, now);
                } else {
                    bucket.refund(-delta);
                }
            }
            Limiter::Epoch(share) => {
                if delta > 0.0 {
                    share.take(delta, now);
                } else {
                    share.deposit(-delta, self.at, now);
                }
            }
        }
        if delta > 0.0 {
            group.settled_up_micro.fetch_add(micros(delta), Ordering::Relaxed);
        } else {
            group.settled_down_micro.fetch_add(micros(-delta), Ordering::Relaxed);
        }
        Ok(())
    }

    /// The work was dropped before it reached the protected resource (Numaflow's `to_drop`).
    /// By the group's `dropped` setting its cost is given back to the group's tokens and not
    /// counted as consumed (`return`, the default), or kept as if the work had run (`count`).
    /// Either way it is counted in the group's `dropped` statistics.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// # use tollgate_model::time::ManualClock;
    /// let gate = Tollgate::from_toml("[groups.a]\nlimit = 100\n")?.with_clock(ManualClock::new())?;
    /// let permit = gate.try_acquire("a", 10.0)?;
    /// permit.dropped(); // never sent on: the 10 units go back to the group
    /// let stats = gate.stats("a").unwrap();
    /// assert_eq!((stats.consumed_units, stats.dropped, stats.dropped_units), (0.0, 1, 10.0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dropped(self) {
        let group = &*self.group;
        group.dropped.fetch_add(1, Ordering::Relaxed);
        group.dropped_micro.fetch_add(micros(self.cost), Ordering::Relaxed);
        if group.counts_dropped() || self.cost == 0.0 {
            return;
        }
        let now = group.clock.now();
        match group.limiter() {
            Limiter::Bucket(bucket) => bucket.refund(self.cost),
            Limiter::Epoch(share) => share.deposit(self.cost, self.at, now),
        }
        group.settled_down_micro.fetch_add(micros(self.cost), Ordering::Relaxed);
    }

    /// Settles with what the request did, priced by `model` (usually the limiter's own,
    /// [`Tollgate::cost_model`](crate::Tollgate::cost_model)).
    ///
    /// What the request did is added to the group's detailed consumption (read or write
    /// request units, bytes, CPU milliseconds, one request), which a controller sums per
    /// group: only requests settled this way are counted there.
    pub fn settle_usage(self, model: &CostModel, usage: &Usage) -> Result<(), CostError> {
        let detail = Consumption::of(model, usage)?;
        self.group.add_detail(&detail);
        self.settle(detail.rru + detail.wru)
    }

    /// The same permit, no longer borrowing the handle it came from.
    pub fn into_owned(mut self) -> Permit<'static> {
        let group = match &self.group {
            GroupRef::Borrowed(g) => GroupRef::Owned(g.self_arc()),
            GroupRef::Owned(g) => GroupRef::Owned(g.clone()),
        };
        // The slot moves to the new permit: this one gives nothing back.
        let slot = std::mem::replace(&mut self.slot, false);
        Permit { group, cost: self.cost, at: self.at, slot }
    }
}
