"""``rutster call --provider NAME`` plays each provider's wire into a running gateway, and
says in one line why when the call could not be placed."""

from __future__ import annotations

import asyncio
import contextlib
import io
from dataclasses import replace
from pathlib import Path

import pytest

from rutster.brains.echo import EchoBrain
from rutster.tools.cli import _run_call, call_failure, main
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.twilio_simulator import MAX_ANSWER_SHOWN, CallRefused
from tests.conftest import SPEECH_WAV, gateway_config, serve_gateway


@pytest.mark.parametrize("provider", ["telnyx", "plivo", "vonage"])
async def test_rutster_call_plays_each_provider_into_a_dev_mode_gateway(
    echo_brain: EchoBrain, provider: str, tmp_path: Path
) -> None:
    # No Twilio token and no provider key: dev mode, where `rutster call --provider` works.
    config = replace(gateway_config(echo_brain.url), twilio_auth_token=None)
    async with serve_gateway(config) as gateway:
        report = await _run_call(
            gateway.url, SPEECH_WAV, tmp_path / "reply.wav", 1.0, 3.0, None, provider=provider
        )
    assert int(str(report["media_received"])) >= 100  # 3 s of speech, echoed
    assert float(str(report["correlation"])) > 0.9
    assert (tmp_path / "reply.wav").exists()


@pytest.mark.parametrize("provider", ["twilio", "telnyx", "plivo", "vonage"])
async def test_a_refused_call_says_so_for_each_provider(
    echo_brain: EchoBrain, provider: str, tmp_path: Path
) -> None:
    config = replace(gateway_config(echo_brain.url), twilio_auth_token=None)
    async with serve_gateway(config) as gateway:
        gateway.state.draining = True  # every admission refused
        with pytest.raises(CallRefused) as refused:
            await _run_call(
                gateway.url, SPEECH_WAV, tmp_path / "reply.wav", 1.0, 1.0, None, provider=provider
            )
    message = call_failure(refused.value, gateway.url)
    assert message is not None and message.startswith("the gateway refused the call")
    assert "caller_rate" in message  # the commonest reason, with its setting
    # The provider's own refusal document, shown (cut to MAX_ANSWER_SHOWN) in the message.
    answer = refused.value.answer
    assert answer.strip() and repr(answer[:MAX_ANSWER_SHOWN]) in str(refused.value)
    assert echo_brain.connections == 0


async def test_rutster_call_prints_one_line_when_no_gateway_answers(tmp_path: Path) -> None:
    nobody = f"http://{LOOPBACK}:{free_port()}"
    argv = ["call", "--wav", str(SPEECH_WAV), "--gateway", nobody, "--seconds", "1"]
    argv += ["--out", str(tmp_path / "reply.wav")]
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = await asyncio.to_thread(main, argv)
    assert code == 1
    assert errors.getvalue().startswith(f"rutster call: no gateway answered at {nobody}")
    assert "Traceback" not in errors.getvalue()
