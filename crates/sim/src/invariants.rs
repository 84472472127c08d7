//! What must hold under faults, checked every simulated second of a run that injects any:
//!
//! 1. **Grants within targets.** While a controller answers, the live grants of every group
//!    (the last tick's and those made since to clients it did not know) add up to no more than
//!    the group's target.
//! 2. **Limits.** Over every window of [`WINDOW_S`] seconds, a group with a limit `L` admits
//!    at most `L × (WINDOW_S + 1) × (1 + d)` units: its limit, one second of bursts, and `d`,
//!    the largest clock drift injected so far. Not checked for groups in shadow mode (never
//!    held to their limits), nor for groups with unthrottled clients, nor over windows that a partition or lost exchanges touch, or the
//!    [`HEAL_S`] seconds after: clients cut off from the controller are governed by their safe
//!    mode, which lets them keep their last grants; nor over windows that a client restart
//!    touches: a restarted process knows nothing of what the dead one spent.
//! 3. **Each second.** Every second, whatever the faults, a group with a limit `L` admits at
//!    most `2 L × (1 + d)`: its limit and one burst.
//! 4. **Reservations.** From [`HEAL_S`] seconds after the last fault healed (a drift never
//!    does, and does not count), a group asking at least its reservation `R` is admitted at
//!    least `0.9 R`.

use tollgate_model::settings::GroupName;

/// The limit's window, in seconds.
pub const WINDOW_S: usize = 10;
/// How long after a fault heals the reservations (and limits, after a partition or losses)
/// must hold again: the grant lease (10 s) and five seconds more.
pub const HEAL_S: f64 = 15.0;

/// An invariant that broke.
#[derive(Debug, Clone, PartialEq)]
pub struct Breach {
    /// Simulated seconds from the start.
    pub t: f64,
    /// Which invariant: `grants`, `limit`, `second` or `reservation`.
    pub invariant: &'static str,
    /// The group.
    pub group: GroupName,
    /// The figures.
    pub detail: String,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "t={}s: {} broken for group {}: {}", self.t, self.invariant, self.group, self.detail)
    }
}

/// One group's figures at one second, as the checker reads them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Second {
    pub admitted: f64,
    pub limit: Option<f64>,
    pub reserved: f64,
    pub demand: Option<f64>,
    pub granted: Option<(f64, f64)>,
    pub unthrottled: bool,
}

/// The checker: the last seconds of every group.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    history: Vec<Vec<Second>>,
}

impl Checker {
    pub(crate) fn new(groups: usize) -> Checker {
        Checker { history: vec![Vec::new(); groups] }
    }

    /// Checks second `t` (each group's figures in `seconds`). `cut_off` is whether clients
    /// were cut off (partition, losses) within the window or less than [`HEAL_S`] ago;
    /// `healed` whether every fault but drifts healed at least [`HEAL_S`] ago; `drift` the
    /// largest drift so far.
    pub(crate) fn check(
        &mut self,
        t: f64,
        groups: &[GroupName],
        seconds: Vec<Second>,
        cut_off: bool,
        healed: bool,
        drift: f64,
    ) -> Result<(), Breach> {
        for (i, s) in seconds.into_iter().enumerate() {
            let group = &groups[i];
            if let Some((invariant, detail)) = breach_within(&s, healed, drift) {
                return Err(Breach { t, invariant, group: group.clone(), detail });
            }
            let h = &mut self.history[i];
            h.push(s);
            if h.len() > WINDOW_S {
                h.remove(0);
            }
            let window = &h[..];
            let limit = window[0].limit;
            let same_limit = window.iter().all(|w| w.limit == limit);
            if let Some(l) = limit
                && window.len() == WINDOW_S
                && same_limit
                && !cut_off
                && !window.iter().any(|w| w.unthrottled)
            {
                let admitted: f64 = window.iter().map(|w| w.admitted).sum();
                let bound = l * (WINDOW_S as f64 + 1.0) * (1.0 + drift) + 1.0;
                if admitted > bound {
                    return Err(Breach {
                        t,
                        invariant: "limit",
                        group: group.clone(),
                        detail: format!(
                            "admitted {admitted:.1} units over {WINDOW_S} s with a limit of {l} units/s (bound {bound:.1})"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The invariant a group's second breaks on its own, and how: grants above the target, a
/// reservation not met once healed, or more than twice the limit admitted.
fn breach_within(s: &Second, healed: bool, drift: f64) -> Option<(&'static str, String)> {
    if let Some((granted, target)) = s.granted
        && granted > target * (1.0 + 1e-9) + 1e-6
    {
        return Some(("grants", format!("live grants {granted:.3} units/s above the target {target:.3}")));
    }
    if healed
        && s.reserved > 0.0
        && s.demand.is_some_and(|d| d >= s.reserved)
        && s.admitted < 0.9 * s.reserved
    {
        let asked = s.demand.unwrap_or(0.0);
        let detail =
            format!("admitted {:.3} units/s while asking {asked:.3}, reserved {:.3}", s.admitted, s.reserved);
        return Some(("reservation", detail));
    }
    if let Some(l) = s.limit
        && !s.unthrottled
        && s.admitted > 2.0 * l * (1.0 + drift) + 1.0
    {
        let detail = format!("admitted {:.1} units in one second with a limit of {l} units/s", s.admitted);
        return Some(("second", detail));
    }
    None
}
