//! Saturation limiting (FoundationDB): backends' health turned into each group's limiting rate.
//!
//! A backend's throttling ratio is FoundationDB's `1 / min(2, (q − target + spring) / spring)`
//! for queue bytes `q`, absent when the denominator is at most 0. A group counts only on
//! backends where it puts load, at least `limiting_threshold` units/s of it (none by default;
//! FoundationDB's 100 pages a second in bytes with [`SaturationSettings::foundationdb`]); per
//! zone the smallest ratio counts; the `ignore_worst_zones` worst zones are ignored where
//! more zones than that report.
//!
//! **Growth cap.** Below saturation's target (`u < 1`) the ratio used is at most `1/u`, the
//! backend's proportional headroom, so a limit grows by at most that much per tick:
//! FoundationDB's ratio tends to infinity as `u` falls toward 0.75, which, with a few ticks of
//! exchange delay, makes the limit leap and the backend swing (docs/control.md).
//!
//! **Headroom.** Below saturation no ratio applies, but a group throttled at the last tick
//! whose limit is now above its target is held at its load there plus its share of the room
//! the backend has
//! ([`SaturationSettings::headroom_ratio`]), so a group whose limit is lifted takes the room
//! there is rather than sending at once the work it queued.
//!
//! **The control law.** `limiting = load × ratio`, where `load` is the group's load *as the
//! backends report it*: the same measurement, with the same lag, that produced their queues.
//! A queue says "this much load was too much"; scaling that load by the ratio aims at the load
//! the backend can sustain. docs/control.md works through why this converges.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::settings::GroupName;
use crate::time::Nanos;

/// FoundationDB's saturation knobs. The defaults limit in any cost model and with any number
/// of zones: every group with load on a saturated backend counts there, and the worst zone is
/// ignored only where there are two or more. [`SaturationSettings::foundationdb`] is
/// FoundationDB's own (a group counts only at 100 pages a second, in bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct SaturationSettings {
    /// Queue bytes at which a backend is at its target (ratio 1).
    pub queue_target_bytes: f64,
    /// Queue bytes over which the ratio falls from 1 to 0.5.
    pub queue_spring_bytes: f64,
    /// A group counts on a backend only if it puts at least this many units/s there (and
    /// more than none); 0 by default: every group with load there.
    pub limiting_threshold: f64,
    /// How many of the worst zones are ignored when limiting, among the zones reporting
    /// ([`ignored_zones`](Self::ignored_zones): never every one).
    pub ignore_worst_zones: usize,
    /// How a saturated backend's ratio becomes each group's limiting rate.
    pub law: LimitingLaw,
}

/// How saturation limits a group (FoundationDB tried the first two; the third is the textbook
/// baseline they improve on, kept to measure them against).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitingLaw {
    /// The group's own load times the backend's ratio (FoundationDB 7.4): every group busy on
    /// a saturated backend is scaled by the same ratio, so the split follows current use.
    #[default]
    Rate,
    /// The backend's limiting cost (ratio × all the load it serves) divided among the groups
    /// busy on it in proportion to their limits (FoundationDB 7.3). A group without a limit
    /// has no share and is not limited this way.
    Quota,
    /// The group's previous limiting rate times the backend's ratio (its load the first time):
    /// a plain multiplicative controller, which integrates the error instead of aiming at the
    /// sustainable load. Slower to settle and prone to overshoot; `tollgate bench converge`
    /// runs it beside `rate` (docs/control.md).
    Multiplicative,
}

impl LimitingLaw {
    /// Every law, in the order of their names.
    pub const ALL: [LimitingLaw; 3] = [LimitingLaw::Rate, LimitingLaw::Quota, LimitingLaw::Multiplicative];

    /// Its name in settings: `rate`, `quota` or `multiplicative`.
    pub fn name(self) -> &'static str {
        match self {
            LimitingLaw::Rate => "rate",
            LimitingLaw::Quota => "quota",
            LimitingLaw::Multiplicative => "multiplicative",
        }
    }

    /// Parses `rate`, `quota` or `multiplicative`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|law| law.name() == name)
    }
}

impl Default for SaturationSettings {
    fn default() -> Self {
        Self {
            queue_target_bytes: 800e6,
            queue_spring_bytes: 200e6,
            limiting_threshold: 0.0,
            ignore_worst_zones: 1,
            law: LimitingLaw::Rate,
        }
    }
}

/// FoundationDB's busyness threshold: 100 pages of 4 KiB a second, in bytes.
pub const FOUNDATIONDB_LIMITING_THRESHOLD: f64 = 409_600.0;

impl SaturationSettings {
    /// FoundationDB's knobs as it ships them: a tag counts on a storage server only at 100
    /// pages a second (costs in bytes, the `fdb` cost model).
    pub fn foundationdb() -> Self {
        Self { limiting_threshold: FOUNDATIONDB_LIMITING_THRESHOLD, ..Self::default() }
    }
}

impl SaturationSettings {
    /// Every knob outside its range, as `(key, rule)` with the key as a scenario names it
    /// (the server's flags are the same words with dashes).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let bytes_max = crate::settings::UNITS_MAX;
        if !(self.queue_target_bytes.is_finite()
            && self.queue_target_bytes > 0.0
            && self.queue_target_bytes <= bytes_max)
        {
            out.push((
                "queue_target_bytes",
                format!("must be above 0 and at most {bytes_max:e}, got {}", self.queue_target_bytes),
            ));
        }
        if !(self.queue_spring_bytes.is_finite()
            && self.queue_spring_bytes > 0.0
            && self.queue_spring_bytes <= self.queue_target_bytes)
        {
            out.push((
                "queue_spring_bytes",
                format!(
                    "must be above 0 and at most queue_target_bytes ({}), got {}",
                    self.queue_target_bytes, self.queue_spring_bytes
                ),
            ));
        }
        let rate_max = crate::settings::RATE_MAX;
        if !(0.0..=rate_max).contains(&self.limiting_threshold) {
            out.push((
                "limiting_threshold",
                format!("must be from 0 to {rate_max:e} units/s, got {}", self.limiting_threshold),
            ));
        }
        if self.ignore_worst_zones > 1000 {
            out.push((
                "ignore_worst_zones",
                format!("must be from 0 to 1000, got {}", self.ignore_worst_zones),
            ));
        }
        out
    }
}

/// How far past saturation (in utilisation) the limiting ratio stays proportional, `1/u`.
pub const PLATEAU: f64 = 0.05;

/// The share of the limiting threshold a group limited at the last tick must keep on a
/// backend to go on counting there.
pub const THRESHOLD_HYSTERESIS: f64 = 0.5;

/// The shortest and longest folding time of the average-cost smoothers, in seconds.
pub const COST_FOLDING_S: std::ops::RangeInclusive<f64> = 0.1..=600.0;

/// A backend's health.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Health {
    /// Bytes queued (FoundationDB's storage queue).
    QueueBytes(f64),
    /// Utilisation, 1 meaning at its target; turned into queue bytes at the target.
    Utilisation(f64),
}

pub(crate) struct BackendState {
    pub(crate) zone: String,
    pub(crate) health: Health,
    /// Shared with a tick that is gathering it, which takes the report it began with
    /// whole, whatever comes after.
    pub(crate) load: Arc<[(GroupName, f64)]>,
    /// The loads added up.
    pub(crate) total: f64,
    pub(crate) seen: Nanos,
    /// Where the last tick found each load's group among the tracked groups, by the load's
    /// place in the report ([`NO_HINT`]: not found), handed from one report to the next: a
    /// backend lists its groups in much the same order every time, and a look at the place
    /// found last time (checked by name) spares a look-up by name: a third of the gathering's
    /// time at 100,000 groups (2-3 ms a tick with ten backends). Taken by the tick gathering
    /// the report.
    pub(crate) hints: Vec<u32>,
}

/// A [`BackendState::hints`] entry for a group not found.
pub(crate) const NO_HINT: u32 = u32::MAX;

/// The position of `group` among the tracked groups, looked for at `hint` first.
fn find(tracked: &super::Tracking, hint: u32, group: &GroupName) -> Option<usize> {
    let at = hint as usize;
    if tracked.get_index(at).is_some_and(|(name, _)| name == group) {
        return Some(at);
    }
    tracked.get_index_of(group)
}

/// A backend's report a tick is taking, in parts between exchanges (see
/// [`SaturationSettings::gather_part`]).
pub(crate) struct Gathering {
    load: Arc<[(GroupName, f64)]>,
    /// The next load to take.
    pub(crate) next: usize,
    zone: u32,
    backend: u32,
    ratio: Option<f64>,
    /// When the backend is below saturation: the load it has room for beyond what it
    /// carries, `total × (1/u − 1)`.
    room: Option<f64>,
    /// How many groups may take that room: those it marked.
    takers: u32,
    /// While the quota law's first pass is under way: the load and the quotas of the groups
    /// busy on the backend, summed so far.
    summing: Option<(f64, f64)>,
    /// The quota law's (limiting cost, quotas sharing it), once summed.
    shares: Option<(f64, f64)>,
    /// The backend's [`BackendState::hints`], as long as the tick takes its report.
    pub(crate) hints: Vec<u32>,
}

impl Gathering {
    /// Hands the tick how many groups may take the backend's room, once its loads are all
    /// taken.
    pub(crate) fn finish(&self, reporting: &mut Reporting) {
        reporting.takers[self.backend as usize] = self.takers;
    }

    /// How many loads the report holds (each pass goes over them all).
    pub(crate) fn len(&self) -> usize {
        self.load.len()
    }

    /// Whether its loads are all taken.
    pub(crate) fn done(&self) -> bool {
        self.summing.is_none() && self.next == self.load.len()
    }
}

/// Whether the group was saturation limited at the last tick.
fn busy(t: Option<&super::Tracked>) -> bool {
    t.and_then(|t| t.outcome.as_ref()).is_some_and(|o| o.busy)
}

/// Whether the group may take a backend's room: it was throttled at the last tick (it asked
/// for more than its target), and its limit, `quota()`, is now above that target (lifted or
/// raised, or it was held below it by saturation, by its headroom or by a share). A group
/// held at a limit that stays where it was does not take any. The limit is looked up only
/// for a group throttled: most groups on a backend with room are not.
fn may_take_room(t: &super::Tracked, quota: impl FnOnce() -> Option<f64>) -> bool {
    let Some((demand, target)) = t.outcome.as_ref().and_then(|o| Some((o.demand, o.target()?))) else {
        return false;
    };
    demand > target && quota().is_none_or(|q| q > target)
}

/// One zone a group counts on: the zone and the backend with the smallest ratio (or, under
/// the quota law, limiting rate) in it, by their places in [`Reporting`], and that value.
///
/// A backend below saturation marks a group that may take its room (see
/// [`SaturationSettings::headroom_ratio`]) with that room over the group's load there, the
/// share it is of the room still to be divided among the groups taking it; such a mark is
/// *healthy*, flagged in `backend`'s top bit so that a mark stays 16 bytes. A zone holding
/// both kinds keeps its saturated mark: saturation speaks for the zone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ZoneMark {
    pub(crate) zone: u32,
    backend: u32,
    pub(crate) value: f64,
}

/// The flag of a healthy [`ZoneMark`], in its `backend`.
const HEALTHY: u32 = 1 << 31;

impl ZoneMark {
    fn saturated(zone: u32, backend: u32, value: f64) -> Self {
        debug_assert!(backend < HEALTHY, "backends are far fewer");
        Self { zone, backend, value }
    }

    fn healthy(zone: u32, backend: u32, value: f64) -> Self {
        Self { zone, backend: backend | HEALTHY, value }
    }

    /// Whether the backend is below saturation: the mark is the group's headroom there.
    pub(crate) fn is_healthy(&self) -> bool {
        self.backend & HEALTHY != 0
    }

    fn backend(&self) -> usize {
        (self.backend & !HEALTHY) as usize
    }

    /// The backend's place among the tick's backends ([`Reporting::backends`]).
    pub(crate) fn backend_index(&self) -> u32 {
        self.backend & !HEALTHY
    }
}

/// The zones a group counts on, inline for up to two.
pub(crate) type Zones = SmallVec<[ZoneMark; 2]>;

/// One group's load across backends, gathered once per tick. Names are indices into the
/// tick's [`Reporting`], so the buffer of these is kept from one tick to the next.
#[derive(Default)]
pub(crate) struct GroupLoad {
    pub(crate) load: f64,
    /// The saturated backends' smallest ratio per zone the group counts on.
    pub(crate) zones: Zones,
}

/// What a tick gathers from the backends' reports, by slot (see
/// [`SaturationSettings::gather_part`]); kept from one tick to the next.
///
/// A tick uses the first `used` of each; the rest are the last ticks', reset as they are
/// taken again, so that a tick begins without a walk over 100,000 of them.
#[derive(Default)]
pub(crate) struct Loads {
    pub(crate) groups: Vec<GroupLoad>,
    /// Under the quota law only, beside `groups`: the smallest limiting rate per zone.
    pub(crate) quota_zones: Vec<Zones>,
    used: usize,
}

impl Loads {
    /// A tick begins: no slot is in use.
    pub(crate) fn begin(&mut self) {
        self.used = 0;
    }

    /// A fresh slot for a group's load (and, under the quota law, its zones' rates).
    fn slot(&mut self, quota_law: bool) -> u32 {
        let slot = self.used;
        self.used += 1;
        match self.groups.get_mut(slot) {
            Some(g) => {
                g.load = 0.0;
                g.zones.clear();
            }
            None => self.groups.push(GroupLoad::default()),
        }
        if quota_law {
            match self.quota_zones.get_mut(slot) {
                Some(z) => z.clear(),
                None => {
                    // Slots are used in order: a law changed to the quota law finds the list
                    // short, and fills it up to this slot.
                    self.quota_zones.resize_with(slot + 1, Zones::new);
                }
            }
        }
        slot as u32
    }
}

/// The backends that reported within the expiry at a tick, in order: their names and zones,
/// for what a [`ZoneMark`] points at.
/// Owned (a few names a tick): a tick walked in slices keeps it while backends report.
#[derive(Default)]
pub(crate) struct Reporting {
    /// (backend, index of its zone in `zones`).
    pub(crate) backends: Vec<(String, u32)>,
    pub(crate) zones: Vec<String>,
    /// By backend, how many groups may take its room (see [`Gathering::takers`]).
    pub(crate) takers: Vec<u32>,
}

impl Reporting {
    /// The backend and zone names a mark points at.
    pub(crate) fn names(&self, mark: &ZoneMark) -> (&str, &str) {
        (&self.backends[mark.backend()].0, &self.zones[mark.zone as usize])
    }
}

/// Keeps the smallest value per zone, a saturated backend's before any healthy one's: `mark`
/// joins its zone's entry, or starts one.
fn mark_zone(zones: &mut Zones, mark: ZoneMark) {
    match zones.iter_mut().find(|z| z.zone == mark.zone) {
        Some(z) => {
            let kind = (mark.is_healthy(), z.is_healthy());
            if kind == (false, true) || (kind.0 == kind.1 && mark.value < z.value) {
                *z = mark;
            }
        }
        None => zones.push(mark),
    }
}

impl SaturationSettings {
    /// FoundationDB's throttling ratio for a backend's health; `None` below saturation.
    pub fn throttling_ratio(&self, health: Health) -> Option<f64> {
        let (target, spring) = (self.queue_target_bytes, self.queue_spring_bytes);
        let q = match health {
            Health::QueueBytes(q) => q,
            Health::Utilisation(u) => u * target,
        };
        let inv = ((q - target + spring) / spring).min(2.0);
        (inv > 0.0).then(|| 1.0 / inv)
    }

    /// The ratio a backend in this health limits with: FoundationDB's, capped at the backend's
    /// proportional headroom `1/u` below saturation, and `1/u` itself just above it, up to
    /// `PLATEAU` past 1, where FoundationDB's curve takes over again, shifted to meet it.
    ///
    /// The plateau is what keeps low rates still: a group admitting a few transactions a second
    /// puts a load on the backend that comes in whole transactions and dithers a percent or two
    /// around its capacity, and FoundationDB's slope of −3 at u = 1 would turn each such step
    /// into a target three times as far off. Proportional there, the target is the capacity
    /// itself whatever the dither.
    pub fn limiting_ratio_of(&self, health: Health) -> Option<f64> {
        let u = self.utilisation(health);
        if u > 1.0 + PLATEAU {
            let shifted = self.throttling_ratio(Health::Utilisation(u - PLATEAU))?;
            return Some((shifted / (1.0 + PLATEAU)).min(1.0 / u));
        }
        if u > 1.0 {
            return Some(1.0 / u);
        }
        let r = self.throttling_ratio(health)?;
        Some(if u > 0.0 { r.min(1.0 / u) } else { r })
    }

    /// A backend's utilisation: queue bytes over the queue target.
    pub fn utilisation(&self, health: Health) -> f64 {
        match health {
            Health::QueueBytes(q) => q / self.queue_target_bytes,
            Health::Utilisation(u) => u,
        }
    }

    /// Begins taking backend `id`'s report into the tick's gathering, unless it is older
    /// than `expiry`: its place among the tick's backends and zones, and its ratio if it is
    /// saturated. [`gather_part`](Self::gather_part) takes the loads.
    pub(super) fn begin_backend(
        &self,
        (id, b): (&String, &mut BackendState),
        now: Nanos,
        expiry: Duration,
        reporting: &mut Reporting,
    ) -> Option<Gathering> {
        if now.since(b.seen) > expiry {
            return None;
        }
        let zone = match reporting.zones.iter().position(|z| *z == b.zone) {
            Some(i) => i,
            None => {
                reporting.zones.push(b.zone.clone());
                reporting.zones.len() - 1
            }
        } as u32;
        let backend = reporting.backends.len() as u32;
        reporting.backends.push((id.clone(), zone));
        reporting.takers.push(0);
        let ratio = self.limiting_ratio_of(b.health);
        let u = self.utilisation(b.health);
        let room = (ratio.is_none() && u > 0.0 && b.total > 0.0).then(|| b.total * (1.0 / u - 1.0));
        // The quota law first sums, over the whole report, the load and the quotas of the
        // groups busy on the backend: its limiting cost is shared by those quotas.
        let summing = (self.law == LimitingLaw::Quota && ratio.is_some()).then_some((0.0, 0.0));
        let mut hints = std::mem::take(&mut b.hints);
        hints.resize(b.load.len(), NO_HINT);
        Some(Gathering {
            load: b.load.clone(),
            next: 0,
            zone,
            backend,
            ratio,
            room,
            takers: 0,
            summing,
            shares: None,
            hints,
        })
    }

    /// Whether a group with load `l` on a saturated backend counts on it. A group saturation
    /// limited at the last tick keeps counting on a backend down to half the threshold: at
    /// low rates its load there comes in whole transactions and dithers around the threshold,
    /// and a backend that dropped in and out of its limit would swing its target between the
    /// limit and the quota.
    fn counts(&self, l: f64, was_busy: &dyn Fn() -> bool) -> bool {
        l > 0.0
            && (l >= self.limiting_threshold
                || (l >= self.limiting_threshold * THRESHOLD_HYSTERESIS && was_busy()))
    }

    /// Takes the loads of `part` up to `upto` into the tick's gathering (under the quota law,
    /// first sums them up to there: a pass of its own before the loads are taken): the load of each
    /// tracked group it names among the first `len` tracked (the groups the tick walks), and
    /// the backend's (zone, ratio) if the group counts on it. A group with any load gets a
    /// slot in `loads` (its `load_slot`, which the tick takes and clears); groups reported
    /// but not tracked, or tracked after the tick began, get no target from it, so none is
    /// kept for them (they still count towards the quota law's sums).
    pub(super) fn gather_part(
        &self,
        part: &mut Gathering,
        upto: usize,
        quota: &dyn Fn(&GroupName) -> Option<f64>,
        tracked: &mut super::Tracking,
        len: usize,
        loads: &mut Loads,
    ) {
        if let Some((total, quotas)) = &mut part.summing {
            for ((group, l), hint) in part.load[part.next..upto].iter().zip(&part.hints[part.next..upto]) {
                *total += l;
                let tracked_now =
                    || find(tracked, *hint, group).and_then(|at| tracked.get_index(at)).map(|(_, t)| t);
                if self.counts(*l, &|| busy(tracked_now()))
                    && let Some(q) = quota(group)
                {
                    *quotas += q;
                }
            }
            part.next = upto;
            if upto == part.load.len() {
                let (total, quotas) = (*total, *quotas);
                let r = part.ratio.expect("a saturated backend");
                part.shares = (quotas > 0.0).then_some((r * total, quotas));
                (part.summing, part.next) = (None, 0);
            }
            return;
        }
        let quota_law = self.law == LimitingLaw::Quota;
        let (zone, backend, ratio, shares, room) =
            (part.zone, part.backend, part.ratio, part.shares, part.room);
        let hints = &mut part.hints[part.next..upto];
        for ((group, l), hint) in part.load[part.next..upto].iter().zip(hints) {
            let Some(at) = find(tracked, *hint, group) else { continue };
            *hint = u32::try_from(at).unwrap_or(NO_HINT);
            if at >= len {
                continue;
            }
            let (_, t) = tracked.get_index_mut(at).expect("found just now");
            let counted = (shares.is_some() || ratio.is_some()) && self.counts(*l, &|| busy(Some(t)));
            if t.load_slot == super::NO_SLOT {
                t.load_slot = loads.slot(quota_law);
            }
            let slot = t.load_slot as usize;
            let entry = &mut loads.groups[slot];
            entry.load += l;
            if let Some((limiting_cost, quotas)) = shares
                && counted
                && let Some(q) = quota(group)
            {
                let value = limiting_cost * q / quotas;
                mark_zone(&mut loads.quota_zones[slot], ZoneMark::saturated(zone, backend, value));
            }
            if let Some(value) = ratio
                && counted
            {
                mark_zone(&mut entry.zones, ZoneMark::saturated(zone, backend, value));
            } else if let Some(room) = room
                && *l > 0.0
                && *l >= self.limiting_threshold
                && may_take_room(t, || quota(group))
            {
                part.takers += 1;
                mark_zone(&mut entry.zones, ZoneMark::healthy(zone, backend, room / l));
            }
        }
        part.next = upto;
    }

    /// How many of a group's worst zones are ignored when `zones` zones report: at most
    /// `ignore_worst_zones`, and never every zone there is. FoundationDB's rule rides out one
    /// bad zone among several; with a single zone (one backend, or every backend in one
    /// place) it would ignore the only one there is, and saturation would never limit.
    pub fn ignored_zones(&self, zones: usize) -> usize {
        self.ignore_worst_zones.min(zones.saturating_sub(1))
    }

    /// The ratio limiting a group with these zones, after ignoring the `ignore` worst ones
    /// ([`ignored_zones`](Self::ignored_zones)): its saturated zones only.
    pub(crate) fn limiting_ratio(&self, zones: &[ZoneMark], ignore: usize) -> Option<f64> {
        self.limiting_mark(zones, ignore).map(|z| z.value)
    }

    /// The saturated zone's mark [`limiting_ratio`](Self::limiting_ratio) takes its ratio from.
    pub(crate) fn limiting_mark<'a>(&self, zones: &'a [ZoneMark], ignore: usize) -> Option<&'a ZoneMark> {
        pick(ignore, zones.iter().filter(|z| !z.is_healthy()))
    }

    /// The headroom ratio of a group that may take its backends' room (throttled at the last
    /// tick, and its limit now above the target it had) and that its saturated zones do not
    /// limit ([`limiting_ratio`](Self::limiting_ratio) is `None`): its load times this is what
    /// its backends below saturation have room for. On each, that is the group's load there
    /// plus an equal share of the backend's room (`total × (1/u − 1)`, the load it carries
    /// scaled up to u = 1, less that load) among the groups that may take it, `takers` by
    /// backend; per zone the smallest counts (a zone keeps the mark of its backend with the
    /// least room for the group's load, before sharing); the saturated zones count among the
    /// worst ones ignored, and the rest of `ignore_worst_zones` is taken from the others. A
    /// throttled group whose limit is raised or lifted, or whose backend recovers, so takes
    /// the room there is instead of sending at once all the work it queued; alone on a
    /// backend, it fills it.
    pub(crate) fn headroom_ratio(&self, zones: &[ZoneMark], takers: &[u32], ignore: usize) -> Option<f64> {
        let saturated = zones.iter().filter(|z| !z.is_healthy()).count();
        let ignore = ignore.checked_sub(saturated)?;
        let ratios = zones
            .iter()
            .filter(|z| z.is_healthy())
            .map(|z| ZoneMark { value: 1.0 + z.value / f64::from(takers[z.backend()].max(1)), ..*z });
        let ratios: SmallVec<[ZoneMark; 4]> = ratios.collect();
        pick(ignore, ratios.iter()).map(|z| z.value)
    }
}

/// The mark with the `ignore + 1`-th smallest value.
fn pick<'a>(ignore: usize, marks: impl Iterator<Item = &'a ZoneMark>) -> Option<&'a ZoneMark> {
    if ignore == 0 {
        return marks.min_by(|a, b| a.value.total_cmp(&b.value));
    }
    let mut sorted: SmallVec<[&ZoneMark; 8]> = marks.collect();
    if sorted.len() <= ignore {
        return None;
    }
    sorted.sort_by(|a, b| a.value.total_cmp(&b.value));
    Some(sorted[ignore])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_follows_fdb_table() {
        let s = SaturationSettings::default();
        let r = |u: f64| s.throttling_ratio(Health::Utilisation(u));
        assert_eq!(r(0.75), None);
        assert!((r(0.8).unwrap() - 5.0).abs() < 1e-9);
        assert!((r(1.0).unwrap() - 1.0).abs() < 1e-9);
        assert!((r(1.2).unwrap() - 1.0 / 1.8).abs() < 1e-9);
        assert_eq!(r(3.0), Some(0.5));
        assert_eq!(s.throttling_ratio(Health::QueueBytes(900e6)), Some(1.0 / 1.5));
    }

    #[test]
    fn the_limiting_ratio_is_proportional_just_past_saturation_and_continuous() {
        let s = SaturationSettings::default();
        let r = |u: f64| s.limiting_ratio_of(Health::Utilisation(u)).unwrap();
        assert_eq!(s.limiting_ratio_of(Health::Utilisation(0.7)), None);
        // Below 1: FoundationDB's, capped at the headroom; on the plateau: 1/u exactly.
        assert!((r(0.8) - 1.25).abs() < 1e-12 && (r(1.0) - 1.0).abs() < 1e-12);
        for u in [1.01, 1.02, 1.04, 1.05] {
            assert!((r(u) - 1.0 / u).abs() < 1e-12, "u {u}");
        }
        // Past it, FoundationDB's curve, shifted to meet the plateau: no step at its edge.
        assert!((r(1.05 + 1e-9) - r(1.05)).abs() < 1e-6);
        assert!((r(1.15) - (1.0 / (4.0 * 1.10 - 3.0)) / 1.05).abs() < 1e-12);
        assert!((r(1.4) - 0.5 / 1.05).abs() < 1e-12);
        assert!((r(3.0) - 1.0 / 3.0).abs() < 1e-12, "never above the headroom");
        let mut last = f64::INFINITY;
        for i in 76..300 {
            let v = r(f64::from(i) / 100.0);
            assert!(v <= last + 1e-12, "the ratio never rises with load");
            last = v;
        }
    }
}
