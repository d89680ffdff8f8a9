"""``viano demo``: the bundled sample case end to end in a temporary store, with the
bundled fixture provider (no network, no key): intake, interpretation, confirmation and
hypotheses, then verify; prints the interpretation summary and the hypotheses."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import PhaseServices, case_operation, dispatch_phase, open_gateway, open_store
from engine import (
    PHASE_CHECKS,
    SPECS,
    Attachment,
    Config,
    DispatchResult,
    ProviderConfig,
    VianoError,
    confirm_change,
    open_backend,
    prepare_intake,
    verify_store,
)

from .._sample import bundled_sample
from ._output import Output
from ._phase_commands import request_for


async def _run(root: str, config: Config) -> tuple[list[DispatchResult], dict[str, bytes]]:
    sample = bundled_sample()
    plan = prepare_intake(sample / "report.json",
                          [Attachment("diagnostics", sample / "wowdiag.zip"),
                           Attachment("source", sample / "wowsrc.zip")],
                          case_id=None, limits=config.intake.limits)
    results = []
    async with open_gateway(config.providers, config.gateway) as gateway, \
            open_store(root) as store:
        published = await store.intake(plan)
        case = published.case_id
        services = PhaseServices(store, gateway)
        for spec in SPECS.values():
            results.append(await dispatch_phase(services, spec, case, request_for(spec, config)))
            if spec.key == "interpretation":
                await case_operation(store, case, lambda v: confirm_change(v, "viano demo"))
        snap = await store.snapshot(case)
        shown = {}
        for name in ("interpretation_summary", "hypotheses_summary"):
            path = snap.manifest.pointers.get(name)
            if path is not None:
                shown[name] = await snap.read(path)
    return results, shown


def cmd_demo(args: argparse.Namespace, out: Output, config: Config) -> int:
    fixtures = bundled_sample() / "fixtures"
    config = attrs.evolve(config, providers=(
        ProviderConfig(name="bundled-fixture", kind="fixture", path=str(fixtures)),))
    with tempfile.TemporaryDirectory(prefix="viano-demo-") as tmp:
        root = str(Path(tmp) / "store")
        results, shown = trio.run(_run, root, config)
        store = open_backend(root, write=False)
        try:
            report = verify_store(store, checks=PHASE_CHECKS)
        finally:
            store.close()
    failed = [r for r in results if r.status != "COMPLETED"]
    if failed or not report.ok:
        raise VianoError(f"the demo did not complete: {[r.to_json() for r in failed]} "
                         f"{report.violations}")
    if out.as_json:
        doc: dict[str, Any] = {"results": [r.to_json() for r in results],
                               "verify": report.to_json(),
                               **{k: v.decode("utf-8") for k, v in shown.items()}}
        out.document(doc)
        return 0
    out.line("Viano demo: the bundled sample case BUG-20, end to end, with the bundled "
             "fixture provider (a temporary store; nothing is kept)")
    for r in results:
        out.line(f"  {r.phase}: {r.status} ({r.reason}), generation {r.package_generation}")
    for text in shown.values():
        out.line("")
        out.line(text.decode("utf-8"))
    out.line(f"verify: ok ({report.generations} generations, {report.blobs_checked} blobs "
             "rehashed)")
    return 0
