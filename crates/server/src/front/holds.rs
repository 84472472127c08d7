//! Permits held across calls: the front ends' way to keep an in-flight slot from admission
//! until the work ends, when the work runs somewhere else.
//!
//! `POST /v1/acquire` admits a request and keeps its permit here under a random id the
//! caller releases (`POST /v1/release`, with the real cost if it is known by then) or renews
//! (`POST /v1/renew`); Envoy's rate-limit filter keeps one from the request to the end of its
//! stream under the request's `x-request-id`, through the rate-limit service. Each has a lease: a
//! caller that dies without releasing gives its slot back when the lease runs out, so a
//! group's quota of in-flight requests never sticks at full. At most [`HOLDS_MAX`] are held
//! at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate_limiter::Permit;
use tollgate_model::time::Nanos;

/// The most permits held at once, over every group and front end.
pub const HOLDS_MAX: usize = 100_000;
/// A lease's length when the caller names none.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(60);
/// The shortest lease a caller may ask for.
pub const LEASE_MIN: Duration = Duration::from_secs(1);
/// The longest lease a caller may ask for (a day).
pub const LEASE_MAX: Duration = Duration::from_secs(86_400);
/// The most bytes of an Envoy request id a hold is kept under.
pub const REQUEST_ID_MAX_BYTES: usize = 256;

/// What a held permit is known by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldKey {
    /// A permit handed out by `POST /v1/acquire`: 128 random bits.
    Permit(u128),
    /// An Envoy request's permit for one group: the group's name and the request's id.
    Request(String, String),
}

/// A permit held, with its group's name.
#[derive(Debug)]
pub struct Held {
    /// The group it was admitted for.
    pub group: String,
    /// The permit: dropping it gives the slot back; settling it also corrects the cost.
    pub permit: Permit<'static>,
    expires: Nanos,
}

/// Why a permit could not be held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HoldError {
    /// [`HOLDS_MAX`] permits are held already.
    #[error("this server holds {HOLDS_MAX} permits, its most: release some, or let their leases run out")]
    Full,
    /// A permit is held under this key already (an Envoy request id sent twice).
    #[error("a permit is held under this id already")]
    Taken,
    /// The system's random source failed, so no permit id could be made.
    #[error("the system's random source failed")]
    Random,
}

/// The permits held, by key, and their leases' ends in order.
#[derive(Debug, Default)]
pub struct Holds {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    held: HashMap<HoldKey, Held>,
    ends: BTreeSet<(Nanos, HoldKey)>,
}

impl Holds {
    /// Keeps `permit` of `group` under `key` until it is released or `lease` after `now`.
    pub fn hold(
        &self,
        key: HoldKey,
        group: &str,
        permit: Permit<'static>,
        now: Nanos,
        lease: Duration,
    ) -> Result<(), HoldError> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.held.contains_key(&key) {
            return Err(HoldError::Taken);
        }
        if inner.held.len() >= HOLDS_MAX {
            return Err(HoldError::Full);
        }
        let expires = now.after(lease);
        inner.ends.insert((expires, key.clone()));
        inner.held.insert(key, Held { group: group.to_owned(), permit, expires });
        Ok(())
    }

    /// Takes the permit held under `key` (to drop or settle it); `None` if it was released
    /// already or its lease ran out.
    pub fn release(&self, key: &HoldKey) -> Option<Held> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let held = inner.held.remove(key)?;
        inner.ends.remove(&(held.expires, key.clone()));
        Some(held)
    }

    /// Extends the lease of the permit under `key` to `lease` after `now`: its group, or
    /// `None` if it is no longer held.
    pub fn renew(&self, key: &HoldKey, now: Nanos, lease: Duration) -> Option<String> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner { held, ends } = &mut *inner;
        let h = held.get_mut(key)?;
        ends.remove(&(h.expires, key.clone()));
        h.expires = now.after(lease);
        ends.insert((h.expires, key.clone()));
        Some(h.group.clone())
    }

    /// The group of the permit under `key`, if it is held.
    pub fn group_of(&self, key: &HoldKey) -> Option<String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.held.get(key).map(|h| h.group.clone())
    }

    /// Drops the permits whose leases ended by `now` (their slots come back): how many.
    pub fn expire(&self, now: Nanos) -> usize {
        let ended: Vec<Held> = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let mut ended = Vec::new();
            while let Some((at, _)) = inner.ends.first()
                && *at <= now
            {
                let Some((_, key)) = inner.ends.pop_first() else { break };
                ended.extend(inner.held.remove(&key));
            }
            ended
        };
        // Dropped outside the lock: a permit's drop wakes the group's waiters.
        ended.len()
    }

    /// How many permits are held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).held.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A new permit's key, from the system's random source.
pub fn new_permit_key() -> Result<HoldKey, HoldError> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| HoldError::Random)?;
    Ok(HoldKey::Permit(u128::from_be_bytes(bytes)))
}

/// A permit's key as the HTTP API writes it: `p` and 32 hex digits.
pub fn permit_text(key: &HoldKey) -> String {
    match key {
        HoldKey::Permit(n) => format!("p{n:032x}"),
        HoldKey::Request(group, id) => format!("{group}/{id}"),
    }
}

/// A permit's key from its text, as [`permit_text`] writes it.
pub fn parse_permit(text: &str) -> Option<HoldKey> {
    let hex = text.strip_prefix('p')?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(HoldKey::Permit)
}

/// A lease asked for in seconds, checked against [`LEASE_MIN`] and [`LEASE_MAX`];
/// [`LEASE_DEFAULT`] when none is asked for.
pub fn lease_of(seconds: Option<f64>) -> Result<Duration, String> {
    let Some(s) = seconds else { return Ok(LEASE_DEFAULT) };
    let (min, max) = (LEASE_MIN.as_secs_f64(), LEASE_MAX.as_secs_f64());
    if !s.is_finite() || !(min..=max).contains(&s) {
        return Err(format!("must be from {min} to {max} seconds, got {s}"));
    }
    Ok(Duration::from_secs_f64(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limiter::Tollgate;
    use tollgate_model::time::ManualClock;

    fn gate() -> Tollgate {
        let toml = "[groups.one]\nlimit = 1000\nmax_in_flight = 1\n";
        Tollgate::from_toml(toml).and_then(|g| g.with_clock(ManualClock::new())).expect("a valid gate")
    }

    #[test]
    fn a_held_permit_keeps_its_slot_until_released() {
        let gate = gate();
        let holds = Holds::default();
        let key = new_permit_key().expect("random bits");
        let permit = gate.try_acquire("one", 1.0).expect("the first is admitted").into_owned();
        holds.hold(key.clone(), "one", permit, Nanos(0), LEASE_DEFAULT).expect("room");
        assert!(gate.try_acquire("one", 1.0).is_err(), "the slot is held");
        let held = holds.release(&key).expect("held");
        assert_eq!(held.group, "one");
        drop(held);
        assert!(holds.release(&key).is_none(), "released once");
        assert!(gate.try_acquire("one", 1.0).is_ok(), "the slot came back");
    }

    #[test]
    fn a_lease_that_runs_out_gives_the_slot_back_and_a_renewal_extends_it() {
        let gate = gate();
        let holds = Holds::default();
        let key = HoldKey::Request("one".into(), "r-1".into());
        let permit = gate.try_acquire("one", 1.0).expect("admitted").into_owned();
        let lease = Duration::from_secs(5);
        holds.hold(key.clone(), "one", permit, Nanos(0), lease).expect("room");
        assert_eq!(holds.expire(Nanos(0).after(Duration::from_secs(4))), 0);
        assert_eq!(holds.renew(&key, Nanos(0).after(Duration::from_secs(4)), lease).as_deref(), Some("one"));
        assert_eq!(holds.expire(Nanos(0).after(Duration::from_secs(8))), 0, "renewed to 9 s");
        assert!(gate.try_acquire("one", 1.0).is_err());
        assert_eq!(holds.expire(Nanos(0).after(Duration::from_secs(9))), 1);
        assert!(holds.is_empty());
        assert!(gate.try_acquire("one", 1.0).is_ok(), "the slot came back");
        assert!(holds.renew(&key, Nanos(0), lease).is_none());
    }

    #[test]
    fn the_same_request_id_is_held_once() {
        let gate = gate();
        let holds = Holds::default();
        let key = HoldKey::Request("one".into(), "r-1".into());
        let a = gate.try_acquire("one", 0.0).expect("admitted").into_owned();
        holds.hold(key.clone(), "one", a, Nanos(0), LEASE_DEFAULT).expect("room");
        let again = Tollgate::from_toml("[groups.one]\nlimit = 1\n").expect("gate");
        let b = again.try_acquire("one", 0.0).expect("admitted").into_owned();
        assert_eq!(holds.hold(key, "one", b, Nanos(0), LEASE_DEFAULT), Err(HoldError::Taken));
        assert_eq!(holds.len(), 1);
    }

    #[test]
    fn permits_read_back_as_written_and_bad_ones_are_refused() {
        let key = HoldKey::Permit(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let text = permit_text(&key);
        assert_eq!(text, "p0123456789abcdef0011223344556677");
        assert_eq!(parse_permit(&text), Some(key));
        for bad in ["", "p", "0123456789abcdef0011223344556677", "p0123", "pzz23456789abcdef0011223344556677"]
        {
            assert_eq!(parse_permit(bad), None, "{bad}");
        }
        assert_eq!(lease_of(None), Ok(LEASE_DEFAULT));
        assert_eq!(lease_of(Some(2.5)), Ok(Duration::from_millis(2500)));
        for bad in [0.5, 86_401.0, f64::NAN, -1.0] {
            assert!(lease_of(Some(bad)).is_err(), "{bad}");
        }
    }
}
