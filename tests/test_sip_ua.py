"""SipUserAgent against a real pjsua2 peer in another process, on loopback.

pjsua is one library instance per process, so the peer is a small pjsua2
script (``_PEER_SCRIPT``) run with ``sys.executable``: it reads JSON commands
on stdin and writes ``@@``-prefixed JSON events on stdout. The user agent
under test runs in this process, one instance per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from rutster.trunk.sip.pj_dropped_packets import PJSIP_EINVALIDMSG
from rutster.trunk.sip.ua import (
    WHEEL_MAX_CALLS,
    InviteArrived,
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
    bytevector_reader_is_fast,
    failure_reason,
    frame_writer_is_fast,
    invite_info_from_message,
    parse_sip_headers,
)
from tests.conftest import eventually

REPO = Path(__file__).resolve().parent.parent
#: Per-step wait for an expected event (generous for a loaded 2-core CI box).
EVENT_TIMEOUT_S = 10.0
#: A peer's start (a Python process that loads pjsua2 and binds its ports): slower than
#: one event when the machine is busy with the rest of the suite.
PEER_START_TIMEOUT_S = 30.0
#: Peer tone (Hz) and UA tone (Hz): both well inside G.711's 300-3400 Hz band
#: and far apart, so a dominant-frequency check cannot confuse them.
PEER_TONE_HZ = 440
UA_TONE_HZ = 1_000
#: Allowed error of the FFT peak (bin width is 16000/N; N = 16000 -> 1 Hz, plus codec).
TONE_TOLERANCE_HZ = 15

_PEER_SCRIPT = textwrap.dedent(
    r"""
    import json, queue, sys, threading, time
    import numpy as np
    import pjsua2 as pj

    cmds = queue.SimpleQueue()
    def reader():
        for line in sys.stdin:
            if line.strip():
                cmds.put(json.loads(line))
        cmds.put({"op": "quit"})
    def out(**ev):
        sys.stdout.write("@@" + json.dumps(ev) + "\n")
        sys.stdout.flush()

    class Port(pj.AudioMediaPort):
        def __init__(self):
            super().__init__()
            self.hz = 0
            self.phase = 0
            self.rx = []
            self.lock = threading.Lock()
        def onFrameRequested(self, f):
            if self.hz:
                t = np.arange(320) + self.phase
                self.phase += 320
                pcm = (8000 * np.sin(2 * np.pi * self.hz * t / 16000)).astype("<i2").tobytes()
            else:
                pcm = bytes(640)
            f.type = pj.PJMEDIA_FRAME_TYPE_AUDIO
            f.buf = pj.ByteVector(pcm)
            f.size = 640
        def onFrameReceived(self, f):
            if f.type == pj.PJMEDIA_FRAME_TYPE_AUDIO and f.size > 0:
                b = bytes(f.buf)
                with self.lock:
                    self.rx.append(b)
                    del self.rx[:-50]

    calls = {}
    pending = []
    auto = {"code": 0}
    state = {"next": 1}

    class PCall(pj.Call):
        def __init__(self, acc, cid=None):
            if cid is None:
                super().__init__(acc)
            else:
                super().__init__(acc, cid)
            self.idx = state["next"]
            state["next"] += 1
            calls[self.idx] = self
            self.port = None
            self.aud = None
        def onCallState(self, prm):
            ci = self.getInfo()
            out(ev="state", call=self.idx, state=ci.stateText, code=ci.lastStatusCode)
            if ci.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                pending.append(self.idx)
        def onCallMediaState(self, prm):
            ci = self.getInfo()
            for i, m in enumerate(ci.media):
                if m.type == pj.PJMEDIA_TYPE_AUDIO and m.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                    aud = self.getAudioMedia(i)
                    if self.port is None:
                        self.port = Port()
                        fmt = pj.MediaFormatAudio()
                        fmt.init(pj.PJMEDIA_FORMAT_PCM, 16000, 1, 20000, 16)
                        self.port.createPort("p%d" % self.idx, fmt)
                    aud.startTransmit(self.port)
                    self.port.startTransmit(aud)
                    self.aud = aud
                    out(ev="media", call=self.idx)
        def onCallTransferRequest(self, prm):
            out(ev="refer", call=self.idx, target=prm.dstUri)
            if "rutster@" in prm.dstUri:
                prm.newCall = PCall(acc)  # accept: pjsua dials the target for us
            else:
                prm.statusCode = 603

    class Acc(pj.Account):
        def onIncomingCall(self, prm):
            c = PCall(self, prm.callId)
            out(ev="incoming", call=c.idx, msg=prm.rdata.wholeMsg[:2000])
            if auto["code"]:
                cmds.put({"op": "answer", "call": c.idx, "code": auto["code"]})

    ep = pj.Endpoint()
    ep.libCreate()
    cfg = pj.EpConfig()
    cfg.uaConfig.threadCnt = 0
    cfg.uaConfig.mainThreadOnly = False
    cfg.uaConfig.maxCalls = 4
    cfg.logConfig.level = 0
    cfg.logConfig.consoleLevel = 0
    cfg.medConfig.noVad = True
    ep.libInit(cfg)
    # UDP and TCP on one port: the OS picks a free UDP port, and its TCP twin may be
    # taken (by any other socket of the suite); then try another.
    for attempt in range(20):
        tc = pj.TransportConfig()
        tc.port = 0
        tc.boundAddress = "127.0.0.1"
        tid = ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, tc)
        port = int(ep.transportGetInfo(tid).localName.rsplit(":", 1)[1])
        tc.port = port
        try:
            ep.transportCreate(pj.PJSIP_TRANSPORT_TCP, tc)
            break
        except pj.Error:
            ep.transportClose(tid)
    else:
        raise SystemExit("no port free for both UDP and TCP")
    ep.libStart()
    ep.audDevManager().setNullDev()
    acfg = pj.AccountConfig()
    acfg.idUri = "sip:peer@127.0.0.1:%d" % port
    acfg.natConfig.iceEnabled = False
    acfg.mediaConfig.transportConfig.boundAddress = "127.0.0.1"
    acc = Acc()
    acc.create(acfg, True)
    threading.Thread(target=reader, daemon=True).start()
    out(ev="ready", port=port)

    def param(code=0, headers=None):
        p = pj.CallOpParam(True)
        p.opt.videoCount = 0
        if code:
            p.statusCode = code
        for k, v in (headers or {}).items():
            h = pj.SipHeader()
            h.hName = k
            h.hValue = v
            p.txOption.headers.append(h)
        return p

    running = True
    while running:
        ep.libHandleEvents(10)
        while pending:
            c = calls.pop(pending.pop(), None)
            if c is not None and c.port is not None:
                c.port = None
        while True:
            try:
                cmd = cmds.get_nowait()
            except queue.Empty:
                break
            op = cmd["op"]
            try:
                if op == "quit":
                    running = False
                elif op == "autoanswer":
                    auto["code"] = cmd["code"]
                    out(ev="autoanswer", code=cmd["code"])
                elif op == "call":
                    c = PCall(acc)
                    c.makeCall(cmd["uri"], param(0, cmd.get("headers")))
                    out(ev="called", call=c.idx)
                elif op == "answer":
                    calls[cmd["call"]].answer(param(cmd["code"]))
                elif op == "hangup":
                    calls[cmd["call"]].hangup(param())
                elif op == "tone":
                    calls[cmd["call"]].port.hz = cmd["hz"]
                elif op == "dtmf":
                    calls[cmd["call"]].dialDtmf(cmd["digits"])
                    out(ev="dtmf_sent", call=cmd["call"])
                elif op == "heard":
                    p = calls[cmd["call"]].port
                    with p.lock:
                        raw = b"".join(p.rx)
                    x = np.frombuffer(raw, "<i2").astype(float)
                    if len(x) < 1600:
                        out(ev="heard", call=cmd["call"], hz=0, rms=0.0)
                    else:
                        spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
                        hz = float(np.argmax(spec[1:]) + 1) * 16000 / len(x)
                        out(ev="heard", call=cmd["call"], hz=hz, rms=float(np.sqrt(np.mean(x * x))))
            except pj.Error as e:
                out(ev="error", op=op, status=e.status, reason=e.reason)
    ep.hangupAllCalls()
    # Drop a call only once pjsua says it is disconnected, not after a fixed 200 ms:
    # a Python call object freed while pjsua still holds the call is the likely cause
    # of one libDestroy crash (SIGSEGV, exit -11) in a loaded suite run (not reproduced).
    deadline = time.monotonic() + 5.0
    while calls and time.monotonic() < deadline:
        ep.libHandleEvents(10)
        while pending:
            calls.pop(pending.pop(), None)
    for _ in range(20):
        ep.libHandleEvents(10)
    calls.clear()
    acc.shutdown()
    ep.libDestroy(pj.PJSUA_DESTROY_NO_NETWORK)
    out(ev="bye")
    """
)


class Peer:
    """A pjsua2 peer process speaking JSON lines."""

    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "sip_peer.py"
        script.write_text(_PEER_SCRIPT)
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.port = 0
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader = asyncio.create_task(asyncio.to_thread(self._read_all))
        try:
            ready = await self.expect("ready", timeout_s=PEER_START_TIMEOUT_S)
        except (AssertionError, TimeoutError):
            exited = self.proc.poll()
            if exited is None:
                raise
            assert self.proc.stderr is not None
            raise AssertionError(
                f"the peer exited ({exited}) before it was ready: {self.proc.stderr.read()[-2000:]}"
            ) from None
        self.port = int(ready["port"])

    def _read_all(self) -> None:
        loop = self._loop
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                loop.call_soon_threadsafe(self.events.put_nowait, json.loads(line[2:]))

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    async def expect(
        self,
        ev: str,
        pred: Callable[[dict[str, Any]], bool] = lambda e: True,
        *,
        timeout_s: float = EVENT_TIMEOUT_S,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"peer never sent {ev}")
            event = await asyncio.wait_for(self.events.get(), remaining)
            if event.get("ev") == ev and pred(event):
                return event
            if event.get("ev") == "error":
                raise AssertionError(f"peer error: {event}")

    async def autoanswer(self, code: int) -> None:
        """Answer every incoming call with ``code`` (0 = leave it ringing)."""
        self.send(op="autoanswer", code=code)
        await self.expect("autoanswer")

    async def close(self) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.send(op="quit")
        try:
            code = await asyncio.to_thread(self.proc.wait, 15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = await asyncio.to_thread(self.proc.wait)
        if self._reader is not None:
            await self._reader
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.proc.stdin.close()  # type: ignore[union-attr]
        return code

    _loop: asyncio.AbstractEventLoop


E = TypeVar("E")


class Harness:
    """A started SipUserAgent whose events land in an asyncio queue."""

    def __init__(self, ua: SipUserAgent, events: asyncio.Queue[SipEvent]) -> None:
        self.ua = ua
        self.events = events
        self.audio: dict[int, list[bytes]] = {}
        self.marks: list[str] = []

    async def expect(self, kind: type[E], pred: Callable[[E], bool] = lambda e: True) -> E:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"UA never emitted {kind.__name__}")
            event = await asyncio.wait_for(self.events.get(), remaining)
            if isinstance(event, LegAudio):
                self.audio.setdefault(event.leg, []).append(event.pcm)
            if isinstance(event, LegMarks):
                self.marks.extend(event.names)
            if isinstance(event, kind) and pred(event):
                return event

    @property
    def uri(self) -> str:
        return f"sip:rutster@127.0.0.1:{self.ua.sip_port}"


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[Peer]:
    p = Peer(tmp_path)
    p._loop = asyncio.get_running_loop()
    await p.start()
    yield p
    assert await p.close() == 0


@pytest.fixture
async def ua() -> AsyncIterator[Harness]:
    events: asyncio.Queue[SipEvent] = asyncio.Queue()
    agent = SipUserAgent(
        UaSettings(bind_host="127.0.0.1", port=0), events.put_nowait, asyncio.get_running_loop()
    )
    await asyncio.to_thread(agent.start)
    yield Harness(agent, events)
    await asyncio.to_thread(agent.stop)


def dominant_hz(pcm: bytes) -> float:
    x = np.frombuffer(pcm, "<i2").astype(float)
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec[1:]) + 1) * 16_000 / len(x)


def tone(hz: int, ms: int) -> bytes:
    t = np.arange(16 * ms)
    return (8000 * np.sin(2 * np.pi * hz * t / 16_000)).astype("<i2").tobytes()


async def test_inbound_call_audio_dtmf_and_remote_bye(ua: Harness, peer: Peer) -> None:
    peer.send(op="call", uri=ua.uri, headers={"X-Rutster-Test": "hello"})
    called = await peer.expect("called")
    arrived = await ua.expect(InviteArrived)
    info = arrived.info
    assert info.headers["x-rutster-test"] == "hello"
    # pjsip prints From/To URIs without their port (URI-in-From/To context).
    assert info.from_uri == "sip:peer@127.0.0.1"
    assert ";tag=" in info.headers["from"]
    assert info.to_uri == "sip:rutster@127.0.0.1"
    assert info.request_uri == ua.uri
    assert info.sip_call_id and info.headers["call-id"] == info.sip_call_id
    assert info.source.startswith("127.0.0.1:")
    assert info.transport == "udp"
    assert info.authorization is None
    await ua.ua.ring(arrived.leg)
    await peer.expect("state", lambda e: e["code"] == 180)
    await ua.ua.answer(arrived.leg)
    connected = await ua.expect(LegConnected)
    assert connected.leg == arrived.leg and connected.codec == "PCMU/8000"
    assert connected.setup_ms > 0
    await peer.expect("media")
    # Peer -> UA: the peer's tone shows up in LegAudio frames.
    peer.send(op="tone", call=called["call"], hz=PEER_TONE_HZ)
    ua.ua.play(arrived.leg, tone(UA_TONE_HZ, 1200))
    ua.ua.mark(arrived.leg, "after-tone")
    await ua.expect(LegMarks, lambda e: "after-tone" in e.names)
    frames = ua.audio[arrived.leg]
    assert all(len(f) == 640 for f in frames)
    assert abs(dominant_hz(b"".join(frames[-50:])) - PEER_TONE_HZ) < TONE_TOLERANCE_HZ
    # UA -> peer: the tone the UA played is what the peer heard.
    ua.ua.play(arrived.leg, tone(UA_TONE_HZ, 1000))
    await asyncio.sleep(0.8)
    peer.send(op="heard", call=called["call"])
    heard = await peer.expect("heard")
    assert abs(heard["hz"] - UA_TONE_HZ) < TONE_TOLERANCE_HZ and heard["rms"] > 1000
    # DTMF from the peer (RFC 2833): exactly one event per digit.
    peer.send(op="dtmf", call=called["call"], digits="5")
    dtmf = await ua.expect(LegDtmf)
    assert (dtmf.leg, dtmf.digit) == (arrived.leg, "5")
    peer.send(op="hangup", call=called["call"])
    ended = await ua.expect(LegEnded)
    assert (ended.leg, ended.reason) == (arrived.leg, "remote_bye")
    late = [e for e in _drain(ua.events) if isinstance(e, LegDtmf | LegEnded)]
    assert late == []
    await _until(lambda: ua.ua.active_legs == 0)


def _drain(q: asyncio.Queue[SipEvent]) -> list[SipEvent]:
    out: list[SipEvent] = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


async def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not cond():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


# --- raw SIP over sockets (hostile input, exact responses) ----------------------------------


def raw_invite(
    ua_port: int, local_port: int, call_id: str, extra: str = "", proto: str = "UDP"
) -> bytes:
    return (
        f"INVITE sip:rutster@127.0.0.1:{ua_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/{proto} 127.0.0.1:{local_port};branch=z9hG4bK{call_id}\r\n"
        "Max-Forwards: 70\r\n"
        f'From: "Raw" <sip:raw@127.0.0.1>;tag=t{call_id}\r\n'
        f"To: <sip:rutster@127.0.0.1:{ua_port}>\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Contact: <sip:raw@127.0.0.1:{local_port}>\r\n"
        f"{extra}"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def raw_ack(ua_port: int, local_port: int, call_id: str, to_tag: str) -> bytes:
    return (
        f"ACK sip:rutster@127.0.0.1:{ua_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{local_port};branch=z9hG4bK{call_id}\r\n"
        "Max-Forwards: 70\r\n"
        f'From: "Raw" <sip:raw@127.0.0.1>;tag=t{call_id}\r\n'
        f"To: <sip:rutster@127.0.0.1:{ua_port}>;tag={to_tag}\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 1 ACK\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


class RawUdp:
    """A UDP socket on loopback that reads SIP responses."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def send(self, data: bytes, port: int) -> None:
        self.sock.sendto(data, ("127.0.0.1", port))

    async def response(self, code: int) -> str:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {code} response"
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 65_535), remaining)
            text = data.decode(errors="replace")
            if text.startswith(f"SIP/2.0 {code} "):
                return text


def header(message: str, name: str) -> str:
    for line in message.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    raise AssertionError(f"no {name} header in {message!r}")


async def test_reject_401_with_challenge_then_authorization_seen(ua: Harness) -> None:
    raw = RawUdp()
    try:
        raw.send(raw_invite(ua.ua.sip_port, raw.port, "auth-1"), ua.ua.sip_port)
        await raw.response(100)  # pjsua's own 100 Trying comes first
        arrived = await ua.expect(InviteArrived)
        assert arrived.info.authorization is None
        assert arrived.info.from_uri == "sip:raw@127.0.0.1"
        challenge = 'Digest realm="rutster", nonce="n0nce", algorithm=MD5, qop="auth"'
        await ua.ua.reject(arrived.leg, 401, {"WWW-Authenticate": challenge})
        response = await raw.response(401)
        assert header(response, "WWW-Authenticate") == challenge
        ended = await ua.expect(LegEnded)
        assert (ended.leg, ended.reason, ended.sip_code) == (arrived.leg, "local_hangup", 401)
        raw.send(
            raw_ack(ua.ua.sip_port, raw.port, "auth-1", header(response, "To").split("tag=")[1]),
            ua.ua.sip_port,
        )
        creds = 'Digest username="u", realm="rutster", nonce="n0nce", uri="sip:x", response="00"'
        raw.send(
            raw_invite(
                ua.ua.sip_port, raw.port, "auth-2", f"Authorization: {creds}\r\nX-Tenant: acme\r\n"
            ),
            ua.ua.sip_port,
        )
        second = await ua.expect(InviteArrived)
        assert second.info.authorization == creds
        assert second.info.headers["x-tenant"] == "acme"
        assert second.info.sip_call_id == "auth-2"
        assert second.info.transport == "udp"
        await ua.ua.reject(second.leg, 403)
        await raw.response(403)
    finally:
        raw.sock.close()


async def test_tcp_invite_reports_tcp_transport(ua: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ua.ua.sip_port)
    try:
        local_port = writer.get_extra_info("sockname")[1]
        writer.write(raw_invite(ua.ua.sip_port, local_port, "tcp-1", proto="TCP"))
        await writer.drain()
        arrived = await ua.expect(InviteArrived)
        assert arrived.info.transport == "tcp"
        await ua.ua.reject(arrived.leg, 603)
        seen = b""
        while b"SIP/2.0 603 " not in seen:
            chunk = await asyncio.wait_for(reader.read(65_535), EVENT_TIMEOUT_S)
            assert chunk, "TCP closed before the 603"
            seen += chunk
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_requests_pjsip_refuses_for_non_digest_credentials_come_back_without_them() -> None:
    # pjsip's parser refuses a Basic or Bearer Authorization and drops the whole request; before
    # trunk/sip/pj_dropped_packets.py no InviteArrived came and nothing answered (f97543f).
    events: asyncio.Queue[SipEvent] = asyncio.Queue()
    outcomes: list[str] = []
    agent = SipUserAgent(
        UaSettings(bind_host="127.0.0.1", port=0),
        events.put_nowait,
        asyncio.get_running_loop(),
        on_unparsed=outcomes.append,
    )
    await asyncio.to_thread(agent.start)
    harness = Harness(agent, events)
    port = agent.sip_port
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            # The Via names another port: the leg's source must be the packet's own.
            sock.bind(("127.0.0.5", 0))
            basic = "Authorization: Basic dXNlcjpwYXNz\r\nX-Tenant: acme\r\n"
            sock.sendto(raw_invite(port, 9, "basic-1", basic), ("127.0.0.1", port))
            arrived = await harness.expect(InviteArrived, lambda e: e.info.sip_call_id == "basic-1")
            assert arrived.info.authorization is None
            assert arrived.info.headers["x-tenant"] == "acme"
            assert arrived.info.source == f"127.0.0.5:{sock.getsockname()[1]}"
            await agent.reject(arrived.leg, 403)
            # Refused for another reason (a non-numeric Expires): it stays dropped.
            garbage = raw_invite(port, 9, "garbage-1", "Expires: soon\r\n")
            sock.sendto(garbage, ("127.0.0.1", port))
        # Over TCP, with a well-formed request right behind it in the same segment.
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        local = writer.get_extra_info("sockname")[1]
        bearer = "Proxy-Authorization: Bearer eyJhbGciOiJub25lIn0.e30.\r\n"
        writer.write(
            raw_invite(port, local, "bearer-1", bearer, proto="TCP")
            + raw_invite(port, local, "after-1", proto="TCP")
        )
        await writer.drain()
        for call_id in ("bearer-1", "after-1"):

            def is_this_call(event: InviteArrived, wanted: str = call_id) -> bool:
                return event.info.sip_call_id == wanted

            arrived = await harness.expect(InviteArrived, is_this_call)
            assert arrived.info.transport == "tcp"
            assert arrived.info.authorization is None
            await agent.reject(arrived.leg, 603)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        await eventually(lambda: len(outcomes) == 3)
        assert sorted(outcomes) == ["basic", "bearer", "unparseable"]
        assert agent.running
    finally:
        await asyncio.to_thread(agent.stop)


def test_the_status_pjsip_gives_a_refused_packet_is_the_one_the_hook_expects() -> None:
    # pj_dropped_packets.PJSIP_EINVALIDMSG is copied from pjsip/sip_errno.h: ask the library.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pjsua2 as pj; ep = pj.Endpoint(); ep.libCreate();"
            f" print('@@' + ep.utilStrError({PJSIP_EINVALIDMSG})); ep.libDestroy()",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "@@Invalid message/syntax error (PJSIP_EINVALIDMSG)" in out


async def test_hostile_input_does_not_crash_the_ua(ua: Harness) -> None:
    port = ua.ua.sip_port
    raw = RawUdp()
    try:
        raw.send(bytes(range(256)) * 4, port)
        raw.send(b"\r\n\r\n", port)
        raw.send(raw_invite(port, raw.port, "trunc")[:120], port)
        raw.send(b"INVITE sip:x SIP/2.0\r\nVia: " + b"A" * 60_000 + b"\r\n\r\n", port)
        raw.send(raw_invite(port, raw.port, "huge", "X-Big: " + "B" * 60_000 + "\r\n"), port)
        for payload in (
            raw_invite(port, 1, "tcp-big", "X-Big: " + "C" * 100_000 + "\r\n", proto="TCP"),
            bytes(range(256)) * 400,
        ):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await asyncio.sleep(0.3)
        # Still alive: a normal INVITE is announced and answered.
        raw.send(raw_invite(port, raw.port, "after-garbage"), port)
        arrived = await ua.expect(InviteArrived, lambda e: e.info.sip_call_id == "after-garbage")
        await ua.ua.reject(arrived.leg, 486)
        await raw.response(486)
        assert ua.ua.running
    finally:
        raw.sock.close()


# --- calls with the pjsua2 peer ----------------------------------------------------------------


async def test_ua_hangs_up_and_peer_sees_disconnect(ua: Harness, peer: Peer) -> None:
    peer.send(op="call", uri=ua.uri)
    called = await peer.expect("called")
    arrived = await ua.expect(InviteArrived)
    await ua.ua.answer(arrived.leg)
    await ua.expect(LegConnected)
    with pytest.raises(SipUaError) as err:
        await ua.ua.answer(arrived.leg)
    assert err.value.reason == "bad_state"
    await ua.ua.hang_up(arrived.leg)
    ended = await ua.expect(LegEnded)
    assert (ended.leg, ended.reason) == (arrived.leg, "local_hangup")
    await peer.expect(
        "state", lambda e: e["call"] == called["call"] and e["state"] == "DISCONNECTED"
    )
    await _until(lambda: ua.ua.active_legs == 0)
    with pytest.raises(SipUaError) as err:
        await ua.ua.hang_up(arrived.leg)
    assert err.value.reason == "unknown_leg"


async def test_reject_486_reaches_peer(ua: Harness, peer: Peer) -> None:
    peer.send(op="call", uri=ua.uri)
    called = await peer.expect("called")
    arrived = await ua.expect(InviteArrived)
    await ua.ua.reject(arrived.leg, 486, {"Reason": 'SIP;cause=486;text="busy"'})
    disconnected = await peer.expect(
        "state", lambda e: e["call"] == called["call"] and e["state"] == "DISCONNECTED"
    )
    assert disconnected["code"] == 486
    ended = await ua.expect(LegEnded)
    assert (ended.reason, ended.sip_code) == ("local_hangup", 486)


async def test_caller_cancel_ends_inbound_leg_as_cancelled(ua: Harness, peer: Peer) -> None:
    peer.send(op="call", uri=ua.uri)
    called = await peer.expect("called")
    arrived = await ua.expect(InviteArrived)
    await ua.ua.ring(arrived.leg)
    await peer.expect("state", lambda e: e["code"] == 180)
    peer.send(op="hangup", call=called["call"])
    ended = await ua.expect(LegEnded)
    assert (ended.leg, ended.reason, ended.sip_code) == (arrived.leg, "cancelled", 487)


async def test_outbound_dial_connects_and_fifth_call_is_worker_full(
    ua: Harness, peer: Peer
) -> None:
    await peer.autoanswer(200)
    target = f"sip:peer@127.0.0.1:{peer.port}"
    legs = []
    for n in range(WHEEL_MAX_CALLS):
        legs.append(await ua.ua.dial(target, headers={"X-Dial": str(n)}))
        incoming = await peer.expect("incoming")
        assert f"X-Dial: {n}" in incoming["msg"]
    connected = {(await ua.expect(LegConnected)).leg for _ in legs}
    assert connected == set(legs)
    assert ua.ua.active_legs == WHEEL_MAX_CALLS
    with pytest.raises(SipUaError) as err:
        await ua.ua.dial(target)
    assert err.value.reason == "worker_full"
    assert ua.ua.active_legs == WHEEL_MAX_CALLS
    # An inbound 5th call is refused by pjsua itself, before any callback.
    raw = RawUdp()
    try:
        raw.send(raw_invite(ua.ua.sip_port, raw.port, "fifth"), ua.ua.sip_port)
        await raw.response(486)
    finally:
        raw.sock.close()
    assert ua.ua.active_legs == WHEEL_MAX_CALLS
    for leg in legs:
        await ua.ua.hang_up(leg)
    ended = [await ua.expect(LegEnded) for _ in legs]
    assert {e.leg for e in ended} == set(legs)
    assert {e.reason for e in ended} == {"local_hangup"}
    await _until(lambda: ua.ua.active_legs == 0)
    # The peer holds four calls at most too: let it see every BYE before the next
    # INVITE, or a loaded machine has it answer busy (a local suite run timed out here).
    for _ in legs:
        await peer.expect("state", lambda e: e["state"] == "DISCONNECTED")
    # A slot is free again.
    leg = await ua.ua.dial(target)
    await ua.expect(LegConnected, lambda e: e.leg == leg)


async def test_outbound_busy_and_cancel_fail(ua: Harness, peer: Peer) -> None:
    target = f"sip:peer@127.0.0.1:{peer.port}"
    await peer.autoanswer(486)
    busy = await ua.ua.dial(target, from_uri="sip:+15551230000@rutster.test")
    incoming = await peer.expect("incoming")
    assert "From: sip:+15551230000@rutster.test;tag=" in incoming["msg"]
    failed = await ua.expect(LegFailed)
    assert (failed.leg, failed.sip_code, failed.reason) == (busy, 486, "busy")
    await peer.autoanswer(0)
    ringing = await ua.ua.dial(target)
    await peer.expect("incoming")
    await ua.ua.hang_up(ringing)
    failed = await ua.expect(LegFailed)
    assert (failed.leg, failed.reason) == (ringing, "cancelled")


async def test_transfer_refused_by_peer_reports_failure(ua: Harness, peer: Peer) -> None:
    await peer.autoanswer(200)
    leg = await ua.ua.dial(f"sip:peer@127.0.0.1:{peer.port}")
    await ua.expect(LegConnected)
    await ua.ua.transfer(leg, "sip:elsewhere@127.0.0.1:9")
    refer = await peer.expect("refer")
    assert refer["target"] == "sip:elsewhere@127.0.0.1:9"
    result = await ua.expect(LegTransferResult)
    assert (result.leg, result.ok, result.sip_code) == (leg, False, 603)
    await ua.ua.hang_up(leg)
    ended = await ua.expect(LegEnded)
    assert ended.reason == "local_hangup"


async def test_command_errors(ua: Harness) -> None:
    with pytest.raises(SipUaError) as err:
        await ua.ua.answer(12345)
    assert err.value.reason == "unknown_leg"
    with pytest.raises(SipUaError) as err:
        await ua.ua.reject(1, 200)
    assert err.value.reason == "bad_argument"
    with pytest.raises(SipUaError) as err:
        await ua.ua.reject(1, 486, {"X-Bad": "a\r\nInjected: yes"})
    assert err.value.reason == "bad_argument"
    with pytest.raises(SipUaError) as err:
        await ua.ua.dial("not a uri")
    assert err.value.reason == "bad_argument"
    with pytest.raises(SipUaError) as err:
        await ua.ua.dial("http://example.com/")
    assert err.value.reason == "bad_argument"
    assert ua.ua.play(999, b"\x00" * 640) == 640
    assert ua.ua.mark(999, "m") is False
    assert ua.ua.clear(999) is False
    await asyncio.to_thread(ua.ua.stop)
    with pytest.raises(SipUaError) as err:
        await ua.ua.ring(1)
    assert err.value.reason == "not_running"


async def test_bind_failed_when_port_taken() -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        agent = SipUserAgent(
            UaSettings(bind_host="127.0.0.1", port=taken.getsockname()[1]),
            lambda e: None,
            asyncio.get_running_loop(),
        )
        with pytest.raises(SipUaError) as err:
            await asyncio.to_thread(agent.start)
        assert err.value.reason == "bind_failed"
        assert not agent.running
        # The failed start released the library: a new agent starts in this process.
        again = SipUserAgent(
            UaSettings(bind_host="127.0.0.1", port=0), lambda e: None, asyncio.get_running_loop()
        )
        await asyncio.to_thread(again.start)
        assert again.sip_port > 0
        await asyncio.to_thread(again.stop)
    finally:
        taken.close()


_STOP_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from rutster.trunk.sip.ua import LegConnected, LegEnded, SipUserAgent, UaSettings

    async def main(target):
        q = asyncio.Queue()
        ua = SipUserAgent(UaSettings("127.0.0.1", 0), q.put_nowait, asyncio.get_running_loop())
        ua.start()
        legs = [await ua.dial(target) for _ in range(2)]
        up = 0
        while up < 2:
            if isinstance(await asyncio.wait_for(q.get(), 10), LegConnected):
                up += 1
        ua.play(legs[0], bytes(32000))
        ua.stop()
        await asyncio.sleep(0.05)
        ended = []
        while not q.empty():
            e = q.get_nowait()
            if isinstance(e, LegEnded):
                ended.append(e.reason)
        print("ENDED", sorted(ended), ua.running, ua.active_legs)

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_stop_with_live_calls_exits_cleanly(peer: Peer, tmp_path: Path) -> None:
    await peer.autoanswer(200)
    script = tmp_path / "stop_live.py"
    script.write_text(_STOP_SCRIPT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        f"sip:peer@127.0.0.1:{peer.port}",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "ENDED ['local_hangup', 'local_hangup'] False 0" in out.decode()
    assert b"Assertion" not in err and b"Traceback" not in err
    for _ in range(2):
        await peer.expect("state", lambda e: e["state"] == "DISCONNECTED")


# --- pure helpers ---------------------------------------------------------------------------


def test_bytevector_reader_is_fast_here() -> None:
    # The ctypes reader passed its self-check on this build (else ~215 us per frame).
    assert bytevector_reader_is_fast()


def test_frame_writer_is_fast_here() -> None:
    # The ctypes frame writer passed its self-check on this build (else ~10.5 us per frame).
    assert frame_writer_is_fast()


#: Events emitted at once in the batching tests: a few seconds of 4 legs' frames.
BATCH_EVENTS = 1_000


async def test_events_cross_to_the_loop_in_order_in_one_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    got: list[SipEvent] = []
    ua = SipUserAgent(UaSettings(bind_host="127.0.0.1", port=0), got.append, loop)
    schedules = 0
    real_schedule = loop.call_soon_threadsafe

    def counting_schedule(callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        nonlocal schedules
        schedules += 1
        return real_schedule(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting_schedule)
    sent: list[SipEvent] = [
        LegAudio(i % 4, bytes([i % 256]) * 2) if i % 10 else LegMarks(i % 4, (f"m{i}",))
        for i in range(BATCH_EVENTS)
    ]

    # The loop is blocked in join(): every event is queued before it can deliver one.
    def emit_all() -> None:
        for event in sent:
            ua._emit(event)

    emitter = threading.Thread(target=emit_all)
    emitter.start()
    emitter.join()
    for _ in range(3):
        await asyncio.sleep(0)
    assert got == sent
    assert schedules == 1
    # Once delivered, the next event schedules a new delivery.
    ua._emit(LegDtmf(1, "5"))
    await asyncio.sleep(0)
    assert got[-1] == LegDtmf(1, "5") and schedules == 2


async def test_a_failing_event_handler_does_not_lose_the_rest_of_the_batch() -> None:
    loop = asyncio.get_running_loop()
    got: list[SipEvent] = []
    reported: list[dict[str, Any]] = []

    def handler(event: SipEvent) -> None:
        if isinstance(event, LegDtmf):
            raise ValueError("handler bug")
        got.append(event)

    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        ua = SipUserAgent(UaSettings(bind_host="127.0.0.1", port=0), handler, loop)
        events: list[SipEvent] = [LegAudio(1, b"\0\0"), LegDtmf(1, "1"), LegMarks(1, ("a",))]
        for event in events:
            ua._emit(event)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert got == [events[0], events[2]]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)


def test_events_for_a_closed_loop_are_dropped_and_counted() -> None:
    loop = asyncio.new_event_loop()
    ua = SipUserAgent(UaSettings(bind_host="127.0.0.1", port=0), lambda _event: None, loop)
    ua._emit(LegAudio(1, b"\0\0"))  # scheduled while the loop is open, never run
    loop.close()
    ua._emit(LegAudio(1, b"\0\0"))
    ua._emit(LegDtmf(1, "2"))
    assert ua.dropped_events == 3
    assert not ua._outbox


def test_parse_sip_headers_is_bounded_and_total() -> None:
    msg = (
        "INVITE sip:a@b SIP/2.0\r\ni: abc\r\nf: <sip:x@y>;tag=1\r\nVia: SIP/2.0/TCP h1\r\n"
        "Via: SIP/2.0/UDP h2\r\nX-Folded: one\r\n  two\r\nno colon line\r\n: empty\r\n"
        + "".join(f"X-H{i}: {i}\r\n" for i in range(200))
        + "X-Long: "
        + "L" * 5000
        + "\r\n\r\nbody: not a header"
    )
    start, headers = parse_sip_headers(msg)
    assert start == "INVITE sip:a@b SIP/2.0"
    assert headers["call-id"] == "abc"
    assert headers["via"] == "SIP/2.0/TCP h1,SIP/2.0/UDP h2"
    assert headers["x-folded"] == "one two"
    assert len(headers) <= 64
    assert "body" not in headers
    info = invite_info_from_message(msg, "1.2.3.4:5")
    assert (info.sip_call_id, info.from_uri, info.transport) == ("abc", "sip:x@y", "tcp")
    for garbage in ("", "\r\n\r\n", "\x00\xff", "INVITE", "a:b\r\n" * 3):
        invite_info_from_message(garbage, "")


def test_failure_reasons() -> None:
    assert failure_reason(486) == "busy"
    assert failure_reason(603) == "declined"
    assert failure_reason(404) == "not_found"
    assert failure_reason(408) == "no_answer"
    assert failure_reason(500) == "error"


def test_trunk_password_hidden_from_repr() -> None:
    trunk = SipTrunk(uri="sip:trunk.example", username="u", password="s3cret-pw")
    settings = UaSettings(bind_host="127.0.0.1", port=0, trunk=trunk)
    assert "s3cret-pw" not in repr(trunk) and "s3cret-pw" not in repr(settings)


async def test_transfer_accepted_ends_leg_as_transferred(ua: Harness, peer: Peer) -> None:
    await peer.autoanswer(200)
    leg = await ua.ua.dial(f"sip:peer@127.0.0.1:{peer.port}")
    await ua.expect(LegConnected)
    # The peer follows the REFER by calling the target, here the UA itself.
    await ua.ua.transfer(leg, ua.uri)
    follow_up = await ua.expect(InviteArrived)
    assert follow_up.info.headers.get("referred-by", "").startswith("sip:rutster@")
    await ua.ua.answer(follow_up.leg)
    result = await ua.expect(LegTransferResult)
    assert (result.leg, result.ok, result.sip_code) == (leg, True, 200)
    ended = await ua.expect(LegEnded, lambda e: e.leg == leg)
    assert ended.reason == "transferred"
    with pytest.raises(SipUaError) as err:
        await ua.ua.transfer(leg, "sip:x@127.0.0.1:9")
    assert err.value.reason in ("bad_state", "unknown_leg")
