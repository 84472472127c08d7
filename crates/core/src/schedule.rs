//! Fair scheduling of queued work by priority and virtual time (TiDB/TiKV).
//!
//! When a backend is busy it decides who goes first. Work is queued per group and taken in
//! order of `(priority, virtual time)`:
//!
//! - **Priority is absolute**: every high item before any medium one, medium before low.
//! - **Virtual time**: within a priority, taking an item of cost `c` advances its group's
//!   virtual time by `c × weight`, with the weight inversely proportional to the group's rate:
//!   `round(min(10 × max_rate, 2³¹ − 1) / rate)`, where `max_rate` is at least 10,000 and the
//!   largest configured rate; a rate of 0 or above `max_rate` has weight 1. A group at twice the
//!   rate advances half as fast, and so is served twice as often.
//! - **Renewal**, every second: each group below the largest virtual time moves halfway toward
//!   it, so a group that was idle cannot monopolise the backend when it returns, and a new group
//!   starts at the largest virtual time seen at the last renewal.
//!
//! - **Work done elsewhere** (dmClock): [`FairQueue::charge`] advances a group's virtual time
//!   for units other backends served, as if this queue had; [`CrossCharge`] charges the rates
//!   the controller answers a backend's reports with, a little at a time.
//!
//! Queues are bounded: a full queue refuses with [`QueueFull`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use thiserror::Error;

use crate::settings::{GroupName, Priority};
use crate::time::Nanos;

/// The smallest `max_rate` (TiKV's default maximum quota).
pub const MAX_RATE_FLOOR: f64 = 10_000.0;
/// Virtual times are pulled down by this much when they would grow past it (TiKV's reset).
const RESET_VT: u64 = (u64::MAX >> 4) / 2;

/// A group's queue is full.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the queue of group {group:?} is full ({limit} items waiting)")]
pub struct QueueFull {
    /// The group.
    pub group: String,
    /// Its queue bound.
    pub limit: usize,
}

/// TiKV's weight of a group with `rate` when the largest rate is `max_rate`.
///
/// ```
/// use tollgate_model::schedule::weight;
/// assert_eq!(weight(5000.0, 10_000.0), 20);
/// assert_eq!(weight(5000.0, 50_000.0), 100);
/// assert_eq!(weight(0.0, 10_000.0), 1);
/// ```
pub fn weight(rate: f64, max_rate: f64) -> u64 {
    if rate <= 0.0 || rate > max_rate {
        return 1;
    }
    ((10.0 * max_rate).min(f64::from(i32::MAX)) / rate).round().max(1.0) as u64
}

#[derive(Debug)]
struct Lane<T> {
    priority: Priority,
    rate: f64,
    weight: u64,
    vt: u64,
    items: VecDeque<(T, f64)>,
}

/// A fair queue of items of type `T`. See the [module documentation](self).
#[derive(Debug)]
pub struct FairQueue<T> {
    lanes: HashMap<GroupName, Lane<T>>,
    max_rate: f64,
    start_vt: u64,
    queue_len_max: usize,
    len: usize,
}

impl<T> FairQueue<T> {
    /// An empty queue; each group holds at most `queue_len_max` items.
    pub fn new(queue_len_max: usize) -> Self {
        Self {
            lanes: HashMap::new(),
            max_rate: MAX_RATE_FLOOR,
            start_vt: 0,
            queue_len_max: queue_len_max.max(1),
            len: 0,
        }
    }

    /// Sets a group's priority and rate (units/s); new groups start at the last renewal's
    /// largest virtual time. A rate above every other raises `max_rate` and every weight.
    pub fn set_group(&mut self, group: &GroupName, priority: Priority, rate: f64) {
        let start = self.start_vt;
        let lane = self.lanes.entry(group.clone()).or_insert_with(|| Lane {
            priority,
            rate,
            weight: 1,
            vt: start,
            items: VecDeque::new(),
        });
        lane.priority = priority;
        lane.rate = rate;
        let max_rate = self.lanes.values().map(|l| l.rate).fold(MAX_RATE_FLOOR, f64::max);
        self.max_rate = max_rate;
        for l in self.lanes.values_mut() {
            l.weight = weight(l.rate, max_rate);
        }
    }

    /// The weight a group has now.
    pub fn weight_of(&self, group: &GroupName) -> Option<u64> {
        self.lanes.get(group).map(|l| l.weight)
    }

    /// Items waiting, in all groups.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Items waiting in `group`'s queue.
    pub fn queued(&self, group: &str) -> usize {
        self.lanes.get(group).map_or(0, |l| l.items.len())
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item` of `cost` units for `group` (known to [`set_group`](Self::set_group), or
    /// added with medium priority and no rate).
    pub fn push(&mut self, group: &GroupName, item: T, cost: f64) -> Result<(), QueueFull> {
        if !self.lanes.contains_key(group) {
            self.set_group(group, Priority::MEDIUM, 0.0);
        }
        let lane = self.lanes.get_mut(group).expect("added above");
        if lane.items.len() >= self.queue_len_max {
            return Err(QueueFull { group: group.to_string(), limit: self.queue_len_max });
        }
        lane.items.push_back((item, cost));
        self.len += 1;
        Ok(())
    }

    /// Takes the next item: the highest priority first, then the smallest virtual time; the
    /// group's virtual time advances by cost × weight.
    pub fn pop(&mut self) -> Option<(GroupName, T)> {
        let (name, _) =
            self.lanes.iter().filter(|(_, l)| !l.items.is_empty()).min_by(|(an, a), (bn, b)| {
                b.priority.cmp(&a.priority).then(a.vt.cmp(&b.vt)).then_with(|| an.cmp(bn))
            })?;
        let name = name.clone();
        let lane = self.lanes.get_mut(&name).expect("chosen above");
        let (item, cost) = lane.items.pop_front().expect("non-empty");
        self.len -= 1;
        let step = ((cost.max(0.0) * lane.weight as f64).round() as u64).max(1);
        self.advance(name.as_ref(), step);
        Some((name, item))
    }

    /// Charges `group` for `units` served on other backends (dmClock's cross-backend term):
    /// its virtual time advances as if this queue had served them. A group this queue does
    /// not know yet is not charged: it will start at the largest virtual time anyway.
    ///
    /// ```
    /// use tollgate_model::schedule::FairQueue;
    /// use tollgate_model::settings::{GroupName, Priority};
    ///
    /// let (a, b) = (GroupName::new("a").unwrap(), GroupName::new("b").unwrap());
    /// let mut q = FairQueue::new(10);
    /// q.set_group(&a, Priority::MEDIUM, 100.0);
    /// q.set_group(&b, Priority::MEDIUM, 100.0);
    /// q.push(&a, "a1", 1.0).unwrap();
    /// q.push(&b, "b1", 1.0).unwrap();
    /// q.charge("a", 5.0); // a was served 5 units elsewhere
    /// assert_eq!(q.pop(), Some((b, "b1")));
    /// ```
    pub fn charge(&mut self, group: &str, units: f64) {
        let Some(lane) = self.lanes.get(group) else { return };
        if !(units.is_finite() && units > 0.0) {
            return;
        }
        let step = (units * lane.weight as f64).round() as u64;
        self.advance(group, step);
    }

    fn advance(&mut self, name: &str, step: u64) {
        let lane = self.lanes.get_mut(name).expect("a known group");
        lane.vt = lane.vt.saturating_add(step);
        if lane.vt > RESET_VT {
            for l in self.lanes.values_mut() {
                l.vt = l.vt.saturating_sub(RESET_VT);
            }
            self.start_vt = self.start_vt.saturating_sub(RESET_VT);
        }
    }

    /// The once-a-second renewal: every group below the largest virtual time moves halfway
    /// toward it; new groups will start there.
    pub fn renew(&mut self) {
        let max = self.lanes.values().map(|l| l.vt).max().unwrap_or(self.start_vt);
        for l in self.lanes.values_mut() {
            if l.vt < max {
                l.vt += (max - l.vt) / 2;
            }
        }
        self.start_vt = max;
    }

    /// Removes every queued item for which `keep` is false (cancelled waiters).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut len = 0;
        for l in self.lanes.values_mut() {
            l.items.retain(|(item, _)| keep(item));
            len += l.items.len();
        }
        self.len = len;
    }
}

/// The least time between two charges of [`CrossCharge::apply`].
pub const CHARGE_EVERY: Duration = Duration::from_millis(10);
/// The most time one charge covers: a queue left alone longer (an idle backend) is charged
/// for this much, since the renewal has evened out its groups meanwhile anyway.
pub const CHARGE_SPAN_MAX: Duration = Duration::from_secs(1);

/// dmClock's cross-backend term, the backend's half: the units/s each group is served at on
/// the other backends (which the controller answers each report with, [`crate::spread`]),
/// charged to a [`FairQueue`] as time passes. It is charged a little at a time, at most every
/// [`CHARGE_EVERY`], rather than at each report: the renewal would otherwise halve whatever
/// lead a report's charge had just given a group over the others.
#[derive(Debug, Default)]
pub struct CrossCharge {
    rates: HashMap<GroupName, f64>,
    last: Option<Nanos>,
}

impl CrossCharge {
    /// Nothing charged yet.
    pub fn new() -> CrossCharge {
        CrossCharge::default()
    }

    /// Takes the latest rates at `now`, in place of the last ones (a group left out is
    /// served nowhere else). What the last ones owe up to `now` is charged first.
    pub fn set_rates<T>(
        &mut self,
        now: Nanos,
        queue: &mut FairQueue<T>,
        rates: impl IntoIterator<Item = (GroupName, f64)>,
    ) {
        self.charge(now, queue);
        self.rates = rates.into_iter().filter(|(_, r)| r.is_finite() && *r > 0.0).collect();
    }

    /// Charges each group's rate for the time since the last charge, if at least
    /// [`CHARGE_EVERY`] has passed.
    pub fn apply<T>(&mut self, now: Nanos, queue: &mut FairQueue<T>) {
        if self.last.is_none_or(|last| now.since(last) >= CHARGE_EVERY) {
            self.charge(now, queue);
        }
    }

    /// The rates charged now: units/s served elsewhere, by group.
    pub fn rates(&self) -> &HashMap<GroupName, f64> {
        &self.rates
    }

    fn charge<T>(&mut self, now: Nanos, queue: &mut FairQueue<T>) {
        let span = self.last.map_or(Duration::ZERO, |last| now.since(last)).min(CHARGE_SPAN_MAX);
        self.last = Some(now);
        let span = span.as_secs_f64();
        if span > 0.0 {
            for (group, rate) in &self.rates {
                queue.charge(group.as_ref(), rate * span);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    #[test]
    fn tikv_weights() {
        let mut q: FairQueue<()> = FairQueue::new(10);
        q.set_group(&g("a"), Priority::MEDIUM, 5000.0);
        assert_eq!(q.weight_of(&g("a")), Some(20));
        q.set_group(&g("big"), Priority::MEDIUM, 50_000.0);
        assert_eq!(q.weight_of(&g("a")), Some(100));
        assert_eq!(q.weight_of(&g("big")), Some(10));
        q.set_group(&g("zero"), Priority::MEDIUM, 0.0);
        assert_eq!(q.weight_of(&g("zero")), Some(1));
    }

    #[test]
    fn priority_is_absolute() {
        let mut q = FairQueue::new(100);
        q.set_group(&g("low"), Priority::LOW, 1.0);
        q.set_group(&g("med"), Priority::MEDIUM, 1.0);
        q.set_group(&g("high"), Priority::HIGH, 1.0);
        for i in 0..5 {
            q.push(&g("low"), ("low", i), 1.0).unwrap();
            q.push(&g("med"), ("med", i), 1.0).unwrap();
            q.push(&g("high"), ("high", i), 1.0).unwrap();
        }
        let order: Vec<&str> = std::iter::from_fn(|| q.pop()).map(|(_, (p, _))| p).collect();
        assert_eq!(order, [["high"; 5], ["med"; 5], ["low"; 5]].concat());
    }

    #[test]
    fn service_follows_the_rates() {
        let mut q = FairQueue::new(100_000);
        q.set_group(&g("one"), Priority::MEDIUM, 1000.0);
        q.set_group(&g("two"), Priority::MEDIUM, 2000.0);
        for _ in 0..10_000 {
            q.push(&g("one"), (), 1.0).unwrap();
            q.push(&g("two"), (), 1.0).unwrap();
        }
        let mut served = HashMap::new();
        for i in 0..10_000 {
            if i % 100 == 0 {
                q.renew();
            }
            let (name, ()) = q.pop().unwrap();
            *served.entry(name).or_insert(0u32) += 1;
        }
        let ratio = f64::from(served[&g("two")]) / f64::from(served[&g("one")]);
        assert!((ratio - 2.0).abs() <= 0.1, "{served:?}");
    }

    #[test]
    fn a_returning_group_does_not_starve_the_others() {
        let mut q = FairQueue::new(100_000);
        q.set_group(&g("busy"), Priority::MEDIUM, 1000.0);
        for _ in 0..5000 {
            q.push(&g("busy"), (), 1.0).unwrap();
        }
        for _ in 0..2000 {
            q.pop();
        }
        q.renew();
        // A newcomer starts at the largest virtual time, not at zero: both are served.
        q.set_group(&g("new"), Priority::MEDIUM, 1000.0);
        for _ in 0..1000 {
            q.push(&g("new"), (), 1.0).unwrap();
        }
        let mut busy = 0;
        for _ in 0..100 {
            if q.pop().unwrap().0 == g("busy") {
                busy += 1;
            }
        }
        assert!((40..=60).contains(&busy), "busy got {busy} of 100");
    }

    #[test]
    fn a_slow_group_is_still_served() {
        let mut q = FairQueue::new(100_000);
        q.set_group(&g("slow"), Priority::MEDIUM, 10.0); // weight 10000
        q.set_group(&g("fast"), Priority::MEDIUM, 10_000.0); // weight 10
        for _ in 0..20_000 {
            q.push(&g("slow"), (), 1.0).unwrap();
            q.push(&g("fast"), (), 1.0).unwrap();
        }
        let mut slow = 0;
        for i in 0..20_000 {
            if i % 1000 == 0 {
                q.renew();
            }
            if q.pop().unwrap().0 == g("slow") {
                slow += 1;
            }
        }
        assert!(slow >= 2, "slow got {slow}");
    }

    #[test]
    fn full_queues_refuse() {
        let mut q = FairQueue::new(2);
        q.push(&g("a"), 1, 1.0).unwrap();
        q.push(&g("a"), 2, 1.0).unwrap();
        let e = q.push(&g("a"), 3, 1.0).unwrap_err();
        assert_eq!(e.to_string(), "the queue of group \"a\" is full (2 items waiting)");
        q.retain(|&i| i != 1);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(), Some((g("a"), 2)));
    }
}
