//! Work on tokio's blocking pool, counted while it runs.
//!
//! The server runs its ticks, flushes and other long steps on the blocking pool, so that
//! answers keep flowing while they run. Each goes through [`spawn`], which counts it from
//! the moment it is handed over until it has run (or was dropped unrun): [`in_flight`] is
//! what is still pending. A simulation that steps simulated time (turmoil, in
//! `tollgate-testkit`) waits for it to come back to zero before each step, so that work on
//! real threads takes no simulated time and a run replays the same way however busy the
//! machine is.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::task::JoinHandle;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One pending piece of work: counted when made, uncounted when dropped, with the work done
/// or never started.
struct Pending;

impl Pending {
    fn new() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `f` on the blocking pool, as [`tokio::task::spawn_blocking`] does, counted in
/// [`in_flight`] until it returns.
pub fn spawn<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let pending = Pending::new();
    tokio::task::spawn_blocking(move || {
        let _pending = pending;
        f()
    })
}

/// How many pieces of work handed to [`spawn`] in this process have not yet run to the end.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_is_counted_until_it_has_run() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let before = in_flight();
        let handle = spawn(move || wait.recv().is_ok());
        assert_eq!(in_flight(), before + 1);
        go.send(()).unwrap();
        assert!(handle.await.unwrap());
        assert_eq!(in_flight(), before);
    }
}
