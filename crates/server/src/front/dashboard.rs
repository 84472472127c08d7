//! The dashboard at `/` on the HTTP port: a page and its scripts embedded in the binary (the
//! chart library uPlot vendored with its licence, no CDN), and the two JSON routes it reads
//! every second.
//!
//! - `GET /v1/dashboard[?since=N][&charts=a,b][&filter=text][&page=P]`: the node now and its
//!   samples from number `since` on; every group whose name contains `filter`, by name, a page
//!   of [`ROWS_MAX`] at a time (page `P`, from 0), configured or seen in traffic, busy or idle;
//!   the names of the busiest groups in traffic (at most [`CHARTS_MAX`]); the samples of the
//!   groups in `charts` (at most [`CHARTS_MAX`]); the backends; and the clients (lapsed ones
//!   first).
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
use tollgate_model::engine::{Diagnostics, GroupView};
use tollgate_model::settings::GroupName;

use crate::clock::Clock;
use crate::convert;
use crate::front::api::{Answer, answer, refuse, refuse_whole};
use crate::front::grpc::checked_name;
use crate::node::Node;
use crate::observe::history::{GROUP_SERIES, History, NODE_SERIES, SAMPLES, Series};
use crate::observe::status::{
    backend_json, backend_to_proto, client_json, client_to_proto, token_json, token_status,
};

/// The most group rows one answer carries.
pub const ROWS_MAX: usize = 50;
/// The most groups charted in one answer.
pub const CHARTS_MAX: usize = 12;
/// The highest `page` taken (a million groups at [`ROWS_MAX`] a page).
pub const PAGE_MAX: usize = 20_000;
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

const PAGE: &str = include_str!("../../assets/dashboard.html");
const SCRIPT: &str = include_str!("../../assets/dashboard.js");
const STYLE: &str = include_str!("../../assets/dashboard.css");
const UPLOT_JS: &str = include_str!("../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/uplot/LICENSE");

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

/// A group's row, with its largest request over the last minute and hour (`peaks`, by name).
fn row(g: &GroupView, peaks: &std::collections::HashMap<String, (f64, f64)>) -> Value {
    let (largest_last_minute, largest_last_hour) = peaks.get(g.name.as_str()).copied().unwrap_or_default();
    // Settings in the table's terms: `null` for a group seen only in traffic, a limit of
    // "unlimited" where there is none.
    let reserved = g.settings.as_ref().map(|s| s.reserved());
    let limit = g.settings.as_ref().map(|s| match s.limit() {
        tollgate_model::settings::Limit::Units(u) => json!(u),
        tollgate_model::settings::Limit::Unlimited => json!("unlimited"),
    });
    json!({
        "name": g.name.as_str(),
        "reserved": reserved,
        "limit": limit,
        "target": g.target,
        "admitted": g.admitted,
        "demand": g.demand,
        "throttled": g.throttled,
        "clients": g.clients,
        "busy": g.busy,
        "budget_exhausted": g.budget_exhausted,
        "configured": g.settings.is_some(),
        "shadow": g.settings.as_ref().is_some_and(|s| s.shadow()),
        "would_refuse_total": g.meter.would_refuse,
        "in_flight": g.in_flight.map(|f| f.held),
        "max_in_flight": g.settings.as_ref().and_then(|s| s.max_in_flight()),
        "largest_last_minute": largest_last_minute,
        "largest_last_hour": largest_last_hour,
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

/// Page `page` of the groups whose names contain `filter`, by name (the view's order), and how
/// many match in all.
fn page_of<'a>(view: &'a [GroupView], filter: &str, page: usize) -> (Vec<&'a GroupView>, usize) {
    let matching = view.iter().filter(|g| g.name.as_str().contains(filter));
    let total = matching.clone().count();
    (matching.skip(page.saturating_mul(ROWS_MAX)).take(ROWS_MAX).collect(), total)
}

/// The busiest groups in traffic whose names contain `filter` (by demand, then admitted units,
/// then name): at most [`CHARTS_MAX`], in time linear in the groups. A group that neither asks
/// nor is admitted nor refused is idle, and not among them.
fn busiest<'a>(view: &'a [GroupView], filter: &str) -> Vec<&'a GroupView> {
    let mut active: Vec<&GroupView> = view
        .iter()
        .filter(|g| {
            (g.demand > 0.0 || g.admitted > 0.0 || g.throttled > 0.0) && g.name.as_str().contains(filter)
        })
        .collect();
    let order = |a: &&GroupView, b: &&GroupView| {
        b.demand
            .total_cmp(&a.demand)
            .then_with(|| b.admitted.total_cmp(&a.admitted))
            .then_with(|| a.name.cmp(&b.name))
    };
    if active.len() > CHARTS_MAX {
        active.select_nth_unstable_by(CHARTS_MAX, order);
        active.truncate(CHARTS_MAX);
    }
    active.sort_by(order);
    active
}

/// The groups the query's `charts` names, each once; or the refusal naming the field.
fn charts(q: &[(String, String)]) -> Result<Vec<GroupName>, Answer> {
    let mut charts: Vec<GroupName> = Vec::new();
    if let Some((_, list)) = q.iter().find(|(k, _)| k == "charts") {
        for name in list.split(',').filter(|n| !n.is_empty()) {
            match checked_name("charts", name) {
                Ok(n) if !charts.contains(&n) => charts.push(n),
                Ok(_) => {}
                Err(e) => return Err(refuse_whole(StatusCode::BAD_REQUEST, "charts", e)),
            }
        }
        if charts.len() > CHARTS_MAX {
            let got = charts.len();
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "charts",
                format!("at most {CHARTS_MAX} groups, got {got}"),
            ));
        }
    }
    Ok(charts)
}

/// The node's part of the dashboard at `now`: its settings, role and totals over `view`.
fn node_json(d: &Dash, view: &[GroupView], now: tollgate_model::time::Nanos) -> Value {
    let node = d.node.controller.admin().node();
    let (clients, backends, learning) = d.node.controller.readings().tracking(now);
    let role = d.node.cluster.role();
    json!({
        "capacity": node.capacity,
        "mode": if node.mode == tollgate_model::allocate::AllocationMode::Fcfs { "fcfs" } else { "share" },
        "role": role.role.name(),
        "leader": role.leader,
        "region": d.node.cluster.upstream_status().region(),
        "learning": learning,
        "shadow": node.shadow,
        "throttling": node.throttling,
        "exchanges": d.node.controller.readings().exchanges(),
        "groups": view.len(),
        "clients": clients,
        "backends": backends,
        "admitted": view.iter().map(|g| g.admitted).sum::<f64>(),
        "demand": view.iter().map(|g| g.demand).sum::<f64>(),
        "unit": d.node.controller.admin().cost_model().unit(),
        "warnings": d.node.controller.admin().warnings(),
    })
}

#[utoipa::path(get, path = "/v1/dashboard", operation_id = "getDashboard", tag = "dashboard", params(("since" = Option<u64>, Query, description = "The first sample wanted (the last answer's `next`)"), ("charts" = Option<String>, Query, description = "Groups to chart, comma-separated, at most 12"), ("filter" = Option<String>, Query, description = "Only groups whose names contain this, at most 255 bytes"), ("page" = Option<u32>, Query, description = "The page of groups, from 0, at most 20,000")), responses((status = 200, description = "The dashboard's data (docs/operations.md, \"The dashboard\")", body = crate::front::schema::Dashboard), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn overview(State(d): State<Dash>, RawQuery(raw): RawQuery) -> Answer {
    let q = match query(raw.as_deref(), &["since", "charts", "filter", "page"]) {
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
    let page = match q.iter().find(|(k, _)| k == "page").map(|(_, v)| v.parse::<usize>()) {
        None => 0,
        Some(Ok(p)) if p <= PAGE_MAX => p,
        Some(_) => return refuse(StatusCode::BAD_REQUEST, "page", format!("a page number, 0 to {PAGE_MAX}")),
    };
    let charts = match charts(&q) {
        Ok(c) => c,
        Err(a) => return a,
    };
    let built = crate::blocking::spawn(move || {
        let view = d.node.controller.readings().view();
        let now = d.clock.now();
        let peaks = d.node.peaks.groups(now);
        let (rows, matching) = page_of(&view, &filter, page);
        let rows: Vec<Value> = rows.into_iter().map(|g| row(g, &peaks)).collect();
        let busiest: Vec<&str> = busiest(&view, &filter).into_iter().map(|g| g.name.as_str()).collect();
        let mut charted = serde_json::Map::new();
        let mut unknown = Vec::new();
        for name in &charts {
            let Ok(at) = view.binary_search_by(|g| g.name.cmp(name)) else {
                unknown.push(name.to_string());
                continue;
            };
            let g = &view[at];
            let series = d.history.group(name, since).map(|s| series_json(&s, &GROUP_SERIES));
            charted.insert(name.to_string(), json!({ "now": row(g, &peaks), "series": series }));
        }
        let tokens = d.node.peaks.tokens(now, crate::controller::DIAGNOSTICS_SHOWN_MAX);
        json!({
            "next": d.history.next(),
            "window": SAMPLES,
            "node": node_json(&d, &view, now),
            "series": series_json(&d.history.node(since), &NODE_SERIES),
            "groups": rows,
            "groups_matching": matching,
            "page": page,
            "page_size": ROWS_MAX,
            "busiest": busiest,
            "charts": charted,
            "unknown": unknown,
            "diagnostics": diagnostics_json(&d.node.controller.readings().diagnostics(now)),
            "tokens": tokens.iter().map(|t| token_json(&token_status(t))).collect::<Vec<_>>(),
        })
    });
    match built.await {
        Ok(body) => answer(StatusCode::OK, body),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "", format!("dashboard failed: {e}")),
    }
}

#[utoipa::path(get, path = "/v1/dashboard/groups/{name}", operation_id = "getDashboardGroup", tag = "dashboard", params(("name" = String, Path, description = "The group's name"), ("since" = Option<u64>, Query, description = "The first sample wanted")), responses((status = 200, description = "One group's settings, state and samples", body = crate::front::schema::DashboardGroup), (status = 404, description = "No such group", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
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
    let view = d.node.controller.readings().view();
    let Ok(at) = view.binary_search_by(|g| g.name.cmp(&name)) else {
        return refuse_whole(
            StatusCode::NOT_FOUND,
            "name",
            format!("group {:?} does not exist", name.as_str()),
        );
    };
    let g = &view[at];
    let settings =
        g.settings.as_ref().map(|s| crate::front::json::group_settings(&convert::settings_to_proto(s)));
    let series = d.history.group(&name, since).map(|s| series_json(&s, &GROUP_SERIES));
    answer(
        StatusCode::OK,
        json!({
            "name": name.as_str(),
            "settings": settings,
            "now": row(g, &d.node.peaks.groups(d.clock.now())),
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
