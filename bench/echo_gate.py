"""Echo gate quality and cost: ``python bench/echo_gate.py``.

Builds simulated calls in which the caller's line returns the assistant's own
voice: the assistant's canonical frames go through the real outbound path
(:class:`~media.transform.OutboundTransform`, 24 -> 8 kHz, μ-law), are delayed
by the send-ahead and a network round trip, filtered by a short random echo
path, attenuated by the echo return loss (ERL) with a slow level wobble, mixed
with a little line noise (and, for double talk, the caller's own speech) and
μ-law encoded again. Everything is seeded.

The gate is fed what :class:`~gateway.media_engine.MediaEngine` feeds it:
narrowband frames (8 kHz, :mod:`media.narrowband`) on the wire side of the
resamplers. Render: each canonical frame's outbound resampled PCM, before the
μ-law encoding, cut by a :class:`~media.narrowband.NarrowbandTap` and given
that canonical frame's send time. Capture: the line's μ-law decoded 20 ms
chunk by chunk and cut by another tap, with no inbound resampler. The echo
delay the gate finds is the round trip plus the send-ahead only (and the 20
ms a capture frame takes to arrive whole: measured 160, 280 and 480 ms at 80,
200 and 400 ms round trip, 20 dB ERL), no resampler's delay in it.

The assistant is the speech fixture's 3-9 s and the mock voice
(:func:`tools.realtime_mock_voice.synthesize_reply`); the caller is the
fixture's 9-14 s and 19-24 s, so the two never share audio.

Per delay/ERL condition it prints, side by side for the energy gate
(:class:`~media.echo_gate.EchoGate`) and for the gate behind WebRTC's AEC3
(``EchoGateConfig(canceller=True)``, running at 8 kHz, when ``pywebrtc-audio``
is installed):
on echo alone, false near-end frames in the first 500 ms of audible echo,
then the share of frames with audible echo wrongly called near end, false
runs per minute of echo and the longest run; in double talk, the share of
caller-speech frames over echo called near end and the worst time from a
caller utterance's onset to three near-end frames in a row; and µs per frame
(render + capture). A second table changes the echo path mid-call.
``--stall-ms`` makes the caller's frames arrive in bursts after network stalls.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from rutster.media.echo_gate import (
    NEAR_END_FLOOR_DBFS,
    EchoCancellerUnavailableError,
    EchoGate,
    EchoGateConfig,
    EchoVerdict,
)
from rutster.media.endpointing import frame_level_dbfs
from rutster.media.formats import (
    CANONICAL_FRAME_BYTES,
    FRAME_MS,
    NARROWBAND_FRAME_BYTES,
    TWILIO_MULAW_8K,
    Encoding,
    MediaFormat,
)
from rutster.media.g711 import ulaw_decode, ulaw_encode
from rutster.media.narrowband import NarrowbandTap
from rutster.media.transform import InboundTransform, OutboundTransform
from rutster.tools.realtime_mock_voice import synthesize_reply
from rutster.tools.twilio_simulator import read_wav_8k

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/audio/caller_speech_8k.wav"

#: Wire sample rate of the simulated line (Twilio: μ-law 8 kHz).
WIRE_RATE = TWILIO_MULAW_8K.sample_rate
#: Samples per millisecond on the wire.
WIRE_PER_MS = WIRE_RATE // 1000
#: Twilio's 20 ms μ-law chunk (docs/PROVIDERS.md §1.3).
WIRE_CHUNK = WIRE_RATE * FRAME_MS // 1000
#: How far ahead of playout the pacer sends (brief: ~60 ms).
SEND_AHEAD_MS = 60
#: Network round trips simulated (brief: typically 100-400 ms; 80 as a short one).
DELAYS_MS = (80, 200, 400)
#: Echo return losses simulated (brief: typically 10-30 dB, sometimes 6).
ERLS_DB = (6.0, 10.0, 20.0, 30.0)
#: Line noise added on the caller's side (seed decision: "a little noise",
#: well under the near-end floor and a telephone talker's -20 dBFS).
LINE_NOISE_DBFS = -65.0
#: Slow echo level wobble (brief: "small level changes"): +-2 dB at 0.1 Hz.
WOBBLE_DB = 2.0
WOBBLE_HZ = 0.1
#: Echo path impulse response (seed decision): 8 ms of exponentially decaying
#: random taps (2 ms time constant) at 8 kHz, like a short hybrid or
#: handset-speaker coupling; scaled to unit gain on the assistant's speech.
ECHO_PATH_TAPS = 64
ECHO_PATH_DECAY_MS = 2.0
#: Mean time between network stalls in the stalled variant (seed decision).
STALL_EVERY_MS = 3000.0
#: Gaps between the assistant's utterances (seed decision).
UTTERANCE_GAP_MS = 600
#: Mock voice utterance length.
MOCK_UTTERANCE_MS = 8000
#: Fixture spans used (brief): assistant 3-9 s; caller 9-14 s and 19-24 s.
ASSISTANT_SPAN_S = (3.0, 9.0)
CALLER_SPANS_S = ((19.0, 24.0), (9.0, 14.0))
#: Where the caller's two utterances start in the double-talk call (over the
#: assistant's first and second utterance).
CALLER_STARTS_MS = (1500, 8000)
#: Echo level a frame must have for its echo to be audible, i.e. to count in
#: the false near-end rate: the gate's near-end floor (below it no frame can be
#: near end at all).
AUDIBLE_ECHO_DBFS = NEAR_END_FLOOR_DBFS
#: Caller level that counts as caller speech when scoring double talk (seed
#: decision: the fixture's voiced frames are -15 to -30 dBFS, its pauses -40
#: to -55).
CALLER_SPEECH_DBFS = -35.0
#: Frames skipped after the echo is first audible before false alarms are
#: counted (brief: "after a short convergence, say the first 500 ms").
CONVERGENCE_FRAMES = 500 // FRAME_MS
#: Consecutive near-end frames a barge-in is taken to need (brief: the reflex
#: loop requires several in a row).
BARGE_IN_FRAMES = 3
#: Echo path changes simulated on echo alone, at PATH_CHANGE_AT capture frames
#: (seed decision: 14 s in, over the assistant's second utterance):
#: ((round trip ms, ERL dB) before, after).
PATH_CHANGE_AT = 700
PATH_CHANGES = (
    ((200, 20.0), (200, 12.0)),
    ((200, 20.0), (200, 8.0)),
    ((200, 20.0), (400, 20.0)),
    ((400, 20.0), (80, 20.0)),
    ((200, 10.0), (200, 30.0)),
)
_L16_8K = MediaFormat(Encoding.L16, WIRE_RATE)
_FULL_SCALE = 32768.0


def _pcm(samples: npt.NDArray[np.float64]) -> bytes:
    """Round and saturate float samples to s16le."""
    return np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()


def _samples(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def _frames(pcm: bytes) -> list[bytes]:
    """Whole canonical frames of 24 kHz PCM (a short tail is dropped)."""
    usable = len(pcm) - len(pcm) % CANONICAL_FRAME_BYTES
    return [pcm[i : i + CANONICAL_FRAME_BYTES] for i in range(0, usable, CANONICAL_FRAME_BYTES)]


def _fixture_span(speech_8k: bytes, span_s: tuple[float, float]) -> npt.NDArray[np.float64]:
    start, stop = (int(s * WIRE_RATE) for s in span_s)
    return _samples(speech_8k)[start:stop]


def assistant_frames(speech_8k: bytes) -> list[bytes]:
    """The assistant's side of a call: canonical frames, about 31 s.

    The fixture's 3-9 s (through the inbound path to 24 kHz, as a brain's
    audio would be), a mock-voice utterance, the fixture span again 4 dB
    quieter and another mock utterance, with short silences between.
    """
    fixture_24k = b"".join(
        InboundTransform(_L16_8K).process(_pcm(_fixture_span(speech_8k, ASSISTANT_SPAN_S)))
    )
    quieter = _pcm(_samples(fixture_24k) * 10 ** (-4.0 / 20))
    gap = bytes(CANONICAL_FRAME_BYTES * (UTTERANCE_GAP_MS // FRAME_MS))
    parts = [
        fixture_24k,
        gap,
        synthesize_reply(MOCK_UTTERANCE_MS, seed=1),
        gap,
        quieter,
        gap,
        synthesize_reply(MOCK_UTTERANCE_MS, seed=2),
        gap,
    ]
    return _frames(b"".join(parts))


def caller_signal(speech_8k: bytes, length: int) -> npt.NDArray[np.float64]:
    """The caller's speech at 8 kHz for a double-talk call ``length`` samples long."""
    caller = np.zeros(length)
    for span, start_ms in zip(CALLER_SPANS_S, CALLER_STARTS_MS, strict=True):
        part = _fixture_span(speech_8k, span)
        start = start_ms * WIRE_PER_MS
        stop = min(length, start + len(part))
        caller[start:stop] += part[: stop - start]
    return caller


@dataclass(frozen=True, slots=True)
class Call:
    """One simulated call, frame by frame, with what each capture frame really holds."""

    render: list[tuple[bytes, float]]  # (narrowband frame, sent_ms of its canonical frame)
    capture: list[tuple[bytes, float]]  # (narrowband frame, now_ms)
    echo_dbfs: npt.NDArray[np.float64]  # echo alone in each capture frame
    caller_dbfs: npt.NDArray[np.float64]  # caller alone in each capture frame


def _narrowband_levels(signal_8k: npt.NDArray[np.float64], count: int) -> npt.NDArray[np.float64]:
    """Per narrowband frame level of an 8 kHz signal, aligned with the capture frames.

    At the 8 kHz wire rate the capture tap only frames, so frame k of the
    signal is exactly what capture frame k holds of it.
    """
    pcm = _pcm(signal_8k)
    usable = len(pcm) - len(pcm) % NARROWBAND_FRAME_BYTES
    frames = [pcm[i : i + NARROWBAND_FRAME_BYTES] for i in range(0, usable, NARROWBAND_FRAME_BYTES)]
    levels = np.array([frame_level_dbfs(f) for f in frames[:count]])
    return np.pad(levels, (0, count - len(levels)), constant_values=levels.min(initial=-100.0))


def build_call(
    render_frames: Sequence[bytes],
    *,
    delay_ms: float,
    erl_db: float,
    caller_8k: npt.NDArray[np.float64] | None = None,
    stall_ms: float = 0.0,
    seed: int = 0,
) -> Call:
    """Simulate the line for canonical ``render_frames``: echo (and a caller), as the gate hears it.

    ``delay_ms`` is the network round trip (the send-ahead is added);
    ``stall_ms`` holds capture frames up to that long now and then (see
    ``STALL_EVERY_MS``) and releases them in a burst.
    """
    rng = np.random.default_rng(seed)
    outbound = OutboundTransform(TWILIO_MULAW_8K)
    render_tap = NarrowbandTap(WIRE_RATE)
    render: list[tuple[bytes, float]] = []
    wire_chunks: list[bytes] = []
    for k, frame in enumerate(render_frames):
        # As MediaEngine does: the wire-rate PCM of each frame sent feeds the gate,
        # stamped with that frame's send time; its μ-law encoding goes on the line.
        wire = outbound.resample(frame)
        wire_chunks.append(wire)
        sent_ms = float(k * FRAME_MS)
        render += [(band, sent_ms) for band in render_tap.push(wire)]
    played = _samples(ulaw_decode(outbound.encode(b"".join(wire_chunks))))
    length = len(played) + int(2 * (delay_ms + SEND_AHEAD_MS)) * WIRE_PER_MS

    taps = np.arange(ECHO_PATH_TAPS)
    path = rng.standard_normal(ECHO_PATH_TAPS) * np.exp(-taps / (ECHO_PATH_DECAY_MS * WIRE_PER_MS))
    coupled = np.convolve(played, path)[: len(played)]
    # Unit gain on this very speech, so that erl_db is the ERL a G.168 speech
    # measurement would report (a random path's gain on speech is +-4 dB off
    # its white-noise gain).
    coupled *= math.sqrt(float(played @ played) / max(float(coupled @ coupled), 1.0))
    shift = int((delay_ms + SEND_AHEAD_MS) * WIRE_PER_MS)
    echo = np.zeros(length)
    echo[shift : shift + len(played)] = coupled
    t = np.arange(length) / WIRE_RATE
    wobble_db = WOBBLE_DB * np.sin(2 * math.pi * WOBBLE_HZ * t + rng.uniform(0, 2 * math.pi))
    echo *= 10 ** ((wobble_db - erl_db) / 20)
    noise = rng.standard_normal(length) * _FULL_SCALE * 10 ** (LINE_NOISE_DBFS / 20)
    caller = np.zeros(length)
    if caller_8k is not None:
        n = min(length, len(caller_8k))
        caller[:n] = caller_8k[:n]
    wire_in = ulaw_encode(_pcm(echo + caller + noise))

    # The caller's side straight off the wire, as MediaEngine taps it: decoded
    # chunk by chunk, framed at 8 kHz, no resampler in between.
    capture_tap = NarrowbandTap(WIRE_RATE)
    capture_frames: list[bytes] = []
    for start in range(0, len(wire_in), WIRE_CHUNK):
        capture_frames += capture_tap.push(ulaw_decode(wire_in[start : start + WIRE_CHUNK]))
    arrival = np.arange(1, len(capture_frames) + 1) * float(FRAME_MS)
    if stall_ms:
        # Network stalls: every STALL_EVERY_MS (jittered) the socket holds the
        # frames for up to stall_ms, then delivers them in one burst.
        stall = rng.uniform(0, STALL_EVERY_MS)
        while stall < arrival[-1]:
            release = stall + rng.uniform(0.5, 1.0) * stall_ms
            arrival[(arrival > stall) & (arrival < release)] = release
            stall = release + rng.uniform(0.5, 1.5) * STALL_EVERY_MS
    count = len(capture_frames)
    return Call(
        render=render,
        capture=list(zip(capture_frames, arrival.tolist(), strict=True)),
        echo_dbfs=_narrowband_levels(echo, count),
        caller_dbfs=_narrowband_levels(caller, count),
    )


class NearEndDetector(Protocol):
    """What the bench compares: the gate, or an echo canceller followed by it."""

    def render(self, frame: bytes, sent_ms: float) -> None: ...
    def capture(self, frame: bytes, now_ms: float) -> EchoVerdict: ...


def run_call(detector: NearEndDetector, call: Call) -> tuple[npt.NDArray[np.bool_], float]:
    """Play ``call`` through ``detector``; the near-end flags and µs per capture frame.

    Render and capture are interleaved by time, render first on a tie.
    """
    events: Iterator[tuple[float, int, bytes]] = iter(
        sorted(
            [(t, 0, f) for f, t in call.render] + [(t, 1, f) for f, t in call.capture],
            key=lambda e: (e[0], e[1]),
        )
    )
    flags: list[bool] = []
    render, capture = detector.render, detector.capture
    start = time.perf_counter()
    for t, kind, frame in events:
        if kind == 0:
            render(frame, t)
        else:
            flags.append(capture(frame, t).near_end)
    elapsed = time.perf_counter() - start
    return np.array(flags), elapsed * 1e6 / len(call.capture)


def longest_run(flags: npt.NDArray[np.bool_]) -> int:
    """Longest run of consecutive True values."""
    best = run = 0
    for flag in flags.tolist():
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def runs_of(flags: npt.NDArray[np.bool_]) -> int:
    """Number of runs of consecutive True values."""
    f = flags.astype(np.int8)
    return int(np.count_nonzero(np.diff(f, prepend=0) == 1))


@dataclass(frozen=True, slots=True)
class EchoScore:
    """False near end on a call with echo alone."""

    converging: int  # false frames in the first CONVERGENCE_FRAMES of audible echo
    false_share: float  # after that, of the frames with audible echo
    runs_per_minute: float  # after that, false near-end runs per minute of audible echo
    longest_run: int  # after that, frames
    us_per_frame: float  # render + capture calls, per capture frame


def score_echo_only(
    detector: NearEndDetector, call: Call, *, settle: int | None = None
) -> EchoScore:
    """Run an echo-only ``call`` and score it from frame ``settle`` on.

    By default ``settle`` is CONVERGENCE_FRAMES after the echo is first audible.
    """
    flags, us = run_call(detector, call)
    audible = call.echo_dbfs >= AUDIBLE_ECHO_DBFS
    start = int(np.argmax(audible))
    settle = start + CONVERGENCE_FRAMES if settle is None else settle
    converging = int(np.count_nonzero(flags[start:settle] & audible[start:settle]))
    flags, audible = flags[settle:] & audible[settle:], audible[settle:]
    minutes = audible.sum() * FRAME_MS / 60_000
    return EchoScore(
        converging=converging,
        false_share=float(flags[audible].mean()),
        runs_per_minute=runs_of(flags) / minutes,
        longest_run=longest_run(flags),
        us_per_frame=us,
    )


@dataclass(frozen=True, slots=True)
class DoubleTalkScore:
    """Near end heard on a call where the caller talks over the echo."""

    detected_share: float  # of caller-speech frames over audible echo
    barge_in_ms: float  # worst over the caller's utterances: onset to BARGE_IN_FRAMES in a row


def score_double_talk(detector: NearEndDetector, call: Call) -> DoubleTalkScore:
    """Run a double-talk ``call`` and score it (``barge_in_ms`` is inf if one is never heard)."""
    flags, _ = run_call(detector, call)
    speech = call.caller_dbfs >= CALLER_SPEECH_DBFS
    over_echo = speech & (call.echo_dbfs >= AUDIBLE_ECHO_DBFS)
    # Each caller utterance: from its first speech frame to its end.
    worst = 0.0
    for span, start_ms in zip(CALLER_SPANS_S, CALLER_STARTS_MS, strict=True):
        first = start_ms // FRAME_MS
        last = min(len(flags), first + int((span[1] - span[0]) * 1000) // FRAME_MS)
        onset = first + int(np.argmax(speech[first:last]))
        run = np.convolve(flags[onset:last], np.ones(BARGE_IN_FRAMES), mode="valid")
        hits = np.flatnonzero(run >= BARGE_IN_FRAMES)
        worst = max(worst, (hits[0] + BARGE_IN_FRAMES) * FRAME_MS if len(hits) else math.inf)
    return DoubleTalkScore(detected_share=float(flags[over_echo].mean()), barge_in_ms=worst)


def splice(before: Call, after: Call, at: int) -> Call:
    """A call whose echo path changes at capture frame ``at`` (same render)."""
    return Call(
        render=before.render,
        capture=before.capture[:at] + after.capture[at:],
        echo_dbfs=np.concatenate([before.echo_dbfs[:at], after.echo_dbfs[at:]]),
        caller_dbfs=np.concatenate([before.caller_dbfs[:at], after.caller_dbfs[at:]]),
    )


Factory = Callable[[], NearEndDetector]


def detectors() -> dict[str, Factory]:
    """The detectors to compare: the gate, and the gate behind AEC3 when pywebrtc-audio imports."""
    found: dict[str, Factory] = {"gate": EchoGate}
    try:
        EchoGate(EchoGateConfig(canceller=True))
    except EchoCancellerUnavailableError:
        print("pywebrtc-audio not installed: AEC3 column skipped", file=sys.stderr)
    else:
        found["aec3+gate"] = partial(EchoGate, EchoGateConfig(canceller=True))
    return found


def _print_conditions(
    found: dict[str, Factory], render: list[bytes], caller: npt.NDArray[np.float64], stall_ms: float
) -> None:
    names = " | ".join(f"{name:^43}" for name in found)
    print(f"{'':13} | {names}")
    cols = " | ".join(
        f"{'conv':>4} {'false%':>6} {'runs/min':>8} {'run':>3} {'DT%':>4} {'BI ms':>5} {'µs':>5}"
        for _ in found
    )
    print(f"{'rtt ms':>6} {'ERL':>6} | {cols}")
    for delay in DELAYS_MS:
        for erl in ERLS_DB:
            echo_call = build_call(render, delay_ms=delay, erl_db=erl, stall_ms=stall_ms)
            dt_call = build_call(
                render, delay_ms=delay, erl_db=erl, caller_8k=caller, stall_ms=stall_ms
            )
            cells = []
            for factory in found.values():
                echo = score_echo_only(factory(), echo_call)
                dt = score_double_talk(factory(), dt_call)
                cells.append(
                    f"{echo.converging:4d} {100 * echo.false_share:6.2f} "
                    f"{echo.runs_per_minute:8.1f} {echo.longest_run:3d} "
                    f"{100 * dt.detected_share:4.0f} {dt.barge_in_ms:5.0f} {echo.us_per_frame:5.1f}"
                )
            print(f"{delay:>6} {erl:>6.0f} | " + " | ".join(cells))


def _print_path_changes(found: dict[str, Factory], render: list[bytes]) -> None:
    print(
        f"\nEcho path change at {PATH_CHANGE_AT * FRAME_MS / 1000:.0f} s (echo alone): "
        "false frames after it, longest run"
    )
    print(f"{'from':>12} -> {'to':<12} | " + " | ".join(f"{name:>9} false run" for name in found))
    for (d1, e1), (d2, e2) in PATH_CHANGES:
        call = splice(
            build_call(render, delay_ms=d1, erl_db=e1),
            build_call(render, delay_ms=d2, erl_db=e2),
            PATH_CHANGE_AT,
        )
        cells = []
        for factory in found.values():
            score = score_echo_only(factory(), call, settle=PATH_CHANGE_AT)
            audible_after = int(
                np.count_nonzero(call.echo_dbfs[PATH_CHANGE_AT:] >= AUDIBLE_ECHO_DBFS)
            )
            cells.append(
                f"{'':>9} {round(score.false_share * audible_after):5d} {score.longest_run:3d}"
            )
        print(f"{d1:>4} ms {e1:>2.0f} dB -> {d2:>3} ms {e2:>2.0f} dB | " + " | ".join(cells))


def main(argv: Sequence[str] | None = None) -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stall-ms",
        type=float,
        default=0.0,
        help="hold capture frames up to this long now and then",
    )
    args = parser.parse_args(argv)
    speech = read_wav_8k(FIXTURE)
    render = assistant_frames(speech)
    caller = caller_signal(speech, len(render) * WIRE_CHUNK + 8 * WIRE_RATE)
    found = detectors()
    print(
        f"# Python {platform.python_version()} {platform.machine()}, "
        f"{len(render) * FRAME_MS / 1000:.0f} s of assistant per call, "
        f"capture stalls {args.stall_ms} ms"
    )
    print(
        "# conv: false frames in the first 500 ms of audible echo; false%, runs/min, run: after"
        " it (of frames with audible echo;\n# runs per minute of it; longest run, frames); DT%:"
        " caller speech frames over echo heard; BI ms: worst onset to"
        f" {BARGE_IN_FRAMES} near-end frames in a row; µs: per frame (render + capture)"
    )
    _print_conditions(found, render, caller, args.stall_ms)
    _print_path_changes(found, render)


if __name__ == "__main__":
    main()
