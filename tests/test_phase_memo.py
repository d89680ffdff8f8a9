"""engine._phases._memo: a pure check's result is reused on another generation only when
every lookup it made gives the same answer there."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from typing import IO, Any

import pytest

from engine import VianoError
from engine._phases._memo import _Memo
from engine._phases._view import DOCUMENTS, HistoryProblem, PackageView
from engine._store._manifest import PACKAGE_FORMAT, Manifest

BLOBS: dict[str, bytes] = {}


def _blob(data: bytes) -> dict[str, Any]:
    sha = hashlib.sha256(data).hexdigest()
    BLOBS[sha] = data
    return {"sha256": sha, "size": len(data)}


def manifest(gen: int, files: Mapping[str, bytes], pointers: Mapping[str, str] | None = None,
             package_id: str = "pkg-1") -> Manifest:
    return Manifest.from_json({
        "format": PACKAGE_FORMAT, "package_id": package_id, "case_id": "C-1",
        "package_generation": gen, "parent_generation": gen - 1 if gen > 1 else None,
        "analysis_revision": 1, "phase": "INTAKE", "created_at": "2026-12-01T00:00:00.000000Z",
        "pointers": dict(pointers or {}), "files": {p: _blob(d) for p, d in files.items()}})


def view(m: Manifest, fail: bool = False, fail_open: str = "") -> PackageView:
    def read(sha: str) -> bytes:
        if fail:
            raise VianoError("the disk said no", reason="io_error")
        return BLOBS[sha]

    class Failing(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return True

        def seek(self, offset: int, whence: int = 0) -> int:
            return 0

        def readinto(self, buffer: Any) -> int:
            raise VianoError("the stream broke", reason="store_corrupt")

    def open_(sha: str) -> IO[bytes]:
        if fail_open == "open":
            raise VianoError("the disk said no", reason="io_error")
        if fail_open == "read":
            return io.BufferedReader(Failing())
        return io.BytesIO(BLOBS[sha])
    return PackageView(m, read, open_)


class Counting:
    """A check that reads what the test says, counting its real runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, v: PackageView, revision: int) -> list[str]:
        self.runs += 1
        out = [v.read("case/a.txt").decode()]
        target = v.manifest.pointers.get("target")
        if target is not None and v.has(target):
            out.append(v.read(target).decode())
        out.append(",".join(v.manifest.paths_under("inputs/")))
        out.append(v.manifest.case_id)
        return out


BASE = {"case/a.txt": b"A", "inputs/r.txt": b"R", "other/x.txt": b"X",
        "analysis/h/1.json": b"{}"}


@pytest.fixture
def memo() -> _Memo:
    DOCUMENTS._entries.clear()  # reads must reach the reader, where failures are seen
    return _Memo()


def run(memo: _Memo, check: Counting, m: Manifest, **kw: Any) -> list[str]:
    return memo.run(check, view(m, **kw), 1, freeze=tuple, thaw=list)


def test_a_generation_that_changed_nothing_it_read_reuses_the_result(memo: _Memo) -> None:
    check = Counting()
    first = run(memo, check, manifest(1, BASE))
    # generation 2 adds and changes files the check never looked at
    later = run(memo, check, manifest(2, {**BASE, "analysis/h/2.json": b"[]",
                                          "other/x.txt": b"X2"}))
    assert later == first == ["A", "inputs/r.txt", "C-1"]
    assert check.runs == 1 and memo.hits == 1


@pytest.mark.parametrize("change", [
    {"case/a.txt": b"A2"},                        # a file it read
    {"inputs/s.txt": b"S"},                       # a new file in a listing it made
])
def test_a_change_to_anything_it_read_runs_it_again(memo: _Memo, change: dict[str, bytes]
                                                    ) -> None:
    check = Counting()
    run(memo, check, manifest(1, BASE))
    again = run(memo, check, manifest(2, {**BASE, **change}))
    assert check.runs == 2
    assert again == check(view(manifest(3, {**BASE, **change})), 1)


def test_a_file_named_by_a_pointer_is_followed(memo: _Memo) -> None:
    """The forged-binding shape: what a check reads is chosen by the package itself (a
    pointer here), and a later generation that changes that file is checked again."""
    check = Counting()
    files = {**BASE, "elsewhere/t.txt": b"T"}
    assert run(memo, check, manifest(1, files, {"target": "elsewhere/t.txt"}))[1] == "T"
    moved = run(memo, check, manifest(2, {**files, "elsewhere/t.txt": b"T2"},
                                      {"target": "elsewhere/t.txt"}))
    assert moved[1] == "T2" and check.runs == 2
    repointed = run(memo, check, manifest(3, {**files, "other/y.txt": b"Y"},
                                          {"target": "other/y.txt"}))
    assert repointed[1] == "Y" and check.runs == 3


def test_packages_and_arguments_are_kept_apart(memo: _Memo) -> None:
    check = Counting()
    run(memo, check, manifest(1, BASE))
    run(memo, check, manifest(1, BASE, package_id="pkg-2"))
    memo.run(check, view(manifest(1, BASE)), 2)
    assert check.runs == 3


def test_a_failed_read_is_not_remembered(memo: _Memo) -> None:
    class Tolerant(Counting):
        def __call__(self, v: PackageView, revision: int) -> list[str]:
            self.runs += 1
            try:
                return [v.read("case/a.txt").decode()]
            except HistoryProblem as exc:
                return [f"unreadable: {exc}"]

    check = Tolerant()
    assert run(memo, check, manifest(1, BASE), fail=True)[0].startswith("unreadable")
    assert run(memo, check, manifest(2, BASE)) == ["A"]  # the disk is back
    assert check.runs == 2


@pytest.mark.parametrize("fail_open", ["open", "read"])
def test_a_failed_stream_is_not_remembered(memo: _Memo, fail_open: str) -> None:
    """A check that streams a file and turns a failure into a problem: neither a failed
    open nor a failed read of the stream is kept as its answer."""
    class Streaming(Counting):
        def __call__(self, v: PackageView, revision: int) -> list[str]:
            self.runs += 1
            try:
                with v.open("case/a.txt") as f:
                    f.seek(0)
                    return [f.read().decode()]
            except (HistoryProblem, VianoError) as exc:
                return [f"unreadable: {exc}"]

    check = Streaming()
    got = memo.run(check, view(manifest(1, BASE), fail_open=fail_open), 1,
                   freeze=tuple, thaw=list)
    assert got[0].startswith("unreadable")
    assert memo.run(check, view(manifest(2, BASE)), 1, freeze=tuple, thaw=list) == ["A"]
    assert memo.run(check, view(manifest(3, BASE)), 1, freeze=tuple, thaw=list) == ["A"]
    assert check.runs == 2  # the good answer is kept; the failures were not


def test_memory_is_bounded_by_what_the_records_hold(memo: _Memo,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A record over MAX_LOOKUPS is not kept (an imported package with thousands of
    inputs), and the records kept hold at most MAX_TOTAL_LOOKUPS lookups in all, the
    least recently used dropped first."""
    from engine._phases import _memo

    monkeypatch.setattr(_memo, "MAX_LOOKUPS", 20)
    monkeypatch.setattr(_memo, "MAX_TOTAL_LOOKUPS", 12)  # two records of this check's 5
    check = Counting()
    many = {**BASE, **{f"inputs/{i:03d}.txt": b"i" for i in range(30)}}
    run(memo, check, manifest(1, many))
    run(memo, check, manifest(2, many))
    assert check.runs == 2 and memo._lookups == 0  # too big to keep
    run(memo, check, manifest(1, BASE, package_id="p-a"))
    run(memo, check, manifest(1, BASE, package_id="p-b"))
    run(memo, check, manifest(2, BASE, package_id="p-a"))  # a hit: p-a is the newest now
    assert check.runs == 4
    run(memo, check, manifest(1, BASE, package_id="p-c"))  # over the bound: p-b goes
    assert 0 < memo._lookups <= 12
    run(memo, check, manifest(3, BASE, package_id="p-a"))
    assert check.runs == 5  # p-a was kept
    run(memo, check, manifest(2, BASE, package_id="p-b"))
    assert check.runs == 6  # p-b was dropped


def test_a_check_that_lists_every_file_is_not_remembered(memo: _Memo) -> None:
    class Lister(Counting):
        def __call__(self, v: PackageView, revision: int) -> list[str]:
            self.runs += 1
            return sorted(v.manifest.files)

    check = Lister()
    run(memo, check, manifest(1, BASE))
    assert run(memo, check, manifest(2, {**BASE, "z": b"z"}))[-1] == "z"
    assert check.runs == 2


def test_the_caller_cannot_change_what_is_kept(memo: _Memo) -> None:
    check = Counting()
    run(memo, check, manifest(1, BASE)).append("mine")
    assert run(memo, check, manifest(2, BASE)) == ["A", "inputs/r.txt", "C-1"]


def test_the_interpretation_check_is_remembered_through_the_pipeline() -> None:
    """interpretation_problems goes through the module memo: the hypotheses phase's steps
    ask it of generations that changed nothing it reads, and get the kept answer."""
    from engine._phases import _interpretation
    from engine._phases._memo import MEMO

    assert _interpretation.interpretation_problems.__code__.co_names.count(
        "remembered_problems") == 1
    check = Counting()
    hits = MEMO.hits
    MEMO.run(check, view(manifest(1, BASE, package_id="pkg-memo")), 1)
    MEMO.run(check, view(manifest(2, BASE, package_id="pkg-memo")), 1)
    assert MEMO.hits == hits + 1 and check.runs == 1
