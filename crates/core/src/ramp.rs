//! Ramp-up: a group's pool grows from `min` to `max` units per one-second epoch.
//!
//! Numaflow's throttling lets a pipeline stage warm up: its token
//! pool starts at `min` and grows by `slope = (max − min) / duration` per epoch, in one of four
//! modes. The pool is recomputed lazily, at the first call of an epoch, from what happened in
//! the last epoch that had a call:
//!
//! - `scheduled`: + slope × the epochs since the last call (missed epochs are credited);
//! - `relaxed`: + slope once per epoch with a call (stalls in gaps);
//! - `only_if_used`: + slope if the last active epoch's utilisation reached the threshold,
//!   otherwise unchanged;
//! - `go_back_n`: when more epochs than the cool-down have passed since the last call,
//!   − ramp_down % × slope × (epochs since − 1), once, with no increase in that epoch;
//!   otherwise + slope when utilisation reached the threshold, else − slope (a full slope).
//!
//! The ramp value is kept fractional; the pool in tokens is its whole part; it always stays
//! within `[min, max]`. An epoch's use is what was taken minus what was deposited back, and a
//! remainder that integer division among clients cannot hand out counts as used. Numaflow's
//! code adds a "normalization" term to utilisation that makes `only_if_used` and `go_back_n`
//! ramp faster than its own documentation says; Tollgate follows the documentation, whose
//! sample tables come out row for row (see the tests).

use crate::settings::{RampMode, RampSettings};

/// A ramp's state. Drive it with [`Ramp::at_epoch`] on every call and [`Ramp::use_units`]
/// with what each call takes.
///
/// ```
/// use std::time::Duration;
/// use tollgate_model::ramp::Ramp;
/// use tollgate_model::settings::{RampMode, RampSettings};
///
/// let settings = RampSettings { mode: RampMode::Scheduled, ..RampSettings::new(10.0, 110.0, Duration::from_secs(10)) };
/// let mut ramp = Ramp::new(settings, None);
/// assert_eq!(ramp.at_epoch(0), 10);
/// assert_eq!(ramp.at_epoch(1), 20);
/// assert_eq!(ramp.at_epoch(5), 60); // four epochs missed, all credited
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    settings: RampSettings,
    slope: f64,
    value: f64,
    last_epoch: Option<u64>,
    used: f64,
}

impl Ramp {
    /// A ramp starting at `min`, or at `resume_at` (clamped to `[min, max]`) when resuming.
    pub fn new(settings: RampSettings, resume_at: Option<f64>) -> Self {
        let slope = (settings.max - settings.min) / settings.duration.as_secs_f64().max(1e-9);
        let value = resume_at.unwrap_or(settings.min).clamp(settings.min, settings.max);
        Self { settings, slope, value, last_epoch: None, used: 0.0 }
    }

    /// Growth per epoch.
    pub fn slope(&self) -> f64 {
        self.slope
    }

    /// The fractional ramp value (what a resumed ramp continues from).
    pub fn value(&self) -> f64 {
        self.value
    }

    /// The pool in whole tokens.
    pub fn pool(&self) -> u64 {
        self.value as u64
    }

    /// The settings.
    pub fn settings(&self) -> &RampSettings {
        &self.settings
    }

    /// A call at `epoch` (whole seconds): recomputes the pool if this is the epoch's first
    /// call, and returns the pool for the epoch.
    pub fn at_epoch(&mut self, epoch: u64) -> u64 {
        let Some(last) = self.last_epoch else {
            self.last_epoch = Some(epoch);
            self.used = 0.0;
            return self.pool();
        };
        if epoch <= last {
            return self.pool();
        }
        let (min, max) = (self.settings.min, self.settings.max);
        let since = (epoch - last) as f64;
        let pool = self.pool();
        let utilisation_pct = if pool == 0 { 100.0 } else { self.used / pool as f64 * 100.0 };
        let reached = utilisation_pct >= self.settings.threshold_pct;
        self.value = match self.settings.mode {
            RampMode::Scheduled => self.value + self.slope * since,
            RampMode::Relaxed => self.value + self.slope,
            RampMode::OnlyIfUsed if reached => self.value + self.slope,
            RampMode::OnlyIfUsed => self.value,
            RampMode::GoBackN => {
                if since > self.settings.cool_down.as_secs_f64().trunc() {
                    self.value - self.settings.ramp_down_pct / 100.0 * self.slope * (since - 1.0)
                } else if reached {
                    self.value + self.slope
                } else {
                    self.value - self.slope
                }
            }
        }
        .clamp(min, max);
        self.last_epoch = Some(epoch);
        self.used = 0.0;
        self.pool()
    }

    /// Counts `units` as used in the current epoch (negative to deposit them back).
    pub fn use_units(&mut self, units: f64) {
        self.used = (self.used + units).max(0.0);
    }

    /// What was used in the current epoch.
    pub fn used(&self) -> f64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs one of the design's sample tables: each row is an epoch, `None` an epoch without
    /// a call; each call uses `min(used, pool)`. Returns the pools of the rows with calls.
    fn run(settings: RampSettings, rows: &[Option<(u64, u64)>]) {
        let mut ramp = Ramp::new(settings, None);
        for (epoch, row) in rows.iter().enumerate() {
            let Some((pool, used)) = row else { continue };
            let got = ramp.at_epoch(epoch as u64);
            assert_eq!(got, *pool, "epoch {} (row {})", epoch, epoch + 1);
            ramp.use_units((*used).min(got) as f64);
        }
    }

    fn settings(mode: RampMode) -> RampSettings {
        RampSettings { mode, threshold_pct: 100.0, ..RampSettings::new(10.0, 110.0, Duration::from_secs(10)) }
    }

    fn rows(table: &[(u64, u64)]) -> Vec<Option<(u64, u64)>> {
        table.iter().map(|&r| Some(r)).collect()
    }

    const STEADY: [(u64, u64); 20] = [
        (10, 10),
        (20, 10),
        (30, 20),
        (40, 30),
        (50, 50),
        (60, 40),
        (70, 50),
        (80, 60),
        (90, 50),
        (100, 70),
        (110, 80),
        (110, 85),
        (110, 90),
        (110, 80),
        (110, 100),
        (110, 100),
        (110, 110),
        (110, 110),
        (110, 100),
        (110, 90),
    ];

    #[test]
    fn scheduled_table() {
        run(settings(RampMode::Scheduled), &rows(&STEADY));
    }

    #[test]
    fn scheduled_with_gaps_table() {
        let mut t: Vec<Option<(u64, u64)>> =
            rows(&[(10, 10), (20, 10), (30, 20), (40, 30), (50, 50), (60, 40)]);
        t.extend([None, None, None, None]);
        t.extend(rows(&[
            (110, 50),
            (110, 60),
            (110, 50),
            (110, 70),
            (110, 80),
            (110, 85),
            (110, 90),
            (110, 80),
            (110, 100),
            (110, 100),
            (110, 110),
            (110, 110),
            (110, 100),
            (110, 90),
        ]));
        run(settings(RampMode::Scheduled), &t);
    }

    #[test]
    fn relaxed_table() {
        run(settings(RampMode::Relaxed), &rows(&STEADY));
    }

    #[test]
    fn relaxed_with_gaps_table() {
        let mut t = rows(&[(10, 10), (20, 10), (30, 20), (40, 30), (50, 50), (60, 40), (70, 50)]);
        t.extend([None, None, None, None]);
        t.extend(rows(&[
            (80, 60),
            (90, 50),
            (100, 70),
            (110, 80),
            (110, 85),
            (110, 90),
            (110, 80),
            (110, 100),
            (110, 100),
            (110, 110),
            (110, 110),
            (110, 100),
            (110, 90),
        ]));
        run(settings(RampMode::Relaxed), &t);
    }

    #[test]
    fn only_if_used_table() {
        run(
            settings(RampMode::OnlyIfUsed),
            &rows(&[
                (10, 10),
                (20, 10),
                (20, 20),
                (30, 30),
                (40, 30),
                (40, 40),
                (50, 50),
                (60, 50),
                (60, 50),
                (60, 60),
                (70, 60),
                (70, 70),
                (80, 70),
                (80, 80),
                (90, 90),
                (100, 100),
                (110, 100),
                (110, 100),
                (110, 100),
                (110, 100),
            ]),
        );
    }

    #[test]
    fn go_back_n_table() {
        let s = RampSettings {
            cool_down: Duration::from_secs(1),
            ramp_down_pct: 100.0,
            ..settings(RampMode::GoBackN)
        };
        run(
            s,
            &rows(&[
                (10, 10),
                (20, 10),
                (10, 10),
                (20, 10),
                (10, 10),
                (20, 20),
                (30, 20),
                (20, 20),
                (30, 20),
                (20, 20),
                (30, 30),
                (40, 30),
                (30, 30),
                (40, 30),
                (30, 20),
                (20, 20),
                (30, 30),
                (40, 40),
                (50, 50),
                (60, 50),
            ]),
        );
    }

    #[test]
    fn go_back_n_with_gaps_table() {
        let s = RampSettings {
            cool_down: Duration::from_secs(1),
            ramp_down_pct: 50.0,
            ..settings(RampMode::GoBackN)
        };
        let mut t = rows(&[
            (10, 10),
            (20, 20),
            (30, 20),
            (20, 20),
            (30, 20),
            (20, 20),
            (30, 30),
            (40, 30),
            (30, 30),
            (40, 30),
            (30, 20),
            (20, 20),
            (30, 30),
            (40, 40),
            (50, 50),
            (60, 60),
            (70, 70),
        ]);
        t.extend([None, None]);
        t.extend(rows(&[(60, 60), (70, 70), (80, 80), (90, 90), (100, 100), (110, 110), (110, 110)]));
        run(s, &t);
    }

    #[test]
    fn stays_within_min_and_max_and_resumes() {
        let s = RampSettings {
            mode: RampMode::GoBackN,
            ..RampSettings::new(10.0, 110.0, Duration::from_secs(10))
        };
        let mut r = Ramp::new(s, None);
        for e in 0..50 {
            let pool = r.at_epoch(e);
            assert!((10..=110).contains(&pool));
        }
        assert_eq!(Ramp::new(s, Some(75.5)).pool(), 75);
        assert_eq!(Ramp::new(s, Some(500.0)).pool(), 110);
        assert_eq!(Ramp::new(s, Some(0.0)).pool(), 10);
    }

    #[test]
    fn fractional_slopes_hand_out_whole_tokens() {
        let s =
            RampSettings { mode: RampMode::Scheduled, ..RampSettings::new(1.0, 4.0, Duration::from_secs(2)) };
        let mut r = Ramp::new(s, None);
        let pools: Vec<u64> = (0..4).map(|e| r.at_epoch(e)).collect();
        assert_eq!(pools, [1, 2, 4, 4]); // 1, 2.5, 4, 4
    }
}
