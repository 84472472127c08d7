//! The HTTP front end: Prometheus `/metrics`, `/healthz`, and `/status` as JSON.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tollgate_core::engine::GroupView;
use tollgate_core::prometheus::{write_header, write_sample};

use crate::clock::Clock;
use crate::controller::{AdminError, Controller, PutMode};
use crate::convert;
use crate::grpc::checked_name;
use crate::guard::{Front, http_guard};
use crate::properties;
use crate::status::{BUCKETS_S, Latency, Page, status_json, status_response};

/// A view, and the per-group part of `/metrics` rendered from it.
type RenderedGroups = (Arc<Vec<GroupView>>, Arc<String>);

#[derive(Clone)]
struct AppState {
    controller: Arc<Controller>,
    latency: Arc<Latency>,
    clock: Clock,
    /// The per-group part of `/metrics`, rendered at most once per tick (the view it is made
    /// from changes only with a tick or an admin change), with the view it was made from.
    groups: Arc<Mutex<Option<RenderedGroups>>>,
}

/// The HTTP routes, behind the same checks as gRPC calls (see [`crate::guard`]).
pub fn router(
    controller: Arc<Controller>,
    latency: Arc<Latency>,
    clock: Clock,
    front: Front,
    gate: tollgate_client::Tollgate,
) -> Router {
    let guard = axum::middleware::from_fn_with_state((controller.clone(), front), http_guard);
    let api = crate::api::router(controller.clone(), clock, gate);
    Router::new()
        .route("/healthz", get(health))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/v1/node/properties", get(node_properties).put(set_node_properties))
        .route("/v1/groups/{name}/properties", get(group_properties).put(set_group_properties))
        .with_state(AppState { controller, latency, clock, groups: Arc::default() })
        .merge(api)
        .layer(DefaultBodyLimit::max(crate::properties::PROPERTIES_MAX_BYTES.max(crate::api::BODY_MAX_BYTES)))
        .layer(guard)
}

/// One per-group metric: name, help, type, and how to read it (`None`: no sample).
type Family = (&'static str, &'static str, &'static str, fn(&GroupView) -> Option<f64>);

const GROUP_FAMILIES: [Family; 24] = [
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
    ("tollgate_group_waited_requests_total", "Requests admitted after waiting for tokens.", "counter", |g| {
        Some(g.meter.waited as f64)
    }),
    ("tollgate_group_rate_low_1m_units", "Lowest consumption rate over the last minute.", "gauge", |g| {
        g.last_minute.map(|m| m.low)
    }),
    ("tollgate_group_rate_high_1m_units", "Highest consumption rate over the last minute.", "gauge", |g| {
        g.last_minute.map(|m| m.high)
    }),
    ("tollgate_group_rate_avg_1m_units", "Average consumption rate over the last minute.", "gauge", |g| {
        g.last_minute.map(|m| m.average)
    }),
    ("tollgate_group_rate_low_1h_units", "Lowest consumption rate over the last hour.", "gauge", |g| {
        g.last_hour.map(|m| m.low)
    }),
    ("tollgate_group_rate_high_1h_units", "Highest consumption rate over the last hour.", "gauge", |g| {
        g.last_hour.map(|m| m.high)
    }),
    ("tollgate_group_rate_avg_1h_units", "Average consumption rate over the last hour.", "gauge", |g| {
        g.last_hour.map(|m| m.average)
    }),
    ("tollgate_group_rru_total", "Read request units, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.rru)
    }),
    ("tollgate_group_wru_total", "Write request units, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.wru)
    }),
    ("tollgate_group_read_bytes_total", "Bytes read, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.read_bytes)
    }),
    ("tollgate_group_write_bytes_total", "Bytes written, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.write_bytes)
    }),
    ("tollgate_group_cpu_ms_total", "CPU milliseconds, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.cpu_ms)
    }),
    ("tollgate_group_read_requests_total", "Read requests, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.read_rpcs)
    }),
    ("tollgate_group_write_requests_total", "Write requests, as clients reported them.", "counter", |g| {
        g.detail.map(|d| d.write_rpcs)
    }),
];

/// Every group's samples, one family after another.
fn render_groups(view: &[GroupView]) -> String {
    // About 60 bytes a sample: one allocation up front rather than twenty doublings.
    let mut out = String::with_capacity(view.len() * GROUP_FAMILIES.len() * 64 + 4096);
    for (name, help, kind, read) in GROUP_FAMILIES {
        write_header(&mut out, name, help, kind);
        for g in view {
            if let Some(v) = read(g) {
                write_sample(&mut out, name, "group", g.name.as_str(), v);
            }
        }
    }
    out
}

/// `/metrics`. Rendering 100,000 groups takes a good part of a second, so it runs on the
/// blocking pool: the runtime's workers stay free to answer exchanges meanwhile.
async fn metrics(State(app): State<AppState>) -> axum::response::Response {
    match tokio::task::spawn_blocking(move || render_metrics(&app)).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => {
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("metrics failed: {e}\n")).into_response()
        }
    }
}

fn render_metrics(app: &AppState) -> String {
    let view = app.controller.view();
    let groups = {
        let mut cache = app.groups.lock().unwrap_or_else(PoisonError::into_inner);
        match cache.as_ref() {
            Some((of, text)) if Arc::ptr_eq(of, &view) => text.clone(),
            _ => {
                let text = Arc::new(render_groups(&view));
                *cache = Some((view, text.clone()));
                text
            }
        }
    };
    let mut out = String::with_capacity(groups.len() + 4096);
    out.push_str(&groups);
    drop(groups);
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
        (
            "tollgate_leader",
            "1 while this controller leads (or runs alone), 0 while it follows.",
            f64::from(u8::from(app.controller.role().role != crate::controller::Role::Follower)),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP tollgate_leader_changes_total Times this controller became the leader.\n# TYPE tollgate_leader_changes_total counter\ntollgate_leader_changes_total {}",
        app.controller.leader_changes()
    );
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
    out
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

/// `/status`: every group (HTTP has no message size limit to page around), built on the
/// blocking pool like `/metrics`.
async fn status(State(app): State<AppState>) -> axum::response::Response {
    let built = tokio::task::spawn_blocking(move || {
        status_json(&status_response(&app.controller, app.clock.now(), &Page::default()))
    });
    match built.await {
        Ok(json) => axum::Json(json).into_response(),
        Err(e) => {
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("status failed: {e}\n")).into_response()
        }
    }
}

/// A JSON answer.
fn json(status: StatusCode, body: String) -> axum::response::Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error as JSON, `{"error": "…"}`, with the status it deserves.
fn error(status: StatusCode, message: impl Into<String>) -> axum::response::Response {
    json(status, serde_json::json!({ "error": message.into() }).to_string())
}

fn admin_error(e: AdminError) -> axum::response::Response {
    let status = match &e {
        AdminError::Invalid(_) | AdminError::Rule(_) => StatusCode::BAD_REQUEST,
        AdminError::Refused(_) => StatusCode::CONFLICT,
        AdminError::NotFound(_) | AdminError::NoToken(_) => StatusCode::NOT_FOUND,
        AdminError::AlreadyExists(_) => StatusCode::CONFLICT,
        AdminError::Store(s) if s.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        AdminError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

/// Runs a settings change on the blocking pool (it waits on the store's disk).
async fn change<T: Send + 'static>(
    app: AppState,
    f: impl FnOnce(&Controller) -> Result<T, AdminError> + Send + 'static,
) -> Result<T, axum::response::Response> {
    match tokio::task::spawn_blocking(move || f(&app.controller)).await {
        Ok(r) => r.map_err(admin_error),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, format!("change failed: {e}"))),
    }
}

/// Who made a change over HTTP, for the audit log: the credential when there is one, and
/// the peer's address when known.
fn who(ext: &axum::http::Extensions) -> String {
    let addr = who_addr(ext);
    match ext.get::<crate::auth::Caller>() {
        Some(crate::auth::Caller(c)) => format!("{} {addr}", c.label()),
        None => addr,
    }
}

fn who_addr(ext: &axum::http::Extensions) -> String {
    match ext.get::<axum::extract::ConnectInfo<crate::listen::Peer>>().map(|c| c.0.addr) {
        Some(a) => format!("http {a}"),
        None => "http".to_string(),
    }
}

/// `GET /v1/node/properties`: Couchbase's node document.
async fn node_properties(State(app): State<AppState>) -> axum::response::Response {
    json(StatusCode::OK, properties::node_json(&app.controller.node()))
}

/// `PUT /v1/node/properties`: changes the keys the document gives.
async fn set_node_properties(
    State(app): State<AppState>,
    ext: axum::http::Extensions,
    body: String,
) -> axum::response::Response {
    let who = who(&ext);
    let c = match properties::node_change(&body) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match change(app, move |controller| controller.change_node(c, &who)).await {
        Ok(node) => json(StatusCode::OK, properties::node_json(&node)),
        Err(response) => response,
    }
}

/// `GET /v1/groups/NAME/properties`: Couchbase's group document.
async fn group_properties(State(app): State<AppState>, Path(name): Path<String>) -> axum::response::Response {
    let name = match checked_name("name", &name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match app.controller.group(&name) {
        Some(s) => json(StatusCode::OK, properties::group_json(&convert::settings_to_proto(&s))),
        None => admin_error(AdminError::NotFound(name.to_string())),
    }
}

/// `PUT /v1/groups/NAME/properties`: creates the group or changes the keys the document gives.
async fn set_group_properties(
    State(app): State<AppState>,
    Path(name): Path<String>,
    ext: axum::http::Extensions,
    body: String,
) -> axum::response::Response {
    let who = who(&ext);
    let name = match checked_name("name", &name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let current = app.controller.group(&name).map(|s| convert::settings_to_proto(&s));
    let patch = match properties::group_patch(&body, current.as_ref()) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match change(app, move |c| c.put_group(name, &patch, PutMode::Upsert, &who)).await {
        Ok(s) => json(StatusCode::OK, properties::group_json(&convert::settings_to_proto(&s))),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::engine::{Engine, EngineSettings};
    use tollgate_core::settings::{GroupName, GroupSettings};

    #[test]
    fn group_samples_escape_their_labels_and_every_family_is_declared() {
        let mut engine = Engine::new(EngineSettings::default());
        engine.set_group(GroupName::new("plain").unwrap(), GroupSettings::default());
        engine.set_group(GroupName::new(r#"quote"and\slash"#).unwrap(), GroupSettings::default());
        let text = render_groups(&engine.view());
        assert!(text.contains("tollgate_group_clients{group=\"plain\"} 0\n"), "{text}");
        assert!(text.contains(r#"tollgate_group_clients{group="quote\"and\\slash"} 0"#), "{text}");
        for (name, _, kind, _) in GROUP_FAMILIES {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
    }
}
