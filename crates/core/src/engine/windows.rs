//! TiDB's diagnostics per group: the low and high water marks and the average of its
//! consumption rate over the last minute and the last hour.
//!
//! Each window is a ring of buckets (three of 20 s for the minute, four of 15 min for the
//! hour), each holding the smallest, largest and summed per-tick rates it saw and how many;
//! the window's marks are over the buckets of its span, so "the last minute" is the last 40 to
//! 60 s and "the last hour" the last 45 to 60 minutes. About 120 bytes per group in traffic,
//! whatever the tick: the state kept for 100,000 groups stays within its budget.
//!
//! A tick touches only [`RateNow`], the current 20-second bucket kept inline in the group's
//! state; the rings (boxed, apart) take it whole when the next bucket begins, so the tick walks
//! no other memory.

use crate::time::Nanos;

#[derive(Debug, Clone, Copy, PartialEq)]
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

    /// Merges `part`, whose samples were taken at `at`, into the bucket of `at`.
    fn merge(&mut self, at: Nanos, part: &Bucket) {
        let bucket = Self::bucket_of(at);
        let current = u64::from(self.current);
        if bucket > current {
            // Clear the buckets skipped since (at most all of them).
            for b in (current + 1)..=bucket.min(current + N as u64) {
                self.buckets[(b % N as u64) as usize] = EMPTY;
            }
            self.current = u32::try_from(bucket).unwrap_or(u32::MAX);
        } else if bucket + (N as u64) <= current {
            return; // older than the window
        }
        let b = &mut self.buckets[(bucket % N as u64) as usize];
        b.min = b.min.min(part.min);
        b.max = b.max.max(part.max);
        b.sum += part.sum;
        b.n += part.n;
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

/// The minute and hour rings: what [`RateNow`] hands over each time a 20-second bucket ends.
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

/// The current 20-second bucket of a group's rates, kept inline; `at` is when its first
/// sample was taken (nanoseconds), 0 when it holds none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateNow {
    bucket: Bucket,
    /// The 20-second bucket its samples belong to.
    number: u32,
}

impl Default for RateNow {
    fn default() -> Self {
        Self { bucket: EMPTY, number: 0 }
    }
}

const NOW_SPAN_NS: u64 = 20_000_000_000;

impl RateNow {
    /// Records the rate a tick at `now` measured. When a new 20-second bucket begins, the one
    /// that ended goes to `rings` (made on first use).
    pub fn add(&mut self, rings: &mut Option<Box<RateWindows>>, now: Nanos, rate: f64) {
        let number = u32::try_from(now.0 / NOW_SPAN_NS).unwrap_or(u32::MAX);
        if number != self.number && self.bucket.n > 0 {
            let at = Nanos(u64::from(self.number) * NOW_SPAN_NS);
            let r = rings.get_or_insert_default();
            r.minute.merge(at, &self.bucket);
            r.hour.merge(at, &self.bucket);
            self.bucket = EMPTY;
        }
        self.number = number;
        let v = rate as f32;
        let b = &mut self.bucket;
        b.min = b.min.min(v);
        b.max = b.max.max(v);
        b.sum += v;
        b.n += 1;
    }

    /// The marks over the last minute and the last hour, as of `now` (`None`: no sample in
    /// it), from the rings and this bucket.
    pub fn marks(&self, rings: Option<&RateWindows>, now: Nanos) -> (Option<RateMarks>, Option<RateMarks>) {
        let mut all = rings.cloned().unwrap_or_default();
        if self.bucket.n > 0 {
            let at = Nanos(u64::from(self.number) * NOW_SPAN_NS);
            all.minute.merge(at, &self.bucket);
            all.hour.merge(at, &self.bucket);
        }
        (all.minute.marks(now), all.hour.marks(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn marks_cover_the_last_minute_and_hour() {
        let mut rings = None;
        let mut w = RateNow::default();
        // 90 s at 100/s, with one tick at 400 at 30 s and one at 10 at 80 s.
        for t in 1..=90 {
            let rate = match t {
                30 => 400.0,
                80 => 10.0,
                _ => 100.0,
            };
            w.add(&mut rings, Nanos(t * S), rate);
        }
        let marks =
            |w: &RateNow, rings: &Option<Box<RateWindows>>, t: u64| w.marks(rings.as_deref(), Nanos(t));
        let (minute, hour) = marks(&w, &rings, 90 * S);
        let minute = minute.unwrap();
        // The minute (buckets from 40 s) saw the 10, not the 400 at 30 s; the hour saw both.
        assert_eq!((minute.low, minute.high), (10.0, 100.0));
        let hour = hour.unwrap();
        assert_eq!((hour.low, hour.high), (10.0, 400.0));
        assert!((hour.average - (88.0 * 100.0 + 410.0) / 90.0).abs() < 1e-3, "{hour:?}");
        // An hour and more of silence: nothing left in either.
        let (minute, hour) = marks(&w, &rings, 90 * S + 3700 * S);
        assert!(minute.is_none() && hour.is_none());
        w.add(&mut rings, Nanos(90 * S + 3700 * S), 7.0);
        let (minute, _) = marks(&w, &rings, 90 * S + 3700 * S);
        assert_eq!(minute.unwrap(), RateMarks { low: 7.0, high: 7.0, average: 7.0 });
    }
}
