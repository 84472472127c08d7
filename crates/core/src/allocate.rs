//! Capacity allocation: how a node's capacity is divided among groups.
//!
//! Given a capacity in units/s and each group's settings and demand, [`allocate`] gives each
//! group an allowance (Couchbase's reserved-plus-free-pool node, TiDB's resource groups):
//!
//! 1. **Reserved first**: each group gets its `reserved` rate, capped by its demand (a
//!    reservation nobody is using is lent out rather than wasted) and by its ceiling.
//! 2. **The free pool by priority**: what is left of the capacity goes to the highest
//!    priority first, then the next, each group up to its demand and its ceiling.
//! 3. **Max-min by weight** within one priority: the water level `L` with
//!    `Σ min(want_i, weight_i × L) = pool`, so small askers get all they ask and the rest
//!    share equally per unit of weight.
//! 4. **Headroom**: capacity nobody asked for is spread over every group by weight, up to
//!    its ceiling, so a group that starts asking finds room before the next allocation.
//!
//! No allowance exceeds a group's ceiling, and the allowances never add up to more than the
//! capacity unless the demanded reservations alone do. The laws are property tests in
//! `tests/it/allocation_laws.rs`.

use crate::settings::Priority;

/// How a node's free capacity is shared among groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocationMode {
    /// By priority, then max-min by weight ([`allocate`]), the rest spread as headroom
    /// (TiDB's resource groups).
    #[default]
    Share,
    /// First come, first served ([`first_come`]): Couchbase's free pool.
    Fcfs,
}

impl AllocationMode {
    /// The mode's name in settings (`share` or `fcfs`).
    pub fn name(self) -> &'static str {
        match self {
            AllocationMode::Share => "share",
            AllocationMode::Fcfs => "fcfs",
        }
    }

    /// Parses `share` or `fcfs`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "share" => Some(AllocationMode::Share),
            "fcfs" => Some(AllocationMode::Fcfs),
            _ => None,
        }
    }
}

/// One group's input to [`allocate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Units/s reserved.
    pub reserved: f64,
    /// Units/s the group may never exceed (its limit, or less during a ramp); may be infinite.
    pub ceiling: f64,
    /// Priority for the free pool.
    pub priority: Priority,
    /// Weight among groups of one priority; above 0.
    pub weight: f64,
    /// Units/s the group is asking for, admitted or not.
    pub demand: f64,
}

/// Each group's allowance in units/s, in the order of `claims`. See the
/// [module documentation](self).
///
/// ```
/// use tollgate_model::allocate::{allocate, Claim};
/// use tollgate_model::settings::Priority;
///
/// let hungry = |reserved| Claim {
///     reserved, ceiling: f64::INFINITY, priority: Priority::MEDIUM, weight: 1.0, demand: 1e9,
/// };
/// // 1000 units/s: 600 and 200 reserved, the free 200 split evenly.
/// assert_eq!(allocate(1000.0, &[hungry(600.0), hungry(200.0)]), vec![700.0, 300.0]);
/// ```
pub fn allocate(capacity: f64, claims: &[Claim]) -> Vec<f64> {
    let mut allowance: Vec<f64> =
        claims.iter().map(|c| c.reserved.min(c.demand).min(c.ceiling).max(0.0)).collect();
    let mut pool = (capacity - allowance.iter().sum::<f64>()).max(0.0);

    // The priorities present, highest first: a slot per level, not a sort of every claim's.
    let mut present: [Option<Priority>; 256] = [None; 256];
    for c in claims {
        present[usize::from(c.priority.level())] = Some(c.priority);
    }
    let mut open = Vec::new();
    for priority in present.into_iter().rev().flatten() {
        if pool <= 0.0 {
            break;
        }
        pool -= water_fill(pool, &mut allowance, &mut open, |i, a| {
            let c = &claims[i];
            if c.priority == priority {
                ((c.demand.min(c.ceiling) - a).max(0.0), c.weight)
            } else {
                (0.0, 1.0)
            }
        });
    }

    if pool > 0.0 {
        water_fill(pool, &mut allowance, &mut open, |i, a| {
            ((claims[i].ceiling - a).max(0.0), claims[i].weight)
        });
    }
    assert_conserved(capacity, 0.0, claims, &allowance);
    allowance
}

/// Couchbase's free pool, first come first served: each group gets its reservation (its own
/// gauge in Couchbase, whether it asks or not, capped by its ceiling); the pool is the capacity
/// less `reserved_elsewhere` (the reservations of configured groups that are not among the
/// claims: Couchbase counts every reservation, active or not) and less the claims'
/// reservations; it goes to the groups in `order` (the order they first asked), each up to
/// its demand and ceiling. What nobody asked for goes, in the same order, up to each ceiling,
/// so the first group to ask finds room before the next allocation.
///
/// ```
/// use tollgate_model::allocate::{first_come, Claim};
/// use tollgate_model::settings::Priority;
///
/// let c = |reserved, demand| Claim {
///     reserved, ceiling: f64::INFINITY, priority: Priority::MEDIUM, weight: 1.0, demand,
/// };
/// // 100 units/s, 10 reserved each; the first to ask takes the free 80 it asks for.
/// assert_eq!(first_come(100.0, 0.0, &[c(10.0, 500.0), c(10.0, 500.0)], &[0, 1]), vec![90.0, 10.0]);
/// ```
pub fn first_come(capacity: f64, reserved_elsewhere: f64, claims: &[Claim], order: &[usize]) -> Vec<f64> {
    let mut out: Vec<f64> = claims.iter().map(|c| c.reserved.min(c.ceiling).max(0.0)).collect();
    let mut pool = (capacity - reserved_elsewhere - out.iter().sum::<f64>()).max(0.0);
    for &i in order {
        let want = (claims[i].demand.min(claims[i].ceiling) - out[i]).max(0.0);
        let give = want.min(pool);
        out[i] += give;
        pool -= give;
    }
    for &i in order {
        if pool <= 0.0 {
            break;
        }
        let give = (claims[i].ceiling - out[i]).max(0.0).min(pool);
        out[i] += give;
        pool -= give;
    }
    assert_conserved(capacity, reserved_elsewhere, claims, &out);
    out
}

/// Capacity conservation, where the shares are made: they add up to no more than the capacity
/// (less what is reserved elsewhere), beyond what the reservations force, and none passes its
/// claim's ceiling. Checked in every build: a tick makes the shares once, in time linear in
/// the claims.
fn assert_conserved(capacity: f64, reserved_elsewhere: f64, claims: &[Claim], shares: &[f64]) {
    let forced: f64 = claims.iter().map(|c| c.reserved.min(c.ceiling).max(0.0)).sum();
    let total: f64 = shares.iter().sum();
    let bound = (capacity - reserved_elsewhere).max(forced).max(0.0);
    assert!(
        total <= bound * (1.0 + 1e-9) + 1e-6 || !total.is_finite(),
        "shares add up to {total}, past the capacity {capacity} (reservations force {forced})"
    );
    assert!(
        shares.iter().zip(claims).all(|(s, c)| *s <= c.ceiling * (1.0 + 1e-9) + 1e-9),
        "a share past its ceiling"
    );
}

/// A want in a water fill: how much it wants per unit of weight (the level at which it is
/// met), how much it wants and its weight.
#[derive(Debug, Clone, Copy)]
struct Want {
    per_weight: f64,
    want: f64,
    weight: f64,
}

/// Shares `amount` max-min fairly by weight over the wants `want(i, allowance[i])` gives,
/// `(want, weight)` for each `i` (a want of 0 or less takes no part), adding each share to
/// `allowance[i]`. Wants may be infinite. Returns how much was given. `open` is room to work
/// in, kept by the caller from one fill to the next (at 100,000 groups fresh lists cost page
/// faults).
///
/// The water level `L` solves `Σ min(want_i, weight_i × L) = amount`: the wants at or below
/// `L` per unit of weight are met, the others get `weight × L`. It is found by halving the
/// wants still undecided around their median (a selection, linear in the number of wants,
/// where sorting them all took most of a tick's sharing at 100,000 groups), and not at all
/// when the amount covers every want.
fn water_fill(
    amount: f64,
    allowance: &mut [f64],
    open: &mut Vec<Want>,
    want: impl Fn(usize, f64) -> (f64, f64),
) -> f64 {
    open.clear();
    open.extend(allowance.iter().enumerate().filter_map(|(i, &a)| {
        let (want, weight) = want(i, a);
        (want > 0.0).then(|| Want { per_weight: want / weight, want, weight })
    }));
    let total: f64 = open.iter().map(|w| w.want).sum();
    // The level, and whether every want is met.
    let level = if total <= amount {
        f64::INFINITY
    } else {
        // `open[..met]` are met, `open[capped..]` get weight × level, the rest are undecided.
        let (mut met, mut capped) = (0, open.len());
        // The amount less what the met wants take, and the weight of the capped ones.
        let (mut left, mut capped_weight) = (amount, 0.0);
        while met < capped {
            let undecided = &mut open[met..capped];
            let mid = undecided.len() / 2;
            let (below, pivot, above) =
                undecided.select_nth_unstable_by(mid, |a, b| a.per_weight.total_cmp(&b.per_weight));
            let p = pivot.per_weight;
            // At level p the median and those below it are met (the ones above it that equal
            // it too: their want is weight × p), the rest take weight × p.
            let met_here: f64 = below.iter().map(|w| w.want).sum::<f64>() + pivot.want;
            let above_weight: f64 = above.iter().map(|w| w.weight).sum();
            if met_here + p * (above_weight + capped_weight) <= left {
                // The level is at p or above.
                left -= met_here;
                met += mid + 1;
            } else {
                capped_weight += above_weight + pivot.weight;
                capped = met + mid;
            }
        }
        if capped_weight > 0.0 { (left / capped_weight).max(0.0) } else { f64::INFINITY }
    };
    // Given in the allowances' own order (written in turn, not at random): met at or below
    // the level, capped above it; a want exactly at the level is met either way.
    let mut given = 0.0;
    for (i, a) in allowance.iter_mut().enumerate() {
        let (want, weight) = want(i, *a);
        if want > 0.0 {
            let share = if want.is_finite() && want / weight <= level { want } else { weight * level };
            *a += share;
            given += share;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(reserved: f64, ceiling: f64, priority: Priority, weight: f64, demand: f64) -> Claim {
        Claim { reserved, ceiling, priority, weight, demand }
    }

    /// The water fill by sorting every want (how it was first written): the reference the
    /// selection must agree with.
    fn sorted_water_fill(amount: f64, wants: &[(usize, f64, f64)], allowance: &mut [f64]) -> f64 {
        let mut order: Vec<(f64, usize, f64, f64)> = wants
            .iter()
            .filter(|w| w.1 > 0.0)
            .map(|&(i, want, weight)| (want / weight, i, want, weight))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut left, mut weight_left, mut given) = (amount, order.iter().map(|w| w.3).sum::<f64>(), 0.0);
        for (n, &(per_weight, i, want, weight)) in order.iter().enumerate() {
            let level = left / weight_left;
            if per_weight > level {
                for &(_, j, _, w) in &order[n..] {
                    allowance[j] += w * level;
                    given += w * level;
                }
                return given;
            }
            allowance[i] += want;
            left -= want;
            given += want;
            weight_left -= weight;
        }
        given
    }

    fn want() -> impl proptest::strategy::Strategy<Value = (f64, f64)> {
        use proptest::prelude::*;
        (
            // Few distinct values among many: ties at the level and around the median.
            prop_oneof![Just(0.0), Just(10.0), Just(f64::INFINITY), 0.0..1000.0f64, 1.0..3.0f64],
            prop_oneof![Just(1.0), Just(2.0), 0.1..10.0f64],
        )
    }

    proptest::proptest! {
        #[test]
        fn the_water_fill_by_selection_gives_what_sorting_gave(
            amount in proptest::prop_oneof![0.0..100.0f64, 0.0..100_000.0f64],
            wants in proptest::collection::vec(want(), 0..300),
        ) {
            let wants: Vec<(usize, f64, f64)> = wants.iter().enumerate().map(|(i, &(w, g))| (i, w, g)).collect();
            let (mut got, mut expected) = (vec![0.0; wants.len()], vec![0.0; wants.len()]);
            let given = water_fill(amount, &mut got, &mut Vec::new(), |i, _| (wants[i].1, wants[i].2));
            let reference = sorted_water_fill(amount, &wants, &mut expected);
            let tolerance = 1e-9 * amount.max(1.0);
            proptest::prop_assert!((given - reference).abs() <= tolerance, "given {given}, sorting gave {reference}");
            for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
                proptest::prop_assert!((a - b).abs() <= tolerance, "want {i} {:?}: {a} against {b}", wants[i]);
            }
        }
    }

    #[test]
    fn a_water_fill_that_covers_every_want_meets_them_all() {
        let fill = |amount: f64, wants: &[(f64, f64)]| {
            let mut got = vec![0.0; wants.len()];
            let given = water_fill(amount, &mut got, &mut Vec::new(), |i, _| wants[i]);
            (given, got)
        };
        assert_eq!(fill(100.0, &[(10.0, 1.0), (0.0, 1.0), (30.0, 3.0)]), (40.0, vec![10.0, 0.0, 30.0]));
        // One infinite want: the level is what is left per unit of weight.
        assert_eq!(fill(100.0, &[(10.0, 1.0), (f64::INFINITY, 2.0)]), (100.0, vec![10.0, 90.0]));
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn reserved_then_max_min_over_demand() {
        let m = Priority::MEDIUM;
        let inf = f64::INFINITY;
        // 900 free: the small asker (100) gets all it asks, the two big ones share 800.
        let got = allocate(
            900.0,
            &[
                claim(0.0, inf, m, 1.0, 100.0),
                claim(0.0, inf, m, 1.0, 5000.0),
                claim(0.0, inf, m, 1.0, 5000.0),
            ],
        );
        assert!(close(&got, &[100.0, 400.0, 400.0]), "{got:?}");
    }

    #[test]
    fn higher_priority_is_served_first_and_limits_hold() {
        let got = allocate(
            1000.0,
            &[
                claim(100.0, 300.0, Priority::HIGH, 1.0, 5000.0),
                claim(100.0, f64::INFINITY, Priority::HIGH, 1.0, 400.0),
                claim(100.0, f64::INFINITY, Priority::LOW, 1.0, 5000.0),
            ],
        );
        // High: 300 (its limit) and 400 (its demand); low gets what is left: 300.
        assert!(close(&got, &[300.0, 400.0, 300.0]), "{got:?}");
    }

    #[test]
    fn weights_split_the_pool() {
        let m = Priority::MEDIUM;
        let got = allocate(
            1200.0,
            &[claim(0.0, f64::INFINITY, m, 1.0, 1e6), claim(0.0, f64::INFINITY, m, 3.0, 1e6)],
        );
        assert!(close(&got, &[300.0, 900.0]), "{got:?}");
    }

    #[test]
    fn unused_capacity_becomes_headroom_up_to_the_ceiling() {
        let m = Priority::MEDIUM;
        let got =
            allocate(1000.0, &[claim(0.0, 200.0, m, 1.0, 0.0), claim(0.0, f64::INFINITY, m, 1.0, 100.0)]);
        // Demand 100 is met; the 900 left is shared, the first group capped at 200.
        assert!(close(&got, &[200.0, 800.0]), "{got:?}");
    }

    #[test]
    fn reservations_hold_even_above_capacity() {
        let m = Priority::MEDIUM;
        let got = allocate(100.0, &[claim(80.0, 80.0, m, 1.0, 500.0), claim(80.0, 80.0, m, 1.0, 500.0)]);
        assert!(close(&got, &[80.0, 80.0]), "{got:?}");
    }
}
