"""Group settings given to a limiter itself (the embedded limiter, store mode), checked: each
error names the setting as ``groups.NAME.SETTING`` and the rule."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, TypeVar

from ._core import check_group
from .cost import check_cost
from .errors import InvalidArgument


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
