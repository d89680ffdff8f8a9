"""The ``viano`` command line."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from engine import EXIT_INTERRUPTED, Config, VianoError

from ._commands import COMMANDS
from ._events import event_log
from ._output import Output
from ._parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Decided before parsing, so that a usage error under --json is a JSON document too.
    out = Output(as_json="--json" in argv)
    try:
        args = build_parser().parse_args(argv)
        out.as_json = bool(args.json)
        config = Config.resolve(args.config)
        with event_log(args.log_json):
            return COMMANDS[args.command](args, out, config)
    except SystemExit as exc:  # --help printed its text
        return exc.code if isinstance(exc.code, int) else 0
    except VianoError as exc:
        out.error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        out.note("interrupted: only committed generations were kept")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except Exception as exc:  # the last line of defence still prints a reason
        if os.environ.get("VIANO_DEBUG"):
            traceback.print_exc()
        error = VianoError(f"unexpected {exc.__class__.__name__}; set VIANO_DEBUG=1 for details")
        out.error(error)
        return error.exit_code


def _quiet_stdout() -> None:
    """The reader went away (``viano … | head -1``). What had to be durable already is;
    point stdout at /dev/null so the interpreter's final flush does not fail either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def run() -> None:
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code)
