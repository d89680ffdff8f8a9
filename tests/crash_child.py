"""Child process for crash tests: publishes a stream of generations and prints each durable
acknowledgement as ``ack <case> <generation>``. Killed from outside (SIGKILL) or by an
armed ``VIANO_CRASH_AT`` point."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from actors import open_store
from engine import BytesSource, Change, PublishRequest, StaleGeneration, new_package_id


async def main(root: Path, writers: int, each: int) -> None:
    async with open_store(root, inline_threshold=1024) as store:

        async def writer(w: int) -> None:
            case = f"K-{os.getpid()}-{w}"
            pkg = new_package_id()
            head = None
            for i in range(each):
                payload = (f"{w}:{i}:".encode() * 2000)[: 600 + (i % 3) * 1000]
                req = PublishRequest(pkg, case, head, Change(
                    files={f"data/{i % 4}.bin": BytesSource.of(payload),
                           "inputs/fixed.txt": BytesSource.of(b"original")},
                    phase="INTAKE" if head is None else None))
                try:
                    out = await store.publish(req)
                except StaleGeneration:
                    raise SystemExit("unexpected stale generation") from None
                head = out.generation
                print(f"ack {case} {out.generation}", flush=True)

        async with trio.open_nursery() as nursery:
            for w in range(writers):
                nursery.start_soon(writer, w)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
