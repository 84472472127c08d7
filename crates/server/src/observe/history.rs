//! The last fifteen minutes, for the dashboard: one sample a second of the node's totals and
//! of each active group's target, admitted units, demand, refused requests, clients and busy
//! flag, in fixed rings.
//!
//! Memory is bounded whatever the load: [`SAMPLES`] samples, and at most [`GROUPS_MAX`] groups
//! with a history (about 21 KB each, 11 MB in all). A group gets one when it is active (clients,
//! demand or consumption) and there is room; it loses it when it is dropped, expires, or has
//! been idle for the whole window. A group without a history is still shown with its live
//! values, and the dashboard charts what it sees of it from then on.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tollgate_model::engine::{Engine, GroupSample};
use tollgate_model::settings::GroupName;

/// Samples kept: fifteen minutes at one a second.
pub const SAMPLES: usize = 900;
/// The most groups with a history at once.
pub const GROUPS_MAX: usize = 500;

/// The series kept per group, in this order.
pub const GROUP_SERIES: [&str; 6] = ["target", "admitted", "demand", "throttled", "clients", "busy"];
/// The series kept for the node, in this order.
pub const NODE_SERIES: [&str; 5] = ["capacity", "admitted", "demand", "throttled", "clients"];

struct Ring {
    /// The first sample it holds.
    first: u64,
    /// The last sample in which it was active.
    active: u64,
    values: Box<[[f32; GROUP_SERIES.len()]]>,
}

struct Inner {
    /// The number of the next sample (samples are numbered from 0).
    next: u64,
    /// Unix time of each sample, in milliseconds.
    times: Box<[u64]>,
    node: Box<[[f32; NODE_SERIES.len()]]>,
    groups: HashMap<GroupName, Ring>,
}

/// The rings. See the [module documentation](self).
pub struct History {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("History")
    }
}

impl Default for History {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                next: 0,
                times: vec![0; SAMPLES].into_boxed_slice(),
                node: vec![[f32::NAN; NODE_SERIES.len()]; SAMPLES].into_boxed_slice(),
                groups: HashMap::new(),
            }),
        }
    }
}

/// One series of samples: their times (Unix seconds) and each series' values (`None`: no
/// value, such as the target of a group not throttled).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// The number of the first sample given.
    pub from: u64,
    /// Unix seconds of each sample.
    pub t: Vec<f64>,
    /// Per series (in the order of [`GROUP_SERIES`] or [`NODE_SERIES`]) its values.
    pub values: Vec<Vec<Option<f32>>>,
}

fn active(v: &GroupSample) -> bool {
    v[1] > 0.0 || v[2] > 0.0 || v[3] > 0.0 || v[4] > 0.0
}

fn opt(v: f32) -> Option<f32> {
    (!v.is_nan()).then_some(v)
}

impl History {
    /// Takes one sample of `engine` at Unix time `unix_ms`, with the node's capacity: the
    /// node's totals (kept by the tick), each group with a history, and new groups while there
    /// is room. Its cost is in the groups with a history, not in all groups: the caller holds
    /// the engine's lock for it.
    pub fn sample(&self, engine: &Engine, capacity: Option<f64>, unix_ms: u64) {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let s = h.next;
        let at = (s % SAMPLES as u64) as usize;
        h.times[at] = unix_ms;
        let t = engine.totals();
        h.node[at] = [
            capacity.map_or(f32::NAN, |c| c as f32),
            t.admitted as f32,
            t.demand as f32,
            t.throttled as f32,
            t.clients as f32,
        ];
        let inner = &mut *h;
        // Groups gone from the engine lose their history, and so do those idle for a window.
        inner.groups.retain(|name, ring| match engine.group_sample(name) {
            Some(v) => {
                ring.values[at] = v;
                if active(&v) {
                    ring.active = s;
                }
                s - ring.active < SAMPLES as u64
            }
            None => false,
        });
        let room = GROUPS_MAX.saturating_sub(inner.groups.len());
        for (name, v) in engine.active_groups(room, |n| inner.groups.contains_key(n)) {
            let mut values = vec![[f32::NAN; GROUP_SERIES.len()]; SAMPLES].into_boxed_slice();
            values[at] = v;
            inner.groups.insert(name, Ring { first: s, active: s, values });
        }
        inner.next = s + 1;
    }

    /// The number of the next sample.
    pub fn next(&self) -> u64 {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).next
    }

    /// Groups with a history now.
    #[cfg(test)]
    pub fn groups(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).groups.len()
    }

    /// The node's samples from number `since` on (those still kept).
    pub fn node(&self, since: u64) -> Series {
        let h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        read(&h, since, &h.node)
    }

    /// A group's samples from number `since` on, or `None` when it has no history.
    pub fn group(&self, name: &GroupName, since: u64) -> Option<Series> {
        let h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let ring = h.groups.get(name)?;
        Some(read(&h, since.max(ring.first), &ring.values))
    }
}

/// The samples of `values` (a ring indexed like the times) from number `since` on, those
/// still kept.
fn read<const N: usize>(h: &Inner, since: u64, values: &[[f32; N]]) -> Series {
    let from = since.max(h.next.saturating_sub(SAMPLES as u64));
    let mut out = Series { from, t: Vec::new(), values: vec![Vec::new(); N] };
    for s in from..h.next {
        let at = (s % SAMPLES as u64) as usize;
        out.t.push(h.times[at] as f64 / 1000.0);
        for (i, v) in values[at].iter().enumerate() {
            out.values[i].push(opt(*v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_model::engine::{ClientReport, EngineSettings};
    use tollgate_model::settings::GroupSettings;
    use tollgate_model::time::Nanos;

    fn name(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    /// An engine that has ticked at second `t` with `clients` clients reporting each group
    /// (10 units/s each; a group with 0 clients is configured and idle).
    fn engine_at(e: &mut Engine, t: u64, groups: &[(&str, u64)]) {
        let now = Nanos(t * 1_000_000_000);
        for (g, clients) in groups {
            if e.group(&name(g)).is_none() {
                e.set_group(name(g), GroupSettings::default());
            }
            for c in 0..*clients {
                let id = e.client(now, &format!("{g}-{c}"), t + 1).unwrap();
                let r =
                    ClientReport { demand: 10.0, consumed: 10.0, requests: 1.0, ..ClientReport::default() };
                e.report(now, id, &name(g), r);
            }
        }
        e.tick(now);
    }

    #[test]
    fn rings_hold_a_window_and_forget_idle_and_gone_groups() {
        let h = History::default();
        let mut e = Engine::new(EngineSettings { capacity: Some(100.0), ..EngineSettings::default() });
        engine_at(&mut e, 1, &[("a", 2), ("idle", 0)]);
        h.sample(&e, Some(100.0), 1_000);
        engine_at(&mut e, 2, &[("a", 2)]);
        h.sample(&e, Some(100.0), 2_000);
        // An idle group gets no history; an active one does, from its first sample.
        assert!(h.group(&name("idle"), 0).is_none());
        let a = h.group(&name("a"), 0).unwrap();
        assert_eq!((a.from, a.t.clone()), (0, vec![1.0, 2.0]));
        assert_eq!(a.values[4], [Some(2.0), Some(2.0)], "two clients");
        assert!(a.values[1][1].unwrap() > 0.0, "consumed: {:?}", a.values[1]);
        // Asking from a later sample gives only the new ones.
        assert_eq!(h.group(&name("a"), 1).unwrap().t, [2.0]);
        let node = h.node(0);
        assert_eq!(node.values[0][0], Some(100.0));
        assert_eq!(node.values[4][1], Some(2.0), "client-group pairs");
        // A window and more: at most SAMPLES kept, the oldest gone.
        for i in 0..SAMPLES as u64 {
            h.sample(&e, None, 3_000 + i);
        }
        let a = h.group(&name("a"), 0).unwrap();
        assert_eq!((a.from, a.t.len()), (2, SAMPLES));
        assert_eq!(h.node(0).t.len(), SAMPLES);
        // Gone from the engine: forgotten at once.
        e.remove_group(&name("a"));
        let mut idle = Engine::new(EngineSettings::default());
        engine_at(&mut idle, 1, &[("b", 0)]);
        h.sample(&idle, None, 20_000);
        assert_eq!(h.groups(), 0);
    }

    #[test]
    fn a_group_idle_for_a_window_loses_its_history() {
        let h = History::default();
        let mut e = Engine::new(EngineSettings::default());
        engine_at(&mut e, 1, &[("a", 1)]);
        h.sample(&e, None, 0);
        assert_eq!(h.groups(), 1);
        // Its clients gone quiet, ticks show nothing consumed; it stays tracked a while.
        let mut t = 2;
        while h.groups() == 1 && t < 2 + 2 * SAMPLES as u64 {
            engine_at(&mut e, t, &[]);
            h.sample(&e, None, t * 1000);
            t += 1;
        }
        assert_eq!(h.groups(), 0, "forgotten after {t} samples");
    }

    #[test]
    fn at_most_groups_max_have_a_history() {
        let h = History::default();
        let mut e =
            Engine::new(EngineSettings { max_tracked_groups: 2 * GROUPS_MAX, ..EngineSettings::default() });
        let names: Vec<String> = (0..GROUPS_MAX + 10).map(|i| format!("g{i}")).collect();
        let pairs: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        engine_at(&mut e, 1, &pairs);
        h.sample(&e, None, 0);
        assert_eq!(h.groups(), GROUPS_MAX);
    }
}
