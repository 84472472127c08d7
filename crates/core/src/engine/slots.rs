//! In-flight quotas: a group's `max_in_flight` slots shared among its clients.
//!
//! A slot is held by a request from admission until its permit is dropped or settled, in
//! the client that admitted it, so a controller cannot take one back: it can only stop
//! handing it out. Each client's share is therefore leased the way rates are, and changed
//! so that the slots the clients may hold never add up to more than the quota:
//!
//! - a client's *fair* share is the water-filled split of the quota by what each asks (the
//!   most it held or tried to hold since its last report), and half of what nobody asks for
//!   is spread evenly as slack, so a client can grow a little before its next exchange while
//!   the other half waits for a newcomer;
//! - a client may be told a share below what it holds at once (it admits no more until its
//!   requests finish), but a rise comes only out of slots no other client may hold: the
//!   larger of each other client's last two shares and what it last said it holds (its last
//!   share may still be in use until its next report shows it took the new one);
//! - a client not heard from for `report_expiry` is forgotten, and its slots come back (the
//!   one way the sum can pass the quota: a client cut off from its controller keeps its last
//!   share, as it keeps its last rate in safe mode).

use std::time::Duration;

use super::split::ClientId;
use crate::time::Nanos;

/// One client's part in a group's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    client: ClientId,
    /// The most it held or tried to hold since its previous report.
    asked: u32,
    /// What it said it holds at its last report.
    held: u32,
    /// Its share now, and the one before (which it may still be using).
    share: u32,
    before: u32,
    seen: Nanos,
}

impl Holder {
    /// The most this client may be holding or about to hold.
    fn bound(&self) -> u64 {
        u64::from(self.share.max(self.before).max(self.held))
    }
}

/// A group's slots and their holders.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    /// Sorted by client.
    holders: Vec<Holder>,
}

/// What a group's clients hold of its in-flight quota, for status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Requests its clients said they hold in flight at their last reports.
    pub held: u64,
    /// The sum of the clients' shares.
    pub shared: u64,
    /// Clients holding a share.
    pub clients: u32,
}

impl Ledger {
    /// A report from `client`, holding `held` slots and having asked for up to `asked`
    /// since its last: returns its share of `max` slots.
    pub(crate) fn report(
        &mut self,
        now: Nanos,
        client: ClientId,
        held: u32,
        asked: u32,
        max: u32,
        expiry: Duration,
    ) -> u32 {
        self.forget_silent(now, expiry, Some(client));
        let at = match self.holders.binary_search_by_key(&client, |h| h.client) {
            Ok(at) => at,
            Err(at) => {
                let h = Holder { client, asked: 0, held: 0, share: 0, before: 0, seen: now };
                self.holders.insert(at, h);
                at
            }
        };
        let me = &mut self.holders[at];
        me.held = held;
        me.asked = asked.max(held);
        me.seen = now;
        let fair = fair_share(&self.holders, at, max, now);
        let others: u64 =
            self.holders.iter().enumerate().filter(|&(i, _)| i != at).map(|(_, h)| h.bound()).sum();
        let room = u64::from(max).saturating_sub(others);
        let me = &mut self.holders[at];
        // A fall applies at once; a rise only into room no other client may be using.
        let share = if u64::from(fair) <= u64::from(me.share) {
            fair
        } else {
            u32::try_from(u64::from(fair).min(room.max(u64::from(me.share)))).unwrap_or(fair)
        };
        me.before = me.share;
        me.share = share;
        share
    }

    /// Drops the clients not heard from within `expiry` (but `keep`); says whether any
    /// client is left.
    pub(crate) fn forget_silent(&mut self, now: Nanos, expiry: Duration, keep: Option<ClientId>) -> bool {
        self.holders.retain(|h| Some(h.client) == keep || now.since(h.seen) <= expiry);
        !self.holders.is_empty()
    }

    /// Drops one client (a restarted client's earlier incarnation).
    pub(crate) fn release(&mut self, client: ClientId) {
        self.holders.retain(|h| h.client != client);
    }

    /// What the clients hold.
    pub(crate) fn in_flight(&self) -> InFlight {
        InFlight {
            held: self.holders.iter().map(|h| u64::from(h.held)).sum(),
            shared: self.holders.iter().map(|h| u64::from(h.share)).sum(),
            clients: u32::try_from(self.holders.len()).unwrap_or(u32::MAX),
        }
    }

    /// The most the clients may hold at once: the bound every share is kept within.
    #[cfg(test)]
    pub(crate) fn bound(&self) -> u64 {
        self.holders.iter().map(Holder::bound).sum()
    }
}

/// The fair share of the holder at `at`: `max` water-filled over what each asks, and an
/// even part (rounded up) of half the slots nobody asks for. Past the water level the slots
/// that do not divide evenly go one each to some of the clients asking more than it, a
/// different few each second (`now`), so a quota of 1 wanted by two clients serves each in
/// turn rather than neither.
fn fair_share(holders: &[Holder], at: usize, max: u32, now: Nanos) -> u32 {
    let total = u64::from(max);
    let asked: u64 = holders.iter().map(|h| u64::from(h.asked)).sum();
    let mine = u64::from(holders[at].asked);
    let n = holders.len() as u64;
    if asked <= total {
        // Rounded up, so a client alone with a quota of 1 holds it before it has asked:
        // the rule that a rise takes only room no other client may use keeps the sum.
        let slack = (total - asked).div_ceil(2 * n.max(1));
        return u32::try_from(mine + slack).unwrap_or(max);
    }
    // The water level: the clients asking less than it get what they ask, the rest share
    // what is left evenly.
    let mut order: Vec<usize> = (0..holders.len()).collect();
    order.sort_by_key(|&i| (holders[i].asked, i));
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let a = u64::from(holders[i].asked);
        let even = left / (n - k as u64);
        if a <= even {
            left -= a;
            continue;
        }
        // Every client from here on asks more than the level.
        if mine <= even {
            break;
        }
        let mut above: Vec<usize> = order[k..].to_vec();
        above.sort_unstable();
        let count = above.len() as u64;
        let odd = left - even * count;
        let pos = above.iter().position(|&j| j == at).unwrap_or(0) as u64;
        let turn = now.as_u64() / 1_000_000_000 % count;
        let extra = u64::from((pos + count - turn) % count < odd);
        return u32::try_from(even + extra).unwrap_or(max);
    }
    u32::try_from(mine).unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXPIRY: Duration = Duration::from_secs(10);

    #[test]
    fn one_client_asking_little_has_its_ask_and_half_the_rest() {
        let mut l = Ledger::default();
        assert_eq!(l.report(Nanos(0), 1, 0, 4, 20, EXPIRY), 12);
        assert_eq!(l.in_flight(), InFlight { held: 0, shared: 12, clients: 1 });
    }

    #[test]
    fn a_newcomer_gets_room_as_the_others_give_theirs_back() {
        let mut l = Ledger::default();
        assert_eq!(l.report(Nanos(0), 1, 10, 10, 10, EXPIRY), 10);
        // The first client holds all ten: the second waits.
        assert_eq!(l.report(Nanos(1), 2, 0, 10, 10, EXPIRY), 0);
        // The first is told five, and may hold ten until it reports again.
        assert_eq!(l.report(Nanos(2), 1, 10, 10, 10, EXPIRY), 5);
        assert_eq!(l.report(Nanos(3), 2, 0, 10, 10, EXPIRY), 0);
        // Once it reports holding five, the second has its five.
        assert_eq!(l.report(Nanos(4), 1, 5, 10, 10, EXPIRY), 5);
        assert_eq!(l.report(Nanos(5), 2, 0, 10, 10, EXPIRY), 5);
    }

    #[test]
    fn a_lone_client_holds_a_quota_of_one_before_it_asks() {
        let mut l = Ledger::default();
        // Idle, it keeps the slot: its next request need not wait for an exchange.
        assert_eq!(l.report(Nanos(0), 1, 0, 0, 1, EXPIRY), 1);
        assert_eq!(l.report(Nanos(1), 1, 0, 0, 1, EXPIRY), 1);
    }

    #[test]
    fn two_clients_wanting_a_quota_of_one_take_turns() {
        let second = 1_000_000_000;
        let mut l = Ledger::default();
        let mut had = [0u32; 2];
        let mut turns = [0u32; 2];
        for t in 0..40u64 {
            let c = (t % 2) as usize;
            // Each holds what it was last given, and always wants one.
            let share = l.report(Nanos(t * second / 4), c as u64, had[c], 1, 1, EXPIRY);
            had[c] = share;
            turns[c] += share;
            assert!(l.bound() <= 1, "at {t}: {l:?}");
        }
        assert!(turns[0] > 0 && turns[1] > 0, "{turns:?}");
    }

    #[test]
    fn a_silent_client_gives_its_slots_back_after_the_expiry() {
        let mut l = Ledger::default();
        assert_eq!(l.report(Nanos(0), 1, 8, 8, 8, EXPIRY), 8);
        assert_eq!(l.report(Nanos(1), 2, 0, 8, 8, EXPIRY), 0);
        let later = Nanos(EXPIRY.as_nanos() as u64 + 2);
        assert_eq!(l.report(later, 2, 0, 8, 8, EXPIRY), 8);
    }

    #[test]
    fn the_water_level_gives_small_askers_what_they_ask() {
        let holders: Vec<Holder> = [2u32, 30, 30]
            .iter()
            .enumerate()
            .map(|(i, &asked)| Holder {
                client: i as u64,
                asked,
                held: 0,
                share: 0,
                before: 0,
                seen: Nanos(0),
            })
            .collect();
        assert_eq!(fair_share(&holders, 0, 20, Nanos(0)), 2);
        assert_eq!(fair_share(&holders, 1, 20, Nanos(0)), 9);
        assert_eq!(fair_share(&holders, 2, 20, Nanos(0)), 9);
    }

    proptest! {
        /// However the clients report (and whatever they claim to hold, within what they
        /// were allowed), the slots they may hold never add up to more than the quota.
        #[test]
        fn the_shares_never_pass_the_quota(
            max in 1u32..200,
            steps in proptest::collection::vec((0u64..6, 0u32..300, 0u32..300), 1..200),
        ) {
            let mut l = Ledger::default();
            let mut shares = std::collections::HashMap::new();
            for (t, (client, held, asked)) in steps.into_iter().enumerate() {
                // A client holds at most its last share, or what it held already above it.
                let (share, had): (u32, u32) = shares.get(&client).copied().unwrap_or((0, 0));
                let held = held.min(share.max(had));
                let share = l.report(Nanos(t as u64), client, held, asked, max, EXPIRY);
                shares.insert(client, (share, held));
                prop_assert!(l.bound() <= u64::from(max), "bound {} over {max}", l.bound());
                prop_assert!(shares.values().map(|&(s, _)| u64::from(s)).sum::<u64>() <= u64::from(max));
            }
        }

        /// Asking clients end up with all the slots between them once each has reported
        /// twice holding what it was given.
        #[test]
        fn the_quota_is_handed_out_once_reports_settle(max in 1u32..200, n in 1u64..6) {
            let mut l = Ledger::default();
            let mut shares = vec![0u32; n as usize];
            for round in 0..4 {
                for c in 0..n {
                    let held = shares[c as usize];
                    shares[c as usize] = l.report(Nanos(round * 10 + c), c, held, max, max, EXPIRY);
                }
            }
            let total: u64 = shares.iter().map(|&s| u64::from(s)).sum();
            prop_assert_eq!(total, u64::from(max), "{:?} of {}", shares, max);
        }
    }
}
