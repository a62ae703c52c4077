"""The one media-socket handler every provider's stream runs on: :func:`serve_media_socket`.

Twilio's ``/twilio/stream`` and the SIP workers' ``/sip/stream`` speak
different message formats (each provider's :class:`~gateway.ingress_provider.MediaLeg`
brings its sans-I/O codec) but are served the same way: authorise the upgrade,
count and drop bad frames, refuse the socket on a fatal one, wait a bounded
time for ``start``, and trust nothing until the stream token binds the call
id, the brain URL and the admission context, has not expired, and wins its
one-time claim (gateway/stream_claims.py); then run the metered call
(gateway/media_session.py). ``source`` is the metrics label: the provider's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from rutster.base.stream_token import StreamTokenSigner, TokenStatus
from rutster.base.ws_close import (
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_NORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_SERVICE_RESTART,
)
from rutster.gateway.call import Call
from rutster.gateway.ingress_provider import IngressProvider
from rutster.gateway.media_session import REASON_CALL_ENDED, StreamEnded, run_metered_call
from rutster.gateway.spend_context import BadSpendContext, SpendContext
from rutster.gateway.state import GatewayState
from rutster.gateway.stream_claims import ClaimOutcome
from rutster.protocols.ingress import (
    IngressEvent,
    IngressProtocolError,
    StreamStarted,
    StreamStopped,
    UnknownIngressEvent,
)
from rutster.protocols.tap import SessionEndReason
from rutster.spend.gate import wall_ms
from rutster.spend.store import ConnectResult, StoreUnavailable

log = logging.getLogger(__name__)

#: Time allowed between accepting a media socket and its ``start``: providers send it
#: at once (Twilio: ``connected`` then ``start``); 10 s bounds idle sockets.
START_TIMEOUT_S = 10.0

#: The auto-detecting media endpoint's metrics label (before it knows the provider).
AUTODETECT_SOURCE = "autodetect"
#: Close reasons (1008) of refused media sockets, as the provider's logs will show them.
REASON_UNRECOGNISED_STREAM = "first message is no known provider's stream"
REASON_INVALID_TOKEN = "invalid stream token"
REASON_EXPIRED_TOKEN = "stream token expired"
REASON_TOKEN_REPLAYED = "stream token already used"
#: Call-record statuses (spend/store.py CALL_STATUSES) of a call no socket may start:
#: it was settled (ended) or never admitted (refused).
_FINISHED_STATUSES = frozenset({"ended", "refused"})
#: Status of a call whose media already started (on some node): a second socket is a replay.
_STARTED_STATUS = "active"

Frame = str | bytes
#: A codec's ``receive``: one frame in, one event (or provider-specific message) out.
Decode = Callable[[Any], Any]  # str-only codecs (Twilio) are read with binary=False


@dataclass(frozen=True, slots=True)
class TrustedStream:
    """A media socket whose stream token checked out: its call's admission context, and
    whether this node made the call active in the store (False: no store, a fail-open
    admission not yet there, or Redis unreachable)."""

    context: SpendContext
    connected: bool


@dataclass(frozen=True, slots=True)
class SocketClosed:
    """The media socket closed, with this close code."""

    code: int


async def serve_media_socket(
    websocket: WebSocket, provider: IngressProvider, *, first_frame: Frame | None = None
) -> None:
    """Serve one media socket of ``provider``: from the upgrade to the call's settlement.

    ``first_frame``: the socket was already accepted and this frame read from it (by
    :func:`serve_detected_media_socket`); it is decoded first.
    """
    state: GatewayState = websocket.app.state.gateway
    source = provider.name
    refusal = provider.authorize_media(websocket, state)
    if refusal is not None:
        await refuse(websocket, CLOSE_POLICY_VIOLATION, refusal)
        return
    replay: list[Frame] = []
    if first_frame is None:
        await websocket.accept()
    else:
        replay.append(first_frame)
    leg = provider.open_leg(websocket, state)
    started = await await_start(
        websocket, state, source, leg.decode, binary=leg.binary_frames, replay=replay
    )
    if started is None:
        return
    params = provider.stream_params(started, state)
    trusted = await trusted_context(
        websocket,
        state,
        source,
        call_id=started.call.call_id,
        tap_url=params.tap_url,
        spend_text=params.spend_text,
        token=params.token,
    )
    if trusted is None:
        return
    context = trusted.context
    live: list[Call] = []  # the call, once run_metered_call has built it

    async def next_event() -> IngressEvent | StreamEnded:
        while True:
            message = await read_event(
                websocket,
                state,
                source,
                leg.decode,
                binary=leg.binary_frames,
                on_fatal=leg.edge.close,
            )
            if isinstance(message, StreamEnded):
                leg.stream_ended()
                return message
            if isinstance(message, IngressEvent):
                return message
            ended = await leg.on_message(message, live[0] if live else None)
            if ended is not None:
                return ended

    leg.attach(context)
    try:
        await run_metered_call(
            state,
            started=started,
            context=context,
            tap_url=params.tap_url,
            edge=leg.edge,
            provider=source,
            call_control=leg.call_control,
            next_event=next_event,
            on_call=live.append,
            connected=trusted.connected,
        )
    finally:
        leg.detach(context)


async def serve_detected_media_socket(
    websocket: WebSocket, detect: Callable[[Frame], IngressProvider | None]
) -> None:
    """The one media URL for every provider: ``detect`` (``ProviderRegistry.detect``)
    tells from the first frame whose socket this is, then that provider serves it as
    on its own path, its authentication included. A first frame ``detect`` gives no
    provider for is refused with :data:`REASON_UNRECOGNISED_STREAM`."""
    state: GatewayState = websocket.app.state.gateway
    await websocket.accept()
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            frame = await receive_frame(websocket, state, AUTODETECT_SOURCE, binary=True)
    except TimeoutError:
        state.metrics.bad_messages.labels(AUTODETECT_SOURCE, "no_start").inc()
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "no first message")
        return
    if isinstance(frame, SocketClosed):
        return
    provider = detect(frame)
    if provider is None:
        state.metrics.bad_messages.labels(AUTODETECT_SOURCE, "unrecognised").inc()
        log.warning("media socket refused: its first frame is no provider's stream")
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_UNRECOGNISED_STREAM)
        return
    await serve_media_socket(websocket, provider, first_frame=frame)


async def refuse(websocket: WebSocket, code: int, reason: str) -> None:
    """Close a media socket we will not serve (already-gone sockets are fine)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.close(code, reason)


def closed_reason(code: int) -> SessionEndReason:
    """Why a call ends when its media socket closed with ``code``."""
    return (
        SessionEndReason.SHUTDOWN
        if code == CLOSE_SERVICE_RESTART
        else (SessionEndReason.CALLER_HANGUP)
    )


async def receive_frame(
    websocket: WebSocket,
    state: GatewayState,
    source: str,
    *,
    binary: bool,
    replay: list[Frame] | None = None,
) -> Frame | SocketClosed:
    """Next frame, or ``SocketClosed``. Binary frames are counted and skipped unless
    ``binary`` (the SIP media contract carries audio in binary frames). Frames in
    ``replay`` (already read by auto-detection) come first, and are taken out of it."""
    if replay:
        frame = replay.pop(0)
        if binary or isinstance(frame, str):
            return frame
        state.metrics.bad_messages.labels(source, "binary_frame").inc()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            code = int(message.get("code", CLOSE_NORMAL))
            if code == CLOSE_MESSAGE_TOO_BIG:
                # uvicorn refused a frame over MAX_WS_MESSAGE_BYTES and closed the socket.
                state.metrics.bad_messages.labels(source, "frame_too_large").inc()
                log.warning("media socket closed: a frame exceeded the WebSocket size limit")
            return SocketClosed(code)
        text = message.get("text")
        if text is not None:
            return str(text)
        data = message.get("bytes")
        if binary and data is not None:
            return bytes(data)
        state.metrics.bad_messages.labels(source, "binary_frame").inc()


async def read_event(
    websocket: WebSocket,
    state: GatewayState,
    source: str,
    decode: Decode,
    *,
    binary: bool,
    on_fatal: Callable[[str], Awaitable[None]],
    replay: list[Frame] | None = None,
) -> Any:
    """The next decoded message, or ``StreamEnded`` when the socket closed or broke the
    protocol (``on_fatal(reason)`` closes it). Unknown and bad messages are counted and
    dropped."""
    metrics = state.metrics
    while True:
        frame = await receive_frame(websocket, state, source, binary=binary, replay=replay)
        if isinstance(frame, SocketClosed):
            return StreamEnded(closed_reason(frame.code))
        try:
            return decode(frame)
        except UnknownIngressEvent as exc:
            metrics.unknown_events.labels(source).inc()
            log.debug("%s media: unknown event %.40r", source, exc.event_type)
        except IngressProtocolError as exc:
            metrics.bad_messages.labels(source, exc.reason).inc()
            if exc.fatal:
                log.warning("%s media: closing the socket: %s", source, exc)
                await on_fatal(exc.reason)
                return StreamEnded(SessionEndReason.ERROR)
            log.debug("%s media: dropped a message: %s", source, exc)


async def await_start(
    websocket: WebSocket,
    state: GatewayState,
    source: str,
    decode: Decode,
    *,
    binary: bool,
    replay: list[Frame] | None = None,
) -> StreamStarted | None:
    """Read up to ``start``; None (socket closed) on timeout, close, ``stop`` or a fatal error."""

    async def fatal(reason: str) -> None:
        # Nothing before a valid start is authenticated: a malformed one is a
        # failure to present the stream token, refused as policy (1008, RFC 6455
        # §7.4.1), as the README promises for every such failure.
        await refuse(websocket, CLOSE_POLICY_VIOLATION, reason)

    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                event = await read_event(
                    websocket, state, source, decode, binary=binary, on_fatal=fatal, replay=replay
                )
                if isinstance(event, StreamEnded):
                    return None
                if isinstance(event, StreamStarted):
                    return event
                if isinstance(event, StreamStopped):
                    await refuse(websocket, CLOSE_NORMAL, "stopped before start")
                    return None
    except TimeoutError:
        state.metrics.bad_messages.labels(source, "no_start").inc()
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "no start message")
        return None


async def trusted_context(
    websocket: WebSocket,
    state: GatewayState,
    source: str,
    *,
    call_id: str,
    tap_url: str,
    spend_text: str,
    token: str | None,
) -> TrustedStream | None:
    """The call's admission context once the stream token proves it; else refuse the socket.

    The token must be authentic, unexpired and unused: this socket claims it, so any
    other socket with the same token (here or on another node) is refused without
    touching the call this one runs. A call whose record says it already ended is
    not started again either. The call is made active on this node here, atomically
    (``SpendStore.connect``).
    """
    config = state.config
    metrics = state.metrics
    verdict = StreamTokenSigner(config.stream_secret).check(token, call_id, tap_url, spend_text)
    if verdict.status is TokenStatus.EXPIRED:
        metrics.stream_token_failures.inc()
        log.warning("%s media socket refused: expired stream token", source)
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_EXPIRED_TOKEN)
        return None
    if not verdict.ok:
        metrics.stream_token_failures.inc()
        log.warning("%s media socket refused: invalid stream token", source)
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_INVALID_TOKEN)
        return None
    try:
        context = SpendContext.decode(spend_text)
    except BadSpendContext as exc:
        # A valid token over a bad context: only a gateway of another version does that.
        metrics.bad_messages.labels(source, "bad_spend_context").inc()
        log.warning("%s media socket refused: %s", source, exc)
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "bad call context")
        return None
    if not config.tap_allowlist.allows(tap_url):
        # Only reachable if the allowlist shrank since the call was admitted.
        metrics.tap_url_rejections.inc()
        await refuse(websocket, CLOSE_POLICY_VIOLATION, "brain URL not allowed")
        return None
    claimed = await state.stream_claims.claim(
        state.spend_store, context.call_id, config.spend.node_id, verdict.expires_at_s
    )
    if claimed is ClaimOutcome.ALREADY_USED:
        metrics.stream_token_replays.inc()
        log.warning(
            "%s media socket refused: call %s's stream token was already used",
            source,
            context.call_id,
        )
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        return None
    connected = await _connect(state, context.call_id)
    status = None if connected is None or connected.won else connected.status
    if status == _STARTED_STATUS:
        # Its claim is gone (expired or only node-local elsewhere) but its media started.
        metrics.stream_token_replays.inc()
        log.warning(
            "%s media socket refused: call %s already has a media stream", source, context.call_id
        )
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        return None
    if status in _FINISHED_STATUSES:
        # Settled before its stream came (no media in time, never answered, ...):
        # running it now would dial the brain for a call nobody pays for.
        metrics.stream_token_failures.inc()
        log.warning("%s media socket refused: call %s already ended", source, context.call_id)
        await refuse(websocket, CLOSE_POLICY_VIOLATION, REASON_CALL_ENDED)
        return None
    return TrustedStream(context, connected is not None and connected.won)


async def _connect(state: GatewayState, call_id: str) -> ConnectResult | None:
    """Make the call active on this node (``SpendStore.connect``: atomic, so no other
    node's media watcher can settle it from now on, and no second socket can start
    it); None when there is no store to ask or Redis is unreachable: the call then
    starts on its admission, and :func:`run_metered_call` tries again."""
    store = state.spend_store
    if store is None:
        return None
    try:
        return await store.connect(call_id, state.config.spend.node_id, wall_ms())
    except StoreUnavailable:
        log.warning("call %s: Redis unreachable when connecting it; starting it", call_id)
        return None
