//! The link to the leader: how a follower reaches it (its own advertised address and the
//! credentials it calls with), the channel, the calls it passes on
//! ([`LeaderLink::forward_encoded`]) with their counts, and the log of failures to reach it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate_limiter::access::{Access, Rpc};
use tollgate_model::time::Nanos;
use tonic::Status;
use tonic::codegen::Bytes;

/// The gRPC metadata key that marks a call one controller passed on to another. A controller
/// that follows does not pass such a call on again (two controllers that each take the other
/// for the leader, for a moment during an election, would bounce it between them): it answers
/// `UNAVAILABLE`, and the caller tries again.
pub const FORWARDED_METADATA: &str = "tollgate-forwarded";

/// `message` as a call marked as passed on by a controller ([`FORWARDED_METADATA`]).
pub(crate) fn forwarded<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert(FORWARDED_METADATA, tonic::metadata::MetadataValue::from_static("1"));
    req
}

/// How long a follower waits for the leader to answer an exchange it passes on, and to
/// connect.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the same failure to reach the leader is logged again.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// How this controller reaches the leader while it follows: its own address (which names its
/// front ends' client) and the token and TLS files it calls with.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The gRPC URL this controller advertises.
    pub advertise: String,
    /// The token (with `--auth`) and TLS files for calling the leader.
    pub access: Access,
}

/// What a follower has passed on to the leader.
#[derive(Debug, Default)]
pub struct Forwarded {
    /// Clients' exchanges passed on.
    pub exchanges: AtomicU64,
    /// Backends' reports passed on.
    pub reports: AtomicU64,
    /// Of those, the ones the leader could not be reached for (or no leader was known).
    pub unreached: AtomicU64,
}

/// The link to the leader. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct LeaderLink {
    /// How to reach the leader; `None` when there is no election.
    peer: Mutex<Option<Peer>>,
    /// The channel to the leader, and its address.
    upstream: Mutex<Option<(String, Rpc)>>,
    /// The last failure to reach the leader that was logged, and when.
    last_warned: Mutex<Option<(String, Nanos)>>,
    /// Clients' exchanges and backends' reports passed on to the leader, and those of them
    /// the leader did not answer.
    forwarded: Forwarded,
}

impl LeaderLink {
    /// When the last failure to reach the leader was logged.
    #[cfg(test)]
    pub(crate) fn last_warned_at(&self) -> Option<Nanos> {
        self.last_warned.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|(_, t)| *t)
    }

    /// How this controller reaches the leader when it follows (set with an election).
    pub fn set_peer(&self, peer: Peer) {
        *self.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(peer);
        *self.upstream.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The client id this controller's front ends exchange under: `base` alone for a
    /// controller without an election, `base/ADDRESS` with one, so that every controller's
    /// front ends hold leases of their own at the leader (an address too long for a client id
    /// is named by its hash, as its token is).
    pub fn front_client_id(&self, base: &str) -> String {
        match &*self.peer.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(p) => {
                let id = format!("{base}/{}", p.advertise);
                if id.len() <= tollgate_proto::CLIENT_ID_MAX_BYTES {
                    id
                } else {
                    format!("{base}/{}", crate::access::auth::peer_token_name(&p.advertise))
                }
            }
            None => base.to_string(),
        }
    }

    fn count_unreached<T>(&self, answer: Result<T, Status>) -> Result<T, Status> {
        if answer.as_ref().is_err_and(is_unreached) {
            self.forwarded.unreached.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// Passes an encoded call (a client's exchange or a backend's report, as it came off the
    /// wire) on to `leader` at gRPC `path`, as it is, and returns the leader's encoded answer:
    /// no message is decoded or encoded again on the way.
    pub async fn forward_encoded(
        &self,
        now: Nanos,
        leader: Option<String>,
        path: &'static str,
        body: Bytes,
    ) -> Result<Bytes, Status> {
        let counter =
            if path.ends_with("/Report") { &self.forwarded.reports } else { &self.forwarded.exchanges };
        counter.fetch_add(1, Ordering::Relaxed);
        let answer = self
            .to_leader(now, leader, |rpc| async move {
                let mut grpc = tonic::client::Grpc::new(rpc);
                grpc.ready().await.map_err(|e| Status::unavailable(format!("the connection failed: {e}")))?;
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
                grpc.unary(forwarded(body), path, tollgate_proto::wire::BytesCodec).await
            })
            .await;
        self.count_unreached(answer)
    }

    /// The token and TLS files this controller calls other controllers with.
    pub fn peer_access(&self) -> Access {
        self.peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|p| p.access.clone())
            .unwrap_or_default()
    }

    /// What a follower has passed on to the leader so far.
    pub fn forwarded(&self) -> &Forwarded {
        &self.forwarded
    }

    /// Makes one call to the leader (`call` over the channel to it), within [`PEER_TIMEOUT`];
    /// `UNAVAILABLE` when no leader is known or it cannot be reached in time, which is logged
    /// ([`warn_unreached`](Self::warn_unreached)).
    pub(crate) async fn to_leader<T, F>(
        &self,
        now: Nanos,
        leader: Option<String>,
        call: impl FnOnce(Rpc) -> F,
    ) -> Result<T, Status>
    where
        F: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let Some(leader) = leader else {
            return Err(Status::unavailable("not the leader, and no leader is elected yet"));
        };
        let answer = match self.upstream(&leader) {
            Ok(rpc) => match tokio::time::timeout(PEER_TIMEOUT, call(rpc)).await {
                Ok(Ok(answer)) => Ok(answer.into_inner()),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(Status::unavailable(format!(
                    "the leader {leader} did not answer within {PEER_TIMEOUT:?}"
                ))),
            },
            Err(status) => Err(status),
        };
        if let Err(status) = &answer
            && is_unreached(status)
        {
            self.warn_unreached(now, &leader, status);
        }
        answer
    }

    /// Logs a follower's failure to reach the leader: at once when it is new (another leader,
    /// another error), else at most every [`WARN_EVERY`], so a misconfigured peer link is seen
    /// without a line per exchange.
    pub(crate) fn warn_unreached(&self, now: Nanos, leader: &str, status: &Status) {
        let said = format!("{leader}: {:?} {}", status.code(), status.message());
        let mut last = self.last_warned.lock().unwrap_or_else(PoisonError::into_inner);
        if last.as_ref().is_some_and(|(text, at)| *text == said && now.since(*at) < WARN_EVERY) {
            return;
        }
        tracing::warn!(
            leader,
            code = ?status.code(),
            error = %status.message(),
            "this follower cannot reach the leader; its front ends decide from the grants they hold, \
             and clients and backends are told UNAVAILABLE"
        );
        *last = Some((said, now));
    }

    /// The channel to `leader`, made on first use and again when the leader changes.
    fn upstream(&self, leader: &str) -> Result<Rpc, Status> {
        let mut upstream = self.upstream.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, rpc)) = &*upstream
            && at == leader
        {
            return Ok(rpc.clone());
        }
        let access =
            self.peer.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|p| p.access.clone());
        let rpc = access
            .unwrap_or_default()
            .channel(leader, PEER_TIMEOUT)
            .map_err(|e| Status::unavailable(format!("cannot reach the leader {leader}: {e}")))?;
        *upstream = Some((leader.to_string(), rpc.clone()));
        Ok(rpc)
    }
}

/// Whether `status` says the leader was not reached (as opposed to the leader's own answer,
/// such as a refused exchange, which goes back to the caller as it is).
pub(crate) fn is_unreached(status: &Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
}
