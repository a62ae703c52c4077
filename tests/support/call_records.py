"""Reading a call's record once the gateway has settled it (tests)."""

from __future__ import annotations

import asyncio

from rutster.gateway.call import Call
from rutster.spend.store import CallRecord
from tests.conftest import RunningGateway


async def settled_record(
    gateway: RunningGateway, call: Call, timeout_s: float = 10.0
) -> CallRecord:
    """``call``'s record once its status is ``ended`` (fails after ``timeout_s``)."""
    store = gateway.state.spend_store
    assert store is not None and call.call_id is not None
    for _ in range(int(timeout_s / 0.05)):
        record = await store.get_call(call.call_id)
        if record is not None and record["status"] == "ended":
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"call {call.call_id} was never settled")
