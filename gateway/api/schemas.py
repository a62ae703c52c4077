"""JSON Schemas (draft 2020-12) of the REST API's request and response bodies.

These dicts are the single source of truth: :mod:`gateway.api.validation`
validates requests with them and :mod:`gateway.api.openapi` publishes them
unchanged under ``components/schemas``. Every object is closed
(``additionalProperties: false``) except ``metadata``, which is a free-form map
of bounded strings by design.

Money is a decimal string in US dollars (``"0.50"``), never a JSON number:
binary floats cannot hold cents exactly, and the gateway counts integer
micro-dollars (:mod:`spend.money`).

Every bound is a named constant with the reason for its value. Patterns are
written in the common subset of Python ``re`` and ECMA-262 (OpenAPI 3.1 says
patterns are ECMA-262), and each has a human hint in :data:`PATTERN_HINTS`,
used for error messages.
"""

from __future__ import annotations

from typing import Any

from rutster.gateway.api.errors import ERROR_CODES
from rutster.gateway.provider_registry import PROVIDER_NAME_PATTERN
from rutster.gateway.providers import REGISTRY
from rutster.spend.tenant_id import TENANT_ID_MAX_CHARS, TENANT_ID_PATTERN

Schema = dict[str, Any]

#: The JSON Schema dialect of every schema here (OpenAPI 3.1 ``jsonSchemaDialect``).
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# --- bounds -----------------------------------------------------------------

#: Longest call the API accepts: one day. A call longer than that is a stuck call
#: (a brain that never hangs up, a forgotten line) burning money. Seed decision.
MAX_CALL_DURATION_S = 86_400
#: Largest per-call cost cap, USD (seed decision). A single phone call costing more
#: than this is a runaway, not a use case.
MAX_CALL_COST_USD = 10_000
#: Money strings: at most 7 integer digits (< 10 million USD, far above any daily
#: or monthly budget a tenant sets here) and 6 decimals (the micro-dollar unit).
MONEY_MAX_INTEGER_DIGITS = 7
MONEY_MAX_DECIMALS = 6
#: ITU-T E.164 §6: at most 15 digits including the country code. 7 is the
#: shortest complete international number in use (small numbering plans, e.g.
#: Niue's 4-digit numbers plus its 3-digit country code).
E164_MAX_DIGITS = 15
E164_MIN_DIGITS = 7
#: Longest ``sip:``/``sips:`` URI accepted. RFC 3261 sets no limit; 256 fits any
#: real user@host;params and keeps a hostile URI out of logs. Seed decision.
MAX_SIP_URI_CHARS = 256
#: Longest brain URL (seed decision): the de-facto URL limit of browsers and proxies.
MAX_BRAIN_URL_CHARS = 2048
#: Configured brain names: short identifiers (seed decision).
MAX_BRAIN_NAME_CHARS = 32
#: Campaign ids (seed decision): 1..64 URL-safe characters.
MAX_CAMPAIGN_CHARS = 64
#: Metadata caps (seed decision): 16 entries, keys <= 40 chars, values <= 256 chars.
MAX_METADATA_ENTRIES = 16
MAX_METADATA_KEY_CHARS = 40
MAX_METADATA_VALUE_CHARS = 256
#: The call record stores metadata as one JSON string of at most 2 KiB
#: (docs/SPEND.md, ``P:call:{id}``); the per-entry caps above allow more than that in
#: the worst case, so the serialized size is checked too (validation.py).
MAX_METADATA_JSON_BYTES = 2048
#: API key labels: a short human note ("ci", "prod dialer").
MAX_KEY_LABEL_CHARS = 64
#: Tenant concurrency ceiling: far above what one deployment runs (a gateway
#: node carries hundreds of calls); rejects typos like 1e9. Seed decision.
MAX_TENANT_CONCURRENT = 100_000
#: One caller number placing more than one call per second, all hour, is abuse
#: whatever the tenant wants. Seed decision.
MAX_CALLER_CALLS_PER_HOUR = 3_600
#: 100 calls per second per campaign: above any carrier's CPS allowance (Twilio
#: starts accounts at 1 CPS). Seed decision.
MAX_CAMPAIGN_CALLS_PER_MINUTE = 6_000
#: Largest page of calls (seed decision: limit 1..200, default 50).
MAX_PAGE_LIMIT = 200
DEFAULT_PAGE_LIMIT = 50
#: Digits of a pagination cursor's position: Redis sorted-set scores are doubles,
#: exact for integers up to 2**53 (16 digits); the store's scores are Unix ms (13).
MAX_CURSOR_SCORE_DIGITS = len(str(2**53))
#: Spend history window (seed decision: days 1..90, default 7): the day buckets
#: expire after 40 days, months after 400; 90 days still reads month totals.
MAX_SPEND_DAYS = 90
DEFAULT_SPEND_DAYS = 7
#: Longest call id: ``call_`` + hex. 64 hex digits = 256 bits, more than any id
#: generator here uses.
MAX_CALL_ID_HEX = 64

# --- patterns ---------------------------------------------------------------

#: E.164 (seed decision): "+", a non-zero country code digit, 7..15 digits in all.
E164_PATTERN = rf"^\+[1-9][0-9]{{{E164_MIN_DIGITS - 1},{E164_MAX_DIGITS - 1}}}$"
_SIP_USER = r"[A-Za-z0-9._~%!$&'()*+,;=?/-]+@"
_SIP_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
#: ``sip:`` / ``sips:`` URI (RFC 3261 §19.1): optional user@, host, port, params.
SIP_URI_PATTERN = rf"^sips?:(?:{_SIP_USER})?{_SIP_HOST}(?::[0-9]{{1,5}})?(?:;[A-Za-z0-9._~%=-]+)*$"
#: A call's ``to``: an E.164 number, or a SIP URI (only for provider ``sip``).
CALL_TO_PATTERN = f"^(?:{E164_PATTERN[1:-1]}|{SIP_URI_PATTERN[1:-1]})$"
#: A configured brain name (seed decision).
BRAIN_NAME_PATTERN = rf"^[a-z][a-z0-9_-]{{0,{MAX_BRAIN_NAME_CHARS - 1}}}$"
#: A character of a brain URL: printable ASCII except space and the three the tap
#: allowlist never admits (``?`` query, ``#`` fragment, ``%`` escapes;
#: gateway/tap_allowlist.py). An explicit ASCII class, not ``[^\s]``: Python's and
#: ECMA-262's ``\s`` differ (\x1c-\x1f, \x85, \ufeff), and neither excludes controls.
_BRAIN_URL_CHAR = r'[!-"$&->@-~]'
#: A brain: a configured name or a ws(s) URL (the tap allowlist checks the host).
BRAIN_PATTERN = rf"^(?:{BRAIN_NAME_PATTERN[1:-1]}|wss?://{_BRAIN_URL_CHAR}+)$"
CAMPAIGN_PATTERN = rf"^[A-Za-z0-9_.-]{{1,{MAX_CAMPAIGN_CHARS}}}$"
#: Any USD amount: up to 7 integer digits, up to 6 decimals.
MONEY_PATTERN = rf"^[0-9]{{1,{MONEY_MAX_INTEGER_DIGITS}}}(?:\.[0-9]{{1,{MONEY_MAX_DECIMALS}}})?$"
_CALL_COST_BODY = (
    rf"(?:[0-9]{{1,{len(str(MAX_CALL_COST_USD)) - 1}}}(?:\.[0-9]{{1,{MONEY_MAX_DECIMALS}}})?"
    rf"|{MAX_CALL_COST_USD}(?:\.0{{1,{MONEY_MAX_DECIMALS}}})?)"
)
#: A per-call cost cap: 0..10000 USD (0 in tenant limits means "no cap").
CALL_COST_PATTERN = f"^{_CALL_COST_BODY}$"
#: A per-call cost cap in a call request: > 0 (a zero cap could never place the call).
POSITIVE_CALL_COST_PATTERN = rf"^(?![0.]+$){_CALL_COST_BODY}$"
#: Metadata keys and key labels: no control characters, C0, DEL or C1 (they end up in
#: dashboards and logs, where C1's CSI starts a terminal escape).
_NO_CONTROL = r"[^\u0000-\u001f\u007f-\u009f]"
METADATA_KEY_PATTERN = rf"^{_NO_CONTROL}{{1,{MAX_METADATA_KEY_CHARS}}}$"
KEY_LABEL_PATTERN = rf"^{_NO_CONTROL}{{1,{MAX_KEY_LABEL_CHARS}}}$"
CALL_ID_PATTERN = rf"^call_[0-9a-f]{{1,{MAX_CALL_ID_HEX}}}$"
#: Pagination cursor: ``<created ms>:<call id>``, the position the store resumes from
#: (spend/store.py ``_decode_cursor``). Any cursor of this shape is a valid position.
CURSOR_PATTERN = rf"^[0-9]{{1,{MAX_CURSOR_SCORE_DIGITS}}}:{CALL_ID_PATTERN[1:-1]}$"
#: An API key: ``rk_live_`` + 32 URL-safe base64 characters (24 random bytes).
API_KEY_PATTERN = r"^rk_live_[A-Za-z0-9_-]{32}$"
#: Calendar day and hour labels in spend reports.
DAY_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
HOUR_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:00:00Z$"

#: Human hint per pattern, used as the error message when a value fails it.
PATTERN_HINTS: dict[str, str] = {
    E164_PATTERN: "must match E.164 like +15551234567",
    PROVIDER_NAME_PATTERN: "must be a provider name: a lowercase word like twilio or sip",
    CALL_TO_PATTERN: (
        "must be an E.164 number like +15551234567 (or a sip: URI like "
        "sip:alice@pbx.example.com for provider 'sip')"
    ),
    BRAIN_PATTERN: (
        "must be a configured brain name (lowercase letters, digits, '_' or '-', "
        f"starting with a letter, at most {MAX_BRAIN_NAME_CHARS} chars) or a ws:// or wss:// URL "
        "(printable ASCII; no spaces, query, fragment or %-escapes)"
    ),
    CAMPAIGN_PATTERN: (
        f"must be 1..{MAX_CAMPAIGN_CHARS} characters: letters, digits, '_', '.' or '-'"
    ),
    TENANT_ID_PATTERN: (
        f"must be a tenant id: 1..{TENANT_ID_MAX_CHARS} lowercase letters, digits, '_' or '-', "
        "starting with a letter or digit"
    ),
    MONEY_PATTERN: (
        'must be a decimal USD amount as a string, like "25.00" '
        f"(at most {MONEY_MAX_INTEGER_DIGITS} integer digits and {MONEY_MAX_DECIMALS} decimals)"
    ),
    CALL_COST_PATTERN: (
        f'must be a decimal USD amount as a string, 0..{MAX_CALL_COST_USD}, like "0.50" '
        f"(at most {MONEY_MAX_DECIMALS} decimals)"
    ),
    POSITIVE_CALL_COST_PATTERN: (
        f'must be a decimal USD amount as a string, > 0 and <= {MAX_CALL_COST_USD}, like "0.50" '
        f"(at most {MONEY_MAX_DECIMALS} decimals)"
    ),
    METADATA_KEY_PATTERN: (
        f"must be 1..{MAX_METADATA_KEY_CHARS} characters without control characters"
    ),
    KEY_LABEL_PATTERN: f"must be 1..{MAX_KEY_LABEL_CHARS} characters without control characters",
    CURSOR_PATTERN: "must be the next_cursor of a previous page",
    CALL_ID_PATTERN: "must be a call id like call_0123abcd",
    API_KEY_PATTERN: "must be an API key: rk_live_ followed by 32 URL-safe characters",
    DAY_PATTERN: "must be a day like 2026-11-30",
    HOUR_PATTERN: "must be an hour like 2026-11-30T12:00:00Z",
}

# --- shared pieces ------------------------------------------------------------

#: Call statuses (seed decision).
CALL_STATUSES = ("queued", "ringing", "in_progress", "ended", "refused", "failed")
#: The providers ``POST /v1/calls`` dials through: the registry's (gateway/providers/).
OUTBOUND_PROVIDERS = REGISTRY.outbound_names()
#: Those that dial phone numbers only (a ``sip:`` URI needs another).
NUMBER_ONLY_PROVIDERS = [p.name for p in REGISTRY if not p.capabilities.dials_sip_uris]
DIRECTIONS = ("inbound", "outbound")
ROLES = ("tenant", "admin")
CURRENCY = "USD"


def _money(description: str, pattern: str = MONEY_PATTERN) -> Schema:
    return {"type": "string", "pattern": pattern, "description": description}


def _nullable_money(description: str) -> Schema:
    return {"type": ["string", "null"], "pattern": MONEY_PATTERN, "description": description}


def _count(maximum: int, description: str) -> Schema:
    return {"type": "integer", "minimum": 0, "maximum": maximum, "description": description}


_METADATA: Schema = {
    "type": "object",
    "description": (
        f"Free-form string map echoed back on the call: at most {MAX_METADATA_ENTRIES} entries, "
        f"keys <= {MAX_METADATA_KEY_CHARS} chars, values <= {MAX_METADATA_VALUE_CHARS} chars, "
        f"<= {MAX_METADATA_JSON_BYTES} bytes as compact UTF-8 JSON."
    ),
    "maxProperties": MAX_METADATA_ENTRIES,
    "propertyNames": {"pattern": METADATA_KEY_PATTERN},
    "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS},
}

# --- request bodies -----------------------------------------------------------

#: ``POST /v1/calls``.
CREATE_CALL_SCHEMA: Schema = {
    "title": "CreateCallRequest",
    "type": "object",
    "additionalProperties": False,
    "required": ["to", "from", "provider"],
    "properties": {
        "to": {
            "type": "string",
            "maxLength": MAX_SIP_URI_CHARS,
            "pattern": CALL_TO_PATTERN,
            "description": "Number to dial (E.164), or a sip: URI with provider 'sip'.",
        },
        "from": {
            "type": "string",
            "pattern": E164_PATTERN,
            "description": "Caller id (E.164), a number the tenant owns at the provider.",
        },
        "provider": {"type": "string", "enum": list(OUTBOUND_PROVIDERS)},
        "brain": {
            "type": "string",
            "maxLength": MAX_BRAIN_URL_CHARS,
            "pattern": BRAIN_PATTERN,
            "description": "Configured brain name, or the brain's ws(s) URL (allowlisted).",
        },
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "description": "Caps for this call; the tenant's and global caps still apply.",
            "properties": {
                "max_duration_s": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_CALL_DURATION_S,
                },
                "max_cost": _money("Cost cap for this call, USD.", POSITIVE_CALL_COST_PATTERN),
            },
        },
        "metadata": _METADATA,
        "campaign": {
            "type": "string",
            "pattern": CAMPAIGN_PATTERN,
            "description": "Campaign id, for per-campaign call rate limits.",
        },
    },
    # Twilio dials phone numbers only: a sip: URI needs provider "sip".
    "if": {"required": ["provider"], "properties": {"provider": {"enum": NUMBER_ONLY_PROVIDERS}}},
    "then": {"properties": {"to": {"pattern": E164_PATTERN}}},
}

#: ``PUT /v1/tenants/{id}/limits``: any subset; 0 / "0" means unlimited.
TENANT_LIMITS_SCHEMA: Schema = {
    "title": "TenantLimitsRequest",
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "budget_day": _money('Spend per UTC day, USD; "0" = unlimited.'),
        "budget_month": _money('Spend per UTC month, USD; "0" = unlimited.'),
        "max_call_cost": _money('Cost cap per call, USD; "0" = no cap.', CALL_COST_PATTERN),
        "max_concurrent": _count(MAX_TENANT_CONCURRENT, "Concurrent calls; 0 = unlimited."),
        "max_call_duration_s": _count(MAX_CALL_DURATION_S, "Seconds per call; 0 = no cap."),
        "caller_calls_per_hour": _count(
            MAX_CALLER_CALLS_PER_HOUR, "Calls per hour from one caller number; 0 = unlimited."
        ),
        "campaign_calls_per_minute": _count(
            MAX_CAMPAIGN_CALLS_PER_MINUTE, "Calls per minute per campaign; 0 = unlimited."
        ),
    },
}

#: ``POST /v1/admin/keys``.
CREATE_KEY_SCHEMA: Schema = {
    "title": "CreateKeyRequest",
    "type": "object",
    "additionalProperties": False,
    "required": ["tenant"],
    "properties": {
        "tenant": {"type": "string", "pattern": TENANT_ID_PATTERN},
        "label": {"type": "string", "pattern": KEY_LABEL_PATTERN},
        "role": {"type": "string", "enum": list(ROLES), "default": "tenant"},
    },
}

#: ``PUT /v1/admin/kill-switch``.
KILL_SWITCH_SCHEMA: Schema = {
    "title": "KillSwitchRequest",
    "type": "object",
    "additionalProperties": False,
    "required": ["engaged"],
    "properties": {
        "engaged": {
            "type": "boolean",
            "description": "true refuses every new call; calls in progress go on.",
        }
    },
}

# --- query strings (validated after string-to-type conversion) ----------------

#: ``GET /v1/calls`` query parameters.
CALLS_QUERY_SCHEMA: Schema = {
    "title": "ListCallsQuery",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "status": {"type": "string", "enum": list(CALL_STATUSES)},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_PAGE_LIMIT,
            "default": DEFAULT_PAGE_LIMIT,
        },
        "cursor": {"type": "string", "pattern": CURSOR_PATTERN},
        "tenant": {
            "type": "string",
            "pattern": TENANT_ID_PATTERN,
            "description": (
                "Whose calls; by default the key's own tenant. The operator's admin key has "
                "none and must name one (403 without); a tenant key may name only its own "
                "(403 for another)."
            ),
        },
    },
}

#: ``GET /v1/spend`` query parameters.
SPEND_QUERY_SCHEMA: Schema = {
    "title": "SpendQuery",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "days": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_SPEND_DAYS,
            "default": DEFAULT_SPEND_DAYS,
        },
        "tenant": {
            "type": "string",
            "pattern": TENANT_ID_PATTERN,
            "description": (
                "Whose spend; by default the key's own tenant. The operator's admin key has "
                "none and must name one (403 without); a tenant key may name only its own "
                "(403 for another)."
            ),
        },
    },
}

# --- responses ----------------------------------------------------------------

_NULLABLE_TIME: Schema = {"type": ["string", "null"], "format": "date-time"}

#: The error body of every non-2xx answer.
ERROR_SCHEMA: Schema = {
    "title": "Error",
    "type": "object",
    "additionalProperties": False,
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "additionalProperties": False,
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string", "enum": list(ERROR_CODES)},
                "message": {"type": "string"},
                "field": {
                    "type": ["string", "null"],
                    "description": "Offending request field, dotted (limits.max_cost).",
                },
                "reason": {
                    "type": "string",
                    "description": "Admission refusal reason (402 only).",
                },
            },
        }
    },
}

#: A call (``GET /v1/calls/{id}`` adds ``receipts``).
CALL_SCHEMA: Schema = {
    "title": "Call",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "id",
        "tenant",
        "status",
        "direction",
        "provider",
        "from",
        "to",
        "brain",
        "campaign",
        "created_at",
        "answered_at",
        "ended_at",
        "end_reason",
        "limits",
        "spend",
        "metadata",
    ],
    "properties": {
        "id": {"type": "string", "pattern": CALL_ID_PATTERN},
        "tenant": {"type": "string", "pattern": TENANT_ID_PATTERN},
        "status": {"type": "string", "enum": list(CALL_STATUSES)},
        "direction": {"type": "string", "enum": list(DIRECTIONS)},
        # What the record says: one of OUTBOUND_PROVIDERS here, and whatever provider a newer
        # gateway node recorded during a rolling upgrade ("unknown" if unreadable).
        "provider": {"type": "string", "pattern": PROVIDER_NAME_PATTERN},
        "from": {"type": "string"},
        "to": {"type": "string"},
        "brain": {"type": ["string", "null"]},
        "campaign": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "answered_at": _NULLABLE_TIME,
        "ended_at": _NULLABLE_TIME,
        "end_reason": {"type": ["string", "null"]},
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "required": ["max_duration_s", "max_cost"],
            "description": "The effective caps (request, tenant and global combined).",
            "properties": {
                "max_duration_s": {"type": "integer", "minimum": 0},
                "max_cost": _money("USD"),
            },
        },
        "spend": {
            "type": "object",
            "additionalProperties": False,
            "required": ["reserved", "cost", "settled", "currency"],
            "properties": {
                "reserved": _money("Reserved against the budgets so far, USD."),
                "cost": _money("Running cost, USD."),
                "settled": _nullable_money("Final cost once the call has ended, USD."),
                "currency": {"const": CURRENCY},
            },
        },
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": "string"},
        },
        "receipts": {
            "type": "array",
            "description": "Content-free per-call receipts (GET one call only).",
            "items": {
                "type": "object",
                "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
            },
        },
    },
}

#: ``GET /v1/calls``.
CALL_LIST_SCHEMA: Schema = {
    "title": "CallList",
    "type": "object",
    "additionalProperties": False,
    "required": ["data", "next_cursor"],
    "properties": {
        "data": {"type": "array", "items": CALL_SCHEMA},
        "next_cursor": {"type": ["string", "null"], "pattern": CURSOR_PATTERN},
    },
}


def _spend_period(name: str) -> Schema:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["spent", "reserved", "budget", "left"],
        "description": f"This {name} (UTC).",
        "properties": {
            "spent": _money("Settled spend, USD."),
            "reserved": _money("Reserved by calls in progress, USD."),
            "budget": _nullable_money("Budget, USD; null = unlimited."),
            "left": _nullable_money("Budget minus spent and reserved, >= 0; null = unlimited."),
        },
    }


#: ``GET /v1/spend``.
SPEND_SCHEMA: Schema = {
    "title": "Spend",
    "type": "object",
    "additionalProperties": False,
    "required": ["tenant", "currency", "today", "month", "by_day", "by_hour"],
    "properties": {
        "tenant": {"type": "string", "pattern": TENANT_ID_PATTERN},
        "currency": {"const": CURRENCY},
        "today": _spend_period("day"),
        "month": _spend_period("month"),
        "by_day": {
            "type": "array",
            "maxItems": MAX_SPEND_DAYS,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["day", "spent"],
                "properties": {
                    "day": {"type": "string", "pattern": DAY_PATTERN},
                    "spent": _money("USD"),
                },
            },
        },
        "by_hour": {
            "type": "array",
            "description": "The last 24 hours, oldest first.",
            "maxItems": 24,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["hour", "spent"],
                "properties": {
                    "hour": {"type": "string", "pattern": HOUR_PATTERN},
                    "spent": _money("USD"),
                },
            },
        },
    },
}

#: ``GET``/``PUT /v1/tenants/{id}/limits``: every limit, 0 / "0" = unlimited.
LIMITS_SCHEMA: Schema = {
    "title": "TenantLimits",
    "type": "object",
    "additionalProperties": False,
    "required": ["tenant", *TENANT_LIMITS_SCHEMA["properties"]],
    "properties": {
        "tenant": {"type": "string", "pattern": TENANT_ID_PATTERN},
        **TENANT_LIMITS_SCHEMA["properties"],
    },
}

#: ``POST /v1/admin/keys`` answer: the key itself is shown only here, once.
KEY_SCHEMA: Schema = {
    "title": "ApiKey",
    "type": "object",
    "additionalProperties": False,
    "required": ["key", "tenant", "role", "label"],
    "properties": {
        "key": {"type": "string", "pattern": API_KEY_PATTERN},
        "tenant": {"type": "string", "pattern": TENANT_ID_PATTERN},
        "role": {"type": "string", "enum": list(ROLES)},
        "label": {"type": ["string", "null"]},
    },
}

#: ``GET``/``PUT /v1/admin/kill-switch`` answer.
KILL_SWITCH_STATE_SCHEMA: Schema = {
    "title": "KillSwitch",
    "type": "object",
    "additionalProperties": False,
    "required": ["engaged"],
    "properties": {"engaged": {"type": "boolean"}},
}

#: Request body schemas, by OpenAPI component name.
REQUEST_SCHEMAS: dict[str, Schema] = {
    "CreateCallRequest": CREATE_CALL_SCHEMA,
    "TenantLimitsRequest": TENANT_LIMITS_SCHEMA,
    "CreateKeyRequest": CREATE_KEY_SCHEMA,
    "KillSwitchRequest": KILL_SWITCH_SCHEMA,
}

#: Response body schemas, by OpenAPI component name.
RESPONSE_SCHEMAS: dict[str, Schema] = {
    "Call": CALL_SCHEMA,
    "CallList": CALL_LIST_SCHEMA,
    "Spend": SPEND_SCHEMA,
    "TenantLimits": LIMITS_SCHEMA,
    "ApiKey": KEY_SCHEMA,
    "KillSwitch": KILL_SWITCH_STATE_SCHEMA,
    "Error": ERROR_SCHEMA,
}
