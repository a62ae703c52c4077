"""The echo brain: plays the caller's own audio back to them.

The smallest useful brain and the reference for writing one: it listens for
the core's tap connection on ``/echo``, answers ``hello``, returns every
``audio_in`` as an ``audio_out`` with the same PCM, and closes on
``session_end``. Its ``hello`` declares ``interruptible: false`` (its audio is
the caller's own voice, so caller speech must never cut it) and
``turns: "core"``. It runs as its own process (``rutster brain echo`` calls
:func:`run_echo_brain`) or in-process for tests (:class:`EchoBrain`).

Unknown event types and malformed messages are counted and dropped, never a
reason to close (TAP_PROTOCOL.md, forward compatibility). Logs never carry
audio.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from rutster.brains.bind import BRAIN_BIND_ENV, parse_bind
from rutster.brains.tap_server import TapListener
from rutster.protocols.tap import (
    AudioIn,
    AudioOut,
    BrainHello,
    Direction,
    Hello,
    SessionEnd,
    TapDecoder,
    TapEncoder,
    TapEvent,
    TapProtocolError,
    TurnOwner,
    UnknownTapEvent,
    wire_type,
)

#: The path the echo brain serves; every other path gets 404.
ECHO_PATH = "/echo"
#: Name the brain gives in its ``hello``.
ECHO_BRAIN_NAME = "echo"
#: The echo brain's ``hello.interruptible``: caller speech must never cut it,
#: since its audio *is* caller speech (TAP_PROTOCOL.md, "Brains that say what
#: they are": the echo brain and announcements are the examples).
ECHO_INTERRUPTIBLE = False
#: The echo brain's ``hello.turns``: it has no turn logic, the core keeps
#: deciding turns (TAP_PROTOCOL.md; the default, declared explicitly).
ECHO_TURNS = TurnOwner.CORE
#: Default host: loopback only, since a brain sits outside the trust boundary
#: (docs/ARCHITECTURE.md) and must be exposed on purpose (seed decision).
DEFAULT_ECHO_HOST = "127.0.0.1"
#: Default port (seed decision: the gateway's default echo tap URL uses it).
DEFAULT_ECHO_PORT = 8081
#: Version reported when the package metadata is missing (pyproject.toml's).
FALLBACK_VERSION = "0.1.0"
#: Warnings about bad or unknown messages let through per window, brain-wide,
#: so a flood cannot flood the logs (seed decision).
WARNING_BURST = 5
#: Length of that window, in seconds (seed decision).
WARNING_WINDOW_S = 10.0
#: Log format when this module configures logging itself (process entry only).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

logger = logging.getLogger(__name__)


def _package_version() -> str:
    try:
        return version("rutster")
    except PackageNotFoundError:
        return FALLBACK_VERSION


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class _WarningThrottle:
    """Lets ``burst`` warnings through per ``window_s``; counts the others."""

    def __init__(self, burst: int, window_s: float) -> None:
        self._burst = burst
        self._window_s = window_s
        self._window_start = float("-inf")
        self._passed = 0
        self._suppressed = 0

    def allow(self, now_s: float) -> tuple[bool, int]:
        """Whether to log now, and how many were suppressed in the window just closed."""
        closed_suppressed = 0
        if now_s - self._window_start >= self._window_s:
            closed_suppressed = self._suppressed
            self._window_start = now_s
            self._passed = 0
            self._suppressed = 0
        if self._passed < self._burst:
            self._passed += 1
            return True, closed_suppressed
        self._suppressed += 1
        return False, closed_suppressed


class EchoBrain:
    """The echo brain's WebSocket server, startable in-process.

    Counters (read them, don't write them): ``connections`` accepted,
    ``frames_echoed``, ``unknown_events`` dropped, ``bad_messages`` dropped
    (malformed, or audio before ``hello``).
    """

    def __init__(self) -> None:
        self.connections = 0
        self.frames_echoed = 0
        self.unknown_events = 0
        self.bad_messages = 0
        self._listener = TapListener(ECHO_PATH, self._serve_connection, label="echo brain")
        self._version = _package_version()
        self._throttle = _WarningThrottle(WARNING_BURST, WARNING_WINDOW_S)

    async def start(self, host: str = DEFAULT_ECHO_HOST, port: int = 0) -> None:
        """Listen on ``host:port`` (port 0: the OS picks one; see :attr:`url`)."""
        await self._listener.start(host, port)

    @property
    def url(self) -> str:
        """The URL the core dials, e.g. ``ws://127.0.0.1:8081/echo``."""
        return self._listener.url

    async def stop(self) -> None:
        """Close every connection and stop listening (idempotent)."""
        await self._listener.stop()

    async def __aenter__(self) -> EchoBrain:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _warn(self, message: str, *args: object) -> None:
        allowed, suppressed = self._throttle.allow(time.monotonic())
        if suppressed:
            logger.warning("echo brain: %d similar warnings suppressed", suppressed)
        if allowed:
            logger.warning(message, *args)

    async def _serve_connection(self, ws: ServerConnection) -> None:
        self.connections += 1
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        encoder = TapEncoder(start_ms=_now_ms())
        session_id: str | None = None
        try:
            async for data in ws:
                try:
                    event = decoder.decode(data)
                except TapProtocolError as exc:
                    self.bad_messages += 1
                    self._warn("echo brain: dropped bad tap message (%s): %s", exc.reason, exc)
                    continue
                if isinstance(event, UnknownTapEvent):
                    self.unknown_events += 1
                    self._warn("echo brain: dropped unknown tap event %r", event.type)
                elif isinstance(event, AudioIn):
                    if session_id is None:
                        self.bad_messages += 1
                        self._warn("echo brain: dropped audio_in before hello")
                        continue
                    reply = AudioOut(event.pcm, item=f"echo-{session_id}")
                    await self._send(ws, encoder, reply)
                    self.frames_echoed += 1
                elif isinstance(event, Hello):
                    session_id = event.session_id
                    logger.info(
                        "echo brain: session %s %s (call via %s)",
                        session_id,
                        "resumed" if event.resume else "started",
                        event.call.provider,
                    )
                    hello = BrainHello(
                        ECHO_BRAIN_NAME,
                        self._version,
                        interruptible=ECHO_INTERRUPTIBLE,
                        turns=ECHO_TURNS,
                    )
                    await self._send(ws, encoder, hello)
                elif isinstance(event, SessionEnd):
                    logger.info("echo brain: session %s ended (%s)", session_id, event.reason)
                    await ws.close()
                    return
                else:
                    logger.debug("echo brain: ignored %s", wire_type(event))
        except ConnectionClosed as exc:
            logger.debug("echo brain: connection closed (%s)", exc)

    async def _send(self, ws: ServerConnection, encoder: TapEncoder, event: TapEvent) -> None:
        try:
            text = encoder.encode(event, _now_ms())
        except TapProtocolError as exc:  # e.g. an absurdly long session id
            self._warn("echo brain: cannot send %s (%s): %s", wire_type(event), exc.reason, exc)
            return
        try:
            await ws.send(text)
        except ConnectionClosed:
            # The core closed right after its last messages (session_end, then close):
            # the reply is moot, but what it sent before closing is still to be read.
            logger.debug("echo brain: %s not sent: the core closed", wire_type(event))


async def _serve_until_signalled(host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    brain = EchoBrain()
    try:
        await brain.start(host, port)
        logger.info("echo brain listening on %s", brain.url)
        # Start-up objects live as long as the process: keep them out of full GC
        # passes, which otherwise pause every session's echo (see gateway/app.py).
        gc.collect()
        gc.freeze()
        await stop.wait()
    finally:
        await brain.stop()
        for signum in signals:
            loop.remove_signal_handler(signum)
    logger.info("echo brain stopped")


def run_echo_brain(bind: str | None = None) -> None:
    """Run the echo brain until SIGINT or SIGTERM (blocks; main thread only).

    The address comes from ``bind``, else ``RUTSTER_BRAIN_BIND``, else
    127.0.0.1:8081 (forms: see :func:`brains.bind.parse_bind`). Raises
    ``ValueError`` for a bad address and ``OSError`` if it cannot listen.
    Configures logging (INFO) unless the process already did.
    """
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    address = bind if bind is not None else os.environ.get(BRAIN_BIND_ENV)
    host, port = parse_bind(address, default_host=DEFAULT_ECHO_HOST, default_port=DEFAULT_ECHO_PORT)
    asyncio.run(_serve_until_signalled(host, port))
