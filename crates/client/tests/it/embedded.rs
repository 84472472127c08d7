//! The embedded limiter, as a service using it would see it.

use std::time::Duration;

use tollgate_limiter::{AcquireError, Tollgate};
use tollgate_model::time::{Clock, ManualClock};

fn gate(toml: &str, clock: &ManualClock) -> Tollgate {
    Tollgate::builder()
        .config(tollgate_model::config::Config::parse(toml).expect("valid test settings"))
        .clock(clock.clone())
        .build()
        .expect("buildable")
}

/// Drives hungry tenants for `secs` seconds in 10 ms steps: each of a group's `connections`
/// offers `per_conn_per_step` one-unit requests each step. Returns the units admitted per
/// group during the last half of the run (after allocation has settled).
fn drive(
    gate: &Tollgate,
    clock: &ManualClock,
    groups: &[(&str, usize)],
    per_conn_per_step: usize,
    secs: u64,
) -> Vec<f64> {
    let steps = secs * 100;
    let mut admitted = vec![0.0; groups.len()];
    for step in 0..steps {
        for (i, (name, connections)) in groups.iter().enumerate() {
            for _ in 0..connections * per_conn_per_step {
                if gate.try_acquire(name, 1.0).is_ok() && step >= steps / 2 {
                    admitted[i] += 1.0;
                }
            }
        }
        clock.advance(Duration::from_millis(10));
    }
    admitted.iter().map(|a| a / (secs as f64 / 2.0)).collect()
}

/// Offers `n` one-unit requests through a handle; returns how many were admitted.
fn admit(h: &tollgate_limiter::GroupHandle, n: usize) -> usize {
    (0..n).filter(|_| h.try_acquire(1.0).is_ok()).count()
}

fn within(actual: f64, expected: f64, pct: f64) -> bool {
    (actual - expected).abs() <= expected * pct / 100.0
}

#[test]
fn reserved_first_then_the_free_pool_shared_evenly() {
    let clock = ManualClock::new();
    let g = gate("[node]\ncapacity = 1000\n[groups.a]\nreserved = 600\n[groups.b]\nreserved = 200\n", &clock);
    let rates = drive(&g, &clock, &[("a", 1), ("b", 1)], 30, 10);
    assert!(within(rates[0], 700.0, 3.0), "a got {rates:?}");
    assert!(within(rates[1], 300.0, 3.0), "b got {rates:?}");
    let stats = g.stats("a").unwrap();
    assert!(stats.throttled > 0 && stats.admitted > 0);
    assert!(within(stats.allowance, 700.0, 1.0), "{stats:?}");
}

#[test]
fn a_limit_is_never_exceeded_and_a_reservation_always_held() {
    let clock = ManualClock::new();
    let g = gate(
        "[node]\ncapacity = 1000\n\
         [groups.capped]\nlimit = 100\n\
         [groups.vip]\npriority = \"high\"\nweight = 100\n\
         [groups.small]\nreserved = 250\npriority = \"low\"\n",
        &clock,
    );
    let rates = drive(&g, &clock, &[("capped", 1), ("vip", 4), ("small", 1)], 50, 10);
    assert!(rates[0] <= 100.0 * 1.01, "capped got {rates:?}");
    assert!(rates[2] >= 250.0 * 0.99, "small got {rates:?}");
    // Over the whole run, at most one burst above the limit.
    let capped = g.stats("capped").unwrap();
    assert!(capped.admitted_units <= 100.0 * 10.0 + 100.0, "{capped:?}");
}

#[test]
fn an_idle_tenant_leaves_its_share_to_the_busy_one() {
    let clock = ManualClock::new();
    let g = gate("[node]\ncapacity = 1000\n[groups.a]\nreserved = 500\n[groups.b]\n", &clock);
    let rates = drive(&g, &clock, &[("a", 0), ("b", 1)], 30, 6);
    assert!(within(rates[1], 1000.0, 3.0), "b got {rates:?}");
}

#[test]
fn couchbase_reserved_equals_limit_1000_holds_4096_requests_to_the_rate() {
    // Couchbase's own throttling test: reserved = hard limit = 1000 units/s, 4096 GETs of a
    // small document (one unit each) take about 4 s in its one-second slots. A bucket that
    // starts with one second banked takes burst + rate × t: 3.1 s.
    let clock = ManualClock::new();
    let g = gate(
        "[node]\nmode = \"fcfs\"\ncapacity = 25000\n[groups.bucket]\nreserved = 1000\nlimit = 1000\n",
        &clock,
    );
    let start = clock.now();
    let mut done = 0;
    let mut throttled = 0;
    while done < 4096 {
        match g.try_acquire("bucket", 1.0) {
            Ok(_) => done += 1,
            Err(AcquireError::Throttled { retry_after, .. }) => {
                throttled += 1;
                assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1));
                clock.advance(retry_after);
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }
    let took = clock.now().since(start);
    assert!(took >= Duration::from_millis(3095), "took {took:?}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(throttled >= 3);
    assert_eq!(g.stats("bucket").unwrap().admitted, 4096);
}

/// Offers `per_step` one-unit requests for each named group every 10 ms for `secs` seconds;
/// returns each group's admitted units/s over the last half.
fn offer(gate: &Tollgate, clock: &ManualClock, names: &[&str], per_step: usize, secs: u64) -> Vec<f64> {
    let steps = secs * 100;
    let mut admitted = vec![0.0; names.len()];
    for step in 0..steps {
        for (i, name) in names.iter().enumerate() {
            for _ in 0..per_step {
                if gate.try_acquire(name, 1.0).is_ok() && step >= steps / 2 {
                    admitted[i] += 1.0;
                }
            }
        }
        clock.advance(Duration::from_millis(10));
    }
    admitted.iter().map(|a| a / (secs as f64 / 2.0)).collect()
}

#[test]
fn fcfs_free_pool_goes_to_whoever_asked_first() {
    for (mode, expected) in [("fcfs", [90.0, 10.0]), ("share", [50.0, 50.0])] {
        let clock = ManualClock::new();
        let g = gate(
            &format!(
                "[node]\nmode = \"{mode}\"\ncapacity = 100\n[groups.a]\nreserved = 10\n[groups.b]\nreserved = 10\n"
            ),
            &clock,
        );
        // b asks first, alone; then a asks as hard.
        offer(&g, &clock, &["b"], 5, 2);
        let rates = offer(&g, &clock, &["b", "a"], 5, 10);
        for (got, want) in rates.iter().zip(expected) {
            assert!(within(*got, want, 5.0), "{mode}: b and a got {rates:?}, expected {expected:?}");
        }
    }
}

#[test]
fn unthrottled_requests_are_admitted_and_still_counted() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nlimit = 10\n", &clock);
    let admin = g.unthrottled();
    assert!(admin.is_unthrottled());
    for _ in 0..50 {
        admin.try_acquire("a", 1.0).expect("unthrottled is always admitted");
    }
    // The 50 units count against the group: 40 units of debt at 10/s.
    assert!(g.try_acquire("a", 1.0).is_err());
    clock.advance(Duration::from_secs(3));
    assert!(g.try_acquire("a", 1.0).is_err());
    clock.advance(Duration::from_secs(2));
    assert!(g.try_acquire("a", 1.0).is_ok());
    assert_eq!(g.stats("a").unwrap().admitted, 51);
}

#[test]
fn unknown_groups_get_the_default_groups_settings() {
    let clock = ManualClock::new();
    let g = gate("[node]\nmax_tracked_groups = 3\n[groups.default]\nlimit = 5\n", &clock);
    for _ in 0..5 {
        g.try_acquire("stranger", 1.0).unwrap();
    }
    assert!(g.try_acquire("stranger", 1.0).is_err());
    // Each unknown group has its own state, up to the tracking limit…
    assert!(g.try_acquire("another", 1.0).is_ok());
    assert_eq!(g.stats("another").unwrap().admitted, 1);
    // …beyond which new names share the default group's state.
    let extra = g.group("third").unwrap();
    assert_eq!(extra.name(), "default");
}

/// New names wait beside the lock-free table until enough lookups needed the lock, then move
/// into it: every name is found again, counted once and holds its own state, before and
/// after the move, and the bound counts both.
#[test]
fn names_taken_in_one_by_one_are_each_found_again_and_bounded() {
    let clock = ManualClock::new();
    let g = gate(
        "[node]
max_tracked_groups = 701
[groups.default]
limit = 2
burst = 2
",
        &clock,
    );
    let names: Vec<String> = (0..700).map(|i| format!("tenant-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        assert!(g.try_acquire(name, 2.0).is_ok(), "{name}: its own burst");
        assert!(g.try_acquire(name, 1.0).is_err(), "{name}: its own state, spent");
        // An earlier name, wherever it is now, is the same group still.
        let earlier = &names[i / 2];
        assert!(g.try_acquire(earlier, 1.0).is_err(), "{earlier}");
        assert_eq!(g.stats(earlier).unwrap().admitted, 1, "{earlier}");
    }
    assert_eq!(g.all_stats().len(), 701, "700 names and default");
    // The table is full: a new name shares default's state.
    assert_eq!(g.group("one-too-many").unwrap().name(), "default");
}

/// Past 256 groups in use, a new group is not taken in by a reallocation of its own (taking
/// in N keys one by one would cost N²): it admits by its own limit and burst meanwhile, and
/// the next call 10 ms on takes in every group that came since.
#[test]
fn past_256_groups_new_ones_are_taken_in_together_soon_after() {
    let clock = ManualClock::new();
    let g = gate(
        "[node]\ncapacity = 100000\nmax_tracked_groups = 1000\n[groups.default]\nlimit = 10\nburst = 10\n",
        &clock,
    );
    for i in 0..300 {
        assert!(g.try_acquire(&format!("tenant-{i}"), 1.0).is_ok());
    }
    // The first 256 or so were each taken in at once; the later ones wait, holding their limit.
    assert!(g.stats("tenant-10").unwrap().allowance > 0.0);
    let late = g.stats("tenant-299").unwrap();
    assert_eq!(late.allowance, 0.0, "not taken in yet");
    for _ in 0..9 {
        g.try_acquire("tenant-299", 1.0).unwrap();
    }
    assert!(g.try_acquire("tenant-299", 1.0).is_err(), "its own burst, no more");
    clock.advance(Duration::from_millis(10));
    let _ = g.try_acquire("tenant-0", 1.0);
    for i in 257..300 {
        assert!(g.stats(&format!("tenant-{i}")).unwrap().allowance > 0.0, "tenant-{i} taken in");
    }
}

#[test]
fn bad_costs_are_errors_and_zero_costs_are_free() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nlimit = 10\n", &clock);
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let e = g.try_acquire("a", bad).unwrap_err();
        assert!(matches!(e, AcquireError::InvalidCost(_)), "{bad}: {e}");
        assert!(!e.is_transient());
    }
    for _ in 0..100 {
        g.try_acquire("a", 0.0).unwrap();
    }
    // Zero-cost requests took nothing: the whole burst is still there.
    g.try_acquire("a", 10.0).unwrap();
    assert!(matches!(g.try_acquire("a", 1.0), Err(AcquireError::Throttled { .. })));
    assert!(matches!(g.try_acquire("", 1.0), Err(AcquireError::InvalidGroup(_))));
}

#[test]
fn a_cost_the_burst_can_never_hold_fails_at_once() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nlimit = 10\n", &clock);
    let e = g.try_acquire("a", 11.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a cost of 11 units can never be admitted for group \"a\": its burst holds at most 10 units"
    );
    assert_eq!(e.retry_after(), None);
}

#[test]
fn settling_turns_the_difference_into_debt_or_returns_it() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nlimit = 100\n", &clock);
    // Admitted at 10, actually cost 90: the bucket is at 100 − 90 = 10.
    g.try_acquire("a", 10.0).unwrap().settle(90.0).unwrap();
    g.try_acquire("a", 10.0).unwrap();
    assert!(g.try_acquire("a", 1.0).is_err());
    // Admitted at 50 but cost nothing: 50 come back.
    clock.advance(Duration::from_millis(500));
    g.try_acquire("a", 50.0).unwrap().settle(0.0).unwrap();
    g.try_acquire("a", 50.0).unwrap();
    let s = g.stats("a").unwrap();
    assert_eq!(s.consumed_units, 90.0 + 10.0 + 0.0 + 50.0);
    // A bad actual cost is refused and the estimate stands.
    assert!(g.try_acquire("a", 0.0).unwrap().settle(f64::NAN).is_err());
}

#[test]
fn usage_is_priced_up_front_and_settled_in_full() {
    let clock = ManualClock::new();
    let g = gate("[cost]\nmodel = \"ru\"\n[groups.a]\nlimit = 100\n", &clock);
    let read = tollgate_model::cost::Usage::read(655_360).with_cpu_ms(30.0);
    let permit = g.try_acquire_usage("a", &read).unwrap();
    assert!((permit.cost() - 0.475).abs() < 1e-9);
    permit.settle_usage(g.cost_model(), &read).unwrap();
    let s = g.stats("a").unwrap();
    assert!((s.consumed_units - (0.475 + 10.0 + 10.0)).abs() < 1e-6, "{s:?}");
}

#[test]
fn a_budget_once_spent_admits_nothing_more_not_even_its_reservation() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nreserved = 10\nlimit = 1000\nbudget = 2000\n", &clock);
    let mut first = 0.0;
    for _ in 0..500 {
        while g.try_acquire("a", 1.0).is_ok() {
            first += 1.0;
        }
        clock.advance(Duration::from_millis(10));
    }
    // About two seconds at the limit, and exactly the budget: a quota is a count.
    let h = g.group("a").unwrap();
    assert_eq!(first, 2000.0, "spent {first}: {:?} {:?} {}", h.quota(), g.stats("a"), h.available());
    let mut later = 0.0;
    for _ in 0..500 {
        while g.try_acquire("a", 1.0).is_ok() {
            later += 1.0;
        }
        clock.advance(Duration::from_millis(10));
    }
    // The reservation is a floor within the quotas, never a way past them.
    assert_eq!(later, 0.0);
    assert_eq!(g.stats("a").unwrap().allowance, 0.0);
    let quota = g.group("a").unwrap().quota().unwrap();
    assert_eq!(quota.remaining(), 0.0);
}

/// A minute's quota is a count per UTC minute: asked at six times its pace for three and a
/// half minutes, each whole minute admits exactly its quota, none admits more, and a refusal
/// says to come back when the minute ends.
#[test]
fn a_quota_per_minute_admits_exactly_its_count_each_minute() {
    let clock = ManualClock::new();
    let g = gate("[groups.a]\nquotas = { minute = 100 }\n", &clock);
    let h = g.group("a").unwrap();
    // Admissions by the end of the window they fell in (the process's clock, in seconds).
    let mut per_window: Vec<(u64, u32)> = Vec::new();
    for step in 0..2100u64 {
        let now_ms = step * 100;
        match h.try_acquire(1.0) {
            Ok(_) => {
                let q = h.quota().expect("an allotment");
                let ends =
                    (now_ms + u64::try_from(q.window_ends_in.unwrap().as_millis()).unwrap()).div_ceil(1000);
                match per_window.last_mut() {
                    Some((end, n)) if *end == ends => *n += 1,
                    _ => per_window.push((ends, 1)),
                }
            }
            Err(e) => {
                // Spent: the hint is the minute's end, never a blind guess.
                let q = h.quota().expect("an allotment");
                if q.remaining() == 0.0 {
                    assert_eq!(e.retry_after(), q.window_ends_in.or(e.retry_after()), "{q:?}");
                    assert!(e.retry_after().unwrap() <= Duration::from_secs(60));
                }
            }
        }
        clock.advance(Duration::from_millis(100));
    }
    assert!(per_window.iter().all(|&(_, n)| n <= 100), "{per_window:?}");
    let full = per_window.iter().filter(|&&(_, n)| n == 100).count();
    assert!(full >= 3, "every whole minute admits its 100: {per_window:?}");
}

#[test]
fn threads_do_not_buy_a_bigger_share() {
    // A frozen clock: each group can admit exactly its burst, however many threads ask.
    let clock = ManualClock::new();
    let g = gate(
        "[node]\ncapacity = 2000\n[groups.one]\nreserved = 1000\nlimit = 1000\n[groups.many]\nreserved = 1000\nlimit = 1000\n",
        &clock,
    );
    std::thread::scope(|s| {
        s.spawn(|| while g.try_acquire("one", 1.0).is_ok() {});
        for _ in 0..6 {
            s.spawn(|| while g.try_acquire("many", 1.0).is_ok() {});
        }
    });
    assert_eq!(g.stats("one").unwrap().admitted, 1000);
    assert_eq!(g.stats("many").unwrap().admitted, 1000);
}

#[test]
fn a_ramped_group_grows_from_min_to_max() {
    let clock = ManualClock::new();
    let g = gate(
        "[groups.stage]\nlimit = 1000\n[groups.stage.ramp]\nmin = 10\nmax = 50\nduration_s = 4\nmode = \"scheduled\"\n",
        &clock,
    );
    let mut per_second = Vec::new();
    for _ in 0..7 {
        let mut admitted = 0;
        for _ in 0..100 {
            while g.try_acquire("stage", 1.0).is_ok() {
                admitted += 1;
            }
            clock.advance(Duration::from_millis(10));
        }
        per_second.push(admitted);
    }
    // The first second also spends the initial burst; then 20, 30, 40, 50 and 50.
    for (got, want) in per_second[1..].iter().zip([20, 30, 40, 50, 50, 50]) {
        assert!((*got as i64 - want).abs() <= 3, "{per_second:?}");
    }
    assert_eq!(g.stats("stage").unwrap().allowance, 50.0);
}

#[test]
fn settings_errors_name_line_field_and_rule() {
    let e = Tollgate::from_toml("[groups.a]\nreserved = 5\nlimit = 1\n").unwrap_err();
    assert_eq!(e.to_string(), "invalid settings:\nline 2: groups.a.reserved: must not exceed limit (5 > 1)");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]

    /// Couchbase's complaint: a tenant with ten connections got ten time slots. Here a
    /// tenant's share depends on its group's settings, not on how many callers it has.
    #[test]
    fn a_tenants_share_does_not_depend_on_its_connections(conns_a in 1usize..8, conns_b in 1usize..8) {
        let clock = ManualClock::new();
        let g = gate("[node]\ncapacity = 1000\n[groups.a]\n[groups.b]\n", &clock);
        let rates = drive(&g, &clock, &[("a", conns_a), ("b", conns_b)], 15, 6);
        proptest::prop_assert!(within(rates[0], 500.0, 4.0), "{conns_a} vs {conns_b}: {rates:?}");
        proptest::prop_assert!(within(rates[1], 500.0, 4.0), "{conns_a} vs {conns_b}: {rates:?}");
    }
}

#[test]
fn settings_come_from_a_file_or_a_clear_error() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("embedded-settings.toml");
    std::fs::write(&path, "[groups.a]\nlimit = 3\n").unwrap();
    let g = Tollgate::from_file(&path).unwrap();
    // A group is fed from its first use.
    assert_eq!(g.stats("a").unwrap().allowance, 0.0);
    drop(g.try_acquire("a", 1.0).unwrap());
    assert_eq!(g.stats("a").unwrap().allowance, 3.0);
    let e = Tollgate::from_file("/nonexistent/tollgate.toml").unwrap_err();
    assert!(e.to_string().starts_with("cannot read settings file /nonexistent/tollgate.toml: "), "{e}");
}

/// A rate high enough for threads to take stashes (see `GroupHandle::try_acquire`): 50 µs of
/// 400,000 units/s is 20 units.
const FAST: &str = "[groups.fast]\nlimit = 400000\n";

#[test]
fn stashes_never_admit_more_than_the_bucket_holds() {
    // A frozen clock: the group can admit exactly its burst, however many threads take
    // stashes from it, by handle or by name.
    let clock = ManualClock::new();
    let g = gate(FAST, &clock);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let h = g.group("fast").unwrap();
                while h.try_acquire(1.0).is_ok() {}
            });
        }
        s.spawn(|| while g.try_acquire("fast", 1.0).is_ok() {});
    });
    assert_eq!(g.stats("fast").unwrap().admitted, 400_000);
}

#[test]
fn a_high_rate_limit_holds_over_time_with_stashes() {
    let clock = ManualClock::new();
    let g = gate(FAST, &clock);
    let h = g.group("fast").unwrap();
    // Twice the limit offered, every millisecond, for two seconds.
    for _ in 0..2000 {
        for _ in 0..800 {
            let _ = h.try_acquire(1.0);
        }
        clock.advance(Duration::from_millis(1));
    }
    // The burst (one second of the rate) plus two seconds of refill, less at most one
    // unspent stash.
    let admitted = g.stats("fast").unwrap().admitted as f64;
    let most = 400_000.0 + 400_000.0 * 2.0;
    assert!(admitted <= most, "admitted {admitted}, more than {most}");
    assert!(admitted >= most - 20.0 - 400.0, "admitted {admitted}, expected about {most}");
}

#[test]
fn a_lowered_rate_takes_effect_although_threads_hold_stashes() {
    // `fast` alone gets the whole capacity; once `other` asks too, each gets half.
    let clock = ManualClock::new();
    let g = gate("[node]\ncapacity = 800000\n[groups.fast]\n[groups.other]\n", &clock);
    let (fast, other) = (g.group("fast").unwrap(), g.group("other").unwrap());
    for _ in 0..300 {
        admit(&fast, 16_000);
        clock.advance(Duration::from_millis(10));
    }
    // Both hungry for 5 s; the last 2 s are measured.
    let mut got = [0, 0];
    for step in 0..500 {
        let (f, o) = (admit(&fast, 8_000), admit(&other, 8_000));
        if step >= 300 {
            got[0] += f;
            got[1] += o;
        }
        clock.advance(Duration::from_millis(10));
    }
    let rates = got.map(|n| n as f64 / 2.0);
    assert!(within(rates[0], 400_000.0, 3.0), "fast got {rates:?} units/s");
    assert!(within(rates[1], 400_000.0, 3.0), "other got {rates:?} units/s");
}

#[test]
fn a_throttled_thread_at_a_stash_rate_takes_exactly_the_refill_and_counts_each_refusal() {
    // A frozen clock, 400,000 units/s (a unit every 2.5 µs, stashes of 20 units): the
    // refusals of a thread with its stash empty go to the bucket alone, one look each.
    let clock = ManualClock::new();
    let g = gate(FAST, &clock);
    let h = g.group("fast").unwrap();
    assert_eq!(admit(&h, 500_000), 400_000, "the burst, exactly");
    for _ in 0..1_000 {
        match h.try_acquire(1.0) {
            Err(tollgate_limiter::AcquireError::Throttled { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_nanos(2_500), "one unit's refill")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // One stash's worth of refill: taken a unit at a time, since a unit and a batch do not
    // both fit; then a millisecond's, mostly through the stash. Exactly the refill, each time.
    clock.advance(Duration::from_micros(50));
    assert_eq!(admit(&h, 1_000), 20);
    clock.advance(Duration::from_millis(1));
    assert_eq!(admit(&h, 1_000), 400);
    let stats = h.stats();
    assert_eq!(stats.admitted, 400_420);
    assert_eq!(stats.throttled, 100_000 + 1_000 + 980 + 600);
}

#[test]
fn a_thread_juggling_many_groups_loses_no_units() {
    // More high-rate groups than a thread tracks at once (32), visited in turn: every visit
    // evicts another group's entry and its stash, which must go back to that group.
    let clock = ManualClock::new();
    let toml: String = (0..40).map(|i| format!("[groups.g{i}]\nlimit = 400000\nburst = 320\n")).collect();
    let g = gate(&toml, &clock);
    let handles: Vec<_> = (0..40).map(|i| g.group(&format!("g{i}")).unwrap()).collect();
    loop {
        let admitted = handles.iter().filter(|h| h.try_acquire(1.0).is_ok()).count();
        if admitted == 0 {
            break;
        }
    }
    for h in &handles {
        assert_eq!(h.stats().admitted, 320, "{}", h.name());
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// Whatever the costs and the pace, a stash only spends what the bucket handed out, so
    /// admissions never exceed `burst + rate × t`.
    #[test]
    fn stashes_never_lift_admission_above_the_bucket(
        steps in proptest::collection::vec((0.1f64..50.0, 0u64..200, 1usize..200), 1..40)
    ) {
        // 400,000 units/s with a burst of 320: stashes of 20 units, and a bound that binds.
        let clock = ManualClock::new();
        let g = gate("[groups.fast]\nlimit = 400000\nburst = 320\n", &clock);
        let h = g.group("fast").unwrap();
        let mut elapsed_s = 0.0;
        for (cost, micros, requests) in steps {
            for _ in 0..requests {
                let _ = h.try_acquire(cost);
            }
            clock.advance(Duration::from_micros(micros));
            elapsed_s += micros as f64 / 1e6;
            let admitted = h.stats().admitted_units;
            let most = 320.0 + 400_000.0 * elapsed_s;
            proptest::prop_assert!(admitted <= most + 1e-3, "admitted {admitted} > {most}");
        }
    }
}

#[test]
fn a_closed_group_admits_nothing_from_a_stash() {
    // `low` has the capacity to itself, then `high` (absolute priority) takes all of it.
    let clock = ManualClock::new();
    let g = gate(
        "[node]\ncapacity = 400000\n[groups.low]\npriority = \"low\"\n[groups.high]\npriority = \"high\"\n",
        &clock,
    );
    let (low, high) = (g.group("low").unwrap(), g.group("high").unwrap());
    for _ in 0..100 {
        admit(&low, 8_000);
        clock.advance(Duration::from_millis(10));
    }
    // One more request, with room in the bucket: the thread leaves with a full stash.
    clock.advance(Duration::from_millis(10));
    assert_eq!(admit(&low, 1), 1);
    let mut steps = 0;
    while g.stats("low").unwrap().allowance > 0.0 {
        admit(&high, 8_000);
        clock.advance(Duration::from_millis(10));
        steps += 1;
        assert!(steps < 1_000, "low kept an allowance: {:?}", g.stats("low"));
    }
    assert_eq!(admit(&low, 100), 0, "a closed group admitted from its stash");
}

/// Regression: `Tollgate::with_clock` turned a remote or store handle into an embedded one,
/// silently.
#[test]
fn with_clock_refuses_a_handle_that_is_not_embedded() {
    let (remote, _driver) = Tollgate::remote_driven(tollgate_limiter::RemoteOptions::default()).unwrap();
    assert_eq!(remote.mode(), "remote");
    let e = remote.with_clock(ManualClock::new()).unwrap_err();
    assert!(matches!(e, tollgate_limiter::BuildError::Unsupported { mode: "remote", .. }), "{e}");
    let embedded = gate("[groups.a]\nlimit = 1\n", &ManualClock::new());
    assert_eq!(embedded.with_clock(ManualClock::new()).unwrap().mode(), "embedded");
}

/// A tally keeps only the millionths beyond one unit per request (a cost of one is a single
/// add): the units read back are exact for costs of one, under one and over one, admitted,
/// refused and unthrottled, from one thread and from another.
#[test]
fn units_admitted_and_refused_add_up_exactly_whatever_the_cost() {
    let clock = ManualClock::new();
    let gate = gate("[groups.g]\nlimit = 10\n", &clock);
    let g = gate.group("g").unwrap();
    for cost in [1.0, 0.25, 2.5, 1.0] {
        g.try_acquire(cost).unwrap();
    }
    // 4.75 of the burst of 10 spent: 5.25 left, so these are refused.
    for cost in [6.0, 1.0 + 5.25, 7.125] {
        assert!(matches!(g.try_acquire(cost), Err(AcquireError::Throttled { .. })));
    }
    gate.unthrottled().try_acquire("g", 0.5).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            g.try_acquire(1.0).unwrap();
            assert!(g.try_acquire(20.0).is_err());
        });
    });
    let stats = g.stats();
    assert_eq!((stats.admitted, stats.throttled), (6, 3));
    assert_eq!(stats.admitted_units, 1.0 + 0.25 + 2.5 + 1.0 + 0.5 + 1.0);
    assert_eq!(stats.unthrottled_units, 0.5);
    assert_eq!(stats.throttled_units, 6.0 + 6.25 + 7.125);
}

/// Each thread keeps its own copy of the last group table it read by name: two limiters used
/// in turn on one thread never answer from each other's groups.
#[test]
fn two_limiters_used_in_turn_on_one_thread_keep_their_own_groups() {
    let clock = ManualClock::new();
    let a = gate("[groups.g]\nlimit = 10\nburst = 3\n", &clock);
    let b = gate("[groups.g]\nlimit = 10\nburst = 5\n", &clock);
    for _ in 0..3 {
        a.try_acquire("g", 1.0).unwrap();
        b.try_acquire("g", 1.0).unwrap();
    }
    assert!(a.try_acquire("g", 1.0).is_err(), "a's burst of 3 is spent");
    b.try_acquire("g", 1.0).unwrap();
    b.try_acquire("g", 1.0).unwrap();
    assert!(b.try_acquire("g", 1.0).is_err(), "b's burst of 5 is spent");
    assert_eq!((a.stats("g").unwrap().admitted, b.stats("g").unwrap().admitted), (3, 5));
    drop(a);
    // A limiter made after one is dropped is never taken for it.
    let c = gate("[groups.g]\nlimit = 10\nburst = 1\n", &clock);
    c.try_acquire("g", 1.0).unwrap();
    assert!(c.try_acquire("g", 1.0).is_err());
}

/// A permit taken by name borrows the limiter, not the table's map of the moment: names
/// added after it (each thousand replacing the map its thread had read it through) leave it
/// settling into the same group, and one made owned outlives the limiter.
#[test]
fn a_permit_by_name_outlives_every_later_name_and_an_owned_one_the_limiter() {
    let clock = ManualClock::new();
    let gate = gate("[node]\nmax_tracked_groups = 20000\n[groups.a]\nlimit = 1000\n", &clock);
    drop(gate.try_acquire("a", 1.0).expect("first use"));
    let permit = gate.try_acquire("a", 10.0).expect("within the burst");
    for i in 0..10_000 {
        drop(gate.try_acquire(&format!("tenant-{i}"), 1.0));
    }
    permit.settle(30.0).expect("a valid cost");
    assert_eq!(gate.stats("a").expect("used").consumed_units, 31.0);
    let owned = gate.try_acquire("a", 5.0).expect("admitted").into_owned();
    drop(gate);
    assert_eq!(owned.group(), "a");
    owned.settle(1.0).expect("the group outlives its limiter while a permit holds it");
}
