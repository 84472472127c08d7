//! A remote client against the real `tollgate server` binary over real gRPC on loopback.
//!
//! How remote clients behave over time (limits across fifty clients, safe mode, restarts,
//! learning) is tested in simulated time against the same controller on a simulated network
//! (`crates/client/tests/modes.rs`); this checks the real process and the real transport,
//! without timing anything.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use tollgate_client::{RemoteOptions, Tollgate};

mod common;
use common::{admin, server_command};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_client_is_granted_by_the_real_server_and_reports_to_it() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("remote-real");
    let _ = std::fs::remove_dir_all(&data);
    let mut child =
        server_command(&data, "127.0.0.1:0").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _server = Killed(child);
    let addr = line.split_whitespace().nth(4).expect("listening line").to_string();
    let url = format!("http://{addr}");
    admin(&url, &["group", "create", "g", "--reserved", "10", "--limit", "100"]);

    let opts = RemoteOptions {
        client_id: Some("real-client".into()),
        max_wait: Duration::from_secs(30),
        ..RemoteOptions::default()
    };
    let gate = Tollgate::remote(&url, opts).unwrap();
    let g = gate.group("g").unwrap();
    // The first grant arrives after one exchange: acquire waits for it.
    let permit = g.acquire(1.0).await.unwrap();
    permit.settle(2.0).unwrap();
    let status = gate.remote_status().unwrap();
    assert!(status.connected && !status.safe_mode && status.exchanges >= 1, "{status:?}");
    assert!(g.stats().allowance > 0.0, "{:?}", g.stats());

    // The exchange that brought the grant is already counted, and the client tracked.
    let out = std::process::Command::new(common::BIN)
        .args(["status", "--json"])
        .env("TOLLGATE_SERVER", &url)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("\"clients\":1"), "{status}");
    assert!(status.contains("\"name\":\"g\"") && status.contains("\"priority\":\"medium\""), "{status}");
}
