"""The tap conformance kit against the echo brain, deliberately broken brains and the Node brain."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rutster.brains.echo import EchoBrain
from rutster.protocols.tap import (
    MAX_MESSAGE_BYTES,
    AudioIn,
    Direction,
    FunctionCall,
    Hello,
    SessionEnd,
    SpeechStarted,
    SpeechStopped,
    TapDecoder,
    TapProtocolError,
    ToolSpec,
    ToolStatus,
    ToolsUpdate,
    UnknownTapEvent,
)
from rutster.tools import conformance
from rutster.tools.conformance import (
    RULES,
    ConformanceReport,
    RuleResult,
    RuleStatus,
    _validate_call,
    format_result,
    main,
    run_conformance,
    voiced_pcm,
)
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.marker_tone import contains_marker_tone, marker_tone_pcm

PASS, FAIL, SKIP = RuleStatus.PASS, RuleStatus.FAIL, RuleStatus.SKIP
REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_BRAIN_DIR = REPO_ROOT / "examples" / "node-brain"
#: The Node brain's ready line starts with this (examples/node-brain/brain.js).
READY_PREFIX = "node brain listening on "
#: Short turn timeout for in-process brains: they answer in milliseconds.
FAST_TURN_TIMEOUT_S = 1.0
#: Turn timeout for brains that never answer (each wait costs this much).
SHORT_TURN_TIMEOUT_S = 0.5
#: The own-VAD brain answers after this many silent frames following speech
#: (10 frames = 200 ms of caller audio, a short end-of-turn silence).
OWN_VAD_SILENT_FRAMES = 10
#: ...with this much audio: 100 ms at 24 kHz.
OWN_ANSWER_SAMPLES = 2_400
#: Generous bounds for a subprocess on a loaded 2-core machine.
NODE_READY_TIMEOUT_S = 10.0
NODE_STOP_TIMEOUT_S = 5.0
NPM_TIMEOUT_S = 120.0
#: The broken brain streams this many valid audio_out after its bad one, one
#: per BROKEN_CHUNK_S, and ignores barge-in (longer than grace + watch).
BROKEN_CHUNKS = 40
BROKEN_CHUNK_S = 0.05
BROKEN_CHUNK_SAMPLES = 1200


def statuses(report: ConformanceReport) -> dict[str, RuleStatus]:
    return {rule.name: rule.status for rule in report.rules}


def explain(report: ConformanceReport) -> str:
    return "\n".join(format_result(rule) for rule in report.rules)


# ---- pure pieces -----------------------------------------------------------------


def test_voiced_signal_is_not_the_marker_tone() -> None:
    voice = voiced_pcm(1_000)
    assert len(voice) == 24_000 * 2
    assert not contains_marker_tone(voice)
    assert contains_marker_tone(voice + marker_tone_pcm() + voice)


def test_rules_are_data_in_the_documented_order() -> None:
    assert [rule.name for rule in RULES] == [
        "connect",
        "hello",
        "hello-declarations",
        "tools-catalog",
        "audio-accepted",
        "answers-turn",
        "barge-in",
        "tool-round-trip",
        "unknown-events",
        "dtmf",
        "resume",
        "session-end",
        "messages-valid",
    ]


def test_report_passed_and_line_format() -> None:
    ok = RuleResult("dtmf", PASS, "still connected")
    skipped = RuleResult("tools-catalog", SKIP, "brain sent no tools.update")
    failed = RuleResult("barge-in", FAIL, "3 audio_out after the barge-in")
    assert ConformanceReport("ws://x", (ok, skipped)).passed
    assert not ConformanceReport("ws://x", (ok, failed)).passed
    assert ConformanceReport("ws://x", (ok, failed)).result("barge-in") is failed
    assert format_result(ok).split(maxsplit=2) == ["PASS", "dtmf", "still connected"]
    assert format_result(failed).startswith("FAIL  barge-in  ")


HANGUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": {"type": "string"}},
    "required": ["reason"],
}


@pytest.mark.parametrize(
    ("name", "args", "parameters", "status", "problem"),
    [
        ("hangup", {"reason": "done"}, HANGUP_SCHEMA, ToolStatus.OK, ""),
        ("hangup", {}, HANGUP_SCHEMA, ToolStatus.ERROR, "'reason' is a required property"),
        ("hangup", {"reason": 5}, HANGUP_SCHEMA, ToolStatus.ERROR, "is not of type 'string'"),
        ("transfer", {}, HANGUP_SCHEMA, ToolStatus.NOT_IMPLEMENTED, "not in the latest catalog"),
        ("hangup", {}, {"type": "object", "required": 3}, ToolStatus.ERROR, "invalid schema"),
    ],
)
def test_tool_calls_are_checked_like_the_core_does(
    name: str, args: dict[str, Any], parameters: dict[str, Any], status: ToolStatus, problem: str
) -> None:
    catalog = ToolsUpdate((ToolSpec("hangup", "", parameters),))
    got_status, got_problem = _validate_call(FunctionCall("c1", name, args), catalog)
    assert got_status is status
    assert problem in got_problem
    assert bool(got_problem) == (status is not ToolStatus.OK)


async def test_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        await run_conformance("ws://127.0.0.1:1/x", turn_timeout_s=0)


# ---- the echo brain: the reference passes ----------------------------------------


async def test_echo_brain_conforms() -> None:
    async with EchoBrain() as brain:
        report = await run_conformance(brain.url)
        assert brain.unknown_events == 1  # it did receive the probe
    assert report.passed, explain(report)
    got = statuses(report)
    assert got["tool-round-trip"] is SKIP
    assert got["tools-catalog"] is SKIP  # echo has no tools
    for name in (
        "connect",
        "hello",
        "hello-declarations",
        "answers-turn",
        "resume",
        "messages-valid",
    ):
        assert got[name] is PASS, explain(report)
    assert report.result("hello").detail.startswith("brain 'echo' version ")
    # It declares interruptible: false, so the kit does not try to cut it.
    assert report.result("hello-declarations").detail == "interruptible false, turns 'core'"
    assert got["barge-in"] is SKIP
    assert "interruptible: false" in report.result("barge-in").detail


# ---- a broken brain: the kit can fail ----------------------------------------------


class _BrokenBrain:
    """A tap server that gets many rules wrong, each on purpose.

    - its ``hello`` has an empty name (hello);
    - its catalog's schema uses a type that does not exist (tools-catalog);
    - it sends a frame that is not JSON (messages-valid);
    - it answers a turn with an ``audio_out`` whose ``samples`` lies
      (answers-turn), then streams audio that ignores barge-in (barge-in);
    - on the marker tone it calls a tool missing from its catalog (tool-round-trip);
    - it closes on an unknown event type (unknown-events).
    """

    def __init__(self) -> None:
        self._seq = 0
        self._streams: set[asyncio.Task[None]] = set()

    async def send(self, ws: ServerConnection, msg_type: str, **fields: Any) -> None:
        await ws.send(json.dumps({"v": 1, "type": msg_type, "seq": self._seq, "ts": 0, **fields}))
        self._seq += 1

    async def stream_deaf_to_barge_in(self, ws: ServerConnection) -> None:
        pcm = base64.b64encode(bytes(BROKEN_CHUNK_SAMPLES * 2)).decode()
        try:
            for _ in range(BROKEN_CHUNKS):
                await self.send(
                    ws, "audio_out", pcm=pcm, samples=BROKEN_CHUNK_SAMPLES, item="broken-1"
                )
                await asyncio.sleep(BROKEN_CHUNK_S)
        except ConnectionClosed:
            pass

    async def serve(self, ws: ServerConnection) -> None:
        self._seq = 0
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        turn = bytearray()
        try:
            async for data in ws:
                try:
                    event = decoder.decode(data)
                except TapProtocolError:
                    continue
                if isinstance(event, UnknownTapEvent):
                    await ws.close()
                    return
                if isinstance(event, Hello):
                    await self.send(ws, "hello", brain={"name": "", "version": "1"})
                    bad_schema = {"type": "object", "properties": {"x": {"type": "no-such"}}}
                    tool = {"name": "hangup", "description": "", "parameters": bad_schema}
                    await self.send(ws, "tools.update", tools=[tool])
                    await ws.send("this is not json")
                elif isinstance(event, AudioIn):
                    turn += event.pcm
                elif isinstance(event, SpeechStarted):
                    turn.clear()
                elif isinstance(event, SpeechStopped):
                    if contains_marker_tone(bytes(turn)):
                        await self.send(ws, "function_call", id="c1", name="launch", args={})
                    else:
                        short = base64.b64encode(bytes(100)).decode()
                        await self.send(ws, "audio_out", pcm=short, samples=480, item="broken-0")
                        task = asyncio.create_task(self.stream_deaf_to_barge_in(ws))
                        self._streams.add(task)
                        task.add_done_callback(self._streams.discard)
                    turn.clear()
        except ConnectionClosed:
            pass

    async def stop_streams(self) -> None:
        for task in list(self._streams):
            task.cancel()
        await asyncio.gather(*self._streams, return_exceptions=True)


@pytest.fixture
async def broken_brain_url() -> AsyncIterator[str]:
    brain = _BrokenBrain()
    async with serve(brain.serve, LOOPBACK, 0, max_size=MAX_MESSAGE_BYTES) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://{LOOPBACK}:{port}/broken"
        await brain.stop_streams()


async def test_broken_brain_fails_the_matching_rules(broken_brain_url: str) -> None:
    report = await run_conformance(broken_brain_url, turn_timeout_s=FAST_TURN_TIMEOUT_S)
    assert not report.passed
    assert statuses(report) == {
        "connect": PASS,
        "hello": FAIL,
        "hello-declarations": SKIP,  # no valid hello to read them from
        "tools-catalog": FAIL,
        "audio-accepted": PASS,
        "answers-turn": FAIL,
        "barge-in": FAIL,
        "tool-round-trip": FAIL,
        "unknown-events": FAIL,
        "dtmf": SKIP,  # the brain had closed the connection
        "resume": PASS,
        "session-end": PASS,
        "messages-valid": FAIL,
    }, explain(report)
    detail = {rule.name: rule.detail for rule in report.rules}
    assert "bad_field" in detail["hello"]
    assert "no-such" in detail["tools-catalog"]
    assert "bad_audio_length" in detail["answers-turn"]
    assert "'broken-1'" in detail["barge-in"]
    assert "not in the latest catalog" in detail["tool-round-trip"]
    assert "brain closed the connection" in detail["unknown-events"]
    assert "malformed_json" in detail["messages-valid"]


# ---- brains that say what they are (hello.interruptible, hello.turns) -------------


class _DeclaringBrain:
    """A tap server whose ``hello`` carries ``declarations`` as given (valid or not).

    It behaves as a full-duplex brain with its own VAD: after caller speech
    followed by :data:`OWN_VAD_SILENT_FRAMES` silent frames it answers with
    one ``audio_out`` (if ``answers``). With ``answers_speech_stopped`` it
    also answers a core ``speech_stopped``, like a turn-based brain. It counts
    the core speech events it gets: a ``turns: "brain"`` brain must get none.
    """

    def __init__(
        self,
        declarations: dict[str, Any],
        *,
        brain_fields: dict[str, Any] | None = None,
        answers: bool = True,
        answers_speech_stopped: bool = False,
    ) -> None:
        self.declarations = declarations
        self.brain_fields = brain_fields or {}
        self.answers = answers
        self.answers_speech_stopped = answers_speech_stopped
        self.speech_events = 0
        self.own_answers = 0

    async def serve(self, ws: ServerConnection) -> None:
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        seq = 0
        heard, silent, answer = False, 0, 0

        async def send(msg_type: str, **fields: Any) -> None:
            nonlocal seq
            await ws.send(json.dumps({"v": 1, "type": msg_type, "seq": seq, "ts": 0, **fields}))
            seq += 1

        async def reply() -> None:
            nonlocal answer
            answer += 1
            pcm = base64.b64encode(voiced_pcm(100)).decode()
            await send("audio_out", pcm=pcm, samples=OWN_ANSWER_SAMPLES, item=f"own-{answer}")

        try:
            async for data in ws:
                try:
                    event = decoder.decode(data)
                except TapProtocolError:
                    continue
                if isinstance(event, Hello):
                    brain = {"name": "declaring", "version": "1", **self.brain_fields}
                    await send("hello", brain=brain, **self.declarations)
                elif isinstance(event, SpeechStarted | SpeechStopped):
                    self.speech_events += 1
                    if isinstance(event, SpeechStopped) and self.answers_speech_stopped:
                        await reply()
                elif isinstance(event, AudioIn):
                    if any(event.pcm):
                        heard, silent = True, 0
                    elif heard:
                        silent += 1
                        if silent >= OWN_VAD_SILENT_FRAMES:
                            heard = False
                            if self.answers:
                                self.own_answers += 1
                                await reply()
                elif isinstance(event, SessionEnd):
                    await ws.close()
                    return
        except ConnectionClosed:
            pass


@contextlib.asynccontextmanager
async def declaring_brain(brain: _DeclaringBrain) -> AsyncIterator[str]:
    """Serve ``brain`` on loopback; yields its URL."""
    async with serve(brain.serve, LOOPBACK, 0, max_size=MAX_MESSAGE_BYTES) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://{LOOPBACK}:{port}/declaring"


async def test_turns_brain_gets_no_speech_events_and_answers_on_its_own() -> None:
    brain = _DeclaringBrain({"interruptible": True, "turns": "brain"})
    async with declaring_brain(brain) as url:
        report = await run_conformance(url, turn_timeout_s=FAST_TURN_TIMEOUT_S)
    assert report.passed, explain(report)
    got = statuses(report)
    assert report.result("hello-declarations").detail == "interruptible true, turns 'brain'"
    assert got["answers-turn"] is PASS
    assert "answered on its own" in report.result("answers-turn").detail
    assert got["barge-in"] is SKIP
    assert 'turns: "brain"' in report.result("barge-in").detail
    for name in ("hello-declarations", "unknown-events", "resume", "session-end"):
        assert got[name] is PASS, explain(report)
    assert got["tool-round-trip"] is SKIP  # answered the marker turn with audio, no tool
    assert brain.speech_events == 0  # the core never sends them to such a brain
    assert brain.own_answers >= 4  # first turn, tool turn, probe turn, resumed turn


async def test_turns_brain_that_never_answers_is_skipped_not_failed() -> None:
    brain = _DeclaringBrain({"turns": "brain"}, answers=False)
    async with declaring_brain(brain) as url:
        report = await run_conformance(url, turn_timeout_s=SHORT_TURN_TIMEOUT_S)
    assert report.passed, explain(report)
    got = statuses(report)
    assert got["answers-turn"] is SKIP
    assert "no audio_out on its own" in report.result("answers-turn").detail
    assert got["hello-declarations"] is PASS
    assert "(interruptible by default)" in report.result("hello-declarations").detail
    assert brain.speech_events == 0


@pytest.mark.parametrize(
    ("declarations", "brain_fields", "expected"),
    [
        ({"turns": "duplex"}, {}, 'turns="duplex"'),
        ({"interruptible": "no", "turns": 7}, {}, 'interruptible="no", turns=7'),
        ({"interruptible": None}, {}, "interruptible=null"),
        ({}, {"interruptible": False, "turns": "core"}, "interruptible, turns inside hello.brain"),
    ],
    ids=["turns_unknown", "both_bad_types", "interruptible_null", "nested_in_brain"],
)
async def test_invalid_declarations_fail_only_their_rule(
    declarations: dict[str, Any], brain_fields: dict[str, Any], expected: str
) -> None:
    brain = _DeclaringBrain(declarations, brain_fields=brain_fields, answers_speech_stopped=True)
    async with declaring_brain(brain) as url:
        report = await run_conformance(url, turn_timeout_s=FAST_TURN_TIMEOUT_S)
    failed = {rule.name for rule in report.rules if rule.status is FAIL}
    assert failed == {"hello-declarations"}, explain(report)
    assert expected in report.result("hello-declarations").detail
    # The core reads unknown values as the defaults, and so does the kit:
    # core turns (speech events sent) and barge-in exercised.
    assert brain.speech_events > 0
    assert statuses(report)["barge-in"] is PASS, explain(report)


async def test_dead_url_fails_connect_and_skips_the_rest() -> None:
    report = await run_conformance(f"ws://{LOOPBACK}:{free_port()}/gone")
    got = statuses(report)
    assert got.pop("connect") is FAIL
    assert set(got.values()) == {SKIP}


async def test_silent_brain_fails_answers_turn_without_hanging() -> None:
    async def silent(ws: ServerConnection) -> None:
        async for _ in ws:  # reads everything, says nothing
            pass

    async with serve(silent, LOOPBACK, 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        report = await run_conformance(f"ws://{LOOPBACK}:{port}/", turn_timeout_s=0.5)
    got = statuses(report)
    assert got["hello"] is PASS
    assert report.result("hello").detail == "brain sent no hello (optional)"
    assert got["hello-declarations"] is SKIP
    assert got["answers-turn"] is FAIL
    assert "no audio_out within 0.5 s" in report.result("answers-turn").detail
    assert got["barge-in"] is SKIP
    assert got["unknown-events"] is PASS  # stays connected: enough for a mute brain


# ---- main() --------------------------------------------------------------------------


def test_main_exit_zero_when_no_rule_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real runs are covered above; here only main's arguments, lines and status.
    seen: dict[str, Any] = {}

    async def fake_run(url: str, *, turn_timeout_s: float, require_tool: bool) -> ConformanceReport:
        seen.update(url=url, turn_timeout_s=turn_timeout_s, require_tool=require_tool)
        rules = tuple(
            RuleResult(rule.name, SKIP if rule.name == "dtmf" else PASS, "ok") for rule in RULES
        )
        return ConformanceReport(url, rules)

    monkeypatch.setattr(conformance, "run_conformance", fake_run)
    code = main(["ws://brain.example/x", "--timeout", "2.5", "--require-tool"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert seen == {"url": "ws://brain.example/x", "turn_timeout_s": 2.5, "require_tool": True}
    assert len(out) == len(RULES) + 1
    assert out[0].split() == ["PASS", "connect", "ok"]
    assert "SKIP  dtmf" in "\n".join(out)
    assert out[-1].startswith("conformant: 12 passed, 0 failed, 1 skipped")


def test_main_exit_nonzero_when_a_rule_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([f"ws://{LOOPBACK}:{free_port()}/gone", "--require-tool"])
    out = capsys.readouterr().out
    assert code == conformance.EXIT_FAILED != 0
    assert out.splitlines()[0].startswith("FAIL  connect")
    assert "NOT conformant" in out


@pytest.mark.parametrize("argv", [["http://example.com/"], ["ws://x/", "--timeout", "0"], []])
def test_main_refuses_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rutster.tools.conformance", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--require-tool" in proc.stdout


# ---- the Node.js brain ------------------------------------------------------------------


@pytest.fixture
def node_brain() -> Iterator[str]:
    """Path of ``node``, with examples/node-brain's dependencies installed (else skip)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not both on PATH")
    if not (NODE_BRAIN_DIR / "node_modules" / "ws").is_dir():
        try:
            proc = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=NODE_BRAIN_DIR,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm ci took over {NPM_TIMEOUT_S:g} s")
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).strip().splitlines() or ["(no output)"]
            pytest.skip(f"npm ci failed: {lines[-1]}")
    yield node


async def _poke_with_garbage(url: str) -> None:
    """Things the brain must survive: bad JSON, binary junk, audio before hello, bad fields."""
    async with connect(url, max_size=MAX_MESSAGE_BYTES) as ws:
        await ws.send("{not json")
        await ws.send(b"\xff\xfe binary junk")
        await ws.send(json.dumps([1, 2, 3]))
        await ws.send(json.dumps({"v": 2, "type": "hello", "seq": 0, "ts": 0}))
        audio = {"v": 1, "type": "audio_in", "seq": 1, "ts": 0, "pcm": "AAAA", "samples": 480}
        await ws.send(json.dumps(audio))
        await ws.send(json.dumps({"v": 1, "type": "speech_started", "seq": 2, "ts": 0}))
        pong = await ws.ping()
        await asyncio.wait_for(pong, NODE_READY_TIMEOUT_S)


async def test_node_brain_conforms(node_brain: str, tmp_path: Path) -> None:
    bind = f"ws://{LOOPBACK}:{free_port()}/node"
    log_path = tmp_path / "node-brain.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            node_brain,
            "brain.js",
            cwd=NODE_BRAIN_DIR,
            env={**os.environ, "RUTSTER_BRAIN_BIND": bind},
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), NODE_READY_TIMEOUT_S)
        ready = line.decode().strip()
        assert ready == READY_PREFIX + bind, log_path.read_text()

        with pytest.raises(InvalidStatus) as rejected:
            async with connect(bind.replace("/node", "/other")):
                pass
        assert rejected.value.response.status_code == 404
        await _poke_with_garbage(bind)

        report = await run_conformance(bind, require_tool=True)
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            code = await asyncio.wait_for(proc.wait(), NODE_STOP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
    logged = log_path.read_text()
    assert report.passed, explain(report) + "\n" + logged
    got = statuses(report)
    # brain.js declares nothing (the defaults); everything else must pass.
    assert got.pop("hello-declarations") is SKIP, explain(report)
    assert "declares nothing" in report.result("hello-declarations").detail
    assert set(got.values()) == {PASS}, explain(report)
    assert "hangup" in report.result("tool-round-trip").detail
    assert "node-turn-1" in report.result("barge-in").detail
    assert code == 0, logged  # SIGTERM is a graceful stop
    assert "bad messages" in logged and "stopped" in logged
