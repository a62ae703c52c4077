"""How many simultaneous echo calls one gateway process carries, and what each costs.

Runs the gateway (uvicorn, one process, pinned to one core) and the echo brain
(its own process) and drives N simultaneous simulated Twilio calls of the
recorded speech fixture from this process (pinned to the other core, with the
brain). For each N it reports, side by side:

- gateway-side: playout underruns and the p99 pacer wake-up lateness (the
  outbound pacing jitter) from the gateway's own /metrics, its CPU use;
- caller-side (the simulator): gaps heard, p99 inter-arrival jitter;
- the gateway's RSS, and RSS growth per added call;
- the CPU of the load side (this process + the echo brain, sharing one core):
  above ~90 % the load side, not the gateway, is late, and the level says so.

A level passes with zero underruns and p99 pacing jitter ≤ 10 ms (issue goal).
Usage: ``python bench/concurrent_calls.py [--levels 25,50,100,150,200] [--seconds 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from rutster.media.vad import DEFAULT_DETECTOR, DETECTOR_NAMES
from rutster.tools.launcher import LOOPBACK, echo_brain_process, gateway_process
from rutster.tools.twilio_simulator import SimulatedCallResult, TwilioSimulator, read_wav_8k

SPEECH_WAV = Path(__file__).resolve().parent.parent / "tests/fixtures/audio/caller_speech_8k.wav"
#: Goal from the foundation issue: p99 outbound pacing jitter ≤ 10 ms.
JITTER_GOAL_MS = 10.0
#: Calls are started over this long so the webhook burst does not dominate.
RAMP_S = 2.0


@dataclass
class LevelResult:
    calls: int
    completed: int
    underruns: float
    pacer_p99_ms: float
    caller_gaps: int
    caller_jitter_p99_ms: float
    gateway_cpu_pct: float
    load_cpu_pct: float
    rss_mib: float

    @property
    def passed(self) -> bool:
        return (
            self.completed == self.calls
            and self.underruns == 0
            and self.pacer_p99_ms <= JITTER_GOAL_MS
        )


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "le" in sample.labels:
                key += f"|{sample.labels['le']}"
            values[key] = values.get(key, 0.0) + sample.value
    return values


def histogram_p99_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """p99 of the pacer-lateness histogram over the interval, in ms: interpolated linearly
    inside the bucket that holds it, as Prometheus' ``histogram_quantile`` does (the
    bucket's upper bound alone would overstate it by up to the bucket's width)."""
    prefix = "rutster_pacer_lateness_seconds_bucket|"
    buckets = sorted(
        (float(k.split("|")[1]), after[k] - before.get(k, 0.0))
        for k in after
        if k.startswith(prefix)
    )
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return 0.0
    rank = 0.99 * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound * 1000.0  # beyond the last finite bucket: its bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return (lower_bound + (bound - lower_bound) * share) * 1000.0
        lower_bound, lower_count = bound, count
    return float("inf")


def pooled_jitter_p99_ms(results: list[SimulatedCallResult]) -> float:
    """p99 of |inter-arrival - audio duration| over every media message of every call."""
    deviations = []
    for result in results:
        if len(result.arrivals) >= 3:
            times = np.array([t for t, _ in result.arrivals])
            durations = np.array([d for _, d in result.arrivals])
            deviations.append(np.abs(np.diff(times) - durations[:-1]))
    return float(np.percentile(np.concatenate(deviations), 99)) if deviations else 0.0


def ramped_calls(
    sims: list[TwilioSimulator], pcm: bytes
) -> asyncio.Future[list[SimulatedCallResult | None]]:
    """Each simulator places one call of ``pcm``, their starts spread over
    :data:`RAMP_S`; a call that fails is None (a failed level, not a crashed bench)."""

    async def one(i: int) -> SimulatedCallResult | None:
        await asyncio.sleep(RAMP_S * i / len(sims))
        try:
            return await sims[i].place_call(pcm, tail_s=1.0)
        except Exception as exc:
            print(f"    call {i} failed: {type(exc).__name__}: {exc}")
            return None

    return asyncio.gather(*(one(i) for i in range(len(sims))))


async def run_level(
    url: str,
    token: str,
    calls: int,
    pcm: bytes,
    gw: psutil.Process,
    load: list[psutil.Process],
) -> LevelResult:
    before = scrape(url)
    sims = [TwilioSimulator(url, auth_token=token) for _ in range(calls)]
    # The load generator must not be the one that is late: no GC pauses while it runs.
    gc.collect()
    gc.disable()
    task = ramped_calls(sims, pcm)
    await asyncio.sleep(RAMP_S + 1.0)
    gw.cpu_percent(None)
    for p in load:
        p.cpu_percent(None)
    await asyncio.sleep(len(pcm) / 2 / 8000 / 2)
    rss = gw.memory_info().rss / 2**20
    cpu = gw.cpu_percent(None)
    load_cpu = sum(p.cpu_percent(None) for p in load)
    results = [r for r in await task if r is not None]
    gc.enable()
    after = scrape(url)
    return LevelResult(
        calls=calls,
        completed=len(results),
        underruns=after.get("rutster_playout_underruns_total", 0.0)
        - before.get("rutster_playout_underruns_total", 0.0),
        pacer_p99_ms=histogram_p99_ms(before, after),
        caller_gaps=sum(r.heard_gaps for r in results),
        caller_jitter_p99_ms=pooled_jitter_p99_ms(results),
        gateway_cpu_pct=cpu,
        load_cpu_pct=load_cpu,
        rss_mib=rss,
    )


async def bench(levels: list[int], seconds: float, vad: str) -> None:
    pcm = read_wav_8k(SPEECH_WAV)[: int(seconds * 8000) * 2]
    token = secrets.token_urlsafe(16)
    cores = os.sched_getaffinity(0)
    gateway_core = {min(cores)}
    other = (cores - gateway_core) or gateway_core
    os.sched_setaffinity(0, other)
    with echo_brain_process() as brain:
        psutil.Process(brain.proc.pid).cpu_affinity(list(other))
        env = {
            "RUTSTER_TAP_URL": f"ws://{LOOPBACK}:{brain.port}/echo",
            "RUTSTER_BARGE_IN": "off",  # the echo brain talks over the caller by design
            "RUTSTER_VAD": vad,
            # Every call goes through the spend gate (embedded Redis), as in production;
            # lift the default tenant's caps so the load, not a limit, is measured.
            "RUTSTER_DEFAULT_MAX_CONCURRENT": "0",
            # Where the node breaks is measured: the overload guard would refuse the
            # calls past it instead (bench/overload.py measures that).
            "RUTSTER_OVERLOAD_GUARD": "off",
            "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
            "TWILIO_AUTH_TOKEN": token,
            "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
        }
        with gateway_process(env) as gateway:
            gw = psutil.Process(gateway.proc.pid)
            load = [psutil.Process(), psutil.Process(brain.proc.pid)]
            gw.cpu_affinity(list(gateway_core))
            url = f"http://{LOOPBACK}:{gateway.port}"
            await asyncio.sleep(0.5)
            idle_rss = gw.memory_info().rss / 2**20
            print(
                f"gateway pid {gw.pid} on core {sorted(gateway_core)}, load + brain on "
                f"{sorted(other)}; {seconds:.0f} s of speech per call; idle RSS {idle_rss:.1f} MiB"
            )
            print(
                f"{'calls':>6} {'done':>5} {'underruns':>9} {'pacer p99':>10} {'caller gaps':>11} "
                f"{'caller p99':>10} {'gw CPU':>7} {'load CPU':>8} {'gw RSS':>8}  result"
            )
            # Warm-up (not measured): first-use costs on both sides of the wire.
            await run_level(url, token, 5, pcm[: 3 * 8000 * 2], gw, load)
            rows: list[LevelResult] = []
            for calls in levels:
                row = await run_level(url, token, calls, pcm, gw, load)
                rows.append(row)
                print(
                    f"{row.calls:>6} {row.completed:>5} {row.underruns:>9.0f} "
                    f"{row.pacer_p99_ms:>8.1f}ms {row.caller_gaps:>11} "
                    f"{row.caller_jitter_p99_ms:>8.1f}ms {row.gateway_cpu_pct:>6.0f}% "
                    f"{row.load_cpu_pct:>7.0f}% {row.rss_mib:>6.1f}Mi  "
                    f"{'pass' if row.passed else 'FAIL'}"
                    + ("  (load side saturated: inconclusive)" if row.load_cpu_pct > 90 else "")
                )
                await asyncio.sleep(1.0)
            passing = [r.calls for r in rows if r.passed]
            print(f"largest passing level: {max(passing) if passing else 0} calls (goal ≥ 150)")
            if len(rows) >= 2:
                # A growth rate: the least-squares slope of RSS over the levels' calls.
                slope = float(np.polyfit([r.calls for r in rows], [r.rss_mib for r in rows], 1)[0])
                print(
                    f"RSS growth per added call: {slope * 1024:.0f} KiB "
                    f"(slope of the gateway's RSS over the levels; goal ≤ 1024 KiB)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--levels", default="25,50,100,150,200")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--vad", default=DEFAULT_DETECTOR, choices=DETECTOR_NAMES, help="the gateway's VAD"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    try:
        import uvloop
    except ImportError:
        asyncio.run(bench(levels, args.seconds, args.vad))
    else:
        uvloop.run(bench(levels, args.seconds, args.vad))


if __name__ == "__main__":
    main()
