"""Twilio call control (hang-up, redirect) against the FAKE Twilio REST server on loopback."""

from __future__ import annotations

import base64
import logging
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from twilio.rest import Client

from rutster.trunk.twilio.call_control import (
    CallControlError,
    CallUpdate,
    TwilioCallControl,
)
from rutster.trunk.twilio.twiml import transfer_twiml
from tests.support.fake_twilio_rest import FakeTwilioRest
from tests.support.twilio_sdk_recorder import RecordingSdkHttpClient

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
AUTH_TOKEN = "secret-auth-token-do-not-leak-4242"
CALL_SID = "CA" + "fedcba9876543210" * 2
OTHER_CALL_SID = "CA" + "a" * 32
#: Small enough to keep the timeout test fast, large enough for loopback under load.
SHORT_TIMEOUT_S = 0.2


def _basic_credentials() -> str:
    return base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()


@pytest.fixture
async def fake() -> AsyncIterator[FakeTwilioRest]:
    async with FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN) as server:
        yield server


def _control(fake: FakeTwilioRest, **overrides: Any) -> TwilioCallControl:
    kwargs: dict[str, Any] = {
        "account_sid": ACCOUNT_SID,
        "auth_token": AUTH_TOKEN,
        "base_url": fake.base_url,
    }
    kwargs.update(overrides)
    return TwilioCallControl(**kwargs)


def _call_path(call_sid: str = CALL_SID) -> str:
    return f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{call_sid}.json"


async def test_hangup_completes_the_call_and_runs_the_callback(fake: FakeTwilioRest) -> None:
    completed: list[str] = []

    async def on_completed() -> None:
        completed.append(CALL_SID)

    fake.register_call(CALL_SID, on_completed=on_completed)
    fake.register_call(OTHER_CALL_SID)
    async with _control(fake) as control:
        update = await control.hangup(CALL_SID)

    assert update == CallUpdate(sid=CALL_SID, status="completed")
    assert completed == [CALL_SID]
    assert fake.calls == {CALL_SID: "completed", OTHER_CALL_SID: "in-progress"}
    [request] = fake.requests
    assert (request.method, request.path, dict(request.form), request.authorized) == (
        "POST",
        _call_path(),
        {"Status": "completed"},
        True,
    )


async def test_second_hangup_is_already_ended(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    async with _control(fake) as control:
        await control.hangup(CALL_SID)
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "already_ended"
    assert (info.value.status_code, info.value.twilio_code) == (404, 20404)


async def test_unknown_call_is_already_ended(fake: FakeTwilioRest) -> None:
    async with _control(fake) as control:
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
        with pytest.raises(CallControlError) as redirect_info:
            await control.redirect(CALL_SID, transfer_twiml("+15551230000"))
    assert info.value.reason == redirect_info.value.reason == "already_ended"


async def test_wrong_token_is_auth_failed(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    async with _control(fake, auth_token="not-the-token") as control:
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "auth_failed"
    assert (info.value.status_code, info.value.twilio_code) == (401, 20003)
    assert fake.calls[CALL_SID] == "in-progress"
    assert [r.authorized for r in fake.requests] == [False]


async def test_wrong_account_is_auth_failed(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    async with _control(fake, account_sid="AC" + "1" * 32) as control:
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "auth_failed"
    assert fake.calls[CALL_SID] == "in-progress"


BAD_CALL_SIDS = [
    "",
    "CA123",
    "CA" + "0" * 31,
    "CA" + "0" * 33,
    "ca" + "0" * 32,
    "XX" + "0" * 32,
    "CA" + "g" * 32,
    "CA" + "\u0660" * 32,  # Arabic-Indic digit zero: a regex \d would take it; hex must not
    "CA" + "0" * 32 + "\n",
    "CA" + "0" * 30 + "/x",
    "../../Accounts/AC" + "0" * 32 + "/Calls",
    "CA" + "0" * 32 + "?Status=completed",
    "CA" + "0" * 32 + "#",
]


async def test_bad_call_sid_is_refused_before_any_request(fake: FakeTwilioRest) -> None:
    # One server for all cases: each uvicorn shutdown costs ~0.15 s.
    async with _control(fake) as control:
        for bad_sid in BAD_CALL_SIDS:
            with pytest.raises(CallControlError) as info:
                await control.hangup(bad_sid)
            assert info.value.reason == "bad_call_sid", bad_sid
            with pytest.raises(CallControlError) as info:
                await control.redirect(bad_sid, transfer_twiml("+15551230000"))
            assert info.value.reason == "bad_call_sid", bad_sid
    assert fake.requests == []


async def test_slow_api_is_a_timeout(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    fake.delay_s = 5.0  # far beyond the client's deadline; the fake cuts it short on exit
    async with _control(fake, timeout_s=SHORT_TIMEOUT_S) as control:
        started = time.monotonic()
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
        elapsed = time.monotonic() - started
    assert info.value.reason == "timeout"
    assert SHORT_TIMEOUT_S * 0.9 <= elapsed < 2.0
    assert fake.calls[CALL_SID] == "in-progress"


async def test_nothing_listening_is_a_network_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Port released and never listened on: connection refused.
    async with TwilioCallControl(
        account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, base_url=f"http://127.0.0.1:{port}"
    ) as control:
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "network"


async def test_redirect_to_transfer_twiml(fake: FakeTwilioRest) -> None:
    redirected: list[str] = []

    async def on_redirect(twiml: str) -> None:
        redirected.append(twiml)

    fake.register_call(CALL_SID, on_redirect=on_redirect)
    twiml = transfer_twiml("sip:agent@pbx.example.com;transport=tls")
    async with _control(fake) as control:
        update = await control.redirect(CALL_SID, twiml)

    assert update == CallUpdate(sid=CALL_SID, status="in-progress")
    assert redirected == [twiml]
    [request] = fake.requests
    assert dict(request.form) == {"Twiml": twiml}
    sip = ET.fromstring(request.form["Twiml"].encode()).find("./Dial/Sip")
    assert sip is not None and sip.text == "sip:agent@pbx.example.com;transport=tls"
    assert fake.calls[CALL_SID] == "in-progress"


def _recording_client(seen: list[httpx.Request]) -> httpx.AsyncClient:
    """A client that records requests and answers 500: for tests that expect none to be sent."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(500)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_empty_twiml_is_refused() -> None:
    seen: list[httpx.Request] = []
    async with (
        _recording_client(seen) as client,
        TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client) as control,
    ):
        with pytest.raises(CallControlError) as info:
            await control.redirect(CALL_SID, "  ")
    assert info.value.reason == "bad_twiml"
    assert seen == []


INJECTED_FAILURES: list[tuple[int, int | None, str]] = [
    (500, 20500, "http_error"),
    (429, 20429, "http_error"),
    (503, None, "http_error"),
    (404, None, "http_error"),  # a 404 that is not Twilio's "no such call"
    (403, 20003, "auth_failed"),
    (400, 21220, "already_ended"),  # "Invalid call state": not in progress any more
]


async def test_injected_failures_map_to_reasons(fake: FakeTwilioRest) -> None:
    async with _control(fake) as control:
        for status_code, code, reason in INJECTED_FAILURES:
            fake.register_call(CALL_SID)
            fake.fail_next(status_code, code)
            with pytest.raises(CallControlError) as info:
                await control.hangup(CALL_SID)
            assert info.value.reason == reason, (status_code, code)
            assert (info.value.status_code, info.value.twilio_code) == (status_code, code)
            # The failure was used once: the next request goes through.
            assert (await control.hangup(CALL_SID)).status == "completed"


def test_repr_hides_the_token() -> None:
    text = repr(TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN))
    assert ACCOUNT_SID in text
    assert AUTH_TOKEN not in text
    assert _basic_credentials() not in text
    assert AUTH_TOKEN not in repr(FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN))


async def test_logs_and_errors_never_show_the_token(
    fake: FakeTwilioRest, caplog: pytest.LogCaptureFixture
) -> None:
    fake.register_call(CALL_SID)
    errors: list[CallControlError] = []
    with caplog.at_level(logging.DEBUG):
        async with _control(fake, auth_token=AUTH_TOKEN + "-wrong") as control:
            with pytest.raises(CallControlError) as info:
                await control.hangup(CALL_SID)
            errors.append(info.value)
        fake.fail_next(500, 20500)
        async with _control(fake) as control:
            with pytest.raises(CallControlError) as info:
                await control.redirect(CALL_SID, transfer_twiml("+15551230000"))
            errors.append(info.value)
            update = await control.hangup(CALL_SID)
    assert update.status == "completed"
    assert [e.reason for e in errors] == ["auth_failed", "http_error"]
    assert "hangup of call" in caplog.text  # the capture did see our log lines
    for text in [caplog.text, *(str(e) for e in errors), *(repr(e) for e in errors)]:
        assert AUTH_TOKEN not in text
        assert _basic_credentials() not in text


async def test_token_echoed_by_the_server_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    def echo_token(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"code": 21999, "message": f"bad token {AUTH_TOKEN}"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(echo_token)) as client:
        control = TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client)
        with caplog.at_level(logging.DEBUG), pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
        await control.aclose()
        assert not client.is_closed  # a shared client is the caller's to close
    assert info.value.reason == "http_error"
    assert info.value.twilio_code == 21999
    assert "<redacted>" in str(info.value)
    assert AUTH_TOKEN not in str(info.value)
    assert AUTH_TOKEN not in caplog.text


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>not json</html>"),
        httpx.Response(200, json=["a", "list"]),
        httpx.Response(200, json={"sid": CALL_SID}),
        httpx.Response(200, json={"sid": 7, "status": "completed"}),
    ],
)
async def test_malformed_success_is_bad_response(answer: httpx.Response) -> None:
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(lambda _: answer)) as client,
        TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client) as control,
    ):
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "bad_response"


@pytest.mark.parametrize(
    "overrides",
    [
        {"account_sid": "AC123"},
        {"account_sid": "AC" + "0" * 32 + "/../x"},
        {"auth_token": ""},
        {"base_url": "api.twilio.com"},
        {"base_url": "ftp://api.twilio.com"},
        {"base_url": "https://api.twilio.com?x=1"},
        {"base_url": f"https://{ACCOUNT_SID}:{AUTH_TOKEN}@api.twilio.com"},
        {"base_url": "https://"},
        {"timeout_s": 0.0},
        {"timeout_s": float("nan")},
    ],
)
def test_bad_config_is_refused(overrides: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"account_sid": ACCOUNT_SID, "auth_token": AUTH_TOKEN}
    kwargs.update(overrides)
    with pytest.raises(CallControlError) as info:
        TwilioCallControl(**kwargs)
    assert info.value.reason == "bad_config"
    assert AUTH_TOKEN not in str(info.value)


async def test_use_after_close_is_refused() -> None:
    seen: list[httpx.Request] = []
    async with _recording_client(seen) as client:
        control = TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client)
        await control.aclose()
        await control.aclose()  # idempotent
        with pytest.raises(CallControlError) as info:
            await control.hangup(CALL_SID)
    assert info.value.reason == "closed"
    assert seen == []


async def test_shared_client_closed_by_its_owner_is_refused() -> None:
    seen: list[httpx.Request] = []
    client = _recording_client(seen)
    await client.aclose()
    control = TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, client=client)
    with pytest.raises(CallControlError) as info:
        await control.hangup(CALL_SID)
    assert info.value.reason == "closed"
    assert seen == []


async def test_owned_client_is_closed() -> None:
    control = TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN)
    async with control:
        pass
    with pytest.raises(CallControlError) as info:
        await control.redirect(CALL_SID, transfer_twiml("+15551230000"))
    assert info.value.reason == "closed"
    assert control._client.is_closed


def test_default_base_url_is_twilio() -> None:
    control = TwilioCallControl(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN)
    assert control.call_url(CALL_SID) == (
        f"https://api.twilio.com/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{CALL_SID}.json"
    )


async def test_requests_match_what_twilio_python_sends(fake: FakeTwilioRest) -> None:
    twiml = transfer_twiml("+15551230000")
    sdk_http = RecordingSdkHttpClient(
        200, {"sid": CALL_SID, "account_sid": ACCOUNT_SID, "status": "completed"}
    )
    sdk = Client(ACCOUNT_SID, AUTH_TOKEN, http_client=sdk_http)
    sdk.calls(CALL_SID).update(twiml=twiml)
    sdk.calls(CALL_SID).update(status="completed")

    fake.register_call(CALL_SID)
    async with _control(fake) as control:
        await control.redirect(CALL_SID, twiml)
        await control.hangup(CALL_SID)

    assert len(sdk_http.sent) == len(fake.requests) == 2
    for sdk_request, ours in zip(sdk_http.sent, fake.requests, strict=True):
        sdk_url = httpx.URL(sdk_request["uri"])
        assert (sdk_request["method"], sdk_url.host, sdk_url.path) == (
            ours.method,
            "api.twilio.com",
            ours.path,
        )
        assert sdk_request["data"] == dict(ours.form)
        assert sdk_request["auth"] == (ACCOUNT_SID, AUTH_TOKEN)
        assert ours.authorized


# ---- the fake itself ----------------------------------------------------------------


async def _raw(
    fake: FakeTwilioRest,
    method: str,
    path: str,
    *,
    content: bytes | None = None,
    content_type: str = "application/x-www-form-urlencoded",
    auth: bool = True,
) -> httpx.Response:
    headers = {"Content-Type": content_type}
    if auth:
        headers["Authorization"] = f"Basic {_basic_credentials()}"
    async with httpx.AsyncClient(base_url=fake.base_url) as client:
        return await client.request(method, path, content=content, headers=headers)


async def test_fake_missing_auth_is_twilio_401(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    response = await _raw(fake, "POST", _call_path(), content=b"Status=completed", auth=False)
    assert response.status_code == 401
    assert response.json() == {
        "code": 20003,
        "message": "Authenticate",
        "more_info": "https://www.twilio.com/docs/errors/20003",
        "status": 401,
    }
    assert fake.calls[CALL_SID] == "in-progress"


UNKNOWN_ROUTES = [
    ("GET", f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json"),  # listing: not implemented
    ("POST", f"/2010-04-01/Accounts/{'AC' + '9' * 32}/Calls.json"),  # create, another account
    ("GET", _call_path()),
    ("DELETE", _call_path()),
    ("POST", "/"),
    ("POST", f"/2010-04-01/Accounts/{'AC' + '9' * 32}/Calls/{CALL_SID}.json"),
]

BAD_FORMS = [
    (b"Status", "application/x-www-form-urlencoded"),
    (b"Status=\xff", "application/x-www-form-urlencoded"),
    (b'{"Status": "completed"}', "application/json"),
    (b"Status=hungup", "application/x-www-form-urlencoded"),
]


async def test_fake_unknown_routes_are_twilio_404(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    for method, path in UNKNOWN_ROUTES:
        response = await _raw(fake, method, path, content=b"Status=completed")
        assert response.status_code == 404, (method, path)
        assert response.json()["code"] == 20404
    assert fake.calls[CALL_SID] == "in-progress"


async def test_fake_bad_form_is_400(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    for content, content_type in BAD_FORMS:
        response = await _raw(
            fake, "POST", _call_path(), content=content, content_type=content_type
        )
        assert response.status_code == 400, content
    assert fake.calls[CALL_SID] == "in-progress"


async def test_fake_ignores_unknown_fields_and_cancel_of_live_call(fake: FakeTwilioRest) -> None:
    fake.register_call(CALL_SID)
    response = await _raw(
        fake, "POST", _call_path(), content=b"Status=canceled&Bogus=1&TimeLimit=30"
    )
    assert response.status_code == 200
    assert response.json()["status"] == "in-progress"
    assert fake.requests[-1].form == {"Status": "canceled", "Bogus": "1", "TimeLimit": "30"}


async def test_fake_callback_failure_is_500(fake: FakeTwilioRest) -> None:
    async def broken() -> None:
        raise RuntimeError("simulator gone")

    fake.register_call(CALL_SID, on_completed=broken)
    with pytest.raises(CallControlError) as info:
        async with _control(fake) as control:
            await control.hangup(CALL_SID)
    assert (info.value.reason, info.value.status_code) == ("http_error", 500)
    assert [type(e) for e in fake.callback_errors] == [RuntimeError]


def test_fake_base_url_needs_a_running_server() -> None:
    fake = FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN)
    with pytest.raises(RuntimeError):
        _ = fake.base_url
