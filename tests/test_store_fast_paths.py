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


def test_a_str_subclass_is_checked_as_its_text() -> None:
    class Sneaky(str):
        def __eq__(self, other: object) -> bool:  # equal to a remembered valid path
            return True

        def __hash__(self) -> int:
            return hash("work/ok.txt")

    validate_logical_path("work/ok.txt")
    with pytest.raises(ChangeRejected):
        validate_logical_path(Sneaky("../etc/passwd"))
    with pytest.raises(ChangeRejected):
        validate_logical_path(7)  # type: ignore[arg-type]


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
