"""The invariants a run leaves behind, checked on the store and on the calls the loopback
provider logged: used by the crash benchmark (bench/crash.py) and by the tests of many
workers on one store (tests/test_postgres_workers.py).

* every case is COMPLETED, with exactly one accepted interpretation and at most one
  hypothesis batch per revision;
* no H id or allocation is duplicated, and the allocations are created_count ×
  initial_budget;
* the originals are byte-identical to the files taken in;
* no model call came after a checkpointed answer (a call for a case and phase that
  arrived after that phase's durable answer round was finished);
* (:func:`overlapping_calls`) no case and phase was in flight at two workers at once.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

PROMPT_OF = {"interpretation": "interpretation_v1", "hypotheses": "hypotheses_v1"}
INITIAL_BUDGET = 100


def _posix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def repeated_calls(calls: Sequence[Mapping[str, Any]]) -> int:
    """Calls for a case and prompt beyond the first (a crash before a checkpoint)."""
    per_call = Counter((c["case_id"], c["prompt_id"]) for c in calls)
    return sum(n - 1 for n in per_call.values() if n > 1)


def store_violations(store: Any, originals: Mapping[str, bytes],
                     calls: Sequence[Mapping[str, Any]], *, one_batch: bool = False
                     ) -> list[str]:
    """What breaks the invariants above in ``store`` (any backend) given the arrivals
    ``calls``; ``one_batch``: each revision must have exactly one hypothesis batch."""
    problems: list[str] = []
    seen_originals: dict[str, bytes] = {}
    for ref in store.list_cases():
        m = store.manifest(ref.package_id, ref.generation)
        case = ref.case_id
        status = ref.status.status if ref.status else None
        if status != "COMPLETED":
            problems.append(f"{case}: status {status}, not COMPLETED")
        for rev in range(1, m.analysis_revision + 1):
            interp = f"analysis/interpretation/{rev:04d}/interpretation.json"
            hyps = [p for p in m.files
                    if re.fullmatch(rf"analysis/hypotheses/{rev:04d}/hypotheses\.json", p)]
            if interp not in m.files:
                problems.append(f"{case}: no accepted interpretation in revision {rev}")
            if len(hyps) > 1 or (one_batch and len(hyps) != 1):
                problems.append(f"{case}: {len(hyps)} hypothesis batches in {rev}")
            reg_path = f"analysis/hypotheses/{rev:04d}/registry.json"
            if reg_path in m.files:
                reg = json.loads(store.read_blob(m.files[reg_path].sha256))
                ids = [c["id"] for c in reg["creations"]]
                total = sum(c["budget_allocation"]["initial"] for c in reg["creations"])
                if len(set(ids)) != len(ids) or reg["created_count"] != len(ids):
                    problems.append(f"{case}: H ids {ids}, created {reg['created_count']}")
                if total != reg["created_count"] * INITIAL_BUDGET:
                    problems.append(f"{case}: allocations {total} for "
                                    f"{reg['created_count']} hypotheses")
        for path, entry in m.files.items():
            if path.startswith("inputs/"):
                seen_originals[path] = store.read_blob(entry.sha256)
        for phase, prompt in PROMPT_OF.items():
            rounds = sorted(p for p in m.files if re.fullmatch(
                rf"analysis/{phase}/\d{{4}}/rounds/[0-9-]+\.answer\.json", p))
            if not rounds:
                continue
            doc = json.loads(store.read_blob(m.files[rounds[-1]].sha256))
            done = _posix(doc["finished_at"])
            late = [c for c in calls if c["case_id"] == case and c["prompt_id"] == prompt
                    and c["t"] > done]
            if late:
                problems.append(f"{case}: {len(late)} {phase} call(s) after its "
                                "checkpointed answer")
    for path, data in originals.items():
        if seen_originals.get(path) != data:
            problems.append(f"{path}: the stored original differs from the file taken in")
    return problems


def overlapping_calls(finished: Sequence[Mapping[str, Any]]) -> list[str]:
    """Calls for one case and prompt in flight at two workers at the same time (each
    record has its arrival ``t``, its ``end`` and the ``path`` whose first segment names
    the worker)."""
    by_key: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for c in finished:
        by_key[(c["case_id"], c["prompt_id"])].append(c)
    problems = []
    for (case, prompt), calls in sorted(by_key.items()):
        calls = sorted(calls, key=lambda c: c["t"])
        for a, b in itertools.combinations(calls, 2):  # a few calls per case and prompt
            if worker_of(a) != worker_of(b) and b["t"] < a["end"] and a["t"] < b["end"]:
                problems.append(f"{case} {prompt}: {worker_of(a)} and {worker_of(b)} "
                                f"in flight together ({a['t']:.3f}-{a['end']:.3f}, "
                                f"{b['t']:.3f})")
    return problems


def worker_of(call: Mapping[str, Any]) -> str:
    return str(call["path"]).strip("/").split("/", 1)[0]
