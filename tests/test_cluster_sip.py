"""SIP across gateway nodes: a call placed through node A's REST API goes out through a
SIP worker attached to node B.

Two ``rutster serve`` processes share the suite's Redis; one ``rutster sip-worker``
process is attached to node B only; the callee is a real pjsua2 phone
(``SipPeerProcess``). Node B tells the node directory its worker has room; node A,
which has no worker, hands the admitted call to B over the control channel; B's
worker dials, the callee answers, and the call runs on B.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator

import httpx

from rutster.brains.echo import EchoBrain
from rutster.spend.store import CallRecord, SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, Service, free_port, gateway_process, sip_worker_process
from rutster.tools.sip_peer import SipPeerProcess
from tests.conftest import TEST_ADMIN_KEY, suite_redis_url, tenant_key, unique_prefix
from tests.sip_stack import TEST_SIP_SECRET, speech_16k, worker_env
from tests.test_sip_e2e import SPEECH

TENANT = "default"
#: How long node A may take to learn of node B's worker (a few node beats).
DIRECTORY_WAIT_S = 10.0


@contextlib.contextmanager
def two_nodes_and_a_worker_on_b(env: dict[str, str]) -> Iterator[tuple[Service, Service]]:
    with (
        gateway_process({**env, "RUTSTER_NODE_ID": "node-a"}) as a,
        gateway_process({**env, "RUTSTER_NODE_ID": "node-b"}) as b,
        sip_worker_process(
            {**worker_env(f"http://{LOOPBACK}:{b.port}"), "RUTSTER_SIP_WORKER_ID": "wb"},
            free_port(),
        ),
    ):
        yield a, b


async def record_when(store: SpendStore, call_id: str, status: str) -> CallRecord:
    deadline = time.monotonic() + 15
    while True:
        record = await store.get_call(call_id)
        if record is not None and record["status"] == status:
            return record
        assert time.monotonic() < deadline, record
        await asyncio.sleep(0.05)


async def test_a_call_placed_on_node_a_goes_out_through_node_bs_worker(
    echo_brain: EchoBrain,
) -> None:
    prefix = unique_prefix()
    env = {
        "REDIS_URL": suite_redis_url(),
        "RUTSTER_REDIS_PREFIX": prefix,
        "RUTSTER_STREAM_SECRET": "s" * 32,
        "RUTSTER_SIP_SECRET": TEST_SIP_SECRET,
        "RUTSTER_TAP_URL": echo_brain.url,
        "RUTSTER_ADMIN_KEY": TEST_ADMIN_KEY,
        "TWILIO_AUTH_TOKEN": secrets.token_urlsafe(16),
    }
    client = redis_client(suite_redis_url())
    store = SpendStore(client, prefix)
    try:
        with two_nodes_and_a_worker_on_b(env) as (a, _):
            async with (
                SipPeerProcess() as callee,
                httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{a.port}", timeout=10) as api,
            ):
                await callee.answer_incoming(
                    200, after_ms=100, speech=speech_16k(str(SPEECH), 2.0), loop=False
                )
                auth = {"Authorization": f"Bearer {await tenant_key(api, TENANT)}"}
                body = {"to": callee.sip_uri, "from": "+15550002222", "provider": "sip"}
                # Node A has no worker of its own: until the directory shows B's, a
                # SIP call is refused before anything is admitted (409).
                deadline = time.monotonic() + DIRECTORY_WAIT_S
                created = await api.post("/v1/calls", json=body, headers=auth)
                while created.status_code == 409 and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    created = await api.post("/v1/calls", json=body, headers=auth)
                assert created.status_code == 201, created.text
                call_id = created.json()["id"]
                incoming = await callee.next_incoming(10)
                assert "+15550002222" in incoming.from_uri
                live = await record_when(store, call_id, "active")
                # Admitted on node A, dialled by node B's worker, running on node B.
                assert live["provider_call_id"] == "sip-worker:wb@node-b"
                assert live["node"] == "node-b"
                await callee.hang_up(incoming.handle)
                ended = await record_when(store, call_id, "ended")
        assert ended["end_reason"] == "caller_hangup" and (ended["spent"] or 0) > 0
    finally:
        await client.aclose()
