"""Every document the project cites is in the repository, down to the section.

Comments and docstrings give their sources as repository files
(``docs/PROVIDERS.md §1.3``, ``docs/ARCHITECTURE.md``, doctrine numbers) or
public addresses. A citation of a Markdown file that is not here, a section of
docs/PROVIDERS.md that does not exist or a doctrine docs/ARCHITECTURE.md does not
number is a source nobody can read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The project's own folders and files whose text may cite documents.
SOURCES = (
    "tools",
    "gateway",
    "media",
    "brains",
    "trunk",
    "spend",
    "protocols",
    "base",
    "tests",
    "bench",
    "docs",
    "scripts",
    "infra",
    "examples",
    "README.md",
    "pyproject.toml",
)
#: Not the project's text: fixtures (third-party READMEs) and installed packages
#: (``bench/.pipecat-venv``, the peer's virtualenv bench/vs_pipecat.py builds).
SKIPPED_PARTS = frozenset({"fixtures", "node_modules", "__pycache__", "artifacts", ".pipecat-venv"})
SUFFIXES = frozenset({".py", ".md", ".lua", ".toml", ".cfg", ""})
#: A Markdown file named in text, not as part of an address (``//host/x.md``).
MD_NAME = re.compile(r"(?<![\w/.:-])((?:\.\./|[\w-]+/)*[\w-]+\.md)\b")
PROVIDERS_SECTION = re.compile(r"docs/PROVIDERS\.md §(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")
DOCTRINE = re.compile(r"docs/ARCHITECTURE\.md,? doctrines? (\d+)")


def _texts() -> Iterator[tuple[Path, str]]:
    for name in SOURCES:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            if not path.is_file() or SKIPPED_PARTS & set(path.relative_to(ROOT).parts):
                continue
            if path.suffix not in SUFFIXES:
                continue
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def _exists(cited: str, citing: Path) -> bool:
    return any((base / cited).is_file() for base in (ROOT, citing.parent, ROOT / "docs"))


#: Files whose Markdown names are paths inside other public repositories, each named
#: with its repository (docs/PROVIDERS.md's sources), not citations of this one's.
FOREIGN_PATHS = frozenset({Path("docs/PROVIDERS.md")})


def test_every_cited_markdown_file_is_in_the_repository() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {cited}"
        for path, text in _texts()
        if path.relative_to(ROOT) not in FOREIGN_PATHS
        for cited in set(MD_NAME.findall(text))
        if not _exists(cited, path)
    )
    assert missing == []


def test_every_cited_provider_section_and_doctrine_exists() -> None:
    providers = (ROOT / "docs/PROVIDERS.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[ .]", providers, re.MULTILINE))
    architecture = (ROOT / "docs/ARCHITECTURE.md").read_text(encoding="utf-8")
    doctrines = set(re.findall(r"^(\d+)\. \*\*", architecture, re.MULTILINE))
    bad: list[str] = []
    for path, text in _texts():
        where = path.relative_to(ROOT)
        for first, last in PROVIDERS_SECTION.findall(text):
            bad += [f"{where}: §{s}" for s in (first, last) if s and s not in sections]
        bad += [f"{where}: doctrine {n}" for n in DOCTRINE.findall(text) if n not in doctrines]
    assert sections >= {"1.1", "1.3", "1.5", "1.6", "5.2", "5.5", "8"}
    assert bad == []
