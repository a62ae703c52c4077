"""Per-key GCRA rate limit against a real Redis, on virtual time."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from rutster.gateway.api import errors
from rutster.gateway.api.rate_limit import (
    DEFAULT_BURST,
    DEFAULT_RATE_PER_S,
    RateDecision,
    RateLimiter,
    RateLimiterUnavailable,
    rate_limit_lua,
)
from rutster.spend.embedded_redis import EmbeddedRedis

T0 = 1_764_504_000_000  # virtual "now", unix ms
INTERVAL_MS = 1000 / DEFAULT_RATE_PER_S  # 50 ms


@pytest.fixture
async def redis(redis_server_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def limiter(redis: Redis, redis_prefix: str) -> RateLimiter:
    return RateLimiter(redis, redis_prefix)


async def _burst(limiter: RateLimiter, key: str, now_ms: int, count: int) -> list[RateDecision]:
    return [await limiter.check(key, now_ms) for _ in range(count)]


async def test_burst_then_refusal_with_retry_after(limiter: RateLimiter) -> None:
    decisions = await _burst(limiter, "k", T0, DEFAULT_BURST)
    assert all(d.allowed for d in decisions)
    assert [d.remaining for d in decisions] == list(range(DEFAULT_BURST - 1, -1, -1))
    refused = await limiter.check("k", T0)
    assert refused == RateDecision(allowed=False, retry_after_s=INTERVAL_MS / 1000, remaining=0)
    # A refusal does not consume anything: same answer again.
    assert await limiter.check("k", T0) == refused
    # 10 ms later, 40 ms to go.
    later = await limiter.check("k", T0 + 10)
    assert not later.allowed and later.retry_after_s == pytest.approx(0.040)
    assert errors.rate_limited(later.retry_after_s).headers["Retry-After"] == "1"


async def test_recovers_one_request_per_interval_then_fully(limiter: RateLimiter) -> None:
    await _burst(limiter, "k", T0, DEFAULT_BURST)
    assert not (await limiter.check("k", T0 + 49)).allowed
    assert (await limiter.check("k", T0 + 50)).allowed
    assert not (await limiter.check("k", T0 + 50)).allowed
    assert (await limiter.check("k", T0 + 100)).allowed
    # After burst x interval at rest, the whole burst is available again.
    rested = T0 + 100 + DEFAULT_BURST * 50
    decisions = await _burst(limiter, "k", rested, DEFAULT_BURST + 1)
    assert [d.allowed for d in decisions] == [True] * DEFAULT_BURST + [False]


async def test_sustained_rate_is_the_configured_rate(limiter: RateLimiter) -> None:
    # A client hammering every 10 ms for 10 s gets burst + 10 s x 20/s requests.
    allowed = 0
    for step in range(1000):
        allowed += (await limiter.check("k", T0 + step * 10)).allowed
    assert allowed == DEFAULT_BURST + int(DEFAULT_RATE_PER_S * 9.99)


async def test_keys_are_independent(limiter: RateLimiter) -> None:
    await _burst(limiter, "a", T0, DEFAULT_BURST)
    assert not (await limiter.check("a", T0)).allowed
    assert (await limiter.check("b", T0)).allowed
    assert (await limiter.check("b", T0)).remaining == DEFAULT_BURST - 2


async def test_prefixes_are_independent(redis: Redis, redis_prefix: str) -> None:
    one = RateLimiter(redis, redis_prefix + "-1", rate_per_s=1, burst=1)
    two = RateLimiter(redis, redis_prefix + "-2", rate_per_s=1, burst=1)
    assert (await one.check("k", T0)).allowed
    assert not (await one.check("k", T0)).allowed
    assert (await two.check("k", T0)).allowed


async def test_concurrent_checks_are_atomic(limiter: RateLimiter) -> None:
    decisions = await asyncio.gather(*(limiter.check("k", T0) for _ in range(100)))
    assert sum(d.allowed for d in decisions) == DEFAULT_BURST


async def test_state_expires_once_rested(
    limiter: RateLimiter, redis: Redis, redis_prefix: str
) -> None:
    await _burst(limiter, "k", T0, 3)
    ttl = await redis.pttl(f"{redis_prefix}:ratelimit:k")
    assert 0 < ttl <= 3 * 50


def _model(
    state: dict[str, int], key: str, now_ms: int, interval_us: int, burst: int
) -> tuple[bool, int, int]:
    """Plain-Python GCRA (test oracle): (allowed, retry_after_us, remaining)."""
    now = now_ms * 1000
    tat = max(state.get(key, now), now)
    new_tat = tat + interval_us
    allow_at = new_tat - interval_us * burst
    if now < allow_at:
        return False, allow_at - now, 0
    state[key] = new_tat
    return True, 0, (now - allow_at) // interval_us


@pytest.mark.parametrize("seed", range(5))
async def test_matches_a_plain_gcra_model(redis: Redis, redis_prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    # A slow, non-integral rate: the key's Redis TTL (>= one interval, 1.4 s) outlives
    # the test's real duration, so only virtual time decides.
    limiter = RateLimiter(redis, f"{redis_prefix}-{seed}", rate_per_s=0.7, burst=5)
    state: dict[str, int] = {}
    now = T0
    for _ in range(300):
        now += rng.choice([0, 0, 0, 1, 100, 700, 1428, 1429, 5000])
        key = rng.choice(["a", "b", "c"])
        decision = await limiter.check(key, now)
        allowed, retry_us, remaining = _model(
            state, key, now, limiter.emission_interval_us, limiter.burst
        )
        assert (decision.allowed, round(decision.retry_after_s * 1e6), decision.remaining) == (
            allowed,
            retry_us,
            remaining,
        )


async def test_invalid_settings_and_arguments(redis: Redis, limiter: RateLimiter) -> None:
    for rate in (0, -1, float("nan"), float("inf"), 2e6):
        with pytest.raises(ValueError, match="rate_per_s"):
            RateLimiter(redis, rate_per_s=rate)
    for burst in (0, -1, 2_000_000, True):
        with pytest.raises(ValueError, match="burst"):
            RateLimiter(redis, burst=burst)
    with pytest.raises(ValueError, match="key_id"):
        await limiter.check("", T0)
    with pytest.raises(ValueError, match="key_id"):
        await limiter.check("k" * 129, T0)
    with pytest.raises(ValueError, match="now_ms"):
        await limiter.check("k", -1)


async def test_redis_down_is_rate_limiter_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(RateLimiterUnavailable):
            await RateLimiter(client).check("k", T0)
    finally:
        await client.aclose()


def test_script_ships_as_package_data() -> None:
    source = rate_limit_lua()
    code = "\n".join(line.split("--")[0] for line in source.splitlines())
    assert "GCRA" in source and "redis.call" in code
    assert "TIME" not in code  # the caller's clock only


async def test_redis_refusing_writes_is_rate_limiter_unavailable(tmp_path: Path) -> None:
    # A private server (its memory cap is changed): with maxmemory 1 byte and
    # noeviction, the script's SET fails inside Lua with -OOM.
    with EmbeddedRedis(tmp_path) as server:
        client = Redis.from_url(server.url)
        try:
            await client.config_set("maxmemory", "1")
            with pytest.raises(RateLimiterUnavailable, match="rate limit check"):
                await RateLimiter(client).check("k", T0)
        finally:
            await client.aclose()
