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
settings side by side so the endpointer's share is visible, and reports the
pipeline overhead (onset minus the configured silence) P50/P95. Resolution is
one 20 ms frame (what the caller hears is read frame by frame).

Usage: ``python bench/realtime_latency.py [--calls 4] [--turns 5] [--silence 500,300]``
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
from pathlib import Path

from gateway.launcher import LOOPBACK, free_port, gateway_process, realtime_brain_process
from trunk.twilio.simulator import (
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


async def run_level(url: str, token: str, calls: int, turns: int) -> tuple[list[float], int]:
    speech = read_wav_8k(SPEECH_WAV)
    onsets: list[float] = []
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
        for onset in reply_onsets_ms(result.heard_pcm, script):
            if onset is None:
                missed += 1
            else:
                onsets.append(onset)
    return onsets, missed


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
        f"{'pipeline p50':>13} {'pipeline p95':>13}"
    )
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
                onsets, missed = asyncio.run(run_level(url, token, args.calls, args.turns))
            if not onsets:
                print(f"{silence:>10} {0:>6} {missed:>6}  no replies heard")
                continue
            pipeline = [o - silence for o in onsets]
            print(
                f"{silence:>10} {len(onsets):>6} {missed:>6} "
                f"{statistics.median(onsets):>8.0f} ms {percentile(onsets, 95):>7.0f} ms "
                f"{statistics.median(pipeline):>10.0f} ms {percentile(pipeline, 95):>10.0f} ms"
            )


if __name__ == "__main__":
    main()
