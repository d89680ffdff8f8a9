"""Every fault mode through the real httpx adapter against the loopback server, for both
wire formats: the right class, the right failover/retry, the right attempt list, no secret."""

from __future__ import annotations

import json

import pytest
import trio

from actors import open_gateway
from engine import FailureClass, RoundStatus
from tests.gateway_helpers import ENV, FAST, SECRET, dump, provider, request
from tests.loopback import LoopbackServer, dead_port

U, C, INV = FailureClass.UNAVAILABLE, FailureClass.CONFIGURATION, FailureClass.INVALID_ANSWER
# mode -> (failure class of each attempt, detail(s), round status); retries=1
CASES = {
    "ok": (None, {"ok"}, RoundStatus.ANSWER, 1),
    "fenced": (None, {"ok"}, RoundStatus.ANSWER, 1),
    "close": (U, {"remote_protocol_error"}, RoundStatus.UNAVAILABLE, 2),
    "hang": (U, {"total_deadline", "read_timeout"}, RoundStatus.UNAVAILABLE, 2),
    "drip": (U, {"total_deadline"}, RoundStatus.UNAVAILABLE, 2),
    "500": (U, {"http_500"}, RoundStatus.UNAVAILABLE, 2),
    "502": (U, {"http_502"}, RoundStatus.UNAVAILABLE, 2),
    "503": (U, {"http_503"}, RoundStatus.UNAVAILABLE, 2),
    "429": (U, {"http_429"}, RoundStatus.UNAVAILABLE, 2),
    "429-ms": (U, {"http_429"}, RoundStatus.UNAVAILABLE, 2),
    "429-long": (U, {"http_429"}, RoundStatus.UNAVAILABLE, 1),
    "401": (C, {"http_401"}, RoundStatus.CONFIGURATION, 1),
    "403": (C, {"http_403"}, RoundStatus.CONFIGURATION, 1),
    "404": (C, {"http_404"}, RoundStatus.CONFIGURATION, 1),
    "400": (C, {"http_400"}, RoundStatus.CONFIGURATION, 1),
    "malformed": (INV, {"bad_envelope"}, RoundStatus.INVALID_ANSWER, 1),
    "truncated": (U, {"remote_protocol_error"}, RoundStatus.UNAVAILABLE, 2),
    "oversized": (INV, {"output_limit_exceeded"}, RoundStatus.INVALID_ANSWER, 1),
    "empty": (INV, {"empty_content"}, RoundStatus.INVALID_ANSWER, 1),
    "prose": (INV, {"not_json"}, RoundStatus.INVALID_ANSWER, 1),
    # Content is the phase's to judge: one JSON object is an answer, whatever its keys.
    "extra_keys": (None, {"ok"}, RoundStatus.ANSWER, 1),
    "deep": (INV, {"json_too_deep"}, RoundStatus.INVALID_ANSWER, 1),
    "duplicate_keys": (INV, {"json_duplicate_key"}, RoundStatus.INVALID_ANSWER, 1),
    "list": (INV, {"not_an_object"}, RoundStatus.INVALID_ANSWER, 1),
    # The envelope is read as strictly as the answer: deep nesting beside a good answer was
    # a RecursionError that ended the gateway pool (and a daemon with it); a second
    # "choices" or a NaN was read silently.
    "envelope_deep": (INV, {"bad_envelope"}, RoundStatus.INVALID_ANSWER, 1),
    "envelope_duplicate": (INV, {"bad_envelope"}, RoundStatus.INVALID_ANSWER, 1),
    "envelope_nan": (INV, {"bad_envelope"}, RoundStatus.INVALID_ANSWER, 1),
    # A 2xx other than 200 is an answer when it carries one; without one (a queue's 202, a
    # proxy's 204) the endpoint is not the API: configuration, so the next provider is
    # asked. Both were invalid answers, which end the round with no failover.
    "201": (None, {"ok"}, RoundStatus.ANSWER, 1),
    "202": (C, {"http_202"}, RoundStatus.CONFIGURATION, 1),
    "204": (C, {"http_204"}, RoundStatus.CONFIGURATION, 1),
}


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv = LoopbackServer(retry_after="0", drip_interval_s=0.05)
    await nursery.start(srv.serve)
    return srv


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
class TestFaultModes:
    @pytest.mark.parametrize("mode", sorted(CASES))
    async def test_mode(self, server: LoopbackServer, kind: str, mode: str,
                        caplog: pytest.LogCaptureFixture) -> None:
        """Each fault mode is classified by status/exception, retried or not, and recorded
        without the secret."""
        caplog.set_level("DEBUG")
        failure, details, status, n_attempts = CASES[mode]
        server.default_mode = mode
        url = server.openai_url if kind == "openai" else server.anthropic_url
        timeout = 0.4 if mode in ("hang", "drip") else 5.0
        async with open_gateway([provider("p1", kind, url, timeout_s=timeout)], FAST,
                                environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is status, dump(outcome)
        assert len(outcome.attempts) == n_attempts, dump(outcome)
        for a in outcome.attempts:
            assert a.failure is failure and a.detail in details, a
            assert a.provider == "p1" and a.kind == kind
        assert [a.retry for a in outcome.attempts] == list(range(n_attempts))
        if status is RoundStatus.ANSWER:
            extra = {"confidence": 0.9} if mode == "extra_keys" else {}
            assert outcome.parsed == {"summary": "ok", "items": ["a", "b"], **extra}
            assert outcome.provider == "p1" and outcome.raw is not None
        if mode == "429-ms":
            assert outcome.attempts[0].retry_after_s == pytest.approx(0.02)
        assert SECRET not in dump(outcome)
        assert SECRET not in caplog.text
        # The request really carried the key, in a header and nowhere else.
        sent = server.requests[0]
        assert SECRET in (sent.headers.get("authorization", "") + sent.headers.get(
            "x-api-key", ""))
        assert SECRET.encode() not in sent.body

    async def test_refused_connection(self, kind: str) -> None:
        """Nothing listening: unavailable, retried, then the round reports unavailability."""
        url = f"http://127.0.0.1:{dead_port()}" + ("/v1" if kind == "openai" else "")
        async with open_gateway([provider("p1", kind, url)], FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.UNAVAILABLE
        assert [(a.failure, a.detail) for a in outcome.attempts] == [(U, "connect_error")] * 2

    async def test_wire_format(self, server: LoopbackServer, kind: str) -> None:
        """The request follows the contracted wire format for its kind."""
        url = server.openai_url if kind == "openai" else server.anthropic_url
        async with open_gateway([provider("p1", kind, url)], FAST, environ=ENV) as gw:
            await gw.round(request())
        sent = server.requests[0]
        body = json.loads(sent.body)
        if kind == "openai":
            assert sent.path == "/v1/chat/completions"
            assert sent.headers["authorization"] == f"Bearer {SECRET}"
            assert body["response_format"] == {"type": "json_schema", "json_schema": {
                "name": "hypotheses_v1", "strict": True, "schema": {"type": "object"}}}
            assert [m["role"] for m in body["messages"]] == ["system", "user"]
        else:
            assert sent.path == "/v1/messages"
            assert sent.headers["x-api-key"] == SECRET
            assert sent.headers["anthropic-version"]
            assert body["system"] == "You are a test." and body["messages"][0]["role"] == "user"
        assert body["model"] == "loopback-model"
