//! A real Envoy in front of a small upstream, with `tollgate server` as its rate-limit
//! service (RLS v3): the HTTP rate-limit filter asks about every request, by tenant header.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common;
use common::envoy::{counter, envoy, get, request, upstream};
use common::{BIN, ServerProc, data_dir, eventually, try_metric};

fn admin(url: &str, args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A worker asking Envoy at `listen` for `group` as fast as it answers until `stop`: it
/// counts the answers 200, 429 and any other.
fn ask_as_fast(listen: u16, group: &'static str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<[u64; 3]> {
    std::thread::spawn(move || {
        let mut counts = [0; 3];
        while !stop.load(Ordering::Relaxed) {
            match get(listen, "/", Some(group)).map(|(c, _)| c) {
                Some(200) => counts[0] += 1,
                Some(429) => counts[1] += 1,
                c => counts[2] += u64::from(c.is_some()),
            }
        }
        counts
    })
}

#[test]
fn envoy_over_its_limit_gets_429_at_the_groups_rate_and_fails_closed_without_tollgate() {
    let dir = data_dir("envoy");
    let s = ServerProc::start_with(&dir.join("data"), &["--tick-ms", "100"], Stdio::null());
    admin(&s.url(), &["group", "create", "acme", "--limit", "20"]);
    admin(&s.url(), &["group", "create", "globex", "--limit", "100000"]);
    let grpc: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let e = envoy(
        &dir,
        "envoy.yaml",
        grpc,
        upstream(),
        &[("failure_mode_deny: false", "failure_mode_deny: true")],
    );
    let listen = e.listen;
    // The first requests: admitted, with the RateLimit headers Envoy builds from our answer.
    let (code, head) = get(listen, "/", Some("acme")).unwrap();
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("x-ratelimit-limit: 20"), "{head}");
    // Four workers ask for acme as fast as Envoy answers, for ten seconds: acme is held to
    // its limit (20 units/s, and the burst of one second); globex, asked meanwhile, passes.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4).map(|_| ask_as_fast(listen, "acme", stop.clone())).collect();
    #[allow(clippy::disallowed_methods)] // the window the admitted rate is measured over
    let started = Instant::now();
    let mut globex = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        globex.push(get(listen, "/", Some("globex")).map(|(c, _)| c));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let [ok, limited, other] = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .fold([0; 3], |t, c| [t[0] + c[0], t[1] + c[1], t[2] + c[2]]);
    let elapsed = started.elapsed().as_secs_f64();
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
    let e = envoy(&dir, "envoy.yaml", grpc, upstream(), &[]);
    let (listen, admin_port) = (e.listen, e.admin);
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
        let ok_before = counter(admin_port, "cluster.application.ratelimit.ok");
        let mut codes = Vec::new();
        for i in 0..50 {
            let tenant = format!("new-{round}-{i}");
            codes.push((tenant.clone(), get(listen, "/", Some(&tenant)).map(|(c, _)| c)));
        }
        let refused: Vec<_> = codes.iter().filter(|(_, c)| *c != Some(200)).collect();
        assert!(refused.is_empty(), "capacity {capacity:?}: every new tenant admitted: {refused:?}");
        let ok = counter(admin_port, "cluster.application.ratelimit.ok") - ok_before;
        let error = counter(admin_port, "cluster.application.ratelimit.error");
        let allowed = counter(admin_port, "cluster.application.ratelimit.failure_mode_allowed");
        assert_eq!((ok, error, allowed), (50, 0, 0), "capacity {capacity:?}: Tollgate answered each in time");
    }
}

/// Work whose cost is known only once it is done: with the shipped `charge.yaml`, Envoy admits
/// a request for one unit, then charges the `x-cost` its response carried after the response
/// has ended. The charge is taken whole, into debt, and the tenant's next request is refused
/// until the debt is paid; another tenant is not touched.
#[test]
fn envoy_charges_a_responses_cost_after_it_ends_into_debt() {
    let dir = data_dir("envoy-charge");
    let s = ServerProc::start_with(&dir.join("data"), &["--tick-ms", "100"], Stdio::null());
    admin(&s.url(), &["group", "create", "llm", "--limit", "10"]);
    let grpc: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let e = envoy(&dir, "charge.yaml", grpc, upstream(), &[]);
    let consumed = |g: &str| {
        try_metric(&s.http, &format!("tollgate_group_consumed_units_total{{group=\"{g}\"}}")).unwrap_or(0.0)
    };
    // Admitted for a unit; the answer says it cost 500 (one charge may take up to a minute at
    // the group's limit of 10: 600).
    let (code, head) = request(e.listen, "/", &[("x-tenant", "llm"), ("x-cost", "500")]).unwrap();
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("x-cost: 500"), "{head}");
    // Envoy charges after the response: the unit admitted and the 500 charged.
    eventually("the charge is counted", || consumed("llm") >= 501.0);
    assert_eq!(consumed("llm"), 501.0, "charged once, whole");
    // In debt about 490 units deep at 10 a second: the next request is refused.
    let (code, head) = request(e.listen, "/", &[("x-tenant", "llm")]).unwrap();
    assert_eq!(code, 429, "{head}");
    // Another tenant passes.
    assert_eq!(request(e.listen, "/", &[("x-tenant", "other")]).map(|(c, _)| c), Some(200));
    // A cost that is not a number: Envoy leaves that charge out; the unit admitted stays.
    let (code, _) = request(e.listen, "/", &[("x-tenant", "fresh"), ("x-cost", "lots")]).unwrap();
    assert_eq!(code, 200);
    eventually("the admission is counted", || consumed("fresh") >= 1.0);
    assert_eq!(counter(e.admin, "cluster.application.ratelimit.error"), 0, "Tollgate answered every call");
}

/// An upstream whose answers wait until the test lets them go: counts the requests in it now
/// and the most there ever were at once.
struct GatedUpstream {
    port: u16,
    state: Arc<(std::sync::Mutex<Gate>, std::sync::Condvar)>,
}

#[derive(Default)]
struct Gate {
    open: bool,
    /// Requests inside now.
    inside: u32,
    /// Tenant `db`'s requests inside now, and the most there ever were.
    db: u32,
    most_db: u32,
}

impl GatedUpstream {
    fn start() -> GatedUpstream {
        use std::io::BufReader;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state: Arc<(std::sync::Mutex<Gate>, std::sync::Condvar)> = Arc::default();
        let st = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let st = st.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut out = stream;
                    while let Some(head) = common::envoy::request_head(&mut reader) {
                        let db = head.iter().any(|l| l.eq_ignore_ascii_case("x-tenant: db"));
                        let (lock, cv) = &*st;
                        let mut g = lock.lock().unwrap();
                        g.inside += 1;
                        g.db += u32::from(db);
                        g.most_db = g.most_db.max(g.db);
                        cv.notify_all();
                        while !g.open {
                            g = cv.wait(g).unwrap();
                        }
                        g.inside -= 1;
                        g.db -= u32::from(db);
                        drop(g);
                        if out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        GatedUpstream { port, state }
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.state.0.lock().unwrap()
    }

    /// Waits until `n` requests are inside.
    fn wait_inside(&self, n: u32) {
        let (lock, cv) = &*self.state;
        let (_g, timeout) =
            cv.wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(30), |g| g.inside < n).unwrap();
        assert!(!timeout.timed_out(), "{n} requests reach the upstream");
    }

    fn open(&self) {
        self.gate().open = true;
        self.state.1.notify_all();
    }
}

/// An in-flight quota through Envoy, with the shipped `in-flight.yaml`: a request holds its
/// tenant's slot from admission until its response has ended, so with `max_in_flight = 1` a
/// second request is refused while the first is still being answered (and the refused ones'
/// releases free nothing); once it ends the slot is free again, request after request, and
/// the upstream never sees two of the tenant's requests at once.
#[test]
fn envoy_holds_a_tenants_slot_from_its_request_to_the_end_of_the_response() {
    let dir = data_dir("envoy-in-flight");
    let s = ServerProc::start_with(&dir.join("data"), &["--tick-ms", "100"], Stdio::null());
    admin(&s.url(), &["group", "create", "db", "--limit", "1000", "--max-in-flight", "1"]);
    let grpc: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let up = GatedUpstream::start();
    let e = envoy(&dir, "in-flight.yaml", grpc, up.port, &[]);
    let listen = e.listen;
    // The first request is admitted and held at the upstream.
    let first = std::thread::spawn(move || request(listen, "/", &[("x-tenant", "db")]).map(|(c, _)| c));
    up.wait_inside(1);
    // Every other request meanwhile is refused: the slot is held, and the refused requests'
    // own releases (if Envoy sends them) free nothing.
    for _ in 0..10 {
        let (code, head) = request(listen, "/", &[("x-tenant", "db")]).unwrap();
        assert_eq!(code, 429, "the slot is held: {head}");
    }
    // Another tenant is not touched.
    let other = std::thread::spawn(move || request(listen, "/", &[("x-tenant", "other")]).map(|(c, _)| c));
    up.wait_inside(2);
    up.open();
    assert_eq!(first.join().unwrap(), Some(200));
    assert_eq!(other.join().unwrap(), Some(200));
    // Once the response has ended, Envoy releases the slot: the tenant is served again, and
    // again after that (a quota of 1 never sticks).
    for i in 0..5 {
        eventually(&format!("request {i} after the first is admitted"), || {
            request(listen, "/", &[("x-tenant", "db")]).is_some_and(|(c, _)| c == 200)
        });
    }
    assert_eq!(up.gate().most_db, 1, "never two of db's requests at the upstream at once");
    assert_eq!(counter(e.admin, "cluster.application.ratelimit.error"), 0, "Tollgate answered every call");
}
