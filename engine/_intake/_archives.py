"""Reading untrusted archives within limits, before anything is written.

Every member of a zip, tar or tar.gz is checked and hashed in one streaming pass, holding at
most one chunk in memory. Refused, each naming the member and the limit: too many members,
a member or the total over its size limit, a compression ratio over the limit (zip bombs;
declared sizes are checked first and then the actual decompressed bytes, because declared
sizes can lie), absolute paths, drive letters, backslashes, ``.``/``..``/empty segments,
control characters, symlinks, hard links, devices, FIFOs, sockets, duplicate names
(exact or equal after NFC normalisation), encrypted members, unsupported compression and
corrupt archives (bad CRC, truncation). Nested archives are members like any other: they
are never opened, so there is no recursion to bound.

A zip member whose mode carries no file-type bits is a regular file: that is how
``zipfile.writestr`` writes them.
"""

from __future__ import annotations

import hashlib
import stat
import tarfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import attrs

from .._config import IntakeLimits
from .._errors import ArchiveRejected
from .._store import CHUNK

SNIFF_BYTES = 4096


@attrs.frozen
class MemberInfo:
    name: str
    size: int
    sha256: str
    head: bytes  # the first SNIFF_BYTES, for media-type sniffing


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar"`` or ``"tar.gz"`` from the content (never the file name), else None."""
    with path.open("rb") as f:
        head = f.read(512)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "tar.gz"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def scan_archive(path: Path, kind: str, limits: IntakeLimits, label: str,
                 progress: Callable[[int], None] | None = None) -> list[MemberInfo]:
    """Check and hash every regular member of the archive at ``path``."""
    scanner = _ZipScan if kind == "zip" else _TarScan
    return scanner(path, limits, label, progress).run()


class _Scan:
    def __init__(self, path: Path, limits: IntakeLimits, label: str,
                 progress: Callable[[int], None] | None):
        self.path, self.limits, self.label, self.progress = path, limits, label, progress
        self.total = 0
        self.count = 0
        self.seen: set[str] = set()
        self.archive_size = path.stat().st_size

    def refuse(self, member: str | None, what: str,
               reason: str = "limit_exceeded") -> ArchiveRejected:
        where = f"{self.label}: member {member!r}" if member is not None else self.label
        return ArchiveRejected(f"{where}: {what}", reason=reason)

    def check_count(self) -> None:
        self.count += 1
        if self.count > self.limits.max_members:
            raise self.refuse(None, f"more than max_members={self.limits.max_members} members")

    def check_name(self, name: str) -> str:
        """Return the name without a trailing '/', refusing anything unsafe."""
        unsafe = "unsafe_archive_member"
        if not name or name in ("/", "./"):
            raise self.refuse(name, "empty member name", unsafe)
        if any(ord(c) < 32 or c == "\x7f" for c in name):
            raise self.refuse(name, "control character in the member name", unsafe)
        if "\\" in name:
            raise self.refuse(name, "backslash in the member name", unsafe)
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise self.refuse(name, "absolute path", unsafe)
        trimmed = name[:-1] if name.endswith("/") else name
        if any(seg in ("", ".", "..") for seg in trimmed.split("/")):
            raise self.refuse(name, "'..', '.' or empty path segment", unsafe)
        key = unicodedata.normalize("NFC", trimmed)
        if key in self.seen:
            raise self.refuse(name, "duplicate member name", "duplicate_archive_member")
        self.seen.add(key)
        return trimmed

    def check_declared(self, name: str, size: int, compressed: int | None) -> None:
        lim = self.limits
        if size > lim.max_member_bytes:
            raise self.refuse(name, f"{size} bytes exceeds max_member_bytes={lim.max_member_bytes}")
        self.total += size
        if self.total > lim.max_total_bytes:
            raise self.refuse(name, f"total size exceeds max_total_bytes={lim.max_total_bytes}")
        whole = self.total / max(self.archive_size, 1)
        if whole > lim.max_compression_ratio:
            raise self.refuse(name, f"whole-archive compression ratio {whole:.0f} exceeds "
                                    f"max_compression_ratio={lim.max_compression_ratio:g}")
        if compressed is not None and size > 0:
            ratio = size / max(compressed, 1)
            if ratio > lim.max_compression_ratio:
                raise self.refuse(name, f"compression ratio {ratio:.0f} exceeds "
                                        f"max_compression_ratio={lim.max_compression_ratio:g}")

    def hash_member(self, name: str, stream: IO[bytes], declared: int) -> MemberInfo:
        h = hashlib.sha256()
        head = b""
        size = 0
        while True:
            chunk = stream.read(min(CHUNK, declared + 1 - size))
            if not chunk:
                break
            size += len(chunk)
            if size > declared:
                raise self.refuse(name, f"decompresses past its declared size of {declared} "
                                        "bytes", "corrupt_archive")
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
            h.update(chunk)
            if self.progress:
                self.progress(len(chunk))
        if size != declared:
            raise self.refuse(name, f"holds {size} bytes, declares {declared}", "corrupt_archive")
        return MemberInfo(name=name, size=size, sha256=h.hexdigest(), head=head)

    @contextmanager
    def corrupt_on_error(self, member: str | None) -> Iterator[None]:
        try:
            yield
        except ArchiveRejected:
            raise
        except NotImplementedError as exc:
            raise self.refuse(member, f"unsupported compression ({exc})",
                              "unsupported_archive") from exc
        except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError,
                ValueError, RuntimeError) as exc:
            raise self.refuse(member, f"corrupt archive ({exc.__class__.__name__}: {exc})",
                              "corrupt_archive") from exc


class _ZipScan(_Scan):
    def run(self) -> list[MemberInfo]:
        with self.corrupt_on_error(None), zipfile.ZipFile(self.path) as zf:
            infos = zf.infolist()
            regular = [self._check(info) for info in infos]
            out = []
            for info, name in zip(infos, regular, strict=True):
                if name is None:
                    continue
                with self.corrupt_on_error(name), zf.open(info) as stream:
                    out.append(self.hash_member(name, stream, info.file_size))
        return out

    def _check(self, info: zipfile.ZipInfo) -> str | None:
        self.check_count()
        name = self.check_name(info.filename)
        mode = info.external_attr >> 16
        ftype = stat.S_IFMT(mode)
        if ftype not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise self.refuse(name, f"is not a regular file (mode {ftype:o}: symlink, device, "
                                    "FIFO or socket)", "unsafe_archive_member")
        if info.flag_bits & 0x1:
            raise self.refuse(name, "is encrypted", "encrypted_archive_member")
        if info.is_dir() or ftype == stat.S_IFDIR:
            if info.file_size:
                raise self.refuse(name, "directory entry with content", "corrupt_archive")
            return None
        self.check_declared(name, info.file_size, info.compress_size)
        return name


class _TarScan(_Scan):
    def run(self) -> list[MemberInfo]:
        out: list[MemberInfo] = []
        with self.corrupt_on_error(None), tarfile.open(self.path, "r:*") as tf:
            for ti in tf:
                self.check_count()
                name = self.check_name(ti.name + ("/" if ti.isdir() else ""))
                if ti.isdir():
                    continue
                if not ti.isreg():
                    raise self.refuse(name, "is not a regular file (link, device, FIFO)",
                                      "unsafe_archive_member")
                self.check_declared(name, ti.size, None)
                stream = tf.extractfile(ti)
                if stream is None:
                    raise self.refuse(name, "cannot be read", "corrupt_archive")
                with self.corrupt_on_error(name), stream:
                    out.append(self.hash_member(name, stream, ti.size))
        return out
