"""Vonage websockets: the codec (binary audio, text events), the JWTs, and calls end to
end (signed answer and handshake, echo, DTMF, /media detection, REST hang-up)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rutster.brains.echo import EchoBrain
from rutster.gateway.provider_registry import AUTODETECT_MEDIA_PATH
from rutster.gateway.providers.vonage import (
    ENV_API_BASE_URL,
    ENV_APPLICATION_ID,
    ENV_PRIVATE_KEY_FILE,
    ENV_SIGNATURE_SECRET,
)
from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.protocols.ingress import (
    AudioReceived,
    ClearPlayback,
    DtmfReceived,
    IngressProtocolError,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
    StreamStarted,
    UnknownIngressEvent,
)
from rutster.protocols.tap import Dtmf
from rutster.tools.twilio_simulator import SimulatedCallResult
from rutster.tools.vonage_simulator import VonageSimulator, new_call_uuid
from rutster.trunk.vonage.codec import (
    CONTENT_TYPE,
    VonageCleared,
    VonageStreamCodec,
    sniff_vonage_stream,
)
from rutster.trunk.vonage.signature import MAX_AGE_S, VonageJwt
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
from tests.support.fake_vonage_rest import FakeVonageRest, serve_fake_vonage
from tests.support.outbound_calls import place_through_api, play_callee
from tests.support.recording_brain import RecordingBrain, TransferBrain

SECRET = "vonage-signature-secret-0123456789"
APPLICATION_ID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
CALL = "63f61863-4a51-4f6b-86e1-46edebcf9356"


def connected(**extra: str) -> str:
    return json.dumps(
        {"event": "websocket:connected", "content-type": CONTENT_TYPE, "call_uuid": CALL} | extra
    )


def started() -> VonageStreamCodec:
    codec = VonageStreamCodec({"token": "t", "from": "447700900001"})
    assert isinstance(codec.receive(connected()), StreamStarted)
    return codec


# ---- codec ----------------------------------------------------------------------------


def test_connected_starts_the_call_and_binary_frames_are_audio() -> None:
    codec = VonageStreamCodec({"token": "t", "direction": "outbound"})
    event = codec.receive(connected(session="s1"))
    assert isinstance(event, StreamStarted)
    assert (event.call.provider, event.call.call_id) == ("vonage", CALL)
    assert event.media_format.sample_rate == 16_000
    assert event.custom_parameters["token"] == "t"
    assert event.custom_parameters["session"] == "s1"
    assert codec.receive(b"\x01\x00" * 320) == AudioReceived(b"\x01\x00" * 320, None)


def test_events() -> None:
    codec = started()
    dtmf = {"event": "websocket:dtmf", "digit": "5", "duration": 260}
    assert codec.receive(json.dumps(dtmf)) == DtmfReceived("5")
    nested = {"event": "websocket:dtmf", "dtmf": {"digit": "#"}}
    assert codec.receive(json.dumps(nested)) == DtmfReceived("#")
    notify = {"event": "websocket:notify", "payload": {"name": "40"}}
    assert codec.receive(json.dumps(notify)) == MarkPlayed("40")
    assert codec.receive(json.dumps({"event": "websocket:cleared"})) == VonageCleared()
    with pytest.raises(UnknownIngressEvent):
        codec.receive(json.dumps({"event": "websocket:new"}))


@pytest.mark.parametrize(
    ("frame", "reason", "fatal"),
    [
        (b"\x00" * 3, "bad_audio", False),
        (b"\x00" * 20_000, "bad_audio", False),
        ("{", "malformed_json", False),
        (json.dumps({"event": "websocket:dtmf", "digit": "55"}), "bad_field", False),
        (json.dumps({"event": "websocket:notify", "payload": {}}), "bad_field", False),
        (connected(), "duplicate_start", True),
    ],
)
def test_bad_frames(frame: str | bytes, reason: str, fatal: bool) -> None:
    codec = started()
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(frame)
    assert (err.value.reason, err.value.fatal) == (reason, fatal)


def test_before_connected_and_bad_starts() -> None:
    with pytest.raises(IngressProtocolError) as err:
        VonageStreamCodec().receive(b"\x00\x00")
    assert err.value.reason == "media_before_start"
    wrong_rate = {"event": "websocket:connected", "content-type": "audio/l16;rate=8000"}
    with pytest.raises(IngressProtocolError) as err:
        VonageStreamCodec().receive(json.dumps(wrong_rate | {"call_uuid": CALL}))
    assert (err.value.reason, err.value.fatal) == ("unsupported_media_format", True)
    no_call = {"event": "websocket:connected", "content-type": CONTENT_TYPE}
    with pytest.raises(IngressProtocolError) as err:
        VonageStreamCodec().receive(json.dumps(no_call))
    assert (err.value.reason, err.value.fatal) == ("bad_start", True)


def test_encode_speaks_vonage() -> None:
    codec = started()
    assert codec.encode(PlayAudio(b"\x01\x00" * 320)) == b"\x01\x00" * 320
    assert codec.encode(PlayAudio(b"\x01\x00" * 100)) == b"\x01\x00" * 100 + bytes(440)
    assert json.loads(codec.encode(PlaceMark("7"))) == {
        "action": "notify",
        "payload": {"name": "7"},
    }
    assert json.loads(codec.encode(ClearPlayback())) == {"action": "clear"}


def test_sniff() -> None:
    assert sniff_vonage_stream(connected())
    assert not sniff_vonage_stream(json.dumps({"event": "connected", "protocol": "Call"}))
    assert not sniff_vonage_stream(b"\x00" * 640)
    assert not sniff_vonage_stream("x" * 100_000)


# ---- JWTs -----------------------------------------------------------------------------


def test_the_vonage_sdk_accepts_what_the_simulator_signs() -> None:
    from vonage_jwt.verify_jwt import verify_signature

    token = VonageJwt(SECRET).sign(b"{}", now_s=time.time()).removeprefix("Bearer ")
    assert verify_signature(token, SECRET)
    assert not verify_signature(token, "another-vonage-signature-secret-0123")


def test_jwt_checks() -> None:
    signer = VonageJwt(SECRET)
    now = 1_700_000_000.0
    body = b'{"uuid":"x"}'
    token = signer.sign(body, now_s=now)
    assert signer.verify(token, body, now_s=now).ok
    assert signer.verify(token, None, now_s=now).ok  # a handshake has no body
    assert signer.verify(token, body + b" ", now_s=now).reason == "body_mismatch"
    assert signer.verify(token, body, now_s=now + MAX_AGE_S + 1).reason == "expired"
    other = VonageJwt("another-vonage-signature-secret-0123")
    assert other.verify(token, body, now_s=now).reason == "mismatch"
    assert signer.verify(None, body, now_s=now).reason == "missing"
    assert signer.verify("Basic abc", body, now_s=now).reason == "missing"
    unsigned = jwt.encode({"iat": int(now)}, key="", algorithm="none")
    assert signer.verify(f"Bearer {unsigned}", body, now_s=now).reason == "mismatch"


# ---- calls ----------------------------------------------------------------------------


@pytest.fixture
async def vonage_gateway(echo_brain: EchoBrain) -> AsyncIterator[RunningGateway]:
    env = {ENV_SIGNATURE_SECRET: SECRET}
    async with serve_gateway(gateway_config(echo_brain.url, env=env)) as running:
        yield running


@realtime_echo
async def test_a_signed_vonage_call_echoes_and_is_billed_as_vonage(
    vonage_gateway: RunningGateway, speech_pcm: bytes
) -> None:
    gateway = vonage_gateway
    pcm = speech_pcm[: 4 * 8000 * 2]
    call_uuid = new_call_uuid()
    sim = VonageSimulator(gateway.url, signature_secret=SECRET)
    placed = asyncio.create_task(sim.place_call(pcm, call_sid=call_uuid, tail_s=0.8))
    await eventually(lambda: len(gateway.state.calls) == 1 or placed.done())
    call = next(iter(gateway.state.calls.values()))
    result = await placed
    assert_echo_intact(pcm, result)  # through 16 kHz L16 both ways
    assert result.marks_received > 0 and result.marks_echoed > 0  # notify
    assert (call.context.provider, call.context.call_id) == ("vonage", call_uuid)
    await eventually(lambda: not gateway.state.calls)
    record = await settled_record(gateway, call)
    assert record is not None and (record["provider"], record["status"]) == ("vonage", "ended")


async def test_unsigned_answers_and_handshakes_are_refused(
    vonage_gateway: RunningGateway,
) -> None:
    gateway = vonage_gateway
    response = await VonageSimulator(gateway.url).post_voice_webhook(
        new_call_uuid(), from_="447700900001", to="447700900002"
    )
    assert response.status_code == 403
    signed = VonageSimulator(gateway.url, signature_secret=SECRET)
    told = await signed.open_stream(new_call_uuid(), from_="447700900001", to="447700900002")
    with pytest.raises(InvalidStatus) as refused:  # no Authorization on the handshake
        await connect(told.url)
    assert refused.value.response.status_code == 403
    assert gateway.metric("rutster_signature_failures_total", endpoint="vonage_stream") == 1


async def test_vonage_dtmf_and_the_one_media_url(speech_pcm: bytes) -> None:
    async with RecordingBrain() as brain:
        config = gateway_config(brain.url, env={ENV_SIGNATURE_SECRET: SECRET})
        async with serve_gateway(config) as gateway:
            result = await VonageSimulator(gateway.url, signature_secret=SECRET).place_call(
                speech_pcm[: 2 * 8000 * 2],
                call_sid=new_call_uuid(),
                dtmf=[(0.5, "8")],
                media_path=AUTODETECT_MEDIA_PATH,
                tail_s=0.8,
            )
            await eventually(lambda: bool(brain.of_type(Dtmf)))
    assert result.media_received >= 50  # the brain's echo, back through /media
    assert [e.digit for e in brain.of_type(Dtmf) if isinstance(e, Dtmf)] == ["8"]


async def test_an_api_hang_up_goes_through_the_voice_api(
    echo_brain: EchoBrain, speech_pcm: bytes, tmp_path: Path
) -> None:
    key_file, public = _application_key(tmp_path)
    async with serve_fake_vonage(public, APPLICATION_ID) as fake:
        env = vonage_env(fake, key_file)
        async with serve_gateway(gateway_config(echo_brain.url, env=env)) as gateway:
            await _hang_up_through_the_api(gateway, fake, speech_pcm)


def vonage_env(fake: FakeVonageRest, key_file: Path) -> dict[str, str]:
    """A gateway checking :data:`SECRET`'s tokens, with the Voice API on ``fake``."""
    return {
        ENV_SIGNATURE_SECRET: SECRET,
        ENV_APPLICATION_ID: APPLICATION_ID,
        ENV_PRIVATE_KEY_FILE: str(key_file),
        ENV_API_BASE_URL: fake.base_url,
    }


def _application_key(folder: Path) -> tuple[Path, str]:
    """A Vonage application's key pair: the private key's PEM file, the public key's PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (folder / "app.key").write_bytes(pem)
    return folder / "app.key", public.decode()


async def _hang_up_through_the_api(
    gateway: RunningGateway, fake: FakeVonageRest, speech_pcm: bytes
) -> None:
    call_uuid = new_call_uuid()
    hung_up = fake.register_call(call_uuid)
    sim = VonageSimulator(gateway.url, signature_secret=SECRET)
    placed = asyncio.create_task(
        sim.place_call(speech_pcm, call_sid=call_uuid, provider_hangup=hung_up, tail_s=5.0)
    )
    await eventually(lambda: len(gateway.state.calls_by_id) == 1)
    call_id = next(iter(gateway.state.calls_by_id))
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        deleted = await http.delete(f"/v1/calls/{call_id}", headers=ADMIN)
    assert deleted.status_code == 202, deleted.text
    await asyncio.wait_for(placed, 10)
    # The gateway ends its side and hangs up through the Voice API; which the simulated
    # call sees first (its socket closing or Vonage's hang-up) depends on the load.
    hang_up = ("PUT", f"/v1/calls/{call_uuid}", {"action": "hangup"})
    await eventually(lambda: fake.requests == [hang_up])
    await eventually(lambda: not gateway.state.calls)


# ---- outbound -------------------------------------------------------------------------


def test_the_create_call_body_is_the_vonage_sdks() -> None:
    from vonage_voice.models.requests import CreateCallRequest

    answer, events = "https://gw.example.com/vonage/answer?rutster_call=c1", "https://gw/e"
    sdk = CreateCallRequest(
        to=[{"type": "phone", "number": "447700900001"}],
        from_={"type": "phone", "number": "447700900000"},
        answer_url=[answer],
        answer_method="GET",
        event_url=[events],
    ).model_dump(by_alias=True, exclude_none=True, mode="json")
    ours = {
        "to": [{"type": "phone", "number": "447700900001"}],
        "from": {"type": "phone", "number": "447700900000"},
        "answer_url": [answer],
        "answer_method": "GET",
        "event_url": [events],
    }
    assert sdk == ours


async def test_an_outbound_vonage_call_is_placed_answered_and_echoed(
    echo_brain: EchoBrain, speech_pcm: bytes, tmp_path: Path
) -> None:
    key_file, public = _application_key(tmp_path)
    async with serve_fake_vonage(public, APPLICATION_ID) as fake:
        env = vonage_env(fake, key_file)
        async with serve_gateway(gateway_config(echo_brain.url, env=env)) as gateway:
            sim = VonageSimulator(gateway.url, signature_secret=SECRET)
            heard: list[SimulatedCallResult] = []

            async def callee(call_uuid: str, url: str, ended: asyncio.Event) -> None:
                heard.append(await play_callee(sim, speech_pcm, call_uuid, url, ended))

            fake.on_answer = callee
            await place_through_api(gateway, "vonage", to="+447700900001", from_="+447700900000")
            await eventually(lambda: bool(heard), 15)
            await eventually(lambda: not gateway.state.calls)
    assert heard[0].media_received >= 100  # the callee heard its own voice back
    method, path, body = fake.requests[0]
    assert (method, path) == ("POST", "/v1/calls")
    assert body["to"] == [{"type": "phone", "number": "447700900001"}]


# ---- transfer -------------------------------------------------------------------------


def test_the_transfer_body_is_the_vonage_sdks() -> None:
    from vonage_voice.models.connect_endpoints import PhoneEndpoint
    from vonage_voice.models.ncco import Connect

    sdk_ncco = Connect(endpoint=[PhoneEndpoint(number="447700900009")], from_="447700900000")
    sdk = {
        "action": "transfer",
        "destination": {
            "type": "ncco",
            "ncco": [sdk_ncco.model_dump(by_alias=True, exclude_none=True, mode="json")],
        },
    }
    ours = {
        "action": "transfer",
        "destination": {
            "type": "ncco",
            "ncco": [
                {
                    "action": "connect",
                    "endpoint": [{"type": "phone", "number": "447700900009"}],
                    "from": "447700900000",
                }
            ],
        },
    }
    assert sdk == ours


async def test_the_brains_transfer_of_a_vonage_call_goes_through_the_voice_api(
    speech_pcm: bytes, tmp_path: Path
) -> None:
    key_file, public = _application_key(tmp_path)
    async with serve_fake_vonage(public, APPLICATION_ID) as fake, TransferBrain() as brain:
        brain.destination = "+447700900009"
        env = vonage_env(fake, key_file)
        config = gateway_config(
            brain.url, env=env, transfer_allowlist=TransferAllowlist.parse("+447700900009")
        )
        async with serve_gateway(config) as gateway:
            call_uuid = new_call_uuid()
            moved = fake.register_call(call_uuid)
            result = await VonageSimulator(gateway.url, signature_secret=SECRET).place_call(
                speech_pcm,
                call_sid=call_uuid,
                to="+447700900000",
                dtmf=[(1.0, "0")],
                provider_hangup=moved,
                tail_s=3.0,
            )
            await eventually(lambda: not gateway.state.calls, 10)
    assert result.hung_up_by_provider  # Vonage moved the call away from our socket
    method, path, body = fake.requests[0]
    assert (method, path) == ("PUT", f"/v1/calls/{call_uuid}")
    connect = body["destination"]["ncco"][0]  # type: ignore[index]
    assert connect["endpoint"] == [{"type": "phone", "number": "447700900009"}]
    assert connect["from"] == "447700900000"  # the number the caller dialled
