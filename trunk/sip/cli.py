"""The ``rutster sip-worker``, ``rutster sip-pool`` and ``rutster sip-load`` commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from rutster.base.env_values import ConfigError
from rutster.base.log_format import setup_logging

log = logging.getLogger(__name__)

#: First port of ``rutster sip-pool`` when none is given: RFC 3261's 5060 is left to
#: the load balancer (Kamailio) in front of the workers, so workers start at 5070.
DEFAULT_POOL_BASE_PORT = 5070
#: Workers in a pool when none is given: one per core of a 2-core box, each up to 4 calls.
DEFAULT_POOL_WORKERS = 2


def _setup_logging(level: str) -> None:
    setup_logging(level)


def cmd_sip_worker(args: argparse.Namespace) -> int:
    """Run one SIP worker (pjsua2 UA + bridge to the gateway) until SIGTERM."""
    from rutster.trunk.sip.worker import run_sip_worker
    from rutster.trunk.sip.worker_config import SipWorkerSettings

    _setup_logging(args.log_level)
    try:
        settings = SipWorkerSettings.from_env(sip_port=args.sip_port)
        asyncio.run(run_sip_worker(settings, exit_with_parent=args.exit_with_parent))
    except ConfigError as exc:
        print(f"rutster sip-worker: configuration error: {exc}", file=sys.stderr)
        return 2
    return 0


def sip_worker_argv(port: int, log_level: str = "info") -> list[str]:
    """The command line of one pooled worker."""
    return [
        sys.executable,
        "-m",
        "rutster.gateway.cli",
        "sip-worker",
        "--sip-port",
        str(port),
        "--log-level",
        log_level,
        "--exit-with-parent",
    ]


def cmd_sip_pool(args: argparse.Namespace) -> int:
    """Run N SIP workers on consecutive ports and restart any that dies."""
    from rutster.trunk.sip.pool import PoolConfigError, SipWorkerPool
    from rutster.trunk.sip.worker_config import SipWorkerSettings

    _setup_logging(args.log_level)
    try:
        SipWorkerSettings.from_env(sip_port=args.base_port)  # fail here, not N times in children
        pool = SipWorkerPool(
            workers=args.workers,
            base_port=args.base_port,
            command_for=lambda _index, port: sip_worker_argv(port, args.log_level),
            env_for=lambda index, port: {"RUTSTER_SIP_WORKER_ID": f"{args.id_prefix}{index}"},
        )
    except (ConfigError, PoolConfigError) as exc:
        print(f"rutster sip-pool: configuration error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(pool.run())


def cmd_sip_load(args: argparse.Namespace) -> int:
    """Place SIP load on ``--target`` URIs, or on a whole local stack started for the run."""
    from rutster.trunk.sip.load_stack import sip_load_main

    _setup_logging(args.log_level)
    return sip_load_main(args)


def add_sip_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the SIP commands to the ``rutster`` parser."""
    worker = sub.add_parser(
        "sip-worker", help="run one SIP worker: pjsua2 legs bridged to the gateway"
    )
    worker.add_argument(
        "--sip-port", type=int, default=None, help="UDP+TCP port (default $RUTSTER_SIP_PORT, 5060)"
    )
    worker.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the parent process dies (set by sip-pool)",
    )
    worker.add_argument("--log-level", default="info")
    worker.set_defaults(func=cmd_sip_worker)

    pool = sub.add_parser("sip-pool", help="run N SIP workers on consecutive ports, restarting")
    pool.add_argument("--workers", type=int, default=DEFAULT_POOL_WORKERS)
    pool.add_argument("--base-port", type=int, default=DEFAULT_POOL_BASE_PORT)
    pool.add_argument("--id-prefix", default="sip-", help="worker ids: PREFIX0, PREFIX1, ...")
    pool.add_argument("--log-level", default="info")
    pool.set_defaults(func=cmd_sip_pool)

    # Defaults are None here and resolved in trunk/sip/load_generator.py, which owns them
    # (importing it would load pjsua2 for every `rutster` command).
    load = sub.add_parser(
        "sip-load",
        help="place N concurrent SIP calls of real speech and check the issue-6 goals",
        description="Without --target: start an echo brain, a gateway and ceil(calls/4) SIP "
        "workers on loopback and call them round robin; with --target: only place the calls. "
        "Exit status 0 = PASS, 1 = FAIL, 2 = bad arguments.",
    )
    load.add_argument(
        "--target", action="append", default=[], help="SIP URI to call (repeat to rotate)"
    )
    load.add_argument("--calls", type=int, default=None, help="calls to place")
    load.add_argument("--cps", type=float, default=None, help="calls started per second")
    load.add_argument("--duration", type=float, default=None, help="seconds each call is held")
    load.add_argument("--speech", default=None, help="mono 16-bit WAV to send (the fixture)")
    load.add_argument(
        "--header", action="append", default=[], help="INVITE header NAME:VALUE (repeatable)"
    )
    load.add_argument("--bind-host", default=None, help="address the peers bind to (with --target)")
    load.add_argument(
        "--vad", default=None, help="local stack: the gateway's RUTSTER_VAD (cascade, webrtc...)"
    )
    load.add_argument(
        "--log-level",
        default="warning",
        help="this process and the workers; info or debug also shows the gateway's output",
    )
    load.set_defaults(func=cmd_sip_load)
