"""Cost models: what a request did, priced in units, by the same formulas as the Rust client.

Every quota in Tollgate is in abstract units. A :class:`CostModel` turns a :class:`Usage` (what
one operation did) into units:

========== ================================================ =========================================
model      read                                             write
========== ================================================ =========================================
count      1 per request (or the units given)               the same
fdb        4096 × max(1, ⌈bytes/4096⌉)                      fungibility (4) × the same, truncated
ru         0.125 + 0.5 × 0.7 + bytes/65536 + cpu_ms/3       (1 + 1 × 0.7 + bytes/1024) × replicas
couchbase  ⌈bytes/4096⌉                                     ⌈bytes/1024⌉, × 2 when durable
linear     base + bytes × per-byte + cpu_ms × per-ms        the same, with the write coefficients
========== ================================================ =========================================

A read's size and CPU are known only once it ran: :meth:`CostModel.upfront` prices what is
known before (what :meth:`~tollgate.Limiter.try_acquire_usage` admits on), and
:meth:`~tollgate.Permit.settle_usage` settles the rest afterwards.

>>> from tollgate.cost import CostModel, Usage
>>> CostModel.fdb().cost(Usage.read(10_000).with_cpu_ms(3))
12288.0
>>> CostModel.couchbase().cost(Usage.write(1025, durable=True))
4.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Tuple

from .errors import InvalidArgument

FDB_PAGE_BYTES = 4096
"""FoundationDB's page: its costs are whole pages of this many bytes."""
COUCHBASE_READ_UNIT_BYTES = 4096
"""Couchbase's read unit, in bytes."""
COUCHBASE_WRITE_UNIT_BYTES = 1024
"""Couchbase's write unit, in bytes."""

_RU_DEFAULTS: Dict[str, float] = {
    "read_base": 0.125,
    "read_per_batch": 0.5,
    "read_per_byte": 1.0 / 65536.0,
    "read_per_cpu_ms": 1.0 / 3.0,
    "write_base": 1.0,
    "write_per_batch": 1.0,
    "write_per_byte": 1.0 / 1024.0,
    "batch_proportion": 0.7,
}
_LINEAR_KEYS = ("read_base", "read_per_byte", "write_base", "write_per_byte", "per_cpu_ms")
_MODELS = ("count", "fdb", "ru", "couchbase", "linear")
_UNITS = {
    "count": "requests",
    "fdb": "bytes",
    "ru": "request units",
    "couchbase": "read and write units",
    "linear": "calibrated units",
}


def check_cost(name: str, value: float) -> float:
    """``value`` as a float when it is finite and not negative; else :class:`InvalidArgument`
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument.of(name, f"must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise InvalidArgument.of(name, f"must be a finite number, got {v}")
    if v < 0:
        raise InvalidArgument.of(name, f"must not be negative, got {v}")
    return v


@dataclass(frozen=True)
class Usage:
    """What one operation did (or is expected to do)."""

    kind: str = "read"
    """``"read"`` or ``"write"``."""
    bytes: int = 0
    """Bytes read (a read) or written (a write)."""
    cpu_ms: float = 0.0
    """CPU milliseconds spent serving it (the ``ru`` model charges it on reads)."""
    replicas: int = 1
    """Replicas a write goes to (``ru`` multiplies by it); at least 1."""
    durable: bool = False
    """A durable write (``couchbase`` charges it twice)."""
    units: Optional[float] = None
    """Units the caller priced itself; when set, every model takes them as they are."""

    @staticmethod
    def read(bytes: int = 0, *, cpu_ms: float = 0.0) -> "Usage":
        """A read of ``bytes`` bytes."""
        return Usage("read", bytes, cpu_ms)

    @staticmethod
    def write(bytes: int = 0, *, replicas: int = 1, durable: bool = False) -> "Usage":
        """A write of ``bytes`` bytes to ``replicas`` replicas."""
        return Usage("write", bytes, 0.0, replicas, durable)

    @staticmethod
    def of_units(units: float) -> "Usage":
        """A request the caller has priced itself at ``units``."""
        return Usage(units=units)

    def with_cpu_ms(self, cpu_ms: float) -> "Usage":
        """The same, having used ``cpu_ms`` milliseconds of CPU."""
        return replace(self, cpu_ms=cpu_ms)

    def with_replicas(self, replicas: int) -> "Usage":
        """The same, written to ``replicas`` replicas."""
        return replace(self, replicas=replicas)


@dataclass
class Consumption:
    """What requests did, in detail (TiDB's consumption): read and write request units, bytes,
    CPU milliseconds and requests. The limiter reports it to the server, which sums it per
    group (:attr:`tollgate.models.GroupStatus.detail`)."""

    rru: float = 0.0
    wru: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    cpu_ms: float = 0.0
    read_rpcs: float = 0.0
    write_rpcs: float = 0.0

    NAMES = ("rru", "wru", "read_bytes", "write_bytes", "cpu_ms", "read_rpcs", "write_rpcs")

    @staticmethod
    def of(model: "CostModel", usage: Usage) -> "Consumption":
        """One request that did ``usage``, priced by ``model``."""
        units = model.cost(usage)
        if usage.kind == "read":
            return Consumption(rru=units, read_bytes=float(usage.bytes), cpu_ms=usage.cpu_ms, read_rpcs=1.0)
        return Consumption(wru=units, write_bytes=float(usage.bytes), cpu_ms=usage.cpu_ms, write_rpcs=1.0)

    def values(self) -> Tuple[float, ...]:
        """The values, in the order of :attr:`NAMES`."""
        return tuple(getattr(self, n) for n in self.NAMES)

    def add(self, other: "Consumption") -> None:
        """Adds ``other`` in."""
        for n in self.NAMES:
            setattr(self, n, getattr(self, n) + getattr(other, n))

    def since(self, earlier: "Consumption") -> "Consumption":
        """What was added since ``earlier`` (never negative)."""
        return Consumption(*(max(a - b, 0.0) for a, b in zip(self.values(), earlier.values())))

    def is_zero(self) -> bool:
        """Nothing at all."""
        return all(v == 0.0 for v in self.values())


@dataclass(frozen=True)
class CostModel:
    """How requests are priced in units: :meth:`count` (the default), :meth:`fdb`, :meth:`ru`,
    :meth:`couchbase` or :meth:`linear`. Build one with those; the fields are for reading."""

    name: str = "count"
    """``count``, ``fdb``, ``ru``, ``couchbase`` or ``linear``, as a settings file names it."""
    coefficients: Dict[str, float] = field(default_factory=dict)
    """The model's coefficients (``fungibility`` for ``fdb``; TiDB's for ``ru``; the user's for
    ``linear``)."""

    def __post_init__(self) -> None:
        if self.name not in _MODELS:
            raise InvalidArgument.of("cost_model", f"must be one of {', '.join(_MODELS)}, got {self.name!r}")
        for key, value in self.coefficients.items():
            check_cost(key, value)
        if self.name == "fdb" and self.coefficients.get("fungibility", 1.0) == 0:
            raise InvalidArgument.of("fungibility", "must be above 0")

    @staticmethod
    def count() -> "CostModel":
        """One unit per request, or the units given."""
        return CostModel("count")

    @staticmethod
    def fdb(fungibility: float = 4.0) -> "CostModel":
        """FoundationDB's: bytes rounded up to whole 4 KiB pages; a write costs ``fungibility``
        reads of the same size."""
        return CostModel("fdb", {"fungibility": fungibility})

    @staticmethod
    def ru(**coefficients: float) -> "CostModel":
        """TiDB's request units; any of its coefficients (``read_base``, ``read_per_batch``,
        ``read_per_byte``, ``read_per_cpu_ms``, ``write_base``, ``write_per_batch``,
        ``write_per_byte``, ``batch_proportion``) may be given, the rest are TiDB's defaults."""
        for key in coefficients:
            if key not in _RU_DEFAULTS:
                raise InvalidArgument.of(key, f"unknown coefficient; expected one of {', '.join(_RU_DEFAULTS)}")
        return CostModel("ru", {**_RU_DEFAULTS, **coefficients})

    @staticmethod
    def couchbase() -> "CostModel":
        """Couchbase's read units (4 KiB) and write units (1 KiB, twice when durable)."""
        return CostModel("couchbase")

    @staticmethod
    def linear(**coefficients: float) -> "CostModel":
        """``base + bytes × per_byte + cpu_ms × per_cpu_ms`` per kind, with the user's
        coefficients (``read_base``, ``read_per_byte``, ``write_base``, ``write_per_byte``,
        ``per_cpu_ms``; each 0 unless given)."""
        for key in coefficients:
            if key not in _LINEAR_KEYS:
                raise InvalidArgument.of(key, f"unknown coefficient; expected one of {', '.join(_LINEAR_KEYS)}")
        return CostModel("linear", {**dict.fromkeys(_LINEAR_KEYS, 0.0), **coefficients})

    @property
    def unit(self) -> str:
        """What one unit counts under this model, in words for people."""
        return _UNITS[self.name]

    def cost(self, usage: Usage) -> float:
        """The full cost of what ``usage`` did."""
        if usage.units is not None:
            return check_cost("units", usage.units)
        check_cost("cpu_ms", usage.cpu_ms)
        if usage.kind not in ("read", "write"):
            raise InvalidArgument.of("kind", f'must be "read" or "write", got {usage.kind!r}')
        if usage.replicas < 1:
            raise InvalidArgument.of("replicas", "must be at least 1")
        if isinstance(usage.bytes, bool) or not isinstance(usage.bytes, int) or usage.bytes < 0:
            raise InvalidArgument.of("bytes", f"must be a whole number from 0, got {usage.bytes!r}")
        c, b, read = self.coefficients, usage.bytes, usage.kind == "read"
        if self.name == "count":
            units = 1.0
        elif self.name == "fdb":
            pages = float(max(-(-b // FDB_PAGE_BYTES), 1) * FDB_PAGE_BYTES)
            # FoundationDB keeps costs as integers: the product is truncated.
            units = pages if read else float(math.trunc(c["fungibility"] * pages))
        elif self.name == "ru":
            if read:
                units = (
                    c["read_base"]
                    + c["read_per_batch"] * c["batch_proportion"]
                    + b * c["read_per_byte"]
                    + usage.cpu_ms * c["read_per_cpu_ms"]
                )
            else:
                per = c["write_base"] + c["write_per_batch"] * c["batch_proportion"] + b * c["write_per_byte"]
                units = per * usage.replicas
        elif self.name == "couchbase":
            if read:
                units = float(-(-b // COUCHBASE_READ_UNIT_BYTES))
            else:
                units = float(-(-b // COUCHBASE_WRITE_UNIT_BYTES)) * (2.0 if usage.durable else 1.0)
        else:
            base, per_byte = (c["read_base"], c["read_per_byte"]) if read else (c["write_base"], c["write_per_byte"])
            units = base + b * per_byte + usage.cpu_ms * c["per_cpu_ms"]
        return check_cost("cost", units)

    def upfront(self, usage: Usage) -> float:
        """The part of the cost known before the operation runs: what admission charges. A
        write is known in full; a read is charged what a read of nothing costs (Couchbase's at
        least 1)."""
        if usage.units is not None or usage.kind == "write":
            return self.cost(usage)
        units = self.cost(replace(usage, bytes=0, cpu_ms=0.0))
        return max(units, 1.0) if self.name == "couchbase" else units
