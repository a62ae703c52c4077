"""Telnyx call control over its API v2: place a TeXML call, hang up or transfer a call.

``POST {base}/texml/calls/{connection_id}`` with ``From``, ``To`` and ``Url`` places
an outbound call through a TeXML application: Telnyx dials ``To`` and, once
answered, fetches TeXML from ``Url`` (our voice webhook); the answer is a flat call
object whose ``call_sid`` is the new call's ``call_control_id`` (telnyx-python
``resources/texml/calls.py`` ``create`` and ``types/texml/call_create_response.py``).
``POST {base}/calls/{call_control_id}/actions/hangup`` ends a call, ringing or
answered;
``POST {base}/calls/{call_control_id}/actions/transfer`` with ``{"to": ...}``
connects the caller elsewhere (docs/PROVIDERS.md §2.1; paths and fields as the
Telnyx SDK's ``calls.actions.hangup`` and ``calls.actions.transfer`` send them,
telnyx-python ``resources/calls/actions.py``). ``Authorization: Bearer <API key>``,
JSON bodies. The ``call_control_id`` is the one the media stream's ``start``
carries. A hang-up of a call that already ended answers 422 with error code
``90018`` (§2.1).

Every failure is a :class:`TelnyxCallControlError` with a stable ``reason``
(``already_ended``, ``auth_failed``, ``bad_call_id``, ``bad_destination``,
``bad_request``, ``bad_config``, ``bad_response``, ``timeout``, ``network``,
``http_error``, ``closed``). The API key never appears
in a message, a log line or ``repr``.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import quote, urlsplit

import httpx

from rutster.protocols.call_control import (
    CHANNEL_COMPLETED,
    CHANNEL_TRANSFERRING,
    RestCallControlError,
)
from rutster.trunk.rest_call_control import (
    E164,
    callable_destination,
    checked_response,
    webhook_url_ok,
)

__all__ = [
    "TELNYX_API_BASE_URL",
    "TelnyxCallControl",
    "TelnyxCallControlError",
]

#: The Call Control API's base URL (docs/PROVIDERS.md §2.1; telnyx-python's default
#: ``base_url``).
TELNYX_API_BASE_URL = "https://api.telnyx.com/v2"
#: Whole-request deadline. Seed decision, as Twilio's (trunk/twilio/call_control.py):
#: a hang-up must not stall a call's teardown for longer than a caller would notice.
DEFAULT_TIMEOUT_S = 5.0
#: A ``call_control_id`` as Telnyx issues them (``v3:`` and URL-safe characters, §2.3
#: example); checked before any request, so nothing else reaches the URL path.
CALL_CONTROL_ID_PATTERN = re.compile(r"[A-Za-z0-9:_\-]{1,128}")
#: Telnyx error code of a command on a call that has already ended (§2.1).
CODE_ALREADY_ENDED = "90018"
_HTTP_NOT_FOUND = 404
_HTTP_UNPROCESSABLE = 422


class TelnyxCallControlError(RestCallControlError):
    """A Telnyx Call Control request failed (see the module docstring for reasons)."""


class TelnyxCallControl:
    """Hangs up and transfers Telnyx calls (:class:`~protocols.call_control.ProviderCallControl`).

    Raises :class:`TelnyxCallControlError` (``bad_config``) at construction for an
    empty key or a base URL that is not http(s).
    """

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = TELNYX_API_BASE_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not api_key.strip():
            raise TelnyxCallControlError("bad_config", "the Telnyx API key is empty")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise TelnyxCallControlError("bad_config", "the Telnyx API base URL is not http(s)")
        self._base = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key.strip()}", "Accept": "application/json"},
            timeout=timeout_s,
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"TelnyxCallControl(base_url={self._base!r})"  # never the key

    async def aclose(self) -> None:
        """Close the HTTP client; later requests fail with ``closed``."""
        self._closed = True
        await self._client.aclose()

    async def hang_up(self, call_id: str) -> str:
        """End the call; ``completed``. A call already over raises ``already_ended``."""
        await self._action(call_id, "hangup", {})
        return CHANNEL_COMPLETED

    async def transfer(self, call_id: str, destination: str) -> str:
        """Connect the caller to ``destination`` (E.164 or SIP URI); ``transferring``."""
        if not callable_destination(destination):
            raise TelnyxCallControlError(
                "bad_destination", "the destination is neither E.164 nor a SIP URI"
            )
        await self._action(call_id, "transfer", {"to": destination})
        return CHANNEL_TRANSFERRING

    async def create_texml_call(self, connection_id: str, *, to: str, from_: str, url: str) -> str:
        """Place a call through the TeXML application ``connection_id``; Telnyx fetches
        ``url`` (POST) once it is answered. Returns the call's ``call_control_id``."""
        if not CALL_CONTROL_ID_PATTERN.fullmatch(connection_id):
            raise TelnyxCallControlError("bad_config", "malformed TeXML connection id")
        if not E164.fullmatch(to) or not E164.fullmatch(from_):
            raise TelnyxCallControlError("bad_request", "to and from must be E.164 numbers")
        if not webhook_url_ok(url):
            raise TelnyxCallControlError("bad_request", "the answer URL is not http(s)")
        body = {"From": from_, "To": to, "Url": url, "Method": "POST"}
        response = await self._post(f"/texml/calls/{quote(connection_id, safe='')}", body, "dial")
        try:
            created = response.json()
        except ValueError:
            created = None
        sid = created.get("call_sid") if isinstance(created, dict) else None
        if not isinstance(sid, str) or not CALL_CONTROL_ID_PATTERN.fullmatch(sid):
            raise TelnyxCallControlError(
                "bad_response", "the created call has no call_sid", status_code=response.status_code
            )
        return sid

    async def _action(self, call_id: str, action: str, body: dict[str, str]) -> None:
        if not CALL_CONTROL_ID_PATTERN.fullmatch(call_id):
            raise TelnyxCallControlError("bad_call_id", "malformed call_control_id")
        # command_id: Telnyx ignores a repeat of the same command on the same call (§2.1),
        # so a retried request cannot act twice.
        payload = {**body, "command_id": secrets.token_hex(16)}
        await self._post(f"/calls/{quote(call_id, safe='')}/actions/{action}", payload, action)

    async def _post(self, path: str, payload: dict[str, str], what: str) -> httpx.Response:
        if self._closed:
            raise TelnyxCallControlError("closed", "the client was closed")
        return await checked_response(
            self._client.post(self._base + path, json=payload),
            what,
            TelnyxCallControlError,
            credentials_refused="Telnyx refused the API key",
            call_over=lambda response: what != "dial" and _call_over(response),
        )


def _call_over(response: httpx.Response) -> bool:
    """Telnyx's signs that a command's call is gone: 404, or 422 with code 90018 (§2.1)."""
    return response.status_code == _HTTP_NOT_FOUND or (
        response.status_code == _HTTP_UNPROCESSABLE and CODE_ALREADY_ENDED in _error_codes(response)
    )


def _error_codes(response: httpx.Response) -> set[str]:
    """Telnyx's error codes in a failed answer (``{"errors": [{"code": ...}]}``)."""
    try:
        body = response.json()
    except ValueError:
        return set()
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list):
        return set()
    return {str(e.get("code")) for e in errors if isinstance(e, dict)}
