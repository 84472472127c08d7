"""A limiter fed by a tollgate server's grants: the Rust client's remote mode, in Python.

Each group has a local token bucket; a background thread exchanges with the server, reporting
each group's demand (admitted or not), consumption and counts, and receives each group's grant
(rate, burst, lease), which the bucket then follows. Decisions never wait on the network:
``try_acquire`` looks at the bucket only. A new group admits nothing until its first grant,
which is asked for at once (``acquire`` goes on the moment it comes). When no exchange succeeds
for longer than the lease, or none ever has, the safe-mode policy applies: ``decay`` (the last
grant halves every 5 s toward the group's reservation shared by its clients), ``fail_open``
(admit everything) or ``fail_closed`` (admit nothing).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, cast

import grpc

from . import _connect, _routes
from ._core import EXCHANGE_GROUPS_MAX, SAFE_MODES, Core, GroupStats, Handle, Permit, RemoteStatus
from .cost import CostModel
from .errors import from_rpc
from .throttle import ClientThrottle, RefusedLocally
from .v1 import tollgate_pb2_grpc as rpc

__all__ = ["EXCHANGE_GROUPS_MAX", "SAFE_MODES", "GroupStats", "Limiter", "Permit", "RemoteStatus"]

F = TypeVar("F", bound=Callable[..., Any])


class Limiter(Handle):
    """Admission by cost, per group, fed by the tollgate server at ``url``.

    - ``url``: the controller, or several sharing one etcd, comma-separated
      (``http://a:7460,http://b:7460``): the limiter talks to the first and moves to the next
      when the one it talks to fails;
    - ``client_id``: how the server tells this process apart (default: one of its own);
    - ``token``, ``ca_file``: a client token for a server run with ``--auth``; the authority
      an ``https://`` address is checked against (default: the system's);
    - ``safe_mode``: ``decay``, ``fail_open`` or ``fail_closed``;
    - ``max_wait``: how long :meth:`acquire` waits by default, seconds;
    - ``exchange_timeout``, ``exchange_period``: each exchange's deadline; the period asked of
      the server (default: the server's);
    - ``cost_model``: how :meth:`try_acquire_usage` and :meth:`Permit.settle_usage` price what
      a request did (default :meth:`CostModel.count`).

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
        cost_model: Optional[CostModel] = None,
    ) -> None:
        core = Core(
            client_id=client_id,
            safe_mode=safe_mode,
            max_wait=max_wait,
            exchange_period=exchange_period,
            cost_model=cost_model,
        )
        self._metadata = _connect.metadata(token)
        self._ca_file = ca_file
        self._timeout = exchange_timeout
        self._start(core, [_connect.channel(u, ca_file) for u in _connect.addresses(url, ca_file)])

    def _start(self, core: Core, homes: List[grpc.Channel]) -> None:
        """Takes ``core`` and the channels to the controllers given, and starts the exchange
        thread."""
        self._core = core
        # The controllers given, and the one talked to now.
        self._homes = homes
        self._stubs = [rpc.AdmissionStub(c) for c in self._homes]  # type: ignore[no-untyped-call]
        self._current = 0
        # How many of them failed since the last answer: until each has, a failure is followed
        # by the next at once, then the rounds back off.
        self._failed = 0
        # With the groups sharded over the controllers: the map, and a channel to each owner.
        self._routes = _routes.Routes()
        self._owners: Dict[str, Tuple[grpc.Channel, Any]] = {}
        self._wake = threading.Event()
        self._core.notify = self._wake.set
        # Notified after each answer: what a request waiting for a new group's grant waits on.
        self._granted = threading.Condition()
        self._stop = threading.Event()
        self._unthrottled = False
        self._thread = threading.Thread(target=self._run, name="tollgate-exchange", daemon=True)
        self._thread.start()


    # -- admission -------------------------------------------------------------------------

    def acquire(
        self, group: str, cost: float = 1.0, timeout: Optional[float] = None, *, request_class: str = "normal"
    ) -> Permit:
        """Admits ``cost`` units for ``group``, waiting up to ``timeout`` (default: the
        limiter's ``max_wait``) for them; raises :class:`~tollgate.Throttled` past it. The
        request counts once in the demand reported, however long it waits."""
        fast = self._core.fast(group, cost, self._unthrottled) if request_class == "normal" else None
        if fast is not None:
            return fast
        steps = self._core.acquiring(group, cost, self._unthrottled, timeout, request_class)
        try:
            pause, new = next(steps)
            while True:
                if new:
                    # A new group: on as soon as its first grant comes.
                    with self._granted:
                        self._granted.wait(timeout=pause)
                else:
                    time.sleep(pause)
                pause, new = next(steps)
        except StopIteration as done:
            admitted: Permit = done.value
            return admitted
        finally:
            steps.close()

    def limit(self, group: str, cost: float = 1.0, throttle: Optional[ClientThrottle] = None) -> Callable[[F], F]:
        """A decorator: each call of the function first acquires ``cost`` units of ``group``.

        With a :class:`ClientThrottle`, an exception from the function counts as the backend
        refusing the call, and while it refuses much of what it is sent a share of calls raise
        :class:`RefusedLocally` at once instead of being made."""

        def wrap(f: F) -> F:
            @functools.wraps(f)
            def limited(*args: Any, **kwargs: Any) -> Any:
                if throttle is not None and not throttle.allow():
                    raise RefusedLocally()
                with self.acquire(group, cost):
                    if throttle is None:
                        return f(*args, **kwargs)
                    try:
                        result = f(*args, **kwargs)
                    except BaseException:
                        throttle.record(False)
                        raise
                    throttle.record(True)
                    return result

            return cast(F, limited)

        return wrap

    def close(self) -> None:
        """Stops the exchange thread and closes the channel."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        for home in self._homes:
            home.close()
        for channel, _ in self._owners.values():
            channel.close()

    def __enter__(self) -> "Limiter":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the exchange loop -----------------------------------------------------------------

    def _run(self) -> None:
        core = self._core
        while not self._stop.is_set():
            wait, interruptible = core.next_wait(time.monotonic())
            if wait > 0:
                if interruptible:
                    self._wake.wait(timeout=wait)
                    self._wake.clear()
                else:
                    time.sleep(wait)
                continue
            self._round()

    def _round(self) -> None:
        """One round of exchanges: every group's usage, in pages, each answer applied."""
        core = self._core
        period, failure = None, None
        pages = core.requests(time.monotonic())
        for i, (request, _) in enumerate(pages):
            try:
                answer = self._exchange(request)
            except grpc.RpcError as e:
                # The round ends: this page and the ones after it report again next round.
                core.restore([before for _, before in pages[i:]])
                failure = str(from_rpc(e))
                break
            period = core.answer(answer, time.monotonic())
            with self._granted:
                self._granted.notify_all()
        core.round_done(time.monotonic(), period, failure, untried=self._failed < len(self._stubs))

    def _owner(self, address: str) -> Any:
        """The stub for the owner at ``address``, its channel opened on first use."""
        known = self._owners.get(address)
        if known is None:
            if len(self._owners) >= _routes.MEMBERS_MAX:
                for channel, _ in self._owners.values():
                    channel.close()
                self._owners.clear()
            channel = _connect.channel(address, self._ca_file)
            known = self._owners[address] = (channel, rpc.AdmissionStub(channel))  # type: ignore[no-untyped-call]
        return known[1]

    def _exchange(self, request: Any) -> Any:
        """One exchange: each group's part to its owner when the map says, else whole to the
        controller given (see ``_routes``); raises the error when no part is answered."""
        routes = self._routes
        routes.prepare(request)
        parts = routes.split(request)
        if parts is None:
            answer = self._home(request)
            routes.learn(answer)
            return answer
        outcome = _routes.Outcome(routes, request)
        calls = []
        for owner, part in parts:
            try:
                stub = self._owner(owner)
            except Exception:  # an address this client cannot dial: the part goes again below
                outcome.failed(part, None)
                continue
            calls.append((part, stub.Exchange.future(part, timeout=self._timeout, metadata=self._metadata)))
        for part, call in calls:
            try:
                outcome.answered(call.result())
            except grpc.RpcError as e:
                outcome.failed(part, e)
        retry = outcome.retry()
        if retry is not None:
            try:
                outcome.answered(self._home(retry))
            except grpc.RpcError as e:
                outcome.error = e
        return outcome.finish()

    def _home(self, request: Any) -> Any:
        """``request`` to the controller talked to now; when it fails, the next one given is
        talked to from then on."""
        try:
            answer = self._stubs[self._current].Exchange(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError:
            self._current = (self._current + 1) % len(self._stubs)
            self._failed += 1
            raise
        self._failed = 0
        return answer
