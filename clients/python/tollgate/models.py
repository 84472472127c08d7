"""What the admin calls return: groups, their ramps, the node, the status, tokens. Plain
dataclasses, read from the server's answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from .v1 import tollgate_pb2 as pb

PRIORITY_NAMES = {1: "low", 8: "medium", 16: "high"}
RAMP_MODES = ("scheduled", "relaxed", "only_if_used", "go_back_n")
MODES = ("share", "fcfs")


@dataclass(frozen=True)
class Ramp:
    """Numaflow's ramp-up: the group's ceiling grows from ``min`` to ``max`` units/s over
    ``duration_s``. ``mode`` is ``relaxed`` (the default), ``scheduled``, ``only_if_used`` or
    ``go_back_n``."""

    min: float
    max: float
    duration_s: float
    mode: str = "relaxed"
    threshold_pct: float = 50.0
    ramp_down_pct: float = 50.0
    cool_down_s: float = 5.0
    resume_ttl_s: Optional[float] = None
    """``None``: a ramp that went idle starts again at ``min``."""

    @staticmethod
    def from_pb(r: pb.RampSettings) -> "Ramp":
        mode = RAMP_MODES[r.mode - 1] if 1 <= r.mode <= len(RAMP_MODES) else "relaxed"

        def opt(name: str, default: float) -> float:
            return float(getattr(r, name)) if r.HasField(name) else default

        resume = r.resume_ttl_s if r.HasField("resume_ttl_s") else None
        return Ramp(r.min, r.max, r.duration_s, mode, opt("threshold_pct", 50.0), opt("ramp_down_pct", 50.0), opt("cool_down_s", 5.0), resume)

    def to_pb(self) -> pb.RampSettings:
        from .errors import InvalidArgument

        if self.mode not in RAMP_MODES:
            raise InvalidArgument.of("ramp.mode", f"must be one of {', '.join(RAMP_MODES)}, got {self.mode!r}")
        r = pb.RampSettings(min=self.min, max=self.max, duration_s=self.duration_s, mode=f"RAMP_MODE_{self.mode.upper()}")
        for name in ("threshold_pct", "ramp_down_pct", "cool_down_s", "resume_ttl_s"):
            value = getattr(self, name)
            if value is not None:
                setattr(r, name, value)
        return r


@dataclass(frozen=True)
class Group:
    """A group's settings, as the server holds them."""

    name: str
    reserved: float
    """Units/s always available to it."""
    limit: Optional[float]
    """Units/s it never exceeds; ``None``: unlimited."""
    burst: Optional[float]
    """Units it may bank; ``None``: the server's default (one second of its rate)."""
    priority: Union[str, int]
    """``low``, ``medium`` or ``high``, or a level 1 to 16 between them."""
    weight: float
    budget: Optional[float]
    """Units it may consume per ``budget_period``; ``None``: no budget."""
    budget_period: str
    """The window the budget is the quota of: ``total``, ``minute``, ``hour``, ``day``, ``week``
    or ``month``."""
    dropped: str
    """What dropped work does: ``return`` (given back) or ``count``."""
    debt_repay_s: float
    """Over how long a debt is paid back (0: at once, blocking)."""
    reads_writes_apart: bool
    backend_limit: Optional[float]
    background: bool
    shadow: bool = False
    """Shadow mode: decided and counted, never refused; would-be refusals are counted."""
    critical_reserve: float = 0.0
    """The share of the burst normal and sheddable requests leave for critical ones."""
    max_in_flight: Optional[int] = None
    """The most requests in flight at once across all clients; ``None``: no such limit."""
    parent: Optional[str] = None
    """The group it is nested under; ``None``: a group of its own."""
    ramp: Optional[Ramp] = None
    quotas: Dict[str, float] = field(default_factory=dict)
    """Units per window (``minute``, ``hour``, ``day``, ``week``, ``month``, ``total``) for each
    window with a quota, the budget's among them: counts, never overrun; while any is spent the
    group admits nothing, its reservation included."""

    @staticmethod
    def from_pb(info: pb.GroupInfo) -> "Group":
        return Group.of(info.name, info.settings)

    @staticmethod
    def of(name: str, s: pb.GroupSettings) -> "Group":
        return Group(
            name=name,
            reserved=s.reserved,
            limit=s.limit if s.HasField("limit") else None,
            burst=s.burst if s.HasField("burst") else None,
            priority=PRIORITY_NAMES.get(s.priority, s.priority),
            weight=s.weight,
            budget=s.budget if s.HasField("budget") else None,
            budget_period=s.budget_period or "total",
            dropped="count" if s.count_dropped else "return",
            debt_repay_s=s.debt_repay_s if s.HasField("debt_repay_s") else 5.0,
            reads_writes_apart=s.reads_writes_apart,
            backend_limit=s.backend_limit if s.HasField("backend_limit") else None,
            background=s.background,
            shadow=s.shadow,
            critical_reserve=s.critical_reserve,
            max_in_flight=s.max_in_flight if s.HasField("max_in_flight") else None,
            parent=s.parent if s.HasField("parent") else None,
            ramp=Ramp.from_pb(s.ramp) if s.HasField("ramp") and s.ramp.max > 0 else None,
            quotas=dict(s.quotas),
        )


@dataclass(frozen=True)
class Node:
    """The node's settings."""

    capacity: Optional[float]
    """Units/s the backend serves; ``None``: no capacity."""
    mode: str
    """``share`` (by priority, then max-min by weight) or ``fcfs``."""
    slow_start: bool
    shadow: bool = False
    """Every group in shadow mode."""
    throttling: bool = True
    """The one switch: ``False`` while throttling is off for the whole node."""

    @staticmethod
    def from_pb(n: pb.NodeInfo) -> "Node":
        mode = MODES[n.mode] if n.mode < len(MODES) else str(n.mode)
        capacity = n.capacity if n.HasField("capacity") else None
        return Node(capacity, mode, n.slow_start, n.shadow, not n.throttling_off)


@dataclass(frozen=True)
class RateMarks:
    """A consumption rate's low and high water marks and average, units/s."""

    low: float
    high: float
    average: float


@dataclass(frozen=True)
class GroupStatus:
    """A group as the controller sees it now."""

    name: str
    settings: Optional[Group]
    """``None`` for a group seen only through traffic."""
    target: Optional[float]
    """Units/s it is held to; ``None`` when not throttled."""
    admitted: float
    demand: float
    granted: float
    busy: bool
    clients: int
    throttled: float
    unthrottled: float
    consumed_total: float
    admitted_total: int
    throttled_total: int
    waited_total: int
    would_refuse_total: int
    """Requests admitted in shadow mode that would have been refused."""
    budget_exhausted: bool
    ramp_pool: Optional[float]
    headroom: Optional[float]
    last_minute: Optional[RateMarks]
    last_hour: Optional[RateMarks]
    detail: Optional[dict]  # type: ignore[type-arg]
    """What its requests did in detail (``rru``, ``wru``, bytes, CPU, requests), as clients
    reported it; ``None`` when none did."""
    largest_last_minute: float = 0.0
    """The cost of the largest single request its clients admitted over the last minute (0:
    none told)."""
    largest_last_hour: float = 0.0
    """The same over the last hour."""

    @staticmethod
    def from_pb(g: pb.GroupStatus) -> "GroupStatus":
        def marks(m: pb.RateMarks, present: bool) -> Optional[RateMarks]:
            return RateMarks(m.low, m.high, m.average) if present else None

        detail = None
        if g.HasField("detail"):
            d = g.detail
            detail = {n: getattr(d, n) for n in ("rru", "wru", "read_bytes", "write_bytes", "cpu_ms", "read_rpcs", "write_rpcs")}
        return GroupStatus(
            name=g.name,
            settings=Group.of(g.name, g.settings) if g.HasField("settings") else None,
            target=g.target if g.HasField("target") else None,
            admitted=g.admitted,
            demand=g.demand,
            granted=g.granted,
            busy=g.busy,
            clients=g.clients,
            throttled=g.throttled,
            unthrottled=g.unthrottled,
            consumed_total=g.consumed_total,
            admitted_total=g.admitted_total,
            throttled_total=g.throttled_total,
            waited_total=g.waited_total,
            would_refuse_total=g.would_refuse_total,
            budget_exhausted=g.budget_exhausted,
            ramp_pool=g.ramp_pool if g.HasField("ramp_pool") else None,
            headroom=g.headroom if g.HasField("headroom") else None,
            last_minute=marks(g.last_minute, g.HasField("last_minute")),
            last_hour=marks(g.last_hour, g.HasField("last_hour")),
            detail=detail,
            largest_last_minute=g.largest_last_minute,
            largest_last_hour=g.largest_last_hour,
        )


@dataclass(frozen=True)
class BackendStatus:
    """A backend as the controller last heard from it (its reports, :mod:`tollgate.reporter`)."""

    name: str
    zone: str
    utilisation: float
    """1 is at its target."""
    limiting: bool
    """Saturated: it limits the groups that count on it."""
    seen_s: float
    """Seconds since its last report."""
    load: float
    """Units/s of all groups on it."""
    top_groups: List["tuple[str, float]"]
    """The groups loading it most (at most 5) and their units/s, largest first."""
    inert: str
    """Saturated, yet it limits no group, and why; empty otherwise."""

    @staticmethod
    def from_pb(b: pb.BackendStatus) -> "BackendStatus":
        tops = [(g.group, g.units_per_s) for g in b.top_groups]
        return BackendStatus(b.name, b.zone, b.utilisation, b.limiting, b.seen_s, b.load, tops, b.inert)


@dataclass(frozen=True)
class TokenStatus:
    """A client token's marks, as the controller its clients exchange with keeps them."""

    id: str
    label: str
    """Its id, role and name."""
    consumed_total: float
    admitted_total: int
    throttled_total: int
    """Requests its clients refused for want of tokens."""
    last_minute: Optional[RateMarks]
    """Its consumption rate's low and high water marks and average, units/s."""
    last_hour: Optional[RateMarks]
    largest_last_minute: float
    """The cost of its largest single request over the last minute."""
    largest_last_hour: float

    @staticmethod
    def from_pb(t: pb.TokenStatus) -> "TokenStatus":
        def marks(m: pb.RateMarks, present: bool) -> Optional[RateMarks]:
            return RateMarks(m.low, m.high, m.average) if present else None

        return TokenStatus(
            t.id,
            t.label,
            t.consumed_total,
            t.admitted_total,
            t.throttled_total,
            marks(t.last_minute, t.HasField("last_minute")),
            marks(t.last_hour, t.HasField("last_hour")),
            t.largest_last_minute,
            t.largest_last_hour,
        )


@dataclass(frozen=True)
class Status:
    """The controller's status: the node, its role, and every group."""

    capacity: Optional[float]
    mode: str
    role: str
    """``standalone``, ``leader`` or ``follower``."""
    leader: Optional[str]
    region: Optional[str]
    """The region the controller serves (``tollgate server --region``); ``None`` on the global tier."""
    learning: bool
    """In the first lease after start, relearning what clients hold."""
    exchanges: int
    clients: int
    clients_lapsed: int
    backends: int
    cost_model: str
    unit: str
    warnings: List[str]
    groups: List[GroupStatus] = field(default_factory=list)
    backend_detail: List[BackendStatus] = field(default_factory=list)
    """Backends one by one, the most utilised first (at most 100; ``backends`` counts all)."""
    tokens: List[TokenStatus] = field(default_factory=list)
    """With authentication: the client tokens whose clients exchange with this controller,
    the most consumed first (at most 100)."""

    def group(self, name: str) -> Optional[GroupStatus]:
        """The named group's status, if the controller knows it."""
        return next((g for g in self.groups if g.name == name), None)


@dataclass(frozen=True)
class Token:
    """A credential, as listed (never its secret)."""

    id: str
    role: str
    """``admin``, ``client``, ``backend`` or ``reader``."""
    groups: str
    """For a client token: the group patterns it may exchange for (empty: every group)."""
    unthrottled: bool
    created_unix_ms: int
    expires_unix_ms: int
    """0: never."""
    name: str
    default_group: str = ""
    """For a client token: where work that names no group goes (empty: none)."""

    @staticmethod
    def from_pb(t: pb.TokenInfo) -> "Token":
        return Token(t.id, t.role, t.groups, t.unthrottled, t.created_unix_ms, t.expires_unix_ms, t.name, t.default_group)


@dataclass(frozen=True)
class NewToken:
    """A token just created: its secret, shown this once, and what it is."""

    token: str
    info: Token


@dataclass(frozen=True)
class UsageRecord:
    """A group's metering at the end of a minute: totals since the group was made."""

    group: str
    minute_unix_ms: int
    """The minute's start, Unix milliseconds."""
    consumed_total: float
    """Units consumed."""
    admitted_total: int
    throttled_total: int
    would_refuse_total: int
    """Requests admitted in shadow mode that would have been refused."""

    @staticmethod
    def from_pb(r: pb.UsageRecord) -> "UsageRecord":
        return UsageRecord(r.group, r.minute_unix_ms, r.consumed_total, r.admitted_total, r.throttled_total, r.would_refuse_total)


@dataclass(frozen=True)
class AuditEntry:
    """One change to the settings, as the audit log keeps it."""

    at_unix_ms: int
    who: str
    """The caller: ``grpc ADDRESS`` or ``http ADDRESS``, after the credential when
    authentication is on."""
    what: str
    """``group.put NAME``, ``group.drop NAME``, ``node.set``, ``rls.set``, ``token.create ID``
    or ``token.revoke ID``."""
    before: Optional[str]
    """The value before, as JSON; ``None`` where there was none."""
    after: Optional[str]

    @staticmethod
    def from_pb(e: pb.AuditEntry) -> "AuditEntry":
        before = e.before if e.HasField("before") else None
        after = e.after if e.HasField("after") else None
        return AuditEntry(e.at_unix_ms, e.who, e.what, before, after)


@dataclass(frozen=True)
class Imported:
    """What importing another limiter's limits file did (or, on a dry run, would do)."""

    notes: List[Tuple[int, str]]
    """``(line, note)``: what the file holds that is read in a way worth knowing."""
    changes: List[str]
    """``create group NAME: …``, ``keep …``, ``change … (was …)``, a line per domain the file
    answers, and the rules it adds: what ``tollgate import`` prints."""
    applied: bool
    """Whether anything was written (``False`` on a dry run)."""
    summary: str
    """``imported: N groups and patterns written, …``; empty on a dry run."""

    @staticmethod
    def from_pb(r: pb.ImportLimitsResponse) -> "Imported":
        return Imported([(n.line, n.note) for n in r.notes], list(r.changes), r.applied, r.summary)
