"""Large blobs as content-addressed files under ``blobs/sha256/xx/<hash>``.

Write order, for crash safety: temporary file → write → fsync → rename → fsync of the
directory, all *before* the transaction that references the blob. A crash before the rename
leaves a temporary file; a crash after it leaves an orphan file. ``gc`` removes both.

Hashes are checked on the bytes actually stored: a new file is hashed while it is copied,
and an existing file that a publication would reuse is re-read and re-hashed; one that does
not match (tampered, or half-written by something other than Viano) is replaced.

The gc protocol (see also ``SqliteStore.commit_batch`` and ``collect_garbage``):

1. gc holds the store's write lock for its whole run: it reads every manifest's
   references and removes unreferenced files while no transaction can commit.
2. A publication writes or reuses its files before its transaction (the slow part stays
   outside the lock), and then, *inside* its transaction, checks that each file it
   references is still there, writing it again from its source if gc removed it meanwhile.
3. A writer holds an ``flock`` on its temporary file from creation to rename; gc removes a
   temporary file only when it can take that lock (its writer is gone).

So a blob that a committed or in-flight publication references is never missing after
that publication's commit, whatever gc does, in any order, in any process.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from .._errors import InputRejected, StorageError
from ._crash import crash_point
from ._sources import CHUNK, BlobSource

# What the OS says of a store file or folder that this user may not write (or a read-only
# file system): the store is read-only to this command, not unavailable.
NOT_YOURS_TO_WRITE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})

_HEX = re.compile(r"[0-9a-f]{64}")


class BlobFiles:
    def __init__(self, root: Path):
        self.root = root
        self.dir = root / "blobs" / "sha256"
        self.tmp = root / "blobs" / "tmp"

    def path_for(self, sha256: str) -> Path:
        return self.dir / sha256[:2] / sha256

    def exists(self, sha256: str, size: int) -> bool:
        """Whether the blob's file is in place, by opening it: on a shared (NFS) blob root
        an open revalidates what a cached ``stat`` could still claim after another host's
        gc removed the file."""
        try:
            fd = os.open(self.path_for(sha256), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            st = os.fstat(fd)
            return stat.S_ISREG(st.st_mode) and st.st_size == size
        finally:
            os.close(fd)

    def write(self, source: BlobSource) -> None:
        """Put ``source`` in place durably, unless a file with exactly its bytes is there."""
        final = self.path_for(source.sha256)
        with _writing(self.root):  # re-reading a stored file is the store's, not the input's
            if final.is_file() and final.stat().st_size == source.size and \
                    _hash_file(final) == (source.sha256, source.size):
                return
        with _writing(self.root):
            self.tmp.mkdir(parents=True, exist_ok=True)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.tmp / f"{source.sha256}.{os.getpid()}.{time.monotonic_ns()}.part"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with _writing(self.root):  # ENOLCK: an NFS mount without a lock daemon
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: gc leaves it alone
            with os.fdopen(fd, "wb", closefd=False) as dst:
                self._copy(source, dst)
            with _writing(self.root):
                os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            with _writing(self.root):
                os.close(fd)
        crash_point("blob.rename")
        with _writing(self.root):
            fsync_dir(final.parent)
        crash_point("blob.dirsync")

    def _copy(self, source: BlobSource, dst: BinaryIO) -> None:
        h = hashlib.sha256()
        size = 0
        half = source.size // 2
        with source.open() as src:
            while chunk := src.read(CHUNK):  # a failing read is the input's (input_changed)
                with _writing(self.root):
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
            raise input_changed(source)
        with _writing(self.root):
            dst.flush()
            os.fsync(dst.fileno())
        crash_point("blob.fsync")

    def open(self, sha256: str) -> Path:
        return self.path_for(sha256)

    def open_regular(self, sha256: str, size: int | None = None) -> BinaryIO:
        """Open a blob file for reading, refusing anything but a regular file (a FIFO is
        opened without blocking, then refused) with a ``StorageError``, and one whose size
        is not the ``size`` the index recorded (a file grown to gigabytes is damaged at
        once, not after reading it all to hash it)."""
        path = self.path_for(sha256)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise StorageError(f"blob file {sha256} is missing",
                               reason="store_corrupt") from exc
        except OSError as exc:
            raise StorageError(f"blob file {sha256} cannot be read: {exc.strerror or exc}",
                               reason="store_unavailable",
                               hint="Check the store's permissions, then run 'viano verify'."
                               ) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"blob file {sha256} is not a regular file",
                                   reason="store_corrupt")
            if size is not None and st.st_size != size:
                raise StorageError(f"blob file {sha256} is {st.st_size} bytes, not the "
                                   f"{size} it was stored with", reason="store_corrupt",
                                   hint="Run 'viano verify'; restore the blob from a backup "
                                        "or an export.")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def iter_files(self) -> Iterator[tuple[str, Path]]:
        """Every blob file (name checked), in a stable order. A folder named like a blob is
        none (Viano writes no folder there): counted as an orphan file, gc failed on it
        after removing the orphans before it, as "could not lock the store"."""
        if not self.dir.is_dir():
            return
        for sub in sorted(self.dir.iterdir()):
            if not sub.is_dir():
                continue
            with os.scandir(sub) as entries:  # the entry's type comes with its name
                names = sorted(e.name for e in entries
                               if _HEX.fullmatch(e.name) and not e.is_dir(follow_symlinks=False))
            for name in names:
                yield name, sub / name

    def iter_tmp(self) -> Iterator[Path]:
        if self.tmp.is_dir():
            yield from sorted(self.tmp.iterdir())

    def has_any(self) -> bool:
        return next(self.iter_files(), None) is not None

    def remove_abandoned(self, path: Path) -> bool:
        """Remove a temporary file whose writer is gone (its flock is free). Anything but
        a regular file (a FIFO, a link: Viano writes neither) is left where it is, opened
        without blocking and not followed."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone, or a symbolic link (ELOOP)
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)


class VerifyingReader(io.RawIOBase):
    """Reads a blob and, at its end, checks what was read against the blob's sha256: a
    damaged blob raises ``store_corrupt`` rather than ending normally. Wrapped in a
    ``BufferedReader`` by :func:`verified_stream`."""

    def __init__(self, inner: BinaryIO, sha256: str):
        super().__init__()
        self.inner, self.sha256 = inner, sha256
        self.hash: Any = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        with self._disk():
            data = self.inner.read(len(b))
        b[: len(data)] = data
        if self.hash is not None:
            self.hash.update(data)
            if not data and len(b):
                digest, self.hash = self.hash.hexdigest(), None
                if digest != self.sha256:
                    raise damaged(self.sha256)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._disk():
            if (offset, whence) != (0, io.SEEK_SET) or self.inner.tell() != 0:
                self.hash = None  # random access (zipfile): the sequential check is off
            return self.inner.seek(offset, whence)

    def tell(self) -> int:
        with self._disk():
            return self.inner.tell()

    @contextmanager
    def _disk(self) -> Iterator[None]:
        """A disk or mount that fails under a read, a seek or a tell: the store's error,
        not the caller's (an archive's scan took an OSError for a corrupt archive)."""
        try:
            yield
        except OSError as exc:
            raise StorageError(f"blob {self.sha256} cannot be read: {exc.strerror or exc}",
                               reason="store_unavailable",
                               hint="Check the disk or mount the store is on, then run "
                                    "again; 'viano verify' checks every blob.") from exc

    def close(self) -> None:
        self.inner.close()
        super().close()


@contextmanager
def _writing(root: Path) -> Iterator[None]:
    """A failure to write into the store's blob folder (disk full, permissions, a shared
    mount gone) is the store's, never blamed on the input."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"cannot write a blob file under {root}: {exc.strerror or exc}",
                           reason="store_unavailable",
                           hint="Check the free space and permissions of the blob folder "
                                "(a shared mount: that it is mounted).") from exc


def damaged(sha256: str) -> StorageError:
    return StorageError(f"blob {sha256} is damaged: its bytes no longer match its name",
                        reason="store_corrupt")


def verified_stream(inner: BinaryIO, sha256: str, size: int | None = None) -> BinaryIO:
    """``inner`` read through a check of its bytes against ``sha256``. The buffer is the
    blob's ``size`` when that is known and smaller than a chunk: a 1 MiB buffer for each
    read of a 2 KB document was most of the bytes a run allocated (memray)."""
    buffer = CHUNK if size is None else max(1, min(CHUNK, size))
    return io.BufferedReader(VerifyingReader(inner, sha256), buffer_size=buffer)


def read_stored(sha256: str, size: int, data: bytes | None,
                open_file: Callable[[str, int], BinaryIO]) -> bytes:
    """A blob's whole bytes, checked against its name: ``data`` when the row holds them
    (hashed in one call, no stream), else the file ``open_file`` opens. A damaged blob is
    ``store_corrupt``, never served."""
    if data is not None:
        if hashlib.sha256(data).hexdigest() != sha256:
            raise damaged(sha256)
        return data
    with verified_stream(open_file(sha256, size), sha256, size) as f:
        return f.read()


def input_changed(source: BlobSource) -> InputRejected:
    return InputRejected(
        f"content changed while it was being stored (expected sha256 "
        f"{source.sha256[:12]}…, {source.size} bytes)", reason="input_changed",
        hint="Do not modify input files while Viano reads them; run the command again.")


def _hash_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
