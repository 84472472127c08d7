//! The scheduling half, for a server's request path: at most `concurrency` requests run at
//! once; the others wait in a [`FairQueue`], and each freed slot goes to the next request in
//! (priority, virtual time) order, as TiKV schedules its read pool.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_client::scheduler::{Scheduler, SchedulerOptions};
//! use tollgate_client::core::config::Config;
//!
//! let settings = Config::parse("[groups.oltp]\npriority = \"high\"\nreserved = 5000\n")?;
//! let scheduler = Scheduler::new(&settings, SchedulerOptions { concurrency: 4, ..Default::default() });
//! let slot = scheduler.acquire("oltp", 3.0).await?; // runs now, or waits its turn
//! // ... serve the request ...
//! drop(slot); // the next waiter in fair order goes
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::oneshot;
use tollgate_core::config::Config;
use tollgate_core::schedule::{FairQueue, QueueFull};
use tollgate_core::settings::{GroupName, check_group_name};
use tollgate_core::time::{Clock, Nanos};

use crate::clock::TokioClock;

/// How the scheduler behaves.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Requests running at once.
    pub concurrency: usize,
    /// How long a request waits for a slot at most.
    pub max_wait: Duration,
    /// How many requests of one group may wait.
    pub queue_len_max: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self { concurrency: 16, max_wait: Duration::from_secs(5), queue_len_max: 10_000 }
    }
}

/// Why a request got no slot.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScheduleError {
    /// Its group's queue is full.
    #[error(transparent)]
    QueueFull(#[from] QueueFull),
    /// It waited `max_wait` without a slot.
    #[error("group {group:?} waited {waited:?} for a slot without getting one")]
    TimedOut {
        /// The group.
        group: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The group name breaks the naming rules.
    #[error("invalid group name: {0}")]
    InvalidGroup(String),
}

struct State {
    queue: FairQueue<oneshot::Sender<()>>,
    running: usize,
    last_renewal: Nanos,
    known: std::collections::HashSet<GroupName>,
}

struct Shared {
    state: Mutex<State>,
    opts: SchedulerOptions,
    settings: Config,
    clock: TokioClock,
}

/// The scheduler: cheap to clone. Must be created inside a tokio runtime.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

/// A running request's slot; dropping it gives the slot to the next waiter.
#[must_use = "the slot is released when dropped"]
pub struct Slot {
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.running -= 1;
        self.shared.dispatch(&mut s);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands free slots to waiters in fair order, skipping any that gave up.
    fn dispatch(&self, s: &mut State) {
        let now = self.clock.now();
        if now.since(s.last_renewal) >= Duration::from_secs(1) {
            s.queue.renew();
            s.last_renewal = now;
        }
        while s.running < self.opts.concurrency {
            let Some((_, waiter)) = s.queue.pop() else { break };
            if waiter.send(()).is_ok() {
                s.running += 1;
            }
        }
    }

    fn learn(&self, s: &mut State, group: &GroupName) {
        if s.known.insert(group.clone()) {
            let settings = self.settings.settings_for(group.as_str());
            // TiKV weighs by the group's configured rate: its reservation, else its limit.
            let rate =
                if settings.reserved() > 0.0 { settings.reserved() } else { settings.limit().as_f64() };
            let rate = if rate.is_finite() { rate } else { 0.0 };
            s.queue.set_group(group, settings.priority(), rate);
        }
    }
}

impl Scheduler {
    /// A scheduler for the groups in `settings` (priority and rate; others get the `default`
    /// group's).
    pub fn new(settings: &Config, opts: SchedulerOptions) -> Scheduler {
        let clock = TokioClock::new();
        let state = State {
            queue: FairQueue::new(opts.queue_len_max),
            running: 0,
            last_renewal: clock.now(),
            known: std::collections::HashSet::new(),
        };
        Scheduler {
            shared: Arc::new(Shared { state: Mutex::new(state), opts, settings: settings.clone(), clock }),
        }
    }

    /// A slot for a request of `cost` units of `group`: at once if one is free and nobody
    /// waits, otherwise in fair order, waiting up to `max_wait`.
    pub async fn acquire(&self, group: &str, cost: f64) -> Result<Slot, ScheduleError> {
        check_group_name(group).map_err(|e| ScheduleError::InvalidGroup(e.rule))?;
        let name = GroupName::new(group).map_err(|e| ScheduleError::InvalidGroup(e.rule))?;
        let receiver = {
            let mut s = self.shared.lock();
            self.shared.learn(&mut s, &name);
            if s.running < self.shared.opts.concurrency && s.queue.is_empty() {
                s.running += 1;
                // The cost still counts toward the group's virtual time.
                let (tx, rx) = oneshot::channel();
                s.queue.push(&name, tx, cost)?;
                let (_, tx) = s.queue.pop().expect("just pushed");
                drop(tx);
                drop(rx);
                return Ok(Slot { shared: self.shared.clone() });
            }
            let (tx, rx) = oneshot::channel();
            s.queue.push(&name, tx, cost)?;
            rx
        };
        let max_wait = self.shared.opts.max_wait;
        let mut receiver = receiver;
        if let Ok(Ok(())) = tokio::time::timeout(max_wait, &mut receiver).await {
            return Ok(Slot { shared: self.shared.clone() });
        }
        // Gave up. A slot may have been handed over at the last moment: close first, then
        // look, so it is either ours or never sent.
        receiver.close();
        if receiver.try_recv().is_ok() {
            return Ok(Slot { shared: self.shared.clone() });
        }
        let mut s = self.shared.lock();
        s.queue.retain(|tx| !tx.is_closed());
        self.shared.dispatch(&mut s);
        Err(ScheduleError::TimedOut { group: group.to_string(), waited: max_wait })
    }

    /// Requests running now, and waiting.
    pub fn load(&self) -> (usize, usize) {
        let s = self.shared.lock();
        (s.running, s.queue.len())
    }
}
