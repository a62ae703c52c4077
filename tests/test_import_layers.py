"""The package layers hold, and the check that holds them fails on an upward import;
the core imports no provider but through its registry line, and that check fails too.

``lint-imports`` (import-linter, contracts in pyproject.toml) runs in
scripts/test over the installed namespace; here it runs over this checkout,
and over a copy of it in which the bottom of the stack imports the top.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The package folders the rutster namespace links.
PACKAGES = ("base", "protocols", "media", "spend", "trunk", "brains", "gateway", "tools")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # First on the path: this tree's rutster, not the one the venv was installed from.
    env["PYTHONPATH"] = str(root)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache", str(root / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )


def test_the_layers_hold() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "statement", "importer", "imported"),
    [
        # The bottom of the stack importing the top.
        ("media/formats.py", "from rutster.gateway import call", "media.formats", "gateway.call"),
        # Spend stands beside the protocols: it may not bill in the tap's types.
        ("spend/money.py", "from rutster.protocols import tap", "spend.money", "protocols.tap"),
        # The product never imports the shipped tools.
        ("gateway/call.py", "from rutster.tools import launcher", "gateway.call", "tools.launcher"),
        # The core names no provider: a provider is its registry line and its package.
        (
            "gateway/admission.py",
            "from rutster.trunk.telnyx import signature",
            "gateway.admission",
            "trunk.telnyx.signature",
        ),
    ],
)
def test_an_upward_import_breaks_the_layers(
    tmp_path: Path, module: str, statement: str, importer: str, imported: str
) -> None:
    (tmp_path / "rutster").mkdir()
    shutil.copy(ROOT / "rutster" / "__init__.py", tmp_path / "rutster" / "__init__.py")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        (tmp_path / "rutster" / name).symlink_to(Path("..") / name)
    source = tmp_path / module
    source.write_text(source.read_text() + f"\n{statement}  # upward\n")

    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "1 kept, 1 broken" in done.stdout
    package, other = importer.split(".")[0], imported.split(".")[0]
    assert f"rutster.{package} is not allowed to import rutster.{other}" in done.stdout
    assert f"rutster.{importer} -> rutster.{imported}" in done.stdout
