"""Shared fixtures: the speech fixture, an in-process echo brain and gateway under real uvicorn."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from rutster.brains.echo import EchoBrain
from rutster.gateway.app import create_app
from rutster.gateway.config import GatewayConfig
from rutster.gateway.provider_registry import ProviderRegistry
from rutster.gateway.reflex import ReflexConfig
from rutster.gateway.server import uvicorn_config
from rutster.gateway.spend_settings import SpendSettings
from rutster.gateway.state import GatewayState
from rutster.gateway.tap_allowlist import TapUrlAllowlist
from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.gate import GatePolicy
from rutster.spend.limits import TenantLimits
from rutster.spend.meter import QuantumPolicy
from rutster.spend.prices import PriceTable, TelephonyRate
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.twilio_simulator import read_wav_8k

FIXTURES = Path(__file__).parent / "fixtures"
SPEECH_WAV = FIXTURES / "audio" / "caller_speech_8k.wav"
#: Auth token used by in-process gateways (the simulator signs with it).
TEST_AUTH_TOKEN = "test-auth-token-0123456789"
#: The admin API key of in-process gateways.
TEST_ADMIN_KEY = "test-admin-key-0123456789abcdef"


@pytest.fixture(scope="session")
def speech_pcm() -> bytes:
    """The 30 s recorded-speech fixture, PCM16 8 kHz mono."""
    return read_wav_8k(SPEECH_WAV)


_suite_redis: EmbeddedRedis | None = None


def suite_redis_url() -> str:
    """The run's shared Redis: ``REDIS_URL`` when set, else one embedded server
    started on first use and stopped at exit (tests isolate by key prefix)."""
    global _suite_redis
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        return url
    if _suite_redis is None:
        server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="rutster-suite-redis-")))
        server.start()
        atexit.register(server.stop)
        _suite_redis = server
    return _suite_redis.url


def unique_prefix() -> str:
    """A Redis key prefix no other test uses."""
    return "t" + secrets.token_hex(6)


def spend_settings(**overrides: Any) -> SpendSettings:
    """Spend settings on the suite's Redis under a prefix of the test's own."""
    values: dict[str, Any] = {
        "redis_url": suite_redis_url(),
        "redis_prefix": unique_prefix(),
        "data_dir": Path(tempfile.mkdtemp(prefix="rutster-data-")),
        "admin_key": TEST_ADMIN_KEY,
    }
    values.update(overrides)
    return SpendSettings(**values)


#: Telephony rate of :func:`fast_spend_settings`: 0.60 USD a minute billed per second
#: (10_000 micros a second), so a test sees money move in seconds, not minutes.
FAST_MICROS_PER_MINUTE = 600_000


def fast_prices() -> PriceTable:
    """Built-in prices with Twilio billed per second at :data:`FAST_MICROS_PER_MINUTE`."""
    default = PriceTable.default()
    rate = TelephonyRate(FAST_MICROS_PER_MINUTE, 1)
    telephony = dict(default.telephony)
    telephony[("twilio", "inbound")] = rate
    telephony[("twilio", "outbound")] = rate
    return PriceTable(telephony=telephony, brains=dict(default.brains))


def fast_spend_settings(**overrides: Any) -> SpendSettings:
    """:func:`spend_settings` with per-second prices, 10 s quanta and a 200 ms meter tick."""
    policy = GatePolicy(
        default_limits=TenantLimits(max_concurrent=50),
        quantum=QuantumPolicy(telephony_s=10, brain_micros_per_minute=0, hangup_guard_ms=500),
        tick_ms=200,
        heartbeat_ms=500,
    )
    values: dict[str, Any] = {"prices": fast_prices(), "policy": policy}
    values.update(overrides)
    return spend_settings(**values)


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    """The run's shared Redis (see :func:`suite_redis_url`)."""
    return suite_redis_url()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own, so tests sharing one Redis never see each other."""
    return unique_prefix()


@pytest.fixture
async def echo_brain() -> AsyncIterator[EchoBrain]:
    """An echo brain on a free loopback port, in this process."""
    async with EchoBrain() as brain:
        yield brain


class RunningGateway:
    """A gateway app served by real uvicorn on a loopback port, in this process."""

    def __init__(self, state: GatewayState, url: str) -> None:
        self.state = state
        self.url = url

    @property
    def config(self) -> GatewayConfig:
        return self.state.config

    def metric(self, name: str, **labels: str) -> float:
        value = self.state.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


@contextlib.asynccontextmanager
async def serve_gateway(
    config: GatewayConfig, *, providers: ProviderRegistry | None = None
) -> AsyncIterator[RunningGateway]:
    """Run ``config``'s app (serving ``providers``, default all) under uvicorn until the
    block exits."""
    port = free_port()
    config = replace(config, public_url=f"http://{LOOPBACK}:{port}")
    app = create_app(config, providers=providers)
    server = uvicorn.Server(uvicorn_config(app, host=LOOPBACK, port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield RunningGateway(app.state.gateway, config.public_url)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def gateway_config(tap_url: str, *, barge_in: bool = True, **overrides: Any) -> GatewayConfig:
    """A secure-mode config dialling ``tap_url`` (public URL is set by ``serve_gateway``).

    ``barge_in=False`` turns barge-in off for every call (``RUTSTER_BARGE_IN=off``);
    the echo brain does not need it, since its hello says it must not be interrupted.
    """
    allow = overrides.pop("allow", "")
    if not barge_in:
        overrides["reflex"] = ReflexConfig(barge_in=False)
    overrides.setdefault("spend", spend_settings())
    return GatewayConfig(
        tap_url=tap_url,
        tap_allowlist=TapUrlAllowlist.parse(allow, default=tap_url),
        twilio_auth_token=TEST_AUTH_TOKEN,
        stream_secret=b"s" * 32,
        stream_secret_generated=False,
        **overrides,
    )


@pytest.fixture
async def gateway(echo_brain: EchoBrain) -> AsyncIterator[RunningGateway]:
    """A secure-mode gateway whose default brain is the in-process echo brain."""
    async with serve_gateway(gateway_config(echo_brain.url)) as running:
        yield running


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``check()`` is true (polling), or fail."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def tenant_key(client: httpx.AsyncClient, tenant: str, label: str = "test") -> str:
    """A fresh API key for ``tenant``, issued with the admin key through ``POST /v1/admin/keys``."""
    response = await client.post(
        "/v1/admin/keys",
        json={"tenant": tenant, "label": label},
        headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"},
    )
    assert response.status_code == 201, response.text
    key: str = response.json()["key"]
    return key


#: Most of a rerun test's failure message shown in the summary (a window list is ~600).
RERUN_MESSAGE_CHARS = 1500


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why each rerun test failed its first run (pytest-rerunfailures names it only),
    so a CI log that passed on a rerun still shows what the first run heard."""
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section("why tests were rerun (their first run's failure)")
    for report in reruns:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        terminalreporter.write_line(f"{report.nodeid}: {message[:RERUN_MESSAGE_CHARS]}")
