//! How much one charge may take: a service charges work after it is done (`POST /v1/charge`,
//! Envoy's `tollgate_charge` descriptors), and a charge past what the group holds is debt its
//! later requests wait for. One charge is bounded by what the group can repay in
//! `--charge-repay-s` seconds (60 by default): its burst, or its limit over that time,
//! whichever is larger. A group with no limit takes any charge up to 10⁹ units.

use std::time::Duration;

use tollgate_model::settings::GroupSettings;

/// The repay time when none is configured.
pub const REPAY_DEFAULT: Duration = Duration::from_secs(60);
/// The longest repay time `--charge-repay-s` takes (a day).
pub const REPAY_MAX_S: u64 = 86_400;

/// The bound on one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeBound {
    repay: Duration,
}

impl Default for ChargeBound {
    fn default() -> Self {
        ChargeBound { repay: REPAY_DEFAULT }
    }
}

impl ChargeBound {
    /// A bound of what a group repays in `seconds` (1 to [`REPAY_MAX_S`]).
    pub fn new(seconds: u64) -> Result<ChargeBound, String> {
        if !(1..=REPAY_MAX_S).contains(&seconds) {
            return Err(format!("--charge-repay-s: must be from 1 to {REPAY_MAX_S}, got {seconds}"));
        }
        Ok(ChargeBound { repay: Duration::from_secs(seconds) })
    }

    /// The most units one charge of a group with `settings` may take; `None`: no bound of
    /// its own (no limit).
    pub fn most(&self, settings: &GroupSettings) -> Option<f64> {
        let limit = settings.limit().as_f64();
        limit.is_finite().then(|| settings.burst_for(limit).max(limit * self.repay.as_secs_f64()))
    }

    /// Refuses a charge of `units` on `group` past its bound, naming the bound.
    pub fn check(&self, group: &str, settings: Option<&GroupSettings>, units: f64) -> Result<(), String> {
        match settings.and_then(|s| self.most(s)) {
            Some(most) if units > most => Err(format!(
                "at most {most} for group {group:?} in one charge (its burst, or {} s at its limit, whichever is larger: --charge-repay-s), got {units}",
                self.repay.as_secs()
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_charge_is_bounded_by_a_burst_or_the_limit_over_the_repay_time() {
        let b = ChargeBound::default();
        let limited = GroupSettings::builder().limit(100.0).build().unwrap();
        assert_eq!(b.most(&limited), Some(6_000.0));
        assert!(b.check("llm", Some(&limited), 6_000.0).is_ok());
        let e = b.check("llm", Some(&limited), 1_000_000.0).unwrap_err();
        assert!(e.contains("at most 6000 for group \"llm\"") && e.contains("--charge-repay-s"), "{e}");
        // A burst above a minute's limit is the bound.
        let bursty = GroupSettings::builder().limit(10.0).burst(5_000.0).build().unwrap();
        assert_eq!(b.most(&bursty), Some(5_000.0));
        // No limit, no bound of its own; no settings, none either.
        assert_eq!(b.most(&GroupSettings::default()), None);
        assert!(b.check("free", None, 1e9).is_ok());
        assert_eq!(ChargeBound::new(10).unwrap().most(&limited), Some(1_000.0));
        assert!(ChargeBound::new(0).is_err() && ChargeBound::new(REPAY_MAX_S + 1).is_err());
    }
}
