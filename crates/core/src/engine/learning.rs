//! The learning lease: the time after a controller may have lost track of grants it (or the
//! controller before it) gave, while clients may still hold them.
//!
//! A grant lives for one lease. A controller that starts again soon after it last served, that
//! becomes the leader, or that takes over a shard cannot know what the clients of the groups
//! concerned hold until every one of them has reported, and a client cut off by a partition
//! may not report at all before its grant runs out. So for one lease, in the groups concerned,
//! no client is granted more than it says it holds (the rule of Doorman's learning mode): the
//! live grants of such a group never add up to more than the grants the lost state had given,
//! which were within the target. A client that holds nothing gets nothing until the lease
//! ends; groups that had no traffic before are not concerned, so a new tenant is served at
//! once.

use std::collections::{HashMap, HashSet};

use super::split::ClientId;
use crate::settings::GroupName;
use crate::shard::shard_of;
use crate::time::Nanos;

/// Which groups a learning lease covers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Relearn {
    /// Every group: a new leader, which does not know which groups the last one served.
    All,
    /// These groups: a controller started again over a store that says which groups had
    /// traffic lately.
    Groups(Vec<GroupName>),
    /// Every group, each client held to the grant it has now: a leader that lost its store
    /// (etcd) and goes on renewing what it gave, never more, while no other can be elected.
    Held,
    /// The groups of these shards (of `count`, by their tree's root): an owner given shards another owner served.
    Shards {
        /// How many shards the groups are spread over.
        count: u16,
        /// The shards taken over.
        taken: Vec<u16>,
    },
}

/// How many learning leases may be under way at once; a further one covers every group.
const LEASES_MAX: usize = 16;

#[derive(Debug, Clone)]
enum Scope {
    All,
    /// Every group, held by a leader riding out an etcd outage: not a lease it must learn
    /// before it is ready, as the others are.
    Held,
    Groups(HashSet<GroupName>),
    Shards {
        count: u16,
        taken: HashSet<u16>,
    },
}

impl Scope {
    fn covers(&self, group: &GroupName, root: &GroupName) -> bool {
        match self {
            Scope::All | Scope::Held => true,
            Scope::Groups(g) => g.contains(group),
            Scope::Shards { count, taken } => taken.contains(&shard_of(root.as_str(), *count)),
        }
    }
}

/// When the engine began, the learning leases under way, and what the clients of the groups
/// they cover said they hold (kept only while a lease is under way).
#[derive(Debug, Clone, Default)]
pub(crate) struct Learning {
    began: Option<Nanos>,
    leases: Vec<(Nanos, Scope)>,
    held: HashMap<(GroupName, ClientId), f32>,
}

impl Learning {
    /// Notes that the engine is at work at `now` (the first time: when it began).
    #[inline]
    pub(crate) fn touch(&mut self, now: Nanos) {
        self.began.get_or_insert(now);
    }

    /// When the engine began, if it has.
    pub(crate) fn began(&self) -> Option<Nanos> {
        self.began
    }

    /// Starts a lease from `now` to `until` over `which` groups.
    pub(crate) fn start(&mut self, now: Nanos, until: Nanos, which: Relearn) {
        self.touch(now);
        self.leases.retain(|(end, _)| now < *end);
        if matches!(which, Relearn::Held) {
            // One hold, renewed: its end moves on.
            let end = self
                .leases
                .iter()
                .filter(|(_, s)| matches!(s, Scope::Held))
                .map(|(e, _)| *e)
                .fold(until, Nanos::max);
            self.leases.retain(|(_, s)| !matches!(s, Scope::Held));
            self.leases.push((end, Scope::Held));
            return;
        }
        let scope = match which {
            Relearn::Groups(g) if g.is_empty() => return,
            Relearn::Shards { taken, .. } if taken.is_empty() => return,
            _ if self.leases.len() >= LEASES_MAX => Scope::All,
            Relearn::All | Relearn::Held => Scope::All,
            Relearn::Groups(g) => Scope::Groups(g.into_iter().collect()),
            Relearn::Shards { count, taken } => Scope::Shards { count, taken: taken.into_iter().collect() },
        };
        if matches!(scope, Scope::All) {
            let end = self.leases.iter().map(|(e, _)| *e).fold(until, Nanos::max);
            self.leases = vec![(end, Scope::All)];
        } else {
            self.leases.push((until, scope));
        }
    }

    /// Forgets the leases over at `now` (and, with the last, what clients said they hold).
    pub(crate) fn expire(&mut self, now: Nanos) {
        if !self.leases.is_empty() {
            self.leases.retain(|(end, _)| now < *end);
            if self.leases.is_empty() {
                self.held = HashMap::new();
            }
        }
    }

    /// Notes that `client` said at `now` it holds a grant of `held` units/s in `group` (of the
    /// tree whose root is `root`), if the group is learning. Bounded by the engine's clients
    /// and groups: one entry per (client, group) it tracks.
    #[inline]
    pub(crate) fn note_held(
        &mut self,
        now: Nanos,
        group: &GroupName,
        root: &GroupName,
        client: ClientId,
        held: f64,
    ) {
        if self.covers(now, group, root) {
            self.held.insert((group.clone(), client), held.max(0.0) as f32);
        }
    }

    /// Notes that `client` holds `held` units/s in `group` now (infinite: unbounded), whatever
    /// it says next: what a leader holding its grants ([`Relearn::Held`]) gave it.
    pub(crate) fn seed(&mut self, group: &GroupName, client: ClientId, held: f64) {
        if self.active() {
            self.held.insert((group.clone(), client), held.max(0.0) as f32);
        }
    }

    /// What `client` last said it holds in learning `group` (0 when it has not said).
    pub(crate) fn held(&self, group: &GroupName, client: ClientId) -> f64 {
        if self.held.is_empty() {
            return 0.0;
        }
        self.held.get(&(group.clone(), client)).map_or(0.0, |h| f64::from(*h))
    }

    /// Whether a lease is kept (under way, or over but not yet expired): else nothing is
    /// learning and nothing need be looked at.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        !self.leases.is_empty()
    }

    /// Whether any lease is under way at `now`.
    #[inline]
    pub(crate) fn any(&self, now: Nanos) -> bool {
        self.leases.iter().any(|(end, _)| now < *end)
    }

    /// When the last lease under way at `now` ends, but for a leader's hold on its grants
    /// ([`Relearn::Held`]), which is no relearning.
    pub(crate) fn ends(&self, now: Nanos) -> Option<Nanos> {
        let learnt = self.leases.iter().filter(|(_, s)| !matches!(s, Scope::Held));
        learnt.map(|(end, _)| *end).filter(|end| now < *end).max()
    }

    /// Whether `group` (of the tree whose root is `root`) is learning at `now`: no client of
    /// it gets more than it holds.
    #[inline]
    pub(crate) fn covers(&self, now: Nanos, group: &GroupName, root: &GroupName) -> bool {
        !self.leases.is_empty() && self.leases.iter().any(|(end, s)| now < *end && s.covers(group, root))
    }
}

/// A client's grant in a learning group: no more than it holds, its burst in proportion.
#[inline]
pub(crate) fn at_most_held(rate: f64, burst: f64, held: f64) -> (f64, f64) {
    let held = held.max(0.0);
    if rate <= held {
        return (rate, burst);
    }
    let burst = if rate > 0.0 && rate.is_finite() { burst * held / rate } else { held };
    (held, burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    #[test]
    fn a_lease_covers_its_groups_until_it_ends() {
        let mut l = Learning::default();
        assert!(!l.any(Nanos(0)));
        l.start(Nanos(0), Nanos(10), Relearn::Groups(vec![name("a")]));
        assert!(l.covers(Nanos(5), &name("a"), &name("a")));
        assert!(!l.covers(Nanos(5), &name("b"), &name("b")));
        assert!(!l.covers(Nanos(10), &name("a"), &name("a")));
        l.start(Nanos(5), Nanos(15), Relearn::All);
        assert!(l.covers(Nanos(12), &name("b"), &name("b")));
        assert_eq!(l.ends(Nanos(12)), Some(Nanos(15)));
        l.expire(Nanos(15));
        assert!(!l.any(Nanos(15)));
        // Nothing to learn: no lease.
        l.start(Nanos(20), Nanos(30), Relearn::Groups(Vec::new()));
        assert!(!l.any(Nanos(21)));
    }

    #[test]
    fn a_hold_covers_every_group_renewed_as_one_and_is_no_relearning() {
        let mut l = Learning::default();
        for t in 0..40 {
            l.start(Nanos(t), Nanos(t + 10), Relearn::Held);
        }
        assert_eq!(l.leases.len(), 1, "renewed, not stacked");
        assert!(l.covers(Nanos(45), &name("any"), &name("any")));
        assert_eq!(l.ends(Nanos(45)), None, "a hold is no relearning: the leader is ready");
        l.start(Nanos(45), Nanos(55), Relearn::All);
        assert_eq!(l.ends(Nanos(46)), Some(Nanos(55)));
    }

    #[test]
    fn shards_taken_over_are_learnt_and_the_others_not() {
        let mut l = Learning::default();
        let a = name("tenant-a");
        let shard = shard_of(a.as_str(), 8);
        l.start(Nanos(0), Nanos(10), Relearn::Shards { count: 8, taken: vec![shard] });
        assert!(l.covers(Nanos(1), &a, &a));
        let other =
            (0..100).map(|i| name(&format!("t{i}"))).find(|g| shard_of(g.as_str(), 8) != shard).unwrap();
        assert!(!l.covers(Nanos(1), &other, &other));
    }

    #[test]
    fn a_grant_is_cut_to_what_is_held_with_its_burst() {
        assert_eq!(at_most_held(100.0, 50.0, 200.0), (100.0, 50.0));
        assert_eq!(at_most_held(100.0, 50.0, 40.0), (40.0, 20.0));
        assert_eq!(at_most_held(100.0, 50.0, 0.0), (0.0, 0.0));
        assert_eq!(at_most_held(f64::INFINITY, f64::INFINITY, 5.0), (5.0, 5.0));
    }
}
