"""One attempt at one provider: send, read the body within the output limit, classify.

Plain async over httpx: no trio here. The total deadline is the caller's cancel scope; if it
fires, the caller records the attempt from the :class:`HttpCall` it built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import httpx

from .._canonical import utc_now_iso
from .._config import ProviderConfig
from .._store._sources import open_regular
from ._answer import InvalidAnswer, parse_contracted_json
from ._audit import BODY_LIMIT, AuditRecord
from ._classes import FailureClass, classify_exception, classify_status
from ._decode import BodyDecoder, EncodingRefused
from ._redact import Redactor
from ._retry import retry_after_seconds
from ._wire import EnvelopeError, HttpCall, Prompt, extract_content


@attrs.frozen
class AttemptResult:
    record: AuditRecord
    content: str | None = None
    parsed: dict[str, Any] | None = None

    @property
    def failure(self) -> FailureClass | None:
        return self.record.failure


@attrs.frozen
class AttemptContext:
    provider: ProviderConfig
    prompt: Prompt
    attempt: int
    retry: int
    redactor: Redactor
    max_output_bytes: int


def make_record(ctx: AttemptContext, call: HttpCall | None, started: float, started_at: str,
                *, status: int | None = None, headers: dict[str, str] | None = None,
                body: bytes = b"", truncated: bool = False, failure: FailureClass | None,
                detail: str, error: str = "", retry_after: float | None = None) -> AuditRecord:
    r = ctx.redactor
    return AuditRecord(
        prompt_id=ctx.prompt.prompt_id, provider=ctx.provider.name, kind=ctx.provider.kind,
        attempt=ctx.attempt, retry=ctx.retry,
        url=r.url(call.url) if call else "", request_headers=r.headers(call.headers) if call
        else {}, request_body=r.text(call.body.decode("utf-8")) if call else "",
        status=status, response_headers=r.headers(headers or {}),
        # Masked before it is cut, and the cut masked too: a key straddling the limit
        # would otherwise survive in part.
        response_body=r.truncate(body.decode("utf-8", errors="replace"), BODY_LIMIT),
        response_truncated=truncated or len(body) > BODY_LIMIT, started_at=started_at,
        duration_ms=(time.monotonic() - started) * 1000, failure=failure, detail=detail,
        error=r.anything(error), retry_after_s=retry_after)


async def http_attempt(transport: httpx.AsyncBaseTransport, call: HttpCall,
                       ctx: AttemptContext, timeouts: Mapping[str, float | None]
                       ) -> AttemptResult:
    """Straight to the transport (httpx's public transport API): the client's layers — auth
    flows, redirects (never followed here), cookies (a provider's are never kept) and event
    hooks — cost ~220 us of CPU per request and do nothing for a model call.
    ``timeouts`` is httpx's per-request timeout extension (connect, read, write, pool)."""
    started, started_at = time.monotonic(), utc_now_iso()
    try:
        request = httpx.Request("POST", call.url, headers=call.headers, content=call.body,
                                extensions={"timeout": dict(timeouts)})
        if request.url.username or request.url.password:  # as the client: Basic auth
            request = next(httpx.BasicAuth(request.url.username, request.url.password)
                           .sync_auth_flow(request))
        response = await transport.handle_async_request(request)
        try:
            status, headers = response.status_code, dict(response.headers)
            body, over = await _read_limited(response, ctx.max_output_bytes)
        except EncodingRefused as exc:  # its status still decides, when it is a failure
            refused = classify_status(status) or _not_the_api(status)
            return AttemptResult(make_record(
                ctx, call, started, started_at, status=status, headers=headers,
                failure=refused or FailureClass.INVALID_ANSWER,
                detail=f"http_{status}" if refused else exc.detail,
                error=f"HTTP {status}: {exc}" if refused else str(exc),
                retry_after=retry_after_seconds(headers) if refused else None))
        finally:
            await response.aclose()
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeEncodeError) as exc:
        # UnicodeEncodeError: a header value (a key pasted with a non-ASCII character)
        # that HTTP/1.1 cannot carry, a configuration fault (classify_exception).
        return AttemptResult(make_record(
            ctx, call, started, started_at, failure=classify_exception(exc),
            detail=_snake(type(exc).__name__), error=f"{type(exc).__name__}: {exc}"))
    failure = classify_status(status)
    retry_after = retry_after_seconds(headers)
    if failure is not None:
        return AttemptResult(make_record(
            ctx, call, started, started_at, status=status, headers=headers, body=body,
            truncated=over, failure=failure, detail=f"http_{status}",
            error=f"HTTP {status}", retry_after=retry_after))

    def invalid(detail: str, message: str, content: str | None = None) -> AttemptResult:
        return AttemptResult(make_record(
            ctx, call, started, started_at, status=status, headers=headers, body=body,
            truncated=over, failure=FailureClass.INVALID_ANSWER, detail=detail, error=message),
            content=content)

    try:
        if over:
            raise EnvelopeError(f"the response passed max_output_bytes={ctx.max_output_bytes}")
        content = extract_content(ctx.provider.kind, body)
    except EnvelopeError as exc:
        if _not_the_api(status):
            return AttemptResult(make_record(
                ctx, call, started, started_at, status=status, headers=headers, body=body,
                truncated=over, failure=FailureClass.CONFIGURATION, detail=f"http_{status}",
                error=f"HTTP {status} without an answer ({exc})"))
        if over:
            return invalid("output_limit_exceeded", str(exc))
        return invalid("bad_envelope", str(exc))
    return _check_content(ctx, content, lambda masked, parsed: AttemptResult(make_record(
        ctx, call, started, started_at, status=status, headers=headers, body=body,
        failure=None, detail="ok"), content=masked, parsed=parsed), invalid)


def _not_the_api(status: int) -> FailureClass | None:
    """A 2xx other than 200 whose body cannot be read as the answer (a queue's 202, a
    proxy's 204, a 206 of part of one; over the output limit or in a refused encoding as
    much as without an envelope): that endpoint is not the API, so the next provider is
    asked. A 200 that cannot be read is an invalid answer."""
    return FailureClass.CONFIGURATION if status != 200 else None


def _check_content(ctx: AttemptContext, content: str,
                   ok: Callable[[str, dict[str, Any]], AttemptResult],
                   invalid: Callable[[str, str, str | None], AttemptResult]) -> AttemptResult:
    """Only the contracted *form* is checked here (one JSON object); the phase validates
    the content itself, so a bug in a phase's check can never pass for a model's fault.

    The content is masked first, like everything else a provider sends: a provider (or a
    model told to by the case) echoing a key inside its answer must not carry it into the
    checkpoint, the artifacts or an export. The masked text is the answer from here on,
    also when its form is wrong: the round record keeps what came back, whole (the audit
    record's copy is cut at its limit)."""
    content = ctx.redactor.text(content)
    try:
        parsed = parse_contracted_json(content)
    except InvalidAnswer as exc:
        return invalid(exc.detail, str(exc), content)
    return ok(content, parsed)


async def _read_limited(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes, decoded (``BodyDecoder``: never more than the limit
    has room for, whatever the encoding claims); past it, abandon the body (the connection
    is closed). Raises EncodingRefused."""
    if response.is_stream_consumed:  # a transport that read it already (httpx's
        content = response.content     # MockTransport) holds it decoded, whole
        return content[: limit + 1], len(content) > limit
    decoder = BodyDecoder(response.headers.get("content-encoding"))
    chunks: list[bytes] = []
    size = 0
    async for raw in response.aiter_raw():
        chunk = decoder.decode(raw, limit + 1 - size)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[: limit + 1], True
    decoder.finish()
    return b"".join(chunks), False


def fixture_attempt(ctx: AttemptContext) -> AttemptResult:
    """Answers from files: ``<path>/<prompt_id>/<case_id>.json``, else ``…/default.json``.
    Deterministic; a missing file is a provider configuration failure."""
    started, started_at = time.monotonic(), utc_now_iso()
    root = Path(ctx.provider.path or ".") / ctx.prompt.prompt_id
    for candidate in (root / f"{ctx.prompt.case_id}.json", root / "default.json"):
        if ctx.prompt.case_id and "/" not in ctx.prompt.case_id and candidate.is_file():
            try:
                with open_regular(candidate) as f:
                    raw = _read_at_most(f, ctx.max_output_bytes + 1)
            except OSError as exc:
                return AttemptResult(make_record(
                    ctx, None, started, started_at, failure=FailureClass.CONFIGURATION,
                    detail="fixture_unreadable",
                    error=f"the fixture answer {candidate} cannot be read "
                          f"({exc.strerror or exc})"))
            break
    else:
        return AttemptResult(make_record(
            ctx, None, started, started_at, failure=FailureClass.CONFIGURATION,
            detail="fixture_missing", error=f"no fixture answer under {root}"))

    def invalid(detail: str, message: str, content: str | None = None) -> AttemptResult:
        return AttemptResult(make_record(ctx, None, started, started_at, status=200, body=raw,
                                         failure=FailureClass.INVALID_ANSWER, detail=detail,
                                         error=message), content=content)

    if len(raw) > ctx.max_output_bytes:
        return invalid("output_limit_exceeded", "the fixture answer is over the output limit")
    try:  # as strict as an HTTP answer's body, which json.loads refuses when not UTF-8
        content = raw.decode("utf-8")
    except UnicodeDecodeError:
        return invalid("bad_envelope", "the fixture answer is not UTF-8 text")
    return _check_content(ctx, content, lambda masked, parsed: AttemptResult(make_record(
        ctx, None, started, started_at, status=200, body=raw, failure=None, detail="ok"),
        content=masked, parsed=parsed), invalid)


def _read_at_most(f: BinaryIO, limit: int) -> bytes:
    """Up to ``limit`` bytes, read in pieces: no more than that is read whatever the file's
    size, and no buffer larger than what was read is asked for whatever the limit."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (part := f.read(min(1 << 20, limit - size))):
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
