//! What the engine shows of each group: for status pages, metrics and the simulator.

use crate::settings::{GroupName, GroupSettings};

use super::{Engine, GroupOutcome, Meter, RateMarks};

/// A group's settings and state as of the last tick.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupView {
    /// Its name.
    pub name: GroupName,
    /// Its settings, if configured.
    pub settings: Option<GroupSettings>,
    /// Target units/s; `None` when not throttled (or not ticked yet).
    pub target: Option<f64>,
    /// Units/s consumed over the last tick.
    pub admitted: f64,
    /// Requests/s refused over the last tick.
    pub throttled: f64,
    /// Units/s asked for, waiting work included.
    pub demand: f64,
    /// Units/s of unthrottled work.
    pub unthrottled: f64,
    /// Limited by saturation below its cap.
    pub busy: bool,
    /// Clients reporting it.
    pub clients: u32,
    /// Its consumption so far.
    pub meter: Meter,
    /// The limiting rate from saturation, if any.
    pub limiting: Option<f64>,
    /// The headroom rate holding it, if any (see [`GroupOutcome::headroom`]).
    pub headroom: Option<f64>,
    /// Its share of the node capacity, if one is set.
    pub share: Option<f64>,
    /// What each busy client may use, units/s.
    pub water_level: Option<f64>,
    /// Average cost per request, units.
    pub avg_cost: f64,
    /// Load reported by backends, units/s.
    pub load: f64,
    /// Its budget is spent.
    pub budget_exhausted: bool,
    /// Units/s of its live grants: the last tick's, and those made since to clients the tick
    /// did not know.
    pub granted: f64,
    /// Its ramp's pool, if it ramps.
    pub ramp_pool: Option<f64>,
    /// Its consumption rate's low and high water marks and average over the last minute.
    pub last_minute: Option<RateMarks>,
    /// The same over the last hour.
    pub last_hour: Option<RateMarks>,
    /// What its requests did in detail (RRU, WRU, bytes, CPU, requests), as clients reported
    /// it, since this engine first saw the group; `None` when no client reported any.
    pub detail: Option<crate::cost::Consumption>,
    /// What its clients hold of its in-flight quota; `None` when it has none or no client
    /// has reported on it.
    pub in_flight: Option<super::InFlight>,
    /// Its requests admitted and refused by class, once a critical or sheddable one was
    /// seen (see [`Engine::by_class`]).
    pub by_class: Option<super::ClassTotals>,
}

impl Engine {
    /// Every group configured or tracked, in no particular order: one pass over each, so its
    /// cost is linear in the number of groups (sort outside any lock the engine is under).
    pub fn view(&self) -> Vec<GroupView> {
        let mut out = Vec::with_capacity(self.catalog.len() + self.tracked.len());
        for (name, settings) in self.catalog.iter() {
            out.push(self.view_of(name, Some(settings)));
        }
        for name in self.tracked.keys() {
            if !self.catalog.contains_key(name) {
                out.push(self.view_of(name, None));
            }
        }
        out
    }

    /// Up to `len` views of [`view`](Self::view)'s order from position `start` (the
    /// configured groups, then the other tracked ones), and the position after them (`None`
    /// past the last). Made a part at a time, a view of many groups holds the engine only a
    /// little at a time; changes between parts may show a group twice or not at all.
    pub fn view_part(&self, start: usize, len: usize) -> (Vec<GroupView>, Option<usize>) {
        let mut out = Vec::with_capacity(len.min(self.catalog.len() + self.tracked.len()));
        let configured = self.catalog.len();
        let mut at = start;
        if at < configured {
            for (name, settings) in self.catalog.iter().skip(at).take(len) {
                out.push(self.view_of(name, Some(settings)));
                at += 1;
            }
        }
        while out.len() < len {
            let Some((name, _)) = self.tracked.get_index(at - configured) else { return (out, None) };
            if !self.catalog.contains_key(name) {
                out.push(self.view_of(name, None));
            }
            at += 1;
        }
        (out, Some(at))
    }

    /// One group's view.
    pub fn group_view(&self, name: &GroupName) -> Option<GroupView> {
        let settings = self.catalog.get(name).map(|s| &**s);
        (settings.is_some() || self.tracked.contains_key(name)).then(|| self.view_of(name, settings))
    }

    fn view_of(&self, name: &GroupName, settings: Option<&GroupSettings>) -> GroupView {
        let g = self.tracked.get(name);
        let o = g.and_then(|g| g.outcome.as_ref());
        let marks = match (g, self.ticking.last) {
            (Some(g), Some(at)) => g.rate_now.marks(g.rates.as_deref(), at),
            _ => (None, None),
        };
        GroupView {
            in_flight: self.in_flight(name),
            by_class: self.by_class(name),
            name: name.clone(),
            settings: settings.cloned(),
            target: o.and_then(GroupOutcome::target),
            admitted: g.map_or(0.0, |g| f64::from(g.admitted_last_tick)),
            throttled: o.map_or(0.0, |o| f64::from(o.throttled)),
            demand: o.map_or(0.0, |o| o.demand),
            unthrottled: o.map_or(0.0, |o| f64::from(o.unthrottled)),
            busy: o.is_some_and(|o| o.busy),
            clients: g.map_or(0, |g| g.clients.len() as u32),
            meter: self.meter(name).unwrap_or_default(),
            limiting: o.and_then(GroupOutcome::limiting),
            headroom: o.and_then(GroupOutcome::headroom),
            share: o.and_then(GroupOutcome::share),
            water_level: o.and_then(GroupOutcome::water_level),
            avg_cost: o.map_or(1.0, |o| o.avg_cost),
            load: o.map_or(0.0, |o| f64::from(o.load)),
            budget_exhausted: o.is_some_and(|o| o.budget_exhausted),
            granted: o.map_or(0.0, GroupOutcome::granted) + self.provisional.of(name),
            ramp_pool: g.and_then(|g| g.ramp.as_ref()).map(|r| r.pool() as f64),
            last_minute: marks.0,
            last_hour: marks.1,
            detail: g.and_then(|g| g.detail.as_deref()).map(|d| d.totals),
        }
    }
}
