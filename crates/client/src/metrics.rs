//! The client's own metrics on the Prometheus project's `prometheus-client` crate, for the
//! application to serve on its `/metrics` beside its own: per group what was admitted, refused,
//! consumed, dropped and owed, the allowance; and per mode the link's state (remote: the
//! controller; store and replicas: each pool, how many share it, this process's share).
//!
//! One line registers them into the application's registry
//! ([`Tollgate::register_metrics`]); they are read from the limiter at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tollgate_model::prometheus::{Kind, family, single};

use crate::handle::{GroupStats, Tollgate};
use crate::remote::RemoteStatus;
use crate::store::StoreStatus;

/// One per-group family: name, help, kind, and how to read it from the stats.
type Family = (&'static str, &'static str, Kind, fn(&GroupStats) -> f64);

const GROUP_FAMILIES: [Family; 20] = [
    ("tollgate_client_admitted_requests_total", "Requests admitted.", Kind::Counter, |s| s.admitted as f64),
    ("tollgate_client_throttled_requests_total", "Requests refused.", Kind::Counter, |s| s.throttled as f64),
    (
        "tollgate_client_would_refuse_requests_total",
        "Requests admitted in shadow mode that would have been refused.",
        Kind::Counter,
        |s| s.would_refuse as f64,
    ),
    ("tollgate_client_admitted_units_total", "Units admitted, at the cost asked.", Kind::Counter, |s| {
        s.admitted_units
    }),
    ("tollgate_client_throttled_units_total", "Units refused.", Kind::Counter, |s| s.throttled_units),
    ("tollgate_client_unthrottled_units_total", "Units admitted unthrottled.", Kind::Counter, |s| {
        s.unthrottled_units
    }),
    ("tollgate_client_consumed_units_total", "Units consumed, settlements included.", Kind::Counter, |s| {
        s.consumed_units
    }),
    ("tollgate_client_dropped_requests_total", "Requests admitted and then dropped.", Kind::Counter, |s| {
        s.dropped as f64
    }),
    ("tollgate_client_dropped_units_total", "Units of dropped requests.", Kind::Counter, |s| s.dropped_units),
    (
        "tollgate_client_allowance_units",
        "Units/s this process may admit now (+Inf: unlimited).",
        Kind::Gauge,
        |s| s.allowance,
    ),
    ("tollgate_client_demand_units", "Units/s asked, as the engine last saw it.", Kind::Gauge, |s| s.demand),
    ("tollgate_client_waiting_units", "Units waiting in acquire now.", Kind::Gauge, |s| s.waiting_units),
    ("tollgate_client_debt_units", "Units of debt still being paid back.", Kind::Gauge, |s| s.debt_units),
    ("tollgate_client_rru_total", "Read request units of settled requests.", Kind::Counter, |s| s.detail.rru),
    ("tollgate_client_wru_total", "Write request units of settled requests.", Kind::Counter, |s| {
        s.detail.wru
    }),
    ("tollgate_client_read_bytes_total", "Bytes read by settled requests.", Kind::Counter, |s| {
        s.detail.read_bytes
    }),
    ("tollgate_client_write_bytes_total", "Bytes written by settled requests.", Kind::Counter, |s| {
        s.detail.write_bytes
    }),
    ("tollgate_client_cpu_ms_total", "CPU milliseconds of settled requests.", Kind::Counter, |s| {
        s.detail.cpu_ms
    }),
    ("tollgate_client_read_requests_total", "Settled read requests.", Kind::Counter, |s| s.detail.read_rpcs),
    ("tollgate_client_write_requests_total", "Settled write requests.", Kind::Counter, |s| {
        s.detail.write_rpcs
    }),
];

/// The collector [`Tollgate::register_metrics`] registers: it reads the limiter at each
/// scrape.
#[derive(Debug)]
struct Metrics(Tollgate);

impl Collector for Metrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let gate = &self.0;
        family(
            &mut e,
            "tollgate_client_info",
            "The mode this limiter runs in.",
            Kind::Gauge,
            "mode",
            [(gate.mode(), 1u32)],
        )?;
        let mut stats = gate.all_stats();
        stats.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, help, kind, read) in GROUP_FAMILIES {
            family(&mut e, name, help, kind, "group", stats.iter().map(|(g, s)| (g.as_str(), read(s))))?;
        }
        if let Some(r) = gate.remote_status() {
            remote(&mut e, &r)?;
        }
        if let Some(s) = gate.store_status() {
            store(&mut e, &s)?;
        }
        Ok(())
    }
}

/// The link's state: connected, and in safe mode.
fn link(e: &mut DescriptorEncoder, connected: bool, safe: bool) -> std::fmt::Result {
    single(
        e,
        "tollgate_client_connected",
        "1 when the last exchange or sync succeeded.",
        Kind::Gauge,
        connected,
    )?;
    single(e, "tollgate_client_safe_mode", "1 while the safe-mode policy applies.", Kind::Gauge, safe)
}

/// A remote limiter's link to the controller.
fn remote(e: &mut DescriptorEncoder, r: &RemoteStatus) -> std::fmt::Result {
    link(e, r.connected, r.safe_mode)?;
    single(
        e,
        "tollgate_client_exchanges_total",
        "Successful exchanges with the controller.",
        Kind::Counter,
        r.exchanges,
    )?;
    let f = r.failures;
    family(
        e,
        "tollgate_client_exchange_failures_total",
        "Failed exchanges with the controller, by kind: transport, timeout, rejected.",
        Kind::Counter,
        "kind",
        [("transport", f.transport), ("timeout", f.timeout), ("rejected", f.rejected)],
    )?;
    single(
        e,
        "tollgate_client_rejected",
        "1 while the controller refuses this client for good (a token unknown, expired or revoked, a permission refused): nothing is admitted.",
        Kind::Gauge,
        r.rejected.is_some(),
    )
}

/// A store-mode limiter's link to the store (none in replicas mode), and each pool.
fn store(e: &mut DescriptorEncoder, s: &StoreStatus) -> std::fmt::Result {
    if s.replicas.is_none() {
        link(e, s.connected, s.safe_mode)?;
        single(
            e,
            "tollgate_client_store_syncs_total",
            "Successful syncs with the store.",
            Kind::Counter,
            s.syncs,
        )?;
    }
    for (name, help, read) in [
        ("tollgate_client_pool_units", "A group's pool per one-second epoch, for all processes.", 0),
        ("tollgate_client_pool_size", "Processes sharing the pool: agreed, or the replica count.", 1),
        ("tollgate_client_pool_share_units", "This process's share of the pool this epoch.", 2),
    ] {
        let samples = s.groups.iter().map(|g| {
            let v: tollgate_model::prometheus::Value = match read {
                0 => g.pool.into(),
                1 => g.size.into(),
                _ => g.share.into(),
            };
            (g.group.as_str(), v)
        });
        family(e, name, help, Kind::Gauge, "group", samples)?;
    }
    Ok(())
}

impl Tollgate {
    /// Registers this limiter's metrics into the application's registry: one line of setup,
    /// after which every scrape of that registry reads them. Every group in use is labelled
    /// `group`; the mode is the `mode` label of `tollgate_client_info`.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// use prometheus_client::registry::Registry;
    ///
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 1000\n")?;
    /// let mut registry = Registry::default();
    /// gate.register_metrics(&mut registry);
    ///
    /// drop(gate.try_acquire("api", 2.0)?);
    /// let mut text = String::new();
    /// prometheus_client::encoding::text::encode(&mut text, &registry)?;
    /// assert!(text.contains("tollgate_client_admitted_units_total{group=\"api\"} 2"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(Metrics(self.clone())));
    }

    /// This process's Tollgate metrics as OpenMetrics text (what [`Tollgate::register_metrics`]
    /// adds to a registry, alone in one), for an application that serves no registry of its
    /// own. Served with [`tollgate_model::prometheus::CONTENT_TYPE`].
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 1000\n")?;
    /// drop(gate.try_acquire("api", 2.0)?);
    /// let text = gate.metrics();
    /// assert!(text.contains("tollgate_client_info{mode=\"embedded\"} 1"));
    /// assert!(text.contains("tollgate_client_admitted_units_total{group=\"api\"} 2"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> String {
        let mut registry = Registry::default();
        self.register_metrics(&mut registry);
        tollgate_model::prometheus::text(&registry)
    }
}
