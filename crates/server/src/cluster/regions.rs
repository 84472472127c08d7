//! A region's lease on the global tier, in itself: what to ask, what was granted, and what is
//! left of it when the global tier does not answer. No network and no clock of its own: the
//! regional leader (`upstream_lease.rs`, over gRPC) and the simulator (in virtual time) drive it
//! alike.
//!
//! A round reports every group the region's clients use, added up
//! ([`crate::controller::Ownership::upstream_usage`]), in pages of at most
//! [`EXCHANGE_GROUPS_MAX`](tollgate_proto::EXCHANGE_GROUPS_MAX) groups, each page one exchange
//! of the client `region/NAME`, numbered as a client numbers its exchanges. Each share granted
//! is the regional engine's ceiling for its group from then on. A share not renewed within its
//! lease decays towards the region's part of the group's reservation, halving the rest every
//! [`DECAY_HALF_LIFE`], as a client's safe mode decays a grant.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tollgate_model::engine::{Meter, UpstreamGrant, UpstreamUsage};
use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;

use crate::controller::Controller;

/// How long after a share's lease ran out it has decayed to half (above its floor).
pub const DECAY_HALF_LIFE: Duration = Duration::from_secs(5);

/// The most of its demand a region takes of a share (the global tier's newcomer grant may be
/// all that is left under a target).
pub const ASK_FACTOR: f64 = 2.0;

/// How soon a region asks again when the global tier answered during a tick.
pub const AFTER_TICK: Duration = Duration::from_millis(10);

/// How long a share's first clients may go without a demand measured before the share is held
/// to what they ask (until then it is taken whole, so that a group new to the region is served
/// at once): two periods of a client's exchanges at the default tick.
pub const FIRST_SHARE_GRACE: Duration = Duration::from_secs(2);

/// How often the regional leader looks for groups new to the region (which it leases at
/// once) without being told of one.
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How long after a failed round the next is tried, a new group's included.
pub const RETRY: Duration = Duration::from_secs(1);

/// A share the global tier granted the region for one group, as it was granted.
#[derive(Debug, Clone, Copy)]
struct Share {
    grant: UpstreamGrant,
    /// When the region was first granted a share of the group.
    since: Nanos,
    /// The region's part of the group's reservation: where a decaying share stops.
    floor: f64,
    lease: Duration,
}

/// One exchange of a round: the request, and the running totals it reports (taken as
/// reported once the global tier has answered it).
#[derive(Debug)]
pub struct Page {
    /// The exchange to send the global tier.
    pub request: v1::ExchangeRequest,
    /// Each group's running totals and the demand reported.
    meters: Vec<(GroupName, Meter, f64)>,
}

/// A region's lease on the global tier. See the [module documentation](self).
#[derive(Debug)]
pub struct RegionLease {
    client_id: String,
    sequence: u64,
    shares: HashMap<GroupName, Share>,
    /// The shortest lease of a limited share (`None`: to be found again, the shares moved):
    /// before it runs out nothing decays, and [`decay`](Self::decay) looks at no share.
    shortest: Option<Duration>,
    /// Each group's running totals as last reported.
    reported: HashMap<GroupName, Meter>,
    /// When the last round was answered whole.
    answered_at: Option<Nanos>,
    /// When the next round is due.
    next_due: Nanos,
    /// No round before this, a new group's included (after a failure).
    not_before: Nanos,
    /// The period the global tier asked for at its last answer.
    period: Duration,
    /// How long after its last answer the global tier's next grants are made.
    next_tick: Duration,
}

impl RegionLease {
    /// Region `name`'s lease, nothing granted yet; its exchanges are the client `region/NAME`.
    pub fn new(name: &str) -> RegionLease {
        RegionLease {
            client_id: format!("region/{name}"),
            sequence: 0,
            shares: HashMap::new(),
            shortest: None,
            reported: HashMap::new(),
            answered_at: None,
            next_due: Nanos::ZERO,
            not_before: Nanos::ZERO,
            period: Duration::from_secs(1),
            next_tick: Duration::from_secs(1),
        }
    }

    /// The client id the global tier knows the region by.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Whether a round is due at `now`: its period is up, or a group the region's clients use
    /// has no share yet (leased at once, unless the last round failed within [`RETRY`]).
    /// `unheld` says whether such a group exists; it is asked only when the period is not up.
    pub fn is_due(&self, now: Nanos, unheld: impl FnOnce() -> bool) -> bool {
        now >= self.not_before && (now >= self.next_due || unheld())
    }

    /// The round's exchanges, one a page.
    pub fn pages(&mut self, usage: &[UpstreamUsage]) -> Vec<Page> {
        usage
            .chunks(tollgate_proto::EXCHANGE_GROUPS_MAX)
            .map(|page| {
                self.sequence += 1;
                Page {
                    request: v1::ExchangeRequest {
                        client_id: self.client_id.clone(),
                        sequence: self.sequence,
                        groups: page.iter().map(|u| self.usage(u)).collect(),
                        target_request_period_ms: 0,
                        shard_map_epoch: None,
                        // Groups with quotas are allotted from what the region holds.
                        takes_allotments: true,
                    },
                    meters: page.iter().map(|u| (u.group.clone(), u.meter, u.demand)).collect(),
                }
            })
            .collect()
    }

    /// Takes the global tier's answer to `page` at `now`: its shares are `controller`'s
    /// ceilings from now on, and what the page reported counts as reported.
    pub fn answered(
        &mut self,
        now: Nanos,
        page: Page,
        answer: &v1::ExchangeResponse,
        controller: &Controller,
    ) {
        let demand: HashMap<&str, f64> = page.meters.iter().map(|(n, _, d)| (n.as_str(), *d)).collect();
        let granted: Vec<(GroupName, Share)> = answer
            .grants
            .iter()
            .filter_map(|g| {
                let asked = demand.get(g.group.as_str()).copied().unwrap_or(0.0);
                let name = GroupName::new(&g.group).ok()?;
                let since = self.shares.get(&name).map_or(now, |s| s.since);
                // No demand measured yet for a share this young: its first clients are served
                // from what the global tier has left, as a client new to a controller is.
                let unmeasured = asked <= 0.0 && now < since.after(FIRST_SHARE_GRACE);
                Some((name, share_of(g, (!unmeasured).then_some(asked), since)))
            })
            .collect();
        self.reported.extend(page.meters.into_iter().map(|(n, m, _)| (n, m)));
        controller.ownership().set_upstream(granted.iter().map(|(n, s)| (n.clone(), s.grant)));
        self.shares.extend(granted);
        self.shortest = None;
        self.period = Duration::from_millis(u64::from(answer.next_exchange_ms.max(1)));
        self.next_tick = Duration::from_millis(u64::from(answer.next_tick_ms));
    }

    /// Ends a round every page of which was answered at `now`: shares of groups no longer used
    /// are forgotten, and the next round is due once the global tier's next grants are made
    /// (as a client comes back after the tick), or after the period asked for if that is
    /// sooner: a share the global tier lowers reaches the region's clients without waiting a
    /// period more than a client's grant would.
    pub fn round_answered(&mut self, now: Nanos, usage: &[UpstreamUsage]) {
        // By a set of the names: a region holds tens of thousands of groups.
        let used: HashSet<&GroupName> = usage.iter().map(|u| &u.group).collect();
        self.shares.retain(|name, _| used.contains(name));
        self.shortest = None;
        self.reported.retain(|name, _| used.contains(name));
        self.answered_at = Some(now);
        // While a tick is under way the answer says 0: shortly, for that tick's grants.
        let wait = if self.next_tick.is_zero() { AFTER_TICK } else { self.next_tick };
        self.next_due = now.after(wait.min(self.period));
        self.not_before = now;
    }

    /// Ends a round the global tier did not answer (whole): the next in [`RETRY`].
    pub fn round_failed(&mut self, now: Nanos) {
        self.next_due = now.after(RETRY);
        self.not_before = self.next_due;
    }

    /// Past a share's lease without an answer, sets its decayed value as `controller`'s
    /// ceiling; says whether any share is decaying (the region's safe mode).
    pub fn decay(&mut self, now: Nanos, controller: &Controller) -> bool {
        let Some(at) = self.answered_at else { return false };
        let elapsed = now.since(at);
        let shortest = *self.shortest.get_or_insert_with(|| {
            let limited = self.shares.values().filter(|s| s.grant.rate.is_finite());
            limited.map(|s| s.lease).min().unwrap_or(Duration::MAX)
        });
        if elapsed < shortest {
            return false;
        }
        let mut decayed = Vec::new();
        for (name, s) in &self.shares {
            if elapsed < s.lease || !s.grant.rate.is_finite() {
                continue;
            }
            let keep = 0.5f64.powf((elapsed - s.lease).as_secs_f64() / DECAY_HALF_LIFE.as_secs_f64());
            let rate = s.floor + (s.grant.rate - s.floor).max(0.0) * keep;
            decayed.push((
                name.clone(),
                UpstreamGrant { rate, burst: rate.max(s.floor), reserved: s.floor, quota: None },
            ));
        }
        let decaying = !decayed.is_empty();
        if decaying {
            controller.ownership().set_upstream(decayed);
        }
        decaying
    }

    /// One group's usage as the global tier is told it: demand now, and what was consumed,
    /// admitted, refused and made to wait since the last report.
    fn usage(&self, u: &UpstreamUsage) -> v1::GroupUsage {
        let before = self.reported.get(&u.group).copied().unwrap_or_default();
        let since = |now: u64, then: u64| now.saturating_sub(then);
        v1::GroupUsage {
            group: u.group.to_string(),
            demand: u.demand,
            consumed: (u.meter.consumed - before.consumed).max(0.0),
            admitted: since(u.meter.admitted, before.admitted),
            throttled: since(u.meter.throttled, before.throttled),
            waited: since(u.meter.waited, before.waited),
            unthrottled: u.unthrottled,
            held: u.held.map_or(0.0, |h| if h.rate.is_finite() { h.rate } else { 0.0 }),
            quota: u.quota.map(|q| v1::QuotaHeld {
                window: q.window,
                given: q.given,
                used: q.used,
                lasts_ms: 0,
            }),
            ..Default::default()
        }
    }
}

/// The share a grant from the global tier gives the region, which `asked` for it: no more than
/// [`ASK_FACTOR`] times what it asked (nor below its part of the reservation). A region that
/// asked for little is granted all that is left under a target by a global tier that does not
/// know it yet, and its clients would learn of the smaller share that follows a period later
/// than the other regions' clients learn of theirs. A share whose demand is not measured yet
/// (`asked` is `None`) is taken whole.
fn share_of(g: &v1::Grant, asked: Option<f64>, since: Nanos) -> Share {
    let floor = g.reserved / f64::from(g.clients.max(1));
    let quota = g.quota.as_ref().map(tollgate_proto::wire::allotment_in);
    let grant = if g.unlimited {
        UpstreamGrant { rate: f64::INFINITY, burst: f64::INFINITY, reserved: floor, quota }
    } else {
        let cap = asked.map_or(f64::INFINITY, |a| (a * ASK_FACTOR).max(floor));
        let rate = g.rate.min(cap);
        let burst = if g.rate > 0.0 { g.burst * rate / g.rate } else { 0.0 };
        UpstreamGrant { rate, burst, reserved: floor, quota }
    };
    // The region hands its clients no more than the global tier allotted it.
    debug_assert!(g.unlimited || (grant.rate <= g.rate && grant.burst <= g.burst * (1.0 + 1e-9) + 1e-9));
    Share { grant, since, floor, lease: Duration::from_millis(u64::from(g.lease_ms)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::engine::EngineSettings;
    use tollgate_model::settings::GroupSettings;

    fn regional() -> crate::node::Node {
        let store = Box::new(crate::store::MemoryStore::default());
        let node = crate::node::Node::open(store, EngineSettings::default(), Nanos(0), 0).unwrap();
        node.controller.ownership().set_regional();
        node.controller.admin().sync_group(
            GroupName::new("g").unwrap(),
            Some(GroupSettings::fixed(100.0).unwrap()),
            0,
        );
        node
    }

    fn answer(rate: f64, lease_ms: u32) -> v1::ExchangeResponse {
        let grant =
            v1::Grant { group: "g".into(), rate, burst: rate, lease_ms, clients: 1, ..Default::default() };
        v1::ExchangeResponse {
            grants: vec![grant],
            next_exchange_ms: 1000,
            next_tick_ms: 400,
            ..Default::default()
        }
    }

    #[test]
    fn a_region_takes_its_share_within_twice_its_ask_and_decays_it_past_the_lease() {
        let node = regional();
        let sec = |s: f64| Nanos((s * 1e9) as u64);
        let mut lease = RegionLease::new("east");
        assert_eq!(lease.client_id(), "region/east");
        // A client of the region asks 30 units/s of g.
        let ask = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![v1::GroupUsage { group: "g".into(), demand: 30.0, ..Default::default() }],
            ..Default::default()
        };
        node.controller.exchange(sec(0.0), &ask).unwrap();
        let usage = node.controller.ownership().upstream_usage();
        let unheld = || node.controller.ownership().upstream_unheld();
        assert!(lease.is_due(sec(0.0), unheld), "a group with no share yet is leased at once");
        let pages = lease.pages(&usage);
        assert_eq!(pages.len(), 1);
        assert_eq!((pages[0].request.sequence, pages[0].request.groups[0].demand), (1, 30.0));
        // Granted 100 by a global tier that knew nothing better: the region takes 60.
        for page in pages {
            lease.answered(sec(0.0), page, &answer(100.0, 2000), &node.controller);
        }
        lease.round_answered(sec(0.0), &usage);
        let held =
            |node: &crate::node::Node| node.controller.ownership().upstream_usage()[0].held.unwrap().rate;
        assert_eq!(held(&node), 60.0);
        // The next round comes once the global tier's next grants are made.
        assert!(!lease.is_due(sec(0.3), unheld));
        assert!(lease.is_due(sec(0.4), unheld));
        // Not answered: the share holds for its lease (2 s), then halves every 5 s.
        lease.round_failed(sec(0.4));
        assert!(!lease.is_due(sec(1.0), unheld), "no retry within a second");
        assert!(!lease.decay(sec(1.9), &node.controller));
        assert_eq!(held(&node), 60.0);
        assert!(lease.decay(sec(7.0), &node.controller));
        assert!((held(&node) - 30.0).abs() < 1e-9, "{}", held(&node));
    }
}

#[cfg(test)]
mod quota_tests {
    use super::*;
    use tollgate_model::engine::EngineSettings;
    use tollgate_model::settings::GroupSettings;

    /// One client's allotment as a remote client keeps it, and what it consumed since it last
    /// said.
    #[derive(Debug, Default)]
    struct Holder {
        window: u64,
        given: f64,
        used: f64,
        unreported: f64,
    }

    impl Holder {
        /// The client's exchange with its region's controller, asking 30 units/s.
        fn exchange(&mut self, region: &Controller, now: Nanos, client_id: String, sequence: u64) {
            let quota =
                v1::QuotaHeld { window: self.window, given: self.given, used: self.used, lasts_ms: 0 };
            let usage = v1::GroupUsage {
                group: "g".into(),
                demand: 30.0,
                consumed: std::mem::take(&mut self.unreported),
                quota: Some(quota),
                ..Default::default()
            };
            let req = v1::ExchangeRequest {
                client_id,
                sequence,
                groups: vec![usage],
                takes_allotments: true,
                ..Default::default()
            };
            let answer = region.exchange(now, &req).unwrap();
            if let Some(q) = answer.grants.first().and_then(|g| g.quota.as_ref()) {
                if q.window != self.window {
                    (self.window, self.given, self.used) = (q.window, 0.0, 0.0);
                }
                self.given += q.add;
            }
        }
    }

    const S: u64 = 1_000_000_000;

    fn budget() -> GroupSettings {
        GroupSettings::builder().limit(1000.0).budget(100.0).build().unwrap()
    }

    /// Two regions of two clients each, every client asking 30 units/s of a budget of 100 for
    /// a minute: each region's clients are allotted out of what the global tier allotted the
    /// region, so together they never admit more than 100, and they admit nearly all of it.
    #[test]
    fn regions_allot_their_clients_out_of_what_the_global_tier_allotted_them() {
        let g = GroupName::new("g").unwrap();
        let store = Box::new(crate::store::MemoryStore::default());
        let global = Controller::new(store, EngineSettings::default(), Nanos(0), 0).unwrap();
        global.admin().set_group(g.clone(), budget(), "test", 0).unwrap();
        let regions: Vec<crate::node::Node> = (0..2)
            .map(|_| {
                let store = Box::new(crate::store::MemoryStore::default());
                let node = crate::node::Node::open(store, EngineSettings::default(), Nanos(0), 0).unwrap();
                node.controller.ownership().set_regional();
                node.controller.admin().sync_group(g.clone(), Some(budget()), 0);
                node
            })
            .collect();
        let mut leases: Vec<RegionLease> = (0..2).map(|r| RegionLease::new(&format!("r{r}"))).collect();
        let mut clients: Vec<Holder> = (0..4).map(|_| Holder::default()).collect();
        let mut admitted = 0.0;
        for second in 0..60u64 {
            for tenth in 0..10u64 {
                let now = Nanos(second * S + tenth * S / 10);
                // Each client exchanges with its region every second, and admits what its
                // allotment holds, 3 units a tenth at most.
                for (i, c) in clients.iter_mut().enumerate() {
                    let region = &regions[i % 2].controller;
                    if tenth == (i as u64) * 2 {
                        c.exchange(region, now, format!("c{i}"), second + 1);
                    }
                    let take = (c.given - c.used).clamp(0.0, 3.0);
                    c.used += take;
                    c.unreported += take;
                    admitted += take;
                }
                for (lease, node) in leases.iter_mut().zip(&regions) {
                    if !lease.is_due(now, || node.controller.ownership().upstream_unheld()) {
                        continue;
                    }
                    let usage = node.controller.ownership().upstream_usage();
                    for page in lease.pages(&usage) {
                        let answer = global.exchange(now, &page.request).unwrap();
                        lease.answered(now, page, &answer, &node.controller);
                    }
                    lease.round_answered(now, &usage);
                }
                if tenth == 0 {
                    global.pacer().tick(now);
                    regions.iter().for_each(|r| r.controller.pacer().tick(now));
                }
                assert!(
                    admitted <= 100.0 + 1e-9,
                    "{admitted} admitted of a budget of 100 by {second}.{tenth} s"
                );
            }
        }
        assert!(admitted >= 90.0, "nearly all of the budget is admitted: {admitted}");
    }
}
