"""``rutster call --provider NAME`` plays each provider's wire into a running gateway."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rutster.brains.echo import EchoBrain
from rutster.tools.cli import _run_call
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
