"""docs/architecture.md stays true to the tree: every module of the store layer is named in its module table, and
the page stays short (the measurement logs live in docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def module_table_names() -> set[str]:
    """The module paths (relative to ``asyncq/store/``) named in the page's module table."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| module (`asyncq/store/"))
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        names.update(re.findall(r"`([\w/]+\.py)`", first_cell))
    return names


def test_every_store_module_is_in_the_architecture_pages_module_table() -> None:
    store = ROOT / "asyncq" / "store"
    modules = {p.relative_to(store).as_posix() for p in store.rglob("*.py") if p.name != "__init__.py"}
    named = module_table_names()
    assert len(modules) > 30  # the walk found the tree
    assert modules - named == set(), "modules missing from docs/architecture.md's module table"
    assert named - modules == set(), "the module table names modules that do not exist"


def test_the_architecture_page_is_short() -> None:
    assert len(PAGE.read_text(encoding="utf-8").splitlines()) <= 300
