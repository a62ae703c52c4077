"""Several OS processes race admissions, extensions and settlements on one tenant.

Each seed runs 4 spawned processes, each with several asyncio tasks, against one real
Redis. The invariants are checked twice: inside the atomic step (admit returns the live
lease counts it saw) and afterwards from the ledger stream, whose order is the order in
which Redis ran the scripts:

- the concurrency cap is never exceeded;
- spent + reserved never passes the day budget by more than one quantum (only actual
  costs running a little over their reservation can push it past at all);
- after every call settled: sum(ledger settle amounts) == day spent == the sum of the
  actual costs the workers reported, and nothing is left reserved or active.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.pool
import random
import secrets
from collections.abc import Iterator
from typing import TypedDict, cast

import pytest

from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.limits import TenantLimits, tightest
from rutster.spend.store import AdmitRequest, SpendStore, redis_client, time_buckets

TENANT = "racer"
#: 2025-12-01T12:00:00Z; every call is admitted on that UTC day.
NOW = 1_764_590_400_000
PROCESSES = 4
CALLS_PER_PROCESS = 50
TASKS_PER_PROCESS = 8
TENANT_MAX_CONCURRENT = 5
BUDGET_DAY = 1_500_000
QUANTUM_RANGE = (5_000, 20_000)
EXTENSION_RANGE = (1_000, 15_000)
#: An actual cost may run over its reservation by up to this much (the meter ends a call
#: one tick after its reserved money is used up).
MAX_OVERRUN = 900
#: (seed, global max_concurrent): the second seed makes the global cap the tighter one.
SEEDS = ((1, 0), (2, 4), (3, 0))
#: A call refused for concurrency is retried (as a new call) up to this many times.
MAX_ATTEMPTS = 40
#: Leases far longer than the test: nothing expires, the reaper is not involved.
LEASE_MS = 600_000


class Outcome(TypedDict):
    call_id: str
    admitted: bool
    reason: str
    global_active: int
    tenant_active: int
    actual: int | None


async def _race(url: str, prefix: str, seed: int, worker: int) -> list[Outcome]:
    rng = random.Random(seed * 1_000 + worker)
    client = redis_client(url)
    store = SpendStore(client, prefix)
    calls = iter(range(CALLS_PER_PROCESS))
    outcomes: list[Outcome] = []

    async def one_call(index: int) -> None:
        for attempt in range(MAX_ATTEMPTS):
            call_id = f"w{worker}_{index}_{attempt}"
            now = NOW + index * 10 + worker
            quantum = rng.randint(*QUANTUM_RANGE)
            result = await store.admit(
                AdmitRequest(
                    call_id=call_id,
                    tenant=TENANT,
                    now_ms=now,
                    quantum=quantum,
                    provider="twilio",
                    direction="inbound",
                    lease_ms=LEASE_MS,
                )
            )
            outcome = Outcome(
                call_id=call_id,
                admitted=result.admitted,
                reason=result.reason,
                global_active=result.global_active,
                tenant_active=result.tenant_active,
                actual=None,
            )
            outcomes.append(outcome)
            if result.admitted:
                break
            if not result.reason.endswith("_concurrency"):
                return
            # A caller refused for lack of a slot tries again a little later.
            await asyncio.sleep(0.001 + rng.random() * 0.004)
        else:
            return
        reserved = quantum
        seq = 0
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(rng.random() * 0.004)
            seq += 1
            ext = await store.extend(
                call_id, seq, rng.randint(*EXTENSION_RANGE), now + seq, reserved // 2
            )
            reserved = ext.reserved_total
            if not ext.granted:
                break
        await asyncio.sleep(rng.random() * 0.004)
        overrun = rng.randint(1, MAX_OVERRUN) if rng.random() < 0.2 else 0
        actual = rng.randint(0, reserved) + overrun
        seq += 1
        settled = await store.settle(call_id, seq, actual, now + seq, "hangup")
        assert settled.status == "settled", settled
        outcome["actual"] = actual

    async def task() -> None:
        for index in calls:
            await one_call(index)

    try:
        await asyncio.gather(*(task() for _ in range(TASKS_PER_PROCESS)))
    finally:
        await client.aclose()
    return outcomes


def run_worker(url: str, prefix: str, seed: int, worker: int) -> list[Outcome]:
    """One racing process (module level so the spawn context can import it)."""
    return asyncio.run(_race(url, prefix, seed, worker))


@pytest.fixture(scope="module")
def race_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedRedis(tmp_path_factory.mktemp("race-redis")) as server:
        yield server.url


async def _prepare(url: str, prefix: str, global_max: int) -> None:
    client = redis_client(url)
    store = SpendStore(client, prefix)
    await store.set_tenant_limits(
        TENANT, TenantLimits(budget_day=BUDGET_DAY, max_concurrent=TENANT_MAX_CONCURRENT)
    )
    await store.set_global_max_concurrent(global_max)
    await client.aclose()


async def _state(url: str, prefix: str) -> tuple[list[dict[str, str]], dict[str, str], int, int]:
    client = redis_client(url)
    store = SpendStore(client, prefix)
    raw = cast(list[tuple[str, dict[str, str]]], await client.xrange(store.keys.ledger))
    ledger = [{"id": entry_id, **fields} for entry_id, fields in raw]
    day = cast(dict[str, str], await client.hgetall(store.keys.day(TENANT, time_buckets(NOW)[0])))
    active = await client.zcard(store.keys.active)
    tenant_active = await client.zcard(store.keys.tenant(TENANT, "active"))
    await client.aclose()
    return ledger, day, active, tenant_active


def check_ledger(ledger: list[dict[str, str]], cap: int) -> tuple[int, int]:
    """Replay the ledger in Redis's execution order; returns (spent, reserved)."""
    active: set[str] = set()
    per_call: dict[str, int] = {}
    spent = reserved = 0
    for entry in ledger:
        kind, call, amount = entry["type"], entry["call"], int(entry["amount"])
        if kind == "reserve":
            assert call not in active
            active.add(call)
            per_call[call] = amount
            reserved += amount
        elif kind == "extend":
            per_call[call] += amount
            assert per_call[call] == int(entry["reserved_total"])
            reserved += amount
        elif kind == "settle":
            active.remove(call)
            assert per_call[call] == int(entry["reserved_total"])
            spent += amount
            reserved -= per_call[call]
        else:
            assert kind == "refuse", entry
        assert len(active) <= cap, f"{len(active)} calls active at {entry['id']} (cap {cap})"
        # Only overruns at settlement can push past the budget: at most one per call
        # that was active at that moment, which is less than one quantum.
        assert spent + reserved <= BUDGET_DAY + cap * MAX_OVERRUN < BUDGET_DAY + QUANTUM_RANGE[0]
    assert not active
    return spent, reserved


@pytest.mark.parametrize(("seed", "global_max"), SEEDS)
def test_processes_racing_one_tenant_keep_every_invariant(
    race_redis_url: str, race_pool: multiprocessing.pool.Pool, seed: int, global_max: int
) -> None:
    prefix = f"race{secrets.token_hex(4)}"
    asyncio.run(_prepare(race_redis_url, prefix, global_max))
    per_worker = race_pool.starmap(
        run_worker, [(race_redis_url, prefix, seed, w) for w in range(PROCESSES)]
    )
    outcomes = [o for worker in per_worker for o in worker]
    cap = tightest(TENANT_MAX_CONCURRENT, global_max)

    # Inside the atomic step: the live leases each admission saw.
    admitted = [o for o in outcomes if o["admitted"]]
    assert admitted
    for o in admitted:
        assert 1 <= o["tenant_active"] <= cap and 1 <= o["global_active"] <= cap
    reasons = {o["reason"] for o in outcomes if not o["admitted"]}
    assert "budget_day" in reasons  # the race really reached both limits
    assert ("global_concurrency" if global_max else "tenant_concurrency") in reasons

    # Afterwards, from the ledger's order.
    ledger, day, active, tenant_active = asyncio.run(_state(race_redis_url, prefix))
    spent, reserved = check_ledger(ledger, cap)
    actuals = sum(o["actual"] or 0 for o in admitted)
    settle_sum = sum(int(e["amount"]) for e in ledger if e["type"] == "settle")
    assert settle_sum == spent == int(day["spent"]) == actuals
    assert reserved == 0 == int(day["reserved"])
    assert active == 0 == tenant_active
    assert sum(e["type"] == "reserve" for e in ledger) == len(admitted)
    assert sum(e["type"] == "refuse" for e in ledger) >= len(outcomes) - len(admitted)


@pytest.fixture(scope="module")
def race_pool() -> Iterator[multiprocessing.pool.Pool]:
    # One pool for every seed: spawning (a fresh interpreter importing redis) is the
    # slow part.
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        yield pool
