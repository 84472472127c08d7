//! The hot path allocates nothing, admitted or refused: checked with a counting allocator.
//!
//! Only the test's own thread is counted: the test harness's other threads allocate when they
//! please (it once counted 4 allocations in 3 runs of 8 on a loaded machine, none of them ours).

// A global allocator is an `unsafe impl`; this test binary is the only place the project
// needs one, to count allocations.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate_limiter::Tollgate;
use tollgate_model::time::ManualClock;

struct Counting;

thread_local! {
    // A const-initialised cell with no destructor: reading it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// `GlobalAlloc`'s contract; counting touches only a thread-local or atomic counter and
// allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn admitting_and_refusing_allocate_nothing() {
    let clock = ManualClock::new();
    let gate = Tollgate::builder()
        .config(tollgate_model::config::Config::parse("[groups.a]\nlimit = 100\n").unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let handle = gate.group("a").unwrap();
    // Warm up: this thread's tally for the group is created on first use.
    assert!(handle.try_acquire(1.0).is_ok());

    let before = allocations();
    let mut admitted = 0;
    let mut refused = 0;
    for _ in 0..10_000 {
        match handle.try_acquire(1.0) {
            Ok(permit) => {
                admitted += 1;
                permit.settle(1.5).unwrap();
            }
            Err(e) => {
                refused += 1;
                assert!(e.retry_after().is_some());
            }
        }
        // Also by name, the way a service that doesn't keep handles asks.
        let _ = gate.try_acquire("a", 1.0);
    }
    let after = allocations();
    assert!(admitted > 0 && refused > 0, "both paths ran: {admitted} admitted, {refused} refused");
    assert_eq!(after - before, 0, "the hot path allocated");
}
