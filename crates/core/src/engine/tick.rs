//! One tick: expire what went quiet, then compute every tracked group's target and grants.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::allocate::{AllocationMode, Claim, allocate, first_come};
use crate::settings::{GroupName, GroupSettings, Limit, Priority};

use super::LimitingLaw;
use crate::time::Nanos;

use super::fair::{Limited, share_pools};
use super::split::{Asking, hold_back_raises, split_into};
use super::{ClientGrant, Engine, GroupOutcome, OrNan};

/// A forgotten group's name, its resumable ramp's pool and TTL, and its meter.
type LetGo = (GroupName, Option<(f64, Option<Duration>)>, super::metering::MeterEntry);

/// The share of its reservation a group with no client holds under slow start.
pub const SLOW_START_SHARE: f64 = 0.1;

/// What the tick needs of a group (copied: no clone of its settings). One is kept per tracked
/// group from tick to tick, so it is kept small: optional rates as NaN, what only a trace
/// needs apart ([`Traced`]).
#[derive(Clone)]
pub(super) struct Row {
    reserved: f64,
    cap: f64,
    weight: f64,
    burst: OrNan,
    demand: f64,
    unthrottled: f64,
    /// Saturation's limiting rate, or else the headroom rate when `at_headroom`.
    limiting: OrNan,
    load: f64,
    first_asked: u64,
    /// How many clients ask: its entries in the tick's list of them, after the rows before.
    clients: u32,
    priority: Priority,
    exhausted: bool,
    /// `limiting` is the headroom rate, not saturation's.
    at_headroom: bool,
}

impl Row {
    /// What the row claims of the node's capacity. Unthrottled work takes its room off the
    /// top: it counts as reserved, up to the group's cap (beyond it, it is the group's debt,
    /// paid back at its limit).
    fn claim(&self) -> Claim {
        Claim {
            reserved: self.reserved.max(self.unthrottled.min(self.cap)),
            ceiling: self.cap,
            priority: self.priority,
            weight: self.weight,
            demand: self.demand.max(self.unthrottled),
        }
    }

    fn burst(&self) -> Option<f64> {
        self.burst.get()
    }

    /// What bounds the group from its backends: saturation's limiting rate or the headroom.
    fn limiting(&self) -> Option<f64> {
        self.limiting.get()
    }

    /// The headroom rate alone.
    fn headroom(&self) -> Option<f64> {
        self.limiting().filter(|_| self.at_headroom)
    }
}

/// What a trace adds to a group's row: the ratio applied and the saturated backends counted on.
struct Traced {
    ratio: Option<f64>,
    limited_by: Vec<super::Limiter>,
}

/// A tick under way: what its two walks carry from one slice to the next.
pub(super) struct TickRun {
    now: Nanos,
    /// Seconds since the tick before.
    elapsed: f64,
    /// The weight of the past in the moving averages over that time.
    keep: f64,
    /// The groups the walks cover: the first `len` tracked when the tick began. A group
    /// tracked later joins the end and waits for the next tick.
    len: usize,
    /// The position of the next group to walk.
    next: usize,
    /// Whether the backends' loads are still being gathered (the first step, before the
    /// walks), and the last backend gathered.
    gathering: bool,
    gathered: Option<String>,
    /// The report of `gathered`, while its loads are taken.
    part: Option<super::saturation::Gathering>,
    /// The earliest last report among the groups walked so far (see
    /// `Engine::earliest_report`).
    earliest: Nanos,
    /// The claims on the capacity of the rows made so far, summed per priority as each slice
    /// makes them (with a capacity only): summing 100,000 rows at once when the last was made
    /// held the engine for 0.4 ms. The tick before's stay readable until the rows are made.
    claims: Vec<Claim>,
    /// Whether the rows are made and the capacity is still to be shared among them (the one
    /// step that reads every row at once; see [`Engine::shares_work`]).
    sharing: bool,
    /// Whether the rows are made and the last walk (targets and grants) is under way.
    applying: bool,
    /// Where the next group's clients begin in the list of them, in the last walk.
    from: usize,
    /// The backends behind the loads, for a trace's names.
    reporting: super::saturation::Reporting,
    /// Each row's trace, when tracing was on as the tick began.
    traced: Option<Vec<Traced>>,
    /// Each row's share of the capacity, when there is one.
    shares: Option<Vec<f64>>,
    /// The groups the rate law limits, for their backends' pools to be shared.
    limited: Vec<Limited>,
    /// Their limiting rates once shared ([`super::fair::share_pools`]), by row, and the next
    /// one the last walk reaches.
    fair: Vec<(u32, Option<f64>)>,
    fair_next: usize,
    /// The capacity the tick's groups take: each target up to what the group asks for.
    taken_total: f64,
    totals: super::Totals,
    /// The earlier incarnations of restarted clients, sorted: their places are dropped.
    released: Vec<super::split::ClientId>,
}

/// The engine's ticking: the tick under way, what the last one found, and the buffers kept
/// from one tick to the next.
pub(super) struct Ticking {
    /// The tick under way, when one is walked in slices ([`Engine::begin_tick`]).
    pub(super) run: Option<Box<TickRun>>,
    /// Ticks completed.
    pub(super) count: u64,
    /// When the last tick began.
    pub(super) last: Option<Nanos>,
    /// A backend's report showed it saturated (newly, or for the first time) since the last
    /// tick began: see [`Engine::saturation_onset`].
    pub(super) onset: bool,
    /// No tracked group's last report is earlier than the smaller of these two: the earliest
    /// among the groups the last tick walked (or a report during that tick), and the earliest
    /// report since the last tick began. A tick forgets idle groups only when that is an
    /// expiry ago.
    pub(super) earliest_report: Nanos,
    pub(super) reports_floor: Nanos,
    /// What the last tick found.
    pub(super) found: Found,
    /// The tick's buffers.
    pub(super) buffers: Buffers,
}

impl Default for Ticking {
    fn default() -> Self {
        Self {
            run: None,
            count: 0,
            last: None,
            onset: false,
            earliest_report: Nanos(u64::MAX),
            reports_floor: Nanos(u64::MAX),
            found: Found::default(),
            buffers: Buffers::default(),
        }
    }
}

/// What the last tick found, summed over its groups.
#[derive(Default)]
pub(super) struct Found {
    /// The capacity the groups of the last tick asked for: each finite target up to the
    /// group's demand or reservation. The rest of the capacity is room a new group may take.
    pub(super) taken_total: f64,
    /// Every group's rates added up at the last tick.
    pub(super) totals: super::Totals,
    /// What the groups of the last tick whose rows were complete claim of the capacity, per
    /// priority ([`Engine::capacity_claims`]); summed only while a capacity is shared.
    pub(super) claims: Vec<Claim>,
}

/// The tick's buffers, kept from one tick to the next: each tracked group's load from the
/// backends' reports, its row, and its clients' demands. The rows are shared with the
/// capacity's sharing while it is computed without the engine ([`SharesWork`]).
#[derive(Default)]
pub(super) struct Buffers {
    pub(super) scratch: Vec<f64>,
    pub(super) loads: super::saturation::Loads,
    pub(super) rows: Arc<Vec<Row>>,
    pub(super) asking: Vec<super::split::Asking>,
    /// What each client of the group being granted held at the last tick.
    pub(super) held: Vec<f64>,
}

/// How many groups (or backends' loads) the first slice of each walk of a tick takes: few
/// enough that the costliest walk (the grants, about a microsecond a group of ten clients)
/// stays near [`TICK_SLICE_TARGET`]. The next slices are sized from it by [`first_slice`],
/// then by [`next_slice`].
pub const TICK_SLICE_GROUPS: usize = 32;
/// How long one slice of a tick walked by a controller ([`Engine::tick_slice`]) should hold
/// the engine: an exchange arriving meanwhile waits for about this long at most. A slice's
/// cost per group varies several times over (gathering backends' loads costs about three
/// times a group's row, and machines differ), so slices are sized by time, not by a count:
/// with a count of 1,024, slices gathering ten backends' loads held a controller's engine
/// for 200 µs each, up to 630 µs.
pub const TICK_SLICE_TARGET: Duration = Duration::from_micros(50);
/// The fewest and most groups (or loads) one slice walks.
pub const TICK_SLICE_BOUNDS: (usize, usize) = (32, 8192);

/// The size of the next slice of a tick, after one of `size` that took `took`: scaled toward
/// [`TICK_SLICE_TARGET`], at most halved at once (a slice slowed by a page fault or a
/// preemption does not shrink the next ones for long) and grown by a quarter at most (the
/// last slice of a walk may have had only a few groups left, and the next walk's may cost
/// more each), within [`TICK_SLICE_BOUNDS`]. Only when a tick completes depends on it, never
/// what it decides.
pub fn next_slice(size: usize, took: Duration) -> usize {
    scaled_slice(size, took, size.saturating_add(size / 4))
}

/// The size of a walk's second slice, after its first (of `size`, [`TICK_SLICE_GROUPS`])
/// took `took`: scaled toward [`TICK_SLICE_TARGET`] as [`next_slice`] scales, but grown up to
/// eight times at once, so that a walk whose groups cost little reaches its size within a
/// few slices of a small first one.
pub fn first_slice(size: usize, took: Duration) -> usize {
    scaled_slice(size, took, size.saturating_mul(8))
}

fn scaled_slice(size: usize, took: Duration, most: usize) -> usize {
    let took = took.as_nanos().max(1);
    let scaled = (size as u128 * TICK_SLICE_TARGET.as_nanos() / took).min(usize::MAX as u128) as usize;
    let (low, high) = TICK_SLICE_BOUNDS;
    scaled.clamp(size / 2, most).clamp(low, high)
}

/// A tick's slice size as a caller timing its slices chooses it: [`TICK_SLICE_GROUPS`] at the
/// start of each walk of the tick ([`Engine::tick_walk`]), whose groups cost their own, then
/// [`first_slice`] after that first one and [`next_slice`] after each of the others.
#[derive(Debug, Clone, Copy)]
pub struct SliceSize {
    size: usize,
    walk: Option<u8>,
    /// Whether the slice just sized is the first of its walk.
    first: bool,
}

impl SliceSize {
    /// The first slice's size, for the tick `engine` has begun.
    pub fn start(engine: &Engine) -> SliceSize {
        SliceSize { size: TICK_SLICE_GROUPS, walk: engine.tick_walk(), first: true }
    }

    /// The groups (or loads) the next slice walks.
    pub fn get(&self) -> usize {
        self.size
    }

    /// After a slice that took `took`: the next one's size.
    pub fn after(&mut self, engine: &Engine, took: Duration) {
        let walk = engine.tick_walk();
        self.size = match (walk == self.walk, self.first) {
            (false, _) => TICK_SLICE_GROUPS,
            (true, true) => first_slice(self.size, took),
            (true, false) => next_slice(self.size, took),
        };
        self.first = walk != self.walk;
        self.walk = walk;
    }
}

impl Engine {
    /// What the last tick's groups claim of the node's capacity, summed per priority (one
    /// claim per priority present, highest first): an owner's summary when groups are sharded
    /// over controllers, which [`crate::shard::split_capacity`] shares the capacity by. Read
    /// between a tick's slices, it is the tick before's: the rows under way are half made.
    /// Empty while no capacity is configured.
    pub fn capacity_claims(&self) -> Vec<Claim> {
        self.ticking.found.claims.clone()
    }

    /// Which walk of the tick under way the next slice takes: 0 gathering the backends'
    /// loads, 1 making the groups' rows, 2 sharing the capacity, 3 the targets and grants;
    /// `None` between ticks. A walk costs its own a group, so a caller sizing slices by time
    /// starts each walk afresh ([`TICK_SLICE_GROUPS`]) rather than at the size the walk
    /// before grew to.
    pub fn tick_walk(&self) -> Option<u8> {
        self.ticking.run.as_ref().map(|r| match (r.gathering, r.sharing, r.applying) {
            (true, _, _) => 0,
            (_, _, true) => 3,
            (_, true, _) => 2,
            _ => 1,
        })
    }

    /// Adds the rows' claims to the sums per priority (summed in the rows' order, however
    /// many slices they take: the same sums as at once).
    fn add_claims(rows: &[Row], levels: &mut Vec<Claim>) {
        for claim in rows.iter().map(Row::claim) {
            let reserved = claim.reserved.min(claim.demand).min(claim.ceiling).max(0.0);
            let asked = claim.demand.min(claim.ceiling).max(reserved);
            match levels.iter_mut().find(|c| c.priority == claim.priority) {
                Some(c) => {
                    c.reserved += reserved;
                    c.demand += asked;
                    c.ceiling += asked;
                    c.weight += claim.weight;
                }
                None => levels.push(Claim {
                    reserved,
                    ceiling: asked,
                    priority: claim.priority,
                    weight: claim.weight,
                    demand: asked,
                }),
            }
        }
    }

    /// Computes every group's target and grants at `now`; forgets what went quiet.
    pub fn tick(&mut self, now: Nanos) {
        self.begin_tick(now);
        while !self.tick_slice(usize::MAX) {}
    }

    /// Begins a tick at `now`, to be walked by [`tick_slice`](Self::tick_slice) (a tick under
    /// way is finished first): forgets what went quiet. The slices gather the backends'
    /// loads first, a few backends at a time, then walk the groups.
    ///
    /// Walked in slices, a tick gives the same results as [`tick`](Self::tick) when nothing
    /// comes between them; a controller lets reports in between, so that no exchange waits
    /// for a whole tick of many groups. A report between the slices counts towards the tick
    /// if its group's row is not made yet, else towards the next; a group's grants are the
    /// last tick's until its turn in the last walk. A backend's report between the slices
    /// counts if its backend is not gathered yet; a group tracked after the tick began waits
    /// for the next.
    pub fn begin_tick(&mut self, now: Nanos) {
        if self.ticking.run.is_some() {
            while !self.tick_slice(usize::MAX) {}
        }
        self.learning.touch(now);
        self.learning.expire(now);
        self.quotas.observe(now);
        let elapsed = self.ticking.last.map_or(self.settings.tick, |t| now.since(t)).as_secs_f64().max(1e-9);
        self.ticking.last = Some(now);
        self.ticking.onset = false;
        self.expire(now);
        self.expire_slots(now);
        self.catalog.nest(&self.tracked);
        self.ticking.reports_floor = Nanos(u64::MAX);
        self.ticking.buffers.loads.begin();
        // The buffers are kept from tick to tick: at 100,000 groups fresh ones cost a page
        // fault every few groups.
        match Arc::get_mut(&mut self.ticking.buffers.rows) {
            Some(rows) => {
                rows.clear();
                rows.reserve(self.tracked.len());
            }
            // A sharing taken out and never computed still holds the last tick's rows.
            None => self.ticking.buffers.rows = Arc::new(Vec::with_capacity(self.tracked.len())),
        }
        self.ticking.buffers.asking.clear();
        let keep = (-elapsed / self.settings.cost_folding.as_secs_f64().max(1e-9)).exp();
        self.ticking.run = Some(Box::new(TickRun {
            now,
            elapsed,
            keep,
            len: self.tracked.len(),
            next: 0,
            gathering: true,
            gathered: None,
            part: None,
            earliest: Nanos(u64::MAX),
            claims: Vec::new(),
            sharing: false,
            applying: false,
            from: 0,
            reporting: super::saturation::Reporting::default(),
            traced: self.trace.is_some().then(Vec::new),
            shares: None,
            limited: Vec::new(),
            fair: Vec::new(),
            fair_next: 0,
            taken_total: 0.0,
            totals: super::Totals::default(),
            released: std::mem::take(&mut self.released),
        }));
    }

    /// Gathers about `budget` more loads from the backends' reports, in the backends' order
    /// and each report's: the report under way first, then the ones after `run.gathered`. A
    /// report is taken as it was when the tick began it, whatever the backend reports
    /// meanwhile; the gathering ends after the last backend.
    fn gather_slice(&mut self, run: &mut TickRun, budget: usize) {
        use std::ops::Bound;
        let Engine { settings, catalog: configured, tracked, backends, ticking, .. } = self;
        let loads = &mut ticking.buffers.loads;
        let sat = &settings.saturation;
        let quota = |g: &GroupName| {
            super::settings_in(configured, g).and_then(|s| s.limit().is_finite().then(|| s.limit().as_f64()))
        };
        let mut taken = 0usize;
        while taken < budget {
            if let Some(part) = &mut run.part {
                let upto = part.len().min(part.next.saturating_add(budget - taken));
                taken += upto - part.next;
                sat.gather_part(part, upto, &quota, tracked, run.len, loads);
                if part.done() {
                    part.finish(&mut run.reporting);
                    // The hints go back to the backend, for its next report (unless it is
                    // forgotten, or already has them from a report sent since).
                    if let Some(b) = run.gathered.as_deref().and_then(|id| backends.get_mut(id))
                        && b.hints.is_empty()
                    {
                        b.hints = std::mem::take(&mut part.hints);
                    }
                    run.part = None;
                }
                continue;
            }
            let after = run.gathered.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let Some((id, b)) = backends.range_mut::<str, _>((after, Bound::Unbounded)).next() else {
                run.gathering = false;
                return;
            };
            run.gathered = Some(id.clone());
            run.part = sat.begin_backend((id, b), run.now, settings.report_expiry, &mut run.reporting);
            taken += 1;
        }
    }

    /// Walks up to `groups` more groups of the tick under way (at least one); true once the
    /// tick is done, or when none is under way.
    pub fn tick_slice(&mut self, groups: usize) -> bool {
        let Some(mut run) = self.ticking.run.take() else { return true };
        let end = run.len.min(run.next.saturating_add(groups.max(1)));
        if run.gathering {
            self.gather_slice(&mut run, groups.max(1));
        } else if run.applying {
            self.apply_slice(&mut run, end);
            if run.next == run.len {
                self.ticking.earliest_report = run.earliest.min(self.ticking.reports_floor);
                self.ticking.found.taken_total = run.taken_total;
                if self.settings.mode == AllocationMode::Fcfs {
                    // Held back from the free pool for the configured groups not in traffic.
                    self.ticking.found.taken_total += self.reserved_elsewhere(run.len);
                }
                self.ticking.found.totals = run.totals;
                self.provisional.ticked();
                // Counted once done: what is read between two slices belongs to the tick
                // before (a view cached by tick number is not kept half made).
                self.ticking.count += 1;
                return true;
            }
        } else if run.sharing {
            // Shared here when no one took the work apart (`shares_work`).
            let shares =
                self.settings.capacity.map(|capacity| self.shares(capacity, &self.ticking.buffers.rows));
            let fair = share_pools(&mut run.limited);
            run.start_applying(shares, fair);
        } else {
            let first = self.ticking.buffers.rows.len();
            self.rows_slice(&mut run, end);
            if self.settings.capacity.is_some() {
                Self::add_claims(&self.ticking.buffers.rows[first..], &mut run.claims);
            }
            if run.next == run.len {
                let mut claims = std::mem::take(&mut run.claims);
                claims.sort_by_key(|c| std::cmp::Reverse(c.priority));
                self.ticking.found.claims = claims;
                run.share_or_apply(self.settings.capacity.is_some());
            }
        }
        self.ticking.run = Some(run);
        false
    }

    /// The sharing of the node's capacity among the groups of the tick under way, once their
    /// rows are made and before their grants: the one step of a tick that reads every group
    /// at once (about 4 ms at 100,000 groups). Taken out here, it is computed with
    /// [`SharesWork::compute`] without the engine, so a controller can answer exchanges
    /// meanwhile, and handed back with [`put_shares`](Self::put_shares). Taking it out costs
    /// nothing (it shares the rows with the engine; copying what it needs of them held the
    /// engine a millisecond at 100,000 groups). `None` when the
    /// tick is not at that step, and in the first-come mode, whose order reads the groups'
    /// names (the next [`tick_slice`](Self::tick_slice) shares it then, as it does when no one
    /// takes the work). The same numbers either way.
    pub fn shares_work(&self) -> Option<SharesWork> {
        let run = self.ticking.run.as_ref()?;
        let capacity = self.settings.capacity;
        let inline = capacity.is_some() && self.settings.mode == AllocationMode::Fcfs;
        (run.sharing && !inline).then(|| SharesWork {
            tick: self.ticking.count,
            capacity,
            rows: Arc::clone(&self.ticking.buffers.rows),
            limited: run.limited.clone(),
        })
    }

    /// Hands back the capacity's sharing computed from [`shares_work`](Self::shares_work).
    /// Ignored unless the tick it was taken from is still at that step (one finished in the
    /// meantime has shared its own).
    pub fn put_shares(&mut self, shares: Shares) {
        let Some(run) = self.ticking.run.as_mut() else { return };
        let whole = shares.shares.as_ref().is_none_or(|s| s.len() == self.ticking.buffers.rows.len());
        if shares.tick == self.ticking.count && run.sharing && whole {
            run.start_applying(shares.shares, shares.fair);
        }
    }

    /// Whether a tick begun by [`begin_tick`](Self::begin_tick) is not done yet.
    pub fn ticking(&self) -> bool {
        self.ticking.run.is_some()
    }

    /// The first walk, from `run.next` to `end`: each group's row (what the allocation needs),
    /// and its clients' asks appended to one list, which the last walk reads in order rather
    /// than from each group's own list.
    fn rows_slice(&mut self, run: &mut TickRun, end: usize) {
        let Engine { settings, catalog: configured, tracked, quotas, ticking, upstream, .. } = self;
        let Buffers { loads, rows, asking, .. } = &mut ticking.buffers;
        // The engine's own while they are made: a sharing is taken out only once they are all
        // made, and gives them back as it is computed (`begin_tick` replaces any kept longer).
        let rows = Arc::make_mut(rows);
        let (now, elapsed, keep) = (run.now, run.elapsed, run.keep);
        let generation = configured.generation();
        let sat = &settings.saturation;
        let ignore = sat.ignored_zones(run.reporting.zones.len());
        for (name, g) in tracked.as_mut_slice()[run.next..end].iter_mut() {
            run.earliest = run.earliest.min(g.last_report);
            forget_silent_clients(&mut g.clients, now, settings.report_expiry, &run.released);
            if g.settings_generation != generation {
                g.settings = super::settings_in(configured, name).cloned();
                g.settings_generation = generation;
            }
            if let Some(d) = &mut g.detail {
                d.tick(elapsed, keep);
            }
            let slot = std::mem::replace(&mut g.load_slot, super::NO_SLOT);
            let load = (slot != super::NO_SLOT).then(|| &loads.groups[slot as usize]);
            let pressure = match load {
                Some(l) => saturation_of(sat, l, &loads.quota_zones, slot, ignore, g.outcome.as_ref()),
                None => Pressure::default(),
            };
            if let Some(traced) = &mut run.traced {
                let limited_by = load.map(|l| limiters(l, &run.reporting, ignore)).unwrap_or_default();
                traced.push(Traced { ratio: pressure.ratio, limited_by });
            }
            let settings_now = g.settings.as_deref();
            let (reserved, cap, burst, exhausted) =
                limits_of(g, name, settings, (quotas, configured.bounds(), upstream));
            let (demand, unthrottled) = asks(&g.clients, asking);
            // A group that may take its backends' room (throttled at the last tick, its limit
            // now above its target: the only groups they mark so) and that no saturated backend
            // limits is held at that room, when it is below its cap and it asks for more.
            let headroom = match (pressure.limiting, load) {
                (None, Some(l)) => sat
                    .headroom_ratio(&l.zones, &run.reporting.takers, ignore)
                    .map(|h| l.load * h)
                    .filter(|&h| h < cap && demand > h),
                _ => None,
            };
            let row = rows.len() as u32;
            rows.push(Row {
                reserved,
                cap,
                priority: settings_now.map_or(Priority::MEDIUM, GroupSettings::priority),
                weight: settings_now.map_or(1.0, GroupSettings::weight),
                burst: OrNan::new(burst),
                demand,
                unthrottled,
                limiting: OrNan::new(pressure.limiting.or(headroom)),
                at_headroom: headroom.is_some(),
                load: pressure.load,
                exhausted,
                first_asked: g.first_asked,
                clients: g.clients.len() as u32,
            });
            if let (Some(backend), Some(limiting)) = (pressure.backend, pressure.limiting) {
                let claim = rows.last().map(Row::claim).expect("pushed just now");
                run.limited.push(Limited { row, backend, limiting, claim });
            }
        }
        run.next = end;
    }

    /// The last walk, from `run.next` to `end`: each group's target and grants.
    fn apply_slice(&mut self, run: &mut TickRun, end: usize) {
        let trace_t = self.trace_time(run.now);
        let tick = self.settings.tick;
        let Engine { tracked, ticking, trace, learning, catalog: configured, .. } = self;
        let Buffers { rows, asking, scratch, held, .. } = &mut ticking.buffers;
        let slice = &mut tracked.as_mut_slice()[run.next..end];
        for ((name, g), i) in slice.iter_mut().zip(run.next..) {
            let row = &rows[i];
            let share = run.shares.as_ref().map(|s| s[i]);
            let (avg_cost, throttled) = g.fold_rates(run.now, run.elapsed, run.keep, tick);
            // Saturation's limiting rate once its backend's pool is shared (`super::fair`).
            let limiting = run.limiting(i, row.limiting);
            let target = target(row.reserved, row.cap, limiting.get(), share);
            let saturation = limiting.get().filter(|_| !row.at_headroom);
            let busy = saturation.is_some_and(|l| l < row.cap);
            // Reuse last tick's grant buffer.
            let mut grants = g.outcome.take().map(|o| o.grants).unwrap_or_default();
            let clients = row.clients as usize;
            let asked = &asking[run.from..run.from + clients];
            run.from += clients;
            held_before(held, &grants, asked);
            let water_level = grant(&mut grants, target, row, asked, scratch);
            if target.is_some() {
                hold_back_raises(&mut grants, held, asked);
            }
            // The root is a look-up a group (a third of this walk): only while one learns.
            if learning.any(run.now) && learning.covers(run.now, name, super::root_in(configured, name)) {
                for g in grants.iter_mut() {
                    let held = learning.held(name, g.client);
                    (g.rate, g.burst) = super::learning::at_most_held(g.rate, g.burst, held);
                }
            }
            if let Some(t) = target {
                // What the group asks for (its reservation counts as asked: its clients are
                // granted it whatever they ask) takes part of the capacity; the rest of its
                // target is headroom nobody asked for, which a new group may borrow before the
                // next tick.
                let claim = row.claim();
                run.taken_total += t.min(claim.demand.max(claim.reserved));
            }
            if let Some(traced) = &mut run.traced {
                let traced =
                    std::mem::replace(&mut traced[i], Traced { ratio: None, limited_by: Vec::new() });
                // Tracing turned off since the tick began: nothing to keep.
                if let Some(buffer) = trace {
                    let decided = Decided { share, target, water_level, avg_cost, busy, saturation };
                    buffer.push(rate_event(trace_t, name, g, row, decided, traced));
                }
            }
            g.had_clients = clients > 0;
            run.count(g.admitted_last_tick, throttled, row.demand, clients);
            g.outcome = Some(GroupOutcome {
                target: OrNan::new(target),
                limiting,
                at_headroom: row.at_headroom,
                share: OrNan::new(share),
                busy,
                water_level: OrNan::new(water_level),
                avg_cost,
                demand: row.demand,
                unthrottled: row.unthrottled as f32,
                load: row.load as f32,
                budget_exhausted: row.exhausted,
                throttled,
                grants,
            });
        }
        run.next = end;
    }

    /// Each row's share of the node's capacity.
    fn shares(&self, capacity: f64, rows: &[Row]) -> Vec<f64> {
        let claims: Vec<Claim> = rows.iter().map(Row::claim).collect();
        match self.settings.mode {
            AllocationMode::Share => allocate(capacity, &claims),
            AllocationMode::Fcfs => {
                let elsewhere = self.reserved_elsewhere(rows.len());
                let names: Vec<_> = self.tracked.keys().take(rows.len()).collect();
                let mut order: Vec<usize> = (0..rows.len()).collect();
                order.sort_by(|&a, &b| {
                    rows[a].first_asked.cmp(&rows[b].first_asked).then_with(|| names[a].cmp(names[b]))
                });
                first_come(capacity, elsewhere, &claims, &order)
            }
        }
    }

    /// The reservations of configured groups not among the first `rows` tracked, which the
    /// first-come mode holds back from its free pool: Couchbase counts every reservation
    /// against it, active or not (a share of them while slow start is on).
    fn reserved_elsewhere(&self, rows: usize) -> f64 {
        let tracked_configured: f64 = self
            .tracked
            .keys()
            .take(rows)
            .filter_map(|n| self.catalog.get(n))
            .filter(|s| s.parent().is_none())
            .map(|s| s.reserved())
            .sum();
        let elsewhere = (self.catalog.reserved() - tracked_configured).max(0.0);
        if self.settings.slow_start { elsewhere * SLOW_START_SHARE } else { elsewhere }
    }

    /// Forgets idle groups (keeping resumable ramps), silent clients and backends; a group's
    /// silent clients are forgotten by the walk that makes its row
    /// ([`forget_silent_clients`]).
    fn expire(&mut self, now: Nanos) {
        let idle = self.settings.group_idle_expiry;
        let report_expiry = self.settings.report_expiry;
        let mut gone = Vec::new();
        // No group reported before the floor: unless that is an expiry ago, none is idle,
        // and the walk over every group (a millisecond at 100,000) is spared.
        let floor = self.ticking.earliest_report.min(self.ticking.reports_floor);
        if now.since(floor) >= idle {
            self.tracked.retain(|name, g| {
                let keep = now.since(g.last_report) < idle;
                if !keep {
                    let ramp = g.ramp.as_ref().map(|r| (r.value(), r.settings().resume_ttl));
                    gone.push((name.clone(), ramp, g.meter_entry()));
                }
                keep
            });
        }
        self.let_go(now, gone);
        self.resume.retain(|_, (_, until)| now < *until);
        self.backends.retain(|_, b| now.since(b.seen) <= report_expiry);
        self.clients.expire(now, report_expiry.max(self.settings.tick * 2));
        // What expired is given back: a burst of names or clients does not hold its memory
        // for ever.
        if let Some(room) = room_to_keep(self.tracked.len(), self.tracked.capacity()) {
            self.tracked.shrink_to(room);
        }
        shrink(&mut self.metering.idle);
        shrink(&mut self.resume);
    }

    /// Forgets every tracked group that `gone`, given its name and its tree's root
    /// ([`root_of`](Self::root_of)), says is no longer this engine's (its shard moved to
    /// another controller), with the grants made for it, finishing any tick under way first;
    /// their consumption is kept as an idle group's is. A group that comes back starts as a
    /// new one, relearning what its clients hold. Returns how many were forgotten.
    pub fn forget_groups(&mut self, now: Nanos, gone: impl Fn(&GroupName, &GroupName) -> bool) -> usize {
        while !self.tick_slice(usize::MAX) {}
        let leaving: std::collections::HashSet<GroupName> =
            self.tracked.keys().filter(|n| gone(n, self.root_of(n))).cloned().collect();
        if leaving.is_empty() {
            return 0;
        }
        let gone = |name: &GroupName| leaving.contains(name);
        let mut forgotten = Vec::new();
        self.tracked.retain(|name, g| {
            let keep = !gone(name);
            if !keep {
                let ramp = g.ramp.as_ref().map(|r| (r.value(), r.settings().resume_ttl));
                forgotten.push((name.clone(), ramp, g.meter_entry()));
            }
            keep
        });
        self.provisional.forget(gone);
        self.slots.retain(|name, _| !gone(name));
        self.classes.forget(gone);
        let n = forgotten.len();
        self.let_go(now, forgotten);
        n
    }

    /// What a forgotten group leaves: a resumable ramp's pool, and its meter when it is kept.
    fn let_go(&mut self, now: Nanos, gone: Vec<LetGo>) {
        for (name, ramp, meter) in gone {
            if let Some((value, Some(ttl))) = ramp
                && self.resume.len() < self.settings.max_tracked_groups
            {
                self.resume.insert(name.clone(), (value, now.after(ttl)));
            }
            // A configured group's consumption is kept (it is billed and budgeted on), and so
            // is a group's that a pattern's or the default's quotas count (up to as many as
            // are tracked); another unconfigured one's goes with it, once what it consumed
            // since the store last took it has been taken (its name is among the changed ones).
            if (meter.dirty && self.metering.on)
                || self.catalog.contains_key(&name)
                || self.keeps_meter_for_quotas(&name)
            {
                self.metering.idle.insert(name, meter);
            }
        }
    }
}

impl TickRun {
    /// Once the rows are made (and their claims summed): with a capacity or saturated
    /// backends' pools to share, the sharing is a step of its own, for a caller that computes
    /// it without the engine; else the last walk begins.
    fn share_or_apply(&mut self, capacity: bool) {
        if capacity || !self.limited.is_empty() {
            self.sharing = true;
        } else {
            self.start_applying(None, Vec::new());
        }
    }

    /// The rows are made and shared: the last walk begins.
    fn start_applying(&mut self, shares: Option<Vec<f64>>, fair: Vec<(u32, Option<f64>)>) {
        self.shares = shares;
        self.fair = fair;
        self.fair_next = 0;
        self.sharing = false;
        self.applying = true;
        self.next = 0;
    }

    /// Row `i`'s limiting rate: its pool's fair share where saturation's pools were shared
    /// (rows come in order), else what the row found.
    fn limiting(&mut self, i: usize, found: OrNan) -> OrNan {
        match self.fair.get(self.fair_next) {
            Some(&(r, fair)) if r as usize == i => {
                self.fair_next += 1;
                OrNan::new(fair)
            }
            _ => found,
        }
    }

    /// Adds a group's last tick to the node's totals.
    fn count(&mut self, admitted: f32, throttled: f32, demand: f64, clients: usize) {
        let totals = &mut self.totals;
        totals.admitted += f64::from(admitted);
        totals.throttled += f64::from(throttled);
        totals.demand += demand;
        totals.clients += clients as u64;
    }
}

/// The sharing of the capacity in a tick, taken out of the engine by
/// [`Engine::shares_work`] to be computed without it.
pub struct SharesWork {
    /// The ticks done when it was taken: it belongs to the next.
    tick: u64,
    capacity: Option<f64>,
    /// The tick's rows, shared with the engine until it is computed (read only meanwhile).
    rows: Arc<Vec<Row>>,
    /// The groups the rate law limits, whose backends' pools are shared.
    limited: Vec<Limited>,
}

impl std::fmt::Debug for SharesWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharesWork").field("tick", &self.tick).field("rows", &self.rows.len()).finish()
    }
}

impl SharesWork {
    /// Shares the capacity among the rows' claims, and each saturated backend's pool among
    /// the groups it limits, as the tick itself would.
    pub fn compute(mut self) -> Shares {
        let shares = self.capacity.map(|capacity| {
            let claims: Vec<Claim> = self.rows.iter().map(Row::claim).collect();
            allocate(capacity, &claims)
        });
        Shares { tick: self.tick, shares, fair: share_pools(&mut self.limited) }
    }
}

/// The sharing computed from a [`SharesWork`], for [`Engine::put_shares`].
#[derive(Debug)]
pub struct Shares {
    tick: u64,
    shares: Option<Vec<f64>>,
    fair: Vec<(u32, Option<f64>)>,
}

/// Forgets the clients of a group that have not reported within `expiry`, and the earlier
/// incarnations of restarted ones (`released`, sorted).
fn forget_silent_clients(
    clients: &mut Vec<super::ClientEntry>,
    now: Nanos,
    expiry: std::time::Duration,
    released: &[super::split::ClientId],
) {
    if released.is_empty() {
        clients.retain(|c| now.since(c.seen) <= expiry);
    } else {
        clients.retain(|c| now.since(c.seen) <= expiry && released.binary_search(&c.client).is_err());
    }
    if clients.capacity() > 2 * clients.len() + 4 {
        clients.shrink_to_fit();
    }
}

/// Gives back most of a map's room once it holds far less than it could.
fn shrink<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(map: &mut HashMap<K, V, S>) {
    if let Some(room) = room_to_keep(map.len(), map.capacity()) {
        map.shrink_to(room);
    }
}

/// The room a table of `len` entries keeps when it holds far less than its `capacity`.
fn room_to_keep(len: usize, capacity: usize) -> Option<usize> {
    (capacity > 64 && len < capacity / 4).then_some(len * 2)
}

/// A group's target, as docs/architecture.md writes it:
/// `max(reserved, min(cap, limiting or headroom, share))`. `None` when nothing bounds the
/// group (no limit, no saturation, no capacity to share): it is not throttled, whatever it
/// reserves.
#[inline]
pub(crate) fn target(
    reserved: f64,
    cap: f64,
    limiting_or_headroom: Option<f64>,
    share: Option<f64>,
) -> Option<f64> {
    let mut bound = cap;
    if let Some(l) = limiting_or_headroom {
        bound = bound.min(l);
    }
    if let Some(s) = share {
        bound = bound.min(s);
    }
    let target = bound.is_finite().then(|| reserved.max(bound));
    debug_assert!(
        target.is_none_or(|t| t >= reserved || reserved.is_nan()),
        "a target below its reservation"
    );
    target
}

/// What saturation says of a group from the load its backends reported.
#[derive(Debug, Clone, Copy, Default)]
struct Pressure {
    /// The load, units/s.
    load: f64,
    /// The ratio applied (under the multiplicative and rate laws; the quota law's per zone).
    ratio: Option<f64>,
    /// Saturation's limiting rate; none below saturation.
    limiting: Option<f64>,
    /// Under the rate law, the saturated backend the limiting rate comes from, by its place
    /// among the tick's backends: its pool is shared by [`super::fair`].
    backend: Option<u32>,
}

/// Saturation's pressure on a group with load `l` (slot `slot` of the tick's loads), by the
/// law in force. `before` is its last outcome (the multiplicative law scales the limiting
/// rate it had).
fn saturation_of(
    sat: &super::SaturationSettings,
    l: &super::saturation::GroupLoad,
    quota_zones: &[super::saturation::Zones],
    slot: u32,
    ignore: usize,
    before: Option<&GroupOutcome>,
) -> Pressure {
    let mark = sat.limiting_mark(&l.zones, ignore);
    let ratio = mark.map(|m| m.value);
    let backend = mark.filter(|_| sat.law == LimitingLaw::Rate).map(|m| m.backend_index());
    let limiting = match sat.law {
        LimitingLaw::Rate => ratio.map(|r| l.load * r),
        // The quota law's per-zone figures are rates already: the same pick of the (k+1)-th
        // smallest zone gives the limiting rate.
        LimitingLaw::Quota => sat.limiting_ratio(&quota_zones[slot as usize], ignore),
        LimitingLaw::Multiplicative => {
            let was = before.and_then(GroupOutcome::limiting).unwrap_or(l.load);
            ratio.map(|r| was * r)
        }
    };
    Pressure { load: l.load, ratio, limiting, backend }
}

/// The saturated backends a group with load `l` counts on, most pressing first, for a trace.
fn limiters(
    l: &super::saturation::GroupLoad,
    reporting: &super::saturation::Reporting,
    ignore: usize,
) -> Vec<super::Limiter> {
    let mut zones = l.zones.clone();
    zones.retain(|z| !z.is_healthy());
    zones.sort_by(|a, b| a.value.total_cmp(&b.value));
    zones
        .iter()
        .enumerate()
        .map(|(i, mark)| {
            let (backend, zone) = reporting.names(mark);
            super::Limiter {
                backend: backend.to_string(),
                zone: zone.to_string(),
                ratio: mark.value,
                ignored: i < ignore,
            }
        })
        .collect()
}

/// A group's reservation and cap for this tick. The ceiling is its limit, or nothing once a
/// quota of it is spent (its reservation then holds nothing either: a floor within its
/// quotas); the cap is the ceiling within its ramp's pool. Slow start (Couchbase) holds a
/// tenth of the reservation until a client has been seen by a tick.
fn bounds(g: &super::Tracked, slow_start: bool, left: Option<f64>) -> (f64, f64) {
    let settings = g.settings.as_deref();
    let spent = left.is_some_and(|l| l <= 0.0);
    let mut reserved = if spent { 0.0 } else { settings.map_or(0.0, GroupSettings::reserved) };
    if slow_start && (!g.had_clients || g.clients.is_empty()) {
        reserved *= SLOW_START_SHARE;
    }
    let mut ceiling = match settings {
        Some(s) => super::quota_cap(s.limit().as_f64(), left),
        None => Limit::Unlimited.as_f64(),
    };
    // FoundationDB's accounting: the limit and the reservation bound reads and writes each, so
    // in units of both they reach further. The reservation never passes the limit.
    if settings.is_some_and(GroupSettings::reads_writes_apart)
        && let Some((desired, reserving)) = g.detail.as_deref().and_then(super::Detail::apart_factors)
    {
        ceiling *= desired;
        reserved = (reserved * reserving).min(ceiling);
    }
    let cap = g.ramp.as_ref().map_or(ceiling, |r| ceiling.min(r.pool() as f64));
    (reserved, cap)
}

/// What the trees of nested groups leave each of them.
type Nesting = HashMap<GroupName, crate::hierarchy::Bound, super::FixedHasher>;

/// What bounds a group this tick: its reservation, its cap, its burst, and whether a quota
/// of it is spent (in a regional engine the tier above counts the windows, and the region's
/// allotments bound what its clients admit).
fn limits_of(
    g: &super::Tracked,
    name: &GroupName,
    settings: &super::EngineSettings,
    (quotas, nesting, upstream): (&super::allot::Quotas, &Nesting, &super::upstream::Upstream),
) -> (f64, f64, Option<f64>, bool) {
    let settings_now = g.settings.as_deref();
    let left =
        settings_now.filter(|_| upstream.is_none()).and_then(|s| quotas.left(name, s, g.meter.consumed));
    let (reserved, cap, burst) = contained(
        bounds(g, settings.slow_start, left),
        settings_now.and_then(GroupSettings::burst),
        nesting.get(name),
        super::upstream::ceiling(upstream, name),
    );
    (reserved, cap, burst, left.is_some_and(|l| l <= 0.0))
}

/// A group's reservation, cap and burst within what holds it: what its tree leaves a nested
/// group (whose reservation is part of its parent's), and what the tier above granted a
/// regional engine's group.
fn contained(
    (mut reserved, mut cap): (f64, f64),
    burst: Option<f64>,
    nested: Option<&crate::hierarchy::Bound>,
    above: Option<super::UpstreamGrant>,
) -> (f64, f64, Option<f64>) {
    if let Some(b) = nested {
        cap = cap.min(b.cap);
        reserved = reserved.min(b.reserved).min(cap);
    }
    let Some(a) = above else { return (reserved, cap, burst) };
    cap = cap.min(a.rate);
    reserved = reserved.min(cap);
    let burst = if a.rate.is_finite() { Some(burst.map_or(a.burst, |b| b.min(a.burst))) } else { burst };
    (reserved, cap, burst)
}

/// What each of `asked` was granted at the last tick (`before`, sorted by client), into `held`:
/// NaN for a client it did not know.
fn held_before(held: &mut Vec<f64>, before: &[ClientGrant], asked: &[Asking]) {
    held.clear();
    held.extend(
        asked.iter().map(|c| {
            before.binary_search_by_key(&c.client, |g| g.client).map_or(f64::NAN, |i| before[i].rate)
        }),
    );
}

/// A group's clients' asks, appended to the tick's list; returns their demand and unthrottled
/// units/s, added up as `Iterator::sum` would (from −0.0).
fn asks(clients: &[super::ClientEntry], asking: &mut Vec<Asking>) -> (f64, f64) {
    let (mut demand, mut unthrottled) = (-0.0, -0.0);
    for c in clients {
        demand += f64::from(c.demand);
        unthrottled += f64::from(c.unthrottled);
        asking.push(Asking {
            client: c.client,
            demand: f64::from(c.demand),
            unthrottled: f64::from(c.unthrottled),
            using: f64::from(c.rates[0]),
        });
    }
    (demand, unthrottled)
}

/// The grant policy at a tick: `target` split over the clients that `asked` by water level
/// (into `grants`, cleared first); with no target every client is unbounded. Returns the water
/// level.
fn grant(
    grants: &mut Vec<ClientGrant>,
    target: Option<f64>,
    row: &Row,
    asked: &[Asking],
    scratch: &mut Vec<f64>,
) -> Option<f64> {
    grants.clear();
    grants.reserve_exact(asked.len());
    let Some(t) = target else {
        grants.extend(asked.iter().map(|c| ClientGrant {
            client: c.client,
            rate: f64::INFINITY,
            burst: f64::INFINITY,
        }));
        return None;
    };
    let level = split_into(grants, t, asked, row.burst(), scratch);
    // Conservation: what the clients are granted adds up to the target (within rounding).
    debug_assert!(
        grants.iter().map(|g| g.rate).sum::<f64>() <= t * (1.0 + 1e-9) + 1e-9,
        "grants past the target {t}"
    );
    Some(level)
}

/// What the last walk decided for a group, for its trace.
struct Decided {
    share: Option<f64>,
    target: Option<f64>,
    water_level: Option<f64>,
    avg_cost: f64,
    busy: bool,
    /// Saturation's limiting rate, once its backend's pool is shared.
    saturation: Option<f64>,
}

/// A group's rate computation as a trace event.
fn rate_event(
    t: f64,
    name: &GroupName,
    g: &super::Tracked,
    row: &Row,
    d: Decided,
    traced: Traced,
) -> super::TraceEvent {
    super::TraceEvent::Rate(super::RateComputation {
        t,
        group: name.to_string(),
        reserved: row.reserved,
        desired: row.cap.is_finite().then_some(row.cap),
        limiting: d.saturation,
        headroom: row.headroom(),
        ratio: traced.ratio,
        share: d.share,
        target: d.target,
        per_client: d.water_level,
        clients: row.clients,
        demand: row.demand,
        unthrottled: row.unthrottled,
        admitted: f64::from(g.admitted_last_tick),
        load: row.load,
        average_cost: d.avg_cost,
        busy: d.busy,
        limited_by: traced.limited_by,
    })
}
