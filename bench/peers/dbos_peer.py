"""The DBOS side of bench/peers/run.py, in its own process (DBOS needs asyncio): N cases,
each one durable workflow of three durable steps (interpret: a model call; confirm: a
local step; hypothesize: a model call) against the same loopback server, enqueued on a
DBOS queue with the same concurrency, with DBOS's SQLite system database. Written the way
DBOS's docs recommend: async workflow and steps, a queue with ``concurrency``,
``enqueue_async``, handles awaited. Prints one JSON line: cases, seconds, cases/s.

    python -m bench.peers.dbos_peer --port P --cases N --concurrency C --db FILE
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time

import httpx
from dbos import DBOS, DBOSConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cases", type=int, required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--db", required=True)
    args = ap.parse_args()
    config: DBOSConfig = {"name": "viano-peer", "system_database_url": f"sqlite:///{args.db}",
                          "run_admin_server": False}
    DBOS(config=config)
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
    limits = httpx.Limits(max_connections=args.concurrency,
                          max_keepalive_connections=args.concurrency)
    client = httpx.AsyncClient(limits=limits, timeout=120)

    async def call(prompt_id: str, case: str) -> str:
        # The loopback answers a context by its format, as it answers Viano's.
        context = {"format": f"viano-{prompt_id.split('_')[0]}-context/1", "case_id": case}
        body = {"model": "bench", "messages": [
            {"role": "system", "content": prompt_id},
            {"role": "user", "content": json.dumps(context)}]}
        r = await client.post(url, json=body)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"])

    @DBOS.step()
    async def interpret(case: str) -> str:
        return await call("interpretation_v1", case)

    @DBOS.step()
    async def confirm(interpretation: str) -> str:
        return hashlib.sha256(interpretation.encode()).hexdigest()

    @DBOS.step()
    async def hypothesize(case: str, confirmed: str) -> int:
        return len(await call("hypotheses_v1", case)) + len(confirmed)

    @DBOS.workflow()
    async def analyse(case: str) -> int:
        interpretation = await interpret(case)
        confirmed = await confirm(interpretation)
        return await hypothesize(case, confirmed)

    async def run() -> dict[str, float]:
        DBOS.launch()
        # Polled every 10 ms (the default is 1 s, which would cap it at a batch a second).
        queue = await DBOS.register_queue_async("cases", concurrency=args.concurrency,
                                                polling_interval_sec=0.01)
        t0 = time.perf_counter()
        handles = [await queue.enqueue_async(analyse, f"C-{i:05d}") for i in range(args.cases)]
        for h in handles:
            await h.get_result()
        elapsed = time.perf_counter() - t0
        await client.aclose()
        return {"cases": args.cases, "seconds": elapsed, "cases_per_s": args.cases / elapsed}

    result = asyncio.run(run())
    print(json.dumps(result), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main()
