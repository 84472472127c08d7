//! Remote clients against a real `tollgate server`: shared limits, safe mode, recovery.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_client::clock::TokioClock;
use tollgate_client::{AcquireError, RemoteOptions, Tollgate};
use tollgate_core::time::Clock;

mod common;
use common::{BIN, admin, server_command};

fn data_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("remote-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Starts a server on `grpc` (port 0: any free port); returns it and its gRPC URL.
fn server(data: &Path, grpc: &str, lease_ms: u64) -> (Child, String) {
    let mut child = server_command(data, grpc)
        .args(["--lease-ms", &lease_ms.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.split_whitespace().nth(4).expect("listening line").to_string();
    (child, format!("http://{addr}"))
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_remote_clients_hold_a_group_within_5_percent_of_its_limit() {
    let (child, url) = server(&data_dir("fifty"), "127.0.0.1:0", 10_000);
    let _server = Killed(child);
    admin(&url, &["group", "create", "shared", "--limit", "1000"]);

    let admitted = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..50 {
        let opts = RemoteOptions { client_id: Some(format!("client-{i}")), ..RemoteOptions::default() };
        let gate = Tollgate::remote(&url, opts).unwrap();
        let (admitted, counting, stop) = (admitted.clone(), counting.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let group = gate.group("shared").unwrap();
            while !stop.load(Ordering::Relaxed) {
                match group.try_acquire(1.0) {
                    Ok(_) => {
                        if counting.load(Ordering::Relaxed) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(AcquireError::Throttled { retry_after, .. }) => {
                        tokio::time::sleep(retry_after.min(Duration::from_millis(20))).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    // Two seconds to learn the clients, then ten seconds counted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    counting.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await;
    counting.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let total = admitted.load(Ordering::Relaxed) as f64;
    println!("50 remote clients admitted {total} units in 10 s against a limit of 1000/s");
    let expected = 1000.0 * 10.0;
    assert!((total - expected).abs() <= 0.05 * expected, "admitted {total} in 10 s, limit 1000/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_enter_safe_mode_within_a_lease_and_leave_it_when_the_server_returns() {
    let dir = data_dir("safe");
    // Find a free port, so the restarted server can come back on the same address.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let lease = Duration::from_millis(1000);
    let (child, url) = server(&dir, &addr, lease.as_millis() as u64);
    let server1 = Killed(child);
    admin(&url, &["group", "create", "g", "--reserved", "10", "--limit", "100"]);
    let gate = Tollgate::remote(&url, RemoteOptions::default()).unwrap();
    let g = gate.group("g").unwrap();
    // The first grant arrives after one exchange: acquire waits for it.
    let _ = g.acquire(1.0).await.unwrap();
    assert!(gate.remote_status().unwrap().connected);
    assert!(!gate.remote_status().unwrap().safe_mode);

    let clock = TokioClock::new();
    drop(server1); // SIGKILL: no goodbye
    let killed_at = clock.now();
    let mut entered = None;
    while clock.now().since(killed_at) < lease * 4 {
        if gate.remote_status().unwrap().safe_mode {
            entered = Some(clock.now().since(killed_at));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let entered = entered.expect("safe mode within the lease (plus one exchange period)");
    // The lease runs from the last successful exchange (at most 1 s before the kill), and
    // failures are retried within 2 s: safe mode comes within a lease plus one retry.
    assert!(entered <= lease + Duration::from_secs(2), "entered after {entered:?}");
    assert!(gate.remote_status().unwrap().last_error.is_some());
    // Decay: requests are still admitted at a reduced rate.
    let _ = g.acquire(1.0).await.unwrap();

    let (child, url2) = server(&dir, &addr, lease.as_millis() as u64);
    let _server2 = Killed(child);
    assert_eq!(url, url2);
    let back = clock.now();
    while gate.remote_status().unwrap().safe_mode && clock.now().since(back) < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = gate.remote_status().unwrap();
    assert!(!status.safe_mode && status.connected, "{status:?}");
    // The restarted server kept the group's settings.
    let out = Command::new(BIN).args(["group", "show", "g"]).env("TOLLGATE_SERVER", &url).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("limit:    100"));
}
