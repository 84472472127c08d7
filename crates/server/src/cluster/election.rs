//! One leader among the controllers that share an etcd (TiDB's resource manager and
//! YouTube's Doorman elect theirs the same way): each controller holds an etcd lease and
//! campaigns under `PREFIX/election` with its advertised address. The one elected grants and
//! takes reports; the others pass clients' exchanges and backends' reports on to it. A
//! candidacy waits on etcd for as long as another controller leads, so the election's client
//! bounds its other calls itself rather than every call (which would end each term after
//! etcd's call timeout, leaving followers without a leader meanwhile). A leader that
//! cannot renew its lease within the lease's time steps down before etcd hands the election to
//! another, so two never lead at once; a new leader relearns what clients hold for one grant
//! lease ([`Cluster::set_role`](crate::cluster::role::Cluster::set_role)).
//!
//! **etcd outages.** A renewal that fails (etcd gone, a member restarting) does not end the
//! term: the leader goes on granting from what it holds, and keeps trying to renew on the same
//! lease, until the lease could have run out in etcd (its time since the last renewal was
//! *sent*); only then does it step down. A controller whose term ended revokes its last lease
//! first thing in its next term, so when etcd comes back the election is free at once, rather
//! than held for a lease by candidacies nobody runs any more (etcd extends every lease by its
//! time when it starts).
//!
//! Each controller also holds `PREFIX/members/ADDRESS` under its lease, so two controllers that
//! advertise the same address are refused.
//!
//! **A stray entry.** An entry under `PREFIX/election` that is no controller's candidacy (not
//! an address, or held under no lease: written by hand, or by another program) would lead the
//! election once it is the oldest, and for ever. A controller that sees one lead deletes it
//! (unless it changed meanwhile) and logs the key and what is wrong with it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use tollgate_model::engine::Relearn;
use tollgate_model::time::Nanos;

use crate::clock::Clock;
use crate::cluster::etcd_hold::{self, Hold};
use crate::cluster::peer_watch;
use crate::cluster::role::{Cluster, Role, RoleView};
use crate::options::EtcdTarget;
use crate::store::etcd::{ETCD_TIMEOUT, connect, connect_unbounded, reason};

/// How long a term may go without starting again after a failure.
const RETRY: Duration = Duration::from_millis(500);

fn member_key(target: &EtcdTarget, advertise: &str) -> String {
    target.key(&format!("members/{}", advertise.replace('/', "_")))
}

/// Whether another live controller advertises `advertise` now.
pub async fn advertised_elsewhere(target: &EtcdTarget, advertise: &str) -> Result<bool, String> {
    let mut client = connect(target).await.map_err(|e| reason(&e))?;
    let r = client.get(member_key(target, advertise), None).await.map_err(|e| reason(&e))?;
    Ok(r.count() > 0)
}

/// Campaigns for as long as the server runs, term after term.
pub async fn run(
    target: EtcdTarget,
    advertise: String,
    lease: Duration,
    cluster: Arc<Cluster>,
    clock: Clock,
) {
    // The lease of the last term, until it is known revoked.
    let mut previous: Option<i64> = None;
    let members = target.key("members/");
    let me = member_key(&target, &advertise);
    let peers = Arc::new(peer_watch::Peers::default());
    let _watch =
        peer_watch::AbortOnDrop(tokio::spawn(peer_watch::watch(target.clone(), members, me, peers.clone())));
    loop {
        let hold = cluster
            .sharding()
            .is_none()
            .then(|| Hold::new(peers.clone(), cluster.link().peer_access(), &advertise));
        let result = term(&target, &advertise, lease, cluster.clone(), clock, &mut previous, hold).await;
        // The membership's lease may be gone: no shard is granted until the next term.
        if let Some(s) = cluster.sharding() {
            s.set_term(None);
        }
        let was = cluster.role();
        let was_leader = was.role == Role::Leader;
        // A follower that lost etcd goes on passing calls to the leader it knew (which may be
        // holding its grants through the outage); the next term's observation corrects it.
        let leader = if was_leader { None } else { was.leader };
        cluster.set_role(clock.now(), RoleView { role: Role::Follower, leader });
        match result {
            Err(e) if was_leader => tracing::warn!(error = %e, "stepped down as leader"),
            Err(e) => tracing::warn!(error = %e, "election: trying again"),
            Ok(()) => {}
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// A term's lease renewal: the stream it goes on, and when renewals were sent.
struct Renewal {
    keeper: etcd_client::LeaseKeeper,
    acks: etcd_client::LeaseKeepAliveStream,
    /// When the last acknowledged renewal was sent: etcd's expiry is at most a lease after it.
    renewed: Nanos,
    /// When each renewal not yet acknowledged was sent, oldest first (etcd answers in order).
    sent: std::collections::VecDeque<Nanos>,
    /// The renewal stream failed: a new one is opened on the same lease at each turn.
    broken: bool,
}

impl Renewal {
    /// A renewal of the lease `lease_id` of `lease`, reopening a broken stream first.
    async fn turn(
        &mut self,
        client: &mut Client,
        (lease_id, lease): (i64, Duration),
        clock: Clock,
        (leading, holding): (bool, bool),
    ) {
        if self.broken {
            // Short while a leader holds its grants: its rounds of asking the peers wait.
            let wait = if holding { (lease / 3).min(etcd_hold::ASK_EVERY) } else { lease / 3 };
            let reopened = tokio::time::timeout(wait, client.lease_keep_alive(lease_id)).await;
            if let Ok(Ok((k, a))) = reopened {
                (self.keeper, self.acks, self.broken) = (k, a, false);
                self.sent.clear();
                tracing::info!("election: renewing the lease again");
            }
        }
        if !self.broken {
            self.sent.push_back(clock.now());
            if let Err(e) = bounded(self.keeper.keep_alive()).await {
                self.broken = true;
                tracing::warn!(error = %e, leading, "election: cannot renew the lease; trying until it could have run out");
            }
        }
    }

    /// Whether the last acknowledged renewal is a lease old at `now`: etcd may already have
    /// handed the election on.
    fn overdue(&self, now: Nanos, lease: Duration) -> bool {
        now.since(self.renewed) >= lease
    }

    /// etcd's answer to a renewal: `Err` when the lease expired.
    fn ack(
        &mut self,
        ack: Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error>,
        leading: bool,
    ) -> Result<(), String> {
        match ack {
            Ok(Some(a)) if a.ttl() > 0 => {
                if let Some(at) = self.sent.pop_front() {
                    self.renewed = self.renewed.max(at);
                }
            }
            Ok(Some(_)) => return Err("the lease expired".into()),
            Ok(None) | Err(_) => {
                self.broken = true;
                tracing::warn!(
                    leading,
                    "election: the lease's renewal stream broke; trying until the lease could have run out"
                );
            }
        }
        Ok(())
    }
}

/// One term: a lease, the member key, the campaign, and the lease's renewal until it fails.
async fn term(
    target: &EtcdTarget,
    advertise: &str,
    lease: Duration,
    cluster: Arc<Cluster>,
    clock: Clock,
    previous: &mut Option<i64>,
    mut hold: Option<Hold>,
) -> Result<(), String> {
    let ttl = i64::try_from(lease.as_secs()).unwrap_or(i64::MAX).max(1);
    // Unbounded calls, for the campaign; those that should answer at once are bounded here.
    let mut client: Client = bounded(connect_unbounded(target)).await?;
    let lease_id = claim_member(&mut client, target, advertise, ttl, previous).await?;
    let (keeper, acks) = bounded(client.lease_keep_alive(lease_id)).await?;
    if let Some(s) = cluster.sharding() {
        s.set_term(Some(lease_id));
    }
    let name = target.key("election");
    // Who leads, while this one does not: etcd answers an observation only once there is a
    // leader, so it runs beside the campaign.
    let observer = follow_leader(client.clone(), name.clone(), cluster.clone(), advertise.to_string(), clock);
    let mut campaigner = client.clone();
    let campaign = campaigner.campaign(name, advertise, lease_id);
    tokio::pin!(campaign);
    let (mut renew, mut asking) = (delayed(lease / 3), delayed(etcd_hold::ASK_EVERY));
    let mut renewal = Renewal { keeper, acks, renewed: clock.now(), sent: Default::default(), broken: false };
    let mut leading = false;
    let outcome = loop {
        tokio::select! {
            won = &mut campaign, if !leading => match won {
                Ok(_) => {
                    leading = true;
                    lead(&cluster, &mut client, target, clock, advertise).await;
                }
                Err(e) => break Err(reason(&e)),
            },
            _ = renew.tick() => {
                let holding = hold.as_ref().is_some_and(Hold::holding);
                if renewal.overdue(clock.now(), lease) && !holding && !may_hold(hold.as_mut(), leading, &cluster, clock).await {
                    break Err(format!("the lease was not renewed within {lease:?}"));
                }
                renewal.turn(&mut client, (lease_id, lease), clock, (leading, holding)).await;
            }
            _ = asking.tick(), if hold.as_ref().is_some_and(Hold::holding) => {
                if let Some(h) = hold.as_mut() && !h.round(&cluster, clock.now()).await {
                    break Err("etcd is out of reach, and another controller leads or none answers".into());
                }
            }
            ack = renewal.acks.message(), if !renewal.broken => {
                if let Err(e) = renewal.ack(ack, leading) {
                    break Err(e);
                }
                if let Some(h) = hold.as_mut() && !renewal.overdue(clock.now(), lease) {
                    h.end(clock.now());
                }
            }
        }
    };
    observer.abort();
    // Best effort: hand the election on at once rather than at the lease's end (else the next
    // term revokes it).
    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), client.lease_revoke(lease_id)).await {
        *previous = None;
    }
    outcome
}

/// An interval of `period` whose missed ticks are not made up.
fn delayed(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Whether a controller whose lease could have run out may go on: only a leader that may hold
/// its grants, no other controller leading (see [`etcd_hold`]).
async fn may_hold(hold: Option<&mut Hold>, leading: bool, cluster: &Cluster, clock: Clock) -> bool {
    match hold {
        Some(h) if leading => h.round(cluster, clock.now()).await,
        _ => false,
    }
}

/// This controller was elected: the last leader's consumption and ramps, as it last wrote
/// them, before this one grants and writes its own (with the groups sharded, each shard's
/// owner reads its groups' when it is given them); the groups with traffic lately are learnt
/// for a lease, as their clients may hold grants the last leader gave (every group, when etcd
/// does not say).
async fn lead(cluster: &Cluster, client: &mut Client, target: &EtcdTarget, clock: Clock, advertise: &str) {
    if cluster.sharding().is_none() {
        take_over(cluster, client, target, clock).await;
    }
    cluster.set_role(clock.now(), RoleView { role: Role::Leader, leader: Some(advertise.to_string()) });
    tracing::info!(advertise, "elected leader");
}

/// Revokes the last term's lease (its member key and candidacy go with it), takes a new one
/// and claims this controller's member key under it; returns the lease.
async fn claim_member(
    client: &mut Client,
    target: &EtcdTarget,
    advertise: &str,
    ttl: i64,
    previous: &mut Option<i64>,
) -> Result<i64, String> {
    if let Some(old) = *previous {
        // Its member key and candidacy go with it (gone already if it ran out: fine).
        match bounded(client.lease_revoke(old)).await {
            Ok(_) => {}
            Err(e) if e.contains("lease not found") => {}
            Err(e) => return Err(e),
        }
        *previous = None;
    }
    let lease_id = bounded(client.lease_grant(ttl, None)).await?.id();
    *previous = Some(lease_id);
    let member = member_key(target, advertise);
    let claimed = bounded(client.txn(
        Txn::new().when([Compare::create_revision(member.clone(), CompareOp::Equal, 0)]).and_then([
            TxnOp::put(member, advertise, Some(etcd_client::PutOptions::new().with_lease(lease_id))),
        ]),
    ))
    .await?
    .succeeded();
    if !claimed {
        let _ = bounded(client.lease_revoke(lease_id)).await;
        return Err(format!("another controller advertises {advertise}; give each its own --advertise"));
    }
    Ok(lease_id)
}

/// Who leads, while this one does not: etcd answers an observation only once there is a
/// leader, so it runs beside the campaign.
fn follow_leader(
    mut client: Client,
    name: String,
    cluster: Arc<Cluster>,
    me: String,
    clock: Clock,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut observed) = client.observe(name).await else { return };
        while let Ok(Some(r)) = observed.message().await {
            let leader = match r.kv() {
                None => None,
                Some(kv) => match candidacy(kv.value(), kv.lease()) {
                    Ok(leader) => Some(leader),
                    Err(why) => {
                        fence(&mut client, kv, &why).await;
                        continue;
                    }
                },
            };
            if leader.as_deref() != Some(me.as_str()) && cluster.role().role != Role::Leader {
                cluster.set_role(clock.now(), RoleView { role: Role::Follower, leader });
            }
        }
    })
}

/// A leader elected with its groups not sharded takes over: the last leader's consumption and
/// ramps, as it last wrote them, before this one grants and writes its own (with the groups
/// sharded, each shard's owner reads its groups' when it is given them); and the groups with
/// traffic lately are learnt for a lease, as their clients may hold grants the last leader
/// gave (every group, when etcd does not say).
async fn take_over(cluster: &Cluster, client: &mut Client, target: &EtcdTarget, clock: Clock) {
    let controller = cluster.controller();
    let wall_ms = crate::clock::wall_ms();
    let since = crate::store::recent_since(wall_ms, controller.lease());
    let stored = crate::store::etcd::stored_progress(client, target, since).await;
    let recent = stored.as_ref().and_then(|s| s.recent.clone());
    let learnt = recent.map_or(Relearn::All, Relearn::Groups);
    controller.relearn(clock.now(), learnt.clone());
    // The last leader may have held its grants through an etcd outage until it heard of this
    // one: learnt for a grant lease from when it surely stopped.
    let later = cluster.controller().clone();
    tokio::spawn(async move {
        tokio::time::sleep(etcd_hold::LEARN_MARGIN).await;
        later.relearn(clock.now(), learnt);
    });
    if let Some(stored) = stored {
        let meters = controller.ownership().restore_meters(stored.meters, |_| true);
        let ramps = controller.ownership().resume_ramps(clock.now(), wall_ms, stored.ramps, |_| true);
        tracing::debug!(meters, ramps, "election: the stored consumption and ramps were read");
        crate::cluster::shard_map::place_windows(controller, None).await;
    }
}

/// `call`, within [`ETCD_TIMEOUT`]; its error or the timeout in words.
async fn bounded<T>(call: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, String> {
    match tokio::time::timeout(ETCD_TIMEOUT, call).await {
        Ok(answer) => answer.map_err(|e| reason(&e)),
        Err(_) => Err(format!("etcd did not answer within {ETCD_TIMEOUT:?}")),
    }
}

/// Keeps `status.leader` naming the global tier's leader, as `PREFIX/election` says, for a
/// regional controller: an observation of the election, opened again after any failure.
pub(crate) async fn observe_leader(
    target: EtcdTarget,
    status: std::sync::Arc<crate::cluster::role::UpstreamStatus>,
) {
    let name = target.key("election");
    let set = |leader: Option<String>| {
        *status.leader.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = leader;
    };
    loop {
        if let Ok(mut client) = bounded(connect_unbounded(&target)).await
            && let Ok(mut observed) = client.observe(name.clone()).await
        {
            while let Ok(Some(r)) = observed.message().await {
                // A stray entry is the global tier's to delete; until then no leader is known.
                set(r.kv().and_then(|kv| candidacy(kv.value(), kv.lease()).ok()));
            }
        }
        set(None);
        tokio::time::sleep(RETRY).await;
    }
}

/// The address an entry under `PREFIX/election` names, when it is a controller's candidacy:
/// held under a lease (every controller campaigns with one), naming `http://HOST:PORT` or
/// `https://HOST:PORT`. Anything else says what is wrong with it.
fn candidacy(value: &[u8], lease: i64) -> Result<String, String> {
    let text = std::str::from_utf8(value).map_err(|_| "its value is not UTF-8".to_string())?;
    crate::cluster::role::check_advertise(text).map_err(|e| format!("its value {e}"))?;
    if lease == 0 {
        return Err("it is held under no lease, as no controller's candidacy is".into());
    }
    Ok(text.to_string())
}

/// Deletes an entry that is no controller's candidacy but holds the election (an etcd
/// election is led by its oldest entry, so a stray one would keep every controller from
/// leading for ever), unless it has changed since it was read; logged with the key and why.
async fn fence(client: &mut Client, kv: &etcd_client::KeyValue, why: &str) {
    let key = String::from_utf8_lossy(kv.key()).into_owned();
    tracing::warn!(
        key,
        why,
        "election: an entry that is no controller's candidacy leads the election; deleting it"
    );
    let unchanged = Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision());
    let delete = Txn::new().when([unchanged]).and_then([TxnOp::delete(kv.key(), None)]);
    if let Err(e) = bounded(client.txn(delete)).await {
        tracing::warn!(key, error = %e, "election: cannot delete the stray entry; the election waits for it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_address_under_a_lease_is_a_candidacy() {
        assert_eq!(candidacy(b"http://10.0.0.1:7460", 7).unwrap(), "http://10.0.0.1:7460");
        assert_eq!(candidacy(b"https://tollgate-0.peers:7460", 7).unwrap(), "https://tollgate-0.peers:7460");
        assert!(candidacy(b"http://10.0.0.1:7460", 0).unwrap_err().contains("no lease"));
        assert!(candidacy(b"garbage", 7).unwrap_err().contains("must be http://HOST:PORT"));
        assert!(candidacy(b"http://host:0", 7).is_err());
        assert!(candidacy(&[0xff, 0xfe], 7).unwrap_err().contains("UTF-8"));
    }
}
