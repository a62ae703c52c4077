"""The dashboard's live feed over HTTP (the browser tests drive the page itself)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import rutster.gateway.dashboard_feed as feed
from rutster.gateway.api.api_keys import hash_key
from tests.conftest import TEST_ADMIN_KEY, gateway_config, serve_gateway, spend_settings


async def _key(client: httpx.AsyncClient, tenant: str) -> str:
    response = await client.post(
        "/v1/admin/keys",
        json={"tenant": tenant},
        headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"},
    )
    assert response.status_code == 201
    key: str = response.json()["key"]
    return key


async def _events(lines: AsyncIterator[str], wanted: int) -> list[tuple[str, Any]]:
    """Read SSE events (type, parsed data) until ``wanted`` arrived or the stream ends."""
    events: list[tuple[str, Any]] = []
    kind, data = "message", ""
    async for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and data:
            events.append((kind, json.loads(data)))
            kind, data = "message", ""
            if len(events) >= wanted:
                break
    return events


async def test_the_feed_needs_a_key_and_scopes_the_snapshot(echo_brain: Any) -> None:
    config = gateway_config(echo_brain.url, barge_in=False, spend=spend_settings())
    async with (
        serve_gateway(config) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=10) as client,
    ):
        anonymous = await client.get("/v1/dashboard/events")
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "unauthorized"
        page = await client.get("/dashboard")
        assert (
            page.status_code == 200
            and "default-src 'self'" in page.headers["content-security-policy"]
        )
        key = await _key(client, "acme")
        async with client.stream(
            "GET", "/v1/dashboard/events", headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            ((kind, snapshot),) = await _events(response.aiter_lines(), 1)
        assert kind == "snapshot"
        assert snapshot["role"] == "tenant" and snapshot["tenant"] == "acme"
        assert [t["id"] for t in snapshot["tenants"]] == ["acme"]
        assert snapshot["active_calls"] == [] and snapshot["kill_switch"] is False
        async with client.stream(
            "GET", "/v1/dashboard/events", headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
        ) as response:
            ((_, snapshot),) = await _events(response.aiter_lines(), 1)
        assert snapshot["role"] == "admin" and snapshot["tenant"] is None


async def test_a_revoked_key_loses_its_feed(
    echo_brain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed, "KEY_RECHECK_S", 0.0)
    monkeypatch.setattr(feed, "DASHBOARD_PUSH_S", 0.05)
    config = gateway_config(echo_brain.url, barge_in=False, spend=spend_settings())
    async with (
        serve_gateway(config) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=10) as client,
    ):
        key = await _key(client, "acme")
        async with client.stream(
            "GET", "/v1/dashboard/events", headers={"Authorization": f"Bearer {key}"}
        ) as response:
            lines = response.aiter_lines()
            events = await _events(lines, 2)
            assert [kind for kind, _ in events] == ["snapshot", "snapshot"]
            keys = gateway.state.api_keys
            assert keys is not None and await keys.revoke(hash_key(key))
            rest = await _events(lines, 100)  # ends by itself
        assert rest and rest[-1][0] == "revoked"
