"""Group settings given to a limiter itself (the embedded limiter, store mode), checked: each
error names the setting as ``groups.NAME.SETTING`` and the rule."""

from __future__ import annotations

import calendar
import datetime
import re
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, TypeVar

from ._core import check_group
from .cost import check_cost
from .errors import InvalidArgument

_NAMED = ("minute", "hour", "day", "week", "month", "total")
_SECONDS = re.compile(r"^([1-9][0-9]{0,7})s$")
_FROM_FIRST = re.compile(r"^([1-9][0-9]{0,7})s-from-first$")
_WINDOW_SECONDS_MAX = 366 * 86_400
_DAY_MS = 86_400_000


def number(field: str, value: Any, low: float, high: float) -> float:
    """``value`` as a float from ``low`` to ``high``, else :class:`InvalidArgument`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidArgument.of(field, f"must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


class Settings:
    """One group's settings, checked against what ``mode`` takes (``accepted``) and refuses
    (``refused``, each with the reason): its limit (``None``: not throttled), request classes'
    reserve, shadow mode and what dropped work does."""

    def __init__(
        self, name: str, settings: Mapping[str, Any], mode: str, accepted: Sequence[str], refused: Mapping[str, str]
    ) -> None:
        if not isinstance(settings, Mapping):
            raise InvalidArgument.of(f"groups.{name}", f"must be a mapping of settings, got {settings!r}")
        self.field = f"groups.{name}."
        for key in settings:
            if key in refused:
                raise InvalidArgument.of(self.field + key, f"not in {mode}: {refused[key]}")
            if key not in accepted:
                raise InvalidArgument.of(self.field + key, f"no such setting; {mode} takes {', '.join(accepted)}")
        limit = settings.get("limit")
        self.limit: Optional[float] = None if limit is None else check_cost(self.field + "limit", limit)
        self.critical_reserve = number(self.field + "critical_reserve", settings.get("critical_reserve", 0.0), 0.0, 0.9)
        self.shadow = settings.get("shadow", False)
        if not isinstance(self.shadow, bool):
            raise InvalidArgument.of(self.field + "shadow", f"must be true or false, got {self.shadow!r}")
        dropped = settings.get("dropped", "return")
        if dropped not in ("return", "count"):
            raise InvalidArgument.of(self.field + "dropped", f"must be return or count, got {dropped!r}")
        self.count_dropped = dropped == "count"


G = TypeVar("G", bound=Settings)


def groups_of(groups: Any, make: Callable[[str, Mapping[str, Any]], G]) -> Dict[str, G]:
    """Every group's settings, each name and its settings checked."""
    if not isinstance(groups, Mapping):
        raise InvalidArgument.of("groups", f"must map group names to their settings, got {groups!r}")
    checked: Dict[str, G] = {}
    for name, settings in groups.items():
        check_group(name)
        checked[name] = make(name, settings)
    return checked


class Window:
    """A quota's window, as the Rust model names and places it: a named UTC one, N seconds one
    after another from the Unix epoch (``"90s"``), or, where ``from_first`` allows it, N
    seconds from the first request (``"90s-from-first"``, placed by whoever counts it)."""

    def __init__(self, field: str, name: str, from_first: bool = False) -> None:
        self.name = name
        seconds = _SECONDS.match(name) or (_FROM_FIRST.match(name) if from_first else None)
        if name not in _NAMED and not seconds:
            hint = "" if from_first or not name.endswith("-from-first") else " (a window from the first request needs a server or store mode)"
            forms = "Ns or Ns-from-first" if from_first else "Ns"
            raise InvalidArgument.of(field, f"must be minute, hour, day, week, month, total or {forms}{hint}, got {name!r}")
        self.span_ms = int(seconds.group(1)) * 1000 if seconds else 0
        self.from_first = name.endswith("-from-first")
        if seconds and not 1 <= int(seconds.group(1)) <= _WINDOW_SECONDS_MAX:
            raise InvalidArgument.of(field, f"a window of seconds must be 1 to {_WINDOW_SECONDS_MAX}, got {name!r}")

    def start(self, ms: int) -> int:
        """When the window holding ``ms`` (Unix milliseconds) began; 0 for ``total``."""
        if self.span_ms:
            return ms // self.span_ms * self.span_ms
        if self.name == "total":
            return 0
        if self.name in ("minute", "hour"):
            step = 60_000 if self.name == "minute" else 3_600_000
            return ms // step * step
        day = ms // _DAY_MS
        if self.name == "day":
            return day * _DAY_MS
        if self.name == "week":
            return (day - (day + 3) % 7) * _DAY_MS  # 1970-01-01 was a Thursday
        d = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
        return calendar.timegm((d.year, d.month, 1, 0, 0, 0)) * 1000

    def end(self, ms: int) -> Optional[int]:
        """When the window holding ``ms`` ends; ``None`` for ``total``."""
        start = self.start(ms)
        if self.span_ms:
            return start + self.span_ms
        spans = {"minute": 60_000, "hour": 3_600_000, "day": _DAY_MS, "week": 7 * _DAY_MS}
        if self.name in spans:
            return start + spans[self.name]
        if self.name == "total":
            return None
        d = datetime.datetime.fromtimestamp(start / 1000, datetime.timezone.utc)
        year, month = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
        return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000
