//! The region tier: a regional controller leases each group's share for its region from the
//! global tier, the way a client leases from a controller (Doorman's tree).
//!
//! Controllers started with `--region NAME` on the global tier's etcd read the same settings,
//! elect a leader of their own under `PREFIX/regions/NAME/election`, and serve the region's
//! clients from a regional engine ([`tollgate_model::engine::Engine::set_upstream_mode`]). The
//! regional leader exchanges with the global leader (found in `PREFIX/election`) as the client
//! `region/NAME`, by the lease [`RegionLease`] keeps: its clients' demand and consumption
//! added up, per group, for what the region may grant. A region that cannot reach the global
//! tier keeps granting its last shares for the grant's lease, then decays them.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_limiter::access::Rpc;
use tollgate_model::time::Nanos;
use tollgate_proto::v1::admission_client::AdmissionClient;

use crate::clock::Clock;
use crate::cluster::regions::RegionLease;
use crate::cluster::role::{PEER_TIMEOUT, Route};
use crate::node::Node;
use crate::options::EtcdTarget;

/// How often the regional leader looks for groups new to the region, which it leases at once.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How often the same failure to reach the global tier is logged again.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Leases the region's shares from the global tier for as long as the server runs (while
/// this controller leads its region; a regional follower passes its clients on to the
/// regional leader and leases nothing itself).
pub async fn run(node: Node, target: EtcdTarget, region: String, clock: Clock) {
    let status = node.cluster.upstream_status();
    *status.region.lock().unwrap_or_else(PoisonError::into_inner) = Some(region.clone());
    let observer = tokio::spawn(crate::cluster::election::observe_leader(target, status.clone()));
    let mut lease = RegionLease::new(&region);
    let mut channel: Option<(String, AdmissionClient<Rpc>)> = None;
    let mut warned: Option<(String, Nanos)> = None;
    while !observer.is_finished() {
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = node.controller.ownership().share_wanted() => {}
        }
        let now = clock.now();
        if matches!(node.cluster.route(false), Ok(Route::Leader(_))) {
            continue;
        }
        let usage = node.controller.ownership().upstream_usage();
        if lease.is_due(now, &usage) {
            let leader = status.leader.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let answered = match leader {
                None => Err("no leader of the global tier is elected".to_string()),
                Some(leader) => match connect(&node, &mut channel, &leader) {
                    Err(e) => Err(e),
                    Ok(client) => round(now, &node, &mut lease, client, &usage)
                        .await
                        .map_err(|e| format!("{leader}: {e}")),
                },
            };
            match answered {
                Ok(()) => {
                    status.exchanges.fetch_add(1, Ordering::Relaxed);
                    lease.round_answered(now, &usage);
                }
                Err(e) => {
                    status.failures.fetch_add(1, Ordering::Relaxed);
                    warn(&mut warned, now, &e);
                    lease.round_failed(now);
                }
            }
        }
        status.safe_mode.store(lease.decay(now, &node.controller), Ordering::Relaxed);
    }
}

/// One round with the global leader over `client`, begun at `now`.
async fn round(
    now: Nanos,
    node: &Node,
    lease: &mut RegionLease,
    client: &mut AdmissionClient<Rpc>,
    usage: &[tollgate_model::engine::UpstreamUsage],
) -> Result<(), String> {
    for page in lease.pages(usage) {
        let answer = match tokio::time::timeout(PEER_TIMEOUT, client.exchange(page.request.clone())).await {
            Ok(Ok(a)) => a.into_inner(),
            Ok(Err(status)) => return Err(format!("{:?} {}", status.code(), status.message())),
            Err(_) => return Err(format!("no answer within {PEER_TIMEOUT:?}")),
        };
        lease.answered(now, page, &answer, &node.controller);
    }
    Ok(())
}

/// The channel to the global leader, made again when the leader changes.
fn connect<'a>(
    node: &Node,
    channel: &'a mut Option<(String, AdmissionClient<Rpc>)>,
    leader: &str,
) -> Result<&'a mut AdmissionClient<Rpc>, String> {
    if channel.as_ref().is_none_or(|(at, _)| at != leader) {
        let rpc = node
            .cluster
            .link()
            .peer_access()
            .channel(leader, PEER_TIMEOUT)
            .map_err(|e| format!("{leader}: {e}"))?;
        *channel = Some((leader.to_string(), AdmissionClient::new(rpc)));
    }
    Ok(&mut channel.as_mut().expect("made above").1)
}

/// Logs a failure to reach the global tier: at once when it is new, else at most every
/// [`WARN_EVERY`].
fn warn(warned: &mut Option<(String, Nanos)>, now: Nanos, error: &str) {
    if warned.as_ref().is_some_and(|(e, at)| e == error && now.since(*at) < WARN_EVERY) {
        return;
    }
    tracing::warn!(
        error,
        "this region cannot lease from the global tier; it grants its last shares, then decays them"
    );
    *warned = Some((error.to_string(), now));
}
