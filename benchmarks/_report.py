"""Shared output for the benchmark scripts: a table on stdout, and a named section of ``docs/benchmarks.md``.

Each script owns one section between ``<!-- BEGIN name -->`` and ``<!-- END name -->``. Writing a section again
replaces only that section (or appends it if it is new), so scripts can be rerun in any order without touching
each other's results. The file is created with a short header if it is missing.
"""

from __future__ import annotations

import os
import platform
import re
import sqlite3
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Numbers measured on one machine by the scripts in `benchmarks/`. Each section names the command that produced
it; rerun that command to refresh the section (the scripts rewrite only their own section).
"""
SECTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def environment() -> str:
    """One line naming what the numbers were measured on, and when."""
    return (
        f"SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d', time.gmtime())}"
    )


def percentile(values: Sequence[float], percent: int) -> float:
    """The ``percent``-th percentile (1-99) of ``values``, interpolated between the two nearest samples."""
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _cells(rows: Sequence[Sequence[object]]) -> list[list[str]]:
    return [[str(cell) for cell in row] for row in rows]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: columns padded to their widest cell, the first left-aligned, the rest right-aligned."""
    lines = [list(headers), *_cells(rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers))]

    def render(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True))])

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(lines[0]), rule, *(render(line) for line in lines[1:])])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """The same table as GitHub-flavoured Markdown (numeric columns right-aligned)."""
    head = "| " + " | ".join(headers) + " |"
    align = "|" + "|".join([":---", *("---:" for _ in headers[1:])]) + "|"
    body = ["| " + " | ".join(row) + " |" for row in _cells(rows)]
    return "\n".join([head, align, *body])


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print ``title`` and the table under it, followed by a blank line."""
    print(f"{title}\n{format_table(headers, rows)}\n")


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the section ``name`` holding ``body``: replaced in place if present, else appended."""
    if not SECTION_NAME.fullmatch(name):
        raise ValueError(f"section name must be 1-64 letters, digits, '_' or '-', got {name!r}")
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    start, stop = text.find(begin), text.find(end)
    if start != -1 and stop > start:
        return text[:start] + block + text[stop + len(end) :]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_section(name: str, body: str, path: Path = DOC) -> Path:
    """Write ``body`` as section ``name`` of ``path`` (creating the file with a header if missing), atomically."""
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.write_text(replace_section(text, name, body), encoding="utf-8")
    os.replace(scratch, path)
    return path


CHECK_HEADERS = ("target", "measured", "verdict")
SEPARATOR = "\n\n"


def publish(
    section: str,
    heading: str,
    intro: str,
    tables: tuple[str, Sequence[str], Sequence[Sequence[object]]],
    checks: Sequence[Sequence[object]],
    notes: str,
    *,
    write: bool,
) -> None:
    """Print a result table (``(title, headers, rows)``) and its targets; with ``write``, also as section ``section``
    of docs/benchmarks.md under ``## heading``, after ``intro`` and before ``notes``."""
    title, headers, rows = tables
    print_table(title, headers, rows)
    print_table("targets", CHECK_HEADERS, checks)
    if write:
        parts = [f"## {heading}", intro, markdown_table(headers, rows), markdown_table(CHECK_HEADERS, checks), notes]
        print(f"wrote {write_section(section, SEPARATOR.join(parts))}")
