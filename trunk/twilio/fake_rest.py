"""A FAKE Twilio REST API, for tests and offline mode. It is not Twilio.

:class:`FakeTwilioRest` serves just enough of ``api.twilio.com`` on a loopback
port to exercise :mod:`trunk.twilio.call_control`: modifying a live call with
``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` (PROVIDERS.md
§1.6). Answers are shaped like Twilio's (JSON call resources; errors as
``{"code", "message", "more_info", "status"}``) so the client's error mapping is
exercised for real. Creating calls (``Calls.json``) is not implemented and gets
the same 404 as any unknown route.

Every request is recorded; ``delay_s`` and :meth:`FakeTwilioRest.fail_next`
inject slowness and failures. Callbacks let a test tie a hang-up to the rest of
its world (e.g. have the Twilio simulator send the media stream's ``stop``,
as real Twilio does when a call ends).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import re
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

logger = logging.getLogger(__name__)

#: Loopback only: the fake must never be reachable from another machine.
FAKE_HOST = "127.0.0.1"
#: API version segment of Voice REST paths (PROVIDERS.md §1.6).
API_VERSION = "2010-04-01"

#: Call statuses (Twilio Call resource ``status`` values).
STATUS_IN_PROGRESS = "in-progress"
STATUS_COMPLETED = "completed"
#: ``Status=canceled`` only ends queued/ringing calls; an in-progress call is not
#: affected (Twilio "Modifying Live Calls" docs).
STATUS_CANCELED = "canceled"

#: Twilio error codes the fake answers with (twilio.com/docs/errors/<code>).
CODE_AUTHENTICATE = 20003
CODE_NOT_FOUND = 20404
CODE_INTERNAL_ERROR = 20500
MORE_INFO_URL = "https://www.twilio.com/docs/errors/{code}"

#: Most form fields one request may carry; Twilio's update takes nine, so more is abuse.
MAX_FORM_FIELDS = 100
#: How long ``__aexit__`` waits for uvicorn to stop (seed decision: in-flight
#: requests are cut short on exit, so this is only a safety net).
STOP_TIMEOUT_S = 5.0
#: Seconds uvicorn lets open connections finish on shutdown (uvicorn takes an int).
GRACEFUL_SHUTDOWN_S = 1
#: Poll interval while waiting for uvicorn to report it started.
_START_POLL_S = 0.01

_CALL_PATH = re.compile(
    rf"/{re.escape(API_VERSION)}/Accounts/(?P<account_sid>[^/]+)/Calls/(?P<call_sid>[^/]+)\.json"
)
_FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]

OnCompleted = Callable[[], Awaitable[None]]
OnRedirect = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received (bad forms are recorded with an empty ``form``)."""

    method: str
    path: str
    form: Mapping[str, str]
    authorized: bool


@dataclass
class _FakeCall:
    status: str
    on_completed: OnCompleted | None
    on_redirect: OnRedirect | None


@dataclass(frozen=True)
class _InjectedFailure:
    status_code: int
    code: int | None


class FakeTwilioRest:
    """A FAKE Twilio REST API on a free loopback port (``async with`` runs it).

    Pass :attr:`base_url` as ``TwilioCallControl(base_url=...)``.
    """

    def __init__(self, *, account_sid: str, auth_token: str, delay_s: float = 0.0) -> None:
        self.account_sid = account_sid
        self._auth_token = auth_token
        #: Sleep this long before answering each request (timeout tests).
        self.delay_s = delay_s
        #: Every request received, in order.
        self.requests: list[RecordedRequest] = []
        #: Exceptions raised by ``on_completed``/``on_redirect`` callbacks (answered with 500).
        self.callback_errors: list[BaseException] = []
        self._calls: dict[str, _FakeCall] = {}
        self._failures: deque[_InjectedFailure] = deque()
        self._closing = asyncio.Event()
        self._app = Starlette(routes=[Route("/{path:path}", self._handle, methods=_ALL_METHODS)])
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None

    def __repr__(self) -> str:
        return f"FakeTwilioRest(account_sid={self.account_sid!r}, base_url={self._url_or_none()!r})"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``; only valid while running."""
        url = self._url_or_none()
        if url is None:
            raise RuntimeError("FakeTwilioRest is not running; use 'async with'")
        return url

    @property
    def calls(self) -> dict[str, str]:
        """Status of every registered call, by call SID (a copy)."""
        return {sid: call.status for sid, call in self._calls.items()}

    def register_call(
        self,
        call_sid: str,
        *,
        on_completed: OnCompleted | None = None,
        on_redirect: OnRedirect | None = None,
    ) -> None:
        """Add a live (``in-progress``) call; replaces any earlier call with that SID."""
        self._calls[call_sid] = _FakeCall(STATUS_IN_PROGRESS, on_completed, on_redirect)

    def fail_next(self, status_code: int, code: int | None = None) -> None:
        """Answer the next request (after ``delay_s``) with ``status_code`` and Twilio ``code``.

        Calls queue up: each injected failure is used once, in order.
        """
        self._failures.append(_InjectedFailure(status_code, code))

    async def __aenter__(self) -> Self:
        self._closing = asyncio.Event()
        # proto must be IPPROTO_TCP, not 0: asyncio only sets TCP_NODELAY on accepted
        # sockets whose proto says TCP, and without it every keep-alive request
        # stalls ~40 ms on Nagle + delayed ACK (measured).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind((FAKE_HOST, 0))  # the OS picks a free port; no race between pick and bind
        self._socket = sock
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_config=None,  # leave the process's logging setup alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                await self._shutdown()
                raise RuntimeError("FakeTwilioRest's server stopped while starting")
            await asyncio.sleep(_START_POLL_S)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._closing.set()  # cut short any request sleeping in ``delay_s``
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, STOP_TIMEOUT_S)
            finally:
                self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None
        self._port = None

    def _url_or_none(self) -> str | None:
        return None if self._port is None else f"http://{FAKE_HOST}:{self._port}"

    # ---- request handling -------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        authorized = self._is_authorized(request.headers.get("authorization"))
        form = await _read_form(request)
        self.requests.append(RecordedRequest(request.method, path, form or {}, authorized))

        if self.delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.delay_s)
            if self._closing.is_set():
                return _error(503, None, "Fake server is shutting down")
        if self._failures:
            failure = self._failures.popleft()
            return _error(failure.status_code, failure.code, "Injected failure")
        if not authorized:
            return _error(401, CODE_AUTHENTICATE, "Authenticate")

        match = _CALL_PATH.fullmatch(path)
        if match is None or request.method != "POST":
            return _not_found(path)
        if form is None:
            return _error(400, None, "Request body is not a valid form")
        call = self._calls.get(match["call_sid"])
        if match["account_sid"] != self.account_sid or call is None:
            return _not_found(path)
        if call.status != STATUS_IN_PROGRESS:
            return _not_found(path)
        return await self._update_call(match["call_sid"], call, form, path)

    async def _update_call(
        self, call_sid: str, call: _FakeCall, form: Mapping[str, str], path: str
    ) -> Response:
        status = form.get("Status")
        if status is not None and status not in (STATUS_COMPLETED, STATUS_CANCELED):
            return _error(400, None, f"Invalid Status: {status!r}")
        try:
            if status == STATUS_COMPLETED:
                call.status = STATUS_COMPLETED  # before awaiting: a racing request sees it gone
                if call.on_completed is not None:
                    await call.on_completed()
            elif "Twiml" in form and call.on_redirect is not None:
                await call.on_redirect(form["Twiml"])
        except Exception as exc:
            logger.exception("FakeTwilioRest callback for call %s failed", call_sid)
            self.callback_errors.append(exc)
            return _error(500, CODE_INTERNAL_ERROR, "Internal Server Error")
        return JSONResponse(self._call_json(call_sid, call, path))

    def _call_json(self, call_sid: str, call: _FakeCall, path: str) -> dict[str, Any]:
        return {
            "sid": call_sid,
            "account_sid": self.account_sid,
            "status": call.status,
            "api_version": API_VERSION,
            "uri": path,
        }

    def _is_authorized(self, header: str | None) -> bool:
        if header is None:
            return False
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, colon, password = decoded.partition(":")
        return bool(colon) and (
            hmac.compare_digest(user.encode(), self.account_sid.encode())
            & hmac.compare_digest(password.encode(), self._auth_token.encode())
        )


async def _read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded body as a dict (last value wins), or ``None`` if it is not a valid form."""
    body = await request.body()
    if not body:
        return {}
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != _FORM_CONTENT_TYPE:
        return None
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=True,
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(pairs)


def _error(status_code: int, code: int | None, message: str) -> JSONResponse:
    """Twilio's error body: ``code`` (``null`` where the fake has no matching Twilio code)."""
    return JSONResponse(
        {
            "code": code,
            "message": message,
            "more_info": MORE_INFO_URL.format(code=code) if code is not None else None,
            "status": status_code,
        },
        status_code=status_code,
    )


def _not_found(path: str) -> JSONResponse:
    return _error(404, CODE_NOT_FOUND, f"The requested resource {path} was not found")
