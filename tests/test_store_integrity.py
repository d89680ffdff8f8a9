"""No path loses or corrupts data: inputs that change while they are stored, duplicates
over damaged blobs, gc racing a publication in another process, and one bad request in a
group commit."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from actors import open_store
from engine import (
    Attachment,
    BytesSource,
    Change,
    FileSource,
    InputRejected,
    IntakeLimits,
    Published,
    PublishRequest,
    StorageError,
    new_package_id,
    prepare_intake,
    read_export,
    verify_store,
)
from tests.conftest import PYTHON, Cli, paused_child, snapshot
from tests.store_helpers import create, open_ro, open_rw, sql

pytestmark = pytest.mark.usefixtures("backend")

Mutation = Callable[[Path], None]
MUTATIONS: dict[str, Mutation] = {
    "one byte flipped": lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1])
                                                + p.read_bytes()[1:]),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-1]),
    "grown": lambda p: p.write_bytes(p.read_bytes() + b"!"),
    "same size, other bytes": lambda p: p.write_bytes(os.urandom(p.stat().st_size)),
    "deleted": lambda p: p.unlink(),
}


def _report(tmp: Path) -> Path:
    r = tmp / "report.txt"
    r.write_text("Crash on save\nThe editor crashes when saving.\n")
    return r


async def _publish(root: Path, plan: object) -> Published:
    async with open_store(root) as store:
        return await store.intake(plan)  # type: ignore[arg-type]


class TestInputsThatChange:
    """A file that changes between validation and commit is refused (input_changed),
    nothing is written, and the genuine bytes can be taken in afterwards."""

    @pytest.mark.parametrize("size", [1_000, 400_000], ids=["inline", "file"])
    @pytest.mark.parametrize("mutation", sorted(MUTATIONS))
    def test_attachment_changed_after_validation(self, tmp_path: Path, cli: Cli, size: int,
                                                 mutation: str) -> None:
        root = tmp_path / "store"
        other = tmp_path / "other.txt"
        other.write_text("x\n")
        assert cli("intake", "--store", root, "--report", other, "--case-id", "OLD-1").code == 0
        genuine = os.urandom(size)
        att = tmp_path / "diag.bin"
        att.write_bytes(genuine)
        plan = prepare_intake(_report(tmp_path), [Attachment("attachment", att)],
                              case_id="CH-1", limits=IntakeLimits())
        MUTATIONS[mutation](att)
        before = snapshot(root)
        with pytest.raises(InputRejected) as info:
            trio.run(_publish, root, plan)
        assert info.value.reason in ("input_changed", "unreadable_input"), info.value
        after = snapshot(root)
        assert {k: v for k, v in after.items() if "blobs/tmp" not in k} == before
        # The genuine bytes go in afterwards, and are what is served.
        att.write_bytes(genuine)
        assert cli("intake", "--store", root, "--report", _report(tmp_path), "--case-id",
                   "CH-1", "--attach", att).code == 0
        got = cli("cat", "--store", root, "CH-1", "inputs/diag.bin", "--json").json
        assert isinstance(got, dict) and got["size"] == size
        store = open_ro(root)
        assert store.read_blob(got["sha256"]) == genuine
        assert verify_store(store).ok
        store.close()

    def test_report_changed_after_validation_is_stored_as_validated(
            self, tmp_path: Path) -> None:
        """The report's bytes are read once, into the plan: what is stored is exactly what
        was parsed into the catalogue, whatever the file does afterwards."""
        report = _report(tmp_path)
        plan = prepare_intake(report, [], case_id="R-1", limits=IntakeLimits())
        report.write_text("something else entirely\n")
        published = trio.run(_publish, tmp_path / "store", plan)
        store = open_ro(tmp_path / "store")
        entry = published.manifest.files["inputs/report.txt"]
        assert store.read_blob(entry.sha256) == b"Crash on save\nThe editor crashes when saving.\n"
        store.close()

    def test_import_blob_changed_after_validation(self, cli: Cli, sample: Path,
                                                  tmp_path: Path) -> None:
        """An export rewritten between its validation and its commit is refused."""
        a = tmp_path / "a"
        assert cli("intake", "--store", a, "--report", sample / "report.json").code == 0
        exported = tmp_path / "x.zip"
        assert cli("export", "--store", a, "BUG-20", exported).code == 0
        request = read_export(exported, IntakeLimits())
        with zipfile.ZipFile(exported) as zin:
            members = {n: zin.read(n) for n in zin.namelist()}
        blob = next(n for n in members if n.startswith("blobs/"))
        members[blob] = members[blob][::-1]
        with zipfile.ZipFile(exported, "w") as zout:
            for name, data in members.items():
                zout.writestr(name, data)

        async def go() -> None:
            async with open_store(tmp_path / "b") as store:
                await store.import_package(request)

        with pytest.raises(InputRejected) as info:
            trio.run(go)
        assert info.value.reason == "input_changed"
        check = open_ro(tmp_path / "b")
        assert check.list_cases() == []
        check.close()


def _published(store: object, case: str, payload: bytes) -> str:
    """The sha256 of ``payload``, published as a new case's ``inputs/a.bin``."""
    out = store.commit_batch([create(case, payload)])[0]  # type: ignore[attr-defined]
    assert isinstance(out, Published)
    return out.manifest.files["inputs/a.bin"].sha256


class TestDuplicatesOverDamage:
    def test_a_damaged_inline_row_is_healed_by_the_genuine_bytes(self, tmp_path: Path) -> None:
        """If an inline blob's row was damaged, a later publication of the same content
        stores the verified bytes over it instead of keeping the damage forever."""
        root = tmp_path / "s"
        store = open_rw(root)
        payload = b"evidence " * 100
        sha = _published(store, "A-1", payload)
        store.close()
        sql(root, "UPDATE blobs SET data = CAST('damaged' AS BLOB) WHERE sha256 = ?",
            bytes.fromhex(sha))
        check = open_ro(root)
        assert not verify_store(check).ok
        check.close()
        store = open_rw(root)
        assert isinstance(store.commit_batch([create("A-2", payload)])[0], Published)
        assert store.read_blob(sha) == payload
        assert verify_store(store).ok
        store.close()

    def test_a_damaged_blob_file_is_replaced_on_reuse(self, tmp_path: Path) -> None:
        """A blob file whose bytes no longer match its name is rewritten when a
        publication needs that content again."""
        root = tmp_path / "s"
        store = open_rw(root)
        payload = os.urandom(300_000)
        path = store.blob_files.path_for(_published(store, "F-1", payload))
        path.write_bytes(b"x" * len(payload))
        assert isinstance(store.commit_batch([create("F-2", payload)])[0], Published)
        assert path.read_bytes() == payload
        assert verify_store(store).ok
        store.close()


class TestDamagedBlobsAreNeverServed:
    """A blob's bytes are checked against its name on every read: whole (``read_blob``,
    which hashes an inline row's bytes in one call) and as a stream (``open_blob``, which
    checks at the end), from an inline row and from a blob file, same size or not."""

    @pytest.mark.parametrize("damage", [b"damaged", b"x" * 900])
    def test_an_inline_row(self, tmp_path: Path, damage: bytes) -> None:
        root = tmp_path / "s"
        store = open_rw(root)
        payload = b"evidence " * 100
        sha = _published(store, "A-1", payload)
        assert store.read_blob(sha) == payload
        store.close()
        sql(root, "UPDATE blobs SET data = ? WHERE sha256 = ?", damage, bytes.fromhex(sha))
        self._refused(open_ro(root), sha)

    @pytest.mark.parametrize("damage", ["same size", "shorter", "longer"])
    def test_a_blob_file(self, tmp_path: Path, damage: str) -> None:
        root = tmp_path / "s"
        store = open_rw(root)
        payload = os.urandom(300_000)
        sha = _published(store, "F-1", payload)
        assert store.read_blob(sha) == payload
        path = store.blob_files.path_for(sha)
        store.close()
        size = {"same size": len(payload), "shorter": 10, "longer": len(payload) + 1}[damage]
        path.write_bytes(b"x" * size)
        self._refused(open_ro(root), sha)

    @staticmethod
    def _refused(store: object, sha: str) -> None:
        try:
            with pytest.raises(StorageError) as whole:
                store.read_blob(sha)  # type: ignore[attr-defined]
            assert whole.value.reason == "store_corrupt"
            with pytest.raises(StorageError) as streamed, \
                    store.open_blob(sha) as f:  # type: ignore[attr-defined]
                while f.read(4096):
                    pass
            assert streamed.value.reason == "store_corrupt"
        finally:
            store.close()  # type: ignore[attr-defined]


GC_CHILD = """
import sys, trio
from pathlib import Path
from actors import open_store
from engine import Change, FileSource, PublishRequest, new_package_id

async def main(root, path):
    async with open_store(root) as store:
        out = await store.publish(PublishRequest(new_package_id(), "GC-1", None, Change(
            files={"inputs/big.bin": FileSource.of(Path(path))}, phase="INTAKE")))
        print("committed", out.generation, flush=True)

trio.run(main, sys.argv[1], sys.argv[2])
"""


class TestGcAgainstAConcurrentReuse:
    def test_gc_between_blob_write_and_commit_never_loses_the_blob(
            self, tmp_path: Path, cli: Cli) -> None:
        """A crash left an orphan blob file; an intake in another process reuses it and is
        paused between its blob step and its transaction while `viano gc --min-age 0`
        removes the orphan; the intake then commits and the blob is there."""
        root = tmp_path / "s"
        store = open_rw(root)
        data = os.urandom(400_000)
        orphan = FileSource.of(_write(tmp_path / "big.bin", data))
        store.blob_files.write(orphan)  # as a crashed publication would leave it
        old = 1_000_000_000
        os.utime(store.blob_files.path_for(orphan.sha256), (old, old))
        store.close()
        argv = [PYTHON, "-c", GC_CHILD, str(root), str(tmp_path / "big.bin")]
        with paused_child(argv, "batch.blobs_ready", tmp_path / "paused") as child:
            r = cli("gc", "--store", root, "--min-age", "0", "--json")
            assert r.code == 0, r.err
            assert r.json["removed_files"] == 1  # type: ignore[index]
            assert not (root / "blobs" / "sha256" / orphan.sha256[:2] / orphan.sha256).exists()
            out, err = child.resume()  # let the intake go on
        assert child.returncode == 0, err
        assert "committed 1" in out
        check = open_ro(root)
        report = verify_store(check)
        assert report.ok, report.violations
        assert check.read_blob(orphan.sha256) == data
        check.close()

    def test_gc_never_removes_a_temporary_file_being_written(self, tmp_path: Path) -> None:
        """A temporary blob file whose writer holds its lock is left alone by gc."""
        import fcntl

        from engine import collect_garbage

        store = open_rw(tmp_path / "s")
        store.commit_batch([create("T-1")])
        tmp_dir = tmp_path / "s" / "blobs" / "tmp"
        tmp_dir.mkdir(parents=True)
        busy, abandoned = tmp_dir / "busy.part", tmp_dir / "abandoned.part"
        busy.write_bytes(b"half")
        abandoned.write_bytes(b"half")
        with busy.open("rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            report = collect_garbage(store, min_age_s=0)
        assert report.removed_temporary == 1
        assert busy.exists() and not abandoned.exists()
        store.close()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class TestOneBadRequestInABatch:
    def test_a_bug_while_planning_one_request_fails_only_that_request(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """An unexpected exception while planning one request of a batch refuses that
        request alone, as an internal error; the others commit."""
        import engine._store._plan as plan

        real = plan.build_manifest

        def sometimes_broken(parent, package_id, case_id, change, now):  # type: ignore[no-untyped-def]
            if case_id == "BAD-1":
                raise KeyError("a bug")
            return real(parent, package_id, case_id, change, now)

        monkeypatch.setattr(plan, "build_manifest", sometimes_broken)
        store = open_rw(tmp_path / "s")
        outs = store.commit_batch([create("OK-1"), create("BAD-1"), create("OK-2")])
        assert isinstance(outs[0], Published) and isinstance(outs[2], Published)
        assert isinstance(outs[1], StorageError) and outs[1].reason == "internal_error"
        assert sorted(r.case_id for r in store.list_cases()) == ["OK-1", "OK-2"]
        store.close()

    def test_refusals_of_every_kind_in_one_batch(self, tmp_path: Path) -> None:
        """A stale parent, an existing case, a changed input and a write-once replacement
        in one batch beside good requests: each bad one is refused on its own reason."""
        root = tmp_path / "s"
        store = open_rw(root)
        first = store.commit_batch([create("E-1")])[0]
        assert isinstance(first, Published)
        changed = tmp_path / "changing.bin"
        changed.write_bytes(b"before")
        src = FileSource.of(changed)
        changed.write_bytes(b"after!")
        requests = [
            create("G-1"),
            PublishRequest(first.package_id, "E-1", 7, Change()),                   # stale
            create("E-1"),                                                         # exists
            PublishRequest(new_package_id(), "C-1", None, Change(
                files={"inputs/c.bin": src}, phase="INTAKE")),                     # changed
            PublishRequest(first.package_id, "E-1", 1, Change(
                files={"inputs/a.bin": BytesSource.of(b"replaced")})),             # write-once
            create("G-2"),
        ]
        outs = store.commit_batch(requests)
        reasons = [getattr(o, "reason", "ok") for o in outs]
        assert reasons == ["ok", "stale_generation", "case_exists", "input_changed",
                           "invalid_change", "ok"]
        assert sorted(r.case_id for r in store.list_cases()) == ["E-1", "G-1", "G-2"]
        assert store.case("E-1").generation == 1
        assert verify_store(store).ok
        store.close()
