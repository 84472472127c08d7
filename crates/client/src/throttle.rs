//! Client-side adaptive throttling (Google's SRE book, "Handling Overload"), for a client in
//! front of a backend that sheds: when the backend refuses much of what it is sent, the
//! client refuses a share of its requests itself instead of sending them, so a shedding
//! backend is not also hammered with the work it will refuse.
//!
//! Over a sliding window (two minutes by default), with `requests` the requests the
//! application tried (refused locally or not) and `accepts` those the backend took, a request
//! is refused locally with probability `max(0, (requests − K·accepts) ÷ (requests + 1))`.
//! With `K = 2` nothing is refused while the backend accepts half or more. The probability is
//! capped (`max_reject`, 0.8 by default, as Envoy's admission control caps it): the book's
//! uncapped rule refuses nearly everything once a backend accepts nothing, and since the
//! requests it refuses count as refused, the share sent then grows back only as fast as it
//! is accepted: about ten minutes with a two-minute window. Capped, a fifth is always sent, and
//! a recovered backend is sent everything again within about a window and a half (170 s).
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
//! // Most requests are now refused here; a fifth still go, to see if it recovered.
//! assert_eq!(throttle.reject_probability(), 0.8);
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate_model::adaptive::AdaptiveThrottle;
use tollgate_model::time::Clock;

use crate::clock::TokioClock;

/// A request the client's adaptive throttle refused before sending it: the backend has been
/// refusing much of what it was sent ([`TollgateLayer::with_adaptive_throttle`](crate::TollgateLayer::with_adaptive_throttle)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("refused by the client's adaptive throttle: the backend is refusing much of its work")]
pub struct RefusedLocally;

/// How a [`ClientThrottle`] behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleOptions {
    /// The multiplier `K`: the client sends up to `K` requests for each one the backend
    /// accepts before refusing any (1 to 100; default 2, the SRE book's).
    pub k: f64,
    /// How far back requests and accepts count (1 s to 1 hour; default 2 minutes).
    pub window: Duration,
    /// The highest probability of refusing a request (above 0, at most 1; default 0.8, as
    /// Envoy's admission control). Requests refused here count as refused, so a backend that
    /// refused everything is sent only what this leaves, and the share sent grows only as
    /// that share is accepted: uncapped (1), a client whose backend refused everything for a
    /// while takes about five windows to send everything again; at 0.8, about a window and a
    /// half.
    pub max_reject: f64,
}

impl Default for ThrottleOptions {
    fn default() -> Self {
        Self { k: 2.0, window: Duration::from_secs(120), max_reject: 0.8 }
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
        if !(self.max_reject.is_finite() && self.max_reject > 0.0 && self.max_reject <= 1.0) {
            return Err("max_reject: above 0, at most 1".into());
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
    max_reject: f64,
}

impl ClientThrottle {
    /// A throttle with `opts`, or the option out of range and its rule.
    pub fn new(opts: ThrottleOptions) -> Result<ClientThrottle, String> {
        opts.check()?;
        let state = State {
            throttle: AdaptiveThrottle::new(opts.k, opts.window),
            owed: 0.0,
            max_reject: opts.max_reject,
        };
        Ok(ClientThrottle { state: Arc::new(Mutex::new(state)), clock: TokioClock::new() })
    }

    /// Whether to send a request now: `false` refuses it here, and counts it as a request the
    /// backend did not accept. After `true`, report the backend's answer with
    /// [`record`](Self::record).
    pub fn allow(&self) -> bool {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.owed += s.throttle.reject_probability(now).min(s.max_reject);
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

    /// The probability the next request is refused here (at most `max_reject`).
    pub fn reject_probability(&self) -> f64 {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.throttle.reject_probability(now).min(s.max_reject)
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

    /// A backend that refused everything for a minute: capped, a fifth is still sent, and all
    /// of it again within 200 s of its recovery (about 170 s); uncapped (the book's rule), the
    /// client is still refusing requests then.
    #[tokio::test(start_paused = true)]
    async fn a_capped_throttle_comes_back_within_a_window_of_a_total_outage() {
        for (max_reject, back) in [(0.8, true), (1.0, false)] {
            let throttle = ClientThrottle::new(ThrottleOptions { max_reject, ..Default::default() }).unwrap();
            let mut sent = 0;
            for _ in 0..6000 {
                tokio::time::advance(Duration::from_millis(10)).await;
                if throttle.allow() {
                    sent += 1;
                    throttle.record(false);
                }
            }
            if back {
                assert!(sent >= 1200, "{sent} of 6000 sent");
            }
            for _ in 0..20_000 {
                tokio::time::advance(Duration::from_millis(10)).await;
                if throttle.allow() {
                    throttle.record(true);
                }
            }
            let p = throttle.reject_probability();
            assert_eq!(p == 0.0, back, "max_reject {max_reject}: {p} 200 s after the recovery");
        }
    }

    #[test]
    fn options_out_of_range_are_named() {
        let bad = |o: ThrottleOptions| ClientThrottle::new(o).unwrap_err();
        assert!(bad(ThrottleOptions { k: 0.5, ..Default::default() }).starts_with("k:"));
        assert!(bad(ThrottleOptions { k: f64::NAN, ..Default::default() }).starts_with("k:"));
        let short = ThrottleOptions { window: Duration::from_millis(10), ..Default::default() };
        assert!(bad(short).starts_with("window:"));
        assert!(bad(ThrottleOptions { max_reject: 0.0, ..Default::default() }).starts_with("max_reject:"));
        assert!(bad(ThrottleOptions { max_reject: 1.5, ..Default::default() }).starts_with("max_reject:"));
    }
}
