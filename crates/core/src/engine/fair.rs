//! Saturation that cuts the busiest first.
//!
//! FoundationDB's rate law scales every group busy on a saturated backend by the backend's
//! ratio: the load the backend can sustain is found, but it is divided in proportion to what
//! each group happened to send, so a tenant asking a quarter of the capacity is cut as hard
//! as one asking double. The sustainable load is a pool to share, not a cut to spread.
//!
//! Per saturated backend, this part takes the rate law's limiting rates of the groups it
//! limits (the backend whose zone gave each group its ratio) and adds them up: the **pool**,
//! the backend's ratio times the load those groups put on it, which is what it can sustain.
//! The pool is then shared by [`allocate`] over what the groups ask (their settled demand):
//! reservations first, then by priority, max-min by weight within one. A group asking less
//! than its fair share gets all it asks and is **not limited** by the backend at all
//! (FoundationDB limits only its busiest tags); the others share the rest, each limited at its
//! allocation, which is below what the rate law alone would have left it only for the
//! busiest.
//!
//! When the groups ask no more than the pool (their demand is below the load the backend
//! reports, for instance while demand and the backend's units disagree), there is nothing to
//! share out of the ordinary: the rate law's cut stands, so a saturated backend is always
//! relieved.

use crate::allocate::{Claim, allocate};

/// A group the rate law limits at a tick, as this part needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limited {
    /// Its row in the tick.
    pub(crate) row: u32,
    /// The saturated backend that limits it, by its place among the tick's backends.
    pub(crate) backend: u32,
    /// The rate law's limiting rate, units/s.
    pub(crate) limiting: f64,
    /// What it claims: its demand, reservation, cap, priority and weight.
    pub(crate) claim: Claim,
}

/// The limiting rate of each group in `limited` once each backend's pool is shared, by row in
/// increasing order: `None` for a group that asks less than its share (no longer limited).
/// Groups of a backend whose pool covers what they all ask keep the rate law's rates and are
/// left out. `limited` is reordered.
pub(crate) fn share_pools(limited: &mut [Limited]) -> Vec<(u32, Option<f64>)> {
    limited.sort_unstable_by_key(|l| (l.backend, l.row));
    let mut out = Vec::new();
    let mut claims = Vec::new();
    for one in limited.chunk_by(|a, b| a.backend == b.backend) {
        let pool: f64 = one.iter().map(|l| l.limiting).sum();
        let asked: f64 = one.iter().map(|l| wanted(&l.claim)).sum();
        if !(pool.is_finite() && asked > pool) {
            continue;
        }
        claims.clear();
        claims.extend(one.iter().map(|l| l.claim));
        let shares = allocate(pool, &claims);
        for (l, share) in one.iter().zip(shares) {
            let met = share >= wanted(&l.claim) * (1.0 - 1e-9);
            out.push((l.row, (!met).then_some(share)));
        }
    }
    out.sort_unstable_by_key(|(row, _)| *row);
    out
}

/// What a claim asks of a pool: its demand within its ceiling, and at least its reservation.
fn wanted(c: &Claim) -> f64 {
    c.demand.min(c.ceiling).max(c.reserved.min(c.ceiling)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Priority;

    fn limited(row: u32, backend: u32, limiting: f64, demand: f64) -> Limited {
        Limited {
            row,
            backend,
            limiting,
            claim: Claim {
                reserved: 0.0,
                ceiling: f64::INFINITY,
                priority: Priority::MEDIUM,
                weight: 1.0,
                demand,
            },
        }
    }

    #[test]
    fn a_small_tenant_is_not_cut_and_the_busiest_takes_the_rest() {
        // A backend at 1.78× its capacity of 1,000: the rate law cuts both by 56 %.
        let r = 1.0 / 1.78;
        let mut groups = [limited(0, 0, 250.0 * r, 250.0), limited(1, 0, 1530.0 * r, 2000.0)];
        let got = share_pools(&mut groups);
        assert_eq!(got[0], (0, None), "the small tenant asks less than its share");
        let (row, Some(busy)) = got[1] else { panic!("the busiest is limited: {got:?}") };
        assert_eq!(row, 1);
        assert!((busy - (1780.0 * r - 250.0)).abs() < 1e-6, "{busy}");
    }

    #[test]
    fn equal_askers_share_equally_and_backends_share_apart() {
        let mut groups = [
            limited(3, 1, 300.0, 2000.0),
            limited(0, 0, 600.0, 900.0),
            limited(2, 0, 200.0, 900.0),
            limited(1, 1, 100.0, 2000.0),
        ];
        let got = share_pools(&mut groups);
        assert_eq!(got, vec![(0, Some(400.0)), (1, Some(200.0)), (2, Some(400.0)), (3, Some(200.0))]);
    }

    #[test]
    fn a_pool_that_covers_every_ask_leaves_the_rate_law_alone() {
        let mut groups = [limited(0, 0, 600.0, 100.0), limited(1, 0, 300.0, 100.0)];
        assert!(share_pools(&mut groups).is_empty());
    }

    #[test]
    fn weights_and_priorities_divide_the_pool() {
        let mut heavy = limited(0, 0, 500.0, 5000.0);
        heavy.claim.weight = 3.0;
        let light = limited(1, 0, 500.0, 5000.0);
        let got = share_pools(&mut [heavy, light]);
        assert_eq!(got, vec![(0, Some(750.0)), (1, Some(250.0))]);
        let mut high = limited(0, 0, 500.0, 800.0);
        high.claim.priority = Priority::HIGH;
        let got = share_pools(&mut [high, limited(1, 0, 500.0, 5000.0)]);
        assert_eq!(got, vec![(0, None), (1, Some(200.0))]);
    }
}
