//! Pacing the tick: a tick of many groups spread over a while, so that it never takes a whole
//! core from the exchanges.
//!
//! A tick at 100,000 groups computes for about 20 ms. Run at once, it holds one core of a
//! small machine all that time, and the exchanges arriving meanwhile share what is left: on a
//! machine of two cores, they were the slowest exchanges of every second. Paced, the tick's
//! thread sleeps after each slice for [`PAUSE_RATIO`] times what the slice took, so that it
//! takes about a quarter of a core; a tick then completes some tens of milliseconds later,
//! with the same grants (slices decide exactly as one tick). The pauses of one tick add up to
//! at most [`PAUSE_SHARE_MAX`] of the tick period, so that ticks never fall behind.

use std::time::Duration;

use tokio::time::Instant;

/// A pause after a slice lasts this many times the slice.
pub const PAUSE_RATIO: u32 = 3;
/// The longest single pause.
pub const PAUSE_MAX: Duration = Duration::from_millis(5);
/// The share of the tick period that one tick's pauses may take in all.
pub const PAUSE_SHARE_MAX: f64 = 0.25;

/// Spaces out the slices of one tick: call [`pause`](Self::pause) between two slices.
#[derive(Debug)]
pub struct TickPacer {
    budget: Duration,
    slice_started: Instant,
}

fn now() -> Instant {
    crate::clock::instant()
}

impl TickPacer {
    /// A pacer for one tick of a tick period `period`, its first slice starting now.
    pub fn new(period: Duration) -> Self {
        Self { budget: period.mul_f64(PAUSE_SHARE_MAX), slice_started: now() }
    }

    /// How long to pause after a slice that took `slice`, from what is left of the budget.
    fn pause_after(&mut self, slice: Duration) -> Duration {
        let pause = (slice * PAUSE_RATIO).min(PAUSE_MAX).min(self.budget);
        self.budget -= pause;
        pause
    }

    /// Sleeps for as long as the slice just done deserves.
    pub fn pause(&mut self) {
        let pause = self.pause_after(now().duration_since(self.slice_started));
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        self.slice_started = now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_is_three_slices_long_at_most_five_ms_and_all_within_a_quarter_period() {
        let mut p = TickPacer::new(Duration::from_millis(100));
        assert_eq!(p.pause_after(Duration::from_micros(200)), Duration::from_micros(600));
        assert_eq!(p.pause_after(Duration::from_millis(4)), PAUSE_MAX);
        // 25 ms in all: 5.6 ms taken, 19.4 ms left.
        let rest: Duration = (0..10).map(|_| p.pause_after(Duration::from_millis(1))).sum();
        assert_eq!(rest, Duration::from_micros(19_400));
        assert_eq!(p.pause_after(Duration::from_millis(1)), Duration::ZERO);
    }
}
