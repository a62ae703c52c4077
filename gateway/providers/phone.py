"""The browser softphone (``/phone``) as an ingress provider: try rutster without a number.

A person opens ``/phone``, gives an API key (the dashboard's: a tenant key, or the
admin key for the default tenant), clicks *Call* and talks to the configured brain
through the same core path as a phone call: admission through the spend gate, the
media engine (VAD, barge-in, paced playout), the tap to the brain, receipts.

- ``GET /phone`` and ``/phone/static/*``: the page (no assets from elsewhere; a strict
  Content Security Policy, as the dashboard's).
- ``POST /phone/calls`` (``Authorization: Bearer <key>``): admits a call for the key's
  tenant and answers where its media socket is and the stream's parameters (brain
  URL, spend context, stream token), as a provider's webhook would.
- ``/phone/stream`` (served by ``gateway/media_socket.py``): the page captures the
  microphone, downsamples it to 8 kHz μ-law in an AudioWorklet (so it sounds like a
  phone and runs the phone path) and speaks Twilio's Media Streams wire
  (``TwilioStreamCodec`` with this provider's name): ``media``, ``mark`` echoes,
  ``clear`` on barge-in. The socket is never auto-detected on ``/media`` (its frames
  are Twilio's): the page dials this path.

The browser's calls cost no telephony (price key ``phone``); the brain is paid as on
any call. Hang-up is closing the socket.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from types import MappingProxyType

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from rutster.base.stream_token import PARAM_TOKEN
from rutster.gateway.admission import QUERY_BRAIN, Refused, admit_call, grant_stream, inbound_brain
from rutster.gateway.config import public_ws_url
from rutster.gateway.ingress_provider import (
    InboundOnly,
    MediaLeg,
    ProviderCapabilities,
    Rates,
    StreamParams,
)
from rutster.gateway.phone import STATIC_DIR
from rutster.gateway.spend_context import PARAM_SPEND
from rutster.gateway.state import GatewayState
from rutster.gateway.text_stream_leg import PARAM_TAP_URL, TextMediaLeg, custom_stream_params
from rutster.protocols.ingress import StreamStarted
from rutster.spend.gate import AdmissionRequest
from rutster.spend.prices import TelephonyRate
from rutster.trunk.twilio.codec import PARAM_DIRECTION, PARAM_FROM, PARAM_TO, TwilioStreamCodec

log = logging.getLogger(__name__)

#: The provider's name: recorded on its calls, its price key.
PROVIDER = "phone"
PAGE_PATH = "/phone"
CALLS_PATH = "/phone/calls"
MEDIA_PATH = "/phone/stream"
#: Content Security Policy of the page: everything from this origin, nothing else (the
#: dashboard's, gateway/dashboard_feed.py; the page is tested under exactly this policy).
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
#: Its price: no carrier carries a browser call, so no telephony cost (seed decision);
#: the brain is paid as on any call.
PHONE_RATES: Rates = MappingProxyType({"*": TelephonyRate(0, 1)})
#: What the call record shows as the caller and the number called.
CALLER = "browser"
CALLED = "softphone"


async def phone_page(request: Request) -> Response:
    """``GET /phone``: the page (it holds no data; placing a call needs a key)."""
    response = FileResponse(STATIC_DIR / "index.html", media_type="text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    response.headers["Cache-Control"] = "no-store"
    return response


async def phone_call(request: Request) -> Response:
    """``POST /phone/calls``: admit a browser call; where to stream it, with what."""
    # Imported here: the API's schemas read the provider registry, which imports this.
    from rutster.gateway.api.errors import ApiError, error_response
    from rutster.gateway.api.routes import authenticate

    state: GatewayState = request.app.state.gateway
    try:
        principal = await authenticate(request)
    except ApiError as exc:
        return error_response(exc)
    tap_url = inbound_brain(state, request.query_params.get(QUERY_BRAIN), CALLED)
    if tap_url is None:
        return JSONResponse({"error": {"code": "brain_not_allowed"}}, 403)
    call_sid = "PH" + secrets.token_hex(16)
    tenant = principal.tenant or state.config.spend.tenant_for_number(CALLED)
    wanted = AdmissionRequest(
        tenant=tenant,
        provider=PROVIDER,
        direction="inbound",
        caller=CALLER,
        to=CALLED,
        brain=tap_url,
        provider_call_id=call_sid,
    )
    admitted = await admit_call(state, wanted)
    if isinstance(admitted, Refused):
        return JSONResponse({"error": {"code": "refused", "reason": admitted.reason}}, 403)
    grant = grant_stream(state, admitted, stream_call_id=call_sid, tap_url=tap_url)
    return JSONResponse(
        {
            "call_id": admitted.call_id,
            "call_sid": call_sid,
            "stream_url": public_ws_url(state.config.public_url, MEDIA_PATH),
            "parameters": {
                PARAM_FROM: CALLER,
                PARAM_TO: CALLED,
                PARAM_DIRECTION: "inbound",
                PARAM_TAP_URL: tap_url,
                PARAM_SPEND: grant.spend_text,
                PARAM_TOKEN: grant.token,
            },
        },
        status_code=201,
    )


class PhoneProvider(InboundOnly):
    """The browser softphone: a page, an admission endpoint and a Twilio-wire socket."""

    name = PROVIDER
    media_path = MEDIA_PATH
    capabilities = ProviderCapabilities(
        playback_marks=True,
        clear="the page stops every scheduled buffer and echoes the marks behind them",
        wire_format="audio/x-mulaw;rate=8000 from the page's AudioWorklet, in Twilio's "
        "Media Streams JSON",
        dials_sip_uris=False,
        outbound=False,
    )
    default_rates = PHONE_RATES

    def routes(self) -> Sequence[BaseRoute]:
        """The page, its files, and the admission endpoint."""
        return [
            Route(PAGE_PATH, phone_page, methods=["GET"]),
            Mount("/phone/static", StaticFiles(directory=STATIC_DIR), name="phone-static"),
            Route(CALLS_PATH, phone_call, methods=["POST"]),
        ]

    async def startup(self, state: GatewayState) -> None:
        """Nothing to open."""

    async def shutdown(self, state: GatewayState) -> None:
        """Nothing opened."""

    def authorize_media(self, websocket: WebSocket, state: GatewayState) -> str | None:
        """The stream token (from ``POST /phone/calls``, for a key) proves the call."""
        return None

    def open_leg(self, websocket: WebSocket, state: GatewayState) -> MediaLeg:
        """Twilio's codec under this provider's name; no call control."""
        return TextMediaLeg(websocket, TwilioStreamCodec(provider=PROVIDER), None)

    def stream_params(self, started: StreamStarted, state: GatewayState) -> StreamParams:
        """The parameters ``POST /phone/calls`` gave the page."""
        return custom_stream_params(started, state)

    def sniff(self, first_message: str | bytes) -> bool:
        """Never: the page dials its own path (its frames are Twilio's)."""
        return False
