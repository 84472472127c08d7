//! Hierarchical quotas: groups nested under parents (`acme` > `acme/search` > …).
//!
//! A group may name a parent. The parent's limit caps what its whole subtree is granted (its
//! own traffic and every descendant's); a child's reservation comes out of its parent's; and
//! what a child leaves unused goes first to its siblings, then up to its parent's siblings.
//!
//! Each tick the engine shares every tree out from its roots: a node's budget (its parent's
//! allotment to it, within its own limit) is split among its members, the node's own traffic
//! and each child's subtree, in three steps:
//!
//! 1. each member gets its reservation as far as it asks for it (a child's own; the node's
//!    own traffic what the node's reservation leaves after its children's): a reservation
//!    nobody uses is not held back from the others;
//! 2. what is left is water-filled over what each member still asks for (its subtree's
//!    demand, each level capped at its limit), so a member asking for little gets all of
//!    it and the others share the rest evenly;
//! 3. what nobody asks for is spread evenly as slack over the members still below their own
//!    limit, so a quiet child can start again at once.
//!
//! Every allotment is the member's cap for the tick: a child's subtree then splits its own
//! allotment the same way. The caps of a node's members add up to at most its budget, and no
//! member's cap passes its own limit or its parent's budget (checked by the property tests
//! below). Saturation, capacity and each group's own settings then bound each group's target
//! within its cap as for any group.

use std::collections::HashMap;

use crate::settings::{GroupName, GroupSettings, SettingError, is_pattern};

/// The deepest a group may sit below its root (`a` > `a/b` > … with this many levels).
pub const DEPTH_MAX: usize = 8;

/// One group of a tree, for [`bounds`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Node {
    /// Its parent, as an index into the same list (`None`: a root).
    pub parent: Option<usize>,
    /// Its limit, units/s (infinite: none).
    pub limit: f64,
    /// Its reservation, units/s.
    pub reserved: f64,
    /// What its own clients ask, units/s.
    pub demand: f64,
}

/// What the tree leaves a group for a tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The most its own traffic may be granted, units/s.
    pub cap: f64,
    /// Its reservation for its own traffic: what its reservation leaves after its children's.
    pub reserved: f64,
}

/// Every node's cap and reservation for its own traffic. `nodes` must form trees (every
/// parent an index of the list, no cycle): [`check`] makes sure of it for settings.
pub fn bounds(nodes: &[Node]) -> Vec<Bound> {
    let n = nodes.len();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        if let Some(p) = node.parent {
            children[p].push(i);
        }
    }
    // Children before parents: a node's subtree is asked after its children's are known.
    let order = post_order(nodes, &children);
    let mut want = vec![0.0; n];
    let mut kept = vec![0.0; n];
    for &i in &order {
        let below: f64 = children[i].iter().map(|&c| want[c]).sum();
        want[i] = (nodes[i].demand.max(0.0) + below).min(nodes[i].limit);
        let reserved_below: f64 = children[i].iter().map(|&c| nodes[c].reserved).sum();
        kept[i] = (nodes[i].reserved - reserved_below).max(0.0);
    }
    let mut out: Vec<Bound> =
        (0..n).map(|i| Bound { cap: nodes[i].limit, reserved: kept[i].min(nodes[i].limit) }).collect();
    let mut budget = vec![f64::INFINITY; n];
    for &i in order.iter().rev() {
        let node = &nodes[i];
        let b = budget[i].min(node.limit);
        // The node's own traffic first, then each child's subtree.
        let mut members =
            vec![Member { floor: kept[i], want: node.demand.max(0.0).min(node.limit), cap: node.limit }];
        members.extend(children[i].iter().map(|&c| Member {
            floor: nodes[c].reserved,
            want: want[c],
            cap: nodes[c].limit,
        }));
        let allotted = share(b, &members);
        out[i].cap = allotted[0];
        out[i].reserved = out[i].reserved.min(allotted[0]);
        for (&c, &a) in children[i].iter().zip(&allotted[1..]) {
            budget[c] = a;
        }
    }
    out
}

/// A member of a node's split: its reservation, what it asks and its own limit.
#[derive(Debug, Clone, Copy)]
struct Member {
    floor: f64,
    want: f64,
    cap: f64,
}

/// `budget` split among `members` (see the module documentation); infinite where the
/// budget is.
fn share(budget: f64, members: &[Member]) -> Vec<f64> {
    if budget.is_infinite() {
        return members.iter().map(|m| m.cap).collect();
    }
    let budget = budget.max(0.0);
    // 1. Reservations (scaled down together should they pass the budget).
    let floors: Vec<f64> = members.iter().map(|m| m.floor.min(m.want).min(m.cap).max(0.0)).collect();
    let reserved: f64 = floors.iter().sum();
    let scale = if reserved > budget && reserved > 0.0 { budget / reserved } else { 1.0 };
    let mut got: Vec<f64> = floors.iter().map(|f| f * scale).collect();
    let mut left = (budget - reserved * scale).max(0.0);
    // 2. What each still asks, water-filled; 3. the rest as slack, up to each limit.
    let asks: Vec<f64> = members.iter().zip(&got).map(|(m, g)| (m.want.min(m.cap) - g).max(0.0)).collect();
    left -= fill(&mut got, &asks, left);
    let room: Vec<f64> = members.iter().zip(&got).map(|(m, g)| (m.cap - g).max(0.0)).collect();
    fill(&mut got, &room, left);
    // Sums of shares may round a hair past a limit.
    for (g, m) in got.iter_mut().zip(members) {
        *g = g.min(m.cap);
    }
    got
}

/// Water-fills `amount` over `asks`, adding each share to `got`: every ask below the level
/// in full, the others the level. Returns what was given (less than `amount` only when
/// every ask is met).
fn fill(got: &mut [f64], asks: &[f64], amount: f64) -> f64 {
    let total: f64 = asks.iter().sum();
    if total <= amount {
        for (g, a) in got.iter_mut().zip(asks) {
            *g += a;
        }
        return total;
    }
    let mut sorted: Vec<f64> = asks.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (mut left, mut level) = (amount, 0.0);
    for (i, &a) in sorted.iter().enumerate() {
        let even = left / (sorted.len() - i) as f64;
        if a > even {
            level = even;
            break;
        }
        left -= a;
        level = a;
    }
    for (g, a) in got.iter_mut().zip(asks) {
        *g += a.min(level);
    }
    amount
}

/// The nodes in an order where every child comes before its parent.
fn post_order(nodes: &[Node], children: &[Vec<usize>]) -> Vec<usize> {
    let mut order = Vec::with_capacity(nodes.len());
    let mut stack: Vec<(usize, bool)> =
        (0..nodes.len()).filter(|&i| nodes[i].parent.is_none()).map(|i| (i, false)).collect();
    while let Some((i, expanded)) = stack.pop() {
        if expanded {
            order.push(i);
        } else {
            stack.push((i, true));
            stack.extend(children[i].iter().map(|&c| (c, false)));
        }
    }
    order
}

/// A nesting rule broken, by the group that breaks it.
#[derive(Debug, Clone, PartialEq)]
pub struct NestingError {
    /// The group whose setting breaks it.
    pub group: GroupName,
    /// Which setting, and the rule.
    pub error: SettingError,
}

/// Checks the parents of configured groups (patterns among them): every parent a configured
/// group (not a pattern, not the group itself), no cycle, at most [`DEPTH_MAX`] levels, and
/// no parent's children reserving more between them than it does. Every broken rule is
/// returned, each by the group that breaks it.
pub fn check<'a>(groups: impl IntoIterator<Item = (&'a GroupName, &'a GroupSettings)>) -> Vec<NestingError> {
    let groups: HashMap<&str, &GroupSettings> = groups.into_iter().map(|(n, s)| (n.as_str(), s)).collect();
    let mut errors = Vec::new();
    let mut broken = |group: &str, field: &str, rule: String| {
        errors.push(NestingError {
            group: GroupName::new(group).expect("a configured name"),
            error: SettingError::new(field, rule),
        });
    };
    let mut names: Vec<&str> = groups.keys().copied().collect();
    names.sort_unstable();
    let mut reserved_below: HashMap<&str, f64> = HashMap::new();
    for &name in &names {
        let Some(parent) = groups[name].parent() else { continue };
        let parent = parent.as_str();
        if parent == name {
            broken(name, "parent", "a group cannot be its own parent".into());
            continue;
        }
        if is_pattern(parent) {
            broken(name, "parent", format!("must name a group, not a pattern ({parent})"));
            continue;
        }
        if !groups.contains_key(parent) {
            broken(name, "parent", format!("no group named {parent:?}: create it first"));
            continue;
        }
        *reserved_below.entry(parent).or_default() += groups[name].reserved();
        // Up the chain: a cycle comes back to a name already on it.
        let mut chain = vec![name];
        let mut at = parent;
        loop {
            if chain.contains(&at) {
                chain.push(at);
                broken(name, "parent", format!("makes a cycle: {}", chain.join(" > ")));
                break;
            }
            chain.push(at);
            if chain.len() > DEPTH_MAX {
                broken(
                    name,
                    "parent",
                    format!("nests deeper than {DEPTH_MAX} levels: {} > …", chain.join(" > ")),
                );
                break;
            }
            match groups.get(at).and_then(|s| s.parent()) {
                Some(p) if groups.contains_key(p.as_str()) => at = p.as_str(),
                _ => break,
            }
        }
    }
    for (parent, below) in reserved_below {
        let own = groups[parent].reserved();
        if below > own * (1.0 + 1e-9) + 1e-9 {
            broken(
                parent,
                "reserved",
                format!(
                    "its children reserve {below} between them, more than its own {own}: a child's reservation comes out of its parent's"
                ),
            );
        }
    }
    errors.sort_by(|a, b| a.group.cmp(&b.group));
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INF: f64 = f64::INFINITY;

    fn node(parent: Option<usize>, limit: f64, reserved: f64, demand: f64) -> Node {
        Node { parent, limit, reserved, demand }
    }

    #[test]
    fn a_parents_limit_is_shared_by_what_its_children_ask() {
        // acme (100) > search asking 80, batch asking 80, and acme's own traffic asking 0.
        let b = bounds(&[
            node(None, 100.0, 0.0, 0.0),
            node(Some(0), INF, 0.0, 80.0),
            node(Some(0), INF, 0.0, 80.0),
        ]);
        assert_eq!([b[0].cap, b[1].cap, b[2].cap], [0.0, 50.0, 50.0]);
        // batch asks for 10 only: search takes what it leaves.
        // Of the 10 nobody asks for, each member gets a third as slack.
        let b = bounds(&[
            node(None, 100.0, 0.0, 0.0),
            node(Some(0), INF, 0.0, 80.0),
            node(Some(0), INF, 0.0, 10.0),
        ]);
        let slack = 10.0 / 3.0;
        assert_eq!([b[0].cap, b[1].cap, b[2].cap], [slack, 80.0 + slack, 10.0 + slack]);
    }

    #[test]
    fn reservations_nest_and_a_childs_limit_holds() {
        // acme (limit 100) reserves 60, 20 of it for search (limit 30); both ask for more.
        // acme's own traffic keeps 40 reserved and takes what search's limit leaves.
        let b = bounds(&[node(None, 100.0, 60.0, 100.0), node(Some(0), 30.0, 20.0, 100.0)]);
        assert_eq!(b[0].reserved, 40.0);
        assert_eq!(b[1].cap, 30.0);
        assert_eq!(b[0].cap, 70.0);
    }

    #[test]
    fn unused_share_goes_to_siblings_first_then_up() {
        // top (90) > a (limit 60) > {a1 asking 5, a2 asking 50}; top > b asking 60.
        let nodes = [
            node(None, 90.0, 0.0, 0.0),
            node(Some(0), 60.0, 0.0, 0.0),
            node(Some(1), INF, 0.0, 5.0),
            node(Some(1), INF, 0.0, 50.0),
            node(Some(0), INF, 0.0, 60.0),
        ];
        let b = bounds(&nodes);
        // a's subtree asks 55 and b 60 of 90: the level is 45. Within a's 45, a1 has its 5,
        // a2 the other 40.
        assert_eq!([b[2].cap, b[3].cap, b[4].cap], [5.0, 40.0, 45.0]);
    }

    #[test]
    fn nesting_rules_are_checked_by_name() {
        let g = |s: &str| GroupName::new(s).unwrap();
        let with = |parent: &str, reserved: f64| {
            GroupSettings::builder().parent(Some(g(parent))).reserved(reserved).build().unwrap()
        };
        let root = GroupSettings::builder().reserved(10.0).build().unwrap();
        let groups = vec![
            (g("a"), root.clone()),
            (g("a/x"), with("a", 8.0)),
            (g("a/y"), with("a", 8.0)),
            (g("self"), with("self", 0.0)),
            (g("lost"), with("nowhere", 0.0)),
            (g("p/*"), with("a", 0.0)),
            (g("q"), with("p/*", 0.0)),
            (g("c1"), with("c2", 0.0)),
            (g("c2"), with("c1", 0.0)),
        ];
        let errors = check(groups.iter().map(|(n, s)| (n, s)));
        let said: Vec<String> = errors.iter().map(|e| format!("{}: {}", e.group, e.error)).collect();
        assert_eq!(said.len(), 6, "{said:#?}");
        assert!(said[0].starts_with("a: reserved: its children reserve 16"), "{said:#?}");
        assert!(said[1].contains("c1: parent: makes a cycle: c1 > c2 > c1"), "{said:#?}");
        assert!(said[2].contains("c2: parent: makes a cycle"), "{said:#?}");
        assert!(said[3].contains("lost: parent: no group named \"nowhere\""), "{said:#?}");
        assert!(said[4].contains("q: parent: must name a group, not a pattern"), "{said:#?}");
        assert!(said[5].contains("self: parent: a group cannot be its own parent"), "{said:#?}");
        // Nine levels are one too many.
        let mut deep = vec![(g("l0"), GroupSettings::default())];
        for i in 1..=DEPTH_MAX {
            deep.push((g(&format!("l{i}")), with(&format!("l{}", i - 1), 0.0)));
        }
        let errors = check(deep.iter().map(|(n, s)| (n, s)));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].error.rule.contains("nests deeper than 8 levels"), "{errors:?}");
    }

    /// Random trees: each node's parent is an earlier node or none.
    fn any_tree() -> impl Strategy<Value = Vec<Node>> {
        proptest::collection::vec(
            (
                any::<prop::sample::Index>(),
                any::<bool>(),
                prop_oneof![Just(INF), 0.0..1000.0f64],
                0.0..100.0f64,
                0.0..1000.0f64,
            ),
            1..40,
        )
        .prop_map(|raw| {
            raw.iter()
                .enumerate()
                .map(|(i, &(p, root, limit, reserved, demand))| Node {
                    parent: (i > 0 && !root).then(|| p.index(i)),
                    limit,
                    reserved: reserved.min(limit),
                    demand,
                })
                .collect()
        })
    }

    proptest! {
        /// At every node its own cap and its children's subtrees' caps add up to at most its
        /// budget (its own limit, within its parent's allotment): conservation at each
        /// level, and no child above its parent.
        #[test]
        fn no_level_grants_more_than_its_budget(nodes in any_tree()) {
            let b = bounds(&nodes);
            // A subtree's caps added up, children before parents.
            let mut subtree: Vec<f64> = b.iter().map(|x| x.cap).collect();
            for i in (0..nodes.len()).rev() {
                if let Some(p) = nodes[i].parent {
                    subtree[p] += subtree[i];
                }
            }
            for (i, n) in nodes.iter().enumerate() {
                prop_assert!(b[i].cap <= n.limit, "node {i} capped at {} over its limit {}", b[i].cap, n.limit);
                prop_assert!(b[i].cap >= 0.0 && b[i].reserved <= b[i].cap + 1e-9);
                if n.limit.is_finite() {
                    prop_assert!(subtree[i] <= n.limit * (1.0 + 1e-9) + 1e-6,
                        "node {i}'s subtree has {} under a limit of {}", subtree[i], n.limit);
                }
                if let Some(p) = n.parent && nodes[p].limit.is_finite() {
                    prop_assert!(subtree[i] <= nodes[p].limit * (1.0 + 1e-9) + 1e-6);
                }
            }
        }

        /// Under a finite budget, a member asking no more than its even share gets all it
        /// asks: a child's unused share is not taken from one that needs it.
        #[test]
        fn a_modest_ask_is_met(budget in 1.0..1000.0f64, asks in proptest::collection::vec(0.0..500.0f64, 1..10)) {
            let members: Vec<Member> = asks.iter().map(|&a| Member { floor: 0.0, want: a, cap: INF }).collect();
            let got = share(budget, &members);
            let even = budget / asks.len() as f64;
            for (g, a) in got.iter().zip(&asks) {
                if *a <= even {
                    prop_assert!(*g >= a - 1e-9, "asked {a}, got {g} of {budget}");
                }
            }
            prop_assert!(got.iter().sum::<f64>() <= budget * (1.0 + 1e-12) + 1e-9);
        }
    }
}
