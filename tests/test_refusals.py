"""Where a refusal is due, the user gets one (exit 2, a reason and a hint), never an
internal error; reports are read as the user meant them; and what the CLI prints of
outside text cannot drive the terminal."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import archives as A
from tests.conftest import PYTHON, VIANO, Cli, child_env, run_viano, snapshot, unprivileged

pytestmark = pytest.mark.usefixtures("backend")


def _refused(r: object, reason: str) -> None:
    code, doc = r.code, r.json  # type: ignore[attr-defined]
    assert code == 2, (code, r.out, r.err)  # type: ignore[attr-defined]
    assert doc["error"]["reason"] == reason, doc
    assert doc["error"]["hint"]


def _json_report(tmp: Path, raw: bytes, name: str = "report.json") -> Path:
    p = tmp / name
    p.write_bytes(raw)
    return p


class TestReportsAsMeant:
    def test_bom_json_is_json(self, cli: Cli, tmp_path: Path, store_dir: Path) -> None:
        """A JSON report with a UTF-8 BOM is read as JSON; the original keeps its BOM."""
        raw = b"\xef\xbb\xbf" + json.dumps({"title": "T", "body": "B", "comments": [
            {"author": "a", "body": "c"}]}).encode()
        r = cli("intake", "--json", "--store", store_dir, "--report",
                _json_report(tmp_path, raw), "--case-id", "BOM-1")
        assert r.code == 0, r.err
        kinds = [s["kind"] for s in r.json["catalogue"]["sources"]]  # type: ignore[index]
        assert kinds == ["report", "comment"]
        stored = cli("cat", "--store", store_dir, "BOM-1", "inputs/report.json").out
        assert stored.startswith("\ufeff")

    @pytest.mark.parametrize("raw,what", [
        (b'{"title": "t", "body": "first", "body": "second"}', "duplicate key"),
        (b'{"title": "t", "body": "\\ud800 lone"}', "lone"),
        (b'{"title": "t", "body": "b", "comments": ' + b"[" * 5000 + b"]" * 5000 + b"}",
         "nested"),
        (b'{"title": "t", "body": NaN}', "NaN"),
        (b'["title", "body"]', "must be an object"),
        (b"just some words, not JSON", "not valid JSON"),
        (b'{"title": "t", "body": "b"} trailing', "not valid JSON"),
    ])
    def test_json_reports_are_read_strictly(self, cli: Cli, tmp_path: Path, store_dir: Path,
                                            raw: bytes, what: str) -> None:
        """Duplicate keys, lone surrogates, deep nesting, NaN, a .json that is not an
        object: each is invalid_report (exit 2), nothing written."""
        r = cli("intake", "--json", "--store", store_dir, "--report",
                _json_report(tmp_path, raw))
        _refused(r, "invalid_report")
        assert what in r.json["error"]["message"]  # type: ignore[index]
        assert not store_dir.exists()

    @pytest.mark.parametrize("name", ["diag.zip", "diag.tar", "diag.tar.gz", "diag.tgz",
                                      "DIAG.ZIP"])
    def test_a_named_archive_that_is_not_one(self, cli: Cli, tmp_path: Path, store_dir: Path,
                                             name: str) -> None:
        """A diagnostics or source attachment named like an archive whose content is not
        one is corrupt_archive (exit 2), not a silently opaque blob."""
        fake = tmp_path / name
        fake.write_bytes(b"this is a log file, not an archive\n" * 10)
        for role in ("diagnostics", "source"):
            r = cli("intake", "--json", "--store", store_dir, "--report",
                    _json_report(tmp_path, b'{"title": "t", "body": "b"}'),
                    "--attach", f"{role}={fake}")
            _refused(r, "corrupt_archive")
        assert not store_dir.exists()
        # As a plain attachment the same file is kept as it is.
        r = cli("intake", "--json", "--store", store_dir, "--report",
                _json_report(tmp_path, b'{"title": "t", "body": "b"}'), "--attach", fake)
        assert r.code == 0, r.err

    def test_a_plain_gz_log_is_one_opaque_member(self, cli: Cli, tmp_path: Path,
                                                 store_dir: Path) -> None:
        """A gzip-compressed log (not a tar) in the diagnostics role is stored as one
        source, not refused and not expanded."""
        log = tmp_path / "client.log.gz"
        log.write_bytes(gzip.compress(b"2026-11-30 12:00:01 ERROR boom\n" * 200))
        r = cli("intake", "--json", "--store", store_dir, "--report",
                _json_report(tmp_path, b'{"title": "t", "body": "b"}'),
                "--attach", f"diagnostics={log}")
        assert r.code == 0, r.err
        sources = r.json["catalogue"]["sources"]  # type: ignore[index]
        assert [(s["kind"], s["origin"]) for s in sources[1:]] == [
            ("diagnostics", {"input": "inputs/client.log.gz"})]

    def test_a_real_tar_gz_named_gz_is_still_expanded(self, cli: Cli, tmp_path: Path,
                                                      store_dir: Path) -> None:
        """Content decides: a tar.gz is catalogued member by member whatever its name."""
        path = A.tar_with(tmp_path / "bundle.gz", [("Logs/a.log", b"hello")])
        r = cli("intake", "--json", "--store", store_dir, "--report",
                _json_report(tmp_path, b'{"title": "t", "body": "b"}'),
                "--attach", f"diagnostics={path}")
        assert r.code == 0, r.err
        assert r.json["catalogue"]["sources"][1]["origin"]["member"] == "Logs/a.log"  # type: ignore[index]


class TestInternalErrorsThatAreRefusals:
    def test_a_file_name_that_is_not_utf8(self, tmp_path: Path) -> None:
        """An attachment whose name is not UTF-8 is invalid_input (exit 2)."""
        raw_dir = os.fsencode(tmp_path)
        bad = os.path.join(raw_dir, b"diag-\xff\xfe.log")
        with open(bad, "wb") as f:
            f.write(b"log")
        report = tmp_path / "r.txt"
        report.write_text("t\n")
        proc = subprocess.run([os.fsencode(PYTHON), b"-c",
                               b"from viano_main import run; run()", b"intake",
                               b"--json", b"--store", os.fsencode(tmp_path / "s"),
                               b"--report", os.fsencode(report), b"--attach", bad],
                              capture_output=True, env=child_env(), timeout=120, check=False)
        assert proc.returncode == 2, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["error"]["reason"] == "invalid_input"
        assert "not UTF-8" in doc["error"]["message"]
        assert not (tmp_path / "s").exists()

    @pytest.mark.skipif(unprivileged() is None, reason="needs setpriv to drop root's powers")
    @pytest.mark.parametrize("which", ["report", "attachment", "archive"])
    def test_unreadable_files(self, tmp_path: Path, sample: Path, which: str) -> None:
        """An input the user cannot read is unreadable_input (exit 2), nothing written."""
        report = tmp_path / "r.json"
        report.write_text('{"title": "t", "body": "b"}')
        att = tmp_path / "att.log"
        att.write_text("log")
        archive = tmp_path / "d.zip"
        archive.write_bytes((sample / "wowdiag.zip").read_bytes())
        target = {"report": report, "attachment": att, "archive": archive}[which]
        target.chmod(0)
        try:
            r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report,
                          "--attach", att, "--attach", f"diagnostics={archive}",
                          prefix=unprivileged())
        finally:
            target.chmod(0o644)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["error"]["reason"] == "unreadable_input"
        assert not (tmp_path / "s").exists()

    @pytest.mark.parametrize("value", ["0", "-1", "-99999999999999999999",
                                       "99999999999999999999999", "4611686018427387905"])
    def test_absurd_generations(self, cli: Cli, sample: Path, store_dir: Path,
                                value: str) -> None:
        """--generation 0, negative or enormous is unknown_generation (exit 2); 0 never
        shows the head."""
        assert cli("intake", "--store", store_dir, "--report", sample / "report.json").code == 0
        for cmd in (["show", "BUG-20"], ["cat", "BUG-20", "inputs/report.json"]):
            r = cli(*cmd, "--generation", value, "--store", store_dir, "--json")
            _refused(r, "unknown_generation")

    @pytest.mark.parametrize("argv", [
        ["intake"],                                   # missing --report
        ["show"],                                     # missing CASE
        ["show", "X", "--generation", "abc"],         # not an integer
        ["frobnicate"],                               # unknown command
        ["status", "--no-such-flag"],
        ["intake", "--report"],                       # option without its value
    ])
    def test_usage_errors_under_json(self, cli: Cli, argv: list[str]) -> None:
        """A usage error with --json prints exactly one JSON document on stdout."""
        r = cli(*argv, "--json")
        _refused(r, "usage_error")
        json.loads(r.out)  # exactly one document: this fails on anything extra

    def test_a_broken_pipe_after_a_commit_is_not_a_failure(self, tmp_path: Path,
                                                           sample: Path) -> None:
        """`viano intake … | head -c 1`: the intake committed, so the exit is 0 and there
        is no traceback, although the reader went away."""
        read, write = os.pipe()
        os.close(read)  # the reader has gone before we write anything
        proc = subprocess.run([*VIANO,
                               "intake", "--store", str(tmp_path / "s"), "--report",
                               str(sample / "report.json"), "--attach",
                               f"diagnostics={sample / 'wowdiag.zip'}"],
                              stdout=write, stderr=subprocess.PIPE, env=child_env(),
                              timeout=120, check=False)
        os.close(write)
        assert proc.returncode == 0, proc.stderr
        assert b"Traceback" not in proc.stderr and b"Exception ignored" not in proc.stderr
        assert json.loads(run_viano("status", "--json", "--store", tmp_path / "s").stdout)[0][
            "case_id"] == "BUG-20"


ESC = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil"


class TestTerminalSafety:
    def test_control_characters_in_titles_and_names_are_escaped(
            self, cli: Cli, tmp_path: Path, store_dir: Path) -> None:
        """C0, C1 and bidi controls in a title, a comment author, a case's file name and a
        member name never reach the terminal raw (table, lines and errors); the JSON
        output escapes them too."""
        report = _json_report(tmp_path, json.dumps({"title": f"T{ESC}", "body": "b"}).encode())
        zpath = A.zip_with(tmp_path / "d.zip", [("Logs/a\u202etxt.log", b"x")])
        attach = tmp_path / "note\u202egpj.exe"
        attach.write_bytes(b"x")
        r = cli("intake", "--store", store_dir, "--report", report, "--attach",
                f"diagnostics={zpath}", "--attach", attach)
        assert r.code == 0, r.err
        for text in (r.out, r.err, cli("show", "--store", store_dir, f"x{ESC}").err,
                     cli("status", "--store", store_dir).out,
                     cli("log", "--store", store_dir,
                         json.loads(cli("status", "--store", store_dir, "--json").out)[0][
                             "case_id"]).out):
            for ch in ("\x1b", "\x07", "\x9b", "\u202e"):
                assert ch not in text, (repr(ch), text)
        assert "\\x1b" in r.out and "\\u202e" in r.out
        j = cli("status", "--store", store_dir, "--json").out
        assert "\x9b" not in j and "\u202e" not in j and "\x1b" not in j

    @pytest.mark.parametrize("ch", ["\u2028", "\u2029", "\u200b", "\u2060", "\ufeff",
                                    "\u2063", "\u00ad", "\U000e0041", "\u180e", "\u206a",
                                    "\ufff9"])
    def test_what_shows_as_nothing_or_breaks_a_line_is_escaped(
            self, cli: Cli, tmp_path: Path, store_dir: Path, ch: str) -> None:
        """A line or paragraph separator in a member name split the catalogue's table row
        on some terminals; a zero-width space in a config key made two keys look alike in
        the refusal. Both are escaped wherever a name, a title or a message is printed."""
        zpath = A.zip_with(tmp_path / "d.zip", [(f"Logs/a{ch}b.log", b"x")])
        report = _json_report(tmp_path, json.dumps({"title": f"T{ch}U", "body": "b"}).encode())
        r = cli("intake", "--store", store_dir, "--report", report, "--attach",
                f"diagnostics={zpath}")
        assert r.code == 0, r.err
        config = tmp_path / "zw.toml"
        config.write_text(f'[retry]\n"max_{ch}rounds" = 3\n', encoding="utf-8")
        refused = cli("--config", config, "status", "--store", store_dir)
        assert refused.code == 2, refused.err
        code = ord(ch)
        escaped = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
        for text in (r.out, refused.err, cli("status", "--store", store_dir).out):
            assert ch not in text, text
        assert escaped in r.out and escaped in refused.err, (r.out, refused.err)

    def test_rich_markup_in_titles_is_text(self, cli: Cli, tmp_path: Path,
                                           store_dir: Path) -> None:
        """A title with Rich markup is printed as it is, not interpreted."""
        report = _json_report(tmp_path, json.dumps({"title": "[bold red]x[/]",
                                                    "body": "b"}).encode())
        r = cli("intake", "--store", store_dir, "--report", report)
        assert "[bold red]x[/]" in r.out


class TestIntakeLeavesNothing:
    def test_refusals_leave_an_existing_store_unchanged(self, cli: Cli, tmp_path: Path,
                                                        sample: Path) -> None:
        """Every refusal above, run against an existing store, changes nothing in it."""
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        before = snapshot(store)
        bad = [_json_report(tmp_path, b'{"title": "t", "body": "a", "body": "b"}', "d.json")]
        fake = tmp_path / "x.zip"
        fake.write_bytes(b"nope")
        cli("intake", "--store", store, "--report", bad[0])
        cli("intake", "--store", store, "--report", sample / "report.json", "--case-id", "N-2",
            "--attach", f"diagnostics={fake}")
        assert snapshot(store) == before



BAD = "\udcff"  # what Python makes of an argument byte that is not UTF-8 (0xff)
TEXT_ARGUMENTS = [
    ["show", BAD], ["log", BAD], ["verify", BAD], ["report", BAD], ["status", BAD],
    ["export", BAD, "out.zip"], ["cat", BAD, "case/intake.json"], ["cat", "T-1", BAD],
    ["interpret", BAD], ["hypothesize", BAD], ["run", BAD], ["batch", BAD],
    ["confirm", BAD], ["confirm", "T-1", "--by", BAD], ["unblock", BAD],
    ["reopen", BAD, "--reason", "r"], ["reopen", "T-1", "--reason", BAD],
    ["reopen", "T-1", "--reason", "r", "--by", BAD],
    ["intake", "--report", "r.txt", "--case-id", BAD],
    ["interpret", "T-1", "--attempt-id", BAD],
]


@pytest.mark.parametrize("args", TEXT_ARGUMENTS, ids=lambda a: " ".join(a).replace(BAD, "<ff>"))
def test_a_text_argument_that_is_not_utf8_is_a_usage_error(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """Every argument that is text (case ids, names, reasons, logical paths, attempt ids),
    not bytes of a file name: refused by the parser, never an internal error from SQLite or
    an encoder, and nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.txt").write_text("t\n")
    store = tmp_path / "s"
    assert cli("intake", "--store", store, "--report", "r.txt", "--case-id", "T-1").code == 0
    before = snapshot(store)
    r = cli(*args, "--json", "--store", store)
    assert r.code == 2, r.err
    error = r.json["error"]  # type: ignore[index]
    assert error["reason"] == "usage_error" and "not UTF-8" in error["message"], error
    assert "\\udcff" in error["message"] and "\\\\udcff" not in error["message"], error
    assert snapshot(store) == before


@pytest.mark.parametrize(("option", "value"), [("--by", "\u200b"), ("--by", "\u2800"),
                                               ("--by", "\u0301\u0301"),
                                               # reads as "policy:evil" (RLO), and others
                                               # that show otherwise than written
                                               ("--by", "\u202elive:ycilop"),
                                               ("--by", "ann\u2066e"), ("--by", "a\u200fb"),
                                               ("--reason", "\u200b\u200d"),
                                               ("--reason", "\ufeff ")])
def test_a_name_or_reason_that_shows_nothing_is_refused(
        cli: Cli, tmp_path: Path, option: str, value: str) -> None:
    """The rule a model's strings are held to (nothing in it shows: blank_string) holds for
    what a person types too: a zero-width space is not a name."""
    (tmp_path / "r.txt").write_text("t\n")
    store = tmp_path / "s"
    assert cli("intake", "--store", store, "--report", tmp_path / "r.txt",
               "--case-id", "T-1").code == 0
    args = ["reopen", "T-1", "--reason", "r"] if option == "--by" else ["reopen", "T-1"]
    r = cli(*args, option, value, "--json", "--store", store)
    assert r.code == 2, r.err
    assert json.loads(r.out)["error"]["reason"] == "usage_error"
    assert cli("status", "--json", "--store", store, "T-1").out.count('"REOPENED"') == 0


@pytest.mark.parametrize("args", [["intake", "--report", "r\udcff.txt"],
                                  ["export", "T-1", "out\udcff/x.zip"],
                                  ["status", "--log-json", "no\udcff/events.jsonl"]])
def test_a_path_that_is_not_utf8_reaches_json_as_visible_text(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """A file name may be any bytes; the JSON document naming it must still be strict JSON
    (a `\\udcff` escape is refused by strict parsers): the byte is shown as text."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.txt").write_text("t\n")
    assert cli("intake", "--store", "s", "--report", "r.txt", "--case-id", "T-1").code == 0
    r = cli(*args, "--json", "--store", "s")
    assert r.code == 2, r.err
    message = r.json["error"]["message"]  # type: ignore[index]
    assert "\\udcff" in message, message


def test_event_lines_are_strict_json_whatever_they_name(tmp_path: Path) -> None:
    """--log-json lines hold case ids and paths: a lone surrogate in one is visible text."""
    import logging

    from tests.conftest import strict_json
    from viano_bug_analysis.cli._events import event_log

    log = tmp_path / "events.jsonl"
    with event_log(str(log)):
        logging.getLogger("viano.events").info(
            "x", extra={"viano_event": {"event": "probe", "path": "a\udcffb"}})
    line = log.read_text(encoding="ascii").splitlines()[-1]
    assert strict_json(line)["path"] == "a\\udcffb"  # type: ignore[index]
