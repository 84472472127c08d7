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
    let spare = if asked < rest && !clients.is_empty() { (rest - asked) / clients.len() as f64 } else { 0.0 };
    out.extend(clients.iter().zip(scratch.iter()).map(|(c, d)| {
        let rate = c.unthrottled * scale + d.min(level) + spare;
        let burst = match burst_total {
            Some(b) if target > 0.0 => b * rate / target,
            _ => rate,
        };
        ClientGrant { client: c.client, rate, burst }
    }));
    level
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(client: ClientId, demand: f64, unthrottled: f64) -> Asking {
        Asking { client, demand, unthrottled }
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
    }
}
