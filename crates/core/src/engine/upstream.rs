//! A regional engine: one whose groups' rates come from a tier above it (Doorman's tree).
//!
//! A regional controller serves its region's clients from an engine of its own, and leases
//! each group's share for the region from the global tier as one client would, reporting its
//! clients' demand and consumption added up ([`Engine::upstream_usage`]). What the global tier
//! grants the region is the group's ceiling here ([`Engine::set_upstream`]): the region's
//! clients split it by the usual policy. A group the global tier has not granted yet has a
//! ceiling of nothing, so a region never grants what the global tier has not given it; its
//! clients wait for the first lease. Quotas over windows are counted by the global tier, which
//! sees every region's consumption: the region takes allotments of them as a client does, and
//! allots its own clients out of what it holds ([`super::above`]).

use super::{Allotment, Engine, FixedHasher, GroupName, QuotaHeld};
use std::collections::HashMap;

/// What the tier above granted this engine for one group: a rate and a burst, units/s and
/// units (infinite: unlimited), and an allotment of its quotas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpstreamGrant {
    /// Units/s.
    pub rate: f64,
    /// Units.
    pub burst: f64,
    /// The region's part of the group's reservation: where its clients' safe mode stops, so
    /// that the floors of every region's clients add up to the reservation.
    pub reserved: f64,
    /// Of a group with quotas per window, units the region may admit in the window under way
    /// (`None`: nothing new, as when a share decays while the tier above is out of reach).
    pub quota: Option<Allotment>,
}

/// One group's usage by this engine's clients, added up, as the tier above is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamUsage {
    /// The group.
    pub group: GroupName,
    /// Units/s its clients ask for, waiting and unthrottled work included.
    pub demand: f64,
    /// Units/s of unthrottled work among them.
    pub unthrottled: f64,
    /// Its running totals here: units consumed, requests admitted, refused and made to wait.
    pub meter: super::Meter,
    /// What the tier above granted it last (`None`: nothing yet).
    pub held: Option<UpstreamGrant>,
    /// Of a group with quotas per window: what the region holds of the tier above's
    /// allotment, and what it used of it.
    pub quota: Option<QuotaHeld>,
}

/// How long a round lasts, in seconds, for what a region keeps of an allotment beyond what its
/// clients hold: a client's exchange period.
const ABOVE_KEEP_S: f64 = 1.0;

/// The grants from the tier above, by group; `None` in an engine that has no tier above.
pub(crate) type Upstream = Option<HashMap<GroupName, UpstreamGrant, FixedHasher>>;

/// A group's ceiling under `upstream`: what the tier above granted it (nothing before it has),
/// or no ceiling in an engine that has no tier above.
pub(crate) fn ceiling(upstream: &Upstream, group: &GroupName) -> Option<UpstreamGrant> {
    let grants = upstream.as_ref()?;
    Some(grants.get(group).copied().unwrap_or(UpstreamGrant {
        rate: 0.0,
        burst: 0.0,
        reserved: 0.0,
        quota: None,
    }))
}

impl Engine {
    /// Makes this a regional engine, or an ordinary one again (every upstream grant
    /// forgotten). A regional engine serves one region's clients for a tier above it, which
    /// grants the region each group's share (Doorman's tree): that share is the group's
    /// ceiling here ([`set_upstream`](Self::set_upstream)), nothing before the first; its
    /// clients' usage, added up, is what the tier above is told
    /// ([`upstream_usage`](Self::upstream_usage)); quotas over windows are counted by the
    /// tier above, which counts every region's consumption and allots the region its part.
    pub fn set_upstream_mode(&mut self, on: bool) {
        self.upstream = on.then(HashMap::default);
        self.catalog.touch();
    }

    /// Whether this is a regional engine.
    pub fn is_regional(&self) -> bool {
        self.upstream.is_some()
    }

    /// Whether `group` waits for its first share from the tier above: in a regional engine, a
    /// group (by the state its reports land in) the tier above has granted nothing yet.
    pub fn awaits_upstream(&self, group: &GroupName) -> bool {
        self.upstream.as_ref().is_some_and(|grants| !grants.contains_key(&self.state_key(group)))
    }

    /// Takes what the tier above granted for `group`: its ceiling here from the next tick on
    /// (and for clients new to it at once), and its allotment of the group's quotas (timed
    /// from the engine's latest time). Says whether the ceiling moved. Ignored by an engine
    /// that is not regional.
    pub fn set_upstream(&mut self, group: GroupName, grant: UpstreamGrant) -> bool {
        let Some(grants) = &mut self.upstream else { return false };
        if let Some(a) = &grant.quota {
            let consumed = self.tracked.get(&group).map_or(0.0, |g| g.meter.consumed);
            let now = self.quotas.seen();
            self.quotas.above.take(&group, a, now, consumed);
        }
        let rate = if grant.rate.is_nan() { 0.0 } else { grant.rate.max(0.0) };
        let burst = if grant.burst.is_nan() { 0.0 } else { grant.burst.max(0.0) };
        let reserved = if grant.reserved.is_nan() { 0.0 } else { grant.reserved.clamp(0.0, rate) };
        let new = UpstreamGrant { rate, burst, reserved, quota: None };
        grants.insert(group, new) != Some(new)
    }

    /// Every tracked group with a client, as the tier above is told it, at most `max` of them
    /// (the most the tier takes in one exchange). Upstream grants of groups no longer tracked
    /// are forgotten.
    pub fn upstream_usage(&mut self, max: usize) -> Vec<UpstreamUsage> {
        let Engine { tracked, upstream, quotas, .. } = self;
        if let Some(grants) = upstream {
            grants.retain(|name, _| tracked.contains_key(name));
        }
        quotas.above.retain(|name| tracked.contains_key(name));
        let mut out = Vec::new();
        for (name, g) in tracked.iter() {
            if out.len() == max {
                break;
            }
            if g.clients.is_empty() {
                continue;
            }
            let (mut demand, mut unthrottled) = (0.0, 0.0);
            for c in &g.clients {
                demand += f64::from(c.demand) + f64::from(c.unthrottled);
                unthrottled += f64::from(c.unthrottled);
            }
            let held = upstream.as_ref().and_then(|u| u.get(name).copied());
            // Kept: what the region's clients would ask for in the next two rounds.
            let unspent = quotas.unspent(name);
            let quota = quotas.above.held(name, g.meter.consumed, unspent, demand * 2.0 * ABOVE_KEEP_S);
            out.push(UpstreamUsage { group: name.clone(), demand, unthrottled, meter: g.meter, held, quota });
        }
        out
    }

    /// Whether a group among the first `max` with clients (those
    /// [`upstream_usage`](Self::upstream_usage) reports) holds no share from the tier above
    /// yet: the question a region asks every few milliseconds, answered without building the
    /// report.
    pub fn upstream_unheld(&self, max: usize) -> bool {
        let held = |name: &GroupName| self.upstream.as_ref().is_some_and(|u| u.contains_key(name));
        self.tracked.iter().filter(|(_, g)| !g.clients.is_empty()).take(max).any(|(name, _)| !held(name))
    }
}
