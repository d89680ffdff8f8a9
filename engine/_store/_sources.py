"""Where the bytes of a blob come from.

A change names its files by *source* rather than by bytes, so that a 1 GiB original is
streamed from disk (or from a member of an export zip) into the store instead of being held
in memory. Every source knows the sha256 and size it was validated with; for a file or a zip
member the store recomputes both from the bytes it actually stores and refuses the
publication if they differ (the file changed between validation and commit).

A :class:`BytesSource` computes its hash from its own immutable bytes when it is built and
cannot be given another one, so those bytes are exactly what its hash names: the store
stores them without hashing them again.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import attrs

from .._canonical import sha256_hex

CHUNK = 1 << 20


class NotRegularFile(OSError):
    """What was opened is a folder, FIFO, device or socket, not a regular file."""

    def __init__(self, path: Path, mode: int):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "a special file")
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", str(path))
        self.kind = kind


class WouldWait(OSError):
    """A read of a "regular" file that would wait for data: a pseudo-file such as
    ``/proc/kmsg``, which ``stat`` calls regular but which is a stream, not stored bytes."""

    def __init__(self, name: str):
        super().__init__(errno.EAGAIN, "reading it would wait for data: a pseudo-file "
                         "(such as /proc/kmsg), not a file's stored bytes", name)


class _NeverWaits(io.FileIO):
    """A regular file's descriptor, left non-blocking: a read that would wait raises
    :class:`WouldWait` instead of waiting forever, or of returning ``None``, which buffered
    readers pass on and callers take for the end of the file (an empty file stored)."""

    def readinto(self, buffer: Any) -> int:
        n = super().readinto(buffer)
        if n is None:
            raise WouldWait(str(self.name))
        return n

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if data is None:
            raise WouldWait(str(self.name))
        return data

    def readall(self) -> bytes:
        data = super().readall()
        if data is None:
            raise WouldWait(str(self.name))
        return data


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, if what is opened is a regular file: judged on the open
    descriptor, so a file swapped for a FIFO or a device after an earlier check is refused,
    never read. ``O_NONBLOCK`` keeps the open itself from waiting for a FIFO's writer, and
    stays set: it changes nothing for a file's stored bytes, and a pseudo-file that is
    regular to ``stat`` but waits for data when read (``/proc/kmsg``) raises
    :class:`WouldWait` instead of hanging the command. A path that names no regular file
    when it is first looked at is not opened at all (opening some devices has effects).
    Raises :class:`NotRegularFile` (an ``OSError``)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
        return reader_of(fd, str(path))
    except BaseException:
        os.close(fd)
        raise


def reader_of(fd: int, name: str) -> BinaryIO:
    """A buffered reader over ``fd`` (opened with ``O_NONBLOCK``, kept so), which it owns:
    a read that would wait raises :class:`WouldWait` (see :func:`open_regular`)."""
    raw = _NeverWaits(fd, "rb", closefd=True)
    raw.name = name  # FileIO names an fd by its number
    return io.BufferedReader(raw)


def read_text_file(path: Path, limit: int = 4096) -> str:
    """A small text file of the store's own (its ``store-id``, a token), stripped: read
    through :func:`open_regular`, so one replaced by a FIFO or a device is refused
    (``NotRegularFile``) instead of waited on, and no more than ``limit`` bytes are read
    (larger is ``OSError`` EFBIG). ``UnicodeDecodeError`` if it is not UTF-8."""
    with open_regular(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return raw.decode("utf-8").strip()


class BlobSource(Protocol):
    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...

    def open(self) -> BinaryIO: ...


@attrs.frozen
class BytesSource:
    data: bytes = attrs.field(converter=bytes)  # a bytearray is copied: it could change
    sha256: str = attrs.field(init=False)
    size: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "sha256", sha256_hex(self.data))
        object.__setattr__(self, "size", len(self.data))

    @classmethod
    def of(cls, data: bytes) -> BytesSource:
        return cls(data)

    def open(self) -> BinaryIO:
        return io.BytesIO(self.data)


@attrs.frozen
class FileSource:
    path: Path
    sha256: str
    size: int

    @classmethod
    def of(cls, path: Path) -> FileSource:
        digest, size = hash_stream_path(path)
        return cls(path=path, sha256=digest, size=size)

    def open(self) -> BinaryIO:
        return open_regular(self.path)


@attrs.frozen
class ZipMemberSource:
    archive: Path
    member: str
    sha256: str
    size: int

    def open(self) -> BinaryIO:
        raw = open_regular(self.archive)
        try:
            zf = zipfile.ZipFile(raw)
            try:
                return _ClosingMember(zf, zf.open(self.member), raw)  # type: ignore[return-value,arg-type]
            except BaseException:
                zf.close()
                raise
        except BaseException:
            raw.close()
            raise


class _ClosingMember:
    """A zip member stream that also closes its archive."""

    def __init__(self, zf: zipfile.ZipFile, stream: BinaryIO, raw: BinaryIO):
        self._zf, self._stream, self._raw = zf, stream, raw

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(n)

    # zipfile's member stream seeks (forward by reading, back by starting again): readers
    # that seek (an archive inside the member) read it in place, without a copy.
    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        try:
            self._stream.close()
            self._zf.close()
        finally:
            self._raw.close()  # a ZipFile given an open file leaves it open

    def __enter__(self) -> _ClosingMember:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hash_stream(stream: BinaryIO, limit: int | None = None) -> tuple[str, int]:
    """sha256 and size of a stream, reading at most ``limit + 1`` bytes if a limit is given."""
    h = hashlib.sha256()
    size = 0
    while True:
        want = CHUNK if limit is None else min(CHUNK, limit + 1 - size)
        if want <= 0:
            break
        chunk = stream.read(want)
        if not chunk:
            break
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def hash_stream_path(path: Path) -> tuple[str, int]:
    with open_regular(path) as f:
        return hash_stream(f)


def read_verified(source: BlobSource) -> bytes | None:
    """The bytes of a small source, or ``None`` if they are not the bytes its hash names."""
    if isinstance(source, BytesSource):
        return source.data
    with source.open() as f:
        data = f.read(source.size + 1)
    if len(data) != source.size or sha256_hex(data) != source.sha256:
        return None
    return data
