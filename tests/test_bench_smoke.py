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


def test_the_marginal_rss_is_the_slope_between_two_concurrencies() -> None:
    """The per-in-flight column divides all growth by the concurrency; the slope between
    two single-process runs of the same N and latency is what one more case in flight
    costs, and what is left at the lower one is the run's fixed cost. A run through
    several processes (a tree's RSS) and a group with one concurrency give no slope."""
    from bench.throughput import marginal_kib

    def run(n: int, latency: float, conc: int, peak: float, processes: int = 1) -> dict:
        return {"n": n, "latency_ms": latency, "concurrency": conc, "processes": processes,
                "rss_before_mb": 46.0, "rss_peak_mb": peak}

    got = marginal_kib([run(2000, 200, 512, 200.0), run(2000, 200, 64, 161.5),
                        run(2000, 200, 256, 180.0), run(2000, 200, 1024, 900.0, 2),
                        run(2000, 0, 64, 150.0), run(10000, 200, 512, 300.0)])
    assert len(got) == 1, got
    m = got[0]
    assert (m["from_concurrency"], m["to_concurrency"]) == (64, 512)
    assert m["kib_per_added_in_flight"] == pytest.approx(38.5 * 1024 / 448)
    assert m["fixed_mb"] == pytest.approx(161.5 - 46.0 - 38.5 * 64 / 448)
