"""A peer's fault is a count and one log line, not a traceback (issue 14, finding 8)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.conftest import RunningGateway, eventually, gateway_config, serve_gateway

UNUSED_BRAIN = "ws://127.0.0.1:9/unused"


@contextlib.contextmanager
def hearing_uvicorn(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """caplog hears uvicorn's error logger too. Its config stops propagation and
    replaces its handlers when a server is configured: enter this after."""
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]


def bad(gw: RunningGateway, source: str, reason: str) -> float:
    return gw.metric("rutster_bad_messages_total", source=source, reason=reason)


async def test_a_webhook_client_gone_mid_body_is_counted_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serve_gateway(gateway_config(UNUSED_BRAIN)) as gw:
        with hearing_uvicorn(caplog):
            url = urlsplit(gw.url)
            host, port = url.hostname or "", url.port or 0
            for path in ("/twilio/voice", "/twilio/status"):
                _, writer = await asyncio.open_connection(host, port)
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: x\r\n"
                    "Content-Type: application/x-www-form-urlencoded\r\n"
                    "Content-Length: 1000\r\n\r\nCallSid=CA".encode()
                )
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.close()
            await eventually(lambda: bad(gw, "http", "client_disconnect") == 2, 5)
            # The gateway is unharmed: the next request is served.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
    assert not tracebacks(caplog), tracebacks(caplog)


async def test_a_media_frame_that_is_not_utf8_closes_1007_counted_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serve_gateway(gateway_config(UNUSED_BRAIN)) as gw:
        with hearing_uvicorn(caplog):
            ws_url = gw.url.replace("http://", "ws://") + "/twilio/stream"
            async with websockets.connect(ws_url) as ws:
                await ws.send(b'{"event":"connected\xff\xfe"}', text=True)
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1007
            await eventually(lambda: bad(gw, "websocket", "bad_utf8") == 1)
    assert not tracebacks(caplog), tracebacks(caplog)
    (line,) = [r for r in caplog.records if "UTF-8" in r.getMessage()]
    assert line.levelno == logging.WARNING
