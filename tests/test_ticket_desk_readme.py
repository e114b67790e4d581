"""The ticket desk's README, followed as a learner follows it: every command of its ``sh`` blocks, in order,
from ``python3 desk.py reset`` to the end, on the real site, broker and store, with the browser steps of
its prose in between; the output of each block is compared with the ``text`` block the README shows after
it (``…`` stands for any text, alone on a line for any lines). A command the README adds, drops or
reorders fails the walk until this test follows it too."""

from __future__ import annotations

import re
import shlex
import subprocess
import urllib.parse
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rabbit_support import amqp_url
from ticket_desk_support import SOURCE, Child, TicketDesk

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(180)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest

SETUP = (". .venv/bin/activate", "cd examples/ticket_desk")  # the learner's shell; the test runs in the folder
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\n", re.S | re.M)


@dataclass
class Step:
    """One command of the README: whether it opens its ``sh`` block, and, for a block's last command, the
    ``text`` block the README shows after it."""

    command: str
    first: bool
    shown: str | None


def readme_steps(readme: str) -> list[Step]:
    """The commands of every ``sh`` block in order (a here-document is one command)."""
    blocks = BLOCK.findall(readme)
    steps: list[Step] = []
    for n, (kind, body) in enumerate(blocks):
        if kind != "sh":
            continue
        commands = [command for command in split_commands(body) if command not in SETUP]
        following = blocks[n + 1] if n + 1 < len(blocks) else ("", "")
        shown = following[1] if following[0] == "text" else None
        last = len(commands) - 1
        steps += [Step(command, i == 0, shown if i == last else None) for i, command in enumerate(commands)]
    return steps


def split_commands(body: str) -> list[str]:
    """The commands of one ``sh`` block, without their ``# comments``; a here-document stays whole."""
    commands: list[str] = []
    lines = iter(body.splitlines())
    for line in lines:
        if "<<'PYTHON'" in line:
            document = [line]
            for more in lines:
                document.append(more)
                if more == "PYTHON":
                    break
            commands.append("\n".join(document))
        elif line.strip():
            commands.append(re.sub(r"\s+#.*$", "", line).strip())
    return commands


def matches(shown: str, lines: list[str], queue: str) -> bool:
    """Whether ``lines`` are what the README shows, ``…`` standing for any text (alone: any lines)."""
    pattern = ""
    for line in shown.replace("nightjar.registrations", queue).splitlines():
        pattern += "(?:.*\n)*?" if line == "…" else ".*".join(map(re.escape, line.split("…"))) + "\n"
    return re.fullmatch(pattern, "".join(line + "\n" for line in lines)) is not None


class Walk:
    """Takes the README's commands one by one; each must be the one the test expects next."""

    def __init__(self, desk: TicketDesk) -> None:
        self.desk = desk
        self.steps = deque(readme_steps((SOURCE / "README.md").read_text()))
        self.output: list[str] = []  # of the current sh block so far
        self.last_code = 0
        self._step: Step | None = None

    def _next(self, command: str) -> Step:
        assert self.steps, f"the README ends before {command!r}"
        step = self._step = self.steps.popleft()
        assert step.command.split("\n")[0] == command, f"README: {step.command!r}, test: {command!r}"
        if step.first:
            self.output = []
        return step

    def check(self, lines: list[str]) -> None:
        """Add ``lines`` to the block's output; after the block's last command, compare it with the README."""
        assert self._step is not None
        self.output += lines
        if self._step.shown is not None:
            shown, got = self._step.shown, "\n".join(self.output)
            assert matches(shown, self.output, self.desk.queue), f"README shows:\n{shown}\ngot:\n{got}"

    def run(self, command: str) -> list[str]:
        """Run the README's next command, which must be ``command`` (a here-document by its first line)."""
        step = self._next(command)
        if step.command == "echo $?":
            lines = [str(self.last_code)]
        elif step.command.startswith("python3 "):
            script, *args = shlex.split(step.command)[1:]
            done = self.desk.run(script, *args)
            self.last_code, lines = done.code, done.lines
            assert done.code == 0, (step.command, done)
        else:  # pwd, cat, a here-document: the learner's shell
            shell = subprocess.run(["bash", "-c", step.command], cwd=self.desk.folder, capture_output=True, text=True)
            assert shell.returncode == 0, shell.stderr
            lines = shell.stdout.splitlines()
        self.check(lines)
        return lines

    def start(self, command: str, until: str) -> Child:
        """Start the README's next command, a long-running one, and wait for its line ``until``; the test
        then calls :meth:`check` with what it printed."""
        script, *args = shlex.split(self._next(command).command)[1:]
        child = self.desk.start(script, *args)
        child.expect(until)
        return child

    def interrupt(self, child: Child, code: int = 130) -> str:
        """Ctrl+C, as the prose says; the child's stderr."""
        self.last_code = child.interrupt()
        assert self.last_code == code, child.stderr()
        return child.stderr()

    def site(self) -> None:
        """``python3 app.py``: the site, on a free port instead of 8080."""
        self._next("python3 app.py")
        self.desk.start_site()

    def done(self) -> None:
        """Every command of the README was taken."""
        assert not self.steps, f"README commands the walk did not take: {[s.command for s in self.steps]}"


def quoted_in_readme(line: str) -> bool:
    """Whether the README's prose quotes ``line`` exactly (in backquotes, however it is wrapped)."""
    prose = " ".join((SOURCE / "README.md").read_text().split())
    return f"`{line}`" in prose


def ticket_links(page: str) -> list[str]:
    """The "Open ticket" links of a registration page."""
    return re.findall(r'<a href="(/tickets/\d+)">Open ticket</a>', page)


def one_ticket(desk: TicketDesk, registration_id: str, name: str) -> None:
    """The registration's page links one ticket, whose download names the registration and the guest."""
    (link,) = ticket_links(desk.get(f"/registrations/{registration_id}"))
    text = desk.get(link + "/download")
    assert f"Registration: {registration_id}" in text and f"Name: {name}" in text


@pytest.fixture
def walk(tmp_path: Path, amqp_url: str) -> Iterator[Walk]:
    """A desk in a copy of the folder whose site gives up a blocked write after 2 s, and its README."""
    desk = TicketDesk(tmp_path, amqp_url)
    desk.env["TICKET_DESK_BUSY_TIMEOUT"] = "2"
    try:
        yield Walk(desk)
    finally:
        desk.close()


def start_and_follow_a_registration(walk: Walk) -> None:
    """Steps 0 and 1: reset, the site, Normal guest through the ack-first handler."""
    desk = walk.desk
    walk.run("python3 desk.py reset")
    assert (desk.folder / "handler.py").read_text() == (desk.folder / "handler_ack_first.py").read_text()
    walk.site()
    assert "Explore the evening" in desk.get("/") and "Plan your visit" in desk.get("/explore")
    assert "The evening" in desk.get("/visit") and "Register for the evening" in desk.get("/evening")
    registration_id, page = desk.register("Normal guest")
    assert registration_id == "R-0002" and "Your ticket is being prepared" in page
    assert "Mina Patel" in desk.get("/registrations")
    walk.run("pwd")
    walk.run("cat handler.py")
    walk.run("python3 worker.py")
    one_ticket(desk, "R-0002", "Normal guest")
    one_ticket(desk, "R-0001", "Mina Patel")


def acknowledge_only_completed_work(walk: Walk) -> None:
    """Step 2: the second block; Retry guest stopped before its write, then redelivered."""
    desk = walk.desk
    walk.run("cat > handler.py <<'PYTHON'")
    assert (desk.folder / "handler.py").read_text() == (desk.folder / "handler_no_key.py").read_text()
    assert desk.register("Retry guest")[0] == "R-0003"
    worker = walk.start("python3 worker.py --pause before-write", "Paused before-write.")
    walk.check(worker.lines)
    (line,) = walk.interrupt(worker).splitlines()
    assert quoted_in_readme(line), line
    walk.run("echo $?")
    assert "Your ticket is being prepared" in desk.get("/registrations/R-0003")
    desk.wait_for_counts(1, 0)
    walk.run("python3 worker.py")
    one_ticket(desk, "R-0003", "Retry guest")


def stop_inside_the_transaction(walk: Walk) -> None:
    """Step 3, first half: the shipped handler; R-0004 stopped inside its transaction, the site still up."""
    desk = walk.desk
    walk.run("cat > handler.py <<'PYTHON'")
    assert (desk.folder / "handler.py").read_text() == (SOURCE / "handler.py").read_text()  # the shipped one
    assert [desk.register("Same name")[0] for _ in range(2)] == ["R-0004", "R-0005"]
    worker = walk.start("python3 worker.py --pause inside-transaction", "Paused inside-transaction.")
    walk.check(worker.lines)
    assert "Your ticket is being prepared" in desk.get("/registrations/R-0004")
    assert desk.desk("status").code == 0
    status, page, _ = desk.fetch("/registrations", urllib.parse.urlencode({"name": "Eager guest"}).encode())
    assert status == 503 and 'value="Eager guest"' in page
    line = walk.interrupt(worker).strip()
    assert line.startswith("Interrupted; R-0004 was not acknowledged, ")
    assert line.endswith(" Its open SQLite transaction is rolled back: nothing it wrote is kept.")
    desk.wait_for_counts(2, 0)
    walk.run("python3 desk.py status")


def repeat_safely(walk: Walk) -> None:
    """Step 3, second half: stopped after commit, redelivered, drained, retried: one ticket each."""
    desk = walk.desk
    worker = walk.start("python3 worker.py --pause after-commit", "Paused after-commit.")
    walk.check(worker.lines)
    one_ticket(desk, "R-0004", "Same name")
    walk.interrupt(worker)
    desk.wait_for_counts(2, 0)
    walk.run("python3 worker.py")
    walk.run("python3 worker.py --drain")
    walk.run("python3 desk.py retry R-0004")
    walk.run("python3 worker.py --drain")
    for registration_id, name in [("R-0001", "Mina Patel"), ("R-0002", "Normal guest"), ("R-0003", "Retry guest")]:
        one_ticket(desk, registration_id, name)
    one_ticket(desk, "R-0004", "Same name")
    one_ticket(desk, "R-0005", "Same name")
    walk.run("python3 desk.py status")


def repair_then_retry(walk: Walk) -> None:
    """Step 4: the ids ticketed before the fix get their completion keys; then a retry is harmless."""
    walk.run("python3 desk.py repair R-0002")
    walk.run("python3 desk.py repair R-0002 --apply")
    walk.run("python3 desk.py repair R-0003 --apply")
    walk.run("python3 desk.py retry R-0002")
    walk.run("python3 worker.py --drain")
    assert walk.desk.tickets("R-0002") == [(2, "Normal guest")]
    assert walk.desk.completed("R-0002") and walk.desk.completed("R-0003")


def the_consumer(walk: Walk) -> None:
    """Step 5: consumer.py acknowledges R-0004, which handler.py ticketed, without a second ticket."""
    walk.run("python3 desk.py retry R-0004")
    consumer = walk.start("python3 consumer.py --verbose", "R-0004 ")
    walk.desk.wait_for_counts(0, 0)
    walk.interrupt(consumer, code=0)
    walk.check(consumer.lines)
    assert walk.desk.tickets("R-0004") == [(4, "Same name")]


def replay_the_original_mistake(walk: Walk) -> None:
    """Step 6: reset again; the ack-first handler stopped before its write loses the ticket."""
    desk = walk.desk
    walk.run("python3 desk.py reset")
    assert desk.register("Lost guest")[0] == "R-0002"
    worker = walk.start("python3 worker.py --pause before-write", "Paused before-write.")
    walk.check(worker.lines)
    (line,) = walk.interrupt(worker).splitlines()
    assert quoted_in_readme(line), line
    desk.wait_for_counts(0, 0)
    walk.run("python3 desk.py status")
    assert desk.tickets("R-0002") == []


def test_the_readme_walks_the_whole_seed_from_the_reset_command(walk: Walk) -> None:
    start_and_follow_a_registration(walk)
    acknowledge_only_completed_work(walk)
    stop_inside_the_transaction(walk)
    repeat_safely(walk)
    repair_then_retry(walk)
    the_consumer(walk)
    replay_the_original_mistake(walk)
    walk.done()


def test_the_readmes_blocks_are_the_seeds_and_the_shipped_handlers() -> None:
    """The second block is ``handler_no_key.py``, the third the shipped ``handler.py``, both indented."""
    readme = (SOURCE / "README.md").read_text()
    documents = [step.command for step in readme_steps(readme) if step.command.startswith("cat > handler.py")]
    bodies = [document.split("\n", 1)[1].rsplit("\n", 1)[0] + "\n" for document in documents]
    assert bodies == [(SOURCE / name).read_text() for name in ("handler_no_key.py", "handler.py")]
    assert all("\n    with db:\n" in body for body in bodies)
