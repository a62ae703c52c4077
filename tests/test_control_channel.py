"""The control channel against a real Redis: a request reaches the owning node's
listener, which answers; no listener, a failing or a silent owner, and malformed
messages each have their own outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from rutster.gateway.control_channel import (
    ControlChannel,
    ControlHandler,
    ControlOutcome,
    ControlReply,
    ControlRequest,
)
from rutster.spend.redis_url import RedisClient
from rutster.spend.store import redis_client
from tests.conftest import suite_redis_url, unique_prefix

CALL = "call_" + "ab" * 8


@pytest.fixture
async def clients() -> AsyncIterator[tuple[RedisClient, Redis]]:
    shared = redis_client(suite_redis_url())
    listener = Redis.from_url(suite_redis_url(), decode_responses=True)
    yield shared, listener
    await shared.aclose()
    await listener.aclose()


@contextlib.asynccontextmanager
async def listening(
    channel: ControlChannel, shared: RedisClient, handler: ControlHandler
) -> AsyncIterator[None]:
    task = asyncio.create_task(channel.listen(handler))
    try:
        name = channel.channel(channel.node)
        for _ in range(200):  # subscribed once the channel counts a subscriber
            [(_, subscribers)] = await shared.pubsub_numsub(name)
            if subscribers:
                break
            await asyncio.sleep(0.01)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.aclose()


async def test_the_owner_runs_the_request_and_answers(clients: tuple[RedisClient, Redis]) -> None:
    shared, listener = clients
    prefix = unique_prefix()
    owner = ControlChannel(shared, prefix, "node-b", listener=listener)
    asker = ControlChannel(shared, prefix, "node-a")
    ran: list[ControlRequest] = []

    async def handler(request: ControlRequest) -> ControlReply:
        ran.append(request)
        if request.call_id != CALL:
            return ControlReply(ControlOutcome.NOT_HERE)
        return ControlReply(ControlOutcome.DONE, request.args.get("to", ""))

    async with listening(owner, shared, handler):
        done = await asker.request("node-b", "sip_dial", CALL, args={"to": "sip:a@b"})
        assert done == ControlReply(ControlOutcome.DONE, "sip:a@b")
        other = "call_" + "cd" * 8
        assert (await asker.request("node-b", "hangup", other)).outcome is ControlOutcome.NOT_HERE
        # A node nobody listens for: known at once, no wait.
        for node in ("node-c", "bad node!"):
            missing = await asker.request(node, "hangup", CALL)
            assert missing.outcome is ControlOutcome.NO_LISTENER
    assert ran == [
        ControlRequest("sip_dial", CALL, {"to": "sip:a@b"}),
        ControlRequest("hangup", other, {}),
    ]
    for bad in ("Reboot!", ""):
        with pytest.raises(ValueError):
            await asker.request("node-b", bad, CALL)
    with pytest.raises(ValueError):
        await asker.request("node-b", "hangup", CALL, args={"x": "y" * 5_000})


async def test_a_failing_or_silent_owner_is_an_outcome_not_a_hang(
    clients: tuple[RedisClient, Redis],
) -> None:
    shared, listener = clients
    prefix = unique_prefix()
    owner = ControlChannel(shared, prefix, "node-b", listener=listener)
    asker = ControlChannel(shared, prefix, "node-a")
    release = asyncio.Event()

    async def handler(request: ControlRequest) -> ControlReply:
        if request.call_id == CALL:
            raise RuntimeError("the owner's hang-up blew up")
        await release.wait()
        return ControlReply(ControlOutcome.DONE)

    async with listening(owner, shared, handler):
        assert (await asker.request("node-b", "hangup", CALL)).outcome is ControlOutcome.FAILED
        slow = "call_" + "ef" * 8
        reply = await asker.request("node-b", "hangup", slow, timeout_s=0.3)
        assert reply.outcome is ControlOutcome.NO_ANSWER
        # The slow request did not hold up the channel: the next is answered.
        assert (await asker.request("node-b", "hangup", CALL)).outcome is ControlOutcome.FAILED
        release.set()


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1]",
        json.dumps({"op": "Reboot!", "call": CALL}),
        json.dumps({"op": "hangup", "call": CALL, "args": {"to": 5}}),
        json.dumps({"op": "hangup", "call": CALL, "args": ["x"]}),
        json.dumps({"op": "hangup", "call": "call_XYZ"}),
        json.dumps({"op": "hangup", "call": CALL, "id": "not hex!"}),
        json.dumps({"op": "hangup", "call": CALL, "id": 7}),
        "x" * 5000,
    ],
)
def test_malformed_messages_are_counted_and_dropped(raw: str) -> None:
    channel = ControlChannel(redis_client(suite_redis_url()), "p", "node-b")
    assert channel.parse(raw) is None
    assert channel.dropped == 1


def test_a_message_without_an_id_wants_no_answer() -> None:
    # What a node of the previous version sends during a rolling upgrade.
    channel = ControlChannel(redis_client(suite_redis_url()), "p", "node-b")
    message = json.dumps({"op": "hangup", "call": CALL})
    assert channel.parse(message) == (ControlRequest("hangup", CALL, {}), None)
