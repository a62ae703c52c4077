"""The spend gate's shared state in Redis: admissions, reservations, settlements, the ledger.

Every money-moving step is ONE atomic Lua script (``spend/lua/*.lua``, run with
EVALSHA through redis-py's ``register_script``): admit, extend, heartbeat, settle,
reap. Many gateway processes on many hosts share one Redis; the scripts are what
makes their concurrent decisions add up (no read-modify-write from Python).

Time is an argument everywhere (``now_ms``, unix milliseconds, UTC); scripts never
call TIME, so a replayed request (spend/journal.py) is judged by when it happened.
Gateways must keep their clocks NTP-synced: leases are compared across hosts.

Key layout (prefix ``P``, default ``"rutster"``), all money in integer micros:

- ``P:global`` hash ``killed``, ``max_concurrent``; ``P:active`` zset call → lease expiry ms.
- ``P:tenant:{t}:limits`` hash (:class:`spend.limits.TenantLimits`);
  ``P:tenant:{t}:active`` zset; ``P:tenant:{t}:d:{YYYYMMDD}`` and ``:m:{YYYYMM}`` hashes
  ``spent``/``reserved`` (a call's money belongs to the day and month of its admission);
  ``P:tenant:{t}:h:{YYYYMMDDHH}`` settled spend per hour; ``P:tenant:{t}:calls`` zset
  call → created ms; ``P:tenants`` set.
- ``P:caller:{t}:{caller}`` / ``P:campaign:{t}:{campaign}`` sliding-window zsets.
- ``P:call:{id}`` hash (see :class:`CallRecord`); ``P:receipts:{id}`` stream.
- ``P:ledger`` stream: ``type`` reserve | extend | settle | refuse | reap | adjust, ``call``,
  ``tenant``, ``amount``, ``reserved_total``, ``reason``, ``at``. Balances:
  ``spent == sum(settle + reap + adjust amounts)``; reserve/extend amounts add to
  ``reserved``, settle/reap release the call's ``reserved_total``; refuse moves nothing.
  The stream is trimmed (``ledger_max_entries``): it is an audit window, the balances
  live in the day/month hashes.
- ``P:refusals``, ``P:ended`` streams: recent admission refusals / ended calls (dashboard).

Deployment: a standalone Redis (or a primary with replicas, or one found through
Sentinel; Redis >= 6.2), or a Redis Cluster. Some scripts derive a tenant's keys from the
prefix inside Lua, which Cluster allows only when all of them share a hash slot: on a
Cluster the prefix is a hash tag, ``{P}`` (spend/redis_url.py), so every key is in one.

The Redis client is created by the caller; build it with :func:`redis_client` (or the
same settings on a ``BlockingConnectionPool`` of REDIS_MAX_CONNECTIONS:
``socket_timeout=REDIS_SOCKET_TIMEOUT_S, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
retry=Retry(NoBackoff(), REDIS_RETRIES), decode_responses=True``).
``decode_responses=True`` is required. Every script is idempotent, so the client's
automatic retry is safe (a retried admit gets its first answer back, flagged
``replayed``); only :meth:`SpendStore.add_receipt` may then write a receipt twice.

Failures: anything meaning "Redis is not reachable or not accepting writes right now"
(connection refused or lost, timeout, loading, out of memory, read-only replica...)
is raised as :class:`StoreUnavailable`, the one exception callers turn into a failure
policy. A Lua error that is our own bug stays a loud ``redis.exceptions.ResponseError``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any, Final, TypedDict, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.typing import EncodableT, FieldT

from rutster.spend.limits import (
    MAX_CALL_COST_MICROS,
    MAX_CALL_DURATION_S,
    MAX_CONCURRENT_CALLS,
    MAX_MONEY_MICROS,
    GlobalLimits,
    LimitsError,
    TenantLimits,
)
from rutster.spend.redis_url import (
    CLUSTER_SCHEMES,
    REDIS_UNAVAILABLE_ERRORS,
    SENTINEL_SCHEMES,
    RedisClient,
    cluster_client,
    is_unavailable_reply,
    sentinel_master,
)
from rutster.spend.tenant_id import TENANT_ID_RE

#: Default key prefix (design: issue 5).
DEFAULT_PREFIX = "rutster"
#: How long a settled call's hash and receipts are kept: 7 days (design: issue 5).
RECEIPT_RETENTION_S = 7 * 24 * 3600
#: Ledger stream length cap, approximate (MAXLEN ~) (design: issue 5).
LEDGER_MAX_ENTRIES = 1_000_000
#: Dashboard streams (recent refusals, recent ended calls) cap (design: issue 5).
RECENT_STREAM_MAX_ENTRIES = 1_000
#: Per-call receipts stream cap (design: issue 5).
RECEIPTS_MAX_ENTRIES = 2_000
#: Day buckets: 40 days, past the end of their month (design: issue 5).
DAY_KEY_TTL_S = 40 * 24 * 3600
#: Month buckets: 400 days, a year of history plus slack (design: issue 5).
MONTH_KEY_TTL_S = 400 * 24 * 3600
#: Hour buckets feed the dashboard's last-24 h chart; 8 days (design: issue 5).
HOUR_KEY_TTL_S = 8 * 24 * 3600
#: Sliding windows of the abuse limits: caller calls per hour, campaign calls per minute.
CALLER_WINDOW_MS = 3_600_000
CAMPAIGN_WINDOW_MS = 60_000
#: Receipts expire this long after their last write (the settlement then sets the real
#: retention): the retention plus the longest allowed call, so receipts of a call that
#: is never settled do not stay forever, and a live call's never expire under it.
RECEIPTS_UNSETTLED_TTL_S = RECEIPT_RETENTION_S + MAX_CALL_DURATION_S

#: Lease on a running call's slot. Seed decision: heartbeats every
#: HEARTBEAT_INTERVAL_MS, so a live gateway misses six in a row before its calls are
#: reaped; a dead one holds its slots at most this long.
DEFAULT_LEASE_MS = 30_000
#: Suggested heartbeat period for the gate (lease / 6, see DEFAULT_LEASE_MS).
HEARTBEAT_INTERVAL_MS = 5_000
#: How often each gateway node beats into the node directory (``P:nodes``). Seed
#: decision: often enough that a dead node is seen within seconds, one ZADD a beat.
NODE_BEAT_INTERVAL_MS = 2_000
#: A node whose last beat is older than this is dead and its live calls orphans
#: (lua/orphans.lua): five beats missed, so a node whose loop stalls a few seconds
#: under load is not taken for dead. Seed decision. A dead node's calls are settled
#: within this plus one beat interval of its last beat.
NODE_DEAD_AFTER_MS = 10_000
#: Calls one reap run settles at most: Redis runs one script at a time, so a run must
#: stay short. Measured on the CI machine: ~25 µs per reaped call, so a full batch
#: holds Redis ~2.5 ms.
REAP_BATCH = 100

#: Client read/write timeout, seconds. Seed decision: 500x the 1 ms p99 goal of a gate
#: op (bench/spend_gate.py) yet far inside a reservation's low-water margin (a quarter
#: of a 60 s quantum), so an unreachable Redis is noticed and the failure policy applied
#: long before a call could outrun its reserved money.
REDIS_SOCKET_TIMEOUT_S = 0.5
#: Client connect timeout, seconds (same reasoning as REDIS_SOCKET_TIMEOUT_S).
REDIS_CONNECT_TIMEOUT_S = 0.5
#: Client retries after a connection error or timeout: one, at once, so a pooled
#: connection that died with a Redis restart is replaced transparently. More would only
#: delay StoreUnavailable (redis-py's default is 10 with backoff up to 1 s each).
REDIS_RETRIES = 1
#: Connections the client keeps at most; one more store operation waits for a free one, up
#: to REDIS_POOL_WAIT_S, then fails as StoreUnavailable. Why a bound: redis-py's default pool
#: opens one connection per operation in flight and keeps them all, so a stall under load left
#: 101 open after the ten-minute hostile campaign (2026-12-05), descriptors the gateway's fd
#: budget (README, "Bad input": the hostile-input campaign) must count. 64 operations of
#: ~0.2 ms each in flight serve far more than the gateway's calls ask (a meter tick per
#: call every second or so).
REDIS_MAX_CONNECTIONS = 64
#: Longest wait for a free pooled connection: the same bound as an operation's own reply.
REDIS_POOL_WAIT_S = REDIS_SOCKET_TIMEOUT_S

#: Longest call metadata, as compact JSON (design: issue 5, "metadata ≤ 2 KB").
METADATA_MAX_BYTES = 2_048
#: Longest descriptive string on a call (a brain may be a ws(s) URL ≤ 2048 chars: REST API).
FIELD_MAX_CHARS = 2_048
#: Receipt limits: fields per receipt and characters per value. Seed decision: receipts are
#: small content-free facts; anything bigger is a bug or abuse.
RECEIPT_MAX_FIELDS = 32
RECEIPT_VALUE_MAX_CHARS = 1_024
#: list_calls: page size bounds (REST API: limit 1..200, default 50) and how many Redis
#: batches one page may scan when a status filter skips most calls.
LIST_DEFAULT_LIMIT = 50
LIST_MAX_LIMIT = 200
LIST_MAX_BATCHES = 10
#: active_calls: at most this many calls returned. Seed decision: a dashboard table.
ACTIVE_LIST_MAX = 1_000

#: Identifiers end up inside Redis keys; ':' is the key separator, so it is not allowed
#: (tenant ids: spend/tenant_id.py).
CALL_ID_PATTERN = r"[A-Za-z0-9_.-]{1,128}"
CAMPAIGN_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
#: A key prefix: a plain one, or (on a Redis Cluster) the same as a hash tag ``{prefix}``.
PREFIX_PATTERN = r"[A-Za-z0-9_.:-]{1,64}|\{[A-Za-z0-9_.:-]{1,64}\}"
END_REASON_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
_CALL_RE = re.compile(CALL_ID_PATTERN)
#: A gateway node's id (RUTSTER_NODE_ID; gateway/control_channel.py checks the same).
_NODE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_CAMPAIGN_RE = re.compile(CAMPAIGN_PATTERN)
_PREFIX_RE = re.compile(PREFIX_PATTERN)
_END_REASON_RE = re.compile(END_REASON_PATTERN)
_DAY_RE = re.compile(r"\d{8}")
_MONTH_RE = re.compile(r"\d{6}")
_HOUR_RE = re.compile(r"\d{10}")

#: Call statuses stored in ``P:call:{id}``.
CALL_STATUSES: Final = ("admitted", "active", "ended", "refused")
#: Descriptive call fields update_call may set (money fields only move through scripts).


class RefusalReason:
    """Why the store said no (``AdmitResult.reason`` / ``ExtendResult.reason``)."""

    KILL_SWITCH: Final = "kill_switch"
    GLOBAL_CONCURRENCY: Final = "global_concurrency"
    TENANT_CONCURRENCY: Final = "tenant_concurrency"
    CALLER_RATE: Final = "caller_rate"
    CAMPAIGN_RATE: Final = "campaign_rate"
    BUDGET_DAY: Final = "budget_day"
    BUDGET_MONTH: Final = "budget_month"
    DUPLICATE_CALL: Final = "duplicate_call"
    #: extend only: the extension would pass the call's own cost cap.
    MAX_CALL_COST: Final = "max_call_cost"
    #: extend only: the call is not known, has ended or was refused.
    UNKNOWN_CALL: Final = "unknown_call"
    NOT_ACTIVE: Final = "not_active"
    #: extend only: an older sequence number than the call's last applied op.
    STALE: Final = "stale"

    #: Every reason admit can return on refusal.
    ADMIT: Final = (
        KILL_SWITCH,
        GLOBAL_CONCURRENCY,
        TENANT_CONCURRENCY,
        CALLER_RATE,
        CAMPAIGN_RATE,
        BUDGET_DAY,
        BUDGET_MONTH,
        DUPLICATE_CALL,
    )
    #: Every reason extend can return when not granted.
    EXTEND: Final = (
        KILL_SWITCH,
        MAX_CALL_COST,
        BUDGET_DAY,
        BUDGET_MONTH,
        UNKNOWN_CALL,
        NOT_ACTIVE,
        STALE,
    )


class StoreUnavailable(Exception):
    """Redis cannot be reached or cannot take writes right now; apply the failure policy."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        # The cause's own words, bounded: redis-py's connection and reply errors name the
        # address and the server's reply, never the credentials.
        detail = str(cause)[:200]
        super().__init__(
            f"spend store unavailable during {operation}: {type(cause).__name__}"
            + (f" ({detail})" if detail else "")
        )
        self.operation = operation


@contextlib.contextmanager
def _unavailable_as(operation: str) -> Iterator[None]:
    try:
        yield
    except REDIS_UNAVAILABLE_ERRORS as exc:
        raise StoreUnavailable(operation, exc) from exc
    except redis_errors.ResponseError as exc:
        if is_unavailable_reply(exc):
            raise StoreUnavailable(operation, exc) from exc
        raise


def redis_client(url: str) -> RedisClient:
    """A ``redis.asyncio.Redis`` with the settings this store expects (see module doc), on a
    pool of at most :data:`REDIS_MAX_CONNECTIONS`; closing the client closes the pool.
    A ``redis+sentinel://`` URL gives the master the Sentinels name, a ``redis+cluster://``
    URL a ``RedisCluster`` client (spend/redis_url.py)."""
    settings: dict[str, Any] = {
        "max_connections": REDIS_MAX_CONNECTIONS,
        "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
        "retry": Retry(NoBackoff(), REDIS_RETRIES),
        "decode_responses": True,
    }
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        # Connections per node; the cluster client fails an operation at once when they
        # are all busy, rather than waiting REDIS_POOL_WAIT_S for one.
        return cluster_client(url, **settings)
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        return sentinel_master(url, **settings)
    pool = BlockingConnectionPool.from_url(url, timeout=REDIS_POOL_WAIT_S, **settings)
    return Redis.from_pool(pool)


def redis_listener(url: str) -> RedisClient:
    """A client for a pub/sub subscriber: no read timeout (it waits indefinitely for the
    next message), one connection; through the Sentinels for a Sentinel URL; on a
    Cluster, the subscriber connects to the master of its channel's slot."""
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        return cluster_client(
            url,
            decode_responses=True,
            socket_timeout=None,  # RedisCluster's default is 5 s
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        )
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        return sentinel_master(
            url, decode_responses=True, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S
        )
    return Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def time_buckets(unix_ms: int) -> tuple[str, str, str]:
    """``(day "YYYYMMDD", month "YYYYMM", hour "YYYYMMDDHH")`` of ``unix_ms``, in UTC."""
    moment = _EPOCH + timedelta(milliseconds=unix_ms)
    return moment.strftime("%Y%m%d"), moment.strftime("%Y%m"), moment.strftime("%Y%m%d%H")


def _check_id(kind: str, value: object, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"invalid {kind} {str(value)[:80]!r}: must match {pattern.pattern}")
    return value


def _check_count(name: str, value: object, maximum: int, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be in {minimum}..{maximum}, got {value}")
    return value


def _check_text(name: str, value: object, max_chars: int = FIELD_MAX_CHARS) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise ValueError(f"{name} is longer than {max_chars} characters")
    return value


#: Largest unix-ms time accepted (year 9999): beyond it time_buckets cannot name the day.
_MAX_UNIX_MS = 253_402_300_799_999


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """Everything admit needs to decide on and record a new call.

    ``quantum`` is the first reservation (micros). ``force`` records the call without any
    check (used to replay an admission the gateway allowed while Redis was down, under a
    fail-open policy). ``check_caller`` off skips the per-caller rate limit (e.g. for
    outbound calls, where the "caller" is the tenant's own number).
    """

    call_id: str
    tenant: str
    now_ms: int
    quantum: int
    provider: str
    direction: str
    caller: str = ""
    to: str = ""
    brain: str = ""
    campaign: str = ""
    node: str = ""
    max_cost: int = 0
    max_duration_s: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)
    provider_call_id: str = ""
    lease_ms: int = DEFAULT_LEASE_MS
    check_caller: bool = True
    force: bool = False

    def __post_init__(self) -> None:
        _check_id("call id", self.call_id, _CALL_RE)
        _check_id("tenant", self.tenant, TENANT_ID_RE)
        _check_count("now_ms", self.now_ms, _MAX_UNIX_MS)
        _check_count("quantum", self.quantum, MAX_MONEY_MICROS)
        _check_count("max_cost", self.max_cost, MAX_CALL_COST_MICROS)
        _check_count("max_duration_s", self.max_duration_s, MAX_CALL_DURATION_S)
        _check_count("lease_ms", self.lease_ms, MAX_CALL_DURATION_S * 1000, minimum=1)
        for name in ("provider", "direction", "caller", "to", "brain", "node", "provider_call_id"):
            _check_text(name, getattr(self, name))
        if self.campaign:
            _check_id("campaign", self.campaign, _CAMPAIGN_RE)
        if not isinstance(self.check_caller, bool) or not isinstance(self.force, bool):
            raise ValueError("check_caller and force must be booleans")
        if len(self.metadata_json()) > METADATA_MAX_BYTES:
            raise ValueError(f"metadata is larger than {METADATA_MAX_BYTES} bytes as JSON")

    def metadata_json(self) -> str:
        """The metadata as compact JSON (validated: string keys and values only)."""
        if not isinstance(self.metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.metadata.items()
        ):
            raise ValueError("metadata must map strings to strings")
        return json.dumps(dict(self.metadata), separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class AdmitResult:
    """Admission outcome. ``global_active``/``tenant_active`` are the live leases seen
    inside the atomic step (including this call when admitted); ``replayed`` is set
    when this exact request had already been decided (the first answer is returned)."""

    admitted: bool
    reason: str
    global_active: int
    tenant_active: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class ExtendResult:
    """Extension outcome; ``reserved_total`` is the call's total reservation afterwards
    (feed it to the meter whatever ``granted`` says)."""

    granted: bool
    reason: str
    reserved_total: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """Heartbeat outcome: ``applied`` (lease renewed, cost recorded), ``status`` (ok |
    stale | not_active | unknown_call) and whether the kill switch is engaged."""

    applied: bool
    status: str
    killed: bool


@dataclass(frozen=True, slots=True)
class HoldResult:
    """What :meth:`SpendStore.hold` found: held (lease renewed), and the call's status."""

    held: bool
    status: str


@dataclass(frozen=True, slots=True)
class OrphanReport:
    """What :meth:`SpendStore.settle_orphans` did: calls settled, dead nodes forgotten."""

    settled: int
    nodes_forgotten: int


@dataclass(frozen=True, slots=True)
class ConnectResult:
    """What :meth:`SpendStore.connect` found: ``won`` (this node's stream made the call
    active), the call's status after it, and the node that owns the call's media."""

    won: bool
    status: str
    node: str


@dataclass(frozen=True, slots=True)
class SettleResult:
    """Settlement outcome. ``status``: settled | adjusted (corrected a reaper's
    conservative settlement) | replayed (already settled: nothing changed) |
    unknown_call | not_admitted | connected (``unconnected_only`` and the call's media
    had started: nothing changed). ``replayed`` is True when nothing changed."""

    replayed: bool
    status: str
    reserved_total: int
    spent: int


class CallRecord(TypedDict):
    """One call as stored in ``P:call:{id}``, typed. Money in micros."""

    id: str
    tenant: str
    status: str
    day: str
    month: str
    provider: str
    direction: str
    caller: str
    to: str
    brain: str
    campaign: str
    node: str
    provider_call_id: str
    reserved: int
    cost: int
    spent: int | None
    seq: int
    created_ms: int
    answered_ms: int | None
    ended_ms: int | None
    end_reason: str | None
    max_cost: int
    max_duration_s: int
    metadata: dict[str, str]
    reaped: bool


class SpendTotals(TypedDict):
    """Spent and reserved micros in one day or month bucket."""

    spent: int
    reserved: int


class TenantSpend(TypedDict):
    """:meth:`SpendStore.tenant_spend`: per day, per month, per hour (settled only)."""

    days: dict[str, SpendTotals]
    months: dict[str, SpendTotals]
    hours: dict[str, int]


def _int(raw: str | None, name: str, call_id: str) -> int:
    if raw is None or raw == "":
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"call {call_id}: stored {name} {raw[:32]!r} is not an integer") from None


def _optional_int(raw: str | None, name: str, call_id: str) -> int | None:
    return None if raw is None or raw == "" else _int(raw, name, call_id)


def _metadata(raw: str | None) -> dict[str, str]:
    # Written by admit from validated input; anything else is shown as empty, not fatal.
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def call_record(call_id: str, raw: Mapping[str, str]) -> CallRecord:
    """Type a ``P:call:{id}`` hash (raises ValueError on a corrupt money field)."""
    return CallRecord(
        id=call_id,
        tenant=raw.get("tenant", ""),
        status=raw.get("status", ""),
        day=raw.get("day", ""),
        month=raw.get("month", ""),
        provider=raw.get("provider", ""),
        direction=raw.get("direction", ""),
        caller=raw.get("caller", ""),
        to=raw.get("to", ""),
        brain=raw.get("brain", ""),
        campaign=raw.get("campaign", ""),
        node=raw.get("node", ""),
        provider_call_id=raw.get("provider_call_id", ""),
        reserved=_int(raw.get("reserved"), "reserved", call_id),
        cost=_int(raw.get("cost"), "cost", call_id),
        spent=_optional_int(raw.get("spent"), "spent", call_id),
        seq=_int(raw.get("seq"), "seq", call_id),
        created_ms=_int(raw.get("created_ms"), "created_ms", call_id),
        answered_ms=_optional_int(raw.get("answered_ms"), "answered_ms", call_id),
        ended_ms=_optional_int(raw.get("ended_ms"), "ended_ms", call_id),
        end_reason=raw.get("end_reason") or None,
        max_cost=_int(raw.get("max_cost"), "max_cost", call_id),
        max_duration_s=_int(raw.get("max_duration_s"), "max_duration_s", call_id),
        metadata=_metadata(raw.get("metadata")),
        reaped=raw.get("reaped") == "1",
    )


@dataclass(frozen=True, slots=True)
class StoreKeys:
    """The Redis key names under one prefix (module doc has the layout)."""

    prefix: str

    @property
    def global_(self) -> str:
        """``P:global`` hash: kill switch, global concurrency cap."""
        return f"{self.prefix}:global"

    @property
    def active(self) -> str:
        """``P:active`` zset: call id -> lease expiry (ms), every tenant."""
        return f"{self.prefix}:active"

    @property
    def ledger(self) -> str:
        """``P:ledger`` stream."""
        return f"{self.prefix}:ledger"

    @property
    def refusals(self) -> str:
        """``P:refusals`` stream (recent admission refusals)."""
        return f"{self.prefix}:refusals"

    @property
    def ended(self) -> str:
        """``P:ended`` stream (recent ended calls)."""
        return f"{self.prefix}:ended"

    @property
    def tenants(self) -> str:
        """``P:tenants`` set of tenant ids."""
        return f"{self.prefix}:tenants"

    def tenant(self, tenant: str, part: str) -> str:
        """``P:tenant:{t}:{part}`` (part: limits, active, calls, d:DAY, m:MONTH, h:HOUR)."""
        return f"{self.prefix}:tenant:{tenant}:{part}"

    def day(self, tenant: str, day: str) -> str:
        """Day bucket hash (``spent``, ``reserved``), day as YYYYMMDD."""
        return self.tenant(tenant, f"d:{day}")

    def month(self, tenant: str, month: str) -> str:
        """Month bucket hash (``spent``, ``reserved``), month as YYYYMM."""
        return self.tenant(tenant, f"m:{month}")

    def hour(self, tenant: str, hour: str) -> str:
        """Settled spend in one hour (int), hour as YYYYMMDDHH."""
        return self.tenant(tenant, f"h:{hour}")

    @property
    def nodes(self) -> str:
        """``P:nodes`` zset: gateway node -> its last beat (unix ms)."""
        return f"{self.prefix}:nodes"

    def node_info(self, node: str) -> str:
        """``P:node:{id}:info`` hash: what a live node tells the others (expires)."""
        return f"{self.prefix}:node:{node}:info"

    def call(self, call_id: str) -> str:
        """``P:call:{id}`` hash."""
        return f"{self.prefix}:call:{call_id}"

    def receipts(self, call_id: str) -> str:
        """``P:receipts:{id}`` stream."""
        return f"{self.prefix}:receipts:{call_id}"

    def caller(self, tenant: str, caller: str) -> str:
        """Sliding-window zset of one caller's calls."""
        return f"{self.prefix}:caller:{tenant}:{caller}"

    def campaign(self, tenant: str, campaign: str) -> str:
        """Sliding-window zset of one campaign's calls."""
        return f"{self.prefix}:campaign:{tenant}:{campaign}"


def _load_script(name: str) -> str:
    """The script ``lua/<name>.lua`` behind the shared helpers of ``lua/common.lua``."""
    folder = files("rutster.spend") / "lua"
    common = (folder / "common.lua").read_text(encoding="utf-8")
    return common + (folder / f"{name}.lua").read_text(encoding="utf-8")


_SCRIPT_NAMES: Final = (
    "admit",
    "extend",
    "heartbeat",
    "hold",
    "settle",
    "reap",
    "annotate",
    "connect",
    "orphans",
)


# Reply shapes of a decode_responses=True client (redis-py types them as bytes | str).
_StreamReply = list[tuple[str, dict[str, str]]]
_ScoredReply = list[tuple[str, float]]


def _stream_entries(raw: _StreamReply) -> list[dict[str, str]]:
    return [{"id": entry_id, **fields} for entry_id, fields in raw]


def _receipt_value(value: str | int | float | bool | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        text = value if isinstance(value, str) else repr(value)
        if len(text) > RECEIPT_VALUE_MAX_CHARS:
            raise ValueError(f"receipt value longer than {RECEIPT_VALUE_MAX_CHARS} characters")
        return text
    raise ValueError(f"receipt value of type {type(value).__name__} is not a flat value")


def _encode_cursor(score: int, member: str) -> str:
    return f"{score}:{member}"


def _decode_cursor(cursor: str) -> tuple[int, str]:
    score_text, sep, member = cursor.partition(":")
    if not sep or not score_text.isdigit() or not _CALL_RE.fullmatch(member):
        raise ValueError("invalid cursor")
    return int(score_text), member


class SpendStore:
    """Async access to the spend gate's Redis state (see the module doc).

    ``redis`` must be built with ``decode_responses=True`` (see :func:`redis_client`).
    """

    def __init__(
        self,
        redis: RedisClient,
        prefix: str = DEFAULT_PREFIX,
        *,
        retention_s: int = RECEIPT_RETENTION_S,
        ledger_max_entries: int = LEDGER_MAX_ENTRIES,
    ) -> None:
        _check_id("key prefix", prefix, _PREFIX_RE)
        if not redis.get_connection_kwargs().get("decode_responses"):
            raise ValueError("SpendStore needs a Redis client with decode_responses=True")
        if isinstance(redis, RedisCluster) and not prefix.startswith("{"):
            # Without a hash tag the scripts' keys would fall in many slots: CROSSSLOT.
            raise ValueError(
                "on a Redis Cluster the key prefix must be a hash tag "
                "(spend.redis_url.cluster_key_prefix)"
            )
        self.redis = redis
        self.keys = StoreKeys(prefix)
        self.retention_s = _check_count("retention_s", retention_s, 10 * 365 * 86_400, minimum=1)
        self.ledger_max_entries = _check_count(
            "ledger_max_entries", ledger_max_entries, 10**9, minimum=1
        )
        #: Receipts that could not be written (Redis unavailable): counted drops.
        self.receipt_failures = 0
        scripts = {name: redis.register_script(_load_script(name)) for name in _SCRIPT_NAMES}
        self._admit = scripts["admit"]
        self._extend = scripts["extend"]
        self._heartbeat = scripts["heartbeat"]
        self._hold = scripts["hold"]
        self._settle = scripts["settle"]
        self._reap = scripts["reap"]
        self._annotate = scripts["annotate"]
        self._connect = scripts["connect"]
        self._orphans = scripts["orphans"]

    def __repr__(self) -> str:
        return f"SpendStore(prefix={self.keys.prefix!r})"

    def _closing_args(self, hour: str) -> list[str | int]:
        """What every script that ends a call takes after its own arguments (settle.lua,
        reap.lua, orphans.lua): the hour bucket, retention, ledger and stream bounds,
        bucket TTLs."""
        return [
            hour,
            self.retention_s,
            self.ledger_max_entries,
            RECENT_STREAM_MAX_ENTRIES,
            DAY_KEY_TTL_S,
            MONTH_KEY_TTL_S,
            HOUR_KEY_TTL_S,
        ]

    # -- money-moving scripts -------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        """Decide on and record a new call in one atomic step (see ``lua/admit.lua``)."""
        k = self.keys
        t = request.tenant
        day, month, _ = time_buckets(request.now_ms)
        call_fields = (
            ("provider", request.provider),
            ("direction", request.direction),
            ("to", request.to),
            ("brain", request.brain),
            ("node", request.node),
            ("max_cost", str(request.max_cost)),
            ("max_duration_s", str(request.max_duration_s)),
            ("metadata", request.metadata_json()),
            ("provider_call_id", request.provider_call_id),
        )
        keys = [
            k.global_,
            k.active,
            k.tenant(t, "limits"),
            k.tenant(t, "active"),
            k.day(t, day),
            k.month(t, month),
            k.caller(t, request.caller),
            k.campaign(t, request.campaign),
            k.call(request.call_id),
            k.tenant(t, "calls"),
            k.ledger,
            k.refusals,
            k.tenants,
            k.receipts(request.call_id),
        ]
        args: list[str | int] = [
            request.call_id,
            t,
            request.now_ms,
            day,
            month,
            request.quantum,
            request.lease_ms,
            request.caller,
            request.campaign,
            int(request.check_caller),
            int(request.force),
            self.retention_s * 1000,
            self.ledger_max_entries,
            RECENT_STREAM_MAX_ENTRIES,
            DAY_KEY_TTL_S,
            MONTH_KEY_TTL_S,
            CALLER_WINDOW_MS,
            CAMPAIGN_WINDOW_MS,
            RECEIPTS_MAX_ENTRIES,
        ]
        for name, value in call_fields:
            args += [name, value]
        with _unavailable_as("admit"):
            reply = await self._admit(keys=keys, args=args)
        admitted, reason, global_active, tenant_active, replayed = reply
        return AdmitResult(
            admitted=bool(admitted),
            reason=str(reason),
            global_active=int(global_active),
            tenant_active=int(tenant_active),
            replayed=bool(replayed),
        )

    async def extend(
        self,
        call_id: str,
        seq: int,
        amount: int,
        now_ms: int,
        cost: int,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> ExtendResult:
        """Reserve ``amount`` more for a running call; renews its lease and records the
        running ``cost`` either way (see ``lua/extend.lua``)."""
        _check_id("call id", call_id, _CALL_RE)
        _check_count("seq", seq, 2**53, minimum=1)
        _check_count("amount", amount, MAX_MONEY_MICROS)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_count("cost", cost, MAX_MONEY_MICROS)
        _check_count("lease_ms", lease_ms, MAX_CALL_DURATION_S * 1000, minimum=1)
        k = self.keys
        with _unavailable_as("extend"):
            reply = await self._extend(
                keys=[k.call(call_id), k.global_, k.active, k.ledger],
                args=[
                    k.prefix,
                    call_id,
                    seq,
                    amount,
                    now_ms,
                    lease_ms,
                    cost,
                    self.ledger_max_entries,
                    DAY_KEY_TTL_S,
                    MONTH_KEY_TTL_S,
                ],
            )
        granted, reason, reserved_total, replayed = reply
        return ExtendResult(bool(granted), str(reason), int(reserved_total), bool(replayed))

    async def heartbeat(
        self,
        call_id: str,
        seq: int,
        now_ms: int,
        cost: int,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> HeartbeatResult:
        """Renew a running call's lease and record its running cost (no money moves)."""
        _check_id("call id", call_id, _CALL_RE)
        _check_count("seq", seq, 2**53, minimum=1)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_count("cost", cost, MAX_MONEY_MICROS)
        _check_count("lease_ms", lease_ms, MAX_CALL_DURATION_S * 1000, minimum=1)
        k = self.keys
        with _unavailable_as("heartbeat"):
            applied, status, killed = await self._heartbeat(
                keys=[k.call(call_id), k.global_, k.active],
                args=[k.prefix, call_id, seq, now_ms, lease_ms, cost],
            )
        return HeartbeatResult(bool(applied), str(status), bool(killed))

    async def hold(
        self, call_id: str, now_ms: int, *, lease_ms: int = DEFAULT_LEASE_MS
    ) -> HoldResult:
        """Renew the lease of a call that is admitted but not connected (see ``lua/hold.lua``).

        A ringing outbound call must not be reaped at its full reservation: nothing is
        billed until it is answered. ``held`` is False once the call is active or ended.
        """
        _check_id("call id", call_id, _CALL_RE)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_count("lease_ms", lease_ms, MAX_CALL_DURATION_S * 1000, minimum=1)
        k = self.keys
        with _unavailable_as("hold"):
            held, status = await self._hold(
                keys=[k.call(call_id), k.active], args=[k.prefix, call_id, now_ms, lease_ms]
            )
        return HoldResult(bool(held), str(status))

    async def settle(
        self,
        call_id: str,
        seq: int,
        actual: int,
        now_ms: int,
        end_reason: str,
        *,
        unconnected_only: bool = False,
    ) -> SettleResult:
        """Record the call's actual cost and release its reservation (idempotent).

        ``unconnected_only``: settle only while the call is still "admitted" (never
        connected); a call whose media started meanwhile, on any node, is left as it
        is (status "connected"). Checked atomically against :meth:`connect`.
        """
        _check_id("call id", call_id, _CALL_RE)
        _check_count("seq", seq, 2**53, minimum=1)
        _check_count("actual", actual, MAX_MONEY_MICROS)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_id("end reason", end_reason, _END_REASON_RE)
        _, _, hour = time_buckets(now_ms)
        k = self.keys
        with _unavailable_as("settle"):
            applied, status, reserved_total, spent = await self._settle(
                keys=[k.call(call_id), k.active, k.ledger, k.ended, k.receipts(call_id)],
                args=[
                    k.prefix,
                    call_id,
                    seq,
                    actual,
                    now_ms,
                    end_reason,
                    *self._closing_args(hour),
                    "1" if unconnected_only else "0",
                ],
            )
        return SettleResult(
            replayed=not applied,
            status=str(status),
            reserved_total=int(reserved_total),
            spent=int(spent),
        )

    async def reap(self, now_ms: int, limit: int = REAP_BATCH) -> int:
        """Settle up to ``limit`` calls whose lease expired at their full reservation;
        returns how many. Run it periodically from any node (it is safe to race)."""
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_count("limit", limit, 100_000, minimum=1)
        _, _, hour = time_buckets(now_ms)
        k = self.keys
        with _unavailable_as("reap"):
            reaped = await self._reap(
                keys=[k.active, k.ledger, k.ended],
                args=[
                    k.prefix,
                    now_ms,
                    limit,
                    *self._closing_args(hour),
                ],
            )
        return int(reaped)

    async def connect(self, call_id: str, node: str, now_ms: int) -> ConnectResult:
        """The call's media stream started on ``node``: admitted -> active in one atomic
        step (see ``lua/connect.lua``). Exactly one node wins a call; a call already
        settled as never connected is not started (``won`` False, status "ended")."""
        _check_id("call id", call_id, _CALL_RE)
        _check_text("node", node)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        with _unavailable_as("connect"):
            won, status, owner = await self._connect(
                keys=[self.keys.call(call_id)], args=[node, now_ms, self.keys.prefix, call_id]
            )
        return ConnectResult(bool(won), str(status), str(owner))

    # -- the node directory ------------------------------------------------------------

    async def node_beat(
        self, node: str, now_ms: int, info: Mapping[str, str] | None = None
    ) -> None:
        """``node`` is alive at ``now_ms`` (every gateway, every
        :data:`NODE_BEAT_INTERVAL_MS`), with what it tells the others about itself
        (``info``, e.g. its free SIP worker capacity; kept until it stops beating)."""
        _check_id("node", node, _NODE_RE)
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        fields = {
            _check_text("info name", k, 64): _check_text("info value", v, 256)
            for k, v in (info or {}).items()
        }
        with _unavailable_as("node_beat"):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zadd(self.keys.nodes, {node: now_ms})
                key = self.keys.node_info(node)
                pipe.delete(key)
                if fields:
                    for name, value in fields.items():
                        pipe.hset(key, name, value)
                    pipe.pexpire(key, NODE_DEAD_AFTER_MS)
                await pipe.execute()

    async def live_nodes(
        self, now_ms: int, *, dead_after_ms: int = NODE_DEAD_AFTER_MS
    ) -> dict[str, dict[str, str]]:
        """The nodes that beat within ``dead_after_ms`` of ``now_ms``, with their info."""
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        with _unavailable_as("live_nodes"):
            nodes = cast(
                list[str],
                await self.redis.zrangebyscore(self.keys.nodes, now_ms - dead_after_ms, "+inf"),
            )
            async with self.redis.pipeline(transaction=False) as pipe:
                for node in nodes:
                    pipe.hgetall(self.keys.node_info(node))
                infos = cast(list[dict[str, str]], await pipe.execute())
        return dict(zip(nodes, infos, strict=True))

    async def node_leave(self, node: str) -> None:
        """``node`` stopped cleanly (its calls are over): out of the directory."""
        _check_id("node", node, _NODE_RE)
        with _unavailable_as("node_leave"):
            await self.redis.zrem(self.keys.nodes, node)
            await self.redis.delete(self.keys.node_info(node))

    async def nodes(self) -> dict[str, int]:
        """Every node in the directory and its last beat (unix ms)."""
        with _unavailable_as("nodes"):
            raw = cast(
                list[tuple[str, float]],
                await self.redis.zrange(self.keys.nodes, 0, -1, withscores=True),
            )
        return {node: int(score) for node, score in raw}

    async def settle_orphans(
        self,
        now_ms: int,
        *,
        dead_after_ms: int = NODE_DEAD_AFTER_MS,
        restarted_node: str = "",
        limit: int = REAP_BATCH,
    ) -> OrphanReport:
        """Settle the live calls of nodes that have not beaten for ``dead_after_ms`` (and
        of ``restarted_node``, this node's previous life under the same id) from their
        last reported cost (see ``lua/orphans.lua``). Safe to race from every node."""
        _check_count("now_ms", now_ms, _MAX_UNIX_MS)
        _check_count("dead_after_ms", dead_after_ms, _MAX_UNIX_MS, minimum=1)
        _check_count("limit", limit, 100_000, minimum=1)
        if restarted_node:
            _check_id("node", restarted_node, _NODE_RE)
        _, _, hour = time_buckets(now_ms)
        k = self.keys
        with _unavailable_as("settle_orphans"):
            settled, forgotten = await self._orphans(
                keys=[k.nodes, k.active, k.ledger, k.ended],
                args=[
                    k.prefix,
                    now_ms,
                    now_ms - dead_after_ms,
                    limit,
                    *self._closing_args(hour),
                    restarted_node,
                ],
            )
        return OrphanReport(int(settled), int(forgotten))

    async def update_call(
        self,
        call_id: str,
        *,
        provider_call_id: str | None = None,
        answered_ms: int | None = None,
    ) -> bool:
        """Set descriptive fields of a running call (the provider's call id, answer time).
        False if the call is unknown or no longer running. Its status changes only
        through :meth:`connect` (admitted -> active) and settlement (-> ended)."""
        _check_id("call id", call_id, _CALL_RE)
        pairs: list[str] = []
        if provider_call_id is not None:
            pairs += ["provider_call_id", _check_text("provider_call_id", provider_call_id)]
        if answered_ms is not None:
            pairs += ["answered_ms", str(_check_count("answered_ms", answered_ms, _MAX_UNIX_MS))]
        if not pairs:
            raise ValueError("update_call needs at least one field")
        with _unavailable_as("update_call"):
            written = await self._annotate(keys=[self.keys.call(call_id)], args=pairs)
        return bool(written)

    # -- receipts ---------------------------------------------------------------------

    async def add_receipt(
        self, call_id: str, fields: Mapping[str, str | int | float | bool | None]
    ) -> bool:
        """Append a content-free receipt to the call's stream; best effort.

        ``None`` values are left out; bools become "true"/"false". Returns False (and
        counts ``receipt_failures``) when Redis is unavailable; bad fields raise ValueError.
        """
        _check_id("call id", call_id, _CALL_RE)
        flat = {
            _check_text("receipt field", name, 64): _receipt_value(value)
            for name, value in fields.items()
            if value is not None
        }
        if not flat or len(flat) > RECEIPT_MAX_FIELDS:
            raise ValueError(f"a receipt needs 1..{RECEIPT_MAX_FIELDS} non-null fields")
        key = self.keys.receipts(call_id)
        try:
            with _unavailable_as("add_receipt"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    entry: dict[FieldT, EncodableT] = {name: value for name, value in flat.items()}
                    pipe.xadd(key, entry, maxlen=RECEIPTS_MAX_ENTRIES, approximate=True)
                    # Bounds receipts of a call that never settles; settle then sets the
                    # real retention (a receipt written after that extends it by at most
                    # RECEIPTS_UNSETTLED_TTL_S). EXPIRE NX would need Redis 7.
                    pipe.expire(key, RECEIPTS_UNSETTLED_TTL_S)
                    await pipe.execute()
        except StoreUnavailable:
            self.receipt_failures += 1
            return False
        return True

    async def receipts(self, call_id: str) -> list[dict[str, str]]:
        """The call's receipts, oldest first, each with its stream ``id``."""
        _check_id("call id", call_id, _CALL_RE)
        with _unavailable_as("receipts"):
            raw = await self.redis.xrange(self.keys.receipts(call_id))
        return _stream_entries(cast(_StreamReply, raw))

    # -- reads ------------------------------------------------------------------------

    async def get_call(self, call_id: str) -> CallRecord | None:
        """One call, or None if unknown (or expired after its retention)."""
        _check_id("call id", call_id, _CALL_RE)
        with _unavailable_as("get_call"):
            raw = cast(dict[str, str], await self.redis.hgetall(self.keys.call(call_id)))
        return call_record(call_id, raw) if raw else None

    async def list_calls(
        self,
        tenant: str,
        status: str | None = None,
        cursor: str | None = None,
        limit: int = LIST_DEFAULT_LIMIT,
    ) -> tuple[list[CallRecord], str | None]:
        """A page of the tenant's calls, newest first, and the cursor of the next page
        (None at the end). A bad cursor or status raises ValueError."""
        _check_id("tenant", tenant, TENANT_ID_RE)
        _check_count("limit", limit, LIST_MAX_LIMIT, minimum=1)
        if status is not None and status not in CALL_STATUSES:
            raise ValueError(f"status must be one of {CALL_STATUSES}")
        position = _decode_cursor(cursor) if cursor is not None else None
        key = self.keys.tenant(tenant, "calls")
        batch_size = max(limit, LIST_DEFAULT_LIMIT)
        found: list[CallRecord] = []
        with _unavailable_as("list_calls"):
            for _ in range(LIST_MAX_BATCHES):
                batch = await self._calls_after(key, position, batch_size)
                if not batch:
                    return found, None
                async with self.redis.pipeline(transaction=False) as pipe:
                    for member, _score in batch:
                        pipe.hgetall(self.keys.call(member))
                    hashes = await pipe.execute()
                for (member, score), raw in zip(batch, hashes, strict=True):
                    position = (score, member)
                    if not raw:
                        continue  # its hash expired; the index entry is trimmed later
                    record = call_record(member, raw)
                    if status is None or record["status"] == status:
                        found.append(record)
                        if len(found) == limit:
                            return found, _encode_cursor(score, member)
        # Scan budget spent (a status filter skipped many calls): resume from here.
        return found, (_encode_cursor(*position) if position is not None else None)

    async def _calls_after(
        self, key: str, position: tuple[int, str] | None, count: int
    ) -> list[tuple[str, int]]:
        # Newest first; ties on created_ms come in reverse member order, so "after
        # (score, member)" is: same score and a smaller member, or a smaller score.
        if position is None:
            raw = await self.redis.zrevrangebyscore(
                key, "+inf", "-inf", start=0, num=count, withscores=True
            )
            return [(m, int(s)) for m, s in cast(_ScoredReply, raw)]
        score, member = position
        ties = await self.redis.zrevrangebyscore(key, score, score, withscores=True)
        older = await self.redis.zrevrangebyscore(
            key, f"({score}", "-inf", start=0, num=count, withscores=True
        )
        after = [(m, int(s)) for m, s in cast(_ScoredReply, ties) if m < member]
        after += [(m, int(s)) for m, s in cast(_ScoredReply, older)]
        return after[:count]

    async def active_calls(self, tenant: str | None = None) -> list[CallRecord]:
        """Calls holding a slot (globally, or for ``tenant``), soonest lease expiry first;
        at most ACTIVE_LIST_MAX."""
        if tenant is not None:
            _check_id("tenant", tenant, TENANT_ID_RE)
        key = self.keys.active if tenant is None else self.keys.tenant(tenant, "active")
        with _unavailable_as("active_calls"):
            members = cast(list[str], await self.redis.zrange(key, 0, ACTIVE_LIST_MAX - 1))
            async with self.redis.pipeline(transaction=False) as pipe:
                for member in members:
                    pipe.hgetall(self.keys.call(member))
                hashes = await pipe.execute()
        return [call_record(m, raw) for m, raw in zip(members, hashes, strict=True) if raw]

    async def tenant_spend(
        self, tenant: str, days: Sequence[str], months: Sequence[str], hours: Sequence[str]
    ) -> TenantSpend:
        """Spent/reserved per day (YYYYMMDD) and month (YYYYMM), settled spend per hour
        (YYYYMMDDHH); missing buckets read as 0."""
        _check_id("tenant", tenant, TENANT_ID_RE)
        for day in days:
            _check_id("day", day, _DAY_RE)
        for month in months:
            _check_id("month", month, _MONTH_RE)
        for hour in hours:
            _check_id("hour", hour, _HOUR_RE)
        k = self.keys
        with _unavailable_as("tenant_spend"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for day in days:
                    pipe.hmget(k.day(tenant, day), ["spent", "reserved"])
                for month in months:
                    pipe.hmget(k.month(tenant, month), ["spent", "reserved"])
                for hour in hours:
                    pipe.get(k.hour(tenant, hour))
                replies = await pipe.execute()
        day_replies = replies[: len(days)]
        month_replies = replies[len(days) : len(days) + len(months)]
        hour_replies = replies[len(days) + len(months) :]
        return TenantSpend(
            days={d: _totals(r) for d, r in zip(days, day_replies, strict=True)},
            months={m: _totals(r) for m, r in zip(months, month_replies, strict=True)},
            hours={h: int(r or 0) for h, r in zip(hours, hour_replies, strict=True)},
        )

    async def tenants(self) -> list[str]:
        """Every tenant that has limits set or was ever admitted/refused, sorted."""
        with _unavailable_as("tenants"):
            members = cast(set[str], await self.redis.smembers(self.keys.tenants))
        return sorted(members)

    async def ledger(self, count: int) -> list[dict[str, str]]:
        """The newest ``count`` ledger entries, newest first."""
        return await self._recent(self.keys.ledger, count, "ledger")

    async def recent_refusals(self, count: int) -> list[dict[str, str]]:
        """The newest ``count`` admission refusals, newest first."""
        return await self._recent(self.keys.refusals, count, "recent_refusals")

    async def note_refusal(
        self, tenant: str, reason: str, *, caller: str, call_id: str, now_ms: int
    ) -> None:
        """Add a refusal made before the spend gate was asked (a node full, overloaded or
        draining) to the recent-refusals stream the dashboard shows; the spend gate adds
        its own in its admission script."""
        entry: dict[FieldT, EncodableT] = {
            "at": now_ms,
            "tenant": tenant,
            "reason": reason,
            "caller": caller,
            "call": call_id,
        }
        with _unavailable_as("note_refusal"):
            await self.redis.xadd(
                self.keys.refusals,
                entry,
                maxlen=RECENT_STREAM_MAX_ENTRIES,
                approximate=True,
            )

    async def recent_ended(self, count: int) -> list[dict[str, str]]:
        """The newest ``count`` ended calls (with reason and spent), newest first."""
        return await self._recent(self.keys.ended, count, "recent_ended")

    async def _recent(self, key: str, count: int, operation: str) -> list[dict[str, str]]:
        _check_count("count", count, LEDGER_MAX_ENTRIES, minimum=1)
        with _unavailable_as(operation):
            raw = await self.redis.xrevrange(key, count=count)
        return _stream_entries(cast(_StreamReply, raw))

    # -- limits -----------------------------------------------------------------------

    async def get_tenant_limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits (all 0 = unlimited when never set)."""
        _check_id("tenant", tenant, TENANT_ID_RE)
        with _unavailable_as("get_tenant_limits"):
            raw = await self.redis.hgetall(self.keys.tenant(tenant, "limits"))
        return TenantLimits.from_redis(cast(dict[str, str], raw))

    async def effective_tenant_limits(self, tenant: str, defaults: TenantLimits) -> TenantLimits:
        """The limits admission enforces for ``tenant``, read without writing anything.

        Each stored field, else the field of ``defaults``, as the first admission would
        store it (:meth:`ensure_tenant_limits`); :meth:`get_tenant_limits` cannot tell
        "stored 0 (unlimited)" from "never stored" (both read 0), so it cannot show this.
        """
        _check_id("tenant", tenant, TENANT_ID_RE)
        with _unavailable_as("effective_tenant_limits"):
            raw = await self.redis.hgetall(self.keys.tenant(tenant, "limits"))
        return TenantLimits.from_redis(defaults.to_redis() | cast(dict[str, str], raw))

    async def set_tenant_limits(self, tenant: str, limits: TenantLimits) -> None:
        """Replace the tenant's limits (every field written)."""
        _check_id("tenant", tenant, TENANT_ID_RE)
        if not isinstance(limits, TenantLimits):
            raise TypeError("limits must be a TenantLimits")
        with _unavailable_as("set_tenant_limits"):
            async with self.redis.pipeline(transaction=True) as pipe:
                mapping: dict[FieldT, EncodableT] = {n: v for n, v in limits.to_redis().items()}
                pipe.hset(self.keys.tenant(tenant, "limits"), mapping=mapping)
                pipe.sadd(self.keys.tenants, tenant)
                await pipe.execute()

    async def ensure_tenant_limits(self, tenant: str, defaults: TenantLimits) -> TenantLimits:
        """The tenant's limits, storing ``defaults`` for any field never set (atomically:
        an operator's concurrent set_tenant_limits is never overwritten)."""
        _check_id("tenant", tenant, TENANT_ID_RE)
        if not isinstance(defaults, TenantLimits):
            raise TypeError("defaults must be a TenantLimits")
        key = self.keys.tenant(tenant, "limits")
        with _unavailable_as("ensure_tenant_limits"):
            async with self.redis.pipeline(transaction=True) as pipe:
                for name, value in defaults.to_redis().items():
                    pipe.hsetnx(key, name, value)
                pipe.sadd(self.keys.tenants, tenant)
                pipe.hgetall(key)
                replies = await pipe.execute()
        return TenantLimits.from_redis(cast(dict[str, str], replies[-1]))

    async def get_global(self) -> GlobalLimits:
        """The kill switch and the global concurrency cap."""
        with _unavailable_as("get_global"):
            raw = await self.redis.hgetall(self.keys.global_)
        return GlobalLimits.from_redis(cast(dict[str, str], raw))

    async def set_kill_switch(self, engaged: bool) -> None:
        """Engage (no new admissions or extensions) or release the kill switch."""
        if not isinstance(engaged, bool):
            raise TypeError("engaged must be a bool")
        with _unavailable_as("set_kill_switch"):
            await self.redis.hset(self.keys.global_, "killed", "1" if engaged else "0")

    async def set_global_max_concurrent(self, max_concurrent: int) -> None:
        """Set the installation-wide concurrency cap (0 = unlimited)."""
        try:
            _check_count("max_concurrent", max_concurrent, MAX_CONCURRENT_CALLS)
        except ValueError as exc:
            raise LimitsError("max_concurrent", str(exc)) from None
        with _unavailable_as("set_global_max_concurrent"):
            await self.redis.hset(self.keys.global_, "max_concurrent", str(max_concurrent))


def _totals(reply: Sequence[str | None]) -> SpendTotals:
    spent, reserved = reply
    return SpendTotals(spent=int(spent or 0), reserved=int(reserved or 0))
