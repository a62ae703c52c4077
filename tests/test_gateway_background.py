"""Work the gateway starts without waiting for it (GatewayState.run_in_background)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rutster.gateway.config import GatewayConfig
from rutster.gateway.state import GatewayState


async def test_background_work_is_kept_until_done_and_its_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = GatewayState(config=GatewayConfig())
    release = asyncio.Event()
    finished: list[str] = []

    async def hang_up() -> None:
        await release.wait()
        finished.append("hung up")

    async def broken() -> None:
        raise RuntimeError("provider said no")

    with caplog.at_level(logging.ERROR, logger="rutster.gateway.state"):
        state.run_in_background(hang_up(), name="call_1:api-hangup")
        state.run_in_background(broken(), name="call_2:api-hangup")
        for _ in range(3):  # the task's step, then its done callback
            await asyncio.sleep(0)
        assert len(state.background) == 1  # the failed one is gone, the waiting one held
        release.set()
        for _ in range(3):
            await asyncio.sleep(0)
    assert finished == ["hung up"]
    assert state.background == set()
    failures = [r for r in caplog.records if r.name == "rutster.gateway.state"]
    assert [r.getMessage() for r in failures] == ["call_2:api-hangup failed: provider said no"]
