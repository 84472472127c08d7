//! Which groups `/metrics` names one by one (`--metrics-groups`).
//!
//! Every named group costs a series in each of the per-group families (about 2.5 kB of text a
//! group): at 100,000 groups an uncapped page is near 100 MB, more than Prometheus should
//! scrape every few seconds. So a scrape names the busiest groups only, by demand (then
//! consumption, then name), at most [`MetricsGroups::cap`] of them, and folds the rest into
//! one series labelled `group="(others)"`:
//!
//! - the rates and amounts (units/s admitted, asked, targeted, unthrottled; requests/s
//!   refused; clients; requests in flight) are added up, so that a sum over every `group`
//!   is still the node's whole;
//! - `busy` is 1 when any of the rest is busy;
//! - the rate marks (lowest and highest of the last minute and hour) and the counters have no
//!   `(others)` sample: a group moving between the named and the rest would make a summed
//!   counter go down, which Prometheus reads as a restart.
//!
//! A group actually named `(others)` is always among the rest, so the label means one thing.

use tollgate_model::engine::GroupView;
use tollgate_model::prometheus::Kind;

/// The label value of the groups not named one by one.
pub const OTHERS: &str = "(others)";

/// How many groups `/metrics` names one by one by default: at 33 families, about 2.5 MB of
/// text at most, whatever the number of groups.
pub const METRICS_GROUPS_DEFAULT: usize = 1_000;

/// The most `--metrics-groups` takes.
pub const METRICS_GROUPS_MAX: usize = 1_000_000;

/// The cap on named groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsGroups(usize);

impl Default for MetricsGroups {
    fn default() -> Self {
        MetricsGroups(METRICS_GROUPS_DEFAULT)
    }
}

impl MetricsGroups {
    /// Checks `--metrics-groups`: 0 (only the aggregate) to [`METRICS_GROUPS_MAX`].
    pub fn new(cap: u64) -> Result<MetricsGroups, String> {
        match usize::try_from(cap) {
            Ok(cap) if cap <= METRICS_GROUPS_MAX => Ok(MetricsGroups(cap)),
            _ => Err(format!("--metrics-groups: {cap} is past the most, {METRICS_GROUPS_MAX}")),
        }
    }

    /// The most groups named one by one.
    pub fn cap(self) -> usize {
        self.0
    }

    /// Splits `view` into the groups named (in `view`'s order) and the rest.
    pub fn split(self, view: &[GroupView]) -> (Vec<&GroupView>, Vec<&GroupView>) {
        let (mut named, mut rest): (Vec<&GroupView>, Vec<&GroupView>) =
            view.iter().partition(|g| g.name.as_str() != OTHERS);
        if named.len() > self.0 {
            let busier = |a: &&GroupView, b: &&GroupView| {
                b.demand
                    .total_cmp(&a.demand)
                    .then(b.admitted.total_cmp(&a.admitted))
                    .then_with(|| a.name.cmp(&b.name))
            };
            if self.0 > 0 {
                named.select_nth_unstable_by(self.0 - 1, busier);
            }
            rest.extend(named.drain(self.0..));
            named.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        }
        (named, rest)
    }
}

/// How a per-group family folds the rest into the `(others)` sample, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    /// Added up.
    Sum,
    /// 1 when any is.
    Any,
    /// No `(others)` sample.
    None,
}

impl Fold {
    /// The fold of the family `name` of kind `kind` (see the module documentation).
    pub fn of(name: &str, kind: Kind) -> Fold {
        if kind == Kind::Counter || name.contains("_rate_low_") || name.contains("_rate_high_") {
            Fold::None
        } else if name == "tollgate_group_busy" {
            Fold::Any
        } else {
            Fold::Sum
        }
    }

    /// The `(others)` sample over `rest`, read by `read`: none when there is no rest, or the
    /// family has no such sample, or none of the rest has a sample of it.
    pub fn apply(self, rest: &[&GroupView], read: fn(&GroupView) -> Option<f64>) -> Option<f64> {
        if rest.is_empty() || self == Fold::None {
            return None;
        }
        let mut values = rest.iter().filter_map(|g| read(g)).peekable();
        values.peek()?;
        Some(match self {
            Fold::Sum => values.sum(),
            _ => values.fold(0.0, f64::max).min(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::engine::{ClientReport, Engine, EngineSettings};
    use tollgate_model::settings::{GroupName, GroupSettings};
    use tollgate_model::time::Nanos;

    fn view(demands: &[(&str, f64)]) -> Vec<GroupView> {
        let mut e = Engine::new(EngineSettings::default());
        for &(name, demand) in demands {
            let g = GroupName::new(name).unwrap();
            e.set_group(g.clone(), GroupSettings::default());
            let r = ClientReport { demand, consumed: demand, requests: demand, ..ClientReport::default() };
            e.report(Nanos(0), 1, &g, r);
        }
        e.tick(Nanos(1_000_000_000));
        e.view()
    }

    #[test]
    fn the_busiest_groups_are_named_and_the_rest_are_summed() {
        let v = view(&[("a", 5.0), ("b", 50.0), ("c", 1.0), ("d", 20.0), ("(others)", 100.0)]);
        let (named, rest) = MetricsGroups::new(2).unwrap().split(&v);
        fn names<'a>(gs: &[&'a GroupView]) -> Vec<&'a str> {
            let mut n: Vec<&str> = gs.iter().map(|g| g.name.as_str()).collect();
            n.sort_unstable();
            n
        }
        assert_eq!(names(&named), ["b", "d"], "named in the view's order, busiest only");
        assert_eq!(names(&rest), ["(others)", "a", "c"], "a group called (others) is always in the rest");
        let demand = Fold::of("tollgate_group_demand_units", Kind::Gauge).apply(&rest, |g| Some(g.demand));
        assert_eq!(demand, Some(106.0));
        let busy = Fold::of("tollgate_group_busy", Kind::Gauge);
        assert_eq!(busy.apply(&rest, |g| Some(if g.name.as_str() == "a" { 1.0 } else { 0.0 })), Some(1.0));
        let total = Fold::of("tollgate_group_consumed_units_total", Kind::Counter);
        assert_eq!(total.apply(&rest, |g| Some(g.meter.consumed)), None, "counters are not folded");
        assert_eq!(Fold::Sum.apply(&[], |g| Some(g.demand)), None, "no rest, no sample");
        let (named, rest) = MetricsGroups::new(10).unwrap().split(&v);
        assert_eq!((named.len(), rest.len()), (4, 1));
        let (named, rest) = MetricsGroups::new(0).unwrap().split(&v);
        assert_eq!((named.len(), rest.len()), (0, 5));
    }

    #[test]
    fn the_cap_is_checked() {
        let e = MetricsGroups::new(2_000_000).unwrap_err();
        assert!(e.contains("--metrics-groups") && e.contains("1000000"), "{e}");
        assert_eq!(MetricsGroups::default().cap(), METRICS_GROUPS_DEFAULT);
    }
}
