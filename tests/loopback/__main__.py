"""Run the loopback provider server from the command line (benchmarks, manual runs):

    python -m tests.loopback [--port 8080] [--mode ok] [--delay-ms 50]

Prints ``listening <port>`` once ready, then serves until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib

import trio

from .server import MODES, LoopbackServer


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.loopback", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mode", default="ok", choices=MODES)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    args = ap.parse_args()

    async def run() -> None:
        server = LoopbackServer(default_mode=args.mode, delay_s=args.delay_ms / 1000)
        server.record_requests = False
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, args.port)
            print(f"listening {server.port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
