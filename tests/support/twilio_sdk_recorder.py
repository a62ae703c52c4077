"""What the official ``twilio`` SDK would send: its HTTP client, recording instead of sending."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from twilio.http import HttpClient
from twilio.http.response import Response as TwilioResponse


class RecordingSdkHttpClient(HttpClient):  # type: ignore[misc]  # twilio is untyped
    """Captures what twilio-python would send and answers ``status`` with ``body``."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        super().__init__(logging.getLogger("tests.twilio_sdk"), is_async=False)
        self.sent: list[dict[str, Any]] = []
        self._status = status
        self._body = dict(body)

    def request(
        self,
        method: str,
        uri: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,
        allow_redirects: bool = False,
    ) -> TwilioResponse:
        self.sent.append({"method": method, "uri": uri, "data": data, "auth": auth})
        return TwilioResponse(self._status, json.dumps(self._body))
