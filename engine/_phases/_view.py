"""One generation of a package as the phases read it: its manifest and its files, through a
blocking reader that the caller supplies (the store, on a worker thread).

Everything a phase reads back is parsed strictly (an imported package is untrusted), and a
file that cannot be read or parsed is a :class:`HistoryProblem`, which the runner turns
into ``unsupported_history`` rather than an internal error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any

import attrs

from .._config import MAX_DOCUMENT_BYTES
from .._errors import VianoError
from .._json import UntrustedJson, loads_untrusted
from .._store import BytesSource, Change, Manifest

Reader = Callable[[str], bytes]     # sha256 -> bytes
_UNPARSED: Any = object()
Opener = Callable[[str], IO[bytes]]  # sha256 -> a readable, seekable stream


class _Documents:
    """What the phases read back, by sha256: the bytes, and the parsed document once
    parsed. A sha256 names exactly one content whichever store it came from, so an entry
    can never be stale; it only saves the reads and the strict parses that every step of
    every case repeats (the case record, the catalogue, the interpretation, the rounds).
    Bounded by an estimate of the memory held — the bytes, and a parsed document at
    ``PARSED_FACTOR`` times its bytes (Python objects are that much bigger than JSON) —
    least recently used out first; documents over ``max_item`` are never kept. The bound
    is small on purpose: the working set is the documents of the cases in flight, and a
    batch of thousands must not grow with it (bench/throughput.py reports RSS per
    in-flight case). Parsed documents are shared: the phases only read them."""

    PARSED_FACTOR = 8

    def __init__(self, max_bytes: int = 16 << 20, max_item: int = 256 << 10):
        self.max_bytes, self.max_item = max_bytes, max_item
        self._entries: OrderedDict[str, tuple[bytes, Any]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

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
            while self._size > self.max_bytes:
                _sha, gone = self._entries.popitem(last=False)
                self._size -= self._cost(*gone)

    def _cost(self, data: bytes, parsed: Any) -> int:
        return len(data) * (1 if parsed is _UNPARSED else 1 + self.PARSED_FACTOR)


DOCUMENTS = _Documents()


class HistoryProblem(Exception):
    """The package holds something a phase cannot stand on (missing, unreadable,
    inconsistent). Never raised for the model's faults."""


@attrs.frozen
class PackageView:
    manifest: Manifest
    reader: Reader = attrs.field(repr=False)
    opener: Opener | None = attrs.field(default=None, repr=False)

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
            raise HistoryProblem(f"{path} cannot be read: {exc.message}") from exc
        DOCUMENTS.put(entry.sha256, data)
        return data

    def open(self, path: str) -> IO[bytes]:
        """A stream of a (possibly large) file; the caller closes it."""
        entry = self.manifest.files.get(path)
        if entry is None:
            raise HistoryProblem(f"{path} is not in generation "
                                 f"{self.manifest.package_generation}")
        if self.opener is None:
            import io

            return io.BytesIO(self.read(path))
        try:
            return self.opener(entry.sha256)
        except VianoError as exc:
            raise HistoryProblem(f"{path} cannot be read: {exc.message}") from exc

    def read_json(self, path: str) -> Any:
        data = self.read(path)
        sha = self.sha(path)
        assert sha is not None  # read() found the entry
        cached = DOCUMENTS.get(sha)
        if cached is not None and cached[1] is not _UNPARSED:
            return cached[1]
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
