"""Per-frame cost of the media hot path: ``python bench/media_transform.py``.

Inbound: a Twilio ``media`` message as received (JSON text) ->
``TwilioStreamCodec.receive`` (JSON, base64, validation) ->
:class:`~media.transform.InboundTransform`. Outbound: a canonical 480-sample
frame -> :class:`~media.transform.OutboundTransform` ->
``TwilioStreamCodec.encode`` of a ``media`` message. Both run over the speech
fixture many times; each figure is the median of several runs, in µs per
20 ms frame. The media part alone (no JSON, no base64) is shown too, and each
figure side by side for the three resampler engines (media/resample.py): the
polyphase filter calls use, soxr's steady engine (what calls used before) and
soxr's block engine (cheaper, bursty), with the delay each adds.
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import statistics
import sys
import time
import wave
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

import soxr

from rutster.media.formats import CANONICAL_FRAME_BYTES, TWILIO_MULAW_8K
from rutster.media.g711 import ulaw_encode
from rutster.media.resample import DEFAULT_ENGINE, DEFAULT_QUALITY, ResamplerEngine
from rutster.media.transform import InboundTransform, OutboundTransform
from rutster.protocols.ingress import AudioReceived, PlayAudio
from rutster.tools.twilio_simulator import start_message
from rutster.trunk.twilio.codec import TwilioStreamCodec

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/audio/caller_speech_8k.wav"
#: Budget per 20 ms frame, inbound (issue goal).
INBOUND_GOAL_US = 25.0
#: Budget per 20 ms frame, outbound (issue goal).
OUTBOUND_GOAL_US = 15.0
#: Timed runs per figure; the median is reported (seed choice: enough to shrug off one hiccup).
DEFAULT_RUNS = 7
#: Passes over the 30 s fixture per run: 4 x 1500 frames keeps a run near 100 ms.
DEFAULT_PASSES = 4
#: Twilio's 20 ms μ-law chunk: 160 bytes at 8 kHz (docs/PROVIDERS.md §1.3).
TWILIO_CHUNK_BYTES = 160
T = TypeVar("T")
STREAM_SID = "MZ00000000000000000000000000000000"
START_MESSAGE = start_message(STREAM_SID, "CA" + "0" * 32, "AC" + "0" * 32, {})


def load_speech(path: Path = FIXTURE) -> bytes:
    """The 8 kHz mono s16le speech fixture."""
    with wave.open(str(path), "rb") as wav:
        if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (1, 2, 8000):
            raise ValueError(f"{path} is not 8 kHz mono 16-bit")
        return wav.readframes(wav.getnframes())


def twilio_media_messages(mulaw: bytes) -> list[str]:
    """The JSON texts Twilio would send for ``mulaw``, 20 ms per message."""
    messages = []
    for n, start in enumerate(range(0, len(mulaw), TWILIO_CHUNK_BYTES)):
        payload = base64.b64encode(mulaw[start : start + TWILIO_CHUNK_BYTES]).decode("ascii")
        message = {
            "event": "media",
            "sequenceNumber": str(n + 2),
            "media": {
                "track": "inbound",
                "chunk": str(n + 1),
                "timestamp": str(n * 20),
                "payload": payload,
            },
            "streamSid": STREAM_SID,
        }
        messages.append(json.dumps(message))
    return messages


def canonical_frames(speech_pcm: bytes) -> list[bytes]:
    """The fixture as canonical 24 kHz 480-sample frames (through the inbound path)."""
    inbound = InboundTransform(TWILIO_MULAW_8K)
    mulaw = ulaw_encode(speech_pcm)
    frames: list[bytes] = []
    for start in range(0, len(mulaw), TWILIO_CHUNK_BYTES):
        frames += inbound.process(mulaw[start : start + TWILIO_CHUNK_BYTES])
    return frames


def run_inbound(messages: Sequence[str], *, engine: ResamplerEngine = DEFAULT_ENGINE) -> None:
    """One call's inbound path: Twilio codec (JSON, base64) then the media transform."""
    codec = TwilioStreamCodec()
    codec.receive(START_MESSAGE)
    process = InboundTransform(TWILIO_MULAW_8K, engine=engine).process
    receive = codec.receive
    for text in messages:
        event = receive(text)
        assert isinstance(event, AudioReceived)
        process(event.payload)


def run_inbound_media(
    payloads: Sequence[bytes], *, engine: ResamplerEngine = DEFAULT_ENGINE
) -> None:
    """One call's inbound media transform alone over raw μ-law ``payloads``."""
    process = InboundTransform(TWILIO_MULAW_8K, engine=engine).process
    for payload in payloads:
        process(payload)


def run_outbound(frames: Sequence[bytes], *, engine: ResamplerEngine = DEFAULT_ENGINE) -> None:
    """One call's outbound path: media transform then the Twilio codec's ``media`` message."""
    codec = TwilioStreamCodec()
    codec.receive(START_MESSAGE)
    process = OutboundTransform(TWILIO_MULAW_8K, engine=engine).process
    encode = codec.encode
    for frame in frames:
        payload = process(frame)
        if payload:  # the block engine releases output in bursts; nothing to send between
            encode(PlayAudio(payload))


def run_outbound_media(
    frames: Sequence[bytes], *, engine: ResamplerEngine = DEFAULT_ENGINE
) -> None:
    """One call's outbound media transform alone over canonical ``frames``."""
    process = OutboundTransform(TWILIO_MULAW_8K, engine=engine).process
    for frame in frames:
        process(frame)


def us_per_frame(
    run: Callable[[Sequence[T]], None],
    items: Sequence[T],
    *,
    runs: int = DEFAULT_RUNS,
    passes: int = DEFAULT_PASSES,
) -> float:
    """Median over ``runs`` of the µs per item of ``run(items)`` repeated ``passes`` times."""
    run(items)  # warm-up: imports, soxr filter plans, allocator caches
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(passes):
            run(items)
        elapsed_ns = time.perf_counter_ns() - start
        samples.append(elapsed_ns / 1000 / (passes * len(items)))
    return statistics.median(samples)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures; with ``--check``, exit 1 when a goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--passes", type=int, default=DEFAULT_PASSES)
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = parser.parse_args(argv)

    speech = load_speech()
    mulaw = ulaw_encode(speech)
    messages = twilio_media_messages(mulaw)
    payloads = [mulaw[i : i + TWILIO_CHUNK_BYTES] for i in range(0, len(mulaw), TWILIO_CHUNK_BYTES)]
    frames = canonical_frames(speech)
    assert all(len(frame) == CANONICAL_FRAME_BYTES for frame in frames)

    options = {"runs": args.runs, "passes": args.passes}
    figures: dict[ResamplerEngine, tuple[float, float, float, float]] = {}
    engines = list(ResamplerEngine)
    for engine in engines:
        figures[engine] = (
            us_per_frame(partial(run_inbound, engine=engine), messages, **options),
            us_per_frame(partial(run_inbound_media, engine=engine), payloads, **options),
            us_per_frame(partial(run_outbound, engine=engine), frames, **options),
            us_per_frame(partial(run_outbound_media, engine=engine), frames, **options),
        )
    inbound, _, outbound, _ = figures[DEFAULT_ENGINE]

    print(
        f"python {platform.python_version()}, soxr {soxr.__version__} ({DEFAULT_QUALITY}), "
        f"{len(payloads)} frames x {args.passes} passes, median of {args.runs} runs"
    )
    heading = "".join(
        f"{engine.value + (' (used)' if engine is DEFAULT_ENGINE else ''):>18}"
        for engine in engines
    )
    print(f"µs per 20 ms frame            {heading}")
    labels = (
        "inbound: codec + transform",
        "  media part alone",
        "outbound: transform + codec",
        "  media part alone",
    )
    for i, label in enumerate(labels):
        row = "".join(f"{figures[engine][i]:15.1f} µs" for engine in engines)
        print(f"  {label:<28}{row}")
    print(f"inbound transform: {inbound:.1f} µs/frame (goal ≤ {INBOUND_GOAL_US:g})")
    print(f"outbound transform: {outbound:.1f} µs/frame (goal ≤ {OUTBOUND_GOAL_US:g})")
    print(
        "  delay each way at 8 <-> 24 kHz: polyphase 2.6 ms; soxr steady 30 ms in, 25 ms out; "
        "soxr block 13-73 ms in ~60 ms bursts, which break 20 ms pacing (media/resample.py)"
    )

    met = inbound <= INBOUND_GOAL_US and outbound <= OUTBOUND_GOAL_US
    if not met:
        print("goal missed", file=sys.stderr)
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
