//! The catalogue: the configured groups, with what the engine keeps summed over them (their
//! reservations, how many ramp, whether any is nested) and the generation that tells a
//! tracked group its copy of its settings is stale.
//!
//! Every change to the configured groups goes through [`Catalog::set`] and
//! [`Catalog::remove`], which keep those sums: the engine never adds them up again, so loading
//! n groups stays linear.

use std::collections::HashMap;
use std::sync::Arc;

use super::{FixedHasher, Tracking};
use crate::hierarchy::Bound;
use crate::settings::{DEFAULT_GROUP, GroupName, GroupSettings};

/// The configured groups by name, patterns among them (see
/// [`is_pattern`](crate::settings::is_pattern)) also kept apart, most specific first. Reads go
/// to the map.
#[derive(Default)]
pub(crate) struct Configured {
    by_name: HashMap<GroupName, Arc<GroupSettings>, FixedHasher>,
    patterns: Vec<(GroupName, Arc<GroupSettings>)>,
}

impl std::ops::Deref for Configured {
    type Target = HashMap<GroupName, Arc<GroupSettings>, FixedHasher>;
    fn deref(&self) -> &Self::Target {
        &self.by_name
    }
}

impl Configured {
    fn insert(&mut self, name: GroupName, settings: Arc<GroupSettings>) -> Option<Arc<GroupSettings>> {
        if crate::settings::is_pattern(name.as_str()) {
            self.patterns.retain(|(n, _)| *n != name);
            self.patterns.push((name.clone(), settings.clone()));
            crate::settings::sort_patterns(&mut self.patterns);
        }
        self.by_name.insert(name, settings)
    }

    fn remove(&mut self, name: &GroupName) -> Option<Arc<GroupSettings>> {
        self.patterns.retain(|(n, _)| n != name);
        self.by_name.remove(name)
    }
}

/// The settings in `configured` that apply to `name`: its own, else the most specific
/// pattern's that matches it, else the `default` group's.
/// The root of the tree `name` belongs to, by the parents `configured` names.
pub(super) fn root_in<'a>(configured: &'a Configured, name: &'a GroupName) -> &'a GroupName {
    let mut at = name;
    for _ in 0..crate::hierarchy::DEPTH_MAX {
        match configured.get(at).and_then(|s| s.parent()) {
            Some(parent) => at = parent,
            None => break,
        }
    }
    at
}

pub(super) fn settings_in<'a>(
    configured: &'a Configured,
    name: &GroupName,
) -> Option<&'a Arc<GroupSettings>> {
    configured.get(name.as_str()).or_else(|| {
        crate::settings::matching_pattern(&configured.patterns, name.as_str())
            .or_else(|| configured.get(DEFAULT_GROUP))
    })
}

/// The configured groups and what is kept summed over them.
#[derive(Default)]
pub(super) struct Catalog {
    groups: Configured,
    /// Bumped by every change to the configured groups: a tracked group whose copy is of an
    /// older generation looks its settings up again at the next tick or report.
    generation: u32,
    /// The sum of the configured groups' reservations (Couchbase's free pool counts them all);
    /// a child's is part of its parent's, counted once, there.
    reserved: f64,
    /// How many configured groups have a ramp.
    ramped: usize,
    /// Whether any configured group has a parent, and what the trees of nested groups leave
    /// each of them this tick.
    nested: bool,
    nesting: HashMap<GroupName, Bound, FixedHasher>,
}

impl std::ops::Deref for Catalog {
    type Target = Configured;
    fn deref(&self) -> &Configured {
        &self.groups
    }
}

impl Catalog {
    /// Sets (or replaces) a group's settings; returns what it had.
    pub(super) fn set(&mut self, name: GroupName, settings: GroupSettings) -> Option<Arc<GroupSettings>> {
        let linked = settings.parent().is_some();
        let reserved = if linked { 0.0 } else { settings.reserved() };
        let ramped = settings.ramp().is_some();
        let before = self.groups.insert(name, Arc::new(settings));
        let unlinked = !linked && before.as_ref().is_some_and(|b| b.parent().is_some());
        self.changed(if linked {
            Nesting::Linked
        } else if unlinked {
            Nesting::Unlinked
        } else {
            Nesting::Same
        });
        self.forget(before.as_deref());
        self.reserved += reserved;
        self.ramped += usize::from(ramped);
        debug_assert!(self.ramped <= self.groups.len(), "more ramps counted than groups configured");
        before
    }

    /// Removes a group's settings; returns what it had.
    pub(super) fn remove(&mut self, name: &GroupName) -> Option<Arc<GroupSettings>> {
        let before = self.groups.remove(name);
        let unlinked = before.as_ref().is_some_and(|b| b.parent().is_some());
        self.changed(if unlinked { Nesting::Unlinked } else { Nesting::Same });
        self.forget(before.as_deref());
        before
    }

    /// The generation of the configured groups now.
    pub(super) fn generation(&self) -> u32 {
        self.generation
    }

    /// The sum of the configured groups' reservations.
    pub(super) fn reserved(&self) -> f64 {
        self.reserved
    }

    /// Whether any configured group has a ramp.
    pub(super) fn ramps(&self) -> bool {
        self.ramped > 0
    }

    /// What the trees of nested groups leave `group` this tick, if it is nested.
    pub(super) fn nesting(&self, group: &GroupName) -> Option<Bound> {
        self.nesting.get(group).copied()
    }

    /// Makes every tracked group look its settings up again, though none changed (the
    /// engine's own mode changed what they mean).
    pub(super) fn touch(&mut self) {
        self.changed(Nesting::Same);
    }

    /// The trees of nested groups' bounds this tick, by group.
    pub(super) fn bounds(&self) -> &HashMap<GroupName, Bound, FixedHasher> {
        &self.nesting
    }

    /// Whether any configured group has a parent.
    #[cfg(test)]
    pub(super) fn is_nested(&self) -> bool {
        self.nested
    }

    /// Takes a group's settings that are gone out of the sums.
    fn forget(&mut self, settings: Option<&GroupSettings>) {
        if let Some(s) = settings {
            if s.parent().is_none() {
                self.reserved -= s.reserved();
            }
            if s.ramp().is_some() {
                self.ramped -= 1;
            }
        }
    }

    /// A new generation of the configured groups: every tracked group looks its settings up
    /// again (at the next tick, or its next report). `u32::MAX` is never one, so a group made
    /// since is always stale. `nesting` says how the change moved the groups' parent links:
    /// only a link gone needs every group looked at again, so loading n groups stays linear.
    fn changed(&mut self, nesting: Nesting) {
        self.generation = (self.generation + 1) % u32::MAX;
        match nesting {
            Nesting::Linked => self.nested = true,
            Nesting::Unlinked => self.nested = self.groups.values().any(|s| s.parent().is_some()),
            Nesting::Same => {}
        }
        if !self.nested {
            self.nesting.clear();
        }
    }

    /// Shares every tree of nested groups out from its roots (see [`crate::hierarchy`]): each
    /// nested group's cap and own reservation for the tick, by what its clients ask now.
    pub(super) fn nest(&mut self, tracked: &Tracking) {
        if !self.nested {
            return;
        }
        let configured = &self.groups;
        let mut index: HashMap<GroupName, usize, FixedHasher> = HashMap::default();
        let mut names: Vec<GroupName> = Vec::new();
        // Every group with a parent (configured by name, or through a pattern while tracked),
        // and the chain above it.
        let with_parent = configured
            .iter()
            .filter(|(n, s)| s.parent().is_some() && !crate::settings::is_pattern(n.as_str()))
            .map(|(n, _)| n)
            .chain(
                tracked
                    .iter()
                    .filter(|(_, g)| g.settings.as_deref().is_some_and(|s| s.parent().is_some()))
                    .map(|(n, _)| n),
            );
        for name in with_parent {
            let mut at = Some(name.clone());
            while let Some(n) = at.filter(|n| !index.contains_key(n)) {
                index.insert(n.clone(), names.len());
                at = settings_in(configured, &n).and_then(|s| s.parent().cloned());
                names.push(n);
            }
        }
        let nodes: Vec<crate::hierarchy::Node> = names
            .iter()
            .map(|n| {
                let s = settings_in(configured, n);
                let demand =
                    tracked.get(n).map_or(0.0, |g| g.clients.iter().map(|c| f64::from(c.demand)).sum());
                crate::hierarchy::Node {
                    parent: s.and_then(|s| s.parent()).and_then(|p| index.get(p).copied()),
                    limit: s.map_or(f64::INFINITY, |s| s.limit().as_f64()),
                    reserved: s.map_or(0.0, |s| s.reserved()),
                    demand,
                }
            })
            .collect();
        let bounds = crate::hierarchy::bounds(&nodes);
        self.nesting.clear();
        self.nesting.extend(names.into_iter().zip(bounds));
    }
}

/// How a change to the configured groups moved their parent links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    /// A group now names a parent.
    Linked,
    /// A group that named a parent no longer does (or is gone).
    Unlinked,
    /// No link changed.
    Same,
}
