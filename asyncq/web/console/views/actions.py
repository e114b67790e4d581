"""The console's actions: ``POST /preview`` finds the set an action would act on (the selected jobs, everything a
filter finds, or the queues named) and shows its count and a sample, with a form to confirm it; ``POST /act``
carries the action out on that set only. A single job's or queue's button posts to ``/act`` directly, pinned to
the state its page showed. The operator types the count to confirm a bulk set; the store refuses a set that
changed since the preview (``SetChanged``), and nothing changes. A role that may not take the action is refused
before anything is read."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncq.core.limits import MAX_TTL_MS
from asyncq.core.operations import (
    ACTION_ROLES,
    ACTIONS,
    JOB_ACTIONS,
    PRIORITY,
    QUEUE_ACTIONS,
    SCHEDULE_ACTIONS,
    Operation,
    check_queue_names,
    check_schedule_names,
)
from asyncq.core.search import JobQuery
from asyncq.core.values import check_choice, check_priority, duration_ms
from asyncq.errors import SetChanged, UniqueConflict
from asyncq.web.console import forms
from asyncq.web.console.http import Response, redirect

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

log = logging.getLogger("asyncq.web.console")


def _action(ctx: Ctx) -> str:
    return check_choice(ctx.request.field("action"), "action", ACTIONS)


def _names(ctx: Ctx, field: str) -> tuple[str, ...]:
    """The names a form lists in ``field`` (spaces or commas between them), each once."""
    return tuple(dict.fromkeys(name for value in ctx.request.fields(field) for name in value.replace(",", " ").split()))


def _queues(ctx: Ctx) -> tuple[str, ...]:
    return check_queue_names(_names(ctx, "queues"))


def _schedules(ctx: Ctx) -> tuple[str, ...]:
    return check_schedule_names(_names(ctx, "schedules"))


def _priority(ctx: Ctx, action: str) -> int | None:
    if action != PRIORITY:
        return None
    text = ctx.request.field("new_priority")
    try:
        return check_priority(int(text or ""))
    except (TypeError, ValueError):
        raise ValueError("priority must be a whole number from -100 to 100") from None


def _refused_role(ctx: Ctx, action: str) -> Response | None:
    if ctx.identity.may(action):
        return None
    role = ctx.identity.role or "no role"
    text = f"{ctx.identity.actor} ({role}) may not {action}: it needs the {ACTION_ROLES[action]} role. Nothing changed"
    return ctx.message("Refused", text, 403)


async def preview(ctx: Ctx) -> Response:
    """The set an action would act on now, and the form that confirms it."""
    try:
        action = _action(ctx)
        refused = _refused_role(ctx, action)
        if refused is not None:
            return refused
        priority = _priority(ctx, action)
        if action in QUEUE_ACTIONS:
            found = await ctx.console.preview(action, queues=_queues(ctx))
        elif action in SCHEDULE_ACTIONS:
            found = await ctx.console.preview(action, schedules=_schedules(ctx))
        else:
            found = await ctx.console.preview(action, forms.job_query(ctx.request.field))
    except ValueError as error:
        return ctx.message("Nothing to preview", f"{error}: nothing changed", 400)
    return ctx.render("preview.html", preview=found, priority=priority, fields=forms.filter_fields(found.query))


async def act(ctx: Ctx) -> Response:
    """Carry out a confirmed action on its previewed set: to its audit entry, or a page saying why nothing changed."""
    try:
        action = _action(ctx)
        refused = _refused_role(ctx, action)
        if refused is not None:
            return refused
        operation = _operation(ctx, action)
    except ValueError as error:
        return ctx.message("Not done", f"{error}: nothing changed", 400)
    try:
        entry = await ctx.console.operate(operation)
    except SetChanged as changed:
        return ctx.render("changed.html", 409, error=str(changed), operation=operation,
                          fields=forms.filter_fields(operation.query))  # fmt: skip
    except UniqueConflict as conflict:
        return ctx.message("Not done", f"{conflict}: nothing changed", 409)
    except ValueError as error:
        return ctx.message("Not done", f"{error}: nothing changed", 400)
    log.info("console: %s (%s) %s %d: %s", entry.actor, entry.role, entry.action, entry.count, entry.note)
    return redirect(ctx.request.url(f"/audit/{entry.seq}"))


def _operation(ctx: Ctx, action: str) -> Operation:
    """The operation the confirm form describes (``ValueError`` for what does not fit, or a count mistyped)."""
    field = ctx.request.field
    count = forms.typed_count(field("count"))
    if forms.typed_count(field("confirm")) != count:
        raise ValueError(f"the count typed to confirm is not the set's ({count})")
    note = field("note")
    if note is None:
        raise ValueError("a note is needed: say why")
    queues = _queues(ctx) if action in QUEUE_ACTIONS else ()
    schedules = _schedules(ctx) if action in SCHEDULE_ACTIONS else ()
    query = forms.job_query(field) if action in JOB_ACTIONS else JobQuery()
    ttl = field("ttl_hours")
    ttl_ms = duration_ms(float(ttl) * 3600, "ttl", 0, 1, MAX_TTL_MS) if ttl else 86_400_000
    return Operation(
        action, count, field("digest") or "", ctx.identity.actor, ctx.identity.role or "", note, query, queues,
        _priority(ctx, action), ttl_ms, schedules,
    ).checked()  # fmt: skip
