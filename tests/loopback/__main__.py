"""Run the loopback provider server from the command line (benchmarks, process tests):

    python -m tests.loopback [--port 8080] [--mode ok] [--delay-ms 50]
        [--answers DIR] [--script MODE,MODE,...] [--log FILE]

``--answers DIR`` answers a request for prompt P with the content of ``DIR/P.json``;
``--script`` takes the modes of the first requests in order (then ``--mode``); ``--log``
appends one JSON line per request (mode, prompt id, case id, path, arrival time), flushed
at once, so a test can count the model calls made by processes it kills. Prints ``listening <port>``
once ready, then serves until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import trio

from .server import MODES, LoopbackServer, Received


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.loopback", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mode", default="ok", choices=MODES)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--answers", metavar="DIR")
    ap.add_argument("--script", default="")
    ap.add_argument("--log", metavar="FILE")
    args = ap.parse_args()

    server = LoopbackServer(default_mode=args.mode, delay_s=args.delay_ms / 1000)
    server.record_requests = False
    if args.script:
        server.push(*args.script.split(","))
    if args.answers:
        for path in Path(args.answers).glob("*.json"):
            server.answers[path.stem] = path.read_text()
    if args.log:
        log = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the server's life

        started: dict[int, float] = {}

        def record(r: Received) -> None:
            started[id(r)] = time.time()
            log.write(json.dumps({"mode": r.mode, "prompt_id": r.prompt_id,
                                  "case_id": r.case_id, "path": r.path,
                                  "t": started[id(r)]}) + "\n")

        def done(r: Received) -> None:
            # The same call again, with the time its answer ended (or the caller vanished):
            # [t, end] is when the call was in flight.
            log.write(json.dumps({"mode": r.mode, "prompt_id": r.prompt_id,
                                  "case_id": r.case_id, "path": r.path,
                                  "t": started.pop(id(r), 0.0), "end": time.time()}) + "\n")

        server.on_request = record
        server.on_done = done

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, args.port)
            print(f"listening {server.port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
