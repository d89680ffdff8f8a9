"""The ``viano`` console script's entry point, kept apart from the packages it starts.

Importing the command line takes a moment (trio, httpx, attrs, rich …). A Ctrl-C in that
moment would otherwise end the process with a traceback of whichever import it hit, and a
SIGTERM with nothing said (no JSON document under ``--json``). Here either is only noted
while the imports run, and then reported the way the command reports an interruption
(``interrupted``, exit 130; under ``--json`` one JSON document): nothing has been done yet.
Nothing but the standard library is imported before the handler is set.
"""

from __future__ import annotations

import signal
import sys


def _standard_streams_open() -> None:
    """A closed stdin, stdout or stderr (``viano … >&-``) is opened on /dev/null. Left
    closed, the next file the process opens takes its number, and whatever is printed
    then lands in that file: a store's database or blob, an export, an event log."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115


def run() -> None:
    _standard_streams_open()
    pressed: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: pressed.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        from viano_bug_analysis.cli import interrupted_at_start, terminate_as_ctrl_c
        from viano_bug_analysis.cli import run as start
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pressed:
        sys.exit(interrupted_at_start(sys.argv[1:]))
    # From here until the command sets its own (while it parses its arguments and reads
    # its configuration), a SIGTERM is a Ctrl-C too: with Python's default it ended the
    # process with exit 143 and nothing said, no JSON document under --json.
    if previous[signal.SIGTERM] in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, terminate_as_ctrl_c)
    start()
