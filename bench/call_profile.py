"""Where a loaded gateway's time goes: a sampling profile of ``rutster serve`` under N calls.

``python -m bench.call_profile --calls 20`` (needs ``py-spy``: ``pip install py-spy``, and
the right to trace a process of your own: root, or ``kernel.yama.ptrace_scope=0``).

The gateway (default settings but its overload guard off, as in ``bench/vs_pipecat.py``,
whose load this is) runs pinned to one core with N echo calls of recorded speech up; once
every call runs, py-spy samples it for ``--seconds``. Each sample is charged to the
innermost part of the gateway on its stack (the echo gate, the VAD, the tap client's
sends, ...; :data:`PARTS`), and the table prints each part's share of the samples of the
gateway's main thread (the event loop's own wait for its sockets falls in "the rest").
The echo brain's callers talk the whole call and hear themselves back, so the echo gate
and the VAD work on every frame: the worst case for both.

``--timers`` measures the per-call engine's parts instead, without py-spy and without
pausing the gateway: ``bench/engine_timers/sitecustomize.py`` wraps each part in the
gateway's process and adds up its CPU time, and the table prints, over the same window,
each part's CPU per caller frame, per call to it, and as a share of the gateway's CPU.
Those are the figures to set beside ``bench/reflex_cost.py``'s, which replays one call's
engine inputs alone: the same parts, interleaved with every other call's work. With
``--keep-core-awake`` a busy loop at ``SCHED_IDLE`` keeps the gateway's core from idling
(``bench/vs_pipecat.py``): what an idle core costs the parts.

``--without vad|reflex`` profiles the gateway with that part cut out, as
``bench/vs_pipecat.py --without`` runs it: where the rest of the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.vs_pipecat import (
    IDLE_SAMPLE_S,
    RATE,
    SPEECH_WAV,
    START_RATE_PER_S,
    WITHOUT_PART_LABELS,
    WITHOUT_PARTS,
    core_kept_awake,
    gateway_kernels,
    run_level,
    rutster_server,
    without_env,
)
from rutster.tools.twilio_simulator import read_wav_8k

#: The parts a sample is charged to, innermost first: the first name found walking the
#: stack from its leaf up names the part.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("VAD (Silero, its cascade)", ("SileroDetector", "CascadeDetector")),
    ("echo gate (line canceller included)", ("EchoGate", "LineEchoCanceller")),
    ("reflex state machine", ("ReflexLoop",)),
    ("inbound transform (decode, bands, resample)", ("InboundTransform", "NarrowbandBands")),
    ("tap: sending audio_in", ("TapClient.send_audio_in",)),
    ("tap: receiving brain events", ("TapClient._serve", "TapClient._dispatch", "TapClient.run")),
    ("engine: brain audio in", ("MediaEngine.on_brain",)),
    ("pacer: poll, render, outbound transform", ("MediaEngine.poll",)),
    ("provider socket: sending", ("TextStreamEdge.send", "CallEdge.send")),
    ("pacer: the rest", ("Call._pace",)),
    ("provider socket: receiving, parsing", ("read_event", "receive_frame", "next_event")),
    ("call and engine glue (ingress)", ("Call.on_ingress", "MediaEngine.on_ingress")),
    ("spend metering", ("Call._meter", "CallSpend")),
)
OTHER = "the rest (event loop, uvicorn, HTTP, timers)"
#: Speech each call has beyond the ramp and the profile (seconds): the calls must all
#: still run while py-spy samples, and the load's own CPU window ends 1.5 s early.
PROFILE_MARGIN_S = 6.0


def py_spy() -> str:
    """The py-spy executable (beside this Python first), or exit with how to get it."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    return found


def charge(raw: str) -> Counter[str]:
    """Samples per part from py-spy's raw (collapsed) output: ``frame;frame;... count``."""
    parts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        part = OTHER
        for frame in reversed(stack.split(";")):
            match = next((name for name, keys in PARTS if any(k in frame for k in keys)), None)
            if match is not None:
                part = match
                break
        parts[part] += int(count)
    return parts


@dataclass(frozen=True)
class Load:
    """The load both modes put on the gateway: its speech, the cores, the ramp."""

    pcm: bytes
    token: str
    ramp_s: float
    server_core: list[int]
    load_cores: list[int]


def prepare_load(calls: int, seconds: float) -> Load:
    """Speech for ``calls`` echo calls that all still run ``seconds`` after the ramp, and
    this process moved to the load's cores (the gateway gets the first)."""
    ramp_s = (calls - 1) / START_RATE_PER_S
    speech = read_wav_8k(SPEECH_WAV)
    needed_s = ramp_s + seconds + PROFILE_MARGIN_S
    if needed_s * RATE * 2 > len(speech):
        raise SystemExit(f"{calls} calls and {seconds:.0f} s need {needed_s:.0f} s of speech")
    pcm = speech[: int(needed_s * RATE) * 2]
    token = secrets.token_urlsafe(16)
    cores = sorted(os.sched_getaffinity(0))
    server_core, load_cores = [cores[0]], cores[1:] or [cores[0]]
    os.sched_setaffinity(0, load_cores)
    return Load(pcm, token, ramp_s, server_core, load_cores)


async def profile(
    calls: int, seconds: float, nonblocking: bool, without: str | None = None
) -> None:
    spy = py_spy()
    load = prepare_load(calls, seconds)
    pcm, token, ramp_s = load.pcm, load.token, load.ramp_s
    server_core, load_cores = load.server_core, load.load_cores
    with (
        rutster_server(token, load_cores, without_env(without)) as (url, server),
        tempfile.TemporaryDirectory() as tmp,
    ):
        server.cpu_affinity(server_core)
        task = asyncio.ensure_future(run_level("rutster", url, token, calls, pcm, server))
        await asyncio.sleep(IDLE_SAMPLE_S + ramp_s + 1.0)  # every call running
        out = Path(tmp) / "raw.txt"
        # py-spy stops the gateway for each sample (whole stacks); --nonblocking does not,
        # but then reads stacks torn mid-change, and loses most of those (measured here:
        # a third of the samples landed in "the rest", against a tenth).
        record = [spy, "record", "-d", str(int(seconds)), "-r", "200", "-p", str(server.pid)]
        record += ["--nonblocking"] if nonblocking else []
        recorder = await asyncio.create_subprocess_exec(
            *record, "-f", "raw", "-o", str(out), stdout=subprocess.DEVNULL
        )
        await recorder.wait()
        row = await task
        parts = charge(out.read_text() if out.exists() else "")
    total = sum(parts.values())
    if not total:
        raise SystemExit("py-spy took no samples (may it trace this process?)")
    cut = "" if without is None else f", its {WITHOUT_PART_LABELS[without]} cut out"
    print(
        f"rutster serve (media kernels: {gateway_kernels()}{cut}) on core {server_core} "
        f"with {calls} echo calls ({row.carried}/{calls} "
        f"carried{'' if nonblocking else ' while the profiler paused it'}), the gateway at "
        f"{row.cpu_pct:.0f} % of its core ({row.cpu_pct / calls:.2f} % a call); {total} stack "
        f"samples of its main thread, 200 a second for {seconds:.0f} s "
        "(the event loop waiting for sockets is in the rest)"
    )
    for part, count in parts.most_common():
        print(f"{100 * count / total:5.1f} %  {part}")


#: Where the timers' sitecustomize lives (put first on the gateway's PYTHONPATH).
TIMERS_SITE = Path(__file__).parent / "engine_timers"
#: The parts the timers print, in order, with their labels (indented: inside the one above).
TIMER_ROWS: tuple[tuple[str, str], ...] = (
    ("MediaEngine.on_ingress", "engine: caller audio in"),
    ("InboundTransform.decode", "  μ-law decode"),
    ("InboundTransform.frames", "  8 -> 24 kHz for the brain"),
    ("ReflexLoop.on_caller_frame", "  reflex loop (per frame)"),
    ("EchoGate.capture", "    echo gate: caller frame"),
    ("CascadeDetector.process", "    VAD (the cascade)"),
    ("SileroDetector._run_window", "      Silero (a window is 1.6 frames)"),
    ("MediaEngine.poll", "engine: playout (pacer polls)"),
    ("OutboundTransform.resample", "  24 -> 8 kHz"),
    ("OutboundTransform.encode", "  μ-law encode"),
    ("EchoGate.render", "  echo gate: render frame"),
    ("NarrowbandTap.push", "narrowband taps (both ways, in the two above)"),
    ("MediaEngine.on_brain", "engine: brain events"),
)
#: The engine's own entry points: their sum is the engine; the gateway's CPU less it is
#: everything else (sockets, JSON, the tap, the event loop).
ENGINE_ENTRIES = ("MediaEngine.on_ingress", "MediaEngine.poll", "MediaEngine.on_brain")


def read_timers(path: Path) -> dict[str, tuple[int, int]]:
    """The timers' last snapshot: part -> (CPU ns, calls)."""
    body = json.loads(path.read_text(encoding="utf-8"))
    return {name: (int(v["cpu_ns"]), int(v["calls"])) for name, v in body.items()}


def server_cpu_s(server: psutil.Process) -> float:
    """The server's CPU time so far (every thread, user and system)."""
    times = server.cpu_times()
    return float(times.user + times.system)


async def time_parts(calls: int, seconds: float, awake: bool = False) -> None:
    load = prepare_load(calls, seconds)
    pcm, token, ramp_s = load.pcm, load.token, load.ramp_s
    server_core, load_cores = load.server_core, load.load_cores
    with tempfile.TemporaryDirectory() as tmp:
        timers = Path(tmp) / "timers.json"
        # The timers' sitecustomize first on the gateway's path (its process alone).
        path = os.pathsep.join(p for p in (str(TIMERS_SITE), os.environ.get("PYTHONPATH")) if p)
        env = {"PYTHONPATH": path, "RUTSTER_BENCH_TIMERS": str(timers)}
        with (
            core_kept_awake(server_core, awake),
            rutster_server(token, load_cores, env) as (url, server),
        ):
            server.cpu_affinity(server_core)
            task = asyncio.ensure_future(run_level("rutster", url, token, calls, pcm, server))
            await asyncio.sleep(IDLE_SAMPLE_S + ramp_s + 1.0)  # every call running
            before, cpu_before = read_timers(timers), server_cpu_s(server)
            await asyncio.sleep(seconds)
            after, cpu_after = read_timers(timers), server_cpu_s(server)
            row = await task
    spent = {
        k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1])
        for k in after
    }
    frames = spent.get("EchoGate.capture", (0, 0))[1]
    gateway_ns = (cpu_after - cpu_before) * 1e9
    if not frames or gateway_ns <= 0:
        raise SystemExit("no caller frames timed: did the gateway load the timers?")
    print(
        f"rutster serve (media kernels: {gateway_kernels()}) on core {server_core}"
        f"{' (kept awake)' if awake else ''} with {calls} "
        f"echo calls ({row.carried}/{calls} carried), timed for {seconds:.0f} s: {frames} "
        "caller frames, the gateway's CPU "
        f"{gateway_ns / 1e9 / seconds * 100:.0f} % of its core, {gateway_ns / frames / 1000:.0f} "
        "µs per caller frame"
    )
    print(f"{'part':48} {'µs/frame':>9} {'µs/call':>8} {'calls':>7} {'of CPU':>7}")
    for name, label in TIMER_ROWS:
        ns, n = spent.get(name, (0, 0))
        per_call = f"{ns / n / 1000:8.1f}" if n else f"{'-':>8}"
        print(
            f"{label:48} {ns / frames / 1000:9.1f} {per_call} {n:7d} {100 * ns / gateway_ns:6.1f}%"
        )
    engine = sum(spent.get(name, (0, 0))[0] for name in ENGINE_ENTRIES)
    rest = gateway_ns - engine
    print(
        f"{'the engine (the three entries above)':48} {engine / frames / 1000:9.1f} "
        f"{'':8} {'':7} {100 * engine / gateway_ns:6.1f}%"
    )
    print(
        f"{'everything else (sockets, JSON, tap, event loop)':48} {rest / frames / 1000:9.1f} "
        f"{'':8} {'':7} {100 * rest / gateway_ns:6.1f}%"
    )
    print(
        "µs/frame: the part's CPU over the window / the caller frames the echo gate judged; "
        "µs/call: per call to the part; of CPU: share of the gateway's CPU over the window "
        "(nested parts are inside the ones above them)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--nonblocking", action="store_true", help="sample without pausing the gateway"
    )
    parser.add_argument(
        "--timers",
        action="store_true",
        help="time the engine's parts inside the gateway instead (no py-spy)",
    )
    parser.add_argument(
        "--keep-core-awake",
        action="store_true",
        help="with --timers: a SCHED_IDLE busy loop on the gateway's core (bench/vs_pipecat.py)",
    )
    parser.add_argument(
        "--without",
        choices=WITHOUT_PARTS,
        help="profile with this part cut out (bench/vs_pipecat.py --without): where the rest "
        "of the time goes",
    )
    args = parser.parse_args()
    if args.calls < 1 or args.seconds < 1:
        parser.error("--calls and --seconds must be at least 1")
    if args.keep_core_awake and not args.timers:
        parser.error("--keep-core-awake is an option of --timers only")
    if args.without and args.timers:
        parser.error("--without is an option of the profile only (the timers time the parts)")
    if args.timers:
        asyncio.run(time_parts(args.calls, args.seconds, args.keep_core_awake))
    else:
        asyncio.run(profile(args.calls, args.seconds, args.nonblocking, args.without))


if __name__ == "__main__":
    main()
