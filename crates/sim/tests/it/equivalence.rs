//! `tollgate sim` predicts what a real server does: the same scenario through the simulator
//! (the controller called in process) and through the real server's `serve` with real remote
//! handles over a simulated network (turmoil, in simulated time) gives the same targets within
//! 1 % once they settle: each group's mean target over the settled seconds within 1 %, and
//! every second within 2 % (on the network the server's ticks and the backends' reports are not
//! in lockstep, so a saturation loop's small corrections can land a tick apart).

use std::path::PathBuf;
use std::time::Duration;

use tollgate_controller::store::MemoryStore;
use tollgate_limiter::Tollgate;
use tollgate_limiter::clock::TokioClock;
use tollgate_model::time::Clock;
use tollgate_proto::v1::backend_client::BackendClient;
use tollgate_sim::run::{client_options, engine_settings, group_names, stored};
use tollgate_sim::world::World;
use tollgate_sim::{Scenario, run};

fn load(name: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../../../scenarios/{name}.toml"));
    Scenario::parse(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Each group's target (units/s) at each whole second, over the network, for `secs` seconds.
fn over_the_network(scenario: &Scenario, secs: u64) -> Vec<Vec<Option<f64>>> {
    let scenario = scenario.clone();
    let out = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = out.clone();
    tollgate_testkit::net::run(
        engine_settings(&scenario),
        MemoryStore::with(stored(&scenario)),
        move |net| async move {
            let groups = group_names(&scenario);
            let gates: Vec<Tollgate> = (0..scenario.clients.len())
                .map(|i| {
                    Tollgate::remote_channel(
                        net.channel(),
                        client_options(&scenario, i).with_clock(TokioClock::new()),
                    )
                    .unwrap()
                })
                .collect();
            let mut world = World::new(&scenario, &groups, &gates, scenario.seed);
            let mut backend = BackendClient::new(net.channel());
            let clock = TokioClock::new();
            for second in 1..=secs {
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    world.step(clock.now(), 0.01);
                }
                for report in world.backend_reports(clock.now()) {
                    backend.report(report).await.unwrap();
                }
                let targets = net.controller().with_engine(|e| {
                    groups.iter().map(|g| e.outcome(g).and_then(|o| o.target())).collect::<Vec<_>>()
                });
                sink.borrow_mut().push(targets);
                let _ = second;
            }
        },
    );
    out.take()
}

fn compare(name: &str, settle_s: usize, secs: u64) {
    let mut scenario = load(name);
    // One phase, run to the end: the timelines are compared second by second.
    scenario.phases.truncate(1);
    scenario.phases[0].hold_checks = u32::MAX;
    scenario.phases[0].timeout = Duration::from_secs(secs);
    let simulated = run(&scenario, scenario.seed);
    let networked = over_the_network(&scenario, secs);
    let groups = simulated.groups.len();
    let (mut sums_sim, mut sums_real, mut compared) = (vec![0.0; groups], vec![0.0; groups], 0);
    for (t, real) in networked.iter().enumerate().skip(settle_s) {
        let Some(sample) = simulated.timeline.get(t) else { break };
        for (g, target) in real.iter().enumerate() {
            let predicted = sample.groups[g].target_units;
            match (predicted, target) {
                (Some(p), Some(r)) => {
                    assert!(
                        (p - r).abs() <= 0.02 * r.abs(),
                        "{name} t={}: group {g}: sim {p}, server {r}",
                        t + 1
                    );
                    sums_sim[g] += p;
                    sums_real[g] += r;
                    compared += 1;
                }
                (None, None) => {}
                other => {
                    panic!("{name} t={}: group {g}: sim and server disagree on throttling: {other:?}", t + 1)
                }
            }
        }
    }
    assert!(
        compared > 0,
        "{name}: nothing compared ({} and {} seconds)",
        networked.len(),
        simulated.timeline.len()
    );
    for g in 0..groups {
        let (p, r) = (sums_sim[g], sums_real[g]);
        assert!(
            (p - r).abs() <= 0.01 * r.abs(),
            "{name}: group {g}: mean target sim {p} vs server {r} (sums)"
        );
    }
    println!("{name}: {compared} targets compared: means within 1 %, every second within 2 %");
}

#[test]
fn capacity_sharing_matches_the_server() {
    compare("couchbase-fairness", 15, 40);
}

#[test]
fn saturation_limiting_matches_the_server() {
    compare("fdb-active-throttling", 40, 80);
}
