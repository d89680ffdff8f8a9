"""LiteLLM Router as an optional peer in bench/gateway.py (asyncio; imported only when
``litellm`` is installed: ``.venv/bin/pip install litellm``). Same setup as Viano's: one
OpenAI-compatible deployment for throughput; a primary that refuses connections with a
fallback for the failover latency. Retries off, as in Viano's rounds (retries=0)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the network

import litellm
from litellm import Router

litellm.suppress_debug_info = True
litellm.telemetry = False


def _deployment(name: str, url: str) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": "openai/bench", "api_base": url,
                                                   "api_key": "sk-bench", "timeout": 30}}


def _messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def rate(port: int, concurrency: int, seconds: float, system: str, user: str,
         ) -> dict[str, float]:
    async def run() -> dict[str, float]:
        router = Router(model_list=[_deployment("bench", f"http://127.0.0.1:{port}/v1")],
                        num_retries=0)
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await router.acompletion(model="bench", messages=_messages(system, user))
                if r.choices[0].message.content:
                    latencies.append(time.perf_counter() - t0)

        await router.acompletion(model="bench", messages=_messages(system, user))
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        latencies.sort()
        return {"rate": len(latencies) / elapsed,
                "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3,
                "cpu_us": (time.process_time() - cpu0) / max(len(latencies), 1) * 1e6}

    return asyncio.run(run())


def failover_added_ms(port: int, dead: int, rounds: int, system: str, user: str) -> float:
    async def run() -> float:
        direct_router = Router(model_list=[_deployment("bench", f"http://127.0.0.1:{port}/v1")],
                               num_retries=0)
        failover_router = Router(
            model_list=[_deployment("primary", f"http://127.0.0.1:{dead}/v1"),
                        _deployment("fallback", f"http://127.0.0.1:{port}/v1")],
            fallbacks=[{"primary": ["fallback"]}], num_retries=0, allowed_fails=10**9)
        medians = []
        for router, model in ((direct_router, "bench"), (failover_router, "primary")):
            await router.acompletion(model=model, messages=_messages(system, user))
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                await router.acompletion(model=model, messages=_messages(system, user))
                samples.append(time.perf_counter() - t0)
            samples.sort()
            medians.append(samples[len(samples) // 2])
        return (medians[1] - medians[0]) * 1e3

    return asyncio.run(run())
