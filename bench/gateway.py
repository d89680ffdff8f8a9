"""Answers per second through the gateway pool vs plain httpx, on the same loopback server.

The loopback provider server runs in its own process (``python -m tests.loopback``). For
each server delay (0 and 50 ms) and concurrency (1, 32, 128), workers run rounds for
``--seconds``: through Viano's gateway (one openai provider, max_concurrency 128, a pool of
16 connections as designed), and through a plain ``httpx.AsyncClient`` (default limits)
posting the same body and parsing the same answer. Also: the added latency of failover
when the first provider refuses connections. Medians of ``--repeats`` runs.

    python bench/gateway.py [--seconds 3] [--repeats 3]
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from actors import open_gateway  # noqa: E402
from bench._common import (  # noqa: E402
    median,
    parse_args,
    percentile,
    print_table,
    stop_server,
    write_json,
)
from engine import GatewayConfig, Prompt, ProviderConfig, RoundRequest, RoundStatus  # noqa: E402
from tests.loopback import dead_port  # noqa: E402

PROMPT = Prompt(prompt_id="hypotheses_v1", system="You are a benchmark.",
                user=json.dumps({"case": "BENCH", "pad": "x" * 2000}),
                schema={"type": "object"}, case_id="BENCH")


def start_server(delay_ms: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.loopback", "--delay-ms",
                             str(delay_ms)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    return proc, int(line[1])


async def drive(worker: Callable[[], Awaitable[bool]], concurrency: int,
                seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    ok = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal ok
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            if await worker():
                ok += 1
                latencies.append(time.perf_counter() - t0)

    t0, cpu0 = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
    elapsed = time.perf_counter() - t0
    return {"rate": ok / elapsed, "p50_ms": percentile(latencies, 0.5) * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3,
            "cpu_us": (time.process_time() - cpu0) / max(ok, 1) * 1e6}


def _provider(name: str, url: str) -> ProviderConfig:
    return ProviderConfig(name=name, kind="openai", base_url=url, model="bench", retries=0,
                          max_concurrency=128, timeout_s=30)


async def viano(port: int, concurrency: int, seconds: float,
                connections: int | None = None) -> dict[str, float]:
    cfg = GatewayConfig() if connections is None else GatewayConfig(max_connections=connections)
    async with open_gateway([_provider("p", f"http://127.0.0.1:{port}/v1")], cfg) as gw:
        async def one() -> bool:
            return (await gw.round(RoundRequest(PROMPT))).status is RoundStatus.ANSWER

        await one()  # warm the connection
        return await drive(one, concurrency, seconds)


async def viano_wide(port: int, concurrency: int, seconds: float) -> dict[str, float]:
    """The gateway with [gateway] max_connections raised to the concurrency: one big pool
    per provider instead of shards of 16 (shows why the default is what it is)."""
    return await viano(port, concurrency, seconds, connections=concurrency)


async def plain_httpx(port: int, concurrency: int, seconds: float) -> dict[str, float]:
    body = {"model": "bench", "messages": [{"role": "system", "content": PROMPT.system},
                                           {"role": "user", "content": PROMPT.user}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": PROMPT.prompt_id, "strict": True, "schema": dict(PROMPT.schema)}}}
    async with httpx.AsyncClient(timeout=30) as client:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"

        async def one() -> bool:
            r = await client.post(url, json=body)
            content = r.json()["choices"][0]["message"]["content"]
            return r.status_code == 200 and isinstance(json.loads(content), dict)

        await one()
        return await drive(one, concurrency, seconds)


async def failover_latency(port: int, rounds: int) -> dict[str, float]:
    direct, failover = [], []
    ok = [_provider("ok", f"http://127.0.0.1:{port}/v1")]
    dead = [_provider("dead", f"http://127.0.0.1:{dead_port()}/v1"), *ok]
    async with open_gateway(ok, GatewayConfig()) as g1, \
            open_gateway(dead, GatewayConfig(cooldown_after=1_000_000)) as g2:
        for gw, sink in ((g1, direct), (g2, failover)):
            await gw.round(RoundRequest(PROMPT))
            for _ in range(rounds):
                t0 = time.perf_counter()
                out = await gw.round(RoundRequest(PROMPT))
                assert out.status is RoundStatus.ANSWER
                sink.append(time.perf_counter() - t0)
    return {"direct_p50_ms": median(direct) * 1e3, "failover_p50_ms": median(failover) * 1e3,
            "added_ms": (median(failover) - median(direct)) * 1e3}


def _litellm() -> Any:
    """The optional LiteLLM Router peer, or None when litellm is not installed."""
    if importlib.util.find_spec("litellm") is None:
        return None
    import bench._litellm_peer as peer

    return peer


def _medians(results: list[dict[str, float]]) -> dict[str, float]:
    return {k: median([r[k] for r in results]) for k in results[0]}


def main() -> None:
    args = parse_args(__doc__, "concurrency", "1,32,128")
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: dict[tuple[int, int, str], list[dict[str, float]]] = {}
    fail: list[dict[str, float]] = []
    peer = _litellm()
    peer_failover: list[float] = []
    for delay in (0, 50):
        proc, port = start_server(delay)
        try:
            for rep in range(args.repeats):
                for c in levels:
                    for name, fn in (("viano", viano), ("wide", viano_wide),
                                     ("httpx", plain_httpx)):
                        res = trio.run(fn, port, c, args.seconds)
                        runs.setdefault((delay, c, name), []).append(res)
                        print(f"  rep {rep + 1} delay {delay} ms, {c:>3} concurrent, {name}: "
                              f"{res['rate']:,.0f}/s", flush=True)
                    if peer is not None:
                        res = peer.rate(port, c, args.seconds, PROMPT.system, PROMPT.user)
                        runs.setdefault((delay, c, "litellm"), []).append(res)
                        print(f"  rep {rep + 1} delay {delay} ms, {c:>3} concurrent, litellm: "
                              f"{res['rate']:,.0f}/s", flush=True)
                if delay == 0:
                    fail.append(trio.run(failover_latency, port, 200))
                    if peer is not None:
                        peer_failover.append(peer.failover_added_ms(
                            port, dead_port(), 200, PROMPT.system, PROMPT.user))
        finally:
            stop_server(proc)
    summary: list[dict[str, Any]] = []
    for delay in (0, 50):
        for c in levels:
            v, w, h = (_medians(runs[(delay, c, name)]) for name in ("viano", "wide", "httpx"))
            row: dict[str, Any] = {"delay_ms": delay, "concurrency": c,
                                   "viano_per_s": v["rate"], "wide_per_s": w["rate"],
                                   "httpx_per_s": h["rate"], "ratio": v["rate"] / h["rate"],
                                   "wide_ratio": w["rate"] / h["rate"],
                                   "viano_p99_ms": v["p99_ms"], "httpx_p99_ms": h["p99_ms"],
                                   "viano_cpu_us": v["cpu_us"], "httpx_cpu_us": h["cpu_us"]}
            if peer is not None:
                lite = _medians(runs[(delay, c, "litellm")])
                row.update({"litellm_per_s": lite["rate"],
                            "litellm_ratio": lite["rate"] / h["rate"],
                            "viano_vs_litellm": v["rate"] / lite["rate"],
                            "litellm_p99_ms": lite["p99_ms"], "litellm_cpu_us": lite["cpu_us"]})
            summary.append(row)
    columns = ["delay", "conc", "viano/s", "wide/s", "httpx/s", "x httpx", "wide x",
               "v p99", "h p99", "v cpu us", "h cpu us"]
    if peer is not None:
        columns += ["litellm/s", "lite x httpx", "viano x lite", "lite p99", "lite cpu us"]
    print_table(f"answers/s, medians of {args.repeats} runs of {args.seconds:.0f}s", columns,
                [list(r.values()) for r in summary])
    fo = _medians(fail)
    print(f"\nfailover past a refused connection: direct p50 {fo['direct_p50_ms']:.2f} ms, "
          f"with failover {fo['failover_p50_ms']:.2f} ms, added {fo['added_ms']:.2f} ms")
    if peer is None:
        print("litellm is not installed: the LiteLLM Router peer columns are omitted "
              "(.venv/bin/pip install litellm to add them)")
    else:
        fo["litellm_added_ms"] = median(peer_failover)
        print(f"LiteLLM Router failover past the same refused connection: added "
              f"{fo['litellm_added_ms']:.2f} ms")
    write_json("gateway", {"seconds": args.seconds, "repeats": args.repeats, "rows": summary,
                           "failover": fo})


if __name__ == "__main__":
    main()
