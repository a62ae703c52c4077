"""Concurrent echo calls on one gateway node, then on two nodes sharing one Redis, side by side.

The same load as ``bench/concurrent_calls.py`` (simulated Twilio calls of the
recorded speech fixture, signed webhooks, real-time paced μ-law, marks echoed),
run twice in one invocation against the same Redis and echo brain:

- **1 node**: one ``rutster serve`` process, pinned to the first core;
- **2 nodes**: two ``rutster serve`` processes (node ids ``node-1``, ``node-2``),
  one per core, sharing the Redis (an embedded ``redis-server`` this script
  starts, as an external Redis would be), the calls dealt to them in turn, as a
  load balancer would.

For each level it prints calls carried (completed with zero playout underruns on
every node), playout underruns (sum over nodes), the pacer's p99 wake-up
lateness over **every pacer tick of every node** (their histograms summed, then
the 99th percentile: one p99, not a max of p99s), the caller-side p99 of
|inter-arrival - audio duration| over **every media message of every call**
(pooled), gaps heard, and each gateway's CPU.

On a 2-core machine the two-node run has no core left for the load generator
and the echo brain: they share the gateways' cores, so that run is pessimistic
and the script says so. What the comparison shows is that a second node adds
capacity through the shared Redis without losing calls or pacing; absolute
figures are this machine's only.

Usage: ``python -m bench.cluster_calls [--levels 20,40,60] [--seconds 15]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.concurrent_calls import (
    RAMP_S,
    SPEECH_WAV,
    histogram_p99_ms,
    pooled_jitter_p99_ms,
    ramped_calls,
    scrape,
)
from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.tools.launcher import LOOPBACK, Service, echo_brain_process, gateway_process
from rutster.tools.twilio_simulator import TwilioSimulator, read_wav_8k

#: Pacing goal of the foundation issue: p99 outbound pacing jitter ≤ 10 ms.
JITTER_GOAL_MS = 10.0


@dataclass
class Row:
    """One level on one topology."""

    topology: str
    calls: int
    completed: int
    underruns: float
    pacer_p99_ms: float
    caller_p99_ms: float
    caller_gaps: int
    gateway_cpu: list[float]
    load_cpu: float

    @property
    def carried(self) -> bool:
        return (
            self.completed == self.calls
            and self.underruns == 0
            and self.pacer_p99_ms <= JITTER_GOAL_MS
        )


def summed(samples: list[dict[str, float]]) -> dict[str, float]:
    """Metric samples of several nodes added up, name by name."""
    total: dict[str, float] = {}
    for sample in samples:
        for key, value in sample.items():
            total[key] = total.get(key, 0.0) + value
    return total


async def run_level(
    topology: str,
    urls: list[str],
    token: str,
    calls: int,
    pcm: bytes,
    gateways: list[psutil.Process],
    load: list[psutil.Process],
) -> Row:
    before = [scrape(url) for url in urls]
    sims = [TwilioSimulator(urls[i % len(urls)], auth_token=token) for i in range(calls)]
    gc.collect()
    gc.disable()  # the load generator must not be the one that is late
    task = ramped_calls(sims, pcm)
    await asyncio.sleep(RAMP_S + 1.0)
    for process in (*gateways, *load):
        process.cpu_percent(None)
    await asyncio.sleep(len(pcm) / 2 / 8000 / 2)
    cpu = [gw.cpu_percent(None) for gw in gateways]
    load_cpu = sum(process.cpu_percent(None) for process in load)
    results = [r for r in await task if r is not None]
    gc.enable()
    after = summed([scrape(url) for url in urls])
    start = summed(before)
    return Row(
        topology=topology,
        calls=calls,
        completed=len(results),
        underruns=after.get("rutster_playout_underruns_total", 0.0)
        - start.get("rutster_playout_underruns_total", 0.0),
        pacer_p99_ms=histogram_p99_ms(start, after),
        caller_p99_ms=pooled_jitter_p99_ms(results),
        caller_gaps=sum(r.heard_gaps for r in results),
        gateway_cpu=cpu,
        load_cpu=load_cpu,
    )


@contextlib.contextmanager
def nodes(count: int, env: dict[str, str], cores: list[int]) -> Iterator[list[Service]]:
    """``count`` gateway processes on ``env``, node ``k`` pinned to ``cores[k % len]``."""
    with contextlib.ExitStack() as stack:
        started = []
        for k in range(count):
            service = stack.enter_context(
                gateway_process({**env, "RUTSTER_NODE_ID": f"node-{k + 1}"})
            )
            psutil.Process(service.proc.pid).cpu_affinity([cores[k % len(cores)]])
            started.append(service)
        yield started


async def bench(levels: list[int], seconds: float) -> None:
    pcm = read_wav_8k(SPEECH_WAV)[: int(seconds * 8000) * 2]
    token = secrets.token_urlsafe(16)
    cores = sorted(os.sched_getaffinity(0))
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="rutster-cluster-bench-") as data,
        EmbeddedRedis(Path(data)) as redis,
        echo_brain_process() as brain,
    ):
        env = {
            "REDIS_URL": redis.url,
            "RUTSTER_REDIS_PREFIX": "bench" + secrets.token_hex(4),
            "RUTSTER_TAP_URL": f"ws://{LOOPBACK}:{brain.port}/echo",
            "RUTSTER_BARGE_IN": "off",  # the echo brain talks over the caller by design
            "RUTSTER_DEFAULT_MAX_CONCURRENT": "0",
            # Where the node breaks is measured: the overload guard would refuse the
            # calls past it instead (bench/overload.py measures that).
            "RUTSTER_OVERLOAD_GUARD": "off",
            "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
            "TWILIO_AUTH_TOKEN": token,
            # One secret for every node, as behind a load balancer.
            "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
        }
        print(
            f"{len(cores)} core(s); {seconds:.0f} s of speech per call; Redis {redis.url} "
            "shared by every node; the echo brain in its own process"
        )
        for count in (1, 2):
            topology = f"{count} node" + ("s" if count > 1 else "")
            gateway_cores = cores[:count] if count <= len(cores) else cores
            load_cores = [c for c in cores if c not in gateway_cores] or cores
            os.sched_setaffinity(0, load_cores)
            psutil.Process(brain.proc.pid).cpu_affinity(load_cores)
            with nodes(count, env, gateway_cores) as services:
                gws = [psutil.Process(s.proc.pid) for s in services]
                load = [psutil.Process(), psutil.Process(brain.proc.pid)]
                urls = [f"http://{LOOPBACK}:{s.port}" for s in services]
                shared = " (load generator and brain share the gateways' cores)"
                print(
                    f"\n{topology}: gateways on cores {gateway_cores}, load generator and "
                    f"brain on {load_cores}" + (shared if load_cores == cores else "")
                )
                await run_level(topology, urls, token, 4, pcm[: 3 * 8000 * 2], gws, load)  # warm-up
                for calls in levels:
                    row = await run_level(topology, urls, token, calls, pcm, gws, load)
                    rows.append(row)
                    await asyncio.sleep(1.0)
    print(
        "\ncalls: offered; done: completed; underruns: playout underruns, all nodes; "
        "pacer p99: one p99 over every pacer tick of every node (interpolated in its "
        "histogram bucket); caller p99: one p99 of "
        "|inter-arrival - duration| over every media message of every call; "
        f"carried: done == calls, 0 underruns, pacer p99 <= {JITTER_GOAL_MS:.0f} ms; "
        "load CPU: this load generator and the echo brain (100 % = one core)"
    )
    print(
        f"{'topology':<8} {'calls':>5} {'done':>5} {'underruns':>9} {'pacer p99':>10} "
        f"{'caller p99':>10} {'gaps':>5}  {'gateway CPU':<16} {'load CPU':>8} carried"
    )
    for row in rows:
        cpu = " + ".join(f"{c:.0f}%" for c in row.gateway_cpu)
        print(
            f"{row.topology:<8} {row.calls:>5} {row.completed:>5} {row.underruns:>9.0f} "
            f"{row.pacer_p99_ms:>8.1f}ms {row.caller_p99_ms:>8.1f}ms {row.caller_gaps:>5}  "
            f"{cpu:<16} {row.load_cpu:>7.0f}% {'yes' if row.carried else 'NO'}"
        )
    for topology in ("1 node", "2 nodes"):
        carried = [r.calls for r in rows if r.topology == topology and r.carried]
        print(f"{topology}: largest level carried {max(carried) if carried else 0} calls")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--levels", default="20,40,60")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    asyncio.run(bench(levels, args.seconds))


if __name__ == "__main__":
    main()
