"""One route per ``/v1`` path, dispatching on the method, so ``OPTIONS`` and 405 tell the truth.

Starlette tries routes in order; with one route per method, a method missing
from the first route of a path gets a 405 whose ``Allow`` lists only that
route's methods (``OPTIONS /v1/calls`` answered 405 ``Allow: POST`` though GET
is served there). A :class:`Resource` holds every method of one path instead:
it answers ``OPTIONS`` with 204 and the full ``Allow``, ``HEAD`` as ``GET``
(uvicorn drops the body), and any other method with a 405 in the API's error
shape, carrying the same ``Allow`` (RFC 9110 §9.3.7, §15.5.6).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rutster.gateway.api.errors import error_response, method_not_allowed

Handler = Callable[[Request], Awaitable[Response]]

#: ``Allow`` lists methods in this order (a stable header; RFC 9110 sets none).
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allow_header(methods: Iterable[str]) -> str:
    """The ``Allow`` value of a resource serving ``methods``: HEAD with GET, OPTIONS always."""
    allowed = {method.upper() for method in methods} | {"OPTIONS"}
    if "GET" in allowed:
        allowed.add("HEAD")
    ordered = [m for m in METHOD_ORDER if m in allowed]
    return ", ".join(ordered + sorted(allowed - set(METHOD_ORDER)))


class Resource:
    """An ASGI app serving one path: a handler per method, then OPTIONS, then 405."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self.handlers = {method.upper(): handler for method, handler in handlers.items()}
        if "GET" in self.handlers:
            self.handlers.setdefault("HEAD", self.handlers["GET"])
        self.allow = allow_header(self.handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point (Starlette treats a class instance endpoint as an ASGI app)."""
        response = await self.respond(Request(scope, receive))
        await response(scope, receive, send)

    async def respond(self, request: Request) -> Response:
        """The answer to ``request``, whatever its method."""
        handler = self.handlers.get(request.method)
        if handler is not None:
            return await handler(request)
        if request.method == "OPTIONS":
            # No authentication: which methods exist is no secret (the document lists them).
            return Response(status_code=204, headers={"Allow": self.allow})
        return error_response(method_not_allowed(request.method, request.url.path, self.allow))


def resource(path: str, handlers: Mapping[str, Handler]) -> Route:
    """A route serving every method of ``path`` (Starlette passes all methods to an ASGI app)."""
    return Route(path, Resource(handlers))
