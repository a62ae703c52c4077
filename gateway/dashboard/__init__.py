"""The operator dashboard: a static page (no build step) that reads the live SSE snapshot stream.

The page itself holds no secrets and needs no auth; it asks for an API key, keeps it in
``sessionStorage`` and sends it as ``Authorization: Bearer`` on every request it makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

#: Folder with ``index.html``, ``dashboard.js`` and ``dashboard.css`` (served under
#: ``/dashboard`` and ``/dashboard/static/``).
STATIC_DIR: Final[Path] = Path(__file__).resolve().parent / "static"
