//! The live trace (`tollgate trace`): each tick's events, as JSON lines, to whoever follows
//! it, and kept for the simulator's `--trace` when asked. The engine records the events while
//! someone wants them ([`Tracer::wanted`]); the controller hands them here after each tick.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::broadcast;
use tollgate_model::engine::TraceEvent;

/// One trace event as a JSON line, with the group it is about (empty for none).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLine {
    /// The group.
    pub group: String,
    /// The event, as one line of JSON.
    pub json: String,
}

impl TraceLine {
    /// The line for an event.
    pub fn of(event: &TraceEvent) -> TraceLine {
        TraceLine {
            group: event.group().to_string(),
            json: serde_json::to_string(event)
                .unwrap_or_else(|e| format!("{{\"event\":\"error\",\"error\":{:?}}}", e.to_string())),
        }
    }
}

/// How many trace lines a slow subscriber may fall behind before it skips some.
pub const TRACE_CHANNEL: usize = 8192;
/// The most live trace subscribers.
pub const TRACE_SUBSCRIBERS_MAX: usize = 16;

/// The live trace (`tollgate trace`): each tick's events, as JSON lines, to whoever follows
/// it, and kept for the simulator's `--trace` when asked. The engine records the events while
/// someone wants them ([`Tracer::wanted`]); the controller hands them here after each tick.
pub struct Tracer {
    channel: broadcast::Sender<Arc<TraceLine>>,
    /// Events are kept in the engine for the caller to take (the simulator's `--trace`).
    keep: AtomicBool,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer { channel: broadcast::channel(TRACE_CHANNEL).0, keep: AtomicBool::new(false) }
    }
}

/// Whether the next tick's events are wanted, and by whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// Someone follows the trace live.
    pub live: bool,
    /// Events are kept for the caller to take.
    pub kept: bool,
}

impl Wanted {
    /// Whether the engine should record events at all.
    pub fn any(self) -> bool {
        self.live || self.kept
    }

    /// Whether the events recorded are sent live (rather than left for the caller to take).
    pub fn sent(self) -> bool {
        self.live && !self.kept
    }
}

impl Tracer {
    /// Follows the trace: every event from the next tick on. `None` when
    /// [`TRACE_SUBSCRIBERS_MAX`] already follow it.
    pub fn subscribe(&self) -> Option<broadcast::Receiver<Arc<TraceLine>>> {
        (self.channel.receiver_count() < TRACE_SUBSCRIBERS_MAX).then(|| self.channel.subscribe())
    }

    /// Keeps every tick's events for the caller to take (or stops).
    pub fn keep(&self, on: bool) {
        self.keep.store(on, Ordering::Relaxed);
    }

    /// Whether the next tick's events are wanted.
    pub fn wanted(&self) -> Wanted {
        Wanted { live: self.channel.receiver_count() > 0, kept: self.keep.load(Ordering::Relaxed) }
    }

    /// Sends a tick's events to the live subscribers, with a note of how many the engine
    /// dropped for want of room.
    pub fn publish(&self, events: &[TraceEvent], dropped: u64) {
        for e in events {
            let _ = self.channel.send(Arc::new(TraceLine::of(e)));
        }
        if dropped > 0 {
            let json = format!("{{\"event\":\"dropped\",\"count\":{dropped}}}");
            let _ = self.channel.send(Arc::new(TraceLine { group: String::new(), json }));
        }
    }
}
