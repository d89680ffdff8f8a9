"""Gaps an audit of #7, #8 and #9 found in the command line: behaviours that were there with
no test that would fail without them — ``batch --wait`` across a failure, the readable
``viano log``, the demo's hypotheses, ``reopen``, ``status`` of a pending retry and its
``--summary``, ``confirm`` over an altered interpretation, and the ``--log-json`` lines.

The provider is the loopback server in its own process; Viano runs in-process (``cli``) or
as a real process (``run_viano``) where stderr or the entry point matters."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.batch_helpers import write_generic_answers
from tests.conftest import Cli, child_env, run_viano
from tests.loopback.process import Provider, start_provider
from tests.loopback.server import dead_port
from tests.phase_helpers import FIXTURES, SAMPLE, json_edit, rewrite_export
from tests.store_helpers import import_refused_then_placed

pytestmark = pytest.mark.usefixtures("backend")

KEY = "sk-VIANO-GAPS-0a1b2c3d4e5f6a7b"
I1 = "analysis/interpretation/0001/"


@pytest.fixture
def answers(tmp_path: Path) -> Path:
    """The loopback server's answers: the sample's own, and generic ones for other cases
    (<prompt_id>.json is the answer to any case)."""
    d = tmp_path / "answers"
    d.mkdir()
    (d / "interpretation_v1.json").write_text(
        (FIXTURES / "interpretation_v1" / "BUG-20.json").read_text())
    (d / "hypotheses_v1.json").write_text((FIXTURES / "hypotheses_v1" / "BUG-20.json").read_text())
    return d


@pytest.fixture
def generic_answers(tmp_path: Path) -> Path:
    return write_generic_answers(tmp_path / "generic")


_PROVIDERS: list[Provider] = []


@pytest.fixture(autouse=True)
def _stop_providers() -> Iterator[None]:
    yield
    while _PROVIDERS:
        _PROVIDERS.pop().stop()


def _provider(tmp: Path, answers: Path, **kw: Any) -> Provider:
    p = start_provider(tmp, answers, **kw)
    _PROVIDERS.append(p)
    return p


def _config(tmp: Path, providers: list[tuple[str, int]], extra: str = "") -> Path:
    cfg = tmp / f"cfg-{len(list(tmp.glob('cfg-*')))}.toml"
    cfg.write_text(extra + "".join(f"""
[[providers]]
name = "{name}"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "m"
api_key_env = "VIANO_GAPS_KEY"
retries = 0
timeout_s = 10
""" for name, port in providers))
    return cfg


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIANO_GAPS_KEY", KEY)


def _env(cfg: Path | None = None) -> dict[str, str]:
    extra = {"VIANO_GAPS_KEY": KEY}
    if cfg is not None:
        extra["VIANO_CONFIG"] = str(cfg)
    return child_env(**extra)


def _plain(table: str) -> str:
    """A table as text, its box-drawing characters blanked."""
    return re.sub(r"[\u2500-\u257f]", " ", table)


def _intake(cli: Cli, store: Path) -> None:
    r = cli("intake", "--store", store, "--report", SAMPLE / "report.json", "--attach",
            f"diagnostics={SAMPLE / 'wowdiag.zip'}")
    assert r.code == 0, r.err


def _dispatch(cli: Cli, command: str, store: Path, cfg: Path, *args: str
              ) -> tuple[int, dict[str, Any]]:
    r = cli(command, "BUG-20", "--json", "--store", store, "--config", cfg, *args)
    assert r.out.strip(), r.err
    doc = r.json
    assert isinstance(doc, dict)
    return r.code, doc


class TestBatchWait:
    def test_a_failure_then_an_answer_ends_completed(self, tmp_path: Path,
                                                     generic_answers: Path) -> None:
        """``viano batch --all --wait`` as a real process: the provider's first answer is a
        503, so one case waits for its retry (base delay 0.2 s); --wait sleeps until it
        is due and runs it; exit 0 with every case COMPLETED and the failure in the
        providers' statistics."""
        p = _provider(tmp_path, generic_answers, script="503")
        cfg = _config(tmp_path, [("loopback", p.port)],
                      "[interpretation]\nauto_confirm = true\n"
                      "[retry]\nbase_delay_s = 0.2\nmax_delay_s = 0.2\n")
        store = tmp_path / "s"
        for i in range(3):
            report = tmp_path / f"W-{i}.txt"
            report.write_text(f"Crash {i}\nIt crashes on start.\n")
            r = run_viano("intake", "--store", store, "--report", report, "--case-id",
                          f"W-{i}", env=_env())
            assert r.returncode == 0, r.stderr
        r = run_viano("batch", "--all", "--wait", "--json", "--concurrency", "1",
                      "--store", store, env=_env(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert sorted(x["case_id"] for x in doc["results"]) == ["W-0", "W-1", "W-2"]
        assert {(x["status"], x["phase"]) for x in doc["results"]} == {
            ("COMPLETED", "GENERATING_HYPOTHESES")}
        assert [c["mode"] for c in p.calls].count("503") == 1
        assert len(p.calls) == 7  # the refused call, then 2 per case
        status = json.loads(run_viano("status", "--json", "--store", store,
                                      env=_env()).stdout)
        assert {s["status"] for s in status} == {"COMPLETED"}


    @pytest.mark.parametrize("which", [["--all"], ["W-0"]], ids=["all", "one case"])
    def test_a_retry_pending_from_before_the_batch_is_waited_for(
            self, tmp_path: Path, generic_answers: Path, which: list[str]) -> None:
        """A retry made by an earlier command (here ``viano run``) and not yet due when
        ``batch --wait`` starts: the batch sleeps until it is due and runs it. It ended at
        once (``0 cases``, exit 0; or DEFERRED not_due, exit 11, for a named case), as it
        waited only for the retries its own rounds made."""
        p = _provider(tmp_path, generic_answers, script="503")
        cfg = _config(tmp_path, [("loopback", p.port)],
                      "[interpretation]\nauto_confirm = true\n"
                      "[retry]\nbase_delay_s = 3\nmax_delay_s = 3\n")
        store = tmp_path / "s"
        report = tmp_path / "W-0.txt"
        report.write_text("Crash\nIt crashes on start.\n")
        r = run_viano("intake", "--store", store, "--report", report, "--case-id", "W-0",
                      env=_env())
        assert r.returncode == 0, r.stderr
        first = run_viano("run", "--all", "--json", "--store", store, env=_env(cfg))
        assert first.returncode == 10, first.stdout + first.stderr  # RETRY_PENDING
        r = run_viano("batch", *which, "--wait", "--json", "--store", store, env=_env(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert [(x["case_id"], x["status"]) for x in doc["results"]] == [("W-0", "COMPLETED")]
        assert [c["mode"] for c in p.calls].count("503") == 1


class TestALoweredRoundLimit:
    @staticmethod
    def _intaken(cli: Cli, tmp_path: Path, answers: Path, *, script: str
                 ) -> tuple[Path, Path, Path]:
        """An intaken store, and configs with max_rounds = 5 and = 1 (no delay between
        rounds) for a provider that plays ``script``."""
        p = _provider(tmp_path, answers, script=script)
        fast = "base_delay_s = 0.000001\nmax_delay_s = 0.000001\n"
        five = _config(tmp_path, [("loopback", p.port)], f"[retry]\nmax_rounds = 5\n{fast}")
        one = _config(tmp_path, [("loopback", p.port)], f"[retry]\nmax_rounds = 1\n{fast}")
        store = tmp_path / "s"
        _intake(cli, store)
        return store, five, one

    def test_blocked_by_a_lowered_max_rounds_can_be_unblocked(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """Two unavailable rounds under max_rounds = 5, then max_rounds lowered to 1:
        dispatch says BLOCKED rounds_exhausted and hints at 'viano unblock', which refused
        (not_blocked: the last round was not marked blocked under the old limit), a dead
        end. Now the unblock records the limit it went by, verify accepts it, and a new
        series runs."""
        store, five, one = self._intaken(cli, tmp_path, answers, script="503,503")
        assert _dispatch(cli, "interpret", store, five)[0] == 10
        assert _dispatch(cli, "interpret", store, five)[0] == 10
        code, doc = _dispatch(cli, "interpret", store, one)
        assert (code, doc["status"], doc["reason"]) == (12, "BLOCKED", "rounds_exhausted"), doc
        r = cli("unblock", "BUG-20", "--by", "qa.lead", "--store", store, "--config", one)
        assert r.code == 0, r.err
        recorded = cli("cat", "BUG-20", "analysis/interpretation/0001/unblocks/0002.json",
                       "--store", store)
        assert json.loads(recorded.out)["exhausted_by_max_rounds"] == 1, recorded.out
        assert cli("verify", "--store", store).code == 0
        code, doc = _dispatch(cli, "interpret", store, one)
        assert (code, doc["status"], doc["reason"]) == (
            0, "COMPLETED", "awaiting_confirmation"), doc
        assert cli("verify", "--store", store).code == 0
        log = cli("log", "BUG-20", "--store", store)
        assert "unblock" in log.out, log.out

    def test_a_raised_max_rounds_does_not_run_a_blocked_series_on(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """Blocked under max_rounds = 1, then max_rounds raised to 5: dispatch ran more
        rounds without an unblock, a history verify refuses ("blocked its series, yet
        rounds follow it"), and the case was unsupported_history for good. It stays
        BLOCKED until 'viano unblock', which then opens a series that completes."""
        store, five, one = self._intaken(cli, tmp_path, answers, script="503")
        code, doc = _dispatch(cli, "interpret", store, one)
        assert (code, doc["reason"]) == (12, "rounds_exhausted"), doc
        code, doc = _dispatch(cli, "interpret", store, five)
        assert (code, doc["status"], doc["reason"]) == (12, "BLOCKED", "rounds_exhausted"), doc
        assert cli("verify", "--store", store).code == 0
        r = cli("unblock", "BUG-20", "--by", "qa.lead", "--store", store, "--config", five)
        assert r.code == 0, r.err
        code, doc = _dispatch(cli, "interpret", store, five)
        assert (code, doc["status"], doc["reason"]) == (
            0, "COMPLETED", "awaiting_confirmation"), doc
        assert cli("verify", "--store", store).code == 0

    def test_a_series_that_ended_on_a_rejected_answer_can_be_unblocked(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """An unavailable round, then an invalid answer (rejected), then max_rounds lowered
        to 1: dispatch under a new attempt id says BLOCKED rounds_exhausted (one
        unavailable round reaches the limit), and unblock refused with not_blocked (it
        asked for the series to end on an unavailable round): the same dead end by
        another road. Now one rule serves dispatch, unblock and the audit."""
        store, five, one = self._intaken(cli, tmp_path, answers, script="503,prose")
        assert _dispatch(cli, "interpret", store, five)[0] == 10
        code, doc = _dispatch(cli, "interpret", store, five)
        assert doc["reason"] == "invalid_answer", doc
        code, doc = _dispatch(cli, "interpret", store, one, "--attempt-id", "second")
        assert (code, doc["status"], doc["reason"]) == (12, "BLOCKED", "rounds_exhausted"), doc
        r = cli("unblock", "BUG-20", "--by", "qa.lead", "--store", store, "--config", one)
        assert r.code == 0, r.err
        assert cli("verify", "--store", store).code == 0
        code, doc = _dispatch(cli, "interpret", store, one, "--attempt-id", "second")
        assert (code, doc["status"], doc["reason"]) == (
            0, "COMPLETED", "awaiting_confirmation"), doc
        assert cli("verify", "--store", store).code == 0

    @pytest.mark.no_store  # pure: runs once, not per backend
    @pytest.mark.parametrize(("unblock", "outcomes", "stands"), [
        ({"exhausted_by_max_rounds": 2}, ["unavailable", "unavailable"], True),
        ({"exhausted_by_max_rounds": 1}, ["unavailable", "unavailable"], True),
        ({"exhausted_by_max_rounds": 3}, ["unavailable", "unavailable"], False),
        ({"exhausted_by_max_rounds": 0}, ["unavailable"], False),
        ({"exhausted_by_max_rounds": True}, ["unavailable"], False),
        ({"exhausted_by_max_rounds": "1"}, ["unavailable"], False),
        ({}, ["unavailable", "unavailable"], False),
        ({"exhausted_by_max_rounds": 1}, ["unavailable", "invalid"], True),
        ({"exhausted_by_max_rounds": 2}, ["unavailable", "invalid"], False),
    ])
    def test_the_audit_checks_the_limit_an_unblock_names(
            self, unblock: dict[str, Any], outcomes: list[str], stands: bool) -> None:
        """An unblock after a series that was not marked blocked stands only if the limit
        it names is a count its unavailable rounds reached (the rule dispatch answers
        BLOCKED by, whatever round came last)."""
        from engine._phases._history import _exhausted_by_a_lower_limit
        from engine._phases._protocol import RoundInfo

        rounds = [RoundInfo(f"r{i}", 1, i, o) for i, o in enumerate(outcomes, 1)]
        assert _exhausted_by_a_lower_limit(unblock, rounds) is stands


class TestLog:
    def test_the_phase_history_in_words(self, cli: Cli, tmp_path: Path,
                                        answers: Path) -> None:
        """Two unavailable rounds (the first with its next due time, the second blocking
        the series), an unblock, an invalid answer and its rejection, an answer under a new
        attempt id, the acceptance, the confirmation and a reopening: ``viano log`` tells
        each in words, naming the provider and why a round failed."""
        p = _provider(tmp_path, answers, script="503,503,prose")
        cfg = _config(tmp_path, [("loopback", p.port)],
                      "[retry]\nmax_rounds = 2\nbase_delay_s = 0.000001\n"
                      "max_delay_s = 0.000001\n")
        store = tmp_path / "s"
        _intake(cli, store)
        assert _dispatch(cli, "interpret", store, cfg)[0] == 10
        assert _dispatch(cli, "interpret", store, cfg)[0] == 12
        assert cli("unblock", "BUG-20", "--by", "qa.lead", "--store", store).code == 0
        code, doc = _dispatch(cli, "interpret", store, cfg)
        assert (code, doc["reason"]) == (13, "invalid_answer")
        assert _dispatch(cli, "interpret", store, cfg, "--attempt-id", "2")[0] == 0
        assert cli("confirm", "BUG-20", "--by", "qa.lead", "--store", store).code == 0
        assert cli("reopen", "BUG-20", "--reason", "new logs", "--by", "qa.lead",
                   "--store", store).code == 0
        r = cli("log", "BUG-20", "--store", store)
        assert r.code == 0, r.err
        text = re.sub(r"\s+", " ", r.out)
        due = re.search(r"round 1\.1 \(attempt 'default'\): providers_unavailable "
                        r"\(loopback: http_503\), next due (\S+)", text)
        assert due is not None, text
        for words in ("round 1.2 (attempt 'default'): providers_unavailable "
                      "(loopback: http_503)",
                      "unblocked by qa.lead (series 2)",
                      "round 2.1 (attempt 'default'): invalid_answer (loopback: not_json)",
                      "attempt 'default' rejected: 1 problem(s), first contracted_json at '/'",
                      "round 2.2 (attempt '2'): answer from loopback",
                      "interpretation accepted",
                      "interpretation confirmed by qa.lead",
                      "reopened as revision 2: new logs"):
            assert words in text, (words, text)
        assert "next due" not in text.split("round 1.2", 1)[1].split("unblocked", 1)[0]
        order = [text.index(w) for w in ("round 1.1", "round 1.2", "unblocked by",
                                         "round 2.1", "rejected", "round 2.2",
                                         "interpretation accepted", "confirmed by",
                                         "reopened as")]
        assert order == sorted(order)


class TestOperations:
    def test_reopen_through_the_cli(self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """``viano reopen --json``: exit 0, revision 2, the revision file recorded with who
        and why; the next dispatch interprets revision 2 afresh while revision 1 stays
        byte for byte."""
        p = _provider(tmp_path, answers)
        cfg = _config(tmp_path, [("loopback", p.port)])
        store = tmp_path / "s"
        _intake(cli, store)
        assert _dispatch(cli, "interpret", store, cfg)[0] == 0
        before = cli("show", "BUG-20", "--json", "--store", store).json
        assert isinstance(before, dict)
        r = cli("reopen", "BUG-20", "--reason", "a tester found more", "--by", "qa",
                "--json", "--store", store)
        assert r.code == 0, r.err
        doc = r.json
        assert isinstance(doc, dict)
        assert (doc["case_id"], doc["analysis_revision"], doc["phase"], doc["changed"]) == (
            "BUG-20", 2, "REOPENED", True)
        assert doc["package_generation"] == before["package_generation"] + 1
        rev = json.loads(cli("cat", "BUG-20", "analysis/revisions/0002.json", "--store",
                             store).out)
        assert (rev["reason"], rev["reopened_by"], rev["previous_revision"]) == (
            "a tester found more", "qa", 1)
        status = cli("status", "BUG-20", "--json", "--store", store).json
        assert isinstance(status, list) and status[0]["analysis_revision"] == 2
        code, result = _dispatch(cli, "interpret", store, cfg)
        assert (code, result["analysis_revision"]) == (0, 2)
        after = cli("show", "BUG-20", "--json", "--store", store).json
        assert isinstance(after, dict)
        assert {k: v for k, v in after["files"].items() if k in before["files"]} == \
            before["files"]
        assert "analysis/interpretation/0002/interpretation.json" in after["files"]

    def test_status_shows_the_round_and_due_time_of_a_pending_retry(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        port = dead_port()
        cfg = _config(tmp_path, [("gone", port)], "[retry]\nmax_rounds = 4\n")
        store = tmp_path / "s"
        _intake(cli, store)
        code, result = _dispatch(cli, "interpret", store, cfg)
        assert (code, result["status"], result["round"]) == (10, "RETRY_PENDING", 1)
        rows = cli("status", "--json", "--store", store).json
        assert isinstance(rows, list)
        row = rows[0]
        assert (row["status"], row["reason"], row["round"], row["max_rounds"]) == (
            "RETRY_PENDING", "providers_unavailable", 1, 4)
        assert row["due_at"] == result["due_at"] and row["due_at"] is not None
        table = _plain(cli("status", "--store", store).out)
        line = next(x for x in table.splitlines() if x.strip().startswith("BUG-20"))
        assert "RETRY_PENDING" in line and row["due_at"] in line
        assert re.search(r"providers_unavailable\s+1\s", line), line

    def test_confirm_is_refused_over_an_altered_interpretation(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """The accepted interpretation's statements edited in an export (every hash
        recomputed, so import takes it): ``viano confirm`` refuses with
        interpretation_mismatch and writes nothing."""
        p = _provider(tmp_path, answers)
        cfg = _config(tmp_path, [("loopback", p.port)])
        store = tmp_path / "a"
        _intake(cli, store)
        assert _dispatch(cli, "interpret", store, cfg)[1]["reason"] == "awaiting_confirmation"
        assert cli("export", "BUG-20", tmp_path / "x.zip", "--store", store).code == 0

        def reword(doc: dict[str, Any], _sha: Callable[[str], str]) -> None:
            doc["statements"][0]["text"] = "The root cause is known."

        rewrite_export(tmp_path / "x.zip", tmp_path / "e.zip",
                       [(I1 + "interpretation.json", json_edit(reword))])
        other = tmp_path / "b"
        import_refused_then_placed(tmp_path / "e.zip", other, run_viano)
        before = cli("show", "BUG-20", "--json", "--store", other).json
        r = cli("confirm", "BUG-20", "--by", "qa", "--json", "--store", other)
        assert r.code == 2, r.out
        err = r.json
        assert isinstance(err, dict)
        assert err["error"]["reason"] == "interpretation_mismatch"
        assert "statements differ" in err["error"]["message"]
        assert cli("show", "BUG-20", "--json", "--store", other).json == before


class TestDemo:
    def test_the_demo_shows_three_hypotheses_with_mechanism_and_falsification(
            self, cli: Cli, tmp_path: Path) -> None:
        r = cli("demo")
        assert r.code == 0, r.err
        sections = re.split(r"^## ", r.out, flags=re.MULTILINE)
        found = {s.split(":", 1)[0]: s for s in sections[1:] if re.match(r"H\d+:", s)}
        assert {"H1", "H2", "H3"} <= set(found), list(found)
        for label in ("H1", "H2", "H3"):
            body = found[label]
            mechanism = re.search(r"\*\*Mechanism\.\*\* (\S.*)", body)
            assert mechanism is not None, (label, body)
            falsifying = body.split("**Falsifying evidence:**", 1)
            assert len(falsifying) == 2, (label, body)
            assert re.search(r"^- \S", falsifying[1].split("**Open questions:**")[0],
                             flags=re.MULTILINE), (label, body)
            assert "**Expected evidence:**" in body
        assert "verify: ok" in r.out


class TestLogJson:
    def test_step_lines_carry_the_contract_fields_and_are_quiet_by_default(
            self, tmp_path: Path, answers: Path) -> None:
        """An interpretation accepted and waiting for a person, then ``viano run --log-json
        -`` under auto_confirm: one JSON line per step on stderr — the engine's confirm,
        then the hypotheses' enter, round and accept — each with case_id, phase,
        analysis_revision, package_generation, step, status and reason; the same run
        without --log-json writes nothing to stderr."""
        p = _provider(tmp_path, answers)
        waiting = _config(tmp_path, [("loopback", p.port)])
        auto = _config(tmp_path, [("loopback", p.port)], "[interpretation]\n"
                                                          "auto_confirm = true\n")
        lines: list[dict[str, Any]] = []
        for store, flags in ((tmp_path / "quiet", []), (tmp_path / "loud", ["--log-json", "-"])):
            r = run_viano("intake", "--store", store, "--report", SAMPLE / "report.json",
                          "--attach", f"diagnostics={SAMPLE / 'wowdiag.zip'}", env=_env())
            assert r.returncode == 0, r.stderr
            r = run_viano("interpret", "BUG-20", "--store", store, *flags, env=_env(waiting))
            assert r.returncode == 0, r.stdout + r.stderr
            lines += [json.loads(x) for x in r.stderr.splitlines()]
            r = run_viano("run", "BUG-20", "--store", store, *flags, env=_env(auto))
            assert r.returncode == 0, r.stdout + r.stderr
            if not flags:
                assert r.stderr == ""
                continue
            lines += [json.loads(x) for x in r.stderr.splitlines()]
        steps = [x for x in lines if x.get("event") == "step"]
        fields = {"case_id", "phase", "analysis_revision", "package_generation", "step",
                  "status", "reason"}
        for x in steps:
            assert fields <= set(x), x
            assert x["case_id"] == "BUG-20" and x["analysis_revision"] == 1, x
            assert isinstance(x["package_generation"], int)
        seen = [(x["phase"], x["step"]) for x in steps]
        assert seen[:3] == [("INTERPRETING_CASE", "enter"), ("INTERPRETING_CASE", "round"),
                            ("INTERPRETING_CASE", "accept")], seen
        assert ("INTERPRETING_CASE", "confirm") in seen
        for step in ("enter", "round", "accept"):
            assert ("GENERATING_HYPOTHESES", step) in seen, seen
        results = [x for x in lines if x.get("event") == "result"]
        assert results and results[-1]["status"] == "COMPLETED"
        assert results[-1]["phase"] == "GENERATING_HYPOTHESES"
        assert not [x for x in lines if KEY in json.dumps(x)]


class TestStatusSummary:
    def test_counts_by_phase_and_status_and_per_provider_statistics(
            self, cli: Cli, tmp_path: Path, answers: Path) -> None:
        """A provider that refuses connections, then cools down, and one that answers:
        ``viano status --summary --json`` counts the cases by phase and status, and per
        provider the answers, failures by class and cooldown skips of every recorded
        round."""
        p = _provider(tmp_path, answers)
        cfg = _config(tmp_path, [("down", dead_port()), ("up", p.port)],
                      "[interpretation]\nauto_confirm = true\n"
                      "[gateway]\ncooldown_after = 1\ncooldown_s = 3600\n")
        store = tmp_path / "s"
        _intake(cli, store)
        r = cli("run", "BUG-20", "--store", store, "--config", cfg)
        assert r.code == 0, r.out + r.err
        report = tmp_path / "other.txt"
        report.write_text("Another crash\nIt crashes.\n")
        assert cli("intake", "--store", store, "--report", report, "--case-id",
                   "NEW-1").code == 0
        doc = cli("status", "--summary", "--json", "--store", store).json
        assert isinstance(doc, dict)
        assert doc["cases"] == 2
        assert doc["by_phase_and_status"] == {"GENERATING_HYPOTHESES": {"COMPLETED": 1},
                                              "INTAKE": {"READY": 1}}
        assert doc["providers"] == {
            "down": {"answers": 0, "failures": {"unavailable": 1}, "cooldown_skips": 1},
            "up": {"answers": 2, "failures": {}, "cooldown_skips": 0}}
        text = _plain(cli("status", "--summary", "--store", store).out)
        assert re.search(r"down\s+0\s+unavailable 1\s+1", text), text
