"""Serve an ASGI app under uvicorn on a free loopback port, for a test's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn
from starlette.types import ASGIApp

from rutster.tools.launcher import LOOPBACK, free_port


@contextlib.asynccontextmanager
async def serve_on_loopback(app: ASGIApp) -> AsyncIterator[str]:
    """Run ``app`` until the block exits; yields its base URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
