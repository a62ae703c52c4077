"""``REDIS_URL=redis+cluster://...``: the spend gate, API keys, rate limits and the
control channel on a Redis Cluster (three masters with a replica each, on loopback
ports: tests/support/redis_cluster.py).

What is shown: every key rutster writes lands in the one slot of its hash-tagged prefix
(so every atomic script and MULTI is legal on a Cluster); the same client keeps
admitting and settling after the master of that slot is killed and its replica
promoted; and two gateway processes on the Cluster hang up each other's calls, before
and after such a failover.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import httpx
import pytest

from rutster.base.env_values import ConfigError
from rutster.brains.echo import EchoBrain
from rutster.gateway.api.api_keys import ApiKeyStore
from rutster.gateway.api.rate_limit import RateLimiter
from rutster.gateway.control_channel import (
    ControlChannel,
    ControlOutcome,
    ControlReply,
    ControlRequest,
)
from rutster.gateway.spend_settings import SpendSettings
from rutster.spend.redis_url import (
    ClusterTarget,
    RedisUrlError,
    cluster_key_prefix,
    parse_cluster_url,
)
from rutster.spend.store import (
    SpendStore,
    redis_client,
    redis_listener,
)
from rutster.tools.launcher import LOOPBACK, gateway_process
from rutster.tools.twilio_simulator import TwilioSimulator, new_sid
from tests.conftest import TEST_ADMIN_KEY, tenant_key, unique_prefix
from tests.support.cluster import TENANT, cluster_env, record_when
from tests.support.failover import admit_after_failover_and_balance, failover_request
from tests.support.redis_cluster import SETTLE_S, LocalRedisCluster, local_redis_cluster
from tests.support.split_proxy import SplitProxy

#: Longer than redis-py's default read timeout of a Cluster connection (5 s).
IDLE_S = 6.0


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    with local_redis_cluster(tmp_path) as cluster:
        yield cluster


@pytest.fixture
async def cluster_store(redis_cluster: LocalRedisCluster) -> AsyncIterator[SpendStore]:
    """A store on the cluster under a fresh hash-tagged prefix (its client closed after)."""
    client = redis_client(redis_cluster.url)
    try:
        yield SpendStore(client, cluster_key_prefix(unique_prefix()))
    finally:
        await client.aclose()


async def balanced(store: SpendStore, tenant: str, day: str) -> tuple[int, int]:
    """(spent, reserved) of ``tenant``'s day."""
    raw = await store.redis.hmget(store.keys.day(tenant, day), ["spent", "reserved"])
    return int(raw[0] or 0), int(raw[1] or 0)


async def test_every_key_lands_in_the_prefix_slot_and_the_books_balance(
    redis_cluster: LocalRedisCluster, cluster_store: SpendStore
) -> None:
    store, client = cluster_store, cluster_store.redis
    prefix = store.keys.prefix
    now = int(time.time() * 1000)
    for index, tenant in enumerate(("acme", "globex", "acme")):
        call_id = f"call_{index}"
        admit = replace(failover_request(call_id, now), tenant=tenant)
        assert (await store.admit(admit)).admitted
        assert (await store.connect(call_id, "node-a", now + 100)).won
        await store.heartbeat(call_id, 1, now + 1_000, 2_000)
        await store.add_receipt(call_id, {"event": "test", "n": index})
        settled = await store.settle(call_id, 2, 3_000 + index, now + 2_000, "caller_hangup")
        assert settled.status == "settled"
    await store.node_beat("node-a", now, {"sip_free": "0"})
    await store.set_kill_switch(False)
    keys = ApiKeyStore(client, prefix)
    issued = await keys.create("acme", now_ms=now)
    assert (await keys.lookup(issued.key)) is not None
    assert (await RateLimiter(client, prefix, 1.0, 2).check(issued.key_hash, now)).allowed
    first = await store.get_call("call_0")
    assert first is not None
    day = first["day"]
    assert await balanced(store, "acme", day) == (3_000 + 3_002, 0)
    assert await balanced(store, "globex", day) == (3_001, 0)
    ledger = await store.ledger(100)
    settled_total = sum(int(e["amount"]) for e in ledger if e["type"] == "settle")
    assert settled_total == 3_000 + 3_001 + 3_002
    # Every key under the prefix is on the one master that serves its slot.
    owner = redis_cluster.master_of(prefix)
    found: dict[int, list[str]] = {}
    for master in redis_cluster.masters:
        with master.client() as node:
            found[master.port] = [
                cast(str, k) for k in node.scan_iter(match=f"{prefix}:*", count=1_000)
            ]
    assert {port for port, keys in found.items() if keys} == {owner.port}
    with owner.client() as node:
        slots = {node.execute_command("CLUSTER", "KEYSLOT", k) for k in found[owner.port]}
    assert len(found[owner.port]) > 20 and len(slots) == 1


async def test_the_store_follows_a_failover_of_the_master_of_its_slot(
    redis_cluster: LocalRedisCluster, cluster_store: SpendStore
) -> None:
    store = cluster_store
    now = int(time.time() * 1000)
    assert (await store.admit(failover_request("call_before", now))).admitted
    owner = redis_cluster.master_of(store.keys.prefix)
    with owner.client() as node:
        # On the replica before the master goes (replication is asynchronous:
        # docs/SPEND.md says what a failover can lose without this).
        assert node.execute_command("WAIT", 1, 5_000) == 1
    redis_cluster.kill(owner)
    await asyncio.to_thread(redis_cluster.wait_ok)
    assert redis_cluster.master_of(store.keys.prefix).port != owner.port
    # The same client: it re-reads the slot map and reaches the promoted replica.
    await admit_after_failover_and_balance(store, now, SETTLE_S)


async def test_the_control_channel_reaches_a_node_on_the_cluster(
    redis_cluster: LocalRedisCluster,
) -> None:
    prefix = cluster_key_prefix(unique_prefix())
    client = redis_client(redis_cluster.url)
    owner = ControlChannel(client, prefix, "node-b", listener=redis_listener(redis_cluster.url))
    asker = ControlChannel(client, prefix, "node-a")

    async def handler(request: ControlRequest) -> ControlReply:
        return ControlReply(ControlOutcome.DONE, request.call_id)

    listening = asyncio.create_task(owner.listen(handler))
    try:
        deadline = time.monotonic() + 10
        while True:
            reply = await asker.request("node-b", "hangup", "call_1", timeout_s=2)
            if reply.outcome is not ControlOutcome.NO_LISTENER:
                break
            assert time.monotonic() < deadline, "the listener never subscribed"
            await asyncio.sleep(0.1)
        assert reply == ControlReply(ControlOutcome.DONE, "call_1")
        # Still served after a quiet spell longer than a Cluster connection's default read
        # timeout (the listener has none; were it to time out, it would resubscribe).
        await asyncio.sleep(IDLE_S)
        reply = await asker.request("node-b", "hangup", "call_2", timeout_s=2)
        assert reply == ControlReply(ControlOutcome.DONE, "call_2")
        # Nobody listens on node-c's channel: said at once, not after a timeout.
        started = time.monotonic()
        reply = await asker.request("node-c", "hangup", "call_1", timeout_s=2)
        assert reply.outcome is ControlOutcome.NO_LISTENER
        assert time.monotonic() - started < 1
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await owner.aclose()
        await client.aclose()


async def hang_up_on_b_through_a(
    a_port: int, public_url: str, token: str, store: SpendStore, pcm: bytes
) -> None:
    """Place a call (media on node B), hang it up through node A's REST API."""
    call_sid = new_sid("CA")
    simulator = TwilioSimulator(public_url, auth_token=token)
    placed = asyncio.create_task(simulator.place_call(pcm, call_sid=call_sid))
    try:
        live = await record_when(store, call_sid, "active", timeout_s=15)
        assert live["node"] == "node-b"
        async with httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{a_port}", timeout=10) as api:
            key = await tenant_key(api, TENANT)
            deadline = time.monotonic() + SETTLE_S
            while True:
                response = await api.delete(
                    f"/v1/calls/{live['id']}", headers={"Authorization": f"Bearer {key}"}
                )
                # 503 while node B's subscription is being moved to the new master.
                if response.status_code != 503 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
        assert response.status_code == 202, response.text
        await asyncio.wait_for(placed, timeout=10)
    finally:
        placed.cancel()
    ended = await record_when(store, call_sid, "ended", timeout_s=10)
    assert ended["end_reason"] == "api_hangup"


async def serving_again(port: int) -> None:
    """Until the node writes to and reads from Redis again: an API key issued (201),
    then the call list read with it (200); 503 meanwhile."""
    admin = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{LOOPBACK}:{port}", timeout=10) as api:
        deadline = time.monotonic() + SETTLE_S
        while True:
            issued = await api.post("/v1/admin/keys", json={"tenant": TENANT}, headers=admin)
            if issued.status_code == 201:
                key = issued.json()["key"]
                listed = await api.get("/v1/calls", headers={"Authorization": f"Bearer {key}"})
                if listed.status_code == 200:
                    return
                issued = listed
            assert issued.status_code == 503, issued.text
            assert time.monotonic() < deadline, "the node never reached the new master"
            await asyncio.sleep(0.2)


async def test_two_gateway_nodes_on_the_cluster_hang_up_each_others_calls(
    redis_cluster: LocalRedisCluster, echo_brain: EchoBrain, speech_pcm: bytes, tmp_path: Path
) -> None:
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    client = redis_client(redis_cluster.url)
    store = SpendStore(client, cluster_key_prefix(prefix))
    try:
        async with SplitProxy(get_port=0, other_port=0).running() as balancer:
            env = cluster_env(
                prefix,
                token,
                echo_brain.url,
                REDIS_URL=redis_cluster.url,
                RUTSTER_PUBLIC_URL=balancer.url,
                RUTSTER_ADMIN_KEY=TEST_ADMIN_KEY,
            )
            with (
                gateway_process(
                    {**env, "RUTSTER_NODE_ID": "node-a"}, stderr_path=str(tmp_path / "a.log")
                ) as a,
                gateway_process(
                    {**env, "RUTSTER_NODE_ID": "node-b"}, stderr_path=str(tmp_path / "b.log")
                ) as b,
            ):
                balancer.get_port, balancer.other_port = b.port, a.port
                await hang_up_on_b_through_a(a.port, balancer.url, token, store, speech_pcm)
                # The master of the slot dies; its replica takes over; both nodes
                # follow, and the next call is hung up across them the same way.
                owner = redis_cluster.master_of(cluster_key_prefix(prefix))
                with owner.client() as node:
                    assert node.execute_command("WAIT", 1, 5_000) == 1
                redis_cluster.kill(owner)
                await asyncio.to_thread(redis_cluster.wait_ok)
                # Each node's client re-reads the slot map after its first errors (at most
                # one refresh a second: redis-py's default); until then its REST API says
                # 503 and calls are refused, the fail-closed policy.
                for node in (a, b):
                    await serving_again(node.port)
                await hang_up_on_b_through_a(a.port, balancer.url, token, store, speech_pcm)
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7001",
            ClusterTarget((("10.0.0.1", 7000), ("10.0.0.2", 7001))),
        ),
        (
            "rediss+cluster://:s3cret@redis.internal",
            ClusterTarget((("redis.internal", 6379),), "s3cret", tls=True),
        ),
    ],
)
def test_cluster_urls_parse(url: str, target: ClusterTarget) -> None:
    assert parse_cluster_url(url) == target
    settings = SpendSettings.from_env({"REDIS_URL": url, "RUTSTER_REDIS_PREFIX": "gw2"})
    assert settings.key_prefix == "{gw2}"


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",  # no node
        "redis+cluster://10.0.0.1:port",
        "redis+cluster://10.0.0.1:7000/2",  # a Cluster has only database 0
    ],
)
def test_bad_cluster_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="REDIS_URL"):
        SpendSettings.from_env({"REDIS_URL": url})
    with pytest.raises(RedisUrlError):
        parse_cluster_url(url)


def test_a_store_on_a_cluster_refuses_a_prefix_without_a_hash_tag() -> None:
    client = redis_client("redis+cluster://127.0.0.1:1")  # connects lazily: never here
    with pytest.raises(ValueError, match="hash tag"):
        SpendStore(client, "rutster")
    assert SpendSettings.from_env({}).key_prefix == "rutster"
