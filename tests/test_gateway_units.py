"""Pure pieces of the gateway: contracted JSON, Retry-After, classes, redaction, fixtures."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import open_gateway
from engine import (
    FailureClass,
    InvalidAnswer,
    ProviderConfig,
    Redactor,
    RetryPolicy,
    RoundStatus,
    backoff_delay,
    due_delay,
    parse_contracted_json,
    retry_after_seconds,
)
from engine._gateway import classify_exception, classify_status, doubled
from tests.gateway_helpers import FAST, request


class TestContractedJson:
    @pytest.mark.parametrize("content", [
        '{"a": 1}', '  {"a": 1}\n', '```json\n{"a": 1}\n```', '```\n{"a": 1}\n```',
        '\n ```json\n{"a": 1}\n```  \n'])
    def test_accepted(self, content: str) -> None:
        """One object, bare or in a single fence with only whitespace around it."""
        assert parse_contracted_json(content) == {"a": 1}

    @pytest.mark.parametrize(("content", "detail"), [
        ("", "empty_content"), ("   ", "empty_content"), ('[{"a": 1}]', "not_an_object"),
        ('"text"', "not_an_object"), ('{"a": 1} {"b": 2}', "not_json"),
        ('Sure! {"a": 1}', "not_json"), ('```json\n{"a": 1}\n``` thanks', "not_json"),
        ('```json\n{"a": 1}\n```\n```json\n{"b": 2}\n```', "not_json"), ("{bad", "not_json")])
    def test_refused(self, content: str, detail: str) -> None:
        """Prose around it, two objects, lists and scalars are invalid answers."""
        with pytest.raises(InvalidAnswer) as info:
            parse_contracted_json(content)
        assert info.value.detail == detail

    @given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5)))
    def test_any_object_round_trips(self, doc: dict[str, object]) -> None:
        """Any JSON object, fenced or not, parses back to itself."""
        raw = json.dumps(doc)
        assert parse_contracted_json(raw) == doc
        assert parse_contracted_json(f"```json\n{raw}\n```") == doc


class TestRetryAfter:
    def test_forms(self) -> None:
        """Seconds, milliseconds (preferred) and HTTP dates; garbage is ignored."""
        now = datetime(2026, 11, 30, tzinfo=UTC)
        assert retry_after_seconds({"Retry-After": "12"}) == 12.0
        assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
        when = format_datetime(now + timedelta(seconds=90), usegmt=True)
        assert retry_after_seconds({"retry-after": when}, now=now) == pytest.approx(90)
        assert retry_after_seconds({"retry-after": "soon"}) is None
        assert retry_after_seconds({}) is None
        assert retry_after_seconds({"retry-after": "-5"}) == 0.0

    @given(st.integers(min_value=0, max_value=20), st.integers(min_value=0, max_value=2**32))
    def test_backoff_within_bounds(self, n: int, seed: int) -> None:
        """Backoff never exceeds min(max, base * 2**n) and is never negative."""
        d = backoff_delay(n, 0.5, 8.0, random.Random(seed))
        assert 0 <= d <= min(8.0, 0.5 * 2 ** n)

    @given(st.integers(min_value=0, max_value=5000),
           st.floats(min_value=0.0, max_value=86400.0),
           st.floats(min_value=0.0, max_value=86400.0))
    def test_doubling_never_overflows(self, n: int, base: float, cap: float) -> None:
        """Exactly min(cap, base * 2**n) for every n, also past 1,024, where it raised
        OverflowError (a round count the config allows reaches it), and for a subnormal
        base, which a clamped exponent got wrong."""
        from fractions import Fraction

        base, cap = min(base, cap), max(base, cap)
        d = doubled(base, cap, n)
        assert Fraction(d) == min(Fraction(cap), Fraction(base) * 2 ** n)
        assert 0.0 <= backoff_delay(n, base, cap, random.Random(n)) <= cap
        assert doubled(5e-324, 1.0, 1100) == 1.0 and doubled(1.0, 2.0, 10**9) == 2.0

    @pytest.mark.parametrize("rounds", [1, 2, 1024, 1025, 10**6])
    def test_the_round_delay_is_capped_at_any_round(self, rounds: int) -> None:
        retry = RetryPolicy(max_rounds=10**6, base_delay_s=1e-6, max_delay_s=1e-6 * 4)
        assert due_delay(rounds, retry) == (1e-6 * 2 ** (rounds - 1) if rounds < 3 else 4e-6)


class TestClasses:
    @pytest.mark.parametrize(("status", "cls"), [
        (200, None), (201, None), (408, FailureClass.UNAVAILABLE),
        (429, FailureClass.UNAVAILABLE), (500, FailureClass.UNAVAILABLE),
        (503, FailureClass.UNAVAILABLE), (599, FailureClass.UNAVAILABLE),
        (400, FailureClass.CONFIGURATION), (401, FailureClass.CONFIGURATION),
        (403, FailureClass.CONFIGURATION), (404, FailureClass.CONFIGURATION),
        (422, FailureClass.CONFIGURATION), (301, FailureClass.CONFIGURATION)])
    def test_status(self, status: int, cls: FailureClass | None) -> None:
        """Classification is by status code, per the contract."""
        assert classify_status(status) is cls

    def test_exceptions(self) -> None:
        """Transport errors are unavailability; a bad URL scheme is configuration."""
        assert classify_exception(httpx.ConnectError("x")) is FailureClass.UNAVAILABLE
        assert classify_exception(httpx.ReadTimeout("x")) is FailureClass.UNAVAILABLE
        assert classify_exception(httpx.UnsupportedProtocol("x")) is FailureClass.CONFIGURATION


class TestRedactor:
    def test_urls_headers_and_text(self) -> None:
        """Key-like query parameters, URL credentials, secret headers and echoed values."""
        r = Redactor(["sk-abcdef123456"])
        url = r.url("https://u:pw@h.example/v1?key=zzz&api_key=yyy&model=m&token=t")
        assert "zzz" not in url and "yyy" not in url and "pw" not in url and "model=m" in url
        h = r.headers({"Authorization": "Bearer sk-abcdef123456", "X-Api-Key": "k",
                       "content-type": "application/json", "x-echo": "sk-abcdef123456"})
        assert h == {"authorization": "[REDACTED]", "x-api-key": "[REDACTED]",
                     "content-type": "application/json", "x-echo": "[REDACTED]"}
        assert r.text("key is sk-abcdef123456.") == "key is [REDACTED]."


class TestFixtureProvider:
    async def test_answers_from_files(self, tmp_path: Path) -> None:
        """Keyed by prompt id and case (else default.json); deterministic; missing is a
        configuration failure; off-contract content is an invalid answer."""
        base = tmp_path / "fixtures" / "hypotheses_v1"
        base.mkdir(parents=True)
        (base / "BUG-20.json").write_text('```json\n{"summary": "s", "items": []}\n```')
        (base / "default.json").write_text('Sure! {"summary": "d", "items": []}')
        p = ProviderConfig(name="fx", kind="fixture", path=str(tmp_path / "fixtures"))
        async with open_gateway([p], FAST) as gw:
            one = await gw.round(request("BUG-20"))
            two = await gw.round(request("BUG-20"))
            other = await gw.round(request("BUG-99"))
        assert one.status is RoundStatus.ANSWER and one.parsed == {"summary": "s", "items": []}
        assert one.parsed == two.parsed and one.content == two.content
        assert other.status is RoundStatus.INVALID_ANSWER
        assert other.attempts[0].detail == "not_json"
        missing = ProviderConfig(name="fx", kind="fixture", path=str(tmp_path / "nowhere"))
        async with open_gateway([missing], FAST) as gw:
            none = await gw.round(request("BUG-20"))
        assert none.status is RoundStatus.CONFIGURATION
        assert none.attempts[0].detail == "fixture_missing"


class TestFixtureAnswersAreReadWithinTheLimit:
    """A fixture answer is read no further than the output limit, whatever its size: a
    sparse file of 3 GiB under an address-space limit of 1 GiB is an over-limit answer,
    not a MemoryError; one that cannot be read is a configuration failure."""

    CHILD = """
import resource, sys, trio
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from actors import open_gateway
from engine import ProviderConfig
from tests.gateway_helpers import FAST, request

async def main():
    p = ProviderConfig(name="fx", kind="fixture", path=sys.argv[1])
    async with open_gateway([p], FAST) as gw:
        out = await gw.round(request("BUG-20"))
    print(out.status.name, out.attempts[0].detail)

trio.run(main)
"""

    def test_a_huge_answer_file(self, tmp_path: Path) -> None:
        import subprocess

        from tests.conftest import PYTHON, REPO, child_env

        base = tmp_path / "fixtures" / "hypotheses_v1"
        base.mkdir(parents=True)
        with open(base / "BUG-20.json", "wb") as f:
            f.truncate(3 << 30)  # sparse: no disk is used
        proc = subprocess.run([PYTHON, "-c", self.CHILD, str(tmp_path / "fixtures")],
                              cwd=REPO, env=child_env(), capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["INVALID_ANSWER", "output_limit_exceeded"]

    async def test_an_unreadable_answer_file(self, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        from engine._gateway import _attempt

        base = tmp_path / "fixtures" / "hypotheses_v1"
        base.mkdir(parents=True)
        (base / "BUG-20.json").write_text("{}")

        def denied(path: Path) -> None:
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(_attempt, "open_regular", denied)  # as root, chmod cannot
        p = ProviderConfig(name="fx", kind="fixture", path=str(tmp_path / "fixtures"))
        async with open_gateway([p], FAST) as gw:
            out = await gw.round(request("BUG-20"))
        assert out.status is RoundStatus.CONFIGURATION
        assert out.attempts[0].detail == "fixture_unreadable"
        assert "Permission denied" in (out.attempts[0].error or "")


async def test_a_fixture_answer_that_is_not_utf8_is_a_bad_envelope(tmp_path: Path) -> None:
    """As strict as an HTTP body: not U+FFFD substituted and accepted."""
    base = tmp_path / "fixtures" / "hypotheses_v1"
    base.mkdir(parents=True)
    (base / "BUG-20.json").write_bytes(b'{"summary": "\xff", "items": []}')
    p = ProviderConfig(name="fx", kind="fixture", path=str(tmp_path / "fixtures"))
    async with open_gateway([p], FAST) as gw:
        out = await gw.round(request("BUG-20"))
    assert out.status is RoundStatus.INVALID_ANSWER
    assert out.attempts[0].detail == "bad_envelope"


class TestRedactorPrecheck:
    """The fast pre-check never lets through what the full pattern would mask."""

    SECRET = "sk-LIVE-9f8e7d6c5b4a"

    def _forms(self) -> list[str]:
        s = self.SECRET
        return [s, s.upper(), s.lower(), s.replace("s", "\u017f", 1),
                s.replace("k", "\u212a", 1), "".join(f"\\u{ord(c):04x}" for c in s),
                "".join(f"%{ord(c):02x}" for c in s), "".join(f"&#{ord(c)};" for c in s),
                s[:4] + "%25" + f"{ord(s[4]):02x}" + s[5:]]

    def test_every_form_is_masked_and_plain_text_passes_untouched(self) -> None:
        from engine._gateway._redact import MASK, Redactor

        r = Redactor([self.SECRET, "a/b/c/secret-path-token"])
        for form in self._forms():
            for text in (form, f"x {form} y", f'{{"k": "{form}", "n": "\\n"}}'):
                assert self.SECRET.lower() not in r.text(text).lower(), text
                assert MASK in r.text(text), text
        assert r.text('{"p": "a\\/b\\\\/c\\/secret-path-token"}') == '{"p": "[REDACTED]"}'
        plain = '{"context": "ünïcode \\n no secret here, 50 percent"}' * 500
        assert r.text(plain) is plain  # the fast path: the very same object back

    def test_a_secret_added_later_changes_the_precheck_too(self) -> None:
        """The pre-check's view of the secrets is made when one is added: a later secret
        with a space (whose ``+`` form is no plain substring) turns the fast path off, and
        a later plain one is looked for by it."""
        from engine._gateway._redact import MASK, Redactor

        r = Redactor([self.SECRET])
        r.add("open sesame 1234")
        assert r.text("q=open+sesame+1234") == f"q={MASK}"
        r = Redactor([self.SECRET])
        r.add("tok/en-added-later")
        assert r.text('{"k": "tok\\/en-added-later"}') == f'{{"k": "{MASK}"}}'

    def test_the_precheck_agrees_with_the_pattern(self) -> None:
        from hypothesis import given, settings
        from hypothesis import strategies as st

        from engine._gateway._redact import Redactor

        r = Redactor([self.SECRET])
        assert r._pattern is not None
        pieces = st.sampled_from([*self._forms(), "\\", "/", "\\/", "İ", "ı", "K", "ſ",
                                  "sk-", "LIVE", "%", "&", "#", "u", " ", "ü", "\n"])

        @settings(max_examples=300, deadline=None)
        @given(st.lists(st.one_of(pieces, st.text(max_size=5)), max_size=12))
        def check(parts: list[str]) -> None:
            text = "".join(parts)
            if r._cannot_hold_a_secret(text):
                assert r._pattern.search(text) is None, text  # type: ignore[union-attr]

        check()
