"""``open_engine``: Viano embedded in a host's own trio run.

    async with open_engine(store="viano-store", config=Config.load(path)) as engine:
        result = await engine.dispatch("BUG-20")      # as far as the case can go now
        engine.submit("BUG-21")                        # fire and forget …
        first = await engine.results.receive()         # … its result arrives here
        await engine.run_until_idle()                  # every case with work now
        await engine.serve()                           # the daemon's loop, until cancelled
        events = engine.subscribe()                    # phase steps and results

Leaving the block shuts down in order: no new work is taken, the case actors still running
are cancelled (their model calls with them), the publisher drains what was sent (a
publication commits whole or not at all), and the HTTP clients close. Only checkpointed
state is left; another ``open_engine`` resumes from it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from actors import Clock, Engine, check_concurrency, open_engine_on, open_gateway, open_store
from engine import Config, Shard


@asynccontextmanager
async def open_engine(*, store: str | os.PathLike[str], config: Config | None = None,
                      concurrency: int = 16, clock: Clock | None = None,
                      environ: Mapping[str, str] | None = None,
                      create: bool = True, shard: Shard | None = None
                      ) -> AsyncIterator[Engine]:
    """See the module docstring. ``create=False`` refuses a store that does not exist
    (``NotFound`` no_store) instead of creating it. ``shard`` (``Shard(index, count)``):
    find work only among the case ids of that shard, so that ``count`` processes sharing
    the store take disjoint parts of it (``viano batch --processes``)."""
    check_concurrency(concurrency)  # before the store is created
    config = config or Config.resolve(None)
    async with open_gateway(config.providers, config.gateway, environ=environ) as gateway, \
            open_store(store, create=create, settings=config.store) as handle, \
            open_engine_on(handle, gateway, config, concurrency=concurrency,
                           clock=clock, shard=shard) as engine:
        yield engine
