"""What a new user of the command line runs into (each found by probing it as one): typos
and mistakes refused with a reason and a next step, output that stays readable in a pipe
and safe on a terminal, and the same answer for the same question."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest

from engine import CaseStatus, iso_utc
from tests.conftest import REPO, VIANO, Cli, child_env, fixture_config, run_viano, snapshot


def _intake(cli: Cli, store: Path, sample: Path, *extra: str) -> None:
    r = cli("intake", "--store", store, "--report", sample / "report.json", "--attach",
            f"diagnostics={sample / 'wowdiag.zip'}", "--attach", f"source={sample / 'wowsrc.zip'}",
            *extra)
    assert r.code == 0, r.err


class TestMistakesAreRefused:
    @pytest.mark.parametrize("spec", ["diag=x.log", "Diagnostics=x.log", "source=",
                                      "diagnostics="])
    def test_a_misspelt_or_empty_attach_role(self, cli: Cli, sample: Path, tmp_path: Path,
                                             spec: str) -> None:
        r = cli("intake", "--store", tmp_path / "s", "--report", sample / "report.json",
                "--attach", spec, "--json")
        assert r.code == 2 and r.json["error"]["reason"] == "usage_error"  # type: ignore[index]
        assert not (tmp_path / "s").exists()  # nothing half-written

    def test_a_file_whose_name_holds_an_equals_sign_is_still_an_attachment(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        odd = tmp_path / "run=3.log"
        odd.write_text("line\n")
        r = cli("intake", "--store", tmp_path / "s", "--report", sample / "report.json",
                "--attach", str(odd), "--json")
        assert r.code == 0, r.err

    def test_abbreviated_options_are_not_guessed(self, cli: Cli, tmp_path: Path) -> None:
        r = cli("status", "--stor", tmp_path / "s", "--json")
        assert r.code == 2 and "--stor" in r.json["error"]["message"]  # type: ignore[index]

    def test_log_json_needs_its_file_and_a_writable_one(self, cli: Cli,
                                                        tmp_path: Path) -> None:
        r = cli("status", "--store", tmp_path / "s", "--log-json")
        assert r.code == 2 and "expected one argument" in r.err
        r = cli("status", "--store", tmp_path / "s", "--json", "--log-json",
                tmp_path / "no" / "such" / "dir.log")
        assert r.code == 2 and r.json["error"]["reason"] == "usage_error"  # type: ignore[index]
        assert "internal_error" not in r.err

    @pytest.mark.timeout(60)
    def test_a_fifo_without_a_reader_is_refused_at_once(self, cli: Cli, tmp_path: Path) -> None:
        fifo = tmp_path / "events"
        os.mkfifo(fifo)
        r = cli("status", "--store", tmp_path / "s", "--json", "--log-json", fifo)
        assert r.code == 2, r.err
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "usage_error" and "no process reads" in error["message"]

    @pytest.mark.timeout(60)
    def test_a_fifo_with_a_reader_gets_the_events(self, cli: Cli, sample: Path,
                                                  tmp_path: Path) -> None:
        fifo = tmp_path / "events"
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            _intake(cli, tmp_path / "s", sample, "--log-json", fifo)
            r = cli("run", "--store", tmp_path / "s", "--config",
                    fixture_config(tmp_path, sample), "--log-json", fifo, "--all")
            assert r.code == 0, r.err
            lines = os.read(reader, 1 << 20).decode().splitlines()
        finally:
            os.close(reader)
        assert lines and all(json.loads(line)["ts"] for line in lines)

    def test_a_log_that_cannot_be_written_never_fails_the_work(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        if not Path("/dev/full").is_char_device():
            pytest.skip("no /dev/full here")
        store = tmp_path / "s"
        _intake(cli, store, sample)
        r = cli("run", "--json", "--store", store, "--config",
                fixture_config(tmp_path, sample), "--log-json", "/dev/full", "--all")
        assert r.code == 0, r.err  # waiting for a person: the same as with a good log
        assert "internal_error" not in r.out + r.err
        assert json.loads(r.out)["results"][0]["reason"] == "awaiting_confirmation"
        # ... but the loss is said (it was silent): once when it begins, counted at the end.
        assert r.err.count("events are being lost (No space left on device)") == 1, r.err
        assert "event(s) could not be written" in r.err, r.err

    @pytest.mark.parametrize("where", ["store.sqlite3", "a new file", "the folder itself"])
    def test_never_inside_the_store(self, cli: Cli, sample: Path, tmp_path: Path,
                                    where: str) -> None:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        before = snapshot(store)
        target = {"store.sqlite3": store / "store.sqlite3", "a new file": store / "x.log",
                  "the folder itself": store}[where]
        link = tmp_path / "innocent.log"  # through a symbolic link, too
        link.symlink_to(target)
        for given in (target, link):
            r = cli("status", "--store", store, "--json", "--log-json", given)
            assert r.code == 2, r.err
            assert r.json["error"]["reason"] == "destination_in_store"  # type: ignore[index]
        assert snapshot(store) == before and not (store / "x.log").exists()
        assert cli("verify", "--store", store).code == 0

    def test_a_hard_link_to_a_store_file_is_refused(self, cli: Cli, sample: Path,
                                                   tmp_path: Path) -> None:
        """A log name that is a hard link to a store file (a blob file, the database) passed
        the path check, and the events were appended into it: verify then reported the
        blob corrupt. A regular file with other names is refused."""
        store = tmp_path / "s"
        _intake(cli, store, sample)
        before = snapshot(store)
        link = tmp_path / "events.log"
        os.link(store / "store.sqlite3", link)
        r = cli("run", "--json", "--store", store, "--config",
                fixture_config(tmp_path, sample), "--log-json", link, "--all")
        assert r.code == 2, r.out
        assert "hard links" in r.json["error"]["message"], r.out  # type: ignore[index]
        assert snapshot(store) == before
        assert cli("verify", "--store", store).code == 0

    def test_a_link_swapped_in_after_the_name_check_is_refused(
            self, cli: Cli, sample: Path, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """The name is checked, then opened: a symbolic link put in its place in between
        (here right after the check) is judged by what was opened."""
        from viano_bug_analysis.cli import _events

        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        before = snapshot(store)
        name = tmp_path / "events.log"
        real = _events._outside_every_store
        calls: list[Path] = []

        def check_then_swap(target: str, path: Path, root: Path | None) -> None:
            calls.append(path)
            real(target, path, root)
            if len(calls) == 1:
                name.symlink_to(store / "store.sqlite3")

        monkeypatch.setattr(_events, "_outside_every_store", check_then_swap)
        r = cli("status", "--store", store, "--json", "--log-json", name)
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "destination_in_store", r.out  # type: ignore[index]
        assert snapshot(store) == before

    @pytest.mark.parametrize("link_to", ["nowhere", "loop"])
    @pytest.mark.parametrize("under", ["", "sub"])
    @pytest.mark.parametrize("command", ["intake", "status"])
    def test_a_store_that_is_or_is_under_a_broken_link_is_refused_by_name(
            self, cli: Cli, sample: Path, tmp_path: Path, link_to: str, under: str,
            command: str) -> None:
        """--store naming a symbolic link to nothing, or a link that loops, or a folder
        under one: exit 2 saying so, nothing created. It was store_unavailable "File
        exists" (a dangling link above), internal_error (a loop above), or "does not
        exist" (a loop)."""
        link = tmp_path / "store"
        link.symlink_to(tmp_path / "nowhere" if link_to == "nowhere" else link)
        store = link / under if under else link
        args = ["--report", str(sample / "report.json")] if command == "intake" else []
        r = cli(command, "--json", "--store", store, *args)
        assert r.code == 2, r.out
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "not_a_store", error
        assert ("does not exist" if link_to == "nowhere" else "loops") in error["message"]
        assert (f"is in {link}" in error["message"]) == bool(under), error
        assert not (tmp_path / "nowhere").exists() and link.is_symlink()

    @pytest.mark.no_store
    def test_a_link_that_cannot_be_followed_here_is_not_called_broken(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A link whose target this user may not look at (EACCES) may well exist: it was
        refused as "a symbolic link to …, which does not exist"."""
        import errno
        import os

        from engine._store import _sqlite_open

        link = tmp_path / "lnk"
        link.symlink_to(tmp_path / "locked" / "real")
        real_stat = os.stat

        def denied(path: object, *args: object, **kwargs: object) -> os.stat_result:
            if str(path) == str(link) and kwargs.get("follow_symlinks", True):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(_sqlite_open.os, "stat", denied)
        _sqlite_open._no_broken_links(link / "sub")  # refused later, by what opening says

    @pytest.mark.parametrize("inner", ["blobs", "inner", "locks/x", "blobs/tmp/x"])
    def test_a_new_store_inside_another_stores_folder_is_refused(
            self, cli: Cli, sample: Path, tmp_path: Path, inner: str) -> None:
        """A store made inside another's folders: the outer store's verify then counted
        the inner one's files as its own temporary files, for ever (gc never removed
        them). Refused (not_a_store), nothing created; the outer store is unchanged."""
        outer = tmp_path / "s1"
        _intake(cli, outer, sample)
        before = snapshot(outer)
        r = cli("intake", "--json", "--store", outer / inner, "--report",
                sample / "report.json")
        assert r.code == 2, r.out
        error = r.json["error"]  # type: ignore[index]
        assert error["reason"] == "not_a_store" and "inside the store folder" in error["message"]
        assert snapshot(outer) == before and not (outer / inner).exists()
        assert cli("verify", "--store", outer).code == 0

    def test_nothing_is_written_into_a_version_1_store(self, cli: Cli, sample: Path,
                                                      tmp_path: Path) -> None:
        """A version-1 store has no store-id until its first write: export --force
        replaced its database with a zip, --log-json appended into its blob, and a new
        store was made in its blobs folder, all as if it were no store."""
        import zipfile

        old = tmp_path / "v1"
        with zipfile.ZipFile(Path(__file__).parent / "fixtures" / "store-v1.zip") as zf:
            zf.extractall(old)
        before = snapshot(old)
        store = tmp_path / "s"
        _intake(cli, store, sample)
        blob = next(p for p in (old / "blobs").rglob("*") if p.is_file())
        refusals = [
            cli("export", "--json", "--store", store, "BUG-20", old / "store.sqlite3",
                "--force"),
            cli("status", "--json", "--store", store, "--log-json", blob),
            cli("intake", "--json", "--store", old / "blobs" / "new", "--report",
                sample / "report.json")]
        for r in refusals:
            assert r.code == 2, r.out
            assert r.json["error"]["reason"] in ("destination_in_store",  # type: ignore[index]
                                                 "not_a_store"), r.out
        assert snapshot(old) == before

    def test_a_block_device_is_refused(self, cli: Cli, tmp_path: Path) -> None:
        device = next((p for p in sorted(Path("/dev").glob("loop*"))
                       if p.is_block_device() and os.access(p, os.W_OK)), None)
        if device is None:
            pytest.skip("no writable block device here")
        r = cli("status", "--store", tmp_path / "s", "--json", "--log-json", device)
        assert r.code == 2, r.err
        assert "character device" in r.json["error"]["message"]  # type: ignore[index]

    def test_version(self, cli: Cli) -> None:
        from importlib.metadata import version

        r = cli("--version")
        assert r.code == 0 and r.out.strip() == f"viano {version('viano')}"

    def test_no_providers_says_where_to_put_them(self, cli: Cli, sample: Path,
                                                 tmp_path: Path) -> None:
        _intake(cli, tmp_path / "s", sample)
        r = cli("interpret", "BUG-20", "--store", tmp_path / "s", "--json")
        hint = r.json["error"]["hint"]  # type: ignore[index]
        assert "--config" in hint and "VIANO_CONFIG" in hint and "viano demo" in hint


class TestTheSameQuestionTheSameAnswer:
    def test_an_unknown_case_is_exit_2_everywhere(self, cli: Cli, sample: Path,
                                                  tmp_path: Path) -> None:
        store = tmp_path / "s"
        _intake(cli, store, sample)
        for cmd in (["verify", "NOPE"], ["status", "NOPE"], ["log", "NOPE"],
                    ["show", "NOPE"]):
            r = cli(*cmd, "--store", store, "--json")
            assert (r.code, r.json["error"]["reason"]) == (2, "unknown_case"), cmd  # type: ignore[index]

    def test_asking_about_a_case_in_a_store_that_does_not_exist(self, cli: Cli,
                                                                tmp_path: Path) -> None:
        for cmd in (["status", "NOPE"], ["verify", "NOPE"], ["log", "NOPE"]):
            r = cli(*cmd, "--store", tmp_path / "none", "--json")
            assert (r.code, r.json["error"]["reason"]) == (2, "no_store"), cmd  # type: ignore[index]
        assert not (tmp_path / "none").exists()

    def test_verify_mentions_gc_only_when_there_is_something_to_remove(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        store = tmp_path / "s"
        _intake(cli, store, sample)
        assert "viano gc" not in cli("verify", "--store", store).out
        orphan = store / "blobs" / "sha256" / "ab" / ("ab" * 32)
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"orphan")
        assert "'viano gc' removes them" in cli("verify", "--store", store).out

    def test_confirming_twice_reports_the_same_fields_and_who_confirmed(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        store, cfg = tmp_path / "s", fixture_config(tmp_path, sample)
        _intake(cli, store, sample)
        assert cli("interpret", "BUG-20", "--store", store, "--config", cfg).code == 0
        first = cli("confirm", "BUG-20", "--by", "alice", "--store", store, "--json").json
        again = cli("confirm", "BUG-20", "--by", "bob", "--store", store, "--json").json
        assert isinstance(first, dict) and isinstance(again, dict)
        assert set(first) == set(again)
        assert (first["changed"], again["changed"]) == (True, False)
        assert "already confirmed by alice" in again["operation"]
        assert "bob" not in again["operation"]


    @pytest.mark.parametrize("by", ["", "   ", "\u200b", "a\x1b[31mb", "x" * 5000])
    def test_a_bad_name_is_refused_also_where_nothing_would_change(
            self, cli: Cli, sample: Path, tmp_path: Path, by: str) -> None:
        """An empty --by was taken as none (the login was recorded), and on a case
        confirmed already a bad one was never checked (exit 0)."""
        store, cfg = tmp_path / "s", fixture_config(tmp_path, sample)
        _intake(cli, store, sample)
        assert cli("interpret", "BUG-20", "--store", store, "--config", cfg).code == 0
        for confirmed in (False, True):
            before = snapshot(store)
            r = cli("confirm", "BUG-20", "--by", by, "--store", store, "--json")
            assert r.code == 2, (confirmed, r.out)
            assert r.json["error"]["reason"] == "usage_error", r.out  # type: ignore[index]
            assert snapshot(store) == before
            if not confirmed:
                assert cli("confirm", "BUG-20", "--by", "qa", "--store", store).code == 0

    @pytest.mark.parametrize("by", ["policy:auto_confirm", "Policy:anything", " policy:x",
                                    "\u2063policy:auto_confirm", "\u200bpolicy:x",
                                    "\uff50olicy:auto_confirm"])
    @pytest.mark.parametrize("command", ["confirm", "reopen", "unblock"])
    def test_a_person_cannot_take_a_policys_name(self, cli: Cli, sample: Path, tmp_path: Path,
                                                 by: str, command: str) -> None:
        """``policy:`` names are what the engine records for what a policy did (an
        auto-confirmation); a person's --by with one was recorded as is, so the audit said
        the policy confirmed a case it never confirmed. Refused, nothing written."""
        store, cfg = tmp_path / "s", fixture_config(tmp_path, sample)
        _intake(cli, store, sample)
        assert cli("interpret", "BUG-20", "--store", store, "--config", cfg).code == 0
        before = snapshot(store)
        extra = ["--reason", "again"] if command == "reopen" else []
        r = cli(command, "BUG-20", "--by", by, *extra, "--store", store, "--json")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"] == "usage_error", r.out  # type: ignore[index]
        message = r.json["error"]["message"]  # type: ignore[index]
        # by the policy rule, or, hidden behind an invisible character, by that
        assert "policy:" in message or "invisible" in message, r.out
        assert snapshot(store) == before


class TestResultsSayWhatHappened:
    def test_a_refused_provider_round_names_why(self, cli: Cli, sample: Path,
                                                tmp_path: Path) -> None:
        """A fixture provider with no answer for the case: the message carries the
        attempt's detail (fixture_missing), not only 'every provider refused'."""
        store = tmp_path / "s"
        empty = tmp_path / "empty"
        empty.mkdir()
        _intake(cli, store, sample)
        r = cli("interpret", "BUG-20", "--store", store, "--config",
                fixture_config(tmp_path, sample, path=empty), "--json")
        assert r.code == 13
        doc = r.json
        assert isinstance(doc, dict) and doc["reason"] == "provider_configuration"
        assert "fx: fixture_missing" in doc["message"]
        text = cli("status", "--store", store)
        assert "None" not in text.out

    def test_a_deferred_result_says_what_to_do(self, cli: Cli, sample: Path,
                                               tmp_path: Path) -> None:
        from engine import SqliteStore

        store, cfg = tmp_path / "s", fixture_config(tmp_path, sample)
        _intake(cli, store, sample)
        backend = SqliteStore.open(store, write=True)
        try:
            with backend.lease("BUG-20"):
                r = cli("interpret", "BUG-20", "--store", store, "--config", cfg)
        finally:
            backend.close()
        assert r.code == 11
        assert "what to do: another dispatch holds BUG-20" in r.out

    def test_due_times_are_rounded_up(self) -> None:
        """Acting at the second shown is never too early."""
        assert iso_utc(1.2) == "1970-01-01T00:00:02Z"
        assert iso_utc(5.0) == "1970-01-01T00:00:05Z"

    def test_the_status_table_of_a_round_without_a_bound(self, cli: Cli, sample: Path,
                                                         tmp_path: Path) -> None:
        """A dispatch interrupted mid-call leaves RUNNING, round 1, no max_rounds: the
        table says 1, not '1/None'."""
        import trio

        from actors import open_store

        store = tmp_path / "s"
        _intake(cli, store, sample)

        async def running() -> None:
            async with open_store(store) as handle:
                snap = await handle.snapshot("BUG-20")
                await snap.set_status(CaseStatus(status="RUNNING", phase="INTERPRETING_CASE",
                                                 reason="calling_model", round=1))

        trio.run(running)
        out = cli("status", "--store", store).out
        assert "None" not in out and "RUNNING" in out


class TestOutputStaysReadable:
    def test_a_piped_table_has_one_row_per_line(self, cli: Cli, sample: Path,
                                                tmp_path: Path) -> None:
        """In a pipe (no terminal width) rows are never wrapped, however long."""
        store = tmp_path / "s"
        long_id = "CASE-" + "x" * 59  # the longest id there is, and a long phase beside it
        _intake(cli, store, sample, "--case-id", long_id)
        r = run_viano("status", "--store", store)
        lines = r.stdout.splitlines()
        assert any(long_id in line and "READY" in line for line in lines), lines
        assert len(lines) == 5  # top border, header, rule, the row, bottom border

    def test_cat_to_a_terminal(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """On a terminal: text with its control characters escaped, binary refused (exit
        2); to a pipe: the exact bytes."""
        store = tmp_path / "s"
        _intake(cli, store, sample)
        zip_bytes = (sample / "wowdiag.zip").read_bytes()
        piped = subprocess.run([*VIANO,
                                "cat", "--store", str(store), "BUG-20", "inputs/wowdiag.zip"],
                               capture_output=True, env=child_env(), cwd=REPO, check=False)
        assert piped.returncode == 0 and piped.stdout == zip_bytes
        code, out = _on_a_terminal(["cat", "--store", str(store), "BUG-20",
                                    "inputs/wowdiag.zip"])
        assert code == 2 and b"is binary" in out and zip_bytes[:64] not in out
        code, out = _on_a_terminal(["cat", "--store", str(store), "BUG-20",
                                    "inputs/report.json"])
        assert code == 0 and b'"title"' in out


def _on_a_terminal(args: list[str]) -> tuple[int, bytes]:
    """``viano ARGS`` with stdout and stderr on a pseudo-terminal; its exit code and all it
    wrote there."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*VIANO,
                             *args], stdout=follower, stderr=follower, env=child_env(),
                            cwd=REPO)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks)


def test_every_json_document_is_one(cli: Cli, sample: Path, tmp_path: Path) -> None:
    """An error under --json is exactly one document on stdout."""
    r = cli("verify", "NOPE", "--store", tmp_path / "none", "--json")
    assert json.loads(r.out)["error"]["reason"] == "no_store"


def _commands_with(dest: str) -> list[tuple[str, list[str]]]:
    """Every subcommand with a ``dest`` positional, and the other arguments it requires
    (from the parser itself, so a command added later is covered too)."""
    import argparse

    from viano_bug_analysis.cli._parser import build_parser

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, p in sorted(sub.choices.items()):
        if not any(a.dest == dest for a in p._actions):
            continue
        rest = []
        for a in p._actions:
            if a.dest == dest:
                rest.append("{}")
            elif not a.option_strings and a.dest != "help":
                rest.append("x.zip")  # export's FILE, the only other positional
            elif a.required:
                rest += [a.option_strings[0], "r"]
        out.append((name, rest))
    return out


@pytest.mark.no_store
@pytest.mark.parametrize(("command", "rest"),
                         _commands_with("case") + _commands_with("cases"))
def test_every_case_argument_is_checked_as_a_case_id(cli: Cli, tmp_path: Path, command: str,
                                                     rest: list[str]) -> None:
    """``run BAD!`` said ``unknown_case`` where ``interpret BAD!`` said ``invalid_case_id``:
    every CASE argument is now checked by the parser, before any store or config is read."""
    store = tmp_path / "s"
    r = cli("--json", command, "--store", store, *[x.format("BAD!") for x in rest])
    assert r.code == 2, r.out
    assert r.json["error"]["reason"] == "invalid_case_id", r.out  # type: ignore[index]
    assert not store.exists()
    r = cli("--json", command, "--store", store, *[x.format("OK-1") for x in rest])
    assert r.json["error"]["reason"] != "invalid_case_id"  # type: ignore[index]


@pytest.mark.no_store
@pytest.mark.parametrize(("option", "value"), [
    ("--concurrency", "٥"), ("--concurrency", "1_0"), ("--concurrency", " 3"),
    ("--concurrency", "３"), ("--poll-s", "١"), ("--poll-s", "0.1_0"), ("--poll-s", "1.5 ")])
def test_numbers_are_ascii_digits(cli: Cli, tmp_path: Path, option: str, value: str) -> None:
    """Python's int() and float() take other scripts' digits, underscores and spaces;
    an option is a number as a person types it, in ASCII digits."""
    r = cli("--json", "daemon", "--store", tmp_path / "s", option, value)
    assert r.code == 2 and r.json["error"]["reason"] == "usage_error", r.out  # type: ignore
    assert "is not a" in r.json["error"]["message"]  # type: ignore[index]


@pytest.mark.no_store
def test_a_generation_is_ascii_digits(cli: Cli, tmp_path: Path) -> None:
    for value in ("٣", "1_0", " 1"):
        r = cli("--json", "show", "--store", tmp_path / "s", "C-1", "--generation", value)
        assert r.json["error"]["reason"] == "usage_error", r.out  # type: ignore[index]
