//! The shard map on etcd (`--shards`): where it is kept, how each controller follows it, how
//! the elected leader moves it, and how the node's capacity is split among the owners.
//!
//! | key | what |
//! | --- | --- |
//! | `PREFIX/shards/map` | the shard map ([`ShardMap::encode`]), written by the leader only |
//! | `PREFIX/shards/applied/ADDRESS` | the epoch of the last map a controller applied, under its lease |
//! | `PREFIX/shards/claims/ADDRESS` | what its groups claim of the capacity, under its lease |
//! | `PREFIX/members/ADDRESS` | every controller's membership (the election's), under its lease |
//!
//! **Each controller**, for each term of its membership, reads the map, applies it (forgetting
//! the groups it no longer owns), says so under its lease, and follows the map's changes.
//! A map that is malformed or of another version is refused, logged with its key and why,
//! and the last good one stays. **The leader** reads the members and what each applied when
//! either changes (and every [`COORDINATE_EVERY`]) and writes the next map ([`next_map`]) if
//! one is due, only over the map it read (a transaction on its revision). A malformed map in etcd is fenced: replaced by one
//! that gives no shard to anyone, at a newer epoch, from which shards are given again once
//! every member has applied it. **Each owner**, at every tick with a capacity configured,
//! writes its claims and shares the capacity by every owner's ([`split_capacity`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use tollgate_model::shard::{Member, ShardMap, lesser_claims, next_map, split_capacity};

use crate::clock::Clock;
use crate::cluster::role::{Cluster, Role};
use crate::cluster::shard_routing::{Sharding, decode_claims, encode_claims};
use crate::controller::Controller;
use crate::store::etcd::{ETCD_TIMEOUT, connect, connect_unbounded, reason, stored_progress};
use crate::store::target::EtcdTarget;
use tollgate_model::engine::Relearn;

/// How often the leader looks at the members and the map.
pub const COORDINATE_EVERY: Duration = Duration::from_millis(100);
/// How long after a failure a loop starts again.
const RETRY: Duration = Duration::from_millis(500);

fn map_key(target: &EtcdTarget) -> String {
    target.key("shards/map")
}

fn per_member(target: &EtcdTarget, what: &str, address: &str) -> String {
    target.key(&format!("shards/{what}/{}", address.replace('/', "_")))
}

async fn bounded<T>(call: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, String> {
    match tokio::time::timeout(ETCD_TIMEOUT, call).await {
        Ok(answer) => answer.map_err(|e| reason(&e)),
        Err(_) => Err(format!("etcd did not answer within {ETCD_TIMEOUT:?}")),
    }
}

/// Refuses to start a controller whose `--shards` does not match the map in etcd: given
/// `shards` but the map has another number, or not given while the controllers there shard.
pub async fn check(target: &EtcdTarget, shards: Option<u16>) -> Result<(), String> {
    let mut client = connect(target).await.map_err(|e| reason(&e))?;
    let got = bounded(client.get(map_key(target), None)).await?;
    let Some(kv) = got.kvs().first() else { return Ok(()) };
    // A malformed map is the leader's to fence; it says nothing of the number.
    let Ok(map) = ShardMap::decode(kv.value()) else { return Ok(()) };
    match shards {
        Some(n) if n != map.shards() => Err(format!(
            "--shards {n}: the controllers on this etcd shard the groups {} ways ({}); give --shards {}",
            map.shards(),
            map_key(target),
            map.shards()
        )),
        None => Err(format!(
            "the controllers on this etcd shard the groups ({} holds a map of {} shards): start this one with --shards {}",
            map_key(target),
            map.shards(),
            map.shards()
        )),
        Some(_) => Ok(()),
    }
}

/// Follows the map for as long as the server runs: in each term of this controller's
/// membership, the map is read, applied and followed; between terms nothing is owned.
pub async fn follow(target: EtcdTarget, sharding: Arc<Sharding>, controller: Arc<Controller>, clock: Clock) {
    let mut terms = sharding.terms();
    loop {
        let lease = *terms.borrow_and_update();
        if let Some(lease) = lease
            && let Err(e) = follow_term(&target, &sharding, &controller, clock, lease, &mut terms).await
        {
            tracing::warn!(error = %e, "shards: following the map failed; reading it again");
        }
        tokio::select! {
            _ = terms.changed() => {}
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// One term: read the map, apply it, follow it, until the term changes.
async fn follow_term(
    target: &EtcdTarget,
    sharding: &Arc<Sharding>,
    controller: &Arc<Controller>,
    clock: Clock,
    lease: i64,
    terms: &mut tokio::sync::watch::Receiver<Option<i64>>,
) -> Result<(), String> {
    let mut client = bounded(connect_unbounded(target)).await?;
    let key = map_key(target);
    let got = bounded(client.get(key.clone(), None)).await?;
    let revision = got.header().map_or(0, etcd_client::ResponseHeader::revision);
    if let Some(kv) = got.kvs().first() {
        take(&mut client, target, sharding, controller, clock, lease, kv.value()).await?;
    }
    let options = WatchOptions::new().with_start_revision(revision + 1);
    let mut events = bounded(client.watch(key, Some(options))).await?;
    loop {
        tokio::select! {
            _ = terms.changed() => return Ok(()),
            message = events.message() => match message {
                Ok(Some(r)) => {
                    for e in r.events().iter().filter(|e| e.event_type() == EventType::Put) {
                        if let Some(kv) = e.kv() {
                            take(&mut client, target, sharding, controller, clock, lease, kv.value()).await?;
                        }
                    }
                }
                Ok(None) => return Err("the watch on the map ended".into()),
                Err(e) => return Err(reason(&e)),
            },
        }
    }
}

/// A map read from etcd: refused (logged) when malformed or of another number of shards,
/// else applied and acknowledged under the term's lease.
async fn take(
    client: &mut Client,
    target: &EtcdTarget,
    sharding: &Arc<Sharding>,
    controller: &Arc<Controller>,
    clock: Clock,
    lease: i64,
    value: &[u8],
) -> Result<(), String> {
    let map = match ShardMap::decode(value) {
        Ok(map) if map.shards() == sharding.shards() => map,
        Ok(map) => {
            refuse(sharding, target, &format!("it has {} shards, not {}", map.shards(), sharding.shards()));
            return Ok(());
        }
        Err(why) => {
            refuse(sharding, target, &why);
            return Ok(());
        }
    };
    let epoch = map.epoch();
    let held = sharding.map().filter(|_| sharding.live());
    let me = sharding.me();
    let owned = |m: Option<&ShardMap>, s: u16| m.is_some_and(|m| m.owns(me, s));
    let gained: HashSet<u16> =
        (0..map.shards()).filter(|&s| owned(Some(&map), s) && !owned(held.as_deref(), s)).collect();
    let lost = (0..map.shards()).any(|s| owned(held.as_deref(), s) && !owned(Some(&map), s));
    if !gained.is_empty() {
        restore_progress(client, target, controller, clock, sharding.shards(), &gained).await;
    }
    if sharding.apply(clock.now(), map, controller) {
        tracing::info!(epoch, owned = sharding.owned(), "shards: map applied");
        if lost {
            // The consumption of the groups let go is written before this controller says it
            // let them go: their next owner, given them only then, reads it whole.
            let (c, s) = (controller.clone(), sharding.clone());
            let now = clock.now();
            let flushed = crate::blocking::spawn(move || {
                c.writes().flush(now, crate::clock::wall_ms(), Some(&|root| s.owns_root(root)))
            });
            match flushed.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "shards: the consumption of the groups let go was not written")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "shards: the consumption of the groups let go was not written")
                }
            }
        }
        let key = per_member(target, "applied", sharding.me());
        bounded(client.put(key, epoch.to_string(), Some(PutOptions::new().with_lease(lease)))).await?;
    }
    Ok(())
}

/// Reads the consumption and the resumable ramps stored for the groups of the `gained` shards,
/// which their last owner wrote (when it let them go, or at its last flush if it died), so that
/// this controller counts on from that consumption and resumes those ramps where they were. A
/// read that fails is logged, and the groups count on from what this controller holds: the map
/// is applied all the same.
async fn restore_progress(
    client: &mut Client,
    target: &EtcdTarget,
    controller: &Arc<Controller>,
    clock: Clock,
    shards: u16,
    gained: &HashSet<u16>,
) {
    let since = crate::store::recent_since(crate::clock::wall_ms(), controller.lease());
    let stored = stored_progress(client, target, since).await;
    // The groups of the shards given that had traffic lately are learnt for a lease: their
    // clients may hold grants the last owner gave (all the shards' groups, when etcd does
    // not say).
    let taken: Vec<u16> = gained.iter().copied().collect();
    let learnt = match stored.as_ref().and_then(|s| s.recent.as_ref()) {
        Some(recent) => {
            let roots = controller.ownership().shards_of(recent.iter().map(|g| g.as_str()), shards);
            let given = recent.iter().zip(roots).filter(|(_, s)| s.is_some_and(|s| gained.contains(&s)));
            Relearn::Groups(given.map(|(g, _)| g.clone()).collect())
        }
        None => Relearn::Shards { count: shards, taken },
    };
    controller.relearn(clock.now(), learnt);
    let Some(stored) = stored else { return };
    let mine = |root: &tollgate_model::settings::GroupName| {
        gained.contains(&tollgate_model::shard::shard_of(root.as_str(), shards))
    };
    let meters = controller.ownership().restore_meters(stored.meters, mine);
    let ramps = controller.ownership().resume_ramps(clock.now(), crate::clock::wall_ms(), stored.ramps, mine);
    tracing::debug!(meters, ramps, "shards: the consumption and ramps of the groups given were read");
    let gained = gained.clone();
    place_windows(
        controller,
        Some(Box::new(move |root| gained.contains(&tollgate_model::shard::shard_of(root.as_str(), shards)))),
    )
    .await;
}

/// Which groups a controller has just been given, by their tree's root (`None`: every group).
pub(crate) type Given = Option<Box<dyn Fn(&tollgate_model::settings::GroupName) -> bool + Send>>;

/// Places the quota windows under way of the groups `given` ([`Given`]) on the usage records
/// their last leader or owner left ([`Writes::place_windows`](crate::controller::Writes::place_windows)),
/// off the async workers: this controller's metering did not see those windows begin. A read
/// that fails is logged, and those windows count from what this controller metered.
pub(crate) async fn place_windows(controller: &Arc<Controller>, given: Given) {
    let c = controller.clone();
    let placed = crate::blocking::spawn(move || {
        let given = given.as_ref().map(|g| g as &dyn Fn(&tollgate_model::settings::GroupName) -> bool);
        c.writes().place_windows(crate::clock::wall_ms(), given)
    });
    match placed.await {
        Ok(Ok(placed)) => {
            tracing::debug!(placed, "the quota windows under way were placed on the usage records")
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the quota windows under way count from this controller's metering")
        }
        Err(e) => {
            tracing::warn!(error = %e, "the quota windows under way count from this controller's metering")
        }
    }
}

fn refuse(sharding: &Sharding, target: &EtcdTarget, why: &str) {
    sharding.refused_entries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(key = map_key(target), why, "shards: the map is refused; the last good one stays");
}

/// Moves the map while this controller leads, for as long as the server runs: at once when a
/// membership or an applied epoch changes in etcd (a watch on both), and every
/// [`COORDINATE_EVERY`] besides.
pub async fn coordinate(target: EtcdTarget, cluster: Arc<Cluster>, sharding: Arc<Sharding>) {
    let mut every = tokio::time::interval(COORDINATE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    let mut changes: Option<(etcd_client::WatchStream, etcd_client::WatchStream)> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            changed = changed(&mut changes) => if !changed { changes = None },
        }
        if cluster.role().role != Role::Leader {
            changes = None;
            continue;
        }
        if client.is_none() {
            client = bounded(connect_unbounded(&target)).await.ok();
        }
        let Some(c) = client.as_mut() else { continue };
        if changes.is_none() {
            changes = watch_members(c, &target).await.ok();
        }
        match coordinate_once(c, &target, &sharding).await {
            Ok(()) => last_error = None,
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "shards: cannot move the map; trying again");
                }
                last_error = Some(e);
                (client, changes) = (None, None);
            }
        }
    }
}

/// Watches the memberships and the applied epochs.
async fn watch_members(
    client: &mut Client,
    target: &EtcdTarget,
) -> Result<(etcd_client::WatchStream, etcd_client::WatchStream), String> {
    let members =
        bounded(client.watch(target.key("members/"), Some(WatchOptions::new().with_prefix()))).await?;
    let applied =
        bounded(client.watch(target.key("shards/applied/"), Some(WatchOptions::new().with_prefix()))).await?;
    Ok((members, applied))
}

/// Waits for the next change either watch reports: true, or false once a watch has ended (and
/// for ever while there is none).
async fn changed(changes: &mut Option<(etcd_client::WatchStream, etcd_client::WatchStream)>) -> bool {
    let Some((members, applied)) = changes else { return std::future::pending().await };
    let next = tokio::select! {
        m = members.message() => m,
        a = applied.message() => a,
    };
    matches!(next, Ok(Some(_)))
}

/// The members etcd holds (by the election's keys), each with the epoch it says it applied.
async fn members(
    client: &mut Client,
    target: &EtcdTarget,
    sharding: &Sharding,
) -> Result<BTreeMap<String, u64>, String> {
    let prefix = target.key("members/");
    let got = bounded(client.get(prefix.clone(), Some(GetOptions::new().with_prefix()))).await?;
    let mut live = BTreeMap::new();
    for kv in got.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match std::str::from_utf8(kv.value())
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|v| crate::cluster::role::check_advertise(v).map(|()| v.to_string()))
        {
            Ok(address) if kv.lease() != 0 => {
                live.insert(address, 0);
            }
            Ok(_) => warn_entry(sharding, &key, "it is held under no lease"),
            Err(why) => warn_entry(sharding, &key, &why),
        }
    }
    let prefix = target.key("shards/applied/");
    let got = bounded(client.get(prefix.clone(), Some(GetOptions::new().with_prefix()))).await?;
    let mut applied = std::collections::HashMap::new();
    for kv in got.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match std::str::from_utf8(kv.value()).ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(epoch) => {
                applied.insert(key, epoch);
            }
            None => warn_entry(sharding, &key, "its value is not an epoch"),
        }
    }
    for (address, epoch) in &mut live {
        *epoch = applied.get(&per_member(target, "applied", address)).copied().unwrap_or(0);
    }
    Ok(live)
}

fn warn_entry(sharding: &Sharding, key: &str, why: &str) {
    sharding.refused_entries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(key, why, "shards: an entry is not a member's and is left out");
}

/// One look at the members and the map; the next map written if one is due.
async fn coordinate_once(
    client: &mut Client,
    target: &EtcdTarget,
    sharding: &Sharding,
) -> Result<(), String> {
    let live = members(client, target, sharding).await?;
    let key = map_key(target);
    let got = bounded(client.get(key.clone(), None)).await?;
    let (current, revision) = match got.kvs().first() {
        None => (ShardMap::unowned(sharding.shards()), 0),
        Some(kv) => match ShardMap::decode(kv.value()) {
            Ok(map) if map.shards() == sharding.shards() => (map, kv.mod_revision()),
            Ok(map) => {
                return Err(format!(
                    "{key} holds a map of {} shards and this controller was started with --shards {}",
                    map.shards(),
                    sharding.shards()
                ));
            }
            Err(why) => {
                // Fenced: no shard for anyone, past every epoch a member applied.
                let past = live.values().copied().max().unwrap_or(0);
                tracing::warn!(
                    key,
                    why,
                    "shards: the map is malformed; replacing it with one that gives no shard yet"
                );
                let fenced = ShardMap::unowned(sharding.shards()).at_epoch(past + 1);
                return write(client, &key, kv.mod_revision(), &fenced).await;
            }
        },
    };
    let members: Vec<Member<'_>> = live.iter().map(|(name, &applied)| Member { name, applied }).collect();
    match next_map(&current, &members) {
        Some(next) => {
            tracing::info!(epoch = next.epoch(), moving = next.moving(), "shards: writing the next map");
            write(client, &key, revision, &next).await
        }
        None => Ok(()),
    }
}

/// Writes `map` at `key` only if the map there is still the one read (at `revision`; 0: none).
async fn write(client: &mut Client, key: &str, revision: i64, map: &ShardMap) -> Result<(), String> {
    let unchanged = if revision == 0 {
        Compare::create_revision(key, CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(key, CompareOp::Equal, revision)
    };
    let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(key, map.encode(), None)]);
    bounded(client.txn(txn)).await?;
    Ok(())
}

/// At every tick with a capacity configured: writes this owner's claims under its lease, reads
/// every owner's, and takes its part of the capacity.
pub async fn share_capacity(target: EtcdTarget, sharding: Arc<Sharding>, controller: Arc<Controller>) {
    let mut every = tokio::time::interval(controller.pacer().tick_period());
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    // The claims this controller last wrote, and under which term's lease.
    let mut written: Option<(i64, Vec<tollgate_model::allocate::Claim>)> = None;
    loop {
        every.tick().await;
        if controller.admin().node().capacity.is_none() {
            continue;
        }
        let Some(lease) = *sharding.terms().borrow() else {
            // Between terms nothing is granted; a new term starts from no part, not from the
            // last (another owner may have taken it meanwhile), until its first split.
            controller.ownership().set_capacity_part(Some(0.0));
            continue;
        };
        if client.is_none() {
            client = bounded(connect(&target)).await.ok();
        }
        let Some(c) = client.as_mut() else { continue };
        if written.as_ref().is_some_and(|(l, _)| *l != lease) {
            written = None;
        }
        if let Err(e) = share_once(c, &target, &sharding, &controller, lease, &mut written).await {
            tracing::debug!(error = %e, "shards: the capacity's split is not renewed this tick");
            client = None;
        }
    }
}

async fn share_once(
    client: &mut Client,
    target: &EtcdTarget,
    sharding: &Sharding,
    controller: &Controller,
    lease: i64,
    written: &mut Option<(i64, Vec<tollgate_model::allocate::Claim>)>,
) -> Result<(), String> {
    let mine = controller.ownership().capacity_claims();
    let key = per_member(target, "claims", sharding.me());
    bounded(client.put(key.clone(), encode_claims(&mine), Some(PutOptions::new().with_lease(lease)))).await?;
    let before = written.replace((lease, mine.clone())).map(|(_, c)| c);
    let prefix = target.key("shards/claims/");
    let got = bounded(client.get(prefix, Some(GetOptions::new().with_prefix()))).await?;
    let live = members(client, target, sharding).await?;
    let Some(capacity) = controller.admin().node().capacity else { return Ok(()) };
    let mut owners = Vec::new();
    let mut me = None;
    let mut claimed = std::collections::HashSet::new();
    for kv in got.kvs() {
        let claims = match decode_claims(kv.value()) {
            Ok(c) => c,
            Err(why) => {
                warn_entry(sharding, &String::from_utf8_lossy(kv.key()), &why);
                continue;
            }
        };
        if kv.key() == key.as_bytes() {
            me = Some(owners.len());
        }
        claimed.insert(kv.key().to_vec());
        owners.push(claims);
    }
    // A live member whose claims are not there (its term just began, or its claims went with
    // its last lease) may still grant its last part: it is held an even share, so the parts
    // never add up to more than the capacity for want of its claims.
    let even = capacity / live.len().max(1) as f64;
    for address in live.keys() {
        if !claimed.contains(per_member(target, "claims", address).as_bytes()) {
            owners.push(vec![tollgate_model::allocate::Claim {
                reserved: even,
                ceiling: even,
                demand: even,
                priority: tollgate_model::settings::Priority::HIGH,
                weight: 1.0,
            }]);
        }
    }
    if let Some(at) = me {
        // The others read this controller's claims from this tick or the last, as their ticks
        // fall: its part is taken with the lesser of the two ([`lesser_claims`]), and in a
        // term's first split, when the others may still hold it at an even share, no more
        // than that share.
        let part = match before {
            Some(before) => {
                owners[at] = lesser_claims(&before, &mine);
                split_capacity(capacity, &owners).get(at).copied()
            }
            None => split_capacity(capacity, &owners).get(at).map(|p| p.min(even)),
        };
        controller.ownership().set_capacity_part(part);
    }
    Ok(())
}
