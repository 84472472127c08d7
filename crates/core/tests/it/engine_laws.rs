//! The engine's invariants, on random inputs: reservations honoured, limits never exceeded,
//! grants conserving the target, capacity conserved, equal clients treated equally.

use proptest::prelude::*;
use tollgate_model::engine::{ClientReport, Engine, EngineSettings, Health};
use tollgate_model::settings::{GroupName, GroupSettings, Priority};
use tollgate_model::time::Nanos;

const EPS: f64 = 1e-6;

#[derive(Debug, Clone)]
struct GroupCase {
    reserved: f64,
    limit: Option<f64>,
    level: u8,
    demands: Vec<f64>,
    /// The part of each demand that is unthrottled work.
    unthrottled: f64,
}

fn group_case() -> impl Strategy<Value = GroupCase> {
    (
        0.0..500.0f64,
        prop::option::of(0.0..3000.0f64),
        prop_oneof![Just(1u8), Just(8), Just(16)],
        prop::collection::vec(0.0..2000.0f64, 1..6),
        prop_oneof![Just(0.0), 0.0..1.0f64],
    )
        .prop_map(|(reserved, extra, level, demands, unthrottled)| GroupCase {
            reserved,
            limit: extra.map(|e| reserved + e),
            level,
            demands,
            unthrottled,
        })
}

struct World {
    engine: Engine,
    names: Vec<GroupName>,
}

fn world(capacity: Option<f64>, groups: &[GroupCase], saturation: Option<f64>) -> World {
    let mut settings = EngineSettings { capacity, ..Default::default() };
    settings.saturation.limiting_threshold = 1.0;
    settings.saturation.ignore_worst_zones = 0;
    let mut p = Engine::new(settings);
    let now = Nanos(1_000_000_000);
    let mut names = Vec::new();
    let mut client = 0u64;
    let mut loads = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let name = GroupName::new(&format!("g{i}")).unwrap();
        let mut b = GroupSettings::builder().reserved(g.reserved).priority(Priority::new(g.level).unwrap());
        if let Some(limit) = g.limit {
            b = b.limit(limit);
        }
        p.set_group(name.clone(), b.build().unwrap());
        for d in &g.demands {
            client += 1;
            let report = ClientReport {
                demand: *d,
                unthrottled: d * g.unthrottled,
                consumed: d / 2.0,
                requests: 1.0,
                ..Default::default()
            };
            p.report(now, client, &name, report);
        }
        loads.push((name.clone(), g.demands.iter().sum::<f64>() / 2.0));
        names.push(name);
    }
    if let Some(u) = saturation {
        p.backend_report(now, "b0", "z0", Health::Utilisation(u), &loads).unwrap();
    }
    p.tick(now);
    World { engine: p, names }
}

proptest! {
    #[test]
    fn grants_conserve_the_target_and_equal_clients_get_equal_grants(
        capacity in prop::option::of(100.0..5000.0f64),
        saturation in prop::option::of(0.5..2.0f64),
        groups in prop::collection::vec(group_case(), 1..5),
    ) {
        let w = world(capacity, &groups, saturation);
        for (name, g) in w.names.iter().zip(&groups) {
            let o = w.engine.outcome(name).unwrap();
            let Some(target) = o.target() else { continue };
            let granted: f64 = o.grants.iter().map(|g| g.rate).sum();
            prop_assert!(granted <= target * (1.0 + EPS) + EPS, "{name}: granted {granted} > target {target}");
            // Equal demand, equal grant.
            let rates: Vec<f64> = o.grants.iter().map(|g| g.rate).collect();
            for i in 0..g.demands.len() {
                for j in 0..g.demands.len() {
                    if g.demands[i] == g.demands[j] {
                        prop_assert!((rates[i] - rates[j]).abs() < EPS);
                    }
                }
            }
        }
    }

    #[test]
    fn reserved_is_honoured_and_the_limit_never_exceeded(
        capacity in prop::option::of(100.0..5000.0f64),
        saturation in prop::option::of(0.5..2.0f64),
        groups in prop::collection::vec(group_case(), 1..5),
    ) {
        let w = world(capacity, &groups, saturation);
        for (name, g) in w.names.iter().zip(&groups) {
            let o = w.engine.outcome(name).unwrap();
            match o.target() {
                Some(t) => {
                    prop_assert!(t >= g.reserved - EPS, "{name}: target {t} < reserved {}", g.reserved);
                    if let Some(limit) = g.limit {
                        prop_assert!(t <= limit + EPS, "{name}: target {t} > limit {limit}");
                    }
                    if let Some(l) = o.limiting() {
                        prop_assert!(t <= l.max(g.reserved) + EPS, "{name}: target {t} above limiting {l}");
                    }
                }
                // Not throttled only when nothing bounds it.
                None => prop_assert!(g.limit.is_none() && capacity.is_none() && o.limiting().is_none()),
            }
        }
    }

    #[test]
    fn capacity_is_conserved_when_every_group_asks_for_its_reservation(
        capacity in 100.0..5000.0f64,
        groups in prop::collection::vec(group_case(), 1..5),
    ) {
        // Every group demands at least its reservation: no reservation is lent out.
        let groups: Vec<GroupCase> = groups
            .into_iter()
            .map(|mut g| {
                g.demands[0] += g.reserved;
                g.unthrottled = 0.0;
                g
            })
            .collect();
        let reserved: f64 = groups.iter().map(|g| g.reserved).sum();
        prop_assume!(reserved <= capacity);
        let w = world(Some(capacity), &groups, None);
        let total: f64 = w.names.iter().map(|n| w.engine.outcome(n).unwrap().target().unwrap()).sum();
        prop_assert!(total <= capacity * (1.0 + EPS), "targets {total} > capacity {capacity}");
    }
}
