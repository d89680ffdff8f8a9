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

Memory stays bounded whatever the archive holds, headers included. ``tarfile`` reads a pax
or GNU long-name header whole (a 400 KB tar.gz once held a 400 MB header and took 1.3 GB
before any limit applied), so tar archives are read through :class:`_BoundedReader`: every
byte read — headers, padding and data — counts against ``max_total_bytes`` and the
compression ratio, and a single read larger than ``MAX_SINGLE_READ`` (a header that big) is
refused before it is made. ``zipfile`` reads the whole central directory and builds an
object per entry before anyone can count them, so the end-of-central-directory record is
read first and an archive declaring more than ``max_members`` entries, or a central
directory over ``MAX_CENTRAL_DIRECTORY`` bytes, is refused before ``zipfile`` opens it; then
the directory's entries themselves are counted (the declared count can lie), stopping at
``max_members`` + 1.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import struct
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
from .._store._sources import open_regular

SNIFF_BYTES = 1024  # per member, for media-type sniffing; kept for every member
MAX_SINGLE_READ = CHUNK            # the largest header read we allow (data reads are CHUNK)
MAX_CENTRAL_DIRECTORY = 64 * 1024 * 1024
ARCHIVE_SUFFIXES = {".zip": "zip", ".tar": "tar", ".tgz": "tar.gz", ".tar.gz": "tar.gz"}
# Archives intake does not read: in the diagnostics or source role, refused (they were
# stored as one opaque source with exit 0, their members never catalogued).
UNREAD_SUFFIXES = (".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz", ".tar.zst", ".tzst",
                   ".tar.lz", ".tar.lzma", ".7z", ".rar")


@attrs.frozen
class MemberInfo:
    name: str
    size: int
    sha256: str
    head: bytes  # the first SNIFF_BYTES, for media-type sniffing


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar"`` or ``"tar.gz"`` from the content (never the file name), else
    None. A gzip file whose content does not start with a tar header (a plain ``.log.gz``)
    is not an archive: it is stored as one opaque source."""
    with open_regular(path) as f:
        head = f.read(65536)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        try:
            inflated = zlib.decompressobj(wbits=31).decompress(head, 512)
        except zlib.error:
            return None
        return "tar.gz" if is_tar_header(inflated) else None
    return "tar" if is_tar_header(head[:512]) else None


def unread_archive(path: Path) -> str | None:
    """The kind of an archive intake does not read, from the content: a 7z or rar file,
    or a tar compressed with xz or bzip2 (a single compressed log is no archive), else
    None. Named anything (``sosreport-host``, ``diag.bin``), one was stored as one opaque
    source in the diagnostics role, its members never catalogued."""
    import bz2
    import lzma

    with open_regular(path) as f:
        head = f.read(65536)
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        return "7z"
    if head.startswith(b"Rar!\x1a\x07"):
        return "rar"
    for magic, kind, inflate in ((b"\xfd7zXZ\x00", "tar.xz", lzma.LZMADecompressor),
                                 (b"BZh", "tar.bz2", bz2.BZ2Decompressor)):
        if head.startswith(magic):
            try:
                block = inflate().decompress(head, 512)
            except (OSError, EOFError, ValueError, lzma.LZMAError):
                return None
            return kind if is_tar_header(block) else None
    return None


EMPTY_TAR_MAX = 1024 * 1024


def is_empty_tar(path: Path, kind: str) -> bool:
    """Whether ``path`` is an empty tar (or tar.gz): only zero blocks, at least the two
    that end an archive. ``tar cf e.tar --files-from /dev/null`` was refused as
    corrupt_archive ("its content is not one"), where an empty zip is taken in."""
    with open_regular(path) as f:
        data = f.read(EMPTY_TAR_MAX + 1)
    if kind == "tar.gz":
        try:
            inflate = zlib.decompressobj(wbits=31)
            data = inflate.decompress(data, EMPTY_TAR_MAX + 1)
        except zlib.error:
            return False
    return 1024 <= len(data) <= EMPTY_TAR_MAX and len(data) % 512 == 0 and not any(data)


def is_tar_header(block: bytes) -> bool:
    """A 512-byte block that is a tar header: its checksum field matches its bytes."""
    if len(block) < 512 or block[:512] == bytes(512):
        return False
    field = block[148:156].replace(b"\x00", b" ").strip()
    try:
        recorded = int(field, 8) if field else -1
    except ValueError:
        return False
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:512])
    signed = sum(struct.unpack("148b", block[:148])) + 8 * 32 + sum(
        struct.unpack("356b", block[156:512]))
    return recorded in (unsigned, signed)


def named_kind(name: str) -> str | None:
    """The archive kind a file name claims, if any (checked against the content)."""
    lowered = name.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if lowered.endswith(suffix):
            return ARCHIVE_SUFFIXES[suffix]
    return None


Opener = Callable[[], IO[bytes]]


def scan_archive(path: Path, kind: str, limits: IntakeLimits, label: str,
                 progress: Callable[[int], None] | None = None) -> list[MemberInfo]:
    """Check and hash every regular member of the archive at ``path``."""
    with open_regular(path) as f:
        return scan_open_archive(f, kind, limits, label, progress)


def scan_open_archive(f: IO[bytes], kind: str, limits: IntakeLimits, label: str,
                      progress: Callable[[int], None] | None = None, *,
                      members_left: int | None = None) -> list[MemberInfo]:
    """Like :func:`scan_archive`, through one already open file: every read of the scan
    is of that file, so renaming another file over its path cannot change what is read.
    ``members_left``: what remains of ``max_members`` for a case that holds other sources
    already (it counts a case's sources, not one archive's)."""
    fd = f.fileno()

    def opener() -> IO[bytes]:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.fdopen(os.dup(fd), "rb")

    scanner = _ZipScan if kind == "zip" else _TarScan
    scan = scanner(opener, os.fstat(fd).st_size, limits, label, progress)
    if members_left is not None:
        scan.member_limit = min(scan.member_limit, max(0, members_left))
    return scan.run()


def member_heads(opener: Opener, size: int, kind: str, wanted: dict[str, int],
                 limits: IntakeLimits, label: str) -> dict[str, bytes]:
    """The first ``wanted[name]`` bytes of each named member, read within the same limits
    and checks as a scan (an archive in the store may have come from an import)."""
    scanner = _ZipScan if kind == "zip" else _TarScan
    # A catalogue written before zip names were read as UTF-8 names a member by its cp437
    # reading: asked for by either, it is found.
    names = {(_zip_name(m, 0) if kind == "zip" else m): m for m in wanted}
    found = scanner(opener, size, limits, label, None,
                    {n: wanted[m] for n, m in names.items()}).run()
    return {names.get(m.name, m.name): m.head for m in found}


class _Scan:
    def __init__(self, opener: Opener, size: int, limits: IntakeLimits, label: str,
                 progress: Callable[[int], None] | None,
                 wanted: dict[str, int] | None = None):
        self.open, self.limits, self.label, self.progress = opener, limits, label, progress
        self.total = 0
        self.count = 0
        self.seen: set[str] = set()
        self.archive_size = size
        self.wanted = wanted
        self.member_limit = limits.max_members

    def too_many(self) -> str:
        """The limit a count went past, as the user set it."""
        if self.member_limit < self.limits.max_members:
            return (f"max_members={self.limits.max_members} (with the case's other "
                    f"sources, {self.limits.max_members - self.member_limit})")
        return f"max_members={self.limits.max_members}"

    def refuse(self, member: str | None, what: str,
               reason: str = "limit_exceeded") -> ArchiveRejected:
        where = f"{self.label}: member {member!r}" if member is not None else self.label
        return ArchiveRejected(f"{where}: {what}", reason=reason)

    def check_count(self) -> None:
        self.count += 1
        if self.count > self.member_limit:
            raise self.refuse(None, f"more members than {self.too_many()}")

    def check_name(self, name: str) -> str:
        """Return the name without a trailing '/', refusing anything unsafe."""
        unsafe = "unsafe_archive_member"
        if not name or name in ("/", "./"):
            raise self.refuse(name, "empty member name", unsafe)
        if any(ord(c) < 32 or c == "\x7f" for c in name):
            raise self.refuse(name, "control character in the member name", unsafe)
        if any("\ud800" <= c <= "\udfff" for c in name):  # bytes tarfile could not decode
            raise self.refuse(name, "the member name is not UTF-8", unsafe)
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

    def take(self, name: str, stream: IO[bytes], declared: int) -> MemberInfo | None:
        """Hash a member (a scan), or read the head of a wanted one (an excerpt)."""
        if self.wanted is None:
            return self.hash_member(name, stream, declared)
        if name not in self.wanted:
            return None
        return MemberInfo(name=name, size=declared, sha256="",
                          head=stream.read(min(declared, self.wanted[name])))

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
        self._check_directory()
        with self.corrupt_on_error(None), self.open() as raw, zipfile.ZipFile(raw) as zf:
            infos = zf.infolist()
            regular = [self._check(info) for info in infos]
            out = []
            for info, name in zip(infos, regular, strict=True):
                if name is None or (self.wanted is not None and name not in self.wanted):
                    continue
                with self.corrupt_on_error(name), zf.open(info) as stream:
                    taken = self.take(name, stream, info.file_size)
                if taken is not None:
                    out.append(taken)
        return out

    def _check_directory(self) -> None:
        """Read the end-of-central-directory record (and its zip64 form) ourselves and
        refuse too many entries or too large a directory before zipfile builds it."""
        with self.corrupt_on_error(None), self.open() as f:
            tail_len = min(self.archive_size, 65535 + 22)
            f.seek(self.archive_size - tail_len)
            tail = f.read(tail_len)
            at = tail.rfind(b"PK\x05\x06")
            if at < 0 or len(tail) - at < 22:
                raise self.refuse(None, "no end-of-central-directory record", "corrupt_archive")
            entries, cd_size = struct.unpack("<10xH I", tail[at:at + 16])
            # Where zipfile takes the directory to end: at the end record, or, as zipfile
            # does, at the zip64 record when a zip64 locator sits right before the end
            # record (the record 56 bytes before the locator, whatever the locator says):
            # its counts then hold, whatever the end record declares.
            eocd = cd_end = self.archive_size - tail_len + at
            located = False
            if eocd >= 20:
                f.seek(eocd - 20)
                located = f.read(4) == b"PK\x06\x07"
            if located or entries == 0xFFFF or cd_size == 0xFFFFFFFF:
                if not located or eocd < 76:
                    raise self.refuse(None, "zip64 record missing", "corrupt_archive")
                cd_end = eocd - 56 - 20
                f.seek(cd_end)
                record = f.read(56)
                if record[:4] != b"PK\x06\x06" or len(record) < 56:
                    raise self.refuse(None, "zip64 record damaged", "corrupt_archive")
                entries, cd_size = struct.unpack("<32xQQ", record[:48])
        if entries > self.member_limit:
            raise self.refuse(None, f"declares {entries} members, more than "
                                    f"{self.too_many()}")
        if cd_size > MAX_CENTRAL_DIRECTORY:
            raise self.refuse(None, f"its central directory is {cd_size} bytes, more than "
                                    f"{MAX_CENTRAL_DIRECTORY}")
        self._count_directory(cd_end - cd_size, cd_size)

    def _count_directory(self, start: int, size: int) -> None:
        """Count the entries the central directory really holds, as zipfile will walk it
        (one header after another until ``size`` bytes are used): the count the end record
        declares is not to be trusted (one declaring 1 entry over 1.4 million took 556 MB
        and 8 s in zipfile before any limit applied). Stops at ``max_members`` + 1."""
        if start < 0:
            raise self.refuse(None, "its central directory starts before the file",
                              "corrupt_archive")
        limit = self.member_limit
        with self.corrupt_on_error(None), self.open() as f:
            f.seek(start)
            count, used = 0, 0
            while used < size:
                head = f.read(46)
                if len(head) < 46 or head[:4] != b"PK\x01\x02":
                    break  # zipfile refuses what follows as damaged: not ours to judge
                count += 1
                if count > limit:
                    raise self.refuse(None, f"holds more members than {self.too_many()} "
                                            "in its central directory")
                name, extra, comment = struct.unpack("<28xHHH12x", head)
                skip = name + extra + comment
                f.seek(skip, io.SEEK_CUR)
                used += 46 + skip

    def _check(self, info: zipfile.ZipInfo) -> str | None:
        self.check_count()
        # zipfile cuts a name at its first NUL (``log.txt\x00.exe`` read as log.txt): the
        # name as stored is the one judged.
        name = self.check_name(_zip_name(info.orig_filename if "\x00" in info.orig_filename
                                         else info.filename, info.flag_bits))
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


def _zip_name(name: str, flags: int) -> str:
    """A member's name as its maker meant it: without the UTF-8 flag, zipfile reads the
    bytes as cp437, but Info-ZIP's ``zip`` (the default on Linux) writes UTF-8 without
    setting it, so ``café.log`` was catalogued as ``caf├⌐.log`` and two names equal after
    NFC were not caught as duplicates. Bytes that are valid UTF-8 are read so, as unzip
    and libarchive read them; others stay cp437."""
    if flags & 0x800 or name.isascii():
        return name
    try:
        return name.encode("cp437").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return name


class _TarScan(_Scan):
    def run(self) -> list[MemberInfo]:
        out: list[MemberInfo] = []
        with self.corrupt_on_error(None), self.open() as raw:
            # Peeked where the stream can (a store's forward-only stream cannot seek back).
            peek = getattr(raw, "peek", None)
            if peek is not None:
                gz = peek(2)[:2] == b"\x1f\x8b"
            else:
                gz = raw.read(2) == b"\x1f\x8b"
                raw.seek(0)
            inner: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if gz \
                else raw  # type: ignore[assignment]
            bounded = _BoundedReader(inner, self)
            with tarfile.open(fileobj=bounded, mode="r:") as tf:
                self._members(tf, out)
        return out

    def _members(self, tf: tarfile.TarFile, out: list[MemberInfo]) -> None:
        # tf.next() rather than iteration, clearing tf.members: TarFile keeps every TarInfo
        # (with its pax headers) otherwise, which is memory no limit would bound.
        while True:
            with self.corrupt_on_error(None):
                ti = tf.next()
            if ti is None:
                return
            tf.members.clear()  # type: ignore[attr-defined]
            self.check_count()
            name = self.check_name(ti.name + ("/" if ti.isdir() else ""))
            if ti.isdir():
                continue
            if not ti.isreg():
                raise self.refuse(name, "is not a regular file (link, device, FIFO)",
                                  "unsafe_archive_member")
            self.check_declared(name, ti.size, None)
            with self.corrupt_on_error(name):
                stream = tf.extractfile(ti)
                if stream is None:
                    raise self.refuse(name, "cannot be read", "corrupt_archive")
                with stream:
                    taken = self.take(name, stream, ti.size)
                if taken is not None:
                    out.append(taken)


class _BoundedReader(io.RawIOBase):
    """What ``tarfile`` reads the (decompressed) archive through: every byte counted
    against ``max_total_bytes`` and the compression ratio, no single read over
    ``MAX_SINGLE_READ``, forward seeks read (and counted) rather than skipped."""

    def __init__(self, inner: IO[bytes], scan: _Scan):
        super().__init__()
        self.inner, self.scan = inner, scan
        self.pos = 0
        lim = scan.limits
        self.ratio_budget = lim.max_compression_ratio * max(scan.archive_size, 1) + 1024 * 1024

    @property
    def budget(self) -> int:
        """max_total_bytes, plus one header block and one block of padding per member seen
        so far (and the two end blocks): any other header byte is counted as data."""
        return self.scan.limits.max_total_bytes + 1024 * (self.scan.count + 2)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0 or n > MAX_SINGLE_READ:
            raise self.scan.refuse(None, f"a header or read of {n} bytes exceeds the "
                                         f"{MAX_SINGLE_READ}-byte bound on tar headers")
        if self.pos + n > self.budget:
            raise self.scan.refuse(None, "reading past max_total_bytes="
                                         f"{self.scan.limits.max_total_bytes}, headers included")
        if self.pos + n > self.ratio_budget:
            raise self.scan.refuse(None, "whole-archive compression ratio exceeds "
                                         f"max_compression_ratio="
                                         f"{self.scan.limits.max_compression_ratio:g}, headers "
                                         "included")
        data = self.inner.read(n)
        self.pos += len(data)
        return data

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self.pos + offset}.get(whence)
        if target is None or target < 0:
            raise OSError("unsupported seek on an archive")
        if target < self.pos:
            self.inner.seek(target)  # rare: tarfile re-reading a header it has counted
            self.pos = target
            return self.pos
        while self.pos < target:
            if not self.read(min(CHUNK, target - self.pos)):
                break
        return self.pos
