"""rutster against Pipecat 1.14 on the same load, side by side in one run.

``python -m bench.vs_pipecat --install-pipecat`` (first time: builds Pipecat's own
virtualenv, ``bench/.pipecat-venv``, from PyPI), then ``python -m bench.vs_pipecat``.

Each system in turn serves N simultaneous simulated Twilio calls, pinned to one core,
while the load generator (this process, ``rutster.tools.twilio_simulator``: signed
webhooks, real-time paced 20 ms μ-law frames of the recorded speech, marks echoed as
Twilio does) and rutster's echo brain run on the other core:

- **rutster**: ``rutster serve`` with default settings (the echo brain says it must not
  be interrupted, so barge-in stays out of its way) and its echo brain;
- **Pipecat 1.14**: ``bench/pipecat_twilio_echo.py``, Pipecat's Twilio agent
  (FastAPI, ``TwilioFrameSerializer``, Silero VAD) echoing every caller frame.

Calls start at 5 a second, and each level runs on a freshly started server (after two
short warm-up calls), so no level inherits another's state. A call is **carried** when at
least 95 % of its audio came back and the caller heard no gap longer than 60 ms (issue
18's rule). Per level it prints: calls carried; the server's CPU (% of its core, while
every call of the level runs) and that divided by the calls, and the same over the idle
server's CPU measured just before the level; the server's RSS growth over
its idle RSS divided by the calls; and the echo lag the callers heard (each call's median
lag over 2 s segments of its speech; P50 and P99 over the calls of the level), and under
each level what the lags are made of: how far a call's lag grew from its start to its end,
and of the calls over the goal's 120 ms, how many were that late from their first word
and how many grew past it. The last
lines give each system's largest level with every call carried (and every smaller level
too), how far the CPU per call over idle moved across the levels of 10 calls or more
carried, and their ratio: calls per core, since each server has one. Then the same for
rutster with the goal's limits on each level as well (lag P99 within 120 ms, RSS within
1 MiB a call; ``LevelResult.within_limits``), the reading issue 18's goal and its flat
cost ask for, and the ratio at that level.

``--rounds N`` runs the whole comparison N times, the two systems taking turns going
first, and ends with each round's ratios and their median: one run's ratio moves by a
level either way with the VM's hour and each system's ragged edge (README), so the figure
to quote is the median over rounds.

``--without vad`` or ``--without reflex`` cuts that part out of rutster
(``bench/without_parts/sitecustomize.py``): what the rest of the gateway would carry if
the part cost nothing. A bound on what the part costs (docs/BENCHMARKS.md, "Where a
call's time goes"), not a setting to run with: those calls hear no caller turns.

``--keep-core-awake`` runs a busy loop at ``SCHED_IDLE`` on the server's core for the
whole run: it runs only when the server has nothing to do (its CPU is not the server's),
so the core never idles. A measurement of what an idle core costs the server
(docs/BENCHMARKS.md, "Where a call's time goes"), not a setting to run with.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from rutster.media import compiled
from rutster.tools.launcher import (
    LOOPBACK,
    Service,
    echo_brain_process,
    free_port,
    gateway_process,
)
from rutster.tools.twilio_simulator import (
    SimulatedCallResult,
    TwilioSimulator,
    best_lag_correlation,
    read_wav_8k,
)

BENCH = Path(__file__).resolve().parent
#: The sitecustomize ``--without PART`` puts first on the gateway's PYTHONPATH.
WITHOUT_SITE = BENCH / "without_parts"
#: What ``--without`` may cut out of rutster (bench/without_parts/sitecustomize.py's
#: PARTS, which cannot import this module), and what each is.
WITHOUT_PART_LABELS = {
    "vad": "voice-activity detector",
    "reflex": "reflex loop (echo gate, VAD, turn-taking, barge-in)",
}
WITHOUT_PARTS = tuple(WITHOUT_PART_LABELS)
SPEECH_WAV = BENCH.parent / "tests/fixtures/audio/caller_speech_8k.wav"
#: Pipecat's agent script, run by Pipecat's own interpreter.
PIPECAT_AGENT = BENCH / "pipecat_twilio_echo.py"
#: Where --install-pipecat builds Pipecat's virtualenv (ignored by git).
DEFAULT_PIPECAT_VENV = BENCH / ".pipecat-venv"
#: The peer, as issue 18 names it: Pipecat 1.14 with Silero VAD and its WebSocket transport.
PIPECAT_REQUIREMENTS = (
    "pipecat-ai[silero,websocket]==1.14.0",
    "fastapi>=0.115",
    "uvicorn>=0.30",
)
#: Issue 18's carried rule: this share of the audio back, no heard gap longer than this.
CARRIED_AUDIO_SHARE = 0.95
MAX_GAP_MS = 60.0
#: Issue 18's goal asks this of rutster at its largest level, beyond the carried rule:
#: p99 heard latency within this (the lag P99 over the level's calls, ms) ...
LAG_P99_LIMIT_MS = 120.0
#: ... and no more RSS than this per call (its growth over idle / calls, KiB).
RSS_PER_CALL_LIMIT_KIB = 1024.0
#: A gap within one frame of a moment the simulator ran late is the simulator's.
STALL_SLACK_MS = 20.0
#: Echo lag per call: the median over segments of this length (a lag per segment,
#: so that one frame dropped mid-call moves one segment, not the whole call's figure).
LAG_SEGMENT_S = 2.0
#: Longest echo lag looked for (s).
MAX_LAG_S = 1.0
#: A call's lag at its start and at its end: the median over this many segments (6 s of
#: speech at each end of a 20 s call). Seed decision: the diagnosis of the lag P99
#: (docs/BENCHMARKS.md, "Where the lag P99 comes from") told the two apart this way.
GROWTH_SEGMENTS = 3
#: How long a server may take to answer its first request.
START_S = 60.0
#: Calls started per second. Seed decision: a steady arrival rate, so that what is
#: measured is the calls carried, not a burst of simultaneous starts (each Pipecat call
#: loads its own Silero model when it starts).
START_RATE_PER_S = 5.0
#: Warm-up before each level, not reported: first-use costs on both sides of the wire.
WARMUP_CALLS = 2
#: How long the idle server's CPU is sampled before each level (seconds).
IDLE_SAMPLE_S = 1.0
WARMUP_S = 3.0
RATE = 8_000


@dataclass
class LevelResult:
    """One system at one level of simultaneous calls."""

    system: str
    calls: int
    carried: int
    cpu_pct: float
    #: The server's CPU while idle just before the level (% of its core).
    idle_cpu_pct: float
    rss_growth_mib: float
    lags_ms: list[float]
    #: Per call with enough segments: (its lag at its start, how far it grew by its end).
    starts_and_growth_ms: list[tuple[float, float]] = field(default_factory=list)

    @property
    def per_call_above_idle(self) -> float:
        """The CPU the calls added over the idle server, per call (% of its core)."""
        return max(0.0, self.cpu_pct - self.idle_cpu_pct) / self.calls

    @property
    def all_carried(self) -> bool:
        return self.carried == self.calls

    @property
    def within_limits(self) -> bool:
        """Every call carried, lag P99 and RSS per call within issue 18's goal."""
        return (
            self.all_carried
            and bool(self.lags_ms)
            and float(np.percentile(self.lags_ms, 99)) <= LAG_P99_LIMIT_MS
            and self.rss_growth_mib * 1024 / self.calls <= RSS_PER_CALL_LIMIT_KIB
        )

    def lag_note(self) -> str:
        """What the lags are made of: growth within a call, and the calls over the goal's
        limit that started late (their lag set from the first word) or grew past it."""
        pairs = self.starts_and_growth_ms
        if not pairs:
            return "  lag: too few segments to tell a call's start from its growth"
        growth = [g for _, g in pairs]
        late_start = sum(start > LAG_P99_LIMIT_MS for start, _ in pairs)
        grew = sum(start <= LAG_P99_LIMIT_MS < start + g for start, g in pairs)
        return (
            f"  lag growth within a call P50 {np.percentile(growth, 50):.0f} ms, "
            f"max {max(growth):.0f}; calls over {LAG_P99_LIMIT_MS:.0f} ms: {late_start} "
            f"from their first word, {grew} grew past it"
        )

    def row(self) -> str:
        lags = self.lags_ms
        p50 = f"{np.percentile(lags, 50):.0f}" if lags else "-"
        p99 = f"{np.percentile(lags, 99):.0f}" if lags else "-"
        per_call_cpu = self.cpu_pct / self.calls
        above_idle = self.per_call_above_idle
        per_call_kib = self.rss_growth_mib * 1024 / self.calls
        return (
            f"{self.system:14} {self.calls:>5} {self.carried:>4}/{self.calls:<4} "
            f"{self.cpu_pct:>6.0f}% {per_call_cpu:>8.2f}% {above_idle:>9.2f}% {per_call_kib:>9.0f} "
            f"{p50:>7} {p99:>7}"
        )


def server_gaps(result: SimulatedCallResult) -> list[float]:
    """The lengths of the gaps the caller heard that were the server's: a gap that
    touches a moment the simulator itself ran late (its own process descheduled, as
    Twilio's never is) is the load generator's, not the server's."""

    def simulator_late(at: float, length: float) -> bool:
        return any(
            s_at - late - STALL_SLACK_MS <= at + length and at <= s_at + STALL_SLACK_MS
            for s_at, late in result.harness_stalls
        )

    return [length for at, length in result.gaps if not simulator_late(at, length)]


def carried(result: SimulatedCallResult, sent_ms: float) -> bool:
    """Issue 18's rule: ≥ 95 % of the audio back and no heard gap over 60 ms."""
    longest_gap = max(server_gaps(result), default=0.0)
    return result.audio_ms_received >= CARRIED_AUDIO_SHARE * sent_ms and longest_gap <= MAX_GAP_MS


def segment_lags_ms(sent: bytes, result: SimulatedCallResult) -> list[float]:
    """The echo lag the caller heard in each LAG_SEGMENT_S of speech, in call order (ms);
    a quiet segment, or one with no clear copy of what was said, has none."""
    heard = result.heard_pcm
    seg = int(LAG_SEGMENT_S * RATE) * 2
    max_lag = int(MAX_LAG_S * RATE)
    lags = []
    for start in range(0, len(sent) - seg + 1, seg):
        part = sent[start : start + seg]
        if np.abs(np.frombuffer(part, np.int16)).mean() < 100:  # a quiet segment: no lag
            continue
        corr, lag = best_lag_correlation(
            part, heard[start : start + seg + 2 * max_lag], max_lag_samples=max_lag
        )
        if corr >= 0.5:
            lags.append(lag / RATE * 1000)
    return lags


def call_lag_ms(lags: list[float]) -> float | None:
    """A call's echo lag from its segments' lags (:func:`segment_lags_ms`): their median."""
    return statistics.median(lags) if lags else None


def echo_lag_ms(sent: bytes, result: SimulatedCallResult) -> float | None:
    """The call's echo lag as heard: the median of its segments' best lags (ms)."""
    return call_lag_ms(segment_lags_ms(sent, result))


def lag_start_and_growth_ms(lags: list[float]) -> tuple[float, float] | None:
    """A call's lag at its start (the median of its first GROWTH_SEGMENTS segments' lags)
    and how far it grew by its end (the median of its last ones, less the start); None
    with too few segments to tell the two apart."""
    if len(lags) < 2 * GROWTH_SEGMENTS:
        return None
    start = statistics.median(lags[:GROWTH_SEGMENTS])
    return start, statistics.median(lags[-GROWTH_SEGMENTS:]) - start


def install_pipecat(venv: Path) -> None:
    """Build Pipecat's virtualenv at ``venv`` from PyPI."""
    print(f"installing {', '.join(PIPECAT_REQUIREMENTS)} into {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", *PIPECAT_REQUIREMENTS],
        check=True,
    )


def wait_answering(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until ``url`` answers any HTTP request (the server is up)."""
    import httpx

    deadline = time.monotonic() + START_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1.0)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer within {START_S:.0f} s")
        time.sleep(0.2)


@contextlib.contextmanager
def pipecat_server(venv: Path) -> Iterator[tuple[str, psutil.Process]]:
    """Pipecat's agent on a free loopback port: (its URL, its process)."""
    python = venv / "bin/python"
    if not python.exists():
        raise SystemExit(f"no Pipecat virtualenv at {venv}: run with --install-pipecat first")
    port = free_port()
    proc = subprocess.Popen(
        [str(python), str(PIPECAT_AGENT), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{LOOPBACK}:{port}"
        wait_answering(url, proc)
        yield url, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def gateway_kernels() -> str:
    """The media kernels the gateway started here runs (it inherits RUTSTER_SILERO_ENGINE)."""
    return compiled.describe(os.environ.get("RUTSTER_SILERO_ENGINE") or None)


@contextlib.contextmanager
def rutster_gateway(
    token: str, load_cores: list[int], overrides: dict[str, str] | None = None
) -> Iterator[Service]:
    """``rutster serve`` (default settings but ``overrides``) and its echo brain pinned to
    ``load_cores``: the gateway's process (pin it where the caller wants it)."""
    with echo_brain_process() as brain:
        psutil.Process(brain.proc.pid).cpu_affinity(load_cores)
        env = {
            "RUTSTER_TAP_URL": f"ws://{LOOPBACK}:{brain.port}/echo",
            # The load, not a tenant's cap, is what is measured.
            "RUTSTER_DEFAULT_MAX_CONCURRENT": "0",
            "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
            "TWILIO_AUTH_TOKEN": token,
            "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
            **(overrides or {}),
        }
        with gateway_process(env) as gateway:
            yield gateway


@contextlib.contextmanager
def rutster_server(
    token: str, load_cores: list[int], env: dict[str, str] | None = None
) -> Iterator[tuple[str, psutil.Process]]:
    """The gateway as the side-by-side runs it, and its echo brain: (its URL, the gateway).

    Where the node breaks is measured: its overload guard, which would refuse the calls
    past that point instead, is off (``bench/overload.py`` measures the guard). ``env``:
    more variables for the gateway's process alone.
    """
    overrides = {"RUTSTER_OVERLOAD_GUARD": "off", **(env or {})}
    with rutster_gateway(token, load_cores, overrides) as gateway:
        yield f"http://{LOOPBACK}:{gateway.port}", psutil.Process(gateway.proc.pid)


def without_env(part: str | None) -> dict[str, str] | None:
    """The gateway's extra variables for ``--without PART`` (None: rutster as shipped)."""
    if part is None:
        return None
    if part not in WITHOUT_PARTS:
        raise ValueError(f"--without is one of {', '.join(WITHOUT_PARTS)}, not {part!r}")
    path = os.pathsep.join(p for p in (str(WITHOUT_SITE), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "RUTSTER_BENCH_WITHOUT": part}


def rss_mib(server: psutil.Process) -> float:
    """The server process's resident memory (rutster's embedded Redis, a process of
    its own, is the spend store, not per-call state: it is not counted)."""
    return float(server.memory_info().rss) / 2**20


async def place_calls(sims: list[TwilioSimulator], pcm: bytes) -> list[SimulatedCallResult]:
    """One call of ``pcm`` per simulator, started at START_RATE_PER_S; a call that
    fails is left out (the level counts it as not carried)."""

    async def one(i: int) -> SimulatedCallResult | None:
        await asyncio.sleep(i / START_RATE_PER_S)
        try:
            return await sims[i].place_call(pcm, tail_s=1.0)
        except Exception as exc:
            print(f"    call {i} failed: {type(exc).__name__}: {exc}")
            return None

    results = await asyncio.gather(*(one(i) for i in range(len(sims))))
    return [r for r in results if r is not None]


async def run_level(
    system: str, url: str, token: str, calls: int, pcm: bytes, server: psutil.Process
) -> LevelResult:
    """N calls of ``pcm``; CPU and RSS taken while all N run (after the last start)."""
    sims = [TwilioSimulator(url, auth_token=token) for _ in range(calls)]
    idle = rss_mib(server)
    server.cpu_percent(None)
    await asyncio.sleep(IDLE_SAMPLE_S)
    idle_cpu = server.cpu_percent(None)
    seconds = len(pcm) / 2 / RATE
    ramp_s = (calls - 1) / START_RATE_PER_S
    gc.collect()
    gc.disable()  # the load generator must not be the one that is late
    task = asyncio.ensure_future(place_calls(sims, pcm))
    await asyncio.sleep(ramp_s + 0.5)
    server.cpu_percent(None)
    await asyncio.sleep(max(1.0, seconds - ramp_s - 1.5))
    cpu = server.cpu_percent(None)
    rss = rss_mib(server)
    results = await task
    gc.enable()
    sent_ms = seconds * 1000
    segments = [segment_lags_ms(pcm, r) for r in results]
    lags = [lag for s in segments if (lag := call_lag_ms(s)) is not None]
    starts_and_growth = [p for s in segments if (p := lag_start_and_growth_ms(s)) is not None]
    return LevelResult(
        system=system,
        calls=calls,
        carried=sum(carried(r, sent_ms) for r in results),
        cpu_pct=cpu,
        idle_cpu_pct=idle_cpu,
        rss_growth_mib=max(0.0, rss - idle),
        lags_ms=lags,
        starts_and_growth_ms=starts_and_growth,
    )


def largest_carried(rows: list[LevelResult], *, within_limits: bool = False) -> int:
    """The largest level that carried every call, as did every smaller level run (0 if
    none): a level that failed below a passing one (a start-up burst, a slow moment of
    the VM) does not let a luckier larger one count. ``within_limits``: each level must
    also keep issue 18's latency and memory limits (:attr:`LevelResult.within_limits`)."""
    best = 0
    for row in sorted(rows, key=lambda r: r.calls):
        if not (row.within_limits if within_limits else row.all_carried):
            break
        best = row.calls
    return best


def cost_spread(rows: list[LevelResult], carried_up_to: int) -> str:
    """How much the CPU per call (over idle) moved across the levels carried whole
    (issue 18: flat within 20 % from 10 calls to the most carried)."""
    spread = [r for r in rows if 10 <= r.calls <= carried_up_to]
    costs = [r.per_call_above_idle for r in spread]
    if len(costs) < 2 or min(costs) <= 0:
        return "CPU per call over idle: fewer than two levels of 10 calls or more carried"
    low, high = min(costs), max(costs)
    # The levels this run measured: a run of --levels 30,35 says 30 to 35, not 10 to 35.
    first = min(r.calls for r in spread)
    return (
        f"CPU per call over idle, levels of {first} to {carried_up_to} calls (those measured): "
        f"{low:.2f}-{high:.2f} %, "
        f"the highest {100 * (high / low - 1):.0f} % above the lowest (issue 18: within 20 %)"
    )


#: The ``--keep-core-awake`` spinner: a loop at SCHED_IDLE, which runs only when nothing
#: else on its core can (so it takes no time from the server), and keeps the core from
#: going idle between the server's messages.
_SPINNER = (
    "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass\n"
)


@contextlib.contextmanager
def core_kept_awake(core: list[int], enabled: bool) -> Iterator[None]:
    """While enabled, a SCHED_IDLE busy loop on ``core`` (see :data:`_SPINNER`)."""
    if not enabled:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", _SPINNER])
    try:
        psutil.Process(spinner.pid).cpu_affinity(core)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def median_over_rounds(ratios: list[float | None]) -> str:
    """The ratios of each round and their median over the rounds that gave one (a round
    in which Pipecat carried no level whole gives none)."""
    shown = ", ".join("-" if r is None else f"{r:.2f}x" for r in ratios)
    given = [r for r in ratios if r is not None]
    if not given:
        return f"{shown}: no round gave a ratio"
    return f"{shown}; median {statistics.median(given):.2f}x over {len(given)} rounds"


async def bench(
    levels: list[int],
    seconds: float,
    venv: Path,
    systems: list[str],
    awake: bool = False,
    rounds: int = 1,
    without: str | None = None,
) -> None:
    pcm = read_wav_8k(SPEECH_WAV)[: int(seconds * RATE) * 2]
    token = secrets.token_urlsafe(16)
    cores = sorted(os.sched_getaffinity(0))
    server_core = [cores[0]]
    load_cores = cores[1:] or server_core
    os.sched_setaffinity(0, load_cores)
    print(
        f"server on core {server_core}, load generator (and rutster's echo brain) on "
        f"{load_cores}; {seconds:.0f} s of recorded speech per call, {START_RATE_PER_S:.0f} "
        "calls started a second; a fresh server for each level; rutster's media kernels: "
        f"{gateway_kernels()}"
    )
    if awake:
        print(
            f"--keep-core-awake: a busy loop at SCHED_IDLE on core {server_core}, run only "
            "when the server is idle (not counted in its CPU), keeps that core from idling"
        )
    if without is not None:
        print(
            f"--without {without}: rutster's {WITHOUT_PART_LABELS[without]} cut out "
            "(bench/without_parts/sitecustomize.py): what the rest would carry if that part "
            "cost nothing, not a setting to run with"
        )
    ratios: list[float | None] = []
    limited_ratios: list[float | None] = []
    for round_number in range(1, rounds + 1):
        if rounds > 1:
            print(f"round {round_number} of {rounds}")
        # The systems take turns going first, so that a drift of the VM's speed over a
        # run does not always favour the same one.
        order = systems if round_number % 2 else systems[::-1]
        ratio, limited = await _one_round(
            levels, pcm, token, venv, order, server_core, load_cores, awake, without_env(without)
        )
        ratios.append(ratio)
        limited_ratios.append(limited)
    if rounds > 1 and set(systems) == {"rutster", "pipecat"}:
        print(f"ratio rutster / Pipecat by round: {median_over_rounds(ratios)}")
        print(f"ratio with rutster within the goal's limits: {median_over_rounds(limited_ratios)}")


async def _one_round(
    levels: list[int],
    pcm: bytes,
    token: str,
    venv: Path,
    systems: list[str],
    server_core: list[int],
    load_cores: list[int],
    awake: bool,
    rutster_env: dict[str, str] | None = None,
) -> tuple[float | None, float | None]:
    """Every level on every system once, with the summary lines; the two ratios (None
    when Pipecat carried no level whole, or a system was not run)."""
    print(
        f"{'system':14} {'calls':>5} {'carried':>9} {'CPU':>7} {'CPU/call':>9} "
        f"{'over idle':>10} {'KiB/call':>9} {'lag P50':>7} {'lag P99':>7}"
    )
    results: dict[str, list[LevelResult]] = {}
    for system in systems:
        label = "rutster" if system == "rutster" else "Pipecat 1.14"
        rows = results.setdefault(system, [])
        for calls in levels:
            # A fresh server for each level: nothing one level did carries into the next.
            servers = (
                rutster_server(token, load_cores, rutster_env)
                if system == "rutster"
                else pipecat_server(venv)
            )
            with core_kept_awake(server_core, awake), servers as (url, server):
                server.cpu_affinity(server_core)
                warmup = pcm[: int(WARMUP_S * RATE) * 2]
                await run_level(label, url, token, WARMUP_CALLS, warmup, server)
                row = await run_level(label, url, token, calls, pcm, server)
            print(row.row(), flush=True)
            print(row.lag_note(), flush=True)
            rows.append(row)
    print(
        "carried: ≥ 95 % of the audio back and no heard gap over 60 ms; CPU: the server's, "
        "% of its one core while all the level's calls run; CPU/call: that / calls; over "
        "idle: (that - the idle server's CPU just before) / calls; KiB/call: its RSS growth "
        "over idle / calls; lag: each call's median echo lag as heard, P50/P99 over the calls"
    )
    carried_at = {system: largest_carried(rows) for system, rows in results.items()}
    for system, n in carried_at.items():
        print(f"{system}: every call carried up to {n} calls on one core")
        print(f"  {cost_spread(results[system], n)}")
    # The goal's own reading of rutster's capacity: carried, and within its limits.
    m = largest_carried(results.get("rutster", []), within_limits=True)
    if "rutster" in results:
        print(
            f"rutster within issue 18's limits (every call carried, lag P99 <= "
            f"{LAG_P99_LIMIT_MS:.0f} ms, <= {RSS_PER_CALL_LIMIT_KIB / 1024:.0f} MiB per call): "
            f"up to {m} calls"
        )
        print(f"  {cost_spread(results['rutster'], m)}")
    if carried_at.get("pipecat") and "rutster" in carried_at:
        ratio = carried_at["rutster"] / carried_at["pipecat"]
        print(f"ratio rutster / Pipecat: {ratio:.2f}x the calls per core (issue 18 goal: 7.5x)")
        limited = m / carried_at["pipecat"]
        print(
            f"ratio with rutster within the goal's limits: {limited:.2f}x "
            "(Pipecat's calls carried as above)"
        )
        return ratio, limited
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="10,20,30,40")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pipecat-venv", type=Path, default=DEFAULT_PIPECAT_VENV)
    parser.add_argument(
        "--install-pipecat", action="store_true", help="build Pipecat's virtualenv first"
    )
    parser.add_argument("--systems", default="rutster,pipecat")
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the comparison this many times; median ratio"
    )
    parser.add_argument(
        "--keep-core-awake",
        action="store_true",
        help="a SCHED_IDLE busy loop on the server's core: what an idle core costs the server",
    )
    parser.add_argument(
        "--without",
        choices=WITHOUT_PARTS,
        help="cut this part out of rutster: what the rest would carry if it cost nothing",
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    systems = [s for s in args.systems.split(",") if s]
    if not levels or min(levels) < 1 or not set(systems) <= {"rutster", "pipecat"}:
        parser.error("--levels are positive numbers; --systems is rutster and/or pipecat")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if (max(levels) - 1) / START_RATE_PER_S + 3.0 > args.seconds:
        parser.error("--seconds must leave time with every call running after the last start")
    if args.install_pipecat:
        install_pipecat(args.pipecat_venv)
    asyncio.run(
        bench(
            levels,
            args.seconds,
            args.pipecat_venv,
            systems,
            args.keep_core_awake,
            args.rounds,
            args.without,
        )
    )


if __name__ == "__main__":
    main()
