"""An embedded limiter: Tollgate's groups in this process alone, with no server.

Each group admits by its own settings, as a process that is a group's only client does
through a controller with no node capacity to share: its bucket refills at its ``limit`` up to
its ``burst`` (one second of the limit by default), its quotas per window are counts never
overrun, its in-flight quota is all this process's, and request classes, shadow mode, dropped
work and debts behave as they do against a server. The calls are :class:`~tollgate.Limiter`'s
(``try_acquire``, ``acquire``, permits, ``limit``, ``stats``), answered in the process: a group
is served at once, and the quotas count from when the limiter was made (in memory)::

    from tollgate.embedded import EmbeddedLimiter

    with EmbeddedLimiter({"api": {"limit": 100, "quotas": {"day": 50_000}}}) as limiter:
        with limiter.acquire("api", 2):
            ...

A group's settings are ``limit``, ``burst``, ``critical_reserve``, ``shadow``, ``dropped``,
``debt_repay_s``, ``max_in_flight`` and ``quotas`` (windows ``minute``, ``hour``, ``day``,
``week``, ``month``, ``total`` and ``Ns``, N seconds one after another from the Unix epoch).
What shares a node's capacity among groups (``reserved``, ``priority``, ``weight``,
``parent``) and ramps, budgets, ``Ns-from-first`` windows and the backend's settings are the
Rust client's embedded mode's and the server's, and are refused naming the setting. A name
outside the settings takes the ``default`` group's settings, or is not throttled.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Mapping, Optional, Tuple

from ._core import Core
from ._local import Settings, Window, groups_of, number
from .cost import CostModel, check_cost
from .errors import InvalidArgument
from .limiter import Limiter
from .v1 import tollgate_pb2 as pb

__all__ = ["EmbeddedLimiter"]

_REFUSED = {
    "reserved": "with no node capacity to share, a reservation changes nothing here; use a server, or the Rust client's embedded mode",
    "priority": "with no node capacity to share, a priority changes nothing here; use a server, or the Rust client's embedded mode",
    "weight": "with no node capacity to share, a weight changes nothing here; use a server, or the Rust client's embedded mode",
    "parent": "a parent's limit shared among its children needs the engine; use a server, or the Rust client's embedded mode",
    "ramp": "ramps need the engine; use a server, or the Rust client's embedded mode",
    "budget": "give the window's quota in quotas instead",
    "budget_period": "give the window's quota in quotas instead",
    "reads_writes_apart": "read and write costs kept apart need the engine; use a server",
    "backend_limit": "a backend's soft limit is the backend's (tollgate.Reporter), not a limiter's",
    "background": "background work is scheduled by a backend, not admitted by a limiter",
}
_SETTINGS = ("limit", "burst", "critical_reserve", "shadow", "dropped", "debt_repay_s", "max_in_flight", "quotas")


class _Quotas:
    """A group's quotas per window, counted in memory, handed to the limiter as allotments
    as a controller hands them to its one client: the limiter admits from what it holds, and
    what it holds plus what was used in a window never passes a quota."""

    def __init__(self, quotas: List[Tuple[Window, float]]) -> None:
        self.quotas = quotas
        self.starts = [-1] * len(quotas)
        self.booked = [0.0] * len(quotas)  # used in each window, by allotments now closed
        self.window = -1  # the window the outstanding allotment came for
        self.given = self.used = 0.0

    def allot(self, held: Optional[pb.QuotaHeld], demand: float, now_ms: int) -> pb.QuotaAllotment:
        for i, (w, _) in enumerate(self.quotas):
            start = w.start(now_ms)
            if start != self.starts[i]:
                self.starts[i], self.booked[i] = start, 0.0
        if held is not None and held.window == self.window:
            self.given, self.used = min(self.given, held.given), held.used
        window = max(self.starts)
        if window != self.window:
            # The allotment closes: what it admitted counts in each window it fell within.
            for i in range(len(self.quotas)):
                if self.starts[i] <= self.window:
                    self.booked[i] += self.used
            self.window, self.given, self.used = window, 0.0, 0.0
        lefts = [units - self.booked[i] - self.given for i, (_, units) in enumerate(self.quotas)]
        left = max(min(lefts), 0.0)
        # About two exchanges (of a second) of demand held, at least a unit, as a controller
        # allots; ``demand`` counts the units waiting as asked within the second.
        add = min(max(max(2.0 * demand, 1.0) - (self.given - self.used), 0.0), left)
        self.given += add
        allotment = pb.QuotaAllotment(window=window, add=add, left=left - add)
        ends = [e for e in (w.end(now_ms) for w, _ in self.quotas) if e is not None]
        if ends:
            allotment.ends_in_ms = max(min(ends) - now_ms, 1)
        if left - add <= 0 and self.given - self.used <= 0:
            # Spent: the retry hint is when the tightest spent window starts afresh.
            spent = [w.end(now_ms) for (w, _), room in zip(self.quotas, lefts) if room <= 0]
            if spent and all(e is not None for e in spent):
                allotment.reset_in_ms = max(max(e for e in spent if e is not None) - now_ms, 1)
        return allotment


class _Group(Settings):
    """One group's settings, checked, as the grant they make."""

    def __init__(self, name: str, settings: Mapping[str, Any]) -> None:
        super().__init__(name, settings, "the embedded limiter", _SETTINGS, _REFUSED)
        f = self.field
        burst = settings.get("burst")
        self.burst = self.limit if burst is None else number(f + "burst", burst, 0.0, 1e15)
        self.repay_s = number(f + "debt_repay_s", settings.get("debt_repay_s", 5.0), 0.0, 3600.0)
        slots = settings.get("max_in_flight")
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 1_000_000):
            raise InvalidArgument.of(f + "max_in_flight", f"must be a whole number from 1 to 1000000, got {slots!r}")
        self.max_in_flight: Optional[int] = slots
        quotas = settings.get("quotas", {})
        if not isinstance(quotas, Mapping):
            raise InvalidArgument.of(f + "quotas", f"must map windows to units, got {quotas!r}")
        windows = [(Window(f"{f}quotas.{w}", w), check_cost(f"{f}quotas.{w}", units)) for w, units in quotas.items()]
        self.quotas = _Quotas(windows) if windows else None

    def grant(self, name: str, usage: pb.GroupUsage, now_ms: int) -> pb.Grant:
        unlimited = self.limit is None
        grant = pb.Grant(
            group=name,
            unlimited=unlimited,
            rate=0.0 if unlimited else self.limit,
            burst=0.0 if unlimited else self.burst,
            lease_ms=60_000,
            clients=1,
            count_dropped=self.count_dropped,
            debt_repay_ms=int(self.repay_s * 1000),
            shadow=self.shadow,
            critical_reserve=self.critical_reserve,
            in_flight_limited=self.max_in_flight is not None,
            in_flight=self.max_in_flight or 0,
        )
        if self.quotas is not None:
            held = usage.quota if usage.HasField("quota") else None
            demand = max(usage.demand, 0.0) + max(usage.waiting, 0.0)
            grant.quota.CopyFrom(self.quotas.allot(held, demand, now_ms))
        return grant


class _Core(Core):
    """The limiter's core, with a group used for the first time (or again after going idle)
    granted before it admits: ``on_new`` runs a round at once, here."""

    on_new: Callable[[], None]

    def group(self, name: str) -> Any:
        g = super().group(name)
        if not g.granted:
            self.on_new()
        return g


class EmbeddedLimiter(Limiter):
    """Admission by cost, per group, by settings given here, with no server (see the module's
    documentation). ``groups`` maps each group's name to its settings, as a server's JSON and
    TOML carry them; ``max_wait`` and ``cost_model`` are :class:`~tollgate.Limiter`'s."""

    def __init__(
        self,
        groups: Mapping[str, Mapping[str, Any]],
        *,
        max_wait: float = 1.0,
        cost_model: Optional[CostModel] = None,
    ) -> None:
        self._settings = groups_of(groups, _Group)
        self._free = _Group("", {})
        self._round_lock = threading.Lock()
        self._metadata, self._ca_file, self._timeout = (), None, 1.0
        core = _Core(client_id="embedded", safe_mode="decay", max_wait=max_wait, exchange_period=None, cost_model=cost_model)
        core.on_new = self._round
        self._start(core, [])

    def _exchange(self, request: Any) -> Any:
        """The answer a controller with this process as every group's one client would give."""
        now_ms = int(time.time() * 1000)
        answer = pb.ExchangeResponse(next_exchange_ms=1000, next_tick_ms=1000)
        for usage in request.groups:
            group = self._settings.get(usage.group) or self._settings.get("default") or self._free
            answer.grants.append(group.grant(usage.group, usage, now_ms))
        return answer

    def _round(self) -> None:
        with self._round_lock:
            super()._round()
