"""The next steps printed under results name only commands and options that exist, with
the options of the command they follow: a hint for lines of many cases once named
`--attempt-id`, which `batch`, `run` and `daemon` do not have."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from viano_bug_analysis.cli import _next_steps
from viano_bug_analysis.cli._parser import build_parser

REASONS = sorted(set(_next_steps._NEXT_STEP) | set(_next_steps._MANY_NEXT_STEP))


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.no_store
@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("reason", REASONS)
def test_a_hint_names_real_commands_with_their_own_options(reason: str, many: bool) -> None:
    hint = _next_steps.next_step(reason, "C-1", many=many)
    assert hint is not None and "{" not in hint
    commands = _subcommands()
    named = re.findall(r"'viano ([a-z-]+)([^']*)'", hint)
    for command, rest in named:
        assert command in commands, (reason, command)
        options = {o for a in commands[command]._actions for o in a.option_strings}
        for option in re.findall(r"(--[a-z-]+)(?![a-z0-9-])", rest):
            assert option in options, (reason, command, option)
    for quoted in re.findall(r"'(viano [^']*)'", hint):  # each parses, arguments and all
        argv = shlex.split(quoted.replace("<summary.md path>", "analysis/s.md")
                           .replace("NEW", "a-2").replace("TEXT", "why"))[1:]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{reason}: {quoted!r} is not a command line viano takes")
    if many:  # the lines of many cases show no phase, no file and no --attempt-id
        for bare in re.findall(r"(--[a-z-]+)", re.sub(r"'viano [^']*'", "", hint)):
            pytest.fail(f"{reason}: {bare} named without the command it belongs to")
        assert "the phase above" not in hint and "named above" not in hint, reason
