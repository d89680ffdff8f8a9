"""The gateway against a server that writes whatever it likes on the socket (found by a
hostile probe, 2026-12-05): compression bombs (stacked, single and corrupt encodings),
infinite Retry-After values, a secret in a response header's name, and masking that took
quadratic time on runs of backslashes. Each answer is a raw HTTP/1.1 response."""

from __future__ import annotations

import gzip
import json
import subprocess
import tracemalloc
import zlib
from collections import deque

import attrs
import pytest
import trio

from actors import open_gateway
from engine import FailureClass, RoundStatus, canonical_json
from tests.conftest import PYTHON, REPO, child_env
from tests.gateway_helpers import ENV, FAST, SECRET, provider, request

pytestmark = pytest.mark.no_store

GOOD = json.dumps({"choices": [{"message": {"role": "assistant",
                                            "content": json.dumps({"ok": True})}}]}).encode()


def response(status: int = 200, body: bytes = GOOD, *headers: tuple[str, str]) -> bytes:
    head = [f"HTTP/1.1 {status} X", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close",
            *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class RawServer:
    """Answers each request with the next queued raw response (then closes)."""

    def __init__(self) -> None:
        self.answers: deque[bytes] = deque()
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    async def _one(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += await stream.receive_some(65536)
        try:
            with trio.move_on_after(30):
                await stream.send_all(self.answers.popleft())
        except trio.BrokenResourceError:
            pass  # the client abandoned the body (past its limit)
        await stream.aclose()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
async def raw(nursery: trio.Nursery) -> RawServer:
    server = RawServer()
    await nursery.start(server.serve)
    return server


def _one_provider(raw: RawServer, **kw: object) -> list:  # type: ignore[type-arg]
    return [provider("p", "openai", raw.url, **{"retries": 0, **kw})]


class TestContentEncoding:
    async def test_a_stacked_gzip_bomb_is_refused_unread(self, raw: RawServer) -> None:
        """``gzip, gzip`` over 1 GiB of zeros (a few KB sent) became 1 GiB in one call of
        httpx's decoder, the limit looked at only after it (2.1 GB of RSS)."""
        bomb = gzip.compress(gzip.compress(b"\0" * (1 << 30), 9), 9)
        raw.answers.append(response(200, bomb, ("content-encoding", "gzip, gzip")))
        tracemalloc.start()
        try:
            async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
                outcome = await gw.round(request())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert outcome.status is RoundStatus.INVALID_ANSWER
        assert [a.detail for a in outcome.attempts] == ["unsupported_content_encoding"]
        assert peak < 64 << 20, peak

    async def test_one_gzip_layer_is_decoded_within_the_limit(self, raw: RawServer) -> None:
        """256 MiB of zeros in one gzip layer against a 1 MiB limit: cut at the limit, and
        no decode produces more than the limit has room for (httpx's made up to 64 MB per
        network chunk)."""
        bomb = gzip.compress(b"\0" * (256 << 20), 9)
        raw.answers.append(response(200, bomb, ("content-encoding", "gzip")))
        tracemalloc.start()
        try:
            async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
                outcome = await gw.round(request())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [a.detail for a in outcome.attempts] == ["output_limit_exceeded"]
        assert peak < 16 << 20, peak

    @pytest.mark.parametrize(("encoding", "encode"), [
        ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send
        ("identity", lambda b: b), ("GZip", gzip.compress)])
    async def test_encodings_a_server_may_send_are_read(self, raw: RawServer, encoding: str,
                                                        encode: object) -> None:
        assert callable(encode)
        raw.answers.append(response(200, encode(GOOD), ("content-encoding", encoding)))
        async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.ANSWER, outcome.attempts
        assert outcome.parsed == {"ok": True}

    @pytest.mark.parametrize(("encoding", "body", "detail"), [
        ("br", GOOD, "unsupported_content_encoding"),
        ("zstd", GOOD, "unsupported_content_encoding"),
        ("gzip, identity, deflate", GOOD, "unsupported_content_encoding"),
        ("gzip", b"not gzip at all", "bad_content_encoding"),
        ("gzip", gzip.compress(GOOD, mtime=0)[:-12], "bad_content_encoding"),  # cut short
        ("deflate", b"\x78\x9c garbage", "bad_content_encoding")],
        ids=["br", "zstd", "stacked", "not-gzip", "gzip-cut-short", "deflate-garbage"])
    async def test_other_encodings_and_corrupt_data_are_refused(
            self, raw: RawServer, encoding: str, body: bytes, detail: str) -> None:
        raw.answers.append(response(200, body, ("content-encoding", encoding)))
        async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.INVALID_ANSWER
        assert [(a.failure, a.detail) for a in outcome.attempts] == [
            (FailureClass.INVALID_ANSWER, detail)]

    async def test_a_failure_status_still_decides(self, raw: RawServer) -> None:
        """A 503 whose body cannot be decoded is still a 503: unavailable, retried."""
        raw.answers.extend([response(503, b"junk", ("content-encoding", "br")),
                            response(200)])
        async with open_gateway(_one_provider(raw, retries=1), FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.ANSWER
        assert [a.detail for a in outcome.attempts] == ["http_503", "ok"]


    @pytest.mark.parametrize("answer", [
        response(202, b"junk", ("content-encoding", "br")),
        response(202, GOOD, ("content-encoding", "zstd")),
        response(206, b"x" * 4096)], ids=["202-refused", "202-unsupported", "206-over"])
    async def test_a_2xx_not_200_that_cannot_be_read_is_not_the_api(
            self, raw: RawServer, answer: bytes) -> None:
        """A 202 in a refused encoding, or a 206 over the output limit, is as much "not the
        API's answer" as one without an envelope: configuration, so the next provider is
        asked. Both were invalid answers, which end the round with no failover."""
        second = RawServer()
        async with trio.open_nursery() as nursery:
            await nursery.start(second.serve)
            raw.answers.append(answer)
            second.answers.append(response(200))
            providers = [*_one_provider(raw),
                         provider("q", "openai", second.url, retries=0)]
            async with open_gateway(providers, FAST, environ=ENV) as gw:
                outcome = await gw.round(attrs.evolve(request(), max_output_bytes=1024))
            nursery.cancel_scope.cancel()
        assert outcome.status is RoundStatus.ANSWER, outcome.attempts
        status = int(answer.split()[1])
        assert [(a.failure, a.detail) for a in outcome.attempts] == [
            (FailureClass.CONFIGURATION, f"http_{status}"), (None, "ok")]

    async def test_a_200_over_the_limit_is_still_an_invalid_answer(
            self, raw: RawServer) -> None:
        raw.answers.append(response(200, b"x" * 4096))
        async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
            outcome = await gw.round(attrs.evolve(request(), max_output_bytes=1024))
        assert [(a.failure, a.detail) for a in outcome.attempts] == [
            (FailureClass.INVALID_ANSWER, "output_limit_exceeded")]


class TestRetryAfter:
    @pytest.mark.parametrize("header", [("retry-after", "inf"), ("retry-after", "1e400"),
                                        ("retry-after", "Infinity"), ("retry-after", "nan"),
                                        ("retry-after-ms", "inf"), ("retry-after-ms", "-inf")])
    async def test_a_non_finite_wait_never_reaches_the_record(
            self, raw: RawServer, nursery: trio.Nursery, header: tuple[str, str]) -> None:
        """p0 says 429 with an infinite wait, p1 answers: the round is p1's answer, and its
        record can be stored (an infinite retry_after_s made the store refuse the round:
        internal_error, the answer lost, every rerun the same)."""
        other = RawServer()
        await nursery.start(other.serve)
        raw.answers.append(response(429, b"{}", header))
        other.answers.append(response(200))
        providers = [provider("p0", "openai", raw.url, retries=0),
                     provider("p1", "openai", other.url, retries=0)]
        async with open_gateway(providers, FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.ANSWER and outcome.provider == "p1"
        waits = [a.retry_after_s for a in outcome.attempts]
        assert all(w is None or 0 <= w <= 366 * 86400 for w in waits), waits
        canonical_json(outcome.to_json())  # what the phase stores: no ValueError

    def test_the_record_itself_refuses_an_infinite_wait(self) -> None:
        from engine import AuditRecord

        record = AuditRecord(prompt_id="p", provider="p", kind="openai", attempt=1, retry=0,
                             url="", request_headers={}, request_body="", status=429,
                             response_headers={}, response_body="", response_truncated=False,
                             started_at="", duration_ms=0.0, failure=None, detail="x",
                             error="", retry_after_s=float("inf"))
        assert record.retry_after_s is None
        assert attrs.evolve(record, retry_after_s=float("nan")).retry_after_s is None


class TestSecretsInTheResponse:
    async def test_a_header_name_carrying_the_key_is_masked(self, raw: RawServer) -> None:
        raw.answers.append(response(200, GOOD, (f"x-{SECRET}", "1"),
                                    ("x-echo", f"Bearer {SECRET}")))
        async with open_gateway(_one_provider(raw), FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.ANSWER
        stored = json.dumps(outcome.to_json()).lower()
        assert SECRET.lower() not in stored
        assert SECRET.lower()[3:15] not in stored

    def test_masking_is_linear_on_runs_of_backslashes(self) -> None:
        """``\\u`` then 2 MiB of backslashes: each start inside the run scanned the rest of
        it (46 s for 128 KiB at the event loop, hours for 2 MiB). Run in a child bounded at
        120 s, a bound ~1,000 times what a linear pass takes, so only a hang fails it."""
        script = ("from engine._gateway._redact import Redactor\n"
                  f"r = Redactor([{SECRET!r}, 'a/b/c/d', 'pässwörd'])\n"
                  "for text in ('\\\\u' + '\\\\' * (1 << 21), '\\\\' * (1 << 21) + '/',\n"
                  "             '\\\\x' + '\\\\' * (1 << 21), 's\\\\' * (1 << 20)):\n"
                  "    assert r.text(text) == text\n"
                  f"assert r.text('\\\\\\\\u0073' + {SECRET[1:]!r}) == '[REDACTED]'\n"
                  "print('ok')\n")
        r = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True,
                           timeout=120, env=child_env(), cwd=REPO, check=False)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
