"""Several gateway processes on one Redis: admissions and API requests racing across them
respect the caps, the budget, the caller abuse gate and a key's rate limit.

Three ``rutster serve`` processes share the suite's Redis under one key prefix,
as production gateways behind a load balancer would. Webhooks for many calls
hit all three at once; the tenant's concurrency cap and day budget hold
exactly, because each admission is one atomic script in Redis, whichever
process runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator

import httpx
import pytest

from rutster.spend.meter import QuantumPolicy
from rutster.spend.prices import PriceTable
from rutster.spend.store import SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, Service, gateway_process
from rutster.tools.twilio_simulator import TwilioSimulator, new_sid
from tests.conftest import TEST_ADMIN_KEY, suite_redis_url, tenant_key, unique_prefix

GATEWAYS = 3
WEBHOOKS = 36
TENANT = "default"


@contextlib.contextmanager
def gateways(env: dict[str, str]) -> Iterator[list[Service]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(gateway_process(env)) for _ in range(GATEWAYS)]


def _env(prefix: str, token: str, **extra: str) -> dict[str, str]:
    return {
        "REDIS_URL": suite_redis_url(),
        "RUTSTER_REDIS_PREFIX": prefix,
        "TWILIO_AUTH_TOKEN": token,
        # One secret for all: a media socket could reach any of them.
        "RUTSTER_STREAM_SECRET": "s" * 32,
        "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
        **extra,
    }


async def _race(services: list[Service], token: str, *, caller: str | None = None) -> list[bool]:
    """POST the voice webhook of WEBHOOKS distinct calls, spread over the gateways (each
    from its own number, or all from ``caller``)."""

    async def one(n: int) -> bool:
        service = services[n % len(services)]
        simulator = TwilioSimulator(f"http://{LOOPBACK}:{service.port}", auth_token=token)
        response = await simulator.post_voice_webhook(
            new_sid("CA"), from_=caller or f"+1555000{n:04d}", to="+15559990000"
        )
        assert response.status_code == 200, response.text
        assert ("<Stream" in response.text) != ("<Reject" in response.text)
        return "<Stream" in response.text

    return list(await asyncio.gather(*(one(n) for n in range(WEBHOOKS))))


async def _store(prefix: str) -> SpendStore:
    return SpendStore(redis_client(suite_redis_url()), prefix)


@pytest.mark.parametrize("cap", [1, 5])
async def test_concurrency_cap_holds_across_gateway_processes(cap: int) -> None:
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    with gateways(_env(prefix, token, RUTSTER_DEFAULT_MAX_CONCURRENT=str(cap))) as services:
        admitted = await _race(services, token)
    # The admitted calls never streamed, so they still hold their slots (their leases
    # outlive the test): exactly `cap` got one, whichever process answered.
    assert sum(admitted) == cap
    store = await _store(prefix)
    try:
        assert len(await store.active_calls(TENANT)) == cap
        refusals = await store.recent_refusals(WEBHOOKS)
        assert len(refusals) == WEBHOOKS - cap
        assert {r["reason"] for r in refusals} == {"tenant_concurrency"}
    finally:
        await store.redis.aclose()


async def test_day_budget_holds_across_gateway_processes() -> None:
    """A budget of exactly four first quanta admits four calls, not one more."""
    rate = PriceTable.default().telephony_rate("twilio", "inbound")
    quantum = QuantumPolicy().quantum_micros(rate)
    budget = 4 * quantum + quantum // 2
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    env = _env(
        prefix,
        token,
        RUTSTER_DEFAULT_MAX_CONCURRENT="0",
        RUTSTER_DEFAULT_BUDGET_DAY=f"{budget // 1_000_000}.{budget % 1_000_000:06d}",
    )
    with gateways(env) as services:
        admitted = await _race(services, token)
    assert sum(admitted) == 4
    store = await _store(prefix)
    try:
        calls = await store.active_calls(TENANT)
        assert sum(c["reserved"] for c in calls) == 4 * quantum <= budget
        refusals = await store.recent_refusals(WEBHOOKS)
        assert {r["reason"] for r in refusals} == {"budget_day"}
    finally:
        await store.redis.aclose()


async def test_the_caller_abuse_gate_holds_across_gateway_processes() -> None:
    """One number calling through every gateway at once gets its hourly allowance, once."""
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    env = _env(prefix, token, RUTSTER_DEFAULT_MAX_CONCURRENT="0")
    env["RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR"] = "3"
    with gateways(env) as services:
        admitted = await _race(services, token, caller="+15550004242")
    assert sum(admitted) == 3
    store = await _store(prefix)
    try:
        refusals = await store.recent_refusals(WEBHOOKS)
        assert len(refusals) == WEBHOOKS - 3
        assert {r["reason"] for r in refusals} == {"caller_rate"}
    finally:
        await store.redis.aclose()


async def test_one_api_keys_rate_limit_holds_across_gateway_processes() -> None:
    """A key's burst is one budget in Redis, however its requests are spread."""
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    burst = 10
    env = _env(
        prefix,
        token,
        RUTSTER_ADMIN_KEY=TEST_ADMIN_KEY,
        RUTSTER_API_BURST=str(burst),
        # Slow refill: over the race's fraction of a second it adds nothing.
        RUTSTER_API_RATE_PER_S="0.01",
    )
    with gateways(env) as services:
        urls = [f"http://{LOOPBACK}:{s.port}" for s in services]
        async with httpx.AsyncClient(base_url=urls[0], timeout=10) as admin:
            key = await tenant_key(admin, TENANT)
        clients = [httpx.AsyncClient(base_url=u, timeout=10) for u in urls]
        try:
            auth = {"Authorization": f"Bearer {key}"}
            answers = await asyncio.gather(
                *(clients[n % len(clients)].get("/v1/spend", headers=auth) for n in range(40))
            )
        finally:
            for client in clients:
                await client.aclose()
    codes = [a.status_code for a in answers]
    assert codes.count(200) == burst, codes
    assert codes.count(429) == 40 - burst, codes
