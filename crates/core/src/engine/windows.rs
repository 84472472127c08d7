//! TiDB's diagnostics per group: the low and high water marks and the average of its
//! consumption rate over the last minute and the last hour.
//!
//! Each window is a ring of buckets (three of 20 s for the minute, four of 15 min for the
//! hour), each holding the smallest, largest and summed per-tick rates it saw and how many;
//! the window's marks are over the buckets of its span, so "the last minute" is the last 40 to
//! 60 s and "the last hour" the last 45 to 60 minutes. About 120 bytes per group in traffic,
//! whatever the tick: the state kept for 100,000 groups stays within its budget.

use crate::time::Nanos;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    min: f32,
    max: f32,
    sum: f32,
    n: u32,
}

const EMPTY: Bucket = Bucket { min: f32::INFINITY, max: f32::NEG_INFINITY, sum: 0.0, n: 0 };

#[derive(Debug, Clone)]
struct Window<const N: usize, const SPAN_S: u64> {
    buckets: [Bucket; N],
    /// The bucket the last sample fell in (buckets of `SPAN_S` since time 0): its index is
    /// this modulo `N`.
    current: u32,
}

impl<const N: usize, const SPAN_S: u64> Window<N, SPAN_S> {
    fn new() -> Self {
        Self { buckets: [EMPTY; N], current: 0 }
    }

    fn bucket_of(now: Nanos) -> u64 {
        now.0 / (SPAN_S * 1_000_000_000)
    }

    fn add(&mut self, now: Nanos, rate: f64) {
        let bucket = Self::bucket_of(now);
        let current = u64::from(self.current);
        if bucket > current {
            // Clear the buckets skipped since (at most all of them).
            for b in (current + 1)..=bucket.min(current + N as u64) {
                self.buckets[(b % N as u64) as usize] = EMPTY;
            }
            self.current = u32::try_from(bucket).unwrap_or(u32::MAX);
        }
        let b = &mut self.buckets[(u64::from(self.current) % N as u64) as usize];
        let r = rate as f32;
        b.min = b.min.min(r);
        b.max = b.max.max(r);
        b.sum += r;
        b.n += 1;
    }

    fn marks(&self, now: Nanos) -> Option<RateMarks> {
        let bucket = Self::bucket_of(now);
        let oldest = (bucket + 1).saturating_sub(N as u64);
        let (mut min, mut max, mut sum, mut n) = (f32::INFINITY, f32::NEG_INFINITY, 0.0f64, 0u64);
        for b in oldest..=bucket.min(u64::from(self.current)) {
            let k = &self.buckets[(b % N as u64) as usize];
            if k.n > 0 {
                min = min.min(k.min);
                max = max.max(k.max);
                sum += f64::from(k.sum);
                n += u64::from(k.n);
            }
        }
        (n > 0).then(|| RateMarks { low: f64::from(min), high: f64::from(max), average: sum / n as f64 })
    }
}

/// The low and high water marks and the average of a rate over a window, units/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateMarks {
    /// The smallest per-tick rate.
    pub low: f64,
    /// The largest per-tick rate.
    pub high: f64,
    /// The average of the per-tick rates.
    pub average: f64,
}

/// A group's consumption-rate windows.
#[derive(Debug, Clone)]
pub struct RateWindows {
    minute: Window<3, 20>,
    hour: Window<4, 900>,
}

impl Default for RateWindows {
    fn default() -> Self {
        Self { minute: Window::new(), hour: Window::new() }
    }
}

impl RateWindows {
    /// Records the rate a tick at `now` measured.
    pub fn add(&mut self, now: Nanos, rate: f64) {
        self.minute.add(now, rate);
        self.hour.add(now, rate);
    }

    /// The marks over the last minute and the last hour, as of `now` (`None`: no tick in it).
    pub fn marks(&self, now: Nanos) -> (Option<RateMarks>, Option<RateMarks>) {
        (self.minute.marks(now), self.hour.marks(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn marks_cover_the_last_minute_and_hour() {
        let mut w = RateWindows::default();
        // 90 s at 100/s, with one tick at 400 at 30 s and one at 10 at 80 s.
        for t in 1..=90 {
            let rate = match t {
                30 => 400.0,
                80 => 10.0,
                _ => 100.0,
            };
            w.add(Nanos(t * S), rate);
        }
        let (minute, hour) = w.marks(Nanos(90 * S));
        let minute = minute.unwrap();
        // The minute (buckets from 40 s) saw the 10, not the 400 at 30 s; the hour saw both.
        assert_eq!((minute.low, minute.high), (10.0, 100.0));
        let hour = hour.unwrap();
        assert_eq!((hour.low, hour.high), (10.0, 400.0));
        assert!((hour.average - (88.0 * 100.0 + 410.0) / 90.0).abs() < 1e-3, "{hour:?}");
        // An hour and more of silence: nothing left in either.
        let (minute, hour) = w.marks(Nanos(90 * S + 3700 * S));
        assert!(minute.is_none() && hour.is_none());
        w.add(Nanos(90 * S + 3700 * S), 7.0);
        let (minute, _) = w.marks(Nanos(90 * S + 3700 * S));
        assert_eq!(minute.unwrap(), RateMarks { low: 7.0, high: 7.0, average: 7.0 });
    }
}
