//! Groups sharded over controllers: which shard a group is in, the shard map that says which
//! controller owns each shard, how the map moves when controllers come and go, and how a
//! node's capacity is split among the owners.
//!
//! **Shards.** A group belongs to the shard of its tree's root ([`shard_of`]), so a parent and
//! its children are always computed together. The number of shards is fixed for a cluster.
//!
//! **The map.** A [`ShardMap`] names, for each shard, the member that owns it, or none while
//! the shard moves. Only its owner computes a shard's groups and grants for them; the other
//! controllers lease from it as clients do. Each map has an epoch, one more than the last.
//!
//! **Moves** ([`next_map`]). Where the map and the balanced assignment differ, a shard whose
//! owner is alive is first taken from it (a map with no owner for it), and given to its new
//! owner only once every live member says it has applied that map, so the old owner has
//! stopped granting before the new one starts. A shard whose owner is gone (its lease ran out,
//! and with it the owner's right to grant) goes to its new owner at once. The new owner learns
//! what clients hold before granting more, as a controller that starts does.
//!
//! **Capacity.** A node's capacity is shared among groups by priority and weight; with the
//! groups spread over owners, each owner summarises what its groups claim, per priority
//! ([`Engine::capacity_claims`](crate::engine::Engine::capacity_claims)), and [`split_capacity`]
//! shares the capacity among the owners by those summaries with the same allocation, so the
//! owners' parts add up to the capacity.

use serde::{Deserialize, Serialize};

use crate::allocate::{Claim, allocate};

/// The number of shards a cluster starts with.
pub const DEFAULT_SHARDS: u16 = 256;
/// The most shards a map may have.
pub const MAX_SHARDS: u16 = 4096;
/// The most members a map may name.
pub const MAX_MEMBERS: usize = 256;
/// The longest member name, in bytes.
pub const MAX_MEMBER_LEN: usize = 255;
/// The version of the map's encoding this code reads and writes.
pub const MAP_VERSION: u32 = 1;

/// The shard of a tree whose root is `root`, among `shards` (FNV-1a, so every controller and
/// every version agrees).
///
/// ```
/// use tollgate_model::shard::shard_of;
/// assert_eq!(shard_of("acme", 256), shard_of("acme", 256));
/// assert!(shard_of("acme", 16) < 16);
/// ```
pub fn shard_of(root: &str, shards: u16) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in root.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(shards.max(1))) as u16
}

/// Which member owns each shard. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    epoch: u64,
    members: Vec<String>,
    /// Per shard, an index into `members`; `None` while the shard moves.
    owners: Vec<Option<u16>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    version: u32,
    epoch: u64,
    members: Vec<String>,
    owners: Vec<Option<u16>>,
}

impl ShardMap {
    /// A map of `shards` shards that nobody owns yet, at epoch 0.
    pub fn unowned(shards: u16) -> ShardMap {
        let shards = shards.clamp(1, MAX_SHARDS);
        ShardMap { epoch: 0, members: Vec::new(), owners: vec![None; usize::from(shards)] }
    }

    /// The same map at `epoch` (a map that replaces a malformed one is written past every
    /// epoch the members applied).
    pub fn at_epoch(mut self, epoch: u64) -> ShardMap {
        self.epoch = epoch;
        self
    }

    /// The map's epoch: each map written is one more than the last.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The number of shards.
    pub fn shards(&self) -> u16 {
        self.owners.len() as u16
    }

    /// The members the map names.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The owner of `shard`, if it has one now.
    pub fn owner(&self, shard: u16) -> Option<&str> {
        let i = (*self.owners.get(usize::from(shard))?)?;
        self.members.get(usize::from(i)).map(String::as_str)
    }

    /// The owner of the tree whose root is `root`.
    pub fn owner_of(&self, root: &str) -> Option<&str> {
        self.owner(shard_of(root, self.shards()))
    }

    /// Whether `member` owns `shard`.
    pub fn owns(&self, member: &str, shard: u16) -> bool {
        self.owner(shard) == Some(member)
    }

    /// The shards `member` owns, in order.
    pub fn owned_by(&self, member: &str) -> Vec<u16> {
        (0..self.shards()).filter(|&s| self.owns(member, s)).collect()
    }

    /// How many shards have no owner now.
    pub fn moving(&self) -> usize {
        self.owners.iter().filter(|o| o.is_none()).count()
    }

    /// The map as stored: JSON with its encoding's version.
    pub fn encode(&self) -> String {
        let wire = Wire {
            version: MAP_VERSION,
            epoch: self.epoch,
            members: self.members.clone(),
            owners: self.owners.clone(),
        };
        serde_json::to_string(&wire).expect("a map encodes")
    }

    /// Reads a stored map, refusing one that is malformed or of another version, with the
    /// reason.
    pub fn decode(bytes: &[u8]) -> Result<ShardMap, String> {
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| format!("not a shard map: {e}"))?;
        if wire.version != MAP_VERSION {
            return Err(format!("version {} is unknown (this controller reads {MAP_VERSION})", wire.version));
        }
        ShardMap::from_parts(wire.epoch, wire.members, wire.owners)
    }

    /// A map from its parts: its epoch, its members, and each shard's owner as an index into
    /// `members` (`None` while the shard moves); refused with the reason when a part is out of
    /// its bounds or names no member.
    pub fn from_parts(
        epoch: u64,
        members: Vec<String>,
        owners: Vec<Option<u16>>,
    ) -> Result<ShardMap, String> {
        let shards = owners.len();
        if shards == 0 || shards > usize::from(MAX_SHARDS) {
            return Err(format!("owners must list 1 to {MAX_SHARDS} shards, not {shards}"));
        }
        if members.len() > MAX_MEMBERS {
            return Err(format!("members must name at most {MAX_MEMBERS}, not {}", members.len()));
        }
        for (i, m) in members.iter().enumerate() {
            if m.is_empty() || m.len() > MAX_MEMBER_LEN || m.chars().any(char::is_control) {
                return Err(format!("members[{i}] must be 1 to {MAX_MEMBER_LEN} bytes of printable text"));
            }
            if members[..i].contains(m) {
                return Err(format!("members[{i}] {m:?} is named twice"));
            }
        }
        if let Some(s) = owners.iter().position(|o| o.is_some_and(|i| usize::from(i) >= members.len())) {
            return Err(format!("owners[{s}] names no member (there are {})", members.len()));
        }
        Ok(ShardMap { epoch, members, owners })
    }

    /// The index into [`members`](Self::members) of `shard`'s owner, if it has one now.
    pub fn owner_index(&self, shard: u16) -> Option<u16> {
        *self.owners.get(usize::from(shard))?
    }

    fn from_owners(epoch: u64, owners: &[Option<&str>]) -> ShardMap {
        let mut members: Vec<String> = owners.iter().flatten().map(|m| m.to_string()).collect();
        members.sort();
        members.dedup();
        let owners = owners
            .iter()
            .map(|o| o.map(|m| members.binary_search_by(|x| x.as_str().cmp(m)).expect("listed") as u16))
            .collect();
        ShardMap { epoch, members, owners }
    }
}

/// A live member as the coordinator sees it: its name, and the epoch of the last map it says
/// it has applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// Its name (a controller's advertised address).
    pub name: &'a str,
    /// The last map it applied.
    pub applied: u64,
}

/// A member's weight for a shard: the highest weight among the members with room gets it
/// (rendezvous hashing, so a member's arrival or departure moves few shards).
fn weight(member: &str, shard: u16) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(shard).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in member.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // A final mix, so that close names and shards spread.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The balanced owners for `shards` among `live` (sorted names, no duplicates): each member
/// owns at most `ceil(shards / live)`; a current owner keeps its shards up to that, and the
/// others go, by rendezvous weight, to the members with room.
fn balanced<'a>(current: &'a ShardMap, live: &[&'a str]) -> Vec<Option<&'a str>> {
    let shards = usize::from(current.shards());
    if live.is_empty() {
        return vec![None; shards];
    }
    let room = shards.div_ceil(live.len());
    let mut load = vec![0usize; live.len()];
    let mut out: Vec<Option<&str>> = vec![None; shards];
    for (s, slot) in out.iter_mut().enumerate() {
        if let Some(i) = current.owner(s as u16).and_then(|o| live.iter().position(|m| *m == o))
            && load[i] < room
        {
            load[i] += 1;
            *slot = Some(live[i]);
        }
    }
    for (s, slot) in out.iter_mut().enumerate() {
        if slot.is_none() {
            let i = (0..live.len())
                .filter(|&i| load[i] < room)
                .max_by_key(|&i| (weight(live[i], s as u16), std::cmp::Reverse(i)))
                .expect("the members have room for every shard");
            load[i] += 1;
            *slot = Some(live[i]);
        }
    }
    out
}

/// The next map the coordinator writes, given the current one and the live members, or
/// `None` when it should stay as it is. See the [module documentation](self) for the moves.
pub fn next_map(current: &ShardMap, live: &[Member<'_>]) -> Option<ShardMap> {
    let mut names: Vec<&str> = live.iter().map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    let want = balanced(current, &names);
    // Every live member has stopped granting what the current map takes from it.
    let settled = live.iter().all(|m| m.applied >= current.epoch);
    let mut changed = false;
    let owners: Vec<Option<&str>> = (0..current.shards())
        .zip(want)
        .map(|(s, want)| {
            let now = current.owner(s);
            let next = match now {
                _ if now == want => now,
                Some(o) if names.contains(&o) => None,
                Some(_) => want,
                None if settled => want,
                None => None,
            };
            changed |= next != now;
            next
        })
        .collect();
    changed.then(|| ShardMap::from_owners(current.epoch + 1, &owners))
}

/// Each owner's part of a node's `capacity`, given each owner's claims (one per priority its
/// groups are at, see [`Engine::capacity_claims`](crate::engine::Engine::capacity_claims)):
/// the claims are shared as one node's groups would be, and what nobody asks for is split
/// evenly, so the parts add up to the capacity and a group new at any owner finds room.
pub fn split_capacity(capacity: f64, owners: &[Vec<Claim>]) -> Vec<f64> {
    if owners.is_empty() {
        return Vec::new();
    }
    let claims: Vec<Claim> = owners
        .iter()
        .flatten()
        .map(|c| Claim { ceiling: c.ceiling.min(c.demand.max(c.reserved)), ..*c })
        .collect();
    let shares = allocate(capacity, &claims);
    let mut parts = Vec::with_capacity(owners.len());
    let mut at = 0;
    for o in owners {
        parts.push(shares[at..at + o.len()].iter().sum::<f64>());
        at += o.len();
    }
    let spare = (capacity - parts.iter().sum::<f64>()).max(0.0) / owners.len() as f64;
    parts.iter().map(|p| p + spare).collect()
}

/// What an owner counts itself as claiming when it takes its part: the lesser of the claims it
/// wrote last (`before`) and the ones it writes now, per priority and field (a priority in
/// only one counts as nothing). The other owners read one or the other, as their ticks fall;
/// since a part never shrinks as its own claims grow nor grows as the others' do, each taking
/// its part with no more than any other sees it claim keeps the parts within the capacity
/// while claims move between ticks.
pub fn lesser_claims(before: &[Claim], now: &[Claim]) -> Vec<Claim> {
    now.iter()
        .filter_map(|c| {
            let b = before.iter().find(|b| b.priority == c.priority)?;
            Some(Claim {
                reserved: c.reserved.min(b.reserved),
                ceiling: c.ceiling.min(b.ceiling),
                priority: c.priority,
                weight: c.weight.min(b.weight),
                demand: c.demand.min(b.demand),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Priority;

    fn any_claims() -> impl proptest::strategy::Strategy<Value = Vec<Claim>> {
        use proptest::prelude::*;
        proptest::collection::vec((1u8..4, 0.0..200.0f64, 0.0..400.0f64, 0.0..60.0f64, 0.1..5.0f64), 0..3)
            .prop_map(|levels| {
                let mut claims: Vec<Claim> = Vec::new();
                for (level, demand, ceiling, reserved, weight) in levels {
                    let priority = Priority::new(level).unwrap();
                    if claims.iter().all(|c| c.priority != priority) {
                        claims.push(Claim { reserved, ceiling, priority, weight, demand });
                    }
                }
                claims
            })
    }

    fn live<'a>(names: &[&'a str], applied: u64) -> Vec<Member<'a>> {
        names.iter().map(|&name| Member { name, applied }).collect()
    }

    /// Steps the coordinator until the map settles, every member applying each map at once.
    fn settle(mut map: ShardMap, names: &[&str]) -> (ShardMap, usize) {
        let mut steps = 0;
        while let Some(next) = next_map(&map, &live(names, map.epoch)) {
            map = next;
            steps += 1;
            assert!(steps < 10, "the map settles");
        }
        (map, steps)
    }

    #[test]
    fn shards_spread_evenly_and_few_move_when_a_member_joins_or_leaves() {
        let (three, _) = settle(ShardMap::unowned(256), &["a", "b", "c"]);
        assert_eq!(three.moving(), 0);
        for m in ["a", "b", "c"] {
            let n = three.owned_by(m).len();
            assert!((85..=86).contains(&n), "{m} owns {n}");
        }
        let (four, steps) = settle(three.clone(), &["a", "b", "c", "d"]);
        assert_eq!(steps, 2, "taken from their owners, then given");
        let moved = (0..256).filter(|&s| three.owner(s) != four.owner(s)).count();
        assert_eq!(four.owned_by("d").len(), moved, "only the newcomer's shards moved");
        assert_eq!(moved, 64);
        let (back, _) = settle(four, &["a", "b", "c"]);
        assert_eq!(back.owned_by("a").len() + back.owned_by("b").len() + back.owned_by("c").len(), 256);
    }

    #[test]
    fn a_shard_has_no_new_owner_until_its_old_owner_has_applied_the_release() {
        let (map, _) = settle(ShardMap::unowned(16), &["a"]);
        let release = next_map(&map, &live(&["a", "b"], map.epoch)).unwrap();
        assert_eq!(release.owned_by("b"), Vec::<u16>::new());
        assert_eq!(release.moving(), 8);
        // `a` has not applied the release yet: nothing is given.
        assert_eq!(
            next_map(
                &release,
                &[Member { name: "a", applied: map.epoch }, Member { name: "b", applied: release.epoch }]
            ),
            None
        );
        let given = next_map(&release, &live(&["a", "b"], release.epoch)).unwrap();
        assert_eq!(given.owned_by("b").len(), 8);
        assert_eq!(given.epoch(), release.epoch() + 1);
    }

    #[test]
    fn a_dead_owners_shards_go_at_once() {
        let (map, _) = settle(ShardMap::unowned(12), &["a", "b", "c"]);
        let lost = map.owned_by("c");
        // `b` has not applied the last map: a dead owner's shards need no one's release.
        let next =
            next_map(&map, &[Member { name: "a", applied: map.epoch }, Member { name: "b", applied: 0 }])
                .unwrap();
        assert!(lost.iter().all(|&s| next.owner(s).is_some_and(|o| o != "c")));
        assert_eq!(next.moving(), 0);
    }

    proptest::proptest! {
        /// Owners whose claims move between two ticks, each reading every other's claims from
        /// either tick: taking its part with the lesser of its own two, the parts never add up
        /// to more than the capacity (one the reservations fit in: reserved units are granted
        /// whatever the capacity).
        #[test]
        fn parts_taken_from_claims_read_at_different_ticks_stay_within_the_capacity(
            owners in proptest::collection::vec((any_claims(), any_claims()), 2..5),
            seen in proptest::collection::vec(proptest::bool::ANY, 25),
            room in 0.0..1000.0f64,
        ) {
            let reserved = |c: &[Claim]| c.iter().map(|c| c.reserved).sum::<f64>();
            let capacity = room + owners.iter().map(|(b, a)| reserved(b).max(reserved(a))).sum::<f64>();
            let n = owners.len();
            let mut total = 0.0;
            for me in 0..n {
                let view: Vec<Vec<Claim>> = (0..n)
                    .map(|o| {
                        let (before, now) = &owners[o];
                        if o == me {
                            lesser_claims(before, now)
                        } else if seen[me * 5 + o] {
                            now.clone()
                        } else {
                            before.clone()
                        }
                    })
                    .collect();
                total += split_capacity(capacity, &view)[me];
            }
            proptest::prop_assert!(total <= capacity * (1.0 + 1e-9), "{} of {}", total, capacity);
        }

        /// Members join, die and apply maps late, in any order: each live member grants the
        /// shards it owns in the last map it applied, and no shard ever has two.
        #[test]
        fn no_shard_is_granted_by_two_live_members(steps in proptest::collection::vec((0u8..4, 0usize..5), 1..80)) {
            let names = ["m0", "m1", "m2", "m3", "m4"];
            let mut maps = vec![ShardMap::unowned(24)];
            // Per member: alive, and the epoch of the map it applied.
            let mut members: Vec<(bool, u64)> = vec![(true, 0), (true, 0), (false, 0), (false, 0), (false, 0)];
            for (what, who) in steps {
                match what {
                    0 => members[who] = (!members[who].0, 0),
                    1 => members[who].1 = maps.len() as u64 - 1,
                    _ => {
                        let live: Vec<Member> = names.iter().zip(&members)
                            .filter(|(_, m)| m.0)
                            .map(|(&name, m)| Member { name, applied: m.1 })
                            .collect();
                        if let Some(next) = next_map(maps.last().unwrap(), &live) {
                            maps.push(next);
                        }
                    }
                }
                for s in 0..24 {
                    let granting = names.iter().zip(&members)
                        .filter(|(name, m)| m.0 && maps[m.1 as usize].owns(name, s))
                        .count();
                    proptest::prop_assert!(granting <= 1, "shard {} granted by {}", s, granting);
                }
            }
        }
    }

    #[test]
    fn a_map_round_trips_and_bad_maps_are_refused_with_the_reason() {
        let (map, _) = settle(ShardMap::unowned(8), &["http://a:1", "http://b:1"]);
        assert_eq!(ShardMap::decode(map.encode().as_bytes()).unwrap(), map);
        let bad = |text: &str| ShardMap::decode(text.as_bytes()).unwrap_err();
        assert!(bad("nonsense").contains("not a shard map"));
        assert!(
            bad(r#"{"version":2,"epoch":1,"members":[],"owners":[null]}"#).contains("version 2 is unknown")
        );
        assert!(bad(r#"{"version":1,"epoch":1,"members":[],"owners":[]}"#).contains("1 to 4096"));
        assert!(
            bad(r#"{"version":1,"epoch":1,"members":["a"],"owners":[1]}"#)
                .contains("owners[0] names no member")
        );
        assert!(bad(r#"{"version":1,"epoch":1,"members":["a","a"],"owners":[0]}"#).contains("named twice"));
        assert!(bad(r#"{"version":1,"epoch":1,"members":[""],"owners":[0]}"#).contains("members[0]"));
        assert!(
            bad(r#"{"version":1,"epoch":1,"members":[],"owners":[null],"x":1}"#).contains("unknown field")
        );
    }

    #[test]
    fn capacity_is_split_by_what_each_owners_groups_claim_and_adds_up() {
        let claim = |reserved, demand, priority| Claim {
            reserved,
            ceiling: f64::INFINITY,
            priority,
            weight: 1.0,
            demand,
        };
        // 1000 units/s; one owner's groups reserve 600 and ask 800, the other's ask 1000 at a
        // higher priority with nothing reserved.
        let parts = split_capacity(
            1000.0,
            &[vec![claim(600.0, 800.0, Priority::LOW)], vec![claim(0.0, 1000.0, Priority::HIGH)]],
        );
        assert_eq!(parts, vec![600.0, 400.0]);
        // Nobody asks: the capacity is split evenly.
        assert_eq!(split_capacity(90.0, &[vec![], vec![], vec![]]), vec![30.0, 30.0, 30.0]);
        let parts = split_capacity(100.0, &[vec![claim(10.0, 20.0, Priority::MEDIUM)], vec![]]);
        assert_eq!(parts, vec![60.0, 40.0]);
    }
}
