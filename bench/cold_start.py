"""What a part of a call's work costs when it does not run back to back: µs per operation.

``python -m bench.cold_start``. In the gateway a part of the per-call engine runs once per
frame, between a media message's other work (JSON, base64, sockets, the other parts) and,
with few calls, after the event loop slept on its sockets; replayed alone
(``bench/reflex_cost.py``) it runs back to back. This times two parts on one core right
after each of two kinds of gap, and again straight after (the same work, warm):

- *idle*: a sleep of 0 to 20 ms (a core that was idle);
- *other work*: 1 to 20 media messages' worth of other work (a Twilio message's JSON and
  base64 both ways, and an FFT of its frame), as a frame's other work runs between two of
  its Silero windows.

The two parts:

- *Silero window*: one inference of the shipped VAD (``media/vad.py``
  ``SileroDetector`` on its default engine, its recurrent state carried), 32 ms of
  recorded speech; and, where that engine is the compiled kernel, *Silero ORT*: the same
  in onnxruntime (io-bound arrays), side by side;
- *coherence test*: the echo gate's waveform test (``media/line_echo.py``
  ``normalised_xcorr_peak`` on the gate's sizes: two 20 ms frames heard against the render of
  the whole lag range), on the same speech.

Printed per gap: the median µs of the first operation after it (*after gap*), the median
of the next ``WARM_FOLLOWERS`` (*warm*), and their ratio. Whether the idle kind matters in
the gateway is measured by ``bench/vs_pipecat.py --keep-core-awake`` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.vs_pipecat import SPEECH_WAV
from rutster.gateway.server import limit_numeric_threads
from rutster.media.echo_gate import DELAY_SPREAD_MS, MAX_DELAY_MS, MIN_DELAY_MS
from rutster.media.formats import FRAME_MS, NARROWBAND_FRAME_SAMPLES
from rutster.media.line_echo import normalised_xcorr_peak
from rutster.media.vad import DEFAULT_SILERO_ENGINE, SileroDetector
from rutster.tools.twilio_simulator import read_wav_8k

#: Idle gaps timed (ms): none, then what a core sees between calls' messages at 40 down
#: to one call (a message per call every 20 ms; ``bench/vs_pipecat.py``'s levels).
GAPS_MS = (0.0, 0.5, 2.0, 5.0, 10.0, 20.0)
#: Other work between operations, in media messages' worth (seed decision: one message,
#: then a few calls' messages handled in one turn of the event loop).
MESSAGES_BETWEEN = (1, 5, 20)
#: Operations timed straight after the first, warm (seed decision: 3 gives a steady median).
WARM_FOLLOWERS = 3
#: Sleeps per gap (seed decision: medians within a few % from run to run at 300).
ROUNDS = 300


def silero_op(speech: np.ndarray, engine: str | None = None) -> Callable[[], None]:
    """One Silero window per call, walking through ``speech`` (frames of 8 kHz PCM16), in
    ``engine`` (None: the default, media/vad.py DEFAULT_SILERO_ENGINE)."""
    detector = SileroDetector(engine)
    frame_bytes = NARROWBAND_FRAME_SAMPLES * 2
    pcm = speech.astype("<i2").tobytes()
    frames = [pcm[i : i + frame_bytes] for i in range(0, len(pcm) - frame_bytes, frame_bytes)]
    position = [0]

    def op() -> None:
        # Feed frames until one window runs (a window is 1.6 frames): the work is the
        # inference; the frame copies around it are a few µs.
        windows = detector._windows  # the detector's own count, read to stop after one
        while detector._windows == windows:
            detector.process(frames[position[0] % len(frames)])
            position[0] += 1

    return op


def coherence_op(speech: np.ndarray) -> Callable[[], None]:
    """The echo gate's coherence test on the gate's sizes, walking through ``speech``."""
    # As EchoGate._coherence reads it: render slots from the least lag less the spread
    # to the largest plus twice the spread, and one more for the older frame heard.
    spread = DELAY_SPREAD_MS / FRAME_MS
    rows = int((MAX_DELAY_MS / FRAME_MS + 2 * spread) - (MIN_DELAY_MS / FRAME_MS - spread) + 2)
    render_samples = rows * NARROWBAND_FRAME_SAMPLES
    capture_samples = 2 * NARROWBAND_FRAME_SAMPLES
    signal = speech.astype(np.float64)
    span = len(signal) - render_samples - 1
    position = [0]

    def op() -> None:
        start = (position[0] * NARROWBAND_FRAME_SAMPLES) % span
        position[0] += 1
        render = signal[start : start + render_samples]
        normalised_xcorr_peak(render, render[-capture_samples:] * 0.3)

    return op


def sleep_gap(gap_ms: float) -> Callable[[], None]:
    """A sleep of ``gap_ms`` (none for 0)."""

    def gap() -> None:
        if gap_ms:
            time.sleep(gap_ms / 1000)

    return gap


def message_work(speech: np.ndarray, messages: int) -> Callable[[], None]:
    """``messages`` media messages' other work: a Twilio message's JSON and base64 each
    way and an FFT of its 20 ms frame."""
    frame = speech[:NARROWBAND_FRAME_SAMPLES]
    payload = frame.astype("<i2").tobytes()[:NARROWBAND_FRAME_SAMPLES]  # μ-law's size
    message = {"event": "media", "streamSid": "MZ" + "0" * 32, "media": {"payload": ""}}

    def gap() -> None:
        for _ in range(messages):
            message["media"] = {"payload": base64.b64encode(payload).decode("ascii")}
            parsed = json.loads(json.dumps(message))
            base64.b64decode(parsed["media"]["payload"])
            np.fft.rfft(frame)

    return gap


def time_after_gap(
    op: Callable[[], None], gap: Callable[[], None], rounds: int
) -> tuple[float, float]:
    """(median µs of the first ``op`` after ``gap``, median µs of the next ones)."""
    first: list[float] = []
    warm: list[float] = []
    for _ in range(20):
        op()
    for _ in range(rounds):
        gap()
        started = time.perf_counter()
        op()
        first.append(time.perf_counter() - started)
        for _ in range(WARM_FOLLOWERS):
            started = time.perf_counter()
            op()
            warm.append(time.perf_counter() - started)
    return statistics.median(first) * 1e6, statistics.median(warm) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    limit_numeric_threads()
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    speech = np.frombuffer(read_wav_8k(SPEECH_WAV), dtype="<i2").astype(np.float64)
    ops = {"Silero window": silero_op(speech)}
    if DEFAULT_SILERO_ENGINE != "onnxruntime":
        ops["Silero ORT"] = silero_op(speech, "onnxruntime")
    ops["coherence test"] = coherence_op(speech)
    gaps = {f"idle {ms:.1f} ms": sleep_gap(ms) for ms in GAPS_MS}
    gaps |= {f"{n} messages' work": message_work(speech, n) for n in MESSAGES_BETWEEN}
    print(
        f"one core ({core}); per gap, {args.rounds} rounds; median µs of the first operation "
        f"after the gap, and of the {WARM_FOLLOWERS} straight after it; Silero window: "
        f"{DEFAULT_SILERO_ENGINE}"
    )
    print(f"{'operation':<16}{'gap':>22}{'after gap':>11}{'warm':>8}{'ratio':>8}")
    for name, op in ops.items():
        for label, gap in gaps.items():
            cold, hot = time_after_gap(op, gap, args.rounds)
            print(f"{name:<16}{label:>22}{cold:>9.0f}µs{hot:>6.0f}µs{cold / hot:>7.2f}x")


if __name__ == "__main__":
    main()
