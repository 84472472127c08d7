//! Settings in a real etcd, shared by real `tollgate server` processes (built with the `etcd`
//! feature, as the test command builds them).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tollgate_testkit::etcd::Etcd;

use crate::common;
use common::{BIN, admin, eventually};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server(etcd: &str, prefix: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "server",
        "--etcd",
        etcd,
        "--etcd-prefix",
        prefix,
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ]);
    cmd
}

/// Starts a controller; it and its gRPC URL.
fn start(etcd: &str, prefix: &str) -> (Killed, String) {
    let (k, grpc, _) = start_with_http(etcd, prefix);
    (k, grpc)
}

/// Starts a controller; it, its gRPC URL and its HTTP address.
fn start_with_http(etcd: &str, prefix: &str) -> (Killed, String, String) {
    start_with(etcd, prefix, &[])
}

/// Starts a controller with more options; it, its gRPC URL and its HTTP address.
fn start_with(etcd: &str, prefix: &str, more: &[&str]) -> (Killed, String, String) {
    let mut child =
        server(etcd, prefix).args(more).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let word = |i: usize| {
        line.split_whitespace().nth(i).unwrap_or_else(|| panic!("listening line: {line:?}")).to_string()
    };
    (Killed(child), format!("http://{}", word(4)), word(6))
}

/// A controller's `/status` JSON, or `None` while it does not answer.
pub(crate) fn status(http: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&get(http, "/status")?).ok()
}

/// The body of `GET path` from a controller's HTTP address, or `None` while it does not answer.
fn get(http: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    // A long body is sent in chunks.
    Some(if head.to_lowercase().contains("transfer-encoding: chunked") {
        common::dechunk(body)
    } else {
        body.to_string()
    })
}

pub(crate) fn output(url: &str, args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs `tollgate ARGS`, which must fail to start; what it said on standard error.
fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `etcdctl ARGS` against the etcd at `url`, which must succeed; what it printed.
fn etcdctl(url: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .args(["--endpoints", url])
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl (Debian's etcd-client) runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the paced clients (see [`paced`]) and waits for each.
pub(crate) async fn stop_all(stop: &std::sync::atomic::AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
}

/// Waits (up to a minute: a bound for a stuck test, not a timing assertion) until `done`.
#[test]
fn controllers_on_one_etcd_share_every_setting_and_keep_it_across_a_kill() {
    let etcd = Etcd::start("shared");
    let (a, a_url) = start(&etcd.url(), "/tollgate");
    let (_b, b_url) = start(&etcd.url(), "/tollgate");
    // A change through either controller is acknowledged once etcd has it, and the other one
    // sees it through its watch.
    admin(&a_url, &["group", "create", "shared", "--limit", "500", "--backend-limit", "50"]);
    eventually("b sees the group", || output(&b_url, &["group", "show", "shared"]).contains("limit:    500"));
    admin(&b_url, &["node", "capacity", "900"]);
    eventually("a sees the capacity", || {
        output(&a_url, &["status", "--json"]).contains("\"capacity\":900.0")
    });
    admin(&b_url, &["group", "alter", "shared", "--limit", "700"]);
    eventually("a sees the change", || {
        output(&a_url, &["group", "show", "shared"]).contains("limit:    700")
    });

    // kill -9 one controller and start it again: everything is still there.
    drop(a);
    let (_a, a_url) = start(&etcd.url(), "/tollgate");
    let shown = output(&a_url, &["group", "show", "shared"]);
    assert!(shown.contains("limit:    700") && shown.contains("at most 50 units/s"), "{shown}");
    assert!(output(&a_url, &["status", "--json"]).contains("\"capacity\":900.0"));

    // A drop through one is seen by the other.
    admin(&b_url, &["group", "drop", "shared"]);
    eventually("a sees the drop", || output(&a_url, &["group", "show", "shared"]).contains("does not exist"));

    // One audit log for all of them, in etcd.
    let audit = output(&a_url, &["audit", "--json"]);
    let whats: Vec<String> = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["what"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(whats, ["group.put shared", "node.set", "group.put shared", "group.drop shared"], "{audit}");

    // Another prefix is another set of settings.
    let (_c, c_url) = start(&etcd.url(), "/elsewhere");
    assert!(output(&c_url, &["status", "--json"]).contains("\"capacity\":null"));
}

/// Regression: three controllers started at the same moment on an empty prefix (a StatefulSet with
/// parallel start) could lose one: it saw another's first writes before that one's format key
/// and refused the prefix as foreign. Every start of three together, twenty times over, starts
/// all three.
#[test]
fn three_controllers_started_together_on_an_empty_prefix_all_start() {
    let etcd = Etcd::start("together");
    for round in 0..20 {
        let prefix = format!("/together-{round}");
        let children: Vec<Child> = (0..3)
            .map(|_| {
                server(&etcd.url(), &prefix).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let mut started = Vec::new();
        for mut child in children {
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
            if !line.starts_with("tollgate server listening") {
                let out = child.wait_with_output().unwrap();
                panic!("round {round}: a controller did not start: {}", String::from_utf8_lossy(&out.stderr));
            }
            started.push(Killed(child));
        }
        assert_eq!(started.len(), 3);
    }
}

#[test]
fn a_bad_or_unreachable_etcd_and_a_foreign_prefix_are_refused_clearly() {
    let etcd = Etcd::start("refusals");
    let run = refused;
    // A prefix holding keys that are not Tollgate's.
    etcdctl(&etcd.url(), &["put", "/theirs/config", "x"]);
    let base = ["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--etcd"];
    let err = run(&[&base[..], &[etcd.url().as_str(), "--etcd-prefix", "/theirs"]].concat());
    assert!(err.contains("prefix /theirs: the prefix holds keys that are not Tollgate's"), "{err}");
    // Nothing of theirs was touched.
    let got = etcdctl(&etcd.url(), &["get", "--prefix", "/theirs", "--keys-only"]);
    assert_eq!(got.split_whitespace().collect::<Vec<_>>(), ["/theirs/config"]);
    // Nobody listening: a clear error within the bounded wait, not a hang.
    let port = tollgate_testkit::port::free_port();
    let err = run(&[&base[..], &[format!("http://127.0.0.1:{port}").as_str()]].concat());
    assert!(err.contains(&format!("etcd http://127.0.0.1:{port} prefix /tollgate: cannot connect")), "{err}");
    // Malformed flags name the flag and the rule.
    let err = run(&[&base[..], &["127.0.0.1:2379"]].concat());
    assert!(err.contains("--etcd: \"127.0.0.1:2379\" must be an http:// URL"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--etcd-prefix", "nope/"]].concat());
    assert!(err.contains("--etcd-prefix: \"nope/\" must start with /"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--advertise", "10.0.0.1"]].concat());
    assert!(err.contains("--advertise: \"10.0.0.1\" must be http://HOST:PORT"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--region", "East_1"]].concat());
    assert!(err.contains("--region: \"East_1\" must be 1 to 63 lowercase letters"), "{err}");
    let err = run(&["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--region", "east"]);
    assert!(err.contains("--etcd"), "a region needs the global tier's etcd: {err}");
    // Two controllers advertising one address: the second waits out a lease, then stops.
    let (_a, _, _) = start_with(&etcd.url(), "/tollgate", &["--advertise", "http://127.0.0.1:1"]);
    let err = run(&[&base[..], &[etcd.url().as_str(), "--advertise", "http://127.0.0.1:1"]].concat());
    assert!(err.contains("another controller advertises http://127.0.0.1:1"), "{err}");
}

/// Three etcd members and three controllers on them, as in production.
struct Ha {
    etcd: Vec<Etcd>,
    /// Each controller while it runs (`None` once killed), its gRPC URL and HTTP address.
    controllers: Vec<Option<(Killed, String, String)>>,
    urls: Vec<String>,
    https: Vec<String>,
    /// Every gRPC URL, comma-separated.
    all: String,
}

impl Ha {
    fn start(name: &str) -> Ha {
        let etcd = Etcd::cluster(name, 3);
        let etcd_urls = Etcd::urls(&etcd);
        let controllers: Vec<Option<(Killed, String, String)>> =
            (0..3).map(|_| Some(start_with_http(&etcd_urls, "/tollgate"))).collect();
        let urls: Vec<String> = controllers.iter().map(|c| c.as_ref().unwrap().1.clone()).collect();
        let https: Vec<String> = controllers.iter().map(|c| c.as_ref().unwrap().2.clone()).collect();
        let all = urls.join(",");
        Ha { etcd, controllers, urls, https, all }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_elect_one_leader_and_clients_follow_it_through_a_kill() {
    let Ha { etcd: _etcd, mut controllers, urls, https, all } = Ha::start("failover");
    // Any controller takes admin commands; the CLI takes them all and uses the first it reaches.
    admin(&all, &["group", "create", "g", "--limit", "100"]);

    // One leader, which every controller names.
    let leader = |alive: &[usize]| -> Option<String> {
        let seen: Vec<serde_json::Value> = alive.iter().filter_map(|&i| status(&https[i])).collect();
        let leaders: Vec<&serde_json::Value> = seen.iter().filter(|s| s["role"] == "leader").collect();
        (seen.len() == alive.len()
            && leaders.len() == 1
            && seen.iter().all(|s| s["leader"] == leaders[0]["leader"]))
        .then(|| leaders[0]["leader"].as_str().unwrap().to_string())
    };
    let mut first = None;
    eventually("one leader", || {
        first = leader(&[0, 1, 2]);
        first.is_some()
    });
    let first = first.unwrap();
    let was = urls.iter().position(|u| *u == first).unwrap();

    // A client given only the followers' addresses: they pass its exchanges on to the leader.
    let order: Vec<String> = urls.iter().filter(|u| **u != first).cloned().collect();
    let opts = tollgate_limiter::RemoteOptions {
        client_id: Some("ha-client".into()),
        max_wait: Duration::from_secs(30),
        ..Default::default()
    };
    let gate = tollgate_limiter::Tollgate::remote(&order.join(","), opts).unwrap();
    drop(gate.acquire("g", 1.0).await.unwrap());
    assert!(status(&https[was]).unwrap()["clients"].as_u64() >= Some(1));
    let passed_on = |what: &str| -> f64 {
        let line = format!("tollgate_forwarded_total{{what=\"{what}\"}}");
        (0..3).filter(|&i| i != was).map(|i| common::try_metric(&https[i], &line).unwrap_or(0.0)).sum()
    };
    assert!(passed_on("exchange") >= 1.0);
    // A backend given the followers' addresses reports to the leader through them, and follows
    // the settings.
    let reporter = tollgate_limiter::reporter::BackendReporter::spawn(
        &order.join(","),
        tollgate_limiter::reporter::ReporterOptions {
            interval: Duration::from_millis(200),
            capacity: Some(1e6),
            ..Default::default()
        },
        || tollgate_limiter::reporter::BackendHealth::Utilisation(0.0),
    )
    .unwrap();
    reporter.record("g", 100.0);
    eventually("the leader hears the backend", || {
        status(&https[was]).is_some_and(|s| s["backends"].as_u64() >= Some(1))
    });
    assert!(passed_on("report") >= 1.0);
    let scheduler = tollgate_limiter::scheduler::Scheduler::new(
        &tollgate_model::config::Config::default(),
        tollgate_limiter::scheduler::SchedulerOptions::default(),
    );
    let _following =
        scheduler.follow(&order.join(","), tollgate_limiter::scheduler::FollowOptions::default()).unwrap();
    eventually("the backend has the settings", || scheduler.settings_for("g").limit().as_f64() == 100.0);

    // kill -9 the leader: another leads, and the client moves to it without safe mode.
    controllers[was] = None;
    let alive: Vec<usize> = (0..3).filter(|i| *i != was).collect();
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let killed_at = tollgate_model::time::Clock::now(&clock);
    let mut second = None;
    eventually("a new leader", || {
        second = leader(&alive);
        second.is_some()
    });
    let took = tollgate_model::time::Clock::now(&clock).since(killed_at);
    println!("failover: a new leader after {took:?}");
    // The goal is 3 s at the default 2 s election lease (measured in BENCHMARKS.md: 2.0 to
    // 2.4 s). This bound, far above it so that a loaded machine cannot trip it, catches an
    // election that does not hand over at all.
    assert!(took < Duration::from_secs(15), "no new leader within 15 s: {took:?}");
    let second = second.unwrap();
    assert_ne!(second, first);
    let now_at = urls.iter().position(|u| *u == second).unwrap();
    let new = status(&https[now_at]).unwrap();
    assert_eq!(new["leader_changes"], 1, "{new}");
    drop(gate.acquire("g", 1.0).await.unwrap());
    eventually("the client reaches the new leader", || {
        status(&https[now_at]).is_some_and(|s| s["clients"].as_u64() >= Some(1))
    });
    reporter.record("g", 100.0);
    eventually("the new leader hears the backend", || {
        status(&https[now_at]).is_some_and(|s| s["backends"].as_u64() >= Some(1))
    });
    let r = gate.remote_status().unwrap();
    assert!(!r.safe_mode, "{r:?}");
    // The settings are all there.
    assert!(output(&second, &["group", "show", "g"]).contains("limit:    100"));
    // `tollgate status` given a follower shows the leader's status, which names its role.
    let follower = alive.iter().map(|&i| urls[i].clone()).find(|u| *u != second).unwrap();
    let shown = output(&follower, &["status", "--json"]);
    assert!(
        shown.contains("\"role\":\"leader\"") && shown.contains(&format!("\"leader\":\"{second}\"")),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_failover_keeps_the_limit_and_never_grants_above_the_target() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let Ha { etcd: _etcd, mut controllers, urls, https, all } = Ha::start("failover-load");
    const LIMIT: f64 = 1000.0;
    admin(&all, &["group", "create", "g", "--limit", &LIMIT.to_string()]);
    let leader_of = |alive: &[usize]| -> Option<usize> {
        let leaders: Vec<usize> = alive
            .iter()
            .copied()
            .filter(|&i| status(&https[i]).is_some_and(|s| s["role"] == "leader"))
            .collect();
        (leaders.len() == 1).then(|| leaders[0])
    };
    let mut first = None;
    eventually("one leader", || {
        first = leader_of(&[0, 1, 2]);
        first.is_some()
    });
    let first = first.unwrap();

    // Twenty clients, each asking 200 units/s (4,000 in all against a limit of 1,000).
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let opts =
            tollgate_limiter::RemoteOptions { client_id: Some(format!("load-{i}")), ..Default::default() };
        let gate = tollgate_limiter::Tollgate::remote(&all, opts).unwrap();
        let (admitted, stop) = (admitted.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(5));
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                if gate.try_acquire("g", 1.0).is_ok() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Settings written through any controller all along, each acknowledged or refused.
    let writer = {
        let (all, stop) = (all.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut acknowledged = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("s{i}");
                let out = Command::new(BIN)
                    .args(["group", "create", &name, "--limit", "10"])
                    .env("TOLLGATE_SERVER", &all)
                    .output()
                    .unwrap();
                if out.status.success() {
                    acknowledged.push(name);
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            acknowledged
        })
    };
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    // Warm up, then measure over 14 s with the leader killed 4 s in. Every 100 ms, the live
    // grants on whichever controller leads must stay within its target.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (start, start_count) = (now(), admitted.load(Ordering::Relaxed));
    let mut alive: Vec<usize> = vec![0, 1, 2];
    let mut killed = false;
    let mut checks = 0;
    while now().since(start) < Duration::from_secs(14) {
        if !killed && now().since(start) >= Duration::from_secs(4) {
            controllers[first] = None;
            alive.retain(|&i| i != first);
            killed = true;
        }
        for &i in &alive {
            if let Some(s) = status(&https[i]) {
                for g in s["groups"].as_array().into_iter().flatten().filter(|g| g["name"] == "g") {
                    if let (Some(target), Some(granted)) = (g["target"].as_f64(), g["granted"].as_f64()) {
                        assert!(
                            granted <= target * (1.0 + 1e-9) + 1e-6,
                            "controller {i}: granted {granted} above target {target}: {g}"
                        );
                        checks += 1;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = now().since(start).as_secs_f64();
    let rate = (admitted.load(Ordering::Relaxed) - start_count) as f64 / elapsed;
    stop_all(&stop, tasks).await;
    let acknowledged = writer.join().unwrap();
    println!(
        "across a failover: {rate:.1} units/s admitted against a limit of {LIMIT} ({checks} grant checks, {} settings acknowledged)",
        acknowledged.len()
    );
    assert!(checks > 20, "{checks}");
    assert!((rate - LIMIT).abs() <= 0.05 * LIMIT, "admitted {rate} units/s against {LIMIT}");
    // No acknowledged setting was lost: the new leader has every one (seen through its
    // watch; those written through it, at once).
    // One status read may miss on a busy machine: wait for the survivors to agree on a leader.
    let mut leader = None;
    eventually("one leader among the survivors", || {
        leader = leader_of(&alive);
        leader.is_some()
    });
    let leader = leader.unwrap();
    assert_ne!(leader, first);
    assert!(acknowledged.len() > 20, "{} acknowledged", acknowledged.len());
    eventually("every acknowledged setting on the new leader", || {
        let listed = output(&urls[leader], &["group", "list"]);
        acknowledged.iter().all(|n| listed.lines().any(|l| l.split_whitespace().next() == Some(n.as_str())))
    });
}

/// The units/s a remote client may admit in `group` now (0 before a grant or while closed).
fn allowance(gate: &tollgate_limiter::Tollgate, group: &str) -> f64 {
    let a = gate.stats(group).map_or(0.0, |s| s.allowance);
    if a.is_nan() { 0.0 } else { a }
}

/// A leader killed while two clients hold its grants: a third client, holding nothing, that
/// reaches the new leader at once is given nothing while the new leader learns the group
/// (its usage shows traffic), where it was given the limit's rest on top of the old grants
/// before; once the learning lease is over it gets its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_leader_kill_a_client_holding_nothing_waits_and_grants_never_pass_the_limit() {
    let victim = |_: &str, https: &[String], _: &[String]| {
        (0..https.len()).find(|&i| status(&https[i]).is_some_and(|s| s["role"] == "leader"))
    };
    let (most, served) = a_newcomer_after_a_kill("failover-nothing", &[], victim).await;
    println!(
        "leader killed: live grants at most {most:.1} of 300; the newcomer served {served:.1?} after the kill"
    );
}

/// The same with the groups sharded: the owner of the group's shard is killed, and the
/// controller given the shard learns the group before it gives the newcomer anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_shard_owners_kill_a_client_holding_nothing_waits_and_grants_never_pass_the_limit() {
    let victim = |etcd: &str, https: &[String], urls: &[String]| {
        if https.iter().map(|h| owned(h)).sum::<f64>() != 16.0 {
            return None;
        }
        let map = etcdctl(etcd, &["get", "/tollgate/shards/map", "--print-value-only"]);
        let map = tollgate_model::shard::ShardMap::decode(map.trim().as_bytes()).ok()?;
        let owner = map.owner_of("g")?;
        urls.iter().position(|u| u == owner)
    };
    let (most, served) = a_newcomer_after_a_kill("shard-nothing", &["--shards", "16"], victim).await;
    println!(
        "shard owner killed: live grants at most {most:.1} of 300; the newcomer served {served:.1?} after the kill"
    );
}

/// Asks for a unit of `g` every 2 ms until `stop`.
async fn ask_every_2ms(
    gate: tollgate_limiter::Tollgate,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut ticks = tokio::time::interval(Duration::from_millis(2));
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        ticks.tick().await;
        drop(gate.try_acquire("g", 1.0));
    }
}

/// A remote client named `id` of the controllers at `at`.
pub(crate) fn remote_as(id: &str, at: &str) -> tollgate_limiter::Tollgate {
    let opts = tollgate_limiter::RemoteOptions { client_id: Some(id.into()), ..Default::default() };
    tollgate_limiter::Tollgate::remote(at, opts).unwrap()
}

/// Three controllers (with `more`); two clients hold grants of a group of 300 through one
/// that survives; the controller `victim` picks (once it can) is killed, and a client that
/// holds nothing starts at once. Until it is served, the holders' live grants stay within
/// the limit; it is served only after most of the learning lease. Returns the most the
/// holders held and when the newcomer was served.
async fn a_newcomer_after_a_kill(
    name: &str,
    more: &[&str],
    victim: impl Fn(&str, &[String], &[String]) -> Option<usize>,
) -> (f64, Duration) {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    const LIMIT: f64 = 300.0;
    let etcd = Etcd::start(name);
    let mut flags = vec!["--flush-ms", "1000", "--election-lease-s", "1"];
    flags.extend_from_slice(more);
    let mut controllers: Vec<Option<(Killed, String, String)>> =
        (0..3).map(|_| Some(start_with(&etcd.url(), "/tollgate", &flags))).collect();
    let urls: Vec<String> = controllers.iter().map(|c| c.as_ref().unwrap().1.clone()).collect();
    let https: Vec<String> = controllers.iter().map(|c| c.as_ref().unwrap().2.clone()).collect();
    admin(&urls.join(","), &["group", "create", "g", "--limit", &LIMIT.to_string()]);
    let mut killed = None;
    eventually("a controller to kill", || {
        killed = victim(&etcd.url(), &https, &urls);
        killed.is_some()
    });
    let killed = killed.unwrap();
    let survivors: Vec<String> = (0..3).filter(|&i| i != killed).map(|i| urls[i].clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let (asking, remote) = (ask_every_2ms, remote_as);
    // Two clients through a controller that survives, each asking 500 units/s.
    let holders = [remote("holder-a", &survivors[0]), remote("holder-b", &survivors[0])];
    for h in &holders {
        tasks.push(tokio::spawn(asking(h.clone(), stop.clone())));
    }
    eventually("the holders share the limit", || {
        holders.iter().map(|h| allowance(h, "g")).sum::<f64>() >= 0.9 * LIMIT
            && holders.iter().all(|h| allowance(h, "g") > 0.0)
    });
    // The usage record of the group's traffic written (every second here).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    controllers[killed] = None;
    let newcomer = remote("newcomer", &survivors.join(","));
    tasks.push(tokio::spawn(asking(newcomer.clone(), stop.clone())));
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    let (start, mut most, mut served) = (now(), 0.0f64, None);
    // Until the newcomer is served, what the holders renew stays within the limit. (Once it
    // is, the next tick moves part of their shares to it, and until each has exchanged the
    // old and new grants overlap as at any tick: that is not what this measures.)
    while now().since(start) < Duration::from_secs(30) {
        if allowance(&newcomer, "g") > 0.0 {
            served = Some(now().since(start));
            break;
        }
        let live: f64 = holders.iter().map(|g| allowance(g, "g")).sum();
        assert!(live <= LIMIT * (1.0 + 1e-6) + 1e-3, "live grants {live} above the limit {LIMIT}");
        most = most.max(live);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_all(&stop, tasks).await;
    let served = served.expect("the newcomer is served once the learning lease is over");
    // The lease is 10 s: before, the newcomer was given the limit's rest at its first exchange.
    assert!(served >= Duration::from_secs(5), "served before the lease could end: {served:?}");
    (most, served)
}

/// With etcd gone, the leader holds the grants it gave (its follower still answers it, and
/// names no other leader), the follower passes calls on to it, and a client rides on for far
/// longer than a grant lease (3 s here) without entering safe mode. Admin changes are refused,
/// naming etcd. (Before, the leader stepped down once its election lease could have run out,
/// and the client went safe a grant lease later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_the_leader_holds_its_grants_and_clients_ride_on() {
    let mut etcd = Etcd::start("etcd-lost");
    let started: Vec<(Killed, String, String)> =
        (0..2).map(|_| start_with(&etcd.url(), "/tollgate", &["--lease-ms", "3000"])).collect();
    let https: Vec<String> = started.iter().map(|c| c.2.clone()).collect();
    let all = started.iter().map(|c| c.1.clone()).collect::<Vec<_>>().join(",");
    admin(&all, &["group", "create", "g", "--limit", "100"]);
    let roles = || {
        https
            .iter()
            .map(|h| status(h).map(|s| s["role"].as_str().unwrap_or("").to_string()))
            .collect::<Vec<_>>()
    };
    eventually("a leader", || roles().iter().filter(|r| r.as_deref() == Some("leader")).count() == 1);
    let before = roles();
    let gate = tollgate_limiter::Tollgate::remote(
        &all,
        tollgate_limiter::RemoteOptions { max_wait: Duration::from_secs(30), ..Default::default() },
    )
    .unwrap();
    drop(gate.acquire("g", 1.0).await.unwrap());
    assert!(!gate.remote_status().unwrap().safe_mode);

    etcd.kill();
    // Three grant leases: the client renews its grant all along.
    for _ in 0..90 {
        assert_eq!(roles(), before, "the leader holds, the follower follows it");
        let remote = gate.remote_status().unwrap();
        assert!(!remote.safe_mode, "{remote:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = https.iter().find(|h| status(h).is_some_and(|s| s["role"] == "leader")).unwrap();
    assert_eq!(status(leader).unwrap()["learning"], true, "holding: nobody granted above what it holds");
    for h in &https {
        let (code, _, body) = common::http(h, "GET", "/readyz", &[], "");
        assert_eq!(code, 200, "{h}: {body}");
    }
    drop(gate.acquire("g", 1.0).await.unwrap());
    // Admin changes are refused, naming etcd; nothing is acknowledged that etcd did not take.
    let out = output(&all, &["group", "alter", "g", "--limit", "50"]);
    assert!(out.contains("etcd"), "{out}");
}

#[test]
fn tokens_made_on_one_controller_work_on_every_other_and_revoking_reaches_them_all() {
    let etcd = Etcd::start("tokens");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("etcd-tokens");
    let _ = std::fs::remove_dir_all(&dir);
    let (a_data, b_data) = (dir.join("a"), dir.join("b"));
    let (_a, a_url, _) = start_with(&etcd.url(), "/tokens", &["--auth", "--data", a_data.to_str().unwrap()]);
    let admin = std::fs::read_to_string(a_data.join("admin.token")).unwrap().trim().to_string();
    let (_b, b_url, _) = start_with(&etcd.url(), "/tokens", &["--auth", "--data", b_data.to_str().unwrap()]);
    assert!(!b_data.join("admin.token").exists(), "the shared store has an admin token already");
    let run = |url: &str, token: &str, args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", url)
            .env("TOLLGATE_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, reader) = run(&a_url, &admin, &["token", "create", "--role", "reader"]);
    assert!(ok, "{reader}");
    let reader = reader.split_whitespace().next().unwrap().to_string();
    eventually("the other controller takes the new token", || run(&b_url, &reader, &["group", "list"]).0);
    let (ok, out) = run(&b_url, &admin, &["token", "revoke", &reader[3..19]]);
    assert!(ok, "{out}");
    eventually("the first controller refuses the revoked token", || {
        let (ok, out) = run(&a_url, &reader, &["group", "list"]);
        !ok && out.contains("unknown token")
    });
}

#[test]
fn a_stored_token_with_a_role_this_server_does_not_know_is_refused_by_name() {
    // As a newer version might store it, with a role this one lacks ("a deleted role").
    let etcd = Etcd::start("roles");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("etcd-roles");
    let _ = std::fs::remove_dir_all(&dir);
    let (_a, url, _) = start_with(&etcd.url(), "/roles", &["--auth", "--data", dir.to_str().unwrap()]);
    let token = format!("tg_00000000000000aa_{}", "5".repeat(64));
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let hash: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let record =
        format!(r#"{{"id":"00000000000000aa","role":"auditor","sha256":"{hash}","created_unix_ms":1}}"#);
    etcdctl(&etcd.url(), &["put", "/roles/credentials/00000000000000aa", &record]);
    eventually("the controller refuses the token by its role", || {
        let out = Command::new(BIN)
            .args(["group", "list"])
            .env("TOLLGATE_SERVER", &url)
            .env("TOLLGATE_TOKEN", &token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        !out.status.success() && err.contains("has role \"auditor\", which this server does not know")
    });
    // Everyone else is served.
    let admin = std::fs::read_to_string(dir.join("admin.token")).unwrap();
    let out = Command::new(BIN)
        .args(["group", "list"])
        .env("TOLLGATE_SERVER", &url)
        .env("TOLLGATE_TOKEN", admin.trim())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn usage_written_by_the_leader_is_read_through_any_controller() {
    let etcd = Etcd::start("usage");
    let flags = ["--tick-ms", "100", "--flush-ms", "100"];
    let (_a, a_url, a_http) = start_with(&etcd.url(), "/usage", &flags);
    let (_b, b_url, b_http) = start_with(&etcd.url(), "/usage", &flags);
    let leader = || {
        [(&a_url, &a_http), (&b_url, &b_http)]
            .into_iter()
            .find(|(_, h)| status(h).is_some_and(|s| s["role"] == "leader"))
            .map(|(u, h)| (u.clone(), h.clone()))
    };
    eventually("a leader", || leader().is_some());
    let (leader_url, leader_http) = leader().unwrap();
    admin(&leader_url, &["group", "create", "shared-meter", "--limit", "1000"]);
    let mut admitted = 0;
    while admitted < 5 {
        let (code, _, _) =
            common::http(&leader_http, "POST", "/v1/check", &[], r#"{"group":"shared-meter","cost":3}"#);
        admitted += u32::from(code == 200);
    }
    let follower_url = if leader_url == a_url { b_url.clone() } else { a_url.clone() };
    eventually("the follower reads the leader's metering", || {
        output(&follower_url, &["usage", "shared-meter"]).contains("shared-meter  consumed 15  admitted 5")
    });
}

/// A client asking 100 units/s of `group` (one every 10 ms) until `stop`, counting what it is
/// admitted in `admitted`.
pub(crate) fn paced(
    gate: tollgate_limiter::Tollgate,
    group: &str,
    admitted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    let group = group.to_string();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            if gate.try_acquire(&group, 1.0).is_ok() {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// Envoy's rate-limit service on the controller at `url` asked for `group` about every 10 ms
/// (one unit, one channel, as an Envoy keeps) until `stop`, counting the admitted in
/// `admitted`.
fn rls_paced(
    url: &str,
    group: &str,
    admitted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use std::sync::atomic::Ordering;
    let group = group.to_string();
    let channel = tollgate_limiter::access::Access::default().channel(url, Duration::from_secs(5)).unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            let answer = client.should_rate_limit(rls_request(&group)).await;
            if answer.is_ok_and(|a| a.into_inner().overall_code == Code::Ok as i32) {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// `POST /v1/check` on `http` for `group` about every 10 ms until `stop`, counting the
/// admitted in `admitted`.
fn checking(
    http: &str,
    group: &str,
    admitted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    let (http, group) = (http.to_string(), group.to_string());
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if check(&http, &group) == 200 {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(7));
        }
    })
}

/// Watched beside a measurement: how soon one of the controllers at `https` leads (`None`
/// within a minute).
fn watch_for_a_leader(https: Vec<String>) -> std::thread::JoinHandle<Option<Duration>> {
    std::thread::spawn(move || {
        let clock = tollgate_limiter::clock::MonotonicClock::new();
        let from = tollgate_model::time::Clock::now(&clock);
        for _ in 0..1200 {
            if https.iter().filter(|h| status(h).is_some_and(|s| s["role"] == "leader")).count() == 1 {
                return Some(tollgate_model::time::Clock::now(&clock).since(from));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
}

/// An etcd outage of `outage` under load: four remote clients, checks through the follower's
/// HTTP API and Envoy's rate-limit service asked on the leader and on the follower ask about
/// 700 units/s of a group limited to 200. Returns, per second from the kill on, the rate admitted, with whether etcd was down
/// then; and how long after etcd returned a controller led again.
/// Asserts that `seconds` (units admitted each second after the kill, against a limit of 200)
/// hold the limit: every two seconds together within 5 % of it, and each second within 10 %.
/// A second in which a loaded machine stalls a paced client is caught up in the next from the
/// bucket's burst (one second of the limit), which is the bucket's rule (at most `rate × t +
/// burst` over any `t`), not an overrun.
fn held_at_the_limit(seconds: &[(f64, bool)]) {
    for (i, (rate, _)) in seconds.iter().enumerate() {
        assert!((180.0..=220.0).contains(rate), "second {i} after the kill: {rate:.1} units/s, limit 200");
    }
    for (i, pair) in seconds.windows(2).enumerate() {
        let two = pair[0].0 + pair[1].0;
        assert!(
            (380.0..=420.0).contains(&two),
            "seconds {i} and {} after the kill: {two:.1} units, limit 400",
            i + 1
        );
    }
}

async fn outage_under_load(name: &str, outage: Duration) -> (Vec<(f64, bool)>, Duration, bool) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut etcd = Etcd::start(name);
    let started: Vec<(Killed, String, String)> =
        (0..2).map(|_| start_with(&etcd.url(), "/tollgate", &[])).collect();
    let https: Vec<String> = started.iter().map(|c| c.2.clone()).collect();
    let all = started.iter().map(|c| c.1.clone()).collect::<Vec<_>>().join(",");
    admin(&all, &["group", "create", "g", "--limit", "200"]);
    let leaders = || https.iter().filter(|h| status(h).is_some_and(|s| s["role"] == "leader")).count();
    eventually("a leader", || leaders() == 1);
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut gates = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let opts = tollgate_limiter::RemoteOptions { client_id: Some(format!("c{i}")), ..Default::default() };
        let gate = tollgate_limiter::Tollgate::remote(&all, opts).unwrap();
        gates.push(gate.clone());
        tasks.push(paced(gate, "g", admitted.clone(), stop.clone()));
    }
    let follower = https.iter().find(|h| status(h).is_some_and(|s| s["role"] == "follower")).unwrap();
    let checks = checking(follower, "g", admitted.clone(), stop.clone());
    // Envoy's rate-limit service asked on both controllers, leader and follower.
    for (_, grpc, _) in &started {
        tasks.push(rls_paced(grpc, "g", admitted.clone(), stop.clone()));
    }
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    // Warm up: the grants settle at 50 each.
    tokio::time::sleep(Duration::from_secs(4)).await;
    etcd.kill();
    let killed = now();
    let mut seconds = Vec::new();
    let (mut at, mut count) = (now(), admitted.load(Ordering::Relaxed));
    let mut returned = None;
    let mut watcher = None;
    let mut safe = false;
    while now().since(killed) < outage + Duration::from_secs(8) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (t, c) = (now(), admitted.load(Ordering::Relaxed));
        seconds.push(((c - count) as f64 / t.since(at).as_secs_f64(), returned.is_none()));
        (at, count) = (t, c);
        safe |= gates.iter().any(|g| g.remote_status().is_some_and(|s| s.safe_mode));
        // Past the election lease with etcd gone, the leader holds and both stay ready.
        if returned.is_none() && seconds.len() == 5 {
            assert_eq!(leaders(), 1, "the leader holds its grants");
            for h in &https {
                let (code, _, body) = common::http(h, "GET", "/readyz", &[], "");
                assert_eq!(code, 200, "{h}: {body}");
            }
        }
        if returned.is_none() && now().since(killed) >= outage {
            etcd.restart();
            returned = Some(now());
            watcher = Some(watch_for_a_leader(https.clone()));
        }
    }
    let led = watcher.expect("etcd restarted").join().unwrap().expect("a leader once etcd is back");
    stop_all(&stop, tasks).await;
    checks.join().unwrap();
    (seconds, led, safe)
}

/// An etcd outage of 10 s under load is invisible to tenants: the leader holds the grants it
/// gave, the clients renew them through the outage, and a controller leads as soon as etcd is
/// back. Every two seconds stay within 5 % of the limit (see `held_at_the_limit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_of_ten_seconds_is_invisible_to_tenants() {
    let (seconds, led, safe) = outage_under_load("etcd-outage-10", Duration::from_secs(10)).await;
    println!("etcd out 10 s: admitted per second {seconds:.0?}; a leader {led:?} after etcd returned");
    held_at_the_limit(&seconds);
    assert!(!safe, "a client entered safe mode");
    assert!(led < Duration::from_secs(5), "no leader until {led:?} after etcd returned");
}

/// An etcd outage of 60 s no tenant notices: the leader holds the grants it gave for the
/// whole minute (six grant leases), every two seconds within 5 % of the limit, no client in safe
/// mode, and a leader as soon as etcd is back. (Before, the clients' grants ran out 12 s into
/// the outage and their safe mode decayed: 12 % below the limit over a 40 s run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_of_a_minute_is_invisible_to_tenants() {
    let (seconds, led, safe) = outage_under_load("etcd-outage-60", Duration::from_secs(60)).await;
    println!("etcd out 60 s: admitted per second {seconds:.0?}; a leader {led:?} after etcd returned");
    held_at_the_limit(&seconds);
    assert!(!safe, "a client entered safe mode");
    assert!(led < Duration::from_secs(5), "no leader until {led:?} after etcd returned");
}

/// A partition that cuts only the leader off etcd (a relay in front of etcd for it alone)
/// does not double the limit: the leader holds its grants while its peer still names it, the
/// peer is elected once the leader's lease runs out in etcd, the old leader hears of it from
/// the peer and steps down, and the new one learns what the clients hold for a grant lease and
/// more. Two remote clients (the leader first in their list) and checks through the follower's
/// HTTP API ask 400 units/s of a group limited to 200: the seconds from the cut within 5 % of
/// the limit together, none above 1.2 times it, and the limit admitted again in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_of_the_leader_from_etcd_never_doubles_the_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let etcd = Etcd::start("etcd-partition");
    let relays: Vec<tollgate_testkit::cut::Cuttable> =
        (0..2).map(|_| tollgate_testkit::cut::Cuttable::start(&format!("127.0.0.1:{}", etcd.port))).collect();
    let started: Vec<(Killed, String, String)> =
        relays.iter().map(|r| start_with(&r.url(), "/tollgate", &["--lease-ms", "3000"])).collect();
    let https: Vec<String> = started.iter().map(|c| c.2.clone()).collect();
    admin(&started[0].1, &["group", "create", "g", "--limit", "200"]);
    let role = |i: usize| status(&https[i]).map(|s| s["role"].as_str().unwrap_or("").to_string());
    eventually("a leader", || (0..2).filter(|&i| role(i).as_deref() == Some("leader")).count() == 1);
    let leader = (0..2).find(|&i| role(i).as_deref() == Some("leader")).unwrap();
    let other = 1 - leader;
    let list = format!("{},{}", started[leader].1, started[other].1);
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..2 {
        let opts = tollgate_limiter::RemoteOptions { client_id: Some(format!("c{i}")), ..Default::default() };
        let gate = tollgate_limiter::Tollgate::remote(&list, opts).unwrap();
        tasks.push(paced(gate, "g", admitted.clone(), stop.clone()));
    }
    let checks = checking(&https[other], "g", admitted.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(4)).await;
    relays[leader].cut();
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    let mut seconds: Vec<f64> = Vec::new();
    let (mut at, mut count) = (now(), admitted.load(Ordering::Relaxed));
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (t, c) = (now(), admitted.load(Ordering::Relaxed));
        seconds.push((c - count) as f64 / t.since(at).as_secs_f64());
        (at, count) = (t, c);
    }
    let roles = (role(leader), role(other));
    stop.store(true, Ordering::Relaxed);
    stop_all(&stop, tasks).await;
    checks.join().unwrap();
    println!("leader cut off etcd: admitted per second {seconds:.0?}; roles after {roles:?}");
    assert_eq!(
        roles,
        (Some("follower".into()), Some("leader".into())),
        "the peer leads, the old leader follows"
    );
    // A second leader granting beside the first would double the limit. The group's bucket
    // may spend in one second what a slow second before it left (its burst is a second's
    // worth), and while the leadership moves the clients' grants from both leaders may
    // overlap for a moment (226 and 235 in the two seconds after a cut on a busy machine):
    // each second is held to 1.2 times the limit, and the 16 s from the cut together to 5 %
    // above it, which a second at twice the limit would break (160 units over).
    for (i, n) in seconds.iter().enumerate() {
        assert!(*n <= 240.0, "second {i} after the cut: {n:.1} units/s, limit 200: {seconds:.0?}");
    }
    let (total, most) = (seconds.iter().sum::<f64>(), 1.05 * 200.0 * seconds.len() as f64);
    assert!(
        total <= most,
        "{total:.0} units in the {} s from the cut, at most {most:.0}: {seconds:.0?}",
        seconds.len()
    );
    assert!(seconds[12..].iter().any(|n| *n >= 180.0), "the limit is not admitted again: {seconds:.0?}");
}

/// `POST /v1/check` on a controller: whether it admitted, and the status code.
pub(crate) fn check(http: &str, group: &str) -> u16 {
    common::http(http, "POST", "/v1/check", &[], &format!("{{\"group\":\"{group}\",\"cost\":1}}")).0
}

/// Envoy's rate-limit service on a controller, one descriptor naming `group` through the
/// default rule (a `tenant` entry names the group by its value): the overall code.
async fn rls(url: &str, token: Option<&str>, group: &str) -> Result<i32, tonic::Status> {
    let access = tollgate_limiter::access::Access { token: token.map(str::to_string), ..Default::default() };
    rls_with(url, &access, group).await
}

/// [`rls`] with the token and TLS files of `access`.
async fn rls_with(
    url: &str,
    access: &tollgate_limiter::access::Access,
    group: &str,
) -> Result<i32, tonic::Status> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut client = RateLimitServiceClient::new(access.channel(url, Duration::from_secs(5)).unwrap());
    Ok(client.should_rate_limit(rls_request(group)).await?.into_inner().overall_code)
}

/// One unit of `group`, named by a `tenant` entry in the domain `edge`.
fn rls_request(group: &str) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    let entry = Entry { key: "tenant".into(), value: group.into() };
    let descriptor = RateLimitDescriptor { entries: vec![entry], ..RateLimitDescriptor::default() };
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor],
        hits_addend: 1,
    }
}

/// Which of two controllers leads, once both say the same: (leader, follower) indexes.
fn roles(https: &[String; 2]) -> Option<(usize, usize)> {
    let seen: Vec<serde_json::Value> = https.iter().filter_map(|h| status(h)).collect();
    let leading: Vec<usize> = (0..seen.len()).filter(|&i| seen[i]["role"] == "leader").collect();
    (seen.len() == 2 && leading.len() == 1 && seen.iter().all(|s| s["leader"] == seen[leading[0]]["leader"]))
        .then(|| (leading[0], 1 - leading[0]))
}

/// A killed controller's port refuses connections at once: the others find it so within a
/// few probes and revoke its etcd lease, so its member key goes and the next candidate leads
/// then, not when the lease runs out. With an election lease of 60 s, the follower leads
/// within 30 s (a tenth of a second is usual), and the dead leader's member key is gone.
#[test]
fn a_killed_leaders_lease_is_revoked_by_its_peers_so_the_next_leads_at_once() {
    let etcd = Etcd::start("dead-peer");
    let (mut controllers, _, https, (leader, follower)) =
        two_with_a_leader(&etcd.url(), &["--election-lease-s", "60"], &[]);
    let members = || etcdctl(&etcd.url(), &["get", "--prefix", "--keys-only", "/tollgate/members/"]);
    assert_eq!(members().lines().filter(|l| !l.is_empty()).count(), 2, "{}", members());
    // kill -9.
    controllers[leader] = None;
    let leads = || status(&https[follower]).is_some_and(|s| s["role"] == "leader");
    // 300 looks a tenth of a second apart: half the lease, at least.
    let led = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        leads()
    });
    assert!(led, "the follower leads before the dead leader's lease could run out");
    assert_eq!(members().lines().filter(|l| !l.is_empty()).count(), 1, "{}", members());
    drop(controllers);
}

/// Two controllers on `etcd` with `flags`, and the group `create` makes (none when empty)
/// through them: the controllers, their gRPC URLs and HTTP addresses, and which leads once
/// one does (then the other).
type Pair = ([Option<Killed>; 2], [String; 2], [String; 2], (usize, usize));
fn two_with_a_leader(etcd: &str, flags: &[&str], create: &[&str]) -> Pair {
    let (c0, u0, h0) = start_with(etcd, "/tollgate", flags);
    let (c1, u1, h1) = start_with(etcd, "/tollgate", flags);
    let (urls, https) = ([u0, u1], [h0, h1]);
    if !create.is_empty() {
        admin(&urls.join(","), create);
    }
    let mut both = None;
    eventually("one leader", || {
        both = roles(&https);
        both.is_some()
    });
    ([Some(c0), Some(c1)], urls, https, both.unwrap())
}

/// The one leader among the controllers at `https` that are `alive`, once every live one
/// answers and names it.
fn the_leader(https: &[String], alive: &[bool]) -> Option<usize> {
    let seen: Vec<(usize, serde_json::Value)> = (0..https.len())
        .filter(|&i| alive[i])
        .map(|i| Some((i, status(&https[i])?)))
        .collect::<Option<_>>()?;
    let leading: Vec<usize> = seen.iter().filter(|(_, s)| s["role"] == "leader").map(|(i, _)| *i).collect();
    let named = |i: usize| seen.iter().find(|(j, _)| *j == i).map(|(_, s)| s["leader"].clone());
    (leading.len() == 1 && seen.iter().all(|(_, s)| Some(s["leader"].clone()) == named(leading[0])))
        .then(|| leading[0])
}

/// What [`spender`] admitted of each group, and what stops it.
type Spending =
    (std::sync::Arc<[std::sync::atomic::AtomicU64; 2]>, std::sync::Arc<std::sync::atomic::AtomicBool>);

/// A task asking `gate` for a unit of each of `groups` every 2 ms (about 500 a second each),
/// counting what it admits.
fn spender(
    gate: tollgate_limiter::Tollgate,
    groups: [&'static str; 2],
) -> (Spending, tokio::task::JoinHandle<()>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (admitted, stop) =
        (Arc::new([AtomicU64::new(0), AtomicU64::new(0)]), Arc::new(AtomicBool::new(false)));
    let (counts, stopping) = (admitted.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_millis(2));
        while !stopping.load(Ordering::Relaxed) {
            ticks.tick().await;
            for (i, group) in groups.into_iter().enumerate() {
                if gate.try_acquire(group, 1.0).is_ok() {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    ((admitted, stop), task)
}

/// Quotas spent on leaders killed before they wrote any consumption at a flush
/// (`--flush-ms 60000`) are not spent again on their successors: three controllers, the leader
/// killed with a third of each quota spent and the next leader with two thirds. For `q`, 300
/// over the group's life, the client's reports say what it used of the window, and each
/// successor counts that. For `h`, 300 an hour beside 60 every 2 s, the clients report only
/// the 2-second window: the hour counts from the meter each leader wrote every second
/// between flushes, from the hour's start as the usage records place it. A client asking at
/// 500 a second admits at most each quota and about a second of the group's allotments more,
/// and nearly all of it (of `h`'s, all but at most one 2-second window's 60: see below). Before, each
/// successor counted from the consumption written at flushes (none) and allotted the quotas
/// again: 450 of `q`'s and 465 of `h`'s with one kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_spent_before_kills_are_not_spent_again_on_the_successors() {
    use std::sync::atomic::Ordering;
    let etcd = Etcd::start("quota-kill");
    let started: Vec<(Killed, String, String)> = (0..3)
        .map(|_| start_with(&etcd.url(), "/tollgate", &["--flush-ms", "60000", "--lease-ms", "2000"]))
        .collect();
    let urls: Vec<String> = started.iter().map(|c| c.1.clone()).collect();
    let https: Vec<String> = started.iter().map(|c| c.2.clone()).collect();
    let mut controllers: Vec<Option<Killed>> = started.into_iter().map(|c| Some(c.0)).collect();
    admin(&urls.join(","), &["group", "create", "q", "--limit", "30", "--quota", "300/total"]);
    admin(
        &urls.join(","),
        &["group", "create", "h", "--limit", "100", "--quota", "300/hour", "--quota", "60/2s"],
    );
    #[allow(clippy::disallowed_methods)] // the hour the run falls in: a new one gives a new quota
    let hour =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 3600;
    let first_hour = hour();
    let ((admitted, stop), task) = spender(remote_as("spender", &urls.join(",")), ["q", "h"]);
    let count = || [admitted[0].load(Ordering::Relaxed), admitted[1].load(Ordering::Relaxed)];
    for spent in [100, 200] {
        let alive: Vec<bool> = controllers.iter().map(Option::is_some).collect();
        let mut leader = None;
        eventually("one leader", || {
            leader = the_leader(&https, &alive);
            leader.is_some()
        });
        eventually("more of each quota spent", || count().iter().all(|&c| c >= spent));
        // kill -9: nothing was written at a flush.
        controllers[leader.unwrap()] = None;
    }
    // Spent to the end (a successor renews only what the client says it holds for a lease
    // first): `h`'s 2-second window counts from the takeover, and what the last leader wrote
    // of it counts again beside what the client reports of it, so up to that window's 60 may
    // be left unspent (never spent twice).
    eventually("nearly all of each quota spent", || {
        let [q, h] = count();
        q >= 290 && h >= 240
    });
    let mut last = (count(), 0);
    eventually("the quotas spent", || {
        std::thread::sleep(Duration::from_millis(400));
        last = if count() == last.0 { (last.0, last.1 + 1) } else { (count(), 0) };
        last.1 >= 12
    });
    stop_all(&stop, vec![task]).await;
    let [q, h] = count();
    // An hour that ended meanwhile gives `h` another 300, rightly.
    let hours = hour() - first_hour + 1;
    println!(
        "admitted {q} of 300 over the group's life and {h} of 300 an hour ({hours} hours) across two kills"
    );
    assert!(q <= 300 + 30, "{q} admitted of a quota of 300: spent again on a successor");
    // What the dead leader had not written of `h`'s earlier 2-second windows (about a second
    // of them) is missing from the hour: at most two of those windows' 60.
    assert!(h <= 300 * hours + 120, "{h} admitted of a quota of 300 an hour: spent again on a successor");
    assert!(q >= 290 && h >= 240, "{q} and {h} admitted of quotas of 300");
    drop(controllers);
}

/// An entry under the election's prefix that is no controller's candidacy (written by hand:
/// no lease, not an address) would lead the election for ever once it is the oldest; the
/// controllers delete it and one of them leads.
#[test]
fn a_stray_entry_in_the_election_is_deleted_rather_than_followed() {
    let etcd = Etcd::start("stray");
    let etcdctl = |args: &[&str]| etcdctl(&etcd.url(), args);
    let (first, _, first_http) = start_with_http(&etcd.url(), "/stray");
    eventually("the first leads", || status(&first_http).is_some_and(|s| s["role"] == "leader"));
    // Written after the first controller's candidacy: it leads once that one is gone.
    etcdctl(&["put", "/stray/election/by-hand", "not an address"]);
    let (_second, _, second_http) = start_with_http(&etcd.url(), "/stray");
    eventually("the second follows", || status(&second_http).is_some_and(|s| s["role"] == "follower"));
    drop(first);
    eventually("the second leads", || status(&second_http).is_some_and(|s| s["role"] == "leader"));
    assert_eq!(etcdctl(&["get", "--prefix", "/stray/election/by-hand"]), "");
}

/// A follower passes clients' exchanges on to the leader for as long as it leads: its own
/// candidacy, which waits on etcd all that time, does not end with etcd's 5 s call timeout
/// (each such end left the follower without a leader for half a second, refusing everyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_passes_exchanges_on_without_a_gap_for_longer_than_an_etcd_call() {
    use tollgate_proto::v1;
    let etcd = Etcd::start("no-gap");
    let (_c0, u0, h0) = start_with_http(&etcd.url(), "/tollgate");
    let (_c1, u1, h1) = start_with_http(&etcd.url(), "/tollgate");
    let (urls, https) = ([u0, u1], [h0, h1]);
    let mut both = None;
    eventually("one leader", || {
        both = roles(&https);
        both.is_some()
    });
    let (leader, follower) = both.unwrap();
    let mut client = v1::admission_client::AdmissionClient::connect(urls[follower].clone()).await.unwrap();
    // 8 s of exchanges, 10 a second: past the 5 s an etcd call may take, and past a second
    // round of it.
    let mut refused = Vec::new();
    for sequence in 1..=80u64 {
        let ask = v1::ExchangeRequest {
            client_id: "steady".into(),
            sequence,
            groups: vec![v1::GroupUsage { group: "g".into(), demand: 1.0, ..Default::default() }],
            ..Default::default()
        };
        if let Err(e) = client.exchange(ask).await {
            refused.push(format!("#{sequence}: {}", e.message()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A leader that lost its lease under a loaded machine would leave a gap for good reason:
    // the test holds the follower to no gap while the same leader leads throughout.
    let leader_status = status(&https[leader]).unwrap();
    let same_leader = leader_status["role"] == "leader" && leader_status["leader_changes"] == 1;
    assert!(refused.is_empty() || !same_leader, "{refused:?}");
    let passed = common::try_metric(&https[follower], "tollgate_forwarded_total{what=\"exchange\"}");
    assert!(passed >= Some(80.0 - refused.len() as f64), "{passed:?}");
}

/// Checks `shared` through each controller in turn, 50 times a second of each, for three
/// seconds: the checks admitted and refused, and the seconds they took.
async fn check_both_for_three_seconds(https: &[String; 2]) -> (u32, u32, f64) {
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let from = tollgate_model::time::Clock::now(&clock);
    let (mut admitted, mut refused) = (0u32, 0u32);
    let mut n = 0;
    // Three seconds of asking, 50 checks a second of each controller (a load that leaves the
    // machine to the other tests): what the rate adds then tells one limit from two.
    while tollgate_model::time::Clock::now(&clock).since(from) < Duration::from_secs(3) {
        n += 1;
        match check(&https[n % 2], "shared") {
            200 => admitted += 1,
            429 => refused += 1,
            other => panic!("a check answered {other}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = tollgate_model::time::Clock::now(&clock).since(from).as_secs_f64();
    println!("two controllers, {n} checks in {secs:.2} s: {admitted} admitted, {refused} refused");
    (admitted, refused, secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_checks_and_envoy_from_a_lease_on_the_leader() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let etcd = Etcd::start("serve-all");
    let create = ["group", "create", "shared", "--limit", "20", "--burst", "20"];
    let (mut controllers, urls, https, (leader, follower)) = two_with_a_leader(&etcd.url(), &[], &create);

    // The follower decides, no redirect: its front ends hold a lease from the leader, which
    // counts them as a client of the group beside the leader's own front ends.
    // Its first check is admitted, not refused while its front end waits out an election's
    // failures (it held safe mode's nothing until its backoff ran out).
    let first = check(&https[follower], "shared");
    let metrics = crate::common::http(&https[follower], "GET", "/metrics", &[], "").2;
    let front: Vec<&str> = metrics.lines().filter(|l| l.starts_with("tollgate_front_end")).collect();
    assert_eq!(first, 200, "a configured group's first check on a follower: {front:?}");
    // Envoy's service there too (a refusal is a decision as well; it admits once its share
    // of the group's rate has refilled).
    let mut said = Vec::new();
    for _ in 0..600 {
        let code = rls(&urls[follower], None, "shared").await.unwrap();
        said.push(code);
        if code == Code::Ok as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(said.last(), Some(&(Code::Ok as i32)), "{said:?}");
    eventually("the leader admits a check", || check(&https[leader], "shared") == 200);
    let clients = |i: usize| {
        status(&https[i]).and_then(|s| {
            s["groups"].as_array()?.iter().find(|g| g["name"] == "shared").and_then(|g| g["clients"].as_u64())
        })
    };
    eventually("the leader leases to both front ends", || clients(leader) == Some(2));

    // One limit across both: asked as fast as they answer, the two admit what the group's
    // rate and burst allow together, not each of them that much.
    let (admitted, refused, secs) = check_both_for_three_seconds(&https).await;
    // Each front end may hold its share of the burst and of the rate; two controllers each
    // granting the whole group would admit twice the burst and twice the rate.
    let bound = 20.0 + 20.0 * secs + 20.0;
    assert!(f64::from(admitted) <= bound, "{admitted} admitted in {secs:.2} s, over {bound:.0}");
    assert!(refused > 0);

    // The leader killed: the follower leads and goes on deciding, now in process.
    controllers[leader] = None;
    eventually("the follower leads", || status(&https[follower]).is_some_and(|s| s["role"] == "leader"));
    eventually("the new leader admits a check", || check(&https[follower], "shared") == 200);
    drop(controllers);
}

#[test]
fn with_auth_a_follower_checks_its_callers_tokens_and_calls_the_leader_with_its_own() {
    let etcd = Etcd::start("serve-all-auth");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("etcd-serve-all-auth");
    let _ = std::fs::remove_dir_all(&dir);
    let (a_data, b_data) = (dir.join("a"), dir.join("b"));
    let (_a, a_url, a_http) =
        start_with(&etcd.url(), "/auth", &["--auth", "--data", a_data.to_str().unwrap()]);
    let admin = std::fs::read_to_string(a_data.join("admin.token")).unwrap().trim().to_string();
    let (_b, b_url, b_http) =
        start_with(&etcd.url(), "/auth", &["--auth", "--data", b_data.to_str().unwrap()]);
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", format!("{a_url},{b_url}"))
            .env("TOLLGATE_TOKEN", &admin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["group", "create", "paid", "--limit", "100"]);
    let client = run(&["token", "create", "--role", "client", "--groups", "paid"]);
    let client = format!("Bearer {}", client.split_whitespace().next().unwrap());
    // Each controller made one client token of its own, for calling the leader.
    eventually("both controllers' own tokens", || {
        run(&["token", "list"]).matches("controller-").count() == 2
    });
    let role = |http: &str| {
        let (_, _, body) =
            common::http(http, "GET", "/status", &[("authorization", &format!("Bearer {admin}"))], "");
        serde_json::from_str::<serde_json::Value>(&body).ok().map(|s| s["role"].clone())
    };
    let mut follower = None;
    eventually("one leader", || {
        let (a, b) = (role(&a_http), role(&b_http));
        follower = match (a.as_ref().and_then(|r| r.as_str()), b.as_ref().and_then(|r| r.as_str())) {
            (Some("leader"), Some("follower")) => Some(b_http.clone()),
            (Some("follower"), Some("leader")) => Some(a_http.clone()),
            _ => None,
        };
        follower.is_some()
    });
    let follower = follower.unwrap();
    let body = r#"{"group":"paid","cost":1}"#;
    // The caller's token decides what it may ask; the follower's own token, what it leases.
    eventually("the follower admits a check", || {
        common::http(&follower, "POST", "/v1/check", &[("authorization", &client)], body).0 == 200
    });
    let (code, _, said) = common::http(&follower, "POST", "/v1/check", &[], body);
    assert_eq!(code, 401, "{said}");

    // A client given only the follower's address is answered there under its own token,
    // which the follower checks as the leader would.
    let follower_url = if follower == a_http { &a_url } else { &b_url };
    let remote = |token: &str, id: &str| {
        let opts = tollgate_limiter::RemoteOptions {
            client_id: Some(id.into()),
            access: tollgate_limiter::access::Access { token: Some(token.into()), ..Default::default() },
            max_wait: Duration::from_secs(30),
            ..Default::default()
        };
        tollgate_limiter::Tollgate::remote(follower_url, opts).unwrap()
    };
    let rejected = |gate: &tollgate_limiter::Tollgate| {
        gate.remote_status().and_then(|s| s.rejected).map(|e| e.to_string()).unwrap_or_default()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let token = client.strip_prefix("Bearer ").unwrap();
    let gate = remote(token, "paid-app");
    drop(runtime.block_on(gate.acquire("paid", 1.0)).unwrap());
    assert!(!gate.remote_status().unwrap().unthrottled_allowed, "the caller's privilege, not the follower's");
    // Another token may not take the client id the follower saw first, nor a group it is not
    // given.
    let other = run(&["token", "create", "--role", "client", "--groups", "paid"]);
    let thief = remote(other.split_whitespace().next().unwrap(), "paid-app");
    let _ = thief.try_acquire("paid", 1.0);
    eventually("the second token is refused the client id", || rejected(&thief).contains("paid-app"));
    let stray = remote(token, "stray-app");
    let _ = stray.try_acquire("free", 1.0);
    eventually("a group outside the token is refused", || rejected(&stray).contains("free"));
    // The controllers' own tokens' names are theirs alone.
    let out = Command::new(BIN)
        .args(["token", "create", "--role", "client", "--name", "controller-mine"])
        .env("TOLLGATE_SERVER", format!("{a_url},{b_url}"))
        .env("TOLLGATE_TOKEN", &admin)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("kept for the controllers"), "{said}");
}

/// Over TLS, a follower trusts the authority `--tls-peer-ca` names when it calls the leader
/// (each controller advertising `https://` and its bound address by default), and a region's
/// leader when it calls the global tier: all answer Envoy, whichever leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_every_controller_answers_envoy_trusting_the_peer_authority() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let etcd = Etcd::start("serve-all-tls");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("etcd-serve-all-tls");
    let _ = std::fs::remove_dir_all(&dir);
    let pki = tollgate_testkit::pki::Pki::new(&dir, "peers-ca");
    let ca = pki.ca_file();
    let mut started = Vec::new();
    // Two of the global tier, and a region's controller, which leases its shares from the
    // global leader over TLS as well.
    for (name, region) in [("a", &[][..]), ("b", &[][..]), ("r", &["--region", "east"][..])] {
        let (cert, key) = pki.issue("127.0.0.1", name, false);
        let flags = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
        let peer = ["--tls-peer-ca", ca.to_str().unwrap()];
        let (k, url, _) = start_with(&etcd.url(), "/tls", &[&flags[..], &peer, region].concat());
        started.push((k, url.replace("http://", "https://")));
    }
    let urls: Vec<String> = started.iter().map(|(_, u)| u.clone()).collect();
    let access = tollgate_limiter::access::Access { ca_file: Some(ca.clone()), ..Default::default() };
    let out = Command::new(BIN)
        .args(["group", "create", "tls", "--limit", "1000"])
        .env("TOLLGATE_SERVER", urls.join(","))
        .env("TOLLGATE_CA", &ca)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for url in &urls {
        let mut said = Vec::new();
        for _ in 0..600 {
            let code = rls_with(url, &access, "tls").await.map_err(|e| e.message().to_string());
            let ok = code == Ok(Code::Ok as i32);
            said.push(code);
            if ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(said.last(), Some(&Ok(Code::Ok as i32)), "{url}: {said:?}");
    }
    drop(started);
}

/// Both regions cut off are in safe mode, and east says which region it serves, and that its
/// shares decay.
fn regions_say_their_shares_decay(east_url: &str, east_http: &str, west_http: &str) {
    for h in [east_http, west_http] {
        assert_eq!(common::try_metric(h, "tollgate_region_upstream_safe_mode"), Some(1.0), "{h}");
    }
    let east = status(east_http).unwrap();
    assert_eq!((&east["region"], &east["upstream_safe_mode"]), (&"east".into(), &true.into()), "{east}");
    let shown = output(east_url, &["status"]);
    assert!(shown.contains("region: east, its shares decaying"), "{shown}");
}

/// Two regions under one global tier: each region's controller serves its own clients from a
/// share leased from the global leader by the region's demand, and together they hold the
/// global limit. A region cut off from the global tier keeps granting its last share for a
/// grant's lease, then decays it, never above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_hold_one_global_limit_and_a_region_cut_off_decays_its_share() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let etcd = Etcd::start("regions");
    // Grant leases of 2 s, so that a region cut off decays within the test.
    let lease = ["--lease-ms", "2000"];
    let (global, global_url, global_http) = start_with(&etcd.url(), "/tollgate", &lease);
    let region =
        |name: &str| start_with(&etcd.url(), "/tollgate", &[&lease[..], &["--region", name]].concat());
    let (_east, east_url, east_http) = region("east");
    let (_west, west_url, west_http) = region("west");
    admin(&global_url, &["group", "create", "shared", "--limit", "200"]);
    for h in [&global_http, &east_http, &west_http] {
        eventually("each tier and region leads itself", || status(h).is_some_and(|s| s["role"] == "leader"));
    }
    // Two clients in each region, each asking 100 units/s: 400 asked of a global 200.
    let admitted = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (r, url) in [&east_url, &west_url].into_iter().enumerate() {
        for i in 0..2 {
            let gate = remote_as(&format!("r{r}-c{i}"), url);
            tasks.push(paced(gate, "shared", admitted[r].clone(), stop.clone()));
        }
    }
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    let count = || [admitted[0].load(Ordering::Relaxed), admitted[1].load(Ordering::Relaxed)];
    // Warm up, then 6 s: both regions together at the global limit, each with its part.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (from, before) = (now(), count());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (secs, after) = (now().since(from).as_secs_f64(), count());
    let rates = [0, 1].map(|r| (after[r] - before[r]) as f64 / secs);
    println!("regions: east {:.1}/s, west {:.1}/s of a global 200", rates[0], rates[1]);
    let total = rates[0] + rates[1];
    assert!((190.0..=210.0).contains(&total), "{rates:?}: {total:.1}/s together, not within 5 % of 200");
    assert!(rates.iter().all(|&r| r > 60.0), "each region has its part: {rates:?}");
    // The global leader sees each region as one client.
    let global_status = status(&global_http).unwrap();
    let shared = global_status["groups"].as_array().unwrap().iter().find(|g| g["name"] == "shared").unwrap();
    assert_eq!(shared["clients"], 2, "{shared}");
    assert_eq!(global_status["region"], serde_json::Value::Null);

    // The global tier gone: each region grants its last share for the grant's lease (2 s),
    // then decays it; never more than the global limit together.
    drop(global);
    let gone = now();
    let mut seconds = Vec::new();
    let mut last = count();
    while now().since(gone) < Duration::from_secs(9) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c = count();
        seconds.push(((c[0] - last[0]) + (c[1] - last[1])) as f64);
        last = c;
    }
    println!("regions cut off: admitted per second {seconds:?}");
    assert!(seconds.iter().all(|&s| s <= 215.0), "over the limit once cut off: {seconds:?}");
    assert!(seconds[0] > 100.0, "the last shares serve at first: {seconds:?}");
    assert!(seconds[seconds.len() - 1] < 0.6 * 200.0, "decayed: {seconds:?}");
    regions_say_their_shares_decay(&east_url, &east_http, &west_http);
    stop_all(&stop, tasks).await;
}

/// A tenant new to a region is served at once, as it is by a controller of the global tier:
/// the region leaves the group out of its first answers until the global tier grants its share
/// (asked for at once), takes that first share whole while no demand is measured, and its
/// front ends wait for the first grant. A Rust client's first request is admitted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_new_to_a_region_is_served_at_once() {
    let etcd = Etcd::start("region-newcomer");
    let (_global, global_url, global_http) = start_with(&etcd.url(), "/tollgate", &[]);
    let (_east, east_url, east_http) = start_with(&etcd.url(), "/tollgate", &["--region", "east"]);
    for h in [&global_http, &east_http] {
        eventually("each tier leads itself", || status(h).is_some_and(|s| s["role"] == "leader"));
    }
    eventually("the region knows the global leader", || {
        status(&east_http).is_some_and(|s| !s["upstream_safe_mode"].as_bool().unwrap_or(true))
    });
    for g in ["first-http", "first-client"] {
        admin(&global_url, &["group", "create", g, "--limit", "100"]);
    }
    eventually("the region has the settings", || {
        output(&east_url, &["group", "list"]).contains("first-client")
    });
    // Twenty checks a tenth of a second apart, from the first: 10 a second of a limit of 100.
    let mut codes = Vec::new();
    for _ in 0..20 {
        codes.push(check(&east_http, "first-http"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("a tenant new to a region, POST /v1/check: {codes:?}");
    assert!(codes.iter().all(|&c| c == 200), "every check admitted, the first included: {codes:?}");
    let opts = tollgate_limiter::RemoteOptions { client_id: Some("newcomer".into()), ..Default::default() };
    let gate = tollgate_limiter::Tollgate::remote(&east_url, opts).unwrap();
    let admitted = gate.acquire("first-client", 1.0).await;
    assert!(admitted.is_ok(), "a client's first request in the region: {admitted:?}");
}

/// With `--auth`, a region's leader leases from the global tier under the controller token it
/// made for itself, and the region's clients are checked against their own tokens there.
#[test]
fn with_auth_a_region_leases_under_its_own_token() {
    let etcd = Etcd::start("regions-auth");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("etcd-regions-auth");
    let _ = std::fs::remove_dir_all(&dir);
    let (g_data, r_data) = (dir.join("global"), dir.join("region"));
    let (_global, global_url, _) =
        start_with(&etcd.url(), "/auth", &["--auth", "--data", g_data.to_str().unwrap()]);
    let admin = std::fs::read_to_string(g_data.join("admin.token")).unwrap().trim().to_string();
    let region_flags = ["--auth", "--region", "east", "--data", r_data.to_str().unwrap()];
    let (_east, _, east_http) = start_with(&etcd.url(), "/auth", &region_flags);
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", &global_url)
            .env("TOLLGATE_TOKEN", &admin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["group", "create", "paid", "--limit", "100"]);
    let token = run(&["token", "create", "--role", "client", "--groups", "paid"]);
    let token = token.split_whitespace().next().unwrap().to_string();
    let body = r#"{"group":"paid","cost":1}"#;
    let bearer = format!("Bearer {token}");
    eventually("the region admits a check under the client's token", || {
        common::http(&east_http, "POST", "/v1/check", &[("authorization", &bearer)], body).0 == 200
    });
    let (code, _, said) = common::http(&east_http, "POST", "/v1/check", &[], body);
    assert_eq!(code, 401, "{said}");
    // The region's lease was answered: it leased under a token of its own.
    let answered = "tollgate_region_upstream_exchanges_total{outcome=\"answered\"}";
    let (_, _, metrics) =
        common::http(&east_http, "GET", "/metrics", &[("authorization", &format!("Bearer {admin}"))], "");
    let count = metrics.lines().find_map(|l| l.strip_prefix(answered)?.trim().parse::<f64>().ok());
    assert!(count.is_some_and(|c| c >= 1.0), "{count:?}");
}

/// The shards a controller grants for now, from its metrics (0 while it does not answer).
fn owned(http: &str) -> f64 {
    common::try_metric(http, "tollgate_shards_owned").unwrap_or(0.0)
}

/// A group named `PREFIX` and a number in each of `shards` shards, in shard order.
fn one_group_per_shard(prefix: &str, shards: u16) -> Vec<String> {
    (0..shards)
        .map(|s| {
            (0..)
                .map(|i| format!("{prefix}{i}"))
                .find(|g| tollgate_model::shard::shard_of(g, shards) == s)
                .unwrap()
        })
        .collect()
}

/// The parts of exchanges the controllers at `https` passed on to other owners.
fn parts_forwarded(https: &[&String]) -> f64 {
    https
        .iter()
        .filter_map(|h| common::try_metric(h, "tollgate_shard_events_total{what=\"part_forwarded\"}"))
        .sum()
}

/// Waits (up to a minute: a bound for a stuck test) until the clients send every part of
/// their exchanges to its owner themselves: none is passed on between controllers over 2.5 s,
/// more than two exchange periods. Returns the windows looked at.
async fn straight_to_owners(https: &[&String]) -> usize {
    for window in 1..=24 {
        let before = parts_forwarded(https);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        if parts_forwarded(https) == before {
            return window;
        }
    }
    panic!("the clients never sent their parts straight to the owners");
}

/// Groups sharded over three controllers (`--shards 16`): every shard has one owner; clients
/// of two controllers are held to the limits of groups whatever controller owns them, and
/// send each group's part to its owner themselves once they have the map; a
/// controller killed loses its shards to the two left (its lease, then the map's move) and
/// the limits hold across the move; a malformed map written by hand is fenced and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_sharded_over_three_controllers_hold_their_limits_and_move_off_a_killed_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let etcd = Etcd::start("shards");
    let more = ["--shards", "16", "--election-lease-s", "1", "--lease-ms", "2000"];
    let (first, first_url, first_http) = start_with(&etcd.url(), "/tollgate", &more);
    let (_b, b_url, b_http) = start_with(&etcd.url(), "/tollgate", &more);
    let (_c, c_url, c_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("every shard owned, each controller some", || {
        let o = [owned(&first_http), owned(&b_http), owned(&c_http)];
        o.iter().sum::<f64>() == 16.0 && o.iter().all(|&n| n >= 4.0)
    });
    const GROUPS: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
    for g in GROUPS {
        admin(&first_url, &["group", "create", g, "--limit", "50"]);
    }
    // Two clients, one on each of the controllers left standing below, each asking 100
    // units/s of every group: 200 asked of each group's 50.
    let admitted: Vec<Arc<AtomicU64>> = GROUPS.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, url) in [&b_url, &c_url].into_iter().enumerate() {
        let opts =
            tollgate_limiter::RemoteOptions { client_id: Some(format!("sharded-{i}")), ..Default::default() };
        let gate = tollgate_limiter::Tollgate::remote(url, opts).unwrap();
        for (g, group) in GROUPS.iter().enumerate() {
            tasks.push(paced(gate.clone(), group, admitted[g].clone(), stop.clone()));
        }
    }
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    let count = || admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect::<Vec<u64>>();
    let rates = |secs: u64| {
        let admitted = &admitted;
        async move {
            let (from, before) =
                (now(), admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect::<Vec<_>>());
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let took = now().since(from).as_secs_f64();
            admitted
                .iter()
                .zip(before)
                .map(|(a, b)| (a.load(Ordering::Relaxed) - b) as f64 / took)
                .collect::<Vec<f64>>()
        }
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    let steady = rates(6).await;
    println!("sharded over three: admitted per second {steady:.1?} of 50 each");
    assert!(steady.iter().all(|r| (45.0..=55.0).contains(r)), "{steady:?}");
    // The clients' first exchanges were split by the controllers they talk to; from the
    // grants (each naming its shard) and the map those answers carried, the clients send each
    // part to its owner themselves.
    assert!(parts_forwarded(&[&b_http, &c_http]) > 0.0, "the first exchanges were passed on");
    let took = straight_to_owners(&[&first_http, &b_http, &c_http]).await;
    println!("sharded over three: the clients send each part to its owner (window {took} of 2.5 s)");

    // kill -9 the first controller (the leader, and an owner): the two left own every shard.
    let (killed, before) = (now(), count());
    drop(first);
    eventually("the two left own every shard", || owned(&b_http) + owned(&c_http) == 16.0);
    println!("sharded over three: the killed controller's shards moved in {:?}", now().since(killed));
    // One leads (and writes the map); the other owns shards, and its status is its own.
    eventually("one leader and one owner", || {
        let mut roles: Vec<String> = [&b_http, &c_http]
            .iter()
            .filter_map(|h| Some(status(h)?["role"].as_str()?.to_string()))
            .collect();
        roles.sort();
        roles == ["leader", "owner"]
    });
    // Across the move, each group within its limit over the 10 s from the kill, and a burst.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(now().since(killed))).await;
    let moved: Vec<f64> = count().iter().zip(&before).map(|(a, b)| (a - b) as f64).collect();
    println!("sharded over three: admitted over the 10 s from the kill {moved:?} of 500 each");
    assert!(moved.iter().all(|&n| n <= 550.0), "over a limit across the move: {moved:?}");
    let after = rates(6).await;
    println!("sharded over two: admitted per second {after:.1?} of 50 each");
    assert!(after.iter().all(|r| (45.0..=55.0).contains(r)), "{after:?}");
    // The clients followed the map's change: their parts go to the new owners again.
    let took = straight_to_owners(&[&b_http, &c_http]).await;
    println!("sharded over two: the clients send each part to its new owner (window {took} of 2.5 s)");

    // A malformed map written by hand: each controller refuses it (keeping its last) and the
    // leader fences it with a map at a newer epoch, from which every shard is owned again.
    let epoch = common::try_metric(&b_http, "tollgate_shard_map_epoch").unwrap();
    etcdctl(&etcd.url(), &["put", "/tollgate/shards/map", "{\"version\":9}"]);
    eventually("the map fenced and every shard owned again", || {
        common::try_metric(&b_http, "tollgate_shard_map_epoch").is_some_and(|e| e > epoch)
            && owned(&b_http) + owned(&c_http) == 16.0
    });
    let refused = common::try_metric(&c_http, "tollgate_shard_events_total{what=\"entry_refused\"}");
    assert!(refused.is_some_and(|n| n >= 1.0), "the malformed map refused: {refused:?}");
    stop_all(&stop, tasks).await;
}

/// With the groups sharded, a shard that moves takes its groups' consumption with it: the
/// controller that lets a group go writes what it consumed before it says so, and the one
/// given it reads that and counts on. (Consumption is otherwise written once a minute here, so
/// only the move can carry it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_moves_takes_its_groups_consumption_with_it() {
    let etcd = Etcd::start("shards-meters");
    let more = ["--shards", "16", "--flush-ms", "60000", "--tick-ms", "100"];
    let (_a, a_url, a_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("the first owns every shard", || owned(&a_http) == 16.0);
    // One group in each shard, so that some move whichever shards the second is given.
    let groups: Vec<String> = (0..16u16)
        .map(|s| {
            (0..).map(|i| format!("m{i}")).find(|g| tollgate_model::shard::shard_of(g, 16) == s).unwrap()
        })
        .collect();
    for g in &groups {
        admin(&a_url, &["group", "create", g, "--limit", "1000"]);
    }
    let opts = tollgate_limiter::RemoteOptions { client_id: Some("metered".into()), ..Default::default() };
    let gate = tollgate_limiter::Tollgate::remote(&a_url, opts).unwrap();
    let consume = |n: usize| {
        let (gate, groups) = (gate.clone(), groups.clone());
        async move {
            for g in &groups {
                for _ in 0..n {
                    gate.acquire(g, 1.0).await.unwrap();
                }
            }
        }
    };
    // Each controller's count of each group: the group's owner's is the largest.
    let https = [a_http.clone()];
    let counted = |https: &[String]| {
        let mut most: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
        for h in https {
            for g in
                status(h).map(|s| s["groups"].as_array().cloned().unwrap_or_default()).unwrap_or_default()
            {
                let (Some(name), Some(total)) = (g["name"].as_str(), g["consumed_total"].as_f64()) else {
                    continue;
                };
                let m = most.entry(name.to_string()).or_insert(0.0);
                *m = m.max(total);
            }
        }
        most
    };
    consume(100).await;
    eventually("the first counted 100 of each", || {
        let c = counted(&https);
        groups.iter().all(|g| c.get(g) == Some(&100.0))
    });
    let (_b, _, b_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("the second given some shards", || {
        owned(&b_http) >= 1.0 && owned(&a_http) + owned(&b_http) == 16.0
    });
    consume(50).await;
    let both = [a_http.clone(), b_http.clone()];
    eventually("each group's owner counted 150", || {
        let c = counted(&both);
        groups.iter().all(|g| c.get(g) == Some(&150.0))
    });
    let on_b = counted(std::slice::from_ref(&b_http)).values().filter(|&&t| t == 150.0).count();
    println!("sharded meters: {on_b} of 16 groups moved, each counted on from 100 to 150");
    assert!(on_b >= 1, "some groups moved to the second controller");
}

/// A new leader counts on from the consumption the last one wrote: a leader stopped cleanly
/// writes what its groups consumed and its ramps, and the controller elected after it reads
/// them before it grants, so a group's total goes on from there and a ramp resumes where it
/// was. (They are otherwise written once a minute here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_counts_on_from_the_consumption_the_last_one_wrote() {
    let etcd = Etcd::start("leader-meters");
    let more = ["--flush-ms", "60000", "--tick-ms", "100", "--election-lease-s", "1"];
    let (mut a, a_url, a_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("the first leads", || status(&a_http).is_some_and(|s| s["role"] == "leader"));
    let (_b, b_url, b_http) = start_with(&etcd.url(), "/tollgate", &more);
    admin(&a_url, &["group", "create", "billed", "--limit", "1000"]);
    admin(&a_url, &["group", "create", "ramped", "--ramp", "min=10,max=1000,duration_s=60,resume_ttl_s=600"]);
    let field = |http: &str, group: &str, field: &str| {
        let groups = status(http)?["groups"].as_array()?.clone();
        groups.iter().find(|g| g["name"] == group)?[field].as_f64()
    };
    let consumed = |http: &str| field(http, "billed", "consumed_total");
    let opts = tollgate_limiter::RemoteOptions { client_id: Some("billed".into()), ..Default::default() };
    let gate = tollgate_limiter::Tollgate::remote(&format!("{a_url},{b_url}"), opts).unwrap();
    for _ in 0..100 {
        gate.acquire("billed", 1.0).await.unwrap();
    }
    eventually("the leader counted 100", || consumed(&a_http) == Some(100.0));
    // A ramp three epochs on (16.5 units/s more each); up to a minute.
    for _ in 0..1200 {
        if field(&a_http, "ramped", "ramp_pool").is_some_and(|p| p >= 50.0) {
            break;
        }
        let _ = gate.try_acquire("ramped", 1.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp = field(&a_http, "ramped", "ramp_pool").unwrap();
    assert!(ramp >= 50.0, "the ramp never grew: {ramp}");
    // Stopped cleanly (SIGTERM), the leader writes what was consumed and its ramps; the other
    // takes over.
    Command::new("kill").args(["-TERM", &a.0.id().to_string()]).status().unwrap();
    a.0.wait().unwrap();
    eventually("the second leads", || status(&b_http).is_some_and(|s| s["role"] == "leader"));
    assert_eq!(consumed(&b_http), Some(100.0), "the new leader read the stored consumption");
    let _ = gate.try_acquire("ramped", 1.0);
    eventually("the new leader computes the ramp", || field(&b_http, "ramped", "ramp_pool").is_some());
    let resumed = field(&b_http, "ramped", "ramp_pool").unwrap();
    assert!(resumed >= ramp, "the new leader resumed the ramp at {resumed}, not {ramp}");
    for _ in 0..50 {
        gate.acquire("billed", 1.0).await.unwrap();
    }
    eventually("the new leader counted 150", || consumed(&b_http) == Some(150.0));
}

/// Each group's ramp as the controller at `http` shows it.
fn ramp_pools(http: &str) -> std::collections::HashMap<String, f64> {
    status(http)
        .map(|s| s["groups"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
        .iter()
        .filter_map(|g| Some((g["name"].as_str()?.to_string(), g["ramp_pool"].as_f64()?)))
        .collect()
}

/// With the groups sharded, each controller writes its own groups' resumable ramps and leaves
/// the others' as they are, so every group's ramp stays stored however the two controllers'
/// writes fall; and a ramp under way moves with its shard: the controller given a group
/// resumes its ramp where the last owner left it, instead of starting it again at its minimum.
/// Both controllers start before any ramp is stored, so the one left has only the move to
/// learn them from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_moves_takes_its_groups_ramps_with_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let etcd = Etcd::start("shards-ramps-move");
    let more = ["--shards", "16", "--flush-ms", "100", "--tick-ms", "100", "--election-lease-s", "1"];
    let (_a, a_url, a_http) = start_with(&etcd.url(), "/tollgate", &more);
    let (b, _, b_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("each owns some shards", || {
        owned(&a_http) >= 1.0 && owned(&b_http) >= 1.0 && owned(&a_http) + owned(&b_http) == 16.0
    });
    let groups = one_group_per_shard("q", 16);
    // 16.5 units/s more each second: a ramp started again is far below one that resumed.
    for g in &groups {
        admin(&a_url, &["group", "create", g, "--ramp", "min=10,max=1000,duration_s=60,resume_ttl_s=600"]);
    }
    let opts = tollgate_limiter::RemoteOptions { client_id: Some("ramping".into()), ..Default::default() };
    let gate = tollgate_limiter::Tollgate::remote(&a_url, opts).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (gate, groups, stop) = (gate.clone(), groups.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for g in &groups {
                    let _ = gate.try_acquire(g, 1.0);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let pools = ramp_pools;
    eventually("every ramp past 100 on its owner", || {
        let (on_a, on_b) = (pools(&a_http), pools(&b_http));
        groups.iter().all(|g| on_a.get(g).or(on_b.get(g)).is_some_and(|&v| v >= 100.0))
    });
    // Ten looks in a row, a tenth of a second apart: each controller writes ten times meanwhile.
    let mut streak = 0;
    eventually("every group's ramp stored, ten looks in a row", || {
        let keys = etcdctl(&etcd.url(), &["get", "--prefix", "--keys-only", "/tollgate/ramps/"]);
        let stored =
            groups.iter().filter(|g| keys.lines().any(|k| k == format!("/tollgate/ramps/{g}"))).count();
        streak = if stored == groups.len() { streak + 1 } else { 0 };
        streak >= 10
    });
    let before = pools(&b_http);
    let moving: Vec<String> = before.keys().filter(|g| groups.contains(g)).cloned().collect();
    assert!(!moving.is_empty());
    drop(b);
    // Each group the first is given, as soon as it shows it, is where the second left it.
    let mut seen: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    eventually("the first shows the groups it was given", || {
        for (g, v) in pools(&a_http) {
            if moving.contains(&g) {
                seen.entry(g).or_insert(v);
            }
        }
        seen.len() == moving.len()
    });
    println!("ramps before the kill {before:?}, first seen on the new owner {seen:?}");
    // What grew since the killed owner's last write (a tenth of a second ago) is lost: at most
    // an epoch's growth, or two on a busy machine.
    let resumed = |g: &String| seen[g] >= before[g] - 2.0 * 16.5;
    assert!(moving.iter().all(resumed), "a ramp started again: {before:?} then {seen:?}");
    stop.store(true, Ordering::Relaxed);
    busy.await.unwrap();
}

/// A controller whose `--shards` does not match the map in etcd, or that has none where the
/// others shard, refuses to start and says what to give; `--shards` out of range, without
/// etcd, or with a region is refused by name.
#[test]
fn a_shard_count_that_does_not_match_the_map_is_refused_at_start() {
    let etcd = Etcd::start("shard-refusals");
    let run = refused;
    let (_a, _, a_http) = start_with(&etcd.url(), "/tollgate", &["--shards", "16"]);
    eventually("the first owns every shard", || owned(&a_http) == 16.0);
    let base = ["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--etcd"];
    let err = run(&[&base[..], &[etcd.url().as_str(), "--shards", "8"]].concat());
    assert!(err.contains("--shards 8: the controllers on this etcd shard the groups 16 ways"), "{err}");
    assert!(err.contains("give --shards 16"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str()]].concat());
    assert!(err.contains("start this one with --shards 16"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--shards", "0"]].concat());
    assert!(err.contains("--shards"), "{err}");
    let err = run(&[&base[..], &[etcd.url().as_str(), "--shards", "16", "--region", "east"]].concat());
    assert!(err.contains("--shards") && err.contains("--region"), "{err}");
    let err = run(&["server", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--shards", "16"]);
    assert!(err.contains("--etcd"), "{err}");
}

/// With a node capacity and the groups sharded over two controllers, each owner takes its
/// part of the capacity by what its groups claim: the groups together are held to the
/// capacity, and share it evenly, whichever controller computes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_sharded_over_two_controllers_share_one_capacity() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let etcd = Etcd::start("shards-capacity");
    let more = ["--shards", "16"];
    let (_a, a_url, a_http) = start_with(&etcd.url(), "/tollgate", &more);
    let (_b, b_url, b_http) = start_with(&etcd.url(), "/tollgate", &more);
    eventually("each owns half the shards", || owned(&a_http) == 8.0 && owned(&b_http) == 8.0);
    admin(&a_url, &["node", "capacity", "300"]);
    // Six groups with no limit, each asked 100 units/s: 600 asked of a capacity of 300; three
    // in shards of each owner, whichever shards the map gave each.
    let map = etcdctl(&etcd.url(), &["get", "--print-value-only", "/tollgate/shards/map"]);
    let map = tollgate_model::shard::ShardMap::decode(map.trim().as_bytes()).unwrap();
    let groups: Vec<String> = [&a_url, &b_url]
        .iter()
        .flat_map(|url| {
            let mine: Vec<u16> = map.owned_by(url);
            assert_eq!(mine.len(), 8, "{url} in {}", map.encode());
            (0..)
                .map(|i| format!("cap-{i}"))
                .filter(move |g| mine.contains(&tollgate_model::shard::shard_of(g, 16)))
                .take(3)
        })
        .collect();
    let admitted: Vec<Arc<AtomicU64>> = groups.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let opts = tollgate_limiter::RemoteOptions { client_id: Some("capacity".into()), ..Default::default() };
    let gate = tollgate_limiter::Tollgate::remote(&b_url, opts).unwrap();
    let tasks: Vec<_> = groups
        .iter()
        .enumerate()
        .map(|(g, group)| paced(gate.clone(), group, admitted[g].clone(), stop.clone()))
        .collect();
    let clock = tollgate_limiter::clock::MonotonicClock::new();
    let now = || tollgate_model::time::Clock::now(&clock);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (from, before): (_, Vec<u64>) = (now(), admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let took = now().since(from).as_secs_f64();
    let rates: Vec<f64> =
        admitted.iter().zip(&before).map(|(a, b)| (a.load(Ordering::Relaxed) - b) as f64 / took).collect();
    let total: f64 = rates.iter().sum();
    println!("sharded capacity: admitted per second {rates:.1?}, {total:.1} of 300");
    // Held to the capacity (and a burst in the window); an owner whose term restarts on a busy
    // machine grants nothing meanwhile, so only a floor is asked of each group.
    assert!((150.0..=315.0).contains(&total), "{rates:?}: {total:.1} together");
    assert!(rates.iter().all(|r| (15.0..=80.0).contains(r)), "a share each: {rates:?}");
    // Each owner computes its three.
    for (h, mine) in [&a_http, &b_http].into_iter().zip(groups.chunks(3)) {
        eventually("each owner computes its own groups", || {
            status(h).is_some_and(|s| {
                let computed: Vec<&str> =
                    s["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
                mine.iter().all(|g| computed.contains(&g.as_str()))
            })
        });
    }
    stop_all(&stop, tasks).await;
}
