"""Reading the case as intake recorded it: the catalogue, the intake record, the human texts
(resolved through their origin pointers into the stored originals, and checked against the
catalogue's hashes) and bounded, deterministic excerpts of textual attachments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .._canonical import sha256_hex
from .._config import IntakeLimits
from .._errors import ArchiveRejected, InvalidCaseId, ReportRejected
from .._intake import TextSource, converted, member_heads, parse_report
from ._view import CHECK_CHUNK, HistoryProblem, PackageView

HUMAN_KINDS = ("report", "comment", "observation")
TEXT_TYPES = ("text/", "application/json", "application/toml", "application/yaml",
              "application/xml", "application/x-sh")


@attrs.frozen
class CaseRecord:
    catalogue_path: str
    intake_path: str
    sources: tuple[Mapping[str, Any], ...]
    intake: Mapping[str, Any]

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(str(s["source_id"]) for s in self.sources)

    def human(self, source_id: str) -> bool:
        return any(s["source_id"] == source_id and s.get("human") is True
                   and s.get("kind") in HUMAN_KINDS for s in self.sources)


def read_case(view: PackageView) -> CaseRecord:
    m = view.manifest
    cat_path = m.pointers.get("catalogue")
    intake_path = m.pointers.get("intake")
    if cat_path is None or intake_path is None:
        raise HistoryProblem("the package has no catalogue or intake record")
    catalogue = view.read_object(cat_path)
    sources = catalogue.get("sources")
    if not isinstance(sources, list) or not all(
            isinstance(s, dict) and isinstance(s.get("source_id"), str) for s in sources):
        raise HistoryProblem(f"{cat_path} has no list of sources")
    return CaseRecord(cat_path, intake_path, tuple(sources), view.read_object(intake_path))


def catalogue_for_prompt(case: CaseRecord) -> list[dict[str, Any]]:
    """The canonical catalogue as the model sees it (hashes left out: they are noise to a
    model and are bound elsewhere)."""
    return [{**{k: s.get(k) for k in ("source_id", "kind", "human", "origin", "size",
                                       "media_type")},
             **{k: s[k] for k in _MARKS if k in s}} for s in case.sources]


# What some catalogues add (a Jira attachment's name and whether it was supplied, a hidden
# comment), given to the model only where present, so other contexts stay as they were.
_MARKS = ("name", "supplied", "supplied_as", "minimized")


def human_texts(view: PackageView, case: CaseRecord) -> list[dict[str, Any]]:
    """Every human source's text, resolved in its original and checked against the
    catalogue's sha256 (a mismatch is a package that does not stand up)."""
    texts = ReportTexts(view, case)
    out = []
    for s in case.sources:
        if not (s.get("human") is True and s.get("kind") in HUMAN_KINDS):
            continue
        text, author = texts.resolve(s)
        entry = {"source_id": s["source_id"], "kind": s["kind"], "author": author,
                 "text": text}
        if isinstance(s.get("minimized"), str):
            entry["minimized"] = s["minimized"]
        out.append(entry)
    return out


class ReportTexts:
    """The texts of a package's stored reports, read again with the format intake
    recorded for each (the original stays the only copy of the human evidence)."""

    def __init__(self, view: PackageView, case: CaseRecord):
        self.view = view
        reports = [i for i in case.intake.get("inputs") or [] if isinstance(i, dict)
                   and i.get("role") == "report" and isinstance(i.get("input"), str)]
        self.formats = {i["input"]: i.get("format") for i in reports}
        # The reader version that read each at intake (none recorded: version 1).
        self.readers = {i["input"]: i.get("reader", 1) for i in reports}
        self.parsed: dict[str, dict[str | None, TextSource]] = {}

    def resolve(self, s: Mapping[str, Any]) -> tuple[str, str | None]:
        """(text, author) of a source whose origin is a report, hash-checked."""
        origin = s.get("origin") or {}
        name = origin.get("input")
        if not isinstance(name, str):
            raise HistoryProblem(f"source {s['source_id']} has no origin input")
        raw = self.view.read(name)
        pointer = origin.get("pointer")
        if pointer is None:
            text, author, data = raw.decode("utf-8").removeprefix("\ufeff"), None, raw
        else:
            if name not in self.parsed:
                fmt = self.formats.get(name)
                reader = self.readers.get(name, 1)
                if reader is None:  # recorded, but as nothing
                    raise HistoryProblem(f"{name}: its intake record names reader null")
                try:
                    report = parse_report(raw, name, fmt if isinstance(fmt, str) else "json",
                                          reader=reader)
                except (ReportRejected, InvalidCaseId) as exc:
                    raise HistoryProblem(f"{name} is not the report intake read: "
                                         f"{exc}") from exc
                self.parsed[name] = report.by_pointer()
            found = self.parsed[name].get(str(pointer))
            if found is None:
                raise HistoryProblem(f"source {s['source_id']}: {name} has no text at "
                                     f"{pointer}")
            # By the conversion the catalogue recorded (an older ADF conversion's text
            # for a package taken in by an older version), never today's alone.
            as_recorded = converted(found, origin.get("conversion"))
            if as_recorded is None:
                raise HistoryProblem(f"source {s['source_id']}: its recorded conversion "
                                     f"{origin.get('conversion')!r} is not one this version "
                                     f"of Viano knows for {name} at {pointer}")
            text, author, data = as_recorded, found.author, as_recorded.encode("utf-8")
        if sha256_hex(data) != s.get("sha256"):
            raise HistoryProblem(f"source {s['source_id']} does not match its catalogue hash")
        return text, author


def excerpts(view: PackageView, case: CaseRecord, per_source: int, total: int
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Bounded excerpts of the textual non-human sources, in catalogue order: each its
    first ``per_source`` bytes (cut at a character boundary), all together at most
    ``total``. Returns (excerpts, the sources not excerpted with why). Deterministic."""
    kinds = {i.get("input"): i.get("archive") for i in case.intake.get("inputs") or []
             if isinstance(i, dict)}
    plan: list[tuple[Mapping[str, Any], int]] = []
    skipped: list[dict[str, Any]] = []
    budget = total
    for s in case.sources:
        if s.get("human") is True:
            continue
        if s.get("sha256") is None:  # listed by the report (Jira), not a stored input
            skipped.append({"source_id": s["source_id"],
                            "reason": "recorded_elsewhere" if s.get("supplied") else
                            "not_supplied"})
            continue
        media = str(s.get("media_type") or "")
        if not media.startswith(TEXT_TYPES):
            skipped.append({"source_id": s["source_id"], "reason": "not_text"})
            continue
        size = s["size"] if isinstance(s.get("size"), int) else 0
        want = min(per_source, size, budget)
        if want <= 0 and size > 0:
            skipped.append({"source_id": s["source_id"], "reason": "excerpt_budget_spent"})
            continue
        plan.append((s, want))
        budget -= want
    heads = _read_heads(view, plan, kinds, ReportTexts(view, case))
    out = []
    for s, want in plan:
        data = heads.get(str(s["source_id"]))
        if data is None:
            skipped.append({"source_id": s["source_id"], "reason": "unreadable"})
            continue
        text = _cut_text(data[:want])
        size = int(s.get("size") or 0)
        out.append({"source_id": s["source_id"], "bytes_total": size,
                    "bytes_included": len(text.encode("utf-8")),
                    "complete": want >= size and len(data) == size, "text": text})
    skipped.sort(key=lambda x: _order(case, x["source_id"]))
    return out, skipped


def _order(case: CaseRecord, source_id: str) -> int:
    return next(i for i, s in enumerate(case.sources) if s["source_id"] == source_id)


def reading_bound(view: PackageView, limit: int) -> int:
    """At most what deriving the case's context reads or expands, counted until it is over
    ``limit``: its files' stored bytes; for each tar input, what the limits let it expand
    to (a compressed one is inflated up to its members' heads; a plain one is counted so
    too, since the scan sniffs for gzip whatever the record says); for each zip input, a
    checked chunk per member the catalogue lists of it (their reads may jump between parts
    of it; the intake record's own count is an import's word, not what is read). A small
    ``tar.gz`` can be 200 times its stored size, and a zip of many small members costs a
    chunk read each: counting stored bytes alone, such a case was planned on the event
    loop. The case's documents are read only when the stored bytes are under ``limit``."""
    files = view.manifest.files
    total = sum(entry.size for entry in files.values())
    pointers = view.manifest.pointers
    if total > limit or not all(pointers.get(p) in files for p in ("catalogue", "intake")):
        return total
    case = read_case(view)
    inputs = case.intake.get("inputs")
    members: dict[str, int] = {}
    for s in case.sources:
        origin = s.get("origin")
        if not isinstance(origin, dict):
            continue
        name = origin.get("input")
        if isinstance(name, str) and "member" in origin:
            members[name] = members.get(name, 0) + 1
    limits = IntakeLimits()
    for i in inputs if isinstance(inputs, list) else []:
        name = i.get("input") if isinstance(i, dict) else None
        entry = files.get(name) if isinstance(name, str) else None
        if entry is None:
            continue
        kind = i.get("archive")
        if kind in ("tar", "tar.gz"):
            total += int(min(limits.max_total_bytes, entry.size * limits.max_compression_ratio))
        elif kind == "zip":
            total += members.get(str(name), 0) * CHECK_CHUNK
    return total


def _read_heads(view: PackageView, plan: list[tuple[Mapping[str, Any], int]],
                kinds: Mapping[Any, Any], texts: ReportTexts) -> dict[str, bytes]:
    """The heads the plan asks for. Every stored input they come from is read to its end
    first or with them, so the store checks it against its sha256: a head alone would
    reach no check, and damaged bytes would be pinned in the context (a damaged input
    is a HistoryProblem; the case actor names the store's reason). A zip's member heads
    are read through a checked opener (bytes that changed after its check are that
    damage too), a tar's in one forward read that ends with the check."""
    by_input: dict[str, dict[str, tuple[str, int]]] = {}
    out: dict[str, bytes] = {}
    for s, want in plan:
        origin = s.get("origin") or {}
        name = origin.get("input")
        if not isinstance(name, str) or not view.has(name):
            continue
        if "pointer" in origin:  # a text of a report that is not a human's (a bot's)
            out[str(s["source_id"])] = texts.resolve(s)[0].encode("utf-8")[:want]
            continue
        member = origin.get("member")
        if member is None:
            out[str(s["source_id"])] = view.read_head(name, want)
        else:
            by_input.setdefault(name, {})[str(member)] = (str(s["source_id"]), want)
    for name, members in by_input.items():
        kind = kinds.get(name)
        entry = view.manifest.files[name]
        if kind not in ("zip", "tar", "tar.gz"):
            continue
        try:
            # A zip is read by seeks (checked chunks); a tar forward, through the store's own
            # check, which its stream's close reaches before the heads are used.
            opener = view.checked_opener(name) if kind == "zip" else \
                view.forward_opener(name)
            heads = member_heads(opener, entry.size, str(kind),
                                 {m: w for m, (_, w) in members.items()}, IntakeLimits(),
                                 name)
        except ArchiveRejected:
            continue  # reported as unreadable by the caller
        for member, (source_id, _) in members.items():
            if member in heads:
                out[source_id] = heads[member]
    return out


def _cut_text(data: bytes) -> str:
    """Decode a head of a file: a character cut at the end is dropped, an invalid byte
    elsewhere shown as U+FFFD. Deterministic."""
    for back in range(0, 4):
        try:
            return data[: len(data) - back].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(data) - 4:
                break
    return data.decode("utf-8", errors="replace")
