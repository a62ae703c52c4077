"""Tenant and global spend limits: plain values, validation, and the "0 = unlimited" rule.

Every limit is a non-negative integer; money is in micro-units (1 USD = 1_000_000).
``0`` means "no limit" everywhere, so an absent Redis field and an explicit 0 agree.
The limits live in Redis (``spend/store.py``); this module only holds the values and
their rules, with no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Self

#: Ceiling for any budget or per-call cost, in micros ($100 million). Seed decision: far
#: above any real tenant budget, and low enough that every sum the Lua scripts compute
#: (spent + reserved + quantum) stays an exact integer in Lua's doubles (2**53 ≈ 9.0e15).
MAX_MONEY_MICROS = 100_000_000 * 1_000_000
#: Ceiling for a per-call cost cap: the REST API's documented maximum ``max_cost`` "10000" USD.
MAX_CALL_COST_MICROS = 10_000 * 1_000_000
#: Ceiling for a per-call duration cap: the REST API's documented maximum (86400 s = one day).
MAX_CALL_DURATION_S = 86_400
#: Ceiling for concurrency caps. Seed decision: a million simultaneous calls is far past
#: any deployment this gateway is sized for; anything larger is a typo.
MAX_CONCURRENT_CALLS = 1_000_000
#: Ceiling for the per-caller and per-campaign rate limits. Seed decision, same reasoning.
MAX_RATE_PER_WINDOW = 1_000_000


class LimitsError(ValueError):
    """A limit value is missing, of the wrong type, negative or over its documented maximum."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def tightest(*caps: int) -> int:
    """The strictest of several caps where 0 means unlimited (0 if all are 0).

    ``tightest(0, 300, 120) == 120``; ``tightest(0, 0) == 0``.
    """
    limited = [cap for cap in caps if cap > 0]
    return min(limited) if limited else 0


def _check_int(field: str, value: object, maximum: int) -> int:
    # bool is an int subclass; True as a budget is a bug, not 1 micro.
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitsError(field, f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise LimitsError(field, "must be >= 0 (0 = unlimited)")
    if value > maximum:
        raise LimitsError(field, f"must be <= {maximum}")
    return value


def _parse_redis_int(field: str, raw: str | None, maximum: int) -> int:
    if raw is None or raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise LimitsError(field, f"stored value {raw[:32]!r} is not an integer") from None
    return _check_int(field, value, maximum)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits. All ints, 0 = unlimited; money in micros.

    - ``budget_day`` / ``budget_month``: spent + reserved may not pass these (UTC day/month
      of the call's admission).
    - ``max_concurrent``: simultaneous calls for the tenant.
    - ``max_call_duration_s`` / ``max_call_cost``: per-call caps (the gate takes the
      tightest of request, tenant and global caps).
    - ``caller_calls_per_hour``: calls per caller number in a sliding hour.
    - ``campaign_calls_per_minute``: calls per campaign in a sliding minute.
    """

    budget_day: int = 0
    budget_month: int = 0
    max_concurrent: int = 0
    max_call_duration_s: int = 0
    max_call_cost: int = 0
    caller_calls_per_hour: int = 0
    campaign_calls_per_minute: int = 0

    def __post_init__(self) -> None:
        for name, maximum in _TENANT_MAXIMA.items():
            _check_int(name, getattr(self, name), maximum)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The limit names, in declaration order (also the Redis hash fields)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def maximum(cls, name: str) -> int:
        """The documented maximum for limit ``name`` (for API schemas and error messages)."""
        try:
            return _TENANT_MAXIMA[name]
        except KeyError:
            raise LimitsError(name, "unknown limit") from None

    def merged(self, changes: Mapping[str, object]) -> Self:
        """A copy with ``changes`` applied (a partial update, as a PUT body gives).

        Unknown names and bad values raise :class:`LimitsError` naming the field.
        """
        unknown = sorted(set(changes) - set(_TENANT_MAXIMA))
        if unknown:
            raise LimitsError(unknown[0], "unknown limit")
        checked = {
            name: _check_int(name, value, _TENANT_MAXIMA[name]) for name, value in changes.items()
        }
        return replace(self, **checked)

    def as_dict(self) -> dict[str, int]:
        """Plain ``{name: int}``."""
        return asdict(self)

    def to_redis(self) -> dict[str, str]:
        """The Redis hash fields (every field written, so a set fully replaces the limits)."""
        return {name: str(value) for name, value in asdict(self).items()}

    @classmethod
    def from_redis(cls, raw: Mapping[str, str]) -> Self:
        """Read a Redis hash; missing fields are 0 (unlimited), unknown fields ignored.

        A stored value that is not a valid limit raises :class:`LimitsError`: silently
        reading it as 0 would lift the limit.
        """
        values = {
            name: _parse_redis_int(name, raw.get(name), top) for name, top in _TENANT_MAXIMA.items()
        }
        return cls(**values)


_TENANT_MAXIMA: dict[str, int] = {
    "budget_day": MAX_MONEY_MICROS,
    "budget_month": MAX_MONEY_MICROS,
    "max_concurrent": MAX_CONCURRENT_CALLS,
    "max_call_duration_s": MAX_CALL_DURATION_S,
    "max_call_cost": MAX_CALL_COST_MICROS,
    "caller_calls_per_hour": MAX_RATE_PER_WINDOW,
    "campaign_calls_per_minute": MAX_RATE_PER_WINDOW,
}


@dataclass(frozen=True, slots=True)
class GlobalLimits:
    """Installation-wide switches: the kill switch and a global concurrency cap (0 = unlimited)."""

    killed: bool = False
    max_concurrent: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.killed, bool):
            raise LimitsError("killed", "must be a boolean")
        _check_int("max_concurrent", self.max_concurrent, MAX_CONCURRENT_CALLS)

    def to_redis(self) -> dict[str, str]:
        """The Redis hash fields."""
        return {"killed": "1" if self.killed else "0", "max_concurrent": str(self.max_concurrent)}

    @classmethod
    def from_redis(cls, raw: Mapping[str, str]) -> Self:
        """Read the ``P:global`` hash. Any ``killed`` value other than "0"/absent counts as
        engaged: a corrupted switch fails safe (stops spending)."""
        killed_raw = raw.get("killed")
        return cls(
            killed=killed_raw not in (None, "", "0"),
            max_concurrent=_parse_redis_int(
                "max_concurrent", raw.get("max_concurrent"), MAX_CONCURRENT_CALLS
            ),
        )
