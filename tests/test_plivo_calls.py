"""Plivo calls end to end: the V3-signed answer webhook, the stream, echo, DTMF,
barge-in, the REST hang-up (checked against plivo-python's) and /media detection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import plivo
import pytest

from rutster.brains.echo import EchoBrain
from rutster.gateway.provider_registry import AUTODETECT_MEDIA_PATH
from rutster.gateway.providers.plivo import ENV_API_BASE_URL, ENV_AUTH_ID, ENV_AUTH_TOKEN
from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.protocols.tap import Dtmf, FunctionCallOutput
from rutster.tools.plivo_simulator import PlivoSimulator, new_call_uuid
from rutster.tools.twilio_simulator import SimulatedCallResult
from rutster.trunk.plivo.call_control import PlivoCallControl, PlivoCallControlError
from rutster.trunk.plivo.signature import NONCE_HEADER, SIGNATURE_HEADER, PlivoSignatureV3
from tests.conftest import (
    TEST_ADMIN_KEY,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
)
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.call_records import settled_record
from tests.support.fake_plivo_rest import (
    FAKE_AUTH_ID,
    FAKE_AUTH_TOKEN,
    FakePlivoRest,
    serve_fake_plivo,
)
from tests.support.outbound_calls import place_through_api, play_callee
from tests.support.recording_brain import RecordingBrain, TransferBrain

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}


@pytest.fixture
async def fake() -> AsyncIterator[FakePlivoRest]:
    async with serve_fake_plivo() as running:
        yield running


def plivo_env(fake: FakePlivoRest | None = None) -> dict[str, str]:
    env = {ENV_AUTH_TOKEN: FAKE_AUTH_TOKEN}
    if fake is not None:
        env |= {ENV_AUTH_ID: FAKE_AUTH_ID, ENV_API_BASE_URL: fake.base_url}
    return env


@pytest.fixture
async def plivo_gateway(echo_brain: EchoBrain) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(gateway_config(echo_brain.url, env=plivo_env())) as running:
        yield running


def simulator(gateway: RunningGateway) -> PlivoSimulator:
    return PlivoSimulator(gateway.url, auth_token=FAKE_AUTH_TOKEN)


@realtime_echo
async def test_a_signed_plivo_call_echoes_and_is_billed_as_plivo(
    plivo_gateway: RunningGateway, speech_pcm: bytes
) -> None:
    gateway = plivo_gateway
    pcm = speech_pcm[: 4 * 8000 * 2]
    call_uuid = new_call_uuid()
    placed = asyncio.create_task(simulator(gateway).place_call(pcm, call_sid=call_uuid, tail_s=0.8))
    await eventually(lambda: len(gateway.state.calls) == 1 or placed.done())
    call = next(iter(gateway.state.calls.values()))
    result = await placed
    assert_echo_intact(pcm, result)
    assert result.marks_received > 0 and result.marks_echoed > 0  # checkpoint / playedStream
    assert (call.context.provider, call.context.call_id) == ("plivo", call_uuid)
    await eventually(lambda: not gateway.state.calls)
    record = await settled_record(gateway, call)
    assert record is not None and record["status"] == "ended"
    assert (record["provider"], record["provider_call_id"]) == ("plivo", call_uuid)
    assert record["spent"] is not None and record["spent"] > 0


async def test_unsigned_or_tampered_answers_are_refused(plivo_gateway: RunningGateway) -> None:
    for sim in (
        PlivoSimulator(plivo_gateway.url),
        PlivoSimulator(plivo_gateway.url, auth_token="x"),
    ):
        response = await sim.post_voice_webhook(new_call_uuid(), from_="+1555", to="+1666")
        assert response.status_code == 403
    assert plivo_gateway.metric("rutster_signature_failures_total", endpoint="plivo_webhook") == 2


async def test_a_secured_gateway_without_the_plivo_token_refuses_plivo(
    gateway: RunningGateway,
) -> None:
    response = await simulator(gateway).post_voice_webhook(new_call_uuid(), from_="+1", to="+2")
    assert response.status_code == 403 and ENV_AUTH_TOKEN in response.text


async def test_plivo_dtmf_reaches_the_brain(speech_pcm: bytes) -> None:
    async with RecordingBrain() as brain:
        config = gateway_config(brain.url, env=plivo_env())
        async with serve_gateway(config) as gateway:
            await simulator(gateway).place_call(
                speech_pcm[: 2 * 8000 * 2], call_sid=new_call_uuid(), dtmf=[(0.5, "2")], tail_s=0.5
            )
            await eventually(lambda: bool(brain.of_type(Dtmf)))
    assert [e.digit for e in brain.of_type(Dtmf) if isinstance(e, Dtmf)] == ["2"]


async def test_a_plivo_stream_runs_on_the_one_media_url(
    plivo_gateway: RunningGateway, speech_pcm: bytes
) -> None:
    # The operator's application streams to /media instead, the query kept.
    result = await simulator(plivo_gateway).place_call(
        speech_pcm[: 2 * 8000 * 2],
        call_sid=new_call_uuid(),
        media_path=AUTODETECT_MEDIA_PATH,
        tail_s=0.8,
    )
    assert result.media_received >= 50


async def test_an_api_hang_up_goes_through_plivo_rest(
    echo_brain: EchoBrain, fake: FakePlivoRest, speech_pcm: bytes
) -> None:
    async with serve_gateway(gateway_config(echo_brain.url, env=plivo_env(fake))) as gateway:
        call_uuid = new_call_uuid()
        hung_up = fake.register_call(call_uuid)
        placed = asyncio.create_task(
            simulator(gateway).place_call(
                speech_pcm, call_sid=call_uuid, provider_hangup=hung_up, tail_s=5.0
            )
        )
        await eventually(lambda: len(gateway.state.calls_by_id) == 1)
        call_id = next(iter(gateway.state.calls_by_id))
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            deleted = await http.delete(f"/v1/calls/{call_id}", headers=ADMIN)
        assert deleted.status_code == 202, deleted.text
        result = await asyncio.wait_for(placed, 10)
    assert result.hung_up_by_provider
    assert [(r.method, r.path) for r in fake.requests] == [
        ("DELETE", f"/v1/Account/{FAKE_AUTH_ID}/Call/{call_uuid}/")
    ]


async def test_the_hang_up_is_what_plivo_python_sends(
    fake: FakePlivoRest, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = new_call_uuid(), new_call_uuid()
    fake.register_call(ours)
    fake.register_call(theirs)
    control = PlivoCallControl(FAKE_AUTH_ID, FAKE_AUTH_TOKEN, base_url=fake.base_url)
    await control.hang_up(ours)
    with pytest.raises(PlivoCallControlError) as err:
        await control.hang_up(ours)
    assert err.value.reason == "already_ended"
    with pytest.raises(PlivoCallControlError) as err:
        await control.transfer(ours, "+15551234567")
    assert err.value.reason == "not_supported"
    await control.aclose()
    # plivo-python, pointed at the fake (its voice API base is a module constant).
    monkeypatch.setattr(plivo.rest.client, "API_VOICE_BASE_URI", f"{fake.base_url}/v1/Account")
    client = plivo.RestClient(FAKE_AUTH_ID, FAKE_AUTH_TOKEN)
    await asyncio.to_thread(client.calls.delete, theirs)
    mine, sdks = fake.requests[0], fake.requests[-1]
    assert (mine.method, mine.path.replace(ours, "ID"), mine.authorization) == (
        sdks.method,
        sdks.path.replace(theirs, "ID"),
        sdks.authorization,
    )


# ---- transfer and outbound through Plivo's REST API ---------------------------------


async def test_the_brains_transfer_sends_the_caller_to_an_allowlisted_dial(
    fake: FakePlivoRest, speech_pcm: bytes
) -> None:
    async with TransferBrain() as brain:
        brain.destination = "+15551234567"
        config = gateway_config(
            brain.url,
            env=plivo_env(fake),
            transfer_allowlist=TransferAllowlist.parse("+15551234567"),
        )
        async with serve_gateway(config) as gateway:
            call_uuid = new_call_uuid()
            moved = fake.register_call(call_uuid)
            result = await simulator(gateway).place_call(
                speech_pcm, call_sid=call_uuid, dtmf=[(1.0, "0")], provider_hangup=moved, tail_s=3.0
            )
            await eventually(lambda: not gateway.state.calls, 10)
    assert result.hung_up_by_provider  # Plivo took the caller's leg to the new XML
    xml = fake.transfer_xml[call_uuid]
    assert "<Dial><Number>15551234567</Number></Dial>" in xml, xml
    outputs = [e for e in brain.events if isinstance(e, FunctionCallOutput)]
    assert outputs and outputs[0].status == "ok"


async def test_the_transfer_xml_dials_only_allowlisted_destinations(
    plivo_gateway: RunningGateway,
) -> None:
    # The suite's gateway has an empty transfer allowlist; a signed fetch is still refused.
    url = f"{plivo_gateway.url}/plivo/transfer?to=%2B15551234567"
    fields = {"CallUUID": new_call_uuid()}
    signature = PlivoSignatureV3(FAKE_AUTH_TOKEN).compute("POST", url, fields, "n1")
    async with httpx.AsyncClient() as http:
        refused = await http.post(
            url, data=fields, headers={NONCE_HEADER: "n1", SIGNATURE_HEADER: signature}
        )
        unsigned = await http.post(url, data=fields)
    assert refused.status_code == 403 and "allowlist" in refused.text
    assert unsigned.status_code == 403


async def test_an_outbound_plivo_call_is_placed_answered_and_echoed(
    echo_brain: EchoBrain, fake: FakePlivoRest, speech_pcm: bytes
) -> None:
    async with serve_gateway(gateway_config(echo_brain.url, env=plivo_env(fake))) as gateway:
        sim = simulator(gateway)
        heard: list[SimulatedCallResult] = []

        async def callee(call_uuid: str, request_uuid: str, url: str, ended: asyncio.Event) -> None:
            sim.request_uuids[call_uuid] = request_uuid
            heard.append(await play_callee(sim, speech_pcm, call_uuid, url, ended))

        fake.on_answer = callee
        await place_through_api(gateway, "plivo", to="+15559870000", from_="+15551230000")
        await eventually(lambda: bool(heard), 15)
        await eventually(lambda: not gateway.state.calls)
    assert heard[0].media_received >= 100  # the callee heard its own voice back
    assert fake.requests[0].body == {
        "from": "+15551230000",
        "to": "+15559870000",
        "answer_url": fake.requests[0].body["answer_url"],
        "answer_method": "POST",
    }
    assert "/plivo/answer?rutster_call=call_" in fake.requests[0].body["answer_url"]


async def test_create_and_transfer_are_what_plivo_python_sends(
    fake: FakePlivoRest, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = new_call_uuid(), new_call_uuid()
    fake.register_call(ours)
    fake.register_call(theirs)
    control = PlivoCallControl(
        FAKE_AUTH_ID,
        FAKE_AUTH_TOKEN,
        base_url=fake.base_url,
        transfer_url=lambda to: f"https://gw.example.com/plivo/transfer?to={to}",
    )
    answer = "https://gw.example.com/plivo/answer?rutster_call=call_1"
    await control.create_call(to="+15559870000", from_="+15551230000", answer_url=answer)
    monkeypatch.setattr(plivo.rest.client, "API_VOICE_BASE_URI", f"{fake.base_url}/v1/Account")
    client = plivo.RestClient(FAKE_AUTH_ID, FAKE_AUTH_TOKEN)
    await asyncio.to_thread(
        client.calls.create, "+15551230000", "+15559870000", answer, answer_method="POST"
    )
    mine, sdks = fake.requests[0], fake.requests[1]
    assert (mine.method, mine.path) == (sdks.method, sdks.path)
    # What we send is what the SDK sends; the SDK adds its defaults for the rest.
    assert {k: sdks.body[k] for k in mine.body} == mine.body
    fake.transfer_xml.clear()
    fake.requests.clear()
    with contextlib.suppress(PlivoCallControlError):  # the fake's fetch of gw.example fails
        await control.transfer(ours, "+15551234567")
    transfer_url = "https://gw.example.com/plivo/transfer?to=+15551234567"
    with contextlib.suppress(Exception):
        await asyncio.to_thread(
            client.calls.transfer, theirs, legs="aleg", aleg_url=transfer_url, aleg_method="POST"
        )
    await control.aclose()
    mine, sdks = fake.requests[0], fake.requests[1]
    assert mine.method == sdks.method == "POST"
    assert mine.path.replace(ours, "ID") == sdks.path.replace(theirs, "ID")
    # The SDK also repeats the call's uuid in the body; what we send, it sends alike.
    assert {k: sdks.body[k] for k in mine.body} == mine.body
