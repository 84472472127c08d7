//! The scheduler on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limiter::clock::TokioClock;
use tollgate_limiter::scheduler::{BACKGROUND_FLOOR, ScheduleError, Scheduler, SchedulerOptions};
use tollgate_model::config::Config;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::{Clock, Nanos};

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
async fn a_critical_request_takes_the_next_freed_slot_before_the_fair_queue() {
    use tollgate_model::class::RequestClass::{Critical, Normal, Sheddable};
    let s = Scheduler::new(&settings(), SchedulerOptions { concurrency: 1, ..Default::default() });
    let first = s.acquire("low", 1.0).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (group, class) in [("high", Normal), ("low", Sheddable), ("low", Critical), ("high", Critical)] {
        let (s, order) = (s.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let slot = s.acquire_class(group, 1.0, class).await.unwrap();
            order.lock().unwrap().push((group, class));
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
    // Critical requests first, in arrival order whatever their group's priority; then the
    // fair queue's order.
    let got = order.lock().unwrap().clone();
    assert_eq!(got, [("low", Critical), ("high", Critical), ("high", Normal), ("low", Sheddable)]);
    assert_eq!(s.load(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_long_request_yields_its_slot_to_critical_work_between_steps() {
    use tollgate_model::class::RequestClass::{Critical, Normal};
    let s = Scheduler::new(&settings(), SchedulerOptions { concurrency: 1, ..Default::default() });
    let mut long = s.acquire("low", 4.0).await.unwrap();
    // Nobody critical waits: the step boundary costs nothing.
    long.yield_to_critical().await;
    assert_eq!(s.load(), (1, 0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (name, class) in [("normal", Normal), ("critical", Critical)] {
        let (s, order) = (s.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let mut slot = s.acquire_class("high", 1.0, class).await.unwrap();
            order.lock().unwrap().push(name);
            // A critical slot never yields, even with critical work waiting.
            slot.yield_to_critical().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(slot);
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(s.load(), (1, 2));
    // The long request's next step waits for the critical request, then goes before the
    // normal one queued ahead of it.
    long.yield_to_critical().await;
    order.lock().unwrap().push("long resumed");
    assert_eq!(s.load(), (1, 1));
    drop(long);
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["critical", "long resumed", "normal"]);
    assert_eq!(s.load(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_yielded_request_cancelled_while_it_waits_gives_nothing_back_twice() {
    use tollgate_model::class::RequestClass::Critical;
    let s = Scheduler::new(&settings(), SchedulerOptions { concurrency: 1, ..Default::default() });
    let mut long = s.acquire("low", 4.0).await.unwrap();
    let critical = {
        let s = s.clone();
        tokio::spawn(async move {
            let slot = s.acquire_class("high", 1.0, Critical).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(slot);
        })
    };
    tokio::task::yield_now().await;
    // Given up part way: the slot went to the critical request and none comes back.
    let gave_up = tokio::time::timeout(Duration::from_millis(1), long.yield_to_critical()).await;
    assert!(gave_up.is_err());
    assert_eq!(s.load(), (1, 1));
    drop(long);
    assert_eq!(s.load(), (1, 0));
    critical.await.unwrap();
    assert_eq!(s.load(), (0, 0));
    // And one handed over at the last moment is passed on.
    let mut long = s.acquire("low", 4.0).await.unwrap();
    let critical = {
        let s = s.clone();
        tokio::spawn(async move { drop(s.acquire_class("high", 1.0, Critical).await.unwrap()) })
    };
    tokio::task::yield_now().await;
    {
        let step = long.yield_to_critical();
        tokio::pin!(step);
        assert!(futures_poll_once(step.as_mut()).await.is_pending());
        critical.await.unwrap();
    }
    drop(long);
    assert_eq!(s.load(), (0, 0));
    let next = s.acquire("high", 1.0).await.unwrap();
    assert_eq!(s.load(), (1, 0));
    drop(next);
}

/// Polls a future once.
async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> std::task::Poll<F::Output> {
    let mut f = Some(f);
    std::future::poll_fn(move |cx| {
        let mut inner = f.take().expect("polled once");
        std::task::Poll::Ready(std::pin::Pin::new(&mut inner).poll(cx))
    })
    .await
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
        SchedulerOptions {
            concurrency: 1,
            max_wait: Duration::from_millis(100),
            queue_len_max: 1,
            ..Default::default()
        },
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

/// Units of `group` served, in requests of `cost` one after another, until `until`.
async fn serve_until(s: &Scheduler, clock: &TokioClock, group: &str, cost: f64, until: Nanos) -> f64 {
    let mut served = 0.0;
    while clock.now() < until {
        match s.acquire(group, cost).await {
            Ok(slot) => {
                served += cost;
                drop(slot);
            }
            Err(ScheduleError::OverBackendLimit { retry_after, .. }) => tokio::time::sleep(retry_after).await,
            Err(e) => panic!("{e}"),
        }
    }
    served
}

#[tokio::test(start_paused = true)]
async fn a_backend_limit_holds_a_group_back_even_on_an_idle_backend() {
    let clock = TokioClock::new();
    let settings = Config::parse("[groups.capped]\nbackend_limit = 100\n").unwrap();
    let s = Scheduler::new(
        &settings,
        SchedulerOptions { max_wait: Duration::from_secs(1), ..Default::default() },
    );
    // Thirty requests of 10: the first ten come from the bucket (one second of the limit), the
    // other twenty wait for 200 units of refill at 100 units/s.
    let start = clock.now();
    for _ in 0..30 {
        drop(s.acquire("capped", 10.0).await.unwrap());
    }
    let took = clock.now().since(start);
    assert!(took >= Duration::from_millis(1990) && took <= Duration::from_millis(2010), "{took:?}");
    // A group with no soft quota is not held at all, on the same idle backend.
    let start = clock.now();
    for _ in 0..300 {
        drop(s.acquire("other", 10.0).await.unwrap());
    }
    assert_eq!(clock.now().since(start), Duration::ZERO);

    // Booked past max_wait: refused, saying how long it would have been, and nothing taken.
    let booked = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire("capped", 80.0).await.map(drop) })
    };
    tokio::task::yield_now().await;
    match s.acquire("capped", 40.0).await.err().unwrap() {
        ScheduleError::OverBackendLimit { group, limit, retry_after } => {
            assert_eq!((group.as_str(), limit), ("capped", 100.0));
            assert!(retry_after > Duration::from_secs(1), "{retry_after:?}");
        }
        other => panic!("{other}"),
    }
    booked.await.unwrap().unwrap();
    // The refusal took nothing: after 0.4 s of refill, 40 units go without waiting.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let start = clock.now();
    drop(s.acquire("capped", 40.0).await.unwrap());
    assert_eq!(clock.now().since(start), Duration::ZERO);

    // Over a long run the group gets its limit, not more.
    let start = clock.now();
    let served = serve_until(&s, &clock, "capped", 7.0, start.after(Duration::from_secs(20))).await;
    let rate = served / clock.now().since(start).as_secs_f64();
    assert!((rate - 100.0).abs() <= 5.0, "{rate} units/s");
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_backend_limit_is_slowed_not_refused() {
    let clock = TokioClock::new();
    let settings = Config::parse("[groups.capped]\nbackend_limit = 100\n").unwrap();
    let s = Scheduler::new(
        &settings,
        SchedulerOptions { max_wait: Duration::from_secs(2), ..Default::default() },
    );
    // 250 units with a bucket of 100: it goes at once and leaves 150 of debt.
    drop(s.acquire("capped", 250.0).await.unwrap());
    let start = clock.now();
    drop(s.acquire("capped", 10.0).await.unwrap());
    let took = clock.now().since(start);
    assert!(took >= Duration::from_millis(1590) && took <= Duration::from_millis(1610), "{took:?}");
    // 300 units on an empty bucket wait for a full one (1 s) and leave 200 of debt, which
    // the next request would wait 2.1 s for: past max_wait, so it is refused.
    drop(s.acquire("capped", 300.0).await.unwrap());
    match s.acquire("capped", 10.0).await.err().unwrap() {
        ScheduleError::OverBackendLimit { retry_after, .. } => {
            assert_eq!(retry_after, Duration::from_millis(2100))
        }
        other => panic!("{other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn background_work_gets_what_the_front_end_leaves_of_the_capacity() {
    let clock = TokioClock::new();
    let settings = Config::parse(
        "[groups.web]\npriority = \"high\"\n[groups.compaction]\nbackground = true\npriority = \"low\"\n",
    )
    .unwrap();
    let s = Scheduler::new(
        &settings,
        SchedulerOptions { capacity: Some(1000.0), max_wait: Duration::from_secs(2), ..Default::default() },
    );
    // The front end at `web_rate` units/s, compaction as fast as it is let, for 20 s; the last
    // 10 s are measured.
    for (web_rate, expected) in [(800.0, 200.0), (0.0, 1000.0), (1000.0, 1000.0 * BACKGROUND_FLOOR)] {
        let start = clock.now();
        let web = {
            let (s, clock) = (s.clone(), clock.clone());
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(Duration::from_millis(10));
                while clock.now().since(start) < Duration::from_secs(20) {
                    ticks.tick().await;
                    if web_rate > 0.0 {
                        drop(s.acquire("web", web_rate / 100.0).await.unwrap());
                    }
                }
            })
        };
        serve_until(&s, &clock, "compaction", 5.0, start.after(Duration::from_secs(10))).await;
        let measured = clock.now();
        let served = serve_until(&s, &clock, "compaction", 5.0, start.after(Duration::from_secs(20))).await;
        let rate = served / clock.now().since(measured).as_secs_f64();
        assert!((rate - expected).abs() <= expected * 0.1, "web {web_rate}: compaction {rate} units/s");
        let limiter = s.background_rate().unwrap();
        assert!((limiter - expected).abs() <= expected * 0.1, "web {web_rate}: limiter {limiter}");
        web.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn new_settings_apply_to_groups_already_seen() {
    let clock = TokioClock::new();
    let s = Scheduler::new(&Config::default(), SchedulerOptions::default());
    drop(s.acquire("g", 1000.0).await.unwrap());
    assert_eq!(s.settings_version(), 0);
    let mut config = Config::default();
    config.groups.insert(
        GroupName::new("g").unwrap(),
        GroupSettings::builder().backend_limit(Some(10.0)).build().unwrap(),
    );
    s.set_settings(config.clone(), 7);
    assert_eq!((s.settings_version(), s.settings_for("g").backend_limit()), (7, Some(10.0)));
    // Held at 10 units/s from now on: 20 units after the bucket's 10 take 2 s.
    let start = clock.now();
    for _ in 0..3 {
        drop(s.acquire("g", 10.0).await.unwrap());
    }
    assert_eq!(clock.now().since(start), Duration::from_secs(2));
    // Lifted: no wait at all.
    s.set_settings(Config::default(), 8);
    let start = clock.now();
    drop(s.acquire("g", 1e6).await.unwrap());
    assert_eq!(clock.now().since(start), Duration::ZERO);
}

/// A backend of `workers` workers taking `base` a request: past `workers` running, work
/// shares them and each request takes longer in proportion.
/// Returns how long each request that timed out had waited.
async fn serve_closed_loop(
    s: Scheduler,
    workers: f64,
    base: Duration,
    clients: usize,
    secs: u64,
) -> Vec<Duration> {
    let timeouts = Arc::new(Mutex::new(Vec::new()));
    let clock = TokioClock::new();
    let until = clock.now().after(Duration::from_secs(secs));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (s, clock, timeouts) = (s.clone(), clock.clone(), timeouts.clone());
        tasks.push(tokio::spawn(async move {
            while clock.now() < until {
                let slot = match s.acquire("one", 1.0).await {
                    Ok(slot) => slot,
                    Err(ScheduleError::TimedOut { waited, .. }) => {
                        // Once the no-load latency is known, nobody waits longer than it.
                        assert!(waited <= Duration::from_secs(5), "{waited:?}");
                        timeouts.lock().unwrap().push(waited);
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                };
                let running = s.load().0 as f64;
                tokio::time::sleep(base.mul_f64((running / workers).max(1.0))).await;
                drop(slot);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(timeouts).unwrap().into_inner().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_learned_concurrency_settles_past_the_workers_and_reports_utilisation() {
    use tollgate_limiter::reporter::BackendHealth;
    use tollgate_model::adaptive::LearnSettings;
    let opts =
        SchedulerOptions { concurrency: 1000, learn: Some(LearnSettings::default()), ..Default::default() };
    let s = Scheduler::new(&settings(), opts);
    assert_eq!(s.health(), Some(BackendHealth::Utilisation(0.0)));
    let timeouts = serve_closed_loop(s.clone(), 8.0, Duration::from_millis(10), 60, 40).await;
    let learned = s.learned().unwrap();
    // 60 clients for a limit of 12: the rest wait one no-load latency at most, then are
    // refused.
    assert!(timeouts.len() > 1000, "{}", timeouts.len());
    let late = timeouts.iter().skip(100).filter(|w| **w > Duration::from_millis(10)).count();
    assert_eq!(late, 0, "{:?}", &timeouts[..10]);
    // 8 workers at 10 ms: latency 1.5 times the unloaded at 12 in flight, 800 requests/s.
    assert!((learned.estimate - 12.0).abs() <= 1.5, "{learned:?}");
    assert_eq!(learned.noload, Some(Duration::from_millis(10)), "{learned:?}");
    let rate = learned.rate.unwrap();
    assert!((rate - 800.0).abs() < 80.0, "{learned:?}");
    // Clients retrying at once ask far more than the limit serves: by Little's law, the work
    // they bring over what may run.
    let Some(BackendHealth::Utilisation(u)) = s.health() else { panic!() };
    let want = (learned.arriving * 0.015 / learned.estimate).min(tollgate_model::adaptive::UTILISATION_MAX);
    assert!(u > 2.0 && (u / want - 1.0).abs() < 0.1, "utilisation {u}, want {want}: {learned:?}");
}

#[tokio::test(start_paused = true)]
async fn a_learned_concurrency_never_passes_the_configured_one() {
    use tollgate_model::adaptive::LearnSettings;
    let opts =
        SchedulerOptions { concurrency: 6, learn: Some(LearnSettings::default()), ..Default::default() };
    let s = Scheduler::new(&settings(), opts);
    let _ = serve_closed_loop(s.clone(), 8.0, Duration::from_millis(10), 60, 20).await;
    let learned = s.learned().unwrap();
    assert_eq!(learned.limit, 6, "{learned:?}");
    // Below the knee the learned limit grows past what may run.
    assert!(learned.estimate > 6.0, "{learned:?}");
    // Without learning there is nothing learned and no health to report.
    let plain = Scheduler::new(&settings(), SchedulerOptions::default());
    assert_eq!(plain.learned(), None);
    assert_eq!(plain.health(), None);
}

/// A share of 100 units/s with a ceiling of 300: an idle backend lends the group capacity
/// past its share, up to its ceiling; a busy one holds it to its share.
#[tokio::test(start_paused = true)]
async fn a_share_holds_a_group_where_the_backend_is_busy_and_idle_capacity_is_lent() {
    use tollgate_proto::v1;
    let clock = TokioClock::new();
    let s = Scheduler::new(
        &Config::default(),
        SchedulerOptions { concurrency: 1, max_wait: Duration::from_secs(1), ..Default::default() },
    );
    let share =
        v1::NodeShare { group: "skewed".into(), units_per_s: 100.0, ceiling: 300.0, ..Default::default() };
    s.take_shares(std::slice::from_ref(&share));
    assert_eq!(s.shares()["skewed"].units_per_s, 100.0);
    // Idle, one request at a time: 100 from the share, 150 lent (of the 200 its ceiling
    // leaves), all at once.
    let start = clock.now();
    for _ in 0..25 {
        drop(s.acquire("skewed", 10.0).await.unwrap());
    }
    assert_eq!(clock.now().since(start), Duration::ZERO);
    // Over a long run on the idle backend: its ceiling.
    let start = clock.now();
    let served = serve_until(&s, &clock, "skewed", 5.0, start.after(Duration::from_secs(20))).await;
    let rate = served / clock.now().since(start).as_secs_f64();
    assert!((rate - 300.0).abs() <= 15.0, "idle: {rate} units/s");
    // Busy (another group holds the one slot): held to its share. With the buckets full
    // again, two requests of 100 take the share's second and book the next; a third would
    // wait 2 s for it, past max_wait, and is refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hold = s.acquire("other", 1.0).await.unwrap();
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.acquire("skewed", 100.0).await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    match s.acquire("skewed", 100.0).await.err().unwrap() {
        ScheduleError::OverBackendLimit { limit, retry_after, .. } => {
            assert_eq!(limit, 100.0);
            assert!(retry_after > Duration::from_secs(1), "{retry_after:?}");
        }
        other => panic!("{other}"),
    }
    drop(hold);
    for q in queued {
        q.await.unwrap().unwrap();
    }
    // Idle again, with the buckets full: three such requests go at once, two of them lent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let start = clock.now();
    for _ in 0..3 {
        drop(s.acquire("skewed", 90.0).await.unwrap());
    }
    assert_eq!(clock.now().since(start), Duration::ZERO);
    // Without a share, nothing is held.
    s.take_shares(&[]);
    assert!(s.shares().is_empty());
}
