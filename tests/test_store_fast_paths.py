"""The publication fast paths keep every rule: what is remembered, shared or copied to save
CPU (bench/store.py) never lets a bad value through or changes a stored byte."""

from __future__ import annotations

import subprocess

import pytest

from engine import BytesSource, Change, ChangeRejected, Manifest, build_manifest
from engine._store._common import ref_from_row, status_problem
from engine._store._manifest import validate_logical_path
from tests.conftest import PYTHON, child_env

pytestmark = pytest.mark.no_store
NOW = "2026-12-01T00:00:00.000001Z"


def _row(round_: object, status: object = "RUNNING") -> tuple[object, ...]:
    return ("C-1", "pkg", 3, "INTERPRETATION", 1, NOW, status, "INTERPRETATION", "ok",
            round_, 3, None, "a-1", 1)


def test_a_damaged_status_row_is_named_even_after_an_equal_good_one() -> None:
    """Statuses read from the index are shared between equal rows; 1.0 equals 1, so the
    sharing must tell the types apart or verify stops seeing a damaged round."""
    good = ref_from_row(_row(1)).status
    assert good is not None and status_problem(good) is None
    damaged = ref_from_row(_row(1.0)).status
    assert damaged is not None and status_problem(damaged) is not None
    again = ref_from_row(_row(1)).status
    assert again is good  # the same values: one shared, immutable status


def test_a_refused_path_is_refused_every_time() -> None:
    for _ in range(3):
        with pytest.raises(ChangeRejected):
            validate_logical_path("work/../escape")
        with pytest.raises(ChangeRejected):
            Change(files={"a/\x1b[31m": BytesSource.of(b"x")})
    assert validate_logical_path("work/ok.txt") == "work/ok.txt"


def test_only_exact_strings_are_paths() -> None:
    """A str subclass could answer the checks as it likes (``__str__``, ``split``,
    ``__eq__`` and ``__hash__`` against a remembered path): it is refused, as other types."""
    class Sneaky(str):
        def __str__(self) -> str:
            return "work/ok.txt"

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("work/ok.txt")

    validate_logical_path("work/ok.txt")
    for bad in (Sneaky("../etc/passwd"), Sneaky("work/ok.txt"), 7, b"work/ok.txt", None):
        with pytest.raises(ChangeRejected):
            validate_logical_path(bad)  # type: ignore[arg-type]


def test_long_paths_are_checked_every_time_and_not_kept() -> None:
    from engine._store._manifest import _remembered_check

    before = _remembered_check.cache_info().currsize
    long_path = "work/" + "x" * 900
    assert validate_logical_path(long_path) == long_path
    with pytest.raises(ChangeRejected):
        validate_logical_path("work/" + "x" * 1100)  # over the 1024 limit
    assert _remembered_check.cache_info().currsize == before


def test_a_status_with_long_text_is_not_kept() -> None:
    from engine._store._common import _shared_status

    before = _shared_status.cache_info().currsize
    status = ref_from_row(_row(1, status="X" * 5000)).status
    assert status is not None and status_problem(status) is not None
    assert _shared_status.cache_info().currsize == before


def test_an_evolved_manifest_encodes_its_own_files() -> None:
    """The fast file list is derived from ``files``: a manifest made another way
    (``attrs.evolve``, the public constructor) encodes what its ``files`` hold."""
    import attrs

    from engine import FileEntry

    parent = build_manifest(None, "pkg-1", "C-1", Change(
        files={"work/a": BytesSource.of(b"a")}, phase="INTAKE"), NOW)
    b = BytesSource.of(b"b")
    evolved = attrs.evolve(parent, files={**parent.files, "work/b": FileEntry(b.sha256, 1)})
    child = build_manifest(evolved, "pkg-1", "C-1", Change(
        files={"work/c": BytesSource.of(b"c")}, pointers={"latest": "work/b"}), NOW)
    parsed = Manifest.parse(child.raw, child.sha256)
    assert set(parsed.files) == {"work/a", "work/b", "work/c"} == set(child.files)
    assert set(evolved.to_json()["files"]) == {"work/a", "work/b"}
    again = Manifest(package_id="pkg-1", case_id="C-1", package_generation=1,
                     parent_generation=None, analysis_revision=1, phase="INTAKE",
                     created_at=NOW, pointers={}, files=dict(parent.files), raw=parent.raw,
                     sha256=parent.sha256)
    assert again.to_json() == parent.to_json()


def test_manifests_built_on_parents_are_byte_identical_to_their_parse() -> None:
    """A child's file list is copied from its parent's encoded form: its bytes are the
    canonical bytes of its content, and parsing them gives the same manifest."""
    parent = build_manifest(None, "pkg-1", "C-1", Change(
        files={f"inputs/{i}.txt": BytesSource.of(b"%d" % i) for i in range(5)},
        phase="INTAKE"), NOW)
    child = build_manifest(parent, "pkg-1", "C-1", Change(
        files={"work/new.bin": BytesSource.of(b"new"), "work/0.bin": BytesSource.of(b"0")},
        pointers={"latest": "work/new.bin"}), NOW)
    grandchild = build_manifest(child, "pkg-1", "C-1", Change(
        files={"work/new.bin": BytesSource.of(b"replaced")}), NOW)
    for m in (parent, child, grandchild):
        parsed = Manifest.parse(m.raw, m.sha256)
        assert parsed == m and parsed.to_json() == m.to_json()
    assert set(parent.files) < set(child.files)
    assert parent.files["inputs/0.txt"] == child.files["inputs/0.txt"]
    assert grandchild.files["work/new.bin"].sha256 == BytesSource.of(b"replaced").sha256
    assert child.files["work/new.bin"].sha256 == BytesSource.of(b"new").sha256  # unchanged
    assert "work/new.bin" not in parent.to_json()["files"]


def test_a_write_once_file_still_cannot_be_replaced() -> None:
    parent = build_manifest(None, "pkg-1", "C-1", Change(
        files={"inputs/report.json": BytesSource.of(b"{}")}, phase="INTAKE"), NOW)
    with pytest.raises(ChangeRejected, match="write-once"):
        build_manifest(parent, "pkg-1", "C-1", Change(
            files={"inputs/report.json": BytesSource.of(b"[]")}), NOW)
    same = build_manifest(parent, "pkg-1", "C-1", Change(
        files={"inputs/report.json": BytesSource.of(b"{}")}), NOW)
    assert same.files == parent.files


def test_the_viano_process_freezes_its_start_and_collects_the_young_less_often() -> None:
    """The console entry point applies ``tune_collector`` (bench/store.py measured 15-28 us
    of collector time per publication without it); ``main`` alone, as embedders and the
    in-process tests call it, leaves the process's collector alone."""
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print(gc.get_freeze_count(), gc.get_threshold()[0],"
             " file=sys.stderr))\n"
             "from viano_bug_analysis.cli import {}\n{}\n")
    ran = subprocess.run([PYTHON, "-c", probe.format("run", "run()"), "--help"],
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    frozen, young = (int(x) for x in ran.stderr.split())
    assert frozen > 10_000 and young >= 5000
    plain = subprocess.run([PYTHON, "-c", probe.format("main", "main(['--help'])")],
                           env=child_env(), capture_output=True, text=True, timeout=60)
    frozen, young = (int(x) for x in plain.stderr.split())
    assert frozen == 0 and young == 700
