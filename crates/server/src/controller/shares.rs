//! Each group's share of its limit on a backend, answered with the backend's report (TiDB's
//! translation of a group's RU into each storage node's resources, balanced toward where the
//! group's data lives).
//!
//! For a group with a finite limit `L` bringing `here` units/s to the backend and `elsewhere`
//! to the others (their latest reports, [`Spread`](tollgate_model::spread::Spread)):
//!
//! - its share here is `L × here ÷ (here + elsewhere)`
//!   ([`node_share`](tollgate_model::spread::node_share));
//! - its ceiling here, what an idle backend may lend it up to, is `max(min(L − elsewhere, C),
//!   share)`, `C` the backend's capacity when its report gives one: lent capacity never takes
//!   the group past its limit over all the backends, nor past the backend;
//! - each resource's share is the share × what its requests used per unit consumed, from the
//!   detail clients report (`cpu_ms`, `read_bytes`, `write_bytes` per unit);
//! - its part of the backend is `share ÷ C` (TiDB's share of a node's vCPUs), when the backend
//!   reports its capacity, configured or learned.

use tollgate_model::engine::GroupView;
use tollgate_model::settings::{GroupName, Limit};
use tollgate_model::spread::node_share;
use tollgate_proto::v1;

/// The shares of the groups in `loads` (group, units/s here) that have a finite limit, by
/// `view` (sorted by name), with `elsewhere` (group, units/s on the other backends) and the
/// backend's `capacity` (units/s), if it gave one.
///
/// `elsewhere` lists some of `loads`' groups in their order, as
/// [`Spread::put`](tollgate_model::spread::Spread::put) answers (it leaves out those served
/// nowhere else): both are walked once, so a report of 10,000 loads costs 10,000 steps, not
/// 10,000 searches of the answer.
pub(crate) fn node_shares(
    view: &[GroupView],
    loads: &[(GroupName, f64)],
    elsewhere: &[(GroupName, f64)],
    capacity: Option<f64>,
) -> Vec<v1::NodeShare> {
    let mut out = Vec::new();
    let mut others = elsewhere.iter().peekable();
    for (group, here) in loads {
        let there = others.next_if(|(name, _)| name == group).map_or(0.0, |(_, r)| *r);
        let Ok(at) = view.binary_search_by(|g| g.name.cmp(group)) else { continue };
        let g = &view[at];
        let Some(Limit::Units(limit)) = g.settings.as_ref().map(|s| s.limit()) else { continue };
        if !limit.is_finite() {
            continue;
        }
        let share = node_share(limit, *here, there);
        let per_unit = |used: f64| {
            let consumed = g.meter.consumed;
            if consumed > 0.0 && used.is_finite() { share * used / consumed } else { 0.0 }
        };
        let detail = g.detail.unwrap_or_default();
        out.push(v1::NodeShare {
            group: group.to_string(),
            units_per_s: share,
            ceiling: (limit - there).min(capacity.unwrap_or(f64::INFINITY)).max(share),
            part: capacity.map_or(0.0, |c| share / c),
            cpu_ms_per_s: per_unit(detail.cpu_ms),
            read_bytes_per_s: per_unit(detail.read_bytes),
            write_bytes_per_s: per_unit(detail.write_bytes),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::engine::Engine;
    use tollgate_model::settings::GroupSettings;

    /// Each group is matched with its own load elsewhere, whichever groups the answer leaves
    /// out, walking both lists once.
    #[test]
    fn each_group_takes_its_own_load_elsewhere() {
        let g = |s: &str| GroupName::new(s).unwrap();
        let mut engine = Engine::new(Default::default());
        for name in ["a", "b", "c", "d"] {
            let settings = GroupSettings::builder().limit(100.0).build().unwrap();
            engine.set_group(g(name), settings);
        }
        let mut view = engine.view();
        view.sort_unstable_by(|x, y| x.name.cmp(&y.name));
        let loads = [(g("d"), 10.0), (g("a"), 10.0), (g("x"), 5.0), (g("c"), 10.0), (g("b"), 10.0)];
        // b and d are served nowhere else; x has no settings.
        let elsewhere = [(g("a"), 30.0), (g("x"), 1.0), (g("c"), 90.0)];
        let shares = node_shares(&view, &loads, &elsewhere, None);
        let got: Vec<(String, f64)> = shares.iter().map(|s| (s.group.clone(), s.units_per_s)).collect();
        let want = [("d", 100.0), ("a", 25.0), ("c", 10.0), ("b", 100.0)];
        assert_eq!(got, want.map(|(n, u)| (n.to_string(), u)), "{shares:?}");
    }
}
