"""The ``viano`` argument parser. Global options are accepted before or after the command:
each subparser repeats them with ``SUPPRESS`` defaults so a value given after the command
wins and one given before it is not overwritten."""

from __future__ import annotations

import argparse
import math
import re
from typing import NoReturn

from engine import FORMATS, ROLES, Shard, UsageError, is_utf8, validate_case_id

MAX_PROCESSES = 64  # worker processes of one run or batch

DESCRIPTION = ("Viano analyses bug cases: intake stores the originals and a canonical source "
               "catalogue in a durable, versioned case package; a model interprets the case, "
               "a person confirms it, and competing causal hypotheses follow.")

EXIT_CODES = ("exit codes: 0 success, 2 usage error or rejected input (nothing written), "
              "10 RETRY_PENDING, 11 DEFERRED, 12 BLOCKED, 13 ERROR, 1 violations found "
              "(verify), a damaged store or an internal failure, 130 interrupted")


class Shown(Exception):
    """``--help`` or ``--version`` was asked for: ``text`` for a person, ``document`` for
    ``--json`` (which promises one JSON document on stdout, whatever else is asked)."""

    def __init__(self, text: str, document: dict[str, str]):
        super().__init__(text)
        self.text = text
        self.document = document


class _Help(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show this help message and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        text = parser.format_help()
        raise Shown(text, {"command": parser.prog, "help": text})


class _Version(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        version = _version()
        raise Shown(f"viano {version}\n", {"program": "viano", "version": version})


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are Viano errors (so ``--json`` gets its one
    JSON document for them too), never a bare ``SystemExit`` with text on stderr; its
    ``--help`` raises ``Shown`` for the same reason."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        # "--conc 4" is not "--concurrency 4": an abbreviation would change its meaning the
        # day a second option starts with the same letters.
        kwargs.setdefault("allow_abbrev", False)
        add_help = kwargs.pop("add_help", True)
        kwargs["add_help"] = False
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if add_help:
            self.add_argument("-h", "--help", action=_Help)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}",
                         hint=f"Run '{self.prog} --help' to see its arguments.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("viano")
    except PackageNotFoundError:
        return "unknown (not installed)"


# Numbers as a person types them in ASCII: Python's int() and float() also take other
# scripts' digits, underscores and surrounding whitespace ("٥", "1_0", " 3").
_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _seconds(text: str) -> float:
    """A duration: a finite number of seconds, not negative."""
    if _DECIMAL.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number of seconds")
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{_shown(text)} must be a finite, non-negative number")
    return value


def _poll_seconds(text: str) -> float:
    value = _seconds(text)
    if value < 0.05:
        raise argparse.ArgumentTypeError(f"{_shown(text)} would poll the store in a busy loop; "
                                         "give at least 0.05")
    return value


def _text(text: str) -> str:
    """A text argument (a case id, a name, a reason, a logical path): UTF-8, as everything
    Viano stores is. A file name may be any bytes; these may not (the shell passed bytes
    that are not UTF-8, which Python holds as lone surrogates)."""
    if not is_utf8(text):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not UTF-8 text")
    return text


def _shown(text: str) -> str:
    """``text`` quoted as it shows, escaped once (not-UTF-8 bytes as ``\\udcff``)."""
    return "'" + text.encode("utf-8", "backslashreplace").decode("utf-8") + "'"


def _integer(text: str) -> int:
    if _WHOLE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number")
    return int(text)


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{_shown(text)} must be at least 1")
    return value


def _processes(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_PROCESSES:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is more than {MAX_PROCESSES}")
    return value


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from exc


def _globals(with_defaults: bool) -> Parser:
    p = Parser(add_help=False)
    g = p.add_argument_group("global options")

    def default(value: object) -> object:
        return value if with_defaults else argparse.SUPPRESS

    g.add_argument("--store", metavar="PATH|URL", default=default(None),
                   help="the case store: a folder (SQLite) or postgresql://… (env "
                        "VIANO_STORE, else [store] url in the config; default ./viano-store)")
    g.add_argument("--config", metavar="PATH", default=default(None),
                   help="configuration file (env VIANO_CONFIG; default "
                        "config/analysis.local.toml if it exists, else built-in defaults)")
    g.add_argument("--json", action="store_true", default=default(False),
                   help="print exactly one JSON document on stdout and nothing else on "
                        "stdout (errors are that document; stderr keeps its human lines)")
    g.add_argument("--log-json", default=default(None), metavar="FILE",
                   help="write one JSON line per phase step and result to FILE ('-' for "
                        "stderr); off unless given")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, and its case ids checked against the case-id rule before anything
    is read, so every command refuses ``BAD!`` as ``invalid_case_id`` (the read commands
    said ``unknown_case``, the phase commands ``invalid_case_id``). After the parse, so a
    usage error (an unknown option whose value was taken for a CASE) is said first."""
    args = build_parser().parse_args(argv)
    for dest in ("case", "cases", "case_id"):
        value = getattr(args, dest, None)
        for case_id in value if isinstance(value, list) else [value]:
            if case_id is not None:
                validate_case_id(case_id)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="viano", description=DESCRIPTION, epilog=EXIT_CODES,
                    parents=[_globals(True)])
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=Parser)
    common = [_globals(False)]

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=common,
                              epilog=EXIT_CODES)

    p = add("intake", "create a case package from a human report and attachments, or "
                      "many cases from a folder or JSON Lines file of reports")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--report", metavar="FILE",
                       help="the report: a Viano JSON report {title, body, comments?, "
                            "observations?}, a GitHub issue (gh issue view --json, or REST), "
                            "a Jira issue (REST v2/v3), or UTF-8 text")
    which.add_argument("--batch", metavar="DIR|FILE.jsonl",
                       help="many reports in one process: every regular file of a folder "
                            "(by name), or one report per line of a JSON Lines file; "
                            "idempotent, with a summary (exit 2 if any was refused)")
    p.add_argument("--format", choices=FORMATS, metavar="FORMAT",
                   help=f"the report format, one of {', '.join(FORMATS)} (default: "
                        "detected from the content)")
    p.add_argument("--attach", action="append", default=[], metavar="[ROLE=]FILE",
                   help=f"an attachment; ROLE is one of {', '.join(ROLES)} (default "
                        "attachment). Archives in the diagnostics and source roles are "
                        "catalogued member by member. Repeatable; order is kept")
    p.add_argument("--case-id", metavar="ID", type=_text, help="case id (default: the report's "
                   "case_id, else the issue's own id such as owner_repo_123 or PROJ-7, else "
                   "derived from the report's hash)")

    p = add("interpret", "one dispatch of the interpretation phase for CASE")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--attempt-id", default="default", metavar="ID", type=_text,
                   help="the attempt; after a rejected answer, a new id asks again under the "
                        "same pinned policy (default: default)")

    for name, help_ in (("run", "one pass: advance each case as far as it can go now "
                                "(interpret, confirm when auto_confirm, hypothesize)"),
                        ("batch", "keep going until every case is COMPLETED, BLOCKED or ERROR; "
                                  "with --wait also through due retries")):
        p = add(name, help_)
        p.add_argument("cases", nargs="*", metavar="CASE", type=_text)
        p.add_argument("--all", action="store_true", help="every case with work now "
                                                          "(from the store's due index)")
        p.add_argument("--concurrency", type=_positive_int, default=16, metavar="N",
                       help="cases in flight at once (default 16)")
        if name == "batch":
            p.add_argument("--wait", action="store_true",
                           help="also wait for due retries (RETRY_PENDING) and run them")
        p.add_argument("--processes", type=_processes, default=1, metavar="N",
                       help="worker processes (default 1; one process uses about one core): "
                            "each takes the cases of its shard (by a hash of the case id) "
                            "with its share of --concurrency and of each provider's "
                            "max_concurrency")
        p.add_argument("--worker-shard", type=_shard, default=None, help=argparse.SUPPRESS)

    p = add("daemon", "long-running: picks up new cases and due retries; SIGTERM or SIGINT "
                      "stops it cleanly")
    p.add_argument("--concurrency", type=_positive_int, default=16, metavar="N",
                   help="cases in flight at once (default 16)")
    p.add_argument("--poll-s", type=_poll_seconds, default=1.0, metavar="SECONDS",
                   help="how often to look for cases taken in by other processes "
                        "(default 1; at least 0.05: due retries wake it on their own)")
    p.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                   help="serve only the cases of shard I of N (by a hash of the case id): "
                        "run N daemons, one per core, with 1/N … N/N")

    p = add("confirm", "confirm the current revision's interpretation of CASE")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--by", metavar="NAME", type=_text,
                   help="who confirms (default: your user name)")

    p = add("hypothesize", "one dispatch of the hypothesis phase for CASE (its interpretation "
                           "must be confirmed)")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--attempt-id", default="default", metavar="ID", type=_text,
                   help="the attempt; after a rejected answer, a new id asks again under the "
                        "same pinned policy (default: default)")

    p = add("reopen", "start a new analysis revision of CASE; earlier artifacts stay unchanged")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--reason", required=True, metavar="TEXT", type=_text, help="why (recorded)")
    p.add_argument("--by", metavar="NAME", type=_text, help="who reopens (default: your user name)")

    p = add("unblock", "after BLOCKED (rounds exhausted): allow a new series of rounds")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--by", metavar="NAME", type=_text,
                   help="who unblocks (default: your user name)")

    p = add("report", "the interpretation and hypotheses of CASE, escaped, for a person to "
                      "read or to post back on the issue (Markdown on stdout)")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--format", choices=("md", "json"), default="md",
                   help="md (default) or json (one document, as --json gives)")
    p.add_argument("--revision", type=_positive_int, metavar="N",
                   help="the analysis revision (default: the current one)")

    p = add("status", "list cases: phase, status, revision, generation, due time")
    p.add_argument("cases", nargs="*", metavar="CASE", type=_text)
    p.add_argument("--summary", action="store_true",
                   help="counts by phase and status, and per provider: answers, failures by "
                        "class and cooldowns (from every recorded round)")

    p = add("show", "print the manifest of the current (or given) generation")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("--generation", type=_integer, metavar="N")

    p = add("cat", "print the exact bytes of one logical file")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("path", metavar="PATH", type=_text)
    p.add_argument("--generation", type=_integer, metavar="N")

    p = add("log", "the generation history: number, phase, time, what changed")
    p.add_argument("case", metavar="CASE", type=_text)

    p = add("verify", "recompute every hash and check every invariant; exit 1 on violations")
    p.add_argument("cases", nargs="*", metavar="CASE", type=_text)

    p = add("export", "write a portable package with its whole history to a zip file")
    p.add_argument("case", metavar="CASE", type=_text)
    p.add_argument("file", metavar="FILE.zip")
    p.add_argument("--force", action="store_true",
                   help="replace FILE if it exists (a path inside the store is always "
                        "refused)")

    p = add("import", "import a package exported by 'viano export'")
    p.add_argument("file", metavar="FILE.zip")

    p = add("gc", "remove blob files no generation references (left only by crashes)")
    p.add_argument("--min-age", type=_seconds, default=600.0, metavar="SECONDS",
                   help="keep unreferenced files younger than this (default 600): another "
                        "process may be about to commit them")

    add("demo", "the bundled sample case BUG-20 end to end (intake, interpretation, "
                "confirmation, hypotheses, verify) in a temporary store with the bundled "
                "fixture provider: no network, no key, nothing kept (--store and the "
                "configured providers are not used)")
    return parser
