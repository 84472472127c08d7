//! The storage side in virtual time: dmClock's cross-backend term against per-backend fair
//! queueing.

use std::time::Duration;

use tollgate_model::settings::GroupName;
use tollgate_sim::storage::{Split, StorageGroup, StorageOutcome, StorageSpec, run};

const BUSY: f64 = f64::INFINITY;

fn group(name: &str, rate: f64, offers: &[f64]) -> StorageGroup {
    StorageGroup {
        name: GroupName::new(name).unwrap(),
        rate,
        offers: offers.to_vec(),
        sizes: vec![1.0],
        limit: None,
    }
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
        split: Split::None,
        lend_idle: false,
        max_wait: None,
        warm_up: Duration::from_secs(10),
        measure: Duration::from_secs(30),
    })
}

fn within(got: f64, want: f64, share: f64) -> bool {
    (got - want).abs() <= want * share
}

/// Equal weights. `spread` always has work waiting on two backends and brings 10 units/s to
/// the third; `one`, `two` and `three` each always have work on theirs. Shared fairly over
/// the whole cluster (max-min), `spread`, `one` and `two` get 70 units/s each and `three` the
/// 90 left on its backend: on each of the first two, `spread` gets 30. Scheduled backend by
/// backend, `spread` takes half of each (110 units/s); with the cross-backend term it gets its
/// 70 within 5 %, and the others theirs.
#[test]
fn a_group_spread_over_backends_gets_its_weight_over_all_of_them() {
    let alone = fan_out(1000.0, &[BUSY, BUSY, 10.0], false);
    let cross = fan_out(1000.0, &[BUSY, BUSY, 10.0], true);
    println!("per backend {:?}\nacross {:?}", alone.served, cross.served);
    assert!(!within(alone.total(0), 70.0, 0.05), "per backend: {:?}", alone.served);
    for (g, fair) in [(0, 70.0), (1, 70.0), (2, 70.0), (3, 90.0)] {
        assert!(within(cross.total(g), fair, 0.05), "group {g}: {:?}", cross.served);
    }
    let used: f64 = (0..4).map(|g| cross.total(g)).sum();
    assert!(used > 0.99 * 300.0, "every backend stays busy: {used}");
}

/// Twice the rate, twice the weight: with work waiting for every group everywhere it can go,
/// `spread`'s fair share is 2/5 of the 300 units/s, 120.
#[test]
fn weights_hold_over_the_backends() {
    let alone = fan_out(2000.0, &[BUSY, BUSY, BUSY], false);
    let cross = fan_out(2000.0, &[BUSY, BUSY, BUSY], true);
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
        split: Split::None,
        lend_idle: false,
        max_wait: None,
        warm_up: Duration::from_secs(5),
        measure: Duration::from_secs(10),
    });
    assert!(within(out.total(0), 50.0, 0.02) && within(out.total(1), 50.0, 0.02), "{:?}", out.served);
}

/// Three backends of 200 units/s and one group whose data is skewed: it brings `offers` to
/// them, under a limit of 150 units/s split over them by `split`.
fn skewed(offers: &[f64], split: Split, lend_idle: bool) -> StorageOutcome {
    let mut g = group("skewed", 150.0, offers);
    g.limit = Some(150.0);
    run(&StorageSpec {
        capacities: vec![200.0; 3],
        groups: vec![g],
        cross: false,
        split,
        lend_idle,
        max_wait: None,
        warm_up: Duration::from_secs(10),
        measure: Duration::from_secs(30),
    })
}

/// A group whose data lives mostly on one backend (120, 20 and 10 units/s of its 150): split
/// evenly, 50 a backend, it gets 80. With the shares following where its load lands, or with
/// an idle backend lending it capacity past its share, it reaches its whole 150.
#[test]
fn a_skewed_group_reaches_its_limit_where_an_even_split_caps_it() {
    let even = skewed(&[120.0, 20.0, 10.0], Split::Even, false);
    let follow = skewed(&[120.0, 20.0, 10.0], Split::FollowLoad, false);
    let lent = skewed(&[120.0, 20.0, 10.0], Split::Even, true);
    println!(
        "even {:?}\nfollowing the load {:?}\neven, lending idle capacity {:?}",
        even.served, follow.served, lent.served
    );
    assert!(within(even.total(0), 80.0, 0.02), "even: {:?}", even.served);
    assert!(within(follow.total(0), 150.0, 0.02), "following the load: {:?}", follow.served);
    assert!(within(lent.total(0), 150.0, 0.02), "lending: {:?}", lent.served);
}

/// Lent capacity stays within the group's limit: asking 330 units/s (300 of them on one
/// backend) of a limit of 150, it gets 150 however the limit is split and whatever is idle.
#[test]
fn lending_idle_capacity_stays_within_the_groups_limit() {
    for (split, lend) in [(Split::Even, true), (Split::FollowLoad, true), (Split::FollowLoad, false)] {
        let out = skewed(&[300.0, 20.0, 10.0], split, lend);
        assert!(within(out.total(0), 150.0, 0.02), "{split:?}, lending {lend}: {:?}", out.served);
    }
}

/// One backend of 100 units/s: `reports` sends requests of 5, 5, 5 and 25 units, 60 units/s
/// against a limit of 40, refused past `max_wait`; `point` always has requests of one unit.
fn slow_requests(max_wait: Option<Duration>) -> StorageOutcome {
    let mut reports = group("reports", 1000.0, &[60.0]);
    reports.sizes = vec![5.0, 5.0, 5.0, 25.0];
    reports.limit = Some(40.0);
    run(&StorageSpec {
        capacities: vec![100.0],
        groups: vec![reports, group("point", 1000.0, &[BUSY])],
        cross: false,
        split: Split::Even,
        lend_idle: false,
        max_wait,
        warm_up: Duration::from_secs(10),
        measure: Duration::from_secs(30),
    })
}

/// The marks the controller would show: each group's largest request over the last minute
/// and hour, the low, average and high of its units/s, and what it had refused. `reports`
/// is held to its 40 units/s and refused past a second's wait; allowed to wait for ever, it
/// is refused nothing and still gets its 40.
#[test]
fn the_marks_show_the_largest_request_the_rates_and_the_refusals() {
    let out = slow_requests(Some(Duration::from_secs(1)));
    println!("{:?}\n{:#?}", out.served, out.marks);
    let (reports, point) = (&out.marks[0], &out.marks[1]);
    assert_eq!((reports.largest, point.largest), ((25.0, 25.0), (1.0, 1.0)));
    assert!(within(out.total(0), 40.0, 0.05) && within(out.total(1), 60.0, 0.05), "{:?}", out.served);
    let minute = reports.rate.0.expect("a minute of samples");
    assert!(within(minute.average, 40.0, 0.05), "{minute:?}");
    assert!(minute.low < minute.average && minute.average < minute.high, "{minute:?}");
    let hour = reports.rate.1.expect("the run's samples");
    assert!(hour.high >= minute.high && hour.low <= minute.low, "{hour:?} {minute:?}");
    // Arriving at 6 requests a second and let through at 4, a request waits past a second.
    assert!(reports.refused > 20 && point.refused == 0, "{reports:?} {point:?}");
    let patient = slow_requests(None);
    assert_eq!(patient.marks[0].refused, 0);
    assert!(within(patient.total(0), 40.0, 0.05), "{:?}", patient.served);
}

/// Every storage scenario in `scenarios/storage/` holds what it expects, as `tollgate sim`
/// runs it.
#[test]
fn every_storage_scenario_holds_what_it_expects() {
    use tollgate_sim::storage_scenario::StorageScenario;
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../scenarios/storage");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    for file in files {
        let src = std::fs::read_to_string(&file).unwrap();
        assert!(StorageScenario::is_storage(&src), "{}", file.display());
        let s = StorageScenario::parse(&src).unwrap_or_else(|e| panic!("{}:\n{e}", file.display()));
        let (lines, passed) = s.verdict(&run(&s.spec));
        println!("{}: {lines:?}", s.name);
        assert!(passed && s.expect.iter().any(Option::is_some), "{}: {lines:?}", file.display());
        assert_eq!(lines.len(), 2 * s.spec.groups.len(), "a verdict and the marks per group");
    }
}

/// A malformed storage scenario is refused with every problem, by line and key.
#[test]
fn a_malformed_storage_scenario_names_each_problem() {
    use tollgate_sim::storage_scenario::StorageScenario;
    let src = "name = \"bad\"\n[storage]\nbackends = [100, 0]\nsplit = \"sideways\"\nspeed = 3\n\
               max_wait_s = 0\n[[storage.group]]\nname = \"g\"\noffers = [1]\nwithin = -1\nsizes = [2, 0]\n";
    let errors = StorageScenario::parse(src).unwrap_err();
    let text = errors.to_string();
    for wanted in [
        "line 3: storage.backends[1]: must be above 0",
        "line 4: storage.split: must be none, even or follow-load",
        "line 5: storage.speed: unknown field",
        "line 6: storage.max_wait_s: must be above 0",
        "line 10: storage.group[0].within: must be above 0",
        "line 11: storage.group[0].sizes[1]: must be above 0",
    ] {
        assert!(text.contains(wanted), "{wanted:?} not in:\n{text}");
    }
}
