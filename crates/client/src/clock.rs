//! The edge clocks: the only places that read real time.
//!
//! [`MonotonicClock`] is the default, the CPU's time-stamp counter through `quanta` (the
//! clock `governor` uses too): a read costs a few nanoseconds, far less than the kernel's
//! clock, which matters on the admission hot path. [`TokioClock`] follows tokio's clock,
//! so tests with paused time (`#[tokio::test(start_paused = true)]`) see sleeps advance it.
//! [`CoarseClock`] trades resolution (1 ms) for a read that is one atomic load.
//! Tests that drive time by hand use [`tollgate_model::time::ManualClock`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_model::time::{Clock, Nanos};

/// Monotonic time from the CPU's time-stamp counter, counted from the process's first
/// clock (every `MonotonicClock` and [`CoarseClock`] shares that origin, so their readings
/// compare).
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
}

static ORIGIN: OnceLock<MonotonicClock> = OnceLock::new();

impl MonotonicClock {
    /// The process's monotonic clock.
    pub fn new() -> Self {
        ORIGIN
            .get_or_init(|| {
                let clock = quanta::Clock::new();
                #[allow(clippy::disallowed_methods)] // the edge: real time enters here
                let origin = clock.raw();
                Self { clock, origin }
            })
            .clone()
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline(always)]
    fn now(&self) -> Nanos {
        // The raw counter, scaled once: half the cost of `quanta::Clock::now`.
        #[allow(clippy::disallowed_methods)]
        let raw = self.clock.raw();
        Nanos(self.clock.delta_as_nanos(self.origin, raw))
    }
}

/// How often the [`CoarseClock`]'s background thread refreshes the time.
pub const COARSE_RESOLUTION: Duration = Duration::from_millis(1);

/// The time as of the last refresh by one background thread, every [`COARSE_RESOLUTION`]:
/// a read is a single atomic load.
///
/// For the lowest-latency admission when one millisecond of resolution is enough: with a
/// rate of `r` units/s, keep the burst at least `r / 1000` units, or the bucket cannot hand
/// out what refills between two refreshes. Time read this way lags real time by at most the
/// resolution, so it never admits early. The thread starts with the first `CoarseClock` and
/// runs for the life of the process. Coarse clocks share their origin with
/// [`MonotonicClock`]: a coarse reading is a monotonic reading taken a little earlier.
///
/// Every `CoarseClock` reads the process's one cell: the value holds nothing but the proof
/// that the refresh thread has started.
#[derive(Debug, Clone, Copy)]
pub struct CoarseClock {
    _started: (),
}

static COARSE_NOW: AtomicU64 = AtomicU64::new(0);
static COARSE_STARTED: OnceLock<()> = OnceLock::new();

impl CoarseClock {
    /// The process's coarse clock, starting its refresh thread if need be.
    pub fn new() -> Self {
        COARSE_STARTED.get_or_init(|| {
            let precise = MonotonicClock::new();
            // Set before the first reader can look, so no reading is ever from before it.
            COARSE_NOW.store(precise.now().0, Ordering::Release);
            std::thread::Builder::new()
                .name("tollgate-coarse-clock".into())
                .spawn(move || {
                    loop {
                        COARSE_NOW.store(precise.now().0, Ordering::Release);
                        std::thread::sleep(COARSE_RESOLUTION);
                    }
                })
                .expect("spawn the coarse clock thread");
        });
        Self { _started: () }
    }

    /// The coarse time, read from the process's one cell with no pointer to load first: what
    /// every `CoarseClock` reads. Only once a `CoarseClock` exists (before, it reads 0).
    #[inline(always)]
    pub(crate) fn read_shared() -> Nanos {
        Nanos(COARSE_NOW.load(Ordering::Acquire))
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        Self::read_shared()
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
        Nanos(tollgate_model::time::duration_nanos(now.duration_since(self.origin)))
    }
}

/// The clock a limiter runs on. The built-in clocks are matched directly (no virtual call
/// on the hot path); any other [`Clock`] is called through a pointer.
#[derive(Clone)]
pub(crate) enum ClockSource {
    Monotonic(MonotonicClock),
    Coarse(CoarseClock),
    Custom(std::sync::Arc<dyn Clock>),
}

impl ClockSource {
    pub(crate) fn of<C: Clock>(clock: C) -> Self {
        let any: &dyn std::any::Any = &clock;
        if let Some(c) = any.downcast_ref::<MonotonicClock>() {
            ClockSource::Monotonic(c.clone())
        } else if let Some(c) = any.downcast_ref::<CoarseClock>() {
            ClockSource::Coarse(*c)
        } else {
            ClockSource::Custom(std::sync::Arc::new(clock))
        }
    }
}

impl ClockSource {
    /// The coarse clock buckets whose burst tolerates a millisecond of lag read: beside the
    /// default precise clock (a read is one load, where the time-stamp counter costs about
    /// 10 ns on the Intel and AMD servers measured in BENCHMARKS.md) or the coarse clock
    /// itself; `None` for a clock given for tests and simulations, which is read as it is.
    pub(crate) fn coarse_companion(&self) -> Option<CoarseClock> {
        match self {
            ClockSource::Monotonic(_) => Some(CoarseClock::new()),
            ClockSource::Coarse(c) => Some(*c),
            ClockSource::Custom(_) => None,
        }
    }
}

impl ClockSource {
    /// Whether this is real time (the default clock or the coarse one), which a thread of the
    /// limiter's own may wait on; a clock given for tests and simulations is only read.
    pub(crate) fn is_real(&self) -> bool {
        !matches!(self, ClockSource::Custom(_))
    }
}

impl Clock for ClockSource {
    #[inline(always)]
    fn now(&self) -> Nanos {
        match self {
            ClockSource::Monotonic(c) => c.now(),
            ClockSource::Coarse(c) => c.now(),
            ClockSource::Custom(c) => c.now(),
        }
    }

    fn unix_ms(&self) -> Option<u64> {
        match self {
            ClockSource::Custom(c) => c.unix_ms(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coarse_reading_never_runs_ahead_of_the_monotonic_clock() {
        let coarse = CoarseClock::new();
        let precise = MonotonicClock::new();
        for _ in 0..10_000 {
            let late = coarse.now();
            assert!(late <= precise.now());
        }
    }

    #[test]
    fn the_default_clock_pairs_with_the_coarse_one_and_any_other_with_itself() {
        assert!(ClockSource::of(MonotonicClock::new()).coarse_companion().is_some());
        assert!(ClockSource::of(CoarseClock::new()).coarse_companion().is_some());
        let manual = tollgate_model::time::ManualClock::new();
        assert!(ClockSource::of(manual).coarse_companion().is_none());
    }
}
