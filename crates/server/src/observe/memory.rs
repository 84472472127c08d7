//! Giving memory back once what the engine tracked has expired.
//!
//! The engine forgets expired groups and clients and shrinks its tables, but the process
//! allocator (glibc's, on Linux) keeps the freed pages in its arenas: after a burst of 100,000
//! names the server's resident memory would stay near its peak for good. When at least half of
//! what was tracked at the peak, and at least [`MIN_FORGOTTEN`] entries, has gone, the server
//! asks the allocator to return its free pages to the operating system.

/// Fewer forgotten entries than this are not worth a trim: a handful of megabytes at most.
pub(crate) const MIN_FORGOTTEN: usize = 10_000;

/// Ticks after a trim when the allocator is asked once more: what the last expiries left
/// behind (tables shrunk a tick later, buffers of closed connections) is freed after the first
/// trim, and a second one returns it.
pub(crate) const TRIM_AGAIN_AFTER: u32 = 60;

/// Decides when to give memory back, from how many groups and clients are tracked after each
/// tick.
#[derive(Debug, Default)]
pub(crate) struct GiveBack {
    peak: usize,
    again_in: Option<u32>,
}

impl GiveBack {
    /// Records what is tracked after a tick; true when memory should be given back now (and
    /// the peak starts again from here).
    pub(crate) fn after_tick(&mut self, tracked: usize) -> bool {
        self.peak = self.peak.max(tracked);
        let forgotten = self.peak - tracked;
        if forgotten >= MIN_FORGOTTEN && tracked <= self.peak / 2 {
            self.peak = tracked;
            self.again_in = Some(TRIM_AGAIN_AFTER);
            return true;
        }
        match self.again_in {
            Some(0) => {
                self.again_in = None;
                true
            }
            Some(n) => {
                self.again_in = Some(n - 1);
                false
            }
            None => false,
        }
    }
}

/// Returns the allocator's free pages to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release() {
    // SAFETY: malloc_trim only hands free chunks of glibc's heaps back to the kernel; it takes
    // the allocator's own locks, is safe to call from any thread and touches no live
    // allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return memory on their own, or not at all: nothing to ask.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_given_back_once_half_the_peak_and_enough_entries_have_gone() {
        let mut g = GiveBack::default();
        assert!(!g.after_tick(110_000), "growing");
        assert!(!g.after_tick(60_000), "50,000 gone, but more than half remains");
        assert!(g.after_tick(10_000), "100,000 of 110,000 gone");
        assert!(!g.after_tick(10_000), "the peak starts again from what remains");
        assert!(!g.after_tick(5_000), "half gone, but only 5,000 entries");
        assert!(g.after_tick(0), "10,000 gone since the last trim");
        let again = (0..=TRIM_AGAIN_AFTER).filter(|_| g.after_tick(0)).count();
        assert_eq!(again, 1, "once more, {TRIM_AGAIN_AFTER} ticks later");
        assert!((0..1000).all(|_| !g.after_tick(0)), "and then not again");
        let mut small = GiveBack::default();
        assert!(!small.after_tick(9_000));
        assert!(!small.after_tick(0), "a small server never trims");
    }

    /// The edge of the unsafe call: trimming from one thread while others allocate, write and
    /// free leaves every live allocation as it was.
    #[test]
    fn giving_memory_back_while_other_threads_allocate_keeps_their_data() {
        let workers: Vec<_> = (0..2u8)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..200u32 {
                        let v: Vec<u8> = vec![t ^ (round as u8); 64 * 1024];
                        let kept: Vec<Vec<u8>> = (0..8).map(|i| vec![i; 4096]).collect();
                        std::thread::yield_now();
                        assert!(v.iter().all(|&b| b == t ^ (round as u8)));
                        assert!(kept.iter().enumerate().all(|(i, k)| k.iter().all(|&b| usize::from(b) == i)));
                    }
                })
            })
            .collect();
        for _ in 0..50 {
            release();
        }
        for w in workers {
            w.join().unwrap();
        }
    }
}
