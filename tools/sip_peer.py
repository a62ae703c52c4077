"""A pjsua2 phone in its own process, driven from asyncio: the SIP test peer.

:class:`SipPeerProcess` is a test instrument that plays a customer's PBX or trunk: it places calls
(sending recorded speech, custom headers, digest credentials), sends RFC 2833 DTMF, hangs up,
records what it hears and reads RTP statistics, and it answers calls (200 after a delay, a
rejection code, or as an *echo* reflector that plays back what it hears). It is independent of
the worker's UA (``trunk/sip/ua.py``) on purpose: a test of the worker must not share its code.

Why a process: the pjsua2 wheel allows one library per process and at most 4 calls in it
(measured, docs/SIP.md), so the load generator scales by processes. The child pumps
``libHandleEvents`` on the thread that called ``libCreate`` (``threadCnt = 0``) and talks to the
parent over a :func:`multiprocessing.Pipe`: the parent sends ``(request id, op, args)`` and gets
``("reply", id, ok, payload)`` back, plus unsolicited ``("event", kind, key, payload)`` messages
(call confirmed, call ended, incoming call, DTMF digit). Audio goes through one
``AudioMediaPort`` per call at 16 kHz / 20 ms / mono / 16 bit; its frame callbacks run on
pjmedia's clock thread and only touch a list, a deque and a counter (never block there).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import importlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from rutster.trunk.sip.pj_banner import lib_create_quietly

__all__ = [
    "DEFAULT_ANSWER_TIMEOUT_S",
    "DEFAULT_CODECS",
    "FRAME_BYTES",
    "MAX_CALLS_PER_PROCESS",
    "SAMPLE_RATE",
    "CallEnd",
    "CallHandle",
    "IncomingCallInfo",
    "RtpStats",
    "SipPeerError",
    "SipPeerProcess",
]

#: Audio format of the peer's media port: L16 mono 16 kHz in 20 ms frames, the same as the
#: worker <-> gateway leg (docs/SIP.md, design of issue 6).
SAMPLE_RATE = 16_000
FRAME_MS = 20
FRAME_BYTES = SAMPLE_RATE * FRAME_MS // 1000 * 2
_SILENCE_FRAME = bytes(FRAME_BYTES)
#: Calls one pjsua2 process can hold: the wheel returns PJ_ETOOMANY on the 5th whatever
#: ``UaConfig.maxCalls`` says (measured, design of issue 6).
MAX_CALLS_PER_PROCESS = 4
#: Codecs the peer offers, in order; every other codec is disabled. PCMU first because that is
#: what a PSTN trunk or PBX offers (RFC 3551 payload type 0); the worker's bridge decodes it.
DEFAULT_CODECS: tuple[str, ...] = ("PCMU/8000", "PCMA/8000", "G722/16000")
#: pjsua priority given to the first codec of the list (pjsua's own top priority is 255;
#: later codecs get one less each so the order is kept).
_TOP_CODEC_PRIORITY = 255
#: How long ``libHandleEvents`` may wait for a SIP/timer event per pump: the latency a parent
#: command can see before the child reads it. 5 ms keeps that far below a 20 ms frame.
PUMP_MS = 5
#: How long the parent waits for the child to create its library and bind UDP: a spawn start
#: plus ``import pjsua2`` measured ~0.4 s here; 20 s leaves room on a loaded 2-core CI box.
START_TIMEOUT_S = 20.0
#: How long ``place_call`` waits for a final answer before cancelling: RFC 3261 Timer B
#: (64 x T1 = 32 s) is when the UA itself gives up on an unanswered INVITE, plus slack.
DEFAULT_ANSWER_TIMEOUT_S = 40.0
#: Grace for the child to send BYE on its calls and run libDestroy on close (same budget as the
#: worker pool's stop grace, trunk/sip/pool.py).
STOP_TIMEOUT_S = 10.0
#: A finished call's audio port lives this long (five 20 ms clock ticks) before release.
PORT_RETIRE_S = 0.1
#: Most audio one call records, in seconds: bounds the child's memory (16 kHz PCM16 is
#: 32 kB/s, so 10 minutes is ~19 MB per call). Seed decision; load runs are a few minutes.
MAX_RECORD_S = 600
_MAX_RECORD_FRAMES = MAX_RECORD_S * 1000 // FRAME_MS
#: Status the peer sends while an answer is delayed (RFC 3261 §21.1.2, 180 Ringing).
_RINGING = 180
#: pjsua log level in the child: 0 = silent (the console belongs to the test or the CLI).
_PJ_LOG_LEVEL = 0
#: The SIP user part of the peer's own URI.
DEFAULT_USER = "peer"

AnswerCode = int
HangupBy = Literal["local", "remote"]


class SipPeerError(RuntimeError):
    """The peer process refused a request or died (bad call key, too many calls, ...)."""


@dataclass(frozen=True)
class CallHandle:
    """One call of one :class:`SipPeerProcess`; pass it back to the peer's methods.

    For a call the peer placed, the fields are the setup result: ``sip_code`` is the final
    status (200, 486, ...; 0 when no response came), ``setup_ms`` the time from sending INVITE
    to receiving 200 OK (``None`` if not answered), ``reason`` the status text. For a call the
    peer received, ``sip_code`` is what its answer mode will send (180 = keep ringing).
    """

    key: int
    peer_id: int
    direction: Literal["out", "in"]
    sip_call_id: str
    sip_code: int
    answered: bool
    setup_ms: float | None
    reason: str


@dataclass(frozen=True)
class CallEnd:
    """How a call ended: who hung up, the last SIP status and its reason text."""

    by: HangupBy
    sip_code: int
    reason: str
    connected_s: float


@dataclass(frozen=True)
class IncomingCallInfo:
    """A call the peer received: its handle and what the INVITE said."""

    handle: CallHandle
    from_uri: str
    to_uri: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class RtpStats:
    """RTP/RTCP receive and send counters of a call's audio stream (pjmedia's stream stats)."""

    rx_packets: int
    rx_lost: int
    rx_discarded: int
    rx_jitter_mean_ms: float
    rx_jitter_max_ms: float
    tx_packets: int

    @property
    def loss_fraction(self) -> float:
        """Lost / expected receive packets, 0.0 when nothing was expected."""
        expected = self.rx_packets + self.rx_lost
        return self.rx_lost / expected if expected else 0.0


# --------------------------------------------------------------------------------------------
# Child side. Everything below up to SipPeerProcess runs in the spawned process only.
# --------------------------------------------------------------------------------------------

#: pjsua2 is a SWIG module without type information; imported in the child only.
pj: Any = None


def _vector_bytes(vec: Any) -> bytes:
    """The bytes of a SWIG ``std::vector<unsigned char>`` (a MediaFrame buffer).

    ``bytes(vec)`` walks SWIG's iterator element by element: 220 us per 640-byte frame
    (measured). The vector object starts with its begin/end pointers (libstdc++'s ABI), so one
    ``string_at`` copies it in ~2 us; the size check falls back to the slow path if that
    layout ever differs.
    """
    begin, end = ctypes.cast(int(vec.this), ctypes.POINTER(ctypes.c_void_p * 2)).contents
    size = int(vec.size())
    if begin is None or end is None or end - begin != size:
        return bytes(vec)
    return ctypes.string_at(begin, size)


def _describe(exc: Exception) -> str:
    """Text of an exception; pjsua2's ``Error`` has an empty ``str()``, its text is in info()."""
    info = getattr(exc, "info", None)
    if callable(info):
        with contextlib.suppress(Exception):
            return f"pjsua2: {str(info()).strip()}"
    return f"{type(exc).__name__}: {exc}"


def _split_frames(pcm: bytes) -> list[bytes]:
    """PCM16 cut into 20 ms frames, the last one padded with silence."""
    frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
    if frames and len(frames[-1]) < FRAME_BYTES:
        frames[-1] = frames[-1] + bytes(FRAME_BYTES - len(frames[-1]))
    return frames


def _parse_headers(whole_msg: str) -> dict[str, str]:
    """Header fields of a SIP message (RFC 3261 §7.3): name -> value, repeats joined by ', '."""
    head = whole_msg.replace("\r\n", "\n").split("\n\n", 1)[0]
    lines = head.split("\n")[1:]
    headers: dict[str, str] = {}
    last = ""
    for line in lines:
        if line[:1] in (" ", "\t") and last:
            headers[last] = headers[last] + " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        last = name.strip()
        value = value.strip()
        headers[last] = f"{headers[last]}, {value}" if last in headers else value
    return headers


class _MediaPort:
    """Builds the AudioMediaPort subclass once pjsua2 is imported (the base is a runtime class)."""

    cls: Any = None

    @classmethod
    def make(cls, speech: list[bytes], loop: bool, echo: bool) -> Any:
        if cls.cls is None:
            cls.cls = _define_port_class()
        return cls.cls(speech, loop, echo)


def _define_port_class() -> Any:
    class CallAudioPort(pj.AudioMediaPort):  # type: ignore[misc]
        """Sends speech (or echoes what it heard) and records every received frame."""

        def __init__(self, speech: list[bytes], loop: bool, echo: bool) -> None:
            super().__init__()
            self.speech = speech
            self.loop = loop
            self.echo = echo
            self.sent_frames = 0
            self.heard: list[bytes] = []
            # deque append/popleft are atomic under the GIL: the clock thread fills and
            # drains it, nobody else touches it.
            self.echo_queue: collections.deque[bytes] = collections.deque(maxlen=50)

        def onFrameRequested(self, frame: Any) -> None:
            if self.echo:
                data = self.echo_queue.popleft() if self.echo_queue else _SILENCE_FRAME
            elif self.speech and (self.loop or self.sent_frames < len(self.speech)):
                data = self.speech[self.sent_frames % len(self.speech)]
            else:
                data = _SILENCE_FRAME
            self.sent_frames += 1
            frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            frame.buf = pj.ByteVector(data)
            frame.size = len(data)

        def onFrameReceived(self, frame: Any) -> None:
            if frame.type == pj.PJMEDIA_FRAME_TYPE_AUDIO and frame.size:
                data = _vector_bytes(frame.buf)
            else:
                data = _SILENCE_FRAME
            if self.echo:
                self.echo_queue.append(data)
            if len(self.heard) < _MAX_RECORD_FRAMES:
                self.heard.append(data)

        def sent_audio(self) -> bytes:
            """Exactly the PCM this port handed to the bridge so far."""
            if self.echo or not self.speech:
                return b""
            n = len(self.speech)
            if self.loop:
                whole, part = divmod(self.sent_frames, n)
                return b"".join(self.speech) * whole + b"".join(self.speech[:part])
            return b"".join(self.speech[: min(self.sent_frames, n)])

    return CallAudioPort


@dataclass
class _AnswerMode:
    code: int | None  # None: keep ringing
    after_ms: int
    speech: list[bytes]
    loop: bool
    echo: bool


@dataclass
class _ChildCall:
    key: int
    direction: Literal["out", "in"]
    call: Any
    port: Any
    started: float
    hangup_requested: bool = False
    confirmed_at: float | None = None
    media: Any = None  # the call's AudioMedia, referenced while connected to the port
    stats: dict[str, Any] | None = None
    ended: bool = False
    heard: list[bytes] = field(default_factory=list)
    sent: bytes = b""


class _Child:
    """The pjsua2 phone inside the child process."""

    def __init__(self, conn: multiprocessing.connection.Connection, cfg: dict[str, Any]) -> None:
        self.conn = conn
        self.cfg = cfg
        self.calls: dict[int, _ChildCall] = {}
        self.keys = itertools.count(1)
        self.outbox: list[tuple[Any, ...]] = []
        self.timers: list[tuple[float, int, int]] = []  # (due, key, code)
        self.release: list[_ChildCall] = []
        self.answer = _AnswerMode(code=None, after_ms=0, speech=[], loop=True, echo=False)
        self.auth_accounts: dict[tuple[str, str], Any] = {}
        self.running = True
        self.retired_ports: list[tuple[float, Any]] = []

    # -- library lifecycle -----------------------------------------------------------------

    def start(self) -> int:
        self.ep = pj.Endpoint()
        lib_create_quietly(self.ep)
        ep_cfg = pj.EpConfig()
        ep_cfg.uaConfig.threadCnt = 0
        ep_cfg.uaConfig.mainThreadOnly = False
        ep_cfg.uaConfig.maxCalls = MAX_CALLS_PER_PROCESS
        ep_cfg.uaConfig.userAgent = "rutster-peer"
        ep_cfg.logConfig.level = _PJ_LOG_LEVEL
        ep_cfg.logConfig.consoleLevel = _PJ_LOG_LEVEL
        ep_cfg.medConfig.clockRate = SAMPLE_RATE
        ep_cfg.medConfig.sndClockRate = SAMPLE_RATE
        ep_cfg.medConfig.audioFramePtime = FRAME_MS
        # Send every frame, silence too: RTP loss and the echo round trip stay measurable.
        ep_cfg.medConfig.noVad = True
        self.ep.libInit(ep_cfg)
        tcfg = pj.TransportConfig()
        tcfg.port = int(self.cfg["port"])
        tcfg.boundAddress = self.cfg["bind_host"]
        tid = self.ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, tcfg)
        self.ep.libStart()
        self.ep.audDevManager().setNullDev()
        self._set_codecs(list(self.cfg["codecs"]))
        port = int(str(self.ep.transportGetInfo(tid).localName).rsplit(":", 1)[1])
        self.port = port
        self.account = self._make_account(None, default=True)
        return port

    def _set_codecs(self, wanted: list[str]) -> None:
        available = {str(c.codecId): c for c in self.ep.codecEnum2()}
        for codec_id in available:
            self.ep.codecSetPriority(codec_id, 0)
        for i, name in enumerate(wanted):
            match = [c for c in available if c.lower().startswith(name.lower())]
            if not match:
                raise SipPeerError(f"codec {name!r} not in pjsua2: {sorted(available)}")
            self.ep.codecSetPriority(match[0], _TOP_CODEC_PRIORITY - i)

    def _make_account(self, auth: tuple[str, str] | None, *, default: bool = False) -> Any:
        peer = self

        class PeerAccount(pj.Account):  # type: ignore[misc]
            def onIncomingCall(self, prm: Any) -> None:
                peer.on_incoming(self, prm)

        acfg = pj.AccountConfig()
        user = auth[0] if auth else self.cfg["user"]
        acfg.idUri = f"sip:{user}@{self.cfg['bind_host']}:{self.port}"
        acfg.mediaConfig.transportConfig.boundAddress = self.cfg["bind_host"]
        # 0: let the OS pick RTP ports, so several peer processes never collide.
        acfg.mediaConfig.transportConfig.port = 0
        if auth:
            acfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", auth[0], 0, auth[1]))
        acc = PeerAccount()
        acc.create(acfg, default)
        return acc

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ep.hangupAllCalls()
        deadline = time.monotonic() + STOP_TIMEOUT_S / 2
        while any(not c.ended for c in self.calls.values()) and time.monotonic() < deadline:
            self.ep.libHandleEvents(PUMP_MS)
        self._release_finished()
        for c in self.calls.values():
            c.call = c.port = c.media = None
        if self.retired_ports:
            time.sleep(PORT_RETIRE_S)
            self.retired_ports.clear()
        for acc in [self.account, *self.auth_accounts.values()]:
            with contextlib.suppress(Exception):
                acc.shutdown()
        self.account = None
        self.auth_accounts.clear()
        # Without NO_NETWORK pjsua busy-waits 1 s for unregistrations and TURN shutdowns we
        # never started; with every call already disconnected there is nothing left to send.
        clean = all(c.ended for c in self.calls.values())
        self.ep.libDestroy(pj.PJSUA_DESTROY_NO_NETWORK if clean else 0)
        self.ep = None

    # -- the pump ----------------------------------------------------------------------------

    def run(self) -> None:
        while self.running:
            self.ep.libHandleEvents(PUMP_MS)
            while self.running and self.conn.poll():
                try:
                    msg = self.conn.recv()
                except EOFError:  # parent gone: hang up and leave
                    self.running = False
                    break
                self.handle(msg)
            self._fire_timers()
            self._release_finished()
            self._flush()

    def _flush(self) -> None:
        for msg in self.outbox:
            self.conn.send(msg)
        self.outbox.clear()

    def _fire_timers(self) -> None:
        now = time.monotonic()
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _, key, code in due:
            c = self.calls.get(key)
            if c is not None and not c.ended:
                self._answer(c, code)

    def _release_finished(self) -> None:
        # Dropping the last reference deletes the C++ Call/port: never inside a callback.
        # A port lives on a few clock ticks first: the clock thread may be inside its
        # frame callback right now (a half-destroyed director crashed; see ua.py).
        now = time.monotonic()
        for c in self.release:
            if c.port is not None:
                self.retired_ports.append((now, c.port))
            c.call = c.port = c.media = None
        self.release.clear()
        while self.retired_ports and self.retired_ports[0][0] < now - PORT_RETIRE_S:
            self.retired_ports.pop(0)

    # -- requests ----------------------------------------------------------------------------

    def handle(self, msg: tuple[int, str, dict[str, Any]]) -> None:
        req_id, op, args = msg
        try:
            result = getattr(self, f"op_{op}")(**args)
        except Exception as exc:  # reported to the parent, which raises SipPeerError
            self.conn.send(("reply", req_id, False, _describe(exc)))
            return
        self.conn.send(("reply", req_id, True, result))

    def _call(self, key: int) -> _ChildCall:
        c = self.calls.get(key)
        if c is None:
            raise KeyError(f"no call {key} in this peer")
        return c

    def op_call(
        self,
        uri: str,
        speech: bytes,
        loop: bool,
        headers: dict[str, str],
        auth: tuple[str, str] | None,
    ) -> int:
        active = sum(1 for c in self.calls.values() if not c.ended)
        if active >= MAX_CALLS_PER_PROCESS:
            raise SipPeerError(f"this peer already holds {active} calls (max per process)")
        acc = self.account
        if auth is not None:
            acc = self.auth_accounts.get(auth)
            if acc is None:
                acc = self.auth_accounts[auth] = self._make_account(auth)
        key = next(self.keys)
        call = self._new_call(acc, key, pj.PJSUA_INVALID_ID)
        c = _ChildCall(
            key=key,
            direction="out",
            call=call,
            port=_MediaPort.make(_split_frames(speech), loop, echo=False),
            started=time.monotonic(),
        )
        prm = pj.CallOpParam(True)
        for name, value in headers.items():
            h = pj.SipHeader()
            h.hName = name
            h.hValue = value
            prm.txOption.headers.append(h)
        self.calls[key] = c
        try:
            call.makeCall(uri, prm)
        except Exception:
            del self.calls[key]
            raise
        return key

    def op_dtmf(self, key: int, digits: str) -> None:
        c = self._call(key)
        prm = pj.CallSendDtmfParam()
        prm.method = pj.PJSUA_DTMF_METHOD_RFC2833
        prm.digits = digits
        c.call.sendDtmf(prm)

    def op_hangup(self, key: int, code: int) -> None:
        c = self._call(key)
        if c.ended:
            return
        c.hangup_requested = True
        self._snapshot_stats(c)
        prm = pj.CallOpParam()
        prm.statusCode = code
        c.call.hangup(prm)

    def op_audio(self, key: int) -> tuple[bytes, bytes]:
        c = self._call(key)
        if c.ended:
            return b"".join(c.heard), c.sent
        return b"".join(c.port.heard), c.port.sent_audio()

    def op_stats(self, key: int) -> dict[str, Any] | None:
        c = self._call(key)
        if not c.ended:
            self._snapshot_stats(c)
        return c.stats

    def op_answer_mode(
        self, code: int | None, after_ms: int, speech: bytes, loop: bool, echo: bool
    ) -> None:
        self.answer = _AnswerMode(code, after_ms, _split_frames(speech), loop, echo)

    def op_forget(self, key: int) -> None:
        c = self._call(key)
        if not c.ended:
            raise SipPeerError(f"call {key} is still up; hang up first")
        del self.calls[key]

    def op_stop(self) -> None:
        self.running = False

    # -- pjsua callbacks (pump thread) -------------------------------------------------------

    def _new_call(self, acc: Any, key: int, call_id: int) -> Any:
        peer = self

        class PeerCall(pj.Call):  # type: ignore[misc]
            def onCallState(self, prm: Any) -> None:
                peer.on_call_state(key)

            def onCallMediaState(self, prm: Any) -> None:
                peer.on_media_state(key)

            def onDtmfDigit(self, prm: Any) -> None:
                peer.outbox.append(("event", "dtmf", key, str(prm.digit)))

            def onStreamDestroyed(self, prm: Any) -> None:
                c = peer.calls.get(key)
                if c is not None:
                    peer._snapshot_stats(c, int(prm.streamIdx))

        return PeerCall(acc, call_id)

    def on_incoming(self, acc: Any, prm: Any) -> None:
        key = next(self.keys)
        mode = self.answer
        # pjsua answers 500 unless a Call object exists when this callback returns.
        call = self._new_call(acc, key, prm.callId)
        c = _ChildCall(
            key=key,
            direction="in",
            call=call,
            port=_MediaPort.make(mode.speech, mode.loop, mode.echo),
            started=time.monotonic(),
        )
        self.calls[key] = c
        info = call.getInfo()
        headers = _parse_headers(str(prm.rdata.wholeMsg))
        code = _RINGING if mode.code is None else mode.code
        self.outbox.append(
            (
                "event",
                "incoming",
                key,
                {
                    "sip_call_id": str(info.callIdString),
                    "from": str(info.remoteUri),
                    "to": str(info.localUri),
                    "headers": headers,
                    "code": code,
                },
            )
        )
        if mode.code is None or mode.after_ms > 0:
            self._answer(c, _RINGING)
        if mode.code is not None:
            if mode.after_ms > 0:
                self.timers.append((time.monotonic() + mode.after_ms / 1000, key, mode.code))
            else:
                self._answer(c, mode.code)

    def _answer(self, c: _ChildCall, code: int) -> None:
        prm = pj.CallOpParam()
        prm.statusCode = code
        with contextlib.suppress(Exception):  # the caller may have cancelled meanwhile
            c.call.answer(prm)

    def on_call_state(self, key: int) -> None:
        c = self.calls.get(key)
        if c is None or c.ended:
            return
        info = c.call.getInfo()
        state = info.state
        if state == pj.PJSIP_INV_STATE_CONFIRMED and c.confirmed_at is None:
            c.confirmed_at = time.monotonic()
            self.outbox.append(
                (
                    "event",
                    "confirmed",
                    key,
                    {
                        "sip_code": int(info.lastStatusCode),
                        "reason": str(info.lastReason),
                        "setup_ms": (c.confirmed_at - c.started) * 1000.0,
                        "sip_call_id": str(info.callIdString),
                    },
                )
            )
        elif state == pj.PJSIP_INV_STATE_DISCONNECTED:
            c.ended = True
            if c.port is not None:
                c.heard = c.port.heard
                c.sent = c.port.sent_audio()
            connected = time.monotonic() - c.confirmed_at if c.confirmed_at else 0.0
            self.outbox.append(
                (
                    "event",
                    "ended",
                    key,
                    {
                        "by": "local" if c.hangup_requested else "remote",
                        "sip_code": int(info.lastStatusCode),
                        "reason": str(info.lastReason),
                        "connected_s": connected,
                        "sip_call_id": str(info.callIdString),
                    },
                )
            )
            self.release.append(c)

    def on_media_state(self, key: int) -> None:
        c = self.calls.get(key)
        if c is None or c.ended or c.media is not None:
            return
        info = c.call.getInfo()
        for mi in info.media:
            if mi.type == pj.PJMEDIA_TYPE_AUDIO and mi.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                fmt = pj.MediaFormatAudio()
                fmt.init(pj.PJMEDIA_FORMAT_PCM, SAMPLE_RATE, 1, FRAME_MS * 1000, 16)
                c.port.createPort(f"peer{key}", fmt)
                media = c.call.getAudioMedia(mi.index)
                media.startTransmit(c.port)
                c.port.startTransmit(media)
                c.media = media
                return

    def _snapshot_stats(self, c: _ChildCall, index: int | None = None) -> None:
        if c.call is None or c.media is None:
            return
        if index is None:
            index = next(
                (
                    int(mi.index)
                    for mi in c.call.getInfo().media
                    if mi.type == pj.PJMEDIA_TYPE_AUDIO
                ),
                0,
            )
        try:
            rtcp = c.call.getStreamStat(index).rtcp
        except Exception:  # stream already gone: keep the last snapshot
            return
        rx, tx = rtcp.rxStat, rtcp.txStat
        c.stats = {
            "rx_packets": int(rx.pkt),
            "rx_lost": int(rx.loss),
            "rx_discarded": int(rx.discard),
            "rx_jitter_mean_ms": float(rx.jitterUsec.mean) / 1000.0,
            "rx_jitter_max_ms": float(rx.jitterUsec.max) / 1000.0,
            "tx_packets": int(tx.pkt),
        }


def _child_main(conn: multiprocessing.connection.Connection, cfg: dict[str, Any]) -> None:
    """Entry point of the peer process: start pjsua, report the port, serve until told to stop."""
    global pj
    if cfg.get("niceness"):
        # A load generator sharing the box with what it measures yields the CPU to it.
        os.nice(int(cfg["niceness"]))
    pj = importlib.import_module("pjsua2")
    child = _Child(conn, cfg)
    try:
        port = child.start()
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", port))
    try:
        child.run()
    finally:
        child.stop()
        with contextlib.suppress(OSError):
            conn.send(("stopped",))
        conn.close()


# --------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------


@dataclass
class _ParentCall:
    confirmed: asyncio.Future[dict[str, Any] | None]
    ended: asyncio.Future[CallEnd]
    dtmf: str = ""
    dtmf_changed: asyncio.Event = field(default_factory=asyncio.Event)


_peer_ids = itertools.count(1)


class SipPeerProcess:
    """A pjsua2 SIP phone in a child process, driven with async methods from the parent.

    ``async with SipPeerProcess(bind_host="127.0.0.1") as peer:`` binds UDP on a free port
    (``peer.port``, ``peer.sip_uri``). It holds at most :data:`MAX_CALLS_PER_PROCESS` calls.
    Until :meth:`answer_incoming` is called, incoming calls ring (180) without an answer.
    """

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        *,
        port: int = 0,
        user: str = DEFAULT_USER,
        codecs: tuple[str, ...] = DEFAULT_CODECS,
        niceness: int = 0,
    ) -> None:
        if not codecs:
            raise ValueError("need at least one codec")
        self.bind_host = bind_host
        self.user = user
        self.peer_id = next(_peer_ids)
        self._cfg = {
            "bind_host": bind_host,
            "port": port,
            "user": user,
            "codecs": codecs,
            "niceness": niceness,
        }
        self._port: int | None = None
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._req_ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._calls: dict[int, _ParentCall] = {}
        self._incoming: asyncio.Queue[IncomingCallInfo] = asyncio.Queue()
        self._ready: asyncio.Future[int] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._dead: str | None = None
        # Sends can block on a full pipe while the child is itself sending (large audio):
        # one thread writes, so the event loop keeps reading and the two never deadlock.
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sip-peer-send")

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The UDP port the peer's SIP transport is bound to."""
        if self._port is None:
            raise SipPeerError("peer not started")
        return self._port

    @property
    def sip_uri(self) -> str:
        """``sip:<user>@<host>:<port>``: where to send INVITEs to this peer."""
        return f"sip:{self.user}@{self.bind_host}:{self.port}"

    @property
    def pid(self) -> int:
        """Process id of the child (for CPU accounting)."""
        if self._proc is None or self._proc.pid is None:
            raise SipPeerError("peer not started")
        return int(self._proc.pid)

    async def __aenter__(self) -> SipPeerProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Spawn the child, wait until its SIP transport is bound."""
        loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        self._conn = parent_conn
        self._ready = loop.create_future()
        self._stopped = loop.create_future()
        self._proc = ctx.Process(
            target=_child_main,
            args=(child_conn, self._cfg),
            name=f"sip-peer-{self.peer_id}",
            daemon=True,
        )
        self._proc.start()
        child_conn.close()
        loop.add_reader(parent_conn.fileno(), self._on_readable)
        try:
            self._port = await asyncio.wait_for(self._ready, START_TIMEOUT_S)
        except BaseException:
            await self._kill()
            raise

    async def close(self) -> None:
        """Hang up every call, destroy the library and wait for the child to exit."""
        if self._proc is None:
            return
        if self._dead is None and self._stopped is not None:
            with contextlib.suppress(SipPeerError, TimeoutError):
                await asyncio.wait_for(self._request("stop"), STOP_TIMEOUT_S)
                await asyncio.wait_for(asyncio.shield(self._stopped), STOP_TIMEOUT_S)
        await self._kill()

    async def _kill(self) -> None:
        proc = self._proc
        if self._conn is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._conn.fileno())
        if proc is not None:
            await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, STOP_TIMEOUT_S)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._sender.shutdown(wait=False)
        self._fail_all("peer closed")
        self._proc = None

    def _fail_all(self, why: str) -> None:
        self._dead = why
        err = SipPeerError(why)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for st in self._calls.values():
            if not st.confirmed.done():
                st.confirmed.set_exception(err)
            if not st.ended.done():
                st.ended.set_exception(err)
            # Nobody may be awaiting these: mark the exceptions retrieved.
            for fut in (st.confirmed, st.ended):
                fut.exception()
        for fut2 in (self._ready, self._stopped):
            if fut2 is not None and not fut2.done():
                fut2.set_exception(err)
                fut2.exception()

    # -- pipe --------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        assert self._conn is not None
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._conn.fileno())
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)
            self._fail_all("peer process exited")
            return
        kind = msg[0]
        if kind == "reply":
            _, req_id, ok, payload = msg
            fut = self._pending.pop(req_id, None)
            if fut is not None and not fut.done():
                if ok:
                    fut.set_result(payload)
                else:
                    fut.set_exception(SipPeerError(str(payload)))
        elif kind == "event":
            self._on_event(msg[1], msg[2], msg[3])
        elif kind == "ready" and self._ready is not None and not self._ready.done():
            self._ready.set_result(int(msg[1]))
        elif kind == "failed" and self._ready is not None and not self._ready.done():
            self._ready.set_exception(SipPeerError(f"peer failed to start: {msg[1]}"))
        elif kind == "stopped" and self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _state(self, key: int) -> _ParentCall:
        st = self._calls.get(key)
        if st is None:
            loop = asyncio.get_running_loop()
            st = self._calls[key] = _ParentCall(loop.create_future(), loop.create_future())
        return st

    def _on_event(self, kind: str, key: int, payload: Any) -> None:
        st = self._state(key)
        if kind == "confirmed":
            if not st.confirmed.done():
                st.confirmed.set_result(payload)
        elif kind == "ended":
            if not st.confirmed.done():
                st.confirmed.set_result(None)
            if not st.ended.done():
                st.ended.set_result(
                    CallEnd(
                        by=payload["by"],
                        sip_code=payload["sip_code"],
                        reason=payload["reason"],
                        connected_s=payload["connected_s"],
                    )
                )
        elif kind == "dtmf":
            st.dtmf += payload
            st.dtmf_changed.set()
        elif kind == "incoming":
            code = int(payload["code"])
            handle = CallHandle(
                key=key,
                peer_id=self.peer_id,
                direction="in",
                sip_call_id=payload["sip_call_id"],
                sip_code=code,
                answered=code == 200,
                setup_ms=None,
                reason="incoming",
            )
            self._incoming.put_nowait(
                IncomingCallInfo(
                    handle=handle,
                    from_uri=payload["from"],
                    to_uri=payload["to"],
                    headers=payload["headers"],
                )
            )

    async def _request(self, op: str, **args: Any) -> Any:
        if self._dead is not None or self._conn is None:
            raise SipPeerError(self._dead or "peer not started")
        req_id = next(self._req_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        conn = self._conn
        await asyncio.get_running_loop().run_in_executor(
            self._sender, conn.send, (req_id, op, args)
        )
        return await fut

    def _check(self, h: CallHandle) -> None:
        if h.peer_id != self.peer_id:
            raise SipPeerError(f"call {h.key} belongs to another peer")

    # -- calls -------------------------------------------------------------------------------

    async def place_call(
        self,
        uri: str,
        *,
        speech: bytes | None = None,
        loop: bool = True,
        headers: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        answer_timeout_s: float = DEFAULT_ANSWER_TIMEOUT_S,
    ) -> CallHandle:
        """Send INVITE to ``uri`` and return once it is answered (200) or failed.

        ``speech`` (PCM16 mono 16 kHz) is sent from answer on, repeated if ``loop`` else once
        then silence. ``headers`` go on the INVITE, ``auth`` = (user, password) answers a
        digest challenge. On ``answer_timeout_s`` without a final answer the call is cancelled
        and :class:`TimeoutError` raised. Local refusals (5th call, bad URI) raise
        :class:`SipPeerError`.
        """
        pcm = speech or b""
        if len(pcm) % 2:
            raise ValueError("speech must be PCM16: an even number of bytes")
        key = await self._request(
            "call",
            uri=uri,
            speech=pcm,
            loop=loop,
            headers=dict(headers or {}),
            auth=tuple(auth) if auth else None,
        )
        st = self._state(key)
        try:
            confirmed = await asyncio.wait_for(asyncio.shield(st.confirmed), answer_timeout_s)
        except TimeoutError:
            with contextlib.suppress(SipPeerError):
                await self._request("hangup", key=key, code=0)
            raise TimeoutError(f"no final answer from {uri} in {answer_timeout_s} s") from None
        if confirmed is not None:
            return CallHandle(
                key=key,
                peer_id=self.peer_id,
                direction="out",
                sip_call_id=confirmed["sip_call_id"],
                sip_code=confirmed["sip_code"],
                answered=True,
                setup_ms=confirmed["setup_ms"],
                reason=confirmed["reason"],
            )
        end = st.ended.result()
        return CallHandle(
            key=key,
            peer_id=self.peer_id,
            direction="out",
            sip_call_id="",
            sip_code=end.sip_code,
            answered=False,
            setup_ms=None,
            reason=end.reason,
        )

    async def send_dtmf(self, h: CallHandle, digits: str) -> None:
        """Send ``digits`` (0-9, *, #, A-D) as RFC 2833 telephone-events."""
        self._check(h)
        bad = set(digits.upper()) - set("0123456789*#ABCD")
        if not digits or bad:
            raise ValueError(f"DTMF digits must be 0-9*#A-D, got {digits!r}")
        await self._request("dtmf", key=h.key, digits=digits)

    async def hang_up(self, h: CallHandle, code: int = 0) -> None:
        """End the call (BYE, CANCEL, or ``code`` as the answer to an unanswered incoming call).

        Returns once the request is sent; :meth:`wait_ended` waits for the end. Hanging up an
        ended call does nothing.
        """
        self._check(h)
        await self._request("hangup", key=h.key, code=code)

    async def wait_ended(self, h: CallHandle, timeout: float) -> CallEnd:  # noqa: ASYNC109 - per-wait deadline
        """Wait until the call is disconnected; raises TimeoutError after ``timeout`` s."""
        self._check(h)
        return await asyncio.wait_for(asyncio.shield(self._state(h.key).ended), timeout)

    async def received_audio(self, h: CallHandle) -> bytes:
        """PCM16 mono 16 kHz of everything the peer heard on the call so far (or in total)."""
        self._check(h)
        heard, _ = await self._request("audio", key=h.key)
        return bytes(heard)

    async def sent_audio(self, h: CallHandle) -> bytes:
        """PCM16 mono 16 kHz of exactly what the peer sent on the call so far (echo: empty)."""
        self._check(h)
        _, sent = await self._request("audio", key=h.key)
        return bytes(sent)

    def received_dtmf(self, h: CallHandle) -> str:
        """The DTMF digits received on the call so far."""
        self._check(h)
        return self._state(h.key).dtmf

    async def wait_dtmf(self, h: CallHandle, count: int, timeout: float) -> str:  # noqa: ASYNC109 - per-wait deadline
        """Wait until ``count`` digits arrived; returns them. TimeoutError otherwise."""
        self._check(h)
        st = self._state(h.key)

        async def enough() -> str:
            while len(st.dtmf) < count:
                st.dtmf_changed.clear()
                await st.dtmf_changed.wait()
            return st.dtmf

        return await asyncio.wait_for(enough(), timeout)

    async def rtp_stats(self, h: CallHandle) -> RtpStats | None:
        """RTP/RTCP stats of the call's audio stream; after the end, the last snapshot.

        ``None`` when the call never had media.
        """
        self._check(h)
        stats = await self._request("stats", key=h.key)
        return None if stats is None else RtpStats(**stats)

    async def forget(self, h: CallHandle) -> None:
        """Drop an ended call's recording and stats from the child (frees its memory)."""
        self._check(h)
        await self._request("forget", key=h.key)
        self._calls.pop(h.key, None)

    # -- answering ---------------------------------------------------------------------------

    async def answer_incoming(
        self,
        code: int | None = 200,
        after_ms: int = 0,
        *,
        speech: bytes | None = None,
        loop: bool = True,
        echo: bool = False,
    ) -> None:
        """Set how calls arriving from now on are answered.

        ``code`` 200 answers, 300-699 rejects (486 busy, 603 decline, ...), ``None`` rings
        forever (180); the answer is delayed ``after_ms`` with 180 Ringing meanwhile.
        Answered calls send ``speech`` (PCM16 16 kHz, looped if ``loop``) or, with ``echo``,
        play back what they hear 20-40 ms later (a reflector).
        """
        if code is not None and code != 200 and not 300 <= code <= 699:
            raise ValueError(f"answer code must be 200, 300-699 or None, got {code}")
        if after_ms < 0:
            raise ValueError(f"after_ms must be >= 0, got {after_ms}")
        if echo and speech:
            raise ValueError("echo mode plays back what it hears; it cannot also send speech")
        pcm = speech or b""
        if len(pcm) % 2:
            raise ValueError("speech must be PCM16: an even number of bytes")
        await self._request(
            "answer_mode", code=code, after_ms=after_ms, speech=pcm, loop=loop, echo=echo
        )

    async def next_incoming(self, timeout: float) -> IncomingCallInfo:  # noqa: ASYNC109 - per-wait deadline
        """The next call that arrived (in arrival order); TimeoutError after ``timeout`` s."""
        return await asyncio.wait_for(self._incoming.get(), timeout)
