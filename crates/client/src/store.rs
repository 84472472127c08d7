//! Store mode: clients share each group's pool through Redis, with no controller.
//!
//! Numaflow's design: the clients of a group register in Redis,
//! send a heartbeat with the pool size they believe in, and agree on how many of them share
//! the pool. Each takes `⌊pool / size⌋` units per one-second epoch, locally; Redis is read by a
//! background task every 100 ms, never per request.
//!
//! Keys live under `tollgate:{namespace}:{group}:`, so two groups of the same name in
//! different namespaces never collide. Three Lua scripts run on the Redis server:
//!
//! - **register**: records the client's heartbeat, reports the live count as its size, and
//!   returns the ramp value a client that left recently stored (resumed ramp-up);
//! - **sync**: records the heartbeat and the size this client reports, drops every client
//!   whose heartbeat is older than `ttl`, and answers **AGREE** only when every live client
//!   reports the same size *and* it equals the number of live clients; otherwise
//!   **DISAGREE** with the largest size reported and the live count. On AGREE a client uses
//!   the agreed size; on DISAGREE it keeps the larger of its size and the largest reported
//!   (the conservative choice) and reports the live count next time. So the pool shrinks
//!   after a scale-down or a death, which Numaflow's original never does, and grows at a
//!   scale-up;
//! - **deregister**: removes the client and, for a ramp with a `resume_ttl_s`, keeps its value
//!   that long, so a client that registers within it resumes there instead of at `min`
//!   (resumed ramp-up is off by default, as in Numaflow).
//!
//! Store mode has no controller, so what needs one cannot apply: a node capacity, the `fcfs`
//! mode, a priority or weight (nothing shares a capacity by them), a parent, an in-flight
//! quota and a burst (each epoch's share is the burst). Building a store-mode handle with any
//! of them fails, naming it. Quotas per window are counted in Redis (`store_quota`).
//!
//! Redis unreachable at start: the limiter starts anyway within `connect_timeout`, in safe
//! mode. Redis lost while running: the last agreed size and the ramp carry on locally; after
//! `stale_limit` without a successful sync the safe-mode policy applies. `shutdown` never waits
//! on Redis for more than a second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tollgate_model::config::Config;
use tollgate_model::epoch::{Forced, PoolSpec};
use tollgate_model::ramp::Ramp;
use tollgate_model::settings::GroupName;

use crate::error::BuildError;
use crate::group::{Groups, Limiter};
use crate::remote::SafeModePolicy;
use crate::store_quota::StoreQuotas;

/// How a store-mode client behaves.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Keeps groups of different deployments apart: keys are `tollgate:{namespace}:{group}:…`.
    pub namespace: String,
    /// This client's id in the store (default: `tollgate-PID-N`).
    pub client_id: Option<String>,
    /// Heartbeats older than this drop a client.
    pub ttl: Duration,
    /// How often sizes are synchronised.
    pub sync_interval: Duration,
    /// How long to try to reach Redis at start before starting in safe mode.
    pub connect_timeout: Duration,
    /// How long without a successful sync before the safe-mode policy applies.
    pub stale_limit: Duration,
    /// What to do in safe mode.
    pub safe_mode: SafeModePolicy,
    /// For `rediss://` URLs: the authority Redis's certificate is checked against, and this
    /// client's certificate and key for Redis's `tls-auth-clients` (Redis's password goes in
    /// the URL, `rediss://:PASSWORD@HOST:PORT`; a token is refused here).
    pub access: crate::access::Access,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            client_id: None,
            ttl: Duration::from_secs(180),
            sync_interval: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(5),
            stale_limit: Duration::from_secs(10),
            safe_mode: SafeModePolicy::Decay,
            access: crate::access::Access::default(),
        }
    }
}

/// The store link's state, as the application can read it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStatus {
    /// The last sync succeeded.
    pub connected: bool,
    /// No sync succeeded for longer than the stale limit: the policy applies.
    pub safe_mode: bool,
    /// Per coordinated group, the number of clients this one counts as sharing the pool.
    pub sizes: Vec<(String, u64)>,
    /// Successful syncs so far.
    pub syncs: u64,
    /// Per coordinated group, by name: its pool, how many share it, and this process's share.
    pub groups: Vec<StoreGroupStatus>,
    /// Replicas mode: the fixed number of processes every pool is divided by (no store).
    pub replicas: Option<u64>,
}

/// One coordinated group, as a store-mode (or replicas-mode) process sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreGroupStatus {
    /// The group.
    pub group: String,
    /// Units per one-second epoch for all processes: the limit, or the ramp's pool now.
    pub pool: f64,
    /// How many processes share it: agreed through the store, or the replica count.
    pub size: u64,
    /// This process's share of the pool this epoch.
    pub share: f64,
}

const REGISTER: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
local live = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], live)
local resume = false
if ARGV[2] == '1' then resume = redis.call('GET', KEYS[3]) end
return {live, resume}
";

const SYNC: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local stale = tonumber(ARGV[3])
local beats = redis.call('HGETALL', KEYS[1])
for i = 1, #beats, 2 do
  if now - tonumber(beats[i + 1]) > stale then
    redis.call('HDEL', KEYS[1], beats[i])
    redis.call('HDEL', KEYS[2], beats[i])
  end
end
local live = redis.call('HLEN', KEYS[1])
local lo, hi = nil, 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  local n = tonumber(v)
  if lo == nil or n < lo then lo = n end
  if n > hi then hi = n end
end
if lo == hi and hi == live then return {1, hi, live} end
return {0, hi, live}
";

const DEREGISTER: &str = r"
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then
  local prev = tonumber(redis.call('GET', KEYS[3]) or '-1')
  if tonumber(ARGV[2]) >= prev then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  end
end
return 1
";

static REGISTER_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REGISTER));
static SYNC_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SYNC));
static DEREGISTER_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DEREGISTER));

struct Keys {
    heartbeat: String,
    sizes: String,
    resume: String,
}

/// The start of every key of `group`'s: braces keep them in one Redis Cluster slot, as the
/// scripts need.
fn quota_prefix(namespace: &str, group: &GroupName) -> String {
    format!("tollgate:{{{namespace}:{group}}}:")
}

fn keys(namespace: &str, group: &GroupName) -> Keys {
    let prefix = quota_prefix(namespace, group);
    Keys {
        heartbeat: format!("{prefix}heartbeat"),
        sizes: format!("{prefix}sizes"),
        resume: format!("{prefix}resume"),
    }
}

/// Shared between the limiter and its sync task.
pub(crate) struct StoreLink {
    /// Replicas mode: every pool divided by this fixed count, with no store.
    replicas: Option<u64>,
    client_id: String,
    opts: StoreOptions,
    url: String,
    /// The Redis client (`None` in replicas mode), with TLS for `rediss://`.
    redis: Option<redis::Client>,
    /// The coordinated groups, each with its ramp's resume TTL if it has one.
    groups: Vec<(GroupName, Option<Duration>)>,
    /// Per group: the size used and the size to report next.
    sizes: Mutex<HashMap<GroupName, (u64, u64)>>,
    connected: AtomicBool,
    safe_mode: AtomicBool,
    syncs: AtomicU64,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The groups' quotas per window, counted in Redis (or in this process's share).
    pub(crate) quotas: StoreQuotas,
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

async fn open(client: Option<&redis::Client>, timeout: Duration) -> Result<MultiplexedConnection, String> {
    let client = client.ok_or("no store in replicas mode")?;
    match tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Refuses what store mode cannot carry out: it has no controller.
pub(crate) fn check_supported(config: &Config, mode: &'static str) -> Result<(), BuildError> {
    let unsupported = |field: String, reason: &'static str| BuildError::Unsupported { mode, field, reason };
    if config.node.capacity.is_some() {
        return Err(unsupported(
            "node.capacity".into(),
            "no controller shares a capacity among groups; use the embedded or remote mode",
        ));
    }
    if config.node.mode != tollgate_model::allocate::AllocationMode::Share {
        return Err(unsupported(
            "node.mode = \"fcfs\"".into(),
            "no controller shares a free pool; use the embedded or remote mode",
        ));
    }
    if config.node.slow_start {
        return Err(unsupported(
            "node.slow_start".into(),
            "no controller holds reservations against a capacity; use the embedded or remote mode",
        ));
    }
    for (name, s) in &config.groups {
        if s.parent().is_some() {
            return Err(unsupported(
                format!("groups.{name}.parent"),
                "no controller shares a parent's limit among its children; use the embedded or remote mode",
            ));
        }
        if s.max_in_flight().is_some() {
            return Err(unsupported(
                format!("groups.{name}.max_in_flight"),
                "a slot held by a process that dies cannot come back without a controller's lease; use the embedded or remote mode",
            ));
        }
        if s.burst().is_some() {
            return Err(unsupported(
                format!("groups.{name}.burst"),
                "each one-second epoch's share is the burst; remove it",
            ));
        }
        if s.priority() != tollgate_model::settings::Priority::MEDIUM {
            return Err(unsupported(
                format!("groups.{name}.priority"),
                "no controller shares a capacity among groups by priority; use the embedded or remote mode",
            ));
        }
        if s.weight() != 1.0 {
            return Err(unsupported(
                format!("groups.{name}.weight"),
                "no controller shares a capacity among groups by weight; use the embedded or remote mode",
            ));
        }
        if s.reads_writes_apart() {
            return Err(unsupported(
                format!("groups.{name}.reads_writes_apart"),
                "no engine keeps the group's read and write costs; use the embedded or remote mode",
            ));
        }
        if s.debt_repay() != tollgate_model::settings::DEBT_REPAY_DEFAULT {
            return Err(unsupported(
                format!("groups.{name}.debt_repay_s"),
                "a debt is taken from the next one-second epoch's share of the pool; remove it",
            ));
        }
    }
    Ok(())
}

/// What registering with Redis gives: the link, each coordinated group's pool and starting
/// size, and the connection (none when Redis was unreachable).
pub(crate) type Registered = (StoreLink, HashMap<GroupName, (PoolSpec, u64)>, Option<MultiplexedConnection>);

/// Checks the options and registers this client for every coordinated group: those with a
/// finite limit or a ramp (the limit, or the ramp, is the pool per epoch).
pub(crate) async fn register(
    url: &str,
    config: &Config,
    opts: StoreOptions,
) -> Result<Registered, BuildError> {
    let redis = opts
        .access
        .redis_client(url)
        .map_err(|reason| BuildError::Remote { url: url.to_string(), reason })?;
    if opts.namespace.is_empty() || opts.namespace.contains(['{', '}']) {
        return Err(BuildError::Remote {
            url: url.to_string(),
            reason: "namespace: must be non-empty, without braces".into(),
        });
    }
    check_supported(config, "store")?;
    let client_id = opts.client_id.clone().unwrap_or_else(|| {
        format!("tollgate-{}-{}", std::process::id(), NEXT_CLIENT.fetch_add(1, Ordering::Relaxed))
    });
    let coordinated = coordinated(config);
    let mut connection = open(Some(&redis), opts.connect_timeout).await.ok();
    let mut shares = HashMap::new();
    let mut sizes = HashMap::new();
    for (name, ramp, limit) in &coordinated {
        let k = keys(&opts.namespace, name);
        let resumes = ramp.is_some_and(|r| r.resume_ttl.is_some());
        let registered: Option<(u64, Option<f64>)> = match &mut connection {
            Some(c) => {
                let mut invocation = REGISTER_SCRIPT.key(&k.heartbeat);
                invocation.key(&k.sizes).key(&k.resume).arg(&client_id).arg(if resumes { "1" } else { "0" });
                let call = invocation.invoke_async::<(u64, Option<f64>)>(c);
                tokio::time::timeout(opts.connect_timeout, call).await.ok().and_then(Result::ok)
            }
            None => None,
        };
        let (size, resume) = registered.unwrap_or((1, None));
        shares.insert(name.clone(), (pool_spec(*ramp, *limit, resume), size.max(1)));
        sizes.insert(name.clone(), (size.max(1), size.max(1)));
    }
    let link = StoreLink {
        replicas: None,
        client_id,
        opts,
        url: url.to_string(),
        redis: Some(redis),
        groups: coordinated.into_iter().map(|(n, r, _)| (n, r.and_then(|r| r.resume_ttl))).collect(),
        sizes: Mutex::new(sizes),
        connected: AtomicBool::new(connection.is_some()),
        safe_mode: AtomicBool::new(false),
        syncs: AtomicU64::new(0),
        task: Mutex::new(None),
        quotas: StoreQuotas::of(config, None),
    };
    Ok((link, shares, connection))
}

/// The groups a store coordinates: those with a finite limit or a ramp, with the ramp and
/// the limit.
type Coordinated = Vec<(GroupName, Option<tollgate_model::settings::RampSettings>, f64)>;

fn coordinated(config: &Config) -> Coordinated {
    config
        .groups
        .iter()
        .filter(|(_, s)| s.ramp().is_some() || s.limit().is_finite())
        .map(|(n, s)| (n.clone(), s.ramp().copied(), s.limit().as_f64()))
        .collect()
}

fn pool_spec(
    ramp: Option<tollgate_model::settings::RampSettings>,
    limit: f64,
    resume: Option<f64>,
) -> PoolSpec {
    match ramp {
        Some(r) => PoolSpec::Ramp(Ramp::new(r, resume)),
        None => PoolSpec::Fixed(limit),
    }
}

/// The most replicas replicas mode takes.
pub const REPLICAS_MAX: u64 = 100_000;

/// Replicas mode (Numaflow's "optionally remove external store"): every coordinated group's
/// pool divided by a replica count the deployment gives, with no store and no task. The
/// count is `replicas`, or else the `TOLLGATE_REPLICAS` environment variable.
pub(crate) fn fixed(config: &Config, replicas: Option<u64>) -> Result<Registered, BuildError> {
    check_supported(config, "replicas")?;
    let bad = |reason: String| BuildError::Remote { url: "replicas".into(), reason };
    let n = match replicas {
        Some(n) => n,
        None => match std::env::var("TOLLGATE_REPLICAS") {
            Ok(v) => v.trim().parse::<u64>().map_err(|_| {
                bad(format!("TOLLGATE_REPLICAS: must be a whole number from 1 to {REPLICAS_MAX}, got {v:?}"))
            })?,
            Err(_) => {
                return Err(bad("replicas: give the replica count, or set TOLLGATE_REPLICAS".into()));
            }
        },
    };
    if !(1..=REPLICAS_MAX).contains(&n) {
        return Err(bad(format!("replicas: must be from 1 to {REPLICAS_MAX}, got {n}")));
    }
    let coordinated = coordinated(config);
    let shares =
        coordinated.iter().map(|(g, ramp, limit)| (g.clone(), (pool_spec(*ramp, *limit, None), n))).collect();
    let link = StoreLink {
        replicas: Some(n),
        client_id: String::new(),
        opts: StoreOptions::default(),
        url: String::new(),
        redis: None,
        sizes: Mutex::new(coordinated.iter().map(|(g, _, _)| (g.clone(), (n, n))).collect()),
        groups: coordinated.into_iter().map(|(g, _, _)| (g, None)).collect(),
        connected: AtomicBool::new(false),
        safe_mode: AtomicBool::new(false),
        syncs: AtomicU64::new(0),
        task: Mutex::new(None),
        quotas: StoreQuotas::of(config, Some(n)),
    };
    Ok((link, shares, None))
}

/// Starts the sync task (in safe mode if Redis was unreachable at start).
pub(crate) fn start(link: &Arc<StoreLink>, groups: &Arc<Groups>, connection: Option<MultiplexedConnection>) {
    if connection.is_none() {
        tracing::warn!(client = %link.client_id, url = %link.url, "tollgate: Redis unreachable at start, starting in safe mode");
        enter_safe_mode(groups, link);
    }
    let task = tokio::spawn(sync_loop(Arc::downgrade(groups), link.clone(), connection));
    *link.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
}

impl StoreLink {
    /// Whether this is replicas mode (no store).
    pub(crate) fn is_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    /// `store`, or `replicas` when there is no store.
    pub(crate) fn mode_name(&self) -> &'static str {
        if self.replicas.is_some() { "replicas" } else { "store" }
    }

    /// The link's state, with each coordinated group's pool and share at `now`.
    pub(crate) fn status(&self, groups: &Groups, now: tollgate_model::time::Nanos) -> StoreStatus {
        let mut per_group: Vec<StoreGroupStatus> = self
            .groups
            .iter()
            .filter_map(|(name, _)| {
                let g = groups.get(name.as_str())?;
                let Limiter::Epoch(share) = g.limiter() else { return None };
                let (pool, mine) = share.pool_and_share(now);
                Some(StoreGroupStatus { group: name.to_string(), pool, size: share.size(), share: mine })
            })
            .collect();
        per_group.sort_by(|a, b| a.group.cmp(&b.group));
        let mut sizes: Vec<(String, u64)> = self
            .sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(g, (used, _))| (g.to_string(), *used))
            .collect();
        sizes.sort();
        StoreStatus {
            connected: self.connected.load(Ordering::Relaxed),
            safe_mode: self.safe_mode.load(Ordering::Relaxed),
            sizes,
            syncs: self.syncs.load(Ordering::Relaxed),
            groups: per_group,
            replicas: self.replicas,
        }
    }

    /// Stops syncing and deregisters every group, keeping each resumable ramp's value for its
    /// TTL. Waits on Redis for at most a second.
    pub(crate) async fn shutdown(&self, groups: &Groups) {
        if self.replicas.is_some() {
            return;
        }
        if let Some(task) = self.task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        let deregister = async {
            let mut c = open(self.redis.as_ref(), Duration::from_secs(1)).await.ok()?;
            for (name, resume_ttl) in &self.groups {
                let k = keys(&self.opts.namespace, name);
                let ramp = match (resume_ttl, groups.get(name.as_str()).map(|g| ramp_value(g.limiter()))) {
                    (Some(_), Some(Some(v))) => v.to_string(),
                    _ => String::new(),
                };
                let ttl_ms = resume_ttl.map_or(1, |t| t.as_millis().max(1)).to_string();
                let mut invocation = DEREGISTER_SCRIPT.key(&k.heartbeat);
                invocation.key(&k.sizes).key(&k.resume).arg(&self.client_id).arg(ramp).arg(ttl_ms);
                let _ = invocation.invoke_async::<i64>(&mut c).await;
            }
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), deregister).await;
        self.connected.store(false, Ordering::Relaxed);
    }
}

fn ramp_value(limiter: Limiter) -> Option<f64> {
    match limiter {
        Limiter::Epoch(share) => share.ramp_value(),
        Limiter::Bucket(_) => None,
    }
}

fn set_size(groups: &Groups, group: &GroupName, size: u64) {
    if let Some(g) = groups.get(group.as_str())
        && let Limiter::Epoch(share) = g.limiter()
    {
        share.set_size(size);
    }
}

fn force(groups: &Groups, group: &GroupName, forced: Option<Forced>) {
    if let Some(g) = groups.get(group.as_str())
        && let Limiter::Epoch(share) = g.limiter()
    {
        share.force(forced);
    }
}

fn enter_safe_mode(groups: &Groups, link: &StoreLink) {
    if link.safe_mode.swap(true, Ordering::Relaxed) {
        return;
    }
    let forced = match link.opts.safe_mode {
        SafeModePolicy::FailOpen => Some(Forced::Open),
        SafeModePolicy::FailClosed => Some(Forced::Closed),
        // Keep the last agreed size and the ramp, locally.
        SafeModePolicy::Decay => None,
    };
    for (g, _) in &link.groups {
        force(groups, g, forced);
    }
}

/// Agrees each group's pool size with the other clients (reporting this one's and taking the
/// largest, or a conservative size while they disagree). `false` when Redis did not answer.
async fn sync_sizes(
    c: &mut MultiplexedConnection,
    link: &StoreLink,
    groups: &Groups,
    stale_ms: &str,
) -> bool {
    for (name, _) in &link.groups {
        let k = keys(&link.opts.namespace, name);
        let report = link.sizes.lock().unwrap_or_else(PoisonError::into_inner).get(name).map_or(1, |s| s.1);
        let mut invocation = SYNC_SCRIPT.key(&k.heartbeat);
        invocation.key(&k.sizes).arg(&link.client_id).arg(report).arg(stale_ms);
        let call = invocation.invoke_async::<(i64, u64, u64)>(c);
        match tokio::time::timeout(Duration::from_secs(1), call).await {
            Ok(Ok((agree, largest, live))) => {
                let mut sizes = link.sizes.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = sizes.entry(name.clone()).or_insert((1, 1));
                *entry = if agree == 1 {
                    (largest.max(1), largest.max(1))
                } else {
                    // Conservative while the clients disagree; report what is live.
                    (entry.0.max(largest).max(1), live.max(1))
                };
                set_size(groups, name, entry.0);
            }
            _ => return false,
        }
    }
    true
}

async fn sync_loop(
    groups: Weak<Groups>,
    link: Arc<StoreLink>,
    mut connection: Option<MultiplexedConnection>,
) {
    let mut last_ok: Option<tokio::time::Instant> = None;
    #[allow(clippy::disallowed_methods)] // the store link's edge: tokio time
    let started = tokio::time::Instant::now();
    let stale_ms = link.opts.ttl.as_millis().to_string();
    let mut next = started + link.opts.sync_interval;
    loop {
        // A sync each interval; between them, more of a quota as soon as an allotment runs out.
        let quotas_only = tokio::select! {
            () = tokio::time::sleep_until(next) => false,
            () = link.quotas.wanted() => true,
        };
        let Some(groups) = groups.upgrade() else { return };
        if quotas_only {
            if let Some(c) = &mut connection
                && !link.quotas.refill(c, |g| quota_prefix(&link.opts.namespace, g), &groups).await
            {
                connection = None;
            }
            link.quotas.answer();
            continue;
        }
        #[allow(clippy::disallowed_methods)] // the store link's edge: tokio time
        let synced = tokio::time::Instant::now();
        next = synced + link.opts.sync_interval;
        if connection.is_none() {
            let wait = link.opts.sync_interval.max(Duration::from_millis(200));
            connection = open(link.redis.as_ref(), wait).await.ok();
        }
        let mut ok = connection.is_some();
        if let Some(c) = &mut connection {
            ok = sync_sizes(c, &link, &groups, &stale_ms).await;
            if ok && !link.quotas.is_empty() {
                ok = link.quotas.refill(c, |g| quota_prefix(&link.opts.namespace, g), &groups).await;
            }
        }
        link.quotas.answer();
        #[allow(clippy::disallowed_methods)]
        let now = tokio::time::Instant::now();
        if ok {
            last_ok = Some(now);
            link.syncs.fetch_add(1, Ordering::Relaxed);
            link.connected.store(true, Ordering::Relaxed);
            if link.safe_mode.swap(false, Ordering::Relaxed) {
                tracing::info!(client = %link.client_id, "tollgate: Redis reachable again, leaving safe mode");
                for (g, _) in &link.groups {
                    force(&groups, g, None);
                }
            }
        } else {
            connection = None;
            link.connected.store(false, Ordering::Relaxed);
            let since = now.duration_since(last_ok.unwrap_or(started));
            if since > link.opts.stale_limit && !link.safe_mode.load(Ordering::Relaxed) {
                tracing::warn!(client = %link.client_id, policy = ?link.opts.safe_mode, "tollgate: Redis unreachable past the stale limit, entering safe mode");
                enter_safe_mode(&groups, &link);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Asserts that the Python client's store mode holds `script` as `name`, word for word:
    /// Python and Rust processes share a pool only while they run the same scripts.
    pub(crate) fn assert_python_runs(name: &str, script: &str) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python/tollgate/_store_scripts.py");
        let python = std::fs::read_to_string(path).unwrap();
        let copy = format!("{name} = \"\"\"{script}\"\"\"");
        assert!(python.contains(&copy), "{path}: {name} is not the Rust client's script");
    }

    #[test]
    fn the_python_client_runs_the_same_scripts() {
        for (name, script) in [("REGISTER", REGISTER), ("SYNC", SYNC), ("DEREGISTER", DEREGISTER)] {
            assert_python_runs(name, script);
        }
    }
}
