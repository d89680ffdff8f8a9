"""The ``viano`` command line."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
import types
from collections.abc import Iterator, Sequence

from engine import EXIT_INTERRUPTED, Config, VianoError, tune_collector

from ._commands import COMMANDS
from ._context import store_path
from ._events import event_log
from ._output import Output, OutputUnwritable, quiet_stdout, writing_stdout
from ._parser import Shown, parse


def main(argv: Sequence[str] | None = None, *, whole_process: bool = False) -> int:
    """Run one command; its exit code. ``whole_process``: this is the console script, and
    the process ends with the command, so once the command has ended a SIGINT or SIGTERM
    interrupts nothing and is ignored (see ``_deaf_to_signals``). An embedding caller
    keeps its own handlers."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Decided before parsing, so that a usage error under --json is a JSON document too.
    out = Output(as_json="--json" in argv)
    code: int | None = None
    try:
        args = parse(argv)
        out.as_json = bool(args.json)
        config = Config.resolve(args.config)
        with _terminate_as_interrupt(then_deaf=whole_process), \
                event_log(args.log_json, store_path(args, config)):
            code = COMMANDS[args.command](args, out, config)
    except BaseException as exc:  # every ending gets a reason and a code
        # An interruption after the command returned (while its event log closed)
        # interrupted nothing: its result stands.
        if code is None or not isinstance(_cause(exc), KeyboardInterrupt):
            return _report(out, _cause(exc))
    if out.unwritable is not None:  # a command that went on without its lines
        return code or _report(out, out.unwritable)
    return code


@contextlib.contextmanager
def _terminate_as_interrupt(*, then_deaf: bool = False) -> Iterator[None]:
    """A SIGTERM is what a Ctrl-C is, for every command: delivered to whichever SIGINT
    handler is in place when it comes (Python's, or trio's inside ``trio.run``, which
    interrupts only where that is safe), so a command cleans up as it does on Ctrl-C (an
    export removes its temporary file) and reports ``interrupted`` (exit 130). It ended
    the process with nothing said and the file left. A SIGINT that the shell set to be
    ignored (a background job) is given Python's handler for the command, or SIGTERM
    would have nothing to be delivered to. Commands that take the signals over (batch,
    daemon) set their own handlers inside this one. Only in the main thread (an embedding
    caller's thread cannot set handlers, and keeps its own). ``then_deaf``: on the way
    out, the signals are ignored rather than given back their handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_int = signal.getsignal(signal.SIGINT)
    own_int = previous_int in (signal.SIG_IGN, signal.SIG_DFL)
    if own_int:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous_term = signal.signal(signal.SIGTERM, terminate_as_ctrl_c)
    try:
        yield
    finally:
        if then_deaf:
            _deaf_to_signals()
        else:
            # None: a handler not set from Python, which cannot be put back (nor was
            # changed).
            signal.signal(signal.SIGTERM, previous_term if previous_term is not None
                          else signal.SIG_DFL)
            if own_int:
                signal.signal(signal.SIGINT, previous_int)


def terminate_as_ctrl_c(_signum: int, frame: types.FrameType | None) -> None:
    """A SIGTERM handler: delivered to whichever SIGINT handler is in place (Python's, or
    trio's inside ``trio.run``), or a KeyboardInterrupt where SIGINT has none."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def _deaf_to_signals() -> None:
    """The command has ended: a Ctrl-C or SIGTERM now interrupts nothing. Ignored, so that
    it cannot turn the result into exit 130, print a traceback, or kill the process while
    the interpreter shuts down (Python puts SIGINT back to its default there: a SIGINT
    just after the result ended the process with nothing said, exit -2, in about 1 run
    in 30). An ignored signal stays ignored through the shutdown."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def interrupted_at_start(argv: Sequence[str]) -> int:
    """Ctrl-C came while the command line was being imported (``viano_main``): reported
    as any interruption is, before anything was done."""
    error = VianoError("interrupted before the command started: nothing was done",
                       reason="interrupted", hint="Run the command again.")
    error.exit_code = EXIT_INTERRUPTED
    Output(as_json="--json" in argv).error(error)
    return EXIT_INTERRUPTED


def _cause(exc: BaseException) -> BaseException:
    """What a command failed of: the error itself, or, for an exception group (a failure
    inside a nursery), its first leaf that is not a cancellation."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not _only_cancelled(e)]
        exc = (leaves or list(exc.exceptions))[0]
    return exc


def _only_cancelled(exc: BaseException) -> bool:
    import trio

    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


def _report(out: Output, exc: BaseException) -> int:
    if isinstance(exc, Shown):  # --help or --version
        try:
            if out.as_json:
                out.document(exc.document)
            else:
                with writing_stdout():
                    sys.stdout.write(exc.text)
        except OutputUnwritable as unwritable:
            return _report(out, unwritable)
        except BrokenPipeError:
            quiet_stdout()
        return 0
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 0
    if isinstance(exc, VianoError):
        with contextlib.suppress(OSError):  # stderr gone too: the exit code says it
            out.error(exc)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        error = VianoError("interrupted: only committed generations were kept",
                           reason="interrupted",
                           hint="Run the same command again: it resumes from durable state.")
        error.exit_code = EXIT_INTERRUPTED
        out.error(error)
        return EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        quiet_stdout()
        return 0
    if not isinstance(exc, Exception):
        raise exc
    # The last line of defence still prints a reason.
    if os.environ.get("VIANO_DEBUG"):
        traceback.print_exception(exc)
    error = VianoError(f"unexpected {exc.__class__.__name__}; set VIANO_DEBUG=1 for details")
    out.error(error)
    return error.exit_code


def run() -> None:
    """The console entry point: one whole process (see ``engine.tune_collector``)."""
    tune_collector()
    code = main(whole_process=True)
    _deaf_to_signals()  # also after a command that ended before it started (a usage error)
    try:
        with writing_stdout():
            sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    except OutputUnwritable as exc:
        quiet_stdout()  # the interpreter's own last flush would fail again
        code = code or _report(Output(as_json=False), exc)
    sys.exit(code)
