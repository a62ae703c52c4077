"""Two gateway nodes on one Redis: one call answered on one and streamed to the other.

Each node is a ``rutster serve`` process of its own (its own port, its own node id)
sharing the suite's Redis under one key prefix and one stream secret, as gateways
behind a load balancer do; a stand-in balancer (tests/support/split_proxy.py) sends
webhooks and REST calls to node A and media sockets to node B. So A answers Twilio's
voice webhook and the media socket lands on B: the call's context travels in the
stream token, the call becomes active on B in one atomic step (``SpendStore.connect``),
and node A's media-connect watcher, whose deadline passes while the call runs,
leaves it alone. The REST API on node A then reaches the call on node B.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from rutster.brains.echo import EchoBrain
from rutster.spend.store import (
    HEARTBEAT_INTERVAL_MS,
    NODE_BEAT_INTERVAL_MS,
    NODE_DEAD_AFTER_MS,
    CallRecord,
    SpendStore,
    redis_client,
)
from rutster.tools.launcher import LOOPBACK, Service, gateway_process
from rutster.tools.twilio_simulator import SimulatedCallResult, TwilioSimulator, new_sid
from tests.conftest import TEST_ADMIN_KEY, suite_redis_url, tenant_key, unique_prefix
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.cluster import TENANT, cluster_env, record_when
from tests.support.split_proxy import SplitProxy

#: Node A gives up on a call whose media has not reached it after this long: shorter
#: than the calls below, so its watcher's deadline passes while they run on node B.
MEDIA_CONNECT_TIMEOUT_S = 2


class TwoNodes:
    """Node A (webhooks, REST) and node B (media), and their shared store."""

    def __init__(
        self, a: Service, b: Service, store: SpendStore, token: str, public_url: str
    ) -> None:
        self.a, self.b, self.store, self.token = a, b, store, token
        self.public_url = public_url

    def url(self, node: Service) -> str:
        return f"http://{LOOPBACK}:{node.port}"

    def simulator(self) -> TwilioSimulator:
        """Twilio, calling the public URL (the balancer sends it to node A, and the
        stream A's TwiML names to node B)."""
        return TwilioSimulator(self.public_url, auth_token=self.token)

    async def record_when(self, call_sid: str, status: str, timeout_s: float) -> CallRecord:
        """The record of ``call_sid`` once it has ``status``."""
        return await record_when(self.store, call_sid, status, timeout_s=timeout_s)

    async def call_live_on_b(
        self, pcm: bytes
    ) -> tuple[asyncio.Task[SimulatedCallResult], CallRecord]:
        """A call placed through the balancer, once it runs (on node B)."""
        call_sid = new_sid("CA")
        placed = asyncio.create_task(self.simulator().place_call(pcm, call_sid=call_sid))
        try:
            live = await self.record_when(call_sid, "active", timeout_s=10)
        except BaseException:
            placed.cancel()
            raise
        assert live["node"] == "node-b"
        return placed, live


@contextlib.contextmanager
def node_processes(env: dict[str, str]) -> Iterator[tuple[Service, Service]]:
    with (
        gateway_process({**env, "RUTSTER_NODE_ID": "node-a"}) as a,
        gateway_process({**env, "RUTSTER_NODE_ID": "node-b"}) as b,
    ):
        yield a, b


@pytest.fixture
async def nodes(echo_brain: EchoBrain) -> AsyncIterator[TwoNodes]:
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    client = redis_client(suite_redis_url())
    # The balancer: webhooks and REST calls to node A, media sockets to node B.
    async with SplitProxy(get_port=0, other_port=0).running() as balancer:
        env = cluster_env(
            prefix,
            token,
            echo_brain.url,
            RUTSTER_PUBLIC_URL=balancer.url,
            RUTSTER_ADMIN_KEY=TEST_ADMIN_KEY,
            RUTSTER_MEDIA_CONNECT_TIMEOUT_S=str(MEDIA_CONNECT_TIMEOUT_S),
        )
        try:
            with node_processes(env) as (a, b):
                balancer.get_port, balancer.other_port = b.port, a.port
                yield TwoNodes(a, b, SpendStore(client, prefix), token, balancer.url)
        finally:
            await client.aclose()


@realtime_echo
async def test_a_webhook_on_node_a_and_media_on_node_b_make_one_billed_call(
    nodes: TwoNodes, speech_pcm: bytes
) -> None:
    sent = speech_pcm[: (MEDIA_CONNECT_TIMEOUT_S + 3) * 8000 * 2]
    result = await nodes.simulator().place_call(sent, tail_s=1.0)
    assert_echo_intact(sent, result)
    record = await nodes.record_when(result.call_sid, "ended", timeout_s=10)
    # Run and settled by node B, with what the call cost; node A's watcher, whose
    # deadline passed mid-call, did not settle it at zero.
    assert record["node"] == "node-b"
    assert record["end_reason"] == "caller_hangup"
    assert (record["spent"] or 0) > 0
    assert (record["answered_ms"] or 0) > 0
    # The ledger holds one reservation and one settlement for it, nothing else.
    ledger = [e for e in await nodes.store.ledger(100) if e["call"] == record["id"]]
    assert sorted(e["type"] for e in ledger) == ["reserve", "settle"]
    assert [int(e["amount"]) for e in ledger if e["type"] == "settle"] == [record["spent"]]


async def test_node_a_hangs_up_a_call_whose_media_is_on_node_b(
    nodes: TwoNodes, speech_pcm: bytes
) -> None:
    placed, live = await nodes.call_live_on_b(speech_pcm)
    call_sid = live["provider_call_id"]
    try:
        async with httpx.AsyncClient(base_url=nodes.url(nodes.a), timeout=10) as api:
            key = await tenant_key(api, TENANT)
            response = await api.delete(
                f"/v1/calls/{live['id']}", headers={"Authorization": f"Bearer {key}"}
            )
        assert response.status_code == 202, response.text
        result = await asyncio.wait_for(placed, timeout=10)
    finally:
        placed.cancel()
    # The caller's 30 s were cut short: node B ended the call on node A's request.
    assert result.frames_sent < len(speech_pcm) // 320 // 2
    ended = await nodes.record_when(call_sid, "ended", timeout_s=10)
    assert ended["end_reason"] == "api_hangup"
    assert (ended["spent"] or 0) > 0


async def test_node_b_killed_has_its_call_settled_within_the_bound_and_the_books_balance(
    nodes: TwoNodes, speech_pcm: bytes
) -> None:
    placed, live = await nodes.call_live_on_b(speech_pcm)
    call_sid = live["provider_call_id"]
    try:
        # Long enough for the call's meter to have reported a running cost.
        await asyncio.sleep(HEARTBEAT_INTERVAL_MS / 1_000 + 1)
        nodes.b.proc.kill()
        killed_at = time.monotonic()
        bound_s = (NODE_DEAD_AFTER_MS + 2 * NODE_BEAT_INTERVAL_MS) / 1_000
        ended = await nodes.record_when(call_sid, "ended", timeout_s=bound_s + 5)
        took_s = time.monotonic() - killed_at
    finally:
        placed.cancel()
    # Node A saw node B stop beating and settled its call from its last figures.
    assert ended["end_reason"] == "node_lost"
    assert took_s <= bound_s + 1, f"settled {took_s:.1f} s after the kill"
    assert 0 < (ended["spent"] or 0) <= ended["reserved"]
    assert "node-b" not in await nodes.store.nodes()
    # The books balance to the micro: what the ledger settled is what the day spent,
    # and nothing is left reserved.
    raw = await nodes.store.redis.hmget(
        nodes.store.keys.day(TENANT, ended["day"]), ["spent", "reserved"]
    )
    ledger = await nodes.store.ledger(1_000)
    settled = sum(int(e["amount"]) for e in ledger if e["type"] in ("settle", "reap", "adjust"))
    assert (int(raw[0] or 0), int(raw[1] or 0)) == (settled, 0)
    assert settled == ended["spent"]


async def admin_put(node: Service, path: str, body: dict[str, object]) -> None:
    """``PUT path`` on ``node`` with the admin key; it must succeed."""
    async with httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{node.port}", timeout=10) as api:
        response = await api.put(
            path, json=body, headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
        )
    assert response.status_code == 200, response.text


async def test_a_tenant_cap_the_kill_switch_and_a_limit_change_hold_across_both_nodes(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    # Each node its own public URL here: Twilio calls one number's webhook on node A,
    # another's on node B, and each call's media stays where its webhook went.
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    env = cluster_env(
        prefix,
        token,
        echo_brain.url,
        RUTSTER_DEFAULT_MAX_CONCURRENT="2",
        RUTSTER_ADMIN_KEY=TEST_ADMIN_KEY,
    )
    client = redis_client(suite_redis_url())
    store = SpendStore(client, prefix)
    try:
        with node_processes(env) as (a, b):
            twilio = {
                node.port: TwilioSimulator(f"http://{LOOPBACK}:{node.port}", auth_token=token)
                for node in (a, b)
            }
            first, second = new_sid("CA"), new_sid("CA")
            calls = [
                asyncio.create_task(
                    twilio[a.port].place_call(speech_pcm[: 8 * 16_000], call_sid=first)
                ),
                asyncio.create_task(
                    twilio[b.port].place_call(speech_pcm[: 8 * 16_000], call_sid=second)
                ),
            ]
            try:
                nodes = TwoNodes(a, b, store, token, "")
                on_a = await nodes.record_when(first, "active", timeout_s=10)
                on_b = await nodes.record_when(second, "active", timeout_s=10)
                assert (on_a["node"], on_b["node"]) == ("node-a", "node-b")
                # Two live calls, one on each node: a third is refused on either.
                for node in (a, b, a, b):
                    answer = await twilio[node.port].post_voice_webhook(
                        new_sid("CA"), from_="+15550007777", to="+15559990000"
                    )
                    assert "<Reject" in answer.text, answer.text
                await asyncio.gather(*calls)
            finally:
                for call in calls:
                    call.cancel()
            # Both ended: a new call is admitted again.
            await nodes.record_when(second, "ended", timeout_s=10)
            await nodes.record_when(first, "ended", timeout_s=10)
            answer = await twilio[b.port].post_voice_webhook(
                new_sid("CA"), from_="+15550007777", to="+15559990000"
            )
            assert "<Stream" in answer.text, answer.text
            # The kill switch engaged on one node refuses calls on the other at once;
            # released there, a limit lowered there holds on the first node: both live in
            # Redis, which every admission reads (nothing is cached on a node).
            await admin_put(a, "/v1/admin/kill-switch", {"engaged": True})
            answer = await twilio[b.port].post_voice_webhook(
                new_sid("CA"), from_="+15550007777", to="+15559990000"
            )
            assert "<Reject" in answer.text, answer.text
            await admin_put(b, "/v1/admin/kill-switch", {"engaged": False})
            # The call admitted just above holds one place (its media never comes).
            await admin_put(b, f"/v1/tenants/{TENANT}/limits", {"max_concurrent": 1})
            answer = await twilio[a.port].post_voice_webhook(
                new_sid("CA"), from_="+15550007777", to="+15559990000"
            )
            assert "<Reject" in answer.text, answer.text
        refusals = await store.recent_refusals(10)
        assert [r["reason"] for r in reversed(refusals)] == [
            *["tenant_concurrency"] * 4,
            "kill_switch",
            "tenant_concurrency",
        ]
    finally:
        await client.aclose()
