"""Barge-in end to end: a caller who talks over every reply, on a clean line.

The reported bug: on a Twilio call with the realtime brain (mock mode), a
caller speaking real recorded speech at ordinary phone level (about -22 dBFS
active level) over the assistant's replies, on a line with no echo at all,
interrupts six times in a row; the first interruptions are caught in
100-125 ms, later ones late or never (no pause, no Twilio ``clear``).

This test plays that call: Twilio simulator (:class:`BargeInCaller`, a
reactive caller) → gateway under uvicorn with default reflex settings
(barge-in on), under the default speech pause rule and the energy rule →
realtime brain in its own process → MOCK Realtime server in
this process, answering every turn with a 4 s voiced reply. The caller says
an opening turn, then interrupts :data:`BARGE_INS` replies in a row, each
after the reply has played 300-900 ms, with 1-2 s of fluent recorded speech
scaled to -22 dBFS active level; between utterances it sends only -70 dBFS
line noise, never the assistant's audio (clean line, no echo).

Per interruption it measures true onset (first 20 ms frame above -40 dBFS, as
sent) → the ``clear`` the simulator received, and asserts every interruption
was paused within :data:`CLEAR_LATENCY_MS` of its pause rule and then confirmed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from rutster.gateway.call import Call
from rutster.gateway.reflex import PauseOn, ReflexConfig
from rutster.media.echo_gate import EchoGate
from rutster.tools.launcher import LOOPBACK, free_port, realtime_brain_process
from rutster.tools.realtime_mock_server import MockRealtimeServer
from rutster.tools.twilio_simulator import (
    SIM_SAMPLE_RATE,
    BargeIn,
    BargeInCaller,
    SimulatedCallResult,
    SpokenUtterance,
    TwilioSimulator,
    active_level_dbfs,
    frame_levels_dbfs,
    scale_to_active_level,
)
from tests.conftest import TEST_AUTH_TOKEN, eventually, gateway_config, serve_gateway

#: The caller's active speech level (the report: ordinary phone level).
CALLER_LEVEL_DBFS = -22.0
#: Mock reply length: long enough that every interruption lands mid-reply.
REPLY_MS = 4_000
#: The opening turn: fluent speech the other realtime e2e tests use (9.0 s on).
OPENING = (9.0, 1.5)
#: (start s, length s) of each interruption's speech in the fixture, and how long
#: the reply has played before the caller starts (ms). The stretches are fluent
#: (no pause over 40 ms under -45 dBFS; checked below), varied and 1-2 s long.
BARGE_INS: tuple[tuple[float, float, float], ...] = (
    (10.5, 1.5, 300),
    (11.82, 1.2, 650),
    (16.8, 1.8, 420),
    (24.76, 1.0, 880),
    (13.62, 1.5, 540),
    (21.5, 1.2, 360),
    (20.0, 1.5, 760),
    (14.08, 1.0, 480),
    (15.0, 1.5, 900),
    (28.2, 1.2, 330),
    (26.0, 1.2, 600),
    (12.2, 1.8, 720),
)
#: Every stretch is one the VAD calls speech within 300 ms of its onset (the
#: confirmation stage counts VAD speech): some of the fixture's stretches, its
#: first second and 18.5, 25.6 and 27 s among them, it does not for 0.4 s or
#: more, and the pause they cause is then undone as noise.
#: Onset → ``clear`` bound. The core pauses after 40 ms of near-end speech
#: (RUTSTER_BARGE_IN_PAUSE_MS), heard on the wire before any resampling
#: (media.narrowband): measured 21-24 ms after the onset frame was sent, every
#: interruption, the first included. End to end come on top: the 20 ms frame
#: granularity of the caller's send timeline, two loopback WebSocket hops, and
#: one event loop shared by the simulator and the gateway (Silero VAD included),
#: which can hold a frame for a few tens of ms on a loaded CI box. 150 ms is ~6x
#: the measured figure, and the issue's P95 goal. (Before the narrowband tap the
#: bound was 250 ms, and the first interruption, in the call's first answer, was
#: allowed 1 s.)
MAX_CLEAR_LATENCY_MS = 150.0
#: The same bound for the default speech rule (gateway/reflex.py PauseOn.SPEECH),
#: which also waits for the VAD to hear a voice: on this fixture it does within
#: 60 ms of most stretches' onsets, and 180-200 ms after the ones at 14.08 and
#: 26.0 s (measured); the end-to-end allowance above on top.
SPEECH_CLEAR_LATENCY_MS = 200.0 + MAX_CLEAR_LATENCY_MS - 40.0
#: Onset -> clear bound per pause rule.
CLEAR_LATENCY_MS = {PauseOn.ENERGY: MAX_CLEAR_LATENCY_MS, PauseOn.SPEECH: SPEECH_CLEAR_LATENCY_MS}


def fixture_slice(pcm: bytes, start_s: float, seconds: float) -> bytes:
    a = int(start_s * SIM_SAMPLE_RATE) * 2
    return pcm[a : a + int(seconds * SIM_SAMPLE_RATE) * 2]


def utterance(pcm: bytes, start_s: float, seconds: float) -> bytes:
    """A fixture stretch at :data:`CALLER_LEVEL_DBFS` active level."""
    return scale_to_active_level(fixture_slice(pcm, start_s, seconds), CALLER_LEVEL_DBFS)


@dataclass
class Interruption:
    """What became of one barge-in (times on the caller's timeline, ms)."""

    index: int
    reply_played_ms: float | None
    onset_ms: float | None
    clear_ms: float | None
    echo_state: str

    @property
    def latency_ms(self) -> float | None:
        if self.onset_ms is None or self.clear_ms is None:
            return None
        return self.clear_ms - self.onset_ms

    def __str__(self) -> str:
        latency = "MISSED (no clear)" if self.latency_ms is None else f"{self.latency_ms:.0f} ms"
        played = self.reply_played_ms or 0.0
        onset = self.onset_ms or 0.0
        return (
            f"#{self.index + 1:2d} after {played:4.0f} ms of reply, "
            f"onset {onset / 1000:6.2f} s: {latency:>18}  [{self.echo_state}]"
        )


def interruptions(
    result: SimulatedCallResult, said: list[SpokenUtterance], echo_states: dict[int, str]
) -> list[Interruption]:
    """Each barge-in with the first ``clear`` after it began, before the next utterance."""
    out: list[Interruption] = []
    for n, spoken in enumerate(said):
        if spoken.kind != "barge_in" or spoken.index is None:
            continue
        until = said[n + 1].start_ms if n + 1 < len(said) else float("inf")
        clears = [t for t in result.clear_times_ms if spoken.start_ms <= t < until]
        out.append(
            Interruption(
                spoken.index,
                spoken.reply_played_ms,
                spoken.onset_ms,
                clears[0] if clears else None,
                echo_states.get(spoken.index, "?"),
            )
        )
    return out


async def watch_echo_gate(
    gw_calls: dict[str, Call], caller: BargeInCaller, states: dict[int, str]
) -> None:
    """Diagnostics: the echo gate's delay and ERL as each barge-in begins."""
    seen = 0
    while True:
        said = [u for u in caller.utterances if u.kind == "barge_in"]
        if len(said) > seen and gw_calls:
            call = next(iter(gw_calls.values()))
            engine = getattr(call, "engine", None)  # the call's media engine, when it has one
            echo = getattr(engine, "echo", None) or getattr(call.reflex, "_echo", None)
            if isinstance(echo, EchoGate):
                for spoken in said[seen:]:
                    assert spoken.index is not None
                    states[spoken.index] = (
                        f"echo delay={echo.delay_ms} ms, ERL={echo.erl_db:.1f} dB"
                    )
            seen = len(said)
        await asyncio.sleep(0.01)


def test_barge_in_speech_fixture_stretches_are_fluent(speech_pcm: bytes) -> None:
    """The scenario's speech is what it claims: fluent, 1-2 s, -22 dBFS active."""
    for start_s, seconds, after_ms in BARGE_INS:
        assert 1.0 <= seconds <= 2.0 and 300 <= after_ms <= 900
        speech = utterance(speech_pcm, start_s, seconds)
        assert abs(active_level_dbfs(speech) - CALLER_LEVEL_DBFS) < 0.2
        levels = frame_levels_dbfs(speech)
        assert levels[0] > -40.0, start_s  # speech from its first frame
        quiet = 0
        for level in levels:
            quiet = quiet + 1 if level < -45.0 else 0
            assert quiet <= 2, f"a pause in the stretch at {start_s} s"
        assert -18.0 <= float(levels.max()) <= -8.0  # frame peaks near -13 dBFS, as reported


@pytest.mark.parametrize("pause_on", [PauseOn.SPEECH, PauseOn.ENERGY])
async def test_every_barge_in_is_heard_on_a_clean_line(
    speech_pcm: bytes, pause_on: PauseOn
) -> None:
    barge_ins = [
        BargeIn(after_ms, utterance(speech_pcm, start_s, seconds))
        for start_s, seconds, after_ms in BARGE_INS
    ]
    caller = BargeInCaller(utterance(speech_pcm, *OPENING), barge_ins)
    echo_states: dict[int, str] = {}
    async with MockRealtimeServer(reply_ms=REPLY_MS) as mock:
        port = free_port()
        with realtime_brain_process(mock.websocket_base_url, port):
            brain_url = f"ws://{LOOPBACK}:{port}/realtime"
            config = gateway_config(brain_url, reflex=ReflexConfig(pause_on=pause_on))
            async with serve_gateway(config) as gw:
                watcher = asyncio.create_task(watch_echo_gate(gw.state.calls, caller, echo_states))
                try:
                    sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
                    result = await sim.place_reactive_call(caller, max_s=100.0)
                finally:
                    watcher.cancel()
                await eventually(lambda: not gw.state.calls)
                (trail,) = gw.state.recent_trails.values()
    found = interruptions(result, caller.utterances, echo_states)
    confirmed = trail.of_type("barge_in_confirmed")
    recoveries = sum(u.kind == "recovery" for u in caller.utterances)
    report = "\n".join(
        [
            f"{len(found)} interruptions, {len(result.clear_times_ms)} clears, "
            f"{len(confirmed)} confirmed, {len(trail.of_type('barge_in_resumed'))} resumed, "
            f"{recoveries} recovery turns",
            *map(str, found),
        ]
    )
    print(report)
    # The call ended cleanly: the caller hung up, nothing else.
    assert not result.hung_up_by_provider
    assert result.close_code == 1000, (result.close_code, result.close_reason)
    (ended,) = trail.of_type("call_ended")
    assert ended.payload["reason"] == "caller_hangup"
    # Every interruption was said (the assistant answered every turn) ...
    assert len(found) == len(BARGE_INS), report
    # ... and every one paused the assistant (Twilio got clear) in time ...
    late = [i for i in found if i.latency_ms is None or i.latency_ms > CLEAR_LATENCY_MS[pause_on]]
    assert not late, f"{len(late)} barge-ins missed or late:\n{report}"
    # ... and was confirmed (1-2 s of speech is far above the 350 ms needed).
    assert len(confirmed) == len(BARGE_INS), report
