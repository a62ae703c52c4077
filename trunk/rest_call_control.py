"""What the REST call-control clients of Telnyx, Plivo and Vonage share: the destinations
and URLs they accept, and how one request's outcome becomes an answer or a
:class:`~rutster.protocols.call_control.RestCallControlError`.

Twilio's client (trunk/twilio/call_control.py) keeps its own mapping: it reads Twilio's
numbered error codes into its reasons.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import httpx

from rutster.protocols.call_control import RestCallControlError

#: Transfer destinations and numbers: E.164 (ITU-T E.164 §6) or a SIP URI (RFC 3261
#: §19.1) of characters a URI carries unescaped; the transfer allowlist has already
#: passed a destination.
E164 = re.compile(r"\+[1-9][0-9]{1,14}")
SIP_URI = re.compile(r"sips?:[A-Za-z0-9\-_.!~*'()%&=+$,;?/:@\[\]]{1,256}")
#: Longest URL sent to a provider. Seed decision (as Twilio's ``MAX_URL_CHARS``): the
#: practical URL length limit of common HTTP stacks; ours are a host, a path and an id.
MAX_URL_CHARS = 2048
#: HTTP statuses meaning the credentials were refused (RFC 9110 §15.5.2, §15.5.4).
AUTH_FAILED_STATUSES = frozenset({401, 403})


def callable_destination(destination: str) -> bool:
    """True for an E.164 number or a SIP URI."""
    return bool(E164.fullmatch(destination) or SIP_URI.fullmatch(destination))


def webhook_url_ok(url: str) -> bool:
    """True for an http(s) URL of at most :data:`MAX_URL_CHARS` characters."""
    return url.startswith(("https://", "http://")) and len(url) <= MAX_URL_CHARS


async def checked_response(
    request: Awaitable[httpx.Response],
    what: str,
    error: type[RestCallControlError],
    *,
    credentials_refused: str,
    call_over: Callable[[httpx.Response], bool],
) -> httpx.Response:
    """The answer to ``request`` (the ``what`` of a call) if it is a 2xx; otherwise the
    provider's ``error`` with a reason: ``timeout`` or ``network`` (no answer),
    ``auth_failed`` (401/403, ``credentials_refused`` says what was refused),
    ``already_ended`` (the provider's own sign, ``call_over``, that the call is gone)
    or ``http_error``."""
    try:
        response = await request
    except httpx.TimeoutException:
        raise error("timeout", f"{what} timed out") from None
    except httpx.HTTPError as exc:
        raise error("network", f"{what} failed: {type(exc).__name__}") from None
    status = response.status_code
    if 200 <= status < 300:
        return response
    if status in AUTH_FAILED_STATUSES:
        raise error("auth_failed", credentials_refused, status_code=status)
    if call_over(response):
        raise error("already_ended", "the call is over", status_code=status)
    raise error("http_error", f"{what} answered HTTP {status}", status_code=status)
