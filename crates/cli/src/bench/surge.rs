//! `tollgate bench surge`: how fast the controller reins in a tenant whose surge saturates a
//! real service, measured the way an operator watches it.
//!
//! Two tenants write 4 KiB values to a service protected by Tollgate (examples/kv-service):
//! `gold`, reserved 200,000 units/s at high priority, asks 40 values/s throughout; `bronze`,
//! limited to 100,000 units/s at low priority, asks 60/s. Then bronze's limit is lifted and it
//! asks `--surge` values/s, beyond the service's capacity. Every 100 ms the program reads the
//! controller's status (is bronze busy, its target) and the service's utilisation; it prints a
//! line a second and then the figures: when bronze was marked busy, the peak utilisation, from
//! when on the utilisation stayed within 5 % of 1, and each tenant's median latency.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_proto::v1;

use crate::bench::load::{Load, http};

/// Prints one formatted line (see [`crate::say`]).
macro_rules! say {
    ($($t:tt)*) => {
        crate::say(format!($($t)*))
    };
}

/// `tollgate bench surge` arguments.
#[derive(Args, Debug)]
pub struct SurgeArgs {
    /// The controller (a test controller: this creates or replaces the groups `gold` and
    /// `bronze`).
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// The service's HTTP address (host:port): an examples/kv-service following this
    /// controller.
    #[arg(long)]
    service: SocketAddr,
    /// Seconds before the surge, with bronze held at its limit.
    #[arg(long, default_value_t = 6.0, value_parser = seconds)]
    before: f64,
    /// Seconds of the surge.
    #[arg(long, default_value_t = 20.0, value_parser = seconds)]
    duration: f64,
    /// Values per second bronze asks during the surge (4 KiB each; 400 is 1.6 times a service
    /// of 1 MB/s).
    #[arg(long, default_value_t = 400.0, value_parser = rate)]
    surge: f64,
}

fn seconds(s: &str) -> Result<f64, String> {
    ranged(s, "seconds", 1.0, 3600.0)
}

fn rate(s: &str) -> Result<f64, String> {
    ranged(s, "values per second", 1.0, 5000.0)
}

/// A number of `what` from `lo` to `hi`.
pub(crate) fn ranged(s: &str, what: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("expected {what}, got {s:?}"))?;
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be {lo} to {hi}, got {v}"))
    }
}

/// The size of each value written.
const VALUE_BYTES: usize = 4096;
/// How often the controller and the service are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Bronze's limit before the surge, units/s.
const BRONZE_LIMIT: f64 = 100_000.0;

/// One reading: seconds since the surge began, bronze busy, its target, the service's
/// utilisation.
struct Reading {
    at: f64,
    busy: bool,
    target: Option<f64>,
    utilisation: f64,
}

fn put_request(service: SocketAddr, tenant: &str, key: u64) -> Vec<u8> {
    let mut r = format!(
        "PUT /kv/{tenant}-{key} HTTP/1.1\r\nHost: {service}\r\nx-tollgate-group: {tenant}\r\nContent-Length: {VALUE_BYTES}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    r.resize(r.len() + VALUE_BYTES, b'v');
    r
}

/// The service's utilisation from its `/stats`.
async fn utilisation(service: SocketAddr) -> Option<f64> {
    let request = format!("GET /stats HTTP/1.1\r\nHost: {service}\r\nConnection: close\r\n\r\n");
    let answer = http(service, request.as_bytes()).await?;
    let body = answer.windows(4).position(|w| w == b"\r\n\r\n").map(|i| &answer[i + 4..])?;
    let stats: serde_json::Value = serde_json::from_slice(body).ok()?;
    stats["utilisation"].as_f64()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Runs the surge and prints what it saw.
pub async fn surge(a: SurgeArgs, target: &crate::admin::Target) -> anyhow::Result<()> {
    let mut admin = crate::bench::admin_client(&a.server, target).await?;
    let high = u32::from(tollgate_model::settings::Priority::HIGH.level());
    let low = u32::from(tollgate_model::settings::Priority::LOW.level());
    let gold = v1::GroupPatch { reserved: Some(200_000.0), priority: Some(high), ..Default::default() };
    let bronze = v1::GroupPatch { limit: Some(BRONZE_LIMIT), priority: Some(low), ..Default::default() };
    crate::bench::put(&mut admin, "gold", gold).await?;
    crate::bench::put(&mut admin, "bronze", bronze).await?;
    utilisation(a.service).await.with_context(|| format!("cannot read http://{}/stats", a.service))?;

    let load = Load::new(a.service);
    let service = a.service;
    let put = move |tenant: &'static str| move |n: u64| put_request(service, tenant, n % 10_000);
    let end = a.before + a.duration;
    let gold_load = tokio::spawn(load.clone().offer("gold", 40.0, end, put("gold")));
    let bronze_before = tokio::spawn(load.clone().offer("bronze", 60.0, a.before, put("bronze")));
    say!(
        "{:.0} s with bronze held at 100,000 units/s, then {} values/s for {:.0} s",
        a.before,
        a.surge,
        a.duration
    );
    tokio::time::sleep(Duration::from_secs_f64(a.before)).await;
    bronze_before.await?;
    let lifted = v1::GroupPatch { unlimited: true, ..Default::default() };
    crate::bench::put(&mut admin, "bronze", lifted).await?;
    let surge_at = load.secs();
    let bronze_load = tokio::spawn(load.clone().offer("bronze", a.surge, end, put("bronze")));

    say!("{:>5}  {:>6}  {:>12}  {:>11}", "s", "busy", "target", "utilisation");
    let mut readings = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    let mut printed = 0;
    while load.secs() < end {
        tick.tick().await;
        let at = load.secs() - surge_at;
        let status = admin
            .status(v1::StatusRequest { page_size: 100, page_token: String::new() })
            .await
            .map_err(|s| anyhow::anyhow!("status: {}", s.message()))?
            .into_inner();
        let group = status.groups.iter().find(|g| g.name == "bronze");
        let Some(u) = utilisation(a.service).await else { continue };
        let reading = Reading {
            at,
            busy: group.is_some_and(|g| g.busy),
            target: group.and_then(|g| g.target),
            utilisation: u,
        };
        if at >= printed as f64 {
            printed += 1;
            let target = reading.target.map_or("none".into(), |t| format!("{t:.0}"));
            say!("{:>5.1}  {:>6}  {:>12}  {:>11.3}", reading.at, reading.busy, target, reading.utilisation);
        }
        readings.push(reading);
    }
    gold_load.await?;
    bronze_load.await?;
    load.drain().await;

    let busy_after = readings.iter().find(|r| r.busy).map(|r| r.at);
    // The controller takes the lift at its next tick, and the service at its next exchange
    // after it: until then bronze is still held at its old limit and the surge has not
    // reached the service. Where the surge falls between two ticks moves `busy_after` by up
    // to a tick; the time from the lift's tick to the busy mark does not move.
    let lifted_after =
        readings.iter().find(|r| r.busy || r.target.is_none_or(|t| t > BRONZE_LIMIT * 1.001)).map(|r| r.at);
    let peak = readings.iter().map(|r| r.utilisation).fold(0.0, f64::max);
    // From when on every reading stayed within 5 % of 1.
    let settled_from = match readings.iter().rposition(|r| (r.utilisation - 1.0).abs() > 0.05) {
        Some(i) if i + 1 < readings.len() => Some(readings[i + 1].at),
        Some(_) => None,
        None => readings.first().map(|r| r.at),
    };
    let answers = load.answers.lock().unwrap();
    let latency = |tenant: &str| {
        median(
            answers
                .iter()
                .filter(|x| x.tag == tenant && x.status == 204 && x.at >= surge_at)
                .map(|x| x.latency)
                .collect(),
        )
    };
    let count = |tenant: &str, status: u16| {
        answers.iter().filter(|x| x.tag == tenant && x.status == status && x.at >= surge_at).count()
    };
    let secs = |v: Option<f64>| v.map_or("never".into(), |v| format!("{v:.1} s"));
    let ms = |v: Option<f64>| v.map_or("none".into(), |v| format!("{:.1} ms", v * 1e3));
    say!("bronze marked busy:       {} after the surge began", secs(busy_after));
    say!(
        "  of which:               {} until the controller's tick took the lift, {} from there",
        secs(lifted_after),
        secs(busy_after.zip(lifted_after).map(|(b, l)| b - l))
    );
    say!("peak utilisation:         {peak:.3}");
    say!("within 5 % of 1 from:     {}", secs(settled_from));
    say!("median latency (surge):   gold {}, bronze {}", ms(latency("gold")), ms(latency("bronze")));
    say!(
        "answers (surge):          gold {} stored, {} refused; bronze {} stored, {} refused",
        count("gold", 204),
        count("gold", 429),
        count("bronze", 204),
        count("bronze", 429)
    );
    load.say_troubles();
    Ok(())
}
