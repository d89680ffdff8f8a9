"""The loopback provider server is startable from the command line, as benchmarks use it."""

from __future__ import annotations

import json
import subprocess

import httpx

from tests.conftest import PYTHON, REPO, child_env


def test_cli_server_answers_both_wire_formats() -> None:
    """`python -m tests.loopback` prints its port and answers OpenAI and Anthropic requests."""
    proc = subprocess.Popen([PYTHON, "-m", "tests.loopback", "--mode", "fenced"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout is not None
        word, port = proc.stdout.readline().split()
        assert word == "listening"
        with httpx.Client(timeout=10) as client:
            o = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m"})
            a = client.post(f"http://127.0.0.1:{port}/v1/messages", json={"model": "m"})
        assert o.json()["choices"][0]["message"]["content"].startswith("```json")
        assert json.loads(a.json()["content"][0]["text"].strip("`json\n"))["summary"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
