"""One generation of a package as the phases read it: its manifest and its files, through a
blocking reader that the caller supplies (the store, on a worker thread).

Everything a phase reads back is parsed strictly (an imported package is untrusted), and a
file that cannot be read or parsed is a :class:`HistoryProblem`, which the runner turns
into ``unsupported_history`` rather than an internal error.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import attrs

from .._config import MAX_DOCUMENT_BYTES
from .._errors import StorageError, VianoError
from .._json import UntrustedJson, loads_untrusted
from .._store import BytesSource, Change, Manifest

Reader = Callable[[str], bytes]     # sha256 -> bytes
R = TypeVar("R")
_UNPARSED: Any = object()
Opener = Callable[[str], IO[bytes]]  # sha256 -> a readable, seekable stream
STREAM_BUFFER = 1 << 16  # a stream's read buffer (a smaller file's size, if less)
# What a checked opener (PackageView.checked_opener) re-checks at a time: a digest of each
# is kept (16 bytes per 64 KiB, 256 KiB for a 1 GiB archive), and the last CHECKED_HELD
# chunks read are held, shared by the opener's streams (a zip's members in directory order
# jump between parts of the archive; one chunk held read each again at every jump).
CHECK_CHUNK = 1 << 16
CHECKED_HELD = 16
_DIGEST = 16


class _Documents:
    """What the phases read back, by sha256: the bytes, and the parsed document once
    parsed. A sha256 names exactly one content whichever store it came from, so an entry
    can never be stale; it only saves the reads and the strict parses that every step of
    every case repeats (the case record and catalogue are read 14 times per case, the
    interpretation 7). Bounded by an estimate of the memory held — the bytes, and a parsed
    document at ``PARSED_FACTOR`` times its bytes — least recently used out first;
    documents over ``max_item`` are never kept.

    The working set is the documents of the cases in flight, so the bound is a base
    (``base_bytes``) plus ``PER_CASE`` for each case in flight, reserved by whoever runs
    them (:meth:`reserve`: the engine, for its ``concurrency``). A fixed 16 MiB held 512
    cases' worth no longer: every case's documents were evicted between its steps and
    read and parsed again (17 store reads per case instead of 3), and CPU per case grew
    with the number in flight, 8.7 ms at 64 to 12 ms at 512 (bench/throughput.py). Parsed
    documents are shared: the phases only read them."""

    # Measured with tracemalloc over a finished batch's documents (2026-12-06): a parsed
    # document holds 4.5x its bytes under 1 KB, 3.4x at 2 KB, 2.1x at 4 KB, 1.7x at 8 KB
    # (it was counted at 8x, which let the bound hold half of what it said). 4x covers
    # every size from 2 KB, where most of the bytes are; ENTRY_OVERHEAD (the key, the
    # entry's tuple and its dict node, and what a small document holds beyond 4x) covers
    # the small ones: a dense 208-byte document measured 2.25x what 4x alone said.
    PARSED_FACTOR = 4
    ENTRY_OVERHEAD = 256
    # Room per case in flight: with 32 KiB, 512 in flight read each case document from the
    # store once (2,000 cases: 2,000 catalogue reads, against 3,800 with none), for ~15 MB
    # more at the peak of a 2,000:200:512 run (207-210 MB against 190-195).
    PER_CASE = 32 << 10
    # The room reserved, whatever the concurrency: the bound is memory that stays in use
    # once a long run has filled it (a daemon's finished cases leave their documents until
    # they are evicted), so an engine opened with concurrency=10**9 must not lift it.
    MAX_ROOM = 256 << 20

    def __init__(self, max_bytes: int = 16 << 20, max_item: int = 256 << 10):
        self.base_bytes, self.max_item = max_bytes, max_item
        self._reserved = 0
        self._entries: OrderedDict[str, tuple[bytes, Any]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self.base_bytes + min(self._reserved * self.PER_CASE, self.MAX_ROOM)

    @contextlib.contextmanager
    def reserve(self, cases: int) -> Iterator[None]:
        """Room for ``cases`` more cases in flight while the block runs; leaving it gives
        the room back (and evicts down to the smaller bound). Engines in one process add
        up, to at most ``MAX_ROOM`` in all."""
        if type(cases) is not int or cases < 0:  # inf would leave nan behind it
            raise ValueError(f"cases must be an integer >= 0, not {cases!r}")
        with self._lock:
            self._reserved += cases
        try:
            yield
        finally:
            with self._lock:
                self._reserved -= cases
                self._evict()

    def get(self, sha: str) -> tuple[bytes, Any] | None:
        with self._lock:
            entry = self._entries.get(sha)
            if entry is not None:
                self._entries.move_to_end(sha)
            return entry

    def put(self, sha: str, data: bytes, parsed: Any = _UNPARSED) -> None:
        if len(data) > self.max_item:
            return
        with self._lock:
            old = self._entries.pop(sha, None)
            if old is not None:
                self._size -= self._cost(*old)
                if parsed is _UNPARSED:
                    parsed = old[1]
            self._entries[sha] = (data, parsed)
            self._size += self._cost(data, parsed)
            self._evict()

    def _evict(self) -> None:
        limit = self.max_bytes
        while self._size > limit:
            _sha, gone = self._entries.popitem(last=False)
            self._size -= self._cost(*gone)

    def _cost(self, data: bytes, parsed: Any) -> int:
        parsed_cost = 0 if parsed is _UNPARSED else self.PARSED_FACTOR * len(data)
        return self.ENTRY_OVERHEAD + len(data) + parsed_cost


DOCUMENTS = _Documents()


def reserve_documents(cases: int) -> contextlib.AbstractContextManager[None]:
    """Room in the document cache for ``cases`` more cases in flight, while the block
    runs (see :class:`_Documents`)."""
    return DOCUMENTS.reserve(cases)


class HistoryProblem(Exception):
    """The package holds something a phase cannot stand on (missing, unreadable,
    inconsistent). Never raised for the model's faults."""


@attrs.frozen
class PackageView:
    manifest: Manifest
    reader: Reader = attrs.field(repr=False)
    opener: Opener | None = attrs.field(default=None, repr=False)
    # Told of each error the store raises on a read (a damaged blob, a store that cannot be
    # read) before the view turns it into a HistoryProblem: the case actor names the
    # store's reason in its result (store_corrupt, store_unavailable).
    on_fault: Callable[[VianoError], None] | None = attrs.field(default=None, repr=False)

    def has(self, path: str) -> bool:
        return path in self.manifest.files

    def sha(self, path: str) -> str | None:
        entry = self.manifest.files.get(path)
        return None if entry is None else entry.sha256

    def read(self, path: str) -> bytes:
        entry = self.manifest.files.get(path)
        if entry is None:
            raise HistoryProblem(f"{path} is not in generation "
                                 f"{self.manifest.package_generation}")
        cached = DOCUMENTS.get(entry.sha256)
        if cached is not None:
            return cached[0]
        if entry.size > MAX_DOCUMENT_BYTES:
            raise HistoryProblem(f"{path} is {entry.size} bytes, more than the "
                                 f"{MAX_DOCUMENT_BYTES} a phase reads whole")
        try:
            data = self.reader(entry.sha256)
        except VianoError as exc:
            raise self.unreadable(path, exc) from exc
        DOCUMENTS.put(entry.sha256, data)
        return data

    def open(self, path: str) -> IO[bytes]:
        """A stream of a (possibly large) file; the caller closes it. The store's stream
        checks the bytes against their sha256 when a read reaches the end; an error the
        store raises on any read is a :class:`HistoryProblem`, as it is for :meth:`read`."""
        entry = self.manifest.files.get(path)
        if entry is None:
            raise HistoryProblem(f"{path} is not in generation "
                                 f"{self.manifest.package_generation}")
        if self.opener is None:
            return io.BytesIO(self.read(path))
        try:
            stream = self.opener(entry.sha256)
        except VianoError as exc:
            raise self.unreadable(path, exc) from exc
        return io.BufferedReader(_StoreStream(stream, path, self),
                                 buffer_size=max(1, min(entry.size, STREAM_BUFFER)))

    def read_head(self, path: str, want: int) -> bytes:
        """The first ``want`` bytes of ``path``, read on to its end through the store's
        stream, which checks it against its sha256: a damaged blob is a
        :class:`HistoryProblem` here, before any of its bytes are used (a head read alone
        never reaches the check)."""
        with self.open(path) as f:
            head = f.read(want)
            while f.read(STREAM_BUFFER):
                pass
        return head

    def checked_opener(self, path: str) -> Callable[[], IO[bytes]]:
        """An opener of ``path`` for random access (an archive's members), every byte of
        which is the checked blob's: the file is read here to its end through the store's
        sha256 check, keeping a digest of each :data:`CHECK_CHUNK`; each stream the opener
        gives reads whole chunks and compares each with its digest. Bytes that changed
        after the check are the store's damage (``store_corrupt``, a
        :class:`HistoryProblem`), never used: a second open with seeks has no sha256 check
        of its own, and damage between the two reads would have reached the context."""
        chunks = _CheckedChunks(self, path)
        return lambda: io.BufferedReader(_Rechecked(chunks), buffer_size=STREAM_BUFFER)

    def forward_opener(self, path: str) -> Callable[[], IO[bytes]]:
        """An opener of ``path`` for one forward read (a tar's members): its stream, closed,
        reads on to the file's end first, so the store's sha256 check has passed (or
        raised: a :class:`HistoryProblem`) before anything read from it is used, in one
        read of the file. It cannot seek, since a seek turns that check off."""
        return lambda: io.BufferedReader(_ToItsEnd(self.open(path)),
                                         buffer_size=STREAM_BUFFER)

    def unreadable(self, path: str, exc: VianoError) -> HistoryProblem:
        """The :class:`HistoryProblem` a store error on a read of ``path`` is (the view's
        ``on_fault`` is told of the error first)."""
        if self.on_fault is not None:
            self.on_fault(exc)
        return HistoryProblem(f"{path} cannot be read: {exc.message}")

    def read_json(self, path: str) -> Any:
        entry = self.manifest.files.get(path)
        cached = None if entry is None else DOCUMENTS.get(entry.sha256)
        if cached is not None and cached[1] is not _UNPARSED:
            return cached[1]
        data = cached[0] if cached is not None else self.read(path)
        assert entry is not None  # else read() raised
        sha = entry.sha256
        try:
            doc = loads_untrusted(data)
        except UntrustedJson as exc:
            raise HistoryProblem(f"{path} is not acceptable JSON: {exc}") from exc
        DOCUMENTS.put(sha, data, doc)
        return doc

    def read_object(self, path: str) -> dict[str, Any]:
        doc = self.read_json(path)
        if not isinstance(doc, dict):
            raise HistoryProblem(f"{path} is not a JSON object")
        return doc


class _StoreStream(io.RawIOBase):
    """A store's stream of one file of a view: a store error on a read, a seek or a tell
    (the end-of-file hash check, a disk that fails) is the view's
    :class:`HistoryProblem`."""

    def __init__(self, inner: IO[bytes], path: str, view: PackageView):
        super().__init__()
        self._inner, self._path, self._view = inner, path, view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with self._store_errors():
            data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._store_errors():
            return self._inner.seek(offset, whence)

    def tell(self) -> int:
        with self._store_errors():
            return self._inner.tell()

    @contextlib.contextmanager
    def _store_errors(self) -> Iterator[None]:
        try:
            yield
        except StorageError as exc:  # not an import's own refusals (input_changed)
            raise self._view.unreadable(self._path, exc) from exc

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


class _ToItsEnd(io.RawIOBase):
    """A forward-only stream of one file of a view that, closed, reads on to the end
    (:meth:`PackageView.forward_opener`)."""

    def __init__(self, inner: IO[bytes]):
        super().__init__()
        self._inner = inner
        self._failed = False  # a read raised (told already): no read on to the end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._inner.read(len(buffer))
        except BaseException:
            self._failed = True
            raise
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            while not self._failed and self._inner.read(STREAM_BUFFER):
                pass
        finally:
            try:
                self._inner.close()
            finally:
                super().close()


def _chunk_digest(chunk: bytes) -> bytes:
    return hashlib.blake2b(chunk, digest_size=_DIGEST).digest()


class _CheckedChunks:
    """One file of a view read once through the store's check, a digest kept per chunk;
    :meth:`get` gives a chunk again only as it was then (the last few held, the rest read
    again and compared)."""

    def __init__(self, view: PackageView, path: str):
        self.view, self.path = view, path
        digests = bytearray()
        read = 0
        with view.open(path) as f:  # a path not in the manifest: a HistoryProblem here
            while chunk := f.read(CHECK_CHUNK):
                digests += _chunk_digest(chunk)
                read += len(chunk)
        self.size = view.manifest.files[path].size
        if read != self.size:
            raise HistoryProblem(f"{path} holds {read} bytes, not the {self.size} its "
                                 "manifest says")
        self._digests = bytes(digests)
        self._held: OrderedDict[int, bytes] = OrderedDict()
        self._inner: IO[bytes] | None = None

    def get(self, index: int) -> bytes:
        chunk = self._held.get(index)
        if chunk is not None:
            self._held.move_to_end(index)
            return chunk
        if self._inner is None:
            self._inner = self.view.open(self.path)
        self._inner.seek(index * CHECK_CHUNK)
        chunk = self._inner.read(CHECK_CHUNK)
        digest = self._digests[index * _DIGEST:(index + 1) * _DIGEST]
        if len(digest) != _DIGEST or _chunk_digest(chunk) != digest:
            raise self.view.unreadable(self.path, StorageError(
                f"blob {self.view.sha(self.path)} is damaged: its bytes changed after they "
                "were checked", reason="store_corrupt"))
        self._held[index] = chunk
        if len(self._held) > CHECKED_HELD:
            self._held.popitem(last=False)
        return chunk

    def close(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()


class _Rechecked(io.RawIOBase):
    """A seekable stream of one file of a view, every chunk of it as it was checked
    (:class:`_CheckedChunks`)."""

    def __init__(self, chunks: _CheckedChunks):
        super().__init__()
        self._chunks = chunks
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = self._chunks.size
        if self._at >= size or not len(buffer):
            return 0
        index, offset = divmod(self._at, CHECK_CHUNK)  # (its check read exactly size bytes)
        data = self._chunks.get(index)[offset:offset + len(buffer)]
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._chunks.size}
        if whence not in bases or type(offset) is not int or bases[whence] + offset < 0:
            raise ValueError(f"invalid seek ({offset!r}, {whence!r})")
        self._at = bases[whence] + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def close(self) -> None:
        try:
            self._chunks.close()
        finally:
            super().close()


def store_errors_first(view_for: Callable[[Callable[[VianoError], None]], PackageView],
                       make: Callable[[PackageView], R]) -> R:
    """``make`` on the view ``view_for`` builds (given the fault callback); a failure of a
    run in which the store failed a read is the store's error (``store_corrupt``,
    ``store_unavailable``), not what the unreadable file led to (``unsupported_history``,
    ``interpretation_mismatch``), which would send a person the wrong way."""
    faults: list[VianoError] = []
    try:
        return make(view_for(faults.append))
    except (VianoError, HistoryProblem) as exc:
        if faults and faults[0] is not exc:
            raise faults[0] from exc
        raise


def remember_written(change: Change) -> Change:
    """``change``, its new files put in the document cache as they are written: the steps
    after read them back (the pinned context for the prompt and every audit, a round for
    its judge, the accepted artifacts for the next phase), and each of those reads went to
    the store. A sha256 names one content, so an entry is right whether or not the
    publication lands. Request bodies are left out: nothing reads them back."""
    for path, source in change.files.items():
        if isinstance(source, BytesSource) and "/requests/" not in path:
            DOCUMENTS.put(source.sha256, source.data)
    return change
