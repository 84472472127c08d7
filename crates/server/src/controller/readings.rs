//! What the controller shows: the groups' view and the diagnostics as of the last tick (each
//! made at most once per tick, in parts, and sorted outside the engine's lock), the counts of
//! its work, the trace, and the store's health.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::engine::{Diagnostics, Engine, GroupView, TraceEvent};
use tollgate_model::time::Nanos;

use super::DIAGNOSTICS_SHOWN_MAX;
use crate::observe::trace::Tracer;
use crate::store::Shared;

/// The views kept from one tick to the next, and the counts of the controller's work.
#[derive(Default)]
pub(super) struct Views {
    /// The sorted view of the last tick, and the tick it was built at.
    view: Mutex<Option<(u64, Arc<Vec<GroupView>>)>>,
    /// Backends and clients as of a tick, made at most once per tick like the view.
    diagnostics: Mutex<Option<(u64, Arc<Diagnostics>)>>,
    /// Exchanges answered.
    pub(super) exchanges: AtomicU64,
    /// Writes to the gRPC connections' sockets, counted by the listener.
    pub(super) grpc_writes: Arc<AtomicU64>,
    /// Flushes of consumption to the store that failed (the consumption is kept for the next).
    pub(super) flush_failures: AtomicU64,
}

impl Views {
    /// Drops the view kept, after a tick or a change (it holds no memory for groups gone).
    pub(super) fn forget(&self) {
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// What the controller shows ([`Controller::readings`](super::Controller::readings)).
pub struct Readings<'a> {
    pub(super) engine: &'a parking_lot::Mutex<Engine>,
    pub(super) store: &'a Shared,
    pub(super) views: &'a Views,
    pub(super) tracer: &'a Tracer,
}

impl Readings<'_> {
    /// Keeps every tick's trace events for [`take_trace`](Self::take_trace) (or stops).
    pub fn set_tracing(&self, on: bool) {
        self.tracer.keep(on);
        self.engine.lock().set_tracing(on);
    }

    /// The trace events kept since the last take, and how many were dropped for want of room.
    pub fn take_trace(&self) -> (Vec<TraceEvent>, u64) {
        self.engine.lock().take_trace()
    }

    /// Clients seen to restart so far (an exchange numbered below its client's last).
    pub fn client_restarts(&self) -> u64 {
        self.engine.lock().client_restarts()
    }

    /// Exchanges answered so far.
    pub fn exchanges(&self) -> u64 {
        self.views.exchanges.load(Ordering::Relaxed)
    }

    /// Writes to the gRPC connections' sockets so far: about one per answer (see
    /// `listen::SliceAnswers`), fewer when answers go out together.
    pub fn grpc_writes(&self) -> u64 {
        self.views.grpc_writes.load(Ordering::Relaxed)
    }

    /// Every group configured or seen in traffic, by name, as of the last tick. Built at most
    /// once per tick (and after each admin change), in time linear in the groups, and sorted
    /// outside the engine's lock.
    pub fn view(&self) -> Arc<Vec<GroupView>> {
        /// Groups viewed in one hold of the engine.
        const VIEW_PART: usize = 1024;
        let ticks = self.engine.lock().ticks();
        let mut cache = self.views.view.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, view)) = cache.as_ref()
            && *at == ticks
        {
            return view.clone();
        }
        // A part at a time: at 100,000 groups the whole view held the engine (and every
        // exchange waiting on it) for tens of milliseconds.
        let mut view = Vec::new();
        let mut at = Some(0);
        while let Some(start) = at {
            let (part, next) = self.engine.lock().view_part(start, VIEW_PART);
            view.extend(part);
            at = next;
        }
        view.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let view = Arc::new(view);
        *cache = Some((ticks, view.clone()));
        view
    }

    /// Backends and clients, at most [`DIAGNOSTICS_SHOWN_MAX`] of each named, as of the last
    /// tick (made at most once per tick).
    pub fn diagnostics(&self, now: Nanos) -> Arc<Diagnostics> {
        let ticks = self.engine.lock().ticks();
        let mut cache = self.views.diagnostics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, d)) = cache.as_ref()
            && *at == ticks
        {
            return d.clone();
        }
        let (d, ticks) = {
            let engine = self.engine.lock();
            (engine.diagnostics(now, DIAGNOSTICS_SHOWN_MAX), engine.ticks())
        };
        let d = Arc::new(d);
        *cache = Some((ticks, d.clone()));
        d
    }

    /// What is wrong with the store, while it cannot take writes.
    pub fn store_health(&self) -> Option<String> {
        self.store.health()
    }

    /// Flushes of consumption to the store that failed ([`Writes::flush`](super::Writes::flush) and [`Writes::quota_meters`](super::Writes::quota_meters)).
    pub fn flush_failures(&self) -> u64 {
        self.views.flush_failures.load(Ordering::Relaxed)
    }

    /// How long the engine's learning lease has left ([`Engine::learning_left`]).
    pub fn learning_left(&self, now: Nanos) -> Option<Duration> {
        self.engine.lock().learning_left(now)
    }

    /// What the engine tracks now: (clients, backends, learning).
    pub fn tracking(&self, now: Nanos) -> (usize, usize, bool) {
        let engine = self.engine.lock();
        (engine.clients(), engine.backends(), engine.learning(now))
    }
}
