//! What every handle on one limiter shares: its groups, its clock, and the one mode that feeds
//! its groups.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_model::bucket::{Priced, Refusal};
use tollgate_model::config::NodeSettings;
use tollgate_model::cost::CostModel;
use tollgate_model::time::{Clock, Nanos};

use crate::clock::{ClockSource, CoarseClock};
use crate::embedded::Embedded;
use crate::error::AcquireError;
use crate::group::{Group, Groups};
use crate::remote::Link;
use crate::store::StoreLink;

/// The least burst, as time of refill at the bucket's rate, for which admission reads the
/// coarse clock ([`crate::clock::CoarseClock`], one millisecond of resolution) rather than
/// the precise one: ten times its resolution, so a reading that lags by a few milliseconds
/// (the refresh thread waiting for a core) still loses nothing. A one-second burst, the
/// default, is far above it.
pub const FAST_CLOCK_MIN_BURST: Duration = Duration::from_millis(10);
const FAST_CLOCK_MIN_BURST_NS: u64 = FAST_CLOCK_MIN_BURST.as_nanos() as u64;

/// Whether a cost priced at a bucket's rate is admitted by the fast clock: see
/// [`FAST_CLOCK_MIN_BURST`].
#[inline(always)]
fn reads_fast_clock(priced: &Priced) -> bool {
    priced.tolerance_ns() >= FAST_CLOCK_MIN_BURST_NS
}

/// How soon a remote client retries a request refused for want of a grant.
const REMOTE_RETRY: Duration = Duration::from_millis(20);

/// When to try again in store mode after an allotment ran short: the sync task was woken to
/// take more.
const STORE_RETRY: Duration = Duration::from_millis(5);

/// What feeds a limiter's groups: one mode per limiter.
pub(crate) enum Mode {
    /// The engine in process.
    Embedded(Box<Embedded>),
    /// A controller's grants, through an exchange task.
    Remote(Arc<Link>),
    /// Pools shared through Redis, through a sync task.
    Store(Arc<StoreLink>),
}

impl Mode {
    /// The mode's name, as errors and docs say it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Mode::Embedded(_) => "embedded",
            Mode::Remote(_) => "remote",
            Mode::Store(link) => link.mode_name(),
        }
    }
}

impl Mode {
    /// Whether an unthrottled handle's work may skip the buckets: always but in remote mode,
    /// where the controller says whether this client's credential carries the privilege.
    #[inline]
    pub(crate) fn unthrottled_allowed(&self) -> bool {
        match self {
            Mode::Remote(link) => link.unthrottled_allowed.load(std::sync::atomic::Ordering::Relaxed),
            _ => true,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) clock: Arc<ClockSource>,
    /// The clock a bucket whose burst holds at least [`FAST_CLOCK_MIN_BURST`] of refill
    /// admits by: the coarse clock (one load) beside the default precise one or a coarse one
    /// (`true`: the coarse clock is running); `false` for any other clock, which is then read
    /// as it is. See [`Inner::now_for`].
    coarse: bool,
    pub(crate) groups: Arc<Groups>,
    pub(crate) mode: Mode,
    /// `max_wait`, and the node settings an embedded limiter was built with.
    pub(crate) node: NodeSettings,
    pub(crate) cost_model: CostModel,
    /// When the embedded engine is due to tick next (never, in the other modes).
    next_tick_ns: AtomicU64,
}

impl Inner {
    pub(crate) fn new(
        clock: Arc<ClockSource>,
        groups: Arc<Groups>,
        mode: Mode,
        node: NodeSettings,
        cost_model: CostModel,
    ) -> Inner {
        let next = if matches!(mode, Mode::Embedded(_)) { 0 } else { u64::MAX };
        // Started here if need be; read through its one shared cell.
        let coarse = clock.coarse_companion().is_some();
        let inner =
            Inner { clock, coarse, groups, mode, node, cost_model, next_tick_ns: AtomicU64::new(next) };
        if let Mode::Embedded(e) = &inner.mode {
            e.reallocate(inner.clock.now(), &inner.groups);
        }
        inner
    }

    /// The time to admit a priced cost by: the fast clock when the bucket's burst holds at
    /// least [`FAST_CLOCK_MIN_BURST`] of refill, so that reading time a millisecond late
    /// loses nothing (what refills meanwhile waits in the bucket), else the precise clock.
    /// A late reading only ever refuses what a precise one might have admitted: the bucket
    /// never admits early.
    #[inline(always)]
    pub(crate) fn now_for(&self, priced: &Priced) -> Nanos {
        if self.coarse && reads_fast_clock(priced) { CoarseClock::read_shared() } else { self.clock.now() }
    }

    /// Runs the embedded engine's tick if it is due; cheap when it is not.
    #[inline(always)]
    pub(crate) fn tick(&self, now: Nanos) {
        let due = self.next_tick_ns.load(Ordering::Relaxed);
        if now.0 >= due {
            self.tick_slow(now, due);
        }
    }

    /// Whether the embedded engine's tick is due at `now`: [`tick`](Self::tick) would run it.
    #[inline(always)]
    pub(crate) fn tick_due(&self, now: Nanos) -> bool {
        now.0 >= self.next_tick_ns.load(Ordering::Relaxed)
    }

    #[cold]
    fn tick_slow(&self, now: Nanos, due: u64) {
        let Mode::Embedded(e) = &self.mode else { return };
        if e.in_background() {
            // Passes run on their own thread: admissions never look again.
            self.next_tick_ns.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        let next = now.after(e.interval()).0;
        if self.next_tick_ns.compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            e.reallocate(now, &self.groups);
            // A reallocation costs time linear in the groups in use, paid by the call that
            // runs it: with so many that it takes more than a quarter of the interval, the
            // next waits four times what this one took. On a real clock that many groups
            // (`BACKGROUND_GROUPS`) hand passes to a thread of their own instead.
            let cost = self.clock.now().since(now);
            if e.hand_over(now, cost, &self.groups, &self.clock) {
                self.next_tick_ns.store(u64::MAX, Ordering::Relaxed);
                return;
            }
            self.next_tick_ns.fetch_max(e.next_pass(now, cost).0, Ordering::Relaxed);
        }
    }

    /// The group `name`, made if new (and then fed at once: an engine tick, or an exchange).
    #[inline]
    pub(crate) fn lookup(&self, name: &str) -> Result<Arc<Group>, AcquireError> {
        let (group, made) = self.groups.lookup(name)?;
        // A configured group is made at start but fed only once asked for: then at once.
        if group.mark_used() || made {
            self.on_new_group(&group);
        }
        Ok(group)
    }

    #[cold]
    fn on_new_group(&self, group: &Group) {
        let now = self.clock.now();
        match &self.mode {
            Mode::Embedded(e) => {
                if let Some(due) = e.take_in(now, &self.groups, &self.clock) {
                    // Taken in by the first call from then on.
                    self.next_tick_ns.fetch_min(due.0, Ordering::Relaxed);
                } else if e.in_background() {
                    self.next_tick_ns.store(u64::MAX, Ordering::Relaxed);
                }
            }
            Mode::Remote(link) => link.new_group(group, now),
            Mode::Store(_) => {}
        }
    }

    /// When a refused request is worth trying again.
    pub(crate) fn retry_after(&self, refusal: Refusal) -> Duration {
        match (refusal, &self.mode) {
            (Refusal::Wait(d), _) => d,
            // No allowance now, or a burst too small for now: the next grant or reallocation
            // may change that.
            (_, Mode::Remote(_)) => REMOTE_RETRY,
            (_, Mode::Embedded(e)) => e.interval(),
            // An allotment short: the store's answer is a round trip away.
            (Refusal::Closed, Mode::Store(_)) => STORE_RETRY,
            (_, Mode::Store(_)) => Duration::from_secs(1),
        }
    }

    /// A group's allotment ran out while its controller had units left, or its window ended:
    /// its next report is due at once (a remote client's early exchange; the embedded
    /// engine's next pass; the store's next take). `true` when more was taken already (in
    /// replicas mode, from this process's own share): worth a second try at once.
    #[cold]
    pub(crate) fn allotment_short(&self, g: &Group, now: Nanos) -> bool {
        match &self.mode {
            Mode::Remote(link) => link.fresh(g),
            Mode::Embedded(_) => self.next_tick_ns.store(0, Ordering::Relaxed),
            Mode::Store(link) if link.is_replicas() => {
                link.quotas.refill_local(g, now);
                return true;
            }
            Mode::Store(link) => link.quotas.wake(),
        }
        false
    }

    /// Tells the mode about a refusal: a remote client asks for an exchange. One comparison
    /// when the mode does nothing with it (the common refusal, a wait, in embedded or store
    /// mode).
    #[inline(always)]
    pub(crate) fn refused(&self, g: &Group, cost: f64, refusal: Option<Refusal>) {
        if matches!(self.mode, Mode::Remote(_)) || refusal == Some(Refusal::Closed) {
            self.tell_refused(g, cost, refusal);
        }
    }

    #[cold]
    fn tell_refused(&self, g: &Group, cost: f64, refusal: Option<Refusal>) {
        if matches!(self.mode, Mode::Embedded(_))
            && refusal == Some(Refusal::Closed)
            && g.allowance().is_nan()
        {
            // Forgotten while idle: take it in again at the next call.
            self.next_tick_ns.store(0, Ordering::Relaxed);
        }
        if let Mode::Remote(link) = &self.mode {
            match refusal {
                Some(Refusal::ExceedsBurst { .. }) => {
                    let bits = cost.to_bits();
                    g.largest_cost.fetch_max(bits, Ordering::Relaxed);
                    link.urgent();
                }
                // Never granted (new, or revived after going idle): its first grant is due,
                // and starts the bucket with what this request needs.
                Some(Refusal::Closed) if g.allowance().is_nan() => {
                    g.first_cost.fetch_max(cost.to_bits(), Ordering::Relaxed);
                    link.fresh(g);
                }
                _ => link.refused(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_model::bucket::Bucket;

    use super::*;

    #[test]
    fn only_a_burst_of_ten_milliseconds_or_more_reads_the_fast_clock() {
        let priced = |rate: f64, burst: f64| Bucket::new(rate, burst, Nanos(0)).price(1.0);
        // The default burst, one second of the rate.
        assert!(reads_fast_clock(&priced(10_000.0, 10_000.0)));
        // Exactly 10 ms of refill, and just under.
        assert!(reads_fast_clock(&priced(1_000.0, 10.0)));
        assert!(!reads_fast_clock(&priced(1_000.0, 9.9)));
        // A fast group with a small burst: 100 µs.
        assert!(!reads_fast_clock(&priced(1_000_000.0, 100.0)));
        // A closed bucket holds no refill at all.
        assert!(!reads_fast_clock(&priced(0.0, 0.0)));
    }
}
