//! The region tier: a regional controller leases each group's share for its region from the
//! global tier, the way a client leases from a controller (Doorman's tree).
//!
//! Controllers started with `--region NAME` elect a leader of their own and serve the region's
//! clients from a regional engine ([`tollgate_model::engine::Engine::set_upstream_mode`]). The
//! regional leader exchanges with the global tier as the client `region/NAME`, by the lease
//! [`RegionLease`] keeps: its clients' demand and consumption added up, per group, for what the
//! region may grant. The global tier is found one of two ways ([`Global`]):
//!
//! - on its etcd, which the region shares (`--etcd` alone): the region reads the same settings
//!   and elects under `PREFIX/regions/NAME/election`, and the global leader is the one
//!   `PREFIX/election` names;
//! - at URLs (`--upstream`): the region keeps its own store (its own etcd, or the embedded
//!   store of a lone controller), calls the first URL that answers with a token of the
//!   `region` role and TLS of its own, and copies the global tier's groups into its store.
//!
//! A region that cannot reach the global tier keeps granting its last shares for the grant's
//! lease, then decays them; the global tier, hearing nothing from it, lets its lease run out,
//! and its share goes back to the other regions.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_limiter::access::Rpc;
use tollgate_model::time::Nanos;
use tollgate_proto::v1::admission_client::AdmissionClient;

use crate::clock::Clock;
use crate::cluster::regions::{LOOK_EVERY, RegionLease};
use crate::cluster::role::{PEER_TIMEOUT, Route, UpstreamStatus};
use crate::cluster::upstream_settings::{self, CopyClock};
use crate::node::Node;
use crate::options::Upstream;

/// How often the same failure to reach the global tier is logged again.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where the regional leader finds the global tier.
#[derive(Debug, Clone)]
pub enum Global {
    /// On the global tier's etcd, which the region shares: its election names the leader,
    /// reached with the controllers' own peer credentials.
    #[cfg(feature = "etcd")]
    Etcd(crate::options::EtcdTarget),
    /// At these URLs, tried in turn, with the region's own token and TLS authority; the
    /// region's groups are copied from there ([`upstream_settings`]).
    Urls(Upstream),
}

/// The channel to the global tier, made again when the controller called changes.
struct Reach {
    global: Global,
    /// With [`Global::Urls`]: the URL called now (the next after a failure).
    at: usize,
    channel: Option<(String, Rpc)>,
}

impl Reach {
    /// The controller to call, and a channel to it.
    fn channel(
        &mut self,
        #[cfg_attr(not(feature = "etcd"), expect(unused_variables, reason = "peers are found on etcd"))] node: &Node,
        status: &UpstreamStatus,
    ) -> Result<(String, Rpc), String> {
        let (url, access) = match &self.global {
            #[cfg(feature = "etcd")]
            Global::Etcd(_) => {
                let leader = status.leader.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let leader = leader.ok_or_else(|| "no leader of the global tier is elected".to_string())?;
                (leader, node.cluster.link().peer_access())
            }
            Global::Urls(up) => {
                let url = up.urls[self.at % up.urls.len()].clone();
                *status.leader.lock().unwrap_or_else(PoisonError::into_inner) = Some(url.clone());
                (url, up.access.clone())
            }
        };
        if self.channel.as_ref().is_none_or(|(at, _)| *at != url) {
            let rpc = access.channel(&url, PEER_TIMEOUT).map_err(|e| format!("{url}: {e}"))?;
            self.channel = Some((url.clone(), rpc));
        }
        Ok(self.channel.clone().expect("made above"))
    }

    /// A call failed: the next URL is tried.
    fn failed(&mut self) {
        if matches!(self.global, Global::Urls(_)) {
            self.at = self.at.wrapping_add(1);
            self.channel = None;
        }
    }
}

/// Leases the region's shares from the global tier for as long as the server runs (while
/// this controller leads its region; a regional follower passes its clients on to the
/// regional leader and leases nothing itself). With [`Global::Urls`] it also copies the
/// global tier's groups into the region's store.
pub async fn run(node: Node, global: Global, region: String, clock: Clock) {
    let status = node.cluster.upstream_status();
    *status.region.lock().unwrap_or_else(PoisonError::into_inner) = Some(region.clone());
    let observer: Option<tokio::task::JoinHandle<()>> = match &global {
        #[cfg(feature = "etcd")]
        Global::Etcd(target) => {
            Some(tokio::spawn(crate::cluster::election::observe_leader(target.clone(), status.clone())))
        }
        Global::Urls(_) => None,
    };
    let copies = matches!(global, Global::Urls(_));
    let who = upstream_settings::copier(&region);
    let mut reach = Reach { global, at: 0, channel: None };
    let mut lease = RegionLease::new(&region);
    let mut copy_clock = CopyClock::default();
    let mut warned: Option<(String, Nanos)> = None;
    while observer.as_ref().is_none_or(|o| !o.is_finished()) {
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = node.controller.ownership().share_wanted() => {}
        }
        let now = clock.now();
        if matches!(node.cluster.route(false), Ok(Route::Leader(_))) {
            continue;
        }
        if copies && copy_clock.due(now) {
            let copied = match reach.channel(&node, &status) {
                Err(e) => Err(e),
                Ok((url, rpc)) => {
                    upstream_settings::read(rpc, PEER_TIMEOUT).await.map_err(|e| format!("{url}: {e}"))
                }
            };
            match copied {
                Ok(groups) => drop(upstream_settings::apply(&node, groups, who.clone()).await),
                Err(e) => {
                    reach.failed();
                    warn(&mut warned, now, &e);
                }
            }
        }
        if lease.is_due(now, || node.controller.ownership().upstream_unheld()) {
            let usage = node.controller.ownership().upstream_usage();
            let answered = match reach.channel(&node, &status) {
                Err(e) => Err(e),
                Ok((url, rpc)) => round(now, &node, &mut lease, &mut AdmissionClient::new(rpc), &usage)
                    .await
                    .map_err(|e| format!("{url}: {e}")),
            };
            match answered {
                Ok(()) => {
                    status.exchanges.fetch_add(1, Ordering::Relaxed);
                    lease.round_answered(now, &usage);
                }
                Err(e) => {
                    status.failures.fetch_add(1, Ordering::Relaxed);
                    reach.failed();
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
