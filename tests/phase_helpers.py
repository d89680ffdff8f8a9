"""Shared pieces of the phase tests: the sample case, its fixture answers, dispatch
services over the real gateway and a loopback server, and package comparison."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from actors import Clock, PhaseServices, StoreHandle, TrioClock, open_gateway, open_store
from engine import (
    INTERPRETATION,
    Attachment,
    Config,
    DispatchRequest,
    GatewayConfig,
    IntakeLimits,
    ProviderConfig,
    Published,
    RetryPolicy,
    artifact_json,
    prepare_intake,
)
from viano_bug_analysis import bundled_sample

SAMPLE = bundled_sample()
FIXTURES = SAMPLE / "fixtures"
INTERPRETATION_ANSWER: dict[str, Any] = json.loads(
    (FIXTURES / "interpretation_v1" / "BUG-20.json").read_text())
HYP_ANSWER: dict[str, Any] = json.loads((FIXTURES / "hypotheses_v1" / "BUG-20.json").read_text())
I1 = "analysis/interpretation/0001/"
H1 = "analysis/hypotheses/0001/"


async def start_sample_server(nursery: Any) -> Any:
    """The loopback provider answering the sample case's two prompts, serving in
    ``nursery`` (what the phase tests' ``server`` fixtures are)."""
    from tests.loopback import LoopbackServer

    srv = LoopbackServer(retry_after="0")
    srv.answers["interpretation_v1"] = json.dumps(INTERPRETATION_ANSWER)
    srv.answers["hypotheses_v1"] = json.dumps(HYP_ANSWER)
    await nursery.start(srv.serve)
    return srv
FAST = GatewayConfig(backoff_base_s=0.001, backoff_max_s=0.002, connect_timeout_s=2.0,
                     cooldown_after=1000)
KEY = "sk-VIANO-PHASE-4c8e1f2a9b7d3e6f"
ENV = {"VIANO_TEST_KEY": KEY}


def sample_plan(case_id: str | None = None):  # type: ignore[no-untyped-def]
    return prepare_intake(SAMPLE / "report.json",
                          [Attachment("diagnostics", SAMPLE / "wowdiag.zip"),
                           Attachment("source", SAMPLE / "wowsrc.zip")],
                          case_id=case_id, limits=IntakeLimits())


async def intake_sample(store: StoreHandle, case_id: str | None = None) -> Published:
    return await store.intake(sample_plan(case_id))


def interpretation_request(config: Config | None = None, *, attempt_id: str = "default",
                           max_rounds: int = 10, base_delay_s: float = 30.0,
                           auto_confirm: bool = False) -> DispatchRequest:
    config = config or Config.defaults()
    return DispatchRequest(policy=INTERPRETATION.configured(config),
                           retry=RetryPolicy(max_rounds=max_rounds, base_delay_s=base_delay_s,
                                             max_delay_s=max(base_delay_s, 3600.0)),
                           attempt_id=attempt_id, auto_confirm=auto_confirm)


def http_provider(name: str, kind: str, base_url: str, **kw: Any) -> ProviderConfig:
    options: dict[str, Any] = {"retries": 0, "timeout_s": 5.0, "api_key_env": "VIANO_TEST_KEY",
                               **kw}
    return ProviderConfig(name=name, kind=kind, base_url=base_url,  # type: ignore[arg-type]
                          model="loopback-model", **options)


def fixture_provider() -> ProviderConfig:
    return ProviderConfig(name="fixture", kind="fixture", path=str(FIXTURES))


@asynccontextmanager
async def services(root: Path, providers: Sequence[ProviderConfig], *,
                   clock: Clock | None = None, gateway: GatewayConfig = FAST,
                   events: list[dict[str, Any]] | None = None,
                   ) -> AsyncIterator[PhaseServices]:
    sink = events.append if events is not None else (lambda _e: None)
    async with open_gateway(list(providers), gateway, environ=ENV) as gw, \
            open_store(root) as store:
        yield PhaseServices(store, gw, clock or TrioClock(), sink)


_TIMING = {"created_at", "started_at", "finished_at", "duration_ms", "confirmed_at",
           "calls_started", "due_at", "due_at_posix", "delay_s",
           "package_id"}  # a new store's package gets a new id
_HEX = re.compile(r"\b[0-9a-f]{64}\b")


def normalized_package(files: dict[str, bytes]) -> dict[str, Any]:
    """A package's logical files with what legitimately differs between two runs of the
    same dispatch removed: timestamps, audit timings, the at-least-once call count, and the
    hashes that differ only because of them (any sha256 is replaced by the path it names,
    or by a placeholder)."""
    by_sha: dict[str, str] = {}
    import hashlib

    for path, data in files.items():
        by_sha[hashlib.sha256(data).hexdigest()] = path

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in sorted(value.items()) if k not in _TIMING}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return _HEX.sub(lambda m: f"<{by_sha.get(m.group(), 'sha')}>", value)
        return value

    out: dict[str, Any] = {}
    for path, data in sorted(files.items()):
        try:
            out[path] = clean(json.loads(data))
        except ValueError:
            out[path] = data
    return out


async def package_files(store: StoreHandle, case_id: str) -> dict[str, bytes]:
    snap = await store.snapshot(case_id)
    return {p: await snap.read(p) for p in snap.manifest.files}


def evolve_request(request: DispatchRequest, **kw: Any) -> DispatchRequest:
    return attrs.evolve(request, **kw)


Edit = Callable[[bytes, Callable[[str], str]], bytes]


def rewrite_export(src: Path, dest: Path, edits: Sequence[tuple[str, Edit]]) -> Path:
    """An export rewritten as a forger would: each ``(path, edit)`` in turn replaces that
    file's bytes (``edit(old, sha_of)``, where ``sha_of(path)`` gives a file's current
    sha256, edits so far included) in every manifest that holds it, and every manifest and
    index hash is recomputed, so the store's own integrity rules accept the result."""
    import hashlib
    import zipfile

    import orjson

    with zipfile.ZipFile(src) as zin:
        members = {n: zin.read(n) for n in zin.namelist()}
    index = json.loads(members["viano-export.json"])
    manifests = [json.loads(members[f"manifests/{g['generation']:06d}.json"])
                 for g in index["generations"]]

    def sha_of(path: str) -> str:
        return str(manifests[-1]["files"][path]["sha256"])

    for path, edit in edits:
        old_sha = sha_of(path)
        new = edit(members[f"blobs/{old_sha}"], sha_of)
        new_sha = hashlib.sha256(new).hexdigest()
        members[f"blobs/{new_sha}"] = new
        for m in manifests:
            if m["files"].get(path, {}).get("sha256") == old_sha:
                m["files"][path] = {"sha256": new_sha, "size": len(new)}
        if not any(e["sha256"] == old_sha for m in manifests for e in m["files"].values()):
            del members[f"blobs/{old_sha}"]
    for g, m in zip(index["generations"], manifests, strict=True):
        raw = orjson.dumps(m, option=orjson.OPT_SORT_KEYS)
        members[f"manifests/{g['generation']:06d}.json"] = raw
        g["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
    members["viano-export.json"] = json.dumps(index).encode()
    with zipfile.ZipFile(dest, "w") as zout:
        for name, data in members.items():
            zout.writestr(name, data)
    return dest


def json_edit(change: Callable[[dict[str, Any], Callable[[str], str]], None]) -> Edit:
    """An :data:`Edit` of a JSON file: ``change(doc, sha_of)`` mutates the parsed document,
    which is written back as the artifacts are (indented, with a final newline)."""
    def edit(old: bytes, sha_of: Callable[[str], str]) -> bytes:
        doc = json.loads(old)
        change(doc, sha_of)
        return artifact_json(doc)
    return edit


def completed_sample_store(root: Path, answers: Path = FIXTURES) -> Path:
    """A store at ``root`` holding the sample case through both phases, as ``viano demo``
    makes it (the fixture provider, with the bundled ``answers`` unless told)."""
    import trio

    from viano_bug_analysis.cli._demo import _run

    provider = ProviderConfig(name="fixture", kind="fixture", path=str(answers))
    config = attrs.evolve(Config.defaults(), providers=(provider,))
    results, _ = trio.run(_run, str(root), config)
    assert [r.status for r in results] == ["COMPLETED", "COMPLETED"]
    return root


def interpretation_context(store_dir: Path, case_id: str) -> bytes:
    """The interpretation context revision 1 of the case derives now, with the default
    policy, from a store opened read-only (what verify derives again to compare)."""
    from engine import INTERPRETATION, PackageView
    from engine._config import InterpretationPolicy
    from engine._phases import interpretation_policy
    from tests.store_helpers import open_ro

    store = open_ro(store_dir)
    try:
        _ref, manifest = store.head(case_id)
        view = PackageView(manifest, store.read_blob, store.open_blob)
        raw = INTERPRETATION.context(view, interpretation_policy(InterpretationPolicy()), 1)
        assert isinstance(raw, bytes), raw
        return raw
    finally:
        store.close()
