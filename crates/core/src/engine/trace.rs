//! A trace of every rate computation, FoundationDB's `GlobalTagThrottler_GotClientRate` in
//! spirit: per group per tick, every input and output of its target; per backend report, each
//! group it carries with its cost rate and its share of the backend's load (a busy-group
//! event). Off unless asked for ([`Engine::set_tracing`](super::Engine::set_tracing)); the
//! events wait in a bounded buffer until [`Engine::take_trace`](super::Engine::take_trace).

use serde::Serialize;

/// The most events held between two takes; past it new ones are dropped and counted.
pub const TRACE_BUFFER_MAX: usize = 200_000;

/// A saturated backend a group counted on, with its ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limiter {
    /// The backend, as it reported itself.
    pub backend: String,
    /// Its zone.
    pub zone: String,
    /// Its throttling ratio (the smallest of its zone's, capped at its headroom).
    pub ratio: f64,
    /// Its zone was among the worst ones ignored.
    pub ignored: bool,
}

/// One group's rate computation at one tick.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateComputation {
    /// Seconds since the engine started.
    pub t: f64,
    /// The group.
    pub group: String,
    /// Units/s reserved (a tenth of it under slow start, until a client has been seen).
    pub reserved: f64,
    /// The cap: the limit (or the reservation once the budget is spent), within the ramp.
    pub desired: Option<f64>,
    /// The limiting rate from saturation: load × ratio.
    pub limiting: Option<f64>,
    /// The rate that fills its share of the room its backends below saturation have: its load
    /// there plus the room (`total × (1/u − 1)`) shared among the groups that may take it. Set
    /// when it was throttled at the last tick and its limit is now above the target it had,
    /// it still asks for more than that, below its cap, and no saturated backend limits it: it
    /// takes that room instead of sending at once the work it queued.
    pub headroom: Option<f64>,
    /// The ratio applied, when saturation limits.
    pub ratio: Option<f64>,
    /// Its share of the node's capacity.
    pub share: Option<f64>,
    /// The target: max(reserved, min(desired, limiting or headroom, share)); none when not
    /// throttled.
    pub target: Option<f64>,
    /// What each busy client may use (the water level).
    pub per_client: Option<f64>,
    /// Clients reporting it.
    pub clients: u32,
    /// Units/s asked for.
    pub demand: f64,
    /// Units/s of unthrottled work.
    pub unthrottled: f64,
    /// Units/s consumed over the tick.
    pub admitted: f64,
    /// Its load on the backends, units/s.
    pub load: f64,
    /// Average cost per request, units.
    pub average_cost: f64,
    /// Saturation limits it below its cap.
    pub busy: bool,
    /// The saturated backends it counted on, worst first.
    pub limited_by: Vec<Limiter>,
}

/// One group a backend carries, at one report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BusyGroup {
    /// Seconds since the engine started.
    pub t: f64,
    /// The backend.
    pub backend: String,
    /// Its zone.
    pub zone: String,
    /// The group.
    pub group: String,
    /// Units/s the group puts on the backend.
    pub units_per_s: f64,
    /// Its share of the backend's load, 0 to 1.
    pub busyness: f64,
    /// The backend's utilisation.
    pub utilisation: f64,
}

/// A trace event, serialised with its kind as `"event"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TraceEvent {
    /// A group's rate computation.
    Rate(RateComputation),
    /// A group a backend reported.
    BusyGroup(BusyGroup),
}

impl TraceEvent {
    /// The group it is about.
    pub fn group(&self) -> &str {
        match self {
            TraceEvent::Rate(r) => &r.group,
            TraceEvent::BusyGroup(b) => &b.group,
        }
    }
}

/// The buffer of events not yet taken.
#[derive(Debug, Default)]
pub(crate) struct TraceBuffer {
    pub(crate) events: Vec<TraceEvent>,
    pub(crate) dropped: u64,
}

impl TraceBuffer {
    pub(crate) fn push(&mut self, e: TraceEvent) {
        if self.events.len() < TRACE_BUFFER_MAX {
            self.events.push(e);
        } else {
            self.dropped += 1;
        }
    }
}
