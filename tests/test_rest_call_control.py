"""trunk/rest_call_control.py: how Telnyx's, Plivo's and Vonage's REST clients read a
request's outcome, and the destinations and URLs they accept."""

from __future__ import annotations

import httpx
import pytest

from rutster.protocols.call_control import RestCallControlError
from rutster.trunk.rest_call_control import callable_destination, checked_response, webhook_url_ok


class ExampleError(RestCallControlError):
    """A provider's own error class."""


async def outcome(handler: httpx.MockTransport, *, over: bool = False) -> str:
    """The reason ``checked_response`` gives for one hang-up, or ``ok``."""
    async with httpx.AsyncClient(transport=handler) as client:
        try:
            await checked_response(
                client.post("https://api.example/calls/1/hangup"),
                "hang-up",
                ExampleError,
                credentials_refused="the key was refused",
                call_over=lambda response: over and response.status_code == 404,
            )
        except ExampleError as exc:
            return exc.reason
    return "ok"


def answering(status: int) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, json={}))


def failing(exc: Exception) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("transport", "over", "reason"),
    [
        (answering(200), False, "ok"),
        (answering(204), False, "ok"),
        (answering(401), False, "auth_failed"),
        (answering(403), False, "auth_failed"),
        (answering(404), True, "already_ended"),  # the provider's own sign
        (answering(404), False, "http_error"),
        (answering(500), False, "http_error"),
        (failing(httpx.ReadTimeout("slow")), False, "timeout"),
        (failing(httpx.ConnectError("refused")), False, "network"),
    ],
)
async def test_each_outcome_has_its_reason(
    transport: httpx.MockTransport, over: bool, reason: str
) -> None:
    assert await outcome(transport, over=over) == reason


async def test_the_error_keeps_the_status_and_names_the_request() -> None:
    async with httpx.AsyncClient(transport=answering(502)) as client:
        with pytest.raises(ExampleError) as raised:
            await checked_response(
                client.post("https://api.example/x"),
                "transfer",
                ExampleError,
                credentials_refused="",
                call_over=lambda response: False,
            )
    assert raised.value.status_code == 502
    assert "transfer answered HTTP 502" in str(raised.value)


@pytest.mark.parametrize(
    ("destination", "ok"),
    [
        ("+15551230000", True),
        ("sip:agent@pbx.example.com", True),
        ("sips:agent@pbx.example.com:5061", True),
        ("15551230000", False),
        ("+0551230000", False),
        ("tel:+15551230000", False),
        ("sip:agent@pbx example.com", False),
    ],
)
def test_callable_destinations(destination: str, ok: bool) -> None:
    assert callable_destination(destination) is ok


def test_webhook_urls() -> None:
    assert webhook_url_ok("https://gw.example/answer")
    assert webhook_url_ok("http://127.0.0.1:8080/answer")
    assert not webhook_url_ok("ftp://gw.example/answer")
    assert not webhook_url_ok("https://gw.example/" + "a" * 2048)
