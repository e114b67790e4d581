"""The console mounted in an app and started from the command line: an aiohttp sub-app (every link and cookie under
its prefix), roles from a reverse proxy's headers or the app's own resolver, the console opening a queue by path,
and ``asyncq dashboard``: its banner, its refusals in one line with exit status 2, serving until SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_support import cli_env, run_cli
from console_support import T0, Client, dump, seed, serving

from asyncq.queue import Queue
from asyncq.web.console import ConsoleApp, ConsoleSettings, HeaderRoles, Identity, Request

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[Queue]:
    async with await Queue.open(tmp_path / "queue.db", clock=lambda: T0) as opened:
        await seed(opened)
        yield opened


async def test_as_an_aiohttp_sub_app_every_link_and_cookie_is_under_its_prefix(queue: Queue) -> None:
    async with serving(queue, mount="/ops") as (base, _console), Client(base) as client:
        page = await client.get("/jobs")
        assert page.status == 200
        links = re.findall(r'(?:href|action|data-events|data-fragment)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/ops/") for link in links), links
        assert "Path=/ops" in page.headers["Set-Cookie"]
        assert (await client.get("/static/console.css")).status == 200


async def test_roles_from_a_reverse_proxys_headers(queue: Queue) -> None:
    settings = ConsoleSettings(resolver=HeaderRoles(role_header="X-Asyncq-Role"), sample_seconds=None)
    async with serving(queue, settings) as (base, _console), Client(base) as client:
        nobody = await client.get("/")
        assert nobody.status == 401 and "no role here" in nobody.text
        proxied = {"X-Forwarded-User": "olga@example.org", "X-Asyncq-Role": "operator"}
        page = await client.get("/", **proxied)
        assert page.cell("who").startswith("olga@example.org") and page.cell("role") == "operator"
        preview = await client.post("/preview", {"csrf": page.csrf(), "action": "pause", "queues": "web"}, **proxied)
        assert preview.status == 200
        form = {"csrf": page.csrf(), "action": "pause", "queues": "web", "count": "1", "confirm": "1", "note": "x"}
        form["digest"] = preview.field("digest", "confirm")
        assert (await client.post("/act", form, **proxied)).status == 303
        [paused] = await queue.paused_queues()
        assert (paused.queue, paused.paused_by) == ("web", "olga@example.org")
        unknown = await client.get("/", **{"X-Forwarded-User": "mallory", "X-Asyncq-Role": "root"})
        assert unknown.status == 401


async def test_an_apps_own_resolver_names_the_actor_and_role(queue: Queue) -> None:
    async def resolver(request: Request) -> Identity | None:
        key = request.headers.get("x-api-key")
        return Identity("deploy-bot", "admin") if key == "k-1" else None

    settings = ConsoleSettings(resolver=resolver, sample_seconds=None)
    async with serving(queue, settings) as (base, _console), Client(base) as client:
        assert (await client.get("/")).status == 401
        page = await client.get("/jobs/m-done", **{"X-Api-Key": "k-1"})
        assert page.cell("role") == "admin" and 'id="act-delete"' in page.text


async def test_a_console_given_a_path_opens_the_existing_queue_and_closes_it(queue: Queue, tmp_path: Path) -> None:
    async with serving(str(queue.path)) as (base, console), Client(base) as client:
        assert (await client.get("/")).cell("count-dead") == "4"
        assert console.console.queue is not queue
    missing = ConsoleApp(str(tmp_path / "missing.db"), ConsoleSettings(sample_seconds=None))
    answer = await missing.handle(Request("GET", "/", host="127.0.0.1"))
    assert answer.status == 503 and b"no such queue file" in answer.body
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(TypeError):
        ConsoleApp(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="refresh_seconds"):
        ConsoleSettings(refresh_seconds=0).checked()


REFUSALS = [
    (["--host", "0.0.0.0"], "asyncq: error: refusing to bind 0.0.0.0, not a loopback address (add --allow-remote"),
    (["--host", "0.0.0.0", "--allow-remote"], "asyncq: error: refusing to serve 0.0.0.0 remotely without auth"),
    (["--allow-remote"], "asyncq: error: refusing to serve 127.0.0.1 remotely without auth"),
    (["--operator-token", "short"], "asyncq: error: the operator token must be a str of at least 16 characters"),
    (["--operator-token", "x" * 16, "--role-header", "X-Role"], "asyncq: error: give role tokens or --role-header"),
    (["--role-header", "X Role"], "asyncq: error: a header name is letters, digits and '-'"),
    (["--port", "70000"], "asyncq: error: argument --port: '70000' is not a whole number from 0 to 65535"),
    (["--sample-seconds", "0"], "asyncq: error: argument --sample-seconds: '0' is not a number of seconds"),
    (["--token", "old-flag"], "asyncq: error: unrecognized arguments: --token old-flag"),
]


def test_the_dashboard_command_refuses_bad_options_in_one_line(queue: Queue) -> None:
    folder = Path(queue.path).parent
    before = dump(queue.path)
    for args, message in REFUSALS:
        done = run_cli("dashboard", "--db", "queue.db", *args, cwd=folder)
        assert (done.returncode, done.stdout) == (2, ""), (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(message), line
    assert dump(queue.path) == before
    done = run_cli("dashboard", "--db", "missing.db", cwd=folder)
    assert (done.returncode, done.stderr) == (1, "asyncq: error: no such queue file: missing.db\n")
    assert not (folder / "missing.db").exists()


def test_the_dashboard_command_serves_the_console_until_sigint(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    assert run_cli("init", "--db", str(db), cwd=tmp_path).returncode == 0
    env = cli_env() | {"ASYNCQ_CONSOLE_ADMIN_TOKEN": "admin-token-0123456789"}
    command = [sys.executable, "-m", "asyncq", "dashboard", "--db", str(db), "--sample-seconds", "0.1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        assert process.stdout.readline().strip() == "access: sign in with a token for admin"
        import urllib.request

        with urllib.request.urlopen(url + "login", timeout=10) as response:
            assert response.status == 200 and "Sign in" in response.read().decode()
    finally:
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=20)
    assert process.returncode == 0 and err == ""
    assert os.path.exists(db)
