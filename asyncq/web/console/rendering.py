"""The console's templates (Jinja2, autoescaped: every value a page shows is escaped) and static assets, both
shipped in the package (``templates/``, ``static/``: no CDN), with the filters the templates use."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2

STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def environment() -> jinja2.Environment:
    """The templates' environment: from the package, autoescaped, an unknown name an error."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("asyncq.web.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(utc=utc, ago=ago, span=span, compact=compact, pretty=pretty, thousands=thousands, qs=qs, qsd=qsd)
    env.filters["label"] = label
    return env


def static_file(name: str) -> tuple[bytes, str] | None:
    """A static asset's bytes and type (``None`` if there is no such file)."""
    suffix = name[name.rfind(".") :] if "." in name else ""
    kind = STATIC_TYPES.get(suffix)
    if kind is None or "/" in name or name.startswith("."):
        return None
    found = resources.files("asyncq.web.console").joinpath("static", name)
    if not found.is_file():
        return None
    return found.read_bytes(), kind


def utc(ms: int | None) -> str:
    """Epoch milliseconds as ``YYYY-MM-DD HH:MM:SS.mmmZ`` ("" for none)."""
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def span(ms: int | float | None) -> str:
    """A duration in milliseconds, short: ``850 ms``, ``12.5 s``, ``3 min``, ``2.1 h``, ``4.0 d``."""
    if ms is None:
        return ""
    value = abs(ms)
    if value < 1000:
        text = f"{value:.0f} ms"
    elif value < 60_000:
        text = f"{value / 1000:.1f} s"
    elif value < 3_600_000:
        text = f"{value / 60_000:.0f} min"
    elif value < 86_400_000:
        text = f"{value / 3_600_000:.1f} h"
    else:
        text = f"{value / 86_400_000:.1f} d"
    return "-" + text if ms < 0 else text


def ago(ms: int | None, now_ms: int) -> str:
    """How long before ``now_ms`` (or "in …" after it)."""
    if ms is None:
        return ""
    return f"{span(now_ms - ms)} ago" if ms <= now_ms else f"in {span(ms - now_ms)}"


def compact(value: Any, limit: int = 80) -> str:
    """A value as one line of JSON, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)


def qs(values: Mapping[str, list[str]], *drop: str) -> str:
    """Query values as a query string (without the names in ``drop``)."""
    return urlencode([(name, value) for name, found in values.items() if name not in drop for value in found])


def qsd(values: Mapping[str, Any]) -> str:
    """A mapping of single values as a query string."""
    return urlencode(sorted((name, str(value)) for name, value in values.items()))


#: How an action reads on a page where its name does not (``pause_schedule``: "pause schedule").
LABELS = {"run_schedule": "run now"}


def label(action: str) -> str:
    """An action's name as a page says it."""
    return LABELS.get(action, action.replace("_", " "))


def thousands(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets; a port after it is ignored) is this
    machine only."""
    if not host:
        return False
    name = host
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":")[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
