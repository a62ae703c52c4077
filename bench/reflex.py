"""The reflex loop's figures, per phone line, on a split of the evaluation corpus.

Everything runs on the virtual-time rig (``tests/support/engine_rig.py``), which
drives the production per-call media engine (``gateway/media_engine.py``,
the object ``Call`` drives): transforms, VAD, echo gate, reflex loop,
playout, pacer, ledger, marks and clears. The provider side plays what it
is sent like Twilio, and the caller's line carries back what it played
(delayed, attenuated, 8 kHz μ-law) plus the caller and line noise.

**Material** (``bench/eval_corpus.py``, ``tests/fixtures/audio/eval/README.md``):
real recorded speech of several speakers and real recordings of noise
bursts, split by speaker and by recording. ``--split heldout`` (the
default, and the only figures the README reports) uses material no
threshold was chosen on; ``--split tune`` is what thresholds are chosen on.

**Calls.** Per line and per caller speaker, one call of
:data:`INTERRUPTIONS_PER_CALL` interruptions in a row: a scripted brain
answers every end of turn with a reply (the mock Realtime voice, or real
speech of a speaker of the same split who is not the caller), and the
caller talks over every reply :data:`OFFSETS_MS` into it, with utterances of
0.4-5 s at levels from :data:`CALLER_LEVELS_DBFS`.

**Figures**, per line:

- *stall*: planned interruptions never reached before the call's cap,
  because the call stopped answering (no end of turn came: the caller was
  locked out);
- *missed*: interruptions with no provider ``clear`` while the caller talked
  (utterances ≥ :data:`MISS_GOAL_MIN_S` counted against the goal; shorter
  ones, backchannel length, shown apart);
- *resumed*: interruptions paused in time whose pause was then undone (too
  little speech to confirm: the assistant went on where it paused);
- *over*: of those, the ones whose caller spoke :data:`MISS_GOAL_MIN_S` or
  more: the assistant stopped for a moment, then talked on over the caller,
  and was never cut while they spoke. To the caller that is an interruption
  not heard, though a ``clear`` went out;
- *pause P50/P95*: true speech onset → provider ``clear`` (onset: the
  first of :data:`ONSET_RUN_FRAMES` 20 ms frames in a row within
  :data:`ONSET_BELOW_ACTIVE_DB` of the utterance's active level);
- *2nd+*: pause P95 without each call's first interruption, which falls in
  the call's first answer (README, "Known limits");
- *stop P50/P95*: onset → the caller hears the assistant stop (40 ms of
  silence at the provider's output);
- *played_ms error*: |``played_ms`` reported to the brain - what the
  provider actually played of that item by the pause|, P95 and max;
- *end of turn P50/P95*: end of the caller's speech → ``speech_stopped``;
- false pauses and cuts per minute of assistant playout on *echo alone* and on
  *noise alone* (real noise bursts, :data:`NOISE_EVERY_S` apart); a pause is
  what the caller hears: a provider ``clear``, or a hole in the middle of an
  item (the provider's queue ran dry) without one;
- *reflex CPU*: everything the engine does (caller frames, render side,
  polls, brain audio) per simulated second, as % of one core per call.

``--lines hard`` runs ten harder lines instead (:data:`HARD_LINES`).

Usage: ``python -m bench.reflex [--split heldout|tune] [--lines standard|hard] [--quick]``
(from the checkout)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.eval_corpus import NoiseBurst, Utterance, noise_bursts, scale_to_dbfs, utterances
from rutster.gateway.reflex import PAUSE_ON, PAUSE_PROBABILITY, PauseOn, ReflexConfig
from rutster.gateway.server import limit_numeric_threads
from rutster.media import compiled
from rutster.protocols.tap import SpeechStarted, SpeechStopped
from rutster.tools.realtime_mock_voice import synthesize_reply
from tests.support.engine_rig import (
    RATE,
    EchoPath,
    InterruptingCaller,
    Interruption,
    ReflexRig,
    ScriptedBrain,
    on_the_line,
)

#: Interruptions in a row per call (the issue: at least 10).
INTERRUPTIONS_PER_CALL = 12
#: Caller levels (active level, dBFS), cycled per interruption (the issue: -35 to -12).
CALLER_LEVELS_DBFS = (-35.0, -28.0, -22.0, -16.0, -12.0, -25.0, -31.0, -19.0)
#: How far into each reply the caller starts talking (ms), cycled.
OFFSETS_MS = (300.0, 750.0, 450.0, 900.0, 600.0, 350.0, 800.0, 500.0)
#: Reply length the scripted brain sends (ms): longer than any offset + utterance.
REPLY_MS = 8_000
#: Brain think time between speech_stopped and its reply (ms; the mock's order).
THINK_MS = 300.0
#: Utterances at least this long must never be missed (the issue's goal).
MISS_GOAL_MIN_S = 0.5
#: Onset: first 20 ms frame within this many dB of the utterance's active level...
ONSET_BELOW_ACTIVE_DB = 15.0
#: ... that starts a run of this many such frames. A lone frame is a click, not
#: speech: three of the tune split's GSM-coded prompts open with one 240-560 ms
#: before the voice, which counted as the onset, so the pause was timed from the
#: click (bench history: docs/BENCHMARKS.md).
ONSET_RUN_FRAMES = 2
#: A call ends this long after the caller's last interruption ends (ms): time for the
#: turn to end and the brain to answer. The planned length is only a cap, so that a
#: call whose interruptions were paused and resumed (short ones) still reaches every
#: one of them; an interruption the cap cuts off is a *stall*.
CALL_TAIL_MS = 3_500.0
#: End of turn counts only if speech_stopped comes within this long after the speech end.
EOT_WINDOW_MS = 2_000.0
#: Goals (the issue).
PAUSE_P95_GOAL_MS = 150.0
NOISE_PAUSES_GOAL_PER_MIN = 3.0
PLAYED_ERROR_GOAL_MS = 40.0
REFLEX_CORE_GOAL_PCT = 0.2
#: Noise-only runs: a burst every this many seconds, at a level drawn from this range.
NOISE_EVERY_S = 2.0
NOISE_LEVELS_DBFS = (-35.0, -15.0)
#: Echo-alone and noise-only runs: assistant playout per run (s).
PLAYOUT_S = 40.0
#: Seed of the draws (levels of noise bursts): fixed, so runs repeat.
SEED = 2026


#: The echo path a changing line moves to halfway through: 400 ms, 10 dB.
MID_CALL_ECHO = (400.0, 10.0)


@dataclass(frozen=True)
class Line:
    """A phone line: its noise floor and echo path(s), and the assistant's level on it."""

    name: str
    noise_dbfs: float = -75.0
    delay_ms: float = 200.0
    loss_db: float | None = None
    #: Whether the echo path changes halfway through (to ``moves_to``).
    changes: bool = False
    #: The path (delay ms, loss dB) a changing line moves to.
    moves_to: tuple[float, float] = MID_CALL_ECHO
    #: The assistant's voice level on this line (dBFS); None: as the voices come (-18).
    #: scale_to_dbfs never clips, so a loud level is reached only as far as a voice's
    #: peaks allow: -10 asked gives -12 to -18 dBFS on the corpus's voices.
    voice_dbfs: float | None = None

    def voice(self, pcm24: bytes) -> bytes:
        """The assistant's voice as this line carries it (``voice_dbfs``)."""
        return pcm24 if self.voice_dbfs is None else scale_to_dbfs(pcm24, self.voice_dbfs)


#: The lines (the issue): clean, line noise, echo at 6-30 dB over 80-500 ms, and
#: an echo path that changes mid-call (the caller switches to speakerphone).
LINES = (
    Line("clean"),
    Line("noise -60 dBFS", noise_dbfs=-60.0),
    Line("noise -45 dBFS", noise_dbfs=-45.0),
    Line("echo 6 dB 80 ms", delay_ms=80.0, loss_db=6.0),
    Line("echo 10 dB 200 ms", delay_ms=200.0, loss_db=10.0),
    Line("echo 20 dB 350 ms", delay_ms=350.0, loss_db=20.0),
    Line("echo 30 dB 500 ms", delay_ms=500.0, loss_db=30.0),
    Line("echo 30->10 dB mid-call", delay_ms=150.0, loss_db=30.0, changes=True),
)
#: Harder lines (``--lines hard``, 2026-12-06), where bench/echo_alone.py's grid found
#: faults the lines above do not show: echo under line noise, echo paths that move
#: to a louder, shorter or quieter path, and a loud assistant over strong echo (as loud
#: as each voice's peaks allow, at most -10 dBFS).
HARD_LINES = (
    Line("noise -50, echo 10 dB 400", noise_dbfs=-50.0, delay_ms=400.0, loss_db=10.0),
    Line("noise -45, echo 20 dB 120", noise_dbfs=-45.0, delay_ms=120.0, loss_db=20.0),
    Line("noise -50, echo 30 dB 400", noise_dbfs=-50.0, delay_ms=400.0, loss_db=30.0),
    Line("noise -60, echo 6 dB 250", noise_dbfs=-60.0, delay_ms=250.0, loss_db=6.0),
    Line(
        "6 dB 200 -> 10 dB 450", delay_ms=200.0, loss_db=6.0, changes=True, moves_to=(450.0, 10.0)
    ),
    Line(
        "10 dB 450 -> 6 dB 200", delay_ms=450.0, loss_db=10.0, changes=True, moves_to=(200.0, 6.0)
    ),
    Line(
        "20 dB 300 -> 30 dB 100", delay_ms=300.0, loss_db=20.0, changes=True, moves_to=(100.0, 30.0)
    ),
    Line(
        "30 dB 100 -> 6 dB 200", delay_ms=100.0, loss_db=30.0, changes=True, moves_to=(200.0, 6.0)
    ),
    Line("loud voice, echo 6 dB 250", delay_ms=250.0, loss_db=6.0, voice_dbfs=-10.0),
    Line("loud voice, echo 10 dB 500", delay_ms=500.0, loss_db=10.0, voice_dbfs=-10.0),
)


@dataclass
class Tally:
    """Figures gathered over the calls of one line."""

    pauses_ms: list[float] = field(default_factory=list)
    #: The same, without each call's first interruption (the first answer's limit).
    later_pauses_ms: list[float] = field(default_factory=list)
    stops_ms: list[float] = field(default_factory=list)
    missed: int = 0
    missed_short: int = 0
    #: Interruptions paused in time and then resumed (not confirmed: too little speech).
    resumed: int = 0
    #: Of those, utterances of MISS_GOAL_MIN_S or more: talked over after a moment's pause.
    talked_over: int = 0
    #: Missed interruptions by caller level (dBFS) and by position in the call (0 = first).
    missed_by_level: dict[float, int] = field(default_factory=dict)
    missed_by_position: dict[int, int] = field(default_factory=dict)
    trials: int = 0
    stalled: int = 0
    #: Interruptions that began while playout was already paused (no clear of their own).
    pre_paused: int = 0
    played_errors_ms: list[float] = field(default_factory=list)
    end_of_turn_ms: list[float] = field(default_factory=list)
    engine_ns: int = 0
    seconds: float = 0.0


def frame_levels(pcm24: bytes) -> np.ndarray:
    """Level (dBFS) of each whole 20 ms frame of ``pcm24``."""
    x = np.frombuffer(pcm24[: len(pcm24) // 960 * 960], dtype="<i2").astype(np.float64)
    rms = np.sqrt(np.mean(x.reshape(-1, 480) ** 2, axis=1))
    levels: np.ndarray = 20 * np.log10(np.maximum(rms, 1.0) / 32768)
    return levels


def onset_and_end_s(pcm24: bytes) -> tuple[float, float]:
    """Speech onset and end in ``pcm24`` (s).

    The first 20 ms frame of a run of ONSET_RUN_FRAMES within
    ONSET_BELOW_ACTIVE_DB of the utterance's loud level (its 90th-percentile
    frame level), and the last such frame, as the line
    carries it (``tests.support.engine_rig.on_the_line``: a DC step that opens some
    recordings is no speech and no line carries it).
    """
    levels = frame_levels(on_the_line(pcm24))
    active = float(np.percentile(levels, 90))
    near = levels >= active - ONSET_BELOW_ACTIVE_DB
    runs = np.convolve(near, np.ones(ONSET_RUN_FRAMES, dtype=int), "valid") == ONSET_RUN_FRAMES
    starts = np.flatnonzero(runs)
    first = int(starts[0]) if starts.size else int(np.flatnonzero(near)[0])
    loud = np.flatnonzero(near)
    return float(first) * 0.02, float(loud[-1] + 1) * 0.02


def row(name: str, t: Tally) -> str:
    """One line's row of the interruption table."""
    worst = max(t.played_errors_ms, default=0.0)
    return (
        f"{name:26} {t.trials:6d} {t.stalled:5d} {t.missed:6d} {t.missed_short:5d} "
        f"{t.resumed:7d} {t.talked_over:4d} "
        f"{pct(t.pauses_ms, 50):7.0f}ms {pct(t.pauses_ms, 95):5.0f} "
        f"{pct(t.later_pauses_ms, 95):5.0f} "
        f"{pct(t.stops_ms, 50):6.0f}ms {pct(t.stops_ms, 95):5.0f} "
        f"{pct(t.played_errors_ms, 95):10.0f}/{worst:<4.0f}ms"
        f"  {pct(t.end_of_turn_ms, 50):5.0f}ms {pct(t.end_of_turn_ms, 95):5.0f}"
    )


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (nan when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def assistant_voices(speakers: dict[str, list[Utterance]]) -> list[tuple[str, bytes]]:
    """The brain's voices: the mock voice, and each speaker's speech laid end to end."""
    voices = [("mock", synthesize_reply(REPLY_MS))]
    for name, utts in speakers.items():
        joined = b"".join(u.pcm24 for u in utts)
        need = REPLY_MS * RATE // 1000 * 2
        while len(joined) < need:
            joined += joined
        voices.append((name, scale_to_dbfs(joined[:need], -18.0)))
    return voices


def split_voices(split: str) -> list[tuple[str, bytes]]:
    """:func:`assistant_voices` of every speaker of a split of the evaluation corpus."""
    speakers: dict[str, list[Utterance]] = {}
    for u in utterances(split):
        speakers.setdefault(u.speaker, []).append(u)
    return assistant_voices(speakers)


#: The reflex settings every rig of this run uses (set from the command line).
CONFIG = ReflexConfig()
#: Whether WebRTC AEC3 runs in front of the echo gate (--echo-canceller).
CANCELLER = False


def paused_at(rig: ReflexRig, at_ms: float) -> bool:
    """Whether playout was paused (awaiting confirmation) at ``at_ms``."""
    before = [step for step in rig.steps if step.at_ms <= at_ms]
    return bool(before) and before[-1].state == "interrupted"


def run_call(line: Line, caller: list[Utterance], voice: bytes, tally: Tally) -> ReflexRig:
    """One call of INTERRUPTIONS_PER_CALL interruptions by one caller over ``voice`` replies.

    Adds its figures to ``tally``; returns the rig, as the call left it.
    """
    chosen = [caller[i % len(caller)] for i in range(INTERRUPTIONS_PER_CALL + 1)]
    scaled = [
        scale_to_dbfs(u.pcm24, CALLER_LEVELS_DBFS[i % len(CALLER_LEVELS_DBFS)])
        for i, u in enumerate(chosen)
    ]
    plan = [Interruption(pcm, OFFSETS_MS[i % len(OFFSETS_MS)]) for i, pcm in enumerate(scaled[1:])]
    # The cap: every interruption paused and resumed, its reply played out, and a recovery.
    seconds = 2.0 + sum(len(p) / 2 / RATE * 2 + REPLY_MS / 1000 + 5.0 for p in scaled)
    changes: tuple[EchoPath, ...] = ()
    if line.changes:
        changes = (EchoPath(seconds / 2, *line.moves_to),)
    interrupting = InterruptingCaller(plan, recovery=scaled[0], done_after_ms=CALL_TAIL_MS)
    rig = ReflexRig(
        seconds=seconds,
        echo_delay_ms=line.delay_ms,
        echo_loss_db=line.loss_db,
        noise_dbfs=line.noise_dbfs,
        echo_changes=changes,
        brain=ScriptedBrain([line.voice(voice)], think_ms=THINK_MS),
        caller=interrupting,
        config=CONFIG,
        echo_canceller=CANCELLER,
    )
    rig.caller_audio(scaled[0], at_s=0.5)
    rig.run()
    tally.engine_ns += rig.reflex_ns
    tally.seconds += rig.ended_s
    cuts = [(s.at_ms, a) for s, a in rig.actions_of(SpeechStarted) if a.interrupted]
    stops = [s.at_ms for s, _ in rig.actions_of(SpeechStopped)]
    # Interruptions never reached: the call stopped answering (a caller locked out).
    tally.stalled += len(plan) - len(interrupting.placed)
    for position, (_item, at_s, pcm) in enumerate(interrupting.placed):
        on_s, end_s = onset_and_end_s(pcm)
        onset = (at_s + on_s) * 1000
        end = (at_s + end_s) * 1000
        tally.trials += 1
        # From the utterance's first sample: a soft start may pause before the onset.
        clears = [t for t in rig.clears_ms if at_s * 1000 <= t <= end + 100]
        if not clears and paused_at(rig, at_s * 1000):
            # Playout was already paused (a pause just before: the caller's own
            # breath, or a false pause on echo) and the caller took it over.
            tally.pre_paused += 1
            continue
        if not clears:
            if len(pcm) / 2 / RATE >= MISS_GOAL_MIN_S:
                tally.missed += 1
                level = CALLER_LEVELS_DBFS[(position + 1) % len(CALLER_LEVELS_DBFS)]
                tally.missed_by_level[level] = tally.missed_by_level.get(level, 0) + 1
                tally.missed_by_position[position] = tally.missed_by_position.get(position, 0) + 1
            else:
                tally.missed_short += 1
            continue
        if not any(clears[0] <= t <= end + EOT_WINDOW_MS for t, _ in cuts):
            tally.resumed += 1
            if end_s - on_s >= MISS_GOAL_MIN_S:
                tally.talked_over += 1
        tally.pauses_ms.append(max(0.0, clears[0] - onset))
        if position:
            tally.later_pauses_ms.append(max(0.0, clears[0] - onset))
        stopped = rig.audio_stopped_ms(onset)
        if stopped is not None:
            tally.stops_ms.append(stopped - onset)
        after = [t for t in stops if end < t <= end + EOT_WINDOW_MS]
        if after:
            tally.end_of_turn_ms.append(after[0] - end)
    for at_ms, cut in cuts:
        if cut.item is None or cut.played_ms is None:
            continue
        pause_at = max([t for t in rig.clears_ms if t <= at_ms], default=at_ms)
        tally.played_errors_ms.append(abs(cut.played_ms - rig.heard_ms(cut.item, pause_at)))
    return rig


def false_run(
    line: Line, voice: bytes, noises: list[NoiseBurst], rng: np.random.Generator
) -> tuple[int, int, int, float]:
    """Assistant playout over ``line``, with noise bursts if given: (pauses, cuts, engine ns, s)."""
    rig = ReflexRig(
        seconds=PLAYOUT_S + 1.0,
        echo_delay_ms=line.delay_ms,
        echo_loss_db=line.loss_db,
        noise_dbfs=line.noise_dbfs,
        echo_changes=(EchoPath(PLAYOUT_S / 2, *line.moves_to),) if line.changes else (),
        config=CONFIG,
        echo_canceller=CANCELLER,
    )
    voice = line.voice(voice)
    reps = int(PLAYOUT_S * RATE * 2 // len(voice)) + 1
    rig.say((voice * reps)[: int(PLAYOUT_S * RATE) * 2], "reply", at_s=0.5)
    if noises:
        for n, t in enumerate(np.arange(1.5, PLAYOUT_S, NOISE_EVERY_S)):
            burst = noises[n % len(noises)]
            level = float(rng.uniform(*NOISE_LEVELS_DBFS))
            rig.caller_audio(scale_to_dbfs(burst.pcm24, level), at_s=float(t))
    rig.run()
    cuts = sum(1 for _, a in rig.actions_of(SpeechStarted) if a.interrupted)
    return rig.audible_pauses, cuts, rig.reflex_ns, PLAYOUT_S + 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=("heldout", "tune"), default="heldout")
    parser.add_argument("--quick", action="store_true", help="two speakers, half the lines")
    parser.add_argument(
        "--lines",
        choices=("standard", "hard"),
        default="standard",
        help="the issue's eight lines, or ten harder ones (HARD_LINES)",
    )
    parser.add_argument(
        "--pause-on",
        choices=[p.value for p in PauseOn],
        default=PAUSE_ON.value,
        help="what pauses the assistant (gateway/reflex.py PauseOn)",
    )
    parser.add_argument(
        "--pause-probability",
        type=float,
        default=PAUSE_PROBABILITY,
        help="VAD probability that counts toward a pause (gateway/reflex.py)",
    )
    parser.add_argument(
        "--echo-canceller",
        action="store_true",
        help="WebRTC AEC3 in front of the echo gate (needs rutster[aec])",
    )
    args = parser.parse_args()
    limit_numeric_threads()  # as rutster serve runs the engine
    global CONFIG, CANCELLER
    CANCELLER = args.echo_canceller
    CONFIG = ReflexConfig(pause_on=PauseOn(args.pause_on), pause_probability=args.pause_probability)
    started = time.perf_counter()
    speakers: dict[str, list[Utterance]] = {}
    for u in utterances(args.split):
        speakers.setdefault(u.speaker, []).append(u)
    noises = noise_bursts(args.split)
    chosen = LINES if args.lines == "standard" else HARD_LINES
    lines = chosen[::2] if args.quick else chosen
    names = sorted(speakers)[:2] if args.quick else sorted(speakers)
    voices = assistant_voices(speakers)
    rule = repr(CONFIG.pause_on.value)
    if CONFIG.pause_on is not PauseOn.ENERGY:
        rule += f" (VAD >= {CONFIG.pause_probability})"
    print(
        f"reflex benchmark, split {args.split!r}, pause on {rule}, "
        f"echo canceller {'on' if CANCELLER else 'off'}: "
        f"{len(names)} caller speakers "
        f"({', '.join(names)}), {len(noises)} noise recordings "
        f"({', '.join(sorted({n.kind for n in noises}))}); {INTERRUPTIONS_PER_CALL} "
        f"interruptions in a row per call, caller levels {min(CALLER_LEVELS_DBFS):.0f} to "
        f"{max(CALLER_LEVELS_DBFS):.0f} dBFS; media kernels: {compiled.describe()}"
    )
    header = (
        f"{'line':26} {'trials':>6} {'stall':>5} {'missed':>6} {'<0.5s':>5} {'resumed':>7} "
        f"{'over':>4} "
        f"{'pause P50':>9} {'P95':>5} {'2nd+':>5} {'stop P50':>8} {'P95':>5} "
        f"{'played err P95/max':>18} {'EOT P50':>7} {'P95':>5}"
    )
    print(header)
    total = Tally()
    for line in lines:
        tally = Tally()
        for k, name in enumerate(names):
            # The brain's voice: the mock, or another speaker of the split (never the caller).
            others = [v for v in voices if v[0] != name]
            voice = others[k % len(others)][1]
            run_call(line, speakers[name], voice, tally)
        print(row(line.name, tally))
        for name in (
            "pauses_ms",
            "later_pauses_ms",
            "stops_ms",
            "played_errors_ms",
            "end_of_turn_ms",
        ):
            getattr(total, name).extend(getattr(tally, name))
        for level, n in tally.missed_by_level.items():
            total.missed_by_level[level] = total.missed_by_level.get(level, 0) + n
        for position, n in tally.missed_by_position.items():
            total.missed_by_position[position] = total.missed_by_position.get(position, 0) + n
        total.missed += tally.missed
        total.missed_short += tally.missed_short
        total.resumed += tally.resumed
        total.talked_over += tally.talked_over
        total.trials += tally.trials
        total.pre_paused += tally.pre_paused
        total.stalled += tally.stalled
        total.engine_ns += tally.engine_ns
        total.seconds += tally.seconds
    print(row("all lines", total))
    by_level = ", ".join(
        f"{level:.0f} dBFS: {total.missed_by_level.get(level, 0)}"
        for level in sorted(set(CALLER_LEVELS_DBFS))
    )
    first = total.missed_by_position.get(0, 0)
    print(f"  missed by caller level: {by_level}; of them the call's first interruption: {first}")
    print(
        f"  {total.pre_paused} interruptions began while playout was already paused "
        "(counted as heard, latency not counted)"
    )
    print(
        f"  {total.talked_over} of the {total.resumed} resumed had the caller speak "
        f">= {MISS_GOAL_MIN_S} s (the assistant talked on over them after a moment's pause)"
    )
    print(
        f"  goals: 0 missed >= {MISS_GOAL_MIN_S} s; pause P95 <= {PAUSE_P95_GOAL_MS:.0f} ms; "
        f"played_ms error <= {PLAYED_ERROR_GOAL_MS:.0f} ms"
    )

    rng = np.random.default_rng(SEED)
    print(f"false pauses, per minute of assistant playout ({PLAYOUT_S:.0f} s per line and voice):")
    print(
        f"{'line':26} {'echo alone: pauses/min':>22} {'cuts/min':>8} "
        f"{'noise alone: pauses/min':>23} {'cuts/min':>8}"
    )
    false_lines = [line for line in lines if line.loss_db is not None]
    if args.lines == "standard":
        false_lines += [LINES[0], LINES[2]]  # clean, and noise without echo
    sums: dict[str, list[float]] = {"echo": [0, 0, 0.0], "noise": [0, 0, 0.0]}
    for line in false_lines:
        rates: list[tuple[float, float]] = []
        for kind in ("echo", "noise"):
            pauses = cuts = 0
            minutes = 0.0
            p: int
            c: int
            for _, voice in voices[:2]:
                p, c, ns, s = false_run(line, voice, noises if kind == "noise" else [], rng)
                pauses += p
                cuts += c
                minutes += (s - 1.0) / 60
                total.engine_ns += ns
                total.seconds += s
            sums[kind][0] += pauses
            sums[kind][1] += cuts
            sums[kind][2] += minutes
            rates.append((pauses / minutes, cuts / minutes))
        (echo_p, echo_c), (noise_p, noise_c) = rates
        print(f"{line.name:26} {echo_p:22.2f} {echo_c:8.2f} {noise_p:23.2f} {noise_c:8.2f}")
    for kind in ("echo", "noise"):
        pauses_sum, cuts_sum, m = sums[kind]
        print(
            f"  {kind} alone, all lines: {pauses_sum / m:.2f} pauses/min, "
            f"{cuts_sum / m:.2f} cuts/min "
            f"over {m:.1f} min"
        )
    print(
        f"  goals: 0 pauses on echo alone; <= {NOISE_PAUSES_GOAL_PER_MIN:.0f} pauses and 0 cuts "
        "per minute on noise alone"
    )
    core_pct = total.engine_ns / 1e9 / total.seconds * 100
    print(
        f"reflex CPU: {core_pct:.3f} % of one core per call (the engine's time per second of call, "
        f"render side and polls included, mean over {total.seconds / 60:.1f} min of calls; "
        f"goal <= {REFLEX_CORE_GOAL_PCT} %)"
    )
    print(f"(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
