//! Which groups are this controller's, and what of the node's capacity: with the groups
//! sharded over controllers, its part of the capacity, the groups it forgets or takes over
//! with their stored consumption and ramps; in a region, the shares leased from the global
//! tier.

use std::sync::{Mutex, PoisonError};

use tollgate_model::engine::Engine;
use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;

use super::UPSTREAM_GROUPS_MAX;
use super::pacing::Pacing;
use crate::store::StoredRamp;

/// How this controller's part of the node's capacity stands, with the groups sharded over
/// controllers ([`Ownership::set_capacity_part`], [`Ownership::share_capacity_among`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CapacityShare {
    /// While a part is in force (the engine shares the part): the configured capacity.
    pub(super) configured: Option<Option<f64>>,
    /// While the groups are sharded: how many owners share the capacity.
    pub(super) owners: Option<usize>,
}

impl CapacityShare {
    /// The capacity the engine shares when `capacity` is configured, with `part` the one it
    /// shares now: a part in force is scaled with the configured capacity, and a capacity new
    /// to sharded groups starts at an even share, so that the owners' parts never add up to
    /// more than the capacity while they wait for their next split.
    pub(super) fn in_force(&mut self, capacity: Option<f64>, part: Option<f64>) -> Option<f64> {
        let Some(new) = capacity else {
            self.configured = None;
            return None;
        };
        let owners = self.owners.unwrap_or(1).max(1) as f64;
        let scaled = match (self.configured, part) {
            (Some(Some(old)), Some(part)) if old > 0.0 => (part * new / old).min(new),
            _ if self.owners.is_some() => new / owners,
            _ => return Some(new),
        };
        self.configured = Some(Some(new));
        Some(scaled)
    }
}

/// The groups and capacity this controller owns ([`Controller::ownership`](super::Controller::ownership)).
#[derive(Clone, Copy)]
pub struct Ownership<'a> {
    pub(super) engine: &'a parking_lot::Mutex<Engine>,
    pub(super) capacity: &'a Mutex<CapacityShare>,
    pub(super) pacing: &'a Pacing,
}

impl Ownership<'_> {
    /// With groups sharded over controllers: shares `part` of the node's capacity among this
    /// controller's groups instead of all of it ([`tollgate_model::shard::split_capacity`]);
    /// `None` shares the configured capacity again, as a controller whose groups are not
    /// sharded does. [`Admin::node`](super::Admin::node) still says the configured capacity. Ignored while no
    /// capacity is configured.
    pub fn set_capacity_part(&self, part: Option<f64>) {
        let mut share = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
        let mut engine = self.engine.lock();
        let whole = *share.configured.get_or_insert(engine.settings().capacity);
        match (whole, part) {
            (Some(_), Some(p)) => engine.set_capacity(Some(p)),
            _ => {
                engine.set_capacity(whole);
                share.configured = None;
                share.owners = None;
            }
        }
    }

    /// With groups sharded over `owners` controllers: a capacity configured where none was,
    /// before the next split, starts at an even share of it, not the whole.
    pub fn share_capacity_among(&self, owners: usize) {
        let mut share = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
        share.owners = Some(owners.max(1));
    }

    /// What this controller's groups claim of the node's capacity, per priority
    /// ([`Engine::capacity_claims`]), for the split among owners.
    pub fn capacity_claims(&self) -> Vec<tollgate_model::allocate::Claim> {
        self.engine.lock().capacity_claims()
    }

    /// Forgets the groups that `gone`, given a group and its tree's root, says are no longer
    /// this controller's (their shard moved away); see [`Engine::forget_groups`]. Returns how
    /// many.
    pub fn forget_groups(&self, now: Nanos, gone: impl Fn(&GroupName, &GroupName) -> bool) -> usize {
        self.engine.lock().forget_groups(now, gone)
    }

    /// Takes the stored consumption of each of `meters` whose tree's root `mine` says this
    /// controller has just been given (as at start: configured groups' and those a pattern's
    /// or the default's quotas count), so that it counts on from what their last owner wrote.
    /// Meters only grow: each count is the larger of the stored one and this controller's own
    /// (which is the newer when the group never left it). Returns how many were taken.
    pub fn restore_meters(
        &self,
        meters: Vec<(GroupName, tollgate_model::engine::Meter)>,
        mine: impl Fn(&GroupName) -> bool,
    ) -> usize {
        let mut engine = self.engine.lock();
        let mut taken = 0;
        for (name, stored) in meters {
            if !mine(engine.root_of(&name)) || !(engine.group(&name).is_some() || engine.counts_quotas(&name))
            {
                continue;
            }
            let own = engine.meter(&name).unwrap_or_default();
            let merged = tollgate_model::engine::Meter {
                consumed: own.consumed.max(stored.consumed),
                admitted: own.admitted.max(stored.admitted),
                throttled: own.throttled.max(stored.throttled),
                waited: own.waited.max(stored.waited),
                would_refuse: own.would_refuse.max(stored.would_refuse),
            };
            debug_assert!(
                merged.consumed >= own.consumed && merged.consumed >= stored.consumed,
                "meters only grow"
            );
            engine.restore_meter(name, merged);
            taken += 1;
        }
        taken
    }

    /// Lets each of the stored `ramps` whose tree's root `mine` says this controller has just
    /// been given resume where its last owner left it, at `now` (`wall_ms` the Unix time in
    /// milliseconds), as at start: a group's next report picks its ramp up there instead of at
    /// its minimum. A ramp past its resume TTL is left out, and so is a group this controller
    /// computes now (its own ramp is the newer). Returns how many were taken.
    pub fn resume_ramps(
        &self,
        now: Nanos,
        wall_ms: u64,
        ramps: Vec<(GroupName, StoredRamp)>,
        mine: impl Fn(&GroupName) -> bool,
    ) -> usize {
        let mut engine = self.engine.lock();
        let mut taken = 0;
        for (name, ramp) in ramps {
            if mine(engine.root_of(&name)) && !engine.tracks(&name) {
                taken += usize::from(super::resume_stored_ramp(&mut engine, now, wall_ms, name, ramp));
            }
        }
        taken
    }

    /// The shard of each of `groups` among `shards`, by the root of its tree
    /// ([`Engine::root_of`]), all under one lock; `None` for a name that is not a group's.
    pub fn shards_of<'a>(&self, groups: impl Iterator<Item = &'a str>, shards: u16) -> Vec<Option<u16>> {
        let engine = self.engine.lock();
        groups
            .map(|g| {
                let name = GroupName::new(g).ok()?;
                Some(tollgate_model::shard::shard_of(engine.root_of(&name).as_str(), shards))
            })
            .collect()
    }

    /// Makes this a regional controller's engine: each group's rate comes from the global
    /// tier ([`Engine::set_upstream_mode`]).
    pub fn set_regional(&self) {
        self.engine.lock().set_upstream_mode(true);
    }

    /// Every group this regional controller's clients use, as the global tier is told it
    /// ([`Engine::upstream_usage`]).
    pub fn upstream_usage(&self) -> Vec<tollgate_model::engine::UpstreamUsage> {
        self.engine.lock().upstream_usage(UPSTREAM_GROUPS_MAX)
    }

    /// Whether a group this regional controller's clients use has no share from the global
    /// tier yet ([`Engine::upstream_unheld`]).
    pub fn upstream_unheld(&self) -> bool {
        self.engine.lock().upstream_unheld(UPSTREAM_GROUPS_MAX)
    }

    /// Takes shares granted by the global tier ([`Engine::set_upstream`]); when one moved, the
    /// next tick runs at once ([`Pacer::take_early_tick`](super::Pacer::take_early_tick)).
    pub fn set_upstream(
        &self,
        grants: impl IntoIterator<Item = (GroupName, tollgate_model::engine::UpstreamGrant)>,
    ) {
        let mut engine = self.engine.lock();
        let mut moved = false;
        for (name, grant) in grants {
            moved |= engine.set_upstream(name, grant);
        }
        drop(engine);
        if moved {
            self.pacing.upstream_moved();
        }
    }

    /// Resolves once a client of this regional controller names a group the global tier has
    /// granted nothing yet: the region's lease asks for its share at once.
    pub async fn share_wanted(self) {
        self.pacing.share_wanted().await;
    }

    /// How many times a client of this regional controller named a group the global tier has
    /// granted nothing yet: a caller stepping the region's lease itself, rather than waiting
    /// on [`share_wanted`](Self::share_wanted), looks for unheld groups again when it moves
    /// (and every [`LOOK_EVERY`](crate::cluster::regions::LOOK_EVERY)).
    pub fn shares_wanted(self) -> u64 {
        self.pacing.shares_wanted()
    }
}
