"""The CLI's commands: thin layers over the engine and the store handle."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import trio

from actors import open_store
from engine import (
    Attachment,
    Config,
    ImportRequest,
    IntakePlan,
    NotFound,
    Published,
    SqliteStore,
    VianoError,
    collect_garbage,
    export_package,
    prepare_intake,
    read_export,
    verify_store,
)

from ._output import Output

DEFAULT_STORE = "viano-store"


def store_path(args: argparse.Namespace) -> Path:
    return Path(args.store or os.environ.get("VIANO_STORE") or DEFAULT_STORE)


def open_existing(args: argparse.Namespace) -> SqliteStore:
    return SqliteStore.open(store_path(args), create=False)


def cmd_intake(args: argparse.Namespace, out: Output, config: Config) -> int:
    attachments = [Attachment.parse(spec) for spec in args.attach]
    total = sum(a.path.stat().st_size for a in attachments if a.path.is_file())
    with out.progress("reading attachments", total, unit_bytes=True) as advance:
        plan = prepare_intake(Path(args.report), attachments, case_id=args.case_id,
                              limits=config.intake.limits, progress=advance)
    published = trio.run(_publish_intake, store_path(args), plan)
    _print_intake(out, plan, published)
    return 0


async def _publish_intake(root: Path, plan: IntakePlan) -> Published:
    async with open_store(root) as store:
        return await store.intake(plan)


def _print_intake(out: Output, plan: IntakePlan, published: Published) -> None:
    sources = plan.catalogue["sources"]
    if out.as_json:
        out.document({"case_id": published.case_id, "package_id": published.package_id,
                      "package_generation": published.generation,
                      "phase": published.manifest["phase"], "title": plan.title,
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


def cmd_status(args: argparse.Namespace, out: Output, config: Config) -> int:
    try:
        refs = open_existing(args).list_cases()
    except NotFound:
        refs = []
    if args.cases:
        known = {r.case_id for r in refs}
        missing = [c for c in args.cases if c not in known]
        if missing:
            raise NotFound(f"no case {missing[0]!r} in {store_path(args)}",
                           reason="unknown_case")
        refs = [r for r in refs if r.case_id in set(args.cases)]
    rows = [{"case_id": r.case_id, "package_id": r.package_id, "phase": r.phase,
             "status": None, "reason": None, "analysis_revision": r.analysis_revision,
             "package_generation": r.generation, "due_at": None, "updated_at": r.updated_at}
            for r in refs]
    if out.as_json:
        out.document(rows)
    elif not rows:
        out.line(f"no cases in {store_path(args)}")
    else:
        out.table(None, ["case", "phase", "status", "revision", "generation", "due", "updated"],
                  [(r["case_id"], r["phase"], r["status"] or "-", r["analysis_revision"],
                    r["package_generation"], r["due_at"] or "-", r["updated_at"])
                   for r in rows])
    return 0


def cmd_show(args: argparse.Namespace, out: Output, config: Config) -> int:
    manifest = open_existing(args).manifest(args.case, args.generation)
    if out.as_json:
        out.document(manifest)
        return 0
    for key in ("case_id", "package_id", "package_generation", "parent_generation",
                "analysis_revision", "phase", "created_at"):
        out.line(f"{key}: {manifest[key]}")
    for name, target in manifest["pointers"].items():
        out.line(f"pointer {name} -> {target}")
    out.table("files", ["path", "bytes", "sha256"],
              [(p, e["size"], e["sha256"]) for p, e in manifest["files"].items()])
    return 0


def cmd_cat(args: argparse.Namespace, out: Output, config: Config) -> int:
    store = open_existing(args)
    manifest = store.manifest(args.case, args.generation)
    entry = manifest["files"].get(args.path)
    if entry is None:
        raise NotFound(f"case {args.case!r} has no file {args.path!r} in generation "
                       f"{manifest['package_generation']}", reason="unknown_path",
                       hint=f"Run 'viano show {args.case}' to list its files.")
    data = store.read_blob(entry["sha256"])
    if out.as_json:
        doc: dict[str, Any] = {"case_id": args.case, "path": args.path,
                               "package_generation": manifest["package_generation"], **entry}
        try:
            doc["text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            doc["base64"] = base64.b64encode(data).decode("ascii")
        out.document(doc)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def cmd_log(args: argparse.Namespace, out: Output, config: Config) -> int:
    store = open_existing(args)
    ref = store.case(args.case)
    history = []
    previous: dict[str, Any] = {"files": {}, "pointers": {}}
    for row in store.generations(ref.package_id):
        m = json.loads(row.manifest)
        added = sorted(set(m["files"]) - set(previous["files"]))
        replaced = sorted(p for p in m["files"] if p in previous["files"]
                          and m["files"][p] != previous["files"][p])
        pointers = sorted(k for k, v in m["pointers"].items() if previous["pointers"].get(k) != v)
        history.append({"package_generation": row.generation, "phase": row.phase,
                        "created_at": row.created_at, "manifest_sha256": row.manifest_sha256,
                        "added": added, "replaced": replaced, "pointers_set": pointers})
        previous = m
    if out.as_json:
        out.document({"case_id": ref.case_id, "package_id": ref.package_id,
                      "generations": history})
    else:
        out.table(f"{ref.case_id} ({ref.package_id})",
                  ["gen", "phase", "created", "changed"],
                  [(h["package_generation"], h["phase"], h["created_at"],
                    _describe(h)) for h in history])
    return 0


def _describe(h: dict[str, Any]) -> str:
    parts = []
    if h["added"]:
        parts.append("added " + ", ".join(h["added"]))
    if h["replaced"]:
        parts.append("replaced " + ", ".join(h["replaced"]))
    if h["pointers_set"]:
        parts.append("pointers " + ", ".join(h["pointers_set"]))
    return "; ".join(parts) or "(no file changes)"


def cmd_verify(args: argparse.Namespace, out: Output, config: Config) -> int:
    store = open_existing(args)
    total = len(args.cases) if args.cases else len(store.list_cases())
    with out.progress("verifying cases", total) as advance:
        report = verify_store(store, args.cases or None, progress=advance)
    if out.as_json:
        out.document(report.to_json())
    else:
        out.line(f"{report.cases} cases, {report.generations} generations, "
                 f"{report.blobs_checked} blobs rehashed, "
                 f"{report.orphan_blob_files} orphan blob files (run 'viano gc')")
        for v in report.violations:
            out.line(f"VIOLATION {v.case_id}: {v.what}")
        out.line("ok" if report.ok else f"{len(report.violations)} violation(s)")
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace, out: Output, config: Config) -> int:
    summary = export_package(open_existing(args), args.case, Path(args.file))
    if out.as_json:
        out.document(summary.to_json())
    else:
        out.line(f"exported {summary.case_id}: {summary.generations} generations, "
                 f"{summary.blobs} blobs -> {summary.path}")
    return 0


def cmd_import(args: argparse.Namespace, out: Output, config: Config) -> int:
    request = read_export(Path(args.file), config.intake.limits)
    published = trio.run(_import, store_path(args), request)
    doc = {"case_id": published.case_id, "package_id": published.package_id,
           "package_generation": published.generation}
    if out.as_json:
        out.document(doc)
    else:
        out.line(f"imported {published.case_id} ({published.package_id}) at generation "
                 f"{published.generation}")
    return 0


async def _import(root: Path, request: ImportRequest) -> Published:
    async with open_store(root) as store:
        return await store.import_package(request)


def cmd_gc(args: argparse.Namespace, out: Output, config: Config) -> int:
    try:
        store = open_existing(args)
    except NotFound:
        report = None
    else:
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


def sample_dir() -> Path:
    return Path(str(resources.files("viano_bug_analysis") / "sample"))


def cmd_demo(args: argparse.Namespace, out: Output, config: Config) -> int:
    sample = sample_dir()
    with tempfile.TemporaryDirectory(prefix="viano-demo-") as tmp:
        root = Path(tmp) / "store"
        plan = prepare_intake(sample / "report.json",
                              [Attachment("diagnostics", sample / "wowdiag.zip"),
                               Attachment("source", sample / "wowsrc.zip")],
                              case_id=None, limits=config.intake.limits)
        published = trio.run(_publish_intake, root, plan)
        report = verify_store(SqliteStore.open(root, create=False))
        if not report.ok:
            raise VianoError(f"demo store failed verification: {report.violations}")
        if out.as_json:
            out.document({"case_id": published.case_id, "package_generation":
                          published.generation, "catalogue": plan.catalogue,
                          "verify": report.to_json()})
            return 0
        out.line("Viano demo: intake of the bundled sample case (later phases add "
                 "interpretation and hypotheses here)")
        _print_intake(out, plan, published)
        out.line(f"verify: ok ({report.generations} generation, "
                 f"{report.blobs_checked} blobs rehashed)")
    return 0


COMMANDS = {"intake": cmd_intake, "status": cmd_status, "show": cmd_show, "cat": cmd_cat,
            "log": cmd_log, "verify": cmd_verify, "export": cmd_export, "import": cmd_import,
            "gc": cmd_gc, "demo": cmd_demo}
