"""What every command shares: where the store is, and how it is opened."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import trio

from actors import StoreHandle
from engine import CaseLocked, Config, Published, Store, display_location, open_backend

from ._output import Output

DEFAULT_STORE = "viano-store"
# Another process holding a case that is being created (an intake or an import of it under
# way) takes a moment: wait up to ~5 s for it before answering ``locked``.
LOCKED_TRIES = 50
LOCKED_WAIT_S = 0.1

T = TypeVar("T")


async def waiting_for_the_case(call: Callable[[], Awaitable[T]],
                               on_wait: Callable[[str], None] | None = None) -> T:
    """``call()``, tried again while another process holds the case (``CaseLocked``), up to
    :data:`LOCKED_TRIES` times; the last ``CaseLocked`` is raised. ``on_wait`` is told once,
    when the waiting starts."""
    for attempt in range(LOCKED_TRIES - 1):
        try:
            return await call()
        except CaseLocked as exc:
            if attempt == 0 and on_wait is not None:
                on_wait(f"waiting for another process to finish with the case ({exc.message})")
            await trio.sleep(LOCKED_WAIT_S)
    return await call()


def one_change(out: Output, work: Callable[[Callable[[StoreHandle], None]], Awaitable[T]],
               committed: Callable[[Published], T]) -> T:
    """Run ``work`` under trio: a command whose whole work is one publication (an intake,
    an import, a confirmation, a reopening), made through the store handle it passes to
    the callback it is given.

    A Ctrl-C once the change was sent does not make the command say it was interrupted
    if the change was committed: its work is done, and running it again would at best
    find it done and at worst do it twice (a second reopening). It says so, and ends with
    ``committed(published)``, as if uninterrupted."""
    handles: list[StoreHandle] = []
    try:
        return trio.run(work, handles.append)
    except KeyboardInterrupt:
        done = handles[0].last_committed if handles else None
        if done is None:  # nothing was committed: interrupted it is
            raise
        out.note("interrupted after the change was committed: it is kept, and the "
                 "command's work is done (do not run it again)")
        return committed(done)


def store_location(args: argparse.Namespace, config: Config) -> str:
    """``--store``, else ``VIANO_STORE``, else ``[store] url``, else ``./viano-store``."""
    return str(args.store or os.environ.get("VIANO_STORE") or config.store.url
               or DEFAULT_STORE)


def store_named(args: argparse.Namespace, config: Config) -> bool:
    """Whether the user named the store (``--store``, ``VIANO_STORE``, ``[store] url``)
    rather than left it at the default: a named store that does not exist is a mistake to
    report (``no_store``), never an empty store to describe."""
    return bool(args.store or os.environ.get("VIANO_STORE") or config.store.url)


def store_shown(args: argparse.Namespace, config: Config) -> str:
    """The store's location as it may be printed: a PostgreSQL URL without its password."""
    return display_location(store_location(args, config))


def store_path(args: argparse.Namespace, config: Config) -> Path | None:
    """The store's own folder on this host (an export must not go inside it): the folder
    itself, or a PostgreSQL store's blob root."""
    location = store_location(args, config)
    if location[:14].lower().startswith(("postgresql://", "postgres://")):
        return Path(config.store.blob_root) if config.store.blob_root else None
    return Path(location)


@contextmanager
def reading(args: argparse.Namespace, config: Config) -> Iterator[Store]:
    """The store, read-only: no schema, file or folder of it is created or changed, and a
    store the user cannot write is readable."""
    store = open_backend(store_location(args, config), write=False,
                         blob_root=config.store.blob_root, lease_s=config.store.lease_s)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def writing(args: argparse.Namespace, config: Config) -> Iterator[Store]:
    store = open_backend(store_location(args, config), write=True,
                         blob_root=config.store.blob_root, lease_s=config.store.lease_s)
    try:
        yield store
    finally:
        store.close()
