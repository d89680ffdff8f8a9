"""Malicious or broken reports and archives: each is refused with its reason code, the
CLI exits 2, and the store is byte-for-byte what it was (no package, no blob, no row)."""

from __future__ import annotations

import json
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import archives as A
from tests.conftest import Cli, snapshot

pytestmark = pytest.mark.usefixtures("backend")

LIMITS = """
[intake.limits]
max_members = 50
max_member_bytes = 100000
max_total_bytes = 200000
max_compression_ratio = 50
"""

Builder = Callable[[Path], Path]


def _report(tmp: Path) -> Path:
    p = tmp / "report.json"
    p.write_text(json.dumps({"title": "t", "body": "b"}))
    return p


ARCHIVES: dict[str, tuple[str, Builder]] = {
    "absolute path": ("unsafe_archive_member",
                      lambda p: A.zip_with(p, [("/etc/passwd", b"root")])),
    "parent traversal": ("unsafe_archive_member",
                         lambda p: A.zip_with(p, [("logs/../../evil.sh", b"x")])),
    "drive letter": ("unsafe_archive_member",
                     lambda p: A.zip_with(p, [("C:/Windows/evil.dll", b"x")])),
    "backslash path": ("unsafe_archive_member",
                       lambda p: A.zip_with(p, [("..\\..\\evil.bat", b"x")])),
    "empty segment": ("unsafe_archive_member",
                      lambda p: A.zip_with(p, [("logs//a.log", b"x")])),
    "control character": ("unsafe_archive_member",
                          lambda p: A.zip_with(p, [("log\x1b[31m.txt", b"x")])),
    "NUL in a name (zipfile cut it short)": ("unsafe_archive_member", A.zip_nul_name),
    "duplicate after NFC, UTF-8 unflagged (Info-ZIP)": ("duplicate_archive_member", lambda p:
        A.zip_utf8_unflagged(p, ["caf\u00e9.log".encode(), "cafe\u0301.log".encode()])),
    "tar name that is not UTF-8": ("unsafe_archive_member", lambda p: A.tar_with(
        p, [("log\udce9.txt", b"hello\n")])),
    "symlink": ("unsafe_archive_member", lambda p: A.zip_symlink(p, "link", "/etc/shadow")),
    "fifo": ("unsafe_archive_member", lambda p: A.zip_special(p, "pipe", stat.S_IFIFO)),
    "char device": ("unsafe_archive_member",
                    lambda p: A.zip_special(p, "dev/null", stat.S_IFCHR)),
    "duplicate name": ("duplicate_archive_member", lambda p: A.zip_duplicate(p, "a.log")),
    "duplicate after NFC": ("duplicate_archive_member", lambda p: A.zip_with(
        p, [("caf\u00e9.log", b"1"), ("cafe\u0301.log", b"2")])),
    "encrypted member": ("encrypted_archive_member", A.zip_encrypted_flag),
    "unknown compression method": ("unsupported_archive", A.zip_unknown_method),
    "too many members": ("limit_exceeded", lambda p: A.zip_with(
        p, [(f"m{i}.txt", b"x") for i in range(51)])),
    "too many members, one declared": ("limit_exceeded", lambda p: A.zip_lying_count(p, 51)),
    "member too large": ("limit_exceeded", lambda p: A.zip_with(
        p, [("big.bin", bytes(range(256)) * 400)], compression=zipfile.ZIP_STORED)),
    "total too large": ("limit_exceeded", lambda p: A.zip_with(
        p, [(f"p{i}.bin", bytes(range(256)) * 300) for i in range(3)],
        compression=zipfile.ZIP_STORED)),
    "zip bomb ratio": ("limit_exceeded", lambda p: A.zip_with(p, [("zeros.log", b"\0" * 90000)])),
    "size lies (bomb)": ("corrupt_archive", A.zip_lying_size),
    "bad crc": ("corrupt_archive", A.zip_bad_crc),
    "truncated zip": ("corrupt_archive", lambda p: _truncate(
        A.zip_with(p, [("a.log", b"y" * 3000)]), 40)),
    "tar symlink": ("unsafe_archive_member", lambda p: A.tar_with(
        p, [("ok.txt", b"ok"), A.tar_link("evil", "/etc/passwd")])),
    "tar hard link": ("unsafe_archive_member", lambda p: A.tar_with(
        p, [("ok.txt", b"ok"), A.tar_link("hard", "ok.txt", tarfile.LNKTYPE)])),
    "tar traversal": ("unsafe_archive_member", lambda p: A.tar_with(
        p, [("../outside.txt", b"x")])),
    "tar.gz bomb": ("limit_exceeded", lambda p: A.tar_with(p, [("zeros", b"\0" * 150000)])),
    "corrupt gzip": ("corrupt_archive", lambda p: _truncate(
        A.tar_with(p, [("a.txt", bytes(range(256)) * 40)]), 300)),
}


def _truncate(path: Path, keep: int) -> Path:
    path.write_bytes(path.read_bytes()[:keep])
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "limits.toml"
    p.write_text(LIMITS)
    return p


@pytest.fixture
def existing_store(cli: Cli, sample: Path, store_dir: Path, config: Path) -> dict[str, bytes]:
    """A store that already holds one case, so 'nothing written' is checked against rows."""
    r = cli("intake", "--store", store_dir, "--report", sample / "report.json")
    assert r.code == 0, r.err
    return snapshot(store_dir)


@pytest.mark.parametrize("n", [50, 51])
def test_a_report_with_more_texts_than_max_members_is_refused(
        cli: Cli, tmp_path: Path, store_dir: Path, config: Path,
        existing_store: dict[str, bytes], n: int) -> None:
    """Every comment is a source of the catalogue, and none counted against a limit: 640,000
    one-line comments in a 16 MB report took 2 GB to take in and left a catalogue verify
    reported. The body and its comments count against max_members (50 here)."""
    report = tmp_path / "many.json"
    report.write_text(json.dumps({"title": "t", "body": "b", "comments": [
        {"author": "a", "body": f"c{i}"} for i in range(n - 1)]}))
    r = cli("intake", "--json", "--store", store_dir, "--config", config, "--report", report,
            "--case-id", "MANY-1")
    if n <= 50:
        assert r.code == 0, r.out
        return
    assert r.code == 2, r.out
    assert r.json["error"]["reason"] == "limit_exceeded", r.out  # type: ignore[index]
    assert "max_members" in r.json["error"]["message"]  # type: ignore[index]
    assert snapshot(store_dir) == existing_store


@pytest.mark.parametrize("name, mode", [("logs.tar.xz", "w:xz"), ("logs.tbz2", "w:bz2"),
                                        ("logs.7z", None), ("sosreport-host", "w:bz2"),
                                        ("diag.bin", "w:xz"), ("diag.7z.part", None)])
def test_an_archive_intake_does_not_read_is_refused_in_the_expanded_roles(
        cli: Cli, tmp_path: Path, store_dir: Path, existing_store: dict[str, bytes],
        name: str, mode: str | None) -> None:
    """In the diagnostics role a .tar.xz was stored as one opaque source with exit 0, its
    members never catalogued. It is unsupported_archive there; as a plain attachment it
    is stored as it is."""
    path = tmp_path / name
    if mode is None:
        path.write_bytes(b"7z\xbc\xaf\x27\x1c" + bytes(32))
    else:
        A.tar_with(path, [("app.log", b"crash\n")], mode=mode)
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"diagnostics={path}", "--case-id", "XZ-1")
    assert r.code == 2, r.out
    assert r.json["error"]["reason"] == "unsupported_archive", r.out  # type: ignore[index]
    assert snapshot(store_dir) == existing_store
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"attachment={path}", "--case-id", "XZ-2")
    assert r.code == 0, r.out


@pytest.mark.parametrize("name", ["app.log.xz", "app.log.bz2"])
def test_a_single_compressed_log_is_one_source(cli: Cli, tmp_path: Path, store_dir: Path,
                                               name: str) -> None:
    """xz and bzip2 around one log (no tar inside) are what a plain .gz log is: one opaque
    source, not an archive intake refuses."""
    import bz2
    import lzma

    path = tmp_path / name
    pack = lzma.compress if name.endswith(".xz") else bz2.compress
    path.write_bytes(pack(b"2026-12-04 crash\n" * 50))
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"diagnostics={path}", "--case-id", "LOG-1")
    assert r.code == 0, r.out


def test_a_jira_issues_listed_attachments_count_against_max_members(
        cli: Cli, tmp_path: Path, store_dir: Path, config: Path,
        existing_store: dict[str, bytes]) -> None:
    """Each attachment a Jira issue lists is a source: 100,000 of them in a 1.7 MB report
    made 100,001 sources and a 34 MB catalogue with exit 0."""
    report = tmp_path / "jira.json"
    report.write_text(json.dumps({"key": "PAY-1", "fields": {
        "summary": "s", "description": "d",
        "attachment": [{"filename": f"a{i}.log"} for i in range(60)]}}))
    r = cli("intake", "--json", "--store", store_dir, "--config", config, "--report", report)
    assert r.code == 2, r.out
    assert r.json["error"]["reason"] == "limit_exceeded", r.out  # type: ignore[index]
    assert snapshot(store_dir) == existing_store


@pytest.mark.parametrize("kinds", [("zip", "zip"), ("tar", "zip"), ("zip", "tar.gz"),
                                   ("zip", "file"), ("file",) * 40])
@pytest.mark.parametrize("total", [50, 51])
def test_max_members_counts_a_cases_sources_not_each_inputs(
        cli: Cli, tmp_path: Path, store_dir: Path, config: Path,
        existing_store: dict[str, bytes], kinds: tuple[str, ...], total: int) -> None:
    """Ten archives of max_members members each made a case of ten times that many, each
    input under the limit. The report's texts, every plain attachment and every archive
    member count together against max_members (50 here): at 50 the case is taken in, at 51
    it is refused, whichever input goes past it, and nothing is written."""
    report = tmp_path / "r.json"  # the body and 9 comments: 10 sources
    report.write_text(json.dumps({"title": "t", "body": "b", "comments": [
        {"author": "a", "body": f"c{i}"} for i in range(9)]}))
    archives = [i for i, k in enumerate(kinds) if k != "file"]
    room = total - 10 - (len(kinds) - len(archives))  # what the plain files leave
    if not archives:  # 40 plain files, and one more for 51
        kinds = kinds + ("file",) * room
    files = []
    for i, kind in enumerate(kinds):
        path = tmp_path / f"in{i}.{kind}"
        if kind == "file":
            path.write_text("hello\n")
        else:  # the archives share the room, the last taking what is left
            count = room // len(archives) if i != archives[-1] else \
                room - room // len(archives) * (len(archives) - 1)
            members = [(f"m{i}/{j}.log", b"x\n") for j in range(count)]
            if kind == "zip":
                A.zip_with(path, members)
            else:
                A.tar_with(path, members, mode="w:gz" if kind == "tar.gz" else "w")
        files += ["--attach", f"diagnostics={path}"]
    r = cli("intake", "--json", "--store", store_dir, "--config", config, "--report", report,
            *files, "--case-id", "SUM-1")
    if total == 50:
        assert r.code == 0, r.out
        assert len(r.json["catalogue"]["sources"]) == 50  # type: ignore[index]
        return
    assert r.code == 2, r.out
    assert r.json["error"]["reason"] == "limit_exceeded", r.out  # type: ignore[index]
    assert "max_members=50" in r.json["error"]["message"]  # type: ignore[index]
    assert snapshot(store_dir) == existing_store


class TestArchiveRefusals:
    @pytest.mark.parametrize("label", sorted(ARCHIVES))
    def test_refused_with_reason_and_nothing_written(
            self, label: str, cli: Cli, tmp_path: Path, store_dir: Path, config: Path,
            existing_store: dict[str, bytes]) -> None:
        """Each malicious archive is refused (exit 2) naming its reason; the store is unchanged."""
        reason, build = ARCHIVES[label]
        archive = build(tmp_path / "evil.bin")
        r = cli("intake", "--json", "--store", store_dir, "--config", config,
                "--report", _report(tmp_path), "--attach", f"diagnostics={archive}",
                "--case-id", "EVIL-1")
        assert r.code == 2, (label, r.out, r.err)
        assert r.json["error"]["reason"] == reason, r.json  # type: ignore[index]
        assert str(archive) in r.json["error"]["message"]  # type: ignore[index]
        # A limit can be raised; what no limit allows must not be told to raise one (a tar
        # name that is not UTF-8 said "raise the limit").
        hint = r.json["error"]["hint"]  # type: ignore[index]
        assert ("raise the limit" in hint) == (reason == "limit_exceeded"), (label, hint)
        assert snapshot(store_dir) == existing_store

    @pytest.mark.parametrize("form", ["end record", "zip64 record"])
    def test_a_directory_declaring_fewer_entries_is_counted_before_zipfile_reads_it(
            self, cli: Cli, tmp_path: Path, config: Path,
            monkeypatch: pytest.MonkeyPatch, form: str) -> None:
        """The end record's count is not trusted: the directory's entries are counted
        before zipfile builds an object per entry (one declaring 1 entry over 1.4 million
        took 556 MB and 8 s before the count limit applied)."""
        import zipfile

        opened: list[object] = []
        real = zipfile.ZipFile

        def spy(*args: object, **kw: object) -> zipfile.ZipFile:
            opened.append(args[0])
            return real(*args, **kw)  # type: ignore[arg-type]

        lying = A.zip_lying_count if form == "end record" else A.zip_lying_count_zip64
        archive = lying(tmp_path / "bomb.zip", 400)
        monkeypatch.setattr(zipfile, "ZipFile", spy)
        r = cli("intake", "--json", "--store", tmp_path / "s", "--config", config,
                "--report", _report(tmp_path), "--attach", f"diagnostics={archive}")
        assert r.code == 2, r.out
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "limit_exceeded" and "central directory" in error["message"]
        assert opened == [], "zipfile read the directory before it was counted"
        # At the limit the same form is read as zipfile reads it (by the directory's size,
        # as here): the count is exact, not a guess. 49 members and the report's body are
        # the case's 50 sources.
        fine = lying(tmp_path / "fine.zip", 49)
        r = cli("intake", "--json", "--store", tmp_path / "s", "--config", config,
                "--report", _report(tmp_path), "--attach", f"diagnostics={fine}")
        assert r.code == 0, r.out
        assert len(r.json["catalogue"]["sources"]) == 50  # type: ignore[index]

    def test_refusal_on_a_new_store_creates_no_store(self, cli: Cli, tmp_path: Path,
                                                     config: Path) -> None:
        """A refused first intake does not even create the store directory."""
        archive = A.zip_symlink(tmp_path / "d.zip", "x", "/etc")
        store = tmp_path / "fresh"
        r = cli("intake", "--store", store, "--config", config, "--report", _report(tmp_path),
                "--attach", f"diagnostics={archive}")
        assert r.code == 2 and "unsafe_archive_member" in r.err
        assert not store.exists()


REPORTS: dict[str, tuple[str, bytes]] = {
    "not utf-8": ("invalid_report", b"\xff\xfe t\x00i\x00t\x00"),
    "empty text": ("invalid_report", b"   \n\n  "),
    "json missing body": ("invalid_report", b'{"title": "t"}'),
    "json unknown key": ("invalid_report", b'{"title": "t", "body": "b", "coments": []}'),
    "json wrong type": ("invalid_report", b'{"title": "t", "body": ["b"]}'),
    "json blank title": ("invalid_report", b'{"title": "  ", "body": "b"}'),
    "json comment without author": ("invalid_report",
                                    b'{"title": "t", "body": "b", "comments": [{"body": "c"}]}'),
    "json bad case id": ("invalid_case_id", b'{"title": "t", "body": "b", "case_id": "../x"}'),
    "broken json": ("invalid_report", b'{"title": "t", "body": '),
    "json comments as one object": ("invalid_report", b'{"title": "t", "body": "b", '
                                    b'"comments": {"author": "a", "body": "c"}}'),
    "json comments as a string": ("invalid_report",
                                  b'{"title": "t", "body": "b", "comments": "ab"}'),
}


class TestReportRefusals:
    @pytest.mark.parametrize("label", sorted(REPORTS))
    def test_refused(self, label: str, cli: Cli, tmp_path: Path, store_dir: Path,
                     existing_store: dict[str, bytes]) -> None:
        """Each broken report is refused with its reason; the store is unchanged."""
        reason, raw = REPORTS[label]
        report = tmp_path / "r.txt"
        report.write_bytes(raw)
        r = cli("intake", "--json", "--store", store_dir, "--report", report)
        assert r.code == 2, (label, r.out, r.err)
        assert r.json["error"]["reason"] == reason  # type: ignore[index]
        assert snapshot(store_dir) == existing_store

    def test_bad_case_id_flag(self, cli: Cli, tmp_path: Path, store_dir: Path,
                              existing_store: dict[str, bytes]) -> None:
        """--case-id must follow the contract's id rules."""
        r = cli("intake", "--store", store_dir, "--report", _report(tmp_path),
                "--case-id=-starts-with-dash")
        assert r.code == 2 and "invalid_case_id" in r.err
        assert snapshot(store_dir) == existing_store

    def test_duplicate_input_names(self, cli: Cli, tmp_path: Path, store_dir: Path,
                                   existing_store: dict[str, bytes]) -> None:
        """Two attachments with the same file name are refused, not silently renamed."""
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        (tmp_path / "a" / "log.txt").write_text("1")
        (tmp_path / "b" / "log.txt").write_text("2")
        r = cli("intake", "--store", store_dir, "--report", _report(tmp_path),
                "--attach", tmp_path / "a" / "log.txt", "--attach", tmp_path / "b" / "log.txt")
        assert r.code == 2 and "duplicate_input" in r.err
        assert snapshot(store_dir) == existing_store

    def test_missing_attachment(self, cli: Cli, tmp_path: Path, store_dir: Path,
                                existing_store: dict[str, bytes]) -> None:
        """A missing file is refused before anything is written."""
        r = cli("intake", "--store", store_dir, "--report", _report(tmp_path),
                "--attach", tmp_path / "nope.zip")
        assert r.code == 2 and "no such file" in r.err
        assert snapshot(store_dir) == existing_store

    def test_existing_case_refused(self, cli: Cli, sample: Path, store_dir: Path,
                                   existing_store: dict[str, bytes]) -> None:
        """Intake of a case id that already exists, with other inputs, is refused and
        writes nothing."""
        r = cli("intake", "--json", "--store", store_dir, "--report", sample / "report.json",
                "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
        assert r.code == 2
        assert r.json["error"]["reason"] == "case_exists"  # type: ignore[index]
        assert snapshot(store_dir) == existing_store

    def test_the_same_intake_again_is_already_present(
            self, cli: Cli, sample: Path, store_dir: Path,
            existing_store: dict[str, bytes]) -> None:
        """The same intake run again (after an interruption that came after its commit,
        say) is "already present": exit 0, nothing written; it was case_exists, whose hint
        (another --case-id) led to a second copy of the case."""
        r = cli("intake", "--json", "--store", store_dir, "--report", sample / "report.json")
        assert r.code == 0, r.out
        assert r.json["already_present"] is True, r.out  # type: ignore[index]
        assert r.json["case_id"] == "BUG-20" and r.json["package_generation"] == 1  # type: ignore[index]
        assert snapshot(store_dir) == existing_store
        text = cli("intake", "--store", store_dir, "--report", sample / "report.json")
        assert text.code == 0 and "already present" in text.out, text.out

    def test_a_case_whose_head_is_damaged_is_not_already_present(
            self, cli: Cli, sample: Path, store_dir: Path,
            existing_store: dict[str, bytes]) -> None:
        """The case exists but its head manifest does not read back (a flipped bit): that
        proves nothing about what it holds, so the intake again is case_exists (exit 2),
        never "already present" and never an internal error; nothing is written."""
        from tests.store_helpers import query, sql

        pkg = query(store_dir, "SELECT package_id FROM refs WHERE case_id='BUG-20'")[0][0]
        raw = bytearray(query(store_dir, "SELECT manifest FROM generations WHERE "
                                         "package_id=?", pkg)[0][0])
        raw[10] ^= 0x04
        sql(store_dir, "UPDATE generations SET manifest=? WHERE package_id=?", bytes(raw), pkg)
        before = snapshot(store_dir)
        r = cli("intake", "--json", "--store", store_dir, "--report", sample / "report.json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "case_exists", r.out  # type: ignore[index]
        assert snapshot(store_dir) == before

    def test_a_case_whose_inputs_differ_is_not_already_present(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """A case whose case/intake.json names these inputs but whose stored input bytes
        are others (an import made it so; verify does not compare the two): the genuine
        intake is case_exists, not "already present" over the wrong bytes."""
        from engine import (
            Attachment,
            BytesSource,
            Change,
            IntakeLimits,
            PublishRequest,
            new_package_id,
            prepare_intake,
        )
        from tests.store_helpers import open_rw

        diag = sample / "wowdiag.zip"
        plan = prepare_intake(sample / "report.json", [Attachment("diagnostics", diag)],
                              case_id=None, limits=IntakeLimits())
        files = dict(plan.change.files)
        swapped = [p for p in files if p.startswith("inputs/") and p.endswith(".zip")]
        assert swapped, files
        files[swapped[0]] = BytesSource.of(b"PK-not-really a different diag")
        root = tmp_path / "s"
        store = open_rw(root)
        try:
            [out] = store.commit_batch([PublishRequest(new_package_id(), plan.case_id, None,
                                                       Change(files=files, phase="INTAKE",
                                                              pointers=plan.change.pointers))])
            assert not isinstance(out, Exception), out
        finally:
            store.close()
        r = cli("intake", "--json", "--store", root, "--report", sample / "report.json",
                "--attach", f"diagnostics={diag}")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "case_exists", r.out  # type: ignore[index]

    def test_the_same_originals_in_another_order_say_so(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """The same intake with its --attach flags in another order stores the same
        originals under another catalogue (S-numbers follow the order given): it stays
        case_exists, with nothing written, but says that the case holds these very
        originals, single and bulk, instead of the bare "already exists" that sent the
        user looking for a difference."""
        root = tmp_path / "s"
        diag, src = f"diagnostics={sample / 'wowdiag.zip'}", f"source={sample / 'wowsrc.zip'}"
        report = sample / "report.json"
        first = cli("intake", "--store", root, "--report", report, "--attach", diag,
                    "--attach", src)
        assert first.code == 0, first.err
        before = snapshot(root)
        again = cli("intake", "--json", "--store", root, "--report", report, "--attach", src,
                    "--attach", diag)
        assert again.code == 2, again.out
        error = again.json["error"]  # type: ignore[index]
        assert error["reason"] == "case_exists", error
        assert "same originals" in error["message"] and "another order" in error["message"]
        assert "viano show BUG-20" in error["hint"], error
        assert snapshot(root) == before
        # Other originals under the same case id keep the plain refusal.
        other = cli("intake", "--json", "--store", root, "--report", report, "--attach", diag)
        assert other.code == 2 and "same originals" not in other.out, other.out
        assert snapshot(root) == before


def test_a_text_mode_intake_prints_at_most_200_catalogue_rows(
        cli: Cli, tmp_path: Path, store_dir: Path) -> None:
    """Every source was a row of the printed table: 50,000 comments took 22 s to print
    (2 s with --json). The first 200 are printed, then how to list them all."""
    report = tmp_path / "many.json"
    report.write_text(json.dumps({"title": "t", "body": "b", "comments": [
        {"author": "a", "body": f"c{i}"} for i in range(299)]}))
    r = cli("intake", "--store", store_dir, "--report", report, "--case-id", "ROWS-1")
    assert r.code == 0, r.err
    assert "S200" in r.out and "S201 " not in r.out, r.out[-500:]
    assert "… and 100 more sources: 'viano cat ROWS-1 case/catalogue.json'" in r.out
    doc = json.loads(cli("cat", "--store", store_dir, "ROWS-1", "case/catalogue.json").out)
    assert len(doc["sources"]) == 300


def test_an_info_zip_name_is_read_as_utf8(cli: Cli, tmp_path: Path, store_dir: Path) -> None:
    """Info-ZIP writes UTF-8 names without the UTF-8 flag; zipfile read them as cp437, and
    café.log was catalogued as caf├⌐.log."""
    archive = A.zip_utf8_unflagged(tmp_path / "diag.zip", ["caf\u00e9.log".encode()])
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"diagnostics={archive}", "--case-id", "NAME-1")
    assert r.code == 0, r.out
    members = [s["origin"].get("member") for s in r.json["catalogue"]["sources"]]  # type: ignore[index]
    assert "caf\u00e9.log" in members, members


@pytest.mark.no_store
def test_a_catalogue_with_the_cp437_reading_of_a_name_still_finds_its_member(
        tmp_path: Path) -> None:
    """A case taken in before names were read as UTF-8 catalogued café.log as caf├⌐.log;
    its phase context still reads that member's head."""
    from engine import IntakeLimits
    from engine._intake._archives import member_heads

    archive = A.zip_utf8_unflagged(tmp_path / "z.zip", ["caf\u00e9.log".encode()])
    for name in ("caf\u00e9.log".encode().decode("cp437"), "caf\u00e9.log"):
        heads = member_heads(lambda: archive.open("rb"), archive.stat().st_size, "zip",
                             {name: 10}, IntakeLimits(), "z.zip")
        assert heads == {name: b"x"}, heads


@pytest.mark.parametrize("name", ["empty.tar", "empty.tar.gz"])
def test_an_empty_tar_is_an_archive_with_no_members(cli: Cli, tmp_path: Path,
                                                    store_dir: Path, name: str) -> None:
    """``tar cf e.tar --files-from /dev/null`` (two zero blocks, padded) was refused as
    corrupt_archive, where an empty zip is taken in."""
    path = tmp_path / name
    A.tar_with(path, [], mode="w:gz" if name.endswith(".gz") else "w")
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"diagnostics={path}", "--case-id", "EMPTY-1")
    assert r.code == 0, r.out
    sources = r.json["catalogue"]["sources"]  # type: ignore[index]
    assert [s for s in sources if s["origin"].get("member")] == [], sources
    # Zeros named like a tar but not a tar's end (one block) stay refused.
    (tmp_path / "zeros.tar").write_bytes(bytes(512))
    r = cli("intake", "--json", "--store", store_dir, "--report", _report(tmp_path),
            "--attach", f"diagnostics={tmp_path / 'zeros.tar'}", "--case-id", "EMPTY-2")
    assert r.code == 2 and r.json["error"]["reason"] == "corrupt_archive", r.out  # type: ignore[index]
