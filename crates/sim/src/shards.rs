//! Groups sharded over several controllers (`controller.controllers`), as `tollgate server`
//! shards them on etcd: the same shard map and moves ([`tollgate_model::shard`]), the same
//! split of an exchange by owner ([`tollgate_controller::cluster::shard_routing`]), and a controller per
//! member over the same settings.
//!
//! Each step, every controller that runs renews its membership (a lease of
//! [`ELECTION_LEASE`](crate::faults::ELECTION_LEASE)) and applies the last map written,
//! forgetting the groups it no longer owns; then the coordinator writes the next map if the
//! members or what they applied call for one. A crashed controller grants nothing; its lease
//! runs out a lease later, and its shards move then. At each tick the capacity is split among
//! the running owners by what their groups claim, and each ticks. One invariant more holds at
//! every step: no shard is granted by two controllers. It is checked at each step where a
//! controller starts, stops or applies a map, the only steps at which it can change.

use std::time::Duration;

use tollgate_controller::Node;
use tollgate_controller::cluster::shard_routing::split_exchange;
use tollgate_limiter::ExchangeError;
use tollgate_limiter::shards::join_answers;
use tollgate_model::shard::{Member, ShardMap, next_map, shard_of, split_capacity};
use tollgate_model::time::Nanos;
use tollgate_proto::v1;

/// One controller among those the groups are sharded over.
struct Owner {
    node: Node,
    name: String,
    /// The map it applied last: it grants the shards this gives it.
    view: ShardMap,
    /// A newer map it has heard of, and when it applies it (etcd's watch and the controller
    /// take their time).
    pending: Option<(Nanos, ShardMap)>,
    /// Down (crashed) until then.
    down_until: Option<Nanos>,
    /// Its membership holds in etcd until then.
    lease_until: Nanos,
}

/// The controllers and the map. See the [module documentation](self).
pub(crate) struct Shards {
    owners: Vec<Owner>,
    map: ShardMap,
    capacity: Option<f64>,
    lease: Duration,
    /// Maps written so far.
    pub(crate) maps_written: u64,
    /// The first shard found granted by two controllers, with the time and who.
    pub(crate) breach: Option<String>,
    /// Draws how long each controller takes to apply a map.
    rng: crate::rng::SplitMix64,
    /// What the last step's map and invariant were worked out from: the map's epoch and, per
    /// controller, whether its lease holds (for the map) or it runs (for the invariant), and
    /// the epoch of the map it applied. Both are the same as long as these are, so a step
    /// that changes none of them works neither out again.
    last_map: Vec<(bool, u64)>,
    last_check: Vec<(bool, u64)>,
}

/// The longest a controller takes to apply a new map.
const APPLY_LAG_MAX_MS: u64 = 300;

impl Shards {
    /// `controllers` controllers made by `start`, over `shards` shards.
    pub(crate) fn new(
        controllers: usize,
        shards: u16,
        capacity: Option<f64>,
        seed: u64,
        start: &impl Fn(Nanos) -> Node,
    ) -> Shards {
        let owners = (0..controllers)
            .map(|i| Owner {
                node: start(Nanos::ZERO),
                name: format!("controller-{i}"),
                view: ShardMap::unowned(shards),
                pending: None,
                down_until: None,
                lease_until: Nanos::ZERO,
            })
            .collect();
        Shards {
            owners,
            map: ShardMap::unowned(shards),
            capacity,
            lease: crate::faults::ELECTION_LEASE,
            maps_written: 0,
            breach: None,
            rng: crate::rng::SplitMix64::new(seed ^ 0x5AA2D),
            last_map: Vec::new(),
            last_check: Vec::new(),
        }
    }

    /// Every controller's node, running or not.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.owners.iter().map(|o| &o.node)
    }

    /// The nodes of the controllers running at `now`.
    pub(crate) fn running(&self, now: Nanos) -> impl Iterator<Item = &Node> {
        self.owners.iter().filter(move |o| o.runs(now)).map(|o| &o.node)
    }

    /// Controller `which` (modulo their number) crashes at `now` for `down`; it comes back
    /// as a new process with nothing in memory.
    pub(crate) fn crash(&mut self, which: usize, now: Nanos, down: Duration) {
        let n = self.owners.len();
        let o = &mut self.owners[which % n];
        o.down_until = Some(o.down_until.map_or(now.after(down), |u| u.max(now.after(down))));
    }

    /// One step at `now`: restarts, renewals, maps applied and written, the invariant; at
    /// `tick`, the capacity's split and every running controller's tick.
    pub(crate) fn step(&mut self, now: Nanos, tick: bool, start: &impl Fn(Nanos) -> Node) {
        for o in &mut self.owners {
            if o.down_until.is_some_and(|u| u <= now) {
                o.node = start(now);
                o.view = ShardMap::unowned(self.map.shards());
                o.pending = None;
                o.down_until = None;
            }
            if !o.runs(now) {
                continue;
            }
            o.lease_until = now.after(self.lease);
            if o.view.epoch() < self.map.epoch() {
                match &mut o.pending {
                    Some((_, map)) => *map = self.map.clone(),
                    None => {
                        let lag =
                            std::time::Duration::from_millis(self.rng.next_u64() % (APPLY_LAG_MAX_MS + 1));
                        o.pending = Some((now.after(lag), self.map.clone()));
                    }
                }
            }
            if let Some((_, map)) = o.pending.take_if(|(due, _)| *due <= now) {
                o.view = map;
                let (view, name) = (&o.view, o.name.as_str());
                o.node
                    .controller
                    .ownership()
                    .forget_groups(now, |_, root| !view.owns(name, shard_of(root.as_str(), view.shards())));
            }
        }
        let inputs = std::iter::once((true, self.map.epoch()))
            .chain(self.owners.iter().map(|o| (o.lease_until > now, o.view.epoch())))
            .collect::<Vec<_>>();
        if inputs != self.last_map {
            let live: Vec<Member<'_>> = self
                .owners
                .iter()
                .filter(|o| o.lease_until > now)
                .map(|o| Member { name: &o.name, applied: o.view.epoch() })
                .collect();
            if let Some(next) = next_map(&self.map, &live) {
                self.map = next;
                self.maps_written += 1;
            }
            self.last_map = inputs;
        }
        let inputs: Vec<(bool, u64)> = self.owners.iter().map(|o| (o.runs(now), o.view.epoch())).collect();
        if inputs != self.last_check {
            self.check(now);
            self.last_check = inputs;
        }
        if tick {
            self.tick(now);
        }
    }

    /// No shard granted by two running controllers.
    fn check(&mut self, now: Nanos) {
        if self.breach.is_some() {
            return;
        }
        for s in 0..self.map.shards() {
            let granting: Vec<&str> = self
                .owners
                .iter()
                .filter(|o| o.runs(now) && o.view.owns(&o.name, s))
                .map(|o| o.name.as_str())
                .collect();
            if granting.len() > 1 {
                self.breach = Some(format!(
                    "t={}s: shard {s} granted by {}",
                    now.as_secs_f64(),
                    granting.join(" and ")
                ));
                return;
            }
        }
    }

    fn tick(&mut self, now: Nanos) {
        let running: Vec<&Owner> = self.owners.iter().filter(|o| o.runs(now)).collect();
        if let Some(capacity) = self.capacity {
            let claims: Vec<_> =
                running.iter().map(|o| o.node.controller.ownership().capacity_claims()).collect();
            for (o, part) in running.iter().zip(split_capacity(capacity, &claims)) {
                o.node.controller.ownership().set_capacity_part(Some(part));
            }
        }
        for o in running {
            o.node.controller.pacer().tick(now);
        }
    }

    /// A client's exchange at `now`: each part to its group's owner as the clients' cached
    /// map says; an owner that does not run fails its part, one that has not applied the map
    /// yet leaves its groups out. Fails only when no part is answered.
    pub(crate) fn exchange(
        &self,
        now: Nanos,
        request: &v1::ExchangeRequest,
    ) -> Result<v1::ExchangeResponse, ExchangeError> {
        let any = &self.owners[0].node.controller;
        let shards = self.map.shards();
        let of = any.ownership().shards_of(request.groups.iter().map(|g| g.group.as_str()), shards);
        let (parts, _) = split_exchange(request, |i| {
            let owner = self.map.owner(of[i]?)?;
            self.owners.iter().position(|o| o.name == owner)
        });
        let mut answers = Vec::with_capacity(parts.len());
        let mut failed = None;
        for (i, mut part) in parts {
            let o = &self.owners[i];
            if !o.runs(now) {
                failed = Some(ExchangeError::Transport(format!("{} does not answer", o.name)));
                continue;
            }
            let controller = &o.node.controller;
            let mine = controller
                .ownership()
                .shards_of(part.groups.iter().map(|g| g.group.as_str()), o.view.shards());
            let mut at = 0;
            part.groups.retain(|_| {
                at += 1;
                mine[at - 1].is_some_and(|s| o.view.owns(&o.name, s))
            });
            match controller.exchange(now, &part) {
                Ok(a) => answers.push(a),
                Err(status) => failed = Some(ExchangeError::of(&status)),
            }
        }
        match (answers.is_empty(), failed) {
            (true, Some(e)) => Err(e),
            _ => Ok(join_answers(answers)),
        }
    }

    /// At `now`, while etcd is `up`: the backends' reports reach every running controller
    /// when `due.0`; then a [`step`](Self::step), with a tick when `due.1`.
    pub(crate) fn report_and_step(
        &mut self,
        now: Nanos,
        up: bool,
        due: (bool, bool),
        world: &mut crate::world::World,
        start: &impl Fn(Nanos) -> Node,
    ) {
        if up && due.0 {
            for report in world.backend_reports(now) {
                for node in self.running(now) {
                    node.controller
                        .backend_report(now, &tollgate_proto::wire::ReportView::of(&report))
                        .expect("scenario backends are valid");
                }
            }
        }
        self.step(now, up && due.1, start);
    }
}

impl Owner {
    fn runs(&self, now: Nanos) -> bool {
        self.down_until.is_none_or(|u| u <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_controller::store::MemoryStore;
    use tollgate_model::engine::EngineSettings;

    /// The canary: two controllers that apply maps each giving them the same shard (a move
    /// the coordinator never makes) are caught at the step they do, and not before.
    #[test]
    fn a_shard_granted_by_two_controllers_is_caught() {
        let store = MemoryStore::default();
        let start = |now: Nanos| {
            Node::open(Box::new(store.clone()), EngineSettings::default(), now, 0).expect("a store in memory")
        };
        let mut shards = Shards::new(2, 4, None, 7, &start);
        let step = Duration::from_millis(1);
        for i in 1..=2_000u32 {
            shards.step(Nanos::ZERO.after(step * i), false, &start);
        }
        assert!(shards.breach.is_none(), "{:?}", shards.breach);
        assert!(shards.owners.iter().all(|o| o.view.epoch() == shards.map.epoch()));
        let members = vec!["controller-0".to_string(), "controller-1".to_string()];
        let map = |epoch, owners| ShardMap::from_parts(epoch, members.clone(), owners).unwrap();
        let after = shards.map.epoch() + 10;
        shards.owners[0].view = map(after, vec![Some(0), Some(0), Some(1), Some(1)]);
        shards.owners[1].view = map(after + 1, vec![Some(1), Some(0), Some(1), Some(1)]);
        shards.step(Nanos::ZERO.after(step * 2_001), false, &start);
        let breach = shards.breach.expect("shard 0 granted by both is caught");
        assert!(breach.contains("shard 0 granted by controller-0 and controller-1"), "{breach}");
    }
}
