"""The benchmarks still run (bench/ is not imported by anything else, so nothing else
would notice one broken by a change elsewhere: bench/gateway.py's failover run had been
refused by the configuration's ranges since they were added). Tiny sizes, and nothing
about speed is asserted: only that each run did its work."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

pytestmark = [pytest.mark.slow, pytest.mark.no_store]


def test_gateway_failover_run() -> None:
    from bench._common import stop_server
    from bench.gateway import failover_latency, start_server

    proc, port = start_server(0)
    try:
        figures = trio.run(failover_latency, port, 3)
    finally:
        stop_server(proc)
    assert figures["direct_p50_ms"] > 0 and figures["failover_p50_ms"] > 0, figures


@pytest.mark.parametrize("processes", [1, 2])
def test_throughput_run(tmp_path: Path, processes: int) -> None:
    """In one process, and through ``viano batch --processes`` (the tree's CPU and RSS)."""
    from bench.throughput import run_one

    result = run_one(20, 0, 4, tmp_path, processes)
    assert result["statuses"] == {"COMPLETED": 20}, result
    assert result["cases"] == 20 and result["processes"] == processes
    assert result["cpu_ms_per_case"] > 0 and result["rss_peak_mb"] > 0
    assert result["publications_per_transaction"] >= 1
