"""The OpenAPI 3.1 document: valid, complete, and built from the schemas the API enforces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.api import errors
from gateway.api.errors import ApiError
from gateway.api.openapi import build_openapi
from gateway.api.schemas import (
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
from gateway.api.validation import parse_json_body

#: The endpoints of design.md, with the request schema each one validates with.
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


def test_a_published_schema_judges_bodies_like_the_api(document: dict[str, Any]) -> None:
    published = document["components"]["schemas"]["CreateCallRequest"]
    # Both publish and enforce the same verdicts on a set of bodies (integer strictness aside:
    # the API also refuses 60.0, which JSON Schema would count as an integer).
    bodies: list[dict[str, Any]] = [
        {"to": "+15551234567", "from": "+15557654321", "provider": "twilio"},
        {"to": "sip:a@pbx.example.com", "from": "+15557654321", "provider": "twilio"},
        {"to": "sip:a@pbx.example.com", "from": "+15557654321", "provider": "sip"},
        {"to": "+15551234567", "from": "+15557654321", "provider": "twilio", "x": 1},
        {"to": "+15551234567", "from": "+15557654321", "provider": "sip", "limits": {}},
        {"to": "+1", "from": "+15557654321", "provider": "sip"},
    ]
    for body in bodies:
        published_ok = Draft202012Validator(published).is_valid(body)
        try:
            parse_json_body(json.dumps(body).encode(), CREATE_CALL_SCHEMA)
            enforced_ok = True
        except ApiError:
            enforced_ok = False
        assert published_ok == enforced_ok, body


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
