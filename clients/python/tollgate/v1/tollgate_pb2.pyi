from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORT_FORMAT_UNSPECIFIED: _ClassVar[ImportFormat]
    IMPORT_FORMAT_ENVOY_RATELIMIT: _ClassVar[ImportFormat]
    IMPORT_FORMAT_LIMITADOR: _ClassVar[ImportFormat]

class PutMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_MODE_UPSERT: _ClassVar[PutMode]
    PUT_MODE_CREATE: _ClassVar[PutMode]
    PUT_MODE_ALTER: _ClassVar[PutMode]

class RampMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RAMP_MODE_UNSPECIFIED: _ClassVar[RampMode]
    RAMP_MODE_SCHEDULED: _ClassVar[RampMode]
    RAMP_MODE_RELAXED: _ClassVar[RampMode]
    RAMP_MODE_ONLY_IF_USED: _ClassVar[RampMode]
    RAMP_MODE_GO_BACK_N: _ClassVar[RampMode]

class AllocationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_MODE_SHARE: _ClassVar[AllocationMode]
    ALLOCATION_MODE_FCFS: _ClassVar[AllocationMode]
IMPORT_FORMAT_UNSPECIFIED: ImportFormat
IMPORT_FORMAT_ENVOY_RATELIMIT: ImportFormat
IMPORT_FORMAT_LIMITADOR: ImportFormat
PUT_MODE_UPSERT: PutMode
PUT_MODE_CREATE: PutMode
PUT_MODE_ALTER: PutMode
RAMP_MODE_UNSPECIFIED: RampMode
RAMP_MODE_SCHEDULED: RampMode
RAMP_MODE_RELAXED: RampMode
RAMP_MODE_ONLY_IF_USED: RampMode
RAMP_MODE_GO_BACK_N: RampMode
ALLOCATION_MODE_SHARE: AllocationMode
ALLOCATION_MODE_FCFS: AllocationMode

class ExchangeRequest(_message.Message):
    __slots__ = ("client_id", "sequence", "groups", "target_request_period_ms", "shard_map_epoch", "takes_allotments")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REQUEST_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    SHARD_MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TAKES_ALLOTMENTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    sequence: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupUsage]
    target_request_period_ms: int
    shard_map_epoch: int
    takes_allotments: bool
    def __init__(self, client_id: _Optional[str] = ..., sequence: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupUsage, _Mapping]]] = ..., target_request_period_ms: _Optional[int] = ..., shard_map_epoch: _Optional[int] = ..., takes_allotments: _Optional[bool] = ...) -> None: ...

class GroupUsage(_message.Message):
    __slots__ = ("group", "demand", "consumed", "admitted", "throttled", "waiting", "unthrottled", "held", "waited", "detail", "would_refuse", "in_flight", "in_flight_asked", "critical_admitted", "critical_throttled", "sheddable_admitted", "sheddable_throttled", "quota", "largest")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    UNTHROTTLED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WOULD_REFUSE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_ASKED_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_THROTTLED_FIELD_NUMBER: _ClassVar[int]
    SHEDDABLE_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    SHEDDABLE_THROTTLED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FIELD_NUMBER: _ClassVar[int]
    group: str
    demand: float
    consumed: float
    admitted: int
    throttled: int
    waiting: float
    unthrottled: float
    held: float
    waited: int
    detail: Consumption
    would_refuse: int
    in_flight: int
    in_flight_asked: int
    critical_admitted: int
    critical_throttled: int
    sheddable_admitted: int
    sheddable_throttled: int
    quota: QuotaHeld
    largest: float
    def __init__(self, group: _Optional[str] = ..., demand: _Optional[float] = ..., consumed: _Optional[float] = ..., admitted: _Optional[int] = ..., throttled: _Optional[int] = ..., waiting: _Optional[float] = ..., unthrottled: _Optional[float] = ..., held: _Optional[float] = ..., waited: _Optional[int] = ..., detail: _Optional[_Union[Consumption, _Mapping]] = ..., would_refuse: _Optional[int] = ..., in_flight: _Optional[int] = ..., in_flight_asked: _Optional[int] = ..., critical_admitted: _Optional[int] = ..., critical_throttled: _Optional[int] = ..., sheddable_admitted: _Optional[int] = ..., sheddable_throttled: _Optional[int] = ..., quota: _Optional[_Union[QuotaHeld, _Mapping]] = ..., largest: _Optional[float] = ...) -> None: ...

class QuotaHeld(_message.Message):
    __slots__ = ("window", "given", "used", "lasts_ms")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    GIVEN_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LASTS_MS_FIELD_NUMBER: _ClassVar[int]
    window: int
    given: float
    used: float
    lasts_ms: int
    def __init__(self, window: _Optional[int] = ..., given: _Optional[float] = ..., used: _Optional[float] = ..., lasts_ms: _Optional[int] = ...) -> None: ...

class ClassCounts(_message.Message):
    __slots__ = ("request_class", "admitted", "throttled")
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    request_class: str
    admitted: int
    throttled: int
    def __init__(self, request_class: _Optional[str] = ..., admitted: _Optional[int] = ..., throttled: _Optional[int] = ...) -> None: ...

class Consumption(_message.Message):
    __slots__ = ("rru", "wru", "read_bytes", "write_bytes", "cpu_ms", "read_rpcs", "write_rpcs")
    RRU_FIELD_NUMBER: _ClassVar[int]
    WRU_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MS_FIELD_NUMBER: _ClassVar[int]
    READ_RPCS_FIELD_NUMBER: _ClassVar[int]
    WRITE_RPCS_FIELD_NUMBER: _ClassVar[int]
    rru: float
    wru: float
    read_bytes: float
    write_bytes: float
    cpu_ms: float
    read_rpcs: float
    write_rpcs: float
    def __init__(self, rru: _Optional[float] = ..., wru: _Optional[float] = ..., read_bytes: _Optional[float] = ..., write_bytes: _Optional[float] = ..., cpu_ms: _Optional[float] = ..., read_rpcs: _Optional[float] = ..., write_rpcs: _Optional[float] = ...) -> None: ...

class ExchangeResponse(_message.Message):
    __slots__ = ("grants", "next_exchange_ms", "next_tick_ms", "unthrottled_allowed", "shard_map")
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_EXCHANGE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TICK_MS_FIELD_NUMBER: _ClassVar[int]
    UNTHROTTLED_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    SHARD_MAP_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    next_exchange_ms: int
    next_tick_ms: int
    unthrottled_allowed: bool
    shard_map: ShardMap
    def __init__(self, grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., next_exchange_ms: _Optional[int] = ..., next_tick_ms: _Optional[int] = ..., unthrottled_allowed: _Optional[bool] = ..., shard_map: _Optional[_Union[ShardMap, _Mapping]] = ...) -> None: ...

class ShardMap(_message.Message):
    __slots__ = ("epoch", "shards", "members", "owners")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    shards: int
    members: _containers.RepeatedScalarFieldContainer[str]
    owners: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., shards: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., owners: _Optional[_Iterable[int]] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("group", "unlimited", "rate", "burst", "lease_ms", "reserved", "clients", "count_dropped", "debt_repay_ms", "trickle_ms", "shadow", "critical_reserve", "in_flight_limited", "in_flight", "shard", "quota")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    COUNT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    DEBT_REPAY_MS_FIELD_NUMBER: _ClassVar[int]
    TRICKLE_MS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_RESERVE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_LIMITED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    group: str
    unlimited: bool
    rate: float
    burst: float
    lease_ms: int
    reserved: float
    clients: int
    count_dropped: bool
    debt_repay_ms: int
    trickle_ms: int
    shadow: bool
    critical_reserve: float
    in_flight_limited: bool
    in_flight: int
    shard: int
    quota: QuotaAllotment
    def __init__(self, group: _Optional[str] = ..., unlimited: _Optional[bool] = ..., rate: _Optional[float] = ..., burst: _Optional[float] = ..., lease_ms: _Optional[int] = ..., reserved: _Optional[float] = ..., clients: _Optional[int] = ..., count_dropped: _Optional[bool] = ..., debt_repay_ms: _Optional[int] = ..., trickle_ms: _Optional[int] = ..., shadow: _Optional[bool] = ..., critical_reserve: _Optional[float] = ..., in_flight_limited: _Optional[bool] = ..., in_flight: _Optional[int] = ..., shard: _Optional[int] = ..., quota: _Optional[_Union[QuotaAllotment, _Mapping]] = ...) -> None: ...

class QuotaAllotment(_message.Message):
    __slots__ = ("window", "add", "ends_in_ms", "left", "reset_in_ms")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    ENDS_IN_MS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RESET_IN_MS_FIELD_NUMBER: _ClassVar[int]
    window: int
    add: float
    ends_in_ms: int
    left: float
    reset_in_ms: int
    def __init__(self, window: _Optional[int] = ..., add: _Optional[float] = ..., ends_in_ms: _Optional[int] = ..., left: _Optional[float] = ..., reset_in_ms: _Optional[int] = ...) -> None: ...

class WatchSettingsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSettingsRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class BackendSettings(_message.Message):
    __slots__ = ("version", "unchanged", "groups")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    unchanged: bool
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, version: _Optional[int] = ..., unchanged: _Optional[bool] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class BackendReport(_message.Message):
    __slots__ = ("backend_id", "zone", "queue_bytes", "utilisation", "loads", "capacity")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    zone: str
    queue_bytes: float
    utilisation: float
    loads: _containers.RepeatedCompositeFieldContainer[GroupLoad]
    capacity: float
    def __init__(self, backend_id: _Optional[str] = ..., zone: _Optional[str] = ..., queue_bytes: _Optional[float] = ..., utilisation: _Optional[float] = ..., loads: _Optional[_Iterable[_Union[GroupLoad, _Mapping]]] = ..., capacity: _Optional[float] = ...) -> None: ...

class GroupLoad(_message.Message):
    __slots__ = ("group", "units_per_s")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    UNITS_PER_S_FIELD_NUMBER: _ClassVar[int]
    group: str
    units_per_s: float
    def __init__(self, group: _Optional[str] = ..., units_per_s: _Optional[float] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("rejected", "elsewhere", "shares")
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    rejected: _containers.RepeatedScalarFieldContainer[str]
    elsewhere: _containers.RepeatedCompositeFieldContainer[GroupLoad]
    shares: _containers.RepeatedCompositeFieldContainer[NodeShare]
    def __init__(self, rejected: _Optional[_Iterable[str]] = ..., elsewhere: _Optional[_Iterable[_Union[GroupLoad, _Mapping]]] = ..., shares: _Optional[_Iterable[_Union[NodeShare, _Mapping]]] = ...) -> None: ...

class NodeShare(_message.Message):
    __slots__ = ("group", "units_per_s", "ceiling", "cpu_ms_per_s", "read_bytes_per_s", "write_bytes_per_s", "part")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    UNITS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CEILING_FIELD_NUMBER: _ClassVar[int]
    CPU_MS_PER_S_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    group: str
    units_per_s: float
    ceiling: float
    cpu_ms_per_s: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    part: float
    def __init__(self, group: _Optional[str] = ..., units_per_s: _Optional[float] = ..., ceiling: _Optional[float] = ..., cpu_ms_per_s: _Optional[float] = ..., read_bytes_per_s: _Optional[float] = ..., write_bytes_per_s: _Optional[float] = ..., part: _Optional[float] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("group", "since_unix_ms", "limit")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    group: str
    since_unix_ms: int
    limit: int
    def __init__(self, group: _Optional[str] = ..., since_unix_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("group", "minute_unix_ms", "consumed_total", "admitted_total", "throttled_total", "would_refuse_total")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MINUTE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WOULD_REFUSE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    group: str
    minute_unix_ms: int
    consumed_total: float
    admitted_total: int
    throttled_total: int
    would_refuse_total: int
    def __init__(self, group: _Optional[str] = ..., minute_unix_ms: _Optional[int] = ..., consumed_total: _Optional[float] = ..., admitted_total: _Optional[int] = ..., throttled_total: _Optional[int] = ..., would_refuse_total: _Optional[int] = ...) -> None: ...

class UsageResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[UsageRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[UsageRecord, _Mapping]]] = ...) -> None: ...

class RlsRules(_message.Message):
    __slots__ = ("rules_json",)
    RULES_JSON_FIELD_NUMBER: _ClassVar[int]
    rules_json: str
    def __init__(self, rules_json: _Optional[str] = ...) -> None: ...

class GetRlsRulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ImportLimitsRequest(_message.Message):
    __slots__ = ("format", "text", "dry_run", "replace")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    format: ImportFormat
    text: str
    dry_run: bool
    replace: bool
    def __init__(self, format: _Optional[_Union[ImportFormat, str]] = ..., text: _Optional[str] = ..., dry_run: _Optional[bool] = ..., replace: _Optional[bool] = ...) -> None: ...

class ImportNote(_message.Message):
    __slots__ = ("line", "note")
    LINE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    line: int
    note: str
    def __init__(self, line: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class ImportLimitsResponse(_message.Message):
    __slots__ = ("notes", "changes", "applied", "summary")
    NOTES_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    notes: _containers.RepeatedCompositeFieldContainer[ImportNote]
    changes: _containers.RepeatedScalarFieldContainer[str]
    applied: bool
    summary: str
    def __init__(self, notes: _Optional[_Iterable[_Union[ImportNote, _Mapping]]] = ..., changes: _Optional[_Iterable[str]] = ..., applied: _Optional[bool] = ..., summary: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("role", "groups", "unthrottled", "expires_in_s", "name", "default_group", "token")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNTHROTTLED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    role: str
    groups: str
    unthrottled: bool
    expires_in_s: int
    name: str
    default_group: str
    token: str
    def __init__(self, role: _Optional[str] = ..., groups: _Optional[str] = ..., unthrottled: _Optional[bool] = ..., expires_in_s: _Optional[int] = ..., name: _Optional[str] = ..., default_group: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("id", "role", "groups", "unthrottled", "created_unix_ms", "expires_unix_ms", "name", "default_group")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNTHROTTLED_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: str
    groups: str
    unthrottled: bool
    created_unix_ms: int
    expires_unix_ms: int
    name: str
    default_group: str
    def __init__(self, id: _Optional[str] = ..., role: _Optional[str] = ..., groups: _Optional[str] = ..., unthrottled: _Optional[bool] = ..., created_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., name: _Optional[str] = ..., default_group: _Optional[str] = ...) -> None: ...

class SetTokenGroupRequest(_message.Message):
    __slots__ = ("id", "default_group")
    ID_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    default_group: str
    def __init__(self, id: _Optional[str] = ..., default_group: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "info")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    token: str
    info: TokenInfo
    def __init__(self, token: _Optional[str] = ..., info: _Optional[_Union[TokenInfo, _Mapping]] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("since_unix_ms", "limit")
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    since_unix_ms: int
    limit: int
    def __init__(self, since_unix_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at_unix_ms", "who", "what", "before", "after")
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    at_unix_ms: int
    who: str
    what: str
    before: str
    after: str
    def __init__(self, at_unix_ms: _Optional[int] = ..., who: _Optional[str] = ..., what: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...

class AuditResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, records: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class TraceRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class TraceLine(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class GroupPatch(_message.Message):
    __slots__ = ("reserved", "limit", "unlimited", "burst", "priority", "weight", "budget", "ramp", "clear_ramp", "clear_budget", "clear_burst", "count_dropped", "debt_repay_s", "reads_writes_apart", "backend_limit", "clear_backend_limit", "background", "budget_period", "quotas", "shadow", "critical_reserve", "max_in_flight", "clear_max_in_flight", "parent", "clear_parent")
    class QuotasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RAMP_FIELD_NUMBER: _ClassVar[int]
    CLEAR_RAMP_FIELD_NUMBER: _ClassVar[int]
    CLEAR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CLEAR_BURST_FIELD_NUMBER: _ClassVar[int]
    COUNT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    DEBT_REPAY_S_FIELD_NUMBER: _ClassVar[int]
    READS_WRITES_APART_FIELD_NUMBER: _ClassVar[int]
    BACKEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CLEAR_BACKEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PERIOD_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_RESERVE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CLEAR_MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    CLEAR_PARENT_FIELD_NUMBER: _ClassVar[int]
    reserved: float
    limit: float
    unlimited: bool
    burst: float
    priority: int
    weight: float
    budget: float
    ramp: RampSettings
    clear_ramp: bool
    clear_budget: bool
    clear_burst: bool
    count_dropped: bool
    debt_repay_s: float
    reads_writes_apart: bool
    backend_limit: float
    clear_backend_limit: bool
    background: bool
    budget_period: str
    quotas: _containers.ScalarMap[str, float]
    shadow: bool
    critical_reserve: float
    max_in_flight: int
    clear_max_in_flight: bool
    parent: str
    clear_parent: bool
    def __init__(self, reserved: _Optional[float] = ..., limit: _Optional[float] = ..., unlimited: _Optional[bool] = ..., burst: _Optional[float] = ..., priority: _Optional[int] = ..., weight: _Optional[float] = ..., budget: _Optional[float] = ..., ramp: _Optional[_Union[RampSettings, _Mapping]] = ..., clear_ramp: _Optional[bool] = ..., clear_budget: _Optional[bool] = ..., clear_burst: _Optional[bool] = ..., count_dropped: _Optional[bool] = ..., debt_repay_s: _Optional[float] = ..., reads_writes_apart: _Optional[bool] = ..., backend_limit: _Optional[float] = ..., clear_backend_limit: _Optional[bool] = ..., background: _Optional[bool] = ..., budget_period: _Optional[str] = ..., quotas: _Optional[_Mapping[str, float]] = ..., shadow: _Optional[bool] = ..., critical_reserve: _Optional[float] = ..., max_in_flight: _Optional[int] = ..., clear_max_in_flight: _Optional[bool] = ..., parent: _Optional[str] = ..., clear_parent: _Optional[bool] = ...) -> None: ...

class RampSettings(_message.Message):
    __slots__ = ("min", "max", "duration_s", "mode", "threshold_pct", "ramp_down_pct", "cool_down_s", "resume_ttl_s")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_PCT_FIELD_NUMBER: _ClassVar[int]
    RAMP_DOWN_PCT_FIELD_NUMBER: _ClassVar[int]
    COOL_DOWN_S_FIELD_NUMBER: _ClassVar[int]
    RESUME_TTL_S_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    duration_s: float
    mode: RampMode
    threshold_pct: float
    ramp_down_pct: float
    cool_down_s: float
    resume_ttl_s: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ..., duration_s: _Optional[float] = ..., mode: _Optional[_Union[RampMode, str]] = ..., threshold_pct: _Optional[float] = ..., ramp_down_pct: _Optional[float] = ..., cool_down_s: _Optional[float] = ..., resume_ttl_s: _Optional[float] = ...) -> None: ...

class GroupSettings(_message.Message):
    __slots__ = ("reserved", "limit", "burst", "priority", "weight", "budget", "ramp", "count_dropped", "debt_repay_s", "reads_writes_apart", "backend_limit", "background", "budget_period", "quotas", "shadow", "critical_reserve", "max_in_flight", "parent")
    class QuotasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RAMP_FIELD_NUMBER: _ClassVar[int]
    COUNT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    DEBT_REPAY_S_FIELD_NUMBER: _ClassVar[int]
    READS_WRITES_APART_FIELD_NUMBER: _ClassVar[int]
    BACKEND_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PERIOD_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_RESERVE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    reserved: float
    limit: float
    burst: float
    priority: int
    weight: float
    budget: float
    ramp: RampSettings
    count_dropped: bool
    debt_repay_s: float
    reads_writes_apart: bool
    backend_limit: float
    background: bool
    budget_period: str
    quotas: _containers.ScalarMap[str, float]
    shadow: bool
    critical_reserve: float
    max_in_flight: int
    parent: str
    def __init__(self, reserved: _Optional[float] = ..., limit: _Optional[float] = ..., burst: _Optional[float] = ..., priority: _Optional[int] = ..., weight: _Optional[float] = ..., budget: _Optional[float] = ..., ramp: _Optional[_Union[RampSettings, _Mapping]] = ..., count_dropped: _Optional[bool] = ..., debt_repay_s: _Optional[float] = ..., reads_writes_apart: _Optional[bool] = ..., backend_limit: _Optional[float] = ..., background: _Optional[bool] = ..., budget_period: _Optional[str] = ..., quotas: _Optional[_Mapping[str, float]] = ..., shadow: _Optional[bool] = ..., critical_reserve: _Optional[float] = ..., max_in_flight: _Optional[int] = ..., parent: _Optional[str] = ...) -> None: ...

class PutGroupRequest(_message.Message):
    __slots__ = ("name", "patch", "mode")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    patch: GroupPatch
    mode: PutMode
    def __init__(self, name: _Optional[str] = ..., patch: _Optional[_Union[GroupPatch, _Mapping]] = ..., mode: _Optional[_Union[PutMode, str]] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("name", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: GroupSettings
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[GroupSettings, _Mapping]] = ...) -> None: ...

class DropGroupRequest(_message.Message):
    __slots__ = ("name", "if_exists")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    if_exists: bool
    def __init__(self, name: _Optional[str] = ..., if_exists: _Optional[bool] = ...) -> None: ...

class DropGroupResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups", "next_page_token")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    next_page_token: str
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetCapacityRequest(_message.Message):
    __slots__ = ("capacity",)
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    capacity: float
    def __init__(self, capacity: _Optional[float] = ...) -> None: ...

class SetModeRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: AllocationMode
    def __init__(self, mode: _Optional[_Union[AllocationMode, str]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("capacity", "mode", "slow_start", "shadow", "throttling_off")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SLOW_START_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    THROTTLING_OFF_FIELD_NUMBER: _ClassVar[int]
    capacity: float
    mode: AllocationMode
    slow_start: bool
    shadow: bool
    throttling_off: bool
    def __init__(self, capacity: _Optional[float] = ..., mode: _Optional[_Union[AllocationMode, str]] = ..., slow_start: _Optional[bool] = ..., shadow: _Optional[bool] = ..., throttling_off: _Optional[bool] = ...) -> None: ...

class SetSlowStartRequest(_message.Message):
    __slots__ = ("on",)
    ON_FIELD_NUMBER: _ClassVar[int]
    on: bool
    def __init__(self, on: _Optional[bool] = ...) -> None: ...

class SetShadowRequest(_message.Message):
    __slots__ = ("on",)
    ON_FIELD_NUMBER: _ClassVar[int]
    on: bool
    def __init__(self, on: _Optional[bool] = ...) -> None: ...

class SetThrottlingRequest(_message.Message):
    __slots__ = ("on",)
    ON_FIELD_NUMBER: _ClassVar[int]
    on: bool
    def __init__(self, on: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("capacity", "groups", "exchanges", "mode", "learning", "clients", "backends", "next_page_token", "role", "leader", "leader_changes", "backend_detail", "client_detail", "clients_lapsed", "others_granted", "cost_model", "unit", "warnings", "shadow", "throttling_off", "region", "upstream_safe_mode", "settings_files", "domains", "rules_everywhere", "tokens")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    EXCHANGES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_CHANGES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_DETAIL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DETAIL_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_LAPSED_FIELD_NUMBER: _ClassVar[int]
    OTHERS_GRANTED_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    THROTTLING_OFF_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_SAFE_MODE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FILES_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    RULES_EVERYWHERE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    capacity: float
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    exchanges: int
    mode: AllocationMode
    learning: bool
    clients: int
    backends: int
    next_page_token: str
    role: str
    leader: str
    leader_changes: int
    backend_detail: _containers.RepeatedCompositeFieldContainer[BackendStatus]
    client_detail: _containers.RepeatedCompositeFieldContainer[ClientStatus]
    clients_lapsed: int
    others_granted: float
    cost_model: str
    unit: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    shadow: bool
    throttling_off: bool
    region: str
    upstream_safe_mode: bool
    settings_files: _containers.RepeatedCompositeFieldContainer[SettingsFileStatus]
    domains: _containers.RepeatedCompositeFieldContainer[DomainRules]
    rules_everywhere: bool
    tokens: _containers.RepeatedCompositeFieldContainer[TokenStatus]
    def __init__(self, capacity: _Optional[float] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., exchanges: _Optional[int] = ..., mode: _Optional[_Union[AllocationMode, str]] = ..., learning: _Optional[bool] = ..., clients: _Optional[int] = ..., backends: _Optional[int] = ..., next_page_token: _Optional[str] = ..., role: _Optional[str] = ..., leader: _Optional[str] = ..., leader_changes: _Optional[int] = ..., backend_detail: _Optional[_Iterable[_Union[BackendStatus, _Mapping]]] = ..., client_detail: _Optional[_Iterable[_Union[ClientStatus, _Mapping]]] = ..., clients_lapsed: _Optional[int] = ..., others_granted: _Optional[float] = ..., cost_model: _Optional[str] = ..., unit: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., shadow: _Optional[bool] = ..., throttling_off: _Optional[bool] = ..., region: _Optional[str] = ..., upstream_safe_mode: _Optional[bool] = ..., settings_files: _Optional[_Iterable[_Union[SettingsFileStatus, _Mapping]]] = ..., domains: _Optional[_Iterable[_Union[DomainRules, _Mapping]]] = ..., rules_everywhere: _Optional[bool] = ..., tokens: _Optional[_Iterable[_Union[TokenStatus, _Mapping]]] = ...) -> None: ...

class SettingsFileStatus(_message.Message):
    __slots__ = ("path", "kind", "revision", "rejected", "applied")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: str
    revision: str
    rejected: str
    applied: int
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[str] = ..., revision: _Optional[str] = ..., rejected: _Optional[str] = ..., applied: _Optional[int] = ...) -> None: ...

class DomainRules(_message.Message):
    __slots__ = ("domain", "answered_by", "count")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    domain: str
    answered_by: str
    count: int
    def __init__(self, domain: _Optional[str] = ..., answered_by: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class BackendStatus(_message.Message):
    __slots__ = ("name", "zone", "utilisation", "limiting", "seen_s", "load", "top_groups", "inert")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    LIMITING_FIELD_NUMBER: _ClassVar[int]
    SEEN_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TOP_GROUPS_FIELD_NUMBER: _ClassVar[int]
    INERT_FIELD_NUMBER: _ClassVar[int]
    name: str
    zone: str
    utilisation: float
    limiting: bool
    seen_s: float
    load: float
    top_groups: _containers.RepeatedCompositeFieldContainer[GroupLoad]
    inert: str
    def __init__(self, name: _Optional[str] = ..., zone: _Optional[str] = ..., utilisation: _Optional[float] = ..., limiting: _Optional[bool] = ..., seen_s: _Optional[float] = ..., load: _Optional[float] = ..., top_groups: _Optional[_Iterable[_Union[GroupLoad, _Mapping]]] = ..., inert: _Optional[str] = ...) -> None: ...

class ClientStatus(_message.Message):
    __slots__ = ("client_id", "seen_s", "lapsed", "groups", "unlimited_groups", "granted", "top_grants")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEEN_S_FIELD_NUMBER: _ClassVar[int]
    LAPSED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    TOP_GRANTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    seen_s: float
    lapsed: bool
    groups: int
    unlimited_groups: int
    granted: float
    top_grants: _containers.RepeatedCompositeFieldContainer[ClientGrantStatus]
    def __init__(self, client_id: _Optional[str] = ..., seen_s: _Optional[float] = ..., lapsed: _Optional[bool] = ..., groups: _Optional[int] = ..., unlimited_groups: _Optional[int] = ..., granted: _Optional[float] = ..., top_grants: _Optional[_Iterable[_Union[ClientGrantStatus, _Mapping]]] = ...) -> None: ...

class ClientGrantStatus(_message.Message):
    __slots__ = ("group", "rate", "burst")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    group: str
    rate: float
    burst: float
    def __init__(self, group: _Optional[str] = ..., rate: _Optional[float] = ..., burst: _Optional[float] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("name", "settings", "target", "admitted", "demand", "busy", "clients", "throttled", "unthrottled", "consumed_total", "admitted_total", "throttled_total", "budget_exhausted", "ramp_pool", "waited_total", "last_minute", "last_hour", "detail", "granted", "headroom", "would_refuse_total", "in_flight", "by_class", "largest_last_minute", "largest_last_hour")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    UNTHROTTLED_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    RAMP_POOL_FIELD_NUMBER: _ClassVar[int]
    WAITED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    WOULD_REFUSE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: GroupSettings
    target: float
    admitted: float
    demand: float
    busy: bool
    clients: int
    throttled: float
    unthrottled: float
    consumed_total: float
    admitted_total: int
    throttled_total: int
    budget_exhausted: bool
    ramp_pool: float
    waited_total: int
    last_minute: RateMarks
    last_hour: RateMarks
    detail: Consumption
    granted: float
    headroom: float
    would_refuse_total: int
    in_flight: int
    by_class: _containers.RepeatedCompositeFieldContainer[ClassCounts]
    largest_last_minute: float
    largest_last_hour: float
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[GroupSettings, _Mapping]] = ..., target: _Optional[float] = ..., admitted: _Optional[float] = ..., demand: _Optional[float] = ..., busy: _Optional[bool] = ..., clients: _Optional[int] = ..., throttled: _Optional[float] = ..., unthrottled: _Optional[float] = ..., consumed_total: _Optional[float] = ..., admitted_total: _Optional[int] = ..., throttled_total: _Optional[int] = ..., budget_exhausted: _Optional[bool] = ..., ramp_pool: _Optional[float] = ..., waited_total: _Optional[int] = ..., last_minute: _Optional[_Union[RateMarks, _Mapping]] = ..., last_hour: _Optional[_Union[RateMarks, _Mapping]] = ..., detail: _Optional[_Union[Consumption, _Mapping]] = ..., granted: _Optional[float] = ..., headroom: _Optional[float] = ..., would_refuse_total: _Optional[int] = ..., in_flight: _Optional[int] = ..., by_class: _Optional[_Iterable[_Union[ClassCounts, _Mapping]]] = ..., largest_last_minute: _Optional[float] = ..., largest_last_hour: _Optional[float] = ...) -> None: ...

class TokenStatus(_message.Message):
    __slots__ = ("id", "label", "consumed_total", "admitted_total", "throttled_total", "last_minute", "last_hour", "largest_last_minute", "largest_last_hour")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    LARGEST_LAST_MINUTE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    consumed_total: float
    admitted_total: int
    throttled_total: int
    last_minute: RateMarks
    last_hour: RateMarks
    largest_last_minute: float
    largest_last_hour: float
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ..., consumed_total: _Optional[float] = ..., admitted_total: _Optional[int] = ..., throttled_total: _Optional[int] = ..., last_minute: _Optional[_Union[RateMarks, _Mapping]] = ..., last_hour: _Optional[_Union[RateMarks, _Mapping]] = ..., largest_last_minute: _Optional[float] = ..., largest_last_hour: _Optional[float] = ...) -> None: ...

class RateMarks(_message.Message):
    __slots__ = ("low", "high", "average")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_FIELD_NUMBER: _ClassVar[int]
    low: float
    high: float
    average: float
    def __init__(self, low: _Optional[float] = ..., high: _Optional[float] = ..., average: _Optional[float] = ...) -> None: ...
