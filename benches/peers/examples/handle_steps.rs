//! A group's handle on simulated time, for exact instruction counts.
//!
//! `cargo run --release --manifest-path benches/peers/Cargo.toml --example handle_steps -- RATE CALLS [NS_PER_CALL]`
//!
//! One group limited to RATE units/s with a one-second burst, on a manual clock: the burst is
//! spent first, then CALLS calls of `GroupHandle::try_acquire(1.0)` follow, the clock moved on
//! NS_PER_CALL nanoseconds before each (0, the default: refusals only). Nothing here reads
//! real time, so the same arguments run the same instructions every time: under `valgrind
//! --tool=callgrind`, the difference between two runs that differ only in CALLS, divided by
//! the difference in CALLS, is what one call costs in instructions, exactly, where a timed
//! loop on a shared machine moves by tens of per cent. With NS_PER_CALL near a real call's
//! time (15 at 1,000,000 units/s gives the mix of a throttled tenant's calls: 1.5 % admitted,
//! the rest refused), the count follows the paths `rate_rounds` times. The manual clock is
//! read through the clock's general path, not the coarse one a real process reads, so counts
//! compare builds with each other, not with governor.

use std::hint::black_box;
use std::time::Duration;

use tollgate_limiter::Tollgate;
use tollgate_model::config::Config;
use tollgate_model::time::ManualClock;

fn main() {
    let mut args =
        std::env::args().skip(1).map(|a| a.parse::<u64>().expect("RATE CALLS [NS_PER_CALL]: whole numbers"));
    let (Some(rate), Some(calls)) = (args.next(), args.next()) else {
        eprintln!("usage: handle_steps RATE CALLS [NS_PER_CALL]");
        std::process::exit(2);
    };
    let step = Duration::from_nanos(args.next().unwrap_or(0));
    let clock = ManualClock::new();
    let config =
        Config::parse(&format!("[groups.g]\nlimit = {}\n", rate.max(1))).expect("a valid configuration");
    let gate = Tollgate::builder().config(config).clock(clock.clone()).build().expect("a valid limiter");
    let handle = gate.group("g").expect("a configured group");
    let mut burst = 0u64;
    while handle.try_acquire(1.0).is_ok() {
        burst += 1;
    }
    let mut admitted = 0u64;
    for _ in 0..calls {
        if !step.is_zero() {
            clock.advance(step);
        }
        admitted += u64::from(handle.try_acquire(black_box(1.0)).is_ok());
    }
    println!("rate {rate} units/s: burst {burst}, then {admitted} of {calls} calls admitted");
}
