//! The tick's pacing: when the engine ticks, in slices with the engine handed to waiting
//! exchanges between them, early for a backend newly saturated or a share moved, and what an
//! exchange is told of the next tick.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_model::engine::{Engine, SliceSize};
use tollgate_model::time::Nanos;

use super::readings::Views;
use crate::observe::trace::Tracer;

/// When the ticks run: the last one's turn and span, and the signals for an early one.
pub(super) struct Pacing {
    /// How long the last tick took from its start to its last slice, in nanoseconds (paced,
    /// the server's spans a good part of a second at many groups).
    tick_span_ns: AtomicU64,
    /// Woken when a backend's report shows it newly saturated
    /// ([`Engine::saturation_onset`](tollgate_model::engine::Engine::saturation_onset)), or
    /// a share from the global tier moved.
    onset: tokio::sync::Notify,
    /// In a region: a client named a group the global tier has granted nothing yet.
    share_wanted: tokio::sync::Notify,
    /// How many times `share_wanted` was woken: what a caller stepping a region itself reads.
    shares_wanted: AtomicU64,
    /// Ticks run before their turn for such a report.
    early_ticks: AtomicU64,
    /// A tick was run before its turn since the last regular one.
    early_used: AtomicBool,
    /// A share from the global tier moved since the last tick began (a regional controller):
    /// the next tick is run at once, so the region's grants follow it without waiting a tick.
    upstream_moved: AtomicBool,
    /// When the last tick at its turn began (nanoseconds; `u64::MAX`: none yet): exchanges
    /// tell refused clients when the next one is done.
    turn_ns: AtomicU64,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            tick_span_ns: AtomicU64::new(0),
            onset: tokio::sync::Notify::new(),
            share_wanted: tokio::sync::Notify::new(),
            shares_wanted: AtomicU64::new(0),
            early_ticks: AtomicU64::new(0),
            early_used: AtomicBool::new(false),
            upstream_moved: AtomicBool::new(false),
            turn_ns: AtomicU64::new(u64::MAX),
        }
    }
}

impl Pacing {
    /// How long from `now` until the next tick's grants are all made: as long after its start
    /// as the last one took. While a tick is under way (`ticking`), none: the grants of an
    /// exchange answered between its walks are the ones it is replacing.
    pub(super) fn next_tick(&self, now: Nanos, tick: Duration, ticking: bool) -> Duration {
        let span = Duration::from_nanos(self.tick_span_ns.load(Ordering::Relaxed));
        let turn = Some(self.turn_ns.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX);
        match turn {
            Some(t) if !ticking => Nanos(t).after(tick.saturating_add(span)).since(now),
            _ => Duration::ZERO,
        }
    }

    /// A backend is newly saturated: the next tick may run early.
    pub(super) fn saturated(&self) {
        self.onset.notify_one();
    }

    /// A share from the global tier moved: the next tick runs at once.
    pub(super) fn upstream_moved(&self) {
        self.upstream_moved.store(true, Ordering::Release);
        self.onset.notify_one();
    }

    /// A client named a group the global tier has granted nothing yet.
    pub(super) fn want_share(&self) {
        self.shares_wanted.fetch_add(1, Ordering::Relaxed);
        self.share_wanted.notify_one();
    }

    /// How many times a client wanted a share so far.
    pub(super) fn shares_wanted(&self) -> u64 {
        self.shares_wanted.load(Ordering::Relaxed)
    }

    /// Resolves once a client wants a share ([`want_share`](Self::want_share)).
    pub(super) async fn share_wanted(&self) {
        self.share_wanted.notified().await;
    }
}

/// The controller's ticking ([`Controller::pacer`](super::Controller::pacer)).
#[derive(Clone, Copy)]
pub struct Pacer<'a> {
    pub(super) engine: &'a parking_lot::Mutex<Engine>,
    pub(super) state: &'a Pacing,
    pub(super) views: &'a Views,
    pub(super) tracer: &'a Tracer,
}

impl Pacer<'_> {
    /// The tick period: how often [`tick`](Self::tick) should run.
    pub fn tick_period(&self) -> Duration {
        self.engine.lock().settings().tick
    }

    /// Runs one engine tick at `now`. The view of the previous tick is dropped with it, so
    /// that it holds no memory for groups that have since expired.
    ///
    /// The tick walks the groups in slices of about
    /// [`TICK_SLICE_TARGET`](tollgate_model::engine::TICK_SLICE_TARGET) each, and between
    /// two slices hands the engine to any exchange waiting for it (answered with the grants
    /// made so far): at 100,000 groups a whole tick holds the engine for tens of
    /// milliseconds, a slice for a twentieth of one. This blocks: call it where blocking is
    /// allowed.
    ///
    /// While someone follows the trace, each group's rate computation (and every backend's
    /// busy groups) goes to them as JSON lines.
    pub fn tick(&self, now: Nanos) {
        self.tick_paced(now, || {});
    }

    /// Records how long the last tick took from its start to its end, for the exchanges'
    /// answers: a client refused now is told to come back once the next tick is done, not
    /// as soon as it starts.
    pub fn set_tick_span(&self, span: Duration) {
        self.state.tick_span_ns.store(u64::try_from(span.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// [`tick`](Self::tick), calling `pause` between two slices with the engine unlocked.
    /// The server sleeps there (its tick pacer), so that a tick of
    /// many groups takes a share of a core for a while rather than a whole core at once, and
    /// the exchanges answered meanwhile do not queue behind it for a core. Pausing changes
    /// when the tick completes, not what it decides.
    pub fn tick_paced(&self, now: Nanos, pause: impl FnMut()) {
        self.run_tick(now, false, pause);
    }

    /// [`tick_paced`](Self::tick_paced) before the tick's turn, for a backend newly saturated
    /// ([`take_early_tick`](Self::take_early_tick)): counted, and the regular ticks keep
    /// their times, so clients refused meanwhile are still told to come back after the next
    /// regular one.
    pub fn tick_early_paced(&self, now: Nanos, pause: impl FnMut()) {
        self.run_tick(now, true, pause);
        // Counted once done: whoever sees the count sees the tick's results.
        self.state.early_ticks.fetch_add(1, Ordering::Release);
    }

    fn run_tick(&self, now: Nanos, early: bool, mut pause: impl FnMut()) {
        let wanted = self.tracer.wanted();
        let mut engine = self.engine.lock();
        engine.set_tracing(wanted.any());
        engine.begin_tick(now);
        if !early {
            self.state.turn_ns.store(now.0, Ordering::Relaxed);
            self.state.early_used.store(false, Ordering::Release);
        }
        // Each walk starts with a small slice and grows toward the target time: a walk's
        // groups cost their own (the grants' about a microsecond each at 100,000 groups).
        let mut size = SliceSize::start(&engine);
        loop {
            let started = crate::clock::stopwatch();
            if engine.tick_slice(size.get()) {
                break;
            }
            size.after(&engine, started.elapsed());
            // The capacity's sharing reads every group at once (milliseconds at 100,000):
            // computed with the engine unlocked, so that exchanges go on meanwhile.
            if let Some(work) = engine.shares_work() {
                let shares = parking_lot::MutexGuard::unlocked_fair(&mut engine, || work.compute());
                engine.put_shares(shares);
                continue;
            }
            // Unlocked to the thread waiting longest, if any (the lock is not fair otherwise:
            // this thread would take it straight back).
            parking_lot::MutexGuard::unlocked_fair(&mut engine, &mut pause);
        }
        debug_assert!(!engine.ticking(), "a tick run to its end");
        let taken = wanted.sent().then(|| engine.take_trace());
        drop(engine);
        self.views.forget();
        if let Some((events, dropped)) = taken {
            self.tracer.publish(&events, dropped);
        }
    }

    /// Completes once a backend's report has shown it newly saturated since the last tick
    /// began (at once if one did since the last call): the server then ticks without waiting
    /// for the tick's turn, at most once between two regular ticks.
    pub async fn saturation_onset(self) {
        self.state.onset.notified().await;
    }

    /// Whether to tick now, before the tick's turn: a backend's report has shown it newly
    /// saturated since the last tick began, and no tick has been run early since the last
    /// regular one (so a backend flapping in and out of saturation, or many reporting one
    /// after another, at most doubles the ticks). Says yes once; the caller then runs
    /// [`tick_early_paced`](Self::tick_early_paced).
    pub fn take_early_tick(&self) -> bool {
        let moved = self.state.upstream_moved.swap(false, Ordering::AcqRel);
        (moved || self.engine.lock().saturation_onset())
            && !self.state.early_used.swap(true, Ordering::AcqRel)
    }

    /// Engine ticks completed since this controller started, early ones included.
    pub fn ticks(&self) -> u64 {
        self.engine.lock().ticks()
    }

    /// Ticks run before their turn, for backends newly saturated.
    pub fn early_ticks(&self) -> u64 {
        self.state.early_ticks.load(Ordering::Acquire)
    }
}
