"""Telnyx calls end to end: TeXML webhook, signed; the media socket; echo; billing.

The gateway runs under uvicorn with the echo brain; ``tools/telnyx_simulator.py``
plays Telnyx, signing its webhooks with an account key whose public half is the
gateway's ``TELNYX_PUBLIC_KEY``, and delivering media out of order as Telnyx may.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from websockets.asyncio.client import connect

from rutster.base.env_values import ConfigError
from rutster.base.ws_close import CLOSE_POLICY_VIOLATION
from rutster.brains.echo import EchoBrain
from rutster.gateway.config import GatewayConfig
from rutster.gateway.media_socket import REASON_INVALID_TOKEN
from rutster.gateway.provider_registry import AUTODETECT_MEDIA_PATH
from rutster.gateway.providers.telnyx import ENV_PUBLIC_KEY, TelnyxProvider, TelnyxSettings
from rutster.gateway.state import GatewayState
from rutster.protocols.tap import Dtmf
from rutster.tools.telnyx_simulator import TelnyxSimulator, new_call_control_id
from rutster.tools.twilio_simulator import new_sid
from tests.conftest import RunningGateway, eventually, gateway_config, serve_gateway
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.call_records import settled_record
from tests.support.recording_brain import RecordingBrain
from tests.test_stream_token_replay import close_of

SIGNER = TelnyxSimulator.new_signer()


@pytest.fixture
async def telnyx_gateway(echo_brain: EchoBrain) -> AsyncIterator[RunningGateway]:
    """A gateway that checks Telnyx signatures against :data:`SIGNER`'s public key."""
    config = gateway_config(echo_brain.url, env={ENV_PUBLIC_KEY: SIGNER.public_key_b64})
    async with serve_gateway(config) as running:
        yield running


def simulator(gateway: RunningGateway, *, reorder_every: int | None = None) -> TelnyxSimulator:
    return TelnyxSimulator(gateway.url, signer=SIGNER, reorder_every=reorder_every)


@realtime_echo
async def test_a_signed_telnyx_call_echoes_in_order_and_is_billed_as_telnyx(
    telnyx_gateway: RunningGateway, speech_pcm: bytes
) -> None:
    gateway = telnyx_gateway
    sim = simulator(gateway, reorder_every=7)
    pcm = speech_pcm[: 4 * 8000 * 2]
    call_control_id = new_call_control_id()
    placed = asyncio.create_task(sim.place_call(pcm, call_sid=call_control_id, tail_s=0.8))
    await eventually(lambda: len(gateway.state.calls) == 1 or placed.done())
    call = next(iter(gateway.state.calls.values()))
    result = await placed
    # Telnyx's out-of-order media was put back in order: the echo is the speech, whole.
    assert sim.frames_swapped >= 20
    assert_echo_intact(pcm, result)
    assert result.marks_received > 0 and result.marks_echoed > 0
    assert call.context.provider == "telnyx"
    assert call.context.call_id == call_control_id
    record = await settled_record(gateway, call)
    assert record["provider"] == "telnyx"
    assert record["provider_call_id"] == call_control_id
    assert record["spent"] is not None and record["spent"] > 0
    assert gateway.metric("rutster_admissions_total", outcome="admitted", reason="ok") == 1


async def test_unsigned_tampered_or_foreign_webhooks_are_refused(
    telnyx_gateway: RunningGateway,
) -> None:
    gateway = telnyx_gateway
    unsigned = TelnyxSimulator(gateway.url)
    foreign = TelnyxSimulator(gateway.url, signer=TelnyxSimulator.new_signer())
    for sim in (unsigned, foreign):
        response = await sim.post_voice_webhook(
            new_call_control_id(), from_="+15550001111", to="+15550002222"
        )
        assert response.status_code == 403
    body = b"CallControlId=v3%3Aabc&From=%2B1555&To=%2B1666"
    headers = {"content-type": "application/x-www-form-urlencoded"} | SIGNER.headers(
        body,
        now_s=0.0,  # signed in 1970: long expired
    )
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        expired = await http.post("/telnyx/voice", content=body, headers=headers)
        tampered = await http.post(
            "/telnyx/voice",
            content=body + b"&Direction=outbound-api",
            headers=headers | SIGNER.headers(body, now_s=time.time()),
        )
    assert expired.status_code == 403 and tampered.status_code == 403
    assert gateway.metric("rutster_signature_failures_total", endpoint="telnyx_voice") == 4
    assert not gateway.state.calls


async def test_a_webhook_without_a_call_control_id_is_refused(
    telnyx_gateway: RunningGateway,
) -> None:
    sim = simulator(telnyx_gateway)
    response = await sim.post_voice_webhook("", from_="+15550001111", to="+15550002222")
    assert response.status_code == 400 and "CallControlId" in response.text


async def test_a_stream_for_another_call_is_refused(telnyx_gateway: RunningGateway) -> None:
    # The token binds the webhook's CallControlId: a start naming another call fails it.
    sim = simulator(telnyx_gateway)
    told = await sim.open_stream(new_call_control_id(), from_="+15550001111", to="+15550002222")
    async with connect(told.url) as ws:
        await ws.send(sim._connected_message())
        await ws.send(sim._start_message(new_sid("ST"), new_call_control_id(), told))
        assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, REASON_INVALID_TOKEN)
    assert not telnyx_gateway.state.calls


async def test_a_telnyx_stream_runs_on_the_one_media_url(
    telnyx_gateway: RunningGateway, speech_pcm: bytes
) -> None:
    gateway = telnyx_gateway
    # The operator points the stream at the one URL; the parameters ride along.
    placed = asyncio.create_task(
        simulator(gateway).place_call(
            speech_pcm[: 2 * 8000 * 2],
            call_sid=new_call_control_id(),
            media_path=AUTODETECT_MEDIA_PATH,
            tail_s=0.8,
        )
    )
    await eventually(lambda: len(gateway.state.calls) == 1 or placed.done())
    call = next(iter(gateway.state.calls.values()))
    result = await placed
    assert call.context.provider == "telnyx"
    assert result.media_received >= 50, "the echo did not come back on /media"
    await eventually(lambda: not gateway.state.calls)


def test_a_public_key_that_is_no_ed25519_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=ENV_PUBLIC_KEY):
        TelnyxSettings.from_env({ENV_PUBLIC_KEY: "bm90IGEga2V5"})
    assert TelnyxSettings.from_env({}).verifier is None


async def test_a_secured_gateway_without_the_telnyx_key_refuses_telnyx_webhooks(
    gateway: RunningGateway,
) -> None:
    # The suite's gateway checks Twilio signatures but has no TELNYX_PUBLIC_KEY.
    response = await TelnyxSimulator(gateway.url).post_voice_webhook(
        new_call_control_id(), from_="+15550001111", to="+15550002222"
    )
    assert response.status_code == 403 and ENV_PUBLIC_KEY in response.text
    assert not gateway.state.calls


async def test_telnyx_dtmf_reaches_the_brain(speech_pcm: bytes) -> None:
    async with RecordingBrain() as brain:
        config = gateway_config(brain.url, env={ENV_PUBLIC_KEY: SIGNER.public_key_b64})
        async with serve_gateway(config) as gateway:
            await simulator(gateway).place_call(
                speech_pcm[: 2 * 8000 * 2],
                call_sid=new_call_control_id(),
                dtmf=[(0.5, "4"), (1.0, "#")],
                tail_s=0.5,
            )
            await eventually(lambda: len(brain.of_type(Dtmf)) == 2)
    assert [e.digit for e in brain.of_type(Dtmf) if isinstance(e, Dtmf)] == ["4", "#"]


async def test_a_dev_gateway_without_the_telnyx_key_says_so_at_startup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dev = GatewayState(config=GatewayConfig())
    with caplog.at_level(logging.WARNING, logger="rutster.gateway.providers.telnyx"):
        await TelnyxProvider().startup(dev)
    assert any(
        "UNSIGNED" in r.getMessage() and ENV_PUBLIC_KEY in r.getMessage() for r in caplog.records
    )
    caplog.clear()
    keyed = GatewayState(config=GatewayConfig(env={ENV_PUBLIC_KEY: SIGNER.public_key_b64}))
    with caplog.at_level(logging.WARNING, logger="rutster.gateway.providers.telnyx"):
        await TelnyxProvider().startup(keyed)
    assert not caplog.records
