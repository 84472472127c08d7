//! The client table: each client's chosen name mapped to a short id, bounded and expiring.
//!
//! A client numbers its exchanges (1, 2, 3, …). An exchange whose number is not above the last
//! one seen under the same name comes from a restarted process: it gets a fresh id, and the
//! earlier id is handed back to the engine to be released, so the new process takes up the
//! room the dead one held at once rather than a lease later. (Two live processes sharing one
//! name would keep releasing each other: client ids must be unique, and the restart count,
//! shown in status and metrics, climbing without restarts says they are not.)

use std::collections::HashMap;
use std::time::Duration;

use super::Place;
use super::split::ClientId;
use crate::time::Nanos;

struct Slot {
    id: ClientId,
    sequence: u64,
    seen: Nanos,
}

/// Why a client could not be taken in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The table is full of live clients.
    #[error("too many clients: the controller tracks at most {max}; try again once some have gone quiet")]
    TooMany {
        /// The bound.
        max: usize,
    },
}

pub(crate) struct ClientTable {
    by_key: HashMap<Box<str>, Slot>,
    /// Where each client's groups sat in the tracked table at its last exchange, and where the
    /// client sat in each group's list, in the order it reported them (see
    /// [`Engine::report_all`](super::Engine::report_all)).
    pub(super) routes: HashMap<ClientId, Vec<Place>>,
    next_id: ClientId,
    max: usize,
    restarts: u64,
}

impl ClientTable {
    pub(crate) fn new(max: usize) -> Self {
        Self { by_key: HashMap::new(), routes: HashMap::new(), next_id: 1, max, restarts: 0 }
    }

    /// The id for `key` at an exchange numbered `sequence` (0: not numbered).
    /// A restart also gives the earlier id.
    pub(crate) fn resolve(
        &mut self,
        now: Nanos,
        key: &str,
        sequence: u64,
    ) -> Result<(ClientId, Option<ClientId>), ClientError> {
        if let Some(slot) = self.by_key.get_mut(key) {
            let mut earlier = None;
            if sequence != 0 && sequence <= slot.sequence {
                self.routes.remove(&slot.id);
                earlier = Some(slot.id);
                slot.id = self.next_id;
                self.next_id += 1;
                self.restarts += 1;
            }
            slot.sequence = sequence;
            slot.seen = now;
            return Ok((slot.id, earlier));
        }
        if self.by_key.len() >= self.max {
            return Err(ClientError::TooMany { max: self.max });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_key.insert(key.into(), Slot { id, sequence, seen: now });
        Ok((id, None))
    }

    /// Forgets clients not seen for longer than `expiry`.
    pub(crate) fn expire(&mut self, now: Nanos, expiry: Duration) {
        let routes = &mut self.routes;
        self.by_key.retain(|_, s| {
            let keep = now.since(s.seen) <= expiry;
            if !keep {
                routes.remove(&s.id);
            }
            keep
        });
        if self.routes.len() > self.by_key.len() {
            // Routes kept for ids no longer in the table (an exchange raced a restart).
            let live: std::collections::HashSet<ClientId> = self.by_key.values().map(|s| s.id).collect();
            self.routes.retain(|id, _| live.contains(id));
        }
        if self.by_key.capacity() > 64 && self.by_key.len() < self.by_key.capacity() / 4 {
            self.by_key.shrink_to(self.by_key.len() * 2);
        }
        if self.routes.capacity() > 64 && self.routes.len() < self.routes.capacity() / 4 {
            self.routes.shrink_to(self.routes.len() * 2);
        }
    }

    /// Takes `client`'s route, leaving it none until [`keep_route`](Self::keep_route).
    pub(crate) fn take_route(&mut self, client: ClientId) -> Vec<Place> {
        self.routes.remove(&client).unwrap_or_default()
    }

    /// Keeps `client`'s route for its next exchange: at most one route a client the table
    /// can hold (past that, a client goes without, and its reports look their groups up).
    pub(crate) fn keep_route(&mut self, client: ClientId, route: Vec<Place>) {
        if self.routes.len() < self.max {
            self.routes.insert(client, route);
        }
    }

    /// Every client: its id (name), its short id, when it last exchanged.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, ClientId, Nanos)> {
        self.by_key.iter().map(|(k, s)| (&**k, s.id, s.seen))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn restarts(&self) -> u64 {
        self.restarts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_client_gets_a_fresh_id_and_the_table_is_bounded() {
        let mut t = ClientTable::new(2);
        let (a, none) = t.resolve(Nanos(0), "a", 1).unwrap();
        assert!(none.is_none());
        assert_eq!(t.resolve(Nanos(1), "a", 2).unwrap().0, a);
        let (again, earlier) = t.resolve(Nanos(2), "a", 1).unwrap();
        assert_ne!(again, a);
        assert_eq!(earlier, Some(a), "the earlier id is handed back");
        assert_eq!(t.restarts(), 1);
        t.resolve(Nanos(3), "b", 1).unwrap();
        assert!(matches!(t.resolve(Nanos(4), "c", 1), Err(ClientError::TooMany { max: 2 })));
        t.expire(Nanos(20_000_000_000), Duration::from_secs(10));
        assert_eq!(t.len(), 0);
        assert!(t.resolve(Nanos(20_000_000_000), "c", 1).is_ok());
    }
}
