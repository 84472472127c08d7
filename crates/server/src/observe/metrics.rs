//! The controller's metrics on the Prometheus project's `prometheus-client` crate: a collector
//! that reads the controller at each scrape (per group, the node, the tracking tables), and the
//! exchange-latency histogram.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tollgate_model::engine::{BackendView, ClientView, GroupView};
use tollgate_model::prometheus::{Kind, family, single};

use crate::clock::Clock;
use crate::cluster::role::{Cluster, Role};
use crate::controller::Controller;
use crate::node::Node;
use crate::observe::series::{Fold, MetricsGroups, OTHERS};
use crate::observe::status::Latency;

/// One per-group metric: name, help, kind, and how to read it (`None`: no sample).
type Family = (&'static str, &'static str, Kind, fn(&GroupView) -> Option<f64>);

const GROUP_FAMILIES: [Family; 33] = [
    ("tollgate_group_target_units", "Target units/s (absent when not throttled).", Kind::Gauge, |g| g.target),
    ("tollgate_group_admitted_units", "Units/s consumed over the last tick.", Kind::Gauge, |g| {
        Some(g.admitted)
    }),
    (
        "tollgate_group_throttled_requests_per_second",
        "Requests/s refused over the last tick.",
        Kind::Gauge,
        |g| Some(g.throttled),
    ),
    ("tollgate_group_demand_units", "Units/s asked for, admitted or not.", Kind::Gauge, |g| Some(g.demand)),
    ("tollgate_group_unthrottled_units", "Units/s of unthrottled work.", Kind::Gauge, |g| {
        Some(g.unthrottled)
    }),
    ("tollgate_group_clients", "Clients reporting the group.", Kind::Gauge, |g| Some(f64::from(g.clients))),
    ("tollgate_group_busy", "1 when saturation limits the group below its cap.", Kind::Gauge, |g| {
        Some(if g.busy { 1.0 } else { 0.0 })
    }),
    ("tollgate_group_consumed_units_total", "Units consumed, as clients reported.", Kind::Counter, |g| {
        Some(g.meter.consumed)
    }),
    ("tollgate_group_admitted_requests_total", "Requests admitted.", Kind::Counter, |g| {
        Some(g.meter.admitted as f64)
    }),
    ("tollgate_group_throttled_requests_total", "Requests refused.", Kind::Counter, |g| {
        Some(g.meter.throttled as f64)
    }),
    (
        "tollgate_group_waited_requests_total",
        "Requests admitted after waiting for tokens.",
        Kind::Counter,
        |g| Some(g.meter.waited as f64),
    ),
    (
        "tollgate_group_would_refuse_requests_total",
        "Requests admitted in shadow mode that would have been refused.",
        Kind::Counter,
        |g| Some(g.meter.would_refuse as f64),
    ),
    (
        "tollgate_group_in_flight_requests",
        "Requests its clients hold in flight (groups with an in-flight quota).",
        Kind::Gauge,
        |g| g.in_flight.map(|f| f.held as f64),
    ),
    (
        "tollgate_group_max_in_flight_requests",
        "The group's in-flight quota (max_in_flight).",
        Kind::Gauge,
        |g| g.settings.as_ref().and_then(|s| s.max_in_flight()).map(f64::from),
    ),
    (
        "tollgate_group_critical_admitted_requests_total",
        "Critical requests admitted (groups that saw a critical or sheddable request).",
        Kind::Counter,
        |g| g.by_class.map(|c| c.0[0][0] as f64),
    ),
    ("tollgate_group_critical_throttled_requests_total", "Critical requests refused.", Kind::Counter, |g| {
        g.by_class.map(|c| c.0[0][1] as f64)
    }),
    (
        "tollgate_group_normal_admitted_requests_total",
        "Normal requests admitted (groups that saw a critical or sheddable request).",
        Kind::Counter,
        |g| g.by_class.map(|c| c.0[1][0] as f64),
    ),
    ("tollgate_group_normal_throttled_requests_total", "Normal requests refused.", Kind::Counter, |g| {
        g.by_class.map(|c| c.0[1][1] as f64)
    }),
    (
        "tollgate_group_sheddable_admitted_requests_total",
        "Sheddable requests admitted.",
        Kind::Counter,
        |g| g.by_class.map(|c| c.0[2][0] as f64),
    ),
    (
        "tollgate_group_sheddable_throttled_requests_total",
        "Sheddable requests refused.",
        Kind::Counter,
        |g| g.by_class.map(|c| c.0[2][1] as f64),
    ),
    ("tollgate_group_rate_low_1m_units", "Lowest consumption rate over the last minute.", Kind::Gauge, |g| {
        g.last_minute.map(|m| m.low)
    }),
    (
        "tollgate_group_rate_high_1m_units",
        "Highest consumption rate over the last minute.",
        Kind::Gauge,
        |g| g.last_minute.map(|m| m.high),
    ),
    (
        "tollgate_group_rate_avg_1m_units",
        "Average consumption rate over the last minute.",
        Kind::Gauge,
        |g| g.last_minute.map(|m| m.average),
    ),
    ("tollgate_group_rate_low_1h_units", "Lowest consumption rate over the last hour.", Kind::Gauge, |g| {
        g.last_hour.map(|m| m.low)
    }),
    ("tollgate_group_rate_high_1h_units", "Highest consumption rate over the last hour.", Kind::Gauge, |g| {
        g.last_hour.map(|m| m.high)
    }),
    ("tollgate_group_rate_avg_1h_units", "Average consumption rate over the last hour.", Kind::Gauge, |g| {
        g.last_hour.map(|m| m.average)
    }),
    ("tollgate_group_rru_total", "Read request units, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.rru)
    }),
    ("tollgate_group_wru_total", "Write request units, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.wru)
    }),
    ("tollgate_group_read_bytes_total", "Bytes read, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.read_bytes)
    }),
    ("tollgate_group_write_bytes_total", "Bytes written, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.write_bytes)
    }),
    ("tollgate_group_cpu_ms_total", "CPU milliseconds, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.cpu_ms)
    }),
    ("tollgate_group_read_requests_total", "Read requests, as clients reported them.", Kind::Counter, |g| {
        g.detail.map(|d| d.read_rpcs)
    }),
    (
        "tollgate_group_write_requests_total",
        "Write requests, as clients reported them.",
        Kind::Counter,
        |g| g.detail.map(|d| d.write_rpcs),
    ),
];

/// The node settings' gauges.
fn node_settings(e: &mut DescriptorEncoder, node: crate::store::StoredNode) -> std::fmt::Result {
    if let Some(capacity) = node.capacity {
        single(e, "tollgate_node_capacity_units", "Node capacity, units/s.", Kind::Gauge, capacity)?;
    }
    single(e, "tollgate_node_shadow", "1 while every group is in shadow mode.", Kind::Gauge, node.shadow)?;
    single(
        e,
        "tollgate_node_throttling",
        "1 while the node throttles; 0 while the one switch has turned throttling off.",
        Kind::Gauge,
        node.throttling,
    )
}

/// Reads the controller at each scrape.
struct ControllerMetrics {
    controller: Arc<Controller>,
    cluster: Arc<Cluster>,
    peaks: Arc<crate::observe::peaks::Peaks>,
    clock: Clock,
    /// How many groups are named one by one.
    groups: MetricsGroups,
}

impl std::fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControllerMetrics")
    }
}

impl Collector for ControllerMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let c = &self.controller;
        {
            let view = c.readings().view();
            let (named, rest) = self.groups.split(&view);
            for (name, help, kind, read) in GROUP_FAMILIES {
                let samples = named.iter().filter_map(|g| read(g).map(|v| (g.name.as_str(), v)));
                let others = Fold::of(name, kind).apply(&rest, read).map(|v| (OTHERS, v));
                family(&mut e, name, help, kind, "group", samples.chain(others))?;
            }
            encode_peaks(&mut e, &self.peaks, self.clock.now(), &named)?;
        }
        node_settings(&mut e, c.admin().node())?;
        let now = self.clock.now();
        let d = c.readings().diagnostics(now);
        encode_diagnostics(&mut e, &d)?;
        drop(d);
        let (clients, backends, learning) = c.readings().tracking(now);
        single(&mut e, "tollgate_clients", "Clients tracked.", Kind::Gauge, clients)?;
        single(&mut e, "tollgate_backends", "Backends tracked.", Kind::Gauge, backends)?;
        single(
            &mut e,
            "tollgate_learning",
            "1 in the first lease after start, while relearning what clients hold.",
            Kind::Gauge,
            learning,
        )?;
        single(
            &mut e,
            "tollgate_leader",
            "1 while this controller leads (or runs alone), 0 while it follows.",
            Kind::Gauge,
            self.cluster.role().role != Role::Follower,
        )?;
        single(
            &mut e,
            "tollgate_metering_flush_failures_total",
            "Writes of consumption to the store that failed (kept and written at the next flush).",
            Kind::Counter,
            c.readings().flush_failures(),
        )?;
        single(
            &mut e,
            "tollgate_leader_changes_total",
            "Times this controller became the leader.",
            Kind::Counter,
            self.cluster.leader_changes(),
        )?;
        self.encode_cluster(&mut e)?;
        encode_counts(&mut e, c)
    }
}

/// One per-token metric: name, help, kind, and how to read it (`None`: no sample).
type TokenFamily = (&'static str, &'static str, Kind, fn(&crate::observe::peaks::TokenPeaks) -> Option<f64>);

const TOKEN_FAMILIES: [TokenFamily; 8] = [
    ("tollgate_token_consumed_units_total", "Units a client token's clients consumed.", Kind::Counter, |t| {
        Some(t.consumed_total)
    }),
    (
        "tollgate_token_admitted_requests_total",
        "Requests a client token's clients admitted.",
        Kind::Counter,
        |t| Some(t.admitted_total as f64),
    ),
    (
        "tollgate_token_throttled_requests_total",
        "Requests a client token's clients refused for want of tokens.",
        Kind::Counter,
        |t| Some(t.throttled_total as f64),
    ),
    (
        "tollgate_token_rate_low_1m_units",
        "A client token's lowest consumption rate over the last minute.",
        Kind::Gauge,
        |t| t.last_minute.map(|m| m.low),
    ),
    (
        "tollgate_token_rate_high_1m_units",
        "A client token's highest consumption rate over the last minute.",
        Kind::Gauge,
        |t| t.last_minute.map(|m| m.high),
    ),
    (
        "tollgate_token_rate_avg_1m_units",
        "A client token's average consumption rate over the last minute.",
        Kind::Gauge,
        |t| t.last_minute.map(|m| m.average),
    ),
    (
        "tollgate_token_largest_request_1m_units",
        "Cost of a client token's largest single request over the last minute.",
        Kind::Gauge,
        |t| Some(t.largest.0),
    ),
    (
        "tollgate_token_largest_request_1h_units",
        "Cost of a client token's largest single request over the last hour.",
        Kind::Gauge,
        |t| Some(t.largest.1),
    ),
];

/// The high-water marks: the largest request of each group named, and each client token's
/// marks (up to the diagnostics' bound, the most consumed first).
fn encode_peaks(
    e: &mut DescriptorEncoder,
    peaks: &crate::observe::peaks::Peaks,
    now: tollgate_model::time::Nanos,
    named: &[&GroupView],
) -> std::fmt::Result {
    let largest = peaks.groups(now);
    let marks: Vec<(&str, (f64, f64))> =
        named.iter().filter_map(|g| largest.get(g.name.as_str()).map(|l| (g.name.as_str(), *l))).collect();
    for (name, help, hour) in [
        (
            "tollgate_group_largest_request_1m_units",
            "Cost of the largest single request over the last minute.",
            false,
        ),
        (
            "tollgate_group_largest_request_1h_units",
            "Cost of the largest single request over the last hour.",
            true,
        ),
    ] {
        let samples = marks.iter().map(|(g, (m, h))| (*g, if hour { *h } else { *m }));
        family(e, name, help, Kind::Gauge, "group", samples)?;
    }
    let tokens = peaks.tokens(now, crate::controller::DIAGNOSTICS_SHOWN_MAX);
    for (name, help, kind, read) in TOKEN_FAMILIES {
        family(
            e,
            name,
            help,
            kind,
            "token",
            tokens.iter().filter_map(|t| read(t).map(|v| (t.id.as_str(), v))),
        )?;
    }
    Ok(())
}

/// The backends' and clients' families, named one by one up to the diagnostics' bound.
fn encode_diagnostics(
    e: &mut DescriptorEncoder,
    d: &tollgate_model::engine::Diagnostics,
) -> std::fmt::Result {
    let backend = |e: &mut DescriptorEncoder, name: &str, help: &str, read: fn(&BackendView) -> f64| {
        family(e, name, help, Kind::Gauge, "backend", d.backends.iter().map(|b| (b.name.as_str(), read(b))))
    };
    backend(e, "tollgate_backend_utilisation", "A backend's utilisation: 1 is at its target.", |b| {
        b.utilisation
    })?;
    backend(e, "tollgate_backend_limiting", "1 while a backend is saturated and limits its groups.", |b| {
        f64::from(u8::from(b.limiting))
    })?;
    backend(e, "tollgate_backend_load_units", "Units/s of all groups on a backend.", |b| b.load)?;
    backend(e, "tollgate_backend_report_age_seconds", "Seconds since a backend's last report.", |b| {
        b.seen_s
    })?;
    let client = |e: &mut DescriptorEncoder, name: &str, help: &str, read: fn(&ClientView) -> f64| {
        family(e, name, help, Kind::Gauge, "client", d.clients.iter().map(|c| (c.name.as_str(), read(c))))
    };
    client(e, "tollgate_tracked_client_granted_units", "Units/s of a client's finite grants.", |c| {
        c.granted
    })?;
    client(e, "tollgate_tracked_client_groups", "Groups granted to a client.", |c| f64::from(c.groups))?;
    client(
        e,
        "tollgate_tracked_client_lapsed",
        "1 when a client has not exchanged within the lease.",
        |c| f64::from(u8::from(c.lapsed)),
    )?;
    single(
        e,
        "tollgate_clients_lapsed",
        "Clients that have not exchanged within the lease.",
        Kind::Gauge,
        d.clients_lapsed,
    )?;
    single(
        e,
        "tollgate_clients_others_granted_units",
        "Units/s granted to the clients not named one by one.",
        Kind::Gauge,
        d.others_granted,
    )?;
    Ok(())
}

/// The counts of the controller's work since it started.
fn encode_counts(e: &mut DescriptorEncoder, c: &Controller) -> std::fmt::Result {
    single(
        e,
        "tollgate_exchanges_total",
        "Admission exchanges answered.",
        Kind::Counter,
        c.readings().exchanges(),
    )?;
    single(
        e,
        "tollgate_client_restarts_total",
        "Clients seen to restart (their exchanges numbered from 1 again); their grants are released.",
        Kind::Counter,
        c.readings().client_restarts(),
    )?;
    single(e, "tollgate_ticks_total", "Engine ticks completed.", Kind::Counter, c.pacer().ticks())?;
    single(
        e,
        "tollgate_early_ticks_total",
        "Ticks run before their turn because a backend's report showed it newly saturated.",
        Kind::Counter,
        c.pacer().early_ticks(),
    )?;
    single(
        e,
        "tollgate_grpc_writes_total",
        "Writes to gRPC connections' sockets (about one per answer).",
        Kind::Counter,
        c.readings().grpc_writes(),
    )
}

impl ControllerMetrics {
    /// What this controller passes on to the leader, and a regional controller's lease on the
    /// global tier.
    fn encode_cluster(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        let up = self.cluster.upstream_status();
        if up.region().is_some() {
            family(
                e,
                "tollgate_region_upstream_exchanges_total",
                "A regional leader's exchanges with the global tier, by outcome: answered, or failed (no global leader known, or none answered).",
                Kind::Counter,
                "outcome",
                [("answered", load(&up.exchanges)), ("failed", load(&up.failures))],
            )?;
            single(
                e,
                "tollgate_region_upstream_safe_mode",
                "1 while this region's shares decay: the global tier has not answered within a grant's lease.",
                Kind::Gauge,
                up.safe_mode.load(std::sync::atomic::Ordering::Relaxed),
            )?;
        }
        if let Some(s) = self.cluster.sharding() {
            single(
                e,
                "tollgate_shards_owned",
                "The shards this controller grants for now, by the shard map it applied last (0 while its membership in etcd does not hold).",
                Kind::Gauge,
                s.owned() as u64,
            )?;
            single(
                e,
                "tollgate_shard_map_epoch",
                "The epoch of the shard map this controller applied last (0: none yet in this term).",
                Kind::Gauge,
                s.map().map_or(0, |m| m.epoch()),
            )?;
            family(
                e,
                "tollgate_shard_events_total",
                "With the groups sharded: parts of exchanges and reports passed on to other owners, those not answered, groups forgotten as their shard moved away, maps applied, and entries in etcd refused as malformed.",
                Kind::Counter,
                "what",
                [
                    ("part_forwarded", load(&s.parts_forwarded)),
                    ("part_unanswered", load(&s.parts_unanswered)),
                    ("group_moved_away", load(&s.groups_moved_away)),
                    ("map_applied", load(&s.maps_applied)),
                    ("entry_refused", load(&s.refused_entries)),
                ],
            )?;
        }
        let f = self.cluster.link().forwarded();
        family(
            e,
            "tollgate_forwarded_total",
            "Clients' exchanges and backends' reports a follower passed on to the leader, by what; unreached: those it could not pass on.",
            Kind::Counter,
            "what",
            [
                ("exchange", load(&f.exchanges)),
                ("report", load(&f.reports)),
                ("unreached", load(&f.unreached)),
            ],
        )
    }
}

/// The state of the controller's own client, the one behind `POST /v1/check` and Envoy's
/// rate-limit service.
struct FrontEndMetrics {
    gate: tollgate_limiter::Tollgate,
}

impl std::fmt::Debug for FrontEndMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrontEndMetrics")
    }
}

impl Collector for FrontEndMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let Some(s) = self.gate.remote_status() else { return Ok(()) };
        single(
            &mut e,
            "tollgate_front_end_safe_mode",
            "1 while the client behind /v1/check and the rate-limit service is in safe mode (a follower that cannot reach the leader).",
            Kind::Gauge,
            s.safe_mode,
        )?;
        single(
            &mut e,
            "tollgate_front_end_exchanges_total",
            "Exchanges of the client behind /v1/check and the rate-limit service.",
            Kind::Counter,
            s.exchanges,
        )
    }
}

/// The process's own health, and the build.
#[derive(Debug)]
struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        family(
            &mut e,
            "tollgate_build_info",
            "The running build: 1, labelled with its version.",
            Kind::Gauge,
            "version",
            [(env!("CARGO_PKG_VERSION"), 1u32)],
        )?;
        let Some(u) = crate::observe::process::usage() else { return Ok(()) };
        single(
            &mut e,
            "process_cpu_seconds_total",
            "CPU time used, user and system, in seconds.",
            Kind::Counter,
            u.cpu_seconds,
        )?;
        single(
            &mut e,
            "process_resident_memory_bytes",
            "Resident memory, in bytes.",
            Kind::Gauge,
            u.resident_bytes,
        )?;
        single(&mut e, "process_open_fds", "File descriptors open.", Kind::Gauge, u.open_fds)?;
        single(&mut e, "process_max_fds", "The open-file limit.", Kind::Gauge, u.max_fds)?;
        single(
            &mut e,
            "process_start_time_seconds",
            "When the process started, Unix seconds.",
            Kind::Gauge,
            u.start_time_seconds,
        )
    }
}

/// The settings files followed: each one refused (1) or not (0), and its revisions applied.
#[derive(Debug)]
struct FileMetrics(Arc<crate::settings::files::Files>);

impl Collector for FileMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let files = self.0.status();
        if files.is_empty() {
            return Ok(());
        }
        family(
            &mut e,
            "tollgate_settings_file_rejected",
            "1 while a followed settings file (--config, --import) is refused as it is now: the revision in force stays.",
            Kind::Gauge,
            "file",
            files.iter().map(|f| (f.path.as_str(), u32::from(f.rejected.is_some()))),
        )?;
        family(
            &mut e,
            "tollgate_settings_file_applied_total",
            "Revisions of a followed settings file applied since the start.",
            Kind::Counter,
            "file",
            files.iter().map(|f| (f.path.as_str(), f.applied)),
        )
    }
}

/// The quota streams' counters (Envoy's RLQS).
#[derive(Debug)]
struct RlqsMetrics(Arc<crate::front::rlqs::RlqsStats>);

impl Collector for RlqsMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        single(
            &mut e,
            "tollgate_rlqs_streams",
            "Envoy quota (RLQS) streams open.",
            Kind::Gauge,
            s.streams(),
        )?;
        single(
            &mut e,
            "tollgate_rlqs_reports_total",
            "Usage reports received on quota streams.",
            Kind::Counter,
            s.reports(),
        )?;
        single(
            &mut e,
            "tollgate_rlqs_assigned_total",
            "New bucket assignments sent on quota streams (first ones, and ones replacing another).",
            Kind::Counter,
            s.assigned(),
        )?;
        single(
            &mut e,
            "tollgate_rlqs_renewed_total",
            "Bucket assignments sent again unchanged before their time to live ran out.",
            Kind::Counter,
            s.renewed(),
        )?;
        single(
            &mut e,
            "tollgate_rlqs_abandoned_total",
            "Idle buckets abandoned on quota streams.",
            Kind::Counter,
            s.abandoned(),
        )?;
        single(
            &mut e,
            "tollgate_rlqs_refused_buckets_total",
            "Buckets answered deny-all because they cannot be served (see the log for the field).",
            Kind::Counter,
            s.refused(),
        )
    }
}

/// The registry `/metrics` encodes: the controller's collector, its front end's client, and
/// the latency histogram.
pub fn registry(
    node: &Node,
    clock: Clock,
    latency: &Latency,
    gate: tollgate_limiter::Tollgate,
    groups: MetricsGroups,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ControllerMetrics {
        controller: node.controller.clone(),
        cluster: node.cluster.clone(),
        peaks: node.peaks.clone(),
        clock,
        groups,
    }));
    registry.register_collector(Box::new(FrontEndMetrics { gate }));
    registry.register_collector(Box::new(RlqsMetrics(node.rlqs.clone())));
    registry.register_collector(Box::new(FileMetrics(node.files.clone())));
    registry.register_collector(Box::new(ProcessMetrics));
    registry.register("tollgate_exchange_latency_seconds", "Time to answer an exchange", latency.0.clone());
    registry
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::engine::{Engine, EngineSettings};
    use tollgate_model::settings::{GroupName, GroupSettings};

    #[derive(Debug)]
    struct Groups(Vec<GroupView>);

    impl Collector for Groups {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            for (name, help, kind, read) in GROUP_FAMILIES {
                family(
                    &mut e,
                    name,
                    help,
                    kind,
                    "group",
                    self.0.iter().filter_map(|g| read(g).map(|v| (g.name.as_str(), v))),
                )?;
            }
            Ok(())
        }
    }

    #[test]
    fn group_samples_escape_their_labels_and_every_family_is_declared() {
        let mut engine = Engine::new(EngineSettings::default());
        engine.set_group(GroupName::new("plain").unwrap(), GroupSettings::default());
        engine.set_group(GroupName::new(r#"quote"and\slash"#).unwrap(), GroupSettings::default());
        let mut r = Registry::default();
        r.register_collector(Box::new(Groups(engine.view())));
        let text = tollgate_model::prometheus::text(&r);
        assert!(text.contains("tollgate_group_clients{group=\"plain\"} 0\n"), "{text}");
        assert!(text.contains(r#"tollgate_group_clients{group="quote\"and\\slash"} 0"#), "{text}");
        for (name, _, kind, _) in GROUP_FAMILIES {
            let family = if kind == Kind::Counter { name.strip_suffix("_total").unwrap() } else { name };
            let kind = if kind == Kind::Counter { "counter" } else { "gauge" };
            assert!(text.contains(&format!("# TYPE {family} {kind}\n")), "{name}");
        }
    }
}
