"""The limiter for asyncio: the same buckets, grants, demand and safe mode as
:class:`tollgate.Limiter`, with the exchange as a task on the event loop (``grpc.aio``) instead
of a thread, and an ``acquire`` that awaits instead of blocking.

>>> async def main() -> None:                                   # doctest: +SKIP
...     async with AsyncLimiter("http://127.0.0.1:7460") as limiter:
...         permit = await limiter.acquire("checkout", cost=2)
...         permit.settle(1.5)

An :class:`AsyncLimiter` belongs to the event loop it was entered on: use it from that loop's
tasks. ``try_acquire`` is the synchronous client's own, with no await.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar, cast

import grpc
import grpc.aio

from . import _connect, _routes
from ._core import Core, Handle, Permit
from .cost import CostModel
from .errors import Throttled, from_rpc
from .throttle import ClientThrottle, RefusedLocally
from .v1 import tollgate_pb2_grpc as rpc

__all__ = ["AsyncLimiter"]

A = TypeVar("A", bound=Callable[..., Awaitable[Any]])


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds pass. Not ``asyncio.wait_for``, which on
    some Pythons loses a cancellation that comes as the event is set."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout)
    finally:
        waiter.cancel()


class AsyncLimiter(Handle):
    """Admission by cost, per group, fed by the tollgate server at ``url``, for asyncio. The
    options are :class:`tollgate.Limiter`'s. Use it as ``async with AsyncLimiter(...) as
    limiter`` (or call :meth:`start` and :meth:`close`)."""

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
        self._core = Core(
            client_id=client_id,
            safe_mode=safe_mode,
            max_wait=max_wait,
            exchange_period=exchange_period,
            cost_model=cost_model,
        )
        self._metadata = _connect.metadata(token)
        self._urls, self._ca_file = _connect.addresses(url, ca_file), ca_file
        self._timeout = exchange_timeout
        # The controllers given (their channels while started), and the one talked to now.
        self._homes: List[Tuple[grpc.aio.Channel, Any]] = []
        self._current = 0
        # How many of them failed since the last answer: until each has, a failure is followed
        # by the next at once, then the rounds back off.
        self._failed = 0
        self._task: Optional["asyncio.Task[None]"] = None
        self._wake: Optional[asyncio.Event] = None
        self._granted: Optional[asyncio.Event] = None
        self._unthrottled = False
        # With the groups sharded over the controllers: the map, and a channel to each owner.
        self._routes = _routes.Routes()
        self._owners: Dict[str, Tuple[grpc.aio.Channel, Any]] = {}

    async def start(self) -> "AsyncLimiter":
        """Opens the channel and starts the exchange task on the running loop (``async with``
        does it)."""
        if self._task is None:
            for u in self._urls:
                channel = _connect.aio_channel(u, self._ca_file)
                self._homes.append((channel, rpc.AdmissionStub(channel)))  # type: ignore[no-untyped-call]
            self._wake = asyncio.Event()
            self._granted = asyncio.Event()
            self._core.notify = self._wake.set
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tollgate-exchange")
        return self

    async def close(self) -> None:
        """Stops the exchange task and closes the channel."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for channel, _ in self._homes:
            await channel.close()
        self._homes.clear()
        for channel, _ in self._owners.values():
            await channel.close()
        self._owners.clear()

    async def __aenter__(self) -> "AsyncLimiter":
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()


    # -- admission -------------------------------------------------------------------------

    async def acquire(
        self, group: str, cost: float = 1.0, timeout: Optional[float] = None, *, request_class: str = "normal"
    ) -> Permit:
        """Admits ``cost`` units for ``group``, awaiting them up to ``timeout`` (default: the
        limiter's ``max_wait``) without blocking the loop; raises
        :class:`~tollgate.Throttled` past it (after letting the loop run once, so that a
        caller retrying at once still lets the exchange that brings a grant run). Cancelled
        while it waits, it takes nothing and its waiting work is no longer reported. A new
        group's first grant is asked for at once, never held until the server's next tick."""
        fast = self._core.fast(group, cost, self._unthrottled) if request_class == "normal" else None
        if fast is not None:
            return fast
        steps = self._core.acquiring(group, cost, self._unthrottled, timeout, request_class)
        try:
            pause, new = next(steps)
            while True:
                granted = self._granted
                if new and granted is not None:
                    # A new group: on as soon as its first grant comes.
                    await _wait(granted, pause)
                else:
                    await asyncio.sleep(pause)
                pause, new = next(steps)
        except StopIteration as done:
            admitted: Permit = done.value
            return admitted
        except Throttled:
            # Refused: the loop runs once before the error is raised, so that a caller retrying
            # at once, with no await of its own, still lets the exchange that brings the grant
            # run.
            await asyncio.sleep(0)
            raise
        finally:
            # Cancelled while it waited: its waiting work is no longer reported.
            steps.close()

    def limit(self, group: str, cost: float = 1.0, throttle: Optional[ClientThrottle] = None) -> Callable[[A], A]:
        """A decorator for a coroutine function: each call first awaits ``cost`` units. With a
        :class:`ClientThrottle`, as :meth:`Limiter.limit`."""

        def wrap(f: A) -> A:
            @functools.wraps(f)
            async def limited(*args: Any, **kwargs: Any) -> Any:
                if throttle is not None and not throttle.allow():
                    raise RefusedLocally()
                await self.acquire(group, cost)
                if throttle is None:
                    return await f(*args, **kwargs)
                try:
                    result = await f(*args, **kwargs)
                except BaseException:
                    throttle.record(False)
                    raise
                throttle.record(True)
                return result

            return cast(A, limited)

        return wrap


    # -- the exchange loop -----------------------------------------------------------------

    async def _run(self) -> None:
        core, wake = self._core, self._wake
        assert wake is not None and self._homes
        while True:
            wait, interruptible = core.next_wait(time.monotonic())
            if wait > 0:
                if interruptible:
                    await _wait(wake, wait)
                    wake.clear()
                else:
                    await asyncio.sleep(wait)
                continue
            period, failure = None, None
            pages = core.requests(time.monotonic())
            for i, (request, _) in enumerate(pages):
                try:
                    answer = await self._exchange(request)
                except grpc.RpcError as e:
                    core.restore([before for _, before in pages[i:]])
                    failure = str(from_rpc(e))
                    break
                except asyncio.CancelledError:
                    core.restore([before for _, before in pages[i:]])
                    raise
                period = core.answer(answer, time.monotonic())
                granted, self._granted = self._granted, asyncio.Event()
                if granted is not None:
                    granted.set()
            core.round_done(time.monotonic(), period, failure, untried=self._failed < len(self._homes))

    async def _owner(self, address: str) -> Any:
        """The stub for the owner at ``address``, its channel opened on first use."""
        known = self._owners.get(address)
        if known is None:
            if len(self._owners) >= _routes.MEMBERS_MAX:
                for channel, _ in self._owners.values():
                    await channel.close()
                self._owners.clear()
            channel = _connect.aio_channel(address, self._ca_file)
            known = self._owners[address] = (channel, rpc.AdmissionStub(channel))  # type: ignore[no-untyped-call]
        return known[1]

    async def _home(self, request: Any) -> Any:
        """``request`` to the controller talked to now; when it fails, the next one given is
        talked to from then on."""
        try:
            answer = await self._homes[self._current][1].Exchange(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError:
            self._current = (self._current + 1) % len(self._homes)
            self._failed += 1
            raise
        self._failed = 0
        return answer

    async def _exchange(self, request: Any) -> Any:
        """One exchange: each group's part to its owner when the map says, else whole to the
        controller given (see ``_routes``); raises the error when no part is answered."""
        routes = self._routes
        routes.prepare(request)
        parts = routes.split(request)
        if parts is None:
            answer = await self._home(request)
            routes.learn(answer)
            return answer
        outcome = _routes.Outcome(routes, request)
        calls = []
        for owner, part in parts:
            try:
                stub = await self._owner(owner)
            except Exception:  # an address this client cannot dial: the part goes again below
                outcome.failed(part, None)
                continue
            calls.append((part, stub.Exchange(part, timeout=self._timeout, metadata=self._metadata)))
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (part, _), result in zip(calls, results):
            if isinstance(result, grpc.RpcError):
                outcome.failed(part, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                outcome.answered(result)
        retry = outcome.retry()
        if retry is not None:
            try:
                outcome.answered(await self._home(retry))
            except grpc.RpcError as e:
                outcome.error = e
        return outcome.finish()
