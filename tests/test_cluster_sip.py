"""SIP across gateway nodes: a call placed through node A's REST API goes out through a
SIP worker attached to node B; inbound calls spread by Kamailio's dispatcher over
workers attached to two nodes each run on their worker's node.

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
from pathlib import Path

import httpx

from rutster.brains.echo import EchoBrain
from rutster.spend.store import CallRecord, SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, Service, free_port, gateway_process, sip_worker_process
from rutster.tools.sip_load_generator import analyse_echo
from rutster.tools.sip_peer import SipPeerProcess
from tests.conftest import TEST_ADMIN_KEY, suite_redis_url, tenant_key, unique_prefix
from tests.realtime_echo import check_sip_echo, realtime_echo
from tests.sip_stack import TEST_SIP_SECRET, speech_16k, worker_env
from tests.test_sip_e2e import SPEECH
from tests.test_sip_kamailio_e2e import kamailio_in_front

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


def nodes_env(prefix: str, tap_url: str) -> dict[str, str]:
    """What both nodes share: the suite's Redis under ``prefix``, the secrets, the brain."""
    return {
        "REDIS_URL": suite_redis_url(),
        "RUTSTER_REDIS_PREFIX": prefix,
        "RUTSTER_STREAM_SECRET": "s" * 32,
        "RUTSTER_SIP_SECRET": TEST_SIP_SECRET,
        "RUTSTER_TAP_URL": tap_url,
        "RUTSTER_ADMIN_KEY": TEST_ADMIN_KEY,
        "TWILIO_AUTH_TOKEN": secrets.token_urlsafe(16),
    }


async def test_a_call_placed_on_node_a_goes_out_through_node_bs_worker(
    echo_brain: EchoBrain,
) -> None:
    prefix = unique_prefix()
    env = nodes_env(prefix, echo_brain.url)
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


@realtime_echo
async def test_kamailio_spreads_inbound_calls_over_workers_of_two_nodes(
    echo_brain: EchoBrain, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    env = nodes_env(prefix, echo_brain.url)
    speech = speech_16k(str(SPEECH), 3.0)
    client = redis_client(suite_redis_url())
    store = SpendStore(client, prefix)
    ports = {"wa": free_port(), "wb": free_port()}
    try:
        with (
            gateway_process({**env, "RUTSTER_NODE_ID": "node-a"}) as a,
            gateway_process({**env, "RUTSTER_NODE_ID": "node-b"}) as b,
            sip_worker_process(
                {**worker_env(f"http://{LOOPBACK}:{a.port}"), "RUTSTER_SIP_WORKER_ID": "wa"},
                ports["wa"],
            ),
            sip_worker_process(
                {**worker_env(f"http://{LOOPBACK}:{b.port}"), "RUTSTER_SIP_WORKER_ID": "wb"},
                ports["wb"],
            ),
            kamailio_in_front(list(ports.values()), tmp_path) as kamailio,
        ):
            async with SipPeerProcess() as phone:
                uri = f"sip:+15550001111@{LOOPBACK}:{kamailio}"
                calls = [await phone.place_call(uri, speech=speech, loop=False) for _ in range(2)]
                assert all(c.sip_code == 200 for c in calls), calls
                deadline = time.monotonic() + 10
                while True:
                    live = await store.active_calls()
                    if len(live) == 2 and all(r["status"] == "active" for r in live):
                        break
                    assert time.monotonic() < deadline, live
                    await asyncio.sleep(0.1)
                # One call on each node: each runs where its worker is attached.
                assert sorted(r["node"] for r in live) == ["node-a", "node-b"], live
                await asyncio.sleep(3.5)  # the whole utterance and its echo
                heard = [await phone.received_audio(c) for c in calls]
                # Node A's REST API hangs up the call on node B (the control channel);
                # the phone hangs up the other (BYE through Kamailio's Record-Route).
                on_b = next(r for r in live if r["node"] == "node-b")
                async with httpx.AsyncClient(
                    base_url=f"http://{LOOPBACK}:{a.port}", timeout=10
                ) as api:
                    auth = {"Authorization": f"Bearer {await tenant_key(api, TENANT)}"}
                    deleted = await api.delete(f"/v1/calls/{on_b['id']}", headers=auth)
                assert deleted.status_code == 202, deleted.text
                ends = []
                for call in calls:
                    try:
                        ends.append(await phone.wait_ended(call, 2))
                    except TimeoutError:
                        await phone.hang_up(call)
                        ends.append(await phone.wait_ended(call, 5))
                assert sorted(end.by for end in ends) == ["local", "remote"], ends
            ended = {r["node"]: await record_when(store, r["id"], "ended") for r in live}
        assert ended["node-b"]["end_reason"] == "api_hangup"
        assert ended["node-a"]["end_reason"] == "caller_hangup"
        assert all((r["spent"] or 0) > 0 for r in ended.values()), ended
        for audio in heard:
            back, corr, _ = analyse_echo(speech, audio)
            assert back
            check_sip_echo(corr)
    finally:
        await client.aclose()
