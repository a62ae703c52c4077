"""A FAKE Plivo REST API, for tests (a test double, never shipped). It is not Plivo.

:class:`FakePlivoRest` serves, on a loopback port, what docs/PROVIDERS.md §4.4 and
plivo-python's ``calls`` resource describe, behind HTTP Basic ``auth_id:auth_token``
(``401`` otherwise):

- ``POST /v1/Account/{auth_id}/Call/``: place a call (``from``, ``to``, ``answer_url``);
  a ``request_uuid`` comes back, and :attr:`FakePlivoRest.on_answer`, when set, plays
  the callee (with the call's own ``CallUUID``);
- ``DELETE /v1/Account/{auth_id}/Call/{call_uuid}/``: ``204`` when a live call was hung
  up, ``404`` when it is over or unknown;
- ``POST /v1/Account/{auth_id}/Call/{call_uuid}/`` with ``legs: "aleg"`` and
  ``aleg_url``: a transfer. Like Plivo, the fake fetches the new XML from ``aleg_url``
  (POST, signed with signature V3) and keeps it in :attr:`FakePlivoRest.transfer_xml`;
  the call leaves our stream (its event is set).

Calls are registered by the test (or created). Every request is recorded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rutster.trunk.plivo.signature import NONCE_HEADER, SIGNATURE_HEADER, PlivoSignatureV3
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
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakePlivoRest:
    """The fake's state: calls (``CallUUID`` → ended event), requests, transfers."""

    calls: dict[str, asyncio.Event] = field(default_factory=dict)
    requests: list[PlivoRequest] = field(default_factory=list)
    base_url: str = ""
    #: Plays the callee of a placed call: ``(CallUUID, request_uuid, answer_url, ended)``.
    on_answer: Callable[[str, str, str, asyncio.Event], Coroutine[Any, Any, object]] | None = None
    #: The XML each transfer's ``aleg_url`` answered, by ``CallUUID``.
    transfer_xml: dict[str, str] = field(default_factory=dict)
    _answers: set[asyncio.Task[object]] = field(default_factory=set)

    def register_call(self, call_uuid: str) -> asyncio.Event:
        """A live call; its event is set when it is hung up or transferred here."""
        event = asyncio.Event()
        self.calls[call_uuid] = event
        return event

    async def _checked(self, request: Request) -> tuple[dict[str, Any], Response | None]:
        """The request's JSON body, recorded, and the refusal of bad credentials."""
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        authorization = request.headers.get("authorization")
        self.requests.append(PlivoRequest(request.method, request.url.path, authorization, body))
        expected = base64.b64encode(f"{FAKE_AUTH_ID}:{FAKE_AUTH_TOKEN}".encode()).decode()
        if authorization != f"Basic {expected}" or request.path_params["auth_id"] != FAKE_AUTH_ID:
            return body, JSONResponse({"error": "authentication failed"}, 401)
        return body, None

    async def _create(self, request: Request) -> Response:
        body, refused = await self._checked(request)
        if refused is not None:
            return refused
        if not all(isinstance(body.get(k), str) for k in ("from", "to", "answer_url")):
            return JSONResponse({"error": "from, to and answer_url are required"}, 400)
        request_uuid, call_uuid = str(uuid.uuid4()), str(uuid.uuid4())
        ended = self.register_call(call_uuid)
        if self.on_answer is not None:
            answer = self.on_answer(call_uuid, request_uuid, body["answer_url"], ended)
            task = asyncio.create_task(answer)
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)
        created = {"api_id": secrets.token_hex(8), "message": "call fired"}
        return JSONResponse(created | {"request_uuid": request_uuid}, 201)

    async def _call(self, request: Request) -> Response:
        body, refused = await self._checked(request)
        if refused is not None:
            return refused
        call_uuid = request.path_params["call_uuid"]
        ended = self.calls.get(call_uuid)
        if ended is None or ended.is_set():
            return JSONResponse({"error": "not found"}, 404)
        if request.method == "POST":  # a transfer: fetch the new XML, as Plivo does
            url = body.get("aleg_url")
            if body.get("legs") != "aleg" or not isinstance(url, str):
                return JSONResponse({"error": "legs and aleg_url are required"}, 400)
            self.transfer_xml[call_uuid] = await self._fetch_xml(url, call_uuid)
        ended.set()
        return Response(status_code=204 if request.method == "DELETE" else 202)

    async def _fetch_xml(self, url: str, call_uuid: str) -> str:
        fields = {"CallUUID": call_uuid, "CallStatus": "in-progress"}
        nonce = secrets.token_hex(8)
        signature = PlivoSignatureV3(FAKE_AUTH_TOKEN).compute("POST", url, fields, nonce)
        async with httpx.AsyncClient(timeout=5.0) as client:
            answer = await client.post(
                url, data=fields, headers={NONCE_HEADER: nonce, SIGNATURE_HEADER: signature}
            )
        return answer.text if answer.status_code == 200 else f"HTTP {answer.status_code}"

    def app(self) -> Starlette:
        call = "/v1/Account/{auth_id}/Call/{call_uuid}/"
        return Starlette(
            routes=[
                Route("/v1/Account/{auth_id}/Call/", self._create, methods=["POST"]),
                Route(call, self._call, methods=["DELETE", "POST"]),
            ]
        )


@contextlib.asynccontextmanager
async def serve_fake_plivo() -> AsyncIterator[FakePlivoRest]:
    """Run a :class:`FakePlivoRest` on a free loopback port until the block exits."""
    fake = FakePlivoRest()
    async with serve_on_loopback(fake.app()) as base_url:
        fake.base_url = base_url
        try:
            yield fake
        finally:
            for answer in list(fake._answers):
                answer.cancel()
