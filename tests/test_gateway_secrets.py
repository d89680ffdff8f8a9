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


LEAKY = "sk-LEAK/9f+Q7e2d1c0b8a6Zx"
QUERY = "qk-LEAK-4d3c2b1a0f9e8d"
PASSWORD = "pw-LEAK-8e7d6c5b4a39"


def _fragments(secret: str, n: int = 8) -> list[str]:
    return [secret[i:i + n] for i in range(len(secret) - n + 1)]


def _decodings(text: str) -> list[str]:
    """``text`` as it is and with every escaping an echo may use undone."""
    import html
    import re
    from urllib.parse import unquote_plus

    unicode = re.sub(r"\\+u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    slashes = re.sub(r"\\+/", "/", unicode)
    return [text, slashes, unquote_plus(unquote_plus(slashes)), html.unescape(slashes)]


@pytest.mark.parametrize("where", ["header key", "query parameter", "url userinfo"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_no_echo_of_a_secret_survives_in_any_form(nursery: trio.Nursery, kind: str,
                                                        where: str) -> None:
    """Every echo class seen in the wild — JSON-, \\u-, URL- and HTML-escaped, in a
    redirect's Location, an echoed path or header, across the audit cut and the output cut
    — of a key in a header, a key-like query parameter or URL userinfo, logged at DEBUG on
    the root logger (every child logger, httpcore.http11 included): no run of 8 characters
    of the secret, in any of those encodings, is in a record, a log line, an exception or
    the output."""
    import base64
    from io import StringIO

    from tests.loopback.server import ECHO_MODES

    srv = LoopbackServer(retry_after="0")
    await nursery.start(srv.serve)
    stream = StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    base = srv.openai_url if kind == "openai" else srv.anthropic_url
    env: dict[str, str] = {}
    if where == "header key":
        secrets, key_env = [LEAKY], "VIANO_LEAK_KEY"
        env = {key_env: LEAKY}
    elif where == "query parameter":
        secrets, key_env = [QUERY], None
        base += f"?api_key={QUERY}&v=1"
    else:
        basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
        secrets, key_env = [PASSWORD, basic], None
        base = base.replace("http://", f"http://user:{PASSWORD}@")
    cfg = GatewayConfig(backoff_base_s=0.01, backoff_max_s=0.01, cooldown_after=1000,
                        max_output_bytes=srv.output_cut)
    texts = []
    try:
        async with open_gateway([provider("leaky", kind, base, timeout_s=2.0, retries=0,
                                          api_key_env=key_env)], cfg, environ=env) as gw:
            for mode in ECHO_MODES:
                srv.push(mode)
                try:
                    texts.append(dump(await gw.round(request())))
                except Exception as exc:
                    texts.append(repr(exc) + str(exc))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    everything = "\n".join([*texts, stream.getvalue()])
    assert "httpcore.http11" in everything  # the child loggers really were heard
    decoded = _decodings(everything)
    for secret in secrets:
        survivors = [f for f in _fragments(secret) for d in decoded if f in d]
        assert not survivors, (secret, survivors[:3])
    sent = "".join(r.headers.get("authorization", "") + r.headers.get("x-api-key", "") + r.path
                   for r in srv.requests)
    assert secrets[-1] in sent  # it really was sent, so every echo had it to repeat


ODD_KEYS = ["sk-ODDKEY-tail-0123456789\n", "sk-ODDKEY-in\tside-0123456789",
            "sk-ODDKEY-caf\u00e9-0123456789", "sk-ODDKEY-\x0b-vt-0123456789"]
# Sent as they are (printable ASCII), but JSON writes them escaped: \" and \\.
QUOTED_KEYS = ["sk-ODDKEY-back\\slash1234", 'sk-ODDKEY-ab"cd\\ef12345']


def _renderings(secret: str) -> list[str]:
    """How error texts and echoes write a secret that holds a control or non-ASCII
    character: a bytes repr (h11's "Illegal header value b'…'"), a str repr, JSON (both
    escapings), URL-encoded UTF-8 and HTML character references."""
    import json
    from urllib.parse import quote

    return [repr(secret.encode("utf-8")), repr(secret), json.dumps(secret),
            json.dumps(secret, ensure_ascii=False), quote(secret, safe=""),
            secret.encode("ascii", "xmlcharrefreplace").decode()]


@pytest.mark.parametrize("secret", ODD_KEYS + QUOTED_KEYS)
def test_a_secret_with_an_odd_character_is_masked_in_every_rendering(secret: str) -> None:
    """The mask knew each character's JSON \\u, %xx (ASCII only) and HTML forms: a key with
    a newline, written as its bytes' repr in an HTTP library's error, survived whole."""
    from engine import Redactor

    redactor = Redactor([secret])
    for text in _renderings(secret):
        masked = redactor.text(f"error: {text} (in a header)")
        assert "ODDKEY" not in masked, (text, masked)
        assert "[REDACTED]" in masked


async def test_a_key_with_a_line_end_is_sent_without_it_and_masked(
        nursery: trio.Nursery) -> None:
    """A key read from a file keeps the file's line end: sent as it was, it failed in the
    HTTP layer with the key in the error text (round records and exports held it), classed
    unavailable and retried every round. The line end is dropped, as no key has one."""
    srv = LoopbackServer()
    await nursery.start(srv.serve)
    key = "sk-ODDKEY-tail-0123456789"
    async with open_gateway([provider("a", "openai", srv.openai_url)], GatewayConfig(),
                            environ={"VIANO_TEST_KEY": key + "\r\n"}) as gw:
        outcome = await gw.round(request())
    assert outcome.status.value == "answer", dump(outcome)
    assert srv.requests[0].headers["authorization"] == f"Bearer {key}"
    assert "ODDKEY" not in dump(outcome)


@pytest.mark.parametrize("secret", [k for k in ODD_KEYS if not k.endswith("\n")])
async def test_a_key_with_an_odd_character_inside_is_a_configuration_failure(
        nursery: trio.Nursery, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A space, control or non-ASCII character inside a key: never sent (no header can
    carry it), provider_configuration at once (the next provider, no retry), and the key
    is in no record or log line."""
    caplog.set_level(logging.DEBUG)
    srv = LoopbackServer()
    await nursery.start(srv.serve)
    async with open_gateway([provider("a", "openai", srv.openai_url, retries=2)],
                            GatewayConfig(), environ={"VIANO_TEST_KEY": secret}) as gw:
        outcome = await gw.round(request())
    assert outcome.status.value == "provider_configuration", dump(outcome)
    assert [a.detail for a in outcome.attempts] == ["invalid_api_key"]
    assert srv.requests == []
    assert "ODDKEY" not in dump(outcome) and "ODDKEY" not in caplog.text


@pytest.mark.no_store
@pytest.mark.parametrize(("message", "shown"), [
    # The store's own message (its URL already without a password): the colon ending the
    # clause was taken into the URL, and what followed was percent-encoded into its query.
    ("could not claim due cases at postgresql://probe@/db6?host=/tmp/pg: terminating "
     "connection", "postgresql://[REDACTED]@/db6?host=/tmp/pg: terminating connection"),
    ("see https://api.example/v1?api_key=S3cr3tKEY.", "api_key=[REDACTED]."),
    ("(at https://h/a?x=1&token=abc)", "https://h/a?x=1&token=[REDACTED])"),
    ("at https://u:pw@h/x, then", "https://[REDACTED]@h/x, then"),
    ("at https://h/x?host=/tmp/a;", "https://h/x?host=/tmp/a;")])
def test_a_url_in_a_sentence_is_masked_and_the_sentence_kept(message: str,
                                                              shown: str) -> None:
    from engine._gateway._redact import Redactor

    cleaned = Redactor(["S3cr3tKEY"]).anything(message)
    assert shown in cleaned, cleaned
    assert "S3cr3tKEY" not in cleaned and "pw@" not in cleaned and "=abc" not in cleaned
