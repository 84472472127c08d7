//! Tollgate's admission beside its peers on the same limit, at the rates real groups run at.
//!
//! `cargo bench --manifest-path benches/peers/Cargo.toml`
//!
//! - `rate_10k`, `rate_100k` and `rate_1000k`: one group at 10,000, 100,000 and 1,000,000
//!   units/s (the last fast enough for a thread's stash) with a one-second burst, called in a
//!   tight loop, so that calls are admitted until the burst is spent and refused after (most
//!   calls are refusals, as for a throttled tenant). Tollgate's handle
//!   (`GroupHandle::try_acquire`) beside governor's `check_n` and limitador's in-memory
//!   `check_rate_limited_and_update` (a fixed window of one second: a per-request counter).
//! - `by_name_1`, `by_name_1000`, `by_name_10000`, `by_name_100000`: the same limit per key,
//!   keys taken in turn:
//!   `Tollgate::try_acquire(name, 1)` beside governor's keyed limiter (`check_key_n`, its
//!   default DashMap store) and limitador with the key as a variable.
//!
//! One thread. Each case reports the time per call, admitted or refused.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use limitador::limit::{Context, Expression, Limit};
use tollgate_limiter::Tollgate;

fn gate(groups: &[String], rate: u32) -> Tollgate {
    // Enough room for every key as its own group.
    let mut toml = format!("[node]\nmax_tracked_groups = {}\n", groups.len() + 10);
    for g in groups {
        toml.push_str(&format!("[groups.\"{g}\"]\nlimit = {rate}\n"));
    }
    Tollgate::from_toml(&toml).unwrap()
}

fn rates(c: &mut Criterion) {
    for rate in [10_000u32, 100_000, 1_000_000] {
        let mut g = c.benchmark_group(format!("rate_{}k", rate / 1000));
        let gate = gate(&["g".to_string()], rate);
        let handle = gate.group("g").unwrap();
        g.bench_function("tollgate_group_handle", |b| {
            b.iter(|| black_box(handle.try_acquire(black_box(1.0)).is_ok()))
        });
        let lim = RateLimiter::direct(Quota::per_second(NonZeroU32::new(rate).unwrap()));
        let one = NonZeroU32::new(1).unwrap();
        g.bench_function("governor_check_n", |b| {
            b.iter(|| black_box(matches!(lim.check_n(black_box(one)), Ok(Ok(())))))
        });
        let limitador = limitador::RateLimiter::new(10_000);
        limitador.add_limit(Limit::new("ns", u64::from(rate), 1, [], []));
        let ns = "ns".into();
        let ctx = Context::default();
        g.bench_function("limitador_memory", |b| {
            b.iter(|| black_box(limitador.check_rate_limited_and_update(&ns, &ctx, 1).unwrap().limited))
        });
        g.finish();
    }
}

fn by_name(c: &mut Criterion) {
    const RATE: u32 = 10_000;
    for keys in [1usize, 1000, 10_000, 100_000] {
        let names: Vec<String> = (0..keys).map(|i| format!("tenant-{i:06}")).collect();
        let mut g = c.benchmark_group(format!("by_name_{keys}"));
        let gate = gate(&names, RATE);
        // Every key used once before measuring, as a warm service's would be.
        for n in &names {
            let _ = gate.try_acquire(n, 1.0);
        }
        let mut i = 0usize;
        g.bench_function("tollgate_by_name", |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                black_box(gate.try_acquire(black_box(&names[i]), 1.0).is_ok())
            })
        });
        let keyed = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).unwrap()));
        for n in &names {
            let _ = keyed.check_key(n);
        }
        let one = NonZeroU32::new(1).unwrap();
        let mut i = 0usize;
        g.bench_function("governor_check_key_n", |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                black_box(matches!(keyed.check_key_n(black_box(&names[i]), one), Ok(Ok(()))))
            })
        });
        let limitador = limitador::RateLimiter::new(keys as u64 + 10);
        let tenant = Expression::parse("tenant").unwrap();
        limitador.add_limit(Limit::new("ns", u64::from(RATE), 1, [], [tenant]));
        let ns = "ns".into();
        // The contexts made up front: only the decision is measured.
        let contexts: Vec<Context> =
            names.iter().map(|n| Context::from(HashMap::from([("tenant".to_string(), n.clone())]))).collect();
        let mut i = 0usize;
        g.bench_function("limitador_memory", |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                black_box(limitador.check_rate_limited_and_update(&ns, &contexts[i], 1).unwrap().limited)
            })
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = rates, by_name
}
criterion_main!(benches);
