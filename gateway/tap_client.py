"""The core's side of the tap protocol: one reconnecting WebSocket client per call.

The core dials the brain (docs/ARCHITECTURE.md doctrine 3). This module owns the
connection's life: dial, ``hello`` (``resume: true`` after a loss), read brain
events, and reconnect with bounded backoff while the call stays up. Sending
never blocks the caller's media path: when the brain is down or not reading,
messages are dropped and counted rather than queued without bound, but for
the call's opening: the caller's audio from before the brain first answers (at
most :data:`OPENING_AUDIO_FRAMES`) waits, and is sent as soon as it does, so a
caller who speaks on pickup is heard whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import get_args

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from rutster.base.backoff import Backoff
from rutster.gateway.metrics import GatewayMetrics
from rutster.protocols.tap import (
    MAX_MESSAGE_BYTES,
    AudioIn,
    BrainEvent,
    CoreEvent,
    Direction,
    Hello,
    SessionEnd,
    SessionEndReason,
    TapDecoder,
    TapEncoder,
    TapProtocolError,
    UnknownTapEvent,
)

log = logging.getLogger(__name__)

BRAIN_EVENT_TYPES = get_args(BrainEvent)

#: Give up on one dial attempt after this long (the backoff then applies). A
#: brain on the same host or LAN answers in milliseconds; 5 s covers a slow TLS
#: handshake without leaving the caller in silence for long. Seed decision.
TAP_OPEN_TIMEOUT_S = 5.0
#: Outgoing bytes buffered for one brain before sends are dropped: 128 KiB is
#: about 2 s of ``audio_in`` (1.3 KB each at 50/s). Seed decision.
TAP_WRITE_LIMIT_BYTES = 128 * 1024
#: How long ``session_end`` and the closing handshake may take at call end.
TAP_CLOSE_TIMEOUT_S = 2.0
#: Log the first few protocol problems per call at WARNING, then only count
#: them, so a hostile brain cannot flood the logs. Seed decision.
WARN_LOG_LIMIT = 3
#: RFC 6455 close code 1009: message too big.
CLOSE_MESSAGE_TOO_BIG = 1009
#: Caller frames kept from before the brain first answers, sent as soon as it does
#: (500 ms; the oldest beyond are dropped, counted). A brain on the same host
#: answers within a frame or two, one across the internet within a few hundred ms;
#: the caller's first words are not lost meanwhile. Before the inbound resampler
#: was a 2.6 ms filter, soxr's 30 ms of held audio did this by accident for a
#: local brain. Seed decision.
OPENING_AUDIO_FRAMES = 25


class TapClient:
    """Connects one call to its brain and keeps it connected.

    ``make_hello(resume)`` builds the ``hello`` for each connection;
    ``on_event`` receives every valid brain event, in order, on the event loop.
    ``run()`` is the connection task; ``close()`` ends the session.
    """

    def __init__(
        self,
        url: str,
        *,
        make_hello: Callable[[bool], Hello],
        on_event: Callable[[BrainEvent], Awaitable[None]],
        metrics: GatewayMetrics,
        clock_ms: Callable[[], float],
        call_label: str,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = url
        self._make_hello = make_hello
        self._on_event = on_event
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._label = call_label
        self._backoff = backoff or Backoff()
        self._encoder = TapEncoder(start_ms=clock_ms())
        self._conn: ClientConnection | None = None
        self._closing = False
        self._ever_connected = False
        self._warnings = 0
        # Caller frames from before the brain first answered (see OPENING_AUDIO_FRAMES).
        self._opening: deque[bytes] = deque()
        #: Frames of the call's opening sent to the brain once it answered.
        self.opening_frames_sent = 0
        self.connected_event = asyncio.Event()
        #: When the brain was last lost (or the call began), for the grace period.
        self.down_since_ms: float | None = clock_ms()
        self.connections = 0

    @property
    def connected(self) -> bool:
        """True while a brain connection is open and greeted."""
        return self._conn is not None

    # ---- sending (never blocks) ----------------------------------------------

    async def send(self, event: CoreEvent, *, kind: str) -> bool:
        """Send ``event`` now if the brain is connected and reading; else drop and count.

        Returns True when the message was handed to the socket.
        """
        conn = self._conn
        if conn is None:
            self._metrics.tap_send_drops.labels(kind).inc()
            return False
        try:
            text = self._encoder.encode(event, self._clock_ms())
        except TapProtocolError as exc:
            # An event the protocol cannot carry (a frame over the limit) is one
            # dropped message, never an exception in the task that sent it.
            self._metrics.tap_send_drops.labels(kind).inc()
            self._warn("could not send %s (%s): dropped", kind, exc.reason)
            return False
        try:
            # Never past the high-water mark: websockets would then wait in drain().
            if conn.transport.get_write_buffer_size() + len(text) > TAP_WRITE_LIMIT_BYTES:
                self._metrics.tap_send_drops.labels(kind).inc()
                return False
            await conn.send(text)
        except ConnectionClosed:
            self._metrics.tap_send_drops.labels(kind).inc()
            return False
        return True

    async def send_audio_in(self, pcm: bytes) -> bool:
        """Send one 480-sample caller frame (held, before the brain first answers)."""
        if self._conn is None and not self._ever_connected and not self._closing:
            opening = self._opening
            if len(opening) >= OPENING_AUDIO_FRAMES:
                opening.popleft()
                self._metrics.tap_send_drops.labels("audio_in").inc()
            opening.append(pcm)
            return False
        return await self.send(AudioIn(pcm), kind="audio_in")

    # ---- connection life ---------------------------------------------------

    async def run(self) -> None:
        """Dial, greet, read; on loss, back off and redial until ``close()``."""
        while not self._closing:
            try:
                conn = await asyncio.wait_for(
                    connect(
                        self.url,
                        max_size=MAX_MESSAGE_BYTES,
                        # The transport pauses (and send() would wait) only above this,
                        # which send() never reaches: it drops first (see send()).
                        write_limit=TAP_WRITE_LIMIT_BYTES + MAX_MESSAGE_BYTES,
                        open_timeout=None,
                        close_timeout=TAP_CLOSE_TIMEOUT_S,
                        compression=None,  # PCM barely compresses; deflate costs CPU per frame
                    ),
                    TAP_OPEN_TIMEOUT_S,
                )
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                self._metrics.tap_connect_failures.inc()
                delay = self._backoff.next_delay()
                log.info(
                    "call %s: brain %s unreachable (%s); retry in %.2fs",
                    self._label,
                    self.url,
                    type(exc).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if self._closing:
                # close() was called while we were dialling.
                conn.transport.abort()
                break
            try:
                await self._serve(conn)
            except asyncio.CancelledError:
                conn.transport.abort()  # cancelled mid-session: never leak the socket
                raise
            if not self._closing:
                delay = self._backoff.next_delay()
                log.warning(
                    "call %s: brain connection lost; reconnecting in %.2fs", self._label, delay
                )
                await asyncio.sleep(delay)

    async def _serve(self, conn: ClientConnection) -> None:
        resume = self._ever_connected
        try:
            await conn.send(self._encoder.encode(self._make_hello(resume), self._clock_ms()))
        except ConnectionClosed:
            return
        self._conn = conn
        self._ever_connected = True
        opening, self._opening = self._opening, deque()
        for pcm in opening:
            if await self.send(AudioIn(pcm), kind="audio_in"):
                self.opening_frames_sent += 1
                self._metrics.frames_to_brain.inc()
        self._backoff.reset()
        self.connections += 1
        self.down_since_ms = None
        self._metrics.tap_connects.inc()
        if resume:
            self._metrics.tap_reconnects.inc()
        self.connected_event.set()
        log.info("call %s: brain connected (%s, resume=%s)", self._label, self.url, resume)
        decoder = TapDecoder(Direction.BRAIN_TO_CORE)
        try:
            async for message in conn:
                await self._dispatch(decoder, message)
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CLOSE_MESSAGE_TOO_BIG:
                # websockets closed the socket: the brain sent a frame over the limit.
                self._metrics.bad_messages.labels("brain", "too_large").inc()
                self._warn("brain sent a frame over %d bytes: connection closed", MAX_MESSAGE_BYTES)
        finally:
            self._conn = None
            self.connected_event.clear()
            if self.down_since_ms is None:
                self.down_since_ms = self._clock_ms()

    async def _dispatch(self, decoder: TapDecoder, message: str | bytes) -> None:
        try:
            event = decoder.decode(message)
        except TapProtocolError as exc:
            self._metrics.bad_messages.labels("brain", exc.reason).inc()
            self._warn("dropped a bad brain message (%s)", exc.reason)
            return
        if isinstance(event, UnknownTapEvent):
            self._metrics.unknown_events.labels("brain").inc()
            self._warn("dropped a brain event of unknown type %.40r", event.type)
            return
        if not isinstance(event, BRAIN_EVENT_TYPES):  # pragma: no cover - decoder guarantees
            return
        try:
            await self._on_event(event)
        except Exception:
            # A bug in handling one brain message must not take the call down.
            log.exception("call %s: error handling a brain event", self._label)
            self._metrics.bad_messages.labels("brain", "handler_error").inc()

    def _warn(self, fmt: str, *args: object) -> None:
        self._warnings += 1
        level = logging.WARNING if self._warnings <= WARN_LOG_LIMIT else logging.DEBUG
        log.log(level, "call %s: " + fmt, self._label, *args)

    async def close(self, reason: SessionEndReason) -> None:
        """Send ``session_end`` (if connected) and close; stops reconnecting."""
        self._closing = True
        conn = self._conn
        if conn is None:
            log.info("call %s: no brain connection at the end: session_end not sent", self._label)
            return
        sent = False
        try:
            async with asyncio.timeout(TAP_CLOSE_TIMEOUT_S):
                await conn.send(self._encoder.encode(SessionEnd(reason), self._clock_ms()))
                sent = True
                await conn.close()
        except (ConnectionClosed, TimeoutError, OSError) as exc:
            # A brain that does not complete the closing handshake gets its socket cut. Said
            # in the log, so a brain that never saw session_end can be told from one that did.
            what = "closing handshake not completed" if sent else "session_end not sent"
            log.info("call %s: %s (%s): brain socket cut", self._label, what, type(exc).__name__)
            conn.transport.abort()
