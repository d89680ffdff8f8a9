"""The CLI's command table: thin layers over the engine and the actor handles."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path

import trio

from actors import open_store
from engine import (
    Attachment,
    Config,
    IntakePlan,
    Published,
    prepare_intake,
)

from ._batch_commands import cmd_batch, cmd_daemon, cmd_run
from ._context import store_location
from ._demo import cmd_demo
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


def cmd_intake(args: argparse.Namespace, out: Output, config: Config) -> int:
    attachments = [Attachment.parse(spec) for spec in args.attach]
    total = 0
    for a in attachments:
        with contextlib.suppress(OSError):  # prepare_intake refuses it with its reason
            total += a.path.stat().st_size if a.path.is_file() else 0
    with out.progress("reading attachments", total, unit_bytes=True) as advance:
        plan = prepare_intake(Path(args.report), attachments, case_id=args.case_id,
                              limits=config.intake.limits, progress=advance)
    published = trio.run(_publish_intake, store_location(args, config), plan)
    _print_intake(out, plan, published)
    return 0


async def _publish_intake(location: str, plan: IntakePlan) -> Published:
    async with open_store(location) as store:
        return await store.intake(plan)


def _print_intake(out: Output, plan: IntakePlan, published: Published) -> None:
    sources = plan.catalogue["sources"]
    if out.as_json:
        out.document({"case_id": published.case_id, "package_id": published.package_id,
                      "package_generation": published.generation,
                      "phase": published.manifest.phase, "title": plan.title,
                      "catalogue": plan.catalogue})
        return
    out.line(f"case {published.case_id}: {plan.title}")
    out.line(f"package {published.package_id}, generation {published.generation}, "
             f"{len(sources)} sources")
    rows = [(s["source_id"], s["kind"] + (" (human)" if s["human"] else ""),
             _origin(s["origin"]), s["size"], s["media_type"]) for s in sources]
    out.table("catalogue", ["id", "kind", "origin", "bytes", "media type"], rows)


def _origin(origin: dict[str, str]) -> str:
    if "member" in origin:
        return f"{origin['input']} :: {origin['member']}"
    if "pointer" in origin:
        return f"{origin['input']}#{origin['pointer']}"
    return origin["input"]


COMMANDS: dict[str, Command] = {
    "intake": cmd_intake, "status": cmd_status, "show": cmd_show, "cat": cmd_cat,
    "log": cmd_log, "verify": cmd_verify, "export": cmd_export, "import": cmd_import,
    "gc": cmd_gc, "demo": cmd_demo, "interpret": cmd_interpret, "confirm": cmd_confirm,
    "reopen": cmd_reopen, "unblock": cmd_unblock, "hypothesize": cmd_hypothesize,
    "run": cmd_run, "batch": cmd_batch, "daemon": cmd_daemon}
