//! Where each group is served: the controller's half of dmClock's cross-backend term.
//!
//! A request that fans out over several backends is scheduled on each of them by its own
//! fair queue ([`FairQueue`](crate::schedule::FairQueue)). Scheduled backend by backend, a
//! group served on three backends gets a fair share of each, three shares in all, while a
//! group on one backend gets one. dmClock (Gulati et al., 2010) makes the share fair over the
//! whole cluster: each backend charges a group's virtual time for the work the other backends
//! did for it since, as if it had done it itself.
//!
//! [`Spread`] keeps the latest loads of every backend (the units/s each group brings it, as
//! its reports say) and their sums per group. Each report is answered with, for each group it
//! names, the group's units/s on the other backends: the sum less the backend's own load.
//! The backend's scheduler charges that rate as time passes ([`CrossCharge`]).
//!
//! [`CrossCharge`]: crate::schedule::CrossCharge

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::settings::GroupName;
use crate::time::Nanos;

/// How often the sums are made again from every backend's loads (dropping backends that
/// stopped reporting, and the rounding that adding and taking away leaves).
pub const RESUM_EVERY: Duration = Duration::from_secs(1);

/// Loads below this many units/s count as none.
const NEGLIGIBLE: f64 = 1e-9;

/// A backend's loads: (group, units/s).
pub type Loads = Arc<[(GroupName, f64)]>;

/// A group's share of its `limit` on a backend where it brings `here` units/s and the other
/// backends `elsewhere`: the limit in proportion to its load here (TiDB's per-node quota,
/// balanced toward where the group's data lives). With no load anywhere yet, all of it.
///
/// ```
/// use tollgate_model::spread::node_share;
/// assert_eq!(node_share(300.0, 240.0, 60.0), 240.0);
/// assert_eq!(node_share(300.0, 0.0, 0.0), 300.0);
/// ```
pub fn node_share(limit: f64, here: f64, elsewhere: f64) -> f64 {
    let total = here + elsewhere;
    if total > NEGLIGIBLE { limit * (here / total) } else { limit }
}

/// Each backend's latest loads and their sums per group. See the [module
/// documentation](self).
#[derive(Debug)]
pub struct Spread {
    expiry: Duration,
    backends: HashMap<String, (Nanos, Loads)>,
    totals: HashMap<GroupName, f64>,
    summed: Option<Nanos>,
}

impl Spread {
    /// No backends yet; a backend whose last report is older than `expiry` is left out.
    pub fn new(expiry: Duration) -> Spread {
        Spread { expiry, backends: HashMap::new(), totals: HashMap::new(), summed: None }
    }

    /// Takes `backend`'s loads (group, units/s) at `now` in place of its last ones, and
    /// answers, for each of its groups served elsewhere too, the units/s served elsewhere.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tollgate_model::settings::GroupName;
    /// use tollgate_model::spread::Spread;
    /// use tollgate_model::time::Nanos;
    ///
    /// let g = |s: &str| GroupName::new(s).unwrap();
    /// let mut spread = Spread::new(Duration::from_secs(10));
    /// spread.put(Nanos::ZERO, "kv-1", Arc::from([(g("a"), 60.0), (g("b"), 40.0)]));
    /// let answer = spread.put(Nanos::ZERO, "kv-2", Arc::from([(g("a"), 30.0)]));
    /// assert_eq!(answer, [(g("a"), 60.0)]); // a is served at 60 units/s on kv-1
    /// ```
    pub fn put(
        &mut self,
        now: Nanos,
        backend: &str,
        loads: Arc<[(GroupName, f64)]>,
    ) -> Vec<(GroupName, f64)> {
        let old = match self.backends.get_mut(backend) {
            Some(entry) => Some(std::mem::replace(entry, (now, loads.clone())).1),
            None => {
                self.backends.insert(backend.to_string(), (now, loads.clone()));
                None
            }
        };
        if self.summed.is_none_or(|at| now.since(at) >= RESUM_EVERY) {
            self.resum(now);
        } else {
            for (group, load) in old.iter().flat_map(|o| o.iter()) {
                if let Some(total) = self.totals.get_mut(group) {
                    *total -= load;
                }
            }
            for (group, load) in loads.iter() {
                *self.totals.entry(group.clone()).or_insert(0.0) += load;
            }
        }
        loads
            .iter()
            .filter_map(|(group, load)| {
                let elsewhere = self.totals.get(group).map_or(0.0, |t| t - load);
                (elsewhere > NEGLIGIBLE).then(|| (group.clone(), elsewhere))
            })
            .collect()
    }

    /// The units/s `group` is served at over every backend, as of their latest reports.
    pub fn total(&self, group: &str) -> f64 {
        self.totals.get(group).copied().unwrap_or(0.0)
    }

    /// Backends whose loads are kept.
    pub fn backends(&self) -> usize {
        self.backends.len()
    }

    fn resum(&mut self, now: Nanos) {
        let expiry = self.expiry;
        self.backends.retain(|_, (seen, _)| now.since(*seen) <= expiry);
        self.totals.clear();
        for (_, loads) in self.backends.values() {
            for (group, load) in loads.iter() {
                *self.totals.entry(group.clone()).or_insert(0.0) += load;
            }
        }
        self.totals.retain(|_, t| *t > NEGLIGIBLE);
        self.summed = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    fn loads(pairs: &[(&str, f64)]) -> Loads {
        pairs.iter().map(|(n, l)| (g(n), *l)).collect()
    }

    fn at(ms: u64) -> Nanos {
        Nanos::ZERO.after(Duration::from_millis(ms))
    }

    /// Each backend hears what the others serve, never its own load.
    #[test]
    fn each_backend_hears_the_others_loads() {
        let mut s = Spread::new(Duration::from_secs(10));
        assert!(s.put(at(0), "b1", loads(&[("a", 50.0), ("x", 50.0)])).is_empty());
        assert_eq!(s.put(at(10), "b2", loads(&[("a", 30.0)])), [(g("a"), 50.0)]);
        assert_eq!(s.put(at(20), "b3", loads(&[("a", 20.0), ("y", 80.0)])), [(g("a"), 80.0)]);
        // A new report replaces the backend's last one.
        assert_eq!(s.put(at(30), "b1", loads(&[("a", 10.0), ("x", 90.0)])), [(g("a"), 50.0)]);
        assert_eq!(s.total("a"), 60.0);
        assert_eq!(s.total("x"), 90.0);
    }

    /// A backend that stops reporting stops counting after the expiry; one that drops a group
    /// stops counting it at once.
    #[test]
    fn silent_backends_and_dropped_groups_stop_counting() {
        let mut s = Spread::new(Duration::from_secs(10));
        s.put(at(0), "b1", loads(&[("a", 50.0)]));
        s.put(at(0), "b2", loads(&[("a", 30.0), ("b", 5.0)]));
        s.put(at(500), "b2", loads(&[("a", 30.0)]));
        assert_eq!(s.total("b"), 0.0);
        for ms in (1000..=10_000).step_by(1000) {
            s.put(at(ms), "b2", loads(&[("a", 30.0)]));
        }
        assert_eq!(s.put(at(10_000), "b2", loads(&[("a", 30.0)])), [(g("a"), 50.0)]);
        assert!(s.put(at(11_000), "b2", loads(&[("a", 30.0)])).is_empty(), "b1 fell silent");
        assert_eq!(s.backends(), 1);
    }
}
