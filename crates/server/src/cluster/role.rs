//! This controller's role among controllers sharing one etcd (standalone, leader or
//! follower, and who leads), and the calls it passes to the leader. The election (with etcd)
//! sets the role.
//!
//! Every controller serves. The leader grants; a follower passes clients' exchanges and
//! backends' reports on to it over gRPC through its [`LeaderLink`], so a client or backend given any controller's address is
//! answered there, never sent elsewhere. The front ends that decide for others (Envoy's
//! rate-limit and quota services, `POST /v1/check`) hold a lease on the groups they are asked
//! about exactly as a client does: from the engine in process while this controller grants,
//! from the leader over gRPC while it follows ([`Cluster::exchange`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_model::time::Nanos;
use tollgate_proto::v1;
use tollgate_proto::v1::admission_client::AdmissionClient;
use tonic::Status;
use tonic::codegen::Bytes;

use crate::cluster::leader_link::forwarded;
pub use crate::cluster::leader_link::{
    FORWARDED_METADATA, Forwarded, LeaderLink, PEER_TIMEOUT, Peer, WARN_EVERY,
};
use crate::cluster::shard_exchange::ShardExchange;
use crate::controller::Controller;

/// What a follower answers a call another controller passed on to it (`UNAVAILABLE`): it does
/// not pass it on again.
pub const NOT_LEADING: &str =
    "passed on by another controller to this one, which does not lead either: the leader is changing";

/// The metadata key of [`NOT_LEADING`]'s answer that names the leader the follower knows, if
/// any: a leader holding its grants through an etcd outage asks its peers, and stops once one
/// names another leader.
pub const LEADER_METADATA: &str = "tollgate-leader";

/// [`NOT_LEADING`], naming `leader` ([`LEADER_METADATA`]) when one is known.
fn not_leading(leader: Option<&str>) -> Status {
    let mut status = Status::unavailable(NOT_LEADING);
    if let Some(value) = leader.and_then(|l| tonic::metadata::MetadataValue::try_from(l).ok()) {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// Checks a controller's advertised gRPC address: `http://HOST:PORT` or `https://HOST:PORT`,
/// at most 255 bytes. The error says what it must be.
pub fn check_advertise(address: &str) -> Result<(), String> {
    let ok =
        address.strip_prefix("http://").or_else(|| address.strip_prefix("https://")).is_some_and(|rest| {
            rest.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
        });
    if ok && address.len() <= 255 {
        Ok(())
    } else {
        Err(format!("{address:?} must be http://HOST:PORT or https://HOST:PORT (at most 255 bytes)"))
    }
}

/// A controller's part among controllers sharing one etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No election: the only controller.
    Standalone,
    /// Elected: grants, takes reports, writes consumption.
    Leader,
    /// Another controller leads (or none does yet): clients' exchanges and backends' reports
    /// are passed on to it.
    Follower,
}

impl Role {
    /// As `/status` says it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Standalone => "standalone",
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }
}

/// The role and the leader's advertised address, when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleView {
    /// This controller's part.
    pub role: Role,
    /// The leader's advertised gRPC URL (this controller's own when it leads).
    pub leader: Option<String>,
}

/// Where a call is answered ([`Cluster::route`]).
pub enum Route<'a> {
    /// Here, by this controller's engine: it leads, or stands alone.
    Here,
    /// By the leader, this controller following (`None` while no leader is known).
    Leader(Option<String>),
    /// By each group's owner, the groups being sharded over the controllers.
    Shards(ShardExchange<'a>),
}

/// This controller's role, and the controller it hands leadership to. See the
/// [module documentation](self).
pub struct Cluster {
    controller: Arc<Controller>,
    role: Mutex<RoleView>,
    /// Times this controller became the leader.
    leader_changes: AtomicU64,
    /// How this controller reaches the leader, and what it passes on to it.
    link: LeaderLink,
    /// A regional controller's lease on the global tier.
    region: Arc<UpstreamStatus>,
    /// With the groups sharded over the controllers (`--shards`): this one's part.
    sharding: std::sync::OnceLock<Arc<crate::cluster::shard_routing::Sharding>>,
}

/// What a regional controller's lease on the global tier is doing, for `/status` and
/// metrics (the module `upstream_lease`, with etcd).
#[derive(Debug, Default)]
pub struct UpstreamStatus {
    /// The region's name; `None` on a controller of the global tier.
    pub region: Mutex<Option<String>>,
    /// The global leader, as etcd last said.
    pub leader: Mutex<Option<String>>,
    /// Exchanges with the global tier that were answered.
    pub exchanges: AtomicU64,
    /// Those that were not.
    pub failures: AtomicU64,
    /// The grant lease ran out without an answer: the shares decay.
    pub safe_mode: AtomicBool,
}

impl UpstreamStatus {
    /// The region's name, when this controller serves one.
    pub fn region(&self) -> Option<String> {
        self.region.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Cluster {
    /// A standalone controller's part (until an election says otherwise).
    pub fn new(controller: Arc<Controller>) -> Cluster {
        Cluster {
            controller,
            role: Mutex::new(RoleView { role: Role::Standalone, leader: None }),
            leader_changes: AtomicU64::new(0),
            link: LeaderLink::default(),
            region: Arc::default(),
            sharding: std::sync::OnceLock::new(),
        }
    }

    /// Shards the groups over the controllers: from now on each controller grants for the
    /// shards its map gives it and passes the rest on ([`Route::Shards`]).
    /// Set once, at start.
    pub fn set_sharding(&self, sharding: Arc<crate::cluster::shard_routing::Sharding>) {
        let _ = self.sharding.set(sharding);
    }

    /// The controller whose role this is.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    /// This controller's part in the sharding, when the groups are sharded.
    pub fn sharding(&self) -> Option<&Arc<crate::cluster::shard_routing::Sharding>> {
        self.sharding.get()
    }

    /// With the groups sharded, passes a backend's report (encoded, for gRPC `path`) on to
    /// every other controller the map names, each of which computes some of the groups on the
    /// backend; in the background, each call within [`PEER_TIMEOUT`]. Nothing without
    /// sharding.
    pub fn share_report(&self, path: &'static str, body: Bytes) {
        let Some(sharding) = self.sharding.get() else { return };
        let access = self.link.peer_access();
        for other in sharding.others() {
            let Ok(rpc) = sharding.channel(&other, &access, PEER_TIMEOUT) else {
                sharding.parts_unanswered.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let (sharding, body) = (sharding.clone(), body.clone());
            sharding.parts_forwarded.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let call = async {
                    let mut grpc = tonic::client::Grpc::new(rpc);
                    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
                    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
                    grpc.unary(forwarded(body), path, tollgate_proto::wire::BytesCodec).await
                };
                if !matches!(tokio::time::timeout(PEER_TIMEOUT, call).await, Ok(Ok(_))) {
                    sharding.parts_unanswered.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(owner = other, "a backend's report did not reach another controller");
                }
            });
        }
    }

    /// Where a call that came to this controller is answered: the one routing decision every
    /// exchange (and every backend report) takes. A call another controller passed on
    /// (`forwarded`) is not passed on again: `UNAVAILABLE` on a follower, and its caller tries
    /// again once the election settles.
    pub fn route(&self, forwarded: bool) -> Result<Route<'_>, Status> {
        if let Some(sharding) = self.sharding.get() {
            return Ok(Route::Shards(ShardExchange {
                sharding,
                controller: &self.controller,
                link: &self.link,
            }));
        }
        let role = self.role.lock().unwrap_or_else(PoisonError::into_inner);
        match role.role {
            Role::Follower if forwarded => Err(not_leading(role.leader.as_deref())),
            Role::Follower => Ok(Route::Leader(role.leader.clone())),
            Role::Leader | Role::Standalone => Ok(Route::Here),
        }
    }

    /// Answers one of this controller's own exchanges (its front ends' client, or an Envoy
    /// quota stream's) at `now`, where [`route`](Self::route) says: the engine here, each
    /// group's owner, or the leader over gRPC. `UNAVAILABLE` while no leader is known or the
    /// leader does not answer within [`PEER_TIMEOUT`]: the caller's grants then decay as a
    /// client's do.
    pub async fn exchange(
        &self,
        now: Nanos,
        req: v1::ExchangeRequest,
    ) -> Result<v1::ExchangeResponse, Status> {
        match self.route(false)? {
            Route::Here => self.controller.exchange(now, &req),
            Route::Shards(shards) => shards.answer(now, &req, false).await,
            Route::Leader(leader) => {
                self.link
                    .to_leader(now, leader, |rpc| async move {
                        AdmissionClient::new(rpc).exchange(forwarded(req)).await
                    })
                    .await
            }
        }
    }

    /// What a regional controller's lease on the global tier is doing.
    pub fn upstream_status(&self) -> Arc<UpstreamStatus> {
        self.region.clone()
    }

    /// The link to the leader: how this controller reaches it, and what it passes on.
    pub fn link(&self) -> &LeaderLink {
        &self.link
    }

    /// This controller's role now.
    pub fn role(&self) -> RoleView {
        self.role.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Times this controller has become the leader.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// Takes a role from the election at `now`. (The election starts the new leader's
    /// learning lease: [`Controller::relearn`].)
    pub fn set_role(&self, now: Nanos, view: RoleView) {
        let _ = now;
        let mut role = self.role.lock().unwrap_or_else(PoisonError::into_inner);
        if view.role == Role::Leader && role.role != Role::Leader {
            self.leader_changes.fetch_add(1, Ordering::Relaxed);
        }
        *role = view;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_limiter::access::Access;

    use super::*;

    #[tokio::test]
    async fn a_follower_that_cannot_reach_the_leader_says_so_once_a_minute_and_passes_nothing_twice() {
        let store = Box::new(crate::store::MemoryStore::default());
        let settings = tollgate_model::engine::EngineSettings::default();
        let node = crate::node::Node::open(store, settings, Nanos(0), 0).unwrap();
        let cluster = &node.cluster;
        cluster.link().set_peer(Peer { advertise: "http://127.0.0.1:1".into(), access: Access::default() });
        assert_eq!(cluster.link().front_client_id("tollgate-rls"), "tollgate-rls/http://127.0.0.1:1");
        // Nobody listens on port 1: the leader named there never answers.
        let gone = "http://127.0.0.1:1".to_string();
        cluster.set_role(Nanos(0), RoleView { role: Role::Follower, leader: Some(gone) });
        let ask = || v1::ExchangeRequest { client_id: "c".into(), ..Default::default() };
        let at = Nanos(5_000_000_000);
        let e = cluster.exchange(at, ask()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        let logged = || cluster.link().last_warned_at();
        assert_eq!(logged(), Some(at));
        // The same failure within the minute is not logged again; after it, it is.
        let _ = cluster.exchange(at.after(Duration::from_secs(30)), ask()).await;
        assert_eq!(logged(), Some(at));
        let later = at.after(WARN_EVERY);
        let _ = cluster.exchange(later, ask()).await;
        assert_eq!(logged(), Some(later));
        // A backend's report passed on meets the same: counted, and told UNAVAILABLE.
        let gone = Some("http://127.0.0.1:1".to_string());
        let report = Bytes::new();
        let e = cluster
            .link()
            .forward_encoded(later, gone, "/tollgate.v1.Backend/Report", report)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        let f = cluster.link().forwarded();
        assert_eq!((f.reports.load(Ordering::Relaxed), f.unreached.load(Ordering::Relaxed)), (1, 1));
        // No leader known: refused at once, naming why.
        cluster.set_role(later, RoleView { role: Role::Follower, leader: None });
        let e = cluster.exchange(later, ask()).await.unwrap_err();
        assert!(e.message().contains("no leader is elected yet"), "{e:?}");
        // A call another controller passed on is not passed on again by a follower; a leader
        // answers it.
        let services = crate::front::grpc::Services::new(node.clone());
        let passed_on = forwarded(());
        let refused = services.route(&passed_on).err().expect("a follower does not pass a passed-on call on");
        assert!(refused.message().contains("does not lead either"), "{refused:?}");
        assert!(matches!(services.route(&tonic::Request::new(())), Ok(Route::Leader(None))));
        cluster.set_role(later, RoleView { role: Role::Leader, leader: None });
        assert!(matches!(services.route(&passed_on), Ok(Route::Here)));
    }
}
