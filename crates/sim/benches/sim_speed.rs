//! How fast the simulator runs: 600 simulated seconds, 10 backends, 10 clients.
//!
//! `cargo bench -p tollgate-sim --bench sim_speed`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_sim::{Scenario, run};

/// The expectation can never hold, so every run goes the full 600 s timeout.
const SCENARIO: &str = r#"
name = "speed"
cost_model = "fdb"
[controller]
ignore_worst_zones = 1
limiting_threshold = 4096
[[backend]]
name = "ss"
count = 10
capacity = 40960
[[group]]
name = "a"
limit = 409600
[[group]]
name = "b"
limit = 204800
[[client]]
group = "a"
count = 5
rate = 4.0
cost = { read_bytes = 24576 }
[[client]]
group = "b"
count = 5
rate = 4.0
cost = { write_bytes = 4096 }
[[phase]]
timeout_s = 600
hold_s = 10
[[phase.expect]]
group = "a"
metric = "target_rps"
value = -1
"#;

fn speed(c: &mut Criterion) {
    let scenario = Scenario::parse(SCENARIO).unwrap();
    let outcome = run(&scenario, 1);
    assert_eq!(outcome.timeline.len(), 600, "the run covers 600 simulated seconds");
    c.bench_function("sim/600s_10_backends_10_clients", |b| {
        b.iter(|| black_box(run(black_box(&scenario), 1)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5)).sample_size(20);
    targets = speed
}
criterion_main!(benches);
