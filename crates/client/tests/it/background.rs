//! With many groups in use on the real clock, an embedded limiter reallocates on a thread of
//! its own. A test binary of its own: it looks at the process's threads by name.

#![cfg(target_os = "linux")]

use std::time::Duration;

use tollgate_limiter::{BACKGROUND_GROUPS, Tollgate};
use tollgate_model::time::ManualClock;

/// How many of this process's threads carry `name`.
fn threads_named(name: &str) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux lists a process's threads");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Calls `until` every 10 ms, at most `tries` times: whether it came true. A wait for
/// something another thread does, bounded so that a defect fails instead of hanging.
fn eventually(tries: usize, mut until: impl FnMut() -> bool) -> bool {
    for _ in 0..tries {
        if until() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    until()
}

fn settings(groups: usize) -> String {
    let mut toml = format!("[node]\nrealloc_ms = 10\nmax_tracked_groups = {}\n", groups + 10);
    toml.push_str("[groups.default]\nlimit = 1000\n");
    toml
}

fn names(groups: usize) -> Vec<String> {
    (0..groups).map(|i| format!("tenant-{i:05}")).collect()
}

/// On a clock given for tests, passes stay on the admissions that find them due, however many
/// groups: a test drives them step by step. On the real clock, from `BACKGROUND_GROUPS`
/// groups in use, passes move to the `tollgate-alloc` thread: a group used for the first
/// time after that gets its grant with no further admission (none runs a pass any more), and
/// the thread ends with the limiter.
#[test]
fn many_groups_reallocate_on_a_thread_of_their_own_that_ends_with_the_limiter() {
    let groups = BACKGROUND_GROUPS + 100;
    let names = names(groups);
    let clock = ManualClock::new();
    let manual = Tollgate::from_toml(&settings(groups))
        .and_then(|g| g.with_clock(clock.clone()))
        .expect("valid settings");
    for _ in 0..3 {
        for name in &names {
            let _ = manual.try_acquire(name, 1.0);
        }
        clock.advance(Duration::from_millis(20));
    }
    assert_eq!(manual.stats(&names[groups - 1]).expect("used").allowance, 1000.0, "taken in");
    assert_eq!(threads_named("tollgate-alloc"), 0, "a manual clock keeps passes on admissions");
    drop(manual);

    let gate = Tollgate::from_toml(&settings(groups + 1)).expect("valid settings");
    for name in &names {
        let _ = gate.try_acquire(name, 1.0);
    }
    // The next pass on schedule, run by an admission, sees them all in use and hands over.
    let handed_over = eventually(6000, || {
        let _ = gate.try_acquire(&names[0], 1.0);
        threads_named("tollgate-alloc") == 1
    });
    assert!(handed_over, "the reallocation thread started");
    let late = "tenant-late";
    let _ = gate.try_acquire(late, 1.0);
    assert!(
        eventually(6000, || gate.stats(late).is_some_and(|s| s.allowance == 1000.0)),
        "taken in by the thread: {:?}",
        gate.stats(late)
    );
    assert_eq!(threads_named("tollgate-alloc"), 1, "one thread for the limiter");
    drop(gate);
    assert!(eventually(6000, || threads_named("tollgate-alloc") == 0), "the thread ended with the limiter");
}
