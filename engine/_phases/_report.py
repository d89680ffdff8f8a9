"""``viano report``: a revision's interpretation and hypotheses for a person to read, or to
post back on the issue, as Markdown or as one JSON document.

Built only from artifacts whose history audits clean (the same audit ``verify`` runs), so
what is posted is what the package can stand behind; the footer names the package, the
generation and each artifact's hash, so a posted report can be traced back. Quotes of the
cited sources come from the interpretation's own context (the text the model was given).

Every text that a reporter or a model wrote is escaped (:func:`md_text`) so that, posted
on GitHub or in Jira, no link, image, HTML, heading, list, table, emphasis or macro
survives as markup and nobody is mentioned: GitHub Markdown's markup characters and
Jira wiki markup's (``!image!``, ``{macro}``, ``-strike-``, ``+under+``, ``^sup^``) are
backslash-escaped, a line-starting ``1.`` too; ``@name`` and ``#123`` get a word joiner
after the sign; and what GitHub links by itself (``GH-123``, a commit id of 7 to 40 hex
digits) is written as inline code, which it never links.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._errors import NotFound, PhaseRefused
from .._text import markdown_code
from .._text import markdown_inert as md_text
from ._history import history_problems
from ._view import PackageView

QUOTE_CHARS = 200


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTE_CHARS else flat[: QUOTE_CHARS - 1].rstrip() + "…"


def _distinct(ids: Iterable[Any]) -> list[Any]:
    """``ids`` once each, in the order they were first cited. The phases accept a
    reference cited twice (the released prompts do not forbid it, and a rule their text
    does not state is not enforced), so an answer citing S1 fifty thousand times renders
    it once, not as a report 25 times the answer's size."""
    return list(dict.fromkeys(ids))


def _cited_once(h: Any) -> Any:
    if not isinstance(h, dict):
        return h
    return {k: _distinct(v) if k in ("source_ids", "interpretation_ids") and
            isinstance(v, list) else v for k, v in h.items()}


def report_document(view: PackageView, revision: int | None = None) -> dict[str, Any]:
    """The report as data (what ``--format json`` prints, and what the Markdown renders)."""
    from . import SPECS  # the phase specs import this package's modules

    m = view.manifest
    rev = m.analysis_revision if revision is None else revision
    if not 1 <= rev <= m.analysis_revision:
        raise NotFound(f"case {m.case_id!r} has no analysis revision {rev} (revisions 1 to "
                       f"{m.analysis_revision})", reason="unknown_revision",
                       hint=f"Run 'viano log {m.case_id}' to see its revisions.")
    interp_dir = f"analysis/interpretation/{rev:04d}"
    interp_path = f"{interp_dir}/interpretation.json"
    if not view.has(interp_path):
        raise PhaseRefused(f"case {m.case_id!r} has no interpretation for revision {rev}",
                           reason="no_interpretation",
                           hint=f"Run 'viano interpret {m.case_id}' first.")
    problems = [p for spec in SPECS.values() for p in history_problems(spec, view, rev)]
    if problems:
        raise PhaseRefused(f"the history of case {m.case_id!r} does not verify: "
                           f"{problems[0]}", reason="unsupported_history",
                           hint=f"Run 'viano verify {m.case_id}' for every problem.")
    interp = view.read_object(interp_path)
    confirmation_path = f"{interp_dir}/confirmation.json"
    confirmation = view.read_object(confirmation_path) if view.has(confirmation_path) else None
    context = view.read_object(f"{interp_dir}/context.json")
    untrusted = context.get("untrusted_case_data") or {}
    texts = {t["source_id"]: t for t in untrusted.get("human_texts") or []}
    excerpts = {e["source_id"]: e for e in untrusted.get("excerpts") or []}
    catalogue = {s["source_id"]: s for s in untrusted.get("catalogue") or []}
    statements = interp.get("statements") or []
    hyp_dir = f"analysis/hypotheses/{rev:04d}"
    hyp_path, reg_path = f"{hyp_dir}/hypotheses.json", f"{hyp_dir}/registry.json"
    hypotheses = view.read_object(hyp_path) if view.has(hyp_path) else None
    registry = view.read_object(reg_path) if view.has(reg_path) else None
    shown = [_cited_once(h) for h in (hypotheses or {}).get("hypotheses") or []]
    cited = _distinct(x for item in [*statements, *shown] for x in item.get("source_ids") or [])

    def source(sid: str) -> dict[str, Any]:
        entry = catalogue.get(sid) or {}
        text = (texts.get(sid) or excerpts.get(sid) or {}).get("text")
        return {"source_id": sid, "kind": entry.get("kind"),
                "author": (texts.get(sid) or {}).get("author"),
                "quote": _quote(text) if isinstance(text, str) else None}

    trace = {"package_id": m.package_id, "package_generation": m.package_generation,
             "interpretation_sha256": view.sha(interp_path),
             "hypotheses_sha256": view.sha(hyp_path) if hypotheses is not None else None,
             "registry_sha256": view.sha(reg_path) if registry is not None else None}
    title = view.read_object(m.pointers["intake"]).get("title") if "intake" in m.pointers \
        else None
    return {"format": "viano-report/1", "case_id": m.case_id, "title": title,
            "analysis_revision": rev,
            "interpretation": {"summary": interp.get("summary"), "statements": [
                {"alias": s.get("alias"), "kind": s.get("kind"), "text": s.get("text"),
                 "source_ids": _distinct(s.get("source_ids") or [])} for s in statements],
                "missing_observations": interp.get("missing_observations") or [],
                "confirmed_by": (confirmation or {}).get("confirmed_by")},
            "sources": [source(s) for s in cited],
            "hypotheses": shown if hypotheses is not None else None,
            "allocation": [{"id": c.get("id"), **(c.get("budget_allocation") or {})}
                           for c in (registry or {}).get("creations") or []],
            "trace": trace}


def report_markdown(doc: dict[str, Any]) -> str:
    out: list[str] = []
    add = out.append
    title = md_text(str(doc["title"])) if doc.get("title") else markdown_code(doc["case_id"])
    add(f"## Viano analysis: {title}")
    add("")
    interp = doc["interpretation"]
    who = interp.get("confirmed_by")
    add(f"### Interpretation (revision {doc['analysis_revision']}, "
        + (f"confirmed by {md_text(str(who))})" if who else "not confirmed)"))
    add("")
    add(md_text(str(interp.get("summary") or "")))
    add("")
    for s in interp["statements"]:
        refs = ", ".join(md_text(str(x)) for x in s.get("source_ids") or [])
        add(f"- {md_text(str(s.get('alias')))} {md_text(str(s.get('kind')))}: "
            f"{md_text(str(s.get('text')))}" + (f" ({refs})" if refs else ""))
    for gap in interp.get("missing_observations") or []:
        add(f"- missing: {md_text(str(gap))}")
    if doc["sources"]:
        add("")
        add("### Cited sources")
        add("")
        for s in doc["sources"]:
            who = f", {md_text(str(s['author']))}" if s.get("author") else ""
            quote = f": “{md_text(s['quote'])}”" if s.get("quote") else ""
            add(f"- {md_text(s['source_id'])} ({md_text(str(s.get('kind')))}{who}){quote}")
    add("")
    hyps = doc.get("hypotheses")
    if not hyps:
        add("### Hypotheses")
        add("")
        add("No hypotheses for this revision yet.")
    else:
        add("### Hypotheses (competing, untested)")
        for h in hyps:
            add("")
            add(f"#### {md_text(str(h.get('id')))}: {md_text(str(h.get('title')))}")
            add("")
            add(f"- Mechanism: {md_text(str(h.get('mechanism')))}")
            add(f"- Distinction: {md_text(str(h.get('distinction')))}")
            for label, key in (("Expected evidence", "expected_evidence"),
                               ("Falsifying evidence", "falsifying_evidence"),
                               ("Open questions", "open_questions")):
                items = h.get(key) or []
                add(f"- {label}:" + ("" if items else " none"))
                out.extend(f"  - {md_text(str(i))}" for i in items)
            refs = ", ".join(md_text(str(x)) for x in [*(h.get("source_ids") or []),
                                                         *(h.get("interpretation_ids") or [])])
            add(f"- Grounded in: {refs}")
        add("")
        add("### Allocation")
        add("")
        add("| hypothesis | initial budget | unit |")
        add("| --- | --- | --- |")
        for a in doc["allocation"]:
            add(f"| {md_text(str(a.get('id')))} | {md_text(str(a.get('initial')))} | "
                f"{md_text(str(a.get('unit')))} |")
    t = doc["trace"]
    add("")
    add("---")
    add("")
    # Ids and hashes as code: GitHub would link a hex run that names one of its commits.
    parts = [f"Viano report of case {markdown_code(doc['case_id'])}",
             f"package `{t['package_id']}`", f"generation {t['package_generation']}",
             f"interpretation sha256 `{t['interpretation_sha256']}`"]
    if t.get("hypotheses_sha256"):
        parts += [f"hypotheses sha256 `{t['hypotheses_sha256']}`",
                  f"registry sha256 `{t['registry_sha256']}`"]
    add(" · ".join(parts))
    return "\n".join(out) + "\n"
