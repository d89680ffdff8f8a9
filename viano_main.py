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


def run() -> None:
    pressed: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: pressed.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        from viano_bug_analysis.cli import interrupted_at_start
        from viano_bug_analysis.cli import run as start
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pressed:
        sys.exit(interrupted_at_start(sys.argv[1:]))
    start()
