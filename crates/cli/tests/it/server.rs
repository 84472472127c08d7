//! `tollgate server` and its admin commands, run as an operator would: the real binary,
//! real gRPC and HTTP over loopback, a temporary data directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tollgate_proto::v1;

use crate::common;
use common::{BIN, ServerProc, data_dir, server_command};

/// Runs an admin command against `server`: (exit code, stdout, stderr).
fn admin(server: &ServerProc, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", server.url()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ok(server: &ServerProc, args: &[&str]) -> String {
    let (code, out, err) = admin(server, args);
    assert_eq!(code, 0, "{args:?}: {out}{err}");
    out
}

fn fails(server: &ServerProc, args: &[&str], message: &str) {
    let (code, out, err) = admin(server, args);
    assert_ne!(code, 0, "{args:?} should fail: {out}");
    assert!(err.contains(message), "{args:?}: expected {message:?} in {err:?}");
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn tidb_style_groups_round_trip_and_refuse_bad_changes() {
    let s = ServerProc::start(&data_dir("groups"));
    let out = ok(&s, &["group", "create", "oltp", "--ru-per-sec", "600", "--priority", "high"]);
    assert!(
        out.contains("reserved: 600") && out.contains("limit:    600") && out.contains("priority: high"),
        "{out}"
    );
    let out = ok(&s, &["group", "create", "batch", "--ru-per-sec", "100", "--burstable", "--weight", "2"]);
    assert!(out.contains("reserved: 100") && out.contains("limit:    unlimited"), "{out}");
    let out = ok(&s, &["group", "alter", "batch", "--limit", "300", "--burst", "50"]);
    assert!(
        out.contains("limit:    300") && out.contains("burst:    50") && out.contains("weight:   2"),
        "{out}"
    );
    let list = ok(&s, &["group", "list"]);
    assert!(list.lines().any(|l| l.starts_with("batch") && l.contains("300")), "{list}");
    assert!(list.lines().any(|l| l.starts_with("oltp") && l.contains("high")), "{list}");

    // A priority by its level, as SQL, HTTP and the settings file take it, or by its name.
    let out = ok(&s, &["group", "create", "reports", "--limit", "50", "--priority", "12"]);
    assert!(out.contains("priority: 12"), "{out}");
    fails(
        &s,
        &["group", "create", "urgent", "--priority", "17"],
        "must be 1 to 16, or low, medium or high; got 17",
    );
    fails(
        &s,
        &["group", "create", "urgent", "--priority", "top"],
        "must be 1 to 16, or low, medium or high; got \"top\"",
    );
    fails(&s, &["group", "create", "oltp"], "group \"oltp\" already exists");
    fails(&s, &["group", "alter", "ghost", "--weight", "1"], "group \"ghost\" does not exist");
    fails(&s, &["group", "drop", "ghost"], "group \"ghost\" does not exist");
    fails(
        &s,
        &["group", "alter", "oltp", "--reserved", "700"],
        "reserved: must not exceed limit (700 > 600)",
    );
    fails(&s, &["group", "create", "w", "--weight", "0"], "weight: must be a finite number above 0, got 0");
    fails(&s, &["group", "create", "x", "--limit", "lots"], "invalid value 'lots' for '--limit <LIMIT>'");
    fails(&s, &["group", "create", "x", "--priority", "urgent"], "invalid value 'urgent'");
    // Nothing a refused command asked for was applied.
    let show = ok(&s, &["group", "show", "oltp"]);
    assert!(show.contains("reserved: 600"), "{show}");
    assert!(!ok(&s, &["group", "list"]).contains("\nw "));

    ok(&s, &["group", "drop", "batch"]);
    fails(&s, &["group", "show", "batch"], "does not exist");
}

/// Numbers out of range on the command line are values with a range error, however they are
/// written: negative ones are not read as options, and a 21-digit one is shown as a number.
#[test]
fn negative_and_huge_numbers_are_refused_with_their_range() {
    let s = ServerProc::start(&data_dir("cli-numbers"));
    fails(
        &s,
        &["group", "create", "n", "--limit", "-5"],
        "expected a number of units/s or `unlimited`, got \"-5\"",
    );
    fails(&s, &["group", "create", "n", "--reserved", "-1"], "expected a number, at least 0, got \"-1\"");
    fails(&s, &["group", "create", "n", "--max-in-flight", "-2"], "-2 is not in 0..=");
    fails(&s, &["group", "create", "n", "--priority", "-3"], "--priority");
    fails(&s, &["node", "capacity", "-3"], "expected a number of units/s or `unlimited`, got \"-3\"");
    fails(&s, &["quota", "set", "t", "total_throughput", "-5"], "must be at least 0, got -5");
    fails(&s, &["group", "create", "n", "--limit", "123456789012345678901"], "got 1.2345678901234568e20");
    // Nothing was made.
    fails(&s, &["group", "show", "n"], "");
}

#[test]
fn ramps_budgets_and_the_allocation_mode_are_set_through_the_cli() {
    let s = ServerProc::start(&data_dir("ramps"));
    let out = ok(
        &s,
        &[
            "group",
            "create",
            "r",
            "--limit",
            "100",
            "--budget",
            "5000",
            "--ramp",
            "min=10,max=100,duration_s=30,mode=go_back_n,resume_ttl_s=60",
        ],
    );
    assert!(out.contains("ramp:     min=10,max=100,duration_s=30,mode=go_back_n,resume_ttl_s=60"), "{out}");
    assert!(out.contains("budget:   5000"), "{out}");
    fails(
        &s,
        &["group", "alter", "r", "--ramp", "min=10,max=5,duration_s=3"],
        "ramp.min: must not exceed ramp.max (10 > 5)",
    );
    fails(
        &s,
        &["group", "alter", "r", "--ramp", "min=1,max=5,duration_s=3,speed=2"],
        "\"speed\": unknown key",
    );
    fails(
        &s,
        &["group", "alter", "r", "--ramp", "min=1,max=5,duration_s=3,mode=go_back_n,cool_down_s=0"],
        "ramp.cool_down_s: must be at least 1",
    );
    fails(&s, &["group", "alter", "r", "--burstable", "--limit", "5"], "cannot be used with");
    let out = ok(&s, &["group", "alter", "r", "--no-ramp", "--no-budget"]);
    assert!(!out.contains("ramp:") && !out.contains("budget:"), "{out}");
    assert!(out.contains("dropped:  return") && out.contains("debt:     up to 250 units paid from at most half the refill over 5 s; beyond that, admissions wait 1 s for each 100 units owed"), "{out}");
    let out = ok(&s, &["group", "alter", "r", "--dropped", "count", "--debt-repay-s", "0"]);
    assert!(
        out.contains("dropped:  count")
            && out.contains(
                "debt:     blocks admissions until the refill has paid it: 1 s for each 100 units owed"
            ),
        "{out}"
    );
    let out = ok(&s, &["group", "alter", "r", "--debt-repay-s", "30"]);
    assert!(
        out.contains("dropped:  count")
            && out.contains("debt:     up to 1500 units paid from at most half the refill over 30 s"),
        "{out}"
    );
    fails(
        &s,
        &["group", "alter", "r", "--debt-repay-s", "1e20"],
        "debt_repay_s: must be a number of seconds from 0 to 31536000",
    );
    fails(&s, &["group", "alter", "r", "--dropped", "lost"], "invalid value 'lost'");
    let out = ok(&s, &["group", "alter", "r", "--reads-writes-apart", "true"]);
    assert!(out.contains("reads and writes: accounted apart"), "{out}");
    assert!(ok(&s, &["status", "--json"]).contains("\"reads_writes_apart\":true"));
    fails(&s, &["group", "alter", "r", "--reads-writes-apart", "maybe"], "invalid value 'maybe'");
    assert_eq!(ok(&s, &["node", "mode"]).trim(), "share");
    assert_eq!(ok(&s, &["node", "mode", "fcfs"]).trim(), "fcfs");
    fails(&s, &["node", "mode", "fastest"], "invalid value 'fastest'");
    let status = ok(&s, &["status", "--json"]);
    assert!(status.contains("\"mode\":\"fcfs\"") && status.contains("\"priority\":\"medium\""), "{status}");
}

#[test]
fn fdb_style_quotas_round_to_pages_and_insist_on_the_total_first() {
    let s = ServerProc::start(&data_dir("quota"));
    assert_eq!(ok(&s, &["quota", "get", "green", "total_throughput"]).trim(), "<empty>");
    fails(
        &s,
        &["quota", "set", "green", "reserved_throughput", "16384"],
        "has no total_throughput: set the total first",
    );
    assert_eq!(
        ok(&s, &["quota", "set", "green", "total_throughput", "30000"]).trim(),
        "Successfully updated quota."
    );
    // 30000 bytes/s is 7.3 pages: rounded up to 8 pages.
    assert_eq!(ok(&s, &["quota", "get", "green", "total_throughput"]).trim(), "32768");
    fails(&s, &["quota", "set", "green", "reserved_throughput", "40000"], "set the total first");
    ok(&s, &["quota", "set", "green", "reserved_throughput", "16384"]);
    assert_eq!(ok(&s, &["quota", "get", "green", "reserved_throughput"]).trim(), "16384");
    // Changing one component keeps the other.
    ok(&s, &["quota", "set", "green", "total_throughput", "65536"]);
    assert_eq!(ok(&s, &["quota", "get", "green", "reserved_throughput"]).trim(), "16384");
    fails(&s, &["quota", "set", "green", "total_throughput", "4096"], "lower the reserved throughput first");
    fails(&s, &["quota", "set", "green", "total_throughput", "-5"], "must be at least 0, got -5");
    fails(&s, &["quota", "set", "green", "total_throughput", "12abc"], "invalid value '12abc'");
    fails(&s, &["quota", "set", "green", "speed", "5"], "invalid value 'speed'");
    // Regression: the largest u64 was stored as 0 (the page rounding wrapped).
    fails(
        &s,
        &["quota", "set", "green", "total_throughput", "18446744073709551615"],
        "bytes_per_second: must be at most 1000000000000000",
    );
    assert_eq!(ok(&s, &["quota", "get", "green", "total_throughput"]).trim(), "65536", "unchanged");
    fails(&s, &["group", "alter", "green", "--burst", "1e30"], "burst: must be at most 1e18");
    // Regression: clearing the quota dropped the whole group, its other settings with it.
    ok(&s, &["group", "alter", "green", "--priority", "high", "--weight", "3"]);
    assert_eq!(ok(&s, &["quota", "clear", "green"]).trim(), "Successfully cleared quota.");
    assert_eq!(ok(&s, &["quota", "get", "green", "total_throughput"]).trim(), "<empty>");
    assert_eq!(ok(&s, &["quota", "get", "green", "reserved_throughput"]).trim(), "<empty>");
    let kept = ok(&s, &["group", "show", "green"]);
    assert!(kept.contains("high") && kept.contains("weight:   3"), "{kept}");
    // Clearing a tag without a quota succeeds, and says so.
    assert!(ok(&s, &["quota", "clear", "blue"]).contains("has no quota"));
}

#[test]
fn node_capacity_and_status() {
    let s = ServerProc::start(&data_dir("status"));
    assert_eq!(ok(&s, &["node", "capacity"]).trim(), "unlimited");
    assert_eq!(ok(&s, &["node", "capacity", "25000"]).trim(), "25000");
    assert_eq!(ok(&s, &["node", "capacity"]).trim(), "25000");
    fails(
        &s,
        &["node", "capacity", "0"],
        "capacity: must be a finite number above 0 and at most 1e15, got 0",
    );
    fails(&s, &["node", "capacity", "-1"], "expected a number of units/s or `unlimited`, got \"-1\"");
    fails(&s, &["node", "capacity", "lots"], "invalid value 'lots'");
    ok(&s, &["group", "create", "a", "--reserved", "100", "--limit", "500"]);
    let status = ok(&s, &["status"]);
    assert!(status.starts_with("capacity: 25000\n"), "{status}");
    assert!(
        status.lines().any(|l| l.starts_with("a ") && l.contains("100") && l.contains("500")),
        "{status}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(&s, &["status", "--json"])).unwrap();
    assert_eq!(json["capacity"], 25000.0);
    assert_eq!(json["groups"][0]["name"], "a");
    assert_eq!(json["groups"][0]["settings"]["limit"], 500.0);
    assert_eq!(json["groups"][0]["settings"]["reserved"], 100.0);
    ok(&s, &["node", "capacity", "unlimited"]);
    assert_eq!(ok(&s, &["node", "capacity"]).trim(), "unlimited");
}

#[test]
fn settings_survive_a_clean_restart() {
    let dir = data_dir("restart");
    let s = ServerProc::start(&dir);
    ok(&s, &["group", "create", "kept", "--ru-per-sec", "250"]);
    ok(&s, &["node", "capacity", "9000"]);
    let status = s.terminate();
    assert!(status.success(), "SIGTERM ends the server cleanly: {status:?}");
    let s = ServerProc::start(&dir);
    assert!(ok(&s, &["group", "show", "kept"]).contains("reserved: 250"));
    assert_eq!(ok(&s, &["node", "capacity"]).trim(), "9000");
}

/// Regression: a port in use was reported twice, after the data directory and file were made.
#[test]
fn a_port_in_use_is_reported_once_and_nothing_is_written() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let dir = data_dir("port-in-use");
    let _ = std::fs::remove_dir_all(&dir);
    let out = server_command(&dir, &port).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("cannot listen on").count(), 1, "{err}");
    assert!(err.contains(&port), "{err}");
    assert!(!dir.exists(), "no data directory for a server that cannot serve");
}

#[test]
fn a_locked_or_corrupt_data_file_is_a_clear_error_at_start() {
    let dir = data_dir("locked");
    let s = ServerProc::start(&dir);
    let out = server_command(&dir, "127.0.0.1:0").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is in use by another process"));
    drop(s);
    let corrupt = data_dir("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("tollgate.redb"), b"not a database at all").unwrap();
    let out = server_command(&corrupt, "127.0.0.1:0").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be opened"), "{err}");
    // Never a silent reset: the file is left as it was.
    assert_eq!(std::fs::read(corrupt.join("tollgate.redb")).unwrap(), b"not a database at all");
    // Regression: an empty file was reset, and every tenant became unlimited.
    std::fs::write(corrupt.join("tollgate.redb"), b"").unwrap();
    let out = server_command(&corrupt, "127.0.0.1:0").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a clear error, not a panic");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is empty (0 bytes)") && err.contains("tollgate.redb"), "{err}");
    assert_eq!(std::fs::metadata(corrupt.join("tollgate.redb")).unwrap().len(), 0);
}

/// Regressions: `group list` failed past a 4 MB answer (about 20,000 groups) and `status` past about
/// 60,000: both come in pages now. And the admin commands waited for ever on a stopped server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_come_in_pages_and_a_stopped_server_is_named() {
    let s = ServerProc::start(&data_dir("pages"));
    let mut grpc = v1::admin_client::AdminClient::connect(s.url()).await.unwrap();
    for i in 0..1100 {
        let req = v1::PutGroupRequest {
            name: format!("tenant-{i:05}"),
            patch: Some(v1::GroupPatch { limit: Some(10.0), ..Default::default() }),
            mode: 0,
        };
        grpc.put_group(req).await.unwrap();
    }
    let page = grpc
        .list_groups(v1::ListGroupsRequest { page_size: 500, page_token: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.groups.len(), 500);
    assert_eq!(page.next_page_token, "tenant-00499");
    let bad = grpc
        .list_groups(v1::ListGroupsRequest { page_size: 20_000, page_token: String::new() })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let list = ok(&s, &["group", "list"]);
    assert_eq!(
        list.lines().filter(|l| l.starts_with("tenant-")).count(),
        1100,
        "two pages of the default 1000"
    );
    // `status` shows the first page, and says there is more; `--all` shows every group, as
    // does `/status` (written a chunk at a time), and `?limit=` pages it.
    let status = ok(&s, &["status", "--json"]);
    assert_eq!(status.matches("\"name\":\"tenant-").count(), 1000);
    assert!(status.contains("\"more_groups\":true"), "{status}");
    assert!(ok(&s, &["status"]).contains("`tollgate status --all` lists every one"));
    let all: serde_json::Value = serde_json::from_str(&ok(&s, &["status", "--json", "--all"])).unwrap();
    assert_eq!(all["groups"].as_array().unwrap().len(), 1100);
    assert_eq!(all["groups"][1099]["name"], "tenant-01099");
    let (code, _, body) = common::http(&s.http, "GET", "/status", &[], "");
    assert_eq!(code, 200);
    assert_eq!(body.matches("\"name\":\"tenant-").count(), 1100);
    let (_, _, body) = common::http(&s.http, "GET", "/status?limit=600", &[], "");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (page["groups"].as_array().unwrap().len(), page["next_page_token"].as_str()),
        (600, Some("tenant-00599"))
    );
    let (_, _, body) = common::http(&s.http, "GET", "/status?limit=600&page_token=tenant-00599", &[], "");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["groups"].as_array().unwrap().len(), 500);
    assert!(page.get("next_page_token").is_none());
    let (code, _, body) = common::http(&s.http, "GET", "/status?limit=0", &[], "");
    assert!(code == 400 && body.contains("limit: must be a whole number from 1 to 10000"), "{body}");
    // Stopped (SIGSTOP): the connection opens, nothing answers.
    let pid = s.child.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    let (code, _, err) = admin(&s, &["--timeout-ms", "500", "group", "list"]);
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("did not answer in time"), "{err}");
}

/// Reads until the peer closes the connection; true if it did within `wait`.
fn closed_within(stream: &mut TcpStream, wait: std::time::Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Regression: about 20,000 idle connections exhausted the server's file descriptors; it spun a
/// core, new clients and `/healthz` timed out, and nothing was logged.
#[test]
fn connections_are_capped_idle_ones_closed_and_health_still_answers() {
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("connections.log");
    let s = ServerProc::start_with(
        &data_dir("connections"),
        &["--max-connections", "3", "--idle-timeout-ms", "1000"],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let mut idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&s.grpc).unwrap()).collect();
    // Past the cap, a new connection is closed at once.
    let mut extra = TcpStream::connect(&s.grpc).unwrap();
    assert!(closed_within(&mut extra, std::time::Duration::from_secs(10)), "the fourth connection was kept");
    // The HTTP side still answers.
    assert!(http_get(&s.http, "/healthz").contains("200 OK"));
    // Idle connections are closed after the idle timeout; then new clients are served.
    for c in &mut idle {
        assert!(closed_within(c, std::time::Duration::from_secs(10)), "an idle connection was kept");
    }
    ok(&s, &["group", "list"]);
    drop(s);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("connection limit reached"), "{logged}");
}

/// Regression: with a port at its cap, `/healthz` failed, and idle connections locked new clients
/// (the CLI included) out for the whole idle timeout (300 s). Now the HTTP port keeps places
/// for its probes, and at the cap connections idle for 10 s make room for new ones.
#[test]
fn at_the_cap_the_probes_answer_and_idle_connections_make_room() {
    let s = ServerProc::start_with(&data_dir("at-the-cap"), &["--max-connections", "20"], Stdio::null());
    let _idle_grpc: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&s.grpc).unwrap()).collect();
    let _idle_http: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&s.http).unwrap()).collect();
    // Taken in after the idle ones (a listener accepts in order): on a place kept for probes.
    assert!(http_get(&s.http, "/healthz").contains("200 OK"));
    // Answered on a kept place (ready, or 503 while the first lease is learnt).
    let ready = http_get(&s.http, "/readyz");
    assert!(ready.contains("200 OK") || ready.contains("learning:"), "{ready}");
    let other = http_get(&s.http, "/v1/groups");
    assert!(other.contains("503") && other.contains("connection limit"), "{other}");
    // Once they have been idle for 10 s, new clients get in: the longest idle make room.
    std::thread::sleep(std::time::Duration::from_secs(11));
    ok(&s, &["group", "list"]);
    assert!(http_get(&s.http, "/v1/groups").contains("200 OK"));
}

/// A fresh server is ready at once (nobody can hold a grant it did not give). Started again
/// over a store whose usage shows a group with traffic within the last lease and minute, it
/// learns that group for one lease: `/readyz` holds back, a caller that holds nothing of it
/// is refused, while a tenant new since the restart is served at once; `/healthz` is ok
/// throughout. With a short lease it is ready once the lease has passed.
#[test]
fn a_restart_learns_the_groups_with_recent_traffic() {
    let dir = data_dir("ready-learn");
    let first = ServerProc::start_with(&dir, &["--lease-ms", "600000"], Stdio::null());
    let ready = http_get(&first.http, "/readyz");
    assert!(ready.contains("200 OK") && ready.ends_with("ready\n"), "a fresh store: {ready}");
    common::admin(&first.url(), &["group", "create", "busy", "--limit", "100"]);
    let check = |http: &str, group: &str| {
        let body = format!(r#"{{"group":"{group}","cost":1}}"#);
        common::http(http, "POST", "/v1/check", &[], &body).0
    };
    assert_eq!(check(&first.http, "busy"), 200);
    // A clean stop writes the consumption, and with it this minute's usage record.
    assert!(first.terminate().success());
    let again = ServerProc::start_with(&dir, &["--lease-ms", "600000"], Stdio::null());
    assert!(http_get(&again.http, "/healthz").contains("200 OK"));
    let ready = http_get(&again.http, "/readyz");
    assert!(ready.contains("503 Service Unavailable") && ready.contains("learning: relearning"), "{ready}");
    assert!(http_get(&again.http, "/status").contains("\"learning\":true"));
    assert_eq!(check(&again.http, "busy"), 429, "nobody holds more than it says while the group is learnt");
    assert_eq!(check(&again.http, "newcomer"), 200, "a tenant new since the restart is served at once");
    drop(again);
    // A short lease: ready once it has passed.
    let short = ServerProc::start_with(&dir, &["--lease-ms", "200", "--tick-ms", "100"], Stdio::null());
    let mut last = String::new();
    for _ in 0..600 {
        last = http_get(&short.http, "/readyz");
        if last.contains("200 OK") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(last.contains("200 OK") && last.ends_with("ready\n"), "{last}");
    assert!(http_get(&short.http, "/status").contains("\"learning\":false"));
    assert_eq!(check(&short.http, "busy"), 200);
}

/// The connection cap fits the open-file limit: a cap asked for that cannot fit stops the
/// start, naming the flag and the limit; the default is lowered to fit, and says so.
#[test]
fn the_connection_cap_fits_the_open_file_limit() {
    let dir = data_dir("descriptors");
    let run = |flags: &str| {
        let script = format!(
            "ulimit -n 600 && exec '{BIN}' server --data '{}' --grpc 127.0.0.1:0 --http 127.0.0.1:0 {flags}",
            dir.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = run("--max-connections 1000").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-connections 1000") && err.contains("may open 600 files"), "{err}");
    let mut child = run("");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    assert!(line.starts_with("tollgate server listening"), "{line}");
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connections capped at 164 per port"), "{err}");
}

#[test]
fn http_serves_health_metrics_and_status() {
    let s = ServerProc::start(&data_dir("http"));
    ok(&s, &["group", "create", "web", "--limit", "100"]);
    assert!(http_get(&s.http, "/healthz").ends_with("ok\n"));
    // OpenMetrics when the scraper asks for it, as Prometheus does; the classic text otherwise.
    let open = {
        let mut c = TcpStream::connect(&s.http).unwrap();
        write!(
            c,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        body
    };
    assert!(open.contains("content-type: application/openmetrics-text"), "{open}");
    assert!(open.contains("# TYPE tollgate_exchanges counter\ntollgate_exchanges_total "), "{open}");
    assert!(open.ends_with("# EOF\n"), "{open}");
    let metrics = http_get(&s.http, "/metrics");
    assert!(metrics.contains("content-type: text/plain; version=0.0.4"), "{metrics}");
    assert!(
        metrics.contains("# TYPE tollgate_exchanges_total counter\ntollgate_exchanges_total "),
        "{metrics}"
    );
    assert!(!metrics.contains("# EOF") && !metrics.contains(".."), "{metrics}");
    assert!(metrics.contains("tollgate_group_admitted_units{group=\"web\"} 0"), "{metrics}");
    assert!(metrics.contains("tollgate_exchange_latency_seconds_count"), "{metrics}");
    let status = http_get(&s.http, "/status");
    let body = &status[status.find("\r\n\r\n").unwrap() + 4..];
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["groups"][0]["name"], "web");
}

#[test]
fn unreachable_server_is_named() {
    let out =
        Command::new(BIN).args(["status"]).env("TOLLGATE_SERVER", "http://127.0.0.1:9").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot reach the tollgate server at http://127.0.0.1:9")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rpcs_are_invalid_argument_and_others_keep_being_served() {
    let s = ServerProc::start(&data_dir("rpc"));
    ok(&s, &["group", "create", "g", "--limit", "100"]);
    let mut client = v1::admission_client::AdmissionClient::connect(s.url()).await.unwrap();
    let mut admission = client.clone();
    let usage = |group: &str| v1::GroupUsage { group: group.into(), demand: 10.0, ..Default::default() };
    let bad = [
        v1::ExchangeRequest {
            client_id: String::new(),
            sequence: 1,
            groups: vec![usage("g")],
            ..Default::default()
        },
        v1::ExchangeRequest {
            client_id: "c".repeat(129),
            sequence: 1,
            groups: vec![usage("g")],
            ..Default::default()
        },
        v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![usage("")],
            ..Default::default()
        },
        v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: (0..1001).map(|i| usage(&format!("g{i}"))).collect(),
            ..Default::default()
        },
        v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![usage("g")],
            target_request_period_ms: 3_600_001,
            ..Default::default()
        },
        v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![v1::GroupUsage { demand: f64::NAN, ..usage("g") }],
            ..Default::default()
        },
    ];
    for req in bad {
        let status = client.exchange(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    let reply = client
        .exchange(v1::ExchangeRequest {
            client_id: "good".into(),
            sequence: 1,
            groups: vec![usage("g")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.grants.len(), 1);
    assert!(!reply.grants[0].unlimited);
    assert!(reply.grants[0].rate <= 100.0);
    assert_eq!(reply.next_exchange_ms, 1000);
    let mut backend = v1::backend_client::BackendClient::connect(s.url()).await.unwrap();
    let status = backend
        .report(v1::BackendReport {
            backend_id: "b".into(),
            zone: "z".into(),
            health: None,
            loads: vec![],
            capacity: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("health"));
    // Oversized: more groups than a report may carry.
    let loads = (0..10_001).map(|i| v1::GroupLoad { group: format!("g{i}"), units_per_s: 1.0 }).collect();
    let status = backend
        .report(v1::BackendReport {
            backend_id: "b".into(),
            zone: "z".into(),
            health: Some(v1::backend_report::Health::Utilisation(0.5)),
            loads,
            capacity: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("at most 10000 groups"), "{}", status.message());
    // And the server still answers everyone else.
    assert!(
        admission
            .exchange(v1::ExchangeRequest {
                client_id: "good".into(),
                sequence: 2,
                groups: vec![usage("g")],
                ..Default::default()
            })
            .await
            .is_ok()
    );
}

/// A message whose field 1 is not UTF-8: not a valid `ExchangeRequest` (its client id).
#[derive(Clone, PartialEq, prost::Message)]
struct NotAnExchange {
    #[prost(bytes = "vec", tag = "1")]
    client_id: Vec<u8>,
}

/// Regression: the docs promised INVALID_ARGUMENT for what the server answered INTERNAL and
/// OUT_OF_RANGE. They now say what it does, which is gRPC's convention: a request that is not
/// a valid protobuf message is INTERNAL, one over 4 MiB OUT_OF_RANGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_oversized_messages_get_grpc_codes_and_others_keep_being_served() {
    let s = ServerProc::start(&data_dir("undecodable"));
    let channel = tonic::transport::Endpoint::new(s.url()).unwrap().connect().await.unwrap();
    let mut raw = tonic::client::Grpc::new(channel.clone());
    // Both methods the server reads by hand: an exchange, and a backend's report (field 1 is
    // its backend id, a string too).
    for (path, what) in [
        ("/tollgate.v1.Admission/Exchange", "ExchangeRequest"),
        ("/tollgate.v1.Backend/Report", "BackendReport"),
    ] {
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        for (message, code) in [
            (NotAnExchange { client_id: vec![0xff, 0xfe, 0xfd] }, tonic::Code::Internal),
            (NotAnExchange { client_id: vec![b'x'; 5 * 1024 * 1024] }, tonic::Code::OutOfRange),
        ] {
            raw.ready().await.unwrap();
            let codec = tonic_prost::ProstCodec::<NotAnExchange, v1::ExchangeResponse>::default();
            let status = raw.unary(tonic::Request::new(message), path.clone(), codec).await.unwrap_err();
            assert_eq!(status.code(), code, "{what}: {status:?}");
            if code == tonic::Code::Internal {
                assert!(
                    status.message().contains(&format!("failed to decode Protobuf message: {what}")),
                    "{status:?}"
                );
            }
        }
    }
    let mut client = v1::admission_client::AdmissionClient::new(channel.clone());
    let ok =
        v1::ExchangeRequest { client_id: "good".into(), sequence: 1, groups: vec![], ..Default::default() };
    assert!(client.exchange(ok).await.is_ok(), "the server keeps serving");
    let mut backend = v1::backend_client::BackendClient::new(channel);
    let report = v1::BackendReport {
        backend_id: "b".into(),
        zone: "z".into(),
        health: Some(v1::backend_report::Health::Utilisation(0.5)),
        loads: vec![v1::GroupLoad { group: "g".into(), units_per_s: 1.0 }],
        capacity: None,
    };
    assert!(backend.report(report).await.is_ok(), "and takes reports");
}

/// What a client of `heavy` reports in the saturation tests: 2,000,000 units/s consumed.
fn heavy_usage() -> v1::GroupUsage {
    v1::GroupUsage {
        group: "heavy".into(),
        demand: 3_000_000.0,
        consumed: 2_000_000.0,
        admitted: 100,
        ..Default::default()
    }
}

/// A server ticking every `tick_ms`, no zone ignored, with the group `heavy` limited to
/// `limit`; an admission client and a backend client of it.
async fn heavy_server(
    name: &str,
    tick_ms: &str,
    limit: &str,
) -> (
    ServerProc,
    v1::admission_client::AdmissionClient<tonic::transport::Channel>,
    v1::backend_client::BackendClient<tonic::transport::Channel>,
) {
    let s = ServerProc::start_with(
        &data_dir(name),
        &["--tick-ms", tick_ms, "--ignore-worst-zones", "0"],
        Stdio::null(),
    );
    ok(&s, &["group", "create", "heavy", "--limit", limit]);
    let admission = v1::admission_client::AdmissionClient::connect(s.url()).await.unwrap();
    let backend = v1::backend_client::BackendClient::connect(s.url()).await.unwrap();
    (s, admission, backend)
}

/// A backend that reports itself newly saturated is acted on at once, not at the tick's
/// turn: with a tick of a minute, its group is limited right after the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_newly_saturated_is_acted_on_before_the_ticks_turn() {
    let (s, mut admission, mut backend) = heavy_server("onset", "60000", "10000000").await;
    let usage = heavy_usage();
    let req =
        v1::ExchangeRequest { client_id: "c".into(), sequence: 1, groups: vec![usage], ..Default::default() };
    admission.exchange(req).await.unwrap();
    let counter = |name: &str| {
        let metrics = http_get(&s.http, "/metrics");
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).expect("the counter");
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
    };
    let early_ticks = || counter("tollgate_early_ticks_total");
    // The first regular tick runs as the server starts; the next is a minute away.
    common::eventually("the first tick", || counter("tollgate_ticks_total") == 1);
    let report = |u: f64| v1::BackendReport {
        backend_id: "ss-0".into(),
        zone: "z0".into(),
        health: Some(v1::backend_report::Health::Utilisation(u)),
        loads: vec![v1::GroupLoad { group: "heavy".into(), units_per_s: 1_000_000.0 }],
        capacity: None,
    };
    backend.report(report(0.5)).await.unwrap();
    assert_eq!(early_ticks(), 0, "a backend with room asks for nothing");
    backend.report(report(1.2)).await.unwrap();
    common::eventually("an early tick", || early_ticks() == 1);
    assert_eq!(counter("tollgate_ticks_total"), 2, "the early tick is a tick");
    let json: serde_json::Value = serde_json::from_str(&ok(&s, &["status", "--json"])).unwrap();
    assert_eq!(json["groups"][0]["busy"], true, "{json}");
    let target = json["groups"][0]["target"].as_f64().unwrap();
    assert!(target < 1_000_000.0, "limited below its load: {target}");
}

/// A group throttled at its limit, its limit lifted, with a backend below saturation: the
/// server holds it at its backend's headroom (its load 1,000,000 over u = 0.5), not at the
/// 3,000,000 it asks for, and says so in its status and the dashboard's group detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_group_whose_limit_is_lifted_is_held_at_its_backends_headroom() {
    let (s, mut admission, mut backend) = heavy_server("headroom", "100", "1000000").await;
    let report = v1::BackendReport {
        backend_id: "ss-0".into(),
        zone: "z0".into(),
        health: Some(v1::backend_report::Health::Utilisation(0.5)),
        loads: vec![v1::GroupLoad { group: "heavy".into(), units_per_s: 1_000_000.0 }],
        capacity: None,
    };
    let mut sequence = 0;
    // Its target, whether it is busy, and the rate it is held at below saturation.
    let target = || {
        let json: serde_json::Value = serde_json::from_str(&ok(&s, &["status", "--json"])).unwrap();
        let g = &json["groups"][0];
        (g["target"].as_f64(), g["busy"] == true, g["headroom"].as_f64())
    };
    // The client asks 3,000,000 (its queue included) and reports at each look, so that it
    // stays known; the backend reports its 1,000,000 at u = 0.5.
    let mut look = async |admission: &mut v1::admission_client::AdmissionClient<_>| {
        sequence += 1;
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence,
            groups: vec![heavy_usage()],
            ..Default::default()
        };
        admission.exchange(req).await.unwrap();
        backend.report(report.clone()).await.unwrap();
    };
    let mut seen = (None, false, None);
    for _ in 0..600 {
        look(&mut admission).await;
        seen = target();
        if seen.0 == Some(1_000_000.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen, (Some(1_000_000.0), false, None), "held at its limit first");
    ok(&s, &["group", "alter", "heavy", "--limit", "unlimited"]);
    for _ in 0..600 {
        look(&mut admission).await;
        seen = target();
        // Right after the change the group may have no target for a tick: wait for one.
        if seen.0.is_some_and(|t| t != 1_000_000.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // 1,000,000 / 0.5: the room the backend has, not the 3,000,000 asked; not busy.
    assert_eq!(seen, (Some(2_000_000.0), false, Some(2_000_000.0)), "held at the headroom");
    let table = ok(&s, &["status"]);
    let row = table.lines().find(|l| l.starts_with("heavy")).expect("its row");
    assert_eq!(row.split_whitespace().nth(6), Some("room"), "{table}");
    let answer = http_get(&s.http, "/v1/dashboard/groups/heavy");
    let (_, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let detail: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(detail["headroom"].as_f64(), Some(2_000_000.0), "{detail}");
    assert!(detail["limiting"].is_null(), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_backend_report_limits_the_group_it_carries() {
    let s = ServerProc::start(&data_dir("backend"));
    ok(&s, &["group", "create", "heavy", "--limit", "10000000"]);
    let mut admission = v1::admission_client::AdmissionClient::connect(s.url()).await.unwrap();
    let mut backend = v1::backend_client::BackendClient::connect(s.url()).await.unwrap();
    let report = v1::BackendReport {
        backend_id: "ss-0".into(),
        zone: "z0".into(),
        // Utilisation 1.2: the ratio is 1 / (4 × 1.2 − 3) = 0.556.
        health: Some(v1::backend_report::Health::Utilisation(1.2)),
        loads: vec![v1::GroupLoad { group: "heavy".into(), units_per_s: 1_000_000.0 }],
        capacity: None,
    };
    // Two backends in two zones; the worst zone is ignored, so both must be saturated.
    backend.report(report.clone()).await.unwrap();
    backend
        .report(v1::BackendReport { backend_id: "ss-1".into(), zone: "z1".into(), ..report })
        .await
        .unwrap();
    let usage = heavy_usage();
    admission
        .exchange(v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 1,
            groups: vec![usage],
            ..Default::default()
        })
        .await
        .unwrap();
    // The next tick (within a second) sees it.
    let mut json = serde_json::Value::Null;
    for _ in 0..40 {
        json = serde_json::from_str(&ok(&s, &["status", "--json"])).unwrap();
        if json["groups"][0]["busy"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(json["groups"][0]["busy"], true, "{json}");
    let target = json["groups"][0]["target"].as_f64().unwrap();
    let expected = 2_000_000.0 / 1.68; // load on both backends × the ratio at u = 1.2
    assert!((target - expected).abs() < 1.0, "target {target}, expected {expected}");
}

#[test]
fn bench_exchange_loads_a_real_server_and_reports() {
    let s = ServerProc::start(&data_dir("bench"));
    let (code, out, err) = admin(
        &s,
        &[
            "bench",
            "exchange",
            "--server",
            &s.url(),
            "--clients",
            "5",
            "--groups",
            "3",
            "--duration",
            "0.5",
            "--rate",
            "20",
            "--server-pid",
            &s.child.id().to_string(),
            "--server-http",
            s.http.trim_start_matches("http://"),
            "--backends",
            "2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("clients 5 × groups 3"), "{out}");
    // Two backends shared the 15 groups: 8 and 7. The first reports at once, then once a
    // second; the second half a second in, as the run ends, or not at all.
    let reports = out
        .split("backends 2 (saturated), each reporting the loads of up to 8 groups once a second: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{out}"));
    let taken: u64 = reports.split_whitespace().next().unwrap().parse().unwrap();
    assert!(taken >= 1 && reports.contains("reports taken, 0 refused"), "{out}");
    // The server's own histogram counted every exchange the clients saw answered.
    let counted: f64 = out
        .split("server's own answer time (")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(out.contains("% within 1 ms"), "{out}");
    let exchanges: f64 =
        out.split("exchanges/s ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(exchanges > 0.0 && exchanges <= 5.0 * 20.0 * 1.5, "{out}");
    assert!(counted >= exchanges * 0.5, "{out}");
    assert!(out.contains("latency p50") && out.contains("server peak memory"), "{out}");
    let (code, _, err) = admin(&s, &["bench", "exchange", "--server", &s.url(), "--clients", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--clients, --groups and --connections must be above 0"), "{err}");
    // A run shorter than its clients' period may see no exchange due: said so, and at once.
    let short =
        ["bench", "exchange", "--server", &s.url(), "--clients", "1", "--duration", "0.2", "--rate", "0.01"];
    let (code, _, err) = admin(&s, &short);
    assert_ne!(code, 0);
    assert!(
        err.contains("no exchange was due in --duration 0.2 s") && err.contains("every 100.000 s"),
        "{err}"
    );
}

/// Regression: an exchange's answer (a head, a data frame of a few kilobytes, trailers) went
/// out in two writes to the socket, the head and data, then the trailers; the client woke for
/// each. One client exchanging in turn on one connection: one write per answer, and a few
/// for the connection itself and flow control.
#[test]
fn each_answer_goes_out_in_one_write() {
    let s = ServerProc::start(&data_dir("writes"));
    let counters = || {
        let metrics = http_get(&s.http, "/metrics");
        let read = |name: &str| -> f64 {
            let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{metrics}"));
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (read("tollgate_exchanges_total "), read("tollgate_grpc_writes_total "))
    };
    let (exchanges_before, writes_before) = counters();
    ok(
        &s,
        &[
            "bench",
            "exchange",
            "--server",
            &s.url(),
            "--clients",
            "1",
            "--groups",
            "100",
            "--connections",
            "1",
            "--duration",
            "1",
            "--rate",
            "60",
        ],
    );
    let (exchanges_after, writes_after) = counters();
    let (exchanges, writes) = (exchanges_after - exchanges_before, writes_after - writes_before);
    assert!(exchanges >= 30.0, "{exchanges} exchanges");
    assert!(writes <= exchanges * 1.2 + 10.0, "{writes} writes for {exchanges} answers");
}

#[test]
fn bench_accuracy_holds_a_limit_and_reservations() {
    let s = ServerProc::start(&data_dir("accuracy"));
    let capacity_before = ok(&s, &["node", "capacity"]);
    let (code, out, err) = admin(
        &s,
        &[
            "bench",
            "accuracy",
            "--setup",
            "--server",
            // A list, the first unreachable: the next answers.
            &format!("http://127.0.0.1:9,{}", s.url()),
            "--clients",
            "4",
            "--duration",
            "2",
            "--limit",
            "400",
            "--server-http",
            s.http.trim_start_matches("http://"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let pct: f64 = out.split("= ").nth(1).unwrap().split(" %").next().unwrap().trim().parse().unwrap();
    assert!(pct.abs() <= 10.0, "{out}");
    // Throttled clients exchange about once a tick (a second here), not at every refusal (each
    // is refused about a hundred times a second); the server's own client adds at most one
    // a tick.
    let per_client: f64 =
        out.split("exchanges/s while measured, ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(per_client > 0.0 && per_client <= 2.5, "{out}");
    assert!(out.contains("under saturation, reserved-a got"), "{out}");
    // Its groups are gone and the capacity is as it was.
    let listed = ok(&s, &["group", "list"]);
    assert!(!listed.contains("accuracy") && !listed.contains("hungry"), "{listed}");
    assert_eq!(ok(&s, &["node", "capacity"]), capacity_before, "the capacity was not set back");
}

/// Interrupted (Ctrl-C) in the middle, bench accuracy still drops its groups and sets the
/// capacity back.
#[test]
fn bench_accuracy_interrupted_leaves_the_settings_as_they_were() {
    let s = ServerProc::start(&data_dir("accuracy-interrupted"));
    ok(&s, &["node", "capacity", "5000"]);
    let before = ok(&s, &["node", "capacity"]);
    let bench = Command::new(BIN)
        .args(["bench", "accuracy", "--setup", "--server", &s.url(), "--clients", "2", "--duration", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::eventually("the bench makes its group", || ok(&s, &["group", "list"]).contains("accuracy"));
    Command::new("kill").args(["-INT", &bench.id().to_string()]).status().unwrap();
    let out = bench.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("interrupted"), "{err}");
    assert!(err.contains("put back as they were"), "{err}");
    let listed = ok(&s, &["group", "list"]);
    assert!(!listed.contains("accuracy"), "{listed}");
    assert_eq!(ok(&s, &["node", "capacity"]), before);
}

/// Kill -9 at moments picked from a seed, twenty times, while settings are written in a loop:
/// every write the server acknowledged is there after it starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_over_twenty_kills() {
    let dir = data_dir("kills");
    let mut acknowledged: Vec<String> = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = 0u32;
    for kill in 0..20 {
        let s = ServerProc::start(&dir);
        let mut grpc = v1::admin_client::AdminClient::connect(s.url()).await.unwrap();
        // Everything acknowledged so far is there.
        let mut stored = std::collections::BTreeSet::new();
        let mut page_token = String::new();
        loop {
            let page = grpc
                .list_groups(v1::ListGroupsRequest { page_size: 10_000, page_token })
                .await
                .unwrap()
                .into_inner();
            stored.extend(page.groups.into_iter().map(|g| g.name));
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let lost: Vec<&String> = acknowledged.iter().filter(|n| !stored.contains(*n)).collect();
        assert!(lost.is_empty(), "after {kill} kills, lost {} acknowledged writes: {lost:?}", lost.len());
        // Write until killed, at a moment from the seed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let writes_before_kill = 5 + seed % 40;
        let pid = s.child.id();
        for i in 0.. {
            if i == writes_before_kill {
                // Killed while the next write may be on its way.
                let killer = std::thread::spawn(move || {
                    Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
                });
                let name = format!("k{next:06}");
                next += 1;
                let req = v1::PutGroupRequest {
                    name: name.clone(),
                    patch: Some(v1::GroupPatch { limit: Some(5.0), ..Default::default() }),
                    mode: 0,
                };
                let written = grpc.put_group(req).await.is_ok();
                killer.join().unwrap();
                if written {
                    acknowledged.push(name);
                }
                break;
            }
            let name = format!("k{next:06}");
            next += 1;
            let req = v1::PutGroupRequest {
                name: name.clone(),
                patch: Some(v1::GroupPatch { limit: Some(5.0), ..Default::default() }),
                mode: 0,
            };
            grpc.put_group(req).await.expect("the server is up until killed");
            acknowledged.push(name);
        }
        drop(s);
    }
    assert!(acknowledged.len() > 100, "{} writes acknowledged", acknowledged.len());
}

#[test]
fn tidbs_sql_statements_create_alter_show_and_drop_groups() {
    let s = ServerProc::start(&data_dir("sql"));
    let out = ok(
        &s,
        &[
            "sql",
            "CREATE RESOURCE GROUP oltp RU_PER_SEC=20000, PRIORITY=HIGH, BURSTABLE;\n\
             CREATE RESOURCE GROUP small RU_PER_SEC=5000;\n\
             create resource group olap ru_per_sec = 50000 priority=low, burstable",
        ],
    );
    assert_eq!(
        out,
        "created resource group oltp\ncreated resource group small\ncreated resource group olap\n"
    );
    let show = ok(&s, &["group", "show", "small"]);
    assert!(show.contains("reserved: 5000") && show.contains("limit:    5000"), "{show}");
    let show = ok(&s, &["group", "show", "oltp"]);
    assert!(show.contains("limit:    unlimited") && show.contains("priority: high"), "{show}");

    // ALTER keeps what it does not name; BURSTABLE = FALSE caps the group at its RU_PER_SEC.
    ok(
        &s,
        &["sql", "ALTER RESOURCE GROUP oltp RU_PER_SEC 30000; ALTER RESOURCE GROUP olap BURSTABLE = FALSE"],
    );
    let show = ok(&s, &["group", "show", "oltp"]);
    assert!(show.contains("reserved: 30000") && show.contains("limit:    unlimited"), "{show}");
    let show = ok(&s, &["group", "show", "olap"]);
    assert!(show.contains("limit:    50000") && show.contains("priority: low"), "{show}");

    let table = ok(&s, &["sql", "SHOW RESOURCE GROUPS"]);
    assert!(
        table.lines().any(|l| l.split_whitespace().eq(["oltp", "30000", "HIGH", "YES", "UNLIMITED"])),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.split_whitespace().eq(["small", "5000", "MEDIUM", "NO", "5000"])),
        "{table}"
    );
    let create = ok(&s, &["sql", "SHOW CREATE RESOURCE GROUP oltp"]);
    assert_eq!(create, "CREATE RESOURCE GROUP `oltp` RU_PER_SEC = 30000, PRIORITY = HIGH, BURSTABLE\n");

    // A mistake anywhere runs nothing, and names the token.
    let (code, _, err) =
        admin(&s, &["sql", "DROP RESOURCE GROUP small; CREATE RESOURCE GROUP x RU_PER_SEC = many"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("line 1, column 65: expected a number from 0 to 1e15 for RU_PER_SEC, found `many`; nothing was run"),
        "{err}"
    );
    ok(&s, &["group", "show", "small"]);
    // A statement the server refuses stops the run and says how far it got.
    let (code, _, err) = admin(
        &s,
        &[
            "sql",
            "DROP RESOURCE GROUP small; CREATE RESOURCE GROUP oltp RU_PER_SEC=1; DROP RESOURCE GROUP olap",
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("statement 2 of 3: group \"oltp\" already exists (the 1 before it ran)"), "{err}");
    fails(&s, &["group", "show", "small"], "does not exist");
    ok(&s, &["group", "show", "olap"]);
    // IF (NOT) EXISTS, and statements from a file.
    let file = data_dir("sql-file").with_extension("sql");
    std::fs::write(
        &file,
        "CREATE RESOURCE GROUP IF NOT EXISTS oltp RU_PER_SEC=1;\nDROP RESOURCE GROUP IF EXISTS ghost;\n",
    )
    .unwrap();
    let out = ok(&s, &["sql", "--file", file.to_str().unwrap()]);
    // Regression: dropping a missing group with IF EXISTS said it was dropped.
    assert_eq!(
        out,
        "resource group oltp exists: left as it is\nresource group ghost does not exist: nothing dropped\n"
    );
    fails(
        &s,
        &["sql", "ALTER RESOURCE GROUP ghost PRIORITY=LOW"],
        "statement 1 of 1: group \"ghost\" does not exist",
    );
    // Tollgate's extension: PARENT nests a group (hierarchical quotas), PARENT = NULL undoes it.
    ok(&s, &["sql", "CREATE RESOURCE GROUP `oltp/eu` RU_PER_SEC = 1000, BURSTABLE, PARENT = oltp"]);
    let create = ok(&s, &["sql", "SHOW CREATE RESOURCE GROUP `oltp/eu`"]);
    assert!(create.trim_end().ends_with("BURSTABLE, PARENT = `oltp`"), "{create}");
    fails(&s, &["sql", "DROP RESOURCE GROUP oltp"], "oltp is the parent of oltp/eu");
    fails(&s, &["sql", "ALTER RESOURCE GROUP oltp PARENT = `oltp/eu`"], "parent: makes a cycle");
    ok(&s, &["sql", "ALTER RESOURCE GROUP `oltp/eu` PARENT = NULL; DROP RESOURCE GROUP oltp"]);
}

/// An HTTP request with a body: (status code, body).
fn http_send(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let code = answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (code, body)
}

#[test]
fn couchbases_json_properties_through_the_cli_and_http() {
    let s = ServerProc::start(&data_dir("properties"));
    assert_eq!(
        ok(&s, &["node", "get-properties"]),
        "{\"capacity\": \"unlimited\", \"mode\": \"share\", \"slow_start\": false, \"shadow\": false, \"throttling\": true}\n"
    );
    assert_eq!(
        ok(&s, &["node", "set-properties", r#"{"capacity": 25000}"#]),
        "{\"capacity\": 25000, \"mode\": \"share\", \"slow_start\": false, \"shadow\": false, \"throttling\": true}\n"
    );
    assert_eq!(ok(&s, &["node", "capacity"]), "25000\n");
    assert_eq!(
        ok(&s, &["group", "set-properties", "tenant", r#"{"reserved": 100, "hard_limit": "unlimited"}"#]),
        "{\"reserved\": 100, \"hard_limit\": \"unlimited\"}\n"
    );
    // Only the keys given change.
    ok(&s, &["group", "set-properties", "tenant", r#"{"hard_limit": 400}"#]);
    assert_eq!(ok(&s, &["group", "get-properties", "tenant"]), "{\"reserved\": 100, \"hard_limit\": 400}\n");
    let show = ok(&s, &["group", "show", "tenant"]);
    assert!(show.contains("reserved: 100") && show.contains("limit:    400"), "{show}");

    // Bad documents name the key, and change nothing.
    fails(
        &s,
        &["group", "set-properties", "tenant", r#"{"reserved": 500}"#],
        "reserved: must not exceed hard_limit (500 > 400)",
    );
    fails(
        &s,
        &["group", "set-properties", "tenant", r#"{"reserved": "lots"}"#],
        "reserved: must be a number of units/s, got the string \"lots\"",
    );
    fails(&s, &["group", "set-properties", "tenant", r#"{"hardlimit": 5}"#], "\"hardlimit\": unknown key");
    fails(
        &s,
        &["node", "set-properties", r#"{"capacity": 10, "mode": "fair"}"#],
        "mode: must be \"share\" or \"fcfs\"",
    );
    fails(&s, &["node", "set-properties", "capacity=10"], "not JSON");
    fails(&s, &["group", "get-properties", "ghost"], "group \"ghost\" does not exist");
    assert_eq!(ok(&s, &["group", "get-properties", "tenant"]), "{\"reserved\": 100, \"hard_limit\": 400}\n");
    assert_eq!(ok(&s, &["node", "capacity"]), "25000\n");

    // The same documents over HTTP.
    let (code, body) = http_send(&s.http, "GET", "/v1/node/properties", "");
    assert_eq!(
        (code, body.as_str()),
        (
            200,
            "{\"capacity\": 25000, \"mode\": \"share\", \"slow_start\": false, \"shadow\": false, \"throttling\": true}"
        )
    );
    let (code, body) = http_send(&s.http, "PUT", "/v1/node/properties", r#"{"mode": "fcfs"}"#);
    assert_eq!(
        (code, body.as_str()),
        (
            200,
            "{\"capacity\": 25000, \"mode\": \"fcfs\", \"slow_start\": false, \"shadow\": false, \"throttling\": true}"
        )
    );
    assert_eq!(ok(&s, &["node", "mode"]), "fcfs\n");
    // Couchbase's slow start, by document or by command.
    let (code, body) = http_send(&s.http, "PUT", "/v1/node/properties", r#"{"slow_start": true}"#);
    assert_eq!(
        (code, body.as_str()),
        (
            200,
            "{\"capacity\": 25000, \"mode\": \"fcfs\", \"slow_start\": true, \"shadow\": false, \"throttling\": true}"
        )
    );
    assert_eq!(ok(&s, &["node", "slow-start"]), "on\n");
    assert_eq!(ok(&s, &["node", "slow-start", "off"]), "off\n");
    fails(
        &s,
        &["node", "set-properties", r#"{"slow_start": "yes"}"#],
        "slow_start: must be true or false, got the string \"yes\"",
    );
    let (code, body) =
        http_send(&s.http, "PUT", "/v1/groups/web/properties", r#"{"reserved": 10, "hard_limit": 20}"#);
    assert_eq!((code, body.as_str()), (200, "{\"reserved\": 10, \"hard_limit\": 20}"));
    let (code, body) = http_send(&s.http, "GET", "/v1/groups/web/properties", "");
    assert_eq!((code, body.as_str()), (200, "{\"reserved\": 10, \"hard_limit\": 20}"));
    let (code, body) = http_send(&s.http, "PUT", "/v1/groups/web/properties", r#"{"reserved": 30}"#);
    // A problem (RFC 9457) naming the field and the rule.
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, &v["field"], &v["rule"]),
        (400, &"reserved".into(), &"must not exceed hard_limit (30 > 20)".into()),
        "{body}"
    );
    assert_eq!(v["detail"], "reserved: must not exceed hard_limit (30 > 20)");
    let (code, body) = http_send(&s.http, "PUT", "/v1/node/properties", r#"{"capacity": -5}"#);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("capacity: must be from 0 to 1e15"), "{body}");
    let (code, body) = http_send(&s.http, "GET", "/v1/groups/ghost/properties", "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((code, &v["detail"]), (404, &"group \"ghost\" does not exist".into()), "{body}");
    let (code, _) = http_send(&s.http, "PUT", "/v1/node/properties", &" ".repeat(70_000));
    assert_eq!(code, 413);
    assert_eq!(ok(&s, &["group", "get-properties", "web"]), "{\"reserved\": 10, \"hard_limit\": 20}\n");
}

#[test]
fn a_defaults_file_fills_what_the_store_lacks_and_a_broken_one_stops_the_start() {
    let data = data_dir("defaults");
    let file = data_dir("defaults-file").with_extension("toml");
    std::fs::write(
        &file,
        "[node]\ncapacity = 5000\nmode = \"fcfs\"\nslow_start = true\n\n[groups.a]\nreserved = 100\nlimit = 200\n\n[groups.b]\nlimit = 50\n",
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let s = ServerProc::start_with(&data, &["--config", config], Stdio::null());
    assert_eq!(
        ok(&s, &["node", "get-properties"]),
        "{\"capacity\": 5000, \"mode\": \"fcfs\", \"slow_start\": true, \"shadow\": false, \"throttling\": true}\n"
    );
    assert_eq!(ok(&s, &["group", "get-properties", "a"]), "{\"reserved\": 100, \"hard_limit\": 200}\n");
    // What is changed at run time wins over the file at the next start; a group the store
    // lacks (dropped here) comes back from it.
    ok(&s, &["group", "alter", "a", "--limit", "300"]);
    ok(&s, &["node", "capacity", "7000"]);
    ok(&s, &["group", "drop", "b"]);
    assert!(s.terminate().success());
    let s = ServerProc::start_with(&data, &["--config", config], Stdio::null());
    assert_eq!(ok(&s, &["group", "get-properties", "a"]), "{\"reserved\": 100, \"hard_limit\": 300}\n");
    assert_eq!(ok(&s, &["node", "capacity"]), "7000\n");
    assert_eq!(ok(&s, &["group", "get-properties", "b"]), "{\"reserved\": 0, \"hard_limit\": 50}\n");
    drop(s);

    // A broken file: every problem with its line, as check-config prints them; nothing opened.
    let fresh = data_dir("defaults-broken");
    std::fs::write(&file, "[node]\ncapacity = -1\n\n[groups.a]\nreserved = 10\nlimit = 5\nspeed = 3\n")
        .unwrap();
    let out = server_command(&fresh, "127.0.0.1:0").args(["--config", config]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a valid settings file; the server did not start and nothing was changed"),
        "{err}"
    );
    assert!(err.contains(":2: node.capacity: ") && err.contains(":7: groups.a.speed: "), "{err}");
    assert!(err.contains("2 problems found"), "{err}");
    assert!(!fresh.exists(), "the data directory was created");
    let out = server_command(&fresh, "127.0.0.1:0")
        .args(["--config", "/nonexistent/tollgate.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/tollgate.toml"));
}

/// FoundationDB's `GlobalTagThrottler_GotClientRate`: every rate computation, followed live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_follows_every_rate_computation_live() {
    let s = ServerProc::start_with(&data_dir("trace"), &["--tick-ms", "50"], Stdio::null());
    ok(&s, &["group", "create", "g", "--limit", "100"]);
    ok(&s, &["group", "create", "other", "--limit", "100"]);
    let follower = Command::new(BIN)
        .args(["trace", "g", "--count", "3"])
        .env("TOLLGATE_SERVER", s.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Traffic for both groups until the follower has its three lines.
    let mut client = v1::admission_client::AdmissionClient::connect(s.url()).await.unwrap();
    let mut backend = v1::backend_client::BackendClient::connect(s.url()).await.unwrap();
    let usage = |group: &str| v1::GroupUsage {
        group: group.into(),
        demand: 50.0,
        consumed: 5.0,
        admitted: 5,
        ..Default::default()
    };
    let done = tokio::task::spawn_blocking(move || follower.wait_with_output().unwrap());
    let mut sequence = 0;
    while !done.is_finished() {
        sequence += 1;
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence,
            groups: vec![usage("g"), usage("other")],
            ..Default::default()
        };
        client.exchange(req).await.unwrap();
        let report = v1::BackendReport {
            backend_id: "b1".into(),
            zone: "z1".into(),
            health: Some(v1::backend_report::Health::Utilisation(0.5)),
            loads: vec![v1::GroupLoad { group: "g".into(), units_per_s: 40.0 }],
            capacity: None,
        };
        backend.report(report).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(sequence < 3000, "the trace never gave three lines");
    }
    let out = done.await.unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines.iter().all(|l| l["group"] == "g"), "only the group asked for: {text}");
    let rate = lines.iter().find(|l| l["event"] == "rate").unwrap_or_else(|| panic!("{text}"));
    for key in
        ["reserved", "desired", "limiting", "share", "target", "per_client", "average_cost", "limited_by"]
    {
        assert!(rate.get(key).is_some(), "{key} missing: {rate}");
    }
    assert_eq!(rate["desired"], 100.0);
    // A bad group name is named; nothing is followed.
    fails(&s, &["trace", "bad\nname"], "group: must be printable text");
    // Regression: a trace of a group that does not exist waited for ever, saying nothing.
    fails(&s, &["trace", "ghost"], "group \"ghost\" does not exist");
    fails(&s, &["trace", "--timeout", "0"], "--timeout");
}

#[test]
fn a_server_refuses_to_listen_beyond_loopback_unless_told_it_is_insecure() {
    for (flag, addr) in [("--grpc", "0.0.0.0:0"), ("--http", "0.0.0.0:0")] {
        let data = data_dir("not-loopback");
        let other = if flag == "--grpc" { "--http" } else { "--grpc" };
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["server", "--data", data.to_str().unwrap(), other, "127.0.0.1:0", flag, addr]);
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {addr} started");
        assert!(
            err.contains(&format!("{flag} {addr}: not a loopback address")) && err.contains("--insecure"),
            "{err}"
        );
        // Nothing was created.
        assert!(!data.join("tollgate.redb").exists());
    }
}

#[test]
fn every_change_is_in_the_audit_log_with_who_before_and_after_across_a_restart() {
    let data = data_dir("audit");
    let server = ServerProc::start(&data);
    ok(&server, &["group", "create", "a", "--limit", "100"]);
    ok(&server, &["group", "alter", "a", "--limit", "50"]);
    ok(&server, &["node", "capacity", "900"]);
    ok(&server, &["group", "drop", "a"]);
    // A refused change is not a change.
    fails(&server, &["group", "create", "b", "--reserved", "10", "--limit", "5"], "reserved");
    // Over HTTP too.
    let body = r#"{"reserved": 7}"#;
    let mut s = TcpStream::connect(&server.http).unwrap();
    write!(
        s,
        "PUT /v1/groups/c/properties HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let check = |server: &ServerProc| {
        let lines: Vec<serde_json::Value> =
            ok(server, &["audit", "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let whats: Vec<&str> = lines.iter().map(|l| l["what"].as_str().unwrap()).collect();
        assert_eq!(
            whats,
            ["group.put a", "group.put a", "node.set", "group.drop a", "group.put c"],
            "{lines:#?}"
        );
        assert!(lines[0]["before"].is_null() && lines[0]["after"]["limit"] == 100.0, "{}", lines[0]);
        assert!(lines[1]["before"]["limit"] == 100.0 && lines[1]["after"]["limit"] == 50.0, "{}", lines[1]);
        assert!(
            lines[2]["before"]["capacity"].is_null() && lines[2]["after"]["capacity"] == 900.0,
            "{}",
            lines[2]
        );
        assert!(lines[3]["after"].is_null(), "{}", lines[3]);
        assert!(lines[0]["who"].as_str().unwrap().starts_with("grpc 127.0.0.1:"), "{}", lines[0]);
        assert!(lines[4]["who"].as_str().unwrap().starts_with("http 127.0.0.1:"), "{}", lines[4]);
        assert!(lines.windows(2).all(|w| w[0]["at_unix_ms"].as_u64() <= w[1]["at_unix_ms"].as_u64()));
    };
    check(&server);
    // Durable like the settings.
    assert!(server.terminate().success());
    let server = ServerProc::start(&data);
    check(&server);
    // Spans: the last hour has them all; a time to come has none; the text form reads.
    assert_eq!(ok(&server, &["audit", "--since", "1h", "--json"]).lines().count(), 5);
    assert_eq!(ok(&server, &["audit", "--since", "99999999999999", "--json"]).lines().count(), 0);
    assert_eq!(ok(&server, &["audit", "--limit", "2", "--json"]).lines().count(), 2);
    let text = ok(&server, &["audit"]);
    assert!(
        text.contains("group.put a") && text.contains("before: -") && text.contains("Z  grpc 127.0.0.1:"),
        "{text}"
    );
    fails(&server, &["audit", "--since", "yesterday"], "expected a span such as 90s");
    fails(&server, &["audit", "--limit", "0"], "0");
}

/// Regression: nothing said what a unit counts, and reservations past the capacity (or a limit
/// above it, or a priority in fcfs mode) went unremarked. Status, `/status`, the dashboard's
/// data and the log say both.
#[test]
fn status_says_what_a_unit_counts_and_warns_of_settings_that_cannot_act() {
    let s = ServerProc::start_with(&data_dir("units"), &["--cost-model", "ru"], Stdio::piped());
    ok(&s, &["node", "capacity", "100"]);
    ok(&s, &["group", "create", "a", "--reserved", "80"]);
    ok(&s, &["group", "create", "b", "--reserved", "50", "--limit", "500"]);
    ok(&s, &["node", "mode", "fcfs"]);
    ok(&s, &["group", "create", "c", "--priority", "high"]);
    let text = ok(&s, &["status"]);
    assert!(text.contains("units: request units a second (cost model ru)"), "{text}");
    let warnings = [
        "the groups reserve 130 units/s in all, more than the node capacity 100",
        "groups.b.limit 500 is above the node capacity 100",
        "groups.c: priority and weight do nothing in fcfs mode",
    ];
    for w in warnings {
        assert!(text.contains(&format!("warning: {w}")), "{w}: {text}");
    }
    let body = http_get(&s.http, "/status");
    let json: serde_json::Value = serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(json["unit"], "request units");
    assert_eq!(json["cost_model"], "ru");
    assert_eq!(json["warnings"].as_array().unwrap().len(), 3, "{json}");
    assert!(json["groups"].as_array().unwrap().iter().all(|g| g["unit"] == "request units"), "{json}");
    let body = http_get(&s.http, "/v1/dashboard");
    let json: serde_json::Value = serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(json["node"]["unit"], "request units");
    assert_eq!(json["node"]["warnings"].as_array().unwrap().len(), 3, "{json}");
    // The log says each once, when the settings first held it.
    let mut s = s;
    let mut stderr = s.child.stderr.take().unwrap();
    assert!(s.terminate().success());
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    for w in warnings {
        assert_eq!(log.matches(w).count(), 1, "{w}: {log}");
    }
}

/// The server started on the data in `dir`: the process and the first line it printed (empty
/// when it stopped without serving).
fn start_on(dir: &std::path::Path) -> (std::process::Child, String) {
    let mut child = server_command(dir, "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    (child, line)
}

/// A data file damaged anywhere (random bytes over 64 KiB at a quarter, half and three
/// quarters of it) stops the start with a clear error (exit 1, never a panic) and is left byte
/// for byte; or, where the damage fell in pages the file does not use, the server starts with
/// every setting intact.
#[test]
fn a_data_file_damaged_in_the_middle_is_refused_and_left_byte_for_byte() {
    let dir = data_dir("damaged-middle");
    let s = ServerProc::start(&dir);
    for i in 0..300 {
        let body = format!(r#"{{"name":"tenant-{i:03}","limit":{}}}"#, 10 + i);
        let (code, _, _) = common::http(&s.http, "POST", "/v1/groups", &[], &body);
        assert_eq!(code, 201);
    }
    assert!(s.terminate().success());
    let path = dir.join("tollgate.redb");
    let clean = std::fs::read(&path).unwrap();
    let mut refused = 0;
    for (at, quarter) in [(1, "a quarter"), (2, "half"), (3, "three quarters")] {
        let mut damaged = clean.clone();
        let start = (clean.len() * at / 4).saturating_sub(32 * 1024);
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ at as u64;
        for b in damaged.iter_mut().skip(start).take(64 * 1024) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(&path, &damaged).unwrap();
        let (mut child, line) = start_on(&dir);
        if line.is_empty() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "damage at {quarter}: a clear error, not a panic: {err}");
            assert!(err.contains("tollgate.redb") && err.contains("nothing was changed"), "{err}");
            assert!(std::fs::read(&path).unwrap() == damaged, "damage at {quarter}: the file was changed");
            refused += 1;
        } else {
            // Started: the damage was in unused pages, and every setting reads back.
            let http = line.split_whitespace().nth(6).unwrap().to_string();
            let (code, _, body) = common::http(&http, "GET", "/v1/groups/tenant-299", &[], "");
            assert_eq!(code, 200, "damage at {quarter}: {body}");
            assert!(body.contains("\"limit\":309"), "{body}");
            let _ = child.kill();
            let _ = child.wait();
            std::fs::write(&path, &clean).unwrap();
        }
    }
    assert!(refused >= 1, "no damage was noticed: is the file {} bytes of unused pages?", clean.len());
}

/// `/metrics` carries the process's own health and the build, as a platform team's Prometheus
/// expects of every service: the version `tollgate --version` prints, and the server's CPU,
/// memory, descriptors and start.
#[test]
fn metrics_carry_the_build_and_the_process() {
    let s = ServerProc::start(&data_dir("process-metrics"));
    let metrics = http_get(&s.http, "/metrics");
    let version = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().trim_start_matches("tollgate ").to_string();
    assert!(metrics.contains(&format!("tollgate_build_info{{version=\"{version}\"}} 1")), "{metrics}");
    let value = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(value("process_cpu_seconds_total") >= 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 4.0, "two listeners and the store at least");
    assert!(value("process_max_fds") >= value("process_open_fds"));
    let now = tollgate_controller::wall_ms() as f64 / 1000.0;
    let started = value("process_start_time_seconds");
    assert!(started <= now + 1.0 && started > now - 600.0, "started {started}, now {now}");
    // CPU time is counted in clock ticks (10 ms): it shows once the server has worked a little.
    common::eventually("the server's CPU time counted", || {
        let metrics = http_get(&s.http, "/metrics");
        let cpu = metrics.lines().find_map(|l| l.strip_prefix("process_cpu_seconds_total "));
        cpu.and_then(|v| v.trim().parse::<f64>().ok()).is_some_and(|v| v > 0.0)
    });
}

/// `--log-format json`: every line the server logs is one JSON object a log collector can
/// read, with its level and message; the default stays a line for people.
#[test]
fn the_log_can_be_json_a_line() {
    let data = data_dir("log-json");
    let s = ServerProc::start_with(&data, &["--log-format", "json"], Stdio::piped());
    ok(&s, &["group", "create", "logged", "--limit", "10"]);
    let mut child = {
        let mut s = s;
        let child = std::mem::replace(&mut s.child, Command::new("true").spawn().unwrap());
        drop(s);
        child
    };
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    child.wait().unwrap();
    let lines: Vec<serde_json::Value> =
        err.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(!lines.is_empty(), "nothing logged");
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()), "{err}");
    assert!(lines.iter().any(|l| l["fields"]["message"] == "serving"), "{err}");
    let bad = Command::new(BIN).args(["server", "--log-format", "xml"]).output().unwrap();
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && said.contains("--log-format") && said.contains("json"), "{said}");
}

/// The status's entry for group `name` (`Null` if it has none).
fn group_status(server: &ServerProc, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&http_get_body(&server.http, "/v1/status")).unwrap();
    v["groups"].as_array().and_then(|gs| gs.iter().find(|g| g["name"] == name).cloned()).unwrap_or_default()
}

fn http_get_body(addr: &str, path: &str) -> String {
    let answer = http_get(addr, path);
    answer.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string())
}

/// `n` checks of one unit for `group` over HTTP: how many were admitted.
fn checks(server: &ServerProc, group: &str, n: usize) -> usize {
    let body = format!(r#"{{"group":"{group}"}}"#);
    (0..n).filter(|_| http_send(&server.http, "POST", "/v1/check", &body).0 == 200).count()
}

#[test]
fn shadow_mode_and_the_one_switch_through_the_cli_http_sql_metrics_and_audit() {
    let s = ServerProc::start_with(&data_dir("shadow"), &["--tick-ms", "100"], Stdio::null());
    ok(&s, &["group", "create", "dark", "--limit", "0.01", "--burst", "2", "--shadow", "true"]);
    ok(&s, &["group", "create", "live", "--limit", "0.01", "--burst", "2"]);
    assert!(ok(&s, &["group", "show", "dark"]).contains("shadow:   never refused"));
    // A group in shadow mode is never refused; the one beside it is held to its burst.
    assert_eq!(checks(&s, "dark", 8), 8);
    assert!(checks(&s, "live", 8) < 8);
    common::eventually("the status counts what shadow mode would have refused", || {
        let (dark, live) = (group_status(&s, "dark"), group_status(&s, "live"));
        dark["admitted_total"] == 8
            && dark["throttled_total"] == 0
            && dark["would_refuse_total"].as_u64().unwrap_or(0) > 0
            && live["throttled_total"].as_u64().unwrap_or(0) > 0
            && live["would_refuse_total"] == 0
    });
    let dark = group_status(&s, "dark")["would_refuse_total"].as_f64().unwrap();
    let metric = common::metric(&s.http, "tollgate_group_would_refuse_requests_total{group=\"dark\"}");
    assert_eq!(metric, dark);
    assert_eq!(common::metric(&s.http, "tollgate_node_throttling"), 1.0);
    common::eventually("usage shows the would-be refusals once metered", || {
        let (_, out, _) = admin(&s, &["usage", "dark"]);
        out.contains(&format!("admitted 8  refused 0  would refuse {dark}"))
    });

    // The one switch: off admits everything and keeps every setting.
    assert_eq!(ok(&s, &["node", "throttling", "off"]), "off\n");
    assert_eq!(common::metric(&s.http, "tollgate_node_throttling"), 0.0);
    common::eventually("throttling off reaches the HTTP path", || checks(&s, "live", 8) == 8);
    assert!(ok(&s, &["group", "show", "live"]).contains("limit:    0.01"));
    assert_eq!(ok(&s, &["node", "throttling"]), "off\n");
    assert_eq!(ok(&s, &["node", "throttling", "on"]), "on\n");
    common::eventually("throttling back on holds the limit again", || checks(&s, "live", 8) < 8);
    // TiDB's statement is the same switch; node-wide shadow mode by command or document.
    assert_eq!(
        ok(&s, &["sql", "SET GLOBAL tidb_enable_resource_control = OFF"]),
        "resource control off: nothing is throttled\n"
    );
    assert_eq!(ok(&s, &["node", "throttling"]), "off\n");
    assert_eq!(ok(&s, &["node", "shadow", "on"]), "on\n");
    let (code, body) = http_send(&s.http, "PATCH", "/v1/node", r#"{"throttling": true, "shadow": false}"#);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["throttling"].as_bool(), v["shadow"].as_bool()), (Some(true), Some(false)), "{body}");
    let (code, body) = http_send(&s.http, "PATCH", "/v1/node", r#"{"throttling": "off"}"#);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("throttling"), "{body}");
    // Every flip is audited, before and after.
    let lines: Vec<serde_json::Value> =
        ok(&s, &["audit", "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let flips: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["what"] == "node.set" && l["before"]["throttling"] != l["after"]["throttling"])
        .map(|l| (l["before"]["throttling"].as_str().unwrap(), l["after"]["throttling"].as_str().unwrap()))
        .collect();
    assert_eq!(flips, [("on", "off"), ("off", "on"), ("on", "off"), ("off", "on")], "{lines:#?}");
}

/// One bit flipped anywhere in the data file, at 40 random places: the start is refused with
/// a clear error and the file left byte for byte, or the server starts with every one of 300
/// groups exactly as it was. A flipped bit is never served as a setting.
#[test]
fn a_flipped_bit_is_refused_or_harmless_never_served() {
    let dir = data_dir("flipped-bit");
    let s = ServerProc::start(&dir);
    for i in 0..300 {
        let body = format!(r#"{{"name":"tenant-{i:03}","limit":{}}}"#, 10 + i);
        assert_eq!(common::http(&s.http, "POST", "/v1/groups", &[], &body).0, 201);
    }
    assert!(s.terminate().success());
    let path = dir.join("tollgate.redb");
    let clean = std::fs::read(&path).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut refused, mut named) = (0, 0);
    for _ in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bit = (x % (clean.len() as u64 * 8)) as usize;
        let mut damaged = clean.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&path, &damaged).unwrap();
        let (mut child, line) = start_on(&dir);
        if line.is_empty() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "bit {bit}: a clear error, not a panic: {err}");
            assert!(err.contains("nothing was changed"), "bit {bit}: {err}");
            assert!(std::fs::read(&path).unwrap() == damaged, "bit {bit}: the file was changed");
            refused += 1;
            named += usize::from(err.contains("checksum does not match"));
        } else {
            // Started: every group reads back exactly as written.
            let http = line.split_whitespace().nth(6).unwrap().to_string();
            let (code, _, body) = common::http(&http, "GET", "/v1/groups?limit=1000", &[], "");
            assert_eq!(code, 200, "bit {bit}: {body}");
            let page: serde_json::Value = serde_json::from_str(&body).unwrap();
            let groups = page["groups"].as_array().unwrap();
            assert_eq!(groups.len(), 300, "bit {bit}: {body}");
            for (i, g) in groups.iter().enumerate() {
                assert_eq!(g["name"], format!("tenant-{i:03}"), "bit {bit}");
                assert_eq!(g["settings"]["limit"].as_f64(), Some(10.0 + i as f64), "bit {bit}: {g}");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        std::fs::write(&path, &clean).unwrap();
    }
    assert!(refused >= 1 && named >= 1, "{refused} refused, {named} by a record's checksum");
}
