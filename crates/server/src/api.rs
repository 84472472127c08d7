//! The HTTP JSON API under `/v1/`, for any language without gRPC: groups (list, get, create,
//! alter, put, drop), the node settings, status, and `POST /v1/check`, an admission decided
//! by the same in-process client of the controller's grants as Envoy's rate-limit service.
//! `GET /v1/openapi.json` describes every route ([`ROUTES`] is the one list both the router
//! and the document are made from). Errors are JSON: `{"error", "field", "rule"}`.

// The helpers' error is the HTTP answer itself, built at most once per request.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tollgate_limiter::{AcquireError, Tollgate};
use tollgate_proto::v1;

use crate::auth::Caller;
use crate::controller::{Controller, PutMode};
use crate::convert;
use crate::error::AdminError;
use crate::grpc::checked_name;
use crate::node::Node;
use crate::properties::kind;

/// The largest request body taken, in bytes.
pub const BODY_MAX_BYTES: usize = 64 * 1024;
/// The most units one check may cost.
pub const CHECK_COST_MAX: f64 = 1e9;

/// Every route under `/v1/`: method, path, summary. The HTTP port serves exactly these (the
/// Couchbase documents from [`crate::http`], the rest from this module), `/v1/openapi.json`
/// lists exactly these, and a test checks both against a running server.
pub const ROUTES: [(&str, &str, &str); 17] = [
    ("get", "/v1/groups", "Every group's settings."),
    ("post", "/v1/groups", "Create a group: {\"name\", settings…}; 409 if it exists."),
    ("get", "/v1/groups/{name}", "One group's settings; 404 if none."),
    ("put", "/v1/groups/{name}", "Create the group or change the settings the body gives."),
    ("patch", "/v1/groups/{name}", "Change the settings the body gives; 404 if none."),
    ("delete", "/v1/groups/{name}", "Drop the group; 404 if none (unless ?if_exists=true)."),
    ("get", "/v1/node", "The node settings: capacity, mode, slow_start."),
    ("patch", "/v1/node", "Change the node settings the body gives."),
    ("get", "/v1/status", "Every group's target, admitted rate, demand and clients, as /status."),
    ("post", "/v1/check", "Admit {\"group\", \"cost\"}: 200 admitted, or 429 with retry_after_ms."),
    ("get", "/v1/openapi.json", "This document."),
    (
        "get",
        "/v1/dashboard",
        "The dashboard's data: the node, its samples from ?since=N, the groups by name a page at a time (?filter=text, ?page=P), the busiest groups' names, the samples of ?charts=a,b, backends and clients.",
    ),
    (
        "get",
        "/v1/dashboard/groups/{name}",
        "One group's settings, state and samples from ?since=N; 404 if none.",
    ),
    ("get", "/v1/node/properties", "The node settings as Couchbase's JSON document."),
    ("put", "/v1/node/properties", "Change the node settings the Couchbase document gives."),
    ("get", "/v1/groups/{name}/properties", "A group as Couchbase's JSON document."),
    (
        "put",
        "/v1/groups/{name}/properties",
        "Create the group or change the keys the Couchbase document gives.",
    ),
];

#[derive(Clone)]
struct Api {
    node: Node,
    clock: crate::clock::Clock,
    gate: Tollgate,
}

/// The API's routes over `parts`, deciding checks with `gate` (the in-process client).
pub fn router(parts: Node, clock: crate::clock::Clock, gate: Tollgate) -> Router {
    Router::new()
        .route("/v1/groups", get(list).post(create))
        .route("/v1/groups/{name}", get(show).put(upsert).patch(alter).delete(drop_group))
        .route("/v1/node", get(node).patch(set_node))
        .route("/v1/status", get(status))
        .route("/v1/check", post(check))
        .route("/v1/openapi.json", get(openapi))
        .with_state(Api { node: parts, clock, gate })
}

pub(crate) type Answer = axum::response::Response;

pub(crate) fn answer(status: StatusCode, body: Value) -> Answer {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// An error naming the field and the rule.
pub(crate) fn refuse(status: StatusCode, field: &str, rule: impl std::fmt::Display) -> Answer {
    let rule = rule.to_string();
    let error = if field.is_empty() { rule.clone() } else { format!("{field}: {rule}") };
    answer(status, json!({ "error": error, "field": field, "rule": rule }))
}

fn admin_error(e: AdminError) -> Answer {
    let status = match &e {
        AdminError::Invalid(_) | AdminError::Rule(_) => StatusCode::BAD_REQUEST,
        AdminError::NotFound(_) | AdminError::NoToken(_) => StatusCode::NOT_FOUND,
        AdminError::AlreadyExists(_) | AdminError::Refused(_) => StatusCode::CONFLICT,
        AdminError::Store(s) if s.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        AdminError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    match &e {
        AdminError::NotFound(_) | AdminError::AlreadyExists(_) => refuse_whole(status, "name", e),
        AdminError::Invalid(errors) => {
            let first = errors.0.first();
            let (field, rule) =
                first.map_or((String::new(), e.to_string()), |f| (f.field.to_string(), f.rule.clone()));
            answer(status, json!({ "error": e.to_string(), "field": field, "rule": rule }))
        }
        _ => refuse(status, "", e),
    }
}

/// An error whose message names its subject itself (`group "x" does not exist`).
pub(crate) fn refuse_whole(status: StatusCode, field: &str, e: impl std::fmt::Display) -> Answer {
    answer(status, json!({ "error": e.to_string(), "field": field, "rule": e.to_string() }))
}

/// The body as a JSON object, or the reason it is not one.
fn object(body: &str) -> Result<serde_json::Map<String, Value>, Answer> {
    if body.len() > BODY_MAX_BYTES {
        return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, "body", format!("at most {BODY_MAX_BYTES} bytes")));
    }
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(other) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "body",
            format!("must be a JSON object, got {}", kind(&other)),
        )),
        Err(e) => Err(refuse(StatusCode::BAD_REQUEST, "body", format!("not JSON: {e}"))),
    }
}

fn number(field: &str, v: &Value) -> Result<f64, Answer> {
    v.as_f64().filter(|n| n.is_finite()).ok_or_else(|| {
        refuse(StatusCode::BAD_REQUEST, field, format!("must be a finite number, got {}", kind(v)))
    })
}

fn boolean(field: &str, v: &Value) -> Result<bool, Answer> {
    v.as_bool().ok_or_else(|| {
        refuse(StatusCode::BAD_REQUEST, field, format!("must be true or false, got {}", kind(v)))
    })
}

/// The keys a group body may carry, as `GET` shows them.
const GROUP_KEYS: &str = "reserved, limit, burst, priority, weight, budget, budget_period, ramp, dropped, debt_repay_s, \
                          reads_writes_apart, backend_limit, background";

/// A group body as a patch: only the keys given change; `null` clears what may be cleared.
fn patch(body: &serde_json::Map<String, Value>, skip: &[&str]) -> Result<v1::GroupPatch, Answer> {
    let mut p = v1::GroupPatch::default();
    for (key, v) in body {
        if skip.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "reserved" => p.reserved = Some(number(key, v)?),
            "limit" => match v {
                Value::String(s) if s == "unlimited" => p.unlimited = true,
                Value::Null => p.unlimited = true,
                v => {
                    p.limit = Some(number(key, v).map_err(|_| {
                        refuse(
                            StatusCode::BAD_REQUEST,
                            key,
                            format!("must be a number or \"unlimited\", got {}", kind(v)),
                        )
                    })?)
                }
            },
            "burst" => match v {
                Value::Null => p.clear_burst = true,
                v => p.burst = Some(number(key, v)?),
            },
            "priority" => {
                p.priority = Some(match v {
                    Value::String(s) => match s.as_str() {
                        "low" => 1,
                        "medium" => 8,
                        "high" => 16,
                        _ => {
                            return Err(refuse(
                                StatusCode::BAD_REQUEST,
                                key,
                                format!("must be low, medium, high or 1 to 16, got {s:?}"),
                            ));
                        }
                    },
                    v => match v.as_u64() {
                        Some(n @ 1..=16) => n as u32,
                        _ => {
                            return Err(refuse(
                                StatusCode::BAD_REQUEST,
                                key,
                                "must be low, medium, high or 1 to 16",
                            ));
                        }
                    },
                })
            }
            "weight" => p.weight = Some(number(key, v)?),
            "budget" => match v {
                Value::Null => p.clear_budget = true,
                v => p.budget = Some(number(key, v)?),
            },
            "budget_period" => match v.as_str() {
                Some(period) => p.budget_period = Some(period.to_string()),
                None => {
                    return Err(refuse(
                        StatusCode::BAD_REQUEST,
                        key,
                        "must be \"total\", \"day\", \"week\" or \"month\"",
                    ));
                }
            },
            "ramp" => match v {
                Value::Null => p.clear_ramp = true,
                Value::Object(r) => p.ramp = Some(ramp(r)?),
                v => {
                    return Err(refuse(
                        StatusCode::BAD_REQUEST,
                        key,
                        format!("must be an object or null, got {}", kind(v)),
                    ));
                }
            },
            "dropped" => {
                p.count_dropped = Some(match v.as_str() {
                    Some("count") => true,
                    Some("return") => false,
                    _ => return Err(refuse(StatusCode::BAD_REQUEST, key, "must be \"count\" or \"return\"")),
                })
            }
            "debt_repay_s" => p.debt_repay_s = Some(number(key, v)?),
            "reads_writes_apart" => p.reads_writes_apart = Some(boolean(key, v)?),
            "backend_limit" => match v {
                Value::Null => p.clear_backend_limit = true,
                v => p.backend_limit = Some(number(key, v)?),
            },
            "background" => p.background = Some(boolean(key, v)?),
            other => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    other,
                    format!("unknown field; expected one of {GROUP_KEYS}"),
                ));
            }
        }
    }
    Ok(p)
}

fn ramp(r: &serde_json::Map<String, Value>) -> Result<v1::RampSettings, Answer> {
    let mut out = v1::RampSettings::default();
    for (key, v) in r {
        let field = format!("ramp.{key}");
        match key.as_str() {
            "min" => out.min = number(&field, v)?,
            "max" => out.max = number(&field, v)?,
            "duration_s" => out.duration_s = number(&field, v)?,
            "mode" => {
                // `go-back-n` reads as `go_back_n`, as everywhere else.
                out.mode = match v.as_str().map(|m| m.replace('-', "_")).as_deref() {
                    Some("relaxed") => v1::RampMode::Relaxed,
                    Some("scheduled") => v1::RampMode::Scheduled,
                    Some("only_if_used") => v1::RampMode::OnlyIfUsed,
                    Some("go_back_n") => v1::RampMode::GoBackN,
                    _ => {
                        return Err(refuse(
                            StatusCode::BAD_REQUEST,
                            &field,
                            "must be relaxed, scheduled, only_if_used or go_back_n",
                        ));
                    }
                } as i32
            }
            "threshold_pct" => out.threshold_pct = Some(number(&field, v)?),
            "ramp_down_pct" => out.ramp_down_pct = Some(number(&field, v)?),
            "cool_down_s" => out.cool_down_s = Some(number(&field, v)?),
            "resume_ttl_s" => out.resume_ttl_s = (!v.is_null()).then(|| number(&field, v)).transpose()?,
            _ => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    &field,
                    "unknown field; expected one of min, max, duration_s, mode, threshold_pct, ramp_down_pct, cool_down_s, resume_ttl_s",
                ));
            }
        }
    }
    Ok(out)
}

fn group_json(name: &str, s: &tollgate_model::settings::GroupSettings) -> Value {
    json!({ "name": name, "settings": crate::json::group_settings(&convert::settings_to_proto(s)) })
}

fn who(ext: &axum::http::Extensions) -> String {
    let addr = ext
        .get::<axum::extract::ConnectInfo<crate::listen::Peer>>()
        .map_or_else(|| "http".to_string(), |c| format!("http {}", c.0.addr));
    match ext.get::<Caller>() {
        Some(Caller(c)) => format!("{} {addr}", c.label()),
        None => addr,
    }
}

/// Runs a change on the blocking pool (it waits on the store's disk).
async fn change<T: Send + 'static>(
    api: &Api,
    f: impl FnOnce(&Controller) -> Result<T, AdminError> + Send + 'static,
) -> Result<T, Answer> {
    let controller = api.node.controller.clone();
    match tokio::task::spawn_blocking(move || f(&controller)).await {
        Ok(r) => r.map_err(admin_error),
        Err(e) => Err(refuse(StatusCode::INTERNAL_SERVER_ERROR, "", format!("change failed: {e}"))),
    }
}

fn name_of(name: &str) -> Result<tollgate_model::settings::GroupName, Answer> {
    checked_name("name", name).map_err(|e| {
        let rule = e.strip_prefix("name: ").unwrap_or(&e).to_string();
        refuse(StatusCode::BAD_REQUEST, "name", rule)
    })
}

/// Every configured group, written a chunk at a time (at 100,000 groups the whole answer made
/// at once held hundreds of megabytes).
async fn list(State(api): State<Api>) -> Answer {
    let groups = api.node.controller.groups();
    let body = crate::stream::body(move |out| {
        out.object_with_array(json!({}), "groups", groups.iter().map(|(n, s)| group_json(n.as_str(), s)))
    })
    .await;
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn show(State(api): State<Api>, Path(name): Path<String>) -> Answer {
    let name = match name_of(&name) {
        Ok(n) => n,
        Err(a) => return a,
    };
    match api.node.controller.group(&name) {
        Some(s) => answer(StatusCode::OK, group_json(name.as_str(), &s)),
        None => admin_error(AdminError::NotFound(name.to_string())),
    }
}

async fn put_with(
    api: Api,
    name: &str,
    body: &str,
    mode: PutMode,
    ext: &axum::http::Extensions,
    skip: &[&str],
) -> Answer {
    let name = match name_of(name) {
        Ok(n) => n,
        Err(a) => return a,
    };
    let p = match object(body).and_then(|o| patch(&o, skip)) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let who = who(ext);
    let n = name.clone();
    match change(&api, move |c| c.put_group(n, &p, mode, &who)).await {
        Ok(s) => {
            let status = if mode == PutMode::Create { StatusCode::CREATED } else { StatusCode::OK };
            answer(status, group_json(name.as_str(), &s))
        }
        Err(a) => a,
    }
}

async fn create(State(api): State<Api>, ext: axum::http::Extensions, body: String) -> Answer {
    let name = match object(&body) {
        Ok(o) => match o.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return refuse(StatusCode::BAD_REQUEST, "name", format!("must be a string, got {}", kind(v)));
            }
            None => return refuse(StatusCode::BAD_REQUEST, "name", "missing"),
        },
        Err(a) => return a,
    };
    put_with(api, &name, &body, PutMode::Create, &ext, &["name"]).await
}

async fn upsert(
    State(api): State<Api>,
    Path(name): Path<String>,
    ext: axum::http::Extensions,
    body: String,
) -> Answer {
    put_with(api, &name, &body, PutMode::Upsert, &ext, &[]).await
}

async fn alter(
    State(api): State<Api>,
    Path(name): Path<String>,
    ext: axum::http::Extensions,
    body: String,
) -> Answer {
    put_with(api, &name, &body, PutMode::Alter, &ext, &[]).await
}

async fn drop_group(
    State(api): State<Api>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    ext: axum::http::Extensions,
) -> Answer {
    let if_exists = match query.as_deref() {
        None | Some("") | Some("if_exists=false") => false,
        Some("if_exists=true") => true,
        Some(other) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "query",
                format!("expected if_exists=true or false, got {other:?}"),
            );
        }
    };
    let name = match name_of(&name) {
        Ok(n) => n,
        Err(a) => return a,
    };
    let who = who(&ext);
    let n = name.clone();
    match change(&api, move |c| c.drop_group(&n, &who)).await {
        Ok(true) => answer(StatusCode::OK, json!({ "dropped": name.as_str() })),
        Ok(false) if if_exists => answer(StatusCode::OK, json!({ "dropped": null })),
        Ok(false) => admin_error(AdminError::NotFound(name.to_string())),
        Err(a) => a,
    }
}

fn node_json(n: crate::store::StoredNode) -> Value {
    json!({
        "capacity": n.capacity,
        "mode": if n.mode == tollgate_model::allocate::AllocationMode::Fcfs { "fcfs" } else { "share" },
        "slow_start": n.slow_start,
    })
}

async fn node(State(api): State<Api>) -> Answer {
    answer(StatusCode::OK, node_json(api.node.controller.node()))
}

async fn set_node(State(api): State<Api>, ext: axum::http::Extensions, body: String) -> Answer {
    let o = match object(&body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    let mut change_set = crate::properties::NodeChange::default();
    for (key, v) in &o {
        match key.as_str() {
            "capacity" => {
                change_set.capacity = Some(match v {
                    Value::Null => None,
                    v => match number(key, v) {
                        Ok(n) => Some(n),
                        Err(a) => return a,
                    },
                })
            }
            "mode" => {
                change_set.mode = Some(match v.as_str() {
                    Some("share") => tollgate_model::allocate::AllocationMode::Share,
                    Some("fcfs") => tollgate_model::allocate::AllocationMode::Fcfs,
                    _ => return refuse(StatusCode::BAD_REQUEST, key, "must be \"share\" or \"fcfs\""),
                })
            }
            "slow_start" => match boolean(key, v) {
                Ok(b) => change_set.slow_start = Some(b),
                Err(a) => return a,
            },
            other => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    other,
                    "unknown field; expected one of capacity, mode, slow_start",
                );
            }
        }
    }
    let who = who(&ext);
    match change(&api, move |c| c.change_node(change_set, &who)).await {
        Ok(n) => answer(StatusCode::OK, node_json(n)),
        Err(a) => a,
    }
}

async fn status(State(api): State<Api>, axum::extract::RawQuery(query): axum::extract::RawQuery) -> Answer {
    match crate::status::page_query(query.as_deref()) {
        Ok(page) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            crate::status::status_body(api.node.clone(), api.clock.now(), page).await,
        )
            .into_response(),
        Err(e) => refuse(StatusCode::BAD_REQUEST, "", e),
    }
}

async fn check(State(api): State<Api>, ext: axum::http::Extensions, body: String) -> Answer {
    if let Err(e) = api.node.cluster.check_leader() {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "", e.message());
    }
    let o = match object(&body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    for key in o.keys() {
        if key != "group" && key != "cost" {
            return refuse(StatusCode::BAD_REQUEST, key, "unknown field; expected group and cost");
        }
    }
    let group = match o.get("group") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return refuse(StatusCode::BAD_REQUEST, "group", format!("must be a string, got {}", kind(v)));
        }
        None => return refuse(StatusCode::BAD_REQUEST, "group", "missing"),
    };
    let name = match checked_name("group", &group) {
        Ok(n) => n,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "group", e.strip_prefix("group: ").unwrap_or(&e)),
    };
    let cost = match o.get("cost") {
        None => 1.0,
        Some(v) => match number("cost", v) {
            Ok(c) if (0.0..=CHECK_COST_MAX).contains(&c) => c,
            Ok(c) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "cost",
                    format!("must be from 0 to {CHECK_COST_MAX:e}, got {c}"),
                );
            }
            Err(a) => return a,
        },
    };
    if let Some(Caller(c)) = ext.get::<Caller>()
        && !c.allows_group(name.as_str())
    {
        let refused =
            crate::auth::Refused::Group { who: c.label(), group: group.clone(), patterns: c.groups.clone() };
        return refuse(StatusCode::FORBIDDEN, "group", refused);
    }
    let handle = match api.gate.group(name.as_str()) {
        Ok(h) => h,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "group", e),
    };
    crate::rls::wait_for_first_grant(&handle).await;
    match handle.try_acquire(cost) {
        Ok(permit) => {
            drop(permit);
            answer(
                StatusCode::OK,
                json!({ "admitted": true, "group": group, "remaining": handle.available().floor() }),
            )
        }
        Err(AcquireError::Throttled { retry_after, .. }) => retry(&group, retry_after),
        Err(AcquireError::NeverAdmissible { burst, .. }) => refuse(
            StatusCode::BAD_REQUEST,
            "cost",
            format!("{cost} units can never be admitted: the group's burst holds at most {burst}"),
        ),
        Err(e) => refuse(StatusCode::BAD_REQUEST, "", e),
    }
}

fn retry(group: &str, after: Duration) -> Answer {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut a = answer(
        StatusCode::TOO_MANY_REQUESTS,
        json!({ "admitted": false, "group": group, "retry_after_ms": ms }),
    );
    let secs = ms.div_ceil(1000).to_string();
    if let Ok(v) = axum::http::HeaderValue::from_str(&secs) {
        a.headers_mut().insert(header::RETRY_AFTER, v);
    }
    a
}

/// The OpenAPI 3.1 document of [`ROUTES`].
pub fn openapi_document() -> Value {
    let mut paths = serde_json::Map::new();
    for (method, path, summary) in ROUTES {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        let mut op = json!({
            "summary": summary,
            "responses": { "200": { "description": "OK", "content": { "application/json": {} } } },
        });
        if path.contains("{name}") {
            op["parameters"] =
                json!([{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }]);
        }
        if ["post", "put", "patch"].contains(&method) {
            op["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": { "type": "object" } } } });
        }
        entry[method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": { "title": "Tollgate", "version": env!("CARGO_PKG_VERSION") },
        "components": { "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } } },
        "security": [{ "bearer": [] }],
        "paths": paths,
    })
}

async fn openapi() -> Answer {
    answer(StatusCode::OK, openapi_document())
}
