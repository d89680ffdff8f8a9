"""Export → import into another store under another name: full history, identical hashes."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
import trio

from actors import open_store
from engine import BytesSource, Change, PublishRequest
from tests.conftest import VIANO, Cli, child_env, paused_child, run_viano, snapshot
from tests.store_helpers import open_ro

pytestmark = pytest.mark.usefixtures("backend")


def _intake_and_advance(cli: Cli, sample: Path, store: Path) -> None:
    r = cli("intake", "--store", store, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}",
            "--attach", f"source={sample / 'wowsrc.zip'}")
    assert r.code == 0, r.err

    async def advance() -> None:
        async with open_store(store, inline_threshold=512) as handle:
            ref = await handle.case("BUG-20")
            for gen in range(ref.generation, ref.generation + 2):
                # Files only: a phase changes only by entering it (its policy written),
                # which verify and import hold a case that intake made to.
                await handle.publish(PublishRequest(ref.package_id, "BUG-20", gen, Change(
                    files={f"analysis/x/{gen}.json": BytesSource.of(b"[1]" * 400 * gen)})))

    trio.run(advance)


def _history(store: Path) -> list[tuple[int, str, bytes]]:
    s = open_ro(store)
    ref = s.case("BUG-20")
    rows = [(r.generation, r.manifest_sha256, bytes(r.manifest)) for r in
            s.generations(ref.package_id)]
    s.close()
    return rows


class TestRoundTrip:
    def test_export_import_renamed_everything(self, cli: Cli, sample: Path,
                                              tmp_path: Path) -> None:
        """History, manifests and blob bytes are identical after a round trip through a
        renamed zip into a store at another path; verify passes."""
        a = tmp_path / "store-a"
        _intake_and_advance(cli, sample, a)
        exported = tmp_path / "out.zip"
        r = cli("export", "--json", "--store", a, "BUG-20", exported)
        assert r.code == 0, r.err
        renamed = tmp_path / "something-else.bin"
        shutil.move(exported, renamed)
        b = tmp_path / "elsewhere" / "store-b"
        r = cli("import", "--json", "--store", b, renamed)
        assert r.code == 0, r.err
        assert r.json["package_generation"] == 3  # type: ignore[index]
        assert _history(a) == _history(b)
        assert cli("verify", "--store", b).code == 0
        for path in ("inputs/wowdiag.zip", "inputs/report.json", "analysis/x/2.json"):
            one = cli("cat", "--json", "--store", a, "BUG-20", path).json
            two = cli("cat", "--json", "--store", b, "BUG-20", path).json
            assert one == two and ("text" in one or "base64" in one)  # type: ignore[operator]

    def test_reimport_is_idempotent_and_fast_forwards(self, cli: Cli, sample: Path,
                                                      tmp_path: Path) -> None:
        """Importing the same export twice is a no-op; a longer history fast-forwards."""
        a, b = tmp_path / "a", tmp_path / "b"
        cli("intake", "--store", a, "--report", sample / "report.json")
        cli("export", "--store", a, "BUG-20", tmp_path / "one.zip")
        assert cli("import", "--store", b, tmp_path / "one.zip").code == 0
        assert cli("import", "--store", b, tmp_path / "one.zip").code == 0
        _intake_and_advance_existing(a)
        cli("export", "--store", a, "BUG-20", tmp_path / "three.zip")
        assert cli("import", "--store", b, tmp_path / "three.zip").code == 0
        assert _history(a) == _history(b)

    def test_diverged_history_refused(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """A different package of the same case id is refused, nothing written."""
        a, b = tmp_path / "a", tmp_path / "b"
        cli("intake", "--store", a, "--report", sample / "report.json")
        cli("intake", "--store", b, "--report", sample / "report.json")
        cli("export", "--store", a, "BUG-20", tmp_path / "a.zip")
        before = _history(b)
        r = cli("import", "--json", "--store", b, tmp_path / "a.zip")
        assert r.code == 2
        assert r.json["error"]["reason"] == "case_exists"  # type: ignore[index]
        assert _history(b) == before


class TestExportDestinations:
    """An export never overwrites what it should not, and a bad destination is a refusal
    (exit 2) with nothing written."""

    @pytest.fixture
    def store(self, cli: Cli, sample: Path, tmp_path: Path) -> Path:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        return store

    def test_an_existing_file_needs_force(self, cli: Cli, store: Path, tmp_path: Path) -> None:
        dest = tmp_path / "mine.zip"
        dest.write_bytes(b"precious")
        r = cli("export", "--json", "--store", store, "BUG-20", dest)
        assert r.code == 2 and r.json["error"]["reason"] == "destination_exists"  # type: ignore[index]
        assert dest.read_bytes() == b"precious"
        assert cli("export", "--store", store, "BUG-20", dest, "--force").code == 0
        assert zipfile.is_zipfile(dest)

    @pytest.mark.parametrize("inside", ["store.sqlite3", "store-id", "blobs/x.zip",
                                        "new.zip", "."])
    def test_a_path_inside_the_store_is_always_refused(self, cli: Cli, store: Path,
                                                       inside: str) -> None:
        before = snapshot(store)
        for force in ([], ["--force"]):
            r = cli("export", "--json", "--store", store, "BUG-20", store / inside, *force)
            assert r.code == 2, (inside, r.out)
            assert r.json["error"]["reason"] == "destination_in_store"  # type: ignore[index]
        assert snapshot(store) == before

    def test_a_symlink_into_the_store_is_refused(self, cli: Cli, store: Path,
                                                 tmp_path: Path) -> None:
        link = tmp_path / "innocent.zip"
        link.symlink_to(store / "store.sqlite3")
        before = snapshot(store)
        r = cli("export", "--json", "--store", store, "BUG-20", link, "--force")
        assert r.json["error"]["reason"] == "destination_in_store"  # type: ignore[index]
        assert snapshot(store) == before

    def test_a_directory_or_a_missing_folder_is_a_refusal(self, cli: Cli, store: Path,
                                                          tmp_path: Path) -> None:
        for dest in (tmp_path, tmp_path / "no" / "such" / "folder.zip"):
            r = cli("export", "--json", "--store", store, "BUG-20", dest)
            assert r.code == 2, r.out
            assert r.json["error"]["reason"] == "destination_invalid"  # type: ignore[index]
        assert not (tmp_path / "no").exists()

    def test_no_temporary_file_is_left_behind(self, cli: Cli, store: Path,
                                              tmp_path: Path) -> None:
        out = tmp_path / "out"
        out.mkdir()
        assert cli("export", "--store", store, "BUG-20", out / "a.zip").code == 0
        assert sorted(p.name for p in out.iterdir()) == ["a.zip"]


def _intake_and_advance_existing(store: Path) -> None:
    async def advance() -> None:
        async with open_store(store) as handle:
            ref = await handle.case("BUG-20")
            for gen in (1, 2):
                await handle.publish(PublishRequest(ref.package_id, "BUG-20", gen, Change(
                    files={f"n/{gen}": BytesSource.of(b"n")})))

    trio.run(advance)


def _rewrite(src: Path, dest: Path, edit: dict[str, bytes | None]) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for name in zin.namelist():
            data = edit.get(name, zin.read(name))
            if data is not None:
                zout.writestr(name, data)
    return dest


class TestAKilledExport:
    """An export killed mid-write leaves its temporary file beside the destination, outside
    any store (gc cannot see it). The next export into that folder removes such a file once
    it has no writer (an export holds an flock on it until its rename: whatever process,
    PID namespace or host holds it) and has not changed for ABANDONED_AFTER_S. A live
    export's file, a fresh one, a link and anything not named as ours stay."""

    def test_the_next_export_removes_what_a_killed_one_left(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        import os
        import time

        from engine._portable import ABANDONED_AFTER_S

        store, out = tmp_path / "s", tmp_path / "out"
        out.mkdir()
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        r = run_viano("export", "--store", store, "BUG-20", out / "a.zip",
                      env=child_env(VIANO_CRASH_AT="export.written"))
        assert r.returncode == 137, r.stderr
        [left] = list(out.iterdir())
        assert left.name.startswith(".viano-export-"), left
        # Just killed: it could still be a writer's (the mtime says it changed just now).
        assert cli("export", "--store", store, "BUG-20", out / "b.zip").code == 0
        assert sorted(p.name for p in out.iterdir()) == sorted([left.name, "b.zip"])
        then = time.time() - 2 * ABANDONED_AFTER_S
        os.utime(left, (then, then))
        assert cli("export", "--store", store, "BUG-20", out / "c.zip").code == 0
        assert sorted(p.name for p in out.iterdir()) == ["b.zip", "c.zip"]
        assert cli("import", "--store", tmp_path / "t", out / "c.zip").code == 0

    def test_a_live_exports_file_is_kept_however_old(self, cli: Cli, sample: Path,
                                                      tmp_path: Path) -> None:
        """A real export paused just before its rename holds its file's lock: another export
        into the folder keeps that file even when its mtime is far past the age limit, and
        the first then completes."""
        import os
        import time

        from engine._portable import ABANDONED_AFTER_S

        store, out = tmp_path / "s", tmp_path / "out"
        out.mkdir()
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        argv = [*VIANO, "export", "--store", str(store), "BUG-20", str(out / "a.zip")]
        with paused_child(argv, "export.written", tmp_path / "paused") as first:
            [live] = list(out.iterdir())
            then = time.time() - 2 * ABANDONED_AFTER_S
            os.utime(live, (then, then))
            assert cli("export", "--store", store, "BUG-20", out / "b.zip").code == 0
            assert live.exists()
            _out, err = first.resume()
        assert first.returncode == 0, err
        assert sorted(p.name for p in out.iterdir()) == ["a.zip", "b.zip"]

    def test_only_files_without_a_writer_are_removed(self, cli: Cli, sample: Path,
                                                     tmp_path: Path) -> None:
        import fcntl
        import os
        import time

        from engine._portable import ABANDONED_AFTER_S

        store, out = tmp_path / "s", tmp_path / "out"
        out.mkdir()
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        old = 2 * ABANDONED_AFTER_S
        files = {
            ".viano-export-101-0000dead.tmp": (old, False),   # no writer, unchanged: removed
            ".viano-export-102-00f2e5b0.tmp": (0, True),      # no writer yet, fresh: kept
            ".viano-export-103-00a11be0.tmp": (old, True),    # a writer holds it: kept
            ".viano-export-notes.tmp": (old, True),           # not named as ours: kept
            "mine.txt": (old, True),                          # a user's file
        }
        from engine._portable import _TMP_NAME

        for name, (age, _kept) in files.items():
            # The names that should be ours are (else the test proves nothing about them).
            assert bool(_TMP_NAME.fullmatch(name)) == name.startswith(".viano-export-1"), name
            (out / name).write_bytes(b"partial")
            then = time.time() - age
            os.utime(out / name, (then, then))
        link = out / ".viano-export-104-0000119c.tmp"
        link.symlink_to(out / "mine.txt")  # named as ours, but a link: never followed
        os.utime(link, (time.time() - old,) * 2, follow_symlinks=False)
        # The writer: another open file description holding the flock, as an export in
        # another process, PID namespace or host would (the pid in the name says nothing).
        with open(out / ".viano-export-103-00a11be0.tmp", "rb") as writer:
            fcntl.flock(writer.fileno(), fcntl.LOCK_EX)
            assert cli("export", "--store", store, "BUG-20", out / "b.zip").code == 0
        kept = {n for n, (_age, k) in files.items() if k}
        assert {p.name for p in out.iterdir()} == kept | {link.name, "b.zip"}
        assert (out / "mine.txt").read_bytes() == b"partial"


class TestTamperedExports:
    def test_each_tampering_is_refused(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """Changed blobs, manifests, indexes and missing members are refused; nothing written."""
        a = tmp_path / "a"
        cli("intake", "--store", a, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
        good = tmp_path / "good.zip"
        cli("export", "--store", a, "BUG-20", good)
        with zipfile.ZipFile(good) as zf:
            names = zf.namelist()
            index = json.loads(zf.read("viano-export.json"))
            manifest = json.loads(zf.read("manifests/000001.json"))
        blob = next(n for n in names if n.startswith("blobs/"))
        bad_manifest = dict(manifest, case_id="OTHER")
        cases = {
            "blob changed": {blob: b"tampered"},
            "blob missing": {blob: None},
            "manifest changed": {"manifests/000001.json":
                                 json.dumps(bad_manifest).encode()},
            "index wrong format": {"viano-export.json":
                                   json.dumps(dict(index, format="x")).encode()},
            "index bad case id": {"viano-export.json":
                                  json.dumps(dict(index, case_id="../x")).encode()},
            "extra member": {"extra/evil.sh": b"rm -rf /"},
        }
        for label, edit in cases.items():
            src = _rewrite(good, tmp_path / f"{label}.zip", edit)
            if label == "extra member":
                with zipfile.ZipFile(src, "a") as zf:
                    zf.writestr("extra/evil.sh", b"rm -rf /")
            store = tmp_path / f"target-{len(label)}-{label[:4]}"
            r = cli("import", "--json", "--store", store, src)
            assert r.code == 2, (label, r.out)
            assert r.json["error"]["reason"] == "invalid_export", (label, r.json)  # type: ignore[index]
            assert not store.exists(), label
