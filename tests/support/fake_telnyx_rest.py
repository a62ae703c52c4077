"""A FAKE Telnyx Call Control API, for tests (a test double, never shipped). It is not Telnyx.

:class:`FakeTelnyxRest` serves, on a loopback port, shaped as docs/PROVIDERS.md §2.1
and the Telnyx SDK describe them:

- ``POST /v2/calls/{call_control_id}/actions/{hangup,transfer}``: Bearer
  authentication, JSON bodies, ``{"data": {"result": "ok"}}`` on success, ``422``
  with ``{"errors": [{"code": "90018", ...}]}`` for a call that has already ended,
  ``401`` for a wrong key;
- ``POST /v2/texml/calls/{connection_id}``: place a TeXML call; the answer is a flat
  call object whose ``call_sid`` is the call's ``call_control_id``, and
  :attr:`FakeTelnyxRest.on_answer`, when set, plays the callee.

Calls are registered by the test (or created); a hang-up or transfer ends one and
sets its event, so a simulated Telnyx stream stops as Telnyx's would. Every
request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rutster.tools.telnyx_simulator import new_call_control_id
from tests.support.loopback_app import serve_on_loopback

#: The key the fake accepts.
FAKE_API_KEY = "KEYfake0123456789"


@dataclass
class RecordedRequest:
    """One request the fake got."""

    method: str
    path: str
    authorization: str | None
    body: dict[str, Any]


@dataclass
class FakeTelnyxRest:
    """The fake's state: registered calls (``call_control_id`` → ended event), requests."""

    calls: dict[str, asyncio.Event] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    base_url: str = ""
    #: Plays the callee of a placed call: ``(call_control_id, Url, ended event)``.
    on_answer: Callable[[str, str, asyncio.Event], Coroutine[Any, Any, object]] | None = None
    _answers: set[asyncio.Task[object]] = field(default_factory=set)

    async def _create(self, request: Request) -> Response:
        body = await self._record(request)
        if request.headers.get("authorization") != f"Bearer {FAKE_API_KEY}":
            return JSONResponse({"errors": [{"code": "10009", "title": "Authentication"}]}, 401)
        if not all(isinstance(body.get(k), str) and body[k] for k in ("From", "To", "Url")):
            return JSONResponse({"errors": [{"code": "10015", "title": "Bad request"}]}, 422)
        call_control_id = new_call_control_id()
        ended = self.register_call(call_control_id)
        if self.on_answer is not None:
            task = asyncio.create_task(self.on_answer(call_control_id, body["Url"], ended))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)
        return JSONResponse(
            {
                "call_sid": call_control_id,
                "from": body["From"],
                "to": body["To"],
                "status": "queued",
            }
        )

    async def _record(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        body = body if isinstance(body, dict) else {}
        self.requests.append(
            RecordedRequest(
                request.method, request.url.path, request.headers.get("authorization"), body
            )
        )
        return body

    def register_call(self, call_control_id: str) -> asyncio.Event:
        """A live call; the event is set once a hang-up or transfer ends it here."""
        event = asyncio.Event()
        self.calls[call_control_id] = event
        return event

    async def _action(self, request: Request) -> Response:
        body = await self._record(request)
        call_id = request.path_params["call_control_id"]
        action = request.path_params["action"]
        if request.headers.get("authorization") != f"Bearer {FAKE_API_KEY}":
            return JSONResponse({"errors": [{"code": "10009", "title": "Authentication"}]}, 401)
        if action not in ("hangup", "transfer"):
            return JSONResponse({"errors": [{"code": "10005", "title": "Not found"}]}, 404)
        ended = self.calls.get(call_id)
        if ended is None or ended.is_set():
            return JSONResponse(
                {"errors": [{"code": "90018", "title": "Call has already ended"}]}, 422
            )
        if action == "transfer" and not isinstance(body.get("to"), str):
            return JSONResponse({"errors": [{"code": "10015", "title": "Bad request"}]}, 422)
        ended.set()
        return JSONResponse({"data": {"result": "ok"}})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(
                    "/v2/calls/{call_control_id}/actions/{action}", self._action, methods=["POST"]
                ),
                Route("/v2/texml/calls/{connection_id}", self._create, methods=["POST"]),
            ]
        )


@contextlib.asynccontextmanager
async def serve_fake_telnyx() -> AsyncIterator[FakeTelnyxRest]:
    """Run a :class:`FakeTelnyxRest` on a free loopback port until the block exits."""
    fake = FakeTelnyxRest()
    async with serve_on_loopback(fake.app()) as base_url:
        fake.base_url = base_url + "/v2"
        try:
            yield fake
        finally:
            for answer in list(fake._answers):
                answer.cancel()
