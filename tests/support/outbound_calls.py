"""Placing a call through ``POST /v1/calls`` and playing its callee (tests)."""

from __future__ import annotations

import asyncio

import httpx

from rutster.tools.twilio_simulator import (
    DIRECTION_OUTBOUND_API,
    SimulatedCallResult,
    TwilioSimulator,
)
from tests.conftest import RunningGateway, tenant_key

#: How long the callee talks (s of the speech fixture): long enough to hear the echo.
CALLEE_SPEECH_S = 3


async def place_through_api(gateway: RunningGateway, provider: str, *, to: str, from_: str) -> str:
    """``POST /v1/calls`` with a fresh key of the default tenant; the call's id (201)."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        key = await tenant_key(http, "default")
        created = await http.post(
            "/v1/calls",
            json={"to": to, "from": from_, "provider": provider},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert created.status_code == 201, created.text
    call_id: str = created.json()["id"]
    return call_id


async def play_callee(
    sim: TwilioSimulator, speech_pcm: bytes, call_sid: str, answer_url: str, ended: asyncio.Event
) -> SimulatedCallResult:
    """Answer a placed call as its callee: the provider fetches ``answer_url`` and the
    callee talks over the stream until the call ends (``ended``, or its speech runs out)."""
    return await sim.place_call(
        speech_pcm[: CALLEE_SPEECH_S * 8000 * 2],
        call_sid=call_sid,
        webhook_url=answer_url,
        direction=DIRECTION_OUTBOUND_API,
        provider_hangup=ended,
        tail_s=0.8,
    )
