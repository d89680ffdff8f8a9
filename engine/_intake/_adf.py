"""Atlassian Document Format (Jira REST v3 text) to plain text, deterministically.

A document must be well-formed (:func:`adf_problem`): every node an object with a string
``type``; ``content`` a list of nodes, ``text`` a string, ``attrs`` an object and
``marks`` a list of objects wherever they appear. Anything else is refused by the caller,
never half-converted.

The same document always gives the same text (the catalogue hashes it, and the phases
convert the stored original again to check it). Content is never dropped: paragraphs are
separated by a blank line, headings keep ``#`` markers, lists keep ``-`` or ``1.``
markers with nested items indented, code blocks are fenced with their language, tables
become ``| cell | cell |`` rows, quotes are prefixed with ``>``, and inline nodes show
their text (mentions ``@name``, emoji, dates, status lozenges, cards by URL, media by
name). A node this converter does not know shows its text and its children's, so a newer
node type degrades to its words rather than vanishing. Marks (bold, links, colours) are
left out, apart from a link's URL after its text when the two differ.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._text import is_blank

_BLOCK_SEP = "\n\n"


def is_adf(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "doc"


def adf_problem(doc: Any) -> str | None:
    """Why ``doc`` is not a well-formed ADF document (the first problem, with its JSON
    path), or ``None``."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            return f"{where or '(document)'}: a node must be an object with a string type"
        content = node.get("content", [])
        if not isinstance(content, list):
            return f"{where}.content: must be a list of nodes"
        if "text" in node and not isinstance(node["text"], str):
            return f"{where}.text: must be a string"
        if "attrs" in node and not isinstance(node["attrs"], dict):
            return f"{where}.attrs: must be an object"
        marks = node.get("marks", [])
        if not isinstance(marks, list) or not all(isinstance(m, dict) for m in marks):
            return f"{where}.marks: must be a list of objects"
        stack.extend((child, f"{where}.content.{i}") for i, child in enumerate(content))
    return None


LATEST = 2
VERSIONS = (1, 2)


def adf_text(doc: Any, version: int = LATEST) -> str:
    """``doc`` as plain text by conversion ``adf-text/<version>``. A version, once
    released, never changes: a catalogue records the version its hashes were made by, and
    the phases convert the stored original again by that version to check them.

    Version 2 keeps what version 1 dropped: the done marks of a task list nested in a task
    list (and the markers of any list nested directly in a list); a macro's parameters,
    and a block ``extension`` (a macro without a body) by its text or key; a card given by
    its ``data`` (JSON-LD: its name and URL) rather than a ``url``; an external media's
    URL."""
    if version not in VERSIONS:
        raise ValueError(f"unknown ADF conversion version {version!r}")
    return _Converter(version).blocks(_children(doc), "").strip("\n")


def _children(node: Any) -> list[Any]:
    content = node.get("content") if isinstance(node, dict) else None
    return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else []


def _attr(node: dict[str, Any], key: str) -> str | None:
    attrs = node.get("attrs")
    value = attrs.get(key) if isinstance(attrs, dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18:
        return str(value)
    return None


def _small_int(text: str | None, default: int, lo: int, hi: int) -> int:
    """An ASCII-digit attribute within [lo, hi], else ``default`` (never int() on
    something hostile: a 5,000-digit number, a superscript digit)."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return default
    return min(hi, max(lo, int(text)))


_LISTS = ("bulletList", "orderedList", "taskList", "decisionList")


class _Converter:
    def __init__(self, version: int):
        self.version = version

    def blocks(self, nodes: list[Any], indent: str) -> str:
        parts = [self.block(n, indent) for n in nodes]
        return _BLOCK_SEP.join(p for p in parts if p != "")

    def block(self, node: dict[str, Any], indent: str) -> str:
        kind = node.get("type")
        if kind == "paragraph":
            return _prefix(self.inline(_children(node)), indent)
        if kind == "heading":
            hashes = "#" * _small_int(_attr(node, "level"), 1, 1, 6)
            return _prefix(f"{hashes} {self.inline(_children(node))}", indent)
        if kind == "codeBlock":
            code = "".join("\n" if c.get("type") == "hardBreak" else str(c.get("text", ""))
                           for c in _children(node))
            fence = "`" * max(3, _longest_backtick_run(code) + 1)
            language = re.sub(r"[^A-Za-z0-9_+.#-]", "", _attr(node, "language") or "")[:32]
            return _prefix(f"{fence}{language}\n{code}\n{fence}", indent)
        if kind in _LISTS:
            return self.listed(node, indent)
        if kind == "blockquote":
            inner = self.blocks(_children(node), "")
            return _prefix("\n".join(f"> {ln}" if ln else ">" for ln in inner.split("\n")),
                           indent)
        if kind == "rule":
            return _prefix("---", indent)
        if kind == "table":
            return "\n".join(_prefix(self.row(r), indent) for r in _children(node))
        if kind in ("mediaSingle", "mediaGroup", "media", "mediaInline"):
            caption = " ".join(self.inline(_children(c)) for c in _children(node)
                               if c.get("type") == "caption")
            return _prefix(" ".join(x for x in (self.media(node), caption) if x), indent)
        if kind in ("blockCard", "embedCard"):
            return _prefix(self.card(node), indent)
        if kind in ("text", "hardBreak", "mention", "emoji", "inlineCard", "date", "status"):
            return _prefix(self.inline([node]), indent)
        if kind == "extension" and self.version >= 2:
            return _prefix(_extension(node), indent)
        # panel, expand, nestedExpand, layoutSection, and whatever comes next: the content.
        title = _attr(node, "title")
        body = self.blocks(_children(node), indent)
        if kind == "bodiedExtension" and self.version >= 2:
            params = _words(_params(node))
            if params:
                body = _prefix(params, indent) + (_BLOCK_SEP + body if body else "")
        if node.get("text") and isinstance(node.get("text"), str):
            body = _prefix(str(node["text"]), indent) + (_BLOCK_SEP + body if body else "")
        return _prefix(title, indent) + (_BLOCK_SEP + body if body else "") if title else body

    def listed(self, node: dict[str, Any], indent: str) -> str:
        ordered = node.get("type") == "orderedList"
        number = _small_int(_attr(node, "order"), 1, 0, 10**9)
        lines = []
        for item in _children(node):
            if self.version >= 2 and item.get("type") in _LISTS:
                # A list nested directly in a list (ADF's way of indenting task items):
                # its items keep their own markers, indented under the item before.
                lines.append(self.listed(item, indent + "  "))
                continue
            marker = f"{number}. " if ordered else "- "
            if item.get("type") in ("taskItem", "decisionItem"):
                state = _attr(item, "state")
                marker += "[x] " if state in ("DONE", "DECIDED") else "[ ] "
                text = self.inline(_children(item))
            else:
                text = self.blocks(_children(item), "").strip("\n")
            pad = " " * len(marker)
            first, *rest = text.split("\n") if text else [""]
            lines.append(f"{indent}{marker}{first}")
            lines += [f"{indent}{pad}{ln}" if ln else "" for ln in rest]
            number += 1
        return "\n".join(lines)

    def row(self, row: dict[str, Any]) -> str:
        """A table row on one line: ``\\`` and ``|`` inside a cell are written ``\\\\``
        and ``\\|``, a line break inside one (a code block, a list) `` ⏎ ``."""
        cells = [self.blocks(_children(c), "").replace("\\", "\\\\").replace("|", "\\|")
                 .replace("\n", " ⏎ ") for c in _children(row)]
        return "| " + " | ".join(cells) + " |"

    def inline(self, nodes: list[Any]) -> str:
        out = []
        for n in nodes:
            kind = n.get("type")
            if kind == "text":
                text = str(n.get("text", ""))
                marks = n.get("marks") if isinstance(n.get("marks"), list) else []
                href = next((m["attrs"].get("href") for m in marks
                             if isinstance(m, dict) and m.get("type") == "link"
                             and isinstance(m.get("attrs"), dict)), None)
                out.append(f"{text} ({href})" if isinstance(href, str) and href != text
                           else text)
            elif kind == "hardBreak":
                out.append("\n")
            elif kind == "mention":
                name = _attr(n, "text") or _attr(n, "id") or "someone"
                out.append(name if name.startswith("@") else f"@{name}")
            elif kind == "emoji":
                out.append(_attr(n, "text") or _attr(n, "shortName") or "")
            elif kind in ("inlineCard", "blockCard", "embedCard"):
                out.append(self.card(n))
            elif kind == "date":
                out.append(_attr(n, "timestamp") or "")
            elif kind == "status":
                out.append(f"[{_attr(n, 'text') or ''}]")
            elif kind in ("media", "mediaInline"):
                out.append(self.media(n))
            elif kind == "inlineExtension" and self.version >= 2:
                out.append(_extension(n))
            elif kind in ("placeholder", "inlineExtension"):
                out.append(_attr(n, "text") or _attr(n, "extensionKey") or "")
            else:
                out.append(str(n.get("text", "")) if isinstance(n.get("text"), str) else "")
                out.append(self.inline(_children(n)))
        return "".join(out)

    def card(self, node: dict[str, Any]) -> str:
        url = _attr(node, "url")
        if url or self.version < 2:
            return url or ""
        attrs = node.get("attrs")
        data = attrs.get("data") if isinstance(attrs, dict) else None
        if not isinstance(data, dict):
            return ""
        found = [data.get(k) for k in ("name", "url")]
        return " ".join(v for v in found if isinstance(v, str) and not is_blank(v))

    def media(self, node: dict[str, Any]) -> str:
        found = [c for c in [node, *_children(node)]
                 if c.get("type") in ("media", "mediaInline")]
        names = [(_attr(m, "alt") or _attr(m, "id")
                  or (_attr(m, "url") if self.version >= 2 else None) or "media")
                 for m in found]
        return " ".join(f"[media: {n}]" for n in names) if names else ""


def _params(node: dict[str, Any]) -> Any:
    attrs = node.get("attrs")
    return attrs.get("parameters") if isinstance(attrs, dict) else None


def _extension(node: dict[str, Any]) -> str:
    """A macro without a body: its fallback text, or its key, then the text of its
    parameters, in the order the document gives them."""
    head = _attr(node, "text") or _attr(node, "extensionKey") or ""
    return " ".join(x for x in (head, _words(_params(node))) if x)


def _words(params: Any) -> str:
    """The strings and numbers inside a macro's parameters, depth-first in document order,
    iteratively (a document's depth is bounded by the JSON reader, not here), leaving out
    ``macroMetadata`` (ids and schema versions the editor keeps, no one's words)."""
    out: list[str] = []
    stack = [params]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not is_blank(v):
                out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(json.dumps(v))
        elif isinstance(v, dict):
            stack.extend(reversed([x for k, x in v.items() if k != "macroMetadata"]))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return " ".join(out)


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def _prefix(text: str, indent: str) -> str:
    if not indent:
        return text
    return "\n".join(f"{indent}{ln}" if ln else "" for ln in text.split("\n"))
