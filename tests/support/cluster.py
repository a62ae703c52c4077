"""What the tests of several gateway nodes share: their environment, and waiting for a
call record to reach a status in the shared Redis."""

from __future__ import annotations

import asyncio
import time

from rutster.spend.store import CallRecord, SpendStore
from tests.conftest import suite_redis_url

#: The tenant every webhook call of these tests belongs to (no number map).
TENANT = "default"
#: One stream secret for every node: a media socket may reach any of them.
CLUSTER_STREAM_SECRET = "s" * 32


def cluster_env(prefix: str, token: str, tap_url: str, **extra: str) -> dict[str, str]:
    """The environment every node of one test shares: the suite's Redis under
    ``prefix``, Twilio's ``token``, one stream secret, the brain at ``tap_url``."""
    return {
        "REDIS_URL": suite_redis_url(),
        "RUTSTER_REDIS_PREFIX": prefix,
        "TWILIO_AUTH_TOKEN": token,
        "RUTSTER_STREAM_SECRET": CLUSTER_STREAM_SECRET,
        "RUTSTER_TAP_URL": tap_url,
        "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
        **extra,
    }


async def record_of(store: SpendStore, call_sid: str) -> CallRecord | None:
    """The record of the provider call ``call_sid`` (the store keys calls by our id)."""
    records, _ = await store.list_calls(TENANT, limit=50)
    return next((r for r in records if r["provider_call_id"] == call_sid), None)


async def record_when(
    store: SpendStore, call_sid: str, status: str, *, timeout_s: float = 10.0
) -> CallRecord:
    """The record of ``call_sid`` once it has ``status`` (or fail after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = await record_of(store, call_sid)
        if record is not None and record["status"] == status:
            return record
        assert time.monotonic() < deadline, f"{call_sid}: {record}"
        await asyncio.sleep(0.05)
