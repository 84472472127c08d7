//! Waiting for admission, on tokio's paused clock.

use std::time::Duration;

use tollgate_limiter::clock::TokioClock;
use tollgate_limiter::{AcquireError, Tollgate};
use tollgate_model::config::Config;
use tollgate_model::time::Clock;

fn gate(toml: &str) -> Tollgate {
    Tollgate::builder().config(Config::parse(toml).unwrap()).clock(TokioClock::new()).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_its_turn_then_proceeds() {
    let g = gate("[node]\nmax_wait_ms = 1000\n[groups.a]\nlimit = 100\nburst = 1\n");
    let clock = TokioClock::new();
    let start = clock.now();
    for _ in 0..51 {
        g.acquire("a", 1.0).await.unwrap();
    }
    // One unit from the burst, then 50 at 100/s.
    assert_eq!(clock.now().since(start), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn acquire_gives_up_after_max_wait_with_group_and_retry_after() {
    let g = gate("[node]\nmax_wait_ms = 200\n[groups.a]\nlimit = 10\n");
    g.acquire("a", 10.0).await.unwrap(); // the whole burst
    g.acquire("a", 2.0).await.unwrap(); // 200 ms: the longest allowed wait
    // Three units are 300 ms away: refused at once, nothing booked.
    match g.acquire("a", 3.0).await {
        Err(AcquireError::Throttled { group, retry_after }) => {
            assert_eq!(group, "a");
            assert_eq!(retry_after, Duration::from_millis(300));
        }
        other => panic!("expected throttled, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_its_tokens_back() {
    let g = gate("[node]\nmax_wait_ms = 5000\n[groups.a]\nlimit = 10\n");
    g.acquire("a", 10.0).await.unwrap();
    // Book 10 units (1 s away) and give up after 10 ms.
    let booked = tokio::time::timeout(Duration::from_millis(10), g.acquire("a", 10.0)).await;
    assert!(booked.is_err());
    // Without the refund this would be booked 2 s out; with it, 1 s after the start.
    let clock = TokioClock::new();
    let before = clock.now();
    g.acquire("a", 10.0).await.unwrap();
    assert_eq!(clock.now().since(before), Duration::from_millis(990));
}

#[tokio::test(start_paused = true)]
async fn fcfs_acquire_waits_for_the_next_slot() {
    let g = gate("[node]\nmode = \"fcfs\"\nmax_wait_ms = 1500\n[groups.a]\nreserved = 5\nlimit = 5\n");
    let clock = TokioClock::new();
    let start = clock.now();
    for _ in 0..10 {
        g.acquire("a", 1.0).await.unwrap();
    }
    assert_eq!(clock.now().since(start), Duration::from_secs(1));
    let e = gate("[node]\nmode = \"fcfs\"\nmax_wait_ms = 100\n[groups.a]\nreserved = 1\nlimit = 1\n");
    e.acquire("a", 1.0).await.unwrap();
    assert!(matches!(e.acquire("a", 1.0).await, Err(AcquireError::Throttled { .. })));
}

#[tokio::test(start_paused = true)]
async fn the_tower_layer_admits_and_refuses_by_group_and_cost() {
    use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
    let g = gate("[node]\nmax_wait_ms = 0\n[groups.alice]\nlimit = 10\n");
    let mut svc = ServiceBuilder::new()
        .layer(tollgate_limiter::TollgateLayer::new(g.clone(), |req: &(&'static str, f64)| (req.0, req.1)))
        .service_fn(|req: (&'static str, f64)| async move { Ok::<_, BoxError>(req.1) });
    assert_eq!(svc.ready().await.unwrap().call(("alice", 10.0)).await.unwrap(), 10.0);
    let err = svc.ready().await.unwrap().call(("alice", 1.0)).await.unwrap_err();
    let err = err.downcast::<AcquireError>().expect("an admission error");
    assert!(err.retry_after().is_some());
    assert_eq!(g.stats("alice").unwrap().throttled, 1);
}

/// With an adaptive throttle, a layer in front of a service that sheds stops sending most of
/// what it would refuse, and sends everything again within 200 s of its recovery.
#[tokio::test(start_paused = true)]
async fn the_tower_layer_throttles_itself_while_the_service_sheds() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use tollgate_limiter::throttle::{RefusedLocally, ThrottleOptions};
    use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
    let g = gate("[groups.alice]\nlimit = 1000000\n");
    let (shedding, reached) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
    let layer = tollgate_limiter::TollgateLayer::new(g.clone(), |req: &&'static str| (*req, 1.0))
        .with_adaptive_throttle(ThrottleOptions::default())
        .unwrap();
    let (s, r) = (shedding.clone(), reached.clone());
    let mut svc = ServiceBuilder::new().layer(layer.clone()).service_fn(move |_req: &'static str| {
        r.fetch_add(1, Ordering::Relaxed);
        let shed = s.load(Ordering::Relaxed);
        async move { if shed { Err::<(), BoxError>("overloaded".into()) } else { Ok(()) } }
    });
    let mut local = 0;
    for _ in 0..2000 {
        tokio::time::advance(Duration::from_millis(10)).await;
        match svc.ready().await.unwrap().call("alice").await {
            Err(e) if e.downcast_ref::<RefusedLocally>().is_some() => local += 1,
            _ => {}
        }
    }
    // Refusing everything, the service is still sent a fifth (`max_reject`): it is how its
    // recovery is noticed.
    let seen = reached.load(Ordering::Relaxed);
    assert_eq!(seen + local, 2000);
    assert!((400..=420).contains(&seen), "the service was sent {seen} of 2000");
    shedding.store(false, Ordering::Relaxed);
    for _ in 0..20_000 {
        tokio::time::advance(Duration::from_millis(10)).await;
        let _ = svc.ready().await.unwrap().call("alice").await;
    }
    assert_eq!(layer.throttle().unwrap().reject_probability(), 0.0);
    let bad = tollgate_limiter::TollgateLayer::new(g, |req: &&'static str| (*req, 1.0))
        .with_adaptive_throttle(ThrottleOptions { k: 0.0, ..Default::default() });
    assert_eq!(bad.err().unwrap(), "k: 1 to 100");
}

#[tokio::test(start_paused = true)]
async fn a_cost_that_can_never_fit_fails_at_once_instead_of_waiting() {
    let g = gate("[node]\nmax_wait_ms = 600000\n[groups.a]\nlimit = 10\n");
    let clock = TokioClock::new();
    let before = clock.now();
    let e = g.acquire("a", 11.0).await.unwrap_err();
    assert!(matches!(e, AcquireError::NeverAdmissible { .. }), "{e}");
    assert_eq!(clock.now(), before, "no time passed");
    let e = g.acquire("a", f64::NAN).await.unwrap_err();
    assert!(matches!(e, AcquireError::InvalidCost(_)), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_cost_just_below_the_ceiling_is_admitted_where_the_quick_check_rounds_it_down() {
    // The hot path checks a cost against the ceiling rounded down to an f32 (1,000,000.0
    // here); a cost between that and the exact ceiling takes the longer path, which must
    // admit it, and one above it is never admissible, by name and by handle alike.
    let g = gate("[node]\nmax_wait_ms = 0\n[groups.a]\nlimit = 1000000.1\n[groups.b]\nlimit = 1000000.1\n");
    g.try_acquire("a", 1_000_000.1).expect("within the ceiling, by name");
    for cost in [1_000_000.11, 1_000_000.2] {
        let e = g.try_acquire("a", cost).unwrap_err();
        assert!(matches!(e, AcquireError::NeverAdmissible { .. }), "{cost}: {e}");
        assert_eq!(g.stats("a").unwrap().throttled, 0, "{cost}: not counted as a refusal");
    }
    let b = g.group("b").unwrap();
    b.try_acquire(1_000_000.1).expect("within the ceiling, by handle");
    for cost in [1_000_000.11, 1_000_000.2] {
        let e = b.try_acquire(cost).unwrap_err();
        assert!(matches!(e, AcquireError::NeverAdmissible { .. }), "{cost}: {e}");
    }
}
