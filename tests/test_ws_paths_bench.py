"""bench/ws_paths.py: every server path echoes every message, and its CPU is measured."""

from __future__ import annotations

import os

import pytest

from bench.ws_paths import CLIENT_PATHS, PATHS, media_message, run_client_path, run_path


def test_a_media_message_is_twilios_shape() -> None:
    import base64
    import json

    message = json.loads(media_message(7))
    assert message["event"] == "media"
    assert len(base64.b64decode(message["media"]["payload"])) == 160  # 20 ms of μ-law


@pytest.mark.parametrize("path", PATHS)
def test_each_path_echoes_every_message(path: str) -> None:
    cores = sorted(os.sched_getaffinity(0))
    result = run_path(path, connections=3, seconds=0.6, cores=(cores[0], cores[-1]), warmup_s=0.3)
    # 3 connections at 50 messages a second for 0.6 s; a message in flight as the window
    # closes may be echoed after it.
    assert result.sent >= 60
    assert result.sent - 3 <= result.echoed <= result.sent + 3
    assert result.cpu_s >= 0.0 and result.seconds > 0.5


@pytest.mark.parametrize("path", CLIENT_PATHS)
def test_each_client_path_gets_every_echo(path: str) -> None:
    cores = sorted(os.sched_getaffinity(0))
    result = run_client_path(
        path, connections=3, seconds=0.6, cores=(cores[0], cores[-1]), warmup_s=0.3
    )
    assert result.path == path
    assert result.sent >= 60
    assert result.sent - 3 <= result.echoed <= result.sent + 3
    assert result.cpu_s > 0.0 and result.seconds > 0.5
