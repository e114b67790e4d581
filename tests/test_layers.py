"""The layers stay honest: pure code does no I/O, the labs need only the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "asyncq"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules_under(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py"))


@pytest.mark.parametrize("path", modules_under("core"), ids=lambda p: p.name)
def test_core_imports_only_core_and_stdlib(path: Path) -> None:
    for name in imported_modules(path):
        top = name.split(".")[0]
        assert top in sys.stdlib_module_names or name.startswith(("asyncq.core", "asyncq.errors", "__future__")), name
        assert name not in {"sqlite3", "asyncio", "socket", "os"}, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", modules_under("store/sqlite"), ids=lambda p: p.name)
def test_storage_has_no_asyncio_outside_its_seam(path: Path) -> None:
    names = imported_modules(path)
    assert not any(n.startswith(("asyncq.queue", "asyncq.worker.pool", "asyncq.lab", "asyncq.delivery")) for n in names)
    if path.name != "aio.py":
        assert not names & {"asyncio", "aiosqlite", "anyio", "aiohttp"}, path.name


@pytest.mark.parametrize("module", ["asyncq.lab.lease", "asyncq.lab.outbox"])
def test_labs_need_only_the_standard_library(module: str, tmp_path: Path) -> None:
    code = (
        f"import sys, {module}\n"
        "third = sorted(name for name, m in list(sys.modules.items())\n"
        "    if 'site-packages' in (getattr(m, '__file__', None) or '')\n"
        "    and not name.startswith(('asyncq', '__editable__', '_distutils_hack')))\n"
        "print(','.join(third))"
    )
    # From another working directory, with the project on the path as an installed package would be.
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.strip() == "", f"{module} pulled in {done.stdout.strip()}"


@pytest.mark.parametrize("module", ["asyncq.outbox", "asyncq.amqp", "asyncq.inbox", "asyncq.tasks", "asyncq.queue"])
def test_facades_do_not_load_the_sqlite_driver(module: str, tmp_path: Path) -> None:
    """A PostgreSQL user's import loads no SQLite code: the driver comes through the opener, SQLite's own helpers
    through ``asyncq.sqlite``."""
    code = (
        f"import sys, {module}\n"
        "loaded = sorted(n for n in sys.modules\n"
        "    if n.startswith('asyncq.store.sqlite') or n in ('sqlite3', 'aiosqlite'))\n"
        "print(','.join(loaded))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.strip() == "", f"{module} loaded {done.stdout.strip()}"


def test_sqlite_helpers_live_in_one_module() -> None:
    import asyncq
    import asyncq.sqlite
    from asyncq.store.sqlite.amqp import process_delivery
    from asyncq.store.sqlite.outbox import add_sync
    from asyncq.store.sqlite.sync import enqueue_sync

    assert asyncq.sqlite.__all__ == ["add_sync", "enqueue_sync", "process_delivery"]
    assert (asyncq.sqlite.add_sync, asyncq.sqlite.enqueue_sync) == (add_sync, enqueue_sync)
    assert asyncq.sqlite.process_delivery is process_delivery and asyncq.enqueue_sync is enqueue_sync


def test_nothing_outside_the_sqlite_driver_and_the_labs_imports_sqlite3_at_run_time() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        folder = path.relative_to(PACKAGE).parts[0]
        if path.is_relative_to(PACKAGE / "store" / "sqlite") or folder == "lab":
            continue
        tree = ast.parse(path.read_text())
        guarded = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        runtime = {
            name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in guarded
            for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        }
        assert not runtime & {"sqlite3", "aiosqlite"}, path
