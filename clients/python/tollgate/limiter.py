"""A limiter fed by a tollgate server's grants: the Rust client's remote mode, in Python.

Each group has a local token bucket; a background thread exchanges with the server, reporting
each group's demand (admitted or not), consumption and counts, and receives each group's grant
(rate, burst, lease), which the bucket then follows. Decisions never wait on the network:
``try_acquire`` looks at the bucket only. A new group admits nothing until its first grant,
which is asked for at once (``acquire`` goes on the moment it comes). When no exchange succeeds
for longer than the lease, or none ever has, the safe-mode policy applies: ``decay`` (the last grant halves every 5 s toward the group's reservation
shared by its clients), ``fail_open`` (admit everything) or ``fail_closed`` (admit nothing).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, cast

import grpc

from . import _connect
from .errors import Throttled, from_rpc
from .v1 import tollgate_pb2 as pb
from .v1 import tollgate_pb2_grpc as rpc

F = TypeVar("F", bound=Callable[..., Any])

SAFE_MODES = ("decay", "fail_open", "fail_closed")
_DECAY_HALF_LIFE = 5.0
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 2.0
_EARLY_SPACING = 0.05
_MIN_INTERVAL = 0.1
#: The most groups one exchange carries (the server's bound); more go in a round of pages.
EXCHANGE_GROUPS_MAX = 1000
_NEXT = itertools.count(1)


@dataclass
class RemoteStatus:
    """The link to the server, as the application can read it."""

    connected: bool
    safe_mode: bool
    exchanges: int
    last_error: Optional[str]


@dataclass
class GroupStats:
    """A group's counters since the limiter started."""

    admitted: int
    throttled: int
    admitted_units: float
    consumed_units: float
    rate: float
    burst: float
    available: float


class _Group:
    """A group's bucket, its grant and what it reports next."""

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.granted = False
        self.unlimited = False
        self.rate = 0.0
        self.burst = 0.0
        self.tokens = 0.0
        self.stamp = now
        self.reserved = 0.0
        self.clients = 1
        self.last_rate = 0.0
        # Since the last exchange.
        self.asked = 0.0
        self.consumed = 0.0
        self.admitted = 0
        self.throttled = 0
        self.since = now
        # Since the start.
        self.total_admitted = 0
        self.total_throttled = 0
        self.total_admitted_units = 0.0
        self.total_consumed = 0.0
        self.waiting = 0.0

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, cost: float, now: float, open_: bool, closed: bool) -> Optional[float]:
        """Takes ``cost``: ``None`` when admitted, else the seconds until it could be."""
        self.asked += cost
        if open_ or (self.granted and self.unlimited and not closed):
            self._admit(cost)
            return None
        if closed or not self.granted:
            self.throttled += 1
            self.total_throttled += 1
            return 0.05 if not self.granted else 1.0
        self.refill(now)
        if cost <= self.tokens:
            self.tokens -= cost
            self._admit(cost)
            return None
        self.throttled += 1
        self.total_throttled += 1
        if self.rate <= 0 or cost > self.burst:
            return 1.0
        return (cost - self.tokens) / self.rate

    def _admit(self, cost: float) -> None:
        self.admitted += 1
        self.total_admitted += 1
        self.consumed += cost
        self.total_admitted_units += cost
        self.total_consumed += cost


class Permit:
    """An admitted request. Settle it with what it really cost (the difference goes back to,
    or is taken from, the group), or say it was dropped. As a context manager it does nothing
    more on exit: the units stay consumed."""

    def __init__(self, limiter: "Limiter", group: _Group, cost: float) -> None:
        self._limiter = limiter
        self._group = group
        self.cost = cost
        self.group = group.name
        self._settled = False

    def settle(self, actual: float) -> None:
        """The request cost ``actual`` units rather than the cost asked."""
        if not (actual >= 0 and math.isfinite(actual)):
            raise ValueError(f"actual: must be a finite number from 0, got {actual!r}")
        if self._settled:
            raise RuntimeError("this permit is settled already")
        self._settled = True
        g = self._group
        with g.lock:
            delta = actual - self.cost
            g.tokens = min(g.burst, g.tokens - delta) if g.granted and not g.unlimited else g.tokens
            g.consumed += delta
            g.total_consumed += delta

    def dropped(self) -> None:
        """The work was never done: its units go back to the group."""
        self.settle(0.0)

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *_: object) -> None:
        return None


class Limiter:
    """Admission by cost, per group, fed by the tollgate server at ``url``.

    >>> limiter = Limiter("http://127.0.0.1:7460")      # doctest: +SKIP
    >>> with limiter.acquire("checkout", cost=2):      # doctest: +SKIP
    ...     serve_the_request()
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:7460",
        *,
        client_id: Optional[str] = None,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        safe_mode: str = "decay",
        max_wait: float = 1.0,
        exchange_timeout: float = 2.0,
        exchange_period: Optional[float] = None,
    ) -> None:
        if safe_mode not in SAFE_MODES:
            raise ValueError(f"safe_mode: must be one of {', '.join(SAFE_MODES)}, got {safe_mode!r}")
        if not (max_wait >= 0 and math.isfinite(max_wait)):
            raise ValueError(f"max_wait: must be a finite number of seconds from 0, got {max_wait!r}")
        self.client_id = client_id or f"tollgate-py-{os.getpid()}-{next(_NEXT)}"
        if not 1 <= len(self.client_id.encode()) <= 128:
            raise ValueError("client_id: 1 to 128 bytes")
        self._metadata = _connect.metadata(token)
        self._channel = _connect.channel(url, ca_file)
        self._stub = rpc.AdmissionStub(self._channel)  # type: ignore[no-untyped-call]
        self._policy = safe_mode
        self._max_wait = max_wait
        self._timeout = exchange_timeout
        self._period_ms = 0 if exchange_period is None else int(exchange_period * 1000)
        self._groups: Dict[str, _Group] = {}
        self._groups_lock = threading.Lock()
        self._wake = threading.Event()
        # Notified after each answer: what a request waiting for a new group's grant waits on.
        self._granted = threading.Condition()
        self._stop = threading.Event()
        self._sequence = 0
        self._connected = False
        self._safe_mode = False
        self._exchanges = 0
        self._last_error: Optional[str] = None
        self._lease_until = time.monotonic()
        self._next_tick = 0.0
        self._early_after = 0.0
        self._thread = threading.Thread(target=self._run, name="tollgate-exchange", daemon=True)
        self._thread.start()

    # -- admission -------------------------------------------------------------------------

    def _group(self, name: str) -> _Group:
        g = self._groups.get(name)
        if g is not None:
            return g
        if not 1 <= len(name.encode()) <= 255 or any(ord(c) < 32 for c in name):
            raise ValueError(f"group: 1 to 255 bytes of printable text, got {name!r}")
        with self._groups_lock:
            g = self._groups.setdefault(name, _Group(name, time.monotonic()))
        self._urgent()
        return g

    def _urgent(self) -> None:
        self._early_after = 0.0
        self._wake.set()

    def try_acquire(self, group: str, cost: float = 1.0) -> Permit:
        """Admits ``cost`` units for ``group`` now, or raises :class:`Throttled`."""
        if not (cost >= 0 and math.isfinite(cost)):
            raise ValueError(f"cost: must be a finite number from 0, got {cost!r}")
        g = self._group(group)
        now = time.monotonic()
        open_, closed = self._safe_mode and self._policy == "fail_open", self._safe_mode and self._policy == "fail_closed"
        with g.lock:
            wait = g.take(cost, now, open_, closed)
        if wait is None:
            return Permit(self, g, cost)
        # Refused: exchange early, after the server's next tick.
        self._early_after = max(self._early_after, self._next_tick)
        self._wake.set()
        raise Throttled(group, wait)

    def acquire(self, group: str, cost: float = 1.0, timeout: Optional[float] = None) -> Permit:
        """Admits ``cost`` units for ``group``, waiting up to ``timeout`` (default: the
        limiter's ``max_wait``) for them; raises :class:`Throttled` past it."""
        limit = self._max_wait if timeout is None else timeout
        deadline = time.monotonic() + limit
        g = self._group(group)
        while True:
            try:
                return self.try_acquire(group, cost)
            except Throttled as t:
                left = deadline - time.monotonic()
                if left <= 0 or t.retry_after > left:
                    raise
                with g.lock:
                    g.waiting += cost
                    first = not g.granted
                try:
                    pause = min(max(t.retry_after, 0.001), left)
                    if first:
                        # A new group: on as soon as its first grant comes.
                        with self._granted:
                            if not g.granted:
                                self._granted.wait(timeout=pause)
                    else:
                        time.sleep(pause)
                finally:
                    with g.lock:
                        g.waiting -= cost

    def limit(self, group: str, cost: float = 1.0) -> Callable[[F], F]:
        """A decorator: each call of the function first acquires ``cost`` units of ``group``."""

        def wrap(f: F) -> F:
            @functools.wraps(f)
            def limited(*args: Any, **kwargs: Any) -> Any:
                with self.acquire(group, cost):
                    return f(*args, **kwargs)

            return cast(F, limited)

        return wrap

    def status(self) -> RemoteStatus:
        """Whether the last exchange succeeded, safe mode, exchanges so far, the last error."""
        return RemoteStatus(self._connected, self._safe_mode, self._exchanges, self._last_error)

    def stats(self, group: str) -> Optional[GroupStats]:
        """A group's counters and grant, if the limiter has met it."""
        g = self._groups.get(group)
        if g is None:
            return None
        with g.lock:
            g.refill(time.monotonic())
            return GroupStats(
                g.total_admitted,
                g.total_throttled,
                g.total_admitted_units,
                g.total_consumed,
                math.inf if g.unlimited else g.rate,
                math.inf if g.unlimited else g.burst,
                math.inf if g.unlimited else (g.tokens if g.granted else 0.0),
            )

    def close(self) -> None:
        """Stops the exchange thread and closes the channel."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._channel.close()

    def __enter__(self) -> "Limiter":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the exchange loop -----------------------------------------------------------------

    def _requests(self, now: float) -> List[pb.ExchangeRequest]:
        """This round's exchanges: every group, at most ``EXCHANGE_GROUPS_MAX`` an exchange,
        the busiest first (new groups, then those with refusals or work waiting, then by
        demand), each numbered in turn."""
        usages = []
        for g in list(self._groups.values()):
            with g.lock:
                # Over 100 ms at least, as the Rust client measures: a report right after a
                # group appears does not turn its first request into a huge rate.
                elapsed = max(now - g.since, _MIN_INTERVAL)
                usages.append(
                    pb.GroupUsage(
                        group=g.name,
                        demand=g.asked / elapsed,
                        consumed=max(g.consumed, 0.0),
                        admitted=g.admitted,
                        throttled=g.throttled,
                        waiting=max(g.waiting, 0.0),
                        held=g.rate if g.granted and not g.unlimited and not self._safe_mode else 0.0,
                    )
                )
        if len(usages) > EXCHANGE_GROUPS_MAX:

            def busiest(u: pb.GroupUsage) -> Tuple[int, float]:
                g = self._groups.get(u.group)
                new = g is not None and not g.granted
                rank = 0 if new or u.throttled > 0 or u.waiting > 0 else 1 if u.admitted > 0 else 2
                return (rank, -u.demand)

            usages.sort(key=busiest)
        pages = [usages[i : i + EXCHANGE_GROUPS_MAX] for i in range(0, len(usages), EXCHANGE_GROUPS_MAX)]
        requests = []
        for page in pages or [[]]:
            self._sequence += 1
            requests.append(
                pb.ExchangeRequest(
                    client_id=self.client_id,
                    sequence=self._sequence,
                    groups=page,
                    target_request_period_ms=self._period_ms,
                )
            )
        return requests

    def _reported(self, now: float, request: pb.ExchangeRequest) -> None:
        """A request's counts were delivered: its groups start counting afresh."""
        for u in request.groups:
            g = self._groups.get(u.group)
            if g is None:
                continue
            with g.lock:
                g.asked = g.consumed = 0.0
                g.admitted = g.throttled = 0
                g.since = now

    def _answer(self, answer: pb.ExchangeResponse, now: float) -> float:
        lease = None
        for grant in answer.grants:
            g = self._groups.get(grant.group)
            if g is None:
                continue
            with g.lock:
                g.refill(now)
                g.unlimited = grant.unlimited
                g.rate = grant.rate
                burst = grant.burst
                if not g.granted:
                    g.tokens = burst
                g.burst = burst
                g.tokens = min(g.tokens, burst)
                g.last_rate = grant.rate
                g.reserved = grant.reserved
                g.clients = max(grant.clients, 1)
                g.granted = True
            lease = grant.lease_ms if lease is None else min(lease, grant.lease_ms)
        if lease is not None:
            self._lease_until = now + lease / 1000.0
        self._next_tick = now + answer.next_tick_ms / 1000.0
        return max(answer.next_exchange_ms, 10) / 1000.0

    def _safe(self, now: float) -> None:
        """Past the lease: the policy applies to every group."""
        if not self._safe_mode:
            self._safe_mode = True
        if self._policy != "decay":
            return
        elapsed = now - self._lease_until
        for g in list(self._groups.values()):
            with g.lock:
                if not g.granted or g.unlimited:
                    continue
                floor = g.reserved / g.clients
                g.refill(now)
                g.rate = floor + (g.last_rate - floor) * 0.5 ** (elapsed / _DECAY_HALF_LIFE)

    def _run(self) -> None:
        due = 0.0
        backoff = _BACKOFF_MIN
        while not self._stop.is_set():
            now = time.monotonic()
            if not self._connected and self._exchanges > 0 and now > self._lease_until:
                self._safe(now)
            early = self._wake.is_set()
            if now < due and not (early and now >= self._early_after):
                if early:
                    # Asked for early, but not before the server's next tick.
                    time.sleep(max(min(self._early_after, due, now + 0.1) - now, 0.0))
                else:
                    self._wake.wait(timeout=min(due - now, 0.1))
                continue
            self._wake.clear()
            period = None
            failure = None
            for request in self._requests(now):
                try:
                    answer = self._stub.Exchange(request, timeout=self._timeout, metadata=self._metadata)
                except grpc.RpcError as e:
                    # The round ends: what this page and the pages after it reported is
                    # reported again in the next.
                    failure = e
                    break
                now = time.monotonic()
                self._reported(now, request)
                period = self._answer(answer, now)
                with self._granted:
                    self._granted.notify_all()
            if failure is not None:
                now = time.monotonic()
                if period is None:
                    self._connected = False
                    self._last_error = str(from_rpc(failure))
                    if self._exchanges == 0:
                        # Never reached: there is no grant to ride on, so the policy applies
                        # from the first failure (fail_open admits from a cold start), as in
                        # Rust.
                        self._safe(now)
                # Tried again soon: the pages not answered report again.
                due = now + backoff
                backoff = min(backoff * 2, _BACKOFF_MAX)
                if period is None:
                    continue
            self._connected = True
            self._safe_mode = False
            self._exchanges += 1
            self._last_error = None
            if failure is None:
                backoff = _BACKOFF_MIN
                due = now + (period if period is not None else 0.0)
            self._early_after = now + _EARLY_SPACING
