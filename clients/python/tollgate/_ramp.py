"""Ramp-up as the Rust model runs it (``tollgate_model::ramp``): a group's pool grows from
``min`` to ``max`` units per one-second epoch by ``slope = (max - min) / duration_s``,
recomputed at the first call of an epoch from the last epoch that had a call, in Numaflow's
four modes (``scheduled``, ``relaxed``, ``only_if_used``, ``go_back_n``). The table the Rust
code computes (tests/shared_cases.json, ``ramp``) keeps the two in step."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from ._local import number
from .errors import InvalidArgument

MODES = ("scheduled", "relaxed", "only_if_used", "go_back_n")
_RATE_MAX = 1e15
_DURATION_MAX_S = 10 * 365 * 86_400.0


class RampSettings:
    """A ramp's settings, checked as the server checks them (each error names
    ``groups.NAME.ramp.FIELD``)."""

    def __init__(self, field: str, ramp: Any) -> None:
        if not isinstance(ramp, Mapping):
            raise InvalidArgument.of(field, f"must be a mapping of min, max, duration_s and the rest, got {ramp!r}")
        known = ("min", "max", "duration_s", "mode", "threshold_pct", "ramp_down_pct", "cool_down_s", "resume_ttl_s")
        for key in ramp:
            if key not in known:
                raise InvalidArgument.of(f"{field}.{key}", f"no such setting; a ramp takes {', '.join(known)}")
        for key in ("min", "max", "duration_s"):
            if key not in ramp:
                raise InvalidArgument.of(f"{field}.{key}", "is needed")
        self.min = number(f"{field}.min", ramp["min"], 0.0, _RATE_MAX)
        self.max = number(f"{field}.max", ramp["max"], 0.0, _RATE_MAX)
        if self.min > self.max:
            raise InvalidArgument.of(f"{field}.min", f"must not exceed {field}.max ({self.min:g} > {self.max:g})")
        self.duration_s = number(f"{field}.duration_s", ramp["duration_s"], 0.0, _DURATION_MAX_S)
        if self.duration_s <= 0:
            raise InvalidArgument.of(f"{field}.duration_s", "must be above 0")
        self.mode = ramp.get("mode", "relaxed")
        if self.mode not in MODES:
            raise InvalidArgument.of(f"{field}.mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.threshold_pct = number(f"{field}.threshold_pct", ramp.get("threshold_pct", 50.0), 0.0, 100.0)
        if self.threshold_pct <= 0:
            raise InvalidArgument.of(f"{field}.threshold_pct", "must be above 0 and at most 100, got 0")
        self.ramp_down_pct = number(f"{field}.ramp_down_pct", ramp.get("ramp_down_pct", 50.0), 0.0, 100.0)
        self.cool_down_s = number(f"{field}.cool_down_s", ramp.get("cool_down_s", 5.0), 0.0, _DURATION_MAX_S)
        if self.mode == "go_back_n" and self.cool_down_s < 1:
            raise InvalidArgument.of(
                f"{field}.cool_down_s", f"must be at least 1 in go_back_n mode (below it the pool never grows), got {self.cool_down_s:g}"
            )
        ttl = ramp.get("resume_ttl_s")
        self.resume_ttl_s: Optional[float] = None if ttl is None else number(f"{field}.resume_ttl_s", ttl, 0.0, _DURATION_MAX_S)
        if self.resume_ttl_s == 0:
            raise InvalidArgument.of(f"{field}.resume_ttl_s", "must be above 0")


class Ramp:
    """A ramp's state: :meth:`at_epoch` on every call, :meth:`use_units` with what each call
    takes. The value is kept fractional; the pool is its whole part, within ``[min, max]``."""

    def __init__(self, settings: RampSettings, resume_at: Optional[float] = None) -> None:
        self.settings = settings
        self.slope = (settings.max - settings.min) / max(settings.duration_s, 1e-9)
        start = settings.min if resume_at is None else resume_at
        self.value = min(max(start, settings.min), settings.max)
        self.last_epoch: Optional[int] = None
        self.used = 0.0

    def pool(self) -> int:
        return int(self.value)

    def at_epoch(self, epoch: int) -> int:
        """A call at ``epoch`` (whole seconds): the pool for the epoch, recomputed at its
        first call from the last epoch that had one."""
        if self.last_epoch is None:
            self.last_epoch, self.used = epoch, 0.0
            return self.pool()
        if epoch <= self.last_epoch:
            return self.pool()
        s = self.settings
        since = float(epoch - self.last_epoch)
        pool = self.pool()
        reached = (100.0 if pool == 0 else self.used / pool * 100.0) >= s.threshold_pct
        if s.mode == "scheduled":
            value = self.value + self.slope * since
        elif s.mode == "relaxed":
            value = self.value + self.slope
        elif s.mode == "only_if_used":
            value = self.value + self.slope if reached else self.value
        elif since > math.trunc(s.cool_down_s):
            value = self.value - s.ramp_down_pct / 100.0 * self.slope * (since - 1.0)
        else:
            value = self.value + self.slope if reached else self.value - self.slope
        self.value = min(max(value, s.min), s.max)
        self.last_epoch, self.used = epoch, 0.0
        return self.pool()

    def use_units(self, units: float) -> None:
        """Counts ``units`` as used in the current epoch (negative to give them back)."""
        self.used = max(self.used + units, 0.0)
