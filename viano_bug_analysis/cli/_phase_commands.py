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
    StoreHandle,
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
    Manifest,
    PackageView,
    PhaseRefused,
    PhaseSpec,
    UsageError,
    confirm_change,
    interpretation_paths,
    person,
    policy_like,
    reopen_change,
    store_errors_first,
    terminal_safe,
    unblock_change,
)

from ._context import one_change, store_location
from ._next_steps import next_step
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
                          "be asked",
                          hint="Give a configuration with a [[providers]] table (kind "
                               "openai, anthropic or fixture) by --config FILE, VIANO_CONFIG "
                               "or config/analysis.local.toml; copy "
                               "config/analysis.example.toml to start. 'viano demo' runs "
                               "with a bundled fixture provider.")


async def dispatch_one(location: str, config: Config, spec: PhaseSpec, case_id: str,
                       request: DispatchRequest) -> DispatchResult:
    async with open_gateway(config.providers, config.gateway) as gateway, \
            open_store(location, create=False, settings=config.store) as store:
        return await dispatch_phase(PhaseServices(store, gateway), spec, case_id, request)


def print_result(out: Output, result: DispatchResult) -> None:
    if out.as_json:
        out.document(result.to_json())
        return
    extra = []
    if result.round is not None:
        # max_rounds bounds the rounds without an available provider, not every round (a
        # round every provider refused, or an invalid answer, does not count against it).
        extra.append(f"round {result.round}" if result.max_rounds is None else
                     f"round {result.round}, at most {result.max_rounds} without a provider")
    if result.due_at is not None:
        extra.append(f"due {result.to_json()['due_at']}")
    out.line(f"{result.case_id}: {result.status} ({result.reason}) {result.message}")
    out.line(f"  phase {result.phase}, revision {result.analysis_revision}, generation "
             f"{result.package_generation}, attempt {result.attempt_id}"
             + (f", {', '.join(extra)}" if extra else ""))
    hint = next_step(result.reason, result.case_id)
    if hint:
        out.line(f"  what to do: {hint}")


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


def _operation(args: argparse.Namespace, config: Config, out: Output,
               make: Callable[[PackageView], tuple[Change, CaseStatus] | None],
               already: Callable[[PackageView], str] | None = None,
               ) -> tuple[Manifest, bool, str | None]:
    """The operation under the case's lease: the head after it, whether it changed
    anything, and (when it did not) ``already`` of the head. A Ctrl-C after its commit
    is not an interruption (:func:`one_change`)."""

    async def go(keep: Callable[[StoreHandle], None]) -> tuple[Manifest, bool, str | None]:
        async with open_store(store_location(args, config), create=False,
                              settings=config.store) as store:
            keep(store)
            snap = await case_operation(store, args.case, make)
            if snap is not None:
                return snap.manifest, True, None
            head = (await store.head(args.case))[1]
            said = None if already is None else await store.run_sync(
                store_errors_first, lambda on_fault: PackageView(
                    head.manifest, store.store.read_blob, None, on_fault), already)
            return head.manifest, False, said

    return one_change(out, go, lambda done: (done.manifest, True, None))


def _who(args: argparse.Namespace) -> str:
    """Who a person's operation is recorded as. ``policy:`` names are the engine's own (an
    auto-confirmation is recorded as ``policy:auto_confirm``): a person may not take one,
    or the audit would say a policy did what a person did."""
    if getattr(args, "by", None) is not None:
        # Checked before anything is read: an empty --by was taken as no --by (the login
        # was recorded), and on a case confirmed already a bad one was never checked.
        by = person(str(args.by))
        if policy_like(by):
            raise UsageError(f"--by {terminal_safe(repr(by))}: names starting with 'policy:' are "
                             "the engine's own (what a policy did)",
                             hint="Give your own name, or leave --by out to use your login.")
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _print_operation(out: Output, case_id: str, what: str, m: Manifest,
                     changed: bool) -> None:
    """One operation's outcome: the same fields whether it changed the case or found it
    done already."""
    doc: dict[str, Any] = {"case_id": case_id, "operation": what, "changed": changed,
                           "package_id": m.package_id,
                           "package_generation": m.package_generation,
                           "analysis_revision": m.analysis_revision, "phase": m.phase}
    if out.as_json:
        out.document(doc)
    else:
        out.line(f"{case_id}: {what} (generation {doc['package_generation']}, revision "
                 f"{doc['analysis_revision']}, phase {doc['phase']})")


def cmd_confirm(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)

    def already(view: PackageView) -> str:
        path = interpretation_paths(view.manifest.analysis_revision)["confirmation"]
        doc = view.read_object(path)
        return (f"the interpretation of this revision was already confirmed by "
                f"{doc.get('confirmed_by')} at {doc.get('confirmed_at')}; nothing changed")

    manifest, changed, said = _operation(args, config, out,
                                         lambda view: confirm_change(view, by), already)
    _print_operation(out, args.case, said or f"interpretation confirmed by {by}", manifest,
                     changed)
    return 0


def cmd_reopen(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)
    manifest, changed, _ = _operation(args, config, out,
                                      lambda view: reopen_change(view, args.reason, by))
    _print_operation(out, args.case, "reopened in a new analysis revision", manifest,
                     changed)
    return 0


def cmd_unblock(args: argparse.Namespace, out: Output, config: Config) -> int:
    by = _who(args)

    def make(view: PackageView) -> tuple[Change, CaseStatus]:
        spec = SPECS.get(view.manifest.phase)
        if spec is None:
            raise PhaseRefused(f"case {view.manifest.case_id!r} is in phase "
                               f"{view.manifest.phase}, which has no rounds to unblock",
                               reason="not_blocked")
        return unblock_change(view, spec, by, max_rounds=config.retry.max_rounds)

    manifest, changed, _ = _operation(args, config, out, make)
    _print_operation(out, args.case, "unblocked: a new series of rounds may run", manifest,
                     changed)
    return 0
