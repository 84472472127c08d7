//! Every scenario in `scenarios/` passes, as `tollgate sim` would run it (those in
//! `scenarios/scale/` are run by hand: see BENCHMARKS.md).

use std::path::PathBuf;

use tollgate_sim::{Scenario, output, run};

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../scenarios")
}

fn load(name: &str) -> Scenario {
    let path = scenarios_dir().join(format!("{name}.toml"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Scenario::parse(&src).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()))
}

#[test]
fn every_scenario_passes() {
    // The scenarios at the top: those under scale/ take a core for hours, run by hand.
    let mut names: Vec<String> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            (path.extension()? == "toml").then_some(())?;
            path.file_stem()?.to_str().map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 5, "scenarios/ holds {names:?}");
    for name in names {
        let s = load(&name);
        let outcome = run(&s, s.seed);
        let lines = output::phase_lines(&outcome);
        println!("{name}: {lines:?}");
        assert!(outcome.passed(), "{name}: {lines:?}");
    }
}

/// The learned-capacity scenario over 50 seeds: settled (the last 20 s of the first phase's
/// 40 s hold), the learned limit's peak to peak stays within 10 %, goodput at 90 % of the backend's best or more and latency within twice
/// its unloaded 80 ms, and the capacity learned (the limit over the latency, requests a second)
/// within 10 % of the true 100 on average; after the backend slows to half its speed, the
/// capacity learned over the 5 s from 5 s on averages within 10 % of the new 50, and goodput
/// from then on 90 % of it or more.
#[test]
fn a_learned_limit_converges_without_oscillating_across_50_seeds() {
    let s = load("learned-capacity");
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..4u64)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    (1..=50u64).filter(|seed| seed % 4 == t).map(|seed| run(s, seed)).collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(outcomes.len(), 50);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let mut broken = Vec::new();
    for o in &outcomes {
        let seed = o.seed;
        if !o.passed() {
            broken.push(format!("seed {seed}: {:?}", output::phase_lines(o)));
            continue;
        }
        let served = |from: usize, to: usize| -> Vec<tollgate_sim::world::Served> {
            o.timeline[from..to].iter().map(|t| t.served[0].expect("a queueing backend")).collect()
        };
        let first_end = o.phases[0].converged_s.unwrap() as usize;
        let settled = served(first_end - 20, first_end);
        let limits: Vec<f64> = settled.iter().map(|q| q.limit).collect();
        let (lo, hi) = limits.iter().fold((f64::MAX, 0.0f64), |(lo, hi), l| (lo.min(*l), hi.max(*l)));
        let goodput = mean(&settled.iter().map(|q| q.goodput).collect::<Vec<_>>());
        let latency = mean(&settled.iter().map(|q| q.latency_ms).collect::<Vec<_>>());
        let second_end = first_end + o.phases[1].converged_s.unwrap() as usize;
        let slowed = served(first_end + 5, second_end);
        let slowed_goodput = mean(&slowed.iter().map(|q| q.goodput).collect::<Vec<_>>());
        let capacity = mean(&settled.iter().map(|q| q.capacity).collect::<Vec<_>>());
        let followed = mean(&slowed[..5].iter().map(|q| q.capacity).collect::<Vec<_>>());
        let line = format!(
            "seed {seed}: limit {lo:.2} to {hi:.2}, capacity {capacity:.1}, goodput {goodput:.1}, \
             latency {latency:.0} ms; slowed: capacity {followed:.1}, goodput {slowed_goodput:.1}"
        );
        println!("{line}");
        if (hi - lo) / mean(&limits) >= 0.1
            || goodput < 90.0
            || latency > 160.0
            || slowed_goodput < 45.0
            || (capacity - 100.0).abs() > 10.0
            || (followed - 50.0).abs() > 5.0
        {
            broken.push(line);
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn fdb_simple_converges_within_15_simulated_seconds() {
    let s = load("fdb-simple");
    let outcome = run(&s, s.seed);
    let t = outcome.phases[0].converged_s.expect("converged");
    assert!(t <= 15.0, "took {t} s");
}

#[test]
fn active_throttling_holds_without_oscillating_once_converged() {
    let mut s = load("fdb-active-throttling");
    s.phases[0].hold_checks = 300;
    s.phases[0].timeout = std::time::Duration::from_secs(900);
    let outcome = run(&s, s.seed);
    assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
    // From 40 s on: the target within 3% of 8.333 tps, every server within 2% of utilisation 1.
    for sample in &outcome.timeline[40..] {
        let target = sample.groups[0].target_rps.unwrap();
        assert!((target - 8.333).abs() < 0.03 * 8.333, "t={} target {target}", sample.t);
        for u in &sample.utilisation {
            assert!((u - 1.0).abs() < 0.02, "t={} utilisation {u}", sample.t);
        }
    }
}

#[test]
fn a_run_replays_exactly_from_its_seed_and_passes_with_others() {
    let s = load("couchbase-fairness");
    assert_eq!(run(&s, 9), run(&s, 9));
    for seed in [1, 2, 3] {
        assert!(run(&s, seed).passed(), "seed {seed}");
    }
}

#[test]
fn a_debt_blocks_one_group_and_is_paid_over_time_by_the_other() {
    let s = load("tidb-debt");
    let outcome = run(&s, s.seed);
    assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
    let admitted =
        |g: usize| -> Vec<f64> { outcome.timeline.iter().map(|t| t.groups[g].admitted_units).collect() };
    let (blocking, paying) = (admitted(0), admitted(1));
    // The settlement lands when phase 2 starts: the second after it is the first affected.
    let at = outcome.phases[0].converged_s.expect("phase 1 passed") as usize;
    assert!(blocking[at..at + 4].iter().all(|&u| u == 0.0), "blocking: {blocking:?}");
    assert!(blocking[at + 5..at + 10].iter().all(|&u| (u - 100.0).abs() <= 2.0), "blocking: {blocking:?}");
    assert!(paying[at..at + 10].iter().all(|&u| (u - 60.0).abs() <= 2.0), "paying: {paying:?}");
    assert!(paying[at + 11..at + 14].iter().all(|&u| (u - 100.0).abs() <= 2.0), "paying: {paying:?}");
}

#[test]
fn the_saturation_knobs_move_the_equilibrium() {
    // A simulated backend's queue is 800e6 bytes at its capacity. With the target there, the
    // loop holds it at utilisation 1; with a target of half that, at utilisation 0.5.
    for (target, utilisation) in [(800e6, 1.0), (400e6, 0.5)] {
        let mut s = load("fdb-active-throttling");
        s.controller.queue_target_bytes = target;
        s.controller.queue_spring_bytes = target / 4.0;
        s.phases.truncate(1);
        s.phases[0].expects.clear();
        s.phases[0].hold_checks = 120;
        s.phases[0].timeout = std::time::Duration::from_secs(120);
        let outcome = run(&s, s.seed);
        let last = outcome.timeline.last().unwrap();
        for u in &last.utilisation {
            assert!((u - utilisation).abs() < 0.03 * utilisation, "target {target}: utilisation {u}");
        }
    }
}

#[test]
fn the_two_limiting_laws_split_a_saturated_backend_their_own_way() {
    use tollgate_model::engine::LimitingLaw;
    for (law, gold, bronze, utilisation) in
        [(LimitingLaw::Rate, 100.0, 100.0, 1.0), (LimitingLaw::Quota, 120.0, 50.0, 0.85)]
    {
        let mut s = load("fdb-limiting-laws");
        s.controller.limiting_law = law;
        s.phases[0].expects.clear();
        s.phases[0].hold_checks = 90;
        let outcome = run(&s, s.seed);
        let last = outcome.timeline.last().unwrap();
        let admitted = |name: &str| {
            let i = outcome.groups.iter().position(|g| g.as_str() == name).unwrap();
            last.groups[i].admitted_units
        };
        let (g, b) = (admitted("gold"), admitted("bronze"));
        assert!((g - gold).abs() <= 2.0 && (b - bronze).abs() <= 2.0, "{law:?}: gold {g}, bronze {b}");
        assert!(
            (last.utilisation[0] - utilisation).abs() < 0.02,
            "{law:?}: utilisation {}",
            last.utilisation[0]
        );
    }
}

/// Regression: with a few transactions a second and two saturated zones the target swung by ±20 %
/// for the whole run (a backend dropping in and out of the limiting threshold, and
/// FoundationDB's slope of −3 turning each whole transaction of dither into a jump).
#[test]
fn low_rates_settle_within_five_percent() {
    let s = load("fdb-low-rate");
    let outcome = run(&s, s.seed);
    assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
    let settled = outcome.phases[0].converged_s.unwrap() as usize - 120;
    for sample in &outcome.timeline[settled..] {
        let target = sample.groups[0].target_rps.unwrap();
        assert!((target - 1.6667).abs() <= 0.05 * 1.6667, "t={} target {target}", sample.t);
    }
}

/// After each shift of the convergence scenarios, the rate law settles within 5 % sooner than
/// a plain multiplicative law (which multiplies its previous limit by the same ratio), and
/// within 15 simulated seconds.
#[test]
fn the_rate_law_settles_sooner_than_a_plain_multiplicative_one() {
    use tollgate_model::engine::LimitingLaw;
    for name in ["converge-demand-step", "converge-quota-change", "converge-capacity-change"] {
        let settled = |law| {
            let mut s = load(name);
            s.controller.limiting_law = law;
            let outcome = run(&s, s.seed);
            assert!(outcome.phases[0].passed, "{name} under {law:?}: no starting point");
            let hold = f64::from(s.phases[1].hold_checks);
            outcome.phases.get(1).and_then(|p| p.converged_s).map(|c| c - hold)
        };
        let rate = settled(LimitingLaw::Rate).unwrap_or_else(|| panic!("{name}: the rate law never settled"));
        assert!(rate <= 15.0, "{name}: the rate law took {rate} s");
        match settled(LimitingLaw::Multiplicative) {
            Some(m) => assert!(rate < m, "{name}: rate law {rate} s, multiplicative {m} s"),
            None => println!("{name}: rate law {rate} s, the multiplicative law never settled"),
        }
    }
}

/// Backends reporting between ticks (`report_ms`): one newly saturated gets a tick at once, as
/// in the server, so the demand step is limited before the tick's turn; with reports at the
/// ticks only, every tick keeps its turn. Either way the scenario passes, and no second has
/// more than two ticks.
#[test]
fn a_backend_newly_saturated_between_ticks_gets_a_tick_at_once() {
    use std::collections::BTreeMap;
    use std::time::Duration;
    use tollgate_model::engine::TraceEvent;
    let ticks = |report_every: Option<Duration>, folding_s: f64| {
        let mut s = load("converge-demand-step");
        s.controller.report_every = report_every;
        for b in &mut s.backends {
            b.folding_s = folding_s;
        }
        // Each tick's time, and whether it limited the group.
        let mut seen: Vec<(f64, bool)> = Vec::new();
        let mut sink = |e: TraceEvent| {
            if let TraceEvent::Rate(r) = e {
                seen.push((r.t, r.limiting.is_some()));
            }
        };
        let outcome = tollgate_sim::run::run_traced(&s, s.seed, Some(&mut sink));
        assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
        seen
    };
    let off_turn = |t: f64| (t - t.round()).abs() > 1e-6;
    let at_ticks = ticks(None, 10.0);
    assert!(at_ticks.iter().all(|&(t, _)| !off_turn(t)), "{at_ticks:?}");
    let between = ticks(Some(Duration::from_millis(250)), 10.0);
    let first_limited = between.iter().find(|(_, limited)| *limited).expect("limited");
    assert!(off_turn(first_limited.0), "limited at once, not at a tick's turn: {between:?}");
    let mut per_second: BTreeMap<u64, u32> = BTreeMap::new();
    for &(t, _) in &between {
        *per_second.entry(t.floor() as u64).or_default() += 1;
    }
    assert!(per_second.values().all(|&n| n <= 2), "{per_second:?}");
    let first_at_ticks = at_ticks.iter().find(|(_, limited)| *limited).expect("limited");
    // As the server's reporter has it by default: every 250 ms, folded over 1 s.
    let reporter = ticks(Some(Duration::from_millis(250)), 1.0);
    let first_reporter = reporter.iter().find(|(_, limited)| *limited).expect("limited");
    println!(
        "first limited at {} s with reports every 250 ms, at {} s with reports at the ticks, at {} s \
         with reports every 250 ms folded over 1 s",
        first_limited.0, first_at_ticks.0, first_reporter.0
    );
    assert!(first_reporter.0 < first_limited.0, "{} against {}", first_reporter.0, first_limited.0);
    assert!(first_limited.0 < first_at_ticks.0, "{} against {}", first_limited.0, first_at_ticks.0);
}

/// A group held at its limit with work queued, its limit lifted: it grows into the room its
/// backend has instead of sending what it queued at once. With the backend reporting as the
/// server's reporter does (every 250 ms, folded over 1 s, so that a burst shows), the
/// backend's utilisation after the lift stays below 1.1; the work queued under the limit
/// (about 60,000 units, a minute of the backend) used to go at once, 5.3 times its capacity.
#[test]
fn a_lifted_limit_fills_the_backend_without_releasing_the_queue_at_once() {
    use std::time::Duration;
    let mut s = load("converge-quota-change");
    s.controller.report_every = Some(Duration::from_millis(250));
    for b in &mut s.backends {
        b.folding_s = 1.0;
    }
    let outcome = run(&s, s.seed);
    assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
    let lifted = outcome.phases[0].converged_s.expect("held at its limit first");
    let peak = outcome
        .timeline
        .iter()
        .filter(|sample| sample.t > lifted)
        .flat_map(|sample| sample.utilisation.iter().copied())
        .fold(0.0, f64::max);
    println!("peak utilisation after the lift {peak:.3}");
    assert!(peak < 1.1, "peak utilisation {peak}");
    // Settled at the backend's capacity at the first tick after the lift (phases count their
    // time from their start).
    let settled = outcome.phases[1].converged_s.expect("settled") - f64::from(s.phases[1].hold_checks);
    assert!(settled <= 1.0, "settled {settled} s after the lift");
}

/// A small tenant lifted beside a big one takes the room its backend has at the next tick (its
/// 100 and the 4,900 the backend has left), not a multiple of its own small load, and its
/// queue does not push the backend past its capacity.
#[test]
fn a_small_tenant_lifted_beside_a_big_one_takes_the_room_at_once() {
    let s = load("headroom-small-lift");
    let outcome = run(&s, s.seed);
    assert!(outcome.passed(), "{:?}", output::phase_lines(&outcome));
    let a = outcome.groups.iter().position(|g| g.as_str() == "a").expect("group a");
    let lifted = outcome.phases[0].converged_s.expect("held at its limit first");
    let after: Vec<_> = outcome.timeline.iter().filter(|sample| sample.t > lifted).collect();
    let first = after[0].groups[a].target_units.expect("held, not let go");
    assert!((4500.0..=5100.0).contains(&first), "the first tick after the lift: {first}");
    let peak = after.iter().flat_map(|sample| sample.utilisation.iter().copied()).fold(0.0, f64::max);
    println!("first target after the lift {first:.0}, peak utilisation {peak:.3}");
    assert!(peak < 1.1, "peak utilisation {peak}");
}

/// Regression: under the default knobs saturation limiting acted only on FoundationDB's shape (costs
/// in bytes, backends in two zones or more); a count-model tenant at twice its one backend's
/// capacity stayed at utilisation 1.99. With the defaults, in each cost model, the backend is
/// within 5 % of utilisation 1 from the fifth simulated second on.
#[test]
fn the_default_knobs_hold_one_backend_in_one_zone_at_its_capacity_in_every_cost_model() {
    for model in ["count", "ru", "fdb"] {
        let s = load(&format!("saturation-defaults-{model}"));
        assert_eq!(s.controller.limiting_threshold, 0.0, "{model}: the default threshold");
        assert_eq!(s.controller.ignore_worst_zones, 1, "{model}: the default zones rule");
        let outcome = run(&s, s.seed);
        assert!(outcome.passed(), "{model}: {:?}", output::phase_lines(&outcome));
        let from = outcome.timeline.iter().position(|t| t.t >= 5.0).unwrap();
        let first = outcome.timeline[0].utilisation[0];
        assert!(first > 1.2, "{model}: the tenant drives the backend past capacity at first ({first})");
        for sample in &outcome.timeline[from..] {
            let u = sample.utilisation[0];
            assert!((u - 1.0).abs() <= 0.05, "{model}: t={} utilisation {u}", sample.t);
        }
    }
}

/// Saturation with the default knobs cuts the busiest first, over 50 seeds each: in the count
/// model a tenant asking a quarter of a saturated backend is served all it asks while the
/// noisy one takes the rest (the backend held at capacity); in request units, with requests
/// asking 1 RU up front and settling at 5, the well-behaved tenant is served its 1,000 RU a
/// second in full from the fifth second on and the backend averages utilisation 1 over the
/// hold. Under the rate law
/// alone both tenants were cut by the same ratio, and in request units the well-behaved one
/// (its demand counted at a fifth of what it cost) was starved.
#[test]
fn saturation_cuts_the_busiest_first_over_fifty_seeds() {
    for (name, small) in [("saturation-fair-count", "small"), ("saturation-fair-ru", "polite")] {
        let s = load(name);
        for seed in 1..=50 {
            let outcome = run(&s, seed);
            assert!(outcome.passed(), "{name} seed {seed}: {:?}", output::phase_lines(&outcome));
            let at = outcome.groups.iter().position(|g| g.as_str() == small).expect("the small tenant");
            let settled = outcome.phases[0].converged_s.expect("passed") - f64::from(s.phases[0].hold_checks);
            // From the fifth second at the earliest: the settled cost per unit asked is learnt
            // over the first reports.
            let hold: Vec<_> = outcome.timeline.iter().filter(|t| t.t > settled.max(5.0)).collect();
            assert!(!hold.is_empty(), "{name} seed {seed}: a hold");
            for sample in &hold {
                assert!(
                    !sample.groups[at].busy,
                    "{name} seed {seed} t={}: the small tenant is not cut",
                    sample.t
                );
            }
            let mean = hold.iter().map(|t| t.utilisation[0]).sum::<f64>() / hold.len() as f64;
            assert!((mean - 1.0).abs() <= 0.05, "{name} seed {seed}: mean utilisation {mean}");
        }
    }
}

/// The load on a group moving from three clients (three controllers' front ends) to one, then
/// back over all three: from two seconds after the move the one admits at least 97 % of the
/// limit; while all three ask, the group admits 97-103 % of it in every second once the first
/// grants are out (and the busy one's banked burst is spent, when the load spreads again);
/// and never more than the limit and one burst (a second of it) in any second. With the demand averaged over 1 s, as it was, the
/// one admitted 56 % in the third second and 98 % only in the sixth.
#[test]
fn shares_follow_the_load_to_one_front_end_within_two_seconds() {
    let s = load("shares-follow-load");
    let o = run(&s, s.seed);
    assert!(o.passed(), "{:?}", output::phase_lines(&o));
    // Sample `i` is the second from `i` to `i + 1` s.
    let admitted: Vec<f64> = o.timeline.iter().map(|x| x.groups[0].admitted_units).collect();
    let moved = o.phases[0].converged_s.expect("phase 1") as usize;
    let back = moved + o.phases[1].converged_s.expect("phase 2") as usize;
    let within = |from: usize, to: usize| admitted[from..to].iter().all(|a| (970.0..=1030.0).contains(a));
    println!("moved at {moved} s, back at {back} s: {admitted:?}");
    assert!(admitted.iter().all(|&a| a <= 2000.0), "{admitted:?}");
    assert!(within(3, moved), "asked of all: {admitted:?}");
    assert!(within(moved + 2, back), "asked of one: {admitted:?}");
    assert!(within(back + 4, admitted.len()), "spread again: {admitted:?}");
}

/// The scenarios run by hand still read: each names the shape it simulates.
#[test]
fn the_scenarios_at_scale_read() {
    for e in std::fs::read_dir(scenarios_dir().join("scale")).unwrap() {
        let path = e.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        let s = Scenario::parse(&src).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()));
        let pairs: usize = s.clients.iter().map(|c| 1 + c.also.len()).sum();
        assert!(s.clients.len() >= 100_000 && pairs >= 1_000_000, "{}", path.display());
    }
}

/// Work acts only when a request arrives or waits, the rest counted up when it next acts: over
/// 20 s every client admits what it asks, slow or fast, in each class and each of its groups.
#[test]
fn clients_admit_what_they_ask_at_every_rate() {
    let src = "name = \"rates\"\n[[backend]]\nname = \"b\"\ncapacity = 1e9\nzone = \"z\"\n\
        [[client]]\ngroup = \"slow\"\nrate = 0.3\n\
        [[client]]\ngroup = \"mixed\"\nrate = 7.0\nclasses = { critical = 0.25, sheddable = 0.25 }\n\
        [[client]]\ngroup = \"many\"\nspread = 4\ngroups = 4\nrate = 250.0\n\
        [[phase]]\ntimeout_s = 20\nhold_s = 100\n\
        [[phase.expect]]\ngroup = \"slow\"\nmetric = \"admitted_rps\"\nvalue = 1000\n";
    let s = Scenario::parse(src).unwrap();
    let outcome = run(&s, 3);
    let total = |name: &str| -> f64 {
        let g = outcome.groups.iter().position(|n| n.as_str() == name).unwrap();
        outcome.timeline.iter().map(|t| t.groups[g].admitted_rps).sum()
    };
    let seconds = outcome.timeline.len() as f64;
    assert_eq!(seconds, 20.0);
    // Each class's arrivals start at a random phase: within a request of the rate, per class.
    assert!((total("slow") - 0.3 * seconds).abs() <= 1.0, "slow: {}", total("slow"));
    assert!((total("mixed") - 7.0 * seconds).abs() <= 3.0, "mixed: {}", total("mixed"));
    for g in 0..4 {
        let name = format!("many-{g}");
        // The first grant comes with the first exchange; what waited is admitted then.
        assert!((total(&name) - 250.0 * seconds).abs() <= 1.0, "{name}: {}", total(&name));
    }
}
