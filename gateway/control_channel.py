"""Control messages to the gateway process that holds a call (Redis pub/sub + a reply key).

A call's media socket lives in one process; ``DELETE /v1/calls/{id}`` may land
on any other. The call directory in Redis names the owning node, and this
channel carries the request there and its answer back:

1. the requester ``PUBLISH``es ``P:control:{node}`` a small JSON message with a
   fresh request id (``PUBLISH`` answers how many subscribers got it, so a node
   that is not listening is known at once);
2. the owner runs it and ``SET``s ``P:control_reply:{id}`` to the outcome
   (``done``, ``not_here``, ``failed``), kept :data:`REPLY_TTL_MS`;
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
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from rutster.spend.store import StoreUnavailable

log = logging.getLogger(__name__)

#: Largest control message accepted (they are a few dozen bytes).
MAX_MESSAGE_BYTES = 1024
#: Operations a control message may ask for.
OPERATIONS = frozenset({"hangup"})
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

#: What runs a message: ``(operation, call_id)`` to its outcome.
ControlHandler = Callable[[str, str], Awaitable[ControlOutcome]]


class ControlChannel:
    """Publish to another node; listen on this node's own channel."""

    def __init__(
        self, redis: Redis, prefix: str, node: str, *, listener: Redis | None = None
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
        self, handler: ControlHandler, operation: str, call_id: str, request_id: str | None
    ) -> None:
        """Run one request and leave its outcome where the requester looks."""
        try:
            outcome = await handler(operation, call_id)
        except Exception:  # one bad request must not stop the channel
            log.exception("control channel: handler failed")
            outcome = ControlOutcome.FAILED
        if request_id is None:
            return
        try:
            await self._redis.set(self.reply_key(request_id), outcome.value, px=REPLY_TTL_MS)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
            log.warning("control channel: could not answer request %s (Redis)", request_id)

    async def aclose(self) -> None:
        """Close the listener's client (when it is not the shared one)."""
        if self._listener is not self._redis:
            await self._listener.aclose()

    def channel(self, node: str) -> str:
        """The pub/sub channel of ``node``."""
        return f"{self._prefix}:control:{node}"

    def reply_key(self, request_id: str) -> str:
        """Where the owner puts its answer to request ``request_id``."""
        return f"{self._prefix}:control_reply:{request_id}"

    async def request(
        self, node: str, operation: str, call_id: str, *, timeout_s: float = REPLY_TIMEOUT_S
    ) -> ControlOutcome:
        """Ask ``node`` to run ``operation`` on ``call_id`` and wait for its answer.

        Raises :class:`StoreUnavailable` when Redis cannot be reached.
        """
        if operation not in OPERATIONS or not _CALL_ID.fullmatch(call_id):
            raise ValueError("unknown operation or malformed call id")
        if not _NODE.fullmatch(node):
            return ControlOutcome.NO_LISTENER
        request_id = secrets.token_hex(8)
        message = json.dumps({"op": operation, "call": call_id, "id": request_id})
        key = self.reply_key(request_id)
        try:
            receivers = await self._redis.publish(self.channel(node), message)
            if not int(receivers):
                return ControlOutcome.NO_LISTENER
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while True:
                answer = await self._redis.get(key)
                if answer in _ANSWERS:
                    return ControlOutcome(answer)
                if loop.time() >= deadline:
                    return ControlOutcome.NO_ANSWER
                await asyncio.sleep(REPLY_POLL_S)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise StoreUnavailable("control request", exc) from exc

    def parse(self, data: Any) -> tuple[str, str, str | None] | None:
        """A received message as ``(operation, call_id, request_id)``, or None (counted)
        if invalid. ``request_id`` is None for a message that wants no answer (sent by
        a node of an older version, during a rolling upgrade)."""
        try:
            raw = data.encode() if isinstance(data, str) else bytes(data)
            if len(raw) > MAX_MESSAGE_BYTES:
                raise ValueError("oversized")
            message = json.loads(raw)
            if not isinstance(message, Mapping):
                raise ValueError("not an object")
            operation, call_id = message.get("op"), message.get("call")
            if operation not in OPERATIONS or not isinstance(call_id, str):
                raise ValueError("unknown operation")
            if not _CALL_ID.fullmatch(call_id):
                raise ValueError("bad call id")
            request_id = message.get("id")
            if request_id is not None and (
                not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id)
            ):
                raise ValueError("bad request id")
        except (ValueError, TypeError, UnicodeDecodeError):
            self.dropped += 1
            log.warning("control channel: dropped a malformed message")
            return None
        return str(operation), call_id, request_id

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
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)
            finally:
                with contextlib.suppress(Exception):
                    # redis-py < 8 leaves aclose untyped; 8.x annotates it.
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
