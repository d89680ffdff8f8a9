"""``viano gc``: remove blob files that no generation references, and abandoned temporaries.

Only a crash leaves such files (a blob written, its transaction never committed). The
protocol that makes this safe against concurrent publications is in ``_blobs``: gc holds
the store's write lock for its whole run, so no commit can land meanwhile, and every
commit re-checks (and if need be rewrites) its files under that same lock. A referenced
blob is never touched; a store whose index is missing or empty while blobs exist is
refused, as is one with a damaged manifest (gc cannot know what it references).
``min_age_s`` keeps files younger than that (a belt to those braces, and a way to leave
the evidence of a very recent crash in place).
"""

from __future__ import annotations

import time

import attrs

from .._errors import StorageError
from ._blobs import NOT_YOURS_TO_WRITE
from ._crash import crash_point
from ._protocol import Store


@attrs.frozen
class GcReport:
    removed_files: int
    removed_bytes: int
    removed_temporary: int
    kept_young: int

    def to_json(self) -> dict[str, int]:
        return attrs.asdict(self)


def collect_garbage(store: Store, *, min_age_s: float = 600.0) -> GcReport:
    problems = store.index_problems()
    if problems:
        raise StorageError(f"{store.location}: {'; '.join(problems)}; nothing was removed",
                           reason="store_corrupt",
                           hint=f"{store.repair_hint} before running gc.")
    cutoff = time.time() - min_age_s
    removed = removed_bytes = tmp_removed = young = 0
    with store.exclusive() as held:
        referenced = held.referenced_hashes()
        for sha, path in store.blob_files.iter_files():
            if sha in referenced:
                continue
            try:
                st = path.lstat()  # the entry itself: a link (dangling, looping) is removed,
            except FileNotFoundError:  # never followed
                continue
            if st.st_mtime > cutoff:
                young += 1
                continue
            crash_point("gc.before_unlink")
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # its own reason, not the lock's it is taken under
                raise StorageError(f"could not remove the orphan blob file {path}: "
                                   f"{exc.strerror or exc}",
                                   reason="store_read_only" if exc.errno in NOT_YOURS_TO_WRITE
                                   else "store_unavailable",
                                   hint="Check the blob folder's permissions; what gc "
                                        "removed before it stays removed (it was unreferenced)."
                                   ) from exc
            removed += 1
            removed_bytes += st.st_size
        for path in store.blob_files.iter_tmp():
            try:
                if path.stat().st_mtime > cutoff:
                    young += 1
                    continue
            except FileNotFoundError:
                continue
            if store.blob_files.remove_abandoned(path):
                tmp_removed += 1
    return GcReport(removed, removed_bytes, tmp_removed, young)
