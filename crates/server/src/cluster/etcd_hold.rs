//! Riding out an etcd outage as the leader: the grants it gave, renewed and never more.
//!
//! A leader that cannot renew its election lease does not know whether etcd is gone for
//! everyone (nobody can be elected: stepping down would only leave the clients without
//! grants) or only for it (a partition: another controller is elected once the lease runs out
//! in etcd). Its peers know. Once the lease could have run out, the leader asks every other
//! controller (their advertised addresses as the member list last gave them) every
//! [`ASK_EVERY`], with an empty exchange marked as passed on: a follower answers that it does
//! not lead and names the leader it knows, if any ([`LEADER_METADATA`]); a controller that
//! leads answers it. The leader **holds** while the last round, within [`CONFIRMED_FOR`],
//! found at least one follower, no leader and no follower naming another; or while it has
//! no peer at all. While it holds:
//!
//! - it answers exchanges as before, but no client is granted more than the grant it has
//!   ([`Relearn::Held`]), a newcomer nothing: a client that falls silent keeps its share,
//!   which nobody else takes, so the grants never add up to more than they did;
//! - it goes on trying to renew its lease: etcd back with the lease alive (a restarted etcd
//!   extends every lease), it leads on as if nothing had happened; the lease expired, it steps
//!   down.
//!
//! It steps down as soon as a round finds another leader, or no peer answers for
//! [`CONFIRMED_FOR`]. A controller elected meanwhile learns what the clients hold for a grant
//! lease and [`LEARN_MARGIN`] more, from its election: the holder learns of it within
//! [`ASK_EVERY`] and an answer's time, and each grant it made before lasts a grant lease, so
//! every grant the old leader renewed has run out before the new one grants beyond what its
//! clients hold. A partition that cuts only the leader off etcd therefore never doubles a
//! limit; see docs/architecture.md.
//!
//! Sharded controllers do not hold: each shard's owner steps down with its lease, as before.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::access::{Access, Rpc};
use tollgate_model::engine::Relearn;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;
use tollgate_proto::v1::admission_client::AdmissionClient;

use crate::cluster::leader_link::forwarded;
use crate::cluster::peer_watch::Peers;
use crate::cluster::role::{Cluster, LEADER_METADATA, NOT_LEADING};

/// How often a holding leader asks its peers who leads.
pub const ASK_EVERY: Duration = Duration::from_millis(500);
/// How long one peer's answer may take.
pub const ANSWER_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a round that found followers and no other leader lets the leader hold.
pub const CONFIRMED_FOR: Duration = Duration::from_millis(1500);
/// How much longer than a grant lease a controller elected learns what the clients hold: at
/// least [`ASK_EVERY`], an answer's time and [`CONFIRMED_FOR`] of rounds that missed it.
pub const LEARN_MARGIN: Duration = Duration::from_secs(3);

/// What one peer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It leads.
    Leads,
    /// It follows, naming the leader it knows (if any).
    Follows(Option<String>),
    /// No answer, or one that says neither.
    Unknown,
}

/// Asks the controller at `url` who leads.
pub async fn ask(rpc: Rpc, me: &str) -> Answer {
    let probe = v1::ExchangeRequest { client_id: format!("tollgate-hold/{me}"), ..Default::default() };
    let probe = forwarded(probe);
    match tokio::time::timeout(ANSWER_TIMEOUT, AdmissionClient::new(rpc).exchange(probe)).await {
        Ok(Ok(_)) => Answer::Leads,
        Ok(Err(status)) if status.code() == tonic::Code::Unavailable && status.message() == NOT_LEADING => {
            let leader = status.metadata().get(LEADER_METADATA).and_then(|v| v.to_str().ok());
            Answer::Follows(leader.map(str::to_string))
        }
        _ => Answer::Unknown,
    }
}

/// Whether a round of `answers` lets `me` hold: `Some(false)` when another leads (or a
/// follower names another), `Some(true)` when some follower answered and none names another,
/// `None` when nobody answered either way.
pub fn verdict(answers: &[Answer], me: &str) -> Option<bool> {
    let mut followed = false;
    for a in answers {
        match a {
            Answer::Leads => return Some(false),
            Answer::Follows(Some(other)) if other != me => return Some(false),
            Answer::Follows(_) => followed = true,
            Answer::Unknown => {}
        }
    }
    followed.then_some(true)
}

/// A leader's hold on its grants through an etcd outage. See the [module documentation](self).
pub struct Hold {
    peers: Arc<Peers>,
    access: Access,
    me: String,
    /// The channels to the peers, by URL.
    channels: std::collections::HashMap<String, Rpc>,
    /// Holding since then.
    since: Option<Nanos>,
    /// When the last round found followers and no other leader.
    confirmed: Option<Nanos>,
}

impl Hold {
    /// A hold for the leader `me`, asking `peers` with `access`.
    pub fn new(peers: Arc<Peers>, access: Access, me: &str) -> Self {
        Self { peers, access, me: me.to_string(), channels: Default::default(), since: None, confirmed: None }
    }

    /// Whether it holds now.
    pub fn holding(&self) -> bool {
        self.since.is_some()
    }

    /// One round at `now`: asks the peers, and says whether the leader may hold (begins or
    /// goes on); each round that may renews the hold on the engine.
    pub async fn round(&mut self, cluster: &Cluster, now: Nanos) -> bool {
        let urls = self.peers.urls();
        let may = if urls.is_empty() {
            true
        } else {
            let rpcs: Vec<Rpc> = urls.iter().filter_map(|u| self.channel(u)).collect();
            let answers = futures_util::future::join_all(rpcs.into_iter().map(|r| ask(r, &self.me))).await;
            match verdict(&answers, &self.me) {
                Some(true) => {
                    self.confirmed = Some(now);
                    true
                }
                Some(false) => false,
                None => self.confirmed.is_some_and(|at| now.since(at) < CONFIRMED_FOR),
            }
        };
        if may {
            if self.since.is_none() {
                self.since = Some(now);
                tracing::warn!(
                    "etcd unreachable past the election lease, and no other controller leads: holding the grants given, none raised, until etcd answers"
                );
            }
            cluster.controller().relearn(now, Relearn::Held);
        }
        may
    }

    /// etcd answered again (the lease renewed): the hold ends; what clients hold is learnt
    /// for the rest of the grant lease.
    pub fn end(&mut self, now: Nanos) {
        if let Some(since) = self.since.take() {
            let held_s = now.since(since).as_secs_f64();
            tracing::info!(held_s, "etcd answers again: leading on");
        }
        self.confirmed = None;
    }

    fn channel(&mut self, url: &str) -> Option<Rpc> {
        if let Some(rpc) = self.channels.get(url) {
            return Some(rpc.clone());
        }
        let rpc = self.access.channel(url, ANSWER_TIMEOUT).ok()?;
        if self.channels.len() >= 64 {
            self.channels.clear();
        }
        self.channels.insert(url.to_string(), rpc.clone());
        Some(rpc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_holds_only_while_followers_name_no_other() {
        let me = "http://10.0.0.1:7460";
        let follows = |l: Option<&str>| Answer::Follows(l.map(str::to_string));
        assert_eq!(verdict(&[follows(None), Answer::Unknown], me), Some(true));
        assert_eq!(verdict(&[follows(Some(me))], me), Some(true));
        assert_eq!(verdict(&[follows(None), Answer::Leads], me), Some(false));
        assert_eq!(verdict(&[follows(Some("http://10.0.0.2:7460")), follows(None)], me), Some(false));
        assert_eq!(verdict(&[Answer::Unknown, Answer::Unknown], me), None);
        assert_eq!(verdict(&[], me), None);
    }
}
