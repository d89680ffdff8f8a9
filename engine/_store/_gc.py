"""``viano gc``: remove blob files that no generation references.

Only a crash leaves such files (a blob written, its transaction never committed). The
referenced set is computed under the SQLite write lock, so no commit can land meanwhile;
files younger than ``min_age_s`` are kept because another process may have written them
and not yet started its transaction. A referenced blob is never touched.
"""

from __future__ import annotations

import time

import attrs

from ._crash import crash_point
from ._sqlite import SqliteStore


@attrs.frozen
class GcReport:
    removed_files: int
    removed_bytes: int
    removed_temporary: int
    kept_young: int

    def to_json(self) -> dict[str, int]:
        return attrs.asdict(self)


def collect_garbage(store: SqliteStore, *, min_age_s: float = 600.0) -> GcReport:
    conn = store.writer
    cutoff = time.time() - min_age_s
    removed = removed_bytes = tmp_removed = young = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        referenced = store.referenced_hashes(conn)
        for sha, path in store.blob_files.iter_files():
            if sha in referenced:
                continue
            st = path.stat()
            if st.st_mtime > cutoff:
                young += 1
                continue
            crash_point("gc.before_unlink")
            path.unlink()
            removed += 1
            removed_bytes += st.st_size
        for path in store.blob_files.iter_tmp():
            if path.stat().st_mtime > cutoff:
                young += 1
                continue
            path.unlink()
            tmp_removed += 1
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return GcReport(removed, removed_bytes, tmp_removed, young)
