"""A Plivo simulator: places calls into a gateway the way Plivo's audio streams do.

It speaks Plivo's side of docs/PROVIDERS.md §4: the answer webhook as a form post
signed with signature V3 (``X-Plivo-Signature-V3`` and its nonce, HMAC-SHA256 with
the auth token), then the socket named by the answer's ``<Stream>`` text, with
Plivo's camelCase messages (no ``connected``; ``start`` with ``callId`` and
``streamId``; ``media`` with numeric ``chunk``; ``dtmf``), ``playAudio`` played
in order, each ``checkpoint`` answered by ``playedStream`` once the audio before
it has played, ``clearAudio`` flushing the queue and answered by ``clearedAudio``
(checkpoints whose audio never played do not come back, §4.4), and the end of the
call as the socket closing, with no ``stop``.

Pacing, the caller's playback model and every measurement are the Twilio
simulator's (``tools/twilio_simulator.py``), whose wire methods this subclass
overrides.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect

from rutster.media.g711 import ulaw_decode
from rutster.tools.twilio_simulator import (
    WEBHOOK_CALL_STATUS,
    WEBHOOK_TIMEOUT_S,
    StreamInstructions,
    TwilioSimulator,
)
from rutster.trunk.plivo.signature import NONCE_HEADER, SIGNATURE_HEADER, PlivoSignatureV3

__all__ = ["PlivoSimulator", "new_call_uuid"]


def new_call_uuid() -> str:
    """A ``CallUUID`` as Plivo issues them (a UUID, §4.1)."""
    return str(uuid.uuid4())


class PlivoSimulator(TwilioSimulator):
    """Places simulated Plivo calls into a gateway reachable at ``public_url``.

    ``auth_token`` signs the webhooks (the gateway's ``PLIVO_AUTH_TOKEN``); None sends
    them unsigned.
    """

    echoes_cleared_marks = False

    def __init__(self, public_url: str, *, auth_token: str | None = None) -> None:
        super().__init__(public_url, account_sid="MA" + secrets.token_hex(9).upper())
        self.signature = PlivoSignatureV3(auth_token) if auth_token else None
        #: ``CallUUID`` → the ``request_uuid`` that placed it (outbound calls).
        self.request_uuids: dict[str, str] = {}

    def voice_url(self, query: str = "") -> str:
        """The gateway's answer URL, with ``query`` (as configured on the application)."""
        return f"{self.public_url}/plivo/answer" + (f"?{query}" if query else "")

    async def post_webhook(
        self, url: str, call_sid: str, *, from_: str, to: str, direction: str
    ) -> httpx.Response:
        """POST the answer webhook (``call_sid`` is the ``CallUUID``), V3-signed."""
        if direction not in WEBHOOK_CALL_STATUS:
            raise ValueError(f"direction must be one of {sorted(WEBHOOK_CALL_STATUS)}")
        fields = {
            "CallUUID": call_sid,
            "From": from_,
            "To": to,
            "Direction": "inbound" if direction == "inbound" else "outbound",
            "CallStatus": WEBHOOK_CALL_STATUS[direction],
        }
        request_uuid = self.request_uuids.get(call_sid)
        if request_uuid is not None:  # a call placed over REST names the request
            fields["RequestUUID"] = request_uuid
        headers = {"content-type": "application/x-www-form-urlencoded"}
        if self.signature is not None:
            nonce = str(int(time.time() * 1000)) + secrets.token_hex(4)
            headers[NONCE_HEADER] = nonce
            headers[SIGNATURE_HEADER] = self.signature.compute("POST", url, fields, nonce)
        async with httpx.AsyncClient(
            timeout=WEBHOOK_TIMEOUT_S, verify=url.startswith("https://")
        ) as client:
            return await client.post(url, content=urlencode(fields), headers=headers)

    def _parse_answer(self, document: str) -> StreamInstructions:
        """``<Stream>``'s text is the socket URL; its query holds the parameters."""
        stream = ET.fromstring(document).find("./Stream")
        if stream is None or not (stream.text or "").strip():
            raise ValueError("the answer has no <Stream>wss://...</Stream>")
        url = (stream.text or "").strip()
        return StreamInstructions(url=url, parameters=dict(parse_qsl(urlsplit(url).query)))

    async def connect_media(self, instructions: StreamInstructions) -> ClientConnection:
        """Open the media WebSocket; Plivo signs no upgrade."""
        return await connect(instructions.url, max_size=2**20, compression=None)

    def _parse_outgoing(self, raw: str | bytes) -> tuple[str, str | bytes]:
        message: dict[str, Any] = json.loads(raw)
        event = str(message.get("event"))
        if event == "playAudio":
            return "media", ulaw_decode(base64.b64decode(message["media"]["payload"]))
        if event == "checkpoint":
            return "mark", str(message["name"])
        if event == "clearAudio":
            return "clear", ""
        return event, ""

    def _after_clear(self, stream_sid: str) -> list[str]:
        return [json.dumps({"event": "clearedAudio", "streamId": stream_sid})]

    # ---- Plivo's wire ------------------------------------------------------

    def _connected_message(self) -> str | None:
        return None  # Plivo's socket opens with start (§4.3)

    def _start_message(
        self, stream_sid: str, call_sid: str, instructions: StreamInstructions
    ) -> str:
        return json.dumps(
            {
                "event": "start",
                "sequenceNumber": 1,
                "start": {
                    "callId": call_sid,
                    "streamId": stream_sid,
                    "accountId": self.account_sid,
                    "tracks": ["inbound"],
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
                },
            }
        )

    def _media_message(
        self, stream_sid: str, seq: int, chunk: int, timestamp_ms: int, mulaw: bytes
    ) -> str | bytes:
        return json.dumps(
            {
                "event": "media",
                "sequenceNumber": seq,
                "streamId": stream_sid,
                "media": {
                    "track": "inbound",
                    "chunk": chunk,
                    "timestamp": str(int(time.time() * 1000)),
                    "payload": base64.b64encode(mulaw).decode("ascii"),
                },
            }
        )

    def _dtmf_message(self, stream_sid: str, seq: int, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequenceNumber": seq,
                "streamId": stream_sid,
                "dtmf": {"track": "inbound", "digit": digit, "timestamp": "0"},
            }
        )

    def _stop_message(self, stream_sid: str, seq: int, call_sid: str) -> str | None:
        return None  # the stream ends with the socket (§4.3)

    def _mark_message(self, stream_sid: str, name: str) -> str:
        return json.dumps({"event": "playedStream", "streamId": stream_sid, "name": name})
