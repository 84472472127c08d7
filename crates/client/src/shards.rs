//! Groups sharded over controllers, a client's side: each group's part of an exchange goes
//! straight to the controller that grants for it.
//!
//! With `tollgate server --shards`, every controller answers any exchange, splitting it by
//! each group's owner and passing the other parts on. A client that holds the shard map saves
//! those hops: [`Routes`] keeps the map the controllers last sent (an exchange carries the
//! epoch it holds, and a controller that applied a newer one answers with it) and each
//! group's shard (every grant a sharded controller gives names it). An exchange whose groups
//! all have a known owner is split here and each part sent to its owner at once; one naming a
//! group whose shard is not known yet (a new group, or a shard that was moving) goes whole to
//! the controller the client talks to, which splits it.
//!
//! **Numbering.** An owner takes a number not above the last it saw from a client as that
//! client's restart, so no owner may see two calls of one number. Each exchange numbered `n`
//! by the [`Driver`](crate::Driver) goes out as `2n`, every part to a different owner; a part
//! whose owner did not answer is sent again, through the controller the client talks to, as
//! `2n + 1`, and the map is dropped until a controller sends the current one.
//!
//! **Bounds.** A map names at most [`MAX_MEMBERS`] controllers and [`MAX_SHARDS`] shards (a
//! map past them is ignored, and the parts go through the controller the client talks to);
//! at most [`ROUTED_GROUPS_MAX`] groups' shards are kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::shard::{MAX_MEMBERS, MAX_SHARDS, ShardMap};
use tollgate_proto::v1;
use tollgate_proto::v1::admission_client::AdmissionClient;

use crate::access::{Access, Rpc};
use crate::error::ExchangeError;

/// The most groups whose shard a client keeps; past it the table starts again.
pub const ROUTED_GROUPS_MAX: usize = 100_000;
/// The exchanges sent whole after an owner first fails to answer its part.
pub const PAUSE_MIN: u32 = 8;
/// The most exchanges sent whole after owners keep failing.
pub const PAUSE_MAX: u32 = 1024;

/// The shard map a client holds, the shard of each of its groups, and its channels to the
/// owners. Shared by every driver of one process that talks to the same controllers.
pub struct Routes {
    access: Access,
    connect_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    map: Option<Arc<ShardMap>>,
    /// Exchanges left to send whole to the controller talked to, after an owner failed.
    paused: u32,
    /// The pause the next owner's failure sets.
    next_pause: u32,
    shards: HashMap<String, u16>,
    owners: HashMap<String, AdmissionClient<Rpc>>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Routes")
            .field("epoch", &s.map.as_ref().map(|m| m.epoch()))
            .field("groups", &s.shards.len())
            .finish()
    }
}

/// A shard map as an exchange's answer carries it, refused with the reason when malformed.
pub fn map_of(message: &v1::ShardMap) -> Result<ShardMap, String> {
    let shards = usize::try_from(message.shards).unwrap_or(usize::MAX);
    if shards == 0 || shards > usize::from(MAX_SHARDS) || message.owners.len() != shards {
        return Err(format!(
            "shards must be 1 to {MAX_SHARDS} with an owner for each, not {} with {}",
            message.shards,
            message.owners.len()
        ));
    }
    if message.members.len() > MAX_MEMBERS {
        return Err(format!("members must name at most {MAX_MEMBERS}, not {}", message.members.len()));
    }
    let owners = message
        .owners
        .iter()
        .map(|&o| match o {
            0 => Ok(None),
            i => u16::try_from(i - 1).map(Some).map_err(|_| format!("owner {i} names no member")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    ShardMap::from_parts(message.epoch, message.members.clone(), owners)
}

/// The message for `map`, as a controller answers with it.
pub fn map_message(map: &ShardMap) -> v1::ShardMap {
    v1::ShardMap {
        epoch: map.epoch(),
        shards: u32::from(map.shards()),
        members: map.members().to_vec(),
        owners: (0..map.shards()).map(|s| map.owner_index(s).map_or(0, |i| u32::from(i) + 1)).collect(),
    }
}

impl Routes {
    /// Routes that open their channels to the owners with `access`, each connecting within
    /// `connect_timeout`; holding no map until a controller sends one.
    pub fn new(access: Access, connect_timeout: Duration) -> Arc<Routes> {
        Arc::new(Routes { access, connect_timeout, state: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch of the map held (0: none).
    pub fn epoch(&self) -> u64 {
        self.lock().map.as_ref().map_or(0, |m| m.epoch())
    }

    /// The owner's address for `group` by the map held, if its shard is known and owned.
    pub fn owner(&self, group: &str) -> Option<String> {
        let s = self.lock();
        let shard = *s.shards.get(group)?;
        s.map.as_ref()?.owner(shard).map(str::to_string)
    }

    /// Takes what `answer` tells: a newer map (a malformed one is ignored, with a log line)
    /// and each granted group's shard.
    pub fn learn(&self, answer: &v1::ExchangeResponse) {
        let mut s = self.lock();
        if let Some(m) = &answer.shard_map
            && s.map.as_ref().is_none_or(|held| held.epoch() < m.epoch)
        {
            match map_of(m) {
                Ok(map) => {
                    // Channels to controllers the map no longer names are closed.
                    s.owners.retain(|a, _| map.members().contains(a));
                    s.map = Some(Arc::new(map));
                }
                Err(e) => tracing::debug!(epoch = m.epoch, "tollgate: a shard map ignored: {e}"),
            }
        }
        for g in &answer.grants {
            let Some(shard) = g.shard.and_then(|s| u16::try_from(s).ok()) else { continue };
            if s.shards.len() >= ROUTED_GROUPS_MAX && !s.shards.contains_key(&g.group) {
                s.shards.clear();
            }
            s.shards.insert(g.group.clone(), shard);
        }
    }

    /// Drops the map, so that the next answer brings the current one, and sends the next
    /// exchanges whole to the controller talked to: 8 after an owner first fails, twice as
    /// many after each failure that follows (at most [`PAUSE_MAX`]), until a part reaches its
    /// owner again. A client that cannot reach the owners (their advertised addresses are not
    /// its to reach) thus costs them one failed call in a while.
    pub fn forget_map(&self) {
        let mut s = self.lock();
        s.map = None;
        s.paused = s.next_pause.max(PAUSE_MIN);
        s.next_pause = s.paused.saturating_mul(2).min(PAUSE_MAX);
    }

    /// `request`'s parts by owner, each with the channel to it; `None` when some group's owner
    /// is not known (the request then goes whole to the controller the client talks to).
    fn split(
        &self,
        request: &v1::ExchangeRequest,
    ) -> Option<Vec<(String, AdmissionClient<Rpc>, v1::ExchangeRequest)>> {
        let mut s = self.lock();
        if s.paused > 0 {
            s.paused -= 1;
            return None;
        }
        let map = s.map.clone()?;
        let mut parts: Vec<(String, v1::ExchangeRequest)> = Vec::new();
        for g in &request.groups {
            let shard = *s.shards.get(&g.group)?;
            let owner = map.owner(shard)?;
            match parts.iter_mut().find(|(o, _)| o == owner) {
                Some((_, part)) => part.groups.push(g.clone()),
                None => parts.push((
                    owner.to_string(),
                    v1::ExchangeRequest { groups: vec![g.clone()], ..part_of(request) },
                )),
            }
        }
        let mut out = Vec::with_capacity(parts.len());
        for (owner, part) in parts {
            let client = match s.owners.get(&owner) {
                Some(c) => c.clone(),
                None => {
                    let rpc = self.access.channel(&owner, self.connect_timeout).ok()?;
                    let client = AdmissionClient::new(rpc);
                    s.owners.insert(owner.clone(), client.clone());
                    client
                }
            };
            out.push((owner, client, part));
        }
        Some(out)
    }
}

/// `request` with no groups: its client's id, number, period, map epoch and whether it
/// takes allotments.
fn part_of(request: &v1::ExchangeRequest) -> v1::ExchangeRequest {
    v1::ExchangeRequest {
        client_id: request.client_id.clone(),
        sequence: request.sequence,
        groups: Vec::new(),
        target_request_period_ms: request.target_request_period_ms,
        shard_map_epoch: request.shard_map_epoch,
        takes_allotments: request.takes_allotments,
    }
}

/// One answer from the owners' answers to the parts of one exchange: every grant; the
/// earliest next exchange and next tick (a tick due somewhere is due); unthrottled work
/// allowed only if every owner allows it; the newest shard map any of them sent.
pub fn join_answers(answers: impl IntoIterator<Item = v1::ExchangeResponse>) -> v1::ExchangeResponse {
    let mut joined: Option<v1::ExchangeResponse> = None;
    for a in answers {
        match &mut joined {
            None => joined = Some(a),
            Some(j) => {
                j.grants.extend(a.grants);
                j.next_exchange_ms = j.next_exchange_ms.min(a.next_exchange_ms);
                j.next_tick_ms = j.next_tick_ms.min(a.next_tick_ms);
                j.unthrottled_allowed &= a.unthrottled_allowed;
                if a.shard_map.as_ref().map(|m| m.epoch) > j.shard_map.as_ref().map(|m| m.epoch) {
                    j.shard_map = a.shard_map;
                }
            }
        }
    }
    joined.unwrap_or_default()
}

/// One exchange over `client` within `timeout`.
pub(crate) async fn call(
    mut client: AdmissionClient<Rpc>,
    request: v1::ExchangeRequest,
    timeout: Duration,
) -> Result<v1::ExchangeResponse, ExchangeError> {
    match tokio::time::timeout(timeout, client.exchange(request)).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(ExchangeError::of(&status)),
        Err(_) => Err(ExchangeError::Timeout(timeout)),
    }
}

/// What a routed exchange came to.
#[derive(Debug)]
pub struct Routed {
    /// The joined answer of every part answered, or the error when none was.
    pub answer: Result<v1::ExchangeResponse, ExchangeError>,
    /// Whether the controller the client talks to failed (the client then moves to the next).
    pub home_failed: bool,
}

/// Sends `request` (numbered `n` by its driver) by `routes`: split by owner when every group's
/// owner is known, else whole to `home`. See the [module documentation](self).
pub async fn exchange(
    routes: &Routes,
    home: &AdmissionClient<Rpc>,
    mut request: v1::ExchangeRequest,
    timeout: Duration,
) -> Routed {
    request.sequence = request.sequence.saturating_mul(2);
    request.shard_map_epoch = Some(routes.epoch());
    let parts = if request.groups.is_empty() { None } else { routes.split(&request) };
    let Some(parts) = parts else {
        let answer = call(home.clone(), request, timeout).await;
        if let Ok(a) = &answer {
            routes.learn(a);
        }
        let home_failed = answer.is_err();
        return Routed { answer, home_failed };
    };
    let calls = parts.into_iter().map(|(owner, client, part)| async move {
        let groups = part.groups.clone();
        (owner, groups, call(client, part, timeout).await)
    });
    let mut answers = Vec::new();
    let (mut again, mut error) = (Vec::new(), None);
    for (owner, groups, answer) in futures_util::future::join_all(calls).await {
        match answer {
            Ok(a) => answers.push(a),
            Err(e) => {
                tracing::debug!(owner, "tollgate: an owner did not answer its part: {e}");
                again.extend(groups);
                error = Some(e);
            }
        }
    }
    let mut home_failed = false;
    if again.is_empty() {
        routes.lock().next_pause = 0;
    } else {
        routes.forget_map();
        let retry = v1::ExchangeRequest {
            sequence: request.sequence + 1,
            groups: again,
            shard_map_epoch: Some(0),
            ..part_of(&request)
        };
        match call(home.clone(), retry, timeout).await {
            Ok(a) => answers.push(a),
            Err(e) => {
                home_failed = true;
                error = Some(e);
            }
        }
    }
    for a in &answers {
        routes.learn(a);
    }
    let answer = match (answers.is_empty(), error) {
        (true, Some(e)) => Err(e),
        _ => Ok(join_answers(answers)),
    };
    Routed { answer, home_failed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_goes_to_its_message_and_back_and_a_malformed_one_is_refused() {
        let map = ShardMap::from_parts(
            7,
            vec!["http://a:1".into(), "http://b:2".into()],
            vec![Some(1), None, Some(0)],
        )
        .unwrap();
        let message = map_message(&map);
        assert_eq!(message.owners, [2, 0, 1]);
        assert_eq!(map_of(&message).unwrap(), map);
        let bad = v1::ShardMap { owners: vec![3, 0, 1], ..message.clone() };
        assert!(map_of(&bad).unwrap_err().contains("names no member"), "{:?}", map_of(&bad));
        let short = v1::ShardMap { shards: 4, ..message };
        assert!(map_of(&short).unwrap_err().contains("an owner for each"));
    }

    #[tokio::test]
    async fn routes_learn_the_newest_map_and_each_groups_shard_and_split_by_owner() {
        let routes = Routes::new(Access::default(), Duration::from_secs(1));
        let map = |epoch, owners: Vec<Option<u16>>| {
            map_message(
                &ShardMap::from_parts(
                    epoch,
                    vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
                    owners,
                )
                .unwrap(),
            )
        };
        let grant = |g: &str, shard| v1::Grant { group: g.into(), shard: Some(shard), ..Default::default() };
        let usage = |g: &str| v1::GroupUsage { group: g.into(), ..Default::default() };
        let request = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 4,
            groups: vec![usage("a"), usage("b"), usage("c")],
            ..Default::default()
        };
        // Nothing known yet: the request goes whole to the controller talked to.
        assert!(routes.split(&request).is_none());
        routes.learn(&v1::ExchangeResponse {
            grants: vec![grant("a", 0), grant("b", 1), grant("c", 0)],
            shard_map: Some(map(3, vec![Some(1), Some(0)])),
            ..Default::default()
        });
        assert_eq!(routes.epoch(), 3);
        let parts = routes.split(&request).expect("every owner is known");
        let names: Vec<(String, Vec<String>)> = parts
            .iter()
            .map(|(o, _, p)| (o.clone(), p.groups.iter().map(|g| g.group.clone()).collect()))
            .collect();
        assert_eq!(
            names,
            [
                ("http://127.0.0.1:2".to_string(), vec!["a".to_string(), "c".to_string()]),
                ("http://127.0.0.1:1".to_string(), vec!["b".to_string()]),
            ]
        );
        assert!(parts.iter().all(|(_, _, p)| p.sequence == 4 && p.client_id == "c"));
        // An older map changes nothing; a shard with no owner sends the request whole.
        routes
            .learn(&v1::ExchangeResponse { shard_map: Some(map(2, vec![None, None])), ..Default::default() });
        assert_eq!(routes.epoch(), 3);
        routes.learn(&v1::ExchangeResponse {
            shard_map: Some(map(4, vec![None, Some(0)])),
            ..Default::default()
        });
        assert!(routes.split(&request).is_none());
        routes.forget_map();
        assert_eq!(routes.epoch(), 0);
    }
}
