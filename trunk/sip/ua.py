"""The pjsua2 user agent of the SIP worker: one library instance, one thread.

``SipUserAgent`` owns pjsua2 for the whole process. A dedicated thread creates
the library, pumps ``libHandleEvents`` and runs every pjsua2 call the asyncio
side asks for (commands are closures on a ``queue.SimpleQueue``, results come
back through futures). Events go to asyncio only through one FIFO outbox drained
by a ``loop.call_soon_threadsafe`` callback, scheduled once per batch rather than
once per event. Per-call audio is bridged by an
``AudioMediaPort`` at 16 kHz / 20 ms / mono / 16 bit whose callbacks run on
pjmedia's clock thread and never block. No policy here: the worker decides.
Threading and lifecycle rules: trunk/sip/PJSUA2.md.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import gc
import itertools
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import pjsua2 as pj  # type: ignore[import-untyped]  # SWIG module without stubs

from rutster.trunk.sip.leg_playout import DEFAULT_FRAME_BYTES, LegPlayout
from rutster.trunk.sip.non_digest_credentials import strip_non_digest_credentials
from rutster.trunk.sip.pj_banner import lib_create_quietly
from rutster.trunk.sip.pj_dropped_packets import DroppedPacketHook

__all__ = [
    "DEFAULT_CODECS",
    "WHEEL_MAX_CALLS",
    "InviteArrived",
    "InviteInfo",
    "InviteRefusal",
    "InviteScreen",
    "LegAudio",
    "LegConnected",
    "LegDtmf",
    "LegEnded",
    "LegFailed",
    "LegMarks",
    "LegTransferResult",
    "SipEvent",
    "SipTrunk",
    "SipUaError",
    "SipUserAgent",
    "UaSettings",
    "UnparsedReport",
]

_log = logging.getLogger(__name__)

#: Calls per process: the pjsua2-python 2.15.1 wheel is built with
#: PJSUA_MAX_CALLS = 4 and answers PJ_ETOOMANY on the 5th call whatever
#: UaConfig.maxCalls says (measured, issue 6 design). Capacity therefore comes
#: from a pool of worker processes, not from this number.
WHEEL_MAX_CALLS = 4
#: Codecs offered/accepted, in priority order (issue 6 design: the trunk's
#: G.711 first, G.722 wideband when the peer offers it; all three are in the wheel).
DEFAULT_CODECS: tuple[str, ...] = ("PCMU/8000", "PCMA/8000", "G722/16000")
#: Highest pjmedia codec priority (PJMEDIA_CODEC_PRIO_HIGHEST); listed codecs
#: get 255, 254, ... in order, everything else 0 (disabled).
_CODEC_PRIORITY_TOP = 255
#: The bridge port format (issue 6 design): L16 mono 16 kHz, 20 ms frames.
PORT_CLOCK_RATE = 16_000
PORT_FRAME_USEC = 20_000
PORT_BITS_PER_SAMPLE = 16
PORT_CHANNELS = 1
#: libHandleEvents timeout per loop turn while a leg is being set up (an inbound leg
#: waiting for answer/reject, an outbound leg dialling): a command waits for the next
#: turn, so this bounds the answer's latency to ~10 ms (brief). pjsua's own timers
#: (retransmissions) and incoming packets end a turn early whatever the timeout.
_POLL_MS = 10
#: libHandleEvents timeout otherwise (every leg connected, or none): a turn costs ~100 us
#: of CPU on the dev VM, and an idle user agent's pjsua thread measured 1.0 % of a core at
#: 10 ms vs 0.55 % at 20 ms. Only hang-up, transfer and a dial from idle wait longer (<= 20 ms
#: more; setup_ms of a dial counts from makeCall), none of them latency-critical.
_STEADY_POLL_MS = 20
#: How long start() waits for the pjsua thread to bring transports up (measured:
#: libCreate..libStart takes ~0.1 s; generous for a loaded CI box).
_START_TIMEOUT_S = 20.0
#: How long stop() lets BYE/CANCEL transactions finish before forcing release
#: (seed decision: enough for a loopback/LAN 200 OK; a dead peer costs 2 s).
_STOP_HANGUP_WAIT_S = 2.0
#: How long a disconnected bridge port lives on before it is destroyed: five 20 ms
#: clock ticks, so no frame callback can still be running in it.
PORT_RETIRE_S = 0.1
#: Join timeout for the pjsua thread after libDestroy was requested (seed decision).
_JOIN_TIMEOUT_S = 15.0
#: Attempts to find a port free for both UDP and TCP when port 0 is asked (seed decision).
_PORT_PICK_ATTEMPTS = 8
#: Bounds of the parsed INVITE headers (seed decision; the gateway forwards at
#: most 16 headers of 256 chars, the worker filters from these).
MAX_INVITE_HEADERS = 64
MAX_HEADER_VALUE_CHARS = 1_024
#: Default final code for hang_up() on an unanswered inbound call (RFC 3261 603 Decline).
_DECLINE_CODE = 603
#: pjlib status for "too many objects" (PJ_ERRNO_START_STATUS 70000 + 10),
#: what pjsua returns when all call slots are in use.
_PJ_ETOOMANY = 70_010

Transport = Literal["udp", "tcp"]
EndReason = Literal["remote_bye", "local_hangup", "cancelled", "transferred", "error"]

# RFC 3261 7.3.3 compact header forms, expanded so lookups use one name.
_COMPACT_HEADERS = {
    "i": "call-id",
    "f": "from",
    "t": "to",
    "m": "contact",
    "v": "via",
    "l": "content-length",
    "c": "content-type",
    "k": "supported",
    "s": "subject",
    "e": "content-encoding",
    "o": "event",
    "r": "refer-to",
    "b": "referred-by",
    "u": "allow-events",
    "x": "session-expires",
}
_TOKEN_RE = re.compile(r"^[A-Za-z0-9!%*_+`'~.\-]+$")
_VIA_TRANSPORT_RE = re.compile(r"SIP\s*/\s*2\.0\s*/\s*([A-Za-z]+)", re.IGNORECASE)


class SipUaError(Exception):
    """A user-agent command failed; ``reason`` is a stable label, ``message`` the detail.

    Reasons: ``not_running``, ``bind_failed``, ``start_failed``, ``unknown_leg``,
    ``bad_state``, ``bad_argument``, ``worker_full``, ``pjsua_error``.
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class SipTrunk:
    """The upstream trunk: outbound calls go through it with digest credentials."""

    uri: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    register: bool = False
    realm: str = "*"


#: RFC 3261 §21.4.4 403 Forbidden: the default answer to anything we do not serve.
SIP_FORBIDDEN = 403


@dataclass(frozen=True, slots=True)
class UaSettings:
    """Everything the user agent needs; ``port`` / ``rtp_port`` 0 = pick a free one."""

    bind_host: str
    port: int
    public_host: str | None = None
    user_agent: str = "rutster"
    trunk: SipTrunk | None = None
    codecs: tuple[str, ...] = DEFAULT_CODECS
    rtp_port: int = 0
    log_level: int = 0
    #: Answer to requests we do not serve (presence SUBSCRIBE): the worker's uniform code.
    reject_code: int = SIP_FORBIDDEN


@dataclass(frozen=True, slots=True)
class InviteInfo:
    """What an incoming INVITE said; ``headers`` has lower-cased names, bounded."""

    sip_call_id: str
    from_uri: str
    to_uri: str
    request_uri: str
    source: str
    transport: Transport
    headers: Mapping[str, str]
    authorization: str | None


@dataclass(frozen=True, slots=True)
class InviteRefusal:
    """How an INVITE screened out on the pjsua thread is answered (status and headers)."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()


#: Told, on the pjsua thread, of each request pjsip's parser refused: ``"unparseable"`` when it
#: stays dropped, else the scheme (``basic``, ``bearer``, ``other``) of each credential field
#: taken out so the request could be answered (trunk/sip/non_digest_credentials.py).
UnparsedReport = Callable[[str], None]
#: What :data:`UnparsedReport` is told for a refused message left dropped.
UNPARSEABLE = "unparseable"

#: Judges an incoming INVITE on the pjsua thread, before any leg is announced: None
#: lets it through (``InviteArrived``), a refusal answers it at once.
InviteScreen = Callable[[InviteInfo], InviteRefusal | None]


@dataclass(frozen=True, slots=True)
class InviteArrived:
    """A new inbound leg waits for ring/answer/reject (pjsua already sent 100 Trying)."""

    leg: int
    info: InviteInfo


@dataclass(frozen=True, slots=True)
class LegConnected:
    """The leg is CONFIRMED; ``setup_ms`` from makeCall / INVITE arrival."""

    leg: int
    setup_ms: float
    codec: str
    sip_call_id: str = ""


@dataclass(frozen=True, slots=True)
class LegFailed:
    """An outbound leg ended without ever connecting (terminal)."""

    leg: int
    sip_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class LegDtmf:
    """A DTMF digit (RFC 2833 telephone-event) from the remote side."""

    leg: int
    digit: str


@dataclass(frozen=True, slots=True)
class LegAudio:
    """One received 20 ms frame of L16 16 kHz mono audio."""

    leg: int
    pcm: bytes


@dataclass(frozen=True, slots=True)
class LegMarks:
    """Marks whose preceding audio has been fully handed to pjsua for playout."""

    leg: int
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LegEnded:
    """An inbound leg, or an outbound leg that had connected, is gone (terminal)."""

    leg: int
    reason: EndReason
    sip_code: int


@dataclass(frozen=True, slots=True)
class LegTransferResult:
    """Final outcome of a REFER (NOTIFY sipfrag status)."""

    leg: int
    ok: bool
    sip_code: int


SipEvent = (
    InviteArrived
    | LegConnected
    | LegFailed
    | LegDtmf
    | LegAudio
    | LegMarks
    | LegEnded
    | LegTransferResult
)

_T = TypeVar("_T")


# --- ByteVector access --------------------------------------------------------------------
# bytes(frame.buf) iterates the SWIG std::vector element by element: ~215 us per
# 640-byte frame (measured). Reading libstdc++'s vector (begin, end pointers at
# offsets 0 and 8) with ctypes takes ~1.3 us. The layout is verified at import
# against known vectors; on any mismatch the slow, always-correct path is used.


def _bytevector_slow(vector: Any) -> bytes:
    return bytes(vector)


def _bytevector_fast(vector: Any) -> bytes:
    address = int(vector.this)
    begin = ctypes.c_void_p.from_address(address).value
    end = ctypes.c_void_p.from_address(address + ctypes.sizeof(ctypes.c_void_p)).value
    if not begin or not end or end <= begin:
        return b""
    return ctypes.string_at(begin, end - begin)


def _pick_bytevector_reader() -> Callable[[Any], bytes]:
    try:
        samples = [b"", b"\x01", bytes(range(256)) * 2 + bytes(128), b"\xff" * 3]
        for sample in samples:
            if _bytevector_fast(pj.ByteVector(sample)) != sample:
                return _bytevector_slow
        frame = pj.MediaFrame()
        frame.buf = pj.ByteVector(samples[2])
        if _bytevector_fast(frame.buf) != samples[2]:
            return _bytevector_slow
    except Exception:
        return _bytevector_slow
    return _bytevector_fast


_read_bytevector = _pick_bytevector_reader()


def bytevector_reader_is_fast() -> bool:
    """True when the ctypes ByteVector reader passed its self-check (diagnostics)."""
    return _read_bytevector is _bytevector_fast


# Writing a frame: frame.buf = pj.ByteVector(pcm) converts the bytes element by element
# (~10.5 us per 640-byte frame, measured). Resizing the frame's own vector (``frame.buf``
# is SWIG's pointer to the member, not a copy) and copying into its storage with ctypes
# takes ~2.8 us. Verified at import with the always-correct bytes() reader; on any
# mismatch the slow path is used.


def _frame_writer_slow(frame: Any, pcm: bytes) -> None:
    frame.buf = pj.ByteVector(pcm)


def _frame_writer_fast(frame: Any, pcm: bytes) -> None:
    size = len(pcm)
    vector = frame.buf
    vector.resize(size)
    if size:
        begin = ctypes.c_void_p.from_address(int(vector.this)).value
        if begin is None:  # a resized non-empty vector has storage: never copy to NULL
            raise RuntimeError("ByteVector without storage after resize")
        ctypes.memmove(begin, pcm, size)


def _pick_frame_writer() -> Callable[[Any, bytes], None]:
    try:
        frame = pj.MediaFrame()
        # Grow, shrink, empty and regrow the same frame's vector.
        for sample in (bytes(range(256)) * 2 + bytes(128), b"\x07" * 3, b"", b"\xfe\x01" * 320):
            _frame_writer_fast(frame, sample)
            if bytes(frame.buf) != sample:
                return _frame_writer_slow
    except Exception:
        return _frame_writer_slow
    return _frame_writer_fast


_write_frame = _pick_frame_writer()


def frame_writer_is_fast() -> bool:
    """True when the ctypes frame writer passed its self-check (diagnostics)."""
    return _write_frame is _frame_writer_fast


# --- INVITE parsing -----------------------------------------------------------------------


def parse_sip_headers(message: str) -> tuple[str, dict[str, str]]:
    """Split a SIP message into its start line and headers (bounded, names lower-cased).

    Folded lines are unfolded, compact names expanded, repeated headers joined
    with ``,`` (RFC 3261 7.3.1); at most ``MAX_INVITE_HEADERS`` names are kept
    and values are cut to ``MAX_HEADER_VALUE_CHARS``. Never raises on garbage.
    """
    head = re.split(r"\r?\n\r?\n", message, maxsplit=1)[0]
    lines = re.split(r"\r?\n", head)
    start_line = lines[0].strip() if lines else ""
    unfolded: list[str] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and unfolded:
            unfolded[-1] += " " + line.strip()
        else:
            unfolded.append(line)
    headers: dict[str, str] = {}
    for line in unfolded:
        name, sep, value = line.partition(":")
        name = name.strip().lower()
        if not sep or not name or not _TOKEN_RE.match(name):
            continue
        name = _COMPACT_HEADERS.get(name, name)
        value = value.strip()
        if name in headers:
            value = headers[name] + "," + value
        elif len(headers) >= MAX_INVITE_HEADERS:
            continue
        headers[name] = value[:MAX_HEADER_VALUE_CHARS]
    return start_line, headers


def _uri_of(name_addr: str) -> str:
    """The URI of a From/To value: inside <...> when present, else before any ';'."""
    start = name_addr.find("<")
    if start >= 0:
        end = name_addr.find(">", start)
        return name_addr[start + 1 : end if end > start else None].strip()
    return name_addr.split(";", 1)[0].strip()


def _transport_of(via: str) -> Transport:
    match = _VIA_TRANSPORT_RE.search(via)
    return "tcp" if match is not None and match.group(1).lower() == "tcp" else "udp"


def invite_info_from_message(message: str, source: str) -> InviteInfo:
    """Build an InviteInfo from the raw INVITE text and its source ``ip:port``."""
    start_line, headers = parse_sip_headers(message)
    parts = start_line.split()
    request_uri = parts[1] if len(parts) >= 3 else ""
    top_via = headers.get("via", "").split(",", 1)[0]
    return InviteInfo(
        sip_call_id=headers.get("call-id", ""),
        from_uri=_uri_of(headers.get("from", "")),
        to_uri=_uri_of(headers.get("to", "")),
        request_uri=request_uri,
        source=source,
        transport=_transport_of(top_via),
        headers=headers,
        authorization=headers.get("authorization"),
    )


def failure_reason(sip_code: int) -> str:
    """Label for an outbound leg that never connected, from its final SIP code."""
    if sip_code in (486, 600):
        return "busy"
    if sip_code in (603, 607):
        return "declined"
    if sip_code in (404, 484, 604):
        return "not_found"
    if sip_code in (408, 480, 487):
        return "no_answer"
    if sip_code in (401, 403, 407):
        return "unauthorized"
    return "error"


#: Extra headers of a request or answer: a mapping, or (name, value) pairs when a name
#: repeats (a 401 offering one WWW-Authenticate challenge per digest algorithm).
ExtraHeaders = Mapping[str, str] | Sequence[tuple[str, str]]


def _header_pairs(headers: ExtraHeaders | None) -> list[tuple[str, str]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return [(str(name), str(value)) for name, value in headers]


def _validate_headers(headers: Sequence[tuple[str, str]]) -> None:
    for name, value in headers:
        if not _TOKEN_RE.match(name):
            raise SipUaError("bad_argument", f"bad header name {name!r}")
        if "\r" in value or "\n" in value or "\x00" in value:
            raise SipUaError("bad_argument", f"header {name} has a line break or NUL")


def _header_vector(headers: Sequence[tuple[str, str]]) -> Any:
    vector = pj.SipHeaderVector()
    for name, value in headers:
        header = pj.SipHeader()
        header.hName = name
        header.hValue = value
        vector.append(header)
    return vector


def _call_param(status_code: int = 0, headers: Sequence[tuple[str, str]] | None = None) -> Any:
    prm = pj.CallOpParam(True)
    prm.opt.audioCount = 1
    prm.opt.videoCount = 0
    if status_code:
        prm.statusCode = status_code
    if headers:
        prm.txOption.headers = _header_vector(headers)
    return prm


# --- per-leg state --------------------------------------------------------------------------


class _LegAudio:
    """The leg's playout queue and its lock (shared by asyncio and the clock thread)."""

    __slots__ = ("lock", "playout")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.playout = LegPlayout(frame_bytes=DEFAULT_FRAME_BYTES)


@dataclass(slots=True)
class _Leg:
    """pjsua-thread-only state of one call."""

    leg: int
    call: _Call
    direction: Literal["in", "out"]
    started: float
    audio: _LegAudio
    announced: bool = False
    answered: bool = False
    connected: bool = False
    ending: bool = False
    local_end: EndReason | None = None
    transfer_pending: bool = False
    port: _LegPort | None = None
    call_audio: Any = None


class _LegPort(pj.AudioMediaPort):  # type: ignore[misc]
    """The per-call bridge port; its callbacks run on pjmedia's clock thread."""

    def __init__(self, ua: SipUserAgent, leg: int, audio: _LegAudio) -> None:
        super().__init__()
        self._ua = ua
        self._leg = leg
        self._audio = audio

    def onFrameReceived(self, frame: Any) -> None:
        try:
            if frame.type != pj.PJMEDIA_FRAME_TYPE_AUDIO or frame.size <= 0:
                return
            pcm = _read_bytevector(frame.buf)
            if len(pcm) > frame.size:
                pcm = pcm[: frame.size]
            self._ua._emit(LegAudio(self._leg, pcm))
        except Exception:  # a director exception must never reach pjmedia
            _log.exception("onFrameReceived failed")

    def onFrameRequested(self, frame: Any) -> None:
        try:
            audio = self._audio
            with audio.lock:
                pcm, marks = audio.playout.pull()
            frame.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            _write_frame(frame, pcm)
            frame.size = len(pcm)
            if marks:
                self._ua._emit(LegMarks(self._leg, marks))
        except Exception:
            _log.exception("onFrameRequested failed")


class _Call(pj.Call):  # type: ignore[misc]
    """pjsua2 call whose callbacks forward to the user agent (pjsua thread, DTMF: media thread)."""

    def __init__(self, ua: SipUserAgent, account: _Account, call_id: int | None = None) -> None:
        if call_id is None:
            super().__init__(account)
        else:
            super().__init__(account, call_id)
        self.ua = ua
        self.leg = -1

    def onCallState(self, prm: Any) -> None:
        try:
            self.ua._on_call_state(self)
        except Exception:
            _log.exception("onCallState failed")

    def onCallMediaState(self, prm: Any) -> None:
        try:
            self.ua._on_call_media_state(self)
        except Exception:
            _log.exception("onCallMediaState failed")

    def onDtmfDigit(self, prm: Any) -> None:
        try:
            digit = str(prm.digit)
            if self.leg >= 0 and digit:
                self.ua._emit(LegDtmf(self.leg, digit))
        except Exception:
            _log.exception("onDtmfDigit failed")

    def onCallTransferStatus(self, prm: Any) -> None:
        try:
            self.ua._on_transfer_status(self, prm)
        except Exception:
            _log.exception("onCallTransferStatus failed")


class _Account(pj.Account):  # type: ignore[misc]
    """pjsua2 account whose incoming calls go to the user agent (pjsua thread)."""

    def __init__(self, ua: SipUserAgent) -> None:
        super().__init__()
        self.ua = ua

    def onIncomingCall(self, prm: Any) -> None:
        try:
            self.ua._on_incoming_call(self, prm)
        except Exception:
            _log.exception("onIncomingCall failed")

    def onRegState(self, prm: Any) -> None:
        _log.info("trunk registration: %s %s", prm.code, prm.reason)

    def onIncomingSubscribe(self, prm: Any) -> None:
        # pjsua would accept a presence SUBSCRIBE from anyone (200, then NOTIFYs to a
        # possibly spoofed address): we serve calls only, so refuse, like any stranger.
        code = self.ua.settings.reject_code
        prm.code = code
        prm.reason = "Forbidden" if code == SIP_FORBIDDEN else "Rejected"


# --- the user agent -------------------------------------------------------------------------


class SipUserAgent:
    """Thread-safe facade over the process's single pjsua2 library instance.

    ``start()``/``stop()`` block (call them from a thread or before the loop
    is busy); commands are coroutines for the asyncio thread; ``play``,
    ``mark`` and ``clear`` are plain non-blocking calls from any thread.
    Every inbound leg (after ``InviteArrived``) and every outbound leg that
    connected ends with exactly one ``LegEnded``; an outbound leg that never
    connected ends with exactly one ``LegFailed``.

    ``screen`` (optional) judges each INVITE on the pjsua thread itself: one it
    refuses is answered within the callback, so it never holds one of the
    wheel's few call slots (:data:`WHEEL_MAX_CALLS`) while the loop thread gets
    to it. Round-tripped through asyncio, a scanner's INVITEs filled the slots
    under load and pjsua answered the next ones 486 Busy Here on its own, which
    told the scanner apart from the uniform refusal (an "extension" found).
    """

    def __init__(
        self,
        settings: UaSettings,
        on_event: Callable[[SipEvent], None],
        loop: asyncio.AbstractEventLoop,
        *,
        screen: InviteScreen | None = None,
        on_unparsed: UnparsedReport | None = None,
    ) -> None:
        self.settings = settings
        self._on_event = on_event
        self._screen = screen
        self._on_unparsed = on_unparsed
        # Hands pjsip back, without the field, the requests it refused that carry non-Digest
        # credentials (trunk/sip/pj_dropped_packets.py).
        self._dropped_packets = DroppedPacketHook(self._repair_refused)
        self._loop = loop
        self._commands: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: SipUaError | None = None
        self._running = False
        self._stop_requested = False
        self._state_lock = threading.Lock()
        self._ep: Any = None
        self._transport_ids: list[int] = []
        self._local_account: _Account | None = None
        self._trunk_account: _Account | None = None
        self._legs: dict[int, _Leg] = {}  # pjsua thread only
        # Read from any thread (dict get/set are atomic under the GIL); written
        # only on the pjsua thread.
        self._audio: dict[int, _LegAudio] = {}
        self._pending_release: list[int] = []
        #: INVITEs the screen refused, answered right after the callback (pjsua thread).
        self._screened: list[tuple[int, InviteRefusal]] = []
        #: Disconnected bridge ports kept alive until no clock tick can be inside them.
        self._retired_ports: list[tuple[float, _LegPort]] = []
        self._leg_ids = itertools.count(1)
        self._sip_port = 0
        #: Audio refused by play() (unknown leg or over the playout bound), bytes.
        self.dropped_audio_bytes = 0
        #: Events that could not be delivered because the loop was closed.
        self.dropped_events = 0
        # Events on their way to the loop, in emission order. Appended by the pjsua,
        # clock and ioqueue threads, emptied on the loop (deque append/popleft are
        # atomic under the GIL, so no lock: the clock thread never waits here).
        self._outbox: collections.deque[SipEvent] = collections.deque()
        # True while a _deliver callback is scheduled and has not started yet: only
        # the emit that finds it False schedules one, so one clock tick's frames and
        # marks for every leg cost one loop wake-up instead of one per frame.
        self._delivery_scheduled = False

    # -- public properties ----------------------------------------------------------------

    @property
    def sip_port(self) -> int:
        """The SIP port (UDP and TCP) actually bound; 0 before start()."""
        return self._sip_port

    @property
    def active_legs(self) -> int:
        """Legs that exist (announced or dialling) and are not yet released."""
        return len(self._audio)

    @property
    def running(self) -> bool:
        """True between a successful start() and stop()."""
        return self._running

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the pjsua thread; block until transports are up (raises SipUaError)."""
        with self._state_lock:
            if self._thread is not None:
                raise SipUaError("bad_state", "start() called twice")
            self._thread = threading.Thread(target=self._run, name="pjsua", daemon=True)
            self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S):
            raise SipUaError("start_failed", "pjsua thread did not start in time")
        if self._start_error is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            raise self._start_error

    def stop(self) -> None:
        """Hang up every leg, release calls/ports/accounts, libDestroy, join the thread."""
        with self._state_lock:
            thread = self._thread
            self._stop_requested = True
        if thread is None:
            return
        thread.join(_JOIN_TIMEOUT_S)
        if thread.is_alive():
            _log.error("pjsua thread did not stop within %.0f s", _JOIN_TIMEOUT_S)
        self._fail_pending_commands()

    # -- commands (asyncio thread) ----------------------------------------------------------

    async def ring(self, leg: int) -> None:
        """Send 180 Ringing on an unanswered inbound leg."""
        await self._submit(lambda: self._do_ring(leg))

    async def answer(self, leg: int) -> None:
        """Answer an inbound leg with 200 OK + SDP."""
        await self._submit(lambda: self._do_answer(leg))

    async def reject(self, leg: int, code: int, headers: ExtraHeaders | None = None) -> None:
        """Send a final non-2xx (300-699) to an unanswered inbound leg, with extra headers."""
        extra = _header_pairs(headers)
        if not 300 <= code <= 699:
            raise SipUaError("bad_argument", f"reject code must be 300-699, got {code}")
        _validate_headers(extra)
        await self._submit(lambda: self._do_reject(leg, code, extra))

    async def dial(
        self, uri: str, from_uri: str | None = None, headers: ExtraHeaders | None = None
    ) -> int:
        """Place an outbound call (through the trunk when configured); return its leg."""
        extra = _header_pairs(headers)
        _validate_headers(extra)
        if any(ch in uri for ch in "\r\n\x00 ") or (
            from_uri is not None and any(ch in from_uri for ch in "\r\n\x00")
        ):
            raise SipUaError("bad_argument", "uri contains whitespace or a line break")
        result: int = await self._submit(lambda: self._do_dial(uri, from_uri, extra))
        return result

    async def hang_up(self, leg: int) -> None:
        """End a leg: BYE when connected, CANCEL when dialling, 603 when ringing inbound."""
        await self._submit(lambda: self._do_hang_up(leg))

    async def transfer(self, leg: int, target_uri: str) -> None:
        """Send REFER to a connected leg; the outcome arrives as LegTransferResult."""
        if any(ch in target_uri for ch in "\r\n\x00 "):
            raise SipUaError("bad_argument", "target contains whitespace or a line break")
        await self._submit(lambda: self._do_transfer(leg, target_uri))

    # -- audio (any thread, non-blocking) -------------------------------------------------------

    def play(self, leg: int, pcm: bytes) -> int:
        """Queue L16 16 kHz audio for the leg; return bytes dropped (unknown leg, bound)."""
        audio = self._audio.get(leg)
        if audio is None:
            self.dropped_audio_bytes += len(pcm)
            return len(pcm)
        with audio.lock:
            dropped = audio.playout.push(pcm)
        self.dropped_audio_bytes += dropped
        return dropped

    def mark(self, leg: int, name: str) -> bool:
        """Queue a mark after the audio queued so far; False when the leg is unknown."""
        audio = self._audio.get(leg)
        if audio is None:
            return False
        with audio.lock:
            audio.playout.mark(name)
        return True

    def clear(self, leg: int) -> bool:
        """Drop the leg's queued audio and pending marks; False when the leg is unknown."""
        audio = self._audio.get(leg)
        if audio is None:
            return False
        with audio.lock:
            audio.playout.clear()
        return True

    # -- plumbing ---------------------------------------------------------------------------------

    async def _submit(self, fn: Callable[[], _T]) -> _T:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._state_lock:
            if not self._running or self._stop_requested:
                raise SipUaError("not_running", "the user agent is not running")
            self._commands.put((fn, future))
        return await asyncio.wrap_future(future)

    def _fail_pending_commands(self) -> None:
        while True:
            try:
                _fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.done():
                future.set_exception(SipUaError("not_running", "the user agent stopped"))

    def _emit(self, event: SipEvent) -> None:
        """Hand an event to the asyncio loop (any thread, never blocks)."""
        self._outbox.append(event)
        # A closed loop never runs the scheduled delivery: go and find out, so the
        # outbox is dropped (and counted) instead of growing.
        if self._delivery_scheduled and not self._loop.is_closed():
            return
        # Two threads may both get here: the second delivery finds nothing, harmless.
        self._delivery_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # loop closed: nobody is listening any more
            self._delivery_scheduled = False
            self._drop_outbox()

    def _deliver(self) -> None:
        """On the loop: hand every queued event to the handler, in emission order."""
        # Cleared before reading the length: an event appended after this point either
        # is counted below or finds the flag False and schedules the next delivery.
        self._delivery_scheduled = False
        outbox = self._outbox
        on_event = self._on_event
        # Only what is there now: a steady stream of frames must not starve the loop.
        for _ in range(len(outbox)):
            event = outbox.popleft()
            try:
                on_event(event)
            except Exception as exc:
                # What the loop did when each event was its own callback: report it
                # and go on with the next event.
                name = type(event).__name__
                self._loop.call_exception_handler(
                    {
                        "message": f"SIP event handler failed on {name} (leg {event.leg})",
                        "exception": exc,
                    }
                )

    def _drop_outbox(self) -> None:
        while True:
            try:
                self._outbox.popleft()
            except IndexError:
                return
            self.dropped_events += 1

    # -- the pjsua thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._init_library()
        except SipUaError as exc:
            # A fresh exception: the original's traceback holds frames whose locals
            # keep the Endpoint alive, and pjsua2 allows one Endpoint per process.
            self._start_error = SipUaError(exc.reason, exc.message)
        except pj.Error as exc:
            self._start_error = SipUaError("start_failed", str(exc.info()))
        except Exception as exc:
            self._start_error = SipUaError("start_failed", repr(exc))
        if self._start_error is not None:
            self._destroy_library()
            self._started.set()
            return
        with self._state_lock:
            self._running = True
        self._started.set()
        try:
            while not self._stop_requested:
                self._ep.libHandleEvents(_POLL_MS if self._setting_up() else _STEADY_POLL_MS)
                self._refuse_screened()
                self._drain_commands()
                self._release_pending()
        except Exception:
            _log.exception("pjsua loop failed")
        finally:
            with self._state_lock:
                self._running = False
            self._shutdown()

    def _init_library(self) -> None:
        settings = self.settings
        ep = pj.Endpoint()
        self._ep = ep
        lib_create_quietly(ep)
        cfg = pj.EpConfig()
        cfg.uaConfig.threadCnt = 0  # events are pumped by this thread (libHandleEvents)
        cfg.uaConfig.mainThreadOnly = False
        cfg.uaConfig.maxCalls = WHEEL_MAX_CALLS
        cfg.uaConfig.userAgent = settings.user_agent
        cfg.uaConfig.stunIgnoreFailure = True
        cfg.logConfig.level = settings.log_level
        cfg.logConfig.consoleLevel = settings.log_level
        cfg.medConfig.clockRate = PORT_CLOCK_RATE
        cfg.medConfig.sndClockRate = PORT_CLOCK_RATE
        cfg.medConfig.ptime = PORT_FRAME_USEC // 1000
        cfg.medConfig.audioFramePtime = PORT_FRAME_USEC // 1000
        cfg.medConfig.noVad = True  # a frame every 20 ms, silence included
        cfg.medConfig.ecTailLen = 0  # no echo canceller: the core owns echo handling
        ep.libInit(cfg)
        self._dropped_packets.install()
        self._create_transports()
        ep.libStart()
        ep.audDevManager().setNullDev()
        self._set_codec_priorities()
        self._local_account = self._create_local_account()
        if settings.trunk is not None:
            self._trunk_account = self._create_trunk_account(settings.trunk)

    def _transport_config(self, port: int) -> Any:
        tc = pj.TransportConfig()
        tc.port = port
        tc.boundAddress = self.settings.bind_host
        if self.settings.public_host:
            tc.publicAddress = self.settings.public_host
        return tc

    def _create_transports(self) -> None:
        ep = self._ep
        requested = self.settings.port
        attempts = _PORT_PICK_ATTEMPTS if requested == 0 else 1
        last_error = ""
        for _ in range(attempts):
            try:
                udp = ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, self._transport_config(requested))
            except pj.Error as exc:
                last_error = str(exc.info())
                continue
            local_name = str(ep.transportGetInfo(udp).localName)
            port = int(local_name.rsplit(":", 1)[1])
            try:
                tcp = ep.transportCreate(pj.PJSIP_TRANSPORT_TCP, self._transport_config(port))
            except pj.Error as exc:
                last_error = str(exc.info())
                ep.transportClose(udp)
                continue
            self._transport_ids = [udp, tcp]
            self._sip_port = port
            return
        raise SipUaError(
            "bind_failed", f"cannot bind {self.settings.bind_host}:{requested}: {last_error}"
        )

    def _set_codec_priorities(self) -> None:
        ep = self._ep
        available = [str(info.codecId) for info in ep.codecEnum2()]
        for codec_id in available:
            ep.codecSetPriority(codec_id, 0)
        for index, wanted in enumerate(self.settings.codecs):
            if not any(cid.lower().startswith(wanted.lower()) for cid in available):
                raise SipUaError("start_failed", f"codec {wanted} is not in this pjsua build")
            ep.codecSetPriority(wanted, _CODEC_PRIORITY_TOP - index)

    def _account_config(self, id_uri: str) -> Any:
        settings = self.settings
        acfg = pj.AccountConfig()
        acfg.idUri = id_uri
        nat = acfg.natConfig
        nat.iceEnabled = False
        nat.turnEnabled = False
        nat.sipStunUse = pj.PJSUA_STUN_USE_DISABLED
        nat.mediaStunUse = pj.PJSUA_STUN_USE_DISABLED
        nat.contactRewriteUse = 0
        nat.viaRewriteUse = 0
        nat.sdpNatRewriteUse = 0
        acfg.presConfig.publishEnabled = False
        acfg.videoConfig.autoShowIncoming = False
        acfg.videoConfig.autoTransmitOutgoing = False
        acfg.mwiConfig.enabled = False
        media_tc = acfg.mediaConfig.transportConfig
        media_tc.port = settings.rtp_port
        media_tc.boundAddress = settings.bind_host
        if settings.public_host:
            media_tc.publicAddress = settings.public_host
        return acfg

    def _create_local_account(self) -> _Account:
        host = self.settings.public_host or self.settings.bind_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        acfg = self._account_config(f"sip:{self.settings.user_agent}@{host}:{self._sip_port}")
        account = _Account(self)
        account.create(acfg, True)
        return account

    def _create_trunk_account(self, trunk: SipTrunk) -> _Account:
        host = _trunk_host(trunk.uri)
        user = trunk.username or self.settings.user_agent
        acfg = self._account_config(f"sip:{user}@{host}")
        if trunk.username is not None and trunk.password is not None:
            cred = pj.AuthCredInfo("digest", trunk.realm, trunk.username, 0, trunk.password)
            acfg.sipConfig.authCreds.append(cred)
        acfg.regConfig.registrarUri = trunk.uri if trunk.register else ""
        acfg.regConfig.registerOnAdd = trunk.register
        account = _Account(self)
        account.create(acfg, False)
        return account

    def _setting_up(self) -> bool:
        """A leg waits for answer/reject or is dialling: keep command latency short."""
        return any(not state.connected and not state.ending for state in self._legs.values())

    def _drain_commands(self) -> None:
        # empty() first: get_nowait on an empty queue raises, and most turns have no command.
        while not self._commands.empty():
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except SipUaError as exc:
                future.set_exception(exc)
            except pj.Error as exc:
                future.set_exception(SipUaError("pjsua_error", str(exc.info())))
            except Exception as exc:
                future.set_exception(SipUaError("pjsua_error", repr(exc)))

    def _leg(self, leg: int) -> _Leg:
        state = self._legs.get(leg)
        if state is None:
            raise SipUaError("unknown_leg", f"no leg {leg}")
        return state

    def _register(self, call: _Call, direction: Literal["in", "out"]) -> _Leg:
        leg = next(self._leg_ids)
        call.leg = leg
        audio = _LegAudio()
        state = _Leg(leg=leg, call=call, direction=direction, started=time.monotonic(), audio=audio)
        self._legs[leg] = state
        self._audio[leg] = audio
        return state

    # command bodies (pjsua thread)

    def _inbound_unanswered(self, leg: int) -> _Leg:
        state = self._leg(leg)
        if state.direction != "in" or state.answered or state.ending:
            raise SipUaError("bad_state", f"leg {leg} is not an unanswered inbound call")
        return state

    def _do_ring(self, leg: int) -> None:
        state = self._inbound_unanswered(leg)
        state.call.answer(_call_param(180))

    def _do_answer(self, leg: int) -> None:
        state = self._inbound_unanswered(leg)
        state.call.answer(_call_param(200))
        state.answered = True

    def _do_reject(self, leg: int, code: int, headers: list[tuple[str, str]]) -> None:
        state = self._inbound_unanswered(leg)
        state.local_end = "local_hangup"
        state.ending = True
        state.call.hangup(_call_param(code, headers))

    def _do_dial(self, uri: str, from_uri: str | None, headers: list[tuple[str, str]]) -> int:
        trunk = self.settings.trunk
        account = self._trunk_account or self._local_account
        assert account is not None  # set by _init_library before the loop runs
        target = uri
        if trunk is not None and not re.match(r"^(sips?|tel):", uri, re.IGNORECASE):
            target = f"sip:{uri}@{_trunk_host(trunk.uri)}"
        if self._ep.utilVerifySipUri(target) != 0:
            raise SipUaError("bad_argument", f"not a SIP URI: {target!r}")
        if from_uri is not None and self._ep.utilVerifyUri(from_uri) != 0:
            raise SipUaError("bad_argument", f"not a URI: {from_uri!r}")
        call = _Call(self, account)
        state = self._register(call, "out")
        prm = _call_param(0, headers)
        if from_uri is not None:
            prm.txOption.localUri = from_uri
        try:
            call.makeCall(target, prm)
        except pj.Error as exc:
            self._forget(state.leg)
            if exc.status == _PJ_ETOOMANY:
                raise SipUaError(
                    "worker_full", f"all {WHEEL_MAX_CALLS} call slots in use"
                ) from None
            raise SipUaError("pjsua_error", str(exc.info())) from None
        state.announced = True
        if state.ending:  # disconnected synchronously inside makeCall
            self._announce_end(state, self._last_code(state.call))
        return state.leg

    def _do_hang_up(self, leg: int) -> None:
        state = self._leg(leg)
        if state.ending:
            return
        state.ending = True
        state.local_end = "local_hangup"
        code = _DECLINE_CODE if state.direction == "in" and not state.answered else 0
        state.call.hangup(_call_param(code))

    def _do_transfer(self, leg: int, target_uri: str) -> None:
        state = self._leg(leg)
        if not state.connected or state.ending:
            raise SipUaError("bad_state", f"leg {leg} is not connected")
        if state.transfer_pending:
            raise SipUaError("bad_state", f"leg {leg} already has a transfer in progress")
        if self._ep.utilVerifyUri(target_uri) != 0:
            raise SipUaError("bad_argument", f"not a URI: {target_uri!r}")
        state.transfer_pending = True
        try:
            state.call.xfer(target_uri, _call_param())
        except pj.Error:
            state.transfer_pending = False
            raise

    # pjsua callbacks (pjsua thread)

    def _on_incoming_call(self, account: _Account, prm: Any) -> None:
        call = _Call(self, account, prm.callId)
        if self._stop_requested:
            # Keep the object until release so pjsua does not answer 500 on its own.
            state = self._register(call, "in")
            state.ending = True
            state.local_end = "local_hangup"
            call.hangup(_call_param(503))
            return
        state = self._register(call, "in")
        rdata = prm.rdata
        info = invite_info_from_message(str(rdata.wholeMsg), str(rdata.srcAddress))
        screen = self._screen
        refusal = screen(info) if screen is not None else None
        if refusal is not None:
            # Never announced, so no LegEnded; the object lives until pjsua releases it.
            # Answered as soon as this callback has returned (the loop's next step): a
            # final answer from inside onIncomingCall crashed pjsip ("pjsip_rx_data_free_
            # cloned: Assertion `rdata' failed") and a hangup() there lost the 401's
            # WWW-Authenticate headers.
            state.ending = True
            state.local_end = "local_hangup"
            self._screened.append((state.leg, refusal))
            return
        state.announced = True
        self._emit(InviteArrived(state.leg, info))

    def _refuse_screened(self) -> None:
        """Answer the INVITEs the screen refused during the last libHandleEvents."""
        if not self._screened:
            return
        screened, self._screened = self._screened, []
        for leg, refusal in screened:
            state = self._legs.get(leg)
            if state is None:
                continue  # the caller CANCELled meanwhile and pjsua ended it
            try:
                state.call.hangup(_call_param(refusal.status, refusal.headers))
            except pj.Error as exc:
                _log.debug("refusing a screened INVITE failed: %s", exc.info())

    def _repair_refused(self, message: bytes) -> bytes | None:
        """A request pjsip's parser refused (pjsua thread): without its non-Digest credentials,
        so it is answered as a request without credentials, or None to leave it dropped."""
        stripped = strip_non_digest_credentials(message)
        labels = (UNPARSEABLE,) if stripped is None else stripped.schemes
        if self._on_unparsed is not None:
            for label in labels:
                self._on_unparsed(label)
        return None if stripped is None else stripped.message

    def _on_call_state(self, call: _Call) -> None:
        state = self._legs.get(call.leg)
        if state is None:
            return
        info = call.getInfo()
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and not state.connected:
            state.connected = True
            state.answered = True
            setup_ms = (time.monotonic() - state.started) * 1000.0
            self._emit(
                LegConnected(state.leg, setup_ms, self._codec_of(call), str(info.callIdString))
            )
        elif info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            state.ending = True
            if state.announced:
                self._announce_end(state, int(info.lastStatusCode))
            self._disconnect_port(state)
            self._pending_release.append(state.leg)

    def _announce_end(self, state: _Leg, code: int) -> None:
        if state.direction == "out" and not state.connected:
            reason = "cancelled" if state.local_end is not None else failure_reason(code)
            self._emit(LegFailed(state.leg, code, reason))
            return
        end: EndReason
        if state.local_end is not None:
            end = state.local_end
        elif state.connected:
            end = "remote_bye" if code < 300 else "error"
        elif code == 487 or code < 300:
            end = "cancelled"  # the caller CANCELled before we answered
        else:
            end = "error"
        self._emit(LegEnded(state.leg, end, code))

    def _last_code(self, call: _Call) -> int:
        try:
            return int(call.getInfo().lastStatusCode)
        except pj.Error:
            return 0

    def _codec_of(self, call: _Call) -> str:
        try:
            info = call.getInfo()
            for index, media in enumerate(info.media):
                if media.type == pj.PJMEDIA_TYPE_AUDIO:
                    stream = call.getStreamInfo(index)
                    return f"{stream.codecName}/{stream.codecClockRate}"
        except pj.Error:
            pass
        return ""

    def _on_call_media_state(self, call: _Call) -> None:
        state = self._legs.get(call.leg)
        if state is None or state.ending:
            return
        info = call.getInfo()
        for index, media in enumerate(info.media):
            if media.type != pj.PJMEDIA_TYPE_AUDIO or media.status != pj.PJSUA_CALL_MEDIA_ACTIVE:
                continue
            call_audio = call.getAudioMedia(index)
            if state.port is None:
                port = _LegPort(self, state.leg, state.audio)
                fmt = pj.MediaFormatAudio()
                fmt.init(
                    pj.PJMEDIA_FORMAT_PCM,
                    PORT_CLOCK_RATE,
                    PORT_CHANNELS,
                    PORT_FRAME_USEC,
                    PORT_BITS_PER_SAMPLE,
                )
                port.createPort(f"leg{state.leg}", fmt)
                state.port = port
            # A re-INVITE can recreate the stream: (re)connect both directions.
            call_audio.startTransmit(state.port)
            state.port.startTransmit(call_audio)
            state.call_audio = call_audio
            return

    def _on_transfer_status(self, call: _Call, prm: Any) -> None:
        state = self._legs.get(call.leg)
        if state is None or not state.transfer_pending:
            return
        code = int(prm.statusCode)
        if code < 200 and not prm.finalNotify:
            return
        state.transfer_pending = False
        ok = 200 <= code < 300
        prm.cont = False  # no more NOTIFYs wanted
        self._emit(LegTransferResult(state.leg, ok, code))
        if ok and not state.ending:
            state.ending = True
            state.local_end = "transferred"
            state.call.hangup(_call_param())

    def _disconnect_port(self, state: _Leg) -> None:
        port, call_audio = state.port, state.call_audio
        if port is None or call_audio is None:
            return
        for src, dst in ((call_audio, port), (port, call_audio)):
            # The stream is already gone at DISCONNECTED; removing the port suffices.
            with contextlib.suppress(pj.Error):
                src.stopTransmit(dst)
        state.call_audio = None

    def _forget(self, leg: int) -> None:
        state = self._legs.pop(leg, None)
        self._audio.pop(leg, None)
        if state is not None:
            self._disconnect_port(state)
            if state.port is not None:
                # Not dropped yet: the clock thread may be inside this port's callback
                # right now, and a SWIG director half torn down under it crashed the
                # worker (seen under load). Disconnected, it gets no new frames; it is
                # destroyed once a few clock ticks have passed.
                self._retired_ports.append((time.monotonic(), state.port))
            state.port = None
            state.call.leg = -1

    def _release_pending(self) -> None:
        if self._retired_ports:
            horizon = time.monotonic() - PORT_RETIRE_S
            while self._retired_ports and self._retired_ports[0][0] < horizon:
                self._retired_ports.pop(0)  # ~AudioMediaPort removes it from the bridge
        if not self._pending_release:
            return
        legs, self._pending_release = self._pending_release, []
        for leg in legs:
            self._forget(leg)

    def _shutdown(self) -> None:
        ep = self._ep
        if ep is None:
            return
        try:
            # Hang-ups live in their own frame: a local variable still holding a
            # Call when libDestroy has run makes ~Call assert (measured).
            for leg in list(self._legs):
                self._hang_up_at_stop(leg)
            deadline = time.monotonic() + _STOP_HANGUP_WAIT_S
            while self._legs and time.monotonic() < deadline:
                ep.libHandleEvents(_POLL_MS)
                self._release_pending()
            self._fail_pending_commands()
            for leg in list(self._legs):
                self._forget(leg)
            ep.hangupAllCalls()
            ep.libHandleEvents(_POLL_MS)
            for account in (self._trunk_account, self._local_account):
                if account is not None:
                    with contextlib.suppress(pj.Error):
                        account.shutdown()
            self._trunk_account = None
            self._local_account = None
        except Exception:
            _log.exception("orderly pjsua shutdown failed")
        finally:
            self._destroy_library()

    def _hang_up_at_stop(self, leg: int) -> None:
        state = self._legs[leg]
        if state.ending:
            return
        state.ending = True
        state.local_end = "local_hangup"
        code = _DECLINE_CODE if state.direction == "in" and not state.answered else 0
        try:
            state.call.hangup(_call_param(code))
        except pj.Error as exc:
            _log.warning("hangup at stop failed: %s", exc.info())

    def _destroy_flags(self) -> int:
        # PJSUA_DESTROY_NO_NETWORK skips pjsua's fixed ~1 s wait for unregistration
        # (measured: stop() 1.04 s -> see PJSUA2.md); calls were already hung up above.
        # With a registering trunk the network stays on so the REGISTER expires=0 goes out.
        trunk = self.settings.trunk
        if trunk is not None and trunk.register:
            return 0
        return int(pj.PJSUA_DESTROY_NO_NETWORK)

    def _destroy_library(self) -> None:
        ep, self._ep = self._ep, None
        self._legs.clear()
        self._audio.clear()
        self._trunk_account = None
        self._local_account = None
        if ep is None:
            return
        if self._retired_ports:
            time.sleep(PORT_RETIRE_S)  # the last frames of the last legs have passed
            self._retired_ports.clear()
        # Every Call/AudioMediaPort wrapper must be gone before libDestroy; a
        # cycle kept alive until a later GC pass would run ~Call afterwards.
        gc.collect()
        self._dropped_packets.uninstall()
        try:
            ep.libDestroy(self._destroy_flags())
        except pj.Error as exc:
            _log.error("libDestroy failed: %s", exc.info())
        del ep


def _trunk_host(uri: str) -> str:
    """Host[:port] part of a trunk URI like ``sip:user@host:5060;transport=udp``."""
    rest = re.sub(r"^(sips?):", "", uri.strip(), flags=re.IGNORECASE)
    rest = rest.split("@", 1)[-1]
    return rest.split(";", 1)[0].split("?", 1)[0]
