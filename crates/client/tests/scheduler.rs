//! The scheduler on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_client::scheduler::{ScheduleError, Scheduler, SchedulerOptions};
use tollgate_core::config::Config;

fn settings() -> Config {
    Config::parse(
        "[groups.high]\npriority = \"high\"\n[groups.low]\npriority = \"low\"\n\
         [groups.one]\nreserved = 1000\n[groups.two]\nreserved = 2000\n",
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn at_most_concurrency_run_and_freed_slots_go_in_priority_order() {
    let s = Scheduler::new(&settings(), SchedulerOptions { concurrency: 1, ..Default::default() });
    let first = s.acquire("low", 1.0).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for group in ["low", "low", "high", "high"] {
        let (s, order) = (s.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let slot = s.acquire(group, 1.0).await.unwrap();
            order.lock().unwrap().push(group);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(slot);
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(s.load(), (1, 4));
    drop(first);
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["high", "high", "low", "low"]);
    assert_eq!(s.load(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn busy_groups_share_slots_by_their_rates() {
    let s = Scheduler::new(
        &settings(),
        SchedulerOptions { concurrency: 1, queue_len_max: 100_000, ..Default::default() },
    );
    let served = Arc::new(Mutex::new((0u32, 0u32)));
    let mut tasks = Vec::new();
    for (group, n) in [("one", 3000), ("two", 3000)] {
        for _ in 0..n {
            let (s, served) = (s.clone(), served.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(slot) = s.acquire(group, 1.0).await else { return };
                {
                    let mut c = served.lock().unwrap();
                    if group == "one" { c.0 += 1 } else { c.1 += 1 }
                }
                tokio::time::sleep(Duration::from_micros(100)).await;
                drop(slot);
            }));
        }
    }
    // Let 3000 requests through, then look at who got them.
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let c = *served.lock().unwrap();
        if c.0 + c.1 >= 3000 {
            let ratio = f64::from(c.1) / f64::from(c.0);
            assert!((ratio - 2.0).abs() <= 0.1, "served {c:?}");
            break;
        }
    }
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_at_most_max_wait_and_full_queues_refuse() {
    let s = Scheduler::new(
        &settings(),
        SchedulerOptions { concurrency: 1, max_wait: Duration::from_millis(100), queue_len_max: 1 },
    );
    let held = s.acquire("one", 1.0).await.unwrap();
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire("one", 1.0).await })
    };
    tokio::task::yield_now().await;
    let full = s.acquire("one", 1.0).await.err().unwrap();
    assert!(matches!(full, ScheduleError::QueueFull(_)), "{full}");
    let timed_out = waiting.await.unwrap().err().unwrap();
    assert_eq!(
        timed_out,
        ScheduleError::TimedOut { group: "one".into(), waited: Duration::from_millis(100) }
    );
    drop(held);
    // Nothing leaked: the slot is free again.
    assert_eq!(s.load(), (0, 0));
    let _again = s.acquire("one", 1.0).await.unwrap();
    assert!(matches!(s.acquire("", 1.0).await, Err(ScheduleError::InvalidGroup(_))));
}
