"""Per-API-key request rate limit: GCRA in Redis, one atomic Lua step per request.

Shared by every gateway node (the state lives in Redis), exact under
concurrency (the step is one script), and O(1) memory per key: a single
timestamp that expires once the key has rested. The caller passes the time in
(``now_ms``): the script never reads Redis's clock, so tests drive virtual time.
Nodes' clocks should agree to within a few milliseconds (NTP): a node far ahead
would make the others see the key as busier than it is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources

from redis import exceptions as redis_errors

from rutster.spend.redis_url import REDIS_UNAVAILABLE_ERRORS, RedisClient, is_unavailable_reply
from rutster.spend.store import StoreUnavailable

#: Default sustained rate per key: 20 requests/s. Seed decision: a dashboard polls
#: a few endpoints per second, a dialer places far fewer calls than that.
DEFAULT_RATE_PER_S = 20.0
#: Default burst per key: 40 requests back to back (2 s of the sustained rate).
#: Seed decision: lets a client page through a call list without waiting.
DEFAULT_BURST = 40
#: Upper bounds on the settings: 1 request/µs is the script's time resolution,
#: and a burst over a million is no limit at all.
MAX_RATE_PER_S = 1_000_000.0
MAX_BURST = 1_000_000
#: Longest key id (a SHA-256 hex is 64): it becomes part of a Redis key name.
MAX_KEY_ID_CHARS = 128

_US_PER_S = 1_000_000


class RateLimiterUnavailable(StoreUnavailable):
    """Redis could not be reached (or take writes) for a rate-limit check.

    A :class:`spend.store.StoreUnavailable`, so one ``except`` covers every store.
    """


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Whether a request may go ahead; if not, how long until the next one may."""

    allowed: bool
    retry_after_s: float
    #: Requests still allowed right now after this one (0 when refused).
    remaining: int


@functools.cache
def rate_limit_lua() -> str:
    """The GCRA script (``gateway/api/rate_limit.lua``, shipped as package data)."""
    return (
        resources.files("rutster.gateway.api")
        .joinpath("rate_limit.lua")
        .read_text(encoding="utf-8")
    )


class RateLimiter:
    """``rate_per_s`` sustained, ``burst`` at once, per key id, in Redis under ``prefix``."""

    def __init__(
        self,
        redis: RedisClient,
        prefix: str = "rutster",
        rate_per_s: float = DEFAULT_RATE_PER_S,
        burst: int = DEFAULT_BURST,
    ) -> None:
        if not (math.isfinite(rate_per_s) and 0 < rate_per_s <= MAX_RATE_PER_S):
            raise ValueError(f"rate_per_s must be in (0, {MAX_RATE_PER_S:g}], got {rate_per_s!r}")
        if isinstance(burst, bool) or not 1 <= burst <= MAX_BURST:
            raise ValueError(f"burst must be in 1..{MAX_BURST}, got {burst!r}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        #: Microseconds between requests at the sustained rate (rounded to 1 µs).
        self.emission_interval_us = max(1, round(_US_PER_S / rate_per_s))
        self._prefix = prefix
        self._script = redis.register_script(rate_limit_lua())

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}:ratelimit:{key_id}"

    async def check(self, key_id: str, now_ms: int) -> RateDecision:
        """Count one request for ``key_id`` at ``now_ms`` (unix ms) and decide."""
        if not key_id or len(key_id) > MAX_KEY_ID_CHARS:
            raise ValueError(f"key_id must be 1..{MAX_KEY_ID_CHARS} characters")
        if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
            raise ValueError(f"now_ms must be a non-negative int, got {now_ms!r}")
        try:
            reply = await self._script(
                keys=[self._key(key_id)],
                args=[now_ms, self.emission_interval_us, self.burst],
            )
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise RateLimiterUnavailable("rate limit check", exc) from exc
        except redis_errors.ResponseError as exc:
            if is_unavailable_reply(exc):
                raise RateLimiterUnavailable("rate limit check", exc) from exc
            raise
        allowed, retry_after_us, remaining = (int(v) for v in reply)
        return RateDecision(
            allowed=allowed == 1,
            retry_after_s=retry_after_us / _US_PER_S,
            remaining=remaining,
        )
