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

use tollgate_core::engine::GroupView;
use tollgate_core::settings::GroupName;

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
    /// The last sample written.
    written: u64,
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

fn active(g: &GroupView) -> bool {
    g.clients > 0 || g.demand > 0.0 || g.admitted > 0.0 || g.throttled > 0.0
}

fn opt(v: f32) -> Option<f32> {
    (!v.is_nan()).then_some(v)
}

impl History {
    /// Takes one sample of `view` (sorted or not) at Unix time `unix_ms`, with the node's
    /// capacity. Linear in the groups.
    pub fn sample(&self, view: &[GroupView], capacity: Option<f64>, unix_ms: u64) {
        let mut h = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let s = h.next;
        let at = (s % SAMPLES as u64) as usize;
        h.times[at] = unix_ms;
        let mut node = [0.0f64; NODE_SERIES.len()];
        node[0] = capacity.unwrap_or(f64::NAN);
        let inner = &mut *h;
        for g in view {
            node[1] += g.admitted;
            node[2] += g.demand;
            node[3] += g.throttled;
            node[4] += f64::from(g.clients);
            let is_active = active(g);
            if !inner.groups.contains_key(&g.name) {
                if !is_active || inner.groups.len() >= GROUPS_MAX {
                    continue;
                }
                let ring = Ring {
                    first: s,
                    active: s,
                    written: s,
                    values: vec![[f32::NAN; GROUP_SERIES.len()]; SAMPLES].into_boxed_slice(),
                };
                inner.groups.insert(g.name.clone(), ring);
            }
            let Some(ring) = inner.groups.get_mut(&g.name) else { continue };
            if is_active {
                ring.active = s;
            }
            ring.written = s;
            ring.values[at] = [
                g.target.map_or(f32::NAN, |t| t as f32),
                g.admitted as f32,
                g.demand as f32,
                g.throttled as f32,
                g.clients as f32,
                f32::from(u8::from(g.busy)),
            ];
        }
        inner.node[at] = node.map(|v| v as f32);
        // Groups gone from the view lose their history, and so do those idle for a window.
        inner.groups.retain(|_, r| r.written == s && s - r.active < SAMPLES as u64);
        inner.next = s + 1;
    }

    /// The number of the next sample.
    pub fn next(&self) -> u64 {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).next
    }

    /// Groups with a history now.
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
    use tollgate_core::engine::{Engine, EngineSettings};
    use tollgate_core::settings::GroupSettings;

    fn view(names: &[(&str, u32)]) -> Vec<GroupView> {
        let mut e = Engine::new(EngineSettings::default());
        for (n, _) in names {
            e.set_group(GroupName::new(n).unwrap(), GroupSettings::default());
        }
        let mut v = e.view();
        for g in &mut v {
            g.clients = names.iter().find(|(n, _)| *n == g.name.as_str()).unwrap().1;
            g.admitted = f64::from(g.clients) * 10.0;
        }
        v
    }

    #[test]
    fn rings_hold_a_window_and_forget_idle_and_gone_groups() {
        let h = History::default();
        let busy = view(&[("a", 2), ("idle", 0)]);
        h.sample(&busy, Some(100.0), 1_000);
        h.sample(&busy, Some(100.0), 2_000);
        // An idle group gets no history; an active one does, from its first sample.
        assert!(h.group(&GroupName::new("idle").unwrap(), 0).is_none());
        let a = h.group(&GroupName::new("a").unwrap(), 0).unwrap();
        assert_eq!((a.from, a.t.clone()), (0, vec![1.0, 2.0]));
        assert_eq!(a.values[1], [Some(20.0), Some(20.0)]);
        assert_eq!(a.values[0], [None, None], "not throttled: no target");
        // Asking from a later sample gives only the new ones.
        assert_eq!(h.group(&GroupName::new("a").unwrap(), 1).unwrap().t, [2.0]);
        let node = h.node(0);
        assert_eq!((node.values[0][0], node.values[1][1]), (Some(100.0), Some(20.0)));
        // A window and more: at most SAMPLES kept, the oldest gone.
        for i in 0..SAMPLES as u64 {
            h.sample(&busy, None, 3_000 + i);
        }
        let a = h.group(&GroupName::new("a").unwrap(), 0).unwrap();
        assert_eq!((a.from, a.t.len()), (2, SAMPLES));
        assert_eq!(h.node(0).t.len(), SAMPLES);
        // Idle for a whole window: forgotten.
        let quiet = view(&[("a", 0)]);
        for i in 0..SAMPLES as u64 {
            h.sample(&quiet, None, 10_000 + i);
        }
        assert_eq!(h.groups(), 0);
        // Gone from the view: forgotten at once.
        h.sample(&busy, None, 20_000);
        assert_eq!(h.groups(), 1);
        h.sample(&[], None, 20_001);
        assert_eq!(h.groups(), 0);
    }

    #[test]
    fn at_most_groups_max_have_a_history() {
        let h = History::default();
        let names: Vec<String> = (0..GROUPS_MAX + 10).map(|i| format!("g{i}")).collect();
        let pairs: Vec<(&str, u32)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        h.sample(&view(&pairs), None, 0);
        assert_eq!(h.groups(), GROUPS_MAX);
    }
}
