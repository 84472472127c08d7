//! The storage side in virtual time: dmClock's cross-backend term against per-backend fair
//! queueing.

use std::time::Duration;

use tollgate_model::settings::GroupName;
use tollgate_sim::storage::{StorageGroup, StorageOutcome, StorageSpec, run};

const BUSY: f64 = f64::INFINITY;

fn group(name: &str, rate: f64, offers: &[f64]) -> StorageGroup {
    StorageGroup { name: GroupName::new(name).unwrap(), rate, offers: offers.to_vec() }
}

/// Three backends of 100 units/s. `spread`, at `rate`, fans out unevenly (`offers` on the
/// three); each of the others, at 1,000 units/s, always has work waiting on one backend.
fn fan_out(rate: f64, offers: &[f64], cross: bool) -> StorageOutcome {
    run(&StorageSpec {
        capacities: vec![100.0; 3],
        groups: vec![
            group("spread", rate, offers),
            group("one", 1000.0, &[BUSY, 0.0, 0.0]),
            group("two", 1000.0, &[0.0, BUSY, 0.0]),
            group("three", 1000.0, &[0.0, 0.0, BUSY]),
        ],
        cross,
        warm_up: Duration::from_secs(10),
        measure: Duration::from_secs(30),
    })
}

fn within(got: f64, want: f64, share: f64) -> bool {
    (got - want).abs() <= want * share
}

/// Equal weights: each of the four groups' fair share of the 300 units/s is 75. Scheduled
/// backend by backend, the group spread over three backends takes a share of each (about
/// 130 units/s); with the cross-backend term it gets its 75 within 5 %, and the others theirs.
#[test]
fn a_group_spread_over_backends_gets_its_weight_over_all_of_them() {
    let alone = fan_out(1000.0, &[90.0, 60.0, 30.0], false);
    let spread_alone = alone.total(0);
    assert!(spread_alone > 120.0, "per backend: {:?}", alone.served);
    let cross = fan_out(1000.0, &[90.0, 60.0, 30.0], true);
    println!("per backend {:?}\nacross {:?}", alone.served, cross.served);
    assert!(within(cross.total(0), 75.0, 0.05), "across: {:?}", cross.served);
    for g in 1..4 {
        assert!(within(cross.total(g), 75.0, 0.05), "group {g}: {:?}", cross.served);
    }
    let used: f64 = (0..4).map(|g| cross.total(g)).sum();
    assert!(used > 0.99 * 300.0, "every backend stays busy: {used}");
}

/// Twice the rate, twice the weight: the spread group's fair share is 2/5 of 300 units/s,
/// 120. It offers up to 300 (150, 100 and 50 on the three backends).
#[test]
fn weights_hold_over_the_backends() {
    let alone = fan_out(2000.0, &[150.0, 100.0, 50.0], false);
    let cross = fan_out(2000.0, &[150.0, 100.0, 50.0], true);
    println!("per backend {:?}\nacross {:?}", alone.served, cross.served);
    assert!(!within(alone.total(0), 120.0, 0.05), "per backend: {:?}", alone.served);
    assert!(within(cross.total(0), 120.0, 0.05), "across: {:?}", cross.served);
}

/// A group on one backend only is charged nothing: two such groups share it by weight alone.
#[test]
fn groups_on_one_backend_are_not_charged() {
    let out = run(&StorageSpec {
        capacities: vec![100.0, 100.0],
        groups: vec![group("a", 1000.0, &[BUSY, 0.0]), group("b", 1000.0, &[BUSY, 0.0])],
        cross: true,
        warm_up: Duration::from_secs(5),
        measure: Duration::from_secs(10),
    });
    assert!(within(out.total(0), 50.0, 0.02) && within(out.total(1), 50.0, 0.02), "{:?}", out.served);
}
