//! The HTTP front end: Prometheus `/metrics`, `/healthz`, and `/status` as JSON.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::clock::Clock;
use crate::controller::PutMode;
use crate::convert;
use crate::error::AdminError;
use crate::front::grpc::checked_name;
use crate::front::guard::{Front, http_guard};
use crate::front::properties;
use crate::node::Node;
use crate::observe::status::Latency;
use serde_json::{Value, json};
use utoipa::OpenApi;

#[derive(Clone)]
struct AppState {
    node: Node,
    clock: Clock,
    /// What `/metrics` encodes.
    registry: Arc<prometheus_client::registry::Registry>,
}

/// The HTTP routes, behind the same checks as gRPC calls (see [`crate::front::guard`]).
pub fn router(
    node: Node,
    latency: Arc<Latency>,
    history: Arc<crate::observe::history::History>,
    clock: Clock,
    front: Front,
    gate: tollgate_limiter::Tollgate,
    holds: Arc<crate::front::holds::Holds>,
) -> Router {
    let (metrics_groups, charges) = (front.metrics_groups, front.charge_bound);
    let guard = axum::middleware::from_fn_with_state((node.access.clone(), front), http_guard);
    let api = crate::front::api::router(node.clone(), clock, gate.clone(), charges)
        .merge(crate::front::permits::router(clock, gate.clone(), holds));
    let dashboard = crate::front::dashboard::router(node.clone(), history, clock);
    let routes = Router::new()
        .route("/healthz", get(health))
        .route("/v1/openapi.json", get(openapi))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/v1/node/properties", get(node_properties).put(set_node_properties))
        .route("/v1/groups/{name}/properties", get(group_properties).put(set_group_properties))
        .with_state(AppState {
            registry: Arc::new(crate::observe::metrics::registry(
                &node,
                clock,
                &latency,
                gate,
                metrics_groups,
            )),
            node,
            clock,
        })
        .merge(api)
        .merge(dashboard)
        .fallback(crate::front::api::no_route);
    // Around the routes as a whole (a router's layers wrap each route's methods apart, before
    // the route has set a 405's `Allow`).
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn(crate::front::api::method_problem))
        .layer(DefaultBodyLimit::max(
            crate::front::properties::PROPERTIES_MAX_BYTES.max(crate::front::api::BODY_MAX_BYTES),
        ))
        .layer(guard)
}

/// `/metrics`, written a chunk at a time on the blocking pool: at 100,000 groups it is about
/// a hundred megabytes of text, and the runtime's workers stay free to answer exchanges
/// meanwhile.
async fn metrics(State(app): State<AppState>, headers: axum::http::HeaderMap) -> axum::response::Response {
    use tollgate_model::prometheus::{CLASSIC_CONTENT_TYPE, CONTENT_TYPE, Classic, wants_openmetrics};
    let registry = app.registry.clone();
    let open = wants_openmetrics(headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()));
    let body = crate::front::stream::body(move |out| {
        let encoded = if open {
            prometheus_client::encoding::text::encode(out, &registry)
        } else {
            let mut classic = Classic::new(out);
            prometheus_client::encoding::text::encode(&mut classic, &registry)
                .and_then(|()| classic.finish().map(drop))
        };
        encoded.map_err(|_| crate::front::stream::Gone)
    })
    .await;
    ([(header::CONTENT_TYPE, if open { CONTENT_TYPE } else { CLASSIC_CONTENT_TYPE })], body).into_response()
}

/// `ok`, or 503 with what is wrong: the settings store cannot take writes (a full disk), so
/// settings changes fail until it can; exchanges are still answered.
async fn health(State(app): State<AppState>) -> axum::response::Response {
    match app.node.controller.readings().store_health() {
        None => "ok\n".into_response(),
        Some(reason) => {
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("store: {reason}\n")).into_response()
        }
    }
}

/// `ready`, or 503 with why not: the store cannot take writes, this controller follows and
/// knows no leader (etcd is out of reach, or an election is under way), or it grants and is
/// still in its learning lease (the first lease after a start or an election).
async fn ready(State(app): State<AppState>) -> axum::response::Response {
    if let Some(reason) = app.node.controller.readings().store_health() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("store: {reason}\n")).into_response();
    }
    let role = app.node.cluster.role();
    if role.role == crate::cluster::role::Role::Follower && role.leader.is_none() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no leader: an election is under way or etcd is out of reach\n",
        )
            .into_response();
    }
    if role.role != crate::cluster::role::Role::Follower
        && let Some(left) = app.node.controller.readings().learning_left(app.clock.now())
    {
        let body = format!("learning: relearning what clients hold, {} ms left\n", left.as_millis().max(1));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    // Ready, whatever the files: the settings in force serve. A file refused says so.
    let mut body = String::from("ready\n");
    for f in app.node.files.status() {
        if let Some(why) = f.rejected {
            body.push_str(&format!(
                "settings file {} rejected (revision {} stays in force):\n{why}\n",
                f.path,
                f.revision.as_deref().unwrap_or("none")
            ));
        }
    }
    body.into_response()
}

/// `/status`: every group, written a chunk at a time; `?limit=N` (at most 10,000) gives one
/// page, and `page_token` (the last page's `next_page_token`) the one after.
async fn status(
    State(app): State<AppState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    match crate::observe::status::page_query(query.as_deref()) {
        Ok(page) => (
            [(header::CONTENT_TYPE, "application/json")],
            crate::observe::status::status_body(app.node.clone(), app.clock.now(), page).await,
        )
            .into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// A JSON answer.
fn json(status: StatusCode, body: String) -> axum::response::Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error as JSON, `{"error": "…"}`, with the status it deserves.
fn error(status: StatusCode, message: impl Into<String>) -> axum::response::Response {
    let message = message.into();
    // "field: rule", where the message names a field, is a problem naming it.
    match message.split_once(": ") {
        Some((field, rule))
            if !field.is_empty()
                && field.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') =>
        {
            crate::front::api::refuse(status, field, rule)
        }
        _ => crate::front::api::refuse_whole(status, "", message),
    }
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
    f: impl FnOnce(&crate::controller::Controller) -> Result<T, AdminError> + Send + 'static,
) -> Result<T, axum::response::Response> {
    match crate::blocking::spawn(move || f(&app.node.controller)).await {
        Ok(r) => r.map_err(admin_error),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, format!("change failed: {e}"))),
    }
}

/// Who made a change over HTTP, for the audit log: the credential when there is one, and
/// the peer's address when known.
fn who(ext: &axum::http::Extensions) -> String {
    let addr = who_addr(ext);
    match ext.get::<crate::access::auth::Caller>() {
        Some(crate::access::auth::Caller(c)) => format!("{} {addr}", c.label()),
        None => addr,
    }
}

fn who_addr(ext: &axum::http::Extensions) -> String {
    match ext.get::<axum::extract::ConnectInfo<crate::front::listen::Peer>>().map(|c| c.0.addr) {
        Some(a) => format!("http {a}"),
        None => "http".to_string(),
    }
}

/// `GET /v1/node/properties`: Couchbase's node document.
#[utoipa::path(get, path = "/v1/node/properties", operation_id = "getNodeProperties", tag = "couchbase", responses((status = 200, description = "The node settings as Couchbase's JSON document", body = crate::front::schema::NodeProperties), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn node_properties(State(app): State<AppState>) -> axum::response::Response {
    json(StatusCode::OK, properties::node_json(&app.node.controller.admin().node()))
}

/// `PUT /v1/node/properties`: changes the keys the document gives.
#[utoipa::path(put, path = "/v1/node/properties", operation_id = "putNodeProperties", tag = "couchbase", request_body = crate::front::schema::NodeProperties, responses((status = 200, description = "The document after the change", body = crate::front::schema::NodeProperties), (status = 413, description = "The body is too large", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
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
    match change(app, move |controller| controller.admin().change_node(c, &who)).await {
        Ok(node) => json(StatusCode::OK, properties::node_json(&node)),
        Err(response) => response,
    }
}

/// `GET /v1/groups/NAME/properties`: Couchbase's group document.
#[utoipa::path(get, path = "/v1/groups/{name}/properties", operation_id = "getGroupProperties", tag = "couchbase", params(("name" = String, Path, description = "The group's name")), responses((status = 200, description = "The group as Couchbase's JSON document", body = crate::front::schema::GroupProperties), (status = 404, description = "No such group", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn group_properties(State(app): State<AppState>, Path(name): Path<String>) -> axum::response::Response {
    let name = match checked_name("name", &name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match app.node.controller.admin().group(&name) {
        Some(s) => json(StatusCode::OK, properties::group_json(&convert::settings_to_proto(&s))),
        None => admin_error(AdminError::NotFound(name.to_string())),
    }
}

/// `PUT /v1/groups/NAME/properties`: creates the group or changes the keys the document gives.
#[utoipa::path(put, path = "/v1/groups/{name}/properties", operation_id = "putGroupProperties", tag = "couchbase", params(("name" = String, Path, description = "The group's name")), request_body = crate::front::schema::GroupProperties, responses((status = 200, description = "The document after the change; the group is made if it did not exist", body = crate::front::schema::GroupProperties), (status = 413, description = "The body is too large", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 400, description = "A bad parameter or body", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"), (status = 403, description = "A token whose role does not cover it", body = crate::front::body::Problem, content_type = "application/problem+json")))]
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
    let current = app.node.controller.admin().group(&name).map(|s| convert::settings_to_proto(&s));
    let patch = match properties::group_patch(&body, current.as_ref()) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match change(app, move |c| {
        c.admin().put_group(name, &patch, PutMode::Upsert, &who, crate::clock::wall_ms())
    })
    .await
    {
        Ok(s) => json(StatusCode::OK, properties::group_json(&convert::settings_to_proto(&s))),
        Err(response) => response,
    }
}

/// The OpenAPI document of the HTTP API, generated from the handlers' annotations (here, in
/// [`crate::front::api`] and in [`crate::front::dashboard`]) and [`crate::front::body`]'s types.
///
/// Its title names the HTTP API rather than the project: generators name the client they make
/// after it (openapi-python-client: `tollgate-http-api-client`), which must not take the name
/// of the official Python client's distribution, `tollgate-client`.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate HTTP API",
        description = "Tollgate's HTTP API: groups, the node, status and admission checks."
    ),
    paths(
        crate::front::api::list,
        crate::front::api::show,
        crate::front::api::create,
        crate::front::api::upsert,
        crate::front::api::alter,
        crate::front::api::drop_group,
        crate::front::api::node,
        crate::front::api::set_node,
        crate::front::api::status,
        crate::front::api::check,
        crate::front::api::charge,
        crate::front::permits::acquire,
        crate::front::permits::release,
        crate::front::permits::renew,
        openapi,
        crate::front::dashboard::overview,
        crate::front::dashboard::group,
        node_properties,
        set_node_properties,
        group_properties,
        set_group_properties
    ),
    components(schemas(crate::front::body::Problem))
)]
pub struct ApiDoc;

/// The OpenAPI 3.1 document; with `auth`, every operation asks for a bearer token.
pub fn openapi_document(auth: bool) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
    doc["openapi"] = json!("3.1.0");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    if auth {
        doc["components"]["securitySchemes"] = json!({ "bearer": { "type": "http", "scheme": "bearer" } });
        doc["security"] = json!([{ "bearer": [] }]);
    }
    doc
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", operation_id = "getOpenApi", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
async fn openapi(State(app): State<AppState>) -> axum::response::Response {
    crate::front::api::answer(StatusCode::OK, openapi_document(app.node.access.auth_required()))
}
