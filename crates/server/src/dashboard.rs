//! The dashboard at `/` on the HTTP port: a page and its scripts embedded in the binary (the
//! chart library uPlot vendored with its licence, no CDN), and the two JSON routes it reads
//! every second.
//!
//! - `GET /v1/dashboard[?since=N][&charts=a,b][&filter=text]`: the node now and its samples
//!   from number `since` on, the busiest groups (at most [`ROWS_MAX`], those whose names
//!   contain `filter`), the samples of the groups in `charts` (at most [`CHARTS_MAX`]), the
//!   backends, and the clients (lapsed ones first).
//! - `GET /v1/dashboard/groups/{name}[?since=N]`: one group's settings, state and samples; 404
//!   when the controller knows no such group.
//!
//! The page is open (it holds no data); the JSON routes take a reader's token when the server
//! runs with `--auth`, which the page asks for and keeps for the browser tab.

// The helpers' error is the HTTP answer itself, built at most once per request.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};
use tollgate_core::engine::{Diagnostics, GroupView};
use tollgate_core::settings::GroupName;

use crate::api::{Answer, answer, refuse, refuse_whole};
use crate::clock::Clock;
use crate::convert;
use crate::grpc::checked_name;
use crate::history::{GROUP_SERIES, History, NODE_SERIES, SAMPLES, Series};
use crate::node::Node;
use crate::status::{backend_json, backend_to_proto, client_json, client_to_proto};

/// The most group rows one answer carries.
pub const ROWS_MAX: usize = 50;
/// The most groups charted in one answer.
pub const CHARTS_MAX: usize = 12;
/// The longest `filter` taken, in bytes.
pub const FILTER_MAX_BYTES: usize = 255;

#[derive(Clone)]
struct Dash {
    node: Node,
    history: Arc<History>,
    clock: Clock,
}

/// The page, its assets and its JSON routes.
pub fn router(node: Node, history: Arc<History>, clock: Clock) -> Router {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", PAGE)))
        .route("/assets/dashboard.js", get(|| asset("text/javascript; charset=utf-8", SCRIPT)))
        .route("/assets/dashboard.css", get(|| asset("text/css; charset=utf-8", STYLE)))
        .route("/assets/uPlot.iife.min.js", get(|| asset("text/javascript; charset=utf-8", UPLOT_JS)))
        .route("/assets/uPlot.min.css", get(|| asset("text/css; charset=utf-8", UPLOT_CSS)))
        .route("/assets/uPlot.LICENSE", get(|| asset("text/plain; charset=utf-8", UPLOT_LICENSE)))
        .route("/v1/dashboard", get(overview))
        .route("/v1/dashboard/groups/{name}", get(group))
        .with_state(Dash { node, history, clock })
}

const PAGE: &str = include_str!("../assets/dashboard.html");
const SCRIPT: &str = include_str!("../assets/dashboard.js");
const STYLE: &str = include_str!("../assets/dashboard.css");
const UPLOT_JS: &str = include_str!("../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../assets/uplot/LICENSE");

async fn asset(kind: &'static str, body: &'static str) -> Answer {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// The query's `key=value` pairs, percent-decoded; a key given twice, an unknown key, or more
/// than 4 keys is refused.
fn query(raw: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, Answer> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k)
            .ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "query", "not valid percent-encoding"))?;
        let v = decode(v).ok_or_else(|| refuse(StatusCode::BAD_REQUEST, &k, "not valid percent-encoding"))?;
        if !known.contains(&k.as_str()) {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                &k,
                format!("unknown parameter; known: {}", known.join(", ")),
            ));
        }
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(refuse(StatusCode::BAD_REQUEST, &k, "given twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// `%XX` and `+` decoded; `None` when malformed or not UTF-8.
fn decode(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        match b {
            b'%' => {
                let hi = (it.next()? as char).to_digit(16)?;
                let lo = (it.next()? as char).to_digit(16)?;
                bytes.push((hi * 16 + lo) as u8);
            }
            b'+' => bytes.push(b' '),
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

/// `since`: a sample number from 0 up to the next sample's.
fn since(q: &[(String, String)], next: u64) -> Result<u64, Answer> {
    let Some((_, v)) = q.iter().find(|(k, _)| k == "since") else { return Ok(0) };
    let n: u64 = v.parse().map_err(|_| {
        refuse(StatusCode::BAD_REQUEST, "since", format!("a sample number, 0 to {next}; got {v:?}"))
    })?;
    if n > next {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "since",
            format!("at most {next}, the number of the next sample; got {n}"),
        ));
    }
    Ok(n)
}

fn series_json(s: &Series, names: &[&str]) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("from".into(), json!(s.from));
    m.insert("t".into(), json!(s.t));
    for (name, values) in names.iter().zip(&s.values) {
        m.insert((*name).into(), json!(values));
    }
    Value::Object(m)
}

fn row(g: &GroupView) -> Value {
    json!({
        "name": g.name.as_str(),
        "target": g.target,
        "admitted": g.admitted,
        "demand": g.demand,
        "throttled": g.throttled,
        "clients": g.clients,
        "busy": g.busy,
        "budget_exhausted": g.budget_exhausted,
        "configured": g.settings.is_some(),
    })
}

/// Backends and clients, each in the status's JSON form.
fn diagnostics_json(d: &Diagnostics) -> Value {
    let backends: Vec<Value> = d.backends.iter().map(|b| backend_json(&backend_to_proto(b))).collect();
    let clients: Vec<Value> = d.clients.iter().map(|c| client_json(&client_to_proto(c))).collect();
    json!({
        "backends": backends,
        "backends_total": d.backends_total,
        "clients": clients,
        "clients_total": d.clients_total,
        "clients_lapsed": d.clients_lapsed,
        "others_granted": d.others_granted,
    })
}

/// The busiest groups (by demand, then admitted units, then name) whose names contain
/// `filter`: at most [`ROWS_MAX`], in time linear in the groups.
fn busiest<'a>(view: &'a [GroupView], filter: &str) -> (Vec<&'a GroupView>, usize) {
    let mut matching: Vec<&GroupView> = view.iter().filter(|g| g.name.as_str().contains(filter)).collect();
    let total = matching.len();
    let order = |a: &&GroupView, b: &&GroupView| {
        b.demand
            .total_cmp(&a.demand)
            .then_with(|| b.admitted.total_cmp(&a.admitted))
            .then_with(|| a.name.cmp(&b.name))
    };
    if matching.len() > ROWS_MAX {
        matching.select_nth_unstable_by(ROWS_MAX, order);
        matching.truncate(ROWS_MAX);
    }
    matching.sort_by(order);
    (matching, total)
}

async fn overview(State(d): State<Dash>, RawQuery(raw): RawQuery) -> Answer {
    let q = match query(raw.as_deref(), &["since", "charts", "filter"]) {
        Ok(q) => q,
        Err(a) => return a,
    };
    let next = d.history.next();
    let since = match since(&q, next) {
        Ok(s) => s,
        Err(a) => return a,
    };
    let filter = q.iter().find(|(k, _)| k == "filter").map_or("", |(_, v)| v.as_str()).to_string();
    if filter.len() > FILTER_MAX_BYTES {
        return refuse(StatusCode::BAD_REQUEST, "filter", format!("at most {FILTER_MAX_BYTES} bytes"));
    }
    let mut charts: Vec<GroupName> = Vec::new();
    if let Some((_, list)) = q.iter().find(|(k, _)| k == "charts") {
        for name in list.split(',').filter(|n| !n.is_empty()) {
            match checked_name("charts", name) {
                Ok(n) if !charts.contains(&n) => charts.push(n),
                Ok(_) => {}
                Err(e) => return refuse_whole(StatusCode::BAD_REQUEST, "charts", e),
            }
        }
        if charts.len() > CHARTS_MAX {
            return refuse(
                StatusCode::BAD_REQUEST,
                "charts",
                format!("at most {CHARTS_MAX} groups, got {}", charts.len()),
            );
        }
    }
    let built = tokio::task::spawn_blocking(move || {
        let view = d.node.controller.view();
        let (rows, matching) = busiest(&view, &filter);
        let rows: Vec<Value> = rows.into_iter().map(row).collect();
        let mut charted = serde_json::Map::new();
        let mut unknown = Vec::new();
        for name in &charts {
            let Ok(at) = view.binary_search_by(|g| g.name.cmp(name)) else {
                unknown.push(name.to_string());
                continue;
            };
            let g = &view[at];
            let series = d.history.group(name, since).map(|s| series_json(&s, &GROUP_SERIES));
            charted.insert(name.to_string(), json!({ "now": row(g), "series": series }));
        }
        let node = d.node.controller.node();
        let now = d.clock.now();
        let (clients, backends, learning) = d.node.controller.tracking(now);
        let role = d.node.cluster.role();
        json!({
            "next": d.history.next(),
            "window": SAMPLES,
            "node": {
                "capacity": node.capacity,
                "mode": if node.mode == tollgate_core::allocate::AllocationMode::Fcfs { "fcfs" } else { "share" },
                "role": role.role.name(),
                "leader": role.leader,
                "learning": learning,
                "exchanges": d.node.controller.exchanges(),
                "groups": view.len(),
                "clients": clients,
                "backends": backends,
                "admitted": view.iter().map(|g| g.admitted).sum::<f64>(),
                "demand": view.iter().map(|g| g.demand).sum::<f64>(),
                "unit": d.node.controller.cost_model().unit(),
                "warnings": d.node.controller.warnings(),
            },
            "series": series_json(&d.history.node(since), &NODE_SERIES),
            "groups": rows,
            "groups_matching": matching,
            "charts": charted,
            "unknown": unknown,
            "diagnostics": diagnostics_json(&d.node.controller.diagnostics(now)),
        })
    });
    match built.await {
        Ok(body) => answer(StatusCode::OK, body),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "", format!("dashboard failed: {e}")),
    }
}

async fn group(State(d): State<Dash>, Path(name): Path<String>, RawQuery(raw): RawQuery) -> Answer {
    let name = match checked_name("name", &name) {
        Ok(n) => n,
        Err(e) => return refuse_whole(StatusCode::BAD_REQUEST, "name", e),
    };
    let q = match query(raw.as_deref(), &["since"]) {
        Ok(q) => q,
        Err(a) => return a,
    };
    let since = match since(&q, d.history.next()) {
        Ok(s) => s,
        Err(a) => return a,
    };
    let view = d.node.controller.view();
    let Ok(at) = view.binary_search_by(|g| g.name.cmp(&name)) else {
        return refuse_whole(
            StatusCode::NOT_FOUND,
            "name",
            format!("group {:?} does not exist", name.as_str()),
        );
    };
    let g = &view[at];
    let settings = g.settings.as_ref().map(|s| crate::json::group_settings(&convert::settings_to_proto(s)));
    let series = d.history.group(&name, since).map(|s| series_json(&s, &GROUP_SERIES));
    answer(
        StatusCode::OK,
        json!({
            "name": name.as_str(),
            "settings": settings,
            "now": row(g),
            "limiting": g.limiting,
            "headroom": g.headroom,
            "share": g.share,
            "water_level": g.water_level,
            "granted": g.granted,
            "consumed_total": g.meter.consumed,
            "next": d.history.next(),
            "series": series,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded_and_checked() {
        let q = query(Some("since=3&filter=a%20b+c"), &["since", "filter"]).unwrap();
        assert_eq!(q, [("since".into(), "3".into()), ("filter".into(), "a b c".into())]);
        assert!(query(Some("since=1&since=2"), &["since"]).is_err());
        assert!(query(Some("bogus=1"), &["since"]).is_err());
        assert!(query(Some("since=%zz"), &["since"]).is_err());
        assert_eq!(since(&q, 10).unwrap(), 3);
        assert!(since(&q, 2).is_err(), "ahead of the next sample");
        assert!(since(&[("since".into(), "-1".into())], 2).is_err());
    }
}
