"""The browser softphone's static page (``/phone``): HTML, script, styles, worklet."""

from __future__ import annotations

from pathlib import Path

#: The page's files, shipped as package data.
STATIC_DIR = Path(__file__).parent / "static"
