//! Requests counted by class: per group, what was admitted and refused of its critical,
//! normal and sheddable requests. A group is counted from the first report that carries a
//! critical or sheddable request; groups that never see one cost nothing here.

use std::collections::HashMap;

use super::{ClientReport, FixedHasher};
use crate::settings::GroupName;

/// A group's requests admitted and refused by class: critical, normal and sheddable, each
/// `[admitted, refused]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassTotals(pub [[u64; 2]; 3]);

impl ClassTotals {
    /// Adds a report's counts: its critical and sheddable ones as sent, normal the rest.
    fn add(&mut self, r: &ClientReport) {
        let [critical, sheddable] = r.classes;
        let all = [r.requests.max(0.0) as u64, r.throttled.max(0.0) as u64];
        for k in 0..2 {
            self.0[0][k] += critical[k];
            self.0[2][k] += sheddable[k];
            self.0[1][k] += all[k].saturating_sub(critical[k] + sheddable[k]);
        }
    }
}

/// Each counted group's totals since it was first counted.
#[derive(Debug, Default)]
pub(super) struct Classes(HashMap<GroupName, ClassTotals, FixedHasher>);

impl Classes {
    /// Counts a report on `group`: from its first critical or sheddable request on.
    pub(super) fn count(&mut self, group: &GroupName, r: &ClientReport) {
        if r.classes != [[0; 2]; 2] || self.0.contains_key(group) {
            self.0.entry(group.clone()).or_default().add(r);
        }
    }

    /// `group`'s totals, once it is counted.
    pub(super) fn of(&self, group: &GroupName) -> Option<ClassTotals> {
        self.0.get(group).copied()
    }

    /// Forgets the groups `gone` says are gone.
    pub(super) fn forget(&mut self, gone: impl Fn(&GroupName) -> bool) {
        self.0.retain(|name, _| !gone(name));
    }
}
