"""The test harness's own helpers, where a wrong one would hide or invent a failure."""

from __future__ import annotations

import subprocess

from tests.conftest import PYTHON, rest_of

LINES = 5000
PRINTS = f"import sys\nfor i in range({LINES}): print(i)\nprint('done', file=sys.stderr)"


def test_rest_of_keeps_what_the_line_reader_buffered() -> None:
    """A test that reads a child's first line and then the rest gets every line: the
    buffered ones are not dropped (``communicate()`` drops them, which made the crash
    test's acknowledged generations look unacknowledged)."""
    with subprocess.Popen([PYTHON, "-c", PRINTS], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        first = child.stdout.readline()
        rest, err = rest_of(child)
        assert child.stdout.closed and child.stderr is not None and child.stderr.closed
    got = [first.strip(), *rest.split()]
    assert got == [str(i) for i in range(LINES)], (len(got), got[:3])
    assert err == "done\n"
    assert child.returncode == 0
