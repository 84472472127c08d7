//! Store mode: clients share each group's pool through Redis, with no controller.
//!
//! Numaflow's design (`003_7775cef0a2611e73.txt`): the clients of a group register in Redis,
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
//! - **deregister**: removes the client and keeps its ramp value for `ttl`, so a client that
//!   registers within it resumes there instead of at `min`.
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
use tollgate_core::config::Config;
use tollgate_core::epoch::{Forced, PoolSpec};
use tollgate_core::ramp::Ramp;
use tollgate_core::settings::{DEFAULT_GROUP, GroupName};

use crate::error::BuildError;
use crate::limiter::{Builder, Tollgate};
use crate::remote::SafeModePolicy;

/// How a store-mode client behaves.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Keeps groups of different deployments apart: keys are `tollgate:{namespace}:{group}:…`.
    pub namespace: String,
    /// This client's id in the store (default: `tollgate-PID-N`).
    pub client_id: Option<String>,
    /// Heartbeats older than this drop a client; a left client's ramp is kept this long.
    pub ttl: Duration,
    /// How often sizes are synchronised.
    pub sync_interval: Duration,
    /// How long to try to reach Redis at start before starting in safe mode.
    pub connect_timeout: Duration,
    /// How long without a successful sync before the safe-mode policy applies.
    pub stale_limit: Duration,
    /// What to do in safe mode.
    pub safe_mode: SafeModePolicy,
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
}

const REGISTER: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
local live = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], live)
local resume = redis.call('GET', KEYS[3])
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

fn keys(namespace: &str, group: &GroupName) -> Keys {
    // Braces keep a group's keys in one Redis Cluster slot, as the scripts need.
    let prefix = format!("tollgate:{{{namespace}:{group}}}:");
    Keys {
        heartbeat: format!("{prefix}heartbeat"),
        sizes: format!("{prefix}sizes"),
        resume: format!("{prefix}resume"),
    }
}

/// Shared between the limiter and its sync task.
pub(crate) struct StoreLink {
    client_id: String,
    opts: StoreOptions,
    url: String,
    groups: Vec<GroupName>,
    /// Per group: the size used and the size to report next.
    sizes: Mutex<HashMap<GroupName, (u64, u64)>>,
    connected: AtomicBool,
    safe_mode: AtomicBool,
    syncs: AtomicU64,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

async fn connect(url: &str, timeout: Duration) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

impl Tollgate {
    /// A limiter whose groups share their pools with every other client of the same Redis
    /// and namespace, with no controller. `config` gives the groups: each group with a finite
    /// limit or a ramp is coordinated (its limit, or its ramp, is the pool per epoch); groups
    /// without either are not throttled. Must be called inside a tokio runtime; returns within
    /// `connect_timeout` even when Redis is unreachable (in safe mode then).
    pub async fn store(url: &str, config: Config, opts: StoreOptions) -> Result<Tollgate, BuildError> {
        Self::store_with_clock(url, config, opts, crate::clock::MonotonicClock::new()).await
    }

    /// [`Tollgate::store`] on a given clock (epochs follow it; tests use a manual clock).
    pub async fn store_with_clock(
        url: &str,
        config: Config,
        opts: StoreOptions,
        clock: impl tollgate_core::time::Clock,
    ) -> Result<Tollgate, BuildError> {
        tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        redis::Client::open(url)
            .map_err(|e| BuildError::Remote { url: url.to_string(), reason: format!("url: {e}") })?;
        if opts.namespace.is_empty() || opts.namespace.contains(['{', '}']) {
            return Err(BuildError::Remote {
                url: url.to_string(),
                reason: "namespace: must be non-empty, without braces".into(),
            });
        }
        let client_id = opts.client_id.clone().unwrap_or_else(|| {
            format!("tollgate-{}-{}", std::process::id(), NEXT_CLIENT.fetch_add(1, Ordering::Relaxed))
        });
        // The coordinated groups: those with a pool to share.
        let mut coordinated: Vec<(GroupName, Option<tollgate_core::settings::RampSettings>, f64)> =
            Vec::new();
        for (name, s) in &config.groups {
            if s.ramp().is_some() || s.limit().is_finite() {
                coordinated.push((name.clone(), s.ramp().copied(), s.limit().as_f64()));
            }
        }
        let mut connection = connect(url, opts.connect_timeout).await.ok();
        let mut shares = HashMap::new();
        let mut sizes = HashMap::new();
        for (name, ramp, limit) in &coordinated {
            let k = keys(&opts.namespace, name);
            let registered: Option<(u64, Option<f64>)> = match &mut connection {
                Some(c) => {
                    let mut invocation = REGISTER_SCRIPT.key(&k.heartbeat);
                    invocation.key(&k.sizes).key(&k.resume).arg(&client_id);
                    let call = invocation.invoke_async::<(u64, Option<f64>)>(c);
                    tokio::time::timeout(opts.connect_timeout, call).await.ok().and_then(Result::ok)
                }
                None => None,
            };
            let (size, resume) = registered.unwrap_or((1, None));
            let spec = match ramp {
                Some(r) => PoolSpec::Ramp(Ramp::new(*r, resume)),
                None => PoolSpec::Fixed(*limit),
            };
            shares.insert(name.clone(), (spec, size.max(1)));
            sizes.insert(name.clone(), (size.max(1), size.max(1)));
        }
        let connected = connection.is_some();
        let mut config = config;
        // Names outside the settings share the default group's state.
        config.node.max_tracked_groups =
            config.groups.len() + usize::from(!config.groups.keys().any(|g| g.as_str() == DEFAULT_GROUP));
        let gate = Builder::default().config(config).shares(Arc::new(shares)).clock(clock).build()?;
        let link = Arc::new(StoreLink {
            client_id,
            opts,
            url: url.to_string(),
            groups: coordinated.into_iter().map(|(n, _, _)| n).collect(),
            sizes: Mutex::new(sizes),
            connected: AtomicBool::new(connected),
            safe_mode: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            task: Mutex::new(None),
        });
        if !connected {
            tracing::warn!(client = %link.client_id, url, "tollgate: Redis unreachable at start, starting in safe mode");
            enter_safe_mode(&**gate.inner_arc(), &link);
        }
        let task = tokio::spawn(sync_loop(Arc::downgrade(gate.inner_arc()), link.clone(), connection));
        *link.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        gate.set_store(link);
        Ok(gate)
    }

    /// The store link's state, in store mode.
    pub fn store_status(&self) -> Option<StoreStatus> {
        self.store_link().map(|l| {
            let mut sizes: Vec<(String, u64)> = l
                .sizes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .map(|(g, (used, _))| (g.to_string(), *used))
                .collect();
            sizes.sort();
            StoreStatus {
                connected: l.connected.load(Ordering::Relaxed),
                safe_mode: l.safe_mode.load(Ordering::Relaxed),
                sizes,
                syncs: l.syncs.load(Ordering::Relaxed),
            }
        })
    }

    /// Leaves the store: stops syncing and deregisters every group, keeping each ramp's value
    /// for a client that starts within `ttl`. Waits on Redis for at most a second.
    pub async fn shutdown(&self) {
        let Some(link) = self.store_link() else { return };
        if let Some(task) = link.task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        let deregister = async {
            let mut c = connect(&link.url, Duration::from_secs(1)).await.ok()?;
            for name in &link.groups {
                let k = keys(&link.opts.namespace, name);
                let ramp = self.ramp_value(name).map(|v| v.to_string()).unwrap_or_default();
                let ttl_ms = link.opts.ttl.as_millis().to_string();
                let mut invocation = DEREGISTER_SCRIPT.key(&k.heartbeat);
                invocation.key(&k.sizes).key(&k.resume).arg(&link.client_id).arg(ramp).arg(ttl_ms);
                let _ = invocation.invoke_async::<i64>(&mut c).await;
            }
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), deregister).await;
        link.connected.store(false, Ordering::Relaxed);
    }
}

fn enter_safe_mode(gate: &impl SharesOf, link: &StoreLink) {
    if link.safe_mode.swap(true, Ordering::Relaxed) {
        return;
    }
    let forced = match link.opts.safe_mode {
        SafeModePolicy::FailOpen => Some(Forced::Open),
        SafeModePolicy::FailClosed => Some(Forced::Closed),
        // Keep the last agreed size and the ramp, locally.
        SafeModePolicy::Decay => None,
    };
    for g in &link.groups {
        gate.force(g, forced);
    }
}

/// What the sync task needs from the limiter.
pub(crate) trait SharesOf: Send + Sync + 'static {
    fn set_size(&self, group: &GroupName, size: u64);
    fn force(&self, group: &GroupName, forced: Option<Forced>);
}

async fn sync_loop<S: SharesOf>(
    gate: Weak<S>,
    link: Arc<StoreLink>,
    mut connection: Option<MultiplexedConnection>,
) {
    let mut last_ok: Option<tokio::time::Instant> = None;
    #[allow(clippy::disallowed_methods)] // the store link's edge: tokio time
    let started = tokio::time::Instant::now();
    let stale_ms = link.opts.ttl.as_millis().to_string();
    loop {
        tokio::time::sleep(link.opts.sync_interval).await;
        let Some(gate) = gate.upgrade() else { return };
        if connection.is_none() {
            connection =
                connect(&link.url, link.opts.sync_interval.max(Duration::from_millis(200))).await.ok();
        }
        let mut ok = connection.is_some();
        if let Some(c) = &mut connection {
            for name in &link.groups {
                let k = keys(&link.opts.namespace, name);
                let report =
                    link.sizes.lock().unwrap_or_else(PoisonError::into_inner).get(name).map_or(1, |s| s.1);
                let mut invocation = SYNC_SCRIPT.key(&k.heartbeat);
                invocation.key(&k.sizes).arg(&link.client_id).arg(report).arg(&stale_ms);
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
                        gate.set_size(name, entry.0);
                    }
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        #[allow(clippy::disallowed_methods)]
        let now = tokio::time::Instant::now();
        if ok {
            last_ok = Some(now);
            link.syncs.fetch_add(1, Ordering::Relaxed);
            link.connected.store(true, Ordering::Relaxed);
            if link.safe_mode.swap(false, Ordering::Relaxed) {
                tracing::info!(client = %link.client_id, "tollgate: Redis reachable again, leaving safe mode");
                for g in &link.groups {
                    gate.force(g, None);
                }
            }
        } else {
            connection = None;
            link.connected.store(false, Ordering::Relaxed);
            let since = now.duration_since(last_ok.unwrap_or(started));
            if since > link.opts.stale_limit && !link.safe_mode.load(Ordering::Relaxed) {
                tracing::warn!(client = %link.client_id, policy = ?link.opts.safe_mode, "tollgate: Redis unreachable past the stale limit, entering safe mode");
                enter_safe_mode(&*gate, &link);
            }
        }
    }
}
