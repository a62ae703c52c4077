"""Twilio call control over the REST API: place, cancel, hang up or redirect calls.

``POST {base}/2010-04-01/Accounts/{AccountSid}/Calls.json`` creates an outbound
call: Twilio dials ``To`` from ``From`` and, once answered, fetches TwiML from
``Url`` (our voice webhook). ``POST …/Calls/{CallSid}.json`` modifies a call:
``Status=canceled`` ends a queued/ringing call, ``Status=completed`` hangs up a
call in any state, ``Twiml=<Response>…</Response>`` replaces what the call is
doing (a transfer is a redirect to ``<Dial>``). HTTP Basic
``AccountSid:AuthToken``, form bodies. docs/PROVIDERS.md §1.6; field names as in
twilio-python's ``CallList.create`` and ``CallContext.update``.

Every failure is a :class:`CallControlError` with a stable ``reason``. The auth
token never appears in a message, a log line or ``repr``; phone numbers are not
logged either.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx

from rutster.protocols.call_control import (
    CHANNEL_COMPLETED,
    CHANNEL_TRANSFERRING,
    CallControlFailure,
)
from rutster.trunk.twilio.twiml import (
    E164_PATTERN,
    MAX_INLINE_TWIML_CHARS,
    parse_transfer_destination,
    say_hangup_twiml,
    transfer_twiml,
)

logger = logging.getLogger(__name__)

#: Twilio's REST API host (docs/PROVIDERS.md §1.6; twilio-python ``Domain`` base URL).
TWILIO_API_BASE_URL = "https://api.twilio.com"
#: API version segment of every Voice REST path (docs/PROVIDERS.md §1.6).
TWILIO_API_VERSION = "2010-04-01"

#: Whole-request deadline for one call-control request. Seed decision: Twilio's
#: API normally answers well under a second; a hang-up must not stall a call's
#: teardown for longer than a caller would notice.
DEFAULT_TIMEOUT_S = 5.0

#: Call SID shape: ``CA`` + 32 hex digits (Twilio OpenAPI spec, ``CallSid`` pattern
#: ``^CA[0-9a-fA-F]{32}$``). Checked before any request so nothing reaches the URL path.
CALL_SID_PATTERN = re.compile(r"CA[0-9a-fA-F]{32}")
#: Account SID shape: ``AC`` + 32 hex digits (Twilio OpenAPI spec, ``AccountSid`` pattern).
ACCOUNT_SID_PATTERN = re.compile(r"AC[0-9a-fA-F]{32}")

#: Form values for ``Status`` (twilio-python ``CallInstance.UpdateStatus``). ``canceled``
#: "will attempt to hang up calls that are queued or ringing but not affect calls already in
#: progress"; ``completed`` "will attempt to hang up a call even if it's already in progress"
#: (Twilio "Modifying live calls", /docs/api/rest/change-call-state).
STATUS_COMPLETED = "completed"
STATUS_CANCELED = "canceled"
#: Call statuses of a call that has not ended yet (Twilio Call resource ``status`` values).
LIVE_STATUSES = frozenset({"queued", "ringing", "in-progress"})

#: HTTP method we ask Twilio to use for ``Url`` and ``StatusCallback``: POST carries the
#: fields in a signed form body (docs/PROVIDERS.md §1.1; Twilio's default is POST too).
WEBHOOK_METHOD = "POST"
#: Every call-progress event we subscribe to, in Twilio's order (twilio-python
#: ``status_callback_event``: "initiated, ringing, answered, and completed").
STATUS_CALLBACK_EVENTS = ("initiated", "ringing", "answered", "completed")
#: ``Timeout`` bounds: seconds Twilio lets the phone ring; "the default is 60 seconds and the
#: maximum is 600 seconds" (twilio-python ``CallList.create`` docstring).
MAX_RING_TIMEOUT_S = 600
#: Largest ``TimeLimit`` we send: 24 hours, the longest call Twilio allows (TwiML ``<Dial
#: timeLimit>``: "default 14400 seconds (4 hours), maximum 24 hours") and the REST API's
#: ``limits.max_duration_s`` ceiling (seed decision).
MAX_TIME_LIMIT_S = 86_400
#: Longest ``Url``/``StatusCallback`` we send. Seed decision: the practical URL length
#: limit of common HTTP stacks; ours are a host and a short path.
MAX_URL_CHARS = 2048

#: Twilio error code for "the requested resource was not found": the call is gone
#: (docs/PROVIDERS.md §1.6, pipecat's Twilio transport).
TWILIO_CODE_NOT_FOUND = 20404
#: Twilio error 21220 "Invalid call state": a realtime operation on a call that is
#: not in progress; completed calls cannot be redirected (twilio.com/docs/errors/21220).
TWILIO_CODE_INVALID_CALL_STATE = 21220

#: HTTP statuses meaning the credentials were refused (Twilio error 20003).
_AUTH_FAILED_STATUSES = frozenset({401, 403})
_HTTP_NOT_FOUND = 404
#: Longest piece of Twilio's error ``message`` kept in our own message (log hygiene).
_MAX_DETAIL_CHARS = 200


class CallControlError(CallControlFailure):
    """A call-control request failed; ``reason`` is a short stable label.

    Reasons: ``bad_config`` (malformed account SID, empty token or bad base URL),
    ``bad_call_sid``, ``bad_twiml`` (empty or over-long redirect TwiML),
    ``bad_request`` (a malformed :meth:`TwilioCallControl.create_call` argument),
    ``closed`` (used after :meth:`TwilioCallControl.aclose`),
    ``already_ended`` (404/20404 or 21220), ``auth_failed`` (401/403), ``timeout``,
    ``network``, ``http_error`` (any other status; see ``status_code`` and
    ``twilio_code``), ``bad_response`` (2xx without a call's ``sid``/``status``).
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        status_code: int | None = None,
        twilio_code: int | None = None,
    ) -> None:
        super().__init__(reason, f"{reason}: {message}")
        self.status_code = status_code
        self.twilio_code = twilio_code


@dataclass(frozen=True)
class CallUpdate:
    """The call as Twilio reports it after the update (``sid``, ``status`` of its JSON)."""

    sid: str
    status: str


@dataclass(frozen=True)
class CreatedCall:
    """The call Twilio created (``sid``, ``status`` of its JSON; ``queued`` at first)."""

    sid: str
    status: str


class TwilioCallControl:
    """Place outbound calls and hang up, cancel or redirect Twilio calls of one account.

    Pass ``client`` to share an ``httpx.AsyncClient`` (it is then not closed
    here); otherwise one is created and closed by :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        account_sid: str,
        auth_token: str,
        base_url: str = TWILIO_API_BASE_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not ACCOUNT_SID_PATTERN.fullmatch(account_sid):
            raise CallControlError("bad_config", "account SID must be 'AC' + 32 hex digits")
        if not auth_token:
            raise CallControlError("bad_config", "auth token must not be empty")
        split = urlsplit(base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise CallControlError("bad_config", "base URL must be an absolute http(s) URL")
        if split.query or split.fragment or "@" in split.netloc:
            # Credentials in the URL would end up in repr and logs; they go in Basic auth.
            raise CallControlError("bad_config", "base URL must not carry credentials or a query")
        if not timeout_s > 0:  # also refuses NaN
            raise CallControlError("bad_config", "timeout must be positive")
        self._account_sid = account_sid
        self._auth_token = auth_token
        self._auth = httpx.BasicAuth(account_sid, auth_token)
        self._base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=timeout_s)
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(account_sid={self._account_sid!r}, "
            f"base_url={self._base_url!r}, auth_token=<redacted>)"
        )

    @property
    def account_sid(self) -> str:
        """The account whose calls this controls."""
        return self._account_sid

    async def create_call(
        self,
        *,
        to: str,
        from_: str,
        url: str,
        status_callback: str | None,
        timeout_s: int | None = None,
        time_limit_s: int | None = None,
    ) -> CreatedCall:
        """Have Twilio dial ``to`` from ``from_``; once answered it fetches TwiML from ``url``.

        ``to`` is an E.164 number or a ``sip:``/``sips:`` URI, ``from_`` an E.164
        number (a Twilio number or verified caller ID of the account), ``url`` our
        voice webhook (absolute http(s); Twilio POSTs it). With ``status_callback``
        Twilio POSTs every call-progress event (initiated, ringing, answered,
        completed) there. ``timeout_s`` is how long to let it ring (1..600; Twilio's
        default 60), ``time_limit_s`` Twilio's own hard cap on the call's length
        (1..86400): a second line of defence behind our own enforcement.
        Malformed arguments are ``bad_request`` failures, raised before any request.
        """
        form: dict[str, str | list[str]] = {
            "To": _checked_to(to),
            "From": _checked_from(from_),
            "Url": _checked_url(url, "url"),
            "Method": WEBHOOK_METHOD,
        }
        if status_callback is not None:
            form["StatusCallback"] = _checked_url(status_callback, "status_callback")
            form["StatusCallbackMethod"] = WEBHOOK_METHOD
            form["StatusCallbackEvent"] = list(STATUS_CALLBACK_EVENTS)
        if timeout_s is not None:
            form["Timeout"] = str(_checked_seconds(timeout_s, "timeout_s", MAX_RING_TIMEOUT_S))
        if time_limit_s is not None:
            limit = _checked_seconds(time_limit_s, "time_limit_s", MAX_TIME_LIMIT_S)
            form["TimeLimit"] = str(limit)
        self._check_open()
        try:
            state = await self._post(self.calls_url(), form)
        except CallControlError as exc:
            logger.warning("twilio create of a call failed: %s", exc)
            raise
        if not CALL_SID_PATTERN.fullmatch(state.sid):
            # The SID goes into later request paths and our records: never take junk.
            raise CallControlError("bad_response", "Twilio's answer has a malformed call sid")
        logger.info("twilio created call %s: status %s", state.sid, state.status)
        return CreatedCall(sid=state.sid, status=state.status)

    async def hangup(self, call_sid: str) -> CallUpdate:
        """End the call whatever its state (``Status=completed``)."""
        return await self._update(call_sid, {"Status": STATUS_COMPLETED}, action="hangup")

    async def cancel_or_hang_up(self, call_sid: str) -> CallUpdate:
        """End a call that may not be answered yet: cancel it, or hang up if it was answered.

        ``Status=canceled`` ends a queued or ringing call as ``canceled`` (never
        billed) but leaves an answered call alone, so when Twilio's answer shows the
        call still live (answered meanwhile) this follows with ``Status=completed``.
        A call already over is an ``already_ended`` failure, as for :meth:`hangup`.
        """
        update = await self._update(call_sid, {"Status": STATUS_CANCELED}, action="cancel")
        if update.status in LIVE_STATUSES:
            update = await self.hangup(call_sid)
        return update

    async def redirect(self, call_sid: str, twiml: str) -> CallUpdate:
        """Make the call run ``twiml`` now, dropping what it was doing (``Twiml=``).

        Build ``twiml`` with :mod:`trunk.twilio.twiml` (e.g. ``transfer_twiml``).
        """
        if not twiml.strip():
            raise CallControlError("bad_twiml", "TwiML must not be empty")
        if len(twiml) > MAX_INLINE_TWIML_CHARS:
            raise CallControlError(
                "bad_twiml", f"TwiML must be at most {MAX_INLINE_TWIML_CHARS} characters"
            )
        return await self._update(call_sid, {"Twiml": twiml}, action="redirect")

    async def hang_up(self, call_id: str) -> str:
        """:class:`~protocols.call_control.ProviderCallControl`: hang up; the call's status."""
        return (await self.hangup(call_id)).status

    async def transfer(self, call_id: str, destination: str) -> str:
        """:class:`~protocols.call_control.ProviderCallControl`: redirect the call to ``<Dial>``.

        ``ValueError`` from :func:`transfer_twiml` (a malformed destination) becomes
        a ``bad_destination`` failure; the caller checks the allowlist first.
        """
        try:
            twiml = transfer_twiml(destination)
        except ValueError as exc:
            raise CallControlError("bad_destination", str(exc)) from None
        await self.redirect(call_id, twiml)
        return CHANNEL_TRANSFERRING

    async def say_and_hang_up(self, call_id: str, text: str) -> str:
        """:class:`~protocols.call_control.SupportsGoodbye`: ``<Say>`` a short goodbye, hang up."""
        try:
            twiml = say_hangup_twiml(text)
        except ValueError as exc:
            raise CallControlError("bad_twiml", str(exc)) from None
        await self.redirect(call_id, twiml)
        return CHANNEL_COMPLETED

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def calls_url(self) -> str:
        """The account's Calls list URL (``POST`` creates a call)."""
        return f"{self._base_url}/{TWILIO_API_VERSION}/Accounts/{self._account_sid}/Calls.json"

    def call_url(self, call_sid: str) -> str:
        """The call's REST resource URL; ``bad_call_sid`` unless ``call_sid`` is well-formed."""
        if not CALL_SID_PATTERN.fullmatch(call_sid):
            raise CallControlError("bad_call_sid", "call SID must be 'CA' + 32 hex digits")
        return (
            f"{self._base_url}/{TWILIO_API_VERSION}/Accounts/{self._account_sid}"
            f"/Calls/{call_sid}.json"
        )

    def _check_open(self) -> None:
        if self._closed or self._client.is_closed:
            raise CallControlError("closed", "call control (or its HTTP client) is closed")

    async def _update(self, call_sid: str, form: dict[str, str], *, action: str) -> CallUpdate:
        url = self.call_url(call_sid)
        self._check_open()
        try:
            update = await self._post(url, form)
        except CallControlError as exc:
            logger.warning("twilio %s of call %s failed: %s", action, call_sid, exc)
            raise
        logger.info("twilio %s of call %s: status %s", action, call_sid, update.status)
        return update

    async def _post(self, url: str, form: Mapping[str, str | list[str]]) -> CallUpdate:
        """POST ``form`` (a list value repeats its field); the call's ``sid``/``status``."""
        try:
            # Whole-request deadline; httpx's own timeout is per phase (connect, read…).
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.post(
                    url,
                    data=form,
                    auth=self._auth,
                    headers={"Accept": "application/json"},
                    timeout=self._timeout_s,
                )
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise CallControlError("timeout", f"no answer within {self._timeout_s}s") from exc
        except httpx.HTTPError as exc:
            detail = f"{type(exc).__name__}: {exc}"[:_MAX_DETAIL_CHARS]
            raise CallControlError("network", self._scrub(detail)) from exc
        body = _json_object(response)
        if response.is_success:
            sid, status = body.get("sid"), body.get("status")
            if not isinstance(sid, str) or not isinstance(status, str):
                raise CallControlError(
                    "bad_response",
                    "Twilio's answer has no call sid/status",
                    status_code=response.status_code,
                )
            return CallUpdate(sid=sid, status=status)
        raise self._http_failure(response.status_code, body)

    def _http_failure(self, status_code: int, body: dict[str, Any]) -> CallControlError:
        code = body.get("code")
        twilio_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        raw_message = body.get("message")
        detail = (
            self._scrub(raw_message[:_MAX_DETAIL_CHARS]) if isinstance(raw_message, str) else ""
        )
        described = f"HTTP {status_code}" + (
            f" code {twilio_code}" if twilio_code is not None else ""
        )
        if detail:
            described += f" ({detail})"
        if (status_code == _HTTP_NOT_FOUND and twilio_code == TWILIO_CODE_NOT_FOUND) or (
            twilio_code == TWILIO_CODE_INVALID_CALL_STATE
        ):
            reason = "already_ended"
        elif status_code in _AUTH_FAILED_STATUSES:
            reason = "auth_failed"
        else:
            reason = "http_error"
        return CallControlError(reason, described, status_code=status_code, twilio_code=twilio_code)

    def _scrub(self, text: str) -> str:
        """Belt and braces: never let the token through, whatever Twilio echoes."""
        return text.replace(self._auth_token, "<redacted>")


def _json_object(response: httpx.Response) -> dict[str, Any]:
    """The response's JSON object, or ``{}`` if it is not one (errors then say only the status)."""
    try:
        body = response.json()
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return {}
    return body if isinstance(body, dict) else {}


def _bad_request(message: str) -> CallControlError:
    return CallControlError("bad_request", message)


def _checked_to(to: str) -> str:
    """``to`` if it is an E.164 number or a SIP URI (the same rule as a transfer target)."""
    try:
        parse_transfer_destination(to)
    except ValueError:
        raise _bad_request("to must be an E.164 number or a sip:/sips: URI") from None
    return to


def _checked_from(from_: str) -> str:
    if not E164_PATTERN.fullmatch(from_):
        raise _bad_request("from must be an E.164 number like +15551230000")
    return from_


def _checked_url(url: str, what: str) -> str:
    """``url`` if it is an absolute http(s) URL Twilio can call (no credentials, no fragment)."""
    if len(url) > MAX_URL_CHARS:
        raise _bad_request(f"{what} must be at most {MAX_URL_CHARS} characters")
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - reading the port is what validates it
    except ValueError:
        raise _bad_request(f"{what} is not a valid URL") from None
    if split.scheme not in ("http", "https") or not split.hostname:
        raise _bad_request(f"{what} must be an absolute http:// or https:// URL")
    if split.fragment or "#" in url or "@" in split.netloc:
        raise _bad_request(f"{what} must not carry a fragment or credentials")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise _bad_request(f"{what} must not contain spaces or control characters")
    return url


def _checked_seconds(value: int, what: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise _bad_request(f"{what} must be a whole number of seconds in 1..{maximum}")
    return value
