//! What ships for watching Tollgate: the alert rules under `deploy/prometheus/` and the Grafana
//! board under `deploy/grafana/`. A real Prometheus (Debian's `prometheus`, which
//! `./scripts/test.sh` installs) scrapes a real server under load with the rules loaded: the
//! rules evaluate without error, promtool checks and unit-tests them, every metric they and the
//! board name is on `/metrics`, and every query of the board runs in Prometheus.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{ServerProc, admin, data_dir, eventually, free_port, http};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `promtool ARGS` in `dir`: its output, panicking with it when it fails.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).current_dir(dir).output().expect("promtool runs");
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool {args:?}:\n{said}");
    said
}

/// A real Prometheus on a free loopback port, scraping `target` every second with the rules
/// loaded; stopped on drop.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = data_dir("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let rules = repo().join("deploy/prometheus/rules.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tollgate\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus runs (Debian's prometheus package)");
        Prometheus { child, addr }
    }

    /// `GET /api/v1/PATH?QUERY` as JSON (`None` while Prometheus does not answer).
    fn api(&self, path: &str, query: &[(&str, &str)]) -> Option<serde_json::Value> {
        let q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
        let target = format!("/api/v1/{path}?{}", q.join("&"));
        let Ok(addr) = self.addr.parse::<std::net::SocketAddr>() else { return None };
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        let (code, _, body) = http(&self.addr, "GET", &target, &[], "");
        (code == 200 || code == 400 || code == 422).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    /// The result vector of an instant query.
    fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let v = self.api("query", &[("query", expr)]).ok_or("no answer")?;
        match v["status"].as_str() {
            Some("success") => Ok(v["data"]["result"].as_array().cloned().unwrap_or_default()),
            _ => Err(format!("{expr}: {v}")),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter's value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every metric name an expression reads (`tollgate_…`, `process_…`, `up`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("tollgate_") || word.starts_with("process_") {
            names.push(word.to_string());
        }
    }
    names
}

/// The board's queries, with its variables set to "all" and Grafana's rate interval a minute.
fn board_queries(board: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in board["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let expr =
                expr.replace("$instance", ".*").replace("$group", ".*").replace("$__rate_interval", "1m");
            out.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    out
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let dir = repo().join("deploy/prometheus");
    let said = promtool(&dir, &["check", "rules", "rules.yml"]);
    assert!(said.contains("SUCCESS: 7 rules found"), "{said}");
    let said = promtool(&dir, &["test", "rules", "rules.test.yml"]);
    assert!(said.contains("SUCCESS"), "{said}");
    // The unit tests can fail: one expecting an alert too early is caught.
    let broken = data_dir("prometheus-broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::copy(dir.join("rules.yml"), broken.join("rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("rules.test.yml")).unwrap();
    std::fs::write(broken.join("rules.test.yml"), tests.replace("eval_time: 17m", "eval_time: 12m")).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules", "rules.test.yml"])
        .current_dir(&broken)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a wrong expectation passed");
}

#[test]
fn the_grafana_board_has_the_panels_an_sre_looks_for() {
    let board: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/grafana/tollgate.json")).unwrap())
            .unwrap();
    assert_eq!(board["uid"], "tollgate");
    let titles: Vec<&str> =
        board["panels"].as_array().unwrap().iter().map(|p| p["title"].as_str().unwrap()).collect();
    for want in [
        "Node capacity and use",
        "Admitted by group",
        "Refused by group",
        "Target by group",
        "Backend utilisation",
        "Backends saturated",
        "Clients in safe mode",
        "Exchange latency",
    ] {
        assert!(titles.contains(&want), "a panel {want:?} in {titles:?}");
    }
    let variables: Vec<&str> =
        board["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(variables, ["datasource", "instance", "group"]);
    for panel in board["panels"].as_array().unwrap() {
        let y = panel["gridPos"]["y"].as_u64().unwrap();
        let x = panel["gridPos"]["x"].as_u64().unwrap() + panel["gridPos"]["w"].as_u64().unwrap();
        assert!(x <= 24 && y < 100, "{panel}");
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
        }
    }
}

/// The real thing: a server under load (a remote client asking for more than its group's limit,
/// a backend reporting saturation), scraped by a real Prometheus with the rules loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_server_and_evaluates_the_rules_and_the_board() {
    use tollgate_limiter::reporter::{BackendHealth, BackendReporter, ReporterOptions};
    use tollgate_limiter::{RemoteOptions, Tollgate};
    let server = ServerProc::start(&data_dir("observability"));
    let url = server.url();
    admin(&url, &["node", "capacity", "1000"]);
    admin(&url, &["group", "create", "busy", "--reserved", "10", "--limit", "50"]);
    let gate =
        Tollgate::remote(&url, RemoteOptions { client_id: Some("load".into()), ..RemoteOptions::default() })
            .unwrap();
    let reporter = BackendReporter::spawn(
        &url,
        ReporterOptions {
            backend_id: "db-1".into(),
            interval: Duration::from_millis(200),
            smoothing: Duration::from_millis(200),
            ..ReporterOptions::default()
        },
        || BackendHealth::Utilisation(1.5),
    )
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (gate, stop) = (gate.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Far past the limit: some admitted, many refused.
                for _ in 0..50 {
                    let _ = gate.try_acquire("busy", 1.0);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/rules.yml")).unwrap();
    let board: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/grafana/tollgate.json")).unwrap())
            .unwrap();
    let queries = board_queries(&board);
    let mut names: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .chain(queries.iter().map(|(_, q)| q.as_str()))
        .flat_map(metric_names)
        .collect();
    names.sort();
    names.dedup();
    // Every one on the server's own /metrics, once load and the backend's report have made the
    // ones that come and go (a group's target, a backend's figures).
    let mut missing = Vec::new();
    eventually("every metric the rules and the board read is on /metrics", || {
        reporter.record("busy", 50.0);
        let text = http(&server.http, "GET", "/metrics", &[], "").2;
        missing =
            names.iter().filter(|n| !text.lines().any(|l| l.starts_with(n.as_str()))).cloned().collect();
        missing.is_empty()
    });

    let prometheus = tokio::task::block_in_place(|| Prometheus::start(&server.http));
    // Scraped, and every rule evaluated at least once, without error.
    let mut last = serde_json::Value::Null;
    tokio::task::block_in_place(|| {
        eventually("Prometheus scrapes the server and evaluates every rule", || {
            reporter.record("busy", 50.0);
            let up = prometheus.query("up{job=\"tollgate\"} == 1").unwrap_or_default();
            let Some(v) = prometheus.api("rules", &[]) else { return false };
            last = v.clone();
            let rules: Vec<serde_json::Value> = v["data"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            up.len() == 1
                && rules.len() == 7
                && rules.iter().all(|r| r["health"] == "ok" && r["lastEvaluation"] != "0001-01-01T00:00:00Z")
        })
    });
    // The board's every query runs, and those about the loaded group and the backend find it.
    let mut failed = Vec::new();
    for (title, expr) in &queries {
        match tokio::task::block_in_place(|| prometheus.query(expr)) {
            Err(e) => failed.push(format!("{title}: {e}")),
            Ok(result) if title == "Admitted by group" || title == "Backend utilisation" => {
                if result.is_empty() {
                    failed.push(format!("{title}: {expr}: no series"));
                }
            }
            Ok(_) => {}
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = load.await;
    assert!(failed.is_empty(), "board queries:\n{}", failed.join("\n"));
    let scraped = tokio::task::block_in_place(|| {
        prometheus.query("tollgate_group_throttled_requests_total{group=\"busy\"} > 0")
    });
    assert_eq!(scraped.map(|r| r.len()), Ok(1), "the refusals reached Prometheus; rules: {last}");
    assert!(missing.is_empty());
}

/// promtool's checker finds `text` well formed (it reads the OpenMetrics text on stdin).
fn promtool_checks_metrics(text: &str) {
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    {
        use std::io::Write;
        check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    let out = check.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !said.contains("error"), "promtool check metrics:\n{said}");
}

/// `/metrics` as a scraper meets it: promtool's checker takes the page, a group refusing at a
/// steady rate through `/v1/check` shows a steady refusal rate in every one of 30 scrapes
/// (never 0, never far from the rest), and past `--metrics-groups` the quietest groups are
/// added up under `group="(others)"`.
/// Checks of the group `busy` at 100 a second (against its limit of 20: most refused,
/// steadily) until `stop`. Each check has its own time on a schedule, and a check held up by a
/// busy machine is caught up at once, so that the rate asked stays 100 a second rather than
/// sagging with the load.
fn checks_a_hundred_a_second(
    addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        #[allow(clippy::disallowed_methods)] // the schedule a real-time load keeps
        let started = std::time::Instant::now();
        let mut sent = 0u32;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            http(&addr, "POST", "/v1/check", &[], r#"{"group":"busy","cost":1}"#);
            sent += 1;
            std::thread::sleep((Duration::from_millis(10) * sent).saturating_sub(started.elapsed()));
        }
    })
}

#[test]
fn metrics_pass_promtool_hold_steady_over_thirty_scrapes_and_cap_their_groups() {
    let server =
        ServerProc::start_with(&data_dir("metrics-steady"), &["--metrics-groups", "3"], Stdio::null());
    let url = server.url();
    admin(&url, &["group", "create", "busy", "--limit", "20"]);
    for quiet in ["q1", "q2", "q3", "q4"] {
        admin(&url, &["group", "create", quiet, "--limit", "1000"]);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = checks_a_hundred_a_second(server.http.clone(), stop.clone());
    let gauge = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("tollgate_group_throttled_requests_per_second{group=\"busy\"} "))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let mut text = String::new();
    eventually("the refusals show on /metrics", || {
        text = http(&server.http, "GET", "/metrics", &[], "").2;
        gauge(&text).is_some_and(|v| v > 0.0)
    });
    // Let the refusal rate settle before it is watched (a second's reports on either side).
    std::thread::sleep(Duration::from_secs(2));
    let mut seen = Vec::new();
    for _ in 0..30 {
        text = http(&server.http, "GET", "/metrics", &[], "").2;
        seen.push(gauge(&text).expect("the busy group's refusal rate on every scrape"));
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    let mut sorted = seen.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(
        seen.iter().all(|&v| v > 0.0 && v >= median / 2.0 && v <= median * 2.0),
        "a steady refusal rate reads steady in every scrape: {seen:?}"
    );
    // The page is well formed for promtool (which reads the OpenMetrics text on stdin).
    promtool_checks_metrics(&text);
    // Three groups named, busy first among them; the other two added up.
    let named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("tollgate_group_clients{group=\""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(named.len(), 4, "three groups and (others): {named:?}");
    assert!(named.contains(&"busy") && named.contains(&"(others)"), "{named:?}");
    // The groups beyond the cap are folded into one series; the busy group keeps its own.
    assert!(
        text.lines().any(|l| l.starts_with("tollgate_group_demand_units{group=\"(others)\"} ")),
        "the rest's demand is one series:\n{text}"
    );
    assert!(
        text.lines()
            .filter_map(|l| l.strip_prefix("tollgate_group_target_units{group=\"busy\"} "))
            .any(|v| v.parse::<f64>() == Ok(20.0)),
        "the busy group's target is its limit:\n{text}"
    );
}
