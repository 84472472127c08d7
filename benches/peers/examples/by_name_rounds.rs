//! Admission by name, Tollgate beside governor, in alternating rounds.
//!
//! `cargo run --release --manifest-path benches/peers/Cargo.toml --example by_name_rounds -- KEYS [ROUNDS] [shuffled] [rate=UNITS]`
//!
//! The same limit (10,000 units/s, or `rate=`) for each of KEYS names, every name used once before, then
//! rounds of 3,000,000 calls taking the names in turn (in the order they were made, or with
//! `shuffled` in a scrambled order, the same for both: requests of many tenants come in no
//! order, and names taken in the order they were made find governor's keys, allocated one
//! after the other, where the processor's prefetcher expects them): one round of `Tollgate::try_acquire`,
//! one of governor's keyed `check_key_n` (its default DashMap store), and again. Each round's
//! pair gives a ratio, so a machine that slows down for a while (a shared VM does) slows both
//! sides of the ratios it touches; the medians are printed. The criterion bench (`by_name_*`)
//! measures the same cases one after the other instead.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use governor::{Quota, RateLimiter};
use tollgate_limiter::Tollgate;

const CALLS: usize = 3_000_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f` over `CALLS` calls.
fn round(mut f: impl FnMut()) -> f64 {
    #[allow(clippy::disallowed_methods)] // a load program measures wall time
    let started = Instant::now();
    for _ in 0..CALLS {
        f();
    }
    started.elapsed().as_nanos() as f64 / CALLS as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shuffled = args.iter().any(|a| a == "shuffled");
    let rate: u32 = args
        .iter()
        .find_map(|a| a.strip_prefix("rate="))
        .map_or(10_000, |r| r.parse().expect("rate=UNITS: a whole number of units/s"))
        .max(1);
    let mut numbers = args
        .iter()
        .filter(|a| *a != "shuffled" && !a.starts_with("rate="))
        .map(|a| a.parse::<usize>().expect("KEYS [ROUNDS]: whole numbers"));
    let keys = numbers.next().unwrap_or(10_000).max(1);
    let rounds = numbers.next().unwrap_or(7).max(1);
    let names: Vec<String> = (0..keys).map(|i| format!("tenant-{i:06}")).collect();
    let mut toml = format!("[node]\nmax_tracked_groups = {}\n", keys + 10);
    for g in &names {
        toml.push_str(&format!("[groups.\"{g}\"]\nlimit = {rate}\n"));
    }
    let gate = Tollgate::from_toml(&toml).expect("a valid configuration");
    for n in &names {
        let _ = gate.try_acquire(n, 1.0);
    }
    let keyed = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(rate).expect("not zero")));
    for n in &names {
        let _ = keyed.check_key(n);
    }
    let one = NonZeroU32::new(1).expect("not zero");
    // The order the names are taken in: as made, or scrambled (xorshift, a fixed seed).
    let mut order: Vec<usize> = (0..keys).collect();
    if shuffled {
        let mut x = 88_172_645_463_325_252u64;
        for i in (1..keys).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    let names: Vec<&String> = order.iter().map(|&i| &names[i]).collect();
    let (mut tollgate, mut governor, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    for _ in 0..rounds {
        let t = round(|| {
            i = (i + 1) % keys;
            black_box(gate.try_acquire(black_box(names[i]), 1.0).is_ok());
        });
        let g = round(|| {
            j = (j + 1) % keys;
            black_box(matches!(keyed.check_key_n(black_box(names[j]), one), Ok(Ok(()))));
        });
        tollgate.push(t);
        governor.push(g);
        ratios.push(t / g);
    }
    println!(
        "{keys} keys{}, {rate} units/s each, {rounds} rounds: Tollgate {:.1} ns, governor {:.1} ns, ratio {:.2} (medians)",
        if shuffled { " shuffled" } else { "" },
        median(tollgate),
        median(governor),
        median(ratios)
    );
}
