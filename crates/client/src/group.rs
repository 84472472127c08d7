//! A group as one process sees it: how it admits (its limiter), what it counted, and the
//! table of groups a handle serves.
//!
//! Admission touches only the group's own atomics. What feeds the limiter depends on the mode
//! (the embedded engine, a controller's grants, or a pool shared through Redis), and is done
//! by the mode's own module through [`Groups`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arc_swap::ArcSwap;
use tollgate_model::bucket::Bucket;
use tollgate_model::class::RequestClass;
use tollgate_model::cost::Consumption;
use tollgate_model::demand::Counts;
use tollgate_model::epoch::EpochShare;
use tollgate_model::settings::{DEFAULT_GROUP, DroppedWork, GroupName, GroupSettings, check_group_name};
use tollgate_model::time::Nanos;

use crate::clock::ClockSource;
use crate::error::AcquireError;
use crate::names::{HasName, NameMap, ShortName};
use crate::tally::{self, Counters, HasCounters, Stash, Tally, Totals};

/// Units are counted in millionths, so fractional costs (0.475 RU) add up exactly enough.
#[inline]
pub(crate) fn micros(units: f64) -> u64 {
    // Adding a half and truncating rounds without a libm call (costs are never negative),
    // through i64, whose conversion is one instruction (and its range checks). A shortcut for
    // a cost of one gave the same code: the compiler folds it, the conversion giving the same.
    (units * 1e6 + 0.5) as i64 as u64
}

pub(crate) fn units(micros: u64) -> f64 {
    micros as f64 / 1e6
}

/// `x` (not negative) as the largest `f32` not above it, `f32::MAX` where it is larger.
fn round_down_f32(x: f64) -> f32 {
    let near = x as f32;
    if !near.is_finite() {
        return f32::MAX;
    }
    if f64::from(near) > x { near.next_down() } else { near }
}

/// What a group's settings tell its clients to carry out themselves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    /// What dropped work does.
    pub(crate) dropped: DroppedWork,
    /// Over how long a debt is paid back.
    pub(crate) debt_repay: std::time::Duration,
    /// Shadow mode: never refuse, count what would have been refused.
    pub(crate) shadow: bool,
    /// The share of the burst kept for critical work.
    pub(crate) critical_reserve: f64,
    /// The most requests this process may hold in flight at once (`None`: no limit).
    pub(crate) in_flight: Option<u32>,
}

impl Policy {
    /// The policy `settings` give, in shadow mode too when `shadow` (the node's).
    pub(crate) fn of(settings: &GroupSettings, shadow: bool) -> Policy {
        Policy {
            dropped: settings.dropped(),
            debt_repay: settings.debt_repay(),
            shadow: settings.shadow() || shadow,
            critical_reserve: settings.critical_reserve(),
            in_flight: settings.max_in_flight(),
        }
    }
}

/// What taking an in-flight slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The group has no in-flight quota: nothing was taken.
    Unlimited,
    /// A slot was taken: the permit gives it back.
    Taken,
    /// Every slot of this process's share is held.
    Full,
}

/// How a group admits, as a mode makes it.
#[derive(Debug)]
pub(crate) enum LimiterState {
    /// A token bucket, fed by the engine's grants (embedded or remote).
    Bucket(Bucket),
    /// Store mode: a share of a pool agreed with other clients through Redis (boxed: a
    /// bucket is what most groups hold).
    Epoch(Box<EpochShare>),
}

/// How a group admits, borrowed from it: see [`Group::limiter`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limiter<'a> {
    Bucket(&'a Bucket),
    Epoch(&'a EpochShare),
}

/// One group's state.
///
/// Laid out for admission by name with thousands of groups, most of them out of the core's
/// caches (`repr(C)`, aligned to a cache line): everything such an admission reads or writes
/// sits on the state's second line, so it waits for one line, as governor's keyed limiter
/// does for its slot. That line holds the bucket's last 32 bytes (its time and rate: see
/// [`Bucket::ADMISSION_OFFSET`]), the flags, the name's short form (a name of up to 16
/// bytes is compared there), the ceiling a cost is checked against and the shared tally's
/// admissions (a thread's tallies know the group by its counters' address, which takes no
/// load). The first line holds the name, the weak pointer to itself and the bucket's other
/// fields; the reference count is on a line before it (an admission by name takes no
/// reference).
#[repr(C, align(64))]
pub(crate) struct Group {
    pub(crate) name: GroupName,
    /// Itself, weakly: counting passes it to a thread's tallies (read only when a thread
    /// takes the group into its cache).
    me: Weak<Group>,
    /// Store mode's share of a pool, where the group has one (then `bucket` is unused).
    epoch: Option<Box<EpochShare>>,
    bucket: Bucket,
    /// Asked for by name or handle at least once: a controller is told of it.
    used: AtomicBool,
    /// Set while a debt is being paid back: the bucket then refills slower than granted.
    repaying: AtomicBool,
    /// Whether every admission takes the general path ([`Inner::admit`](crate::inner::Inner)):
    /// a store-mode group (it admits through `epoch`), a group in shadow mode, or every group
    /// of a process whose settings turn throttling off.
    general: AtomicBool,
    /// `name`'s short form, what a look-up by name compares.
    short_name: ShortName,
    /// `burst_ceiling` rounded down to an `f32` (`f32::MAX` where it is larger): a finite
    /// bound the hot path checks a cost against in one comparison, in four bytes. A cost
    /// above it and within `burst_ceiling` takes the longer path, which checks that.
    pub(crate) quick_ceiling: f32,
    pub(crate) counters: Counters,
    /// Settlements: units added to (debt) or taken from (returned) admitted costs.
    pub(crate) settled_up_micro: AtomicU64,
    pub(crate) settled_down_micro: AtomicU64,
    /// Units waiting in `acquire` now.
    pub(crate) waiting_micro: AtomicU64,
    /// Units the application says it has queued for the group, outside Tollgate.
    pub(crate) queued_micro: AtomicU64,
    /// The largest cost a refusal said the bucket's burst could not hold (f64 bits): a grant
    /// is applied with at least this burst, so any request can be admitted in time.
    pub(crate) largest_cost: AtomicU64,
    /// The largest cost refused while the group waited for its first grant (f64 bits): what
    /// its bucket starts holding then ([`first_request`](Self::first_request)).
    pub(crate) first_cost: AtomicU64,
    pub(crate) clock: Arc<ClockSource>,
    /// The largest cost the group's bucket can ever hold (infinite where a controller decides).
    pub(crate) burst_ceiling: f64,
    /// Current allowance (units/s) and measured demand, as f64 bits.
    pub(crate) allowance: AtomicU64,
    pub(crate) demand: AtomicU64,
    /// Dropped work counts as consumed (else it is returned).
    count_dropped: AtomicBool,
    /// Work admitted and then dropped: requests, and units (millionths).
    pub(crate) dropped: AtomicU64,
    pub(crate) dropped_micro: AtomicU64,
    /// Over how long a debt is paid back, in nanoseconds (0: at once, blocking).
    debt_repay_ns: AtomicU64,
    repay: Mutex<Repay>,
    /// Shadow mode: admit what would be refused, counting it in `would_refuse`.
    shadow: AtomicBool,
    /// The share of the burst kept for critical work, as f64 bits (see
    /// [`tollgate_model::class`]).
    critical_reserve: AtomicU64,
    /// Critical and sheddable requests admitted and refused (normal ones are the rest of
    /// the group's counts).
    pub(crate) class_counts: [[AtomicU64; 2]; 2],
    /// The process's settings turn throttling off: admit everything (set once).
    open: bool,
    /// Requests admitted in shadow mode that would have been refused.
    pub(crate) would_refuse: AtomicU64,
    /// What settled requests did, in detail (running totals).
    detail: Mutex<Consumption>,
    /// Set once `detail` is first added to: until then it is read without its lock.
    has_detail: AtomicBool,
    /// The most requests this process may hold in flight (`u32::MAX`: no in-flight quota),
    /// how many it holds, and the most it held or tried to hold since its last report.
    slot_cap: AtomicU32,
    slots_held: AtomicU32,
    slots_asked: AtomicU32,
    /// Tries refused for want of a slot since the last report.
    slots_short: AtomicU32,
    /// Wakes a caller of `acquire` waiting for a slot when one is given back or the share
    /// grows.
    slot_freed: tokio::sync::Notify,
    /// Whether the group has quotas per window: admission then takes from `allot`.
    allotted: AtomicBool,
    /// Set when the allotment ran out while the controller had units left: the next report
    /// of the group is due at once.
    allot_wanted: AtomicBool,
    allot: Mutex<Allot>,
}

/// What this process holds of a group's quotas in the window under way (see
/// [`tollgate_model::engine::Allotment`]).
#[derive(Debug, Default)]
struct Allot {
    window: u64,
    given: f64,
    used: f64,
    /// After this the allotment may not be used (`None`: it never ends).
    ends: Option<Nanos>,
    /// Units the controller had left beyond every allotment, at its last answer.
    left: f64,
    /// While a quota is spent: when it comes back.
    reset_at: Option<Nanos>,
}

/// What taking a cost from a group's allotment found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Allotted {
    /// The group has no quota per window: nothing was taken.
    Unlimited,
    /// Taken: give it back if the limiter then refuses.
    Taken,
    /// Not enough: retry after this long. With `ask`, the controller has units left (or the
    /// window ended): the group's next report is due at once.
    Short { retry: std::time::Duration, ask: bool },
}

/// An allotment as a mode hands it to a group: the engine's, read from an answer or a grant.
pub(crate) type AllotmentIn = tollgate_model::engine::Allotment;

/// A debt being paid back from the refill: the bucket runs at the granted rate less `rate`
/// until `owed` is paid.
#[derive(Debug, Default)]
struct Repay {
    owed: f64,
    /// Units/s taken from the refill for it.
    rate: f64,
    /// When `owed` was last brought up to date.
    since: Nanos,
    /// The grant the bucket would have without the debt.
    granted: f64,
    burst: f64,
}

/// At most this share of the granted rate goes to paying a debt back, so admissions go on;
/// what a period cannot pay at it blocks.
const REPAY_SHARE_MAX: f64 = 0.5;

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Group {
    pub(crate) fn new(
        name: GroupName,
        limiter: LimiterState,
        clock: &Arc<ClockSource>,
        burst_ceiling: f64,
        open: bool,
    ) -> Arc<Group> {
        let (bucket, epoch) = match limiter {
            LimiterState::Bucket(bucket) => (bucket, None),
            LimiterState::Epoch(share) => (Bucket::new(f64::INFINITY, f64::INFINITY, Nanos(0)), Some(share)),
        };
        Arc::new_cyclic(|me| Group {
            short_name: ShortName::of(name.as_str()),
            name,
            general: AtomicBool::new(epoch.is_some() || open),
            shadow: AtomicBool::new(false),
            critical_reserve: AtomicU64::new(0f64.to_bits()),
            class_counts: Default::default(),
            open,
            would_refuse: AtomicU64::new(0),
            bucket,
            epoch,
            counters: Counters::new(),
            settled_up_micro: AtomicU64::new(0),
            settled_down_micro: AtomicU64::new(0),
            waiting_micro: AtomicU64::new(0),
            queued_micro: AtomicU64::new(0),
            largest_cost: AtomicU64::new(0f64.to_bits()),
            first_cost: AtomicU64::new(0f64.to_bits()),
            clock: clock.clone(),
            burst_ceiling,
            quick_ceiling: round_down_f32(burst_ceiling),
            allowance: AtomicU64::new(0f64.to_bits()),
            demand: AtomicU64::new(0f64.to_bits()),
            used: AtomicBool::new(false),
            count_dropped: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            dropped_micro: AtomicU64::new(0),
            debt_repay_ns: AtomicU64::new(0),
            repaying: AtomicBool::new(false),
            repay: Mutex::new(Repay::default()),
            detail: Mutex::new(Consumption::default()),
            has_detail: AtomicBool::new(false),
            slot_cap: AtomicU32::new(u32::MAX),
            slots_held: AtomicU32::new(0),
            slots_asked: AtomicU32::new(0),
            slots_short: AtomicU32::new(0),
            slot_freed: tokio::sync::Notify::new(),
            allotted: AtomicBool::new(false),
            allot_wanted: AtomicBool::new(false),
            allot: Mutex::new(Allot::default()),
            me: me.clone(),
        })
    }

    /// How the group admits.
    #[inline(always)]
    pub(crate) fn limiter(&self) -> Limiter<'_> {
        match &self.epoch {
            Some(share) => Limiter::Epoch(share),
            None => Limiter::Bucket(&self.bucket),
        }
    }

    /// The group's bucket, when it admits through one.
    #[inline(always)]
    pub(crate) fn bucket(&self) -> Option<&Bucket> {
        self.epoch.is_none().then_some(&self.bucket)
    }

    /// The group's bucket when an admission may take the quick path (a bucket group, not in
    /// shadow mode, throttling on): reads only the admission line.
    #[inline(always)]
    pub(crate) fn quick_bucket(&self) -> Option<&Bucket> {
        (!self.general.load(Ordering::Relaxed)).then_some(&self.bucket)
    }

    /// Whether the group is in shadow mode.
    #[inline]
    pub(crate) fn is_shadow(&self) -> bool {
        self.shadow.load(Ordering::Relaxed)
    }

    /// Whether the process's settings turn throttling off.
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    pub(crate) fn self_arc(&self) -> Arc<Group> {
        self.me.upgrade().expect("a group is alive while borrowed")
    }

    pub(crate) fn consumed(&self, totals: &Totals) -> f64 {
        let up = totals.admitted_micro + self.settled_up_micro.load(Ordering::Relaxed);
        units(up.saturating_sub(self.settled_down_micro.load(Ordering::Relaxed)))
    }

    /// Units asked for in all, admitted or not: what shows a group still asked.
    pub(crate) fn asked(&self) -> f64 {
        let t = self.counters.totals();
        units(t.admitted_micro + t.throttled_micro)
    }

    /// The running totals the demand meter reads.
    pub(crate) fn counts(&self) -> Counts {
        let t = self.counters.totals();
        Counts {
            asked: units(t.admitted_micro + t.throttled_micro),
            consumed: self.consumed(&t),
            admitted_units: units(t.admitted_micro),
            unthrottled: units(t.unthrottled_micro),
            admitted: t.admitted,
            throttled: t.throttled,
            waited: t.waited,
            detail: self.detail(),
            would_refuse: self.would_refuse.load(Ordering::Relaxed),
            classes: std::array::from_fn(|c| {
                std::array::from_fn(|k| self.class_counts[c][k].load(Ordering::Relaxed))
            }),
        }
    }

    /// What settled requests did, in detail, so far. Most groups never settle with usage: a
    /// pass over many groups then takes no lock per group.
    pub(crate) fn detail(&self) -> Consumption {
        if !self.has_detail.load(Ordering::Acquire) {
            return Consumption::default();
        }
        *self.detail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds what a settled request did to [`detail`](Self::detail).
    pub(crate) fn add_detail(&self, detail: &Consumption) {
        self.detail.lock().unwrap_or_else(PoisonError::into_inner).add(detail);
        // After the counts it flags (release): a reader that sees it sees them.
        self.has_detail.store(true, Ordering::Release);
    }

    /// Units waiting now: in `acquire`, and queued by the application.
    pub(crate) fn waiting(&self) -> f64 {
        units(self.waiting_micro.load(Ordering::Relaxed) + self.queued_micro.load(Ordering::Relaxed))
    }

    /// Counts on this thread's tally for the group.
    #[inline(always)]
    pub(crate) fn record(&self, f: impl Fn(&Tally)) {
        tally::record(self, &self.me, f);
    }

    /// Counts on the group's shared tally, not looking in this thread's cache (for an
    /// admission the cache has just passed by: a second look would take the group in).
    pub(crate) fn record_shared(&self, f: impl FnOnce(&Tally)) {
        tally::record_shared(&self.counters, f);
    }

    /// Runs `f` on this thread's tally and stash for the group (`None` while the thread
    /// exits).
    #[inline]
    pub(crate) fn with_local<R>(&self, f: impl FnOnce(&Tally, &mut Stash) -> R) -> Option<R> {
        tally::with_local(self, &self.me, f)
    }

    /// Sets the bucket's rate and burst (the burst at least the largest cost refused for want
    /// of it), and records the allowance. While a debt is being paid back, the bucket runs
    /// slower than `rate` by what goes to it.
    pub(crate) fn set_rate(&self, rate: f64, burst: f64, now: Nanos) {
        if let Some(bucket) = self.bucket() {
            let largest = f64::from_bits(self.largest_cost.load(Ordering::Relaxed));
            let burst = if rate.is_finite() { burst.max(largest) } else { burst };
            if self.repaying.load(Ordering::Acquire) {
                let mut r = self.repay.lock().unwrap_or_else(PoisonError::into_inner);
                r.granted = rate;
                r.burst = burst;
                self.repay_progress(&mut r, bucket, now);
            } else {
                bucket.set_rate(rate, burst, now);
            }
        }
        self.allowance.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// Takes the policies the group's settings give (see [`Policy`]).
    pub(crate) fn set_policy(&self, p: Policy) {
        self.count_dropped.store(p.dropped == DroppedWork::Count, Ordering::Relaxed);
        let ns = u64::try_from(p.debt_repay.as_nanos()).unwrap_or(u64::MAX);
        self.debt_repay_ns.store(ns, Ordering::Relaxed);
        self.shadow.store(p.shadow, Ordering::Relaxed);
        let reserve = if p.critical_reserve.is_finite() { p.critical_reserve.max(0.0) } else { 0.0 };
        self.critical_reserve.store(reserve.to_bits(), Ordering::Relaxed);
        let cap = p.in_flight.unwrap_or(u32::MAX);
        if self.slot_cap.swap(cap, Ordering::AcqRel) < cap {
            self.slot_freed.notify_waiters();
        }
        // Normal work must leave the reserve, and a slot or an allotment is taken: past the
        // quick path.
        let general = self.epoch.is_some()
            || p.shadow
            || self.open
            || reserve > 0.0
            || p.in_flight.is_some()
            || self.allotted.load(Ordering::Relaxed);
        self.general.store(general, Ordering::Relaxed);
    }

    /// Takes `cost` from the group's allotment at `now`, if it has quotas per window.
    pub(crate) fn take_allotment(&self, cost: f64, now: Nanos) -> Allotted {
        if !self.allotted.load(Ordering::Acquire) {
            return Allotted::Unlimited;
        }
        let mut a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        let live = a.ends.is_none_or(|end| now < end);
        // Costs are added as they come: a tolerance of a millionth for their sum's rounding.
        if live && a.used + cost <= a.given + 1e-6 {
            a.used += cost;
            return Allotted::Taken;
        }
        let ask = !live || a.left > 0.0;
        let retry = match a.reset_at {
            _ if ask => std::time::Duration::ZERO,
            Some(at) => at.since(now),
            // Others hold what is left: some may come back at their next exchanges.
            None => std::time::Duration::from_secs(1),
        };
        drop(a);
        if ask {
            self.allot_wanted.store(true, Ordering::Release);
        }
        Allotted::Short { retry, ask }
    }

    /// Gives back `cost` taken from the allotment (the limiter refused the request).
    pub(crate) fn give_back_allotment(&self, cost: f64) {
        let mut a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        a.used = (a.used - cost).max(0.0);
    }

    /// Marks the group as wanting more of its allotment (its next report or take asks).
    pub(crate) fn want_allotment(&self) {
        self.allot_wanted.store(true, Ordering::Release);
    }

    /// Whether the group's allotment ran out with units left at the controller (reset: the
    /// report this asks for is being made).
    pub(crate) fn take_allot_wanted(&self) -> bool {
        self.allot_wanted.swap(false, Ordering::AcqRel)
    }

    /// What the group holds of its allotment, for a report (`None`: no quota). More than it
    /// needs for `keep` units is given back first: it holds at most that unspent.
    pub(crate) fn allotment_report(&self, keep: f64) -> Option<tollgate_model::engine::QuotaHeld> {
        if !self.allotted.load(Ordering::Acquire) {
            return None;
        }
        let mut a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = keep.max(tollgate_model::engine::ALLOTMENT_MIN);
        if a.given - a.used > keep {
            a.given = a.used + keep;
        }
        Some(tollgate_model::engine::QuotaHeld {
            window: a.window,
            given: a.given,
            used: a.used,
            lasts: None,
        })
    }

    /// Takes an allotment (`None`: the group has no quota per window any more), given in
    /// answer to a request sent at `sent` and applied at `now`: its time runs from `sent`, so
    /// it ends no later than the controller's window.
    pub(crate) fn set_allotment(&self, given: Option<&AllotmentIn>, sent: Nanos, now: Nanos) {
        let Some(x) = given else {
            if self.allotted.swap(false, Ordering::AcqRel) {
                *self.allot.lock().unwrap_or_else(PoisonError::into_inner) = Allot::default();
            }
            return;
        };
        let mut a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.allotted.load(Ordering::Acquire) || a.window != x.window {
            // A new window: what was held of the last one lapsed with it.
            (a.window, a.given, a.used) = (x.window, 0.0, 0.0);
        }
        if x.add.is_finite() && x.add > 0.0 {
            a.given += x.add;
        }
        a.ends = x.ends_in.map(|d| sent.after(d));
        a.left = if x.left.is_finite() { x.left.max(0.0) } else { 0.0 };
        a.reset_at = x.reset_in.map(|d| now.after(d));
        drop(a);
        if !self.allotted.swap(true, Ordering::AcqRel) {
            self.general.store(true, Ordering::Relaxed);
        }
    }

    /// The units this process may still admit of the group's quotas, and what the controller
    /// had left beyond every allotment (`None`: no quota per window); and while a quota is
    /// spent, how long until it comes back.
    pub(crate) fn allotment(&self, now: Nanos) -> Option<(f64, f64, Option<std::time::Duration>)> {
        if !self.allotted.load(Ordering::Acquire) {
            return None;
        }
        let a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        let live = a.ends.is_none_or(|end| now < end);
        let mine = if live { (a.given - a.used).max(0.0) } else { 0.0 };
        Some((mine, a.left, a.reset_at.map(|at| at.since(now))))
    }

    /// The window of the group's last allotment, and what it holds of it unused (whether or
    /// not the window has ended).
    pub(crate) fn allotment_unused(&self) -> (u64, f64) {
        let a = self.allot.lock().unwrap_or_else(PoisonError::into_inner);
        (a.window, (a.given - a.used).max(0.0))
    }

    /// When the window of the group's allotment ends (`None`: no quota per window, or a
    /// quota over the group's life alone).
    pub(crate) fn allotment_ends(&self) -> Option<Nanos> {
        if !self.allotted.load(Ordering::Acquire) {
            return None;
        }
        self.allot.lock().unwrap_or_else(PoisonError::into_inner).ends
    }

    /// Takes an in-flight slot, if the group has an in-flight quota and this process's share
    /// has one free. A try counts towards what the process asks of the quota.
    pub(crate) fn take_slot(&self) -> Slot {
        let cap = self.slot_cap.load(Ordering::Acquire);
        if cap == u32::MAX {
            return Slot::Unlimited;
        }
        let mut held = self.slots_held.load(Ordering::Relaxed);
        loop {
            self.slots_asked.fetch_max(held.saturating_add(1), Ordering::Relaxed);
            if held >= cap {
                // Each refusal asks for one more: a share grows with its refused work at
                // once, not a slot per exchange.
                self.slots_short.fetch_add(1, Ordering::Relaxed);
                return Slot::Full;
            }
            match self.slots_held.compare_exchange_weak(held, held + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Slot::Taken,
                Err(now) => held = now,
            }
        }
    }

    /// Gives an in-flight slot back, waking one caller waiting for it.
    pub(crate) fn give_slot(&self) {
        self.slots_held.fetch_sub(1, Ordering::AcqRel);
        self.slot_freed.notify_one();
    }

    /// Whether the group has an in-flight quota and this process's share is all held.
    pub(crate) fn slots_full(&self) -> bool {
        let cap = self.slot_cap.load(Ordering::Acquire);
        cap != u32::MAX && self.slots_held.load(Ordering::Acquire) >= cap
    }

    /// Waits until a slot may be free (given back, or the share grown).
    pub(crate) fn slot_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.slot_freed.notified()
    }

    /// The in-flight slots held now, and the most held or tried since the last call (reset
    /// to what is held now): what a report says. `None` without an in-flight quota.
    pub(crate) fn take_slot_report(&self) -> Option<(u32, u32)> {
        if self.slot_cap.load(Ordering::Relaxed) == u32::MAX {
            return None;
        }
        let held = self.slots_held.load(Ordering::Relaxed);
        let short = self.slots_short.swap(0, Ordering::Relaxed);
        let asked = self.slots_asked.swap(held, Ordering::Relaxed).max(held.saturating_add(short));
        Some((held, asked.min(tollgate_model::settings::MAX_IN_FLIGHT)))
    }

    /// This process's share of the in-flight quota and what it holds of it (`None`: no
    /// in-flight quota).
    pub(crate) fn in_flight(&self) -> Option<(u32, u32)> {
        let cap = self.slot_cap.load(Ordering::Relaxed);
        (cap != u32::MAX).then(|| (self.slots_held.load(Ordering::Relaxed), cap))
    }

    /// The share of the burst `class` must leave (0 to 1).
    #[inline]
    pub(crate) fn floor(&self, class: RequestClass) -> f64 {
        class.floor(f64::from_bits(self.critical_reserve.load(Ordering::Relaxed)))
    }

    /// Counts a request of `class` admitted or refused (critical and sheddable only).
    pub(crate) fn count_class(&self, class: RequestClass, admitted: bool) {
        let row = match class {
            RequestClass::Critical => 0,
            RequestClass::Normal => return,
            RequestClass::Sheddable => 1,
        };
        self.class_counts[row][usize::from(!admitted)].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether dropped work counts as consumed.
    pub(crate) fn counts_dropped(&self) -> bool {
        self.count_dropped.load(Ordering::Relaxed)
    }

    /// Charges `units` beyond what was admitted (a dearer settlement). What the tokens held
    /// cover is taken at once; the rest is debt, paid back from the refill over the group's
    /// period while admissions go on at the reduced rate, or at once (every admission waiting
    /// for it) when the period is zero or the bucket is not a plain finite one.
    pub(crate) fn charge(&self, bucket: &Bucket, units: f64, now: Nanos) {
        let period = self.debt_repay_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let rate = bucket.rate();
        if period <= 0.0 || !(rate.is_finite() && rate > 0.0) {
            bucket.charge(units, now);
            return;
        }
        let mut r = self.repay.lock().unwrap_or_else(PoisonError::into_inner);
        let covered = units.min(bucket.available(now).max(0.0));
        bucket.charge(covered, now);
        let rest = units - covered;
        if rest <= 0.0 {
            return;
        }
        if !self.repaying.load(Ordering::Acquire) {
            *r = Repay { granted: rate, burst: bucket.burst(), since: now, ..Repay::default() };
            self.repaying.store(true, Ordering::Release);
        } else {
            self.repay_progress(&mut r, bucket, now);
        }
        r.owed += rest;
        // No more is owed than half the refill pays in a period: beyond it, a group whose
        // requests keep turning out dearer would be admitted ever more on credit. The excess
        // is charged at once, blocking as a debt without a period does.
        let cap = period * r.granted * REPAY_SHARE_MAX;
        if r.owed > cap {
            bucket.charge(r.owed - cap, now);
            r.owed = cap;
        }
        r.rate = r.owed / period;
        r.since = now;
        self.repay_progress(&mut r, bucket, now);
    }

    /// Brings a debt up to date at `now` (what the reduced refill has paid since), and sets
    /// the bucket's rate: reduced while anything is owed, the grant once it is paid.
    fn repay_progress(&self, r: &mut Repay, bucket: &Bucket, now: Nanos) {
        let taking = r.rate.min(r.granted * REPAY_SHARE_MAX);
        if taking > 0.0 && taking.is_finite() {
            r.owed -= taking * now.since(r.since).as_secs_f64();
        }
        r.since = now;
        if r.owed > 1e-9 && r.granted.is_finite() && r.granted > 0.0 {
            bucket.set_rate(r.granted - r.rate.min(r.granted * REPAY_SHARE_MAX), r.burst, now);
            return;
        }
        // Paid, or the grant changed to one a debt cannot be paid from: unlimited forgives
        // it, closed keeps it owed in the bucket.
        bucket.set_rate(r.granted, r.burst, now);
        if r.granted == 0.0 && r.owed > 1e-9 {
            bucket.charge(r.owed, now);
        }
        r.owed = 0.0;
        r.rate = 0.0;
        self.repaying.store(false, Ordering::Release);
    }

    /// Units of debt still being paid back (0 when none).
    pub(crate) fn debt(&self, now: Nanos) -> f64 {
        if !self.repaying.load(Ordering::Acquire) {
            return 0.0;
        }
        let Some(bucket) = self.bucket() else { return 0.0 };
        let mut r = self.repay.lock().unwrap_or_else(PoisonError::into_inner);
        self.repay_progress(&mut r, bucket, now);
        r.owed.max(0.0)
    }

    /// On a refusal: a debt paid back by now stops slowing the bucket. One load when there
    /// is no debt.
    #[inline]
    pub(crate) fn check_debt(&self, now: Nanos) {
        if self.repaying.load(Ordering::Acquire) {
            self.settle_debt(now);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_debt(&self, now: Nanos) {
        let _ = self.debt(now);
    }

    /// Marks the group as asked for (cheap when it already is); says whether this is the
    /// first time.
    #[inline]
    pub(crate) fn mark_used(&self) -> bool {
        !self.used.load(Ordering::Relaxed) && !self.used.swap(true, Ordering::Relaxed)
    }

    /// Whether the group was ever asked for.
    pub(crate) fn is_used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// What a bucket started by a first grant holds: one request, the largest refused while
    /// it waited for the grant (at least one unit).
    pub(crate) fn first_request(&self) -> f64 {
        f64::from_bits(self.first_cost.load(Ordering::Relaxed)).max(1.0)
    }

    /// The current allowance, units/s.
    pub(crate) fn allowance(&self) -> f64 {
        f64::from_bits(self.allowance.load(Ordering::Relaxed))
    }
}

impl HasCounters for Group {
    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn return_stash(&self, stash: Stash) {
        if let Some(bucket) = self.bucket() {
            bucket.refund(stash.units);
        }
    }
}

/// Makes a new group's state; the mode decides its limiter.
pub(crate) type MakeGroup = dyn Fn(GroupName, &GroupSettings) -> Arc<Group> + Send + Sync;

/// Names to groups (see [`NameMap`]).
type Map = NameMap<Arc<Group>>;

/// A group is found by its own name: the table keeps no copy of it.
impl HasName for Arc<Group> {
    #[inline(always)]
    fn name(&self) -> &GroupName {
        &self.name
    }

    #[inline(always)]
    fn short_name(&self) -> ShortName {
        self.short_name
    }
}

/// The groups a handle serves: looked up lock-free, inserted under a lock, bounded. Names past
/// the bound share the `default` group's state.
///
/// The lock-free map is copied on write, so new names first go to a small locked map beside
/// it, and are moved into a new copy once a quarter as many lookups as it holds names have
/// needed the lock: taking in N names one by one then costs O(N) in all, not a copy of the
/// whole map per name, and a name used often soon needs no lock.
pub(crate) struct Groups {
    map: ArcSwap<Map>,
    /// Which table this is (for threads' copies of maps: see [`LOCAL_MAP`]).
    id: u64,
    /// Counts the maps stored in `map`: a thread's copy is current while this is unchanged.
    generation: AtomicU64,
    recent: Mutex<Recent>,
    /// Every distinct group, sorted by name, and the table's generation and number of recent
    /// names it was made at: a reallocation lists the groups every pass, and with 100,000 of
    /// them a sort each time was a good part of the pass.
    sorted: Mutex<Sorted>,
    /// The `default` group's state: shared by names beyond the tracking limit.
    overflow: Arc<Group>,
    configured: HashMap<Box<str>, GroupSettings>,
    /// The patterns among the configured names, most specific first.
    patterns: Vec<(Box<str>, GroupSettings)>,
    max: usize,
    make: Box<MakeGroup>,
}

/// Groups made since the lock-free map was last copied, and the lookups that took the lock
/// since then.
#[derive(Default)]
struct Recent {
    map: Map,
    slow_lookups: usize,
}

/// Every distinct group of a table, sorted by name, and when it was made: the table's
/// generation and its number of recent names then.
#[derive(Default)]
struct Sorted {
    at: Option<(u64, usize)>,
    list: Listed,
}

/// Every distinct group of a table, sorted by name: see [`Groups::listed`].
#[derive(Default, Clone)]
pub(crate) struct Listed(Arc<Vec<Arc<Group>>>);

impl Listed {
    /// Every group.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Group> {
        self.0.iter().map(|g| &**g)
    }

    /// Every group asked for at least once: what a reallocation or an exchange reports (a
    /// configured group nobody asked for yet costs one look).
    pub(crate) fn used(&self) -> impl Iterator<Item = &Group> {
        self.all().filter(|g| g.is_used())
    }
}

/// Lookups under the lock before the recent names move into the lock-free map, at the least.
const MERGE_AFTER_MIN: usize = 64;

/// Tables' ids: never reused, so a thread's copy of a dropped table's map is never taken for
/// a new table's.
static NEXT_TABLE: AtomicU64 = AtomicU64::new(1);

/// Which map a thread's copy is: the table's id, the table's generation when it was taken,
/// and the map, which [`KEPT_MAP`] keeps alive.
#[derive(Clone, Copy)]
struct MapCopy {
    table: u64,
    generation: u64,
    map: *const Map,
}

impl MapCopy {
    /// No copy (table ids start at one).
    const NONE: MapCopy = MapCopy { table: 0, generation: 0, map: std::ptr::null() };
}

/// Holds a thread's copy of a map; when the thread exits, stops [`MAP_COPY`] naming it before
/// it goes.
struct KeptMap(Option<Arc<Map>>);

impl Drop for KeptMap {
    fn drop(&mut self) {
        let _ = MAP_COPY.try_with(|c| c.set(MapCopy::NONE));
    }
}

thread_local! {
    /// This thread's copy of the map it last read by name. Reading `Groups::map` through
    /// arc-swap makes two locked writes (a debt taken and paid back), a good part of an
    /// admission by name; a copy that is current costs a load of the table's generation,
    /// which changes only with the map. A thread keeps one copy at a time, so a map replaced
    /// since lives on at most until that thread next looks a name up.
    static KEPT_MAP: RefCell<KeptMap> = const { RefCell::new(KeptMap(None)) };
    /// Names the map [`KEPT_MAP`] holds, apart from it: a thread-local with nothing to drop
    /// is read with no check that it is set up and no borrow, two of the few dozen
    /// instructions of an admission by name. Changed only together with `KEPT_MAP`.
    static MAP_COPY: Cell<MapCopy> = const { Cell::new(MapCopy::NONE) };
}

/// Whether `copy` names the map this thread keeps (or the thread's copy is borrowed or gone,
/// when it cannot be told): what makes reading through it sound.
fn copy_is_kept(copy: MapCopy) -> bool {
    KEPT_MAP
        .try_with(|kept| {
            kept.try_borrow()
                .map_or(true, |kept| kept.0.as_ref().is_some_and(|m| std::ptr::eq(Arc::as_ptr(m), copy.map)))
        })
        .unwrap_or(true)
}

impl Groups {
    /// A table with the configured groups (and `default`) already in it, made in the order
    /// of their names.
    ///
    /// Made in the configuration map's order, their states lay in memory in an order that
    /// changes with every process (the map's hash is seeded), unrelated to anything a caller
    /// does: names taken in turn then found each group's state far from the last, and with
    /// 100,000 groups, out of the caches, each such call waited for it in full, where
    /// states made one after the other are fetched ahead by the processor.
    pub(crate) fn new(
        configured: HashMap<Box<str>, GroupSettings>,
        max: usize,
        make: Box<MakeGroup>,
    ) -> Groups {
        let default_settings = configured.get(DEFAULT_GROUP).cloned().unwrap_or_default();
        let overflow = make(GroupName::default_group(), &default_settings);
        let mut map = Map::default();
        map.insert(overflow.clone());
        let mut by_name: Vec<(&Box<str>, &GroupSettings)> = configured.iter().collect();
        by_name.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, settings) in by_name {
            if &**name != DEFAULT_GROUP && !tollgate_model::settings::is_pattern(name) {
                let name = GroupName::new(name).expect("configured names are valid");
                map.insert(make(name, settings));
            }
        }
        Groups {
            map: ArcSwap::from_pointee(map),
            id: NEXT_TABLE.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            recent: Mutex::new(Recent::default()),
            sorted: Mutex::new(Sorted::default()),
            overflow,
            patterns: {
                let mut p: Vec<_> = configured
                    .iter()
                    .filter(|(n, _)| tollgate_model::settings::is_pattern(n))
                    .map(|(n, s)| (n.clone(), s.clone()))
                    .collect();
                tollgate_model::settings::sort_patterns(&mut p);
                p
            },
            configured,
            max,
            make,
        }
    }

    /// Runs `f` on the lock-free map, through this thread's copy of it when that is current.
    /// `f` must not look names up itself (it could replace the copy it is reading).
    #[inline(always)]
    fn with_map<R>(&self, f: impl FnOnce(&Map) -> R) -> R {
        let generation = self.generation.load(Ordering::Acquire);
        let copy = MAP_COPY.try_with(Cell::get).unwrap_or(MapCopy::NONE);
        if copy.table == self.id && copy.generation == generation {
            debug_assert!(copy_is_kept(copy), "MAP_COPY names a map KEPT_MAP does not hold");
            // SAFETY: `MAP_COPY` names the map `KEPT_MAP` holds: `with_new_copy` changes the
            // two together, and `KeptMap`'s drop stops the name before the map goes. Only a
            // look-up on this thread replaces it, and `f` makes none, so the map lives
            // through `f`.
            #[allow(unsafe_code)]
            return f(unsafe { &*copy.map });
        }
        self.with_new_copy(f)
    }

    /// Takes a copy of the current map for this thread, then runs `f` on it.
    #[cold]
    #[inline(never)]
    fn with_new_copy<R>(&self, f: impl FnOnce(&Map) -> R) -> R {
        // The generation first: a copy is never newer than the generation it is kept with.
        let generation = self.generation.load(Ordering::Acquire);
        let map = self.map.load_full();
        // Kept unless the thread is exiting (its copy is gone then). A reader of the copy holds
        // no borrow (it reads through `MAP_COPY`), which is why `with_map`'s `f` may make no
        // look-up: this would drop the map it reads.
        let _ = KEPT_MAP.try_with(|kept| {
            if let Ok(mut kept) = kept.try_borrow_mut() {
                // Not named while the old copy goes, and named once the new one is held.
                MAP_COPY.set(MapCopy::NONE);
                kept.0 = Some(map.clone());
                MAP_COPY.set(MapCopy { table: self.id, generation, map: Arc::as_ptr(&map) });
            }
        });
        f(&map)
    }

    /// Publishes a new lock-free map.
    fn store_map(&self, map: Map) {
        self.map.store(Arc::new(map));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The group `name`, made if new; `(group, made)`.
    #[inline]
    pub(crate) fn lookup(&self, name: &str) -> Result<(Arc<Group>, bool), AcquireError> {
        if let Some(g) = self.with_map(|map| map.group(name).cloned()) {
            return Ok((g, false));
        }
        self.lookup_locked(name)
    }

    /// The group `name`, borrowed for as long as the table is, when it is in the lock-free
    /// map and has been asked for before: the hot case of admitting by name, with no
    /// reference count touched.
    #[inline]
    pub(crate) fn known(&self, name: &str) -> Option<&Group> {
        let g = self.with_map(|map| map.group(name).map(Arc::as_ptr))?;
        // SAFETY: a table never lets a group go: every map it publishes holds all the groups
        // of the map before it (`lookup_locked` extends a copy), and `map` always holds the
        // latest, so a group found in any of them lives at least as long as the table, which
        // the result borrows.
        #[allow(unsafe_code)]
        let g = unsafe { &*g };
        g.is_used().then_some(g)
    }

    #[cold]
    fn lookup_locked(&self, name: &str) -> Result<(Arc<Group>, bool), AcquireError> {
        check_group_name(name).map_err(|e| AcquireError::InvalidGroup(Box::new(e)))?;
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.map.load_full();
        if let Some(g) = current.group(name) {
            return Ok((g.clone(), false));
        }
        let (group, made) = match recent.map.group(name) {
            Some(g) => (g.clone(), false),
            None if current.len() + recent.map.len() >= self.max => {
                return Ok((self.overflow.clone(), false));
            }
            None => {
                let settings = self.settings_for(name);
                let name = GroupName::new(name).map_err(|e| AcquireError::InvalidGroup(Box::new(e)))?;
                let group = (self.make)(name.clone(), &settings);
                recent.map.insert(group.clone());
                (group, true)
            }
        };
        recent.slow_lookups += 1;
        if recent.slow_lookups >= MERGE_AFTER_MIN.max(current.len() / 4) {
            let mut next = Map::clone(&current);
            next.take_all(&mut recent.map);
            recent.slow_lookups = 0;
            self.store_map(next);
        }
        Ok((group, made))
    }

    /// The settings for `name`: its own, else the most specific matching pattern's, else the
    /// `default` group's, else the defaults.
    pub(crate) fn settings_for(&self, name: &str) -> GroupSettings {
        self.configured
            .get(name)
            .or_else(|| tollgate_model::settings::matching_pattern(&self.patterns, name))
            .or_else(|| self.configured.get(DEFAULT_GROUP))
            .cloned()
            .unwrap_or_default()
    }

    /// The configured groups.
    pub(crate) fn configured(&self) -> &HashMap<Box<str>, GroupSettings> {
        &self.configured
    }

    /// A group already in the table.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Group>> {
        if let Some(g) = self.map.load().group(name) {
            return Some(g.clone());
        }
        // Under the lock no merge moves the recent names into the map: looked up in both
        // again, since one may have run between the first look and the lock.
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(g) = recent.map.group(name) {
            return Some(g.clone());
        }
        self.map.load().group(name).cloned()
    }

    /// Every name and its group, in no order.
    fn all(&self) -> Vec<(GroupName, Arc<Group>)> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let map = self.map.load();
        map.iter().chain(recent.map.iter()).map(|g| (g.name.clone(), g.clone())).collect()
    }

    /// Every distinct group state, by name (names past the bound share `default`'s), shared
    /// rather than copied: the list is kept between calls while the table is unchanged, and
    /// taking it touches no group (a reference count changed per group is a locked write to
    /// each group's line, waited for one after the other).
    pub(crate) fn listed(&self) -> Listed {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sorted = self.sorted.lock().unwrap_or_else(PoisonError::into_inner);
        // The table changes only under `recent`'s lock, which is held: its generation and the
        // number of recent names say whether the list made last time is still the table.
        let now = (self.generation.load(Ordering::Acquire), recent.map.len());
        if sorted.at != Some(now) {
            let map = self.map.load();
            let mut list: Vec<Arc<Group>> = map.iter().chain(recent.map.iter()).cloned().collect();
            list.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            list.dedup_by(|a, b| Arc::ptr_eq(a, b));
            *sorted = Sorted { at: Some(now), list: Listed(Arc::new(list)) };
        }
        sorted.list.clone()
    }

    /// How many names are in the table.
    pub(crate) fn len(&self) -> usize {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        self.map.load().len() + recent.map.len()
    }

    /// Every name and its group.
    pub(crate) fn named(&self) -> Vec<(String, Arc<Group>)> {
        let mut all: Vec<(String, Arc<Group>)> =
            self.all().into_iter().map(|(n, g)| (n.as_str().to_owned(), g)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize) -> Groups {
        let clock = Arc::new(ClockSource::of(tollgate_model::time::ManualClock::new()));
        let make = move |name: GroupName, _: &GroupSettings| plain(name, &clock);
        Groups::new(HashMap::new(), max, Box::new(make))
    }

    /// A group with a bucket of 10 units/s.
    fn plain(name: GroupName, clock: &Arc<ClockSource>) -> Arc<Group> {
        Group::new(name, LimiterState::Bucket(Bucket::new(10.0, 10.0, Nanos(0))), clock, f64::INFINITY, false)
    }

    /// The sorted list kept between reallocations follows the table: names made one by one
    /// (first beside the map, then moved into it), and a name past the bound, which shares
    /// `default`'s state and so adds nothing.
    #[test]
    fn every_group_listed_once_by_name_as_the_table_grows() {
        let groups = table(200);
        let names =
            |groups: &Groups| groups.listed().all().map(|g| g.name.as_str().to_owned()).collect::<Vec<_>>();
        assert_eq!(names(&groups), ["default"]);
        let mut expected = vec!["default".to_owned()];
        for i in (0..199).rev() {
            let name = format!("t{i:03}");
            groups.lookup(&name).expect("a valid name");
            expected.push(name);
            expected.sort();
            assert_eq!(names(&groups), expected, "after {i}");
        }
        let (past, _) = groups.lookup("one-too-many").expect("a valid name");
        assert!(Arc::ptr_eq(&past, &groups.overflow));
        assert_eq!(names(&groups), expected);
        assert_eq!(groups.listed().used().count(), 0);
        groups.lookup("t007").expect("known").0.mark_used();
        assert_eq!(groups.listed().used().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["t007"]);
    }

    /// The edge of `known`'s unsafe borrow: a group found before the table grows (its map
    /// replaced many times over, by another thread) is still the same live group after.
    #[test]
    fn a_group_found_before_the_table_grows_outlives_the_growth() {
        let groups = Arc::new(table(5000));
        groups.lookup("early").expect("a valid name").0.mark_used();
        merge(&groups);
        let found = groups.known("early").expect("used");
        let grower = {
            let groups = groups.clone();
            std::thread::spawn(move || {
                for i in 0..4000 {
                    groups.lookup(&format!("late-{i}")).expect("a valid name");
                }
            })
        };
        grower.join().unwrap();
        assert_eq!(found.name.as_str(), "early");
        assert!(std::ptr::eq(found, groups.known("early").expect("still known")));
        assert!(groups.listed().all().count() > 4000);
    }

    /// Enough new names that those made so far move into the lock-free map.
    fn merge(groups: &Groups) {
        for i in 0..2 * MERGE_AFTER_MIN {
            groups.lookup(&format!("fill-{i}")).expect("a valid name");
        }
    }

    /// The edge of `with_map`'s unsafe borrow: one thread looking up in two tables in turn
    /// never reads one table's map for the other's, nor one dropped since.
    #[test]
    fn one_thread_looking_up_in_two_tables_in_turn_reads_each_its_own() {
        let (a, b) = (table(100), table(100));
        let (in_a, _) = a.lookup("x").expect("a valid name");
        let (in_b, _) = b.lookup("x").expect("a valid name");
        in_a.mark_used();
        in_b.mark_used();
        merge(&a);
        merge(&b);
        for _ in 0..3 {
            assert!(std::ptr::eq(a.known("x").unwrap(), Arc::as_ptr(&in_a)));
            assert!(std::ptr::eq(b.known("x").unwrap(), Arc::as_ptr(&in_b)));
        }
        drop(a);
        let c = table(100);
        assert!(c.known("x").is_none(), "a new table at the old one's place reads its own map");
        assert!(std::ptr::eq(b.known("x").unwrap(), Arc::as_ptr(&in_b)));
    }

    /// Configured groups are made in the order of their names, whatever the order of the
    /// map that holds their settings.
    #[test]
    fn configured_groups_are_made_in_the_order_of_their_names() {
        let clock = Arc::new(ClockSource::of(tollgate_model::time::ManualClock::new()));
        let made = Arc::new(Mutex::new(Vec::new()));
        let log = made.clone();
        let make = move |name: GroupName, _: &GroupSettings| {
            log.lock().unwrap().push(name.as_str().to_owned());
            plain(name, &clock)
        };
        let names: Vec<String> = (0..500).map(|i| format!("tenant-{:03}", (i * 7919) % 500)).collect();
        let configured =
            names.iter().map(|n| (n.clone().into_boxed_str(), GroupSettings::default())).collect();
        let groups = Groups::new(configured, 1000, Box::new(make));
        let made = made.lock().unwrap().clone();
        let mut expected: Vec<String> = names.clone();
        expected.sort();
        // `default` first (the table's own), then the configured ones by name.
        assert_eq!(made[0], DEFAULT_GROUP);
        assert_eq!(made[1..], expected[..]);
        assert!(groups.get("tenant-042").is_some());
    }

    /// An admission by name reads, and writes, only the group's second line: the bucket's
    /// time and rate, the flags, the name's short form, the ceiling and the shared admissions.
    #[test]
    fn what_an_admission_reads_sits_on_the_groups_second_line() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Group>(), 64);
        let line = 64..128;
        assert_eq!(offset_of!(Group, bucket) + Bucket::ADMISSION_OFFSET, line.start);
        assert_eq!(offset_of!(Group, bucket) + size_of::<Bucket>(), offset_of!(Group, used));
        for field in [
            offset_of!(Group, used),
            offset_of!(Group, repaying),
            offset_of!(Group, general),
            offset_of!(Group, short_name),
            offset_of!(Group, quick_ceiling),
            offset_of!(Group, counters),
        ] {
            assert!(line.contains(&field), "{field}");
        }
        let hot_end = offset_of!(Group, counters) + tally::COUNTERS_HOT_END;
        assert!(hot_end <= line.end, "the hot fields end at {hot_end}");
        assert!(offset_of!(Group, short_name) + size_of::<ShortName>() <= offset_of!(Group, quick_ceiling));
    }

    #[test]
    fn the_quick_ceiling_is_never_above_the_ceiling() {
        for x in [0.0, 1e-50, 0.1, 1.0, 3.0, 1e6 + 0.1, 123_456_789.123, 1e38, 3.5e38, 1e300, f64::MAX] {
            let q = round_down_f32(x);
            assert!(f64::from(q) <= x, "{x}: {q}");
            assert!(f64::from(q.next_up()) > x || q == f32::MAX, "{x}: {q} is not the largest");
        }
        assert_eq!(round_down_f32(f64::INFINITY), f32::MAX);
        assert_eq!(round_down_f32(2.0), 2.0);
    }
}
