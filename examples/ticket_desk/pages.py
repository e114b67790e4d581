"""Nightjar's pages as server-rendered HTML. Every name a guest typed is escaped: the name is data."""

from __future__ import annotations

from html import escape

from store import Registration, Ticket

STYLE = """
body { font-family: Georgia, serif; max-width: 40rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d2b; }
nav a { margin-right: 1rem; } .ticket { border: 2px dashed #1d1d2b; padding: 1rem; }
.pending { color: #8a4b00; } .error { color: #a00000; } label, input, button { font-size: 1rem; }
"""


def layout(title: str, body: str) -> str:
    """A whole page: the site's navigation, then ``body``."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · Nightjar</title>
<style>{STYLE}</style></head>
<body>
<nav><a href="/">Nightjar</a> <a href="/explore">Explore the evening</a> <a href="/evening">The evening</a>
<a href="/registrations">Your registrations</a></nav>
<main>
{body}
</main>
</body></html>
"""


def home() -> str:
    """Nightjar Print Studio's front page."""
    return layout(
        "Nightjar Print Studio",
        """<h1>Nightjar Print Studio</h1>
<p>An evening workshop of letterpress and relief printing in our studio by the canal.</p>
<p><a href="/explore">Explore the evening</a></p>""",
    )


def explore() -> str:
    """What happens during the evening."""
    return layout(
        "Explore the evening",
        """<h1>Explore the evening</h1>
<p>Set your own line of type, ink the press and pull a print to take home. Aprons, paper and tea are
provided; no experience is needed.</p>
<p><a href="/visit">Plan your visit</a></p>""",
    )


def visit() -> str:
    """Practical details for the visit."""
    return layout(
        "Plan your visit",
        """<h1>Plan your visit</h1>
<p>Doors open at 18:30 and printing starts at 19:00. Bring your ticket on your phone or on paper.</p>
<p><a href="/evening">The evening</a></p>""",
    )


def evening(error: str = "", name: str = "") -> str:
    """The workshop page with the registration form."""
    message = f'<p class="error">{escape(error)}</p>' if error else ""
    return layout(
        "The evening",
        f"""<h1>The evening</h1>
<p>One evening, one press each, one print to take home.</p>
{message}
<form method="post" action="/registrations">
<label for="name">Guest name</label>
<input id="name" name="name" maxlength="100" required value="{escape(name)}">
<button type="submit">Register for the evening</button>
</form>""",
    )


def registration_list(items: list[Registration]) -> str:
    """Every registration with its state."""
    rows = "\n".join(
        f'<li><a href="/registrations/{escape(r.id)}">{escape(r.id)} {escape(r.name)}</a> '
        f"({'ticket ready' if r.ticket_numbers else 'ticket being prepared'})</li>"
        for r in items
    )
    return layout("Your registrations", f"<h1>Your registrations</h1>\n<ul>\n{rows}\n</ul>")


def registration_page(item: Registration) -> str:
    """One registration: its id, and its ticket once it exists."""
    if item.ticket_numbers:
        links = "\n".join(
            f'<li><a href="/tickets/{number}">Open ticket</a> (ticket {number})</li>' for number in item.ticket_numbers
        )
        state = f"<ul>\n{links}\n</ul>"
    else:
        state = '<p class="pending">Your ticket is being prepared</p>'
    return layout(
        f"Registration {item.id}",
        f"""<h1>Registration {escape(item.id)}</h1>
<p>Guest name: <strong>{escape(item.name)}</strong></p>
{state}
<p><a href="/registrations">Your registrations</a></p>""",
    )


def ticket_page(item: Ticket) -> str:
    """One ticket, with its download."""
    return layout(
        f"Ticket {item.ticket_no}",
        f"""<h1>Your ticket</h1>
<div class="ticket"><p>Nightjar Print Studio · The evening</p>
<p>Registration <strong>{escape(item.registration_id)}</strong></p>
<p>Guest <strong>{escape(item.name)}</strong></p><p>Ticket {item.ticket_no}</p></div>
<p><a href="/tickets/{item.ticket_no}/download" download>Download ticket</a></p>
<p><a href="/registrations/{escape(item.registration_id)}">Back to registration</a></p>""",
    )


def ticket_text(item: Ticket) -> str:
    """The downloadable ticket: a text file with the registration id and the name."""
    return (
        "Nightjar Print Studio - The evening\n"
        f"Registration: {item.registration_id}\n"
        f"Name: {item.name}\n"
        f"Ticket: {item.ticket_no}\n"
    )


def not_found(what: str) -> str:
    """A page for an id that does not exist."""
    return layout("Not found", f"<h1>Not found</h1><p>{escape(what)}</p>")
