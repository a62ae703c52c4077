"""``TapClient`` (the core's reconnecting tap connection) against scripted in-process brains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request

from rutster.base.backoff import Backoff
from rutster.gateway.call import monotonic_ms
from rutster.gateway.metrics import GatewayMetrics
from rutster.gateway.tap_client import (
    OPENING_AUDIO_FRAMES,
    TAP_CLOSE_TIMEOUT_S,
    WARN_LOG_LIMIT,
    TapClient,
)
from rutster.protocols.tap import (
    MAX_MESSAGE_BYTES,
    AudioIn,
    AudioOut,
    BrainEvent,
    BrainHello,
    CallInfo,
    Direction,
    Dtmf,
    FunctionCallOutput,
    Hello,
    SessionEnd,
    SessionEndReason,
    TapDecoder,
    TapEncoder,
    TapEvent,
    ToolStatus,
    UnknownTapEvent,
)
from rutster.tools.launcher import LOOPBACK, free_port
from tests.conftest import eventually
from tests.tap_fixtures import fixture_names, load_fixture, load_fixture_json

SESSION_ID = "ses_0123456789abcdef"
CALL = CallInfo(
    id="CA0001", direction="in", from_="+15550001111", to="+15550002222", provider="twilio"
)
FRAME = bytes(960)  # one silent 20 ms canonical frame
#: Generous bound for anything that should happen "soon" on a loaded 2-core machine.
SOON_S = 10.0
#: Slack allowed on top of TAP_CLOSE_TIMEOUT_S for a close that has to time out.
CLOSE_SLACK_S = 2.0

Script = Callable[["BrainPeer", int], Awaitable[None]]


class BrainPeer:
    """The brain's end of one tap connection, as a script sees it."""

    def __init__(self, ws: ServerConnection, received: list[TapEvent | UnknownTapEvent]) -> None:
        self.ws = ws
        self.received = received
        self._decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        self._encoder = TapEncoder(start_ms=monotonic_ms())

    async def recv(self) -> TapEvent | UnknownTapEvent:
        """The next core event (recorded in ``received``)."""
        event = self._decoder.decode(await asyncio.wait_for(self.ws.recv(), SOON_S))
        self.received.append(event)
        return event

    async def send(self, event: TapEvent) -> None:
        await self.ws.send(self._encoder.encode(event, monotonic_ms()))

    async def read_until_closed(self) -> None:
        """Record everything the core sends until it closes the connection."""
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                self.received.append(self._decoder.decode(message))


class ScriptedBrain:
    """A loopback tap server running ``script(peer, connection_index)`` per connection."""

    def __init__(self, script: Script, *, handshake_delay_s: float = 0.0) -> None:
        self._script = script
        self._handshake_delay_s = handshake_delay_s
        self._server: Server | None = None
        #: Core events received, one list per connection, in connection order.
        self.connections: list[list[TapEvent | UnknownTapEvent]] = []
        self.url = ""

    async def __aenter__(self) -> ScriptedBrain:
        self._server = await serve(
            self._handle,
            LOOPBACK,
            0,
            compression=None,
            close_timeout=0.5,
            process_request=self._delay_handshake,
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://{LOOPBACK}:{port}/brain"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.wait_for(self._server.wait_closed(), SOON_S)

    async def _delay_handshake(self, connection: ServerConnection, request: Request) -> None:
        if self._handshake_delay_s:
            await asyncio.sleep(self._handshake_delay_s)

    async def _handle(self, ws: ServerConnection) -> None:
        received: list[TapEvent | UnknownTapEvent] = []
        index = len(self.connections)
        self.connections.append(received)
        with contextlib.suppress(ConnectionClosed):
            await self._script(BrainPeer(ws, received), index)

    def hellos(self) -> list[Hello]:
        """The first event of each connection (each must be a ``hello``)."""
        firsts = [events[0] for events in self.connections if events]
        assert all(isinstance(e, Hello) for e in firsts), firsts
        return [e for e in firsts if isinstance(e, Hello)]


class RecordingBackoff(Backoff):
    """A fast backoff that records what the client asked of it."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__((delay_s,))
        self.calls: list[str] = []

    def next_delay(self) -> float:
        self.calls.append("next_delay")
        return super().next_delay()

    def reset(self) -> None:
        self.calls.append("reset")
        super().reset()


class Harness:
    """A ``TapClient`` for one fake call, its metrics and the brain events it delivered."""

    def __init__(self, url: str, backoff: Backoff | None = None) -> None:
        self.metrics = GatewayMetrics()
        self.events: list[BrainEvent] = []
        self.client = TapClient(
            url,
            make_hello=lambda resume: Hello(session_id=SESSION_ID, resume=resume, call=CALL),
            on_event=self._on_event,
            metrics=self.metrics,
            clock_ms=monotonic_ms,
            call_label="test-call",
            backoff=backoff if backoff is not None else RecordingBackoff(),
        )
        self.on_event_hook: Callable[[BrainEvent], None] | None = None
        self.task: asyncio.Task[None] | None = None

    async def _on_event(self, event: BrainEvent) -> None:
        self.events.append(event)
        if self.on_event_hook is not None:
            self.on_event_hook(event)

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    def drops(self, kind: str) -> float:
        return self.metric("rutster_tap_send_drops_total", kind=kind)

    def start(self) -> None:
        self.task = asyncio.create_task(self.client.run())

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@contextlib.asynccontextmanager
async def running(url: str, backoff: Backoff | None = None) -> AsyncIterator[Harness]:
    harness = Harness(url, backoff)
    harness.start()
    try:
        yield harness
    finally:
        await harness.stop()


async def wait_run_finished(harness: Harness) -> None:
    assert harness.task is not None
    await asyncio.wait_for(asyncio.shield(harness.task), SOON_S)


# ---- hello and events ---------------------------------------------------------------


async def test_hello_first_then_audio_both_ways() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        await peer.send(BrainHello("scripted", "1.0"))
        await peer.send(AudioOut(b"\x01\x00" * 480, item="item_1"))
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        await asyncio.wait_for(h.client.connected_event.wait(), SOON_S)
        assert h.client.connected
        assert await h.client.send_audio_in(FRAME)
        assert await h.client.send(Dtmf("5"), kind="dtmf")
        await eventually(lambda: len(h.events) == 2, SOON_S)
        await eventually(lambda: len(brain.connections[0]) == 3, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)

    first, audio, dtmf = brain.connections[0][:3]
    assert isinstance(first, Hello)
    assert first.session_id == SESSION_ID and first.resume is False and first.call == CALL
    assert isinstance(audio, AudioIn) and audio.pcm == FRAME
    assert dtmf == Dtmf("5")
    assert h.events == [BrainHello("scripted", "1.0"), AudioOut(b"\x01\x00" * 480, "item_1")]
    assert h.client.connections == 1
    assert h.metric("rutster_tap_connects_total") == 1
    assert h.metric("rutster_tap_reconnects_total") == 0
    assert h.drops("audio_in") == 0


# ---- losing the brain -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_reconnects_with_resume_and_the_same_session(how: str) -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        if index == 0:
            if how == "close":
                await peer.ws.close(1011, "brain restarting")
            else:
                peer.ws.transport.abort()  # no closing handshake at all
            return
        await peer.send(BrainHello("scripted", "1.0"))
        await peer.read_until_closed()

    backoff = RecordingBackoff()
    async with ScriptedBrain(script) as brain, running(brain.url, backoff) as h:
        await eventually(lambda: h.client.connections == 2 and h.client.connected, SOON_S)
        await eventually(lambda: len(h.events) == 1, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)

    first, second = brain.hellos()
    assert first.resume is False
    assert second.resume is True
    assert first.session_id == second.session_id == SESSION_ID
    assert second.call == CALL
    assert len(brain.connections) == 2
    assert h.metric("rutster_tap_connects_total") == 2
    assert h.metric("rutster_tap_reconnects_total") == 1
    # Reset on each success, one backoff step for the one loss.
    assert backoff.calls == ["reset", "next_delay", "reset"]


async def test_backoff_restarts_after_each_successful_connection() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        if index < 3:
            await peer.ws.close()
            return
        await peer.read_until_closed()

    backoff = RecordingBackoff()
    async with ScriptedBrain(script) as brain, running(brain.url, backoff) as h:
        await eventually(lambda: h.client.connections == 4 and h.client.connected, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)
    assert [hello.resume for hello in brain.hellos()] == [False, True, True, True]
    assert backoff.calls == ["reset", "next_delay"] * 3 + ["reset"]
    assert h.metric("rutster_tap_reconnects_total") == 3


async def test_unreachable_brain_is_retried_and_counted() -> None:
    url = f"ws://{LOOPBACK}:{free_port()}/nobody"  # nothing listens there
    backoff = RecordingBackoff()
    async with running(url, backoff) as h:
        await eventually(lambda: h.metric("rutster_tap_connect_failures_total") >= 3, SOON_S)
        assert not h.client.connected
        assert h.client.down_since_ms is not None
        assert not await h.client.send_audio_in(FRAME)
        await h.client.close(SessionEndReason.CALLER_HANGUP)
        await wait_run_finished(h)
    assert "reset" not in backoff.calls
    assert h.metric("rutster_tap_connects_total") == 0


# ---- sends while disconnected ---------------------------------------------------------


async def test_sends_while_disconnected_are_dropped_and_counted() -> None:
    resumed = asyncio.Event()

    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        if index == 0:
            await peer.recv()  # the call's opening, held until now
            await peer.ws.close()
            return
        resumed.set()
        await peer.read_until_closed()

    # Long enough a backoff that the client is observably down for a while.
    backoff = RecordingBackoff(delay_s=1.0)
    async with ScriptedBrain(script) as brain:
        h = Harness(brain.url, backoff)
        # Before run() has connected at all: the call's opening audio waits for the
        # brain (OPENING_AUDIO_FRAMES); anything else is dropped.
        assert not await h.client.send_audio_in(FRAME)
        assert not await h.client.send(Dtmf("1"), kind="dtmf")
        assert h.drops("audio_in") == 0 and h.drops("dtmf") == 1
        h.start()
        try:
            # Connected, then lost: the client is in its backoff sleep.
            await eventually(lambda: len(brain.connections) == 1, SOON_S)
            await eventually(lambda: not h.client.connected and h.client.connections == 1, SOON_S)
            for _ in range(5):
                assert not await h.client.send_audio_in(FRAME)
            assert h.drops("audio_in") == 5
            # Back again: sends flow once more and nothing dropped is replayed.
            await asyncio.wait_for(resumed.wait(), SOON_S)
            await eventually(lambda: h.client.connected, SOON_S)
            assert await h.client.send_audio_in(FRAME)
            await eventually(lambda: len(brain.connections[1]) == 2, SOON_S)
            assert h.drops("audio_in") == 5
            await h.client.close(SessionEndReason.CALLER_HANGUP)
        finally:
            await h.stop()
    second = brain.connections[1]
    assert isinstance(second[0], Hello) and second[0].resume
    assert isinstance(second[1], AudioIn)
    # The opening frame went to the first connection, right after the hello.
    first = brain.connections[0]
    assert isinstance(first[0], Hello) and first[1] == AudioIn(FRAME)
    assert sum(isinstance(e, AudioIn) for e in first) == 1
    assert h.client.opening_frames_sent == 1


async def test_the_calls_opening_waits_for_the_brain_in_order_and_bounded() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.read_until_closed()

    frames = [bytes([n % 256]) * 960 for n in range(OPENING_AUDIO_FRAMES + 5)]
    async with ScriptedBrain(script) as brain:
        h = Harness(brain.url, RecordingBackoff())
        for frame in frames:
            assert not await h.client.send_audio_in(frame)
        # The oldest beyond the bound are dropped, counted.
        assert h.drops("audio_in") == 5
        h.start()
        try:
            want = OPENING_AUDIO_FRAMES + 1
            await eventually(
                lambda: bool(brain.connections) and len(brain.connections[0]) == want, SOON_S
            )
            await h.client.close(SessionEndReason.CALLER_HANGUP)
        finally:
            await h.stop()
    hello, *audio = brain.connections[0][:want]
    assert isinstance(hello, Hello)
    assert audio == [AudioIn(frame) for frame in frames[5:]]
    assert h.client.opening_frames_sent == OPENING_AUDIO_FRAMES
    assert h.metric("rutster_frames_to_brain_total") == OPENING_AUDIO_FRAMES


# ---- close ------------------------------------------------------------------------------


async def test_close_sends_session_end_and_stops_reconnecting() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain:
        async with running(brain.url) as h:
            await eventually(lambda: h.client.connected, SOON_S)
            await h.client.close(SessionEndReason.HANGUP_TOOL)
            await wait_run_finished(h)
            assert not h.client.connected
            assert not await h.client.send_audio_in(FRAME)
            assert h.drops("audio_in") == 1
            # A second close is harmless.
            await h.client.close(SessionEndReason.HANGUP_TOOL)
        await asyncio.sleep(0.3)  # many backoff periods: no reconnect may happen
        assert len(brain.connections) == 1
    events = brain.connections[0]
    assert isinstance(events[0], Hello)
    assert events[-1] == SessionEnd(SessionEndReason.HANGUP_TOOL)
    assert h.metric("rutster_tap_reconnects_total") == 0


async def test_close_while_waiting_to_retry_stops_the_loop() -> None:
    url = f"ws://{LOOPBACK}:{free_port()}/nobody"
    async with running(url, RecordingBackoff(delay_s=0.3)) as h:
        await eventually(lambda: h.metric("rutster_tap_connect_failures_total") >= 1, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)
        await wait_run_finished(h)
        failures = h.metric("rutster_tap_connect_failures_total")
    assert failures <= 2  # at most the attempt already under way when close() came


def stop_reading_after_hello(release: asyncio.Event) -> Callable[[BrainPeer, int], Awaitable[None]]:
    """A brain that reads ``hello``, then never reads again until ``release``."""

    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        # Stop reading: nothing more the core sends (close frame included) is seen.
        peer.ws.transport.pause_reading()
        try:
            await release.wait()
        finally:
            peer.ws.transport.abort()

    return script


async def test_close_does_not_hang_on_a_brain_that_never_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    script = stop_reading_after_hello(release)

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        try:
            await eventually(lambda: h.client.connected, SOON_S)
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="rutster.gateway.tap_client"):
                await asyncio.wait_for(
                    h.client.close(SessionEndReason.CALLER_HANGUP), TAP_CLOSE_TIMEOUT_S + SOON_S
                )
            elapsed = time.monotonic() - started
            await wait_run_finished(h)
        finally:
            release.set()
    assert elapsed < TAP_CLOSE_TIMEOUT_S + CLOSE_SLACK_S, elapsed
    assert not h.client.connected
    # session_end went out; the brain never closed: the log tells which of the two failed.
    cut = [r.getMessage() for r in caplog.records if "brain socket cut" in r.getMessage()]
    assert len(cut) == 1 and "closing handshake not completed" in cut[0], cut


async def test_close_during_a_dial_stops_the_client() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        await peer.read_until_closed()

    async with ScriptedBrain(script, handshake_delay_s=0.5) as brain, running(brain.url) as h:
        await asyncio.sleep(0.1)  # the dial is waiting for the slow handshake
        await h.client.close(SessionEndReason.CALLER_HANGUP)
        assert h.task is not None
        try:
            await asyncio.wait_for(asyncio.shield(h.task), 2.0)
        except TimeoutError:
            pytest.fail("run() kept going after close()")
        assert not h.client.connected


# ---- what the brain sends -----------------------------------------------------------------


async def test_bad_brain_messages_are_dropped_counted_and_rate_limited_in_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = AudioOut(b"\x02\x00" * 240)

    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        for bad in [
            "not json",
            '["an", "array"]',
            '{"v":2,"type":"audio_out","seq":0,"ts":0,"pcm":"AAAA","samples":2}',
            '{"v":1,"type":"audio_out","seq":1,"ts":0,"pcm":"@@@@","samples":2}',
            '{"v":1,"type":"audio_out","seq":2,"ts":0,"pcm":"AAAA","samples":5}',
            '{"v":1,"type":"from_the_future","seq":3,"ts":0}',
        ]:
            await peer.ws.send(bad)
        await peer.ws.send(b"\xff\xfe binary")
        await peer.send(good)
        await peer.read_until_closed()

    caplog.set_level(logging.DEBUG, logger="rutster.gateway.tap_client")
    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        await eventually(lambda: len(h.events) == 1, SOON_S)
        assert h.client.connected  # nothing there is a reason to close
        await h.client.close(SessionEndReason.CALLER_HANGUP)
    assert h.events == [good]
    assert len(brain.connections) == 1

    def bad(reason: str) -> float:
        return h.metric("rutster_bad_messages_total", source="brain", reason=reason)

    assert bad("malformed_json") == 1
    assert bad("not_an_object") == 1
    assert bad("bad_version") == 1
    assert bad("bad_base64") == 1
    assert bad("bad_audio_length") == 1
    assert bad("bad_utf8") == 1
    assert h.metric("rutster_unknown_events_total", source="brain") == 1
    # Seven problems: only the first few are warnings, the rest are debug lines.
    problems = [
        r
        for r in caplog.records
        if "dropped a" in r.getMessage() and r.name == "rutster.gateway.tap_client"
    ]
    assert len(problems) == 7
    assert [r.levelno for r in problems].count(logging.WARNING) == WARN_LOG_LIMIT
    assert all("test-call" in r.getMessage() for r in problems)


async def test_a_failing_event_handler_does_not_kill_the_connection() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        await peer.send(BrainHello("first", "1"))
        await peer.send(BrainHello("second", "1"))
        await peer.read_until_closed()

    def explode_once(event: BrainEvent) -> None:
        if isinstance(event, BrainHello) and event.name == "first":
            raise RuntimeError("handler bug")

    async with ScriptedBrain(script) as brain:
        h = Harness(brain.url)
        h.on_event_hook = explode_once
        h.start()
        try:
            await eventually(lambda: len(h.events) == 2, SOON_S)
            assert h.client.connected
            await h.client.close(SessionEndReason.CALLER_HANGUP)
        finally:
            await h.stop()
    assert h.metric("rutster_bad_messages_total", source="brain", reason="handler_error") == 1
    assert len(brain.connections) == 1


async def test_oversized_frame_closes_the_connection_and_the_client_reconnects() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        if index == 0:
            await peer.ws.send("x" * (MAX_MESSAGE_BYTES + 1))
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        await eventually(lambda: h.client.connections == 2 and h.client.connected, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)
    assert h.metric("rutster_bad_messages_total", source="brain", reason="too_large") == 1
    assert h.metric("rutster_tap_reconnects_total") == 1
    assert [hello.resume for hello in brain.hellos()] == [False, True]


# ---- a brain that stops reading ---------------------------------------------------------------


#: Sends tried against a brain that stopped reading: enough to fill loopback's
#: kernel socket buffers (~4 MB measured) several times over with 1.3 KB frames.
STALLED_BRAIN_SENDS = 20_000
#: A send that takes this long has blocked the caller's media path.
SEND_BLOCKED_S = 1.0


async def test_a_brain_that_stops_reading_never_blocks_sends() -> None:
    release = asyncio.Event()
    script = stop_reading_after_hello(release)

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        try:
            await eventually(lambda: h.client.connected, SOON_S)
            for n in range(STALLED_BRAIN_SENDS):
                try:
                    await asyncio.wait_for(h.client.send_audio_in(FRAME), SEND_BLOCKED_S)
                except TimeoutError:
                    pytest.fail(f"send #{n} blocked for over {SEND_BLOCKED_S}s")
                if h.drops("audio_in") >= 10:
                    break
            assert h.drops("audio_in") >= 10
        finally:
            release.set()
            h.client._closing = True  # stop it redialling while the brain goes away
            await h.stop()


async def test_function_call_output_reaches_the_brain() -> None:
    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        await eventually(lambda: h.client.connected, SOON_S)
        answer = FunctionCallOutput(id="fc_1", status=ToolStatus.REJECTED, result={"why": "no"})
        assert await h.client.send(answer, kind="function_call_output")
        await eventually(lambda: len(brain.connections[0]) == 2, SOON_S)
        await h.client.close(SessionEndReason.CALLER_HANGUP)
    assert brain.connections[0][1] == answer


# ---- golden fixtures: the core side of the contract ----------------------------------------


async def test_core_accepts_every_golden_brain_message() -> None:
    """Every brain → core fixture, sent raw by a brain, reaches the core as a valid event."""
    names = fixture_names(Direction.BRAIN_TO_CORE)

    async def script(peer: BrainPeer, index: int) -> None:
        await peer.recv()
        for name in names:
            await peer.ws.send(load_fixture(Direction.BRAIN_TO_CORE, name))
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain, running(brain.url) as h:
        await eventually(lambda: len(h.events) == len(names), SOON_S)
        expected = [
            type(
                TapDecoder(Direction.BRAIN_TO_CORE).decode(load_fixture(Direction.BRAIN_TO_CORE, n))
            )
            for n in names
        ]
        assert [type(e) for e in h.events] == expected
        assert h.metric("rutster_unknown_events_total", source="brain") == 0
        bad = [
            sample.value
            for metric in h.metrics.bad_messages.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        ]
        assert not any(bad)


async def test_core_hello_has_the_golden_shape() -> None:
    """The core's first message has exactly the fields of the golden ``hello`` fixture."""
    golden = load_fixture_json(Direction.CORE_TO_BRAIN, "hello")
    seen: list[str | bytes] = []

    async def script(peer: BrainPeer, index: int) -> None:
        seen.append(await peer.ws.recv())
        await peer.read_until_closed()

    async with ScriptedBrain(script) as brain, running(brain.url):
        await eventually(lambda: bool(seen), SOON_S)
    hello = json.loads(seen[0])

    def shape(value: object) -> object:
        if isinstance(value, dict):
            return {key: shape(v) for key, v in value.items()}
        return type(value).__name__

    assert shape(hello) == shape(golden)
