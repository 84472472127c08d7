//! Client-side adaptive throttling (Google's SRE book, "Handling Overload"), for a client in
//! front of a backend that sheds: when the backend refuses much of what it is sent, the
//! client refuses a share of its requests itself instead of sending them, so a shedding
//! backend is not also hammered with the work it will refuse.
//!
//! Over a sliding window (two minutes by default), with `requests` the requests the
//! application tried (refused locally or not) and `accepts` those the backend took, a request
//! is refused locally with probability `max(0, (requests − K·accepts) ÷ (requests + 1))`.
//! With `K = 2` nothing is refused while the backend accepts half or more; when it accepts
//! nothing, nearly everything is, and the trickle still sent notices its recovery.
//!
//! The refusals are spread evenly rather than drawn at random: a running sum of the
//! probability refuses a request each time it passes a whole one, so the share refused is
//! exact and the same on every run.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use tollgate_limiter::throttle::{ClientThrottle, ThrottleOptions};
//!
//! let throttle = ClientThrottle::new(ThrottleOptions::default()).unwrap();
//! for _ in 0..1000 {
//!     if !throttle.allow() {
//!         continue; // refused here: answer as the backend would have (429, say)
//!     }
//!     let accepted = false; // ... send it; this backend is refusing everything
//!     throttle.record(accepted);
//! }
//! // Most requests are now refused here; a trickle still goes to see if it recovered.
//! assert!(throttle.reject_probability() > 0.99);
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::adaptive::AdaptiveThrottle;
use tollgate_model::time::Clock;

use crate::clock::TokioClock;

/// How a [`ClientThrottle`] behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleOptions {
    /// The multiplier `K`: the client sends up to `K` requests for each one the backend
    /// accepts before refusing any (1 to 100; default 2, the SRE book's).
    pub k: f64,
    /// How far back requests and accepts count (1 s to 1 hour; default 2 minutes).
    pub window: Duration,
}

impl Default for ThrottleOptions {
    fn default() -> Self {
        Self { k: 2.0, window: Duration::from_secs(120) }
    }
}

impl ThrottleOptions {
    /// Checks each option's range: the one that breaks it, and the rule.
    pub fn check(&self) -> Result<(), String> {
        if !(self.k.is_finite() && (1.0..=100.0).contains(&self.k)) {
            return Err("k: 1 to 100".into());
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.window) {
            return Err("window: 1 s to 1 hour".into());
        }
        Ok(())
    }
}

/// A client's adaptive throttle; cheap to clone, shared by the clones. Create it inside a
/// tokio runtime (it keeps tokio's time).
#[derive(Debug, Clone)]
pub struct ClientThrottle {
    state: Arc<Mutex<State>>,
    clock: TokioClock,
}

#[derive(Debug)]
struct State {
    throttle: AdaptiveThrottle,
    /// The running sum of refusal probabilities not yet spent on a refusal.
    owed: f64,
}

impl ClientThrottle {
    /// A throttle with `opts`, or the option out of range and its rule.
    pub fn new(opts: ThrottleOptions) -> Result<ClientThrottle, String> {
        opts.check()?;
        let state = State { throttle: AdaptiveThrottle::new(opts.k, opts.window), owed: 0.0 };
        Ok(ClientThrottle { state: Arc::new(Mutex::new(state)), clock: TokioClock::new() })
    }

    /// Whether to send a request now: `false` refuses it here, and counts it as a request the
    /// backend did not accept. After `true`, report the backend's answer with
    /// [`record`](Self::record).
    pub fn allow(&self) -> bool {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.owed += s.throttle.reject_probability(now);
        if s.owed < 1.0 {
            return true;
        }
        s.owed -= 1.0;
        s.throttle.record(now, false);
        false
    }

    /// Counts a request sent, and whether the backend accepted it (a refusal for overload:
    /// a 429 or 503, `RESOURCE_EXHAUSTED`; a request the backend found malformed was accepted
    /// as far as its load goes).
    pub fn record(&self, accepted: bool) {
        let now = self.clock.now();
        self.state.lock().unwrap_or_else(PoisonError::into_inner).throttle.record(now, accepted);
    }

    /// The probability the next request is refused here.
    pub fn reject_probability(&self) -> f64 {
        let now = self.clock.now();
        self.state.lock().unwrap_or_else(PoisonError::into_inner).throttle.reject_probability(now)
    }

    /// Requests tried and accepted within the window.
    pub fn counts(&self) -> (u64, u64) {
        let now = self.clock.now();
        self.state.lock().unwrap_or_else(PoisonError::into_inner).throttle.counts(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that takes 20 requests a second, tried 200 times a second: what it is sent
    /// settles at K times what it takes, and a recovered backend is sent everything again.
    #[tokio::test(start_paused = true)]
    async fn a_shedding_backend_is_sent_k_times_what_it_takes_then_all_once_it_recovers() {
        let throttle = ClientThrottle::new(ThrottleOptions::default()).unwrap();
        let (mut sent, mut accepted) = (0u64, 0u64);
        for i in 0..48_000u64 {
            tokio::time::advance(Duration::from_millis(5)).await;
            if i % 200 == 0 {
                (sent, accepted) = (0, 0);
            }
            if throttle.allow() {
                sent += 1;
                let ok = accepted < 20;
                accepted += u64::from(ok);
                throttle.record(ok);
            }
        }
        // The last second, four minutes in.
        assert_eq!(accepted, 20);
        assert!((38..=44).contains(&sent), "sent {sent} of 200 tried");
        for _ in 0..30_000 {
            tokio::time::advance(Duration::from_millis(5)).await;
            if throttle.allow() {
                throttle.record(true);
            }
        }
        assert_eq!(throttle.reject_probability(), 0.0);
        assert!(throttle.allow());
    }

    #[test]
    fn options_out_of_range_are_named() {
        let bad = |o: ThrottleOptions| ClientThrottle::new(o).unwrap_err();
        assert!(bad(ThrottleOptions { k: 0.5, ..Default::default() }).starts_with("k:"));
        assert!(bad(ThrottleOptions { k: f64::NAN, ..Default::default() }).starts_with("k:"));
        let short = ThrottleOptions { window: Duration::from_millis(10), ..Default::default() };
        assert!(bad(short).starts_with("window:"));
    }
}
