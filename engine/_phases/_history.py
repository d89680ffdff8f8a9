"""Whether a phase's durable history stands up: every file of ``analysis/<key>/<NNNN>/``
checked against what the runner itself would have written, before any of it is relied on.

A package may come from an import (untrusted), and its hashes only prove that the files
are the ones its manifests name, not that the runner wrote them. So before a dispatch acts
on a revision's history, and whenever ``viano verify`` runs, the whole folder is audited:

* **files**: what the runner reads (policy, context, rounds, requests, errors, unblocks)
  and the phase's artifacts; any other file is preserved byte for byte and plays no role;
* **pinned inputs**: ``policy.json`` is exactly what the configuration types give for its
  values (a policy no configuration could produce is refused), and ``context.json`` is
  exactly what the case, the interpretation and the earlier revisions give under that
  policy, derived again;
* **rounds**: each record names its own series, round and outcome, is bound to the pinned
  policy, context and prompt by their hashes and by the attempt hash, and carries an answer
  that matches its hash (an invalid answer's round: what came back, or nothing); series
  follow one another only after a block and a well-formed unblock; every answer but the
  last was judged (an errors file); a rejection names a round that exists;
* **acceptance**: accepted artifacts come from the last round, an answer that was not
  rejected (what the artifacts themselves must contain is the phase's check);
* **pointers**: each of the phase's pointers names a file of the kind it is for, in a
  revision that exists.

What this cannot see is a history forged consistently end to end (every hash recomputed):
hashes give integrity, not authenticity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._canonical import artifact_json, sha256_hex
from ._memo import MEMO, Keyed
from ._prompts import load_prompt
from ._protocol import (
    ATTEMPT_ID,
    OUTCOMES,
    ROUND_FILE,
    UNBLOCK_FILE,
    Refusal,
    RoundInfo,
    attempt_hash,
    blocked_series,
    exhausted_by,
    phase_dir,
)
from ._records import recorded_at_ok, recorded_by_ok
from ._spec import PhaseSpec, paths, policy_bytes
from ._view import HistoryProblem, PackageView

_ERRORS = re.compile(r"errors/([0-9a-f]{64})\.json")
_REQUEST = re.compile(r"requests/([0-9a-f]{64})\.json")
_REVISION_DIR = re.compile(r"(\d{4})/")


def history_problems(spec: PhaseSpec, view: PackageView, revision: int) -> list[str]:
    """Everything wrong with revision ``revision``'s history of ``spec`` (empty: it stands
    up). Never raises for what the package holds."""
    try:
        return _Audit(spec, view, revision).run()
    except HistoryProblem as exc:
        return [str(exc)]
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        return [f"the {spec.key} history of revision {revision} is malformed ({exc!r})"]


def context_digest(spec: PhaseSpec, view: PackageView, policy: Mapping[str, Any],
                   revision: int) -> str | Refusal:
    """The sha256 of ``spec.context(view, policy, revision)`` (or its refusal), remembered
    by exactly what the derivation read (``_memo``): every step's audit derives the pinned
    context again from the same case files. Only the digest is kept, not the bytes (a
    context is 3-11 KB, and thousands of cases pass through)."""
    return MEMO.run(_context_digest, view, spec, revision,
                    Keyed(policy, artifact_json(dict(policy))))


def _context_digest(view: PackageView, spec: PhaseSpec, revision: int, policy: Keyed
                    ) -> str | Refusal:
    derived = spec.context(view, policy.value, revision)
    return derived if isinstance(derived, Refusal) else sha256_hex(derived)


def pointer_problems(spec: PhaseSpec, view: PackageView) -> list[str]:
    """Each pointer the phase owns names a file of its kind in the package: the one of the
    latest revision that has such a file (a pointer left on an older revision's file, or on
    anything else, is history nobody can account for)."""
    m = view.manifest
    revisions = range(1, m.analysis_revision + 1)
    fixed: dict[str, list[str]] = {}
    for rev in revisions:
        p = paths(spec, rev)
        named = {f"{spec.pointer_prefix}_policy": p["policy"],
                 f"{spec.pointer_prefix}_context": p["context"], **spec.artifacts(rev)}
        for name, path in named.items():
            if view.has(path):
                fixed.setdefault(name, []).append(path)
    patterned = {f"{spec.pointer_prefix}_last_round": ROUND_FILE,
                 f"{spec.pointer_prefix}_last_rejection": _ERRORS}
    owned = {f"{spec.pointer_prefix}_policy", f"{spec.pointer_prefix}_context",
             *spec.artifacts(1)}
    out = []
    for name, value in sorted(m.pointers.items()):
        if name in patterned:
            ok = view.has(value) and any(
                value.startswith(base := phase_dir(spec.key, rev))
                and patterned[name].fullmatch(value[len(base):]) is not None
                for rev in revisions)
        elif name in owned:
            ok = bool(fixed.get(name)) and value == fixed[name][-1]
        else:
            continue
        if not ok:
            out.append(f"pointer {name} names {value!r}, which is not the {spec.key} file "
                       "it is for")
    return out


def stray_revisions(spec: PhaseSpec, view: PackageView) -> list[str]:
    """Files under ``analysis/<key>/`` outside the folder of an existing revision (a folder
    prepared for a revision not yet opened would be picked up when it is)."""
    root = f"analysis/{spec.key}/"
    current = view.manifest.analysis_revision
    out = set()
    for path in view.manifest.paths_under(root):
        m = _REVISION_DIR.match(path[len(root):])
        if m is None or not 1 <= int(m.group(1)) <= current:
            out.add(path)
    return [f"{path} is outside every {spec.key} revision folder" for path in sorted(out)]


class _Audit:
    def __init__(self, spec: PhaseSpec, view: PackageView, revision: int):
        self.spec, self.view, self.rev = spec, view, revision
        self.base = phase_dir(spec.key, revision)
        self.out: list[str] = []

    def problem(self, message: str) -> None:
        self.out.append(message)

    def run(self) -> list[str]:
        files = sorted(self.view.manifest.paths_under(self.base))
        if not files:
            return []
        artifacts = set(self.spec.artifacts(self.rev).values())
        rounds: list[RoundInfo] = []
        errors: dict[str, str] = {}
        unblocks: dict[int, str] = {}
        for path in files:
            rel = path[len(self.base):]
            if rel in ("policy.json", "context.json") or path in artifacts:
                continue
            if m := ROUND_FILE.fullmatch(rel):
                rounds.append(RoundInfo(path, int(m.group(1)), int(m.group(2)), m.group(3)))
            elif m := _ERRORS.fullmatch(rel):
                errors[m.group(1)] = path
            elif m := UNBLOCK_FILE.fullmatch(rel):
                unblocks[int(m.group(1))] = path
            elif (m := _REQUEST.fullmatch(rel)) and self.view.sha(path) != m.group(1):
                self.problem(f"{path} does not hold the request body its name hashes")
            # Any other file is preserved and plays no role (the spec: package filenames
            # play no functional role); only what the runner reads is audited.
        p = paths(self.spec, self.rev)
        pinned = [self.view.has(p["policy"]), self.view.has(p["context"])]
        if not any(pinned) and not (rounds or errors or unblocks
                                    or self.spec.accepted(self.view, self.rev)):
            return self.out   # not entered (any other file plays no role)
        if not all(pinned):
            self.problem(f"{self.base} holds {self.spec.key} history without both its "
                         "pinned policy and context")
            return self.out
        policy = self._policy(p["policy"])
        if policy is not None:
            self._context(p["context"], policy)
        docs = self._rounds(rounds)
        self._series(rounds, docs, unblocks)
        self._rejections(rounds, docs, errors)
        self._acceptance(rounds, docs, errors)
        return self.out

    def _policy(self, path: str) -> Mapping[str, Any] | None:
        doc = self.view.read_object(path)
        rebuilt = self.spec.pinned_policy(doc.get("policy"))
        if rebuilt is None or self.view.read(path) != policy_bytes(self.spec, self.rev,
                                                                   rebuilt):
            self.problem(f"{path} is not a policy this version's configuration can pin")
            return None
        return rebuilt

    def _context(self, path: str, policy: Mapping[str, Any]) -> None:
        derived = context_digest(self.spec, self.view, policy, self.rev)
        if isinstance(derived, Refusal):
            self.problem(f"{path} cannot be derived again ({derived.reason}: "
                         f"{derived.message})")
        else:
            # Readable (an unreadable blob is a HistoryProblem). From the document cache
            # when this process wrote or read it already; the store hashed the bytes it
            # stored when it committed them, and verify checks every blob.
            self.view.read(path)
            if derived != self.view.sha(path):  # the read bytes have the manifest's hash
                self.problem(f"{path} is not what the case gives under the pinned policy")

    def _rounds(self, rounds: Sequence[RoundInfo]) -> dict[str, Mapping[str, Any]]:
        docs: dict[str, Mapping[str, Any]] = {}
        inputs = pinned_inputs(self.view, self.spec, self.rev)
        for r in rounds:
            docs[r.path] = self.view.read_object(r.path)
            # Not remembered: a phase's steps audit a round about once (after it is
            # recorded), so a memo's watched reads only cost here (measured: no hits).
            wrong = _round_wrong(self.view, self.spec, self.rev, r, docs[r.path], inputs)
            if wrong:
                self.problem(f"{r.path} is not a round this phase recorded (its "
                             f"{', '.join(wrong)} do not match)")
        return docs

    def _series(self, rounds: Sequence[RoundInfo], docs: Mapping[str, Mapping[str, Any]],
                unblocks: Mapping[int, str]) -> None:
        by_series: dict[int, list[RoundInfo]] = {}
        for r in rounds:
            by_series.setdefault(r.series, []).append(r)
        last = max([1, *by_series, *unblocks])
        for s in range(1, last + 1):
            mine = sorted(by_series.get(s, []), key=lambda r: r.round)
            if [r.round for r in mine] != list(range(1, len(mine) + 1)):
                self.problem(f"series {s} of {self.base} does not number its rounds "
                             "1, 2, ... once each")
            for r in mine[:-1]:
                if blocked_series(docs.get(r.path)):
                    self.problem(f"{r.path} blocked its series, yet rounds follow it")
            if s == 1:
                if 1 in unblocks:
                    self.problem(f"{unblocks[1]}: series 1 needs no unblock")
                continue
            path = unblocks.get(s)
            before = sorted(by_series.get(s - 1, []), key=lambda r: r.round)
            if path is None:
                self.problem(f"series {s} of {self.base} has no unblock")
                continue
            doc = self.view.read_object(path)
            if not before or not (blocked_series(docs.get(before[-1].path))
                                  or _exhausted_by_a_lower_limit(doc, before)):
                self.problem(f"{path} unblocks series {s - 1}, which did not end blocked")
            if not (doc.get("format") == "viano-unblock/1"
                    and doc.get("phase") == self.spec.phase
                    and doc.get("analysis_revision") == self.rev
                    and doc.get("series") == s and doc.get("after_series") == s - 1
                    and doc.get("after_rounds") == len(before)
                    and recorded_by_ok(doc.get("unblocked_by"))
                    and recorded_at_ok(doc.get("unblocked_at"))):
                self.problem(f"{path} is not an unblock this phase recorded")

    def _rejections(self, rounds: Sequence[RoundInfo], docs: Mapping[str, Mapping[str, Any]],
                    errors: Mapping[str, str]) -> None:
        judged = {str(docs[r.path].get("attempt_hash")): r for r in rounds
                  if r.outcome in ("answer", "invalid") and r.path in docs}
        for h, path in sorted(errors.items()):
            doc = self.view.read_object(path)
            r = judged.get(h)
            ref = doc.get("round")
            if r is None or not (doc.get("format") == "viano-rejection/1"
                                 and doc.get("attempt_hash") == h
                                 and isinstance(ref, dict) and ref.get("path") == r.path
                                 and ref.get("sha256") == self.view.sha(r.path)
                                 and isinstance(doc.get("errors"), list)
                                 and doc["errors"]):
                self.problem(f"{path} does not reject an answer of {self.base}")
        ordered = sorted(rounds, key=lambda r: (r.series, r.round))
        for r in ordered[:-1]:
            if r.outcome in ("answer", "invalid") and \
                    str(docs.get(r.path, {}).get("attempt_hash")) not in errors:
                self.problem(f"{r.path} holds an answer that was never judged, yet rounds "
                             "follow it")

    def _acceptance(self, rounds: Sequence[RoundInfo], docs: Mapping[str, Mapping[str, Any]],
                    errors: Mapping[str, str]) -> None:
        if not self.spec.accepted(self.view, self.rev):
            return
        ordered = sorted(rounds, key=lambda r: (r.series, r.round))
        last = ordered[-1] if ordered else None
        origin = self.spec.origin_round(self.view, self.rev)
        if last is None or last.outcome != "answer" or origin != last.path or \
                str(docs[last.path].get("attempt_hash")) in errors:
            self.problem(f"the accepted {self.spec.key} of revision {self.rev} does not come "
                         "from the phase's last round, an answer that was not rejected")
        self.out += self.spec.artifact_problems(self.view, self.rev)


def _exhausted_by_a_lower_limit(unblock: Mapping[str, Any], rounds: Sequence[RoundInfo]
                                ) -> bool:
    """An unblock of a series whose last round was not blocked by the limit of its time,
    but which a lower ``max_rounds`` exhausted (its unblock names that limit)."""
    limit = unblock.get("exhausted_by_max_rounds")
    return type(limit) is int and exhausted_by(limit, rounds)


def pinned_inputs(view: PackageView, spec: PhaseSpec, rev: int) -> dict[str, Any]:
    """The inputs a round record of ``rev`` names (the runner writes them, the audit
    requires them): the prompt, and the pinned context and policy, by their hashes."""
    p = paths(spec, rev)
    return {"prompt_id": spec.prompt_id, "prompt_sha256": load_prompt(spec.prompt_id).sha256,
            "context": p["context"], "context_sha256": view.sha(p["context"]),
            "policy": p["policy"], "policy_sha256": view.sha(p["policy"])}


def _round_wrong(view: PackageView, spec: PhaseSpec, rev: int, r: RoundInfo,
                 doc: Mapping[str, Any], inputs: Mapping[str, Any]) -> list[str]:
    """What of round ``r``'s record ``doc`` does not match what the phase records for it:
    its own fields, its binding to the pinned ``inputs`` (by their hashes and the attempt
    hash), its answer's hash and its request bodies'."""
    m = view.manifest
    aid = doc.get("attempt_id")
    expected_hash = attempt_hash(
        package_id=m.package_id, phase=spec.phase, revision=rev, attempt_id=str(aid),
        prompt_id=spec.prompt_id, prompt_sha256=str(inputs["prompt_sha256"]),
        context_sha256=str(inputs["context_sha256"]),
        policy_sha256=str(inputs["policy_sha256"]))
    return [what for what, ok in (
        ("format", doc.get("format") == "viano-round/1"),
        ("phase", doc.get("phase") == spec.phase),
        ("revision", doc.get("analysis_revision") == rev),
        ("series and round", (doc.get("series"), doc.get("round")) == (r.series, r.round)),
        ("outcome", OUTCOMES.get(str(doc.get("outcome"))) == r.outcome),
        ("attempt id", isinstance(aid, str) and ATTEMPT_ID.fullmatch(aid)),
        ("inputs", doc.get("inputs") == inputs),
        ("attempt hash", doc.get("attempt_hash") == expected_hash),
        ("answer", _answer_ok(doc, r.outcome)),
        ("request bodies", _requests_ok(view, doc))) if not ok]


def _answer_ok(doc: Mapping[str, Any], outcome: str) -> bool:
    """An answer round carries its answer; an invalid one carries what came back when the
    runner could keep it (or nothing); no other round carries any. Whatever is carried
    matches its hash and size."""
    answer = doc.get("answer")
    if outcome == "invalid" and answer is None:
        return True
    if outcome not in ("answer", "invalid"):
        return answer is None
    if not isinstance(answer, dict) or set(answer) != {"content", "sha256", "bytes"} or \
            not isinstance(answer.get("content"), str):
        return False
    raw = answer["content"].encode("utf-8")
    return answer.get("sha256") == sha256_hex(raw) and answer.get("bytes") == len(raw)


def _requests_ok(view: PackageView, doc: Mapping[str, Any]) -> bool:
    attempts = doc.get("attempts")
    if not isinstance(attempts, list):
        return False
    for a in attempts:
        if not isinstance(a, dict):
            return False
        body = a.get("request_body")
        if body is None:
            continue
        if not isinstance(body, dict) or body.get("sha256") is None or \
                view.sha(str(body.get("path"))) != body.get("sha256"):
            return False
    return True
