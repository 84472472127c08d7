//! The engine: Tollgate's one model of demand, allocation and grants.
//!
//! Every way of running Tollgate drives this one type: the embedded limiter (one client, in
//! process), `tollgate server` (behind gRPC) and `tollgate sim` (in virtual time). It holds the
//! only copy of the group settings, the node's capacity and allocation mode, and the lease;
//! it takes client reports ([`Engine::report`]) and backend reports
//! ([`Engine::backend_report`]), and each [`Engine::tick`] computes, per group:
//!
//! ```text
//! ceiling   = limit, or reserved once the budget is spent
//! cap       = min(ceiling, ramp pool)                     (the ramp, when the group has one)
//! limiting  = load × ratio                                (FoundationDB; absent below saturation)
//!             then, per saturated backend, the sum of its groups' shared max-min over
//!             their demand: a group asking less than its share is not limited (`fair`)
//! share     = allocation of the node capacity             (by priority and weight, or first come)
//! target    = max(reserved, min(cap, limiting, share));  busy = limiting < cap
//! ```
//!
//! Unthrottled work is always admitted and charged to its client's bucket; in the capacity's
//! allocation it counts as reserved (up to the group's cap), so other groups make room for it.
//!
//! and splits the target over the group's clients (see [`water_level`]). A group that nothing
//! bounds (no limit, no saturation, no capacity) is not throttled.
//!
//! **Grant policy.** A client the last tick knows gets its share. A client it does not know
//! yet (new, restarted, or the group is new) gets only what the target has left after every
//! grant already made, or what it says it holds if that is less: so the live grants of a group
//! never add up to more than its target, from the first exchange on. Groups whose clients may
//! hold grants the engine did not give (after a restart, an election, a shard's move) are
//! learnt for one lease ([`Engine::relearn`]): no client of theirs gets more than it holds.
//! Before a group's first tick its target is bounded by its settings and by the room the
//! capacity has left: what the last tick's groups did not ask for, less what other new groups
//! took since (each takes a part of it, [`NEWCOMER_ROOM_SHARE`]), so a new group is served at
//! once. When no room is left (one group asks for the whole capacity), new groups still get
//! their first grants from an overdraft of at most the capacity again
//! ([`NEWCOMER_OVERDRAFT_SHARE`]) until the next tick, which shares the capacity among all
//! of them and takes it back from the busiest.
//!
//! Everything is bounded: tracked groups (past the bound, new names share the `default`
//! group's state), clients, backends and resumable ramps; idle groups, silent clients and
//! silent backends expire.

mod above;
mod allot;
mod catalog;
mod classes;
mod clients;
mod diagnostics;
mod fair;
mod learning;
mod metering;
mod provisional;
mod quota_progress;
mod saturation;
mod slots;
mod split;
mod tick;
mod trace;
mod upstream;
mod view;
mod windows;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

pub use allot::{ALLOTMENT_MIN, Allotment, LASTS_MAX, LIFE_SPENT_RETRY, QuotaHeld};
pub use clients::ClientError;
pub use diagnostics::{BackendView, ClientView, Diagnostics, TOP_GROUPS};
pub use learning::Relearn;
pub use saturation::{COST_FOLDING_S, Health, LimitingLaw, SaturationSettings};
pub use slots::InFlight;
pub use split::{ClientGrant, ClientId, water_level};
pub use tick::{
    Shares, SharesWork, SliceSize, TICK_SLICE_BOUNDS, TICK_SLICE_GROUPS, TICK_SLICE_TARGET, first_slice,
    next_slice,
};
pub use trace::{BusyGroup, Limiter, RateComputation, TRACE_BUFFER_MAX, TraceEvent};
pub use upstream::{UpstreamGrant, UpstreamUsage};
pub use view::GroupView;
pub use windows::{RateMarks, RateNow, RateWindows};

use crate::allocate::AllocationMode;
use crate::ramp::Ramp;
use crate::settings::{BudgetPeriod, GroupName, GroupSettings};
use crate::time::Nanos;

use catalog::{Catalog, root_in, settings_in};
pub use classes::ClassTotals;
use clients::ClientTable;
use metering::MeterEntry;
use saturation::BackendState;

/// The engine's node-wide settings: the one place they are held.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// The node's capacity in units/s, if it is shared by allocation.
    pub capacity: Option<f64>,
    /// How the free capacity is shared.
    pub mode: AllocationMode,
    /// Couchbase's slow start: a group with no client reserves a tenth of its reservation, and
    /// all of it from the tick after its first client appears.
    pub slow_start: bool,
    /// How often targets are recomputed; also the exchange period asked of clients.
    pub tick: Duration,
    /// How long a grant holds without renewal.
    pub lease: Duration,
    /// Groups with no client report for this long are forgotten.
    pub group_idle_expiry: Duration,
    /// Client and backend reports older than this no longer count.
    pub report_expiry: Duration,
    /// Groups tracked separately; past it, new names share the default group's state.
    pub max_tracked_groups: usize,
    /// Clients tracked at once; past it, new clients are refused until others go quiet.
    pub max_clients: usize,
    /// Backends tracked at once; past it, new backends' reports are refused.
    pub max_backends: usize,
    /// FoundationDB's saturation knobs.
    pub saturation: SaturationSettings,
    /// Folding time of the average-cost smoothers.
    pub cost_folding: Duration,
    /// Over how long a client takes up a raised grant (TiDB's trickle): zero, at once.
    pub trickle: Duration,
    /// Every group in shadow mode: grants are computed as usual and carried out as a count
    /// of what would have been refused, never as a refusal.
    pub shadow: bool,
    /// The one switch (FoundationDB's and TiDB's): `false` grants every group without limit,
    /// every setting kept and every tick still computed, so turning it back on restores the
    /// limits at the next exchange.
    pub throttling: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            capacity: None,
            mode: AllocationMode::Share,
            slow_start: false,
            tick: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            group_idle_expiry: Duration::from_secs(240),
            report_expiry: Duration::from_secs(10),
            max_tracked_groups: 100_000,
            max_clients: 100_000,
            max_backends: 10_000,
            saturation: SaturationSettings::default(),
            cost_folding: Duration::from_secs(2),
            trickle: Duration::ZERO,
            shadow: false,
            throttling: true,
        }
    }
}

/// What one client says about one group at a report (see [`crate::demand`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClientReport {
    /// Units/s asked for, admitted or not, unthrottled work included.
    pub demand: f64,
    /// Units/s consumed by unthrottled work.
    pub unthrottled: f64,
    /// Units waiting for admission now.
    pub waiting: f64,
    /// Units consumed since the last report.
    pub consumed: f64,
    /// Requests admitted since the last report.
    pub requests: f64,
    /// Requests refused since the last report.
    pub throttled: f64,
    /// The rate of the live grant the client holds (0: none).
    pub held: f64,
    /// Requests admitted after waiting for tokens since the last report.
    pub waited: f64,
    /// What its settled requests did since the last report, in detail.
    pub detail: crate::cost::Consumption,
    /// Requests admitted in shadow mode since the last report that would have been refused.
    pub would_refuse: f64,
    /// Requests it holds in flight now (in a group with an in-flight quota).
    pub in_flight: u32,
    /// The most requests it held or tried to hold in flight at once since its last report.
    pub in_flight_asked: u32,
    /// Critical and sheddable requests admitted and refused since the last report (normal
    /// ones are the rest of `requests` and `throttled`).
    pub classes: [[u64; 2]; 2],
    /// The allotment the client holds of the group's quotas (the default: none), for a
    /// client that takes allotments; `None` for one that does not, which is given none. See
    /// [`Allotment`].
    pub quota: Option<QuotaHeld>,
}

/// A client's grant for one group: a rate, a burst and a lease (a duration, never a deadline).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// Units/s; infinite when the group is not throttled.
    pub rate: f64,
    /// Units the client may bank.
    pub burst: f64,
    /// How long the grant holds without renewal.
    pub lease: Duration,
    /// The group's reservation.
    pub reserved: f64,
    /// How many clients share the group (at least 1).
    pub clients: u32,
    /// What dropped work does, from the group's settings (the client carries it out).
    pub dropped: crate::settings::DroppedWork,
    /// Over how long a debt is paid back, from the group's settings.
    pub debt_repay: Duration,
    /// Over how long the client takes up a grant that rises (TiDB's trickle).
    pub trickle: Duration,
    /// Shadow mode, the group's or the node's: the client never refuses, and counts what it
    /// would have refused.
    pub shadow: bool,
    /// The share of the burst kept for critical work, from the group's settings (see
    /// [`crate::class`]).
    pub critical_reserve: f64,
    /// The client's share of the group's in-flight quota: how many requests it may hold in
    /// flight at once (`None`: no such limit).
    pub in_flight: Option<u32>,
    /// In a group with quotas: more units the client may admit in the window under way, on
    /// top of its rate (`None`: the group has no quota).
    pub quota: Option<Allotment>,
}

impl Grant {
    /// Whether the group is not throttled.
    pub fn is_unlimited(&self) -> bool {
        self.rate.is_infinite()
    }

    /// What a client falls back to in safe mode: its part of the reservation.
    pub fn floor(&self) -> f64 {
        self.reserved / f64::from(self.clients.max(1))
    }
}

/// A group's consumption since it was first seen: what it is billed on and what a budget is
/// checked against.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Meter {
    /// Units consumed.
    pub consumed: f64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused.
    pub throttled: u64,
    /// Requests admitted after waiting for tokens.
    pub waited: u64,
    /// Requests admitted in shadow mode that would have been refused.
    pub would_refuse: u64,
}

/// An optional rate kept as one number, NaN for none: state kept for every group (and every
/// row of a tick) stays a plain `f64` where `Option<f64>` would take two words. Read it with
/// [`get`](Self::get); never compare the number itself.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct OrNan(f64);

impl OrNan {
    /// `v`, or none.
    #[inline]
    pub(crate) fn new(v: Option<f64>) -> OrNan {
        OrNan(v.unwrap_or(f64::NAN))
    }

    /// The rate, if there is one.
    #[inline]
    pub(crate) fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }
}

/// What a tick decided for one group. One of these lives in every tracked group, so its
/// optional rates are kept as one number each (NaN for none), read through methods.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupOutcome {
    target: OrNan,
    /// Saturation's limiting rate, or the headroom when `at_headroom`.
    limiting: OrNan,
    share: OrNan,
    water_level: OrNan,
    /// Limiting is below the cap.
    pub busy: bool,
    /// `limiting` is the headroom rate (see [`GroupOutcome::headroom`]).
    at_headroom: bool,
    /// Average cost per request, units.
    pub avg_cost: f64,
    /// Total demand, units/s (waiting work included).
    pub demand: f64,
    /// Units/s of unthrottled work (for display: single precision keeps the state small).
    pub unthrottled: f32,
    /// Load reported by backends, units/s (for display, as above).
    pub load: f32,
    /// A quota of the group is spent: it admits nothing, its reservation included.
    pub budget_exhausted: bool,
    /// Requests/s refused over the last tick (for display).
    pub throttled: f32,
    /// Each client's grant, by client.
    pub grants: Vec<ClientGrant>,
}

impl GroupOutcome {
    /// Target in units/s; `None` when the group is not throttled.
    pub fn target(&self) -> Option<f64> {
        self.target.get()
    }

    /// Limiting rate from saturation, if a backend it uses is saturated.
    pub fn limiting(&self) -> Option<f64> {
        self.limiting.get().filter(|_| !self.at_headroom)
    }

    /// The headroom rate holding the group, if any: throttled at the tick before, its limit now
    /// above its target then, asking for more than this, and limited by no saturated backend,
    /// it may use its load on its backends below saturation and its share of their room
    /// (docs/control.md).
    pub fn headroom(&self) -> Option<f64> {
        self.limiting.get().filter(|_| self.at_headroom)
    }

    /// Share of the node capacity, if one is set.
    pub fn share(&self) -> Option<f64> {
        self.share.get()
    }

    /// The water level in units/s: what each busy client may use beyond its unthrottled work.
    pub fn water_level(&self) -> Option<f64> {
        self.water_level.get()
    }

    /// The sum of the grants' rates.
    pub fn granted(&self) -> f64 {
        self.grants.iter().map(|g| g.rate).sum()
    }

    /// The grant of `client`, if the tick knew it.
    pub fn grant_of(&self, client: ClientId) -> Option<&ClientGrant> {
        self.grants.binary_search_by_key(&client, |g| g.client).ok().map(|i| &self.grants[i])
    }

    /// [`grant_of`](Self::grant_of), trying place `at` first: where the client's entry sits
    /// in its group's list, which is most often where its grant sits too.
    fn grant_of_at(&self, client: ClientId, at: usize) -> Option<&ClientGrant> {
        match self.grants.get(at) {
            Some(g) if g.client == client => Some(g),
            _ => self.grant_of(client),
        }
    }
}

fn sample_of(g: &Tracked) -> GroupSample {
    let o = g.outcome.as_ref();
    [
        o.and_then(GroupOutcome::target).map_or(f32::NAN, |t| t as f32),
        g.admitted_last_tick,
        o.map_or(0.0, |o| o.demand as f32),
        o.map_or(0.0, |o| o.throttled),
        g.clients.len() as f32,
        f32::from(u8::from(o.is_some_and(|o| o.busy))),
    ]
}

/// Drops the earlier incarnations of restarted clients (`released`, sorted) from group `key`:
/// their places, their grants, and what was granted them since the last tick.
fn release(
    released: &[ClientId],
    key: &GroupName,
    g: &mut Tracked,
    provisional: &mut provisional::Provisional,
) {
    let gone = |c: ClientId| released.binary_search(&c).is_ok();
    g.clients.retain(|c| !gone(c.client));
    if let Some(o) = &mut g.outcome {
        o.grants.retain(|c| !gone(c.client));
    }
    provisional.release(key, gone, g.outcome.is_none());
}

/// One client's part in a group (`f32` rates: three words for every client of every group).
#[derive(Debug, Clone, Copy)]
struct ClientEntry {
    client: ClientId,
    /// Units/s asked, waiting work included.
    demand: f32,
    unthrottled: f32,
    /// Units/s consumed and requests/s refused, over the client's own reports (see
    /// [`client_rates`]): what every view of a group's rates adds up.
    rates: [f32; 2],
    seen: Nanos,
}

/// How long a report's interval must be for its rates to replace a client's outright.
pub const CLIENT_RATE_SPAN: Duration = Duration::from_secs(1);

/// A client's consumed units/s and refused requests/s after a report of `consumed` units and
/// `throttled` requests over `interval` (none for a client's first report: a tick), given
/// what they were. Rates follow each client's own reports rather than how reports fall
/// between ticks: a client reporting once a second beside a tick of a second would otherwise
/// show 0 at one tick and double at the next.
///
/// A report over [`CLIENT_RATE_SPAN`] or more replaces the rates; a shorter one moves them by
/// what it counted over the span, less what the old rate would have counted over its interval.
/// So reports close together (an early exchange for a new group, say) neither turn a few
/// requests into a spike nor pull a steady rate towards 0, and every unit counts once.
fn client_rates(before: [f32; 2], consumed: f64, throttled: f64, interval: Duration) -> [f32; 2] {
    let span = CLIENT_RATE_SPAN.as_secs_f64();
    let dt = interval.as_secs_f64();
    let counted = [consumed.max(0.0), throttled.max(0.0)];
    std::array::from_fn(|i| {
        let rate = if dt >= span {
            counted[i] / dt
        } else {
            f64::from(before[i]) * (1.0 - dt / span) + counted[i] / span
        };
        rate.max(0.0) as f32
    })
}

/// A group's detailed consumption: its totals, and moving averages (folding time
/// `cost_folding`) of its read and write request units and its requests per second, whose
/// ratios are its average read and write cost per request (FoundationDB keeps the two apart).
#[derive(Debug, Default)]
struct Detail {
    totals: crate::cost::Consumption,
    /// The totals at the last tick.
    at_tick: crate::cost::Consumption,
    rru_rate: f64,
    wru_rate: f64,
    requests_rate: f64,
}

impl Detail {
    /// Folds what came since the last tick into the averages.
    fn tick(&mut self, elapsed: f64, keep: f64) {
        let d = self.totals.since(&self.at_tick);
        self.at_tick = self.totals;
        let fold = |avg: &mut f64, x: f64| *avg = *avg * keep + x / elapsed * (1.0 - keep);
        fold(&mut self.rru_rate, d.rru);
        fold(&mut self.wru_rate, d.wru);
        fold(&mut self.requests_rate, d.read_rpcs + d.write_rpcs);
    }

    /// How much further the limit and the reservation reach when reads and writes are
    /// accounted apart: `(desired, reserved)` factors on the units/s they are set in. With
    /// average costs per request `r` (reads) and `w` (writes), FoundationDB's desired rate is
    /// `min(L/r, L/w)` requests/s and its reserved rate `max(R/r, R/w)`; in units/s, at `r + w`
    /// a request, that is `L (r+w)/max(r,w)` and `R (r+w)/min(r,w)` (a kind that costs nothing
    /// sets no bound). `None` until there is anything to average.
    fn apart_factors(&self) -> Option<(f64, f64)> {
        if self.requests_rate <= 1e-9 {
            return None;
        }
        let (r, w) = (self.rru_rate / self.requests_rate, self.wru_rate / self.requests_rate);
        let (high, low) = (r.max(w), r.min(w));
        if high <= 0.0 {
            return None;
        }
        let low = if low > 0.0 { low } else { high };
        Some(((r + w) / high, (r + w) / low))
    }
}

/// A group's ceiling, units/s, given its `limit` and what is `left` of its tightest quota
/// (`None`: no quota): its limit, or nothing once a quota is spent. A reservation is a floor
/// within the quotas, never a way past them. What a window admits is bounded exactly by the
/// clients' allotments ([`Allotment`]); the rate only spreads it, so the last units of a
/// window are as quick to take as the first.
///
/// ```
/// use tollgate_model::engine::quota_cap;
/// assert_eq!(quota_cap(1000.0, None), 1000.0);
/// assert_eq!(quota_cap(1000.0, Some(40.0)), 1000.0);
/// assert_eq!(quota_cap(1000.0, Some(-3.0)), 0.0);
/// ```
pub fn quota_cap(limit: f64, left: Option<f64>) -> f64 {
    match left {
        Some(l) if l <= 0.0 => 0.0,
        _ => limit,
    }
}

/// The allotment of group `key`'s quotas for `client`, given its report `r` (see
/// [`Allotment`]); `None` for a group with no quota. A regional engine allots what the tier
/// above allotted the region. `released`: restarted clients' earlier incarnations. What the
/// client says it spent before this engine knew it that no metering holds is metered
/// ([`quota_progress::meter_unmetered`]).
fn allot_for(
    (quotas, metering): (&mut allot::Quotas, &mut metering::Metering),
    (released, settings, regional): (&[ClientId], &EngineSettings, bool),
    now: Nanos,
    key: &GroupName,
    g: &mut Tracked,
    client: ClientId,
    r: &ClientReport,
) -> Option<Allotment> {
    // A client that takes no allotments is given none.
    r.quota?;
    let s = g.settings.as_deref().filter(|s| s.has_quotas())?;
    let tick_s = settings.tick.as_secs_f64().max(1e-3);
    let ask = allot::Ask {
        now,
        group: key,
        settings: s,
        consumed: g.meter.consumed,
        client,
        held: r.quota,
        demand: r.demand.max(0.0) + r.waiting.max(0.0) / tick_s,
        // About two exchanges: a client exchanges every tick, or every half second at most,
        // unless it says it reports less often.
        horizon: r
            .quota
            .and_then(|q| q.lasts)
            .unwrap_or(settings.tick.max(Duration::from_millis(500)) * 2)
            .min(allot::LASTS_MAX),
    };
    if regional {
        return quotas.allot_regional(ask, released);
    }
    let allotment = quotas.allot(ask, released);
    quota_progress::meter_unmetered(quotas, metering, key, g);
    allotment
}

/// A tracked group's `load_slot` when it has none.
const NO_SLOT: u32 = u32::MAX;

/// The part of the capacity's free room a new group takes before its first tick, when its
/// clients have not said how much they want: small enough that many new groups arriving
/// together (each taking this part of what the ones before left) are all served at once.
pub const NEWCOMER_ROOM_SHARE: f64 = 1.0 / 16.0;

/// How many times what its clients ask a new group may take of the capacity's free room
/// before its first tick, when that is more than [`NEWCOMER_ROOM_SHARE`] of the room.
pub const NEWCOMER_ASK_FACTOR: f64 = 2.0;

/// How far beyond the capacity new groups together may be granted between two ticks, as a
/// part of the capacity, once its room is spent (another group asks for all of it): a new
/// tenant is still served at once, and the next tick takes what it needs back from the
/// busiest groups by the allocation's rules.
pub const NEWCOMER_OVERDRAFT_SHARE: f64 = 1.0;

/// The least a new group takes before its first tick while the overdraft lasts, as a part of
/// the capacity: enough for a first request at a thousandth of the capacity, when its clients
/// have not said how much they want yet.
pub const NEWCOMER_FLOOR_SHARE: f64 = 1.0 / 1000.0;

/// What a new group may take before its first tick, given the capacity, what is committed
/// already (the last tick's targets and other new groups' grants since) and what its clients
/// ask: part of the room left ([`NEWCOMER_ROOM_SHARE`] of it, or [`NEWCOMER_ASK_FACTOR`] times
/// its ask, within the room); and however little room is left, what it asks up to a sixteenth
/// of the overdraft left, at least [`NEWCOMER_FLOOR_SHARE`] of the capacity, within the
/// overdraft ([`NEWCOMER_OVERDRAFT_SHARE`]).
fn newcomer_take(capacity: f64, committed: f64, asked: f64) -> f64 {
    let room = (capacity - committed).max(0.0);
    let within = (room * NEWCOMER_ROOM_SHARE).max(asked * NEWCOMER_ASK_FACTOR).min(room);
    let overdraft = (capacity - committed + capacity * NEWCOMER_OVERDRAFT_SHARE)
        .clamp(0.0, capacity * NEWCOMER_OVERDRAFT_SHARE);
    let beyond =
        asked.min(overdraft * NEWCOMER_ROOM_SHARE).max(capacity * NEWCOMER_FLOOR_SHARE).min(overdraft);
    within.max(beyond)
}

/// Where a client's report for a group landed: the group's place in the tracked table and the
/// client's place in the group's list. Kept per client between exchanges and tried first the
/// next time, each checked (by name, by client) before it is used: a place that moved is
/// looked up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    group: u32,
    client: u32,
}

impl Place {
    /// Nowhere yet: both looked up.
    const UNKNOWN: Place = Place { group: u32::MAX, client: u32::MAX };
}

/// A tracked group's runtime state. One lives for every group in traffic, so it is kept
/// small: rates for display in `f32`, optional numbers as NaN.
struct Tracked {
    /// Sorted by client.
    clients: Vec<ClientEntry>,
    /// The ramp, when the settings have one (boxed: most groups have none).
    ramp: Option<Box<Ramp>>,
    last_report: Nanos,
    /// When it first asked for anything (nanoseconds; `u64::MAX`: not yet): its place in a
    /// first-come allocation.
    first_asked: u64,
    outcome: Option<GroupOutcome>,
    /// Its consumption.
    meter: Meter,
    /// Moving averages (folding time `cost_folding`) of its units/s and requests/s, whose ratio
    /// is its average cost per request, as FoundationDB keeps it.
    units_rate: f64,
    requests_rate: f64,
    /// Units consumed, requests admitted and requests refused since the last tick.
    since_tick: [f32; 3],
    /// Units/s consumed, its clients' rates added up at the last tick (requests/s refused
    /// are in the outcome).
    admitted_last_tick: f32,
    /// The meter changed since the store last took it.
    dirty: bool,
    /// The last tick saw a client: slow start's full reservation applies from the next.
    had_clients: bool,
    /// The settings that apply to it (its own or the default group's) as of
    /// `settings_generation`, refreshed by the next tick or report after the configured groups
    /// changed.
    settings: Option<Arc<GroupSettings>>,
    settings_generation: u32,
    /// Where a tick gathered its load from backends' reports ([`NO_SLOT`] outside a tick, and
    /// within one when no backend reported it): the tick takes it and clears it.
    load_slot: u32,
    /// Its consumption rate this 20-second bucket, and the marks of the ones before over the
    /// last minute and hour (made when its first bucket ends).
    rate_now: RateNow,
    rates: Option<Box<RateWindows>>,
    /// What its requests did in detail, since this engine first saw it, and its read and
    /// write costs per request (made when a client first reports any).
    detail: Option<Box<Detail>>,
}

impl Tracked {
    /// Metering at a tick: folds what was consumed, admitted and refused since the last tick
    /// (`elapsed` seconds ago) into the moving averages (`keep`: the weight of the past) and the
    /// consumption rate's windows. Returns the average cost per request (the ratio of the
    /// moving averages of units/s and requests/s, as FoundationDB keeps it; 1 before any
    /// request) and the requests/s refused.
    fn fold_rates(&mut self, now: Nanos, elapsed: f64, keep: f64, tick: Duration) -> (f64, f32) {
        let [units, requests, _] = self.since_tick.map(f64::from);
        self.units_rate = self.units_rate * keep + units / elapsed * (1.0 - keep);
        self.requests_rate = self.requests_rate * keep + requests / elapsed * (1.0 - keep);
        // The rates shown are the clients' own, added up: steady whatever the ticks. A client
        // silent for two of its report spans has stopped (or died): its rates no longer count.
        let silent = 2 * tick.max(CLIENT_RATE_SPAN);
        let (mut admitted, mut throttled) = (0.0f64, 0.0f64);
        for c in self.clients.iter().filter(|c| now.since(c.seen) <= silent) {
            admitted += f64::from(c.rates[0]);
            throttled += f64::from(c.rates[1]);
        }
        self.admitted_last_tick = admitted as f32;
        self.rate_now.add(&mut self.rates, now, admitted);
        self.since_tick = [0.0; 3];
        let avg_cost = if self.requests_rate > 1e-9 { self.units_rate / self.requests_rate } else { 1.0 };
        (avg_cost, throttled as f32)
    }

    /// Takes the settings that apply to it again if the configured groups changed since
    /// (`generation`); its ramp follows them, a changed ramp continuing from where the old one
    /// was.
    #[inline]
    fn follow_settings(
        &mut self,
        configured: &catalog::Configured,
        key: &GroupName,
        generation: u32,
        ramped: bool,
    ) {
        if self.settings_generation != generation {
            self.settings = settings_in(configured, key).cloned();
            self.settings_generation = generation;
        }
        let ramp_settings =
            if ramped { self.settings.as_deref().and_then(|s| s.ramp().copied()) } else { None };
        match (&mut self.ramp, ramp_settings) {
            (Some(r), Some(s)) if *r.settings() == s => {}
            (current, Some(s)) => {
                *current = Some(Box::new(Ramp::new(s, current.as_ref().map(|r| r.value()))))
            }
            (current, None) => *current = None,
        }
    }

    /// Ramp stepping for a report: an epoch with a call moves the ramp, and what was consumed
    /// counts as its use. Also marks when the group first asked for anything.
    #[inline]
    fn step_ramp(&mut self, now: Nanos, r: &ClientReport) {
        // Calls in this report's interval (a demand alone may be what is left of earlier ones).
        let called = r.requests > 0.0 || r.throttled > 0.0 || r.waiting > 0.0;
        if called || r.demand > 0.0 {
            self.first_asked = self.first_asked.min(now.0);
        }
        if called && let Some(ramp) = &mut self.ramp {
            ramp.at_epoch(now.0 / 1_000_000_000);
            ramp.use_units(r.consumed.max(0.0));
        }
    }

    /// A client's entry after its report `r` at `now` (its last looked for at `hint` first):
    /// its demand, waiting work included, and its rates carried on from the last.
    #[inline]
    fn client_entry(
        &self,
        now: Nanos,
        client: ClientId,
        hint: usize,
        r: &ClientReport,
        tick_s: f64,
    ) -> ClientEntry {
        let before = match self.clients.get(hint) {
            Some(c) if c.client == client => Some(c),
            _ => self.clients.binary_search_by_key(&client, |c| c.client).ok().map(|i| &self.clients[i]),
        };
        let (rates, interval) = match before {
            Some(c) => (c.rates, now.since(c.seen)),
            None => ([0.0; 2], Duration::from_secs_f64(tick_s)),
        };
        ClientEntry {
            client,
            demand: (r.demand.max(0.0) + r.waiting.max(0.0) / tick_s) as f32,
            unthrottled: r.unthrottled.max(0.0) as f32,
            rates: client_rates(rates, r.consumed, r.throttled, interval),
            seen: now,
        }
    }

    /// Puts a client's entry in place of its last (at `hint`, where it sat last time, if it
    /// still does; else found by a search) or inserts it; returns where it sits.
    #[inline]
    fn put_client(&mut self, entry: ClientEntry, hint: usize) -> usize {
        // Entries are one per client, so finding it at the hint is finding it.
        if self.clients.get(hint).is_some_and(|c| c.client == entry.client) {
            self.clients[hint] = entry;
            return hint;
        }
        match self.clients.binary_search_by_key(&entry.client, |c| c.client) {
            Ok(i) => {
                self.clients[i] = entry;
                i
            }
            Err(i) => {
                // Most groups have one or a few clients: grow one at a time.
                self.clients.reserve_exact(1);
                self.clients.insert(i, entry);
                i
            }
        }
    }

    /// Metering: adds what a report says was consumed, admitted, refused and waited since the
    /// client's last. Says whether the meter has just become dirty (it was clean before).
    #[inline]
    fn meter_report(&mut self, r: &ClientReport) -> bool {
        for (since, add) in self.since_tick.iter_mut().zip([r.consumed, r.requests, r.throttled]) {
            *since += add.max(0.0) as f32;
        }
        self.meter.consumed += r.consumed.max(0.0);
        self.meter.admitted += r.requests.max(0.0) as u64;
        self.meter.throttled += r.throttled.max(0.0) as u64;
        self.meter.waited += r.waited.max(0.0) as u64;
        self.meter.would_refuse += r.would_refuse.max(0.0) as u64;
        if !r.detail.is_zero() {
            self.detail.get_or_insert_default().totals.add(&r.detail);
        }
        !std::mem::replace(&mut self.dirty, true)
    }

    fn new(now: Nanos, ramp: Option<Box<Ramp>>, meter: MeterEntry) -> Self {
        Self {
            clients: Vec::new(),
            ramp,
            last_report: now,
            first_asked: u64::MAX,
            outcome: None,
            settings: None,
            settings_generation: u32::MAX,
            load_slot: NO_SLOT,
            meter: meter.meter,
            units_rate: 0.0,
            requests_rate: 0.0,
            since_tick: [0.0; 3],
            admitted_last_tick: 0.0,
            dirty: meter.dirty,
            had_clients: false,
            rate_now: RateNow::default(),
            rates: None,
            detail: None,
        }
    }

    /// Reads, without using them, the three allocations of its own a report reads apart
    /// from the state: its settings, its clients and its grants. Read together first, their
    /// cache misses overlap (at 100,000 groups each is a miss) instead of coming one after
    /// another.
    ///
    /// `client` is where the reporting client sat in the group's list last time (its entry and
    /// grant are read there first); the first entries when that is not known.
    #[inline(always)]
    fn warm(&self, client: u32) {
        let at = client as usize;
        std::hint::black_box((
            self.settings.as_deref().map(GroupSettings::reserved),
            self.clients.get(at).or(self.clients.first()).map(|c| c.seen),
            self.outcome.as_ref().and_then(|o| o.grants.get(at).or(o.grants.first())).map(|c| c.rate),
        ));
    }

    fn meter_entry(&self) -> metering::MeterEntry {
        metering::MeterEntry { meter: self.meter, dirty: self.dirty }
    }
}

/// Why a backend report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The table is full of live backends.
    #[error("too many backends: the controller tracks at most {max}")]
    TooMany {
        /// The bound.
        max: usize,
    },
}

/// A backend's report made ready to hand to [`Engine::put_backend_report`]: its zone, its
/// health and its loads, those that are not a positive number left out.
pub struct BackendReport {
    zone: String,
    health: Health,
    load: Arc<[(GroupName, f64)]>,
    total: f64,
}

impl BackendReport {
    /// The report of a backend in `zone`, in `health`, with the load each group puts on it.
    pub fn new(zone: &str, health: Health, mut loads: Vec<(GroupName, f64)>) -> Self {
        loads.retain(|(_, l)| l.is_finite() && *l > 0.0);
        let total = loads.iter().map(|(_, l)| l).sum();
        Self { zone: zone.to_string(), health, load: loads.into(), total }
    }

    /// The loads taken: (group, units/s), each a positive number.
    pub fn loads(&self) -> &Arc<[(GroupName, f64)]> {
        &self.load
    }
}

/// The report a backend's new one replaced (nothing for a new backend), to be dropped
/// without the engine.
pub struct Replaced {
    _old: Option<BackendState>,
}

/// Every tracked group's rates added up, as of the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Units/s consumed over the last tick.
    pub admitted: f64,
    /// Requests/s refused over the last tick.
    pub throttled: f64,
    /// Units/s asked for, waiting work included.
    pub demand: f64,
    /// Client-group pairs: each client counted once per group it reports.
    pub clients: u64,
}

/// A group's state now in a few numbers, for histories: target (NaN when not throttled),
/// admitted units/s, demand, refused requests/s, clients, busy (0 or 1).
pub type GroupSample = [f32; 6];

/// foldhash with a fixed seed: deterministic iteration, so simulations replay from their
/// seed, and several times faster than SipHash on short names (the tick looks every group up
/// in several maps). Group names are not attacker-chosen keys of an unbounded map here:
/// tracking is bounded.
pub(crate) type FixedHasher = foldhash::fast::FixedState;

/// The tracked groups, by name, in the order they were first tracked.
type Tracking = indexmap::IndexMap<GroupName, Tracked, FixedHasher>;

/// The engine. See the [module documentation](self).
pub struct Engine {
    settings: EngineSettings,
    /// The configured groups, shared with the tracked ones (each keeps the settings that
    /// apply to it).
    catalog: Catalog,
    /// In the order groups were first tracked: a tick walks them in slices by position, and a
    /// group tracked while a tick is under way joins the end, after the tick's walks.
    tracked: Tracking,
    /// The meters of groups not tracked now, and which changed since the store took them.
    metering: metering::Metering,
    /// Grants made since the last tick to clients the tick did not know, by group.
    provisional: provisional::Provisional,
    /// The in-flight quotas' holders, by group (only groups with an in-flight quota).
    slots: HashMap<GroupName, slots::Ledger, FixedHasher>,
    /// In a regional engine, what the tier above granted each group ([`upstream`]).
    upstream: upstream::Upstream,
    /// Requests admitted and refused by class since this engine first saw a critical or
    /// sheddable one in the group (only such groups).
    classes: classes::Classes,
    backends: BTreeMap<String, BackendState>,
    clients: ClientTable,
    /// Earlier incarnations of restarted clients, whose places the next tick drops.
    released: Vec<ClientId>,
    /// Ramps of groups that went idle, kept for their resume TTL: (value, until).
    resume: HashMap<GroupName, (f64, Nanos), FixedHasher>,
    /// Per group with a budget counted per period: the period, and the group's consumption
    /// when it began.
    quotas: allot::Quotas,
    /// When the engine began, and the learning leases under way.
    learning: learning::Learning,
    /// The tick under way, what the last one found, and the buffers kept between ticks.
    ticking: tick::Ticking,
    /// Events waiting to be taken, while tracing is on.
    trace: Option<trace::TraceBuffer>,
}

/// The grant of a group without a rate (the engine does not throttle, or the group is not
/// limited): its settings as a grant carries them, with no rate, in-flight quota or allotment.
fn unlimited_grant(engine: &EngineSettings, settings: Option<&GroupSettings>, clients: usize) -> Grant {
    Grant {
        rate: f64::INFINITY,
        burst: f64::INFINITY,
        lease: engine.lease,
        reserved: settings.map_or(0.0, GroupSettings::reserved),
        clients: (clients as u32).max(1),
        dropped: settings.map(GroupSettings::dropped).unwrap_or_default(),
        debt_repay: settings.map_or(crate::settings::DEBT_REPAY_DEFAULT, GroupSettings::debt_repay),
        trickle: engine.trickle,
        shadow: engine.shadow || settings.is_some_and(GroupSettings::shadow),
        critical_reserve: settings.map_or(0.0, GroupSettings::critical_reserve),
        in_flight: None,
        quota: None,
    }
}

impl Engine {
    /// Turns the trace of every rate computation on or off (off drops what was not taken).
    pub fn set_tracing(&mut self, on: bool) {
        if on != self.trace.is_some() {
            self.trace = on.then(trace::TraceBuffer::default);
        }
    }

    /// Whether tracing is on.
    pub fn is_tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// The events since the last take, and how many were dropped for want of room.
    pub fn take_trace(&mut self) -> (Vec<TraceEvent>, u64) {
        match &mut self.trace {
            Some(t) => (std::mem::take(&mut t.events), std::mem::take(&mut t.dropped)),
            None => (Vec::new(), 0),
        }
    }

    /// Seconds since the engine started, for trace events.
    fn trace_time(&self, now: Nanos) -> f64 {
        self.learning.began().map_or(0.0, |s| now.since(s).as_secs_f64())
    }

    /// An engine with no groups.
    pub fn new(settings: EngineSettings) -> Self {
        let clients = ClientTable::new(settings.max_clients);
        Self {
            settings,
            catalog: Catalog::default(),
            tracked: Tracking::default(),
            metering: metering::Metering::default(),
            provisional: provisional::Provisional::default(),
            slots: HashMap::default(),
            upstream: None,
            classes: classes::Classes::default(),
            backends: BTreeMap::new(),
            clients,
            released: Vec::new(),
            resume: HashMap::default(),
            quotas: allot::Quotas::default(),
            learning: learning::Learning::default(),
            ticking: tick::Ticking::default(),
            trace: None,
        }
    }

    /// The node-wide settings.
    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Sets the node capacity (`None`: none).
    pub fn set_capacity(&mut self, capacity: Option<f64>) {
        self.settings.capacity = capacity;
    }

    /// Sets how free capacity is shared.
    pub fn set_mode(&mut self, mode: AllocationMode) {
        self.settings.mode = mode;
    }

    /// Turns slow start on or off.
    pub fn set_slow_start(&mut self, on: bool) {
        self.settings.slow_start = on;
    }

    /// Puts every group in shadow mode, or takes the node out of it (groups whose own
    /// settings ask for shadow mode stay in it). Clients take it up at their next exchange.
    pub fn set_shadow(&mut self, on: bool) {
        self.settings.shadow = on;
    }

    /// The one switch: throttling on or off for the whole node, every setting kept. Clients
    /// take it up at their next exchange.
    pub fn set_throttling(&mut self, on: bool) {
        self.settings.throttling = on;
    }

    /// Sets (or replaces) a group's settings.
    pub fn set_group(&mut self, name: GroupName, settings: GroupSettings) {
        self.catalog.set(name.clone(), settings);
        if !self.tracked.contains_key(&name) {
            self.metering.idle.entry(name).or_default();
        }
    }

    /// Removes a group's settings (it falls back to the default group's) and forgets its
    /// consumption; returns what it had.
    pub fn remove_group(&mut self, name: &GroupName) -> Option<GroupSettings> {
        let before = self.catalog.remove(name);
        self.metering.idle.remove(name);
        // Its clients may go on: what they consume from now on is another group's life (a
        // group made again by the name counts its quotas afresh).
        if let Some(g) = self.tracked.get_mut(name) {
            g.meter = Meter::default();
        }
        self.quotas.forget(name);
        before.map(Arc::unwrap_or_clone)
    }

    /// What the trees of nested groups leave `group` this tick, if it is nested.
    pub fn nesting(&self, group: &GroupName) -> Option<crate::hierarchy::Bound> {
        self.catalog.nesting(group)
    }

    /// A configured group's settings.
    pub fn group(&self, name: &GroupName) -> Option<&GroupSettings> {
        self.catalog.get(name).map(|s| &**s)
    }

    /// The settings that are allowed but probably not meant, in words for people
    /// ([`settings_warnings`](crate::config::settings_warnings)): reservations past the
    /// capacity, a limit above it, a priority or weight in the first-come mode.
    pub fn warnings(&self) -> Vec<String> {
        let groups = self.groups();
        crate::config::settings_warnings(self.settings.capacity, self.settings.mode, groups.into_iter())
    }

    /// Every configured group with its settings, sorted by name.
    pub fn groups(&self) -> Vec<(&GroupName, &GroupSettings)> {
        let mut all: Vec<(&GroupName, &GroupSettings)> =
            self.catalog.iter().map(|(n, s)| (n, &**s)).collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all
    }

    /// How many groups are configured.
    pub fn configured_groups(&self) -> usize {
        self.catalog.len()
    }

    /// The settings that apply to `name`: its own, else the `default` group's.
    pub fn settings_for(&self, name: &GroupName) -> Option<&GroupSettings> {
        settings_in(&self.catalog, name).map(|s| &**s)
    }

    /// The root of the tree `name` is in, by the configured parents (itself when it has
    /// none): the key its shard is chosen by ([`crate::shard::shard_of`]), so a tree is
    /// computed by one owner.
    pub fn root_of<'a>(&'a self, name: &'a GroupName) -> &'a GroupName {
        root_in(&self.catalog, name)
    }

    /// The id of the client that calls itself `key`, at its exchange number `sequence` (0 when
    /// it does not number them). See [`ClientError`] for when it is refused.
    ///
    /// A client whose numbering starts again has restarted: what its earlier incarnation held
    /// is released, in each group as soon as anyone reports it (its place and its grant
    /// there), and in the others at the next tick. So the new incarnation is served the room
    /// the dead one held from its first exchange, not a lease later.
    pub fn client(&mut self, now: Nanos, key: &str, sequence: u64) -> Result<ClientId, ClientError> {
        self.learning.touch(now);
        let (id, earlier) = self.clients.resolve(now, key, sequence)?;
        if let Some(gone) = earlier
            && self.released.len() < self.settings.max_clients
        {
            // Kept sorted: ids only grow, and a report looks each of its clients up in it.
            let at = self.released.partition_point(|&c| c < gone);
            self.released.insert(at, gone);
        }
        Ok(id)
    }

    /// The state a report for `group` lands in: its own, or the default group's once
    /// `max_tracked_groups` are tracked.
    pub fn state_key(&self, group: &GroupName) -> GroupName {
        if self.tracked.len() < self.settings.max_tracked_groups || self.tracked.contains_key(group) {
            group.clone()
        } else {
            GroupName::default_group()
        }
    }

    /// A client's reports for the groups of one exchange: `each` gets every group's grant, in
    /// the order of `reports`.
    ///
    /// With many groups tracked, each group's state is a cache miss, and so is finding it by
    /// name. So where the client's groups sat at its last exchange is tried first (checked by
    /// name; a client sends its groups in the same order from one exchange to the next), and
    /// all their states are read in one pass before any report: the misses of different
    /// groups overlap instead of coming one report after another.
    pub fn report_all(
        &mut self,
        now: Nanos,
        client: ClientId,
        reports: &[(GroupName, ClientReport)],
        mut each: impl FnMut(Grant),
    ) {
        let mut route = self.clients.take_route(client);
        for (i, (name, _)) in reports.iter().enumerate() {
            let place = route.get(i).copied().unwrap_or(Place::UNKNOWN);
            let known = self.tracked.get_index(place.group as usize);
            if let Some((_, g)) = known.or_else(|| self.tracked.get_key_value(name)) {
                g.warm(place.client);
            }
        }
        // Rewritten in place: each place is read as a hint, then replaced by where the report
        // landed.
        route.resize(reports.len(), Place::UNKNOWN);
        for ((name, r), place) in reports.iter().zip(route.iter_mut()) {
            let (grant, found) = self.report_at(now, client, name, *r, *place);
            *place = found;
            each(grant);
        }
        self.clients.keep_route(client, route);
    }

    /// A client's report for one group; answers with the client's grant for it.
    pub fn report(&mut self, now: Nanos, client: ClientId, group: &GroupName, r: ClientReport) -> Grant {
        self.report_at(now, client, group, r, Place::UNKNOWN).0
    }

    /// [`report`](Self::report) for a caller that keeps, per group, where its state sat last
    /// time (`place`, `u32::MAX` at first): the state there is tried first (checked by name)
    /// before a look-up by name, and `place` is set to where it is now. With many groups a
    /// look-up by name is a cache miss of its own; the embedded mode reports every group each
    /// pass.
    pub fn report_placed(
        &mut self,
        now: Nanos,
        client: ClientId,
        group: &GroupName,
        r: ClientReport,
        place: &mut u32,
    ) -> Grant {
        let (grant, found) = self.report_at(now, client, group, r, Place { group: *place, client: u32::MAX });
        *place = found.group;
        grant
    }

    /// [`outcome`](Self::outcome), trying the state at `place` first (see
    /// [`report_placed`](Self::report_placed)).
    pub fn outcome_placed(&self, group: &GroupName, place: u32) -> Option<&GroupOutcome> {
        match self.tracked.get_index(place as usize) {
            Some((name, g)) if name == group => g.outcome.as_ref(),
            _ => self.outcome(group),
        }
    }

    /// [`report`](Self::report), trying the places in `hint` first: the grant, and where the
    /// report landed (the group's state, and the client's entry in its list).
    fn report_at(
        &mut self,
        now: Nanos,
        client: ClientId,
        group: &GroupName,
        r: ClientReport,
        hint: Place,
    ) -> (Grant, Place) {
        self.learning.touch(now);
        let at = self.track(now, group, hint.group);
        let generation = self.catalog.generation();
        let ramped = self.catalog.ramps();
        let tick_s = self.settings.tick.as_secs_f64().max(1e-3);
        let (key, g) = self.tracked.get_index_mut(at).expect("the index of a tracked group");
        let key = key.clone();
        if !self.released.is_empty() {
            release(&self.released, &key, g, &mut self.provisional);
        }
        g.warm(hint.client);
        g.follow_settings(&self.catalog, &key, generation, ramped);
        g.step_ramp(now, &r);
        g.last_report = now;
        self.ticking.reports_floor = self.ticking.reports_floor.min(now);
        if self.learning.active() {
            self.learning.note_held(now, &key, root_in(&self.catalog, &key), client, r.held);
        }
        let entry = g.client_entry(now, client, hint.client as usize, &r, tick_s);
        let client_at = g.put_client(entry, hint.client as usize);
        let place = Place {
            group: u32::try_from(at).unwrap_or(u32::MAX),
            client: u32::try_from(client_at).unwrap_or(u32::MAX),
        };
        self.classes.count(&key, &r);
        if g.meter_report(&r) && self.metering.on {
            // Named once between two takes, so that taking reads the changed meters only.
            self.metering.dirty.push(key.clone());
        }
        let settings = g.settings.as_deref();
        let mut unlimited = unlimited_grant(&self.settings, settings, g.clients.len());
        // A region's clients fall back in safe mode to their part of the region's part of the
        // reservation (never more than its share), not of the whole group's: the floors of every
        // region's clients add up to the reservation.
        if let Some(up) = self.upstream.as_ref().and_then(|u| u.get(&key)) {
            unlimited.reserved = up.reserved;
        }
        if !self.settings.throttling {
            return (unlimited, place);
        }
        let burst_total = settings.and_then(GroupSettings::burst);
        let in_flight = settings.and_then(GroupSettings::max_in_flight).map(|max| {
            let ledger = self.slots.entry(key.clone()).or_default();
            ledger.report(now, client, r.in_flight, r.in_flight_asked, max, self.settings.report_expiry)
        });
        let regional = self.upstream.is_some();
        let parts = (&mut self.quotas, &mut self.metering);
        let quota = allot_for(parts, (&self.released, &self.settings, regional), now, &key, g, client, &r);
        let unlimited = Grant { in_flight, quota, ..unlimited };
        // The common case: the last tick knows the client.
        if let Some(o) = &g.outcome {
            match (o.target(), o.grant_of_at(client, client_at)) {
                (None, _) => return (unlimited, place),
                (Some(_), Some(known)) => {
                    return (Grant { rate: known.rate, burst: known.burst, ..unlimited }, place);
                }
                (Some(_), None) => {}
            }
        }
        (self.grant_unknown(now, key, client, r.held, unlimited, burst_total), place)
    }

    /// Places the quota windows on the wall clock: the engine's time `now` is the Unix time
    /// `wall_ms`. Allotments wait for the first call (a controller makes it at start and at
    /// every flush, so the two clocks do not drift apart).
    pub fn set_wall_clock(&mut self, now: Nanos, wall_ms: u64) {
        self.quotas.set_wall_clock(now, wall_ms);
    }

    /// The units the clients of `group` hold unspent of its quotas' allotments.
    pub fn allotted(&self, group: &GroupName) -> f64 {
        self.quotas.unspent(group)
    }

    /// The index of `group`'s state, tracking it now if it is new (under the default group's
    /// name once the table is full): `hint` first, else one look-up in the common case, full
    /// or not (see `state_key`).
    fn track(&mut self, now: Nanos, group: &GroupName, hint: u32) -> usize {
        use indexmap::map::Entry;
        if let Some(at) =
            Some(hint as usize).filter(|&at| self.tracked.get_index(at).is_some_and(|(k, _)| k == group))
        {
            return at;
        }
        let full = self.tracked.len() >= self.settings.max_tracked_groups;
        // The table holds at most the bound and the default group that takes in the rest.
        let most = self.settings.max_tracked_groups + 1;
        let len = self.tracked.len();
        if len == self.tracked.capacity() && len < most {
            // Grow by an eighth rather than double: a group's state is a few hundred bytes,
            // and doubling would leave up to half of a large table's room unused.
            self.tracked.reserve_exact((len / 8).max(64).min(most - len));
        }
        let entry = match self.tracked.entry(group.clone()) {
            Entry::Vacant(v) if full => {
                drop(v);
                self.tracked.entry(GroupName::default_group())
            }
            entry => entry,
        };
        match entry {
            Entry::Occupied(e) => e.index(),
            Entry::Vacant(v) => {
                // A resumable ramp that went idle within its TTL continues where it was.
                let resumed = self.resume.remove(v.key()).filter(|(_, until)| now < *until).map(|(v, _)| v);
                let ramp_settings = settings_in(&self.catalog, v.key()).and_then(|s| s.ramp().copied());
                let ramp =
                    ramp_settings.filter(|_| self.catalog.ramps()).map(|s| Box::new(Ramp::new(s, resumed)));
                let meter = self.metering.idle.remove(v.key()).unwrap_or_default();
                let at = v.index();
                v.insert(Tracked::new(now, ramp, meter));
                at
            }
        }
    }

    /// The grant for a client the last tick did not know, by the grant policy.
    fn grant_unknown(
        &mut self,
        now: Nanos,
        key: GroupName,
        client: ClientId,
        held: f64,
        unlimited: Grant,
        burst_total: Option<f64>,
    ) -> Grant {
        let ticked_target = self.tracked[&key].outcome.as_ref().map(GroupOutcome::target);
        let target = match ticked_target {
            Some(t) => t,
            None => self.unticked_target(&key),
        };
        let Some(target) = target else { return unlimited };
        let g = &self.tracked[&key];
        // Not known to the last tick: what is left under the target, no more than it holds.
        let granted = g.outcome.as_ref().map_or(0.0, GroupOutcome::granted);
        let learning = self.learning.covers(now, &key, root_in(&self.catalog, &key));
        let others = self.provisional.others(&key, client);
        let left = (target - granted - others).max(0.0);
        // Learning, no client gets more than it holds; else one that holds nothing may take
        // what is left.
        let rate = if held > 0.0 || learning { held.max(0.0).min(left) } else { left };
        // Conservation where the grant is made: with this one, the live grants stay within
        // the target (or add nothing past it).
        debug_assert!(rate == 0.0 || granted + others + rate <= target * (1.0 + 1e-9) + 1e-9);
        self.provisional.grant(key, client, rate, ticked_target.is_none());
        let burst = match burst_total {
            Some(b) if target > 0.0 => b * rate / target,
            _ => rate,
        };
        Grant { rate, burst, ..unlimited }
    }

    /// A group's target before its first tick: bounded by its settings, and by the room the
    /// capacity has left: what the last tick's groups did not ask for, less what other new
    /// groups took since. A new group takes part of that room ([`NEWCOMER_ROOM_SHARE`] of it,
    /// or [`NEWCOMER_ASK_FACTOR`] times what its clients ask, whichever is more), so that
    /// many arriving together are each served at once, and an overdraft beyond the capacity
    /// serves them when no room is left ([`newcomer_take`]); the next tick shares the capacity
    /// among all of them by the allocation's rules.
    fn unticked_target(&self, key: &GroupName) -> Option<f64> {
        let settings = self.settings_for(key);
        let g = &self.tracked[key];
        let reserved = settings.map_or(0.0, GroupSettings::reserved);
        let mut bound = self.ceiling(key, settings);
        if let Some(r) = &g.ramp {
            bound = bound.min(r.pool() as f64);
        }
        if let Some(capacity) = self.settings.capacity {
            let mine = self.provisional.of(key);
            let committed = self.ticking.found.taken_total + (self.provisional.unticked() - mine);
            let asked: f64 = g.clients.iter().map(|c| f64::from(c.demand) + f64::from(c.unthrottled)).sum();
            bound = bound.min(newcomer_take(capacity, committed, asked));
        }
        bound.is_finite().then(|| reserved.max(bound))
    }

    /// A group's ceiling: its limit, or its reservation once a quota is spent (see
    /// [`quota_cap`]).
    fn ceiling(&self, key: &GroupName, settings: Option<&GroupSettings>) -> f64 {
        let above = upstream::ceiling(&self.upstream, key).map_or(f64::INFINITY, |g| g.rate);
        let Some(s) = settings else { return above };
        let consumed = self.meter(key).map_or(0.0, |m| m.consumed);
        // A regional engine leaves the windows to the tier above, which counts every region:
        // its allotments bound the counts here.
        let left = if self.upstream.is_some() { None } else { self.quotas.left(key, s, consumed) };
        let nested = self.catalog.nesting(key).map_or(f64::INFINITY, |b| b.cap);
        quota_cap(s.limit().as_f64(), left).min(nested).min(above)
    }

    /// The quota windows (minute, hour, day, week, month) whose window, at `wall_ms`, has no
    /// baseline yet (it began since the last was set, or none was): each with its group and
    /// its start, for [`set_budget_baseline`](Self::set_budget_baseline). Baselines of windows
    /// a group no longer counts are forgotten.
    pub fn budget_periods_due(&mut self, wall_ms: u64) -> Vec<(GroupName, BudgetPeriod, u64)> {
        self.windows_under_way(wall_ms, true)
    }

    /// The quota windows under way at `wall_ms` that the clock places (not a group's life, not
    /// one from the first request), each with its group and its start: those with no baseline
    /// yet alone when `due_only`. Baselines of windows a group no longer counts are forgotten.
    fn windows_under_way(&mut self, wall_ms: u64, due_only: bool) -> Vec<(GroupName, BudgetPeriod, u64)> {
        let (configured, tracked) = (&self.catalog, &self.tracked);
        // A group's quotas: its own, or (tracked, not configured) a pattern's or the default's.
        let applying = |g: &GroupName| match configured.get(g) {
            Some(s) => Some(&**s),
            None => tracked.get(g).and_then(|t| t.settings.as_deref()),
        };
        let meters = &self.metering.idle;
        let applying = |g: &GroupName| {
            applying(g).or_else(|| {
                meters.contains_key(g).then(|| settings_in(configured, g)).flatten().map(|s| &**s)
            })
        };
        self.quotas.retain_baselines(|g, w| applying(g).is_some_and(|s| s.quota(w).is_some()));
        self.quotas.retain_ledgers(|g| applying(g).is_some_and(GroupSettings::has_quotas));
        let own = configured
            .iter()
            .filter(|(g, _)| !crate::settings::is_pattern(g.as_str()))
            .map(|(g, s)| (g, &**s));
        let taken = tracked
            .iter()
            .filter(|(g, _)| !configured.contains_key(*g))
            .filter_map(|(g, t)| Some((g, t.settings.as_deref()?)));
        // Idle unconfigured groups whose meters quotas keep.
        let idle = self
            .metering
            .idle
            .keys()
            .filter(|g| !configured.contains_key(*g))
            .filter_map(|g| Some((g, &**settings_in(configured, g)?)));
        let mut due = Vec::new();
        for (g, s) in own.chain(taken).chain(idle).filter(|(_, s)| s.has_quotas()) {
            // A window from the first request starts when that request comes, not by the clock.
            for (window, _) in
                s.quotas().filter(|(w, _)| !matches!(w, BudgetPeriod::Total | BudgetPeriod::FromFirst(_)))
            {
                let start = window.start_of(wall_ms);
                let key = (g.clone(), window);
                if !due_only
                    || self.quotas.baseline(&key.0, key.1).is_none_or(|b| b.period_start_unix_ms != start)
                {
                    due.push((g.clone(), window, start));
                }
            }
        }
        due
    }

    /// Starts `group`'s `window` beginning at `period_start_unix_ms`: what it had consumed by
    /// then, `consumed`, no longer counts against that window's quota (the controller sets it
    /// from its metering at each window's start, and at start for the window under way).
    pub fn set_budget_baseline(
        &mut self,
        group: GroupName,
        window: BudgetPeriod,
        period_start_unix_ms: u64,
        consumed: f64,
    ) {
        self.quotas.set_baseline(group, window, allot::Baseline { period_start_unix_ms, consumed });
    }

    /// Starts every window due at `wall_ms` from the group's consumption now, as this engine
    /// has metered it: the way a process with no store of its own counts its windows (and a
    /// controller its minutes and hours). Returns how many started.
    pub fn roll_windows(&mut self, wall_ms: u64, shorter_than: BudgetPeriod) -> usize {
        let due = self.budget_periods_due(wall_ms);
        let mut started = 0;
        for (g, window, start) in due.into_iter().filter(|(_, w, _)| w.span_ms() < shorter_than.span_ms()) {
            let consumed = self.meter(&g).map_or(0.0, |m| m.consumed);
            self.set_budget_baseline(g, window, start, consumed);
            started += 1;
        }
        started
    }

    /// Whether the settings that apply to an unconfigured group (a pattern's or the
    /// default's) give it quotas: then its consumption is kept while it is idle, as a
    /// configured group's is, for its windows to count.
    pub fn counts_quotas(&self, name: &GroupName) -> bool {
        !self.catalog.contains_key(name) && settings_in(&self.catalog, name).is_some_and(|s| s.has_quotas())
    }

    /// Whether an idle group's meter is kept for its quotas: [`counts_quotas`](Self::counts_quotas),
    /// while fewer such meters are kept than groups may be tracked.
    pub(crate) fn keeps_meter_for_quotas(&self, name: &GroupName) -> bool {
        self.counts_quotas(name)
            && self.metering.idle.len() < self.catalog.len() + self.settings.max_tracked_groups
    }

    /// Whether any configured group has a quota (so that windows need rolling).
    pub fn has_quotas(&self) -> bool {
        self.catalog.values().any(|s| s.has_quotas())
    }

    /// The consumption a group's quota window is counted from (0 when none was set).
    pub fn budget_baseline(&self, group: &GroupName, window: BudgetPeriod) -> f64 {
        self.quotas.baseline(group, window).map_or(0.0, |b| b.consumed)
    }

    /// A backend's report: its zone, health, and the load each group puts on it.
    pub fn backend_report(
        &mut self,
        now: Nanos,
        backend: &str,
        zone: &str,
        health: Health,
        loads: &[(GroupName, f64)],
    ) -> Result<(), BackendError> {
        self.put_backend_report(now, backend, BackendReport::new(zone, health, loads.to_vec())).map(drop)
    }

    /// [`backend_report`](Self::backend_report) with the report made ready beforehand
    /// ([`BackendReport::new`], without the engine); hands back the report it replaced, for
    /// the caller to drop after it let go of the engine (a controller's large reports cost as
    /// much to make and to drop as to take).
    pub fn put_backend_report(
        &mut self,
        now: Nanos,
        backend: &str,
        report: BackendReport,
    ) -> Result<Replaced, BackendError> {
        self.learning.touch(now);
        let known = self.backends.contains_key(backend);
        if !known && self.backends.len() >= self.settings.max_backends {
            return Err(BackendError::TooMany { max: self.settings.max_backends });
        }
        let hints = self.backends.get_mut(backend).map(|b| std::mem::take(&mut b.hints)).unwrap_or_default();
        let state = BackendState {
            zone: report.zone,
            health: report.health,
            load: report.load,
            total: report.total,
            seen: now,
            hints,
        };
        if self.trace.is_some() {
            let health = state.health;
            let total = state.total;
            let t = self.trace_time(now);
            let utilisation = self.settings.saturation.utilisation(health);
            for (group, l) in state.load.iter() {
                let event = TraceEvent::BusyGroup(BusyGroup {
                    t,
                    backend: backend.to_string(),
                    zone: state.zone.clone(),
                    group: group.to_string(),
                    units_per_s: *l,
                    busyness: if total > 0.0 { l / total } else { 0.0 },
                    utilisation,
                });
                if let Some(buffer) = &mut self.trace {
                    buffer.push(event);
                }
            }
        }
        // Saturated now, and not (or not lately) before: the next tick should not wait for
        // its turn.
        let saturated = |s: &BackendState| self.settings.saturation.limiting_ratio_of(s.health).is_some();
        let was = self
            .backends
            .get(backend)
            .is_some_and(|old| now.since(old.seen) <= self.settings.report_expiry && saturated(old));
        if !was && saturated(&state) {
            self.ticking.onset = true;
        }
        let old = match self.backends.get_mut(backend) {
            Some(slot) => Some(std::mem::replace(slot, state)),
            None => {
                self.backends.insert(backend.to_string(), state);
                None
            }
        };
        Ok(Replaced { _old: old })
    }

    /// Forgets a backend at once.
    pub fn remove_backend(&mut self, backend: &str) {
        self.backends.remove(backend);
    }

    /// The last tick's outcome for `group`.
    pub fn outcome(&self, group: &GroupName) -> Option<&GroupOutcome> {
        self.tracked.get(group).and_then(|g| g.outcome.as_ref())
    }

    /// Every group's rates added up at the last tick: constant time.
    pub fn totals(&self) -> Totals {
        self.ticking.found.totals
    }

    /// A tracked group's state now in a few numbers (see [`GroupSample`]), in constant time;
    /// `None` for a group not tracked.
    pub fn group_sample(&self, name: &GroupName) -> Option<GroupSample> {
        self.tracked.get(name).map(sample_of)
    }

    /// Up to `max` tracked groups with clients, demand or consumption, for which `skip` is
    /// false, with their samples: one pass that stops once it has `max`.
    pub fn active_groups(
        &self,
        max: usize,
        skip: impl Fn(&GroupName) -> bool,
    ) -> Vec<(GroupName, GroupSample)> {
        let mut out = Vec::new();
        if max == 0 {
            return out;
        }
        for (name, g) in &self.tracked {
            let s = sample_of(g);
            if (s[1] > 0.0 || s[2] > 0.0 || s[3] > 0.0 || s[4] > 0.0) && !skip(name) {
                out.push((name.clone(), s));
                if out.len() == max {
                    break;
                }
            }
        }
        out
    }

    /// Requests admitted and refused by class in `group`, critical, normal and sheddable
    /// (see [`crate::class::RequestClass::ALL`]), since this engine first saw a critical or
    /// sheddable request in it; `None` before.
    pub fn by_class(&self, group: &GroupName) -> Option<ClassTotals> {
        self.classes.of(group)
    }

    /// What the clients of `group` hold of its in-flight quota (`None`: it has none, or no
    /// client has reported on it).
    pub fn in_flight(&self, group: &GroupName) -> Option<InFlight> {
        self.slots.get(group).map(slots::Ledger::in_flight)
    }

    /// Forgets the holders of in-flight slots not heard from within the report expiry, and
    /// the earlier incarnations of restarted clients; drops the ledgers of groups left with
    /// no holder or no in-flight quota.
    fn expire_slots(&mut self, now: Nanos) {
        if self.slots.is_empty() {
            return;
        }
        let Engine { slots, released, catalog: configured, settings, .. } = self;
        slots.retain(|name, ledger| {
            for &c in released.iter() {
                ledger.release(c);
            }
            let quota = settings_in(configured, name).is_some_and(|s| s.max_in_flight().is_some());
            quota && ledger.forget_silent(now, settings.report_expiry, None)
        });
    }

    /// The value of every resumable ramp: the live ones and those idle within their TTL, with
    /// how long each may still be resumed. With no ramp configured, no live one is looked for
    /// (a ramp left on a group since its settings changed goes at its next report): walking
    /// 100,000 tracked groups for none took the controller's lock for over a millisecond.
    pub fn resumable_ramps(&self, now: Nanos) -> Vec<(GroupName, f64, Duration)> {
        let mut out: Vec<(GroupName, f64, Duration)> = Vec::new();
        let live = if self.catalog.ramps() { Some(&self.tracked) } else { None };
        for (name, g) in live.into_iter().flatten() {
            if let Some(r) = &g.ramp
                && let Some(ttl) = r.settings().resume_ttl
            {
                out.push((name.clone(), r.value(), ttl));
            }
        }
        for (name, (value, until)) in &self.resume {
            if now < *until && !self.tracked.contains_key(name) {
                out.push((name.clone(), *value, until.since(now)));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Lets a group's ramp resume at `value` if it comes back within `ttl` (after a restart).
    pub fn resume_ramp(&mut self, now: Nanos, group: GroupName, value: f64, ttl: Duration) {
        if self.resume.len() < self.settings.max_tracked_groups {
            self.resume.insert(group, (value, now.after(ttl)));
        }
    }

    /// Whether `group` is tracked now (a client or backend reported it, and it has not gone
    /// quiet since).
    pub fn tracks(&self, group: &GroupName) -> bool {
        self.tracked.contains_key(group)
    }

    /// How many groups are tracked.
    pub fn tracked_groups(&self) -> usize {
        self.tracked.len()
    }

    /// How many clients are tracked.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// How many clients were found to have restarted.
    pub fn client_restarts(&self) -> u64 {
        self.clients.restarts()
    }

    /// How many backends are tracked.
    pub fn backends(&self) -> usize {
        self.backends.len()
    }

    /// Ticks done so far: one walked in slices counts once its last slice is done, so that
    /// what is read between its slices is tagged with the tick before.
    pub fn ticks(&self) -> u64 {
        self.ticking.count
    }

    /// When the last tick ran.
    pub fn last_tick(&self) -> Option<Nanos> {
        self.ticking.last
    }

    /// Whether a backend's report has shown it saturated since the last tick began, when it
    /// was not before (or had not reported lately). Its groups' limits wait for a tick; a
    /// controller runs one at once rather than at its turn (at most one such tick between two
    /// of its regular ones), so that a surge is reined in as soon as a backend reports it,
    /// not up to a tick later. The next tick clears it.
    pub fn saturation_onset(&self) -> bool {
        self.ticking.onset
    }

    /// Starts a learning lease from `now` over `which` groups (see [`Relearn`]): for one
    /// lease, no client of those groups is granted more than it says it holds.
    pub fn relearn(&mut self, now: Nanos, which: Relearn) {
        let held = matches!(which, Relearn::Held);
        self.learning.start(now, now.after(self.settings.lease), which);
        if held {
            for (name, g) in &self.tracked {
                for c in g.outcome.iter().flat_map(|o| &o.grants) {
                    self.learning.seed(name, c.client, c.rate);
                }
            }
        }
    }

    /// Whether a learning lease is under way at `now`.
    pub fn learning(&self, now: Nanos) -> bool {
        self.learning.any(now)
    }

    /// How long the learning leases under way at `now` have left: `None` when none is.
    pub fn learning_left(&self, now: Nanos) -> Option<Duration> {
        self.learning.ends(now).map(|end| end.since(now))
    }
}

#[cfg(test)]
mod tests;
