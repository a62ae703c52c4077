"""The echo brain, served in-process and dialled with a real websockets client."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus

from rutster.brains.bind import BRAIN_BIND_ENV, parse_bind, ws_url
from rutster.brains.echo import (
    DEFAULT_ECHO_HOST,
    DEFAULT_ECHO_PORT,
    WARNING_BURST,
    EchoBrain,
    _WarningThrottle,
)
from rutster.protocols.tap import (
    MAX_MESSAGE_BYTES,
    AudioIn,
    AudioOut,
    BrainHello,
    Direction,
    TapDecoder,
    TapEncoder,
    TurnOwner,
)
from tests.tap_fixtures import fixture_names, load_fixture, load_fixture_json

C2B = Direction.CORE_TO_BRAIN
SESSION_ID = "sess_7f3a9c2e"  # the hello fixture's
RECV_TIMEOUT_S = 5.0  # generous: everything here is loopback
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def brain() -> AsyncIterator[EchoBrain]:
    async with EchoBrain() as running:
        yield running


async def recv_event(ws: ClientConnection) -> Any:
    text = await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    return TapDecoder(Direction.BRAIN_TO_CORE).decode(text)


async def say_hello(ws: ClientConnection) -> BrainHello:
    await ws.send(load_fixture(C2B, "hello"))
    reply = await recv_event(ws)
    assert isinstance(reply, BrainHello)
    return reply


def audio_frame(seed: int) -> bytes:
    return bytes((seed * 7 + i) % 256 for i in range(960))


async def test_url_and_lifecycle() -> None:
    brain = EchoBrain()
    with pytest.raises(RuntimeError):
        _ = brain.url
    await brain.start()
    try:
        assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/echo", brain.url)
        with pytest.raises(RuntimeError):
            await brain.start()
    finally:
        await brain.stop()
    await brain.stop()  # idempotent


async def test_hello_is_answered_with_brain_hello(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await ws.send(load_fixture(C2B, "hello"))
        text = await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    frame = json.loads(text)
    assert (frame["v"], frame["type"], frame["seq"]) == (1, "hello", 0)
    reply = TapDecoder(Direction.BRAIN_TO_CORE).decode(text)
    assert isinstance(reply, BrainHello)
    assert reply.name == "echo" and reply.version
    # It says what it is: never cut by caller speech, the core decides turns.
    assert (frame["interruptible"], frame["turns"]) == (False, "core")
    assert (reply.interruptible, reply.turns, reply.ignored) == (False, TurnOwner.CORE, ())
    assert brain.connections == 1


async def test_audio_in_is_echoed_byte_exact_with_item(brain: EchoBrain) -> None:
    encoder = TapEncoder(0)
    async with connect(brain.url) as ws:
        await say_hello(ws)
        fixture_pcm = base64.b64decode(load_fixture_json(C2B, "audio_in")["pcm"])
        await ws.send(load_fixture(C2B, "audio_in"))
        first = await recv_event(ws)
        assert first == AudioOut(fixture_pcm, item=f"echo-{SESSION_ID}")
        frames = [audio_frame(n) for n in range(5)]
        for n, pcm in enumerate(frames):
            await ws.send(encoder.encode(AudioIn(pcm), now_ms=n * 20))
        echoed = [await recv_event(ws) for _ in frames]
    assert [e.pcm for e in echoed] == frames  # same bytes, same order
    assert {e.item for e in echoed} == {f"echo-{SESSION_ID}"}
    assert brain.frames_echoed == 6


async def test_echo_replies_carry_their_own_seq(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await ws.send(load_fixture(C2B, "hello"))
        for _ in range(3):
            await ws.send(load_fixture(C2B, "audio_in"))
        seqs = [
            json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))["seq"] for _ in "1234"
        ]
    assert seqs == [0, 1, 2, 3]


async def test_garbage_and_unknown_types_are_counted_and_survived(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await say_hello(ws)
        for bad in (
            "not json",
            b"\xff\xfe binary junk",
            '{"v":2,"type":"audio_in","seq":9,"ts":0}',
            '{"v":1,"type":"audio_in","seq":9,"ts":0,"pcm":"!!","samples":480}',
        ):
            await ws.send(bad)
        await ws.send('{"v":1,"type":"hologram","seq":10,"ts":0,"beam":true}')
        await ws.send(load_fixture(C2B, "audio_in"))
        echoed = await recv_event(ws)  # in-order processing: counters are now settled
        assert isinstance(echoed, AudioOut)
    assert brain.bad_messages == 4
    assert brain.unknown_events == 1
    assert brain.frames_echoed == 1


async def test_audio_before_hello_is_dropped(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await ws.send(load_fixture(C2B, "audio_in"))
        await say_hello(ws)
        await ws.send(load_fixture(C2B, "audio_in"))
        assert isinstance(await recv_event(ws), AudioOut)
    assert brain.bad_messages == 1
    assert brain.frames_echoed == 1


async def test_session_end_closes_the_connection(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await say_hello(ws)
        await ws.send(load_fixture(C2B, "session_end"))
        with pytest.raises(ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
        assert ws.close_code == 1000


async def test_a_session_end_queued_behind_a_failed_reply_is_still_read(
    brain: EchoBrain, caplog: pytest.LogCaptureFixture
) -> None:
    # The core ends a call with session_end and closes at once. The echo of the audio_in
    # just before it then fails (the close has arrived); the brain must still read the
    # session_end queued behind that audio, not drop it with the connection.
    caplog.set_level(logging.INFO, logger="rutster.brains.echo")
    async with connect(brain.url) as ws:
        await say_hello(ws)
        await ws.send(load_fixture(C2B, "audio_in"))
        await ws.send(load_fixture(C2B, "session_end"))
        await ws.close()
    for _ in range(100):
        if any("ended" in r.getMessage() for r in caplog.records):
            break
        await asyncio.sleep(0.02)
    assert any(f"session {SESSION_ID} ended" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("path", ["/", "/echo/extra", "/realtime", "/ECHO"])
async def test_other_paths_are_rejected_with_404(brain: EchoBrain, path: str) -> None:
    url = brain.url.removesuffix("/echo") + path
    with pytest.raises(InvalidStatus) as info:
        async with connect(url):
            pass
    assert info.value.response.status_code == 404
    assert brain.connections == 0


async def test_query_string_does_not_change_the_path(brain: EchoBrain) -> None:
    async with connect(brain.url + "?call=CA1") as ws:
        await say_hello(ws)


async def test_every_golden_core_to_brain_fixture_is_accepted(brain: EchoBrain) -> None:
    names = fixture_names(C2B)
    middle = [n for n in names if n not in ("hello", "session_end")]
    assert "audio_in" in middle and len(middle) >= 6
    async with connect(brain.url) as ws:
        await say_hello(ws)
        for name in middle:
            await ws.send(load_fixture(C2B, name))
        await ws.send(load_fixture(C2B, "session_end"))
        replies = []
        with pytest.raises(ConnectionClosedOK):
            while True:
                replies.append(await recv_event(ws))
    # hello_resume gets a hello back, audio_in its echo; the rest are silent.
    assert sorted(type(r).__name__ for r in replies) == ["AudioOut", "BrainHello"]
    assert (brain.bad_messages, brain.unknown_events, brain.frames_echoed) == (0, 0, 1)


async def test_oversized_frame_closes_with_1009(brain: EchoBrain) -> None:
    async with connect(brain.url, max_size=None) as ws:
        await say_hello(ws)
        await ws.send("x" * (MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
        assert ws.close_code == 1009  # websockets' max_size: "message too big"


async def test_frame_at_the_limit_is_not_closed(brain: EchoBrain) -> None:
    async with connect(brain.url) as ws:
        await say_hello(ws)
        await ws.send("x" * MAX_MESSAGE_BYTES)  # garbage, but within max_size
        await ws.send(load_fixture(C2B, "audio_in"))
        assert isinstance(await recv_event(ws), AudioOut)
    assert brain.bad_messages == 1


async def test_stop_closes_open_connections() -> None:
    brain = EchoBrain()
    await brain.start()
    async with connect(brain.url) as ws:
        await say_hello(ws)
        await brain.stop()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)


async def test_flood_of_bad_messages_is_logged_rate_limited_and_without_audio(
    brain: EchoBrain, caplog: pytest.LogCaptureFixture
) -> None:
    fixture = load_fixture_json(C2B, "audio_in")
    bad_audio = json.dumps({**fixture, "samples": 479})  # refused, carries real PCM
    caplog.set_level(logging.DEBUG, logger="rutster.brains.echo")
    async with connect(brain.url) as ws:
        await say_hello(ws)
        for _ in range(50):
            await ws.send(bad_audio)
        await ws.send(load_fixture(C2B, "audio_in"))
        assert isinstance(await recv_event(ws), AudioOut)
    assert brain.bad_messages == 50
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= WARNING_BURST
    assert fixture["pcm"][:24] not in caplog.text


def test_warning_throttle_passes_a_burst_per_window_and_reports_the_rest() -> None:
    throttle = _WarningThrottle(burst=2, window_s=10.0)
    assert [throttle.allow(t) for t in (0.0, 1.0, 2.0, 3.0)] == [
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
    ]
    assert throttle.allow(10.0) == (True, 2)  # new window: the 2 suppressed are reported
    assert throttle.allow(10.5) == (True, 0)
    assert throttle.allow(25.0) == (True, 0)


# ---- the process entry point -----------------------------------------------------


async def _read_line_matching(stream: asyncio.StreamReader, pattern: str) -> re.Match[str]:
    while True:
        line = await asyncio.wait_for(stream.readline(), RECV_TIMEOUT_S)
        assert line, f"process output ended before {pattern!r}"
        found = re.search(pattern, line.decode())
        if found:
            return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_run_echo_brain_serves_and_exits_cleanly_on_signal(signum: int) -> None:
    env = {**os.environ, BRAIN_BIND_ENV: "127.0.0.1:0"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from brains.echo import run_echo_brain; run_echo_brain()",
        cwd=REPO_ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        found = await _read_line_matching(
            process.stderr, r"echo brain listening on (ws://127\.0\.0\.1:(\d+)/echo)$"
        )
        assert int(found.group(2)) > 0  # the real port, not 0
        async with connect(found.group(1)) as ws:
            await say_hello(ws)
        process.send_signal(signum)
        await _read_line_matching(process.stderr, r"echo brain stopped")
        rest = await asyncio.wait_for(process.stderr.read(), RECV_TIMEOUT_S)
        assert await asyncio.wait_for(process.wait(), RECV_TIMEOUT_S) == 0
        assert b"Traceback" not in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# ---- bind addresses -----------------------------------------------------------------

DEFAULTS: dict[str, Any] = {"default_host": DEFAULT_ECHO_HOST, "default_port": DEFAULT_ECHO_PORT}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ("127.0.0.1", 8081)),
        ("", ("127.0.0.1", 8081)),
        ("   ", ("127.0.0.1", 8081)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("brain-host.internal:8081", ("brain-host.internal", 8081)),
        (":9001", ("127.0.0.1", 9001)),
        ("[::1]:9002", ("::1", 9002)),
        ("[::]:9003", ("::", 9003)),
        ("ws://10.0.0.5:9004", ("10.0.0.5", 9004)),
        ("ws://localhost:9005/echo", ("localhost", 9005)),
        ("ws://[::1]:9006/echo", ("::1", 9006)),
        ("ws://echo-brain", ("echo-brain", 8081)),
        (" localhost:0 ", ("localhost", 0)),
    ],
)
def test_parse_bind_accepts_the_documented_forms(
    value: str | None, expected: tuple[str, int]
) -> None:
    assert parse_bind(value, **DEFAULTS) == expected


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("8081", "write ':8081'"),
        ("localhost", "no port"),
        ("localhost:", "not a number"),
        ("localhost:http", "not a number"),
        ("localhost:70000", "over 65535"),
        ("localhost:-1", "not a number"),
        ("::1:8081", "brackets"),
        ("[::1]", "no port"),
        ("[not-ipv6]:80", "not an IPv6 address"),
        ("bad host:80", "bad host"),
        ("http://localhost:80", "scheme must be ws://"),
        ("wss://localhost:443", "plain ws://"),
        ("ws://:9000", "no host"),
        ("ws://user:pw@localhost:9000", "credentials"),
        ("ws://localhost:9000/echo?x=1", "query"),
        ("ws://localhost:port", "not a number"),
    ],
)
def test_parse_bind_refuses_anything_else_clearly(value: str, hint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(hint)):
        parse_bind(value, **DEFAULTS)


def test_ws_url_brackets_ipv6_hosts() -> None:
    assert ws_url("127.0.0.1", 8081, "/echo") == "ws://127.0.0.1:8081/echo"
    assert ws_url("::1", 8081, "/echo") == "ws://[::1]:8081/echo"
