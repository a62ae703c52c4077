"""A FAKE Plivo REST API, for tests (a test double, never shipped). It is not Plivo.

:class:`FakePlivoRest` serves ``DELETE /v1/Account/{auth_id}/Call/{call_uuid}/`` on a
loopback port as docs/PROVIDERS.md §4.4 describes it: HTTP Basic
``auth_id:auth_token``, ``204`` when a live call was hung up, ``404`` when it is
over or unknown, ``401`` for wrong credentials. Calls are registered by the test;
hanging one up sets its event, so a simulated Plivo stream stops as Plivo's would.
Every request is recorded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.loopback_app import serve_on_loopback

#: The credentials the fake accepts.
FAKE_AUTH_ID = "MAFAKE0123456789ABCD"
FAKE_AUTH_TOKEN = "fake-plivo-token-0123456789"


@dataclass
class PlivoRequest:
    """One request the fake got."""

    method: str
    path: str
    authorization: str | None


@dataclass
class FakePlivoRest:
    """The fake's state: registered calls (``CallUUID`` → hung-up event), requests."""

    calls: dict[str, asyncio.Event] = field(default_factory=dict)
    requests: list[PlivoRequest] = field(default_factory=list)
    base_url: str = ""

    def register_call(self, call_uuid: str) -> asyncio.Event:
        """A live call; its event is set when it is hung up here."""
        event = asyncio.Event()
        self.calls[call_uuid] = event
        return event

    async def _call(self, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        self.requests.append(PlivoRequest(request.method, request.url.path, authorization))
        expected = base64.b64encode(f"{FAKE_AUTH_ID}:{FAKE_AUTH_TOKEN}".encode()).decode()
        if authorization != f"Basic {expected}" or request.path_params["auth_id"] != FAKE_AUTH_ID:
            return JSONResponse({"error": "authentication failed"}, 401)
        ended = self.calls.get(request.path_params["call_uuid"])
        if ended is None or ended.is_set():
            return JSONResponse({"error": "not found"}, 404)
        ended.set()
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/Account/{auth_id}/Call/{call_uuid}/", self._call, methods=["DELETE"])
            ]
        )


@contextlib.asynccontextmanager
async def serve_fake_plivo() -> AsyncIterator[FakePlivoRest]:
    """Run a :class:`FakePlivoRest` on a free loopback port until the block exits."""
    fake = FakePlivoRest()
    async with serve_on_loopback(fake.app()) as base_url:
        fake.base_url = base_url
        yield fake
