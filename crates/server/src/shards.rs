//! Groups sharded over controllers, the serving side: a client's exchange names groups of
//! many shards, so a controller splits it by each group's owner, passes each part to its owner
//! (under the client's own id and number, so each owner sees the client as a direct one
//! would), and joins the answers into one. The shard map itself, its moves and the split of
//! the capacity are [`tollgate_model::shard`]'s.

use tollgate_proto::v1;

/// The parts of `request` by owner, in the order each owner first appears, each with the
/// client's id, number and period; groups whose shard has no owner now (it is moving) are
/// left out, and counted in the second value: their clients keep the grants they hold until
/// the next exchange.
pub fn split_exchange(
    request: &v1::ExchangeRequest,
    mut owner: impl FnMut(&str) -> Option<usize>,
) -> (Vec<(usize, v1::ExchangeRequest)>, usize) {
    let mut parts: Vec<(usize, v1::ExchangeRequest)> = Vec::new();
    let mut unowned = 0;
    for g in &request.groups {
        let Some(o) = owner(&g.group) else {
            unowned += 1;
            continue;
        };
        let at = match parts.iter().position(|(p, _)| *p == o) {
            Some(at) => at,
            None => {
                parts.push((
                    o,
                    v1::ExchangeRequest {
                        client_id: request.client_id.clone(),
                        sequence: request.sequence,
                        groups: Vec::new(),
                        target_request_period_ms: request.target_request_period_ms,
                    },
                ));
                parts.len() - 1
            }
        };
        parts[at].1.groups.push(g.clone());
    }
    (parts, unowned)
}

/// One answer from the owners' answers to the parts of an exchange: every grant; the
/// earliest next exchange and next tick (a tick due somewhere is due); unthrottled work
/// allowed only if every owner allows it.
pub fn join_answers(answers: impl IntoIterator<Item = v1::ExchangeResponse>) -> v1::ExchangeResponse {
    let mut joined: Option<v1::ExchangeResponse> = None;
    for a in answers {
        match &mut joined {
            None => joined = Some(a),
            Some(j) => {
                j.grants.extend(a.grants);
                j.next_exchange_ms = j.next_exchange_ms.min(a.next_exchange_ms);
                j.next_tick_ms = j.next_tick_ms.min(a.next_tick_ms);
                j.unthrottled_allowed &= a.unthrottled_allowed;
            }
        }
    }
    joined.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(group: &str) -> v1::GroupUsage {
        v1::GroupUsage { group: group.into(), demand: 1.0, ..Default::default() }
    }

    #[test]
    fn an_exchange_is_split_by_owner_and_the_answers_joined() {
        let req = v1::ExchangeRequest {
            client_id: "c".into(),
            sequence: 7,
            groups: vec![usage("a1"), usage("b1"), usage("a2"), usage("moving")],
            target_request_period_ms: 500,
        };
        let (parts, unowned) = split_exchange(&req, |g| match &g[..1] {
            "a" => Some(3),
            "b" => Some(1),
            _ => None,
        });
        assert_eq!(unowned, 1);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0, 3);
        assert_eq!(parts[0].1.groups.iter().map(|g| g.group.as_str()).collect::<Vec<_>>(), ["a1", "a2"]);
        assert_eq!((parts[1].1.sequence, parts[1].1.client_id.as_str()), (7, "c"));
        let grant = |g: &str| v1::Grant { group: g.into(), rate: 1.0, ..Default::default() };
        let joined = join_answers([
            v1::ExchangeResponse {
                grants: vec![grant("a1"), grant("a2")],
                next_exchange_ms: 1000,
                next_tick_ms: 300,
                unthrottled_allowed: true,
            },
            v1::ExchangeResponse {
                grants: vec![grant("b1")],
                next_exchange_ms: 800,
                next_tick_ms: 0,
                unthrottled_allowed: false,
            },
        ]);
        assert_eq!(joined.grants.len(), 3);
        assert_eq!(
            (joined.next_exchange_ms, joined.next_tick_ms, joined.unthrottled_allowed),
            (800, 0, false)
        );
    }
}
