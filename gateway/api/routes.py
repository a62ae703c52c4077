"""The REST API ``/v1``: thin Starlette handlers over the spend store, the gate and the calls.

Every handler authenticates (``Authorization: Bearer``), applies the per-key
rate limit, validates its input with the JSON Schemas of
:mod:`gateway.api.schemas` (the same ones the OpenAPI document publishes), and
answers JSON. Errors have one shape (:mod:`gateway.api.errors`). A tenant key
sees only its own calls and spend: another tenant's call is a 404, not a 403,
so ids cannot be probed; naming another tenant (``?tenant=``, a tenant's
limits) is a 403 whether that tenant exists or not. The operator's admin key
has no tenant: its reads name one (``?tenant=``). Each path is one
:class:`~gateway.api.dispatch.Resource`: OPTIONS and 405 list all its methods.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute

from rutster.gateway.admission import REASON_DRAINING, Refused, admit_call
from rutster.gateway.api.api_keys import (
    KeyStoreUnavailable,
    Principal,
)
from rutster.gateway.api.api_keys import authenticate as authenticate_header
from rutster.gateway.api.dispatch import allow_header, resource
from rutster.gateway.api.errors import (
    ApiError,
    conflict,
    error_response,
    forbidden,
    invalid_request,
    method_not_allowed,
    not_found,
    provider_error,
    rate_limited,
    refused,
    unavailable,
)
from rutster.gateway.api.openapi import build_openapi
from rutster.gateway.api.rate_limit import RateLimiterUnavailable
from rutster.gateway.api.schemas import (
    CALL_ID_PATTERN,
    CREATE_KEY_SCHEMA,
    KILL_SWITCH_SCHEMA,
    TENANT_LIMITS_SCHEMA,
)
from rutster.gateway.api.validation import (
    MAX_BODY_BYTES,
    check_path_param,
    parse_calls_query,
    parse_create_call_body,
    parse_json_body,
    parse_spend_query,
    read_body,
    require_json_content_type,
)
from rutster.gateway.control_channel import OPERATION_HANGUP, ControlOutcome
from rutster.gateway.ingress_provider import DialFailed
from rutster.gateway.overload_guard import REASON_NODE_FULL, REASON_NODE_OVERLOADED
from rutster.gateway.state import GatewayState
from rutster.protocols.call_control import CallControlFailure
from rutster.protocols.tap import SessionEndReason
from rutster.spend.gate import AdmissionRequest, new_call_id, wall_ms
from rutster.spend.limits import LimitsError, TenantLimits
from rutster.spend.money import format_money, parse_money
from rutster.spend.store import CallRecord, SpendTotals, StoreUnavailable, time_buckets
from rutster.spend.tenant_id import TENANT_ID_PATTERN

log = logging.getLogger(__name__)

#: Money fields in limits (decimal USD strings in the API, micros inside).
MONEY_LIMITS = frozenset({"budget_day", "budget_month", "max_call_cost"})

Handler = Callable[[Request], Awaitable[Response]]


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def iso_time(ms: int | str | None) -> str | None:
    """Unix ms (an int, or a Redis field's text) as RFC 3339 UTC; None if absent or bad."""
    if ms is None or ms == "":
        return None
    try:
        moment = datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


async def authenticate(request: Request) -> Principal:
    """Who is calling (401 if nobody we know), after the per-key rate limit (429)."""
    state = _state(request)
    assert state.api_keys is not None
    try:
        principal = await authenticate_header(
            request.headers.get("authorization"), keys=state.api_keys, admin_key=state.admin_key
        )
    except ApiError:
        state.metrics.api_auth_failures.inc()
        raise
    assert state.rate_limiter is not None
    decision = await state.rate_limiter.check(principal.key_id, wall_ms())
    if not decision.allowed:
        state.metrics.api_rate_limited.inc()
        raise rate_limited(decision.retry_after_s)
    return principal


def api_endpoint(handler: Callable[[Request, Principal], Awaitable[Response]]) -> Handler:
    """Wrap a handler: authentication, and every failure as a JSON error of one shape."""

    async def endpoint(request: Request) -> Response:
        try:
            principal = await authenticate(request)
            return await handler(request, principal)
        except ApiError as exc:
            return error_response(exc)
        except (StoreUnavailable, KeyStoreUnavailable, RateLimiterUnavailable):
            _state(request).metrics.api_store_unavailable.inc()
            return error_response(unavailable())

    endpoint.__name__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    return endpoint


async def _body(request: Request) -> bytes:
    """The request body after a JSON content-type check (413 beyond the cap)."""
    require_json_content_type(request.headers.get("content-type"))
    return await read_body(request, max_bytes=MAX_BODY_BYTES)


def _tenant_of(principal: Principal) -> str:
    if principal.tenant is None:
        raise forbidden("this endpoint acts for one tenant: use that tenant's API key")
    return principal.tenant


def _acting_tenant(principal: Principal, named: str | None) -> str:
    """The tenant a read acts for: the one named by ``?tenant=``, else the key's own.

    403 (``field: tenant``) for a tenant key naming another tenant, and for the
    operator's admin key naming none: it has no tenant of its own (an admin-role
    key issued through the API has one).
    """
    if named is not None:
        if not principal.may_see_tenant(named):
            raise forbidden(f"this key may not see tenant {named}", "tenant")
        return named
    if principal.tenant is None:
        raise forbidden("this key has no tenant of its own: name one with ?tenant=<id>", "tenant")
    return principal.tenant


def call_status(record: CallRecord) -> str:
    """The API status of a stored call."""
    status = record["status"]
    if status == "active":
        return "in_progress"
    if status == "refused":
        return "refused"
    if status == "ended":
        return "failed" if record["end_reason"] in FAILED_END_REASONS else "ended"
    return "ringing" if record["provider_call_id"] else "queued"


#: End reasons of calls that never connected (Twilio's final statuses for them).
FAILED_END_REASONS = frozenset({"failed", "busy", "no_answer", "canceled", "provider_error"})


def call_resource(
    state: GatewayState, record: CallRecord, *, live_cost: int | None = None
) -> dict[str, Any]:
    """The API's call resource for a stored call (its provider named through the registry)."""
    outbound = record["direction"] == "outbound"
    return {
        "id": record["id"],
        "tenant": record["tenant"],
        "status": call_status(record),
        "direction": "outbound" if outbound else "inbound",
        "provider": state.providers.label(record["provider"]),
        "from": record["caller"],
        "to": record["to"],
        "brain": record["brain"] or None,
        "campaign": record["campaign"] or None,
        "created_at": iso_time(record["created_ms"]),
        "answered_at": iso_time(record["answered_ms"]),
        "ended_at": iso_time(record["ended_ms"]),
        "end_reason": record["end_reason"],
        "limits": {
            "max_duration_s": record["max_duration_s"],
            "max_cost": format_money(record["max_cost"]),
        },
        "spend": {
            "reserved": format_money(record["reserved"]),
            "cost": format_money(live_cost if live_cost is not None else record["cost"]),
            "settled": None if record["spent"] is None else format_money(record["spent"]),
            "currency": "USD",
        },
        "metadata": record["metadata"],
    }


def live_cost(state: GatewayState, call_id: str) -> int | None:
    """What a call this process holds would settle at now (None elsewhere): its running
    cost, never above its reservation (``CallMeter.settlement``)."""
    call = state.calls_by_id.get(call_id)
    if call is None or call.spend is None:
        return None
    return call.spend.meter.settlement(round(call.clock_ms()))


async def _own_call(request: Request, principal: Principal) -> CallRecord:
    state = _state(request)
    call_id = check_path_param("id", request.path_params["id"], CALL_ID_PATTERN)
    assert state.spend_store is not None
    record = await state.spend_store.get_call(call_id)
    if record is None or not principal.may_see_tenant(record["tenant"]):
        raise not_found(f"no call {call_id}")
    return record


# ---- /v1/calls --------------------------------------------------------------------------


async def create_call(request: Request, principal: Principal) -> Response:
    """``POST /v1/calls``: admit through the spend gate, then dial through the provider."""
    state = _state(request)
    tenant = _tenant_of(principal)
    body = parse_create_call_body(await _body(request))
    settings = state.config.spend
    provider = state.providers.get(body["provider"])
    if provider is None or not provider.capabilities.outbound:
        # The schema's enum is the registry's outbound providers: only a registry that
        # changed under a running app gets here.
        raise invalid_request(f"provider {body['provider']!r} cannot place calls", "provider")
    unavailable_reason = provider.outbound_unavailable(state)
    if unavailable_reason is not None:
        raise conflict(unavailable_reason)
    brain = body.get("brain")
    if brain is None:
        tap_url = state.config.tap_url
    elif "://" in brain:
        if not state.config.tap_allowlist.allows(brain):
            raise invalid_request("brain URL is not on the gateway's allowlist", "brain")
        tap_url = brain
    else:
        if brain not in settings.brains:
            raise invalid_request(f"no brain named {brain!r} is configured", "brain")
        tap_url = settings.brains[brain]
    limits = body.get("limits", {})
    admitted = await admit_call(
        state,
        AdmissionRequest(
            tenant=tenant,
            provider=provider.name,
            direction="outbound",
            caller=body["from"],
            to=body["to"],
            brain=tap_url,
            campaign=body.get("campaign", ""),
            max_duration_s=limits.get("max_duration_s"),
            max_cost=parse_money(limits["max_cost"]) if "max_cost" in limits else None,
            metadata=body.get("metadata", {}),
            call_id=new_call_id(),
        ),
    )
    if isinstance(admitted, Refused):
        if admitted.reason == REASON_DRAINING:
            raise unavailable("this gateway is draining (stopping); place the call on another")
        if admitted.reason in (REASON_NODE_FULL, REASON_NODE_OVERLOADED):
            raise unavailable(
                f"this gateway cannot carry another call now ({admitted.reason}); "
                "try again shortly or place the call on another"
            )
        raise refused(admitted.reason, f"the spend gate refused the call: {admitted.reason}")
    if admitted.degraded:
        # Fail-open admission with Redis down: nothing to read the call back from.
        raise unavailable()
    gate, store = state.spend_gate, state.spend_store
    assert gate is not None and store is not None
    try:
        provider_call_id = await provider.dial(
            state, admitted, to=body["to"], from_=body["from"], tap_url=tap_url
        )
    except DialFailed as exc:
        await gate.settle_unanswered(admitted.call_id, "provider_error")
        return error_response(provider_error(str(exc)))
    await store.update_call(admitted.call_id, provider_call_id=provider_call_id)
    record = await store.get_call(admitted.call_id)
    if record is None:  # pragma: no cover - just written; only a flush of Redis loses it
        raise unavailable()
    return JSONResponse(call_resource(state, record), status_code=201)


async def list_calls(request: Request, principal: Principal) -> Response:
    """``GET /v1/calls``: the tenant's calls, newest first, paginated."""
    state = _state(request)
    query = parse_calls_query(request.query_params.multi_items())
    tenant = _acting_tenant(principal, query.tenant)
    assert state.spend_store is not None
    try:
        records, cursor = await state.spend_store.list_calls(
            tenant, status=_store_status(query.status), cursor=query.cursor, limit=query.limit
        )
    except ValueError:
        raise invalid_request("cursor is not one this API issued", "cursor") from None
    data = [
        call_resource(state, r, live_cost=live_cost(state, r["id"]))
        for r in records
        if query.status is None or call_status(r) == query.status
    ]
    return JSONResponse({"data": data, "next_cursor": cursor})


def _store_status(status: str | None) -> str | None:
    """The stored status holding API status ``status`` (queued and ringing share one)."""
    return {
        None: None,
        "queued": "admitted",
        "ringing": "admitted",
        "in_progress": "active",
        "ended": "ended",
        "failed": "ended",
        "refused": "refused",
    }[status]


async def get_call(request: Request, principal: Principal) -> Response:
    """``GET /v1/calls/{id}``: status, timings, spend so far and receipts."""
    state = _state(request)
    record = await _own_call(request, principal)
    assert state.spend_store is not None
    resource = call_resource(state, record, live_cost=live_cost(state, record["id"]))
    resource["receipts"] = await state.spend_store.receipts(record["id"])
    return JSONResponse(resource)


async def delete_call(request: Request, principal: Principal) -> Response:
    """``DELETE /v1/calls/{id}``: hang up (``session_end{api_hangup}`` to the brain)."""
    state = _state(request)
    record = await _own_call(request, principal)
    status = call_status(record)
    if status in ("ended", "failed", "refused"):
        raise conflict(f"call {record['id']} has already ended")
    local = state.calls_by_id.get(record["id"])
    if local is not None:
        state.run_in_background(
            hang_up_local_call(state, record["id"]), name=f"{record['id']}:api-hangup"
        )
    elif status == "in_progress":
        await _hang_up_remote_call(state, record)
    elif not await _cancel_unanswered(state, record):
        # Its media started (on some node) while it was being cancelled: hang it up there.
        assert state.spend_store is not None
        connected = await state.spend_store.get_call(record["id"])
        if connected is not None and call_status(connected) == "in_progress":
            await _hang_up_remote_call(state, connected)
    return JSONResponse(call_resource(state, record), status_code=202)


async def _hang_up_remote_call(state: GatewayState, record: CallRecord) -> None:
    """Ask the node that holds the call's media (the record's ``node``) to hang it up,
    and wait for its answer (gateway/control_channel.py)."""
    if record["node"] == state.config.spend.node_id:
        await hang_up_local_call(state, record["id"])
        return
    assert state.control_channel is not None
    try:
        reply = await state.control_channel.request(record["node"], OPERATION_HANGUP, record["id"])
    except StoreUnavailable:
        raise unavailable() from None
    outcome = reply.outcome
    if outcome is ControlOutcome.DONE:
        return
    if outcome is ControlOutcome.NOT_HERE:
        # Ended meanwhile (fine), or the record names a node that no longer holds it.
        assert state.spend_store is not None
        now = await state.spend_store.get_call(record["id"])
        if now is None or call_status(now) in ("ended", "failed", "refused"):
            return
    log.warning(
        "call %s: hang-up request to node %s: %s", record["id"], record["node"], outcome.value
    )
    raise unavailable("the gateway holding this call did not confirm the hang-up; retry")


async def hang_up_local_call(state: GatewayState, call_id: str) -> None:
    """End a call this process holds: tell the brain, then end the provider leg."""
    call = state.calls_by_id.get(call_id)
    if call is None:
        return
    log.info("call %s: hang-up requested through the API", call.session_id)
    call.bus.publish("call", "api_hangup", {})
    await call.end(SessionEndReason.API_HANGUP)
    await call.hang_up_provider(reason="api_hangup")


async def _cancel_unanswered(state: GatewayState, record: CallRecord) -> bool:
    """Cancel a call not connected yet and settle it at zero; False if it connected
    meanwhile (then it is left running: see ``SpendGate.settle_unanswered``)."""
    provider = state.providers.get(record["provider"])
    if provider is not None:
        try:
            await provider.cancel(state, record)
        except CallControlFailure as exc:
            raise provider_error(
                f"{provider.name} did not cancel the call ({exc.reason})"
            ) from None
    assert state.spend_gate is not None
    return await state.spend_gate.settle_unanswered(record["id"], "canceled")


# ---- /v1/spend, limits, admin ------------------------------------------------------------


async def get_spend(request: Request, principal: Principal) -> Response:
    """``GET /v1/spend``: today's and this month's totals against budgets, by day and hour."""
    state = _state(request)
    query = parse_spend_query(request.query_params.multi_items())
    tenant = _acting_tenant(principal, query.tenant)
    body = await tenant_spend(state, tenant, days=query.days)
    return JSONResponse(body)


async def tenant_spend(state: GatewayState, tenant: str, *, days: int) -> dict[str, Any]:
    """The ``Spend`` resource of ``tenant`` over the last ``days`` days and 24 hours.

    Budgets are the enforced ones: the tenant's stored limits, else the
    gateway's defaults (read without storing them).
    """
    store = state.spend_store
    assert store is not None
    now = datetime.now(UTC)
    day_list = [(now - timedelta(days=n)).strftime("%Y%m%d") for n in range(days - 1, -1, -1)]
    hour_list = [(now - timedelta(hours=n)).strftime("%Y%m%d%H") for n in range(23, -1, -1)]
    today, month, _ = time_buckets(wall_ms())
    spend = await store.tenant_spend(tenant, days=day_list, months=[month], hours=hour_list)
    limits = await tenant_limits(state, tenant)
    return {
        "tenant": tenant,
        "currency": "USD",
        "today": _period(spend["days"].get(today), limits.budget_day),
        "month": _period(spend["months"].get(month), limits.budget_month),
        "by_day": [
            {
                "day": f"{d[:4]}-{d[4:6]}-{d[6:]}",
                "spent": format_money(spend["days"].get(d, {"spent": 0})["spent"]),
            }
            for d in day_list
        ],
        "by_hour": [
            {
                "hour": f"{h[:4]}-{h[4:6]}-{h[6:8]}T{h[8:]}:00:00Z",
                "spent": format_money(spend["hours"].get(h, 0)),
            }
            for h in hour_list
        ],
    }


def _period(totals: SpendTotals | None, budget: int) -> dict[str, Any]:
    spent = totals["spent"] if totals else 0
    reserved = totals["reserved"] if totals else 0
    return {
        "spent": format_money(spent),
        "reserved": format_money(reserved),
        "budget": format_money(budget) if budget else None,
        "left": format_money(max(0, budget - spent - reserved)) if budget else None,
    }


async def tenant_limits(state: GatewayState, tenant: str) -> TenantLimits:
    """The limits admission enforces for ``tenant`` (stored, else defaults), without a write."""
    assert state.spend_store is not None and state.spend_gate is not None
    return await state.spend_store.effective_tenant_limits(
        tenant, state.spend_gate.policy.default_limits
    )


def limits_resource(tenant: str, limits: TenantLimits) -> dict[str, Any]:
    """The ``TenantLimits`` resource."""
    out: dict[str, Any] = {"tenant": tenant}
    for name, value in limits.as_dict().items():
        out[name] = format_money(value) if name in MONEY_LIMITS else value
    return out


async def get_limits(request: Request, principal: Principal) -> Response:
    """``GET /v1/tenants/{id}/limits`` (admin, or that tenant): the enforced limits."""
    state = _state(request)
    tenant = check_path_param("id", request.path_params["id"], TENANT_ID_PATTERN)
    if not principal.may_see_tenant(tenant):
        raise forbidden(f"this key may not see tenant {tenant}", "id")
    return JSONResponse(limits_resource(tenant, await tenant_limits(state, tenant)))


async def put_limits(request: Request, principal: Principal) -> Response:
    """``PUT /v1/tenants/{id}/limits`` (admin): change some or all of a tenant's limits."""
    state = _state(request)
    if not principal.is_admin:
        raise forbidden("only an admin key may change limits")
    tenant = check_path_param("id", request.path_params["id"], TENANT_ID_PATTERN)
    body = parse_json_body(await _body(request), TENANT_LIMITS_SCHEMA)
    changes = {
        name: parse_money(value) if name in MONEY_LIMITS else value for name, value in body.items()
    }
    assert state.spend_store is not None
    current = await tenant_limits(state, tenant)
    try:
        updated = current.merged(changes)
    except LimitsError as exc:
        raise invalid_request(str(exc), exc.field) from None
    await state.spend_store.set_tenant_limits(tenant, updated)
    log.info("limits of tenant %s changed by %s: %s", tenant, principal.key_id[:12], sorted(body))
    return JSONResponse(limits_resource(tenant, updated))


async def create_key(request: Request, principal: Principal) -> Response:
    """``POST /v1/admin/keys`` (admin): issue an API key; it is shown only in this answer."""
    state = _state(request)
    if not principal.is_admin:
        raise forbidden("only an admin key may create keys")
    body = parse_json_body(await _body(request), CREATE_KEY_SCHEMA)
    assert state.api_keys is not None
    issued = await state.api_keys.create(
        body["tenant"], body.get("role", "tenant"), body.get("label"), now_ms=wall_ms()
    )
    log.info("API key %s… issued for tenant %s", issued.key_hash[:12], issued.tenant)
    return JSONResponse(
        {"key": issued.key, "tenant": issued.tenant, "role": issued.role, "label": issued.label},
        status_code=201,
    )


async def get_kill_switch(request: Request, principal: Principal) -> Response:
    """``GET /v1/admin/kill-switch``."""
    state = _state(request)
    if not principal.is_admin:
        raise forbidden("only an admin key may read the kill switch")
    assert state.spend_store is not None
    return JSONResponse({"engaged": (await state.spend_store.get_global()).killed})


async def put_kill_switch(request: Request, principal: Principal) -> Response:
    """``PUT /v1/admin/kill-switch`` (admin): engaged = no new call is admitted."""
    state = _state(request)
    if not principal.is_admin:
        raise forbidden("only an admin key may use the kill switch")
    body = parse_json_body(await _body(request), KILL_SWITCH_SCHEMA)
    assert state.spend_store is not None
    await state.spend_store.set_kill_switch(body["engaged"])
    log.warning(
        "kill switch %s by %s", "ENGAGED" if body["engaged"] else "released", principal.key_id[:12]
    )
    return JSONResponse({"engaged": body["engaged"]})


async def openapi_document(request: Request) -> Response:
    """``GET /v1/openapi.json`` (no auth): the API's OpenAPI 3.1 description."""
    state = _state(request)
    return JSONResponse(build_openapi(state.config.public_url))


def unrouted(request: Request, exc: Exception) -> Response:
    """404/405 under ``/v1`` in the API's JSON error shape (elsewhere: Starlette's text).

    A 405 here comes from a plain single-route ``/v1`` path (the dashboard feed):
    OPTIONS is answered 204 there too, and ``Allow`` lists OPTIONS with the route's
    methods, as on every :class:`~gateway.api.dispatch.Resource`.
    """
    status = getattr(exc, "status_code", 404)
    if not request.url.path.startswith("/v1/"):
        return PlainTextResponse(getattr(exc, "detail", "Not Found"), status_code=status)
    if status == 405:
        routed = (getattr(exc, "headers", None) or {}).get("Allow", "")
        allow = allow_header(m.strip() for m in routed.split(",") if m.strip())
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": allow})
        return error_response(method_not_allowed(request.method, request.url.path, allow))
    return error_response(not_found(f"no API endpoint {request.url.path[:100]}"))


def api_routes() -> list[BaseRoute]:
    """Every ``/v1`` route: one per path, holding all of the path's methods."""
    return [
        resource("/v1/openapi.json", {"GET": openapi_document}),
        resource("/v1/calls", {"POST": api_endpoint(create_call), "GET": api_endpoint(list_calls)}),
        resource(
            "/v1/calls/{id}",
            {"GET": api_endpoint(get_call), "DELETE": api_endpoint(delete_call)},
        ),
        resource("/v1/spend", {"GET": api_endpoint(get_spend)}),
        resource(
            "/v1/tenants/{id}/limits",
            {"GET": api_endpoint(get_limits), "PUT": api_endpoint(put_limits)},
        ),
        resource("/v1/admin/keys", {"POST": api_endpoint(create_key)}),
        resource(
            "/v1/admin/kill-switch",
            {"GET": api_endpoint(get_kill_switch), "PUT": api_endpoint(put_kill_switch)},
        ),
    ]
