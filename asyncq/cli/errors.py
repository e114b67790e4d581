"""The ``asyncq`` command's own errors: each is printed as one line ``asyncq: error: …`` (never a traceback), and
its ``code`` is the exit status."""

from __future__ import annotations


class CliError(Exception):
    """A command that failed (exit status 1): a missing job, a state that forbids the change, bad input data."""

    code = 1


class UsageError(CliError):
    """A command line that cannot work (exit status 2), whether argparse or the command found it."""

    code = 2
