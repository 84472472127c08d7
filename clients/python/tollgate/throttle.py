"""Client-side adaptive throttling (Google's SRE book, "Handling Overload").

A client in front of a backend that sheds refuses a share of its own requests instead of
sending work the backend will refuse. Over a sliding window (two minutes by default), with
``requests`` the requests tried (refused here or not) and ``accepts`` those the backend took,
a request is refused here with probability ``max(0, (requests - k*accepts) / (requests + 1))``.
With ``k = 2`` nothing is refused while the backend takes half or more of what it is sent.

Refusals are spread evenly rather than drawn at random (a running sum of the probability),
so the share refused is exact and the same on every run; the Rust client's
``tollgate_limiter::throttle::ClientThrottle`` does the same.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable, Deque, List, Tuple

from .errors import InvalidArgument

_SLOTS = 60


class RefusedLocally(Exception):
    """A call the client's adaptive throttle refused before making it: the backend has been
    refusing much of its work (``Limiter.limit(..., throttle=...)``)."""

    def __init__(self) -> None:
        super().__init__("refused by the client's adaptive throttle: the backend is refusing much of its work")


class ClientThrottle:
    """A client's adaptive throttle; safe to share between threads.

    ``k``: the client sends up to ``k`` requests for each one the backend accepts before
    refusing any (1 to 100). ``window``: seconds over which requests and accepts count
    (1 to 3600). ``max_reject``: the highest probability of refusing (above 0, at most 1;
    0.8 by default, as Envoy's admission control): a fifth is always sent, so a backend that
    refused everything is sent everything again within about a window and a half of its
    recovery (uncapped, the book's rule takes about five windows). ``clock``: seconds,
    monotonic (``time.monotonic`` by default).

    >>> throttle = ClientThrottle()
    >>> for _ in range(1000):
    ...     if throttle.allow():
    ...         throttle.record(False)  # a backend refusing everything
    >>> throttle.reject_probability()
    0.8
    """

    def __init__(
        self,
        k: float = 2.0,
        window: float = 120.0,
        max_reject: float = 0.8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (isinstance(k, (int, float)) and math.isfinite(k) and 1.0 <= k <= 100.0):
            raise InvalidArgument.of("k", "1 to 100")
        if not (isinstance(window, (int, float)) and math.isfinite(window) and 1.0 <= window <= 3600.0):
            raise InvalidArgument.of("window", "1 to 3600 seconds")
        if not (isinstance(max_reject, (int, float)) and math.isfinite(max_reject) and 0.0 < max_reject <= 1.0):
            raise InvalidArgument.of("max_reject", "above 0, at most 1")
        self._max_reject = float(max_reject)
        self._k = float(k)
        self._slot_len = float(window) / _SLOTS
        self._clock = clock
        self._lock = threading.Lock()
        # [slot, requests, accepts], oldest first.
        self._slots: Deque[List[int]] = deque()
        self._owed = 0.0

    def _advance(self) -> None:
        slot = int(self._clock() // self._slot_len)
        while self._slots and self._slots[0][0] <= slot - _SLOTS:
            self._slots.popleft()
        if not self._slots or self._slots[-1][0] < slot:
            self._slots.append([slot, 0, 0])

    def _counts(self) -> Tuple[int, int]:
        self._advance()
        return sum(s[1] for s in self._slots), sum(s[2] for s in self._slots)

    def _probability(self) -> float:
        requests, accepts = self._counts()
        return min(self._max_reject, max(0.0, (requests - self._k * accepts) / (requests + 1)))

    def allow(self) -> bool:
        """Whether to send a request now. ``False`` refuses it here and counts it as a request
        the backend did not accept; after ``True``, report the answer with :meth:`record`."""
        with self._lock:
            self._owed += self._probability()
            if self._owed < 1.0:
                return True
            self._owed -= 1.0
            self._slots[-1][1] += 1
            return False

    def record(self, accepted: bool) -> None:
        """Counts a request sent, and whether the backend accepted it (a 429, a 503 or
        ``RESOURCE_EXHAUSTED`` is a refusal)."""
        with self._lock:
            self._advance()
            self._slots[-1][1] += 1
            self._slots[-1][2] += 1 if accepted else 0

    def reject_probability(self) -> float:
        """The probability the next request is refused here."""
        with self._lock:
            return self._probability()

    def counts(self) -> Tuple[int, int]:
        """Requests tried and accepted within the window."""
        with self._lock:
            return self._counts()
