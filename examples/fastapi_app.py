"""A FastAPI app with asyncq tasks: the queue opens with the app, a worker runs in the same process, and a signup
row and its welcome email's job commit together. The operator's console is mounted at ``/ops`` (read-only unless
``ASYNCQ_CONSOLE_OPERATOR_TOKEN`` or ``ASYNCQ_CONSOLE_ADMIN_TOKEN`` is set: then sign in with it). Run
``uvicorn examples.fastapi_app:api`` (``ASYNCQ_DB`` names the file, default ``app.db``), or ``asyncq worker
examples.fastapi_app:tasks --db app.db`` as separate workers (then pass ``worker=False`` to the lifespan).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import asyncq
from asyncq.web.console import ConsoleApp, ConsoleSettings, TokenRoles, console_asgi

tasks = asyncq.App()


class Signup(BaseModel):
    email: str


class Welcome(BaseModel):
    email: str
    message: str


@tasks.task(queue="emails", max_attempts=5, timeout=30.0)
async def send_welcome(email: str) -> Welcome:
    """Send the welcome email (here: compose it) and say what was sent."""
    return Welcome(email=email, message=f"Welcome aboard, {email}!")


queue_lifespan = tasks.lifespan(os.environ.get("ASYNCQ_DB", "app.db"), worker=True, concurrency=8)
tokens = {
    role: os.environ[f"ASYNCQ_CONSOLE_{role.upper()}_TOKEN"]
    for role in ("operator", "admin")
    if os.environ.get(f"ASYNCQ_CONSOLE_{role.upper()}_TOKEN")
}
# Loopback host names only; served under a real name, add allow_remote=True (it needs the tokens: a resolver).
console = ConsoleApp(lambda: api.state.queue, ConsoleSettings(resolver=TokenRoles(tokens) if tokens else None))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """The queue and its worker, then the console over that queue (its sampler stops first)."""
    async with queue_lifespan(app) as state, console:
        yield state


api = FastAPI(lifespan=lifespan)
api.mount("/ops", console_asgi(console))


def queue_of(request: Request) -> asyncq.Queue:
    queue: asyncq.Queue = request.app.state.queue
    return queue


@api.post("/signups", status_code=202)
async def sign_up(signup: Signup, request: Request) -> dict[str, str]:
    """Store the signup and defer its welcome email in one transaction: both or neither."""
    async with queue_of(request).transaction() as tx:
        await tx.execute("CREATE TABLE IF NOT EXISTS signups (email TEXT PRIMARY KEY)")
        await tx.execute("INSERT OR IGNORE INTO signups VALUES (?)", [signup.email])
        key = "welcome-" + hashlib.sha256(signup.email.encode()).hexdigest()[:32]  # one welcome per address
        job = await send_welcome.using(key=key).defer(tx, email=signup.email)
    return {"job": job.id}


@api.get("/jobs/{job_id}")
async def job_result(job_id: str, request: Request, wait: float = 5.0) -> Welcome:
    """The welcome a job sent, waiting up to ``wait`` seconds for it."""
    try:
        job = send_welcome.job(queue_of(request), job_id)
        return await job.result(timeout=min(wait, 30.0))
    except TimeoutError:
        raise HTTPException(status_code=409, detail="not done yet") from None
    except asyncq.JobFailed as error:
        raise HTTPException(status_code=500, detail=str(error)) from None
    except (LookupError, ValueError):  # ValueError: not a job id at all
        raise HTTPException(status_code=404, detail="no such job") from None
