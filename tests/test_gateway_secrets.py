"""Secrets never reach a record, an exception message or a log line — in any fault mode."""

from __future__ import annotations

import logging

import pytest
import trio

from actors import open_gateway
from engine import GatewayConfig
from tests.gateway_helpers import ENV, QUERY_SECRET, SECRET, dump, provider, request
from tests.loopback import MODES, LoopbackServer, dead_port


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_no_secret_anywhere(nursery: trio.Nursery, kind: str,
                                  caplog: pytest.LogCaptureFixture,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Every fault mode, with the key in a header and a key-like query parameter: the secret
    is in no record, no log line (httpx logs URLs), no output and no exception text."""
    caplog.set_level(logging.DEBUG)
    srv = LoopbackServer(retry_after="0", drip_interval_s=0.02)
    await nursery.start(srv.serve)
    base = srv.openai_url if kind == "openai" else srv.anthropic_url
    cfg = GatewayConfig(backoff_base_s=0.01, backoff_max_s=0.01, cooldown_after=1000)
    providers = [provider("q", kind, f"{base}?api_key={QUERY_SECRET}&v=1", timeout_s=0.3),
                 provider("dead", kind, f"http://127.0.0.1:{dead_port()}?key={QUERY_SECRET}",
                          timeout_s=0.3)]
    texts = []
    async with open_gateway(providers, cfg, environ=ENV) as gw:
        for mode in MODES:
            srv.script.extend([mode] * 4)
            try:
                outcome = await gw.round(request())
                texts.append(dump(outcome))
            except Exception as exc:  # any exception text must be clean too
                texts.append(repr(exc) + str(exc))
            srv.script.clear()
    out, err = capsys.readouterr()
    everything = "\n".join([*texts, caplog.text, out, err])
    assert SECRET not in everything
    assert QUERY_SECRET not in everything
    assert "[REDACTED]" in everything  # the 401 echo and the query parameter were masked
    assert any(SECRET in r.headers.get("authorization", "") + r.headers.get("x-api-key", "")
               for r in srv.requests)
    assert any(QUERY_SECRET in r.path for r in srv.requests)  # it really was sent
