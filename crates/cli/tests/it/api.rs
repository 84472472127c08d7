//! The HTTP JSON API under `/v1/` on the real server, as a program in any language would use
//! it: groups, node settings, status, checks, errors naming the field and the rule, and an
//! OpenAPI document that matches the routes served.

use std::process::Stdio;

use serde_json::Value;

use crate::common;
use common::{ServerProc, data_dir};

/// One request: the status, the head (lower case) and the body as JSON (`Null` if none).
fn call(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String, Value) {
    let (code, head, body) = common::http(addr, method, path, &[], body.unwrap_or(""));
    (code, head, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A budget per period and quotas per window over JSON: set, changed, removed, and refused
/// by the field that breaks a rule.
fn budgets_and_quotas(h: &str) {
    let (code, _, v) =
        call(h, "PUT", "/v1/groups/budgeted", Some(r#"{"budget":100,"budget_period":"month"}"#));
    assert_eq!((code, v["settings"]["budget_period"].as_str()), (201, Some("month")), "{v}");
    let (code, _, v) = call(h, "PATCH", "/v1/groups/budgeted", Some(r#"{"budget_period":"year"}"#));
    assert_eq!((code, v["field"].as_str()), (400, Some("budget_period")), "{v}");
    assert!(v["rule"].as_str().unwrap().contains("must be total, minute, hour, day, week or month"), "{v}");
    // Quotas per window beside the budget: the budget is the month's, among them.
    let (code, _, v) =
        call(h, "PATCH", "/v1/groups/budgeted", Some(r#"{"quotas":{"minute":10,"hour":200}}"#));
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v["settings"]["quotas"],
        serde_json::json!({"minute": 10.0, "hour": 200.0, "month": 100.0}),
        "{v}"
    );
    let (code, _, v) = call(h, "PATCH", "/v1/groups/budgeted", Some(r#"{"quotas":{"minute":null}}"#));
    assert_eq!(
        (code, &v["settings"]["quotas"]),
        (200, &serde_json::json!({"hour": 200.0, "month": 100.0})),
        "{v}"
    );
    // Windows of seconds, by name, beside the named ones: shown as they were set.
    let seconds = r#"{"quotas":{"seconds":{"90s":5,"60s-from-first":7}}}"#;
    let (code, _, v) = call(h, "PATCH", "/v1/groups/budgeted", Some(seconds));
    let seconds = serde_json::json!({"90s": 5.0, "60s-from-first": 7.0});
    let all = serde_json::json!({"hour": 200.0, "month": 100.0, "seconds": seconds});
    assert_eq!((code, &v["settings"]["quotas"]), (200, &all), "{v}");
    let (code, _, v) =
        call(h, "PATCH", "/v1/groups/budgeted", Some(r#"{"quotas":{"seconds":{"90s":null}}}"#));
    let left = serde_json::json!({"hour": 200.0, "month": 100.0, "seconds": {"60s-from-first": 7.0}});
    assert_eq!((code, &v["settings"]["quotas"]), (200, &left), "{v}");
    for (bad, field) in [
        (r#"{"quotas":{"minute":-1}}"#, "quotas.minute"),
        (r#"{"quotas":{"fortnight":1}}"#, "quotas.fortnight"),
        (r#"{"quotas":{"seconds":{"minute":1}}}"#, "quotas.seconds"),
        (r#"{"quotas":{"seconds":{"0s":1}}}"#, "quotas.seconds"),
        (r#"{"quotas":{"seconds":{"90s":"many"}}}"#, "quotas.seconds"),
    ] {
        let (code, _, v) = call(h, "PATCH", "/v1/groups/budgeted", Some(bad));
        assert_eq!((code, v["field"].as_str()), (400, Some(field)), "{bad}: {v}");
    }
    let (code, _, v) = call(h, "PUT", "/v1/groups/unbudgeted", Some(r#"{"budget_period":"day"}"#));
    assert_eq!((code, v["field"].as_str()), (400, Some("budget_period")), "{v}");
    let (code, _, _) = call(h, "DELETE", "/v1/groups/budgeted", None);
    assert_eq!(code, 200);
}

#[test]
fn groups_node_status_and_checks_over_json() {
    let s = ServerProc::start_with(&data_dir("api"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    let (code, _, v) = call(h, "POST", "/v1/groups", Some(r#"{"name":"acme","limit":5,"priority":"high"}"#));
    assert_eq!(code, 201, "{v}");
    assert_eq!((v["name"].as_str(), v["settings"]["limit"].as_f64()), (Some("acme"), Some(5.0)));
    assert_eq!(v["settings"]["priority"], "high");
    let (code, _, v) =
        call(h, "PATCH", "/v1/groups/acme", Some(r#"{"burst":10,"ramp":null,"dropped":"count"}"#));
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (v["settings"]["burst"].as_f64(), v["settings"]["dropped"].as_str()),
        (Some(10.0), Some("count"))
    );
    // A PUT that creates answers 201, one that changes 200.
    let (code, _, v) = call(h, "PUT", "/v1/groups/beta", Some(r#"{"limit":"unlimited","reserved":20}"#));
    assert_eq!(code, 201, "{v}");
    let (code, _, v) = call(h, "PUT", "/v1/groups/beta", Some(r#"{"reserved":20}"#));
    assert_eq!(code, 200, "{v}");
    assert!(v["settings"]["limit"].is_null());
    let (_, _, v) = call(h, "GET", "/v1/groups", None);
    let names: Vec<&str> =
        v["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(names, ["acme", "beta"]);
    let (code, _, v) = call(h, "GET", "/v1/groups/acme", None);
    assert_eq!((code, v["settings"]["burst"].as_f64()), (200, Some(10.0)));
    // Errors: the field and the rule, and nothing changes.
    for (method, path, body, status, field, rule) in [
        ("POST", "/v1/groups", r#"{"name":"acme"}"#, 409, "name", "already exists"),
        ("PATCH", "/v1/groups/ghost", "{}", 404, "name", "does not exist"),
        (
            "PATCH",
            "/v1/groups/acme",
            r#"{"weight":"heavy"}"#,
            400,
            "weight",
            "must be a finite number, got a string",
        ),
        ("PATCH", "/v1/groups/acme", r#"{"reserved":50}"#, 400, "reserved", "must not exceed limit (50 > 5)"),
        ("PATCH", "/v1/groups/acme", r#"{"colour":"red"}"#, 400, "colour", "unknown field"),
        (
            "PATCH",
            "/v1/groups/acme",
            r#"{"ramp":{"mode":"fast"}}"#,
            400,
            "ramp.mode",
            "must be scheduled, relaxed",
        ),
        ("PATCH", "/v1/groups/acme", "[1]", 400, "body", "must be a JSON object, got an array"),
        ("PATCH", "/v1/groups/acme", "not json", 400, "body", "not JSON"),
        ("POST", "/v1/groups", r#"{"limit":5}"#, 400, "name", "missing"),
        ("PATCH", "/v1/node", r#"{"mode":"fastest"}"#, 400, "mode", "must be share or fcfs, got \"fastest\""),
        ("POST", "/v1/check", r#"{"cost":1}"#, 400, "group", "missing"),
        ("POST", "/v1/check", r#"{"group":"acme","cost":-1}"#, 400, "cost", "must be from 0"),
        ("POST", "/v1/check", r#"{"group":"acme","cost":"one"}"#, 400, "cost", "must be a finite number"),
        ("DELETE", "/v1/groups/ghost", "", 404, "name", "does not exist"),
        ("DELETE", "/v1/groups/ghost?if_exists=maybe", "", 400, "if_exists", "expected if_exists"),
    ] {
        let (code, _, v) = call(h, method, path, Some(body));
        assert_eq!(code, status, "{method} {path} {body}: {v}");
        assert_eq!(v["field"], field, "{method} {path} {body}: {v}");
        assert!(v["rule"].as_str().unwrap_or("").contains(rule), "{method} {path} {body}: {v}");
        assert!(v["error"].as_str().is_some(), "{v}");
    }
    budgets_and_quotas(h);
    let big = format!(r#"{{"name":"{}"}}"#, "x".repeat(100 * 1024));
    let (code, _, _) = call(h, "POST", "/v1/groups", Some(&big));
    assert_eq!(code, 413, "an oversized body is refused");
    let (_, _, v) = call(h, "GET", "/v1/groups/acme", None);
    assert_eq!(
        (v["settings"]["reserved"].as_f64(), v["settings"]["weight"].as_f64()),
        (Some(0.0), Some(1.0))
    );
    // Node settings.
    let (code, _, v) = call(h, "PATCH", "/v1/node", Some(r#"{"capacity":1000,"mode":"fcfs"}"#));
    assert_eq!((code, v["capacity"].as_f64(), v["mode"].as_str()), (200, Some(1000.0), Some("fcfs")));
    let (_, _, v) = call(h, "GET", "/v1/node", None);
    assert_eq!(v["mode"], "fcfs");
    // Checks: `slow` holds a burst of 10 and refills one unit every 100 s, so the eleventh is
    // refused with a retry-after, however long the calls take.
    let (code, _, v) = call(h, "PUT", "/v1/groups/slow", Some(r#"{"limit":0.01,"burst":10}"#));
    assert_eq!(code, 201, "{v}");
    let mut codes = Vec::new();
    for _ in 0..12 {
        codes.push(call(h, "POST", "/v1/check", Some(r#"{"group":"slow","cost":1}"#)).0);
    }
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 10, "{codes:?}");
    let (code, head, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"slow"}"#));
    assert_eq!((code, v["admitted"].as_bool()), (429, Some(false)), "{v}");
    let ms = v["retry_after_ms"].as_u64().filter(|ms| *ms > 0).unwrap_or_else(|| panic!("{v}"));
    // The header says the same, rounded up to whole seconds.
    let header: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .unwrap_or_else(|| panic!("{head}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(header, ms.div_ceil(1000), "{head} {v}");
    let (code, _, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"beta","cost":3}"#));
    assert_eq!((code, v["admitted"].as_bool()), (200, Some(true)), "{v}");
    // The check's client is a client of the controller like any other: status shows it.
    let (code, _, v) = call(h, "GET", "/v1/status", None);
    assert_eq!(code, 200);
    assert!(v["groups"].as_array().unwrap().iter().any(|g| g["name"] == "acme"), "{v}");
    // Drop.
    let (code, _, _) = call(h, "DELETE", "/v1/groups/beta", None);
    assert_eq!(code, 200);
    let (code, _, v) = call(h, "DELETE", "/v1/groups/beta?if_exists=true", None);
    assert_eq!((code, &v["dropped"]), (200, &Value::Null));
}

/// Regression: with a node capacity, a new group's first checks were refused (429) until the
/// controller's next tick: the last tick had shared the whole capacity out. Fifty new groups
/// checked back to back beside a group the last tick gave all of it are each admitted, and
/// their grants stay within the room under the capacity.
#[test]
fn new_groups_are_admitted_at_once_under_a_capacity() {
    let s = ServerProc::start_with(&data_dir("api-new-groups"), &[], Stdio::null());
    let h = &s.http;
    let (code, _, v) = call(h, "PATCH", "/v1/node", Some(r#"{"capacity":1000}"#));
    assert_eq!(code, 200, "{v}");
    common::eventually("a tick gives the steady group the capacity", || {
        assert_eq!(call(h, "POST", "/v1/check", Some(r#"{"group":"steady"}"#)).0, 200);
        let (_, _, v) = call(h, "GET", "/v1/status", None);
        v["groups"].as_array().unwrap().iter().any(|g| g["name"] == "steady" && g["target"].is_number())
    });
    let mut refused = Vec::new();
    for i in 0..50 {
        let body = format!(r#"{{"group":"new-{i}"}}"#);
        let (code, _, v) = call(h, "POST", "/v1/check", Some(&body));
        if code != 200 {
            refused.push((i, code, v));
        }
    }
    assert!(refused.is_empty(), "every new group admitted at once: {refused:?}");
}

#[test]
fn the_openapi_document_lists_exactly_the_routes_served() {
    let s = ServerProc::start_with(&data_dir("api-openapi"), &[], Stdio::null());
    let h = s.http.as_str();
    let (code, _, doc) = call(h, "GET", "/v1/openapi.json", None);
    assert_eq!(code, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 8, "{doc}");
    let methods = ["get", "post", "put", "patch", "delete"];
    for (path, ops) in paths {
        let concrete = path.replace("{name}", "doc-probe");
        for m in methods {
            let body = if m == "get" || m == "delete" { None } else { Some("{}") };
            let (code, _, v) = call(h, &m.to_uppercase(), &concrete, body);
            if ops.get(m).is_some() {
                // Served: any answer but "no such route" (a 404 for a missing group is JSON).
                assert_ne!(code, 405, "{m} {path} is documented but not served");
                assert!(code != 404 || v["error"].is_string(), "{m} {path} is documented but not served");
            } else {
                assert_eq!(code, 405, "{m} {path} is served but not documented ({code} {v})");
            }
        }
    }
    // Nothing under /v1/ is served that the document leaves out.
    for path in ["/v1/nodes", "/v1/group", "/v1/checks", "/v1/tokens"] {
        assert_eq!(call(h, "GET", path, None).0, 404, "{path}");
    }
}

fn usage(url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(common::BIN)
        .arg("usage")
        .args(args)
        .env("TOLLGATE_SERVER", url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Regression: a group served by the `default` group's settings was never metered (`tollgate
/// usage` stayed empty after traffic to it), and what the check's client had counted since its
/// last exchange was lost at a clean stop. Flushes here happen only at the stop.
#[test]
fn every_group_in_traffic_is_metered_and_a_clean_stop_flushes_it() {
    let data = data_dir("api-usage-walk-in");
    let s = ServerProc::start_with(&data, &["--flush-ms", "60000"], Stdio::null());
    for _ in 0..5 {
        let (code, _, v) = call(&s.http, "POST", "/v1/check", Some(r#"{"group":"walk-in","cost":2}"#));
        assert_eq!(code, 200, "{v}");
    }
    assert!(s.terminate().success());
    let s = ServerProc::start_with(&data, &[], Stdio::null());
    let text = usage(&s.url(), &[]);
    assert!(text.contains("walk-in  consumed 10  admitted 5  refused 0"), "{text}");
}

#[test]
fn consumption_is_metered_by_the_minute_and_survives_a_restart() {
    let data = data_dir("api-usage");
    let s = ServerProc::start_with(&data, &["--tick-ms", "100", "--flush-ms", "100"], Stdio::null());
    let (code, _, v) = call(&s.http, "PUT", "/v1/groups/metered", Some(r#"{"limit":1000}"#));
    assert_eq!(code, 201, "{v}");
    let mut admitted = 0u32;
    while admitted < 25 {
        let (code, _, _) = call(&s.http, "POST", "/v1/check", Some(r#"{"group":"metered","cost":2}"#));
        admitted += u32::from(code == 200);
    }
    // The check client reports its consumption at its next exchange; the controller writes it
    // at its next flush.
    common::eventually("50 units metered", || {
        let rows: Value = serde_json::from_str(&usage(&s.url(), &["metered", "--json"])).unwrap();
        rows.as_array().unwrap().iter().map(|v| v["consumed"].as_f64().unwrap_or(0.0)).sum::<f64>() == 50.0
    });
    let text = usage(&s.url(), &[]);
    assert!(text.contains("metered  consumed 50  admitted 25  refused 0"), "{text}");
    let csv = usage(&s.url(), &["--csv", "--since", "1h"]);
    assert!(csv.starts_with("minute,group,consumed,admitted,throttled,would_refuse\n"), "{csv}");
    assert!(csv.lines().skip(1).all(|l| l.contains(",metered,")), "{csv}");
    // A span that starts after the consumption: nothing in it.
    let later = (tollgate_controller::wall_ms() + 120_000).to_string();
    assert!(usage(&s.url(), &["--since", &later]).contains("no consumption recorded"));
    // As JSON: an empty array, valid JSON.
    let none: Value = serde_json::from_str(&usage(&s.url(), &["--since", &later, "--json"])).unwrap();
    assert_eq!(none, serde_json::json!([]));
    // Durable: the same after a restart.
    assert!(s.terminate().success());
    let s = ServerProc::start_with(&data, &[], Stdio::null());
    let text = usage(&s.url(), &["metered"]);
    assert!(text.contains("metered  consumed 50  admitted 25"), "{text}");
}

/// Checks `names` new groups (`churn-{round}-{i}`) over four connections at once: those refused.
fn check_new_names(h: &str, round: usize, names: usize) -> Vec<(usize, u16, Value)> {
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let h = h.to_string();
            std::thread::spawn(move || {
                let mut refused = Vec::new();
                for i in (w..names).step_by(4) {
                    let body = format!(r#"{{"group":"churn-{round}-{i}"}}"#);
                    let (code, _, v) = call(&h, "POST", "/v1/check", Some(&body));
                    if code != 200 {
                        refused.push((i, code, v));
                    }
                }
                refused
            })
        })
        .collect();
    workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
}

/// Tenant churn never starves a group in traffic. Past a thousand groups the client behind
/// `/v1/check` (and Envoy's rate-limit service) reports them over several exchanges, and
/// reports new ones alone as they come; before, one exchange carried every group, the server
/// refused it past a thousand, and the client fell into safe mode, refusing everyone. Here
/// 1,500 then 20,000 new names arrive through `/v1/check` while a steady group asks 50 times a
/// second under a limit of 100: it keeps at least 98 % of its asks in every 5-second window,
/// every new name is admitted, and the client never enters safe mode.
#[test]
fn tenant_churn_through_check_never_starves_a_steady_group() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let dir = data_dir("api-churn");
    std::fs::create_dir_all(&dir).unwrap();
    let log_path = dir.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let s = ServerProc::start_with(&dir, &["--tick-ms", "250"], Stdio::from(log));
    let h = s.http.clone();
    assert!(call(&h, "PUT", "/v1/groups/steady", Some(r#"{"limit":100}"#)).0 < 300);
    common::eventually("the steady group is admitted", || {
        call(&h, "POST", "/v1/check", Some(r#"{"group":"steady"}"#)).0 == 200
    });
    let stop = Arc::new(AtomicBool::new(false));
    let steady = {
        let (h, stop) = (h.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut asks: Vec<bool> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                asks.push(call(&h, "POST", "/v1/check", Some(r#"{"group":"steady"}"#)).0 == 200);
                // About 50 a second (a little less, for the time the answer takes).
                std::thread::sleep(Duration::from_millis(20));
            }
            asks
        })
    };
    for (round, names) in [(0, 1_500), (1, 20_000)] {
        let refused = check_new_names(&h, round, names);
        assert!(
            refused.is_empty(),
            "{} of {names} new names refused: {:?}",
            refused.len(),
            &refused[..3.min(refused.len())]
        );
    }
    // Two more ticks' worth of the steady group after the last name.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let asks = steady.join().unwrap();
    // Windows of 250 asks: 5 seconds at the pace asked.
    for (window, within) in asks.chunks(250).enumerate() {
        let admitted = within.iter().filter(|&&a| a).count();
        assert!(
            admitted * 100 >= within.len() * 98,
            "window {window}: the steady group admitted {admitted} of {} asks",
            within.len()
        );
    }
    let (_, _, metrics) = common::http(&h, "GET", "/metrics", &[], "");
    assert!(metrics.contains("tollgate_front_end_safe_mode 0\n"), "{metrics}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("safe mode"), "the front end's client entered safe mode:\n{log}");
}

/// Every group's name, read two a page.
fn group_names_two_a_page(h: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut path = "/v1/groups?limit=2".to_string();
    loop {
        let (code, _, v) = call(h, "GET", &path, None);
        assert_eq!(code, 200, "{v}");
        let page = v["groups"].as_array().unwrap();
        assert!(page.len() <= 2, "{v}");
        seen.extend(page.iter().map(|g| g["name"].as_str().unwrap().to_string()));
        match v["next_page_token"].as_str() {
            Some(t) => path = format!("/v1/groups?limit=2&page_token={t}"),
            None => return seen,
        }
    }
}

/// A 405 says which methods the path takes, in the header and in the sentence.
fn methods_not_taken_are_named(h: &str) {
    for (method, path, allow) in [
        ("DELETE", "/v1/node", "GET,HEAD,PATCH"),
        ("DELETE", "/v1/check", "POST"),
        ("PUT", "/metrics", "GET,HEAD"),
        ("POST", "/v1/groups/acme", "GET,HEAD,PUT,PATCH,DELETE"),
    ] {
        let (code, head, v) = call(h, method, path, None);
        assert_eq!((code, v["field"].as_str()), (405, Some("method")), "{v}");
        assert!(
            head.lines().any(|l| l.trim() == format!("allow: {}", allow.to_lowercase())),
            "{method} {path}: {head}"
        );
        assert_eq!(v["detail"], format!("{path} does not take {method}; it takes {allow}"), "{v}");
    }
}

/// Conventions a generated client relies on: lists page with an opaque token, errors are
/// problem details (404 and 405 too), checks carry the IETF rate-limit headers, and the
/// document asks for a token only when the server does.
#[test]
fn pages_problems_rate_limit_headers_and_security() {
    let s = ServerProc::start_with(&data_dir("api-conventions"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    for i in 0..5 {
        let (code, _, v) = call(h, "PUT", &format!("/v1/groups/page-{i}"), Some(r#"{"limit":100}"#));
        assert_eq!(code, 201, "{v}");
    }
    assert_eq!(group_names_two_a_page(h), (0..5).map(|i| format!("page-{i}")).collect::<Vec<_>>());
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("page_token=page-1", "page_token"),
        ("colour=red", "colour"),
    ] {
        let (code, head, v) = call(h, "GET", &format!("/v1/groups?{query}"), None);
        assert_eq!((code, v["field"].as_str()), (400, Some(field)), "{query}: {v}");
        assert!(head.contains("content-type: application/problem+json"), "{head}");
        assert_eq!(v["status"], 400);
    }
    let (code, _, v) = call(h, "GET", "/v1/nosuch", None);
    assert_eq!(
        (code, v["type"].as_str(), v["field"].as_str()),
        (404, Some("about:blank"), Some("path")),
        "{v}"
    );
    methods_not_taken_are_named(h);
    // The rate-limit headers, admitted and refused.
    let (code, _, _) = call(h, "PUT", "/v1/groups/headers", Some(r#"{"limit":0.01,"burst":2}"#));
    assert_eq!(code, 201);
    let mut heads = Vec::new();
    for _ in 0..3 {
        let (code, head, _) = call(h, "POST", "/v1/check", Some(r#"{"group":"headers"}"#));
        heads.push((code, head));
    }
    assert_eq!(heads.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [200, 200, 429]);
    for (_, head) in &heads {
        assert!(head.contains("ratelimit-policy: \"grant\";"), "{head}");
        assert!(head.contains("ratelimit: \"grant\";r="), "{head}");
    }
    assert!(heads[2].1.contains(";r=0;t="), "{}", heads[2].1);
    let (_, _, doc) = call(h, "GET", "/v1/openapi.json", None);
    assert!(doc.get("security").is_none(), "no token asked of a server without --auth");
    let data = data_dir("api-conventions-auth");
    let secured = ServerProc::start_with(&data, &["--auth"], Stdio::null());
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap();
    let auth = format!("Bearer {}", token.trim());
    let (code, _, body) =
        common::http(&secured.http, "GET", "/v1/openapi.json", &[("authorization", &auth)], "");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((code, &doc["security"][0]["bearer"]), (200, &serde_json::json!([])), "{doc}");
}

/// A check may carry a request class; a group may carry an in-flight quota, set, refused and
/// cleared by field.
#[test]
fn checks_carry_a_request_class() {
    let s = ServerProc::start_with(&data_dir("api-classes"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    // A burst of 10 and almost no refill; a fifth of it kept for critical work.
    let body = r#"{"name":"tiered","limit":0.01,"burst":10,"critical_reserve":0.2}"#;
    let (code, _, v) = call(h, "POST", "/v1/groups", Some(body));
    assert_eq!((code, v["settings"]["critical_reserve"].as_f64()), (201, Some(0.2)), "{v}");
    let admitted = |class: &str| {
        let body = format!(r#"{{"group":"tiered","class":"{class}"}}"#);
        (0..20).filter(|_| call(h, "POST", "/v1/check", Some(&body)).0 == 200).count()
    };
    // Sheddable work leaves 6 of the 10, normal work 2, critical work none.
    assert_eq!([admitted("sheddable"), admitted("normal"), admitted("critical")], [4, 4, 2]);
    let (code, _, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"tiered","class":"urgent"}"#));
    assert_eq!((code, v["field"].as_str()), (400, Some("class")), "{v}");
    let (code, _, v) = call(h, "PATCH", "/v1/groups/tiered", Some(r#"{"critical_reserve":0.95}"#));
    assert_eq!((code, v["field"].as_str()), (400, Some("critical_reserve")), "{v}");
    // An in-flight quota: set, refused out of range (nothing changes), cleared by null.
    let (code, _, v) = call(h, "PATCH", "/v1/groups/tiered", Some(r#"{"max_in_flight":4}"#));
    assert_eq!((code, v["settings"]["max_in_flight"].as_u64()), (200, Some(4)), "{v}");
    for bad in ["0", "1000001", "-1", "2.5"] {
        let body = format!(r#"{{"max_in_flight":{bad}}}"#);
        let (code, _, v) = call(h, "PATCH", "/v1/groups/tiered", Some(&body));
        assert_eq!((code, v["field"].as_str()), (400, Some("max_in_flight")), "{bad}: {v}");
    }
    let (_, _, v) = call(h, "GET", "/v1/groups/tiered", None);
    assert_eq!(v["settings"]["max_in_flight"].as_u64(), Some(4), "{v}");
    let (code, _, v) = call(h, "PATCH", "/v1/groups/tiered", Some(r#"{"max_in_flight":null}"#));
    assert_eq!((code, &v["settings"]["max_in_flight"]), (200, &Value::Null), "{v}");
}

/// Groups nest under parents; every nesting rule broken is refused by field, nothing stored.
#[test]
fn groups_nest_under_parents_and_broken_nestings_are_refused() {
    let s = ServerProc::start_with(&data_dir("api-nesting"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    for body in [
        r#"{"name":"acme","limit":100,"reserved":40}"#,
        r#"{"name":"acme/search","parent":"acme"}"#,
        r#"{"name":"acme/batch","parent":"acme","reserved":30}"#,
    ] {
        let (code, _, v) = call(h, "POST", "/v1/groups", Some(body));
        assert_eq!(code, 201, "{body}: {v}");
    }
    let (_, _, v) = call(h, "GET", "/v1/groups/acme%2Fbatch", None);
    assert_eq!(v["settings"]["parent"].as_str(), Some("acme"), "{v}");
    let refused = |method: &str, path: &str, body: Option<&str>, field: &str, says: &str| {
        let (code, _, v) = call(h, method, path, body);
        assert_eq!((code, v["field"].as_str()), (400, Some(field)), "{body:?}: {v}");
        assert!(
            v["message"].as_str().unwrap_or_default().contains(says) || v.to_string().contains(says),
            "{v}"
        );
    };
    refused("POST", "/v1/groups", Some(r#"{"name":"lost","parent":"nowhere"}"#), "parent", "no group named");
    refused("PATCH", "/v1/groups/acme", Some(r#"{"parent":"acme/search"}"#), "parent", "makes a cycle");
    refused("PATCH", "/v1/groups/acme", Some(r#"{"parent":"acme"}"#), "parent", "its own parent");
    // Children reserving more than their parent: 30 and 20 of 40.
    refused(
        "PATCH",
        "/v1/groups/acme%2Fsearch",
        Some(r#"{"reserved":20}"#),
        "reserved",
        "more than its own 40",
    );
    refused("PATCH", "/v1/groups/acme", Some(r#"{"reserved":10}"#), "reserved", "more than its own 10");
    refused("DELETE", "/v1/groups/acme", None, "name", "is the parent of");
    // Nine levels deep is one too many.
    let mut parent = "acme/search".to_string();
    for level in 3..=8 {
        let name = format!("{parent}/{level}");
        let body = format!(r#"{{"name":"{name}","parent":"{parent}"}}"#);
        assert_eq!(call(h, "POST", "/v1/groups", Some(&body)).0, 201, "{body}");
        parent = name;
    }
    let body = format!(r#"{{"name":"{parent}/9","parent":"{parent}"}}"#);
    refused("POST", "/v1/groups", Some(&body), "parent", "nests deeper than 8 levels");
    // Nothing refused was stored; a child set free may go.
    let (_, _, v) = call(h, "GET", "/v1/groups/acme", None);
    assert_eq!(
        (v["settings"]["reserved"].as_f64(), &v["settings"]["parent"]),
        (Some(40.0), &Value::Null),
        "{v}"
    );
    let (code, _, v) = call(h, "PATCH", "/v1/groups/acme%2Fbatch", Some(r#"{"parent":null}"#));
    assert_eq!((code, &v["settings"]["parent"]), (200, &Value::Null), "{v}");
}

/// Work charged after it is done: never refused, into debt when the group has no more (later
/// checks wait for it), and refunds give units back within the burst.
#[test]
fn charges_go_into_debt_and_refunds_give_units_back() {
    let s = ServerProc::start_with(&data_dir("api-charge"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    // One unit per 100 s after a burst of 10: what is charged does not depend on speed. A debt
    // is paid back at once (blocking), not over a period.
    let (code, _, v) =
        call(h, "POST", "/v1/groups", Some(r#"{"name":"llm","limit":0.01,"burst":10,"debt_repay_s":0}"#));
    assert_eq!(code, 201, "{v}");
    let (code, _, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"llm","cost":1}"#));
    assert_eq!(code, 200, "{v}");
    // One charge takes at most what the group repays in a minute, or its burst: 10 here.
    let (code, _, v) = call(h, "POST", "/v1/charge", Some(r#"{"group":"llm","units":11}"#));
    assert_eq!((code, v["field"].as_str()), (400, Some("units")), "{v}");
    assert!(v["rule"].as_str().unwrap().starts_with("at most 10 for group \"llm\""), "{v}");
    let (code, _, v) = call(h, "POST", "/v1/charge", Some(r#"{"group":"llm","units":10}"#));
    assert_eq!((code, v["charged"].as_f64()), (200, Some(10.0)), "{v}");
    assert!(v["remaining"].as_f64().unwrap() <= -1.0, "{v}");
    let (code, _, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"llm","cost":1}"#));
    assert_eq!(code, 429, "in debt: {v}");
    // Refunds: never past the burst.
    let (code, _, v) = call(h, "POST", "/v1/charge", Some(r#"{"group":"llm","units":1000,"refund":true}"#));
    assert_eq!((code, v["charged"].as_f64()), (200, Some(-1000.0)), "{v}");
    assert!(v["remaining"].as_f64().unwrap() <= 10.0, "{v}");
    let (code, _, v) = call(h, "POST", "/v1/check", Some(r#"{"group":"llm","cost":1}"#));
    assert_eq!(code, 200, "{v}");
    // Bad input names the field.
    for (body, field) in [
        (r#"{"group":"llm","units":-1}"#, "units"),
        (r#"{"group":"llm"}"#, "units"),
        (r#"{"group":"llm","units":1,"refnud":true}"#, "refnud"),
        (r#"{"group":"","units":1}"#, "group"),
    ] {
        let (code, _, v) = call(h, "POST", "/v1/charge", Some(body));
        assert_eq!((code, v["field"].as_str()), (400, Some(field)), "{body}: {v}");
    }
}

/// An in-flight quota over HTTP: `POST /v1/acquire` hands out a permit that holds one of the
/// group's slots until `POST /v1/release` (settling the real cost) or until its lease runs
/// out; a quota of 1 admits one at a time, a new group's first acquire is admitted at once,
/// and the slot never sticks.
#[test]
fn permits_hold_an_in_flight_slot_until_released_or_their_lease_ends() {
    let s = ServerProc::start_with(&data_dir("api-permits"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    let (code, _, v) = call(h, "PUT", "/v1/groups/db", Some(r#"{"limit":1000,"max_in_flight":1}"#));
    assert_eq!(code, 201, "{v}");
    let acquire = |body: &str| call(h, "POST", "/v1/acquire", Some(body));
    let (code, _, first) = acquire(r#"{"group":"db","cost":2}"#);
    assert_eq!(code, 200, "a new group's first acquire is admitted at once: {first}");
    assert_eq!((first["admitted"].as_bool(), first["lease_s"].as_f64()), (Some(true), Some(60.0)));
    let permit = first["permit"].as_str().unwrap().to_string();
    assert!(permit.starts_with('p') && permit.len() == 33, "{permit}");
    // While it is held, neither an acquire nor a check is admitted.
    let (code, head, v) = acquire(r#"{"group":"db"}"#);
    assert_eq!(code, 429, "{v}");
    assert!(head.contains("retry-after: "), "{head}");
    assert_eq!(call(h, "POST", "/v1/check", Some(r#"{"group":"db"}"#)).0, 429);
    // A renewal keeps it; released with the real cost, the slot is free.
    let (code, _, v) =
        call(h, "POST", "/v1/renew", Some(&format!(r#"{{"permit":"{permit}","lease_s":120}}"#)));
    assert_eq!((code, v["lease_s"].as_f64(), v["group"].as_str()), (200, Some(120.0), Some("db")), "{v}");
    let (code, _, v) = call(h, "POST", "/v1/release", Some(&format!(r#"{{"permit":"{permit}","cost":5}}"#)));
    assert_eq!((code, v["cost"].as_f64()), (200, Some(5.0)), "{v}");
    // Released once: again is 404, and so is a renewal.
    let (code, _, v) = call(h, "POST", "/v1/release", Some(&format!(r#"{{"permit":"{permit}"}}"#)));
    assert_eq!((code, v["field"].as_str()), (404, Some("permit")), "{v}");
    assert_eq!(call(h, "POST", "/v1/renew", Some(&format!(r#"{{"permit":"{permit}"}}"#))).0, 404);
    // One at a time, over and over: the quota of 1 never sticks.
    for i in 0..20 {
        let (code, _, v) = acquire(r#"{"group":"db"}"#);
        assert_eq!(code, 200, "acquire {i}: {v}");
        let p = v["permit"].as_str().unwrap();
        assert_eq!(acquire(r#"{"group":"db"}"#).0, 429, "acquire {i} holds the slot");
        assert_eq!(call(h, "POST", "/v1/release", Some(&format!(r#"{{"permit":"{p}"}}"#))).0, 200);
    }
    // A caller that dies holding a permit: its slot comes back when the lease runs out.
    let (code, _, v) = acquire(r#"{"group":"db","lease_s":1}"#);
    assert_eq!(code, 200, "{v}");
    let lost = v["permit"].as_str().unwrap().to_string();
    common::eventually("the lease runs out and the slot is free", || {
        acquire(r#"{"group":"db","lease_s":1}"#).0 == 200
    });
    assert_eq!(call(h, "POST", "/v1/release", Some(&format!(r#"{{"permit":"{lost}"}}"#))).0, 404);
    // What the work cost is what the group consumed: 2 admitted and settled at 5, 20 of 1,
    // the lost one and the last.
    common::eventually("the consumption is counted", || {
        common::try_metric(h, "tollgate_group_consumed_units_total{group=\"db\"}").is_some_and(|c| c >= 27.0)
    });
    // Bad input names the field and the rule.
    for (path, body, field) in [
        ("/v1/acquire", r#"{"group":"db","lease_s":0}"#, "lease_s"),
        ("/v1/acquire", r#"{"group":"db","lease_s":90000}"#, "lease_s"),
        ("/v1/acquire", r#"{"group":"db","cost":-1}"#, "cost"),
        ("/v1/release", r#"{"permit":"nope"}"#, "permit"),
        ("/v1/release", r#"{"permit":"p00000000000000000000000000000000","cost":-3}"#, "cost"),
        ("/v1/renew", r#"{"permit":"p00000000000000000000000000000000","lease_s":1e9}"#, "lease_s"),
    ] {
        let (code, _, v) = call(h, "POST", path, Some(body));
        assert_eq!((code, v["field"].as_str()), (400, Some(field)), "{path} {body}: {v}");
    }
}

/// `"unthrottled": true` on a check admits the work whatever the group has left (still
/// counted), for a caller that may: here a server without `--auth`.
#[test]
fn an_unthrottled_check_is_admitted_past_the_groups_limit() {
    let s = ServerProc::start_with(&data_dir("api-unthrottled"), &["--tick-ms", "100"], Stdio::null());
    let h = s.http.as_str();
    assert_eq!(call(h, "PUT", "/v1/groups/tight", Some(r#"{"limit":1,"burst":1}"#)).0, 201);
    let check = |body: &str| call(h, "POST", "/v1/check", Some(body)).0;
    let mut tries = 0;
    while check(r#"{"group":"tight"}"#) == 200 && tries < 1000 {
        tries += 1;
    }
    assert_eq!(check(r#"{"group":"tight"}"#), 429);
    for _ in 0..20 {
        assert_eq!(check(r#"{"group":"tight","unthrottled":true}"#), 200);
    }
    assert_eq!(check(r#"{"group":"tight"}"#), 429, "the ordinary path is still limited");
    common::eventually("the unthrottled work is counted", || {
        common::try_metric(h, "tollgate_group_consumed_units_total{group=\"tight\"}")
            .is_some_and(|c| c >= 21.0)
    });
}

/// Bodies that break the rules before any field is read are problems naming the body, like
/// every other error: an array where an object goes, text that is not UTF-8, one too large.
#[test]
fn malformed_bodies_are_problems_naming_what_is_wrong() {
    let s = ServerProc::start_with(&data_dir("api-bodies"), &[], Stdio::null());
    let h = s.http.as_str();
    for (body, field, rule) in [
        (r#"{"quotas":[1,2]}"#, "quotas", "must be an object, got an array"),
        (r#"{"ramp":[10,100,30]}"#, "ramp", "must be an object, got an array"),
        (r#"{"quotas":"lots"}"#, "quotas", "must be an object, got a string"),
    ] {
        let (code, head, v) = call(h, "PUT", "/v1/groups/q", Some(body));
        assert_eq!(
            (code, v["field"].as_str(), v["rule"].as_str()),
            (400, Some(field), Some(rule)),
            "{body}: {v}"
        );
        assert!(head.contains("content-type: application/problem+json"), "{head}");
    }
    assert_eq!(call(h, "GET", "/v1/groups/q", None).0, 404, "nothing was stored");
    let raw = |body: &[u8]| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(h).unwrap();
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nhost: {h}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        let _ = c.write_all(body);
        let mut text = String::new();
        let _ = c.read_to_string(&mut text);
        text
    };
    let text = raw(b"{\"group\":\"a\xff\"}");
    assert!(text.starts_with("HTTP/1.1 400") && text.contains("application/problem+json"), "{text}");
    assert!(text.contains(r#""field":"body""#) && text.contains("not UTF-8"), "{text}");
    let text = raw(&vec![b' '; 2 * 1024 * 1024]);
    assert!(text.starts_with("HTTP/1.1 413") && text.contains("application/problem+json"), "{text}");
    assert!(text.contains(r#""field":"body""#) && text.contains("too large"), "{text}");
}
