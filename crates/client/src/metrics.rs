//! The client's own metrics, in Prometheus's text format, for the application to serve on
//! its `/metrics` beside its own: per group what was admitted, refused, consumed, dropped and
//! owed, the allowance; and per mode the link's state (remote: the controller; store and
//! replicas: each pool, how many share it, this process's share).

use std::fmt::Write as _;

use tollgate_core::prometheus::{write_header, write_sample};

use crate::handle::{GroupStats, Tollgate};

/// One per-group family: name, help, type, and how to read it from the stats.
type Family = (&'static str, &'static str, &'static str, fn(&GroupStats) -> f64);

const GROUP_FAMILIES: [Family; 19] = [
    ("tollgate_client_admitted_requests_total", "Requests admitted.", "counter", |s| s.admitted as f64),
    ("tollgate_client_throttled_requests_total", "Requests refused.", "counter", |s| s.throttled as f64),
    ("tollgate_client_admitted_units_total", "Units admitted, at the cost asked.", "counter", |s| {
        s.admitted_units
    }),
    ("tollgate_client_throttled_units_total", "Units refused.", "counter", |s| s.throttled_units),
    ("tollgate_client_unthrottled_units_total", "Units admitted unthrottled.", "counter", |s| {
        s.unthrottled_units
    }),
    ("tollgate_client_consumed_units_total", "Units consumed, settlements included.", "counter", |s| {
        s.consumed_units
    }),
    ("tollgate_client_dropped_requests_total", "Requests admitted and then dropped.", "counter", |s| {
        s.dropped as f64
    }),
    ("tollgate_client_dropped_units_total", "Units of dropped requests.", "counter", |s| s.dropped_units),
    (
        "tollgate_client_allowance_units",
        "Units/s this process may admit now (+Inf: unlimited).",
        "gauge",
        |s| s.allowance,
    ),
    ("tollgate_client_demand_units", "Units/s asked, as the engine last saw it.", "gauge", |s| s.demand),
    ("tollgate_client_waiting_units", "Units waiting in acquire now.", "gauge", |s| s.waiting_units),
    ("tollgate_client_debt_units", "Units of debt still being paid back.", "gauge", |s| s.debt_units),
    ("tollgate_client_rru_total", "Read request units of settled requests.", "counter", |s| s.detail.rru),
    ("tollgate_client_wru_total", "Write request units of settled requests.", "counter", |s| s.detail.wru),
    ("tollgate_client_read_bytes_total", "Bytes read by settled requests.", "counter", |s| {
        s.detail.read_bytes
    }),
    ("tollgate_client_write_bytes_total", "Bytes written by settled requests.", "counter", |s| {
        s.detail.write_bytes
    }),
    ("tollgate_client_cpu_ms_total", "CPU milliseconds of settled requests.", "counter", |s| s.detail.cpu_ms),
    ("tollgate_client_read_requests_total", "Settled read requests.", "counter", |s| s.detail.read_rpcs),
    ("tollgate_client_write_requests_total", "Settled write requests.", "counter", |s| s.detail.write_rpcs),
];

impl Tollgate {
    /// This process's Tollgate metrics in Prometheus's text format (version 0.0.4), to be
    /// served with the application's own. Every group in use is labelled `group`; the mode
    /// is the `mode` label of `tollgate_client_info`.
    ///
    /// ```
    /// # use tollgate_client::Tollgate;
    /// let gate = Tollgate::from_toml("[groups.api]\nlimit = 1000\n")?;
    /// drop(gate.try_acquire("api", 2.0)?);
    /// let text = gate.metrics();
    /// assert!(text.contains("tollgate_client_info{mode=\"embedded\"} 1"));
    /// assert!(text.contains("tollgate_client_admitted_units_total{group=\"api\"} 2"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> String {
        let mut out = String::with_capacity(4096);
        write_header(&mut out, "tollgate_client_info", "The mode this limiter runs in.", "gauge");
        write_sample(&mut out, "tollgate_client_info", "mode", self.mode(), 1.0);
        let mut stats = self.all_stats();
        stats.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, help, kind, read) in GROUP_FAMILIES {
            write_header(&mut out, name, help, kind);
            for (group, s) in &stats {
                write_sample(&mut out, name, "group", group, read(s));
            }
        }
        let link = |out: &mut String, connected: bool, safe: bool| {
            for (name, help, v) in [
                ("tollgate_client_connected", "1 when the last exchange or sync succeeded.", connected),
                ("tollgate_client_safe_mode", "1 while the safe-mode policy applies.", safe),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", u8::from(v));
            }
        };
        if let Some(r) = self.remote_status() {
            link(&mut out, r.connected, r.safe_mode);
            let _ = writeln!(
                out,
                "# HELP tollgate_client_exchanges_total Successful exchanges with the controller.\n# TYPE tollgate_client_exchanges_total counter\ntollgate_client_exchanges_total {}",
                r.exchanges
            );
        }
        if let Some(s) = self.store_status() {
            if s.replicas.is_none() {
                link(&mut out, s.connected, s.safe_mode);
                let _ = writeln!(
                    out,
                    "# HELP tollgate_client_store_syncs_total Successful syncs with the store.\n# TYPE tollgate_client_store_syncs_total counter\ntollgate_client_store_syncs_total {}",
                    s.syncs
                );
            }
            for (name, help, read) in [
                ("tollgate_client_pool_units", "A group's pool per one-second epoch, for all processes.", 0),
                ("tollgate_client_pool_size", "Processes sharing the pool: agreed, or the replica count.", 1),
                ("tollgate_client_pool_share_units", "This process's share of the pool this epoch.", 2),
            ] {
                write_header(&mut out, name, help, "gauge");
                for g in &s.groups {
                    let v = [g.pool, g.size as f64, g.share][read];
                    write_sample(&mut out, name, "group", &g.group, v);
                }
            }
        }
        out
    }
}
