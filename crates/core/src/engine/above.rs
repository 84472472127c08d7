//! Quotas per window in a regional engine: counts against what the tier above allotted.
//!
//! A region's engine does not count a group's windows itself: the tier above sees every
//! region's consumption and keeps the windows. The region's lease takes an allotment of the
//! group's window from the tier above, as a client does, and the regional engine hands its own
//! clients allotments out of it ([`super::allot`]): what the region's clients consumed since
//! the window began, and what they hold unspent, never passes what the tier above allotted the
//! region. At each round the region reports what it holds and gives back what its clients do
//! not need. A window that ends here ends the lot with it; a region cut off from the tier
//! above admits what its lot still holds, and then nothing of the group until the tier above
//! answers again.

use std::collections::HashMap;
use std::time::Duration;

use super::FixedHasher;
use super::allot::{Allotment, QuotaHeld};
use crate::settings::GroupName;
use crate::time::Nanos;

/// How soon a client of a region is told to look again when the region has no more of a
/// quota but the tier above may: about the region's next round.
pub(crate) const ABOVE_RETRY: Duration = Duration::from_secs(1);

/// What the tier above allotted the region of one group's window.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Lot {
    window: u64,
    /// Units allotted in the window, less what the region gave back.
    given: f64,
    /// The group's consumption here when the window's lot began.
    base: f64,
    ends_at: Option<Nanos>,
    /// What the tier above had left beyond every allotment, at its last answer.
    beyond: f64,
    reset_at: Option<Nanos>,
}

/// What the tier above allotted the region, by group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Above {
    lots: HashMap<GroupName, Lot, FixedHasher>,
}

/// A group's lot as the regional engine allots from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LotView {
    pub(crate) window: u64,
    /// What is left of it, before the allotments the region's clients hold unspent.
    pub(crate) room: f64,
    pub(crate) ends_in: Option<Duration>,
    pub(crate) beyond: f64,
    pub(crate) reset_in: Option<Duration>,
}

fn finite(v: f64) -> f64 {
    if v.is_finite() { v.max(0.0) } else { 0.0 }
}

impl Above {
    /// Takes the tier above's allotment `a` for `group`, answered at `now`, the group's
    /// consumption here being `consumed`.
    pub(crate) fn take(&mut self, group: &GroupName, a: &Allotment, now: Nanos, consumed: f64) {
        let fresh =
            Lot { window: a.window, given: 0.0, base: consumed, ends_at: None, beyond: 0.0, reset_at: None };
        let lot = self.lots.entry(group.clone()).or_insert(fresh);
        if lot.window != a.window {
            *lot = fresh;
        }
        lot.given += finite(a.add);
        lot.ends_at = a.ends_in.map(|d| now.after(d));
        lot.beyond = finite(a.left);
        lot.reset_at = a.reset_in.map(|d| now.after(d));
    }

    /// What is left of `group`'s lot at `now`, the group's consumption here being `consumed`
    /// (`None`: nothing allotted yet, or its window ended).
    pub(crate) fn lot(&self, group: &GroupName, now: Nanos, consumed: f64) -> Option<LotView> {
        let lot = self.lots.get(group)?;
        if lot.ends_at.is_some_and(|end| now >= end) {
            return None;
        }
        Some(LotView {
            window: lot.window,
            room: lot.given - (consumed - lot.base).max(0.0),
            ends_in: lot.ends_at.map(|end| end.since(now)),
            beyond: lot.beyond,
            reset_in: lot.reset_at.map(|at| at.since(now)),
        })
    }

    /// What the region reports it holds of `group`'s lot: what its clients consumed since the
    /// lot began, what they hold unspent (`unspent`) and at most `keep` units more; the rest
    /// goes back to the tier above. `None`: no lot.
    pub(crate) fn held(
        &mut self,
        group: &GroupName,
        consumed: f64,
        unspent: f64,
        keep: f64,
    ) -> Option<QuotaHeld> {
        let lot = self.lots.get_mut(group)?;
        let used = (consumed - lot.base).max(0.0);
        lot.given = lot.given.min(used + unspent + finite(keep)).max(used);
        Some(QuotaHeld { window: lot.window, given: lot.given, used, lasts: None })
    }

    /// Keeps the lots of the groups `keep` says are still in use.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&GroupName) -> bool) {
        self.lots.retain(|g, _| keep(g));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_lot_is_what_the_tier_above_allotted_less_what_was_consumed_since_it_began() {
        let g = GroupName::new("api").unwrap();
        let mut above = Above::default();
        assert_eq!(above.lot(&g, Nanos(0), 0.0), None);
        let a = |window, add| Allotment {
            window,
            add,
            ends_in: Some(Duration::from_secs(30)),
            left: 50.0,
            reset_in: None,
        };
        // 40 allotted when the region had consumed 100 in all; 10 more later.
        above.take(&g, &a(7, 40.0), Nanos(S), 100.0);
        above.take(&g, &a(7, 10.0), Nanos(2 * S), 105.0);
        let lot = above.lot(&g, Nanos(2 * S), 112.0).unwrap();
        assert_eq!((lot.window, lot.room, lot.beyond), (7, 38.0, 50.0));
        assert_eq!(lot.ends_in, Some(Duration::from_secs(30)));
        // Reported: 12 used, 20 held by clients, 5 kept; 13 go back.
        let held = above.held(&g, 112.0, 20.0, 5.0).unwrap();
        assert_eq!((held.window, held.given, held.used), (7, 37.0, 12.0));
        // Its window over: nothing left to allot until the next one's lot.
        assert_eq!(above.lot(&g, Nanos(32 * S), 112.0), None);
        above.take(&g, &a(8, 20.0), Nanos(32 * S), 112.0);
        assert_eq!(above.lot(&g, Nanos(32 * S), 115.0).unwrap().room, 17.0);
    }
}
