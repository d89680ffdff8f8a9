"""What a case's context reads of an archive, and what deciding where to plan it reads.

An archive's members are read by seeks, which the store's end-of-file sha256 check does not
cover, so ``PackageView.checked_opener`` reads the archive once through the check, keeping
a digest per chunk, and its streams give back only chunks that match. Those streams must
behave as files do (zipfile and tarfile seek, tell and read past the end), and must not
read a chunk again at every jump between a zip's members; a file whose size is not the
manifest's is a history problem.

``reading_bound`` decides whether a plan may run on the event loop: it counts a tar at what
it may expand to and a zip at a chunk per member its catalogue lists, and reads nothing
more once the stored bytes alone are over the limit.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import attrs
import pytest

from engine import PackageView, VianoError, reading_bound, sha256_hex
from engine._phases import HistoryProblem
from engine._phases._view import CHECK_CHUNK
from engine._store import FileEntry
from engine._store._blobs import verified_stream


@attrs.define
class _Files:
    """Blobs by sha256, served through the store's verifying stream."""

    data: dict[str, bytes] = attrs.field(factory=dict)

    def add(self, data: bytes) -> str:
        sha = sha256_hex(data)
        self.data[sha] = data
        return sha

    def open(self, sha: str) -> Any:
        return verified_stream(io.BytesIO(self.data[sha]), sha, len(self.data[sha]))

    def read(self, sha: str) -> bytes:
        return self.data[sha]


@attrs.frozen
class _Manifest:
    """The part of a manifest a view reads."""

    files: dict[str, FileEntry]
    pointers: dict[str, str] = attrs.field(factory=dict)
    package_generation: int = 1
    case_id: str = "C-1"


def _view(files: _Files, paths: dict[str, bytes], pointers: dict[str, str] | None = None,
          faults: list[VianoError] | None = None) -> PackageView:
    entries = {p: FileEntry(files.add(d), len(d)) for p, d in paths.items()}
    return PackageView(_Manifest(entries, pointers or {}), files.read,  # type: ignore[arg-type]
                       files.open, None if faults is None else faults.append)


@pytest.mark.parametrize("size", [0, 1, CHECK_CHUNK - 1, CHECK_CHUNK, 2 * CHECK_CHUNK,
                                  2 * CHECK_CHUNK + 5])
def test_a_checked_stream_reads_seeks_and_tells_as_a_file_does(size: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    opener = _view(_Files(), {"a": data}).checked_opener("a")
    with opener() as f:
        assert f.read() == data
        assert f.read(10) == b"" and f.tell() == size
        f.seek(0)
        assert b"".join(iter(lambda: f.read(7_001), b"")) == data
        f.seek(-min(size, 9), io.SEEK_END)
        assert f.read() == data[size - min(size, 9):]
        f.seek(size + 100)
        assert f.read() == b""
        with pytest.raises((ValueError, OSError)):
            f.seek(-1)
    with opener() as f:  # a second stream of the same opener
        f.seek(size // 2)
        assert f.read() == data[size // 2:]


def test_bytes_changed_after_the_check_are_the_store_s_damage() -> None:
    files = _Files()
    faults: list[VianoError] = []
    data = bytes(range(256)) * (3 * CHECK_CHUNK // 256)
    view = _view(files, {"a": data}, faults=faults)
    opener = view.checked_opener("a")
    [sha] = files.data
    files.data[sha] = data[:CHECK_CHUNK + 10] + b"!" + data[CHECK_CHUNK + 11:]
    with opener() as f:
        assert f.read(CHECK_CHUNK) == data[:CHECK_CHUNK]  # its chunk is as checked
        with pytest.raises(HistoryProblem, match="changed after they were checked"):
            f.read(1)
    assert [x.reason for x in faults] == ["store_corrupt"]


def _jumping_zip(members: int) -> bytes:
    """A zip whose directory alternates between members before and after a filler the
    size of several chunks, as a hostile one may: its members' reads jump at every one."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for side in "ab":
            for i in range(members // 2):
                z.writestr(f"{side}/{i:05d}.log", b"ERROR %s %05d\n" % (side.encode(), i))
            if side == "a":
                z.writestr("filler.bin", bytes(6 * CHECK_CHUNK))
        by_name = {info.filename: info for info in z.filelist}
        z.filelist[:] = [by_name[f"{side}/{i:05d}.log"] for i in range(members // 2)
                         for side in "ab"] + [by_name["filler.bin"]]
    return out.getvalue()


def test_a_zip_s_jumps_between_its_parts_read_each_chunk_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each member read in directory order jumps across the filler. With one chunk held,
    every jump read and hashed a chunk again (9x the plain stream's time in the review's
    run). The last chunks read are held, shared by the opener's streams: each chunk is
    hashed once by the check and at most once more by the members' reads."""
    import engine._phases._view as view_module
    from engine._config import IntakeLimits
    from engine._intake import member_heads

    hashed: list[int] = []
    digest = view_module._chunk_digest

    def counted(chunk: bytes) -> bytes:
        hashed.append(len(chunk))
        return digest(chunk)

    monkeypatch.setattr(view_module, "_chunk_digest", counted)
    data = _jumping_zip(400)
    chunks = -(-len(data) // CHECK_CHUNK)
    assert 4 <= chunks <= 16  # the members' parts and the directory: what is held
    opener = _view(_Files(), {"d.zip": data}).checked_opener("d.zip")
    assert sum(hashed) == len(data) and len(hashed) == chunks  # the check
    wanted = {f"{side}/{i:05d}.log": 100 for i in range(200) for side in "ab"}
    heads = member_heads(opener, len(data), "zip", wanted, IntakeLimits(), "d.zip")
    assert len(heads) == 400 and heads["b/00007.log"] == b"ERROR b 00007\n"
    assert len(hashed) - chunks <= chunks, f"{len(hashed) - chunks} chunk reads of {chunks}"


def _documents(inputs: list[Any], sources: list[Any]) -> dict[str, bytes]:
    import json
    return {"case/intake.json": json.dumps({"inputs": inputs}).encode(),
            "case/catalogue.json": json.dumps({"sources": sources}).encode()}


POINTERS = {"intake": "case/intake.json", "catalogue": "case/catalogue.json"}


def test_the_reading_bound_counts_what_a_plan_may_inflate_or_jump_across() -> None:
    """A tar at what it may expand to; a zip at a chunk per member the catalogue lists of
    it, whatever the intake record says (an import's record said 1 of 100); hostile
    entries count nothing and raise nothing."""
    tgz, zp = b"t" * 30_000, b"z" * 5_000
    members = [{"source_id": f"S{i}", "origin": {"input": "inputs/d.zip",
                                                 "member": f"logs/{i}.log"}}
               for i in range(100)]
    sources = [{"source_id": "S-a", "origin": {"input": "inputs/a.log"}},
               {"source_id": "S-t", "origin": {"input": "inputs/d.tar.gz", "member": "x"}},
               {"source_id": "S-odd", "origin": "not a dict"},
               {"source_id": "S-odd2", "origin": {"input": ["a"], "member": "y"}}, *members]
    inputs = [{"input": "inputs/a.log"},
              {"input": "inputs/d.tar.gz", "archive": "tar.gz", "members": 3},
              {"input": "inputs/d.zip", "archive": "zip", "members": 1},
              {"input": ["not", "a", "name"], "archive": "zip"}, "not a dict",
              {"input": "inputs/gone.zip", "archive": "zip", "members": 9},
              {"input": "inputs/a.log", "archive": ["zip"]}]
    paths = {"inputs/a.log": b"x" * 1000, "inputs/d.tar.gz": tgz, "inputs/d.zip": zp,
             **_documents(inputs, sources)}
    view = _view(_Files(), paths, POINTERS)
    stored = sum(len(d) for d in paths.values())
    assert reading_bound(view, 1 << 40) == stored + 200 * len(tgz) + 100 * CHECK_CHUNK


def test_the_reading_bound_reads_nothing_once_the_stored_bytes_are_over() -> None:
    """A big case (an imported record can be 128 MiB) is planned off the loop without its
    documents parsed on the loop first."""
    paths = {"inputs/big.log": b"x" * 5000, "case/intake.json": b"{not json",
             "case/catalogue.json": b"{not json"}
    view = _view(_Files(), paths, POINTERS)
    assert reading_bound(view, 4000) == sum(len(d) for d in paths.values())
    with pytest.raises(HistoryProblem):  # read, had it not stopped
        reading_bound(view, 1 << 20)


def test_the_streams_of_one_opener_share_the_chunks_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import engine._phases._view as view_module

    hashed: list[int] = []
    digest = view_module._chunk_digest
    monkeypatch.setattr(view_module, "_chunk_digest",
                        lambda chunk: hashed.append(len(chunk)) or digest(chunk))
    data = bytes(range(256)) * (4 * CHECK_CHUNK // 256)
    opener = _view(_Files(), {"a": data}).checked_opener("a")
    assert len(hashed) == 4
    with opener() as first, opener() as second:
        first.seek(2 * CHECK_CHUNK)
        assert first.read(10) == data[2 * CHECK_CHUNK:2 * CHECK_CHUNK + 10]
        second.seek(2 * CHECK_CHUNK + 100)
        assert second.read(10) == data[2 * CHECK_CHUNK + 100:2 * CHECK_CHUNK + 110]
    with opener() as third:  # after every stream was closed
        third.seek(2 * CHECK_CHUNK + 5)
        assert third.read(3) == data[2 * CHECK_CHUNK + 5:2 * CHECK_CHUNK + 8]
    assert len(hashed) == 5  # the check's 4, and chunk 2 once


def test_a_file_the_manifest_misstates_or_lacks_is_a_history_problem() -> None:
    files = _Files()
    data = b"y" * (CHECK_CHUNK + 10)
    view = _view(files, {"a": data})
    sha = view.manifest.files["a"].sha256
    for size in (len(data) + 10, 1000):
        misstated = attrs.evolve(view.manifest, files={"a": FileEntry(sha, size)})
        with pytest.raises(HistoryProblem, match=f"holds 65546 bytes, not the {size}"):
            attrs.evolve(view, manifest=misstated).checked_opener("a")
    with pytest.raises(HistoryProblem, match="not in generation"):
        view.checked_opener("missing")
