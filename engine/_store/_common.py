"""What every store backend does the same way, whatever holds its rows: the gate that lets
``close`` wait for operations in progress, the preparation of a batch's blobs before its
transaction, the gc re-check inside it, the case-index row as a :class:`CaseRef`, the
checks on a stored manifest, and the cache of parsed head manifests.

Only SQL differs between backends; it stays in each backend's module.
"""

from __future__ import annotations

import functools
import logging
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import attrs

from .._canonical import utc_now_iso
from .._errors import ChangeRejected, InputRejected, NotFound, StorageError, VianoError
from ._blobs import input_changed
from ._crash import crash_point
from ._manifest import Manifest
from ._plan import BatchRows, GenerationRow, Head, PlanInput
from ._protocol import BlobStorage, CaseRef, StoreStats
from ._requests import CaseStatus, ImportRequest, Outcome, PublishRequest, Request
from ._sources import BlobSource, read_verified

# Blobs up to this size live inside the database; larger ones are fsynced files. Measured
# by bench/blob_threshold.py on these machines: see the README's benchmark section.
INLINE_THRESHOLD = 256 * 1024
# Parsed manifests kept for the heads in use (a publication needs its parent's): enough for
# every case in flight at the largest concurrency measured; a manifest of a few hundred
# files is tens of KiB parsed.
MANIFEST_CACHE = 1024
REF_COLUMNS = ("case_id, package_id, generation, phase, analysis_revision, updated_at, "
               "status, status_phase, reason, round, max_rounds, due_at, attempt_id, "
               "calls_started")
# The due index, in portable SQL: READY and RUNNING cases, retries whose time has come
# (placeholders: now), and under a confirming policy the interpretations awaiting it.
DUE_WHERE = "status IN ('READY', 'RUNNING') OR (status='RETRY_PENDING' AND due_at <= {now})"
AWAITING_WHERE = " OR (status='COMPLETED' AND reason='awaiting_confirmation')"
Large = dict[str, list[tuple[int, BlobSource]]]
log = logging.getLogger("viano.store")


class Gate:
    """Counts the operations in progress on a store's connections; ``close`` waits for
    them and refuses new ones."""

    def __init__(self, location: str):
        self.location = location
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._mine = threading.local()  # this thread's depth of nested uses

    def use(self) -> Gate:
        """``with gate.use():`` around one operation (the gate is its own context manager:
        a generator-based one cost ~1% of an engine's CPU, once per store operation)."""
        return self

    def __enter__(self) -> None:
        depth = getattr(self._mine, "depth", 0)
        with self._cond:
            if self._closed and depth == 0:  # a thread already inside may finish its work
                raise self._closed_error()
            self._active += 1
        self._mine.depth = depth + 1

    def __exit__(self, *exc: object) -> None:
        self._mine.depth -= 1
        with self._cond:
            self._active -= 1
            if self._closed:  # only close waits on it
                self._cond.notify_all()

    def refuse_if_closed(self) -> None:
        """Before a connection is opened: once closed, none is, except for a thread still
        inside an operation (``use``), which ``close`` waits for. A connection opened
        after ``close`` had closed them all was never closed: a leak, and a handle that
        went on working after its end."""
        if self._closed and getattr(self._mine, "depth", 0) == 0:
            raise self._closed_error()

    def _closed_error(self) -> StorageError:
        return StorageError(f"the store at {self.location} is closed",
                            reason="store_unavailable",
                            hint="Open it again (a handle is not used after its block ends).")

    def close(self, timeout_s: float = 60.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0, timeout_s)


class _Gated(Protocol):
    _gate: Gate


_S = TypeVar("_S", bound=_Gated)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def guarded(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """The method runs inside the store's gate (see :class:`Gate`)."""
    @functools.wraps(method)
    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._gate.use():
            return method(self, *args, **kwargs)
    return wrapper


# -- a batch's blobs ---------------------------------------------------------------------


class Committed:
    """What a backend committed since it opened (``Store.stats``), and the bookkeeping
    every backend does once a batch's transaction has committed."""

    def __init__(self) -> None:
        self.transactions = self.requests = self.bytes = 0

    def count(self, requests: int, rows: BatchRows, cache: ManifestCache) -> None:
        self.transactions += 1
        self.requests += requests
        self.bytes += rows.bytes_written
        crash_point("txn.after_commit")
        for manifest in rows.new_manifests:
            cache.put(manifest)

    def stats(self) -> StoreStats:
        return StoreStats(self.transactions, self.requests, self.bytes)


def prepare_blobs(blob_files: BlobStorage, inline_threshold: int, req: Request,
                  inline: dict[str, bytes], large: Large, i: int) -> VianoError | None:
    """Write the large blobs of one request and read its small ones, hashing the bytes
    that will be stored. Returns the refusal of this request, if any."""
    if isinstance(req, PublishRequest):
        sources: Sequence[BlobSource] = list(req.change.files.values())
    elif isinstance(req, ImportRequest):
        sources = list(req.blobs.values())
    else:
        return None
    try:
        for source in sources:
            if source.size > inline_threshold:
                if source.sha256 not in large:
                    blob_files.write(source)
                large.setdefault(source.sha256, []).append((i, source))
            elif source.sha256 not in inline:
                data = read_verified(source)
                if data is None:
                    return input_changed(source)
                inline[source.sha256] = data
    except VianoError as exc:
        return exc
    except PermissionError as exc:
        return InputRejected(f"cannot read an input while storing it: "
                             f"{exc.strerror or exc}", reason="unreadable_input",
                             hint="Check that the input files are readable and run the "
                                  "command again.")
    except (OSError, EOFError, ValueError, RuntimeError, zipfile.BadZipFile,
            zlib.error) as exc:
        # The source is not what was validated any more (a file or export replaced).
        return InputRejected(f"an input could not be read as it was validated "
                             f"({type(exc).__name__}); nothing of this request was "
                             "written", reason="input_changed",
                             hint="Do not modify input files while Viano reads them; "
                                  "run the command again.")
    return None


def recheck_files(blob_files: BlobStorage, large: Large,
                  refused: list[VianoError | None]) -> None:
    """gc protocol, step 2: under the write lock, every file this batch references is in
    place; one that gc removed since it was written is written again here."""
    for sha, users in large.items():
        live = [(i, s) for i, s in users if refused[i] is None]
        if not live or blob_files.exists(sha, live[0][1].size):
            continue
        for i, source in live:
            try:
                blob_files.write(source)
                break
            except (VianoError, OSError) as exc:
                refused[i] = exc if isinstance(exc, VianoError) else input_changed(source)


def commit_each_alone(commit: Callable[[Sequence[Request]], list[Outcome]],
                     requests: Sequence[Request],
                     value_error: Callable[[BaseException], bool]) -> list[Outcome]:
    """``commit(requests)``; if a value the database refuses (one every check before let
    through) fails the whole transaction, each request is committed alone, so only the
    one that holds it is refused (``invalid_change``) and the others still commit."""
    try:
        return commit(requests)
    except Exception as exc:
        if len(requests) < 2 or not value_error(exc):
            raise
        log.warning("a batch of %d failed on a value the database refused (%s); "
                    "committing its requests one by one", len(requests), exc)
    out: list[Outcome] = []
    for req in requests:  # never raises now: an outcome per request, as committed or not
        try:
            out.extend(commit([req]))
        except VianoError as exc:
            out.append(_refused_value(req, exc) if value_error(exc) else exc)
        except Exception as exc:
            out.append(_refused_value(req, exc) if value_error(exc) else StorageError(
                f"case {req.case_id!r}: committing it alone failed ({type(exc).__name__}); "
                "nothing of it was written", reason="internal_error",
                hint="This is a bug in Viano; please report it."))
    return out


def _refused_value(req: Request, exc: BaseException) -> ChangeRejected:
    return ChangeRejected(f"case {req.case_id!r}: a value of this request cannot be stored "
                          f"({type(exc).__name__}: {exc}); nothing of it was written",
                          reason="invalid_change",
                          hint="This is a bug in Viano; please report it.")


def plan_input(requests: Sequence[Request], heads: dict[str, Head], owners: dict[str, str],
               refused: list[VianoError | None], inline: dict[str, bytes],
               inline_threshold: int, manifest: Callable[[str, int], Manifest],
               history: Callable[[str], list[str]]) -> PlanInput:
    """What batch planning needs beside the heads and owners a backend read: each head's
    manifest (``manifest(package, generation)``; one that cannot be read refuses that
    package's requests) and, for imports, the package's history (``history(package)``:
    manifest hashes by generation)."""
    parents: dict[str, Manifest] = {}
    broken: dict[str, VianoError] = {}
    for pkg, head in heads.items():
        try:
            parents[pkg] = manifest(pkg, head.generation)
        except VianoError as exc:
            broken[pkg] = exc
    histories: dict[str, list[str]] = {}
    for i, req in enumerate(requests):
        if isinstance(req, ImportRequest) and req.package_id not in histories and \
                req.package_id not in broken:
            try:
                histories[req.package_id] = history(req.package_id)
            except VianoError as exc:  # a damaged history refuses that package's requests
                broken[req.package_id] = exc
        if req.package_id in broken and refused[i] is None:
            refused[i] = broken[req.package_id]
    return PlanInput(requests=requests, heads=heads, owners=owners, parents=parents,
                     histories=histories, refused=refused, inline=inline,
                     inline_threshold=inline_threshold, now=utc_now_iso())


# -- rows --------------------------------------------------------------------------------


_STATUS_FIELDS = tuple(a.name for a in attrs.fields(CaseStatus))
_SHARED_TEXT = 256  # statuses with longer text (only a damaged row has it) are not kept


def stored_status(*values: Any) -> CaseStatus:
    """A status as the index holds it (its fields in declaration order), not checked: a
    damaged row must still list (verify names it, see ``status_problem``), never make every
    read of the index refuse. Statuses are immutable, so one is shared by the rows that
    hold the same values (most cases of a batch are READY at the same phase)."""
    for v in values:  # a loop: any() over a generator was a tenth of reading a head
        if isinstance(v, (str, bytes)) and len(v) > _SHARED_TEXT:
            return _status_of(*values)
    return _shared_status(*values)


def _status_of(*values: Any) -> CaseStatus:
    status = object.__new__(CaseStatus)
    for name, value in zip(_STATUS_FIELDS, values, strict=True):
        object.__setattr__(status, name, value)
    return status


# typed: a damaged 1.0 is not shared with a good round 1
_shared_status = functools.lru_cache(maxsize=4096, typed=True)(_status_of)


def status_problem(status: CaseStatus) -> str | None:
    """Why a status read from the index is not one any writer could have written."""
    try:
        attrs.validate(status)
    except ChangeRejected as exc:
        return exc.message
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def ref_from_row(row: Sequence[Any]) -> CaseRef:
    """A row of ``REF_COLUMNS`` (or of its first six, from a version-1 store)."""
    return CaseRef(row[0], row[1], row[2], row[3], row[4], row[5], _row_status(row))


def head_from_row(row: Sequence[Any]) -> Head:
    """What batch planning needs of a row of ``REF_COLUMNS``: no ``CaseRef`` is built."""
    return Head(row[0], row[2], _row_status(row))


def _number(value: Any) -> Any:
    """A due time as a float; anything else (a damaged row: text, a blob) kept as it is, for
    ``status_problem`` to name (float() of it failed every read as internal_error)."""
    return float(value) if type(value) in (int, float) else value


def _row_status(row: Sequence[Any]) -> CaseStatus | None:
    if len(row) > 6 and row[6] is not None:
        return stored_status(row[6], row[7], row[8], row[9], row[10],
                             _number(row[11]), row[12], row[13])
    if len(row) == 6:
        return CaseStatus(status="READY", phase=row[3])  # a version-1 store: at intake
    return None


def ref_row(pkg: str, case: str, gen: int, phase: str, revision: int, updated: str,
            status: CaseStatus | None) -> tuple[Any, ...]:
    s = status or CaseStatus(status="READY", phase=phase)
    return (pkg, case, gen, phase, revision, updated, s.status, s.phase, s.reason, s.round,
            s.max_rounds, s.due_at, s.attempt_id, s.calls_started)


def check_generation(generation: object) -> None:
    if type(generation) is not int or not 1 <= generation <= 2**62:
        raise NotFound(f"there is no generation {generation!r}", reason="unknown_generation",
                       hint="Generations are numbered from 1; run 'viano log CASE'.")


def parse_stored_manifest(raw: bytes | None, sha256: str, package_id: str,
                          generation: int) -> Manifest:
    """A generation row's manifest, its bytes checked against their hash and its ids
    against the row's: damage is ``store_corrupt``, never served."""
    if raw is None:
        raise NotFound(f"package {package_id} has no generation {generation}",
                       reason="unknown_generation",
                       hint="Run 'viano log CASE' to list its generations.")
    try:
        manifest = Manifest.parse(raw, sha256)
    except ChangeRejected as exc:
        raise StorageError(f"generation {generation} of package {package_id} is damaged: "
                           f"{exc.message}", reason="store_corrupt") from exc
    if (manifest.package_id, manifest.package_generation) != (package_id, generation):
        raise StorageError(f"generation {generation} of package {package_id} holds "
                           "another generation's manifest", reason="store_corrupt")
    return manifest


def stored_bytes(value: object) -> bytes | None:
    """A blob column's value as bytes; None for anything else (only a damaged row holds a
    text or a number where bytes belong)."""
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else None


def generation_row(r: Sequence[Any]) -> GenerationRow:
    """A row of ``package_id, generation, parent, manifest_sha256, manifest, phase,
    created_at``. A manifest stored as anything but bytes (only a damaged row: NULL, text)
    reads as ``b""``, which its hash check refuses, so verify, log and export report the
    damage (``bytes(None)`` failed them all with internal_error)."""
    raw = stored_bytes(r[4])
    return GenerationRow(r[0], r[1], r[2], r[3], b"" if raw is None else raw, r[5], r[6])


def stored_manifest(row: Sequence[Any] | None, package_id: str, generation: int
                    ) -> Manifest:
    """A ``(manifest, manifest_sha256)`` row as :func:`parse_stored_manifest` reads it:
    no row is no such generation; a damaged value is ``store_corrupt``."""
    if row is None:
        return parse_stored_manifest(None, "", package_id, generation)
    raw = stored_bytes(row[0])
    return parse_stored_manifest(b"" if raw is None else raw, str(row[1]), package_id,
                                 generation)


def stored_size(value: object, sha256: str) -> int:
    """A blob row's size; anything but a count (NULL, text: a damaged row) is
    ``store_corrupt`` naming the blob, never ``int(None)``'s internal_error."""
    if type(value) is int and value >= 0:
        return value
    raise StorageError(f"blob {sha256}'s recorded size is damaged ({value!r})",
                       reason="store_corrupt", hint="Run 'viano verify' to see what is damaged.")


def referenced_hashes(rows: Iterable[tuple[str, int, bytes, str]]) -> set[str]:
    """Every sha256 the given generation rows name. A manifest that cannot be read makes
    this refuse: gc must not guess what a damaged generation references."""
    refs: set[str] = set()
    for pkg, gen, raw, sha in rows:
        try:
            data = stored_bytes(raw)
            if data is None:
                raise ChangeRejected(f"the manifest is stored as {type(raw).__name__}")
            manifest = Manifest.parse(data, sha)
        except ChangeRejected as exc:
            raise StorageError(f"generation {gen} of package {pkg} is damaged, so gc "
                               "cannot know what it references; nothing was removed",
                               reason="store_corrupt") from exc
        refs.update(e.sha256 for e in manifest.files.values())
    return refs


def chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


class ManifestCache:
    """Parsed manifests by (package, generation), least recently used out first."""

    def __init__(self, size: int = MANIFEST_CACHE):
        self._size = size
        self._items: OrderedDict[tuple[str, int], Manifest] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> Manifest | None:
        with self._lock:
            return self._items.get(key)

    def put(self, manifest: Manifest) -> None:
        key = (manifest.package_id, manifest.package_generation)
        with self._lock:
            items = self._items
            if key in items:
                items.move_to_end(key)
            items[key] = manifest
            if len(items) > self._size:
                items.popitem(last=False)
