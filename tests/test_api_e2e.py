"""The REST API ``/v1`` end to end: real gateways under uvicorn, real Redis, the FAKE Twilio REST.

Every answer goes through :class:`Api`, which checks it against the schema the
OpenAPI document publishes for that endpoint (``gateway/api/schemas.py``), or
against the error schema, with the headers each error status promises. Calls
are placed through ``POST /v1/calls`` and dialled by :class:`FakeTwilioRest`:
a busy callee ends them at once (they settle at 0), a ringing one keeps them
holding their reservation for the length of a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

from rutster.brains.echo import EchoBrain
from rutster.gateway.api.schemas import RESPONSE_SCHEMAS, Schema
from rutster.gateway.api.validation import MAX_BODY_BYTES
from rutster.gateway.spend_settings import SpendSettings
from rutster.spend.embedded_redis import EmbeddedRedis
from rutster.spend.gate import GatePolicy
from rutster.spend.limits import TenantLimits
from rutster.spend.store import CallRecord, SpendStore
from rutster.tools.twilio_simulator import TwilioSimulator, new_sid
from tests.conftest import (
    TEST_ADMIN_KEY,
    TEST_AUTH_TOKEN,
    RunningGateway,
    gateway_config,
    serve_gateway,
    spend_settings,
)
from tests.support.fake_twilio_rest import CalleeOutcome, FakeTwilioRest

ACCOUNT_SID = "AC" + "e2" * 16
#: The tenant's own number (the caller id of placed calls).
CALLER = "+15551230000"
#: A callee that is busy at once: the call ends unanswered and settles at 0.
BUSY = "+15557650001"
#: A callee that rings longer than any test: the call holds its reservation meanwhile.
RINGING = "+15557650002"
#: The number inbound (simulated) calls are made to.
INBOUND_NUMBER = "+15550001111"
#: Ring time of :data:`RINGING` (the gateway asks Twilio to give up after 30 s).
LONG_RING_S = 60.0
#: Deadline for a placed call to reach a state (loopback; generous under load).
STATE_TIMEOUT_S = 5.0
#: A failing store must answer fast: 503 well before a client would time out.
UNAVAILABLE_WITHIN_S = 5.0
#: A create-call body the API accepts.
VALID_CALL: dict[str, Any] = {"to": BUSY, "from": CALLER, "provider": "twilio"}
ZERO = "0.000000"

#: Response schema per (method, path pattern), as the OpenAPI document declares them.
RESPONSE_SCHEMA_BY_ROUTE: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"/v1/calls"), "Call"),
    ("GET", re.compile(r"/v1/calls"), "CallList"),
    ("GET", re.compile(r"/v1/calls/[^/]+"), "Call"),
    ("DELETE", re.compile(r"/v1/calls/[^/]+"), "Call"),
    ("GET", re.compile(r"/v1/spend"), "Spend"),
    ("GET", re.compile(r"/v1/tenants/[^/]+/limits"), "TenantLimits"),
    ("PUT", re.compile(r"/v1/tenants/[^/]+/limits"), "TenantLimits"),
    ("POST", re.compile(r"/v1/admin/keys"), "ApiKey"),
    ("GET", re.compile(r"/v1/admin/kill-switch"), "KillSwitch"),
    ("PUT", re.compile(r"/v1/admin/kill-switch"), "KillSwitch"),
]


def _validator(schema: Schema) -> Draft202012Validator:
    # format_checker: date-time fields are checked too (rfc3339-validator is installed).
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


VALIDATORS = {name: _validator(schema) for name, schema in RESPONSE_SCHEMAS.items()}


def response_schema(method: str, path: str) -> str:
    """The name of the response schema of ``method path`` (fails for an unknown route)."""
    for route_method, pattern, name in RESPONSE_SCHEMA_BY_ROUTE:
        if route_method == method and pattern.fullmatch(path):
            return name
    raise AssertionError(f"no response schema known for {method} {path}")


class Api:
    """An HTTP client for one gateway's ``/v1`` that checks every answer's shape."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(
        self,
        method: str,
        path: str,
        key: str | None,
        *,
        expect: int,
        body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send; assert the status is ``expect`` and the body matches its schema."""
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        answer = await self.client.request(
            method, path, headers=sent, json=body, content=content, params=params
        )
        assert answer.status_code == expect, f"{method} {path}: {answer.status_code} {answer.text}"
        assert answer.headers["content-type"].startswith("application/json")
        document = answer.json()
        if answer.status_code >= 400:
            VALIDATORS["Error"].validate(document)
            if answer.status_code == 401:
                assert answer.headers["www-authenticate"].startswith("Bearer")
            if answer.status_code in (429, 503):
                assert int(answer.headers["retry-after"]) >= 1
        else:
            VALIDATORS[response_schema(method, path)].validate(document)
            if method == "GET" and re.fullmatch(r"/v1/calls/[^/]+", path):
                assert isinstance(document["receipts"], list)
        return answer

    async def get(self, path: str, key: str | None, expect: int = 200, **kw: Any) -> Any:
        return (await self.request("GET", path, key, expect=expect, **kw)).json()

    async def post(self, path: str, key: str | None, body: Any, expect: int = 201) -> Any:
        return (await self.request("POST", path, key, expect=expect, body=body)).json()

    async def put(self, path: str, key: str | None, body: Any, expect: int = 200) -> Any:
        return (await self.request("PUT", path, key, expect=expect, body=body)).json()

    async def delete(self, path: str, key: str | None, expect: int = 202) -> Any:
        return (await self.request("DELETE", path, key, expect=expect)).json()

    async def new_key(self, tenant: str, role: str = "tenant") -> str:
        """A fresh API key for ``tenant`` (issued with the admin key)."""
        issued = await self.post("/v1/admin/keys", TEST_ADMIN_KEY, {"tenant": tenant, "role": role})
        assert (issued["tenant"], issued["role"]) == (tenant, role)
        key: str = issued["key"]
        return key

    async def place(self, key: str, to: str = BUSY, expect: int = 201, **extra: Any) -> Any:
        """``POST /v1/calls`` to ``to``."""
        return await self.post("/v1/calls", key, VALID_CALL | {"to": to} | extra, expect=expect)


@dataclass
class Setup:
    """A running gateway, its store and an :class:`Api` on it."""

    gw: RunningGateway
    api: Api
    fake: FakeTwilioRest

    @property
    def store(self) -> SpendStore:
        store = self.gw.state.spend_store
        assert store is not None
        return store

    async def wait_status(self, call_id: str, status: str) -> CallRecord:
        """Poll the store (not the API: that would spend rate-limit tokens) for ``status``."""
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while True:
            record = await self.store.get_call(call_id)
            if record is not None and record["status"] == status:
                return record
            assert time.monotonic() < deadline, f"{call_id} never reached {status}: {record}"
            await asyncio.sleep(0.02)

    async def inbound_twiml(self) -> str:
        """The gateway's TwiML answer to a new (simulated, signed) inbound call."""
        simulator = TwilioSimulator(self.gw.url, auth_token=TEST_AUTH_TOKEN)
        answer = await simulator.post_voice_webhook(new_sid("CA"), from_=CALLER, to=INBOUND_NUMBER)
        assert answer.status_code == 200, answer.text
        return answer.text


@pytest.fixture
async def fake() -> AsyncIterator[FakeTwilioRest]:
    async with FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=TEST_AUTH_TOKEN) as server:
        server.set_callee(BUSY, CalleeOutcome.BUSY, ring_s=0.0)
        server.set_callee(RINGING, CalleeOutcome.NO_ANSWER, ring_s=LONG_RING_S)
        yield server


@contextlib.asynccontextmanager
async def running(
    brain: EchoBrain, fake: FakeTwilioRest, spend: SpendSettings | None = None
) -> AsyncIterator[Setup]:
    """A gateway that places calls through ``fake``; ``spend`` defaults to the suite Redis."""
    config = gateway_config(
        brain.url,
        barge_in=False,
        spend=spend or spend_settings(),
        twilio_account_sid=ACCOUNT_SID,
        twilio_api_base_url=fake.base_url,
    )
    async with serve_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as client:
        yield Setup(gw, Api(client), fake)


@pytest.fixture
async def setup(echo_brain: EchoBrain, fake: FakeTwilioRest) -> AsyncIterator[Setup]:
    async with running(echo_brain, fake) as ready:
        yield ready


# ---- OpenAPI -------------------------------------------------------------------------


async def test_openapi_document_needs_no_auth_and_is_valid(setup: Setup) -> None:
    answer = await setup.api.client.get("/v1/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    validate_openapi(document)
    assert document["openapi"].startswith("3.1")
    for path in ("/v1/calls", "/v1/calls/{id}", "/v1/spend", "/v1/tenants/{id}/limits"):
        assert path in document["paths"], path
    assert document["servers"][0]["url"].startswith(setup.gw.url)


# ---- authentication and tenancy ------------------------------------------------------


async def test_requests_without_a_valid_key_are_401(setup: Setup) -> None:
    api = setup.api
    bad_headers = [
        {},
        {"Authorization": ""},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer two words"},
        {"Authorization": "Bearer " + "x" * 600},
        {"Authorization": "Bearer rk_live_" + "A" * 32},  # well-formed, never issued
        {"Authorization": f"Bearer {TEST_ADMIN_KEY}x"},
    ]
    for headers in bad_headers:
        for method, path in (
            ("GET", "/v1/calls"),
            ("POST", "/v1/calls"),
            ("GET", "/v1/spend"),
            ("PUT", "/v1/admin/kill-switch"),
            ("GET", "/v1/calls/call_0123abcd"),
        ):
            error = (
                await api.request(method, path, None, expect=401, headers=headers, body={})
            ).json()["error"]
            assert error["code"] == "unauthorized", (headers, path)
    # Nothing was done on their behalf.
    assert not (await setup.store.get_global()).killed


async def test_tenant_keys_cannot_use_admin_endpoints(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    forbidden = [
        ("POST", "/v1/admin/keys", {"tenant": "acme", "role": "admin"}),
        ("GET", "/v1/admin/kill-switch", None),
        ("PUT", "/v1/admin/kill-switch", {"engaged": True}),
        ("PUT", "/v1/tenants/acme/limits", {"budget_day": "1000"}),
    ]
    for method, path, body in forbidden:
        error = (await api.request(method, path, key, expect=403, body=body)).json()["error"]
        assert error["code"] == "forbidden", path
    assert not (await setup.store.get_global()).killed
    assert (await api.get("/v1/tenants/acme/limits", key))["budget_day"] == ZERO
    # The operator's key has no tenant: it places no calls, and names the tenant it reads.
    for path in ("/v1/calls", "/v1/spend"):
        error = (await api.get(path, TEST_ADMIN_KEY, expect=403))["error"]
        assert (error["code"], error["field"]) == ("forbidden", "tenant"), path
    await api.post("/v1/calls", TEST_ADMIN_KEY, VALID_CALL, expect=403)
    listed = await api.get("/v1/calls", TEST_ADMIN_KEY, params={"tenant": "acme"})
    assert listed == {"data": [], "next_cursor": None}
    # An admin-role key issued through the API is an admin.
    admin = await api.new_key("ops", role="admin")
    assert await api.get("/v1/admin/kill-switch", admin) == {"engaged": False}


async def test_tenants_see_only_their_own_calls_and_limits(setup: Setup) -> None:
    api = setup.api
    key_a, key_b = await api.new_key("tenant-a"), await api.new_key("tenant-b")
    call_b = await api.place(key_b, RINGING)
    assert call_b["tenant"] == "tenant-b" and call_b["status"] == "ringing"
    # A cannot see, list or hang up B's call: 404, as for a call that does not exist.
    for method in ("GET", "DELETE"):
        error = (await api.request(method, f"/v1/calls/{call_b['id']}", key_a, expect=404)).json()
        assert error["error"]["code"] == "not_found"
    assert await api.get("/v1/calls", key_a) == {"data": [], "next_cursor": None}
    # Naming tenant B is forbidden to A's key, whether B exists or not (nothing to probe).
    for tenant in ("tenant-b", "no-such-tenant"):
        error = await api.get(f"/v1/tenants/{tenant}/limits", key_a, expect=403)
        assert (error["error"]["code"], error["error"]["field"]) == ("forbidden", "id")
        error = await api.get("/v1/calls", key_a, params={"tenant": tenant}, expect=403)
        assert error["error"]["field"] == "tenant"
    own = await api.get("/v1/calls", key_a, params={"tenant": "tenant-a"})
    assert own == {"data": [], "next_cursor": None}
    # B sees its call; its spend shows the reservation, A's shows nothing.
    seen = await api.get(f"/v1/calls/{call_b['id']}", key_b)
    assert seen["id"] == call_b["id"] and seen["status"] == "ringing"
    spend_b = await api.get("/v1/spend", key_b)
    assert spend_b["tenant"] == "tenant-b"
    assert spend_b["today"]["reserved"] == call_b["spend"]["reserved"] != ZERO
    spend_a = await api.get("/v1/spend", key_a)
    assert (spend_a["tenant"], spend_a["today"]["reserved"]) == ("tenant-a", ZERO)
    # The admin sees any tenant's limits and calls.
    assert (await api.get("/v1/tenants/tenant-b/limits", TEST_ADMIN_KEY))["tenant"] == "tenant-b"
    listed = await api.get("/v1/calls", TEST_ADMIN_KEY, params={"tenant": "tenant-b"})
    assert [c["id"] for c in listed["data"]] == [call_b["id"]]


async def test_admin_sees_spend_of_any_tenant(setup: Setup) -> None:
    api = setup.api
    key_a, key_b = await api.new_key("tenant-a"), await api.new_key("tenant-b")
    call = await api.place(key_b, RINGING)
    spend = await api.get("/v1/spend", TEST_ADMIN_KEY, params={"tenant": "tenant-b", "days": "3"})
    assert spend["tenant"] == "tenant-b" and len(spend["by_day"]) == 3
    assert spend["today"]["reserved"] == call["spend"]["reserved"] != ZERO
    # A tenant key may name only its own tenant: another one is forbidden (existing or not).
    own = await api.get("/v1/spend", key_b, params={"tenant": "tenant-b"})
    assert own["today"] == spend["today"]
    for other in ("tenant-b", "nobody"):
        error = await api.get("/v1/spend", key_a, params={"tenant": other}, expect=403)
        assert (error["error"]["code"], error["error"]["field"]) == ("forbidden", "tenant")
    # The admin acts for no tenant of its own: it has to name one, a well-formed one.
    await api.get("/v1/spend", TEST_ADMIN_KEY, expect=403)
    error = await api.get("/v1/spend", TEST_ADMIN_KEY, params={"tenant": "B!"}, expect=422)
    assert error["error"]["field"] == "tenant"


async def test_call_ids_of_the_wrong_shape_are_422_unknown_ones_404(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    for bad in ("not-a-call", "call_XYZ", "call_" + "0" * 65, "call_12%20ab"):
        error = (await api.request("GET", f"/v1/calls/{bad}", key, expect=422)).json()["error"]
        assert (error["code"], error["field"]) == ("invalid_request", "id"), bad
    await api.get("/v1/calls/call_0123abcd", key, expect=404)
    await api.delete("/v1/calls/call_0123abcd", key, expect=404)


# ---- POST /v1/calls validation ----------------------------------------------------------


def _body(**changes: Any) -> bytes:
    return json.dumps(VALID_CALL | changes).encode()


#: (case, raw body, content type, expected status, expected ``error.field``).
BAD_CREATE_REQUESTS: list[tuple[str, bytes, str | None, int, str | None]] = [
    ("unknown field", _body(colour="red"), "application/json", 422, "colour"),
    ("to is a number", _body(to=15557650001), "application/json", 422, "to"),
    (
        "duration is a string",
        _body(limits={"max_duration_s": "60"}),
        "application/json",
        422,
        "limits.max_duration_s",
    ),
    (
        "duration has a fraction",
        _body(limits={"max_duration_s": 60.5}),
        "application/json",
        422,
        "limits.max_duration_s",
    ),
    (
        "absurd duration",
        _body(limits={"max_duration_s": 10**9}),
        "application/json",
        422,
        "limits.max_duration_s",
    ),
    (
        "zero duration",
        _body(limits={"max_duration_s": 0}),
        "application/json",
        422,
        "limits.max_duration_s",
    ),
    ("max_cost 0", _body(limits={"max_cost": "0"}), "application/json", 422, "limits.max_cost"),
    (
        "max_cost 0.00",
        _body(limits={"max_cost": "0.00"}),
        "application/json",
        422,
        "limits.max_cost",
    ),
    ("max_cost -1", _body(limits={"max_cost": "-1"}), "application/json", 422, "limits.max_cost"),
    (
        "max_cost exponent",
        _body(limits={"max_cost": "1e3"}),
        "application/json",
        422,
        "limits.max_cost",
    ),
    (
        "max_cost a number",
        _body(limits={"max_cost": 0.5}),
        "application/json",
        422,
        "limits.max_cost",
    ),
    (
        "max_cost over the cap",
        _body(limits={"max_cost": "10000.01"}),
        "application/json",
        422,
        "limits.max_cost",
    ),
    ("to without +", _body(to="15557650001"), "application/json", 422, "to"),
    ("to too short", _body(to="+1555"), "application/json", 422, "to"),
    ("to too long", _body(to="+1" + "5" * 15), "application/json", 422, "to"),
    ("to with newline", _body(to=BUSY + "\n"), "application/json", 422, "to"),
    ("from not E.164", _body(**{"from": "alice"}), "application/json", 422, "from"),
    ("sip URI via twilio", _body(to="sip:alice@pbx.example.com"), "application/json", 422, "to"),
    (
        "provider sip without a SIP worker connected",
        _body(to="sip:alice@pbx.example.com", provider="sip"),
        "application/json",
        409,
        None,
    ),
    ("unknown provider", _body(provider="skype"), "application/json", 422, "provider"),
    (
        "brain URL off the allowlist",
        _body(brain="ws://203.0.113.9:8081/evil"),
        "application/json",
        422,
        "brain",
    ),
    ("unknown brain name", _body(brain="nosuchbrain"), "application/json", 422, "brain"),
    (
        "too much metadata",
        _body(metadata={f"k{n}": "v" for n in range(17)}),
        "application/json",
        422,
        "metadata",
    ),
    (
        "missing from",
        json.dumps({"to": BUSY, "provider": "twilio"}).encode(),
        "application/json",
        422,
        "from",
    ),
    ("malformed JSON", b'{"to": "+15557650001", ', "application/json", 422, None),
    (
        "duplicate keys",
        b'{"to": "+15557650001", "to": "+15557650002", "from": "+15551230000", '
        b'"provider": "twilio"}',
        "application/json",
        422,
        None,
    ),
    ("not an object", b'["+15557650001"]', "application/json", 422, None),
    ("NaN", _body(limits={"max_duration_s": float("nan")}), "application/json", 422, None),
    ("empty body", b"", "application/json", 422, None),
    ("text/plain", _body(), "text/plain", 415, None),
    ("no content type", _body(), None, 415, None),
    ("latin-1 charset", _body(), "application/json; charset=latin-1", 415, None),
    (
        "oversized body",
        _body(metadata={"pad": "x" * 200}).replace(b"}", b"}" + b" " * MAX_BODY_BYTES, 1),
        "application/json",
        413,
        None,
    ),
]


async def test_bad_create_requests_create_nothing_and_reserve_nothing(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    for case, raw, content_type, status, field in BAD_CREATE_REQUESTS:
        headers = {"Content-Type": content_type} if content_type else {}
        answer = await api.request(
            "POST", "/v1/calls", key, expect=status, content=raw, headers=headers
        )
        error = answer.json()["error"]
        assert error["field"] == field, (case, error)
        expected_code = {
            422: "invalid_request",
            415: "unsupported_media_type",
            413: "payload_too_large",
            409: "conflict",
        }
        assert error["code"] == expected_code[status], case
    # No call, no money, nothing dialled, nothing in the ledger.
    assert await api.get("/v1/calls", key) == {"data": [], "next_cursor": None}
    spend = await api.get("/v1/spend", key)
    for period in ("today", "month"):
        assert (spend[period]["spent"], spend[period]["reserved"]) == (ZERO, ZERO)
    assert await setup.store.ledger(100) == []
    assert setup.fake.created_calls == {}
    # The base body itself is fine: the failures above were each case's own fault. An
    # integral number is an integer (JSON Schema 2020-12), whatever its spelling.
    call = await api.place(key, limits={"max_duration_s": 120.0, "max_cost": "0.50"})
    assert call["limits"] == {"max_duration_s": 120, "max_cost": "0.500000"}


# ---- rate limit ---------------------------------------------------------------------


async def test_rate_limit_per_key(echo_brain: EchoBrain, fake: FakeTwilioRest) -> None:
    async with running(echo_brain, fake, spend_settings(api_rate_per_s=1, api_burst=3)) as ready:
        api = ready.api
        key_a = await api.new_key("acme")
        key_b = await api.new_key("acme")
        for _ in range(3):
            await api.get("/v1/calls", key_a)
        limited = await api.request("GET", "/v1/calls", key_a, expect=429)
        assert limited.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(limited.headers["retry-after"]) <= 2
        # Another key of the same tenant has its own allowance.
        await api.get("/v1/calls", key_b)
        assert ready.gw.metric("rutster_api_rate_limited_total") == 1


# ---- listing and pagination -----------------------------------------------------------


async def test_list_calls_pages_and_filters(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    busy = [(await api.place(key, BUSY))["id"] for _ in range(5)]
    ringing = (await api.place(key, RINGING))["id"]
    for call_id in busy:
        record = await setup.wait_status(call_id, "ended")
        assert record["end_reason"] == "busy"
    # limit=2 pages through all six, newest first, each exactly once.
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(5):
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = await api.get("/v1/calls", key, params=params)
        assert len(page["data"]) <= 2
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert cursor is None, "pagination did not end"
    assert [c["id"] for c in seen].count(ringing) == 1
    assert sorted(c["id"] for c in seen) == sorted([*busy, ringing])
    created = [c["created_at"] for c in seen]
    assert created == sorted(created, reverse=True)
    # Status filters.
    failed = await api.get("/v1/calls", key, params={"status": "failed", "limit": "200"})
    assert sorted(c["id"] for c in failed["data"]) == sorted(busy)
    for call in failed["data"]:
        assert call["end_reason"] == "busy" and call["spend"]["settled"] == ZERO
    ringing_page = await api.get("/v1/calls", key, params={"status": "ringing"})
    assert [c["id"] for c in ringing_page["data"]] == [ringing]
    assert (await api.get("/v1/calls", key, params={"status": "in_progress"}))["data"] == []
    # A well-formed cursor is a position: before the epoch there is nothing.
    empty = await api.get("/v1/calls", key, params={"cursor": "1:call_ff"})
    assert empty == {"data": [], "next_cursor": None}
    # Bad parameters.
    for params, field in (
        ({"cursor": "garbage"}, "cursor"),
        ({"cursor": "1:call_1 2"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "two"}, "limit"),
        ({"status": "bogus"}, "status"),
        ({"colour": "red"}, "colour"),
    ):
        error = (await api.request("GET", "/v1/calls", key, expect=422, params=params)).json()
        assert error["error"]["field"] == field, params
    # An unanswered call: its status, end reason, settlement and receipts.
    one = await api.get(f"/v1/calls/{busy[0]}", key)
    assert (one["status"], one["end_reason"], one["spend"]["settled"]) == ("failed", "busy", ZERO)
    assert one["ended_at"] is not None and one["answered_at"] is None
    # Settled at 0 and released: only the ringing call still holds money.
    spend = await api.get("/v1/spend", key)
    ringing_call = await api.get(f"/v1/calls/{ringing}", key)
    assert spend["today"]["spent"] == ZERO
    assert spend["today"]["reserved"] == ringing_call["spend"]["reserved"] != ZERO


# ---- tenant limits and admission -------------------------------------------------------


async def test_limits_put_then_admission_respects_them(setup: Setup) -> None:
    api = setup.api
    store = setup.store
    key = await api.new_key("acme")
    limits = await api.put("/v1/tenants/acme/limits", TEST_ADMIN_KEY, {"max_concurrent": 1.0})
    assert limits["max_concurrent"] == 1 and limits["tenant"] == "acme"
    assert await api.get("/v1/tenants/acme/limits", key) == limits
    first = await api.place(key, RINGING)
    assert first["status"] == "ringing"
    refusal = (await api.request("POST", "/v1/calls", key, expect=402, body=VALID_CALL)).json()
    assert refusal["error"]["code"] == "refused"
    assert refusal["error"]["reason"] == "tenant_concurrency"
    refusals = await store.recent_refusals(10)
    assert [(r["tenant"], r["reason"]) for r in refusals] == [("acme", "tenant_concurrency")]
    # The refused call is on record, with its reason, no money and a receipts list.
    listed = await api.get("/v1/calls", key, params={"status": "refused"})
    assert len(listed["data"]) == 1
    refused = await api.get(f"/v1/calls/{listed['data'][0]['id']}", key)
    assert (refused["status"], refused["end_reason"]) == ("refused", "tenant_concurrency")
    assert refused["spend"]["reserved"] == ZERO
    # Its receipt says why, and nothing else: ids, reason, time, the quantum asked for.
    (receipt,) = refused["receipts"]
    assert set(receipt) == {"id", "stage", "type", "reason", "at_unix_ms", "quantum"}
    assert (receipt["stage"], receipt["type"], receipt["reason"]) == (
        "spend",
        "refused",
        "tenant_concurrency",
    )
    # Hanging up the ringing call frees the slot.
    hung_up = await api.delete(f"/v1/calls/{first['id']}", key)
    assert hung_up["id"] == first["id"]
    ended = await setup.wait_status(first["id"], "ended")
    assert ended["end_reason"] == "canceled"
    await api.delete(f"/v1/calls/{first['id']}", key, expect=409)
    second = await api.place(key, BUSY)
    await setup.wait_status(second["id"], "ended")
    # A day budget smaller than one quantum refuses the next call.
    await api.put(
        "/v1/tenants/acme/limits", TEST_ADMIN_KEY, {"max_concurrent": 0, "budget_day": "0.000001"}
    )
    refusal = (await api.request("POST", "/v1/calls", key, expect=402, body=VALID_CALL)).json()
    assert refusal["error"]["reason"] == "budget_day"
    assert (await store.recent_refusals(1))[0]["reason"] == "budget_day"
    ledger = await store.ledger(100)
    assert sorted(e["reason"] for e in ledger if e["type"] == "refuse") == [
        "budget_day",
        "tenant_concurrency",
    ]
    spend = await api.get("/v1/spend", key)
    assert spend["today"]["budget"] == "0.000001"
    assert spend["today"]["left"] == "0.000001"  # the refused quantum took nothing
    assert spend["today"]["reserved"] == ZERO


async def test_bad_limits_are_422_and_change_nothing(setup: Setup) -> None:
    api = setup.api
    before = await api.put("/v1/tenants/acme/limits", TEST_ADMIN_KEY, {"budget_day": "5"})
    for body, field in (
        ({"budget_day": "-1"}, "budget_day"),
        ({"budget_day": 5}, "budget_day"),
        ({"budget_day": "1e3"}, "budget_day"),
        ({"max_concurrent": 10**9}, "max_concurrent"),
        ({"max_concurrent": -1}, "max_concurrent"),
        ({"max_call_cost": "10000.5"}, "max_call_cost"),
        ({"colour": 1}, "colour"),
        ({}, None),
    ):
        error = (
            await api.request(
                "PUT", "/v1/tenants/acme/limits", TEST_ADMIN_KEY, expect=422, body=body
            )
        ).json()["error"]
        assert error["field"] == field, body
    error = (
        await api.request("PUT", "/v1/tenants/Acme/limits", TEST_ADMIN_KEY, expect=422, body={})
    ).json()["error"]
    assert error["field"] == "id"
    assert await api.get("/v1/tenants/acme/limits", TEST_ADMIN_KEY) == before


# ---- kill switch ----------------------------------------------------------------------


async def test_kill_switch_refuses_api_and_inbound_calls(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    assert await api.get("/v1/admin/kill-switch", TEST_ADMIN_KEY) == {"engaged": False}
    assert await api.put("/v1/admin/kill-switch", TEST_ADMIN_KEY, {"engaged": True}) == {
        "engaged": True
    }
    assert await api.get("/v1/admin/kill-switch", TEST_ADMIN_KEY) == {"engaged": True}
    refusal = (await api.request("POST", "/v1/calls", key, expect=402, body=VALID_CALL)).json()
    assert refusal["error"]["reason"] == "kill_switch"
    twiml = await setup.inbound_twiml()
    assert "<Reject" in twiml and "<Stream" not in twiml
    refusals = await setup.store.recent_refusals(10)
    assert sorted((r["tenant"], r["reason"]) for r in refusals) == [
        ("acme", "kill_switch"),
        ("default", "kill_switch"),
    ]
    assert setup.fake.created_calls == {}
    # Released: both kinds of call are admitted again.
    await api.put("/v1/admin/kill-switch", TEST_ADMIN_KEY, {"engaged": False})
    await api.place(key)
    twiml = await setup.inbound_twiml()
    assert "<Connect>" in twiml and "<Stream" in twiml and "<Reject" not in twiml
    # A bad body is refused and changes nothing.
    for body in ({"engaged": "yes"}, {}, {"engaged": True, "why": "x"}):
        await api.put("/v1/admin/kill-switch", TEST_ADMIN_KEY, body, expect=422)
    assert not (await setup.store.get_global()).killed


# ---- Redis down -----------------------------------------------------------------------


async def test_redis_down_answers_503_and_refuses_inbound_calls(
    echo_brain: EchoBrain, fake: FakeTwilioRest, tmp_path: Path
) -> None:
    with EmbeddedRedis(tmp_path / "redis") as redis_server:
        spend = spend_settings(redis_url=redis_server.url, data_dir=tmp_path / "data")
        async with running(echo_brain, fake, spend) as ready:
            api = ready.api
            key = await api.new_key("acme")
            await api.get("/v1/calls", key)
            redis_server.kill()
            for method, path, who, body in (
                ("GET", "/v1/calls", key, None),
                ("POST", "/v1/calls", key, VALID_CALL),
                ("GET", "/v1/spend", key, None),
                ("GET", "/v1/admin/kill-switch", TEST_ADMIN_KEY, None),
                ("PUT", "/v1/tenants/acme/limits", TEST_ADMIN_KEY, {"max_concurrent": 2}),
            ):
                started = time.monotonic()
                answer = await api.request(method, path, who, expect=503, body=body)
                assert time.monotonic() - started < UNAVAILABLE_WITHIN_S, path
                assert answer.json()["error"]["code"] == "unavailable"
            # Fail closed: an inbound call is turned away, not admitted unmetered.
            started = time.monotonic()
            twiml = await ready.inbound_twiml()
            assert time.monotonic() - started < UNAVAILABLE_WITHIN_S
            assert "<Reject" in twiml and "<Stream" not in twiml
            assert fake.created_calls == {}
            # Redis back (same port, same data): everything works again.
            await asyncio.to_thread(redis_server.start)
            deadline = time.monotonic() + STATE_TIMEOUT_S
            while True:
                answer = await api.client.get("/v1/calls", headers=_auth(key))
                if answer.status_code == 200:
                    VALIDATORS["CallList"].validate(answer.json())
                    break
                assert answer.status_code == 503, answer.text
                VALIDATORS["Error"].validate(answer.json())
                assert time.monotonic() < deadline, "the API did not recover"
                await asyncio.sleep(0.05)
            call = await api.place(key, RINGING)
            assert call["status"] == "ringing"
            twiml = await ready.inbound_twiml()
            assert "<Stream" in twiml and "<Reject" not in twiml


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_unrouted_v1_requests_answer_the_error_shape(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    await api.request("GET", "/v1/nothing-here", key, expect=404)
    await api.request("GET", "/v1/calls/call_12%2F..%2F", key, expect=404)
    await api.request("PATCH", "/v1/calls", key, expect=405, body={})


#: Methods tried on every path: the ones no path serves among them must get 405.
PROBED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "TRACE")


def _allow(answer: httpx.Response) -> set[str]:
    return {m.strip() for m in answer.headers["allow"].split(",")}


async def test_every_path_answers_options_and_405_with_all_its_methods(setup: Setup) -> None:
    api = setup.api
    key = await api.new_key("acme")
    document = (await api.client.get("/v1/openapi.json")).json()
    for path, item in document["paths"].items():
        served = {m.upper() for m in item if m in ("get", "post", "put", "patch", "delete")}
        concrete = path.replace("{id}", "call_0a1b" if path.startswith("/v1/calls/") else "acme")
        expected = served | {"OPTIONS"} | ({"HEAD"} if "GET" in served else set())
        # OPTIONS needs no key: 204, no body, every method of the path (not one route's).
        options = await api.client.options(concrete)
        assert (options.status_code, options.content) == (204, b""), path
        assert _allow(options) == expected, path
        for method in sorted(set(PROBED_METHODS) - served):
            answer = await api.request(method, concrete, key, expect=405, body={})
            assert answer.json()["error"]["code"] == "method_not_allowed", (method, path)
            assert _allow(answer) == expected, (method, path)
    # HEAD is GET without the body.
    head = await api.client.head("/v1/spend", headers=_auth(key))
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"].startswith("application/json")


async def test_reads_show_the_enforced_default_limits_without_writing(
    echo_brain: EchoBrain, fake: FakeTwilioRest
) -> None:
    # A tenant with no stored limits gets the gateway's defaults (RUTSTER_DEFAULT_*): one
    # micro-dollar a day here, so admission refuses, and 3 calls at once.
    policy = GatePolicy(default_limits=TenantLimits(budget_day=1, max_concurrent=3))
    async with running(echo_brain, fake, spend_settings(policy=policy)) as ready:
        api, store = ready.api, ready.store
        key = await api.new_key("fresh")
        for _ in range(2):  # a read changes nothing, so the second shows the same
            spend = await api.get("/v1/spend", key)
            assert spend["today"] == {
                "spent": ZERO,
                "reserved": ZERO,
                "budget": "0.000001",
                "left": "0.000001",
            }
            assert (spend["month"]["budget"], spend["month"]["left"]) == (None, None)
            limits = await api.get("/v1/tenants/fresh/limits", key)
            assert (limits["budget_day"], limits["max_concurrent"]) == ("0.000001", 3)
            admin_view = await api.get("/v1/spend", TEST_ADMIN_KEY, params={"tenant": "fresh"})
            assert admin_view["today"] == spend["today"]
        # None of those GETs stored anything.
        assert await store.redis.exists(store.keys.tenant("fresh", "limits")) == 0
        assert "fresh" not in await store.tenants()
        # What the reads showed is what admission enforces.
        refusal = await api.request("POST", "/v1/calls", key, expect=402, body=VALID_CALL)
        assert refusal.json()["error"]["reason"] == "budget_day"
        # An explicit 0 (unlimited) is not "unset": it beats the default, field by field.
        changed = await api.put("/v1/tenants/fresh/limits", TEST_ADMIN_KEY, {"budget_day": "0"})
        assert (changed["budget_day"], changed["max_concurrent"]) == (ZERO, 3)
        assert (await api.get("/v1/spend", key))["today"]["budget"] is None
        assert (await api.place(key, RINGING))["status"] == "ringing"
