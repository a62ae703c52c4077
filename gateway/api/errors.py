"""REST API errors: one exception type and one JSON shape for every failure.

Every error the API returns has the body::

    {"error": {"code": "<code>", "message": "<human text>", "field": "<path>" | null}}

plus, for an admission refusal (402), ``"reason"`` (the spend gate's refusal
reason). Route handlers raise :class:`ApiError` (usually through the helpers
below); :func:`error_response` renders it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

#: Error codes (the ``error.code`` field). Clients switch on these, never on messages.
CODE_INVALID_REQUEST = "invalid_request"
CODE_UNAUTHORIZED = "unauthorized"
CODE_FORBIDDEN = "forbidden"
CODE_NOT_FOUND = "not_found"
CODE_CONFLICT = "conflict"
CODE_REFUSED = "refused"
CODE_RATE_LIMITED = "rate_limited"
CODE_PAYLOAD_TOO_LARGE = "payload_too_large"
CODE_UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
#: The spend store (Redis) cannot be reached: the request may be retried.
CODE_UNAVAILABLE = "unavailable"
#: The route exists but not with this HTTP method.
CODE_METHOD_NOT_ALLOWED = "method_not_allowed"
#: The telephony provider refused or failed a request made for this one (502).
CODE_PROVIDER_ERROR = "provider_error"

#: Every code the API can return (the OpenAPI document lists them).
ERROR_CODES = (
    CODE_INVALID_REQUEST,
    CODE_UNAUTHORIZED,
    CODE_FORBIDDEN,
    CODE_NOT_FOUND,
    CODE_CONFLICT,
    CODE_REFUSED,
    CODE_RATE_LIMITED,
    CODE_PAYLOAD_TOO_LARGE,
    CODE_UNSUPPORTED_MEDIA_TYPE,
    CODE_UNAVAILABLE,
    CODE_METHOD_NOT_ALLOWED,
    CODE_PROVIDER_ERROR,
)

#: Longest message sent: one readable line. Messages may quote client input
#: (an unknown field name), which must not turn an error into a megabyte echo.
MAX_MESSAGE_CHARS = 300
#: Retry-After for a 503 when the store is down: seed decision, about the time a
#: Redis failover or restart takes (the embedded server restarts in ~10 ms, a
#: Sentinel failover in a few seconds).
UNAVAILABLE_RETRY_AFTER_S = 2


class ApiError(Exception):
    """An error answer: HTTP ``status``, stable ``code``, human ``message``.

    ``field`` names the offending request field (``"limits.max_cost"``) when
    there is one; ``headers`` are added to the response (``Retry-After``,
    ``WWW-Authenticate``); ``extra`` holds additional members of the error
    object (``{"reason": "budget_day"}`` for a refusal).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers: dict[str, str] = dict(headers or {})
        self.extra: dict[str, str] = dict(extra or {})

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, field={self.field!r})"

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"code", "message", "field", ...extra}}``."""
        message = self.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        error: dict[str, Any] = {"code": self.code, "message": message, "field": self.field}
        for key, value in self.extra.items():
            error.setdefault(key, value)  # never let extra overwrite the fixed members
        return {"error": error}


def error_response(exc: ApiError) -> JSONResponse:
    """Render ``exc`` as a JSON response with its status and headers."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def handle_api_error(_request: Request, exc: Exception) -> Response:
    """Starlette exception handler rendering :class:`ApiError` (register it for ApiError)."""
    if not isinstance(exc, ApiError):  # pragma: no cover - only registered for ApiError
        raise exc
    return error_response(exc)


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` value: whole seconds (RFC 9110 §10.2.3 delay-seconds), rounded up, >= 1."""
    if not math.isfinite(seconds):
        raise ValueError(f"retry-after must be finite, got {seconds!r}")
    return str(max(1, math.ceil(seconds)))


def provider_error(message: str) -> ApiError:
    """502: the provider (e.g. Twilio's REST API) did not do what was asked."""
    return ApiError(502, CODE_PROVIDER_ERROR, message)


def invalid_request(message: str, field: str | None = None) -> ApiError:
    """422: the request is well-formed HTTP but its content is wrong."""
    return ApiError(422, CODE_INVALID_REQUEST, message, field=field)


def unauthorized(message: str) -> ApiError:
    """401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3)."""
    return ApiError(
        401, CODE_UNAUTHORIZED, message, headers={"WWW-Authenticate": 'Bearer realm="rutster"'}
    )


def forbidden(message: str, field: str | None = None) -> ApiError:
    """403: authenticated, but this key may not do that (``field``: the parameter at fault)."""
    return ApiError(403, CODE_FORBIDDEN, message, field=field)


def method_not_allowed(method: str, path: str, allow: str) -> ApiError:
    """405 with ``Allow`` (RFC 9110 §15.5.6: a 405 MUST list the methods the resource has)."""
    return ApiError(
        405,
        CODE_METHOD_NOT_ALLOWED,
        f"{method[:20]} is not allowed on {path[:100]}; allowed: {allow}",
        headers={"Allow": allow},
    )


def not_found(message: str) -> ApiError:
    """404: no such resource (or not visible to this key)."""
    return ApiError(404, CODE_NOT_FOUND, message)


def conflict(message: str) -> ApiError:
    """409: the resource's state does not allow this."""
    return ApiError(409, CODE_CONFLICT, message)


def refused(reason: str, message: str) -> ApiError:
    """402: the spend gate refused admission; ``reason`` is its refusal reason."""
    return ApiError(402, CODE_REFUSED, message, extra={"reason": reason})


def rate_limited(retry_after_s: float) -> ApiError:
    """429 with ``Retry-After`` in whole seconds."""
    header = retry_after_header(retry_after_s)
    return ApiError(
        429,
        CODE_RATE_LIMITED,
        f"too many requests for this API key; retry after {header} s",
        headers={"Retry-After": header},
    )


def payload_too_large(max_bytes: int) -> ApiError:
    """413: the body is bigger than the endpoint accepts."""
    return ApiError(413, CODE_PAYLOAD_TOO_LARGE, f"request body is larger than {max_bytes} bytes")


def unsupported_media_type(content_type: str | None) -> ApiError:
    """415: the body is not ``application/json``."""
    shown = "none" if not content_type else repr(content_type[:80])
    return ApiError(
        415,
        CODE_UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type must be application/json (got {shown})",
    )


def unavailable(message: str = "the spend store is unavailable; retry shortly") -> ApiError:
    """503 with ``Retry-After``: the backing store cannot be reached."""
    return ApiError(
        503,
        CODE_UNAVAILABLE,
        message,
        headers={"Retry-After": retry_after_header(UNAVAILABLE_RETRY_AFTER_S)},
    )
