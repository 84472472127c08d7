//! The high-water marks per group and per client token, as an operator reads them: a real
//! server with `--auth`, a real remote client with a client token, and the status, the
//! command's tables and the metrics.

use std::process::Stdio;

use tollgate_limiter::access::Access;

use crate::common;
use common::{BIN, ServerProc, data_dir, eventually, http};

/// `tollgate ARGS` with `token`: its output, which must be a success.
fn cli(url: &str, token: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("TOLLGATE_SERVER", url)
        .env("TOLLGATE_TOKEN", token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client admits requests of 1, 5, 250 and 3 units and is refused some: the group and the
/// token show 250 as their largest request, the token its units, requests and refusals.
#[test]
fn the_largest_request_and_each_tokens_marks_show_everywhere() {
    let data = data_dir("marks");
    let s = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let admin = std::fs::read_to_string(data.join("admin.token")).unwrap().trim().to_string();
    cli(&s.url(), &admin, &["group", "create", "reports", "--limit", "1000"]);
    let token = cli(&s.url(), &admin, &["token", "create", "--role", "client", "--name", "billing"]);
    let token = token.split_whitespace().last().unwrap().to_string();
    let reader = cli(&s.url(), &admin, &["token", "create", "--role", "reader"]);
    let reader = reader.split_whitespace().last().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let _entered = rt.enter();
    let opts = tollgate_limiter::RemoteOptions {
        client_id: Some("billing-1".into()),
        access: Access { token: Some(token.clone()), ..Access::default() },
        ..Default::default()
    };
    let gate = tollgate_limiter::Tollgate::remote(&s.url(), opts).unwrap();
    let reports = gate.group("reports").unwrap();
    let status = || {
        let auth = format!("Bearer {reader}");
        let (code, _, body) = http(&s.http, "GET", "/status", &[("authorization", &auth)], "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let mut refused = 0u64;
    eventually("the group's and the token's largest request reach the controller", || {
        rt.block_on(async {
            for cost in [1.0, 5.0, 250.0, 3.0] {
                let _ = reports.acquire(cost).await;
            }
        });
        refused += (0..2000).filter(|_| reports.try_acquire(100.0).is_err()).count() as u64;
        let st = status();
        let group = st["groups"].as_array().unwrap().iter().find(|g| g["name"] == "reports").cloned();
        let t = st["tokens"].get(0).cloned().unwrap_or_default();
        group.is_some_and(|g| g["largest_last_minute"].as_f64() >= Some(250.0))
            && t["largest_last_minute"].as_f64() >= Some(250.0)
            && t["throttled_total"].as_u64() > Some(0)
    });
    let st = status();
    let t = &st["tokens"][0];
    let id = t["id"].as_str().unwrap().to_string();
    assert!(t["label"].as_str().unwrap().contains("billing"), "{t}");
    assert!(t["consumed_total"].as_f64().unwrap() >= 259.0, "{t}");
    assert!(t["throttled_total"].as_u64().unwrap() <= refused, "{t}: at most the {refused} refused");
    // A request refused is not admitted: the largest stays the 250 admitted, not a 100 refused.
    assert_eq!(t["largest_last_minute"].as_f64(), Some(250.0), "{t}");
    assert_eq!(st["tokens"].as_array().unwrap().len(), 1, "the reader's calls are no exchanges");
    // `tollgate status` prints both in its diagnostics tables.
    let table = cli(&s.url(), &reader, &["status"]);
    let line =
        |start: &str| table.lines().find(|l| l.starts_with(start) && l.contains("250.0")).map(str::to_string);
    assert!(table.contains("LARGEST/1m") && line("reports").is_some(), "{table}");
    assert!(line(&id).is_some_and(|l| l.ends_with("billing)")), "{table}");
    // And the metrics.
    let auth = format!("Bearer {reader}");
    let (_, _, metrics) = http(&s.http, "GET", "/metrics", &[("authorization", &auth)], "");
    for sample in [
        "tollgate_group_largest_request_1m_units{group=\"reports\"} 250".to_string(),
        format!("tollgate_token_largest_request_1m_units{{token=\"{id}\"}} 250"),
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(&sample)), "{sample} not in the metrics");
    }
    drop(gate);
}
