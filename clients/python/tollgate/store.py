"""Store mode: processes share each group's pool through Redis, with no controller
(Numaflow's design, as the Rust client's ``Tollgate::store`` does it).

The processes of a group agree through Redis on how many of them share its pool (the group's
``limit``, in units per second), and each admits ``⌊pool / size⌋`` units per one-second epoch,
deciding locally: Redis is read by one background thread every ``sync_interval``, never per
request. Python and Rust processes with the same ``namespace`` share one pool: the Lua
scripts on Redis and the keys (``tollgate:{NAMESPACE:GROUP}:…``) are the Rust client's.

Needs the ``redis`` package (``pip install 'tollgate-client[store]'``)::

    from tollgate.store import StoreLimiter

    with StoreLimiter("redis://127.0.0.1:6379", {"ingest": {"limit": 1000}}, namespace="prod") as limiter:
        permit = limiter.try_acquire("ingest")   # or limiter.acquire("ingest", 5, timeout=2)
        print(limiter.status())

A group's settings here are ``limit`` (its pool), ``ramp`` (a pool growing from ``min`` to
``max`` in Numaflow's four modes, as the Rust model steps it; with ``resume_ttl_s`` a process
started again within it resumes where the last one left), ``quotas`` (counts per window, never
overrun however many processes ask: each window a counter in Redis, taken from in allotments
as the Rust client takes them), ``dropped`` (``"return"``, the default, or ``"count"``),
``critical_reserve`` (request classes) and ``shadow``. With no controller, a ``burst``,
``reserved``, ``priority``, ``weight``, ``parent``, ``max_in_flight``, ``reads_writes_apart``
or ``debt_repay_s`` cannot apply: each is refused, naming it. A group with neither a ``limit``
nor a ``ramp`` has no pool; a name not in the settings shares the ``default`` group's pool and
quotas when it has them.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import redis

from . import _store_scripts
from ._core import check_class, check_group, class_floor
from ._local import Settings, Window, groups_of
from ._ramp import Ramp, RampSettings
from .cost import check_cost
from .errors import InvalidArgument, Throttled

__all__ = ["StoreGroupStatus", "StorePermit", "StoreLimiter", "StoreStatus"]

_log = logging.getLogger("tollgate.store")
_NEXT = iter(range(1, 1 << 62))

#: Why each setting a controller would carry out is refused in store mode.
_REFUSED = {
    "burst": "each one-second epoch's share is the burst; remove it",
    "reserved": "no controller holds reservations against a capacity; use the remote mode",
    "priority": "no controller shares a capacity among groups by priority; use the remote mode",
    "weight": "no controller shares a capacity among groups by weight; use the remote mode",
    "parent": "no controller shares a parent's limit among its children; use the remote mode",
    "max_in_flight": "a slot held by a process that dies cannot come back without a controller's lease; use the remote mode",
    "reads_writes_apart": "no engine keeps the group's read and write costs; use the remote mode",
    "debt_repay_s": "a debt is taken from the next one-second epoch's share of the pool; remove it",
    "budget": "give the window's quota in quotas instead",
    "budget_period": "give the window's quota in quotas instead",
}
_SETTINGS = ("limit", "ramp", "dropped", "critical_reserve", "shadow", "quotas")
# How soon a request refused for want of an allotment tries again, while more is taken.
_ALLOT_RETRY_S = 0.005
# How long a spent quota over a group's life says to wait: only how often to look.
_LIFE_SPENT_S = 3600.0
_WANT_MAX = 1e12


@dataclass(frozen=True)
class StoreGroupStatus:
    """One coordinated group as this process sees it now."""

    group: str
    pool: float
    """Units per one-second epoch for all processes: the group's limit, or its ramp's pool now."""
    size: int
    """How many processes share the pool, as agreed through Redis."""
    share: float
    """This process's share of the pool this epoch: ``⌊pool / size⌋``."""


@dataclass(frozen=True)
class StoreStatus:
    """The link to Redis and every coordinated group."""

    connected: bool
    safe_mode: bool
    syncs: int
    """Syncs that reached Redis since the start."""
    groups: List[StoreGroupStatus]


class _Allotment:
    """What this process holds of a group's quotas per window (the Rust client's
    ``StoreQuotas``): units taken from every window's counter in Redis at once by the ``take``
    script, as much as the tightest window has left (half of it at most, so that other
    processes still find some). What is taken counts as used at once; what is not admitted when
    the window ends is lost with it, so a quota is never overrun."""

    def __init__(self, windows: List[Tuple[Window, float]]) -> None:
        self.windows = windows
        self.lock = threading.Lock()
        self.window = 0
        self.held = 0.0
        self.ends = -math.inf  # monotonic seconds; past it the allotment may not be used
        self.left = 1.0  # units Redis had beyond it at the last take
        self.reset: Optional[float] = None
        self.wanted = False
        self.last_want = 1.0

    def take(self, cost: float, now: float) -> Optional[float]:
        """Takes ``cost`` from what is held: ``None``, or the seconds to wait (more is asked
        for at once while Redis has some left, or the window ended)."""
        with self.lock:
            live = now < self.ends
            if live and cost <= self.held + 1e-9:
                self.held -= cost
                return None
            if not live or self.left > 0:
                self.wanted = True
                return _ALLOT_RETRY_S
            return max(self.reset - now, _ALLOT_RETRY_S) if self.reset is not None else _LIFE_SPENT_S

    def give_back(self, cost: float) -> None:
        with self.lock:
            self.held += cost

    def refill(self, take: Any, prefix: str, now: float) -> None:
        """Takes more from Redis if this process asked, or is using its allotment and holds
        less than half its last take."""
        with self.lock:
            live, asked = now < self.ends, self.wanted
            self.wanted = False
            if not asked and (not live or self.held >= self.last_want / 2):
                return
            if asked and live:
                self.last_want = min(self.last_want * 2, _WANT_MAX)
            want = self.last_want
        wall = int(time.time() * 1000)
        keys, spans, epoch = [], [], 0
        for w, _ in self.windows:
            if w.name == "total":
                keys.append(prefix + "q:total")
                spans.append(0)
            elif w.from_first:
                keys.append(f"{prefix}q:{w.name}")
                spans.append(w.span_ms)
            else:
                epoch = max(epoch, w.start(wall))
                keys.append(f"{prefix}q:{w.name}:{w.start(wall)}")
                spans.append((w.end(wall) or wall) - wall + 60_000)
        taken, left, ends = take(keys=keys, args=[units for _, units in self.windows] + spans + [want])
        taken, left, ends = float(taken), float(left), int(ends)
        # A window on the clock ends with the clock; one from the first request when its
        # counter expires (its end, to the second, is then its name).
        clock_ends = [w.end(wall) for w, _ in self.windows if w.name != "total" and not w.from_first]
        first_end = None
        if ends > 0 and any(w.from_first for w, _ in self.windows):
            first_end = -(-(wall + ends) // 1000) * 1000
        end = min([e for e in clock_ends if e is not None] + ([first_end] if first_end is not None else []), default=None)
        window = epoch if epoch > 0 else (first_end or 0)
        with self.lock:
            if window != self.window:
                self.window, self.held = window, 0.0
            self.held += taken
            self.ends = now + (end - wall) / 1000 if end is not None else math.inf
            self.left = left
            self.reset = None
            if left <= 0:
                self.reset = now + ((end if end is not None else wall + int(_LIFE_SPENT_S * 1000)) - wall) / 1000


class _Group(Settings):
    """One group's settings, checked: its ``limit`` is its pool, and its quotas per window
    are taken from Redis."""

    def __init__(self, name: str, settings: Mapping[str, Any]) -> None:
        super().__init__(name, settings, "store mode", _SETTINGS, _REFUSED)
        self.pool = self.limit
        ramp = settings.get("ramp")
        self.ramp = None if ramp is None else RampSettings(self.field + "ramp", ramp)
        quotas = settings.get("quotas", {})
        if not isinstance(quotas, Mapping):
            raise InvalidArgument.of(self.field + "quotas", f"must map windows to units, got {quotas!r}")
        windows = [
            (Window(f"{self.field}quotas.{w}", w, from_first=True), check_cost(f"{self.field}quotas.{w}", units))
            for w, units in quotas.items()
        ]
        self.allotment = _Allotment(windows) if windows else None


class _Share:
    """A pool's per-epoch share among ``size`` processes (the Rust model's ``EpochShare``):
    ``⌊pool / size⌋`` per one-second epoch; what is given back within the epoch can be taken
    again; unused units do not carry over, and what was taken beyond the share is taken from
    the next epoch's. The pool is fixed, or follows a ramp stepped at the first call of an
    epoch from the last active epoch's use at pool level: this process's use times ``size``,
    plus the remainder integer division could not hand out, which counts as used."""

    def __init__(self, pool: float, size: int, ramp: Optional[Ramp] = None) -> None:
        self.lock = threading.Lock()
        self.fixed, self.ramp, self.size = pool, ramp, max(size, 1)
        self.epoch: Optional[int] = None
        self.pool = self.share = self.left = self.used = 0.0
        self.forced: Optional[bool] = None  # True: open, False: closed (safe mode)

    def roll(self, now: float) -> int:
        epoch = int(now)
        if self.epoch is None or epoch > self.epoch:
            if self.ramp is None:
                self.pool = self.fixed
            else:
                if self.epoch is not None:
                    self.ramp.use_units(self.used * self.size + max(self.pool - self.share * self.size, 0.0))
                self.pool = float(self.ramp.at_epoch(epoch))
            self.share = math.floor(self.pool / self.size)
            self.left = self.share + min(self.left, 0.0)  # a debt carries over
            self.used = 0.0
            self.epoch = epoch
        return epoch

    def try_take(self, cost: float, floor: float, now: float) -> Optional[float]:
        """Takes ``cost``, leaving ``floor`` of the share: ``None``, or the seconds until the
        next epoch."""
        with self.lock:
            self.roll(now)
            if self.forced is True:
                return None
            # Within a rounding error of the floor, as the Rust client keeps it: a sheddable
            # floor of 0.2 + (1 - 0.2) / 2 is 0.6000000000000001, still a whole 6 of 10.
            keep = max(floor * self.share - 1e-9 * max(self.share, 1.0), 0.0)
            if self.forced is None and cost <= self.left - keep:
                self.left -= cost
                self.used += cost
                return None
            return math.floor(now) + 1.0 - now

    def take(self, cost: float, now: float) -> None:
        """Takes ``cost`` whatever is left (a permit settled for more): a debt past zero."""
        with self.lock:
            self.roll(now)
            self.left -= cost
            self.used += cost

    def deposit(self, units: float, taken_in: int, now: float) -> None:
        """Gives back ``units`` taken in epoch ``taken_in``: lost in a later epoch."""
        with self.lock:
            if self.roll(now) == taken_in:
                self.left += units
                self.used = max(self.used - units, 0.0)


class StorePermit:
    """Units admitted in store mode: ``settle`` with the actual cost, ``dropped`` for work never
    done, or ``release`` (or leave a ``with`` block) to keep the cost as it was."""

    __slots__ = ("cost", "group", "_share", "_epoch", "_count_dropped", "_ended")

    def __init__(self, group: str, cost: float, share: Optional[_Share], epoch: int, count_dropped: bool) -> None:
        self.group, self.cost = group, cost
        self._share, self._epoch, self._count_dropped = share, epoch, count_dropped
        self._ended = False

    def __enter__(self) -> "StorePermit":
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def release(self) -> None:
        """Ends the permit at the cost admitted."""
        self._ended = True

    def settle(self, actual: float) -> None:
        """Ends the permit at its ``actual`` cost: more is taken from the share (into the next
        epoch's past it), less is given back within the epoch it was admitted in."""
        actual = check_cost("actual", actual)
        if self._ended:
            return
        self._ended = True
        if self._share is None:
            return
        now = time.monotonic()
        if actual > self.cost:
            self._share.take(actual - self.cost, now)
        else:
            self._share.deposit(self.cost - actual, self._epoch, now)

    def dropped(self) -> None:
        """The work was never done: its cost goes back (within its epoch) unless the group's
        ``dropped`` setting counts it."""
        if not self._count_dropped:
            self.settle(0.0)
        self._ended = True


class StoreLimiter:
    """Admission by cost, per group, from each group's pool shared through Redis with the
    other processes of the same ``namespace`` (see the module's documentation).

    ``safe_mode`` applies once Redis has not answered for ``stale_limit`` seconds (or at once
    when it cannot be reached at start): ``"decay"`` keeps the last agreed size,
    ``"fail_open"`` admits everything, ``"fail_closed"`` nothing. ``close`` (or leaving the
    ``with`` block) deregisters this process, waiting on Redis for at most a second."""

    def __init__(
        self,
        url: str,
        groups: Mapping[str, Mapping[str, Any]],
        *,
        namespace: str = "default",
        client_id: Optional[str] = None,
        safe_mode: str = "decay",
        max_wait: float = 1.0,
        sync_interval: float = 0.1,
        ttl: float = 180.0,
        connect_timeout: float = 5.0,
        stale_limit: float = 10.0,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://")):
            raise InvalidArgument.of("url", f"must be redis://HOST:PORT or rediss://HOST:PORT, got {url!r}")
        if not isinstance(namespace, str) or not namespace or "{" in namespace or "}" in namespace:
            raise InvalidArgument.of("namespace", f"must be non-empty, without braces, got {namespace!r}")
        if safe_mode not in ("decay", "fail_open", "fail_closed"):
            raise InvalidArgument.of("safe_mode", f"must be decay, fail_open or fail_closed, got {safe_mode!r}")
        for name, value, low, high in (
            ("max_wait", max_wait, 0.0, 3600.0),
            ("sync_interval", sync_interval, 0.001, 60.0),
            ("ttl", ttl, 0.001, 86400.0),
            ("connect_timeout", connect_timeout, 0.001, 600.0),
            ("stale_limit", stale_limit, 0.001, 86400.0),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise InvalidArgument.of(name, f"must be from {low} to {high} seconds, got {value!r}")
        self._settings = groups_of(groups, _Group)
        self.client_id = client_id or f"tollgate-py-{os.getpid()}-{next(_NEXT)}"
        check_group(self.client_id)
        self.namespace, self.max_wait, self.policy = namespace, float(max_wait), safe_mode
        self._interval, self._ttl_ms, self._stale = float(sync_interval), str(int(ttl * 1000)), float(stale_limit)
        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=connect_timeout)
        self._register = self._redis.register_script(_store_scripts.REGISTER)
        self._sync = self._redis.register_script(_store_scripts.SYNC)
        self._deregister = self._redis.register_script(_store_scripts.DEREGISTER)
        self._take = self._redis.register_script(_store_scripts.TAKE)
        self._quotas = {name: g.allotment for name, g in self._settings.items() if g.allotment is not None}
        self._wake = threading.Event()
        # Per coordinated group: its share, and the size to report next.
        self._shares: Dict[str, _Share] = {}
        self._report: Dict[str, int] = {}
        self.connected = self.safe_mode = False
        self.syncs = 0
        reachable = True
        for name, g in self._settings.items():
            if g.pool is None and g.ramp is None:
                continue
            size, resume = 1, None
            resumes = g.ramp is not None and g.ramp.resume_ttl_s is not None
            if reachable:
                try:
                    live, kept = self._register(keys=self._keys(name), args=[self.client_id, "1" if resumes else "0"])
                    size = max(int(live), 1)
                    resume = float(kept) if resumes and kept else None
                except redis.RedisError as e:
                    _log.warning("tollgate: Redis unreachable at start (%s), starting in safe mode", e)
                    reachable = False
            ramp = None if g.ramp is None else Ramp(g.ramp, resume)
            self._shares[name] = _Share(g.pool or 0.0, size, ramp)
            self._report[name] = size
        self.connected = reachable and bool(self._shares)
        if not reachable:
            self._enter_safe_mode()
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tollgate-store", daemon=True)
        self._thread.start()

    def __enter__(self) -> "StoreLimiter":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _keys(self, group: str) -> List[str]:
        prefix = f"tollgate:{{{self.namespace}:{group}}}:"
        return [prefix + "heartbeat", prefix + "sizes", prefix + "resume"]

    # -- admission -----------------------------------------------------------------------

    def _resolve(self, group: str) -> Tuple[Optional[_Group], Optional[_Share]]:
        """The group's settings and share: its own, else the ``default`` group's."""
        g = self._settings.get(group)
        if g is not None:
            return g, self._shares.get(group)
        d = self._settings.get("default")
        return d, self._shares.get("default")

    def _attempt(self, group: str, cost: float, request_class: str) -> Tuple[Optional[StorePermit], float]:
        check_group(group)
        cost = check_cost("cost", cost)
        check_class(request_class)
        settings, share = self._resolve(group)
        now = time.monotonic()
        if settings is None:
            return StorePermit(group, cost, None, int(now), False), 0.0
        # The allotment of the group's quotas first: a quota is a count, in every safe mode.
        quota = settings.allotment
        short = quota.take(cost, now) if quota is not None else None
        if short is not None and not settings.shadow:
            if quota is not None and quota.wanted:
                self._wake.set()
            return None, short
        wait = None if share is None else share.try_take(cost, class_floor(request_class, settings.critical_reserve), now)
        if wait is not None and quota is not None and short is None:
            quota.give_back(cost)
        if (wait is not None or short is not None) and settings.shadow:
            # Shadow mode: admitted all the same, taken from nothing.
            return StorePermit(group, cost, None, int(now), False), 0.0
        if wait is not None:
            return None, wait
        return StorePermit(group, cost, share, int(now), settings.count_dropped), 0.0

    def try_acquire(self, group: str, cost: float = 1.0, *, request_class: str = "normal") -> StorePermit:
        """Admits ``cost`` units for ``group`` now, or raises :class:`~tollgate.Throttled`
        with the time until the next epoch."""
        permit, wait = self._attempt(group, cost, request_class)
        if permit is None:
            raise Throttled(group, wait)
        return permit

    def acquire(
        self, group: str, cost: float = 1.0, timeout: Optional[float] = None, *, request_class: str = "normal"
    ) -> StorePermit:
        """Admits ``cost`` units, waiting for the next epochs up to ``timeout`` (default:
        ``max_wait``); raises :class:`~tollgate.Throttled` past it."""
        limit = self.max_wait if timeout is None else check_cost("timeout", timeout)
        deadline = time.monotonic() + limit
        while True:
            permit, wait = self._attempt(group, cost, request_class)
            if permit is not None:
                return permit
            left = deadline - time.monotonic()
            if wait > left:
                raise Throttled(group, wait)
            time.sleep(wait)

    def status(self) -> StoreStatus:
        """The link's state and every coordinated group's pool, size and share now."""
        now = time.monotonic()
        groups = []
        for name in sorted(self._shares):
            share = self._shares[name]
            with share.lock:
                share.roll(now)
                groups.append(StoreGroupStatus(name, share.pool, share.size, share.share))
        return StoreStatus(self.connected, self.safe_mode, self.syncs, groups)

    # -- the sync thread ------------------------------------------------------------------

    def sync_now(self) -> bool:
        """Agrees each group's size with the other processes at once (the background thread
        does it every ``sync_interval``); whether Redis answered."""
        with self._sync_lock:
            return self._sync_sizes()

    def _take_quotas(self) -> bool:
        """Takes more of each group's quotas that needs more; whether Redis answered."""
        try:
            now = time.monotonic()
            for name, allotment in self._quotas.items():
                allotment.refill(self._take, self._keys(name)[0][: -len("heartbeat")], now)
        except redis.RedisError:
            self.connected = False
            return False
        return True

    def _sync_sizes(self) -> bool:
        if not self._take_quotas():
            return False
        try:
            for name, share in self._shares.items():
                agree, largest, live = self._sync(keys=self._keys(name)[:2], args=[self.client_id, self._report[name], self._ttl_ms])
                largest, live = max(int(largest), 1), max(int(live), 1)
                with share.lock:
                    if int(agree) == 1:
                        share.size = self._report[name] = largest
                    else:
                        # Conservative while the processes disagree; report what is live.
                        share.size, self._report[name] = max(share.size, largest), live
        except redis.RedisError:
            self.connected = False
            return False
        self.connected = True
        self.syncs += 1
        self._last_ok = time.monotonic()
        if self.safe_mode:
            _log.info("tollgate: Redis reachable again, leaving safe mode")
            self.safe_mode = False
            for share in self._shares.values():
                share.forced = None
        return True

    def _enter_safe_mode(self) -> None:
        if self.safe_mode:
            return
        self.safe_mode = True
        forced = {"fail_open": True, "fail_closed": False}.get(self.policy)
        for share in self._shares.values():
            share.forced = forced

    def _run(self) -> None:
        due = time.monotonic() + self._interval
        while not self._stop.is_set():
            # A sync each interval; between them, more of a quota as soon as an allotment runs out.
            woken = self._wake.wait(max(due - time.monotonic(), 0.0))
            if self._stop.is_set():
                return
            if woken and time.monotonic() < due:
                self._wake.clear()
                with self._sync_lock:
                    self._take_quotas()
                continue
            due = time.monotonic() + self._interval
            if not self._shares and not self._quotas:
                continue
            if not self.sync_now() and time.monotonic() - self._last_ok > self._stale and not self.safe_mode:
                _log.warning("tollgate: Redis unreachable past the stale limit, entering safe mode (%s)", self.policy)
                self._enter_safe_mode()

    def close(self) -> None:
        """Stops syncing and deregisters this process from every group (waiting on Redis for
        at most a second); the others' shares grow at their next sync."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + 1.0
        for name in self._shares:
            if time.monotonic() > deadline:
                break
            try:
                # A ramp that may resume keeps its value for its TTL.
                share, ttl = self._shares[name], self._settings[name].ramp
                kept = "" if share.ramp is None or ttl is None or ttl.resume_ttl_s is None else repr(share.ramp.value)
                ttl_ms = "1" if not kept or ttl is None or ttl.resume_ttl_s is None else str(max(int(ttl.resume_ttl_s * 1000), 1))
                self._deregister(keys=self._keys(name), args=[self.client_id, kept, ttl_ms])
            except redis.RedisError:
                break
        self._redis.close()
        self.connected = False
