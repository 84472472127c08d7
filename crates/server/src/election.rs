//! One leader among the controllers that share an etcd (TiDB's resource manager and
//! YouTube's Doorman elect theirs the same way): each controller holds an etcd lease and
//! campaigns under `PREFIX/election` with its advertised address. The one elected grants and
//! takes reports; the others answer clients and backends with its address. A leader that
//! cannot renew its lease within the lease's time steps down before etcd hands the election to
//! another, so two never lead at once; a new leader relearns what clients hold for one grant
//! lease ([`Controller::set_role`]).
//!
//! Each controller also holds `PREFIX/members/ADDRESS` under its lease, so two controllers that
//! advertise the same address are refused.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use crate::clock::Clock;
use crate::controller::{Controller, Role, RoleView};
use crate::options::EtcdTarget;
use crate::store::etcd::{connect, reason};

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
    controller: Arc<Controller>,
    clock: Clock,
) {
    loop {
        let result = term(&target, &advertise, lease, controller.clone(), clock).await;
        let was_leader = controller.role().role == Role::Leader;
        controller.set_role(clock.now(), RoleView { role: Role::Follower, leader: None });
        match result {
            Err(e) if was_leader => tracing::warn!(error = %e, "stepped down as leader"),
            Err(e) => tracing::warn!(error = %e, "election: trying again"),
            Ok(()) => {}
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// One term: a lease, the member key, the campaign, and the lease's renewal until it fails.
async fn term(
    target: &EtcdTarget,
    advertise: &str,
    lease: Duration,
    controller: Arc<Controller>,
    clock: Clock,
) -> Result<(), String> {
    let ttl = i64::try_from(lease.as_secs()).unwrap_or(i64::MAX).max(1);
    let mut client: Client = connect(target).await.map_err(|e| reason(&e))?;
    let lease_id = client.lease_grant(ttl, None).await.map_err(|e| reason(&e))?.id();
    let member = member_key(target, advertise);
    let claimed = client
        .txn(Txn::new().when([Compare::create_revision(member.clone(), CompareOp::Equal, 0)]).and_then([
            TxnOp::put(member, advertise, Some(etcd_client::PutOptions::new().with_lease(lease_id))),
        ]))
        .await
        .map_err(|e| reason(&e))?
        .succeeded();
    if !claimed {
        let _ = client.lease_revoke(lease_id).await;
        return Err(format!("another controller advertises {advertise}; give each its own --advertise"));
    }
    let (mut keeper, mut acks) = client.lease_keep_alive(lease_id).await.map_err(|e| reason(&e))?;
    let name = target.key("election");
    // Who leads, while this one does not: etcd answers an observation only once there is a
    // leader, so it runs beside the campaign.
    let observer = {
        let (mut client, name, controller, me) =
            (client.clone(), name.clone(), controller.clone(), advertise.to_string());
        tokio::spawn(async move {
            let Ok(mut observed) = client.observe(name).await else { return };
            while let Ok(Some(r)) = observed.message().await {
                let leader = r.kv().map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                if leader.as_deref() != Some(me.as_str()) && controller.role().role != Role::Leader {
                    controller.set_role(clock.now(), RoleView { role: Role::Follower, leader });
                }
            }
        })
    };
    let mut campaigner = client.clone();
    let campaign = campaigner.campaign(name, advertise, lease_id);
    tokio::pin!(campaign);
    let mut renew = tokio::time::interval(lease / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewed = clock.now();
    let mut leading = false;
    let outcome = loop {
        tokio::select! {
            won = &mut campaign, if !leading => match won {
                Ok(_) => {
                    leading = true;
                    controller.set_role(clock.now(), RoleView { role: Role::Leader, leader: Some(advertise.to_string()) });
                    tracing::info!(advertise, "elected leader");
                }
                Err(e) => break Err(reason(&e)),
            },
            _ = renew.tick() => {
                // Renewed too long ago: etcd may already have handed the election on.
                if clock.now().since(renewed) >= lease {
                    break Err(format!("the lease was not renewed within {lease:?}"));
                }
                if let Err(e) = keeper.keep_alive().await {
                    break Err(reason(&e));
                }
            }
            ack = acks.message() => match ack {
                Ok(Some(a)) if a.ttl() > 0 => renewed = clock.now(),
                Ok(Some(_)) => break Err("the lease expired".into()),
                Ok(None) => break Err("the lease's renewal stream ended".into()),
                Err(e) => break Err(reason(&e)),
            },
        }
    };
    observer.abort();
    // Best effort: hand the election on at once rather than at the lease's end.
    let _ = tokio::time::timeout(Duration::from_millis(500), client.lease_revoke(lease_id)).await;
    outcome
}
