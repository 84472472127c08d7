"""The admin calls: groups, node settings, status."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import grpc

from . import _connect
from .errors import from_rpc
from .v1 import tollgate_pb2 as pb
from .v1 import tollgate_pb2_grpc as rpc

Settings = Dict[str, Any]

_PRIORITIES = {"low": 1, "medium": 8, "high": 16}
_NAMES = {1: "low", 8: "medium", 16: "high"}
_KEYS = (
    "reserved, limit, burst, priority, weight, budget, budget_period, dropped, debt_repay_s, "
    "reads_writes_apart, backend_limit, background"
)


def _patch(settings: Settings) -> pb.GroupPatch:
    """A patch from keyword settings, as `tollgate group` takes them; ``None`` clears what
    may be cleared."""
    p = pb.GroupPatch()
    for key, value in settings.items():
        if key == "limit":
            if value is None or value == "unlimited":
                p.unlimited = True
            else:
                p.limit = float(value)
        elif key == "priority":
            level = _PRIORITIES.get(value, value) if isinstance(value, str) else value
            if not isinstance(level, int) or not 1 <= level <= 16:
                raise ValueError(f"priority: must be low, medium, high or 1 to 16, got {value!r}")
            p.priority = level
        elif key == "budget_period":
            if value not in ("total", "day", "week", "month"):
                raise ValueError(f'budget_period: must be "total", "day", "week" or "month", got {value!r}')
            p.budget_period = value
        elif key == "dropped":
            if value not in ("count", "return"):
                raise ValueError(f'dropped: must be "count" or "return", got {value!r}')
            p.count_dropped = value == "count"
        elif key in ("burst", "budget", "backend_limit"):
            if value is None:
                setattr(p, f"clear_{key}", True)
            else:
                setattr(p, key, float(value))
        elif key in ("reserved", "weight", "debt_repay_s"):
            setattr(p, key, float(value))
        elif key in ("reads_writes_apart", "background"):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: must be True or False, got {value!r}")
            setattr(p, key, value)
        else:
            raise ValueError(f"{key}: unknown setting; expected one of {_KEYS}")
    return p


def _settings(info: pb.GroupInfo) -> Settings:
    s = info.settings
    return {
        "name": info.name,
        "reserved": s.reserved,
        "limit": s.limit if s.HasField("limit") else None,
        "burst": s.burst if s.HasField("burst") else None,
        "priority": _NAMES.get(s.priority, s.priority),
        "weight": s.weight,
        "budget": s.budget if s.HasField("budget") else None,
        "budget_period": s.budget_period or "total",
        "dropped": "count" if s.count_dropped else "return",
        "debt_repay_s": s.debt_repay_s if s.HasField("debt_repay_s") else 5.0,
        "reads_writes_apart": s.reads_writes_apart,
        "backend_limit": s.backend_limit if s.HasField("backend_limit") else None,
        "background": s.background,
    }


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

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    def _put(self, name: str, mode: pb.PutMode, settings: Settings) -> Settings:
        request = pb.PutGroupRequest(name=name, patch=_patch(settings), mode=mode)
        return _settings(self._call("PutGroup", request))

    def create_group(self, name: str, **settings: Any) -> Settings:
        """Creates a group; :class:`AlreadyExists` if it exists."""
        return self._put(name, pb.PUT_MODE_CREATE, settings)

    def alter_group(self, name: str, **settings: Any) -> Settings:
        """Changes the settings given; :class:`NotFound` if there is no such group."""
        return self._put(name, pb.PUT_MODE_ALTER, settings)

    def put_group(self, name: str, **settings: Any) -> Settings:
        """Creates the group or changes the settings given."""
        return self._put(name, pb.PUT_MODE_UPSERT, settings)

    def drop_group(self, name: str, *, if_exists: bool = False) -> bool:
        """Drops a group; says whether it existed (:class:`NotFound` unless ``if_exists``)."""
        answer = self._call("DropGroup", pb.DropGroupRequest(name=name, if_exists=if_exists))
        return bool(answer.existed)

    def get_group(self, name: str) -> Settings:
        """A group's settings; :class:`NotFound` if there is none."""
        return _settings(self._call("GetGroup", pb.GetGroupRequest(name=name)))

    def list_groups(self) -> List[Settings]:
        """Every group's settings, every page."""
        out: List[Settings] = []
        token = ""
        while True:
            page = self._call("ListGroups", pb.ListGroupsRequest(page_token=token))
            out.extend(_settings(g) for g in page.groups)
            token = page.next_page_token
            if not token:
                return out

    def set_capacity(self, capacity: Optional[Union[int, float]]) -> None:
        """The node capacity in units/s (``None``: no capacity)."""
        request = pb.SetCapacityRequest()
        if capacity is not None:
            request.capacity = float(capacity)
        self._call("SetCapacity", request)

    def status(self) -> Dict[str, Any]:
        """The controller's status: every group's target, admitted rate, demand and clients."""
        from google.protobuf.json_format import MessageToDict

        answer = self._call("Status", pb.StatusRequest())
        result: Dict[str, Any] = MessageToDict(answer, preserving_proto_field_name=True)
        return result
