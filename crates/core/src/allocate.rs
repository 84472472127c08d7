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
//! `tests/allocation_laws.rs`.

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
/// use tollgate_core::allocate::{allocate, Claim};
/// use tollgate_core::settings::Priority;
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
    for priority in present.into_iter().rev().flatten() {
        if pool <= 0.0 {
            break;
        }
        let wants: Vec<(usize, f64, f64)> = claims
            .iter()
            .enumerate()
            .filter(|(_, c)| c.priority == priority)
            .map(|(i, c)| (i, (c.demand.min(c.ceiling) - allowance[i]).max(0.0), c.weight))
            .collect();
        pool -= water_fill(pool, &wants, &mut allowance);
    }

    if pool > 0.0 {
        let wants: Vec<(usize, f64, f64)> = claims
            .iter()
            .enumerate()
            .map(|(i, c)| (i, (c.ceiling - allowance[i]).max(0.0), c.weight))
            .collect();
        water_fill(pool, &wants, &mut allowance);
    }
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
/// use tollgate_core::allocate::{first_come, Claim};
/// use tollgate_core::settings::Priority;
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
    out
}

/// Shares `amount` over `(index, want, weight)` max-min fairly by weight, adding each share
/// to `allowance[index]`. Wants may be infinite. Returns how much was given.
fn water_fill(amount: f64, wants: &[(usize, f64, f64)], allowance: &mut [f64]) -> f64 {
    // Each want per unit of weight worked out once, beside it: the sort compares plain keys.
    let mut order: Vec<(f64, usize, f64, f64)> = wants
        .iter()
        .filter(|w| w.1 > 0.0)
        .map(|&(i, want, weight)| (want / weight, i, want, weight))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut left = amount;
    let mut weight_left: f64 = order.iter().map(|w| w.3).sum();
    let mut given = 0.0;
    for (n, &(per_weight, i, want, weight)) in order.iter().enumerate() {
        let level = left / weight_left;
        if per_weight <= level {
            allowance[i] += want;
            left -= want;
            given += want;
            weight_left -= weight;
        } else {
            // Everyone from here on wants more than the level: each gets weight × level.
            for &(_, j, _, w) in &order[n..] {
                allowance[j] += w * level;
                given += w * level;
            }
            return given;
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
