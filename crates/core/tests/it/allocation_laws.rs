//! The laws capacity allocation and the token bucket must keep, checked on random inputs.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_model::allocate::{Claim, allocate};
use tollgate_model::bucket::Bucket;
use tollgate_model::settings::Priority;
use tollgate_model::time::Nanos;

const EPS: f64 = 1e-6;

fn claim() -> impl Strategy<Value = Claim> {
    (
        0.0..1000.0f64,
        prop_oneof![Just(f64::INFINITY), 0.0..3000.0f64],
        prop_oneof![Just(1u8), Just(8), Just(16), 1u8..=16],
        0.1..10.0f64,
        prop_oneof![Just(f64::INFINITY), 0.0..3000.0f64],
    )
        .prop_map(|(reserved, extra, level, weight, demand)| Claim {
            reserved,
            ceiling: reserved + extra,
            priority: Priority::new(level).unwrap(),
            weight,
            demand,
        })
}

proptest! {
    #[test]
    fn a_group_demanding_its_reservation_gets_at_least_it(
        capacity in 1.0..5000.0f64,
        claims in prop::collection::vec(claim(), 1..8),
    ) {
        let got = allocate(capacity, &claims);
        for (c, a) in claims.iter().zip(&got) {
            if c.demand >= c.reserved {
                prop_assert!(*a >= c.reserved - EPS, "{c:?} got {a}");
            }
        }
    }

    #[test]
    fn no_allowance_exceeds_its_ceiling(
        capacity in 1.0..5000.0f64,
        claims in prop::collection::vec(claim(), 1..8),
    ) {
        let got = allocate(capacity, &claims);
        for (c, a) in claims.iter().zip(&got) {
            prop_assert!(*a <= c.ceiling + EPS, "{c:?} got {a}");
            prop_assert!(*a >= 0.0);
        }
    }

    #[test]
    fn allowances_stay_within_capacity_unless_reservations_alone_exceed_it(
        capacity in 1.0..5000.0f64,
        claims in prop::collection::vec(claim(), 1..8),
    ) {
        let got = allocate(capacity, &claims);
        let total: f64 = got.iter().sum();
        let reserved: f64 = claims.iter().map(|c| c.reserved.min(c.demand).min(c.ceiling)).sum();
        if reserved <= capacity {
            prop_assert!(total <= capacity + EPS, "total {total} > capacity {capacity}");
        } else {
            prop_assert!((total - reserved).abs() < EPS, "total {total}, reserved {reserved}");
        }
    }

    #[test]
    fn equal_groups_with_equal_demand_get_equal_shares(
        capacity in 1.0..5000.0f64,
        twin in claim(),
        others in prop::collection::vec(claim(), 0..6),
    ) {
        let mut claims = others;
        claims.push(twin);
        claims.insert(0, twin);
        let got = allocate(capacity, &claims);
        let (a, b) = (got[0], got[got.len() - 1]);
        prop_assert!((a - b).abs() < EPS * capacity.max(1.0), "{a} vs {b}");
    }

    #[test]
    fn work_conserving_when_demand_exceeds_capacity(
        capacity in 1.0..5000.0f64,
        claims in prop::collection::vec(claim(), 1..8),
    ) {
        // With no ceiling in the way, hungry groups together use the whole capacity.
        let claims: Vec<Claim> = claims
            .into_iter()
            .map(|c| Claim { ceiling: f64::INFINITY, demand: f64::INFINITY, ..c })
            .collect();
        let total: f64 = allocate(capacity, &claims).iter().sum();
        let reserved: f64 = claims.iter().map(|c| c.reserved).sum();
        prop_assert!((total - capacity.max(reserved)).abs() < 1e-6 * capacity.max(reserved));
    }

    #[test]
    fn a_bucket_never_admits_more_than_burst_plus_rate_times_time(
        rate in 1.0..10_000.0f64,
        burst_s in 0.01..2.0f64,
        steps in prop::collection::vec((0u64..50_000_000, 0.0..50.0f64), 1..300),
    ) {
        let burst = (rate * burst_s).max(50.0);
        let bucket = Bucket::new(rate, burst, Nanos(0));
        let mut now = 0u64;
        let mut admitted = 0.0;
        for (dt, cost) in steps {
            now += dt;
            if bucket.try_acquire(cost, Nanos(now)).is_ok() {
                admitted += cost;
            }
            let bound = burst + rate * now as f64 / 1e9;
            prop_assert!(admitted <= bound + 1e-6, "admitted {admitted} > {bound}");
        }
    }

    #[test]
    fn a_refused_request_is_admitted_after_its_retry_after(
        rate in 1.0..10_000.0f64,
        costs in prop::collection::vec(0.1..10.0f64, 1..100),
    ) {
        let bucket = Bucket::new(rate, 10.0, Nanos(0));
        let mut now = Nanos(0);
        for cost in costs {
            match bucket.try_acquire(cost, now) {
                Ok(()) => {}
                Err(tollgate_model::bucket::Refusal::Wait(d)) => {
                    now = now.after(d);
                    prop_assert!(bucket.try_acquire(cost, now).is_ok());
                    // …and not a whole nanosecond-step earlier than it said.
                    prop_assert!(d > Duration::ZERO);
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
