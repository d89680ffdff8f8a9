"""The CLI's command table: thin layers over the engine and the actor handles."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from engine import Config, PackageView, report_document, report_markdown, store_errors_first

from ._batch_commands import cmd_batch, cmd_daemon, cmd_run
from ._context import reading
from ._demo import cmd_demo
from ._intake_commands import cmd_intake
from ._output import Output
from ._phase_commands import cmd_confirm, cmd_hypothesize, cmd_interpret, cmd_reopen, cmd_unblock
from ._store_commands import (
    cmd_cat,
    cmd_export,
    cmd_gc,
    cmd_import,
    cmd_log,
    cmd_show,
    cmd_status,
    cmd_verify,
)

Command = Callable[[argparse.Namespace, Output, Config], int]


def cmd_report(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        ref = store.case(args.case)
        manifest = store.manifest(ref.package_id, ref.generation)
        doc = store_errors_first(  # a damaged file is store_corrupt, not the history's
            lambda on_fault: PackageView(manifest, store.read_blob, store.open_blob, on_fault),
            lambda view: report_document(view, args.revision))
    if out.as_json or args.format == "json":
        out.document(doc)
    else:
        out.markdown(report_markdown(doc))
    return 0


COMMANDS: dict[str, Command] = {
    "intake": cmd_intake, "status": cmd_status, "show": cmd_show, "cat": cmd_cat,
    "log": cmd_log, "verify": cmd_verify, "export": cmd_export, "import": cmd_import,
    "gc": cmd_gc, "demo": cmd_demo, "interpret": cmd_interpret, "confirm": cmd_confirm,
    "reopen": cmd_reopen, "unblock": cmd_unblock, "hypothesize": cmd_hypothesize,
    "run": cmd_run, "report": cmd_report, "batch": cmd_batch, "daemon": cmd_daemon}
