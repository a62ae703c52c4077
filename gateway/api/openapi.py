"""The OpenAPI 3.1 document of the ``/v1`` REST API (served at ``GET /v1/openapi.json``).

Built from the very schemas :mod:`gateway.api.validation` validates with
(:mod:`gateway.api.schemas`), copied under ``components/schemas``, so the
published contract and the enforced one cannot drift apart.
"""

from __future__ import annotations

import copy
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rutster.gateway.api.schemas import (
    CALL_ID_PATTERN,
    CALLS_QUERY_SCHEMA,
    JSON_SCHEMA_DIALECT,
    MAX_METADATA_JSON_BYTES,
    REQUEST_SCHEMAS,
    RESPONSE_SCHEMAS,
    SPEND_QUERY_SCHEMA,
    Schema,
)
from rutster.gateway.api.validation import MAX_BODY_BYTES
from rutster.spend.tenant_id import TENANT_ID_PATTERN

#: OpenAPI version of the document (3.1: schemas are plain JSON Schema 2020-12).
OPENAPI_VERSION = "3.1.0"
API_TITLE = "rutster API"

_JSON = "application/json"
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_RETRY_AFTER = {
    "description": "Seconds to wait before retrying (RFC 9110 §10.2.3).",
    "schema": {"type": "integer", "minimum": 1},
}

#: Reusable error responses: name -> (description, headers).
_ERROR_RESPONSES: dict[str, tuple[str, dict[str, Any]]] = {
    "InvalidRequest": ("The request is invalid (`invalid_request`); `field` names the field.", {}),
    "Unauthorized": (
        "Missing, malformed, unknown or revoked API key (`unauthorized`).",
        {"WWW-Authenticate": {"schema": {"type": "string"}}},
    ),
    "Forbidden": (
        "This key may not do that (`forbidden`): an admin operation with a tenant key, "
        "another tenant named with a tenant key, or a call placed or a tenant read with the "
        "operator's admin key, which has no tenant, without naming one (`?tenant=`). "
        "`field` names the parameter at fault, if any.",
        {},
    ),
    "NotFound": ("No such resource visible to this key (`not_found`).", {}),
    "Conflict": ("The resource's state does not allow this (`conflict`).", {}),
    "ProviderError": (
        "The telephony provider refused or failed the request (`provider_error`); "
        "for a refused placement the reservation was released.",
        {},
    ),
    "Refused": (
        "The spend gate refused the call (`refused`); `reason` says why: kill_switch, "
        "global_concurrency, tenant_concurrency, caller_rate, campaign_rate, budget_day, "
        "budget_month or duplicate_call.",
        {},
    ),
    "PayloadTooLarge": (
        f"The body is larger than {MAX_BODY_BYTES} bytes (`payload_too_large`).",
        {},
    ),
    "UnsupportedMediaType": (
        "The body is not application/json (`unsupported_media_type`).",
        {},
    ),
    "RateLimited": (
        "Too many requests for this API key (`rate_limited`).",
        {"Retry-After": _RETRY_AFTER},
    ),
    "Unavailable": (
        "The spend store cannot be reached (`unavailable`); retry later.",
        {"Retry-After": _RETRY_AFTER},
    ),
}

_STATUS_OF = {
    "InvalidRequest": "422",
    "Unauthorized": "401",
    "Forbidden": "403",
    "NotFound": "404",
    "Conflict": "409",
    "Refused": "402",
    "PayloadTooLarge": "413",
    "UnsupportedMediaType": "415",
    "RateLimited": "429",
    "Unavailable": "503",
    "ProviderError": "502",
}

#: One event of the dashboard stream. Per event, not per body: OpenAPI 3.1 has no
#: way to say so (3.2 adds ``itemSchema``), and tools such as schemathesis validate
#: each event of a text/event-stream against ``schema``.
_SSE_SNAPSHOT_EVENT: Schema = {
    "type": "object",
    "description": "One server-sent event: `event: snapshot`, the snapshot as JSON in `data`.",
    "required": ["event", "data"],
    "properties": {
        "event": {"const": "snapshot"},
        "data": {"type": "string", "contentMediaType": _JSON},
    },
}

# Errors every authenticated endpoint can answer.
_COMMON_ERRORS = ("Unauthorized", "RateLimited", "Unavailable")
# Extra errors of an endpoint that takes a JSON body.
_BODY_ERRORS = ("InvalidRequest", "PayloadTooLarge", "UnsupportedMediaType")


def _api_version() -> str:
    try:
        return version("rutster")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_response(description: str, schema_name: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref(schema_name)}}}


def _body(schema_name: str, description: str) -> dict[str, Any]:
    return {
        "required": True,
        "description": description,
        "content": {_JSON: {"schema": _ref(schema_name)}},
    }


def _query_parameters(schema: Schema) -> list[dict[str, Any]]:
    """One ``in: query`` parameter per property of a query schema (same schema objects)."""
    return [
        {"name": name, "in": "query", "required": False, "schema": copy.deepcopy(prop)}
        for name, prop in schema["properties"].items()
    ]


def _path_parameter(name: str, pattern: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": pattern},
    }


def _operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    errors: tuple[str, ...] = (),
    body: dict[str, Any] | None = None,
    parameters: list[dict[str, Any]] | None = None,
    public: bool = False,
    description: str | None = None,
) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary}
    if description is not None:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = body
    all_errors = (() if public else _COMMON_ERRORS) + errors
    if body is not None:
        all_errors += _BODY_ERRORS
    merged = dict(responses)
    for name in sorted(set(all_errors), key=lambda n: _STATUS_OF[n]):
        merged[_STATUS_OF[name]] = {"$ref": f"#/components/responses/{name}"}
    operation["responses"] = merged
    if public:
        operation["security"] = []
    return operation


def _paths() -> dict[str, Any]:
    call_id = _path_parameter("id", CALL_ID_PATTERN, "Call id.")
    tenant_id = _path_parameter("id", TENANT_ID_PATTERN, "Tenant id.")
    return {
        "/v1/calls": {
            "post": _operation(
                "createCall",
                "Place an outbound call (admitted by the spend gate first).",
                {"201": _json_response("The call was admitted and is being placed.", "Call")},
                errors=("Refused", "Forbidden", "Conflict", "ProviderError"),
                body=_body("CreateCallRequest", "The call to place."),
                description=(
                    "Places the call for the key's tenant (the operator's admin key has none: "
                    "403). Besides the schema, 422 "
                    "also answers a `brain` name this gateway has not configured, a brain "
                    "URL off its allowlist, and `metadata` over "
                    f"{MAX_METADATA_JSON_BYTES} bytes as compact UTF-8 JSON. 409: the "
                    "provider is not set up on this gateway (Twilio credentials, a "
                    "connected SIP worker)."
                ),
            ),
            "get": _operation(
                "listCalls",
                "List a tenant's calls, newest first (the key's own tenant, or `?tenant=`).",
                {"200": _json_response("One page of calls.", "CallList")},
                errors=("InvalidRequest", "Forbidden"),
                parameters=_query_parameters(CALLS_QUERY_SCHEMA),
            ),
        },
        "/v1/calls/{id}": {
            "parameters": [call_id],
            "get": _operation(
                "getCall",
                "One call, with its content-free receipts.",
                {"200": _json_response("The call.", "Call")},
                errors=("NotFound", "InvalidRequest"),
            ),
            "delete": _operation(
                "hangUpCall",
                "Ask the gateway to hang up a call.",
                {"202": _json_response("Hang-up requested; the call as it is now.", "Call")},
                errors=("NotFound", "Conflict", "ProviderError", "InvalidRequest"),
            ),
        },
        "/v1/spend": {
            "get": _operation(
                "getSpend",
                "A tenant's spend: today, this month, per day and per hour (the key's own "
                "tenant, or `?tenant=`).",
                {
                    "200": _json_response(
                        "Spend report (USD). Budgets are the enforced ones: the tenant's "
                        "limits, else the gateway's defaults.",
                        "Spend",
                    )
                },
                errors=("InvalidRequest", "Forbidden"),
                parameters=_query_parameters(SPEND_QUERY_SCHEMA),
            ),
        },
        "/v1/tenants/{id}/limits": {
            "parameters": [tenant_id],
            "get": _operation(
                "getTenantLimits",
                "A tenant's limits (admin, or that tenant's own key).",
                {
                    "200": _json_response(
                        "The enforced limits (the tenant's own, else the gateway's "
                        "defaults); 0 means unlimited.",
                        "TenantLimits",
                    )
                },
                errors=("Forbidden", "InvalidRequest"),
            ),
            "put": _operation(
                "setTenantLimits",
                "Change some of a tenant's limits (admin).",
                {"200": _json_response("The limits after the change.", "TenantLimits")},
                errors=("Forbidden",),
                body=_body("TenantLimitsRequest", "The limits to change; others keep their value."),
            ),
        },
        "/v1/admin/keys": {
            "post": _operation(
                "createApiKey",
                "Issue an API key (admin). The key is shown only in this answer.",
                {"201": _json_response("The new key.", "ApiKey")},
                errors=("Forbidden",),
                body=_body("CreateKeyRequest", "Whom the key is for."),
            ),
        },
        "/v1/admin/kill-switch": {
            "get": _operation(
                "getKillSwitch",
                "Whether the global kill switch is engaged (admin).",
                {"200": _json_response("Kill switch state.", "KillSwitch")},
                errors=("Forbidden",),
            ),
            "put": _operation(
                "setKillSwitch",
                "Engage or release the global kill switch (admin).",
                {"200": _json_response("Kill switch state after the change.", "KillSwitch")},
                errors=("Forbidden",),
                body=_body("KillSwitchRequest", "The wanted state."),
            ),
        },
        "/v1/dashboard/events": {
            "get": _operation(
                "dashboardEvents",
                "Server-sent events: one `snapshot` event per second for the dashboard.",
                {
                    "200": {
                        "description": (
                            "An endless text/event-stream of `snapshot` events (comment "
                            "lines while the spend store is unavailable)."
                        ),
                        "content": {"text/event-stream": {"schema": _SSE_SNAPSHOT_EVENT}},
                    }
                },
            ),
        },
        "/v1/openapi.json": {
            "get": _operation(
                "getOpenApi",
                "This document.",
                {
                    "200": {
                        "description": "The OpenAPI 3.1 document.",
                        "content": {_JSON: {"schema": {"type": "object"}}},
                    }
                },
                public=True,
            ),
        },
    }


def _components() -> dict[str, Any]:
    schemas = {name: copy.deepcopy(s) for name, s in (REQUEST_SCHEMAS | RESPONSE_SCHEMAS).items()}
    responses = {
        name: {
            "description": description,
            **({"headers": copy.deepcopy(headers)} if headers else {}),
            "content": {_JSON: {"schema": dict(_ERROR_REF)}},
        }
        for name, (description, headers) in _ERROR_RESPONSES.items()
    }
    return {
        "schemas": schemas,
        "responses": responses,
        "securitySchemes": {
            "bearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (`rk_live_...`) or the operator's admin key.",
            }
        },
    }


def build_openapi(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document; ``server_url`` (the public base URL) fills ``servers``."""
    document: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": JSON_SCHEMA_DIALECT,
        "info": {
            "title": API_TITLE,
            "version": _api_version(),
            "description": (
                "Place AI voice calls and watch their spend. Money is a decimal string in "
                'USD. Every error answer is `{"error": {"code", "message", "field"}}`. '
                "Every path answers `OPTIONS` (no key needed) with 204 and `Allow`; a "
                "method a path does not serve gets 405 (`method_not_allowed`) with `Allow`."
            ),
        },
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": _components(),
    }
    if server_url:
        document["servers"] = [{"url": server_url.rstrip("/")}]
    return document
