"""Shared pieces of the phase tests: the sample case, its fixture answers, dispatch
services over the real gateway and a loopback server, and package comparison."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
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
    prepare_intake,
)
from viano_bug_analysis import bundled_sample

SAMPLE = bundled_sample()
FIXTURES = SAMPLE / "fixtures"
INTERPRETATION_ANSWER: dict[str, Any] = json.loads(
    (FIXTURES / "interpretation_v1" / "BUG-20.json").read_text())
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
