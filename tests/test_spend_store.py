"""SpendStore against a real Redis (embedded redis-server): every refusal, budgets to the
micro-unit, idempotency, leases and the reaper, listing, and failure classification."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.limits import (
    MAX_MONEY_MICROS,
    GlobalLimits,
    LimitsError,
    TenantLimits,
    tightest,
)
from rutster.spend.store import (
    CALLER_WINDOW_MS,
    CAMPAIGN_WINDOW_MS,
    DAY_KEY_TTL_S,
    HOUR_KEY_TTL_S,
    MONTH_KEY_TTL_S,
    RECEIPT_RETENTION_S,
    REDIS_MAX_CONNECTIONS,
    AdmitRequest,
    ConnectResult,
    HoldResult,
    OrphanReport,
    RefusalReason,
    SpendStore,
    StoreUnavailable,
    redis_client,
    time_buckets,
)

#: 2025-12-01T12:00:00Z.
NOW = 1_764_590_400_000
DAY, MONTH, HOUR = time_buckets(NOW)
LEASE = 30_000


@pytest.fixture(scope="module")
def spend_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("spend-redis")) as server:
        yield server


@pytest.fixture
async def store(spend_redis: EmbeddedRedis) -> AsyncIterator[SpendStore]:
    client = redis_client(spend_redis.url)
    yield SpendStore(client, f"test{secrets.token_hex(4)}")
    await client.aclose()


def req(call_id: str, tenant: str = "acme", **overrides: Any) -> AdmitRequest:
    values: dict[str, Any] = {
        "call_id": call_id,
        "tenant": tenant,
        "now_ms": NOW,
        "quantum": 10_000,
        "provider": "twilio",
        "direction": "inbound",
        "lease_ms": LEASE,
    }
    values.update(overrides)
    return AdmitRequest(**values)


async def day_totals(store: SpendStore, tenant: str = "acme", day: str = DAY) -> tuple[int, int]:
    raw = await store.redis.hmget(store.keys.day(tenant, day), ["spent", "reserved"])
    return int(raw[0] or 0), int(raw[1] or 0)


async def ledger_all(store: SpendStore) -> list[dict[str, str]]:
    raw = cast(list[tuple[str, dict[str, str]]], await store.redis.xrange(store.keys.ledger))
    return [{"id": entry_id, **fields} for entry_id, fields in raw]


def ledger_spent(entries: list[dict[str, str]]) -> int:
    return sum(int(e["amount"]) for e in entries if e["type"] in ("settle", "reap", "adjust"))


# -- pure helpers -------------------------------------------------------------------------


def test_time_buckets_are_utc_and_roll_over_at_midnight() -> None:
    assert time_buckets(NOW) == ("20251201", "202512", "2025120112")
    last_ms_of_year = 1_767_225_599_999
    assert time_buckets(last_ms_of_year) == ("20251231", "202512", "2025123123")
    assert time_buckets(last_ms_of_year + 1) == ("20260101", "202601", "2026010100")
    assert time_buckets(0) == ("19700101", "197001", "1970010100")


def test_tenant_limits_validate_and_merge() -> None:
    limits = TenantLimits(budget_day=5_000_000, max_concurrent=3)
    assert limits.merged({"max_concurrent": 0}).as_dict()["max_concurrent"] == 0
    assert limits.merged({}).budget_day == 5_000_000
    with pytest.raises(LimitsError) as unknown:
        limits.merged({"budget_year": 1})
    assert unknown.value.field == "budget_year"
    for bad in (-1, True, 1.5, "10", MAX_MONEY_MICROS + 1):
        with pytest.raises(LimitsError) as err:
            limits.merged({"budget_day": bad})
        assert err.value.field == "budget_day"
    with pytest.raises(LimitsError):
        TenantLimits(max_call_duration_s=86_401)
    assert TenantLimits.from_redis({}) == TenantLimits()
    assert TenantLimits.from_redis(limits.to_redis()) == limits
    with pytest.raises(LimitsError, match="budget_month"):
        TenantLimits.from_redis({"budget_month": "lots"})
    assert TenantLimits.maximum("max_call_cost") == 10_000_000_000
    assert tightest(0, 300, 120) == 120 and tightest(0, 0) == 0


def test_global_limits_fail_safe_on_a_corrupt_switch() -> None:
    assert GlobalLimits.from_redis({}) == GlobalLimits(killed=False, max_concurrent=0)
    assert GlobalLimits.from_redis({"killed": "0", "max_concurrent": "7"}).max_concurrent == 7
    assert GlobalLimits.from_redis({"killed": "garbage"}).killed is True
    with pytest.raises(LimitsError):
        GlobalLimits(max_concurrent=-3)


def test_admit_request_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="tenant"):
        req("call_1", tenant="a:b")
    with pytest.raises(ValueError, match="call id"):
        req("call 1")
    with pytest.raises(ValueError, match="quantum"):
        req("call_1", quantum=-1)
    with pytest.raises(ValueError, match="quantum"):
        req("call_1", quantum=True)
    with pytest.raises(ValueError, match="metadata"):
        req("call_1", metadata={"k": "v" * 3000})
    with pytest.raises(ValueError, match="metadata"):
        req("call_1", metadata={"k": 1})
    with pytest.raises(ValueError, match="campaign"):
        req("call_1", campaign="spring sale")
    with pytest.raises(ValueError, match="lease_ms"):
        req("call_1", lease_ms=0)


# -- admit ----------------------------------------------------------------------------


async def test_admit_records_the_call_reservation_and_ledger(store: SpendStore) -> None:
    result = await store.admit(
        req("call_a", caller="+15550001111", to="+15550002222", metadata={"crm": "42"})
    )
    assert (result.admitted, result.reason, result.replayed) == (True, "ok", False)
    assert (result.global_active, result.tenant_active) == (1, 1)
    call = await store.get_call("call_a")
    assert call is not None
    assert call["status"] == "admitted" and call["reserved"] == 10_000 and call["spent"] is None
    assert (call["day"], call["month"], call["created_ms"]) == (DAY, MONTH, NOW)
    assert call["metadata"] == {"crm": "42"} and call["caller"] == "+15550001111"
    assert await day_totals(store) == (0, 10_000)
    ledger = await ledger_all(store)
    assert [(e["type"], e["amount"], e["reserved_total"]) for e in ledger] == [
        ("reserve", "10000", "10000")
    ]
    assert await store.redis.zscore(store.keys.active, "call_a") == NOW + LEASE
    assert 0 < await store.redis.ttl(store.keys.day("acme", DAY)) <= DAY_KEY_TTL_S
    assert DAY_KEY_TTL_S < await store.redis.ttl(store.keys.month("acme", MONTH)) <= MONTH_KEY_TTL_S
    assert await store.tenants() == ["acme"]


async def test_admit_is_idempotent_for_the_same_request(store: SpendStore) -> None:
    first = await store.admit(req("call_a"))
    again = await store.admit(req("call_a"))
    assert first.admitted and again.admitted and again.replayed
    assert await day_totals(store) == (0, 10_000)  # reserved once
    # Same id, different request: refused, existing call untouched.
    other = await store.admit(req("call_a", tenant="other"))
    assert (other.admitted, other.reason) == (False, RefusalReason.DUPLICATE_CALL)
    call = await store.get_call("call_a")
    assert call is not None and call["tenant"] == "acme" and call["status"] == "admitted"
    # A refused request asked again gets the same refusal back, not duplicate_call.
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=1))
    refused = await store.admit(req("call_b"))
    assert (refused.admitted, refused.reason, refused.replayed) == (
        False,
        "tenant_concurrency",
        False,
    )
    await store.settle("call_a", 1, 0, NOW + 1, "hangup")  # a slot is free now...
    retry = await store.admit(req("call_b"))  # ...but this is the same request: same answer
    assert (retry.admitted, retry.reason, retry.replayed) == (False, "tenant_concurrency", True)


async def test_kill_switch_refuses_first(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=1, budget_day=1))
    await store.set_kill_switch(True)
    assert (await store.get_global()).killed
    result = await store.admit(req("call_a"))
    assert (result.admitted, result.reason) == (False, RefusalReason.KILL_SWITCH)
    refused = await store.get_call("call_a")
    assert refused is not None and refused["status"] == "refused"
    assert refused["end_reason"] == "kill_switch"
    assert 0 < await store.redis.ttl(store.keys.call("call_a")) <= RECEIPT_RETENTION_S
    (refusal,) = await store.recent_refusals(5)
    assert (refusal["reason"], refusal["tenant"], refusal["call"]) == (
        "kill_switch",
        "acme",
        "call_a",
    )
    await store.set_kill_switch(False)
    assert (await store.admit(req("call_b", quantum=0))).admitted


async def test_a_refused_call_has_one_content_free_receipt(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(budget_day=5_000))
    refused = await store.admit(req("call_a"))  # the quantum (10_000) exceeds the budget
    assert (refused.admitted, refused.reason) == (False, RefusalReason.BUDGET_DAY)
    (receipt,) = await store.receipts("call_a")
    receipt.pop("id")
    assert receipt == {
        "stage": "spend",
        "type": "refused",
        "reason": "budget_day",
        "at_unix_ms": str(NOW),
        "quantum": "10000",
    }
    ttl = await store.redis.ttl(store.keys.receipts("call_a"))
    assert 0 < ttl <= RECEIPT_RETENTION_S
    # The same request again gets the same answer, and no second receipt.
    again = await store.admit(req("call_a"))
    assert again.replayed and len(await store.receipts("call_a")) == 1
    # A duplicate id refused for another tenant writes nothing on the existing call.
    assert (await store.admit(req("call_b"))).reason == RefusalReason.BUDGET_DAY
    other = await store.admit(req("call_b", tenant="other"))
    assert other.reason == RefusalReason.DUPLICATE_CALL
    assert len(await store.receipts("call_b")) == 1


async def test_global_and_tenant_concurrency(store: SpendStore) -> None:
    await store.set_global_max_concurrent(2)
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=1))
    assert (await store.admit(req("call_a"))).admitted
    tenant_full = await store.admit(req("call_b"))
    assert (tenant_full.reason, tenant_full.tenant_active) == (RefusalReason.TENANT_CONCURRENCY, 1)
    assert (await store.admit(req("call_c", tenant="beta"))).admitted
    global_full = await store.admit(req("call_d", tenant="gamma"))
    assert (global_full.reason, global_full.global_active) == (RefusalReason.GLOBAL_CONCURRENCY, 2)
    # A settled call frees its slot.
    await store.settle("call_a", 1, 0, NOW + 1, "hangup")
    assert (await store.admit(req("call_e", now_ms=NOW + 2))).admitted


async def test_expired_leases_do_not_count_toward_concurrency(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=1))
    assert (await store.admit(req("call_a", lease_ms=1_000))).admitted
    assert (await store.admit(req("call_b", now_ms=NOW + 999))).reason == "tenant_concurrency"
    # At now == expiry the lease has lapsed: the slot is free, the old call waits for reap.
    late = await store.admit(req("call_c", now_ms=NOW + 1_000))
    assert late.admitted and late.tenant_active == 1
    assert await store.redis.zcard(store.keys.active) == 2


async def test_caller_rate_sliding_hour(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(caller_calls_per_hour=2))
    caller = "+15550009999"
    for i in range(2):
        r = await store.admit(req(f"call_{i}", caller=caller, quantum=0, now_ms=NOW + i))
        assert r.admitted
    refused = await store.admit(req("call_x", caller=caller, quantum=0, now_ms=NOW + 10))
    assert refused.reason == RefusalReason.CALLER_RATE
    # Outbound calls (check_caller off) are not limited, but do not open the window either.
    assert (
        await store.admit(req("call_o", caller=caller, check_caller=False, now_ms=NOW + 11))
    ).admitted
    assert (await store.admit(req("call_y", caller="+15550008888", quantum=0))).admitted
    # One hour after the first call, it has left the window.
    later = await store.admit(
        req("call_z", caller=caller, quantum=0, now_ms=NOW + CALLER_WINDOW_MS)
    )
    assert later.admitted is True


async def test_campaign_rate_sliding_minute(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(campaign_calls_per_minute=1))
    assert (await store.admit(req("call_a", campaign="spring", quantum=0))).admitted
    refused = await store.admit(req("call_b", campaign="spring", quantum=0, now_ms=NOW + 1))
    assert refused.reason == RefusalReason.CAMPAIGN_RATE
    assert (await store.admit(req("call_c", campaign="autumn", quantum=0))).admitted
    assert (await store.admit(req("call_d", quantum=0))).admitted  # no campaign
    again = await store.admit(
        req("call_e", campaign="spring", quantum=0, now_ms=NOW + CAMPAIGN_WINDOW_MS)
    )
    assert again.admitted


async def test_day_budget_to_the_micro_unit(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(budget_day=100_000))
    assert (await store.admit(req("call_a", quantum=60_000))).admitted
    assert (await store.admit(req("call_b", quantum=40_001))).reason == RefusalReason.BUDGET_DAY
    exact = await store.extend("call_a", 1, 40_000, NOW + 1, 0)
    assert (exact.granted, exact.reserved_total) == (True, 100_000)
    over = await store.extend("call_a", 2, 1, NOW + 2, 0)
    assert (over.granted, over.reason, over.reserved_total) == (False, "budget_day", 100_000)
    await store.settle("call_a", 3, 99_999, NOW + 3, "hangup")
    assert await day_totals(store) == (99_999, 0)
    assert (await store.admit(req("call_c", quantum=2))).reason == "budget_day"
    assert (await store.admit(req("call_d", quantum=1))).admitted
    assert await day_totals(store) == (99_999, 1)
    # The next day starts afresh.
    tomorrow = NOW + 86_400_000
    assert (await store.admit(req("call_e", quantum=100_000, now_ms=tomorrow))).admitted


async def test_month_budget_spans_days(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(budget_month=150_000))
    assert (await store.admit(req("call_a", quantum=100_000))).admitted
    await store.settle("call_a", 1, 100_000, NOW + 1, "hangup")
    tomorrow = NOW + 86_400_000
    refused = await store.admit(req("call_b", quantum=60_000, now_ms=tomorrow))
    assert refused.reason == RefusalReason.BUDGET_MONTH
    assert (await store.admit(req("call_c", quantum=50_000, now_ms=tomorrow))).admitted
    ext = await store.extend("call_c", 1, 1, tomorrow + 1, 0)
    assert (ext.granted, ext.reason) == (False, "budget_month")
    next_month = NOW + 31 * 86_400_000
    assert (await store.admit(req("call_d", quantum=150_000, now_ms=next_month))).admitted


async def test_large_amounts_stay_exact(store: SpendStore) -> None:
    # 15-digit micros: Lua's default number printing (%.14g) would round these.
    budget = MAX_MONEY_MICROS
    await store.set_tenant_limits("acme", TenantLimits(budget_day=budget))
    quantum = 98_765_432_109_876
    assert (await store.admit(req("call_a", quantum=quantum))).admitted
    ext = await store.extend("call_a", 1, budget - quantum, NOW + 1, 0)
    assert ext.granted and ext.reserved_total == budget
    assert not (await store.extend("call_a", 2, 1, NOW + 2, 0)).granted
    await store.settle("call_a", 3, 99_999_999_999_999, NOW + 3, "hangup")
    assert await day_totals(store) == (99_999_999_999_999, 0)
    assert ledger_spent(await ledger_all(store)) == 99_999_999_999_999


# -- extend / heartbeat ---------------------------------------------------------------


async def test_extend_is_idempotent_by_seq(store: SpendStore) -> None:
    await store.admit(req("call_a"))
    first = await store.extend("call_a", 1, 5_000, NOW + 1_000, 700)
    retry = await store.extend("call_a", 1, 5_000, NOW + 1_000, 700)
    assert (first.granted, first.reserved_total, first.replayed) == (True, 15_000, False)
    assert (retry.granted, retry.reason, retry.reserved_total, retry.replayed) == (
        True,
        "ok",
        15_000,
        True,
    )
    # A heartbeat in between does not hide the last extension's answer from a retry.
    await store.heartbeat("call_a", 2, NOW + 2_000, 900)
    assert (await store.extend("call_a", 1, 5_000, NOW + 1_000, 700)).granted
    assert (await store.extend("call_a", 3, 1_000, NOW + 3_000, 900)).reserved_total == 16_000
    stale = await store.extend("call_a", 1, 5_000, NOW + 1_000, 700)
    assert (stale.granted, stale.reason, stale.replayed) == (False, "stale", True)
    assert await day_totals(store) == (0, 16_000)
    assert [e["type"] for e in await ledger_all(store)] == ["reserve", "extend", "extend"]


async def test_extend_refusals_still_renew_the_lease(store: SpendStore) -> None:
    await store.admit(req("call_a", max_cost=12_000))
    capped = await store.extend("call_a", 1, 2_001, NOW + 5_000, 1_234)
    assert (capped.granted, capped.reason) == (False, RefusalReason.MAX_CALL_COST)
    assert await store.redis.zscore(store.keys.active, "call_a") == NOW + 5_000 + LEASE
    assert await store.redis.zscore(store.keys.tenant("acme", "active"), "call_a") == (
        NOW + 5_000 + LEASE
    )
    call = await store.get_call("call_a")
    assert call is not None and call["cost"] == 1_234 and call["seq"] == 1
    assert (await store.extend("call_a", 2, 2_000, NOW + 6_000, 0)).granted
    await store.set_kill_switch(True)
    killed = await store.extend("call_a", 3, 1, NOW + 7_000, 0)
    assert (killed.granted, killed.reason, killed.reserved_total) == (False, "kill_switch", 12_000)
    refusals = [e for e in await ledger_all(store) if e["type"] == "refuse"]
    assert [e["reason"] for e in refusals] == ["max_call_cost", "kill_switch"]


async def test_extend_unknown_and_ended_calls(store: SpendStore) -> None:
    assert (await store.extend("call_none", 1, 1, NOW, 0)).reason == "unknown_call"
    await store.admit(req("call_a"))
    await store.settle("call_a", 1, 10, NOW + 1, "hangup")
    ended = await store.extend("call_a", 2, 1, NOW + 2, 0)
    assert (ended.granted, ended.reason) == (False, "not_active")
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=1))
    await store.admit(req("call_b"))
    refused = await store.admit(req("call_c"))
    assert not refused.admitted
    assert (await store.extend("call_c", 1, 1, NOW + 3, 0)).reason == "not_active"


async def test_extend_rejects_bad_arguments(store: SpendStore) -> None:
    with pytest.raises(ValueError, match="seq"):
        await store.extend("call_a", 0, 1, NOW, 0)
    with pytest.raises(ValueError, match="amount"):
        await store.extend("call_a", 1, -5, NOW, 0)
    with pytest.raises(ValueError, match="call id"):
        await store.extend("call:a", 1, 5, NOW, 0)
    with pytest.raises(ValueError, match="end reason"):
        await store.settle("call_a", 1, 5, NOW, "")


async def test_heartbeat_renews_and_never_revives(store: SpendStore) -> None:
    await store.admit(req("call_a"))
    beat = await store.heartbeat("call_a", 1, NOW + 10_000, 3_000)
    assert (beat.applied, beat.status, beat.killed) == (True, "ok", False)
    assert await store.redis.zscore(store.keys.active, "call_a") == NOW + 10_000 + LEASE
    # A late (replayed) heartbeat never shortens the lease.
    assert (await store.heartbeat("call_a", 2, NOW + 1_000, 3_100)).applied
    assert await store.redis.zscore(store.keys.active, "call_a") == NOW + 10_000 + LEASE
    stale = await store.heartbeat("call_a", 2, NOW + 11_000, 9_999)
    assert (stale.applied, stale.status) == (False, "stale")
    call = await store.get_call("call_a")
    assert call is not None and call["cost"] == 3_100
    await store.set_kill_switch(True)
    assert (await store.heartbeat("call_a", 3, NOW + 12_000, 3_200)).killed
    await store.settle("call_a", 4, 3_300, NOW + 13_000, "hangup")
    after = await store.heartbeat("call_a", 5, NOW + 14_000, 3_400)
    assert (after.applied, after.status) == (False, "not_active")
    assert await store.redis.zscore(store.keys.active, "call_a") is None
    assert (await store.heartbeat("call_zz", 1, NOW, 0)).status == "unknown_call"


# -- settle / reap ----------------------------------------------------------------------


async def test_settle_moves_money_once(store: SpendStore) -> None:
    await store.admit(req("call_a", caller="+15550001111"))
    await store.extend("call_a", 1, 5_000, NOW + 1, 0)
    await store.add_receipt("call_a", {"kind": "turn", "ms": 1200})
    done = await store.settle("call_a", 2, 12_345, NOW + 60_000, "caller_hangup")
    assert (done.replayed, done.status, done.reserved_total, done.spent) == (
        False,
        "settled",
        15_000,
        12_345,
    )
    again = await store.settle("call_a", 2, 99_999, NOW + 61_000, "caller_hangup")
    assert (again.replayed, again.status, again.spent) == (True, "replayed", 12_345)
    assert await day_totals(store) == (12_345, 0)
    month = await store.redis.hmget(store.keys.month("acme", MONTH), ["spent", "reserved"])
    assert month == ["12345", "0"]
    _, _, hour = time_buckets(NOW + 60_000)
    spend = await store.tenant_spend("acme", [DAY], [MONTH], [hour, "2025120100"])
    assert spend["hours"] == {hour: 12_345, "2025120100": 0}
    assert spend["days"][DAY] == {"spent": 12_345, "reserved": 0}
    assert 0 < await store.redis.ttl(store.keys.hour("acme", hour)) <= HOUR_KEY_TTL_S
    call = await store.get_call("call_a")
    assert call is not None
    assert (call["status"], call["spent"], call["ended_ms"], call["end_reason"]) == (
        "ended",
        12_345,
        NOW + 60_000,
        "caller_hangup",
    )
    assert 0 < await store.redis.ttl(store.keys.call("call_a")) <= RECEIPT_RETENTION_S
    assert 0 < await store.redis.ttl(store.keys.receipts("call_a")) <= RECEIPT_RETENTION_S
    assert await store.active_calls() == [] and await store.active_calls("acme") == []
    (ended,) = await store.recent_ended(10)
    assert (ended["call"], ended["reason"], ended["spent"]) == ("call_a", "caller_hangup", "12345")
    ledger = await ledger_all(store)
    assert ledger_spent(ledger) == 12_345
    assert (await store.ledger(1))[0]["type"] == "settle"


async def test_settle_unknown_and_refused_calls_change_nothing(store: SpendStore) -> None:
    unknown = await store.settle("call_none", 1, 500, NOW, "hangup")
    assert (unknown.replayed, unknown.status) == (True, "unknown_call")
    await store.set_kill_switch(True)
    await store.admit(req("call_a"))
    refused = await store.settle("call_a", 1, 500, NOW, "hangup")
    assert (refused.replayed, refused.status) == (True, "not_admitted")
    assert await day_totals(store) == (0, 0)


async def test_hold_keeps_an_unconnected_call_from_the_reaper(store: SpendStore) -> None:
    await store.admit(req("call_ring", lease_ms=1_000))
    await store.admit(req("call_gone", lease_ms=1_000))
    # Held past its first lease: the reaper leaves it; the one not held is reaped.
    held = await store.hold("call_ring", NOW + 900, lease_ms=5_000)
    assert (held.held, held.status) == (True, "admitted")
    assert await store.redis.zscore(store.keys.active, "call_ring") == NOW + 5_900
    assert await store.redis.zscore(store.keys.tenant("acme", "active"), "call_ring") == NOW + 5_900
    assert await store.reap(NOW + 2_000) == 1
    gone = await store.get_call("call_gone")
    assert gone is not None and gone["end_reason"] == "lease_expired"
    ringing = await store.get_call("call_ring")
    assert ringing is not None and ringing["status"] == "admitted" and ringing["seq"] == 0
    # A hold never shortens a lease, and never touches a call once it is not admitted.
    await store.hold("call_ring", NOW, lease_ms=1_000)
    assert await store.redis.zscore(store.keys.active, "call_ring") == NOW + 5_900
    assert await store.connect("call_ring", "node-b", NOW + 2_500) == ConnectResult(
        True, "active", "node-b"
    )
    assert await store.hold("call_ring", NOW + 3_000, lease_ms=60_000) == HoldResult(
        False, "active"
    )
    assert await store.redis.zscore(store.keys.active, "call_ring") == NOW + 5_900
    await store.settle("call_ring", 1, 0, NOW + 4_000, "no_answer")
    assert await store.hold("call_ring", NOW + 5_000) == HoldResult(False, "ended")
    assert await store.redis.zscore(store.keys.active, "call_ring") is None
    assert await store.hold("call_none", NOW) == HoldResult(False, "unknown_call")
    with pytest.raises(ValueError, match="lease_ms"):
        await store.hold("call_ring", NOW, lease_ms=0)


async def test_one_node_connects_a_call_and_no_settlement_of_the_unconnected_zeroes_it(
    store: SpendStore,
) -> None:
    await store.admit(req("call_live"))
    assert await store.connect("call_live", "node-b", NOW + 500) == ConnectResult(
        True, "active", "node-b"
    )
    # A second socket (any node) loses; the owner stays the first.
    assert await store.connect("call_live", "node-c", NOW + 600) == ConnectResult(
        False, "active", "node-b"
    )
    # Node A's media watcher, too late: nothing moves.
    before = (await day_totals(store), await ledger_all(store))
    zero = await store.settle("call_live", 1, 0, NOW + 700, "no_media", unconnected_only=True)
    assert (zero.replayed, zero.status) == (True, "connected")
    assert (await day_totals(store), await ledger_all(store)) == before
    live = await store.get_call("call_live")
    assert live is not None and (live["status"], live["node"]) == ("active", "node-b")
    # The other order: settled as never connected, then its stream comes: refused.
    await store.admit(req("call_late", node="node-a"))
    first = await store.settle("call_late", 1, 0, NOW + 700, "no_media", unconnected_only=True)
    assert first.status == "settled"
    assert await store.connect("call_late", "node-b", NOW + 800) == ConnectResult(
        False, "ended", "node-a"
    )
    assert await store.connect("call_none", "node-b", NOW) == ConnectResult(
        False, "unknown_call", ""
    )
    with pytest.raises(ValueError):
        await store.connect("call late", "node-b", NOW)


async def test_connect_and_the_unconnected_settlement_race_to_one_outcome(
    store: SpendStore,
) -> None:
    # Node B's stream and node A's watcher at the same moment, 200 times: each call is
    # either live (active, nothing booked) or settled at zero and refused, never both.
    calls = [f"call_race{i}" for i in range(200)]
    for call_id in calls:
        await store.admit(req(call_id))

    async def both(call_id: str) -> tuple[bool, str]:
        connected, settled = await asyncio.gather(
            store.connect(call_id, "node-b", NOW + 100),
            store.settle(call_id, 1, 0, NOW + 100, "no_media", unconnected_only=True),
        )
        assert connected.won != (settled.status == "settled")
        return connected.won, settled.status

    outcomes = await asyncio.gather(*(both(c) for c in calls))
    won = [c for c, (w, _) in zip(calls, outcomes, strict=True) if w]
    for call_id in calls:
        record = await store.get_call(call_id)
        assert record is not None
        assert record["status"] == ("active" if call_id in won else "ended")
    settles = [e for e in await ledger_all(store) if e["type"] == "settle"]
    assert len(settles) == len(calls) - len(won)
    assert await store.redis.zcard(store.keys.active) == len(won)


async def test_the_live_calls_of_a_dead_node_are_settled_from_their_last_figures(
    store: SpendStore,
) -> None:
    for call_id, node in (("call_b1", "node-b"), ("call_b2", "node-b"), ("call_a1", "node-a")):
        await store.admit(req(call_id, quantum=50_000))
        assert (await store.connect(call_id, node, NOW + 100)).won
        await store.heartbeat(call_id, 1, NOW + 5_000, 12_345, lease_ms=LEASE)
    await store.admit(req("call_b_ringing"))  # admitted by node B, never connected
    await store.node_beat("node-a", NOW + 19_000)
    await store.node_beat("node-b", NOW + 6_000)
    assert await store.nodes() == {"node-a": NOW + 19_000, "node-b": NOW + 6_000}
    # Node B's last beat is 14 s old at NOW + 20 s: dead after 10 s.
    report = await store.settle_orphans(NOW + 20_000, dead_after_ms=10_000)
    assert report == OrphanReport(settled=2, nodes_forgotten=1)
    for call_id in ("call_b1", "call_b2"):
        record = await store.get_call(call_id)
        assert record is not None
        assert (record["status"], record["end_reason"], record["spent"]) == (
            "ended",
            "node_lost",
            12_345,
        )
        (receipt,) = await store.receipts(call_id)
        assert (receipt["type"], receipt["reason"], receipt["actual"]) == (
            "settled",
            "node_lost",
            "12345",
        )
    live, ringing = await store.get_call("call_a1"), await store.get_call("call_b_ringing")
    assert live is not None and live["status"] == "active"
    assert ringing is not None and ringing["status"] == "admitted"  # left to its lease
    assert await store.nodes() == {"node-a": NOW + 19_000}
    # The money: two calls booked at their last cost, their reservations released.
    entries = await ledger_all(store)
    assert sorted(int(e["amount"]) for e in entries if e["type"] == "reap") == [12_345, 12_345]
    spent, reserved = await day_totals(store)
    assert spent == ledger_spent(entries) == 2 * 12_345
    assert reserved == 50_000 + 10_000  # call_a1 and the ringing call still hold theirs
    # Node B comes back and settles one for real: corrected once.
    late = await store.settle("call_b1", 2, 20_000, NOW + 21_000, "caller_hangup")
    assert late.status == "adjusted"
    assert (await day_totals(store))[0] == ledger_spent(await ledger_all(store)) == 32_345
    # Nothing left to do: a second sweep settles nothing.
    assert await store.settle_orphans(NOW + 20_000, dead_after_ms=10_000) == OrphanReport(0, 0)


async def test_live_nodes_tell_the_others_what_they_offer(store: SpendStore) -> None:
    await store.node_beat("node-a", NOW, {"sip_free": "4"})
    await store.node_beat("node-b", NOW - 60_000, {"sip_free": "8"})
    await store.node_beat("node-c", NOW)
    assert await store.live_nodes(NOW + 1_000) == {"node-a": {"sip_free": "4"}, "node-c": {}}
    # What a node tells is its last beat's word: a beat without it withdraws it.
    await store.node_beat("node-a", NOW + 2_000)
    assert (await store.live_nodes(NOW + 2_000))["node-a"] == {}
    await store.node_leave("node-c")
    assert set(await store.live_nodes(NOW + 2_000)) == {"node-a"}
    with pytest.raises(ValueError):
        await store.node_beat("node-a", NOW, {"x": "y" * 300})


async def test_a_node_restarting_under_its_id_settles_its_previous_lifes_calls(
    store: SpendStore,
) -> None:
    await store.admit(req("call_old"))
    await store.admit(req("call_done"))
    for call_id in ("call_old", "call_done"):
        assert (await store.connect(call_id, "node-a", NOW + 100)).won
    # A call settled the ordinary way leaves its node's set.
    await store.settle("call_done", 1, 700, NOW + 2_000, "caller_hangup")
    await store.node_beat("node-a", NOW + 2_000)
    assert await store.settle_orphans(NOW + 3_000) == OrphanReport(0, 0)  # alive
    report = await store.settle_orphans(NOW + 3_000, restarted_node="node-a")
    assert report.settled == 1
    old = await store.get_call("call_old")
    assert old is not None and (old["end_reason"], old["spent"]) == ("node_lost", 0)
    done = await store.get_call("call_done")
    assert done is not None and done["end_reason"] == "caller_hangup"
    with pytest.raises(ValueError):
        await store.node_beat("node a", NOW)


async def test_reap_settles_expired_leases_conservatively(store: SpendStore) -> None:
    for i in range(3):
        await store.admit(req(f"call_{i}", lease_ms=1_000))
    await store.admit(req("call_live", lease_ms=60_000))
    # call_1 reported a running cost above its reservation: reaped at the higher figure.
    await store.heartbeat("call_1", 1, NOW + 500, 11_500, lease_ms=1_000)
    assert await store.reap(NOW + 1_400, limit=1) == 1  # call_0 (expires first)
    assert await store.reap(NOW + 1_600) == 2
    assert await store.reap(NOW + 1_600) == 0
    assert await day_totals(store) == (10_000 + 11_500 + 10_000, 10_000)
    reaped = await store.get_call("call_1")
    assert reaped is not None and reaped["reaped"] and reaped["end_reason"] == "lease_expired"
    assert [c["id"] for c in await store.active_calls("acme")] == ["call_live"]
    # The owner's real settlement arrives late (e.g. from its journal): corrected once.
    late = await store.settle("call_1", 2, 4_000, NOW + 2_000, "caller_hangup")
    assert (late.replayed, late.status, late.spent) == (False, "adjusted", 4_000)
    again = await store.settle("call_1", 2, 4_000, NOW + 2_000, "caller_hangup")
    assert again.status == "replayed"
    assert await day_totals(store) == (10_000 + 4_000 + 10_000, 10_000)
    hour_total = int(await store.redis.get(store.keys.hour("acme", HOUR)) or 0)
    assert hour_total == 24_000
    ledger = await ledger_all(store)
    assert [e["type"] for e in ledger].count("reap") == 3
    assert next(e for e in ledger if e["type"] == "adjust")["amount"] == "-7500"
    assert ledger_spent(ledger) == 24_000


# -- listing, receipts, annotations -----------------------------------------------------


async def test_list_calls_pages_through_ties_and_filters(store: SpendStore) -> None:
    await store.set_tenant_limits("acme", TenantLimits(max_concurrent=4))
    ids = []
    for i in range(11):
        call_id = f"call_{i:02d}"
        ids.append(call_id)
        # Pairs of calls share a millisecond: the cursor must not skip or repeat ties.
        await store.admit(req(call_id, quantum=0, now_ms=NOW + i // 2))
    await store.admit(req("call_other", tenant="beta", quantum=0))
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_calls("acme", cursor=cursor, limit=3)
        seen += [c["id"] for c in page]
        if cursor is None:
            break
    assert sorted(seen) == ids and len(seen) == len(set(seen))
    created = [(await store.get_call(i) or {"created_ms": -1})["created_ms"] for i in seen]
    assert created == sorted(created, reverse=True)
    refused, _ = await store.list_calls("acme", status="refused", limit=50)
    assert sorted(c["id"] for c in refused) == ids[4:]
    admitted, next_cursor = await store.list_calls("acme", status="admitted", limit=50)
    assert len(admitted) == 4 and next_cursor is None
    with pytest.raises(ValueError, match="cursor"):
        await store.list_calls("acme", cursor="nonsense")
    with pytest.raises(ValueError, match="status"):
        await store.list_calls("acme", status="weird")
    with pytest.raises(ValueError, match="limit"):
        await store.list_calls("acme", limit=0)


async def test_update_call_and_receipts(store: SpendStore) -> None:
    await store.admit(req("call_a"))
    assert await store.connect("call_a", "node-a", NOW + 700)
    assert await store.update_call("call_a", provider_call_id="CA123", answered_ms=NOW + 800)
    call = await store.get_call("call_a")
    assert call is not None
    assert (call["status"], call["provider_call_id"], call["answered_ms"]) == (
        "active",
        "CA123",
        NOW + 800,
    )
    with pytest.raises(ValueError):
        await store.update_call("call_a")
    assert await store.add_receipt(
        "call_a", {"kind": "tool", "ok": True, "ms": 12.5, "skip": None, "n": 3}
    )
    (receipt,) = await store.receipts("call_a")
    assert {k: v for k, v in receipt.items() if k != "id"} == {
        "kind": "tool",
        "ok": "true",
        "ms": "12.5",
        "n": "3",
    }
    with pytest.raises(ValueError):
        await store.add_receipt("call_a", {})
    with pytest.raises(ValueError):
        await store.add_receipt("call_a", {"blob": "x" * 5_000})
    await store.settle("call_a", 1, 1, NOW + 1_000, "hangup")
    assert not await store.update_call("call_a", provider_call_id="CA124")
    assert not await store.update_call("call_none", provider_call_id="CA125")
    assert await store.get_call("call_none") is None


async def test_limits_round_trip(store: SpendStore) -> None:
    assert await store.get_tenant_limits("acme") == TenantLimits()
    limits = TenantLimits(budget_day=1, budget_month=2, max_concurrent=3, max_call_cost=4)
    await store.set_tenant_limits("acme", limits)
    assert await store.get_tenant_limits("acme") == limits
    await store.set_global_max_concurrent(9)
    assert await store.get_global() == GlobalLimits(killed=False, max_concurrent=9)
    with pytest.raises(LimitsError):
        await store.set_global_max_concurrent(-1)
    defaults = TenantLimits(budget_day=7, max_concurrent=8)
    assert await store.ensure_tenant_limits("acme", defaults) == limits  # already set
    assert await store.ensure_tenant_limits("newco", defaults) == defaults  # stored
    assert await store.get_tenant_limits("newco") == defaults
    assert "newco" in await store.tenants()
    await store.redis.hset(store.keys.tenant("acme", "limits"), "budget_day", "abc")
    with pytest.raises(LimitsError):
        await store.get_tenant_limits("acme")


async def test_effective_limits_fill_defaults_field_by_field_and_write_nothing(
    store: SpendStore,
) -> None:
    defaults = TenantLimits(budget_day=7, max_concurrent=8)
    assert await store.effective_tenant_limits("fresh", defaults) == defaults
    assert await store.redis.exists(store.keys.tenant("fresh", "limits")) == 0
    assert "fresh" not in await store.tenants()
    # A stored 0 is "unlimited", not "never set": it wins over the default.
    await store.redis.hset(store.keys.tenant("part", "limits"), "budget_day", "0")
    assert await store.effective_tenant_limits("part", defaults) == TenantLimits(
        budget_day=0, max_concurrent=8
    )
    # What admission then stores is what was shown.
    assert await store.ensure_tenant_limits("fresh", defaults) == defaults


# -- failures ---------------------------------------------------------------------------


async def test_store_needs_decoded_responses(spend_redis: EmbeddedRedis) -> None:
    raw = Redis.from_url(spend_redis.url)  # bytes replies would turn "ok" into "b'ok'"
    with pytest.raises(ValueError, match="decode_responses"):
        SpendStore(raw)
    with pytest.raises(ValueError, match="prefix"):
        SpendStore(redis_client(spend_redis.url), "bad prefix")
    await raw.aclose()


async def test_unreachable_redis_is_store_unavailable(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "gone")
    client = redis_client(server.url)  # nothing listens on that port
    store = SpendStore(client, "down")
    with pytest.raises(StoreUnavailable) as err:
        await store.admit(req("call_a"))
    assert err.value.operation == "admit"
    with pytest.raises(StoreUnavailable):
        await store.settle("call_a", 1, 1, NOW, "hangup")
    with pytest.raises(StoreUnavailable):
        await store.get_call("call_a")
    assert await store.add_receipt("call_a", {"kind": "x"}) is False
    assert store.receipt_failures == 1
    await client.aclose()


async def test_redis_restart_is_transparent_after_unavailability(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "r") as server:
        client = redis_client(server.url)
        store = SpendStore(client, "restart")
        assert (await store.admit(req("call_a"))).admitted
        server.kill()
        with pytest.raises(StoreUnavailable):
            await store.extend("call_a", 1, 1, NOW + 1, 0)
        server.start()
        # Same data (append-only, fsync always), scripts reloaded after NOSCRIPT.
        assert (await store.extend("call_a", 1, 1, NOW + 1, 0)).reserved_total == 10_001
        await client.aclose()


async def test_out_of_memory_is_unavailable_and_writes_nothing(store: SpendStore) -> None:
    await store.admit(req("call_a"))
    before = await ledger_all(store)
    # Redis over its memory cap (noeviction) refuses a script's first growing write.
    await store.redis.config_set("maxmemory", "1")
    try:
        with pytest.raises(StoreUnavailable):
            await store.admit(req("call_b", caller="+15550001111", campaign="c1"))
        with pytest.raises(StoreUnavailable):
            await store.extend("call_a", 1, 5, NOW + 1, 0)
        with pytest.raises(StoreUnavailable):
            await store.settle("call_a", 1, 5, NOW + 1, "hangup")
    finally:
        await store.redis.config_set("maxmemory", "256mb")
    assert await store.get_call("call_b") is None
    assert await ledger_all(store) == before
    assert await day_totals(store) == (0, 10_000)


async def test_our_own_lua_errors_stay_loud(store: SpendStore) -> None:
    # A day bucket of the wrong type is data corruption / a bug, not an outage.
    await store.redis.set(store.keys.day("acme", DAY), "oops")
    await store.set_tenant_limits("acme", TenantLimits(budget_day=100))
    with pytest.raises(redis_errors.ResponseError) as err:
        await store.admit(req("call_a", quantum=1))
    assert not isinstance(err.value, StoreUnavailable)


async def test_the_client_opens_at_most_its_pool_of_connections(spend_redis: EmbeddedRedis) -> None:
    # redis-py's default pool opens a connection per operation in flight and keeps them all:
    # 101 were open after the ten-minute hostile campaign. Operations beyond the bound wait.
    observer = redis_client(spend_redis.url)
    client = redis_client(spend_redis.url)
    try:
        before = int((await observer.info("clients"))["connected_clients"])
        in_flight = REDIS_MAX_CONNECTIONS + 36
        # BLPOP on an absent key holds its connection for 0.1 s without blocking the server.
        replies = await asyncio.gather(
            *(client.blpop([f"absent-{n}"], timeout=0.1) for n in range(in_flight))
        )
        opened = int((await observer.info("clients"))["connected_clients"]) - before
    finally:
        await client.aclose()
        await observer.aclose()
    assert replies == [None] * in_flight  # every operation answered, none refused
    assert 1 < opened <= REDIS_MAX_CONNECTIONS
