//! The shapes of the JSON answers that are written field by field elsewhere (the status, the
//! dashboard's data, Couchbase's property documents), as types the OpenAPI document's schemas
//! are made from. Every object is closed (`additionalProperties: false`), so a field added to
//! an answer and not here fails the test that validates real answers against the document
//! (tests/openapi).

// These types are never built: they describe answers for the document only.
#![allow(dead_code)]

use serde::Serialize;
use utoipa::ToSchema;

use crate::front::body::{GroupSettings, LimitValue, ModeName};

/// A consumption rate's low and high water marks and average, units/s.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateMarks {
    low: f64,
    high: f64,
    average: f64,
}

/// One request class's requests in a group.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClassCount {
    admitted: u64,
    throttled: u64,
}

/// A group's requests by request class.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ByClass {
    critical: ClassCount,
    normal: ClassCount,
    sheddable: ClassCount,
}

/// What a group's requests did in detail, as clients reported it (TiDB's consumption).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Consumption {
    rru: f64,
    wru: f64,
    read_bytes: f64,
    write_bytes: f64,
    cpu_ms: f64,
    read_rpcs: f64,
    write_rpcs: f64,
}

/// One group in the status.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupStatus {
    name: String,
    /// What one unit counts under the node's cost model.
    unit: String,
    /// `null` for a group seen only through traffic.
    settings: Option<GroupSettings>,
    /// Units/s it is held to; `null` when not throttled.
    target: Option<f64>,
    /// Units/s consumed over the last tick.
    admitted: f64,
    throttled: f64,
    granted: f64,
    demand: f64,
    unthrottled: f64,
    busy: bool,
    headroom: Option<f64>,
    clients: u32,
    consumed_total: f64,
    admitted_total: u64,
    throttled_total: u64,
    waited_total: u64,
    blocked_total: u64,
    /// Requests admitted in shadow mode that would have been refused.
    would_refuse_total: u64,
    /// Requests its clients hold in flight, in a group with an in-flight quota; `null`
    /// without one.
    in_flight: Option<u64>,
    /// Requests admitted and refused by request class, since the controller first saw a
    /// critical or sheddable one in the group; `null` before.
    by_class: Option<ByClass>,
    budget_exhausted: bool,
    ramp_pool: Option<f64>,
    last_minute: Option<RateMarks>,
    last_hour: Option<RateMarks>,
    /// The cost of the largest single request its clients admitted over the last minute (0:
    /// none told).
    largest_last_minute: f64,
    /// The same over the last hour.
    largest_last_hour: f64,
    detail: Option<Consumption>,
}

/// A client token's marks, as the controller it exchanges with keeps them.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenStatus {
    id: String,
    /// Its id, role and name.
    label: String,
    /// Units consumed since this controller first heard of the token.
    consumed_total: f64,
    admitted_total: u64,
    /// Requests refused for want of tokens.
    throttled_total: u64,
    /// Its consumption rate's marks, units/s; null before its second exchange.
    last_minute: Option<RateMarks>,
    last_hour: Option<RateMarks>,
    /// The cost of its largest single request over the last minute and the last hour.
    largest_last_minute: f64,
    largest_last_hour: f64,
}

/// A group's load on a backend.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupLoad {
    group: String,
    load: f64,
}

/// A backend as its last report showed it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackendStatus {
    name: String,
    zone: String,
    /// 1 is at its target.
    utilisation: f64,
    limiting: bool,
    seen_s: f64,
    load: f64,
    top_groups: Vec<GroupLoad>,
    /// Saturated yet limiting no group, and why; `null` otherwise.
    inert: Option<String>,
}

/// One of a client's grants.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientGrant {
    group: String,
    rate: f64,
    burst: f64,
}

/// A client as the controller sees it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientStatus {
    client_id: String,
    seen_s: f64,
    lapsed: bool,
    groups: u32,
    unlimited_groups: u32,
    granted: f64,
    top_grants: Vec<ClientGrant>,
}

/// The controller's status: the node, its role, its clients and backends, and a page of groups.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Status {
    capacity: Option<f64>,
    mode: ModeName,
    /// Every group in shadow mode.
    shadow: bool,
    /// `on`, or `off` while the one switch has turned throttling off.
    throttling: String,
    exchanges: u64,
    learning: bool,
    /// `standalone`, `leader` or `follower`; with the groups sharded (`--shards`), `owner` for
    /// a controller that does not lead (it computes its own shards' groups).
    role: String,
    leader: Option<String>,
    leader_changes: u64,
    /// The region this controller serves (`tollgate server --region`); null on the global tier.
    region: Option<String>,
    /// In a region: its shares decay, the global tier not having answered within a grant's
    /// lease.
    upstream_safe_mode: bool,
    clients: u64,
    backends: u64,
    clients_lapsed: u64,
    backend_detail: Vec<BackendStatus>,
    client_detail: Vec<ClientStatus>,
    others_granted: f64,
    cost_model: String,
    unit: String,
    warnings: Vec<String>,
    /// The files the server follows (`--config`, `--import`) and what became of each.
    settings_files: Vec<SettingsFile>,
    /// What answers each rate-limit domain: imported trees or rules, and how many.
    domains: Vec<DomainRules>,
    /// Where the implicit `tenant=X` to group `X` rule still applies.
    implicit_tenant_rule: String,
    /// With authentication: the client tokens that exchanged with this controller, the most
    /// consumed first (at most 100).
    tokens: Vec<TokenStatus>,
    groups: Vec<GroupStatus>,
    /// The next page's token; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_page_token: Option<String>,
}

/// A file the server follows and what became of its last reading.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsFile {
    path: String,
    /// `config`, `envoy-ratelimit` or `limitador`.
    kind: String,
    /// The revision in force (a hash of the text applied); absent until one is.
    revision: Option<String>,
    /// Why the file as it is now is refused, with its lines (the revision in force stays);
    /// absent otherwise.
    rejected: Option<String>,
    /// Revisions applied since the controller started.
    applied: u64,
}

/// What answers one rate-limit domain.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DomainRules {
    domain: String,
    /// `envoy/ratelimit descriptor tree`, `Limitador limits` or `rules`.
    answered_by: String,
    /// Its limits (a tree's or Limitador's) or rules.
    count: u32,
}

/// Couchbase's node document.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeProperties {
    /// Units/s, or `"unlimited"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<LimitValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<ModeName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slow_start: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    throttling: Option<bool>,
}

/// Couchbase's group document.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupProperties {
    /// Units/s, or `"unlimited"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved: Option<LimitValue>,
    /// Units/s, or `"unlimited"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    hard_limit: Option<LimitValue>,
}

/// A run of samples, one a second: `t` holds their times (Unix seconds),
/// and each other field one value per sample.
#[derive(Serialize, ToSchema)]
pub(crate) struct Series {
    /// The number of the first sample.
    from: u64,
    t: Vec<f64>,
    #[serde(flatten)]
    #[schema(additional_properties)]
    values: std::collections::BTreeMap<String, Vec<Option<f64>>>,
}

/// A group as a dashboard row shows it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DashboardRow {
    name: String,
    /// `null` for a group seen only in traffic.
    reserved: Option<f64>,
    limit: Option<LimitValue>,
    target: Option<f64>,
    admitted: f64,
    demand: f64,
    throttled: f64,
    clients: u32,
    busy: bool,
    budget_exhausted: bool,
    configured: bool,
    /// Its own settings put it in shadow mode.
    shadow: bool,
    /// Requests admitted in shadow mode that would have been refused.
    would_refuse_total: u64,
    /// Requests its clients hold in flight; `null` without an in-flight quota.
    in_flight: Option<u64>,
    /// Its in-flight quota; `null` without one.
    max_in_flight: Option<u32>,
    /// The cost of the largest single request its clients admitted over the last minute and
    /// the last hour (0: none told).
    largest_last_minute: f64,
    largest_last_hour: f64,
}

/// The node as the dashboard shows it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DashboardNode {
    capacity: Option<f64>,
    mode: ModeName,
    role: String,
    leader: Option<String>,
    /// The region this controller serves; null on the global tier.
    region: Option<String>,
    learning: bool,
    /// Every group in shadow mode.
    shadow: bool,
    /// `false` while the one switch has turned throttling off.
    throttling: bool,
    exchanges: u64,
    groups: u64,
    clients: u64,
    backends: u64,
    admitted: f64,
    demand: f64,
    unit: String,
    warnings: Vec<String>,
}

/// A charted group: its row now, and its samples.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Chart {
    now: DashboardRow,
    series: Option<Series>,
}

/// Backends and clients, the most telling first.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Diagnostics {
    backends: Vec<BackendStatus>,
    backends_total: u64,
    clients: Vec<ClientStatus>,
    clients_total: u64,
    clients_lapsed: u64,
    others_granted: f64,
}

/// The dashboard's data: the node, its samples, a page of groups, the charted groups.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Dashboard {
    /// The number of the next sample: the next call's `since`.
    next: u64,
    /// Samples kept.
    window: u64,
    node: DashboardNode,
    series: Series,
    groups: Vec<DashboardRow>,
    groups_matching: u64,
    page: u64,
    page_size: u64,
    /// The busiest groups' names, at most 12.
    busiest: Vec<String>,
    /// By group name.
    charts: std::collections::BTreeMap<String, Chart>,
    /// Names asked to be charted that are no group.
    unknown: Vec<String>,
    diagnostics: Diagnostics,
    /// With authentication: the client tokens' marks, the most consumed first (at most 100).
    tokens: Vec<TokenStatus>,
}

/// One group's page on the dashboard.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DashboardGroup {
    name: String,
    settings: Option<GroupSettings>,
    now: DashboardRow,
    /// The limiting rate from saturation, if any.
    limiting: Option<f64>,
    headroom: Option<f64>,
    share: Option<f64>,
    water_level: Option<f64>,
    granted: f64,
    consumed_total: f64,
    next: u64,
    series: Option<Series>,
}
