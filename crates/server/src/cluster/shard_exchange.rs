//! An exchange answered with the groups sharded over the controllers: split by the owners of
//! its groups ([`split_exchange`]), this controller's part answered by its engine, the others'
//! passed on to their owners at once, and the answers joined. It calls the controller, the
//! shard routing and the link's credentials; [`Cluster::exchange`](super::role::Cluster) and
//! the gRPC front end call it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tollgate_limiter::shards::join_answers;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;
use tollgate_proto::v1::admission_client::AdmissionClient;
use tonic::Status;

use crate::cluster::leader_link::{LeaderLink, PEER_TIMEOUT, forwarded};
use crate::cluster::shard_routing::{Owner, Sharding, split_exchange};
use crate::controller::Controller;

/// The parts a sharded exchange is answered with.
pub struct ShardExchange<'a> {
    /// This controller's part in the sharding.
    pub sharding: &'a Sharding,
    /// The engine that answers this controller's part.
    pub controller: &'a Controller,
    /// The credentials the other owners are called with, and where failures are logged.
    pub link: &'a LeaderLink,
}

impl ShardExchange<'_> {
    /// Answers `req` at `now`: each group's part by its owner (only this controller's when the
    /// call was itself passed on: `forwarded_call`). A group whose shard has no owner now, or
    /// whose owner does not answer, gets no grant: its clients keep what they hold.
    /// `UNAVAILABLE` when no part is answered at all.
    pub async fn answer(
        &self,
        now: Nanos,
        req: &v1::ExchangeRequest,
        forwarded_call: bool,
    ) -> Result<v1::ExchangeResponse, Status> {
        let names: Vec<&str> = req.groups.iter().map(|g| g.group.as_str()).collect();
        let routes = self.sharding.route(self.controller, &names);
        let mut owners: Vec<Owner> = vec![Owner::Here];
        let (parts, _) = split_exchange(req, |i| {
            let (owner, _) = routes[i].clone()?;
            if forwarded_call && owner != Owner::Here {
                return None;
            }
            Some(owners.iter().position(|o| *o == owner).unwrap_or_else(|| {
                owners.push(owner);
                owners.len() - 1
            }))
        });
        // A client that follows the map is sent a newer one; every grant given here names its
        // group's shard, so that the client sends the group's next part to its owner.
        let map =
            if forwarded_call { None } else { req.shard_map_epoch.and_then(|e| self.sharding.map_for(e)) };
        if parts.is_empty() {
            // Nothing to grant here: the periods still go back.
            let mut empty = req.clone();
            empty.groups.clear();
            let mut answer = self.controller.exchange(now, &empty)?;
            answer.shard_map = map;
            return Ok(answer);
        }
        let shards: HashMap<&str, u16> = names
            .iter()
            .zip(&routes)
            .filter_map(|(g, r)| r.as_ref().filter(|(o, _)| *o == Owner::Here).map(|(_, s)| (*g, *s)))
            .collect();
        let calls = parts.into_iter().map(|(i, part)| {
            let owner = owners[i].clone();
            let shards = &shards;
            async move {
                match owner {
                    Owner::Here => self.here(now, &part, shards),
                    Owner::At(address) => self.at(now, &address, part).await,
                }
            }
        });
        let mut answer = joined(futures_util::future::join_all(calls).await)?;
        answer.shard_map = map;
        Ok(answer)
    }

    /// This controller's part, each grant naming its group's shard.
    fn here(
        &self,
        now: Nanos,
        part: &v1::ExchangeRequest,
        shards: &HashMap<&str, u16>,
    ) -> Result<v1::ExchangeResponse, Status> {
        let mut answer = self.controller.exchange(now, part)?;
        for g in &mut answer.grants {
            g.shard = shards.get(g.group.as_str()).map(|&s| u32::from(s));
        }
        Ok(answer)
    }

    /// Another owner's part, passed on to it at `address` within [`PEER_TIMEOUT`].
    async fn at(
        &self,
        now: Nanos,
        address: &str,
        part: v1::ExchangeRequest,
    ) -> Result<v1::ExchangeResponse, Status> {
        self.sharding.parts_forwarded.fetch_add(1, Ordering::Relaxed);
        let rpc = self.sharding.channel(address, &self.link.peer_access(), PEER_TIMEOUT)?;
        let mut client = AdmissionClient::new(rpc);
        let call = client.exchange(forwarded(part));
        let answer = match tokio::time::timeout(PEER_TIMEOUT, call).await {
            Ok(a) => a.map(tonic::Response::into_inner),
            Err(_) => Err(Status::unavailable(format!(
                "the owner {address} did not answer within {PEER_TIMEOUT:?}"
            ))),
        };
        if let Err(status) = &answer {
            self.sharding.parts_unanswered.fetch_add(1, Ordering::Relaxed);
            self.link.warn_unreached(now, address, status);
        }
        answer
    }
}

/// The answers of the parts joined; the last failure when no part was answered.
fn joined(results: Vec<Result<v1::ExchangeResponse, Status>>) -> Result<v1::ExchangeResponse, Status> {
    let mut failure = None;
    let answers: Vec<v1::ExchangeResponse> =
        results.into_iter().filter_map(|r| r.map_err(|e| failure = Some(e)).ok()).collect();
    match (answers.is_empty(), failure) {
        (true, Some(status)) => Err(status),
        _ => Ok(join_answers(answers)),
    }
}
