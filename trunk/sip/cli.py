"""The ``rutster sip-worker`` and ``rutster sip-pool`` commands.

The ``rutster`` command (``rutster.tools.cli``) adds them to its parser; a pooled worker
runs as ``python -m rutster.trunk.sip.cli sip-worker``, so the pool needs nothing above
the trunk layer. ``rutster sip-load`` is a shipped tool (``rutster.tools.cli``).
"""

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
        "rutster.trunk.sip.cli",
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


def main(argv: list[str] | None = None) -> int:
    """``python -m rutster.trunk.sip.cli``: the SIP commands alone (how a pool starts workers)."""
    parser = argparse.ArgumentParser(prog="rutster", description=__doc__)
    add_sip_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
