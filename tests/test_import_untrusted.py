"""An export is untrusted input. A crafted one — with every hash recomputed so that only
the rule it breaks gives it away — is refused with invalid_export and nothing is written;
the same rules hold for what `verify` reads from the store, and `log` shows a removal."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from engine import artifact_json
from tests.conftest import VIANO, Cli, run_viano, snapshot
from tests.store_helpers import forge_generation

pytestmark = pytest.mark.usefixtures("backend")

Doc = dict[str, Any]


def _encode(m: Doc) -> bytes:
    return orjson.dumps(m, option=orjson.OPT_SORT_KEYS)


def _export(cli: Cli, sample: Path, tmp: Path) -> Path:
    a = tmp / "a"
    assert cli("intake", "--store", a, "--report", sample / "report.json", "--attach",
               f"diagnostics={sample / 'wowdiag.zip'}").code == 0
    out = tmp / "good.zip"
    assert cli("export", "--store", a, "BUG-20", out).code == 0
    return out


def _craft(good: Path, dest: Path, *, manifests: Callable[[list[Doc]], list[bytes]] | None = None,
           index: Callable[[Doc], bytes] | None = None) -> Path:
    """Rewrite an export: new manifest bytes and/or index, with the index's hashes made to
    match whatever manifests are written."""
    with zipfile.ZipFile(good) as zin:
        members = {n: zin.read(n) for n in zin.namelist()}
    docs = [json.loads(members[f"manifests/{i:06d}.json"]) for i in
            range(1, 1 + sum(n.startswith("manifests/") for n in members))]
    raws = manifests(docs) if manifests else [_encode(d) for d in docs]
    for n in [n for n in members if n.startswith("manifests/")]:
        del members[n]
    for i, raw in enumerate(raws, start=1):
        members[f"manifests/{i:06d}.json"] = raw
    idx = json.loads(members["viano-export.json"])
    idx["generations"] = [{"generation": i, "manifest_sha256": hashlib.sha256(r).hexdigest()}
                          for i, r in enumerate(raws, start=1)]
    members["viano-export.json"] = index(idx) if index else json.dumps(idx).encode()
    with zipfile.ZipFile(dest, "w") as zout:
        for name, data in members.items():
            zout.writestr(name, data)
    return dest


def _next(docs: list[Doc], **changes: Any) -> list[bytes]:
    """The good history plus one more generation with ``changes`` applied."""
    last = dict(docs[-1])
    new = {**last, "package_generation": last["package_generation"] + 1,
           "parent_generation": last["package_generation"],
           "created_at": "2026-12-01T00:00:00.000000Z", **changes}
    return [_encode(d) for d in docs] + [_encode(new)]


def _files_without(docs: list[Doc], prefix: str) -> dict[str, Any]:
    return {p: e for p, e in docs[-1]["files"].items() if not p.startswith(prefix)}


MANIFEST_ATTACKS: dict[str, Callable[[list[Doc]], list[bytes]]] = {
    "removes the originals": lambda d: _next(d, files=_files_without(d, "inputs/"),
                                             pointers={"catalogue": "case/catalogue.json",
                                                       "intake": "case/intake.json"}),
    "removes a pointer": lambda d: _next(d, pointers={"catalogue": "case/catalogue.json"}),
    "replaces a write-once original": lambda d: _next(d, files={
        **d[-1]["files"], "inputs/report.json": d[-1]["files"]["case/intake.json"]}),
    "terminal escape in the phase": lambda d: _next(d, phase="INTAKE\x1b[2J"),
    "negative revision": lambda d: _next(d, analysis_revision=-1),
    "revision goes back": lambda d: [_encode(dict(d[0], analysis_revision=2)),
                                     *_next(d, analysis_revision=1)[1:]],
    "bad pointer name": lambda d: _next(d, pointers={**d[-1]["pointers"], "Bad Name!":
                                                     "case/catalogue.json"}),
    "pointer to a missing file": lambda d: _next(d, pointers={**d[-1]["pointers"],
                                                              "ghost": "case/ghost.json"}),
    "non-string package id": lambda d: [_encode(dict(x, package_id=12345)) for x in d],
    "boolean generation": lambda d: [_encode(dict(d[0], package_generation=True))],
    "string size": lambda d: [_encode(dict(d[0], files={
        p: {**e, "size": str(e["size"])} for p, e in d[0]["files"].items()}))],
    "extra manifest key": lambda d: [_encode(dict(d[0], status="COMPLETED"))],
    "traversal in a path": lambda d: _next(d, files={**d[-1]["files"], "../evil": d[-1][
        "files"]["case/intake.json"]}),
    "not canonical (pretty-printed)": lambda d: [json.dumps(d[0], indent=2).encode()],
    "duplicate keys": lambda d: [_encode(d[0])[:-1] + b',"phase":"INTAKE"}'],
    "case id changes": lambda d: _next(d, case_id="OTHER-1"),
    # Revisions are reopen's (a planted later record made the case impossible to reopen:
    # its path is write-once; verify passed them all).
    "a later revision's record planted": lambda d: _next(d, files={
        **d[-1]["files"], "analysis/revisions/0002.json": d[-1]["files"]["case/intake.json"]}),
    "a record of revision 1": lambda d: _next(d, files={
        **d[-1]["files"], "analysis/revisions/0001.json": d[-1]["files"]["case/intake.json"]}),
    "revision raised without reopening": lambda d: _next(d, analysis_revision=2),
    "revision pointer at an original": lambda d: _next(d, pointers={
        **d[-1]["pointers"], "revision": "inputs/report.json"}),
    "a reopening whose record is not one": lambda d: _next(
        d, analysis_revision=2, phase="REOPENED",
        files={**d[-1]["files"],
               "analysis/revisions/0002.json": d[-1]["files"]["case/intake.json"]},
        pointers={**d[-1]["pointers"], "revision": "analysis/revisions/0002.json"}),
    # The phase changes only by entering a phase or reopening (an import set INTAKE on a
    # finished case, and status then said so).
    "phase flipped without entering it": lambda d: _next(d, phase="GENERATING_HYPOTHESES"),
    "REOPENED without a new revision": lambda d: _next(d, phase="REOPENED"),
    # (an embedding's own phase name is its business; INTAKE after it is not)
    "set back to INTAKE after a phase": lambda d: _next(
        [*d, json.loads(_next(d, phase="OWN_STEP")[-1])], phase="INTAKE"),
    "a 5000-digit revision": lambda d: [_encode(d[0]).replace(b'"analysis_revision":1',
                                                              b'"analysis_revision":'
                                                              + b"1" * 5000)],
}

INDEX_ATTACKS: dict[str, Callable[[Doc], bytes]] = {
    "index is a list": lambda i: json.dumps([i]).encode(),
    "generations is not a list": lambda i: json.dumps(dict(i, generations={"1": 1})).encode(),
    "generation is a string": lambda i: json.dumps(dict(i, generations=[
        dict(g, generation=str(g["generation"])) for g in i["generations"]])).encode(),
    "package id is a number": lambda i: json.dumps(dict(i, package_id=7)).encode(),
    "missing case id": lambda i: json.dumps({k: v for k, v in i.items()
                                             if k != "case_id"}).encode(),
    "extra key": lambda i: json.dumps(dict(i, extra=1)).encode(),
    "deep nesting": lambda i: json.dumps(dict(i, generations=i["generations"])).encode()[:-1]
    + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "duplicate keys": lambda i: json.dumps(i).encode()[:-1] + b', "case_id": "OTHER"}',
    "not JSON": lambda i: b"\xff\xfe not json",
    "NaN": lambda i: json.dumps(i).encode()[:-1] + b', "x": NaN}',
    "a 5000-digit generation": lambda i: json.dumps(dict(i, generations=[
        {**g, "generation": 0} for g in i["generations"]])).encode().replace(
        b'"generation": 0', b'"generation": ' + b"1" * 5000),
}


class TestCraftedExports:
    @pytest.mark.parametrize("attack", sorted(MANIFEST_ATTACKS))
    def test_manifest_attacks_are_refused(self, cli: Cli, sample: Path, tmp_path: Path,
                                          attack: str) -> None:
        good = _export(cli, sample, tmp_path)
        bad = _craft(good, tmp_path / "bad.zip", manifests=MANIFEST_ATTACKS[attack])
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2, (attack, r.out)
        assert r.json["error"]["reason"] == "invalid_export", (attack, r.json)  # type: ignore[index]
        assert not target.exists()

    @pytest.mark.parametrize("attack", sorted(INDEX_ATTACKS))
    def test_index_attacks_are_refused(self, cli: Cli, sample: Path, tmp_path: Path,
                                       attack: str) -> None:
        good = _export(cli, sample, tmp_path)
        bad = _craft(good, tmp_path / "bad.zip", index=INDEX_ATTACKS[attack])
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2, (attack, r.out)
        assert r.json["error"]["reason"] == "invalid_export", (attack, r.json)  # type: ignore[index]
        assert not target.exists()

    def test_an_attack_on_an_existing_package_writes_nothing(self, cli: Cli, sample: Path,
                                                             tmp_path: Path) -> None:
        """A crafted fast-forward of a package the store already has is refused and the
        store is unchanged."""
        good = _export(cli, sample, tmp_path)
        target = tmp_path / "target"
        assert cli("import", "--store", target, good).code == 0
        before = snapshot(target)
        bad = _craft(good, tmp_path / "bad.zip",
                     manifests=MANIFEST_ATTACKS["removes the originals"])
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2 and r.json["error"]["reason"] == "invalid_export"  # type: ignore[index]
        assert snapshot(target) == before

    def test_the_good_export_still_imports(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """The crafting helper itself changes nothing when no attack is applied."""
        good = _export(cli, sample, tmp_path)
        same = _craft(good, tmp_path / "same.zip")
        assert cli("import", "--store", tmp_path / "t", same).code == 0
        assert cli("verify", "--store", tmp_path / "t").code == 0


def test_a_history_given_another_case_id_is_refused(cli: Cli, sample: Path,
                                                    tmp_path: Path) -> None:
    """Every manifest and the index say case OTHER (every hash recomputed), the intake
    record, write-once, still says BUG-20: refused (it would have imported, and verified
    clean, as a case the originals do not belong to)."""
    good = _export(cli, sample, tmp_path)

    def renamed(docs: list[Doc]) -> list[bytes]:
        return [_encode({**d, "case_id": "OTHER"}) for d in docs]

    def index(idx: Doc) -> bytes:
        return json.dumps({**idx, "case_id": "OTHER"}).encode()

    bad = _craft(good, tmp_path / "renamed.zip", manifests=renamed, index=index)
    target = tmp_path / "target"
    r = cli("import", "--json", "--store", target, bad)
    assert r.code == 2, r.out
    error = r.json["error"]  # type: ignore[index]
    assert error["reason"] == "invalid_export" and "names case 'BUG-20'" in error["message"]
    assert not target.exists()


class TestHistories:
    def _advance(self, cli: Cli, store: Path, n: int) -> None:
        import trio

        from actors import open_store
        from engine import BytesSource, Change

        async def go() -> None:
            async with open_store(store) as handle:
                for i in range(n):
                    snap = await handle.snapshot("BUG-20")
                    await snap.publish(Change(files={f"notes/{i}.txt": BytesSource.of(
                        f"{store.name}:{i}".encode())}))

        trio.run(go)

    def test_a_shorter_history_is_refused(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """Importing an export older than what the store has is refused (older_history: a
        retry cannot help, so not stale_generation), the longer history kept."""
        a, b = tmp_path / "a", tmp_path / "b"
        assert cli("intake", "--store", a, "--report", sample / "report.json").code == 0
        assert cli("export", "--store", a, "BUG-20", tmp_path / "short.zip").code == 0
        self._advance(cli, a, 2)
        assert cli("export", "--store", a, "BUG-20", tmp_path / "long.zip").code == 0
        assert cli("import", "--store", b, tmp_path / "long.zip").code == 0
        before = snapshot(b)
        r = cli("import", "--json", "--store", b, tmp_path / "short.zip")
        assert r.code == 2 and r.json["error"]["reason"] == "older_history"  # type: ignore[index]
        assert "retry" not in r.json["error"]["hint"]  # type: ignore[index]
        assert snapshot(b) == before

    def test_a_diverged_history_is_refused(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """Two stores that share generation 1 of a package and then diverge: importing one
        into the other is refused and writes nothing."""
        a, b = tmp_path / "a", tmp_path / "b"
        assert cli("intake", "--store", a, "--report", sample / "report.json").code == 0
        assert cli("export", "--store", a, "BUG-20", tmp_path / "base.zip").code == 0
        assert cli("import", "--store", b, tmp_path / "base.zip").code == 0
        self._advance(cli, a, 1)
        self._advance(cli, b, 1)
        assert cli("export", "--store", a, "BUG-20", tmp_path / "a.zip").code == 0
        before = snapshot(b)
        r = cli("import", "--json", "--store", b, tmp_path / "a.zip")
        assert r.code == 2 and r.json["error"]["reason"] == "history_diverged"  # type: ignore[index]
        assert "retry" not in r.json["error"]["hint"]  # type: ignore[index]
        assert "different history" in r.json["error"]["message"]  # type: ignore[index]
        assert snapshot(b) == before


class TestVerifyAndLogSeeTheSameRules:
    def test_a_removal_in_the_store_is_a_violation_and_log_lists_it(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """A generation that drops the originals, written behind the store's back with a
        correct hash: verify reports it and log shows the removal."""
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        m = json.loads(cli("show", "--store", store, "BUG-20", "--json").out)
        m2 = dict(m, package_generation=2, parent_generation=1,
                  created_at="2026-12-01T00:00:00.000000Z",
                  files=_files_without([m], "inputs/"),
                  pointers={"catalogue": "case/catalogue.json", "intake": "case/intake.json"})
        raw = _encode(m2)
        forge_generation(store, m["package_id"], 2, raw, "INTAKE", m2["created_at"])
        r = cli("verify", "--store", store, "--json")
        assert r.code == 1
        assert any("removes file(s) inputs/report.json" in v["violation"]
                   for v in r.json["violations"])  # type: ignore[index]
        log = cli("log", "--store", store, "BUG-20", "--json").json
        assert log["generations"][1]["removed"] == ["inputs/report.json"]  # type: ignore[index]
        assert "REMOVED inputs/report.json" in cli("log", "--store", store, "BUG-20").out


class TestPhaseHistories:
    """An export whose phase artifacts break verify's phase checks (ids rewritten with
    every hash recomputed, a confirmation nobody gave) is refused before anything is
    written: it imported with exit 0 and verify then failed for good."""

    @staticmethod
    def _analysed(cli: Cli, sample: Path, tmp: Path) -> Path:
        cfg = tmp / "c.toml"
        cfg.write_text(f'[[providers]]\nname = "fx"\nkind = "fixture"\n'
                       f'path = "{sample / "fixtures"}"\n'
                       "[interpretation]\nauto_confirm = true\n")
        store = tmp / "a"
        assert cli("intake", "--store", store, "--report", sample / "report.json", "--attach",
                   f"diagnostics={sample / 'wowdiag.zip'}").code == 0
        r = cli("batch", "--all", "--store", store, "--config", cfg)
        assert r.code == 0, r.out
        out = tmp / "analysed.zip"
        assert cli("export", "--store", store, "BUG-20", out).code == 0
        return out

    def test_a_history_verify_would_report_is_not_imported(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        good = self._analysed(cli, sample, tmp_path)
        other = "11111111-2222-4333-8444-555555555555"

        def rename(docs: list[Doc]) -> list[bytes]:
            return [_encode({**d, "package_id": other}) for d in docs]

        def reindex(idx: Doc) -> bytes:
            return json.dumps({**idx, "package_id": other}).encode()

        forged = _craft(good, tmp_path / "forged.zip", manifests=rename, index=reindex)
        dest = tmp_path / "dest"
        assert cli("intake", "--store", dest, "--report", sample / "report.json",
                   "--case-id", "OTHER-1").code == 0
        before = snapshot(dest)
        r = cli("import", "--store", dest, forged, "--json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "invalid_export", r.out  # type: ignore[index]
        assert "phase checks" in r.out, r.out
        assert snapshot(dest) == before  # nothing written
        assert cli("verify", "--store", dest).code == 0
        # The genuine export, phases and all, still imports and verifies.
        ok = cli("import", "--store", dest, good, "--json")
        assert ok.code == 0, ok.out
        assert cli("verify", "--store", dest).code == 0


def _with_file(good: Path, dest: Path, path: str, edit: Callable[[Doc], Doc]) -> Path:
    """An export whose ``path`` (a JSON document) is ``edit``-ed, in every generation that
    holds it, with the blob and every hash made to match."""
    with zipfile.ZipFile(good) as z:
        docs = [json.loads(z.read(n)) for n in sorted(z.namelist())
                if n.startswith("manifests/")]
        old = next(d["files"][path] for d in reversed(docs) if path in d["files"])
        data = artifact_json(edit(json.loads(z.read(f"blobs/{old['sha256']}"))))
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    crafted = _craft(good, dest, manifests=lambda ds: [_encode(
        {**d, "files": {**d["files"], path: entry}} if path in d["files"] else d)
        for d in ds])
    with zipfile.ZipFile(crafted) as z:
        members = {n: z.read(n) for n in z.namelist()}
    used = {e["sha256"] for n, raw in members.items() if n.startswith("manifests/")
            for e in json.loads(raw)["files"].values()}
    members = {n: b for n, b in members.items()
               if not n.startswith("blobs/") or n[6:] in used}  # the old one, if unused
    members[f"blobs/{entry['sha256']}"] = data
    with zipfile.ZipFile(crafted, "w") as z:
        for name, b in members.items():
            z.writestr(name, b)
    return crafted


class TestAnalysedPhaseFlips(TestPhaseHistories):
    @pytest.mark.parametrize("phase", ["INTAKE", "INTERPRETING_CASE"])
    def test_a_finished_case_set_back_to_an_earlier_phase_is_refused(
            self, cli: Cli, sample: Path, tmp_path: Path, phase: str) -> None:
        good = self._analysed(cli, sample, tmp_path)
        forged = _craft(good, tmp_path / "forged.zip",
                        manifests=lambda docs: _next(docs, phase=phase))
        r = cli("import", "--store", tmp_path / "dest", forged, "--json")
        assert r.code == 2, r.out
        assert "without entering it" in r.out, r.out
        assert cli("import", "--store", tmp_path / "ok", good).code == 0
        assert cli("verify", "--store", tmp_path / "ok").code == 0


class TestWhoAndWhenARecordSays(TestPhaseHistories):
    """A confirmation's "by" and "at" were checked only for being strings: an import
    could record a policy's name no policy has ("policy:evil" with a right-to-left
    override) or a time that is none, and verify passed it."""

    @pytest.mark.parametrize("field, value", [
        ("confirmed_by", "\x1b[2Jroot"), ("confirmed_by", "x" * 129), ("confirmed_by", ""),
        ("confirmed_by", 7), ("confirmed_at", "1999-99-99T99:99:99Z"),
        ("confirmed_at", "\u0662\u0660\u0662\u0666-12-04T01:27:49Z"),
        ("confirmed_at", "2026-02-30T00:00:00Z"), ("confirmed_at", "yesterday")])
    def test_a_confirmation_viano_would_not_write_is_refused(
            self, cli: Cli, sample: Path, tmp_path: Path, field: str, value: Any) -> None:
        good = self._analysed(cli, sample, tmp_path)
        path = "analysis/interpretation/0001/confirmation.json"
        forged = _with_file(good, tmp_path / "forged.zip", path,
                            lambda doc: {**doc, field: value})
        r = cli("import", "--store", tmp_path / "dest", forged, "--json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "invalid_export", r.out  # type: ignore[index]
        assert f"the confirmation's {field}" in r.out, r.out

    @pytest.mark.parametrize("name", ["policy:ops-bot", "\u200b", "policy:evil\u202e",
                                      "root", "policy:auto_confirm"])
    def test_a_name_an_earlier_viano_recorded_still_imports(
            self, cli: Cli, sample: Path, tmp_path: Path, name: str) -> None:
        """--by took these before its rules grew (policy: names, blank ones, direction
        changes); a history that holds one stays valid, however --by reads now."""
        good = self._analysed(cli, sample, tmp_path)
        path = "analysis/interpretation/0001/confirmation.json"
        kept = _with_file(good, tmp_path / "kept.zip", path,
                          lambda doc: {**doc, "confirmed_by": name})
        r = cli("import", "--store", tmp_path / "ok", kept, "--json")
        assert r.code == 0, r.out
        assert cli("verify", "--store", tmp_path / "ok").code == 0


def _intake_edit(label: str) -> Callable[[list[Doc]], list[bytes]]:
    """A rewrite of a sample export's history, every hash made to match, that no intake
    could have written (what each breaks is in its label)."""
    def edit(docs: list[Doc]) -> list[bytes]:
        first = dict(docs[0])
        report = first["files"]["inputs/report.json"]
        if label == "no pointers":
            first["pointers"] = {}
        elif label == "catalogue points at the report":
            first["pointers"] = {**first["pointers"], "catalogue": "inputs/report.json"}
        elif label == "revision 2 at generation 1":
            first["analysis_revision"] = 2
        elif label == "a phase's name at generation 1":
            first["phase"] = "GENERATING_HYPOTHESES"
        elif label == "an original the record does not list":
            first["files"] = {**first["files"], "inputs/extra.bin": report}
        elif label == "a file intake never writes":
            first["files"] = {**first["files"], "work/notes.txt": report}
        elif label == "an original added later":
            return _next(docs, files={**docs[-1]["files"], "inputs/late.bin": report})
        elif label == "the intake pointer moved later":
            return _next(docs, pointers={**docs[-1]["pointers"],
                                         "intake": "inputs/report.json"})
        else:
            raise AssertionError(label)
        return [_encode(first), *(_encode(d) for d in docs[1:])]
    return edit


INTAKE_EDITS = ["no pointers", "catalogue points at the report", "revision 2 at generation 1",
                "a phase's name at generation 1", "an original the record does not list",
                "a file intake never writes", "an original added later",
                "the intake pointer moved later"]


class TestTheIntakeGeneration:
    """A case begins as intake made it: generation 1 is INTAKE at revision 1, holding its
    originals and the two case documents its pointers name, and its originals are exactly
    those its intake record lists. Each of these imported with exit 0 and verify said ok;
    the phases then refused the case (no catalogue), or ran it at revision 2 with no
    revision 1, or over an original no record lists."""

    @pytest.mark.parametrize("label", INTAKE_EDITS)
    def test_import_refuses_it_and_verify_reports_it(self, cli: Cli, sample: Path,
                                                     tmp_path: Path, label: str) -> None:
        from tests.conftest import run_viano
        from tests.store_helpers import import_refused_then_placed

        good = _export(cli, sample, tmp_path)
        forged = _craft(good, tmp_path / "forged.zip", manifests=_intake_edit(label))
        dest = tmp_path / "dest"
        r = cli("import", "--store", dest, forged, "--json")
        assert r.code == 2, (label, r.out)
        assert r.json["error"]["reason"] == "invalid_export", r.out  # type: ignore[index]
        assert not dest.exists() or cli("status", "--json", "--store", dest).json == []
        placed = tmp_path / "placed"
        import_refused_then_placed(forged, placed, run_viano)
        v = cli("verify", "--store", placed, "--json")
        assert v.code == 1, (label, v.out)
        assert v.json["cases_affected"] == ["BUG-20"], v.out  # type: ignore[index]

    def test_the_genuine_export_and_a_store_api_package_pass(self, cli: Cli, sample: Path,
                                                             tmp_path: Path) -> None:
        """The rules bind what says it is an intake's case; a package of the store's own
        API, with no intake pointer, case document or phase artifact, is not held to
        them."""
        from engine import BytesSource, Change, PublishRequest, new_package_id
        from tests.store_helpers import open_rw

        good = _export(cli, sample, tmp_path)
        dest = tmp_path / "dest"
        assert cli("import", "--store", dest, good).code == 0
        store = open_rw(dest)
        try:
            [out] = store.commit_batch([PublishRequest(new_package_id(), "RAW-1", None, Change(
                files={"inputs/a.bin": BytesSource.of(b"a"), "work/b": BytesSource.of(b"b")},
                phase="INTAKE"))])
            assert not isinstance(out, Exception), out
        finally:
            store.close()
        assert cli("verify", "--store", dest).code == 0


class TestRevisionLimit:
    """A revision's artifacts live under four-digit folders, so 9999 is the last revision:
    a larger one in an export is refused (it imported with exit 0, and the next batch wrote
    folders verify could not audit; at 2**62 verify spun for minutes), and reopening a
    case at 9999 is refused with nothing written."""

    def _at(self, cli: Cli, sample: Path, tmp: Path, revision: int) -> Path:
        good = _export(cli, sample, tmp)
        # Generation 1 stays the intake it was (revision 1); a second one is at revision.
        return _craft(good, tmp / f"r{revision}.zip",
                      manifests=lambda docs: _next(docs, analysis_revision=revision))

    @pytest.mark.parametrize("revision", [10_000, 100_000, 2**62])
    def test_a_revision_past_the_last_is_not_imported(
            self, cli: Cli, sample: Path, tmp_path: Path, revision: int) -> None:
        r = cli("import", "--store", tmp_path / "dest", self._at(cli, sample, tmp_path,
                                                                  revision), "--json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "invalid_export", r.out  # type: ignore[index]
        assert "analysis_revision" in r.out, r.out

    def test_a_store_that_took_a_later_revision_stays_readable(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """A store that took revision 10000 before the limit (an import by an older Viano,
        here put in by the store's own rules) still reads: show and gc work, verify reports
        the case only; the limit stops new revisions, not reading old ones."""
        from engine import BytesSource, ImportRequest, Manifest, Published
        from tests.store_helpers import open_rw

        forged = self._at(cli, sample, tmp_path, 10_000)
        r = cli("import", "--store", tmp_path / "d", forged)
        assert r.code == 2, r.out
        with zipfile.ZipFile(forged) as z:
            names = sorted(n for n in z.namelist() if n.startswith("manifests/"))
            manifests = tuple(Manifest.parse(z.read(n)) for n in names)
            blobs = {n.removeprefix("blobs/"): BytesSource.of(z.read(n))
                     for n in z.namelist() if n.startswith("blobs/")}
        dest = tmp_path / "old"
        store = open_rw(dest)
        try:
            [out] = store.commit_batch([ImportRequest(manifests[0].package_id, "BUG-20",
                                                      manifests, blobs)])
            assert isinstance(out, Published) and out.manifest.analysis_revision == 10_000
        finally:
            store.close()
        assert cli("show", "BUG-20", "--store", dest).code == 0
        assert cli("gc", "--store", dest, "--min-age", "0").code == 0

    def test_the_last_revision_cannot_be_reopened(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """A case at revision 9999 (its 9,998 reopenings stood in for by one generation,
        which import refuses for the records it lacks, put in by the store's own rules):
        reopen refuses, with nothing written."""
        from tests.store_helpers import import_refused_then_placed

        dest = tmp_path / "dest"
        import_refused_then_placed(self._at(cli, sample, tmp_path, 9999), dest, run_viano)
        before = snapshot(dest)
        r = cli("reopen", "BUG-20", "--reason", "again", "--store", dest, "--json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "revision_limit", r.out  # type: ignore[index]
        assert snapshot(dest) == before


class TestAnExportThatChangesWhileRead(TestPhaseHistories):
    @pytest.mark.parametrize("error", ["BadZipFile", "OSError", "EOFError"])
    def test_a_member_that_cannot_be_read_is_a_refusal(
            self, cli: Cli, sample: Path, tmp_path: Path, error: str,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """The zip replaced while import's phase checks read it: a refusal
        (input_changed, or a problem named), never an internal error (it was 'unexpected
        BadZipFile')."""
        import zipfile as zf

        from engine import ImportRejected, IntakeLimits
        from engine._phases import import_problems
        from engine._portable import read_export_structure

        request = read_export_structure(self._analysed(cli, sample, tmp_path),
                                        IntakeLimits())
        raised = {"BadZipFile": zf.BadZipFile("File is not a zip file"),
                  "OSError": OSError(5, "Input/output error"),
                  "EOFError": EOFError()}[error]

        class Gone:
            def __init__(self, sha: str, size: int):
                self.sha256, self.size = sha, size

            def open(self) -> Any:
                raise raised

        blobs: dict[str, Any] = {sha: Gone(src.sha256, src.size)
                                 for sha, src in request.blobs.items()}
        import engine._phases._view as view

        # Nothing read before (the export, in this process) may answer from the cache.
        monkeypatch.setattr(view, "DOCUMENTS", view._Documents())
        try:
            problems = import_problems(request.manifests, blobs)
        except ImportRejected as exc:
            assert exc.reason == "input_changed", exc
        else:
            assert problems, "a history whose blobs cannot be read passed the checks"


    def test_an_archive_whose_stream_fails_is_input_changed_not_a_history_problem(
            self, cli: Cli, sample: Path, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Only the stream of the case's archive fails (the zip replaced after its other
        blobs were read whole): import refuses with input_changed. The view turned every
        error a stream raised into a history problem, so an export changing under import
        read as an invalid history (a problem named: invalid_export), whose step is wrong."""
        import engine._phases._history as history
        import engine._phases._memo as memo
        import engine._phases._view as view
        from engine import ImportRejected, IntakeLimits
        from engine._phases import import_problems
        from engine._portable import read_export_structure

        request = read_export_structure(self._analysed(cli, sample, tmp_path),
                                        IntakeLimits())
        [manifest] = [m for m in request.manifests if m.package_generation == 1]
        archive = manifest.files["inputs/wowdiag.zip"].sha256

        class Failing(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, b: Any) -> int:
                raise OSError(5, "Input/output error")

        class Replaced:
            def __init__(self, source: Any):
                self.sha256, self.size = source.sha256, source.size

            def open(self) -> Any:
                return Failing()

        blobs: dict[str, Any] = dict(request.blobs)
        blobs[archive] = Replaced(blobs[archive])
        monkeypatch.setattr(view, "DOCUMENTS", view._Documents())
        # Nothing derived before (the export, in this process) may answer from memory.
        monkeypatch.setattr(history, "MEMO", memo._Memo())
        with pytest.raises(ImportRejected) as caught:
            import_problems(request.manifests, blobs)
        assert caught.value.reason == "input_changed", caught.value


def _not_a_file(kind: str, tmp: Path) -> tuple[Path, str]:
    """A path that names something other than a regular file, and what the refusal says."""
    import os

    path = tmp / f"thing-{kind}.zip"
    if kind == "folder":
        path.mkdir()
        return path, "a folder"
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read would block until a writer came
        return path, "a FIFO"
    if kind == "device":
        return Path("/dev/zero"), "a device"  # reading it would never end
    return path, "no such file"


@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "missing"])
class TestWhatIsNotAFile:
    """Every file Viano reads (an export, a report, an attachment) is checked to be a
    regular file before it is opened: each other kind is refused by name, nothing
    written, and never read (a FIFO would hang the command, /dev/zero never ends)."""

    def test_import(self, cli: Cli, sample: Path, tmp_path: Path, kind: str) -> None:
        store = tmp_path / "store"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        before = snapshot(store)
        path, said = _not_a_file(kind, tmp_path)
        r = cli("import", "--json", "--store", store, path)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "invalid_input" and said in error["message"], error
        assert snapshot(store) == before

    @pytest.mark.parametrize("flag", ["--report", "--attach"])
    def test_intake(self, cli: Cli, sample: Path, tmp_path: Path, kind: str,
                    flag: str) -> None:
        store = tmp_path / "store"
        path, said = _not_a_file(kind, tmp_path)
        args = {"--report": ["--report", path], "--batch": ["--batch", path],
                "--attach": ["--report", sample / "report.json", "--attach", path]}[flag]
        r = cli("intake", "--json", "--store", store, *args)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "invalid_input" and said in error["message"], error
        assert not (store / "store.sqlite3").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_bulk_intake_of_what_is_not_a_file(cli: Cli, tmp_path: Path, kind: str) -> None:
    """--batch reads a folder of reports or a JSON Lines file; a FIFO or a device is
    refused by name, unread (a folder is what --batch reads; missing is a usage error)."""
    store = tmp_path / "store"
    path, said = _not_a_file(kind, tmp_path)
    r = cli("intake", "--json", "--store", store, "--batch", path)
    assert r.code == 2, r.err
    error = r.json["error"]  # type: ignore[index]
    assert error["reason"] == "invalid_input" and said in error["message"], error
    assert not (store / "store.sqlite3").exists()


def _with_member(good: Path, dest: Path, name: str, *, encrypted: bool = False) -> Path:
    """The good export with one more member; ``encrypted`` sets that member's encryption
    flag in its local header and its central-directory record (zipfile cannot write one)."""
    dest.write_bytes(good.read_bytes())
    with zipfile.ZipFile(dest, "a") as zf:
        zf.writestr(name, b"x")
    if encrypted:
        raw = bytearray(dest.read_bytes())
        for sig, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            at = raw.rindex(sig)  # the member written last is last in both
            raw[at + flags_at] |= 0x1
        dest.write_bytes(bytes(raw))
    return dest


class TestArchiveRefusalsOnImport:
    """An export is a zip Viano wrote: a member that no export holds says the file is not
    one (or was changed), so its hint says to export again, never to raise a limit; only a
    size beyond the configuration's limits hints at the limit."""

    @pytest.mark.parametrize(("name", "encrypted", "reason"), [
        ("../evil", False, "unsafe_archive_member"),
        ("blobs/" + "0" * 64, True, "encrypted_archive_member")])
    def test_a_member_no_export_holds(self, cli: Cli, sample: Path, tmp_path: Path,
                                      name: str, encrypted: bool, reason: str) -> None:
        bad = _with_member(_export(cli, sample, tmp_path), tmp_path / "bad.zip", name,
                           encrypted=encrypted)
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == reason, error
        assert "Export the case again" in error["hint"] and "limit" not in error["hint"], error
        assert not target.exists()

    @pytest.mark.parametrize("name", ["blobs/", "manifests/", "extra/"])
    def test_a_directory_entry_no_export_holds(self, cli: Cli, sample: Path, tmp_path: Path,
                                               name: str) -> None:
        """The archive scan passes over directory entries (intake has no use for them); an
        export Viano wrote never holds one, so one says the file is not that export."""
        good = _export(cli, sample, tmp_path)
        bad = tmp_path / "bad.zip"
        bad.write_bytes(good.read_bytes())
        with zipfile.ZipFile(bad, "a") as zf:
            zf.writestr(zipfile.ZipInfo(name), b"")
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "invalid_export" and name in error["message"], error
        assert not target.exists()

    @pytest.mark.parametrize("keep", [0.5, 0.9, -1, -22])
    def test_a_truncated_export_is_invalid_export(self, cli: Cli, sample: Path,
                                                 tmp_path: Path, keep: float) -> None:
        """Cut anywhere (in the members, in the central directory, in its last record): a
        damaged file is not an export, whatever part of the zip format noticed."""
        raw = _export(cli, sample, tmp_path).read_bytes()
        cut = tmp_path / "cut.zip"
        cut.write_bytes(raw[:int(len(raw) * keep) if keep > 0 else int(keep)])
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, cut)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "invalid_export", error
        assert "again" in error["hint"], error  # export it again, not raise a limit
        assert not target.exists()

    def test_more_members_than_the_configuration_allows(self, cli: Cli, sample: Path,
                                                        tmp_path: Path) -> None:
        good = _export(cli, sample, tmp_path)
        with zipfile.ZipFile(good) as zf:
            count = len(zf.namelist())
        cfg = tmp_path / "few.toml"
        cfg.write_text(f"[intake.limits]\nmax_members = {count - 1}\n")
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, "--config", cfg, good)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "limit_exceeded" and "max_members" in error["hint"], error
        assert not target.exists()

    def test_a_compressed_member_is_not_an_export_viano_wrote(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """Members are stored: one that inflates could make the import read more than the
        file holds (a zip bomb), so it is refused, and no size limit is what decides."""
        good = _export(cli, sample, tmp_path)
        bad = tmp_path / "deflated.zip"
        with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
            for name in zin.namelist():
                zout.writestr(name, zin.read(name), compress_type=zipfile.ZIP_DEFLATED)
        target = tmp_path / "target"
        r = cli("import", "--json", "--store", target, bad)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "invalid_export", error
        assert "never compressed" in error["hint"] and "raise" not in error["hint"], error
        assert not target.exists()


@pytest.mark.parametrize("shape", ["many plain attachments", "archives at the limit"])
def test_what_a_store_took_in_imports_under_the_same_configuration(
        cli: Cli, sample: Path, tmp_path: Path, shape: str) -> None:
    """The class: whatever intake accepted under a configuration, an import under the same
    configuration accepts — here cases far larger in total than any one limit (16 times
    max_total_bytes was import's cap, which 30 attachments under it exceeded)."""
    import random

    limit = 64 * 1024
    cfg = tmp_path / "small.toml"
    cfg.write_text(f"[intake.limits]\nmax_total_bytes = {limit}\nmax_member_bytes = {limit}\n")
    rng = random.Random(7)
    attach: list[str | Path] = []
    for i in range(30 if shape == "many plain attachments" else 20):
        path = tmp_path / (f"log{i}.bin" if shape == "many plain attachments" else f"d{i}.zip")
        if shape == "many plain attachments":
            path.write_bytes(rng.randbytes(limit - 1000))
        else:
            with zipfile.ZipFile(path, "w") as zf:  # stored: the archive is near the limit too
                zf.writestr("dump.bin", rng.randbytes(limit - 4096))
        role = "attachment" if shape == "many plain attachments" else "diagnostics"
        attach += ["--attach", f"{role}={path}"]
    a, b = tmp_path / "a", tmp_path / "b"
    r = cli("intake", "--store", a, "--config", cfg, "--report", sample / "report.json", *attach)
    assert r.code == 0, r.err
    out = tmp_path / "case.zip"
    assert cli("export", "--store", a, "--config", cfg, "BUG-20", out).code == 0
    assert out.stat().st_size > 16 * limit  # beyond the old cap
    r = cli("import", "--json", "--store", b, "--config", cfg, out)
    assert r.code == 0, r.err
    assert cli("verify", "--store", b).code == 0
    shown = [cli("show", "--json", "--store", s, "BUG-20") for s in (a, b)]
    assert shown[0].code == shown[1].code == 0
    assert shown[0].out == shown[1].out  # the same manifest, byte for byte


HUGE_DOCUMENT = 400 * 1024 * 1024  # more than the child's whole address space allows twice


def _limit_address_space() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (512 * 1024 * 1024, 512 * 1024 * 1024))


@pytest.mark.slow
class TestAHugeDocument:
    """A crafted export whose pinned policy.json is a 400 MB blob, every hash recomputed:
    the phase checks read documents whole, and read this one whole (peak 860 MB) before
    refusing it. A document larger than MAX_DOCUMENT_BYTES is refused unread: the import,
    in a child limited to 512 MiB of address space, is invalid_export, not a MemoryError,
    and writes nothing."""

    def test_a_huge_document_is_refused_unread(self, cli: Cli, sample: Path,
                                               tmp_path: Path) -> None:
        import subprocess

        from engine._config import MAX_DOCUMENT_BYTES
        from tests.conftest import child_env

        assert HUGE_DOCUMENT > MAX_DOCUMENT_BYTES
        good = TestPhaseHistories._analysed(cli, sample, tmp_path)
        digest = hashlib.sha256()
        chunk = b" " * (1 << 20)
        for _ in range(HUGE_DOCUMENT // len(chunk)):
            digest.update(chunk)
        sha = digest.hexdigest()

        def swap(docs: list[Doc]) -> list[bytes]:
            out = []
            for d in docs:
                files = {p: ({"sha256": sha, "size": HUGE_DOCUMENT}
                             if p.endswith("/policy.json") else e)
                         for p, e in d["files"].items()}
                out.append(_encode({**d, "files": files}))
            return out

        crafted = _craft(good, tmp_path / "crafted.zip", manifests=swap)
        with zipfile.ZipFile(crafted) as zin:
            members = {n: zin.read(n) for n in zin.namelist()}
        docs = [json.loads(members[n]) for n in sorted(members) if n.startswith("manifests/")]
        swapped = {e["sha256"] for d in docs for e in d["files"].values()}
        assert sha in swapped, "no policy.json to swap"
        huge = tmp_path / "huge.zip"
        with zipfile.ZipFile(huge, "w") as zout:
            for name, data in members.items():
                if name.startswith("blobs/") and name[6:] not in swapped:
                    continue  # the old policy's blob: no manifest names it now
                zout.writestr(name, data)
            with zout.open(zipfile.ZipInfo(f"blobs/{sha}"), "w") as out:
                for _ in range(HUGE_DOCUMENT // len(chunk)):
                    out.write(chunk)
        (tmp_path / "crafted.zip").unlink()
        dest = tmp_path / "dest"
        proc = subprocess.run([*VIANO,
                               "import", "--json", "--store", str(dest), str(huge)],
                              capture_output=True, text=True, env=child_env(), timeout=300,
                              preexec_fn=_limit_address_space, check=False)
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
        doc = json.loads(proc.stdout)
        assert doc["error"]["reason"] == "invalid_export", doc
        assert "reads whole" in doc["error"]["message"], doc
        assert not (dest / "store.sqlite3").exists()


class TestOpenedAsChecked:
    """What is checked is what is read: every open of a user-named file (a report, an
    attachment, an export, a config, a source at commit) judges the opened descriptor, so a
    file swapped for a FIFO or a device after a check is refused at once, never read (it
    hung the command, holding the case's lock at commit)."""

    def test_open_regular_refuses_what_is_not_a_file_without_waiting(self,
                                                                     tmp_path: Path) -> None:
        import os

        from engine import open_regular
        from engine._store._sources import NotRegularFile

        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
        for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device"),
                           (tmp_path, "a folder")):
            with pytest.raises(NotRegularFile) as info:
                open_regular(path)
            assert info.value.kind == kind
        (tmp_path / "f").write_bytes(b"bytes")
        with open_regular(tmp_path / "f") as f:
            assert f.read() == b"bytes"

    def test_a_socket_is_refused_by_name_unopened(self) -> None:
        import socket
        import tempfile

        from engine import open_regular
        from engine._store._sources import NotRegularFile

        with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a socket path is short
            path = Path(short) / "s"
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(path))
                with pytest.raises(NotRegularFile) as info:
                    open_regular(path)
                assert info.value.kind == "a socket"

    def test_a_jsonl_batch_swapped_after_its_check_is_refused(
            self, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """--batch FILE.jsonl is read through one open file: swapped for a FIFO right after
        its check, it is unreadable_input (exit 2); it hung, then crashed as an internal
        error, when it was opened again by path."""
        import os

        from viano_bug_analysis.cli import _intake_commands

        batch = tmp_path / "b.jsonl"
        batch.write_text('{"title": "t", "body": "b"}\n')
        real = _intake_commands.check_regular

        def check_then_swap(path: Path) -> None:
            real(path)
            path.unlink()
            os.mkfifo(path)

        monkeypatch.setattr(_intake_commands, "check_regular", check_then_swap)
        r = cli("intake", "--json", "--store", tmp_path / "s", "--batch", batch)
        assert r.code == 2, (r.code, r.out, r.err)
        assert r.json["error"]["reason"] == "unreadable_input", r.out  # type: ignore[index]

    @pytest.mark.parametrize("size", [100, 400_000], ids=["inline", "blob file"])
    def test_a_source_swapped_for_a_fifo_before_commit_is_input_changed(
            self, tmp_path: Path, size: int) -> None:
        import os

        from engine import Change, FileSource, InputRejected, PublishRequest, new_package_id
        from tests.store_helpers import open_rw

        path = tmp_path / "input.bin"
        path.write_bytes(os.urandom(size))
        source = FileSource.of(path)
        path.unlink()
        os.mkfifo(path)
        store = open_rw(tmp_path / "s")
        try:
            [out] = store.commit_batch([PublishRequest(new_package_id(), "SWAP-1", None, Change(
                files={"inputs/input.bin": source}, phase="INTAKE"))])
            assert isinstance(out, InputRejected) and out.reason == "input_changed", out
            assert store.list_cases() == []
        finally:
            store.close()


def test_an_export_that_cannot_be_read_is_unreadable_input(cli: Cli, sample: Path,
                                                           tmp_path: Path) -> None:
    """An export the user may not read is a refusal (exit 2, unreadable_input), not an
    internal error: the check opens the file, as every later read does."""
    from tests.conftest import run_viano, unprivileged

    prefix = unprivileged()
    if prefix is None:
        pytest.skip("no way to drop the power to ignore file permissions here")
    good = _export(cli, sample, tmp_path)
    good.chmod(0)
    store = tmp_path / "dest"
    r = run_viano("import", "--json", "--store", store, good, prefix=prefix)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    error = json.loads(r.stdout)["error"]
    assert error["reason"] == "unreadable_input", error
