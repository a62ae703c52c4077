"""The spend dashboard: its page and its live feed (server-sent events).

``GET /dashboard`` serves the static page (:mod:`gateway.dashboard`); the page
asks for an API key and reads ``GET /v1/dashboard/events``, an SSE stream that
pushes a snapshot every :data:`DASHBOARD_PUSH_S`: active calls with their
spend so far, each visible tenant's spend against its budgets with the last
24 hours, recent refusals and budget-ended calls, and the kill switch. An
admin key sees every tenant; a tenant key sees only its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from rutster.gateway.api.api_keys import (
    ADMIN_ENV_KEY_ID,
    KeyStoreUnavailable,
    Principal,
    parse_bearer,
)
from rutster.gateway.api.errors import ApiError, error_response, unavailable
from rutster.gateway.api.rate_limit import RateLimiterUnavailable
from rutster.gateway.api.routes import authenticate, call_status, iso_time, live_cost, tenant_spend
from rutster.gateway.dashboard import STATIC_DIR
from rutster.gateway.state import GatewayState
from rutster.spend.gate import wall_ms
from rutster.spend.money import format_money
from rutster.spend.store import CallRecord, StoreUnavailable

log = logging.getLogger(__name__)

#: How often a snapshot is pushed. Seed decision: "live" to a person watching.
DASHBOARD_PUSH_S = 1.0
#: How often a live feed checks that its key still exists (a revoked key's feed ends).
#: Seed decision: revocation takes effect within half a minute on open dashboards.
KEY_RECHECK_S = 30.0
#: Recent refusals / ended calls shown.
RECENT_ITEMS = 10
#: Tenants shown to an admin (the most recently active first is not tracked, so the
#: first N by id). Seed decision: a dashboard, not a report.
MAX_TENANTS_SHOWN = 20
#: Content Security Policy of the page: everything from this origin, nothing else
#: (the page is tested under exactly this policy).
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def _active_call(state: GatewayState, record: CallRecord, now_ms: int) -> dict[str, Any]:
    local = state.calls_by_id.get(record["id"])
    cost = live_cost(state, record["id"])
    reflex_state = local.reflex.state.value if local is not None else None
    since = record["answered_ms"] or record["created_ms"]
    return {
        "id": record["id"],
        "tenant": record["tenant"],
        "provider": record["provider"],
        "direction": record["direction"],
        "brain": record["brain"],
        "state": reflex_state or call_status(record),
        "duration_s": round(max(0, now_ms - since) / 1000, 1),
        "spend": format_money(record["cost"] if cost is None else cost),
        "reserved": format_money(record["reserved"]),
    }


async def snapshot(state: GatewayState, principal: Principal) -> dict[str, Any]:
    """One dashboard snapshot for ``principal`` (see the module docstring)."""
    store = state.spend_store
    assert store is not None
    now = wall_ms()
    only = None if principal.is_admin else principal.tenant
    records = await store.active_calls(only)
    if principal.is_admin:
        tenants = sorted(await store.tenants())[:MAX_TENANTS_SHOWN]
    else:
        tenants = [principal.tenant] if principal.tenant else []
    tenant_cards = []
    for tenant in tenants:
        spend = await tenant_spend(state, tenant, days=1)
        tenant_cards.append(
            {
                "id": tenant,
                "today": {k: spend["today"][k] for k in ("spent", "reserved", "budget")},
                "month": {k: spend["month"][k] for k in ("spent", "reserved", "budget")},
                "by_hour": spend["by_hour"],
            }
        )
    refusals = [
        {
            "at": iso_time(r.get("at")),
            "tenant": r.get("tenant"),
            "reason": r.get("reason"),
            "caller": r.get("caller") or None,
        }
        for r in await store.recent_refusals(RECENT_ITEMS * 5)
        if only is None or r.get("tenant") == only
    ][:RECENT_ITEMS]
    ended = [
        {
            "at": iso_time(r.get("at")),
            "id": r.get("call"),
            "tenant": r.get("tenant"),
            "reason": r.get("reason"),
            "spent": format_money(int(r.get("spent", "0") or 0)),
        }
        for r in await store.recent_ended(RECENT_ITEMS * 5)
        if only is None or r.get("tenant") == only
    ][:RECENT_ITEMS]
    return {
        "at": iso_time(now),
        "role": "admin" if principal.is_admin else "tenant",
        "tenant": principal.tenant,
        "kill_switch": (await store.get_global()).killed,
        "active_calls": [_active_call(state, r, now) for r in records],
        "tenants": tenant_cards,
        "recent_refusals": refusals,
        "recent_ended": ended,
    }


async def _events(state: GatewayState, principal: Principal, key: str) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    checked = loop.time()
    while True:
        try:
            if principal.key_id != ADMIN_ENV_KEY_ID and loop.time() - checked >= KEY_RECHECK_S:
                checked = loop.time()
                assert state.api_keys is not None
                if await state.api_keys.lookup(key) is None:
                    yield "event: revoked\ndata: {}\n\n"
                    return
            body = await snapshot(state, principal)
        except StoreUnavailable:
            # The page keeps its last snapshot and shows it is not live.
            yield ": redis unavailable\n\n"
        else:
            yield f"event: snapshot\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"
        await asyncio.sleep(DASHBOARD_PUSH_S)


async def dashboard_events(request: Request) -> Response:
    """``GET /v1/dashboard/events``: the live SSE feed (Bearer auth, like the API)."""
    state: GatewayState = request.app.state.gateway
    try:
        principal = await authenticate(request)
    except ApiError as exc:
        return error_response(exc)
    except (StoreUnavailable, KeyStoreUnavailable, RateLimiterUnavailable):
        return error_response(unavailable())
    key = parse_bearer(request.headers.get("authorization")) or ""
    return StreamingResponse(
        _events(state, principal, key),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def dashboard_page(request: Request) -> Response:
    """``GET /dashboard``: the page (it holds no data; the feed needs a key)."""
    response = FileResponse(STATIC_DIR / "index.html", media_type="text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    response.headers["Cache-Control"] = "no-store"
    return response


def dashboard_routes() -> list[BaseRoute]:
    """The page, its static files and its feed."""
    return [
        Route("/dashboard", dashboard_page, methods=["GET"]),
        Mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static"),
        Route("/v1/dashboard/events", dashboard_events, methods=["GET"]),
    ]
