"""Vonage call control over the Voice API: place a call, hang one up, transfer one.

``POST {base}/v1/calls`` places a call: ``to`` and ``from`` phone endpoints, the
``answer_url`` Vonage fetches the NCCO from once the callee answers and the
``event_url``; the answer's ``uuid`` is the call's (docs/PROVIDERS.md §3.5; body as
the vonage-voice SDK's ``CreateCallRequest`` dumps it, numbers without the ``+``).
``PUT {base}/v1/calls/{uuid}`` with ``{"action": "hangup"}`` ends a call, ringing or
answered (§3.5; path and body as vonage-voice's ``Voice.hangup``), and with
``{"action": "transfer", "destination": {"type": "ncco", "ncco": [...]}}`` moves it to
an NCCO ``connect`` to the destination (vonage-voice's ``transfer_call_ncco``).
Authentication is an application JWT: RS256 with the application's private key,
claims ``application_id``, ``iat``, ``jti`` and ``exp`` (§3.5), made per request
with PyJWT.

Failures are :class:`VonageCallControlError` with a stable ``reason``
(``already_ended``, ``auth_failed``, ``bad_call_id``, ``bad_request``, ``bad_response``,
``bad_destination``, ``timeout``, ``network``, ``http_error``, ``closed``, ``bad_config``);
the private key never appears in a message, a log line or ``repr``.
"""

from __future__ import annotations

import re
import secrets
import time
from urllib.parse import quote, urlsplit

import httpx
import jwt

from rutster.protocols.call_control import (
    CHANNEL_COMPLETED,
    CHANNEL_TRANSFERRING,
    RestCallControlError,
)
from rutster.trunk.rest_call_control import E164, SIP_URI, checked_response, webhook_url_ok

__all__ = ["VONAGE_API_BASE_URL", "VonageCallControl", "VonageCallControlError"]

#: The Voice API's host (§3.5; vonage-node-sdk's default ``apiHost``).
VONAGE_API_BASE_URL = "https://api.nexmo.com"
#: Whole-request deadline. Seed decision, as Twilio's (trunk/twilio/call_control.py).
DEFAULT_TIMEOUT_S = 5.0
#: Lifetime of an application JWT (seed decision: one request's worth; Vonage's SDKs
#: default to 15 minutes, a shorter token leaks less).
TOKEN_TTL_S = 60
#: A call ``uuid`` (a UUID) or application id: checked before any request.
ID_PATTERN = re.compile(r"[A-Za-z0-9\-]{1,64}")
#: Vonage's answer for a call that is over (no such live call) or gone.
_ENDED_STATUSES = frozenset({400, 404})


class VonageCallControlError(RestCallControlError):
    """A Vonage Voice API request failed (see the module docstring for reasons)."""


class VonageCallControl:
    """Hangs up Vonage calls (:class:`~protocols.call_control.ProviderCallControl`)."""

    def __init__(
        self,
        application_id: str,
        private_key_pem: str,
        *,
        base_url: str = VONAGE_API_BASE_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not ID_PATTERN.fullmatch(application_id) or "PRIVATE KEY" not in private_key_pem:
            raise VonageCallControlError(
                "bad_config", "malformed application id or not a PEM private key"
            )
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise VonageCallControlError("bad_config", "the Vonage API base URL is not http(s)")
        self._application_id = application_id
        self._key = private_key_pem
        self._base = base_url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._closed = False
        self._own_numbers: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"VonageCallControl(application_id={self._application_id!r})"  # never the key

    def token(self, now_s: float) -> str:
        """An application JWT for one request (RS256)."""
        claims = {
            "application_id": self._application_id,
            "iat": int(now_s),
            "exp": int(now_s) + TOKEN_TTL_S,
            "jti": secrets.token_hex(16),
        }
        return jwt.encode(claims, self._key, algorithm="RS256")

    async def aclose(self) -> None:
        """Close the HTTP client; later requests fail with ``closed``."""
        self._closed = True
        await self._client.aclose()

    async def create_call(self, *, to: str, from_: str, answer_url: str, event_url: str) -> str:
        """Place a call from ``from_`` to ``to`` (E.164); Vonage fetches ``answer_url``
        (GET) once it is answered. Returns the call's ``uuid``."""
        if not E164.fullmatch(to) or not E164.fullmatch(from_):
            raise VonageCallControlError("bad_request", "to and from must be E.164 numbers")
        for url in (answer_url, event_url):
            if not webhook_url_ok(url):
                raise VonageCallControlError("bad_request", "the webhook URLs must be http(s)")
        body: dict[str, object] = {
            "to": [{"type": "phone", "number": to.removeprefix("+")}],
            "from": {"type": "phone", "number": from_.removeprefix("+")},
            "answer_url": [answer_url],
            "answer_method": "GET",
            "event_url": [event_url],
        }
        response = await self._request("POST", "/v1/calls", body, "dial")
        try:
            created = response.json()
        except ValueError:
            created = None
        uuid = created.get("uuid") if isinstance(created, dict) else None
        if not isinstance(uuid, str) or not ID_PATTERN.fullmatch(uuid):
            raise VonageCallControlError(
                "bad_response", "the created call has no uuid", status_code=response.status_code
            )
        return uuid

    async def hang_up(self, call_id: str) -> str:
        """End the call; ``completed``. A call already over raises ``already_ended``."""
        if not ID_PATTERN.fullmatch(call_id):
            raise VonageCallControlError("bad_call_id", "malformed call uuid")
        await self._request("PUT", f"/v1/calls/{quote(call_id)}", {"action": "hangup"}, "hang-up")
        return CHANNEL_COMPLETED

    async def _request(
        self, method: str, path: str, body: dict[str, object], what: str
    ) -> httpx.Response:
        if self._closed:
            raise VonageCallControlError("closed", "the client was closed")
        try:
            token = self.token(time.time())
        except (ValueError, TypeError, jwt.PyJWTError):
            raise VonageCallControlError("bad_config", "the private key cannot sign") from None
        return await checked_response(
            self._client.request(
                method, self._base + path, json=body, headers={"Authorization": f"Bearer {token}"}
            ),
            what,
            VonageCallControlError,
            credentials_refused="Vonage refused the application token",
            call_over=lambda response: (
                what == "hang-up" and response.status_code in _ENDED_STATUSES
            ),
        )

    def remember_number(self, call_id: str, own_number: str) -> None:
        """The call's number of ours (the caller ID a transfer presents), while it lasts."""
        self._own_numbers[call_id] = own_number.removeprefix("+")

    def forget_number(self, call_id: str) -> None:
        """The call is over."""
        self._own_numbers.pop(call_id, None)

    async def transfer(self, call_id: str, destination: str) -> str:
        """Connect the caller to ``destination`` (E.164 or a SIP URI): the call is moved
        to an NCCO ``connect`` (vonage-voice's ``transfer_call_ncco``), presenting the
        call's number of ours as the caller ID when known; ``transferring``."""
        if not ID_PATTERN.fullmatch(call_id):
            raise VonageCallControlError("bad_call_id", "malformed call uuid")
        if E164.fullmatch(destination):
            endpoint: dict[str, str] = {"type": "phone", "number": destination.removeprefix("+")}
        elif SIP_URI.fullmatch(destination):
            endpoint = {"type": "sip", "uri": destination}
        else:
            raise VonageCallControlError(
                "bad_destination", "the destination is neither E.164 nor a SIP URI"
            )
        connect: dict[str, object] = {"action": "connect", "endpoint": [endpoint]}
        own = self._own_numbers.get(call_id)
        if own:
            connect["from"] = own
        body: dict[str, object] = {
            "action": "transfer",
            "destination": {"type": "ncco", "ncco": [connect]},
        }
        await self._request("PUT", f"/v1/calls/{quote(call_id)}", body, "transfer")
        return CHANNEL_TRANSFERRING
