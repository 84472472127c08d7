"""A backend's side: reports of its health and of the groups loading it, and the soft limits
the controller pushes back (the Rust client's ``BackendReporter`` and ``Scheduler::follow``).

A service that serves many tenants (a database, a cache, a queue) records the units each group
brings (:meth:`Reporter.record`). Every ``interval`` the reporter folds what was recorded into
each group's smoothed rate and sends the controller the busiest ``top_k`` groups at or above
``threshold`` with the backend's health: the smoothed total over ``capacity`` when a capacity
is given, or whatever the ``health`` function returns (:class:`Utilisation` or
:class:`QueueBytes`). The controller limits the groups loading a saturated backend.

The groups' soft limits on each backend (``backend_limit``, TiKV's soft quota) come back from
the controller: :meth:`Reporter.soft_limits` holds the latest set, which a watch of the
controller's settings keeps current (pushed after every change) and a pull every
``check_interval`` catches up.

docs/backend.md, "Backends in any language", describes the protocol itself.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

import grpc

from . import _connect
from .errors import InvalidArgument, from_rpc
from .v1 import tollgate_pb2 as pb
from .v1 import tollgate_pb2_grpc as rpc

#: The most groups one report carries (the controller refuses more).
REPORT_GROUPS_MAX = 10_000
#: The longest backend id and zone, in bytes.
NAME_BYTES_MAX = 255


@dataclass(frozen=True)
class Utilisation:
    """Load over capacity: 1 is at capacity."""

    value: float


@dataclass(frozen=True)
class QueueBytes:
    """Bytes queued (FoundationDB's storage queue; the controller's target is 800e6)."""

    value: float


Health = Union[Utilisation, QueueBytes]


def fold_window(rates: Dict[str, float], window: Dict[str, float], elapsed: float, folding: float) -> None:
    """Folds one window's units into each group's smoothed units/s: the window's own rate moves
    the smoothed one by ``1 - exp(-elapsed / folding)`` of the gap, so a steady load settles on
    its true rate whatever the window's length. Loads that died away are forgotten."""
    keep = 1.0 - math.exp(-elapsed / folding)
    for group in list(rates):
        units = window.pop(group, 0.0)
        rates[group] += (units / elapsed - rates[group]) * keep
    for group, units in window.items():
        rates[group] = units / elapsed * keep
    window.clear()
    for group in [g for g, r in rates.items() if r <= 1e-6]:
        del rates[group]


def _check_name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value.encode()) <= NAME_BYTES_MAX:
        raise InvalidArgument.of(field, f"must be 1 to {NAME_BYTES_MAX} bytes, got {value!r}")
    return value


def _check_positive(field: str, value: Any, allow_none: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise InvalidArgument.of(field, f"must be a finite number above 0, got {value!r}")
    return float(value)


class _Core:
    """What the sync and asyncio reporters share: the options, the window being recorded, the
    smoothed rates, and the soft limits last heard of."""

    def __init__(
        self,
        backend_id: str,
        zone: str,
        interval: float,
        top_k: int,
        threshold: float,
        smoothing: float,
        capacity: Optional[float],
        health: Optional[Callable[[], Health]],
        check_interval: float,
        clock: Callable[[], float],
    ) -> None:
        self.backend_id = _check_name("backend_id", backend_id)
        self.zone = _check_name("zone", zone)
        self.interval = float(_check_positive("interval", interval) or 0.0)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= REPORT_GROUPS_MAX:
            raise InvalidArgument.of("top_k", f"must be a whole number from 1 to {REPORT_GROUPS_MAX}, got {top_k!r}")
        self.top_k = top_k
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (math.isfinite(threshold) and threshold >= 0):
            raise InvalidArgument.of("threshold", f"must be a finite number of units/s, 0 or more, got {threshold!r}")
        self.threshold = float(threshold)
        self.smoothing = float(_check_positive("smoothing", smoothing) or 0.0)
        self.capacity = _check_positive("capacity", capacity, allow_none=True)
        if self.capacity is None and health is None:
            raise InvalidArgument.of("health", "give capacity (utilisation is then the load over it) or a health function")
        self.health = health
        self.check_interval = float(_check_positive("check_interval", check_interval) or 0.0)
        self.clock = clock
        self.lock = threading.Lock()
        self.window: Dict[str, float] = {}
        self.rates: Dict[str, float] = {}
        self.last = clock()
        self.limits: Dict[str, float] = {}
        self.version = 0
        self.elsewhere: Dict[str, float] = {}
        self.shares: Dict[str, pb.NodeShare] = {}

    def record(self, group: str, units: float) -> None:
        if not isinstance(group, str) or not group:
            raise InvalidArgument.of("group", f"must be a group's name, got {group!r}")
        if isinstance(units, bool) or not isinstance(units, (int, float)) or not math.isfinite(units) or units < 0:
            raise InvalidArgument.of("units", f"must be a finite number, 0 or more, got {units!r}")
        if units > 0:
            with self.lock:
                self.window[group] = self.window.get(group, 0.0) + float(units)

    def next_report(self) -> Optional[pb.BackendReport]:
        """The window since the last report folded in, and the report to send (``None`` when
        no time has passed)."""
        with self.lock:
            window, self.window = self.window, {}
        now = self.clock()
        elapsed, self.last = now - self.last, now
        if elapsed <= 0:
            with self.lock:
                for g, u in window.items():
                    self.window[g] = self.window.get(g, 0.0) + u
            return None
        fold_window(self.rates, window, elapsed, self.smoothing)
        loads = sorted(self.rates.items(), key=lambda gr: (-gr[1], gr[0]))
        total = sum(r for _, r in loads)
        loads = [(g, r) for g, r in loads if r >= self.threshold][: self.top_k]
        report = pb.BackendReport(backend_id=self.backend_id, zone=self.zone)
        health: Health = Utilisation(total / self.capacity) if self.capacity is not None else self._asked_health()
        if isinstance(health, Utilisation):
            report.utilisation = health.value
        else:
            report.queue_bytes = health.value
        # The capacity configured; or the one a utilisation implies (the load over it).
        if self.capacity is not None:
            report.capacity = self.capacity
        elif isinstance(health, Utilisation) and health.value > 0 and total > 0:
            report.capacity = total / health.value
        report.loads.extend(pb.GroupLoad(group=g, units_per_s=r) for g, r in loads)
        return report

    def _asked_health(self) -> Health:
        assert self.health is not None
        h = self.health()
        if not isinstance(h, (Utilisation, QueueBytes)) or not (math.isfinite(h.value) and h.value >= 0):
            raise InvalidArgument.of("health", f"must return Utilisation or QueueBytes of a finite value, 0 or more, got {h!r}")
        return h

    def take_ack(self, ack: pb.ReportAck) -> List[str]:
        """Keeps what the other backends serve of the groups reported; the loads left out."""
        elsewhere = {l.group: l.units_per_s for l in ack.elsewhere if math.isfinite(l.units_per_s) and l.units_per_s > 0}
        shares = {s.group: s for s in ack.shares if math.isfinite(s.units_per_s) and s.units_per_s > 0}
        with self.lock:
            self.elsewhere, self.shares = elsewhere, shares
        return list(ack.rejected)

    def take_settings(self, s: pb.BackendSettings) -> None:
        """Keeps the soft limits of a settings answer (an unchanged one keeps those held)."""
        if s.unchanged:
            return
        limits = {g.name: g.settings.backend_limit for g in s.groups if g.settings.HasField("backend_limit")}
        with self.lock:
            self.limits, self.version = limits, s.version


class _Reporting:
    """What both reporters take and answer: the options, recording, the soft limits held."""

    def __init__(
        self,
        url: str,
        backend_id: str,
        zone: str = "zone",
        *,
        interval: Optional[float] = 0.25,
        top_k: int = 10,
        threshold: float = 0.0,
        smoothing: float = 1.0,
        capacity: Optional[float] = None,
        health: Optional[Callable[[], Health]] = None,
        check_interval: float = 10.0,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = _Core(backend_id, zone, interval or 1.0, top_k, threshold, smoothing, capacity, health, check_interval, clock)
        self._background = interval is not None
        self._metadata = _connect.metadata(token)
        self._urls = _connect.addresses(url, ca_file)
        self._ca_file = ca_file
        self._current = 0
        self._open()

    def _open(self) -> None:
        """What a reporter starts with, once its options are checked."""

    def record(self, group: str, units: float) -> None:
        """Counts ``units`` of work served for ``group`` in the report under way."""
        self._core.record(group, units)

    def soft_limits(self) -> Dict[str, float]:
        """Each group's soft limit on this backend (``backend_limit``, units/s), as last heard
        from the controller; groups without one are absent."""
        with self._core.lock:
            return dict(self._core.limits)

    def elsewhere(self) -> Dict[str, float]:
        """For each group of the last report that other backends serve too, its units/s on
        them, as the controller answered (dmClock's cross-backend term: a fair queue charges
        each group this much, as time passes, as if it had served it)."""
        with self._core.lock:
            return dict(self._core.elsewhere)

    def shares(self) -> Dict[str, "pb.NodeShare"]:
        """For each group of the last report with a limit, its share of the limit on this
        backend, as the controller answered: ``units_per_s`` (the limit in proportion to its
        load here), ``ceiling`` (the most it may take here of capacity lent while the backend
        is idle) and the share in ``cpu_ms_per_s``, ``read_bytes_per_s`` and
        ``write_bytes_per_s``."""
        with self._core.lock:
            return dict(self._core.shares)

    @property
    def settings_version(self) -> int:
        """The version of the settings held (0: none heard yet)."""
        return self._core.version

    def _failed_over(self) -> None:
        """The next controller given, for the next call: this one failed."""
        self._current = (self._current + 1) % len(self._urls)


class Reporter(_Reporting):
    """Reports a backend's health and busiest groups to a controller from a thread of its own,
    and keeps the groups' soft limits current.

    ``url`` is one controller or several, comma-separated (controllers sharing one etcd: any of
    them takes a report, a follower passing it on to the leader; one that fails is left for the
    next). Give ``capacity`` (units/s; utilisation is the smoothed load over it) or a
    ``health`` function. ``interval=None`` starts no thread: call :meth:`report_now` and
    :meth:`refresh_settings` yourself (tests, or a service with its own loop).

    >>> reporter = Reporter("http://127.0.0.1:7460", "kv-1", "zone-a", capacity=50_000)  # doctest: +SKIP
    >>> reporter.record("acme", 12)                                                    # doctest: +SKIP
    >>> reporter.soft_limits().get("acme")                                             # doctest: +SKIP
    """

    def _open(self) -> None:
        self._channels = [_connect.channel(u, self._ca_file) for u in self._urls]
        self._stubs = [rpc.BackendStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._watch: Optional[Any] = None
        if self._background:
            self._threads = [
                threading.Thread(target=self._report_loop, name="tollgate-reporter", daemon=True),
                threading.Thread(target=self._settings_loop, name="tollgate-reporter-settings", daemon=True),
            ]
            for t in self._threads:
                t.start()

    def report_now(self) -> List[str]:
        """Folds what was recorded since the last report and sends the report now: the loads
        the controller left out, each as ``"loads[i].group: rule"``."""
        report = self._core.next_report()
        if report is None:
            return []
        try:
            ack = self._stubs[self._current].Report(report, metadata=self._metadata, timeout=max(self._core.interval, 1.0))
        except grpc.RpcError as e:
            self._failed_over()
            raise from_rpc(e) from None
        return self._core.take_ack(ack)

    def refresh_settings(self) -> None:
        """Pulls the groups' settings, sending the version held: the controller answers
        "unchanged" or with the current set."""
        try:
            answer = self._stubs[self._current].GetSettings(
                pb.GetSettingsRequest(known_version=self._core.version), metadata=self._metadata, timeout=10.0
            )
        except grpc.RpcError as e:
            self._failed_over()
            raise from_rpc(e) from None
        self._core.take_settings(answer)

    def close(self) -> None:
        """Stops reporting and watching, and closes the channels."""
        self._stop.set()
        if self._watch is not None:
            self._watch.cancel()
        for t in self._threads:
            t.join(timeout=5)
        for c in self._channels:
            c.close()

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _report_loop(self) -> None:
        while not self._stop.wait(self._core.interval):
            try:
                self.report_now()
            except Exception:  # noqa: BLE001 - an undelivered report is retried at the next interval
                pass

    def _settings_loop(self) -> None:
        # A pull, then the controller's pushes until check_interval is up (the watch's
        # deadline), then a pull again; a controller that cannot be reached is tried again a
        # second later.
        while not self._stop.is_set():
            try:
                self.refresh_settings()
            except Exception:  # noqa: BLE001 - tried again below
                self._stop.wait(min(self._core.check_interval, 1.0))
                continue
            try:
                self._watch = self._stubs[self._current].WatchSettings(
                    pb.WatchSettingsRequest(), metadata=self._metadata, timeout=self._core.check_interval
                )
                for pushed in self._watch:
                    self._core.take_settings(pushed)
            except Exception:  # noqa: BLE001 - the watch's deadline, or its controller gone
                pass


class AsyncReporter(_Reporting):
    """:class:`Reporter` for asyncio (``grpc.aio``): ``async with AsyncReporter(...)`` runs its
    reports and its watch of the settings as tasks on the running loop."""

    def _open(self) -> None:
        self._channels: List[grpc.aio.Channel] = []
        self._stubs: List[Any] = []
        self._tasks: List["asyncio.Task[None]"] = []

    async def __aenter__(self) -> "AsyncReporter":
        self._channels = [_connect.aio_channel(u, self._ca_file) for u in self._urls]
        self._stubs = [rpc.BackendStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        if self._background:
            self._tasks = [asyncio.create_task(self._report_loop()), asyncio.create_task(self._settings_loop())]
        return self

    async def __aexit__(self, *_: object) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        for c in self._channels:
            await c.close()

    async def report_now(self) -> List[str]:
        """:meth:`Reporter.report_now`, awaited."""
        report = self._core.next_report()
        if report is None:
            return []
        try:
            ack = await self._stubs[self._current].Report(report, metadata=self._metadata, timeout=max(self._core.interval, 1.0))
        except grpc.RpcError as e:
            self._failed_over()
            raise from_rpc(e) from None
        return self._core.take_ack(ack)

    async def refresh_settings(self) -> None:
        """:meth:`Reporter.refresh_settings`, awaited."""
        try:
            answer = await self._stubs[self._current].GetSettings(
                pb.GetSettingsRequest(known_version=self._core.version), metadata=self._metadata, timeout=10.0
            )
        except grpc.RpcError as e:
            self._failed_over()
            raise from_rpc(e) from None
        self._core.take_settings(answer)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self._core.interval)
            try:
                await self.report_now()
            except Exception:  # noqa: BLE001 - retried at the next interval
                pass

    async def _settings_loop(self) -> None:
        while True:
            try:
                await self.refresh_settings()
            except Exception:  # noqa: BLE001 - tried again a second later
                await asyncio.sleep(min(self._core.check_interval, 1.0))
                continue
            call = self._stubs[self._current].WatchSettings(
                pb.WatchSettingsRequest(), metadata=self._metadata, timeout=self._core.check_interval
            )
            try:
                async for pushed in call:
                    self._core.take_settings(pushed)
            except grpc.RpcError:  # the watch's deadline, or its controller gone
                pass
