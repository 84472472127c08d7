//! The whole loop with real processes: `tollgate server`, `examples/kv-service` and a load
//! program for two tenants, over loopback.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_limiter::clock::TokioClock;
use tollgate_model::time::Clock;

use crate::common;
use common::{BIN, admin, server_command};

const VALUE_BYTES: usize = 4096;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a process and returns it with the address printed on its first line after `marker`.
fn start(cmd: &mut Command, marker: &str) -> (Proc, String) {
    let log = std::fs::File::create(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("e2e-{}.log", marker.trim())),
    )
    .unwrap();
    let mut child = cmd.stdout(Stdio::piped()).stderr(log).spawn().expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .split(marker)
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{line}"));
    (Proc(child), addr.to_string())
}

fn kv_service_binary() -> PathBuf {
    // Examples are built next to the test binaries' directory by `cargo test --all-targets`.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join("examples").join("kv-service");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p tollgate-limiter --example kv-service` (the README's test command does)",
        bin.display()
    );
    bin
}

/// Starts `examples/kv-service` for the controller at `url`, 1 MB/s of capacity, with `more`
/// options; the process and its address.
fn start_kv(url: &str, more: &[&str]) -> (Proc, String) {
    let mut cmd = Command::new(kv_service_binary());
    cmd.args(["--controller", url, "--listen", "127.0.0.1:0", "--capacity", "1000000"]).args(more);
    start(&mut cmd, "listening on ")
}

#[derive(Debug, Clone)]
struct Sample {
    at: f64,
    tenant: &'static str,
    status: u16,
    retry_after: Option<u64>,
    latency: f64,
}

async fn http(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(request).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// `clock` is the test's one clock: sample times are seconds since the test started.
async fn put(addr: SocketAddr, tenant: &'static str, key: u64, clock: &TokioClock) -> Option<Sample> {
    let body = vec![b'x'; VALUE_BYTES];
    let mut req = format!(
        "PUT /kv/k{key} HTTP/1.1\r\nHost: {addr}\r\nx-tollgate-group: {tenant}\r\nContent-Length: {VALUE_BYTES}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let start = clock.now().as_secs_f64();
    let response = http(addr, &req).await?;
    let latency = clock.now().as_secs_f64() - start;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let retry_after = response
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("retry-after:"))
        .and_then(|l| l.split(':').nth(1)?.trim().parse().ok());
    Some(Sample { at: start, tenant, status, retry_after, latency })
}

/// Offers `rate` requests/s for `tenant` for `seconds`, each request on its own task.
async fn offer(
    addr: SocketAddr,
    tenant: &'static str,
    rate: f64,
    seconds: f64,
    clock: TokioClock,
    out: Arc<Mutex<Vec<Sample>>>,
) {
    let until = clock.now().as_secs_f64() + seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut key = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while clock.now().as_secs_f64() < until {
        tick.tick().await;
        key += 1;
        let (out, clock) = (out.clone(), clock.clone());
        tasks.spawn(async move {
            if let Some(s) = put(addr, tenant, key, &clock).await {
                out.lock().unwrap().push(s);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn get_json(addr: &str, path: &str) -> serde_json::Value {
    let addr: SocketAddr = addr.parse().unwrap();
    let text =
        http(addr, format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    // A long answer is sent in chunks.
    let body = if head.to_lowercase().contains("transfer-encoding: chunked") {
        common::dechunk(body)
    } else {
        body.to_string()
    };
    serde_json::from_str(&body).unwrap()
}

/// About once a second until `until` (on `clock`, while the load is offered): whether the
/// controller marks bronze busy, and the service's utilisation.
async fn watch_bronze(url: String, kv_addr: String, clock: TokioClock, until: f64) -> (bool, Vec<f64>) {
    let mut busy_seen = false;
    let mut utilisation = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Only while the load is offered: on a busy machine a look takes more than a second.
        if clock.now().as_secs_f64() >= until {
            break;
        }
        // On a thread of its own: a worker blocked on the command would hold up the offers'
        // requests and inflate the latencies they measure.
        let url = url.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(BIN).args(["status", "--json"]).env("TOLLGATE_SERVER", &url).output().unwrap()
        })
        .await
        .unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let bronze = s["groups"].as_array().unwrap().iter().find(|g| g["name"] == "bronze").cloned().unwrap();
        busy_seen |= bronze["busy"] == true;
        println!(
            "bronze target {} admitted {:.0} demand {:.0} busy {}",
            bronze["target"],
            bronze["admitted"].as_f64().unwrap_or(0.0),
            bronze["demand"].as_f64().unwrap_or(0.0),
            bronze["busy"]
        );
        utilisation.push(get_json(&kv_addr, "/stats").await["utilisation"].as_f64().unwrap());
    }
    (busy_seen, utilisation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_limits_saturation_and_priority_end_to_end() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) = start(
        // One service, one zone: no zone to ignore.
        server_command(&data, "127.0.0.1:0")
            .args(["--ignore-worst-zones", "0"])
            .env("RUST_LOG", "tollgate_controller=debug,info"),
        "grpc ",
    );
    let url = format!("http://{grpc}");
    admin(&url, &["group", "create", "gold", "--reserved", "200000", "--priority", "high"]);
    admin(&url, &["group", "create", "bronze", "--limit", "100000", "--priority", "low"]);
    let (_kv, kv_addr) = start_kv(&url, &["--concurrency", "4"]);
    let kv: SocketAddr = kv_addr.parse().unwrap();
    let clock = TokioClock::new();
    let samples = Arc::new(Mutex::new(Vec::new()));

    // Phase 1, 6 s: gold asks 40/s (164 KB/s, under its 200 KB/s reservation); bronze asks
    // 60/s (246 KB/s) against its 100 KB/s limit.
    let p1 = tokio::join!(
        offer(kv, "gold", 40.0, 6.0, clock.clone(), samples.clone()),
        offer(kv, "bronze", 60.0, 6.0, clock.clone(), samples.clone()),
    );
    let _ = p1;
    let phase1: Vec<Sample> = samples.lock().unwrap().drain(..).filter(|s| s.at >= 1.0).collect();
    let first = phase1.iter().map(|s| s.at).fold(f64::INFINITY, f64::min);
    let window = phase1.iter().map(|s| s.at).fold(0.0, f64::max) - first;
    let ok = |t: &str| phase1.iter().filter(|s| s.tenant == t && s.status == 204).count() as f64;
    let refused: Vec<&Sample> = phase1.iter().filter(|s| s.tenant == "bronze" && s.status == 429).collect();
    let mut counts = std::collections::BTreeMap::new();
    for s in &phase1 {
        *counts.entry((s.tenant, s.status, s.retry_after)).or_insert(0) += 1;
    }
    println!("phase 1: {counts:?} over {window:.1} s");
    assert!(
        !refused.is_empty() && refused.iter().all(|s| s.retry_after.unwrap_or(0) >= 1),
        "429s carry Retry-After"
    );
    let bronze_rate = ok("bronze") / window * VALUE_BYTES as f64;
    assert!(
        (bronze_rate - 100_000.0).abs() <= 0.2 * 100_000.0,
        "bronze admitted {bronze_rate} B/s against a 100000 limit"
    );
    let gold_offered = phase1.iter().filter(|s| s.tenant == "gold").count() as f64;
    assert!(ok("gold") >= 0.95 * gold_offered, "gold got {} of {gold_offered}", ok("gold"));

    // Phase 2, 16 s: bronze's limit is lifted and it asks 400/s (1.6 MB/s): far over the
    // service's 1 MB/s. The controller must limit it from the service's reports.
    admin(&url, &["group", "alter", "bronze", "--limit", "unlimited"]);
    // Watched until a second before the offers end: a look (a `tollgate status` and the
    // service's figures) may take that long on a busy machine.
    let until = clock.now().as_secs_f64() + 15.0;
    let status = tokio::spawn(watch_bronze(url.clone(), kv_addr.clone(), clock.clone(), until));
    let _ = tokio::join!(
        offer(kv, "gold", 40.0, 16.0, clock.clone(), samples.clone()),
        offer(kv, "bronze", 400.0, 16.0, clock.clone(), samples.clone()),
    );
    let (busy_seen, utilisation) = status.await.unwrap();
    assert!(busy_seen, "the controller marked bronze busy");
    let settled: Vec<f64> = utilisation[utilisation.len() - 5..].to_vec();
    let mean = settled.iter().sum::<f64>() / settled.len() as f64;
    assert!((0.7..=1.3).contains(&mean), "utilisation settled at {mean} ({utilisation:?})");

    // The last 8 of phase 2's 16 seconds.
    let end = samples.lock().unwrap().iter().map(|s| s.at).fold(0.0, f64::max);
    let phase2: Vec<Sample> = samples.lock().unwrap().iter().filter(|s| s.at >= end - 8.0).cloned().collect();
    let latencies = |t: &str| {
        phase2.iter().filter(|s| s.tenant == t && s.status == 204).map(|s| s.latency).collect::<Vec<_>>()
    };
    let (gold_lat, bronze_lat) = (latencies("gold"), latencies("bronze"));
    assert!(!gold_lat.is_empty() && !bronze_lat.is_empty());
    let (g, b) = (median(gold_lat.clone()), median(bronze_lat));
    let mut counts = std::collections::BTreeMap::new();
    for s in &phase2 {
        *counts.entry((s.tenant, s.status)).or_insert(0) += 1;
    }
    println!(
        "phase 2, last 8 s: {counts:?}; medians: gold {:.1} ms, bronze {:.1} ms; utilisation {utilisation:?}",
        g * 1e3,
        b * 1e3
    );
    assert!(g < b, "gold median {g} s, bronze median {b} s");
    // A tenant header that is no valid group name falls back to the default group, which
    // has no settings here: admitted.
    let long = "x".repeat(300);
    let req = format!(
        "PUT /kv/odd HTTP/1.1\r\nHost: {kv}\r\nx-tollgate-group: {long}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    );
    // The service waits 50 ms for a group's first grant; a loaded machine may take longer, and
    // the refusal then says to retry: do, a bounded number of times.
    let mut reply = http(kv, req.as_bytes()).await.unwrap();
    for _ in 0..50 {
        if !reply.starts_with("HTTP/1.1 429") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        reply = http(kv, req.as_bytes()).await.unwrap();
    }
    assert!(reply.starts_with("HTTP/1.1 204"), "{reply}");
    // Gold asked for less than its reservation and kept getting it.
    let gold_offered = phase2.iter().filter(|s| s.tenant == "gold").count() as f64;
    assert!(gold_lat.len() as f64 >= 0.9 * gold_offered, "gold got {} of {gold_offered}", gold_lat.len());
}

/// Saturation with the default knobs, as a new user meets it: two tenants nobody configured
/// (no reservation, no limit, the same priority) on one real service reporting its
/// utilisation. The noisy one asks 1.6 MB/s of a 1 MB/s service, the small one 164 KB/s, under
/// its fair half: the controller cuts the noisy one until the service is at its target, and
/// the small one keeps getting what it asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_at_the_defaults_cuts_the_noisy_tenant_and_spares_the_small_one() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-fair");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--ignore-worst-zones", "0"]), "grpc ");
    let url = format!("http://{grpc}");
    let (_kv, kv_addr) = start_kv(&url, &["--concurrency", "4"]);
    let kv: SocketAddr = kv_addr.parse().unwrap();
    let clock = TokioClock::new();
    let samples = Arc::new(Mutex::new(Vec::new()));
    // Watched until a second before the offers end, as above.
    let until = clock.now().as_secs_f64() + 15.0;
    let utilisation = {
        let (kv_addr, clock) = (kv_addr.clone(), clock.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if clock.now().as_secs_f64() >= until {
                    break seen;
                }
                seen.push(get_json(&kv_addr, "/stats").await["utilisation"].as_f64().unwrap());
            }
        })
    };
    let _ = tokio::join!(
        offer(kv, "small", 40.0, 16.0, clock.clone(), samples.clone()),
        offer(kv, "noisy", 400.0, 16.0, clock.clone(), samples.clone()),
    );
    let utilisation = utilisation.await.unwrap();
    let end = samples.lock().unwrap().iter().map(|s| s.at).fold(0.0, f64::max);
    let last: Vec<Sample> = samples.lock().unwrap().iter().filter(|s| s.at >= end - 8.0).cloned().collect();
    let share = |t: &str| {
        let offered = last.iter().filter(|s| s.tenant == t).count() as f64;
        let ok = last.iter().filter(|s| s.tenant == t && s.status == 204).count() as f64;
        (ok, offered)
    };
    let ((small, small_offered), (noisy, noisy_offered)) = (share("small"), share("noisy"));
    let mut counts = std::collections::BTreeMap::new();
    for s in &last {
        *counts.entry((s.tenant, s.status)).or_insert(0) += 1;
    }
    let small_latency = median(last.iter().filter(|s| s.tenant == "small").map(|s| s.latency).collect());
    println!(
        "last 8 s: {counts:?}, the small tenant's median {:.1} ms; utilisation {utilisation:?}",
        small_latency * 1e3
    );
    let settled = &utilisation[utilisation.len() - 5..];
    let mean = settled.iter().sum::<f64>() / settled.len() as f64;
    assert!((0.7..=1.3).contains(&mean), "utilisation settled at {mean} ({utilisation:?})");
    assert!(noisy < 0.8 * noisy_offered, "the noisy tenant was cut: {noisy} of {noisy_offered}");
    assert!(small >= 0.9 * small_offered, "the small tenant kept what it asked: {small} of {small_offered}");
}

/// Polls the service's `/stats` (up to a minute: a bound for a stuck test, not a timing
/// assertion) until `done` holds; the last stats.
async fn stats_until(kv: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    for _ in 0..600 {
        let stats = get_json(kv, "/stats").await;
        if done(&stats) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_takes_soft_quotas_from_the_controller_and_compacts_in_the_background() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-backend");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--ignore-worst-zones", "0"]), "grpc ");
    let url = format!("http://{grpc}");
    admin(&url, &["group", "create", "tenant"]);
    admin(&url, &["group", "create", "compaction", "--background", "true", "--priority", "low"]);
    let (_kv, kv_addr) = start_kv(&url, &["--compact-every", "1"]);
    let kv: SocketAddr = kv_addr.parse().unwrap();
    let clock = TokioClock::new();
    let first =
        stats_until(&kv_addr, "settings fetched", |s| s["settings_version"].as_u64() != Some(0)).await;
    // The first request of a group may be refused while its first grant is on its way (the
    // service waits 50 ms for it): store each value, trying again after a refusal (bounded).
    for key in 0..10 {
        let mut status = 0;
        for _ in 0..100 {
            status = put(kv, "tenant", key, &clock).await.unwrap().status;
            if status != 429 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status, 204);
    }
    // The table is compacted, step by step, through the scheduler.
    stats_until(&kv_addr, "a compaction", |s| s["compacted_bytes"].as_u64() >= Some(10 * VALUE_BYTES as u64))
        .await;

    // A soft quota of one value per second on this service: pushed to it, then held there
    // although the service is nearly idle. Ten values at once book ten seconds: those past
    // the scheduler's 5 s wait are refused with 429.
    admin(&url, &["group", "alter", "tenant", "--backend-limit", &VALUE_BYTES.to_string()]);
    stats_until(&kv_addr, "the new settings", |s| s["settings_version"] != first["settings_version"]).await;
    let tasks: Vec<_> = (10..20)
        .map(|key| {
            let clock = clock.clone();
            tokio::spawn(async move { put(kv, "tenant", key, &clock).await.unwrap() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status);
    }
    statuses.sort_unstable();
    let ok = statuses.iter().filter(|s| **s == 204).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    println!("under a soft quota: {statuses:?}");
    assert!(ok >= 1 && refused >= 1 && ok + refused == 10, "{statuses:?}");
}

/// Units served of each tenant by each of three services behind one controller, over 6 s
/// after 4 s of warming up: `spread` keeps 4 requests waiting on each service, and `one`,
/// `two` and `three` 4 each on their own service. Each service serves one request of 4 KiB at
/// a time, about 100 a second; saturation limiting is out of the way (nobody reaches the
/// limiting threshold), so the services' schedulers alone decide who goes first.
async fn served_by_three_services(name: &str, more: &[&str]) -> Vec<HashMap<String, f64>> {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&data);
    let (server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--limiting-threshold", "1e15"]), "grpc ");
    let url = format!("http://{grpc}");
    let args = [&["--concurrency", "1", "--capacity", "409600"], more].concat();
    let services: Vec<(Proc, String)> = (0..3).map(|_| start_kv(&url, &args)).collect();
    let clock = TokioClock::new();
    let mut loops = tokio::task::JoinSet::new();
    for (i, (_, addr)) in services.iter().enumerate() {
        let own: &'static str = ["one", "two", "three"][i];
        for (tenant, n) in [("spread", 4), (own, 4)] {
            for k in 0..n {
                let (addr, clock): (SocketAddr, _) = (addr.parse().unwrap(), clock.clone());
                loops.spawn(async move {
                    for key in 0u64.. {
                        let ok =
                            put(addr, tenant, key * 8 + k, &clock).await.is_some_and(|s| s.status == 204);
                        if !ok {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                });
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let served = |stats: serde_json::Value| -> HashMap<String, f64> {
        serde_json::from_value(stats["served"].clone()).unwrap()
    };
    let mut before = Vec::new();
    for (_, addr) in &services {
        before.push(served(get_json(addr, "/stats").await));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut out = Vec::new();
    for ((_, addr), before) in services.iter().zip(before) {
        let stats = get_json(addr, "/stats").await;
        println!("{name} {addr}: charged for elsewhere {}", stats["elsewhere"]);
        let mut now = served(stats);
        for (tenant, units) in &mut now {
            *units -= before.get(tenant).copied().unwrap_or(0.0);
        }
        out.push(now);
    }
    loops.abort_all();
    drop((services, server));
    out
}

/// dmClock's cross-backend term live: a tenant spread over three services gets its share of
/// all three together (a quarter, beside three tenants on one service each), where each
/// service scheduling alone gives it half of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_spread_over_three_services_gets_its_share_of_all_of_them() {
    let (across, alone) = tokio::join!(
        served_by_three_services("e2e-across", &[]),
        served_by_three_services("e2e-alone", &["--per-backend"]),
    );
    let share = |served: &[HashMap<String, f64>]| {
        let all: f64 = served.iter().flat_map(|s| s.values()).sum();
        let spread: f64 = served.iter().filter_map(|s| s.get("spread")).sum();
        spread / all
    };
    let (across_share, alone_share) = (share(&across), share(&alone));
    println!(
        "the spread tenant's share: {across_share:.3} across ({across:?}), {alone_share:.3} alone ({alone:?})"
    );
    assert!((0.19..=0.31).contains(&across_share), "across the services: {across_share}");
    assert!(alone_share >= 0.42, "each service alone: {alone_share}");
}

/// `tollgate bench surge`, the load program that measures how fast a surge is reined in, runs
/// against the real service and prints its figures (a short run: what it measures is in
/// BENCHMARKS.md, not asserted here).
#[test]
fn bench_surge_drives_the_service_and_prints_its_figures() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-surge");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--ignore-worst-zones", "0"]), "grpc ");
    let url = format!("http://{grpc}");
    let (_kv, kv_addr) = start_kv(&url, &["--concurrency", "4"]);
    let out = Command::new(BIN)
        .args(["bench", "surge", "--server", &url, "--service", &kv_addr, "--before", "1", "--duration", "3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "bronze marked busy:",
        "until the controller's tick took the lift",
        "peak utilisation:",
        "within 5 % of 1 from:",
        "median latency (surge):",
    ] {
        assert!(text.contains(line), "{line} missing from {text}");
    }
    // Both tenants were served during the surge: the program drove the real service.
    let answers = text.lines().find(|l| l.starts_with("answers (surge):")).unwrap();
    let stored: Vec<u64> =
        answers.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    assert!(stored.len() == 4 && stored[0] > 0 && stored[2] > 0, "{answers}");
    // The groups it made are the controller's own.
    let list = Command::new(BIN).args(["group", "list"]).env("TOLLGATE_SERVER", &url).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.contains("gold") && list.contains("bronze"), "{list}");
    // A service that is not there is named.
    let out = Command::new(BIN)
        .args([
            "bench",
            "surge",
            "--server",
            &url,
            "--service",
            "127.0.0.1:1",
            "--before",
            "1",
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read http://127.0.0.1:1/stats"));
}

/// `tollgate bench overload` runs against the real service and prints its table (a short run:
/// what it measures is in BENCHMARKS.md, not asserted here); the service takes a request's
/// class from its header and refuses one that names no class.
#[test]
fn bench_overload_drives_the_service_with_request_classes() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-overload");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--ignore-worst-zones", "0"]), "grpc ");
    let url = format!("http://{grpc}");
    let (_kv, kv_addr) = start_kv(&url, &["--concurrency", "4"]);
    let args =
        ["bench", "overload", "--server", &url, "--service", &kv_addr, "--unloaded", "2", "--duration", "3"];
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for run in ["unloaded", "overloaded, classes", "overloaded, none"] {
        let line =
            text.lines().find(|l| l.starts_with(run)).unwrap_or_else(|| panic!("{run} missing from {text}"));
        let sent: u64 = line[run.len()..].split_whitespace().next().unwrap().parse().unwrap();
        assert!(sent > 0, "{line}");
    }
    assert!(text.contains("critical p99 over unloaded:"), "{text}");
    let show =
        Command::new(BIN).args(["group", "show", "shop"]).env("TOLLGATE_SERVER", &url).output().unwrap();
    assert!(String::from_utf8_lossy(&show.stdout).contains("shop"), "the group is the controller's own");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kv: SocketAddr = kv_addr.parse().unwrap();
    let req = format!(
        "PUT /kv/c HTTP/1.1\r\nHost: {kv}\r\nx-tollgate-group: shop\r\nx-tollgate-class: urgent\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    );
    let reply = rt.block_on(http(kv, req.as_bytes())).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 400") && reply.contains("x-tollgate-class: must be critical"),
        "{reply}"
    );
}

/// `tollgate bench capacity` runs its learned arm against the real service doing real work
/// (a short run: what it measures is in BENCHMARKS.md, not asserted here); the service names
/// the options it refuses and the bench the arm a service does not run.
#[test]
fn bench_capacity_drives_a_service_that_learns_its_limit() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-capacity");
    let _ = std::fs::remove_dir_all(&data);
    let (_server, grpc) =
        start(server_command(&data, "127.0.0.1:0").args(["--ignore-worst-zones", "0"]), "grpc ");
    let url = format!("http://{grpc}");
    let kv_with = |more: &[&str]| {
        let mut cmd = Command::new(kv_service_binary());
        cmd.args(["--controller", &url, "--listen", "127.0.0.1:0", "--work", "cpu", "--rounds", "20"])
            .args(more);
        cmd
    };
    for (more, named) in
        [(&["--capacity", "5"][..], "--capacity"), (&["--admit-wait", "-1"][..], "--admit-wait")]
    {
        let out = kv_with(more).output().unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(named),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (_kv, kv_addr) = start(&mut kv_with(&["--learn", "--concurrency", "64"]), "listening on ");
    let bench = |more: &[&str]| {
        let args = ["bench", "capacity", "--server", &url, "--service", &kv_addr, "--best", "100"];
        Command::new(BIN).args(args).args(more).output().unwrap()
    };
    let wrong = bench(&["--arm", "none"]);
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("without --learn"));
    let args =
        ["--arm", "learned", "--times", "2", "--duration", "3", "--slowdown", "6", "--client-throttle"];
    let out = bench(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for row in ["learned      2x", "learned    slow", "unloaded p99", "slowdown: learned rate"] {
        assert!(text.contains(row), "{row} missing from {text}");
    }
    // Each row ends with where the refused writes went: shares of what was offered.
    for row in text.lines().filter(|l| l.starts_with("learned ")) {
        let words: Vec<&str> = row.split_whitespace().collect();
        let shares: Vec<f64> = words[words.len() - 5..]
            .iter()
            .filter(|w| **w != "/")
            .map(|w| w.trim_end_matches('%').parse().unwrap())
            .collect();
        assert_eq!(shares.len(), 3, "{row}");
        assert!(
            shares.iter().all(|s| (0.0..=100.0).contains(s)) && shares.iter().sum::<f64>() <= 102.0,
            "{row}"
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kv: SocketAddr = kv_addr.parse().unwrap();
    let stats =
        rt.block_on(http(kv, b"GET /stats HTTP/1.1\r\nHost: kv\r\nConnection: close\r\n\r\n")).unwrap();
    assert!(stats.contains("\"noload_ms\"") && stats.contains("\"capacity\":null"), "{stats}");
    let slow = b"PUT /slowdown HTTP/1.1\r\nHost: kv\r\nContent-Length: 3\r\nConnection: close\r\n\r\n101";
    let reply = rt.block_on(http(kv, slow)).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 400") && reply.contains("slowdown: a whole factor from 1 to 100"),
        "{reply}"
    );
}
