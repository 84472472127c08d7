//! The behaviour table every Tollgate client replays against the real server
//! (`clients/cases/behaviour.json`), here with the Rust client in remote mode. The Python and
//! Go suites replay the same table, so the three clients agree on what a user sees first:
//! bursts, settlements, dropped work, request classes, shadow mode, quotas, in-flight quotas,
//! unconfigured groups and bad arguments.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tollgate_limiter::{AcquireError, Permit, RemoteOptions, RequestClass, Tollgate};

use crate::common::{ServerProc, http};

fn table() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/cases/behaviour.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let table: Value = serde_json::from_str(&text).unwrap();
    let cases = table["cases"].as_array().unwrap().clone();
    assert!(!cases.is_empty(), "no cases in {}", path.display());
    cases
}

fn class_of(step: &Value) -> RequestClass {
    match step["class"].as_str() {
        None | Some("normal") => RequestClass::Normal,
        Some("critical") => RequestClass::Critical,
        Some("sheddable") => RequestClass::Sheddable,
        Some(other) => panic!("no such class: {other}"),
    }
}

/// What an admission came to, as the table names it.
fn outcome(result: &Result<Permit<'static>, AcquireError>) -> (&'static str, String) {
    match result {
        Ok(_) => ("admitted", String::new()),
        Err(AcquireError::Throttled { .. } | AcquireError::NeverAdmissible { .. }) => {
            ("refused", String::new())
        }
        Err(e @ (AcquireError::InvalidCost(_) | AcquireError::InvalidGroup(_))) => ("invalid", e.to_string()),
        Err(e) => panic!("{e}"),
    }
}

/// Replays one case's steps on `gate` for `group`.
async fn replay(gate: &Tollgate, group: &str, case: &Value) {
    let name = case["name"].as_str().unwrap();
    let handle = gate.group(group).unwrap();
    tokio::time::timeout(Duration::from_secs(30), handle.wait_for_grant())
        .await
        .unwrap_or_else(|_| panic!("{name}: no first grant"));
    let mut permits: HashMap<usize, Permit<'static>> = HashMap::new();
    for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
        let index = |verb: &str| step[verb].as_u64().map(|n| usize::try_from(n).unwrap());
        if let Some(n) = index("settle") {
            permits.remove(&n).unwrap().settle(step["actual"].as_f64().unwrap()).unwrap();
            continue;
        }
        if let Some(n) = index("drop") {
            permits.remove(&n).unwrap().dropped();
            continue;
        }
        if let Some(n) = index("release") {
            drop(permits.remove(&n).unwrap());
            continue;
        }
        let target = step["group"].as_str().unwrap_or(group);
        let class = class_of(step);
        if let Some(n) = step["repeat"].as_u64() {
            let cost = step["try"].as_f64().unwrap();
            let admitted = (0..n).filter(|_| gate.try_acquire_class(target, cost, class).is_ok()).count();
            assert_eq!(admitted as u64, step["admitted"].as_u64().unwrap(), "{name}, step {i}");
            continue;
        }
        let result = if let Some(cost) = step["acquire"].as_f64() {
            gate.acquire(target, cost).await
        } else {
            gate.try_acquire_class(target, step["try"].as_f64().unwrap(), class).map(Permit::into_owned)
        };
        let (got, message) = outcome(&result);
        assert_eq!(got, step["expect"].as_str().unwrap(), "{name}, step {i}: {message}");
        if got == "invalid" {
            let field = step["field"].as_str().unwrap();
            assert!(message.contains(field), "{name}, step {i}: {message:?} does not name {field}");
        }
        if let Ok(permit) = result {
            permits.insert(i, permit);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_behaves_as_the_shared_table_says() {
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("behaviour-cases");
    let _ = std::fs::remove_dir_all(&data);
    let server = ServerProc::start_with(&data, &["--tick-ms", "100", "--lease-ms", "1000"], Stdio::null());
    for (index, case) in table().iter().enumerate() {
        let group = format!("case-{index}");
        if let Some(settings) = case.get("settings") {
            let (code, _, body) =
                http(&server.http, "PUT", &format!("/v1/groups/{group}"), &[], &settings.to_string());
            assert!(code == 200 || code == 201, "PUT {group}: {code} {body}");
        }
        let options = RemoteOptions {
            client_id: Some(format!("rust-case-{index}")),
            max_wait: Duration::from_secs(30),
            ..RemoteOptions::default()
        };
        let gate = Tollgate::remote(&format!("http://{}", server.grpc), options).unwrap();
        replay(&gate, &group, case).await;
        gate.shutdown().await;
    }
}
