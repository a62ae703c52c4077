"""A Telnyx simulator: places calls into a gateway the way Telnyx's TeXML does.

It speaks Telnyx's side of docs/PROVIDERS.md §2: the TeXML voice webhook as a
signed form post (Ed25519 over ``"{timestamp}|{body}"``, the headers
``telnyx-signature-ed25519`` and ``telnyx-timestamp``), then the media socket named
by the answer's ``<Connect><Stream url>``, with Telnyx's snake_case messages
(``connected`` with a version, ``start`` with ``stream_id`` and
``start.call_control_id``, ``media`` with ``chunk``/``timestamp``, ``dtmf``,
``stop``), marks echoed once the audio before them has played, and ``clear``
flushing the queue. With ``reorder_every`` it delivers media out of order, as
Telnyx may (§2.3): every so many frames, two consecutive frames swap places.

Pacing, the caller's playback model and every measurement are the Twilio
simulator's (``tools/twilio_simulator.py``), whose wire methods this subclass
overrides: TeXML is Twilio-compatible by design, and so is the call flow.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from urllib.parse import urlencode

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.asyncio.client import ClientConnection, connect

from rutster.tools.twilio_simulator import (
    WEBHOOK_CALL_STATUS,
    WEBHOOK_TIMEOUT_S,
    StreamInstructions,
    TwilioSimulator,
)
from rutster.trunk.telnyx.signature import TelnyxWebhookSigner

__all__ = ["TelnyxSimulator", "new_call_control_id"]

#: Telnyx's media-streaming protocol version in ``connected`` (§2.3 example).
PROTOCOL_VERSION = "1.0.0"


def new_call_control_id() -> str:
    """A Call Control id shaped like Telnyx's (``v3:`` and URL-safe characters, §2.3)."""
    return "v3:" + secrets.token_urlsafe(40)


class TelnyxSimulator(TwilioSimulator):
    """Places simulated Telnyx calls into a gateway reachable at ``public_url``.

    ``signer`` signs the webhooks (its public key is what the gateway's
    ``TELNYX_PUBLIC_KEY`` must hold); None sends them unsigned. ``reorder_every``:
    swap two consecutive media frames every that many frames (None: in order).
    """

    def __init__(
        self,
        public_url: str,
        *,
        signer: TelnyxWebhookSigner | None = None,
        reorder_every: int | None = None,
    ) -> None:
        super().__init__(public_url, account_sid=secrets.token_hex(16))
        if reorder_every is not None and reorder_every < 2:
            raise ValueError("reorder_every must be at least 2 (a pair swaps)")
        self.signer = signer
        self.reorder_every = reorder_every
        self._held: str | bytes | None = None
        self._sent_media = 0
        #: Media frames this simulator sent out of order.
        self.frames_swapped = 0

    @staticmethod
    def new_signer() -> TelnyxWebhookSigner:
        """A fresh key pair, as an account's (its public key goes in ``TELNYX_PUBLIC_KEY``)."""
        return TelnyxWebhookSigner(Ed25519PrivateKey.generate())

    def voice_url(self, query: str = "") -> str:
        """The gateway's TeXML voice URL, with ``query`` (as configured on the number)."""
        return f"{self.public_url}/telnyx/voice" + (f"?{query}" if query else "")

    async def post_webhook(
        self, url: str, call_sid: str, *, from_: str, to: str, direction: str
    ) -> httpx.Response:
        """POST the TeXML voice webhook (form fields, Ed25519-signed as sent).

        ``call_sid`` is the call's ``CallControlId`` (what the stream's ``start``
        repeats); the TeXML ``CallSid`` is derived from it.
        """
        if direction not in WEBHOOK_CALL_STATUS:
            raise ValueError(f"direction must be one of {sorted(WEBHOOK_CALL_STATUS)}")
        fields = {
            "AccountSid": self.account_sid,
            "CallSid": "tx-" + call_sid.removeprefix("v3:")[:32],
            "CallControlId": call_sid,
            "CallStatus": WEBHOOK_CALL_STATUS[direction],
            "Direction": direction,
            "From": from_,
            "To": to,
        }
        body = urlencode(fields).encode("ascii")  # the bytes Telnyx signs and sends
        headers = {"content-type": "application/x-www-form-urlencoded"}
        if self.signer is not None:
            headers |= self.signer.headers(body, now_s=time.time())
        async with httpx.AsyncClient(
            timeout=WEBHOOK_TIMEOUT_S, verify=url.startswith("https://")
        ) as client:
            return await client.post(url, content=body, headers=headers)

    async def connect_media(self, instructions: StreamInstructions) -> ClientConnection:
        """Open the media WebSocket; Telnyx signs no upgrade."""
        return await connect(instructions.url, max_size=2**20, compression=None)

    # ---- Telnyx's wire -----------------------------------------------------

    def _connected_message(self) -> str:
        return json.dumps({"event": "connected", "version": PROTOCOL_VERSION})

    def _start_message(
        self, stream_sid: str, call_sid: str, instructions: StreamInstructions
    ) -> str:
        self._held = None
        self._sent_media = 0
        return json.dumps(
            {
                "event": "start",
                "sequence_number": "1",
                "stream_id": stream_sid,
                "start": {
                    "user_id": self.account_sid,
                    "call_control_id": call_sid,
                    "call_session_id": secrets.token_hex(16),
                    "from": "+15551230000",
                    "to": "+15559870000",
                    "client_state": "",
                    "custom_parameters": [
                        {"name": k, "value": v} for k, v in instructions.parameters.items()
                    ],
                    "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
                },
            }
        )

    def _media_message(
        self, stream_sid: str, seq: int, chunk: int, timestamp_ms: int, mulaw: bytes
    ) -> str | bytes:
        return json.dumps(
            {
                "event": "media",
                "sequence_number": str(seq),
                "stream_id": stream_sid,
                "media": {
                    "track": "inbound",
                    "chunk": str(chunk),
                    "timestamp": str(timestamp_ms),
                    "payload": base64.b64encode(mulaw).decode("ascii"),
                },
            }
        )

    def _stop_message(self, stream_sid: str, seq: int, call_sid: str) -> str:
        return json.dumps(
            {
                "event": "stop",
                "sequence_number": str(seq),
                "stream_id": stream_sid,
                "stop": {"user_id": self.account_sid, "call_control_id": call_sid},
            }
        )

    def _dtmf_message(self, stream_sid: str, seq: int, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequence_number": str(seq),
                "stream_id": stream_sid,
                "occurred_at": "2026-12-06T00:00:00.000000Z",
                "dtmf": {"digit": digit},
            }
        )

    def _mark_message(self, stream_sid: str, name: str) -> str:
        return json.dumps({"event": "mark", "stream_id": stream_sid, "mark": {"name": name}})

    async def _send_media(self, ws: ClientConnection, message: str | bytes) -> None:
        """In order, or every ``reorder_every`` frames one held and sent after the next."""
        self._sent_media += 1
        if self._held is not None:
            await ws.send(message)
            await ws.send(self._held)
            self._held = None
            self.frames_swapped += 2
            return
        if self.reorder_every is not None and self._sent_media % self.reorder_every == 0:
            self._held = message
            return
        await ws.send(message)

    async def _flush_media(self, ws: ClientConnection) -> None:
        if self._held is not None:
            await ws.send(self._held)
            self._held = None
