"""What every command shares: where the store is, and how it is opened."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine import Config, Store, display_location, open_backend

DEFAULT_STORE = "viano-store"


def store_location(args: argparse.Namespace, config: Config) -> str:
    """``--store``, else ``VIANO_STORE``, else ``[store] url``, else ``./viano-store``."""
    return str(args.store or os.environ.get("VIANO_STORE") or config.store.url
               or DEFAULT_STORE)


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
