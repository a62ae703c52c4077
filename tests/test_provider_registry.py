"""The provider registry: lookup, auto-detection, routes, and a provider added by one line.

The last test is the registry's promise: a provider written against
``IngressProvider`` (here a Twilio-compatible stream under another name, path
and price) and listed in a registry runs a real call through the one admission
path and the one media-socket handler, under uvicorn, and is recorded and
billed under its own name. Nothing in the core names it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from rutster.base.ws_close import CLOSE_POLICY_VIOLATION
from rutster.brains.echo import EchoBrain
from rutster.gateway.admission import Refused, admit_call, grant_stream
from rutster.gateway.api.schemas import CREATE_CALL_SCHEMA, OUTBOUND_PROVIDERS
from rutster.gateway.app import create_app
from rutster.gateway.config import public_ws_url
from rutster.gateway.ingress_provider import (
    CPAAS_STAND_IN_RATES,
    NO_RATES,
    DialFailed,
    MediaLeg,
    ProviderCapabilities,
    StreamParams,
)
from rutster.gateway.media_socket import REASON_UNRECOGNISED_STREAM
from rutster.gateway.provider_registry import (
    AUTODETECT_MEDIA_PATH,
    UNKNOWN_PROVIDER,
    ProviderRegistry,
)
from rutster.gateway.providers import REGISTRY
from rutster.gateway.providers.plivo import PlivoProvider
from rutster.gateway.providers.sip import SipProvider
from rutster.gateway.providers.telnyx import TelnyxProvider
from rutster.gateway.providers.twilio import TwilioMediaLeg, TwilioProvider
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL
from rutster.media.g711 import ulaw_encode
from rutster.protocols.ingress import CallDirection, StreamStarted
from rutster.spend.gate import AdmissionRequest
from rutster.spend.prices import PriceTable, TelephonyRate
from rutster.spend.store import CallRecord
from rutster.tools.twilio_simulator import (
    StreamInstructions,
    connected_message,
    media_message,
    new_sid,
    signed_headers,
    start_message,
    stop_message,
)
from rutster.trunk.sip.wire import WorkerMediaCodec
from rutster.trunk.twilio.codec import PARAM_TOKEN
from tests.conftest import (
    TEST_AUTH_TOKEN,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
    spend_settings,
)
from tests.test_gateway_calls import received_media, send_speech, simulator
from tests.test_stream_token_replay import close_of

TWILIO_CONNECTED = json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})


def sip_start() -> str:
    """A SIP worker's real ``start`` frame, as its codec encodes it."""
    return WorkerMediaCodec().start(
        call_id="call_0123abcd",
        sip_call_id="abc@pbx",
        direction=CallDirection.INBOUND,
        from_="sip:+15550001111@pbx",
        to="sip:+15550002222@gw",
        tap_url="ws://127.0.0.1:1/tap",
        spend="ctx",
        token="tok",
    )


def test_the_registry_lists_every_provider() -> None:
    assert REGISTRY.names() == ("twilio", "sip", "telnyx", "plivo", "vonage", "phone")
    # The softphone answers calls only: the REST API places none through it.
    assert REGISTRY.outbound_names() == ("twilio", "sip", "telnyx", "plivo", "vonage")
    assert isinstance(REGISTRY.get("twilio"), TwilioProvider)
    assert isinstance(REGISTRY.get("sip"), SipProvider)
    assert isinstance(REGISTRY.get("telnyx"), TelnyxProvider)
    assert isinstance(REGISTRY.get("plivo"), PlivoProvider)
    assert REGISTRY.get("bandwidth") is None
    # The REST API's provider enum is the registry's, not a list of its own.
    assert CREATE_CALL_SCHEMA["properties"]["provider"]["enum"] == list(OUTBOUND_PROVIDERS)


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (TWILIO_CONNECTED, "twilio"),
        (start_message("MZ" + "1" * 32, "CA" + "2" * 32, "AC" + "3" * 32, {}), "twilio"),
        (sip_start(), "sip"),
        (
            json.dumps(
                {"event": "start", "start": {"callId": "c1", "streamId": "s1", "mediaFormat": {}}}
            ),
            "plivo",
        ),
        (
            json.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=16000"}),
            "vonage",
        ),
        # Telnyx's connected names a version and no protocol (Twilio's says "Call").
        (json.dumps({"event": "connected", "version": "1.0.0"}), "telnyx"),
        (json.dumps({"event": "media", "media": {"payload": ""}}), None),
        ("not json", None),
        ("[1, 2]", None),
        ("9" * 5000, None),
        ("[" * 100_000, None),
        (b"\x00\x01" * 160, None),
        ("x" * 1_000_000, None),
    ],
)
def test_detect_names_the_provider_of_a_first_frame(
    first: str | bytes, expected: str | None
) -> None:
    found = REGISTRY.detect(first)
    assert (found.name if found is not None else None) == expected


def test_detect_never_guesses_between_two_claimants() -> None:
    twin = TwilioCompatibleProvider()
    registry = ProviderRegistry([TwilioProvider(), twin])
    assert registry.detect(TWILIO_CONNECTED) is None


def test_the_registry_refuses_clashing_or_malformed_entries() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        ProviderRegistry([TwilioProvider(), TwilioProvider()])
    clash = TwilioCompatibleProvider()
    clash.media_path = TwilioProvider.media_path
    with pytest.raises(ValueError, match="used twice"):
        ProviderRegistry([TwilioProvider(), clash])
    bad = TwilioCompatibleProvider()
    bad.name = "Acme Telecom"
    with pytest.raises(ValueError, match="lowercase word"):
        ProviderRegistry([bad])


@pytest.mark.parametrize(
    ("stored", "shown"),
    [("twilio", "twilio"), ("telnyx", "telnyx"), ("", UNKNOWN_PROVIDER), ("A!", UNKNOWN_PROVIDER)],
)
def test_label_shows_a_recorded_provider_as_stored(stored: str, shown: str) -> None:
    assert REGISTRY.label(stored) == shown


def test_the_app_mounts_every_providers_routes_once() -> None:
    app = create_app(gateway_config("ws://127.0.0.1:1/tap"))
    paths = [r.path for r in app.routes if isinstance(r, Route | WebSocketRoute)]
    assert len(paths) == len(set(paths))
    for path in (
        "/twilio/voice",
        "/twilio/status",
        "/twilio/stream",
        "/sip/workers",
        "/sip/stream",
        "/telnyx/voice",
        "/telnyx/stream",
        "/plivo/answer",
        "/plivo/transfer",
        "/plivo/stream",
        "/vonage/answer",
        "/vonage/events",
        "/vonage/stream",
        "/phone",
        "/phone/calls",
        "/phone/stream",
        AUTODETECT_MEDIA_PATH,
    ):
        assert path in paths
    media = [r for r in app.routes if isinstance(r, WebSocketRoute) and r.name.endswith("_media")]
    expected = [
        "/phone/stream",
        "/plivo/stream",
        "/sip/stream",
        "/telnyx/stream",
        "/twilio/stream",
        "/vonage/stream",
    ]
    assert sorted(r.path for r in media) == expected


# ---- a provider added by one registry line ------------------------------------------------

#: The test provider's name (its price key) and its rate: 1.20 USD a minute per second.
ACME = "acme"
ACME_MICROS_PER_MINUTE = 1_200_000
ANSWER_PATH = "/acme/answer"


class TwilioCompatibleProvider:
    """A provider that streams Twilio's wire format on its own path, answers a JSON
    webhook, and is billed under its own name: what a new CPaaS adapter looks like."""

    name = ACME
    default_rates = NO_RATES  # priced by the test's own table
    media_path = "/acme/stream"
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="as Twilio's",
        wire_format="audio/x-mulaw;rate=8000",
        dials_sip_uris=False,
        outbound=False,
    )

    def routes(self) -> Sequence[BaseRoute]:
        return [Route(ANSWER_PATH, self.answer, methods=["POST"])]

    async def answer(self, request: Request) -> Response:
        """The provider's webhook: admit, then tell it where to stream, with what."""
        state: GatewayState = request.app.state.gateway
        body: dict[str, Any] = await request.json()
        tap_url = state.config.tap_url
        admitted = await admit_call(
            state,
            AdmissionRequest(
                tenant=state.config.spend.tenant_for_number(body["to"]),
                provider=self.name,
                direction="inbound",
                caller=body["from"],
                to=body["to"],
                brain=tap_url,
                provider_call_id=body["call_id"],
            ),
        )
        if isinstance(admitted, Refused):
            return JSONResponse({"refused": admitted.reason}, 403)
        grant = grant_stream(state, admitted, stream_call_id=body["call_id"], tap_url=tap_url)
        return JSONResponse(
            {
                "stream_url": public_ws_url(state.config.public_url, self.media_path),
                "parameters": {
                    PARAM_TAP_URL: tap_url,
                    PARAM_SPEND: grant.spend_text,
                    PARAM_TOKEN: grant.token,
                },
            }
        )

    async def startup(self, state: GatewayState) -> None:
        pass

    async def shutdown(self, state: GatewayState) -> None:
        pass

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        return None

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        return TwilioMediaLeg(websocket, state)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        params = started.custom_parameters
        return StreamParams(
            params.get(PARAM_TAP_URL, ""), params.get(PARAM_SPEND, ""), params.get(PARAM_TOKEN)
        )

    def sniff(self, first_message: str | bytes) -> bool:
        return TwilioProvider().sniff(first_message)

    def outbound_unavailable(self, state: GatewayState) -> str | None:
        return "acme places no calls"

    async def dial(
        self, state: GatewayState, context: SpendContext, *, to: str, from_: str, tap_url: str
    ) -> str:
        raise DialFailed("acme places no calls")

    async def cancel(self, state: GatewayState, record: CallRecord) -> None:
        pass


async def test_a_provider_added_by_one_registry_line_runs_a_billed_call(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    default = PriceTable.default()
    telephony = dict(default.telephony)
    telephony[(ACME, "*")] = TelephonyRate(ACME_MICROS_PER_MINUTE, 1)
    prices = PriceTable(telephony=telephony, brains=dict(default.brains))
    config = gateway_config(echo_brain.url, spend=spend_settings(prices=prices))
    registry = ProviderRegistry([TwilioProvider(), SipProvider(), TwilioCompatibleProvider()])
    async with serve_gateway(config, providers=registry) as gateway:
        call_sid = new_sid("CA")
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            answer = await http.post(
                ANSWER_PATH, json={"call_id": call_sid, "from": "+15550001111", "to": "+15550002"}
            )
        assert answer.status_code == 200, answer.text
        instructions = answer.json()
        async with connect(instructions["stream_url"]) as ws:
            stream_sid = new_sid("MZ")
            await ws.send(connected_message())
            await ws.send(
                start_message(stream_sid, call_sid, "AC" + "0" * 32, instructions["parameters"])
            )
            await eventually(lambda: len(gateway.state.calls) == 1)
            call = next(iter(gateway.state.calls.values()))
            call_id = call.call_id
            assert call_id is not None
            await eventually(lambda: call.tap.connected)
            mulaw = ulaw_encode(speech_pcm[: 2 * 8000 * 3])  # 3 s of speech
            echoed = 0
            for seq, n in enumerate(range(0, len(mulaw), 160), start=2):
                await ws.send(media_message(stream_sid, seq, seq, n // 8, mulaw[n : n + 160]))
                await asyncio.sleep(0.02)
            # The echo brain's reply comes back on the same socket, as Twilio media.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while echoed < 25 and (left := deadline - loop.time()) > 0:
                raw = await asyncio.wait_for(ws.recv(), left)
                echoed += json.loads(raw).get("event") == "media"
            assert echoed >= 25, "the brain's audio did not come back on the acme socket"
            await ws.send(stop_message(stream_sid, seq + 1, call_sid, "AC" + "0" * 32))
        store = gateway.state.spend_store
        assert store is not None

        async def settled() -> CallRecord:
            record = await store.get_call(call_id)
            assert record is not None
            return record

        await eventually(lambda: not gateway.state.calls)
        for _ in range(100):
            record = await settled()
            if record["status"] == "ended":
                break
            await asyncio.sleep(0.05)
        assert record["status"] == "ended"
        assert record["provider"] == ACME
        assert record["provider_call_id"] == call_sid
        # Billed at acme's own rate (its price key is its name): 3 s or more at 20,000 a s.
        assert record["spent"] is not None and record["spent"] >= 3 * ACME_MICROS_PER_MINUTE // 60
        assert gateway.metric("rutster_admissions_total", outcome="admitted", reason="ok") == 1


# ---- the auto-detecting media URL -----------------------------------------------------------


def media_url(gateway: RunningGateway) -> str:
    return public_ws_url(gateway.url, AUTODETECT_MEDIA_PATH)


async def test_a_twilio_stream_on_the_one_media_url_runs_the_call(
    gateway: RunningGateway, speech_pcm: bytes
) -> None:
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    told = await sim.open_stream(call_sid, from_="+15550001111", to="+15550002222")
    assert told.url.endswith("/twilio/stream")
    # The operator pointed the stream at the one URL instead; Twilio signs that URL.
    ws = await sim.connect_media(StreamInstructions(media_url(gateway), told.parameters))
    stream_sid = new_sid("MZ")
    await ws.send(connected_message())
    await ws.send(start_message(stream_sid, call_sid, sim.account_sid, told.parameters))
    await send_speech(ws, stream_sid, speech_pcm[: 2 * 8000 * 2])
    assert await received_media(ws, 3.0) >= 25, "the echo did not come back on /media"
    assert len(gateway.state.calls) == 1
    call = next(iter(gateway.state.calls.values()))
    assert call.context.provider == "twilio"
    await ws.close()
    await eventually(lambda: not gateway.state.calls)


@pytest.mark.parametrize(
    "first",
    [
        "hello",
        json.dumps({"event": "media", "media": {"payload": "AAAA"}}),
        b"\x00\x01" * 160,
    ],
)
async def test_a_first_frame_no_provider_claims_is_refused(
    gateway: RunningGateway, first: str | bytes
) -> None:
    async with connect(media_url(gateway)) as ws:
        await ws.send(first)
        assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, REASON_UNRECOGNISED_STREAM)
    assert gateway.metric("rutster_bad_messages_total", source="autodetect", reason="unrecognised")
    assert not gateway.state.calls


async def test_each_providers_authentication_still_applies_on_the_one_url(
    gateway: RunningGateway,
) -> None:
    # A SIP worker's start without the workers' bearer secret.
    async with connect(media_url(gateway)) as ws:
        await ws.send(sip_start())
        assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, "unauthorized")
    # A Twilio stream whose upgrade is signed for another URL.
    wrong = signed_headers(TEST_AUTH_TOKEN, "wss://elsewhere.example.com/media", {})
    async with connect(media_url(gateway), additional_headers=wrong) as ws:
        await ws.send(TWILIO_CONNECTED)
        assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, "invalid signature")
    assert not gateway.state.calls


def test_a_provider_brings_its_price_and_a_price_file_overrides_it() -> None:
    rates = REGISTRY.default_rates()
    assert rates[("telnyx", "inbound")] == CPAAS_STAND_IN_RATES["inbound"]
    assert rates[("phone", "*")].micros_per_minute == 0
    assert ("twilio", "inbound") not in rates  # in the built-in table already
    table = PriceTable.default().with_telephony(rates)
    assert table.telephony_rate("telnyx", "outbound") == CPAAS_STAND_IN_RATES["outbound"]
    assert table.telephony_rate("twilio", "inbound") == PriceTable.default().telephony_rate(
        "twilio", "inbound"
    )
    # A provider the table prices in any way keeps the table's rates alone.
    own = TelephonyRate(1, 1)
    ours = PriceTable(telephony={("telnyx", "*"): own}, brains={}).with_telephony(rates)
    assert ours.telephony_rate("telnyx", "inbound") == own
    assert ours.telephony_rate("telnyx", "outbound") == own
