"""The package as a newcomer installs it: non-editable, into a fresh virtualenv.

``pip install .`` must add one import package to site-packages, ``rutster``
(and its dist-info): nothing generic such as ``gateway`` or ``media`` that
could collide with another distribution. ``rutster demo`` must then run from
that install alone, in a folder away from the checkout, its caller audio
shipped as package data (``media/demo_audio/``).

Offline, as every test here is (loopback only): the new virtualenv reaches
the dependencies through one ``.pth`` line naming this venv's site-packages;
this venv's pip installs into it (``--python``) and builds the wheel without
build isolation on this venv's setuptools (the ``dev`` extra), so nothing is
downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Not part of what is built (caches, this venv, the test corpus), so not copied.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".rutster",
    "out",
    "tests",
    "bench",
    "*.so",  # the editable install's build of the C kernels: the install builds its own
)
#: The folders the repository keeps at its top level, which must install only
#: under the rutster namespace.
TOP_LEVEL_FOLDERS = ("tools", "gateway", "brains", "trunk", "spend", "protocols", "media", "base")
#: A fresh install, a wheel build and the demo's 5 s call, with room for a slow host.
INSTALL_TIMEOUT_S = 300
DEMO_TIMEOUT_S = 170


def _site_packages(env: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return env / "lib" / version / "site-packages"


def _clean_env() -> dict[str, str]:
    """This process's environment without settings that would steer the install or demo."""
    drop = ("RUTSTER_", "TWILIO_", "OPENAI_", "REDIS_URL", "PYTHONPATH", "PIP_", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _install_fresh(
    tmp_path: Path, env_extra: dict[str, str] | None = None
) -> tuple[Path, set[str]]:
    """``pip install`` this checkout, non-editable, into a new virtualenv: its python, and
    what its site-packages held before."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    env = tmp_path / "fresh"
    # No pip or setuptools of its own: this venv's pip installs into it (--python), and
    # the build runs on this venv's setuptools, reached like every dependency.
    venv.create(env, with_pip=False)
    site = _site_packages(env)
    # The dependencies: this venv's (a .pth line adds a folder to sys.path, and the .pth
    # files inside that folder, this checkout's editable install among them, are not run).
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = set(os.listdir(site))
    python = env / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        env={**_clean_env(), **(env_extra or {})},
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return python, before


def _python(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` on the fresh install's python, away from this checkout; it must pass."""
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(),
        cwd=cwd,
        check=True,
    )


def test_pip_install_adds_only_the_rutster_namespace_and_the_demo_runs_from_it(
    tmp_path: Path,
) -> None:
    python, before = _install_fresh(tmp_path)
    env = python.parent.parent
    site = _site_packages(env)

    added = set(os.listdir(site)) - before
    dist_info = [name for name in added if name.endswith(".dist-info")]
    assert [name.split("-")[0] for name in dist_info] == ["rutster"], added
    assert added - set(dist_info) == {"rutster"}, added
    top_level = (site / dist_info[0] / "top_level.txt").read_text().split()
    assert top_level == ["rutster"], top_level

    run = tmp_path / "run"
    run.mkdir()
    probe = _python(
        python,
        "import importlib.util, rutster.gateway, rutster.media.demo_audio as a; "
        "import rutster.media.compiled as k; "
        f"print([n for n in {TOP_LEVEL_FOLDERS!r} if importlib.util.find_spec(n)]); "
        "print(rutster.gateway.__file__); print(a.CALLER_SPEECH_8K.is_file()); "
        "print(k.KERNELS is not None)",
        run,
    )
    generic, package_file, audio_shipped, compiled = probe.stdout.splitlines()
    assert generic == "[]"  # no top-level gateway, media, ... importable
    assert Path(package_file).is_relative_to(site)  # the install, not this checkout
    assert audio_shipped == "True"
    assert compiled == "True"  # the C kernels were built (a compiler is here)

    demo = subprocess.run(
        [str(env / "bin" / "rutster"), "demo", "--seconds", "5"],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        env=_clean_env(),
        cwd=run,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "demo OK" in demo.stdout, demo.stdout + demo.stderr


def test_without_a_c_compiler_the_install_still_works_on_the_numpy_kernels(
    tmp_path: Path,
) -> None:
    """The media path's C kernels are optional extensions (setup.py): a machine with no
    C compiler gets their numpy twins, the same echo verdicts, Silero in onnxruntime, and a
    warning at start."""
    python, _ = _install_fresh(tmp_path, {"CC": "/bin/false"})
    probe = _python(
        python,
        "import logging, rutster.media.compiled as c, rutster.media.echo_kernels as k; "
        "from rutster.gateway.server import log_compiled_kernels; "
        "from rutster.media.echo_gate import EchoGate; "
        "logging.basicConfig(); "
        "print(c.KERNELS is None, k.prove_lags is k.prove_lags_numpy); "
        "g = EchoGate(); g.render(bytes(range(256)) + bytes(64), 0.0); "
        "print(g.capture(bytes(320), 200.0).near_end); log_compiled_kernels(); "
        "import rutster.media.silero_kernel as s, rutster.media.vad as v; "
        "print(s.KERNEL is None, v.make_detector('silero').engine)",
        tmp_path,
    )
    assert probe.stdout.splitlines() == ["True True", "False", "True onnxruntime"], probe.stdout
    assert "compiled kernels were not built" in probe.stderr, probe.stderr


def test_every_module_imports_under_the_namespace_only() -> None:
    """No module reaches a package by its folder name (``import gateway``), which would load a
    second copy of it beside ``rutster.gateway``: its classes and state apart from the first's.
    """
    code = (
        "import pkgutil, sys, rutster\n"
        "for m in pkgutil.walk_packages(rutster.__path__, 'rutster.'):\n"
        "    __import__(m.name)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {TOP_LEVEL_FOLDERS!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
        cwd=ROOT,  # where a stray `import gateway` would succeed
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout
