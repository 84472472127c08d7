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
//! under the group's lock, so no count is ever lost or counted twice. A thread taking turns
//! among more groups than that counts their admissions straight into the shared tally
//! (locked adds), and takes a group into its cache only when it missed that same group a
//! short while before (a "doorkeeper", as in the TinyLFU cache admission policy): a group it
//! comes back to soon gets a tally on its second miss, while a thread cycling through
//! thousands of names, by name, never makes and retires a tally per call.

use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// How many groups one thread keeps a tally for.
pub const LOCAL_GROUPS_MAX: usize = 32;
/// Slots in a thread's record of the groups it recently missed with its cache full: a group
/// is taken in when its slot still names it at its next miss.
const DOORKEEPER_SLOTS: usize = 64;

/// Millionths of a unit in one unit: see [`Tally`].
pub(crate) const MICROS_PER_UNIT: u64 = 1_000_000;

/// One thread's (or the shared) counts for one group.
///
/// Requests admitted and refused are counted with their units in millionths. For refusals, a
/// tally keeps beside the count only the millionths *beyond one unit per request* (wrapping:
/// a cost under one takes some back), so a refusal of cost one, the most common, is one add;
/// [`Totals`] gives the units in full.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Tally {
    pub(crate) admitted: AtomicU64,
    pub(crate) admitted_micro: AtomicU64,
    pub(crate) throttled: AtomicU64,
    /// Millionths beyond one unit per request refused.
    pub(crate) throttled_micro: AtomicU64,
    /// Admissions that had to wait: with refusals, the sign of unmet demand.
    pub(crate) waited: AtomicU64,
    /// Units admitted unthrottled (also in `admitted_micro`).
    pub(crate) unthrottled_micro: AtomicU64,
    /// The largest cost of one request admitted (millionths) since an exchange last took it
    /// ([`Counters::take_largest`]): a high-water mark, not a sum.
    pub(crate) largest_micro: AtomicU64,
}

impl Tally {
    /// Adds to a cell that only this thread writes: no locked instruction needed.
    #[inline]
    pub(crate) fn bump(cell: &AtomicU64, by: u64) {
        cell.store(cell.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
    }

    fn fields(&self) -> [&AtomicU64; 6] {
        [
            &self.admitted,
            &self.admitted_micro,
            &self.throttled,
            &self.throttled_micro,
            &self.waited,
            &self.unthrottled_micro,
        ]
    }
}

/// A thread's own tally, on cache lines of its own: two threads' tallies never share one
/// (the shared tally, inside its group, sits with the group's other hot fields instead).
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct OwnTally(Tally);

impl std::ops::Deref for OwnTally {
    type Target = Tally;
    fn deref(&self) -> &Tally {
        &self.0
    }
}

/// A sum of tallies, the units in full (millionths).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) admitted: u64,
    pub(crate) admitted_micro: u64,
    pub(crate) throttled: u64,
    pub(crate) throttled_micro: u64,
    pub(crate) waited: u64,
    pub(crate) unthrottled_micro: u64,
}

impl Totals {
    fn add(&mut self, t: &Tally) {
        self.add_with(t, 0);
    }

    /// Adds the shared tally, whose units admitted are kept beyond one per request too.
    fn add_folded(&mut self, t: &Tally) {
        self.add_with(t, MICROS_PER_UNIT);
    }

    /// Adds `t`, whose units admitted are kept beyond `admitted_base` millionths a request.
    fn add_with(&mut self, t: &Tally, admitted_base: u64) {
        let [a, am, th, thm, w, um] = t.fields().map(|c| c.load(Ordering::Relaxed));
        self.admitted += a;
        self.admitted_micro =
            self.admitted_micro.wrapping_add(a.wrapping_mul(admitted_base)).wrapping_add(am);
        self.throttled += th;
        self.throttled_micro =
            self.throttled_micro.wrapping_add(th.wrapping_mul(MICROS_PER_UNIT)).wrapping_add(thm);
        self.waited += w;
        self.unthrottled_micro += um;
    }
}

/// A group's counters: the threads' tallies and what evicted ones left behind. In this
/// order: the shared tally's first field is written with the group's other hot fields.
///
/// A thread's cache knows a group by the address of its counters ([`Counters::key`]), which
/// an admission has without loading anything: while the cache holds an entry for a group,
/// the entry's weak reference keeps the group's memory, so no other group's counters can be
/// at that address.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Counters {
    /// What evicted tallies left, and what threads without one counted (locked adds). Its
    /// units admitted are kept beyond one unit per request, as refusals' are everywhere: a
    /// request of cost one, admitted or refused, is a single locked add here.
    folded: Tally,
    live: Mutex<Vec<Arc<OwnTally>>>,
    /// How many tallies `live` holds, written under its lock and read without it: with none,
    /// the shared tally is all there is (as for most of many groups taken in turn by name),
    /// and reading the counts takes no lock (a locked instruction waits for the line, so a
    /// pass over 100,000 groups would wait for them one after the other).
    live_len: AtomicUsize,
}

/// How far into [`Counters`] what counting an admission in the shared tally reads and
/// writes ends (the admissions): a group keeps these bytes on its hot line.
#[cfg(test)]
pub(crate) const COUNTERS_HOT_END: usize =
    std::mem::offset_of!(Counters, folded) + std::mem::offset_of!(Tally, admitted) + size_of::<AtomicU64>();

impl Counters {
    /// How many threads' tallies for the group are alive now (tests).
    #[cfg(test)]
    pub(crate) fn live_tallies(&self) -> usize {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub(crate) fn new() -> Self {
        Self { folded: Tally::default(), live: Mutex::new(Vec::new()), live_len: AtomicUsize::new(0) }
    }

    /// What a thread's cache knows the group by: the counters' address (never zero).
    #[inline(always)]
    fn key(&self) -> u64 {
        std::ptr::from_ref(self).addr() as u64
    }

    /// The counts so far, across all threads.
    pub(crate) fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        // Zero is stored after a fold's counts are in the shared tally (release), so they are
        // all seen; a tally made meanwhile counted nothing yet.
        if self.live_len.load(Ordering::Acquire) == 0 {
            totals.add_folded(&self.folded);
            return totals;
        }
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        totals.add_folded(&self.folded);
        for t in live.iter() {
            totals.add(t);
        }
        totals
    }

    /// Moves a tally's counts into the shared one and forgets the tally, atomically for
    /// readers (they hold the same lock).
    fn fold(&self, tally: &Arc<OwnTally>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        self.add_shared(tally);
        live.retain(|t| !Arc::ptr_eq(t, tally));
        self.live_len.store(live.len(), Ordering::Release);
    }

    /// Adds a thread's tally (or scratch counts) to the shared one, in the shared one's
    /// terms: the fields that are zero there cost nothing. Inlined, so that counting one
    /// request straight into the shared tally folds down to its one or two locked adds.
    #[inline(always)]
    fn add_shared(&self, from: &Tally) {
        let admitted = from.admitted.load(Ordering::Relaxed);
        let mut values = from.fields().map(|c| c.load(Ordering::Relaxed));
        values[1] = values[1].wrapping_sub(admitted.wrapping_mul(MICROS_PER_UNIT)); // admitted_micro
        for (v, to) in values.into_iter().zip(self.folded.fields()) {
            if v != 0 {
                to.fetch_add(v, Ordering::Relaxed);
            }
        }
        let largest = from.largest_micro.load(Ordering::Relaxed);
        if largest > self.folded.largest_micro.load(Ordering::Relaxed) {
            self.folded.largest_micro.fetch_max(largest, Ordering::Relaxed);
        }
    }

    /// The largest cost of one request admitted since the last take, in millionths (0:
    /// none), across all threads; each thread's mark starts again from 0. A request counted
    /// while this runs may fall in either period.
    pub(crate) fn take_largest(&self) -> u64 {
        let mut largest = self.folded.largest_micro.swap(0, Ordering::Relaxed);
        if self.live_len.load(Ordering::Acquire) != 0 {
            let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            for t in live.iter() {
                largest = largest.max(t.largest_micro.swap(0, Ordering::Relaxed));
            }
        }
        largest
    }
}

/// Something that owns [`Counters`] and can be referred to weakly: a group.
pub(crate) trait HasCounters: Send + Sync + 'static {
    /// Its counters, inside it: a weak reference to it keeps their address (see
    /// [`Counters`]).
    fn counters(&self) -> &Counters;

    /// Takes back the units of a stash whose thread is done with it (evicted or exiting).
    fn return_stash(&self, _stash: Stash) {}
}

/// What a thread does with an entry it drops: folds the counts, returns the stash.
fn retire(entry: Entry) {
    if let Some(owner) = entry.owner.upgrade() {
        owner.counters().fold(&entry.tally);
        if entry.stash.units > 0.0 {
            owner.return_stash(entry.stash);
        }
    }
}

struct Entry {
    tally: Arc<OwnTally>,
    owner: Weak<dyn HasCounters>,
    stash: Stash,
}

/// Units one thread took from a group's bucket ahead of use, to admit its next requests
/// without touching the shared bucket (see `Inner::try_admit_bucket`). Only that thread
/// reads or writes it. Units left when the entry is evicted or the thread exits go back to
/// the group ([`HasCounters::return_stash`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stash {
    /// Units left to spend.
    pub(crate) units: f64,
    /// The bucket's generation when they were taken; they are spent only at the same one.
    /// None at first (`u64::MAX`), so that the batch below is worked out before any use.
    pub(crate) generation: u64,
    /// Units taken at once when the stash runs out, at that generation's rate and burst,
    /// and what they take of the bucket's refill, in nanoseconds: worked out once a
    /// generation, not at every admission that misses.
    pub(crate) batch: f64,
    pub(crate) batch_ns: u64,
    /// Admissions left before the thread reads the clock again.
    pub(crate) hits_left: u32,
}

impl Default for Stash {
    fn default() -> Self {
        Stash { units: 0.0, generation: u64::MAX, batch: 0.0, batch_ns: 0, hits_left: 0 }
    }
}

struct Local {
    /// The keys of `entries` ([`Counters::key`]), in the same order, beside them in a
    /// compact array: a miss scans four cache lines, not an entry's worth each. Zero where
    /// there is no entry.
    ids: [u64; LOCAL_GROUPS_MAX],
    /// Freed by [`Retire`], not by a drop of `Local`: a thread-local with nothing to drop
    /// is read with no check that the thread's storage is set up, and so the access to it is
    /// small enough to inline into the admission it serves.
    entries: ManuallyDrop<Vec<Entry>>,
}

/// What a thread's cache knows of the groups not in it, in cells beside [`Local`] rather than
/// inside it: whether a group passes the cache by is answered without borrowing the cache,
/// nor checking that the thread's storage is set up (a thread-local with nothing to drop
/// needs no such check). Written by [`Local::find_or_insert`] as the cache changes, and by
/// [`passes_by`].
struct Passing {
    /// Whether the cache is full: only then is a group passed by.
    full: Cell<bool>,
    /// A bit per hash of a key ([`presence`]), set when a key in the cache has it: a group
    /// whose bit is clear is not there, known without a scan (a thread taking
    /// turns among many groups misses on most calls, and the scan was most of such a call).
    /// With the cache full, about one group in 128 not in it finds its bit set (a bit for
    /// each of 4,096 hashes: with 1,024, a thread cycling through a thousand groups scanned
    /// its cache on 7 % of calls rather than 3 %).
    present: [Cell<u64>; PRESENCE_WORDS],
    /// The group last missed with the cache full, by slot (see [`Passing::slot`]). A hint
    /// only: a group made since at a missed group's address gets a tally a miss sooner.
    missed: [Cell<u64>; DOORKEEPER_SLOTS],
}

/// Retires the thread's entries when it exits (what a drop of [`Local`] would do). Set up
/// with the thread's first entry, so torn down before whatever thread-local storage was set
/// up before it: a count such storage makes as it goes then finds the cache gone and counts
/// in the shared tally.
struct Retire;

impl Drop for Retire {
    fn drop(&mut self) {
        // No longer named as the front before the tallies go.
        FRONT.set(Front::NONE);
        let _ = PASSING.try_with(|p| p.full.set(false));
        let entries = LOCAL
            .try_with(|local| {
                let mut local = local.try_borrow_mut().ok()?;
                local.ids = [0; LOCAL_GROUPS_MAX];
                Some(std::mem::take(&mut *local.entries))
            })
            .ok()
            .flatten();
        entries.into_iter().flatten().for_each(retire);
    }
}

/// The thread's front tally, named apart from [`Local`]: a count for the group at the front,
/// the one a thread admitting for one group counts every call in, reads it with two loads,
/// no borrow flag to set and clear, no check that the thread's storage is set up (a
/// thread-local with nothing to drop needs none), no walk from the entries to the tally.
#[derive(Clone, Copy)]
struct Front {
    /// The front entry's group key (zero when there is none).
    id: u64,
    /// Its tally, inside the entry's `Arc`.
    tally: *const Tally,
}

impl Front {
    const NONE: Front = Front { id: 0, tally: std::ptr::null() };
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local { ids: [0; LOCAL_GROUPS_MAX], entries: ManuallyDrop::new(Vec::new()) })
    };
    static RETIRE: Retire = const { Retire };
    static PASSING: Passing = const {
        Passing {
            full: Cell::new(false),
            present: [const { Cell::new(0) }; PRESENCE_WORDS],
            missed: [const { Cell::new(0) }; DOORKEEPER_SLOTS],
        }
    };
    /// Set by [`Local::publish_front`] whenever the front entry changes, and cleared before
    /// the entries go when the thread exits, so its tally is always that of `entries[0]`,
    /// kept alive by the entry's `Arc`.
    static FRONT: Cell<Front> = const { Cell::new(Front::NONE) };
}

/// Runs `f` on this thread's tally for `owner`, creating it if need be, or, when the thread
/// is taking turns among more groups than it keeps tallies for, on the shared tally.
///
/// The front tally inline, the rest in one call: the hot path of a refusal stays a few
/// instructions, and a thread taking turns among a thousand groups by name, which counts
/// nearly every call in the shared tally, pays one call to find that out and count there.
/// `f` must not call back into this module.
#[inline(always)]
pub(crate) fn record<G: HasCounters>(owner: &G, me: &Weak<G>, f: impl Fn(&Tally)) {
    let counters = owner.counters();
    // `try_with`, which the compiler inlines where `with` (and so `get`) stayed a call in
    // admission by name: for a thread-local with nothing to drop it never fails.
    let front = FRONT.try_with(Cell::get).unwrap_or(Front::NONE);
    if front.id == counters.key() {
        debug_assert!(front_is_first(front), "FRONT names a tally other than the front entry's");
        // SAFETY: `FRONT` names the tally of this thread's front entry (see `FRONT`), which
        // the entry's `Arc` keeps alive for as long as it is named; the tally's cells are
        // atomics, so counting through a shared reference is sound even while the thread's
        // `Local` is borrowed further up the stack.
        #[allow(unsafe_code)]
        f(unsafe { &*front.tally });
        return;
    }
    record_behind(counters, me, f);
}

/// Whether `front` names this thread's front entry and its tally (or the thread's entries
/// are borrowed or gone, when it cannot be told): what makes reading through it sound.
fn front_is_first(front: Front) -> bool {
    LOCAL
        .try_with(|local| {
            let Ok(local) = local.try_borrow() else { return true };
            local
                .entries
                .first()
                .is_some_and(|e| local.ids[0] == front.id && std::ptr::eq(&**e.tally, front.tally))
        })
        .unwrap_or(true)
}

/// [`record`] for a group not at the front: the shared tally when the thread passes it by
/// (known from [`PASSING`] alone), else its tally brought to the front, or made; the shared
/// tally again when the doorkeeper turns it away or the thread is exiting, its tallies gone.
#[inline(never)]
fn record_behind<G: HasCounters>(counters: &Counters, me: &Weak<G>, f: impl Fn(&Tally)) {
    if !passes_by(counters.key()) {
        let counted = LOCAL
            .try_with(|local| {
                let Ok(mut local) = local.try_borrow_mut() else { return false };
                let Some(first) = local.bring_to_front(counters, me) else { return false };
                f(&first.tally);
                true
            })
            .unwrap_or(false);
        if counted {
            return;
        }
    }
    record_shared(counters, f);
}

/// Whether a group not at the front is to be counted in the shared tally this time: the
/// cache is full, the group is not in it (its presence bit is clear), and its doorkeeper slot
/// did not name it (it is named now). The rest, a scan or a tally taken in, is
/// [`Local::find_or_insert`]'s.
#[inline(always)]
fn passes_by(id: u64) -> bool {
    PASSING.with(|p| {
        let (word, bit) = presence(id);
        if !p.full.get() || p.present[word].get() & bit != 0 {
            return false;
        }
        p.turned_away(id)
    })
}

impl Passing {
    /// The doorkeeper slot of a group's key: bits of its hash other than the presence
    /// bit's.
    #[inline(always)]
    fn slot(&self, id: u64) -> &Cell<u64> {
        &self.missed[(spread(id) % DOORKEEPER_SLOTS as u64) as usize]
    }

    /// The doorkeeper's answer for a group missed with the cache full: turned away, and named
    /// in its slot, unless the slot already names it (the group missed a short while before).
    #[inline(always)]
    fn turned_away(&self, id: u64) -> bool {
        let slot = self.slot(id);
        if slot.get() == id {
            return false;
        }
        slot.set(id);
        true
    }
}

/// Runs `f` on this thread's tally and stash for `owner`, creating them if need be; `None`
/// when the thread is exiting and has none. `f` must not call back into this module.
#[inline(always)]
pub(crate) fn with_local<G: HasCounters, R>(
    owner: &G,
    me: &Weak<G>,
    f: impl FnOnce(&Tally, &mut Stash) -> R,
) -> Option<R> {
    let counters = owner.counters();
    // Kept small, with the rare cases out of line, so that the thread-local access is
    // inlined into the hot path (a call there costs about a third of a refusal).
    LOCAL
        .try_with(|local| {
            let mut local = local.try_borrow_mut().ok()?;
            let first = if local.ids[0] == counters.key() {
                local.entries.first_mut()?
            } else {
                local.bring_to_front(counters, me)?
            };
            Some(f(&first.tally, &mut first.stash))
        })
        .ok()
        .flatten()
}

/// Counts in the shared tally: what `f` counts, in locked adds (one for a request of cost
/// one, the scratch tally folded away once inlined).
#[inline(always)]
pub(crate) fn record_shared(counters: &Counters, f: impl FnOnce(&Tally)) {
    let scratch = Tally::default();
    f(&scratch);
    counters.add_shared(&scratch);
}

impl Local {
    /// The entry for `counters`, brought to the front (see [`Local::find_or_insert`]); `None`
    /// when the group is left to the shared tally this time.
    #[cold]
    #[inline(never)]
    fn bring_to_front<G: HasCounters>(&mut self, counters: &Counters, me: &Weak<G>) -> Option<&mut Entry> {
        if PASSING.with(|p| self.find_or_insert(p, counters, me)) { self.entries.first_mut() } else { None }
    }

    #[cold]
    /// Brings the entry for `counters` to the front, creating it if need be. A found entry
    /// swaps places with the front one rather than shifting every entry between them: the
    /// order is only roughly most-recent-first, which is all eviction needs, and a thread that
    /// takes turns among many groups does not move its whole cache each time.
    ///
    /// With the cache full, a group not in it gets in only if it was the last group missed in
    /// its doorkeeper slot: a thread taking turns among more groups than the cache holds
    /// counts them in the shared tally (`false`) instead of making and retiring a tally at
    /// every call, while a group it comes back to soon gets in at its second miss.
    fn find_or_insert<G: HasCounters>(&mut self, p: &Passing, counters: &Counters, me: &Weak<G>) -> bool {
        let len = self.entries.len();
        let key = counters.key();
        let (word, bit) = presence(key);
        if p.present[word].get() & bit != 0
            && let Some(i) = self.ids[..len].iter().position(|&id| id == key)
        {
            self.ids.swap(0, i);
            self.entries.swap(0, i);
            self.publish_front();
            return true;
        }
        if len >= LOCAL_GROUPS_MAX {
            if p.turned_away(key) {
                return false;
            }
            p.slot(key).set(0);
            retire(self.entries.pop().expect("full, so not empty"));
            // The retired id's bit may be another's too: made again from the ids left.
            p.present.iter().for_each(|w| w.set(0));
            for &id in &self.ids[..len - 1] {
                let (w, b) = presence(id);
                p.present[w].set(p.present[w].get() | b);
            }
        }
        // The thread's entries are retired when it exits, set up with its first one; once
        // that is done (the thread exiting), no entry is made again.
        if len == 0 && RETIRE.try_with(|_| ()).is_err() {
            return false;
        }
        p.present[word].set(p.present[word].get() | bit);
        let tally = Arc::new(OwnTally::default());
        {
            let mut live = counters.live.lock().unwrap_or_else(PoisonError::into_inner);
            live.push(tally.clone());
            counters.live_len.store(live.len(), Ordering::Release);
        }
        let owner: Weak<dyn HasCounters> = me.clone();
        let len = self.entries.len();
        self.ids.copy_within(0..len, 1);
        self.ids[0] = key;
        self.entries.insert(0, Entry { tally, owner, stash: Stash::default() });
        p.full.set(self.entries.len() >= LOCAL_GROUPS_MAX);
        self.publish_front();
        true
    }

    /// Names the front entry's tally in [`FRONT`], after any change to the front.
    fn publish_front(&self) {
        FRONT.set(match self.entries.first() {
            Some(e) => Front { id: self.ids[0], tally: &**e.tally },
            None => Front::NONE,
        });
    }
}

/// Bits in [`Passing`]'s `present`.
const PRESENCE_BITS: u64 = 4096;
const PRESENCE_WORDS: usize = (PRESENCE_BITS / 64) as usize;

/// A key's bits mixed, 24 of them: groups' addresses are many cache lines apart, at strides
/// that would leave most residues unused. Fibonacci hashing: a multiply, the top bits taken
/// (the presence bit from the top 12, the doorkeeper slot from the bottom 6).
#[inline(always)]
fn spread(key: u64) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40
}

/// Where a key's bit is in [`Passing`]'s `present`: its hash modulo [`PRESENCE_BITS`].
#[inline]
fn presence(key: u64) -> (usize, u64) {
    let r = ((spread(key) >> 12) % PRESENCE_BITS) as usize;
    (r / 64, 1 << (r % 64))
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
    fn a_thread_taking_turns_among_many_groups_counts_every_call_and_keeps_few_tallies() {
        let owners: Vec<Arc<Owner>> = (0..10 * LOCAL_GROUPS_MAX).map(|_| owner()).collect();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..10 {
                    for o in &owners {
                        record(&**o, &Arc::downgrade(o), |t| Tally::bump(&t.admitted, 1));
                    }
                }
                // Still running: at most the cache's worth of tallies alive across all groups.
                let live: usize = owners.iter().map(|o| o.counters.live.lock().unwrap().len()).sum();
                assert!(live <= LOCAL_GROUPS_MAX, "{live} tallies alive");
            });
        });
        for o in &owners {
            assert_eq!(o.counters.totals().admitted, 10);
        }
    }

    #[test]
    fn with_the_cache_full_a_group_missed_again_soon_gets_a_tally_and_a_long_rotation_none() {
        let live = |o: &Arc<Owner>| o.counters.live.lock().unwrap().len();
        let bump = |o: &Arc<Owner>| record(&**o, &Arc::downgrade(o), |t| Tally::bump(&t.admitted, 1));
        std::thread::scope(|s| {
            s.spawn(|| {
                let first: Vec<Arc<Owner>> = (0..LOCAL_GROUPS_MAX).map(|_| owner()).collect();
                first.iter().for_each(bump);
                assert!(first.iter().all(|o| live(o) == 1));
                // A new group: counted in the shared tally at its first miss, taken in at its
                // second, in place of one of the others.
                let again = owner();
                bump(&again);
                assert_eq!(live(&again), 0);
                bump(&again);
                assert_eq!(live(&again), 1);
                assert_eq!(first.iter().map(live).sum::<usize>(), LOCAL_GROUPS_MAX - 1);
                // Taking turns among a thousand groups, by name: no tally made for any.
                let many: Vec<Arc<Owner>> = (0..1000).map(|_| owner()).collect();
                for _ in 0..3 {
                    many.iter().for_each(bump);
                }
                assert_eq!(many.iter().map(live).sum::<usize>(), 0);
                assert!(many.iter().all(|o| o.counters.totals().admitted == 3));
                assert_eq!(again.counters.totals().admitted, 2);
            });
        });
    }

    #[test]
    fn units_counted_in_the_shared_tally_or_folded_into_it_add_up_exactly() {
        // A thread whose cache is full counts a new group's first call in the shared tally
        // (in its terms: units beyond one a request), the next ones in a tally of its own,
        // folded into the shared one when the thread exits.
        let many: Vec<Arc<Owner>> = (0..LOCAL_GROUPS_MAX).map(|_| owner()).collect();
        let o = owner();
        let admit = |o: &Arc<Owner>, micros: u64| {
            record(&**o, &Arc::downgrade(o), |t| {
                Tally::bump(&t.admitted, 1);
                Tally::bump(&t.admitted_micro, micros);
            });
        };
        let (m, o2) = (many.clone(), o.clone());
        std::thread::spawn(move || {
            m.iter().for_each(|g| admit(g, 1_000_000));
            for micros in [250_000, 1_000_000, 2_500_000, 0, 3_000_000] {
                admit(&o2, micros);
            }
            assert_eq!(o2.counters.live.lock().unwrap().len(), 1, "taken in at the second call");
        })
        .join()
        .unwrap();
        let t = o.counters.totals();
        assert_eq!((t.admitted, t.admitted_micro), (5, 6_750_000));
        assert!(o.counters.live.lock().unwrap().is_empty());
    }

    /// Counts a request of its group when the thread's storage is torn down.
    struct CountsOnExit(Option<Arc<Owner>>);

    impl Drop for CountsOnExit {
        fn drop(&mut self) {
            if let Some(o) = self.0.take() {
                record(&*o, &Arc::downgrade(&o), |t| Tally::bump(&t.admitted, 1));
            }
        }
    }

    thread_local! {
        static ON_EXIT: RefCell<CountsOnExit> = const { RefCell::new(CountsOnExit(None)) };
    }

    #[test]
    fn a_count_made_while_the_thread_exits_after_its_tallies_are_gone_still_adds_up() {
        // Made ready before the thread's tallies exist, so torn down after them (a thread's
        // storage goes in the reverse order it was set up): its count then finds no front
        // tally, not the one just folded and freed, and goes to the shared tally.
        let o = owner();
        let o2 = o.clone();
        std::thread::spawn(move || {
            ON_EXIT.with(|e| e.borrow_mut().0 = Some(o2.clone()));
            for _ in 0..3 {
                record(&*o2, &Arc::downgrade(&o2), |t| Tally::bump(&t.admitted, 1));
            }
            assert_eq!(o2.counters.live.lock().unwrap().len(), 1, "counted in a tally of the thread's own");
        })
        .join()
        .unwrap();
        assert_eq!(o.counters.totals().admitted, 4);
        assert!(o.counters.live.lock().unwrap().is_empty());
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

    #[test]
    fn a_thread_never_keeps_two_tallies_for_one_group_whatever_the_order() {
        // More groups than the cache holds, their keys sharing presence bits, taken in a scrambled order with repeats: evictions clear bits that other
        // cached groups share, and a cached group must still be found, not given a second
        // tally. The groups taken most are pairs that share a residue.
        let owners: Vec<Arc<Owner>> = (0..3 * PRESENCE_BITS).map(|_| owner()).collect();
        let mut by_residue: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
        for (i, o) in owners.iter().enumerate() {
            let (word, bit) = presence(o.counters.key());
            by_residue.entry(word as u64 * 64 + u64::from(bit.trailing_zeros())).or_default().push(i);
        }
        let often: Vec<usize> =
            by_residue.values().filter(|v| v.len() >= 2).take(20).flat_map(|v| [v[0], v[1]]).collect();
        assert_eq!(often.len(), 40);
        let mut calls = vec![0u64; owners.len()];
        let mut x = 12345u64;
        for _ in 0..200_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Mostly a few dozen groups, now and then any of them.
            let i = if (x >> 60) < 12 {
                often[((x >> 33) % 40) as usize]
            } else {
                ((x >> 33) % owners.len() as u64) as usize
            };
            record(&*owners[i], &Arc::downgrade(&owners[i]), |t| Tally::bump(&t.admitted, 1));
            calls[i] += 1;
            assert!(owners[i].counters.live.lock().unwrap().len() <= 1, "two tallies for group {i}");
        }
        for (o, n) in owners.iter().zip(calls) {
            assert_eq!(o.counters.totals().admitted, n);
        }
    }
}
