//! Remote mode: the buckets are fed by a controller's grants.
//!
//! A background task exchanges with `tollgate server` at the delay the server asks for, and
//! early when a new group appears or a bucket refuses. Each exchange reports, per group, what
//! was asked (units/s, admitted or not), consumed and refused since the last one; the answer
//! carries each group's grant (rate, burst, lease), which becomes the bucket's rate.
//!
//! When no exchange succeeds for longer than the lease, the client enters **safe mode** and
//! applies its [`SafeModePolicy`]: decay each group from its last grant toward
//! `reserved ÷ clients` (the default), let everything through, or refuse everything. Safe mode
//! shows in [`RemoteStatus`] and in a log line, and ends with the next successful exchange.
//! Failed exchanges are retried with backoff (100 ms doubling to 2 s); a failed exchange's
//! counts are carried into the next one, so nothing is lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tollgate_core::settings::GroupName;
use tollgate_core::time::Nanos;
use tollgate_proto::v1::{self, admission_client::AdmissionClient};
use tonic::transport::Channel;

/// What a client does when the controller stays unreachable past its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SafeModePolicy {
    /// Keep the last grant, decaying (half-life 5 s) toward `reserved ÷ clients`.
    #[default]
    Decay,
    /// Admit everything: availability over protection.
    FailOpen,
    /// Admit nothing: protection over availability.
    FailClosed,
}

/// How a remote client behaves.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// This client's id at the controller (default: `tollgate-PID-N`).
    pub client_id: Option<String>,
    /// Safe-mode policy.
    pub safe_mode: SafeModePolicy,
    /// How long `acquire` waits at most.
    pub max_wait: Duration,
    /// How long one exchange may take before it counts as failed.
    pub exchange_timeout: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            client_id: None,
            safe_mode: SafeModePolicy::Decay,
            max_wait: Duration::from_secs(1),
            exchange_timeout: Duration::from_secs(2),
        }
    }
}

/// The link's state, as the application can read it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteStatus {
    /// The last exchange succeeded.
    pub connected: bool,
    /// The lease ran out without renewal: the safe-mode policy applies.
    pub safe_mode: bool,
    /// Successful exchanges so far.
    pub exchanges: u64,
    /// The last failure, if the last exchange failed.
    pub last_error: Option<String>,
}

/// Half-life of the decay policy.
const DECAY_HALF_LIFE_S: f64 = 5.0;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Early exchanges are at least this far apart.
const EARLY_SPACING: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
struct LastGrant {
    unlimited: bool,
    rate: f64,
    burst: f64,
    floor: f64,
}

/// Shared between the limiter and its exchange task.
pub(crate) struct Link {
    pub(crate) client_id: String,
    policy: SafeModePolicy,
    notify: tokio::sync::Notify,
    connected: AtomicBool,
    safe_mode: AtomicBool,
    exchanges: AtomicU64,
    last_error: Mutex<Option<String>>,
    grants: Mutex<HashMap<GroupName, LastGrant>>,
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

impl Link {
    pub(crate) fn new(opts: &RemoteOptions) -> Link {
        let client_id = opts.client_id.clone().unwrap_or_else(|| {
            format!("tollgate-{}-{}", std::process::id(), NEXT_CLIENT.fetch_add(1, Ordering::Relaxed))
        });
        Link {
            client_id,
            policy: opts.safe_mode,
            notify: tokio::sync::Notify::new(),
            connected: AtomicBool::new(false),
            safe_mode: AtomicBool::new(false),
            exchanges: AtomicU64::new(0),
            last_error: Mutex::new(None),
            grants: Mutex::new(HashMap::new()),
        }
    }

    /// Asks for an exchange soon (a new group, a refusal).
    pub(crate) fn nudge(&self) {
        self.notify.notify_one();
    }

    pub(crate) fn status(&self) -> RemoteStatus {
        RemoteStatus {
            connected: self.connected.load(Ordering::Relaxed),
            safe_mode: self.safe_mode.load(Ordering::Relaxed),
            exchanges: self.exchanges.load(Ordering::Relaxed),
            last_error: self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        }
    }
}

/// What the exchange task needs from the limiter.
pub(crate) trait Fed: Send + Sync + 'static {
    /// The clock.
    fn now(&self) -> Nanos;
    /// Each tracked group's cumulative (asked units, consumed units, admitted, throttled+waited).
    fn usage(&self) -> Vec<(GroupName, Cumulative)>;
    /// Sets a group's bucket.
    fn set_rate(&self, group: &GroupName, rate: f64, burst: f64, now: Nanos);
}

/// Cumulative counts for one group.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Cumulative {
    pub(crate) asked: f64,
    pub(crate) consumed: f64,
    pub(crate) admitted: u64,
    pub(crate) throttled: u64,
    pub(crate) unmet: u64,
}

/// Runs the exchange loop until the limiter is dropped.
pub(crate) async fn run<F: Fed>(
    fed: Weak<F>,
    link: Arc<Link>,
    mut client: AdmissionClient<Channel>,
    timeout: Duration,
) {
    let mut sequence = 0u64;
    let mut reported: HashMap<GroupName, Cumulative> = HashMap::new();
    let mut last_ok: Option<Nanos> = None;
    let mut lease = Duration::from_secs(10);
    let mut last_at = fed.upgrade().map(|f| f.now()).unwrap_or_default();
    let mut delay = Duration::ZERO;
    let mut backoff = BACKOFF_MIN;
    let mut safe_since: Option<Nanos> = None;
    let mut last_exchange: Option<Nanos> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = link.notify.notified() => {
                // Early exchanges go at once, but no closer together than EARLY_SPACING.
                let since = match (last_exchange, fed.upgrade()) {
                    (Some(t), Some(f)) => f.now().since(t),
                    _ => EARLY_SPACING,
                };
                if since < EARLY_SPACING {
                    tokio::time::sleep(EARLY_SPACING - since).await;
                }
            }
        }
        let Some(f) = fed.upgrade() else { return };
        let now = f.now();
        last_exchange = Some(now);
        let dt = now.since(last_at).as_secs_f64().max(1e-3);
        let usage = f.usage();
        let grants = link.grants.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let groups: Vec<v1::GroupUsage> = usage
            .iter()
            .map(|(name, cum)| {
                let before = reported.get(name).copied().unwrap_or_default();
                let mut demand = (cum.asked - before.asked).max(0.0) / dt;
                // Work that waited or was refused wants more than it got.
                if cum.unmet > before.unmet
                    && let Some(g) = grants.get(name)
                    && !g.unlimited
                {
                    demand = demand.max(g.rate * 1.5);
                }
                v1::GroupUsage {
                    group: name.to_string(),
                    demand,
                    consumed: (cum.consumed - before.consumed).max(0.0),
                    admitted: cum.admitted.saturating_sub(before.admitted),
                    throttled: cum.throttled.saturating_sub(before.throttled),
                    waiting: 0.0,
                }
            })
            .collect();
        drop(f);
        sequence += 1;
        let request = v1::ExchangeRequest { client_id: link.client_id.clone(), sequence, groups };
        let outcome = tokio::time::timeout(timeout, client.exchange(request)).await;
        let Some(f) = fed.upgrade() else { return };
        let now = f.now();
        match outcome {
            Ok(Ok(response)) => {
                let response = response.into_inner();
                let mut table = link.grants.lock().unwrap_or_else(PoisonError::into_inner);
                for g in &response.grants {
                    let Ok(name) = GroupName::new(&g.group) else { continue };
                    let last = LastGrant {
                        unlimited: g.unlimited,
                        rate: g.rate,
                        burst: g.burst,
                        floor: g.reserved / f64::from(g.clients.max(1)),
                    };
                    apply(&*f, &name, last, now);
                    lease = Duration::from_millis(u64::from(g.lease_ms));
                    table.insert(name, last);
                }
                drop(table);
                reported = usage.into_iter().collect();
                last_at = now;
                last_ok = Some(now);
                link.connected.store(true, Ordering::Relaxed);
                link.exchanges.fetch_add(1, Ordering::Relaxed);
                *link.last_error.lock().unwrap_or_else(PoisonError::into_inner) = None;
                if link.safe_mode.swap(false, Ordering::Relaxed) {
                    tracing::info!(client = %link.client_id, "tollgate: controller reachable again, leaving safe mode");
                }
                safe_since = None;
                backoff = BACKOFF_MIN;
                delay = Duration::from_millis(u64::from(response.next_exchange_ms.max(10)));
            }
            failure => {
                let reason = match failure {
                    Ok(Err(status)) => status.message().to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                link.connected.store(false, Ordering::Relaxed);
                *link.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.clone());
                let expired = last_ok.is_none_or(|t| now.since(t) > lease);
                if expired {
                    let since = *safe_since.get_or_insert(now);
                    if !link.safe_mode.swap(true, Ordering::Relaxed) {
                        tracing::warn!(client = %link.client_id, policy = ?link.policy, %reason, "tollgate: controller unreachable past the lease, entering safe mode");
                    }
                    let grants = link.grants.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    for (name, last) in grants {
                        apply(&*f, &name, safe(link.policy, last, now.since(since)), now);
                    }
                }
                delay = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// What a grant becomes under `policy` after `elapsed` in safe mode.
fn safe(policy: SafeModePolicy, last: LastGrant, elapsed: Duration) -> LastGrant {
    match policy {
        SafeModePolicy::FailOpen => LastGrant { unlimited: true, ..last },
        SafeModePolicy::FailClosed => LastGrant { unlimited: false, rate: 0.0, burst: 0.0, ..last },
        SafeModePolicy::Decay if last.unlimited => last,
        SafeModePolicy::Decay => {
            let keep = 0.5f64.powf(elapsed.as_secs_f64() / DECAY_HALF_LIFE_S);
            let rate = last.floor + (last.rate - last.floor).max(0.0) * keep;
            LastGrant { rate, burst: rate.max(last.floor), ..last }
        }
    }
}

fn apply<F: Fed + ?Sized>(f: &F, name: &GroupName, g: LastGrant, now: Nanos) {
    if g.unlimited {
        f.set_rate(name, f64::INFINITY, 0.0, now);
    } else {
        f.set_rate(name, g.rate.max(0.0), g.burst.max(0.0), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_halves_toward_the_floor_every_five_seconds() {
        let last = LastGrant { unlimited: false, rate: 100.0, burst: 100.0, floor: 20.0 };
        let at = |s: u64| safe(SafeModePolicy::Decay, last, Duration::from_secs(s)).rate;
        assert_eq!(at(0), 100.0);
        assert!((at(5) - 60.0).abs() < 1e-9);
        assert!((at(10) - 40.0).abs() < 1e-9);
        assert!(at(120) - 20.0 < 1e-3);
        assert!(safe(SafeModePolicy::FailOpen, last, Duration::ZERO).unlimited);
        assert_eq!(safe(SafeModePolicy::FailClosed, last, Duration::ZERO).rate, 0.0);
    }
}
