"""The realtime brain against the MOCK Realtime server: conformance, failures, config, secrets."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from rutster.base.env_values import ConfigError
from rutster.brains.realtime.bridge import AuthFailureLatch
from rutster.brains.realtime.config import DEFAULT_MODEL, MOCK_API_KEY, RealtimeBrainConfig
from rutster.brains.realtime.server import RealtimeBrain
from rutster.brains.realtime.translator import ERROR_AUTH_FAILED, ERROR_UPSTREAM_DISCONNECT
from rutster.protocols.tool_catalog import HANGUP_TOOL
from rutster.tools.conformance import RuleStatus, run_conformance
from rutster.tools.launcher import LOOPBACK, realtime_brain_process
from rutster.tools.realtime_mock_server import MockRealtimeServer
from rutster.tools.twilio_simulator import TwilioSimulator
from tests.conftest import TEST_AUTH_TOKEN, eventually, gateway_config, serve_gateway
from tests.test_realtime_e2e import SPEECH_FROM_S, pcm8k_slice, silence_8k

SECRET_KEY = "sk-test-DO-NOT-LOG-0123456789abcdef"


def brain_config(mock: MockRealtimeServer, api_key: str = MOCK_API_KEY) -> RealtimeBrainConfig:
    return RealtimeBrainConfig(
        api_key=api_key,
        tools=(HANGUP_TOOL,),
        port=0,
        websocket_base_url=mock.websocket_base_url,
        mock=True,
    )


async def test_realtime_mock_brain_passes_the_conformance_kit() -> None:
    async with MockRealtimeServer(reply_ms=2_000) as mock, RealtimeBrain(brain_config(mock)) as b:
        report = await run_conformance(b.url, require_tool=True)
        statuses = {r.name: r.status for r in report.rules}
        assert report.passed, [r for r in report.rules if r.status is RuleStatus.FAIL]
        # The realtime brain has items, a catalog and tools: nothing is skipped.
        assert all(s is RuleStatus.PASS for s in statuses.values()), statuses
        # The kit's barge-in reached OpenAI as cancel + truncate at what was heard.
        truncations = [t for s in mock.sessions for t in s.truncations]
        assert truncations and all(t["content_index"] == 0 for t in truncations)
        assert any(s.cancels for s in mock.sessions)
        outputs = [o for s in mock.sessions for o in s.function_call_outputs]
        assert outputs, "the kit's function_call_output never reached the model"


async def test_upstream_loss_reports_and_reconnects_while_the_call_stays_up(
    speech_pcm: bytes,
) -> None:
    turn = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 1.5) + silence_8k(3.5)
    caller = turn + turn
    async with MockRealtimeServer(reply_ms=2_000) as mock, RealtimeBrain(brain_config(mock)) as b:
        async with serve_gateway(gateway_config(b.url)) as gw:
            sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
            call_task = asyncio.create_task(sim.place_call(caller, tail_s=0.2))
            await eventually(lambda: any(s.responses_created for s in mock.sessions), 10)
            await mock.drop_connections()
            await eventually(lambda: mock.connections_total >= 2, 10)
            call = next(iter(gw.state.calls.values()))
            await eventually(lambda: bool(call.trail.of_type("brain_error")))
            assert call.trail.of_type("brain_error")[0].payload["code"] == (
                ERROR_UPSTREAM_DISCONNECT
            )
            assert not call.ended.is_set()
            result = await call_task
        # The new session was configured again and answered the second turn.
        second = mock.sessions[-1]
        assert second.session_config["audio"]["input"]["turn_detection"] is None
        await eventually(lambda: second.responses_created >= 1)
    assert result.close_code == 1000  # ended by the caller's stop, not by the gateway
    (trail,) = gw.state.recent_trails.values()
    assert trail.of_type("call_ended")[0].payload["reason"] == "caller_hangup"


@pytest.mark.parametrize("rejection", ["in_band", "handshake"])
async def test_auth_failure_is_reported_once_without_a_retry_storm(
    speech_pcm: bytes, rejection: str
) -> None:
    caller = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 1.5) + silence_8k(2.5)
    mock = MockRealtimeServer(reject_auth=True, auth_rejection=rejection)  # type: ignore[arg-type]
    async with mock, RealtimeBrain(brain_config(mock)) as brain:
        async with serve_gateway(gateway_config(brain.url)) as gw:
            sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
            first = await sim.place_call(caller, tail_s=0.2)
            second = await sim.place_call(caller, tail_s=0.2)
        assert brain.auth_latch.failures == 1
    # One login attempt for two calls: the latch answered the second call itself.
    assert mock.connections_total == 1
    trails = list(gw.state.recent_trails.values())
    assert len(trails) == 2
    for trail in trails:
        codes = [e.payload["code"] for e in trail.of_type("brain_error")]
        assert codes == [ERROR_AUTH_FAILED]
        assert trail.of_type("call_ended")[0].payload["reason"] == "caller_hangup"
    assert first.close_code == second.close_code == 1000


def test_auth_latch_holds_off_then_allows_one_try() -> None:
    latch = AuthFailureLatch(holdoff_s=60)
    assert not latch.blocked(0)
    latch.trip(100)
    assert latch.blocked(159.9)
    assert not latch.blocked(160.1)


async def test_the_key_never_reaches_a_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with MockRealtimeServer() as mock:
        config = brain_config(mock, api_key=SECRET_KEY)
        assert SECRET_KEY not in repr(config)
        async with RealtimeBrain(config) as brain:
            report = await run_conformance(brain.url)
            assert report.passed
    assert caplog.records, "nothing was logged at all: the check would be vacuous"
    assert SECRET_KEY not in caplog.text
    assert all(s.auth_header_present for s in mock.sessions)


def test_config_reads_the_key_file_first(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    config = RealtimeBrainConfig.from_env(
        {"OPENAI_API_KEY": "sk-from-env", "OPENAI_API_KEY_FILE": str(key_file)}
    )
    assert config.api_key == "sk-from-file"
    assert config.model == DEFAULT_MODEL
    assert [t.name for t in config.tools] == ["hangup"]
    assert (config.host, config.port) == ("127.0.0.1", 8082)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no OpenAI API key"),
        ({"OPENAI_API_KEY": "k", "OPENAI_REALTIME_VOICE": "robot"}, "not a known voice"),
        ({"OPENAI_API_KEY": "k", "RUTSTER_BRAIN_TOOLS": "hangup,fly"}, "unknown tool 'fly'"),
        ({"OPENAI_API_KEY": "k", "RUTSTER_BRAIN_INSTRUCTIONS_FILE": "/nonexistent"}, "cannot read"),
        ({"OPENAI_API_KEY_FILE": "/nonexistent"}, "cannot read"),
    ],
)
def test_config_errors_are_clear(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RealtimeBrainConfig.from_env(env)


def test_mock_mode_needs_no_key() -> None:
    config = RealtimeBrainConfig.from_env({}, mock=True)
    assert config.api_key == MOCK_API_KEY and config.mock


def test_instructions_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text("Be a pirate.\n")
    env = {"OPENAI_API_KEY": "k", "RUTSTER_BRAIN_INSTRUCTIONS_FILE": str(path)}
    assert RealtimeBrainConfig.from_env(env).instructions == "Be a pirate."


def test_process_without_a_key_exits_at_startup_with_a_clear_message() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "rutster.tools.cli", "brain", "realtime", "--bind", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no OpenAI API key" in proc.stderr and "--mock" in proc.stderr


def test_mock_mode_process_starts_its_own_mock_and_conforms() -> None:
    """``rutster brain realtime --mock`` alone: no key, no network, its own mock server."""
    with realtime_brain_process(mock_reply_ms=2_000) as brain:
        url = f"ws://{LOOPBACK}:{brain.port}/realtime"
        report = asyncio.run(run_conformance(url, require_tool=True))
    assert report.passed, [r for r in report.rules if r.status is RuleStatus.FAIL]
