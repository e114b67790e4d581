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
