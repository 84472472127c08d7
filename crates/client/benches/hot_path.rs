//! The admission hot path, side by side with `governor` on the same quota.
//!
//! `cargo bench -p tollgate-limiter --bench hot_path`
//!
//! Every limiter is set to about 4.29 billion units/s with an equal burst (governor's largest
//! quota), so every call finds tokens and the admit path is what is measured. At that rate
//! a handle admits mostly from its thread's stash; the `without_stash` case uses a burst
//! too small for one, so every call reads the clock and updates the shared bucket (one
//! thread only: with two, a burst that small refuses a thread whose clock read is a few
//! tens of nanoseconds behind the other's).
//! Multi-threaded cases report the time per call seen by each of the two threads running
//! at once.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_limiter::Tollgate;
use tollgate_limiter::clock::{CoarseClock, MonotonicClock};
use tollgate_model::bucket::Bucket;
use tollgate_model::time::Clock;

const RATE: u32 = u32::MAX;

/// Groups `a` and `b` on governor's quota; `small_burst` at the same rate with a burst of 200
/// units, too small for a thread's stash, so every admission goes to the shared bucket.
fn settings() -> tollgate_model::config::Config {
    tollgate_model::config::Config::parse(&format!(
        "[groups.a]\nlimit = {RATE}\n[groups.b]\nlimit = {RATE}\n[groups.small_burst]\nlimit = {RATE}\nburst = 200\n"
    ))
    .unwrap()
}

/// The embedded limiter on its default clock (the CPU's time-stamp counter).
fn gate() -> Tollgate {
    Tollgate::embedded(settings()).unwrap()
}

/// The embedded limiter on the 1 ms coarse clock.
fn coarse_gate() -> Tollgate {
    Tollgate::builder().config(settings()).clock(CoarseClock::new()).build().unwrap()
}

fn governor_limiter() -> governor::DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(NonZeroU32::new(RATE).unwrap()))
}

/// Runs `op` on two threads at once, `iters` times each; returns the wall time.
fn two_threads<A, B>(iters: u64, a: A, b: B) -> Duration
where
    A: Fn() + Send + Sync,
    B: Fn() + Send + Sync,
{
    let barrier = Barrier::new(2);
    let run = |op: &(dyn Fn() + Sync)| {
        barrier.wait();
        #[allow(clippy::disallowed_methods)] // a benchmark measures wall time
        let start = Instant::now();
        for _ in 0..iters {
            op();
        }
        start.elapsed()
    };
    std::thread::scope(|s| {
        let ha = s.spawn(|| run(&a));
        let hb = s.spawn(|| run(&b));
        ha.join().unwrap().max(hb.join().unwrap())
    })
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire/one_thread");
    let gate = gate();
    let handle = gate.group("a").unwrap();
    g.bench_function("tollgate_group_handle", |b| {
        b.iter(|| black_box(handle.try_acquire(black_box(1.0)).is_ok()))
    });
    let direct = gate.group("small_burst").unwrap();
    g.bench_function("tollgate_group_handle_without_stash", |b| {
        b.iter(|| black_box(direct.try_acquire(black_box(1.0)).is_ok()))
    });
    g.bench_function("tollgate_by_name", |b| {
        b.iter(|| black_box(gate.try_acquire(black_box("a"), 1.0).is_ok()))
    });
    let clock = MonotonicClock::new();
    let bucket = Bucket::new(f64::from(RATE), f64::from(RATE), clock.now());
    g.bench_function("tollgate_core_bucket", |b| {
        b.iter(|| black_box(bucket.try_acquire(black_box(1.0), clock.now()).is_ok()))
    });
    // The parts: the clock read alone, and the bucket alone at a given time.
    g.bench_function("part_clock_read", |b| b.iter(|| black_box(clock.now())));
    let mut t = clock.now().0;
    g.bench_function("part_bucket_at_given_time", |b| {
        b.iter(|| {
            t += 1;
            black_box(bucket.try_acquire(black_box(1.0), tollgate_model::time::Nanos(t)).is_ok())
        })
    });
    let lim = governor_limiter();
    let one = NonZeroU32::new(1).unwrap();
    g.bench_function("governor_check_n", |b| b.iter(|| black_box(lim.check_n(black_box(one)).is_ok())));
    // Both again on their coarse clocks: one atomic load instead of reading the counter.
    let coarse = coarse_gate();
    let coarse_handle = coarse.group("a").unwrap();
    g.bench_function("tollgate_group_handle_coarse_clock", |b| {
        b.iter(|| black_box(coarse_handle.try_acquire(black_box(1.0)).is_ok()))
    });
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1)).unwrap();
    let lim = RateLimiter::direct_with_clock(Quota::per_second(NonZeroU32::new(RATE).unwrap()), upkeep);
    g.bench_function("governor_check_n_upkeep_clock", |b| {
        b.iter(|| black_box(lim.check_n(black_box(one)).is_ok()))
    });
    g.finish();
}

/// Benchmarks `a` and `b` running at once on two threads, as case `name` of group `g`.
fn bench_pair(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    a: impl Fn() + Sync,
    b: impl Fn() + Sync,
) {
    g.bench_function(name, |bench| bench.iter_custom(|iters| two_threads(iters, &a, &b)));
}

fn two_threads_one_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire/two_threads_one_group");
    let gate = gate();
    let (h1, h2) = (gate.group("a").unwrap(), gate.group("a").unwrap());
    bench_pair(
        &mut g,
        "tollgate_group_handle",
        || assert!(h1.try_acquire(1.0).is_ok()),
        || assert!(h2.try_acquire(1.0).is_ok()),
    );
    let lim = governor_limiter();
    let one = NonZeroU32::new(1).unwrap();
    bench_pair(
        &mut g,
        "governor_check_n",
        || assert!(lim.check_n(one).is_ok()),
        || assert!(lim.check_n(one).is_ok()),
    );
    g.finish();
}

fn two_threads_two_groups(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire/two_threads_two_groups");
    let gate = gate();
    let (ha, hb) = (gate.group("a").unwrap(), gate.group("b").unwrap());
    bench_pair(
        &mut g,
        "tollgate_group_handle",
        || assert!(ha.try_acquire(1.0).is_ok()),
        || assert!(hb.try_acquire(1.0).is_ok()),
    );
    let (la, lb) = (governor_limiter(), governor_limiter());
    let one = NonZeroU32::new(1).unwrap();
    bench_pair(
        &mut g,
        "governor_check_n",
        || assert!(la.check_n(one).is_ok()),
        || assert!(lb.check_n(one).is_ok()),
    );
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = one_thread, two_threads_one_group, two_threads_two_groups
}
criterion_main!(benches);
