//! A group's handle at a realistic rate, Tollgate beside governor, in alternating rounds.
//!
//! `cargo run --release --manifest-path benches/peers/Cargo.toml --example rate_rounds -- RATE [ROUNDS]`
//!
//! One group limited to RATE units/s with a one-second burst, called in a tight loop on one
//! thread: the burst goes at once, then most calls are refusals, as for a throttled tenant.
//! Rounds of 20,000,000 calls alternate `GroupHandle::try_acquire(1.0)` and governor's
//! `check_n(1)` on the same quota, so that a slower stretch of a shared machine touches both
//! sides of the ratios it spans; the medians are printed. The criterion bench (`rate_*`)
//! measures the same cases one after the other. Also a loop to profile (`perf record`).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use governor::{Quota, RateLimiter};
use tollgate_limiter::Tollgate;

const CALLS: usize = 20_000_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f` over `CALLS` calls, and how many were admitted.
fn round(mut f: impl FnMut() -> bool) -> (f64, usize) {
    let mut admitted = 0;
    #[allow(clippy::disallowed_methods)] // a load program measures wall time
    let started = Instant::now();
    for _ in 0..CALLS {
        admitted += usize::from(f());
    }
    (started.elapsed().as_nanos() as f64 / CALLS as f64, admitted)
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>().expect("RATE [ROUNDS]: whole numbers"));
    let rate = args.next().unwrap_or(10_000).max(1);
    let rounds = args.next().unwrap_or(7).max(1);
    let gate = Tollgate::from_toml(&format!("[groups.g]\nlimit = {rate}\n")).expect("a valid configuration");
    let handle = gate.group("g").expect("a configured group");
    let lim = RateLimiter::direct(Quota::per_second(NonZeroU32::new(rate).expect("not zero")));
    let one = NonZeroU32::new(1).expect("not zero");
    let (mut tollgate, mut governor, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (t, t_admitted) = round(|| handle.try_acquire(black_box(1.0)).is_ok());
        let (g, g_admitted) = round(|| matches!(lim.check_n(black_box(one)), Ok(Ok(()))));
        println!(
            "round {r}: tollgate {t:.2} ns ({t_admitted} admitted), governor {g:.2} ns ({g_admitted} admitted), ratio {:.3}",
            t / g
        );
        tollgate.push(t);
        governor.push(g);
        ratios.push(t / g);
    }
    println!(
        "rate {rate} units/s, medians of {rounds} rounds: tollgate {:.2} ns, governor {:.2} ns, ratio {:.3}",
        median(tollgate),
        median(governor),
        median(ratios)
    );
}
