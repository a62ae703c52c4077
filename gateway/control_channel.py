"""Control messages to the gateway process that holds a call (Redis pub/sub).

A call's media socket lives in one process; ``DELETE /v1/calls/{id}`` may land
on any other. The call directory in Redis names the owning node, and this
channel carries the request there: ``PUBLISH P:control:{node}`` with a small
JSON message. ``PUBLISH`` answers how many subscribers got it, so the sender
knows at once whether the owner is listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
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
_CALL_ID = re.compile(r"call_[0-9a-f]{1,64}")
_NODE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

#: What runs a message: ``(operation, call_id)``.
ControlHandler = Callable[[str, str], Awaitable[None]]


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

    async def aclose(self) -> None:
        """Close the listener's client (when it is not the shared one)."""
        if self._listener is not self._redis:
            await self._listener.aclose()

    def channel(self, node: str) -> str:
        """The pub/sub channel of ``node``."""
        return f"{self._prefix}:control:{node}"

    async def send(self, node: str, operation: str, call_id: str) -> bool:
        """Ask ``node`` to run ``operation`` on ``call_id``; True if a listener got it."""
        if operation not in OPERATIONS or not _CALL_ID.fullmatch(call_id):
            raise ValueError("unknown operation or malformed call id")
        if not _NODE.fullmatch(node):
            return False
        message = json.dumps({"op": operation, "call": call_id})
        try:
            receivers = await self._redis.publish(self.channel(node), message)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise StoreUnavailable("control publish", exc) from exc
        return int(receivers) > 0

    def parse(self, data: Any) -> tuple[str, str] | None:
        """A received message as ``(operation, call_id)``, or None (counted) if invalid."""
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
        except (ValueError, TypeError, UnicodeDecodeError):
            self.dropped += 1
            log.warning("control channel: dropped a malformed message")
            return None
        return str(operation), call_id

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
                        try:
                            await handler(*parsed)
                        except Exception:  # one bad request must not stop the channel
                            log.exception("control channel: handler failed")
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                await asyncio.sleep(RESUBSCRIBE_DELAY_S)
            finally:
                with contextlib.suppress(Exception):
                    # redis-py < 8 leaves aclose untyped; 8.x annotates it.
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
