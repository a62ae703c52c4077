"""Control messages to the gateway process that holds a call (Redis pub/sub + a reply key).

A call's media socket lives in one process; ``DELETE /v1/calls/{id}`` may land
on any other. The call directory in Redis names the owning node, and this
channel carries the request there and its answer back:

1. the requester ``PUBLISH``es ``P:control:{node}`` a small JSON message with a
   fresh request id (``PUBLISH`` answers how many subscribers got it, so a node
   that is not listening is known at once);
2. the owner runs it and ``SET``s ``P:control_reply:{id}`` to its reply (the
   outcome, ``done``, ``not_here`` or ``failed``, and a value, as JSON), kept
   :data:`REPLY_TTL_MS`;
3. the requester reads that key until the answer comes or
   :data:`REPLY_TIMEOUT_S` passes (``no_answer``).

The reply is read by polling, not ``BLPOP``: the shared client's socket timeout
(spend/store.py ``REDIS_SOCKET_TIMEOUT_S``, 0.5 s) is shorter than the wait, and
control requests are rare (an API hang-up), so a 20 ms poll costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster

from rutster.spend.redis_url import REDIS_UNAVAILABLE_ERRORS, RedisClient
from rutster.spend.store import StoreUnavailable

log = logging.getLogger(__name__)

#: Largest control message accepted: a hang-up is a few dozen bytes; a SIP dial
#: carries the brain URL (up to 2 KiB, gateway/tap_allowlist.py) and the call context.
MAX_MESSAGE_BYTES = 8 * 1024
#: Most arguments one request carries, and the longest value of one (a reply's too).
MAX_ARGS = 16
MAX_VALUE_CHARS = 4 * 1024
#: The hang-up every node answers (gateway/app.py); providers add their own
#: operations (``GatewayState.control_handlers``).
OPERATION_HANGUP = "hangup"
#: Wait between attempts to (re)subscribe while Redis is away. Seed decision.
RESUBSCRIBE_DELAY_S = 1.0
#: How long a requester waits for the owner's answer. Seed decision: a hang-up on the
#: owner takes milliseconds (tap close, edge close, a REST hang-up of ~100 ms); 5 s
#: covers a loaded node and a slow provider API.
REPLY_TIMEOUT_S = 5.0
#: How often the requester looks for the answer (see the module docstring).
REPLY_POLL_S = 0.02
#: How long an answer is kept: long past any requester's wait, then gone by itself.
REPLY_TTL_MS = 60_000
_CALL_ID = re.compile(r"call_[0-9a-f]{1,64}")
_NODE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_REQUEST_ID = re.compile(r"[0-9a-f]{16,64}")
_OPERATION = re.compile(r"[a-z][a-z0-9_]{0,31}")
_ARG_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


class ControlOutcome(enum.StrEnum):
    """What became of a control request."""

    #: The owner ran it.
    DONE = "done"
    #: The node holds no such call (it ended, or it is held elsewhere).
    NOT_HERE = "not_here"
    #: The owner tried and failed.
    FAILED = "failed"
    #: Nobody listens on the node's channel (the node is gone).
    NO_LISTENER = "no_listener"
    #: A listener got it but no answer came within the timeout.
    NO_ANSWER = "no_answer"


#: Outcomes an owner may answer with.
_ANSWERS = frozenset({ControlOutcome.DONE, ControlOutcome.NOT_HERE, ControlOutcome.FAILED})


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """One request to this node: an operation on a call, with string arguments."""

    operation: str
    call_id: str
    args: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ControlReply:
    """The owner's answer: its outcome and a value (e.g. a provider call id)."""

    outcome: ControlOutcome
    value: str = ""


#: What runs a request on the node it was sent to.
ControlHandler = Callable[[ControlRequest], Awaitable[ControlReply]]


def _check_args(args: Mapping[str, str]) -> None:
    if len(args) > MAX_ARGS:
        raise ValueError("too many arguments")
    for name, value in args.items():
        if not isinstance(name, str) or not _ARG_NAME.fullmatch(name):
            raise ValueError("bad argument name")
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
            raise ValueError("bad argument value")


class ControlChannel:
    """Publish to another node; listen on this node's own channel."""

    def __init__(
        self, redis: RedisClient, prefix: str, node: str, *, listener: RedisClient | None = None
    ) -> None:
        """``listener``: a client without a read timeout for the subscription (a
        subscriber waits indefinitely for the next message); defaults to ``redis``."""
        if not _NODE.fullmatch(node):
            raise ValueError("node ids are 1..128 letters, digits and _.:-")
        self._redis = redis
        self._listener = listener if listener is not None else redis
        self._prefix = prefix
        self.node = node
        #: Messages received that were not valid (counted, dropped).
        self.dropped = 0
        #: Requests being run (kept referenced until they finish).
        self._running: set[asyncio.Task[None]] = set()

    async def _answer(
        self, handler: ControlHandler, request: ControlRequest, request_id: str | None
    ) -> None:
        """Run one request and leave the reply where the requester looks."""
        try:
            reply = await handler(request)
        except Exception:  # one bad request must not stop the channel
            log.exception("control channel: handler failed")
            reply = ControlReply(ControlOutcome.FAILED)
        if request_id is None:
            return
        body = json.dumps({"outcome": reply.outcome.value, "value": reply.value[:MAX_VALUE_CHARS]})
        try:
            await self._redis.set(self.reply_key(request_id), body, px=REPLY_TTL_MS)
        except REDIS_UNAVAILABLE_ERRORS:
            log.warning("control channel: could not answer request %s (Redis)", request_id)

    async def aclose(self) -> None:
        """Stop the requests still running (the app is stopping) and close the
        listener's client (when it is not the shared one)."""
        running = list(self._running)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=1.0)
        if self._listener is not self._redis:
            await self._listener.aclose()

    def channel(self, node: str) -> str:
        """The pub/sub channel of ``node``."""
        return f"{self._prefix}:control:{node}"

    def reply_key(self, request_id: str) -> str:
        """Where the owner puts its answer to request ``request_id``."""
        return f"{self._prefix}:control_reply:{request_id}"

    async def request(
        self,
        node: str,
        operation: str,
        call_id: str,
        *,
        args: Mapping[str, str] | None = None,
        timeout_s: float = REPLY_TIMEOUT_S,
    ) -> ControlReply:
        """Ask ``node`` to run ``operation`` on ``call_id`` and wait for its reply.

        Raises ``ValueError`` for a malformed request, :class:`StoreUnavailable` when
        Redis cannot be reached.
        """
        args = dict(args or {})
        if not _OPERATION.fullmatch(operation) or not _CALL_ID.fullmatch(call_id):
            raise ValueError("malformed operation or call id")
        _check_args(args)
        if not _NODE.fullmatch(node):
            return ControlReply(ControlOutcome.NO_LISTENER)
        request_id = secrets.token_hex(8)
        message = json.dumps({"op": operation, "call": call_id, "id": request_id, "args": args})
        if len(message.encode()) > MAX_MESSAGE_BYTES:
            raise ValueError("control message too large")
        key = self.reply_key(request_id)
        try:
            receivers = await self._publish(self.channel(node), message)
            if not receivers:
                return ControlReply(ControlOutcome.NO_LISTENER)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while True:
                answer = await self._redis.get(key)
                if answer is not None:
                    return _parse_reply(answer)
                if loop.time() >= deadline:
                    return ControlReply(ControlOutcome.NO_ANSWER)
                await asyncio.sleep(REPLY_POLL_S)
        except REDIS_UNAVAILABLE_ERRORS as exc:
            raise StoreUnavailable("control request", exc) from exc

    async def _publish(self, channel: str, message: str) -> int:
        """Publish; the count is of the subscribers of the node that got the message.

        On a Cluster every node relays a message to its own subscribers, but counts only
        those: publish on the node the subscriber chose, the master of the channel's
        slot (redis-py's ClusterPubSub), so that "nobody listens" means what it says.
        """
        if isinstance(self._redis, RedisCluster):
            await self._redis.initialize()  # the slot map, once (a no-op afterwards)
            owner = self._redis.get_node_from_key(channel)
            return int(await self._redis.publish(channel, message, target_nodes=owner))
        return int(await self._redis.publish(channel, message))

    def parse(self, data: Any) -> tuple[ControlRequest, str | None] | None:
        """A received message as ``(request, request_id)``, or None (counted) if
        invalid. ``request_id`` is None for a message that wants no answer (sent by a
        node of an older version, during a rolling upgrade)."""
        try:
            raw = data.encode() if isinstance(data, str) else bytes(data)
            if len(raw) > MAX_MESSAGE_BYTES:
                raise ValueError("oversized")
            message = json.loads(raw)
            if not isinstance(message, Mapping):
                raise ValueError("not an object")
            operation, call_id = message.get("op"), message.get("call")
            if not isinstance(operation, str) or not _OPERATION.fullmatch(operation):
                raise ValueError("bad operation")
            if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
                raise ValueError("bad call id")
            request_id = message.get("id")
            if request_id is not None and (
                not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id)
            ):
                raise ValueError("bad request id")
            args = message.get("args", {})
            if not isinstance(args, Mapping):
                raise ValueError("bad arguments")
            _check_args(args)
        except (ValueError, TypeError, UnicodeDecodeError):
            self.dropped += 1
            log.warning("control channel: dropped a malformed message")
            return None
        return ControlRequest(operation, call_id, dict(args)), request_id

    async def listen(self, handler: ControlHandler) -> None:
        """Forever: run every valid message sent to this node (resubscribes after outages)."""
        while True:
            pubsub = self._listener.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel(self.node))
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    parsed = self.parse(message.get("data"))
                    if parsed is not None:
                        # One request at a time would let a slow hang-up hold up the next.
                        task = asyncio.create_task(self._answer(handler, *parsed))
                        self._running.add(task)
                        task.add_done_callback(self._running.discard)
            except REDIS_UNAVAILABLE_ERRORS:
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)
                if isinstance(self._listener, RedisCluster):
                    # The subscriber's node may have failed over; this client sends no
                    # commands that would tell it, so re-read the slot map before the
                    # next subscription picks the channel's node from it.
                    with contextlib.suppress(*REDIS_UNAVAILABLE_ERRORS):
                        await self._listener.nodes_manager.initialize()
            finally:
                with contextlib.suppress(Exception):
                    # redis-py < 8 leaves aclose untyped; 8.x annotates it.
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]


def _parse_reply(answer: str | bytes) -> ControlReply:
    """A reply as the owner wrote it; a malformed one counts as a failure."""
    try:
        body = json.loads(answer)
        outcome = ControlOutcome(body["outcome"])
        value = body.get("value", "")
        if outcome not in _ANSWERS or not isinstance(value, str):
            raise ValueError("bad reply")
    except (ValueError, TypeError, KeyError):
        return ControlReply(ControlOutcome.FAILED)
    return ControlReply(outcome, value)
