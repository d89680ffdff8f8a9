"""Settings for a whole Viano process, which the ``viano`` command applies at its start.

Python's cyclic collector walks every tracked object of a generation it collects. A
publication allocates a few dozen tracked objects, so the youngest generation filled every
~20 publications, and every collection of the oldest also walked the ~44,000 objects the
imports leave (trio, httpx, attrs, cattrs). In bench/store.py at 256 publishers that was
15-28 us of collector time per publication, a tenth to a sixth of the process's CPU;
with this, 2.6 us. The objects alive at start are frozen out of the collector's sight
(they live as long as the process), and the youngest generation is collected less often.
Reference counting frees almost everything anyway; only cycles wait for the collector,
and they now wait longer: a process holds up to ~7x more cyclic garbage between
collections (64 KiB cycles in a test peaked at 110 MB against 16 MB). Cycles on Viano's
own paths are rare (an exception kept with its traceback when a head manifest is damaged).
"""

from __future__ import annotations

import gc

YOUNGEST_THRESHOLD = 5000  # CPython's default is 700


def tune_collector() -> None:
    """Freeze what is alive now and collect the youngest generation less often. For a
    process that runs Viano for long (the CLI, a daemon, a benchmark); an embedding
    application decides for its own process."""
    gc.freeze()  # no collection first: it took 17 ms of every command's start for 60 objects
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNGEST_THRESHOLD), middle, old)
