"""engine._json.loads_untrusted: every refusal class, and its fast paths (the tree walk
skipped when the text cannot hold a lone surrogate or nest too deep) giving exactly what
the full check gives."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest

from engine._json import MAX_DEPTH, UntrustedJson, check_tree, loads_untrusted


def _reference(data: bytes | str) -> Any:
    """The same parse with the full tree check always run (the slow path)."""
    value = loads_untrusted(data, max_depth=10_000)  # parse rules only
    check_tree(value, max_depth=MAX_DEPTH)
    return value


def _outcome(fn: Any, data: bytes | str) -> Any:
    try:
        return ("ok", fn(data))
    except UntrustedJson as exc:
        return ("refused", exc.detail)


@pytest.mark.parametrize(("data", "detail"), [
    (b'{"a": 1, "a": 2}', "duplicate_key"),
    (b"[NaN]", "invalid_constant"),
    (b'{"x": Infinity}', "invalid_constant"),
    (b"[" + b"1" * 41 + b"]", "number_too_large"),
    (b"[1e400]", "number_too_large"),
    (b'"\xff"', "not_utf8"),
    (b"{", "not_json"),
    (b'{"a": "\\ud800"}', "lone_surrogate"),
    (b'{"\\udfff": 1}', "lone_surrogate"),            # in a key
    ('["\ud800"]', "lone_surrogate"),                  # raw, in text given as str
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "too_deep"),
    (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "too_deep"),
    (b"[" * 100_000 + b"]" * 100_000, "too_deep"),     # past Python's recursion limit
])
def test_each_refusal_has_its_code(data: bytes | str, detail: str) -> None:
    with pytest.raises(UntrustedJson) as exc:
        loads_untrusted(data)
    assert exc.value.detail == detail


def test_byte_buffers_are_read_as_bytes() -> None:
    assert loads_untrusted(bytearray(b'{"a": [1]}')) == {"a": [1]}
    assert loads_untrusted(memoryview(b"[2]")) == [2]
    with pytest.raises(UntrustedJson) as exc:
        loads_untrusted(bytearray(b'["\\ud800"]'))
    assert exc.value.detail == "lone_surrogate"


@pytest.mark.parametrize("data", [
    b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,          # exactly at the limit
    b'"\\ud83d\\ude00"',                          # a surrogate pair is one character
    b'{"a": "\\\\ud800"}',                        # an escaped backslash, then text
    '{"a": "caf\u00e9"}',
])
def test_what_is_acceptable_is_accepted(data: bytes | str) -> None:
    assert _outcome(loads_untrusted, data) == _outcome(_reference, data)
    assert _outcome(loads_untrusted, data)[0] == "ok"


def _nest(rng: random.Random, depth: int) -> str:
    """A document nested exactly ``depth`` levels, mixing objects and lists, with siblings
    (so bracket counts exceed the depth) and strings that look like brackets."""
    if depth == 0:
        return rng.choice(['1', '"x"', '"[{"', '"\\\\ud800"', '"\\u00e9"', 'true', 'null'])
    inner = _nest(rng, depth - 1)
    # one level deep, beside an inner value that goes deeper: they never add depth
    siblings = ["[]", "{}", '"]"', "[1,2]"][: rng.randrange(5) if depth > 1 else 0]
    if rng.random() < 0.5:
        return "[" + ",".join([inner, *siblings]) + "]"
    return "{" + ",".join([f'"k":{inner}', *(f'"s{i}":{x}' for i, x in enumerate(siblings))]
                          ) + "}"


def test_the_fast_paths_agree_with_the_full_check() -> None:
    """Random documents around the depth limit, with and without lone surrogates,
    as bytes and as str: the same value or the same refusal as the full tree check."""
    rng = random.Random(7)
    for _ in range(400):
        depth = rng.choice([1, 5, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1,
                            MAX_DEPTH + 5])
        text = _nest(rng, depth)
        lone = rng.random() < 0.2
        if lone:
            text = "[" + text + ',"\\udc00"]'  # one level more, and a lone surrogate
        for data in (text, text.encode()):
            assert _outcome(loads_untrusted, data) == _outcome(_reference, data), text
        assert _outcome(loads_untrusted, text)[0] == (
            "ok" if depth + lone <= MAX_DEPTH and not lone else "refused")


def test_no_decoder_is_built_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building one per call (json.loads with hooks does) was 0.8% of the engine's CPU;
    the refusals stay those of json.loads, the BOM's message included."""
    built: list[object] = []
    real = json.JSONDecoder.__init__

    def counted(self: json.JSONDecoder, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONDecoder, "__init__", counted)
    for _ in range(20):
        assert loads_untrusted(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    with pytest.raises(UntrustedJson, match="Unexpected UTF-8 BOM") as bom:
        loads_untrusted("\ufeff{}")
    assert bom.value.detail == "not_json"
    assert built == []


def test_one_decoder_serves_many_threads_at_once() -> None:
    """Threads parsing different documents at once through the one shared decoder, and
    the hooks that check every object and number, each get exactly their own document,
    and the strict refusals still hold in between."""

    docs = [json.dumps({f"k{i}": [i, {"v": f"value {i}", "n": i * 1.5}], "same": i})
            for i in range(8)]
    wrong: list[str] = []

    def parse(i: int) -> None:
        for _ in range(300):
            if loads_untrusted(docs[i]) != json.loads(docs[i]):
                wrong.append(docs[i])
            try:
                loads_untrusted('{"a": 1, "a": 2}')
                wrong.append("duplicate accepted")
            except UntrustedJson as exc:
                if exc.detail != "duplicate_key":
                    wrong.append(exc.detail)

    threads = [threading.Thread(target=parse, args=(i,)) for i in range(len(docs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
