//! Groups sharded over controllers, the serving side: a client's exchange names groups of
//! many shards, so a controller splits it by each group's owner, passes each part to its owner
//! (under the client's own id and number, so each owner sees the client as a direct one
//! would), and joins the answers into one. The shard map itself, its moves and the split of
//! the capacity are [`tollgate_model::shard`]'s; etcd carries them (the module `shard_map`).
//!
//! A controller grants for a shard only while its map (the last it applied) gives it the shard
//! and its membership lease holds ([`Sharding::set_term`]): a term that ends, or a map that
//! takes a shard away, stops it at once, and the groups it no longer owns are forgotten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_limiter::access::Rpc;
use tollgate_model::allocate::Claim;
use tollgate_model::settings::Priority;
use tollgate_model::shard::{ShardMap, shard_of};
use tollgate_model::time::Nanos;
use tollgate_proto::v1;
use tonic::Status;

use crate::controller::Controller;

/// This controller's part in the sharding: its name, the map it applied, whether its
/// membership holds, and its channels to the other owners.
pub struct Sharding {
    me: String,
    shards: u16,
    view: Mutex<View>,
    /// The membership's lease in etcd while a term is under way.
    term: tokio::sync::watch::Sender<Option<i64>>,
    channels: Mutex<HashMap<String, Rpc>>,
    /// Maps applied.
    pub maps_applied: AtomicU64,
    /// Groups forgotten because their shard moved away.
    pub groups_moved_away: AtomicU64,
    /// Exchanges' parts passed on to other owners, and those not answered.
    pub parts_forwarded: AtomicU64,
    /// Of those, the ones whose owner did not answer.
    pub parts_unanswered: AtomicU64,
    /// The malformed map or membership entries seen (each logged).
    pub refused_entries: AtomicU64,
}

#[derive(Clone)]
struct View {
    map: Option<Arc<ShardMap>>,
    live: bool,
}

/// Where a group's part of an exchange goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This controller grants for it.
    Here,
    /// Another controller, at this address.
    At(String),
}

impl Sharding {
    /// This controller (`me`, its advertised address) among controllers sharding `shards`
    /// shards: owning nothing until a map is applied under a live membership.
    pub fn new(me: String, shards: u16) -> Sharding {
        Sharding {
            me,
            shards,
            view: Mutex::new(View { map: None, live: false }),
            term: tokio::sync::watch::Sender::new(None),
            channels: Mutex::default(),
            maps_applied: AtomicU64::new(0),
            groups_moved_away: AtomicU64::new(0),
            parts_forwarded: AtomicU64::new(0),
            parts_unanswered: AtomicU64::new(0),
            refused_entries: AtomicU64::new(0),
        }
    }

    /// This controller's name in the map.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The number of shards.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    fn view(&self) -> View {
        self.view.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The map applied last, if any.
    pub fn map(&self) -> Option<Arc<ShardMap>> {
        self.view().map
    }

    /// Whether this controller's membership holds (a term of the election is under way).
    pub fn live(&self) -> bool {
        self.view().live
    }

    /// Whether this controller grants for the tree whose root is `root` now.
    pub fn owns_root(&self, root: &tollgate_model::settings::GroupName) -> bool {
        let v = self.view();
        v.live && v.map.is_some_and(|m| m.owns(&self.me, shard_of(root.as_str(), self.shards)))
    }

    /// The shards this controller grants for now.
    pub fn owned(&self) -> usize {
        let v = self.view();
        match (&v.map, v.live) {
            (Some(map), true) => map.owned_by(&self.me).len(),
            _ => 0,
        }
    }

    /// The membership's term begins under etcd lease `Some(lease)`, or ends (`None`). Either
    /// way the map applied so far no longer counts: a term that ended may have let another
    /// controller take this one's shards, so nothing is granted until a map read in the new
    /// term is applied.
    pub fn set_term(&self, lease: Option<i64>) {
        let mut v = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        *v = View { map: None, live: lease.is_some() };
        drop(v);
        self.term.send_replace(lease);
    }

    /// The membership's lease as terms begin and end.
    pub fn terms(&self) -> tokio::sync::watch::Receiver<Option<i64>> {
        self.term.subscribe()
    }

    /// Applies `map` at `now`: the groups `controller` computes whose shard it no longer gives
    /// this one are forgotten first, then the map counts. An older map than the one applied is
    /// ignored. Returns whether it was applied.
    pub fn apply(&self, now: Nanos, map: ShardMap, controller: &Controller) -> bool {
        if map.shards() != self.shards {
            return false;
        }
        if self.view().map.is_some_and(|m| m.epoch() >= map.epoch()) {
            return false;
        }
        let me = self.me.as_str();
        let shards = map.shards();
        let gone = controller
            .ownership()
            .forget_groups(now, |_, root| !map.owns(me, shard_of(root.as_str(), shards)));
        self.groups_moved_away.fetch_add(gone as u64, Ordering::Relaxed);
        self.maps_applied.fetch_add(1, Ordering::Relaxed);
        // A capacity configured before the next split starts at an even share among the
        // members that own shards.
        controller.ownership().share_capacity_among(map.members().len());
        let mut v = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        // A shard claimed: each map applied is newer than the last, so no shard is handed back
        // to an owner by an older map.
        assert!(v.map.as_ref().is_none_or(|m| m.epoch() < map.epoch()), "shard maps applied out of order");
        v.map = Some(Arc::new(map));
        true
    }

    /// Where each of `groups`' parts goes by the map applied, with its shard: `None` for a
    /// group whose shard has no owner now (or while no map is applied, or this controller's
    /// membership does not hold). The engine is locked once for them all.
    pub fn route(&self, controller: &Controller, groups: &[&str]) -> Vec<Option<(Owner, u16)>> {
        let v = self.view();
        let Some(map) = v.map.as_ref() else { return vec![None; groups.len()] };
        controller
            .ownership()
            .shards_of(groups.iter().copied(), self.shards)
            .into_iter()
            .map(|shard| {
                let shard = shard?;
                let owner = map.owner(shard)?;
                debug_assert!(shard < self.shards, "shard {shard} of {}", self.shards);
                let owner = if owner == self.me {
                    // Routed here: the map applied gives this controller the shard.
                    debug_assert!(map.owns(&self.me, shard));
                    v.live.then_some(Owner::Here)?
                } else {
                    Owner::At(owner.to_string())
                };
                Some((owner, shard))
            })
            .collect()
    }

    /// The map applied, as an exchange's answer carries it to a client holding an older one
    /// (`held`: its epoch); `None` when the client's is as new.
    pub fn map_for(&self, held: u64) -> Option<v1::ShardMap> {
        let map = self.map()?;
        (map.epoch() > held).then(|| tollgate_limiter::shards::map_message(&map))
    }

    /// The other members the map names (backends' reports reach every one).
    pub fn others(&self) -> Vec<String> {
        self.map().map_or_else(Vec::new, |m| m.members().iter().filter(|m| **m != self.me).cloned().collect())
    }

    /// The channel to `owner`, made with `access` (connecting within `timeout`) on first use.
    pub fn channel(
        &self,
        owner: &str,
        access: &tollgate_limiter::access::Access,
        timeout: std::time::Duration,
    ) -> Result<Rpc, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rpc) = channels.get(owner) {
            return Ok(rpc.clone());
        }
        let rpc = access
            .channel(owner, timeout)
            .map_err(|e| Status::unavailable(format!("cannot reach the owner {owner}: {e}")))?;
        // Bounded by the members a map may name.
        if channels.len() >= tollgate_model::shard::MAX_MEMBERS {
            channels.clear();
        }
        channels.insert(owner.to_string(), rpc.clone());
        Ok(rpc)
    }
}

/// The most priorities a summary of claims holds (one per level).
const CLAIMS_MAX: usize = 16;

/// Claims as etcd holds them: JSON, one object per priority.
pub fn encode_claims(claims: &[Claim]) -> String {
    let list: Vec<serde_json::Value> = claims
        .iter()
        .map(|c| {
            serde_json::json!({
                "priority": c.priority.level(),
                "reserved": c.reserved,
                "demand": c.demand,
                "ceiling": c.ceiling,
                "weight": c.weight,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// Reads claims another controller wrote, refusing malformed ones with the reason.
pub fn decode_claims(bytes: &[u8]) -> Result<Vec<Claim>, String> {
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| format!("not a list of claims: {e}"))?;
    if list.len() > CLAIMS_MAX {
        return Err(format!("at most {CLAIMS_MAX} claims, not {}", list.len()));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            let num = |k: &str| {
                v.get(k)
                    .and_then(serde_json::Value::as_f64)
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("[{i}].{k} must be a number of at least 0"))
            };
            let level = v.get("priority").and_then(serde_json::Value::as_u64).unwrap_or(0);
            let priority = u8::try_from(level)
                .ok()
                .and_then(|l| Priority::new(l).ok())
                .ok_or_else(|| format!("[{i}].priority must be 1 to 16"))?;
            Ok(Claim {
                priority,
                reserved: num("reserved")?,
                demand: num("demand")?,
                ceiling: num("ceiling")?,
                weight: num("weight")?,
            })
        })
        .collect()
}

/// The parts of `request` by owner (`owner(i)` for its `i`th group), in the order each owner first appears, each with the
/// client's id, number and period; groups whose shard has no owner now (it is moving) are
/// left out, and counted in the second value: their clients keep the grants they hold until
/// the next exchange.
pub fn split_exchange(
    request: &v1::ExchangeRequest,
    mut owner: impl FnMut(usize) -> Option<usize>,
) -> (Vec<(usize, v1::ExchangeRequest)>, usize) {
    let mut parts: Vec<(usize, v1::ExchangeRequest)> = Vec::new();
    let mut unowned = 0;
    for (i, g) in request.groups.iter().enumerate() {
        let Some(o) = owner(i) else {
            unowned += 1;
            continue;
        };
        let at = match parts.iter().position(|(p, _)| *p == o) {
            Some(at) => at,
            None => {
                parts.push((
                    o,
                    v1::ExchangeRequest {
                        client_id: request.client_id.clone(),
                        sequence: request.sequence,
                        groups: Vec::new(),
                        target_request_period_ms: request.target_request_period_ms,
                        shard_map_epoch: None,
                        takes_allotments: request.takes_allotments,
                    },
                ));
                parts.len() - 1
            }
        };
        parts[at].1.groups.push(g.clone());
    }
    (parts, unowned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limiter::shards::join_answers;

    fn usage(group: &str) -> v1::GroupUsage {
        v1::GroupUsage { group: group.into(), demand: 1.0, ..Default::default() }
    }

    #[test]
    fn an_exchange_is_split_by_owner_and_the_answers_joined() {
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 7,
            groups: vec![usage("a1"), usage("b1"), usage("a2"), usage("moving")],
            target_request_period_ms: 500,
            shard_map_epoch: None,
            takes_allotments: true,
        };
        let (parts, unowned) = split_exchange(&req, |i| match &req.groups[i].group[..1] {
            "a" => Some(3),
            "b" => Some(1),
            _ => None,
        });
        assert_eq!(unowned, 1);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0, 3);
        assert_eq!(parts[0].1.groups.iter().map(|g| g.group.as_str()).collect::<Vec<_>>(), ["a1", "a2"]);
        assert_eq!((parts[1].1.sequence, parts[1].1.client_id.as_str()), (7, "c"));
        let grant = |g: &str| v1::Grant { group: g.into(), rate: 1.0, ..Default::default() };
        let joined = join_answers([
            v1::ExchangeResponse {
                grants: vec![grant("a1"), grant("a2")],
                next_exchange_ms: 1000,
                next_tick_ms: 300,
                unthrottled_allowed: true,
                shard_map: None,
            },
            v1::ExchangeResponse {
                grants: vec![grant("b1")],
                next_exchange_ms: 800,
                next_tick_ms: 0,
                unthrottled_allowed: false,
                shard_map: None,
            },
        ]);
        assert_eq!(joined.grants.len(), 3);
        assert_eq!(
            (joined.next_exchange_ms, joined.next_tick_ms, joined.unthrottled_allowed),
            (800, 0, false)
        );
    }
}
