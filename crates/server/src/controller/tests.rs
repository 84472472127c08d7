use super::*;
use crate::store::MemoryStore;
use tollgate_model::allocate::AllocationMode;
use tollgate_model::engine::TICK_SLICE_GROUPS;
use tollgate_model::settings::GroupSettings;

fn controller() -> Controller {
    Controller::new(Box::new(MemoryStore::default()), EngineSettings::default(), Nanos::ZERO, 0).unwrap()
}

/// A client reports the group, and a tick sees it.
fn track(c: &Controller, g: &GroupName) {
    let usage = v1::GroupUsage { group: g.to_string(), demand: 10.0, ..v1::GroupUsage::default() };
    let req =
        v1::ExchangeRequest { client_id: "c".into(), sequence: 1, groups: vec![usage], ..Default::default() };
    c.exchange(Nanos::ZERO, &req).unwrap();
    c.pacer().tick(Nanos::ZERO.after(Duration::from_secs(1)));
}

#[test]
fn a_capacity_changed_while_sharded_never_puts_more_than_a_part_in_force() {
    let c = controller();
    let in_force = |c: &Controller| c.engine().settings().capacity;
    // Sharded over two owners, with no capacity: a capacity configured starts at half.
    c.ownership().share_capacity_among(2);
    c.admin().set_capacity(Some(300.0), "test").unwrap();
    assert_eq!(in_force(&c), Some(150.0));
    assert_eq!(c.admin().node().capacity, Some(300.0), "the node says what is configured");
    // A part in force scales with the configured capacity until the next split.
    c.ownership().set_capacity_part(Some(100.0));
    c.admin().set_capacity(Some(600.0), "test").unwrap();
    assert_eq!(in_force(&c), Some(200.0));
    c.admin().set_mode(AllocationMode::Fcfs, "test").unwrap();
    assert_eq!(in_force(&c), Some(200.0), "another node setting leaves the part as it is");
    // No capacity, then one again: an even share once more.
    c.admin().set_capacity(None, "test").unwrap();
    assert_eq!((in_force(&c), c.admin().node().capacity), (None, None));
    c.admin().set_capacity(Some(90.0), "test").unwrap();
    assert_eq!(in_force(&c), Some(45.0));
    // Not sharded: the whole of it.
    c.ownership().set_capacity_part(None);
    assert_eq!(in_force(&c), Some(90.0));
    c.admin().set_capacity(Some(120.0), "test").unwrap();
    assert_eq!((in_force(&c), c.admin().node().capacity), (Some(120.0), Some(120.0)));
}

#[test]
fn a_budget_per_period_counts_from_the_metering_at_the_periods_start() {
    use tollgate_model::engine::Meter;
    use tollgate_model::settings::BudgetPeriod;
    let day = 86_400_000u64;
    let now = 20_000 * day + 3_600_000; // an hour into a day
    let g = GroupName::new("metered").unwrap();
    let settings = GroupSettings::builder()
        .reserved(1.0)
        .limit(100.0)
        .budget(100.0)
        .budget_period(BudgetPeriod::Day)
        .build()
        .unwrap();
    let meter = |consumed: f64| Meter { consumed, ..Meter::default() };
    let exhausted = |consumed_now: f64| {
        let mut store = MemoryStore::default();
        store.put_group(&g, &settings).unwrap();
        // Yesterday's last record: 500 consumed by then; then today's consumption.
        store.put_meters(&[(g.clone(), meter(500.0))], &[], 20_000 * day - 60_000).unwrap();
        store.put_meters(&[(g.clone(), meter(consumed_now))], &[], 20_000 * day + 60_000).unwrap();
        let c = Controller::new(Box::new(store), EngineSettings::default(), Nanos::ZERO, now).unwrap();
        track(&c, &g);
        let view = c.readings().view();
        view.iter().find(|v| v.name == g).map(|v| v.budget_exhausted).unwrap()
    };
    assert!(!exhausted(550.0), "50 of today's 100 spent");
    assert!(exhausted(650.0), "150 spent today");
    // Over the group's life, the same meter has long spent it.
    let mut store = MemoryStore::default();
    let total = GroupSettings::builder().reserved(1.0).limit(100.0).budget(100.0).build().unwrap();
    store.put_group(&g, &total).unwrap();
    store.put_meters(&[(g.clone(), meter(550.0))], &[], 20_000 * day).unwrap();
    let c = Controller::new(Box::new(store), EngineSettings::default(), Nanos::ZERO, now).unwrap();
    track(&c, &g);
    assert!(c.readings().view().iter().find(|v| v.name == g).unwrap().budget_exhausted);
    // A period without a budget is refused by name.
    let e = GroupSettings::builder().budget_period(BudgetPeriod::Month).build().unwrap_err();
    assert!(e.to_string().contains("budget_period: needs a budget"), "{e}");
}

fn load(group: &str, units_per_s: f64) -> v1::GroupLoad {
    v1::GroupLoad { group: group.into(), units_per_s }
}

/// Regression: one invalid group name in a backend report made the server reject the whole
/// report, and said so only at debug level.
#[test]
fn a_bad_load_is_left_out_and_named_and_the_rest_are_taken() {
    let c = controller();
    let report = v1::BackendReport {
        backend_id: "b1".into(),
        zone: "z".into(),
        health: Some(v1::backend_report::Health::Utilisation(0.5)),
        loads: vec![load("good", 10.0), load("", 5.0), load("bad\nname", 5.0), load("nan", f64::NAN)],
        capacity: None,
    };
    let ack = c.backend_report(Nanos::ZERO, &ReportView::of(&report)).unwrap();
    assert_eq!(ack.rejected.len(), 3, "{ack:?}");
    assert!(ack.rejected[0].starts_with("loads[1].group: must not be empty"), "{ack:?}");
    assert!(ack.rejected[2].starts_with("loads[3].units_per_s: must be a finite number"), "{ack:?}");
    assert_eq!(c.readings().tracking(Nanos::ZERO).1, 1, "the backend and its good load were taken");
    // A report without health is refused whole, naming the field.
    let e = c
        .backend_report(Nanos::ZERO, &ReportView::of(&v1::BackendReport { health: None, ..report }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("health:"), "{e:?}");
}

#[test]
fn exchanges_are_checked_against_the_contract() {
    let c = controller();
    let usage =
        |group: &str, demand: f64| v1::GroupUsage { group: group.into(), demand, ..Default::default() };
    let req =
        |groups| v1::ExchangeRequest { client_id: "c".into(), sequence: 1, groups, ..Default::default() };
    let e = c.exchange(Nanos::ZERO, &req(vec![usage("g", f64::INFINITY)])).unwrap_err();
    assert!(e.message().starts_with("groups[0].demand: must be a finite number"), "{e:?}");
    let e = c.exchange(Nanos::ZERO, &req(vec![usage("g", 1e16)])).unwrap_err();
    assert!(e.message().contains("from 0 to 1e15"), "{e:?}");
    let e = c
        .exchange(Nanos::ZERO, &v1::ExchangeRequest { client_id: String::new(), ..req(vec![]) })
        .unwrap_err();
    assert!(e.message().starts_with("client_id:"), "{e:?}");
    let ok = c.exchange(Nanos::ZERO, &req(vec![usage("g", 1.0)])).unwrap();
    assert!(ok.grants[0].unlimited);
    assert_eq!(c.readings().exchanges(), 1, "refused exchanges are not counted");
}

/// A backend newly saturated gets one tick before the tick's turn between two regular
/// ones, however many report so; refused clients are still told when the next regular
/// tick is done, not a period after the early one.
#[test]
fn a_backend_newly_saturated_gets_one_early_tick_between_two_regular_ones() {
    let c = controller();
    let saturated = |backend: &str, u: f64| v1::BackendReport {
        backend_id: backend.into(),
        zone: "z".into(),
        health: Some(v1::backend_report::Health::Utilisation(u)),
        loads: vec![load("g", 500_000.0)],
        capacity: None,
    };
    let ms = |n: u64| Nanos(n * 1_000_000);
    c.pacer().tick(ms(0));
    assert!(!c.pacer().take_early_tick(), "nothing saturated");
    c.backend_report(ms(100), &ReportView::of(&saturated("a", 0.5))).unwrap();
    assert!(!c.pacer().take_early_tick(), "not saturated");
    c.backend_report(ms(200), &ReportView::of(&saturated("a", 1.2))).unwrap();
    assert!(c.pacer().take_early_tick());
    assert!(!c.pacer().take_early_tick(), "said once");
    c.pacer().tick_early_paced(ms(200), || {});
    assert_eq!(c.pacer().early_ticks(), 1);
    // Another backend newly saturated before the next regular tick waits for it.
    c.backend_report(ms(300), &ReportView::of(&saturated("b", 1.2))).unwrap();
    assert!(!c.pacer().take_early_tick(), "one early tick between two regular ones");
    let req = v1::ExchangeRequest { client_id: "c".into(), sequence: 1, ..Default::default() };
    assert_eq!(c.exchange(ms(400), &req).unwrap().next_tick_ms, 600, "the regular tick's time");
    c.pacer().tick(ms(1000));
    c.backend_report(ms(1100), &ReportView::of(&saturated("a", 0.5))).unwrap();
    c.backend_report(ms(1200), &ReportView::of(&saturated("a", 1.3))).unwrap();
    assert!(c.pacer().take_early_tick(), "a new period, a new onset");
}

/// A refused client is told to come back once the next tick is done: its start (a tick
/// period after the last one started) and as long as the last tick took.
#[test]
fn the_next_tick_is_said_to_be_done_as_long_after_its_start_as_the_last_took() {
    let c = controller();
    let req = v1::ExchangeRequest { client_id: "c".into(), sequence: 1, ..Default::default() };
    c.pacer().tick(Nanos::ZERO);
    let at = Nanos(300_000_000);
    assert_eq!(c.exchange(at, &req).unwrap().next_tick_ms, 700);
    c.pacer().set_tick_span(Duration::from_millis(120));
    assert_eq!(c.exchange(at, &req).unwrap().next_tick_ms, 820);
}

/// An exchange answered between a tick's walks holds the grants that tick is replacing:
/// it is told that the tick is under way (no time to it), not that the next is a period
/// away, so that its client comes back for the new grants.
#[test]
fn an_exchange_answered_while_a_tick_is_under_way_is_told_so() {
    let c = controller();
    let req = v1::ExchangeRequest {
        client_id: "c".into(),
        sequence: 1,
        groups: vec![v1::GroupUsage { group: "g".into(), demand: 1.0, ..Default::default() }],
        ..Default::default()
    };
    c.pacer().tick(Nanos::ZERO);
    const S: u64 = 1_000_000_000;
    let mut during = Vec::new();
    c.pacer().tick_paced(Nanos(S), || during.push(c.exchange(Nanos(S), &req).unwrap().next_tick_ms));
    assert!(!during.is_empty(), "the tick paused at least once");
    assert!(during.iter().all(|&ms| ms == 0), "{during:?}");
    // Once it is done: the next a period after its start.
    assert_eq!(c.exchange(Nanos(S), &req).unwrap().next_tick_ms, 1000);
}

/// A paced tick pauses between its slices with the engine free: an exchange made in a
/// pause is answered, and the tick still completes.
#[test]
fn a_paced_tick_pauses_between_slices_with_the_engine_free() {
    let c = controller();
    let groups: Vec<v1::GroupUsage> = (0..2 * TICK_SLICE_GROUPS + 1)
        .map(|i| v1::GroupUsage { group: format!("g{i}"), demand: 1.0, ..Default::default() })
        .collect();
    // Three clients of at most 1000 groups each (an exchange's most).
    for (client, part) in groups.chunks(1000).enumerate() {
        let req = v1::ExchangeRequest {
            client_id: format!("c{client}"),
            sequence: 1,
            groups: part.to_vec(),
            ..Default::default()
        };
        c.exchange(Nanos::ZERO, &req).unwrap();
    }
    let ticks = c.with_engine(Engine::ticks);
    let mut pauses = 0;
    const S: u64 = 1_000_000_000;
    c.pacer().tick_paced(Nanos(S), || {
        pauses += 1;
        let req = v1::ExchangeRequest {
            client_id: "f".into(),
            sequence: pauses,
            groups: groups[..1].to_vec(),
            ..Default::default()
        };
        assert_eq!(c.exchange(Nanos(S), &req).unwrap().grants.len(), 1);
    });
    // At least two slices of groups (the first of 256, the next grown by a quarter at
    // most) and a walk that applies them: at least two pauses, however fast the machine.
    assert!(pauses >= 2, "{pauses} pauses");
    assert_eq!(c.with_engine(Engine::ticks), ticks + 1);
}

/// TiDB's `target_request_period_ms`: the period a client asks for, kept between the tick
/// (1 s) and half the lease (10 s).
#[test]
fn a_client_gets_the_period_it_asks_for_within_the_tick_and_half_the_lease() {
    let c = controller();
    let period = |asked: u32| {
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            target_request_period_ms: asked,
            ..Default::default()
        };
        c.exchange(Nanos::ZERO, &req).map(|r| r.next_exchange_ms)
    };
    assert_eq!(period(0).unwrap(), 1000);
    assert_eq!(period(3000).unwrap(), 3000);
    assert_eq!(period(10).unwrap(), 1000);
    assert_eq!(period(60_000).unwrap(), 5000);
    let e = period(3_600_001).unwrap_err();
    assert_eq!(e.message(), "target_request_period_ms: must be at most 3600000, got 3600001");
    // How long an allotment should last is bounded too, and named.
    let lasting = |ms: u32| {
        let quota = v1::QuotaHeld { lasts_ms: ms, ..Default::default() };
        let usage = v1::GroupUsage { group: "g".into(), quota: Some(quota), ..Default::default() };
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            groups: vec![usage],
            takes_allotments: true,
            ..Default::default()
        };
        c.exchange(Nanos::ZERO, &req).map(|_| ())
    };
    assert!(lasting(3_600_000).is_ok());
    let e = lasting(3_600_001).unwrap_err();
    assert_eq!(e.message(), "groups[0].quota.lasts_ms: must be at most 3600000, got 3600001");
}

/// At a start, the minute, the hour and the day under way count from the usage records: the
/// group's consumption as of its last record before each began. Before, minutes and hours
/// counted from the consumption at the start, so a restart gave an hour's quota afresh.
#[test]
fn the_windows_under_way_at_a_start_count_from_the_usage_records() {
    use tollgate_model::engine::Meter;
    use tollgate_model::settings::BudgetPeriod::{Day, Hour, Minute};
    let (minute, hour) = (60_000u64, 3_600_000u64);
    let day_start = 20_000 * 24 * hour;
    let now = day_start + 5 * hour + 30 * minute + 30_000; // 05:30:30
    let g = GroupName::new("metered").unwrap();
    let settings = GroupSettings::builder()
        .limit(100.0)
        .quota(Minute, 100.0)
        .quota(Hour, 1000.0)
        .quota(Day, 10_000.0)
        .build()
        .unwrap();
    let meter = |consumed: f64| Meter { consumed, ..Meter::default() };
    let mut store = MemoryStore::default();
    store.put_group(&g, &settings).unwrap();
    // Yesterday's last record, then the last of 04:59, of 05:29, and of the minute under way.
    for (at, consumed) in [(day_start - minute, 100.0), (day_start + 5 * hour - minute, 500.0)] {
        store.put_meters(&[(g.clone(), meter(consumed))], &[], at).unwrap();
    }
    for (at, consumed) in [(now - 30_000 - minute, 600.0), (now - 30_000, 650.0)] {
        store.put_meters(&[(g.clone(), meter(consumed))], &[], at).unwrap();
    }
    let c = Controller::new(Box::new(store), EngineSettings::default(), Nanos::ZERO, now).unwrap();
    let baselines = c.with_engine(|e| [Minute, Hour, Day].map(|w| e.budget_baseline(&g, w)));
    assert_eq!(baselines, [600.0, 500.0, 100.0], "50 spent this minute, 150 this hour, 550 today");
}

/// Between flushes, the meters of groups with quota allotments under way are written when
/// they change (and only then), the ramps left as they are; a successor whose own metering
/// rolled the windows (a follower's, which meters nothing of the group) places them again on
/// the records those writes left.
#[test]
fn quota_groups_meters_are_written_between_flushes_and_place_a_successors_windows() {
    use tollgate_model::engine::Meter;
    use tollgate_model::settings::BudgetPeriod::{Hour, Minute};
    let (minute, hour) = (60_000u64, 3_600_000u64);
    // Both start at 50 minutes past an hour with 1,000 consumed before.
    let start = 500_000 * hour - 10 * minute;
    let g = GroupName::new("q").unwrap();
    let settings =
        GroupSettings::builder().limit(100.0).quota(Minute, 100.0).quota(Hour, 1000.0).build().unwrap();
    let mut store = MemoryStore::default();
    store.put_group(&g, &settings).unwrap();
    store
        .put_meters(&[(g.clone(), Meter { consumed: 1000.0, ..Meter::default() })], &[], start - minute)
        .unwrap();
    let leader =
        Controller::new(Box::new(store.clone()), EngineSettings::default(), Nanos::ZERO, start).unwrap();
    let follower =
        Controller::new(Box::new(store.clone()), EngineSettings::default(), Nanos::ZERO, start).unwrap();
    let exchange = |consumed: f64, after_ms: u64| {
        let usage = v1::GroupUsage {
            group: "q".into(),
            demand: 10.0,
            consumed,
            quota: Some(v1::QuotaHeld::default()),
            ..Default::default()
        };
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![usage],
            takes_allotments: true,
            ..Default::default()
        };
        leader.exchange(Nanos::ZERO.after(Duration::from_millis(after_ms)), &req).unwrap();
        leader.writes().quota_meters(start + after_ms, None).unwrap()
    };
    // 200 in the hour before, then 40 ten minutes into the next.
    assert_eq!(exchange(0.0, 0), 1, "written once from here");
    assert_eq!(exchange(200.0, 1000), 1);
    assert_eq!(leader.writes().quota_meters(start + 2000, None).unwrap(), 0, "unchanged: not written again");
    let now = start + 20 * minute;
    assert_eq!(exchange(40.0, 20 * minute), 1);
    let mut s = store.clone();
    assert_eq!(s.load().unwrap().meters[&g].consumed, 1240.0);
    // The follower rolled the hour on its own metering, 1,000 (it meters nothing of the
    // group): taking over, it counts on from the stored meter, and places the windows on the
    // records, so that the hour counts 40, not 240.
    follower.roll_short_windows(now);
    assert_eq!(follower.with_engine(|e| e.budget_baseline(&g, Hour)), 1000.0);
    let taken = follower.ownership().restore_meters(s.load().unwrap().meters.into_iter().collect(), |_| true);
    assert_eq!(taken, 1);
    assert_eq!(follower.writes().place_windows(now, None).unwrap(), 2);
    let baselines = follower.with_engine(|e| [Minute, Hour].map(|w| e.budget_baseline(&g, w)));
    assert_eq!(baselines, [1200.0, 1200.0], "40 in the minute and in the hour");
}

/// A group with a limit of 150 brings 120 units/s to one backend and 30 to another: each is
/// answered with its share of the limit and its ceiling; what its requests used per unit
/// turns the share into CPU time and bytes.
#[test]
fn each_report_is_answered_with_the_groups_shares_of_their_limits() {
    let c = controller();
    let name = GroupName::new("skewed").unwrap();
    let patch = v1::GroupPatch { limit: Some(150.0), ..Default::default() };
    c.admin().put_group(name.clone(), &patch, PutMode::Create, "test", 0).unwrap();
    // Its clients consumed 100 units, which took 50 CPU ms and read 4,000 bytes.
    let detail = v1::Consumption { cpu_ms: 50.0, read_bytes: 4000.0, ..Default::default() };
    let usage = v1::GroupUsage {
        group: "skewed".into(),
        demand: 100.0,
        consumed: 100.0,
        admitted: 10,
        detail: Some(detail),
        ..Default::default()
    };
    let req =
        v1::ExchangeRequest { client_id: "c".into(), sequence: 1, groups: vec![usage], ..Default::default() };
    c.exchange(Nanos::ZERO, &req).unwrap();
    c.pacer().tick(Nanos::ZERO.after(Duration::from_secs(1)));
    let report = |id: &str, units: f64, unlimited: f64| v1::BackendReport {
        backend_id: id.into(),
        zone: "z".into(),
        health: Some(v1::backend_report::Health::Utilisation(0.5)),
        loads: vec![load("skewed", units), load("free", unlimited)],
        capacity: None,
    };
    let at = Nanos::ZERO.after(Duration::from_millis(1100));
    c.backend_report(at, &ReportView::of(&report("hot", 120.0, 5.0))).unwrap();
    let ack = c.backend_report(at, &ReportView::of(&report("cold", 30.0, 5.0))).unwrap();
    assert_eq!(ack.shares.len(), 1, "a group without a limit has no share: {ack:?}");
    let share = &ack.shares[0];
    assert_eq!((share.group.as_str(), share.units_per_s, share.ceiling), ("skewed", 30.0, 30.0), "{share:?}");
    assert_eq!((share.cpu_ms_per_s, share.read_bytes_per_s, share.write_bytes_per_s), (15.0, 1200.0, 0.0));
    let hot = c.backend_report(at, &ReportView::of(&report("hot", 120.0, 5.0))).unwrap();
    assert_eq!((hot.shares[0].units_per_s, hot.shares[0].ceiling, hot.shares[0].part), (120.0, 120.0, 0.0));
    // A backend that says its capacity: the share as a part of it, and no ceiling past it.
    let small = v1::BackendReport { capacity: Some(100.0), ..report("hot", 120.0, 5.0) };
    let hot = c.backend_report(at, &ReportView::of(&small)).unwrap();
    assert_eq!((hot.shares[0].units_per_s, hot.shares[0].ceiling, hot.shares[0].part), (120.0, 120.0, 1.2));
    let big = v1::BackendReport { capacity: Some(400.0), ..report("hot", 120.0, 5.0) };
    let hot = c.backend_report(at, &ReportView::of(&big)).unwrap();
    assert_eq!(hot.shares[0].part, 0.3, "{hot:?}");
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = c.backend_report(
            at,
            &ReportView::of(&v1::BackendReport { capacity: Some(bad), ..report("hot", 1.0, 1.0) }),
        );
        assert!(e.unwrap_err().message().starts_with("capacity:"), "{bad}");
    }
    assert_eq!(
        hot.elsewhere.iter().map(|l| (l.group.as_str(), l.units_per_s)).collect::<Vec<_>>(),
        [("skewed", 30.0), ("free", 5.0)]
    );
}
