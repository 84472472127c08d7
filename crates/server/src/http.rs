//! The HTTP front end: Prometheus `/metrics`, `/healthz`, and `/status` as JSON.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tollgate_core::engine::GroupView;

use crate::clock::Clock;
use crate::controller::Controller;
use crate::status::{BUCKETS_S, Latency, Page, status_json, status_response};

#[derive(Clone)]
struct AppState {
    controller: Arc<Controller>,
    latency: Arc<Latency>,
    clock: Clock,
}

/// The HTTP routes.
pub fn router(controller: Arc<Controller>, latency: Arc<Latency>, clock: Clock) -> Router {
    Router::new()
        .route("/healthz", get(health))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(AppState { controller, latency, clock })
}

fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One per-group metric: name, help, type, and how to read it (`None`: no sample).
type Family = (&'static str, &'static str, &'static str, fn(&GroupView) -> Option<f64>);

const GROUP_FAMILIES: [Family; 10] = [
    ("tollgate_group_target_units", "Target units/s (absent when not throttled).", "gauge", |g| g.target),
    ("tollgate_group_admitted_units", "Units/s consumed over the last tick.", "gauge", |g| Some(g.admitted)),
    ("tollgate_group_throttled_requests", "Requests/s refused over the last tick.", "gauge", |g| {
        Some(g.throttled)
    }),
    ("tollgate_group_demand_units", "Units/s asked for, admitted or not.", "gauge", |g| Some(g.demand)),
    ("tollgate_group_unthrottled_units", "Units/s of unthrottled work.", "gauge", |g| Some(g.unthrottled)),
    ("tollgate_group_clients", "Clients reporting the group.", "gauge", |g| Some(f64::from(g.clients))),
    ("tollgate_group_busy", "1 when saturation limits the group below its cap.", "gauge", |g| {
        Some(if g.busy { 1.0 } else { 0.0 })
    }),
    ("tollgate_group_consumed_units_total", "Units consumed, as clients reported.", "counter", |g| {
        Some(g.meter.consumed)
    }),
    ("tollgate_group_admitted_requests_total", "Requests admitted.", "counter", |g| {
        Some(g.meter.admitted as f64)
    }),
    ("tollgate_group_throttled_requests_total", "Requests refused.", "counter", |g| {
        Some(g.meter.throttled as f64)
    }),
];

async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    let view = app.controller.view();
    for (name, help, kind, read) in GROUP_FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for g in view.iter() {
            if let Some(v) = read(g) {
                let _ = writeln!(out, "{name}{{group=\"{}\"}} {v}", label(g.name.as_str()));
            }
        }
    }
    let node = app.controller.node();
    if let Some(c) = node.capacity {
        let _ = writeln!(
            out,
            "# HELP tollgate_node_capacity_units Node capacity, units/s.\n# TYPE tollgate_node_capacity_units gauge\ntollgate_node_capacity_units {c}"
        );
    }
    let (clients, backends, learning) = app.controller.tracking(app.clock.now());
    for (name, help, v) in [
        ("tollgate_clients", "Clients tracked.", clients as f64),
        ("tollgate_backends", "Backends tracked.", backends as f64),
        (
            "tollgate_learning",
            "1 in the first lease after start, while relearning what clients hold.",
            f64::from(u8::from(learning)),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP tollgate_exchanges_total Admission exchanges answered.\n# TYPE tollgate_exchanges_total counter\ntollgate_exchanges_total {}",
        app.controller.exchanges()
    );
    let l = &app.latency;
    let _ = writeln!(
        out,
        "# HELP tollgate_exchange_latency_seconds Time to answer an exchange.\n# TYPE tollgate_exchange_latency_seconds histogram"
    );
    for (i, bound) in BUCKETS_S.iter().enumerate() {
        let _ = writeln!(
            out,
            "tollgate_exchange_latency_seconds_bucket{{le=\"{bound}\"}} {}",
            l.buckets[i].load(Ordering::Relaxed)
        );
    }
    let count = l.count.load(Ordering::Relaxed);
    let _ = writeln!(out, "tollgate_exchange_latency_seconds_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(
        out,
        "tollgate_exchange_latency_seconds_sum {}",
        l.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
    );
    let _ = writeln!(out, "tollgate_exchange_latency_seconds_count {count}");
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// `ok`, or 503 with what is wrong: the settings store cannot take writes (a full disk), so
/// settings changes fail until it can; exchanges are still answered.
async fn health(State(app): State<AppState>) -> axum::response::Response {
    match app.controller.store_health() {
        None => "ok\n".into_response(),
        Some(reason) => {
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("store: {reason}\n")).into_response()
        }
    }
}

async fn status(State(app): State<AppState>) -> impl IntoResponse {
    // Every group: HTTP has no message size limit to page around.
    axum::Json(status_json(&status_response(&app.controller, app.clock.now(), &Page::default())))
}
