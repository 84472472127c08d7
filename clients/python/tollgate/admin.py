"""The admin calls: groups (ramps included), the node, status, tokens, usage, the audit log, the
RLS rules and the trace, with typed results (:mod:`tollgate.models`)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, Generator, Iterator, List, Optional, Tuple, TypeVar, Union

import grpc

from . import _connect
from ._fields import FIELDS
from .errors import InvalidArgument, from_rpc
from .models import MODES, AuditEntry, BackendStatus, Group, GroupStatus, Imported, NewToken, Node, Ramp, Status, Token, TokenStatus, UsageRecord
from .v1 import tollgate_pb2 as pb
from .v1 import tollgate_pb2_grpc as rpc

Settings = Dict[str, Any]
ROLES = ("admin", "client", "backend", "reader", "region")

_PRIORITIES = {"low": 1, "medium": 8, "high": 16}
WINDOWS = ("minute", "hour", "day", "week", "month", "total")
# The longest window of a number of seconds (a leap year), as the server takes it.
WINDOW_SECONDS_MAX = 366 * 86_400


def _window(window: Any) -> bool:
    """Whether ``window`` names a quota's window: a named one, ``"90s"`` (windows of 90 s from
    the Unix epoch) or ``"90s-from-first"`` (90 s from the first request)."""
    if not isinstance(window, str):
        return False
    if window in WINDOWS:
        return True
    digits = window[: -len("s-from-first")] if window.endswith("s-from-first") else window[:-1] if window.endswith("s") else ""
    return digits.isdigit() and 1 <= int(digits) <= WINDOW_SECONDS_MAX
_NAMES = {1: "low", 8: "medium", 16: "high"}
_KEYS = ", ".join(FIELDS)


def _whole_range(key: str) -> "tuple[int, int]":
    """The least and greatest whole number the server takes for ``key`` (its declaration)."""
    _, low, high, _ = FIELDS[key]
    assert low is not None and high is not None
    return int(low), int(high)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument.of(key, f"must be a number, got {value!r}")
    return float(value)


def _patch(settings: Settings) -> pb.GroupPatch:
    """A patch from keyword settings, as `tollgate group` takes them; ``None`` clears what
    may be cleared."""
    p = pb.GroupPatch()
    for key, value in settings.items():
        if key == "ramp":
            if value is None:
                p.clear_ramp = True
            elif isinstance(value, Ramp):
                p.ramp.CopyFrom(value.to_pb())
            else:
                raise InvalidArgument.of("ramp", f"must be a tollgate.Ramp or None, got {value!r}")
        elif key == "limit":
            if value is None or value == "unlimited":
                p.unlimited = True
            else:
                p.limit = _number(key, value)
        elif key == "priority":
            level = _PRIORITIES.get(value, value) if isinstance(value, str) else value
            low, high = _whole_range("priority")
            if not isinstance(level, int) or not low <= level <= high:
                raise InvalidArgument.of("priority", f"must be low, medium, high or {low} to {high}, got {value!r}")
            p.priority = level
        elif key == "budget_period":
            if value not in WINDOWS:
                raise InvalidArgument.of("budget_period", f"must be one of {', '.join(WINDOWS)}, got {value!r}")
            p.budget_period = value
        elif key == "quotas":
            if not isinstance(value, dict):
                raise InvalidArgument.of("quotas", f"must be a dict of window to units, got {value!r}")
            for window, units in value.items():
                if not _window(window):
                    raise InvalidArgument.of(
                        f"quotas.{window}",
                        f"must be one of {', '.join(WINDOWS)}, a number of seconds such as 90s, or 90s-from-first",
                    )
                # None removes the window's quota (0 on the wire).
                p.quotas[window] = 0.0 if units is None else _number(f"quotas.{window}", units)
        elif key == "dropped":
            if value not in ("count", "return"):
                raise InvalidArgument.of("dropped", f'must be "count" or "return", got {value!r}')
            p.count_dropped = value == "count"
        elif key in ("burst", "budget", "backend_limit"):
            if value is None:
                setattr(p, f"clear_{key}", True)
            else:
                setattr(p, key, _number(key, value))
        elif key == "parent":
            if value is None:
                p.clear_parent = True
            elif isinstance(value, str) and value:
                p.parent = value
            else:
                raise InvalidArgument.of(key, f"must be a group's name or None, got {value!r}")
        elif key == "max_in_flight":
            if value is None:
                p.clear_max_in_flight = True
            elif isinstance(value, bool) or not isinstance(value, int) or not _whole_range(key)[0] <= value <= _whole_range(key)[1]:
                low, high = _whole_range(key)
                raise InvalidArgument.of(key, f"must be a whole number from {low} to {high} or None, got {value!r}")
            else:
                p.max_in_flight = value
        elif key in ("reserved", "weight", "debt_repay_s", "critical_reserve"):
            setattr(p, key, _number(key, value))
        elif key in ("reads_writes_apart", "background", "shadow"):
            if not isinstance(value, bool):
                raise InvalidArgument.of(key, f"must be True or False, got {value!r}")
            setattr(p, key, value)
        else:
            raise InvalidArgument.of(key, f"unknown setting; expected one of {_KEYS}")
    return p


# Each call is written once, as a plan: a generator that yields ``(rpc method, request)``, is
# sent each answer, and returns the call's result. Admin runs plans with blocking calls,
# AsyncAdmin with awaited ones, so the two check and answer exactly alike.
R = TypeVar("R")
Plan = Generator[Tuple[str, Any], Any, R]


def _plan__put(name: str, mode: pb.PutMode, settings: Settings) -> "Plan[Group]":
    request = pb.PutGroupRequest(name=name, patch=_patch(settings), mode=mode)
    return Group.from_pb((yield ("PutGroup", request)))


def _plan_create_group(name: str, **settings: Any) -> "Plan[Group]":
    return (yield from _plan__put(name, pb.PUT_MODE_CREATE, settings))


def _plan_alter_group(name: str, **settings: Any) -> "Plan[Group]":
    return (yield from _plan__put(name, pb.PUT_MODE_ALTER, settings))


def _plan_put_group(name: str, **settings: Any) -> "Plan[Group]":
    return (yield from _plan__put(name, pb.PUT_MODE_UPSERT, settings))


def _plan_drop_group(name: str, *, if_exists: bool = False) -> "Plan[bool]":
    answer = (yield ("DropGroup", pb.DropGroupRequest(name=name, if_exists=if_exists)))
    return bool(answer.existed)


def _plan_get_group(name: str) -> "Plan[Group]":
    return Group.from_pb((yield ("GetGroup", pb.GetGroupRequest(name=name))))


def _plan_list_groups() -> "Plan[List[Group]]":
    out: List[Group] = []
    token = ""
    while True:
        page = (yield ("ListGroups", pb.ListGroupsRequest(page_token=token)))
        out.extend(Group.from_pb(g) for g in page.groups)
        token = page.next_page_token
        if not token:
            return out


def _plan_get_node() -> "Plan[Node]":
    return Node.from_pb((yield ("GetNode", pb.GetNodeRequest())))


def _plan_set_capacity(capacity: Optional[Union[int, float]]) -> "Plan[Node]":
    request = pb.SetCapacityRequest()
    if capacity is not None:
        request.capacity = _number("capacity", capacity)
    return Node.from_pb((yield ("SetCapacity", request)))


def _plan_set_mode(mode: str) -> "Plan[Node]":
    if mode not in MODES:
        raise InvalidArgument.of("mode", f"must be share or fcfs, got {mode!r}")
    return Node.from_pb((yield ("SetMode", pb.SetModeRequest(mode=f"ALLOCATION_MODE_{mode.upper()}"))))


def _plan_set_slow_start(on: bool) -> "Plan[Node]":
    if not isinstance(on, bool):
        raise InvalidArgument.of("on", f"must be True or False, got {on!r}")
    return Node.from_pb((yield ("SetSlowStart", pb.SetSlowStartRequest(on=on))))


def _plan_set_shadow(on: bool) -> "Plan[Node]":
    if not isinstance(on, bool):
        raise InvalidArgument.of("on", f"must be True or False, got {on!r}")
    return Node.from_pb((yield ("SetShadow", pb.SetShadowRequest(on=on))))


def _plan_set_throttling(on: bool) -> "Plan[Node]":
    if not isinstance(on, bool):
        raise InvalidArgument.of("on", f"must be True or False, got {on!r}")
    return Node.from_pb((yield ("SetThrottling", pb.SetThrottlingRequest(on=on))))


def _plan_status() -> "Plan[Status]":
    groups: List[GroupStatus] = []
    token = ""
    while True:
        answer = (yield ("Status", pb.StatusRequest(page_token=token)))
        groups.extend(GroupStatus.from_pb(g) for g in answer.groups)
        token = answer.next_page_token
        if not token:
            break
    return Status(
        capacity=answer.capacity if answer.HasField("capacity") else None,
        mode=MODES[answer.mode] if answer.mode < len(MODES) else str(answer.mode),
        role=answer.role,
        leader=answer.leader if answer.HasField("leader") else None,
        region=answer.region if answer.HasField("region") else None,
        learning=answer.learning,
        exchanges=answer.exchanges,
        clients=answer.clients,
        clients_lapsed=answer.clients_lapsed,
        backends=answer.backends,
        cost_model=answer.cost_model,
        unit=answer.unit,
        warnings=list(answer.warnings),
        groups=groups,
        backend_detail=[BackendStatus.from_pb(b) for b in answer.backend_detail],
        tokens=[TokenStatus.from_pb(t) for t in answer.tokens],
    )


def _plan_create_token(
    role: str,
    *,
    groups: str = "",
    unthrottled: bool = False,
    expires_in_s: int = 0,
    name: str = "",
    default_group: str = "",
    token: str = "",
) -> "Plan[NewToken]":
    if role not in ROLES:
        raise InvalidArgument.of("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int) or expires_in_s < 0:
        raise InvalidArgument.of("expires_in_s", f"must be a whole number of seconds from 0, got {expires_in_s!r}")
    request = pb.CreateTokenRequest(
        role=role, groups=groups, unthrottled=unthrottled, expires_in_s=expires_in_s, name=name, default_group=default_group, token=token
    )
    answer = (yield ("CreateToken", request))
    # A token given is not sent back: it is the one given.
    return NewToken(answer.token or token, Token.from_pb(answer.info))


def _plan_list_tokens() -> "Plan[List[Token]]":
    return [Token.from_pb(t) for t in (yield ("ListTokens", pb.ListTokensRequest())).tokens]


def _plan_revoke_token(id: str) -> "Plan[Token]":
    return Token.from_pb((yield ("RevokeToken", pb.RevokeTokenRequest(id=id))))


def _plan_set_token_group(id: str, default_group: str) -> "Plan[Token]":
    return Token.from_pb((yield ("SetTokenGroup", pb.SetTokenGroupRequest(id=id, default_group=default_group))))


def _plan_usage(group: str = "", *, since_unix_ms: int = 0, limit: int = 0) -> "Plan[List[UsageRecord]]":
    request = pb.UsageRequest(
        group=group, since_unix_ms=_whole("since_unix_ms", since_unix_ms, 0, 2**63 - 1), limit=_whole("limit", limit, 0, 100_000)
    )
    return [UsageRecord.from_pb(r) for r in (yield ("Usage", request)).records]


def _plan_audit(*, since_unix_ms: int = 0, limit: int = 0) -> "Plan[List[AuditEntry]]":
    request = pb.AuditRequest(since_unix_ms=_whole("since_unix_ms", since_unix_ms, 0, 2**63 - 1), limit=_whole("limit", limit, 0, 10_000))
    return [AuditEntry.from_pb(e) for e in (yield ("Audit", request)).records]


def _plan_get_rls_rules() -> "Plan[List[Dict[str, Any]]]":
    answer = json.loads((yield ("GetRlsRules", pb.GetRlsRulesRequest())).rules_json)
    # With descriptor trees or limit sets (an imported file's) the answer is an object.
    rules: List[Dict[str, Any]] = answer["rules"] if isinstance(answer, dict) else answer
    return rules


def _plan_set_rls_rules(rules: List[Dict[str, Any]]) -> "Plan[List[Dict[str, Any]]]":
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise InvalidArgument.of("rules", f"must be a list of dicts, got {rules!r}")
    answer = (yield ("SetRlsRules", pb.RlsRules(rules_json=json.dumps(rules))))
    kept: List[Dict[str, Any]] = json.loads(answer.rules_json)
    return kept


_IMPORT_FORMATS = {"envoy-ratelimit": pb.IMPORT_FORMAT_ENVOY_RATELIMIT, "limitador": pb.IMPORT_FORMAT_LIMITADOR}
_IMPORT_MAX_BYTES = 4 << 20


def _plan_import_limits(fmt: str, text: str, dry_run: bool, replace: bool) -> "Plan[Imported]":
    if fmt not in _IMPORT_FORMATS:
        raise InvalidArgument.of("format", f"must be envoy-ratelimit or limitador, got {fmt!r}")
    if not isinstance(text, str) or len(text.encode()) > _IMPORT_MAX_BYTES:
        raise InvalidArgument.of("text", f"must be the file's text, at most {_IMPORT_MAX_BYTES} bytes")
    request = pb.ImportLimitsRequest(format=_IMPORT_FORMATS[fmt], text=text, dry_run=dry_run, replace=replace)
    return Imported.from_pb((yield ("ImportLimits", request)))


class Admin:
    """Administers a tollgate server over gRPC.

    >>> admin = Admin("http://127.0.0.1:7460")            # doctest: +SKIP
    >>> admin.create_group("checkout", limit=500, priority="high")  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:7460",
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        timeout: float = 10.0,
    ) -> None:
        self._channel = _connect.channel(url, ca_file)
        self._stub = rpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = _connect.metadata(token)
        self._timeout = timeout

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _drive(self, plan: "Plan[R]") -> R:
        """Runs a call's plan: each request it yields sent, its answer sent back."""
        try:
            step = next(plan)
            while True:
                method, request = step
                try:
                    answer = getattr(self._stub, method)(request, timeout=self._timeout, metadata=self._metadata)
                except grpc.RpcError as e:
                    raise from_rpc(e) from None
                step = plan.send(answer)
        except StopIteration as done:
            result: R = done.value
            return result

    def create_group(self, name: str, **settings: Any) -> Group:
        """Creates a group; :class:`~tollgate.AlreadyExists` if it exists.

        Settings are keywords: ``limit`` (units/s, or ``"unlimited"``), ``reserved``,
        ``burst``, ``priority`` (``low``, ``medium``, ``high`` or 1 to 16), ``weight``,
        ``budget``, ``budget_period`` (``total``, ``minute``, ``hour``, ``day``, ``week``,
        ``month``), ``quotas`` (a dict of window to units, ``None`` removing one), ``dropped``
        (``return`` or ``count``), ``debt_repay_s``, ``reads_writes_apart``,
        ``backend_limit``, ``background`` and ``ramp`` (a :class:`~tollgate.Ramp`). ``None``
        clears ``burst``, ``budget``, ``backend_limit`` and ``ramp``, and makes ``limit``
        unlimited."""
        return self._drive(_plan_create_group(name, **settings))

    def alter_group(self, name: str, **settings: Any) -> Group:
        """Changes the settings given (as :meth:`create_group` takes them);
        :class:`~tollgate.NotFound` if there is no such group."""
        return self._drive(_plan_alter_group(name, **settings))

    def put_group(self, name: str, **settings: Any) -> Group:
        """Creates the group or changes the settings given."""
        return self._drive(_plan_put_group(name, **settings))

    def drop_group(self, name: str, *, if_exists: bool = False) -> bool:
        """Drops a group; says whether it existed (:class:`~tollgate.NotFound` unless
        ``if_exists``)."""
        return self._drive(_plan_drop_group(name, if_exists=if_exists))

    def get_group(self, name: str) -> Group:
        """A group's settings; :class:`~tollgate.NotFound` if there is none."""
        return self._drive(_plan_get_group(name))

    def list_groups(self) -> List[Group]:
        """Every group's settings, every page, by name."""
        return self._drive(_plan_list_groups())

    def get_node(self) -> Node:
        """The node's settings: capacity, allocation mode, slow start."""
        return self._drive(_plan_get_node())

    def set_capacity(self, capacity: Optional[Union[int, float]]) -> Node:
        """The node capacity in units/s (``None``: no capacity)."""
        return self._drive(_plan_set_capacity(capacity))

    def set_mode(self, mode: str) -> Node:
        """How the capacity is shared: ``share`` (by priority, then max-min by weight; TiDB's)
        or ``fcfs`` (first come, first served; Couchbase's free pool)."""
        return self._drive(_plan_set_mode(mode))

    def set_slow_start(self, on: bool) -> Node:
        """Couchbase's slow start: a group with no client reserves a tenth of its reservation."""
        return self._drive(_plan_set_slow_start(on))

    def set_shadow(self, on: bool) -> Node:
        """Every group in shadow mode (``True``), or only those whose settings ask for it:
        requests are decided and counted but never refused."""
        return self._drive(_plan_set_shadow(on))

    def set_throttling(self, on: bool) -> Node:
        """The one switch: throttling on or off for the whole node, every setting kept
        (audited)."""
        return self._drive(_plan_set_throttling(on))

    def status(self) -> Status:
        """The controller's status: the node, its role, and every group's target, admitted
        rate, demand and clients (every page)."""
        return self._drive(_plan_status())

    def create_token(
        self,
        role: str,
        *,
        groups: str = "",
        unthrottled: bool = False,
        expires_in_s: int = 0,
        name: str = "",
        default_group: str = "",
        token: str = "",
    ) -> NewToken:
        """A new credential for a server run with ``--auth``: ``role`` is ``admin``,
        ``client``, ``backend`` or ``reader``; a client token may be kept to ``groups``
        (comma-separated patterns, ``*`` for any run of characters) and may carry the
        unthrottled privilege and a ``default_group`` (one of its groups: where its work goes
        when a request names none). Its secret is in the answer, this once; or give the
        ``token`` it is to be (``tg_ID_SECRET``, 16 and 64 hex digits, handed out already)."""
        return self._drive(_plan_create_token(role, groups=groups, unthrottled=unthrottled, expires_in_s=expires_in_s, name=name, default_group=default_group, token=token))

    def list_tokens(self) -> List[Token]:
        """Every credential (never their secrets)."""
        return self._drive(_plan_list_tokens())

    def revoke_token(self, id: str) -> Token:
        """Revokes the credential whose id is ``id``; :class:`~tollgate.NotFound` if none."""
        return self._drive(_plan_revoke_token(id))

    def set_token_group(self, id: str, default_group: str) -> Token:
        """Sets a client token's default group (``""``: none), TiDB's ``ALTER USER …
        RESOURCE GROUP``."""
        return self._drive(_plan_set_token_group(id, default_group))

    def usage(self, group: str = "", *, since_unix_ms: int = 0, limit: int = 0) -> List[UsageRecord]:
        """The metering by the minute (``tollgate usage``): one group's or every group's
        records from ``since_unix_ms`` (each group's last one before it first, as a baseline),
        in minute order, at most ``limit`` (0: 10,000; at most 100,000)."""
        return self._drive(_plan_usage(group, since_unix_ms=since_unix_ms, limit=limit))

    def audit(self, *, since_unix_ms: int = 0, limit: int = 0) -> List[AuditEntry]:
        """The audit log (``tollgate audit``): changes made at or after ``since_unix_ms``,
        oldest first, at most ``limit`` (0: 1,000; at most 10,000)."""
        return self._drive(_plan_audit(since_unix_ms=since_unix_ms, limit=limit))

    def get_rls_rules(self) -> List[Dict[str, Any]]:
        """How Envoy's rate-limit descriptors name groups (``tollgate rls show``): the rules,
        each a dict with ``domain``, ``key``, ``value`` and ``group`` (and optionally ``then``,
        ``whole``, ``name``, ``replaces``); ``[]``: a ``tenant`` entry names the group."""
        return self._drive(_plan_get_rls_rules())

    def set_rls_rules(self, rules: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Replaces the rules (``tollgate rls set``); the server checks them and names the
        first field it refuses (:class:`~tollgate.InvalidArgument`). Answers the rules kept."""
        return self._drive(_plan_set_rls_rules(rules))

    def import_limits(self, format: str, text: str, *, dry_run: bool = False, replace: bool = False) -> Imported:
        """Another limiter's limits file (``tollgate import``): ``format`` is
        ``envoy-ratelimit`` (its YAML) or ``limitador`` (its limits file), ``text`` the file.
        The server reads it as the command does, checked whole: what Tollgate cannot express
        is refused line by line (:class:`~tollgate.InvalidArgument`), and a domain answered by
        rules or a tree of its own already is replaced only with ``replace``
        (:class:`~tollgate.TollgateError` ``FAILED_PRECONDITION`` without). Nothing changes on
        a refusal or a ``dry_run``."""
        return self._drive(_plan_import_limits(format, text, dry_run, replace))

    def trace(self, group: str = "", *, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """The controller's decisions as they are made (``tollgate trace``): one dict per
        event, for ``group`` or every group, until the iterator is closed or ``timeout``
        seconds have passed (``None``: no end)."""
        _check_timeout(timeout)
        stream = self._stub.Trace(pb.TraceRequest(group=group), metadata=self._metadata, timeout=timeout)
        try:
            for line in stream:
                event: Dict[str, Any] = json.loads(line.json)
                yield event
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise from_rpc(e) from None
        finally:
            stream.cancel()


class AsyncAdmin:
    """:class:`Admin` for asyncio (``grpc.aio``): every call the same, awaited.

    >>> async with AsyncAdmin("http://127.0.0.1:7460") as admin:  # doctest: +SKIP
    ...     await admin.create_group("checkout", limit=500)
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:7460",
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        timeout: float = 10.0,
    ) -> None:
        self._channel = _connect.aio_channel(url, ca_file)
        self._stub = rpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = _connect.metadata(token)
        self._timeout = timeout

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncAdmin":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _drive(self, plan: "Plan[R]") -> R:
        """:meth:`Admin._drive`, each call awaited."""
        try:
            step = next(plan)
            while True:
                method, request = step
                try:
                    answer = await getattr(self._stub, method)(request, timeout=self._timeout, metadata=self._metadata)
                except grpc.RpcError as e:
                    raise from_rpc(e) from None
                step = plan.send(answer)
        except StopIteration as done:
            result: R = done.value
            return result

    async def create_group(self, name: str, **settings: Any) -> Group:
        """:meth:`Admin.create_group`, awaited."""
        return await self._drive(_plan_create_group(name, **settings))

    async def alter_group(self, name: str, **settings: Any) -> Group:
        """:meth:`Admin.alter_group`, awaited."""
        return await self._drive(_plan_alter_group(name, **settings))

    async def put_group(self, name: str, **settings: Any) -> Group:
        """:meth:`Admin.put_group`, awaited."""
        return await self._drive(_plan_put_group(name, **settings))

    async def drop_group(self, name: str, *, if_exists: bool = False) -> bool:
        """:meth:`Admin.drop_group`, awaited."""
        return await self._drive(_plan_drop_group(name, if_exists=if_exists))

    async def get_group(self, name: str) -> Group:
        """:meth:`Admin.get_group`, awaited."""
        return await self._drive(_plan_get_group(name))

    async def list_groups(self) -> List[Group]:
        """:meth:`Admin.list_groups`, awaited."""
        return await self._drive(_plan_list_groups())

    async def get_node(self) -> Node:
        """:meth:`Admin.get_node`, awaited."""
        return await self._drive(_plan_get_node())

    async def set_capacity(self, capacity: Optional[Union[int, float]]) -> Node:
        """:meth:`Admin.set_capacity`, awaited."""
        return await self._drive(_plan_set_capacity(capacity))

    async def set_mode(self, mode: str) -> Node:
        """:meth:`Admin.set_mode`, awaited."""
        return await self._drive(_plan_set_mode(mode))

    async def set_slow_start(self, on: bool) -> Node:
        """:meth:`Admin.set_slow_start`, awaited."""
        return await self._drive(_plan_set_slow_start(on))

    async def set_shadow(self, on: bool) -> Node:
        """:meth:`Admin.set_shadow`, awaited."""
        return await self._drive(_plan_set_shadow(on))

    async def set_throttling(self, on: bool) -> Node:
        """:meth:`Admin.set_throttling`, awaited."""
        return await self._drive(_plan_set_throttling(on))

    async def status(self) -> Status:
        """:meth:`Admin.status`, awaited."""
        return await self._drive(_plan_status())

    async def create_token(
        self,
        role: str,
        *,
        groups: str = "",
        unthrottled: bool = False,
        expires_in_s: int = 0,
        name: str = "",
        default_group: str = "",
        token: str = "",
    ) -> NewToken:
        """:meth:`Admin.create_token`, awaited."""
        return await self._drive(_plan_create_token(role, groups=groups, unthrottled=unthrottled, expires_in_s=expires_in_s, name=name, default_group=default_group, token=token))

    async def list_tokens(self) -> List[Token]:
        """:meth:`Admin.list_tokens`, awaited."""
        return await self._drive(_plan_list_tokens())

    async def revoke_token(self, id: str) -> Token:
        """:meth:`Admin.revoke_token`, awaited."""
        return await self._drive(_plan_revoke_token(id))

    async def set_token_group(self, id: str, default_group: str) -> Token:
        """:meth:`Admin.set_token_group`, awaited."""
        return await self._drive(_plan_set_token_group(id, default_group))

    async def usage(self, group: str = "", *, since_unix_ms: int = 0, limit: int = 0) -> List[UsageRecord]:
        """:meth:`Admin.usage`, awaited."""
        return await self._drive(_plan_usage(group, since_unix_ms=since_unix_ms, limit=limit))

    async def audit(self, *, since_unix_ms: int = 0, limit: int = 0) -> List[AuditEntry]:
        """:meth:`Admin.audit`, awaited."""
        return await self._drive(_plan_audit(since_unix_ms=since_unix_ms, limit=limit))

    async def get_rls_rules(self) -> List[Dict[str, Any]]:
        """:meth:`Admin.get_rls_rules`, awaited."""
        return await self._drive(_plan_get_rls_rules())

    async def set_rls_rules(self, rules: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """:meth:`Admin.set_rls_rules`, awaited."""
        return await self._drive(_plan_set_rls_rules(rules))

    async def import_limits(self, format: str, text: str, *, dry_run: bool = False, replace: bool = False) -> Imported:
        """:meth:`Admin.import_limits`, awaited."""
        return await self._drive(_plan_import_limits(format, text, dry_run, replace))

    async def trace(self, group: str = "", *, timeout: Optional[float] = None) -> AsyncIterator[Dict[str, Any]]:
        """:meth:`Admin.trace`, as an asynchronous iterator."""
        _check_timeout(timeout)
        stream = self._stub.Trace(pb.TraceRequest(group=group), metadata=self._metadata, timeout=timeout)
        try:
            async for line in stream:
                event: Dict[str, Any] = json.loads(line.json)
                yield event
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise from_rpc(e) from None
        finally:
            stream.cancel()


def _whole(field: str, value: Any, low: int, high: int) -> int:
    """``value`` checked to be a whole number from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument.of(field, f"must be a whole number from {low} to {high}, got {value!r}")
    return value


def _check_timeout(timeout: Optional[float]) -> None:
    """A trace's ``timeout`` checked: seconds above 0, or ``None``."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise InvalidArgument.of("timeout", f"must be a number of seconds above 0, or None, got {timeout!r}")
