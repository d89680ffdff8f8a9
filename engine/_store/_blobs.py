"""Large blobs as content-addressed files under ``blobs/sha256/xx/<hash>``.

Write order, for crash safety: temporary file → write → fsync → rename → fsync of the
directory, all *before* the transaction that references the blob. A crash before the rename
leaves a temporary file; a crash after it leaves an orphan file. ``gc`` removes both (after
a grace period, so it never races a publisher that is between blob write and commit).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .._errors import InputRejected, StorageError
from ._crash import crash_point
from ._sources import CHUNK, BlobSource


class BlobFiles:
    def __init__(self, root: Path):
        self.root = root
        self.dir = root / "blobs" / "sha256"
        self.tmp = root / "blobs" / "tmp"

    def path_for(self, sha256: str) -> Path:
        return self.dir / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def write(self, source: BlobSource) -> None:
        """Copy ``source`` into place durably, checking its hash and size on the way."""
        final = self.path_for(source.sha256)
        if final.is_file():
            return
        self.tmp.mkdir(parents=True, exist_ok=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp / f"{source.sha256}.{os.getpid()}.{time.monotonic_ns()}.part"
        try:
            self._copy(source, tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        crash_point("blob.rename")
        _fsync_dir(final.parent)
        crash_point("blob.dirsync")

    def _copy(self, source: BlobSource, tmp: Path) -> None:
        h = hashlib.sha256()
        size = 0
        half = source.size // 2
        with source.open() as src, tmp.open("wb") as dst:
            while chunk := src.read(CHUNK):
                if size < half <= size + len(chunk):
                    dst.write(chunk[: half - size])
                    dst.flush()
                    crash_point("blob.write")
                    dst.write(chunk[half - size:])
                else:
                    dst.write(chunk)
                h.update(chunk)
                size += len(chunk)
                if size > source.size:
                    break
            if h.hexdigest() != source.sha256 or size != source.size:
                raise InputRejected(
                    f"content changed while it was being stored (expected sha256 "
                    f"{source.sha256[:12]}…, {source.size} bytes)",
                    reason="input_changed",
                    hint="Do not modify input files while Viano reads them; run the command again.")
            dst.flush()
            os.fsync(dst.fileno())
        crash_point("blob.fsync")

    def open(self, sha256: str) -> Path:
        path = self.path_for(sha256)
        if not path.is_file():
            raise StorageError(f"blob file {sha256} is missing from {self.dir}")
        return path

    def iter_files(self) -> Iterator[tuple[str, Path]]:
        if not self.dir.is_dir():
            return
        for sub in sorted(self.dir.iterdir()):
            for path in sorted(sub.iterdir()):
                yield path.name, path

    def iter_tmp(self) -> Iterator[Path]:
        if self.tmp.is_dir():
            yield from sorted(self.tmp.iterdir())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
