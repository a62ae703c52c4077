"""``rutster admin``: the operator CLI against a real gateway under uvicorn.

The CLI is synchronous (httpx): each test runs ``tools.cli.main`` in a thread
while the gateway serves in the test's event loop, with the environment set
through ``monkeypatch``.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rutster.brains.echo import EchoBrain
from rutster.gateway import admin_cli
from rutster.gateway.admin_cli import EXIT_API_ERROR, EXIT_CONFIG, EXIT_OK, EXIT_UNREACHABLE
from rutster.gateway.api.schemas import API_KEY_PATTERN
from rutster.spend.limits import TenantLimits
from rutster.tools.cli import main
from rutster.tools.launcher import LOOPBACK, free_port
from tests.conftest import (
    TEST_ADMIN_KEY,
    RunningGateway,
    gateway_config,
    serve_gateway,
)

#: Environment variables the CLI reads; cleared first so the host's own cannot leak in.
CLI_ENV = ("RUTSTER_ADMIN_KEY", "RUTSTER_ADMIN_KEY_FILE", "RUTSTER_PUBLIC_URL")
#: A well-formed admin key the gateway does not know.
WRONG_ADMIN_KEY = "not-the-admin-key-0123456789abcdef"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean CLI environment (no admin key, no public URL) to set per test."""
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
async def gw(echo_brain: EchoBrain) -> AsyncIterator[RunningGateway]:
    """A gateway whose admin key is ``TEST_ADMIN_KEY`` (conftest's spend settings)."""
    async with serve_gateway(gateway_config(echo_brain.url, barge_in=False)) as running:
        yield running


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``rutster admin ...`` in a thread: (exit code, stdout, stderr)."""
    capsys.readouterr()  # drop anything printed before
    code = await asyncio.to_thread(main, ["admin", *argv])
    out, err = capsys.readouterr()
    # Whatever happened, the admin key never reaches the terminal.
    assert TEST_ADMIN_KEY not in out + err
    return code, out, err


async def test_create_key_prints_only_the_key_and_it_authenticates(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    code, out, err = await run_cli(
        capsys, "create-key", "--tenant", "acme", "--label", "ci", "--gateway", gw.url
    )
    assert code == EXIT_OK, err
    # Only the key, on its own line: KEY=$(rutster admin create-key ...) works.
    assert out.endswith("\n") and out.count("\n") == 1
    key = out.strip()
    assert re.fullmatch(API_KEY_PATTERN, key)
    assert "acme" in err and "only once" in err and key not in err
    async with httpx.AsyncClient(base_url=gw.url) as client:
        answer = await client.get("/v1/calls", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"data": [], "next_cursor": None}
    # A second key is a different key.
    code, again, _ = await run_cli(capsys, "create-key", "--tenant", "acme", "--gateway", gw.url)
    assert code == EXIT_OK and again.strip() != key


async def test_admin_role_key_and_public_url_default(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--role admin issues an admin key; without --gateway, $RUTSTER_PUBLIC_URL is used."""
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    cli_env.setenv("RUTSTER_PUBLIC_URL", gw.url + "/")
    code, out, err = await run_cli(capsys, "create-key", "--tenant", "ops", "--role", "admin")
    assert code == EXIT_OK, err
    admin_key = out.strip()
    assert "admin key" in err
    # The new admin key runs admin commands itself.
    cli_env.setenv("RUTSTER_ADMIN_KEY", admin_key)
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["admin", "kill-switch", "status"])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert '"engaged": false' in out and admin_key not in out + err


async def test_admin_key_file_wins_over_env(
    gw: RunningGateway,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    key_file = tmp_path / "admin-key"
    key_file.write_text(TEST_ADMIN_KEY + "\n", encoding="utf-8")
    cli_env.setenv("RUTSTER_ADMIN_KEY", WRONG_ADMIN_KEY)
    cli_env.setenv("RUTSTER_ADMIN_KEY_FILE", str(key_file))
    code, out, err = await run_cli(capsys, "create-key", "--tenant", "acme", "--gateway", gw.url)
    assert code == EXIT_OK, err
    assert re.fullmatch(API_KEY_PATTERN, out.strip())


async def test_no_admin_key_exits_2(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ("create-key", "--tenant", "acme"),
        ("kill-switch", "status"),
        ("limits", "--tenant", "acme"),
    ):
        code, out, err = await run_cli(capsys, *argv, "--gateway", gw.url)
        assert code == EXIT_CONFIG, (argv, err)
        assert out == ""
        assert "no admin key" in err and "RUTSTER_ADMIN_KEY" in err
    # Nothing was issued.
    assert gw.state.api_keys is not None
    assert await gw.state.api_keys.tenant_key_hashes("acme") == set()


async def test_unreadable_or_unusable_admin_key_exits_2(
    gw: RunningGateway,
    cli_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY_FILE", str(tmp_path / "missing"))
    code, out, err = await run_cli(capsys, "kill-switch", "status", "--gateway", gw.url)
    assert (code, out) == (EXIT_CONFIG, "")
    assert "RUTSTER_ADMIN_KEY_FILE" in err and "cannot read" in err
    # A key that cannot travel in an Authorization header is refused before sending,
    # and the message does not quote it.
    bad = "päss-word-with-umlaut-0123456789"
    cli_env.delenv("RUTSTER_ADMIN_KEY_FILE")
    cli_env.setenv("RUTSTER_ADMIN_KEY", bad)
    code, out, err = await run_cli(capsys, "kill-switch", "status", "--gateway", gw.url)
    assert (code, out) == (EXIT_CONFIG, "")
    assert "bearer token" in err and bad not in err


async def test_wrong_admin_key_exits_1_unauthorized(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", WRONG_ADMIN_KEY)
    code, out, err = await run_cli(capsys, "create-key", "--tenant", "acme", "--gateway", gw.url)
    assert (code, out) == (EXIT_API_ERROR, "")
    assert "401" in err and "unauthorized" in err
    assert WRONG_ADMIN_KEY not in err
    assert gw.metric("rutster_api_auth_failures_total") == 1


async def test_api_error_message_is_printed(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 422 from the API: exit 1 with its message and the field it names."""
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    code, out, err = await run_cli(
        capsys, "create-key", "--tenant", "Not A Tenant", "--gateway", gw.url
    )
    assert (code, out) == (EXIT_API_ERROR, "")
    assert "422" in err and "invalid_request" in err and "field: tenant" in err
    code, out, err = await run_cli(
        capsys, "limits", "--tenant", "acme", "--budget-day", "1e3", "--gateway", gw.url
    )
    assert (code, out) == (EXIT_API_ERROR, "")
    assert "field: budget_day" in err
    code, out, err = await run_cli(capsys, "limits", "--tenant", "Acme", "--gateway", gw.url)
    assert (code, out) == (EXIT_API_ERROR, "")
    assert "field: id" in err
    # A tenant holding a path is sent as one (escaped) segment: no route takes it, and
    # above all it does not turn into a request to another endpoint.
    code, out, err = await run_cli(
        capsys,
        "limits",
        "--tenant",
        "../admin/kill-switch",
        "--max-concurrent",
        "1",
        "--gateway",
        gw.url,
    )
    assert (code, out) == (EXIT_API_ERROR, "")
    assert "HTTP 404" in err
    assert gw.state.spend_store is not None
    assert not (await gw.state.spend_store.get_global()).killed


async def test_unreachable_gateway_exits_3(
    cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    url = f"http://{LOOPBACK}:{free_port()}"  # nothing listens there
    for argv in (("create-key", "--tenant", "acme"), ("kill-switch", "on")):
        code, out, err = await run_cli(capsys, *argv, "--gateway", url)
        assert (code, out) == (EXIT_UNREACHABLE, ""), err
        assert "cannot reach the gateway" in err and url in err


async def test_silent_gateway_exits_3(
    cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gateway that accepts the connection but never answers: exit 3, not a hang."""
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    cli_env.setattr(admin_cli, "REQUEST_TIMEOUT_S", 0.3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen()  # the kernel completes the handshake; nobody ever reads
        url = f"http://{LOOPBACK}:{listener.getsockname()[1]}"
        code, out, err = await run_cli(capsys, "kill-switch", "on", "--gateway", url)
    assert (code, out) == (EXIT_UNREACHABLE, ""), err
    assert "did not answer within 0.3 s" in err


async def test_bad_gateway_url_exits_2(
    cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    for url in ("ftp://127.0.0.1/", "127.0.0.1:8080", "http://127.0.0.1:99999"):
        code, out, err = await run_cli(capsys, "kill-switch", "status", "--gateway", url)
        assert (code, out) == (EXIT_CONFIG, ""), (url, err)
        assert "gateway URL" in err


async def test_kill_switch_on_status_off(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    store = gw.state.spend_store
    assert store is not None
    code, out, err = await run_cli(capsys, "kill-switch", "on", "--gateway", gw.url)
    assert code == EXIT_OK, err
    assert out.strip() == '{\n  "engaged": true\n}' and "ENGAGED" in err
    assert (await store.get_global()).killed
    code, out, _ = await run_cli(capsys, "kill-switch", "status", "--gateway", gw.url)
    assert code == EXIT_OK and '"engaged": true' in out
    code, out, err = await run_cli(capsys, "kill-switch", "off", "--gateway", gw.url)
    assert code == EXIT_OK and '"engaged": false' in out and "released" in err
    assert not (await store.get_global()).killed
    code, out, _ = await run_cli(capsys, "kill-switch", "status", "--gateway", gw.url)
    assert code == EXIT_OK and '"engaged": false' in out


async def test_limits_get_and_put(
    gw: RunningGateway, cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setenv("RUTSTER_ADMIN_KEY", TEST_ADMIN_KEY)
    store = gw.state.spend_store
    assert store is not None
    code, out, err = await run_cli(capsys, "limits", "--tenant", "acme", "--gateway", gw.url)
    assert code == EXIT_OK, err
    before = json.loads(out)
    assert before["tenant"] == "acme" and before["budget_day"] == "0.000000"
    code, out, err = await run_cli(
        capsys,
        "limits",
        "--tenant",
        "acme",
        "--budget-day",
        "12.50",
        "--max-concurrent",
        "3",
        "--max-call-duration-s",
        "600",
        "--gateway",
        gw.url,
    )
    assert code == EXIT_OK, err
    changed = json.loads(out)
    assert changed == before | {
        "budget_day": "12.500000",
        "max_concurrent": 3,
        "max_call_duration_s": 600,
    }
    assert "budget_day" in err and "max_concurrent" in err
    stored = await store.get_tenant_limits("acme")
    assert stored == TenantLimits(budget_day=12_500_000, max_concurrent=3, max_call_duration_s=600)
    # A later GET shows the change; an untouched limit stays.
    code, out, _ = await run_cli(
        capsys, "limits", "--tenant", "acme", "--budget-month", "100", "--gateway", gw.url
    )
    assert code == EXIT_OK
    code, out, _ = await run_cli(capsys, "limits", "--tenant", "acme", "--gateway", gw.url)
    assert json.loads(out) == changed | {"budget_month": "100.000000"}
    # argparse refuses a non-integer count before anything is sent.
    with pytest.raises(SystemExit) as exited:
        await asyncio.to_thread(
            main, ["admin", "limits", "--tenant", "acme", "--max-concurrent", "lots"]
        )
    assert exited.value.code == 2
