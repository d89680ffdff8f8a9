"""Settings for a whole Viano process, which the ``viano`` command applies at its start.

Python's cyclic collector walks every tracked object of a generation it collects. A
publication allocates a few dozen tracked objects, so the youngest generation filled every
~20 publications, and every collection of the oldest also walked the ~44,000 objects the
imports leave (trio, httpx, attrs, cattrs). In bench/store.py at 256 publishers that was
15-28 us of collector time per publication, a tenth to a sixth of the process's CPU;
with this, 2.6 us. The objects alive at start are frozen out of the collector's sight
(they live as long as the process), and the youngest generation is collected less often.
Reference counting frees almost everything anyway; only cycles wait for the collector.
"""

from __future__ import annotations

import gc

YOUNGEST_THRESHOLD = 5000  # CPython's default is 700


def tune_collector() -> None:
    """Freeze what is alive now and collect the youngest generation less often. For a
    process that runs Viano for long (the CLI, a daemon, a benchmark); an embedding
    application decides for its own process."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNGEST_THRESHOLD), middle, old)
