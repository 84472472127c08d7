//! A small key-value service over HTTP, protected by Tollgate end to end.
//!
//! ```text
//! cargo run --release -p tollgate-limiter --example kv-service -- \
//!     [--controller http://127.0.0.1:7460] [--listen 127.0.0.1:7480] [--capacity 1000000] [--concurrency 4] \
//!     [--compact-every SECONDS] [--step UNITS] [--work sleep|cpu] [--rounds N] [--learn]
//!     [--max-wait MS] [--admit-wait MS] [--per-backend]
//! ```
//!
//! - The tenant comes from the `x-tollgate-group` header (unknown or missing: `default`), and
//!   the request's class from `x-tollgate-class` (`critical`, `normal`, the default, or
//!   `sheddable`): admitted by the group's bucket in that class, and a critical request takes
//!   the next free slot ahead of the others.
//! - Each request is admitted by a remote Tollgate client fed by the controller, or refused
//!   with `429 Too Many Requests` and `Retry-After`.
//! - Admitted requests run through a [`Scheduler`]: `--concurrency` at once, the rest in
//!   (priority, virtual time) order, with the groups' settings (priorities, rates, soft quotas
//!   on each backend) fetched from the controller and kept current as they change.
//! - With `--compact-every`, the service compacts its table in the background group
//!   `compaction`, in 64 KiB steps through the same scheduler: configure that group with
//!   `--background true` and it gets what the front-end tenants leave of the capacity.
//! - The service does `--capacity` units of work per second (units are bytes): each request
//!   holds its slot for `cost ÷ (capacity ÷ concurrency)` seconds, done in steps of `--step`
//!   units (1024 by default); between steps a critical request waiting takes the slot over.
//!   Its actual cost, the value's size, settles the permit.
//! - With `--work cpu` the work is real instead: each request hashes its value `--rounds` times
//!   (200 by default) on a thread of its own, so what the service can do depends on the
//!   machine's processors, and requests past their number share them and take longer. There is
//!   no `--capacity` then.
//! - Four times a second it reports its utilisation (units/s arriving ÷ capacity, smoothed over
//!   1 s) and its busiest tenants' arriving units/s, measured the same way, to the controller,
//!   which limits tenants when the service is saturated.
//! - With `--learn`, nothing says what the service can do: the scheduler learns how many
//!   requests may run at once (at most `--concurrency`) from their latency, and the
//!   utilisation reported is the one that limit gives (docs/control.md, "Capacity learned from
//!   latency"). Without it, in `--work cpu` mode, the service reports no utilisation and is
//!   not protected from overload beyond `--concurrency`.
//! - `--max-wait` is how long a request waits for a slot before a `503` (default 5000 ms), and
//!   `--admit-wait` how long for its group's grant before a `429` (default 50 ms).
//! - With several such services behind one controller, each charges a tenant's place in its
//!   queue for what the others serve of it (dmClock's cross-backend term, docs/backend.md), so a
//!   tenant spread over them gets its share of all of them together; and a tenant with a limit
//!   is held on each to its share of the limit there, past which an idle service lends it
//!   capacity. `--per-backend` turns both off: each service shares itself alone.
//!
//! API: `PUT /kv/{key}` stores the body; `GET /kv/{key}` returns it; `GET /stats` shows the
//! utilisation, the scheduler's queue and what it learned, the settings version, the bytes
//! compacted, the units served per tenant, the units/s charged for each tenant's work on
//! other services and each tenant's share here; `PUT /slowdown` with a factor from 1 to 100 in its body makes each request's
//! work that many times longer from then on (the service slowing down, for the benchmarks);
//! `GET /healthz`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tollgate_limiter::core::adaptive::LearnSettings;
use tollgate_limiter::core::config::Config;
use tollgate_limiter::reporter::{BackendHealth, BackendReporter, ReporterOptions, TakesAnswers};
use tollgate_limiter::scheduler::{FollowOptions, Following, ScheduleError, Scheduler, SchedulerOptions};
use tollgate_limiter::{AcquireError, RemoteOptions, RequestClass, Tollgate};

const GROUP_HEADER: &str = "x-tollgate-group";
const CLASS_HEADER: &str = "x-tollgate-class";
/// Cost of a read before its size is known.
const READ_ESTIMATE: f64 = 4096.0;
/// The background group compaction runs in, and the size of one step.
const COMPACTION_GROUP: &str = "compaction";
const COMPACTION_STEP: f64 = 65_536.0;

struct Service {
    gate: Tollgate,
    scheduler: Scheduler,
    _following: Following,
    reporter: BackendReporter,
    /// Bytes compacted so far.
    compacted: AtomicU64,
    data: Mutex<HashMap<String, Bytes>>,
    /// Units of work per second the service can do, per slot.
    per_slot: f64,
    /// Units of work between two step boundaries.
    step: f64,
    /// Units that arrived in the current second (for utilisation).
    arrived: AtomicU64,
    /// Units/s arriving, smoothed, as f64 bits; and the capacity (none with `--work cpu`).
    arriving: Arc<AtomicU64>,
    capacity: Option<f64>,
    /// Hashing passes over a value per request, with `--work cpu`.
    rounds: Option<u32>,
    /// How many times longer each request's work is than at the start.
    slowdown: AtomicU64,
    /// Units served so far, by tenant (at most `SERVED_GROUPS_MAX` tenants named).
    served: Mutex<HashMap<String, f64>>,
}

/// The most tenants `/stats` counts the units served of.
const SERVED_GROUPS_MAX: usize = 10_000;

struct Options {
    controller: String,
    listen: String,
    capacity: f64,
    concurrency: usize,
    compact_every: Option<Duration>,
    step: f64,
    /// `--work cpu`: hashing passes per request.
    rounds: Option<u32>,
    capacity_given: bool,
    learn: bool,
    max_wait: Duration,
    admit_wait: Duration,
    /// Schedule by this service's own work only (no charge for other backends' work).
    per_backend: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        controller: "http://127.0.0.1:7460".into(),
        listen: "127.0.0.1:7480".into(),
        capacity: 1_000_000.0,
        concurrency: 4,
        compact_every: None,
        step: 1024.0,
        rounds: None,
        capacity_given: false,
        learn: false,
        max_wait: Duration::from_secs(5),
        admit_wait: Duration::from_millis(50),
        per_backend: false,
    };
    let mut cpu = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--learn" || flag == "--per-backend" {
            o.learn |= flag == "--learn";
            o.per_backend |= flag == "--per-backend";
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--controller" => o.controller = value,
            "--listen" => o.listen = value,
            "--capacity" => {
                o.capacity = value
                    .parse()
                    .ok()
                    .filter(|c: &f64| c.is_finite() && *c > 0.0)
                    .ok_or("--capacity: a number above 0")?;
                o.capacity_given = true;
            }
            "--work" => match value.as_str() {
                "sleep" => cpu = false,
                "cpu" => cpu = true,
                _ => return Err("--work: sleep or cpu".into()),
            },
            "--rounds" => {
                let rounds = value
                    .parse()
                    .ok()
                    .filter(|r: &u32| (1..=100_000).contains(r))
                    .ok_or("--rounds: a whole number from 1 to 100000")?;
                o.rounds = Some(rounds);
            }
            "--admit-wait" => {
                let ms = value
                    .parse()
                    .ok()
                    .filter(|m: &u64| *m <= 60_000)
                    .ok_or("--admit-wait: milliseconds from 0 to 60000")?;
                o.admit_wait = Duration::from_millis(ms);
            }
            "--max-wait" => {
                let ms = value
                    .parse()
                    .ok()
                    .filter(|m: &u64| (1..=60_000).contains(m))
                    .ok_or("--max-wait: milliseconds from 1 to 60000")?;
                o.max_wait = Duration::from_millis(ms);
            }
            "--concurrency" => {
                o.concurrency = value
                    .parse()
                    .ok()
                    .filter(|c: &usize| *c > 0)
                    .ok_or("--concurrency: a whole number above 0")?
            }
            "--compact-every" => {
                let secs = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                    .ok_or("--compact-every: seconds above 0, at most 86400")?;
                o.compact_every = Some(Duration::from_secs_f64(secs));
            }
            "--step" => {
                o.step = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 1.0)
                    .ok_or("--step: a number of units, at least 1")?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if cpu {
        if o.capacity_given {
            return Err("--capacity: not with --work cpu, whose capacity is the machine's".into());
        }
        o.rounds = Some(o.rounds.unwrap_or(DEFAULT_ROUNDS));
    } else if o.rounds.is_some() {
        return Err("--rounds: only with --work cpu".into());
    }
    Ok(o)
}

/// Hashing passes over a value per request with `--work cpu`.
const DEFAULT_ROUNDS: u32 = 200;

/// Real work: `rounds` passes of FNV-1a over `bytes`, each pass seeded by the last.
fn hash_rounds(bytes: &[u8], rounds: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for _ in 0..rounds {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h = std::hint::black_box(h);
    }
    h
}

fn group_of(headers: &HeaderMap) -> String {
    headers
        .get(GROUP_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|g| tollgate_limiter::core::settings::check_group_name(g).is_ok())
        .unwrap_or("default")
        .to_string()
}

fn too_many(retry_after: Duration) -> Response {
    let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let mut r = (StatusCode::TOO_MANY_REQUESTS, "throttled\n").into_response();
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    r
}

/// The request's class from its header; for a value that names no class, why not.
fn class_of(headers: &HeaderMap) -> Result<RequestClass, String> {
    match headers.get(CLASS_HEADER).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(RequestClass::Normal),
        Some(v) => RequestClass::from_name(v).map_err(|rule| format!("{CLASS_HEADER}: {rule}\n")),
    }
}

/// Admission, scheduling, work, settlement and reporting around one operation.
async fn serve(
    svc: &Service,
    headers: &HeaderMap,
    estimate: f64,
    op: impl FnOnce(&Service) -> (Response, f64, Bytes),
) -> Response {
    let group = group_of(headers);
    let group = group.as_str();
    let class = match class_of(headers) {
        Ok(class) => class,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    // A short wait covers the first grant of a group; longer waits become 429s.
    let admitted = match svc.gate.group(group) {
        Ok(handle) => handle.acquire_class(estimate, class).await.map(|p| p.into_owned()),
        Err(e) => Err(e),
    };
    let permit = match admitted {
        Ok(p) => p,
        Err(AcquireError::Throttled { retry_after, .. }) => return too_many(retry_after),
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    svc.arrived.fetch_add(estimate as u64, Ordering::Relaxed);
    svc.reporter.record(group, estimate);
    let mut slot = match svc.scheduler.acquire_class(group, estimate, class).await {
        Ok(s) => s,
        // Past the group's soft quota on this service.
        Err(ScheduleError::OverBackendLimit { retry_after, .. }) => return too_many(retry_after),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    };
    let (response, actual, value) = op(svc);
    let slowdown = svc.slowdown.load(Ordering::Relaxed);
    if let Some(rounds) = svc.rounds {
        // Real work, on a thread of its own: past the processors' number, requests share them.
        let passes = u64::from(rounds) * slowdown;
        let _ = tokio::task::spawn_blocking(move || hash_rounds(&value, passes)).await;
        drop(slot);
        count_served(svc, group, actual);
        let _ = permit.settle(actual);
        return response;
    }
    // The work itself, `per_slot` units per second in each slot, a step at a time.
    let mut left = actual * slowdown as f64;
    while left > 0.0 {
        let step = left.min(svc.step);
        tokio::time::sleep(Duration::from_secs_f64(step / svc.per_slot)).await;
        left -= step;
        if left > 0.0 {
            slot.yield_to_critical().await;
        }
    }
    drop(slot);
    count_served(svc, group, actual);
    let _ = permit.settle(actual);
    response
}

/// Counts `units` served for `group`, in `/stats`.
fn count_served(svc: &Service, group: &str, units: f64) {
    let mut served = svc.served.lock().unwrap();
    if let Some(total) = served.get_mut(group) {
        *total += units;
    } else if served.len() < SERVED_GROUPS_MAX {
        served.insert(group.to_string(), units);
    }
}

async fn get_key(State(svc): State<Arc<Service>>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    serve(&svc, &headers, READ_ESTIMATE, |svc| match svc.data.lock().unwrap().get(&key) {
        Some(v) => (v.clone().into_response(), v.len().max(1) as f64, v.clone()),
        None => (StatusCode::NOT_FOUND.into_response(), 1.0, Bytes::new()),
    })
    .await
}

async fn put_key(
    State(svc): State<Arc<Service>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let cost = body.len().max(1) as f64;
    serve(&svc, &headers, cost, |svc| {
        svc.data.lock().unwrap().insert(key, body.clone());
        (StatusCode::NO_CONTENT.into_response(), cost, body)
    })
    .await
}

/// The service's own view: utilisation (units/s arriving ÷ capacity, or the one the learned
/// limit gives), its queue and what it learned.
async fn stats(State(svc): State<Arc<Service>>) -> Response {
    let utilisation = match (svc.scheduler.health(), svc.capacity) {
        (Some(BackendHealth::Utilisation(u)), _) => Some(u),
        (_, Some(c)) => Some(f64::from_bits(svc.arriving.load(Ordering::Relaxed)) / c),
        _ => None,
    };
    let (running, waiting) = svc.scheduler.load();
    let learned = svc.scheduler.learned().map(|l| {
        serde_json::json!({
            "limit": l.limit,
            "estimate": l.estimate,
            "noload_ms": l.noload.map(|d| d.as_secs_f64() * 1e3),
            "latency_ms": l.latency.map(|d| d.as_secs_f64() * 1e3),
            "rate": l.rate,
            "arriving": l.arriving,
            "probing": l.probing,
        })
    });
    axum::Json(serde_json::json!({
        "utilisation": utilisation,
        "capacity": svc.capacity,
        "learned": learned,
        "slowdown": svc.slowdown.load(Ordering::Relaxed),
        "running": running,
        "waiting": waiting,
        "settings_version": svc.scheduler.settings_version(),
        "compacted_bytes": svc.compacted.load(Ordering::Relaxed),
        "served": *svc.served.lock().unwrap(),
        "elsewhere": svc.scheduler.elsewhere(),
        "shares": svc.scheduler.shares().into_iter().map(|(g, s)| (g, serde_json::json!({
            "units_per_s": s.units_per_s,
            "ceiling": s.ceiling,
            "cpu_ms_per_s": s.cpu_ms_per_s,
            "read_bytes_per_s": s.read_bytes_per_s,
            "write_bytes_per_s": s.write_bytes_per_s,
            "part": s.part,
        }))).collect::<serde_json::Map<String, serde_json::Value>>(),
    }))
    .into_response()
}

/// Makes each request's work `factor` times longer from now on.
async fn slowdown(State(svc): State<Arc<Service>>, body: String) -> Response {
    match body.trim().parse::<u64>() {
        Ok(f) if (1..=100).contains(&f) => {
            svc.slowdown.store(f, Ordering::Relaxed);
            StatusCode::NO_CONTENT.into_response()
        }
        _ => (StatusCode::BAD_REQUEST, "slowdown: a whole factor from 1 to 100\n").into_response(),
    }
}

/// Compacts the table every `every`: as many 64 KiB steps as it holds bytes, each scheduled
/// in the background group beside the tenants' requests and doing its share of work.
async fn compact(svc: Arc<Service>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let stored: usize = svc.data.lock().unwrap().values().map(Bytes::len).sum();
        let mut left = stored as f64;
        while left > 0.0 {
            let step = left.min(COMPACTION_STEP);
            match svc.scheduler.acquire(COMPACTION_GROUP, step).await {
                Ok(slot) => {
                    svc.arrived.fetch_add(step as u64, Ordering::Relaxed);
                    svc.reporter.record(COMPACTION_GROUP, step);
                    match svc.rounds {
                        Some(rounds) => {
                            let value = vec![0u8; step as usize];
                            let _ =
                                tokio::task::spawn_blocking(move || hash_rounds(&value, rounds.into())).await;
                        }
                        None => tokio::time::sleep(Duration::from_secs_f64(step / svc.per_slot)).await,
                    }
                    drop(slot);
                    svc.compacted.fetch_add(step as u64, Ordering::Relaxed);
                    left -= step;
                }
                Err(ScheduleError::OverBackendLimit { retry_after, .. }) => {
                    tokio::time::sleep(retry_after).await
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = options().map_err(|e| format!("kv-service: {e}"))?;
    // Bound first: the address names this service to the controller (`--listen` may ask for
    // any free port).
    let listener = tokio::net::TcpListener::bind(&o.listen).await?;
    let here = listener.local_addr()?;
    let remote = RemoteOptions {
        client_id: Some(format!("kv-service-{here}")),
        max_wait: o.admit_wait,
        ..RemoteOptions::default()
    };
    let gate = Tollgate::remote(&o.controller, remote)?;
    // Real work has the machine's capacity, which nothing here claims to know.
    let capacity = o.rounds.is_none().then_some(o.capacity);
    // The groups' settings come from the controller, pulled at once and pushed on change.
    let scheduler = Scheduler::new(
        &Config::default(),
        SchedulerOptions {
            concurrency: o.concurrency,
            capacity: capacity.filter(|_| !o.learn),
            max_wait: o.max_wait,
            learn: o.learn.then(LearnSettings::default),
            ..SchedulerOptions::default()
        },
    );
    let following = scheduler.follow(&o.controller, FollowOptions::default())?;
    let arrived_rate = Arc::new(AtomicU64::new(0));
    // Utilisation is the arriving load ÷ capacity, measured by the reporter itself so that
    // the load per tenant and the utilisation come from one smoothed measurement; or, learned,
    // the one the scheduler's limit gives.
    let learned = scheduler.clone();
    let reporter = BackendReporter::spawn(
        &o.controller,
        ReporterOptions {
            backend_id: format!("kv-{here}"),
            zone: "local".into(),
            capacity: capacity.filter(|_| !o.learn),
            scheduler: (!o.per_backend).then(|| Arc::new(scheduler.clone()) as Arc<dyn TakesAnswers>),
            ..ReporterOptions::default()
        },
        move || learned.health().unwrap_or(BackendHealth::Utilisation(0.0)),
    )?;
    let svc = Arc::new(Service {
        gate,
        scheduler,
        _following: following,
        reporter,
        compacted: AtomicU64::new(0),
        data: Mutex::new(HashMap::new()),
        per_slot: o.capacity / o.concurrency as f64,
        step: o.step,
        arrived: AtomicU64::new(0),
        arriving: arrived_rate.clone(),
        capacity,
        rounds: o.rounds,
        slowdown: AtomicU64::new(1),
        served: Mutex::new(HashMap::new()),
    });
    // Utilisation: units arriving per second, smoothed over about two seconds.
    {
        let svc = svc.clone();
        tokio::spawn(async move {
            let mut smoothed = 0.0;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let rate = svc.arrived.swap(0, Ordering::Relaxed) as f64 * 4.0;
                smoothed += (rate - smoothed) * 0.12;
                arrived_rate.store(f64::to_bits(smoothed), Ordering::Relaxed);
            }
        });
    }
    if let Some(every) = o.compact_every {
        tokio::spawn(compact(svc.clone(), every));
    }
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/kv/{key}", get(get_key).put(put_key))
        .route("/stats", get(stats))
        .route("/slowdown", axum::routing::put(slowdown))
        .with_state(svc);
    println!("kv-service listening on {} (controller {})", listener.local_addr()?, o.controller);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
