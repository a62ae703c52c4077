"""Headless Chromium for browser tests: Debian's ``/usr/bin/chromium`` driven by Playwright.

No browser build is downloaded (``playwright install`` cannot reach its CDN from this project's
machines); ``scripts/setup-browser`` installs the Debian package instead, once, when it is missing.

Usage in a test module::

    from tests.browser import chromium_browser, chromium_executable  # noqa: F401  (fixtures)

    async def test_page(chromium_browser: Browser) -> None:
        page = await chromium_browser.new_page()

or without the fixtures: ``async with launch_chromium() as browser: ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import Browser, ConsoleMessage, Error, Page, async_playwright

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
#: Debian's chromium package puts its launcher here (scripts/setup-browser checks the same path).
CHROMIUM_PATH: Final = Path("/usr/bin/chromium")
SETUP_BROWSER: Final = REPO_ROOT / "scripts" / "setup-browser"
#: Where browser tests leave screenshots (not committed).
ARTIFACTS_DIR: Final = Path(__file__).resolve().parent / "artifacts"
#: apt-get update + install of chromium took ~10 s here; 10 minutes covers a slow mirror.
SETUP_TIMEOUT_S: Final = 600.0
#: Flags for a quiet, hermetic headless run: no sandbox (CI runs as root, where Chromium's
#: sandbox refuses to start), no GPU (none on these machines), no QUIC, and no background
#: traffic to Google services (first-run, component updates, sync): tests talk to loopback only.
CHROMIUM_ARGS: Final[tuple[str, ...]] = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class BrowserSetupError(RuntimeError):
    """Chromium is missing and ``scripts/setup-browser`` could not install it."""


def ensure_chromium() -> Path:
    """Return the Chromium path, running ``scripts/setup-browser`` first if it is missing.

    Raises :class:`BrowserSetupError` carrying the script's output when it fails.
    """
    if os.access(CHROMIUM_PATH, os.X_OK):
        return CHROMIUM_PATH
    try:
        result = subprocess.run(
            [str(SETUP_BROWSER)],
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrowserSetupError(f"{SETUP_BROWSER} could not run: {exc}") from exc
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0 or not os.access(CHROMIUM_PATH, os.X_OK):
        raise BrowserSetupError(
            f"{SETUP_BROWSER} failed (exit {result.returncode}); {CHROMIUM_PATH} is needed "
            f"for the browser tests. Output:\n{output}"
        )
    return CHROMIUM_PATH


@contextlib.asynccontextmanager
async def launch_chromium(
    executable: Path | None = None, extra_args: tuple[str, ...] = ()
) -> AsyncIterator[Browser]:
    """Headless Chromium (Playwright ``Browser``) for the duration of the block.

    Each launch gets a fresh, throw-away user-data-dir: Playwright's ``launch()`` creates a new
    temporary profile directory per browser and deletes it on close (a ``--user-data-dir`` flag
    of our own is refused by ``launch()``), so no state leaks between tests. ``extra_args``
    are Chromium flags a test needs besides :data:`CHROMIUM_ARGS` (a fake microphone).
    """
    path = executable if executable is not None else await asyncio.to_thread(ensure_chromium)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(path), headless=True, args=[*CHROMIUM_ARGS, *extra_args]
        )
        try:
            yield browser
        finally:
            await browser.close()


def artifact_path(name: str) -> Path:
    """``tests/artifacts/<name>``, creating the folder."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS_DIR / name


def record_page_errors(page: Page) -> list[str]:
    """Collect uncaught page exceptions and console errors (CSP violations included) of ``page``.

    The returned list fills as the page runs; assert on it at the end of a test.
    """
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} at {message.location.get('url', '?')}")

    def on_page_error(error: Error) -> None:
        errors.append(f"pageerror: {error}")

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    return errors


@pytest.fixture(scope="session")
def chromium_executable() -> Path:
    """Path of Debian's Chromium, installed by ``scripts/setup-browser`` once if missing.

    Fails the test (never skips) with the script's output when it cannot be installed.
    """
    try:
        return ensure_chromium()
    except BrowserSetupError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
async def chromium_browser(chromium_executable: Path) -> AsyncIterator[Browser]:
    """A headless Chromium ``Browser`` (fresh profile) for one test, closed afterwards."""
    async with launch_chromium(chromium_executable) as browser:
        yield browser
