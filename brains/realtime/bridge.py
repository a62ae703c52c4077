"""One tap session bridged to one OpenAI Realtime session (the asyncio glue).

The translation itself is :class:`brains.realtime.translator.RealtimeTranslator`
(no I/O); this module owns the two sockets:

- the **tap** side, a websockets server connection from the core. It can drop
  and come back (the core resumes with the same session id), so the bridge
  outlives it for :data:`RESUME_GRACE_S`;
- the **upstream** side, a connection made with the official SDK
  (``AsyncOpenAI().realtime.connect``). When it is lost the core gets
  ``error{brain_upstream_disconnect}`` and the bridge reconnects with bounded
  backoff, opening a fresh session (OpenAI keeps no conversation across
  connections, so the model starts over; the call itself stays up). When the
  key is refused the core gets ``error{brain_auth_failed}`` once and the
  bridge stops trying; :class:`AuthFailureLatch` keeps other sessions from
  hammering the API with the same bad key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openai import AsyncOpenAI, OpenAIError
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from rutster.base.backoff import Backoff
from rutster.brains.realtime.config import RealtimeBrainConfig
from rutster.brains.realtime.translator import (
    AUTH_ERROR_CODES,
    ERROR_AUTH_FAILED,
    ERROR_UPSTREAM_DISCONNECT,
    Actions,
    RealtimeTranslator,
)
from rutster.protocols.tap import AudioIn, BrainError, BrainEvent, CoreEvent

log = logging.getLogger(__name__)

#: Delays between upstream reconnect attempts, then the last one repeated: the
#: openai SDK's own reconnect defaults (initial 0.5 s, doubling, max 8 s).
UPSTREAM_RECONNECT_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
#: After the key is refused, how long every session answers ``brain_auth_failed``
#: without asking OpenAI again: one attempt a minute cannot storm. Seed decision.
AUTH_FAILURE_HOLDOFF_S = 60.0
#: HTTP statuses of a refused WebSocket handshake that mean the key is bad.
AUTH_FAILURE_STATUSES = frozenset({401, 403})
#: How long the upstream session waits for the core to come back after the tap
#: connection drops without ``session_end``: the core retries after 0.25, 0.5,
#: 1, 2 s and then every 5 s (TAP_PROTOCOL.md), so 30 s covers several tries.
RESUME_GRACE_S = 30.0


class AuthFailureLatch:
    """Process-wide memory of a refused key, so N calls don't make N failed logins."""

    def __init__(self, holdoff_s: float = AUTH_FAILURE_HOLDOFF_S) -> None:
        self.holdoff_s = holdoff_s
        self._tripped_at: float | None = None
        self.failures = 0

    def blocked(self, now_s: float) -> bool:
        """True while a recent auth failure says not to try."""
        return self._tripped_at is not None and now_s - self._tripped_at < self.holdoff_s

    def trip(self, now_s: float) -> None:
        """Record an auth failure at ``now_s``."""
        self._tripped_at = now_s
        self.failures += 1


def _closed_for_bad_key(exc: BaseException) -> bool:
    """True if ``exc`` (or its cause) is OpenAI closing the socket over the key.

    The service closes with code 3000 and reason ``invalid_request_error.<code>``
    (e.g. ``invalid_request_error.invalid_api_key``).
    """
    for candidate in (exc, exc.__cause__, exc.__context__):
        if isinstance(candidate, ConnectionClosed) and candidate.rcvd is not None:
            reason = candidate.rcvd.reason
            if any(code in reason for code in AUTH_ERROR_CODES):
                return True
    return False


class RealtimeBridge:
    """The upstream half of one tap session; see the module docstring.

    Counters: ``upstream_connections`` made, ``frames_dropped`` (caller audio
    that arrived while upstream was down).
    """

    def __init__(
        self,
        session_id: str,
        config: RealtimeBrainConfig,
        client: AsyncOpenAI,
        *,
        send_to_core: Callable[[BrainEvent], Awaitable[None]],
        auth_latch: AuthFailureLatch,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_id = session_id
        self.config = config
        self.translator = RealtimeTranslator(config)
        self._client = client
        self._send_to_core = send_to_core
        self._latch = auth_latch
        self._clock_s = clock_s
        self._conn: Any = None  # AsyncRealtimeConnection while upstream is up
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.upstream_connections = 0
        self.frames_dropped = 0
        self.auth_failed = False
        self.upstream_ready = asyncio.Event()

    @property
    def upstream_up(self) -> bool:
        """True while an upstream session is open."""
        return self._conn is not None

    def start(self) -> None:
        """Start the upstream connection task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run_upstream(), name=f"{self.session_id}:openai")

    async def close(self) -> None:
        """Close the upstream session and stop the task (idempotent)."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._close_conn()

    async def on_core_event(self, event: CoreEvent) -> None:
        """Translate one tap event from the core and send the result upstream."""
        conn = self._conn
        if conn is None:
            if isinstance(event, AudioIn):
                self.frames_dropped += 1
            return
        try:
            await self._apply(self.translator.from_core(event))
        except (ConnectionClosed, OpenAIError, OSError):
            # The upstream task sees the same loss on its next read and reconnects.
            if isinstance(event, AudioIn):
                self.frames_dropped += 1

    # ---- upstream -----------------------------------------------------------

    async def _run_upstream(self) -> None:
        backoff = Backoff(UPSTREAM_RECONNECT_DELAYS_S)
        while not self._closing:
            if self._latch.blocked(self._clock_s()):
                await self._auth_failed("OpenAI refused the API key recently; not retrying yet")
                return
            reason: str | None
            try:
                conn = await self._client.realtime.connect(model=self.config.model).enter()
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in AUTH_FAILURE_STATUSES:
                    self._latch.trip(self._clock_s())
                    await self._auth_failed(f"OpenAI refused the API key (HTTP {status})")
                    return
                reason = f"OpenAI Realtime refused the connection (HTTP {status})"
            except (OSError, InvalidHandshake, OpenAIError, TimeoutError) as exc:
                reason = f"cannot reach OpenAI Realtime ({type(exc).__name__})"
            else:
                self.upstream_connections += 1
                reason = await self._pump(conn, backoff)
                if reason is None:  # auth failure inside the session, or closing
                    return
            if self._closing:
                return
            delay = backoff.next_delay()
            log.warning(
                "realtime brain: session %s upstream lost (%s); reconnecting in %.1f s",
                self.session_id,
                reason,
                delay,
            )
            await self._send_to_core(
                BrainError(ERROR_UPSTREAM_DISCONNECT, f"{reason}; reconnecting in {delay:.1f} s")
            )
            await asyncio.sleep(delay)

    async def _pump(self, conn: Any, backoff: Backoff) -> str | None:
        """Run one upstream session; return why it ended, or None to stop for good."""
        self._conn = conn
        try:
            await self._apply(self.translator.open_session())
            self.upstream_ready.set()
            log.info(
                "realtime brain: session %s connected upstream (%s)",
                self.session_id,
                "mock" if self.config.mock else self.config.model,
            )
            while True:
                raw = await conn.recv_bytes()
                backoff.reset()  # a session that delivers events is a success
                try:
                    event = json.loads(raw)
                except ValueError:
                    self.translator.bad_openai_events += 1
                    continue
                if not isinstance(event, dict):
                    self.translator.bad_openai_events += 1
                    continue
                actions = self.translator.from_openai(event)
                await self._apply(actions)
                if any(
                    isinstance(e, BrainError) and e.code == ERROR_AUTH_FAILED
                    for e in actions.to_core
                ):
                    self._latch.trip(self._clock_s())
                    self.auth_failed = True
                    return None
        except (ConnectionClosed, OpenAIError, OSError) as exc:
            if _closed_for_bad_key(exc):
                # OpenAI accepts the upgrade, sends error{invalid_api_key} and closes
                # with 3000; a send can hit the close before that event is read.
                self._latch.trip(self._clock_s())
                await self._auth_failed("OpenAI refused the API key (closed the session)")
                return None
            return f"connection closed ({type(exc).__name__})"
        finally:
            self.upstream_ready.clear()
            await self._close_conn()

    async def _apply(self, actions: Actions) -> None:
        conn = self._conn
        if conn is not None:
            for event in actions.to_openai:
                await conn.send(event)
        for tap_event in actions.to_core:
            await self._send_to_core(tap_event)

    async def _auth_failed(self, message: str) -> None:
        self.auth_failed = True
        log.error("realtime brain: session %s: %s", self.session_id, message)
        await self._send_to_core(BrainError(ERROR_AUTH_FAILED, message))

    async def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(ConnectionClosed, OpenAIError, OSError):
                await conn.close()
