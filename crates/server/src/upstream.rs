//! The region tier: a regional controller leases each group's share for its region from the
//! global tier, the way a client leases from a controller (Doorman's tree).
//!
//! Controllers started with `--region NAME` on the global tier's etcd read the same settings,
//! elect a leader of their own under `PREFIX/regions/NAME/election`, and serve the region's
//! clients from a regional engine ([`tollgate_model::engine::Engine::set_upstream_mode`]). The
//! regional leader exchanges with the global leader (found in `PREFIX/election`) as the client
//! `region/NAME`: its clients' demand and consumption added up, per group, for what the region
//! may grant. A region that cannot reach the global tier keeps granting its last shares for
//! the grant's lease, then decays them towards the region's part of each reservation, halving
//! the rest every 5 s, as a client's safe mode does.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_model::engine::{Meter, UpstreamGrant};
use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;

use crate::clock::Clock;
use crate::cluster::{PEER_TIMEOUT, UpstreamStatus};
use crate::node::Node;
use crate::options::EtcdTarget;

/// How often the regional leader looks for groups new to the region, which it leases at once.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How long after the last share from the global tier a region's shares decay to half.
const DECAY_HALF_LIFE: Duration = Duration::from_secs(5);

/// How often the same failure to reach the global tier is logged again.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A share the global tier granted the region for one group, as it was granted.
#[derive(Debug, Clone, Copy)]
struct Share {
    grant: UpstreamGrant,
    /// The region's part of the group's reservation: where a decaying share stops.
    floor: f64,
    lease: Duration,
}

/// The regional leader's side of the lease: what it was granted and when, what it last
/// reported, and its exchanges' numbering.
struct Lease {
    client_id: String,
    sequence: u64,
    shares: HashMap<GroupName, Share>,
    /// Each group's running totals as last reported.
    reported: HashMap<GroupName, Meter>,
    answered_at: Option<Nanos>,
    next_due: Nanos,
    warned: Option<(String, Nanos)>,
}

/// Leases the region's shares from the global tier for as long as the server runs (while
/// this controller leads its region; a regional follower passes its clients on to the
/// regional leader and leases nothing itself).
pub async fn run(node: Node, target: EtcdTarget, region: String, clock: Clock) {
    let status = node.cluster.upstream_status();
    *status.region.lock().unwrap_or_else(PoisonError::into_inner) = Some(region.clone());
    let observer = tokio::spawn(crate::election::observe_leader(target, status.clone()));
    let mut lease = Lease {
        client_id: format!("region/{region}"),
        sequence: 0,
        shares: HashMap::new(),
        reported: HashMap::new(),
        answered_at: None,
        next_due: Nanos::ZERO,
        warned: None,
    };
    let mut channel: Option<(String, v1::admission_client::AdmissionClient<tollgate_limiter::access::Rpc>)> =
        None;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let now = clock.now();
        if node.cluster.following().is_some() {
            continue;
        }
        let usage = node.controller.upstream_usage();
        let new_group = usage.iter().any(|u| u.held.is_none());
        if now < lease.next_due && !new_group {
            lease.decay(&node, now, &status);
            continue;
        }
        let leader = status.leader.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let answered = match leader {
            None => Err("no leader of the global tier is elected".to_string()),
            Some(leader) => match connect(&node, &mut channel, &leader) {
                Err(e) => Err(e),
                Ok(client) => {
                    lease.exchange(&node, now, client, usage).await.map_err(|e| format!("{leader}: {e}"))
                }
            },
        };
        match answered {
            Ok(period) => {
                status.exchanges.fetch_add(1, Ordering::Relaxed);
                status.safe_mode.store(false, Ordering::Relaxed);
                lease.next_due = now.after(period);
            }
            Err(e) => {
                status.failures.fetch_add(1, Ordering::Relaxed);
                lease.warn(now, &e);
                lease.next_due = now.after(Duration::from_secs(1));
                lease.decay(&node, now, &status);
            }
        }
        if observer.is_finished() {
            return;
        }
    }
}

/// The channel to the global leader, made again when the leader changes.
fn connect<'a>(
    node: &Node,
    channel: &'a mut Option<(String, v1::admission_client::AdmissionClient<tollgate_limiter::access::Rpc>)>,
    leader: &str,
) -> Result<&'a mut v1::admission_client::AdmissionClient<tollgate_limiter::access::Rpc>, String> {
    if channel.as_ref().is_none_or(|(at, _)| at != leader) {
        let rpc =
            node.cluster.peer_access().channel(leader, PEER_TIMEOUT).map_err(|e| format!("{leader}: {e}"))?;
        *channel = Some((leader.to_string(), v1::admission_client::AdmissionClient::new(rpc)));
    }
    Ok(&mut channel.as_mut().expect("made above").1)
}

impl Lease {
    /// One round: every group the region's clients use, in pages of at most
    /// [`EXCHANGE_GROUPS_MAX`](tollgate_proto::EXCHANGE_GROUPS_MAX); the shares granted are the
    /// regional engine's ceilings from then on. Returns the period the global tier asks for.
    async fn exchange(
        &mut self,
        node: &Node,
        now: Nanos,
        client: &mut v1::admission_client::AdmissionClient<tollgate_limiter::access::Rpc>,
        usage: Vec<tollgate_model::engine::UpstreamUsage>,
    ) -> Result<Duration, String> {
        let mut period = Duration::from_secs(1);
        for page in usage.chunks(tollgate_proto::EXCHANGE_GROUPS_MAX) {
            self.sequence += 1;
            let groups = page.iter().map(|u| self.usage(u)).collect();
            let ask = v1::ExchangeRequest {
                client_id: self.client_id.clone(),
                sequence: self.sequence,
                groups,
                target_request_period_ms: 0,
            };
            let answer = match tokio::time::timeout(PEER_TIMEOUT, client.exchange(ask)).await {
                Ok(Ok(a)) => a.into_inner(),
                Ok(Err(status)) => return Err(format!("{:?} {}", status.code(), status.message())),
                Err(_) => return Err(format!("no answer within {PEER_TIMEOUT:?}")),
            };
            for u in page {
                self.reported.insert(u.group.clone(), u.meter);
            }
            let granted: Vec<(GroupName, Share)> = answer
                .grants
                .iter()
                .filter_map(|g| Some((GroupName::new(&g.group).ok()?, share_of(g))))
                .collect();
            node.controller.set_upstream(granted.iter().map(|(n, s)| (n.clone(), s.grant)));
            self.shares.extend(granted);
            period = Duration::from_millis(u64::from(answer.next_exchange_ms.max(1)));
        }
        self.shares.retain(|name, _| usage.iter().any(|u| u.group == *name));
        self.answered_at = Some(now);
        Ok(period)
    }

    /// One group's usage as the global tier is told it: demand now, and what was consumed,
    /// admitted, refused and made to wait since the last report.
    fn usage(&self, u: &tollgate_model::engine::UpstreamUsage) -> v1::GroupUsage {
        let before = self.reported.get(&u.group).copied().unwrap_or_default();
        let since = |now: u64, then: u64| now.saturating_sub(then);
        v1::GroupUsage {
            group: u.group.to_string(),
            demand: u.demand,
            consumed: (u.meter.consumed - before.consumed).max(0.0),
            admitted: since(u.meter.admitted, before.admitted),
            throttled: since(u.meter.throttled, before.throttled),
            waited: since(u.meter.waited, before.waited),
            unthrottled: u.unthrottled,
            held: u.held.map_or(0.0, |h| if h.rate.is_finite() { h.rate } else { 0.0 }),
            ..Default::default()
        }
    }

    /// Past a share's lease without an answer: the share decays towards its floor, halving
    /// every [`DECAY_HALF_LIFE`] (safe mode, as a client's).
    fn decay(&mut self, node: &Node, now: Nanos, status: &UpstreamStatus) {
        let Some(at) = self.answered_at else { return };
        let elapsed = now.since(at);
        let mut decayed = Vec::new();
        for (name, s) in &self.shares {
            if elapsed < s.lease || !s.grant.rate.is_finite() {
                continue;
            }
            let keep = 0.5f64.powf((elapsed - s.lease).as_secs_f64() / DECAY_HALF_LIFE.as_secs_f64());
            let rate = s.floor + (s.grant.rate - s.floor).max(0.0) * keep;
            decayed.push((name.clone(), UpstreamGrant { rate, burst: rate.max(s.floor) }));
        }
        if !decayed.is_empty() {
            status.safe_mode.store(true, Ordering::Relaxed);
            node.controller.set_upstream(decayed);
        }
    }

    /// Logs a failure to reach the global tier: at once when it is new, else at most every
    /// [`WARN_EVERY`].
    fn warn(&mut self, now: Nanos, error: &str) {
        if self.warned.as_ref().is_some_and(|(e, at)| e == error && now.since(*at) < WARN_EVERY) {
            return;
        }
        tracing::warn!(
            error,
            "this region cannot lease from the global tier; it grants its last shares, then decays them"
        );
        self.warned = Some((error.to_string(), now));
    }
}

/// The share a grant from the global tier gives the region.
fn share_of(g: &v1::Grant) -> Share {
    let grant = if g.unlimited {
        UpstreamGrant { rate: f64::INFINITY, burst: f64::INFINITY }
    } else {
        UpstreamGrant { rate: g.rate, burst: g.burst }
    };
    Share {
        grant,
        floor: g.reserved / f64::from(g.clients.max(1)),
        lease: Duration::from_millis(u64::from(g.lease_ms)),
    }
}
