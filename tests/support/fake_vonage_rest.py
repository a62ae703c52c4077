"""A FAKE Vonage Voice API, for tests (a test double, never shipped). It is not Vonage.

:class:`FakeVonageRest` serves, on a loopback port, as docs/PROVIDERS.md §3.5
describes them, with an application JWT (RS256, checked against the public key the
test gives, and its ``application_id``; ``401`` otherwise):

- ``POST /v1/calls``: place a call; a ``uuid`` comes back, and
  :attr:`FakeVonageRest.on_answer`, when set, plays the callee;
- ``PUT /v1/calls/{uuid}`` with ``{"action": "hangup"}`` or ``"transfer"``: ``204`` when
  a live call was hung up or moved away, ``404`` when it is over or unknown.

Calls are registered by the test (or created); hanging one up sets its event. Every
request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import jwt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.loopback_app import serve_on_loopback


@dataclass
class FakeVonageRest:
    """The fake's state: the key and application it trusts, calls, requests."""

    public_key_pem: str
    application_id: str
    calls: dict[str, asyncio.Event] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, object]]] = field(default_factory=list)
    base_url: str = ""

    #: Plays the callee of a placed call: ``(uuid, answer URL, ended event)``.
    on_answer: Callable[[str, str, asyncio.Event], Coroutine[Any, Any, object]] | None = None
    _answers: set[asyncio.Task[object]] = field(default_factory=set)

    def _authorized(self, request: Request) -> bool:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        try:
            claims = jwt.decode(token, self.public_key_pem, algorithms=["RS256"])
        except jwt.InvalidTokenError:
            return False
        return bool(claims.get("application_id") == self.application_id)

    async def _create(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        self.requests.append((request.method, request.url.path, body or {}))
        if not self._authorized(request):
            return JSONResponse({"title": "Unauthorized"}, 401)
        if not isinstance(body, dict) or not body.get("to") or not body.get("answer_url"):
            return JSONResponse({"title": "Bad Request"}, 400)
        call_uuid = str(uuid.uuid4())
        ended = self.register_call(call_uuid)
        if self.on_answer is not None:
            task = asyncio.create_task(self.on_answer(call_uuid, body["answer_url"][0], ended))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)
        created = {"uuid": call_uuid, "status": "started", "direction": "outbound"}
        return JSONResponse(created | {"conversation_uuid": "CON-" + call_uuid}, 201)

    def register_call(self, call_uuid: str) -> asyncio.Event:
        """A live call; its event is set when it is hung up here."""
        event = asyncio.Event()
        self.calls[call_uuid] = event
        return event

    async def _call(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        self.requests.append((request.method, request.url.path, body or {}))
        if not self._authorized(request):
            return JSONResponse({"title": "Unauthorized"}, 401)
        ended = self.calls.get(request.path_params["uuid"])
        action = body.get("action") if isinstance(body, dict) else None
        if action not in ("hangup", "transfer") or ended is None or ended.is_set():
            return JSONResponse({"title": "Not Found"}, 404)
        ended.set()
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/calls", self._create, methods=["POST"]),
                Route("/v1/calls/{uuid}", self._call, methods=["PUT"]),
            ]
        )


@contextlib.asynccontextmanager
async def serve_fake_vonage(
    public_key_pem: str, application_id: str
) -> AsyncIterator[FakeVonageRest]:
    """Run a :class:`FakeVonageRest` on a free loopback port until the block exits."""
    fake = FakeVonageRest(public_key_pem, application_id)
    async with serve_on_loopback(fake.app()) as base_url:
        fake.base_url = base_url
        try:
            yield fake
        finally:
            for answer in list(fake._answers):
                answer.cancel()
