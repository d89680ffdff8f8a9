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

Not kept: a result from a run in which a read of the store failed (that may be transient),
or one in which the check enumerated the whole file list (the record would be the whole
manifest). Bounded: ``MAX_KEYS`` (check, arguments, package) most recently used, a few
records each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

from .._store import Manifest
from ._view import PackageView

R = TypeVar("R")
MAX_KEYS = 1024
PER_KEY = 4
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


class _Memo:
    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], list[tuple[_Record, Any]]] = OrderedDict()
        self._lock = threading.Lock()
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
                self.hits += 1
                return thaw(kept)
        self.misses += 1
        record = _Record()

        def reader(sha: str) -> bytes:
            try:
                return view.reader(sha)
            except BaseException:
                record.failed = True
                raise

        seen = PackageView(cast(Manifest, _SeenManifest(m, record)), reader, view.opener)
        result = check(seen, *args)
        if not (record.failed or record.whole):
            with self._lock:
                kept = self._entries.setdefault(key, [])
                self._entries.move_to_end(key)
                kept.insert(0, (record, freeze(result)))
                del kept[PER_KEY:]
                while len(self._entries) > MAX_KEYS:
                    self._entries.popitem(last=False)
        return result


MEMO = _Memo()


def remembered_problems(check: Callable[[PackageView, int], list[str]], view: PackageView,
                        revision: int) -> list[str]:
    """``check(view, revision)``, a list of problems, remembered (see the module)."""
    return MEMO.run(check, view, revision, freeze=tuple, thaw=list)
