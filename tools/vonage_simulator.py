"""A Vonage simulator: places calls into a gateway the way Vonage's websockets do.

It speaks Vonage's side of docs/PROVIDERS.md §3: the answer webhook as a GET
signed with an HS256 JWT (``Authorization: Bearer``, claims with ``payload_hash``),
the NCCO's ``connect`` followed to its websocket ``uri`` with a signed handshake,
``websocket:connected`` (the NCCO's headers flattened into it) as the first text
frame, then the caller's audio as **binary** 20 ms frames of L16 at 16 kHz, DTMF
as ``websocket:dtmf``; on the way back, binary audio played in order, each
``notify`` answered by ``websocket:notify`` once the audio before it has played,
``clear`` flushing the queue and answered by ``websocket:cleared``; the call ends
with the socket closing.

Pacing, the caller's playback model and every measurement are the Twilio
simulator's (``tools/twilio_simulator.py``), which works in 8 kHz μ-law: the
caller's frames are resampled to 16 kHz on the way out and the gateway's back to
8 kHz (``media/polyphase.py``, one stateful resampler each way per call, whose
output of a 20 ms frame is always 20 ms long).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any
from urllib.parse import urlencode

import httpx
from websockets.asyncio.client import ClientConnection, connect

from rutster.media.g711 import ulaw_decode
from rutster.media.polyphase import PolyphaseResampler
from rutster.tools.twilio_simulator import (
    WEBHOOK_TIMEOUT_S,
    StreamInstructions,
    TwilioSimulator,
)
from rutster.trunk.vonage.codec import CONTENT_TYPE
from rutster.trunk.vonage.signature import VonageJwt

__all__ = ["VonageSimulator", "new_call_uuid"]

#: Vonage's wire rate in our NCCO (``audio/l16;rate=16000``) and the simulator's own.
WIRE_RATE = 16_000
SIM_RATE = 8_000


def new_call_uuid() -> str:
    """A call ``uuid`` as Vonage issues them (§3.1)."""
    return str(uuid.uuid4())


class VonageSimulator(TwilioSimulator):
    """Places simulated Vonage calls into a gateway reachable at ``public_url``.

    ``signature_secret`` signs the webhooks and the handshake (the gateway's
    ``VONAGE_SIGNATURE_SECRET``); None sends them unsigned.
    """

    echoes_cleared_marks = False

    def __init__(self, public_url: str, *, signature_secret: str | None = None) -> None:
        super().__init__(public_url, account_sid=secrets.token_hex(4))
        self.jwt = VonageJwt(signature_secret) if signature_secret else None
        self._up = PolyphaseResampler(SIM_RATE, WIRE_RATE)
        self._down = PolyphaseResampler(WIRE_RATE, SIM_RATE)

    def voice_url(self, query: str = "") -> str:
        """The gateway's answer URL, with ``query`` (as configured on the application)."""
        return f"{self.public_url}/vonage/answer" + (f"?{query}" if query else "")

    def _authorization(self, body: bytes | None) -> dict[str, str]:
        if self.jwt is None:
            return {}
        return {"Authorization": self.jwt.sign(body, now_s=time.time())}

    async def post_webhook(
        self, url: str, call_sid: str, *, from_: str, to: str, direction: str
    ) -> httpx.Response:
        """GET the answer URL as Vonage does by default (``call_sid`` is the ``uuid``)."""
        query = urlencode(
            {
                "to": to,
                "from": from_,
                "uuid": call_sid,
                "conversation_uuid": "CON-" + call_sid,
                "direction": "inbound" if direction == "inbound" else "outbound",
            }
        )
        full = url + ("&" if "?" in url else "?") + query
        async with httpx.AsyncClient(
            timeout=WEBHOOK_TIMEOUT_S, verify=url.startswith("https://")
        ) as client:
            return await client.get(full, headers=self._authorization(b""))

    def _parse_answer(self, document: str) -> StreamInstructions:
        """The NCCO's websocket endpoint: its ``uri`` and its ``headers``."""
        for action in json.loads(document):
            if action.get("action") == "connect":
                endpoint = action["endpoint"][0]
                if endpoint.get("content-type") != CONTENT_TYPE:
                    raise ValueError(f"the NCCO asks for {endpoint.get('content-type')!r}")
                return StreamInstructions(url=endpoint["uri"], parameters=endpoint["headers"])
        raise ValueError("the NCCO has no connect action")

    async def connect_media(self, instructions: StreamInstructions) -> ClientConnection:
        """Open the websocket with a signed handshake (``authorization: vonage``)."""
        return await connect(
            instructions.url,
            additional_headers=self._authorization(None),
            max_size=2**20,
            compression=None,
        )

    def _parse_outgoing(self, raw: str | bytes) -> tuple[str, str | bytes]:
        if isinstance(raw, bytes):
            return "media", self._down.process(raw)
        message: dict[str, Any] = json.loads(raw)
        action = str(message.get("action"))
        if action == "notify":
            return "mark", str(message["payload"]["name"])
        return action, ""

    def _after_clear(self, stream_sid: str) -> list[str]:
        return [json.dumps({"event": "websocket:cleared"})]

    # ---- Vonage's wire -----------------------------------------------------

    def _connected_message(self) -> str | None:
        return None  # websocket:connected is the start

    def _start_message(
        self, stream_sid: str, call_sid: str, instructions: StreamInstructions
    ) -> str:
        self._up.reset()
        self._down.reset()
        return json.dumps(
            {"event": "websocket:connected", "content-type": CONTENT_TYPE}
            | dict(instructions.parameters)
        )

    def _media_message(
        self, stream_sid: str, seq: int, chunk: int, timestamp_ms: int, mulaw: bytes
    ) -> str | bytes:
        return self._up.process(ulaw_decode(mulaw))

    def _dtmf_message(self, stream_sid: str, seq: int, digit: str) -> str:
        return json.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 260})

    def _stop_message(self, stream_sid: str, seq: int, call_sid: str) -> str | None:
        return None  # the call ends with the socket

    def _mark_message(self, stream_sid: str, name: str) -> str:
        return json.dumps({"event": "websocket:notify", "payload": {"name": name}})
