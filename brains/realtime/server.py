"""The realtime brain's tap server: ``rutster brain realtime [--mock]``.

Listens for the core on ``/realtime`` (default ``ws://127.0.0.1:8082/realtime``,
``RUTSTER_BRAIN_BIND``), opens one OpenAI Realtime session per tap session
(:class:`~brains.realtime.bridge.RealtimeBridge`) and answers the core's
``hello`` with its own ``hello`` and the ``tools.update`` catalog.

With ``--mock`` the same code talks to a MOCK Realtime server instead of OpenAI:
offline, no key. Every log line of such a process says MOCK. The brain does not
start that server itself (brains stand below the shipped tools): the ``rutster``
command (``rutster.tools.cli``) hands it either an already running mock's URL
(``--mock-url``) or a ``mock_upstream`` that starts the shipped one
(``tools/realtime_mock_server.py``) in the brain's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from types import TracebackType
from typing import cast

from openai import AsyncOpenAI
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from rutster.brains.echo import LOG_FORMAT, _package_version
from rutster.brains.realtime.bridge import RESUME_GRACE_S, AuthFailureLatch, RealtimeBridge
from rutster.brains.realtime.config import REALTIME_PATH, RealtimeBrainConfig
from rutster.brains.realtime.log_redaction import install_redaction
from rutster.brains.tap_server import TapListener
from rutster.protocols.tap import (
    BrainEvent,
    BrainHello,
    Bye,
    CoreEvent,
    Direction,
    Hello,
    SessionEnd,
    TapDecoder,
    TapEncoder,
    TapProtocolError,
    ToolsUpdate,
    UnknownTapEvent,
    wire_type,
)

log = logging.getLogger(__name__)

#: Name the brain gives in its ``hello``.
REALTIME_BRAIN_NAME = "realtime"
#: Name in mock mode, so the core's log shows at a glance that no model is behind it.
MOCK_BRAIN_NAME = "realtime-mock"
#: Concurrent sessions one brain process serves; more get close code 1013 (try
#: again later). Seed decision: each session holds an upstream socket and the
#: conversation's audio in flight; operators run more processes for more calls.
MAX_SESSIONS = 200
#: WebSocket close code for "server overloaded, try again later" (RFC 6455 §7.4.1
#: registry: 1013 Try Again Later).
CLOSE_TRY_AGAIN_LATER = 1013

#: A local MOCK upstream the brain runs in its own event loop: entering the context starts
#: the server and yields its ``websocket_base_url`` (``ws://…/v1``), leaving it stops it.
MockUpstream = Callable[[], AbstractAsyncContextManager[str]]


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class _TapLink:
    """The session's current tap connection; re-pointed when the core resumes."""

    def __init__(self, start_ms: float) -> None:
        self.start_ms = start_ms
        self.ws: ServerConnection | None = None
        self.encoder = TapEncoder(start_ms=start_ms)
        self.dropped = 0

    def attach(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.encoder = TapEncoder(start_ms=self.start_ms)  # seq restarts per connection

    async def send(self, event: BrainEvent) -> None:
        ws = self.ws
        if ws is None:
            self.dropped += 1
            return
        try:
            text = self.encoder.encode(event, _now_ms())
        except TapProtocolError as exc:
            log.warning("realtime brain: cannot send %s (%s)", wire_type(event), exc.reason)
            return
        try:
            await ws.send(text)
        except ConnectionClosed:
            self.dropped += 1


class _Session:
    def __init__(self, bridge: RealtimeBridge, link: _TapLink) -> None:
        self.bridge = bridge
        self.link = link
        self.expiry: asyncio.TimerHandle | None = None


class RealtimeBrain:
    """The realtime brain's WebSocket server, startable in-process.

    Counters: ``connections`` accepted, ``sessions_opened``, ``sessions_resumed``,
    ``unknown_events`` and ``bad_messages`` dropped, ``rejected_busy``.
    """

    def __init__(self, config: RealtimeBrainConfig, client: AsyncOpenAI | None = None) -> None:
        install_redaction()
        self.config = config
        self.client = client or AsyncOpenAI(
            api_key=config.api_key, websocket_base_url=config.websocket_base_url
        )
        self.auth_latch = AuthFailureLatch()
        self.sessions: dict[str, _Session] = {}
        self.connections = 0
        self.sessions_opened = 0
        self.sessions_resumed = 0
        self.unknown_events = 0
        self.bad_messages = 0
        self.rejected_busy = 0
        self._listener = TapListener(REALTIME_PATH, self._serve_connection, label="realtime brain")
        self._version = _package_version()
        self._name = MOCK_BRAIN_NAME if config.mock else REALTIME_BRAIN_NAME

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Listen (default: the configured address; port 0 lets the OS pick)."""
        await self._listener.start(
            self.config.host if host is None else host,
            self.config.port if port is None else port,
        )

    @property
    def url(self) -> str:
        """The URL the core dials, e.g. ``ws://127.0.0.1:8082/realtime``."""
        return self._listener.url

    async def stop(self) -> None:
        """Close every session and stop listening (idempotent)."""
        await self._listener.stop()
        for session_id in list(self.sessions):
            await self._end_session(session_id)
        await self.client.close()

    async def __aenter__(self) -> RealtimeBrain:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ---- sessions -----------------------------------------------------------

    async def _end_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        if session.expiry is not None:
            session.expiry.cancel()
        await session.bridge.close()

    def _expire(self, session_id: str) -> None:
        log.info("realtime brain: session %s not resumed; closing it upstream", session_id)
        session = self.sessions.get(session_id)
        if session is not None:
            session.expiry = None
        asyncio.get_running_loop().create_task(self._end_session(session_id))

    async def _open(self, hello: Hello, ws: ServerConnection) -> _Session | None:
        existing = self.sessions.get(hello.session_id)
        if existing is not None and hello.resume:
            if existing.expiry is not None:
                existing.expiry.cancel()
                existing.expiry = None
            existing.link.attach(ws)
            self.sessions_resumed += 1
            log.info("realtime brain: session %s resumed", hello.session_id)
            return existing
        if existing is not None:
            await self._end_session(hello.session_id)  # a fresh hello replaces it
        if len(self.sessions) >= MAX_SESSIONS:
            self.rejected_busy += 1
            log.warning("realtime brain: %d sessions open; refusing another", MAX_SESSIONS)
            await ws.close(CLOSE_TRY_AGAIN_LATER, "brain at capacity")
            return None
        link = _TapLink(_now_ms())
        link.attach(ws)
        bridge = RealtimeBridge(
            hello.session_id,
            self.config,
            self.client,
            send_to_core=link.send,
            auth_latch=self.auth_latch,
        )
        session = _Session(bridge, link)
        self.sessions[hello.session_id] = session
        self.sessions_opened += 1
        log.info(
            "realtime brain%s: session %s %s (call via %s)",
            " (MOCK upstream)" if self.config.mock else "",
            hello.session_id,
            "resumed after a restart" if hello.resume else "started",
            hello.call.provider,
        )
        bridge.start()
        return session

    async def _serve_connection(self, ws: ServerConnection) -> None:
        self.connections += 1
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        session: _Session | None = None
        ended = False
        try:
            async for data in ws:
                try:
                    event = decoder.decode(data)
                except TapProtocolError as exc:
                    self.bad_messages += 1
                    log.warning("realtime brain: dropped bad tap message (%s)", exc.reason)
                    continue
                if isinstance(event, UnknownTapEvent):
                    self.unknown_events += 1
                    log.info("realtime brain: dropped unknown tap event %.64r", event.type)
                elif isinstance(event, Hello):
                    if session is not None:
                        self.bad_messages += 1
                        continue
                    session = await self._open(event, ws)
                    if session is None:
                        return
                    await session.link.send(BrainHello(self._name, self._version))
                    await session.link.send(ToolsUpdate(self.config.tools))
                elif session is None:
                    self.bad_messages += 1  # anything but hello first is a protocol error
                elif isinstance(event, SessionEnd):
                    ended = True
                    log.info(
                        "realtime brain: session %s ended (%s)",
                        session.bridge.session_id,
                        event.reason.value,
                    )
                    await self._end_session(session.bridge.session_id)
                    await session.link.send(Bye("session_end"))
                    await ws.close()
                    return
                else:
                    # The decoder only yields core->brain events in this direction.
                    await session.bridge.on_core_event(cast(CoreEvent, event))
        except ConnectionClosed:
            pass
        finally:
            if session is not None and not ended and session.link.ws is ws:
                session.link.ws = None
                if session.bridge.session_id in self.sessions:
                    session.expiry = asyncio.get_running_loop().call_later(
                        RESUME_GRACE_S, self._expire, session.bridge.session_id
                    )


async def _serve_until_signalled(
    config: RealtimeBrainConfig, mock_upstream: MockUpstream | None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        async with contextlib.AsyncExitStack() as upstream:
            if mock_upstream is not None:
                url = await upstream.enter_async_context(mock_upstream())
                log.warning(
                    "MOCK MODE: no OpenAI; replies come from the local fake Realtime server at %s",
                    url,
                )
                config = replace(config, websocket_base_url=url)
            elif config.mock:
                log.warning(
                    "MOCK MODE: no OpenAI; replies come from the fake Realtime server at %s",
                    config.websocket_base_url,
                )
            brain = RealtimeBrain(config)
            await brain.start()
            log.info(
                "realtime brain listening on %s (model %s, voice %s, tools: %s)%s",
                brain.url,
                config.model,
                config.voice,
                ", ".join(t.name for t in config.tools) or "none",
                " [MOCK]" if config.mock else "",
            )
            gc.collect()
            gc.freeze()  # start-up objects live as long as the process (see gateway/app.py)
            try:
                await stop.wait()
            finally:
                await brain.stop()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
    log.info("realtime brain stopped")


def run_realtime_brain(
    config: RealtimeBrainConfig, *, mock_upstream: MockUpstream | None = None
) -> None:
    """Run the realtime brain until SIGINT or SIGTERM (blocks; main thread only).

    In mock mode the upstream is either ``config.websocket_base_url`` (a mock already
    running) or ``mock_upstream``, started here before the brain listens and stopped
    after it.
    """
    if config.mock and mock_upstream is None and config.websocket_base_url is None:
        raise ValueError("mock mode needs a running mock's URL or a mock_upstream to start")
    if mock_upstream is not None and not config.mock:
        raise ValueError("a mock_upstream is for mock mode only")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    install_redaction()  # before the first connection: handshake headers carry the key
    asyncio.run(_serve_until_signalled(config, mock_upstream))
