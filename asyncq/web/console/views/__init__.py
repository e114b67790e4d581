"""The console's screens and routes: one module per screen (its page, and the live region that server-sent events and
polling refresh), the actions (preview, act), the live streams, and sign-in.

``SCREENS`` is the navigation. A screen is a module here with its page, a template, an entry in ``SCREENS`` and its
routes in ``ROUTES``; its live region joins ``live.VIEWS``. A job's graph (what it waits for, what waits for it, its
group) is ``graph``'s, shown on its page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncq.web.console.auth import TokenRoles
from asyncq.web.console.http import Response, Route, redirect, route
from asyncq.web.console.views import actions, audit, dead, groups, job, jobs, live, misc, overview, schedules, workers

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

#: The navigation: (key, path, label).
SCREENS = (
    ("overview", "/", "Overview"),
    ("jobs", "/jobs", "Jobs"),
    ("dead", "/dead", "Dead"),
    ("schedules", "/schedules", "Schedules"),
    ("groups", "/groups", "Groups"),
    ("workers", "/workers", "Workers"),
    ("audit", "/audit", "Audit"),
)

_ID = r"(?P<job_id>[A-Za-z0-9_-]{1,64})"
ROUTES: list[Route] = [
    route("GET", "/", overview.page),
    route("GET", "/jobs", jobs.page),
    route("GET", f"/jobs/{_ID}", job.page),
    route("GET", "/dead", dead.page),
    route("GET", "/schedules", schedules.page),
    route("GET", "/groups", groups.page),
    route("GET", r"/groups/(?P<name>[A-Za-z0-9_-]{1,58})", groups.group_page),
    route("GET", "/workers", workers.page),
    route("GET", "/audit", audit.page),
    route("GET", r"/audit/(?P<seq>[0-9]{1,18})", audit.entry_page),
    route("POST", "/preview", actions.preview),
    route("POST", "/act", actions.act),
    route("GET", "/events", live.events),
    route("GET", r"/fragment/(?P<view>[a-z]{1,20})", live.fragment),
    route("GET", "/stats.json", misc.stats_json),
    route("GET", "/login", misc.login_page),
    route("POST", "/login", misc.login),
    route("POST", "/logout", misc.logout),
    route("GET", r"/static/(?P<name>[a-z0-9_-]{1,40}\.[a-z]{1,4})", misc.static),
]
#: What answers without a role (signing in, and the assets its page needs).
OPEN = frozenset({misc.login_page, misc.login, misc.logout, misc.static})


def sign_in_first(ctx: Ctx) -> Response:
    """A request with no role: to the sign-in page when the console has one (a script or a live region gets 401),
    else a page saying that the app's resolver gave no role."""
    page = ctx.request.method == "GET" and not ctx.request.path.startswith(("/events", "/fragment", "/stats"))
    if isinstance(ctx.app.settings.resolver, TokenRoles):
        if page:
            return redirect(ctx.request.url("/login"))
        return Response(401, b"sign in first", "text/plain; charset=utf-8")
    return ctx.message("No access", f"{ctx.identity.actor} has no role here: nothing is shown", 401)
