"""The store as an interface: snapshots bound to one generation, durable status set with the
generation that causes it and indexed by due time, and batch planning as a pure function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import open_store
from engine import (
    BytesSource,
    CaseExists,
    CaseStatus,
    Change,
    ChangeRejected,
    HistoryConflict,
    ImportRejected,
    ImportRequest,
    Manifest,
    PlanInput,
    Published,
    PublishRequest,
    StaleGeneration,
    StatusRequest,
    StorageError,
    build_manifest,
    new_package_id,
    plan_batch,
)
from tests.store_helpers import create, open_ro, open_rw

pytestmark = pytest.mark.usefixtures("backend")


class TestSnapshot:
    async def test_reads_come_from_one_generation(self, tmp_path: Path) -> None:
        """A snapshot reads its own generation's bytes even after the case moved on, and
        publishing through a stale snapshot is refused (StaleGeneration), writing nothing."""
        async with open_store(tmp_path / "s") as store:
            await store.publish(create("S-1", b"v1"))
            old = await store.snapshot("S-1")
            newer = await old.publish(Change(files={"notes/n.txt": BytesSource.of(b"n1")}))
            assert newer.generation == 2
            assert not old.has("notes/n.txt") and newer.has("notes/n.txt")
            assert await old.read("inputs/a.bin") == b"v1"
            with pytest.raises(StaleGeneration):
                await old.publish(Change(files={"notes/n.txt": BytesSource.of(b"n2")}))
            head = await store.snapshot("S-1")
            assert head.generation == 2 and await head.read("notes/n.txt") == b"n1"

    async def test_status_is_set_atomically_with_its_generation(self, tmp_path: Path) -> None:
        """A publication carrying a status sets both in one transaction; a status request
        on a stale generation is refused and changes nothing."""
        async with open_store(tmp_path / "s") as store:
            await store.publish(create("ST-1"))
            snap = await store.snapshot("ST-1")
            due = 1_900_000_000.0
            status = CaseStatus(status="RETRY_PENDING", phase="INTERPRETING_CASE",
                                reason="providers_unavailable", round=2, max_rounds=10,
                                due_at=due, attempt_id="default")
            moved = await snap.publish(Change(files={"notes/r.json": BytesSource.of(b"{}")},
                                              phase="INTERPRETING_CASE"), status)
            ref = await store.case("ST-1")
            assert ref.generation == moved.generation and ref.status == status
            with pytest.raises(StaleGeneration):
                await snap.set_status(CaseStatus(status="COMPLETED", phase="INTAKE"))
            assert (await store.case("ST-1")).status == status
            await moved.set_status(CaseStatus(status="BLOCKED", phase="INTERPRETING_CASE",
                                              reason="rounds_exhausted"))
            after = await store.case("ST-1")
            assert after.status is not None and after.status.status == "BLOCKED"
            assert after.generation == moved.generation  # a status alone is no generation

    async def test_the_due_index_orders_work(self, tmp_path: Path) -> None:
        """due_cases returns READY cases and RETRY_PENDING ones whose time has come,
        earliest first; later ones and finished ones are not work."""
        async with open_store(tmp_path / "s") as store:
            for i, (status, due) in enumerate([("READY", None), ("RETRY_PENDING", 200.0),
                                               ("RETRY_PENDING", 100.0),
                                               ("RETRY_PENDING", 900.0),
                                               ("COMPLETED", None), ("BLOCKED", None)]):
                out = await store.publish(create(f"D-{i}"))
                await store.snapshot_of(out).set_status(CaseStatus(
                    status=status, phase="INTAKE", due_at=due))
        store2 = open_ro(tmp_path / "s")
        assert [r.case_id for r in store2.due_cases(now=500.0, limit=10)] == ["D-2", "D-1",
                                                                                "D-0"]
        assert store2.next_due() == 100.0
        assert store2.status_counts()[("INTAKE", "RETRY_PENDING")] == 3
        store2.close()

    def test_statuses_are_validated(self) -> None:
        """A status outside the contract, or a non-finite due time, is refused."""
        with pytest.raises(ChangeRejected):
            CaseStatus(status="DONE", phase="INTAKE")
        with pytest.raises(ChangeRejected):
            CaseStatus(status="RETRY_PENDING", phase="INTAKE", due_at=float("nan"))


def _manifest(case: str, files: dict[str, bytes]) -> Manifest:
    return build_manifest(None, new_package_id(), case, Change(
        files={p: BytesSource.of(d) for p, d in files.items()}, phase="INTAKE"),
        "2026-12-01T00:00:00.000000Z")


class TestPlanIsPure:
    """plan_batch is a function of its inputs: no store, no SQL, no file."""

    def test_a_plan_from_plain_values(self) -> None:
        parent = _manifest("P-1", {"inputs/a": b"a"})
        req_ok = PublishRequest(parent.package_id, "P-1", 1, Change(
            files={"notes/b": BytesSource.of(b"b")}))
        req_stale = PublishRequest(parent.package_id, "P-1", 1, Change())
        req_new = create("P-2", b"c")
        req_status = StatusRequest(parent.package_id, "P-1", 2, CaseStatus(
            status="COMPLETED", phase="INTAKE"))
        from engine._store._plan import Head

        rows = plan_batch(PlanInput(
            requests=[req_ok, req_stale, req_new, req_status],
            heads={parent.package_id: Head("P-1", 1, None)}, owners={"P-1": parent.package_id},
            parents={parent.package_id: parent}, histories={}, refused=[None] * 4,
            inline={src.sha256: src.data for r in (req_ok, req_new)
                    for src in r.change.files.values()},  # type: ignore[attr-defined]
            inline_threshold=1024, now="2026-12-01T00:00:01.000000Z"))
        assert [type(o).__name__ for o in rows.outcomes] == ["Published", "StaleGeneration",
                                                             "Published", "Published"]
        assert [(g.package_id == parent.package_id, g.generation) for g in rows.generations] \
            == [(True, 2), (False, 1)]
        final = rows.refs[parent.package_id]
        assert final.generation == 2 and final.status is not None
        assert final.status.status == "COMPLETED"
        assert isinstance(rows.outcomes[0], Published)
        assert rows.outcomes[0].manifest.files["inputs/a"] == parent.files["inputs/a"]

    def test_the_plan_module_does_no_io(self) -> None:
        """The planner imports nothing that reaches a database or the file system."""
        import engine._store._plan as plan

        source = Path(plan.__file__).read_text()
        for word in ("sqlite3", "open(", "Path(", "os."):
            assert word not in source, word


def test_a_new_package_cannot_take_a_case_the_same_batch_publishes_to(
        tmp_path: Path) -> None:
    """A case's owner is looked up only for requests that create a package; a request in
    the same batch that publishes to the owner's package must not hide it."""
    store = open_rw(tmp_path / "s")
    try:
        first = create("OWNED-1")
        [made] = store.commit_batch([first])
        assert not isinstance(made, Exception), made
        onto = PublishRequest(first.package_id, "OWNED-1", made.generation,
                              Change(files={"work/w.txt": BytesSource.of(b"w")}))
        taker = create("OWNED-1")
        outs = store.commit_batch([onto, taker])
        assert not isinstance(outs[0], Exception), outs[0]
        assert isinstance(outs[1], CaseExists)
        assert store.case("OWNED-1").generation == made.generation + 1
    finally:
        store.close()


def test_an_import_is_what_its_manifests_bytes_say(tmp_path: Path) -> None:
    """``Manifest`` and ``ImportRequest`` can be built by hand (the embedding API): an
    imported manifest whose fields are not those of its own bytes, or whose bytes no parse
    accepts, is refused; the genuine one is imported, and later publications build on it."""
    import attrs as attrs_

    payload = BytesSource.of(b"imported")
    good = build_manifest(None, "pkg-imported", "IMP-1", Change(
        files={"inputs/a.txt": payload}, phase="INTAKE"), "2026-12-01T00:00:00Z")
    forged = attrs_.evolve(good, package_id="../bad id")  # raw still says pkg-imported
    store = open_rw(tmp_path / "s")
    try:
        for bad in (forged, attrs_.evolve(good, phase="HYPOTHESES"),
                    attrs_.evolve(good, raw=good.raw.replace(b"pkg-imported", b"../bad id!"))):
            [out] = store.commit_batch([ImportRequest(
                bad.package_id, "IMP-1", (bad,), {payload.sha256: payload})])
            assert isinstance(out, ImportRejected), out
        [out] = store.commit_batch([ImportRequest(
            "pkg-imported", "IMP-1", (good,), {payload.sha256: payload})])
        assert isinstance(out, Published), out
        [nxt] = store.commit_batch([PublishRequest("pkg-imported", "IMP-1", 1, Change(
            files={"work/w.txt": BytesSource.of(b"w")}))])
        assert isinstance(nxt, Published) and nxt.generation == 2, nxt
    finally:
        store.close()


def test_a_package_of_another_case_is_a_history_conflict_not_a_retry(tmp_path: Path) -> None:
    """A publication, status or import naming a package that belongs to another case can
    never succeed on retry: it is ``package_mismatch`` (not ``stale_generation``, whose hint
    says retry) and writes nothing; the request beside it in the batch still commits."""
    store = open_rw(tmp_path / "s")
    try:
        first = store.commit_batch([PublishRequest(new_package_id(), "OWNER-1", None, Change(
            files={"inputs/a.txt": BytesSource.of(b"a")}, phase="INTAKE"))])[0]
        assert isinstance(first, Published), first
        pkg = first.package_id
        g1 = store.generations(pkg)[0]
        wrong = [
            PublishRequest(pkg, "OTHER-1", 1, Change(files={"work/b.txt": BytesSource.of(
                b"b")})),
            StatusRequest(pkg, "OTHER-1", 1, CaseStatus(status="READY", phase="INTAKE")),
            ImportRequest(pkg, "OTHER-1", (g1,), {}),
        ]
        fine = PublishRequest(pkg, "OWNER-1", 1, Change(files={"work/c.txt": BytesSource.of(
            b"c")}))
        outs = store.commit_batch([*wrong, fine])
        for out in outs[:3]:
            assert isinstance(out, HistoryConflict), out
            assert out.reason == "package_mismatch" and "retry" not in out.hint, out
        assert isinstance(outs[3], Published) and outs[3].generation == 2, outs[3]
        assert [c.case_id for c in store.list_cases()] == ["OWNER-1"]
    finally:
        store.close()


def test_a_shorter_export_that_diverges_is_diverged_not_older(tmp_path: Path) -> None:
    """The store holds generations 1-3; an export of 2 generations whose second differs is
    a divergence (history_diverged), not an older copy (older_history, whose hint says the
    store already has it): the shared generations are compared before the lengths."""
    a, b, c = (BytesSource.of(x) for x in (b"a", b"b", b"c"))
    change1 = Change(files={"inputs/a.txt": a}, phase="INTAKE")
    g1 = build_manifest(None, "pkg-short", "SHORT-1", change1, "2026-12-01T00:00:00Z")
    g2 = build_manifest(g1, "pkg-short", "SHORT-1", Change(files={"work/b.txt": b}),
                        "2026-12-01T00:00:01Z")
    g3 = build_manifest(g2, "pkg-short", "SHORT-1", Change(files={"work/c.txt": c}),
                        "2026-12-01T00:00:02Z")
    other2 = build_manifest(g1, "pkg-short", "SHORT-1", Change(files={"work/c.txt": c}),
                            "2026-12-01T00:00:01Z")
    blobs = {s.sha256: s for s in (a, b, c)}
    store = open_rw(tmp_path / "s")
    try:
        [first] = store.commit_batch([ImportRequest("pkg-short", "SHORT-1", (g1, g2, g3),
                                                    blobs)])
        assert isinstance(first, Published), first
        diverged, older = store.commit_batch([
            ImportRequest("pkg-short", "SHORT-1", (g1, other2), blobs),
            ImportRequest("pkg-short", "SHORT-1", (g1, g2), blobs)])
        assert isinstance(diverged, HistoryConflict), diverged
        assert diverged.reason == "history_diverged", diverged
        assert isinstance(older, HistoryConflict) and older.reason == "older_history", older
        assert store.case("SHORT-1").generation == 3
    finally:
        store.close()


@pytest.mark.parametrize(("first", "second", "second_is"), [
    (1, 1, "same"), (1, 2, "ahead"), (2, 1, "stale"), (2, 2, "same"), (0, 2, "diverged")])
def test_requests_of_one_batch_build_on_the_histories_before_them(
        tmp_path: Path, first: int, second: int, second_is: str) -> None:
    """Two requests for one new package in one batch: the second sees the history the
    first writes (0: the first is a publication, whose generation 1 has the store's time
    and so differs from the export's). An identical import is a no-op, a longer one
    appends, a shorter or diverged one is stale; none is a false ``store_corrupt`` (the
    second was checked against the history as it was before the batch: empty)."""
    a, b = BytesSource.of(b"imported"), BytesSource.of(b"second")
    change1 = Change(files={"inputs/a.txt": a}, phase="INTAKE")
    g1 = build_manifest(None, "pkg-twice", "TWICE-1", change1, "2026-12-01T00:00:00Z")
    g2 = build_manifest(g1, "pkg-twice", "TWICE-1", Change(files={"work/b.txt": b}),
                        "2026-12-01T00:00:01Z")
    blobs = {a.sha256: a, b.sha256: b}
    gens = (g1, g2)
    requests: list[Any] = [
        PublishRequest("pkg-twice", "TWICE-1", None, change1) if first == 0 else
        ImportRequest("pkg-twice", "TWICE-1", gens[:first], blobs),
        ImportRequest("pkg-twice", "TWICE-1", gens[:second], blobs)]
    store = open_rw(tmp_path / "s")
    try:
        one, two = store.commit_batch(requests)
        assert isinstance(one, Published), one
        if second_is == "stale":
            assert isinstance(two, HistoryConflict) and two.reason == "older_history", two
        elif first == 0:
            # The publication's generation 1 has its own time, so the export diverges
            # from it at generation 1: refused as a different history, not as damage.
            assert isinstance(two, HistoryConflict) and two.reason == "history_diverged", two
        else:
            assert isinstance(two, Published), two
            assert two.generation == max(first, second)
        want = 1 if first == 0 else max(first, second)
        assert store.case("TWICE-1").generation == want
        assert [g.generation for g in store.generations("pkg-twice")] == list(
            range(1, want + 1))
    finally:
        store.close()


def test_trio_cancellation_does_not_tear_a_status(tmp_path: Path) -> None:
    """A status publication cancelled while waiting still commits whole or not at all."""
    async def go() -> None:
        async with open_store(tmp_path / "s") as store:
            out = await store.publish(create("C-1"))
            with trio.CancelScope() as scope:
                scope.cancel()
                await store.snapshot_of(out).set_status(CaseStatus(status="ERROR",
                                                                   phase="INTAKE"))
    trio.run(go)
    store = open_rw(tmp_path / "s")
    status = store.case("C-1").status
    assert status is not None and status.status in ("READY", "ERROR")
    store.close()


class TestValuesNoBackendHolds:
    @pytest.mark.no_store
    @pytest.mark.parametrize("field", [
        {"phase": "INTAKE\x00"}, {"reason": "x\x1b[31m"}, {"attempt_id": "a" * 257},
        {"attempt_id": ""}, {"round": -1}, {"max_rounds": 2**63}, {"calls_started": 1.5},
        {"round": True}])
    def test_a_status_refuses_them_when_made(self, field: dict[str, object]) -> None:
        """Status words are printable and bounded, counts are 0..2**62: what every
        backend's columns hold, so no status fails the batch it is committed in."""
        base: dict[str, object] = {"status": "READY", "phase": "INTAKE"}
        with pytest.raises(ChangeRejected):
            CaseStatus(**(base | field))  # type: ignore[arg-type]

    @pytest.mark.no_store
    def test_a_status_word_is_refused_for_each_unprintable_class_and_only_for_those(
            self) -> None:
        """Each edge of what a status word may not hold (C0 controls, DEL and the C1
        controls, lone surrogates) is refused; the code points just beside them are
        kept."""
        refused = ["\x00", "\x1f", "\x7f", "\x80", "\x9f", "\ud800", "\udfff"]
        kept = [" ", "~", "\xa0", "\ud7ff", "\ue000", "\U0010ffff"]
        for ch in refused:
            with pytest.raises(ChangeRejected):
                CaseStatus(status="READY", phase="INTAKE", reason=f"a{ch}b")
        for ch in kept:
            assert CaseStatus(status="READY", phase="INTAKE",
                              reason=f"a{ch}b").reason == f"a{ch}b"

    def test_one_value_the_database_refuses_fails_only_its_request(
            self, tmp_path: Path) -> None:
        """Past every check (validators switched off, as a bug would), a count no 64-bit
        column holds: its request is refused (invalid_change), the other request of the
        same batch commits."""
        store = open_rw(tmp_path / "s")
        try:
            a, b = store.commit_batch([create("N-1"), create("N-2")])
            with attrs.validators.disabled():
                huge = CaseStatus(status="READY", phase="INTAKE", round=2**70)
            out = store.commit_batch([
                PublishRequest(a.package_id, "N-1", 1, Change(
                    files={"notes/a": BytesSource.of(b"a")}), huge),
                PublishRequest(b.package_id, "N-2", 1, Change(
                    files={"notes/b": BytesSource.of(b"b")}))])
            assert isinstance(out[0], ChangeRejected) and out[0].reason == "invalid_change"
            assert isinstance(out[1], Published)
            assert store.case("N-1").generation == 1 and store.case("N-2").generation == 2
        finally:
            store.close()

    def test_a_blob_folder_that_cannot_be_written_is_the_stores_fault(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A full disk under the blob folder refuses the publication as store_unavailable
        (never input_changed: the input is fine); the index is unchanged."""
        import errno

        import engine._store._blobs as blobs

        store = open_rw(tmp_path / "s")
        try:
            def full(_fd: int) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(blobs.os, "fsync", full)
            big = PublishRequest(new_package_id(), "FULL-1", None, Change(
                files={"inputs/big.bin": BytesSource.of(b"z" * 300_000)}, phase="INTAKE"))
            out = store.commit_batch([big])[0]
            assert isinstance(out, StorageError) and out.reason == "store_unavailable"
            assert "No space left" in out.message
            monkeypatch.undo()
            assert store.list_cases() == []
        finally:
            store.close()


class TestSecondReview:
    # Status values no writer could have written: a control character in its reason, or
    # a due time no timestamp can show (status said internal_error, verify said ok).
    DAMAGE = (("reason", "imported\nx"), ("due_at", 1e308), ("due_at", -1e308),
              ("due_at", 1e13), ("due_at", -1.0), ("due_at", "abc"), ("due_at", b"\x00"))

    @pytest.mark.parametrize(("column", "value"), DAMAGE, ids=lambda v: repr(v))
    def test_a_damaged_status_row_still_lists_and_verify_names_it(
            self, tmp_path: Path, column: str, value: object, backend: str) -> None:
        """Such a row never makes every read of the index refuse: the case lists (also in
        ``viano status``), the others are due as before, and verify names the row."""
        if backend == "postgresql" and column == "due_at" and type(value) is not float:
            pytest.skip("a PostgreSQL double precision column holds no text or bytes")
        from engine import verify_store
        from tests.conftest import run_viano
        from tests.store_helpers import sql

        store = open_rw(tmp_path / "s")
        store.commit_batch([create("R-1"), create("R-2")])
        store.close()
        sql(tmp_path / "s", f"UPDATE refs SET {column} = ?, status = 'RETRY_PENDING' "
                            "WHERE case_id = 'R-1'", value)
        check = open_ro(tmp_path / "s")
        try:
            assert [c.case_id for c in check.list_cases()] == ["R-1", "R-2"]
            report = verify_store(check)
            assert not report.ok
            assert [v.case_id for v in report.violations] == ["R-1"]
            assert "status row is damaged" in report.violations[0].what
        finally:
            check.close()
        for args, shown in ((["status"], "R-1"), (["--json", "status"], "R-1"),
                            (["status", "--summary"], "RETRY_PENDING")):
            r = run_viano("--store", tmp_path / "s", *args)
            assert r.returncode == 0 and shown in r.stdout, (args, r.stderr)
        r = run_viano("--store", tmp_path / "s", "verify")
        assert r.returncode == 1 and "R-1" in r.stdout + r.stderr, r.stderr

    def test_committing_alone_after_a_refused_value_never_loses_an_outcome(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The one-by-one pass after a refused value: a request whose lone commit fails
        for another reason gets that error as its outcome; the requests committed before
        it keep theirs (nothing raised, nothing reported unwritten that was written)."""
        store = open_rw(tmp_path / "s")
        try:
            a, b, c = store.commit_batch([create("O-1"), create("O-2"), create("O-3")])
            with attrs.validators.disabled():
                huge = CaseStatus(status="READY", phase="INTAKE", round=2**70)
            reqs = [PublishRequest(x.package_id, x.case_id, 1, Change(
                files={"notes/n": BytesSource.of(x.case_id.encode())}), status)
                for x, status in ((a, None), (b, huge), (c, None))]
            real = store._commit

            def flaky(batch: list[Any]) -> list[Any]:
                if len(batch) == 1 and batch[0].case_id == "O-3":
                    raise StorageError("the disk went away (simulated)",
                                       reason="store_unavailable")
                return real(batch)

            monkeypatch.setattr(store, "_commit", flaky)
            out = store.commit_batch(reqs)
            assert isinstance(out[0], Published) and out[0].generation == 2
            assert isinstance(out[1], ChangeRejected)
            assert isinstance(out[2], StorageError) and out[2].reason == "store_unavailable"
            assert store.case("O-1").generation == 2 and store.case("O-3").generation == 1
        finally:
            store.close()

    @pytest.mark.no_store
    def test_a_status_word_with_a_lone_surrogate_is_refused(self) -> None:
        with pytest.raises(ChangeRejected):
            CaseStatus(status="READY", phase="INTAKE", attempt_id="a\udc80")
