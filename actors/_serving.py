"""Run an actor for the duration of an ``async with`` and hand out its handle.

Shared by every ``open_*``: start the actor in a nursery, yield, then close its mailbox so
it drains what is queued and returns. An exception raised by the ``async with`` body reaches
the caller as itself, not wrapped in the nursery's exception group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio


@asynccontextmanager
async def serving(actor: Callable[..., Awaitable[Any]],
                  mailbox: trio.MemorySendChannel[Any]) -> AsyncIterator[trio.Nursery]:
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(actor)
        try:
            yield nursery
        except BaseException as exc:  # re-raised below, outside the nursery
            body_error = exc
        finally:
            mailbox.close()
    if body_error is not None:
        raise body_error
