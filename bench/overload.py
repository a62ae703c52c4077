"""Overload: one gateway core offered twice the calls it can carry, then SIGTERM under load.

``python -m bench.overload --capacity N`` (N: the calls this machine's gateway carries on
one core, from ``python -m bench.vs_pipecat``; the default is this project's dev VM's).

``rutster serve`` with default settings (its overload guard on; ``RUTSTER_DRAIN_TIMEOUT_S``
set short so the run does not wait out the 25 s default) is pinned to one core, its echo
brain and the load generator (this process: signed Twilio webhooks, real-time paced
μ-law of recorded speech, marks echoed) to the other. Two waves:

1. **Overload**: twice N calls offered at ``--rate`` a second, each running its whole
   speech. Printed: calls admitted and refused (by reason, from the gateway's own
   counters), brain connections opened (a refused call must open none), and of the
   admitted calls how many were carried (≥ 95 % of the audio back, no heard gap over
   60 ms: issue 18's rule), with the guard's own readings at the end of the ramp.
2. **SIGTERM under load**: the same offer again, and SIGTERM once its ramp is over:
   how long the process took to exit, against its drain deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass

import httpx
import psutil

from bench.vs_pipecat import RATE, SPEECH_WAV, carried, rutster_gateway, wait_answering
from rutster.tools.launcher import LOOPBACK, Service
from rutster.tools.twilio_simulator import (
    CallRefused,
    SimulatedCallResult,
    TwilioSimulator,
    read_wav_8k,
)

#: This project's dev VM's carried calls per gateway core, default settings
#: (docs/BENCHMARKS.md, "rutster and Pipecat, side by side": its first two runs carried
#: 30 and 35).
DEFAULT_CAPACITY = 30
#: Offer rate (calls started a second). Seed decision: twice vs_pipecat's 5 a second, a
#: burst the guard has to meet before the calls it admitted show their cost.
DEFAULT_RATE_PER_S = 10.0
#: The drain deadline the gateway runs with here (RUTSTER_DRAIN_TIMEOUT_S).
DRAIN_S = 5.0
#: What a stop may add to the drain deadline before it counts as not stopping.
STOP_MARGIN_S = 5.0


@dataclass
class Wave:
    """What one offer of calls came to."""

    offered: int
    results: list[SimulatedCallResult]
    refused: int
    failed: int


async def offer(url: str, token: str, count: int, rate: float, pcm: bytes) -> Wave:
    """``count`` calls of ``pcm`` started at ``rate`` a second; a webhook answered with
    ``<Reject>`` is a refusal, any other failure is counted apart."""

    async def one(i: int) -> SimulatedCallResult | str:
        await asyncio.sleep(i / rate)
        try:
            return await TwilioSimulator(url, auth_token=token).place_call(pcm, tail_s=1.0)
        except CallRefused:  # the TwiML had no <Connect><Stream>: refused
            return "refused"
        except Exception as exc:
            return f"failed: {type(exc).__name__}: {exc}"

    outcomes = await asyncio.gather(*(one(i) for i in range(count)))
    results = [o for o in outcomes if isinstance(o, SimulatedCallResult)]
    failures = [o for o in outcomes if isinstance(o, str) and o != "refused"]
    for failure in failures[:5]:
        print(f"    {failure}")
    return Wave(count, results, sum(o == "refused" for o in outcomes), len(failures))


async def metrics(url: str) -> str:
    """The gateway's Prometheus exposition ("" when an overloaded gateway did not answer:
    its figures then print as 0)."""
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(f"{url}/metrics")).text
    except httpx.HTTPError as exc:
        print(f"    /metrics did not answer: {type(exc).__name__} {exc}")
        return ""


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(\{[^}]*\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


async def overload_wave(
    node: Service, url: str, token: str, count: int, rate: float, pcm: bytes
) -> None:
    before = await metrics(url)
    task = asyncio.ensure_future(offer(url, token, count, rate, pcm))
    await asyncio.sleep(count / rate + 1.0)
    during = await metrics(url)
    wave = await task
    after = await metrics(url)
    sent_ms = len(pcm) / 2 / RATE * 1000
    admitted = len(wave.results)
    carried_n = sum(carried(r, sent_ms) for r in wave.results)
    refusals = {
        reason: int(
            sample(after, "rutster_admissions_total", outcome="refused", reason=reason)
            - sample(before, "rutster_admissions_total", outcome="refused", reason=reason)
        )
        for reason in ("node_overloaded", "node_full", "store_unavailable")
    }
    brains = sample(after, "rutster_tap_connects_total") - sample(
        before, "rutster_tap_connects_total"
    )
    print(
        f"offered {wave.offered} calls at {rate:.0f}/s: admitted {admitted}, refused "
        f"{wave.refused} at the webhook ({', '.join(f'{k} {v}' for k, v in refusals.items())}), "
        f"other failures {wave.failed}"
    )
    print(f"brain connections opened: {brains:.0f} (one per admitted call: {admitted})")
    print(f"admitted calls carried: {carried_n}/{admitted}")
    print(
        "guard's readings at the end of the ramp: loop CPU "
        f"{sample(during, 'rutster_loop_busy_ratio'):.0%} of its core, wake-up lateness P90 "
        f"{sample(during, 'rutster_loop_lag_seconds') * 1000:.1f} ms, capacity estimate "
        f"{sample(during, 'rutster_capacity_estimate_calls'):.0f} calls, live calls "
        f"{sample(during, 'rutster_active_calls'):.0f}"
    )


async def sigterm_wave(
    node: Service, url: str, token: str, count: int, rate: float, pcm: bytes
) -> None:
    task = asyncio.ensure_future(offer(url, token, count, rate, pcm))
    await asyncio.sleep(count / rate + 1.0)
    live = sample(await metrics(url), "rutster_active_calls")
    node.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    exited: int | None = None
    while time.monotonic() - signalled < DRAIN_S + STOP_MARGIN_S + 30:
        exited = node.proc.poll()
        if exited is not None:
            break
        await asyncio.sleep(0.05)
    took = time.monotonic() - signalled
    if exited is None:
        print(f"SIGTERM with {live:.0f} live calls: NOT stopped after {took:.1f} s (killed)")
        node.proc.kill()
    else:
        verdict = "within" if took <= DRAIN_S + STOP_MARGIN_S else "NOT within"
        print(
            f"SIGTERM with {live:.0f} live calls and calls still arriving: exited {exited} after "
            f"{took:.1f} s ({verdict} its {DRAIN_S:.0f} s drain deadline + {STOP_MARGIN_S:.0f} s)"
        )
    with_timeout = asyncio.wait_for(task, 60)
    await with_timeout


async def bench(capacity: int, rate: float, seconds: float, guard: bool) -> None:
    pcm = read_wav_8k(SPEECH_WAV)[: int(seconds * RATE) * 2]
    token = secrets.token_urlsafe(16)
    cores = sorted(os.sched_getaffinity(0))
    server_core, load_cores = [cores[0]], cores[1:] or [cores[0]]
    os.sched_setaffinity(0, load_cores)
    count = 2 * capacity
    print(
        f"gateway on core {server_core} (default settings, RUTSTER_DRAIN_TIMEOUT_S={DRAIN_S:.0f}"
        f"{'' if guard else ', RUTSTER_OVERLOAD_GUARD=off'}), "
        f"load generator and echo brain on {load_cores}; capacity taken as {capacity} calls, "
        f"{count} offered per wave, {seconds:.0f} s of recorded speech per call"
    )
    gc.disable()  # the load generator must not be the one that is late
    overrides = {
        "RUTSTER_DRAIN_TIMEOUT_S": str(DRAIN_S),
        "RUTSTER_OVERLOAD_GUARD": "on" if guard else "off",
    }
    with rutster_gateway(token, load_cores, overrides) as node:
        psutil.Process(node.proc.pid).cpu_affinity(server_core)
        url = f"http://{LOOPBACK}:{node.port}"
        wait_answering(url, node.proc)
        print("wave 1: overload")
        await overload_wave(node, url, token, count, rate, pcm)
        print("wave 2: SIGTERM under load")
        await sigterm_wave(node, url, token, count, rate, pcm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE_PER_S)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--no-guard",
        action="store_true",
        help="RUTSTER_OVERLOAD_GUARD=off: what the node does with no overload guard",
    )
    args = parser.parse_args()
    if args.capacity < 1 or args.rate <= 0:
        parser.error("--capacity and --rate must be positive")
    asyncio.run(bench(args.capacity, args.rate, args.seconds, not args.no_guard))


if __name__ == "__main__":
    main()
