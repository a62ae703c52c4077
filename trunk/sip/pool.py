"""The SIP worker pool: N ``rutster sip-worker`` processes on consecutive ports, kept alive.

``rutster sip-pool --workers N --base-port P`` runs worker *i* on port ``P + i``. One pjsua2
process holds at most 4 calls (measured, docs/SIP.md), so capacity grows by processes; Kamailio's
dispatcher (infra/kamailio/) spreads INVITEs over the ports.

The supervisor restarts a worker that exits, on the same port, after an exponential backoff with
a cap (:class:`RestartPolicy`, sans-I/O, time passed in), so a crash loop costs one spawn per
backoff step instead of a spinning CPU. SIGTERM/SIGINT sent to the pool are forwarded to every
worker; the pool then waits for them and SIGKILLs whatever is still alive after a grace period.

Each worker runs in its own process group: a terminal's Ctrl-C reaches only the pool, which then
forwards it exactly once, and the SIGKILL escalation also takes down anything a worker spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from rutster.base.backoff import Backoff

log = logging.getLogger(__name__)

#: Delays before restarting a worker that exited, then the last one repeated (seed decision): a
#: worker killed once is back within half a second; a crash loop settles at one try per 30 s.
WORKER_RESTART_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
#: A worker that ran at least this long before exiting counts as healthy: its backoff starts
#: over. Same window as systemd's DefaultStartLimitIntervalSec (10 s, systemd-system.conf(5)).
WORKER_STABLE_AFTER_S = 10.0
#: Grace between forwarding SIGTERM/SIGINT and SIGKILL: `docker stop`'s default (10 s), enough
#: for pjsua2 to send BYE on its (at most 4) calls and run libDestroy.
WORKER_STOP_GRACE_S = 10.0
#: Most workers one pool runs (seed decision): 64 x 4 calls = 256 calls at ~25 MB per process
#: (measured, ~1.6 GB). Past that, run another pool on another host behind the same Kamailio.
MAX_WORKERS = 64
#: Highest UDP/TCP port number (RFC 793 / RFC 768: 16-bit port field).
MAX_PORT = 65535

#: Builds the argv of worker ``index`` listening on ``port``.
CommandFactory = Callable[[int, int], Sequence[str]]
#: Extra environment variables of worker ``index`` on ``port``, merged over ``os.environ``.
EnvFactory = Callable[[int, int], Mapping[str, str]]


class PoolConfigError(ValueError):
    """The pool was asked for something impossible (no workers, ports past 65535, ...)."""


def worker_ports(base_port: int, workers: int) -> list[int]:
    """The ports of ``workers`` workers starting at ``base_port`` (one each, consecutive)."""
    if not 1 <= workers <= MAX_WORKERS:
        raise PoolConfigError(f"workers must be 1..{MAX_WORKERS}, got {workers}")
    if not 1 <= base_port <= MAX_PORT:
        raise PoolConfigError(f"base port must be 1..{MAX_PORT}, got {base_port}")
    last = base_port + workers - 1
    if last > MAX_PORT:
        raise PoolConfigError(
            f"{workers} workers from port {base_port} would need port {last} (> {MAX_PORT})"
        )
    return list(range(base_port, last + 1))


class RestartPolicy:
    """When to restart one worker (sans-I/O: callers pass the monotonic time in).

    ``on_start(now)`` when the process is up, ``on_exit(now)`` when it is gone; ``on_exit``
    returns the delay before the next start. Quick exits walk up ``delays``; a run of at least
    ``stable_after_s`` resets the walk. A failed spawn is an exit without a start.
    """

    def __init__(
        self,
        delays: Sequence[float] = WORKER_RESTART_DELAYS_S,
        stable_after_s: float = WORKER_STABLE_AFTER_S,
    ) -> None:
        if not delays:
            raise PoolConfigError("restart policy needs at least one delay")
        if any(not d > 0 for d in delays):
            # A zero delay would let a crash-looping worker spin the CPU.
            raise PoolConfigError(f"restart delays must all be > 0 s, got {tuple(delays)}")
        if not stable_after_s > 0:
            raise PoolConfigError(f"stable_after_s must be > 0, got {stable_after_s}")
        self._backoff = Backoff(delays)
        self._stable_after_s = stable_after_s
        self._started_at: float | None = None

    @property
    def consecutive_failures(self) -> int:
        """Quick exits (or failed spawns) since the last healthy run."""
        return self._backoff.attempt

    def on_start(self, now: float) -> None:
        """The worker process was spawned at ``now``."""
        self._started_at = now

    def on_exit(self, now: float) -> float:
        """The worker exited (or failed to spawn) at ``now``: seconds to wait before restarting."""
        started = self._started_at
        self._started_at = None
        if started is not None and now - started >= self._stable_after_s:
            self._backoff.reset()
        return self._backoff.next_delay()


@dataclass(frozen=True)
class WorkerStatus:
    """A snapshot of one worker slot."""

    index: int
    port: int
    #: The current (or last) process id; None before the first successful spawn.
    pid: int | None
    alive: bool
    #: Times the worker was started again after an exit or a failed spawn.
    restarts: int
    #: Exit code of the last exit (negative = killed by that signal); None if it never exited.
    last_exit_code: int | None
    #: Spawns that failed before a process existed (missing executable, fork failure, ...).
    spawn_failures: int


class _WorkerSlot:
    """Mutable per-worker state, owned by its supervisor task."""

    def __init__(self, index: int, port: int, policy: RestartPolicy) -> None:
        self.index = index
        self.port = port
        self.policy = policy
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.spawn_failures = 0
        self.last_exit_code: int | None = None
        self.first_attempt_done = asyncio.Event()

    def status(self) -> WorkerStatus:
        proc = self.proc
        return WorkerStatus(
            index=self.index,
            port=self.port,
            pid=proc.pid if proc is not None else None,
            alive=proc is not None and proc.returncode is None,
            restarts=self.restarts,
            last_exit_code=self.last_exit_code,
            spawn_failures=self.spawn_failures,
        )


class SipWorkerPool:
    """Runs and supervises ``workers`` processes on ports ``base_port .. base_port+workers-1``.

    ``command_for(index, port)`` gives each worker's argv (called at every (re)start);
    ``env_for(index, port)`` gives extra environment variables merged over ``os.environ``.
    Use ``await pool.run()`` in a CLI (installs SIGTERM/SIGINT handlers, returns when stopped),
    or ``async with pool:`` (start/stop) in code and tests.
    """

    def __init__(
        self,
        *,
        workers: int,
        base_port: int,
        command_for: CommandFactory,
        env_for: EnvFactory | None = None,
        restart_delays: Sequence[float] = WORKER_RESTART_DELAYS_S,
        stable_after_s: float = WORKER_STABLE_AFTER_S,
        stop_grace_s: float = WORKER_STOP_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        ports = worker_ports(base_port, workers)
        if not stop_grace_s >= 0:
            raise PoolConfigError(f"stop_grace_s must be >= 0, got {stop_grace_s}")
        self._command_for = command_for
        self._env_for = env_for
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        self._slots = [
            _WorkerSlot(i, port, RestartPolicy(restart_delays, stable_after_s))
            for i, port in enumerate(ports)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stop_signal: int = signal.SIGTERM
        self._stop_event: asyncio.Event | None = None
        self._stop_requested: asyncio.Event | None = None
        self._requested_signal: int = signal.SIGTERM
        self._stop_task: asyncio.Task[None] | None = None

    @property
    def ports(self) -> list[int]:
        """The workers' ports, in worker order."""
        return [slot.port for slot in self._slots]

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` began (no more restarts)."""
        return self._stopping

    def status(self) -> list[WorkerStatus]:
        """One :class:`WorkerStatus` per worker, in worker order."""
        return [slot.status() for slot in self._slots]

    def _argv(self, slot: _WorkerSlot) -> list[str]:
        argv = list(self._command_for(slot.index, slot.port))
        bad = [i for i, arg in enumerate(argv) if not isinstance(arg, str) or not arg]
        if not argv or bad:
            # Positions only, never values: an argv may carry a secret.
            raise PoolConfigError(
                f"command_for({slot.index}, {slot.port}) must give a non-empty list of "
                f"non-empty strings (bad items at {bad}, {len(argv)} items)"
            )
        return argv

    def _env(self, slot: _WorkerSlot) -> dict[str, str]:
        env = dict(os.environ)
        if self._env_for is not None:
            extra = dict(self._env_for(slot.index, slot.port))
            bad = sorted(
                str(k) for k, v in extra.items() if not isinstance(k, str) or not isinstance(v, str)
            )
            if bad:
                # Names only, never values: the environment carries RUTSTER_SIP_SECRET.
                raise PoolConfigError(
                    f"env_for({slot.index}, {slot.port}) must map str to str; bad: {bad}"
                )
            env.update(extra)
        return env

    async def start(self) -> None:
        """Spawn every worker; returns once each got its first spawn attempt.

        Raises :class:`PoolConfigError` (before spawning anything) when ``command_for`` or
        ``env_for`` gives nothing usable. A later spawn that fails (missing executable, fork
        failure, a factory raising) is logged, counted and retried with backoff.
        """
        if self._tasks:
            raise RuntimeError("pool already started")
        for slot in self._slots:
            # Fail fast on a broken factory, before any process exists.
            self._argv(slot)
            self._env(slot)
        self._stop_event = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._supervise(slot), name=f"sip-worker-{slot.index}")
            for slot in self._slots
        ]
        await asyncio.gather(*(slot.first_attempt_done.wait() for slot in self._slots))

    async def _spawn(self, slot: _WorkerSlot) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self._argv(slot),
            env=self._env(slot),
            stdin=asyncio.subprocess.DEVNULL,
            process_group=0,
        )

    async def _supervise(self, slot: _WorkerSlot) -> None:
        """Keep one worker running until the pool stops."""
        try:
            await self._keep_running(slot)
        finally:
            slot.first_attempt_done.set()  # start() must never wait on a dead supervisor

    async def _keep_running(self, slot: _WorkerSlot) -> None:
        stop_event = self._stop_event
        assert stop_event is not None
        while not self._stopping:
            try:
                proc = await self._spawn(slot)
            except Exception as exc:  # any failure to spawn is a counted, backed-off retry
                slot.spawn_failures += 1
                delay = slot.policy.on_exit(self._clock())
                log.error(
                    "sip worker %d (port %d) could not be started: %s; retry in %.1f s",
                    slot.index,
                    slot.port,
                    exc,
                    delay,
                )
            else:
                slot.proc = proc
                slot.policy.on_start(self._clock())
                log.info(
                    "sip worker %d started on port %d (pid %d)", slot.index, slot.port, proc.pid
                )
                if self._stopping:
                    # stop() signalled the workers while this one was being spawned.
                    _signal_group(proc, self._stop_signal)
                slot.first_attempt_done.set()
                code = await proc.wait()
                slot.last_exit_code = code
                if self._stopping:
                    break
                delay = slot.policy.on_exit(self._clock())
                log.warning(
                    "sip worker %d (port %d, pid %d) exited with %d; restart in %.1f s",
                    slot.index,
                    slot.port,
                    proc.pid,
                    code,
                    delay,
                )
            slot.first_attempt_done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_event.wait(), delay)
            if self._stopping:
                break
            slot.restarts += 1

    def _signal_all(self, signum: int) -> None:
        for slot in self._slots:
            if slot.proc is not None:
                _signal_group(slot.proc, signum)

    async def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop restarting, send ``signum`` to every worker, wait; SIGKILL after the grace.

        Idempotent: a second call waits for the first one's shutdown.
        """
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._shut_down(signum), name="sip-pool-stop")
        await asyncio.shield(self._stop_task)

    async def _shut_down(self, signum: int) -> None:
        self._stopping = True
        self._stop_signal = signum
        if self._stop_event is not None:
            self._stop_event.set()
        if self._stop_requested is not None:
            self._stop_requested.set()
        self._signal_all(signum)
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(self._tasks, timeout=self._stop_grace_s)
        if pending:
            stuck = [
                s.index for s in self._slots if s.proc is not None and s.proc.returncode is None
            ]
            log.warning(
                "sip workers %s still alive after %.1f s: SIGKILL", stuck, self._stop_grace_s
            )
            self._signal_all(signal.SIGKILL)
            await asyncio.wait(pending)
        for task in self._tasks:
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("sip worker supervisor failed: %r", exc)

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask :meth:`run` to stop, forwarding ``signum``; a second request SIGKILLs at once."""
        if self._stop_requested is None:
            raise RuntimeError("request_stop() needs a running run()")
        if self._stop_requested.is_set():
            log.warning("second stop request: SIGKILL to all sip workers")
            self._signal_all(signal.SIGKILL)
            return
        self._requested_signal = signum
        self._stop_requested.set()

    async def run(self) -> int:
        """Start, supervise until SIGTERM/SIGINT (or :meth:`request_stop`), stop; exit code 0."""
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        handled = (signal.SIGTERM, signal.SIGINT)
        for signum in handled:
            loop.add_signal_handler(signum, self.request_stop, signum)
        try:
            await self.start()
            await self._stop_requested.wait()
            await self.stop(self._requested_signal)
        finally:
            if not self._stopping:
                await self.stop()
            for signum in handled:
                loop.remove_signal_handler(signum)
        return 0

    async def __aenter__(self) -> SipWorkerPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _signal_group(proc: asyncio.subprocess.Process, signum: int) -> None:
    """Send ``signum`` to a worker's process group (it leads it: spawned with process_group=0)."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)
