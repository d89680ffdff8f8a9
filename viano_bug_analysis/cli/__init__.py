"""The ``viano`` command line."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from engine import Config, VianoError

from ._commands import COMMANDS
from ._output import Output
from ._parser import build_parser

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    out = Output(as_json=args.json)
    try:
        config = Config.resolve(args.config)
        return COMMANDS[args.command](args, out, config)
    except VianoError as exc:
        out.error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        out.err.print("interrupted: only committed generations were kept", markup=False)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence still prints a reason
        if os.environ.get("VIANO_DEBUG"):
            traceback.print_exc()
        error = VianoError(f"unexpected {exc.__class__.__name__}; set VIANO_DEBUG=1 for details")
        out.error(error)
        return error.exit_code


def run() -> None:
    sys.exit(main())
