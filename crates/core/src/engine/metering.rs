//! Metering: each group's consumption so far, kept for a store.
//!
//! A tracked group holds its own meter; the meters of groups not tracked now (configured and
//! idle, or forgotten while idle and not yet taken) are kept here. A group whose meter changes
//! is named once in [`Metering::dirty`], so taking the changed meters reads those groups only.

use std::collections::HashMap;

use super::{Engine, FixedHasher, Meter};
use crate::settings::GroupName;

/// The meters of groups not tracked now, and the names of those changed since the last take.
#[derive(Default)]
pub(super) struct Metering {
    /// The meters of groups not tracked now (a tracked group holds its own).
    pub(super) idle: HashMap<GroupName, MeterEntry, FixedHasher>,
    /// The groups whose meter changed since the store last took them, each named when it
    /// changes first: [`Engine::take_dirty_meters`] reads these, not every group.
    pub(super) dirty: Vec<GroupName>,
    /// Whether anyone takes the meters ([`Engine::take_metering`]): only then are changed
    /// meters named, and an unconfigured group's kept past its expiry until taken.
    pub(super) on: bool,
}

/// A meter kept apart from its group, and whether it changed since it was last taken.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MeterEntry {
    pub(super) meter: Meter,
    pub(super) dirty: bool,
}

impl Engine {
    /// A group's consumption so far.
    pub fn meter(&self, group: &GroupName) -> Option<Meter> {
        match self.tracked.get(group) {
            Some(g) => Some(g.meter),
            None => self.metering.idle.get(group).map(|m| m.meter),
        }
    }

    /// Restores a group's consumption (from a store, at start).
    pub fn restore_meter(&mut self, group: GroupName, meter: Meter) {
        match self.tracked.get_mut(&group) {
            Some(g) => (g.meter, g.dirty) = (meter, false),
            None => {
                self.metering.idle.insert(group, MeterEntry { meter, dirty: false });
            }
        }
    }

    /// From now on, every group's meter that changes is named for
    /// [`take_dirty_meters`](Self::take_dirty_meters), and an unconfigured group forgotten while
    /// idle keeps its meter until taken. A controller that writes its metering calls it first;
    /// an embedded limiter, which takes none, does not (nothing would bound what it keeps).
    pub fn take_metering(&mut self) {
        if !self.metering.on {
            self.metering.on = true;
            // What changed before counts too.
            let changed = self.tracked.iter().filter(|(_, g)| g.dirty).map(|(n, _)| n.clone());
            self.metering.dirty.extend(changed);
            self.metering
                .dirty
                .extend(self.metering.idle.iter().filter(|(_, m)| m.dirty).map(|(n, _)| n.clone()));
        }
    }

    /// The meters that changed since the last call, every group's in traffic (configured or
    /// not, the `default` group's settings serving it or its own), at most `most` groups' at a
    /// time, sorted by name: what the controller's metering records; and whether more are
    /// left to take. An unconfigured group forgotten while idle keeps its meter until it is
    /// taken here.
    ///
    /// Found by the names marked when each meter first changed, not by walking every group:
    /// walking 100,000 tracked groups to find the changed few took the controller's lock for 3
    /// to 4 ms each time. Taken a slice at a time, so that the caller may let go of the lock
    /// between slices: 100,000 changed meters taken at once held it for about 30 ms.
    pub fn take_dirty_meters(&mut self, most: usize) -> (Vec<(GroupName, Meter)>, bool) {
        self.take_metering();
        let from = self.metering.dirty.len().saturating_sub(most);
        let names: Vec<GroupName> = self.metering.dirty.drain(from..).collect();
        let mut out = Vec::with_capacity(names.len());
        // A name given twice (marked again by `mark_dirty`) is taken once: its flag is
        // cleared the first time.
        for name in names {
            if let Some(g) = self.tracked.get_mut(&name) {
                if std::mem::take(&mut g.dirty) {
                    out.push((name, g.meter));
                }
            } else if let Some(m) = self.metering.idle.get_mut(&name)
                && std::mem::take(&mut m.dirty)
            {
                out.push((name.clone(), m.meter));
                // An unconfigured group's meter was kept only to be taken, unless quotas
                // count it.
                if !self.catalog.contains_key(&name) && !self.counts_quotas(&name) {
                    self.metering.idle.remove(&name);
                }
            }
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        (out, !self.metering.dirty.is_empty())
    }

    /// Marks meters to be returned by the next [`take_dirty_meters`](Self::take_dirty_meters)
    /// again (a store that failed to write them).
    pub fn mark_dirty<'a>(&mut self, groups: impl IntoIterator<Item = &'a GroupName>) {
        for name in groups {
            let dirty = match self.tracked.get_mut(name) {
                Some(g) => Some(&mut g.dirty),
                None => self.metering.idle.get_mut(name).map(|m| &mut m.dirty),
            };
            if let Some(d) = dirty
                && !std::mem::replace(d, true)
                && self.metering.on
            {
                self.metering.dirty.push(name.clone());
            }
        }
    }
}
