"""Turn latency through the gateway and the realtime brain, against the MOCK Realtime server.

What the caller waits for after they stop talking is the sum of:

1. the end-of-turn decision: the core's endpointer waits for
   ``RUTSTER_TURN_SILENCE_MS`` of trailing silence (500 ms by default);
2. the pipeline: gateway → tap → realtime brain → OpenAI (commit +
   ``response.create``) → first audio delta → brain → tap → playout → Twilio;
3. OpenAI's own time to first audio, which the mock makes zero. With the real
   service add its time-to-first-audio (measure it with your key and model;
   it is outside rutster's control).

This script measures 1 + 2 end to end on the caller's timeline (the first
20 ms of reply audio the caller hears after each turn), with the gateway and
the brain each in their own process, as deployed. It runs two trailing-silence
settings side by side so the endpointer's share is visible, and splits each
onset in two:

- *end of turn*: when the gateway decided the turn was over, measured by
  replaying each call's caller audio, frame by frame at the same times,
  through the per-call engine production runs (:class:`gateway.media_engine.MediaEngine`,
  built from the same settings), and taking its ``speech_stopped``. It is the
  configured silence counted from where the VAD last heard speech, which is
  not where the script's slice of speech is cut (a slice can end on a fading
  syllable or between words): that is why it is not simply the setting;
- *pipeline*: the onset less that (``speech_stopped`` → brain → mock →
  brain → pacer → the caller's ear).

Resolution is one 20 ms frame (what the caller hears is read frame by frame).

Usage: ``python bench/realtime_latency.py [--calls 4] [--turns 5] [--silence 500,300]``
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import statistics
from pathlib import Path

from rutster.gateway.config import GatewayConfig
from rutster.gateway.media_engine import MediaEngine
from rutster.gateway.server import limit_numeric_threads
from rutster.media.echo_gate import EchoGate, EchoGateConfig
from rutster.media.formats import TWILIO_MULAW_8K
from rutster.media.g711 import ulaw_encode
from rutster.media.vad import SPEECH_THRESHOLD, make_detector
from rutster.protocols.ingress import AudioReceived
from rutster.protocols.tap import SpeechStopped
from rutster.tools.launcher import LOOPBACK, free_port, gateway_process, realtime_brain_process
from rutster.tools.twilio_simulator import (
    SIM_FRAME_BYTES,
    SIM_FRAME_MS,
    ConversationScript,
    TwilioSimulator,
    conversation_script,
    read_wav_8k,
    reply_onsets_ms,
)

SPEECH_WAV = Path(__file__).resolve().parent.parent / "tests/fixtures/audio/caller_speech_8k.wav"
#: Each turn: 2 s of the fixture's fluent speech (from 9 s), then 2.5 s for the reply.
SPEECH_S = 2.0
SPEECH_FROM_S = 9.0
REPLY_WINDOW_S = 2.5
#: The mock's reply length: shorter than the window so turns never overlap.
MOCK_REPLY_MS = 1_500


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def end_of_turn_ms(
    script: ConversationScript, env: dict[str, str], speech_s: float = SPEECH_S
) -> list[float | None]:
    """For each turn, ms from the end of its speech slice to the engine's ``speech_stopped``.

    The caller's audio goes through the engine the gateway runs for a call
    (same settings, same detector and echo gate), one 20 ms frame at a time
    at the time it would arrive; None for a turn the engine never ended.
    """
    config = GatewayConfig.from_env(env)
    engine = MediaEngine(
        TWILIO_MULAW_8K,
        detector=make_detector(config.vad),
        echo=EchoGate(EchoGateConfig(canceller=config.echo_canceller)),
        publish=lambda stage, kind, payload: None,
        speech_threshold=SPEECH_THRESHOLD,
        config=config.media_engine,
    )
    engine.set_brain_connected(True)
    mulaw = ulaw_encode(script.pcm)
    stops: list[float] = []
    for n, at in enumerate(range(0, len(mulaw) - SIM_FRAME_BYTES + 1, SIM_FRAME_BYTES)):
        # When the simulator sends frame n (its caller timeline, which is also
        # the timeline the reply onsets are read on).
        now_ms = float(n * SIM_FRAME_MS)
        for command in engine.on_ingress(
            AudioReceived(mulaw[at : at + SIM_FRAME_BYTES], n * SIM_FRAME_MS), now_ms
        ):
            if isinstance(command, SpeechStopped):
                stops.append(now_ms)
    found: list[float | None] = []
    # A turn's speech starts speech_s before its end; its reply window runs to the
    # next turn's speech. The last stop in that span ends it (a slice with a pause
    # longer than the setting inside it ends twice: the caller's turn ends at the last).
    starts_ms = [(end - speech_s) * 1000 for end in script.turn_ends_s]
    for end_s, start_ms, next_start_ms in zip(
        script.turn_ends_s, starts_ms, [*starts_ms[1:], math.inf], strict=True
    ):
        within = [t for t in stops if start_ms <= t < next_start_ms]
        found.append(within[-1] - end_s * 1000 if within else None)
    return found


async def run_level(
    url: str, token: str, calls: int, turns: int, env: dict[str, str]
) -> tuple[list[float], list[float], list[float], int]:
    """Onsets, ends of turn, the pipeline's share of each onset (less its end of turn), misses."""
    speech = read_wav_8k(SPEECH_WAV)
    onsets: list[float] = []
    turn_ends: list[float] = []
    pipeline: list[float] = []
    missed = 0
    scripts = [
        conversation_script(
            speech,
            turns=turns,
            speech_s=SPEECH_S,
            reply_window_s=REPLY_WINDOW_S,
            speech_from_s=SPEECH_FROM_S + n * 0.7,
        )
        for n in range(calls)
    ]
    sim = TwilioSimulator(url, auth_token=token)
    results = await asyncio.gather(*(sim.place_call(s.pcm, tail_s=0.3) for s in scripts))
    for script, result in zip(scripts, results, strict=True):
        ends = end_of_turn_ms(script, env)
        for onset, end in zip(reply_onsets_ms(result.heard_pcm, script), ends, strict=True):
            if onset is None:
                missed += 1
                continue
            onsets.append(onset)
            # A turn the engine ended before its slice did (a long pause inside it)
            # was answered before the window the onset is read in: no pipeline figure.
            if end is not None and end > 0:
                turn_ends.append(end)
                pipeline.append(onset - end)
    return onsets, turn_ends, pipeline, missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4, help="simultaneous calls per setting")
    parser.add_argument("--turns", type=int, default=5, help="turns per call")
    parser.add_argument("--silence", default="500,300", help="trailing-silence settings, ms")
    args = parser.parse_args()
    settings = [int(s) for s in args.silence.split(",") if s.strip()]
    print(
        f"turn latency, {args.calls} simultaneous calls x {args.turns} turns per setting, "
        "realtime brain (own process) against the MOCK Realtime server (time to first audio 0); "
        "resolution 20 ms"
    )
    print(
        f"{'silence ms':>10} {'turns':>6} {'missed':>6} {'onset p50':>10} {'onset p95':>10} "
        f"{'end of turn p50':>16} {'pipeline p50':>13} {'pipeline p95':>13}"
    )
    limit_numeric_threads()  # the replayed engine, as rutster serve runs it
    with realtime_brain_process(mock_reply_ms=MOCK_REPLY_MS) as brain:
        tap_url = f"ws://{LOOPBACK}:{brain.port}/realtime"
        for silence in settings:
            token = secrets.token_urlsafe(24)
            env = {
                "RUTSTER_TAP_URL": tap_url,
                "TWILIO_AUTH_TOKEN": token,
                "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
                "RUTSTER_TURN_SILENCE_MS": str(silence),
            }
            with gateway_process(env, free_port()) as gateway:
                url = f"http://{LOOPBACK}:{gateway.port}"
                onsets, turn_ends, pipeline, missed = asyncio.run(
                    run_level(url, token, args.calls, args.turns, env)
                )
            if not onsets:
                print(f"{silence:>10} {0:>6} {missed:>6}  no replies heard")
                continue
            if not pipeline:
                print(f"{silence:>10} {len(onsets):>6} {missed:>6}  the replay ended no turn")
                continue
            print(
                f"{silence:>10} {len(onsets):>6} {missed:>6} "
                f"{statistics.median(onsets):>7.0f} ms {percentile(onsets, 95):>7.0f} ms "
                f"{statistics.median(turn_ends):>13.0f} ms "
                f"{statistics.median(pipeline):>10.0f} ms {percentile(pipeline, 95):>10.0f} ms"
            )
            if len(pipeline) < len(onsets):
                print(
                    f"  ({len(onsets) - len(pipeline)} turns without a pipeline figure: the "
                    "replayed engine ended them before their slice of speech did, or never)"
                )


if __name__ == "__main__":
    main()
