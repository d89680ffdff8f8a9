"""Commands that read or maintain the store: status, show, cat, log, verify, export, import,
gc. The read commands open the store read-only."""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from actors import StoreHandle, open_store
from engine import (
    PHASE_CHECKS,
    CaseRef,
    ChangeRejected,
    Config,
    GenerationRow,
    ImportRequest,
    Manifest,
    NotFound,
    Published,
    Store,
    StoreConfig,
    UntrustedJson,
    UsageError,
    VianoError,
    collect_garbage,
    export_package,
    iso_utc,
    loads_untrusted,
    provider_statistics,
    read_export,
    verify_store,
    whole_history,
)

from ._context import (
    one_change,
    reading,
    store_location,
    store_named,
    store_path,
    store_shown,
    waiting_for_the_case,
    writing,
)
from ._output import Output, writing_stdout


def status_row(ref: CaseRef) -> dict[str, Any]:
    s = ref.status
    return {"case_id": ref.case_id, "package_id": ref.package_id, "phase": ref.phase,
            "status": s.status if s else None, "reason": s.reason if s else None,
            "round": s.round if s else None, "max_rounds": s.max_rounds if s else None,
            "attempt_id": s.attempt_id if s else None,
            "analysis_revision": ref.analysis_revision, "package_generation": ref.generation,
            "due_at": s.due_at_iso if s else None, "updated_at": ref.updated_at}


def cmd_status(args: argparse.Namespace, out: Output, config: Config) -> int:
    if args.summary:
        return _status_summary(args, out, config)
    try:
        with reading(args, config) as store:
            refs = store.list_cases()
    except NotFound as exc:
        # The default store not made yet is an empty one; a store named, or cases asked
        # about, that are not there are refused.
        if exc.reason != "no_store" or args.cases or store_named(args, config):
            raise
        refs = []
    if args.cases:
        known = {r.case_id for r in refs}
        missing = [c for c in args.cases if c not in known]
        if missing:
            raise NotFound(f"no case {missing[0]!r} in {store_shown(args, config)}",
                           reason="unknown_case")
        refs = [r for r in refs if r.case_id in set(args.cases)]
    rows = [status_row(r) for r in refs]
    if out.as_json:
        out.document(rows)
    elif not rows:
        out.line(f"no cases in {store_shown(args, config)} ('viano intake' adds one)")
    else:
        out.table(None, ["case", "phase", "status", "reason", "round", "revision",
                         "generation", "due"],
                  [(r["case_id"], r["phase"], r["status"] or "-", r["reason"] or "-",
                    str(r["round"]) if r["round"] else "-",
                    r["analysis_revision"], r["package_generation"], r["due_at"] or "-")
                   for r in rows])
    return 0


def _status_summary(args: argparse.Namespace, out: Output, config: Config) -> int:
    """Counts by phase and status, and the providers' record, for the whole store."""
    with reading(args, config) as store, store.read_transaction():
        refs = store.list_cases()
        if args.cases:
            refs = [r for r in refs if r.case_id in set(args.cases)]
        counts: dict[str, dict[str, int]] = {}
        for ref in refs:
            status = ref.status.status if ref.status else "READY"
            counts.setdefault(ref.phase, {}).setdefault(status, 0)
            counts[ref.phase][status] += 1
        providers = provider_statistics(store, refs)
        due = store.next_due()
    doc = {"cases": len(refs), "by_phase_and_status": counts, "providers": providers,
           "next_due_at": None if due is None else iso_utc(due)}
    if out.as_json:
        out.document(doc)
        return 0
    out.table("cases by phase and status", ["phase", "status", "cases"],
              [(p, s, n) for p, by in sorted(counts.items()) for s, n in sorted(by.items())])
    out.table("providers (every recorded round)", ["provider", "answers", "failures",
                                                   "cooldown skips"],
              [(name, s["answers"], ", ".join(f"{k} {v}" for k, v in s["failures"].items())
                or "-", s["cooldown_skips"]) for name, s in providers.items()])
    if due is not None:
        out.line(f"next retry due at {iso_utc(due)}")
    return 0


def _manifest(store: Store, case: str, generation: int | None) -> Manifest:
    ref = store.case(case)
    return store.manifest(ref.package_id, ref.generation if generation is None else generation)


def cmd_show(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        manifest = _manifest(store, args.case, args.generation)
    if out.as_json:
        out.document(manifest.to_json())
        return 0
    for key in ("case_id", "package_id", "package_generation", "parent_generation",
                "analysis_revision", "phase", "created_at"):
        out.line(f"{key}: {getattr(manifest, key)}")
    for name, target in manifest.pointers.items():
        out.line(f"pointer {name} -> {target}")
    out.table("files", ["path", "bytes", "sha256"],
              [(p, e.size, e.sha256) for p, e in manifest.files.items()])
    return 0


def cmd_cat(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        manifest = _manifest(store, args.case, args.generation)
        entry = manifest.files.get(args.path)
        if entry is None:
            raise NotFound(f"case {args.case!r} has no file {args.path!r} in generation "
                           f"{manifest.package_generation}", reason="unknown_path",
                           hint=f"Run 'viano show {args.case}' to list its files.")
        data = store.read_blob(entry.sha256)
    if out.as_json:
        doc: dict[str, Any] = {"case_id": args.case, "path": args.path,
                               "package_generation": manifest.package_generation,
                               "sha256": entry.sha256, "size": entry.size}
        try:
            doc["text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            doc["base64"] = base64.b64encode(data).decode("ascii")
        out.document(doc)
    elif sys.stdout.isatty():
        # The exact bytes are for a pipe or a file; a terminal gets text with its control
        # characters escaped (a report or a log may carry escape sequences), and binary
        # is refused rather than sprayed over it.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{args.path} is binary ({entry.size} bytes); it is not "
                             "written to a terminal",
                             hint="Redirect it to a file (viano cat … > FILE) or use "
                                  "--json for base64.") from None
        out.line(text.removesuffix("\n"))
    else:
        with writing_stdout():
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
    return 0


def generation_history(store: Store, rows: Sequence[GenerationRow]) -> list[dict[str, Any]]:
    """Each generation: what it added, replaced and set, and anything it removed (a store
    never removes; an imported or damaged history might)."""
    history = []
    previous: Manifest | None = None
    for row in rows:
        entry: dict[str, Any] = {"package_generation": row.generation, "phase": row.phase,
                                 "created_at": row.created_at,
                                 "manifest_sha256": row.manifest_sha256}
        try:
            m = Manifest.parse(row.manifest, row.manifest_sha256)
        except ChangeRejected as exc:
            entry["damaged"] = exc.message
            history.append(entry)
            previous = None
            continue
        before_files = previous.files if previous else {}
        before_pointers = previous.pointers if previous else {}
        entry.update(
            analysis_revision=m.analysis_revision,
            added=sorted(set(m.files) - set(before_files)),
            replaced=sorted(p for p in m.files if p in before_files
                            and m.files[p] != before_files[p]),
            removed=sorted(set(before_files) - set(m.files)),
            pointers_set=sorted(k for k, v in m.pointers.items()
                                if before_pointers.get(k) != v),
            pointers_removed=sorted(set(before_pointers) - set(m.pointers)))
        entry["events"] = _phase_events(store, m, entry["added"])
        history.append(entry)
        previous = m
    return history


def _phase_events(store: Store, m: Manifest, added: list[str]) -> list[str]:
    """What a generation did in the phases, in words: rounds (who answered, or why none
    did), rejections, acceptances, confirmations, unblocks and reopenings."""
    out = []
    for path in added:
        name = path.rsplit("/", 1)[-1]
        try:
            if "/rounds/" in path:
                doc = loads_untrusted(store.read_blob(m.files[path].sha256))
                out.append(_round_words(doc))
            elif "/errors/" in path:
                doc = loads_untrusted(store.read_blob(m.files[path].sha256))
                first = doc["errors"][0]
                out.append(f"attempt {doc['attempt_id']!r} rejected: {len(doc['errors'])} "
                           f"problem(s), first {first['rule']} at '{first['pointer'] or '/'}'")
            elif name == "confirmation.json":
                doc = loads_untrusted(store.read_blob(m.files[path].sha256))
                out.append(f"interpretation confirmed by {doc['confirmed_by']}")
            elif name in ("interpretation.json", "hypotheses.json"):
                out.append(f"{name.split('.')[0]} accepted")
            elif "/unblocks/" in path:
                doc = loads_untrusted(store.read_blob(m.files[path].sha256))
                out.append(f"unblocked by {doc['unblocked_by']} (series {doc['series']})")
            elif path.startswith("analysis/revisions/"):
                doc = loads_untrusted(store.read_blob(m.files[path].sha256))
                out.append(f"reopened as revision {doc['analysis_revision']}: "
                           f"{doc['reason']}")
        except (VianoError, UntrustedJson, KeyError, TypeError, IndexError):
            out.append(f"{path}: unreadable")
    return out


def _round_words(doc: dict[str, Any]) -> str:
    head = f"round {doc['series']}.{doc['round']} (attempt {doc['attempt_id']!r})"
    if doc["outcome"] == "answer":
        return f"{head}: answer from {doc['provider']}"
    tried: dict[str, list[str]] = {}
    for a in doc["attempts"]:
        tried.setdefault(a["provider"], []).append(a["detail"])
    why = "; ".join(f"{p}: {', '.join(d)}" for p, d in tried.items()) or "no provider"
    due = (doc.get("retry") or {}).get("due_at")
    return f"{head}: {doc['outcome']} ({why})" + (f", next due {due}" if due else "")


def cmd_log(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        ref, rows = whole_history(store, args.case)
        history = generation_history(store, rows)
    if out.as_json:
        out.document({"case_id": ref.case_id, "package_id": ref.package_id,
                      "generations": history})
    else:
        out.table(f"{ref.case_id} ({ref.package_id})",
                  ["gen", "phase", "created", "changed"],
                  [(h["package_generation"], h["phase"], h["created_at"], _describe(h))
                   for h in history])
    return 0


def _describe(h: dict[str, Any]) -> str:
    if "damaged" in h:
        return f"DAMAGED: {h['damaged']}"
    parts = list(h.get("events") or [])
    for key, label in (("removed", "REMOVED"), ("pointers_removed", "REMOVED pointers"),
                       ("added", "added"), ("replaced", "replaced"),
                       ("pointers_set", "pointers")):
        if h[key]:
            parts.append(f"{label} " + ", ".join(h[key]))
    return "; ".join(parts) or "(no file changes)"


def cmd_verify(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        for case_id in args.cases:
            store.case(case_id)  # an unknown case is a usage error (2), not a violation
        total = len(args.cases) if args.cases else len(store.list_cases())
        with out.progress("verifying cases", total) as advance:
            report = verify_store(store, args.cases or None, progress=advance,
                                  checks=PHASE_CHECKS)
    if out.as_json:
        out.document(report.to_json())
    else:
        leftovers = report.orphan_blob_files + report.temporary_files
        out.line(f"{report.cases} cases, {report.generations} generations, "
                 f"{report.blobs_checked} blobs rehashed, "
                 f"{report.orphan_blob_files} orphan blob files and "
                 f"{report.temporary_files} temporary files"
                 + (" ('viano gc' removes them)" if leftovers else ""))
        for v in report.violations:
            out.line(f"VIOLATION {v.case_id}: {v.what}")
        out.line("ok" if report.ok else f"{len(report.violations)} violation(s) in "
                                        f"{len(report.cases_affected)} case(s)")
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace, out: Output, config: Config) -> int:
    with reading(args, config) as store:
        summary = export_package(store, args.case, Path(args.file), force=args.force,
                                 store_root=store_path(args, config))
    if out.as_json:
        out.document(summary.to_json())
    else:
        out.line(f"exported {summary.case_id}: {summary.generations} generations, "
                 f"{summary.blobs} blobs -> {summary.path}")
    return 0


def cmd_import(args: argparse.Namespace, out: Output, config: Config) -> int:
    request = read_export(Path(args.file), config.intake.limits)
    location = store_location(args, config)
    published = one_change(out, lambda keep: _import(location, request, config.store,
                                                     out.note, keep), lambda done: done)
    doc = {"case_id": published.case_id, "package_id": published.package_id,
           "package_generation": published.generation}
    if out.as_json:
        out.document(doc)
    else:
        out.line(f"imported {published.case_id} ({published.package_id}) at generation "
                 f"{published.generation}")
    return 0


async def _import(location: str, request: ImportRequest, settings: StoreConfig,
                  on_wait: Callable[[str], None], keep: Callable[[StoreHandle], None]
                  ) -> Published:
    async with open_store(location, settings=settings) as store:
        keep(store)
        # The same export imported twice at once: the second waits, then finds the history
        # in place (an identical import is a no-op), instead of exiting locked.
        return await waiting_for_the_case(lambda: store.import_package(request), on_wait)


def cmd_gc(args: argparse.Namespace, out: Output, config: Config) -> int:
    try:
        with reading(args, config):
            pass
    except NotFound as exc:
        if exc.reason != "no_store" or store_named(args, config):
            raise
        report = None
    else:
        with writing(args, config) as store:
            report = collect_garbage(store, min_age_s=args.min_age)
    doc = report.to_json() if report else {"removed_files": 0, "removed_bytes": 0,
                                           "removed_temporary": 0, "kept_young": 0}
    if out.as_json:
        out.document(doc)
    else:
        out.line(f"removed {doc['removed_files']} orphan blob files ({doc['removed_bytes']} "
                 f"bytes) and {doc['removed_temporary']} temporary files; kept "
                 f"{doc['kept_young']} younger than {args.min_age:g}s")
    return 0

