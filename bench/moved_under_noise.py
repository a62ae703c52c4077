"""An echo path that moves while noise is on the line: ``python -m bench.moved_under_noise``.

A caller switches to speakerphone, or the call is re-routed, while a bus goes by or
a door slams. The echo gate learned the old path; the noise holds its verdict at
*near end* (the noise is the caller's side), and the moved echo arrives inside that
run, so the VAD hears the assistant's own voice under the noise and calls it speech.
``bench/reflex.py``'s noise-alone runs put a burst on a moving line only by chance
(two cuts on the heldout split's 30 -> 10 dB line, 2026-12-07, found this), and
``bench/echo_alone.py``'s moved group has no noise.

Each run: the assistant (every voice of the split, :func:`bench.reflex.assistant_voices`)
talks for :data:`RUN_S` over a quiet line whose echo path moves at :data:`MOVE_S`
(``bench/echo_alone.py``'s paths, every ordered pair), and one noise recording of the
split plays on the caller's side around the move: starting :data:`OFFSETS_S` from it,
at a level drawn from :data:`LEVELS_DBFS` (seeded). Every recording of the split is
played on every pair for every voice. The same runs with the path *not* moving
(``--control``) give what the noise alone does on those lines, so that the two can be
told apart.

It counts what bench/reflex.py counts: a *pause* is a provider ``clear`` or a hole in
an item; a *cut* a pause confirmed as the caller's turn (``speech_started`` with
``interrupted``). The goal (issue 12, noise alone): 0 cuts.

``--split tune`` is what choices are made on; ``--split heldout`` (the default) is
what is reported. Run from the checkout.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from bench.echo_alone import PATHS, QUIET_LINE_DBFS, GroupTally, with_total
from bench.eval_corpus import NoiseBurst, noise_bursts, scale_to_dbfs
from bench.reflex import CONFIG, SEED, split_voices
from rutster.gateway.server import limit_numeric_threads
from rutster.protocols.tap import SpeechStarted
from tests.support.engine_rig import RATE, EchoPath, ReflexRig

#: Length of a run (s): the move in its middle, and time after it for a pause to be
#: confirmed or undone.
RUN_S = 10.0
#: When the path moves (s): 5.7 s into the answer, its echo long learned.
MOVE_S = 6.0
#: When the assistant starts talking (s).
VOICE_AT_S = 0.3
#: Where the noise starts against the move (s): a second before (the move inside a
#: long recording), just before, and just after. One is drawn per run (seeded).
OFFSETS_S = (-1.0, -0.3, 0.2)
#: Level of the noise (dBFS), drawn per run: bench/reflex.py's noise-alone range.
LEVELS_DBFS = (-35.0, -15.0)


def run(
    voice: bytes,
    start: tuple[float, float],
    end: tuple[float, float] | None,
    noise: NoiseBurst,
    offset_s: float,
    level_dbfs: float,
) -> tuple[int, int]:
    """One run (module doc): (pauses, cuts). ``end`` None: the path does not move."""
    rig = ReflexRig(
        seconds=RUN_S,
        echo_delay_ms=start[0],
        echo_loss_db=start[1],
        noise_dbfs=QUIET_LINE_DBFS,
        echo_changes=() if end is None else (EchoPath(MOVE_S, *end),),
        config=CONFIG,
    )
    need = int((RUN_S - VOICE_AT_S - 0.5) * RATE) * 2
    rig.say((voice * (need // len(voice) + 1))[:need], "reply", at_s=VOICE_AT_S)
    rig.caller_audio(scale_to_dbfs(noise.pcm24, level_dbfs), at_s=MOVE_S + offset_s)
    rig.run()
    cuts = sum(1 for _, a in rig.actions_of(SpeechStarted) if a.interrupted)
    return rig.audible_pauses, cuts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=("heldout", "tune"), default="heldout")
    parser.add_argument(
        "--control", action="store_true", help="the same runs with the path not moving"
    )
    parser.add_argument("--quick", action="store_true", help="two voices, two path pairs")
    args = parser.parse_args()
    limit_numeric_threads()  # as rutster serve runs the engine
    started = time.perf_counter()
    voices = split_voices(args.split)
    pairs = list(itertools.permutations(PATHS, 2))
    if args.quick:
        voices, pairs = voices[:2], pairs[:2]
    noises = noise_bursts(args.split)
    rng = np.random.default_rng(SEED)
    moving = "not moving (control)" if args.control else "moving"
    print(
        f"echo path {moving} under noise, split {args.split!r}: {len(voices)} assistant "
        f"voices x {len(pairs)} path pairs x {len(noises)} noise recordings, "
        f"{RUN_S:.0f} s each, the move at {MOVE_S:.0f} s"
    )
    tallies: dict[str, GroupTally] = {}
    for (name, voice), (a, b), noise in itertools.product(voices, pairs, noises):
        offset = float(rng.choice(OFFSETS_S))
        level = float(rng.uniform(*LEVELS_DBFS))
        pauses, cuts = run(voice, a, None if args.control else b, noise, offset, level)
        tally = tallies.setdefault(noise.kind, GroupTally())
        tally.runs += 1
        tally.pauses += pauses
        tally.cuts += cuts
        if cuts:
            path = f"{a[1]:.0f} dB {a[0]:.0f} ms"
            path += " (not moving)" if args.control else f" -> {b[1]:.0f} dB {b[0]:.0f} ms"
            print(
                f"  cut: {name:16} {path}, "
                f"{noise.kind} ({noise.source}) at {level:.0f} dBFS, {offset:+.1f} s"
            )
    print(f"{'noise':10} {'runs':>5} {'pauses':>7} {'cuts':>5} {'cut runs %':>10}")
    for kind, tally in with_total(dict(sorted(tallies.items()))):
        print(
            f"{kind:10} {tally.runs:5d} {tally.pauses:7d} {tally.cuts:5d} "
            f"{100.0 * tally.cuts / tally.runs:10.1f}"
        )
    print("goal (issue 12, noise alone): 0 cuts")
    print(f"(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
