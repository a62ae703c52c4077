"""Telnyx call control (trunk/telnyx/call_control.py) against a FAKE Call Control API,
checked against what the Telnyx SDK sends, and end to end through the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from telnyx import AsyncTelnyx

from rutster.brains.echo import EchoBrain
from rutster.gateway.providers.telnyx import (
    ENV_API_BASE_URL,
    ENV_API_KEY,
    ENV_CONNECTION_ID,
    ENV_PUBLIC_KEY,
)
from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.protocols.call_control import CHANNEL_COMPLETED, CHANNEL_TRANSFERRING
from rutster.protocols.tap import FunctionCallOutput, SessionEnd, SessionEndReason
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.telnyx_simulator import TelnyxSimulator, new_call_control_id
from rutster.tools.twilio_simulator import SimulatedCallResult
from rutster.trunk.telnyx.call_control import TelnyxCallControl, TelnyxCallControlError
from rutster.trunk.telnyx.signature import TelnyxWebhookSigner
from tests.conftest import TEST_ADMIN_KEY, eventually, gateway_config, serve_gateway, tenant_key
from tests.support.fake_telnyx_rest import FAKE_API_KEY, FakeTelnyxRest, serve_fake_telnyx
from tests.support.outbound_calls import place_through_api, play_callee
from tests.support.recording_brain import TransferBrain

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}


def telnyx_env(signer: TelnyxWebhookSigner, fake: FakeTelnyxRest) -> dict[str, str]:
    """A gateway checking ``signer``'s webhooks, with call control on ``fake``."""
    return {
        ENV_PUBLIC_KEY: signer.public_key_b64,
        ENV_API_KEY: FAKE_API_KEY,
        ENV_API_BASE_URL: fake.base_url,
    }


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelnyxRest]:
    async with serve_fake_telnyx() as running:
        yield running


@pytest.fixture
async def control(fake: FakeTelnyxRest) -> AsyncIterator[TelnyxCallControl]:
    client = TelnyxCallControl(FAKE_API_KEY, base_url=fake.base_url)
    yield client
    await client.aclose()


async def test_hang_up_then_again_is_already_ended(
    fake: FakeTelnyxRest, control: TelnyxCallControl
) -> None:
    call = new_call_control_id()
    ended = fake.register_call(call)
    assert await control.hang_up(call) == CHANNEL_COMPLETED
    assert ended.is_set()
    with pytest.raises(TelnyxCallControlError) as err:
        await control.hang_up(call)
    assert err.value.reason == "already_ended"
    request = fake.requests[0]
    assert (request.method, request.path) == ("POST", f"/v2/calls/{call}/actions/hangup")
    assert request.authorization == f"Bearer {FAKE_API_KEY}"
    assert set(request.body) == {"command_id"}


@pytest.mark.parametrize("destination", ["+15551234567", "sip:desk@pbx.example.com"])
async def test_transfer_sends_the_destination(
    fake: FakeTelnyxRest, control: TelnyxCallControl, destination: str
) -> None:
    call = new_call_control_id()
    fake.register_call(call)
    assert await control.transfer(call, destination) == CHANNEL_TRANSFERRING
    assert fake.requests[0].path == f"/v2/calls/{call}/actions/transfer"
    assert fake.requests[0].body["to"] == destination


async def test_bad_input_never_reaches_telnyx(
    fake: FakeTelnyxRest, control: TelnyxCallControl
) -> None:
    for call_id in ("", "a/b", "x" * 200, "v3:abc?x=1"):
        with pytest.raises(TelnyxCallControlError) as err:
            await control.hang_up(call_id)
        assert err.value.reason == "bad_call_id"
    for destination in ("555", "+0123", "tel:+15551234567", 'sip:a"b@c'):
        with pytest.raises(TelnyxCallControlError) as err:
            await control.transfer(new_call_control_id(), destination)
        assert err.value.reason == "bad_destination"
    assert fake.requests == []


async def test_failures_have_stable_reasons(fake: FakeTelnyxRest) -> None:
    wrong = TelnyxCallControl("KEYwrong", base_url=fake.base_url)
    with pytest.raises(TelnyxCallControlError) as err:
        await wrong.hang_up(new_call_control_id())
    assert err.value.reason == "auth_failed" and "KEYwrong" not in str(err.value)
    assert "KEYwrong" not in repr(wrong)
    await wrong.aclose()
    with pytest.raises(TelnyxCallControlError) as err:
        await wrong.hang_up(new_call_control_id())
    assert err.value.reason == "closed"
    nobody = TelnyxCallControl(FAKE_API_KEY, base_url=f"http://{LOOPBACK}:{free_port()}/v2")
    with pytest.raises(TelnyxCallControlError) as err:
        await nobody.hang_up(new_call_control_id())
    assert err.value.reason == "network"
    await nobody.aclose()
    for key, base in (("", "https://api.telnyx.com/v2"), ("k", "ftp://x")):
        with pytest.raises(TelnyxCallControlError) as err:
            TelnyxCallControl(key, base_url=base)
        assert err.value.reason == "bad_config"


async def test_requests_are_what_the_telnyx_sdk_sends(
    fake: FakeTelnyxRest, control: TelnyxCallControl
) -> None:
    sdk = AsyncTelnyx(api_key=FAKE_API_KEY, base_url=fake.base_url, max_retries=0)
    ours_call, sdk_call = new_call_control_id(), new_call_control_id()
    for call in (ours_call, sdk_call):
        fake.register_call(call)
    await control.transfer(ours_call, "+15551234567")
    await sdk.calls.actions.transfer(sdk_call, to="+15551234567")
    for call in (ours_call, sdk_call):
        fake.register_call(call)
    await control.hang_up(ours_call)
    await sdk.calls.actions.hangup(sdk_call)
    await sdk.close()
    ours = [r for r in fake.requests if ours_call in r.path]
    theirs = [r for r in fake.requests if sdk_call in r.path]
    assert len(ours) == len(theirs) == 2
    for mine, sdks in zip(ours, theirs, strict=True):
        assert mine.method == sdks.method
        assert mine.path.replace(ours_call, "ID") == sdks.path.replace(sdk_call, "ID")
        assert mine.authorization == sdks.authorization
        # command_id is an optional field of both actions (the SDK's signature has it).
        assert {k: v for k, v in mine.body.items() if k != "command_id"} == sdks.body


async def test_an_api_hang_up_of_a_telnyx_call_goes_through_call_control(
    echo_brain: EchoBrain, fake: FakeTelnyxRest, speech_pcm: bytes
) -> None:
    signer = TelnyxSimulator.new_signer()
    env = telnyx_env(signer, fake)
    async with serve_gateway(gateway_config(echo_brain.url, env=env)) as gateway:
        sim = TelnyxSimulator(gateway.url, signer=signer)
        call_control_id = new_call_control_id()
        hung_up = fake.register_call(call_control_id)
        placed = asyncio.create_task(
            sim.place_call(
                speech_pcm, call_sid=call_control_id, provider_hangup=hung_up, tail_s=5.0
            )
        )
        await eventually(lambda: len(gateway.state.calls_by_id) == 1)
        call_id = next(iter(gateway.state.calls_by_id))
        await asyncio.sleep(1.0)
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            deleted = await http.delete(f"/v1/calls/{call_id}", headers=ADMIN)
        assert deleted.status_code == 202, deleted.text
        result = await asyncio.wait_for(placed, 10)
        assert result.hung_up_by_provider  # Telnyx ended the call on the API's request
        assert [r.path for r in fake.requests] == [f"/v2/calls/{call_control_id}/actions/hangup"]
        await eventually(lambda: not gateway.state.calls)


# ---- outbound: POST /v1/calls through a TeXML application ---------------------------

CONNECTION_ID = "1234567890123456789"


async def test_create_texml_call_is_what_the_telnyx_sdk_sends(
    fake: FakeTelnyxRest, control: TelnyxCallControl
) -> None:
    url = "https://gw.example.com/telnyx/voice?rutster_call=call_1"
    sid = await control.create_texml_call(
        CONNECTION_ID, to="+15559870000", from_="+15551230000", url=url
    )
    sdk = AsyncTelnyx(api_key=FAKE_API_KEY, base_url=fake.base_url, max_retries=0)
    created = await sdk.texml.calls.create(
        CONNECTION_ID, from_="+15551230000", to="+15559870000", url=url, method="POST"
    )
    await sdk.close()
    ours, theirs = fake.requests
    assert (ours.method, ours.path, ours.authorization) == (
        theirs.method,
        theirs.path,
        theirs.authorization,
    )
    assert ours.path == f"/v2/texml/calls/{CONNECTION_ID}"
    assert (
        ours.body
        == theirs.body
        == {
            "From": "+15551230000",
            "To": "+15559870000",
            "Url": url,
            "Method": "POST",
        }
    )
    assert sid in fake.calls and created.call_sid in fake.calls


async def test_create_refuses_bad_arguments_before_any_request(
    fake: FakeTelnyxRest, control: TelnyxCallControl
) -> None:
    cases = [
        ("a/b", "+15559870000", "+15551230000", "https://gw/v"),
        (CONNECTION_ID, "555", "+15551230000", "https://gw/v"),
        (CONNECTION_ID, "+15559870000", "sip:x@y", "https://gw/v"),
        (CONNECTION_ID, "+15559870000", "+15551230000", "ftp://gw/v"),
    ]
    for connection, to, from_, url in cases:
        with pytest.raises(TelnyxCallControlError):
            await control.create_texml_call(connection, to=to, from_=from_, url=url)
    assert fake.requests == []


async def test_an_outbound_telnyx_call_is_placed_answered_echoed_and_billed(
    echo_brain: EchoBrain, fake: FakeTelnyxRest, speech_pcm: bytes
) -> None:
    signer = TelnyxSimulator.new_signer()
    env = telnyx_env(signer, fake) | {ENV_CONNECTION_ID: CONNECTION_ID}
    async with serve_gateway(gateway_config(echo_brain.url, env=env)) as gateway:
        sim = TelnyxSimulator(gateway.url, signer=signer)
        heard: list[SimulatedCallResult] = []

        async def callee(call_control_id: str, url: str, ended: asyncio.Event) -> None:
            heard.append(await play_callee(sim, speech_pcm, call_control_id, url, ended))

        fake.on_answer = callee
        call_id = await place_through_api(
            gateway, "telnyx", to="+15559870000", from_="+15551230000"
        )
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            await eventually(lambda: bool(heard), 15)
            await eventually(lambda: not gateway.state.calls)
            for _ in range(100):
                record = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
                if record["status"] == "ended":
                    break
                await asyncio.sleep(0.05)
        assert heard[0].media_received >= 100  # the callee heard its own voice back
        assert record["status"] == "ended" and record["provider"] == "telnyx"
        assert record["direction"] == "outbound"
        assert fake.requests[0].path == f"/v2/texml/calls/{CONNECTION_ID}"


async def test_without_a_connection_id_the_api_says_telnyx_is_not_set_up(
    echo_brain: EchoBrain, fake: FakeTelnyxRest
) -> None:
    env = {ENV_API_KEY: FAKE_API_KEY, ENV_API_BASE_URL: fake.base_url}
    async with (
        serve_gateway(gateway_config(echo_brain.url, env=env)) as gateway,
        httpx.AsyncClient(base_url=gateway.url) as http,
    ):
        key = await tenant_key(http, "default")
        refused = await http.post(
            "/v1/calls",
            json={"to": "+15559870000", "from": "+15551230000", "provider": "telnyx"},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert refused.status_code == 409 and ENV_CONNECTION_ID in refused.text, refused.text
    assert fake.requests == []


async def test_the_brains_transfer_of_a_telnyx_call_goes_through_call_control(
    fake: FakeTelnyxRest, speech_pcm: bytes
) -> None:
    signer = TelnyxSimulator.new_signer()
    async with TransferBrain() as brain:
        brain.destination = "+15551234567"
        config = gateway_config(
            brain.url,
            env=telnyx_env(signer, fake),
            transfer_allowlist=TransferAllowlist.parse("+15551234567"),
        )
        async with serve_gateway(config) as gateway:
            call_control_id = new_call_control_id()
            transferred = fake.register_call(call_control_id)
            result = await TelnyxSimulator(gateway.url, signer=signer).place_call(
                speech_pcm,
                call_sid=call_control_id,
                dtmf=[(1.0, "0")],
                provider_hangup=transferred,
                tail_s=3.0,
            )
            await eventually(lambda: not gateway.state.calls, 10)
            await eventually(lambda: bool(brain.of_type(SessionEnd)), 5)
    assert result.hung_up_by_provider  # Telnyx took the call away from us
    transfer = next(r for r in fake.requests if r.path.endswith("/actions/transfer"))
    assert transfer.path == f"/v2/calls/{call_control_id}/actions/transfer"
    assert transfer.body["to"] == "+15551234567"
    outputs = [e for e in brain.events if isinstance(e, FunctionCallOutput)]
    assert (
        outputs and outputs[0].status == "ok" and outputs[0].result == {"channel": "transferring"}
    )
    session_end = brain.of_type(SessionEnd)[0]
    assert isinstance(session_end, SessionEnd)
    assert session_end.reason is SessionEndReason.TRANSFERRED
