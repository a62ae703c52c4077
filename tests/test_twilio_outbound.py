"""Outbound Twilio calls: ``create_call``/``cancel_or_hang_up`` against the FAKE REST API.

Covers the request shape (checked against what twilio-python sends), error
mapping, the fake's Twilio-like validation and call progress (ringing, answer,
busy, no-answer, cancel, TimeLimit, redirect), signed status callbacks, and an
end-to-end call: our client creates the call, the fake dials, the simulated
callee answers through the real gateway and the echo brain, a REST hang-up
ends it and the completed callback arrives.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from twilio.rest import Client

from rutster.brains.echo import EchoBrain
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.ingress import CallDirection
from rutster.tools.twilio_simulator import SimulatedCallee, TwilioSimulator, best_lag_correlation
from rutster.trunk.twilio.call_control import (
    CALL_SID_PATTERN,
    STATUS_CALLBACK_EVENTS,
    CallControlError,
    CallUpdate,
    CreatedCall,
    TwilioCallControl,
)
from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator
from rutster.trunk.twilio.twiml import (
    MAX_INLINE_TWIML_CHARS,
    reject_twiml,
    say_hangup_twiml,
    transfer_twiml,
)
from tests.conftest import TEST_AUTH_TOKEN, eventually, gateway_config, serve_gateway
from tests.support.fake_twilio_rest import (
    FAKE_SERVER_HEADER,
    CalleeBehaviour,
    CalleeOutcome,
    CreatedFakeCall,
    FakeTwilioRest,
)
from tests.support.twilio_sdk_recorder import RecordingSdkHttpClient

ACCOUNT_SID = "AC" + "5a" * 16
AUTH_TOKEN = TEST_AUTH_TOKEN  # the gateway in the end-to-end test checks signatures with it
CALLEE = "+15557654321"
CALLER = "+15551230000"
#: Ring time for calls a test cancels or resolves by hand: far longer than the test.
LONG_RING_S = 30.0
#: Deadline for a simulated call to end once it should (loopback; generous under load).
END_S = 10.0


# ---- a loopback receiver for status callbacks and voice webhooks ---------------------


@dataclass(frozen=True)
class ReceivedPost:
    """One request the receiver got: path, query, signature header and form pairs."""

    path: str
    url: str
    signature: str | None
    pairs: tuple[tuple[str, str], ...]

    @property
    def form(self) -> dict[str, str]:
        return dict(self.pairs)


class Receiver:
    """A small Starlette app on loopback recording what is posted to it.

    ``/status`` answers ``status_code``; ``/voice`` answers ``voice_twiml``.
    """

    def __init__(self) -> None:
        self.posts: list[ReceivedPost] = []
        self.status_code = 200
        self.voice_twiml = reject_twiml("busy")
        routes = [
            Route("/status", self._status, methods=["GET", "POST"]),
            Route("/voice", self._voice, methods=["POST"]),
        ]
        self._app = Starlette(routes=routes)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._port}{path}"

    def on(self, path: str) -> list[ReceivedPost]:
        return [post for post in self.posts if post.path == path]

    async def _record(self, request: Request) -> None:
        body = (await request.body()).decode()
        self.posts.append(
            ReceivedPost(
                request.url.path,
                str(request.url),
                request.headers.get(SIGNATURE_HEADER),
                tuple(parse_qsl(body or request.url.query, keep_blank_values=True)),
            )
        )

    async def _status(self, request: Request) -> Response:
        await self._record(request)
        return Response("", status_code=self.status_code)

    async def _voice(self, request: Request) -> Response:
        await self._record(request)
        return Response(self.voice_twiml, media_type="text/xml")

    async def __aenter__(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_config=None, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                raise RuntimeError("the receiver stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await asyncio.wait_for(self._task, 5)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTwilioRest]:
    async with FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as server:
        yield server


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver() as running:
        yield running


@pytest.fixture
async def control(fake: FakeTwilioRest) -> AsyncIterator[TwilioCallControl]:
    async with TwilioCallControl(
        account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=fake.base_url
    ) as client:
        yield client


async def _create(
    control: TwilioCallControl, receiver: Receiver | None = None, **overrides: Any
) -> CreatedCall:
    kwargs: dict[str, Any] = {
        "to": CALLEE,
        "from_": CALLER,
        "url": receiver.url("/voice") if receiver else "http://127.0.0.1:9/voice",
        "status_callback": receiver.url("/status") if receiver else None,
    }
    kwargs.update(overrides)
    return await control.create_call(**kwargs)


async def _ended(fake: FakeTwilioRest, sid: str) -> CreatedFakeCall:
    call = fake.created_calls[sid]
    await asyncio.wait_for(call.ended.wait(), END_S)
    return call


def _statuses(receiver: Receiver) -> list[str]:
    return [post.form["CallStatus"] for post in receiver.on("/status")]


# ---- request shape ------------------------------------------------------------------


def _multi(data: dict[str, object]) -> dict[str, list[str]]:
    """SDK form data (lists for repeated fields, ints) as name -> list of strings."""
    return {
        name: [str(v) for v in value] if isinstance(value, list) else [str(value)]
        for name, value in data.items()
    }


async def test_create_call_matches_what_twilio_python_sends(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    url, callback = "https://gw.example.com/twilio/voice", "https://gw.example.com/twilio/status"
    sdk_http = RecordingSdkHttpClient(
        201, {"sid": "CA" + "0" * 32, "account_sid": ACCOUNT_SID, "status": "queued"}
    )
    Client(ACCOUNT_SID, AUTH_TOKEN, http_client=sdk_http).calls.create(
        to=CALLEE,
        from_=CALLER,
        url=url,
        method="POST",
        status_callback=callback,
        status_callback_method="POST",
        status_callback_event=["initiated", "ringing", "answered", "completed"],
        timeout=25,
        time_limit=600,
    )
    created = await control.create_call(
        to=CALLEE,
        from_=CALLER,
        url=url,
        status_callback=callback,
        timeout_s=25,
        time_limit_s=600,
    )

    [sdk_request] = sdk_http.sent
    [ours] = fake.requests
    sdk_url = httpx.URL(sdk_request["uri"])
    assert (sdk_request["method"], sdk_url.host, sdk_url.path) == (
        ours.method,
        "api.twilio.com",
        ours.path,
    )
    assert sdk_request["auth"] == (ACCOUNT_SID, AUTH_TOKEN) and ours.authorized
    ours_multi: dict[str, list[str]] = {}
    for name, value in ours.fields:
        ours_multi.setdefault(name, []).append(value)
    assert _multi(sdk_request["data"]) == ours_multi
    assert ours_multi["StatusCallbackEvent"] == list(STATUS_CALLBACK_EVENTS)
    assert CALL_SID_PATTERN.fullmatch(created.sid) and created.status == "queued"


async def test_create_call_without_options_sends_only_what_is_needed(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    await control.create_call(
        to="sip:agent@pbx.example.com", from_=CALLER, url="http://gw/voice", status_callback=None
    )
    [request] = fake.requests
    assert request.form == {
        "To": "sip:agent@pbx.example.com",
        "From": CALLER,
        "Url": "http://gw/voice",
        "Method": "POST",
    }


# ---- client-side errors and error mapping --------------------------------------------

BAD_CREATE_ARGUMENTS: list[dict[str, Any]] = [
    {"to": "5557654321"},
    {"to": "+1 555 765 4321"},
    {"to": "client:alice"},
    {"to": ""},
    {"from_": "sip:me@pbx.example.com"},
    {"from_": "+15551230000\n"},
    {"url": "/twilio/voice"},
    {"url": "ftp://gw.example.com/voice"},
    {"url": "https://user:pw@gw.example.com/voice"},
    {"url": "https://gw.example.com/voice#x"},
    {"url": "https://gw.example.com/a b"},
    {"url": "https://gw.example.com:99999/voice"},
    {"url": "https://gw.example.com/" + "x" * 3000},
    {"status_callback": "wss://gw.example.com/status"},
    {"timeout_s": 0},
    {"timeout_s": 601},
    {"timeout_s": True},
    {"timeout_s": 1.5},
    {"time_limit_s": 0},
    {"time_limit_s": 86_401},
]


async def test_bad_create_arguments_are_refused_before_any_request(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    for overrides in BAD_CREATE_ARGUMENTS:
        with pytest.raises(CallControlError) as info:
            await _create(control, **overrides)
        assert info.value.reason == "bad_request", overrides
        assert AUTH_TOKEN not in str(info.value)
    assert fake.requests == []


INJECTED_CREATE_FAILURES: list[tuple[int, int | None, str]] = [
    (400, 21217, "http_error"),  # Twilio: "Phone number does not appear to be valid"
    (400, 21210, "http_error"),  # Twilio: 'From' number not verified
    (429, 20429, "http_error"),
    (503, None, "http_error"),
    (401, 20003, "auth_failed"),
]


async def test_create_failures_map_to_reasons(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    for status_code, code, reason in INJECTED_CREATE_FAILURES:
        fake.fail_next(status_code, code)
        with pytest.raises(CallControlError) as info:
            await _create(control)
        assert info.value.reason == reason, (status_code, code)
        assert (info.value.status_code, info.value.twilio_code) == (status_code, code)
    assert fake.created_calls == {}
    assert isinstance(info.value, CallControlFailure)


async def test_create_with_the_wrong_token_is_auth_failed(fake: FakeTwilioRest) -> None:
    async with TwilioCallControl(
        account_sid=ACCOUNT_SID, auth_token="wrong-token", base_url=fake.base_url
    ) as control:
        with pytest.raises(CallControlError) as info:
            await _create(control)
    assert info.value.reason == "auth_failed"
    assert fake.created_calls == {}


async def test_create_timeout_network_and_bad_response() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with TwilioCallControl(
        account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=f"http://127.0.0.1:{port}"
    ) as control:
        with pytest.raises(CallControlError) as info:
            await _create(control)
    assert info.value.reason == "network"

    slow = FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, delay_s=5)
    async with slow:
        control = TwilioCallControl(
            account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=slow.base_url, timeout_s=0.2
        )
        async with control:
            with pytest.raises(CallControlError) as info:
                await _create(control)
    assert info.value.reason == "timeout"

    for body in [
        {"account_sid": ACCOUNT_SID, "status": "queued"},
        {"sid": "CA../../x", "status": "queued"},
    ]:
        answer = httpx.Response(201, json=body)
        async with (
            httpx.AsyncClient(transport=httpx.MockTransport(lambda _, a=answer: a)) as client,
            TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client) as bad,
        ):
            with pytest.raises(CallControlError) as info:
                await _create(bad)
        assert info.value.reason == "bad_response", body


async def test_create_after_close_is_refused(fake: FakeTwilioRest) -> None:
    control = TwilioCallControl(
        account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=fake.base_url
    )
    await control.aclose()
    with pytest.raises(CallControlError) as info:
        await _create(control)
    assert info.value.reason == "closed"
    assert fake.requests == []


async def test_oversized_redirect_twiml_is_refused(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    twiml = "<Response><Say>" + "a" * MAX_INLINE_TWIML_CHARS + "</Say></Response>"
    with pytest.raises(CallControlError) as info:
        await control.redirect("CA" + "1" * 32, twiml)
    assert info.value.reason == "bad_twiml"
    assert fake.requests == []


# ---- the fake's validation -----------------------------------------------------------

VALID_CREATE = {"To": CALLEE, "From": CALLER, "Url": "http://127.0.0.1:9/voice"}
Form = Mapping[str, str | Sequence[str]]
INVALID_CREATES: list[tuple[Form, int]] = [
    ({"From": CALLER, "Url": "http://h/v"}, 21201),
    ({"To": "", "From": CALLER, "Url": "http://h/v"}, 21201),
    ({"To": CALLEE, "Url": "http://h/v"}, 21213),
    ({"To": CALLEE, "From": CALLER}, 21205),
    (VALID_CREATE | {"Url": "/relative"}, 21205),
    (VALID_CREATE | {"Url": "ftp://h/v"}, 21205),
    (VALID_CREATE | {"To": "5557654321"}, 21217),
    (VALID_CREATE | {"To": "+1 555"}, 21217),
    (VALID_CREATE | {"From": "me"}, 21200),
    (VALID_CREATE | {"Method": "PUT"}, 21200),
    (VALID_CREATE | {"StatusCallback": "not a url"}, 21200),
    (VALID_CREATE | {"StatusCallback": "http://h/s", "StatusCallbackMethod": "DELETE"}, 21200),
    ({**VALID_CREATE, "StatusCallbackEvent": ["answered", "x"]}, 21200),
    (VALID_CREATE | {"Timeout": "abc"}, 21200),
    (VALID_CREATE | {"Timeout": "0"}, 21200),
    (VALID_CREATE | {"Timeout": "601"}, 21200),
    (VALID_CREATE | {"Timeout": "١٢"}, 21200),  # Arabic-Indic digits are digits, not ASCII
    (VALID_CREATE | {"TimeLimit": "-5"}, 21200),
    ({"To": CALLEE, "From": CALLER, "ApplicationSid": "AP" + "0" * 32}, 21200),
    ({"To": CALLEE, "From": CALLER, "Twiml": "<Response>" + " " * 4000 + "</Response>"}, 32018),
]


async def _raw_create(
    fake: FakeTwilioRest,
    form: Form,
    *,
    auth: tuple[str, str] = (ACCOUNT_SID, AUTH_TOKEN),
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=fake.base_url, auth=auth) as client:
        return await client.post(f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json", data=form)


async def test_fake_refuses_invalid_creates_like_twilio(fake: FakeTwilioRest) -> None:
    for form, code in INVALID_CREATES:
        response = await _raw_create(fake, form)
        assert response.status_code == 400, form
        body = response.json()
        assert (body["code"], body["status"]) == (code, 400), form
        assert body["more_info"] == f"https://www.twilio.com/docs/errors/{code}"
        assert response.headers["server"] == FAKE_SERVER_HEADER
    assert fake.created_calls == {}


async def test_fake_create_needs_auth_and_a_form(fake: FakeTwilioRest) -> None:
    response = await _raw_create(fake, VALID_CREATE, auth=(ACCOUNT_SID, "nope"))
    assert (response.status_code, response.json()["code"]) == (401, 20003)
    async with httpx.AsyncClient(base_url=fake.base_url, auth=(ACCOUNT_SID, AUTH_TOKEN)) as client:
        response = await client.post(
            f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json", json=VALID_CREATE
        )
    assert response.status_code == 400
    assert fake.created_calls == {}


async def test_fake_created_call_resource_is_twilio_shaped(fake: FakeTwilioRest) -> None:
    fake.default_callee = CalleeBehaviour(CalleeOutcome.NO_ANSWER, ring_s=LONG_RING_S)
    response = await _raw_create(fake, VALID_CREATE | {"Twiml": "<Response/>"})
    assert response.status_code == 201
    assert response.headers["server"] == FAKE_SERVER_HEADER
    assert "uvicorn" not in response.headers.get_list("server")
    body = response.json()
    sid = body["sid"]
    assert CALL_SID_PATTERN.fullmatch(sid)
    assert body["status"] == "queued"
    assert (body["to"], body["from"], body["direction"]) == (CALLEE, CALLER, "outbound-api")
    assert body["account_sid"] == ACCOUNT_SID and body["api_version"] == "2010-04-01"
    assert body["uri"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{sid}.json"
    call = fake.created_calls[sid]
    # Url wins over Twiml ("if both twiml and url are provided then twiml will be ignored").
    assert (call.url, call.twiml, call.method) == (VALID_CREATE["Url"], None, "POST")
    assert (call.timeout_s, call.time_limit_s) == (60, 14_400)  # Twilio's defaults


# ---- call progress and status callbacks ----------------------------------------------


async def test_answered_call_reports_every_event_and_hangs_up(
    fake: FakeTwilioRest, control: TwilioCallControl, receiver: Receiver
) -> None:
    created = await _create(control, receiver)
    call = fake.created_calls[created.sid]
    await eventually(lambda: call.status == "in-progress")
    assert fake.calls[created.sid] == "in-progress"
    update = await control.hangup(created.sid)
    assert update == CallUpdate(sid=created.sid, status="completed")
    await _ended(fake, created.sid)
    assert call.provider_hangup.is_set()
    assert _statuses(receiver) == ["initiated", "ringing", "in-progress", "completed"]
    validator = TwilioSignatureValidator(AUTH_TOKEN)
    for seq, post in enumerate(receiver.on("/status")):
        assert validator.validate(receiver.url("/status"), list(post.pairs), post.signature)
        form = post.form
        assert form["CallSid"] == created.sid and form["AccountSid"] == ACCOUNT_SID
        assert (form["Direction"], form["From"], form["To"]) == ("outbound-api", CALLER, CALLEE)
        assert form["SequenceNumber"] == str(seq)
        assert ("CallDuration" in form) == (form["CallStatus"] == "completed")
    assert receiver.on("/status")[-1].form["CallDuration"] in ("0", "1")
    assert fake.status_callback_failures == []
    # The answered call had no callee simulation (on_answer unset): nothing was posted to Url.
    assert receiver.on("/voice") == []
    with pytest.raises(CallControlError) as info:
        await control.hangup(created.sid)
    assert (info.value.reason, info.value.twilio_code) == ("already_ended", 21220)


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (CalleeOutcome.BUSY, "busy"),
        (CalleeOutcome.NO_ANSWER, "no-answer"),
        (CalleeOutcome.FAILED, "failed"),
    ],
)
async def test_unanswered_outcomes(
    fake: FakeTwilioRest,
    control: TwilioCallControl,
    receiver: Receiver,
    outcome: CalleeOutcome,
    status: str,
) -> None:
    fake.set_callee(CALLEE, outcome)
    answered: list[str] = []

    async def on_answer(call: CreatedFakeCall) -> None:
        answered.append(call.sid)

    fake.on_answer = on_answer
    created = await _create(control, receiver)
    call = await _ended(fake, created.sid)
    assert call.status == status and call.answered_at is None
    assert _statuses(receiver) == ["initiated", "ringing", status]
    assert receiver.on("/status")[-1].form["CallDuration"] == "0"
    assert answered == []


async def test_ringing_past_timeout_is_no_answer(
    fake: FakeTwilioRest, control: TwilioCallControl, receiver: Receiver
) -> None:
    fake.set_callee(CALLEE, CalleeOutcome.ANSWER, ring_s=LONG_RING_S)
    created = await _create(control, receiver, timeout_s=1)
    call = await _ended(fake, created.sid)
    assert call.status == "no-answer"
    assert _statuses(receiver)[-1] == "no-answer"


async def test_cancel_or_hang_up_cancels_a_ringing_call(
    fake: FakeTwilioRest, control: TwilioCallControl, receiver: Receiver
) -> None:
    fake.set_callee(CALLEE, CalleeOutcome.ANSWER, ring_s=LONG_RING_S)
    created = await _create(control, receiver)
    call = fake.created_calls[created.sid]
    await eventually(lambda: call.status == "ringing")
    update = await control.cancel_or_hang_up(created.sid)
    assert update == CallUpdate(sid=created.sid, status="canceled")
    await _ended(fake, created.sid)
    assert [r.form.get("Status") for r in fake.requests[1:]] == ["canceled"]
    assert _statuses(receiver) == ["initiated", "ringing", "canceled"]


async def test_cancel_or_hang_up_hangs_up_an_answered_call(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    created = await _create(control)
    call = fake.created_calls[created.sid]
    await eventually(lambda: call.status == "in-progress")
    update = await control.cancel_or_hang_up(created.sid)
    assert update == CallUpdate(sid=created.sid, status="completed")
    # canceled leaves an answered call alone (Twilio docs), so completed follows.
    assert [r.form.get("Status") for r in fake.requests[1:]] == ["canceled", "completed"]
    assert (await _ended(fake, created.sid)).status == "completed"


async def test_cancel_or_hang_up_of_an_ended_call_is_already_ended(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    fake.set_callee(CALLEE, CalleeOutcome.BUSY)
    created = await _create(control)
    await _ended(fake, created.sid)
    with pytest.raises(CallControlError) as info:
        await control.cancel_or_hang_up(created.sid)
    assert info.value.reason == "already_ended"


async def test_hangup_of_a_ringing_call_cancels_it(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    fake.set_callee(CALLEE, CalleeOutcome.ANSWER, ring_s=LONG_RING_S)
    created = await _create(control)
    await eventually(lambda: fake.calls[created.sid] == "ringing")
    assert (await control.hangup(created.sid)).status == "canceled"
    assert (await _ended(fake, created.sid)).status == "canceled"


async def test_resolve_call_decides_a_ringing_call(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    fake.set_callee(CALLEE, CalleeOutcome.NO_ANSWER, ring_s=LONG_RING_S)
    created = await _create(control)
    fake.resolve_call(created.sid, CalleeOutcome.BUSY)
    call = await _ended(fake, created.sid)
    assert call.status == "busy"
    with pytest.raises(ValueError):
        fake.resolve_call(created.sid, CalleeOutcome.ANSWER)
    with pytest.raises(KeyError):
        fake.resolve_call("CA" + "0" * 32, CalleeOutcome.ANSWER)
    with pytest.raises(ValueError):
        fake.set_callee(CALLEE, CalleeOutcome.ANSWER, ring_s=float("nan"))


async def test_time_limit_ends_an_answered_call(
    fake: FakeTwilioRest, control: TwilioCallControl, receiver: Receiver
) -> None:
    created = await _create(control, receiver, time_limit_s=1)
    call = await _ended(fake, created.sid)
    assert call.status == "completed" and call.provider_hangup.is_set()
    final = receiver.on("/status")[-1].form
    assert (final["CallStatus"], final["CallDuration"]) == ("completed", "1")


async def test_redirects_of_an_answered_call(
    fake: FakeTwilioRest, control: TwilioCallControl
) -> None:
    goodbye = await _create(control)
    transfer = await _create(control)
    await eventually(lambda: fake.calls[goodbye.sid] == fake.calls[transfer.sid] == "in-progress")
    # A goodbye prompt ends the call once said; a <Dial> hands it on.
    await control.redirect(goodbye.sid, say_hangup_twiml("Goodbye & thanks <3"))
    assert (await _ended(fake, goodbye.sid)).status == "completed"
    await control.redirect(transfer.sid, transfer_twiml("+15550001111"))
    call = fake.created_calls[transfer.sid]
    assert call.provider_hangup.is_set() and call.status == "in-progress"
    assert call.redirects == [transfer_twiml("+15550001111")]
    await control.hangup(transfer.sid)
    assert (await _ended(fake, transfer.sid)).status == "completed"


async def test_status_callbacks_default_to_completed_and_failures_are_recorded(
    fake: FakeTwilioRest, receiver: Receiver
) -> None:
    receiver.status_code = 500
    form = VALID_CREATE | {"StatusCallback": receiver.url("/status"), "Timeout": "5"}
    fake.set_callee(CALLEE, CalleeOutcome.BUSY)
    response = await _raw_create(fake, form)
    await _ended(fake, response.json()["sid"])
    # No StatusCallbackEvent: Twilio sends only the completed event.
    assert _statuses(receiver) == ["busy"]
    [failure] = fake.status_callback_failures
    assert (failure.status_code, failure.error) == (500, "HTTP 500")

    # A callback off this machine is never attempted (the FAKE stays on loopback).
    response = await _raw_create(fake, VALID_CREATE | {"StatusCallback": "http://example.com/s"})
    await _ended(fake, response.json()["sid"])
    last = fake.status_callbacks[-1]
    assert last.status_code is None and last.error is not None and "loopback" in last.error


async def test_get_status_callbacks_are_signed_over_the_query(
    fake: FakeTwilioRest, receiver: Receiver
) -> None:
    callback = receiver.url("/status") + "?tenant=acme"
    form = VALID_CREATE | {"StatusCallback": callback, "StatusCallbackMethod": "GET"}
    fake.set_callee(CALLEE, CalleeOutcome.NO_ANSWER)
    response = await _raw_create(fake, form)
    await _ended(fake, response.json()["sid"])
    [post] = receiver.on("/status")
    assert post.form["CallStatus"] == "no-answer" and post.form["tenant"] == "acme"
    assert TwilioSignatureValidator(AUTH_TOKEN).validate(post.url, [], post.signature)


# ---- the simulated callee ------------------------------------------------------------


async def test_simulated_callee_posts_the_outbound_webhook(
    fake: FakeTwilioRest, control: TwilioCallControl, receiver: Receiver
) -> None:
    """The callee's webhook: signed over the full Url (query included), outbound-api."""
    callee = SimulatedCallee(b"\x00\x00" * 800, auth_token=AUTH_TOKEN, tail_s=0.1)
    fake.on_answer = callee
    url = receiver.url("/voice") + "?brain=default&x=%20y"
    created = await _create(control, receiver, url=url)
    call = await _ended(fake, created.sid)
    [webhook] = receiver.on("/voice")
    assert TwilioSignatureValidator(AUTH_TOKEN).validate(
        url, list(webhook.pairs), webhook.signature
    )
    assert webhook.form == {
        "AccountSid": ACCOUNT_SID,
        "ApiVersion": "2010-04-01",
        "CallSid": created.sid,
        "CallStatus": "in-progress",
        "Direction": "outbound-api",
        "From": CALLER,
        "To": CALLEE,
    }
    # The receiver answered <Reject>, not a stream: the simulation failed, the call ended.
    assert isinstance(callee.errors[created.sid], ValueError)
    assert fake.callback_errors == [callee.errors[created.sid]]
    assert call.status == "completed"
    assert created.sid not in callee.results


async def test_simulator_webhook_options_are_checked() -> None:
    sim = TwilioSimulator("http://127.0.0.1:9", auth_token=AUTH_TOKEN)
    assert sim.voice_url("a=1") == "http://127.0.0.1:9/twilio/voice?a=1"
    with pytest.raises(ValueError):
        await sim.open_stream("CA1", from_="+1", to="+2", query="a=1", webhook_url="http://h/v")
    with pytest.raises(ValueError):
        await sim.post_webhook("http://h/v", "CA1", from_="+1", to="+2", direction="sideways")


async def test_outbound_call_end_to_end(echo_brain: EchoBrain, speech_pcm: bytes) -> None:
    """create_call → the fake dials → callee answers through the gateway → echo → hang-up."""
    speech = speech_pcm[5 * 16_000 : 7 * 16_000]  # 2 s of speech, PCM16 8 kHz
    frames = len(speech) // 320
    callee = SimulatedCallee(speech, auth_token=AUTH_TOKEN, tail_s=END_S)
    async with (
        FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as fake,
        Receiver() as receiver,
    ):
        fake.on_answer = callee
        config = gateway_config(
            echo_brain.url,
            barge_in=False,  # the echo plays the callee's own voice back while they talk
            twilio_account_sid=ACCOUNT_SID,
            twilio_api_base_url=fake.base_url,
        )
        async with (
            serve_gateway(config) as gw,
            TwilioCallControl(
                account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=fake.base_url
            ) as control,
        ):
            created = await control.create_call(
                to=CALLEE,
                from_=CALLER,
                url=f"{gw.url}/twilio/voice",
                status_callback=receiver.url("/status"),
                timeout_s=30,
                time_limit_s=120,
            )
            await eventually(lambda: len(gw.state.calls) == 1)
            live = next(iter(gw.state.calls.values()))
            assert live.context.call_id == created.sid
            assert live.context.direction is CallDirection.OUTBOUND
            assert (live.context.from_, live.context.to) == (CALLER, CALLEE)
            # All the callee's speech has come back through the echo brain and the gateway.
            await eventually(lambda: live.frames_out >= frames - 5, END_S)
            await asyncio.sleep(0.3)  # the last frames play out at the callee
            assert (await control.hangup(created.sid)).status == "completed"
            call = await _ended(fake, created.sid)
            await eventually(lambda: not gw.state.calls)

    result = callee.results[created.sid]
    assert result.hung_up_by_provider
    assert result.frames_sent == frames
    corr, lag = best_lag_correlation(speech, result.heard_pcm)
    assert corr >= 0.9, corr
    assert 0 < lag / 8 < 400  # round trip in ms
    assert live.end_reason is not None and live.end_reason.value == "caller_hangup"
    assert call.status == "completed"
    assert _statuses(receiver) == ["initiated", "ringing", "in-progress", "completed"]
    final = receiver.on("/status")[-1]
    assert int(final.form["CallDuration"]) >= 2
    assert TwilioSignatureValidator(AUTH_TOKEN).validate(
        receiver.url("/status"), list(final.pairs), final.signature
    )
    assert fake.callback_errors == [] and fake.status_callback_failures == []
    assert callee.errors == {}
