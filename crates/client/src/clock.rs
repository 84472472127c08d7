//! The edge clocks: the only places that read real time.
//!
//! [`MonotonicClock`] is the default, the CPU's time-stamp counter through `quanta` (the
//! clock `governor` uses too): a read costs a few nanoseconds, far less than the kernel's
//! clock, which matters on the admission hot path. [`TokioClock`] follows tokio's clock,
//! so tests with paused time (`#[tokio::test(start_paused = true)]`) see sleeps advance it.
//! Tests that drive time by hand use [`tollgate_core::time::ManualClock`].

use tollgate_core::time::{Clock, Nanos};

/// Monotonic time from the CPU's time-stamp counter, counted from the clock's creation.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        // The edge: this is where real time enters.
        #[allow(clippy::disallowed_methods)]
        let origin = clock.now();
        Self { clock, origin }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        #[allow(clippy::disallowed_methods)]
        let now = self.clock.now();
        Nanos(tollgate_core::time::duration_nanos(now.duration_since(self.origin)))
    }
}

/// Time from tokio's clock, counted from the clock's creation; paused and advanced with
/// tokio's test utilities. Must be created inside a tokio runtime.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is tokio's now.
    pub fn new() -> Self {
        #[allow(clippy::disallowed_methods)]
        let origin = tokio::time::Instant::now();
        Self { origin }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        #[allow(clippy::disallowed_methods)]
        let now = tokio::time::Instant::now();
        Nanos(tollgate_core::time::duration_nanos(now.duration_since(self.origin)))
    }
}
