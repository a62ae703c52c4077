"""The OpenAPI 3.1 document: valid, complete, and built from the schemas the API enforces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from rutster.base.strict_schema import ecma_regex
from rutster.gateway.api import errors
from rutster.gateway.api.errors import ApiError
from rutster.gateway.api.openapi import build_openapi
from rutster.gateway.api.schemas import (
    CALL_LIST_SCHEMA,
    CALL_SCHEMA,
    CALLS_QUERY_SCHEMA,
    CREATE_CALL_SCHEMA,
    CREATE_KEY_SCHEMA,
    ERROR_SCHEMA,
    KILL_SWITCH_SCHEMA,
    REQUEST_SCHEMAS,
    RESPONSE_SCHEMAS,
    SPEND_QUERY_SCHEMA,
    SPEND_SCHEMA,
    TENANT_LIMITS_SCHEMA,
    Schema,
)
from rutster.gateway.api.validation import parse_json_body

#: The endpoints of docs/SPEND.md ("The REST API"), with the request schema each one validates with.
ENDPOINTS: dict[tuple[str, str], Schema | None] = {
    ("/v1/calls", "post"): CREATE_CALL_SCHEMA,
    ("/v1/calls", "get"): None,
    ("/v1/calls/{id}", "get"): None,
    ("/v1/calls/{id}", "delete"): None,
    ("/v1/spend", "get"): None,
    ("/v1/tenants/{id}/limits", "put"): TENANT_LIMITS_SCHEMA,
    ("/v1/tenants/{id}/limits", "get"): None,
    ("/v1/admin/keys", "post"): CREATE_KEY_SCHEMA,
    ("/v1/admin/kill-switch", "put"): KILL_SWITCH_SCHEMA,
    ("/v1/admin/kill-switch", "get"): None,
    ("/v1/dashboard/events", "get"): None,
    ("/v1/openapi.json", "get"): None,
}
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_openapi("https://gateway.example.com/")


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> Any:
    ref = node.get("$ref")
    if ref is None:
        return node
    target: Any = document
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    shortcuts = pytest.importorskip(
        "openapi_spec_validator", reason="dev dependency openapi-spec-validator not installed"
    )
    shortcuts.validate(document)
    assert document["openapi"].startswith("3.1.")
    json.dumps(document)  # serializable as is


def test_the_validator_catches_a_broken_document(document: dict[str, Any]) -> None:
    # Guards the test above: an invalid document must not pass.
    shortcuts = pytest.importorskip("openapi_spec_validator")
    broken = build_openapi(None)
    broken["components"]["schemas"]["Call"]["properties"]["id"]["type"] = "strnig"
    with pytest.raises(Exception, match="strnig"):
        shortcuts.validate(broken)


def test_every_endpoint_of_the_design_is_documented(document: dict[str, Any]) -> None:
    documented = {
        (path, method)
        for path, item in document["paths"].items()
        for method in item
        if method in METHODS
    }
    assert documented == set(ENDPOINTS)
    ids = [
        item[method]["operationId"]
        for item in document["paths"].values()
        for method in item
        if method in METHODS
    ]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("endpoint", "schema"), ENDPOINTS.items(), ids=str)
def test_request_bodies_are_the_validated_schemas(
    document: dict[str, Any], endpoint: tuple[str, str], schema: Schema | None
) -> None:
    operation = document["paths"][endpoint[0]][endpoint[1]]
    if schema is None:
        assert "requestBody" not in operation
        return
    content = operation["requestBody"]["content"]
    assert list(content) == ["application/json"]
    published = _resolve(document, content["application/json"]["schema"])
    assert published == schema
    assert published is not schema  # a copy: editing the document cannot loosen validation
    # Enforced errors are documented.
    for status in ("413", "415", "422"):
        assert status in operation["responses"]


def test_components_carry_every_schema_unchanged(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    assert set(components) == set(REQUEST_SCHEMAS) | set(RESPONSE_SCHEMAS)
    for name, schema in (REQUEST_SCHEMAS | RESPONSE_SCHEMAS).items():
        assert components[name] == schema, name
    assert document["jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema"


def _enforced_ok(body: dict[str, Any], schema: Schema) -> bool:
    try:
        parse_json_body(json.dumps(body).encode(), schema)
    except ApiError:
        return False
    return True


CALL = {"to": "+15551234567", "from": "+15557654321", "provider": "twilio"}


def test_a_published_schema_judges_bodies_like_the_api(document: dict[str, Any]) -> None:
    published = document["components"]["schemas"]["CreateCallRequest"]
    # The published schema, read by jsonschema-rs (an ECMA-262 regex engine, the one
    # schemathesis uses), gives the verdicts the API enforces, integral floats included.
    ecma = jsonschema_rs.Draft202012Validator(published)
    bodies: list[dict[str, Any]] = [
        CALL,
        {**CALL, "to": "sip:a@pbx.example.com"},
        {**CALL, "to": "sip:a@pbx.example.com", "provider": "sip"},
        {**CALL, "x": 1},
        {**CALL, "provider": "sip", "limits": {}},
        {**CALL, "to": "+1", "provider": "sip"},
        {**CALL, "limits": {"max_duration_s": 60.0}},
        {**CALL, "limits": {"max_duration_s": 60.5}},
        {**CALL, "limits": {"max_duration_s": 6e3}},
        {**CALL, "brain": "wss://brains.example/tap"},
        {**CALL, "brain": "wss://brains.example/\x1ctap"},
        {**CALL, "brain": "wss://brains.example/\x85tap"},
        {**CALL, "brain": "wss://brains.example/\ufefftap"},
        {**CALL, "brain": "wss://brains.example/tap\n"},
        {**CALL, "to": "+15551234567\n"},
        {**CALL, "metadata": {"a\x9b": "x"}},
        {**CALL, "metadata": {"\U0001f600" * 40: "x"}},
    ]
    for body in bodies:
        assert ecma.is_valid(body) == _enforced_ok(body, CREATE_CALL_SCHEMA), body
    limits = jsonschema_rs.Draft202012Validator(
        document["components"]["schemas"]["TenantLimitsRequest"]
    )
    for changes in ({"campaign_calls_per_minute": 6000.0}, {"max_concurrent": 1.5}):
        assert limits.is_valid(changes) == _enforced_ok(changes, TENANT_LIMITS_SCHEMA), changes


def _all_patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _all_patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _all_patterns(item)


#: Characters on which regex dialects disagree: Python's ``\s`` has \x1c-\x1f and \x85
#: but not \ufeff, ECMA-262's the other way round; ``$`` before a final newline; astral
#: characters (one code point, two UTF-16 units); C0, DEL and C1 controls.
TRICKY = ["\x00", "\x1c", "\x1f", "\x7f", "\x85", "\x9b", "\ufeff", "\u2028", "\n", "\t",
          " ", "\U0001f600", "é", "%", "?", "#", ":", "/", "@"]  # fmt: skip
PUBLISHED_PATTERNS = sorted(set(_all_patterns(build_openapi(None))))


@pytest.mark.parametrize("pattern", PUBLISHED_PATTERNS)
@given(data=st.data())
@settings(max_examples=40, deadline=None, database=None, derandomize=True)
def test_every_published_pattern_means_what_the_api_enforces(
    pattern: str, data: st.DataObject
) -> None:
    # The server matches with Python's re (validation.ecma_regex); clients and schemathesis
    # with ECMA-262. A pattern whose verdict differs between them is a broken contract.
    ecma = jsonschema_rs.Draft202012Validator({"type": "string", "pattern": pattern})
    matching = data.draw(st.from_regex(ecma_regex(pattern), fullmatch=True))
    position = data.draw(st.integers(0, len(matching)))
    tricky = data.draw(st.sampled_from(TRICKY))
    for text in (matching, matching[:position] + tricky + matching[position:]):
        assert ecma.is_valid(text) == (ecma_regex(pattern).search(text) is not None), repr(text)


def test_query_parameters_are_the_validated_schemas(document: dict[str, Any]) -> None:
    for path, schema in (("/v1/calls", CALLS_QUERY_SCHEMA), ("/v1/spend", SPEND_QUERY_SCHEMA)):
        parameters = document["paths"][path]["get"]["parameters"]
        assert {p["name"]: p["schema"] for p in parameters} == schema["properties"]
        assert all(p["in"] == "query" and not p["required"] for p in parameters)


def test_security_rate_limit_and_errors(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    assert document["security"] == [{"bearerAuth": []}]
    assert document["servers"] == [{"url": "https://gateway.example.com"}]
    for (path, method), _ in ENDPOINTS.items():
        operation = document["paths"][path][method]
        responses = operation["responses"]
        if path == "/v1/openapi.json":
            assert operation["security"] == []
            assert "401" not in responses
            continue
        assert "security" not in operation  # the document-wide bearerAuth applies
        for status in ("401", "429", "503"):
            assert status in responses, (path, method, status)
        limited = _resolve(document, responses["429"])
        assert "Retry-After" in limited["headers"]
        assert _resolve(document, limited["content"]["application/json"]["schema"]) == ERROR_SCHEMA
    refused = document["paths"]["/v1/calls"]["post"]["responses"]["402"]
    assert "budget_day" in _resolve(document, refused)["description"]


def test_statuses_each_operation_can_answer_are_documented(document: dict[str, Any]) -> None:
    def statuses(path: str, method: str) -> set[str]:
        return set(document["paths"][path][method]["responses"])

    # A tenant key naming another tenant, or the operator's key naming none: 403.
    for path in ("/v1/calls", "/v1/spend", "/v1/tenants/{id}/limits"):
        assert {"200", "403", "422"} <= statuses(path, "get"), path
    assert "404" not in statuses("/v1/tenants/{id}/limits", "get")
    # A malformed call id is a 422, an unknown (or another tenant's) one a 404.
    for method in ("get", "delete"):
        assert {"404", "422"} <= statuses("/v1/calls/{id}", method)
    tenant = document["paths"]["/v1/spend"]["get"]["parameters"]
    assert [p["name"] for p in tenant if p["name"] == "tenant"] == ["tenant"]
    calls = {p["name"] for p in document["paths"]["/v1/calls"]["get"]["parameters"]}
    assert calls == {"status", "limit", "cursor", "tenant"}


def test_the_event_stream_documents_one_event() -> None:
    # Tools validate each server-sent event against the schema (OpenAPI 3.1 has no itemSchema).
    content = build_openapi(None)["paths"]["/v1/dashboard/events"]["get"]["responses"]["200"]
    event = content["content"]["text/event-stream"]["schema"]
    validator = jsonschema_rs.Draft202012Validator(event)
    assert validator.is_valid({"event": "snapshot", "data": "{}"})
    assert not validator.is_valid("event: snapshot\ndata: {}\n\n")
    assert not validator.is_valid({"event": "other", "data": "{}"})


def test_no_servers_without_a_url() -> None:
    assert "servers" not in build_openapi(None)


def test_error_bodies_match_the_error_schema() -> None:
    validator = Draft202012Validator(ERROR_SCHEMA)
    produced = [
        errors.invalid_request("must be an integer", "limits.max_duration_s"),
        errors.unauthorized("unknown or revoked API key"),
        errors.forbidden("admin only"),
        errors.not_found("no such call"),
        errors.conflict("the call has ended"),
        errors.refused("budget_day", "the daily budget is spent"),
        errors.rate_limited(0.2),
        errors.payload_too_large(16384),
        errors.unsupported_media_type("text/plain"),
        errors.unavailable(),
        errors.provider_error("Twilio did not place the call (timeout)"),
        errors.ApiError(405, errors.CODE_METHOD_NOT_ALLOWED, "PATCH is not allowed on /v1/calls"),
    ]
    assert {e.code for e in produced} == set(errors.ERROR_CODES)
    for error in produced:
        validator.validate(error.body())


def test_response_schemas_accept_a_realistic_answer() -> None:
    call = {
        "id": "call_0123abcd",
        "tenant": "acme",
        "status": "in_progress",
        "direction": "outbound",
        "provider": "twilio",
        "from": "+15557654321",
        "to": "+15551234567",
        "brain": "echo",
        "campaign": None,
        "created_at": "2026-11-30T12:00:00Z",
        "answered_at": "2026-11-30T12:00:04Z",
        "ended_at": None,
        "end_reason": None,
        "limits": {"max_duration_s": 600, "max_cost": "0.500000"},
        "spend": {"reserved": "0.072000", "cost": "0.004200", "settled": None, "currency": "USD"},
        "metadata": {"crm_id": "A-1"},
        "receipts": [{"type": "usage", "at": 1764504000000, "ok": True}],
    }
    Draft202012Validator(CALL_SCHEMA).validate(call)
    Draft202012Validator(CALL_LIST_SCHEMA).validate({"data": [call], "next_cursor": None})
    spend = {
        "tenant": "acme",
        "currency": "USD",
        "today": {"spent": "1.000000", "reserved": "0.1", "budget": "25", "left": "23.9"},
        "month": {"spent": "9", "reserved": "0.1", "budget": None, "left": None},
        "by_day": [{"day": "2026-11-30", "spent": "1.000000"}],
        "by_hour": [{"hour": "2026-11-30T12:00:00Z", "spent": "0.5"}],
    }
    Draft202012Validator(SPEND_SCHEMA).validate(spend)
    assert not Draft202012Validator(CALL_SCHEMA).is_valid({**call, "secret": "x"})
