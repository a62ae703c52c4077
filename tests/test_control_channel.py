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

from rutster.gateway.control_channel import ControlChannel, ControlHandler, ControlOutcome
from rutster.spend.store import redis_client
from tests.conftest import suite_redis_url, unique_prefix

CALL = "call_" + "ab" * 8


@pytest.fixture
async def clients() -> AsyncIterator[tuple[Redis, Redis]]:
    shared = redis_client(suite_redis_url())
    listener = Redis.from_url(suite_redis_url(), decode_responses=True)
    yield shared, listener
    await shared.aclose()
    await listener.aclose()


@contextlib.asynccontextmanager
async def listening(
    channel: ControlChannel, shared: Redis, handler: ControlHandler
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


async def test_the_owner_runs_the_request_and_answers(clients: tuple[Redis, Redis]) -> None:
    shared, listener = clients
    prefix = unique_prefix()
    owner = ControlChannel(shared, prefix, "node-b", listener=listener)
    asker = ControlChannel(shared, prefix, "node-a")
    ran: list[tuple[str, str]] = []

    async def handler(operation: str, call_id: str) -> ControlOutcome:
        ran.append((operation, call_id))
        return ControlOutcome.DONE if call_id == CALL else ControlOutcome.NOT_HERE

    async with listening(owner, shared, handler):
        assert await asker.request("node-b", "hangup", CALL) is ControlOutcome.DONE
        other = "call_" + "cd" * 8
        assert await asker.request("node-b", "hangup", other) is ControlOutcome.NOT_HERE
        # A node nobody listens for: known at once, no wait.
        assert await asker.request("node-c", "hangup", CALL) is ControlOutcome.NO_LISTENER
        assert await asker.request("bad node!", "hangup", CALL) is ControlOutcome.NO_LISTENER
    assert ran == [("hangup", CALL), ("hangup", other)]
    with pytest.raises(ValueError):
        await asker.request("node-b", "reboot", CALL)


async def test_a_failing_or_silent_owner_is_an_outcome_not_a_hang(
    clients: tuple[Redis, Redis],
) -> None:
    shared, listener = clients
    prefix = unique_prefix()
    owner = ControlChannel(shared, prefix, "node-b", listener=listener)
    asker = ControlChannel(shared, prefix, "node-a")
    release = asyncio.Event()

    async def handler(operation: str, call_id: str) -> ControlOutcome:
        if call_id == CALL:
            raise RuntimeError("the owner's hang-up blew up")
        await release.wait()
        return ControlOutcome.DONE

    async with listening(owner, shared, handler):
        assert await asker.request("node-b", "hangup", CALL) is ControlOutcome.FAILED
        slow = "call_" + "ef" * 8
        outcome = await asker.request("node-b", "hangup", slow, timeout_s=0.3)
        assert outcome is ControlOutcome.NO_ANSWER
        # The slow request did not hold up the channel: the next is answered.
        assert await asker.request("node-b", "hangup", CALL) is ControlOutcome.FAILED
        release.set()


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1]",
        json.dumps({"op": "reboot", "call": CALL}),
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
    assert channel.parse(message) == ("hangup", CALL, None)
