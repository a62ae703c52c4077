"""The providers a gateway serves, by name: routes, lookup, auto-detection.

Built once from the list in ``gateway/providers/__init__.py``; the app mounts
:meth:`ProviderRegistry.routes`, the REST API dials and cancels through
:meth:`ProviderRegistry.get`, and :meth:`ProviderRegistry.detect` tells which
provider a media socket's first frame comes from.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Iterator

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from rutster.gateway.ingress_provider import IngressProvider
from rutster.gateway.media_socket import serve_detected_media_socket, serve_media_socket
from rutster.spend.prices import TelephonyRate

#: A provider's name: a lowercase word (it is a metrics label, a price key and a
#: stored field), as a JSON Schema (ECMA) pattern for the REST API. Seed decision.
PROVIDER_NAME_PATTERN = "^[a-z][a-z0-9_]{0,31}$"
PROVIDER_NAME_RE = re.compile(PROVIDER_NAME_PATTERN.removeprefix("^").removesuffix("$"))
#: The one media URL for every provider (auto-detected from the first frame), beside
#: each provider's own path. Seed decision.
AUTODETECT_MEDIA_PATH = "/media"
#: What the REST API shows for a stored provider name that is not a name at all.
UNKNOWN_PROVIDER = "unknown"


class ProviderRegistry:
    """An ordered, read-only set of providers, keyed by name."""

    def __init__(self, providers: Iterable[IngressProvider]) -> None:
        self._by_name: dict[str, IngressProvider] = {}
        paths = {AUTODETECT_MEDIA_PATH}
        for provider in providers:
            if not PROVIDER_NAME_RE.fullmatch(provider.name):
                raise ValueError(f"provider name {provider.name!r} is not a lowercase word")
            if provider.name in self._by_name:
                raise ValueError(f"provider {provider.name!r} is listed twice")
            if provider.media_path in paths:
                raise ValueError(f"media path {provider.media_path!r} is used twice")
            paths.add(provider.media_path)
            self._by_name[provider.name] = provider

    def __iter__(self) -> Iterator[IngressProvider]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def default_rates(self) -> dict[tuple[str, str], TelephonyRate]:
        """Every provider's own rates, keyed as the price table keys them."""
        return {
            (provider.name, direction): rate
            for provider in self
            for direction, rate in provider.default_rates.items()
        }

    def names(self) -> tuple[str, ...]:
        """Every provider's name, in registry order."""
        return tuple(self._by_name)

    def outbound_names(self) -> tuple[str, ...]:
        """The providers the REST API can place calls through."""
        return tuple(p.name for p in self if p.capabilities.outbound)

    def get(self, name: str) -> IngressProvider | None:
        """The provider called ``name``, or None (a record from a newer node, a typo)."""
        return self._by_name.get(name)

    def label(self, stored: str) -> str:
        """A call record's provider as the API shows it: the name as stored, known here
        or not (a newer node may record a provider this one lacks), else "unknown"."""
        return stored if PROVIDER_NAME_RE.fullmatch(stored) else UNKNOWN_PROVIDER

    def detect(self, first_message: str | bytes) -> IngressProvider | None:
        """The provider whose media socket opens with ``first_message``; None when no
        provider recognises it, or when more than one does (never guess)."""
        matches = [p for p in self if p.sniff(first_message)]
        return matches[0] if len(matches) == 1 else None

    async def _detected_media_socket(self, websocket: WebSocket) -> None:
        await serve_detected_media_socket(websocket, self.detect)

    def routes(self) -> list[BaseRoute]:
        """Every provider's endpoints, its media socket on the one shared handler, and
        the auto-detecting media socket (:data:`AUTODETECT_MEDIA_PATH`)."""
        routes: list[BaseRoute] = [
            WebSocketRoute(AUTODETECT_MEDIA_PATH, self._detected_media_socket, name="media")
        ]
        for provider in self:
            routes.extend(provider.routes())
            routes.append(
                WebSocketRoute(
                    provider.media_path, _media_endpoint(provider), name=f"{provider.name}_media"
                )
            )
        return routes


def _media_endpoint(provider: IngressProvider) -> Callable[[WebSocket], Awaitable[None]]:
    """A WebSocket endpoint serving ``provider``'s media sockets (a plain function, which
    Starlette runs as a WebSocket session)."""

    async def media_socket(websocket: WebSocket) -> None:
        await serve_media_socket(websocket, provider)

    media_socket.__name__ = f"{provider.name}_media_socket"
    return media_socket
