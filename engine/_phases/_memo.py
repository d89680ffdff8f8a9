"""Pure checks of a generation, remembered by exactly what they read.

A check such as "does the confirmed interpretation still verify against the case" is a
pure function of the package files it looks at, and the phases repeat it at every step of
a case (each step reads a new generation in which those files have not changed). So the
check runs once on a view that records every lookup — each path asked for (and the entry
found, or none), each pointer, each listing under a prefix, each manifest field — and its
result is kept with that record. A later call on another generation of the same package
gets the result only if every recorded lookup gives the same answer there. A file is named
by its sha256, so the same entries mean the same bytes: the check would compute the same
thing. Nothing is assumed about which files a check reads; a check that reads something
new on a later generation simply misses.

Not kept: a result from a run in which a read of the store failed (that may be transient:
the reader, an opened stream and its reads are all watched), one in which the check
enumerated the whole file list (the record would be the whole manifest), or one whose
record is over ``MAX_LOOKUPS`` (an imported package with thousands of inputs). Bounded:
``MAX_KEYS`` (check, arguments, package) most recently used, a few records each, and at
most ``MAX_TOTAL_LOOKUPS`` lookups kept in all (the paths and entries they hold).
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import IO, Any, TypeVar, cast

from .._store import Manifest
from ._view import PackageView

R = TypeVar("R")
MAX_KEYS = 4096  # (check, arguments, package): ~5 per case in flight (~37 lookups)
PER_KEY = 4
MAX_LOOKUPS = 512            # per record
MAX_TOTAL_LOOKUPS = 200_000  # over every record kept: a few tens of MB at most
_MISSING = object()


class _Record:
    __slots__ = ("failed", "fields", "files", "pointers", "under", "whole")

    def __init__(self) -> None:
        self.files: dict[str, Any] = {}
        self.pointers: dict[str, Any] = {}
        self.under: dict[str, tuple[str, ...]] = {}
        self.fields: dict[str, Any] = {}
        self.failed = False
        self.whole = False

    @property
    def size(self) -> int:
        return (len(self.files) + len(self.pointers) + len(self.fields)
                + sum(1 + len(v) for v in self.under.values()))

    def holds_for(self, m: Manifest) -> bool:
        files, pointers = m.files, m.pointers
        return (all(files.get(p, _MISSING) == e for p, e in self.files.items())
                and all(pointers.get(n, _MISSING) == v for n, v in self.pointers.items())
                and all(getattr(m, f) == v for f, v in self.fields.items())
                and all(tuple(m.paths_under(pre)) == got for pre, got in self.under.items()))


class _SeenMapping(Mapping[str, Any]):
    """A manifest mapping (files, pointers) that notes each key looked up."""

    __slots__ = ("_inner", "_record", "_seen")

    def __init__(self, inner: Mapping[str, Any], seen: dict[str, Any], record: _Record):
        self._inner, self._seen, self._record = inner, seen, record

    def __getitem__(self, key: str) -> Any:
        value = self._inner.get(key, _MISSING)
        self._seen[key] = value
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self._inner.get(key, _MISSING)
        self._seen[key] = value
        return default if value is _MISSING else value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return self.get(key, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        self._record.whole = True
        return iter(self._inner)

    def __len__(self) -> int:
        self._record.whole = True
        return len(self._inner)


class _SeenManifest:
    """The manifest as a check sees it: every answer it gets is noted in the record."""

    def __init__(self, manifest: Manifest, record: _Record):
        self._m, self._r = manifest, record
        self.files = _SeenMapping(manifest.files, record.files, record)
        self.pointers = _SeenMapping(manifest.pointers, record.pointers, record)

    def entry(self, path: str) -> Any:
        return self.files.get(path)

    def paths_under(self, prefix: str) -> Iterator[str]:
        got = tuple(self._m.paths_under(prefix))
        self._r.under[prefix] = got
        return iter(got)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._m, name)
        if callable(value):  # a method this wrapper does not know: no record can say
            self._r.whole = True
        else:
            self._r.fields[name] = value
        return value


class _Watched(io.RawIOBase):
    """A stream from the store whose failures mark the record (a transient read error
    must not be remembered as the check's answer)."""

    def __init__(self, inner: IO[bytes], record: _Record):
        self._inner, self._record = inner, record

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._inner.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._inner.read(len(buffer))
        except BaseException:
            self._record.failed = True
            raise
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


class _Memo:
    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], list[tuple[_Record, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._lookups = 0  # the size of every record kept
        self.hits = self.misses = 0

    def run(self, check: Callable[..., R], view: PackageView, *args: Any,
            freeze: Callable[[R], Any] = lambda r: r,
            thaw: Callable[[Any], R] = lambda r: r) -> R:
        m = view.manifest
        key = (check, args, m.package_id)
        with self._lock:
            records = list(self._entries.get(key, ()))
        for record, kept in records:
            if record.holds_for(m):
                with self._lock:
                    self.hits += 1
                    if key in self._entries:
                        self._entries.move_to_end(key)
                return thaw(kept)
        with self._lock:
            self.misses += 1
        record = _Record()
        seen = PackageView(cast(Manifest, _SeenManifest(m, record)),
                           self._watched_reader(view, record),
                           self._watched_opener(view, record), view.on_fault)
        result = check(seen, *args)
        if not (record.failed or record.whole) and record.size <= MAX_LOOKUPS:
            self._keep(key, record, freeze(result))
        return result

    @staticmethod
    def _watched_reader(view: PackageView, record: _Record) -> Callable[[str], bytes]:
        def reader(sha: str) -> bytes:
            try:
                return view.reader(sha)
            except BaseException:
                record.failed = True
                raise
        return reader

    @staticmethod
    def _watched_opener(view: PackageView, record: _Record
                        ) -> Callable[[str], IO[bytes]] | None:
        opener = view.opener
        if opener is None:
            return None

        def watched(sha: str) -> IO[bytes]:
            try:
                stream = opener(sha)
            except BaseException:
                record.failed = True
                raise
            return io.BufferedReader(_Watched(stream, record))
        return watched

    def _keep(self, key: tuple[Any, ...], record: _Record, kept: Any) -> None:
        with self._lock:
            records = self._entries.setdefault(key, [])
            self._entries.move_to_end(key)
            records.insert(0, (record, kept))
            self._lookups += record.size
            for gone, _ in records[PER_KEY:]:
                self._lookups -= gone.size
            del records[PER_KEY:]
            while self._entries and (len(self._entries) > MAX_KEYS
                                     or self._lookups > MAX_TOTAL_LOOKUPS):
                _key, dropped = self._entries.popitem(last=False)
                self._lookups -= sum(r.size for r, _ in dropped)


MEMO = _Memo()


class Keyed:
    """An argument of a remembered check that is not hashable itself (a policy mapping):
    it counts in the check's key by ``key``, its canonical form."""

    __slots__ = ("key", "value")

    def __init__(self, value: Any, key: Hashable):
        self.value, self.key = value, key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyed) and other.key == self.key


def remembered_problems(check: Callable[[PackageView, int], list[str]], view: PackageView,
                        revision: int) -> list[str]:
    """``check(view, revision)``, a list of problems, remembered (see the module)."""
    return MEMO.run(check, view, revision, freeze=tuple, thaw=list)
