//! Each group's share of its limit on this backend, as the controller answers the backend's
//! reports (TiDB's per-node quotas, balanced toward where each group's data lives), with
//! node-level burst: a backend with nothing waiting lends a group capacity past its share, up
//! to its ceiling (its limit less what the other backends serve of it).
//!
//! A [`Scheduler`](crate::scheduler::Scheduler) given to a
//! [`BackendReporter`](crate::reporter::BackendReporter) keeps them here. A request of a
//! group with a share takes from the share's bucket (one second of it); past it, on an idle
//! backend, from the ceiling's; else it waits for the share's refill, as a `backend_limit`
//! request does. The group's weight in the fair queue follows its share here.

use std::collections::HashMap;
use std::time::Duration;

use tollgate_model::bucket::{Bucket, Refusal};
use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;
use tollgate_proto::v1;

/// A group's share on this backend, as the scheduler holds it ([`Scheduler::shares`]).
///
/// [`Scheduler::shares`]: crate::scheduler::Scheduler::shares
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeShare {
    /// Units/s: its limit × its load here ÷ its load on every backend.
    pub units_per_s: f64,
    /// The most units/s it may take here while the backend lends it idle capacity.
    pub ceiling: f64,
    /// The share in CPU milliseconds, bytes read and bytes written per second (0: its
    /// requests' usage is not reported).
    pub cpu_ms_per_s: f64,
    /// Bytes read per second.
    pub read_bytes_per_s: f64,
    /// Bytes written per second.
    pub write_bytes_per_s: f64,
    /// The share as a part of this backend's capacity (0: the backend reports none).
    pub part: f64,
}

/// One group's share and its buckets.
#[derive(Debug)]
struct Held {
    share: NodeShare,
    bucket: Bucket,
    ceiling: Bucket,
}

/// The groups' shares on this backend. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct NodeShares {
    groups: HashMap<GroupName, Held>,
}

/// How a request fared against its group's share.
pub(crate) enum Booked {
    /// Within the share, or lent: it goes on at once (or after the wait).
    Go(Duration),
    /// Past the share's wait: refused, with the share's rate and how long it would have been.
    Over(f64, Duration),
}

impl NodeShares {
    /// Takes the controller's latest shares at `now`, in place of the last: a group left out
    /// holds none. Names that are no group's, and numbers that are not finite and positive,
    /// are left out; at most as many as a report names. The groups that held a share before
    /// or hold one now: those whose weight may have moved.
    pub(crate) fn take(&mut self, now: Nanos, shares: &[v1::NodeShare]) -> Vec<GroupName> {
        let mut next = HashMap::new();
        for s in shares.iter().take(tollgate_proto::REPORT_GROUPS_MAX) {
            let Ok(name) = GroupName::new(&s.group) else { continue };
            let positive = |v: f64| v.is_finite() && v > 0.0;
            if !positive(s.units_per_s) {
                continue;
            }
            let finite = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
            let share = NodeShare {
                units_per_s: s.units_per_s,
                ceiling: if positive(s.ceiling) { s.ceiling.max(s.units_per_s) } else { s.units_per_s },
                cpu_ms_per_s: finite(s.cpu_ms_per_s),
                read_bytes_per_s: finite(s.read_bytes_per_s),
                write_bytes_per_s: finite(s.write_bytes_per_s),
                part: finite(s.part),
            };
            let held = match self.groups.remove(&name) {
                Some(h) => {
                    h.bucket.set_rate(share.units_per_s, share.units_per_s, now);
                    h.ceiling.set_rate(share.ceiling, share.ceiling, now);
                    Held { share, ..h }
                }
                None => Held {
                    share,
                    bucket: Bucket::new(share.units_per_s, share.units_per_s, now),
                    ceiling: Bucket::new(share.ceiling, share.ceiling, now),
                },
            };
            next.insert(name, held);
        }
        let mut touched: Vec<GroupName> = self.groups.keys().chain(next.keys()).cloned().collect();
        touched.sort_unstable();
        touched.dedup();
        self.groups = next;
        touched
    }

    /// A group's share here, units/s, if it has one.
    pub(crate) fn rate(&self, group: &str) -> Option<f64> {
        self.groups.get(group).map(|h| h.share.units_per_s)
    }

    /// Books `cost` of `group` at `now`: from its share; past it, when the backend is `idle`,
    /// from its ceiling; else waiting for the share's refill, at most `max_wait`.
    pub(crate) fn book(&self, group: &str, cost: f64, now: Nanos, idle: bool, max_wait: Duration) -> Booked {
        let Some(h) = self.groups.get(group) else { return Booked::Go(Duration::ZERO) };
        if h.bucket.try_acquire(cost, now).is_ok() {
            // What the share lets in counts against what may be lent.
            h.ceiling.charge(cost, now);
            return Booked::Go(Duration::ZERO);
        }
        if idle && h.ceiling.try_acquire(cost, now).is_ok() {
            return Booked::Go(Duration::ZERO);
        }
        match book(&h.bucket, cost, now, max_wait) {
            Ok(wait) => {
                h.ceiling.charge(cost, now);
                Booked::Go(wait)
            }
            Err(d) => Booked::Over(h.bucket.rate(), d),
        }
    }

    /// Every share held, by group.
    pub(crate) fn view(&self) -> HashMap<String, NodeShare> {
        self.groups.iter().map(|(g, h)| (g.to_string(), h.share)).collect()
    }
}

/// Books `cost` in `bucket`, waiting at most `max_wait`: how long to wait, or how long it
/// would have been. A cost above the bucket's burst waits for a full bucket and leaves the
/// rest as debt, so a large request is slowed, never refused for its size alone.
pub(crate) fn book(bucket: &Bucket, cost: f64, now: Nanos, max_wait: Duration) -> Result<Duration, Duration> {
    let burst = bucket.burst();
    let (now_part, debt) = if cost > burst { (burst, cost - burst) } else { (cost, 0.0) };
    match bucket.reserve(now_part, now, max_wait) {
        Ok(wait) => {
            bucket.charge(debt, now);
            Ok(wait)
        }
        Err(Refusal::Wait(d)) => Err(d),
        Err(_) => Err(max_wait),
    }
}
