"""Loopback provider server speaking the OpenAI (``/v1/chat/completions``) and Anthropic
(``/v1/messages``) wire formats, with scripted answers and fault modes.

Each request takes the next mode from ``script`` (a FIFO), else ``default_mode``. Modes:
ok, close (accept, read, close without answering), hang, drip (a byte at a time), 500, 502,
503, 429 (Retry-After seconds), 429-long (3600 s), 429-ms (retry-after-ms), 401 (echoes the
caller's key in the body, as some providers do), 403, 404, 400, malformed (200 + broken
JSON), truncated (Content-Length larger than what is sent), oversized (a 3 MiB body), empty
(empty content), fenced (```json fence), prose (text around the JSON), extra_keys (an
unknown key in the answer), list (a top-level JSON list), and the echoes providers have been
seen to make of a caller's secret: redirect (302 to the request's own path and query),
echo_path (404 echoing the path), header_echo (401 repeating the key in a response header),
401_json (the key JSON-escaped), 401_u (every character as a JSON unicode escape), 401_url
(percent-encoded), 401_html (character references), 401_straddle (the key across the
64 KiB audit cut), oversized_echo (the key across the output-limit cut); deep (nesting past the JSON
reader's depth) and duplicate_keys; the same three faults in the envelope around a good
answer: envelope_deep (3,000 levels beside it), envelope_duplicate (the answer's key twice:
``choices`` or ``content``, the second holding another answer) and envelope_nan; held (answered once
``release`` is set). A refused
connection is a port nobody listens on: :func:`dead_port`.
"""

from __future__ import annotations

import json
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import h11
import trio

DEFAULT_ANSWER: dict[str, Any] = {"summary": "ok", "items": ["a", "b"]}
MODES = ("ok", "close", "hang", "drip", "500", "502", "503", "429", "429-long", "429-ms", "401",
         "403", "404", "400", "malformed", "truncated", "oversized", "empty", "fenced", "prose",
         "extra_keys", "list", "redirect", "echo_path", "header_echo", "401_json", "401_u",
         "401_url", "401_html", "401_straddle", "oversized_echo", "deep", "duplicate_keys",
         "envelope_deep", "envelope_duplicate", "envelope_nan", "held", "201", "202", "204")
ECHO_MODES = ("401", "redirect", "echo_path", "header_echo", "401_json", "401_u", "401_url",
              "401_html", "401_straddle", "oversized_echo")
AUDIT_CUT = 64 * 1024


@attrs.define
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    mode: str = "ok"

    @property
    def context(self) -> dict[str, Any]:
        """The Viano context this request carried (the user message), if any."""
        try:
            doc = json.loads(self.body)
            text = doc["messages"][-1]["content"]
            value = json.loads(text)
            return value if isinstance(value, dict) else {}
        except (ValueError, KeyError, IndexError, TypeError):
            return {}

    @property
    def prompt_id(self) -> str | None:
        fmt = str(self.context.get("format", ""))
        for prompt in ("interpretation_v1", "hypotheses_v1"):
            if fmt.startswith(f"viano-{prompt.split('_')[0]}-context"):
                return prompt
        return None

    @property
    def case_id(self) -> str | None:
        value = self.context.get("case_id")
        return value if isinstance(value, str) else None


class LoopbackServer:
    def __init__(self, *, default_mode: str = "ok", answer: dict[str, Any] | None = None,
                 delay_s: float = 0.0, drip_interval_s: float = 0.05, retry_after: str = "1"):
        self.default_mode = default_mode
        self.answer = answer if answer is not None else DEFAULT_ANSWER
        self.delay_s = delay_s
        self.drip_interval_s = drip_interval_s
        self.retry_after = retry_after
        self.script: deque[str] = deque()
        self.requests: list[Received] = []
        self.record_requests = True
        self.output_cut = 1024 * 1024  # where the gateway under test abandons a body
        self.release = trio.Event()     # lets "held" requests answer
        self.content: str | None = None  # when set, the exact content of every ok answer
        self.answers: dict[str, str] = {}  # prompt id -> content of an ok answer to it
        self.on_request: Callable[[Received], None] | None = None
        self.on_done: Callable[[Received], None] | None = None  # answered, failed or cut off
        # Per-request choices (batch tests): a mode, or the content of an ok answer.
        self.mode_for: Callable[[Received], str | None] | None = None
        self.content_for: Callable[[Received], str | None] | None = None
        self.held = 0
        self.port = 0
        self.open_connections = 0  # connections the client has not closed yet
        self.none_open = trio.Event()  # set whenever the last open connection ends

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *modes: str) -> None:
        for mode in modes:
            if mode not in MODES:
                raise ValueError(f"unknown mode {mode!r}")
        self.script.extend(modes)

    async def serve(self, port: int = 0, *,
                    task_status: trio.TaskStatus[LoopbackServer] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1", backlog=512)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self)
            await trio.serve_listeners(self._connection, listeners, handler_nursery=nursery)

    async def _connection(self, stream: trio.SocketStream) -> None:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER)
        self.open_connections += 1
        if self.none_open.is_set():
            self.none_open = trio.Event()
        try:
            while True:
                got = await _read_request(conn, stream)
                if got is None:
                    return
                request, body = got
                mode = self.script.popleft() if self.script else None
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                received = Received(request.method.decode(), request.target.decode(), headers,
                                    body, mode or self.default_mode)
                if mode is None and self.mode_for is not None:
                    received.mode = self.mode_for(received) or self.default_mode
                mode = received.mode
                if self.record_requests:
                    self.requests.append(received)
                if self.on_request is not None:
                    self.on_request(received)
                try:
                    answered = await self._respond(conn, stream, mode,
                                                   request.target.decode(), headers, received)
                finally:
                    if self.on_done is not None:
                        self.on_done(received)
                if not answered:
                    return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            self.open_connections -= 1
            if not self.open_connections:
                self.none_open.set()
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream, mode: str,
                       path: str, headers: dict[str, str], received: Received) -> bool:
        """Answer one request; False closes the connection."""
        if self.delay_s:
            await trio.sleep(self.delay_s)
        if mode == "held":  # answered as "ok" once the test sets release
            self.held += 1
            await self.release.wait()
            mode = "ok"
        anthropic = path.split("?", 1)[0].endswith("/messages")
        if mode == "close":
            return False
        if mode == "hang":
            await trio.sleep_forever()
        if mode in ("500", "502", "503", "400", "403", "404"):
            await _send(conn, stream, int(mode), {"error": {"message": f"status {mode}"}})
            return True
        if mode.startswith("429"):
            extra = {"429": [("retry-after", self.retry_after)],
                     "429-long": [("retry-after", "3600")],
                     "429-ms": [("retry-after-ms", "20")]}[mode]
            await _send(conn, stream, 429, {"error": {"message": "rate limited"}}, extra)
            return True
        key = _caller_secret(headers, path)
        if mode in ECHO_MODES:
            await self._echo(conn, stream, mode, key, path)
            return mode != "oversized_echo"
        if mode == "malformed":
            await _send_raw(conn, stream, 200, b'{"choices": [ {"message": ')
            return True
        if mode == "202":  # accepted for later: a queue's answer, not a model's
            await _send(conn, stream, 202, {"id": "job-1", "status": "queued"})
            return True
        if mode == "204":  # no content at all
            data = conn.send(h11.Response(status_code=204, headers=[])) or b""
            await stream.send_all(data + (conn.send(h11.EndOfMessage()) or b""))
            return True
        if mode.startswith("envelope_"):
            good = _envelope(anthropic, self._content("ok", received.prompt_id))
            await _send_raw(conn, stream, 200, _bad_envelope(mode, anthropic, good))
            return True
        custom = self.content_for(received) if self.content_for and mode == "ok" else None
        body = _envelope(anthropic, custom if custom is not None else
                         self._content(mode, received.prompt_id))
        if mode == "truncated":
            conn_bytes = conn.send(h11.Response(status_code=200, headers=[
                ("content-type", "application/json"), ("content-length", str(len(body)))]))
            await stream.send_all((conn_bytes or b"") + body[: len(body) // 2])
            return False
        if mode == "drip":
            head = conn.send(h11.Response(status_code=200, headers=[
                ("content-type", "application/json"), ("content-length", str(len(body)))]))
            await stream.send_all(head or b"")
            for i in range(len(body)):
                await stream.send_all(conn.send(h11.Data(data=body[i:i + 1])) or b"")
                await trio.sleep(self.drip_interval_s)
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            return True
        await _send_raw(conn, stream, 201 if mode == "201" else 200, body)
        return True

    async def _echo(self, conn: h11.Connection, stream: trio.SocketStream, mode: str,
                    key: str, path: str) -> None:
        from urllib.parse import quote

        if mode == "401":
            await _send(conn, stream, 401, {"error": {"message": f"Incorrect API key "
                                                                  f"provided: {key}"}})
        elif mode == "redirect":
            await _send_raw(conn, stream, 302, b"", [("location", path)])
        elif mode == "echo_path":
            await _send(conn, stream, 404, {"error": f"no route for {path}"})
        elif mode == "header_echo":
            await _send(conn, stream, 401, {"error": "bad key"}, [("x-echo-key", key)])
        elif mode == "401_json":
            await _send_raw(conn, stream, 401, ('{"error": "bad key ' + key.replace("/", "\\/")
                                                + '"}').encode())
        elif mode == "401_u":
            escaped = "".join(f"\\u{ord(c):04X}" for c in key)
            await _send_raw(conn, stream, 401, ('{"error": "bad key ' + escaped + '"}').encode())
        elif mode == "401_url":
            await _send(conn, stream, 401, {"error": f"see /help?key={quote(key, safe='')}"})
        elif mode == "401_html":
            await _send_raw(conn, stream, 401, ("<p>bad key " + "".join(
                f"&#{ord(c)};" for c in key) + "</p>").encode())
        elif mode == "401_straddle":
            pad = "x" * (AUDIT_CUT - len(key) // 2 - len('{"e": "'))
            await _send_raw(conn, stream, 401, ('{"e": "' + pad + key + '"}').encode())
        else:  # oversized_echo: the key across the gateway's output cut
            cut = self.output_cut - len(key) // 2
            body = (b"x" * cut) + key.encode() + b"y" * 4096
            head = conn.send(h11.Response(status_code=500, headers=[
                ("content-type", "text/plain"), ("content-length", str(len(body)))]))
            await stream.send_all((head or b"") + (conn.send(h11.Data(data=body)) or b""))

    def _content(self, mode: str, prompt_id: str | None = None) -> str:
        if mode == "ok" and prompt_id in self.answers:
            return self.answers[prompt_id]
        if self.content is not None and mode == "ok":
            return self.content
        answer = self.answer
        if mode == "empty":
            return ""
        if mode == "fenced":
            return f"```json\n{json.dumps(answer)}\n```"
        if mode == "prose":
            return f"Here is the JSON you asked for: {json.dumps(answer)}"
        if mode == "extra_keys":
            return json.dumps({**answer, "confidence": 0.9})
        if mode == "list":
            return json.dumps([answer])
        if mode == "deep":
            return '{"summary": ' + "[" * 100_000 + "]" * 100_000 + "}"
        if mode == "duplicate_keys":
            return json.dumps(answer)[:-1] + ', "summary": "other"}'

        if mode == "oversized":
            return json.dumps({**answer, "padding": "x" * (3 * 1024 * 1024)})
        return json.dumps(answer)


def _bad_envelope(mode: str, anthropic: bool, good: bytes) -> bytes:
    """A good envelope with one fault added beside its answer (the answer itself intact)."""
    assert good.startswith(b"{")
    if mode == "envelope_deep":
        return b'{"x": ' + b"[" * 3000 + b"]" * 3000 + b", " + good[1:]
    if mode == "envelope_duplicate":  # a second, other answer, which json.loads would take
        other = json.dumps({"summary": "other", "items": []})
        second = ({"content": [{"type": "text", "text": other}]} if anthropic else
                  {"choices": [{"index": 0, "message": {"role": "assistant", "content": other}}]})
        return good[:-1] + b", " + json.dumps(second).encode()[1:]
    return good[:-1] + b', "score": NaN}'


def _envelope(anthropic: bool, content: str) -> bytes:
    if anthropic:
        doc: dict[str, Any] = {
            "id": "msg_loopback", "type": "message", "role": "assistant", "model": "loopback",
            "content": [{"type": "text", "text": content}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 10}}
    else:
        doc = {"id": "chatcmpl-loopback", "object": "chat.completion",
               "created": 1_800_000_000, "model": "loopback",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                    "refusal": None},
                            "finish_reason": "stop", "logprobs": None}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}
    return json.dumps(doc).encode()


async def _read_request(conn: h11.Connection, stream: trio.SocketStream,
                        ) -> tuple[h11.Request, bytes] | None:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _send(conn: h11.Connection, stream: trio.SocketStream, status: int, doc: Any,
                extra: list[tuple[str, str]] | None = None) -> None:
    await _send_raw(conn, stream, status, json.dumps(doc).encode(), extra)


async def _send_raw(conn: h11.Connection, stream: trio.SocketStream, status: int, body: bytes,
                    extra: list[tuple[str, str]] | None = None) -> None:
    headers = [("content-type", "application/json"), ("content-length", str(len(body))),
               *(extra or [])]
    data = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)


def _caller_secret(headers: dict[str, str], path: str) -> str:
    """What an echoing provider would repeat: the key from the auth header (Bearer, Basic
    or x-api-key), else a key-like query parameter's value."""
    from urllib.parse import parse_qsl, urlsplit

    auth = headers.get("authorization", "") or headers.get("x-api-key", "")
    if auth.startswith(("Bearer ", "Basic ")):
        return auth.split(" ", 1)[1]
    if auth:
        return auth
    for name, value in parse_qsl(urlsplit(path).query):
        if "key" in name or "token" in name:
            return value
    return ""


def dead_port() -> int:
    """A loopback port with nothing listening: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
