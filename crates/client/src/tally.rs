//! Per-group counters without an atomic read-modify-write on the hot path.
//!
//! Every admission updates its group's counters (requests and units admitted or refused).
//! Shared counters would cost one locked add each, about 7 ns, and make threads of one group
//! fight over a cache line. Instead each thread keeps its own [`Tally`] per group, which only
//! it writes (a plain load and store), and readers add up all the tallies. This is the
//! striped-counter idea behind Java's `LongAdder`, with one stripe per thread.
//!
//! A thread keeps at most [`LOCAL_GROUPS_MAX`] tallies, most recently used first. When one
//! is evicted, or the thread exits, its counts are folded into the group's shared tally
//! under the group's lock, so no count is ever lost or counted twice.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// How many groups one thread keeps a tally for.
pub const LOCAL_GROUPS_MAX: usize = 32;

/// One thread's (or the shared) counts for one group.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Tally {
    pub(crate) admitted: AtomicU64,
    pub(crate) admitted_micro: AtomicU64,
    pub(crate) throttled: AtomicU64,
    pub(crate) throttled_micro: AtomicU64,
    /// Admissions that had to wait: with refusals, the sign of unmet demand.
    pub(crate) waited: AtomicU64,
}

impl Tally {
    /// Adds to a cell that only this thread writes: no locked instruction needed.
    #[inline]
    pub(crate) fn bump(cell: &AtomicU64, by: u64) {
        cell.store(cell.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
    }

    fn fields(&self) -> [&AtomicU64; 5] {
        [&self.admitted, &self.admitted_micro, &self.throttled, &self.throttled_micro, &self.waited]
    }
}

/// A sum of tallies.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) admitted: u64,
    pub(crate) admitted_micro: u64,
    pub(crate) throttled: u64,
    pub(crate) throttled_micro: u64,
    pub(crate) waited: u64,
}

impl Totals {
    fn add(&mut self, t: &Tally) {
        let [a, am, th, thm, w] = t.fields().map(|c| c.load(Ordering::Relaxed));
        self.admitted += a;
        self.admitted_micro += am;
        self.throttled += th;
        self.throttled_micro += thm;
        self.waited += w;
    }
}

/// A group's counters: the threads' tallies and what evicted ones left behind.
#[derive(Debug)]
pub(crate) struct Counters {
    id: u64,
    folded: Tally,
    live: Mutex<Vec<Arc<Tally>>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Counters {
    pub(crate) fn new() -> Self {
        // Ids are never reused, so a thread's cache can't mistake a new group for a dead one.
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            folded: Tally::default(),
            live: Mutex::new(Vec::new()),
        }
    }

    /// The counts so far, across all threads.
    pub(crate) fn totals(&self) -> Totals {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let mut totals = Totals::default();
        totals.add(&self.folded);
        for t in live.iter() {
            totals.add(t);
        }
        totals
    }

    /// Moves a tally's counts into the shared one and forgets the tally, atomically for
    /// readers (they hold the same lock).
    fn fold(&self, tally: &Arc<Tally>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for (from, to) in tally.fields().into_iter().zip(self.folded.fields()) {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        live.retain(|t| !Arc::ptr_eq(t, tally));
    }
}

/// Something that owns [`Counters`] and can be referred to weakly: a group.
pub(crate) trait HasCounters: Send + Sync + 'static {
    fn counters(&self) -> &Counters;
}

struct Entry {
    id: u64,
    tally: Arc<Tally>,
    owner: Weak<dyn HasCounters>,
}

struct Local {
    entries: Vec<Entry>,
}

impl Drop for Local {
    fn drop(&mut self) {
        for e in self.entries.drain(..) {
            if let Some(owner) = e.owner.upgrade() {
                owner.counters().fold(&e.tally);
            }
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local { entries: Vec::new() }) };
}

/// Runs `f` on this thread's tally for `owner`, creating it if need be.
#[inline]
pub(crate) fn record<G: HasCounters>(owner: &G, me: &Weak<G>, f: impl FnOnce(&Tally)) {
    let counters = owner.counters();
    let mut f = Some(f);
    let _ = LOCAL.try_with(|local| {
        let Some(f) = f.take() else { return };
        let mut local = local.borrow_mut();
        if let Some(first) = local.entries.first()
            && first.id == counters.id
        {
            f(&first.tally);
            return;
        }
        let tally = local.find_or_insert(counters, me);
        f(&tally);
    });
    if let Some(f) = f {
        // The thread is exiting and its tallies are gone: count in the shared tally.
        record_shared(counters, f);
    }
}

#[cold]
fn record_shared(counters: &Counters, f: impl FnOnce(&Tally)) {
    let scratch = Tally::default();
    f(&scratch);
    for (from, to) in scratch.fields().into_iter().zip(counters.folded.fields()) {
        to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Local {
    #[cold]
    fn find_or_insert<G: HasCounters>(&mut self, counters: &Counters, me: &Weak<G>) -> Arc<Tally> {
        if let Some(i) = self.entries.iter().position(|e| e.id == counters.id) {
            let entry = self.entries.remove(i);
            let tally = entry.tally.clone();
            self.entries.insert(0, entry);
            return tally;
        }
        let tally = Arc::new(Tally::default());
        counters.live.lock().unwrap_or_else(PoisonError::into_inner).push(tally.clone());
        let owner: Weak<dyn HasCounters> = me.clone();
        self.entries.insert(0, Entry { id: counters.id, tally: tally.clone(), owner });
        if self.entries.len() > LOCAL_GROUPS_MAX {
            let evicted = self.entries.pop().expect("over the limit, so not empty");
            if let Some(owner) = evicted.owner.upgrade() {
                owner.counters().fold(&evicted.tally);
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Owner {
        counters: Counters,
    }

    impl HasCounters for Owner {
        fn counters(&self) -> &Counters {
            &self.counters
        }
    }

    fn owner() -> Arc<Owner> {
        Arc::new(Owner { counters: Counters::new() })
    }

    #[test]
    fn counts_from_many_threads_all_add_up() {
        let o = owner();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let o = o.clone();
                std::thread::spawn(move || {
                    let weak = Arc::downgrade(&o);
                    for _ in 0..10_000 {
                        record(&*o, &weak, |t| Tally::bump(&t.admitted, 1));
                    }
                })
            })
            .collect();
        // Joining waits for each thread to exit, thread-local destructors included (a
        // scoped thread's scope may end before them).
        for t in threads {
            t.join().unwrap();
        }
        // The threads have exited: their tallies were folded, none counted twice.
        assert_eq!(o.counters.totals().admitted, 40_000);
        assert!(o.counters.live.lock().unwrap().is_empty());
    }

    #[test]
    fn evicted_tallies_keep_their_counts() {
        let owners: Vec<Arc<Owner>> = (0..LOCAL_GROUPS_MAX + 5).map(|_| owner()).collect();
        for round in 0..3 {
            for o in &owners {
                record(&**o, &Arc::downgrade(o), |t| Tally::bump(&t.throttled_micro, round + 1));
            }
        }
        for o in &owners {
            assert_eq!(o.counters.totals().throttled_micro, 6);
        }
    }
}
