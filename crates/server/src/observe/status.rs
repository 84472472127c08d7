//! What the controller shows: the status in the contract's form and as JSON, and the exchange
//! latency histogram. `Admin.Status`, `GET /status`, `tollgate status` and `/metrics` all read
//! from here.

use std::time::Duration;

use tollgate_model::time::Nanos;
use tollgate_proto::v1;

use crate::convert;
use crate::node::Node;

/// Upper bounds of the exchange-latency histogram buckets, in seconds.
pub const BUCKETS_S: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0];

/// The exchange-latency histogram (prometheus-client's), updated by the exchange handler and
/// read by `/metrics`.
#[derive(Debug, Clone)]
pub struct Latency(pub(crate) prometheus_client::metrics::histogram::Histogram);

impl Default for Latency {
    fn default() -> Self {
        Self(prometheus_client::metrics::histogram::Histogram::new(BUCKETS_S))
    }
}

impl Latency {
    /// Records one exchange's handling time.
    pub fn record(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

/// The largest page of groups an answer carries.
pub const PAGE_MAX: usize = 10_000;
/// A page's size when the request gives none.
pub const PAGE_DEFAULT: usize = 1000;

/// Which groups an answer carries: those after `after`, at most `size`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// At most this many (0: all).
    pub size: usize,
    /// The last name of the page before (empty: from the start).
    pub after: String,
}

impl Page {
    /// The page a request asks for, or the rule it breaks.
    pub fn of(page_size: u32, page_token: &str) -> Result<Page, String> {
        let size = match page_size as usize {
            0 => PAGE_DEFAULT,
            n if n > PAGE_MAX => return Err(format!("page_size: at most {PAGE_MAX}, got {n}")),
            n => n,
        };
        Ok(Page { size, after: page_token.to_string() })
    }

    /// The items of `sorted` (by `name`) on this page, and the next page's token.
    pub fn take<'a, T>(&self, sorted: &'a [T], name: impl Fn(&T) -> &str) -> (&'a [T], String) {
        let start = if self.after.is_empty() {
            0
        } else {
            sorted.partition_point(|t| name(t) <= self.after.as_str())
        };
        let end =
            if self.size == 0 { sorted.len() } else { start.saturating_add(self.size).min(sorted.len()) };
        let next = if end < sorted.len() && end > start {
            name(&sorted[end - 1]).to_string()
        } else {
            String::new()
        };
        (&sorted[start..end], next)
    }
}

/// The page an HTTP query asks for (`limit`, `page_token`): every group when it gives none.
pub(crate) fn page_query(query: Option<&str>) -> Result<Page, String> {
    let mut page = Page::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).ok_or_else(|| format!("{key}: not valid percent-encoded UTF-8"))?;
        match key {
            "limit" => {
                page.size = match value.parse::<usize>() {
                    Ok(n) if (1..=PAGE_MAX).contains(&n) => n,
                    _ => {
                        return Err(format!(
                            "limit: must be a whole number from 1 to {PAGE_MAX}, got {value:?}"
                        ));
                    }
                }
            }
            "page_token" => page.after = value,
            other => return Err(format!("{other}: unknown parameter; expected limit and page_token")),
        }
    }
    Ok(page)
}

/// `%XX` and `+` decoded.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// The controller's status in the contract's form, with one page of its groups.
pub fn status_response(node: &Node, now: Nanos, page: &Page) -> v1::StatusResponse {
    let view = node.controller.readings().view();
    let (groups, next_page_token) = page.take(&view, |g| g.name.as_str());
    let peaks = node.peaks.groups(now);
    v1::StatusResponse {
        groups: groups.iter().map(|g| group_status(g, &peaks)).collect(),
        next_page_token,
        ..status_head(node, now)
    }
}

/// The status as JSON, written a chunk at a time (at 100,000 groups it is tens of megabytes):
/// the node, then one page of the groups (every group with a page of size 0) and, when more
/// follow, `next_page_token`.
pub(crate) async fn status_body(node: Node, now: Nanos, page: Page) -> axum::body::Body {
    crate::front::stream::body(move |out| {
        let head = status_head(&node, now);
        let view = node.controller.readings().view();
        let (groups, next) = page.take(&view, |g| g.name.as_str());
        let peaks = node.peaks.groups(now);
        let mut json = status_json(&head);
        if let Some(o) = json.as_object_mut() {
            o.remove("groups");
            if !next.is_empty() {
                o.insert("next_page_token".into(), next.into());
            }
        }
        out.object_with_array(
            json,
            "groups",
            groups.iter().map(|g| group_json(&group_status(g, &peaks), &head.unit)),
        )
    })
    .await
}

/// Everything in the status but its groups.
fn status_head(parts: &Node, now: Nanos) -> v1::StatusResponse {
    let controller = &parts.controller;
    let node = controller.admin().node();
    let (clients, backends, learning) = controller.readings().tracking(now);
    let diagnostics = controller.readings().diagnostics(now);
    let role = parts.cluster.role();
    v1::StatusResponse {
        // With the groups sharded, a controller that does not lead computes its own shards'
        // groups: its status is its own, not a follower's.
        role: match role.role {
            crate::cluster::role::Role::Follower if parts.cluster.sharding().is_some() => "owner".to_string(),
            r => r.name().to_string(),
        },
        leader: role.leader,
        leader_changes: parts.cluster.leader_changes(),
        capacity: node.capacity,
        groups: Vec::new(),
        exchanges: controller.readings().exchanges(),
        mode: convert::mode_to_proto(node.mode) as i32,
        learning,
        clients: clients as u64,
        backends: backends as u64,
        next_page_token: String::new(),
        backend_detail: diagnostics.backends.iter().map(backend_to_proto).collect(),
        client_detail: diagnostics.clients.iter().map(client_to_proto).collect(),
        clients_lapsed: diagnostics.clients_lapsed as u64,
        others_granted: diagnostics.others_granted,
        cost_model: controller.admin().cost_model().name().to_string(),
        unit: controller.admin().cost_model().unit().to_string(),
        warnings: controller.admin().warnings(),
        shadow: node.shadow,
        throttling_off: !node.throttling,
        region: parts.cluster.upstream_status().region(),
        upstream_safe_mode: parts
            .cluster
            .upstream_status()
            .safe_mode
            .load(std::sync::atomic::Ordering::Relaxed),
        settings_files: parts
            .files
            .status()
            .into_iter()
            .map(|f| v1::SettingsFileStatus {
                path: f.path,
                kind: f.kind.to_string(),
                revision: f.revision.unwrap_or_default(),
                rejected: f.rejected.unwrap_or_default(),
                applied: f.applied,
            })
            .collect(),
        domains: domains(&parts.rls_rules.get()),
        rules_everywhere: parts.rls_rules.get().rules.iter().any(|r| r.domain.is_empty()),
        tokens: parts
            .peaks
            .tokens(now, crate::controller::DIAGNOSTICS_SHOWN_MAX)
            .iter()
            .map(token_status)
            .collect(),
    }
}

/// A client token's marks in the contract's form.
pub(crate) fn token_status(t: &crate::observe::peaks::TokenPeaks) -> v1::TokenStatus {
    v1::TokenStatus {
        id: t.id.clone(),
        label: t.label.clone(),
        consumed_total: t.consumed_total,
        admitted_total: t.admitted_total,
        throttled_total: t.throttled_total,
        last_minute: t.last_minute.map(marks_to_proto),
        last_hour: t.last_hour.map(marks_to_proto),
        largest_last_minute: t.largest.0,
        largest_last_hour: t.largest.1,
    }
}

/// A client token as the status's JSON shows it.
pub(crate) fn token_json(t: &v1::TokenStatus) -> serde_json::Value {
    serde_json::json!({
        "id": t.id,
        "label": t.label,
        "consumed_total": t.consumed_total,
        "admitted_total": t.admitted_total,
        "throttled_total": t.throttled_total,
        "last_minute": marks_json(t.last_minute.as_ref()),
        "last_hour": marks_json(t.last_hour.as_ref()),
        "largest_last_minute": t.largest_last_minute,
        "largest_last_hour": t.largest_last_hour,
    })
}

/// What answers each domain an imported file or a rule names.
fn domains(set: &tollgate_model::rls::RuleSet) -> Vec<v1::DomainRules> {
    let mut out: Vec<v1::DomainRules> = set
        .trees
        .iter()
        .map(|t| v1::DomainRules {
            domain: t.domain.clone(),
            answered_by: "envoy/ratelimit descriptor tree".into(),
            count: u32::try_from(t.limits().len()).unwrap_or(u32::MAX),
        })
        .chain(set.limits.iter().map(|l| v1::DomainRules {
            domain: l.domain.clone(),
            answered_by: "Limitador limits".into(),
            count: u32::try_from(l.limits.len()).unwrap_or(u32::MAX),
        }))
        .collect();
    for r in set.rules.iter().filter(|r| !r.domain.is_empty()) {
        if set.tree(&r.domain).is_some() || set.limit_set(&r.domain).is_some() {
            continue;
        }
        match out.iter_mut().find(|d| d.domain == r.domain) {
            Some(d) => d.count += 1,
            None => {
                out.push(v1::DomainRules { domain: r.domain.clone(), answered_by: "rules".into(), count: 1 })
            }
        }
    }
    out.sort_by(|a, b| a.domain.cmp(&b.domain));
    out
}

/// One group in the contract's form.
fn group_status(
    g: &tollgate_model::engine::GroupView,
    peaks: &std::collections::HashMap<String, (f64, f64)>,
) -> v1::GroupStatus {
    let (largest_last_minute, largest_last_hour) = peaks.get(g.name.as_str()).copied().unwrap_or_default();
    v1::GroupStatus {
        largest_last_minute,
        largest_last_hour,
        name: g.name.to_string(),
        settings: g.settings.as_ref().map(convert::settings_to_proto),
        target: g.target,
        admitted: g.admitted,
        demand: g.demand,
        busy: g.busy,
        headroom: g.headroom,
        clients: g.clients,
        throttled: g.throttled,
        granted: g.granted,
        unthrottled: g.unthrottled,
        consumed_total: g.meter.consumed,
        admitted_total: g.meter.admitted,
        throttled_total: g.meter.throttled,
        budget_exhausted: g.budget_exhausted,
        ramp_pool: g.ramp_pool,
        waited_total: g.meter.waited,
        would_refuse_total: g.meter.would_refuse,
        in_flight: g.in_flight.map(|f| f.held),
        by_class: g.by_class.map_or_else(Vec::new, |c| {
            tollgate_model::class::RequestClass::ALL
                .iter()
                .zip(c.0)
                .map(|(class, [admitted, throttled])| v1::ClassCounts {
                    request_class: class.name().to_string(),
                    admitted,
                    throttled,
                })
                .collect()
        }),
        last_minute: g.last_minute.map(marks_to_proto),
        last_hour: g.last_hour.map(marks_to_proto),
        detail: g.detail.map(detail_to_proto),
    }
}

/// A backend as the status's JSON shows it.
pub(crate) fn backend_json(b: &v1::BackendStatus) -> serde_json::Value {
    let top: Vec<serde_json::Value> =
        b.top_groups.iter().map(|g| serde_json::json!({"group": g.group, "load": g.units_per_s})).collect();
    serde_json::json!({
        "name": b.name, "zone": b.zone, "utilisation": b.utilisation, "limiting": b.limiting,
        "seen_s": b.seen_s, "load": b.load, "top_groups": top,
        "inert": (!b.inert.is_empty()).then_some(&b.inert),
    })
}

/// A client as the status's JSON shows it.
pub(crate) fn client_json(c: &v1::ClientStatus) -> serde_json::Value {
    let top: Vec<serde_json::Value> = c
        .top_grants
        .iter()
        .map(|g| serde_json::json!({"group": g.group, "rate": g.rate, "burst": g.burst}))
        .collect();
    serde_json::json!({
        "client_id": c.client_id, "seen_s": c.seen_s, "lapsed": c.lapsed, "groups": c.groups,
        "unlimited_groups": c.unlimited_groups, "granted": c.granted, "top_grants": top,
    })
}

pub(crate) fn backend_to_proto(b: &tollgate_model::engine::BackendView) -> v1::BackendStatus {
    v1::BackendStatus {
        name: b.name.clone(),
        zone: b.zone.clone(),
        utilisation: b.utilisation,
        limiting: b.limiting,
        seen_s: b.seen_s,
        load: b.load,
        top_groups: b
            .top_groups
            .iter()
            .map(|(g, l)| v1::GroupLoad { group: g.to_string(), units_per_s: *l })
            .collect(),
        inert: b.under_threshold.map_or_else(String::new, |largest| {
            format!(
                "saturated, but limits no group: every group's load here is under the limiting \
                 threshold (the largest is {largest:.1} units/s); lower --limiting-threshold"
            )
        }),
    }
}

pub(crate) fn client_to_proto(c: &tollgate_model::engine::ClientView) -> v1::ClientStatus {
    v1::ClientStatus {
        client_id: c.name.clone(),
        seen_s: c.seen_s,
        lapsed: c.lapsed,
        groups: c.groups,
        unlimited_groups: c.unlimited,
        granted: c.granted,
        top_grants: c
            .top_grants
            .iter()
            .map(|(g, rate, burst)| v1::ClientGrantStatus {
                group: g.to_string(),
                rate: *rate,
                burst: *burst,
            })
            .collect(),
    }
}

fn marks_to_proto(m: tollgate_model::engine::RateMarks) -> v1::RateMarks {
    v1::RateMarks { low: m.low, high: m.high, average: m.average }
}

fn detail_to_proto(d: tollgate_model::cost::Consumption) -> v1::Consumption {
    let [rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs] = d.values();
    v1::Consumption { rru, wru, read_bytes, write_bytes, cpu_ms, read_rpcs, write_rpcs }
}

fn detail_json(d: Option<&v1::Consumption>) -> serde_json::Value {
    match d {
        Some(d) => serde_json::json!({
            "rru": d.rru, "wru": d.wru, "read_bytes": d.read_bytes, "write_bytes": d.write_bytes,
            "cpu_ms": d.cpu_ms, "read_rpcs": d.read_rpcs, "write_rpcs": d.write_rpcs,
        }),
        None => serde_json::Value::Null,
    }
}

fn marks_json(m: Option<&v1::RateMarks>) -> serde_json::Value {
    match m {
        Some(m) => serde_json::json!({ "low": m.low, "high": m.high, "average": m.average }),
        None => serde_json::Value::Null,
    }
}

/// The status as JSON, for `GET /status` and `tollgate status --json` alike.
pub fn status_json(s: &v1::StatusResponse) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = s.groups.iter().map(|g| group_json(g, &s.unit)).collect();
    status_json_with(s, groups)
}

/// One group as the status's JSON shows it.
fn group_json(g: &v1::GroupStatus, unit: &str) -> serde_json::Value {
    serde_json::json!({
        "name": g.name,
        "unit": unit,
        "settings": g.settings.as_ref().map(crate::front::json::group_settings),
        "target": g.target,
        "admitted": g.admitted,
        "throttled": g.throttled,
        "granted": g.granted,
        "demand": g.demand,
        "unthrottled": g.unthrottled,
        "busy": g.busy,
        "headroom": g.headroom,
        "clients": g.clients,
        "consumed_total": g.consumed_total,
        "admitted_total": g.admitted_total,
        "throttled_total": g.throttled_total,
        "waited_total": g.waited_total,
        "blocked_total": g.throttled_total + g.waited_total,
        "would_refuse_total": g.would_refuse_total,
        "in_flight": g.in_flight,
        "by_class": (!g.by_class.is_empty()).then(|| {
            g.by_class
                .iter()
                .map(|c| (c.request_class.clone(), serde_json::json!({"admitted": c.admitted, "throttled": c.throttled})))
                .collect::<serde_json::Map<String, serde_json::Value>>()
        }),
        "budget_exhausted": g.budget_exhausted,
        "ramp_pool": g.ramp_pool,
        "last_minute": marks_json(g.last_minute.as_ref()),
        "last_hour": marks_json(g.last_hour.as_ref()),
        "largest_last_minute": g.largest_last_minute,
        "largest_last_hour": g.largest_last_hour,
        "detail": detail_json(g.detail.as_ref()),
    })
}

fn status_json_with(s: &v1::StatusResponse, groups: Vec<serde_json::Value>) -> serde_json::Value {
    let mode = if s.mode() == v1::AllocationMode::Fcfs { "fcfs" } else { "share" };
    serde_json::json!({
        "capacity": s.capacity,
        "mode": mode,
        "shadow": s.shadow,
        "throttling": if s.throttling_off { "off" } else { "on" },
        "exchanges": s.exchanges,
        "learning": s.learning,
        "role": s.role,
        "leader": s.leader,
        "leader_changes": s.leader_changes,
        "region": s.region,
        "upstream_safe_mode": s.upstream_safe_mode,
        "clients": s.clients,
        "backends": s.backends,
        "clients_lapsed": s.clients_lapsed,
        "backend_detail": s.backend_detail.iter().map(backend_json).collect::<Vec<_>>(),
        "client_detail": s.client_detail.iter().map(client_json).collect::<Vec<_>>(),
        "others_granted": s.others_granted,
        "cost_model": s.cost_model,
        "unit": s.unit,
        "warnings": s.warnings,
        "settings_files": s
            .settings_files
            .iter()
            .map(|f| serde_json::json!({
                "path": f.path,
                "kind": f.kind,
                "revision": (!f.revision.is_empty()).then_some(&f.revision),
                "rejected": (!f.rejected.is_empty()).then_some(&f.rejected),
                "applied": f.applied,
            }))
            .collect::<Vec<_>>(),
        "domains": s
            .domains
            .iter()
            .map(|d| serde_json::json!({"domain": d.domain, "answered_by": d.answered_by, "count": d.count}))
            .collect::<Vec<_>>(),
        "tokens": s.tokens.iter().map(token_json).collect::<Vec<_>>(),
        "implicit_tenant_rule": if s.rules_everywhere { "off: rules with no domain apply everywhere" } else { "in every other domain" },
        "groups": groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the status JSON showed priorities as 16 and 8 instead of `high` and `medium`.
    #[test]
    fn priorities_read_as_people_say_them() {
        let settings = |priority| Some(v1::GroupSettings { priority, weight: 1.0, ..Default::default() });
        let status = v1::StatusResponse {
            groups: vec![
                v1::GroupStatus { name: "a".into(), settings: settings(16), ..Default::default() },
                v1::GroupStatus { name: "b".into(), settings: settings(8), ..Default::default() },
                v1::GroupStatus { name: "c".into(), settings: settings(3), ..Default::default() },
            ],
            ..Default::default()
        };
        let json = status_json(&status);
        let priorities: Vec<&serde_json::Value> =
            json["groups"].as_array().unwrap().iter().map(|g| &g["settings"]["priority"]).collect();
        // A level with no name is the number, as the HTTP API takes it.
        assert_eq!(
            priorities,
            [&serde_json::json!("high"), &serde_json::json!("medium"), &serde_json::json!(3)]
        );
        assert_eq!(json["mode"], "share");
    }

    /// TiDB's diagnostics: blocked requests, and the consumption rate's water marks.
    /// Client `c`'s exchange number `sequence`, for one group.
    fn one_group(sequence: u64, usage: v1::GroupUsage) -> v1::ExchangeRequest {
        v1::ExchangeRequest { client_id: "c".into(), sequence, groups: vec![usage], ..Default::default() }
    }

    #[test]
    fn blocked_requests_and_the_rates_water_marks_reach_the_status() {
        use tollgate_model::engine::EngineSettings;
        const S: u64 = 1_000_000_000;
        let store = Box::new(crate::store::MemoryStore::default());
        let node = crate::node::Node::open(store, EngineSettings::default(), Nanos(0), 0).unwrap();
        let c = &node.controller;
        // Ten seconds at 100 units/s, one at 300; three requests refused and two waited.
        for t in 1..=11u64 {
            let consumed = if t == 6 { 300.0 } else { 100.0 };
            let usage = v1::GroupUsage {
                group: "g".into(),
                demand: consumed,
                consumed,
                admitted: 10,
                throttled: u64::from(t == 3) * 3,
                waited: u64::from(t == 4) * 2,
                ..Default::default()
            };
            c.exchange(Nanos(t * S), &one_group(t, usage)).unwrap();
            c.pacer().tick(Nanos(t * S));
        }
        let json = status_json(&status_response(&node, Nanos(11 * S), &Page::default()));
        let g = &json["groups"][0];
        assert_eq!((g["throttled_total"].as_u64(), g["waited_total"].as_u64()), (Some(3), Some(2)));
        assert_eq!(g["blocked_total"], 5);
        let minute = &g["last_minute"];
        assert_eq!((minute["low"].as_f64(), minute["high"].as_f64()), (Some(100.0), Some(300.0)), "{g}");
        let average = minute["average"].as_f64().unwrap();
        assert!((average - 1300.0 / 11.0).abs() < 1e-3, "{average}");
        assert_eq!(g["last_hour"]["high"], 300.0);
        assert_eq!(g["detail"], serde_json::Value::Null, "no client reported any");

        // Detailed consumption is summed per group; a bad number refuses the whole report.
        let detail =
            |rru: f64| v1::Consumption { rru, read_bytes: 4096.0, read_rpcs: 1.0, ..Default::default() };
        for (t, d) in [(12u64, detail(2.5)), (13, detail(1.5))] {
            let usage = v1::GroupUsage { group: "g".into(), detail: Some(d), ..Default::default() };
            c.exchange(Nanos(t * S), &one_group(t, usage)).unwrap();
        }
        let bad = v1::GroupUsage { group: "g".into(), detail: Some(detail(-1.0)), ..Default::default() };
        let e = c.exchange(Nanos(14 * S), &one_group(14, bad)).unwrap_err();
        assert_eq!(e.message(), "groups[0].detail.rru: must be a finite number from 0 to 1e15, got -1");
        c.pacer().tick(Nanos(14 * S));
        let json = status_json(&status_response(&node, Nanos(14 * S), &Page::default()));
        let d = &json["groups"][0]["detail"];
        assert_eq!(
            (d["rru"].as_f64(), d["read_bytes"].as_f64(), d["read_rpcs"].as_f64()),
            (Some(4.0), Some(8192.0), Some(2.0))
        );
    }
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn pages_walk_every_name_once_and_bad_sizes_are_refused() {
        let names: Vec<String> = (0..25).map(|i| format!("g{i:02}")).collect();
        let mut page = Page::of(10, "").unwrap();
        let mut seen = Vec::new();
        loop {
            let (items, next) = page.take(&names, String::as_str);
            seen.extend(items.iter().cloned());
            if next.is_empty() {
                break;
            }
            page.after = next;
        }
        assert_eq!(seen, names);
        assert_eq!(Page::of(0, "").unwrap().size, PAGE_DEFAULT);
        assert!(Page::of(10_001, "").unwrap_err().starts_with("page_size: at most 10000"));
        assert_eq!(Page::default().take(&names, String::as_str).0.len(), 25, "size 0: all");
    }
}
