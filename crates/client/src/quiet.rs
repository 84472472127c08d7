//! Groups whose requests stopped, reported at once with no demand.
//!
//! A client reports a group's demand as the rate it asked over the interval since its last
//! report. When its load goes elsewhere (Envoy pointed at another controller, a job moved to
//! another process), the first report after carries part of the busy interval and only the
//! next one says nothing was asked: up to two exchange periods during which its share of a
//! contended group sits unused while the client now carrying the load is refused.
//!
//! So the exchange task looks at the groups it reported busy (at least
//! [`QUIET_MIN_RATE`] requests a second, so that a silence of [`QUIET_AFTER`] stands for many
//! requests missing, not for a gap between two) every time it polls: one whose running total
//! of units asked has not moved for [`QUIET_AFTER`] is **quiet**. An exchange is made at once,
//! and it reports the group's demand as nothing: the controller's next tick hands its share to
//! the clients still asking. A quiet group that asks again is reported as before; a silence
//! that was only a gap costs it its share for a tick at most (its refusals ask for it again).
//! At most [`WATCHED_MAX`] groups are watched, the busiest reported.

use std::time::Duration;

use tollgate_model::settings::GroupName;
use tollgate_model::time::Nanos;

/// How long a busy group must ask nothing to be quiet.
pub const QUIET_AFTER: Duration = Duration::from_millis(300);

/// The fewest requests a second (asked, admitted or not) a group's last report must show for
/// its silence to count: at this rate [`QUIET_AFTER`] without one is ten requests missing.
pub const QUIET_MIN_RATE: f64 = 10.0 / 0.3;

/// How long after its last request a quiet group that still asks nothing stays watched: by
/// then the moving average
/// of its demand ([`DEMAND_FOLDING_S`](tollgate_model::demand::DEMAND_FOLDING_S)) is under 1 %
/// of what it was, and its reports say it asks nothing on their own.
pub const FORGET_AFTER: Duration = Duration::from_millis(1500);

/// How many groups are watched at most.
pub const WATCHED_MAX: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Units asked in all, when last looked at.
    asked: f64,
    /// When that total last moved.
    moved: Nanos,
    /// Found quiet (and not reported yet, or reported as quiet).
    quiet: bool,
}

/// The groups watched. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct QuietWatch {
    seen: crate::names::ByName<Seen>,
}

impl QuietWatch {
    /// A report of `group` at `now`, whose running total asked is `asked`, showed
    /// `requests_per_s` asked: a busy group is watched (from this total), another is not.
    ///
    /// A watched group that asked nothing since it was last seen stays watched as it was: a
    /// report made in the silence (an early exchange right after the load went elsewhere, its
    /// interval nearly empty) still carries the busy seconds in its demand's moving average,
    /// and only the quiet report that follows says the group asks nothing. Quiet and silent for
    /// [`FORGET_AFTER`] since its last request, that average has faded and the group is let go.
    pub(crate) fn reported(&mut self, now: Nanos, group: &GroupName, asked: f64, requests_per_s: f64) {
        if let Some(s) = self.seen.get_mut(group)
            && s.asked == asked
        {
            if s.quiet && now.since(s.moved) >= FORGET_AFTER {
                self.seen.remove(group);
            }
            return;
        }
        if requests_per_s < QUIET_MIN_RATE {
            self.seen.remove(group);
            return;
        }
        if let Some(s) = self.seen.get_mut(group) {
            *s = Seen { asked, moved: now, quiet: false };
            return;
        }
        if self.seen.len() < WATCHED_MAX {
            self.seen.insert(group.clone(), Seen { asked, moved: now, quiet: false });
        }
    }

    /// Looks at the watched groups at `now` (`asked` gives a group's running total, `None` for
    /// one gone); says whether one has just gone quiet, so that an exchange is due.
    pub(crate) fn look(&mut self, now: Nanos, asked: impl Fn(&GroupName) -> Option<f64>) -> bool {
        let mut went = false;
        self.seen.retain(|name, s| {
            let Some(total) = asked(name) else { return false };
            if total != s.asked {
                *s = Seen { asked: total, moved: now, quiet: false };
            } else if !s.quiet && now.since(s.moved) >= QUIET_AFTER {
                s.quiet = true;
                went = true;
            }
            true
        });
        went
    }

    /// A report `r` of `group` at `now`, over `interval` seconds, when its running total asked
    /// is `asked`: a quiet group asks nothing; then the group is watched, or not, by the
    /// requests it reports ([`reported`](Self::reported)).
    pub(crate) fn report(
        &mut self,
        now: Nanos,
        group: &GroupName,
        (asked, interval): (f64, f64),
        r: &mut tollgate_model::engine::ClientReport,
    ) {
        if self.is_quiet(group) {
            r.demand = 0.0;
        }
        self.reported(now, group, asked, (r.requests + r.throttled) / interval.max(1e-3));
    }

    /// Whether `group` is quiet: its report says it asks nothing.
    pub(crate) fn is_quiet(&self, group: &GroupName) -> bool {
        self.seen.get(group).is_some_and(|s| s.quiet)
    }

    /// Whether any group is watched (else polling has nothing to look at).
    pub(crate) fn watching(&self) -> bool {
        !self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Nanos {
        Nanos(n * 1_000_000)
    }

    #[test]
    fn a_busy_group_that_stops_is_quiet_after_300_ms_once() {
        let g = GroupName::new("g").unwrap();
        let mut w = QuietWatch::default();
        w.reported(ms(0), &g, 600.0, 600.0);
        // Still asking: not quiet.
        assert!(!w.look(ms(100), |_| Some(660.0)));
        assert!(!w.look(ms(300), |_| Some(660.0)));
        assert!(!w.is_quiet(&g));
        // 300 ms since it last moved: quiet, said once.
        assert!(w.look(ms(400), |_| Some(660.0)));
        assert!(w.is_quiet(&g));
        assert!(!w.look(ms(500), |_| Some(660.0)));
        // Reported quiet, it stays quiet until it asks again.
        w.reported(ms(500), &g, 660.0, 600.0);
        assert!(w.is_quiet(&g));
        assert!(!w.look(ms(600), |_| Some(661.0)));
        assert!(!w.is_quiet(&g));
    }

    #[test]
    fn a_group_reported_in_its_silence_still_goes_quiet_then_is_let_go() {
        let g = GroupName::new("g").unwrap();
        let mut w = QuietWatch::default();
        w.reported(ms(0), &g, 600.0, 600.0);
        // The load went elsewhere at 50 ms; an early report at 100 ms covers an interval with
        // no request in it, but its demand still holds the busy second.
        assert!(!w.look(ms(50), |_| Some(630.0)));
        w.reported(ms(100), &g, 630.0, 0.0);
        assert!(w.watching(), "silent since it was seen: still watched");
        assert!(!w.look(ms(300), |_| Some(630.0)));
        assert!(w.look(ms(350), |_| Some(630.0)), "300 ms after it last moved: quiet");
        w.reported(ms(400), &g, 630.0, 0.0);
        assert!(w.is_quiet(&g), "its reports say it asks nothing");
        w.reported(ms(1300), &g, 630.0, 0.0);
        assert!(w.is_quiet(&g));
        w.reported(ms(1900), &g, 630.0, 0.0);
        assert!(!w.watching(), "let go once its average has faded");
    }

    #[test]
    fn a_slow_group_is_not_watched_and_a_gone_one_is_forgotten() {
        let (slow, gone) = (GroupName::new("slow").unwrap(), GroupName::new("gone").unwrap());
        let mut w = QuietWatch::default();
        w.reported(ms(0), &slow, 5.0, 2.0);
        assert!(!w.watching(), "two requests a second: a silence of 300 ms means nothing");
        w.reported(ms(0), &gone, 5.0, 100.0);
        assert!(!w.look(ms(1000), |_| None));
        assert!(!w.watching());
    }
}
