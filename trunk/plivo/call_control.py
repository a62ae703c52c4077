"""Plivo call control over its REST API: place a call, hang one up, transfer one.

HTTP Basic ``auth_id:auth_token``, JSON bodies, paths and fields as plivo-python's
``calls`` resource sends them (docs/PROVIDERS.md §4.4):

- ``POST {base}/v1/Account/{auth_id}/Call/`` with ``from``, ``to``, ``answer_url`` and
  ``answer_method`` places a call (``calls.create``); the answer's ``request_uuid``
  names the request, and Plivo's answer webhook for it carries the call's own
  ``CallUUID``;
- ``DELETE {base}/v1/Account/{auth_id}/Call/{call_uuid}/`` ends a call: ``204`` when it
  did, ``404`` when the call is already over (``calls.delete``);
- ``POST {base}/v1/Account/{auth_id}/Call/{call_uuid}/`` with ``legs: "aleg"`` and an
  ``aleg_url`` transfers the caller: Plivo fetches new XML (a ``<Dial>``) from that
  URL (``calls.transfer``). The gateway serves that XML (``/plivo/transfer``); this
  client is given how to make its URL.

Failures are :class:`PlivoCallControlError` with a stable ``reason``
(``already_ended``, ``auth_failed``, ``bad_call_id``, ``bad_destination``,
``bad_request``, ``bad_response``, ``timeout``, ``network``, ``http_error``,
``closed``, ``bad_config``); the auth token never appears in a message, a log line
or ``repr``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
    "PLIVO_API_BASE_URL",
    "PlivoCallControl",
    "PlivoCallControlError",
]

#: Plivo's API host (plivo-python ``PLIVO_API``, ``API_VOICE``).
PLIVO_API_BASE_URL = "https://api.plivo.com"
#: Whole-request deadline. Seed decision, as Twilio's (trunk/twilio/call_control.py).
DEFAULT_TIMEOUT_S = 5.0
#: A Plivo ``CallUUID`` (a UUID) or account ``auth_id`` (``MA``/``SA`` + 18 characters):
#: checked before any request so nothing else reaches the URL path.
ID_PATTERN = re.compile(r"[A-Za-z0-9\-]{1,64}")
_HTTP_NOT_FOUND = 404


class PlivoCallControlError(RestCallControlError):
    """A Plivo REST request failed (see the module docstring for reasons)."""


class PlivoCallControl:
    """Places, hangs up and transfers Plivo calls (``ProviderCallControl``).

    ``transfer_url(destination)``: the URL of the gateway's ``<Dial>`` XML for a
    transfer (None: transfer is not offered).
    """

    def __init__(
        self,
        auth_id: str,
        auth_token: str,
        *,
        base_url: str = PLIVO_API_BASE_URL,
        transfer_url: Callable[[str], str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not ID_PATTERN.fullmatch(auth_id) or not auth_token:
            raise PlivoCallControlError("bad_config", "malformed auth id or empty auth token")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PlivoCallControlError("bad_config", "the Plivo API base URL is not http(s)")
        self._account = f"{base_url.rstrip('/')}/v1/Account/{auth_id}"
        self._transfer_url = transfer_url
        self._client = httpx.AsyncClient(
            auth=(auth_id, auth_token), timeout=timeout_s, headers={"Accept": "application/json"}
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"PlivoCallControl(account={self._account!r})"  # never the token

    async def aclose(self) -> None:
        """Close the HTTP client; later requests fail with ``closed``."""
        self._closed = True
        await self._client.aclose()

    async def create_call(self, *, to: str, from_: str, answer_url: str) -> str:
        """Place a call; Plivo POSTs ``answer_url`` once it is answered. Returns the
        request's ``request_uuid``."""
        if not E164.fullmatch(to) or not E164.fullmatch(from_):
            raise PlivoCallControlError("bad_request", "to and from must be E.164 numbers")
        if not webhook_url_ok(answer_url):
            raise PlivoCallControlError("bad_request", "the answer URL is not http(s)")
        body = {"from": from_, "to": to, "answer_url": answer_url, "answer_method": "POST"}
        response = await self._request("POST", "/Call/", body, "dial")
        try:
            created = response.json()
        except ValueError:
            created = None
        request_uuid = created.get("request_uuid") if isinstance(created, dict) else None
        if isinstance(request_uuid, list) and request_uuid:  # one per destination
            request_uuid = request_uuid[0]
        if not isinstance(request_uuid, str) or not ID_PATTERN.fullmatch(request_uuid):
            raise PlivoCallControlError(
                "bad_response",
                "the placed call has no request_uuid",
                status_code=response.status_code,
            )
        return request_uuid

    async def hang_up(self, call_id: str) -> str:
        """End the call; ``completed``. A call already over raises ``already_ended``."""
        if not ID_PATTERN.fullmatch(call_id):
            raise PlivoCallControlError("bad_call_id", "malformed CallUUID")
        await self._request("DELETE", f"/Call/{quote(call_id)}/", None, "hang-up")
        return CHANNEL_COMPLETED

    async def transfer(self, call_id: str, destination: str) -> str:
        """Send the caller to the gateway's ``<Dial>`` of ``destination``; ``transferring``."""
        if self._transfer_url is None:
            raise PlivoCallControlError("not_supported", "transfer needs the gateway's URL")
        if not ID_PATTERN.fullmatch(call_id):
            raise PlivoCallControlError("bad_call_id", "malformed CallUUID")
        if not callable_destination(destination):
            raise PlivoCallControlError(
                "bad_destination", "the destination is neither E.164 nor a SIP URI"
            )
        body = {"legs": "aleg", "aleg_url": self._transfer_url(destination), "aleg_method": "POST"}
        await self._request("POST", f"/Call/{quote(call_id)}/", body, "transfer")
        return CHANNEL_TRANSFERRING

    async def _request(
        self, method: str, path: str, body: dict[str, str] | None, what: str
    ) -> httpx.Response:
        if self._closed:
            raise PlivoCallControlError("closed", "the client was closed")
        return await checked_response(
            self._client.request(method, self._account + path, json=body),
            what,
            PlivoCallControlError,
            credentials_refused="Plivo refused the credentials",
            call_over=lambda response: what != "dial" and response.status_code == _HTTP_NOT_FOUND,
        )
