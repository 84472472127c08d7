//! The HTTP JSON API under `/v1/`, for any language without gRPC: groups (list a page at a
//! time, get, create, alter, put, drop), the node settings, status, and `POST /v1/check`, an
//! admission decided by the same in-process client of the controller's grants as Envoy's
//! rate-limit service (the permits kept across calls are [`crate::front::permits`]'s). Bodies are the types of [`crate::front::body`]; `GET /v1/openapi.json` is the OpenAPI
//! 3.1 document generated from them and from the handlers' annotations ([`ApiDoc`]). Errors
//! are RFC 9457 problem details naming the field and the rule ([`crate::front::body::Problem`]).

// The helpers' error is the HTTP answer itself, built at most once per request.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::Value;
use tollgate_limiter::{AcquireError, Tollgate};

use crate::access::auth::Caller;
use crate::controller::{Controller, PutMode};
use crate::convert;
use crate::error::AdminError;
use crate::front::body::{
    Admitted, ChargeBody, Charged, CheckBody, DroppedGroup, Group, GroupBody, GroupPage, NodeBody,
    NodeSettings, Patch, Problem, Refused,
};
use crate::front::grpc::checked_name;
use crate::node::Node;

/// The largest request body taken, in bytes.
pub const BODY_MAX_BYTES: usize = 64 * 1024;
/// The most units one check may cost.
pub const CHECK_COST_MAX: f64 = 1e9;
/// The most groups one page of `GET /v1/groups` holds, and how many when `limit` is not given.
pub const GROUPS_PAGE_MAX: usize = 1000;

#[derive(Clone)]
struct Api {
    node: Node,
    clock: crate::clock::Clock,
    gate: Tollgate,
    charges: crate::front::charges::ChargeBound,
}

/// The API's routes over `parts`, deciding checks with `gate` (the in-process client) and
/// bounding charges by `charges`.
pub fn router(
    parts: Node,
    clock: crate::clock::Clock,
    gate: Tollgate,
    charges: crate::front::charges::ChargeBound,
) -> Router {
    Router::new()
        .route("/v1/groups", get(list).post(create))
        .route("/v1/groups/{name}", get(show).put(upsert).patch(alter).delete(drop_group))
        .route("/v1/node", get(node).patch(set_node))
        .route("/v1/status", get(status))
        .route("/v1/check", post(check))
        .route("/v1/charge", post(charge))
        .with_state(Api { node: parts, clock, gate, charges })
}

pub(crate) type Answer = axum::response::Response;

pub(crate) fn answer(status: StatusCode, body: Value) -> Answer {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(crate) fn typed(status: StatusCode, body: &impl serde::Serialize) -> Answer {
    answer(status, serde_json::to_value(body).unwrap_or(Value::Null))
}

/// An answer written straight from `body`, its keys in the order of its fields (declared in
/// the order of their names, as [`typed`] writes them): the admission answers, written once
/// per call rather than through a JSON value.
pub(crate) fn typed_flat(status: StatusCode, body: &impl serde::Serialize) -> Answer {
    (status, [(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(body).unwrap_or_default())
        .into_response()
}

/// A problem (RFC 9457) with its sentence, field and rule.
fn problem(status: StatusCode, detail: String, field: &str, rule: String) -> Answer {
    let p = Problem {
        kind: "about:blank".into(),
        title: status.canonical_reason().unwrap_or("Error").into(),
        status: status.as_u16(),
        error: detail.clone(),
        detail,
        field: field.into(),
        rule,
    };
    let body = serde_json::to_string(&p).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body).into_response()
}

/// An error naming the field and the rule.
pub(crate) fn refuse(status: StatusCode, field: &str, rule: impl std::fmt::Display) -> Answer {
    let rule = rule.to_string();
    let detail = if field.is_empty() { rule.clone() } else { format!("{field}: {rule}") };
    problem(status, detail, field, rule)
}

/// An error whose message names its subject itself (`group "x" does not exist`).
pub(crate) fn refuse_whole(status: StatusCode, field: &str, e: impl std::fmt::Display) -> Answer {
    problem(status, e.to_string(), field, e.to_string())
}

/// The answer to a path the HTTP port does not serve: 404 as a problem.
pub(crate) async fn no_route(uri: axum::http::Uri) -> Answer {
    refuse_whole(StatusCode::NOT_FOUND, "path", format!("no such path: {}", uri.path()))
}

/// Turns axum's bare 405 into a problem naming the methods the path takes.
/// A refusal the HTTP stack wrote as plain text before any handler ran (a body that is not
/// UTF-8, one over the size limit), as a problem naming the body, like every other error of
/// the JSON API.
async fn plain_problem(path: &str, a: Answer) -> Answer {
    let plain = a
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"));
    let status = a.status();
    if !(plain && status.is_client_error() && path.starts_with("/v1/")) {
        return a;
    }
    // Those texts are a line; anything longer is cut.
    let text = axum::body::to_bytes(a.into_body(), 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let rule = text
        .strip_prefix("Failed to buffer the request body: ")
        .or_else(|| text.strip_prefix("Request body didn't contain valid UTF-8: "))
        .map_or(text.clone(), |rest| match status {
            StatusCode::PAYLOAD_TOO_LARGE => format!("too large ({rest})"),
            _ => format!("not UTF-8 ({rest})"),
        });
    refuse(status, "body", rule)
}

pub(crate) async fn method_problem(req: axum::extract::Request, next: axum::middleware::Next) -> Answer {
    let method = req.method().clone();
    // The path's own bytes, shared (a copy only for an error's sentence).
    let uri = req.uri().clone();
    let path = uri.path();
    let a = next.run(req).await;
    if a.status() != StatusCode::METHOD_NOT_ALLOWED {
        return plain_problem(path, a).await;
    }
    let allow = a.headers().get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut p = refuse_whole(
        StatusCode::METHOD_NOT_ALLOWED,
        "method",
        format!("{path} does not take {method}; it takes {allow}"),
    );
    if let Ok(v) = axum::http::HeaderValue::from_str(&allow) {
        p.headers_mut().insert(header::ALLOW, v);
    }
    p
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
            problem(status, e.to_string(), &field, rule)
        }
        _ => refuse(status, "", e),
    }
}

/// The body keys whose values are objects (structs), in every body that has them.
const OBJECT_FIELDS: [&str; 2] = ["quotas", "ramp"];

/// A flat body (one with no object among its fields: a check, a charge, an acquire) as a `T`
/// borrowing from it, read in one pass: a body that keeps the rules is deserialized straight
/// from its text; one that breaks a rule (or is not an object) goes through [`parse`] for the
/// answer naming the field and the rule.
pub(crate) fn parse_flat<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, Answer> {
    let text = std::str::from_utf8(body)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "body", format!("not UTF-8 ({e})")))?;
    if body.len() <= BODY_MAX_BYTES
        && text.trim_start().starts_with('{')
        && let Ok(t) = serde_json::from_str(text)
    {
        return Ok(t);
    }
    parse(text)
}

/// The body as a `T`, or 400 naming the field at fault and the rule (413 past
/// [`BODY_MAX_BYTES`]).
pub(crate) fn parse<'a, T: serde::Deserialize<'a>>(body: &'a str) -> Result<T, Answer> {
    if body.len() > BODY_MAX_BYTES {
        return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, "body", format!("at most {BODY_MAX_BYTES} bytes")));
    }
    let value: Value = serde_json::from_str(body)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "body", format!("not JSON: {e}")))?;
    if !value.is_object() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "body",
            format!("must be a JSON object, got {}", crate::front::body::kind(&value)),
        ));
    }
    // A struct's fields come from an object's keys only: serde would also read an array's
    // items as the fields in order (`"quotas": [1, 2]` as a minute's and an hour's).
    if let Some((key, v)) = value.as_object().and_then(|o| {
        OBJECT_FIELDS
            .iter()
            .find_map(|k| o.get(*k).filter(|v| !(v.is_object() || v.is_null())).map(|v| (*k, v)))
    }) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            key,
            format!("must be an object, got {}", crate::front::body::kind(v)),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde names an unknown field in its message, the path being its parent's.
        let (field, rule) = match inner.strip_prefix("unknown field `").and_then(|r| r.split_once('`')) {
            Some((name, rest)) => {
                // The path ends at the unknown field itself.
                let field = if path == "." { name.to_string() } else { path.clone() };
                (field, format!("unknown field{}", rest.replace('`', "")))
            }
            None if inner.starts_with("unknown variant `") => {
                // "unknown variant `x`, expected one of `a`, `b`": must be a or b, got "x".
                let rest = inner.trim_start_matches("unknown variant `");
                let (got, expected) = rest.split_once('`').unwrap_or((rest, ""));
                let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
                let list = match names.split_last() {
                    Some((last, [])) => (*last).to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                };
                (path, format!("must be {list}, got {got:?}"))
            }
            None if inner.starts_with("missing field `") => {
                let name = inner.trim_start_matches("missing field `").trim_end_matches('`');
                let field = if path == "." { name.to_string() } else { format!("{path}.{name}") };
                (field, "missing".to_string())
            }
            None => (path, inner.split(" at line ").next().unwrap_or(&inner).to_string()),
        };
        refuse(StatusCode::BAD_REQUEST, &field, rule)
    })
}

fn group_of(name: &str, s: &tollgate_model::settings::GroupSettings) -> Group {
    Group {
        name: name.to_string(),
        settings: crate::front::body::GroupSettings::from(&convert::settings_to_proto(s)),
    }
}

fn who(ext: &axum::http::Extensions) -> String {
    let addr = ext
        .get::<axum::extract::ConnectInfo<crate::front::listen::Peer>>()
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
    match crate::blocking::spawn(move || f(&controller)).await {
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

/// A page token: opaque to clients, checked when it comes back (one the server did not issue
/// is refused).
fn page_token(after: &str) -> String {
    let hex: String = after.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.{}", token_check(after))
}

fn token_check(after: &str) -> String {
    let digest =
        ring::digest::digest(&ring::digest::SHA256, format!("tollgate page token {after}").as_bytes());
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The name a page token stands for, if the server issued it.
fn page_after(token: &str) -> Option<String> {
    let (hex, check) = token.split_once('.')?;
    if hex.len() % 2 != 0 || hex.len() > 2 * 512 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect();
    let after = String::from_utf8(bytes?).ok()?;
    (token_check(&after) == check).then_some(after)
}

/// `?limit=N&page_token=T` of `GET /v1/groups`.
fn groups_query(query: Option<&str>) -> Result<(usize, String), Answer> {
    let (mut limit, mut after) = (GROUPS_PAGE_MAX, String::new());
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "limit" => {
                limit = match value.parse::<usize>() {
                    Ok(n) if (1..=GROUPS_PAGE_MAX).contains(&n) => n,
                    _ => {
                        return Err(refuse(
                            StatusCode::BAD_REQUEST,
                            "limit",
                            format!("must be a whole number from 1 to {GROUPS_PAGE_MAX}, got {value:?}"),
                        ));
                    }
                }
            }
            "page_token" => {
                after = page_after(value).ok_or_else(|| {
                    refuse(
                        StatusCode::BAD_REQUEST,
                        "page_token",
                        "not a token this server issued (next_page_token)",
                    )
                })?
            }
            other => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    other,
                    "unknown parameter; expected limit and page_token",
                ));
            }
        }
    }
    Ok((limit, after))
}

/// Query of `GET /v1/groups`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct GroupsQuery {
    /// Groups on a page, 1 to 1,000 (default 1,000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_page_token` of the page before.
    page_token: Option<String>,
}

/// Query of `DELETE /v1/groups/{name}`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct DropQuery {
    /// `true`: 200 with `dropped: null` when there is no such group, rather than 404.
    if_exists: Option<bool>,
}

/// Query of `GET /v1/status`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct StatusQuery {
    /// Groups on a page, 1 to 10,000 (default: all).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
    /// The `next_page_token` of the page before.
    page_token: Option<String>,
}

/// The configured groups by name, a page at a time.
#[utoipa::path(get, path = "/v1/groups", operation_id = "listGroups", tag = "groups", params(GroupsQuery),
    responses((status = 200, description = "A page of groups", body = GroupPage),
        (status = 400, description = "A bad parameter", body = Problem, content_type = "application/problem+json"),
        crate::front::body::AuthProblems))]
async fn list(State(api): State<Api>, RawQuery(query): RawQuery) -> Answer {
    let (limit, after) = match groups_query(query.as_deref()) {
        Ok(q) => q,
        Err(a) => return a,
    };
    let groups = api.node.controller.admin().groups();
    let start = groups.partition_point(|(n, _)| n.as_str() <= after.as_str());
    let end = start.saturating_add(limit).min(groups.len());
    let next = (end < groups.len() && end > start).then(|| page_token(groups[end - 1].0.as_str()));
    let page = GroupPage {
        groups: groups[start..end].iter().map(|(n, s)| group_of(n.as_str(), s)).collect(),
        next_page_token: next,
    };
    typed(StatusCode::OK, &page)
}

/// One group's settings.
#[utoipa::path(get, path = "/v1/groups/{name}", operation_id = "getGroup", tag = "groups",
    params(("name" = String, Path, description = "The group's name")),
    responses((status = 200, description = "The group", body = Group),
        (status = 400, description = "A bad name", body = Problem, content_type = "application/problem+json"),
        crate::front::body::AuthProblems,
        (status = 404, description = "No such group", body = Problem, content_type = "application/problem+json")))]
async fn show(State(api): State<Api>, Path(name): Path<String>) -> Answer {
    let name = match name_of(&name) {
        Ok(n) => n,
        Err(a) => return a,
    };
    match api.node.controller.admin().group(&name) {
        Some(s) => typed(StatusCode::OK, &group_of(name.as_str(), &s)),
        None => admin_error(AdminError::NotFound(name.to_string())),
    }
}

/// [`put_with`] the body parsed, or the problem with it.
async fn put_parsed(api: Api, name: &str, body: &str, mode: PutMode, ext: &axum::http::Extensions) -> Answer {
    match parse(body) {
        Ok(b) => put_with(api, name, b, mode, ext).await,
        Err(a) => a,
    }
}

async fn put_with(
    api: Api,
    name: &str,
    body: GroupBody,
    mode: PutMode,
    ext: &axum::http::Extensions,
) -> Answer {
    let name = match name_of(name) {
        Ok(n) => n,
        Err(a) => return a,
    };
    if body.name.as_deref().is_some_and(|n| n != name.as_str()) {
        return refuse(StatusCode::BAD_REQUEST, "name", "must be the path's name, or left out");
    }
    let p = body.to_patch();
    let who = who(ext);
    let n = name.clone();
    let created = mode == PutMode::Create
        || (mode == PutMode::Upsert && api.node.controller.admin().group(&name).is_none());
    match change(&api, move |c| c.admin().put_group(n, &p, mode, &who, crate::clock::wall_ms())).await {
        Ok(s) => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            typed(status, &group_of(name.as_str(), &s))
        }
        Err(a) => a,
    }
}

/// Creates a group.
#[utoipa::path(post, path = "/v1/groups", operation_id = "createGroup", tag = "groups", request_body = GroupBody,
    responses((status = 201, description = "Created", body = Group),
        crate::front::body::AuthProblems,
        (status = 409, description = "The group exists", body = Problem, content_type = "application/problem+json"),
        crate::front::body::ChangeProblems))]
async fn create(State(api): State<Api>, ext: axum::http::Extensions, body: String) -> Answer {
    let body: GroupBody = match parse(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let Some(name) = body.name.clone() else {
        return refuse(StatusCode::BAD_REQUEST, "name", "missing");
    };
    put_with(api, &name, body, PutMode::Create, &ext).await
}

/// Creates the group (201) or changes the settings the body gives (200).
#[utoipa::path(put, path = "/v1/groups/{name}", operation_id = "putGroup", tag = "groups", request_body = GroupBody,
    params(("name" = String, Path, description = "The group's name")),
    responses((status = 200, description = "Changed", body = Group),
        (status = 201, description = "Created", body = Group),
        crate::front::body::AuthProblems,
        crate::front::body::ChangeProblems))]
async fn upsert(
    State(api): State<Api>,
    Path(name): Path<String>,
    ext: axum::http::Extensions,
    body: String,
) -> Answer {
    put_parsed(api, &name, &body, PutMode::Upsert, &ext).await
}

/// Changes the settings the body gives.
#[utoipa::path(patch, path = "/v1/groups/{name}", operation_id = "alterGroup", tag = "groups", request_body = GroupBody,
    params(("name" = String, Path, description = "The group's name")),
    responses((status = 200, description = "Changed", body = Group),
        crate::front::body::AuthProblems,
        (status = 404, description = "No such group", body = Problem, content_type = "application/problem+json"),
        crate::front::body::ChangeProblems))]
async fn alter(
    State(api): State<Api>,
    Path(name): Path<String>,
    ext: axum::http::Extensions,
    body: String,
) -> Answer {
    put_parsed(api, &name, &body, PutMode::Alter, &ext).await
}

/// Drops the group.
#[utoipa::path(delete, path = "/v1/groups/{name}", operation_id = "dropGroup", tag = "groups",
    params(("name" = String, Path, description = "The group's name"), DropQuery),
    responses((status = 200, description = "Dropped", body = DroppedGroup),
        (status = 400, description = "A bad name or parameter", body = Problem, content_type = "application/problem+json"),
        crate::front::body::AuthProblems,
        (status = 404, description = "No such group", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store cannot take the change now", body = Problem, content_type = "application/problem+json")))]
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
                "if_exists",
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
    match change(&api, move |c| c.admin().drop_group(&n, &who)).await {
        Ok(true) => typed(StatusCode::OK, &DroppedGroup { dropped: Some(name.to_string()) }),
        Ok(false) if if_exists => typed(StatusCode::OK, &DroppedGroup { dropped: None }),
        Ok(false) => admin_error(AdminError::NotFound(name.to_string())),
        Err(a) => a,
    }
}

fn node_of(n: crate::store::StoredNode) -> NodeSettings {
    NodeSettings {
        capacity: n.capacity,
        mode: if n.mode == tollgate_model::allocate::AllocationMode::Fcfs {
            crate::front::body::ModeName::Fcfs
        } else {
            crate::front::body::ModeName::Share
        },
        slow_start: n.slow_start,
        shadow: n.shadow,
        throttling: n.throttling,
    }
}

/// The node settings.
#[utoipa::path(get, path = "/v1/node", operation_id = "getNode", tag = "node",
    responses((status = 200, description = "The node settings", body = NodeSettings),
        crate::front::body::AuthProblems))]
async fn node(State(api): State<Api>) -> Answer {
    typed(StatusCode::OK, &node_of(api.node.controller.admin().node()))
}

/// Changes the node settings the body gives.
#[utoipa::path(patch, path = "/v1/node", operation_id = "alterNode", tag = "node", request_body = NodeBody,
    responses((status = 200, description = "Changed", body = NodeSettings),
        crate::front::body::AuthProblems,
        crate::front::body::ChangeProblems))]
async fn set_node(State(api): State<Api>, ext: axum::http::Extensions, body: String) -> Answer {
    let b: NodeBody = match parse(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let change_set = crate::store::NodeChange {
        capacity: match b.capacity {
            Patch::Absent => None,
            Patch::Null => Some(None),
            Patch::Value(c) => Some(Some(c)),
        },
        mode: b.mode.map(|m| match m {
            crate::front::body::ModeName::Share => tollgate_model::allocate::AllocationMode::Share,
            crate::front::body::ModeName::Fcfs => tollgate_model::allocate::AllocationMode::Fcfs,
        }),
        slow_start: b.slow_start,
        shadow: b.shadow,
        throttling: b.throttling,
    };
    let who = who(&ext);
    match change(&api, move |c| c.admin().change_node(change_set, &who)).await {
        Ok(n) => typed(StatusCode::OK, &node_of(n)),
        Err(a) => a,
    }
}

/// Every group's target, admitted rate, demand and clients, as `/status`.
#[utoipa::path(get, path = "/v1/status", operation_id = "getStatus", tag = "node", params(StatusQuery),
    responses((status = 200, description = "The status (docs/operations.md, \"Status\")", body = crate::front::schema::Status),
        (status = 400, description = "A bad parameter", body = Problem, content_type = "application/problem+json"),
        crate::front::body::AuthProblems))]
async fn status(State(api): State<Api>, axum::extract::RawQuery(query): axum::extract::RawQuery) -> Answer {
    match crate::observe::status::page_query(query.as_deref()) {
        Ok(page) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            crate::observe::status::status_body(api.node.clone(), api.clock.now(), page).await,
        )
            .into_response(),
        Err(e) => refuse(StatusCode::BAD_REQUEST, "", e),
    }
}

/// The group's handle on this server's client, and its name (checked), for a check or a charge of
/// `units` (named `field`): the group named or else the token's default
/// group, a name and a number that keep the rules, a token allowed the group; the first grant
/// waited for.
pub(crate) async fn admission_handle(
    gate: &Tollgate,
    ext: &axum::http::Extensions,
    named: Option<&str>,
    field: &str,
    units: f64,
) -> Result<(tollgate_limiter::GroupHandle, tollgate_model::settings::GroupName), Answer> {
    let group = match (named, ext.get::<Caller>()) {
        (Some(g), _) => std::borrow::Cow::Borrowed(g),
        (None, Some(Caller(c))) => c
            .group_or_default(None)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, "group", e.strip_prefix("group: ").unwrap_or(&e)))?,
        (None, None) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "group",
                "missing: name the group (a token with a default group may leave it out)",
            ));
        }
    };
    let group = &*group;
    let name = checked_name("group", group)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "group", e.strip_prefix("group: ").unwrap_or(&e)))?;
    if !(0.0..=CHECK_COST_MAX).contains(&units) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            field,
            format!("must be from 0 to {CHECK_COST_MAX:e}, got {units}"),
        ));
    }
    if let Some(Caller(c)) = ext.get::<Caller>()
        && !c.allows_group(name.as_str())
    {
        let refused = crate::access::auth::Refused::Group {
            who: c.label(),
            group: group.to_owned(),
            patterns: c.groups.clone(),
        };
        return Err(refuse(StatusCode::FORBIDDEN, "group", refused));
    }
    let handle = gate.group(name.as_str()).map_err(|e| refuse(StatusCode::BAD_REQUEST, "group", e))?;
    crate::front::rls::wait_for_first_grant(&handle).await;
    Ok((handle, name))
}

/// Charges work already done, whose cost was known only once it ended (an answer's tokens, a
/// response's bytes): never refused for the group's limit, into debt when the group has no
/// more; or, with `refund`, gives units back. Debt is paid back from the group's refill over
/// its repay period, so later checks wait for it.
#[utoipa::path(post, path = "/v1/charge", operation_id = "charge", tag = "admission", request_body = ChargeBody,
    responses((status = 200, description = "Charged (or refunded)", body = Charged),
        (status = 400, description = "A field breaks a rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or one refused", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A token not allowed this group", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "This controller follows another", body = Problem, content_type = "application/problem+json")))]
async fn charge(State(api): State<Api>, ext: axum::http::Extensions, body: axum::body::Bytes) -> Answer {
    let b: ChargeBody = match parse_flat(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let (handle, group) = match admission_handle(&api.gate, &ext, b.group.as_deref(), "units", b.units).await
    {
        Ok(h) => h,
        Err(a) => return a,
    };
    if !b.refund
        && let Some(Err(rule)) = api
            .node
            .controller
            .admin()
            .with_settings(&group, |s| api.charges.check(group.as_str(), Some(s), b.units))
    {
        return refuse(StatusCode::BAD_REQUEST, "units", rule);
    }
    let done = if b.refund { handle.refund(b.units) } else { handle.charge(b.units) };
    if let Err(e) = done {
        return refuse(StatusCode::BAD_REQUEST, "units", e);
    }
    let charged = if b.refund { -b.units } else { b.units };
    typed_flat(
        StatusCode::OK,
        &Charged { charged, group: group.to_string(), remaining: handle.available().floor() },
    )
}

/// Admits `cost` units of the group's work now, or says when to try again. Answers carry the
/// IETF's `RateLimit-Policy` and `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers).
#[utoipa::path(post, path = "/v1/check", operation_id = "check", tag = "admission", request_body = CheckBody,
    responses((status = 200, description = "Admitted", body = Admitted),
        (status = 400, description = "A field breaks a rule", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or one refused", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A token not allowed this group", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Refused for now; Retry-After says when to try again", body = Refused),
        (status = 503, description = "This controller follows another", body = Problem, content_type = "application/problem+json")))]
async fn check(State(api): State<Api>, ext: axum::http::Extensions, body: axum::body::Bytes) -> Answer {
    let b: CheckBody = match parse_flat(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let cost = b.cost;
    let gate = match gate_for(&api.gate, &ext, b.unthrottled) {
        Ok(g) => g,
        Err(a) => return a,
    };
    let (handle, group) = match admission_handle(&gate, &ext, b.group.as_deref(), "cost", cost).await {
        Ok(h) => h,
        Err(a) => return a,
    };
    match admit_or_answer(&handle, group.as_str(), cost, b.class.class()).await {
        Ok(permit) => {
            drop(permit);
            let remaining = crate::front::rls::units_left(&handle).floor();
            let mut a =
                typed_flat(StatusCode::OK, &Admitted { admitted: true, group: group.to_string(), remaining });
            rate_limit_headers(&mut a, &handle, remaining, None);
            a
        }
        Err(a) => a,
    }
}

/// The client to admit through: `gate`, or its unthrottled view when `unthrottled` is asked
/// for by a caller that may (no `--auth`, an admin token, or a client token with the
/// `unthrottled` privilege).
pub(crate) fn gate_for(
    gate: &Tollgate,
    ext: &axum::http::Extensions,
    unthrottled: bool,
) -> Result<Tollgate, Answer> {
    if !unthrottled {
        return Ok(gate.clone());
    }
    match ext.get::<Caller>() {
        Some(Caller(c)) if !(c.unthrottled || c.role == Ok(crate::access::auth::Role::Admin)) => Err(refuse(
            StatusCode::FORBIDDEN,
            "unthrottled",
            format!(
                "the token {} lacks the unthrottled privilege (`tollgate token create --role client --unthrottled`)",
                c.label()
            ),
        )),
        _ => Ok(gate.unthrottled()),
    }
}

/// Admits `cost` units of `group`'s work in `class` through `handle` (waiting a moment for an
/// allotment, as [`crate::front::rls::admit_now`] does), or the answer refusing it: 429 with
/// `Retry-After`, or 400 for a cost the group can never admit.
pub(crate) async fn admit_or_answer<'h>(
    handle: &'h tollgate_limiter::GroupHandle,
    group: &str,
    cost: f64,
    class: tollgate_limiter::RequestClass,
) -> Result<tollgate_limiter::Permit<'h>, Answer> {
    match crate::front::rls::admit_now(handle, cost, class).await {
        Ok(permit) => Ok(permit),
        Err(AcquireError::Throttled { retry_after, .. }) => {
            let mut a = retry(group, retry_after);
            rate_limit_headers(&mut a, handle, 0.0, Some(retry_after));
            Err(a)
        }
        Err(AcquireError::NeverAdmissible { burst, .. }) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "cost",
            format!("{cost} units can never be admitted: the group's burst holds at most {burst}"),
        )),
        Err(e) => Err(refuse(StatusCode::BAD_REQUEST, "", e)),
    }
}

/// The IETF draft's headers: `RateLimit-Policy: "grant";q=RATE;w=1` (the rate this server holds
/// for the group, units a second) and `RateLimit: "grant";r=LEFT;t=SECONDS` (units left now,
/// and seconds until more).
pub(crate) fn rate_limit_headers(
    a: &mut Answer,
    handle: &tollgate_limiter::GroupHandle,
    left: f64,
    after: Option<Duration>,
) {
    let rate = handle.allowance();
    let policy = if rate.is_finite() {
        format!("\"grant\";q={};w=1", rate.max(0.0).floor() as u64)
    } else {
        "\"grant\";w=1".to_string()
    };
    let t = after.map_or(0, |d| d.as_secs_f64().ceil() as u64);
    let now = format!("\"grant\";r={};t={t}", left.max(0.0).floor() as u64);
    let pairs: [(&'static str, String); 2] = [("ratelimit-policy", policy), ("ratelimit", now)];
    for (name, value) in pairs {
        // The text itself becomes the header's value, not a copy of it.
        if let Ok(v) = axum::http::HeaderValue::try_from(value) {
            a.headers_mut().insert(name, v);
        }
    }
}

pub(crate) fn retry(group: &str, after: Duration) -> Answer {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut a = typed(
        StatusCode::TOO_MANY_REQUESTS,
        &Refused { admitted: false, group: group.to_string(), retry_after_ms: ms },
    );
    let secs = ms.div_ceil(1000).to_string();
    if let Ok(v) = axum::http::HeaderValue::from_str(&secs) {
        a.headers_mut().insert(header::RETRY_AFTER, v);
    }
    a
}
