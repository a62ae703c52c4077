"""A whole SIP path on loopback for load runs: echo brain + gateway + a pool of SIP workers.

``rutster sip-load`` without ``--target`` runs :func:`local_sip_stack` and aims
:func:`~tools.sip_load_generator.run_load` at its workers, call *i* to worker *i mod n*:

    load generator (pjsua2 peers) --SIP/RTP--> rutster sip-worker x ceil(calls/4)
        --WebSocket--> gateway (``rutster serve``, spend gate on its embedded Redis)
        --tap--> echo brain (``rutster brain echo``)

Every process is a real one started as in production; only the limits that would refuse a
load test are lifted (the same environment as ``bench/concurrent_calls.py``), and the secrets
are random per run. Besides the generator's report it prints what the stack cost: CPU seconds
per role (``psutil`` cpu_times before/after the run) and the gateway's ``/metrics`` deltas
(calls, admissions, underruns, pacer lateness, bad messages).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from rutster.media.vad import DEFAULT_DETECTOR, DETECTOR_NAMES
from rutster.tools.launcher import (
    LOOPBACK,
    Service,
    echo_brain_process,
    free_port,
    gateway_process,
)
from rutster.tools.sip_load_generator import (
    DEFAULT_CALLS,
    DEFAULT_CPS,
    DEFAULT_DURATION_S,
    DEFAULT_SPEECH_PATH,
    LoadReport,
    format_report,
    run_load,
)
from rutster.tools.sip_load_generator import main as generator_main
from rutster.trunk.sip.cli import sip_worker_argv
from rutster.trunk.sip.pool import MAX_WORKERS, PoolConfigError, SipWorkerPool
from rutster.trunk.sip.worker import WORKER_CAPACITY

log = logging.getLogger(__name__)

#: The generator's peers run at this niceness on the local stack: they share the box with
#: the system they measure, and would sit on their own machine in a real load test. Their
#: setup timestamps are taken in those peers, so starving them could only inflate setup.
GENERATOR_NICENESS = 10

__all__ = [
    "CpuSnapshot",
    "LocalSipStack",
    "MetricSample",
    "cpu_delta",
    "format_stack_report",
    "free_port_block",
    "load_gateway_env",
    "local_sip_stack",
    "parse_header",
    "parse_metrics",
    "run_sip_load",
    "scrape_metrics",
    "sip_load_main",
    "wait_workers_connected",
    "workers_needed",
]

#: How long all workers may take to start and connect to the gateway. Measured: 10 workers
#: spawned at once on the 2-core dev box were all connected ~2 s after the gateway listened
#: (each imports pjsua2 and numpy and starts a pjsua library); 60 s leaves room for a slow,
#: busy machine without hiding a worker that never connects.
WORKER_READY_TIMEOUT_S = 60.0
#: Poll interval while waiting for the workers (seed decision: cheap, and well below a start).
READY_POLL_S = 0.1
#: A worker's control connection must still be up this long after it was first seen: the
#: worker sends ``hello`` right after the WebSocket handshake, and a refused worker (wrong
#: secret) is closed by the gateway within milliseconds, so 0.5 s tells the two apart.
HELLO_SETTLE_S = 0.5
#: Tries to find ``n`` consecutive ports free for UDP and TCP (seed decision; a miss only
#: happens when another process grabs a port in between).
PORT_BLOCK_ATTEMPTS = 50
#: The SIP user part the generator calls (any user reaches the default tenant and brain).
TARGET_USER = "sip-load"
#: Timeout of one ``GET /metrics``: the gateway answers in milliseconds even under load.
METRICS_TIMEOUT_S = 10.0
#: After the last call the gateway settles each call (spend, metrics) asynchronously; wait at
#: most this long for ``rutster_active_calls`` to drop to 0 before reading the figures.
SETTLE_WAIT_S = 5.0
#: Load-run log level: warnings only, so the report is readable (``--log-level info`` shows
#: the pool, workers and gateway too).
DEFAULT_LOG_LEVEL = "warning"
#: Bytes of random data in each generated secret: 32 bytes (256 bits), above the gateway's
#: 16-byte minimum for RUTSTER_SIP_SECRET / RUTSTER_STREAM_SECRET.
SECRET_BYTES = 32
#: Length of the generated admin key in bytes (48 hex characters, above the 24 minimum).
ADMIN_KEY_BYTES = 24
#: The generator's exit code for bad arguments (load_generator.main).
EXIT_BAD_ARGS = 2
EXIT_PASS = 0
EXIT_FAIL = 1

#: The roles whose CPU the report shows, in print order.
ROLES = ("gateway", "redis", "workers", "brain", "sip-load")


def workers_needed(calls: int) -> int:
    """SIP workers for ``calls`` simultaneous calls: one pjsua2 process holds 4."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    return math.ceil(calls / WORKER_CAPACITY)


def load_gateway_env(tap_url: str, sip_secret: str, vad: str | None = None) -> dict[str, str]:
    """The gateway's environment for a load run (bench/concurrent_calls.py's, plus SIP).

    ``vad`` None = the gateway's default detector (set explicitly all the same).

    Every call still goes through the spend gate on the embedded Redis, as in production;
    only the default tenant's caps that a load test trips on are lifted.
    """
    env = {
        "RUTSTER_TAP_URL": tap_url,
        # The echo brain talks over the caller by design; barge-in would cut it.
        "RUTSTER_BARGE_IN": "off",
        # 0 = no limit: all calls come from one caller ("peer") to one tenant.
        "RUTSTER_DEFAULT_MAX_CONCURRENT": "0",
        # Where the node breaks is measured, not where its overload guard would refuse.
        "RUTSTER_OVERLOAD_GUARD": "off",
        "RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR": "0",
        "RUTSTER_SIP_SECRET": sip_secret,
        # Secure mode with throwaway secrets, as `rutster demo` runs.
        "TWILIO_AUTH_TOKEN": secrets.token_urlsafe(SECRET_BYTES),
        "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(SECRET_BYTES),
        "RUTSTER_ADMIN_KEY": secrets.token_hex(ADMIN_KEY_BYTES),
    }
    # Always set, so an RUTSTER_VAD in the caller's environment cannot make the report lie.
    env["RUTSTER_VAD"] = vad or DEFAULT_DETECTOR
    return env


def _port_free(port: int, host: str) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port_block(count: int, host: str = LOOPBACK) -> int:
    """The first of ``count`` consecutive ports free for both UDP and TCP right now.

    A pool runs worker *i* on ``base + i`` and a worker binds UDP and TCP on its port.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    for _ in range(PORT_BLOCK_ATTEMPTS):
        base = free_port(host)
        if base + count - 1 > 65535:
            continue
        if all(_port_free(base + i, host) for i in range(count)):
            return base
    raise OSError(f"no {count} consecutive free ports found in {PORT_BLOCK_ATTEMPTS} tries")


# ---- CPU accounting -------------------------------------------------------------------------

#: CPU seconds (user + system) per role, per process id.
CpuSnapshot = dict[str, dict[int, float]]


def _cpu_s(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds each role used between two snapshots (pure).

    A process seen only in ``after`` (a restarted worker) counts from 0; one gone by
    ``after`` counts nothing (its last seconds are lost, which psutil cannot see).
    """
    out: dict[str, float] = {}
    for role, pids in after.items():
        old = before.get(role, {})
        out[role] = sum(max(0.0, cpu - old.get(pid, 0.0)) for pid, cpu in pids.items())
    return out


# ---- the gateway's /metrics -----------------------------------------------------------------


@dataclass(frozen=True)
class MetricSample:
    """One Prometheus sample: name, labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_metrics(text: str) -> list[MetricSample]:
    """Prometheus text exposition -> samples (pure)."""
    return [
        MetricSample(s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


async def scrape_metrics(gateway_url: str) -> list[MetricSample]:
    """The gateway's ``/metrics`` right now."""
    async with httpx.AsyncClient(timeout=METRICS_TIMEOUT_S) as http:
        response = await http.get(f"{gateway_url}/metrics")
        response.raise_for_status()
    return parse_metrics(response.text)


def _total(samples: Sequence[MetricSample], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(s.value for s in samples if s.name == name and want <= set(s.labels))


def _by_label(
    samples: Sequence[MetricSample], name: str, label_names: Sequence[str]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        if s.name == name:
            labels = dict(s.labels)
            key = "/".join(labels.get(n, "") for n in label_names)
            out[key] = out.get(key, 0.0) + s.value
    return out


def _histogram_quantile_ms(
    before: Sequence[MetricSample], after: Sequence[MetricSample], name: str, q: float
) -> float | None:
    """Upper bound (ms) of the bucket holding quantile ``q`` of the histogram's new samples."""

    def buckets(samples: Sequence[MetricSample]) -> dict[float, float]:
        out: dict[float, float] = {}
        for s in samples:
            if s.name == f"{name}_bucket":
                bound = float(dict(s.labels)["le"])
                out[bound] = out.get(bound, 0.0) + s.value
        return out

    old, new = buckets(before), buckets(after)
    delta = sorted((b, new[b] - old.get(b, 0.0)) for b in new)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    for bound, count in delta:
        if count >= q * total:
            return bound * 1000.0
    return math.inf


def _delta(
    before: Sequence[MetricSample], after: Sequence[MetricSample], name: str, **labels: str
) -> float:
    return _total(after, name, **labels) - _total(before, name, **labels)


def format_stack_report(
    cpu_s: Mapping[str, float],
    workers: int,
    peer_cpu_s: float,
    wall_s: float,
    before: Sequence[MetricSample],
    after: Sequence[MetricSample],
    cores: int,
) -> str:
    """The stack's cost and the gateway's figures over the run, as text (pure)."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")

    def pct(seconds: float) -> str:
        return f"{seconds:.1f} s = {100.0 * seconds / wall_s:.0f} %"

    counts = {**{role: cpu_s.get(role, 0.0) for role in ROLES}, "peers": peer_cpu_s}
    total = sum(counts.values())
    lines = [f"local stack: {workers} SIP workers, gateway, echo brain ({wall_s:.1f} s measured)"]
    lines.append(
        "  CPU         "
        + "  ".join(
            f"{role}{f' ({workers})' if role == 'workers' else ''} {pct(counts[role])}"
            for role in (*ROLES, "peers")
        )
    )
    lines.append(
        f"  CPU total   {pct(total)} of one core; the machine has {cores} cores "
        f"({100.0 * total / wall_s / max(cores, 1):.0f} % of all)"
    )
    admitted = _delta(before, after, "rutster_admissions_total", outcome="admitted")
    refused = _delta(before, after, "rutster_admissions_total", outcome="refused")
    p99 = _histogram_quantile_ms(before, after, "rutster_pacer_lateness_seconds", 0.99)
    lines.append(
        f"  gateway     calls {_delta(before, after, 'rutster_calls_total'):.0f}  "
        f"admitted {admitted:.0f}  refused {refused:.0f}  "
        f"active after {_total(after, 'rutster_active_calls'):.0f}  "
        f"tap connect failures {_delta(before, after, 'rutster_tap_connect_failures_total'):.0f}"
    )
    lines.append(
        f"  audio       frames in {_delta(before, after, 'rutster_frames_in_total'):.0f}  "
        f"to brain {_delta(before, after, 'rutster_frames_to_brain_total'):.0f}  "
        f"out {_delta(before, after, 'rutster_frames_out_total'):.0f}  "
        f"underruns {_delta(before, after, 'rutster_playout_underruns_total'):.0f} "
        f"({_delta(before, after, 'rutster_playout_underrun_ms_total'):.0f} ms)  "
        f"overflow drops {_delta(before, after, 'rutster_playout_overflow_drops_total'):.0f}  "
        f"pacer lateness p99 {'n/a' if p99 is None else f'{p99:.1f} ms'}"
    )
    old_bad = _by_label(before, "rutster_bad_messages_total", ("source", "reason"))
    bad = {
        key: n - old_bad.get(key, 0.0)
        for key, n in _by_label(after, "rutster_bad_messages_total", ("source", "reason")).items()
        if n - old_bad.get(key, 0.0) > 0
    }
    old_drops = _by_label(before, "rutster_tap_send_drops_total", ("kind",))
    drops = sum(
        n - old_drops.get(key, 0.0)
        for key, n in _by_label(after, "rutster_tap_send_drops_total", ("kind",)).items()
    )
    lines.append(
        f"  bad msgs    {sum(bad.values()):.0f}"
        + "".join(f"  {key} {n:.0f}" for key, n in sorted(bad.items()))
        + f"  tap send drops {drops:.0f}"
    )
    return "\n".join(lines)


# ---- the stack -------------------------------------------------------------------------------


@dataclass
class LocalSipStack:
    """A running local stack: where its workers listen and which processes it is made of."""

    gateway: Service
    brain: Service
    pool: SipWorkerPool
    worker_uris: list[str] = field(default_factory=list)

    @property
    def gateway_url(self) -> str:
        """The gateway's HTTP base URL."""
        return f"http://{self.gateway.host}:{self.gateway.port}"

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [s.pid for s in self.pool.status() if s.alive and s.pid is not None]

    def cpu_snapshot(self) -> CpuSnapshot:
        """CPU seconds of every process of the stack (and of this process), by role."""
        gateway_pid = self.gateway.proc.pid
        try:
            redis = [c.pid for c in psutil.Process(gateway_pid).children(recursive=True)]
        except psutil.Error:
            redis = []
        roles = {
            "gateway": [gateway_pid],
            "redis": redis,
            "workers": self.worker_pids(),
            "brain": [self.brain.proc.pid],
            "sip-load": [psutil.Process().pid],
        }
        snapshot: CpuSnapshot = {}
        for role, pids in roles.items():
            snapshot[role] = {}
            for pid in pids:
                cpu = _cpu_s(pid)
                if cpu is not None:
                    snapshot[role][pid] = cpu
        return snapshot


def _control_connected(pid: int, gateway_port: int) -> bool:
    """True when process ``pid`` holds an established TCP connection to the gateway.

    A worker's only connection to the gateway before any call is its control channel, so
    this tells "connected" without asking the gateway (which exposes no worker count).
    """
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(
        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr[1] == gateway_port
        for c in conns
    )


async def wait_workers_connected(
    pool: SipWorkerPool, gateway_port: int, timeout_s: float = WORKER_READY_TIMEOUT_S
) -> None:
    """Wait until every worker of ``pool`` is connected to the gateway (and stays so)."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = pool.status()
        pids = [s.pid for s in statuses if s.alive and s.pid is not None]
        if len(pids) == len(statuses) and all(_control_connected(p, gateway_port) for p in pids):
            await asyncio.sleep(HELLO_SETTLE_S)
            again = pool.status()
            if [s.pid for s in again] == pids and all(
                s.alive and _control_connected(p, gateway_port)
                for s, p in zip(again, pids, strict=True)
            ):
                return
        if time.monotonic() > deadline:
            waiting = [
                f"worker {s.index} (port {s.port}, alive {s.alive}, exit {s.last_exit_code})"
                for s in statuses
                if not (s.alive and s.pid is not None and _control_connected(s.pid, gateway_port))
            ]
            raise TimeoutError(
                f"SIP workers not connected to the gateway after {timeout_s:.0f} s: "
                + ", ".join(waiting)
            )
        await asyncio.sleep(READY_POLL_S)


@contextlib.contextmanager
def _brain_and_gateway(
    sip_secret: str, vad: str | None, quiet: bool
) -> Iterator[tuple[Service, Service]]:
    with echo_brain_process(quiet=quiet) as brain:
        tap_url = f"ws://{LOOPBACK}:{brain.port}/echo"
        env = load_gateway_env(tap_url, sip_secret, vad)
        with gateway_process(env, free_port(), quiet=quiet) as gateway:
            yield brain, gateway


def _enter_services(
    sip_secret: str, vad: str | None, quiet: bool
) -> tuple[contextlib.ExitStack, Service, Service]:
    stack = contextlib.ExitStack()
    try:
        brain, gateway = stack.enter_context(_brain_and_gateway(sip_secret, vad, quiet))
    except BaseException:
        stack.close()
        raise
    return stack, brain, gateway


@asynccontextmanager
async def local_sip_stack(
    calls: int,
    *,
    vad: str | None = None,
    log_level: str = DEFAULT_LOG_LEVEL,
) -> AsyncIterator[LocalSipStack]:
    """Echo brain + gateway + ``ceil(calls / 4)`` SIP workers on free loopback ports.

    Yields once every worker is connected to the gateway; ``stack.worker_uris`` are the SIP
    URIs to call (one per worker). ``vad`` sets the gateway's ``RUTSTER_VAD``. Leaving the
    block stops the workers (they BYE their calls), then the gateway, then the brain.
    """
    if vad is not None and vad not in DETECTOR_NAMES:
        raise ValueError(f"unknown VAD {vad!r}; valid names: {', '.join(DETECTOR_NAMES)}")
    workers = workers_needed(calls)
    if workers > MAX_WORKERS:
        raise ValueError(
            f"{calls} calls need {workers} workers, more than one pool runs ({MAX_WORKERS})"
        )
    quiet = log_level.lower() not in ("debug", "info")
    sip_secret = secrets.token_urlsafe(SECRET_BYTES)
    services, brain, gateway = await asyncio.to_thread(_enter_services, sip_secret, vad, quiet)
    try:
        ws_url = f"ws://{gateway.host}:{gateway.port}"
        base_port = free_port_block(workers)
        pool = SipWorkerPool(
            workers=workers,
            base_port=base_port,
            command_for=lambda _index, port: sip_worker_argv(port, log_level.lower()),
            env_for=lambda index, _port: {
                "RUTSTER_GATEWAY_URL": ws_url,
                "RUTSTER_SIP_SECRET": sip_secret,
                "RUTSTER_SIP_BIND": LOOPBACK,
                "RUTSTER_SIP_ALLOW_CIDRS": f"{LOOPBACK}/32",
                "RUTSTER_SIP_WORKER_ID": f"load-{index}",
            },
        )
        async with pool:
            await wait_workers_connected(pool, gateway.port)
            yield LocalSipStack(
                gateway=gateway,
                brain=brain,
                pool=pool,
                worker_uris=[f"sip:{TARGET_USER}@{LOOPBACK}:{port}" for port in pool.ports],
            )
    finally:
        await asyncio.to_thread(services.close)


async def _wait_calls_settled(gateway_url: str) -> list[MetricSample]:
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        samples = await scrape_metrics(gateway_url)
        if _total(samples, "rutster_active_calls") == 0 or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(READY_POLL_S)


async def run_sip_load(
    calls: int,
    cps: float,
    duration_s: float,
    speech_path: str | Path = DEFAULT_SPEECH_PATH,
    headers: Mapping[str, str] | None = None,
    *,
    vad: str | None = None,
    log_level: str = DEFAULT_LOG_LEVEL,
) -> tuple[LoadReport, str]:
    """Start a local stack, run the generator against its workers; (report, stack text)."""
    async with local_sip_stack(calls, vad=vad, log_level=log_level) as stack:
        before = await scrape_metrics(stack.gateway_url)
        cpu0 = stack.cpu_snapshot()
        t0 = time.monotonic()
        report = await run_load(
            stack.worker_uris,
            calls,
            cps,
            duration_s,
            speech_path,
            headers,
            bind_host=LOOPBACK,
            peer_niceness=GENERATOR_NICENESS,
        )
        cpu1 = stack.cpu_snapshot()
        wall = time.monotonic() - t0
        after = await _wait_calls_settled(stack.gateway_url)
        text = format_stack_report(
            cpu_delta(cpu0, cpu1),
            len(stack.worker_uris),
            report.peer_cpu_s,
            wall,
            before,
            after,
            psutil.cpu_count() or 1,
        )
        still_active = _total(after, "rutster_active_calls")
        if still_active:
            text += (
                f"\n  WARNING     {still_active:.0f} call(s) still active on the gateway "
                f"{SETTLE_WAIT_S:.0f} s after the generator's last call ended"
            )
        text += f"\n  gateway VAD {vad or DEFAULT_DETECTOR}{'' if vad else ' (default)'}"
    return report, text


def parse_header(text: str) -> tuple[str, str]:
    """``NAME:VALUE`` -> (name, value); ValueError when there is no name or colon."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"header must be NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def _generator_argv(args: argparse.Namespace) -> list[str]:
    argv = [item for target in args.target for item in ("--target", target)]
    for flag, value in (
        ("--calls", args.calls),
        ("--cps", args.cps),
        ("--duration", args.duration),
        ("--speech", args.speech),
        ("--bind-host", args.bind_host),
    ):
        if value is not None:
            argv += [flag, str(value)]
    for header in args.header:
        argv += ["--header", header]
    return argv


def sip_load_main(args: argparse.Namespace) -> int:
    """Body of ``rutster sip-load``: 0 = PASS, 1 = FAIL, 2 = bad arguments.

    With ``--target`` only the generator runs (``load_generator.main``); without, a whole
    local stack is started and measured too.
    """
    if args.target:
        if args.vad is not None:
            print("sip-load: --vad applies to the local stack only (drop --target)")
            return EXIT_BAD_ARGS
        return generator_main(_generator_argv(args))
    if args.bind_host not in (None, LOOPBACK):
        print(f"sip-load: the local stack runs on {LOOPBACK}; --bind-host needs --target")
        return EXIT_BAD_ARGS
    calls = DEFAULT_CALLS if args.calls is None else args.calls
    cps = DEFAULT_CPS if args.cps is None else args.cps
    duration = DEFAULT_DURATION_S if args.duration is None else args.duration
    speech = Path(args.speech) if args.speech else DEFAULT_SPEECH_PATH
    try:
        if not speech.is_file():
            raise ValueError(f"speech file {speech} not found")
        headers = dict(parse_header(h) for h in args.header)
        if not cps > 0:
            raise ValueError(f"cps must be > 0, got {cps}")
        if not duration > 0:
            raise ValueError(f"duration must be > 0 s, got {duration}")
        workers_needed(calls)
        report, stack_text = asyncio.run(
            run_sip_load(
                calls,
                cps,
                duration,
                speech,
                headers,
                vad=args.vad,
                log_level=args.log_level,
            )
        )
    except (ValueError, PoolConfigError) as exc:
        print(f"sip-load: {exc}")
        return EXIT_BAD_ARGS
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"sip-load: the local stack failed: {type(exc).__name__}: {exc}")
        return EXIT_FAIL
    print(stack_text)
    print(format_report(report))
    return EXIT_PASS if report.passed else EXIT_FAIL
