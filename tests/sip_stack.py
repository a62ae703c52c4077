"""A whole SIP path on loopback for tests: gateway (in-process) + SIP worker process(es).

The caller or callee is a real pjsua2 phone (``tools.sip_peer.SipPeerProcess``)
in its own process; the worker is the real ``rutster sip-worker`` in another.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from rutster.tools.launcher import LOOPBACK, Service, free_port, sip_worker_process
from rutster.tools.twilio_simulator import read_wav_8k
from tests.conftest import RunningGateway, eventually, gateway_config, serve_gateway

#: The suite's shared SIP secret (gateway and workers).
TEST_SIP_SECRET = "test-sip-secret-0123456789abcdef"


@dataclass
class SipStack:
    """A running gateway with SIP workers connected to it."""

    gateway: RunningGateway
    workers: list[Service]

    @property
    def worker_port(self) -> int:
        """The first worker's SIP port."""
        return self.workers[0].port

    def uri(self, user: str = "+15550001111", index: int = 0) -> str:
        """A request URI reaching worker ``index``."""
        return f"sip:{user}@{LOOPBACK}:{self.workers[index].port}"


def worker_env(gateway_url: str, **extra: str) -> dict[str, str]:
    """The environment of a test SIP worker (loopback trunk allowlisted)."""
    ws_url = gateway_url.replace("http://", "ws://")
    return {
        "RUTSTER_GATEWAY_URL": ws_url,
        "RUTSTER_SIP_SECRET": TEST_SIP_SECRET,
        "RUTSTER_SIP_ALLOW_CIDRS": "127.0.0.1/32",
        **extra,
    }


@contextlib.contextmanager
def _workers(gateway_url: str, count: int, env: Mapping[str, str]) -> Iterator[list[Service]]:
    with contextlib.ExitStack() as stack:
        services = [
            stack.enter_context(
                sip_worker_process(
                    {**worker_env(gateway_url), "RUTSTER_SIP_WORKER_ID": f"w{i}", **env},
                    free_port(),
                    # RUTSTER_TEST_SIP_LOGS=1 shows the workers' logs when debugging.
                    quiet=not os.environ.get("RUTSTER_TEST_SIP_LOGS"),
                )
            )
            for i in range(count)
        ]
        yield services


@asynccontextmanager
async def sip_stack(
    tap_url: str,
    *,
    workers: int = 1,
    worker_extra_env: Mapping[str, str] | None = None,
    **config: Any,
) -> AsyncIterator[SipStack]:
    """Gateway dialling ``tap_url`` (barge-in off: the test brains echo) + SIP workers."""
    cfg = gateway_config(tap_url, barge_in=False, sip_secret=TEST_SIP_SECRET, **config)
    async with serve_gateway(cfg) as gw:
        started = await asyncio.to_thread(
            _start_workers, gw.url, workers, dict(worker_extra_env or {})
        )
        stack, services = started
        try:
            await eventually(lambda: len(gw.state.sip_workers) == workers, 15)
            yield SipStack(gw, services)
        finally:
            await asyncio.to_thread(stack.close)


def _start_workers(
    url: str, count: int, env: dict[str, str]
) -> tuple[contextlib.ExitStack, list[Service]]:
    stack = contextlib.ExitStack()
    services = stack.enter_context(_workers(url, count, env))
    return stack, services


def speech_16k(path: str, seconds: float) -> bytes:
    """The first ``seconds`` of an 8 kHz WAV as PCM16 16 kHz (what the peer sends)."""
    pcm8 = read_wav_8k(path)[: int(seconds * 8000) * 2]
    samples = np.frombuffer(pcm8, dtype=np.int16).astype(np.float32)
    up = soxr.resample(samples, 8000, 16000, quality="HQ")
    pcm: bytes = np.clip(up, -32768, 32767).astype(np.int16).tobytes()
    return pcm
