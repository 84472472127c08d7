//! Quotas per window as counts, not rates: allotments.
//!
//! A quota of N units a window is a count: over the window, the units admitted must not pass
//! N, however many clients admit them and however they are spread. A rate refilled from what
//! is left cannot promise that (clients say what they used only at their next exchange, and a
//! second of grant can be spent before then), so a group with quotas hands each client an
//! **allotment** with its grant: a finite number of units it may admit in the window under
//! way, on top of (never instead of) its rate. The controller counts, for each of the group's
//! windows,
//!
//! ```text
//! counted = consumed since the window began + what every client holds unspent of its allotment
//! left    = min over the windows of (quota − counted)
//! ```
//!
//! and never allots more than `left`, so what is admitted stays within every quota at every
//! moment, whichever exchange arrives first.
//!
//! - A client reports the allotment it holds with each exchange: the window it belongs to,
//!   the units given in all and the units it admitted against them. What it says it was given
//!   is taken (an answer it never received gave it nothing), never more than what the
//!   controller gave; a controller that does not know the client yet (it restarted, or took
//!   over) takes its word, so that what clients hold is counted from their first report.
//! - The allotments carry their window's count: a client reports what it used of the window
//!   under way, and what it had used when a controller first hears of it was spent under
//!   another (one killed before it wrote its last consumption, or this one before a restart).
//!   The part of it beyond what the controller had metered of the window then (its store's
//!   last write) is in no metering: the engine adds it to the group's meter, so that every
//!   window under way counts it (the longer ones after this window ends too) and the units
//!   spent before a takeover are not allotted again.
//! - An allotment lapses when the shortest of the group's windows ends. The client stops
//!   using it at the end it was told, measured from when it sent its request, which is never
//!   after the controller's. A client that dies with units left loses them until the window
//!   ends: quotas may be under-admitted, never over-admitted.
//! - What a lapsed allotment held unspent may still have been admitted before it lapsed and not
//!   yet reported: it stays counted against the group's longer windows that were under way
//!   when it lapsed (an hour's, when a minute's allotment lapses) until its client has reported
//!   twice since (the first report may have been sent before the end), by when every unit it
//!   admitted is in the group's consumption.
//! - Allotments are sized for about two exchanges of the client's demand, at least one unit,
//!   at most its demand's part of what is left when several clients ask, and never more than
//!   half of what is left in one answer, so that a client arriving later still finds some; a
//!   client whose allotment runs out asks again at once (a window of N units takes one client
//!   about log₂ N exchanges at most).
//! - A settled cost above the admitted one is real consumption and counts (a debt); work a
//!   client admits without an allotment (unthrottled work, charges) counts when reported.

use std::collections::HashMap;
use std::time::Duration;

use super::FixedHasher;
use super::above::{ABOVE_RETRY, Above};
use super::split::ClientId;
use crate::settings::{BudgetPeriod, GroupName, GroupSettings};
use crate::time::Nanos;

/// What a client holds of a group's allotment, as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QuotaHeld {
    /// The window the allotment belongs to ([`Allotment::window`]).
    pub window: u64,
    /// Units allotted to the client in that window, in all.
    pub given: f64,
    /// Units it admitted against them.
    pub used: f64,
    /// How long it wants an allotment to last at its demand (`None`: two ticks): until its
    /// next report but one, for a client that reports less often than every tick.
    pub lasts: Option<Duration>,
}

/// Units a client may admit in a group's window under way, sent with its grant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allotment {
    /// Names the window: when it began (the latest start of the group's windows, Unix
    /// milliseconds; 0 for a quota over the group's life alone).
    pub window: u64,
    /// Units added to what the client holds of this window (a new window starts from none).
    pub add: f64,
    /// How long the allotment may be used: until the shortest of the group's windows ends
    /// (`None`: a quota over the group's life alone, which never ends).
    pub ends_in: Option<Duration>,
    /// Units of the tightest quota left beyond every client's allotment, after this one.
    pub left: f64,
    /// When nothing is left beyond the allotments, this one made: how long until the windows
    /// with no room start afresh (the retry hint once the allotment is spent).
    pub reset_in: Option<Duration>,
}

/// How long to tell a client to wait when a quota over the group's life is spent: it never
/// comes back by itself, so this is only how often to look.
pub const LIFE_SPENT_RETRY: Duration = Duration::from_secs(3600);

/// The longest a client may ask an allotment to last ([`QuotaHeld::lasts`]).
pub const LASTS_MAX: Duration = Duration::from_secs(3600);

/// The smallest allotment worth an exchange, in units (less when less is left).
pub const ALLOTMENT_MIN: f64 = 1.0;

/// Where a group's quota window is counted from: the window's start (Unix milliseconds) and
/// the group's consumption then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Baseline {
    pub(crate) period_start_unix_ms: u64,
    pub(crate) consumed: f64,
}

/// One client's allotment in a group's window.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Holder {
    client: ClientId,
    given: f64,
    used: f64,
    /// Units it would use before its next exchange but one, at its last demand.
    want: f64,
    /// Units it said it had used of the window when this engine first heard of it: spent
    /// under another controller (one that was killed, or this one before a restart), and so
    /// not in this engine's metering.
    before: f64,
}

impl Holder {
    fn unspent(&self) -> f64 {
        (self.given - self.used).max(0.0)
    }

    fn need(&self) -> f64 {
        (self.want.max(ALLOTMENT_MIN) - self.unspent()).max(0.0)
    }
}

/// A group's allotments in its window under way.
#[derive(Debug, Clone, Default)]
struct Ledger {
    window: u64,
    /// Sorted by client.
    holders: Vec<Holder>,
    /// Allotments of earlier windows that lapsed with units unspent, not yet known spent or
    /// not.
    lapsed: Vec<Lapsed>,
    /// What this engine had metered of the window when it first took a client's word for
    /// units used in it before ([`Holder::before`]): the part of them already in its metering
    /// (its store's last write).
    metered_then: Option<f64>,
    /// Of [`Ledger::unmetered`], the units already taken into the group's meter
    /// ([`Quotas::take_unmetered`]).
    taken: f64,
    /// The group's consumption when its meter was last taken to be written between flushes
    /// ([`Quotas::written_marks`]).
    written: f64,
}

/// What a client held of an allotment when it lapsed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Lapsed {
    client: ClientId,
    /// The window it belonged to, and what was given and used of it as last known.
    window: u64,
    given: f64,
    used: f64,
    /// When it lapsed (the start of the window after it, Unix milliseconds): it counts in the
    /// windows that began before.
    at: u64,
    /// Reports from its client still to come before its consumption covers it.
    reports: u8,
}

/// Reports a client makes after its allotment lapsed before everything it admitted under it
/// has been reported.
const LAPSED_REPORTS: u8 = 2;

impl Ledger {
    fn unspent(&self) -> f64 {
        self.holders.iter().map(Holder::unspent).sum()
    }

    /// Units the holders spent in the window before this engine knew them that its metering
    /// does not hold: what they say they spent then, less what it had metered of the window
    /// when it first heard of such units.
    fn unmetered(&self) -> f64 {
        let before: f64 = self.holders.iter().map(|h| h.before).sum();
        ((before - self.metered_then.unwrap_or(0.0)).max(0.0) - self.taken).max(0.0)
    }

    /// Unspent units of lapsed allotments that count in a window that began at `start`.
    fn lapsed_in(&self, start: u64) -> f64 {
        self.lapsed.iter().filter(|l| start < l.at).map(|l| (l.given - l.used).max(0.0)).sum()
    }
}

/// Every group's quota windows: where each window is counted from, and the allotments
/// handed out of it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Quotas {
    baselines: HashMap<(GroupName, BudgetPeriod), Baseline, FixedHasher>,
    ledgers: HashMap<GroupName, Ledger, FixedHasher>,
    /// The Unix time in milliseconds less the engine's time in milliseconds, once a wall
    /// clock was read (windows are placed on it).
    wall_offset_ms: Option<i64>,
    /// The latest engine time seen (a tick's or a report's): whether a window from the first
    /// request that nobody asked in since has ended.
    seen: Nanos,
    /// In a regional engine: what the tier above allotted the region.
    pub(crate) above: Above,
}

/// What a report asks of a group's allotment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) now: Nanos,
    pub(crate) group: &'a GroupName,
    pub(crate) settings: &'a GroupSettings,
    /// The group's consumption in all.
    pub(crate) consumed: f64,
    pub(crate) client: ClientId,
    pub(crate) held: Option<QuotaHeld>,
    /// Units/s the client asks for.
    pub(crate) demand: f64,
    /// How far ahead an allotment should last, at the client's demand.
    pub(crate) horizon: Duration,
}

impl Quotas {
    /// Notes the engine's time (a tick's).
    pub(crate) fn observe(&mut self, now: Nanos) {
        self.seen = self.seen.max(now);
    }

    /// The latest engine time seen.
    pub(crate) fn seen(&self) -> Nanos {
        self.seen
    }

    /// Places the windows: the engine's time `now` is the Unix time `wall_ms`.
    pub(crate) fn set_wall_clock(&mut self, now: Nanos, wall_ms: u64) {
        self.observe(now);
        let now_ms = i64::try_from(now.0 / 1_000_000).unwrap_or(i64::MAX);
        self.wall_offset_ms = Some(i64::try_from(wall_ms).unwrap_or(i64::MAX).saturating_sub(now_ms));
    }

    /// The Unix time in milliseconds at the engine's time `now`, once a wall clock was read.
    pub(crate) fn wall_ms(&self, now: Nanos) -> Option<u64> {
        let now_ms = i64::try_from(now.0 / 1_000_000).unwrap_or(i64::MAX);
        self.wall_offset_ms.map(|o| u64::try_from(now_ms.saturating_add(o)).unwrap_or(0))
    }

    pub(crate) fn baseline(&self, group: &GroupName, window: BudgetPeriod) -> Option<&Baseline> {
        self.baselines.get(&(group.clone(), window))
    }

    pub(crate) fn set_baseline(&mut self, group: GroupName, window: BudgetPeriod, b: Baseline) {
        self.baselines.insert((group, window), b);
    }

    /// Keeps the baselines `keep` says a group still counts.
    pub(crate) fn retain_baselines(&mut self, mut keep: impl FnMut(&GroupName, BudgetPeriod) -> bool) {
        self.baselines.retain(|(g, w), _| keep(g, *w));
    }

    /// Forgets a group's windows and allotments (it was dropped).
    pub(crate) fn forget(&mut self, group: &GroupName) {
        self.baselines.retain(|(g, _), _| g != group);
        self.ledgers.remove(group);
    }

    /// Drops the allotments of groups `keep` says have no quota any more.
    pub(crate) fn retain_ledgers(&mut self, mut keep: impl FnMut(&GroupName) -> bool) {
        self.ledgers.retain(|g, _| keep(g));
    }

    /// Drops the allotments of restarted clients' earlier incarnations (`released`, sorted):
    /// they went with the process. (A report does it for its group as it comes.)
    #[cfg(test)]
    pub(crate) fn release(&mut self, released: &[ClientId]) {
        for l in self.ledgers.values_mut() {
            l.holders.retain(|h| released.binary_search(&h.client).is_err());
        }
    }

    /// What is left of `s`'s tightest quota for a group that has consumed `consumed` in all
    /// (each window counted from its start's baseline; the group's life from nothing), the
    /// allotments not yet spent left out: what the group's rate is capped by, so that a client
    /// can spend the allotment it holds. `None` when it has no quota; at or below 0, a quota
    /// is spent.
    pub(crate) fn left(&self, group: &GroupName, s: &GroupSettings, consumed: f64) -> Option<f64> {
        // Most groups have no quota: no look-up for them (a tick asks for every group).
        if !s.has_quotas() {
            return None;
        }
        s.quotas().map(|(w, units)| units - self.counted(group, w, consumed)).reduce(f64::min)
    }

    /// What `group` consumed in `window` so far (allotments aside). A window from the first
    /// request that has ended counts nothing: the next request starts a new one.
    fn counted(&self, group: &GroupName, window: BudgetPeriod, consumed: f64) -> f64 {
        let baseline = match (window, self.baseline(group, window)) {
            (BudgetPeriod::Total, _) => 0.0,
            (BudgetPeriod::FromFirst(_), Some(b)) => {
                let ended =
                    self.wall_ms(self.seen).is_some_and(|w| w >= b.period_start_unix_ms + window.span_ms());
                if ended { consumed } else { b.consumed }
            }
            (BudgetPeriod::FromFirst(_), None) => consumed,
            (_, b) => b.map_or(0.0, |b| b.consumed),
        };
        consumed - baseline
    }

    /// Takes a client's report of its allotment and answers with more, as much as the
    /// group's quotas leave (`None`: the group has no quota, or no wall clock places its
    /// windows yet).
    pub(crate) fn allot(&mut self, ask: Ask<'_>, released: &[ClientId]) -> Option<Allotment> {
        let s = ask.settings;
        if !s.has_quotas() {
            return None;
        }
        self.observe(ask.now);
        let wall = self.wall_ms(ask.now)?;
        let (window, ends_at, pending) =
            self.start_windows(ask.group, s, (wall, ask.consumed), ask.demand > 0.0);
        // What this engine has metered of the window under way (the one that began last).
        let latest = s.quotas().map(|(w, _)| w).max_by_key(|&w| self.window_start(ask.group, w));
        let metered = latest.map_or(0.0, |w| self.counted(ask.group, w, ask.consumed));
        let at = self.holder(&ask, (window, metered), released);
        // Lapsed allotments no window under way counts any more are forgotten.
        let starts: Vec<u64> = s.quotas().map(|(w, _)| self.window_start(ask.group, w)).collect();
        if let Some(l) = self.ledgers.get_mut(ask.group) {
            l.lapsed.retain(|l| starts.iter().any(|&start| start < l.at));
        }
        let (unspent, before) = (self.ledgers[ask.group].unspent(), self.ledgers[ask.group].unmetered());
        // Every window under way began by the ledger's (the latest start): what its holders
        // spent in it before this engine knew them is in each, though not in its metering.
        let room = |w: BudgetPeriod, units: f64| {
            let start = self.window_start(ask.group, w);
            units
                - self.counted(ask.group, w, ask.consumed)
                - unspent
                - before
                - self.ledgers[ask.group].lapsed_in(start)
        };
        let left = s.quotas().map(|(w, units)| room(w, units)).fold(f64::INFINITY, f64::min);
        let add = if pending { 0.0 } else { size(&self.ledgers[ask.group].holders, at, left) };
        debug_assert!(add >= 0.0 && (add <= left.max(0.0)), "an allotment within what is left");
        // Nothing left beyond the allotments once this one is made: the windows with no room
        // come back when they start afresh (sooner only if a client gives units back).
        let mut reset_in: Option<Duration> = None;
        for (w, _) in s.quotas().filter(|&(w, units)| room(w, units) - add <= 1e-9) {
            let back = match self.window_end(ask.group, w, wall) {
                Some(end) => Duration::from_millis(end.saturating_sub(wall)),
                None => LIFE_SPENT_RETRY,
            };
            reset_in = Some(reset_in.map_or(back, |r| r.max(back)));
        }
        let ledger = self.ledgers.get_mut(ask.group).expect("made above");
        ledger.holders[at].given += add;
        Some(Allotment {
            window,
            add,
            ends_in: ends_at.map(|e| Duration::from_millis(e.saturating_sub(wall))),
            left: (left - add).max(0.0),
            reset_in,
        })
    }

    /// The place of `ask`'s client in its group's ledger of `window` (the ledger started
    /// afresh if it was another window's), with what it reports it holds taken.
    fn holder(&mut self, ask: &Ask<'_>, (window, metered): (u64, f64), released: &[ClientId]) -> usize {
        let ledger = self.ledgers.entry(ask.group.clone()).or_default();
        if ledger.window != window {
            // The shortest window ended: every allotment of the last one lapsed with it, what
            // it held unspent counted on in the longer windows until its client reports.
            let old = ledger.window;
            let lapsed = ledger.holders.iter().filter(|h| h.unspent() > 0.0).map(|h| Lapsed {
                client: h.client,
                window: old,
                given: h.given,
                used: h.used,
                at: window,
                reports: LAPSED_REPORTS,
            });
            ledger.lapsed.extend(lapsed.collect::<Vec<_>>());
            ledger.window = window;
            ledger.holders.clear();
            (ledger.metered_then, ledger.taken) = (None, 0.0);
        }
        if !released.is_empty() {
            ledger.holders.retain(|h| released.binary_search(&h.client).is_err());
            ledger.lapsed.retain(|l| released.binary_search(&l.client).is_err());
        }
        // This report brings its client's lapsed allotments a report nearer being covered,
        // and says what it used of the one it still reports.
        for l in ledger.lapsed.iter_mut().filter(|l| l.client == ask.client) {
            l.reports = l.reports.saturating_sub(1);
            if let Some(q) = ask.held.filter(|q| q.window == l.window) {
                (l.given, l.used) = (finite(q.given).min(l.given), finite(q.used).max(l.used));
            }
        }
        ledger.lapsed.retain(|l| l.reports > 0);
        let at = match ledger.holders.binary_search_by_key(&ask.client, |h| h.client) {
            Ok(at) => {
                let h = &mut ledger.holders[at];
                match ask.held.filter(|q| q.window == window) {
                    // The client's word, never above what was given.
                    Some(q) => (h.given, h.used) = (finite(q.given).min(h.given), finite(q.used)),
                    None => (h.given, h.used) = (0.0, 0.0),
                }
                h.before = h.before.min(h.used);
                at
            }
            Err(at) => {
                // Unknown here: what it says it holds is counted (a controller that restarted
                // or took over learns what clients hold from their reports).
                let (given, used) = ask
                    .held
                    .filter(|q| q.window == window)
                    .map_or((0.0, 0.0), |q| (finite(q.given), finite(q.used)));
                if used > 0.0 && ledger.metered_then.is_none() {
                    ledger.metered_then = Some(metered);
                }
                ledger
                    .holders
                    .insert(at, Holder { client: ask.client, given, used, want: 0.0, before: used });
                at
            }
        };
        ledger.holders[at].want = finite(ask.demand) * ask.horizon.as_secs_f64();
        at
    }

    /// In a regional engine: takes a client's report of its allotment and answers with more,
    /// as much as what the tier above allotted the region leaves ([`Above`]). A group the tier
    /// above has allotted nothing yet is given nothing, and told to look again in a second.
    pub(crate) fn allot_regional(&mut self, ask: Ask<'_>, released: &[ClientId]) -> Option<Allotment> {
        if !ask.settings.has_quotas() {
            return None;
        }
        self.observe(ask.now);
        let Some(lot) = self.above.lot(ask.group, ask.now, ask.consumed) else {
            let nothing =
                Allotment { window: 0, add: 0.0, ends_in: None, left: 0.0, reset_in: Some(ABOVE_RETRY) };
            return Some(nothing);
        };
        let at = self.holder(&ask, (lot.window, 0.0), released);
        let left = lot.room - self.ledgers[ask.group].unspent();
        let add = size(&self.ledgers[ask.group].holders, at, left);
        let ledger = self.ledgers.get_mut(ask.group).expect("made above");
        ledger.holders[at].given += add;
        // Nothing left here once this one is made: back when the tier above's windows start
        // afresh, or in a second if it had more for the region to ask for.
        let reset_in = (left - add <= 1e-9)
            .then(|| if lot.beyond > 0.0 { ABOVE_RETRY } else { lot.reset_in.unwrap_or(ABOVE_RETRY) });
        Some(Allotment {
            window: lot.window,
            add,
            ends_in: lot.ends_in,
            left: (left - add).max(0.0),
            reset_in,
        })
    }

    /// Starts the windows of `group` that began since their baselines were taken, from its
    /// consumption now (a window from the first request: when it has ended and the client
    /// `asks`); returns the window its allotments belong to (the latest start), when it ends
    /// (the earliest end; `None` for a quota over the group's life alone), and whether a window
    /// from the first request waits for that request (then nothing is allotted yet: the
    /// client asks again with it).
    fn start_windows(
        &mut self,
        group: &GroupName,
        s: &GroupSettings,
        (wall, consumed): (u64, f64),
        asks: bool,
    ) -> (u64, Option<u64>, bool) {
        let (mut window, mut ends, mut pending) = (0u64, None::<u64>, false);
        for w in s.quotas().map(|(w, _)| w).filter(|w| *w != BudgetPeriod::Total) {
            let start = match (w, self.baseline(group, w)) {
                // Under way; or ended with nobody asking yet (nothing of it is counted then).
                (BudgetPeriod::FromFirst(_), Some(b))
                    if wall < b.period_start_unix_ms + w.span_ms() || !asks =>
                {
                    b.period_start_unix_ms
                }
                (BudgetPeriod::FromFirst(_), None) if !asks => {
                    pending = true;
                    continue;
                }
                // Its first request since the last ended: it starts now.
                (BudgetPeriod::FromFirst(_), _) => wall,
                _ => w.start_of(wall),
            };
            // As the windows' roll would (a controller rolls them after every tick and at
            // every flush): a window begun since, or never started, counts from now.
            let b = self
                .baselines
                .entry((group.clone(), w))
                .or_insert(Baseline { period_start_unix_ms: start, consumed });
            if b.period_start_unix_ms != start {
                *b = Baseline { period_start_unix_ms: start, consumed };
            }
            window = window.max(start);
            if let Some(end) = self.window_end(group, w, wall) {
                ends = Some(ends.map_or(end, |e: u64| e.min(end)));
            }
        }
        (window, ends, pending)
    }

    /// When `group`'s `window` under way at `wall` ends (`None`: never, the group's life).
    /// When `group`'s `window` under way began (Unix milliseconds; 0 for its life).
    fn window_start(&self, group: &GroupName, window: BudgetPeriod) -> u64 {
        match window {
            BudgetPeriod::Total => 0,
            w => self.baseline(group, w).map_or(0, |b| b.period_start_unix_ms),
        }
    }

    fn window_end(&self, group: &GroupName, window: BudgetPeriod, wall: u64) -> Option<u64> {
        match window {
            BudgetPeriod::FromFirst(_) => {
                self.baseline(group, window).map(|b| b.period_start_unix_ms + window.span_ms())
            }
            _ => window.end_of(wall),
        }
    }

    /// Takes the units `group`'s clients spent in the window under way before this engine knew
    /// them that its metering does not hold ([`Ledger::unmetered`]): for the engine to add to
    /// the group's meter, where every window under way counts them (the window after the
    /// allotments' too, which the clients' reports no longer cover) and the store gets them.
    pub(crate) fn take_unmetered(&mut self, group: &GroupName) -> f64 {
        let Some(ledger) = self.ledgers.get_mut(group) else { return 0.0 };
        let found = ledger.unmetered();
        ledger.taken += found;
        found
    }

    /// Each group with allotments under way, with the consumption its meter was last taken
    /// at to be written between flushes (sorted by name).
    pub(crate) fn written_marks(&mut self) -> Vec<(&GroupName, &mut f64)> {
        let mut marks: Vec<_> = self.ledgers.iter_mut().map(|(g, l)| (g, &mut l.written)).collect();
        marks.sort_unstable_by(|a, b| a.0.cmp(b.0));
        marks
    }

    /// The units every client holds unspent of `group`'s allotments.
    pub(crate) fn unspent(&self, group: &GroupName) -> f64 {
        self.ledgers.get(group).map_or(0.0, Ledger::unspent)
    }
}

/// `v` if it is a number not below 0, else 0.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v.max(0.0) } else { 0.0 }
}

/// The units to add to the allotment of the holder at `at`: what it needs to last its horizon,
/// at most its need's part of what is `left` when others need some too and half of what is
/// left (but at least one unit while any is left), in whole units, never more than is left.
fn size(holders: &[Holder], at: usize, left: f64) -> f64 {
    // Nothing left, or no number at all.
    if left.is_nan() || left <= 0.0 {
        return 0.0;
    }
    let mine = holders[at].need();
    if mine <= 0.0 {
        return 0.0;
    }
    let all: f64 = holders.iter().map(Holder::need).sum();
    let fair = (left * mine / all).min(left / 2.0);
    let add = mine.min(fair.max(ALLOTMENT_MIN.min(mine))).min(left);
    // Whole units while one is left (a count of requests is whole: a fraction would be
    // stranded where no request fits it); the last fraction of a fractional quota as it is.
    if left >= 1.0 { add.floor().max(1.0).min(left) } else { add }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::GroupSettings;

    const MINUTE_MS: u64 = 60_000;

    fn name(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    fn minute_quota(units: f64) -> GroupSettings {
        GroupSettings::builder().quota(BudgetPeriod::Minute, units).build().unwrap()
    }

    fn ask<'a>(
        g: &'a GroupName,
        s: &'a GroupSettings,
        now_s: u64,
        consumed: f64,
        client: ClientId,
        held: Option<QuotaHeld>,
        demand: f64,
    ) -> Ask<'a> {
        Ask {
            now: Nanos(now_s * 1_000_000_000),
            group: g,
            settings: s,
            consumed,
            client,
            held,
            demand,
            horizon: Duration::from_secs(2),
        }
    }

    /// Quotas whose time 0 is ten minutes past the epoch on the wall, `g`'s minute counted
    /// from its start.
    fn at_minute_ten(g: &GroupName) -> Quotas {
        let mut q = Quotas::default();
        q.set_wall_clock(Nanos(0), 10 * MINUTE_MS);
        let start = Baseline { period_start_unix_ms: 10 * MINUTE_MS, consumed: 0.0 };
        q.set_baseline(g.clone(), BudgetPeriod::Minute, start);
        q
    }

    #[test]
    fn allotments_never_add_up_to_more_than_the_quota() {
        let (g, s) = (name("api"), minute_quota(20.0));
        let mut q = at_minute_ten(&g);
        // Three clients, each asking 100 units/s: far more than the minute holds.
        let mut given = [0.0f64; 3];
        for c in 0..3 {
            let a = q.allot(ask(&g, &s, 1, 0.0, c, None, 100.0), &[]).unwrap();
            assert_eq!(a.window, 10 * MINUTE_MS);
            assert_eq!(a.ends_in, Some(Duration::from_secs(59)));
            given[c as usize] = a.add;
        }
        let total: f64 = given.iter().sum();
        assert!(total <= 20.0 + 1e-9, "{given:?}");
        // The first took half of what was left, so the others got some too.
        assert_eq!(given[0], 10.0);
        assert!(given.iter().all(|&g| g >= 1.0), "{given:?}");
        // Client 0 used all of its allotment: asking again finds only what the others leave.
        let held = QuotaHeld { window: 10 * MINUTE_MS, given: given[0], used: given[0], lasts: None };
        let a = q.allot(ask(&g, &s, 2, given[0], 0, Some(held), 100.0), &[]).unwrap();
        assert!(given[0] + a.add + given[1] + given[2] <= 20.0 + 1e-9);
        assert!((a.left - (20.0 - given[0] - a.add - given[1] - given[2])).abs() < 1e-9, "{a:?}");
    }

    #[test]
    fn what_a_lapsed_allotment_held_counts_in_the_hour_until_its_client_has_reported() {
        let g = name("api");
        let s = GroupSettings::builder()
            .quota(BudgetPeriod::Minute, 100.0)
            .quota(BudgetPeriod::Hour, 10.0)
            .build()
            .unwrap();
        let mut q = at_minute_ten(&g);
        // Client 1 takes half of the hour's 10, and its minute ends before it reports.
        let a = q.allot(ask(&g, &s, 1, 0.0, 1, None, 50.0), &[]).unwrap();
        assert_eq!(a.add, 5.0);
        // The next minute: client 2 finds the hour's 10 less the 5 client 1 may have admitted
        // and not reported yet, and takes half of that.
        let b = q.allot(ask(&g, &s, 61, 0.0, 2, None, 50.0), &[]).unwrap();
        assert_eq!((b.window, b.add), (11 * MINUTE_MS, 2.0), "{b:?}");
        // Client 1 reports: it admitted 4 of its 5 in the last minute. One is left unspent,
        // still counted until its next report.
        let held = QuotaHeld { window: a.window, given: 5.0, used: 4.0, lasts: None };
        let c = q.allot(ask(&g, &s, 62, 4.0, 1, Some(held), 50.0), &[]).unwrap();
        assert!((c.left + c.add - (10.0 - 4.0 - 2.0 - 1.0)).abs() < 1e-9, "{c:?}");
        // Its second report since: the lapsed allotment is known spent as reported.
        let held = QuotaHeld { window: c.window, given: c.add, used: 0.0, lasts: None };
        let d = q.allot(ask(&g, &s, 63, 4.0, 1, Some(held), 50.0), &[]).unwrap();
        assert!((d.left + d.add - (10.0 - 4.0 - 2.0 - c.add)).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn a_spent_quota_says_when_it_comes_back_and_a_new_window_starts_afresh() {
        let (g, s) = (name("api"), minute_quota(5.0));
        let mut q = at_minute_ten(&g);
        let a = q.allot(ask(&g, &s, 0, 0.0, 1, None, 50.0), &[]).unwrap();
        assert_eq!(a.add, 2.0, "half of what is left at most, in whole units");
        // Each time all it held was used: half of what is left, at least one unit.
        let mut given = 2.0;
        for (t, expected) in [(1, 1.0), (2, 1.0), (3, 1.0)] {
            let held = QuotaHeld { window: a.window, given, used: given, lasts: None };
            let next = q.allot(ask(&g, &s, t, given, 1, Some(held), 50.0), &[]).unwrap();
            assert_eq!(next.add, expected, "at {t} s with {given} given");
            given += next.add;
        }
        assert_eq!(given, 5.0);
        // A fractional quota's last fraction is allotted as it is.
        let (g2, s2) = (name("tiny"), minute_quota(1.5));
        let first = q.allot(ask(&g2, &s2, 0, 0.0, 1, None, 50.0), &[]).unwrap();
        assert_eq!(first.add, 1.0);
        let held2 = QuotaHeld { window: first.window, given: 1.0, used: 1.0, lasts: None };
        assert_eq!(q.allot(ask(&g2, &s2, 1, 1.0, 1, Some(held2), 50.0), &[]).unwrap().add, 0.5);
        let held = QuotaHeld { window: a.window, given: 5.0, used: 5.0, lasts: None };
        let spent = q.allot(ask(&g, &s, 20, 5.0, 1, Some(held), 50.0), &[]).unwrap();
        assert_eq!((spent.add, spent.left), (0.0, 0.0));
        assert_eq!(spent.reset_in, Some(Duration::from_secs(40)));
        // The next minute: the old allotment lapsed, the window counts from the consumption then.
        let fresh = q.allot(ask(&g, &s, 61, 5.0, 1, Some(held), 50.0), &[]).unwrap();
        assert_eq!(fresh.window, 11 * MINUTE_MS);
        assert_eq!(fresh.add, 2.0);
        assert_eq!(fresh.reset_in, None);
    }

    #[test]
    fn a_lost_answer_gives_nothing_and_a_new_controller_counts_what_clients_say_they_hold() {
        let (g, s) = (name("api"), minute_quota(10.0));
        let mut q = Quotas::default();
        q.set_wall_clock(Nanos(0), 10 * MINUTE_MS);
        let w = 10 * MINUTE_MS;
        let a = q.allot(ask(&g, &s, 0, 0.0, 1, None, 2.0), &[]).unwrap();
        assert_eq!(a.add, 4.0);
        // The answer never arrived: the client says it holds nothing, and nothing is counted.
        let b = q
            .allot(
                ask(
                    &g,
                    &s,
                    1,
                    0.0,
                    1,
                    Some(QuotaHeld { window: w, given: 0.0, used: 0.0, lasts: None }),
                    2.0,
                ),
                &[],
            )
            .unwrap();
        assert_eq!(b.add, 4.0);
        assert_eq!(q.unspent(&g), 4.0);
        // A client may not claim more than it was given.
        q.allot(
            ask(&g, &s, 2, 0.0, 1, Some(QuotaHeld { window: w, given: 9.0, used: 0.0, lasts: None }), 0.0),
            &[],
        )
        .unwrap();
        assert_eq!(q.unspent(&g), 4.0);
        // A fresh controller takes a client's word for what it holds.
        let mut fresh = Quotas::default();
        fresh.set_wall_clock(Nanos(0), 10 * MINUTE_MS);
        // Its window counted from its start, as a controller's store gives it.
        fresh.set_baseline(
            g.clone(),
            BudgetPeriod::Minute,
            Baseline { period_start_unix_ms: w, consumed: 0.0 },
        );
        let held = QuotaHeld { window: w, given: 8.0, used: 1.0, lasts: None };
        let c = fresh.allot(ask(&g, &s, 3, 1.0, 7, Some(held), 0.0), &[]).unwrap();
        assert_eq!(fresh.unspent(&g), 7.0);
        assert_eq!(c.left, 2.0, "10 less 1 consumed less 7 held");
        // A restarted client's earlier incarnation holds nothing any more.
        fresh.release(&[7]);
        assert_eq!(fresh.unspent(&g), 0.0);
    }

    #[test]
    fn the_tightest_window_bounds_the_allotment_and_the_shortest_ends_it() {
        let s = GroupSettings::builder()
            .quota(BudgetPeriod::Minute, 100.0)
            .quota(BudgetPeriod::Hour, 30.0)
            .build()
            .unwrap();
        let g = name("api");
        let mut q = Quotas::default();
        q.set_wall_clock(Nanos(0), 61 * MINUTE_MS + 30_000);
        let a = q.allot(ask(&g, &s, 0, 0.0, 1, None, 1000.0), &[]).unwrap();
        assert_eq!(a.add, 15.0, "half of the hour's 30");
        assert_eq!(a.ends_in, Some(Duration::from_secs(30)));
        let held = QuotaHeld { window: a.window, given: 30.0, used: 30.0, lasts: None };
        let spent = q.allot(ask(&g, &s, 1, 30.0, 1, Some(held), 1000.0), &[]).unwrap();
        // The hour is spent: back at the next hour, 59 minutes and 29 s away.
        assert_eq!(spent.reset_in, Some(Duration::from_secs(59 * 60 - 31)));
    }

    #[test]
    fn windows_of_seconds_turn_on_the_epoch_and_windows_from_the_first_request_wait_for_it() {
        let g = name("api");
        // 90 s windows from the epoch: 600 s is 60 s into the one that began at 540 s.
        let every = GroupSettings::builder().quota(BudgetPeriod::Every(90), 10.0).build().unwrap();
        let mut q = Quotas::default();
        q.set_wall_clock(Nanos(0), 10 * MINUTE_MS);
        let a = q.allot(ask(&g, &every, 0, 0.0, 1, None, 100.0), &[]).unwrap();
        assert_eq!((a.window, a.ends_in), (540_000, Some(Duration::from_secs(30))));
        // A minute from the first request: nothing until someone asks, then from that moment.
        let (h, first) =
            (name("lab"), GroupSettings::builder().quota(BudgetPeriod::FromFirst(60), 5.0).build().unwrap());
        let idle = q.allot(ask(&h, &first, 0, 0.0, 1, None, 0.0), &[]).unwrap();
        assert_eq!((idle.add, idle.left), (0.0, 5.0), "nothing allotted before the first request");
        let started = q.allot(ask(&h, &first, 7, 0.0, 1, None, 3.0), &[]).unwrap();
        assert_eq!(started.window, 10 * MINUTE_MS + 7_000);
        assert_eq!(started.ends_in, Some(Duration::from_secs(60)));
        assert_eq!(started.add, 2.0);
        // Spent: it comes back a minute after the first request, not on the clock's minute.
        let held = QuotaHeld { window: started.window, given: 5.0, used: 5.0, lasts: None };
        let spent = q.allot(ask(&h, &first, 20, 5.0, 1, Some(held), 3.0), &[]).unwrap();
        assert_eq!(spent.left, 0.0);
        assert_eq!(spent.reset_in, Some(Duration::from_secs(47)));
        // Ended, and nobody asking: nothing is counted against the next one yet.
        q.observe(Nanos(80 * 1_000_000_000));
        assert_eq!(q.left(&h, &first, 5.0), Some(5.0));
        let again = q.allot(ask(&h, &first, 90, 5.0, 1, Some(held), 3.0), &[]).unwrap();
        assert_eq!(again.window, 10 * MINUTE_MS + 90_000);
        assert_eq!(again.ends_in, Some(Duration::from_secs(60)));
    }
}
