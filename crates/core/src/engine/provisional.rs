//! Provisional grants: those made since the last tick to clients the tick did not know (new,
//! restarted, or in a group the tick has not seen), by group.
//!
//! They count against the group's target until the next tick, which knows those clients and
//! gives each its share: so a group's live grants never add up to more than its target between
//! two ticks either. Those of groups the last tick did not see also count against the room the
//! capacity has left for newcomers.

use std::collections::HashMap;

use super::FixedHasher;
use super::split::ClientId;
use crate::settings::GroupName;

/// The grants made since the last tick, by group, and their sum over the groups the tick has
/// not seen.
#[derive(Default)]
pub(super) struct Provisional {
    by_group: HashMap<GroupName, Vec<(ClientId, f64)>, FixedHasher>,
    /// The sum of the grants above in groups the last tick did not see.
    unticked: f64,
}

impl Provisional {
    /// What `group`'s other clients than `client` were granted since the last tick.
    pub(super) fn others(&self, group: &GroupName, client: ClientId) -> f64 {
        self.by_group.get(group).map_or(0.0, |p| p.iter().filter(|(c, _)| *c != client).map(|(_, r)| r).sum())
    }

    /// What `group`'s clients were granted since the last tick.
    pub(super) fn of(&self, group: &GroupName) -> f64 {
        self.by_group.get(group).map_or(0.0, |p| p.iter().map(|(_, r)| r).sum())
    }

    /// The grants made since the last tick in groups it did not see.
    pub(super) fn unticked(&self) -> f64 {
        self.unticked
    }

    /// Records `client`'s grant of `rate` in `group` (replacing one made since the last tick);
    /// `unticked` when the last tick did not see the group.
    pub(super) fn grant(&mut self, group: GroupName, client: ClientId, rate: f64, unticked: bool) {
        let grants = self.by_group.entry(group).or_default();
        let before = match grants.iter_mut().find(|(c, _)| *c == client) {
            Some(p) => std::mem::replace(&mut p.1, rate),
            None => {
                grants.push((client, rate));
                0.0
            }
        };
        if unticked {
            self.unticked += rate - before;
        }
        debug_assert!(self.unticked >= -1e-6 * (1.0 + rate.abs()), "provisional grants summed below zero");
    }

    /// Drops the grants made to the clients `gone` says are gone in `group`; `unticked` when
    /// the last tick did not see the group.
    pub(super) fn release(&mut self, group: &GroupName, gone: impl Fn(ClientId) -> bool, unticked: bool) {
        if let Some(p) = self.by_group.get_mut(group) {
            let before: f64 = p.iter().map(|(_, r)| r).sum();
            p.retain(|(c, _)| !gone(*c));
            if unticked {
                self.unticked -= before - p.iter().map(|(_, r)| r).sum::<f64>();
            }
        }
    }

    /// Forgets the grants of the groups `gone` says are gone.
    pub(super) fn forget(&mut self, gone: impl Fn(&GroupName) -> bool) {
        self.by_group.retain(|name, _| !gone(name));
    }

    /// A tick is done: it knows every client that reported, so nothing is provisional.
    pub(super) fn ticked(&mut self) {
        self.unticked = 0.0;
        // Dropped rather than cleared: after a restart every group has some, and an emptied
        // table would keep its room for all of them.
        self.by_group = HashMap::default();
    }
}
