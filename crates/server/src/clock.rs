//! The server's edge with time: tokio's clock for the engine, the instants the edges time
//! their waits by, the stopwatch a tick's slices are sized by, and the one wall-clock read.
//! Nothing else in the server reads a clock.

use tollgate_model::time::{Nanos, duration_nanos};

/// The server's clock: tokio's, counted from the server's start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        #[allow(clippy::disallowed_methods)] // the server's edge: tokio time only
        let origin = tokio::time::Instant::now();
        Self { origin }
    }

    /// Now, as the engine sees it.
    pub fn now(&self) -> Nanos {
        #[allow(clippy::disallowed_methods)]
        let now = tokio::time::Instant::now();
        Nanos(duration_nanos(now.duration_since(self.origin)))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Unix time in milliseconds: the only wall-clock read, for ramps that resume across restarts.
pub fn wall_ms() -> u64 {
    #[allow(clippy::disallowed_methods)] // the server's edge
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Tokio's instant now: what the server's edges (connections' idle times, the tick pacer's
/// pauses) time their waits by. No decision of the engine's depends on it.
pub(crate) fn instant() -> tokio::time::Instant {
    #[allow(clippy::disallowed_methods)] // the server's edge: tokio time
    tokio::time::Instant::now()
}

/// A stopwatch started now: how long a tick's slice held the engine, to size the next slice
/// by. Never what a slice decides.
pub(crate) fn stopwatch() -> std::time::Instant {
    #[allow(clippy::disallowed_methods)] // a duration measured, not a decision
    std::time::Instant::now()
}
