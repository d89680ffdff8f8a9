"""What the providers did, from the durable round records: answers, failures by class and
cooldown skips per provider, over every case of a store (``viano status --summary``). The
same counts a running gateway keeps in memory, but for every process that ever ran."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._json import UntrustedJson, loads_untrusted
from .._store import CaseRef, Store

_SKIPPED = "skipped_cooldown"


def provider_statistics(store: Store, refs: Iterable[CaseRef]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for ref in refs:
        manifest = store.manifest(ref.package_id, ref.generation)
        for path, entry in manifest.files.items():
            if not path.startswith("analysis/") or "/rounds/" not in path:
                continue
            try:
                doc = loads_untrusted(store.read_blob(entry.sha256))
                attempts = doc["attempts"]
            except (UntrustedJson, KeyError, TypeError):
                continue
            for a in attempts if isinstance(attempts, list) else []:
                if not isinstance(a, dict) or not isinstance(a.get("provider"), str):
                    continue
                s = out.setdefault(a["provider"], {"answers": 0, "failures": {},
                                                   "cooldown_skips": 0})
                failure = a.get("failure")
                if failure is None:
                    s["answers"] += 1
                elif failure == _SKIPPED:
                    s["cooldown_skips"] += 1
                else:
                    s["failures"][str(failure)] = s["failures"].get(str(failure), 0) + 1
    return dict(sorted(out.items()))
