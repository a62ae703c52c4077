"""A FAKE Twilio REST API, for tests (a test double, never shipped). It is not Twilio.

:class:`FakeTwilioRest` serves just enough of ``api.twilio.com`` on a loopback
port to exercise :mod:`trunk.twilio.call_control` (docs/PROVIDERS.md §1.6):

- ``POST /2010-04-01/Accounts/{AccountSid}/Calls.json`` creates an outbound
  call: the form is validated the way Twilio does (``To``, ``From``, one of
  ``Url``/``Twiml``; Twilio error codes), the call gets a ``CA…`` SID and
  status ``queued``, and the answer is a 201 call resource. The call then goes
  through Twilio's progress (initiated, ringing, then answered, busy, no-answer
  or failed, as the test set the callee up with :meth:`FakeTwilioRest.set_callee`
  or :meth:`FakeTwilioRest.resolve_call`), sending signed status callbacks when
  the request asked for them. Once answered, :attr:`FakeTwilioRest.on_answer`
  (if set) plays the callee: :class:`rutster.tools.twilio_simulator.SimulatedCallee`
  posts the voice webhook to ``Url`` and streams audio through the
  :class:`~rutster.tools.twilio_simulator.TwilioSimulator`.
- ``POST …/Calls/{CallSid}.json`` modifies a call: ``Status=completed`` hangs
  it up (a simulated callee's media stream then stops, as with real Twilio),
  ``Status=canceled`` ends it while queued or ringing, ``Twiml=`` redirects it.
  Calls a test added with :meth:`FakeTwilioRest.register_call` (inbound calls
  played by the simulator) take the same requests.

Answers are shaped like Twilio's (JSON call resources; errors as ``{"code",
"message", "more_info", "status"}``) so the client's error mapping is exercised
for real. Every request is recorded; ``delay_s`` and :meth:`FakeTwilioRest.fail_next`
inject slowness and failures. The server listens on loopback only, says
``FAKE`` in its ``Server`` header, and only ever calls back loopback URLs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import email.utils
import hmac
import logging
import math
import re
import secrets
import socket
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator

logger = logging.getLogger(__name__)

#: Loopback only: the fake must never be reachable from another machine.
FAKE_HOST = "127.0.0.1"
#: Hosts the fake sends status callbacks to: it never calls out of the machine.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
#: ``Server`` header of every answer, so nobody mistakes the fake for Twilio.
FAKE_SERVER_HEADER = "rutster-FAKE-twilio-rest (not Twilio)"
#: API version segment of Voice REST paths (docs/PROVIDERS.md §1.6).
API_VERSION = "2010-04-01"

#: Call statuses (Twilio Call resource ``status`` values).
STATUS_QUEUED = "queued"
STATUS_RINGING = "ringing"
STATUS_IN_PROGRESS = "in-progress"
STATUS_COMPLETED = "completed"
#: ``Status=canceled`` only ends queued/ringing calls; an in-progress call is not
#: affected (Twilio "Modifying Live Calls" docs).
STATUS_CANCELED = "canceled"
STATUS_BUSY = "busy"
STATUS_NO_ANSWER = "no-answer"
STATUS_FAILED = "failed"
#: Statuses of a call that is over (Twilio Call resource ``status`` values).
FINAL_STATUSES = frozenset(
    {STATUS_COMPLETED, STATUS_CANCELED, STATUS_BUSY, STATUS_NO_ANSWER, STATUS_FAILED}
)
#: ``Direction`` of a call created through the REST API (docs/PROVIDERS.md §1.1).
DIRECTION_OUTBOUND_API = "outbound-api"

#: Call-progress events (``StatusCallbackEvent`` values, twilio-python ``CallList.create``).
EVENT_INITIATED = "initiated"
EVENT_RINGING = "ringing"
EVENT_ANSWERED = "answered"
EVENT_COMPLETED = "completed"
STATUS_CALLBACK_EVENTS = frozenset(
    {EVENT_INITIATED, EVENT_RINGING, EVENT_ANSWERED, EVENT_COMPLETED}
)
#: ``CallStatus`` reported with the ``initiated`` event (Twilio "Tracking the status of an
#: outbound call": queued → initiated → ringing → in-progress → completed).
CALL_STATUS_INITIATED = "initiated"
#: ``CallbackSource`` of call-progress callbacks (Twilio status-callback parameters).
CALLBACK_SOURCE = "call-progress-events"
#: HTTP methods Twilio accepts for ``Method``/``StatusCallbackMethod`` (twilio-python docs:
#: "Can be: GET or POST and the default is POST").
WEBHOOK_METHODS = frozenset({"GET", "POST"})

#: Twilio error codes the fake answers with (twilio.com/docs/errors/<code>).
CODE_AUTHENTICATE = 20003
CODE_NOT_FOUND = 20404
CODE_INTERNAL_ERROR = 20500
#: 21200 "Calls Resource": generic create error, e.g. an unsupported ``Method`` or
#: ``StatusCallbackMethod`` or an invalid callback URL (twilio.com/docs/api/errors/21200).
CODE_CALLS_RESOURCE = 21200
#: 21201 "No 'To' number specified" (twilio.com/docs/errors/21201).
CODE_NO_TO = 21201
#: 21205 "Invalid URL"; also "Url parameter is required." when no Url/Twiml/ApplicationSid
#: is given (twilio.com/docs/errors/21205; message seen in twilio/twilio-node#275).
CODE_INVALID_URL = 21205
#: 21213 "Caller phone number is required": no 'From' (twilio.com/docs/api/errors/21213).
CODE_NO_FROM = 21213
#: 21217 "Phone number does not appear to be valid" (twilio.com/docs/api/errors/21217).
CODE_INVALID_PHONE_NUMBER = 21217
#: 21220 "Invalid call state": the call is not live any more (twilio.com/docs/errors/21220).
CODE_INVALID_CALL_STATE = 21220
#: 32018 "Twiml size exceeded maximum allowed value of 4000 characters"
#: (twilio.com/docs/api/errors/32018).
CODE_TWIML_TOO_LARGE = 32018
MORE_INFO_URL = "https://www.twilio.com/docs/errors/{code}"

#: Largest inline ``Twiml`` Twilio takes (error 32018 above).
MAX_TWIML_CHARS = 4000
#: Default and largest ``Timeout`` (ring time): "the default is 60 seconds and the maximum
#: is 600 seconds" (twilio-python ``CallList.create`` docstring). The fake refuses values
#: outside 1..600 with 21200 rather than guessing whether Twilio clamps them.
DEFAULT_RING_TIMEOUT_S = 60
MAX_RING_TIMEOUT_S = 600
#: ``TimeLimit`` when the request gives none: four hours (TwiML ``<Dial timeLimit>`` docs,
#: "default 14400 seconds").
DEFAULT_TIME_LIMIT_S = 14_400
#: How long a simulated callee rings before its outcome, unless the test says otherwise.
#: Seed decision: short, so tests are fast, but long enough to see ``ringing``.
DEFAULT_RING_S = 0.05
#: Deadline for delivering one status callback. Seed decision: loopback receivers answer
#: in milliseconds; a dead one must not stall the simulated call (Twilio's own webhook
#: timeout is 15 s).
STATUS_CALLBACK_TIMEOUT_S = 2.0
#: How long a call's end waits for the simulated callee's leg to finish (send ``stop``,
#: drain the socket) before giving up on it. Seed decision: the simulator's own drain
#: waits up to 5 s.
LEG_DRAIN_TIMEOUT_S = 10.0
#: TwiML verbs that hand a redirected call on instead of ending it when the document ends
#: (TwiML reference: ``<Dial>`` bridges, ``<Connect>`` streams, ``<Enqueue>`` queues,
#: ``<Redirect>`` fetches more TwiML). Anything else (``<Say>``, ``<Hangup>``…) ends the call.
CONTINUING_VERBS = frozenset({"Dial", "Connect", "Enqueue", "Redirect"})

#: Most form fields one request may carry; Twilio's create takes ~40, so more is abuse.
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
_CALLS_PATH = re.compile(rf"/{re.escape(API_VERSION)}/Accounts/(?P<account_sid>[^/]+)/Calls\.json")
#: ``To`` the fake can dial: E.164, a SIP URI or a Twilio Client identity (twilio-python
#: ``CallList.create``: "The phone number, SIP address, or client identifier to call").
_DIALLABLE = re.compile(r"\+[1-9][0-9]{1,14}|(?:sips?|client):[^\s<>\"]{1,256}")
_FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]

OnCompleted = Callable[[], Awaitable[None]]
OnRedirect = Callable[[str], Awaitable[None]]


class CalleeOutcome(StrEnum):
    """What the simulated callee of an outbound call does once it has rung."""

    ANSWER = "answer"  # picks up: in-progress; ``on_answer`` plays the callee
    BUSY = "busy"
    NO_ANSWER = "no-answer"
    FAILED = "failed"  # the carrier could not connect the call


_OUTCOME_STATUS: Mapping[CalleeOutcome, str] = {
    CalleeOutcome.ANSWER: STATUS_IN_PROGRESS,
    CalleeOutcome.BUSY: STATUS_BUSY,
    CalleeOutcome.NO_ANSWER: STATUS_NO_ANSWER,
    CalleeOutcome.FAILED: STATUS_FAILED,
}


@dataclass(frozen=True)
class CalleeBehaviour:
    """How a number behaves when the fake dials it: ring ``ring_s``, then ``outcome``.

    A ring longer than the call's ``Timeout`` ends as ``no-answer`` at the
    timeout, as with Twilio. ``queue_s``: how long the call first waits ``queued``
    (Twilio's per-account calls-per-second queue; the Call resource's ``queue_time``),
    which the ring ``Timeout`` does not count: "the number of seconds that we should
    allow the phone to ring" (twilio.com/docs/voice/api/call-resource, ``Timeout``).
    """

    outcome: CalleeOutcome = CalleeOutcome.ANSWER
    ring_s: float = DEFAULT_RING_S
    queue_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received (bad forms are recorded with an empty ``form``).

    ``form`` keeps the last value of a repeated field; ``fields`` keeps every
    ``(name, value)`` pair in order (``StatusCallbackEvent`` repeats).
    """

    method: str
    path: str
    form: Mapping[str, str]
    authorized: bool
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StatusCallbackDelivery:
    """One status callback the fake sent (or failed to send)."""

    url: str
    method: str
    params: Mapping[str, str]
    #: The receiver's HTTP status; ``None`` when nothing was received (see ``error``).
    status_code: int | None
    error: str | None = None

    @property
    def delivered(self) -> bool:
        """Whether the receiver answered 2xx."""
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass(eq=False)
class CreatedFakeCall:
    """An outbound call created through the FAKE REST API: what Twilio would hold for it."""

    sid: str
    account_sid: str
    to: str
    from_: str
    #: The voice webhook (``Url``) or inline ``Twiml``: exactly one is set.
    url: str | None
    twiml: str | None
    method: str
    status_callback: str | None
    status_callback_method: str
    status_callback_events: frozenset[str]
    timeout_s: int
    time_limit_s: int
    status: str = STATUS_QUEUED
    #: Loop times (``asyncio`` clock) of answer and end; ``None`` until they happen.
    answered_at: float | None = None
    ended_at: float | None = None
    #: TwiML documents this call was redirected to, in order.
    redirects: list[str] = field(default_factory=list)
    #: Set when the call's media must stop (hung up or redirected through REST, or its
    #: ``TimeLimit`` reached): pass it as the simulator's ``provider_hangup``.
    provider_hangup: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the call is over and its last status callback went out.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _end_requested: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _resolved: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _resolution: CalleeOutcome | None = field(default=None, repr=False)
    _sequence: int = field(default=0, repr=False)

    @property
    def duration_s(self) -> int:
        """Whole seconds from answer to end (Twilio ``CallDuration``); 0 if unanswered.

        Rounded to the nearest second: Twilio does not document its rounding, and
        nothing may rely on it (spend is metered on our own clock).
        """
        if self.answered_at is None:
            return 0
        end = self.ended_at if self.ended_at is not None else asyncio.get_running_loop().time()
        return max(0, math.floor(end - self.answered_at + 0.5))

    @property
    def is_over(self) -> bool:
        """Whether the call reached a final status."""
        return self.status in FINAL_STATUSES


#: Plays the callee of an answered call (an ``async def`` taking the call).
Answerer = Callable[[CreatedFakeCall], Coroutine[Any, Any, None]]


@dataclass
class _FakeCall:
    status: str
    on_completed: OnCompleted | None
    on_redirect: OnRedirect | None


@dataclass(frozen=True)
class _InjectedFailure:
    status_code: int
    code: int | None


class _CreateRefused(Exception):
    """A create request Twilio would refuse: ``code`` and ``message`` for the 400 answer."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FakeTwilioRest:
    """A FAKE Twilio REST API on a free loopback port (``async with`` runs it).

    Pass :attr:`base_url` as ``TwilioCallControl(base_url=...)``. ``auth_token``
    both checks the Basic credentials and signs status callbacks, as Twilio's
    account Auth Token does.
    """

    def __init__(self, *, account_sid: str, auth_token: str, delay_s: float = 0.0) -> None:
        self.account_sid = account_sid
        self._auth_token = auth_token
        self._signer = TwilioSignatureValidator(auth_token)
        #: Sleep this long before answering each request (timeout tests).
        self.delay_s = delay_s
        #: Every request received, in order.
        self.requests: list[RecordedRequest] = []
        #: Exceptions raised by ``on_completed``/``on_redirect``/``on_answer`` callbacks.
        self.callback_errors: list[BaseException] = []
        #: Plays the callee of every answered outbound call (e.g. a
        #: :class:`~rutster.tools.twilio_simulator.SimulatedCallee`); runs in a task and the
        #: call lasts until it returns, is hung up, or reaches its ``TimeLimit``.
        #: ``None``: answered calls stay in progress until hung up.
        self.on_answer: Answerer | None = None
        #: How every number not given to :meth:`set_callee` behaves.
        self.default_callee = CalleeBehaviour()
        #: Every status callback sent, in order (failures included).
        self.status_callbacks: list[StatusCallbackDelivery] = []
        #: Deadline for one status callback.
        self.status_callback_timeout_s = STATUS_CALLBACK_TIMEOUT_S
        self._callees: dict[str, CalleeBehaviour] = {}
        self._calls: dict[str, _FakeCall] = {}
        self._created: dict[str, CreatedFakeCall] = {}
        self._lifecycles: set[asyncio.Task[None]] = set()
        self._failures: deque[_InjectedFailure] = deque()
        self._closing = asyncio.Event()
        self._app = Starlette(routes=[Route("/{path:path}", self._handle, methods=_ALL_METHODS)])
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None
        self._http: httpx.AsyncClient | None = None

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
        """Status of every registered and created call, by call SID (a copy)."""
        statuses = {sid: call.status for sid, call in self._created.items()}
        statuses.update((sid, call.status) for sid, call in self._calls.items())
        return statuses

    @property
    def created_calls(self) -> dict[str, CreatedFakeCall]:
        """Every call created through ``Calls.json``, by SID (a copy of the mapping)."""
        return dict(self._created)

    @property
    def status_callback_failures(self) -> list[StatusCallbackDelivery]:
        """Status callbacks that were not answered 2xx."""
        return [d for d in self.status_callbacks if not d.delivered]

    def register_call(
        self,
        call_sid: str,
        *,
        on_completed: OnCompleted | None = None,
        on_redirect: OnRedirect | None = None,
    ) -> None:
        """Add a live (``in-progress``) call; replaces any earlier call with that SID."""
        self._calls[call_sid] = _FakeCall(STATUS_IN_PROGRESS, on_completed, on_redirect)

    def set_callee(
        self,
        number: str,
        outcome: CalleeOutcome,
        *,
        ring_s: float = DEFAULT_RING_S,
        queue_s: float = 0.0,
    ) -> None:
        """Make calls to ``number`` wait ``queue_s`` queued, ring ``ring_s`` seconds, then
        end in ``outcome``."""
        for name, value in (("ring_s", ring_s), ("queue_s", queue_s)):
            if not value >= 0 or math.isinf(value):  # also refuses NaN
                raise ValueError(f"{name} must be a finite number >= 0")
        self._callees[number] = CalleeBehaviour(CalleeOutcome(outcome), ring_s, queue_s)

    def resolve_call(self, call_sid: str, outcome: CalleeOutcome) -> None:
        """Make a created call that is still queued or ringing end its ring in ``outcome`` now.

        ``KeyError`` for an unknown SID; ``ValueError`` once the call was answered or ended.
        """
        call = self._created[call_sid]
        if call.status not in (STATUS_QUEUED, STATUS_RINGING) or call._resolution is not None:
            raise ValueError(f"call {call_sid} is {call.status}; it can no longer be resolved")
        call._resolution = CalleeOutcome(outcome)
        call._resolved.set()

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
        # trust_env=False: status callbacks go to loopback, never through a configured proxy.
        self._http = httpx.AsyncClient(timeout=self.status_callback_timeout_s, trust_env=False)
        config = uvicorn.Config(
            self._app,
            log_config=None,  # leave the process's logging setup alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,  # ours says FAKE instead
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
        lifecycles = list(self._lifecycles)
        for task in lifecycles:
            task.cancel()
        if lifecycles:
            await asyncio.gather(*lifecycles, return_exceptions=True)
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, STOP_TIMEOUT_S)
            finally:
                self._task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None
        self._port = None

    def _url_or_none(self) -> str | None:
        return None if self._port is None else f"http://{FAKE_HOST}:{self._port}"

    # ---- request handling -------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        response = await self._dispatch(request)
        response.headers["Server"] = FAKE_SERVER_HEADER
        return response

    async def _dispatch(self, request: Request) -> Response:
        path = request.url.path
        authorized = self._is_authorized(request.headers.get("authorization"))
        pairs = await _read_form_pairs(request)
        form = dict(pairs) if pairs is not None else None
        self.requests.append(
            RecordedRequest(request.method, path, form or {}, authorized, tuple(pairs or ()))
        )

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

        create = _CALLS_PATH.fullmatch(path)
        if create is not None and request.method == "POST":
            if create["account_sid"] != self.account_sid:
                return _not_found(path)
            if pairs is None:
                return _error(400, None, "Request body is not a valid form")
            return self._create_call(pairs, path)

        match = _CALL_PATH.fullmatch(path)
        if match is None or request.method != "POST":
            return _not_found(path)
        if form is None:
            return _error(400, None, "Request body is not a valid form")
        if match["account_sid"] != self.account_sid:
            return _not_found(path)
        created = self._created.get(match["call_sid"])
        call = self._calls.get(match["call_sid"])
        if call is None and created is not None:
            return self._update_created_call(created, form, path)
        if call is None or call.status != STATUS_IN_PROGRESS:
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

    # ---- outbound calls ---------------------------------------------------------

    def _create_call(self, pairs: Sequence[tuple[str, str]], path: str) -> Response:
        try:
            call = self._parse_create(pairs)
        except _CreateRefused as refused:
            return _error(400, refused.code, refused.message)
        self._created[call.sid] = call
        return JSONResponse(
            self._created_json(call, f"{path.removesuffix('.json')}/{call.sid}.json"),
            status_code=201,
            # Progress starts once the 201 is on the wire, so no status callback can
            # reach the creator before it knows the call's SID.
            background=BackgroundTask(self._start_lifecycle, call),
        )

    def _parse_create(self, pairs: Sequence[tuple[str, str]]) -> CreatedFakeCall:
        form = dict(pairs)
        to, from_ = form.get("To", ""), form.get("From", "")
        if not to:
            raise _CreateRefused(CODE_NO_TO, "A 'To' phone number is required.")
        if not from_:
            raise _CreateRefused(CODE_NO_FROM, "A 'From' phone number is required.")
        if not _DIALLABLE.fullmatch(to):
            raise _CreateRefused(
                CODE_INVALID_PHONE_NUMBER,
                f"The phone number you are attempting to call, {to}, is not valid.",
            )
        if not _DIALLABLE.fullmatch(from_):
            raise _CreateRefused(CODE_CALLS_RESOURCE, f"Invalid From: {from_}")
        url, twiml = form.get("Url"), form.get("Twiml")
        if "ApplicationSid" in form:
            raise _CreateRefused(CODE_CALLS_RESOURCE, "ApplicationSid is not supported by the FAKE")
        if url is None and twiml is None:
            raise _CreateRefused(CODE_INVALID_URL, "Url parameter is required.")
        if url is not None:
            twiml = None  # "If both twiml and url are provided then twiml will be ignored"
            if not _is_absolute_http_url(url):
                raise _CreateRefused(CODE_INVALID_URL, f"Url is not a valid URL: {url}")
        elif twiml is not None and len(twiml) > MAX_TWIML_CHARS:
            raise _CreateRefused(CODE_TWIML_TOO_LARGE, "Twiml size exceeded maximum allowed value")
        method = _method(form.get("Method"), "Method")
        callback = form.get("StatusCallback")
        if callback is not None and not _is_absolute_http_url(callback):
            raise _CreateRefused(CODE_CALLS_RESOURCE, "StatusCallback is not a valid URL")
        callback_method = _method(form.get("StatusCallbackMethod"), "StatusCallbackMethod")
        events = frozenset(value for name, value in pairs if name == "StatusCallbackEvent")
        if not events <= STATUS_CALLBACK_EVENTS:
            raise _CreateRefused(CODE_CALLS_RESOURCE, "Invalid StatusCallbackEvent")
        return CreatedFakeCall(
            sid="CA" + secrets.token_hex(16),
            account_sid=self.account_sid,
            to=to,
            from_=from_,
            url=url,
            twiml=twiml,
            method=method,
            status_callback=callback,
            status_callback_method=callback_method,
            # "If no status_callback_event is specified, we will send the completed status."
            status_callback_events=events or frozenset({EVENT_COMPLETED}),
            timeout_s=_seconds(form.get("Timeout"), "Timeout", DEFAULT_RING_TIMEOUT_S),
            time_limit_s=_seconds(form.get("TimeLimit"), "TimeLimit", DEFAULT_TIME_LIMIT_S),
        )

    def _created_json(self, call: CreatedFakeCall, uri: str) -> dict[str, Any]:
        now = email.utils.format_datetime(datetime.now(UTC))
        return {
            "sid": call.sid,
            "account_sid": call.account_sid,
            "to": call.to,
            "to_formatted": call.to,
            "from": call.from_,
            "from_formatted": call.from_,
            "status": call.status,
            "direction": DIRECTION_OUTBOUND_API,
            "api_version": API_VERSION,
            "date_created": now,
            "date_updated": now,
            "start_time": None,
            "end_time": None,
            "duration": str(call.duration_s) if call.is_over else None,
            "price": None,
            "price_unit": "USD",
            "answered_by": None,
            "parent_call_sid": None,
            "uri": uri,
        }

    def _update_created_call(
        self, call: CreatedFakeCall, form: Mapping[str, str], path: str
    ) -> Response:
        status = form.get("Status")
        if status is not None and status not in (STATUS_COMPLETED, STATUS_CANCELED):
            return _error(400, None, f"Invalid Status: {status!r}")
        if call.is_over:
            return _error(400, CODE_INVALID_CALL_STATE, "Call is not in-progress. Cannot update.")
        ringing = call.status in (STATUS_QUEUED, STATUS_RINGING)
        if status == STATUS_CANCELED and ringing:
            self._end(call, STATUS_CANCELED)
        elif status == STATUS_COMPLETED:
            # An unanswered call hung up this way is reported as canceled (assumption:
            # Twilio's docs only say completed "will attempt to hang up a call").
            self._end(call, STATUS_CANCELED if ringing else STATUS_COMPLETED)
        elif status is None and ("Twiml" in form or "Url" in form):
            if ringing:
                # Not answered yet: the new instructions replace the old ones.
                call.url, call.twiml = form.get("Url"), form.get("Twiml")
            else:
                refused = self._redirect(call, form)
                if refused is not None:
                    return refused
        # Status=canceled of an answered call: Twilio leaves it alone.
        return JSONResponse(self._created_json(call, path))

    def _redirect(self, call: CreatedFakeCall, form: Mapping[str, str]) -> Response | None:
        """Leave ``<Connect><Stream>`` for new TwiML; the call ends unless it hands the call on."""
        twiml = form.get("Twiml")
        if twiml is None:
            # A Url the fake cannot run: the stream stops, the call goes on until hung up.
            call.redirects.append(f"<Redirect>{form['Url']}</Redirect>")
            call.provider_hangup.set()
            return None
        if len(twiml) > MAX_TWIML_CHARS:
            return _error(400, CODE_TWIML_TOO_LARGE, "Twiml size exceeded maximum allowed value")
        try:
            root = ET.fromstring(twiml)
        except ET.ParseError:
            return _error(400, None, "Twiml is not valid XML")
        call.redirects.append(twiml)
        call.provider_hangup.set()
        if not any(verb.tag in CONTINUING_VERBS for verb in root):
            self._end(call, STATUS_COMPLETED)  # the fake "says" it at once, then the TwiML ends
        return None

    def _end(self, call: CreatedFakeCall, status: str) -> None:
        """End ``call`` now with ``status`` (its lifecycle sends the last callback)."""
        call.status = status
        call.ended_at = asyncio.get_running_loop().time()
        call.provider_hangup.set()
        call._end_requested.set()
        call._resolved.set()  # wake a ring in progress

    async def _start_lifecycle(self, call: CreatedFakeCall) -> None:
        # async, so Starlette runs it on the loop (a sync background task goes to a thread).
        if self._closing.is_set():
            return
        task = asyncio.create_task(self._run_call(call), name=f"fake-twilio-call-{call.sid}")
        self._lifecycles.add(task)
        task.add_done_callback(self._lifecycles.discard)

    async def _run_call(self, call: CreatedFakeCall) -> None:
        """Twilio's progress for one outbound call: ring, answer or not, end; callbacks."""
        try:
            try:
                queue_s = self._callees.get(call.to, self.default_callee).queue_s
                if queue_s > 0:  # still queued: a cancel ends the wait
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(call._end_requested.wait(), queue_s)
                await self._notify(call, EVENT_INITIATED, CALL_STATUS_INITIATED)
                if not call.is_over:
                    call.status = STATUS_RINGING
                    await self._notify(call, EVENT_RINGING, STATUS_RINGING)
                    outcome = await self._ring(call)
                    if outcome is CalleeOutcome.ANSWER:
                        await self._converse(call)
                    elif outcome is not None and not call.is_over:
                        self._end(call, _OUTCOME_STATUS[outcome])
            except Exception as exc:  # e.g. an on_answer that is not a coroutine function
                logger.exception("FakeTwilioRest: call %s broke", call.sid)
                self.callback_errors.append(exc)
                if not call.is_over:
                    self._end(call, STATUS_FAILED)
            await self._notify(call, EVENT_COMPLETED, call.status, final=True)
        finally:
            if not call.is_over:  # cancelled by shutdown
                self._end(call, STATUS_FAILED)
            call.ended.set()

    async def _ring(self, call: CreatedFakeCall) -> CalleeOutcome | None:
        """Ring until the callee's outcome (``None`` when the call was ended meanwhile)."""
        behaviour = self._callees.get(call.to, self.default_callee)
        ring_s, outcome = behaviour.ring_s, behaviour.outcome
        if ring_s > call.timeout_s:
            ring_s, outcome = call.timeout_s, CalleeOutcome.NO_ANSWER
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call._resolved.wait(), ring_s)
        if call.is_over:
            return None
        return call._resolution or outcome

    async def _converse(self, call: CreatedFakeCall) -> None:
        """The answered call: run the callee until it hangs up, REST ends it or TimeLimit."""
        loop = asyncio.get_running_loop()
        call.status = STATUS_IN_PROGRESS
        call.answered_at = loop.time()
        await self._notify(call, EVENT_ANSWERED, STATUS_IN_PROGRESS)
        deadline = call.answered_at + call.time_limit_s
        leg: asyncio.Task[None] | None = None
        if self.on_answer is not None and not call.is_over:
            leg = asyncio.create_task(self.on_answer(call), name=f"fake-twilio-callee-{call.sid}")
        end_requested = asyncio.create_task(call._end_requested.wait())
        try:
            waiting: set[asyncio.Task[Any]] = {end_requested} | ({leg} if leg else set())
            while not call.is_over:
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:  # Twilio's own cap on the call's length
                    self._end(call, STATUS_COMPLETED)
                elif leg in done:
                    waiting.discard(leg)
                    if not call.redirects:  # the callee hung up (a redirect moved the call on)
                        self._end(call, STATUS_COMPLETED)
            if leg is not None:
                await self._drain_leg(call, leg)
        finally:
            end_requested.cancel()
            if leg is not None and not leg.done():  # shutdown, or a leg that would not finish
                leg.cancel()
                await asyncio.wait({leg})
                if not leg.cancelled():
                    leg.exception()  # retrieved: it was logged or is moot at shutdown

    async def _drain_leg(self, call: CreatedFakeCall, leg: asyncio.Task[None]) -> None:
        """Let the callee's leg finish (its ``stop``), then record how it went."""
        await asyncio.wait({leg}, timeout=LEG_DRAIN_TIMEOUT_S)
        if not leg.done():
            leg.cancel()
            logger.warning("FakeTwilioRest: callee of call %s did not finish", call.sid)
            return
        if not leg.cancelled() and (exc := leg.exception()) is not None:
            logger.error("FakeTwilioRest on_answer for call %s failed: %r", call.sid, exc)
            self.callback_errors.append(exc)

    async def _notify(
        self, call: CreatedFakeCall, event: str, call_status: str, *, final: bool = False
    ) -> None:
        """Send one signed status callback if the call asked for ``event``; best effort."""
        if call.status_callback is None or event not in call.status_callback_events:
            return
        params = {
            "AccountSid": call.account_sid,
            "ApiVersion": API_VERSION,
            "CallSid": call.sid,
            "CallStatus": call_status,
            "CallbackSource": CALLBACK_SOURCE,
            "Direction": DIRECTION_OUTBOUND_API,
            "From": call.from_,
            "To": call.to,
            "SequenceNumber": str(call._sequence),
            "Timestamp": email.utils.format_datetime(datetime.now(UTC)),
        }
        call._sequence += 1
        if final:
            params["CallDuration"] = str(call.duration_s)
        await self._deliver(call.status_callback, call.status_callback_method, params)

    async def _deliver(self, url: str, method: str, params: Mapping[str, str]) -> None:
        status_code: int | None = None
        error: str | None = None
        host = urlsplit(url).hostname
        if host not in LOOPBACK_HOSTS or self._http is None:
            error = "not a loopback URL: the FAKE never calls out of this machine"
        else:
            try:
                async with asyncio.timeout(self.status_callback_timeout_s):
                    if method == "GET":
                        # GET: the fields go in the query string, which is then what is signed.
                        full = url + ("&" if urlsplit(url).query else "?") + urlencode(params)
                        headers = {SIGNATURE_HEADER: self._signer.compute(full, {})}
                        answer = await self._http.get(full, headers=headers)
                    else:
                        headers = {SIGNATURE_HEADER: self._signer.compute(url, dict(params))}
                        answer = await self._http.post(url, data=dict(params), headers=headers)
                status_code = answer.status_code
                if not answer.is_success:
                    error = f"HTTP {status_code}"
            except (TimeoutError, httpx.HTTPError) as exc:
                error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            logger.warning("FakeTwilioRest status callback to %s failed: %s", url, error)
        self.status_callbacks.append(
            StatusCallbackDelivery(url, method, params, status_code, error)
        )

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


def _is_absolute_http_url(url: str) -> bool:
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - reading the port is what validates it
    except ValueError:
        return False
    return (
        split.scheme in ("http", "https")
        and bool(split.hostname)
        and not any(ch.isspace() for ch in url)
    )


def _method(value: str | None, name: str) -> str:
    if value is None:
        return "POST"  # Twilio's default for Method and StatusCallbackMethod
    if value.upper() not in WEBHOOK_METHODS:
        raise _CreateRefused(CODE_CALLS_RESOURCE, f"{name} must be GET or POST")
    return value.upper()


def _seconds(value: str | None, name: str, default: int) -> int:
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise _CreateRefused(CODE_CALLS_RESOURCE, f"{name} must be a positive whole number")
    if name == "Timeout" and int(value) > MAX_RING_TIMEOUT_S:
        raise _CreateRefused(CODE_CALLS_RESOURCE, f"Timeout must be at most {MAX_RING_TIMEOUT_S}")
    return int(value)


async def _read_form_pairs(request: Request) -> list[tuple[str, str]] | None:
    """The urlencoded body's ``(name, value)`` pairs, or ``None`` if it is not a valid form."""
    body = await request.body()
    if not body:
        return []
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != _FORM_CONTENT_TYPE:
        return None
    try:
        return parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=True,
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        return None


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
