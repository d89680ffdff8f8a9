"""The gateway-pool actor: one round = the providers in configured order, each with bounded
retries; the answer, or the full record of why none came.

It owns, per provider, httpx transports ("shards", each a small connection pool: httpcore gets
CPU-bound above ~10-20 connections, ARCHITECTURE.md), a ``trio.CapacityLimiter`` of
``max_concurrency`` where excess requests queue, and the shared cooldown state. It is the
only retry owner: adapters never retry. It never sleeps between rounds (the phase schedules
those) and never writes the store: audit records go back to the caller.
"""

from __future__ import annotations

import math
import os
import random
import re
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import httpx
import trio

from engine import (
    AttemptContext,
    AttemptResult,
    AuditRecord,
    FailureClass,
    GatewayCancelled,
    GatewayConfig,
    GatewayError,
    ProviderConfig,
    Redactor,
    RoundOutcome,
    RoundRequest,
    RoundStatus,
    backoff_delay,
    build_call,
    fixture_attempt,
    http_attempt,
    install_log_filter,
    make_record,
    no_answer_status,
    remove_log_filter,
    utc_now_iso,
)

from ._serving import serving

CLOSE_TIMEOUT_S = 5.0


@attrs.define(eq=False)
class Shard:
    """One connection pool of a provider: an httpx transport (the pool's own, or the one a
    test gave, shared by the shards) and the per-request timeouts."""

    transport: httpx.AsyncBaseTransport
    timeouts: dict[str, float | None]
    owned: bool
    is_closed: bool = False

    async def aclose(self) -> None:
        if not self.is_closed:
            self.is_closed = True
            if self.owned:
                await self.transport.aclose()


# What an API key is made of: printable ASCII, no spaces (what an HTTP header can carry).
_KEY_TEXT = re.compile(r"[!-~]+")


@attrs.define(eq=False)
class ProviderState:
    config: ProviderConfig
    limiter: trio.CapacityLimiter
    shards: list[Shard]
    secret: str | None
    in_flight: list[int] = attrs.field(factory=list)
    consecutive_unavailable: int = 0
    cooldown_until: float = -math.inf

    def pick_shard(self) -> int:
        """The least-loaded client. With the limiter at max_concurrency and each shard
        holding max_connections, a request never waits inside an httpcore pool."""
        return min(range(len(self.shards)), key=self.in_flight.__getitem__)


class GatewayPool:
    """The pool's state and the round algorithm. Used only from the actor's tasks."""

    def __init__(self, providers: Sequence[ProviderConfig], config: GatewayConfig, *,
                 rng: random.Random | None = None,
                 transports: Mapping[str, httpx.AsyncBaseTransport] | None = None,
                 environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.config = config
        self.rng = rng or random.Random()
        self.redactor = Redactor()
        self.states: list[ProviderState] = []
        self._tls: ssl.SSLContext | None = None
        self._no_tls: ssl.SSLContext | None = None
        self.stats: dict[str, ProviderStats] = {}
        for p in providers:
            secret = env.get(p.api_key_env) if p.api_key_env else None
            if secret is not None:
                # As given, and without the line end a key read from a file keeps (no key
                # has one): masked in both forms, sent in the second.
                self.redactor.add(secret)
                secret = secret.strip()
                self.redactor.add(secret)
            self.redactor.add_url_secrets(p.base_url)
            self.stats[p.name] = ProviderStats()
            # httpcore's pool scans every connection on every event, so its CPU cost grows
            # with connections x waiters (ARCHITECTURE.md; bench/gateway.py: 128 connections
            # in one pool ran at 0.17x plain httpx). So: at most max_connections per pool,
            # as many pools ("shards") as max_concurrency needs, requests queued in the
            # limiter and sent to the least-loaded shard.
            shards = [] if p.kind == "fixture" else [
                self._shard(p, min(p.max_concurrency, config.max_connections),
                            (transports or {}).get(p.name))
                for _ in range(math.ceil(p.max_concurrency / config.max_connections))]
            self.states.append(ProviderState(p, trio.CapacityLimiter(p.max_concurrency),
                                             shards, secret, [0] * len(shards)))

    def _shard(self, p: ProviderConfig, connections: int,
               transport: httpx.AsyncBaseTransport | None) -> Shard:
        timeouts = httpx.Timeout(p.timeout_s, connect=min(self.config.connect_timeout_s,
                                                          p.timeout_s)).as_dict()
        if transport is not None:
            return Shard(transport, timeouts, owned=False)
        return Shard(httpx.AsyncHTTPTransport(
            verify=self._tls_for(p), limits=httpx.Limits(max_connections=connections,
                                                  max_keepalive_connections=connections),
            trust_env=False), timeouts, owned=True)

    def _tls_for(self, p: ProviderConfig) -> ssl.SSLContext:
        """One context for every shard of every ``https`` provider: building one loads
        the CA bundle (32 ms of CPU and 1.9 MiB, measured), and a transport given none
        builds its own. A plain ``http`` provider (a local server, or one behind a trusted
        network) never uses TLS, so its shards get a context that trusts no certificate:
        nothing to load, and a TLS connection through it could only fail verification."""
        if urllib.parse.urlsplit(p.base_url).scheme.lower() == "https":
            if self._tls is None:
                self._tls = httpx.create_ssl_context(trust_env=False)
            return self._tls
        if self._no_tls is None:
            self._no_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies; trusts none
        return self._no_tls

    async def aclose(self) -> None:
        with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            for state in self.states:
                for shard in state.shards:
                    await shard.aclose()

    async def run_round(self, request: RoundRequest) -> RoundOutcome:
        attempts: list[AuditRecord] = []
        try:
            for state in self.states:
                if trio.current_time() < state.cooldown_until:
                    attempts.append(self._skipped(state, request, len(attempts) + 1))
                    continue
                result = await self._provider(state, request, attempts)
                if result is not None:
                    return result
            return RoundOutcome(no_answer_status(attempts), tuple(attempts))
        finally:
            for record in attempts:
                self.stats[record.provider].count(record)

    async def _provider(self, state: ProviderState, request: RoundRequest,
                        attempts: list[AuditRecord]) -> RoundOutcome | None:
        """Try one provider with its retries; an outcome ends the round, None moves on."""
        cfg = self.config
        for retry in range(state.config.retries + 1):
            result = await self._attempt(state, request, len(attempts) + 1, retry)
            attempts.append(result.record)
            failure = result.failure
            if failure is None or failure is FailureClass.INVALID_ANSWER:
                state.consecutive_unavailable = 0
                status = RoundStatus.ANSWER if failure is None else RoundStatus.INVALID_ANSWER
                return RoundOutcome(status, tuple(attempts), state.config.name,
                                    result.content, result.parsed)
            if failure is FailureClass.CONFIGURATION:
                return None
            state.consecutive_unavailable += 1
            if state.consecutive_unavailable >= cfg.cooldown_after:
                state.cooldown_until = trio.current_time() + cfg.cooldown_s
                return None
            if retry == state.config.retries:
                return None
            wait = result.record.retry_after_s
            if wait is not None and wait > cfg.retry_after_cap_s:
                return None  # asked to wait longer than we would: move on, do not sleep
            if wait is None:
                wait = backoff_delay(retry, cfg.backoff_base_s, cfg.backoff_max_s, self.rng)
            await trio.sleep(wait)
        return None

    async def _attempt(self, state: ProviderState, request: RoundRequest, attempt: int,
                       retry: int) -> AttemptResult:
        p = state.config
        ctx = AttemptContext(provider=p, prompt=request.prompt, attempt=attempt, retry=retry,
                             redactor=self.redactor,
                             max_output_bytes=request.output_limit(
                                 self.config.max_output_bytes))
        started, started_at = time.monotonic(), _now()
        if p.kind == "fixture":
            async with state.limiter:
                return await trio.to_thread.run_sync(fixture_attempt, ctx)
        if p.api_key_env and not state.secret:
            return AttemptResult(make_record(
                ctx, None, started, started_at, failure=FailureClass.CONFIGURATION,
                detail="missing_api_key",
                error=f"environment variable {p.api_key_env} " + (
                    "is not set" if state.secret is None else "holds no key (it is empty, "
                    "or only whitespace)")))
        if state.secret and _KEY_TEXT.fullmatch(state.secret) is None:
            # Sent, it fails in the HTTP layer with the key in the error text (its bytes'
            # repr, which no mask form covers), classed unavailable and retried every round.
            return AttemptResult(make_record(
                ctx, None, started, started_at, failure=FailureClass.CONFIGURATION,
                detail="invalid_api_key",
                error=f"environment variable {p.api_key_env} holds a character no API key "
                      "has (a space, a control character or a non-ASCII one) inside it"))
        call = build_call(p, state.secret, request.prompt)
        async with state.limiter:
            started, started_at = time.monotonic(), _now()
            shard = state.pick_shard()
            state.in_flight[shard] += 1
            try:
                with trio.move_on_after(p.timeout_s):
                    one = state.shards[shard]
                    return await http_attempt(one.transport, call, ctx, one.timeouts)
            finally:
                state.in_flight[shard] -= 1
        return AttemptResult(make_record(
            ctx, call, started, started_at, failure=FailureClass.UNAVAILABLE,
            detail="total_deadline", error=f"no complete answer within timeout_s={p.timeout_s}"))

    def _skipped(self, state: ProviderState, request: RoundRequest, attempt: int) -> AuditRecord:
        ctx = AttemptContext(provider=state.config, prompt=request.prompt, attempt=attempt,
                             retry=0, redactor=self.redactor, max_output_bytes=0)
        left = state.cooldown_until - trio.current_time()
        return make_record(ctx, None, time.monotonic(), _now(), failure=FailureClass.SKIPPED,
                           detail="cooldown",
                           error=f"cooling down for another {left:.1f}s after "
                                 f"{state.consecutive_unavailable} unavailable attempts")


def _now() -> str:
    return utc_now_iso()


@attrs.define
class ProviderStats:
    """What a provider did since the gateway opened: for ``viano status`` and the logs."""

    answers: int = 0
    failures: dict[str, int] = attrs.field(factory=dict)  # by failure class
    cooldown_skips: int = 0

    def count(self, record: AuditRecord) -> None:
        if record.failure is None:
            self.answers += 1
        elif record.failure is FailureClass.SKIPPED:
            self.cooldown_skips += 1
        else:
            self.failures[record.failure.value] = self.failures.get(record.failure.value, 0) + 1

    def to_json(self) -> dict[str, object]:
        return {"answers": self.answers, "failures": dict(sorted(self.failures.items())),
                "cooldown_skips": self.cooldown_skips}


@attrs.define(eq=False)
class RoundMsg:
    request: RoundRequest
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    outcome: RoundOutcome | None = None
    error: Exception | None = None  # a bug met serving this round, raised to its caller


async def run_gateway_pool(inbox: trio.MemoryReceiveChannel[RoundMsg], pool: GatewayPool, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                           ) -> None:
    """Serve rounds concurrently until the mailbox closes, then close the HTTP clients.
    However it ends, a round still queued is answered (as cancelled), never left waiting."""
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for msg in inbox:
                nursery.start_soon(_serve, pool, msg)
    finally:
        while True:
            try:
                inbox.receive_nowait().done.set()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        inbox.close()
        await pool.aclose()


async def _serve(pool: GatewayPool, msg: RoundMsg) -> None:
    """One round. A bug met while serving it is its caller's (that case's internal error),
    raised there: in the pool's nursery it would end the pool, and with it every round in
    flight and the process (a daemon included, again at each restart on the same answer)."""
    try:
        with msg.scope:
            msg.outcome = await pool.run_round(msg.request)
    except Exception as exc:
        msg.error = exc
    finally:
        msg.done.set()


class GatewayHandle:
    def __init__(self, pool: GatewayPool, send: trio.MemorySendChannel[RoundMsg]):
        self.pool = pool
        self._send = send

    async def round(self, request: RoundRequest) -> RoundOutcome:
        """Run one round. Cancelling the caller cancels the round, which releases its
        limiter slot and connection at once; the pool keeps serving the others."""
        msg = RoundMsg(request)
        try:
            await self._send.send(msg)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise GatewayError("the gateway is closed") from exc
        try:
            await msg.done.wait()
        finally:
            if not msg.done.is_set():
                msg.scope.cancel()
        if msg.error is not None:
            raise msg.error
        if msg.outcome is None:
            raise GatewayCancelled("the round was cancelled")
        return msg.outcome


@asynccontextmanager
async def open_gateway(providers: Sequence[ProviderConfig], config: GatewayConfig | None = None,
                       *, rng: random.Random | None = None,
                       transports: Mapping[str, httpx.AsyncBaseTransport] | None = None,
                       environ: Mapping[str, str] | None = None,
                       ) -> AsyncIterator[GatewayHandle]:
    pool = GatewayPool(providers, config or GatewayConfig(), rng=rng, transports=transports,
                       environ=environ)
    log_filter = install_log_filter(pool.redactor)
    send, recv = trio.open_memory_channel[RoundMsg](math.inf)
    try:
        async with serving(lambda **ts: run_gateway_pool(recv, pool, **ts), send):
            yield GatewayHandle(pool, send)
    finally:
        remove_log_filter(log_filter)
