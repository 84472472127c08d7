//! Splitting a group's target over its clients: FoundationDB's per-client rate.
//!
//! Each client first gets what its unthrottled work uses (it is admitted anyway and charged to
//! the client's bucket), or its part of the target if the unthrottled work alone exceeds it. The rest of the target is split by *water level* over what each
//! client asks for beyond that: the level `L` with `Σ min(demand_i, L) = rest`, so clients
//! asking little keep what they ask and the busy ones share the rest equally. When the
//! demands add up to less than the rest, each client also gets an equal part of what is left,
//! so the grants always add up to the target and a client whose demand grows finds room.

/// Opaque client identity, assigned by the engine's client table.
pub type ClientId = u64;

/// One client's share of a group: a rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientGrant {
    /// The client.
    pub client: ClientId,
    /// Units/s (infinite when the group is not throttled).
    pub rate: f64,
    /// Units it may bank.
    pub burst: f64,
}

/// The water level `L` with `Σ min(demand_i, L) = target`, or `target` when the demands add
/// up to less (FoundationDB's per-client rate at its fixed point).
///
/// ```
/// use tollgate_model::engine::water_level;
/// assert_eq!(water_level(20.0, &[5.0, 25.0]), 15.0);
/// assert_eq!(water_level(30.0, &[20.0, 20.0, 20.0]), 10.0);
/// ```
pub fn water_level(target: f64, demands: &[f64]) -> f64 {
    let total: f64 = demands.iter().sum();
    if total <= target || demands.len() <= 1 {
        return target;
    }
    let mut sorted = demands.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut left = target;
    for (i, d) in sorted.iter().enumerate() {
        let rest = (sorted.len() - i) as f64;
        if d * rest >= left {
            return left / rest;
        }
        left -= d;
    }
    left
}

/// What the split needs of one client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Asking {
    pub(crate) client: ClientId,
    /// Units/s asked for, unthrottled work included.
    pub(crate) demand: f64,
    /// Units/s of unthrottled work.
    pub(crate) unthrottled: f64,
    /// Units/s it consumed lately.
    pub(crate) using: f64,
}

/// Each client's grant into `out`, in the order of `clients`; returns the water level.
/// `burst_total` is the group's configured burst, divided in proportion to the rates (without
/// one, each client banks one second of its rate).
pub(crate) fn split_into(
    out: &mut Vec<ClientGrant>,
    target: f64,
    clients: &[Asking],
    burst_total: Option<f64>,
    scratch: &mut Vec<f64>,
) -> f64 {
    let unthrottled: f64 = clients.iter().map(|c| c.unthrottled).sum();
    // Beyond the target, unthrottled work is debt: each client's part of the target then.
    let scale = if unthrottled > target && unthrottled > 0.0 { target / unthrottled } else { 1.0 };
    let rest = (target - unthrottled).max(0.0);
    scratch.clear();
    scratch.extend(clients.iter().map(|c| (c.demand - c.unthrottled).max(0.0)));
    let level = water_level(rest, scratch);
    let asked: f64 = scratch.iter().sum();
    // The spare goes to the clients that ask for something (to all, when none does): one
    // whose load went elsewhere would only sit on it.
    let asking = clients.iter().filter(|c| c.demand > 0.0).count();
    let sharing = if asking > 0 { asking } else { clients.len() };
    let spare = if asked < rest && sharing > 0 { (rest - asked) / sharing as f64 } else { 0.0 };
    out.extend(clients.iter().zip(scratch.iter()).map(|(c, d)| {
        let share = if asking == 0 || c.demand > 0.0 { spare } else { 0.0 };
        let rate = c.unthrottled * scale + d.min(level) + share;
        let burst = match burst_total {
            Some(b) if target > 0.0 => b * rate / target,
            _ => rate,
        };
        ClientGrant { client: c.client, rate, burst }
    }));
    level
}

/// Raises come out of what the others give up, not out of what they still use: a client whose
/// grant is lowered holds its old one until its next exchange, so while it still uses more
/// than its new grant (its consumption lately, no more than the demand it now reports), the clients raised at this tick are raised by that much less in all
/// (each in proportion to its raise). `held` is what each client was granted at the last tick
/// (NaN for one it did not know: its grant is left as split). One tick later the lowered
/// client holds its new grant and the raises are given in full.
///
/// When the load on a group spreads from one client back over several, the one that had it
/// all keeps admitting at its old grant until it exchanges again: raising the others at once
/// would admit that much more than the target for up to an exchange period.
pub(crate) fn hold_back_raises(grants: &mut [ClientGrant], held: &[f64], clients: &[Asking]) {
    let (mut kept, mut raised) = (0.0, 0.0);
    for ((g, &h), c) in grants.iter().zip(held).zip(clients) {
        if g.rate < h {
            // What it still uses: its consumption lately, no more than it now asks for.
            kept += (h.min(c.using).min(c.demand) - g.rate).max(0.0);
        } else if g.rate > h && h.is_finite() {
            raised += g.rate - h;
        }
    }
    if kept <= 0.0 || raised <= 0.0 {
        return;
    }
    let given = (1.0 - kept / raised).max(0.0);
    for (g, &h) in grants.iter_mut().zip(held) {
        if g.rate > h && h.is_finite() {
            let rate = h + (g.rate - h) * given;
            g.burst *= rate / g.rate;
            g.rate = rate;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(client: ClientId, demand: f64, unthrottled: f64) -> Asking {
        Asking { client, demand, unthrottled, using: 0.0 }
    }

    #[test]
    fn a_raise_waits_for_what_a_lowered_client_still_uses() {
        // Client 1 had all 1,000 and still uses 600; the split lowers it to 400 and raises the
        // others from nothing to 300 each. Until it exchanges it admits 600: the others get
        // 200 each, and the three stay within the 1,000.
        let clients =
            [Asking { using: 600.0, ..asking(1, 600.0, 0.0) }, asking(2, 600.0, 0.0), asking(3, 600.0, 0.0)];
        let mut out = vec![
            ClientGrant { client: 1, rate: 400.0, burst: 400.0 },
            ClientGrant { client: 2, rate: 300.0, burst: 300.0 },
            ClientGrant { client: 3, rate: 300.0, burst: 300.0 },
        ];
        hold_back_raises(&mut out, &[1000.0, 0.0, 0.0], &clients);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let rates: Vec<f64> = out.iter().map(|g| g.rate).collect();
        assert!(rates.iter().zip([400.0, 200.0, 200.0]).all(|(&a, b)| close(a, b)), "{rates:?}");
        assert!(close(out[1].burst, 200.0), "{out:?}");
        // A lowered client that uses no more than its new grant holds nothing back (the load
        // left it), nor does one the last tick did not know.
        let mut idle = vec![
            ClientGrant { client: 1, rate: 10.0, burst: 10.0 },
            ClientGrant { client: 2, rate: 990.0, burst: 990.0 },
        ];
        hold_back_raises(&mut idle, &[500.0, 500.0], &[asking(1, 10.0, 0.0), asking(2, 2000.0, 0.0)]);
        assert_eq!((idle[0].rate, idle[1].rate), (10.0, 990.0));
        // Nor does one that used all of it lately but now asks for nothing (it went quiet).
        let quiet = Asking { using: 500.0, ..asking(1, 0.0, 0.0) };
        let mut moved = vec![
            ClientGrant { client: 1, rate: 0.0, burst: 0.0 },
            ClientGrant { client: 2, rate: 1000.0, burst: 1000.0 },
        ];
        hold_back_raises(&mut moved, &[500.0, 500.0], &[quiet, asking(2, 2000.0, 0.0)]);
        assert_eq!((moved[0].rate, moved[1].rate), (0.0, 1000.0));
        let mut new = vec![
            ClientGrant { client: 1, rate: 500.0, burst: 500.0 },
            ClientGrant { client: 2, rate: 500.0, burst: 500.0 },
        ];
        let busy = Asking { using: 1000.0, ..asking(1, 1000.0, 0.0) };
        hold_back_raises(&mut new, &[1000.0, f64::NAN], &[busy, asking(2, 1000.0, 0.0)]);
        assert_eq!((new[0].rate, new[1].rate), (500.0, 500.0));
    }

    #[test]
    fn water_level_matches_fdb_fixed_point() {
        assert_eq!(water_level(20.0, &[5.0, 25.0]), 15.0);
        assert_eq!(water_level(20.0, &[5.0, 5.0]), 20.0);
        assert_eq!(water_level(30.0, &[20.0, 20.0, 20.0]), 10.0);
        assert_eq!(water_level(25.0, &[1.0, 2.0, 100.0, 100.0]), 11.0);
    }

    #[test]
    fn unthrottled_work_comes_first_and_the_grants_add_up_to_the_target() {
        let mut out = Vec::new();
        let clients = [asking(1, 700.0, 700.0), asking(2, 1000.0, 0.0)];
        split_into(&mut out, 1000.0, &clients, None, &mut Vec::new());
        assert_eq!(out[0].rate, 700.0);
        assert_eq!(out[1].rate, 300.0);
        out.clear();
        // Demand below the target: the spare is shared, the sum is still the target.
        split_into(
            &mut out,
            100.0,
            &[asking(1, 10.0, 0.0), asking(2, 30.0, 0.0)],
            Some(50.0),
            &mut Vec::new(),
        );
        assert_eq!((out[0].rate, out[1].rate), (40.0, 60.0));
        assert_eq!((out[0].burst, out[1].burst), (20.0, 30.0));
        // A client that asks nothing (its load went elsewhere) gets none of the spare; when
        // none asks, they share it.
        out.clear();
        split_into(&mut out, 100.0, &[asking(1, 40.0, 0.0), asking(2, 0.0, 0.0)], None, &mut Vec::new());
        assert_eq!((out[0].rate, out[1].rate), (100.0, 0.0));
        out.clear();
        split_into(&mut out, 100.0, &[asking(1, 0.0, 0.0), asking(2, 0.0, 0.0)], None, &mut Vec::new());
        assert_eq!((out[0].rate, out[1].rate), (50.0, 50.0));
    }
}
