"""What the synchronous and the asyncio limiters share: each group's bucket and totals, the
exchange's requests and how its answers and failures apply. Only the exchange loop (a thread,
or a task) and waiting differ between the two."""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Generator, List, Optional, Tuple, TypeVar

from .cost import Consumption, CostModel, Usage, check_cost
from .errors import InvalidArgument, Throttled
from ._demand import Counts, DemandMeter
from .v1 import tollgate_pb2 as pb

SAFE_MODES = ("decay", "fail_open", "fail_closed")
EXCHANGE_GROUPS_MAX = 1000
"""The most groups one exchange carries (the server's bound); more go in a round of pages."""
DECAY_HALF_LIFE_S = 5.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
EARLY_SPACING_S = 0.05
GROUP_IDLE_EXPIRY_S = 240.0
"""A group nothing was asked of for this long is no longer reported (as in Rust)."""
REPAY_SHARE_MAX = 0.5
"""At most this share of a grant goes to paying a debt back."""
MAX_IN_FLIGHT = 1_000_000
"""The largest in-flight quota: what a report's asks are capped at."""
IN_FLIGHT_RETRY_S = 0.005
# The smallest allotment of a group's quotas worth asking for (the server's own floor), and
# how long a refusal for want of one waits when more was asked for at once.
ALLOTMENT_MIN = 1.0
ALLOTMENT_RETRY_S = 0.02
"""How soon a request refused an in-flight slot tries again while waiting."""
_NEXT = itertools.count(1)
_NUMBERS = (int, float)
_monotonic = time.monotonic


@dataclass
class RemoteStatus:
    """The link to the server, as the application can read it."""

    connected: bool
    """The last exchange succeeded."""
    safe_mode: bool
    """The safe-mode policy applies (no exchange succeeded within the lease)."""
    exchanges: int
    """Exchanges answered so far."""
    last_error: Optional[str]
    """Why the last exchange failed, while it did."""
    unthrottled_allowed: bool
    """The server lets this client's unthrottled work skip the buckets."""


@dataclass
class GroupStats:
    """A group's counters since the limiter started, and its grant now."""

    admitted: int
    throttled: int
    admitted_units: float
    consumed_units: float
    rate: float
    burst: float
    available: float
    waited: int = 0
    """Requests admitted after waiting."""
    unthrottled_units: float = 0.0
    """Units admitted unthrottled (in ``admitted_units`` too)."""
    dropped: int = 0
    """Permits dropped (work never done)."""
    dropped_units: float = 0.0
    debt: float = 0.0
    """Units of debt still being paid back from the refill."""
    would_refuse: int = 0
    """Requests admitted in shadow mode that would have been refused (in ``admitted`` too,
    never in ``throttled``)."""
    in_flight: Optional[int] = None
    """In a group with an in-flight quota (``max_in_flight``): the permits holding a slot
    now; ``None`` without one."""
    in_flight_share: Optional[int] = None
    """This client's share of the in-flight quota, from the server."""


CLASSES = ("critical", "normal", "sheddable")
"""Request classes within a group, most important first."""


def class_floor(request_class: str, critical_reserve: float) -> float:
    """The share of a bucket's burst a request of ``request_class`` must leave in it: none for
    critical work, the group's ``critical_reserve`` for normal work, halfway from that to a
    full bucket for sheddable work (as the Rust client does)."""
    reserve = min(max(critical_reserve, 0.0), 0.9)
    if request_class == "critical":
        return 0.0
    if request_class == "sheddable":
        return reserve + (1.0 - reserve) / 2.0
    return reserve


def check_class(request_class: str) -> str:
    if request_class not in CLASSES:
        raise InvalidArgument.of("request_class", f"must be critical, normal or sheddable, got {request_class!r}")
    return request_class


class _Group:
    """A group's bucket, its grant and its running totals."""

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.granted = False
        # Whether a grant with a rate came yet, the largest cost asked before it, and what
        # the bucket starts holding then: full when the process is the group's only one,
        # else one such request (the group's burst is banked by the processes that have been
        # using it), as the Rust client does.
        self.started = False
        self.first_cost = 0.0
        self.start = math.inf
        self.unlimited = False
        self.rate = 0.0
        self.burst = 0.0
        self.tokens = 0.0
        self.stamp = now
        self.reserved = 0.0
        self.clients = 1
        self.last_rate = 0.0
        self.count_dropped = False
        self.shadow = False
        self.critical_reserve = 0.0
        # The in-flight quota's share (None: no quota), the slots held, the most held or
        # tried since the last exchange, and the tries refused a slot since.
        self.slots: Optional[int] = None
        self.held = 0
        self.asked = 0
        self.short = 0
        self.repay_s = 5.0
        self.owed = 0.0
        self.repay_rate = 0.0
        self.counts = Counts()
        # The cost of the largest request admitted since the last exchange took it.
        self.largest = 0.0
        self.dropped = 0
        self.dropped_units = 0.0
        self.waiting = 0.0
        # The allotment of the group's quotas per window (a count, never overrun): whether it
        # has quotas, the window it holds units of, units given and used in it, when it ends
        # (monotonic seconds; None: never), units the server had beyond every allotment, and
        # while nothing was left, when the window starts afresh.
        self.allotted = False
        self.allot_window = 0
        self.allot_given = 0.0
        self.allot_used = 0.0
        self.allot_ends: Optional[float] = None
        self.allot_left = 0.0
        self.allot_reset: Optional[float] = None

    def refill(self, now: float) -> None:
        if now > self.stamp:
            gain = (now - self.stamp) * self.rate
            if self.owed > 0:
                pay = min(self.owed, (now - self.stamp) * self.repay_rate)
                self.owed -= pay
                gain -= pay
            self.tokens = min(self.burst, self.tokens + gain)
            self.stamp = now

    def charge(self, units: float, now: float) -> None:
        """Takes ``units`` more than admitted: what the bank covers at once, the rest as a debt
        paid back over the group's repay period (at once, blocking, without one)."""
        if not self.granted or self.unlimited:
            return
        self.refill(now)
        if self.repay_s <= 0 or self.rate <= 0:
            self.tokens -= units
            return
        covered = min(units, max(self.tokens, 0.0))
        self.tokens -= covered
        self.owed += units - covered
        cap = self.repay_s * self.rate * REPAY_SHARE_MAX
        if self.owed > cap:
            self.tokens -= self.owed - cap
            self.owed = cap
        self.repay_rate = self.owed / self.repay_s

    def refund(self, units: float, now: float) -> None:
        if self.granted and not self.unlimited:
            self.refill(now)
            self.tokens = min(self.burst, self.tokens + units)

    def take(
        self, cost: float, now: float, open_: bool, closed: bool, waited: bool, count_refusal: bool, floor: float = 0.0
    ) -> Optional[float]:
        """Takes ``cost``: ``None`` when admitted, else the seconds until it could be. A refusal
        is counted (asked and throttled) only with ``count_refusal``: a request that waits is
        asked once, however many times it tries."""
        if open_ or (self.granted and self.unlimited and not closed):
            self._admit(cost, waited)
            return None
        wait = None
        if closed or not self.granted:
            wait = 0.05 if not self.granted else 1.0
        else:
            self.refill(now)
            keep = floor * self.burst
            if cost <= self.tokens - keep:
                self.tokens -= cost
                self._admit(cost, waited)
                return None
            wait = 1.0 if self.rate <= 0 or cost + keep > self.burst else (cost + keep - self.tokens) / self.rate
            if self.shadow:
                # Shadow mode: admitted without taking from the bucket, which goes on deciding
                # as if it had been refused; counted as a would-be refusal.
                self._admit(cost, False)
                self.counts.would_refuse += 1
                return None
        if not self.started:
            self.first_cost = max(self.first_cost, cost)
        if count_refusal:
            self.refused(cost)
        return wait

    def take_unthrottled(self, cost: float, now: float) -> None:
        """Unthrottled work: admitted whatever the bucket holds, and charged to it."""
        if self.granted and not self.unlimited:
            self.refill(now)
            self.tokens -= cost
        self._admit(cost, False)
        self.counts.unthrottled += cost

    def refused(self, cost: float) -> None:
        self.counts.asked += cost
        self.counts.throttled += 1

    def _admit(self, cost: float, waited: bool) -> None:
        if cost > self.largest:
            self.largest = cost
        c = self.counts
        c.asked += cost
        c.admitted += 1
        c.consumed += cost
        c.admitted_units += cost
        if waited:
            c.waited += 1

    def stats(self, now: float) -> GroupStats:
        self.refill(now)
        c = self.counts
        unlimited = self.unlimited
        return GroupStats(
            admitted=c.admitted,
            throttled=c.throttled,
            admitted_units=c.admitted_units,
            consumed_units=c.consumed,
            rate=math.inf if unlimited else self.rate,
            burst=math.inf if unlimited else self.burst,
            available=math.inf if unlimited else (self.tokens if self.granted else 0.0),
            waited=c.waited,
            unthrottled_units=c.unthrottled,
            dropped=self.dropped,
            dropped_units=self.dropped_units,
            debt=self.owed,
            would_refuse=c.would_refuse,
            in_flight=None if self.slots is None else self.held,
            in_flight_share=self.slots,
        )

    def take_allotment(self, cost: float, now: float) -> Optional[Tuple[float, bool]]:
        """Takes ``cost`` from the allotment of the group's quotas: ``None`` when taken (or the
        group has none), else the seconds to wait and whether more was asked for at once (the
        server had units left beyond the allotments, or the window ended)."""
        if not self.allotted:
            return None
        live = self.allot_ends is None or now < self.allot_ends
        if live and self.allot_used + cost <= self.allot_given + 1e-6:
            self.allot_used += cost
            return None
        ask = not live or self.allot_left > 0
        if ask:
            return ALLOTMENT_RETRY_S, True
        if self.allot_reset is not None:
            return max(self.allot_reset - now, 0.0), False
        return 1.0, False

    def allotment_report(self, keep: float) -> Optional[pb.QuotaHeld]:
        """What the group holds of its allotment, for a report: past ``keep`` units unspent,
        the rest is given back first."""
        if not self.allotted:
            return None
        keep = max(keep, ALLOTMENT_MIN)
        if self.allot_given - self.allot_used > keep:
            self.allot_given = self.allot_used + keep
        return pb.QuotaHeld(window=self.allot_window, given=self.allot_given, used=self.allot_used)

    def set_allotment(self, grant: pb.Grant, sent: float, now: float) -> None:
        """Takes the allotment a grant carries (none: the group has no quota per window); its
        time runs from when the request was ``sent``, so it ends before the server's window."""
        if not grant.HasField("quota"):
            self.allotted = False
            return
        q = grant.quota
        if not self.allotted or self.allot_window != q.window:
            self.allot_window, self.allot_given, self.allot_used = q.window, 0.0, 0.0
        if math.isfinite(q.add) and q.add > 0:
            self.allot_given += q.add
        self.allot_ends = sent + q.ends_in_ms / 1000.0 if q.ends_in_ms > 0 else None
        self.allot_left = max(q.left, 0.0) if math.isfinite(q.left) else 0.0
        self.allot_reset = now + q.reset_in_ms / 1000.0 if q.HasField("reset_in_ms") else None
        self.allotted = True

    def take_slot(self) -> Optional[bool]:
        """Takes an in-flight slot: ``None`` without a quota, else whether one was free."""
        if self.slots is None:
            return None
        self.asked = max(self.asked, self.held + 1)
        if self.held >= self.slots:
            self.short += 1
            return False
        self.held += 1
        return True

    def slot_report(self) -> Tuple[int, int]:
        """The slots held and the most asked since the last exchange (reset)."""
        asked = min(max(self.asked, self.held + self.short), MAX_IN_FLIGHT)
        self.asked, self.short = self.held, 0
        return self.held, asked


class Permit:
    """An admitted request. Settle it with what it really cost (:meth:`settle`, or
    :meth:`settle_usage` priced by the limiter's cost model): more than admitted becomes debt,
    less is given back. :meth:`dropped` says the work was never done. Left unsettled, the
    admitted cost stands. It is a context manager (``with`` and ``async with``) that does
    nothing more on exit."""

    __slots__ = ("_core", "_group", "cost", "group", "_settled", "_slot")

    def __init__(self, core: "Core", group: _Group, cost: float, slot: bool = False) -> None:
        self._core = core
        self._group = group
        self.cost = cost
        """The cost admitted."""
        self.group = group.name
        """The group it was admitted for."""
        self._settled = False
        self._slot = slot

    def release(self) -> None:
        """Gives back the group's in-flight slot it holds, if any: done by :meth:`settle`,
        :meth:`dropped`, leaving a ``with`` block and garbage collection; at most once."""
        if self._slot:
            self._slot = False
            with self._group.lock:
                self._group.held -= 1

    def __del__(self) -> None:
        if getattr(self, "_slot", False):
            self.release()

    def _close(self) -> None:
        if self._settled:
            raise RuntimeError("this permit is settled already")
        self._settled = True
        self.release()

    def settle(self, actual: float) -> None:
        """The request cost ``actual`` units rather than the cost admitted."""
        actual = check_cost("actual", actual)
        self._close()
        g, now = self._group, time.monotonic()
        with g.lock:
            delta = actual - self.cost
            if delta > 0:
                g.charge(delta, now)
            elif delta < 0:
                g.refund(-delta, now)
            g.counts.consumed += delta

    def settle_usage(self, usage: Usage, model: Optional[CostModel] = None) -> None:
        """Settles with what the request did, priced by ``model`` (the limiter's own by
        default); what it did is also reported to the server in detail."""
        detail = Consumption.of(model or self._core.cost_model, usage)
        with self._group.lock:
            self._group.counts.detail.add(detail)
        self.settle(detail.rru + detail.wru)

    def dropped(self) -> None:
        """The work was never done (Numaflow's dropped messages). By the group's ``dropped``
        setting, its cost goes back to the group (``return``, the default) or stays consumed
        (``count``); it is counted in the group's dropped statistics either way."""
        self._close()
        g, now = self._group, time.monotonic()
        with g.lock:
            g.dropped += 1
            g.dropped_units += self.cost
            if not g.count_dropped:
                g.refund(self.cost, now)
                g.counts.consumed -= self.cost

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    async def __aenter__(self) -> "Permit":
        return self

    async def __aexit__(self, *_: object) -> None:
        self.release()


def check_group(name: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 255 or any(ord(c) < 32 for c in name):
        raise InvalidArgument.of("group", f"must be 1 to 255 bytes of printable text, got {name!r}")


class Core:
    """The state both limiters share. ``notify`` wakes the exchange loop."""

    def __init__(
        self,
        *,
        client_id: Optional[str],
        safe_mode: str,
        max_wait: float,
        exchange_period: Optional[float],
        cost_model: Optional[CostModel],
    ) -> None:
        if safe_mode not in SAFE_MODES:
            raise InvalidArgument.of("safe_mode", f"must be one of {', '.join(SAFE_MODES)}, got {safe_mode!r}")
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not (max_wait >= 0 and math.isfinite(max_wait)):
            raise InvalidArgument.of("max_wait", f"must be a finite number of seconds from 0, got {max_wait!r}")
        if exchange_period is not None and not (0.01 <= exchange_period <= 60):
            raise InvalidArgument.of("exchange_period", f"must be 0.01 to 60 seconds, got {exchange_period!r}")
        self.client_id = client_id or f"tollgate-py-{os.getpid()}-{next(_NEXT)}"
        if not 1 <= len(self.client_id.encode()) <= 128:
            raise InvalidArgument.of("client_id", "must be 1 to 128 bytes")
        self.cost_model = cost_model or CostModel.count()
        self.policy = safe_mode
        self.max_wait = float(max_wait)
        self.period_ms = 0 if exchange_period is None else int(exchange_period * 1000)
        self.groups: Dict[str, _Group] = {}
        self.groups_lock = threading.Lock()
        self.meters: Dict[str, DemandMeter] = {}
        self.notify: Callable[[], None] = lambda: None
        self.woken = False
        self.sequence = 0
        self.connected = False
        self.safe_mode = False
        self.exchanges = 0
        self.last_error: Optional[str] = None
        self.unthrottled_allowed = False
        self.lease_until = time.monotonic()
        self.next_tick = 0.0
        self.early_after = 0.0
        # When the last round's requests were made: an allotment answered runs from then.
        self.sent_at = 0.0
        self.due = 0.0
        self.backoff = BACKOFF_MIN_S

    # -- admission -------------------------------------------------------------------------

    def group(self, name: str) -> _Group:
        g = self.groups.get(name)
        if g is not None:
            return g
        check_group(name)
        with self.groups_lock:
            g = self.groups.setdefault(name, _Group(name, time.monotonic()))
        self.urgent()
        return g

    def urgent(self) -> None:
        self.early_after = 0.0
        self.woken = True
        self.notify()

    def attempt(
        self, group: str, cost: float, unthrottled: bool, waited: bool = False, count: bool = True, request_class: str = "normal"
    ) -> Tuple[Optional[Permit], float]:
        """One try: the permit, or none and the seconds until the cost could fit."""
        g = self.group(group)
        now = time.monotonic()
        if unthrottled and self.unthrottled_allowed:
            with g.lock:
                g.take_unthrottled(cost, now)
            return Permit(self, g, cost), 0.0
        safe = self.safe_mode
        open_, closed = safe and self.policy == "fail_open", safe and self.policy == "fail_closed"
        ask = False
        with g.lock:
            slot = None if open_ else g.take_slot()
            short = None if open_ or slot is False else g.take_allotment(cost, now)
            if slot is False and not g.shadow:
                # Every slot of the share is held: refused like a rate refusal.
                if count:
                    g.refused(cost)
                wait = IN_FLIGHT_RETRY_S
            elif slot is False or (short is not None and g.shadow):
                g._admit(cost, False)
                g.counts.would_refuse += 1
                wait = None
            elif short is not None:
                # The allotment of the group's quotas is spent: a quota is a count.
                if count:
                    g.refused(cost)
                if slot:
                    g.held -= 1
                wait, ask = short
            else:
                wait = g.take(cost, now, open_, closed, waited, count, class_floor(request_class, g.critical_reserve))
                if wait is not None and slot:
                    g.held -= 1
                if wait is not None and g.allotted:
                    g.allot_used = max(g.allot_used - cost, 0.0)
        if wait is None:
            return Permit(self, g, cost, slot is True), 0.0
        if ask:
            # More of the quota was asked for: at once, not after the next tick.
            self.urgent()
            return None, wait
        if not g.granted:
            # A new group, before its first grant: that exchange is asked for at once (a
            # refusal must not put it off until the server's next tick).
            self.urgent()
            return None, wait
        # Refused: exchange early, after the server's next tick.
        self.early_after = max(self.early_after, self.next_tick)
        self.woken = True
        self.notify()
        return None, wait

    def fast(self, group: str, cost: float, unthrottled: bool) -> Optional[Permit]:
        """The common case, inline: a granted group, a plain cost, tokens at hand (or no
        limit). ``None`` for anything else, which takes the general path."""
        g = self.groups.get(group)
        if (
            g is not None
            and g.granted
            and g.critical_reserve <= 0
            and g.slots is None
            and not g.allotted
            and not unthrottled
            and not self.safe_mode
            and cost.__class__ in _NUMBERS
            and 0 <= cost < math.inf
        ):
            now = _monotonic()
            with g.lock:
                if not g.unlimited:
                    if now > g.stamp:
                        if g.owed > 0:
                            g.refill(now)
                        else:
                            tokens = g.tokens + (now - g.stamp) * g.rate
                            g.tokens = tokens if tokens < g.burst else g.burst
                            g.stamp = now
                    if cost > g.tokens:
                        g = None
                    else:
                        g.tokens -= cost
                if g is not None:
                    if cost > g.largest:
                        g.largest = cost
                    c = g.counts
                    c.asked += cost
                    c.admitted += 1
                    c.consumed += cost
                    c.admitted_units += cost
                    return Permit(self, g, cost)
        return None

    def try_acquire(self, group: str, cost: float, unthrottled: bool, request_class: str = "normal") -> Permit:
        if request_class == "normal":
            permit = self.fast(group, cost, unthrottled)
            if permit is not None:
                return permit
        cost = check_cost("cost", cost)
        permit, wait = self.attempt(group, cost, unthrottled, request_class=check_class(request_class))
        if permit is None:
            raise Throttled(group, wait)
        return permit

    def acquiring(
        self, group: str, cost: float, unthrottled: bool, timeout: Optional[float], request_class: str = "normal"
    ) -> Generator[Tuple[float, bool], None, Permit]:
        """One request admitted by waiting, as steps: each yields how long to pause and whether
        the group awaits its first grant (then a grant cuts the pause short); it returns the
        permit, or raises :class:`Throttled` once ``timeout`` (default ``max_wait``) would be
        passed. The request counts once in the demand, however many times it tries; while it
        waits its cost is reported as waiting, until the steps end or are closed."""
        cost = check_cost("cost", cost)
        check_class(request_class)
        permit, wait = self.attempt(group, cost, unthrottled, count=False, request_class=request_class)
        if permit is not None:
            return permit
        deadline = time.monotonic() + (self.max_wait if timeout is None else check_cost("timeout", timeout))
        g = self.group(group)
        with g.lock:
            g.waiting += cost
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or wait > left:
                    with g.lock:
                        g.refused(cost)
                    raise Throttled(group, wait)
                yield min(max(wait, 0.001), left), not g.granted
                permit, wait = self.attempt(group, cost, unthrottled, waited=True, count=False, request_class=request_class)
                if permit is not None:
                    return permit
        finally:
            with g.lock:
                g.waiting -= cost

    def stats(self, group: str) -> Optional[GroupStats]:
        g = self.groups.get(group)
        if g is None:
            return None
        with g.lock:
            return g.stats(time.monotonic())

    def status(self) -> RemoteStatus:
        return RemoteStatus(self.connected, self.safe_mode, self.exchanges, self.last_error, self.unthrottled_allowed)

    # -- the exchange ----------------------------------------------------------------------

    def next_wait(self, now: float) -> Tuple[float, bool]:
        """How long the loop waits before the next round (0: go now), and whether a wake-up
        may cut that wait short. Applies safe mode once the lease has run out."""
        if not self.connected and self.exchanges > 0 and now > self.lease_until:
            self.safe(now)
        if now >= self.due or (self.woken and now >= self.early_after):
            self.woken = False
            return 0.0, False
        if self.woken:
            # Asked for early, but not before the server's next tick.
            return max(min(self.early_after, self.due, now + 0.1) - now, 0.0), False
        return min(self.due - now, 0.1), True

    def requests(self, now: float) -> List[Tuple[pb.ExchangeRequest, Dict[str, Optional[DemandMeter]]]]:
        """This round's exchanges, each with the meters as they were before it (put back when
        it fails, so what it reported is reported again): every group nothing was asked of
        for less than the idle expiry, at most ``EXCHANGE_GROUPS_MAX`` an exchange, the
        busiest first (new groups, then refusals or work waiting, then by demand)."""
        rows = []
        self.sent_at = now
        for g in list(self.groups.values()):
            with g.lock:
                counts, waiting = g.counts.copy(), g.waiting
                largest, g.largest = g.largest, 0.0
                held = g.rate if g.granted and not g.unlimited else None
                new = not g.granted
                slots = g.slot_report() if g.slots is not None else (0, 0)
            before = self.meters.get(g.name)
            meter = before.copy() if before is not None else DemandMeter(now)
            # A group holding in-flight slots is not idle: its share stays leased.
            if meter.idle(now, counts, GROUP_IDLE_EXPIRY_S) and slots[0] == 0:
                # Its lease has long run out: a fresh grant before it admits again.
                with g.lock:
                    g.granted, g.tokens = False, 0.0
                continue
            r = meter.report(now, counts, waiting, held)
            self.meters[g.name] = meter
            # An allotment holds about two exchanges of demand (at a second each).
            with g.lock:
                quota = g.allotment_report(r.demand * 4.0)
            detail = None
            if not r.detail.is_zero():
                detail = pb.Consumption(**{n: getattr(r.detail, n) for n in Consumption.NAMES})
            usage = pb.GroupUsage(
                group=g.name,
                demand=r.demand,
                consumed=r.consumed,
                admitted=int(r.requests),
                throttled=int(r.throttled),
                waiting=r.waiting,
                unthrottled=r.unthrottled,
                held=r.held,
                waited=int(r.waited),
                would_refuse=int(r.would_refuse),
                largest=largest,
                in_flight=slots[0],
                in_flight_asked=slots[1],
                detail=detail,
                quota=quota,
            )
            rank = 0 if new or r.throttled > 0 or r.waiting > 0 else 1 if r.requests > 0 else 2
            rows.append((rank, usage, before))
        if len(rows) > EXCHANGE_GROUPS_MAX:
            rows.sort(key=lambda row: (row[0], -row[1].demand))
        pages = [rows[i : i + EXCHANGE_GROUPS_MAX] for i in range(0, len(rows), EXCHANGE_GROUPS_MAX)]
        out = []
        for page in pages or [[]]:
            self.sequence += 1
            request = pb.ExchangeRequest(
                client_id=self.client_id,
                sequence=self.sequence,
                groups=[u for _, u, _ in page],
                target_request_period_ms=self.period_ms,
                takes_allotments=True,
            )
            out.append((request, {u.group: before for _, u, before in page}))
        return out

    def restore(self, pages: List[Dict[str, Optional[DemandMeter]]]) -> None:
        """The pages were not answered: their groups report again from where they were."""
        for before in pages:
            for name, meter in before.items():
                if meter is None:
                    self.meters.pop(name, None)
                else:
                    self.meters[name] = meter

    def answer(self, answer: pb.ExchangeResponse, now: float) -> float:
        """Applies an answer; the seconds until the next exchange is due."""
        lease = None
        self.unthrottled_allowed = answer.unthrottled_allowed
        for grant in answer.grants:
            g = self.groups.get(grant.group)
            if g is None:
                continue
            with g.lock:
                g.refill(now)
                g.unlimited = grant.unlimited
                g.rate = grant.rate
                if not g.started:
                    if grant.clients > 1:
                        # Shared with other processes: it starts with what one request needs.
                        g.start = min(g.start, max(g.first_cost, 1.0))
                    if grant.rate > 0 and not grant.unlimited:
                        g.tokens = min(grant.burst, g.start)
                        g.started = True
                g.burst = grant.burst
                g.tokens = min(g.tokens, grant.burst)
                g.last_rate = grant.rate
                g.reserved = grant.reserved
                g.clients = max(grant.clients, 1)
                g.count_dropped = grant.count_dropped
                g.shadow = grant.shadow
                g.critical_reserve = grant.critical_reserve
                g.slots = grant.in_flight if grant.in_flight_limited else None
                g.repay_s = grant.debt_repay_ms / 1000.0
                g.set_allotment(grant, self.sent_at, now)
                if g.unlimited:
                    g.owed = 0.0
                g.granted = True
            lease = grant.lease_ms if lease is None else min(lease, grant.lease_ms)
        if lease is not None:
            self.lease_until = now + lease / 1000.0
        self.next_tick = now + answer.next_tick_ms / 1000.0
        return max(answer.next_exchange_ms, 10) / 1000.0

    def round_done(self, now: float, period: Optional[float], failure: Optional[str], untried: bool = False) -> None:
        """A round ended: ``period`` from the last page answered (``None``: none was),
        ``failure`` why a page failed (``None``: none did); ``untried``: a controller given
        has not failed since the last answer, and the next round goes to it at once."""
        if failure is not None and untried:
            self.due = now
            if period is None:
                self.last_error = failure
                return
        elif failure is not None:
            if period is None:
                self.connected = False
                self.last_error = failure
                if self.exchanges == 0:
                    # Never reached: no grant to ride on, so the policy applies from the first
                    # failure (fail_open admits from a cold start).
                    self.safe(now)
            self.due = now + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)
            if period is None:
                return
        self.connected = True
        self.safe_mode = False
        self.exchanges += 1
        self.last_error = None
        if failure is None:
            self.backoff = BACKOFF_MIN_S
            self.due = now + (period or 0.0)
        self.early_after = now + EARLY_SPACING_S

    def safe(self, now: float) -> None:
        """Past the lease: the policy applies to every group."""
        self.safe_mode = True
        if self.policy != "decay":
            return
        elapsed = now - self.lease_until
        for g in list(self.groups.values()):
            with g.lock:
                if not g.granted or g.unlimited:
                    continue
                floor = g.reserved / g.clients
                g.refill(now)
                g.rate = floor + (g.last_rate - floor) * 0.5 ** (max(elapsed, 0.0) / DECAY_HALF_LIFE_S)


H = TypeVar("H", bound="Handle")


class Handle:
    """What the synchronous and the asyncio limiters offer alike."""

    _core: Core
    _unthrottled: bool

    @property
    def client_id(self) -> str:
        """The id the server knows this limiter by."""
        return self._core.client_id

    @property
    def cost_model(self) -> CostModel:
        """How this limiter prices usage."""
        return self._core.cost_model

    @property
    def is_unthrottled(self) -> bool:
        """Whether this handle admits unthrottled."""
        return self._unthrottled

    def unthrottled(self: H) -> H:
        """A handle on the same limiter whose work is admitted unthrottled: never refused, yet
        charged to its group and counted against the node's capacity (TiDB's and
        FoundationDB's system work). The server allows it only for a token created with
        ``--unthrottled`` (any client when authentication is off); otherwise the handle admits
        as the limiter does. ``status().unthrottled_allowed`` says which."""
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view._unthrottled = True
        return view

    def try_acquire(self, group: str, cost: float = 1.0, *, request_class: str = "normal") -> Permit:
        """Admits ``cost`` units for ``group`` now, or raises :class:`~tollgate.Throttled`.
        It looks at the group's bucket only, never the network. ``request_class`` is
        ``critical`` (may empty the bucket), ``normal`` (leaves the group's
        ``critical_reserve``) or ``sheddable`` (refused first)."""
        return self._core.try_acquire(group, cost, self._unthrottled, request_class)

    def try_acquire_usage(self, group: str, usage: Usage) -> Permit:
        """Admits what ``usage`` costs up front by the limiter's cost model (a read's size is
        not known yet); settle the permit with :meth:`Permit.settle_usage` once it is."""
        return self.try_acquire(group, self._core.cost_model.upfront(usage))

    def status(self) -> RemoteStatus:
        """Whether the last exchange succeeded, safe mode, exchanges so far, the last error."""
        return self._core.status()

    def stats(self, group: str) -> Optional[GroupStats]:
        """A group's counters and grant, if the limiter has met it."""
        return self._core.stats(group)
