"""The gateway-pool actor: ordered failover, cooldown, limiter, Retry-After, cancellation."""

from __future__ import annotations

import itertools
import json
import random
import ssl

import attrs
import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing

from actors import GatewayHandle, open_gateway
from engine import FailureClass, GatewayConfig, RoundOutcome, RoundStatus
from tests.gateway_helpers import ENV, FAST, SECRET, dump, provider, request
from tests.loopback import LoopbackServer, dead_port

U, C, INV, S = (FailureClass.UNAVAILABLE, FailureClass.CONFIGURATION,
              FailureClass.INVALID_ANSWER, FailureClass.SKIPPED)


async def _servers(nursery: trio.Nursery, *modes: str) -> list[LoopbackServer]:
    out = []
    for mode in modes:
        srv = LoopbackServer(default_mode=mode, retry_after="0")
        await nursery.start(srv.serve)
        out.append(srv)
    return out


def _url(mode: str, srv: LoopbackServer) -> str:
    return f"http://127.0.0.1:{dead_port()}/v1" if mode == "refuse" else srv.openai_url


class TestOrderedFailover:
    @pytest.mark.parametrize(("modes", "status", "winner", "trail"), [
        (("refuse", "503", "ok"), RoundStatus.ANSWER, "p3",
         [("p1", U), ("p1", U), ("p2", U), ("p2", U), ("p3", None)]),
        (("401", "refuse", "ok"), RoundStatus.ANSWER, "p3",
         [("p1", C), ("p2", U), ("p2", U), ("p3", None)]),
        (("401", "404", "400"), RoundStatus.CONFIGURATION, None,
         [("p1", C), ("p2", C), ("p3", C)]),
        (("refuse", "401", "502"), RoundStatus.UNAVAILABLE, None,
         [("p1", U), ("p1", U), ("p2", C), ("p3", U), ("p3", U)]),
        (("empty", "ok", "ok"), RoundStatus.INVALID_ANSWER, "p1", [("p1", INV)]),
        (("429-long", "ok", "ok"), RoundStatus.ANSWER, "p2", [("p1", U), ("p2", None)]),
        (("ok", "refuse", "refuse"), RoundStatus.ANSWER, "p1", [("p1", None)]),
    ])
    async def test_combination(self, nursery: trio.Nursery, modes: tuple[str, ...],
                               status: RoundStatus, winner: str | None,
                               trail: list[tuple[str, FailureClass | None]]) -> None:
        """Providers are tried in order; retries, failover and the attempt list follow the
        failure classes; an invalid answer stops the round without failover."""
        servers = await _servers(nursery, *modes)
        providers = [provider(f"p{i + 1}", "openai", _url(m, s))
                     for i, (m, s) in enumerate(zip(modes, servers, strict=True))]
        async with open_gateway(providers, FAST, environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is status, dump(outcome)
        assert outcome.provider == winner
        assert [(a.provider, a.failure) for a in outcome.attempts] == trail
        assert [a.attempt for a in outcome.attempts] == list(range(1, len(trail) + 1))
        for i, srv in enumerate(servers):  # providers after the deciding one were not called
            called = any(a.provider == f"p{i + 1}" for a in outcome.attempts)
            assert called or not srv.requests
        assert SECRET not in dump(outcome)


def _mock(handler: object) -> httpx.MockTransport:
    return httpx.MockTransport(handler)  # type: ignore[arg-type]


def _ok_response(request: httpx.Request) -> httpx.Response:
    content = json.dumps({"summary": "ok", "items": []})
    return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


class TestCooldown:
    async def test_skipped_while_cooling_then_probed(self, autojump_clock: object) -> None:
        """After N consecutive unavailable attempts a provider is skipped (recorded as
        skipped) for the cool-down, then probed once; a success resets it."""
        state = {"down": True}

        async def flaky(request: httpx.Request) -> httpx.Response:
            await trio.sleep(0.1)
            return httpx.Response(503) if state["down"] else _ok_response(request)

        cfg = GatewayConfig(cooldown_after=3, cooldown_s=60, backoff_base_s=1, backoff_max_s=1)
        providers = [provider("a", "openai", "http://a.invalid/v1", retries=0),
                     provider("b", "openai", "http://b.invalid/v1", retries=0)]
        transports = {"a": _mock(flaky), "b": _mock(_ok_response)}
        async with open_gateway(providers, cfg, transports=transports, environ=ENV) as gw:
            trails = []
            for _ in range(4):
                out = await gw.round(request())
                assert out.status is RoundStatus.ANSWER and out.provider == "b"
                trails.append([(a.provider, a.failure) for a in out.attempts])
            assert trails[:3] == [[("a", U), ("b", None)]] * 3
            assert trails[3] == [("a", S), ("b", None)]
            assert "cooling down" in out.attempts[0].error
            await trio.sleep(61)
            out = await gw.round(request())  # probed once, fails, cools again at once
            assert [(a.provider, a.failure) for a in out.attempts] == [("a", U), ("b", None)]
            out = await gw.round(request())
            assert out.attempts[0].failure is S
            state["down"] = False
            await trio.sleep(61)
            out = await gw.round(request())
            assert out.provider == "a"
            assert gw.pool.states[0].consecutive_unavailable == 0

    async def test_all_cooling_is_unavailable(self, autojump_clock: object) -> None:
        """A round in which every provider is cooling down reports unavailability."""
        async def down(request: httpx.Request) -> httpx.Response:
            return httpx.Response(503)

        cfg = GatewayConfig(cooldown_after=1, cooldown_s=60)
        async with open_gateway([provider("a", "openai", "http://a.invalid/v1", retries=0)],
                                cfg, transports={"a": _mock(down)}, environ=ENV) as gw:
            await gw.round(request())
            out = await gw.round(request())
        assert out.status is RoundStatus.UNAVAILABLE
        assert [a.failure for a in out.attempts] == [S]


class TestRetryAfterAndBackoff:
    async def test_retry_after_honoured_in_virtual_time(self, autojump_clock: object) -> None:
        """A Retry-After under the cap is slept (in virtual time) before the retry."""
        calls: list[float] = []

        async def limited(request: httpx.Request) -> httpx.Response:
            calls.append(trio.current_time())
            if len(calls) == 1:
                return httpx.Response(429, headers={"retry-after": "7"})
            return _ok_response(request)

        async with open_gateway([provider("a", "openai", "http://a.invalid/v1")],
                                GatewayConfig(), transports={"a": _mock(limited)},
                                environ=ENV) as gw:
            out = await gw.round(request())
        assert out.status is RoundStatus.ANSWER
        assert calls[1] - calls[0] == pytest.approx(7.0)
        assert out.attempts[0].retry_after_s == 7.0

    async def test_long_retry_after_moves_on_without_sleeping(self,
                                                              autojump_clock: object) -> None:
        """A Retry-After over the cap makes the provider unavailable for the round: no sleep."""
        async def limited(request: httpx.Request) -> httpx.Response:
            return httpx.Response(429, headers={"retry-after-ms": "120000"})

        start = trio.current_time()
        async with open_gateway([provider("a", "openai", "http://a.invalid/v1", retries=5),
                                 provider("b", "openai", "http://b.invalid/v1")],
                                GatewayConfig(retry_after_cap_s=30),
                                transports={"a": _mock(limited), "b": _mock(_ok_response)},
                                environ=ENV) as gw:
            out = await gw.round(request())
        assert out.provider == "b" and len(out.attempts) == 2
        assert trio.current_time() - start < 1.0

    async def test_backoff_is_bounded(self, autojump_clock: object) -> None:
        """Backoff between retries is exponential with jitter and never above the maximum."""
        calls: list[float] = []

        async def down(request: httpx.Request) -> httpx.Response:
            calls.append(trio.current_time())
            return httpx.Response(502)

        cfg = GatewayConfig(backoff_base_s=1, backoff_max_s=4, cooldown_after=100)
        async with open_gateway([provider("a", "openai", "http://a.invalid/v1", retries=6)],
                                cfg, transports={"a": _mock(down)}, environ=ENV,
                                rng=random.Random(3)) as gw:
            out = await gw.round(request())
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        assert len(out.attempts) == 7 and len(gaps) == 6
        assert all(0 <= g <= min(4, 2 ** i) + 1e-9 for i, g in enumerate(gaps))


class TestLimiter:
    async def test_concurrency_capped_per_provider(self, autojump_clock: object) -> None:
        """max_concurrency bounds in-flight requests per provider; the rest queue."""
        live = {"now": 0, "peak": 0}

        async def slow(request: httpx.Request) -> httpx.Response:
            live["now"] += 1
            live["peak"] = max(live["peak"], live["now"])
            await trio.sleep(10)
            live["now"] -= 1
            return _ok_response(request)

        start = trio.current_time()
        async with open_gateway([provider("a", "openai", "http://a.invalid/v1",
                                          max_concurrency=2, timeout_s=100)], GatewayConfig(),
                                transports={"a": _mock(slow)}, environ=ENV) as gw, \
                trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(gw.round, request())
        assert live["peak"] == 2
        assert trio.current_time() - start == pytest.approx(30, abs=0.5)


class TestShards:
    async def test_requests_never_wait_inside_a_pool(self, autojump_clock: object) -> None:
        """max_concurrency above max_connections is served by several clients, each with at
        most max_connections in flight; the limiter holds the rest."""
        per_client: dict[int, int] = {}
        peak: dict[int, int] = {}

        async def slow(request: httpx.Request) -> httpx.Response:
            await trio.sleep(5)
            return _ok_response(request)

        cfg = GatewayConfig(max_connections=4)
        p = provider("a", "openai", "http://a.invalid/v1", max_concurrency=10, timeout_s=100)
        async with open_gateway([p], cfg, transports={"a": _mock(slow)}, environ=ENV) as gw:
            state = gw.pool.states[0]
            assert len(state.shards) == 3

            async def watch() -> None:
                while True:
                    for i, n in enumerate(state.in_flight):
                        per_client[i] = n
                        peak[i] = max(peak.get(i, 0), n)
                    await trio.sleep(0.5)

            async with trio.open_nursery() as outer:
                outer.start_soon(watch)
                async with trio.open_nursery() as nursery:
                    for _ in range(25):
                        nursery.start_soon(gw.round, request())
                outer.cancel_scope.cancel()
            assert max(peak.values()) <= 4
            assert sum(peak.values()) >= 10  # the limiter's 10 slots were all used
            assert state.in_flight == [0, 0, 0] and state.limiter.borrowed_tokens == 0

    async def test_every_shard_shares_one_tls_context(self, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
        """Building a TLS context loads the CA bundle (~3 ms); a transport built without
        one builds its own, so 256 shards (max_concurrency 4096) took 12 s to start."""
        made = _tls_contexts_made(monkeypatch)
        p = provider("a", "openai", "https://a.invalid/v1", max_concurrency=4096)
        q = provider("b", "anthropic", "https://b.invalid/v1", max_concurrency=64)
        async with open_gateway([p, q], GatewayConfig(), environ=ENV) as gw:
            shards = [s for state in gw.pool.states for s in state.shards]
            assert len(shards) == 256 + 4
        assert len({id(ctx) for ctx in made}) == 1  # (given a context, it returns that one)

    async def test_a_plain_http_provider_loads_no_ca_bundle(
            self, monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery) -> None:
        """Loading the CA bundle costs 32 ms and 1.9 MiB per gateway (every worker, every
        command): a provider on plain HTTP (the loopback server here) never needs it, and
        answers; an ``https`` provider beside it still gets the verifying context."""
        made = _tls_contexts_made(monkeypatch)
        srv = LoopbackServer()
        await nursery.start(srv.serve)
        p = provider("a", "openai", srv.openai_url, max_concurrency=4)
        async with open_gateway([p], GatewayConfig(), environ=ENV) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.ANSWER, dump(outcome)
        # (httpx calls it for the context it is given too, and returns that one)
        assert made and not any(ctx.get_ca_certs() for ctx in made)
        q = provider("b", "anthropic", "HTTPS://b.invalid/v1", max_concurrency=4)
        async with open_gateway([p, q], GatewayConfig(), environ=ENV) as gw:
            plain, tls = (state.shards[0].transport for state in gw.pool.states)
        assert len({id(ctx) for ctx in made if ctx.get_ca_certs()}) == 1
        for transport, verifying in ((plain, False), (tls, True)):
            ctx = transport._pool._ssl_context  # type: ignore[attr-defined]
            assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
            assert (len(ctx.get_ca_certs()) > 0) == verifying

def _tls_contexts_made(monkeypatch: pytest.MonkeyPatch) -> list[ssl.SSLContext]:
    """Every context httpx's create_ssl_context returns from now on (it is called for a
    context it is given too, and returns that one)."""
    made: list[ssl.SSLContext] = []
    real = httpx.create_ssl_context

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    monkeypatch.setattr("httpx._transports.default.create_ssl_context", counted)
    return made

class TestCancellation:
    async def test_cancelled_requesters_leak_no_slot(self, nursery: trio.Nursery) -> None:
        """Requesters cancelled at many points — before sending, while queued, while the
        server is answering — release their limiter slots and connections; the pool keeps
        serving others."""
        srv = LoopbackServer(default_mode="drip", drip_interval_s=0.01)
        await nursery.start(srv.serve)
        rng = random.Random(11)
        p = provider("a", "openai", srv.openai_url, max_concurrency=3, timeout_s=30)
        async with open_gateway([p], GatewayConfig(max_connections=3), environ=ENV) as gw:
            limiter = gw.pool.states[0].limiter
            for i in range(30):
                async with trio.open_nursery() as one:
                    scope = trio.CancelScope()

                    async def call(scope: trio.CancelScope = scope) -> None:
                        with scope:
                            await gw.round(request())

                    one.start_soon(call)
                    if i % 3 == 2:  # once the server has the request in hand
                        seen = len(srv.requests)
                        while len(srv.requests) == seen:
                            await trio.testing.wait_all_tasks_blocked()
                    for _ in range(rng.randrange(20)):
                        await trio.lowlevel.checkpoint()
                    scope.cancel()
            await trio.testing.wait_all_tasks_blocked()  # cancelled rounds have unwound
            assert limiter.borrowed_tokens == 0
            assert gw.pool.states[0].in_flight == [0]
            assert len(srv.requests) >= 10  # many really reached the server
            srv.default_mode = "ok"
            with trio.fail_after(30):  # a guard against a hang, not a timing check
                async with trio.open_nursery() as inner:
                    for _ in range(6):
                        inner.start_soon(gw.round, request())
            assert limiter.borrowed_tokens == 0
        assert len(srv.requests) > 6

    async def test_shutdown_closes_clients(self, nursery: trio.Nursery) -> None:
        """Leaving open_gateway closes every provider connection pool: the server sees
        its kept-alive connections closed."""
        srv = LoopbackServer()
        await nursery.start(srv.serve)
        async with open_gateway([provider("a", "openai", srv.openai_url)], FAST,
                                environ=ENV) as gw:
            async with trio.open_nursery() as calls:
                for _ in range(3):
                    calls.start_soon(gw.round, request())
            assert srv.open_connections >= 1  # kept alive for the next round
            shards = gw.pool.states[0].shards
        assert shards and all(s.is_closed for s in shards)
        with trio.fail_after(10):  # a guard against a hang, not a timing check
            await srv.none_open.wait()
        assert srv.open_connections == 0

    async def test_queued_rounds_are_answered_when_the_pool_stops(self) -> None:
        """Rounds still in the mailbox when the actor is cancelled are answered (with
        GatewayCancelled, a VianoError), not left waiting."""
        from actors import GatewayHandle, GatewayPool, run_gateway_pool
        from actors._gateway_pool import RoundMsg
        from engine import GatewayCancelled, VianoError

        pool = GatewayPool([provider("a", "openai", "http://127.0.0.1:9/v1")], FAST,
                           environ=ENV)
        send, recv = trio.open_memory_channel[RoundMsg](10)
        handle = GatewayHandle(pool, send)
        results: list[BaseException] = []

        async def requester() -> None:
            try:
                await handle.round(request())
            except GatewayCancelled as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(requester)
            await trio.testing.wait_all_tasks_blocked()  # all three are queued
            with trio.CancelScope() as scope:
                scope.cancel()  # the actor is stopped before it serves anything
                await run_gateway_pool(recv, pool)
        assert len(results) == 3 and all(isinstance(e, VianoError) for e in results)
        assert results[0].reason == "gateway_cancelled"  # type: ignore[attr-defined]

    async def test_closing_drains_rounds_in_flight(self, nursery: trio.Nursery) -> None:
        """Rounds already being served when the gateway's block exits finish with their
        answers before the clients close (an actor that cancelled them instead would
        answer GatewayCancelled here)."""
        srv = LoopbackServer(default_mode="held")
        await nursery.start(srv.serve)
        outcomes: list[RoundOutcome] = []

        async def call(gw: GatewayHandle) -> None:
            outcomes.append(await gw.round(request()))

        async with trio.open_nursery() as callers, open_gateway(
                [provider("a", "openai", srv.openai_url)], FAST, environ=ENV) as gw:
            for _ in range(4):
                callers.start_soon(call, gw)
            while srv.held < 4:
                await trio.testing.wait_all_tasks_blocked()
            callers.start_soon(_release_when_closing, srv)
        # the gateway's block exited first: every round was answered before clients closed
        assert [o.status for o in outcomes] == [RoundStatus.ANSWER] * 4

    async def test_a_closed_gateway_says_so(self) -> None:
        """A round sent through a handle whose gateway is closed is a GatewayError."""
        from engine import GatewayError

        async with open_gateway([provider("a", "openai", "http://127.0.0.1:9/v1")], FAST,
                                environ=ENV) as gw:
            pass
        with pytest.raises(GatewayError) as info:
            await gw.round(request())
        assert info.value.reason == "gateway_closed"

    async def test_stats_count_answers_failures_and_cooldowns(self,
                                                              nursery: trio.Nursery) -> None:
        """Per-provider statistics: answers, failures by class and cooldown skips."""
        srv = LoopbackServer()
        await nursery.start(srv.serve)
        cfg = attrs.evolve(FAST, cooldown_after=1, cooldown_s=600)
        providers = [provider("down", "openai", f"http://127.0.0.1:{dead_port()}/v1",
                              retries=0),
                     provider("up", "openai", srv.openai_url)]
        async with open_gateway(providers, cfg, environ=ENV) as gw:
            for _ in range(3):
                assert (await gw.round(request())).status is RoundStatus.ANSWER
            stats = {name: s.to_json() for name, s in gw.pool.stats.items()}
        assert stats == {"down": {"answers": 0, "failures": {"unavailable": 1},
                                  "cooldown_skips": 2},
                         "up": {"answers": 3, "failures": {}, "cooldown_skips": 0}}

    async def test_missing_api_key_is_configuration(self) -> None:
        """An unset api_key_env is a configuration failure: nothing is sent."""
        async with open_gateway([provider("a", "openai", "http://127.0.0.1:9/v1")], FAST,
                                environ={}) as gw:
            out = await gw.round(request())
        assert out.status is RoundStatus.CONFIGURATION
        assert out.attempts[0].detail == "missing_api_key"


async def _release_when_closing(srv: LoopbackServer) -> None:
    """Runs once the gateway's block has begun to exit: only then may the held answers go."""
    await trio.testing.wait_all_tasks_blocked()
    srv.release.set()


class TestStraightToTheTransport:
    """The gateway posts to httpx's transport, not through AsyncClient: what the client
    did that a model call needs is done here, and nothing more."""

    async def test_userinfo_is_basic_auth_and_empty_userinfo_is_nothing(
            self, nursery: trio.Nursery) -> None:
        srv = LoopbackServer()
        await nursery.start(srv.serve)
        host = srv.openai_url.split("://", 1)[1]
        for base, expected in ((f"http://u:pw@{host}", "Basic dTpwdw=="),
                               (f"http://:@{host}", f"Bearer {SECRET}")):
            async with open_gateway([provider("a", "openai", base)], FAST,
                                    environ=ENV) as gw:
                outcome = await gw.round(request())
            assert outcome.status is RoundStatus.ANSWER, dump(outcome)
            assert srv.requests[-1].headers["authorization"] == expected

    async def test_a_key_http_cannot_carry_is_a_configuration_failure(
            self, nursery: trio.Nursery) -> None:
        """A key pasted with a non-ASCII character: the attempt is provider_configuration
        (the next provider at once), not an internal error, and the key is in no record."""
        srv = LoopbackServer()
        await nursery.start(srv.serve)
        key = "sk-caf\u00e9-DISTINCTIVE-4242"
        async with open_gateway([provider("a", "openai", srv.openai_url, retries=2)], FAST,
                                environ={"VIANO_TEST_KEY": key}) as gw:
            outcome = await gw.round(request())
        assert outcome.status is RoundStatus.CONFIGURATION, dump(outcome)
        assert [a.failure for a in outcome.attempts] == [FailureClass.CONFIGURATION]
        assert "DISTINCTIVE" not in dump(outcome) and srv.requests == []


class TestWhatTheOperatorBounds:
    @pytest.mark.parametrize("phase_limit", [None, 8 * 1024 * 1024])
    async def test_the_gateways_output_limit_bounds_every_call(
            self, nursery: trio.Nursery, phase_limit: int | None) -> None:
        """``[gateway] max_output_bytes`` (1 MiB here) caps a call whatever the phase's own
        limit: a phase asking for 8 MiB took precedence, and a 3 MiB answer was read whole
        and accepted."""
        [srv] = await _servers(nursery, "oversized")
        async with open_gateway([provider("p1", "openai", srv.openai_url, retries=0)], FAST,
                                environ=ENV) as gw:
            outcome = await gw.round(attrs.evolve(request(), max_output_bytes=phase_limit))
        assert outcome.status is RoundStatus.INVALID_ANSWER, dump(outcome)
        assert [a.detail for a in outcome.attempts] == ["output_limit_exceeded"]

    async def test_a_phase_limit_below_the_gateways_still_applies(
            self, nursery: trio.Nursery) -> None:
        [srv] = await _servers(nursery, "ok")
        async with open_gateway([provider("p1", "openai", srv.openai_url, retries=0)], FAST,
                                environ=ENV) as gw:
            outcome = await gw.round(attrs.evolve(request(), max_output_bytes=16))
        assert [a.detail for a in outcome.attempts] == ["output_limit_exceeded"], dump(outcome)


class TestABugServingOneRound:
    async def test_it_is_raised_to_that_caller_alone_and_the_pool_serves_on(
            self, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
        """A bug met while one round is served (here planted in the attempt of BUG-1) is
        raised to that round's caller, the case's own internal error. It was raised in the
        pool's nursery, which ended the pool and every round in flight with it: one bad
        answer took a whole daemon down, again at each restart."""
        from actors import _gateway_pool

        real = _gateway_pool.http_attempt

        async def planted(transport: httpx.AsyncBaseTransport, call: object, ctx: object,
                          timeouts: object) -> object:
            if ctx.prompt.case_id == "BUG-1":  # type: ignore[attr-defined]
                raise RecursionError("planted: a bug in reading one answer")
            return await real(transport, call, ctx, timeouts)  # type: ignore[arg-type]

        monkeypatch.setattr(_gateway_pool, "http_attempt", planted)
        [srv] = await _servers(nursery, "ok")
        raised: list[BaseException] = []
        outcomes: dict[str, RoundOutcome] = {}
        async with open_gateway([provider("p1", "openai", srv.openai_url)], FAST,
                                environ=ENV) as gw:
            async def one(case_id: str) -> None:
                try:
                    outcomes[case_id] = await gw.round(request(case_id))
                except RecursionError as exc:
                    raised.append(exc)

            async with trio.open_nursery() as inner:
                for case_id in ("BUG-1", "BUG-2", "BUG-3"):
                    inner.start_soon(one, case_id)
            after = await gw.round(request("BUG-4"))
        assert [str(e) for e in raised] == ["planted: a bug in reading one answer"]
        assert sorted(outcomes) == ["BUG-2", "BUG-3"]
        assert all(o.status is RoundStatus.ANSWER for o in outcomes.values()), outcomes
        assert after.status is RoundStatus.ANSWER, dump(after)
