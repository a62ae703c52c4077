"""What the Redis failover tests (Sentinel, Cluster) check once the master is gone: the
same store admits again once its client reaches the promoted replica, and the call
admitted before the failover and the one after settle with the books balanced."""

from __future__ import annotations

import asyncio
import time

from rutster.spend.store import AdmitRequest, SpendStore, StoreUnavailable

#: The tenant of both calls.
TENANT = "acme"
#: What each call is settled at (micros), and their sum: the day's spend afterwards.
COSTS = {"call_before": 4_000, "call_after": 6_000}


def failover_request(call_id: str, now_ms: int) -> AdmitRequest:
    """An inbound call of :data:`TENANT` with a 10,000-micro first reservation."""
    return AdmitRequest(
        call_id=call_id,
        tenant=TENANT,
        now_ms=now_ms,
        quantum=10_000,
        provider="twilio",
        direction="inbound",
        check_caller=False,
    )


async def admit_after_failover_and_balance(
    store: SpendStore, now_ms: int, timeout_s: float
) -> None:
    """Admit ``call_after`` once the store is reachable again (``StoreUnavailable`` until
    then, for at most ``timeout_s``), settle it and ``call_before``, and check the day's
    spent and reserved money."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admitted = await store.admit(failover_request("call_after", now_ms + 1_000))
            break
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the store never reached the new master"
            await asyncio.sleep(0.2)
    assert admitted.admitted
    for call_id, actual in COSTS.items():
        settled = await store.settle(call_id, 1, actual, now_ms + 5_000, "caller_hangup")
        assert settled.status == "settled", call_id
    before = await store.get_call("call_before")
    assert before is not None
    raw = await store.redis.hmget(store.keys.day(TENANT, before["day"]), ["spent", "reserved"])
    assert (int(raw[0] or 0), int(raw[1] or 0)) == (sum(COSTS.values()), 0)
