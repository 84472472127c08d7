//! Store mode against a real `redis-server` (started here, on a free port, in a temporary
//! directory; `./scripts/test.sh` installs it when missing).

use std::time::Duration;

use tollgate_limiter::{SafeModePolicy, StoreOptions, Tollgate};
use tollgate_model::config::Config;
use tollgate_model::time::ManualClock;

use tollgate_testkit::redis::Redis;

fn config(toml: &str) -> Config {
    Config::parse(toml).unwrap()
}

fn opts(namespace: &str, id: &str) -> StoreOptions {
    StoreOptions {
        namespace: namespace.into(),
        client_id: Some(id.into()),
        ttl: Duration::from_secs(1),
        sync_interval: Duration::from_millis(50),
        stale_limit: Duration::from_millis(500),
        ..StoreOptions::default()
    }
}

/// Waits (bounded) until `check` holds, polling the clients' own state.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

fn size(gate: &Tollgate) -> u64 {
    gate.store_status().unwrap().sizes[0].1
}

/// How much `gate` can take of group `g` in the clock's current epoch.
fn drain(gate: &Tollgate) -> u64 {
    let mut n = 0;
    while gate.try_acquire("g", 1.0).is_ok() {
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_agree_split_the_pool_and_follow_deaths_and_scale_ups() {
    let redis = Redis::start("agree");
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 90\n";
    let mut gates = Vec::new();
    for i in 0..3 {
        let g = Tollgate::store_with_clock(
            &redis.url(),
            config(settings),
            opts("t1", &format!("c{i}")),
            clock.clone(),
        )
        .await
        .unwrap();
        gates.push(g);
    }
    until("three clients agree on 3", || gates.iter().all(|g| size(g) == 3)).await;
    // A new epoch: each takes exactly its share, 90 / 3, and not one unit more.
    clock.advance(Duration::from_secs(1));
    for g in &gates {
        assert_eq!(drain(g), 30);
    }

    // One dies (no goodbye): within ttl plus a sync the others agree on 2.
    drop(gates.pop());
    until("two survivors agree on 2", || gates.iter().all(|g| size(g) == 2)).await;
    clock.advance(Duration::from_secs(1));
    for g in &gates {
        assert_eq!(drain(g), 45);
    }

    // Scale up to four.
    for i in 3..5 {
        let g = Tollgate::store_with_clock(
            &redis.url(),
            config(settings),
            opts("t1", &format!("c{i}")),
            clock.clone(),
        )
        .await
        .unwrap();
        gates.push(g);
    }
    until("four agree on 4", || gates.iter().all(|g| size(g) == 4)).await;
    clock.advance(Duration::from_secs(1));
    for g in &gates {
        assert_eq!(drain(g), 22); // ⌊90 / 4⌋: the remainder is never handed out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_same_named_groups_apart() {
    let redis = Redis::start("namespaces");
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 10\n";
    let a = Tollgate::store_with_clock(&redis.url(), config(settings), opts("team-a", "x"), clock.clone())
        .await
        .unwrap();
    let b = Tollgate::store_with_clock(&redis.url(), config(settings), opts("team-b", "y"), clock.clone())
        .await
        .unwrap();
    until("each alone in its namespace", || {
        size(&a) == 1 && size(&b) == 1 && a.store_status().unwrap().syncs > 3
    })
    .await;
    clock.advance(Duration::from_secs(1));
    assert_eq!(drain(&a), 10);
    assert_eq!(drain(&b), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_resumes_within_the_ttl_and_restarts_after_it() {
    let redis = Redis::start("resume");
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 1000\n[groups.g.ramp]\nmin = 10\nmax = 110\nduration_s = 10\nmode = \"relaxed\"\nresume_ttl_s = 5\n";
    let first =
        Tollgate::store_with_clock(&redis.url(), config(settings), opts("t3", "first"), clock.clone())
            .await
            .unwrap();
    // Five busy epochs: 10, 20, 30, 40, 50.
    let mut taken = Vec::new();
    for _ in 0..5 {
        taken.push(drain(&first));
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(taken, [10, 20, 30, 40, 50]);
    first.shutdown().await;

    // Within the ttl: resumes at 50 (and steps to 60 on its first busy epoch after that). The
    // ttl is Redis's own, in real time: 5 s, so that on a busy machine the next process still
    // starts well within it.
    let second =
        Tollgate::store_with_clock(&redis.url(), config(settings), opts("t3", "second"), clock.clone())
            .await
            .unwrap();
    assert_eq!(drain(&second), 50);
    second.shutdown().await;

    // After the ttl the stored value has expired: back to min.
    tokio::time::sleep(Duration::from_millis(5300)).await;
    let third =
        Tollgate::store_with_clock(&redis.url(), config(settings), opts("t3", "third"), clock.clone())
            .await
            .unwrap();
    assert_eq!(drain(&third), 10);
    for _ in 0..4 {
        clock.advance(Duration::from_secs(1));
        drain(&third);
    }
    third.shutdown().await;

    // Resumed ramp-up is off without resume_ttl_s, as in Numaflow: back to min at once.
    let off = settings.replace("resume_ttl_s = 5\n", "");
    let fourth = Tollgate::store_with_clock(&redis.url(), config(&off), opts("t3", "fourth"), clock.clone())
        .await
        .unwrap();
    assert_eq!(drain(&fourth), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_mid_run_keeps_the_last_size_then_safe_mode_then_recovers() {
    let redis = Redis::start("lost");
    let port = redis.port;
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 60\n";
    let a = Tollgate::store_with_clock(&redis.url(), config(settings), opts("t4", "a"), clock.clone())
        .await
        .unwrap();
    let b = Tollgate::store_with_clock(&redis.url(), config(settings), opts("t4", "b"), clock.clone())
        .await
        .unwrap();
    until("two agree", || size(&a) == 2 && size(&b) == 2).await;

    drop(redis); // killed
    until("the loss is noticed", || !a.store_status().unwrap().connected).await;
    // The last agreed size carries on locally.
    assert_eq!(size(&a), 2);
    clock.advance(Duration::from_secs(1));
    assert_eq!(drain(&a), 30);
    until("safe mode after the stale limit", || a.store_status().unwrap().safe_mode).await;
    // Decay (the default policy) keeps the last agreed size and ramp.
    clock.advance(Duration::from_secs(1));
    assert_eq!(drain(&a), 30);

    let _restarted = Redis::start_on("lost-again", port);
    until("back and out of safe mode", || {
        let s = a.store_status().unwrap();
        s.connected && !s.safe_mode
    })
    .await;
    until("agree again on 2", || size(&a) == 2 && size(&b) == 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_starts_in_safe_mode_within_the_bound() {
    // A port nothing listens on.
    let port = tollgate_testkit::port::free_port();
    let clock = ManualClock::new();
    let o = StoreOptions {
        connect_timeout: Duration::from_millis(300),
        safe_mode: SafeModePolicy::FailClosed,
        ..opts("t5", "z")
    };
    let started = tollgate_limiter::clock::TokioClock::new();
    let gate = Tollgate::store_with_clock(
        &format!("redis://127.0.0.1:{port}"),
        config("[groups.g]\nlimit = 5\n"),
        o,
        clock.clone(),
    )
    .await
    .unwrap();
    use tollgate_model::time::Clock;
    assert!(started.now().as_secs_f64() < 2.0, "start took {:?}", started.now());
    let s = gate.store_status().unwrap();
    assert!(s.safe_mode && !s.connected);
    assert_eq!(drain(&gate), 0, "fail closed admits nothing");
    gate.shutdown().await; // never waits on Redis for more than a second
    let bad = Tollgate::store("not a url", config("[groups.g]\nlimit = 5\n"), StoreOptions::default())
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("url:"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_its_size_and_this_process_share_are_read_and_exported() {
    let redis = Redis::start("pools");
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 90\n[groups.open]\n";
    let mut gates = Vec::new();
    for i in 0..3 {
        let opts = opts("pools", &format!("c{i}"));
        gates.push(
            Tollgate::store_with_clock(&redis.url(), config(settings), opts, clock.clone()).await.unwrap(),
        );
    }
    until("three clients agree on 3", || gates.iter().all(|g| size(g) == 3)).await;
    // A size takes effect at the next epoch.
    clock.advance(Duration::from_secs(1));
    let status = gates[0].store_status().unwrap();
    assert_eq!(status.replicas, None);
    assert_eq!(
        status.groups,
        [tollgate_limiter::StoreGroupStatus { group: "g".into(), pool: 90.0, size: 3, share: 30.0 }]
    );
    let text = gates[0].metrics();
    for line in [
        "tollgate_client_info{mode=\"store\"} 1",
        "tollgate_client_connected 1",
        "tollgate_client_safe_mode 0",
        "tollgate_client_pool_units{group=\"g\"} 90",
        "tollgate_client_pool_size{group=\"g\"} 3",
        "tollgate_client_pool_share_units{group=\"g\"} 30",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
    }
    assert!(text.contains("# TYPE tollgate_client_store_syncs counter\ntollgate_client_store_syncs_total "));
}

#[test]
fn replicas_divide_each_pool_with_no_store() {
    let clock = ManualClock::new();
    let settings = "[groups.g]\nlimit = 1000\n[groups.r]\nlimit = 1000\n[groups.r.ramp]\nmin = 100\nmax = 500\nduration_s = 4\nmode = \"scheduled\"\n";
    let gates: Vec<Tollgate> = (0..4)
        .map(|_| Tollgate::replicas_with_clock(config(settings), Some(4), clock.clone()).unwrap())
        .collect();
    clock.advance(Duration::from_secs(1));
    for g in &gates {
        assert_eq!(drain(g), 250);
    }
    let status = gates[0].store_status().unwrap();
    assert_eq!(status.replicas, Some(4));
    assert_eq!(
        status.groups[0],
        tollgate_limiter::StoreGroupStatus { group: "g".into(), pool: 1000.0, size: 4, share: 250.0 }
    );
    let text = gates[0].metrics();
    assert!(text.contains("tollgate_client_info{mode=\"replicas\"} 1"), "{text}");
    assert!(text.contains("tollgate_client_pool_size{group=\"r\"} 4"), "{text}");
    assert!(!text.contains("tollgate_client_connected"), "no store, no link: {text}");

    // What store mode cannot carry out, replicas mode cannot either; the count is checked.
    let refused =
        Tollgate::replicas(config("[groups.g]\nlimit = 10\nmax_in_flight = 5\n"), Some(2)).unwrap_err();
    assert!(
        refused.to_string().starts_with("groups.g.max_in_flight cannot apply in replicas mode: "),
        "{refused}"
    );
    let zero = Tollgate::replicas(config(settings), Some(0)).unwrap_err();
    assert!(zero.to_string().contains("replicas: must be from 1 to 100000, got 0"), "{zero}");
}

#[test]
fn replicas_count_each_quota_in_their_share() {
    // 50 s into a minute.
    let clock = ManualClock::at_unix_ms(1_800_000_050_000);
    let settings = "[groups.g]\nlimit = 100000\nquotas = { minute = 100, \"30s-from-first\" = 40 }\n";
    let gate = Tollgate::replicas_with_clock(config(settings), Some(4), clock.clone()).unwrap();
    // A quarter of each quota: 10 of the 40 from the first request, then nothing for 30 s,
    // though a new minute starts on the way.
    assert_eq!(drain(&gate), 10);
    clock.advance(Duration::from_secs(29));
    assert_eq!(drain(&gate), 0);
    let q = gate.group("g").unwrap().quota().unwrap();
    assert_eq!(q.reset_in, Some(Duration::from_secs(1)), "{q:?}");
    clock.advance(Duration::from_secs(1));
    assert_eq!(drain(&gate), 10);

    // What a process held unused when a window ended still counts in the windows under way:
    // 5 of a minute's 25 used, then a new minute, and 35 of the 40 from the first request
    // are still there (the minute's 25 of them now).
    let clock = ManualClock::at_unix_ms(1_800_000_050_000);
    let settings = "[groups.g]\nlimit = 100000\nquotas = { minute = 100, \"30s-from-first\" = 160 }\n";
    let gate = Tollgate::replicas_with_clock(config(settings), Some(4), clock.clone()).unwrap();
    assert_eq!((0..5).filter(|_| gate.try_acquire("g", 1.0).is_ok()).count(), 5);
    clock.advance(Duration::from_secs(15));
    assert_eq!(drain(&gate), 25);
    clock.advance(Duration::from_secs(60));
    // The first 30 s have ended: 40 afresh, the minute's 25 of them.
    assert_eq!(drain(&gate), 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_mode_speaks_tls_to_redis_with_a_ca_file_and_a_client_certificate() {
    use tollgate_limiter::access::Access;
    use tollgate_testkit::pki::Pki;
    use tollgate_testkit::redis::RedisTls;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-tls");
    let _ = std::fs::remove_dir_all(&dir);
    let pki = Pki::new(&dir, "redis-ca");
    let stranger = Pki::new(&dir.join("other"), "other-ca");
    let (cert, key) = pki.issue("redis", "redis", false);
    let (client, client_key) = pki.issue("app", "app", false);
    let ca = pki.ca_file();
    let redis =
        Redis::start_tls("tls", RedisTls { cert: &cert, key: &key, ca: &ca, client_certificates: true });
    let url = redis.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let conf = config("[groups.g]\nlimit = 100\n");
    let with = |access: Access| StoreOptions { access, ..opts("tls", "c1") };
    // The authority and a client certificate: connected, and syncing.
    let access =
        Access { ca_file: Some(ca.clone()), identity: Some((client, client_key)), ..Access::default() };
    let gate = Tollgate::store(&url, conf.clone(), with(access)).await.unwrap();
    until("synced over TLS", || gate.store_status().unwrap().syncs > 2).await;
    assert!(gate.store_status().unwrap().connected);
    // No client certificate, or an authority that did not sign Redis's certificate: never
    // connected (the handle starts in safe mode, as with Redis down).
    for access in [
        Access { ca_file: Some(ca.clone()), ..Access::default() },
        Access { ca_file: Some(stranger.ca_file()), ..Access::default() },
    ] {
        let refused = Tollgate::store(
            &url,
            conf.clone(),
            StoreOptions { connect_timeout: Duration::from_secs(2), ..with(access) },
        )
        .await
        .unwrap();
        let s = refused.store_status().unwrap();
        assert!(!s.connected && s.syncs == 0, "{s:?}");
    }
    // TLS files without rediss://, and a token: refused by name.
    let plain = Access { ca_file: Some(ca.clone()), ..Access::default() };
    let e = Tollgate::store("redis://127.0.0.1:1", conf.clone(), with(plain)).await.unwrap_err();
    assert!(e.to_string().contains("needs a rediss:// address"), "{e}");
    let token = Access { token: Some("tg_x".into()), ..Access::default() };
    let e = Tollgate::store(&url, conf, with(token)).await.unwrap_err();
    assert!(e.to_string().contains("takes its password in the URL"), "{e}");
}

/// Takes all `gate` may of group `g` now: on each refusal with units left in Redis beyond
/// what it holds, it waits for its next take.
async fn take_all(gate: &Tollgate) -> u64 {
    let g = gate.group("g").unwrap();
    let mut n = 0;
    loop {
        if g.try_acquire(1.0).is_ok() {
            n += 1;
            continue;
        }
        match g.quota() {
            // Answered between the refusal and the look.
            Some(q) if q.held >= 1.0 => {}
            Some(q) if q.asks_more(1.0) => {
                tokio::time::timeout(Duration::from_secs(10), g.wait_for_answer())
                    .await
                    .expect("Redis answers");
            }
            _ => return n,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_per_minute_is_counted_in_redis_across_processes_and_restarts() {
    let redis = Redis::start("quota");
    let url = redis.url();
    // A second into a minute (Redis's counters are named by it).
    let clock = ManualClock::at_unix_ms(1_800_000_001_000);
    let settings = "[groups.g]\nlimit = 100000\nquotas = { minute = 100 }\n";
    let mut gates = Vec::new();
    for i in 0..3 {
        let gate = Tollgate::store_with_clock(
            &url,
            config(settings),
            opts("quota", &format!("c{i}")),
            clock.clone(),
        );
        gates.push(gate.await.unwrap());
    }
    // The processes take in turn, each as much as it can, until Redis has nothing left.
    let mut taken = [0u64; 3];
    for _ in 0..4 {
        for (i, gate) in gates.iter().enumerate() {
            taken[i] += take_all(gate).await;
        }
    }
    assert_eq!(taken.iter().sum::<u64>(), 100, "a minute's quota of 100, taken as {taken:?}");
    let q = gates[0].group("g").unwrap().quota().unwrap();
    assert_eq!((q.held, q.beyond), (0.0, 0.0), "{q:?}");
    let reset = q.reset_in.expect("a spent quota says when it comes back");
    assert!(reset <= Duration::from_secs(59) && reset >= Duration::from_secs(58), "{reset:?}");
    // A process started now (a restart) finds the minute spent.
    let late = Tollgate::store_with_clock(&url, config(settings), opts("quota", "c3"), clock.clone());
    let late = late.await.unwrap();
    assert_eq!(take_all(&late).await, 0);
    // The next minute: a fresh 100, whichever processes ask.
    clock.advance(Duration::from_secs(60));
    let next = [
        take_all(&gates[1]).await,
        take_all(&gates[2]).await,
        take_all(&gates[0]).await,
        take_all(&late).await,
    ];
    assert_eq!(next.iter().sum::<u64>(), 100, "{next:?}");
}
