"""What batching Silero's inference across calls would save: µs per 32 ms window, by batch.

``python -m bench.vad_batch``. The gateway runs Silero once per window per call, each a
session run of its own (``media/vad.py`` ``SileroDetector``); the model takes a batch
dimension, so the windows of many calls could share one run. This times the shipped
session (same options, same model) on batches of 1 to 32 windows of recorded speech, each
with its own recurrent state, best of ``--rounds`` rounds of ``--runs`` runs, on one core.
It calls ``session.run``; the detector binds its arrays once (io_binding), ~10 µs less a
window alone.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench.vs_pipecat import SPEECH_WAV

# The detector's own shapes (private to media/vad.py: this measures that detector).
from rutster.media.vad import _SILERO_CONTEXT, _SILERO_STATE_SHAPE, _SILERO_WINDOW, _silero_session
from rutster.tools.twilio_simulator import read_wav_8k

#: Batch sizes timed: one call alone, then as many windows as calls a core carries.
BATCHES = (1, 2, 4, 8, 16, 32)
#: Silero's input at 8 kHz: its context before a 256-sample (32 ms) window.
INPUT_SAMPLES = _SILERO_CONTEXT + _SILERO_WINDOW


def time_batch(batch: int, speech: np.ndarray, runs: int, rounds: int) -> float:
    """Best µs per window over ``rounds`` of ``runs`` session runs of ``batch`` windows."""
    session = _silero_session()
    starts = np.linspace(0, len(speech) - INPUT_SAMPLES - 1, batch).astype(int)
    windows = np.stack([speech[s : s + INPUT_SAMPLES] for s in starts])
    layers, _, width = _SILERO_STATE_SHAPE
    state = np.zeros((layers, batch, width), dtype=np.float32)
    rate = np.array(8000, dtype=np.int64)
    feed = {"input": windows, "state": state, "sr": rate}
    for _ in range(10):
        session.run(None, feed)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(runs):
            session.run(None, feed)
        best = min(best, (time.perf_counter() - started) / runs)
    return best / batch * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    pcm = read_wav_8k(SPEECH_WAV)
    speech = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    print(f"Silero (media/vad.py's session), one core, best of {args.rounds} x {args.runs} runs")
    print(f"{'windows a run':>13} {'µs per window':>14} {'against one':>12}")
    alone = None
    for batch in BATCHES:
        us = time_batch(batch, speech, args.runs, args.rounds)
        alone = alone or us
        print(f"{batch:>13} {us:>14.1f} {us / alone:>11.2f}x")


if __name__ == "__main__":
    main()
