"""Shared pieces of the gateway tests."""

from __future__ import annotations

import json
from typing import Any

from engine import GatewayConfig, Prompt, ProviderConfig, RoundOutcome, RoundRequest

SECRET = "sk-VIANO-TEST-7f3a9c2e41d8b6"
QUERY_SECRET = "qk-VIANO-QUERY-5b2e8d1c"
ENV = {"VIANO_TEST_KEY": SECRET}
FAST = GatewayConfig(backoff_base_s=0.01, backoff_max_s=0.02, connect_timeout_s=2.0,
                     cooldown_after=1000, max_output_bytes=1024 * 1024)


def request(case_id: str = "BUG-20") -> RoundRequest:
    return RoundRequest(Prompt(prompt_id="hypotheses_v1", system="You are a test.",
                               user=json.dumps({"case": case_id}),
                               schema={"type": "object"}, case_id=case_id))


def provider(name: str, kind: str, base_url: str, **kw: Any) -> ProviderConfig:
    options = {"retries": 1, "timeout_s": 5.0, "api_key_env": "VIANO_TEST_KEY", **kw}
    return ProviderConfig(name=name, kind=kind, base_url=base_url, model="loopback-model",  # type: ignore[arg-type]
                          **options)


def dump(outcome: RoundOutcome) -> str:
    return json.dumps(outcome.to_json())
