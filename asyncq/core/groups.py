"""Groups of jobs with a completion callback: the values and rules every store shares (no I/O here;
``docs/dependencies.md`` states the guarantees).

A group is a row with counters: ``members`` (jobs enqueued with ``group=``), ``done`` and ``dead`` (members that
ended so), ``sealed_at`` (no member may join after) and ``completed_at``. Sealing stores the callback job
``waiting`` under an id derived from the group (``group_callback_id``): reserved at the seal, so a clash is the sealer's
``Conflict``, never a worker's. The transaction that ends the last member of a sealed group (or that seals a group
whose members have all ended) completes it (``is_complete``: a compare-and-set on ``completed_at``, so once) and
releases the callback with the group's outcome in its body (``callback_body``). The counters stand still from then
on: a member redriven after completion counts nowhere; one redriven before is taken off ``dead`` again.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from asyncq.core.jsontext import canonical_json
from asyncq.core.limits import MAX_GROUP_NAME_CHARS

_GROUP_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_GROUP_NAME_CHARS}}}")
#: The prefix of a group callback's id.
CALLBACK_PREFIX = "group-"
#: Where the outcome goes in a callback's body: this key of its ``args`` object (a task's body), else of the body.
OUTCOME_KEY = "group"


def check_group_name(value: object, name: str = "group") -> str:
    """``value`` if it is a group's name: an exact ``str`` of 1-58 ASCII letters, digits, ``_`` or ``-``."""
    if type(value) is not str or _GROUP_NAME.fullmatch(value) is None:
        raise ValueError(f"{name} must be a str of 1-{MAX_GROUP_NAME_CHARS} ASCII letters, digits, '_' or '-'")
    return value


def group_callback_id(group: str) -> str:
    """The id of ``group``'s callback job: the same in every process, so it is inserted (and runs) once."""
    return CALLBACK_PREFIX + group


@dataclass(frozen=True)
class GroupOutcome:
    """What a group's callback receives (under ``group`` in its body; a task's ``group`` argument): how many members
    the group has and how many ended done and dead. The member ids: ``Queue.group_members(name, status=…)``."""

    name: str
    members: int
    done: int
    dead: int


@dataclass(frozen=True)
class Group:
    """A group as stored: its counters, when it was created, sealed and completed, and its callback job's id and
    status (``None``: no callback, or the job was removed by prune after it ended)."""

    name: str
    members: int
    done: int
    dead: int
    created_at: int
    sealed_at: int | None
    completed_at: int | None
    callback_id: str | None
    callback_status: str | None = None

    @property
    def sealed(self) -> bool:
        return self.sealed_at is not None

    @property
    def complete(self) -> bool:
        return self.completed_at is not None

    @property
    def running(self) -> int:
        """Members that have not ended yet."""
        return self.members - self.done - self.dead

    @property
    def outcome(self) -> GroupOutcome:
        return GroupOutcome(self.name, self.members, self.done, self.dead)


def is_complete(members: int, done: int, dead: int, sealed: bool) -> bool:
    """Whether a group with these counters is complete: sealed, and every member ended. The one rule: every store's
    completion statement is a compare-and-set on exactly it."""
    return sealed and done + dead >= members


def check_callback_body(body: object) -> None:
    """A callback's body must be a JSON object (its outcome goes in it): ``ValueError`` otherwise."""
    if type(body) is not dict:
        raise ValueError(f"a group's callback body must be a JSON object, not {type(body).__name__}")


def callback_body(template: Any, outcome: GroupOutcome) -> str:
    """The callback's body once its group completed (canonical JSON): ``template`` (the body stored at the seal,
    decoded) with the outcome under ``group``, inside its ``args`` object if it has one (a task's body)."""
    body = dict(template)
    args = body.get("args")
    if isinstance(args, dict):
        body["args"] = {**args, OUTCOME_KEY: asdict(outcome)}
    else:
        body[OUTCOME_KEY] = asdict(outcome)
    return canonical_json(body)
