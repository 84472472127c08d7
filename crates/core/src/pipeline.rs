//! The controller's rate pipeline: from demand and backend health to targets and grants.
//!
//! A pure state machine (DESIGN section 3). Clients report per group what they asked for
//! (units/s, admitted or not), what they consumed and how many requests they ran; backends
//! report their health (queue bytes or utilisation) and the load each group puts on them.
//! Each [`Pipeline::tick`] then computes, per group:
//!
//! ```text
//! cap       = min(limit, ramp pool)                      (the ramp, when the group has one)
//! limiting  = load_g × ratio                             (absent below saturation)
//! share     = allocation of the node capacity            (absent without a capacity)
//! target    = max(reserved, min(cap, limiting, share));  busy = limiting < cap
//! ```
//!
//! and splits the target over the group's clients by water level.
//!
//! **Saturation.** A backend's throttling ratio is FoundationDB's
//! `1 / min(2, (q − target + spring) / spring)` for queue bytes `q`, absent when the
//! denominator is at most 0. A group counts only on backends where it puts at least
//! `limiting_threshold` units/s; per zone the smallest ratio counts; the
//! `ignore_worst_zones` worst zones are ignored.
//!
//! **Growth cap.** Below saturation's target (`u < 1`) the ratio used is at most `1/u`, the
//! backend's proportional headroom, so a limit can grow by at most that much per tick.
//!
//! **The control law.** `load_g` is the group's load *as the backends report it*, the same
//! measurement (with the same lag) that produced their queues, not the rate the clients
//! admit now. A queue says "this much load was too much": scaling that load by the ratio
//! aims at the load the backend can sustain. Scaling the current rate instead mixes a lagged
//! queue with a fresh rate, and with the ratio's slope of −3 around equilibrium that
//! oscillates. With the consistent snapshot the limit is applied at once, with no further
//! smoothing. For a backend that smooths its load over `τ` and a tick of `Δt`, the error
//! shrinks by a factor of about `1 − 4(1 − e^(−Δt/τ))` per tick (0.62 for 1 s and 10 s),
//! from one side. `docs/control.md` works through it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::allocate::{Claim, allocate};
use crate::ramp::Ramp;
use crate::settings::{DEFAULT_GROUP, GroupName, GroupSettings, Limit};
use crate::smooth::Smoother;
use crate::time::Nanos;

/// Tunables of the pipeline; the defaults are FoundationDB's where it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSettings {
    /// Queue bytes at which a backend is at its target (ratio 1).
    pub queue_target_bytes: f64,
    /// Queue bytes over which the ratio falls from 1 to 0.5.
    pub queue_spring_bytes: f64,
    /// A group counts on a backend only if it puts at least this many units/s there.
    pub limiting_threshold: f64,
    /// How many of the worst zones are ignored when limiting.
    pub ignore_worst_zones: usize,
    /// The node's capacity in units/s, if it is shared by allocation.
    pub capacity: Option<f64>,
    /// How the free pool of the capacity is shared.
    pub free_pool: FreePoolMode,
    /// Groups with no client report for this long are forgotten.
    pub group_idle_expiry: Duration,
    /// Groups tracked separately; past it, new groups share the default group's state.
    pub max_tracked_groups: usize,
    /// How long a grant is good for without renewal.
    pub lease: Duration,
    /// Reports older than this are ignored (a client or backend that went away).
    pub report_expiry: Duration,
    /// Folding time of the average-cost smoothers.
    pub cost_folding: Duration,
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            queue_target_bytes: 800e6,
            queue_spring_bytes: 200e6,
            limiting_threshold: 409_600.0,
            ignore_worst_zones: 1,
            capacity: None,
            free_pool: FreePoolMode::Fair,
            group_idle_expiry: Duration::from_secs(240),
            max_tracked_groups: 100_000,
            lease: Duration::from_secs(10),
            report_expiry: Duration::from_secs(10),
            cost_folding: Duration::from_secs(2),
        }
    }
}

/// How the free pool is shared among groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FreePoolMode {
    /// By priority, then max-min by weight ([`allocate`]).
    #[default]
    Fair,
    /// First come, first served: groups in the order they first asked, each up to its demand.
    Fcfs,
}

/// What one client says about one group at an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClientReport {
    /// Units/s asked for, admitted or not, including waiting and refused work.
    pub demand: f64,
    /// Units consumed since the last report.
    pub consumed: f64,
    /// Requests run since the last report.
    pub requests: f64,
}

/// A backend's health.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Health {
    /// Bytes queued (FoundationDB's storage queue).
    QueueBytes(f64),
    /// Utilisation, 1 meaning at its target; turned into queue bytes at the target.
    Utilisation(f64),
}

/// A client's grant for one group: a rate, a burst and a lease (a duration, never a deadline).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// Units/s (infinite when the group is not throttled).
    pub rate: f64,
    /// Units that may be banked.
    pub burst: f64,
    /// How long the grant holds without renewal.
    pub lease: Duration,
}

/// Opaque client identity (the transport assigns it).
pub type ClientId = u64;

/// Each client's grant for a group, sorted by client: a vector rather than a tree, because
/// most groups have a handful of clients and a tree's smallest node holds eleven.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grants(Vec<(ClientId, Grant)>);

impl Grants {
    /// The grant of `client`.
    pub fn get(&self, client: &ClientId) -> Option<&Grant> {
        self.0.binary_search_by_key(client, |(c, _)| *c).ok().map(|i| &self.0[i].1)
    }

    /// Whether `client` has a grant.
    pub fn contains_key(&self, client: &ClientId) -> bool {
        self.get(client).is_some()
    }

    /// How many clients have a grant.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no client has a grant.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The grants, by client.
    pub fn iter(&self) -> impl Iterator<Item = (&ClientId, &Grant)> {
        self.0.iter().map(|(c, g)| (c, g))
    }

    /// The grants alone.
    pub fn values(&self) -> impl Iterator<Item = &Grant> {
        self.0.iter().map(|(_, g)| g)
    }
}

impl FromIterator<(ClientId, Grant)> for Grants {
    fn from_iter<I: IntoIterator<Item = (ClientId, Grant)>>(iter: I) -> Self {
        let mut v: Vec<(ClientId, Grant)> = iter.into_iter().collect();
        v.sort_by_key(|(c, _)| *c);
        Grants(v)
    }
}

impl std::ops::Index<&ClientId> for Grants {
    type Output = Grant;
    fn index(&self, client: &ClientId) -> &Grant {
        self.get(client).expect("no grant for that client")
    }
}

/// What a tick decided for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupOutcome {
    /// Target in units/s; `None` when the group is not throttled.
    pub target: Option<f64>,
    /// Limiting rate from saturation, if any backend it uses is saturated.
    pub limiting: Option<f64>,
    /// Share of the node capacity, if one is set.
    pub share: Option<f64>,
    /// Limiting is below the cap.
    pub busy: bool,
    /// The water level in units/s: what each busy client may use.
    pub water_level: Option<f64>,
    /// Average cost per request, units.
    pub avg_cost: f64,
    /// Total demand, units/s.
    pub demand: f64,
    /// Load reported by backends, units/s.
    pub load: f64,
    /// Each client's grant.
    pub grants: Grants,
}

struct ClientState {
    demand: f64,
    seen: Nanos,
}

struct GroupState {
    /// Sorted by client id.
    clients: Vec<(ClientId, ClientState)>,
    /// The ramp, when the group's settings have one (boxed: most groups have none, and the
    /// state of every tracked group should stay small).
    ramp: Option<Box<Ramp>>,
    units: Smoother,
    requests: Smoother,
    last_report: Nanos,
    first_seen: Nanos,
    outcome: Option<GroupOutcome>,
}

impl GroupState {
    fn new(now: Nanos, folding_s: f64) -> Self {
        Self {
            clients: Vec::new(),
            ramp: None,
            units: Smoother::new(folding_s),
            requests: Smoother::new(folding_s),
            last_report: now,
            first_seen: now,
            outcome: None,
        }
    }
}

/// One group's load across backends, gathered once per tick.
#[derive(Default)]
struct GroupLoad<'a> {
    load: f64,
    /// (zone, smallest ratio in it) for the saturated backends the group counts on.
    zones: Vec<(&'a str, f64)>,
}

struct BackendState {
    zone: String,
    health: Health,
    load: HashMap<GroupName, f64>,
    seen: Nanos,
}

/// The pipeline. See the [module documentation](self).
pub struct Pipeline {
    settings: PipelineSettings,
    groups_configured: HashMap<GroupName, GroupSettings>,
    /// A hash map packs tighter than a tree, and its fixed-key hasher keeps iteration order
    /// the same from run to run (simulations replay from their seed).
    groups: HashMap<GroupName, GroupState, FixedHasher>,
    backends: BTreeMap<String, BackendState>,
    /// How many configured groups have a ramp.
    ramped_groups: usize,
}

/// SipHash with fixed keys: deterministic iteration, and group names are not attacker-chosen
/// keys here (tracked groups are bounded).
type FixedHasher = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;

impl Pipeline {
    /// An empty pipeline.
    pub fn new(settings: PipelineSettings) -> Self {
        Self {
            settings,
            groups_configured: HashMap::new(),
            groups: HashMap::default(),
            backends: BTreeMap::new(),
            ramped_groups: 0,
        }
    }

    /// The tunables.
    pub fn settings(&self) -> &PipelineSettings {
        &self.settings
    }

    /// Sets (or replaces) a group's settings.
    pub fn set_group(&mut self, name: GroupName, settings: GroupSettings) {
        let ramped = settings.ramp().is_some();
        let before = self.groups_configured.insert(name, settings);
        self.count_ramp(before.as_ref(), ramped);
    }

    /// Removes a group's settings: it falls back to the default group's, or is not throttled.
    pub fn remove_group(&mut self, name: &GroupName) {
        let before = self.groups_configured.remove(name);
        self.count_ramp(before.as_ref(), false);
    }

    /// Keeps `ramped_groups` right as one group's settings go from `before` to ramped or not.
    fn count_ramp(&mut self, before: Option<&GroupSettings>, ramped: bool) {
        if before.is_some_and(|b| b.ramp().is_some()) {
            self.ramped_groups -= 1;
        }
        if ramped {
            self.ramped_groups += 1;
        }
    }

    /// Sets the node capacity.
    pub fn set_capacity(&mut self, capacity: Option<f64>) {
        self.settings.capacity = capacity;
    }

    fn settings_for(&self, name: &GroupName) -> Option<&GroupSettings> {
        self.groups_configured.get(name).or_else(|| self.groups_configured.get(DEFAULT_GROUP))
    }

    /// The state a report for `group` lands in: its own, or the default group's once
    /// `max_tracked_groups` are tracked.
    fn state_key(&self, group: &GroupName) -> GroupName {
        if self.groups.contains_key(group) || self.groups.len() < self.settings.max_tracked_groups {
            group.clone()
        } else {
            GroupName::default_group()
        }
    }

    /// A client's report for one group.
    pub fn client_report(&mut self, now: Nanos, client: ClientId, group: &GroupName, report: ClientReport) {
        let key = self.state_key(group);
        // Most deployments have no ramps: skip the look-up then.
        let ramp_settings = if self.ramped_groups > 0 {
            self.settings_for(&key).and_then(|s| s.ramp().copied())
        } else {
            None
        };
        let folding = self.settings.cost_folding.as_secs_f64();
        let g = self.groups.entry(key).or_insert_with(|| GroupState::new(now, folding));
        // The ramp follows the settings: a changed ramp continues from where the old one was.
        match (&mut g.ramp, ramp_settings) {
            (Some(r), Some(s)) if *r.settings() == s => {}
            (current, Some(s)) => {
                *current = Some(Box::new(Ramp::new(s, current.as_ref().map(|r| r.value()))))
            }
            (current, None) => *current = None,
        }
        if let Some(r) = &mut g.ramp
            && (report.requests > 0.0 || report.demand > 0.0)
        {
            // An epoch with a call: the ramp moves, and what was consumed counts as its use.
            r.at_epoch(now.0 / 1_000_000_000);
            r.use_units(report.consumed.max(0.0));
        }
        g.units.add_delta(now, report.consumed.max(0.0));
        g.requests.add_delta(now, report.requests.max(0.0));
        g.last_report = now;
        let state = ClientState { demand: report.demand.max(0.0), seen: now };
        match g.clients.binary_search_by_key(&client, |(c, _)| *c) {
            Ok(i) => g.clients[i].1 = state,
            Err(i) => {
                // Most groups have one or a few clients: grow one at a time.
                g.clients.reserve_exact(1);
                g.clients.insert(i, (client, state));
            }
        }
    }

    /// A backend's report: its zone, health, and the load each group puts on it (units/s).
    pub fn backend_report(
        &mut self,
        now: Nanos,
        backend: &str,
        zone: &str,
        health: Health,
        load: &[(GroupName, f64)],
    ) {
        let state = BackendState {
            zone: zone.to_string(),
            health,
            load: load.iter().map(|(g, l)| (g.clone(), *l)).collect(),
            seen: now,
        };
        self.backends.insert(backend.to_string(), state);
    }

    /// Forgets a backend (decommissioned).
    pub fn remove_backend(&mut self, backend: &str) {
        self.backends.remove(backend);
    }

    /// FoundationDB's throttling ratio for a queue of `q` bytes; `None` below saturation.
    pub fn throttling_ratio(&self, health: Health) -> Option<f64> {
        let (target, spring) = (self.settings.queue_target_bytes, self.settings.queue_spring_bytes);
        let q = match health {
            Health::QueueBytes(q) => q,
            Health::Utilisation(u) => u * target,
        };
        let inv = ((q - target + spring) / spring).min(2.0);
        (inv > 0.0).then(|| 1.0 / inv)
    }

    /// A backend's utilisation: queue bytes over the queue target.
    fn utilisation(&self, health: Health) -> f64 {
        match health {
            Health::QueueBytes(q) => q / self.settings.queue_target_bytes,
            Health::Utilisation(u) => u,
        }
    }

    /// Every group's load on the backends that reported recently, and the (zone, ratio) of
    /// each saturated backend it counts on: one pass over all reports per tick.
    fn loads_by_group(&self, now: Nanos) -> HashMap<&GroupName, GroupLoad<'_>> {
        let mut by_group: HashMap<&GroupName, GroupLoad<'_>> = HashMap::new();
        for b in self.backends.values() {
            if now.since(b.seen) > self.settings.report_expiry {
                continue;
            }
            // Growth is capped at the backend's proportional headroom, 1/u: FoundationDB's
            // ratio tends to infinity as u falls toward 0.75, which, with a few ticks of
            // exchange delay, makes the limit leap and the backend swing (docs/control.md).
            // Above u = 1 the FoundationDB ratio is the smaller one and decides alone.
            let ratio = self.throttling_ratio(b.health).map(|r| {
                let u = self.utilisation(b.health);
                if u > 0.0 { r.min(1.0 / u) } else { r }
            });
            for (group, &l) in &b.load {
                let entry = by_group.entry(group).or_default();
                entry.load += l;
                if let Some(r) = ratio
                    && l >= self.settings.limiting_threshold
                {
                    match entry.zones.iter_mut().find(|(z, _)| *z == b.zone.as_str()) {
                        Some((_, zr)) => *zr = zr.min(r),
                        None => entry.zones.push((b.zone.as_str(), r)),
                    }
                }
            }
        }
        by_group
    }

    /// The ratio limiting a group with these zones, after ignoring the worst ones.
    fn limiting_ratio(&self, zones: &[(&str, f64)]) -> Option<f64> {
        if zones.len() <= self.settings.ignore_worst_zones {
            return None;
        }
        let mut ratios: Vec<f64> = zones.iter().map(|(_, r)| *r).collect();
        ratios.sort_by(f64::total_cmp);
        Some(ratios[self.settings.ignore_worst_zones])
    }

    /// Computes every group's target and grants at `now`; forgets idle groups.
    pub fn tick(&mut self, now: Nanos) {
        let expiry = self.settings.group_idle_expiry;
        self.groups.retain(|_, g| now.since(g.last_report) < expiry);
        let report_expiry = self.settings.report_expiry;
        for g in self.groups.values_mut() {
            g.clients.retain(|(_, c)| now.since(c.seen) <= report_expiry);
        }

        /// What the tick needs of a group's settings (copied: no clone of the whole).
        struct Row {
            reserved: f64,
            limit: f64,
            priority: crate::settings::Priority,
            weight: f64,
            burst: Option<f64>,
            demand: f64,
            limiting: Option<f64>,
            load: f64,
            avg_cost: f64,
            first_seen: Nanos,
        }
        let loads = self.loads_by_group(now);
        // Rows are in the groups' iteration order, which stays the same until the groups
        // change; the last loop walks both together instead of looking each group up again.
        let mut rows = Vec::with_capacity(self.groups.len());
        for (name, g) in &self.groups {
            let units = g.units.estimate_rate(now);
            let requests = g.requests.estimate_rate(now);
            let settings = self.settings_for(name);
            let (load, limiting) = match loads.get(name) {
                Some(l) => (l.load, self.limiting_ratio(&l.zones).map(|r| l.load * r)),
                None => (0.0, None),
            };
            rows.push(Row {
                reserved: settings.map_or(0.0, GroupSettings::reserved),
                limit: settings.map_or(Limit::Unlimited, GroupSettings::limit).as_f64(),
                priority: settings.map_or(crate::settings::Priority::MEDIUM, GroupSettings::priority),
                weight: settings.map_or(1.0, GroupSettings::weight),
                burst: settings.and_then(GroupSettings::burst),
                demand: g.clients.iter().map(|(_, c)| c.demand).sum(),
                limiting,
                load,
                avg_cost: if requests > 1e-9 { units / requests } else { 1.0 },
                first_seen: g.first_seen,
            });
        }
        drop(loads);

        // Shares of the node capacity, among the throttled groups.
        let shares: Option<Vec<f64>> = self.settings.capacity.map(|capacity| {
            let claims: Vec<Claim> = rows
                .iter()
                .map(|r| Claim {
                    reserved: r.reserved,
                    ceiling: r.limit,
                    priority: r.priority,
                    weight: r.weight,
                    demand: r.demand,
                })
                .collect();
            match self.settings.free_pool {
                FreePoolMode::Fair => allocate(capacity, &claims),
                FreePoolMode::Fcfs => first_come_first_served(
                    capacity,
                    &claims,
                    &rows.iter().map(|r| r.first_seen).collect::<Vec<_>>(),
                ),
            }
        });

        let lease = self.settings.lease;
        let mut scratch: Vec<f64> = Vec::new();
        for (i, (row, g)) in rows.into_iter().zip(self.groups.values_mut()).enumerate() {
            let share = shares.as_ref().map(|s| s[i]);
            let cap = g.ramp.as_ref().map_or(row.limit, |r| row.limit.min(r.pool() as f64));
            let mut bound = cap;
            if let Some(l) = row.limiting {
                bound = bound.min(l);
            }
            if let Some(s) = share {
                bound = bound.min(s);
            }
            // Nothing bounds the group (no limit, no saturation, no capacity to share): it is
            // not throttled, whatever it reserves.
            let target = bound.is_finite().then(|| row.reserved.max(bound));
            let busy = row.limiting.is_some_and(|l| l < cap);
            // Reuse last tick's grant buffer.
            let mut grants = g.outcome.take().map(|o| o.grants.0).unwrap_or_default();
            grants.clear();
            // Exactly as many as there are clients: most groups have one or a few.
            grants.reserve_exact(g.clients.len());
            let water = match target {
                Some(t) => {
                    scratch.clear();
                    scratch.extend(g.clients.iter().map(|(_, c)| c.demand));
                    let level = water_level(t, &scratch);
                    split_into(&mut grants, t, level, &g.clients, row.burst, lease);
                    Some(level)
                }
                None => {
                    let open = Grant { rate: f64::INFINITY, burst: f64::INFINITY, lease };
                    grants.extend(g.clients.iter().map(|(id, _)| (*id, open)));
                    None
                }
            };
            g.outcome = Some(GroupOutcome {
                target,
                limiting: row.limiting,
                share,
                busy,
                water_level: water,
                avg_cost: row.avg_cost,
                demand: row.demand,
                load: row.load,
                grants: Grants(grants),
            });
        }
    }

    /// The last tick's outcome for `group`.
    pub fn outcome(&self, group: &GroupName) -> Option<&GroupOutcome> {
        self.groups.get(group).and_then(|g| g.outcome.as_ref())
    }

    /// Every tracked group's last outcome.
    pub fn outcomes(&self) -> impl Iterator<Item = (&GroupName, &GroupOutcome)> {
        self.groups.iter().filter_map(|(n, g)| g.outcome.as_ref().map(|o| (n, o)))
    }

    /// How many groups are tracked.
    pub fn tracked_groups(&self) -> usize {
        self.groups.len()
    }
}

/// The water level `L` with `Σ min(demand_i, L) = target`, or `target` when the demands add
/// up to less (FoundationDB's per-client rate at its fixed point).
pub fn water_level(target: f64, demands: &[f64]) -> f64 {
    let total: f64 = demands.iter().sum();
    if total <= target || demands.is_empty() {
        return target;
    }
    if demands.len() == 1 {
        return target;
    }
    let mut sorted = demands.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut left = target;
    for (i, d) in sorted.iter().enumerate() {
        let rest = (sorted.len() - i) as f64;
        if d * rest >= left {
            return left / rest;
        }
        left -= d;
    }
    left
}

/// Each client's grant, into `out` (sorted by client, as `clients` is): its demand up to the
/// water level; when demand is below the target, its demand plus an equal part of what is
/// left, so the grants add up to the target.
fn split_into(
    out: &mut Vec<(ClientId, Grant)>,
    target: f64,
    level: f64,
    clients: &[(ClientId, ClientState)],
    burst_total: Option<f64>,
    lease: Duration,
) {
    let total: f64 = clients.iter().map(|(_, c)| c.demand).sum();
    let spare =
        if total < target && !clients.is_empty() { (target - total) / clients.len() as f64 } else { 0.0 };
    out.extend(clients.iter().map(|(id, c)| {
        let rate = c.demand.min(level) + spare;
        let burst = match burst_total {
            Some(b) if target > 0.0 => b * rate / target,
            _ => rate,
        };
        (*id, Grant { rate, burst, lease })
    }));
}

/// Couchbase's free pool at the controller: reservations first (capped by demand), then the
/// rest in the order groups first asked, each up to its demand and ceiling.
fn first_come_first_served(capacity: f64, claims: &[Claim], first_seen: &[Nanos]) -> Vec<f64> {
    let mut out: Vec<f64> = claims.iter().map(|c| c.reserved.min(c.demand).min(c.ceiling)).collect();
    let mut pool = (capacity - out.iter().sum::<f64>()).max(0.0);
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by_key(|&i| first_seen[i]);
    for i in order {
        let want = (claims[i].demand.min(claims[i].ceiling) - out[i]).max(0.0);
        let give = want.min(pool);
        out[i] += give;
        pool -= give;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    #[test]
    fn water_level_matches_fdb_fixed_point() {
        assert_eq!(water_level(20.0, &[5.0, 25.0]), 15.0);
        assert_eq!(water_level(20.0, &[5.0, 5.0]), 20.0);
        assert_eq!(water_level(30.0, &[20.0, 20.0, 20.0]), 10.0);
        assert_eq!(water_level(25.0, &[1.0, 2.0, 100.0, 100.0]), 11.0);
    }

    #[test]
    fn ratio_follows_fdb_table() {
        let p = Pipeline::new(PipelineSettings::default());
        let r = |u: f64| p.throttling_ratio(Health::Utilisation(u));
        assert_eq!(r(0.75), None);
        assert!((r(0.8).unwrap() - 5.0).abs() < 1e-9);
        assert!((r(1.0).unwrap() - 1.0).abs() < 1e-9);
        assert!((r(1.2).unwrap() - 1.0 / 1.8).abs() < 1e-9);
        assert_eq!(r(3.0), Some(0.5));
        assert_eq!(p.throttling_ratio(Health::QueueBytes(900e6)), Some(1.0 / 1.5));
    }

    #[test]
    fn target_is_the_limit_without_saturation_and_grants_split_it() {
        let mut p = Pipeline::new(PipelineSettings::default());
        p.set_group(name("a"), GroupSettings::builder().limit(100.0).build().unwrap());
        let t = Nanos(1_000_000_000);
        p.client_report(t, 1, &name("a"), ClientReport { demand: 30.0, consumed: 30.0, requests: 3.0 });
        p.client_report(t, 2, &name("a"), ClientReport { demand: 500.0, consumed: 70.0, requests: 7.0 });
        p.tick(t);
        let o = p.outcome(&name("a")).unwrap();
        assert_eq!(o.target, Some(100.0));
        assert_eq!(o.water_level, Some(70.0));
        assert_eq!(o.grants[&1].rate, 30.0);
        assert_eq!(o.grants[&2].rate, 70.0);
        assert!((o.avg_cost - 10.0).abs() < 1e-9);
        assert!(!o.busy);
    }

    #[test]
    fn unconfigured_groups_are_not_throttled_unless_default_says_so() {
        let mut p = Pipeline::new(PipelineSettings::default());
        let t = Nanos(1);
        p.client_report(t, 1, &name("x"), ClientReport { demand: 5.0, consumed: 5.0, requests: 1.0 });
        p.tick(t);
        assert_eq!(p.outcome(&name("x")).unwrap().target, None);
        assert_eq!(p.outcome(&name("x")).unwrap().grants[&1].rate, f64::INFINITY);
        p.set_group(name("default"), GroupSettings::builder().limit(3.0).build().unwrap());
        p.tick(t);
        assert_eq!(p.outcome(&name("x")).unwrap().target, Some(3.0));
    }

    #[test]
    fn saturation_limits_by_the_reported_load_ignoring_the_worst_zone() {
        let settings = PipelineSettings { limiting_threshold: 1.0, ..Default::default() };
        let mut p = Pipeline::new(settings);
        p.set_group(name("g"), GroupSettings::builder().limit(1e9).build().unwrap());
        let t = Nanos(1_000_000_000);
        p.client_report(t, 1, &name("g"), ClientReport { demand: 1000.0, consumed: 1000.0, requests: 10.0 });
        // Three zones: z1 very sick (ignored), z2 at u=1.2, z3 healthy.
        for (b, zone, u) in [("b1", "z1", 3.0), ("b2", "z2", 1.2), ("b3", "z3", 0.5)] {
            p.backend_report(t, b, zone, Health::Utilisation(u), &[(name("g"), 300.0)]);
        }
        p.tick(t);
        let o = p.outcome(&name("g")).unwrap();
        let expected = 900.0 / 1.8; // load 900 × the second-worst ratio
        assert!((o.limiting.unwrap() - expected).abs() < 1e-9, "{o:?}");
        assert_eq!(o.target, Some(expected));
        assert!(o.busy);
    }

    #[test]
    fn the_cap_follows_the_ramp() {
        use crate::settings::{RampMode, RampSettings};
        let mut p = Pipeline::new(PipelineSettings::default());
        let ramp = RampSettings {
            mode: RampMode::Scheduled,
            ..RampSettings::new(10.0, 50.0, Duration::from_secs(4))
        };
        p.set_group(name("r"), GroupSettings::builder().limit(40.0).ramp(ramp).build().unwrap());
        let mut targets = Vec::new();
        for second in 0..6u64 {
            let t = Nanos(second * 1_000_000_000);
            p.client_report(t, 1, &name("r"), ClientReport { demand: 1000.0, consumed: 10.0, requests: 1.0 });
            p.tick(t);
            targets.push(p.outcome(&name("r")).unwrap().target.unwrap());
        }
        // 10, 20, 30, 40 (the limit below the ramp's 50), 40, 40.
        assert_eq!(targets, [10.0, 20.0, 30.0, 40.0, 40.0, 40.0]);
    }

    #[test]
    fn growth_below_saturation_is_capped_at_the_headroom() {
        let settings =
            PipelineSettings { limiting_threshold: 1.0, ignore_worst_zones: 0, ..Default::default() };
        let mut p = Pipeline::new(settings);
        p.set_group(name("g"), GroupSettings::builder().limit(1e9).build().unwrap());
        let t = Nanos(1_000_000_000);
        p.client_report(t, 1, &name("g"), ClientReport { demand: 1e6, consumed: 1.0, requests: 1.0 });
        // u = 0.76: FoundationDB's ratio would be 25; the headroom allows 1/0.76.
        p.backend_report(t, "b", "z", Health::Utilisation(0.76), &[(name("g"), 760.0)]);
        p.tick(t);
        assert!((p.outcome(&name("g")).unwrap().limiting.unwrap() - 1000.0).abs() < 1e-6);
        // Above 1 the ratio itself is smaller: unchanged (1.2 → 1/1.8).
        p.backend_report(t, "b", "z", Health::Utilisation(1.2), &[(name("g"), 1200.0)]);
        p.tick(t);
        assert!((p.outcome(&name("g")).unwrap().limiting.unwrap() - 1200.0 / 1.8).abs() < 1e-6);
    }

    #[test]
    fn a_backend_that_stops_reporting_stops_limiting() {
        let settings =
            PipelineSettings { limiting_threshold: 1.0, ignore_worst_zones: 0, ..Default::default() };
        let report_expiry = settings.report_expiry;
        let mut p = Pipeline::new(settings);
        p.set_group(name("g"), GroupSettings::builder().limit(1e9).build().unwrap());
        let t = Nanos(1_000_000_000);
        p.client_report(t, 1, &name("g"), ClientReport { demand: 1e6, consumed: 1.0, requests: 1.0 });
        p.backend_report(t, "b", "z", Health::Utilisation(1.5), &[(name("g"), 1000.0)]);
        p.tick(t);
        assert!(p.outcome(&name("g")).unwrap().busy);
        // Silent for longer than the report expiry: its last report no longer counts.
        let later = t.after(report_expiry + Duration::from_secs(1));
        p.client_report(later, 1, &name("g"), ClientReport { demand: 1e6, consumed: 1.0, requests: 1.0 });
        p.tick(later);
        let o = p.outcome(&name("g")).unwrap();
        assert!(!o.busy && o.limiting.is_none(), "{o:?}");
    }

    #[test]
    fn idle_groups_expire_and_tracking_is_bounded() {
        let settings = PipelineSettings { max_tracked_groups: 2, ..Default::default() };
        let mut p = Pipeline::new(settings);
        let r = ClientReport { demand: 1.0, consumed: 1.0, requests: 1.0 };
        p.client_report(Nanos(0), 1, &name("a"), r);
        p.client_report(Nanos(0), 1, &name("b"), r);
        p.client_report(Nanos(0), 1, &name("c"), r); // past the bound: the default group's state
        p.tick(Nanos(0));
        assert_eq!(p.tracked_groups(), 3, "a, b, and the default group's state");
        assert!(p.outcome(&name("c")).is_none());
        assert!(p.outcome(&name("default")).is_some());
        p.tick(Nanos(241_000_000_000));
        assert_eq!(p.tracked_groups(), 0);
    }
}
