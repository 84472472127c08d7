"""Groups sharded over controllers (``tollgate server --shards``): each group's part of an
exchange goes straight to the controller that grants for it, as the Rust client does.

An exchange carries the epoch of the shard map the client holds; a controller that applied a
newer one answers with it, and every grant a sharded controller gives names its group's shard.
An exchange whose groups all have a known owner is split here and each part sent to its owner;
one naming a group not known yet goes whole to the controller the client was given, which
splits it. Owners take a repeated number as a client's restart, so an exchange numbered ``n``
goes out as ``2n`` and a part resent (through that controller, after its owner did not answer)
as ``2n + 1``; the map is then dropped, and the next exchanges go whole (8, doubling to 1,024,
until a part reaches its owner again).
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from .v1 import tollgate_pb2 as pb

#: The most groups whose shard a client keeps; past it the table starts again.
ROUTED_GROUPS_MAX = 100_000
#: The most shards and controllers a map may name (a map past them is ignored).
SHARDS_MAX = 4096
MEMBERS_MAX = 256
PAUSE_MIN = 8
PAUSE_MAX = 1024


class Routes:
    """The shard map a client holds and the shard of each of its groups."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.epoch = 0
        self._members: List[str] = []
        self._owners: List[int] = []
        self._shards: Dict[str, int] = {}
        self._paused = 0
        self._next_pause = 0

    def prepare(self, request: pb.ExchangeRequest) -> None:
        """Numbers ``request`` for routing and names the epoch of the map held."""
        request.sequence *= 2
        request.shard_map_epoch = self.epoch

    def learn(self, answer: pb.ExchangeResponse) -> None:
        """Takes a newer map (a malformed one is ignored) and each granted group's shard."""
        with self._lock:
            if answer.HasField("shard_map") and answer.shard_map.epoch > self.epoch:
                m = answer.shard_map
                if (
                    1 <= m.shards <= SHARDS_MAX
                    and len(m.owners) == m.shards
                    and len(m.members) <= MEMBERS_MAX
                    and all(o <= len(m.members) for o in m.owners)
                ):
                    self.epoch, self._members, self._owners = m.epoch, list(m.members), list(m.owners)
            for g in answer.grants:
                if g.HasField("shard"):
                    if len(self._shards) >= ROUTED_GROUPS_MAX and g.group not in self._shards:
                        self._shards.clear()
                    self._shards[g.group] = g.shard

    def forget_map(self) -> None:
        """Drops the map (the next answer brings the current one) and pauses the routing."""
        with self._lock:
            self.epoch, self._members, self._owners = 0, [], []
            self._paused = max(self._next_pause, PAUSE_MIN)
            self._next_pause = min(self._paused * 2, PAUSE_MAX)

    def reached(self) -> None:
        """Every part reached its owner: the next failure pauses the routing the least."""
        with self._lock:
            self._next_pause = 0

    def split(self, request: pb.ExchangeRequest) -> Optional[List[Tuple[str, pb.ExchangeRequest]]]:
        """``request``'s parts by owner's address; ``None`` when some group's owner is not
        known (or the routing is paused): the request then goes whole."""
        with self._lock:
            if self._paused > 0:
                self._paused -= 1
                return None
            if not self._owners or not request.groups:
                return None
            parts: Dict[str, pb.ExchangeRequest] = {}
            for g in request.groups:
                shard = self._shards.get(g.group)
                if shard is None or shard >= len(self._owners) or self._owners[shard] == 0:
                    return None
                owner = self._members[self._owners[shard] - 1]
                part = parts.get(owner)
                if part is None:
                    part = parts[owner] = part_of(request)
                part.groups.append(g)
            return list(parts.items())


def part_of(request: pb.ExchangeRequest) -> pb.ExchangeRequest:
    """``request`` with no groups: its client's id, number, period and map epoch."""
    return pb.ExchangeRequest(
        client_id=request.client_id,
        sequence=request.sequence,
        target_request_period_ms=request.target_request_period_ms,
        shard_map_epoch=request.shard_map_epoch,
    )


def retry_of(request: pb.ExchangeRequest, groups: Sequence[pb.GroupUsage]) -> pb.ExchangeRequest:
    """The parts whose owners did not answer, to send again through the controller given."""
    retry = part_of(request)
    retry.sequence = request.sequence + 1
    retry.shard_map_epoch = 0
    retry.groups.extend(groups)
    return retry


class Outcome:
    """What the parts of one routed exchange came to."""

    def __init__(self, routes: Routes, request: pb.ExchangeRequest) -> None:
        self.routes, self.request = routes, request
        self.answers: List[pb.ExchangeResponse] = []
        self.again: List[pb.GroupUsage] = []
        self.error: Optional[BaseException] = None

    def answered(self, answer: pb.ExchangeResponse) -> None:
        self.answers.append(answer)

    def failed(self, part: pb.ExchangeRequest, error: Optional[BaseException]) -> None:
        """``part``'s owner did not answer (or could not be dialled: ``error`` is ``None``)."""
        self.again.extend(part.groups)
        self.error = error or self.error

    def retry(self) -> Optional[pb.ExchangeRequest]:
        """The parts to send again through the controller given, if any (the map is dropped)."""
        if not self.again:
            self.routes.reached()
            return None
        self.routes.forget_map()
        return retry_of(self.request, self.again)

    def finish(self) -> pb.ExchangeResponse:
        """The joined answer, the routes having learnt from each; raises the last error when
        no part was answered."""
        for a in self.answers:
            self.routes.learn(a)
        if not self.answers:
            assert self.error is not None
            raise self.error
        return join(self.answers)


def join(answers: Sequence[pb.ExchangeResponse]) -> pb.ExchangeResponse:
    """One answer from the owners' answers: every grant, the earliest next exchange and tick,
    unthrottled work only if every owner allows it, the newest map."""
    joined = pb.ExchangeResponse()
    joined.CopyFrom(answers[0])
    for a in answers[1:]:
        joined.grants.extend(a.grants)
        joined.next_exchange_ms = min(joined.next_exchange_ms, a.next_exchange_ms)
        joined.next_tick_ms = min(joined.next_tick_ms, a.next_tick_ms)
        joined.unthrottled_allowed = joined.unthrottled_allowed and a.unthrottled_allowed
        if a.HasField("shard_map") and a.shard_map.epoch > joined.shard_map.epoch:
            joined.shard_map.CopyFrom(a.shard_map)
    return joined
