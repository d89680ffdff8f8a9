"""The loopback provider server in its own process (``python -m tests.loopback``), for tests
whose Viano runs as real processes too."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.conftest import PYTHON, REPO, child_env


class Provider:
    """``python -m tests.loopback`` in its own process, logging every request."""

    def __init__(self, tmp: Path, answers: Path, *, mode: str = "ok", script: str = "",
                 delay_ms: int = 0):
        self.log = tmp / f"provider-{time.monotonic_ns()}.log"
        args = [PYTHON, "-m", "tests.loopback", "--mode", mode, "--answers", str(answers),
                "--log", str(self.log), "--delay-ms", str(delay_ms)]
        if script:
            args += ["--script", script]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                     env=child_env())
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[0] == "listening", line
        self.port = int(line[1])

    @property
    def calls(self) -> list[dict[str, str]]:
        """Every request, as it arrived."""
        return [c for c in self._lines() if "end" not in c]

    @property
    def finished(self) -> list[dict[str, Any]]:
        """Every request that ended (answered, failed or cut off), with its arrival ``t``
        and its ``end``: when it was in flight."""
        return [c for c in self._lines() if "end" in c]

    def _lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        # Only whole lines: the server may be writing the last one as it is read (a test
        # that polled the log mid-write failed on half a JSON line).
        complete = self.log.read_text().split("\n")[:-1]
        return [json.loads(x) for x in complete if x.strip()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


def start_provider(tmp: Path, answers: Path, *, mode: str = "ok", script: str = "",
                   delay_ms: int = 0) -> Provider:
    return Provider(tmp, answers, mode=mode, script=script, delay_ms=delay_ms)
