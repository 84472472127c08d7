//! What the engine shows beyond its groups: each backend's health and the groups loading it
//! most, and each client's grants and whether its lease has lapsed (a client that has not
//! exchanged within the lease runs on what it held and then on its safe-mode policy).
//!
//! A fleet may hold thousands of clients, so a view names at most `max` backends and `max`
//! clients (lapsed clients first, then the largest grants) and counts the rest: status pages
//! and metric labels stay bounded whatever the fleet's size.

use std::collections::HashMap;

use crate::settings::GroupName;
use crate::time::Nanos;

use super::Engine;

/// How many groups a backend's or a client's entry names, the largest first.
pub const TOP_GROUPS: usize = 5;

/// A backend as its last report showed it.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendView {
    /// Its name.
    pub name: String,
    /// Its zone.
    pub zone: String,
    /// Its utilisation: 1 is at its target (queue bytes over the queue target).
    pub utilisation: f64,
    /// Saturated: it limits the groups that count on it.
    pub limiting: bool,
    /// Seconds since its last report.
    pub seen_s: f64,
    /// Units/s of all groups on it.
    pub load: f64,
    /// The groups loading it most, units/s, largest first (at most [`TOP_GROUPS`]).
    pub top_groups: Vec<(GroupName, f64)>,
    /// Saturated, yet no group counts on it: every group's load there is under the limiting
    /// threshold. The largest load there, units/s (the knobs leave it inert).
    pub under_threshold: Option<f64>,
}

/// A client as the controller sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientView {
    /// The id it chose.
    pub name: String,
    /// Seconds since its last exchange.
    pub seen_s: f64,
    /// It has not exchanged within the lease: its grants have run out and, while it runs, its
    /// safe-mode policy applies.
    pub lapsed: bool,
    /// Groups the last tick granted it.
    pub groups: u32,
    /// Units/s of its finite grants.
    pub granted: f64,
    /// Of its groups, those not throttled (an unlimited grant).
    pub unlimited: u32,
    /// Its largest grants: (group, units/s, burst), largest first (at most [`TOP_GROUPS`]).
    pub top_grants: Vec<(GroupName, f64, f64)>,
}

/// Backends and clients, at most `max` of each named.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diagnostics {
    /// The backends named, the most utilised first.
    pub backends: Vec<BackendView>,
    /// Backends tracked in all.
    pub backends_total: usize,
    /// The clients named: lapsed ones first, then the largest grants.
    pub clients: Vec<ClientView>,
    /// Clients tracked in all.
    pub clients_total: usize,
    /// Clients whose lease has lapsed, in all.
    pub clients_lapsed: usize,
    /// Units/s granted to the clients not named.
    pub others_granted: f64,
}

/// Keeps the `n` largest of `(key, weight)` pairs, largest first.
fn keep_top<T>(top: &mut Vec<T>, item: T, n: usize, weight: impl Fn(&T) -> f64) {
    let w = weight(&item);
    if top.len() == n && top.last().is_some_and(|last| weight(last) >= w) {
        return;
    }
    let at = top.partition_point(|t| weight(t) >= w);
    top.insert(at, item);
    top.truncate(n);
}

impl Engine {
    /// Backends and clients as of `now`, at most `max` of each named. Linear in backends,
    /// clients, and (client, group) grants.
    pub fn diagnostics(&self, now: Nanos, max: usize) -> Diagnostics {
        let mut backends: Vec<BackendView> =
            self.backends.iter().map(|(name, b)| self.backend_view(now, name, b)).collect();
        let backends_total = backends.len();
        backends.sort_by(|a, b| b.utilisation.total_cmp(&a.utilisation).then_with(|| a.name.cmp(&b.name)));
        backends.truncate(max);

        let mut clients = self.client_views(now);
        let clients_total = clients.len();
        let clients_lapsed = clients.iter().filter(|c| c.lapsed).count();
        clients.sort_by(|a, b| {
            b.lapsed
                .cmp(&a.lapsed)
                .then_with(|| b.granted.total_cmp(&a.granted))
                .then_with(|| a.name.cmp(&b.name))
        });
        let others_granted = clients.iter().skip(max).map(|c| c.granted).sum();
        clients.truncate(max);
        Diagnostics { backends, backends_total, clients, clients_total, clients_lapsed, others_granted }
    }

    /// One backend as of `now`: its load, its largest groups, and whether it limits them.
    fn backend_view(&self, now: Nanos, name: &str, b: &crate::engine::BackendState) -> BackendView {
        let mut top = Vec::with_capacity(TOP_GROUPS + 1);
        for (g, l) in b.load.iter() {
            keep_top(&mut top, (g.clone(), *l), TOP_GROUPS, |t| t.1);
        }
        let sat = &self.settings.saturation;
        let limiting = sat.throttling_ratio(b.health).is_some();
        let largest = top.first().map_or(0.0, |t| t.1);
        let under_threshold =
            (limiting && largest > 0.0 && largest < sat.limiting_threshold).then_some(largest);
        BackendView {
            name: name.to_owned(),
            zone: b.zone.clone(),
            utilisation: sat.utilisation(b.health),
            limiting,
            seen_s: now.since(b.seen).as_secs_f64(),
            load: b.load.iter().map(|(_, l)| l).sum(),
            top_groups: top,
            under_threshold,
        }
    }

    /// Every client as of `now`, with what it is granted summed over its groups.
    fn client_views(&self, now: Nanos) -> Vec<ClientView> {
        let lease = self.settings.lease;
        let mut clients: Vec<ClientView> = Vec::with_capacity(self.clients.len());
        let mut by_id = HashMap::with_capacity(self.clients.len());
        for (name, id, seen) in self.clients.entries() {
            by_id.insert(id, clients.len());
            clients.push(ClientView {
                name: name.to_string(),
                seen_s: now.since(seen).as_secs_f64(),
                lapsed: now.since(seen) > lease,
                groups: 0,
                granted: 0.0,
                unlimited: 0,
                top_grants: Vec::new(),
            });
        }
        for (group, t) in &self.tracked {
            let Some(o) = &t.outcome else { continue };
            for g in &o.grants {
                let Some(&i) = by_id.get(&g.client) else { continue };
                let c = &mut clients[i];
                c.groups += 1;
                if g.rate.is_finite() {
                    c.granted += g.rate;
                    keep_top(&mut c.top_grants, (group.clone(), g.rate, g.burst), TOP_GROUPS, |t| t.1);
                } else {
                    c.unlimited += 1;
                }
            }
        }
        clients
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::{ClientReport, EngineSettings, Health};
    use crate::settings::GroupSettings;

    fn name(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    #[test]
    fn backends_and_clients_are_shown_bounded_with_lapsed_clients_first() {
        let mut e =
            Engine::new(EngineSettings { lease: Duration::from_secs(5), ..EngineSettings::default() });
        let limited = GroupSettings::builder().limit(100.0).build().unwrap();
        e.set_group(name("a"), limited.clone());
        e.set_group(name("b"), limited);
        let t0 = Nanos(1_000_000_000);
        let report = |demand: f64| ClientReport { demand, ..ClientReport::default() };
        for (i, c) in ["one", "two", "three"].iter().enumerate() {
            let id = e.client(t0, c, 1).unwrap();
            e.report(t0, id, &name("a"), report(10.0 * (i + 1) as f64));
            if i == 0 {
                e.report(t0, id, &name("b"), report(50.0));
            }
        }
        let loads = [(name("a"), 30.0), (name("b"), 70.0), (name("c"), 5.0)];
        e.backend_report(t0, "hot", "z1", Health::Utilisation(1.5), &loads).unwrap();
        e.backend_report(t0, "cool", "z2", Health::Utilisation(0.2), &[]).unwrap();
        e.tick(t0.after(Duration::from_secs(1)));
        // "two" keeps exchanging; the others go quiet past the lease.
        let later = t0.after(Duration::from_secs(7));
        let two = e.client(later, "two", 2).unwrap();
        e.report(later, two, &name("a"), report(20.0));

        let d = e.diagnostics(later, 2);
        assert_eq!((d.backends_total, d.clients_total, d.clients_lapsed), (2, 3, 2));
        assert_eq!(d.backends.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["hot", "cool"]);
        let hot = &d.backends[0];
        assert!(hot.limiting && hot.load == 105.0 && hot.seen_s == 7.0, "{hot:?}");
        assert_eq!(hot.top_groups.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["b", "a", "c"]);
        assert!(!d.backends[1].limiting);
        // Two named, both lapsed ("one" holds the most), "two" counted among the others.
        assert_eq!(d.clients.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["one", "three"]);
        let one = &d.clients[0];
        assert!(one.lapsed && one.groups == 2 && one.unlimited == 0, "{one:?}");
        assert_eq!(one.top_grants[0].0.as_str(), "b");
        let granted: f64 = one.top_grants.iter().map(|g| g.1).sum();
        assert!((one.granted - granted).abs() < 1e-9);
        assert!(d.others_granted > 0.0);
        // At most one named of each.
        let d = e.diagnostics(later, 1);
        assert_eq!((d.backends.len(), d.clients.len()), (1, 1));
    }

    #[test]
    fn keep_top_keeps_the_largest_in_order() {
        let mut top = Vec::new();
        for w in [3.0, 1.0, 4.0, 1.5, 9.0, 2.0] {
            keep_top(&mut top, w, 3, |w| *w);
        }
        assert_eq!(top, [9.0, 4.0, 3.0]);
    }
}
