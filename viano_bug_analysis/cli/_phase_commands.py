"""Commands that advance a case: interpret, confirm, reopen, unblock (and, with the
hypothesis phase, hypothesize). Each is one dispatch or one operation, under the case's
lease, with the exit codes of CONTRACT.md."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable
from typing import Any

import trio

from actors import (
    PhaseServices,
    Snapshot,
    case_operation,
    dispatch_phase,
    open_gateway,
    open_store,
)
from engine import (
    HYPOTHESES,
    INTERPRETATION,
    SPECS,
    CaseStatus,
    Change,
    Config,
    ConfigError,
    DispatchRequest,
    DispatchResult,
    PackageView,
    PhaseRefused,
    PhaseSpec,
    confirm_change,
    reopen_change,
    unblock_change,
)

from ._context import store_location
from ._output import Output


def request_for(spec: PhaseSpec, config: Config, attempt_id: str = "default"
                ) -> DispatchRequest:
    """The dispatch request of ``spec`` under the runtime configuration."""
    return DispatchRequest(policy=spec.configured(config), retry=config.retry,
                           attempt_id=attempt_id,
                           auto_confirm=config.interpretation.auto_confirm)


def require_providers(config: Config) -> None:
    if not config.providers:
        raise ConfigError(f"{config.source}: no [[providers]] are configured, so no model can "
                          "be asked", hint="Add a [[providers]] table (kind openai, "
                          "anthropic or fixture); see config/analysis.example.toml.")


async def dispatch_one(location: str, config: Config, spec: PhaseSpec, case_id: str,
                       request: DispatchRequest) -> DispatchResult:
    async with open_gateway(config.providers, config.gateway) as gateway, \
            open_store(location, create=False) as store:
        return await dispatch_phase(PhaseServices(store, gateway), spec, case_id, request)


def print_result(out: Output, result: DispatchResult) -> None:
    if out.as_json:
        out.document(result.to_json())
        return
    extra = []
    if result.round is not None:
        extra.append(f"round {result.round}/{result.max_rounds}")
    if result.due_at is not None:
        extra.append(f"due {result.to_json()['due_at']}")
    out.line(f"{result.case_id}: {result.status} ({result.reason}) {result.message}")
    out.line(f"  phase {result.phase}, revision {result.analysis_revision}, generation "
             f"{result.package_generation}, attempt {result.attempt_id}"
             + (f", {', '.join(extra)}" if extra else ""))


def cmd_interpret(args: argparse.Namespace, out: Output, config: Config) -> int:
    return _dispatch_cmd(args, out, config, INTERPRETATION)


def cmd_hypothesize(args: argparse.Namespace, out: Output, config: Config) -> int:
    return _dispatch_cmd(args, out, config, HYPOTHESES)


def _dispatch_cmd(args: argparse.Namespace, out: Output, config: Config,
                  spec: PhaseSpec) -> int:
    require_providers(config)
    request = request_for(spec, config, args.attempt_id)
    result = trio.run(dispatch_one, store_location(args, config), config, spec, args.case,
                      request)
    print_result(out, result)
    return result.exit_code


def _operation(args: argparse.Namespace, config: Config,
               make: Callable[[PackageView], tuple[Change, CaseStatus] | None]
               ) -> Snapshot | None:
    async def go() -> Snapshot | None:
        async with open_store(store_location(args, config), create=False) as store:
            return await case_operation(store, args.case, make)

    return trio.run(go)


def _who(args: argparse.Namespace) -> str:
    if getattr(args, "by", None):
        return str(args.by)
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _print_operation(out: Output, case_id: str, what: str, snap: Snapshot | None,
                     nothing: str) -> None:
    doc: dict[str, Any] = {"case_id": case_id, "operation": what, "changed": snap is not None}
    if snap is not None:
        m = snap.manifest
        doc.update(package_id=m.package_id, package_generation=m.package_generation,
                   analysis_revision=m.analysis_revision, phase=m.phase)
    if out.as_json:
        out.document(doc)
    elif snap is None:
        out.line(f"{case_id}: {nothing}")
    else:
        out.line(f"{case_id}: {what} (generation {doc['package_generation']}, revision "
                 f"{doc['analysis_revision']}, phase {doc['phase']})")


def cmd_confirm(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)
    snap = _operation(args, config, lambda view: confirm_change(view, by))
    _print_operation(out, args.case, f"interpretation confirmed by {by}", snap,
                     "the interpretation of this revision is already confirmed")
    return 0


def cmd_reopen(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)
    snap = _operation(args, config, lambda view: reopen_change(view, args.reason, by))
    _print_operation(out, args.case, "reopened in a new analysis revision", snap, "")
    return 0


def cmd_unblock(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)

    def make(view: PackageView) -> tuple[Change, CaseStatus]:
        spec = SPECS.get(view.manifest.phase)
        if spec is None:
            raise PhaseRefused(f"case {view.manifest.case_id!r} is in phase "
                               f"{view.manifest.phase}, which has no rounds to unblock",
                               reason="not_blocked")
        return unblock_change(view, spec, by)

    snap = _operation(args, config, make)
    _print_operation(out, args.case, "unblocked: a new series of rounds may run", snap, "")
    return 0
