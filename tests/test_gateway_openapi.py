"""The openai adapter's requests and the loopback server's answers conform to the official
OpenAI API description (CreateChatCompletionRequest / CreateChatCompletionResponse).
Skipped when ../shared/data/openai-openapi.json is not beside the repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from jsonschema import Draft202012Validator

from actors import open_gateway
from engine import RoundStatus
from tests.conftest import REPO
from tests.gateway_helpers import ENV, FAST, provider, request
from tests.loopback import LoopbackServer

SPEC = REPO.parent / "shared" / "data" / "openai-openapi.json"


def _validator(doc: dict[str, Any], name: str) -> Draft202012Validator:
    root = dict(doc)
    root["$ref"] = f"#/components/schemas/{name}"
    return Draft202012Validator(root)


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    if not SPEC.is_file():
        pytest.skip(f"{SPEC} is not available")
    return json.loads(Path(SPEC).read_text(encoding="utf-8"))  # type: ignore[no-any-return]


async def test_request_and_answer_conform(openapi: dict[str, Any], nursery: trio.Nursery) -> None:
    """What the adapter sends and what the loopback server answers (plain and fenced) are
    valid against the official schemas; a deliberately broken answer is not."""
    srv = LoopbackServer()
    await nursery.start(srv.serve)
    srv.push("ok", "fenced")
    async with open_gateway([provider("p", "openai", srv.openai_url)], FAST, environ=ENV) as gw:
        for _ in range(2):
            outcome = await gw.round(request())
            assert outcome.status is RoundStatus.ANSWER
    req = _validator(openapi, "CreateChatCompletionRequest")
    resp = _validator(openapi, "CreateChatCompletionResponse")
    for sent in srv.requests:
        errors = [e.message for e in req.iter_errors(json.loads(sent.body))]
        assert errors == []
    for attempt in outcome.attempts:
        assert [e.message for e in resp.iter_errors(json.loads(attempt.response_body))] == []
    assert list(resp.iter_errors({"choices": []}))  # the validator is not vacuous
    assert list(req.iter_errors({"messages": "not a list"}))
