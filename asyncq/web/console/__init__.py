"""The operator's console: an overview of every queue (throughput, failures and depth over time from samples kept in
the store), every job findable and its whole story on one page, the dead jobs by reason and error type, the workers
holding leases, and the audit of every operator action; retry, cancel, delete, pause and resume, and a job's
priority, one at a time or in bulk, each bulk action on a previewed set only (docs/console.md).

Serve it alone with ``asyncq dashboard --db …``, or mount it in an app::

    console = ConsoleApp(queue, ConsoleSettings(resolver=TokenRoles({"operator": token})))
    aiohttp_app.add_subapp("/ops", console_aiohttp(console))      # aiohttp
    fastapi_app.mount("/ops", console_asgi(console))               # FastAPI / Starlette (any ASGI app)
"""

from __future__ import annotations

from asyncq.core.operations import ADMIN, OPERATOR, READ_ONLY
from asyncq.web.console.adapters import AsgiConsole, aiohttp_app
from asyncq.web.console.app import ConsoleApp
from asyncq.web.console.auth import HeaderRoles, Identity, TokenRoles
from asyncq.web.console.http import Request
from asyncq.web.console.settings import ConsoleSettings

console_aiohttp = aiohttp_app
console_asgi = AsgiConsole

__all__ = [
    "ADMIN",
    "OPERATOR",
    "READ_ONLY",
    "AsgiConsole",
    "ConsoleApp",
    "ConsoleSettings",
    "HeaderRoles",
    "Identity",
    "Request",
    "TokenRoles",
    "console_aiohttp",
    "console_asgi",
]
