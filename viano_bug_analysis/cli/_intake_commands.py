"""``viano intake``: one report with its attachments, or many reports in one process.

Bulk intake (``--batch DIR`` or ``--batch FILE.jsonl``) reads each report, checks it as a
single intake would, and publishes up to :data:`IN_FLIGHT` of them at once through the
publisher, whose group commit puts many in one transaction. Each report is its own
publication: a refused one writes nothing and does not stop the others. A case that
already holds every file this intake would write is "already present"; one with other
inputs is refused (``case_exists``). Run again after an interruption, it takes in what is missing
and nothing twice: each case's creation is a compare-and-swap on "no generation yet".
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import trio

from actors import StoreHandle, open_store
from engine import (
    Attachment,
    CaseExists,
    CaseLocked,
    Config,
    InputRejected,
    IntakeLimits,
    IntakePlan,
    Published,
    RejectedInput,
    StorageError,
    StoreConfig,
    UsageError,
    VianoError,
    check_regular,
    open_regular,
    prepare_intake,
)
from engine._store._sources import WouldWait, reader_of
from engine._text import terminal_safe

from ._batch_common import stoppable
from ._context import one_change, store_location, waiting_for_the_case
from ._output import Output

log = logging.getLogger("viano.intake")
IN_FLIGHT = 64  # publications waiting on the publisher at once (its batch fills from these)


def cmd_intake(args: argparse.Namespace, out: Output, config: Config) -> int:
    if args.batch is not None:
        if args.attach or args.case_id:
            raise UsageError("--batch takes no --attach or --case-id (each report names its "
                             "own case)", hint="Take in reports with attachments one by one "
                                               "with --report.")
        return _bulk(args, out, config)
    if args.report is None:
        raise UsageError("viano intake needs --report FILE or --batch DIR|FILE.jsonl",
                         hint="Run 'viano intake --help' to see its arguments.")
    attachments = [Attachment.parse(spec) for spec in args.attach]
    total = 0
    for a in attachments:
        with contextlib.suppress(OSError):  # prepare_intake refuses it with its reason
            total += a.path.stat().st_size if a.path.is_file() else 0
    with out.progress("reading attachments", total, unit_bytes=True) as advance:
        plan = prepare_intake(Path(args.report), attachments, case_id=args.case_id,
                              limits=config.intake.limits, progress=advance,
                              report_format=args.format)
    location = store_location(args, config)
    published, present = one_change(
        out, lambda keep: _publish_intake(location, plan, config.store, out.note, keep),
        lambda done: (done, False))
    _print_intake(out, plan, published, present)
    return 0


async def _publish_intake(location: str, plan: IntakePlan, settings: StoreConfig,
                          on_wait: Callable[[str], None] | None = None,
                          keep: Callable[[StoreHandle], None] | None = None,
                          ) -> tuple[Published, bool]:
    """The intake published, or (True) the case as it is if this very intake is already
    there (every file it would write is the case's), so running the command again after
    it was interrupted, even after its commit, is not an error."""
    async with open_store(location, settings=settings) as store:
        if keep is not None:
            keep(store)
        try:
            return await waiting_for_the_case(lambda: store.intake(plan), on_wait), False
        except CaseExists as exc:
            present = await _already_present(store, plan)
            if isinstance(present, Published):
                return present, True
            raise (present or exc) from None


async def _already_present(store: StoreHandle, plan: IntakePlan
                           ) -> Published | CaseExists | None:
    """The existing case as it is, if this very intake is in it (:meth:`IntakePlan.is_in`).
    A refusal that says so if it holds the same originals catalogued otherwise (the
    attachments given in another order); None if it holds other inputs or its head cannot
    be read (a damaged head proves nothing). The one rule single and bulk intake use."""
    try:
        ref, snap = await store.head(plan.case_id)
    except StorageError:
        return None
    if plan.is_in(snap.manifest):
        return Published(ref.package_id, ref.case_id, ref.generation, snap.manifest,
                         ref.status)
    if plan.same_originals(snap.manifest):
        return CaseExists(
            f"case {plan.case_id!r} already holds these same originals, catalogued "
            "otherwise (the attachments given in another order, or other intake limits); "
            "nothing written",
            hint=f"The case is there: 'viano show {plan.case_id}' lists it. To take the "
                 "originals in again as another case, pass --case-id.")
    return None


def _print_intake(out: Output, plan: IntakePlan, published: Published, present: bool) -> None:
    sources = plan.catalogue["sources"]
    if out.as_json:
        out.document({"case_id": published.case_id, "package_id": published.package_id,
                      "package_generation": published.generation,
                      "phase": published.manifest.phase, "title": plan.title,
                      "already_present": present, "catalogue": plan.catalogue})
        return
    out.line(f"case {published.case_id}: {terminal_safe(plan.title)}")  # one line, always
    if present:
        out.line("already present: this intake was taken in before; nothing written")
    out.line(f"package {published.package_id}, generation {published.generation}, "
             f"{len(sources)} sources")
    shown = sources[:SHOWN_SOURCES]
    rows = [(s["source_id"], _kind(s), _origin(s["origin"]),
             "" if s["size"] is None else s["size"], s["media_type"]) for s in shown]
    out.table("catalogue", ["id", "kind", "origin", "bytes", "media type"], rows)
    if len(sources) > len(shown):
        # 50,000 rows took 22 s to print (2 s with --json), for a table nobody reads.
        out.line(f"… and {len(sources) - len(shown)} more sources: 'viano cat "
                 f"{published.case_id} case/catalogue.json' lists them all")


SHOWN_SOURCES = 200  # catalogue rows a text-mode intake prints


def _kind(s: dict[str, Any]) -> str:
    words = str(s["kind"]) + (" (human)" if s["human"] else " (bot)" if s["kind"] in (
        "report", "comment") else "")
    if s.get("supplied") is False:
        words += " (referenced, not supplied)"
    elif s.get("supplied") is True:
        words += f" (referenced, supplied as {s.get('supplied_as')})"
    if s.get("minimized"):
        words += f" (minimized: {s['minimized']})"
    return words


def _origin(origin: dict[str, str]) -> str:
    if "member" in origin:
        return f"{origin['input']} :: {origin['member']}"
    if "pointer" in origin:
        return f"{origin['input']}#{origin['pointer']}"
    return origin["input"]


# --- bulk --------------------------------------------------------------------------------


@attrs.frozen
class _Item:
    label: str  # what the user calls it: the file, or FILE.jsonl:LINE
    path: Path
    raw: bytes | None = None  # a JSON Lines line; None: read the file at path
    name: str | None = None  # the input name to store it under (lines: report.json)
    refusal: RejectedInput | None = None  # known bad before it is read (a huge line)
    json_only: bool = False  # a line of a JSON Lines file is JSON, never text


JSON_LINES = (".jsonl", ".ndjson")


def _items(path: Path, limits: IntakeLimits) -> tuple[int, Iterator[_Item], list[dict[str, str]]]:
    """(how many, the reports, what was left out and why) of a folder (its regular files
    by name; dot-files, folders, symbolic links and special files are left out: a link
    could name a file from anywhere) or of a JSON Lines file (one report per non-blank
    line)."""
    try:
        if path.is_dir():
            files: list[Path] = []
            skipped: list[dict[str, str]] = []
            for p in sorted(path.iterdir(), key=lambda p: os.fsencode(p.name)):
                try:
                    st = p.lstat()
                except FileNotFoundError:  # removed while the folder was listed
                    continue
                why = ("hidden" if p.name.startswith(".") else "symbolic_link"
                       if stat.S_ISLNK(st.st_mode) else "folder" if stat.S_ISDIR(st.st_mode)
                       else None if stat.S_ISREG(st.st_mode) else "not_a_regular_file")
                if why is None:
                    files.append(p)
                elif why != "hidden":
                    skipped.append({"entry": terminal_safe(str(p)), "why": why})
            return len(files), (_Item(terminal_safe(str(p)), p) for p in files), skipped
        if path.exists():
            check_regular(path)  # a FIFO or a device is refused by name, never read
        else:
            raise UsageError(f"--batch {terminal_safe(str(path))}: no such folder or file",
                             hint="Give a folder of report files or a JSON Lines file.")
        if not path.name.lower().endswith(JSON_LINES):
            raise UsageError(f"--batch {terminal_safe(str(path))}: a file given to --batch "
                             "is read as JSON Lines, one report per line, and this one is "
                             "not named so", hint="Name it FILE.jsonl (or give a folder of "
                                                  "report files).")
        # One open file for the count and the lines: a file swapped for another (or for
        # a FIFO) after the check is not read.
        f = open_regular(path)
        try:
            count = _count_lines(f, limits.max_report_bytes)
            f.seek(0)
        except BaseException:
            f.close()
            raise
        return count, _lines(f, path, limits.max_report_bytes), []
    except OSError as exc:
        raise InputRejected(f"--batch {terminal_safe(str(path))}: cannot be read "
                            f"({exc.strerror or exc})", reason="unreadable_input",
                            hint="Check that it is readable by you.") from exc


def _count_lines(f: BinaryIO, limit: int) -> int:
    """The lines :func:`_lines` yields (non-blank, or over ``limit``: refused), in bounded
    memory (a line may be far larger than the limit)."""
    count, content, length = 0, False, 0
    while chunk := f.read(1 << 20):
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:  # each of these ends a line
            length += len(piece)
            if content or piece.strip() or length > limit:
                count += 1
            content, length = False, 0
        content = content or bool(pieces[-1].strip())
        length += len(pieces[-1])
    return count + (1 if content or length > limit else 0)


def _lines(f: BinaryIO, path: Path, limit: int) -> Iterator[_Item]:
    with f:
        number = 0
        while True:
            line = f.readline(limit + 1)
            if not line:
                return
            number += 1
            label = f"{terminal_safe(str(path))}:{number}"
            if len(line) > limit and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield _Item(label, path, refusal=InputRejected(
                    f"{label}: larger than max_report_bytes={limit}",
                    reason="limit_exceeded"), json_only=True)
                continue
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield _Item(label, path, raw=line, name="report.json", json_only=True)


@attrs.define
class _Tally:
    taken: list[dict[str, Any]] = attrs.Factory(list)
    present: list[dict[str, Any]] = attrs.Factory(list)
    refused: list[dict[str, Any]] = attrs.Factory(list)

    def counts(self) -> str:
        return (f"taken in {len(self.taken)}, already present {len(self.present)}, "
                f"refused {len(self.refused)}")


Done = Callable[[str, dict[str, Any]], None]  # ("taken" | "present" | "refused", entry)


def _bulk(args: argparse.Namespace, out: Output, config: Config) -> int:
    out.outlives_reader = True
    total, items, skipped = _items(Path(args.batch), config.intake.limits)
    tally = _Tally()
    started = time.perf_counter()
    with out.progress_with_text("reports", total) as (advance, set_text):
        def done(kind: str, entry: dict[str, Any]) -> None:
            getattr(tally, kind).append(entry)
            advance(1)
            set_text(tally.counts())

        stats, interrupted = trio.run(_bulk_run, store_location(args, config), items,
                                      config.intake.limits, args.format, done, config.store)
    summary = {"reports": total, "taken_in": len(tally.taken),
               "already_present": len(tally.present), "refused": tally.refused,
               "skipped": skipped, "interrupted": interrupted,
               "seconds": round(time.perf_counter() - started, 3),
               "store": stats, "cases": tally.taken + tally.present}
    if out.as_json:
        out.document(summary)
    else:
        out.line(f"{total} reports: {tally.counts()}; {summary['seconds']}s; "
                 f"{stats.get('publications_per_transaction', 0)} publications per "
                 "transaction" + (" (interrupted: run the same command to resume)"
                                  if interrupted else ""))
        for r in tally.refused:
            out.line(f"  refused {r['report']}: [{r['reason']}] {r['message']}")
        for e in skipped:
            out.line(f"  left out {e['entry']}: {e['why'].replace('_', ' ')}")
    if interrupted:
        raise KeyboardInterrupt
    return 2 if tally.refused else 0


async def _bulk_run(location: str, items: Iterator[_Item], limits: IntakeLimits,
                    fmt: str | None, done: Done, settings: StoreConfig
                    ) -> tuple[dict[str, Any], bool]:
    # Ctrl-C (or SIGTERM) stops taking reports; what is in flight is finished and counted
    # (a publication is milliseconds), so the summary says exactly what the store holds.
    async with stoppable() as (stop, _work), open_store(location, settings=settings) as store:
        slots = trio.Semaphore(IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            for item in items:
                if stop.is_set():
                    break
                plan = _prepare(item, limits, fmt, done)
                if plan is None:
                    await trio.lowlevel.checkpoint()  # a run of refusals stays stoppable
                    continue
                await slots.acquire()
                nursery.start_soon(_publish_one, store, item, plan, slots, done)
        return store.stats.to_json(), stop.is_set()


def _prepare(item: _Item, limits: IntakeLimits, fmt: str | None,
             done: Done) -> IntakePlan | None:
    try:
        if item.refusal is not None:
            raise item.refusal
        raw = item.raw if item.raw is not None else _read_entry(item, limits)
        return prepare_intake(item.path, (), case_id=None, limits=limits, report_format=fmt,
                              report_bytes=raw, report_name=item.name or item.path.name,
                              json_only=item.json_only)
    except RejectedInput as exc:
        done("refused", _refusal(item, exc))
    except Exception as exc:  # a bug met on one report refuses that one, not the batch
        log.exception("intake of %s failed", item.label)
        done("refused", _refusal(item, VianoError(
            f"{item.label}: internal error ({type(exc).__name__}); nothing of it was written",
            reason="internal_error")))
    return None


def _read_entry(item: _Item, limits: IntakeLimits) -> bytes:
    """A folder entry's bytes, never through a link: the folder was listed a moment ago,
    and whoever can write to it may have put a symbolic link (or a FIFO) in a file's place
    since; O_NOFOLLOW refuses the link, fstat the rest."""
    try:
        fd = os.open(item.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = ("it became a symbolic link after the folder was listed"
               if exc.errno == errno.ELOOP else exc.strerror or str(exc))
        raise InputRejected(f"{item.label}: not read ({why})", reason="unreadable_input"
                            ) from exc
    with reader_of(fd, str(item.path)) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputRejected(f"{item.label}: not a regular file any more",
                                reason="unreadable_input")
        try:  # a pseudo-file (/proc/kmsg) is regular to stat and waits when read
            raw = f.read(limits.max_report_bytes + 1)
        except WouldWait as exc:
            raise InputRejected(f"{item.label}: not read ({exc.strerror})",
                                reason="unreadable_input") from exc
    if len(raw) > limits.max_report_bytes:
        raise InputRejected(f"{item.label}: larger than max_report_bytes="
                            f"{limits.max_report_bytes}", reason="limit_exceeded")
    return raw


def _refusal(item: _Item, exc: VianoError, case_id: str | None = None) -> dict[str, Any]:
    return {"report": item.label, "case_id": case_id, "reason": exc.reason,
            "message": terminal_safe(exc.message)}


async def _publish_one(store: StoreHandle, item: _Item, plan: IntakePlan,
                       slots: trio.Semaphore, done: Done) -> None:
    try:
        try:
            published = await waiting_for_the_case(lambda: store.intake(plan))
        except CaseLocked:
            done("refused", _refusal(item, RejectedInput(
                f"case {plan.case_id!r} stayed locked by another process", reason="locked"),
                plan.case_id))
        except CaseExists:
            await _existing(store, item, plan, done)
        except RejectedInput as exc:
            done("refused", _refusal(item, exc, plan.case_id))
        else:
            done("taken", {"report": item.label, "case_id": published.case_id,
                           "package_id": published.package_id})
    finally:
        slots.release()


async def _existing(store: StoreHandle, item: _Item, plan: IntakePlan, done: Done) -> None:
    """The case exists: this very intake is already present (:func:`_already_present`);
    a case with other inputs, or one whose head cannot be read, is refused
    (``case_exists``)."""
    present = await _already_present(store, plan)
    if isinstance(present, Published):
        done("present", {"report": item.label, "case_id": plan.case_id,
                         "package_id": present.package_id})
    else:
        done("refused", _refusal(item, present or CaseExists(
            f"case {plan.case_id!r} already exists with other inputs"), plan.case_id))
