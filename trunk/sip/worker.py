"""``rutster sip-worker``: SIP legs in, the gateway's media contract out.

One worker process = one pjsua2 user agent (``trunk/sip/ua.py``, its own
thread; at most 4 calls, see ``trunk/sip/PJSUA2.md``) + this asyncio glue:

- every INVITE first meets the access policy (source allowlist, digest,
  rejection cache — ``trunk/sip/access.py``); an allowed one is put to the
  gateway over the control channel (``/sip/workers``), which admits it
  through the spend gate (→ 200 OK) or refuses it (→ 486/603/503);
- an answered leg gets its own media socket (``/sip/stream``): caller audio,
  DTMF, marks and the leg's end go up; the brain's paced audio, clears,
  marks, hang-ups (BYE) and transfers (REFER) come down;
- ``dial`` orders from the gateway (``POST /v1/calls`` with provider
  ``sip``) are placed through the configured trunk.

The control channel reconnects with backoff; INVITEs that arrive while it is
down get 503 (the trunk retries elsewhere, e.g. Kamailio's next worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from rutster.base.backoff import Backoff
from rutster.protocols.ingress import ClearPlayback, PlaceMark, PlayAudio, UnknownIngressEvent
from rutster.trunk.sip.access import (
    AccessAction,
    SipAccessPolicy,
    SipAccessSettings,
    allowed_networks,
)
from rutster.trunk.sip.digest import DigestAuthenticator
from rutster.trunk.sip.source_filter import SourceFilter
from rutster.trunk.sip.ua import (
    InviteArrived,
    InviteInfo,
    InviteRefusal,
    LegAudio,
    LegConnected,
    LegDtmf,
    LegEnded,
    LegFailed,
    LegMarks,
    LegTransferResult,
    SipEvent,
    SipTrunk,
    SipUaError,
    SipUserAgent,
    UaSettings,
)
from rutster.trunk.sip.wire import (
    Admit,
    CancelDial,
    Dial,
    DialResult,
    HangUpLeg,
    Hello,
    InviteRequest,
    LoadReport,
    Refuse,
    TransferLeg,
    WireError,
    WorkerMediaCodec,
    bound_headers,
    encode_control,
    parse_control,
)
from rutster.trunk.sip.worker_config import SipWorkerSettings
from rutster.trunk.sip.worker_metrics import SipWorkerMetrics

log = logging.getLogger(__name__)

#: Calls one worker holds: the pjsua2-python wheel's PJSUA_MAX_CALLS (docs/ARCHITECTURE.md).
WORKER_CAPACITY = 4
#: Control-protocol version this worker speaks (trunk/sip/wire.py).
PROTOCOL_VERSION = 1
#: How long an INVITE waits for the gateway's admission before 503: the spend gate
#: answers in ~1 ms (bench/spend_gate.py); 5 s only covers a gateway in trouble,
#: well inside the caller's INVITE transaction (Timer B = 64*T1 = 32 s, RFC 3261).
ADMISSION_TIMEOUT_S = 5.0
#: SIP 503 Service Unavailable (RFC 3261 §21.5.4): no gateway to admit the call now.
SIP_UNAVAILABLE = 503
#: Caller frames kept while a leg's media socket is still opening: 1 s of 20 ms frames.
PENDING_AUDIO_FRAMES = 50
#: Frames queued towards the gateway before the oldest are dropped (2 s): a stalled
#: socket must not grow memory; the drop is counted.
MAX_UPLINK_FRAMES = 100
#: Waiting for queued frames to leave before a leg's socket closes: 50 x 10 ms.
UPLINK_DRAIN_POLLS = 50
UPLINK_DRAIN_POLL_S = 0.01
#: After a gateway-requested BYE/REFER the gateway closes the media socket itself;
#: close it from here if it has not within this time.
GATEWAY_CLOSE_WAIT_S = 5.0
#: Seconds between rejection-cache pushes into the kernel filter (drop mode).
DENY_LIST_REFRESH_S = 1.0
#: Legs whose events may wait for registration (a few: at most 4 calls per worker).
MAX_EARLY_LEGS = 16
#: How often a pooled worker checks that its pool is still alive (seconds).
PARENT_CHECK_S = 1.0
#: SIP final codes of an outbound call that never connected → API end reasons.
DIAL_FAILURE_REASONS = {
    486: "busy",
    600: "busy",
    408: "no_answer",
    480: "no_answer",
    487: "canceled",
}


@dataclass
class _Leg:
    """One SIP call on this worker, from INVITE (or dial) to its end."""

    leg: int
    direction: str
    from_: str
    to: str
    sip_call_id: str
    call_id: str = ""
    tap_url: str = ""
    spend: str = ""
    token: str = ""
    connected: bool = False
    ended: bool = False
    media: ClientConnection | None = None
    codec: WorkerMediaCodec = field(default_factory=WorkerMediaCodec)
    uplink: asyncio.Queue[str | bytes] = field(
        default_factory=lambda: asyncio.Queue(MAX_UPLINK_FRAMES)
    )
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    transfer_result: asyncio.Future[LegTransferResult] | None = None
    #: The gateway asked for a hang-up (BYE) or transfer (REFER): the gateway ends the
    #: call itself once it has the result, so no ``stop`` races the tool's outcome.
    hangup_requested: bool = False
    hangup_answered: bool = False
    transfer_requested: bool = False
    dropped_frames: int = 0


class SipWorker:
    """Runs one pjsua2 user agent and bridges its calls to the gateway."""

    def __init__(self, settings: SipWorkerSettings) -> None:
        self._settings = settings
        digest = None
        if settings.digest_user is not None and settings.digest_password is not None:
            digest = DigestAuthenticator(
                settings.realm,
                settings.digest_user,
                settings.digest_password,
                nonce_secret=settings.sip_secret.encode(),
            )
        self._policy = SipAccessPolicy(
            SipAccessSettings(
                allowed_cidrs=settings.allowed_cidrs,
                digest=digest,
                unknown_response=cast(Literal["reject", "drop"], settings.unknown_response),
                reject_code=settings.reject_code,
            )
        )
        # decide() runs on the pjsua thread (the INVITE screen), blocked_sources() on the loop.
        self._policy_lock = threading.Lock()
        self._ua: SipUserAgent | None = None
        self._control: ClientConnection | None = None
        self._legs: dict[int, _Leg] = {}
        self._by_call_id: dict[str, _Leg] = {}
        self._awaiting_admission: dict[str, asyncio.Future[Admit | Refuse]] = {}
        self._refs = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._source_filter: SourceFilter | None = None
        self._early_events: dict[int, list[SipEvent]] = {}
        self.metrics = SipWorkerMetrics()

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def sip_port(self) -> int:
        """The port the user agent listens on (UDP and TCP)."""
        assert self._ua is not None, "start() first"
        return self._ua.sip_port

    async def start(self) -> None:
        """Start the user agent (its own thread) and the control channel."""
        settings = self._settings
        trunk = None
        if settings.trunk_uri is not None:
            trunk = SipTrunk(
                uri=settings.trunk_uri,
                username=settings.trunk_user,
                password=settings.trunk_password,
                register=settings.trunk_register,
            )
        self._ua = SipUserAgent(
            UaSettings(
                bind_host=settings.bind_host,
                port=settings.sip_port,
                public_host=settings.public_host,
                trunk=trunk,
                reject_code=settings.reject_code,
            ),
            self._on_ua_event,
            asyncio.get_running_loop(),
            screen=self._screen_invite,
            on_unparsed=self._count_unparsed,
        )
        await asyncio.to_thread(self._ua.start)
        if settings.unknown_response == "drop":
            self._attach_source_filter()
        if settings.metrics_port is not None:
            self.metrics.serve(settings.bind_host, settings.metrics_port)
        self._spawn(self._control_loop())
        log.info(
            "SIP worker %s listening on %s:%d",
            settings.worker_id,
            settings.bind_host,
            self.sip_port,
        )

    async def stop(self) -> None:
        """Hang up every leg, stop the user agent and close the gateway sockets."""
        for task in list(self._tasks):
            task.cancel()
        for leg in list(self._legs.values()):
            await self._close_media(leg)
        if self._control is not None:
            with contextlib.suppress(Exception):
                await self._control.close()
        if self._ua is not None:
            await asyncio.to_thread(self._ua.stop)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, object], leg: _Leg | None = None) -> None:
        task = asyncio.ensure_future(coro)
        owner = self._tasks if leg is None else leg.tasks
        owner.add(task)
        task.add_done_callback(owner.discard)
        task.add_done_callback(self._log_failure)

    @staticmethod
    def _log_failure(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("SIP worker task failed", exc_info=task.exception())

    def _attach_source_filter(self) -> None:
        source_filter = SourceFilter(allowed_networks(self._policy.settings))
        source_filter.attach(self.sip_port)
        self._source_filter = source_filter
        self._spawn(self._refresh_deny_list(source_filter))

    async def _refresh_deny_list(self, source_filter: SourceFilter) -> None:
        shown: list[str] = []
        while True:
            await asyncio.sleep(DENY_LIST_REFRESH_S)
            with self._policy_lock:
                blocked = self._policy.blocked_sources(time.time())
            if blocked != shown:
                source_filter.update_denied(blocked)
                shown = blocked

    # ---- the control channel -----------------------------------------------------

    async def _control_loop(self) -> None:
        settings = self._settings
        backoff = Backoff()
        headers = {"Authorization": f"Bearer {settings.sip_secret}"}
        while True:
            try:
                async with connect(settings.control_url, additional_headers=headers) as ws:
                    self._control = ws
                    backoff.reset()
                    await ws.send(
                        encode_control(
                            Hello(
                                settings.worker_id,
                                f"sip:{settings.public_host or settings.bind_host}:{self.sip_port}",
                                WORKER_CAPACITY,
                                PROTOCOL_VERSION,
                            )
                        )
                    )
                    await self._report_load()
                    log.info("SIP worker connected to the gateway")
                    async for message in ws:
                        if isinstance(message, bytes):
                            self.metrics.bad_messages.labels("control", "binary_frame").inc()
                            continue
                        self._on_control(message)
            except (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError) as exc:
                log.warning("SIP worker: gateway control channel down (%s)", type(exc).__name__)
            finally:
                self._control = None
                for waiter in self._awaiting_admission.values():
                    if not waiter.done():
                        waiter.cancel()
            await asyncio.sleep(backoff.next_delay())

    def _on_control(self, text: str) -> None:
        try:
            message = parse_control(text)
        except WireError as exc:
            self.metrics.bad_messages.labels("control", exc.reason).inc()
            log.debug("SIP worker: dropped control message: %s", exc)
            return
        if isinstance(message, (Admit, Refuse)):
            waiter = self._awaiting_admission.get(message.ref)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
        elif isinstance(message, Dial):
            self._spawn(self._dial(message))
        elif isinstance(message, CancelDial):
            leg = self._by_call_id.get(message.call_id)
            if leg is not None and not leg.connected:
                self._spawn(self._hang_up(leg))
        else:
            self.metrics.bad_messages.labels("control", "unexpected_type").inc()

    async def _send_control(self, text: str) -> bool:
        ws = self._control
        if ws is None:
            return False
        try:
            await ws.send(text)
        except ConnectionClosed:
            return False
        return True

    async def _report_load(self) -> None:
        self.metrics.active_legs.set(len(self._legs))
        await self._send_control(encode_control(LoadReport(len(self._legs))))

    # ---- user agent events (on the loop thread) ------------------------------------

    def _on_ua_event(self, event: SipEvent) -> None:
        if isinstance(event, LegAudio):
            leg = self._legs.get(event.leg)
            if leg is not None and not leg.ended:
                self._uplink(leg, event.pcm)
            return
        if isinstance(event, InviteArrived):
            self._early_events.pop(event.leg, None)  # pjsua reuses call ids
            self._spawn(self._on_invite(event))
            return
        leg = self._legs.get(event.leg)
        if leg is None:
            # An outbound leg's first events can overtake dial()'s own result (both
            # cross threads via call_soon_threadsafe): keep them until _dial registers
            # the leg. Bounded; legs nobody registers (rejected INVITEs) age out.
            self._early_events.setdefault(event.leg, []).append(event)
            while len(self._early_events) > MAX_EARLY_LEGS:
                del self._early_events[next(iter(self._early_events))]
            return
        if not isinstance(event, LegMarks):
            log.debug("SIP leg %d (%s): %s", event.leg, leg.call_id, type(event).__name__)
        if isinstance(event, LegConnected):
            leg.connected = True
            leg.sip_call_id = leg.sip_call_id or event.sip_call_id
            self._spawn(self._open_media(leg), leg)
        elif isinstance(event, LegDtmf):
            self._uplink(leg, leg.codec.dtmf(event.digit))
        elif isinstance(event, LegMarks):
            for name in event.names:
                self._uplink(leg, leg.codec.mark_played(name))
        elif isinstance(event, LegTransferResult):
            if leg.transfer_result is not None and not leg.transfer_result.done():
                leg.transfer_result.set_result(event)
        elif isinstance(event, LegFailed):
            self._spawn(self._on_dial_failed(leg, event.sip_code, event.reason))
        elif isinstance(event, LegEnded):
            self._spawn(self._on_ended(leg, event.reason))

    def _uplink(self, leg: _Leg, item: str | bytes) -> None:
        queue = leg.uplink
        if leg.media is None and queue.qsize() >= PENDING_AUDIO_FRAMES and isinstance(item, bytes):
            leg.dropped_frames += 1
            return
        if queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()
            leg.dropped_frames += 1
            self.metrics.uplink_dropped.inc()
        queue.put_nowait(item)

    # ---- inbound -------------------------------------------------------------------

    def _count_unparsed(self, outcome: str) -> None:
        """One message pjsip's parser refused (pjsua thread; see trunk/sip/ua.py)."""
        self.metrics.unparsed_requests.labels(outcome).inc()

    def _screen_invite(self, info: InviteInfo) -> InviteRefusal | None:
        """The access policy on an INVITE, on the pjsua thread (see SipUserAgent's screen)."""
        with self._policy_lock:
            # Wall time: digest nonces carry a timestamp that must survive a restart.
            decision = self._policy.decide(info.source, info.authorization, "INVITE", time.time())
        if decision.action is AccessAction.ACCEPT:
            return None
        self.metrics.invites.labels(decision.reason).inc()  # prometheus-client: thread-safe
        # DROP still ends the INVITE (pjsua already sent 100 Trying); the kernel filter
        # (drop mode) keeps such sources from reaching pjsua at all. A 401 carries one
        # WWW-Authenticate per algorithm (SHA-256, MD5).
        return InviteRefusal(decision.status or self._settings.reject_code, decision.headers)

    async def _on_invite(self, event: InviteArrived) -> None:
        ua = self._ua
        assert ua is not None
        info = event.info  # let through by _screen_invite
        if self._control is None:
            self.metrics.invites.labels("no_gateway").inc()
            with contextlib.suppress(SipUaError):
                await ua.reject(event.leg, SIP_UNAVAILABLE)
            return
        leg = _Leg(event.leg, "in", info.from_uri, info.to_uri, info.sip_call_id)
        self._legs[event.leg] = leg
        for early in self._early_events.pop(event.leg, []):
            self._on_ua_event(early)  # e.g. the caller's CANCEL while we checked access
        ref = f"{event.leg}-{next(self._refs)}"
        waiter: asyncio.Future[Admit | Refuse] = asyncio.get_running_loop().create_future()
        self._awaiting_admission[ref] = waiter
        try:
            sent = await self._send_control(
                encode_control(
                    InviteRequest(
                        ref,
                        info.sip_call_id,
                        info.from_uri,
                        info.to_uri,
                        info.source,
                        info.transport,
                        _forwarded_headers(info.headers),
                    )
                )
            )
            answer: Admit | Refuse | None = None
            if sent:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    async with asyncio.timeout(ADMISSION_TIMEOUT_S):
                        answer = await waiter
        finally:
            self._awaiting_admission.pop(ref, None)
        if leg.ended:
            return  # the caller gave up (CANCEL) meanwhile
        try:
            if isinstance(answer, Admit):
                leg.call_id, leg.tap_url = answer.call_id, answer.tap_url
                leg.spend, leg.token = answer.spend, answer.token
                self._by_call_id[answer.call_id] = leg
                await ua.answer(event.leg)
                self.metrics.invites.labels("admitted").inc()
            else:
                code = answer.sip_code if isinstance(answer, Refuse) else SIP_UNAVAILABLE
                self.metrics.invites.labels("refused").inc()
                await ua.reject(event.leg, code)
                self._forget(leg)
        except SipUaError as exc:
            log.info("SIP leg %d: could not answer (%s)", event.leg, exc.reason)
            self._forget(leg)
        await self._report_load()

    # ---- outbound ------------------------------------------------------------------

    async def _dial(self, order: Dial) -> None:
        ua = self._ua
        assert ua is not None
        uri = self._dial_uri(order.to)
        if uri is None:
            await self._send_control(
                encode_control(DialResult(order.call_id, "failed", 404, "no_route"))
            )
            return
        try:
            leg_id = await ua.dial(uri, self._from_uri(order.from_))
        except SipUaError as exc:
            await self._send_control(
                encode_control(DialResult(order.call_id, "failed", SIP_UNAVAILABLE, exc.reason))
            )
            return
        leg = _Leg(leg_id, "out", order.from_, order.to, "", order.call_id)
        leg.tap_url, leg.spend, leg.token = order.tap_url, order.spend, order.token
        self._legs[leg_id] = leg
        self._by_call_id[order.call_id] = leg
        for early in self._early_events.pop(leg_id, []):
            self._on_ua_event(early)
        await self._report_load()
        self._spawn(self._ring_timeout(leg, order.ring_timeout_s), leg)

    def _dial_uri(self, to: str) -> str | None:
        if to.lower().startswith(("sip:", "sips:")):
            return to
        trunk = self._settings.trunk_uri
        if trunk is None:
            return None
        host = trunk.split(":", 1)[1].split(";", 1)[0]
        host = host.split("@", 1)[-1]
        return f"sip:{to}@{host}"

    def _from_uri(self, from_: str) -> str | None:
        if from_.lower().startswith(("sip:", "sips:")):
            return from_
        host = self._settings.public_host or self._settings.bind_host
        return f"sip:{from_}@{host}"

    async def _ring_timeout(self, leg: _Leg, ring_timeout_s: int) -> None:
        await asyncio.sleep(ring_timeout_s)
        if not leg.connected and not leg.ended:
            await self._hang_up(leg)

    async def _on_dial_failed(self, leg: _Leg, sip_code: int, reason: str) -> None:
        self._forget(leg)
        end = DIAL_FAILURE_REASONS.get(sip_code, "failed")
        code = sip_code if 400 <= sip_code <= 699 else SIP_UNAVAILABLE
        log.info("SIP dial %s failed: %d %s", leg.call_id, sip_code, reason)
        await self._send_control(encode_control(DialResult(leg.call_id, "failed", code, end)))
        await self._report_load()

    # ---- media -----------------------------------------------------------------------

    async def _open_media(self, leg: _Leg) -> None:
        settings = self._settings
        headers = {"Authorization": f"Bearer {settings.sip_secret}"}
        try:
            leg.media = await connect(settings.stream_url, additional_headers=headers)
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            log.warning("SIP leg %s: media socket failed (%s); hanging up", leg.call_id, exc)
            await self._hang_up(leg)
            return
        await leg.media.send(
            leg.codec.start(
                leg.call_id,
                leg.sip_call_id,
                leg.direction,
                leg.from_,
                leg.to,
                leg.tap_url,
                leg.spend,
                leg.token,
            )
        )
        if leg.direction == "out":
            await self._send_control(encode_control(DialResult(leg.call_id, "answered", 200, "")))
        self._spawn(self._pump_uplink(leg, leg.media), leg)
        self._spawn(self._read_media(leg, leg.media), leg)

    async def _pump_uplink(self, leg: _Leg, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(await leg.uplink.get())

    async def _read_media(self, leg: _Leg, ws: ClientConnection) -> None:
        ua = self._ua
        assert ua is not None
        try:
            async for message in ws:
                try:
                    command = leg.codec.receive(message)
                except (WireError, UnknownIngressEvent) as exc:
                    self.metrics.bad_messages.labels("media", "bad_message").inc()
                    log.debug("SIP leg %s: dropped media message: %s", leg.call_id, exc)
                    continue
                if not isinstance(command, (PlayAudio, PlaceMark)):
                    log.debug("SIP leg %d (%s): gateway says %s", leg.leg, leg.call_id, command)
                if isinstance(command, PlayAudio):
                    ua.play(leg.leg, command.payload)
                elif isinstance(command, PlaceMark):
                    ua.mark(leg.leg, command.name)
                elif isinstance(command, ClearPlayback):
                    ua.clear(leg.leg)
                elif isinstance(command, HangUpLeg):
                    leg.hangup_requested = True
                    self._answer_hangup(leg, await self._hang_up(leg))
                elif isinstance(command, TransferLeg):
                    leg.transfer_requested = True
                    self._spawn(self._transfer(leg, command.to), leg)
        except ConnectionClosed:
            pass
        # The gateway closed the call's socket: the call is over on its side.
        if not leg.ended:
            await self._hang_up(leg)

    def _answer_hangup(self, leg: _Leg, ok: bool) -> None:
        if leg.hangup_answered:
            return
        leg.hangup_answered = True
        # 481 Call/Transaction Does Not Exist: the leg was already gone.
        self._uplink(leg, leg.codec.control_result("hangup", ok, 200 if ok else 481, ""))

    async def _transfer(self, leg: _Leg, to: str) -> None:
        ua = self._ua
        assert ua is not None
        uri = self._dial_uri(to)
        if uri is None:
            self._uplink(leg, leg.codec.control_result("transfer", False, 404, "no_route"))
            return
        leg.transfer_result = asyncio.get_running_loop().create_future()
        try:
            await ua.transfer(leg.leg, uri)
            async with asyncio.timeout(ADMISSION_TIMEOUT_S):
                result = await leg.transfer_result
        except SipUaError as exc:
            self._uplink(leg, leg.codec.control_result("transfer", False, None, exc.reason))
            return
        except TimeoutError:
            self._uplink(leg, leg.codec.control_result("transfer", False, 408, "timeout"))
            return
        reason = "" if result.ok else f"sip_{result.sip_code}"
        self._uplink(leg, leg.codec.control_result("transfer", result.ok, result.sip_code, reason))

    async def _hang_up(self, leg: _Leg) -> bool:
        ua = self._ua
        if ua is None or leg.ended:
            return False
        try:
            await ua.hang_up(leg.leg)
        except SipUaError:
            return False
        return True

    async def _on_ended(self, leg: _Leg, reason: str) -> None:
        leg.ended = True
        if leg.media is not None:
            ended_by_gateway = leg.hangup_requested or (
                leg.transfer_requested and reason == "transferred"
            )
            if leg.hangup_requested:
                self._answer_hangup(leg, True)  # the BYE went out
            if not ended_by_gateway:
                self._uplink(leg, leg.codec.stop(reason))
            # Let the uplink pump deliver what is queued before the socket closes.
            for _ in range(UPLINK_DRAIN_POLLS):
                if leg.uplink.empty():
                    break
                await asyncio.sleep(UPLINK_DRAIN_POLL_S)
            if ended_by_gateway:
                # The gateway closes the socket once the tool's result is through.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(leg.media.wait_closed(), GATEWAY_CLOSE_WAIT_S)
        elif leg.direction == "out" and leg.call_id and not leg.connected:
            await self._send_control(
                encode_control(DialResult(leg.call_id, "failed", 487, "canceled"))
            )
        await self._close_media(leg)
        self._forget(leg)
        await self._report_load()

    async def _close_media(self, leg: _Leg) -> None:
        if leg.media is not None:
            with contextlib.suppress(Exception):
                await leg.media.close()
        for task in list(leg.tasks):
            if task is not asyncio.current_task():
                task.cancel()

    def _forget(self, leg: _Leg) -> None:
        leg.ended = True
        if self._legs.get(leg.leg) is leg:
            del self._legs[leg.leg]
        if leg.call_id and self._by_call_id.get(leg.call_id) is leg:
            del self._by_call_id[leg.call_id]


#: Headers of an INVITE passed to the gateway (call context for routing and the
#: brain): the caller's identity and diversion, user-to-user data and X- headers.
FORWARDED_HEADERS = frozenset({"p-asserted-identity", "diversion", "user-to-user", "referred-by"})


def _forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    picked = {
        name: value
        for name, value in headers.items()
        if name.lower() in FORWARDED_HEADERS or name.lower().startswith("x-")
    }
    # The wire's own bounds: token names, no control characters, 16 x 256 chars.
    return bound_headers(picked)


async def run_sip_worker(settings: SipWorkerSettings, *, exit_with_parent: bool = False) -> None:
    """Run a worker until SIGTERM/SIGINT (``rutster sip-worker``).

    ``exit_with_parent`` (set by ``rutster sip-pool``): also stop when the pool
    process dies, so a SIGKILLed pool leaves no orphan workers holding its ports.
    """
    import os
    import signal

    worker = SipWorker(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    parent = os.getppid()

    async def watch_parent() -> None:
        # Polling: the kernel offers no awaitable "parent died" to asyncio.
        while os.getppid() == parent:  # noqa: ASYNC110
            await asyncio.sleep(PARENT_CHECK_S)
        log.warning("SIP worker: the pool that started it is gone; stopping")
        stop.set()

    watcher = asyncio.create_task(watch_parent()) if exit_with_parent else None
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await worker.stop()
