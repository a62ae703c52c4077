"""Plivo call control over its REST API: hang up a live call.

``DELETE {base}/v1/Account/{auth_id}/Call/{call_uuid}/`` ends a call: ``204`` when it
did, ``404`` when the call is already over (docs/PROVIDERS.md §4.4; path as
plivo-python's ``calls.delete``). HTTP Basic ``auth_id:auth_token``. Transfer is
not offered: Plivo's transfer redirects the call to a URL serving new XML (§4.4),
which rutster does not serve yet.

Failures are :class:`PlivoCallControlError` with a stable ``reason``
(``already_ended``, ``auth_failed``, ``bad_call_id``, ``not_supported``,
``timeout``, ``network``, ``http_error``, ``closed``, ``bad_config``); the auth
token never appears in a message, a log line or ``repr``.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

import httpx

from rutster.protocols.call_control import (
    CHANNEL_COMPLETED,
    RestCallControlError,
)

__all__ = ["PLIVO_API_BASE_URL", "PlivoCallControl", "PlivoCallControlError"]

#: Plivo's API host (plivo-python ``PLIVO_API``, ``API_VOICE``).
PLIVO_API_BASE_URL = "https://api.plivo.com"
#: Whole-request deadline. Seed decision, as Twilio's (trunk/twilio/call_control.py).
DEFAULT_TIMEOUT_S = 5.0
#: A Plivo ``CallUUID`` (a UUID) or account ``auth_id`` (``MA``/``SA`` + 18 characters):
#: checked before any request so nothing else reaches the URL path.
ID_PATTERN = re.compile(r"[A-Za-z0-9\-]{1,64}")
_AUTH_FAILED_STATUSES = frozenset({401, 403})
_HTTP_NOT_FOUND = 404


class PlivoCallControlError(RestCallControlError):
    """A Plivo REST request failed (see the module docstring for reasons)."""


class PlivoCallControl:
    """Hangs up Plivo calls (:class:`~protocols.call_control.ProviderCallControl`)."""

    def __init__(
        self,
        auth_id: str,
        auth_token: str,
        *,
        base_url: str = PLIVO_API_BASE_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not ID_PATTERN.fullmatch(auth_id) or not auth_token:
            raise PlivoCallControlError("bad_config", "malformed auth id or empty auth token")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PlivoCallControlError("bad_config", "the Plivo API base URL is not http(s)")
        self._account = f"{base_url.rstrip('/')}/v1/Account/{auth_id}"
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

    async def hang_up(self, call_id: str) -> str:
        """End the call; ``completed``. A call already over raises ``already_ended``."""
        if self._closed:
            raise PlivoCallControlError("closed", "the client was closed")
        if not ID_PATTERN.fullmatch(call_id):
            raise PlivoCallControlError("bad_call_id", "malformed CallUUID")
        try:
            response = await self._client.delete(f"{self._account}/Call/{quote(call_id)}/")
        except httpx.TimeoutException:
            raise PlivoCallControlError("timeout", "hang-up timed out") from None
        except httpx.HTTPError as exc:
            raise PlivoCallControlError(
                "network", f"hang-up failed: {type(exc).__name__}"
            ) from None
        status = response.status_code
        if 200 <= status < 300:
            return CHANNEL_COMPLETED
        if status in _AUTH_FAILED_STATUSES:
            raise PlivoCallControlError(
                "auth_failed", "Plivo refused the credentials", status_code=status
            )
        if status == _HTTP_NOT_FOUND:
            raise PlivoCallControlError("already_ended", "the call is over", status_code=status)
        raise PlivoCallControlError(
            "http_error", f"hang-up answered HTTP {status}", status_code=status
        )

    async def transfer(self, call_id: str, destination: str) -> str:
        """Not offered on Plivo yet (see the module docstring)."""
        raise PlivoCallControlError("not_supported", "transfer is not supported on Plivo calls")
