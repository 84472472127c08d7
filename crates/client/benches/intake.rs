//! Many tenants by name: an embedded limiter configured with N groups, each asked for once
//! in turn (taking every one in), then three more rounds (the steady state, reallocations
//! included).
//!
//! `cargo bench -p tollgate-limiter --bench intake -- --bench` (10,000, 40,000 and 100,000
//! groups; without `--bench`, as `cargo test --all-targets` runs it, 1,000 only).
//!
//! A program rather than a criterion bench: one intake is one measurement, and what it shows
//! is how the cost grows with the groups.

use std::io::Write;

use tollgate_limiter::Tollgate;
use tollgate_model::time::ManualClock;

fn run(groups: usize) {
    let names: Vec<String> = (0..groups).map(|i| format!("tenant-{i:06}")).collect();
    let mut toml = format!("[node]\nmax_tracked_groups = {}\n", groups + 10);
    for name in &names {
        toml.push_str(&format!("[groups.\"{name}\"]\nlimit = 10000\n"));
    }
    let gate = Tollgate::from_toml(&toml).expect("a valid configuration");
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
    let started = std::time::Instant::now();
    let mut refused = 0;
    for name in &names {
        refused += usize::from(gate.try_acquire(name, 1.0).is_err());
    }
    let intake = started.elapsed();
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    for _ in 0..3 {
        for name in &names {
            refused += usize::from(gate.try_acquire(name, 1.0).is_err());
        }
    }
    let per_call = started.elapsed().as_nanos() as f64 / (3 * groups) as f64;
    let pass = pass_cost(&toml, &names);
    // A reader that went away (`… | head`) ends the output, not the program with a panic.
    let _ = writeln!(
        std::io::stdout(),
        "{groups} groups: taken in one by one in {:.1} ms; then {per_call:.0} ns a call by name ({refused} refused); a reallocation with all of them in use {:.1} ms (median of 5)",
        intake.as_secs_f64() * 1e3,
        pass * 1e3
    );
}

/// Seconds one reallocation takes with every group in use (the median of five): on a manual
/// clock, so that the call that runs it is known (the first after the interval), every group
/// used in each interval.
fn pass_cost(toml: &str, names: &[String]) -> f64 {
    let clock = ManualClock::new();
    let gate =
        Tollgate::from_toml(toml).and_then(|g| g.with_clock(clock.clone())).expect("a valid configuration");
    let interval = gate.node().realloc_interval;
    let mut times = Vec::new();
    for round in 0..7 {
        for name in &names[1..] {
            let _ = gate.try_acquire(name, 1.0);
        }
        clock.advance(interval);
        #[allow(clippy::disallowed_methods)]
        let started = std::time::Instant::now();
        let _ = gate.try_acquire(&names[0], 1.0);
        // The first two take the groups in.
        if round >= 2 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let quick = std::env::args().all(|a| a != "--bench");
    let sizes: &[usize] = if quick { &[1000] } else { &[10_000, 40_000, 100_000] };
    for &n in sizes {
        run(n);
    }
}
