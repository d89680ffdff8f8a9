"""Reading the case as intake recorded it: the catalogue, the intake record, the human texts
(resolved through their origin pointers into the stored originals, and checked against the
catalogue's hashes) and bounded, deterministic excerpts of textual attachments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import attrs

from .._canonical import sha256_hex
from .._config import IntakeLimits
from .._errors import ArchiveRejected
from .._intake import member_heads
from .._json import UntrustedJson, loads_untrusted
from ._view import HistoryProblem, PackageView

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
    return [{k: s.get(k) for k in ("source_id", "kind", "human", "origin", "size",
                                    "media_type")} for s in case.sources]


def human_texts(view: PackageView, case: CaseRecord) -> list[dict[str, Any]]:
    """Every human source's text, resolved in its original and checked against the
    catalogue's sha256 (a mismatch is a package that does not stand up)."""
    out = []
    originals: dict[str, Any] = {}
    for s in case.sources:
        if not (s.get("human") is True and s.get("kind") in HUMAN_KINDS):
            continue
        origin = s.get("origin") or {}
        name = origin.get("input")
        if not isinstance(name, str):
            raise HistoryProblem(f"source {s['source_id']} has no origin input")
        raw = view.read(name)
        pointer = origin.get("pointer")
        author: str | None = None
        if pointer is None:
            text = raw.decode("utf-8").removeprefix("\ufeff")
            data = raw
        else:
            if name not in originals:
                try:
                    originals[name] = loads_untrusted(raw.removeprefix(b"\xef\xbb\xbf"))
                except UntrustedJson as exc:
                    raise HistoryProblem(f"{name} is not JSON: {exc}") from exc
            text = _resolve(originals[name], str(pointer))
            data = text.encode("utf-8")
            parent = str(pointer).rsplit("/", 1)[0]
            found = _resolve(originals[name], f"{parent}/author") if parent else None
            author = found if isinstance(found, str) else None
            if s.get("kind") == "report":
                reporter = originals[name].get("reporter") if isinstance(
                    originals[name], dict) else None
                author = reporter if isinstance(reporter, str) else None
        if sha256_hex(data) != s.get("sha256"):
            raise HistoryProblem(f"source {s['source_id']} does not match its catalogue hash")
        out.append({"source_id": s["source_id"], "kind": s["kind"], "author": author,
                    "text": text})
    return out


def _resolve(doc: Any, pointer: str) -> Any:
    """RFC 6901, over parsed JSON."""
    if pointer == "":
        return doc
    node = doc
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            return None
    return node


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
    heads = _read_heads(view, plan, kinds)
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


def _read_heads(view: PackageView, plan: list[tuple[Mapping[str, Any], int]],
                kinds: Mapping[Any, Any]) -> dict[str, bytes]:
    by_input: dict[str, dict[str, tuple[str, int]]] = {}
    out: dict[str, bytes] = {}
    for s, want in plan:
        origin = s.get("origin") or {}
        name = origin.get("input")
        if not isinstance(name, str) or not view.has(name):
            continue
        member = origin.get("member")
        if member is None:
            with view.open(name) as f:
                out[str(s["source_id"])] = f.read(want)
        else:
            by_input.setdefault(name, {})[str(member)] = (str(s["source_id"]), want)
    for name, members in by_input.items():
        kind = kinds.get(name)
        entry = view.manifest.files[name]
        if kind not in ("zip", "tar", "tar.gz"):
            continue
        def opener(n: str = name) -> IO[bytes]:
            return view.open(n)

        try:
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
