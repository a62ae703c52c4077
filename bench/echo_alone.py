"""The assistant's echo alone over many lines: ``python -m bench.echo_alone``.

``bench/reflex.py`` measures false pauses on echo alone over its eight lines, two
assistant voices each: 9.3 minutes a split, where the heldout split gave one pause
and the tune split none, too few to tune on or to trust. This script plays every
voice of a split over a grid of lines, on the same virtual-time rig and the same
production per-call engine (``tests/support/engine_rig.py``,
``gateway/media_engine.py``), with nobody on the caller's side, and counts what the
caller would hear:

- *levels*: the assistant at :data:`VOICE_LEVELS_DBFS` (the loudest as far as
  each voice's peaks allow) over echo lines of
  :data:`LOSSES_DB` return loss and :data:`DELAYS_MS` delay, on a quiet line
  (:data:`QUIET_LINE_DBFS`);
- *noisy*: the voice at :data:`VOICE_DBFS` over echo lines that also carry line
  noise (:data:`NOISY_LINES_DBFS` x :data:`NOISY_LOSSES_DB` x
  :data:`NOISY_DELAYS_MS`): an echo at or under the noise, which no energy rule
  can separate from it;
- *moved*: the echo path changing halfway (:data:`PATHS`, every ordered pair): a
  caller switching to speakerphone, or a call re-routed.

A *pause* is what bench/reflex.py counts (a provider ``clear`` or a hole in an
item); a *cut* a pause confirmed as the caller's turn (``speech_started`` with
``interrupted``). The goal (issue 12) is none of either.

``--split tune`` is what choices are made on; ``--split heldout`` (the default)
is what is reported. ``--split tune --voices festival`` plays Festival's synthetic
diphone voices instead (``tests/fixtures/audio/festival/``), a supplement to tune on.
Usage: ``python -m bench.echo_alone [--split heldout|tune] [--voices corpus|festival]
[--quick]`` (from the checkout).
"""

from __future__ import annotations

import argparse
import itertools
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from bench.eval_corpus import RATE, Utterance
from bench.reflex import (
    MID_CALL_ECHO,
    PLAYOUT_S,
    SEED,
    Line,
    assistant_voices,
    false_run,
    split_voices,
)
from rutster.gateway.server import limit_numeric_threads

#: Active level of the assistant's voice on the line it is sent down (dBFS): a loud
#: brain, bench/reflex.py's voices (-18), and a quiet one. Seed decision. The corpus's
#: scale_to_dbfs never clips, so -10 is reached only as far as a voice's peaks allow
#: (-12 to -18 dBFS on the corpus's voices): the label says "at most".
VOICE_LEVELS_DBFS = (-10.0, -18.0, -26.0)
#: The voice level of the noisy and moved groups: bench/reflex.py's.
VOICE_DBFS = -18.0
#: Echo return loss and delay of the level group: the issue's 6-30 dB and 80-500 ms.
LOSSES_DB = (6.0, 10.0, 20.0, 30.0)
DELAYS_MS = (80.0, 250.0, 500.0)
#: Line noise of the level and moved groups: bench/reflex.py's echo lines' (dBFS).
QUIET_LINE_DBFS = -75.0
#: Line noise of the noisy group (dBFS), from the issue's -60 and -45 and between.
NOISY_LINES_DBFS = (-60.0, -50.0, -45.0)
NOISY_LOSSES_DB = (10.0, 20.0, 30.0)
NOISY_DELAYS_MS = (120.0, 400.0)
#: Echo paths (delay ms, loss dB) of the moved group; each ordered pair is a call
#: that starts on the first and moves to the second halfway through.
PATHS = ((100.0, 30.0), (300.0, 20.0), (450.0, 10.0), (200.0, 6.0))


@dataclass(frozen=True)
class Condition:
    """One line the assistant talks over."""

    group: str
    voice_dbfs: float
    delay_ms: float
    loss_db: float
    noise_dbfs: float = QUIET_LINE_DBFS
    #: The path it moves to halfway (delay ms, loss dB), if it moves.
    moves_to: tuple[float, float] | None = None

    def label(self) -> str:
        loud = "at most " if self.voice_dbfs > VOICE_DBFS else ""
        text = (
            f"voice {loud}{self.voice_dbfs:.0f} dBFS, echo {self.loss_db:.0f} dB "
            f"{self.delay_ms:.0f} ms, "
            f"noise {self.noise_dbfs:.0f} dBFS"
        )
        if self.moves_to is not None:
            text += f", moving to {self.moves_to[1]:.0f} dB {self.moves_to[0]:.0f} ms"
        return text


def conditions(quick: bool = False) -> list[Condition]:
    """The grid (module doc); ``quick``: one line of each group."""
    levels = [
        Condition("levels", level, delay, loss)
        for level, loss, delay in itertools.product(VOICE_LEVELS_DBFS, LOSSES_DB, DELAYS_MS)
    ]
    noisy = [
        Condition("noisy", VOICE_DBFS, delay, loss, noise)
        for noise, loss, delay in itertools.product(
            NOISY_LINES_DBFS, NOISY_LOSSES_DB, NOISY_DELAYS_MS
        )
    ]
    moved = [
        Condition("moved", VOICE_DBFS, a[0], a[1], moves_to=b)
        for a, b in itertools.permutations(PATHS, 2)
    ]
    if quick:
        return [levels[0], noisy[-1], moved[0]]
    return levels + noisy + moved


def echo_alone(voice: bytes, condition: Condition) -> tuple[int, int]:
    """The assistant saying ``voice`` (looped to PLAYOUT_S) over ``condition``: (pauses, cuts).

    bench/reflex.py's echo-alone run (``false_run``, no noise bursts) on the line the
    condition describes.
    """
    line = Line(
        condition.label(),
        noise_dbfs=condition.noise_dbfs,
        delay_ms=condition.delay_ms,
        loss_db=condition.loss_db,
        changes=condition.moves_to is not None,
        moves_to=condition.moves_to or MID_CALL_ECHO,
        voice_dbfs=condition.voice_dbfs,
    )
    pauses, cuts, _, _ = false_run(line, voice, [], np.random.default_rng(SEED))
    return pauses, cuts


@dataclass
class GroupTally:
    """Pauses, cuts and minutes of one group."""

    pauses: int = 0
    cuts: int = 0
    runs: int = 0

    @property
    def minutes(self) -> float:
        return self.runs * PLAYOUT_S / 60.0


def with_total(tallies: dict[str, GroupTally]) -> list[tuple[str, GroupTally]]:
    """The rows of a table: each group's tally, then ``("all", their sum)``."""
    total = GroupTally(
        pauses=sum(t.pauses for t in tallies.values()),
        cuts=sum(t.cuts for t in tallies.values()),
        runs=sum(t.runs for t in tallies.values()),
    )
    return [*tallies.items(), ("all", total)]


#: Festival's diphone voices (synthetic: a supplement that may be tuned on, like espeak;
#: tests/fixtures/audio/festival/README.md), for ``--voices festival``.
FESTIVAL_DIR = Path(__file__).resolve().parent.parent / "tests/fixtures/audio/festival"


def festival_voices() -> list[tuple[str, bytes]]:
    """Each Festival voice's prompts as the brain's voice: 24 kHz, -18 dBFS, REPLY_MS long."""
    speakers: dict[str, list[Utterance]] = {}
    for path in sorted(FESTIVAL_DIR.glob("*_16k.wav")):
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
        pcm24 = np.clip(np.rint(soxr.resample(pcm, rate, RATE)), -32768, 32767).astype("<i2")
        name = path.name.removesuffix("_16k.wav")
        speakers[name] = [Utterance(name, "tune", pcm24.tobytes(), path.name)]
    return assistant_voices(speakers)[1:]  # not the mock voice: it is in every split's run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=("heldout", "tune"), default="heldout")
    parser.add_argument(
        "--voices",
        choices=("corpus", "festival"),
        default="corpus",
        help="the split's voices, or Festival's synthetic ones (tune-eligible)",
    )
    parser.add_argument("--quick", action="store_true", help="two voices, one line per group")
    args = parser.parse_args()
    limit_numeric_threads()  # as rutster serve runs the engine
    started = time.perf_counter()
    if args.voices == "festival" and args.split != "tune":
        parser.error("Festival's voices are a tune supplement: use --split tune")
    voices = split_voices(args.split) if args.voices == "corpus" else festival_voices()
    if args.quick:
        voices = voices[:2]
    grid = conditions(args.quick)
    print(
        f"echo alone, split {args.split!r}: {len(voices)} assistant voices "
        f"({', '.join(name for name, _ in voices)}) x {len(grid)} lines, "
        f"{PLAYOUT_S:.0f} s each"
    )
    tallies: dict[str, GroupTally] = {}
    for (name, voice), condition in itertools.product(voices, grid):
        pauses, cuts = echo_alone(voice, condition)
        tally = tallies.setdefault(condition.group, GroupTally())
        tally.pauses += pauses
        tally.cuts += cuts
        tally.runs += 1
        if pauses or cuts:
            print(f"  {name:16} {condition.label()}: {pauses} paused, {cuts} cut")
    print(
        f"{'group':8} {'minutes':>8} {'pauses':>7} {'cuts':>5} {'pauses/min':>11} {'cuts/min':>9}"
    )
    for group, tally in with_total(tallies):
        print(
            f"{group:8} {tally.minutes:8.1f} {tally.pauses:7d} {tally.cuts:5d} "
            f"{tally.pauses / tally.minutes:11.3f} {tally.cuts / tally.minutes:9.3f}"
        )
    print("goal (issue 12): 0 pauses and 0 cuts on echo alone")
    print(f"(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
