//! Real Envoys with the quota filter (`envoy.filters.http.rate_limit_quota`, the shipped
//! `examples/envoy/rlqs.yaml`) in front of one upstream, with `tollgate server` as their Rate
//! Limit Quota Service: each Envoy enforces the token bucket Tollgate assigns it and reports
//! its use on one stream, with no call per request.

use std::io::Write;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common;
use common::envoy::{Envoy, KeepAlive, counter, envoy, get, upstream};
use common::{ServerProc, admin, data_dir, eventually, free_port, metric, metric_of};

/// What one Envoy's clients saw: admitted, refused, anything else.
#[derive(Default)]
struct Seen {
    ok: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
}

impl Seen {
    fn count(&self, code: Option<u16>) {
        match code {
            Some(200) => self.ok.fetch_add(1, Ordering::Relaxed),
            Some(429) => self.limited.fetch_add(1, Ordering::Relaxed),
            _ => self.other.fetch_add(1, Ordering::Relaxed),
        };
    }

    fn snapshot(&self) -> [u64; 3] {
        [&self.ok, &self.limited, &self.other].map(|c| c.load(Ordering::Relaxed))
    }
}

/// Clients of `tenant` through each Envoy until `stop`: `workers[i]` asking as fast as Envoy
/// answers, or (when `paced[i]` is set) each asking up to that many times a second.
fn load(
    envoys: &[&Envoy],
    tenant: &'static str,
    workers: &[usize],
    paced: &[Option<u64>],
    stop: &Arc<AtomicBool>,
) -> Vec<Arc<Seen>> {
    let mut seen = Vec::new();
    for (i, e) in envoys.iter().enumerate() {
        let s = Arc::new(Seen::default());
        seen.push(s.clone());
        let port = e.listen;
        for _ in 0..workers[i] {
            let (s, stop, every) = (s.clone(), stop.clone(), paced[i]);
            std::thread::spawn(move || {
                let mut client = KeepAlive::new(port);
                while !stop.load(Ordering::Relaxed) {
                    s.count(client.get(&[("x-tenant", tenant)]));
                    if let Some(per_s) = every {
                        // Load at a set rate (not a wait for an outcome).
                        std::thread::sleep(Duration::from_micros(1_000_000 / per_s));
                    }
                }
            });
        }
    }
    seen
}

fn diff(after: [u64; 3], before: [u64; 3]) -> [u64; 3] {
    [after[0] - before[0], after[1] - before[1], after[2] - before[2]]
}

/// Counts from every Envoy over a window of `secs` seconds: each Envoy's (admitted, refused,
/// other), and the window's true length.
fn window(seen: &[Arc<Seen>], secs: u64) -> (Vec<[u64; 3]>, f64) {
    let before: Vec<_> = seen.iter().map(|s| s.snapshot()).collect();
    #[allow(clippy::disallowed_methods)] // the window an admitted rate is measured over
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let after: Vec<_> = seen.iter().map(|s| s.snapshot()).collect();
    let elapsed = started.elapsed().as_secs_f64();
    (after.into_iter().zip(before).map(|(a, b)| diff(a, b)).collect(), elapsed)
}

/// An admin change, waiting up to a minute: a change is durable before it is answered, and on a
/// disk shared with the whole test suite a write has been seen to wait over ten seconds.
fn alter(url: &str, args: &[&str]) {
    let out = std::process::Command::new(common::BIN)
        .args(args)
        .env("TOLLGATE_SERVER", url)
        .env("TOLLGATE_TIMEOUT_MS", "60000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn envoys_hold_a_group_to_its_limit_on_tollgates_assignments_through_a_change_and_a_restart() {
    let dir = data_dir("rlqs");
    let grpc = free_port();
    let grpc_addr = format!("127.0.0.1:{grpc}");
    let flags = ["--tick-ms", "250"];
    let log = |n: u32| Stdio::from(std::fs::File::create(dir.join(format!("server-{n}.log"))).unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let s = ServerProc::start_at(&dir.join("data"), &grpc_addr, &flags, log(1));
    admin(&s.url(), &["group", "create", "acme", "--limit", "300"]);
    admin(&s.url(), &["group", "create", "tiny", "--limit", "1"]);
    let up = upstream();
    let envoys: Vec<Envoy> = (0..3).map(|_| envoy(&dir, "rlqs.yaml", grpc, up, &[])).collect();
    let all: Vec<&Envoy> = envoys.iter().collect();
    // Two Envoys asked up to 1,000 times a second each, several times their share of 300; the
    // third at 40 a second, below its fair share: the split by demand gives it what it asks
    // and the other two the rest. (Asked as fast as they answer, the two took both cores for
    // the whole test, starving every test beside it.)
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(&all, "acme", &[1, 1, 1], &[Some(1000), Some(1000), Some(40)], &stop);
    // Warm: the busy Envoys refuse (they enforce assignments), and two full reports from each
    // (Envoy reports every 5 s) have carried every Envoy's demand, then a tick has split it.
    eventually("the busy Envoys refuse", || seen[..2].iter().all(|s| s.snapshot()[1] > 0));
    let reports = metric(&s.http, "tollgate_rlqs_reports_total");
    eventually("two reports from each Envoy", || {
        metric(&s.http, "tollgate_rlqs_reports_total") >= reports + 6.0
    });
    let ticks = metric(&s.http, "tollgate_ticks_total");
    eventually("a tick since", || metric(&s.http, "tollgate_ticks_total") >= ticks + 2.0);

    // Thirty seconds at 300 a second.
    let reports = metric(&s.http, "tollgate_rlqs_reports_total");
    let (counts, elapsed) = window(&seen, 30);
    let reports = metric(&s.http, "tollgate_rlqs_reports_total") - reports;
    let ok: u64 = counts.iter().map(|c| c[0]).sum();
    let asked: u64 = counts.iter().map(|c| c[0] + c[1]).sum();
    let figures = format!("{counts:?} in {elapsed:.2} s; {reports} reports");
    let _ = writeln!(std::io::stderr(), "steady: {figures}");
    assert!(counts.iter().all(|c| c[2] == 0), "only 200 and 429: {figures}");
    let (expected, burst) = (300.0 * elapsed, 300.0);
    assert!(
        ok as f64 >= 0.98 * expected && ok as f64 <= 1.02 * expected + burst,
        "the group is held to its limit within 2 % (plus a burst): {ok} admitted, {expected:.0} expected: {figures}"
    );
    // Fair by demand: the slow Envoy gets what it asks, the busy ones split the rest evenly.
    let slow = counts[2];
    assert!(slow[0] as f64 >= 0.95 * (slow[0] + slow[1]) as f64, "the slow Envoy is served: {figures}");
    let (a, b) = (counts[0][0] as f64, counts[1][0] as f64);
    assert!((a - b).abs() <= 0.1 * a.max(b), "the busy Envoys split evenly: {figures}");
    // No call per request: a report per Envoy every 5 s, on one stream each.
    assert!(asked > 100 * reports as u64, "far fewer reports than requests: {figures}");
    assert!(reports <= 3.0 * (elapsed / 5.0 + 2.0), "{figures}");
    for e in &envoys {
        assert_eq!(counter(e.admin, "cluster.tollgate.upstream_rq_total"), 1, "one stream per Envoy");
    }

    // The limit halves: new assignments are out within two ticks (to the busy Envoys: the slow
    // one's share, what it asks, is unchanged).
    // Counted from the change's answer: it is in force once durable, and a slow disk may hold
    // the answer for several ticks.
    let assigned = metric(&s.http, "tollgate_rlqs_assigned_total");
    alter(&s.url(), &["group", "alter", "acme", "--limit", "150"]);
    let ticks = metric(&s.http, "tollgate_ticks_total");
    eventually("two ticks", || metric(&s.http, "tollgate_ticks_total") >= ticks + 2.0);
    let reassigned = metric(&s.http, "tollgate_rlqs_assigned_total") - assigned;
    assert!(reassigned >= 2.0, "the busy Envoys have new assignments within two ticks: {reassigned}");
    let (counts, elapsed) = window(&seen, 5);
    let ok: u64 = counts.iter().map(|c| c[0]).sum();
    let (expected, burst) = (150.0 * elapsed, 150.0);
    let _ = writeln!(std::io::stderr(), "after the change: {counts:?} in {elapsed:.2} s");
    assert!(
        ok as f64 >= 0.95 * expected && ok as f64 <= 1.02 * expected + burst,
        "held to the new limit: {ok} admitted, {expected:.0} expected"
    );

    // Tollgate stops. Envoy keeps enforcing the assignments it holds until their time to live
    // (10 s, renewed every 5 s) runs out; a bucket new meanwhile has none, and follows the
    // no-assignment behaviour (allow all).
    #[allow(clippy::disallowed_methods)] // how long the kill took, to know what time to live is left
    let killing = Instant::now();
    drop(s);
    let killed_in = killing.elapsed();
    let (counts, elapsed) = window(&seen, 3);
    let ok: u64 = counts.iter().map(|c| c[0]).sum();
    let _ =
        writeln!(std::io::stderr(), "Tollgate down (killed in {killed_in:?}): {counts:?} in {elapsed:.2} s");
    // A process is gone only once its last disk write is: on a slow disk that may be past the
    // assignments' time to live, and then Envoy rightly allows all.
    if killed_in < Duration::from_secs(1) {
        assert!(ok as f64 <= 1.02 * 150.0 * elapsed + 150.0, "still held while Tollgate is down: {ok}");
    }
    let fresh: Vec<_> = (0..20).map(|_| get(envoys[0].listen, "/", Some("tiny")).map(|(c, _)| c)).collect();
    assert!(fresh.iter().all(|c| *c == Some(200)), "no assignment yet: allowed: {fresh:?}");

    // Back on the same port: each Envoy opens a new stream at its next report, and takes up the
    // restarted controller's assignments without granting more than the limit.
    let s = ServerProc::start_at(&dir.join("data"), &grpc_addr, &flags, log(2));
    eventually("every Envoy is back", || metric(&s.http, "tollgate_rlqs_streams") >= 3.0);
    eventually("the tiny group is enforced", || {
        (0..5).filter(|_| get(envoys[0].listen, "/", Some("tiny")).is_some_and(|(c, _)| c == 429)).count() > 0
    });
    let (counts, elapsed) = window(&seen, 5);
    stop.store(true, Ordering::Relaxed);
    let ok: u64 = counts.iter().map(|c| c[0]).sum();
    let _ = writeln!(std::io::stderr(), "after the restart: {counts:?} in {elapsed:.2} s");
    assert!(ok as f64 <= 1.02 * 150.0 * elapsed + 150.0, "no over-grant after the restart: {ok}");
    assert!(counts.iter().all(|c| c[2] == 0), "only 200 and 429 throughout");
}

/// Envoy's fallbacks, made to deny (what a group with quotas needs): before its first
/// assignment, and once one has run out with Tollgate gone.
const DENY_FALLBACKS: [(&str, &str); 2] = [
    ("fallback_rate_limit: { blanket_rule: ALLOW_ALL }", "fallback_rate_limit: { blanket_rule: DENY_ALL }"),
    ("token_bucket: { max_tokens: 50, tokens_per_fill: 50, fill_interval: 1s }", "blanket_rule: DENY_ALL"),
];

/// A server with group `acme` given `quota`, on a free gRPC port, logging into the test's
/// directory `name`: the server, its gRPC port and the directory.
fn quota_server(name: &str, quota: &str) -> (ServerProc, u16, std::path::PathBuf) {
    let dir = data_dir(name);
    let grpc = free_port();
    std::fs::create_dir_all(&dir).unwrap();
    let log = Stdio::from(std::fs::File::create(dir.join("server.log")).unwrap());
    let s = ServerProc::start_at(&dir.join("data"), &format!("127.0.0.1:{grpc}"), &["--tick-ms", "250"], log);
    admin(&s.url(), &["group", "create", "acme", "--quota", quota]);
    (s, grpc, dir)
}

/// Once `served` requests are admitted and each of `envoys` Envoys has reported three more
/// times, stops the load: each Envoy's counts (only 200 and 429 allowed) and the admitted.
fn served_then_held(
    s: &ServerProc,
    seen: &[Arc<Seen>],
    stop: &AtomicBool,
    served: u64,
    envoys: usize,
) -> (Vec<[u64; 3]>, u64) {
    let admitted = || seen.iter().map(|s| s.snapshot()[0]).sum::<u64>();
    // Served: all but what the last assignments hold unspent comes through.
    eventually("most of the quota is served", || admitted() >= served);
    // And then held: three more reports from each Envoy.
    let reports = metric(&s.http, "tollgate_rlqs_reports_total");
    eventually("three reports from each Envoy", || {
        metric(&s.http, "tollgate_rlqs_reports_total") >= reports + 3.0 * envoys as f64
    });
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<[u64; 3]> = seen.iter().map(|s| s.snapshot()).collect();
    assert!(counts.iter().all(|c| c[2] == 0), "only 200 and 429: {counts:?}");
    let ok = counts.iter().map(|c| c[0]).sum();
    (counts, ok)
}

#[test]
fn envoys_never_admit_more_than_a_quota_and_serve_it_all() {
    let (s, grpc, dir) = quota_server("rlqs-quota", "400/total");
    let up = upstream();
    let envoys: Vec<Envoy> = (0..3).map(|_| envoy(&dir, "rlqs.yaml", grpc, up, &DENY_FALLBACKS)).collect();
    let all: Vec<&Envoy> = envoys.iter().collect();
    // Two Envoys asked 200 times a second each, one 20 times: 400 is gone in a few seconds.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(&all, "acme", &[1, 1, 1], &[Some(200), Some(200), Some(20)], &stop);
    let (counts, ok) = served_then_held(&s, &seen, &stop, 300, 3);
    let _ = writeln!(std::io::stderr(), "quota of 400: {counts:?}");
    assert!(ok <= 400, "a quota of 400 admitted {ok}: {counts:?}");
    // What the controller counts is what Envoy admitted, once Envoy has reported it.
    eventually("Tollgate counts what Envoy admitted", || {
        metric_of(&s.http, "tollgate_group_consumed_units_total", "group=\"acme\"") == Some(ok as f64)
    });
}

/// Dear requests through Envoy's quota service: a bucket id carrying `tollgate_cost` counts
/// each request at that many units, so a quota of 400 units admits at most 50 requests of 8,
/// serves most of them, and the controller counts 8 units for each.
#[test]
fn a_buckets_cost_counts_each_request_at_its_units() {
    let (s, grpc, dir) = quota_server("rlqs-cost", "400/total");
    let up = upstream();
    let cost = (
        "                          # How often Envoy reports",
        "                              tollgate_cost:\n                                string_value: \"8\"\n                          # How often Envoy reports",
    );
    let edits = [DENY_FALLBACKS[0], DENY_FALLBACKS[1], cost];
    let envoys: Vec<Envoy> = (0..2).map(|_| envoy(&dir, "rlqs.yaml", grpc, up, &edits)).collect();
    let all: Vec<&Envoy> = envoys.iter().collect();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(&all, "acme", &[1, 1], &[Some(100), Some(20)], &stop);
    let (counts, ok) = served_then_held(&s, &seen, &stop, 30, 2);
    let _ = writeln!(std::io::stderr(), "quota of 400 units, requests of 8: {counts:?}");
    assert!(ok <= 50, "a quota of 400 units admitted {ok} requests of 8: {counts:?}");
    eventually("Tollgate counts 8 units for each request Envoy admitted", || {
        metric_of(&s.http, "tollgate_group_consumed_units_total", "group=\"acme\"") == Some(8.0 * ok as f64)
    });
}

/// docs/envoy.md shows each shipped Envoy configuration whole, as the tests run it.
#[test]
fn the_envoy_docs_show_each_shipped_configuration_whole() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let doc = std::fs::read_to_string(format!("{root}/docs/envoy.md")).unwrap();
    for file in ["envoy.yaml", "rlqs.yaml", "charge.yaml", "in-flight.yaml"] {
        let text = std::fs::read_to_string(format!("{root}/examples/envoy/{file}")).unwrap();
        assert!(
            doc.contains(&format!("```yaml\n{}\n```", text.trim_end())),
            "docs/envoy.md shows {file} as it is"
        );
    }
}
