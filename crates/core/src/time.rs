//! Time as Tollgate's algorithms see it.
//!
//! Every decision in `core` is a function of its state, its input and `now`. Time is a
//! [`Nanos`] count on some monotonic clock whose origin the caller chooses; only the edge
//! adapters (in the client crate) read a real clock. Tests drive a [`ManualClock`], so a
//! scenario of minutes runs in microseconds and replays exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A point in time: nanoseconds since the origin of the clock that produced it.
///
/// Points from different clocks cannot be compared meaningfully.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The clock's origin.
    pub const ZERO: Nanos = Nanos(0);

    /// Nanoseconds since the origin.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Seconds since the origin, as a float (for smoothers and rates).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// The time `d` after `self`, saturating at the end of time.
    pub fn after(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_add(duration_nanos(d)))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of monotonic time.
///
/// Implementations must never go backwards. The client crate provides the real ones; tests use
/// [`ManualClock`].
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Nanos;

    /// The Unix time, in milliseconds, at [`now`](Self::now), if the clock keeps one: quota
    /// windows on the calendar are placed on it. `None` (the default): the system's wall
    /// clock, read once by each limiter.
    fn unix_ms(&self) -> Option<u64> {
        None
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }

    fn unix_ms(&self) -> Option<u64> {
        (**self).unix_ms()
    }
}

/// A clock that moves only when told to: the fake clock for tests and simulations.
///
/// Clones share the same time, so a test can keep one and hand another to a limiter.
///
/// ```
/// use std::time::Duration;
/// use tollgate_model::time::{Clock, ManualClock, Nanos};
///
/// let clock = ManualClock::new();
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(seen_by_limiter.now(), Nanos(1_500_000_000));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
    /// The Unix time (ms) at the origin, if the clock keeps one.
    unix_at_origin: Option<u64>,
}

impl ManualClock {
    /// A clock at its origin.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at its origin that keeps Unix time too, `unix_ms` milliseconds at the origin:
    /// every limiter sharing it places quota windows on the same calendar.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_model::time::{Clock, ManualClock};
    ///
    /// let clock = ManualClock::at_unix_ms(1_800_000_000_000);
    /// clock.advance(Duration::from_millis(1500));
    /// assert_eq!(clock.unix_ms(), Some(1_800_000_001_500));
    /// ```
    pub fn at_unix_ms(unix_ms: u64) -> Self {
        ManualClock { nanos: Arc::default(), unix_at_origin: Some(unix_ms) }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.nanos.fetch_add(duration_nanos(d), Ordering::SeqCst);
    }

    /// Moves the clock to `t`. Panics if `t` is earlier than now: clocks never go backwards.
    pub fn set(&self, t: Nanos) {
        let previous = self.nanos.swap(t.0, Ordering::SeqCst);
        assert!(previous <= t.0, "a ManualClock must not go backwards");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn unix_ms(&self) -> Option<u64> {
        self.unix_at_origin.map(|origin| origin.saturating_add(self.now().0 / 1_000_000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Nanos::ZERO);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now().as_secs_f64(), 2.0);
        clock.set(Nanos(3_000_000_000));
        assert_eq!(clock.now().since(Nanos(1_000_000_000)), Duration::from_secs(2));
    }

    #[test]
    #[should_panic(expected = "must not go backwards")]
    fn manual_clock_refuses_to_go_backwards() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1));
        clock.set(Nanos(5));
    }
}
