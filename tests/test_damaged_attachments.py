"""An attachment damaged in the store never reaches the model, and never gets pinned.

The interpretation's context holds the first bytes of each textual attachment. Those were
read with a head read, and the store's stream checks a blob against its sha256 only when a
read reaches its end: damaged bytes went into ``context.json``, were sent to the model and
were published, and only a later step said ``store_corrupt`` (after which the revision
could never verify again). A damaged archive member's head went the same way, or (a
compressed archive) came out as an ``unreadable`` excerpt, the damage unsaid.

Now every input an excerpt comes from is read to its end first: the case says
``store_corrupt`` (exit 13 with its result, as for any damaged file), no call reaches the
provider, and nothing is published.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import sqlite3
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.batch_helpers import write_generic_answers
from tests.conftest import child_env, run_viano
from tests.loopback.process import Provider
from tests.store_helpers import open_ro

KEY = "sk-damaged-attachments-0000"
LINE = b"2026-01-01 ERROR worker 7 lost its connection to the queue\n"


def _log(size: int) -> bytes:
    return (LINE * (size // len(LINE) + 1))[:size]


def _zip(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("logs/app.log", data)
    return out.getvalue()


def _tar(data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("logs/app.log")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return out.getvalue()


# (attachment file name, role, its bytes): small ones are stored inline in SQLite, the
# ones above 256 KiB as blob files; the archives are catalogued by member.
KINDS: dict[str, tuple[str, str, Callable[[], bytes]]] = {
    "inline text": ("app.log", "attachment", lambda: _log(4_000)),
    "blob-file text": ("big.log", "attachment", lambda: _log(600_000)),
    "zip member": ("diag.zip", "diagnostics", lambda: _zip(_log(4_000))),
    "blob-file zip member": ("big.zip", "diagnostics", lambda: _zip(_log(600_000))),
    "tar member": ("diag.tar", "diagnostics", lambda: _tar(_log(300_000))),
    # Ending in 2 MiB of zero blocks (a large blocking factor): a scan stops at the end
    # blocks, so no read reached the end of the file and its check.
    "padded tar member": ("pad.tar", "diagnostics",
                          lambda: _tar(_log(300_000)) + bytes(2 << 20)),
}


def _config(tmp: Path, port: int) -> Path:
    cfg = tmp / "viano.toml"
    cfg.write_text(f"""
[interpretation]
auto_confirm = true

[[providers]]
name = "loopback"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "m"
api_key_env = "VIANO_KEY"
retries = 0
timeout_s = 30
""")
    return cfg


def _taken_in(store: Path, tmp: Path, kind: str, case_id: str) -> bytes:
    """``case_id`` taken in by the CLI with an attachment of ``kind``; its bytes."""
    name, role, make = KINDS[kind]
    data = make()
    report = tmp / "report.txt"
    report.write_text("The worker crashes\nIt loses its queue connection and exits.\n")
    (tmp / name).write_bytes(data)
    r = run_viano("intake", "--store", store, "--report", report, "--case-id", case_id,
                  "--attach", f"{role}={tmp / name}")
    assert r.returncode == 0, r.stderr
    return data


def _damage(store: Path, sha256: str, data: bytes) -> None:
    """The stored bytes of ``sha256`` with ``ERROR`` in its first line turned into
    ``FIXED`` (same size): a head read sees the change, only a whole read finds it."""
    at = data.index(b"ERROR")
    damaged = data[:at] + b"FIXED" + data[at + 5:]
    with contextlib.closing(sqlite3.connect(store / "store.sqlite3")) as db, db:
        rows = db.execute("UPDATE blob_rows SET data = ? WHERE sha256 = ? AND data IS NOT "
                          "NULL", (damaged, bytes.fromhex(sha256))).rowcount
    if rows == 0:  # not inline: its blob file
        path = store / "blobs" / "sha256" / sha256[:2] / sha256
        path.chmod(0o644)
        path.write_bytes(damaged)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_damaged_attachment_stops_the_case_before_any_call(
        tmp_path: Path, kind: str) -> None:
    store, data = tmp_path / "s", _taken_in(tmp_path / "s", tmp_path, kind, "A-1")
    shown = json.loads(run_viano("show", "--store", store, "A-1", "--json").stdout)
    stored = [v for p, v in shown["files"].items() if p.startswith("inputs/")
              and v["size"] == len(data)]
    assert len(stored) == 1, shown["files"]
    _damage(store, stored[0]["sha256"], data)

    provider = Provider(tmp_path, write_generic_answers(tmp_path / "answers"))
    try:
        env = child_env(VIANO_CONFIG=str(_config(tmp_path, provider.port)), VIANO_KEY=KEY)
        one = run_viano("interpret", "--store", store, "A-1", env=env)
    finally:
        provider.stop()
    assert one.returncode == 13, one.stdout + one.stderr
    assert "A-1: ERROR (store_corrupt)" in one.stdout, one.stdout
    assert "what to do: 'viano verify A-1' names what is damaged" in one.stdout
    assert provider.calls == []  # nothing of the damaged bytes went out
    after = json.loads(run_viano("show", "--store", store, "A-1", "--json").stdout)
    assert after["package_generation"] == shown["package_generation"]  # nothing pinned
    verify = run_viano("verify", "--store", store, "A-1")
    assert verify.returncode == 1 and "is damaged" in verify.stdout, verify.stdout


def test_an_undamaged_attachment_is_excerpted(tmp_path: Path) -> None:
    """The same cases undamaged complete, their excerpts taken (the check above is the
    damage, not the reading)."""
    store = tmp_path / "s"
    ids = [f"B-{i}" for i in range(len(KINDS))]
    for case_id, kind in zip(ids, KINDS, strict=True):
        _taken_in(store, tmp_path, kind, case_id)
    provider = Provider(tmp_path, write_generic_answers(tmp_path / "answers"))
    try:
        env = child_env(VIANO_CONFIG=str(_config(tmp_path, provider.port)), VIANO_KEY=KEY)
        for case in ids:
            r = run_viano("interpret", "--store", store, case, env=env)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        provider.stop()
    assert len(provider.calls) == len(ids)
    ro = open_ro(store)
    try:
        for case in ids:
            files = json.loads(run_viano("show", "--store", store, case, "--json").stdout
                               )["files"]
            [context] = [v for p, v in files.items() if p.endswith("/context.json")]
            doc = json.loads(ro.read_blob(context["sha256"]))
            [excerpt] = doc["untrusted_case_data"]["excerpts"]
            assert excerpt["text"].startswith(LINE.decode()), excerpt
    finally:
        ro.close()


def _interpreted(tmp_path: Path, kind: str) -> tuple[Path, dict[str, Any], bytes, Provider,
                                                     dict[str, str]]:
    """A case with the ``kind`` attachment taken in and interpreted (awaiting its
    confirmation); its ``show --json`` before, the attachment's bytes, the provider."""
    store, data = tmp_path / "s", _taken_in(tmp_path / "s", tmp_path, kind, "C-1")
    provider = Provider(tmp_path, write_generic_answers(tmp_path / "answers"))
    cfg = _config(tmp_path, provider.port)
    cfg.write_text(cfg.read_text().replace("auto_confirm = true", "auto_confirm = false"))
    env = child_env(VIANO_CONFIG=str(cfg), VIANO_KEY=KEY)
    r = run_viano("interpret", "--store", store, "C-1", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    shown = json.loads(run_viano("show", "--store", store, "C-1", "--json").stdout)
    return store, shown, data, provider, env


@pytest.mark.parametrize("kind", ["zip member", "blob-file text"])
def test_an_attachment_damaged_after_it_was_pinned_is_the_store_s_damage(
        tmp_path: Path, kind: str) -> None:
    """Damaged after the context was pinned: each later step's audit derives the context
    again (through the memo, which must pass the fault on) and cannot read it. The
    phase commands and `viano report` say store_corrupt, not unsupported_history (whose
    step is of no use), and nothing is published."""
    store, shown, data, provider, env = _interpreted(tmp_path, kind)
    try:
        [entry] = [v for p, v in shown["files"].items() if p.startswith("inputs/")
                   and v["size"] == len(data)]
        _damage(store, entry["sha256"], data)
        again = run_viano("interpret", "--store", store, "C-1", env=env)
        report = run_viano("report", "--store", store, "C-1", env=env)
    finally:
        provider.stop()
    assert again.returncode == 13, again.stdout + again.stderr
    assert "C-1: ERROR (store_corrupt)" in again.stdout, again.stdout
    assert report.returncode == 1 and "error[store_corrupt]" in report.stderr, report.stderr
    after = json.loads(run_viano("show", "--store", store, "C-1", "--json").stdout)
    assert after["package_generation"] == shown["package_generation"]
    assert len(provider.calls) == 1


class _FailingDisk(io.RawIOBase):
    """A blob file whose reads fail as a dying disk's do (EIO), after ``good`` bytes."""

    def __init__(self, data: bytes, good: int):
        super().__init__()
        self._data, self._good, self._at = data, good, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._data)
                    }[whence] + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, b: Any) -> int:
        if self._at + len(b) > self._good:
            raise OSError(errno.EIO, "Input/output error")
        n = len(self._data[self._at:self._at + len(b)])
        b[:n] = self._data[self._at:self._at + n]
        self._at += n
        return n


class _SeekFailingDisk(_FailingDisk):
    """A blob file whose reads succeed and whose seeks fail (EIO), past the first."""

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (offset, whence) != (0, io.SEEK_SET):
            raise OSError(errno.EIO, "Input/output error")
        return super().seek(offset, whence)


class _Attached:
    """A case taken in with one attachment of ``kind``, its store open read-only, and its
    interpretation context derived over a view whose attachment blob is read through the
    store's verifying stream over what the test gives (``raw()``, called at each open,
    counted in ``opens``); every other blob comes from the store. The document cache is
    emptied first: nothing read before may answer for the attachment."""

    def __init__(self, tmp: Path, kind: str, case_id: str, monkeypatch: pytest.MonkeyPatch):
        import engine._phases._view as view_module

        self.data = _taken_in(tmp / "s", tmp, kind, case_id)
        self.ro = open_ro(tmp / "s")
        ref = self.ro.case(case_id)
        self.manifest = self.ro.manifest(ref.package_id, ref.generation)
        [self.sha] = [e.sha256 for p, e in self.manifest.files.items()
                      if p.startswith("inputs/") and e.size == len(self.data)]
        self.faults: list[Any] = []
        self.opens = 0
        monkeypatch.setattr(view_module, "DOCUMENTS", view_module._Documents())

    def context(self, raw: Callable[[], Any]) -> Any:
        from engine import INTERPRETATION, InterpretationPolicy, PackageView
        from engine._phases._interpretation import interpretation_policy
        from engine._store._blobs import verified_stream

        def opener(digest: str) -> Any:
            if digest != self.sha:
                return self.ro.open_blob(digest)
            self.opens += 1
            return verified_stream(raw(), self.sha, len(self.data))

        view = PackageView(self.manifest, self.ro.read_blob, opener, self.faults.append)
        return INTERPRETATION.context(view, interpretation_policy(InterpretationPolicy()), 1)

    def close(self) -> None:
        self.ro.close()


def _excerpt_text(context: Any) -> str:
    assert isinstance(context, bytes)
    [excerpt] = json.loads(context)["untrusted_case_data"]["excerpts"]
    return str(excerpt["text"])


def test_a_disk_that_fails_under_a_zip_s_seeks_is_store_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zip's members are read by seeks: one that fails under them was an OSError, which
    the archive scan took for a corrupt archive (an 'unreadable' excerpt, pinned and sent);
    it is the store's error, as a failing read is."""
    from engine._phases import HistoryProblem

    # Bigger than one checked chunk: its members' reads seek the disk.
    case = _Attached(tmp_path, "blob-file zip member", "K-1", monkeypatch)
    with contextlib.closing(case), pytest.raises(HistoryProblem, match="cannot be read"):
        case.context(lambda: _SeekFailingDisk(case.data, 1 << 40))
    assert [f.reason for f in case.faults] == ["store_unavailable"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_disk_that_fails_under_an_attachment_is_store_unavailable(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read error (EIO) under an attachment's stream: the context is not derived (an
    archive's member reads turned it into an 'unreadable' excerpt, pinned and sent; a plain
    file's raised a raw OSError, an internal error), the view's fault callback hears
    store_unavailable."""
    from engine._phases import HistoryProblem

    case = _Attached(tmp_path, kind, "E-1", monkeypatch)
    with contextlib.closing(case), pytest.raises(HistoryProblem, match="cannot be read"):
        case.context(lambda: _FailingDisk(case.data, len(case.data) // 2))
    assert [f.reason for f in case.faults] == ["store_unavailable"]


@pytest.mark.parametrize("kind", ["zip member", "blob-file zip member"])
def test_an_archive_damaged_after_its_check_is_the_store_s_damage(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive is checked whole before its members' heads are read, and those heads
    come from a second open with seeks, which has no sha256 check of its own. Bytes damaged
    between the two reads (here: every open after the first gives the damaged bytes) went
    into the context (a tar member's head) or made it an 'unreadable' excerpt (a zip
    member's CRC); now each chunk read is compared with what was checked: store_corrupt,
    and no context."""
    from engine._phases import HistoryProblem

    with contextlib.closing(_Attached(tmp_path, kind, "R-1", monkeypatch)) as case:
        data = case.data
        at = data.index(LINE) + 10 * len(LINE)  # inside the member's first bytes
        damaged = data[:at] + b"X" * len(LINE) + data[at + len(LINE):]
        assert len(damaged) == len(data)
        with pytest.raises(HistoryProblem, match="is damaged"):
            case.context(lambda: io.BytesIO(data if case.opens == 1 else damaged))
        assert case.opens >= 2  # the check, then the members' reads
        # The same view over bytes that stay as checked gives the member's head.
        context = case.context(lambda: io.BytesIO(data))
    assert [f.reason for f in case.faults] == ["store_corrupt"]
    assert _excerpt_text(context).startswith(LINE.decode() * 20)


def test_a_tar_is_read_once_and_checked_to_its_end_before_its_heads_are_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tar is read forward only, so its members' heads come from one read of it through
    the store's own check, which its stream's close reaches (a scan stops at the end
    blocks): damage in the 2 MiB of zero blocks after them is store_corrupt, and the
    archive is opened once (it was read whole twice: the check, then the scan)."""
    from engine._phases import HistoryProblem

    with contextlib.closing(_Attached(tmp_path, "padded tar member", "T-1",
                                      monkeypatch)) as case:
        data = case.data
        damaged = data[:-1000] + b"X" + data[-999:]
        with pytest.raises(HistoryProblem, match="is damaged"):
            case.context(lambda: io.BytesIO(damaged))
        assert [f.reason for f in case.faults] == ["store_corrupt"]
        case.opens = 0
        context = case.context(lambda: io.BytesIO(data))
    assert case.opens == 1
    assert _excerpt_text(context).startswith(LINE.decode() * 20)
