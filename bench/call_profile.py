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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.vs_pipecat import (
    IDLE_SAMPLE_S,
    RATE,
    SPEECH_WAV,
    START_RATE_PER_S,
    run_level,
    rutster_server,
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


async def profile(calls: int, seconds: float, nonblocking: bool) -> None:
    spy = py_spy()
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
    with rutster_server(token, load_cores) as (url, server), tempfile.TemporaryDirectory() as tmp:
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
    print(
        f"rutster serve on core {server_core} with {calls} echo calls ({row.carried}/{calls} "
        f"carried{'' if nonblocking else ' while the profiler paused it'}), the gateway at "
        f"{row.cpu_pct:.0f} % of its core ({row.cpu_pct / calls:.2f} % a call); {total} stack "
        f"samples of its main thread, 200 a second for {seconds:.0f} s "
        "(the event loop waiting for sockets is in the rest)"
    )
    for part, count in parts.most_common():
        print(f"{100 * count / total:5.1f} %  {part}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--nonblocking", action="store_true", help="sample without pausing the gateway"
    )
    args = parser.parse_args()
    if args.calls < 1 or args.seconds < 1:
        parser.error("--calls and --seconds must be at least 1")
    asyncio.run(profile(args.calls, args.seconds, args.nonblocking))


if __name__ == "__main__":
    main()
